// ulorl/loss/policy_loss.hpp — the fused policy loss: one pass over the token arrays
// (logp, old logp, advantages, mask (absent: every token valid), optional reference logp,
// rollout-correction weights, entropy)
// producing the loss, d loss / d logp, d loss / d entropy and the metrics.
//
//   loss = sum_bt agg_weight(b) m[b,t] ( w[b,t] objective(b,t) + kl_coef kl(b,t) - entropy_coef H[b,t] )
//
// with the objective of objectives.hpp, the KL estimator of kl.hpp, and the partition-exact
// aggregation weights of aggregation.hpp (the normaliser is the global batch's, passed in). Both
// layouts (padded + mask, packed + offsets + mask), float and double.
//
// This header is the front end: the entry points, validation and the dispatch from the run-time
// configuration to compile-time kernels (through the objective and estimator registries: an unknown
// kind is an error, never a fallback). The rows are in loss/detail/: token_rows.hpp (token-level
// objectives: the SIMD row kernel and the strided loop), sequence_rows.hpp (sequence-level ones), and
// value_scan.hpp (check_values). Every one of them evaluates the formulas of objectives.hpp and
// kl.hpp through detail/token_loss.hpp; none restates one.
//
// `policy_token_loss` is one token's loss for callers with one token at hand; `policy_loss_with`
// runs an objective (and an estimator) defined outside the library through the same kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/isa_dispatch.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/simd.hpp"
#include "ulorl/core/views.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/detail/sequence_rows.hpp"
#include "ulorl/loss/detail/token_loss.hpp"
#include "ulorl/loss/detail/token_rows.hpp"
#include "ulorl/loss/detail/value_scan.hpp"
#include "ulorl/loss/entropy.hpp"
#include "ulorl/loss/kernel_pairs.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/metrics.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/policy_loss_types.hpp"
#include "ulorl/loss/ratio.hpp"
#include "ulorl/loss/rollout_correction/compute.hpp"

ULORL_NAMESPACE_BEGIN
// The entry points instantiate ISA-dependent kernels: tagged like them (core/simd.hpp); detail
// code in detail::ULORL_ISA, never a detail namespace inside the tag (it would hide ulorl::detail).

// ---- per-token API --------------------------------------------------------------------------------

namespace detail {
inline namespace ULORL_ISA {
template <class Obj, class Est, class T, class P>
[[nodiscard]] ULORL_HD constexpr token_loss<T> one_token_loss(T logp, T old_logp, T ref, T adv, T weight, T entropy,
                                                              const token_loss_params<T, P>& p) noexcept {
  using L = simd::scalar_lanes<T>;
  const T e = p.entropy_coef != T(0) ? entropy : T(0);
  const auto t = token_loss_lanes<Obj, Est, true, L>(logp, old_logp, ref, adv, weight, p);
  token_loss<T> r{};
  r.pg = t.pg;
  r.kl = t.kl;
  r.dlogp = t.dlogp;
  r.dentropy = -p.entropy_coef;
  r.loss = r.pg + p.kl_coef * r.kl - p.entropy_coef * e;
  r.ratio = t.ratio.ratio;
  r.log_ratio_clamped = t.ratio.log_ratio;
  r.flags = flag_bits(t.flags);
  return r;
}
//! A token loss of NaNs: what a configuration validate_policy_loss rejects gives, never a plausible value.
template <class T>
[[nodiscard]] ULORL_HD constexpr token_loss<T> invalid_token_loss() noexcept {
  constexpr T nan = std::numeric_limits<T>::quiet_NaN();
  return {nan, nan, nan, nan, nan, nan, nan, 0u};
}
template <class Obj, class T, class E0, class... E>
[[nodiscard]] ULORL_HD constexpr token_loss<T> token_loss_by_estimator(T logp, T old_logp, T ref, T adv, T weight,
                                                                       T entropy, const token_loss_params<T>& p,
                                                                       descriptor_list<E0, E...>) noexcept {
  if (p.kl.estimator == E0::kind) {
    if (p.kl.importance_weighted)
      return one_token_loss<Obj, importance_weighted<E0>>(logp, old_logp, ref, adv, weight, entropy, p);
    return one_token_loss<Obj, E0>(logp, old_logp, ref, adv, weight, entropy, p);
  }
  if constexpr (sizeof...(E) == 0)
    return invalid_token_loss<T>();
  else
    return token_loss_by_estimator<Obj>(logp, old_logp, ref, adv, weight, entropy, p, descriptor_list<E...>{});
}
template <class Obj, class T>
[[nodiscard]] ULORL_HD constexpr token_loss<T> token_loss_with_kl(T logp, T old_logp, T ref, T adv, T weight, T entropy,
                                                                  const token_loss_params<T>& p) noexcept {
  if (p.kl_coef == T(0)) return one_token_loss<Obj, no_kl>(logp, old_logp, ref, adv, weight, entropy, p);
  return token_loss_by_estimator<Obj>(logp, old_logp, ref, adv, weight, entropy, p, kl_registry{});
}
template <class T, class D0, class... D>
[[nodiscard]] ULORL_HD constexpr token_loss<T> token_loss_by_objective(T logp, T old_logp, T ref, T adv, T weight,
                                                                       T entropy, const token_loss_params<T>& p,
                                                                       descriptor_list<D0, D...>) noexcept {
  if (p.objective.kind == D0::kind) {
    if constexpr (D0::level == objective_level::sequence) {
      return invalid_token_loss<T>();
    } else if constexpr (has_plain_form<D0>) {
      if (D0::plain_applies(p.objective))
        return token_loss_with_kl<typename D0::plain_form>(logp, old_logp, ref, adv, weight, entropy, p);
      return token_loss_with_kl<D0>(logp, old_logp, ref, adv, weight, entropy, p);
    } else {
      return token_loss_with_kl<D0>(logp, old_logp, ref, adv, weight, entropy, p);
    }
  }
  if constexpr (sizeof...(D) == 0)
    return invalid_token_loss<T>();
  else
    return token_loss_by_objective(logp, old_logp, ref, adv, weight, entropy, p, descriptor_list<D...>{});
}
}  // namespace ULORL_ISA
}  // namespace detail

inline namespace ULORL_ISA {

//! One token's loss for a token-level objective (ppo_clip, cispo, sapo, policy_gradient) of a
//! validated configuration (validate_policy_loss): `ref` is read only when kl_coef != 0, `entropy`
//! only when entropy_coef != 0; pass weight 1 without rollout correction. A sequence-level
//! objective (gspo, gmpo: they need the row) or a configuration validation rejects gives NaN.
template <class T>
[[nodiscard]] ULORL_HD constexpr token_loss<T> policy_token_loss(T logp, T old_logp, T ref, T adv, T weight, T entropy,
                                                                 const token_loss_params<T>& p) noexcept {
  return detail::token_loss_by_objective(logp, old_logp, ref, adv, weight, entropy, p, objective_registry{});
}

//! One token's loss for a token-level objective descriptor `obj` and an estimator descriptor `est`
//! (no_kl: no KL term), built-in or defined outside the library (objectives.hpp, kl.hpp): what
//! policy_loss_with computes for the token, before the aggregation weight. Of `cfg`, the KL clamps,
//! straight_through, importance_weighted and the coefficients are read (not validated).
template <class Obj, class Est, class T>
[[nodiscard]] token_loss<T> policy_token_loss_with(const Obj& obj, const Est&, T logp, T old_logp, T ref, T adv,
                                                   T weight, T entropy, const policy_loss_config& cfg) {
  static_assert(Obj::level == objective_level::token, "policy_token_loss_with: a token-level objective descriptor");
  const token_loss_params<T, detail::params_of<Obj, T>> p{obj.template params<T>(), make_kl_params<T>(cfg.kl),
                                                          static_cast<T>(cfg.kl_coef),
                                                          static_cast<T>(cfg.entropy_coef)};
  if (cfg.kl_coef == 0.0) return detail::one_token_loss<Obj, no_kl>(logp, old_logp, ref, adv, weight, entropy, p);
  if constexpr (!std::is_same_v<Est, no_kl>)
    if (cfg.kl.importance_weighted)
      return detail::one_token_loss<Obj, importance_weighted<Est>>(logp, old_logp, ref, adv, weight, entropy, p);
  return detail::one_token_loss<Obj, Est>(logp, old_logp, ref, adv, weight, entropy, p);
}
}  // namespace ULORL_ISA

namespace detail {
inline namespace ULORL_ISA {
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
}  // namespace ULORL_ISA
}  // namespace detail

namespace detail {
inline namespace ULORL_ISA {
//! The rollout correction's view of the loss inputs.
template <class T, class M>
[[nodiscard]] rollout_correction::inputs<T, M> rollout_inputs_of(const policy_loss_inputs<T, M>& in) noexcept {
  return {in.old_log_prob, in.rollout_log_prob, in.mask};
}
//! policy_loss_config::rollout and its inputs (shapes and configuration; the values are checked
//! with the other inputs').
template <class T, class M>
void validate_rollout_inputs(std::string_view fn, const policy_loss_inputs<T, M>& in, const policy_loss_config& cfg) {
  if (!cfg.rollout) {
    if (!in.rollout_log_prob.empty())
      detail::fail(fn, "rollout_log_prob", "given without cfg.rollout (the rollout correction it feeds)");
    if (cfg.rollout_batch_norm_factor)
      detail::fail_value(fn, "rollout_batch_norm_factor", *cfg.rollout_batch_norm_factor, "given without cfg.rollout");
    return;
  }
  const auto& rc = *cfg.rollout;
  rollout_correction::validate(fn, rc);
  if (in.rollout_log_prob.empty()) detail::fail(fn, "rollout_log_prob", "required with cfg.rollout");
  require_same_shape(fn, "rollout_log_prob", in.rollout_log_prob, "log_prob", in.log_prob);
  if (!in.weights.empty())
    detail::fail(fn, "weights",
                 "must be empty with cfg.rollout: the rollout correction's weights are the loss's weights");
  if (rc.importance.batch_normalize != cfg.rollout_batch_norm_factor.has_value()) {
    if (rc.importance.batch_normalize)
      detail::fail(
          fn, "rollout_batch_norm_factor",
          "required with rollout.importance.batch_normalize: the batch's mean weight, rollout_correction::finalize's "
          "batch_norm_factor of the whole batch's statistics");
    detail::fail_value(fn, "rollout_batch_norm_factor", *cfg.rollout_batch_norm_factor,
                       "given without rollout.importance.batch_normalize");
  }
  const double divisor = cfg.rollout_batch_norm_factor.value_or(1.0);
  require_divisor(fn, "rollout_batch_norm_factor", divisor);
  const auto bound = rollout_correction::detail::bound_of(rc.importance);
  if (bound.nan_possible || !rollout_correction::detail::representable<T>(bound.max / divisor))
    detail::fail(
        fn, "rollout",
        "its importance weights are not finite in the element type by construction (largest weight " +
            std::to_string(bound.max / divisor) +
            (bound.nan_possible ? ", NaN where an overflowed ratio is dropped" : "") +
            "): bound them (importance.upper, importance.log_ratio_clamp) or run rollout_correction::apply and pass "
            "its weights and mask");
}

//! The checks of validate_policy_loss; `validate_descriptors()` checks the objective and the
//! estimator (after the shapes, before the values).
template <class T, class M, class Exec, class F>
void validate_policy_loss_inputs(std::string_view fn, const policy_loss_inputs<T, M>& given,
                                 const policy_loss_config& cfg, token_view<T> grad_log_prob, token_view<T> grad_entropy,
                                 const Exec& exec, F&& validate_descriptors) {
  const policy_loss_inputs<T, M> in = detail::with_all_valid_mask(given);
  validate_layout(fn, "log_prob", in.log_prob);
  if (in.log_prob.rows() == 0) detail::fail(fn, "log_prob", "empty batch (B = 0): at least one response is required");
  require_same_shape(fn, "old_log_prob", in.old_log_prob, "log_prob", in.log_prob);
  require_same_shape(fn, "advantages", in.advantages, "log_prob", in.log_prob);
  require_same_shape(fn, "mask", in.mask, "log_prob", in.log_prob);
  require_same_shape(fn, "grad_log_prob", grad_log_prob, "log_prob", in.log_prob);
  // A given optional input has the shape of log_prob even where its coefficient is 0.
  if (cfg.kl_coef != 0.0 && in.ref_log_prob.empty() && !in.log_prob.empty())
    detail::fail(fn, "ref_log_prob", "required when kl_coef != 0");
  if (cfg.kl_coef != 0.0 || !in.ref_log_prob.empty())
    require_same_shape(fn, "ref_log_prob", in.ref_log_prob, "log_prob", in.log_prob);
  if (!in.weights.empty()) require_same_shape(fn, "weights", in.weights, "log_prob", in.log_prob);
  if (cfg.entropy_coef == 0.0 && !in.entropy.empty())
    require_same_shape(fn, "entropy", in.entropy, "log_prob", in.log_prob);
  if (cfg.entropy_coef != 0.0) {
    if (in.entropy.empty() && !in.log_prob.empty()) detail::fail(fn, "entropy", "required when entropy_coef != 0");
    require_same_shape(fn, "entropy", in.entropy, "log_prob", in.log_prob);
    if (grad_entropy.empty() && !in.log_prob.empty())
      detail::fail(fn, "grad_entropy", "required when entropy_coef != 0");
    require_same_shape(fn, "grad_entropy", grad_entropy, "log_prob", in.log_prob);
  }
  validate_rollout_inputs<T>(fn, in, cfg);
  detail::require_distinct_tokens(fn, "grad_log_prob", grad_log_prob);
  if (cfg.entropy_coef != 0.0) {
    detail::require_distinct_tokens(fn, "grad_entropy", grad_entropy);
    detail::require_disjoint_tokens(fn, "grad_entropy", grad_entropy, "grad_log_prob", grad_log_prob);
  }
  validate_descriptors();
  validate_loss_scalars<T>(fn, cfg);
  if (!cfg.check_values) return;
  if (cfg.rollout) rollout_correction::detail::validate_values(fn, rollout_inputs_of(in));
#if defined(ULORL_SIMD)
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

//! The token rows of descriptor `obj` (parameters in T) with estimator `Est` (or no_kl), folded
//! into `res` after the rows already in it.
template <class Obj, class Est, class T, class M, class Exec>
void token_rows_into(const Obj& obj, const policy_loss_inputs<T, M>& in, const policy_loss_config& cfg,
                     token_view<T> grad_log_prob, token_view<T> grad_entropy, const Exec& exec,
                     policy_loss_result& res) {
  using P = params_of<Obj, T>;
  const token_loss_params<T, P> p{obj.template params<T>(), make_kl_params<T>(cfg.kl), static_cast<T>(cfg.kl_coef),
                                  static_cast<T>(cfg.entropy_coef)};
  token_rows<Obj, Est>(in, cfg.normalizer, p, grad_log_prob, grad_entropy, res, exec);
}

//! Tokens per block of rows of the rollout-corrected pass: the block's inputs and its weights and
//! keep-mask stay in cache between the correction and the loss.
inline constexpr std::size_t rollout_block_tokens = std::size_t{1} << 16;

//! The loss with cfg.rollout: rows in blocks of about rollout_block_tokens tokens; per block, each
//! row's weights and keep-mask (rollout_correction's scan_row, on `exec`) into scratch memory, then
//! `rows_into(block inputs with those weights and that mask, block gradients, res)`, which folds
//! the block's rows into `res` after the previous blocks'. The scratch is allocated once per call. The rows' correction statistics are folded
//! into res.rollout in row order. So every sum is folded in row order, as without blocks: the
//! result is the bits of rollout_correction::apply followed by the loss on its outputs.
template <class T, class M, class RowsInto>
void rollout_corrected_rows(std::string_view fn, const policy_loss_inputs<T, M>& in, const policy_loss_config& cfg,
                            token_view<T> grad_log_prob, token_view<T> grad_entropy, executor_ref exec,
                            policy_loss_result& res, RowsInto&& rows_into) {
  rollout_correction::config rc = *cfg.rollout;
  rc.importance.masked = rollout_correction::masked_positions::zero;  // the loss ignores masked weights
  const double divisor = cfg.rollout_batch_norm_factor.value_or(1.0);
  const auto rin = rollout_inputs_of(in);
  const auto chain = rollout_correction::detail::plan_chain(rc.rejection);
  const std::size_t rows = in.log_prob.rows();
  const bool packed = in.log_prob.kind() == layout::packed;
  std::unique_ptr<T[]> wbuf;
  std::unique_ptr<M[]> mbuf;  // M may be bool: no std::vector
  std::size_t capacity = 0;
  std::vector<std::int64_t> offsets;
  std::vector<rollout_correction::statistics> stats;
  for (std::size_t lo = 0, hi = 0; lo < rows; lo = hi) {
    std::size_t tokens = in.log_prob.row_size(lo);
    for (hi = lo + 1; hi < rows && tokens + in.log_prob.row_size(hi) <= rollout_block_tokens; ++hi)
      tokens += in.log_prob.row_size(hi);
    const std::size_t n = hi - lo;
    if (tokens > capacity) {
      capacity = std::max(tokens, rollout_block_tokens);
      wbuf = std::make_unique<T[]>(capacity);
      mbuf = std::make_unique<M[]>(capacity);
    }
    token_view<T> w;
    token_view<M> m;
    if (packed) {
      offsets.resize(n + 1);
      for (std::size_t r = 0; r <= n; ++r)
        offsets[r] = static_cast<std::int64_t>(in.log_prob.row_begin(lo + r) - in.log_prob.row_begin(lo));
      w = token_view<T>::packed(vector_view<T>(wbuf.get(), tokens), std::span<const std::int64_t>(offsets));
      m = token_view<M>::packed(vector_view<M>(mbuf.get(), tokens), std::span<const std::int64_t>(offsets));
    } else {
      const std::size_t cols = in.log_prob.cols();
      w = token_view<T>::padded(matrix_view<T>(wbuf.get(), n, cols, static_cast<std::ptrdiff_t>(cols), 1));
      m = token_view<M>::padded(matrix_view<M>(mbuf.get(), n, cols, static_cast<std::ptrdiff_t>(cols), 1));
    }
    stats.assign(n, {});
    exec(n, [&](std::size_t a, std::size_t z) {
      for (std::size_t r = a; r < z; ++r)
        (void)rollout_correction::detail::scan_row<true, true>(fn, rin, rc, chain, lo + r, divisor, stats[r], w.row(r),
                                                               m.row(r));
    });
    for (const auto& st : stats) res.rollout += st;
    policy_loss_inputs<T, M> part{in.log_prob.slice(lo, hi),     in.old_log_prob.slice(lo, hi),
                                  in.advantages.slice(lo, hi),   token_view<const M>(m),
                                  in.ref_log_prob.slice(lo, hi), token_view<const T>(w),
                                  in.entropy.slice(lo, hi),      {}};
    rows_into(part, grad_log_prob.slice(lo, hi), grad_entropy.slice(lo, hi), res);
  }
}

//! The results' range check of a checked call (cfg.check_values): every written gradient value is
//! finite (only the rows the pass flagged are read) and the losses and the metrics' sums lie in the
//! range of T (losses) and double (metric sums). On a failure the gradient outputs (grad_entropy:
//! given with an entropy term, otherwise empty) are set to 0 before the throw: they were written in
//! the pass.
template <class T>
void validate_loss_results(std::string_view fn, policy_loss_result& res, token_view<T> grad_log_prob,
                           token_view<T> grad_entropy) {
  const auto clear = [&] {
    for (token_view<T>* v : {&grad_log_prob, &grad_entropy})
      for (std::size_t b = 0; b < v->rows(); ++b) {
        const vector_view<T> r = v->row(b);
        for (std::size_t t = 0; t < r.size(); ++t) r[t] = T(0);
      }
  };
  if (res.nonfinite_grad_rows != 0) {
    for (const auto& [name, v] : {std::pair<std::string_view, token_view<T>>{"grad_log_prob", grad_log_prob},
                                  std::pair<std::string_view, token_view<T>>{"grad_entropy", grad_entropy}})
      for (std::size_t b = 0; b < v.rows(); ++b) {
        const vector_view<T> r = v.row(b);
        for (std::size_t t = 0; t < r.size(); ++t)
          if (!std::isfinite(r[t])) {
            const double value = static_cast<double>(r[t]);
            clear();
            require_result_in_range<T>(
                fn, name, static_cast<std::int64_t>(v.flat_index(b, t)), value,
                "row " + std::to_string(b) + ", token " + std::to_string(t) + "; the gradient outputs are set to 0");
          }
      }
    res.nonfinite_grad_rows = 0;  // a float sum of finite values overflowed: every value is finite
  }
  const auto scalar = [&](auto in_range, std::string_view what, double value) {
    if (std::fabs(value) <= static_cast<double>(std::numeric_limits<decltype(in_range)>::max())) return;
    clear();
    require_result_in_range<decltype(in_range)>(fn, what, -1, value, "the gradient outputs are set to 0");
  };
  scalar(T{}, "pg_loss", res.pg_loss);
  scalar(T{}, "kl_loss", res.kl_loss);
  scalar(T{}, "entropy_loss", res.entropy_loss);
  scalar(T{}, "loss", res.loss);
  const loss_metrics& m = res.metrics;
  scalar(0.0, "metrics.neg_log_ratio", m.neg_log_ratio);
  scalar(0.0, "metrics.neg_log_ratio_clamped", m.neg_log_ratio_clamped);
  scalar(0.0, "metrics.approx_kl_k3", m.approx_kl_k3);
  scalar(0.0, "metrics.ratio_sum", m.ratio_sum);
  scalar(0.0, "metrics.kl_sum", m.kl_sum);
  scalar(0.0, "metrics.entropy_sum", m.entropy_sum);
}

//! Runs `rows_into(inputs, grad_log_prob, grad_entropy, result)` on the whole batch, or through
//! rollout_corrected_rows with cfg.rollout; then the loss's total, and with cfg.check_values the
//! results' range check (validate_loss_results).
template <class T, class M, class RowsInto>
[[nodiscard]] policy_loss_result loss_rows(std::string_view fn, const policy_loss_inputs<T, M>& in,
                                           const policy_loss_config& cfg, token_view<T> grad_log_prob,
                                           token_view<T> grad_entropy, executor_ref exec, RowsInto&& rows_into) {
  policy_loss_result res;
  if (cfg.rollout)
    rollout_corrected_rows(fn, in, cfg, grad_log_prob, grad_entropy, exec, res, rows_into);
  else
    rows_into(in, grad_log_prob, grad_entropy, res);
  res.loss = res.pg_loss + res.kl_loss + res.entropy_loss;
  if (cfg.check_values)
    validate_loss_results<T>(fn, res, grad_log_prob, cfg.entropy_coef != 0.0 ? grad_entropy : token_view<T>{});
  return res;
}
}  // namespace ULORL_ISA
}  // namespace detail

inline namespace ULORL_ISA {

//! Validates the inputs and the configuration (throws ulorl::error naming argument and index).
//! The value scan of unit-stride rows runs on `exec`; the exact checks that name the index run on
//! the calling thread, only when the scan finds a problem or a view is strided.
template <class T, class M, class Exec = sequential_executor>
void validate_policy_loss(std::string_view fn, const policy_loss_inputs<T, M>& in, token_view<T> grad_log_prob,
                          token_view<T> grad_entropy, const policy_loss_config& cfg, const Exec& exec = Exec{}) {
  detail::validate_policy_loss_inputs(fn, in, cfg, grad_log_prob, grad_entropy, exec, [&] {
    validate_objective(fn, cfg.objective);
    validate_kl(fn, cfg.kl);
  });
}
}  // namespace ULORL_ISA

namespace detail {
inline namespace ULORL_ISA {
//! policy_loss's body: validation and the dispatch to every objective's and estimator's rows. It
//! depends on the value and mask types only (the executor is referenced, not a template parameter),
//! so it can be compiled once per program for the common types (ULORL_EXTERN_KERNELS, end of this header).
template <class T, class M>
[[nodiscard]] policy_loss_result policy_loss_dispatch(const policy_loss_inputs<T, M>& given,
                                                      token_view<T> grad_log_prob, token_view<T> grad_entropy,
                                                      const policy_loss_config& cfg, executor_ref exec) {
  constexpr std::string_view fn = "policy_loss";
  const policy_loss_inputs<T, M> in = detail::with_all_valid_mask(given);
  validate_policy_loss(fn, in, grad_log_prob, grad_entropy, cfg, exec);
  return loss_rows(
      fn, in, cfg, grad_log_prob, grad_entropy, exec,
      [&](const policy_loss_inputs<T, M>& part, token_view<T> g, token_view<T> ge, policy_loss_result& res) {
        detail::visit_token_loss(fn, cfg, [&](const auto& obj, const auto& est) {
          using D = std::remove_cvref_t<decltype(obj)>;
          using E = std::remove_cvref_t<decltype(est)>;
          if constexpr (D::level == objective_level::sequence) {
            detail::sequence_rows<D>(obj, part, cfg, g, ge, res, exec);
          } else {
            detail::token_rows_into<D, E>(obj, part, cfg, g, ge, exec, res);
          }
        });
      });
}
}  // namespace ULORL_ISA
}  // namespace detail

//! The run-time instruction-set dispatch of policy_loss (core/isa_dispatch.hpp): its body for
//! (T, M) is detail::policy_loss_dispatch<T, M> of one instruction set.
struct isa_op::policy_loss {
  template <class... A>
  struct kernel;
  template <class T, class M>
  struct kernel<T, M> {
    using type = policy_loss_result (*)(const policy_loss_inputs<T, M>&, token_view<T>, token_view<T>,
                                        const policy_loss_config&, executor_ref);
  };
};
template <class T, class M>
using policy_loss_kernel = isa_kernel<isa_op::policy_loss, T, M>;

inline namespace ULORL_ISA {

//! The fused policy loss of one micro-batch. Writes d loss / d logp into `grad_log_prob` (0 on
//! masked tokens; an absent `in.mask` means every token is valid) and, with an entropy term,
//! d loss / d H into `grad_entropy`. Nothing is written when validation fails
//! (`cfg.check_values = false` skips the value scans: see policy_loss_config); a result beyond its
//! type's range is found after the pass: the error names it and the gradient outputs are set to 0. Summing the results of micro-batches that share `cfg.normalizer` gives
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
[[nodiscard]] policy_loss_result policy_loss(const policy_loss_inputs<T, M>& in, token_view<T> grad_log_prob,
                                             token_view<T> grad_entropy, const policy_loss_config& cfg,
                                             const Exec& exec) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "policy_loss: T must be float or double");
  if (const policy_loss_kernel<T, M> k = installed_kernel<isa_op::policy_loss, T, M>()) [[unlikely]]
    return k(in, grad_log_prob, grad_entropy, cfg, executor_ref(exec));
  return detail::policy_loss_dispatch<T, M>(in, grad_log_prob, grad_entropy, cfg, executor_ref(exec));
}

//! The loss on the calling thread (sequential_executor: allocates nothing).
template <class T, class M>
[[nodiscard]] policy_loss_result policy_loss(const policy_loss_inputs<T, M>& in, token_view<T> grad_log_prob,
                                             token_view<T> grad_entropy, const policy_loss_config& cfg) {
  return policy_loss(in, grad_log_prob, grad_entropy, cfg, sequential_executor{});
}

//! The loss without an entropy term's gradient (cfg.entropy_coef == 0), on the calling thread.
template <class T, class M>
[[nodiscard]] policy_loss_result policy_loss(const policy_loss_inputs<T, M>& in, token_view<T> grad_log_prob,
                                             const policy_loss_config& cfg) {
  return policy_loss(in, grad_log_prob, token_view<T>{}, cfg, sequential_executor{});
}

//! The policy loss of an objective descriptor `obj` defined outside the library (see
//! objectives.hpp for the interface, token or sequence level; a token-level one's parameters must
//! have `bound`, the token log-ratio clamp), with the built-in estimator of cfg.kl; cfg.objective is
//! not read. Same contract as policy_loss.
template <class Obj, class T, class M, class Exec>
[[nodiscard]] policy_loss_result policy_loss_with(const Obj& obj, const policy_loss_inputs<T, M>& given,
                                                  token_view<T> grad_log_prob, token_view<T> grad_entropy,
                                                  const policy_loss_config& cfg, const Exec& exec) {
  constexpr std::string_view fn = "policy_loss_with";
  const policy_loss_inputs<T, M> in = detail::with_all_valid_mask(given);
  detail::validate_policy_loss_inputs(fn, in, cfg, grad_log_prob, grad_entropy, exec, [&] {
    obj.validate(fn);
    validate_kl(fn, cfg.kl);
  });
  return detail::loss_rows(
      fn, in, cfg, grad_log_prob, grad_entropy, executor_ref(exec),
      [&](const policy_loss_inputs<T, M>& part, token_view<T> g, token_view<T> ge, policy_loss_result& res) {
        if constexpr (Obj::level == objective_level::sequence) {
          detail::sequence_rows<Obj>(obj, part, cfg, g, ge, res, exec);
        } else {
          if (cfg.kl_coef == 0.0) return detail::token_rows_into<Obj, no_kl>(obj, part, cfg, g, ge, exec, res);
          visit_kl_estimator(fn, cfg.kl, [&](const auto& est) {
            using E = std::remove_cvref_t<decltype(est)>;
            if (cfg.kl.importance_weighted)
              return detail::token_rows_into<Obj, importance_weighted<E>>(obj, part, cfg, g, ge, exec, res);
            detail::token_rows_into<Obj, E>(obj, part, cfg, g, ge, exec, res);
          });
        }
      });
}

//! As above with a KL estimator descriptor `est` defined outside the library (see kl.hpp); of
//! cfg.kl only the clamps, straight_through and importance_weighted are read.
template <class Obj, class Est, class T, class M, class Exec>
[[nodiscard]] policy_loss_result policy_loss_with(const Obj& obj, const Est& est, const policy_loss_inputs<T, M>& given,
                                                  token_view<T> grad_log_prob, token_view<T> grad_entropy,
                                                  const policy_loss_config& cfg, const Exec& exec) {
  static_assert(Obj::level == objective_level::token, "policy_loss_with: a token-level objective descriptor");
  constexpr std::string_view fn = "policy_loss_with";
  const policy_loss_inputs<T, M> in = detail::with_all_valid_mask(given);
  (void)est;
  detail::validate_policy_loss_inputs(fn, in, cfg, grad_log_prob, grad_entropy, exec, [&] { obj.validate(fn); });
  return detail::loss_rows(
      fn, in, cfg, grad_log_prob, grad_entropy, executor_ref(exec),
      [&](const policy_loss_inputs<T, M>& part, token_view<T> g, token_view<T> ge, policy_loss_result& res) {
        if (cfg.kl_coef == 0.0) return detail::token_rows_into<Obj, no_kl>(obj, part, cfg, g, ge, exec, res);
        if (cfg.kl.importance_weighted)
          return detail::token_rows_into<Obj, importance_weighted<Est>>(obj, part, cfg, g, ge, exec, res);
        detail::token_rows_into<Obj, Est>(obj, part, cfg, g, ge, exec, res);
      });
}

//! policy_loss_with on the calling thread, with or without `grad_entropy` (as policy_loss's overloads).
template <class Obj, class T, class M>
[[nodiscard]] policy_loss_result policy_loss_with(const Obj& obj, const policy_loss_inputs<T, M>& in,
                                                  token_view<T> grad_log_prob, token_view<T> grad_entropy,
                                                  const policy_loss_config& cfg) {
  return policy_loss_with(obj, in, grad_log_prob, grad_entropy, cfg, sequential_executor{});
}
template <class Obj, class T, class M>
[[nodiscard]] policy_loss_result policy_loss_with(const Obj& obj, const policy_loss_inputs<T, M>& in,
                                                  token_view<T> grad_log_prob, const policy_loss_config& cfg) {
  return policy_loss_with(obj, in, grad_log_prob, token_view<T>{}, cfg, sequential_executor{});
}
template <class Obj, class Est, class T, class M>
[[nodiscard]] policy_loss_result policy_loss_with(const Obj& obj, const Est& est, const policy_loss_inputs<T, M>& in,
                                                  token_view<T> grad_log_prob, token_view<T> grad_entropy,
                                                  const policy_loss_config& cfg) {
  return policy_loss_with(obj, est, in, grad_log_prob, grad_entropy, cfg, sequential_executor{});
}
template <class Obj, class Est, class T, class M>
[[nodiscard]] policy_loss_result policy_loss_with(const Obj& obj, const Est& est, const policy_loss_inputs<T, M>& in,
                                                  token_view<T> grad_log_prob, const policy_loss_config& cfg) {
  return policy_loss_with(obj, est, in, grad_log_prob, token_view<T>{}, cfg, sequential_executor{});
}
}  // namespace ULORL_ISA

ULORL_NAMESPACE_END

// Compiled once per program: the explicit instantiations of the body of one (value, mask) pair.
//   ULORL_INSTANTIATE_POLICY_LOSS(T, M)  defines them (in exactly one translation unit);
//   ULORL_EXTERN_POLICY_LOSS(T, M)       declares them as defined elsewhere.
// With ULORL_EXTERN_KERNELS defined (linking a library of cmake/ulorl_kernels.cmake defines it),
// every unit that includes this header declares the pairs of ULORL_EXTERN_KERNEL_PAIRS (the
// library's pairs, set by that library) or else of ULORL_POLICY_LOSS_PAIRS (loss/kernel_pairs.hpp)
// extern, and only calls them. The declarations belong to the ISA tag of the unit's flags: a unit
// built with other instruction-set flags must not define ULORL_EXTERN_KERNELS.
#define ULORL_POLICY_LOSS_INSTANCE_(EXTERN, T, M)                                                                 \
  ULORL_NAMESPACE_BEGIN namespace detail {                                                                        \
    inline namespace ULORL_ISA {                                                                                  \
    EXTERN template policy_loss_result policy_loss_dispatch<T, M>(const policy_loss_inputs<T, M>&, token_view<T>, \
                                                                  token_view<T>, const policy_loss_config&,       \
                                                                  executor_ref);                                  \
    }                                                                                                             \
  }                                                                                                               \
  ULORL_NAMESPACE_END
#define ULORL_INSTANTIATE_POLICY_LOSS(T, M) ULORL_POLICY_LOSS_INSTANCE_(, T, M)
#define ULORL_EXTERN_POLICY_LOSS(T, M) ULORL_POLICY_LOSS_INSTANCE_(extern, T, M)

#if defined(ULORL_EXTERN_KERNELS)
#define ULORL_PAIR ULORL_EXTERN_POLICY_LOSS
#if defined(ULORL_EXTERN_KERNEL_PAIRS)
ULORL_EXTERN_KERNEL_PAIRS
#else
ULORL_POLICY_LOSS_PAIRS
#endif
#undef ULORL_PAIR
#endif
