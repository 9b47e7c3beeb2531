"""The batch operators of torch.ops.ulorl (ulorl/adapters/torch/ops_batch.hpp: advantages, token
broadcast, masks, filters, rollout correction, token selection, overlong shaping, batch counts,
float64 logits statistics). Each is registered with its schema; called directly it gives the same
bits as the ulorl function that wraps it (whose values the other test files check against float64
oracles), or, for the token-selection passes, their formulas written here in float64; on meta
tensors it gives the CPU call's shapes and dtypes; its outputs never require grad; a malformed
config is an error naming the field; the records it carries are named by ulorl._ulorl.record_fields."""

import pytest
import torch

import ulorl
from ulorl import _ulorl

B, T = 6, 7


def _config(record, **values):
    """A record's default encoding with some fields set by name (record_fields' names)."""
    names, enc = _ulorl.record_fields(record), _ulorl.record_defaults(record)
    for k, v in values.items():
        enc[names.index(k)] = float(v)
    return enc


def _data(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 2
    return {
        "rewards": (torch.rand(B, generator=g) > 0.5).to(dtype),
        "ids": torch.tensor([0, 0, 0, 1, 1, 1]),
        "mask": torch.arange(T).unsqueeze(0) < torch.tensor([7, 5, 3, 6, 1, 4]).unsqueeze(1),
        "old": old,
        "lp": old + (torch.rand(B, T, generator=g, dtype=dtype) - 0.5) * 0.4,
        "rollout": old + (torch.rand(B, T, generator=g, dtype=dtype) - 0.5) * 0.2,
        "entropy": torch.rand(B, T, generator=g, dtype=dtype),
        "tok_rewards": torch.randn(B, T, generator=g, dtype=dtype),
        "components": torch.rand(B, 3, generator=g, dtype=dtype),
        "spp": torch.rand(B, T, generator=g, dtype=dtype),
        "lengths": torch.tensor([10, 79, 80, 95, 100, 130]),
        "logits": torch.randn(5, 33, generator=g, dtype=torch.float32) * 3,
        "labels": torch.randint(0, 33, (5,), generator=g),
    }


def _cases(d):
    """(operator, its arguments, the ulorl function's outputs for the same call)."""
    verl = ulorl.advantage_preset("verl")
    adv = ulorl.group_advantages(d["rewards"], d["ids"], verl)
    rc = ulorl.rollout_correction_config(level="token", upper=1.5, rejection=[("token", "k3", 0.0, 0.5)])
    w, keep, _ = ulorl.rollout_correction(d["old"], d["rollout"], d["mask"], config=rc)
    dyn_keep, _ = ulorl.dynamic_sampling_filter(d["rewards"], d["ids"])
    mpt_keep, _ = ulorl.mpt_mask(d["entropy"], d["rewards"], log_prob=d["lp"], mask=d["mask"])
    opm = ulorl.off_policy_mask(d["lp"], d["old"], adv, d["mask"], delta=0.01)
    return [
        ("group_advantages", (d["rewards"], d["ids"], None, verl.group_config), (adv,)),
        ("broadcast_to_tokens", (adv, d["mask"], None, verl.broadcast_config),
         (ulorl.broadcast_to_tokens(adv, d["mask"], verl),)),
        ("dynamic_sampling_filter", (d["rewards"], d["ids"], None, _config("dynamic_sampling_config")), (dyn_keep,)),
        ("mpt_mask", (d["lp"], None, d["entropy"], d["mask"], d["rewards"], None, _config("mpt_config")), (mpt_keep,)),
        ("off_policy_mask", (d["lp"], d["old"], adv, d["mask"], None, _config("off_policy_mask_config", delta=0.01)),
         opm[:2]),
        ("rollout_correction", (d["old"], d["rollout"], d["mask"], None, rc.encoded), (w, keep)),
        ("gpg_advantages", (d["rewards"], None, 3, _config("gpg_config")),
         (ulorl.gpg_advantages(d["rewards"], group_size=3),)),
        ("opo_advantages", (d["rewards"], d["mask"], d["ids"], None, None),
         (ulorl.opo_advantages(d["rewards"], d["mask"], d["ids"]),)),
        ("reinforce_plus_plus_advantages", (d["tok_rewards"], d["mask"], None, 0.9, "skip_masked"),
         ulorl.reinforce_plus_plus_advantages(d["tok_rewards"], d["mask"], gamma=0.9, scan="skip_masked")),
        ("reinforce_plus_plus_baseline_advantages",
         (d["rewards"], d["ids"], None, d["mask"], None, _config("reinforce_plus_plus_baseline_config")),
         (ulorl.reinforce_plus_plus_baseline_advantages(d["rewards"], d["mask"], d["ids"]),)),
        ("gae_advantages",
         (d["tok_rewards"], d["spp"], d["mask"], None, _config("gae_config", gamma=0.9, **{"lambda": 0.8})),
         ulorl.gae_advantages(d["tok_rewards"], d["spp"], d["mask"], gamma=0.9, lam=0.8)),
        ("remax_advantages", (d["tok_rewards"], d["rewards"], d["mask"], None),
         ulorl.remax_advantages(d["tok_rewards"], d["rewards"], d["mask"])),
        ("pass_at_k_advantages", (d["components"][:, 0].contiguous(), d["ids"], None, _config("pass_at_k_config")),
         (ulorl.pass_at_k_advantages(d["components"][:, 0].contiguous(), d["ids"]),)),
        ("multi_reward_advantages",
         (d["components"], [1.0, 0.5, 2.0], d["ids"], None, d["mask"], None, _config("multi_reward_config")), None),
        ("optimal_token_baseline_advantages",
         (d["tok_rewards"], d["mask"], d["ids"], d["old"], d["spp"], None, None,
          _config("optimal_token_baseline_config")),
         ulorl.optimal_token_baseline_advantages(d["tok_rewards"], d["mask"], d["ids"], old_log_prob=d["old"],
                                                 sum_pi_squared=d["spp"])),
        ("dapo_overlong_penalties",
         (d["lengths"], _config("dapo_overlong_config", max_length=100, buffer_length=20, penalty_factor=0.5)),
         (ulorl.overlong_penalty(d["lengths"], "dapo", max_length=100, buffer_length=20, penalty_factor=0.5),)),
        ("soft_overlong_penalties", (d["lengths"], _config("soft_overlong_config", max_length=100, cache_length=20)),
         (ulorl.overlong_penalty(d["lengths"], "trl", max_length=100, cache_length=20),)),
        ("dppo_weights",
         (d["old"], d["lp"], d["tok_rewards"], d["mask"], d["spp"], None,
          _config("dppo_config", delta_low=0.02, delta_high=0.03, ratio_cap=1.1)),
         (_dppo_tv(d, 0.02, 0.03, 1.1),)),
        ("kl_cov_selection", (d["old"], d["lp"], d["tok_rewards"], d["mask"], None, _config("kl_cov_config", fraction=0.1)),
         (_kl_cov(d, 0.1),)),
        ("clip_cov_weights",
         (d["old"], d["lp"], d["tok_rewards"], d["mask"], _clip_cov_draw(d, 0.1), d["spp"], None,
          _config("clip_cov_config", fraction=0.1, cov_lower=-1.0, cov_upper=1.0)),
         (d["spp"] * (1 - _clip_cov_draw(d, 0.1)),)),
        ("logits_statistics_float64", (d["logits"], d["labels"], 0.7, True),
         ulorl.logits_statistics(d["logits"], d["labels"], 0.7)),
        ("count_batch", (d["mask"], None, None),
         (torch.tensor([d["mask"].sum().item(), (d["mask"].sum(1) > 0).sum().item(), B], dtype=torch.float64),)),
    ]


def _cov(d):
    """(A - mean A)(logp - mean logp) over the valid tokens, and the valid tokens' mask."""
    m = d["mask"]
    a, lp = d["tok_rewards"], d["lp"]
    return (a - a[m].mean()) * (lp - lp[m].mean()), m


def _dppo_tv(d, dl, dh, cap):
    """DPPO Binary-TV in float64: w min(r, cap) v, v = [p - p0 <= dh] for A > 0, [p - p0 >= -dl] else."""
    lp, old, a = d["lp"].double(), d["old"].double(), d["tok_rewards"].double()
    diff = lp.exp() - old.exp()
    v = torch.where(a > 0, diff <= dh, diff >= -dl)
    r = (lp - old).clamp(-20, 20).exp()
    return (d["spp"].double() * torch.minimum(r, torch.tensor(cap, dtype=torch.float64)) * v).to(d["lp"].dtype)


def _kl_cov(d, fraction):
    """KL-Cov: 1 on the max(1, floor(n fraction)) valid tokens of largest cov (ties by position)."""
    cov, m = _cov(d)
    flat = cov.flatten()[m.flatten()]
    pos = torch.nonzero(m.flatten()).flatten()
    k = max(1, int(flat.numel() * fraction))
    order = sorted(range(flat.numel()), key=lambda i: (-flat[i].item(), i))[:k]
    out = torch.zeros(cov.numel(), dtype=d["lp"].dtype)
    out[pos[order]] = 1
    return out.reshape(cov.shape)


def _clip_cov_draw(d, fraction):
    """A valid Clip-Cov draw: the first min(max(floor(n fraction), 1), #candidates) candidates (valid,
    not clipped at 0.2 / 0.2, -1 < cov < 1)."""
    cov, m = _cov(d)
    r = (d["lp"] - d["old"]).exp()
    a = d["tok_rewards"]
    clipped = -a * r.clamp(0.8, 1.2) > -a * r
    cand = (m & ~clipped & (cov > -1.0) & (cov < 1.0)).flatten()
    k = min(max(int(m.sum().item() * fraction), 1), int(cand.sum().item()))
    sel = torch.zeros(cand.numel(), dtype=d["lp"].dtype)
    sel[torch.nonzero(cand).flatten()[:k]] = 1
    return sel.reshape(cov.shape)


CASES = [c[0] for c in _cases(_data())]


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def test_every_batch_operator_is_registered_with_its_schema():
    assert len(CASES) == 22
    for name in CASES:
        schema = str(getattr(torch.ops.ulorl, name).default._schema)
        assert schema.startswith(f"ulorl::{name}(")


@pytest.mark.parametrize("name", CASES)
def test_the_operator_gives_the_wrapping_functions_bits(name):
    d = _data(seed=1)
    _, args, expected = next(c for c in _cases(d) if c[0] == name)
    out = _as_tuple(getattr(torch.ops.ulorl, name)(*args))
    if expected is None:  # no wrapper with this configuration: the call runs and is finite
        assert all(torch.isfinite(o).all() for o in out if o.is_floating_point())
        return
    for got, want in zip(out, expected):
        assert got.dtype == want.dtype and torch.equal(got, want), name


@pytest.mark.parametrize("name", CASES)
def test_meta_tensors_give_the_cpu_shapes_and_dtypes(name):
    d = _data(seed=2)
    _, args, _ = next(c for c in _cases(d) if c[0] == name)
    cpu = _as_tuple(getattr(torch.ops.ulorl, name)(*args))
    meta_args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    meta = _as_tuple(getattr(torch.ops.ulorl, name)(*meta_args))
    assert len(cpu) == len(meta)
    for c, m in zip(cpu, meta):
        assert m.is_meta and m.shape == c.shape and m.dtype == c.dtype, name


@pytest.mark.parametrize("name", CASES)
def test_outputs_never_require_grad(name):
    d = _data(seed=3)
    _, args, _ = next(c for c in _cases(d) if c[0] == name)
    args = [a.clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    for out in _as_tuple(getattr(torch.ops.ulorl, name)(*args)):
        assert not out.requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_float64_logits_statistics_against_log_softmax(dtype):
    d = _data(seed=5)
    z = d["logits"].to(dtype)
    lp, ent, lse = torch.ops.ulorl.logits_statistics_float64(z, d["labels"], 0.7, True)
    x = z.double() / 0.7
    logp = torch.log_softmax(x, -1)
    assert lp.dtype == ent.dtype == lse.dtype == torch.float64
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lp, logp.gather(1, d["labels"][:, None])[:, 0], **tol)
    torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1), **tol)
    torch.testing.assert_close(lse, torch.logsumexp(x, -1), **tol)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.bfloat16, torch.float16])
def test_count_batch_reads_integer_and_16_bit_masks(dtype):
    d = _data(seed=6)
    want = torch.ops.ulorl.count_batch(d["mask"], None, None)
    assert torch.equal(torch.ops.ulorl.count_batch(d["mask"].to(dtype), None, None), want)
    bad = d["mask"].to(dtype)
    bad[1, 0] = 2
    with pytest.raises((ulorl.Error, ValueError), match=r"argument 'mask'\[7\] = 2"):
        torch.ops.ulorl.count_batch(bad, None, None)
    with pytest.raises((ulorl.Error, ValueError), match="must be bool, an integer or a floating type"):
        torch.ops.ulorl.count_batch(d["mask"].to(torch.complex64), None, None)


def test_result_tensors_are_the_records_that_record_fields_names():
    d = _data(seed=4)
    keep, counts = torch.ops.ulorl.dynamic_sampling_filter(d["rewards"], d["ids"], None,
                                                           _config("dynamic_sampling_config"))
    fields = dict(zip(_ulorl.record_fields("dynamic_sampling_result"), counts.tolist()))
    assert fields["groups"] == 2 and fields["kept_responses"] == keep.sum().item()
    rc = ulorl.rollout_correction_config(level="token", upper=1.5)
    _, _, stats = torch.ops.ulorl.rollout_correction(d["old"], d["rollout"], d["mask"], None, rc.encoded)
    s = dict(zip(_ulorl.record_fields("rollout_correction_statistics"), stats.tolist()))
    assert s["rows"] == B and s["tokens"] == d["mask"].sum().item()
    with pytest.raises(ulorl.Error, match="unknown record 'nope'"):
        _ulorl.record_fields("nope")


@pytest.mark.parametrize("edit, what", [
    (lambda c: c[:-1], "values but an encoded group_advantage_config has"),
    (lambda c: [7.0] + c[1:], "argument 'config.baseline' = 7: unknown enum value"),
    (lambda c: [0.5] + c[1:], "field 'baseline'"),
])
def test_a_malformed_config_is_an_error_naming_the_field(edit, what):
    d = _data()
    with pytest.raises(ValueError, match=what):  # ulorl.Error, or its base where torch's pybind11 is not ours
        torch.ops.ulorl.group_advantages(d["rewards"], d["ids"], None, edit(_config("group_advantage_config")))


def test_an_enum_beyond_its_underlying_type_is_an_error_not_a_wrapped_value():
    d = _data()
    # mpt_config.mode is a uint8 enum: 257 would wrap onto 1 (static_mask) if it were cast.
    with pytest.raises(ValueError, match="field 'mode'"):
        torch.ops.ulorl.mpt_mask(d["lp"], None, d["entropy"], d["mask"], d["rewards"], None,
                                 _config("mpt_config", mode=257))


def test_groups_are_ids_or_a_size_not_both_nor_neither():
    d = _data()
    enc = _config("group_advantage_config")
    with pytest.raises(ValueError, match="give group_ids or group_size, not both"):
        torch.ops.ulorl.group_advantages(d["rewards"], d["ids"], 3, enc)
    with pytest.raises(ValueError, match="argument 'group_ids': required"):
        torch.ops.ulorl.group_advantages(d["rewards"], None, None, enc)
    with pytest.raises(ulorl.Error, match="give group_ids or group_size, not both"):
        ulorl.group_advantages(d["rewards"], d["ids"], group_size=3)


def test_a_packed_broadcast_without_a_mask_has_no_meta_shape():
    offsets = torch.tensor([0, 3, 5])
    enc = ulorl.advantage_preset("verl").broadcast_config
    out = torch.ops.ulorl.broadcast_to_tokens(torch.tensor([1.0, -1.0], dtype=torch.float64), None, offsets, enc)
    assert out.tolist() == [1.0, 1.0, 1.0, -1.0, -1.0]
    with pytest.raises(ValueError, match="argument 'mask': is required for a shape-only"):
        torch.ops.ulorl.broadcast_to_tokens(torch.zeros(2, device="meta", dtype=torch.float64), None,
                                            offsets.to("meta"), enc)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2")
def test_a_grpo_step_from_rewards_compiles_with_fullgraph_and_gives_the_eager_loss_and_gradient(compiles_like_eager):
    d = _data(seed=5, dtype=torch.float32)
    verl = ulorl.advantage_preset("verl")
    gcfg, bcfg, mcfg = verl.group_config, verl.broadcast_config, _config("mpt_config", tau=0.5)
    enc = _ulorl.encode_fields(ulorl.policy_loss_config(eps_high=0.28, kl_coef=0.05,
                                                        normalizer=ulorl.Normalizer("token_mean", 17.0)))
    rewards, ids, mask, old, ent = d["rewards"], d["ids"], d["mask"], d["old"], d["entropy"]

    def step(lp):
        adv = torch.ops.ulorl.group_advantages(rewards, ids, None, gcfg)
        tok = torch.ops.ulorl.broadcast_to_tokens(adv, mask, None, bcfg)
        keep, _ = torch.ops.ulorl.mpt_mask(lp.detach(), None, ent, mask, rewards, None, mcfg)
        loss, result = torch.ops.ulorl.policy_loss(lp, old, tok, keep, d["rollout"], None, None, None, None, enc)
        return loss * 2.0, result, keep

    def run(fn):
        lp = d["lp"].clone().requires_grad_()
        loss, result, keep = fn(lp)
        loss.backward()
        return loss.detach(), result, keep, lp.grad

    compiles_like_eager(step, run)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float64])
def test_overlong_penalties_take_the_lengths_dtypes_users_have(dtype):
    lengths = torch.tensor([10, 85, 100, 101]).to(dtype)
    # DAPO: min(-(L - 80) / 20 * 1, 0); TRL: 0 up to 80, (80 - L) / 20 to 100, -1 beyond.
    dapo = torch.ops.ulorl.dapo_overlong_penalties(lengths, _config("dapo_overlong_config", max_length=100,
                                                                    buffer_length=20, penalty_factor=1.0))
    trl = torch.ops.ulorl.soft_overlong_penalties(lengths, _config("soft_overlong_config", max_length=100,
                                                                   cache_length=20))
    assert dapo.dtype == torch.float64 and dapo.tolist() == [0.0, -0.25, -1.0, -1.05]
    assert trl.dtype == torch.float64 and trl.tolist() == [0.0, -0.25, -1.0, -1.0]


def test_overlong_penalties_name_a_bad_length_and_a_bad_dtype():
    enc = _config("dapo_overlong_config", max_length=100, buffer_length=20)
    with pytest.raises(ValueError, match=r"argument 'lengths'\[1\] = -3: must be finite and >= 0"):
        torch.ops.ulorl.dapo_overlong_penalties(torch.tensor([5, -3]), enc)
    with pytest.raises(ValueError, match="argument 'lengths': must be int64, int32, float32 or float64"):
        torch.ops.ulorl.dapo_overlong_penalties(torch.tensor([5, 3], dtype=torch.uint8), enc)
    with pytest.raises(ValueError, match="config.buffer_length"):
        torch.ops.ulorl.dapo_overlong_penalties(torch.tensor([5, 3]), _config("dapo_overlong_config", max_length=100))


def test_token_selection_statistics_and_errors():
    d = _data(seed=5)
    w, stats = torch.ops.ulorl.dppo_weights(d["old"], d["lp"], d["tok_rewards"], d["mask"], None, None,
                                            _config("dppo_config", delta_low=0.02, delta_high=0.03))
    s = dict(zip(_ulorl.record_fields("token_selection_stats"), stats.tolist()))
    diff = d["lp"].exp() - d["old"].exp()
    v = torch.where(d["tok_rewards"] > 0, diff <= 0.03, diff >= -0.02)
    assert s["dropped_fraction"] == pytest.approx((~v)[d["mask"]].double().mean().item(), rel=1e-15)
    assert torch.equal(w == 0, ~v)
    # A draw marking a token that is not a candidate names the draw and the token (through torch.ops
    # ulorl.Error, or its base ValueError where torch's pybind11 is not ours).
    with pytest.raises(ValueError, match=r"'clip_cov_selection'\[\d+\]"):
        torch.ops.ulorl.clip_cov_weights(d["old"], d["lp"], d["tok_rewards"], d["mask"], torch.ones(B, T, dtype=torch.float64), None, None,
                                         _config("clip_cov_config"))
    with pytest.raises(ValueError, match="mask"):
        torch.ops.ulorl.kl_cov_selection(d["old"], d["lp"], d["tok_rewards"], d["mask"][:, :3], None,
                                         _config("kl_cov_config"))
    with pytest.raises(ulorl.Error, match="rollout_is_weights"):
        _ulorl._verl_kl_cov_selection(0.1, 1.0, d["old"], d["lp"], d["tok_rewards"], d["mask"], d["spp"][:, :3])
