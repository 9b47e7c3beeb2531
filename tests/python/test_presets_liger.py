"""ulorl.presets.liger: Liger-Kernel's LigerFusedLinearGRPOLoss / LigerFusedLinearGRPOFunction called in
Liger's positional form, against a float64 oracle of the GRPO-family losses from hidden states written
here with plain torch ops (softmax of the linear head, ratio, surrogate, normaliser), differentiated by
torch's autograd: loss, gradients to hidden / weight / bias and the (kl, clip_ratio) metrics."""

import math

import pytest
import torch

import ulorl
from ulorl.presets.liger import LigerFusedLinearGRPOFunction, LigerFusedLinearGRPOLoss, liger_fused_linear_grpo

B, T, H, V = 3, 6, 8, 20


def oracle(x, w, b, ids, mask, adv, *, old=None, ref=None, q=None, loss_type="dapo", level="token", beta=0.0,
           eps_low=0.2, eps_high=0.2, delta=None, temp=1.0, bc=False, mcl=None, tau=(1.0, 1.05), nib=None,
           vespo=(2.0, 3.0, 3.0, 2.0)):
    """Float64 loss and metrics; x, w, b are float64 leaves."""
    z = x @ w.t() + (0.0 if b is None else b)
    logp = torch.log_softmax(z / temp, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    m = mask.double()
    n = m.sum(-1)
    N = m.sum()
    a = adv.double().unsqueeze(1)
    old = logp.detach() if old is None else old.double()
    x_log = logp - old
    if q is not None and q.dim() == 1:
        q = q.unsqueeze(1)
    q = None if q is None else q.double()
    if level == "sequence":
        x_log = ((x_log * m).sum(-1) / n.clamp(min=1)).unsqueeze(1)
    r = torch.exp(x_log)
    low = torch.zeros_like(r, dtype=torch.bool)
    high = torch.zeros_like(r, dtype=torch.bool)
    if loss_type == "cispo":
        pg = -torch.clamp(r, max=eps_high).detach() * a * logp
        high = r > eps_high
    elif loss_type == "sapo":
        t = torch.where(a > 0, torch.full_like(a, tau[0]), torch.full_like(a, tau[1]))
        pg = -torch.sigmoid(t * (r - 1)) * 4 / t * a
    elif loss_type == "vespo":
        kp, lp_, kn, ln = vespo
        s = (torch.clamp(logp - old, -20, 20) * m).sum(-1)
        if q is not None:
            s = s + torch.clamp(torch.log(q), math.log(1e-8), 20).sum(-1)
        lw = torch.clamp(s, math.log(1e-8), 20)
        pos = adv.double() >= 0
        k = torch.where(pos, torch.full_like(lw, kp), torch.full_like(lw, kn))
        lam = torch.where(pos, torch.full_like(lw, lp_), torch.full_like(lw, ln)).clamp(min=1e-4)
        phi = torch.nan_to_num(torch.exp(lam + k * lw - lam * torch.exp(lw)), nan=0.0, posinf=0.0, neginf=0.0)
        pg = -phi.detach().unsqueeze(1) * a * logp
    else:
        clipped = torch.clamp(r, 1 - eps_low, 1 + eps_high)
        low, high = r < 1 - eps_low, r > 1 + eps_high
        capped = r if delta is None else torch.clamp(r, max=delta)
        pg = -torch.min(capped * a, clipped * a)
    if q is not None and loss_type != "vespo":
        pg = pg * q
    kl = None
    if beta != 0.0:
        ref = logp.detach() if ref is None else ref.double()
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        if bc:
            kl = kl * r
        pg = pg + beta * kl
    if loss_type in ("grpo", "sapo"):
        loss = ((pg * m).sum(-1) / n.clamp(min=1)).sum() / B
    elif loss_type == "bnpo":
        loss = (pg * m).sum() / N.clamp(min=1)
    elif loss_type == "dr_grpo":
        loss = (pg * m).sum() / (B * mcl)
    elif loss_type == "luspo":
        loss = (pg * n.unsqueeze(1)).mean()
    else:
        loss = (pg * m).sum() / max(float(N) if nib is None else nib, 1.0)
    flags = ((low & (a < 0)) | (high & (a > 0))).double().expand(B, T)
    metrics = [] if beta == 0.0 else [(kl * m).sum() / N.clamp(min=1)]
    metrics.append((flags * m).sum() / N.clamp(min=1))
    return loss, metrics


def batch(seed, bias=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    w = torch.randn(V, H, generator=g, dtype=torch.float64) * 0.6
    b = torch.randn(V, generator=g, dtype=torch.float64) if bias else None
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.ones(B, T)
    mask[0, 4:] = 0
    mask[2, 1] = 0
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[0], adv[1] = -adv[0].abs(), adv[1].abs()
    with torch.no_grad():
        lp = torch.log_softmax(x @ w.t() + (0.0 if b is None else b), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    old = (lp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3).float()
    ref = (lp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.1).float()
    q = torch.rand(B, T, generator=g) * 0.9 + 0.1
    x, w = x.to(dtype).double(), w.to(dtype).double()  # the values the drop-in sees
    b = None if b is None else b.to(dtype).double()
    return x, w, b, ids, mask, adv.to(dtype).double(), old, ref, q


def compare(out, expected, inputs64, inputs, rtol=2e-5, atol=2e-6):
    loss, metrics = out
    loss_e, metrics_e = expected
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert len(metrics) == len(metrics_e)
    for got, want in zip(metrics, metrics_e):
        assert got.dtype == torch.float32 and got.dim() == 0
        assert float(got) == pytest.approx(float(want), rel=rtol, abs=atol)
    assert float(loss) == pytest.approx(float(loss_e), rel=rtol, abs=atol)
    grads_e = torch.autograd.grad(loss_e, [t for t in inputs64 if t is not None])
    loss.backward()
    for t, ge in zip([t for t in inputs if t is not None], grads_e):
        assert t.grad.dtype == t.dtype
        torch.testing.assert_close(t.grad.double(), ge, rtol=rtol * 10, atol=atol * 10)


def leaves(x, w, b, dtype=torch.float32):
    return [None if t is None else t.detach().to(dtype).requires_grad_(True) for t in (x, w, b)]


CASES = [
    dict(loss_type="dapo"),
    dict(loss_type="dapo", beta=0.04, ref="logps", nib=40.0),
    dict(loss_type="bnpo", beta=0.1, ref="logps", old=None, temp=0.7),
    dict(loss_type="grpo", level="sequence", beta=0.1, ref="logps", bc=True, delta=1.5),
    dict(loss_type="grpo", q="BT", delta=2.0, eps_high=0.28),
    dict(loss_type="dr_grpo", mcl=T, beta=0.04, ref="logps", bc=True),
    dict(loss_type="dr_grpo", level="sequence", mcl=10, q="B"),
    dict(loss_type="bnpo", level="sequence", q="B1", temp=2.0),
    dict(loss_type="cispo", eps_high=0.2, beta=0.1, ref="logps", bc=True),
    dict(loss_type="cispo", eps_high=5.0, q="BT"),
    dict(loss_type="sapo", beta=0.04, ref="logps", q="B"),
    dict(loss_type="luspo", level="sequence", beta=0.1, ref="logps"),
    dict(loss_type="luspo", level="sequence", q="BT"),
    dict(loss_type="luspo", level="token", q="B1"),
    dict(loss_type="vespo", beta=0.04, ref="logps"),
    dict(loss_type="vespo", q="B"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_function_apply_matches_oracle(case):
    x, w, b, ids, mask, adv, old, ref, q = batch(7)
    c = dict(case)
    old_t = c.pop("old", old)
    ref_t = ref if c.pop("ref", None) == "logps" else None
    qk = c.pop("q", None)
    q_t = {None: None, "BT": q, "B1": q[:, :1], "B": q[:, 0]}[qk]
    x64, w64, b64 = (None if t is None else t.clone().requires_grad_(True) for t in (x, w, b))
    expected = oracle(x64, w64, b64, ids, mask, adv, old=old_t, ref=ref_t, q=q_t, **c)
    xi, wi, bi = leaves(x, w, b)
    beta = c.get("beta", 0.0)
    out = LigerFusedLinearGRPOFunction.apply(
        xi, wi, ids, mask, adv.float(), bi, ref_t, old_t, None, None, None, beta, c.get("eps_low", 0.2),
        c.get("eps_high", 0.2), c["loss_type"], c.get("mcl"), c.get("level", "token"), 1.0, 1.05,
        c.get("temp", 1.0), True, ref_t is not None, 1, q_t, c.get("delta"), c.get("bc", False), 2.0, 3.0, 3.0, 2.0,
        c.get("nib"))
    compare(out, expected, [x64, w64, b64], [xi, wi, bi])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_module_forward_with_reference_head(dtype):
    """The module in Liger's positional form, reference log-probs from ref_input / ref_weight /
    ref_bias, on-policy (old None); bfloat16 leaves get bfloat16 gradients, the loss stays float32."""
    x, w, b, ids, mask, adv, _, _, _ = batch(11, dtype=dtype)
    g = torch.Generator().manual_seed(3)
    ref_x = (x + torch.randn(B, T, H, generator=g, dtype=torch.float64) * 0.05).to(dtype)
    ref_w = (w + torch.randn(V, H, generator=g, dtype=torch.float64) * 0.05).to(dtype)
    ref_b = (b + torch.randn(V, generator=g, dtype=torch.float64) * 0.05).to(dtype)
    with torch.no_grad():
        z = (ref_x.double() @ ref_w.double().t() + ref_b.double()) / 0.8
        ref_lp = torch.log_softmax(z, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    x64, w64, b64 = (t.clone().requires_grad_(True) for t in (x, w, b))
    expected = oracle(x64, w64, b64, ids, mask, adv, ref=ref_lp, loss_type="grpo", beta=0.1, temp=0.8)
    xi, wi, bi = leaves(x, w, b, dtype)
    module = LigerFusedLinearGRPOLoss(beta=0.1, loss_type="grpo", temperature=0.8)
    out = module(xi, wi, ids, mask, adv.to(dtype), bi, None, None, ref_x, ref_w, ref_b)
    tol = dict(rtol=2e-5, atol=2e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    compare(out, expected, [x64, w64, b64], [xi, wi, bi], **tol)


def test_grad_output_scales_and_functional_alias():
    x, w, b, ids, mask, adv, old, ref, _ = batch(5, bias=False)
    args = (ids, mask, adv.float(), None, ref, old, None, None, None, 0.04, 0.2, 0.28, "dapo")
    xa, wa, _ = leaves(x, w, None)
    la, ma = liger_fused_linear_grpo(xa, wa, *args)
    xb, wb, _ = leaves(x, w, None)
    lb, mb = LigerFusedLinearGRPOFunction.apply(xb, wb, *args)
    (3.0 * la).backward()
    lb.backward()
    assert float(la) == float(lb) and [float(v) for v in ma] == [float(v) for v in mb]
    torch.testing.assert_close(xa.grad, 3.0 * xb.grad)
    torch.testing.assert_close(wa.grad, 3.0 * wb.grad)


def test_errors():
    x, w, b, ids, mask, adv, old, _, _ = batch(1)
    xi, wi, bi = leaves(x, w, b)
    for lt in ("cispo", "sapo", "vespo"):
        with pytest.raises(ValueError, match="Sequence-level importance sampling is not supported"):
            LigerFusedLinearGRPOLoss(loss_type=lt, importance_sampling_level="sequence", use_ref_model=False)(
                xi, wi, ids, mask, adv.float())
    with pytest.raises(ulorl.Error, match="max_completion_length"):
        LigerFusedLinearGRPOLoss(loss_type="dr_grpo", use_ref_model=False)(xi, wi, ids, mask, adv.float())
    with pytest.raises(ulorl.Error, match="loss_type"):
        LigerFusedLinearGRPOLoss(loss_type="ppo", use_ref_model=False)(xi, wi, ids, mask, adv.float())
    with pytest.raises(ulorl.Error, match="ref_per_token_logps"):
        LigerFusedLinearGRPOLoss()(xi, wi, ids, mask, adv.float())
    with pytest.raises(ulorl.Error, match="vllm_is_ratio"):
        LigerFusedLinearGRPOLoss(use_ref_model=False)(xi, wi, ids, mask, adv.float(), vllm_is_ratio=torch.ones(B, 2))
    with pytest.raises(ulorl.Error, match="sapo_temperature_neg"):
        LigerFusedLinearGRPOLoss(sapo_temperature_neg=0.0)
