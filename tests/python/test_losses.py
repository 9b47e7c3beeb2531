"""ulorl's losses through Python against the independent float64 oracles of oracles.py (values and
autograd gradients), torch.autograd.gradcheck, and properties (masked tokens contribute nothing,
float32 close to float64, packed layout equals padded, mask=None gives the bits of an all-ones mask)."""

import math
import os
import subprocess
import sys

import pytest
import torch

import oracles
import ulorl


def batch(gen, B=5, T=9, dtype=torch.float64, spread=0.4):
    lp = -torch.rand(B, T, generator=gen, dtype=dtype) * 3 - 0.05
    old = lp + torch.randn(B, T, generator=gen, dtype=dtype) * spread
    adv = torch.randn(B, T, generator=gen, dtype=dtype)
    mask = torch.rand(B, T, generator=gen) < 0.75
    mask[0] = False  # an empty row
    mask[1, 0] = True
    ref = lp + torch.randn(B, T, generator=gen, dtype=dtype) * 0.3
    ent = torch.rand(B, T, generator=gen, dtype=dtype) * 2
    w = torch.rand(B, T, generator=gen, dtype=dtype) + 0.5
    return lp, old, adv, mask, ref, ent, w


CASES = [
    dict(objective="ppo_clip", eps_low=0.2, eps_high=0.2),
    dict(objective="ppo_clip", eps_low=0.2, eps_high=0.28, dual_clip=3.0),
    dict(objective="ppo_clip", eps_low=0.2, eps_high=0.28, delta=1.5, log_ratio_clamp=None),
    dict(objective="cispo", eps_low=0.2, eps_high=0.28),
    dict(objective="policy_gradient"),
]
AGGS = [("token_mean", None), ("seq_mean_token_sum", None), ("seq_mean_token_mean", None),
        ("seq_mean_token_sum_norm", 9.0), ("constant", 45.0)]


def ulorl_options(case):
    o = dict(case)
    if o.get("log_ratio_clamp", 0) is None:
        o["log_ratio_clamp"] = math.inf
    o.setdefault("dual_clip", None)
    o.setdefault("delta", None)
    o["dual_clip"] = o["dual_clip"] or 0.0
    o["delta"] = o["delta"] or 0.0
    return o


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("agg", AGGS)
def test_policy_loss_matches_oracle(gen, case, agg):
    lp, old, adv, mask, ref, ent, w = batch(gen)
    mode, constant = agg
    for kl in (None, ("k3", 20.0, 10.0), ("k1", None, None), ("k2", None, 1.0)):
        x = lp.clone().requires_grad_()
        h = ent.clone().requires_grad_()
        kw = dict(objective=case["objective"], eps_low=case.get("eps_low", 0.2), eps_high=case.get("eps_high", 0.2),
                  dual_clip=case.get("dual_clip"), delta=case.get("delta"),
                  log_ratio_clamp=case.get("log_ratio_clamp", 20.0), weights=w, entropy=h, entropy_coef=0.01,
                  agg=mode, constant=constant)
        opts = ulorl_options(case)
        if kl is not None:
            kw.update(ref=ref, kl_coef=0.05, kl_estimator=kl[0], kl_input_clamp=kl[1], kl_output_clamp=kl[2])
            opts.update(kl_coef=0.05, kl_estimator=kl[0], kl_input_clamp=kl[1] or math.inf,
                        kl_output_clamp=kl[2] or math.inf)
        want = oracles.policy_loss(x, old, adv, mask, **kw)
        gx, gh = torch.autograd.grad(want, (x, h))
        y = lp.clone().requires_grad_()
        e = ent.clone().requires_grad_()
        loss, metrics = ulorl.policy_loss(y, old, adv, mask, ref_log_prob=ref if kl else None, entropy=e,
                                          weights=w, agg_mode=mode, agg_constant=constant or 0.0, entropy_coef=0.01,
                                          **opts)
        loss.backward()
        assert loss.dtype == torch.float64 and loss.dim() == 0
        torch.testing.assert_close(loss, want.detach(), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(y.grad, gx, rtol=1e-11, atol=1e-14)
        torch.testing.assert_close(e.grad, gh, rtol=1e-11, atol=1e-14)
        assert metrics["loss"] == pytest.approx(loss.item(), rel=1e-15, abs=0)
        assert metrics["tokens"] == mask.sum().item()
        assert metrics["sequences"] == (mask.sum(-1) > 0).sum().item()
        assert metrics["pg_loss"] + metrics["kl_loss"] + metrics["entropy_loss"] == pytest.approx(metrics["loss"])


def test_metrics_match_oracle(gen):
    lp, old, adv, mask, *_ = batch(gen, B=7, T=33, spread=0.6)
    _, m = ulorl.policy_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    r = torch.exp(torch.clamp(lp - old, -20, 20))
    mf = mask.double()
    n = mf.sum()
    low = ((r < 0.8) & (adv < 0) & mask).sum() / n
    high = ((r > 1.28) & (adv > 0) & mask).sum() / n
    assert m["clip_low_fraction"] == pytest.approx(low.item(), abs=1e-15)
    assert m["clip_high_fraction"] == pytest.approx(high.item(), abs=1e-15)
    assert m["approx_kl_k1"] == pytest.approx(((old - lp) * mf).sum().item() / n.item(), rel=1e-12)
    assert m["ratio_mean"] == pytest.approx(((r * mf).sum() / n).item(), rel=1e-12)
    assert m["ratio_max"] == pytest.approx(r[mask].max().item(), rel=1e-14)


def test_masked_tokens_contribute_nothing(gen):
    lp, old, adv, mask, *_ = batch(gen)
    x = lp.clone().requires_grad_()
    loss, _ = ulorl.policy_loss(x, old, adv, mask)
    loss.backward()
    assert torch.all(x.grad[~mask] == 0)
    old2, adv2 = old.clone(), adv.clone()
    old2[~mask] = 123.0
    adv2[~mask] = -7.0
    loss2, _ = ulorl.policy_loss(lp, old2, adv2, mask)
    assert loss2.item() == loss.item()


def test_ratio_one_leaves_clipping_inactive(gen):
    lp, _, adv, mask, *_ = batch(gen)
    _, m = ulorl.policy_loss(lp, lp.clone(), adv, mask, eps_low=0.01, eps_high=0.01)
    assert m["clip_fraction"] == 0.0 and m["ratio_mean"] == pytest.approx(1.0)


def test_packed_layout_equals_padded(gen):
    lp, old, adv, mask, ref, ent, w = batch(gen)
    mask[:, :] = True
    lens = torch.tensor([3, 9, 1, 5, 7])
    for b, n in enumerate(lens.tolist()):
        mask[b, n:] = False
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    pack = lambda t: torch.cat([t[b, :n] for b, n in enumerate(lens.tolist())])  # noqa: E731
    for mode in ("token_mean", "seq_mean_token_mean"):
        x = lp.clone().requires_grad_()
        loss, _ = ulorl.policy_loss(x, old, adv, mask, agg_mode=mode, eps_high=0.28)
        loss.backward()
        y = pack(lp).requires_grad_()
        lossp, _ = ulorl.policy_loss(y, pack(old), pack(adv), torch.ones(int(lens.sum()), dtype=torch.bool),
                                     offsets=offsets, agg_mode=mode, eps_high=0.28)
        lossp.backward()
        torch.testing.assert_close(lossp, loss, rtol=1e-14, atol=0)
        torch.testing.assert_close(y.grad, pack(x.grad), rtol=1e-14, atol=0)


def test_float32_close_to_float64(gen):
    lp, old, adv, mask, *_ = batch(gen, B=16, T=64)
    l64, _ = ulorl.policy_loss(lp, old, adv, mask, eps_high=0.28)
    l32, _ = ulorl.policy_loss(lp.float(), old.float(), adv.float(), mask, eps_high=0.28)
    assert l32.dtype == torch.float32
    assert l32.item() == pytest.approx(l64.item(), rel=1e-5, abs=1e-6)


def test_gradcheck_policy_loss(gen):
    lp, old, adv, mask, ref, ent, w = batch(gen, B=3, T=5, spread=0.1)
    x = lp.clone().requires_grad_()
    h = ent.clone().requires_grad_()

    def loss_of(a, b):
        return ulorl.policy_loss(a, old, adv, mask, ref_log_prob=ref, entropy=b, weights=w, kl_coef=0.1,
                                 entropy_coef=0.02, eps_low=0.3, eps_high=0.4)[0]

    class Fresh(torch.autograd.Function):
        """ulorl's loss supports one backward per forward (its saved gradient is handed to autograd
        without a copy); gradcheck differentiates one output several times. Each backward here
        runs a fresh ulorl forward + backward, so the gradient checked is ulorl's own."""

        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            with torch.no_grad():
                return loss_of(a, b)

        @staticmethod
        def backward(ctx, g):
            a, b = (t.detach().requires_grad_() for t in ctx.saved_tensors)
            with torch.enable_grad():
                ga, gb = torch.autograd.grad(loss_of(a, b), (a, b))
            return g * ga, g * gb

    assert torch.autograd.gradcheck(Fresh.apply, (x, h), eps=1e-6, atol=1e-8)


def test_logprobs_from_logits_matches_oracle_and_gradcheck(gen):
    logits = torch.randn(6, 11, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, 11, (6,), generator=gen)
    for temp in (1.0, 0.7):
        z = logits.clone().requires_grad_()
        lp, ent = ulorl.logprobs_from_logits(z, labels, temperature=temp)
        wlp, went = oracles.logits_statistics(logits, labels, temp)
        torch.testing.assert_close(lp, wlp, rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(ent, went, rtol=1e-13, atol=1e-13)
        g1 = torch.randn(6, generator=gen, dtype=torch.float64)
        g2 = torch.randn(6, generator=gen, dtype=torch.float64)
        (lp * g1 + ent * g2).sum().backward()
        zz = logits.clone().requires_grad_()
        a, b = oracles.logits_statistics(zz, labels, temp)
        (a * g1 + b * g2).sum().backward()
        torch.testing.assert_close(z.grad, zz.grad, rtol=1e-11, atol=1e-13)
    z = logits[:3, :5].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: ulorl.logprobs_from_logits(t, labels[:3] % 5, 0.9), (z,), eps=1e-6,
                                    atol=1e-8)
    # the statistics come in the logits' dtype (as torch.log_softmax), rounded once from float32
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        lp, ent = ulorl.logprobs_from_logits(logits.to(dtype), labels)
        assert lp.dtype == ent.dtype == dtype


def test_policy_loss_from_logits_matches_composition(gen):
    B, T, V = 3, 4, 13
    logits = torch.randn(B * T, V, generator=gen, dtype=torch.float64) * 2
    labels = torch.randint(0, V, (B * T,), generator=gen)
    old = torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3 - 2.5
    adv = torch.randn(B, T, generator=gen, dtype=torch.float64)
    ref = old + 0.1
    mask = torch.rand(B, T, generator=gen) < 0.8
    mask[0, 0] = True
    z = logits.clone().requires_grad_()
    lp, _ = oracles.logits_statistics(z, labels, 0.8)
    want = oracles.policy_loss(lp.view(B, T), old, adv, mask, eps_low=0.2, eps_high=0.28, ref=ref, kl_coef=0.04,
                               kl_estimator="k3")
    want.backward()
    for in_place in (False, True):
        y = logits.clone().requires_grad_()
        inp = y * 1.0 if in_place else y  # in place writes into a non-leaf's memory
        loss, m = ulorl.policy_loss_from_logits(inp, labels, old, adv, mask, temperature=0.8, in_place=in_place,
                                                ref_log_prob=ref, kl_coef=0.04, eps_high=0.28)
        loss.backward()
        torch.testing.assert_close(loss, want.detach(), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(y.grad, z.grad, rtol=1e-10, atol=1e-13)
        assert m["log_prob"].shape == (B, T)


def test_linear_head_policy_loss_matches_composition(gen):
    B, T, H, V = 2, 5, 6, 17
    hidden = torch.randn(B * T, H, generator=gen, dtype=torch.float64)
    weight = torch.randn(V, H, generator=gen, dtype=torch.float64) * 0.5
    bias = torch.randn(V, generator=gen, dtype=torch.float64) * 0.1
    labels = torch.randint(0, V, (B * T,), generator=gen)
    old = torch.randn(B, T, generator=gen, dtype=torch.float64) * 0.3 - 2.8
    adv = torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    ps = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    lp, _ = oracles.logits_statistics(ps[0] @ ps[1].T + ps[2], labels)
    want = oracles.aggregate(oracles.token_objective(lp.view(B, T), old, adv, eps_low=0.2, eps_high=0.28),
                             mask, "seq_mean_token_mean")
    want.backward()
    qs = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    loss, _ = ulorl.linear_head_policy_loss(*qs, labels, old, adv, mask, chunk_rows=3, eps_high=0.28,
                                            agg_mode="seq_mean_token_mean")
    loss.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=1e-12, atol=1e-14)
    for p, q in zip(ps, qs):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-13)


def test_group_advantages_against_oracle(gen):
    import numpy as np

    scores = torch.randn(13, generator=gen, dtype=torch.float64)
    ids = torch.tensor([4, 4, 4, 9, 9, 1, 1, 1, 1, 7, 2, 2, 2])
    got = ulorl.group_advantages(scores, ids, "verl")
    torch.testing.assert_close(got, oracles.group_advantages(scores, ids, 1e-6, singleton="identity"),
                               rtol=1e-13, atol=1e-14)
    got = ulorl.group_advantages(scores, ids, "open_instruct", estimator="standard")
    torch.testing.assert_close(got, oracles.group_advantages(scores, ids, 1e-8, unbiased=False), rtol=1e-13,
                               atol=1e-14)
    got = ulorl.group_advantages(scores, ids, "verl", estimator="rloo")
    torch.testing.assert_close(got, oracles.group_advantages(scores, ids, 0, scale=False, leave_one_out=True,
                                                             singleton="identity"), rtol=1e-13, atol=1e-14)
    # numpy in, numpy out; advantages of a group sum to zero
    a = ulorl.group_advantages(scores[:12].numpy(), preset="trl", group_size=4)
    assert isinstance(a, np.ndarray)
    assert np.allclose(a.reshape(3, 4).sum(1), 0, atol=1e-12)
    mask = torch.rand(13, 6, generator=gen) < 0.7
    tok = ulorl.broadcast_to_tokens(got, mask, "verl")
    torch.testing.assert_close(tok, got.unsqueeze(1) * mask.double())


def test_dynamic_sampling_and_overlong(gen):
    import numpy as np

    acc = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    keep, st = ulorl.dynamic_sampling_filter(acc, ids)
    assert keep.tolist() == [False, False, True, True, True, True, False, False]
    assert st["kept_groups"] == 2 and st["zero_variance_groups"] == 2
    L = np.array([10.0, 80.0, 95.0, 100.0, 130.0])
    p = ulorl.overlong_penalty(L, "dapo", max_length=100, buffer_length=20, penalty_factor=1.0)
    want = np.minimum(-(L - 80.0) / 20.0, 0.0)
    assert np.allclose(p, want, rtol=0, atol=1e-15)
    q = ulorl.overlong_penalty(torch.tensor([10, 85, 100, 101]), "trl", max_length=100, cache_length=20)
    assert torch.allclose(q, torch.tensor([0.0, -0.25, -1.0, -1.0], dtype=torch.float64))


def test_mpt_mask_against_oracle(gen):
    B, T = 4, 6
    lp = torch.log(torch.rand(B, T, generator=gen, dtype=torch.float64) * 0.02 + 0.98)
    lp[:, ::2] = -1.0
    ent = torch.rand(B, T, generator=gen, dtype=torch.float64) * 0.3
    mask = torch.ones(B, T, dtype=torch.bool)
    score = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    keep, st = ulorl.mpt_mask(ent, score, log_prob=lp, mask=mask, mode="static", tau=0.99)
    mpt = (score.unsqueeze(1) >= 1.0) & (lp.exp() >= 0.99)
    assert torch.equal(keep, mask & ~mpt)
    assert st["mpt_tokens"] == int(mpt.sum())
    keep, _ = ulorl.mpt_mask(ent, score, log_prob=lp, mask=mask, mode="dynamic", tau=0.99, sigma=0.2)
    below = ent.mean(-1, keepdim=True) < 0.2
    assert torch.equal(keep, mask & ~(mpt & below))


def test_config_object_equals_keyword_options(gen):
    lp, old, adv, mask, ref, *_ = batch(gen)
    norm = ulorl.global_normalizer("seq_mean_token_mean", ulorl.count_batch(mask))
    cfg = ulorl.policy_loss_config(eps_low=0.2, eps_high=0.28, kl_coef=0.1, kl_estimator="k2")
    a, ma = ulorl.policy_loss(lp, old, adv, mask, ref_log_prob=ref, config=cfg, normalizer=norm)
    b, mb = ulorl.policy_loss(lp, old, adv, mask, ref_log_prob=ref, eps_low=0.2, eps_high=0.28, kl_coef=0.1,
                              kl_estimator="k2", agg_mode="seq_mean_token_mean")
    assert a.item() == b.item() and ma == mb
    assert cfg.normalizer.denominator == 0.0  # the caller's config is not modified
    with pytest.raises(ulorl.Error, match="normalizer.denominator"):
        ulorl.policy_loss(lp, old, adv, mask, config=cfg, ref_log_prob=ref)  # a config carries its normaliser
    with pytest.raises(ulorl.Error, match="either config"):
        ulorl.policy_loss(lp, old, adv, mask, config=cfg, eps_low=0.1)
    cfg.normalizer = norm
    c, _ = ulorl.policy_loss(lp, old, adv, mask, ref_log_prob=ref, config=cfg)
    assert c.item() == a.item()


def _layouts():
    """(tok, offsets) for the padded [5, 9] layout and for a packed one with rows of 3, 9, 0, 5 and 7
    tokens (an empty row included): tok maps a [5, 9] tensor to the layout's token tensor."""
    lens = [3, 9, 0, 5, 7]
    offsets = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64)
    pack = lambda t: torch.cat([t[b, :n] for b, n in enumerate(lens)])  # noqa: E731
    return [(lambda t: t, None), (pack, offsets)]


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_policy_loss_mask_none_is_all_ones(gen, agg):
    lp, old, adv, _, ref, ent, w = batch(gen)
    ro = old + torch.randn(old.shape, generator=gen, dtype=old.dtype) * 0.2
    for tok, offsets in _layouts():
        ones = torch.ones(tok(lp).shape, dtype=torch.bool)
        for rc in (None, ulorl.rollout_correction_config()):
            kw = dict(ref_log_prob=tok(ref), offsets=offsets, agg_mode=agg, kl_coef=0.05, entropy_coef=0.01,
                      eps_high=0.28, rollout_log_prob=tok(ro) if rc else None, rollout_correction=rc,
                      weights=None if rc else tok(w))
            x1, h1 = tok(lp).clone().requires_grad_(), tok(ent).clone().requires_grad_()
            x2, h2 = tok(lp).clone().requires_grad_(), tok(ent).clone().requires_grad_()
            l1, m1 = ulorl.policy_loss(x1, tok(old), tok(adv), ones, entropy=h1, **kw)
            l2, m2 = ulorl.policy_loss(x2, tok(old), tok(adv), entropy=h2, **kw)  # mask=None by default
            l1.backward()
            l2.backward()
            assert m2["tokens"] == ones.sum().item()
            assert torch.equal(l1, l2)
            if rc:
                s1, s2 = m1.pop("rollout"), m2.pop("rollout")
                assert s2.tokens == ones.sum().item()
                assert ulorl.rollout_correction_finalize(s1, rc) == ulorl.rollout_correction_finalize(s2, rc)
            assert m1 == m2
            assert torch.equal(x1.grad, x2.grad)
            assert torch.equal(h1.grad, h2.grad)


def test_fused_losses_mask_none_is_all_ones(gen):
    B, T, H, V = 5, 9, 6, 17
    _, old, adv, _, ref, _, w = batch(gen, B, T)
    for tok, offsets in _layouts():
        o, a = tok(old), tok(adv)
        n = o.numel()
        ones = torch.ones(o.shape, dtype=torch.bool)
        kw = dict(ref_log_prob=tok(ref), weights=tok(w), offsets=offsets, kl_coef=0.05, entropy_coef=0.01,
                  eps_high=0.28, agg_mode="seq_mean_token_mean")
        logits = torch.randn(n, V, generator=gen, dtype=torch.float64) * 2
        labels = torch.randint(0, V, (n,), generator=gen)
        z1, z2 = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        l1, m1 = ulorl.policy_loss_from_logits(z1, labels, o, a, ones, temperature=0.9, **kw)
        l2, m2 = ulorl.policy_loss_from_logits(z2, labels, o, a, mask=None, temperature=0.9, **kw)
        l1.backward()
        l2.backward()
        assert torch.equal(l1, l2)
        for key in ("log_prob", "entropy"):
            assert torch.equal(m1.pop(key), m2.pop(key))
        assert m2["tokens"] == n and m1 == m2
        assert torch.equal(z1.grad, z2.grad)

        hidden = torch.randn(n, H, generator=gen, dtype=torch.float64)
        weight = torch.randn(V, H, generator=gen, dtype=torch.float64) * 0.5
        bias = torch.randn(V, generator=gen, dtype=torch.float64) * 0.1
        ps = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        qs = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        l1, m1 = ulorl.linear_head_policy_loss(*ps, labels, o, a, ones, chunk_rows=4, **kw)
        l2, m2 = ulorl.linear_head_policy_loss(*qs, labels, o, a, chunk_rows=4, **kw)  # mask=None by default
        l1.backward()
        l2.backward()
        assert torch.equal(l1, l2)
        for key in ("log_prob", "entropy"):
            assert torch.equal(m1.pop(key), m2.pop(key))
        assert m1 == m2
        for p, q in zip(ps, qs):
            assert torch.equal(p.grad, q.grad)


def test_mask_none_counts_and_broadcast(gen):
    lp, old, adv, *_ = batch(gen)
    (_, _), (pack, offsets) = _layouts()
    # count_batch: a None mask counts every token of `tokens`' layout; without tokens it is required.
    assert ulorl.count_batch(tokens=lp).to_list() == ulorl.count_batch(torch.ones(5, 9, dtype=torch.bool)).to_list()
    assert ulorl.count_batch(None, offsets, tokens=pack(lp)).to_list() == [24.0, 4.0, 5.0]
    with pytest.raises(ulorl.Error) as e:
        ulorl.count_batch(offsets=offsets)
    assert e.value.function == "count_batch" and e.value.argument == "mask"
    # broadcast_to_tokens: packed, a None mask is every token inside the offsets; padded it is required
    # (the mask gives the [B, T] shape).
    a = torch.randn(5, generator=gen, dtype=torch.float64)
    got = ulorl.broadcast_to_tokens(a, offsets=offsets)
    assert torch.equal(got, ulorl.broadcast_to_tokens(a, torch.ones(24, dtype=torch.bool), offsets=offsets))
    assert torch.equal(got, torch.repeat_interleave(a, offsets.diff()))
    with pytest.raises(ulorl.Error) as e:
        ulorl.broadcast_to_tokens(a)
    assert e.value.function == "broadcast_to_tokens" and e.value.argument == "mask"


def test_openrlhf_policy_loss_action_mask_none_is_all_ones(gen):
    lp, old, adv, _, ref, *_ = batch(gen)
    ones = torch.ones(lp.shape, dtype=torch.bool)
    for token_level_loss in (True, False):
        x1, x2 = lp.clone().requires_grad_(), lp.clone().requires_grad_()
        kw = dict(token_level_loss=token_level_loss, base_action_log_probs=ref, kl_estimator="k3", kl_coef=0.01)
        l1, m1 = ulorl.presets.openrlhf.policy_loss(x1, old, adv, ones, **kw)
        l2, m2 = ulorl.presets.openrlhf.policy_loss(x2, old, adv, **kw)  # OpenRLHF's action_mask=None
        l1.backward()
        l2.backward()
        assert torch.equal(l1, l2) and m1 == m2
        assert torch.equal(x1.grad, x2.grad)


def test_an_unknown_instruction_set_limit_is_named_at_import():
    env = dict(os.environ, ULORL_PYTHON_ISA="avx1024")
    r = subprocess.run([sys.executable, "-c", "import ulorl"], env=env, capture_output=True, text=True)
    assert r.returncode != 0
    assert "ULORL_PYTHON_ISA" in r.stderr and "avx1024" in r.stderr and "avx512" in r.stderr


def test_installed_kernels_instruction_sets(gen):
    # The policy loss's and the logits kernels' instruction sets are chosen together at import.
    isa = ulorl._ulorl.logits_isa
    order = ("default", "avx2", "avx512")
    assert isa in order and isa == ulorl._ulorl.policy_loss_isa
    limit = os.environ.get("ULORL_PYTHON_ISA")
    if limit is not None:
        assert order.index(isa) <= order.index(limit)
    # float32, bfloat16 and float16 logits (the installed kernels where isa != "default"): statistics and
    # gradients close to the float64 oracle's of the same (rounded) logits; the 16-bit statistics and
    # gradients are the float64 values rounded once (to within the float32 accumulation).
    logits = torch.randn(5, 3001, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, 3001, (5,), generator=gen, dtype=torch.int32)
    g1, g2 = torch.randn(5, generator=gen, dtype=torch.float64), torch.randn(5, generator=gen, dtype=torch.float64)
    rounding = {torch.float32: 2e-5, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}  # + float32's
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = logits.to(dtype)
        z = x.clone().requires_grad_()
        lp, ent = ulorl.logprobs_from_logits(z, labels, temperature=0.7)
        assert lp.dtype == ent.dtype == z.dtype
        (lp * g1.to(dtype) + ent * g2.to(dtype)).sum().backward()
        assert z.grad.dtype == dtype
        zz = x.double().requires_grad_()
        wlp, went = oracles.logits_statistics(zz, labels.long(), 0.7)
        # the row gradients reach the kernel as the 16-bit values the caller holds
        (wlp * g1.to(dtype).double() + went * g2.to(dtype).double()).sum().backward()
        tol = rounding[dtype] + 2e-5
        torch.testing.assert_close(lp.double(), wlp.detach(), rtol=tol, atol=2e-5)
        torch.testing.assert_close(ent.double(), went.detach(), rtol=tol, atol=2e-5)
        torch.testing.assert_close(z.grad.double(), zz.grad, rtol=tol, atol=2e-5 * zz.grad.abs().max().item())
