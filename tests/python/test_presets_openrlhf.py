"""OpenRLHF drop-ins (PolicyLoss, aggregate_loss, compute_approx_kl) called in OpenRLHF's positional
and keyword forms, against float64 oracles written here from OpenRLHF's definitions (the PPO / GSPO
surrogate, dual clip, vLLM IS correction, token- and sequence-level reduction with global counts)."""

import pytest
import torch

import ulorl
from ulorl.presets.openrlhf import PolicyLoss, aggregate_loss, compute_approx_kl

TOL = dict(rtol=1e-7, atol=1e-12)  # OpenRLHF divides a row by n + 1e-8; the oracle by n


def data(gen, B=5, T=8):
    lp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 2 - 0.1
    old = lp + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.5
    ro = old + torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.4
    adv = torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=gen) < 0.7).double()
    mask[:, 0] = 1
    return lp, old, ro, adv, mask


def reduce(loss, m, token_level, dp=1, bnt=None, gbs=None):
    if token_level:
        return (loss * m).sum() / (m.sum() if bnt is None else bnt / dp)
    rows = (loss * m).sum(-1)[m.sum(-1) > 0] / m.sum(-1)[m.sum(-1) > 0]
    return rows.sum() / (len(rows) if gbs is None else gbs / dp)


def oracle(x, old, adv, m, ptype, lo, hi, dual, token_level, ro=None, vtype=None, thr=None, **counts):
    if ptype == "ppo":
        ratio = torch.exp(torch.clamp(x - old, -20, 20))
    else:
        base = ro if ro is not None else old
        ratio = torch.exp(((x - base) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True)).expand_as(x)
        token_level = False
    s1, s2 = ratio * adv, torch.clamp(ratio, 1 - lo, 1 + hi) * adv
    loss = -torch.min(s1, s2)
    if dual is not None:
        loss = torch.where(adv < 0, -torch.max(torch.min(s1, s2), dual * adv), loss)
    if ptype == "ppo" and vtype is not None:
        r = torch.exp(old - ro)
        if vtype == "tis":
            w = r.clamp(thr[0], thr[1])
        elif vtype == "icepop":
            w = r * ((r >= thr[0]) & (r <= thr[1]))
        else:
            g = torch.exp(((old - ro) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True))
            w = r * ((g >= thr[0]) & (g <= thr[1]))
        loss = loss * w
    clip = ((s2 < s1).double() * m).sum() / m.sum()
    return reduce(loss, m, token_level, **counts), clip, ((old - x.detach()) * m).sum() / m.sum()


@pytest.mark.parametrize("ptype", ["ppo", "gspo"])
@pytest.mark.parametrize("dual", [None, 3.0])
@pytest.mark.parametrize("vtype", [None, "tis", "icepop", "seq-mask-tis"])
def test_policy_loss_positional_form(gen, ptype, dual, vtype):
    lp, old, ro, adv, mask = data(gen)
    thr = [0.6, 1.7]
    for token_level, counts in ((True, {}), (False, {}), (True, dict(dp=2, bnt=40.0)), (False, dict(dp=2, gbs=9.0))):
        fn = PolicyLoss(0.2, 0.28, dual, token_level, ptype, vtype is not None, thr if vtype else None, vtype or "tis")
        x, y = lp.clone().requires_grad_(), lp.clone().requires_grad_()
        extra = (counts.get("dp", 1), None if "bnt" not in counts else torch.tensor(counts["bnt"]),
                 None if "gbs" not in counts else torch.tensor(counts["gbs"]))
        loss, clip, ppo_kl, vllm_kl = fn(y, old, adv, mask, ro if vtype else None, *extra)
        want, want_clip, want_kl = oracle(x, old, adv, mask, ptype, 0.2, 0.28, dual, token_level,
                                          ro if vtype else None, vtype if ptype == "ppo" else None, thr, **counts)
        loss.backward()
        want.backward()
        torch.testing.assert_close(loss, want.detach(), **TOL)
        torch.testing.assert_close(y.grad, x.grad, **TOL)
        torch.testing.assert_close(clip, want_clip, **TOL)
        torch.testing.assert_close(ppo_kl, want_kl, **TOL)
        if vtype and ptype == "ppo":
            torch.testing.assert_close(vllm_kl, ((ro - old) * mask).sum() / mask.sum(), **TOL)
        else:
            assert vllm_kl is None
        assert fn.token_level_loss == (token_level and ptype == "ppo")


def test_policy_loss_keyword_form_and_float_mask_on_float32(gen):
    lp, old, ro, adv, mask = (t.float() for t in data(gen))
    fn = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.2, enable_vllm_is_correction=True,
                    vllm_is_truncated_threshold=[0.5, 2.0])
    loss, clip, ppo_kl, vllm_kl = fn(log_probs=lp, old_log_probs=old, advantages=adv, action_mask=mask,
                                     rollout_log_probs=ro, dp_size=1)
    want, _, _ = oracle(lp.double(), old.double(), adv.double(), mask.double(), "ppo", 0.2, 0.2, None, True,
                        ro.double(), "tis", [0.5, 2.0])
    assert loss.dtype == clip.dtype == ppo_kl.dtype == vllm_kl.dtype == torch.float32
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)


def test_policy_loss_rejects_bad_options():
    with pytest.raises(ulorl.Error) as e:
        PolicyLoss(dual_clip=1.0)
    assert e.value.argument == "dual_clip"
    with pytest.raises(ValueError):  # OpenRLHF raises ValueError; ulorl.Error is one
        PolicyLoss(policy_loss_type="grpo")
    with pytest.raises(ulorl.Error) as e:
        PolicyLoss(enable_vllm_is_correction=True)
    assert e.value.argument == "vllm_is_truncated_threshold"


@pytest.mark.parametrize("token_level", [True, False])
def test_aggregate_loss_forms(gen, token_level):
    lp, _, _, _, mask = data(gen)
    mask[2] = 0  # a fully masked row is left out of the sequence mean
    for counts in ({}, dict(dp=4, bnt=30.0, gbs=7.0)):
        x, y = lp.clone().requires_grad_(), lp.clone().requires_grad_()
        if counts:
            got = aggregate_loss(y, mask, token_level, counts["dp"], torch.tensor(counts["bnt"]),
                                 global_batch_size=torch.tensor(counts["gbs"]))
            want = reduce(x, mask, token_level, counts["dp"], counts["bnt"], counts["gbs"])
        else:
            got = aggregate_loss(y, mask, token_level_loss=token_level)
            want = reduce(x, mask, token_level)
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want.detach(), **TOL)
        torch.testing.assert_close(y.grad, x.grad, **TOL)


@pytest.mark.parametrize("est", ["k1", "k2", "k3"])
def test_compute_approx_kl(gen, est):
    lp = -torch.rand(4, 6, generator=gen, dtype=torch.float64) * 2
    base = lp + torch.randn(4, 6, generator=gen, dtype=torch.float64) * 4  # some beyond the +-10 clamp
    x, y = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    r = x - base
    want = {"k1": r, "k2": r ** 2 / 2, "k3": torch.exp(-r) - 1 + r}[est].clamp(-10, 10)
    got = compute_approx_kl(y, base, est) if est != "k1" else compute_approx_kl(y, base)
    (want * torch.arange(24.0, dtype=torch.float64).view(4, 6)).sum().backward()
    (got * torch.arange(24.0, dtype=torch.float64).view(4, 6)).sum().backward()
    torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-12)
    assert compute_approx_kl(lp.to(torch.bfloat16), base, kl_estimator=est).dtype == torch.float32
