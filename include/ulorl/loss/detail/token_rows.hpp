// ulorl/loss/detail/token_rows.hpp — the rows of the token-level objectives: a SIMD row kernel for
// unit-stride rows and a scalar loop for any strides, both evaluating token_loss_lanes (the one
// formula) with their lane type.
//
// The kernel is instantiated per (objective, KL estimator, importance weighting) and in two forms:
// without rollout weights (the common configuration) and with them. The entropy term is not part
// of it: the term reads the entropy only for the loss's value, and its gradient does not depend on
// the other inputs, so a pass of its own (entropy_row) sums a row's entropy in the kernel's tiling
// (the same bits) and writes the term's gradient. Every lane computes exactly the scalar formula
// (same operations in the same order; only FMA contraction may differ); the metrics go to per-lane
// accumulators (sums in T for at most `block` vectors, then in double; integer counts; min/max in
// T) reduced once per row; a row's peel and tail run through the same vector step on a padded local
// copy, so a token's result does not depend on its position.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "ulorl/core/config.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/detail/rows.hpp"
#include "ulorl/loss/detail/token_loss.hpp"
#include "ulorl/loss/policy_loss_types.hpp"

ULORL_NAMESPACE_BEGIN
namespace detail {
inline namespace ULORL_ISA {

//! The parameters type of descriptor D in element type T.
template <class D, class T>
using params_of = decltype(std::declval<const D&>().template params<T>());

//! Any strides: the scalar loop over views. Returns whether every written gradient value is finite.
//! Store = false: the row's sums only (`grad` is not written; the vector rows' exact recount).
template <class Obj, class Est, class T, class M, class P, bool Store = true>
bool token_row_strided(std::size_t n, vector_view<const T> lp, vector_view<const T> old, vector_view<const T> adv,
                       vector_view<const M> mask, vector_view<const T> ref, vector_view<const T> wts, vector_view<const T> ent,
                       vector_view<T> grad, T w, const token_loss_params<T, P>& p, row_sums& s) {
  using L = simd::scalar_lanes<T>;
  constexpr bool has_kl = !std::is_same_v<Est, no_kl>;
  bool finite = true;
  for (std::size_t t = 0; t < n; ++t) {
    const bool valid = mask[t] != M(0);
    const T e = ent.empty() ? T(0) : ent[t];
    const auto r = token_loss_lanes<Obj, Est, true, L>(lp[t], old[t], has_kl ? ref[t] : T(0), adv[t],
                                                       wts.empty() ? T(1) : wts[t], p);
    if constexpr (Store) {
      const T g = valid ? w * r.dlogp : T(0);
      grad[t] = g;
      finite &= std::isfinite(g);
    }
    fold_token(s, valid, r.pg, r.kl, r.ratio, r.flags, lp[t], old[t], e);
  }
  return finite;
}

#if defined(ULORL_SIMD)
//! The tiling of a unit-stride row that every row pass shares, and on which a row's sums depend:
//! the peel (tokens before the first vector-aligned logp, simd::peel), then blocks of at most
//! `block` vectors whose sums are kept per lane in T and then added to per-lane doubles (a
//! float->double conversion of every term would double the loop's work and its registers), then
//! the tail; the lanes' doubles are added in lane order at the end of the row.
template <class T, std::size_t Bytes = ULORL_SIMD_BYTES>
struct row_tiling {
  using L = simd::vec_lanes<T, Bytes>;
  static constexpr std::size_t N = L::N;
  static constexpr std::size_t block = sizeof(T) == 4 ? 32 : 1u << 30;
  //! The end of the block that starts at token t of n (t + N <= n).
  [[nodiscard]] static constexpr std::size_t block_end(std::size_t t, std::size_t n) noexcept {
    return n - t >= block * N ? t + block * N : n - (n - t) % N;
  }
};

//! The entropy term of one unit-stride row: adds the entropy of the valid tokens (mask[t] != 0) to
//! `sum` lane by lane in row_tiling's order (the bits the row kernel would give it) and, with
//! Store, writes d loss / d H to `ge` (`gv` on valid tokens, 0 elsewhere; entropy_grad_row's
//! values) in the same pass.
template <bool Store, class T, class M, std::size_t Bytes = ULORL_SIMD_BYTES>
ULORL_NOINLINE void entropy_row(std::size_t n, const T* lp, const T* ent, const M* mask, T* ge, T gv, double& sum) noexcept {
  using R = row_tiling<T, Bytes>;
  using L = typename R::L;
  using V = typename L::V;
  constexpr std::size_t N = R::N;
  const V g = L::splat(gv), zero{};
  typename L::DV acc{};
  V s{};
  auto partial = [&](std::size_t t, std::size_t m) {  // m < N tokens on padded local copies
    alignas(Bytes) T b_e[N] = {}, b_g[N] = {};
    simd::mask_elem_t<M> b_m[N] = {};
    for (std::size_t l = 0; l < m; ++l) {
      b_e[l] = ent[t + l];
      b_m[l] = static_cast<simd::mask_elem_t<M>>(mask[t + l]);
    }
    const typename L::IV valid = L::valid_lanes(b_m);
    s = L::add_where(s, valid, L::load(b_e));
    L::flush(acc, s);
    if constexpr (!Store) return;
    L::store(b_g, valid ? g : zero);
    for (std::size_t l = 0; l < m; ++l) ge[t + l] = b_g[l];
  };
  std::size_t t = simd::peel<T, Bytes>(lp, n);
  if (t != 0) partial(0, t);
  // The gradient row, written and not read here, bypasses the caches where its vectors are aligned
  // (as they are when ge and lp are aligned alike): no read of each line before its write.
  const auto vectors = [&](auto stream) {
    while (t + N <= n) {
      const std::size_t stop = R::block_end(t, n);
      for (; t < stop; t += N) {
        const typename L::IV valid = L::valid_lanes(mask + t);
        s = L::add_where(s, valid, L::load(ent + t));
        if constexpr (Store) {
          if constexpr (decltype(stream)::value) L::store_stream(ge + t, valid ? g : zero);
          else L::store(ge + t, valid ? g : zero);
        }
      }
      L::flush(acc, s);
    }
  };
  if (Store && reinterpret_cast<std::uintptr_t>(ge + t) % Bytes == 0) {
    vectors(std::true_type{});
    simd::fence_streams();
  } else {
    vectors(std::false_type{});
  }
  if (t < n) partial(t, n - t);
  for (std::size_t l = 0; l < N; ++l) sum += acc[l];
}

//! The vectorised row kernel of one (objective, estimator), with or without rollout weights:
//! unit-stride rows only.
template <class Obj, class Est, bool HasW, class T, class P, std::size_t Bytes = ULORL_SIMD_BYTES>
struct row_kernel {
  using R = row_tiling<T, Bytes>;
  using L = typename R::L;
  using V = typename L::V;
  using IV = typename L::IV;
  using DV = typename L::DV;
  static constexpr std::size_t N = L::N;
  static constexpr bool has_kl = !std::is_same_v<Est, no_kl>;
  //! Vectors per loop iteration (the same steps in the same order: bit-identical results). double:
  //! 4 (four independent exp chains in one block for the scheduler); float: 1 (its step already
  //! holds 16 lanes, and the spills grow). The unrolled loop is a plain inner loop that GCC fully
  //! unrolls (the same unrolling written with a lambda is slower). bench/RESULTS.md, bench_loss.
  static constexpr std::size_t unroll = sizeof(T) == 8 ? 4 : 1;

  struct accumulators {
    DV pg{}, kl{}, nlr{}, nlrc{}, k3{}, ratio{};
    V s_pg{}, s_kl{}, s_nlr{}, s_nlrc{}, s_k3{}, s_ratio{};
    IV clip{}, low{}, high{}, dual{}, cnt{};
    V rmin = L::splat(std::numeric_limits<T>::infinity()), rmax = L::splat(-std::numeric_limits<T>::infinity());
  };

  //! N tokens: token_loss_lanes, the gradient store and the metric folds.
  static ULORL_ALWAYS_INLINE void step(const T* lpp, const T* oldp, const T* advp, IV valid, const T* refp, const T* wp,
                                       T* gp, T w, const token_loss_params<T, P>& p, accumulators& a) noexcept {
    const V lp = L::load(lpp), old = L::load(oldp), adv = L::load(advp);
    const V zero{};
    V ref{}, wt{};
    if constexpr (has_kl) ref = L::load(refp);
    if constexpr (HasW) wt = L::load(wp);
    const token_lanes<L> t = token_loss_lanes<Obj, Est, HasW, L>(lp, old, ref, adv, wt, p);
    const V g = valid ? w * t.dlogp : zero;
    L::store(gp, g);
    a.s_pg = L::add_where(a.s_pg, valid, t.pg);
    if constexpr (has_kl) a.s_kl = L::add_where(a.s_kl, valid, t.kl);
    a.s_nlr = L::sub_where(a.s_nlr, valid, t.ratio.x);  // old - lp == -(lp - old) exactly
    a.s_nlrc = L::sub_where(a.s_nlrc, valid, t.ratio.log_ratio);
    a.s_k3 = L::add_where(a.s_k3, valid, t.ratio.k3);
    // g * 0 is 0 for a finite stored gradient and NaN otherwise: a non-finite gradient value turns
    // the row's ratio sum into NaN (row() reports it), at the cost of one multiply-add and no
    // accumulator of its own.
    a.s_ratio = L::add_where(a.s_ratio, valid, t.ratio.ratio + g * zero);
    a.cnt -= valid;
    a.clip = L::count_where(a.clip, t.flags.clipped, valid), a.low = L::count_where(a.low, t.flags.low, valid);
    a.high = L::count_where(a.high, t.flags.high, valid), a.dual = L::count_where(a.dual, t.flags.dual, valid);
    a.rmin = L::min_where(a.rmin, valid, t.ratio.ratio);
    a.rmax = L::max_where(a.rmax, valid, t.ratio.ratio);
  }

  //! m < N tokens on padded local copies (mask 0), so that no lane reads past the row.
  template <class M>
  static void partial(std::size_t m, const T* lp, const T* old, const T* adv, const M* mask, const T* ref, const T* wts,
                      T* grad, T w, const token_loss_params<T, P>& p, accumulators& a) noexcept {
    alignas(Bytes) T b_lp[N] = {}, b_old[N] = {}, b_adv[N] = {}, b_ref[N] = {}, b_w[N] = {}, b_g[N] = {};
    simd::mask_elem_t<M> b_m[N] = {};
    for (std::size_t l = 0; l < m; ++l) {
      b_lp[l] = lp[l], b_old[l] = old[l], b_adv[l] = adv[l];
      b_m[l] = static_cast<simd::mask_elem_t<M>>(mask[l]);
      if constexpr (has_kl) b_ref[l] = ref[l];
      if constexpr (HasW) b_w[l] = wts[l];
    }
    step(b_lp, b_old, b_adv, L::valid_lanes(b_m), b_ref, b_w, b_g, w, p, a);
    for (std::size_t l = 0; l < m; ++l) grad[l] = b_g[l];
  }

  //! One row of n tokens in row_tiling's order; returns its valid-token count. The peel and the
  //! tail run through partial(). The mask row is unit-stride (unit_mask_rows).
  template <class M>
  static ULORL_NOINLINE ULORL_SCHED_PRESSURE std::size_t row(std::size_t n, const T* ULORL_RESTRICT lp, const T* ULORL_RESTRICT old,
                                                             const T* ULORL_RESTRICT adv, const M* ULORL_RESTRICT mask,
                                                             const T* ULORL_RESTRICT ref, const T* wts,
                                                             T* ULORL_RESTRICT grad, T w, const token_loss_params<T, P>& params,
                                                             row_sums& s, bool& grad_finite) noexcept {
    const token_loss_params<T, P> p = params;  // a local copy: cannot alias the stores
    accumulators a;
    auto flush = [&a] {
      L::flush(a.pg, a.s_pg), L::flush(a.nlr, a.s_nlr), L::flush(a.nlrc, a.s_nlrc), L::flush(a.k3, a.s_k3);
      L::flush(a.ratio, a.s_ratio);
      if constexpr (has_kl) L::flush(a.kl, a.s_kl);
    };
    std::size_t t = simd::peel<T, Bytes>(lp, n);
    if (t != 0) {
      partial(t, lp, old, adv, mask, ref, wts, grad, w, p, a);
      flush();
    }
    while (t + N <= n) {
      const std::size_t stop = R::block_end(t, n);
      if constexpr (unroll > 1) {
        for (; t + unroll * N <= stop; t += unroll * N) {
#pragma GCC unroll 16
          for (std::size_t u = t; u < t + unroll * N; u += N)
            step(lp + u, old + u, adv + u, L::valid_lanes(mask + u),
                 has_kl ? ref + u : nullptr, HasW ? wts + u : nullptr, grad + u, w, p, a);
        }
      }
      for (; t < stop; t += N)
        step(lp + t, old + t, adv + t, L::valid_lanes(mask + t),
             has_kl ? ref + t : nullptr, HasW ? wts + t : nullptr, grad + t, w, p, a);
      flush();
    }
    if (t < n) {
      // Absent arrays are null: no arithmetic on them (UB), as in the vector loop.
      partial(n - t, lp + t, old + t, adv + t, mask + t, has_kl ? ref + t : nullptr,
              HasW ? wts + t : nullptr, grad + t, w, p, a);
      flush();
    }
    std::size_t count = 0;
    double ratio = 0;
    for (std::size_t l = 0; l < N; ++l) {
      ratio += a.ratio[l];
      s.pg += a.pg[l], s.kl += a.kl[l];
      s.clipped += static_cast<double>(a.clip[l]), s.low += static_cast<double>(a.low[l]);
      s.high += static_cast<double>(a.high[l]), s.dual += static_cast<double>(a.dual[l]);
      s.nlr += a.nlr[l], s.nlrc += a.nlrc[l], s.k3 += a.k3[l], s.ratio += a.ratio[l];
      const double lo = static_cast<double>(a.rmin[l]), hi = static_cast<double>(a.rmax[l]);
      s.rmin = lo < s.rmin ? lo : s.rmin;
      s.rmax = hi > s.rmax ? hi : s.rmax;
      count += static_cast<std::size_t>(a.cnt[l]);
    }
    // Not finite: a stored gradient value is not, or the ratios' sum overflowed (the caller reads
    // the row's gradient back to tell).
    grad_finite = std::isfinite(ratio);
    return count;
  }
};

#endif  // ULORL_SIMD

//! Every row of a token-level objective `Obj` with KL estimator `Est` (or no_kl).
template <class Obj, class Est, class T, class M, class P, class Exec>
void token_rows(const policy_loss_inputs<T, M>& in, const agg_normalizer& norm, const token_loss_params<T, P>& p,
                token_view<T> grad, token_view<T> gent, policy_loss_result& res, const Exec& exec) {
  constexpr bool has_kl = !std::is_same_v<Est, no_kl>;
  const bool has_w = !in.weights.empty(), has_ent = p.entropy_coef != T(0);
  // Unit-stride rows (the common case; the mask may be a broadcast, e.g. the all-valid mask of an
  // absent one) take the vectorised kernel; any other strides the view loop.
  auto unit = [](const auto& v) { return v.rows() == 0 || v.row(0).stride() == 1; };
  const bool contiguous = unit(in.log_prob) && unit(in.old_log_prob) && unit(in.advantages) && unit_or_broadcast(in.mask) &&
                          (!has_kl || unit(in.ref_log_prob)) && (!has_w || unit(in.weights)) &&
                          (!has_ent || unit(in.entropy)) && unit(grad);
  // Only seq_mean_token_mean's row weight depends on the row's token count.
  const bool per_row_weight = norm.mode == agg_mode::seq_mean_token_mean;
#if defined(ULORL_SIMD)
  const unit_mask_rows<M> masks(contiguous ? in.mask : token_view<const M>());
#endif
  auto one_row = [&](std::size_t b, row_out& o) {
    const std::size_t n = in.log_prob.row_size(b);
    row_sums& s = o.s;
    std::size_t& nb = o.tokens;
    double& wd = o.w;
#if defined(ULORL_SIMD)
    if (contiguous) {
      const M* mk = masks.row(b);
      wd = row_weight(norm, per_row_weight ? masks.count(b, n) : 0);
      const T w = static_cast<T>(wd);
      const T* lp = in.log_prob.row(b).data();
      const T* old = in.old_log_prob.row(b).data();
      const T* adv = in.advantages.row(b).data();
      const T* ref = has_kl ? in.ref_log_prob.row(b).data() : nullptr;
      T* g = grad.row(b).data();
      bool finite = true;
      if (has_w)
        nb = row_kernel<Obj, Est, true, T, P>::row(n, lp, old, adv, mk, ref, in.weights.row(b).data(), g, w, p, s, finite);
      else
        nb = row_kernel<Obj, Est, false, T, P>::row(n, lp, old, adv, mk, ref, nullptr, g, w, p, s, finite);
      if (has_ent) {
        const vector_view<T> ge = gent.row(b);
        const T gv = static_cast<T>(-wd * static_cast<double>(p.entropy_coef));
        finite &= std::isfinite(gv);
        if (ge.stride() == 1) {
          entropy_row<true>(n, lp, in.entropy.row(b).data(), mk, ge.data(), gv, s.ent);
        } else {
          entropy_row<false>(n, lp, in.entropy.row(b).data(), mk, static_cast<T*>(nullptr), gv, s.ent);
          entropy_grad_row(ge, in.mask.row(b), wd, static_cast<double>(p.entropy_coef));
        }
      }
      o.grad_nonfinite = !finite;
      // The kernel sums up to `block` vectors per lane in T before adding them in double: terms
      // near T's maximum can overflow there although the row's double sums do not. Such a row's
      // sums are recounted token by token in double (the scalar loop, gradient not written).
      if (!row_sums_finite(s)) [[unlikely]] {
        s = row_sums{};
        (void)token_row_strided<Obj, Est, T, M, P, false>(
            n, in.log_prob.row(b), in.old_log_prob.row(b), in.advantages.row(b), in.mask.row(b),
            has_kl ? in.ref_log_prob.row(b) : vector_view<const T>(), has_w ? in.weights.row(b) : vector_view<const T>(),
            has_ent ? in.entropy.row(b) : vector_view<const T>(), grad.row(b), w, p, s);
      }
      return;
    }
#endif
    (void)contiguous, (void)per_row_weight;
    nb = row_tokens(in.mask, b);
    wd = row_weight(norm, nb);
    bool finite = token_row_strided<Obj, Est, T, M, P>(
        n, in.log_prob.row(b), in.old_log_prob.row(b), in.advantages.row(b), in.mask.row(b),
        has_kl ? in.ref_log_prob.row(b) : vector_view<const T>(), has_w ? in.weights.row(b) : vector_view<const T>(),
        has_ent ? in.entropy.row(b) : vector_view<const T>(), grad.row(b), static_cast<T>(wd), p, s);
    if (has_ent) finite &= entropy_grad_row(gent.row(b), in.mask.row(b), wd, static_cast<double>(p.entropy_coef));
    o.grad_nonfinite = !finite;
  };
  run_rows(in.log_prob.rows(), static_cast<double>(p.kl_coef), static_cast<double>(p.entropy_coef), exec, one_row, res);
}

}  // namespace ULORL_ISA
}  // namespace detail
ULORL_NAMESPACE_END
