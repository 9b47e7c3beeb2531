// ulorl/loss/rollout_correction/compute.hpp — the rollout correction over a ragged batch: per-token
// importance weights, the rejection-sampling keep-mask, and the mismatch diagnostics.
//
//   x = old_log_prob - rollout_log_prob, m the response mask, N = sum m, B rows, n_b = sum_t m.
//   weights[b,t]  the importance weight (config.hpp: level, weighting, bounds), detached
//   mask[b,t]     m[b,t] * prod_criteria keep (rejection sampling; m without criteria)
//   diagnostics   kl = sum (-x) m / N, k3_kl = sum (exp(x) - x - 1) m / N, chi-square of the token /
//                 sequence ratios, training / rollout perplexities of the row-mean log-probs and their
//                 differences (verl rollout_corr_helper), weight min / mean / max (TRL), effective
//                 sample size, out-of-bounds fractions (NeMo-RL), rejected fractions (verl).
//
// The outputs match ulorl::policy_loss's inputs: `weights` is policy_loss_inputs::weights (the
// per-token factor of the objective), `mask` is policy_loss_inputs::mask (rejected tokens leave
// the loss and its normaliser).
//
// Two-phase use (micro-batches, data-parallel ranks): accumulate() per part writes that part's
// weights (not batch-normalised) and mask and returns its `statistics`; sum the statistics over all
// parts (operator+=, or an all-reduce of its fields: sums, plus max / min for the *_max / *_min
// fields); finalize() the sum into `metrics`; normalize_weights() each part's weights by
// metrics.batch_norm_factor. The result is the one-shot apply() on the whole batch: every metric
// and the normaliser are functions of the summed statistics only.
//
// The scan of a row is lane-wise (core/simd.hpp: vectors of double as wide as the translation
// unit's ISA, one lane with ULORL_NO_SIMD): each per-token formula (ratio, weighting, criterion
// estimate, k3 and chi-square terms) is one function template over the lane type, evaluated by the
// vectors, their padded tail and the per-row values alike, so a token's weight and keep flag do not
// depend on the lane type. One pass per row where the weights need none of the row's sums (token
// level or none, no sequence criterion), else two. Each statistic is summed per lane and the lanes
// are folded in order at the end of the row, then the rows in row order: the sums' last bits depend
// on the vector width (one lane: token order), never on how rows are split into parts or threads.
// Exponentials are core/simd.hpp's (a few ulp), libm's where an argument leaves [-708, 709]
// (overflow to +inf, subnormals, 0).
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/rollout_correction/config.hpp"
#include "ulorl/loss/rollout_correction/statistics.hpp"

ULORL_NAMESPACE_BEGIN
namespace rollout_correction {

//! The inputs: all views share old_log_prob's shape (padded [B, T] or packed with offsets).
template <class T, class M = T>
struct inputs {
  token_view<const T> old_log_prob;      //!< the trainer's log-prob of the sampled token
  token_view<const T> rollout_log_prob;  //!< the inference engine's log-prob of the same token
  token_view<const M> mask{};            //!< 0/1 response mask; empty: every token valid
};

//! The outputs, each of old_log_prob's shape; an empty view is not written.
template <class T, class M = T>
struct outputs {
  token_view<T> weights{};  //!< importance weights at every position (1 at level none)
  //! keep-mask m * keep (0/1). May be the memory of inputs::mask (in place).
  token_view<M> mask{};
};


//! The diagnostics of a batch. A mean over no tokens (rows) is 0; importance metrics are 0 at
//! level none. Means over tokens divide by N, means over rows by B (empty rows included).
struct metrics {
  double tokens = 0, rows = 0;
  // importance weights (before batch normalisation)
  double weight_mean = 0;              //!< sum w m / N (verl rollout_is_mean)
  double effective_sample_size = 0;    //!< 1 / (sum z^2 m / N), z = w~ / (sum w~ m / N + 1e-8), w~ = min(w, upper); +inf if every w is 0
  double batch_norm_factor = 1;        //!< mu when batch_normalize and mu > 1e-8, else 1: the divisor of the weights
  double unit_weight_mean = 0, unit_weight_min = 0, unit_weight_max = 0;  //!< over the weight units (TRL importance_sampling_ratio_*)
  double out_of_bounds_token_fraction = 0;  //!< out_of_bounds_tokens / N
  double out_of_bounds_row_fraction = 0;    //!< out_of_bounds_rows / B
  // rejection sampling
  double rejected_token_fraction = 0;  //!< verl rollout_rs_masked_fraction
  double rejected_row_fraction = 0;    //!< verl rollout_rs_seq_masked_fraction
  // diagnostics
  double kl = 0;     //!< sum (rollout - old) m / N
  double k3_kl = 0;  //!< sum (exp(x) - x - 1) m / N (no clamp; exp saturates near 8e307)
  double chi2_token = 0, chi2_seq = 0;
  double training_ppl = 0, training_log_ppl = 0, rollout_ppl = 0, rollout_log_ppl = 0;
  double log_ppl_diff = 0, log_ppl_abs_diff = 0, log_ppl_diff_max = 0, log_ppl_diff_min = 0, ppl_ratio = 0;
  double abs_log_ratio_mean = 0, abs_log_ratio_max = 0;  //!< of |x| over valid tokens (TRL sampling_logp_difference_*)
  statistics totals{};  //!< the statistics these metrics were computed from
};

namespace detail {

[[nodiscard]] inline double per(double num, double den) noexcept { return den > 0 ? num / den : 0.0; }

[[nodiscard]] constexpr kl_estimator kl_estimator_of(rs_estimator e) noexcept {
  return e == rs_estimator::k1 ? kl_estimator::k1 : e == rs_estimator::k2 ? kl_estimator::k2 : kl_estimator::k3;
}

//! A criterion with its estimator's parameters and its kept range in the statistic's units.
struct criterion_plan {
  rejection_criterion criterion;
  kl_params<double> estimator;
  double lo, hi;
};
struct chain_plan {
  std::array<criterion_plan, rejection_chain::capacity> items{};
  std::size_t size = 0;
};
[[nodiscard]] inline chain_plan plan_chain(const rejection_config& r) {
  chain_plan p;
  for (const auto& c : r.chain) {
    const bool k1 = c.estimator == rs_estimator::k1;
    p.items[p.size++] = {c, make_kl_params<double>({.estimator = kl_estimator_of(c.estimator), .input_clamp = r.log_ratio_clamp}),
                         k1 ? std::log(c.lower) : -std::numeric_limits<double>::infinity(),
                         k1 ? std::log(c.upper) : c.upper};
  }
  return p;
}

// ---- the per-token formulas, lane-wise ------------------------------------------------------------
//
// Each formula of a token is one function template over a lane type `L` of double (core/simd.hpp):
// the row scan evaluates it on vectors (vec_lanes<double>, its tail on a padded vector), the scalar
// build (ULORL_NO_SIMD) and the per-row values (a sequence-level ratio, chi2_seq) on
// scalar_lanes<double>. Every lane computes the scalar formula: a token's value does not depend on
// the lane type or its position.

//! Lane l of a value or mask (the scalar lane type has one lane).
template <class L, class X>
[[nodiscard]] ULORL_ALWAYS_INLINE auto lane(const X& x, std::size_t l) noexcept {
  if constexpr (L::N == 1) {
    (void)l;
    return x;
  } else {
    return x[l];
  }
}
//! Lane-wise not (`~` of a bool is not its negation).
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::M lanes_not(typename L::M m) noexcept {
  if constexpr (L::N == 1) return !m;
  else return ~m;
}
//! Lane-wise and of masks (both evaluated).
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::M lanes_and(typename L::M a, typename L::M b) noexcept {
  if constexpr (L::N == 1) return a && b;
  else return a & b;
}
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE bool any_lane(typename L::M m) noexcept {
  if constexpr (L::N == 1) {
    return m;
  } else {
#if defined(ULORL_SIMD) && (defined(__x86_64__) || defined(__i386__))
    // One test instruction instead of a reduction of the lanes.
#if defined(__AVX512F__)
    if constexpr (sizeof(m) == 64) return _mm512_test_epi64_mask(ulorl::detail::bit_cast<__m512i>(m), ulorl::detail::bit_cast<__m512i>(m)) != 0;
#endif
#if defined(__AVX__)
    if constexpr (sizeof(m) == 32) return _mm256_testz_si256(ulorl::detail::bit_cast<__m256i>(m), ulorl::detail::bit_cast<__m256i>(m)) == 0;
#endif
#if defined(__SSE2__)
    if constexpr (sizeof(m) == 16) return _mm_movemask_epi8(ulorl::detail::bit_cast<__m128i>(m)) != 0;
#endif
#endif
    typename L::I r = 0;
    for (std::size_t l = 0; l < L::N; ++l) r |= m[l];
    return r != 0;
  }
}
//! The lanes [0, k).
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::M first_lanes(std::size_t k) noexcept {
  if constexpr (L::N == 1) {
    return k > 0;
  } else {
    typename L::IV idx{};
    for (std::size_t l = 0; l < L::N; ++l) idx[l] = static_cast<typename L::I>(l);
    return idx < static_cast<typename L::I>(k);
  }
}
//! |x| (+0 for -0, as std::fabs).
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::V abs_lanes(typename L::V x) noexcept {
  if constexpr (L::N == 1) {
    return std::fabs(x);
  } else {
    using IV = typename L::IV;
    return ulorl::detail::bit_cast<typename L::V>(ulorl::detail::bit_cast<IV>(x) & (IV{} + std::numeric_limits<typename L::I>::max()));
  }
}

//! e with libm's exp(x) in the lanes of `edge` (out of line: lane access keeps vectors in memory).
template <class L>
[[nodiscard]] ULORL_NOINLINE typename L::V exp_edges(typename L::V x, typename L::V e, typename L::M edge) noexcept {
  if constexpr (L::N == 1) {
    return edge ? std::exp(x) : e;
  } else {
    for (std::size_t l = 0; l < L::N; ++l)
      if (edge[l]) e[l] = std::exp(x[l]);
    return e;
  }
}
//! exp(x) for |x| <= bound: core/simd.hpp's exponential on [-708, 709], libm's outside, where the
//! former saturates (the ratio's overflow rules need exp's +inf; below -708 libm's subnormals and 0).
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::V exp_lanes(typename L::V x, double bound) noexcept {
  using C = ::ulorl::detail::exp_constants<double>;
  typename L::V em1{};
  const typename L::V e = L::exp_in_range(L::clamp(x, L::splat(C::lo), L::splat(C::hi)), em1);
  if (bound > -C::lo) {
    const typename L::M edge = (x < C::lo) | (x > C::hi);
    if (any_lane<L>(edge)) [[unlikely]]
      return exp_edges<L>(x, e, edge);
  }
  return e;
}

//! rho = exp(clamp(L)), then the overflow rule.
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::V ratio_lanes(typename L::V log_ratio, const importance_sampling_config& c) noexcept {
  const double b = c.log_ratio_clamp;
  const typename L::V rho = exp_lanes<L>(L::clamp(log_ratio, L::splat(-b), L::splat(b)), b);
  if (c.overflow == ratio_overflow::zero) return L::select(rho == std::numeric_limits<double>::infinity(), L::splat(0.0), rho);
  return rho;
}
//! The weight of a ratio that a mask or gate drops: 0, or rho * 0 (NaN for an overflowed rho).
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::V dropped_lanes(typename L::V rho, const importance_sampling_config& c) noexcept {
  return c.overflow == ratio_overflow::nan_when_masked ? rho * 0.0 : L::splat(0.0);
}
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::M inside_lanes(typename L::V rho, const importance_sampling_config& c) noexcept {
  return L::passes(rho, L::splat(c.lower), L::splat(c.upper));
}
//! truncate / mask (geometric_gate applies its row gate to the raw ratio instead).
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::V weigh_lanes(typename L::V rho, const importance_sampling_config& c) noexcept {
  if (c.weighting == is_weighting::truncate) {
    const typename L::V t = L::select(rho < c.lower, L::splat(c.lower), rho);  // std::max(rho, lower)
    return L::select(c.upper < t, L::splat(c.upper), t);                       // std::min(., upper)
  }
  if (c.weighting == is_weighting::mask) return L::select(inside_lanes<L>(rho, c), rho, dropped_lanes<L>(rho, c));
  return rho;
}
//! exp(2 clamp(x, -c, c)): a term of chi2_token (x a token's log-ratio) or chi2_seq (a row's sum).
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::V chi2_lanes(typename L::V x, double c) noexcept {
  return exp_lanes<L>(2.0 * L::clamp(x, L::splat(-c), L::splat(c)), 2.0 * c);
}
//! A criterion's estimate at one token (kl.hpp with ref = old, logp = rollout: u = clamp(x)).
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::V criterion_value(const criterion_plan& c, typename L::V old_lp,
                                                                typename L::V rollout_lp) noexcept {
  switch (c.estimator.estimator) {
    case kl_estimator::k1: return kl_lanes<k1_estimator, L>(rollout_lp, old_lp, c.estimator).value;
    case kl_estimator::k2: return kl_lanes<k2_estimator, L>(rollout_lp, old_lp, c.estimator).value;
    case kl_estimator::k3: return kl_lanes<k3_estimator, L>(rollout_lp, old_lp, c.estimator).value;
    case kl_estimator::abs: break;  // plan_chain makes k1, k2 and k3 only
  }
  return L::splat(std::numeric_limits<double>::quiet_NaN());
}
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::M keeps_lanes(const criterion_plan& c, typename L::V stat) noexcept {
  return L::passes(stat, L::splat(c.lo), L::splat(c.hi));
}
//! The k3 diagnostic exp(x) - x - 1 (no clamp; exp saturates near 8e307): kl.hpp's k3 estimator
//! with ref = old, logp = rollout (kl_lanes without clamps, whose clamps to +-inf change nothing).
template <class L>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::V k3_lanes(typename L::V old_lp, typename L::V rollout_lp) noexcept {
  constexpr kl_params<double> plain = make_kl_params<double>({.estimator = kl_estimator::k3});
  const typename L::V u = old_lp - rollout_lp;
  typename L::V v{}, dv{};
  k3_estimator::raw<L>(u, u, plain, v, dv);
  return v;
}

template <class T>
[[nodiscard]] bool representable(double w) noexcept {
  return std::isfinite(static_cast<double>(static_cast<T>(w)));
}
//! representable<T> lane-wise.
template <class L, class T>
[[nodiscard]] ULORL_ALWAYS_INLINE typename L::M representable_lanes(typename L::V w) noexcept {
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
    // float: below the midpoint of FLT_MAX and 2^128, which rounds (to even) to +inf. NaN: false.
    constexpr double limit = std::is_same_v<T, double> ? std::numeric_limits<double>::infinity() : 0x1.ffffffp127;
    return abs_lanes<L>(w) < limit;
  } else if constexpr (L::N == 1) {
    return representable<T>(w);
  } else {
    typename L::M m{};
    for (std::size_t l = 0; l < L::N; ++l) m[l] = representable<T>(w[l]) ? -1 : 0;
    return m;
  }
}

// ---- sums over a row's lanes ------------------------------------------------------------------------
// One partial sum (min, max) per lane, folded in lane order at the end of the row: with one lane (the
// scalar build) the sums are the sequential ones. Counts are sums of 1 (exact).

template <class L>
struct lane_sum {
  typename L::V a{};
  ULORL_ALWAYS_INLINE void add(typename L::M m, typename L::V x) noexcept { a = a + L::select(m, x, L::splat(0.0)); }
  [[nodiscard]] double total() const noexcept {
    const typename L::V v = a;  // lanes of a copy: an element access of `a` would keep it in memory
    double s = 0;
    for (std::size_t l = 0; l < L::N; ++l) s += lane<L>(v, l);
    return s;
  }
};
//! The largest (Max) or smallest x of the masked lanes and `init` (std::max / std::min: a NaN x is skipped).
template <class L, bool Max>
struct lane_extremum {
  double init;
  typename L::V a = L::splat(init);
  ULORL_ALWAYS_INLINE void add(typename L::M m, typename L::V x) noexcept {
    if constexpr (Max) a = L::select(m & (x > a), x, a);
    else a = L::select(m & (x < a), x, a);
  }
  [[nodiscard]] double total() const noexcept {
    const typename L::V x = a;  // as in lane_sum::total
    double r = init;
    for (std::size_t l = 0; l < L::N; ++l) {
      const double v = lane<L>(x, l);
      r = (Max ? v > r : v < r) ? v : r;
    }
    return r;
  }
};

inline namespace ULORL_ISA {

//! The lanes of the row scan: as wide as the translation unit's vectors, one without SIMD.
#if defined(ULORL_SIMD)
using scan_lanes = simd::vec_lanes<double>;
#else
using scan_lanes = simd::scalar_lanes<double>;
#endif

//! A row's inputs lane-wise in double: old and rollout log-probs and the valid lanes. Unit-stride
//! float / double rows (a unit-stride or broadcast mask) are read directly; other rows and a
//! row's tail through a padded copy (lanes past the row: 0, not valid).
template <class L, class T, class M>
struct row_reader {
  using V = typename L::V;
  using K = typename L::M;
  static constexpr std::size_t N = L::N;
  //! Types read as vectors: float / double values; integer, float or double masks.
  static constexpr bool vector_types = (std::is_same_v<T, float> || std::is_same_v<T, double>) &&
                                       (std::is_integral_v<M> || std::is_same_v<M, float> || std::is_same_v<M, double>);
  vector_view<const T> o, r;
  vector_view<const M> m;  //!< empty: every token valid
  bool direct = false;

  row_reader(vector_view<const T> o_, vector_view<const T> r_, vector_view<const M> m_) noexcept : o(o_), r(r_), m(m_) {
    if constexpr (N > 1 && vector_types)
      direct = o.stride() == 1 && r.stride() == 1 && (m.empty() || m.stride() == 1 || m.stride() == 0);
  }
#if defined(ULORL_SIMD)
  [[nodiscard]] static ULORL_ALWAYS_INLINE V widen(const T* p) noexcept {
    if constexpr (std::is_same_v<T, double>) {
      return L::load(p);
    } else {
      typedef float FV __attribute__((vector_size(N * sizeof(float))));
      FV f;
      std::memcpy(&f, p, sizeof f);
      return __builtin_convertvector(f, V);
    }
  }
#endif
  //! Tokens [t, t + k), k <= N.
  ULORL_ALWAYS_INLINE void load(std::size_t t, std::size_t k, V& ol, V& rl, K& valid) const noexcept {
    if constexpr (N == 1) {
      (void)k;
      ol = static_cast<double>(o[t]), rl = static_cast<double>(r[t]);
      valid = m.empty() || m[t] != M(0);
    }
#if defined(ULORL_SIMD)
    else {
      if constexpr (vector_types) {
        if (direct && k == N) {
          ol = widen(o.data() + t), rl = widen(r.data() + t);
          valid = m.empty() ? L::mask_of(true) : m.stride() == 0 ? L::mask_of(m[0] != M(0)) : L::valid_lanes(m.data() + t);
          return;
        }
      }
      alignas(64) double bo[N] = {}, br[N] = {};
      std::uint8_t bm[N] = {};
      for (std::size_t l = 0; l < k; ++l) {
        bo[l] = static_cast<double>(o[t + l]), br[l] = static_cast<double>(r[t + l]);
        bm[l] = m.empty() || m[t + l] != M(0);
      }
      ol = L::load(bo), rl = L::load(br), valid = L::valid_lanes(bm);
    }
#endif
  }
};

//! A row's outputs: weights / divisor in T, the keep-mask in M (an empty view: not written).
template <class L, class T, class M>
struct row_writer {
  using V = typename L::V;
  using K = typename L::M;
  static constexpr std::size_t N = L::N;
  vector_view<T> w;
  vector_view<M> m;
  double divisor;
  bool direct_w = false, direct_m = false;

  row_writer(vector_view<T> w_, vector_view<M> m_, double d) noexcept : w(w_), m(m_), divisor(d) {
    if constexpr (N > 1) {
      direct_w = (std::is_same_v<T, float> || std::is_same_v<T, double>) && w.stride() == 1;
      direct_m = std::is_arithmetic_v<M> && m.stride() == 1;
    }
  }
#if defined(ULORL_SIMD)
  template <class E>
  static ULORL_ALWAYS_INLINE void store_values(E* p, V v) noexcept {
    if constexpr (std::is_same_v<E, double>) {
      L::store(p, v);
    } else {
      typedef float FV __attribute__((vector_size(N * sizeof(float))));
      const FV f = __builtin_convertvector(v, FV);
      std::memcpy(p, &f, sizeof f);
    }
  }
#endif
  //! Element by element (strides, other types, a row's tail; out of line, as exp_edges).
  ULORL_NOINLINE void store_each(std::size_t t, std::size_t k, V q, K keep, bool weights, bool flags) const noexcept {
    for (std::size_t l = 0; l < k; ++l) {
      if (weights) w[t + l] = static_cast<T>(lane<L>(q, l));
      if (flags) m[t + l] = lane<L>(keep, l) != 0 ? M(1) : M(0);
    }
  }
  //! Tokens [t, t + k), k <= N.
  ULORL_ALWAYS_INLINE void store(std::size_t t, std::size_t k, V weight, K keep) const noexcept {
    const V q = divisor == 1.0 ? weight : weight / divisor;  // w / 1 == w
    bool weights = !w.empty(), flags = !m.empty();
#if defined(ULORL_SIMD)
    if constexpr (N > 1 && (std::is_same_v<T, float> || std::is_same_v<T, double>)) {
      if (weights && direct_w && k == N) store_values<T>(w.data() + t, q), weights = false;
    }
    if constexpr (N > 1 && std::is_arithmetic_v<M>) {
      if (flags && direct_m && k == N) {
        if constexpr (sizeof(M) == 1 && std::is_integral_v<M>) {
          typedef std::uint8_t BV __attribute__((vector_size(N)));
          const BV bytes = __builtin_convertvector(keep & 1, BV);
          std::memcpy(m.data() + t, &bytes, N);
          flags = false;
        } else if constexpr (std::is_same_v<M, float> || std::is_same_v<M, double>) {
          store_values<M>(m.data() + t, L::select(keep, L::splat(1.0), L::splat(0.0)));
          flags = false;
        }
      }
    }
#endif
    if (weights || flags) store_each(t, k, q, keep, weights, flags);
  }
};

//! Calls step(t, k, old, rollout, valid) for the row's tokens in vectors of N (k of them in the
//! row: N, fewer in the tail).
template <class L, class T, class M, class F>
ULORL_ALWAYS_INLINE void for_each_vector(const row_reader<L, T, M>& rd, F&& step) {
  constexpr std::size_t N = L::N;
  const std::size_t len = rd.o.size();
  typename L::V ol, rl;
  typename L::M valid;
  std::size_t t = 0;
  for (; t + N <= len; t += N) {
    rd.load(t, N, ol, rl, valid);
    step(t, N, ol, rl, valid);
  }
  if (t < len) {
    rd.load(t, len - t, ol, rl, valid);
    step(t, len - t, ol, rl, valid);
  }
}

template <class L, class T, class M>
[[nodiscard]] row_reader<L, T, M> reader_of(const inputs<T, M>& in, std::size_t b) noexcept {
  return {in.old_log_prob.row(b), in.rollout_log_prob.row(b), in.mask.empty() ? vector_view<const M>() : in.mask.row(b)};
}

//! The fold of sum_t x m (the row scan's, in its order) and, with Check, of whether every log-prob
//! and log-ratio of the row is finite.
template <class L, bool Check>
struct log_ratio_fold {
  lane_sum<L> sx{};
  typename L::M finite = L::mask_of(true);
  ULORL_ALWAYS_INLINE void operator()(std::size_t, std::size_t, typename L::V ol, typename L::V rl, typename L::M valid) noexcept {
    const typename L::V x = ol - rl;
    if constexpr (Check) {
      constexpr double inf = std::numeric_limits<double>::infinity();
      const typename L::V ao = abs_lanes<L>(ol), ar = abs_lanes<L>(rl), ax = abs_lanes<L>(x);
      finite = finite & (ao < inf) & (ar < inf) & (ax < inf);
    }
    sx.add(valid, x);
  }
};

//! sum_t x m of a row, in the row scan's order (its finiteness is what validate_values checks).
template <class L, class T, class M>
[[nodiscard]] double row_log_ratio_sum(const row_reader<L, T, M>& rd) noexcept {
  log_ratio_fold<L, false> f;
  for_each_vector(rd, f);
  return f.sx.total();
}

//! The values of the inputs: finite log-probs, a finite difference at every token and a finite
//! sum of the differences in every row. One lane-wise pass; the exact checks, which throw naming
//! the first bad element, run only when it finds a problem.
template <class L = scan_lanes, class T, class M>
void validate_values(std::string_view fn, const inputs<T, M>& in) {
  bool ok = true;
  for (std::size_t b = 0; b < in.old_log_prob.rows() && ok; ++b) {
    log_ratio_fold<L, true> f;
    for_each_vector(reader_of<L>(in, b), f);
    ok = !any_lane<L>(lanes_not<L>(f.finite)) && std::isfinite(f.sx.total());
  }
  if (ok) return;
  require_all_finite(fn, "old_log_prob", in.old_log_prob);
  require_all_finite(fn, "rollout_log_prob", in.rollout_log_prob);
  for (std::size_t b = 0; b < in.old_log_prob.rows(); ++b) {
    const auto o = in.old_log_prob.row(b), r = in.rollout_log_prob.row(b);
    for (std::size_t t = 0; t < o.size(); ++t)
      if (!std::isfinite(static_cast<double>(o[t]) - static_cast<double>(r[t])))
        ulorl::detail::fail_at(fn, "rollout_log_prob", static_cast<std::int64_t>(in.rollout_log_prob.flat_index(b, t)), r[t],
                        "old_log_prob - rollout_log_prob overflows");
    const double sum = row_log_ratio_sum(reader_of<L>(in, b));
    if (!std::isfinite(sum))
      ulorl::detail::fail_at(fn, "rollout_log_prob", static_cast<std::int64_t>(in.rollout_log_prob.flat_index(b, 0)), sum,
                      "the row's sum of old_log_prob - rollout_log_prob overflows (row " + std::to_string(b) + ")");
  }
}

template <class L = scan_lanes, class T, class M>
void validate_call(std::string_view fn, const inputs<T, M>& in, const config& c, const outputs<T, M>& out) {
  validate(fn, c);
  validate_layout(fn, "old_log_prob", in.old_log_prob);
  require_same_shape(fn, "rollout_log_prob", in.rollout_log_prob, "old_log_prob", in.old_log_prob);
  if (!in.mask.empty()) {
    require_same_shape(fn, "mask", in.mask, "old_log_prob", in.old_log_prob);
    require_binary_mask(fn, "mask", in.mask);
  }
  if (!out.weights.empty()) require_same_shape(fn, "outputs.weights", out.weights, "old_log_prob", in.old_log_prob);
  if (!out.mask.empty()) require_same_shape(fn, "outputs.mask", out.mask, "old_log_prob", in.old_log_prob);
  validate_values<L>(fn, in);
}

}  // namespace ULORL_ISA

//! The largest weight `is` can give (+inf: unbounded), and whether a dropped weight can be NaN
//! (ratio_overflow::nan_when_masked with a ratio that can overflow).
struct weight_bound {
  double max;
  bool nan_possible;
};
[[nodiscard]] inline weight_bound bound_of(const importance_sampling_config& is) noexcept {
  if (is.level == is_level::none) return {1.0, false};
  const double e = std::exp(is.log_ratio_clamp);  // +inf for an unbounded clamp
  // ratio_overflow::zero maps an overflowed ratio to 0: the others are finite doubles.
  const double rho_max = is.overflow == ratio_overflow::zero && !std::isfinite(e) ? std::numeric_limits<double>::max() : e;
  const bool can_overflow = !std::isfinite(rho_max);
  if (is.weighting == is_weighting::truncate) return {std::min(is.upper, std::max(rho_max, is.lower)), false};
  const bool nan = is.overflow == ratio_overflow::nan_when_masked && can_overflow;
  if (is.weighting == is_weighting::mask) return {std::min(is.upper, rho_max), nan};
  return {rho_max, nan};  // geometric_gate passes the raw ratio
}

inline namespace ULORL_ISA {

//! reject(t + l, w[l]) for the first lane l of `bad` (out of line, as exp_edges).
template <class L, class Reject>
ULORL_NOINLINE void reject_first(std::size_t t, typename L::M bad, typename L::V w, const Reject& reject) {
  for (std::size_t l = 0; l < L::N; ++l)
    if (lane<L>(bad, l)) reject(t + l, lane<L>(w, l));
}

//! The chain's criteria by statistic: their indices in the chain.
struct criteria_split {
  std::array<std::size_t, rejection_chain::capacity> sequence{}, token{};
  std::size_t sequence_count = 0, token_count = 0;
  explicit criteria_split(const chain_plan& chain) noexcept {
    for (std::size_t i = 0; i < chain.size; ++i) {
      if (chain.items[i].criterion.statistic == rs_statistic::token) token[token_count++] = i;
      else sequence[sequence_count++] = i;
    }
  }
};
//! The sequence criteria's sums and maxima (apart from a pass's other sums: an array indexed at
//! run time would keep them out of registers).
template <class L>
struct criteria_sums {
  std::array<lane_sum<L>, rejection_chain::capacity> sum{};
  std::array<lane_extremum<L, true>, rejection_chain::capacity> max = lowest();
  static std::array<lane_extremum<L, true>, rejection_chain::capacity> lowest() noexcept {
    std::array<lane_extremum<L, true>, rejection_chain::capacity> a{};
    for (auto& x : a) x = {-std::numeric_limits<double>::infinity()};
    return a;
  }
};

//! Where a row's weights come from (each its own compiled pass).
enum class weight_mode {
  none,   //!< level none: 1
  row,    //!< sequence level: the row's weight
  gate,   //!< geometric_gate: the token ratio or dropped, by the row's gate
  token,  //!< token level, truncate / mask: the weighed token ratio
};

//! One pass over a row's tokens, vector by vector. With Sums, the row's token count, sum of
//! log-ratios, (Diag) the diagnostics' sums and the sequence criteria's statistics; with Weights,
//! every position's weight (mode W) and keep flag, their statistics and (Write) the outputs. A row
//! whose weights and keep-mask need none of its sums (token or no weights, no sequence criterion)
//! takes one pass with both; the others two. `reject(t, w)` throws for a weight not finite in T.
template <bool Sums, bool Diag, bool Weights, bool Write, weight_mode W, class L, class T, class M, class Reject>
struct row_pass {
  using V = typename L::V;
  using K = typename L::M;
  static constexpr double inf = std::numeric_limits<double>::infinity();
  const importance_sampling_config& is;
  const chain_plan& chain;
  const criteria_split& criteria;
  criteria_sums<L>& crit;
  const row_writer<L, T, M>& out;
  const Reject& reject;
  double diagnostic_clamp;
  double row_weight;  //!< W == row
  bool zero_masked, neutral, gate, seq_keep;
  // Sums
  lane_sum<L> n{}, sx{}, so{}, sr{}, abs_sum{}, k3_sum{}, chi2_sum{};
  lane_extremum<L, true> abs_max{0.0};
  // Weights
  lane_sum<L> out_of_bounds{}, weight_sum{}, capped_sum{}, capped_sq_sum{}, rejected{};
  lane_extremum<L, false> unit_min{inf};
  lane_extremum<L, true> unit_max{-inf}, weight_max{0.0};

  ULORL_ALWAYS_INLINE void operator()(std::size_t t, std::size_t k, V ol, V rl, K valid) {
    const V x = ol - rl;
    if constexpr (Sums) {
      n.add(valid, L::splat(1.0)), sx.add(valid, x);
      if constexpr (Diag) {
        so.add(valid, ol), sr.add(valid, rl);
        const V ax = abs_lanes<L>(x);
        abs_sum.add(valid, ax), abs_max.add(valid, ax);
        k3_sum.add(valid, k3_lanes<L>(ol, rl) * L::splat(0x1p-64));  // statistics::k3_sum's scale
        chi2_sum.add(valid, chi2_lanes<L>(x, diagnostic_clamp));
      }
      for (std::size_t j = 0; j < criteria.sequence_count; ++j) {
        const auto& item = chain.items[criteria.sequence[j]];
        const V v = criterion_value<L>(item, ol, rl);
        if (item.criterion.statistic == rs_statistic::sequence_max) crit.max[j].add(valid, v);
        else crit.sum[j].add(valid, v);
      }
    }
    if constexpr (Weights) {
      V w = L::splat(1.0);
      if constexpr (W != weight_mode::none) {
        const K live = k == L::N ? L::mask_of(true) : first_lanes<L>(k);
        if constexpr (W == weight_mode::row) {
          w = zero_masked ? L::select(valid, L::splat(row_weight), L::splat(0.0)) : L::splat(row_weight);
        } else {
          const V rho = ratio_lanes<L>(neutral ? L::select(valid, x, L::splat(0.0)) : x, is);
          V wt;
          if constexpr (W == weight_mode::gate) {
            wt = gate ? rho : dropped_lanes<L>(rho, is);
          } else {
            wt = weigh_lanes<L>(rho, is);
            out_of_bounds.add(lanes_and<L>(valid, lanes_not<L>(inside_lanes<L>(rho, is))), L::splat(1.0));
          }
          // Masked positions whose weight is 0 (masked_positions::zero) are not checked.
          const K bad = lanes_and<L>(live & (zero_masked ? valid : L::mask_of(true)), lanes_not<L>(representable_lanes<L, T>(wt)));
          if (any_lane<L>(bad)) [[unlikely]]
            reject_first<L>(t, bad, wt, reject);
          unit_min.add(valid, wt), unit_max.add(valid, wt);
          w = zero_masked ? L::select(valid, wt, L::splat(0.0)) : wt;
        }
        const V wc = L::select(is.upper < w, L::splat(is.upper), w);  // std::min(w, upper)
        weight_sum.add(valid, w), capped_sum.add(valid, wc), capped_sq_sum.add(valid, wc * wc);
        weight_max.add(live, w);
      }
      K keep = L::mask_of(seq_keep);
      for (std::size_t j = 0; j < criteria.token_count; ++j) {
        const auto& item = chain.items[criteria.token[j]];
        keep = lanes_and<L>(keep, keeps_lanes<L>(item, criterion_value<L>(item, ol, rl)));
      }
      rejected.add(lanes_and<L>(valid, lanes_not<L>(keep)), L::splat(1.0));
      if constexpr (Write) out.store(t, k, w, valid & keep);
    }
  }
};

//! Row b of the pass over the batch: its statistics into `st` (a fresh statistics per row: the
//! batch's are the rows' folded in row order, the same bits for every way the rows are split).
//! With Diag, the diagnostics (k3, chi-square, perplexities); with Write, the row's weights
//! (divided by `divisor`) into `w` and its keep-mask into `m` (either may be empty: not written).
//! Throws on a weight that is not finite in T (before anything is written when a pass without
//! Write ran first). Returns the largest weight of any position of the row.
//! Lane type `L`: each statistic is one partial sum per lane, folded in lane order at the end of
//! the row (row_pass).
template <bool Diag, bool Write, class L = scan_lanes, class T, class M>
double scan_row(std::string_view fn, const inputs<T, M>& in, const config& c, const chain_plan& chain, std::size_t b,
                double divisor, statistics& st, vector_view<T> w_out, vector_view<M> m_out) {
  using S = simd::scalar_lanes<double>;
  const auto& is = c.importance;
  const auto reject_weight = [&](std::size_t t, double w) {
    ulorl::detail::fail_at(fn, "rollout_log_prob", static_cast<std::int64_t>(in.rollout_log_prob.flat_index(b, t)),
                    t < in.rollout_log_prob.row_size(b) ? static_cast<double>(in.rollout_log_prob(b, t)) : 0.0,
                    "the importance weight (" + std::to_string(w) +
                        ") is not finite in the element type: exp(old_log_prob - rollout_log_prob) overflows and the "
                        "configuration neither bounds, clamps nor zeroes it");
  };
  const auto rd = reader_of<L>(in, b);
  const row_writer<L, T, M> wr(w_out, m_out, divisor);
  const criteria_split criteria(chain);
  criteria_sums<L> crit;
  const weight_mode mode = is.level == is_level::none       ? weight_mode::none
                           : is.level == is_level::sequence ? weight_mode::row
                           : is.weighting == is_weighting::geometric_gate ? weight_mode::gate
                                                                          : weight_mode::token;
  // Pass 1 (or the one pass): the sums.
  double tokens = 0, row_sum = 0;
  const auto fold_sums = [&](const auto& p) {
    tokens = p.n.total(), row_sum = p.sx.total();
    st.rows += 1, st.tokens += tokens, st.nonempty_rows += tokens > 0 ? 1 : 0, st.log_ratio_sum += row_sum;
    if constexpr (Diag) {
      st.abs_log_ratio_sum += p.abs_sum.total();
      st.abs_log_ratio_max = std::max(st.abs_log_ratio_max, p.abs_max.total());
      st.k3_sum += p.k3_sum.total();
      st.chi2_token_sum += p.chi2_sum.total();
      st.chi2_seq_sum += chi2_lanes<S>(row_sum, c.diagnostic_log_ratio_clamp);
      const double mo = tokens > 0 ? p.so.total() / tokens : 0.0, mr = tokens > 0 ? p.sr.total() / tokens : 0.0, delta = mr - mo;
      st.training_ppl_sum += std::exp(-mo), st.training_log_ppl_sum += -mo;
      st.rollout_ppl_sum += std::exp(-mr), st.rollout_log_ppl_sum += -mr;
      st.log_ppl_diff_sum += delta, st.log_ppl_abs_diff_sum += std::fabs(delta), st.ppl_ratio_sum += std::exp(delta);
      st.log_ppl_diff_max = std::max(st.log_ppl_diff_max, delta), st.log_ppl_diff_min = std::min(st.log_ppl_diff_min, delta);
    }
  };
  const auto fold_weights = [&](const auto& p, weight_mode w) {
    // At token level the weight units are the valid tokens: their count and sum are the tokens' and
    // the weights'. Within a row (a fresh `st`), sum_t w m is weight_sum.
    const double row_weight_sum = p.weight_sum.total(), row_rejected = p.rejected.total();
    if (w == weight_mode::token || w == weight_mode::gate) {
      if (w == weight_mode::token) st.out_of_bounds_tokens += p.out_of_bounds.total();
      st.unit_count += tokens, st.unit_sum += row_weight_sum;
      st.unit_min = std::min(st.unit_min, p.unit_min.total()), st.unit_max = std::max(st.unit_max, p.unit_max.total());
    }
    if (w != weight_mode::none) {
      st.weight_sum += row_weight_sum, st.capped_weight_sum += p.capped_sum.total(), st.capped_weight_sq_sum += p.capped_sq_sum.total();
      if (tokens > 0) st.row_mean_weight_sum += row_weight_sum / tokens;
    }
    st.rejected_tokens += row_rejected;
    st.rejected_rows += row_rejected > 0 ? 1 : 0;
    return p.weight_max.total();
  };
  using R = decltype(reject_weight);
  const bool zero = is.masked == masked_positions::zero, neutral = is.masked == masked_positions::neutral;
  // One pass: weights and keep-mask that need none of the row's sums.
  if (criteria.sequence_count == 0 && (mode == weight_mode::none || mode == weight_mode::token)) {
    const auto one_pass = [&]<weight_mode W>() {
      row_pass<true, Diag, true, Write, W, L, T, M, R> p{is, chain, criteria, crit, wr, reject_weight, c.diagnostic_log_ratio_clamp,
                                                         1.0, zero, neutral, true, true};
      for_each_vector(rd, p);
      fold_sums(p);
      return fold_weights(p, W);
    };
    return mode == weight_mode::none ? one_pass.template operator()<weight_mode::none>() : one_pass.template operator()<weight_mode::token>();
  }
  {
    row_pass<true, Diag, false, false, weight_mode::none, L, T, M, R> p{is, chain, criteria, crit, wr, reject_weight,
                                                                        c.diagnostic_log_ratio_clamp, 1.0, zero, neutral, true, true};
    for_each_vector(rd, p);
    fold_sums(p);
  }
  bool seq_keep = true;
  for (std::size_t j = 0; j < criteria.sequence_count; ++j) {
    const auto& item = chain.items[criteria.sequence[j]];
    const auto s = item.criterion.statistic;
    const double sum = crit.sum[j].total();
    const double stat = s == rs_statistic::sequence_sum ? sum
                        : tokens > 0 ? (s == rs_statistic::sequence_mean ? sum / tokens : crit.max[j].total())
                                     : 0.0;
    seq_keep = seq_keep && keeps_lanes<S>(item, stat);
  }
  // The row's ratio (sequence level) or gate (geometric_gate).
  double row_weight = 1;
  bool gate = true;
  if (mode == weight_mode::row) {
    const double rho = ratio_lanes<S>(row_sum, is);
    row_weight = weigh_lanes<S>(rho, is);
    if (!representable<T>(row_weight)) reject_weight(0, row_weight);
    const bool oob = !inside_lanes<S>(rho, is);
    st.out_of_bounds_rows += oob ? 1 : 0, st.out_of_bounds_tokens += oob ? tokens : 0;
    st.unit_count += 1, st.unit_sum += row_weight;
    st.unit_min = std::min(st.unit_min, row_weight), st.unit_max = std::max(st.unit_max, row_weight);
  } else if (mode == weight_mode::gate) {
    gate = tokens > 0 ? inside_lanes<S>(std::exp(row_sum / tokens), is)
                      : is.empty_rows == empty_row_gate::ratio_one && inside_lanes<S>(1.0, is);
    st.out_of_bounds_rows += gate ? 0 : 1, st.out_of_bounds_tokens += gate ? 0 : tokens;
  }
  if (mode == weight_mode::none && criteria.token_count == 0 && !Write) {
    // Nothing depends on the tokens: every valid token is kept iff the row is.
    st.rejected_tokens += seq_keep ? 0 : tokens, st.rejected_rows += !seq_keep && tokens > 0 ? 1 : 0;
    return 0;
  }
  // Pass 2: weights and keep-mask.
  const auto weights_pass = [&]<weight_mode W>() {
    row_pass<false, false, true, Write, W, L, T, M, R> p{is, chain, criteria, crit, wr, reject_weight, c.diagnostic_log_ratio_clamp,
                                                         row_weight, zero, neutral, gate, seq_keep};
    for_each_vector(rd, p);
    return fold_weights(p, W);
  };
  switch (mode) {
    case weight_mode::none: return weights_pass.template operator()<weight_mode::none>();
    case weight_mode::row: return weights_pass.template operator()<weight_mode::row>();
    case weight_mode::gate: return weights_pass.template operator()<weight_mode::gate>();
    case weight_mode::token: break;
  }
  return weights_pass.template operator()<weight_mode::token>();
}

//! Every row (scan_row), the rows' statistics folded in row order into `st`.
template <bool Diag, bool Write, class L = scan_lanes, class T, class M>
double scan(std::string_view fn, const inputs<T, M>& in, const config& c, const outputs<T, M>& out, double divisor,
            statistics& st) {
  const chain_plan chain = plan_chain(c.rejection);
  double weight_max = 0;
  for (std::size_t b = 0; b < in.old_log_prob.rows(); ++b) {
    statistics row;
    const double m = scan_row<Diag, Write, L>(fn, in, c, chain, b, divisor, row, out.weights.empty() ? vector_view<T>() : out.weights.row(b),
                                              out.mask.empty() ? vector_view<M>() : out.mask.row(b));
    st += row;
    weight_max = std::max(weight_max, m);
  }
  return weight_max;
}

}  // namespace ULORL_ISA

inline metrics finalize_in(std::string_view fn, const statistics& s, const config& c) {
  validate(fn, c);
  if (c.reject_empty_batch && !(s.tokens > 0)) ulorl::detail::fail(fn, "mask", "no valid token in the batch");
  metrics m;
  m.totals = s, m.tokens = s.tokens, m.rows = s.rows;
  const auto& is = c.importance;
  if (is.level != is_level::none) {
    m.weight_mean = per(s.weight_sum, s.tokens);
    if (s.tokens > 0) {
      if (s.capped_weight_sq_sum > 0) {
        // 1 / (sum z^2 m / N) with z = w~ / (mean w~ + 1e-8), the epsilon of verl's metric.
        const double d = s.capped_weight_sum / s.tokens + 1e-8;
        m.effective_sample_size = d * d * s.tokens / s.capped_weight_sq_sum;
      } else {
        if (c.require_effective_sample_size)
          ulorl::detail::fail(fn, "weights", "every importance weight is 0: the effective sample size 1 / 0 is undefined");
        m.effective_sample_size = std::numeric_limits<double>::infinity();
      }
    }
    if (s.unit_count > 0)
      m.unit_weight_mean = s.unit_sum / s.unit_count, m.unit_weight_min = s.unit_min, m.unit_weight_max = s.unit_max;
    m.out_of_bounds_token_fraction = per(s.out_of_bounds_tokens, s.tokens);
    m.out_of_bounds_row_fraction = per(s.out_of_bounds_rows, s.rows);
    if (is.batch_normalize) {
      const double mu = is.level == is_level::token ? per(s.weight_sum, s.tokens)
                                                    : s.row_mean_weight_sum / std::max(s.nonempty_rows, 1e-8);
      if (mu > 1e-8) m.batch_norm_factor = mu;
    }
  }
  m.rejected_token_fraction = per(s.rejected_tokens, s.tokens);
  m.rejected_row_fraction = per(s.rejected_rows, s.rows);
  m.kl = per(-s.log_ratio_sum, s.tokens);
  m.k3_kl = std::ldexp(per(s.k3_sum, s.tokens), 64);
  m.chi2_token = s.tokens > 0 ? s.chi2_token_sum / s.tokens - 1 : 0.0;
  m.chi2_seq = s.rows > 0 ? s.chi2_seq_sum / s.rows - 1 : 0.0;
  m.training_ppl = per(s.training_ppl_sum, s.rows), m.training_log_ppl = per(s.training_log_ppl_sum, s.rows);
  m.rollout_ppl = per(s.rollout_ppl_sum, s.rows), m.rollout_log_ppl = per(s.rollout_log_ppl_sum, s.rows);
  m.log_ppl_diff = per(s.log_ppl_diff_sum, s.rows), m.log_ppl_abs_diff = per(s.log_ppl_abs_diff_sum, s.rows);
  m.ppl_ratio = per(s.ppl_ratio_sum, s.rows);
  if (s.rows > 0) m.log_ppl_diff_max = s.log_ppl_diff_max, m.log_ppl_diff_min = s.log_ppl_diff_min;
  m.abs_log_ratio_mean = per(s.abs_log_ratio_sum, s.tokens), m.abs_log_ratio_max = s.abs_log_ratio_max;
  // A metric beyond the double range (a log-ratio old - rollout that overflows, a sum of them, an
  // exp of one) is an error naming it, never inf or NaN. The effective sample size of all-zero
  // weights is +inf by definition (config::require_effective_sample_size rejects it).
  for (const auto& [name, value] :
       {std::pair<std::string_view, double>{"metrics.weight_mean", m.weight_mean}, {"metrics.unit_weight_mean", m.unit_weight_mean},
        {"metrics.kl", m.kl}, {"metrics.k3_kl", m.k3_kl}, {"metrics.chi2_token", m.chi2_token}, {"metrics.chi2_seq", m.chi2_seq},
        {"metrics.training_ppl", m.training_ppl}, {"metrics.training_log_ppl", m.training_log_ppl},
        {"metrics.rollout_ppl", m.rollout_ppl}, {"metrics.rollout_log_ppl", m.rollout_log_ppl},
        {"metrics.log_ppl_diff", m.log_ppl_diff}, {"metrics.log_ppl_abs_diff", m.log_ppl_abs_diff},
        {"metrics.log_ppl_diff_max", m.log_ppl_diff_max}, {"metrics.log_ppl_diff_min", m.log_ppl_diff_min},
        {"metrics.ppl_ratio", m.ppl_ratio}, {"metrics.abs_log_ratio_mean", m.abs_log_ratio_mean},
        {"metrics.abs_log_ratio_max", m.abs_log_ratio_max}})
    require_result_in_range<double>(fn, name, -1, value);
  return m;
}

}  // namespace detail

namespace detail {
inline namespace ULORL_ISA {
//! accumulate() with the row scan's lane type `L` (the scalar one: the scalar build's results).
template <class L = scan_lanes, class T, class M>
[[nodiscard]] statistics accumulate_in(std::string_view fn, const inputs<T, M>& in, const config& c, const outputs<T, M>& out) {
  validate_call<L>(fn, in, c, out);
  statistics st, again;
  (void)scan<true, false, L>(fn, in, c, out, 1.0, st);
  if (!out.weights.empty() || !out.mask.empty()) (void)scan<false, true, L>(fn, in, c, out, 1.0, again);
  return st;
}
//! apply() with the row scan's lane type `L`.
template <class L = scan_lanes, class T, class M>
metrics apply_in(std::string_view fn, const inputs<T, M>& in, const config& c, const outputs<T, M>& out) {
  validate_call<L>(fn, in, c, out);
  statistics st, again;
  const double weight_max = scan<true, false, L>(fn, in, c, out, 1.0, st);
  const metrics m = finalize_in(fn, st, c);
  if (!representable<T>(weight_max / m.batch_norm_factor))
    ulorl::detail::fail_value(fn, "batch_norm_factor", m.batch_norm_factor, "the largest weight divided by it overflows");
  if (!out.weights.empty() || !out.mask.empty()) (void)scan<false, true, L>(fn, in, c, out, m.batch_norm_factor, again);
  return m;
}
}  // namespace ULORL_ISA
}  // namespace detail

// The batch functions run the row scan compiled with the including translation unit's ISA: tagged
// (core/simd.hpp).
inline namespace ULORL_ISA {

//! Phase 1 of the two-phase use: validates everything, then writes this part's weights (not
//! batch-normalised) and keep-mask and returns its statistics. Nothing is written on error.
template <class T, class M>
[[nodiscard]] statistics accumulate(const inputs<T, M>& in, const outputs<T, M>& out, const config& c) {
  return detail::accumulate_in("rollout_correction::accumulate", in, c, out);
}

}  // namespace ULORL_ISA

//! Phase 2: the metrics of summed statistics (and the batch-normalisation divisor). Throws for an
//! empty batch (config::reject_empty_batch) or all-zero weights (config::require_effective_sample_size).
[[nodiscard]] inline metrics finalize(const statistics& total, const config& c) {
  return detail::finalize_in("rollout_correction::finalize", total, c);
}

//! Phase 3: divides every weight of a part by m.batch_norm_factor (nothing to do when it is 1).
//! Throws, writing nothing, if a divided weight would not be finite in T.
template <class T>
void normalize_weights(token_view<T> weights, const metrics& m) {
  constexpr std::string_view fn = "rollout_correction::normalize_weights";
  validate_layout(fn, "weights", weights);
  const double f = m.batch_norm_factor;
  require_divisor(fn, "batch_norm_factor", f);
  if (f == 1) return;
  for (std::size_t b = 0; b < weights.rows(); ++b) {
    const auto w = weights.row(b);
    for (std::size_t t = 0; t < w.size(); ++t)
      if (!detail::representable<std::remove_cv_t<T>>(static_cast<double>(w[t]) / f))
        ulorl::detail::fail_at(fn, "weights", static_cast<std::int64_t>(weights.flat_index(b, t)), w[t], "weight / batch_norm_factor overflows");
  }
  for (std::size_t b = 0; b < weights.rows(); ++b) {
    const auto w = weights.row(b);
    for (std::size_t t = 0; t < w.size(); ++t) w[t] = static_cast<std::remove_cv_t<T>>(static_cast<double>(w[t]) / f);
  }
}

inline namespace ULORL_ISA {

//! The whole batch in one call: weights (batch-normalised when configured), keep-mask and metrics.
//! Validates everything and computes the metrics before writing: nothing is written on error.
template <class T, class M>
metrics apply(const inputs<T, M>& in, const outputs<T, M>& out, const config& c) {
  return detail::apply_in("rollout_correction::apply", in, c, out);
}

}  // namespace ULORL_ISA

}  // namespace rollout_correction
ULORL_NAMESPACE_END
