// ulorl/loss/detail/rows.hpp — what every row of the policy loss produces and how rows become the
// result: per-row sums in double, the row's aggregation weight and token count, and the fold in row
// order (the same bits for every executor and thread count).
#pragma once

#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/detail/token_loss.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/policy_loss_types.hpp"

ULORL_NAMESPACE_BEGIN
namespace detail {
inline namespace ULORL_ISA {

//! Per-row accumulators (double), folded into the result once per row.
struct row_sums {
  double pg = 0, kl = 0, ent = 0;
  double clipped = 0, low = 0, high = 0, dual = 0;
  double nlr = 0, nlrc = 0, k3 = 0, ratio = 0;
  double rmin = std::numeric_limits<double>::infinity(), rmax = -std::numeric_limits<double>::infinity();
};

//! One scalar token into the row's sums (`pg`, `kl`: the token's terms; `flags`: its clip flags).
template <class T>
ULORL_ALWAYS_INLINE void fold_token(row_sums& s, bool valid, T pg, T kl, const ratio_lanes<simd::scalar_lanes<T>>& r,
                                    const clip_flags<simd::scalar_lanes<T>>& f, T logp, T old_logp, T entropy) {
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

//! A mask row as the vectorised passes read it (N: their lanes): a unit-stride row as it is (step
//! 1); a broadcast row (stride 0: the all-valid mask of an absent one, or a caller's expanded mask)
//! as N copies of its one value, read with step 0, so that a vector load at `data + t * step` reads
//! the row's values for every t.
template <class M, std::size_t N>
struct vector_mask_row {
  M rep[N];
  const M* data;
  std::ptrdiff_t step = 1;
  explicit vector_mask_row(vector_view<const M> r) noexcept : data(r.data()) {
    if (r.stride() != 0) return;
    for (auto& x : rep) x = r.size() != 0 ? r[0] : M(0);
    data = rep, step = 0;
  }
  vector_mask_row(const vector_mask_row&) = delete;
  vector_mask_row& operator=(const vector_mask_row&) = delete;
  //! Valid tokens of the row's n tokens.
  [[nodiscard]] std::size_t count(std::size_t n) const noexcept {
    if (step == 0) return data[0] != M(0) ? n : 0;
    std::size_t c = 0;
    for (std::size_t t = 0; t < n; ++t) c += data[t] != M(0);
    return c;
  }
};
//! The rows of `v` are unit-stride or broadcasts (stride 0): what vector_mask_row reads.
template <class M>
[[nodiscard]] constexpr bool unit_or_broadcast(const token_view<M>& v) noexcept {
  return v.rows() == 0 || v.row(0).stride() == 1 || v.row(0).stride() == 0;
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
template <class Exec, class OneRow>
void run_rows(std::size_t rows, double kl_coef, double ent_coef, const Exec& exec, OneRow&& one_row, policy_loss_result& res) {
  if (is_sequential(exec)) {
    for (std::size_t b = 0; b < rows; ++b) {
      row_out o;
      one_row(b, o);
      fold_out(res, o, kl_coef, ent_coef);
    }
  } else {
    std::vector<row_out> outs(rows);
    exec(rows, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t b = lo; b < hi; ++b) one_row(b, outs[b]);
    });
    for (const auto& o : outs) fold_out(res, o, kl_coef, ent_coef);
  }
}

//! What a sequence-level row pass reads of row b: its views, length, valid tokens and weight.
template <class T, class M>
struct sequence_row {
  vector_view<const T> lp, old, adv;
  vector_view<const M> mk;
  vector_view<T> g;
  std::size_t n, nb;  //!< tokens, valid tokens
  double nd, wd;      //!< nb as double, the row's aggregation weight
  sequence_row(const policy_loss_inputs<T, M>& in, token_view<T> grad, const agg_normalizer& norm, std::size_t b)
      : lp(in.log_prob.row(b)), old(in.old_log_prob.row(b)), adv(in.advantages.row(b)), mk(in.mask.row(b)), g(grad.row(b)),
        n(lp.size()), nb(row_tokens(in.mask, b)), nd(static_cast<double>(nb)), wd(row_weight(norm, nb)) {}
};

//! The KL term of one token of a sequence-level row: the estimate, d kl / d logp through the
//! estimate, and, importance-weighted by `iw` (derivative `diw`), the part through the weight, which
//! the caller routes (to the token itself or spread over the row).
template <class T>
struct sequence_kl {
  T value;  //!< kl (times iw when importance-weighted)
  T grad;   //!< d kl / d logp through the estimate
  T via_w;  //!< kl * d iw / d logp (0 without importance weighting)
};
template <class T, class P>
[[nodiscard]] ULORL_ALWAYS_INLINE sequence_kl<T> sequence_token_kl(T lp, T ref, T iw, T diw, const token_loss_params<T, P>& p) noexcept {
  const auto k = kl_term(lp, ref, p.kl);
  if (!p.kl.importance_weighted) return {k.value, k.grad, T(0)};
  return {k.value * iw, k.grad * iw, k.value * diw};
}

//! d loss / d H = -coef * weight on valid tokens, 0 elsewhere (independent of the other inputs).
template <class T, class M>
void entropy_grad_row(vector_view<T> ge, vector_view<const M> mk, double w, double coef) {
  const T gv = static_cast<T>(-w * coef);
  for (std::size_t t = 0; t < ge.size(); ++t) ge[t] = mk[t] != M(0) ? gv : T(0);
}

}  // namespace ULORL_ISA
}  // namespace detail
ULORL_NAMESPACE_END
