"""NeMo-RL drop-ins (ClippedPGLossFn, ClippedPGLossConfig, calculate_kl) called in NeMo-RL's forms,
against float64 oracles written here from NeMo-RL's definitions: PPO / dual clip / CISPO / GSPO /
REINFORCE / forced on-policy objectives, truncated importance weights, the importance-weighted
reference KL, the positive-example NLL, the global normalisers and the logged metrics."""

import math

import pytest
import torch

import ulorl
from ulorl.presets import nemo_rl
from ulorl.presets.nemo_rl import ClippedPGLossConfig, ClippedPGLossFn, ConfigError, calculate_kl

TOL = dict(rtol=1e-7, atol=1e-12)  # NeMo-RL divides by count + 1e-8; the oracle by count


def data(gen, B=4, S=9):
    d = {"token_mask": (torch.rand(B, S, generator=gen) < 0.8).to(torch.int64),
         "sample_mask": torch.tensor([1] * (B - 1) + [0]),
         "advantages": torch.randn(B, S, generator=gen, dtype=torch.float64),
         "prev_logprobs": -torch.rand(B, S, generator=gen, dtype=torch.float64) * 2,
         "reference_policy_logprobs": -torch.rand(B, S, generator=gen, dtype=torch.float64) * 2,
         "rewards": torch.tensor([1.0, 0.0, 2.0, 1.0][:B], dtype=torch.float64)}
    d["token_mask"][:, 1] = 1
    d["generation_logprobs"] = d["prev_logprobs"] + torch.randn(B, S, generator=gen, dtype=torch.float64) * 0.3
    lp = d["prev_logprobs"][:, 1:] + torch.randn(B, S - 1, generator=gen, dtype=torch.float64) * 0.4
    return d, lp


def kl_of(lp, ref, kind):
    u = ref - lp
    return {"k1": -u, "k2": u * u / 2, "k3": torch.exp(u) - 1 - u}[kind]


def oracle(c, x, d, gs, gt):
    """NeMo-RL's loss and a few metrics, written out in float64 autograd."""
    m = (d["token_mask"][:, 1:] * d["sample_mask"][:, None]).double()
    adv, gen, ref = d["advantages"][:, 1:], d["generation_logprobs"][:, 1:], d["reference_policy_logprobs"][:, 1:]
    prev = x.detach() if c.force_on_policy_ratio else d["prev_logprobs"][:, 1:]
    lo, hi = 1 - c.ratio_clip_min, 1 + c.ratio_clip_max
    if c.force_on_policy_ratio:
        r = rc = torch.exp(x - x.detach())
    elif c.disable_ppo_ratio:
        r = rc = x
    elif c.sequence_level_importance_ratios:
        n = m.sum(-1, keepdim=True).clamp(min=1)
        r = torch.exp(((x - prev) * m).sum(-1, keepdim=True) / n).expand_as(x)
        rc = r.clamp(lo, hi)
    else:
        r = torch.exp(x - prev)
        rc = r.clamp(lo, hi)
    tok = -adv * rc.detach() * x if c.use_cispo else torch.max(-adv * r, -adv * rc)
    if c.ratio_clip_c is not None:
        tok = torch.where(adv < 0, torch.min(tok, -adv * c.ratio_clip_c), tok)
    if c.sequence_level_importance_ratios:
        w = torch.exp(((prev - gen) * m).sum(-1, keepdim=True)).expand_as(x)
    else:
        w = torch.exp(prev - gen)
    t, tmax, tmin = c.truncated_importance_sampling_type, c.truncated_importance_sampling_ratio, \
        c.truncated_importance_sampling_ratio_min
    if t == "tis":
        w = w.clamp(tmin or 0.0, tmax)
    elif t == "icepop":
        w = w * ((w >= tmin) & (w <= tmax))
    elif t == "seq-mask-tis":
        g = torch.exp(((prev - gen) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1))
        w = w * ((g >= tmin) & (g <= tmax))
    if c.use_importance_sampling_correction:
        tok = tok * w

    def reduce(v):
        if c.token_level_loss:
            return (v * m).sum() / gt
        rows = m.sum(-1) > 0
        return ((v * m).sum(-1)[rows] / m.sum(-1)[rows]).sum() / gs

    loss = reduce(tok)
    beta = 0.0 if c.use_kl_in_reward else c.reference_policy_kl_penalty
    if beta:
        omega = torch.exp(x - gen) if c.use_on_policy_kl_approximation else torch.exp(x - x.detach())
        u = ref - x
        if c.kl_input_clamp_value is not None:
            inside = u.abs() <= c.kl_input_clamp_value
            omega = torch.where(inside, omega, omega.detach())
            x_k = torch.where(inside, x, (ref - u.clamp(-c.kl_input_clamp_value, c.kl_input_clamp_value)).detach())
        else:
            x_k = x
        k = omega * kl_of(x_k, ref, c.reference_policy_kl_type)
        if c.kl_output_clamp_value is not None:
            k = k.clamp(-c.kl_output_clamp_value, c.kl_output_clamp_value)
        loss = loss + beta * reduce(k)
    if c.positive_example_nll_weight > 0:
        cm = m * (d["rewards"] > 0).double()[:, None]
        loss = loss + c.positive_example_nll_weight * (-(x * cm).sum() / cm.sum())
    valid = m != 0
    metrics = {"probs_ratio": ((r.detach() * m).sum() / gt).item(),
               "probs_ratio_clamped": ((rc.detach() * m).sum() / gt).item(),
               "probs_ratio_min": r.detach()[valid].min().item(), "probs_ratio_max": r.detach()[valid].max().item(),
               "approx_entropy": (-(torch.exp(x.detach() - gen) * x.detach() * m).sum() / gt).item(),
               "gen_kl_error": ((kl_of(gen, prev.detach(), c.reference_policy_kl_type) * m).sum() / gt).item(),
               "num_valid_samples": int(d["sample_mask"].sum())}
    if not c.sequence_level_importance_ratios:
        metrics["sampling_importance_ratio"] = ((w * m).sum() / gt).item()
    else:  # NeMo-RL's masked mean of the [B, 1] weights by the [B] sample mask broadcasts to [B, B]
        metrics["sampling_importance_ratio"] = (w[:, 0].sum() * d["sample_mask"].sum() / gs).item()
    return loss, metrics


CONFIGS = [
    dict(),
    dict(ratio_clip_c=3.0, ratio_clip_max=0.28, reference_policy_kl_type="k2"),
    dict(disable_ppo_ratio=True, reference_policy_kl_penalty=0.0),
    dict(force_on_policy_ratio=True, use_importance_sampling_correction=True, truncated_importance_sampling_type="tis",
         truncated_importance_sampling_ratio=1.5, truncated_importance_sampling_ratio_min=0.8),
    dict(use_cispo=True, use_importance_sampling_correction=True, reference_policy_kl_type="k1"),
    dict(sequence_level_importance_ratios=True, token_level_loss=False, use_importance_sampling_correction=True,
         truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=1.3),
    dict(token_level_loss=False, use_importance_sampling_correction=True, truncated_importance_sampling_type="icepop",
         truncated_importance_sampling_ratio=1.5, truncated_importance_sampling_ratio_min=0.7,
         use_on_policy_kl_approximation=True, kl_input_clamp_value=0.4, kl_output_clamp_value=0.3),
    dict(use_importance_sampling_correction=True, truncated_importance_sampling_type="seq-mask-tis",
         truncated_importance_sampling_ratio=1.3, truncated_importance_sampling_ratio_min=0.8,
         positive_example_nll_weight=0.3),
    dict(use_kl_in_reward=True, kl_input_clamp_value=None, kl_output_clamp_value=None),
]


@pytest.mark.parametrize("i", range(len(CONFIGS)))
def test_clipped_pg_loss_fn_against_oracle(gen, i):
    cfg = ClippedPGLossConfig(**CONFIGS[i])
    d, lp = data(gen)
    m = d["token_mask"][:, 1:] * d["sample_mask"][:, None]
    for gs, gt in ((d["sample_mask"].sum(), m.sum()), (torch.tensor(7), torch.tensor(40.0))):
        x, y = lp.clone().requires_grad_(), lp.clone().requires_grad_()
        fn = ClippedPGLossFn(cfg)
        got, metrics = fn(y, d, gs, gt) if i % 2 else fn(next_token_logprobs=y, data=d, global_valid_seqs=gs,
                                                         global_valid_toks=gt)
        want, want_metrics = oracle(cfg, x, d, float(gs), float(gt))
        got.backward()
        want.backward()
        torch.testing.assert_close(got, want.detach(), **TOL)
        torch.testing.assert_close(y.grad, x.grad, **TOL)
        assert metrics["loss"] == pytest.approx(want.item(), rel=1e-7, abs=1e-12)
        for k, v in want_metrics.items():
            assert metrics[k] == pytest.approx(v, rel=1e-7, abs=1e-12), k


@pytest.mark.parametrize("i", [i for i, c in enumerate(CONFIGS) if "use_kl_in_reward" not in c])
def test_clipped_pg_loss_keywords_against_oracle(gen, i):
    """The keyword form on aligned tensors (no leading column, sample_mask folded into the mask), every
    objective included (cispo, GSPO, the positive-example NLL), against the same oracle."""
    cfg = ClippedPGLossConfig(**CONFIGS[i])
    d, lp = data(gen)
    m = (d["token_mask"][:, 1:] * d["sample_mask"][:, None]).bool()
    gs, gt = float(d["sample_mask"].sum()), float(m.sum())
    x, y = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    got, metrics = nemo_rl.clipped_pg_loss(
        y, d["prev_logprobs"][:, 1:], d["advantages"][:, 1:], m, generation_logprobs=d["generation_logprobs"][:, 1:],
        reference_policy_logprobs=d["reference_policy_logprobs"][:, 1:], rewards=d["rewards"], global_valid_toks=gt,
        global_valid_seqs=gs, **CONFIGS[i])
    want, want_metrics = oracle(cfg, x, d, gs, gt)
    got.backward()
    want.backward()
    torch.testing.assert_close(got, want.detach(), **TOL)
    torch.testing.assert_close(y.grad, x.grad, **TOL)
    want_metrics.pop("num_valid_samples")
    if cfg.sequence_level_importance_ratios:  # the keyword form has no sample mask: every row is a sample
        want_metrics.pop("sampling_importance_ratio")
    for k, v in want_metrics.items():
        assert metrics[k] == pytest.approx(v, rel=1e-7, abs=1e-12), k
    assert ("positive_nll_loss" in metrics) and ("kl_penalty" in metrics) == (cfg.reference_policy_kl_penalty != 0)


def test_clipped_pg_loss_keywords_need_their_tensors(gen):
    d, lp = data(gen)
    m = d["token_mask"][:, 1:]
    args = (lp, d["prev_logprobs"][:, 1:], d["advantages"][:, 1:], m)
    fn = "presets::nemo_rl::clipped_pg_loss"  # errors name the function called, not the class it runs
    with pytest.raises(ulorl.Error, match="generation_logprobs") as e:
        nemo_rl.clipped_pg_loss(*args, use_importance_sampling_correction=True, reference_policy_kl_penalty=0.0)
    assert e.value.function == fn
    with pytest.raises(ulorl.Error, match="reference_policy_logprobs") as e:
        nemo_rl.clipped_pg_loss(*args)
    assert e.value.function == fn
    with pytest.raises(ConfigError) as e:
        nemo_rl.clipped_pg_loss(*args, ratio_clip_c=1.0, reference_policy_kl_penalty=0.0)
    assert (e.value.function, e.value.argument) == (fn, "ratio_clip_c")
    with pytest.raises(ConfigError):
        nemo_rl.clipped_pg_loss(*args, use_cispo=True, ratio_clip_c=3.0, reference_policy_kl_penalty=0.0)
    _, metrics = nemo_rl.clipped_pg_loss(*args, reference_policy_kl_penalty=0.0)
    assert "sampling_importance_ratio" not in metrics and "positive_nll_loss" not in metrics


def test_empty_micro_batch_and_neg_inf_generation_log_probs(gen):
    d, lp = data(gen)
    cfg = ClippedPGLossConfig(use_importance_sampling_correction=True, truncated_importance_sampling_type="seq-mask-tis",
                              truncated_importance_sampling_ratio=1.5, truncated_importance_sampling_ratio_min=0.6)
    d0 = dict(d, token_mask=torch.zeros_like(d["token_mask"]))
    x = lp.clone().requires_grad_()
    loss, metrics = ClippedPGLossFn(cfg)(x, d0, torch.tensor(0), torch.tensor(0))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(x.grad, torch.zeros_like(lp))
    assert metrics["probs_ratio_min"] == math.inf and metrics["probs_ratio_max"] == -math.inf
    # A -inf generation log-prob at a valid token: weight 0, and in the geometric mean the log-ratio 0.
    d1 = {k: v.clone() for k, v in d.items()}
    d1["generation_logprobs"][0, 2] = -math.inf
    m = d1["token_mask"][:, 1:] * d1["sample_mask"][:, None]
    x, y = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    got, _ = ClippedPGLossFn(cfg)(y, d1, d1["sample_mask"].sum(), m.sum())
    d2 = {k: v.clone() for k, v in d1.items()}
    d2["generation_logprobs"][0, 2] = d2["prev_logprobs"][0, 2]  # log-ratio 0 in the gate
    want, _ = oracle(cfg, x, d2, float(d2["sample_mask"].sum()), float(m.sum()))
    # the weight of that token is 0: remove its term (weight 1 in d2) from the oracle
    adv, prev = d2["advantages"][0, 2], d2["prev_logprobs"][0, 2]
    r = torch.exp(x[0, 1] - prev)
    term = torch.max(-adv * r, -adv * r.clamp(0.8, 1.2))
    g = torch.exp(((d2["prev_logprobs"][:, 1:] - d2["generation_logprobs"][:, 1:]) * m).sum(-1) / m.sum(-1))[0]
    want = want - term * float((g >= 0.6) & (g <= 1.5)) * float(m[0, 1]) / float(m.sum())
    got.backward()
    want.backward()
    assert torch.isfinite(got)
    torch.testing.assert_close(got, want.detach(), **TOL)
    torch.testing.assert_close(y.grad, x.grad, **TOL)


def test_config_errors_are_assertion_errors_and_ulorl_errors():
    for bad in (dict(use_cispo=True, ratio_clip_c=3.0), dict(sequence_level_importance_ratios=True),
                dict(use_importance_sampling_correction=True, truncated_importance_sampling_type="tis",
                     truncated_importance_sampling_ratio=1.0, truncated_importance_sampling_ratio_min=2.0),
                dict(truncated_importance_sampling_type="icepop", truncated_importance_sampling_ratio=2.0),
                dict(ratio_clip_c=1.0)):
        with pytest.raises(AssertionError) as e:
            ClippedPGLossFn(ClippedPGLossConfig(**bad))
        assert isinstance(e.value, ulorl.Error) and isinstance(e.value, ConfigError) and e.value.argument


def test_config_as_mapping_and_attributes():
    fn = ClippedPGLossFn({"token_level_loss": False, "use_kl_in_reward": True})
    assert fn.reference_policy_kl_penalty == 0 and fn.ratio_clip_min == 0.2
    assert fn.loss_type.value == "sequence_level" and fn.input_type.value == "logprob"
    assert fn.metric_normalizations["loss"].value == "sequences"
    assert fn.metric_normalizations["probs_ratio"].value == "tokens"
    assert "is_oob_ratio" not in fn.metric_normalizations


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_calculate_kl_with_importance_weights(gen, kind):
    lp = -torch.rand(3, 5, generator=gen, dtype=torch.float64) * 2
    ref = lp + torch.randn(3, 5, generator=gen, dtype=torch.float64) * 0.8
    g = lp + torch.randn(3, 5, generator=gen, dtype=torch.float64) * 0.3
    c = torch.arange(15, dtype=torch.float64).view(3, 5)
    for inc, outc in ((None, None), (0.5, None), (20.0, 0.2)):
        x, y = lp.clone().requires_grad_(), lp.clone().requires_grad_()
        r, s = ref.clone().requires_grad_(), ref.clone().requires_grad_()
        w = torch.exp(x - g)
        u = r - x
        if inc is not None:  # NeMo-RL clamps u: no gradient to either side where the clamp is active
            w = torch.where(u.abs() <= inc, w, w.detach())
            u = u.clamp(-inc, inc)
        want = w * kl_of(-u, torch.zeros_like(u), kind)
        if outc is not None:
            want = want.clamp(-outc, outc)
        got = calculate_kl(y, s, kind, inc, outc, importance_sampling_weights=torch.exp(y - g))
        (want * c).sum().backward()
        (got * c).sum().backward()
        torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(s.grad, r.grad, rtol=1e-12, atol=1e-14)  # NeMo-RL's reference gradient too
    plain = calculate_kl(logprobs=lp, logprobs_reference=ref, kl_type=kind, input_clamp_value=None,
                         output_clamp_value=None)
    torch.testing.assert_close(plain, kl_of(lp, ref, kind), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("ratio", ["ppo", "force_on_policy_ratio", "disable_ppo_ratio"])
@pytest.mark.parametrize("global_valid_toks", [None, 40.0])
def test_logged_ratios_operator_against_float64(gen, ratio, global_valid_toks):
    # torch.ops.ulorl.nemo_rl_logged_ratios with the whole options encoded (the truncation type included).
    o = ulorl._ulorl.NemoRLClippedPGLossOptions()
    o.ratio_clip_min, o.ratio_clip_max = 0.2, 0.28
    o.use_importance_sampling_correction, o.truncated_importance_sampling_type = True, "icepop"
    o.truncated_importance_sampling_ratio = 5.0
    if ratio != "ppo":
        setattr(o, ratio, True)
    lp = -torch.rand(3, 7, generator=gen, dtype=torch.float64) * 2
    prev = lp + torch.randn(3, 7, generator=gen, dtype=torch.float64) * 0.5
    mask = torch.rand(3, 7, generator=gen) < 0.7
    m = mask.double()
    if ratio == "force_on_policy_ratio":
        r = rc = torch.ones_like(lp)
    elif ratio == "disable_ppo_ratio":
        r = rc = lp
    else:
        r = torch.exp(lp - prev)
        rc = r.clamp(0.8, 1.28)
    gt = m.sum() if global_valid_toks is None else torch.tensor(global_valid_toks, dtype=torch.float64)
    want = torch.stack([(r * m).sum() / gt, (rc * m).sum() / gt])
    got = torch.ops.ulorl.nemo_rl_logged_ratios(lp, prev, mask, None, o.encoded, global_valid_toks)
    assert got.dtype == torch.float64 and ulorl._ulorl.record_fields("nemo_rl_ratio_metrics") == [
        "probs_ratio", "probs_ratio_clamped"]
    torch.testing.assert_close(got, want, rtol=1e-14, atol=0)
    packed = torch.ops.ulorl.nemo_rl_logged_ratios(lp.reshape(-1), prev.reshape(-1), mask.reshape(-1),
                                                   torch.tensor([0, 7, 14, 21]), o.encoded, global_valid_toks)
    assert torch.equal(packed, got)
    meta = torch.ops.ulorl.nemo_rl_logged_ratios(lp.to("meta"), prev.to("meta"), None, None, o.encoded, None)
    assert meta.device.type == "meta" and meta.shape == (2,)


def test_logged_ratios_operator_errors_name_the_argument(gen):
    o = ulorl._ulorl.NemoRLClippedPGLossOptions()
    lp = -torch.rand(2, 5, generator=gen, dtype=torch.float64)
    enc = o.encoded
    with pytest.raises(ValueError, match="argument 'options': has 3 values but an encoded "
                                         "nemo_rl_clipped_pg_loss_options has"):
        torch.ops.ulorl.nemo_rl_logged_ratios(lp, lp, None, None, enc[:3], None)
    names = ulorl._ulorl.record_fields("nemo_rl_clipped_pg_loss_options")
    bad = list(enc)
    bad[names.index("truncated_importance_sampling_type")] = 1.0
    bad[names.index("truncated_importance_sampling_type.value")] = 9.0
    with pytest.raises(ValueError, match="'truncated_importance_sampling_type'.*is no type NeMo-RL names"):
        torch.ops.ulorl.nemo_rl_logged_ratios(lp, lp, None, None, bad, None)
    with pytest.raises(ValueError, match="argument 'old_log_prob'"):
        torch.ops.ulorl.nemo_rl_logged_ratios(lp, lp[:, :4], None, None, enc, None)
