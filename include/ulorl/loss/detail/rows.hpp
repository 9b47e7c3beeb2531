// ulorl/loss/detail/rows.hpp — what every row of the policy loss produces and how rows become the
// result: per-row sums in double, the row's aggregation weight and token count, and the fold in row
// order (the same bits for every executor and thread count).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/detail/row_sums.hpp"
#include "ulorl/loss/detail/token_loss.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/policy_loss_types.hpp"

ULORL_NAMESPACE_BEGIN
namespace detail {
inline namespace ULORL_ISA {

//! The mask rows as the vectorised passes read them: always unit-stride, so that their loops index
//! the mask as they index every other array (a run-time mask stride in the row kernel costs 1-3%:
//! bench/RESULTS.md). A unit-stride row is read in place. A broadcast row (stride 0: the all-valid
//! mask of an absent one, or a caller's expanded mask) is read from a row of zeros or of ones as
//! long as the longest row, made once per call: the passes test `mask != 0` only, and a broadcast
//! value other than 0 or 1 is reported by `binary` (the value scan's question).
template <class M>
class unit_mask_rows {
 public:
  explicit unit_mask_rows(const token_view<const M>& mask) : mask_(mask) {
    if (mask.rows() == 0 || mask.row(0).stride() != 0) return;
    std::size_t longest = 0;
    for (std::size_t b = 0; b < mask.rows(); ++b) longest = mask.row_size(b) > longest ? mask.row_size(b) : longest;
    zeros_ = std::make_unique<M[]>(longest);  // value-initialised: M(0)
    ones_ = std::make_unique<M[]>(longest);
    std::fill_n(ones_.get(), longest, M(1));
  }
  //! Row b's mask values, unit-stride.
  [[nodiscard]] const M* row(std::size_t b) const noexcept {
    const vector_view<const M> r = mask_.row(b);
    if (r.stride() != 0) return r.data();
    return r.size() != 0 && r[0] != M(0) ? ones_.get() : zeros_.get();
  }
  //! Valid tokens of row b's n tokens.
  [[nodiscard]] std::size_t count(std::size_t b, std::size_t n) const noexcept {
    const vector_view<const M> r = mask_.row(b);
    if (r.stride() == 0) return n != 0 && r[0] != M(0) ? n : 0;
    std::size_t c = 0;
    for (std::size_t t = 0; t < n; ++t) c += r[t] != M(0);
    return c;
  }
  //! False for a broadcast row whose value is neither 0 nor 1 (row() reads it as ones); a
  //! unit-stride row's values are the scan's to check.
  [[nodiscard]] bool binary(std::size_t b) const noexcept {
    const vector_view<const M> r = mask_.row(b);
    return r.stride() != 0 || r.size() == 0 || r[0] == M(0) || r[0] == M(1);
  }

 private:
  token_view<const M> mask_;
  std::unique_ptr<M[]> zeros_, ones_;
};
//! The rows of `v` are unit-stride or broadcasts (stride 0): what unit_mask_rows reads.
template <class M>
[[nodiscard]] constexpr bool unit_or_broadcast(const token_view<M>& v) noexcept {
  return v.rows() == 0 || v.row(0).stride() == 1 || v.row(0).stride() == 0;
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
      res.nonfinite_grad_rows += o.grad_nonfinite ? 1 : 0;
    }
  } else {
    std::vector<row_out> outs(rows);
    exec(rows, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t b = lo; b < hi; ++b) one_row(b, outs[b]);
    });
    for (const auto& o : outs) {
      fold_out(res, o, kl_coef, ent_coef);
      res.nonfinite_grad_rows += o.grad_nonfinite ? 1 : 0;
    }
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

//! d loss / d H = -coef * weight on valid tokens, 0 elsewhere (independent of the other inputs).
//! Returns false when that value is not finite in T.
template <class T, class M>
bool entropy_grad_row(vector_view<T> ge, vector_view<const M> mk, double w, double coef) {
  const T gv = static_cast<T>(-w * coef);
  for (std::size_t t = 0; t < ge.size(); ++t) ge[t] = mk[t] != M(0) ? gv : T(0);
  return std::isfinite(gv);
}
//! Whether every value of the row `g` (just written, so in cache) is finite: a separate pass of
//! compares and an integer AND, which vectorises, cheaper than a test inside the scalar token
//! loops of the sequence-level rows.
template <class T>
[[nodiscard]] bool row_finite(vector_view<const T> g) noexcept {
  constexpr T top = std::numeric_limits<T>::max();
  unsigned ok = 1;
  if (g.stride() == 1) {
    const T* p = g.data();
    for (std::size_t t = 0; t < g.size(); ++t) ok &= static_cast<unsigned>(std::fabs(p[t]) <= top);
  } else {
    for (std::size_t t = 0; t < g.size(); ++t) ok &= static_cast<unsigned>(std::fabs(g[t]) <= top);
  }
  return ok != 0;
}
//! Every sum of a row is finite (min / max are not sums: +-inf there means no valid token).
[[nodiscard]] inline bool row_sums_finite(const row_sums& s) noexcept {
  return std::isfinite(s.pg) && std::isfinite(s.kl) && std::isfinite(s.ent) && std::isfinite(s.nlr) && std::isfinite(s.nlrc) &&
         std::isfinite(s.k3) && std::isfinite(s.ratio);
}

}  // namespace ULORL_ISA
}  // namespace detail
ULORL_NAMESPACE_END
