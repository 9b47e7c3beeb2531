// ulorl/loss/policy_loss.hpp — the fused policy loss: one pass over the token arrays
// (logp, old logp, advantages, mask, optional reference logp, rollout-correction weights, entropy)
// producing the loss, d loss / d logp, d loss / d entropy and the metrics.
//
//   loss = sum_bt agg_weight(b) m[b,t] ( w[b,t] objective(b,t) + kl_coef kl(b,t) - entropy_coef H[b,t] )
//
// with the objective of objectives.hpp, the KL estimator of kl.hpp, and the partition-exact
// aggregation weights of aggregation.hpp (the normaliser is the global batch's, passed in). Both
// layouts (padded + mask, packed + offsets + mask), float and double; the per-row inner loop over
// contiguous rows is branch-free and vectorises (ulorl's own exp, no libm call).
//
// `policy_token_loss` is the per-token building block for callers that produce log-probs themselves
// (the fused-from-logits path in ulorl/logits/, CUDA kernels): token-level objectives only.
#pragma once

#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/entropy.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/metrics.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/ratio.hpp"

#if defined(__GNUC__) || defined(__clang__)
#define ULORL_NOINLINE __attribute__((noinline))
#else
#define ULORL_NOINLINE
#endif
// GCC does not schedule instructions before register allocation on x86 by default; the row kernel
// is a long chain of dependent vector operations (two exponentials per token), and the
// register-pressure-aware pre-RA scheduler interleaves its independent chains: +7-11% on the
// clip-higher + k3 kernel (docs/losses.md §10.2). Only the row kernels get it (glibc uses the same
// attribute in production); ULORL_LOSS_NO_SCHED turns it off.
#if defined(__GNUC__) && !defined(__clang__) && !defined(ULORL_LOSS_NO_SCHED)
#define ULORL_LOSS_SCHED __attribute__((optimize("schedule-insns", "sched-pressure")))
#else
#define ULORL_LOSS_SCHED
#endif

// ---- explicit-SIMD fast path ----------------------------------------------------------------------
// GCC 12 does not auto-vectorise the token loop (bool flags, mixed element widths, the structs of
// the scalar building blocks: "no vectype"), and a scalar loop with data-dependent branches runs
// at ~35 ns/token on random advantages. The fast path below writes the same per-token formulas
// with GCC/Clang vector extensions (portable across ISAs; the width follows the ISA the including
// translation unit is compiled for, so vector arguments never change the ABI: 16 bytes for SSE2,
// 32 with AVX, 64 with AVX-512). Every lane computes exactly the scalar formula of
// policy_token_loss_t (same operations in the same order; only FMA contraction may differ), the
// metrics go to per-lane accumulators (double sums, integer counts, min/max in T) reduced once
// per row, and a row's tail is run through the same vector kernel on a padded local copy, so a
// token's result does not depend on its position. Define ULORL_LOSS_NO_SIMD to disable.
#if !defined(ULORL_LOSS_NO_SIMD) && (defined(__GNUC__) || defined(__clang__)) && !defined(ULORL_DEVICE_COMPILE)
#define ULORL_LOSS_SIMD 1
#if defined(ULORL_LOSS_VEC_BYTES)
// user override (16, 32 or 64; at most the ISA's vector width, or vector arguments change the ABI)
#elif defined(__AVX512F__)
#define ULORL_LOSS_VEC_BYTES 64
#elif defined(__AVX__)
#define ULORL_LOSS_VEC_BYTES 32
#else
#define ULORL_LOSS_VEC_BYTES 16
#endif
#endif

// The batch functions' code depends on the vector width above, i.e. on the flags of the including
// translation unit. They live in an inline namespace named after the width, so that objects built
// with different flags (-march=native next to a portable build) never merge one variant into the
// other at link time (an ODR violation that could run AVX-512 code on a CPU without it). Types and
// the per-token scalar functions (the same code everywhere) are not tagged.
#define ULORL_LOSS_ISA_CAT2(a, b) a##b
#define ULORL_LOSS_ISA_CAT(a, b) ULORL_LOSS_ISA_CAT2(a, b)
#if defined(ULORL_LOSS_SIMD)
#define ULORL_LOSS_ISA ULORL_LOSS_ISA_CAT(loss_v, ULORL_LOSS_VEC_BYTES)
#else
#define ULORL_LOSS_ISA loss_scalar
#endif

ULORL_NAMESPACE_BEGIN

//! Inputs of one micro-batch. All views share log_prob's shape; optional views are empty when absent.
template <class T, class M = T>
struct policy_loss_inputs {
  token_view<const T> log_prob;
  token_view<const T> old_log_prob;
  token_view<const T> advantages;
  token_view<const M> mask;
  token_view<const T> ref_log_prob{};  //!< required when kl_coef != 0
  token_view<const T> weights{};       //!< rollout-correction weights (detached); absent: 1
  token_view<const T> entropy{};       //!< required when entropy_coef != 0
};

struct policy_loss_config {
  objective_config objective{};
  kl_config kl{};
  double kl_coef = 0.0;       //!< beta of the KL loss term; 0: no term (ref_log_prob unused)
  double entropy_coef = 0.0;  //!< entropy bonus coefficient; 0: no term
  //! The step's normaliser (global_normalizer). For gmpo the denominator is the number of sequences
  //! (the loss is a mean over rows) and the mode only weighs the KL / entropy terms.
  agg_normalizer normalizer{};
  //! true (default): every token value is scanned before anything is computed; a NaN/Inf input or
  //! a mask value other than 0/1 throws ulorl::error naming the argument and index, and no output
  //! is written. false: for inputs the caller trusts, those scans (one extra read of every input)
  //! are skipped; shapes, layouts and the configuration are still checked. A NaN/Inf then flows
  //! into the loss (and into the gradient as far as torch's clamp rule lets it: a NaN argument is
  //! outside every clamp, so clamped terms pass no gradient), and any non-zero mask value counts as
  //! a valid token.
  bool check_values = true;
};

struct policy_loss_result {
  double loss = 0;          //!< pg_loss + kl_loss + entropy_loss
  double pg_loss = 0;       //!< aggregated objective
  double kl_loss = 0;       //!< aggregated kl_coef * kl
  double entropy_loss = 0;  //!< aggregated -entropy_coef * H
  loss_metrics metrics{};
};

// ---- per-token API --------------------------------------------------------------------------------

template <class T>
struct token_loss_params {
  objective_params<T> objective;
  kl_params<T> kl;
  T kl_coef;
  T entropy_coef;
};
template <class T>
[[nodiscard]] constexpr token_loss_params<T> make_token_loss_params(const policy_loss_config& c) noexcept {
  return {make_objective_params<T>(c.objective), make_kl_params<T>(c.kl), static_cast<T>(c.kl_coef),
          static_cast<T>(c.entropy_coef)};
}

//! One token's contribution before the aggregation weight.
template <class T>
struct token_loss {
  T loss;               //!< weight * objective + kl_coef * kl - entropy_coef * H
  T pg;                 //!< weight * objective
  T kl;                 //!< KL estimate (importance-weighted when configured)
  T dlogp;              //!< d loss / d logp
  T dentropy;           //!< d loss / d H
  T ratio;              //!< importance ratio (after the log-ratio clamp)
  T log_ratio_clamped;  //!< clamp(logp - old)
  unsigned flags;       //!< token_flag bits
};

//! Token-level objectives with the objective and the KL estimator fixed at compile time (the form
//! the vectorised loops and kernels use). `HasKL` false ignores `ref`.
template <objective_kind K, bool HasKL, kl_estimator E, bool IW, class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr token_loss<T> policy_token_loss_t(T logp, T old_logp, T ref, T adv, T weight, T entropy,
                                                                   const token_loss_params<T>& p) noexcept {
  static_assert(K != objective_kind::gspo && K != objective_kind::gmpo, "sequence-level objectives need the row");
  const auto rv = clamped_ratio(logp, old_logp, p.objective.bound);
  objective_value<T> o;
  if constexpr (K == objective_kind::cispo) o = cispo(logp, rv.ratio, adv, p.objective);
  else if constexpr (K == objective_kind::sapo) o = sapo(rv.ratio, rv.dratio, adv, p.objective);
  else if constexpr (K == objective_kind::policy_gradient) o = policy_gradient(logp, adv);
  else o = clipped_surrogate(rv.ratio, rv.dratio, adv, p.objective);
  token_loss<T> r{};
  r.pg = weight * o.loss;
  r.dlogp = weight * o.dloss;
  r.kl = T(0);
  if constexpr (HasKL) {
    const auto k = kl_term_t<E>(logp, ref, p.kl);
    if constexpr (IW) {
      r.kl = k.value * rv.ratio;
      r.dlogp += p.kl_coef * (k.grad * rv.ratio + k.value * rv.dratio);
    } else {
      r.kl = k.value;
      r.dlogp += p.kl_coef * k.grad;
    }
  }
  r.dentropy = -p.entropy_coef;
  r.loss = r.pg + p.kl_coef * r.kl - p.entropy_coef * entropy;
  r.ratio = rv.ratio;
  r.log_ratio_clamped = rv.log_ratio;
  r.flags = o.flags;
  return r;
}

//! Token-level objectives (ppo_clip, cispo, sapo, policy_gradient). `ref` is read only when
//! kl_coef != 0, `entropy` only when entropy_coef != 0; pass weight 1 without rollout correction.
template <class T>
[[nodiscard]] ULORL_HD ULORL_LOSS_INLINE constexpr token_loss<T> policy_token_loss(T logp, T old_logp, T ref, T adv, T weight, T entropy,
                                                                 const token_loss_params<T>& p) noexcept {
  const T e = p.entropy_coef != T(0) ? entropy : T(0);
  auto with_kind = [&](auto kind_tag) {
    constexpr objective_kind K = decltype(kind_tag)::value;
    if (p.kl_coef == T(0)) return policy_token_loss_t<K, false, kl_estimator::k3, false>(logp, old_logp, ref, adv, weight, e, p);
    auto with_est = [&](auto iw_tag) {
      constexpr bool IW = decltype(iw_tag)::value;
      switch (p.kl.estimator) {
        case kl_estimator::k1: return policy_token_loss_t<K, true, kl_estimator::k1, IW>(logp, old_logp, ref, adv, weight, e, p);
        case kl_estimator::abs: return policy_token_loss_t<K, true, kl_estimator::abs, IW>(logp, old_logp, ref, adv, weight, e, p);
        case kl_estimator::k2: return policy_token_loss_t<K, true, kl_estimator::k2, IW>(logp, old_logp, ref, adv, weight, e, p);
        default: return policy_token_loss_t<K, true, kl_estimator::k3, IW>(logp, old_logp, ref, adv, weight, e, p);
      }
    };
    return p.kl.importance_weighted ? with_est(std::true_type{}) : with_est(std::false_type{});
  };
  switch (p.objective.kind) {
    case objective_kind::cispo: return with_kind(std::integral_constant<objective_kind, objective_kind::cispo>{});
    case objective_kind::sapo: return with_kind(std::integral_constant<objective_kind, objective_kind::sapo>{});
    case objective_kind::policy_gradient:
      return with_kind(std::integral_constant<objective_kind, objective_kind::policy_gradient>{});
    default: return with_kind(std::integral_constant<objective_kind, objective_kind::ppo_clip>{});
  }
}

namespace detail {
inline namespace ULORL_LOSS_ISA {

//! Per-row accumulators (double), folded into the result once per row.
struct row_sums {
  double pg = 0, kl = 0, ent = 0;
  double clipped = 0, low = 0, high = 0, dual = 0;
  double nlr = 0, nlrc = 0, k3 = 0, ratio = 0;
  double rmin = std::numeric_limits<double>::infinity(), rmax = -std::numeric_limits<double>::infinity();
};

template <class T>
ULORL_ALWAYS_INLINE void fold_token(row_sums& s, bool valid, const token_loss<T>& r, T logp, T old_logp, T entropy) {
  const double v = valid ? 1.0 : 0.0;
  s.pg += valid ? static_cast<double>(r.pg) : 0.0;
  s.kl += valid ? static_cast<double>(r.kl) : 0.0;
  s.ent += valid ? static_cast<double>(entropy) : 0.0;
  s.clipped += v * static_cast<double>((r.flags & flag_clipped) != 0);
  s.low += v * static_cast<double>((r.flags & flag_clipped_low) != 0);
  s.high += v * static_cast<double>((r.flags & flag_clipped_high) != 0);
  s.dual += v * static_cast<double>((r.flags & flag_dual_clipped) != 0);
  s.nlr += valid ? static_cast<double>(old_logp) - static_cast<double>(logp) : 0.0;
  s.nlrc += valid ? -static_cast<double>(r.log_ratio_clamped) : 0.0;
  s.k3 += valid ? static_cast<double>(exp_minus_one_minus_x(r.log_ratio_clamped)) : 0.0;
  s.ratio += valid ? static_cast<double>(r.ratio) : 0.0;
  const double rr = static_cast<double>(r.ratio);
  s.rmin = valid && rr < s.rmin ? rr : s.rmin;
  s.rmax = valid && rr > s.rmax ? rr : s.rmax;
}

inline void fold_row(policy_loss_result& res, const row_sums& s, double w, double kl_coef, double ent_coef, double n) {
  res.pg_loss += w * s.pg;
  // A row without valid tokens adds exactly 0, also when w * coef overflows (inf * 0 would be NaN).
  res.kl_loss += s.kl == 0.0 ? 0.0 : w * kl_coef * s.kl;
  res.entropy_loss += s.ent == 0.0 ? 0.0 : -w * ent_coef * s.ent;
  auto& m = res.metrics;
  m.rows += 1;
  m.tokens += n;
  m.sequences += n > 0 ? 1.0 : 0.0;
  m.clipped += s.clipped, m.clipped_low += s.low, m.clipped_high += s.high, m.dual_clipped += s.dual;
  m.neg_log_ratio += s.nlr, m.neg_log_ratio_clamped += s.nlrc, m.approx_kl_k3 += s.k3;
  m.ratio_sum += s.ratio;
  m.ratio_min = s.rmin < m.ratio_min ? s.rmin : m.ratio_min;
  m.ratio_max = s.rmax > m.ratio_max ? s.rmax : m.ratio_max;
  m.kl_sum += s.kl, m.entropy_sum += s.ent;
}

//! f(std::bool_constant<b>{}...) for run-time flags b...: each flag becomes a template argument of
//! the kernel that `f` instantiates (2^k instantiations, no loop-invariant branches inside).
template <class F>
decltype(auto) with_flags(F&& f) {
  return f();
}
template <class F, class... Flags>
decltype(auto) with_flags(F&& f, bool b, Flags... rest) {
  if (b) return with_flags([&](auto... t) { return f(std::true_type{}, t...); }, rest...);
  return with_flags([&](auto... t) { return f(std::false_type{}, t...); }, rest...);
}

#if defined(ULORL_LOSS_SIMD)
namespace loss_simd {

//! bool masks are read as bytes (a vector of bool does not exist).
template <class M>
using mask_elem_t = std::conditional_t<std::is_same_v<std::remove_cv_t<M>, bool>, std::uint8_t, std::remove_cv_t<M>>;

template <class T, std::size_t Bytes>
struct lanes {
  static constexpr std::size_t N = Bytes / sizeof(T);
  using I = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
  typedef T V __attribute__((vector_size(Bytes)));
  typedef I IV __attribute__((vector_size(Bytes)));
  typedef double DV __attribute__((vector_size(N * sizeof(double))));  // never passed by value

  // `x - 0` keeps the sign of -0 (`0 + x` would not).
  static ULORL_LOSS_INLINE V splat(T x) noexcept { return x - V{}; }
  static ULORL_LOSS_INLINE V load(const T* p) noexcept {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static ULORL_LOSS_INLINE void store(T* p, V v) noexcept { std::memcpy(p, &v, sizeof v); }
  //! -1 where mask != 0, else 0.
  template <class M>
  static ULORL_LOSS_INLINE IV valid_lanes(const M* p) noexcept {
    using E = mask_elem_t<M>;
    typedef E MV __attribute__((vector_size(N * sizeof(E))));
    MV m;
    std::memcpy(&m, p, sizeof m);
    return __builtin_convertvector(m != E(0), IV);
  }
  //! clamp(x, lo, hi) for lo <= hi (NaN stays NaN), written as min then max so that it compiles to
  //! the two instructions (minps/maxps have exactly these select semantics).
  static ULORL_LOSS_INLINE V clamp(V x, V lo, V hi) noexcept {
    const V t = x > hi ? hi : x;
    return t < lo ? lo : t;
  }
  static ULORL_LOSS_INLINE IV passes(V x, V lo, V hi) noexcept { return (lo <= x) & (x <= hi); }
  // Masked accumulation. `acc + (m ? x : 0)` and `m ? acc + x : acc` are the same bits (a sum that
  // starts at +0 is never -0, and acc + 0 == acc otherwise). With AVX-512 the second form is one
  // merge-masked instruction and the first two; without mask registers the first is shorter (an
  // and, then the add), so each ISA gets its own. min/max keep minps/maxps semantics (a NaN x
  // leaves acc as it is); counters subtract the -1/0 valid lanes.
#if defined(__AVX512F__)
  static constexpr bool mask_registers = true;
#else
  static constexpr bool mask_registers = false;
#endif
  static ULORL_LOSS_INLINE V add_where(V acc, IV m, V x) noexcept {
    if constexpr (mask_registers) return m ? acc + x : acc;
    else return acc + (m ? x : V{});
  }
  static ULORL_LOSS_INLINE V sub_where(V acc, IV m, V x) noexcept {
    if constexpr (mask_registers) return m ? acc - x : acc;
    else return acc - (m ? x : V{});
  }
  //! acc + 1 where f and valid (valid: -1 / 0 lanes).
  static ULORL_LOSS_INLINE IV count_where(IV acc, IV f, IV valid) noexcept {
    if constexpr (mask_registers) return f ? acc - valid : acc;
    else return acc - (valid & f);
  }
  static ULORL_LOSS_INLINE V min_where(V acc, IV m, V x) noexcept {
    if constexpr (mask_registers) {
      return m ? (x < acc ? x : acc) : acc;
    } else {
      const V y = m ? x : splat(std::numeric_limits<T>::infinity());
      return y < acc ? y : acc;
    }
  }
  static ULORL_LOSS_INLINE V max_where(V acc, IV m, V x) noexcept {
    if constexpr (mask_registers) {
      return m ? (x > acc ? x : acc) : acc;
    } else {
      const V y = m ? x : splat(-std::numeric_limits<T>::infinity());
      return y > acc ? y : acc;
    }
  }
  //! a += x (lane-wise, in double); x = 0.
  static ULORL_LOSS_INLINE void flush(DV& a, V& x) noexcept {
    a += __builtin_convertvector(x, DV);
    x = V{};
  }

  //! loss_exp(x, em1), lane-wise (ratio.hpp's implementation), for x already clamped to exp's range.
  static ULORL_LOSS_INLINE V exp_in_range(V x, V& em1) noexcept { return detail::exp_in_range<V, T, IV>(x, em1); }
  static ULORL_LOSS_INLINE V exp(V x) noexcept {
    using C = exp_constants<T>;
    V em1;
    return exp_in_range(clamp(x, splat(C::lo), splat(C::hi)), em1);
  }
  //! Bounds of clamp(clamp(x, -b, b), exp's range) as one clamp (b >= 0; b = inf: exp's range).
  static ULORL_LOSS_INLINE T exp_lo(T b) noexcept { return -b > exp_constants<T>::lo ? -b : exp_constants<T>::lo; }
  static ULORL_LOSS_INLINE T exp_hi(T b) noexcept { return b < exp_constants<T>::hi ? b : exp_constants<T>::hi; }
};

//! Tokens of a unit-stride row before the first element of `p` on a vector boundary (64 bytes at
//! most): the row kernel and the value scan take them separately (the peel), so that the vector
//! loop's loads and stores do not straddle cache lines when the arrays share logp's alignment
//! (malloc'd blocks sit 16 bytes past one). 0 for rows of fewer than 8 vectors, where one more
//! partial vector would cost more than it saves, and for a pointer not aligned to T. docs/losses.md §10.4.
template <class T, std::size_t Bytes>
[[nodiscard]] inline std::size_t peel(const T* p, std::size_t n) noexcept {
  constexpr std::size_t align = Bytes < 64 ? Bytes : 64;
  const std::size_t off = reinterpret_cast<std::uintptr_t>(p) % align;
  return off != 0 && off % sizeof(T) == 0 && n >= 8 * (Bytes / sizeof(T)) ? (align - off) / sizeof(T) : 0;
}

//! The vectorised row kernel for one (objective, KL estimator, importance weighting, weights,
//! entropy) combination: unit-stride rows only. `Plain`: ppo_clip without delta and dual clip.
template <objective_kind K, bool Plain, bool HasKL, kl_estimator E, bool IW, bool HasW, bool HasEnt, class T, std::size_t Bytes>
struct row_kernel {
  using L = lanes<T, Bytes>;
  using V = typename L::V;
  using IV = typename L::IV;
  using DV = typename L::DV;
  static constexpr std::size_t N = L::N;

  //! Sums are kept per lane in T for at most `block` vectors, then added to per-lane doubles (a
  //! float->double conversion of every term would double the loop's work and its registers).
  static constexpr std::size_t block = sizeof(T) == 4 ? 32 : 1u << 30;
  //! Vectors per loop iteration (the same steps in the same order: bit-identical results). double:
  //! 4, measured +22-29% at 1M and +24-28% at 16M tokens (four independent exp chains in one block
  //! for the scheduler); float: 1 (2 and 4 were not faster: its step already holds 16 lanes, and
  //! the spills grow). The unrolled loop is a plain inner loop that GCC fully unrolls: the same
  //! unrolling written with a lambda cost 3% (double) and 10-14% (float, even at 1). docs/losses.md §10.5.
  static constexpr std::size_t unroll = sizeof(T) == 8 ? 4 : 1;
  struct accumulators {
    DV pg{}, kl{}, en{}, nlr{}, nlrc{}, k3{}, ratio{};
    V s_pg{}, s_kl{}, s_en{}, s_nlr{}, s_nlrc{}, s_k3{}, s_ratio{};
    IV clip{}, low{}, high{}, dual{}, cnt{};
    V rmin = L::splat(std::numeric_limits<T>::infinity()), rmax = L::splat(-std::numeric_limits<T>::infinity());
  };

  //! N tokens: the lanes of policy_token_loss_t, the gradient store and the metric folds.
  static ULORL_LOSS_INLINE void step(const T* lpp, const T* oldp, const T* advp, IV valid, const T* refp, const T* wp,
                                     const T* ep, T* gp, T w, const token_loss_params<T>& p, accumulators& a) noexcept {
    const auto& op = p.objective;
    const V lp = L::load(lpp), old = L::load(oldp), adv = L::load(advp);
    const V zero{};
    // clamped_ratio; passes(x, -B, B) is clamp(x, -B, B) == x (NaN included)
    const V x = lp - old;
    const V bound = L::splat(op.bound);
    const V xc = L::clamp(x, -bound, bound);
    V k3v;  // k3 of KL(old || new) over tokens drawn from old: (r - 1) - log r
    // loss_exp(xc) clamps xc to exp's range: one clamp of x to both ranges is the same, and off
    // the critical path of xc.
    const V r = L::exp_in_range(L::clamp(x, L::splat(L::exp_lo(op.bound)), L::splat(L::exp_hi(op.bound))), k3v);
    const V dr = x == xc ? r : zero;
    // objective
    V ol, od;
    IV f_clip{}, f_low{}, f_high{}, f_dual{};
    const V lo = L::splat(op.lo), hi = L::splat(op.hi);
    if constexpr (K == objective_kind::cispo) {
      const V rc = L::clamp(r, lo, hi);
      ol = -rc * adv * lp, od = -rc * adv;
      f_clip = rc != r, f_low = r < lo, f_high = r > hi;
    } else if constexpr (K == objective_kind::sapo) {
      const V tau = adv > T(0) ? L::splat(op.tau_pos) : L::splat(op.tau_neg);
      const V s = T(1) / (T(1) + L::exp(-tau * (r - T(1))));
      ol = -s * (T(4) / tau) * adv, od = -T(4) * adv * s * (T(1) - s) * dr;
    } else if constexpr (K == objective_kind::policy_gradient) {
      ol = -adv * lp, od = -adv;
    } else if constexpr (Plain) {  // clipped_surrogate_plain
      const V rc = L::clamp(r, lo, hi);
      const V l1 = -adv * r, l2 = -adv * rc;
      f_clip = l2 > l1;
      ol = l1 > l2 ? l1 : l2;
      od = f_clip ? zero : -adv * dr;  // L2 > L1 only outside [lo, hi], where clamp passes nothing
      f_low = (r < lo) & (adv < T(0)), f_high = (r > hi) & (adv > T(0));
    } else {
      const V delta = L::splat(op.delta);
      const V r1 = r > delta ? delta : r;
      const V half_dr = T(0.5) * dr;
      const V dr1 = r > delta ? zero : (r == delta ? half_dr : dr);
      const V rc = L::clamp(r, lo, hi);
      const V drc = L::passes(r, lo, hi) ? dr : zero;
      const V l1 = -adv * r1, l2 = -adv * rc;
      const V d1 = -adv * dr1, d2 = -adv * drc;
      const V half = T(0.5) * (d1 + d2);
      const V c1 = l1 > l2 ? l1 : l2;
      const V dc1 = l1 > l2 ? d1 : (l2 > l1 ? d2 : half);
      const IV neg = adv < T(0);
      const V l3_any = -adv * op.dual_c;
      const V l3 = neg ? l3_any : L::splat(std::numeric_limits<T>::infinity());
      f_dual = neg & (c1 > l3);
      const V half_dc1 = T(0.5) * dc1;
      ol = c1 < l3 ? c1 : l3;
      od = c1 < l3 ? dc1 : (l3 < c1 ? zero : half_dc1);
      f_clip = l2 > l1, f_low = (r1 < lo) & neg, f_high = (r1 > hi) & (adv > T(0));
    }
    V wt = L::splat(T(1));
    if constexpr (HasW) wt = L::load(wp);
    const V pg = wt * ol;
    V dlogp = wt * od;
    V kl = zero;
    if constexpr (HasKL) {
      const V ref = L::load(refp);
      const V u0 = ref - lp;
      const V ic = L::splat(p.kl.input_clamp), oc = L::splat(p.kl.output_clamp);
      const V u = L::clamp(u0, -ic, ic);
      V v, dv;
      if constexpr (E == kl_estimator::k1) {
        v = -u, dv = L::splat(T(1));
      } else if constexpr (E == kl_estimator::abs) {
        v = u < T(0) ? -u : u, dv = u < T(0) ? L::splat(T(1)) : (u > T(0) ? L::splat(T(-1)) : zero);
      } else if constexpr (E == kl_estimator::k2) {
        v = T(0.5) * u * u, dv = -u;
      } else {
        V e;
        (void)L::exp_in_range(L::clamp(u0, L::splat(L::exp_lo(p.kl.input_clamp)), L::splat(L::exp_hi(p.kl.input_clamp))), e);
        v = e, dv = -(e + u);
      }
      const V value = L::clamp(v, -oc, oc);
      const IV pass = (u0 == u) & (v == value);  // passes() of the input and output clamps
      const V g = pass ? dv : zero;
      const IV st = p.kl.straight_through ? ~IV{} : IV{};  // loop-invariant: a select, not a branch
      const V grad = st ? lp - ref : g;
      if constexpr (IW) {
        kl = value * r;
        dlogp += p.kl_coef * (grad * r + value * dr);
      } else {
        kl = value;
        dlogp += p.kl_coef * grad;
      }
    }
    L::store(gp, valid ? w * dlogp : zero);
    a.s_pg = L::add_where(a.s_pg, valid, pg);
    if constexpr (HasKL) a.s_kl = L::add_where(a.s_kl, valid, kl);
    if constexpr (HasEnt) a.s_en = L::add_where(a.s_en, valid, L::load(ep));
    a.s_nlr = L::sub_where(a.s_nlr, valid, x);  // old - lp == -(lp - old) exactly
    a.s_nlrc = L::sub_where(a.s_nlrc, valid, xc);
    a.s_k3 = L::add_where(a.s_k3, valid, k3v);
    a.s_ratio = L::add_where(a.s_ratio, valid, r);
    a.cnt -= valid;
    a.clip = L::count_where(a.clip, f_clip, valid), a.low = L::count_where(a.low, f_low, valid);
    a.high = L::count_where(a.high, f_high, valid);
    if constexpr (!Plain) a.dual = L::count_where(a.dual, f_dual, valid);
    a.rmin = L::min_where(a.rmin, valid, r);
    a.rmax = L::max_where(a.rmax, valid, r);
  }

  //! m < N tokens on padded local copies (mask 0), so that no lane reads past the row.
  template <class M>
  static void partial(std::size_t m, const T* lp, const T* old, const T* adv, const M* mask, const T* ref, const T* wts,
                      const T* ent, T* grad, T w, const token_loss_params<T>& p, accumulators& a) noexcept {
    alignas(Bytes) T b_lp[N] = {}, b_old[N] = {}, b_adv[N] = {}, b_ref[N] = {}, b_w[N] = {}, b_e[N] = {}, b_g[N] = {};
    mask_elem_t<M> b_m[N] = {};
    for (std::size_t l = 0; l < m; ++l) {
      b_lp[l] = lp[l], b_old[l] = old[l], b_adv[l] = adv[l];
      b_m[l] = static_cast<mask_elem_t<M>>(mask[l]);
      if constexpr (HasKL) b_ref[l] = ref[l];
      if constexpr (HasW) b_w[l] = wts[l];
      if constexpr (HasEnt) b_e[l] = ent[l];
    }
    step(b_lp, b_old, b_adv, L::valid_lanes(b_m), b_ref, b_w, b_e, b_g, w, p, a);
    for (std::size_t l = 0; l < m; ++l) grad[l] = b_g[l];
  }

  //! One row of n tokens; returns its valid-token count. The peel (tokens before the first
  //! vector-aligned logp) and the tail run through partial().
  template <class M>
  static ULORL_NOINLINE ULORL_LOSS_SCHED std::size_t row(std::size_t n, const T* ULORL_RESTRICT lp, const T* ULORL_RESTRICT old,
                                        const T* ULORL_RESTRICT adv, const M* ULORL_RESTRICT mask, const T* ULORL_RESTRICT ref,
                                        const T* ULORL_RESTRICT wts, const T* ULORL_RESTRICT ent, T* ULORL_RESTRICT grad, T w,
                                        const token_loss_params<T>& params, row_sums& s) noexcept {
    const token_loss_params<T> p = params;  // local copy: cannot alias the stores
    accumulators a;
    auto flush = [&a] {
      L::flush(a.pg, a.s_pg), L::flush(a.nlr, a.s_nlr), L::flush(a.nlrc, a.s_nlrc), L::flush(a.k3, a.s_k3);
      L::flush(a.ratio, a.s_ratio);
      if constexpr (HasKL) L::flush(a.kl, a.s_kl);
      if constexpr (HasEnt) L::flush(a.en, a.s_en);
    };
    std::size_t t = peel<T, Bytes>(lp, n);
    if (t != 0) {
      partial(t, lp, old, adv, mask, ref, wts, ent, grad, w, p, a);
      flush();
    }
    while (t + N <= n) {
      const std::size_t stop = n - t >= block * N ? t + block * N : n - (n - t) % N;
      if constexpr (unroll > 1) {
        for (; t + unroll * N <= stop; t += unroll * N) {
#pragma GCC unroll 16
          for (std::size_t u = t; u < t + unroll * N; u += N)
            step(lp + u, old + u, adv + u, L::valid_lanes(mask + u), HasKL ? ref + u : nullptr, HasW ? wts + u : nullptr,
                 HasEnt ? ent + u : nullptr, grad + u, w, p, a);
        }
      }
      for (; t < stop; t += N)
        step(lp + t, old + t, adv + t, L::valid_lanes(mask + t), HasKL ? ref + t : nullptr, HasW ? wts + t : nullptr,
             HasEnt ? ent + t : nullptr, grad + t, w, p, a);
      flush();
    }
    if (t < n) {
      // Absent optional arrays are null: no arithmetic on them (UB), as in the vector loop.
      partial(n - t, lp + t, old + t, adv + t, mask + t, HasKL ? ref + t : nullptr, HasW ? wts + t : nullptr,
              HasEnt ? ent + t : nullptr, grad + t, w, p, a);
      flush();
    }
    std::size_t count = 0;
    for (std::size_t l = 0; l < N; ++l) {
      s.pg += a.pg[l], s.kl += a.kl[l], s.ent += a.en[l];
      s.clipped += static_cast<double>(a.clip[l]), s.low += static_cast<double>(a.low[l]);
      s.high += static_cast<double>(a.high[l]), s.dual += static_cast<double>(a.dual[l]);
      s.nlr += a.nlr[l], s.nlrc += a.nlrc[l], s.k3 += a.k3[l], s.ratio += a.ratio[l];
      const double lo = static_cast<double>(a.rmin[l]), hi = static_cast<double>(a.rmax[l]);
      s.rmin = lo < s.rmin ? lo : s.rmin;
      s.rmax = hi > s.rmax ? hi : s.rmax;
      count += static_cast<std::size_t>(a.cnt[l]);
    }
    return count;
  }
};

//! One pass over a unit-stride row of every array the configuration reads (KL: ref, W: weights,
//! E: entropy): true when every value is finite and every mask value is 0 or 1. All arrays in one
//! loop (one stream each, read once), not one loop per array: +20% at 16M tokens, where the scan
//! runs from memory. Finite is an integer test of the exponent field (not all ones), which
//! -ffinite-math-only cannot fold away: the running lane-wise maximum of `bits & exponent` over
//! the arrays stays below the exponent mask; the comparison runs once per row.
template <class T, class M, std::size_t Bytes, bool KL, bool W, bool E>
[[nodiscard]] inline bool row_values_ok(std::size_t n, const M* mask, const T* lp, const T* old, const T* adv, const T* ref, const T* wts,
                                        const T* ent) noexcept {
  using L = lanes<T, Bytes>;
  using I = typename L::I;
  using IV = typename L::IV;
  using ME = mask_elem_t<M>;
  constexpr bool bool_mask = std::is_same_v<std::remove_cv_t<M>, bool>;  // a bool is 0 or 1
  constexpr I em = std::is_same_v<T, float> ? I(0x7f800000) : I(0x7ff0000000000000LL);
  typedef ME MV __attribute__((vector_size(L::N * sizeof(ME))));
  const auto ex = [](const T* p) { return std::bit_cast<IV>(L::load(p)) & em; };
  const auto vmax = [](IV a, IV b) { return a > b ? a : b; };
  const auto finite = [](T v) { return (std::bit_cast<I>(v) & em) != em; };
  const auto scalar_ok = [&](std::size_t b, std::size_t e) {
    bool ok = true;
    for (std::size_t t = b; t < e; ++t)
      ok = ok && finite(lp[t]) && finite(old[t]) && finite(adv[t]) && (!KL || finite(ref[t])) && (!W || finite(wts[t])) &&
           (!E || finite(ent[t])) && (bool_mask || mask[t] == M(0) || mask[t] == M(1));
    return ok;
  };
  IV hi{};
  decltype(MV{} != MV{}) bad{};
  std::size_t t = peel<T, Bytes>(lp, n);
  if (!scalar_ok(0, t)) return false;
  for (; t + L::N <= n; t += L::N) {
    IV x = vmax(vmax(ex(lp + t), ex(old + t)), ex(adv + t));
    if constexpr (KL) x = vmax(x, ex(ref + t));
    if constexpr (W) x = vmax(x, ex(wts + t));
    if constexpr (E) x = vmax(x, ex(ent + t));
    hi = vmax(hi, x);
    if constexpr (!bool_mask) {
      MV m;
      std::memcpy(&m, mask + t, sizeof m);
      bad |= (m != ME(0)) & (m != ME(1));
    }
  }
  bool ok = true;
  for (std::size_t l = 0; l < L::N; ++l) ok = ok && hi[l] != em && bad[l] == 0;
  return ok && scalar_ok(t, n);
}

//! Valid tokens of a unit-stride mask row (vectorised count).
template <class M>
[[nodiscard]] inline std::size_t count_row(const M* p, std::size_t n) noexcept {
  std::size_t c = 0;
  for (std::size_t t = 0; t < n; ++t) c += p[t] != M(0);
  return c;
}

}  // namespace loss_simd
#endif  // ULORL_LOSS_SIMD

//! Any strides: the plain loop over views.
template <objective_kind K, bool HasKL, kl_estimator E, bool IW, class T, class M>
void token_row_strided(std::size_t n, vector_view<const T> lp, vector_view<const T> old, vector_view<const T> adv,
                       vector_view<const M> mask, vector_view<const T> ref, vector_view<const T> wts, vector_view<const T> ent,
                       vector_view<T> grad, T w, const token_loss_params<T>& p, row_sums& s) {
  for (std::size_t t = 0; t < n; ++t) {
    const bool valid = mask[t] != M(0);
    const T e = ent.empty() ? T(0) : ent[t];
    const auto r = policy_token_loss_t<K, HasKL, E, IW>(lp[t], old[t], HasKL ? ref[t] : T(0), adv[t], wts.empty() ? T(1) : wts[t], e, p);
    grad[t] = valid ? w * r.dlogp : T(0);
    fold_token(s, valid, r, lp[t], old[t], e);
  }
}

//! One row's sums, aggregation weight and valid-token count, before the fold into the result.
struct row_out {
  row_sums s;
  double w = 0;
  std::size_t tokens = 0;
  // Sequence-level objectives only: gmpo's row loss (added to pg_loss before the row's fold) and
  // gspo's row flags.
  bool has_direct = false, gspo = false, seq_low = false, seq_high = false;
  double pg_direct = 0;
};

inline void fold_out(policy_loss_result& res, const row_out& o, double kl_coef, double ent_coef) {
  if (o.has_direct) res.pg_loss += o.pg_direct;
  if (o.gspo) {
    res.metrics.seq_clipped_low += o.seq_low;
    res.metrics.seq_clipped_high += o.seq_high;
    res.metrics.seq_clipped_region += o.seq_low || o.seq_high;
  }
  fold_row(res, o.s, o.w, kl_coef, ent_coef, static_cast<double>(o.tokens));
}

//! Runs `one_row(b, out)` for every row and folds the rows into `res` in row order, so that the
//! result is the same bits for every executor and thread count. The sequential executor folds as
//! it goes (no allocation); any other collects the rows' sums first.
template <class T, class Exec, class OneRow>
void run_rows(std::size_t rows, const token_loss_params<T>& p, const Exec& exec, OneRow&& one_row, policy_loss_result& res) {
  const double kc = static_cast<double>(p.kl_coef), ec = static_cast<double>(p.entropy_coef);
  if constexpr (std::is_same_v<Exec, sequential_executor>) {
    (void)exec;
    for (std::size_t b = 0; b < rows; ++b) {
      row_out o;
      one_row(b, o);
      fold_out(res, o, kc, ec);
    }
  } else {
    std::vector<row_out> outs(rows);
    exec(rows, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t b = lo; b < hi; ++b) one_row(b, outs[b]);
    });
    for (const auto& o : outs) fold_out(res, o, kc, ec);
  }
}

template <objective_kind K, bool HasKL, kl_estimator E, bool IW, class T, class M, class Exec>
void token_rows(const policy_loss_inputs<T, M>& in, const agg_normalizer& norm, const token_loss_params<T>& p,
                token_view<T> grad, token_view<T> gent, policy_loss_result& res, const Exec& exec) {
  const bool has_w = !in.weights.empty(), has_ent = p.entropy_coef != T(0);
  // Unit-stride rows (the common case) take the vectorised kernel; any other strides the view loop.
  auto unit = [](const auto& v) { return v.rows() == 0 || v.row(0).stride() == 1; };
  const bool contiguous = unit(in.log_prob) && unit(in.old_log_prob) && unit(in.advantages) && unit(in.mask) &&
                          (!HasKL || unit(in.ref_log_prob)) && (!has_w || unit(in.weights)) &&
                          (!has_ent || unit(in.entropy)) && unit(grad);
  // ppo_clip without delta and dual clip: clipped_surrogate's plain form (the same values).
  const bool plain = p.objective.delta == std::numeric_limits<T>::infinity() && p.objective.dual_c == std::numeric_limits<T>::infinity();
  (void)plain;
  // Only seq_mean_token_mean's row weight depends on the row's token count.
  const bool per_row_weight = norm.mode == agg_mode::seq_mean_token_mean;
  auto one_row = [&](std::size_t b, row_out& o) {
    const std::size_t n = in.log_prob.row_size(b);
    row_sums& s = o.s;
    std::size_t& nb = o.tokens;
    double& wd = o.w;
#if defined(ULORL_LOSS_SIMD)
    if (contiguous) {
      const M* mk = in.mask.row(b).data();
      wd = row_weight(norm, per_row_weight ? loss_simd::count_row(mk, n) : 0);
      const T w = static_cast<T>(wd);
      const T* lp = in.log_prob.row(b).data();
      const T* old = in.old_log_prob.row(b).data();
      const T* adv = in.advantages.row(b).data();
      const T* ref = HasKL ? in.ref_log_prob.row(b).data() : nullptr;
      const T* wts = has_w ? in.weights.row(b).data() : nullptr;
      const T* ent = has_ent ? in.entropy.row(b).data() : nullptr;
      T* g = grad.row(b).data();
      // The optional inputs are compile-time, so that the kernel has no loop-invariant branches.
      auto run = [&](auto plain_tag, auto hw, auto he) {
        constexpr bool Plain = K == objective_kind::ppo_clip && decltype(plain_tag)::value;
        using kernel = loss_simd::row_kernel<K, Plain, HasKL, E, IW, decltype(hw)::value, decltype(he)::value, T, ULORL_LOSS_VEC_BYTES>;
        nb = kernel::row(n, lp, old, adv, mk, ref, wts, ent, g, w, p, s);
      };
      // Only ppo_clip has a plain form: the other objectives never instantiate it.
      with_flags(run, K == objective_kind::ppo_clip && plain, has_w, has_ent);
    } else
#endif
    {
      (void)contiguous;
      nb = row_tokens(in.mask, b);
      wd = row_weight(norm, nb);
      token_row_strided<K, HasKL, E, IW, T, M>(n, in.log_prob.row(b), in.old_log_prob.row(b), in.advantages.row(b),
                                           in.mask.row(b), HasKL ? in.ref_log_prob.row(b) : vector_view<const T>(),
                                           has_w ? in.weights.row(b) : vector_view<const T>(),
                                           has_ent ? in.entropy.row(b) : vector_view<const T>(), grad.row(b),
                                           static_cast<T>(wd), p, s);
    }
    if (has_ent) {  // d loss / d H = -coef * weight: independent of the other inputs
      const auto ge = gent.row(b);
      const auto mk = in.mask.row(b);
      const T gv = static_cast<T>(-wd * static_cast<double>(p.entropy_coef));
      for (std::size_t t = 0; t < n; ++t) ge[t] = mk[t] != M(0) ? gv : T(0);
    }
  };
  run_rows(in.log_prob.rows(), p, exec, one_row, res);
}

template <objective_kind K, class T, class M, class Exec>
void token_rows_kl(const policy_loss_inputs<T, M>& in, const agg_normalizer& norm, const token_loss_params<T>& p,
                   token_view<T> grad, token_view<T> gent, policy_loss_result& res, const Exec& exec) {
  if (p.kl_coef == T(0)) return token_rows<K, false, kl_estimator::k3, false>(in, norm, p, grad, gent, res, exec);
  auto run = [&](auto iw_tag) {
    constexpr bool IW = decltype(iw_tag)::value;
    switch (p.kl.estimator) {
      case kl_estimator::k1: return token_rows<K, true, kl_estimator::k1, IW>(in, norm, p, grad, gent, res, exec);
      case kl_estimator::abs: return token_rows<K, true, kl_estimator::abs, IW>(in, norm, p, grad, gent, res, exec);
      case kl_estimator::k2: return token_rows<K, true, kl_estimator::k2, IW>(in, norm, p, grad, gent, res, exec);
      default: return token_rows<K, true, kl_estimator::k3, IW>(in, norm, p, grad, gent, res, exec);
    }
  };
  return p.kl.importance_weighted ? run(std::true_type{}) : run(std::false_type{});
}

//! Sequence-level objectives (gspo, gmpo): a row pass for the sequence quantities, then the tokens.
template <class T, class M, class Exec>
void sequence_rows(const policy_loss_inputs<T, M>& in, const agg_normalizer& norm, const token_loss_params<T>& p,
                   token_view<T> grad, token_view<T> gent, policy_loss_result& res, const Exec& exec) {
  const bool has_ref = p.kl_coef != T(0), has_w = !in.weights.empty(), has_ent = p.entropy_coef != T(0);
  const auto& op = p.objective;
  auto one_row = [&](std::size_t b, row_out& out) {
    const auto lp = in.log_prob.row(b), old = in.old_log_prob.row(b), adv = in.advantages.row(b);
    const auto mk = in.mask.row(b);
    const auto g = grad.row(b);
    const std::size_t n = lp.size();
    const std::size_t nb = row_tokens(in.mask, b);
    const double nd = static_cast<double>(nb);
    const double wd = row_weight(norm, nb);
    row_sums& s = out.s;
    // Row pass: sum of log-ratios (gspo); gmpo's clipped log-ratios, advantages and log-weights.
    double xs = 0, ys = 0, as = 0, lws = 0;
    for (std::size_t t = 0; t < n; ++t) {
      if (mk[t] == M(0)) continue;
      const double x = static_cast<double>(lp[t]) - static_cast<double>(old[t]);
      xs += x;
      if (op.kind == objective_kind::gmpo) {
        ys += static_cast<double>(gmpo_log_ratio<T>(lp[t] - old[t], adv[t], op).y);
        as += static_cast<double>(adv[t]);
        if (has_w) lws += std::log(static_cast<double>(in.weights(b, t)) + 1e-10);
      }
    }
    double row_grad = 0;  // gspo through_mean: d loss / d (sequence log-ratio), spread over the row
    double gm_coef = 0;   // gmpo: d loss_b / d y_t (times 1/n_b)
    T seq_ratio = T(1), seq_dratio = T(0);
    bool row_low = false, row_high = false;
    if (op.kind == objective_kind::gspo) {
      const double sb = xs / (nb > 0 ? nd : 1.0);
      const T st = static_cast<T>(sb);
      const T rho = st > op.seq_max ? op.seq_max : st;
      seq_ratio = loss_exp(rho);
      seq_dratio = st <= op.seq_max ? seq_ratio : T(0);
    } else if (nb > 0) {
      const double ratio_b = loss_exp(ys / nd), adv_b = as / nd, wb = has_w ? loss_exp(lws / nd) : 1.0;
      const double lb = -adv_b * ratio_b * wb;
      out.has_direct = true;
      out.pg_direct = norm.scale / norm.denominator * lb;
      gm_coef = norm.scale / norm.denominator * lb / nd;
      seq_ratio = static_cast<T>(ratio_b);
    }
    const T w = static_cast<T>(wd);
    for (std::size_t t = 0; t < n; ++t) {
      const bool valid = mk[t] != M(0);
      const T x = lp[t] - old[t];
      const T wt = has_w ? in.weights(b, t) : T(1);
      token_loss<T> r{};
      T own = T(0);  // d loss / d logp_t through this token's own terms (before the agg weight)
      T gm_dy = T(0);
      if (op.kind == objective_kind::gspo) {
        const auto o = clipped_surrogate(seq_ratio, seq_dratio, adv[t], op);
        r.pg = wt * o.loss;
        r.flags = o.flags;
        if (op.seq_gradient == sequence_gradient::own_token) own += wt * o.dloss;
        else row_grad += valid ? wd * static_cast<double>(wt * o.dloss) : 0.0;
        row_low = row_low || (valid && (o.flags & flag_clipped_low));
        row_high = row_high || (valid && (o.flags & flag_clipped_high));
      } else {
        const auto gt = gmpo_log_ratio<T>(x, adv[t], op);
        r.flags = gt.flags;
        gm_dy = gt.dy;
      }
      if (has_ref) {
        const auto k = kl_term(lp[t], in.ref_log_prob(b, t), p.kl);
        T kv = k.value, kg = k.grad;
        if (p.kl.importance_weighted) {
          // gspo weighs by its sequence ratio (TRL); gmpo, whose ratio is a row statistic of clipped
          // log-ratios, by the token's own clamped ratio.
          const auto tr = clamped_ratio(lp[t], old[t], op.bound);
          const T iw = op.kind == objective_kind::gspo ? seq_ratio : tr.ratio;
          const T diw = op.kind == objective_kind::gspo ? seq_dratio : tr.dratio;
          kv = k.value * iw;
          kg = k.grad * iw;
          const T dk = k.value * diw;  // through the ratio
          if (op.kind == objective_kind::gspo && op.seq_gradient == sequence_gradient::through_mean)
            row_grad += valid ? wd * static_cast<double>(p.kl_coef * dk) : 0.0;
          else
            kg += dk;
        }
        r.kl = kv;
        own += p.kl_coef * kg;
      }
      const T e = has_ent ? in.entropy(b, t) : T(0);
      if (has_ent && valid) gent(b, t) = w * entropy_term(e, p.entropy_coef).grad;
      if (has_ent && !valid) gent(b, t) = T(0);
      r.ratio = seq_ratio;
      r.log_ratio_clamped = clamp(x, -op.bound, op.bound);
      // gmpo's objective is already in res.pg_loss (gm_coef carries its normaliser); r.pg stays 0.
      g[t] = valid ? static_cast<T>(wd * static_cast<double>(own) + gm_coef * static_cast<double>(gm_dy)) : T(0);
      fold_token(s, valid, r, lp[t], old[t], e);
    }
    if (op.kind == objective_kind::gspo && op.seq_gradient == sequence_gradient::through_mean && nb > 0) {
      const double spread = row_grad / nd;
      for (std::size_t t = 0; t < n; ++t)
        if (mk[t] != M(0)) g[t] = static_cast<T>(static_cast<double>(g[t]) + spread);
    }
    out.gspo = op.kind == objective_kind::gspo;
    out.seq_low = row_low, out.seq_high = row_high;
    out.w = wd, out.tokens = nb;
  };
  run_rows(in.log_prob.rows(), p, exec, one_row, res);
}

}  // namespace ULORL_LOSS_ISA
}  // namespace detail

#if defined(ULORL_LOSS_SIMD)
namespace detail {
inline namespace ULORL_LOSS_ISA {
//! True when every row of every input the configuration reads is unit-stride, the mask is 0/1 and
//! the values are finite; false means "run the exact checks".
//! The rows are scanned on `exec` (split as the loss splits them); the answer is their AND.
template <class T, class M, class Exec>
[[nodiscard]] bool values_ok_fast(const policy_loss_inputs<T, M>& in, const policy_loss_config& cfg, const Exec& exec) {
  constexpr std::size_t VB = ULORL_LOSS_VEC_BYTES;
  auto unit = [](const auto& v) { return v.rows() == 0 || v.row(0).stride() == 1; };
  const bool kl = cfg.kl_coef != 0.0, w = !in.weights.empty(), e = cfg.entropy_coef != 0.0;
  if (!(unit(in.mask) && unit(in.log_prob) && unit(in.old_log_prob) && unit(in.advantages) && (!kl || unit(in.ref_log_prob)) &&
        (!w || unit(in.weights)) && (!e || unit(in.entropy))))
    return false;
  const auto scan = [&](auto kl_tag, auto w_tag, auto e_tag) {
    const auto rows_ok = [&](std::size_t lo, std::size_t hi) {
      for (std::size_t b = lo; b < hi; ++b) {
        const T* ref = decltype(kl_tag)::value ? in.ref_log_prob.row(b).data() : nullptr;
        const T* wts = decltype(w_tag)::value ? in.weights.row(b).data() : nullptr;
        const T* ent = decltype(e_tag)::value ? in.entropy.row(b).data() : nullptr;
        if (!loss_simd::row_values_ok<T, M, VB, decltype(kl_tag)::value, decltype(w_tag)::value, decltype(e_tag)::value>(
                in.log_prob.row_size(b), in.mask.row(b).data(), in.log_prob.row(b).data(), in.old_log_prob.row(b).data(),
                in.advantages.row(b).data(), ref, wts, ent))
          return false;
      }
      return true;
    };
    if constexpr (std::is_same_v<Exec, sequential_executor>) {
      (void)exec;
      return rows_ok(0, in.log_prob.rows());
    } else {
      std::atomic<bool> ok{true};  // the executor returns after every block: its join orders these stores
      exec(in.log_prob.rows(), [&](std::size_t lo, std::size_t hi) {
        if (!rows_ok(lo, hi)) ok.store(false, std::memory_order_relaxed);
      });
      return ok.load(std::memory_order_relaxed);
    }
  };
  return with_flags(scan, kl, w, e);
}
}  // namespace ULORL_LOSS_ISA
}  // namespace detail
#endif

namespace detail {
//! Distinct tokens of an output token view address distinct elements (core/views.hpp's check on the
//! view's [B, T] strides, or on the packed array's stride). O(1).
template <class T>
void require_distinct_tokens(std::string_view fn, std::string_view arg, const token_view<T>& v) {
  if (v.rows() == 0) return;
  const vector_view<T> first = v.row(0);
  if (v.kind() == layout::packed) {
    require_distinct_elements(fn, arg, vector_view<T>(v.data(), v.size(), first.stride()));
    return;
  }
  const std::ptrdiff_t row_stride = v.rows() > 1 ? v.row(1).data() - first.data() : 0;
  require_distinct_elements(fn, arg, matrix_view<T>(v.data(), v.rows(), v.cols(), row_stride, first.stride()));
}
//! Two output token views of one shape must not start on the same element (O(1): catches one
//! buffer passed for both; the packed layout's equal-stride overlaps are exact).
template <class T>
void require_disjoint_tokens(std::string_view fn, std::string_view arg, const token_view<T>& a, std::string_view other,
                             const token_view<T>& b) {
  if (a.size() == 0 || b.size() == 0) return;
  if (a.kind() == layout::packed && b.kind() == layout::packed)
    require_disjoint(fn, arg, vector_view<T>(a.data(), a.size(), a.row(0).stride()), other,
                     vector_view<T>(b.data(), b.size(), b.row(0).stride()));
  else if (a.data() == b.data())
    detail::fail(fn, arg, "shares elements with the output '" + std::string(other) + "': outputs must not overlap");
}
}  // namespace detail

inline namespace ULORL_LOSS_ISA {

//! Validates the inputs and the configuration (throws ulorl::error naming argument and index).
//! The value scan of unit-stride rows runs on `exec`; the exact checks that name the index run on
//! the calling thread, only when the scan finds a problem or a view is strided.
template <class T, class M, class Exec = sequential_executor>
void validate_policy_loss(std::string_view fn, const policy_loss_inputs<T, M>& in, const policy_loss_config& cfg,
                          token_view<T> grad_log_prob, token_view<T> grad_entropy, const Exec& exec = Exec{}) {
  validate_layout(fn, "log_prob", in.log_prob);
  if (in.log_prob.rows() == 0) detail::fail(fn, "log_prob", "empty batch (B = 0): at least one response is required");
  require_same_shape(fn, "old_log_prob", in.old_log_prob, "log_prob", in.log_prob);
  require_same_shape(fn, "advantages", in.advantages, "log_prob", in.log_prob);
  require_same_shape(fn, "mask", in.mask, "log_prob", in.log_prob);
  require_same_shape(fn, "grad_log_prob", grad_log_prob, "log_prob", in.log_prob);
  if (cfg.kl_coef != 0.0) {
    if (in.ref_log_prob.empty() && !in.log_prob.empty()) detail::fail(fn, "ref_log_prob", "required when kl_coef != 0");
    require_same_shape(fn, "ref_log_prob", in.ref_log_prob, "log_prob", in.log_prob);
  }
  if (!in.weights.empty()) require_same_shape(fn, "weights", in.weights, "log_prob", in.log_prob);
  if (cfg.entropy_coef != 0.0) {
    if (in.entropy.empty() && !in.log_prob.empty()) detail::fail(fn, "entropy", "required when entropy_coef != 0");
    require_same_shape(fn, "entropy", in.entropy, "log_prob", in.log_prob);
    if (grad_entropy.empty() && !in.log_prob.empty()) detail::fail(fn, "grad_entropy", "required when entropy_coef != 0");
    require_same_shape(fn, "grad_entropy", grad_entropy, "log_prob", in.log_prob);
  }
  detail::require_distinct_tokens(fn, "grad_log_prob", grad_log_prob);
  if (cfg.entropy_coef != 0.0) {
    detail::require_distinct_tokens(fn, "grad_entropy", grad_entropy);
    detail::require_disjoint_tokens(fn, "grad_entropy", grad_entropy, "grad_log_prob", grad_log_prob);
  }
  validate_objective(fn, cfg.objective);
  validate_kl(fn, cfg.kl);
  require_finite(fn, "kl_coef", cfg.kl_coef);
  require_finite(fn, "entropy_coef", cfg.entropy_coef);
  validate_normalizer(fn, cfg.normalizer);
  if (!cfg.check_values) return;
#if defined(ULORL_LOSS_SIMD)
  // Unit-stride rows: one vectorised pass over all arrays per row, on `exec`; the exact checks
  // below (which throw with the index) run only when it finds a problem or the layout is strided.
  if (detail::values_ok_fast(in, cfg, exec)) return;
#else
  (void)exec;
#endif
  require_binary_mask(fn, "mask", in.mask);
  require_all_finite(fn, "log_prob", in.log_prob);
  require_all_finite(fn, "old_log_prob", in.old_log_prob);
  require_all_finite(fn, "advantages", in.advantages);
  if (cfg.kl_coef != 0.0) require_all_finite(fn, "ref_log_prob", in.ref_log_prob);
  if (!in.weights.empty()) require_all_finite(fn, "weights", in.weights);
  if (cfg.entropy_coef != 0.0) require_all_finite(fn, "entropy", in.entropy);
}

//! The fused policy loss of one micro-batch. Writes d loss / d logp into `grad_log_prob` (0 on
//! masked tokens) and, with an entropy term, d loss / d H into `grad_entropy`. Nothing is written
//! when validation fails (`cfg.check_values = false` skips the value scans: see
//! policy_loss_config). Summing the results of micro-batches that share `cfg.normalizer` gives
//! the full batch's loss, gradient and (via loss_metrics::merge) metrics. An empty micro-batch
//! (B = 0) is rejected, as every batch API of ulorl does (rows without valid tokens are fine); so
//! are gradient outputs whose strides make distinct tokens share an element, or that share one.
//!
//! `exec` runs the rows (ulorl/core/parallel.hpp: `thread_executor{k}`, or any pool wrapped as an
//! executor); the rows' sums are folded in row order afterwards, so the loss, the gradients and the
//! metrics are the same bits for every executor and thread count. Rows are the unit of work: a
//! batch of few long rows splits into few pieces. The value scan (check_values) runs on `exec`
//! too; the exact checks that name a bad value's index run on the calling thread.
template <class T, class M, class Exec>
[[nodiscard]] policy_loss_result policy_loss(const policy_loss_inputs<T, M>& in, const policy_loss_config& cfg,
                                             token_view<T> grad_log_prob, token_view<T> grad_entropy, const Exec& exec) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "policy_loss: T must be float or double");
  constexpr std::string_view fn = "policy_loss";
  validate_policy_loss(fn, in, cfg, grad_log_prob, grad_entropy, exec);
  const auto p = make_token_loss_params<T>(cfg);
  policy_loss_result res;
  const auto kind = cfg.objective.kind;
  if (kind == objective_kind::gspo || kind == objective_kind::gmpo) {
    detail::sequence_rows<T, M>(in, cfg.normalizer, p, grad_log_prob, grad_entropy, res, exec);
  } else {
    // Dispatch objective and KL estimator at compile time: the inner loop has no invariant branches.
    using detail::token_rows_kl;
    switch (kind) {
      case objective_kind::cispo:
        token_rows_kl<objective_kind::cispo>(in, cfg.normalizer, p, grad_log_prob, grad_entropy, res, exec);
        break;
      case objective_kind::sapo:
        token_rows_kl<objective_kind::sapo>(in, cfg.normalizer, p, grad_log_prob, grad_entropy, res, exec);
        break;
      case objective_kind::policy_gradient:
        token_rows_kl<objective_kind::policy_gradient>(in, cfg.normalizer, p, grad_log_prob, grad_entropy, res, exec);
        break;
      default: token_rows_kl<objective_kind::ppo_clip>(in, cfg.normalizer, p, grad_log_prob, grad_entropy, res, exec); break;
    }
  }
  res.loss = res.pg_loss + res.kl_loss + res.entropy_loss;
  return res;
}

//! The loss on the calling thread (sequential_executor: allocates nothing).
template <class T, class M>
[[nodiscard]] policy_loss_result policy_loss(const policy_loss_inputs<T, M>& in, const policy_loss_config& cfg,
                                             token_view<T> grad_log_prob, token_view<T> grad_entropy = {}) {
  return policy_loss(in, cfg, grad_log_prob, grad_entropy, sequential_executor{});
}

}  // namespace ULORL_LOSS_ISA

ULORL_NAMESPACE_END
