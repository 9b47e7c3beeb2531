"""ulorl::error reaches Python as ulorl.Error (a ValueError) with the C++ message and its fields;
nothing is returned or modified on error."""

import pytest
import torch

import ulorl


def good(B=2, T=3, dtype=torch.float64):
    lp = torch.full((B, T), -1.0, dtype=dtype)
    return lp, lp.clone(), torch.ones(B, T, dtype=dtype), torch.ones(B, T, dtype=torch.bool)


def test_error_is_value_error_with_fields():
    assert issubclass(ulorl.Error, ValueError)
    lp, old, adv, mask = good()
    old[1, 2] = float("nan")
    with pytest.raises(ulorl.Error) as e:
        ulorl.policy_loss(lp, old, adv, mask)
    msg = str(e.value)
    assert msg.startswith("ulorl::policy_loss: argument 'old_log_prob'[5] = nan")
    assert e.value.function == "policy_loss" and e.value.argument == "old_log_prob" and e.value.index == 5


@pytest.mark.parametrize("bad, argument, text", [
    (lambda lp, old, adv, m: (lp.half(), old, adv, m), "log_prob", "has dtype Half but must be float32 or float64"),
    (lambda lp, old, adv, m: (lp, old[:, :2], adv, m), "old_log_prob", ""),
    (lambda lp, old, adv, m: (lp, old, adv, m.double() * 2), "mask", ""),
    (lambda lp, old, adv, m: (lp, old, adv.float(), m), "advantages", "dtype"),
    (lambda lp, old, adv, m: (lp[0], old, adv, m), "log_prob", "rank"),
])
def test_bad_tensors_name_the_argument(bad, argument, text):
    args = bad(*good())
    with pytest.raises(ulorl.Error) as e:
        ulorl.policy_loss(*args)
    assert e.value.argument == argument, str(e.value)
    assert text in str(e.value)


def test_bad_names_and_values():
    lp, old, adv, mask = good()
    with pytest.raises(ulorl.Error, match="unknown name 'ppo2'"):
        ulorl.policy_loss(lp, old, adv, mask, objective="ppo2")
    with pytest.raises(ulorl.Error, match="eps_low"):
        ulorl.policy_loss(lp, old, adv, mask, eps_low=1.5)
    with pytest.raises(ulorl.Error, match="ref_log_prob"):
        ulorl.policy_loss(lp, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ulorl.Error, match="normalizer.denominator"):
        ulorl.policy_loss(lp, old, adv, torch.zeros_like(mask))
    with pytest.raises(ulorl.Error, match="loss_mode"):
        ulorl.presets.verl.policy_loss(old, lp, adv, mask, loss_mode="vanila")
    with pytest.raises(ulorl.Error, match="loss_type"):
        ulorl.presets.trl.grpo_loss(lp, old, adv[:, 0], mask, loss_type="bnpo2")
    with pytest.raises(ulorl.Error, match="max_completion_length"):
        ulorl.presets.trl.grpo_loss(lp, old, adv[:, 0], mask, loss_type="dr_grpo")
    with pytest.raises(ulorl.Error, match="preset"):
        ulorl.group_advantages(torch.ones(4, dtype=torch.float64), torch.zeros(4, dtype=torch.int64), "verll")
    with pytest.raises(ulorl.Error, match="group alone|group size 1"):
        ulorl.group_advantages(torch.ones(3, dtype=torch.float64), torch.tensor([0, 0, 1]), "openrlhf")
    with pytest.raises(TypeError):
        ulorl.policy_loss(lp, old, adv, mask, epsilon=0.2)


def test_logits_errors_leave_inputs_untouched():
    logits = torch.randn(4, 5, dtype=torch.float64)
    keep = logits.clone()
    labels = torch.tensor([0, 1, 5, 2])
    with pytest.raises(ulorl.Error) as e:
        ulorl.logprobs_from_logits(logits, labels)
    assert e.value.argument == "labels" and e.value.index == 2
    old = torch.full((1, 4), -1.0, dtype=torch.float64)
    with pytest.raises(ulorl.Error):
        ulorl.policy_loss_from_logits(logits, labels, old, torch.ones_like(old), torch.ones(1, 4, dtype=torch.bool),
                                      in_place=True)
    assert torch.equal(logits, keep)
    with pytest.raises(ulorl.Error, match="must be int64 or int32"):
        ulorl.logprobs_from_logits(logits, labels.double())
    with pytest.raises(ulorl.Error, match="contiguous"):
        ulorl.logprobs_from_logits(logits, torch.tensor([0, 9, 1, 9, 2, 9, 3, 9])[::2])


def test_second_backward_is_rejected():
    lp, old, adv, mask = good()
    x = lp.clone().requires_grad_()
    loss, _ = ulorl.policy_loss(x, old, adv, mask)
    loss.backward(retain_graph=True)
    with pytest.raises(Exception, match="one backward per forward"):
        loss.backward()
