// tests/support/advantage_oracle.hpp — textbook float64 (long double where it helps) advantages,
// written from the formulas in docs/advantages.md and the golden README, independently of
// include/ulorl/advantage: groups by linear search, leave-one-out pools built explicitly, O(n^2).
#pragma once

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
inline std::vector<double> loo(const std::vector<double>& s, const std::vector<std::int64_t>& ids, bool scale, double eps) {
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
inline void reinforce_pp(const std::vector<std::vector<double>>& r, const std::vector<std::vector<int>>& m, double gamma,
                         std::vector<std::vector<double>>& ret, std::vector<std::vector<double>>& adv) {
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

}  // namespace oracle
