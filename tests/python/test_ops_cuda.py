"""torch.ops.ulorl.policy_loss on CUDA tensors (the extension's CUDA kernel, ulorl/adapters/torch/ops_cuda.hpp)
against the same operator on the CPU: loss, metrics and gradients through `ulorl.policy_loss`, for several
objectives, masks and both layouts; errors named as on the CPU. Runs where torch has a GPU and the
extension was built with CUDA (ulorl._ulorl.cuda_kernels); skipped elsewhere."""

import pytest
import torch

import ulorl
from ulorl import _ulorl

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and _ulorl.cuda_kernels),
                                reason="needs a GPU and the extension's CUDA kernel (ulorl._ulorl.cuda_kernels)")


def _batch(b=6, t=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    lp = old + (torch.rand(b, t, generator=g) - 0.5) * 0.6
    return (lp, old, torch.randn(b, t, generator=g), torch.rand(b, t, generator=g) > 0.2,
            old + (torch.rand(b, t, generator=g) - 0.5) * 0.2, torch.rand(b, t, generator=g) * 2)


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


def test_cuda_errors_name_the_argument():
    lp, old, adv, mask, _, _ = _batch(3, 8)
    norm = ulorl.Normalizer("token_mean", 10.0)
    bad = lp.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ulorl.Error, match=r"argument 'log_prob'\[10\] = nan: must be finite \(row 1, token 2\)"):
        ulorl.policy_loss(bad.cuda(), old.cuda(), adv.cuda(), mask.cuda(), normalizer=norm)
    with pytest.raises(ulorl.Error, match="argument 'mask': is on device cpu but 'log_prob' is on cuda:0"):
        ulorl.policy_loss(lp.cuda(), old.cuda(), adv.cuda(), mask, normalizer=norm)
    with pytest.raises(ulorl.Error, match="argument 'log_prob': has dtype Double"):
        ulorl.policy_loss(lp.double().cuda(), old.double().cuda(), adv.double().cuda(), mask.cuda(), normalizer=norm)
    with pytest.raises(ulorl.Error, match="argument 'logits': is a CUDA tensor"):
        ulorl.logprobs_from_logits(torch.randn(3, 5, device="cuda"), torch.zeros(3, dtype=torch.long, device="cuda"))
    with pytest.raises(ulorl.Error, match="argument 'hidden': is a CUDA tensor .*linear_head_policy_loss has no CUDA"):
        ulorl.linear_head_policy_loss(torch.randn(24, 4, device="cuda"), torch.randn(5, 4, device="cuda"), None,
                                      torch.zeros(24, dtype=torch.long, device="cuda"), old.cuda(), adv.cuda(),
                                      mask.cuda(), normalizer=norm)


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
