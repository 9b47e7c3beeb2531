"""ulorl.presets.verl called in verl's exact positional / keyword forms against float64 oracles
(oracles_verl.py): every policy loss by its registered name, agg_loss, kl_penalty, the advantage
estimators, the rollout correction with verl's metric set, bypass_mode, the registries, install()."""

import math
import sys
import types

import numpy as np
import pytest
import torch

import ulorl
import ulorl.presets.verl as v
import oracles_verl as O

RTOL, ATOL = 1e-10, 1e-12


class Cfg(dict):
    """A config read by attribute, as verl's ActorConfig / DictConfig."""

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k) from None


def batch(seed=0, B=5, T=7, spread=0.5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * spread
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    m = (torch.rand(B, T, generator=g) > 0.3).double()
    m[0] = 1
    m[-1] = 0  # an empty row
    return old, lp, adv, m


def actor(low=0.2, high=0.28, c=3.0, gbi=None, **pl):
    return Cfg(clip_ratio=0.2, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c, tau_pos=1.0, tau_neg=1.05,
               policy_loss=Cfg(pl), global_batch_info=gbi or {})


def check(fn_name, L_fn, metric_fn, agg_mode="token-mean", gbi=None, cfg=None, w=None, seed=0):
    old, lp, adv, m = batch(seed)
    cfg = cfg or actor(gbi=gbi)
    x = lp.clone().requires_grad_()
    loss, metrics = getattr(v, fn_name)(old, x, adv, m, agg_mode, cfg, w)  # verl's positional form
    loss.backward()
    y = lp.clone().requires_grad_()
    want, want_m = L_fn(old, y, adv, m)
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(x.grad, y.grad, rtol=RTOL, atol=ATOL)
    assert set(metrics) == {f"actor/{k}" for k in want_m}
    for k, val in want_m.items():
        assert metrics[f"actor/{k}"] == pytest.approx(float(val), rel=1e-12, abs=1e-14), k


@pytest.mark.parametrize("agg", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("mode", ["vanilla", "cispo", "gpg", "dro"])
def test_token_losses(mode, agg):
    gbi = {"dp_size": 2, "batch_num_tokens": 30, "global_batch_size": 7} if agg != "token-sum" else {"dp_size": 3}
    cfg = actor(gbi=gbi, dro_beta=0.05)
    w = torch.rand(5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) + 0.5

    def L(old, lp, adv, m):
        tl, tm = O.token_loss(mode, old, lp, adv, 0.2, 0.28, beta=0.05)
        return (O.agg(tl * w, m, agg, dp=gbi["dp_size"], n_tokens=gbi.get("batch_num_tokens"),
                      n_seqs=gbi.get("global_batch_size")), {k: O.mmean(t, m) for k, t in tm.items()})

    check(f"compute_policy_loss_{mode}", L, None, agg, cfg=cfg, w=w)


@pytest.mark.parametrize("mode", ["gspo", "sapo"])
def test_sequence_mean_losses_ignore_the_agg_mode(mode):
    def L(old, lp, adv, m):
        tl, tm = (O.gspo(old, lp, adv, m, 0.2, 0.28) if mode == "gspo"
                  else O.token_loss("sapo", old, lp, adv, 0.2, 0.28))
        return O.agg(tl, m, "seq-mean-token-mean"), {k: O.mmean(t, m) for k, t in tm.items()}

    check(f"compute_policy_loss_{mode}", L, None, "token-mean")


@pytest.mark.parametrize("mode", ["gspo", "sapo"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_sequence_mean_losses_need_the_global_batch_size_across_ranks(mode, agg):
    # verl aggregates gspo and sapo as seq-mean-token-mean, so dp_size > 1 needs global_batch_size
    # whatever loss_agg_mode says.
    old, lp, adv, m = batch(0)
    with pytest.raises(ValueError, match="global_batch_size is required when dp_size > 1"):
        getattr(v, f"compute_policy_loss_{mode}")(old, lp, adv, m, agg, actor(gbi={"dp_size": 2, "batch_num_tokens": 30}))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_agg_loss_takes_masks_of_any_dtype(dtype, mode):
    old, lp, adv, m = batch(0)
    want = v.agg_loss(lp, m.to(torch.float64), mode)
    torch.testing.assert_close(v.agg_loss(lp, m.to(dtype), mode), want, rtol=0, atol=0)


def test_all_zero_sequence_weights_raise_verls_zero_division():
    # sequence IcePop in [0.8, 1.25] with every row's ratio e: every weight 0, the ESS 1 / 0 (verl: ZeroDivisionError)
    lp = torch.zeros(3, 4, dtype=torch.float64)
    with pytest.raises(ZeroDivisionError) as e:
        v.compute_rollout_correction_and_rejection_mask(lp - 1.0, lp, torch.ones(3, 4), rollout_is="sequence",
                                                        rollout_is_threshold="0.8_1.25")
    assert isinstance(e.value, ulorl.Error) and e.value.argument == "weights"


def test_geo_mean():
    def L(old, lp, adv, m):
        return O.geo_mean(old, lp, adv, m, 0.2, 0.28)

    check("compute_policy_loss_geo_mean", L, None, "seq-mean-token-sum")


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_dppo(kind):
    # a config without clip_ratio_c: dppo's cap defaults to 20 (vanilla's to 3)
    cfg = Cfg(clip_ratio=0.3, clip_ratio_low=None, clip_ratio_high=0.1, policy_loss=Cfg(), global_batch_info={})

    def L(old, lp, adv, m):
        tl, tm = O.dppo(kind, old, lp, adv, 0.3, 0.1, 20.0)
        return O.agg(tl, m, "token-mean"), {k: O.mmean(t, m) for k, t in tm.items()}

    check(f"compute_policy_loss_dppo_{kind}", L, None, cfg=cfg)


def test_kl_cov_penalises_the_top_covariance_tokens():
    old, lp, adv, m = batch(1)
    cfg = actor(kl_cov_ratio=0.25, ppo_kl_coef=0.7)
    x = lp.clone().requires_grad_()
    loss, metrics = v.compute_policy_loss_kl_cov(old, x, adv, m, "token-mean", cfg)
    loss.backward()
    y = lp.clone().requires_grad_()
    valid = m.bool()
    cov = (adv - adv[valid].mean()) * (lp - lp[valid].mean())
    k = max(1, int(valid.sum().item() * 0.25))
    top = cov[valid].topk(k).values.min()
    sel = ((cov >= top) & valid).double()
    want = O.agg(-adv * torch.exp(y - old) + 0.7 * (y - old).abs() * sel, m, "token-mean")
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(x.grad, y.grad, rtol=RTOL, atol=ATOL)
    assert metrics == {"actor/ppo_kl": pytest.approx(O.mmean((lp - old).abs(), m).item(), rel=1e-12)}


def test_clip_cov_drops_the_drawn_candidates():
    old, lp, adv, m = batch(2)
    cfg = actor(clip_cov_ratio=0.2, clip_cov_lb=-0.3, clip_cov_ub=0.3)
    torch.manual_seed(5)
    x = lp.clone().requires_grad_()
    loss, metrics = v.compute_policy_loss_clip_cov(old, x, adv, m, "token-mean", cfg)
    loss.backward()
    # The oracle: candidates in row-major order, the same randperm draw from the same seed.
    r = torch.exp(lp - old)
    a, b = -adv * r, -adv * r.clamp(0.8, 1.28)
    mb = m.bool()
    cov = (adv - adv[mb].mean()) * (lp - lp[mb].mean())
    cand = torch.nonzero(mb & ~(b > a) & (cov > -0.3) & (cov < 0.3))
    torch.manual_seed(5)
    pick = cand[torch.randperm(len(cand))[: min(max(int(0.2 * m.sum().item()), 1), len(cand))]]
    keep = torch.ones_like(lp)
    keep[pick[:, 0], pick[:, 1]] = 0
    y = lp.clone().requires_grad_()
    ry = torch.exp(y - old)
    want = O.agg(torch.maximum(-adv * ry, -adv * ry.clamp(0.8, 1.28)) * keep, m, "token-mean")
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(x.grad, y.grad, rtol=RTOL, atol=ATOL)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(O.mmean(1 - keep, m).item(), rel=1e-12)
    assert metrics["actor/ppo_kl"] == pytest.approx(O.mmean(-(lp - old), m).item(), rel=1e-12)


def test_dro_requires_a_positive_beta_with_verls_error_type():
    old, lp, adv, m = batch()
    with pytest.raises(ValueError, match="dro_beta"):
        v.compute_policy_loss_dro(old, lp, adv, m, "token-mean", actor())


@pytest.mark.parametrize("agg", ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum-norm"])
def test_agg_loss(agg):
    _, L, _, m = batch(4)
    for args in [(), (4, 40, 9, 16)]:
        x = L.clone().requires_grad_()
        got = v.agg_loss(x, m, agg, *args)
        got.backward()
        y = L.clone().requires_grad_()
        dp, nt, ns, hz = args or (1, None, None, None)
        want = O.agg(y, m, agg, dp=dp, n_tokens=nt, n_seqs=ns, horizon=hz)
        want.backward()
        torch.testing.assert_close(got, want.detach(), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(x.grad, y.grad, rtol=RTOL, atol=ATOL)


def test_agg_loss_options_and_errors():
    _, L, _, m = batch(4)
    got = v.agg_loss(L, m, loss_agg_mode="seq-mean-token-sum-norm", sum_norm_per_sequence=False)
    assert got.item() == pytest.approx(((L * m).sum() / L.shape[-1]).item(), rel=1e-13)
    with pytest.raises(ValueError, match="batch_num_tokens"):
        v.agg_loss(L, m, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size"):
        v.agg_loss(L, m, "seq-mean-token-mean", 2)
    with pytest.raises(ValueError):
        v.agg_loss(L, m, "token_mean")
    assert v.agg_loss(L.float(), m, "token-sum").dtype == torch.float32


@pytest.mark.parametrize("name", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "abs+", "k2+", "k3+",
                                  "low_var_kl+"])
def test_kl_penalty(name):
    old, lp, _, _ = batch(5, spread=12.0)
    x, r = lp.clone().requires_grad_(), old.clone().requires_grad_()
    got = v.kl_penalty(x, r, name)
    got.sum().backward()
    y, q = lp.clone().requires_grad_(), old.clone().requires_grad_()
    want = O.kl(y, q, name)
    want.sum().backward()
    torch.testing.assert_close(got, want.detach(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(x.grad, y.grad, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(r.grad, q.grad, rtol=RTOL, atol=ATOL)  # verl's reference gradient too


def test_kl_penalty_unknown_name_is_verls_not_implemented():
    old, lp, _, _ = batch()
    for name in ("full", "k5"):
        with pytest.raises(NotImplementedError) as e:
            v.kl_penalty(lp, old, name)
        assert isinstance(e.value, ulorl.Error) and e.value.argument == "kl_penalty"


# ---- advantages ---------------------------------------------------------------------------------------------

UIDS = np.array(["a", "a", "b", "b", "b", "c", "a", "d"], dtype=object)  # "d" a singleton


def rewards(seed=0):
    g = torch.Generator().manual_seed(seed)
    m = (torch.rand(8, 6, generator=g) > 0.3).double()
    m[:, 0] = 1
    return torch.randn(8, 6, generator=g, dtype=torch.float64) * m, m


def test_grpo_family_with_uid_strings():
    r, m = rewards()
    s = r.sum(-1)
    for fn in (v.compute_grpo_outcome_advantage, v.compute_grpo_vectorized_outcome_advantage):
        adv, ret = fn(r, m, UIDS)
        torch.testing.assert_close(adv, O.grpo(s, list(UIDS)).unsqueeze(-1) * m, rtol=1e-12, atol=1e-14)
        assert torch.equal(adv, ret)
    adv, _ = v.compute_grpo_outcome_advantage(r, m, UIDS, 1e-6, False)
    torch.testing.assert_close(adv, O.grpo(s, list(UIDS), std=False).unsqueeze(-1) * m, rtol=1e-12, atol=1e-14)
    adv, _ = v.compute_rloo_outcome_advantage(token_level_rewards=r, response_mask=m, index=UIDS)
    torch.testing.assert_close(adv, O.rloo(s, list(UIDS)).unsqueeze(-1) * m, rtol=1e-12, atol=1e-14)
    adv, _ = v.compute_rloo_vectorized_outcome_advantage(r, m, UIDS)
    torch.testing.assert_close(adv, O.rloo(s, list(UIDS), True).unsqueeze(-1) * m, rtol=1e-12, atol=1e-14)


def test_gpg_opo_and_rf_baseline():
    r, m = rewards(1)
    s, ids = r.sum(-1), list(UIDS)
    adv, _ = v.compute_gpg_outcome_advantage(r, m, UIDS, f_norm=2.0)
    mean0 = {g: (s[[i for i in range(8) if ids[i] == g]].mean() if ids.count(g) > 1 else 0.0) for g in set(ids)}
    want = torch.stack([8 / (s != 0).sum() * (s[i] - mean0[ids[i]]) / 2.0 for i in range(8)])
    torch.testing.assert_close(adv, want.unsqueeze(-1) * m, rtol=1e-12, atol=1e-14)
    adv, _ = v.compute_opo_outcome_advantage(r, m, UIDS)
    n = m.sum(-1)
    base = {g: ((n * s)[[i for i in range(8) if ids[i] == g]].sum() / n[[i for i in range(8) if ids[i] == g]].sum()
                if ids.count(g) > 1 else 0.0) for g in set(ids)}
    torch.testing.assert_close(adv, torch.stack([s[i] - base[ids[i]] for i in range(8)]).unsqueeze(-1) * m,
                               rtol=1e-12, atol=1e-14)
    adv, ret = v.compute_reinforce_plus_plus_baseline_outcome_advantage(r, m, UIDS)
    centred = torch.stack([s[i] - mean0[ids[i]] for i in range(8)]).unsqueeze(-1) * m
    torch.testing.assert_close(adv, O.whiten(centred, m), rtol=1e-10, atol=1e-12)
    adv, _ = v.compute_gdpo_outcome_advantage(r, m, UIDS)
    torch.testing.assert_close(adv, O.whiten(O.grpo(s, ids).unsqueeze(-1) * m, m), rtol=1e-10, atol=1e-12)


def test_reinforce_plus_plus_skips_observation_spans():
    m = torch.tensor([[1.0, 1, 0, 0, 1, 1], [1, 0, 1, 1, 0, 0]], dtype=torch.float64)
    r = torch.tensor([[0.0, 0, 3, 0, 0, 1], [0, 4, 0, 2, 0, 0]], dtype=torch.float64)  # masked rewards are dropped
    for gamma in (1.0, 0.5):
        adv, ret = v.compute_reinforce_plus_plus_outcome_advantage(r, m, config=types.SimpleNamespace(gamma=gamma))
        want = O.reinforce_plus_plus_returns(r, m, gamma)
        torch.testing.assert_close(ret, want, rtol=0, atol=1e-15)
        torch.testing.assert_close(adv, O.whiten(want, m), rtol=1e-10, atol=1e-12)
    _, ret = v.compute_reinforce_plus_plus_outcome_advantage(r[:1], m[:1], Cfg(gamma=1.0))
    assert ret.tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]]


# ---- rollout correction --------------------------------------------------------------------------------------


def rc_batch(seed=0):
    old, lp, _, m = batch(seed, spread=0.3)
    m[-1, 0] = 1
    return lp, old, m


@pytest.mark.parametrize("threshold", [2.0, "0.5_1.5"])
def test_token_is_weights_and_metrics(threshold):
    lp, ro, m = rc_batch()
    proto, keep, metrics = v.compute_rollout_correction_and_rejection_mask(
        old_log_prob=lp, rollout_log_prob=ro, response_mask=m, rollout_is="token", rollout_is_threshold=threshold)
    upper, lower = (2.0, None) if threshold == 2.0 else (1.5, 0.5)
    w, raw, _ = O.rollout_is(lp, ro, m, "token", upper, lower)
    torch.testing.assert_close(proto.batch["rollout_is_weights"], w, rtol=1e-13, atol=1e-15)
    assert torch.equal(keep, m)
    want = O.token_is_metrics(w, raw, m, upper, lower)
    want.update(O.offpolicy(lp, ro, m))
    if lower is not None:
        want["rollout_is_oob_ratio"] = O.mmean(((raw < lower) | (raw > upper)).double(), m).item()
    assert set(metrics) == {f"rollout_corr/{k}" for k in want}
    for k, val in want.items():  # verl's fractions are float32 means
        assert metrics[f"rollout_corr/{k}"] == pytest.approx(val, rel=1e-7, abs=1e-12), k


def test_rejection_options_and_chain():
    lp, ro, m = rc_batch(1)
    _, keep, metrics = v.compute_rollout_correction_and_rejection_mask(lp, ro, m, None, 2.0, False,
                                                                       "token_k1,seq_mean_k3", "0.8_1.25,0.01")
    lr = (lp - ro).clamp(-20, 20)
    tok_keep = (-lr >= math.log(0.8)) & (-lr <= math.log(1.25))
    k3 = torch.exp(lr) - 1 - lr
    seq_keep = ((k3 * m).sum(-1) / (m.sum(-1) + 1e-8) <= 0.01).unsqueeze(-1)
    want = m * (tok_keep & seq_keep).double()
    assert torch.equal(keep, want)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(O.mmean(1 - (want > 0).double() * m, m).item())
    assert metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(
        O.mmean(1 - tok_keep.double(), m).item())
    assert metrics["rollout_corr/rollout_rs_seq_mean_k3_mean"] == pytest.approx(
        O.mmean(((k3 * m).sum(-1) / (m.sum(-1) + 1e-8)).unsqueeze(-1).expand_as(m), m).item(), rel=1e-10)
    for opt in ("token_k1", "seq_mean_k3"):
        for s in ("mean", "max", "min", "std", "fraction_high", "fraction_low", "seq_mean", "seq_std",
                  "masked_fraction", "seq_masked_fraction"):
            assert f"rollout_corr/rollout_rs_{opt}_{s}" in metrics


def test_rollout_correction_errors_and_disabled():
    lp, ro, m = rc_batch()
    with pytest.raises(TypeError, match="not a boolean"):
        v.compute_rollout_correction_and_rejection_mask(lp, ro, m, rollout_is="token", rollout_is_threshold=True)
    with pytest.raises(ValueError):
        v.compute_rollout_correction_and_rejection_mask(lp, ro, torch.zeros_like(m), rollout_is="token")
    with pytest.raises(ValueError):
        v.compute_rollout_correction_and_rejection_mask(lp, ro, m, rollout_rs="token_k1")
    proto, keep, metrics = v.compute_rollout_correction_and_rejection_mask(lp, ro, m)
    assert proto is None and torch.equal(keep, m)
    assert metrics == {f"rollout_corr/{k}": pytest.approx(x, rel=1e-10) for k, x in O.offpolicy(lp, ro, m).items()}
    assert set(v.compute_offpolicy_metrics(lp, None, m)) == {"training_ppl", "training_log_ppl"}


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
def test_bypass_mode(loss_type):
    old, lp, adv, m = batch(3, spread=0.3)
    m[-1, 0] = 1
    rc = Cfg(loss_type=loss_type, rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k2",
             rollout_rs_threshold=0.02)
    cfg = actor(rollout_correction=rc)
    x = lp.clone().requires_grad_()
    loss, metrics = v.get_policy_loss_fn("bypass_mode")(old, x, adv, m, "token-mean", cfg)
    loss.backward()
    keep = m * (0.5 * (lp - old) ** 2 <= 0.02).double()
    y = lp.clone().requires_grad_()
    if loss_type == "reinforce":
        w, _, _ = O.rollout_is(lp, old, m, "token", 2.0)
        want = O.agg(-adv * y * w, keep, "token-mean")
        assert metrics["actor/ppo_kl"] == pytest.approx(O.mmean(old - lp, keep).item(), rel=1e-12)
    else:
        tl, _ = O.token_loss("vanilla", old, y, adv, 0.2, 0.28)
        want = O.agg(tl, keep, "token-mean")
        assert {"actor/pg_clipfrac", "actor/pg_clipfrac_lower"} <= set(metrics)
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(x.grad, y.grad, rtol=RTOL, atol=ATOL)
    assert "rollout_corr/rollout_is_mean" in metrics and "rollout_corr/rollout_rs_token_k2_mean" in metrics


# ---- inputs, registries, install -----------------------------------------------------------------------------


def test_bf16_advantages_compute_in_the_promoted_dtype():
    old, lp, adv, m = batch(6)
    old, lp = old.float(), lp.float()
    a16 = adv.to(torch.bfloat16)
    loss, _ = v.compute_policy_loss_vanilla(old, lp, a16, m.float(), "token-mean", actor())
    tl, _ = O.token_loss("vanilla", old.double(), lp.double(), a16.double(), 0.2, 0.28)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(O.agg(tl, m, "token-mean").item(), rel=1e-5)


@pytest.mark.parametrize("rewards_dtype,mask_dtype", [(torch.float32, torch.float64), (torch.bfloat16, torch.bfloat16),
                                                       (torch.float32, torch.int64), (torch.float64, torch.bool)])
def test_outcome_advantages_have_the_dtype_of_verls_product(rewards_dtype, mask_dtype):
    # verl returns scores.unsqueeze(-1) * response_mask: torch's promotion of the two dtypes.
    torch.manual_seed(3)
    rewards = torch.zeros(4, 5)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 0.5, 1.0])
    mask = torch.ones(4, 5)
    mask[1, 3:] = 0
    index = np.array(["a", "a", "b", "b"], dtype=object)
    adv, _ = v.compute_grpo_outcome_advantage(rewards.to(rewards_dtype), mask.to(mask_dtype), index)
    scores = rewards.to(rewards_dtype).sum(-1)
    assert adv.dtype == (scores.unsqueeze(-1) * mask.to(mask_dtype)).dtype
    assert torch.equal(adv == 0, mask == 0)  # the advantages sit on the mask (each group's scores differ)


def test_registries_and_lookup():
    assert v.get_policy_loss_fn("vanilla") is v.compute_policy_loss_vanilla
    with pytest.raises(ValueError, match="Unsupported loss mode"):
        v.get_policy_loss_fn("nope")
    assert v.get_adv_estimator_fn("grpo") is v.compute_grpo_outcome_advantage
    with pytest.raises(ValueError, match="Unknown advantage estimator"):
        v.get_adv_estimator_fn("nope")
    assert set(v.POLICY_LOSS_REGISTRY) == {"vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov",
                                           "kl_cov", "geo_mean", "dro", "cispo", "bypass_mode"}


def test_install_into_a_verl_like_package(monkeypatch):
    def orig():
        pass

    def agg_loss():
        pass

    core = types.ModuleType("verl.trainer.ppo.core_algos")
    core.POLICY_LOSS_REGISTRY, core.ADV_ESTIMATOR_REGISTRY = {"vanilla": orig}, {"gae": orig, "vtrace": orig}
    core.agg_loss, core.compute_policy_loss_vanilla = agg_loss, orig
    helper = types.ModuleType("verl.trainer.ppo.rollout_corr_helper")
    helper.compute_rollout_correction_and_rejection_mask = lambda: None
    user = types.ModuleType("verl.workers.actor")
    user.agg_loss = core.agg_loss
    for name, mod in (("verl", types.ModuleType("verl")), ("verl.trainer", types.ModuleType("verl.trainer")),
                      ("verl.trainer.ppo", types.ModuleType("verl.trainer.ppo")), (core.__name__, core),
                      (helper.__name__, helper), (user.__name__, user)):
        monkeypatch.setitem(sys.modules, name, mod)
    replaced = v.install()
    assert core.POLICY_LOSS_REGISTRY["vanilla"] is v.compute_policy_loss_vanilla
    assert core.ADV_ESTIMATOR_REGISTRY["vtrace"] is orig and core.ADV_ESTIMATOR_REGISTRY["grpo"] is not None
    assert core.ADV_ESTIMATOR_REGISTRY["gae"] is v.compute_gae_advantage_return
    assert user.agg_loss is v.agg_loss and core.agg_loss is v.agg_loss
    assert helper.compute_rollout_correction_and_rejection_mask is v.compute_rollout_correction_and_rejection_mask
    assert "agg_loss" in replaced["verl.workers.actor"]
