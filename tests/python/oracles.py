"""Independent float64 oracles for the Python tests: the textbook formulas written with plain torch
ops (never ulorl's code), differentiated by torch's autograd."""

from __future__ import annotations

import torch


def masked_sum(x, m):
    return (x * m).sum()


def aggregate(tok, mask, mode, constant=None, denominator=None):
    """sum_b sum_t L m / D_b of ulorl/loss/aggregation.hpp, from the batch's own counts unless
    `denominator` (N, S or C of a global batch) is given."""
    m = mask.to(tok.dtype)
    n_b = m.sum(-1)
    if mode == "token_mean":
        d = m.sum() if denominator is None else denominator
        return (tok * m).sum() / d
    if mode == "seq_mean_token_sum":
        d = (n_b > 0).sum() if denominator is None else denominator
        return (tok * m).sum() / d
    if mode == "seq_mean_token_mean":
        d = (n_b > 0).sum() if denominator is None else denominator
        row = torch.where(n_b > 0, (tok * m).sum(-1) / n_b.clamp(min=1), torch.zeros_like(n_b))
        return row.sum() / d
    if mode in ("seq_mean_token_sum_norm", "constant"):
        return (tok * m).sum() / constant
    raise ValueError(mode)


def kl_estimate(logp, ref, estimator, input_clamp=None, output_clamp=None):
    u = ref - logp
    if input_clamp is not None:
        u = torch.clamp(u, -input_clamp, input_clamp)
    if estimator == "k1":
        kl = -u
    elif estimator == "k2":
        kl = 0.5 * u * u
    elif estimator == "k3":
        kl = torch.exp(u) - u - 1
    elif estimator == "abs":
        kl = u.abs()
    else:
        raise ValueError(estimator)
    if output_clamp is not None:
        kl = torch.clamp(kl, -output_clamp, output_clamp)
    return kl


def token_objective(logp, old, adv, objective="ppo_clip", eps_low=0.2, eps_high=0.2, dual_clip=None, delta=None,
                    log_ratio_clamp=20.0):
    """Per-token objective of PPO-clip (clip-higher, dual clip, TRL delta), CISPO, policy gradient."""
    if objective == "policy_gradient":
        return -adv * logp
    x = logp - old
    if log_ratio_clamp is not None:
        x = torch.clamp(x, -log_ratio_clamp, log_ratio_clamp)
    r = torch.exp(x)
    if objective == "cispo":
        return -torch.clamp(r, 1 - eps_low, 1 + eps_high).detach() * adv * logp
    assert objective == "ppo_clip"
    r1 = torch.clamp(r, max=delta) if delta is not None else r
    pg = torch.maximum(-adv * r1, -adv * torch.clamp(r, 1 - eps_low, 1 + eps_high))
    if dual_clip is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * dual_clip), pg)
    return pg


def policy_loss(logp, old, adv, mask, *, objective="ppo_clip", eps_low=0.2, eps_high=0.2, dual_clip=None, delta=None,
                log_ratio_clamp=20.0, ref=None, kl_coef=0.0, kl_estimator="k3", kl_input_clamp=None,
                kl_output_clamp=None, entropy=None, entropy_coef=0.0, weights=None, agg="token_mean", constant=None,
                denominator=None):
    tok = token_objective(logp, old, adv, objective, eps_low, eps_high, dual_clip, delta, log_ratio_clamp)
    if weights is not None:
        tok = tok * weights
    if kl_coef != 0.0:
        tok = tok + kl_coef * kl_estimate(logp, ref, kl_estimator, kl_input_clamp, kl_output_clamp)
    if entropy_coef != 0.0:
        tok = tok - entropy_coef * entropy
    return aggregate(tok, mask, agg, constant, denominator)


def logits_statistics(logits, labels, temperature=1.0):
    z = logits / temperature
    lsm = torch.log_softmax(z, dim=-1)
    lp = lsm.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    ent = -(lsm.exp() * lsm).sum(-1)
    return lp, ent


def group_advantages(scores, ids, eps, unbiased=True, eps_on_std=True, singleton="zero", scale=True,
                     leave_one_out=False):
    """(s - mean_g) / (std_g + eps) per group, looped in float64 (the textbook form)."""
    out = torch.zeros_like(scores, dtype=torch.float64)
    s = scores.double()
    for g in torch.unique(ids):
        idx = (ids == g).nonzero().flatten()
        v = s[idx]
        n = v.numel()
        if n == 1:
            out[idx] = v if singleton == "identity" else 0.0
            if singleton == "identity" and scale:
                out[idx] = v / (1.0 + eps)
            continue
        mean = v.mean()
        base = (v.sum() - v) / (n - 1) if leave_one_out else mean
        c = v - base
        if scale:
            sd = v.std(unbiased=unbiased)
            c = c / (sd + eps) if eps_on_std else c / torch.sqrt(sd * sd + eps)
        out[idx] = c
    return out
