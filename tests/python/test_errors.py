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


# ---- only None is absent: a zero-size tensor is a given argument of the wrong shape -------------------

def _zero_rows(T=3):
    return torch.ones(0, T, dtype=torch.bool)


@pytest.mark.parametrize("empty", [_zero_rows(), torch.ones(0, 0, dtype=torch.bool), torch.ones(0, 3, dtype=torch.float64)])
def test_zero_size_mask_is_not_an_absent_mask(empty):
    lp, old, adv, _ = good()
    norm = ulorl.Normalizer("token_mean", 6.0)
    calls = {
        "policy_loss": lambda: ulorl.policy_loss(lp, old, adv, empty, normalizer=norm),
        "agg_loss": lambda: ulorl.agg_loss(lp, empty, normalizer=norm),
        "mpt_mask": lambda: ulorl.mpt_mask(torch.rand(2, 3, dtype=torch.float64), torch.ones(2, dtype=torch.float64),
                                           log_prob=lp, mask=empty),
        "rollout_correction": lambda: ulorl.rollout_correction(old, lp, empty),
        "off_policy_mask": lambda: ulorl.off_policy_mask(lp, old, adv[:, 0].contiguous(), empty, delta=0.5),
        "reinforce_plus_plus_advantages": lambda: ulorl.reinforce_plus_plus_advantages(torch.rand(2, 3, dtype=torch.float64), empty),
        "optimal_token_baseline_advantages": lambda: ulorl.optimal_token_baseline_advantages(
            torch.rand(2, 3, dtype=torch.float64), empty, [0, 0], old_log_prob=old, sum_pi_squared=torch.rand(2, 3, dtype=torch.float64)),
    }
    for fn, call in calls.items():
        with pytest.raises(ulorl.Error) as e:
            call()
        assert e.value.argument == "mask", (fn, str(e.value))
        assert e.value.function == fn, str(e.value)


def test_zero_size_mask_of_the_fused_losses_and_zero_size_bias():
    lp, old, adv, mask = good()
    norm = ulorl.Normalizer("token_mean", 6.0)
    logits = torch.randn(6, 5, dtype=torch.float64)
    labels = torch.randint(0, 5, (6,))
    with pytest.raises(ulorl.Error) as e:
        ulorl.policy_loss_from_logits(logits, labels, old, adv, _zero_rows(), normalizer=norm)
    assert e.value.argument == "mask"
    hidden, weight = torch.randn(6, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    with pytest.raises(ulorl.Error) as e:
        ulorl.linear_head_policy_loss(hidden, weight, None, labels, old, adv, _zero_rows(), normalizer=norm)
    assert e.value.argument == "mask"
    with pytest.raises(ulorl.Error) as e:
        ulorl.linear_head_policy_loss(hidden, weight, torch.zeros(0, dtype=torch.float64), labels, old, adv, mask)
    assert e.value.argument == "bias"
    # None is still "every token valid" / "no bias".
    a, _ = ulorl.linear_head_policy_loss(hidden, weight, None, labels, old, adv, None, normalizer=norm)
    b, _ = ulorl.linear_head_policy_loss(hidden, weight, None, labels, old, adv, torch.ones_like(mask), normalizer=norm)
    assert torch.equal(a, b)


# ---- differentiable once: a second derivative raises, naming the function ----------------------------

def _graphs():
    lp0, old, adv, mask = good()
    logits0 = torch.randn(6, 5, dtype=torch.float64)
    labels = torch.randint(0, 5, (6,))
    hidden, w0 = torch.randn(6, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)

    def policy_loss(x):
        return ulorl.policy_loss(x, old, adv, mask)[0]

    def from_logits(x):
        return ulorl.policy_loss_from_logits(x, labels, old, adv, mask)[0]

    def logprobs(x):
        lp, ent = ulorl.logprobs_from_logits(x, labels)
        return lp.sum() + ent.sum()

    def head(x):
        return ulorl.linear_head_policy_loss(hidden, x, None, labels, old, adv, mask)[0]

    def agg(x):
        return ulorl.agg_loss(x, mask)

    def kl(x):
        return ulorl.kl_penalty(x, old, "k3").sum()

    def openrlhf_agg(x):
        return ulorl.presets.openrlhf.agg_loss(x, mask)

    return [("policy_loss", policy_loss, lp0), ("policy_loss_from_logits", from_logits, logits0),
            ("logits_statistics", logprobs, logits0), ("linear_head_policy_loss", head, w0), ("agg_loss", agg, lp0),
            ("kl_penalty", kl, lp0), ("agg_loss", openrlhf_agg, lp0)]  # the preset runs the agg_loss operator


@pytest.mark.parametrize("name, f, x0", _graphs(), ids=[g[0] for g in _graphs()])
def test_double_backward_raises_naming_the_function(name, f, x0):
    x = x0.clone().requires_grad_()
    (plain,) = torch.autograd.grad(f(x), x)
    assert not plain.requires_grad
    # create_graph=True alone returns the same gradient (torch's once_differentiable rule) ...
    x = x0.clone().requires_grad_()
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    assert g.requires_grad and torch.equal(g.detach(), plain)
    # ... and differentiating it raises, naming the function.
    with pytest.raises((ulorl.Error, RuntimeError), match="differentiable once") as e:
        g.sum().backward()
    assert name in str(e.value)


# ---- sizes from user values are checked before anything of that size is allocated -------------------

def test_hostile_offsets_and_spans_raise_before_allocating():
    with pytest.raises(ulorl.Error) as e:
        ulorl.broadcast_to_tokens(torch.ones(1, dtype=torch.float64), None, offsets=torch.tensor([5, 2**40]))
    assert (e.value.function, e.value.argument, e.value.index) == ("broadcast_to_tokens", "offsets", 0)
    with pytest.raises(ulorl.Error) as e:
        ulorl.old_log_prob_versions([(0, 4, 0), (5, 2**61, 1)], current_version=3, mode="sais")
    assert (e.value.argument, e.value.index) == ("spans.begin", 1)
    with pytest.raises(ulorl.Error) as e:  # well-formed but too long for a list
        ulorl.old_log_prob_versions([(0, 2**62, 0)], current_version=0, mode="sais")
    assert e.value.argument == "spans.end"


# ---- a NaN option is an error even where the call does not use it -------------------------------------

def test_nan_options_are_rejected_even_when_unused():
    nan = float("nan")
    lp, old, adv, mask = good()
    with pytest.raises(ulorl.Error) as e:  # dp_size is used only with batch_num_tokens
        ulorl.presets.openrlhf.policy_loss(lp, old, adv, mask, dp_size=nan)
    assert e.value.argument == "dp_size" and e.value.function == "presets::openrlhf::policy_loss"
    with pytest.raises(ulorl.Error) as e:  # agg_constant is used only by the constant modes
        ulorl.policy_loss(lp, old, adv, mask, agg_constant=nan)
    assert e.value.argument == "agg_constant"
    with pytest.raises(ulorl.Error) as e:  # tau_pos is sapo's
        ulorl.policy_loss(lp, old, adv, mask, tau_pos=nan)
    assert e.value.argument == "tau_pos"
    with pytest.raises(ulorl.Error) as e:
        ulorl.presets.openrlhf.policy_loss(lp, old, adv, mask, vllm_is_truncated_threshold=(0.5, nan))
    assert (e.value.argument, e.value.index) == ("vllm_is_truncated_threshold", 1)
    with pytest.raises(ulorl.Error) as e:
        ulorl.presets.verl.agg_loss(lp, mask, loss_agg_mode="token-mean", loss_scale_factor=nan)
    assert e.value.argument == "loss_scale_factor"
    with pytest.raises(ulorl.Error) as e:
        ulorl.global_normalizer("token_mean", ulorl.BatchCounts(6.0, 2.0, 2.0), constant=nan)
    assert e.value.argument == "constant"
    with pytest.raises(ulorl.Error) as e:  # positional: named by its parameter
        ulorl.presets.verl.agg_loss(lp, mask, "token-mean", 1, None, None, nan)
    assert (e.value.argument, e.value.function) == ("loss_scale_factor", "presets::verl::agg_loss")
    with pytest.raises(TypeError):  # an argument the function does not take: its own TypeError, NaN or not
        ulorl.presets.verl.agg_loss(lp, mask, "token-mean", no_such_option=nan)


# ---- a result beyond float64's range is an error naming it, never inf -----------------------------------

def test_huge_coefficients_overflow_into_an_error_not_inf():
    lp = torch.full((2, 3), -1.0, dtype=torch.float64)
    old, adv, mask = lp - 0.1, torch.full((2, 3), 5.0, dtype=torch.float64), torch.ones(2, 3, dtype=torch.bool)
    ref, ent = torch.full((2, 3), -10.0, dtype=torch.float64), torch.full((2, 3), 5.0, dtype=torch.float64)
    calls = {
        "pg_loss": lambda: ulorl.presets.openrlhf.policy_loss(lp, old, adv, mask, dp_size=1e308, batch_num_tokens=6),
        "kl_loss": lambda: ulorl.policy_loss(lp, old, adv, mask, ref_log_prob=ref, kl_coef=1e308),
        "entropy_loss": lambda: ulorl.policy_loss(lp, old, adv, mask, entropy=ent, entropy_coef=1e308),
        "loss": lambda: ulorl.presets.verl.agg_loss(lp * 5, mask, "token-mean", dp_size=1e308, batch_num_tokens=6),
    }
    for result, call in calls.items():
        with pytest.raises(ulorl.Error, match=f"result '{result}' = [-]?inf: overflows float64"):
            call()
    # The same coefficients on values whose products fit give finite losses.
    small = ulorl.policy_loss(lp, old, torch.ones_like(adv), mask, ref_log_prob=lp - 2.0, kl_coef=1e307)[0]
    assert torch.isfinite(small)
