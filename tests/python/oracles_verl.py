"""Float64 reference formulas of verl's (1dda039b) algorithm functions, written from their definitions
(docs/presets/verl.md), independent of ulorl: the expected values of test_presets_verl.py. Means over
a row's tokens are exact (verl adds 1e-8 to those counts: a relative 1e-8 / n_b apart)."""

import math

import torch


def mmean(x, m):
    return (x * m).sum() / m.sum()


def agg(L, m, mode, dp=1.0, n_tokens=None, n_seqs=None, horizon=None):
    """verl agg_loss: token-mean, token-sum, seq-mean-token-sum(-norm), seq-mean-token-mean."""
    m = m.double()
    rows = (m.sum(-1) > 0).double()
    S = rows.sum() if n_seqs is None else n_seqs
    if mode == "token-mean":
        return (L * m).sum() / (m.sum() if n_tokens is None else n_tokens) * dp
    if mode == "token-sum":
        return (L * m).sum() * dp
    if mode == "seq-mean-token-sum":
        return (L * m).sum() / S * dp
    if mode == "seq-mean-token-sum-norm":
        return (L * m).sum() / S * dp / (L.shape[-1] if horizon is None else horizon)
    if mode == "seq-mean-token-mean":
        n = m.sum(-1)
        per_row = torch.where(n > 0, (L * m).sum(-1) / n.clamp(min=1), torch.zeros_like(n))
        return (per_row * rows).sum() / S * dp
    raise ValueError(mode)


def token_loss(mode, old, lp, adv, low, high, c=3.0, tau_pos=1.0, tau_neg=1.05, beta=None):
    """Per-token loss of a verl loss mode (lp carries the gradient); returns (L, metrics dict of tensors)."""
    x = lp - old
    xc = x.clamp(-20, 20)
    r = torch.exp(xc)
    if mode == "vanilla":
        a = -adv * r
        b = -adv * r.clamp(1 - low, 1 + high)
        clip1 = torch.maximum(a, b)
        dual = torch.minimum(-adv * c, clip1)
        L = torch.where(adv < 0, dual, clip1)
        return L, {"pg_clipfrac": (b > a).double(), "pg_clipfrac_lower": ((clip1 > -adv * c) & (adv < 0)).double(),
                   "ppo_kl": -xc}
    if mode == "cispo":
        rc = r.clamp(1 - low, 1 + high)
        return -rc.detach() * adv * lp, {"pg_clipfrac": (r != rc).double(), "ppo_kl": -xc,
                                         "pg_clipfrac_lower": torch.zeros_like(x)}
    if mode == "sapo":
        tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
        return -torch.sigmoid(tau * (r - 1)) * 4 / tau * adv, {"pg_clipfrac": torch.zeros_like(x), "ppo_kl": -xc,
                                                              "pg_clipfrac_lower": torch.zeros_like(x)}
    if mode == "gpg":
        return -lp * adv, {}
    if mode == "dro":
        return -(lp * adv - 0.5 * beta * x.square()), {"ppo_kl": -x}
    raise ValueError(mode)


def gspo(old, lp, adv, m, low, high):
    n = m.sum(-1).clamp(min=1)
    s = ((lp - old) * m).sum(-1) / n
    lr = (lp - lp.detach() + s.detach().unsqueeze(-1)).clamp(max=10.0)
    r = torch.exp(lr)
    a, b = -adv * r, -adv * r.clamp(1 - low, 1 + high)
    return torch.maximum(a, b), {"pg_clipfrac": (b > a).double(), "ppo_kl": -(lp - old),
                                 "pg_clipfrac_lower": torch.zeros_like(lp)}


def geo_mean(old, lp, adv, m, low, high):
    x = lp - old
    sgn = torch.sign(adv)
    xc = x.clamp(-low, high)
    xm = sgn * torch.minimum(sgn * x, sgn * xc)
    n = m.sum(-1).clamp(min=1)
    ratio = torch.exp((xm * m).sum(-1) / n)
    a = (adv * m).sum(-1) / n
    clipped = (x != xc).double()
    return (-a * ratio).mean(), {"pg_clipfrac": mmean(clipped * (adv > 0), m), "ppo_kl": mmean(-x, m),
                                 "pg_clipfrac_lower": mmean(clipped * (adv < 0), m)}


def dppo(kind, old, lp, adv, low, high, c):
    """DPPO Binary-TV / Binary-KL per-token loss and its metrics' per-token indicators."""
    r = torch.exp((lp - old).clamp(-20, 20))
    p, p0 = torch.exp(lp.detach()), torch.exp(old)
    if kind == "tv":
        pos, neg = (p - p0) <= high, (p - p0) >= -low
    else:
        d = p0 * (old - lp.detach()) + (1 - p0) * torch.log((1 - p0 + 1e-8) / (1 - p + 1e-8))
        pos, neg = (d <= high) | (p <= p0), (d <= low) | (p >= p0)
    v = torch.where(adv > 0, pos, neg).double()
    L = -adv * r.clamp(max=c).detach() * lp * v
    return L, {"pg_clipfrac": 1 - v, "pg_clipfrac_lower": (r > c).double() * v, "ppo_kl": -(lp - old).clamp(-20, 20)}


def kl(lp, ref, name):
    plus = name.endswith("+")
    base = name[:-1] if plus else name
    d = lp - ref
    if base in ("kl", "k1"):
        v = d
    elif base == "abs":
        v = d.abs()
    elif base in ("mse", "k2"):
        v = 0.5 * d.square()
    else:
        k = (-d).clamp(-20, 20)
        v = (torch.exp(k) - k - 1).clamp(-10, 10)
    if plus and base not in ("mse", "k2"):
        st = 0.5 * d.square()
        v = st - st.detach() + v.detach()
    return v


def group_stats(scores, ids):
    groups = {}
    for i, g in enumerate(ids):
        groups.setdefault(g, []).append(i)
    return groups


def grpo(scores, ids, eps=1e-6, std=True):
    out = torch.empty_like(scores)
    for idx in group_stats(scores, ids).values():
        v = scores[idx]
        mu, sd = (v.mean(), v.std()) if len(idx) > 1 else (torch.tensor(0.0, dtype=v.dtype), torch.tensor(1.0, dtype=v.dtype))
        out[idx] = (v - mu) / (sd + eps) if std else v - mu
    return out


def rloo(scores, ids, singleton_zero=False):
    out = torch.empty_like(scores)
    for idx in group_stats(scores, ids).values():
        v = scores[idx]
        n = len(idx)
        out[idx] = (v - (v.sum() - v) / (n - 1)) if n > 1 else (torch.zeros_like(v) if singleton_zero else v)
    return out


def whiten(x, m):
    m = m.double()
    mu = mmean(x, m)
    var = (((x - mu) ** 2) * m).sum() / (m.sum() - 1)
    return (x - mu) / torch.sqrt(var + 1e-8) * m


def reinforce_plus_plus_returns(r, m, gamma):
    """Returns over the valid tokens only: a masked position gets 0 and passes the return on."""
    out = torch.zeros_like(r)
    for b in range(r.shape[0]):
        c = 0.0
        for t in reversed(range(r.shape[1])):
            if m[b, t]:
                c = r[b, t].item() + gamma * c
                out[b, t] = c
    return out


def gae(r, v, m, gamma, lam):
    """GAE as its sum over the valid positions p_0 = first valid >= t < p_1 < ...:
    A_t = sum_k (gamma lam)^k delta(p_k), delta(p) = r_p + gamma V(next valid after p, else 0) - V_p; a
    masked t takes the advantage of the next valid position (0 after the last). Returns (whitened A over
    the valid tokens, every position written; A + V)."""
    A = torch.zeros_like(r, dtype=torch.float64)
    for b in range(r.shape[0]):
        valid = [t for t in range(r.shape[1]) if m[b, t]]
        delta = [r[b, p].item() + gamma * (v[b, valid[k + 1]].item() if k + 1 < len(valid) else 0.0) - v[b, p].item()
                 for k, p in enumerate(valid)]
        for t in range(r.shape[1]):
            first = next((k for k, p in enumerate(valid) if p >= t), len(valid))
            A[b, t] = sum((gamma * lam) ** (k - first) * delta[k] for k in range(first, len(valid)))
    md = m.double()
    mu = (A * md).sum() / md.sum()
    var = (((A - mu) ** 2) * md).sum() / (md.sum() - 1)
    return (A - mu) / torch.sqrt(var + 1e-8), A + v.double()


def remax(r, base, m):
    """Returns: the sum of the masked rewards from t on (every t); advantages: returns - base on the mask."""
    md = m.double()
    ret = torch.stack([(r.double() * md)[:, t:].sum(-1) for t in range(r.shape[1])], -1)
    return ret - base.double().unsqueeze(-1) * md, ret


def pass_at_k(scores, ids, eps=1e-6, std=True):
    """Per group: the first member with the largest score gets (largest - second largest) / (std + eps)."""
    out = torch.zeros_like(scores, dtype=torch.float64)
    for idx in group_stats(scores, ids).values():
        vals = sorted((scores[i].item() for i in idx), reverse=True)
        best = next(i for i in idx if scores[i].item() == vals[0])
        gap = vals[0] - vals[1]
        out[best] = gap / (scores[idx].double().std().item() + eps) if std else gap
    return out

def rollout_is(old, ro, m, level, upper, lower=None):
    """(applied weights, raw weights, log-ratio used for the metrics) of verl's IS weights."""
    lr = old - ro
    if level == "token":
        raw = torch.exp(lr.clamp(-20, 20)) * m
        lrm = lr
    else:
        lrm = (lr * m).sum(-1, keepdim=True)
        raw = torch.exp(lrm.clamp(-20, 20)).expand_as(lr) * m
    w = raw.clamp(max=upper) if lower is None else torch.where((raw >= lower) & (raw <= upper), raw,
                                                               torch.zeros_like(raw))
    return w, raw, lrm


def token_is_metrics(w, raw, m, upper, lower=None):
    lo = 1 / upper if lower is None else lower
    mb = m.bool()
    wc = w.clamp(0, upper)
    mu = mmean(wc, m)
    seq = (w * m).sum(-1) / m.sum(-1)
    raw_seq = (raw * m).sum(-1) / m.sum(-1)
    return {"rollout_is_mean": mmean(w, m).item(), "rollout_is_max": w[mb].max().item(),
            "rollout_is_min": w[mb].min().item(),
            "rollout_is_std": math.sqrt(max(mmean(wc ** 2, m).item() - mu.item() ** 2, 0.0)),
            "rollout_is_eff_sample_size": 1 / mmean((wc / (mu + 1e-8)) ** 2, m).item(),
            "rollout_is_ratio_fraction_high": mmean((raw > upper).double(), m).item(),
            "rollout_is_ratio_fraction_low": mmean((raw < lo).double(), m).item(),
            "rollout_is_seq_mean": seq.mean().item(), "rollout_is_seq_std": seq.std().item(),
            "rollout_is_seq_max": seq.max().item(), "rollout_is_seq_min": seq.min().item(),
            "rollout_is_seq_max_deviation": (seq - 1).abs().max().item(),
            "rollout_is_seq_fraction_high": (raw_seq > upper).double().mean().item(),
            "rollout_is_seq_fraction_low": (raw_seq < lo).double().mean().item()}


def offpolicy(old, ro, m):
    lr = old - ro
    mt = (old * m).sum(-1) / m.sum(-1)
    mr = (ro * m).sum(-1) / m.sum(-1)
    d = mr - mt
    s = (lr * m).sum(-1).clamp(-20, 20)
    return {"training_ppl": torch.exp(-mt).mean().item(), "training_log_ppl": (-mt).mean().item(),
            "kl": mmean(ro - old, m).item(), "k3_kl": mmean(torch.exp(lr) - lr - 1, m).item(),
            "rollout_ppl": torch.exp(-mr).mean().item(), "rollout_log_ppl": (-mr).mean().item(),
            "log_ppl_diff": d.mean().item(), "log_ppl_abs_diff": d.abs().mean().item(),
            "log_ppl_diff_max": d.max().item(), "log_ppl_diff_min": d.min().item(),
            "ppl_ratio": torch.exp(d).mean().item(),
            "chi2_token": mmean(torch.exp(lr.clamp(-20, 20)) ** 2, m).item() - 1,
            "chi2_seq": torch.exp(2 * s).mean().item() - 1}
