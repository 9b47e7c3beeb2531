// tests/support/advantage_oracle.hpp — textbook float64 (long double where it helps) advantages,
// written from the formulas in docs/advantages.md and the golden README, independently of
// include/ulorl/advantage: groups by linear search, leave-one-out pools built explicitly, O(n^2).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace oracle {

inline std::vector<std::size_t> group_members(const std::vector<std::int64_t>& ids, std::size_t i) {
  std::vector<std::size_t> m;
  for (std::size_t j = 0; j < ids.size(); ++j)
    if (ids[j] == ids[i]) m.push_back(j);
  return m;
}

inline long double mean_of(const std::vector<long double>& v) {
  long double s = 0;
  for (auto x : v) s += x;
  return s / static_cast<long double>(v.size());
}

inline long double std_of(const std::vector<long double>& v, bool unbiased) {
  if (v.size() < (unbiased ? 2u : 1u)) return 0;
  const long double mu = mean_of(v);
  long double ss = 0;
  for (auto x : v) ss += (x - mu) * (x - mu);
  return std::sqrt(ss / static_cast<long double>(unbiased ? v.size() - 1 : v.size()));
}

//! GRPO (r - mean) / (std + eps) per group; singleton: 0 or s/(1+eps) ("identity").
inline std::vector<double> grpo(const std::vector<double>& s, const std::vector<std::int64_t>& ids, double eps,
                                bool unbiased, bool scale, bool singleton_identity) {
  std::vector<double> out(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto mem = group_members(ids, i);
    if (mem.size() == 1) {
      out[i] = singleton_identity ? (scale ? static_cast<double>(s[i] / (1.0L + eps)) : s[i]) : 0.0;
      continue;
    }
    std::vector<long double> v;
    for (auto j : mem) v.push_back(s[j]);
    const long double mu = mean_of(v);
    out[i] = scale ? static_cast<double>((s[i] - mu) / (std_of(v, unbiased) + eps)) : static_cast<double>(s[i] - mu);
  }
  return out;
}

//! Leave-one-out: baseline = mean of the others; optional scaling by the pool's unbiased std
//! (skipped when that std is 0, NeMo-RL); singleton -> 0.
inline std::vector<double> loo(const std::vector<double>& s, const std::vector<std::int64_t>& ids, bool scale,
                               double eps) {
  std::vector<double> out(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto mem = group_members(ids, i);
    if (mem.size() == 1) {
      out[i] = 0.0;
      continue;
    }
    std::vector<long double> pool;
    for (auto j : mem)
      if (j != i) pool.push_back(s[j]);
    const long double b = mean_of(pool);
    const long double sd = std_of(pool, true);
    out[i] = (scale && sd > 0) ? static_cast<double>((s[i] - b) / (sd + eps)) : static_cast<double>(s[i] - b);
  }
  return out;
}

//! Discounted returns with reset after EOS, then unbiased masked whitening (eps in the sqrt).
inline void reinforce_plus_plus(const std::vector<std::vector<double>>& r, const std::vector<std::vector<int>>& m,
                                double gamma, std::vector<std::vector<double>>& ret,
                                std::vector<std::vector<double>>& adv) {
  ret = r;
  for (std::size_t b = 0; b < r.size(); ++b) {
    long double c = 0;
    for (std::size_t t = r[b].size(); t-- > 0;) {
      const long double g = r[b][t] + gamma * c;
      ret[b][t] = static_cast<double>(g);
      c = m[b][t] ? g : 0;
    }
  }
  std::vector<long double> vals;
  for (std::size_t b = 0; b < r.size(); ++b)
    for (std::size_t t = 0; t < r[b].size(); ++t)
      if (m[b][t]) vals.push_back(ret[b][t]);
  const long double mu = mean_of(vals), sd2 = std::pow(std_of(vals, true), 2);
  adv = ret;
  for (std::size_t b = 0; b < r.size(); ++b)
    for (std::size_t t = 0; t < r[b].size(); ++t)
      adv[b][t] = m[b][t] ? static_cast<double>((ret[b][t] - mu) / std::sqrt(sd2 + 1e-8L)) : 0.0;
}

//! Ragged per-token rows (row b has its own length); a 0/1 mask of the same rows.
using rows = std::vector<std::vector<double>>;

//! The optimal token baseline of the golden README §4.1, verbatim: G reward-to-go of the masked
//! rewards, w = (1 - 2 exp(lp) + spp) rho^2, W its masked prefix sum; per group of >= 2 (tir: the
//! rows with valid tokens; slots compacted) B = Σ G W m / (Σ W m + eps); zero tail for the single
//! longest member from the second longest length on. `rho` empty: 1.
inline void optimal_token_baseline(const rows& R, const std::vector<std::vector<int>>& m, const rows& lp,
                                   const rows& spp, const rows& rho, const std::vector<std::int64_t>& ids,
                                   bool zero_tail, double eps, bool tir, rows& ret, rows& adv) {
  const std::size_t B = R.size();
  std::vector<std::vector<long double>> G(B), W(B);
  std::vector<std::size_t> n(B, 0);
  for (std::size_t b = 0; b < B; ++b) {
    const std::size_t T = R[b].size();
    G[b].assign(T, 0);
    W[b].assign(T, 0);
    for (std::size_t t = 0; t < T; ++t) {
      long double g = 0;
      for (std::size_t u = t; u < T; ++u) g += m[b][u] ? R[b][u] : 0.0L;
      G[b][t] = g;
      long double w = 0;
      for (std::size_t u = 0; u <= t; ++u)
        if (m[b][u]) {
          const long double r = rho.empty() ? 1.0L : rho[b][u];
          w += (1.0L - 2.0L * std::exp(static_cast<long double>(lp[b][u])) + spp[b][u]) * r * r;
        }
      W[b][t] = w;
      n[b] += m[b][t] != 0;
    }
  }
  // Slot values of row b: (position t, slot j) for its valid tokens.
  const auto slot_of = [&](std::size_t b, std::size_t t) {
    if (!tir) return t;
    std::size_t j = 0;
    for (std::size_t u = 0; u < t; ++u) j += m[b][u] != 0;
    return j;
  };
  ret.assign(B, {});
  adv.assign(B, {});
  for (std::size_t b = 0; b < B; ++b) {
    ret[b].assign(R[b].size(), 0.0);
    adv[b].assign(R[b].size(), 0.0);
    std::vector<std::size_t> mem;
    for (std::size_t i = 0; i < B; ++i)
      if (ids[i] == ids[b] && (!tir || n[i] > 0)) mem.push_back(i);
    // zero tail: lengths sorted, the largest unique and above the second
    std::vector<std::size_t> L;
    for (auto i : mem) L.push_back(n[i]);
    std::sort(L.begin(), L.end());
    std::size_t at_max = 0;
    for (auto i : mem) at_max += n[i] == n[b];
    const bool tail_row = zero_tail && mem.size() >= 2 && n[b] == L.back() && at_max == 1 && L.back() > L[L.size() - 2];
    for (std::size_t t = 0; t < R[b].size(); ++t) {
      ret[b][t] = static_cast<double>(G[b][t]);
      if (!m[b][t]) continue;
      const std::size_t j = slot_of(b, t);
      long double base = 0;
      if (mem.size() >= 2 && !(tail_row && j >= L[L.size() - 2])) {
        long double num = 0, den = 0;
        for (auto i : mem)
          for (std::size_t u = 0; u < R[i].size(); ++u)
            if (m[i][u] && slot_of(i, u) == j) {
              num += G[i][u] * W[i][u];
              den += W[i][u];
            }
        base = num / (den + static_cast<long double>(eps));
      }
      adv[b][t] = static_cast<double>(G[b][t] - base);
    }
  }
}

//! GDPO-style per-component advantages summed with weights: `per` gives the advantages of one
//! component's scores.
template <class PerComponent>
std::vector<long double> weighted_component_sum(const std::vector<std::vector<double>>& r, const std::vector<double>& w,
                                                PerComponent per) {
  std::vector<long double> a(r.size(), 0);
  for (std::size_t k = 0; k < r[0].size(); ++k) {
    std::vector<double> s;
    for (const auto& row : r) s.push_back(row[k]);
    const std::vector<double> ak = per(s);
    for (std::size_t i = 0; i < r.size(); ++i) a[i] += (w.empty() ? 1.0L : w[k]) * ak[i];
  }
  return a;
}

//! (a - mean) / (std + eps) over the whole batch, unbiased; `skip_zero`: a - mean when std == 0 and
//! no eps otherwise (NeMo-RL); a batch of one gives 0.
inline std::vector<double> batch_normalize(const std::vector<long double>& a, double eps, bool skip_zero) {
  std::vector<double> out(a.size(), 0.0);
  if (a.size() == 1) return out;
  const long double mu = mean_of(a), sd = std_of(a, true);
  for (std::size_t i = 0; i < a.size(); ++i)
    out[i] = static_cast<double>(skip_zero ? (sd > 0 ? (a[i] - mu) / sd : a[i] - mu) : (a[i] - mu) / (sd + eps));
  return out;
}

//! Masked whitening over the valid tokens of [B][T] values x: unbiased with eps added (verl), or
//! biased with the variance floored at eps (NeMo-RL); `mask_out`: 0 at masked positions.
inline rows whiten(const rows& x, const std::vector<std::vector<int>>& m, bool unbiased, bool floor, bool mask_out) {
  std::vector<long double> v;
  for (std::size_t b = 0; b < x.size(); ++b)
    for (std::size_t t = 0; t < x[b].size(); ++t)
      if (m[b][t]) v.push_back(x[b][t]);
  const long double mu = mean_of(v), sd = std_of(v, unbiased), var = sd * sd;
  const long double d = std::sqrt(floor ? std::max(var, 1e-8L) : var + 1e-8L);
  rows out = x;
  for (std::size_t b = 0; b < x.size(); ++b)
    for (std::size_t t = 0; t < x[b].size(); ++t)
      out[b][t] = (m[b][t] || !mask_out) ? static_cast<double>((x[b][t] - mu) / d) : 0.0;
  return out;
}

//! GAE as its sum (no backward recursion): at a valid position t with the valid positions
//! t = p_0 < p_1 < ... after it, A_t = Σ_k (gamma lambda)^k delta(p_k), delta(p) = R_p + gamma V_next(p)
//! - V_p with V_next the value at the next valid position (0 after the last); a masked position
//! takes A of the next valid position (0 after the last). G = A + V everywhere; A whitened over the
//! valid tokens (unbiased, eps 1e-8 in the sqrt, masked positions included in the output).
inline void gae(const rows& R, const rows& V, const std::vector<std::vector<int>>& m, double gamma, double lambda,
                rows& ret, rows& adv) {
  rows raw = R;
  ret = R;
  for (std::size_t b = 0; b < R.size(); ++b) {
    std::vector<std::size_t> valid;
    for (std::size_t t = 0; t < R[b].size(); ++t)
      if (m[b][t]) valid.push_back(t);
    const auto delta = [&](std::size_t k) {  // k-th valid position's TD error
      const long double next = k + 1 < valid.size() ? V[b][valid[k + 1]] : 0.0L;
      return R[b][valid[k]] + gamma * next - V[b][valid[k]];
    };
    for (std::size_t t = 0; t < R[b].size(); ++t) {
      std::size_t first = 0;
      while (first < valid.size() && valid[first] < t) ++first;
      long double a = 0, w = 1;
      for (std::size_t k = first; k < valid.size(); ++k, w *= static_cast<long double>(gamma) * lambda)
        a += w * delta(k);
      raw[b][t] = static_cast<double>(a);
      ret[b][t] = static_cast<double>(a + V[b][t]);
    }
  }
  adv = whiten(raw, m, /*unbiased=*/true, /*floor=*/false, /*mask_out=*/false);
}

//! ReMax: G_t = Σ_{u >= t} m_u R_u at every t, A_t = G_t - b m_t.
inline void remax(const rows& R, const std::vector<double>& base, const std::vector<std::vector<int>>& m, rows& ret,
                  rows& adv) {
  ret = R;
  adv = R;
  for (std::size_t b = 0; b < R.size(); ++b)
    for (std::size_t t = 0; t < R[b].size(); ++t) {
      long double g = 0;
      for (std::size_t u = t; u < R[b].size(); ++u)
        if (m[b][u]) g += R[b][u];
      ret[b][t] = static_cast<double>(g);
      adv[b][t] = static_cast<double>(g - (m[b][t] ? base[b] : 0.0L));
    }
}

//! Pass@k: the group's scores sorted in decreasing order give s_max and s_second; the first member
//! holding s_max gets (s_max - s_second) / (unbiased std + eps) (or the bare gap), every other 0.
inline std::vector<double> pass_at_k(const std::vector<double>& s, const std::vector<std::int64_t>& ids, double eps,
                                     bool scale) {
  std::vector<double> out(s.size(), 0.0);
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto mem = group_members(ids, i);
    if (mem.front() != i) continue;  // once per group
    std::vector<long double> v;
    for (auto j : mem) v.push_back(s[j]);
    std::vector<long double> sorted = v;
    std::sort(sorted.begin(), sorted.end(), [](long double a, long double b) { return a > b; });
    std::size_t best = 0;
    while (v[best] != sorted[0]) ++best;
    const long double gap = sorted[0] - sorted[1];
    out[mem[best]] = static_cast<double>(scale ? gap / (std_of(v, true) + eps) : gap);
  }
  return out;
}

}  // namespace oracle
