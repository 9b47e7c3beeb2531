// ulorl/loss/detail/row_sums.hpp — a row's sums of the policy loss (in double) and how tokens fold
// into them and rows into the result: one definition for the CPU rows (rows.hpp) and the CUDA
// kernels (C++17, host and device).
#pragma once

#include <cstddef>
#include <limits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/ratio.hpp"

ULORL_NAMESPACE_BEGIN
namespace detail {

//! Per-row accumulators (double), folded into the result once per row.
struct row_sums {
  double pg = 0, kl = 0, ent = 0;
  double clipped = 0, low = 0, high = 0, dual = 0;
  double nlr = 0, nlrc = 0, k3 = 0, ratio = 0;
  double rmin = std::numeric_limits<double>::infinity(), rmax = -std::numeric_limits<double>::infinity();
};

//! One scalar token into the row's sums (`pg`, `kl`: the token's terms; `flags`: its clip flags).
template <class T>
ULORL_HD ULORL_ALWAYS_INLINE constexpr void fold_token(row_sums& s, bool valid, T pg, T kl,
                                                       const ratio_lanes<simd::scalar_lanes<T>>& r,
                                                       const clip_flags<simd::scalar_lanes<T>>& f, T logp, T old_logp,
                                                       T entropy) {
  const double v = valid ? 1.0 : 0.0;
  s.pg += valid ? static_cast<double>(pg) : 0.0;
  s.kl += valid ? static_cast<double>(kl) : 0.0;
  s.ent += valid ? static_cast<double>(entropy) : 0.0;
  s.clipped += v * static_cast<double>(f.clipped), s.low += v * static_cast<double>(f.low);
  s.high += v * static_cast<double>(f.high), s.dual += v * static_cast<double>(f.dual);
  s.nlr += valid ? static_cast<double>(old_logp) - static_cast<double>(logp) : 0.0;
  s.nlrc += valid ? -static_cast<double>(r.log_ratio) : 0.0;
  s.k3 += valid ? static_cast<double>(r.k3) : 0.0;
  s.ratio += valid ? static_cast<double>(r.ratio) : 0.0;
  const double rr = static_cast<double>(r.ratio);
  s.rmin = valid && rr < s.rmin ? rr : s.rmin;
  s.rmax = valid && rr > s.rmax ? rr : s.rmax;
}

//! Two parts of one row (the CUDA kernels' threads): b's sums added into a's.
ULORL_HD constexpr void merge_sums(row_sums& a, const row_sums& b) noexcept {
  a.pg += b.pg, a.kl += b.kl, a.ent += b.ent;
  a.clipped += b.clipped, a.low += b.low, a.high += b.high, a.dual += b.dual;
  a.nlr += b.nlr, a.nlrc += b.nlrc, a.k3 += b.k3, a.ratio += b.ratio;
  a.rmin = b.rmin < a.rmin ? b.rmin : a.rmin;
  a.rmax = b.rmax > a.rmax ? b.rmax : a.rmax;
}

//! Row `s` (aggregation weight w, n valid tokens) into `res`: a policy_loss_result, or any type with
//! its pg_loss, kl_loss, entropy_loss and metrics (the CUDA kernels' partial results).
template <class R>
ULORL_HD constexpr void fold_row(R& res, const row_sums& s, double w, double kl_coef, double ent_coef, double n) noexcept {
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

//! One row's sums, aggregation weight and valid-token count, before the fold into the result.
struct row_out {
  row_sums s;
  double w = 0;
  std::size_t tokens = 0;
  // Sequence-level objectives only (sequence_row_terms): the row's objective term, added to pg_loss
  // before the row's fold (gmpo), and the row's clip flags, where the objective reports them (gspo).
  bool has_direct = false, sequence_clip = false, seq_low = false, seq_high = false;
  double pg_direct = 0;
  //! The row's written gradient may hold a non-finite value (a cheap test of the pass: exact for
  //! the scalar rows, a sum of the stored values for the vector rows, which may also overflow).
  bool grad_nonfinite = false;
};

template <class R>
ULORL_HD constexpr void fold_out(R& res, const row_out& o, double kl_coef, double ent_coef) noexcept {
  if (o.has_direct) res.pg_loss += o.pg_direct;
  if (o.sequence_clip) {
    res.metrics.seq_clipped_low += o.seq_low;
    res.metrics.seq_clipped_high += o.seq_high;
    res.metrics.seq_clipped_region += o.seq_low || o.seq_high;
  }
  fold_row(res, o.s, o.w, kl_coef, ent_coef, static_cast<double>(o.tokens));
}

}  // namespace detail
ULORL_NAMESPACE_END
