"""ulorl's logits gradients over the temperature range 1e-30 .. 1e308 against torch float64 autograd of
log_softmax(x / T), for float64, float32 and bfloat16 logits of several magnitudes.

The reference evaluates log_softmax(x / T) as log_softmax((x - max x) / T) with the shift detached: the
same function of x for every T (log_softmax is shift-invariant), whose float64 evaluation does not
carry z = x / T's rounding of |x / T| * 1e-16 (0.1 at T = 1e-15, x ~ 1). Every call either raises
ulorl.Error (the value scan refuses the batch) or matches the reference to the tolerance of its dtype,
normwise per row: max_j |g_j - want_j| <= tol * max_j scale_j, scale_j the sum of |terms| of want_j."""

import math

import pytest
import torch

import oracles
import ulorl

TAUS = sorted({10.0 ** e for e in range(-30, 309, 12)} |
              {1e-28, 1e-25, 1e-20, 1e-15, 1e-6, 0.6, 1.0, 1.7, 1e40, 1e45, 1e300, 1e308})
# dtype -> (largest |x| kept, gradient tolerance normwise)
# (the bfloat16 gradient is a bfloat16 tensor: 2^-9 relative)
DTYPES = {torch.float64: (1e300, 1e-9), torch.float32: (1e37, 1e-5), torch.bfloat16: (1e37, 1e-2)}


def reference(x, labels, tau, g_lp, g_ent):
    """d(sum g_lp log_prob + g_ent entropy) / dx in float64, and the scale of each element's terms."""
    z = x.detach().double().requires_grad_()
    shift = z.detach().amax(-1, keepdim=True)
    lsm = torch.log_softmax((z - shift) / tau, dim=-1)
    p = lsm.exp()
    lp = lsm.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ent = -(p * lsm).sum(-1)
    (g_lp * lp + g_ent * ent).sum().backward()
    with torch.no_grad():
        onehot = torch.zeros_like(p).scatter_(-1, labels.unsqueeze(-1), 1.0)
        scale = (g_lp.abs().unsqueeze(-1) * (onehot + p) +
                 g_ent.abs().unsqueeze(-1) * p * (lsm.abs() + ent.unsqueeze(-1))) / tau
    return z.grad, scale


def batch(gen, dtype, tau, cols):
    """Rows: scaled logits of order 1 on offsets (x = base + t u) and fixed magnitudes (x = s u)."""
    max_x, _ = DTYPES[dtype]
    t = min(tau, max_x / 64)
    rows = []
    for base in (0.0, 1.0, -1e4, 1e6):
        u = (torch.randn(cols, generator=gen, dtype=torch.float64) * 3).clamp(-8, 8)
        rows.append(base + t * u)
    for s in (1.0, 1e3):
        rows.append(s * torch.randn(cols, generator=gen, dtype=torch.float64))
    x = torch.stack(rows).to(dtype)
    n = x.shape[0]
    labels = torch.randint(0, cols, (n,), generator=gen)
    # The row gradients as ulorl's statistics dtype holds them (float32 unless the logits are float64).
    sdt = torch.float64 if dtype == torch.float64 else torch.float32
    g_lp = torch.randn(n, generator=gen, dtype=torch.float64).to(sdt).double()
    g_ent = torch.randn(n, generator=gen, dtype=torch.float64).to(sdt).double()
    return x, labels, g_lp, g_ent


def normwise(got, want, scale, floor):
    """Worst per-row max |got - want| (less `floor`, the output's subnormal spacing) over max scale."""
    err = ((got.double() - want).abs() - floor).clamp_min(0).amax(-1)
    smax = scale.amax(-1)
    return torch.where(err == 0, torch.zeros_like(err), err / smax).max().item()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_logprobs_from_logits_gradient_over_temperature(gen, dtype):
    _, tol = DTYPES[dtype]
    floor = 2 * {torch.float64: 2.0 ** -1074, torch.float32: 2.0 ** -149, torch.bfloat16: 2.0 ** -133}[dtype]
    checked = refused = 0
    for tau in TAUS:
        for cols in (37, 1100):
            x, labels, g_lp, g_ent = batch(gen, dtype, tau, cols)
            want, scale = reference(x, labels, tau, g_lp, g_ent)
            xg = x.clone().requires_grad_()
            try:
                lp, ent = ulorl.logprobs_from_logits(xg, labels, tau)
            except ulorl.Error as e:
                assert "logits" in str(e) or "temperature" in str(e)
                refused += 1
                continue
            sdt = lp.dtype
            (g_lp.to(sdt) * lp + g_ent.to(sdt) * ent).sum().backward()
            err = normwise(xg.grad, want, scale, floor)
            assert err <= tol, f"tau={tau} cols={cols}: normwise gradient error {err:.3g} > {tol}"
            checked += 1
    print(f"{dtype}: {checked} batches checked, {refused} refused")
    assert checked > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_policy_loss_from_logits_gradient_at_extreme_temperatures(gen, dtype):
    """The fused loss (float32 statistics for float32 logits) against the composition torch log_softmax ->
    the oracle's policy loss, in float64."""
    B, T, V = 2, 3, 9
    tol = 1e-9 if dtype == torch.float64 else 1e-4
    for tau in (1e-30, 1e-20, 1e-15, 1e-6, 1.0, 1e40 if dtype == torch.float32 else 1e300):
        max_x, _ = DTYPES[dtype]
        t = min(tau, max_x / 64)
        x = (1.0 + t * torch.randn(B * T, V, generator=gen, dtype=torch.float64) * 2).to(dtype)
        labels = torch.randint(0, V, (B * T,), generator=gen)
        old = (torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3 - 1.5).to(dtype)
        adv = torch.randn(B, T, generator=gen, dtype=torch.float64).to(dtype)
        mask = torch.ones(B, T, dtype=torch.bool)
        z = x.double().clone().requires_grad_()
        lsm = torch.log_softmax((z - z.detach().amax(-1, keepdim=True)) / tau, dim=-1)
        lp = lsm.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        want = oracles.policy_loss(lp.view(B, T), old.double(), adv.double(), mask, eps_low=0.2, eps_high=0.28)
        want.backward()
        y = x.detach().clone().requires_grad_()
        loss, _ = ulorl.policy_loss_from_logits(y, labels, old, adv, mask, temperature=tau, eps_high=0.28)
        loss.backward()
        scale = max(z.grad.abs().max().item(), torch.finfo(torch.float64).tiny)
        err = (y.grad.double() - z.grad).abs().max().item() / scale
        assert math.isfinite(err) and err <= tol, f"tau={tau}: normwise gradient error {err:.3g} > {tol}"
