"""ulorl.presets.trl's drop-ins called in TRL's positional / keyword form, against float64 oracles
written here from the formulas (TRL's GRPO objective family, its masks and metrics)."""

import math
import types
from collections import defaultdict

import pytest
import torch

import ulorl
from ulorl import _ulorl
import ulorl.presets.trl as trl

F64 = torch.float64


# ---- oracles ----------------------------------------------------------------------------------------
def log_softmax64(x):
    x = x.double()
    top = x.max(-1, keepdim=True).values
    return x - (top + (x - top).exp().sum(-1, keepdim=True).log())


def entropy64(x):
    lp = log_softmax64(x)
    return -(lp.exp() * lp).sum(-1)


def linear_quantile(values, q):
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (pos - lo) * (v[hi] - v[lo])


def high_entropy_oracle(ent, mask, threshold):
    valid = [float(e) for e, m in zip(ent.flatten(), mask.flatten()) if m]
    if not valid:
        return torch.zeros(ent.shape, dtype=torch.bool)
    cut = linear_quantile(valid, threshold)
    return torch.tensor([[bool(mask[b, t]) and float(ent[b, t]) >= cut for t in range(ent.shape[1])]
                         for b in range(ent.shape[0])])


def row_mean(x, m):
    return (x * m).sum(-1) / m.sum(-1).clamp(min=1.0)


def grpo_oracle(lp, old, adv, m, c, ref=None, samp=None, ent=None, ratio_is=None, coef=0.0):
    """TRL's GRPO family in float64: (loss, metrics). m is the float mask, adv [B]."""
    A = adv.unsqueeze(1)
    B, T = lp.shape
    w = row_mean(lp - old, m).unsqueeze(1)
    level = c["importance_sampling_level"]
    if level == "token":
        log_w = lp - old
    elif level == "sequence":
        log_w = row_mean(lp - old, m).unsqueeze(1)
    else:  # sequence_token: the row's ratio, each token's own gradient
        log_w = lp - lp.detach() + w.detach()
    r = log_w.exp()
    eps_lo, eps_hi, delta, lt = c["epsilon"], c["epsilon_high"], c.get("delta"), c["loss_type"]
    if lt == "cispo":
        tok = -torch.clamp(r, max=eps_hi).detach() * A * lp
    elif lt == "sapo":
        tau = torch.where(A > 0, torch.full_like(A, 1.0), torch.full_like(A, 1.05))
        tok = -torch.sigmoid(tau * (r - 1)) * 4 / tau * A
    elif lt == "vespo":
        s = (torch.clamp(lp - old, -20, 20) * m).sum(-1, keepdim=True)
        if ratio_is is not None:
            s = s + torch.clamp(ratio_is.log(), math.log(1e-8), 20).sum(-1, keepdim=True)
        lw = torch.clamp(s, math.log(1e-8), 20)
        k = torch.where(A >= 0, torch.full_like(A, 2.0), torch.full_like(A, 3.0))
        lam = torch.where(A >= 0, torch.full_like(A, 3.0), torch.full_like(A, 2.0))
        phi = (lam + k * lw - lam * lw.exp()).exp().detach()
        tok = -phi * A * lp
    else:
        r2 = torch.clamp(r, 1 - eps_lo, 1 + eps_hi)
        if delta is not None:
            r = torch.clamp(r, max=delta)
        tok = -torch.min(r * A, r2 * A)
    if c.get("off_policy_mask_threshold") is not None:
        d = row_mean((old if samp is None else samp) - lp.detach(), m).unsqueeze(1)
        tok = tok * ((A >= 0) | (d <= c["off_policy_mask_threshold"])).double()
    emask = None
    if c.get("top_entropy_quantile", 1.0) < 1.0:
        emask = high_entropy_oracle(ent, m, 1 - c["top_entropy_quantile"]).double()
        tok = tok * emask
    if ratio_is is not None and lt != "vespo":
        tok = tok * ratio_is
    beta = c.get("beta", 0.0)
    if beta:
        kl = (ref - lp).exp() - (ref - lp) - 1
        if c.get("use_bias_correction_kl"):
            kl = kl * log_w.exp()
        tok = tok + beta * kl
    ga = c.get("gradient_accumulation_steps", 1)
    if lt in ("grpo", "sapo"):
        loss = row_mean(tok, m).mean() / ga
    elif lt == "bnpo":
        loss = (tok * m).sum() / m.sum() / ga
    elif lt == "dr_grpo":
        loss = (tok * m).sum() / (B * c["max_completion_length"]) / ga
    elif lt == "luspo":
        loss = (tok * m.sum(1, keepdim=True)).mean() / ga
    else:
        loss = (tok * m).sum() / c["num_items_in_batch"]
    policy = loss.detach() * (1 if lt in ("cispo", "dapo", "vespo") else ga)
    if coef:
        eff = m if emask is None else m * emask
        if lt in ("cispo", "dapo", "vespo"):
            loss = loss - coef * (ent * eff).sum() / c["num_items_in_batch"]
        else:
            loss = loss - coef * (ent * eff).sum() / eff.sum() / ga
    met = {"entropy": float((ent * m).sum() / m.sum()), "policy_loss": float(policy)}
    if beta:
        met["kl"] = float(((ref - lp).exp() - (ref - lp) - 1).mul(log_w.exp() if c.get("use_bias_correction_kl") else 1)
                          .mul(m).sum() / m.sum())
    rr = log_w.detach().exp()
    if lt not in ("cispo", "sapo", "vespo"):
        if delta is not None:
            rr = torch.clamp(rr, max=delta)
        low = ((rr < 1 - eps_lo) & (A < 0)).double().expand(B, T if rr.shape[1] > 1 else 1)
        high = ((rr > 1 + eps_hi) & (A > 0)).double().expand(B, T if rr.shape[1] > 1 else 1)
        if rr.shape[1] == 1:
            met.update({"clip_ratio/low_mean": float(low.mean()), "clip_ratio/high_mean": float(high.mean()),
                        "clip_ratio/region_mean": float((low + high).mean()), "clip_ratio/low_min": float(low.min()),
                        "clip_ratio/high_max": float(high.max())})
        else:
            met.update({"clip_ratio/low_mean": float((low * m).sum() / m.sum()),
                        "clip_ratio/high_mean": float((high * m).sum() / m.sum()),
                        "clip_ratio/region_mean": float(((low + high) * m).sum() / m.sum()),
                        "clip_ratio/low_min": float(row_mean(low, m).min()),
                        "clip_ratio/high_max": float(row_mean(high, m).max())})
    elif lt == "cispo":
        flags = ((rr > eps_hi) & (A > 0)).double()
        met["cispo_clip_ratio"] = float(flags.mean() if rr.shape[1] == 1 else (flags * m).sum() / m.sum())
    elif lt == "vespo":
        met["vespo/phi_seq_mean"] = float(phi.mean())
    return loss, met


# ---- a trainer object with TRL's fields -------------------------------------------------------------
class Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x.reshape(-1)

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


class Trainer(trl.GRPOLossMixin):
    def __init__(self, c, lp, ent, coef=0.0, adaptive=False, target=0.5):
        self._lp, self._ent = lp, ent
        self.accelerator = Accelerator()
        self.model = types.SimpleNamespace(training=True)
        self.current_gradient_accumulation_steps = c.get("gradient_accumulation_steps", 1)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.loss_type, self.importance_sampling_level = c["loss_type"], c["importance_sampling_level"]
        self.beta = c.get("beta", 0.0)
        self.epsilon_low, self.epsilon_high = c["epsilon"], c["epsilon_high"]
        self.top_entropy_quantile = c.get("top_entropy_quantile", 1.0)
        self.off_policy_mask_threshold = c.get("off_policy_mask_threshold")
        self.use_vllm = self.vllm_importance_sampling_correction = c.get("vllm", False)
        self.max_completion_length = c.get("max_completion_length", 16)
        self.entropy_coef, self.use_adaptive_entropy = coef, adaptive
        self._entropy_bonus_enabled = coef != 0.0 or adaptive
        self._last_world_entropy = float("inf")
        self._entropy_window_stats = None
        self.aux_loss_enabled = False
        self.args = types.SimpleNamespace(
            delta=c.get("delta"), use_bias_correction_kl=c.get("use_bias_correction_kl", False),
            sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, vespo_k_pos=2.0, vespo_lambda_pos=3.0,
            vespo_k_neg=3.0, vespo_lambda_neg=2.0, entropy_target=target, entropy_coef_delta=0.005,
            entropy_coef_min=0.0, entropy_coef_max=1.0)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        return self._lp, self._ent, None


def batch(gen, B=5, T=6):
    lp = -torch.rand(B, T, generator=gen, dtype=F64) * 2 - 0.05
    old = lp + 0.4 * torch.randn(B, T, generator=gen, dtype=F64)
    ref = lp + 0.3 * torch.randn(B, T, generator=gen, dtype=F64)
    samp = old + 0.3 * torch.randn(B, T, generator=gen, dtype=F64)
    ent = torch.rand(B, T, generator=gen, dtype=F64) * 3
    mask = (torch.rand(B, T, generator=gen) < 0.75).long()  # TRL's completion_mask is int64
    mask[:, 0] = 1
    adv = torch.randn(B, generator=gen, dtype=F64)
    return lp, old, ref, samp, ent, mask, adv


def inputs_of(lp, old, ref, samp, mask, adv, ratio_is, c):
    B, T = lp.shape
    d = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
         "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask, "advantages": adv,
         "old_per_token_logps": old, "ref_per_token_logps": ref, "sampling_per_token_logps": samp,
         "num_items_in_batch": torch.tensor(float(c.get("num_items_in_batch", 1.0)))}
    if ratio_is is not None:
        d["importance_sampling_ratio"] = ratio_is
    return d


CASES = [
    dict(loss_type="grpo", importance_sampling_level="token", beta=0.04, gradient_accumulation_steps=2),
    dict(loss_type="bnpo", importance_sampling_level="token", delta=1.3, top_entropy_quantile=0.5),
    dict(loss_type="dr_grpo", importance_sampling_level="sequence", off_policy_mask_threshold=0.05,
         max_completion_length=9),
    dict(loss_type="dapo", importance_sampling_level="token", beta=0.04, use_bias_correction_kl=True, vllm=True,
         num_items_in_batch=23.0),
    dict(loss_type="dapo", importance_sampling_level="sequence", delta=1.5, num_items_in_batch=23.0),
    dict(loss_type="cispo", importance_sampling_level="token", epsilon_high=2.0, num_items_in_batch=19.0),
    dict(loss_type="sapo", importance_sampling_level="token", off_policy_mask_threshold=0.1),
    dict(loss_type="luspo", importance_sampling_level="sequence", beta=0.04),
    dict(loss_type="vespo", importance_sampling_level="token", vllm=True, num_items_in_batch=19.0),
    dict(loss_type="grpo", importance_sampling_level="sequence_token", delta=1.1, vllm=True),
    dict(loss_type="dapo", importance_sampling_level="sequence_token", delta=1.3, beta=0.04, num_items_in_batch=23.0),
    dict(loss_type="bnpo", importance_sampling_level="sequence_token", delta=1.02, epsilon_high=0.01),
    # the bias-corrected KL with TRL's undetached ratio: the token's (luspo) or the row's, whose
    # gradient reaches the row's tokens through the mean
    dict(loss_type="luspo", importance_sampling_level="token", beta=0.05, use_bias_correction_kl=True),
    dict(loss_type="luspo", importance_sampling_level="sequence", beta=0.04, use_bias_correction_kl=True,
         top_entropy_quantile=0.6),
    dict(loss_type="sapo", importance_sampling_level="sequence", beta=0.05, use_bias_correction_kl=True),
    dict(loss_type="cispo", importance_sampling_level="sequence", epsilon_high=0.9, beta=0.04,
         use_bias_correction_kl=True, num_items_in_batch=19.0),
    dict(loss_type="vespo", importance_sampling_level="sequence", beta=0.03, use_bias_correction_kl=True,
         num_items_in_batch=19.0),
    dict(loss_type="cispo", importance_sampling_level="token", epsilon_high=0.95, num_items_in_batch=19.0),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_grpo_loss_mixin_against_the_oracle(gen, case):
    c = dict(epsilon=0.2, epsilon_high=0.28)
    c.update(CASES[case])
    coef = 0.05 if c["importance_sampling_level"] != "sequence_token" and case % 2 == 0 else 0.0
    lp, old, ref, samp, ent, mask, adv = batch(gen)
    ratio_is = (0.5 + torch.rand(lp.shape, generator=gen, dtype=F64)) if c.get("vllm") else None
    x = lp.clone().requires_grad_()
    e = ent.clone().requires_grad_()
    tr = Trainer(c, x, e, coef=coef)
    loss = tr._compute_loss(None, inputs_of(lp, old, ref, samp, mask, adv, ratio_is, c))
    loss.backward()
    y = lp.clone().requires_grad_()
    f = ent.clone().requires_grad_()
    want, met = grpo_oracle(y, old, adv, mask.double(), c, ref=ref, samp=samp, ent=f, ratio_is=ratio_is, coef=coef)
    want.backward()
    torch.testing.assert_close(loss.detach(), want.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-10, atol=1e-13)
    if coef:
        torch.testing.assert_close(e.grad, f.grad, rtol=1e-10, atol=1e-13)
    logged = {k: v[-1] for k, v in tr._metrics["train"].items()}
    if not coef:
        met.pop("policy_loss")
    else:
        met["entropy_coef"] = coef
    assert set(logged) == set(met)
    for k in met:
        assert logged[k] == pytest.approx(met[k], rel=1e-12, abs=1e-14), k


def test_adaptive_entropy_gate_and_update(gen):
    c = dict(loss_type="grpo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.2)
    lp, old, ref, samp, ent, mask, adv = batch(gen)
    tr = Trainer(c, lp.clone().requires_grad_(), ent.clone().requires_grad_(), coef=0.0, adaptive=True, target=5.0)
    h = float((ent * mask).sum() / mask.sum())
    steps = [0.0]
    for _ in range(3):
        loss = tr._compute_loss(None, inputs_of(lp, old, ref, samp, mask, adv, None, c))
        want, _ = grpo_oracle(lp, old, adv, mask.double(), c, ent=ent, coef=steps[-1])
        # before the first update the bonus is off (TRL's last entropy is +inf); then the coefficient
        # applies while the last entropy is <= the target, and grows by entropy_coef_delta per step
        assert float(loss) == pytest.approx(float(want), rel=1e-12, abs=1e-14)
        steps.append(steps[-1] + 0.005)
        assert tr.entropy_coef == pytest.approx(steps[-1], abs=1e-15)
        assert tr._last_world_entropy == pytest.approx(h, rel=1e-12)
    assert tr._metrics["train"]["entropy_coef"] == pytest.approx(steps[1:], abs=1e-15)


@pytest.mark.parametrize("target,want", [(5.0, [1.0, 1.0, 1.0]), (0.0, [1.495, 1.49, 1.485])])
def test_adaptive_entropy_from_a_coefficient_above_its_maximum(gen, target, want):
    # TRL accepts entropy_coef outside [entropy_coef_min, entropy_coef_max]: a raise is bounded by the
    # maximum (min(c + delta, max)), a lowering only by the minimum (max(c - delta, min)).
    c = dict(loss_type="dapo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.2,
             num_items_in_batch=17.0)
    lp, old, ref, samp, ent, mask, adv = batch(gen)
    tr = Trainer(c, lp.clone().requires_grad_(), ent.clone().requires_grad_(), coef=1.5, adaptive=True, target=target)
    applied = 0.0  # the first step's bonus is off (the last entropy is +inf)
    for step in range(3):
        loss = tr._compute_loss(None, inputs_of(lp, old, ref, samp, mask, adv, None, c))
        ref_loss, _ = grpo_oracle(lp, old, adv, mask.double(), c, ent=ent, coef=applied)
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-12, abs=1e-14)
        assert tr.entropy_coef == pytest.approx(want[step], abs=1e-14)
        applied = tr.entropy_coef if target > 0.0 else 0.0


# ---- trl.trainer.utils ------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,k", [((3, 4, 29), None), ((3, 4, 29), 3), ((7, 13), None), ((2, 2, 3, 11), 2)])
def test_selective_log_softmax(gen, shape, k):
    x = torch.randn(*shape, generator=gen, dtype=F64) * 3
    index = torch.randint(0, shape[-1], shape[:-1] + ((k,) if k else ()), generator=gen)
    a = x.clone().requires_grad_()
    got = trl.selective_log_softmax(a, index)
    b = x.clone().requires_grad_()
    full = log_softmax64(b)
    want = full.gather(-1, index if k else index.unsqueeze(-1))
    want = want if k else want.squeeze(-1)
    assert got.shape == index.shape and got.dtype == F64
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    w = torch.randn(index.shape, generator=gen, dtype=F64)
    (got * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("dtype,ulp", [(torch.float32, 2.0**-23), (torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)])
def test_selective_log_softmax_and_entropy_keep_the_logits_dtype(gen, dtype, ulp):
    x = torch.randn(4, 5, 64, generator=gen).to(dtype)
    index = torch.randint(0, 64, (4, 5), generator=gen)
    lp = trl.selective_log_softmax(x, index)
    h = trl.entropy_from_logits(x)
    assert lp.dtype == dtype and h.dtype == dtype and lp.shape == (4, 5) and h.shape == (4, 5)
    want_lp = log_softmax64(x).gather(-1, index.unsqueeze(-1)).squeeze(-1)
    want_h = entropy64(x)
    # float32: rounded once (within one unit of the last place); 16-bit: torch's rounding steps (the
    # row's log-sum rounded first: two units; the entropy a sum of 64 rounded products: eight)
    h_units = 2 if dtype == torch.float32 else 8
    assert ((lp.double() - want_lp).abs() <= 2 * ulp * want_lp.abs() + 1e-6).all()
    assert ((h.double() - want_h).abs() <= h_units * ulp * want_h.abs() + 1e-6).all()


def _torch_cpu_rounding(x, index):
    """TRL's 16-bit values on the CPU, from torch's float operations: log_softmax with the row's sum
    and its logarithm rounded to the dtype first, and -(exp(lp) * lp).sum(-1) with each product
    rounded (a -inf logit contributes 0)."""
    dt = x.dtype
    r = lambda v: v.to(dt).float()  # noqa: E731
    xf = x.float()
    m = xf.max(-1, keepdim=True).values
    lse = r(torch.log(r(torch.exp(xf - m).double().sum(-1, keepdim=True).float())))
    lp = r((xf - m) - lse)
    prod = torch.where(torch.isinf(lp), torch.zeros_like(lp), r(r(torch.exp(lp)) * lp))
    return lp.gather(-1, index).to(dt), (-prod.double().sum(-1)).float().to(dt)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_logits_give_torchs_cpu_values(gen, dtype):
    x = (torch.randn(48, 300, generator=gen) * 3).to(dtype)
    x[5, :40] = float("-inf")  # masked vocabulary
    index = torch.randint(40, 300, (48, 3), generator=gen)
    want_lp, want_h = _torch_cpu_rounding(x, index)
    lp, h = trl.selective_log_softmax(x, index), trl.entropy_from_logits(x)
    assert lp.dtype == dtype and h.dtype == dtype
    assert torch.equal(lp, want_lp) and torch.equal(h, want_h)
    assert torch.equal(trl.selective_log_softmax(x, index[:, 0]), want_lp[:, 0])
    try:  # torch's own kernel, where this torch has a CPU log_softmax for the dtype
        own = x.log_softmax(-1)
    except RuntimeError:
        own = None
    if own is not None:
        assert torch.equal(lp, own.gather(-1, index))
        finite = ~torch.isinf(own).any(-1)
        assert torch.equal(h[finite], (-(torch.exp(own) * own).sum(-1))[finite])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_values_carry_the_exact_gradient(gen, dtype):
    x = torch.randn(6, 40, generator=gen).to(dtype)
    index = torch.randint(0, 40, (6, 2), generator=gen)
    w = torch.randn(6, 2, generator=gen)
    a = x.clone().requires_grad_()
    (trl.selective_log_softmax(a, index).float() * w).sum().backward()
    b = x.double().requires_grad_()
    (log_softmax64(b).gather(-1, index) * w.double()).sum().backward()
    torch.testing.assert_close(a.grad.double(), b.grad, rtol=2.0**-6, atol=2.0**-8)
    a2 = x.clone().requires_grad_()
    trl.entropy_from_logits(a2).float().sum().backward()
    b2 = x.double().requires_grad_()
    entropy64(b2).sum().backward()
    torch.testing.assert_close(a2.grad.double(), b2.grad, rtol=2.0**-6, atol=2.0**-7)


def test_torch_rounding_rejects_what_it_cannot_compute():
    with pytest.raises(ulorl.Error, match="argument 'labels'"):
        _ulorl._logits_statistics_torch_rounding(torch.zeros(2, 4, dtype=torch.bfloat16), torch.tensor([[0], [4]]))
    with pytest.raises(ulorl.Error, match="argument 'logits'.*must be finite or -inf"):
        _ulorl._logits_statistics_torch_rounding(torch.tensor([[0.0, float("nan")]], dtype=torch.bfloat16),
                                            torch.tensor([[0]]))
    with pytest.raises(ulorl.Error, match="row has no finite logit"):
        _ulorl._logits_statistics_torch_rounding(torch.full((1, 3), float("-inf"), dtype=torch.float16), torch.tensor([[0]]))
    with pytest.raises(ulorl.Error, match="must be bfloat16 or float16"):
        _ulorl._logits_statistics_torch_rounding(torch.zeros(2, 4), torch.tensor([[0], [1]]))


@pytest.mark.parametrize("shape", [(17,), (3, 17), (2, 3, 17)])
def test_entropy_from_logits(gen, shape):
    x = torch.randn(*shape, generator=gen, dtype=F64) * 2
    a = x.clone().requires_grad_()
    got = trl.entropy_from_logits(a, 4)
    b = x.clone().requires_grad_()
    want = entropy64(b)
    assert got.shape == shape[:-1] and got.dtype == F64
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    w = torch.randn(shape[:-1], generator=gen, dtype=F64)
    (got * w).sum().backward()
    (want * w).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-13)


def test_entropy_from_logits_chunk_size_must_be_positive():
    with pytest.raises(ulorl.Error, match="chunk_size"):
        trl.entropy_from_logits(torch.zeros(2, 3), chunk_size=0)


# ---- GRPOTrainer's masks ----------------------------------------------------------------------------
@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.int64])
def test_get_off_policy_mask(gen, mask_dtype):
    B, T = 7, 5
    lp = -torch.rand(B, T, generator=gen) * 2
    samp = lp + 0.5 * torch.randn(B, T, generator=gen)
    adv = torch.randn(B, 1, generator=gen)
    adv[0] = 0.0
    mask = (torch.rand(B, T, generator=gen) < 0.7).to(mask_dtype)
    for threshold in (0.0, 0.1, 0.4):
        got = trl.get_off_policy_mask(adv, lp, samp, mask, threshold)
        m = mask.double()
        d = ((samp.double() - lp.double()) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
        want = [[1 if float(adv[b]) >= 0 or float(d[b]) <= threshold else 0] for b in range(B)]
        assert got.dtype == mask_dtype and got.shape == (B, 1)
        assert got.tolist() == want


def test_get_off_policy_mask_rejects_a_non_binary_mask():
    with pytest.raises(ulorl.Error, match="mask"):
        trl.get_off_policy_mask(torch.ones(2, 1), torch.zeros(2, 3), torch.zeros(2, 3),
                                torch.tensor([[1, 2, 0], [1, 1, 1]]), 0.5)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.5, 0.8, 1.0])
def test_get_high_entropy_mask(gen, threshold):
    ent = torch.rand(4, 6, generator=gen)
    ent[1, 2] = ent[3, 4]  # a tie
    mask = (torch.rand(4, 6, generator=gen) < 0.7).long()
    got = trl.get_high_entropy_mask(None, ent, mask, threshold)
    assert got.dtype == torch.bool
    assert torch.equal(got, high_entropy_oracle(ent, mask, threshold))
    assert not trl.get_high_entropy_mask(None, ent, torch.zeros_like(mask), threshold).any()


def test_get_high_entropy_mask_takes_the_quantile_over_every_process(gen):
    ent = torch.rand(3, 4, generator=gen)
    mask = torch.ones(3, 4, dtype=torch.long)
    other = torch.rand(5, generator=gen) + 1.0  # another process's valid entropies (all larger)

    class TwoProcesses(Accelerator):
        num_processes = 2

        def pad_across_processes(self, x, dim=0, pad_index=0):  # padded to the longer process's length
            return torch.cat([x, torch.full((1,), pad_index, dtype=x.dtype)])

        def gather(self, x):
            return torch.cat([x, other.to(x.dtype)])

    got = trl.get_high_entropy_mask(types.SimpleNamespace(accelerator=TwoProcesses()), ent, mask, 0.5)
    cut = linear_quantile([float(v) for v in ent.flatten()] + [float(v) for v in other], 0.5)
    assert torch.equal(got, ent >= cut)
