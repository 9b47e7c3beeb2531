"""torch.ops.ulorl on CUDA tensors against the same operators on the CPU: the extension's device kernels
(ulorl/adapters/torch/ops_cuda.hpp: the policy loss, the logits statistics and their backward, the loss
from logits, the linear head) for several objectives, masks, dtypes and both layouts, and the host path
of the operators without one (run_on_host: outputs on the device, the CPU's values, the error with
set_host_fallback(False)); errors named as on the CPU. Runs where torch has a GPU (the device kernels'
tests where the extension was built with CUDA, ulorl._ulorl.cuda_kernels); skipped elsewhere."""

import pytest
import torch

import ulorl
from ulorl import _ulorl

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
kernels = pytest.mark.skipif(not _ulorl.cuda_kernels, reason="needs the extension's CUDA kernels (cuda_kernels)")


def _batch(b=6, t=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    lp = old + (torch.rand(b, t, generator=g) - 0.5) * 0.6
    return (lp, old, torch.randn(b, t, generator=g), torch.rand(b, t, generator=g) > 0.2,
            old + (torch.rand(b, t, generator=g) - 0.5) * 0.2, torch.rand(b, t, generator=g) * 2)


@kernels
@pytest.mark.parametrize("options", [dict(eps_high=0.28, kl_coef=0.05, entropy_coef=0.01),
                                     dict(objective="gspo", agg="seq_mean_token_mean"),
                                     dict(objective="cispo", kl_coef=0.02, kl_estimator="k1")])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_cuda_equals_cpu(options, packed, mask_dtype):
    options = dict(options)
    agg = options.pop("agg", "token_mean")
    lp, old, adv, mask, ref, ent = _batch()
    norm = ulorl.global_normalizer(agg, ulorl.count_batch(mask))
    mask = mask.to(mask_dtype)
    offsets = None
    if packed:
        lp, old, adv, mask, ref, ent = (x.reshape(-1) for x in (lp, old, adv, mask, ref, ent))
        offsets = torch.arange(0, 7 * 37, 37)
    out = {}
    for device in ("cpu", "cuda"):
        x = [t.to(device) for t in (lp, old, adv, mask, ref, ent)]
        x[0].requires_grad_()
        x[5].requires_grad_()
        loss, metrics = ulorl.policy_loss(x[0], x[1], x[2], x[3], ref_log_prob=x[4], entropy=x[5], normalizer=norm,
                                          offsets=None if offsets is None else offsets.to(device), **options)
        (loss * 2).backward()
        assert loss.device.type == device
        out[device] = (loss.item(), metrics, x[0].grad.cpu(), x[5].grad.cpu())
    (lc, mc, gc, ec), (lg, mg, gg, eg) = out["cpu"], out["cuda"]
    assert lg == pytest.approx(lc, rel=1e-5, abs=1e-7)
    torch.testing.assert_close(gg, gc, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(eg, ec, rtol=1e-5, atol=1e-8)
    for k in ("tokens", "sequences", "rows", "clipped"):
        assert mg[k] == mc[k], k


@kernels
@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.int32, torch.bfloat16])
def test_cuda_masks_of_other_dtypes_are_widened_on_the_device(mask_dtype):
    lp, old, adv, mask, ref, _ = _batch(4, 11, 7)
    norm = ulorl.global_normalizer("token_mean", ulorl.count_batch(mask))
    want, _ = ulorl.policy_loss(lp.cuda(), old.cuda(), adv.cuda(), mask.cuda(), normalizer=norm)
    got, _ = ulorl.policy_loss(lp.cuda(), old.cuda(), adv.cuda(), mask.to(mask_dtype).cuda(), normalizer=norm)
    assert torch.equal(got, want)
    bad = mask.to(mask_dtype)
    bad[2, 3] = 2
    with pytest.raises(ulorl.Error, match=r"argument 'mask'\[25\] = 2: mask values must be 0 or 1"):
        ulorl.policy_loss(lp.cuda(), old.cuda(), adv.cuda(), bad.cuda(), normalizer=norm)


@kernels
def test_cuda_errors_name_the_argument():
    lp, old, adv, mask, _, _ = _batch(3, 8)
    norm = ulorl.Normalizer("token_mean", 10.0)
    bad = lp.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ulorl.Error, match=r"argument 'log_prob'\[10\] = nan: must be finite \(row 1, token 2\)"):
        ulorl.policy_loss(bad.cuda(), old.cuda(), adv.cuda(), mask.cuda(), normalizer=norm)
    with pytest.raises(ulorl.Error, match="argument 'mask': is on device cpu but 'log_prob' is on cuda:0"):
        ulorl.policy_loss(lp.cuda(), old.cuda(), adv.cuda(), mask, normalizer=norm)
    previous = ulorl.set_host_fallback(False)
    try:
        with pytest.raises(ulorl.Error, match="argument 'log_prob': has dtype Double"):
            ulorl.policy_loss(lp.double().cuda(), old.double().cuda(), adv.double().cuda(), mask.cuda(),
                              normalizer=norm)
        with pytest.raises(ulorl.Error, match="argument 'logits': has dtype Double"):
            ulorl.logprobs_from_logits(torch.randn(3, 5, device="cuda").double(),
                                       torch.zeros(3, dtype=torch.long, device="cuda"))
    finally:
        ulorl.set_host_fallback(previous)
    with pytest.raises(ulorl.Error, match="argument 'labels'"):
        ulorl.logprobs_from_logits(torch.randn(3, 5, device="cuda"), torch.full((3,), 5, device="cuda"))


@kernels
def test_what_the_device_kernels_do_not_take_runs_on_the_host():
    lp, old, adv, mask, _, _ = _batch(3, 8)
    norm = ulorl.Normalizer("token_mean", 10.0)
    args = [t.double() for t in (lp, old, adv)] + [mask]
    cpu = ulorl.policy_loss(*args, normalizer=norm)[0]
    dev = ulorl.policy_loss(*[t.cuda() for t in args], normalizer=norm)[0]
    assert dev.device.type == "cuda" and dev.dtype == torch.float64 and dev.item() == cpu.item()
    z, y = torch.randn(4, 9, dtype=torch.float64), torch.randint(0, 9, (4,))
    x = z.cuda().requires_grad_()
    lp_dev, _ = ulorl.logprobs_from_logits(x, y.cuda())
    lp_dev.sum().backward()
    w = z.clone().requires_grad_()
    lp_cpu, _ = ulorl.logprobs_from_logits(w, y)
    lp_cpu.sum().backward()
    assert torch.equal(lp_dev.cpu(), lp_cpu.detach()) and torch.equal(x.grad.cpu(), w.grad)


@kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("labels_dtype", [torch.int64, torch.int32])
def test_logits_statistics_cuda_equals_cpu(dtype, labels_dtype):
    g = torch.Generator().manual_seed(5)
    z = (torch.randn(7, 3001, generator=g) * 4).to(dtype)
    y = torch.randint(0, 3001, (7,), generator=g).to(labels_dtype)
    glp, gent = torch.randn(7, generator=g), torch.randn(7, generator=g)
    out = {}
    for device in ("cpu", "cuda"):
        x = z.to(device).requires_grad_()
        lp, ent = ulorl.logprobs_from_logits(x, y.to(device), 0.8)
        assert lp.device.type == device and lp.dtype == dtype and ent.dtype == dtype
        torch.autograd.backward([lp, ent], [glp.to(device, dtype), gent.to(device, dtype)])
        out[device] = [t.detach().cpu().double() for t in (lp, ent, x.grad)]
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    for a, b in zip(out["cpu"], out["cuda"]):
        torch.testing.assert_close(b, a, **tol)


@kernels
@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_policy_loss_from_logits_cuda_equals_cpu(entropy_coef, dtype):
    lp, old, adv, mask, ref, _ = _batch(3, 11, 2)
    g = torch.Generator().manual_seed(2)
    z = torch.randn(33, 517, generator=g).to(dtype)
    y = torch.randint(0, 517, (33,), generator=g)
    norm = ulorl.global_normalizer("token_mean", ulorl.count_batch(mask))
    out = {}
    for device in ("cpu", "cuda"):
        x = z.to(device).requires_grad_()
        loss, metrics = ulorl.policy_loss_from_logits(
            x, y.to(device), old.to(device), adv.to(device), mask.to(device), ref_log_prob=ref.to(device),
            normalizer=norm, eps_high=0.28, kl_coef=0.05, entropy_coef=entropy_coef)
        (loss * 2).backward()
        assert loss.device.type == device and x.grad.dtype == dtype
        out[device] = (loss.item(), metrics, metrics["log_prob"].detach().cpu(), x.grad.cpu().double())
    (lc, mc, pc, gc), (lg, mg, pg, gg) = out["cpu"], out["cuda"]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert lg == pytest.approx(lc, rel=tol, abs=1e-6)
    torch.testing.assert_close(pg, pc, rtol=tol, atol=1e-5)
    torch.testing.assert_close(gg, gc, rtol=tol, atol=1e-6)
    assert mg["tokens"] == mc["tokens"]


@kernels
@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("frozen_weight", [False, True])
def test_linear_head_cuda_equals_cpu(entropy_coef, packed, frozen_weight):
    _, old, adv, mask, ref, _ = _batch(3, 11, 5)
    g = torch.Generator().manual_seed(5)
    n, h, v = 33, 24, 301
    hidden, weight = torch.randn(n, h, generator=g) * 0.5, torch.randn(v, h, generator=g) * 0.3
    labels = torch.randint(0, v, (n,), generator=g)
    norm = ulorl.global_normalizer("seq_mean_token_mean", ulorl.count_batch(mask))
    offsets = None
    if packed:
        old, adv, mask, ref = (t.reshape(-1) for t in (old, adv, mask, ref))
        offsets = torch.tensor([0, 11, 22, 33])
    out = {}
    for device in ("cpu", "cuda"):
        x, w = hidden.to(device).requires_grad_(), weight.to(device).requires_grad_(not frozen_weight)
        loss, metrics = ulorl.linear_head_policy_loss(
            x, w, None, labels.to(device), old.to(device), adv.to(device), mask.to(device),
            ref_log_prob=ref.to(device), offsets=None if offsets is None else offsets.to(device), normalizer=norm,
            eps_high=0.28, kl_coef=0.05, entropy_coef=entropy_coef, chunk_rows=8)
        (loss * 2).backward()
        assert loss.device.type == device and metrics["log_prob"].device.type == device
        assert (w.grad is None) == frozen_weight
        out[device] = (loss.item(), metrics, x.grad.cpu(), None if frozen_weight else w.grad.cpu())
    (lc, mc, hc, wc), (lg, mg, hg, wg) = out["cpu"], out["cuda"]
    assert lg == pytest.approx(lc, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(mg["log_prob"].cpu(), mc["log_prob"], rtol=1e-5, atol=1e-5)
    if entropy_coef:
        torch.testing.assert_close(mg["entropy"].cpu(), mc["entropy"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hg, hc, rtol=1e-4, atol=1e-6)
    if not frozen_weight:
        torch.testing.assert_close(wg, wc, rtol=1e-4, atol=1e-6)
    for k in ("tokens", "sequences", "clipped"):
        assert mg[k] == mc[k], k


@kernels
def test_linear_head_cuda_bf16_and_what_runs_on_the_host():
    _, old, adv, mask, _, _ = _batch(2, 16, 6)
    g = torch.Generator().manual_seed(6)
    hidden, weight = torch.randn(32, 16, generator=g) * 0.5, torch.randn(97, 16, generator=g) * 0.3
    bias = torch.randn(97, generator=g) * 0.1
    labels = torch.randint(0, 97, (32,), generator=g)
    norm = ulorl.global_normalizer("token_mean", ulorl.count_batch(mask))

    def run(device, dtype, b=None):
        x = hidden.to(device, dtype).requires_grad_()
        w = weight.to(device, dtype).requires_grad_()
        loss, _ = ulorl.linear_head_policy_loss(x, w, None if b is None else b.to(device, dtype), labels.to(device),
                                                old.to(device), adv.to(device), mask.to(device), normalizer=norm)
        loss.backward()
        assert x.grad.dtype == dtype and w.grad.dtype == dtype and x.grad.device.type == device
        return loss.item(), x.grad.double().cpu(), w.grad.double().cpu()

    cpu = run("cpu", torch.float32)
    bf16 = run("cuda", torch.bfloat16)  # the device kernel's bf16 GEMMs against the float32 CPU
    assert bf16[0] == pytest.approx(cpu[0], rel=3e-2, abs=1e-3)
    for a, b in zip(bf16[1:], cpu[1:]):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-3)
    # A bias and float64 states run on the host: the CPU's bits on the device.
    for dtype, b in ((torch.float32, bias), (torch.float64, None)):
        dev, host = run("cuda", dtype, b), run("cpu", dtype, b)
        assert dev[0] == host[0] and all(torch.equal(p, q) for p, q in zip(dev[1:], host[1:]))
    previous = ulorl.set_host_fallback(False)
    try:
        with pytest.raises((ulorl.Error, ValueError), match="argument 'bias': the CUDA kernel takes no bias"):
            run("cuda", torch.float32, bias)
        with pytest.raises((ulorl.Error, ValueError), match="argument 'hidden': has dtype Half"):
            run("cuda", torch.float16)
    finally:
        ulorl.set_host_fallback(previous)
    bad = labels.clone()
    bad[7] = 97
    with pytest.raises((ulorl.Error, ValueError), match="argument 'labels'"):
        ulorl.linear_head_policy_loss(hidden.cuda(), weight.cuda(), None, bad.cuda(), old.cuda(), adv.cuda(),
                                      mask.cuda(), normalizer=norm)


def test_host_path_gives_the_cpu_values_on_the_device():
    previous = ulorl.set_host_fallback(True)  # on already where the extension has its CUDA kernels
    try:
        _host_path_gives_the_cpu_values_on_the_device()
    finally:
        ulorl.set_host_fallback(previous)


def _host_path_gives_the_cpu_values_on_the_device():
    lp, old, adv, mask, ref, _ = _batch(4, 9, 4)
    norm = ulorl.global_normalizer("seq_mean_token_mean", ulorl.count_batch(mask))
    kl = ulorl.kl_penalty(lp, ref, "low_var_kl")
    kl_cuda = ulorl.kl_penalty(lp.cuda(), ref.cuda(), "low_var_kl")
    assert kl_cuda.device.type == "cuda"
    torch.testing.assert_close(kl_cuda.cpu(), kl, rtol=0, atol=0)
    x = lp.clone().cuda().requires_grad_()
    agg = ulorl.agg_loss(x * 2, mask.cuda(), normalizer=norm)
    agg.backward()
    y = lp.clone().requires_grad_()
    ulorl.agg_loss(y * 2, mask, normalizer=norm).backward()
    assert agg.device.type == "cuda"
    torch.testing.assert_close(x.grad.cpu(), y.grad, rtol=0, atol=0)
    hidden, weight, bias = torch.randn(36, 8), torch.randn(11, 8), torch.randn(11)  # a bias: the host path
    labels = torch.randint(0, 11, (36,))
    cpu = ulorl.linear_head_policy_loss(hidden, weight, bias, labels, old, adv, mask, normalizer=norm)[0]
    dev = ulorl.linear_head_policy_loss(hidden.cuda(), weight.cuda(), bias.cuda(), labels.cuda(), old.cuda(),
                                        adv.cuda(), mask.cuda(), normalizer=norm)[0]
    assert dev.device.type == "cuda" and dev.item() == cpu.item()


def test_host_path_off_and_mixed_devices_are_named():
    lp, _, _, mask, ref, _ = _batch(3, 8)
    previous = ulorl.set_host_fallback(False)
    try:
        assert previous is _ulorl.cuda_kernels  # automatic: on exactly where the device kernels are
        with pytest.raises((ulorl.Error, ValueError), match="argument 'log_prob': is a CUDA tensor"):
            ulorl.kl_penalty(lp.cuda(), ref.cuda(), "k1")
    finally:
        ulorl.set_host_fallback(previous)
    with pytest.raises((ulorl.Error, ValueError), match="argument 'ref_log_prob': is on device cpu"):
        ulorl.kl_penalty(lp.cuda(), ref, "k1")


@kernels
@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2")
def test_a_compiled_loss_on_cuda_equals_eager():
    lp, old, adv, mask, ref, ent = (t.cuda() for t in _batch(4, 9, 3))
    enc = _ulorl.encode_fields(ulorl.policy_loss_config(eps_high=0.28, kl_coef=0.05, entropy_coef=0.01,
                                                        normalizer=ulorl.Normalizer("token_mean", 17.0)))

    def step(x, e):
        return torch.ops.ulorl.policy_loss(x * 1.0, old, adv, mask, ref, None, e, None, None, enc)[0] * 2.0

    def run(fn):
        x, e = lp.clone().requires_grad_(), ent.clone().requires_grad_()
        loss = fn(x, e)
        loss.backward()
        return loss.detach(), x.grad, e.grad

    for a, b in zip(run(step), run(torch.compile(step, fullgraph=True))):
        assert torch.equal(a, b)
