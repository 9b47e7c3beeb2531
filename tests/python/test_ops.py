"""The `ulorl` torch operators (ulorl/adapters/torch/ops.hpp): the library lists them with their
schemas; Meta kernels give the CPU kernels' shapes, dtypes and strides; the Python functions and
the operators agree; the configuration's encoding round-trips and rejects malformed arrays; the C++
adapter (th::) and Python give the same bits; the linear head's operator gives the Python
function's bits and plain torch's gradients, computes only the gradients asked for and is
differentiable once; torch.compile(fullgraph=True) traces a GRPO step and a linear-head step
through them and gives the eager loss and gradients, with the aot_eager and inductor backends, and
torch.library.opcheck passes (torch >= 2)."""

import json
import math
import os
import subprocess

import pytest
import torch

import ulorl
from ulorl import _ulorl

OPS = ["policy_loss", "_policy_loss_forward", "logits_statistics", "_logits_statistics_forward", "_logits_statistics_backward",
       "agg_loss", "_agg_loss_forward", "kl_penalty", "_kl_penalty_forward", "policy_loss_from_logits",
       "_policy_loss_from_logits_forward", "linear_head_policy_loss", "_linear_head_policy_loss_forward",
       "trl_grpo_loss", "_trl_grpo_loss_forward", "weighted_kl_loss", "_weighted_kl_loss_forward"]


def _encode(**options):
    options.setdefault("normalizer", ulorl.Normalizer("token_mean", 10.0))
    return _ulorl.encode_fields(ulorl.policy_loss_config(**options))


def _batch(dtype, b=3, t=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(b, t, generator=g, dtype=torch.float64).mul(3).to(dtype)
    old = (lp.double() + 0.05 * torch.randn(b, t, generator=g, dtype=torch.float64)).to(dtype)
    adv = torch.randn(b, t, generator=g, dtype=torch.float64).to(dtype)
    mask = torch.rand(b, t, generator=g) > 0.2
    ent = torch.rand(b, t, generator=g, dtype=torch.float64).mul(2).to(dtype)
    ref = (lp.double() - 0.1 * torch.rand(b, t, generator=g, dtype=torch.float64)).to(dtype)
    return lp, old, adv, mask, ref, ent


def test_the_library_lists_every_operator_with_its_schema():
    for name in OPS:
        schema = str(getattr(torch.ops.ulorl, name).default._schema)
        assert schema.startswith(f"ulorl::{name}(")
    assert "float[] config" in str(torch.ops.ulorl.policy_loss.default._schema)


def test_config_encoding_round_trips_and_names_every_field():
    cfg = ulorl.policy_loss_config(objective="gspo", eps_low=0.1, eps_high=0.3, kl_coef=0.2, kl_estimator="k2",
                                   entropy_coef=0.01, kl_input_clamp=20.0)
    enc = _ulorl.encode_fields(cfg)
    assert len(enc) == len(_ulorl.encode_fields(ulorl.PolicyLossConfig()))
    names = _ulorl.config_fields()
    assert names[:3] == ["objective", "eps_low", "eps_high"] and "square_penalty" in names and "rollout" in names
    assert enc[1] == 0.1 and enc[2] == 0.3
    result = torch.ops.ulorl.policy_loss(*_batch(torch.float64)[:3], None, None, None, None, None, None, _encode())[1]
    assert len(_ulorl.result_fields()) == result.numel()


@pytest.mark.parametrize("edit, what", [
    (lambda c: c[:-1], "values but an encoded policy_loss_config has"),
    (lambda c: [2.0 if i == _ulorl.config_fields().index("check_values") else x for i, x in enumerate(c)],
     "field 'check_values'"),
    (lambda c: [0.5] + c[1:], "field 'objective'"),
    (lambda c: [99.0] + c[1:], "'kind' = 99: unknown enum value"),
])
def test_a_malformed_config_is_an_error_naming_the_field(edit, what):
    lp, old, adv, mask, _, _ = _batch(torch.float64)
    with pytest.raises(ValueError, match=what):  # ulorl.Error, or its base where torch's pybind11 is not ours
        torch.ops.ulorl.policy_loss(lp, old, adv, mask, None, None, None, None, None, edit(_encode()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_meta_kernels_give_the_cpu_kernels_shapes_dtypes_and_strides(dtype, with_entropy):
    lp, old, adv, mask, ref, ent = _batch(dtype)
    enc = _encode(kl_coef=0.1, entropy_coef=0.01 if with_entropy else 0.0)
    args = (lp, old, adv, mask, ref, None, ent if with_entropy else None, None, None)
    cpu = torch.ops.ulorl._policy_loss_forward(*args, enc)
    meta = torch.ops.ulorl._policy_loss_forward(*[a.to("meta") if a is not None else None for a in args], enc)
    for c, m in zip(cpu, meta):
        assert m.device.type == "meta"
        assert (c.shape, c.dtype, c.stride()) == (m.shape, m.dtype, m.stride())
    z = torch.randn(5, 9, dtype=dtype)
    y = torch.randint(0, 9, (5,))
    cpu = torch.ops.ulorl._logits_statistics_forward(z, y, 1.0, True, False)
    meta = torch.ops.ulorl._logits_statistics_forward(z.to("meta"), y.to("meta"), 1.0, True, False)
    for c, m in zip(cpu, meta):
        assert (c.shape, c.dtype, c.stride(), m.device.type) == (m.shape, m.dtype, m.stride(), "meta")
    args = (z, y, cpu[2], cpu[3], torch.ones(5, dtype=cpu[0].dtype), None, 1.0, False)
    g_cpu = torch.ops.ulorl._logits_statistics_backward(*args)
    g_meta = torch.ops.ulorl._logits_statistics_backward(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])
    assert (g_cpu.shape, g_cpu.dtype, g_cpu.stride()) == (g_meta.shape, g_meta.dtype, g_meta.stride())


def test_the_public_operators_run_under_inference_mode_and_give_the_autograd_values():
    lp, old, adv, mask, ref, ent = _batch(torch.float64)
    enc = _encode(kl_coef=0.1, entropy_coef=0.01)
    args = (lp, old, adv, mask, ref, None, ent, None, None, enc)
    loss, result = torch.ops.ulorl.policy_loss(*args)
    with torch.inference_mode():
        loss_i, result_i = torch.ops.ulorl.policy_loss(*args)
    assert loss_i.item() == loss.item() and torch.equal(result, result_i)
    z = torch.randn(4, 6, dtype=torch.float64)
    y = torch.randint(0, 6, (4,))
    with torch.inference_mode():
        a = torch.ops.ulorl.logits_statistics(z, y)
    b = torch.ops.ulorl.logits_statistics(z, y)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_policy_loss_equals_the_operator_and_its_decoded_result():
    lp, old, adv, mask, ref, ent = _batch(torch.float32)
    lp1, lp2 = lp.clone().requires_grad_(), lp.clone().requires_grad_()
    ent1, ent2 = ent.clone().requires_grad_(), ent.clone().requires_grad_()
    cfg = ulorl.policy_loss_config(eps_high=0.28, kl_coef=0.1, entropy_coef=0.01,
                                   normalizer=ulorl.global_normalizer("token_mean", ulorl.count_batch(mask)))
    loss1, metrics = ulorl.policy_loss(lp1, old, adv, mask, ref_log_prob=ref, entropy=ent1, config=cfg)
    loss2, result = torch.ops.ulorl.policy_loss(lp2, old, adv, mask, ref, None, ent2, None, None,
                                                _ulorl.encode_fields(cfg))
    (loss1 * 3).backward()
    (loss2 * 3).backward()
    assert loss1.item() == loss2.item()
    assert torch.equal(lp1.grad, lp2.grad) and torch.equal(ent1.grad, ent2.grad)
    assert metrics == _ulorl.decode_result(result).as_dict()
    fields = dict(zip(_ulorl.result_fields(), result.tolist()))
    assert fields["tokens"] == mask.sum().item() and fields["loss"] == metrics["loss"]


def test_an_error_of_the_python_api_is_ulorl_error_with_its_fields():
    with pytest.raises(ulorl.Error) as e:
        ulorl.policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3, 3))
    assert (e.value.function, e.value.argument) == ("policy_loss", "advantages")
    bad = torch.zeros(2, 3)
    bad[1, 1] = float("nan")
    with pytest.raises(ulorl.Error) as e:
        ulorl.policy_loss(bad, torch.zeros(2, 3), torch.zeros(2, 3))
    assert (e.value.function, e.value.argument, e.value.index) == ("policy_loss", "log_prob", 4)


def test_double_backward_through_an_operator_raises():
    lp, old, adv, mask, _, _ = _batch(torch.float64)
    lp.requires_grad_()
    loss, _ = torch.ops.ulorl.policy_loss(lp, old, adv, mask, None, None, None, None, None, _encode())
    (g,) = torch.autograd.grad(loss, lp, create_graph=True)
    with pytest.raises((ulorl.Error, RuntimeError), match="ulorl::policy_loss: argument .grad_log_prob.: is differentiable once"):
        g.sum().backward()


@pytest.mark.parametrize("arg", ["old_log_prob", "mask", "entropy"])
@pytest.mark.parametrize("device, other", [("cpu", "meta"), ("meta", "cpu")])
def test_tensors_on_different_devices_are_an_error_naming_the_argument(arg, device, other):
    lp, old, adv, mask, ref, ent = _batch(torch.float64)
    args = dict(old_log_prob=old, mask=mask, entropy=ent)
    args = {k: v.to(other if k == arg else device) for k, v in args.items()}
    with pytest.raises(ValueError, match=f"argument '{arg}': is on device {other} but 'log_prob' is on {device}"):
        torch.ops.ulorl.policy_loss(lp.to(device), args["old_log_prob"], adv.to(device), args["mask"], None, None,
                                    args["entropy"], None, None, _encode(entropy_coef=0.01))
    z = torch.randn(3, 5)
    with pytest.raises(ulorl.Error, match="argument 'labels': is on device"):
        ulorl.logprobs_from_logits(z.to("meta"), torch.zeros(3, dtype=torch.long))


def test_the_host_fallback_is_on_exactly_where_the_build_has_cuda_kernels_until_set():
    # Automatic: a build with the device kernels runs what they do not take on the host; one without
    # them names a CUDA tensor (the error itself needs a GPU: test_ops_cuda.py).
    assert ulorl.host_fallback() is ulorl._ulorl.cuda_kernels
    previous = ulorl.set_host_fallback(not ulorl._ulorl.cuda_kernels)
    try:
        assert previous is ulorl._ulorl.cuda_kernels
        assert ulorl.host_fallback() is not ulorl._ulorl.cuda_kernels
        assert ulorl.set_host_fallback(previous) is not previous
        assert ulorl.host_fallback() is previous
    finally:
        ulorl.set_host_fallback(previous)


def _bits_inputs(dtype, b=3, t=7):
    """tests/torch/torch_ops_bits.cpp's formulas, in the same double arithmetic."""
    def tok(f):
        return torch.tensor([f(i) for i in range(b * t)], dtype=torch.float64).reshape(b, t).to(dtype)

    def lp_of(i):
        return -0.05 * (i % 11) - 0.3

    return (tok(lp_of), tok(lambda i: lp_of(i) + 0.01 * ((i * 7) % 5 - 2)), tok(lambda i: ((i * 3) % 7 - 3) / 3.0),
            tok(lambda i: 1.0 if (i * 5) % 9 != 0 else 0.0).to(torch.bool), tok(lambda i: lp_of(i) - 0.02 * (i % 3 - 1)),
            tok(lambda i: 0.5 + 0.1 * (i % 4)))


def _same(cpp, values):
    got = [float.fromhex(s) for s in cpp]
    want = (values.double() if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.float64))
    want = want.reshape(-1).tolist()
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a == b or (math.isnan(a) and math.isnan(b)) or (math.isinf(a) and a == b), (i, a, b)


def test_the_cpp_adapter_and_python_give_the_same_bits():
    exe = os.environ.get("ULORL_TORCH_OPS_BITS")
    if not exe:
        pytest.skip("ULORL_TORCH_OPS_BITS (the path of tests/torch's torch_ops_bits; CTest sets it) is not set")
    if (_ulorl.policy_loss_isa, _ulorl.logits_isa) != ("default", "default"):
        pytest.skip(f"the module runs its {_ulorl.policy_loss_isa} kernels; the C++ program the baseline ones "
                    "(CTest's python_baseline_isa runs this test with ULORL_PYTHON_ISA=default)")
    cpp = json.loads(subprocess.run([exe], check=True, capture_output=True, text=True).stdout)
    for name, dtype in [("float32", torch.float32), ("float64", torch.float64)]:
        lp, old, adv, mask, ref, ent = _bits_inputs(dtype)
        lp.requires_grad_()
        ent.requires_grad_()
        cfg = ulorl.policy_loss_config(eps_high=0.28, kl_coef=0.05, entropy_coef=0.01,
                                       normalizer=ulorl.Normalizer("token_mean", float(mask.sum().item())))
        loss, result = torch.ops.ulorl.policy_loss(lp, old, adv, mask, ref, None, ent, None, None,
                                                   _ulorl.encode_fields(cfg))
        loss.backward()
        c = cpp["policy_loss"][name]
        _same([c["loss"]], [loss.item()])
        _same(c["result"], result)
        _same(c["grad_log_prob"], lp.grad)
        _same(c["grad_entropy"], ent.grad)
    n, v = 6, 11
    z = torch.tensor([[((i * 31 + j * 17) % 23) / 4.0 - 2.5 for j in range(v)] for i in range(n)], dtype=torch.float64)
    y = torch.tensor([(i * 5) % v for i in range(n)])
    for name, dtype in [("float32", torch.float32), ("float64", torch.float64), ("bfloat16", torch.bfloat16),
                        ("float16", torch.float16)]:
        logits = z.to(dtype).detach().requires_grad_()
        lp, ent = ulorl.logprobs_from_logits(logits, y, 0.7)
        (lp.sum() + 0.5 * ent.sum()).backward()
        c = cpp["logits_statistics"][name]
        _same(c["log_prob"], lp)
        _same(c["entropy"], ent)
        _same(c["grad_logits"], logits.grad)
    lp, old, adv_tok, mask, ref, _ = _bits_inputs(torch.float64)
    rewards = torch.tensor([0.0, 0.75, 0.25], dtype=torch.float64)
    verl = ulorl.advantage_preset("verl")
    adv = ulorl.group_advantages(rewards, group_size=3, preset=verl)
    c = cpp["batch"]
    _same(c["advantages"], adv)
    _same(c["tokens"], ulorl.broadcast_to_tokens(adv, mask, verl))
    rpp_adv, rpp_ret = ulorl.reinforce_plus_plus_advantages(adv_tok, mask, gamma=0.9, scan="skip_masked")
    _same(c["reinforce_plus_plus"], rpp_adv)
    _same(c["returns"], rpp_ret)
    keep, seq_kl, _ = ulorl.off_policy_mask(lp, old, adv, mask, delta=0.01, preset="trl")
    _same(c["opm_keep"], keep)
    _same(c["opm_seq_kl"], seq_kl)
    w, rc_keep, stats = torch.ops.ulorl.rollout_correction(old, ref, mask, None,
                                                           _ulorl.record_defaults("rollout_correction_config"))
    _same(c["rc_weights"], w)
    _same(c["rc_keep"], rc_keep)
    s = dict(zip(_ulorl.record_fields("rollout_correction_statistics"), stats.tolist()))
    _same([c["rc_kl"]], [-s["log_ratio_sum"] / s["tokens"]])  # kl = sum (rollout - old) m / N, x = old - rollout
    dppo = _ulorl.record_defaults("dppo_config")
    names = _ulorl.record_fields("dppo_config")
    dppo[names.index("delta_low")], dppo[names.index("delta_high")] = 0.02, 0.03
    w, stats = torch.ops.ulorl.dppo_weights(old, lp, adv_tok, mask, _bits_inputs(torch.float64)[5], None, dppo)
    _same(c["dppo_weights"], w)
    dropped = dict(zip(_ulorl.record_fields("token_selection_stats"), stats.tolist()))["dropped_fraction"]
    _same([c["dppo_dropped"]], [dropped])


@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_policy_loss_from_logits_operator_gives_the_in_place_functions_bits(entropy_coef):
    _, old, adv, mask, ref, _ = _batch(torch.float64, b=3, t=5, seed=4)
    g = torch.Generator().manual_seed(5)
    z = torch.randn(15, 11, generator=g, dtype=torch.float64)
    y = torch.randint(0, 11, (15,), generator=g)
    options = dict(eps_high=0.28, kl_coef=0.05, entropy_coef=entropy_coef)
    a = z.clone().requires_grad_()
    loss, result, lp, ent = torch.ops.ulorl.policy_loss_from_logits(a, y, old, adv, mask, ref, None, None, None,
                                                                    _encode(**options), 0.8, True, False)
    (3.0 * loss).backward()
    loss_b, metrics = ulorl.policy_loss_from_logits(z.clone(), y, old, adv, mask, ref_log_prob=ref, temperature=0.8,
                                                    normalizer=ulorl.Normalizer("token_mean", 10.0), **options)
    assert torch.equal(loss, loss_b) and torch.equal(lp, metrics["log_prob"])
    assert not (result.requires_grad or lp.requires_grad or ent.requires_grad)
    assert ent.numel() == 0 if entropy_coef == 0.0 else torch.equal(ent, metrics["entropy"])
    # the gradient: the operator's (scaled by the incoming 3) against the in-place form's (an autograd
    # function over the same kernel, writing into its input)
    c = z.clone().requires_grad_()
    work = c * 1.0  # a non-leaf copy the in-place form may overwrite
    (3.0 * ulorl.policy_loss_from_logits(work, y, old, adv, mask, ref_log_prob=ref, temperature=0.8, in_place=True,
                                         normalizer=ulorl.Normalizer("token_mean", 10.0), **options)[0]).backward()
    assert torch.equal(a.grad, c.grad)
    meta = torch.ops.ulorl.policy_loss_from_logits(z.to("meta"), y.to("meta"), old.to("meta"), adv.to("meta"),
                                                   mask.to("meta"), ref.to("meta"), None, None, None,
                                                   _encode(**options), 0.8, True, False)
    for m, r in zip(meta, (loss, result, lp, ent)):
        assert m.is_meta and m.shape == r.shape and m.dtype == r.dtype


def _head_case(seed, bias=True, entropy_coef=0.01):
    _, old, adv, mask, ref, _ = _batch(torch.float64, b=3, t=5, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(15, 6, generator=g, dtype=torch.float64)
    weight = 0.3 * torch.randn(11, 6, generator=g, dtype=torch.float64)
    b = 0.1 * torch.randn(11, generator=g, dtype=torch.float64) if bias else None
    y = torch.randint(0, 11, (15,), generator=g)
    options = dict(eps_high=0.28, kl_coef=0.05, entropy_coef=entropy_coef)
    return hidden, weight, b, y, old, adv, mask, ref, options


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.01])
def test_linear_head_operator_gives_the_python_functions_bits(bias, entropy_coef):
    hidden, weight, b, y, old, adv, mask, ref, options = _head_case(6, bias, entropy_coef)
    leaves = [t.clone().requires_grad_() for t in (hidden, weight) + ((b,) if bias else ())]
    loss, result, lp, ent = torch.ops.ulorl.linear_head_policy_loss(
        leaves[0], leaves[1], leaves[2] if bias else None, y, old, adv, mask, ref, None, None, None,
        _encode(**options), 0.8, True, False, 4, 1 << 20)
    (3.0 * loss).backward()
    again = [t.clone().requires_grad_() for t in (hidden, weight) + ((b,) if bias else ())]
    loss_b, metrics = ulorl.linear_head_policy_loss(again[0], again[1], again[2] if bias else None, y, old, adv,
                                                    mask, ref_log_prob=ref, temperature=0.8, chunk_rows=4,
                                                    workspace_budget=1 << 20,
                                                    normalizer=ulorl.Normalizer("token_mean", 10.0), **options)
    (3.0 * loss_b).backward()
    assert torch.equal(loss, loss_b) and torch.equal(lp, metrics["log_prob"])
    assert metrics == {**_ulorl.decode_result(result).as_dict(), "log_prob": metrics["log_prob"],
                       "entropy": metrics["entropy"]}
    assert ent.numel() == 0 if entropy_coef == 0.0 else torch.equal(ent, metrics["entropy"])
    assert not (result.requires_grad or lp.requires_grad or ent.requires_grad)
    for a, c in zip(leaves, again):
        assert torch.equal(a.grad, c.grad)
    # the gradients against plain torch's logits -> log_softmax graph (through ulorl's logits operator)
    plain = [t.clone().requires_grad_() for t in (hidden, weight) + ((b,) if bias else ())]
    z = plain[0] @ plain[1].T + (plain[2] if bias else 0.0)
    loss_c, _ = ulorl.policy_loss_from_logits(z, y, old, adv, mask, ref_log_prob=ref, temperature=0.8,
                                              normalizer=ulorl.Normalizer("token_mean", 10.0), **options)
    (3.0 * loss_c).backward()
    torch.testing.assert_close(loss, loss_c, rtol=1e-12, atol=1e-14)
    for a, c in zip(leaves, plain):
        torch.testing.assert_close(a.grad, c.grad, rtol=1e-10, atol=1e-13)


def test_linear_head_primitive_meta_kernel_and_output_mask():
    hidden, weight, b, y, old, adv, mask, ref, options = _head_case(8)
    enc = _encode(**options)
    for bias in (None, b.float()):
        args = (hidden.float(), weight.float(), bias, y, old, adv, mask, ref, None, None, None, enc, 1.0, True, False,
                3, 1 << 20)
        for output_mask in ([True, True, True], [False, True, False]):
            cpu = torch.ops.ulorl._linear_head_policy_loss_forward(*args, output_mask)
            meta = torch.ops.ulorl._linear_head_policy_loss_forward(
                *[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args], output_mask)
            for c, m in zip(cpu, meta):
                assert (c.shape, c.dtype, c.stride(), m.device.type) == (m.shape, m.dtype, m.stride(), "meta")
            assert cpu[1].numel() == (hidden.numel() if output_mask[0] else 0)
            assert cpu[3].numel() == (b.numel() if output_mask[2] and bias is not None else 0)
            assert cpu[1].dtype == torch.float32 and cpu[0].dtype == torch.float64
    meta = torch.ops.ulorl.linear_head_policy_loss(hidden.to("meta"), weight.to("meta"), None, y.to("meta"),
                                                   old.to("meta"), adv.to("meta"), None, ref.to("meta"), None, None,
                                                   None, enc)
    assert [m.shape for m in meta] == [torch.Size([]), torch.Size([len(_ulorl.result_fields())]), old.shape, old.shape]


def test_linear_head_operator_double_backward_raises_and_runs_under_inference_mode():
    hidden, weight, b, y, old, adv, mask, ref, options = _head_case(9, entropy_coef=0.0)
    enc = _encode(**options)
    w = weight.clone().requires_grad_()
    loss, *_ = torch.ops.ulorl.linear_head_policy_loss(hidden, w, b, y, old, adv, mask, ref, None, None, None, enc)
    (g,) = torch.autograd.grad(loss, w, create_graph=True)
    with pytest.raises((ulorl.Error, RuntimeError),
                       match="ulorl::linear_head_policy_loss: argument .grad_weight.: is differentiable once"):
        g.sum().backward()
    with torch.inference_mode():
        loss_i, result_i, *_ = torch.ops.ulorl.linear_head_policy_loss(hidden, weight, b, y, old, adv, mask, ref, None,
                                                                       None, None, enc)
    assert torch.equal(loss_i, loss.detach())
    with pytest.raises(ValueError, match="argument 'weight': is on device meta but 'hidden' is on cpu"):
        torch.ops.ulorl.linear_head_policy_loss(hidden, weight.to("meta"), b, y, old, adv, mask, ref, None, None,
                                                None, enc)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2")
def test_a_linear_head_step_compiles_with_fullgraph_and_gives_the_eager_loss_and_gradients(compiles_like_eager):
    hidden, weight, b, y, old, adv, mask, ref, options = _head_case(10)
    hidden, weight, b = hidden.float(), weight.float(), b.float()
    old, adv, ref = old.float(), adv.float(), ref.float()
    enc = _encode(**options)

    def step(h, w, bias):
        loss, result, _, _ = torch.ops.ulorl.linear_head_policy_loss(h, w, bias, y, old, adv, mask, ref, None, None,
                                                                     None, enc, 1.0, True, False, 4, 1 << 20)
        return loss * 2.0, result

    def run(fn):
        h, w, bias = (t.clone().requires_grad_() for t in (hidden, weight, b))
        loss, result = fn(h, w, bias)
        loss.backward()
        return loss.detach(), result, h.grad, w.grad, bias.grad

    compiles_like_eager(step, run)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2")
def test_a_grpo_step_compiles_with_fullgraph_and_gives_the_eager_loss_and_gradient(compiles_like_eager):
    _, old, adv, mask, ref, _ = _batch(torch.float32, b=4, t=9, seed=3)
    enc = _encode(eps_high=0.28, kl_coef=0.05, entropy_coef=0.01, normalizer=ulorl.Normalizer("token_mean", 17.0))
    z0 = torch.randn(4 * 9, 13)
    labels = torch.randint(0, 13, (4 * 9,))

    def step(logits, lp_bias):
        lp, ent = torch.ops.ulorl.logits_statistics(logits, labels, 1.0, True, False)
        lp = lp.reshape(4, 9) + lp_bias
        loss, result = torch.ops.ulorl.policy_loss(lp, old, adv, mask, ref, None, ent.reshape(4, 9), None, None, enc)
        return loss * 2.0, result

    def run(fn):
        logits = z0.clone().requires_grad_()
        bias = torch.zeros(4, 9, requires_grad=True)
        loss, result = fn(logits, bias)
        loss.backward()
        return loss.detach(), result, logits.grad, bias.grad

    compiles_like_eager(step, run)


def _agg_oracle(x, mask, mode, denominator, scale):
    """scale * sum_b sum_t x m / D_b in float64: D_b = denominator, times the row's valid tokens for
    seq_mean_token_mean."""
    m = mask.double()
    rows = (x.double() * m).sum(-1)
    if mode == "seq_mean_token_mean":
        n = m.sum(-1)
        rows = torch.where(n > 0, rows / n.clamp(min=1), torch.zeros_like(rows))
    return scale * rows.sum() / denominator


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_agg_loss_operator_against_float64(mode):
    lp, _, _, mask, _, _ = _batch(torch.float64, seed=11)
    mask[1] = False  # an empty row
    norm = ulorl.Normalizer(mode, 7.0, 2.5)
    x = lp.clone().requires_grad_()
    loss = torch.ops.ulorl.agg_loss(x, mask, None, _ulorl.encode_fields(norm))
    assert loss.dim() == 0 and loss.dtype == torch.float64
    y = lp.clone().requires_grad_()
    want = _agg_oracle(y, mask, mode, 7.0, 2.5)
    torch.testing.assert_close(loss, want, rtol=1e-13, atol=0)
    loss.backward()
    want.backward()
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-13, atol=0)
    assert torch.equal(loss, ulorl.agg_loss(lp, mask, normalizer=norm))  # the Python function is the operator


def test_kl_penalty_operator_against_float64():
    lp, _, _, _, ref, _ = _batch(torch.float64, seed=12)
    ref = ref + torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    x, r = lp.clone().requires_grad_(), ref.clone().requires_grad_()
    # verl's low_var_kl: k3 of |ref - logp| clamped to 20, the value clamped to +-10 (active on some tokens)
    kl = torch.ops.ulorl.kl_penalty(x, r, None, _ulorl._kl_config("verl", "low_var_kl", None, None))
    y, q = lp.clone().requires_grad_(), ref.clone().requires_grad_()
    d = (q - y).clamp(-20, 20)
    want = (torch.exp(d) - d - 1).clamp(-10, 10)
    assert (want.detach().abs() == 10).any() and (want.detach().abs() < 10).any()
    torch.testing.assert_close(kl, want, rtol=1e-13, atol=1e-15)
    g = torch.rand_like(lp)
    kl.backward(g)
    want.backward(g)
    torch.testing.assert_close(x.grad, y.grad, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(r.grad, q.grad, rtol=1e-13, atol=1e-15)  # the reference's gradient too
    # backward more than once through one forward (retain_graph) gives the same gradient
    x.grad = None
    kl = torch.ops.ulorl.kl_penalty(x, ref, None, _ulorl._kl_config("verl", "k2", None, None))
    (a,) = torch.autograd.grad(kl.sum(), x, retain_graph=True)
    (b,) = torch.autograd.grad(kl.sum(), x)
    assert torch.equal(a, b) and torch.equal(a, (x - ref).detach())


def test_agg_loss_and_kl_penalty_meta_kernels_and_errors():
    lp, _, _, mask, ref, _ = _batch(torch.float32, seed=13)
    enc = _ulorl.encode_fields(ulorl.Normalizer("token_mean", 3.0))
    for cpu, meta in [(torch.ops.ulorl._agg_loss_forward(lp, mask, None, enc),
                       torch.ops.ulorl._agg_loss_forward(lp.to("meta"), mask.to("meta"), None, enc)),
                      (torch.ops.ulorl._kl_penalty_forward(lp, ref, None, _ulorl._kl_config("verl", "kl", None, None)),
                       torch.ops.ulorl._kl_penalty_forward(lp.to("meta"), ref.to("meta"), None,
                                                           _ulorl._kl_config("verl", "kl", None, None)))]:
        for c, m in zip(cpu, meta):
            assert (c.shape, c.dtype, c.stride(), m.device.type) == (m.shape, m.dtype, m.stride(), "meta")
    # ulorl.Error, or its base ValueError where torch's pybind11 is not ours (errors through torch.ops)
    with pytest.raises(ValueError, match="agg_normalizer has"):
        torch.ops.ulorl.agg_loss(lp, mask, None, enc[:-1])
    with pytest.raises(ValueError, match="argument 'mask'"):
        torch.ops.ulorl.agg_loss(lp, mask.to("meta"), None, enc)
    with pytest.raises(ValueError, match="argument 'ref_log_prob'"):
        torch.ops.ulorl.kl_penalty(lp, ref[:, :-1], None, _ulorl._kl_config("verl", "kl", None, None))
    with pytest.raises(ulorl.Error, match="argument 'ref_log_prob'"):  # the Python function: always ulorl.Error
        ulorl.kl_penalty(lp, ref[:, :-1], "kl")


@pytest.mark.skipif(not hasattr(getattr(torch, "library", None), "opcheck"), reason="torch.library.opcheck: torch >= 2.4")
def test_opcheck_passes_for_the_public_operators():
    lp, old, adv, mask, ref, ent = _batch(torch.float32, seed=5)
    enc = _encode(eps_high=0.28, kl_coef=0.05, entropy_coef=0.01)
    cases = [(torch.ops.ulorl.policy_loss.default,
              (lp.requires_grad_(), old, adv, mask, ref, None, ent.requires_grad_(), None, None, enc)),
             (torch.ops.ulorl.logits_statistics.default,
              (torch.randn(6, 11, requires_grad=True), torch.randint(0, 11, (6,)), 0.7, True, False)),
             (torch.ops.ulorl.agg_loss.default,
              (lp.detach().clone().requires_grad_(), mask, None,
               _ulorl.encode_fields(ulorl.Normalizer("seq_mean_token_mean", 3.0)))),
             (torch.ops.ulorl.kl_penalty.default,
              (lp.detach().clone().requires_grad_(), ref, None, _ulorl._kl_config("verl", "low_var_kl", None, None))),
             (torch.ops.ulorl.linear_head_policy_loss.default,
              (torch.randn(21, 5, requires_grad=True), torch.randn(9, 5, requires_grad=True),
               torch.randn(9, requires_grad=True), torch.randint(0, 9, (21,)), old, adv, mask, ref, None, None, None,
               enc, 0.7, True, False, 4, 1 << 20)),
             (torch.ops.ulorl.weighted_kl_loss.default,
              (lp.detach().clone().requires_grad_(), ref, None, mask, None,
               _weighted_kl_config(coef=0.1, output_clamp=10.0),
               _ulorl.encode_fields(ulorl.Normalizer("token_mean", 17.0)))),
             (torch.ops.ulorl.trl_grpo_loss.default,
              (lp.detach().clone().requires_grad_(), old, adv[:, 0].contiguous(), mask, ref, None,
               ent.detach().clone().requires_grad_(), None,
               _trl_case(loss_type="dapo", beta=0.04, entropy_coef=0.01)[-1].encoded))]
    for op, args in cases:
        result = torch.library.opcheck(op, args)  # schema, autograd registration, FakeTensor, AOT dispatch
        assert set(result.values()) == {"SUCCESS"}, (op, result)


# ---- weighted_kl_loss ----------------------------------------------------------------------------------

def _weighted_kl_config(**values):
    names, enc = _ulorl.record_fields("weighted_kl_config"), _ulorl.record_defaults("weighted_kl_config")
    for k, v in values.items():
        enc[names.index(k)] = float(v)
    return enc


@pytest.mark.parametrize("weight", [0, 1])  # current_policy, rollout_policy
def test_weighted_kl_loss_operator_against_float64_autograd(weight):
    lp, _, _, mask, ref, _ = _batch(torch.float64, seed=11)
    g = torch.Generator().manual_seed(3)
    rollout = lp + 0.2 * (torch.rand(lp.shape, generator=g, dtype=torch.float64) - 0.5)
    beta, cin, cout, denom = 0.1, 0.07, 0.0015, 17.0
    enc = _weighted_kl_config(coef=beta, input_clamp=cin, output_clamp=cout, weight=weight)
    norm = _ulorl.encode_fields(ulorl.Normalizer("token_mean", denom))
    x = lp.clone().requires_grad_()
    loss = torch.ops.ulorl.weighted_kl_loss(x, ref, rollout if weight else None, mask, None, enc, norm)
    loss.backward()
    # The formula of ulorl/loss/weighted_kl.hpp in float64, differentiated by torch (k3).
    y = lp.clone().requires_grad_()
    lam = (ref - y).clamp(-cin, cin)
    kappa = lam.exp() - lam - 1
    omega = (y - rollout).exp() if weight else (y - y.detach()).exp()
    want = beta * ((omega * kappa).clamp(-cout, cout) * mask).sum() / denom
    want.backward()
    clamped_in = ((ref - lp).abs() > cin) & mask
    clamped_out = ((omega * kappa).detach().abs() > cout) & mask
    assert clamped_in.any() and clamped_out.any() and (mask & ~clamped_in & ~clamped_out).any()
    assert loss.item() == pytest.approx(want.item(), rel=1e-13)
    assert torch.allclose(x.grad, y.grad, rtol=1e-12, atol=1e-15)
    assert (x.grad[~mask] == 0).all()
    # Composite kernel, meta shapes, double backward, errors.
    with torch.inference_mode():
        loss_i = torch.ops.ulorl.weighted_kl_loss(lp, ref, rollout if weight else None, mask, None, enc, norm)
    assert loss_i.item() == loss.item()
    loss_m = torch.ops.ulorl.weighted_kl_loss(lp.to("meta"), ref.to("meta"), None, mask.to("meta"), None, enc, norm)
    assert loss_m.is_meta and loss_m.shape == () and loss_m.dtype == lp.dtype
    z = lp.clone().requires_grad_()
    (gz,) = torch.autograd.grad(torch.ops.ulorl.weighted_kl_loss(z, ref, rollout, mask, None, enc, norm), z,
                                create_graph=True)
    with pytest.raises((ulorl.Error, RuntimeError), match="is differentiable once"):
        gz.sum().backward()
    with pytest.raises(ValueError, match="argument 'ref_log_prob'"):
        torch.ops.ulorl.weighted_kl_loss(lp, ref[:, :-1], None, mask, None, enc, norm)
    if weight:
        with pytest.raises(ValueError, match="argument 'rollout_log_prob'"):
            torch.ops.ulorl.weighted_kl_loss(lp, ref, None, mask, None, enc, norm)


# ---- trl_grpo_loss ------------------------------------------------------------------------------------

def _trl_case(dtype=torch.float64, seed=7, **options):
    """A padded TRL batch ([B] advantages, bool completion mask) and TRLGRPOLossOptions with `options`."""
    lp, old, adv_tok, mask, ref, ent = _batch(dtype, b=4, t=9, seed=seed)
    o = _ulorl.TRLGRPOLossOptions()
    for k, v in options.items():
        setattr(o, k, v)
    return lp, old, adv_tok[:, 0].contiguous(), mask, ref, ent, o


TRL_CASES = [dict(loss_type="dapo", beta=0.04, entropy_coef=0.01, epsilon_high=0.28),
             dict(loss_type="cispo", importance_sampling_level="sequence", beta=0.04, use_bias_correction_kl=True),
             dict(loss_type="sapo", importance_sampling_level="sequence", entropy_coef=0.02),
             dict(loss_type="grpo", importance_sampling_level="sequence_token", delta=1.5)]


@pytest.mark.parametrize("options", TRL_CASES)
def test_trl_grpo_loss_operator_is_the_presets_loss_with_its_gradients(options):
    lp, old, adv, mask, ref, ent, o = _trl_case(**options)
    x, e = lp.clone().requires_grad_(), ent.clone().requires_grad_()
    loss, result = torch.ops.ulorl.trl_grpo_loss(x, old, adv, mask, ref, None, e, None, o.encoded)
    loss.backward()
    y, f = lp.clone().requires_grad_(), ent.clone().requires_grad_()
    kw = {k: v for k, v in options.items()}
    loss2, m = ulorl.presets.trl.grpo_loss(y, old, adv, mask, ref_per_token_logps=ref, entropies=f, **kw)
    loss2.backward()
    assert loss.item() == loss2.item() == m["loss"]
    assert torch.equal(x.grad, y.grad)
    if o.entropy_coef != 0.0:
        assert torch.equal(e.grad, f.grad) and e.grad.abs().sum() > 0
    else:
        assert e.grad is None
    names = _ulorl.record_fields("trl_grpo_loss_result")
    assert len(names) == result.numel() and names[:4] == ["loss", "pg_loss", "kl_loss", "entropy_loss"]
    assert result[0].item() == loss.item()
    # The composite kernel (inference mode) gives the same loss and result; meta tensors the shapes.
    with torch.inference_mode():
        loss_i, result_i = torch.ops.ulorl.trl_grpo_loss(lp, old, adv, mask, ref, None, ent, None, o.encoded)
    assert loss_i.item() == loss.item() and torch.equal(result_i, result)
    meta = [t.to("meta") for t in (lp, old, adv, mask, ref, ent)]
    loss_m, result_m = torch.ops.ulorl.trl_grpo_loss(*meta[:5], None, meta[5], None, o.encoded)
    assert loss_m.is_meta and loss_m.shape == () and loss_m.dtype == lp.dtype and result_m.shape == result.shape


def test_trl_options_are_the_field_table_and_encode_as_it_reads():
    settable = [n for n, v in vars(_ulorl.TRLGRPOLossOptions).items() if isinstance(v, property) and v.fset]
    names = _ulorl.record_fields("trl_grpo_loss_options")
    assert settable == [n for n in names if not n.endswith(".value")]
    o = _ulorl.TRLGRPOLossOptions()
    assert o.encoded == _ulorl.record_defaults("trl_grpo_loss_options")
    o.loss_type, o.epsilon_high, o.importance_sampling_level = "vespo", 0.3, "sequence"
    enc = dict(zip(names, o.encoded))
    assert enc["loss_type"] == 7 and enc["epsilon_high"] == 1 and enc["epsilon_high.value"] == 0.3
    assert enc["importance_sampling_level"] == 1
    assert (o.loss_type, o.importance_sampling_level) == ("vespo", "sequence")


def test_trl_grpo_loss_operator_errors_and_double_backward():
    lp, old, adv, mask, ref, ent, o = _trl_case(beta=0.04)
    lp.requires_grad_()
    loss, _ = torch.ops.ulorl.trl_grpo_loss(lp, old, adv, mask, ref, None, None, None, o.encoded)
    (g,) = torch.autograd.grad(loss, lp, create_graph=True)
    with pytest.raises((ulorl.Error, RuntimeError), match="is differentiable once"):
        g.sum().backward()
    with pytest.raises(ValueError, match="argument 'ref_per_token_logps'"):
        torch.ops.ulorl.trl_grpo_loss(lp.detach(), old, adv, mask, ref[:, :-1], None, None, None, o.encoded)
    with pytest.raises(ValueError, match="argument 'completion_mask'"):
        torch.ops.ulorl.trl_grpo_loss(lp.detach(), old, adv, mask.to("meta"), ref, None, None, None, o.encoded)
    with pytest.raises(ValueError, match="config"):
        torch.ops.ulorl.trl_grpo_loss(lp.detach(), old, adv, mask, ref, None, None, None, o.encoded[:-1])
    with pytest.raises(ulorl.Error, match="loss_type"):
        o.loss_type = "nope"


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2")
def test_a_trl_grpo_step_compiles_with_fullgraph_and_gives_the_eager_loss_and_gradients(compiles_like_eager):
    lp0, old, adv, mask, ref, ent0, o = _trl_case(torch.float32, **TRL_CASES[0])
    enc = o.encoded

    def step(lp, ent):
        loss, result = torch.ops.ulorl.trl_grpo_loss(lp * 1.0, old, adv, mask, ref, None, ent, None, enc)
        return loss * 2.0, result

    def run(fn):
        lp, ent = lp0.clone().requires_grad_(), ent0.clone().requires_grad_()
        loss, result = fn(lp, ent)
        loss.backward()
        return loss.detach(), result, lp.grad, ent.grad

    compiles_like_eager(step, run)


@pytest.mark.parametrize("field", ["objective", "kl_estimator", "seq_gradient", "surrogate"])
def test_every_name_the_library_knows_round_trips_through_the_config(field):
    cfg = ulorl.PolicyLossConfig()
    with pytest.raises(ulorl.Error, match=r"unknown name 'nope' \(known: ") as e:
        setattr(cfg, field, "nope")
    names = str(e.value).split("(known: ", 1)[1].rstrip(")").split(", ")
    assert len(names) >= 2
    for name in names:
        setattr(cfg, field, name)
        assert getattr(cfg, field) == name
        assert getattr(cfg.__copy__(), field) == name
    if field == "objective":
        assert "penalized_pg" in names  # a verl dro / kl_cov preset's objective can be assigned back


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.bfloat16, torch.float16,
                                   torch.float64])
def test_a_mask_of_any_integer_or_floating_dtype_gives_the_bool_masks_bits(dtype):
    # The frameworks' int64 / int32 attention masks, and 16-bit or float64 ones, as masks of float32 tokens.
    lp, old, adv, mask, ref, ent = _batch(torch.float32, 4, 9, 3)
    m = mask.to(dtype)
    norm = ulorl.Normalizer("seq_mean_token_mean", 4.0)

    def loss(mk):
        x = lp.clone().requires_grad_()
        out, metrics = ulorl.policy_loss(x, old, adv, mk, ref_log_prob=ref, normalizer=norm, kl_coef=0.05)
        out.backward()
        return out.detach(), x.grad, metrics["tokens"]

    for got, want in zip(loss(m), loss(mask)):
        assert torch.equal(torch.as_tensor(got), torch.as_tensor(want))
    assert torch.equal(ulorl.agg_loss(lp, m, normalizer=norm), ulorl.agg_loss(lp, mask, normalizer=norm))
    a = adv[:, 0].contiguous()
    assert torch.equal(ulorl.broadcast_to_tokens(a, m), ulorl.broadcast_to_tokens(a, mask))
    score = torch.tensor([1.0, 0.0, 1.0, 1.0])
    keep, _ = ulorl.mpt_mask(ent * 0.01, score, log_prob=lp * 0.001, mask=m, mode="static")
    keep_bool, _ = ulorl.mpt_mask(ent * 0.01, score, log_prob=lp * 0.001, mask=mask, mode="static")
    assert keep.dtype == dtype and torch.equal(keep.bool(), keep_bool)
    weights, keep_rc, _ = ulorl.rollout_correction(old, old + 0.01, m, weighting="mask", upper=1.0)
    weights_bool, keep_rc_bool, _ = ulorl.rollout_correction(old, old + 0.01, mask, weighting="mask", upper=1.0)
    assert keep_rc.dtype == dtype and torch.equal(keep_rc.bool(), keep_rc_bool) and torch.equal(weights, weights_bool)
    bad = m.clone()
    bad[1, 2] = 2
    with pytest.raises(ulorl.Error, match=r"argument 'mask'\[11\] = 2: .*0 or 1"):
        ulorl.policy_loss(lp, old, adv, bad, normalizer=norm)
    with pytest.raises(ulorl.Error, match=r"argument 'mask'\[11\] = 2"):
        ulorl.agg_loss(lp, bad, normalizer=norm)


def test_a_complex_mask_is_an_error_naming_its_dtype():
    lp, old, adv, mask, _, _ = _batch(torch.float32)
    with pytest.raises(ulorl.Error, match="argument 'mask': has dtype ComplexFloat but must be bool, an integer or"):
        ulorl.policy_loss(lp, old, adv, mask.to(torch.complex64), normalizer=ulorl.Normalizer("token_mean", 3.0))
