// ulorl/logits/fused_loss.hpp — the policy loss straight from logits: logits [N, V] + target ids +
// old / reference log-probs + advantages + mask -> loss, d loss / d logits and the metrics, for every
// objective, KL estimator, entropy term and aggregation mode of ulorl/loss/policy_loss.hpp, with its
// partition-exact normaliser. Three passes, none of them [N, V]-sized in memory:
//   1. logits_forward: log_prob_i, entropy_i, lse_i per token (one read of the logits);
//   2. policy_loss: d loss / d log_prob_i and d loss / d entropy_i (the loss area's own scalar math,
//      not a second copy: sequence-level objectives such as GSPO / GMPO work unchanged);
//   3. logits_backward: d loss / d logits (one read, one write; may run in place).
// Row i of the logits is the token of flat index i of the token layout (padded: b * T + t, including
// masked positions, whose gradient rows come out 0; packed: offsets[b] + t). This is what verl's and
// Liger's fused "linear cross-entropy + loss" paths compute, without their [N, V] temporaries.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/views.hpp"
#include "ulorl/logits/backward.hpp"
#include "ulorl/logits/forward.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/loss/policy_loss.hpp"

ULORL_NAMESPACE_BEGIN

//! Caller-owned per-token buffers of policy_loss_from_logits, all in the layout of old_log_prob.
template <class T>
struct logits_loss_buffers {
  token_view<T> log_prob;       //!< out: chosen-token log-probs
  token_view<T> entropy;        //!< out: entropies (required when entropy_coef != 0; else empty: not computed)
  token_view<T> grad_log_prob;  //!< out: d loss / d log_prob
  token_view<T> grad_entropy;   //!< out: d loss / d entropy (required when entropy_coef != 0)
  vector_view<T> lse;           //!< out: [N] log-sum-exp of logits / temperature, flat token order
  //! out, optional: sum_v p_v^2 of every token (logits_outputs::sum_pi_squared), for a hook that
  //! needs it (the optimal token baseline); empty: not computed
  token_view<T> sum_pi_squared{};
};

//! What a statistics hook sees: every token's statistics after the forward pass, before the loss, in
//! the layout of old_log_prob (`entropy` empty when the buffers have none; `lse` in flat token order).
template <class T>
struct token_statistics {
  token_view<const T> log_prob;
  token_view<const T> entropy;
  vector_view<const T> lse;
  token_view<const T> sum_pi_squared{};  //!< empty unless the buffers have it
};

//! The default statistics hook: does nothing.
struct no_statistics_hook {
  template <class T>
  constexpr void operator()(const token_statistics<T>&) const noexcept {}
};

namespace detail::logits {
inline namespace ULORL_ISA {

template <class L>
matrix_view<const L> token_rows(matrix_view<const L> logits, std::size_t first, std::size_t count) noexcept {
  return {logits.data() + static_cast<std::ptrdiff_t>(first) * logits.row_stride(), count, logits.cols(),
          logits.row_stride(), logits.col_stride()};
}
template <class G>
matrix_view<G> token_rows(matrix_view<G> m, std::size_t first, std::size_t count) noexcept {
  return {m.data() + static_cast<std::ptrdiff_t>(first) * m.row_stride(), count, m.cols(), m.row_stride(),
          m.col_stride()};
}

//! The checks shared by policy_loss_from_logits and policy_loss_from_hidden: `in` has no log-probs
//! or entropies (they are computed from `source`), `buf` matches the token layout. Returns the
//! number of tokens.
template <class T, class M>
std::size_t validate_loss_buffers(const char* fn, const char* source, const policy_loss_inputs<T, M>& in,
                               const policy_loss_config& cfg, const logits_loss_buffers<T>& buf) {
  const std::string from = std::string("must be empty: it is computed from the ") + source;
  if (!in.log_prob.empty()) detail::fail(fn, "log_prob", from);
  if (!in.entropy.empty()) detail::fail(fn, "entropy", from);
  const token_view<const T>& ref = in.old_log_prob;
  validate_layout(fn, "old_log_prob", ref);
  require_same_shape(fn, "buf.log_prob", buf.log_prob, "old_log_prob", ref);
  require_same_shape(fn, "buf.grad_log_prob", buf.grad_log_prob, "old_log_prob", ref);
  if (cfg.entropy_coef != 0.0) {
    require_same_shape(fn, "buf.entropy", buf.entropy, "old_log_prob", ref);
    require_same_shape(fn, "buf.grad_entropy", buf.grad_entropy, "old_log_prob", ref);
  } else if (!buf.entropy.empty()) {
    require_same_shape(fn, "buf.entropy", buf.entropy, "old_log_prob", ref);
  }
  require_same_size(fn, "buf.lse", buf.lse.size(), "tokens", ref.size());
  if (!buf.sum_pi_squared.empty()) {
    require_same_shape(fn, "buf.sum_pi_squared", buf.sum_pi_squared, "old_log_prob", ref);
    detail::require_distinct_tokens(fn, "buf.sum_pi_squared", buf.sum_pi_squared);
    detail::require_disjoint_tokens(fn, "buf.sum_pi_squared", buf.sum_pi_squared, "buf.log_prob", buf.log_prob);
    if (!buf.entropy.empty())
      detail::require_disjoint_tokens(fn, "buf.sum_pi_squared", buf.sum_pi_squared, "buf.entropy", buf.entropy);
  }
  detail::require_distinct_tokens(fn, "buf.log_prob", buf.log_prob);
  require_distinct_elements(fn, "buf.lse", buf.lse);
  if (!buf.entropy.empty()) {
    detail::require_distinct_tokens(fn, "buf.entropy", buf.entropy);
    detail::require_disjoint_tokens(fn, "buf.entropy", buf.entropy, "buf.log_prob", buf.log_prob);
  }
  return ref.size();
}

//! The statistics in `buf` as the hook sees them.
template <class T>
token_statistics<T> statistics_of(const logits_loss_buffers<T>& buf) noexcept {
  return {buf.log_prob, buf.entropy, buf.lse, buf.sum_pi_squared};
}

//! The policy loss on the log-probs (and entropies) in `buf`: validates every token input and
//! writes the token gradients into `buf`.
template <class T, class M, class Exec>
policy_loss_result loss_on_buffers(const policy_loss_inputs<T, M>& in, const policy_loss_config& cfg,
                                   const logits_loss_buffers<T>& buf, const Exec& exec) {
  const bool with_entropy = cfg.entropy_coef != 0.0;
  policy_loss_inputs<T, M> full = in;
  full.log_prob = buf.log_prob;
  if (with_entropy) full.entropy = buf.entropy;
  return policy_loss(full, buf.grad_log_prob, with_entropy ? buf.grad_entropy : token_view<T>(), cfg, exec);
}

}  // namespace ULORL_ISA
}  // namespace detail::logits

inline namespace ULORL_ISA {

//! Loss, metrics and d loss / d logits of one micro-batch. `in.log_prob` and `in.entropy` must be
//! empty: they are computed from `logits` / `lcfg.temperature` into `buf` (entropies whenever
//! `buf.entropy` is given). Labels are the sampled token ids of every row (padded positions too: any
//! id in [0, V)). Throws ulorl::error before writing `grad_logits`: a NaN / +inf logit is rejected by
//! the value scan of `lcfg.check_values`, which runs inside the forward's read of the logits (or,
//! with that scan off, its row's non-finite log-prob by the policy loss's own `cfg.check_values`
//! scan, naming the token).
//!
//! `hook(const token_statistics<T>&)` runs between the statistics and the loss: it sees every
//! token's log-prob, entropy and log-sum-exp and may write the memory behind `in.mask` and
//! `in.weights` (the caller's), which the loss then reads and validates: UloRL's dynamic MPT mask
//! (mpt_mask on the current policy's statistics), entropy-based token selection. The loss runs on
//! `exec` like the forward and backward passes.
template <class L, class I, class T, class M, class G, class Exec = sequential_executor, class Hook = no_statistics_hook>
[[nodiscard]] policy_loss_result policy_loss_from_logits(matrix_view<const L> logits, std::span<const I> labels,
                                                         const policy_loss_inputs<T, M>& in, const logits_loss_buffers<T>& buf,
                                                         matrix_view<G> grad_logits, const policy_loss_config& cfg,
                                                         const logits_config& lcfg = {}, Exec&& exec = {}, Hook&& hook = {}) {
  constexpr const char* fn = "policy_loss_from_logits";
  const std::size_t n = detail::logits::validate_loss_buffers(fn, "logits", in, cfg, buf);
  const token_view<const T>& ref = in.old_log_prob;
  if (logits.rows() != n)
    detail::fail(fn, "logits",
                 "has " + std::to_string(logits.rows()) + " rows but the token layout has " + std::to_string(n) +
                     " tokens (row i of the logits is token flat_index i)");
  const bool with_entropy = cfg.entropy_coef != 0.0, entropy_out = !buf.entropy.empty();
  if (grad_logits.rows() != logits.rows() || grad_logits.cols() != logits.cols())
    detail::fail(fn, "grad_logits", "must have the shape of 'logits'");
  require_distinct_elements(fn, "grad_logits", grad_logits);
  detail::logits::validate_common<T>(fn, logits, labels, lcfg);
  // The value scan of lcfg.check_values runs inside the forward's read of the logits (step 1), which
  // throws before the loss and the backward run; the backward reads logits it has seen.
  logits_config bcfg = lcfg;
  bcfg.check_values = false;

  // 1. Per-token statistics, response by response (rows of the token layout may be strided).
  for (std::size_t b = 0; b < ref.rows(); ++b) {
    const std::size_t first = ref.row_begin(b), count = ref.row_size(b);
    logits_forward(detail::logits::token_rows(logits, first, count), labels.subspan(first, count),
                   logits_outputs<T>{.log_prob = buf.log_prob.row(b),
                                     .entropy = entropy_out ? buf.entropy.row(b) : vector_view<T>(),
                                     .lse = vector_view<T>(buf.lse.data() + static_cast<std::ptrdiff_t>(first) *
                                                                                buf.lse.stride(),
                                                           count, buf.lse.stride()),
                                     .sum_pi_squared = buf.sum_pi_squared.empty() ? vector_view<T>()
                                                                                  : buf.sum_pi_squared.row(b)},
                   lcfg, exec);
  }
  // 2. The caller's hook, then the policy loss on those log-probs (validates every token input,
  // writes the token gradients).
  hook(detail::logits::statistics_of(buf));
  const policy_loss_result res = detail::logits::loss_on_buffers(in, cfg, buf, exec);
  // 3. d loss / d logits.
  for (std::size_t b = 0; b < ref.rows(); ++b) {
    const std::size_t first = ref.row_begin(b), count = ref.row_size(b);
    const auto sub = [&](vector_view<T> v) {
      return vector_view<const T>(v.data() + static_cast<std::ptrdiff_t>(first) * v.stride(), count, v.stride());
    };
    const auto gl = buf.grad_log_prob.row(b);
    logits_backward(detail::logits::token_rows(logits, first, count), labels.subspan(first, count), sub(buf.lse),
                    with_entropy ? vector_view<const T>(buf.entropy.row(b)) : vector_view<const T>(),
                    vector_view<const T>(gl),
                    with_entropy ? vector_view<const T>(buf.grad_entropy.row(b)) : vector_view<const T>(),
                    detail::logits::token_rows(grad_logits, first, count), bcfg, exec);
  }
  return res;
}

}  // namespace ULORL_ISA

ULORL_NAMESPACE_END
