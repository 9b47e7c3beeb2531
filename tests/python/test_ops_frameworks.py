"""The rollout correction, the further advantage estimators, aggregation / KL penalty / off-policy
mask and the frameworks' batch passes through Python, against plain-torch float64 oracles written
from tests/golden/README.md (not the library's code path), plus their rejections: a bad name and a
shape mismatch raise ulorl.Error and leave every input as it was."""

import math

import pytest
import torch

import ulorl

SEED = 20250
RTOL, ATOL = 1e-12, 1e-12


@pytest.fixture
def gen():
    print(f"seed {SEED}")
    return torch.Generator().manual_seed(SEED)


def batch(gen, b=5, t=7, spread=0.3):
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    rollout = old + spread * torch.randn(b, t, generator=gen, dtype=torch.float64)
    mask = torch.rand(b, t, generator=gen) > 0.3
    mask[0, :] = True
    mask[1, 1:] = False
    return old, rollout, mask


# ---- rollout correction ------------------------------------------------------------------------------

def test_token_tis_matches_torch(gen):
    old, rollout, mask = batch(gen, spread=0.8)
    old[2, 3], rollout[2, 3] = -0.1, -30.0  # a log-ratio beyond the +-20 clamp
    m = mask.double()
    w, keep, metrics = ulorl.presets.verl.rollout_correction(old, rollout, mask, rollout_is="token",
                                                             rollout_is_threshold=2.0)
    x = old - rollout
    want = torch.exp(x.clamp(-20, 20)).clamp(max=2.0) * m
    torch.testing.assert_close(w, want, rtol=RTOL, atol=ATOL)
    assert keep.dtype == torch.bool and torch.equal(keep, mask)
    n = m.sum()
    assert metrics["rollout_is_mean"] == pytest.approx(((want * m).sum() / n).item(), rel=1e-12)
    z = want.clamp(0, 2.0) / ((want.clamp(0, 2.0) * m).sum() / n + 1e-8)
    assert metrics["rollout_is_eff_sample_size"] == pytest.approx((1 / ((z * z * m).sum() / n)).item(), rel=1e-12)
    assert metrics["kl"] == pytest.approx((((rollout - old) * m).sum() / n).item(), rel=1e-12)
    assert metrics["k3_kl"] == pytest.approx((((torch.exp(x) - x - 1) * m).sum() / n).item(), rel=1e-12)


def test_generic_config_token_truncate_with_lower_bound(gen):
    old, rollout, mask = batch(gen, spread=1.0)
    w, keep, metrics = ulorl.rollout_correction(old, rollout, mask, level="token", weighting="truncate", lower=0.5,
                                                upper=3.0, log_ratio_clamp=math.inf, masked="as_valid")
    want = torch.exp(old - rollout).clamp(0.5, 3.0)  # every position, masked ones computed like valid ones
    torch.testing.assert_close(w, want, rtol=RTOL, atol=ATOL)
    assert metrics["weight_mean"] == pytest.approx(((want * mask).sum() / mask.sum()).item(), rel=1e-12)


def test_rejection_sampling_keeps_the_mask_dtype(gen):
    old, rollout, mask = batch(gen, spread=1.5)
    fmask = mask.double()
    _, keep, metrics = ulorl.presets.verl.rollout_correction(old, rollout, fmask, rollout_is=None,
                                                             rollout_rs="token_k2", rollout_rs_threshold=0.5)
    k2 = 0.5 * (old - rollout).clamp(-20, 20) ** 2
    want = fmask * (k2 <= 0.5)
    assert keep.dtype == torch.float64
    torch.testing.assert_close(keep, want, rtol=0, atol=0)
    assert metrics["rollout_rs_masked_fraction"] == pytest.approx(((fmask - want).sum() / fmask.sum()).item())


def test_trl_sequence_mask_broadcasts_the_row_ratio(gen):
    old, rollout, mask = batch(gen, spread=0.2)
    w, m = ulorl.presets.trl.rollout_correction(old, rollout, mask, vllm_importance_sampling_mode="sequence_mask",
                                                vllm_importance_sampling_clip_max=3.0)
    r = torch.exp(((old - rollout) * mask).sum(-1))
    r = torch.where(r > 3.0, torch.zeros_like(r), r)
    torch.testing.assert_close(w, r[:, None].expand_as(w), rtol=RTOL, atol=ATOL)
    assert m["importance_sampling_ratio_max"] == pytest.approx(r.max().item(), rel=1e-12)


@pytest.mark.parametrize("call", [
    lambda o, r, m: ulorl.rollout_correction(o, r, m, level="tokens"),
    lambda o, r, m: ulorl.rollout_correction(o, r, m, weighting="tiss"),
    lambda o, r, m: ulorl.presets.verl.rollout_correction(o, r, m, rollout_is="tokens"),
    lambda o, r, m: ulorl.presets.verl.rollout_correction(o, r, m, rollout_rs="token_k4", rollout_rs_threshold=1.0),
    lambda o, r, m: ulorl.presets.verl.rollout_correction(o, r, m, rollout_is="token", rollout_is_threshold=True),
    lambda o, r, m: ulorl.presets.trl.rollout_correction(o, r, m, vllm_importance_sampling_mode="sequence"),
    lambda o, r, m: ulorl.presets.openrlhf.rollout_correction(o, r, m, vllm_is_correction_type="mis"),
    lambda o, r, m: ulorl.presets.nemo_rl.rollout_correction(o, r, m, truncated_importance_sampling_type="tis2",
                                                             truncated_importance_sampling_ratio=2.0),
])
def test_rollout_correction_bad_names(gen, call):
    old, rollout, mask = batch(gen)
    with pytest.raises(ulorl.Error):
        call(old, rollout, mask)


def test_rollout_correction_shape_mismatch_leaves_inputs(gen):
    old, rollout, mask = batch(gen)
    short = rollout[:, :-1].clone()
    before = (old.clone(), short.clone(), mask.clone())
    with pytest.raises(ulorl.Error) as e:
        ulorl.presets.verl.rollout_correction(old, short, mask, rollout_is="token")
    assert "rollout_log_prob" in str(e.value)
    with pytest.raises(ulorl.Error):
        ulorl.rollout_correction(old, rollout, mask[:, :-1])
    for a, b in zip((old, short, mask), before):
        assert torch.equal(a, b)


# ---- advantages -------------------------------------------------------------------------------------------

def test_multi_reward_sum_then_normalize_is_the_weighted_sum(gen):
    comps = torch.randn(8, 3, generator=gen, dtype=torch.float64)
    mask = torch.ones(8, 4, dtype=torch.bool)
    w = [0.5, 1.0, 2.0]
    got = ulorl.multi_reward_advantages(comps, mask, group_size=4, preset="trl", reward_weights=w,
                                        multi_objective_aggregation="sum_then_normalize")
    s = comps @ torch.tensor(w, dtype=torch.float64)
    g = s.view(2, 4)
    want = ((g - g.mean(-1, keepdim=True)) / (g.std(-1, keepdim=True) + 1e-4)).reshape(8)
    torch.testing.assert_close(got, want[:, None].expand(8, 4), rtol=1e-12, atol=1e-12)


def test_reinforce_plus_plus_returns_and_whitening(gen):
    rewards = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    adv, ret = ulorl.reinforce_plus_plus_advantages(rewards, mask, gamma=0.9)
    want = torch.zeros_like(rewards)
    for b in range(3):
        c = 0.0
        for t in reversed(range(5)):
            g = rewards[b, t].item() + 0.9 * c
            want[b, t] = g
            c = g if mask[b, t] else 0.0
    torch.testing.assert_close(ret, want, rtol=1e-12, atol=1e-12)
    m = mask.double()
    n = m.sum()
    mu = (want * m).sum() / n
    var = ((want - mu) ** 2 * m).sum() / n * n / (n - 1)
    torch.testing.assert_close(adv, (want - mu) / torch.sqrt(var + 1e-8) * m, rtol=1e-12, atol=1e-12)


def test_advantage_errors(gen):
    scores = torch.randn(4, generator=gen, dtype=torch.float64)
    mask = torch.ones(4, 3, dtype=torch.bool)
    with pytest.raises(ulorl.Error):
        ulorl.reinforce_plus_plus_baseline_advantages(scores, mask, group_size=2, preset="openrlhf")
    with pytest.raises(ulorl.Error):
        ulorl.multi_reward_advantages(torch.randn(4, 2, dtype=torch.float64), mask, group_size=2, preset="trl",
                                      multi_objective_aggregation="sum_first")
    with pytest.raises(ulorl.Error):  # 3 weights for 2 components
        ulorl.multi_reward_advantages(torch.randn(4, 2, dtype=torch.float64), mask, group_size=2,
                                      reward_weights=[1, 1, 1])
    with pytest.raises(ulorl.Error):  # mask rows != scores
        ulorl.opo_advantages(scores, mask[:3], group_size=2)


# ---- aggregation, KL penalty, off-policy mask ---------------------------------------------------------------

def test_agg_loss_gradcheck_and_value(gen):
    loss_mat = torch.randn(4, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(4, 6, generator=gen) > 0.4
    mask[:, 0] = True
    m = mask.double()
    got = ulorl.agg_loss(loss_mat, mask, agg_mode="seq_mean_token_mean")
    want = ((loss_mat * m).sum(-1) / m.sum(-1)).mean()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: ulorl.agg_loss(x, mask, agg_mode="token_mean"), (loss_mat,))
    # No mask: every token valid, the bits of an all-ones mask (and its counts without a normaliser).
    ones = torch.ones(4, 6, dtype=torch.bool)
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
        assert torch.equal(ulorl.agg_loss(loss_mat, agg_mode=mode), ulorl.agg_loss(loss_mat, ones, agg_mode=mode))
    torch.testing.assert_close(ulorl.agg_loss(loss_mat), loss_mat.mean(), rtol=1e-12, atol=1e-12)
    with pytest.raises(ulorl.Error):
        ulorl.presets.verl.agg_loss(loss_mat, mask, "token-mean-2")
    with pytest.raises(ulorl.Error):
        ulorl.presets.verl.agg_loss(loss_mat, mask[:, :-1], "token-mean")


def test_kl_penalty_low_var_kl_against_torch(gen):
    lp = (-torch.rand(3, 5, generator=gen, dtype=torch.float64) * 4).requires_grad_()
    ref = -torch.rand(3, 5, generator=gen, dtype=torch.float64) * 4
    got = ulorl.presets.verl.kl_penalty(lp, ref, "low_var_kl")
    x = lp.detach().clone().requires_grad_()
    u = (ref - x).clamp(-20, 20)
    want = (torch.exp(u) - u - 1).clamp(-10, 10)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    (got * torch.arange(15.0, dtype=torch.float64).view(3, 5)).sum().backward()
    (want * torch.arange(15.0, dtype=torch.float64).view(3, 5)).sum().backward()
    torch.testing.assert_close(lp.grad, x.grad, rtol=1e-12, atol=1e-12)
    with pytest.raises(ulorl.Error):
        ulorl.presets.verl.kl_penalty(lp, ref, "k5")
    with pytest.raises(ulorl.Error):
        ulorl.presets.openrlhf.compute_approx_kl(lp, ref[:, :2], "k3")


def test_off_policy_mask_trl(gen):
    lp, old, mask = batch(gen, spread=0.5)
    adv = torch.randn(lp.shape[0], generator=gen, dtype=torch.float64)
    keep = ulorl.presets.trl.off_policy_mask(lp, old, adv, mask, 0.1)
    m = mask.double()
    kl = ((old - lp) * m).sum(-1) / m.sum(-1).clamp(min=1)
    want = ((adv >= 0) | (kl <= 0.1)).double()[:, None].expand_as(lp)
    torch.testing.assert_close(keep, want, rtol=0, atol=0)
    with pytest.raises(ulorl.Error):
        ulorl.off_policy_mask(lp, old, adv, mask, delta=0.1, preset="deepseek")


def test_adaptive_entropy_controller():
    c = ulorl.presets.trl.adaptive_entropy_controller(entropy_coef=0.01, entropy_target=0.2, entropy_coef_delta=0.005)
    applied, values = [], []
    for h in (0.5, 0.1, 0.1, 0.3):
        applied.append(c.bonus())
        values.append(c.update(h))
    assert applied == pytest.approx([0.0, 0.0, 0.01, 0.015])
    assert values == pytest.approx([0.005, 0.01, 0.015, 0.01])


# ---- loss modes with a batch pass ----------------------------------------------------------------------------

def test_verl_dro_against_torch(gen):
    lp, old, mask = batch(gen, spread=0.4)
    adv = torch.randn(lp.shape, generator=gen, dtype=torch.float64)
    m = mask.double()
    x = lp.clone().requires_grad_()
    loss, _ = ulorl.presets.verl.policy_loss(old, x, adv, mask, loss_mode="dro", dro_beta=0.3)
    loss.backward()
    y = lp.clone().requires_grad_()
    r = y - old
    want = ((-(y * adv - 0.3 * r * r / 2)) * m).sum() / m.sum()
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-12, atol=1e-12)


def test_verl_batch_pass_errors_leave_inputs(gen):
    lp, old, mask = batch(gen)
    adv = torch.randn(lp.shape, generator=gen, dtype=torch.float64)
    x = lp.clone().requires_grad_()
    before = (old.clone(), adv.clone(), mask.clone())
    with pytest.raises(ulorl.Error):
        ulorl.presets.verl.policy_loss(old, x, adv, mask, loss_mode="dppo_xx")
    with pytest.raises(ulorl.Error):
        ulorl.presets.verl.policy_loss(old[:, :-1], x, adv, mask, loss_mode="dppo_tv")
    with pytest.raises(ulorl.Error):
        ulorl.presets.verl.policy_loss(old, x, adv, mask, loss_mode="kl_cov", kl_cov_ratio=0.0)
    with pytest.raises(ulorl.Error):
        ulorl.presets.verl.policy_loss(old, x, adv, mask, loss_mode="clip_cov")
    assert x.grad is None
    for a, b in zip((old, adv, mask), before):
        assert torch.equal(a, b)


def test_trl_loss_type_errors(gen):
    lp, old, mask = batch(gen)
    adv = torch.randn(lp.shape[0], generator=gen, dtype=torch.float64)
    with pytest.raises(ulorl.Error):
        ulorl.presets.trl.grpo_loss(lp, old, adv, mask, loss_type="gspo")
    with pytest.raises(ulorl.Error):
        ulorl.presets.trl.grpo_loss(lp, old, adv, mask, top_entropy_quantile=0.5)  # entropies missing
    with pytest.raises(ulorl.Error):
        ulorl.presets.trl.grpo_loss(lp, old, adv, mask, loss_type="vespo",
                                    importance_sampling_ratio=torch.ones(lp.shape[0], 1, dtype=torch.float64))


def test_rollout_correction_inside_the_loss_equals_the_two_calls(gen):
    """policy_loss(rollout_correction=...) is rollout_correction() then policy_loss(weights=, mask=keep):
    the same loss and gradient bits; its statistics finalise to the call's metrics."""
    b, t = 5, 37
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3 - 0.05
    lp = old + (torch.rand(b, t, generator=gen, dtype=torch.float64) - 0.5) * 0.6
    ro = old + (torch.rand(b, t, generator=gen, dtype=torch.float64) - 0.5) * 0.6
    adv = torch.randn(b, t, generator=gen, dtype=torch.float64)
    mask = torch.rand(b, t, generator=gen) < 0.85
    rc = ulorl.rollout_correction_config(level="token", upper=2.0, rejection=[("token", "k2", 0.0, 0.03)])
    w, keep, m = ulorl.rollout_correction(old, ro, mask, config=rc)
    kept = float(keep.sum())
    assert 0 < kept < float(mask.sum())
    norm = ulorl.Normalizer("token_mean", kept)
    x1, x2 = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    l1, _ = ulorl.policy_loss(x1, old, adv, keep, weights=w, normalizer=norm, eps_high=0.28)
    l2, m2 = ulorl.policy_loss(x2, old, adv, mask, rollout_log_prob=ro, rollout_correction=rc, normalizer=norm,
                               eps_high=0.28)
    l1.backward()
    l2.backward()
    if ulorl._ulorl.policy_loss_isa == "default":
        assert l1.item() == l2.item()
        assert torch.equal(x1.grad, x2.grad)
        assert ulorl.rollout_correction_finalize(m2["rollout"], rc) == m
    else:
        # The loss runs the installed AVX2 / AVX-512 (+ FMA) kernels, rollout_correction() the default build:
        # the weights' exponentials differ in the last bits (FMA), nothing more.
        torch.testing.assert_close(l1, l2, rtol=1e-14, atol=0)
        torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-13, atol=1e-16)
        got = ulorl.rollout_correction_finalize(m2["rollout"], rc)
        assert got.keys() == m.keys()
        for k in m:
            assert got[k] == pytest.approx(m[k], rel=1e-12, abs=1e-15), k
    # rollout_log_prob without a correction, and weights with one, are errors naming the argument.
    with pytest.raises(ulorl.Error, match="rollout_log_prob"):
        ulorl.policy_loss(lp, old, adv, mask, rollout_log_prob=ro, normalizer=norm)
    with pytest.raises(ulorl.Error, match="weights"):
        ulorl.policy_loss(lp, old, adv, mask, weights=w, rollout_log_prob=ro, rollout_correction=rc, normalizer=norm)
