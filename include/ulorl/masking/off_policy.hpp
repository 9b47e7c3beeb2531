// ulorl/masking/off_policy.hpp — off-policy sequence masking (OPSM, DeepSeek-V3.2): a response whose
// advantage is negative and whose behaviour policy has drifted too far from the current one is
// dropped from the policy-gradient term.
//   kl_b       = Σ_t (old_log_prob[b,t] - log_prob[b,t]) · m[b,t] / max(n_b, 1)
//   drop[b,t]  = [A < 0  and  kl_b > delta]          at every position t of row b
//   keep[b,t]  = 1 - drop[b,t]                        (or m[b,t] · (1 - drop[b,t]), see off_policy_mask_form)
// A is the response's advantage A_b (TRL `get_off_policy_mask`, `off_policy_mask_threshold`: keep
// = [A_b >= 0 or kl_b <= delta]) or the token's A[b,t] (slime `compute_opsm_mask`, `--use-opsm`,
// `--opsm-delta`); their configurations are presets::trl::off_policy_mask and
// presets::slime::off_policy_mask (ulorl/presets/trl.hpp, slime.hpp). slime's metric
// opsm_clipfrac = Σ_b (Σ_t drop[b,t]) / max(n_b, 1): a sum of per-row fractions whose numerator
// counts every position of the row, valid or not.
// Both frameworks multiply the mask into the per-token policy-gradient loss and keep their
// normaliser and the KL term as they are: with ulorl::policy_loss that is the `factor` form
// multiplied into `weights` (the objective's per-token weight). The `loss_mask` form, given as
// policy_loss's `mask`, also drops those tokens from the normaliser and the KL / entropy terms.
// Every statistic is per row, so the mask of a row needs only that row (whole, as slime gathers
// it across context-parallel ranks); the metrics are sums over rows, which add across
// micro-batches and ranks (off_policy_mask_stats::operator+=).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

//! Where the advantage whose sign decides is read.
enum class off_policy_advantage_level : std::uint8_t {
  sequence,  //!< one advantage per response, A_b (TRL): the whole row is kept or dropped
  token,     //!< one advantage per token, A[b,t] (slime): a row's negative-advantage tokens are dropped
};

//! What `keep` holds at each position.
enum class off_policy_mask_form : std::uint8_t {
  factor,     //!< 1 - drop[b,t] at every position, padding included (TRL's and slime's mask tensor)
  loss_mask,  //!< m[b,t] · (1 - drop[b,t]): 0 at invalid tokens, ready as policy_loss's `mask`
};

//! Off-policy sequence masking parameters. delta defaults to slime's `--opsm-delta` 1e-4 (TRL's
//! `off_policy_mask_threshold` has no default: None turns the mask off).
struct off_policy_mask_config {
  double delta = 1e-4;  //!< threshold on the row's mean KL(old || current), finite
  off_policy_advantage_level advantage = off_policy_advantage_level::sequence;
  off_policy_mask_form form = off_policy_mask_form::factor;
};

//! One batch. log_prob, old_log_prob, mask and (token level) advantages share one shape (either
//! layout); `sequence_advantages` holds B values. The level not configured must be left empty.
template <class T, class M = std::uint8_t, class A = T>
struct off_policy_mask_inputs {
  token_view<const T> log_prob{};             //!< log pi_theta, current policy (detached)
  token_view<const T> old_log_prob{};         //!< log pi_old, the behaviour policy that sampled the tokens
  token_view<const M> mask{};                 //!< 0/1 response mask; an empty view means every token is valid
  token_view<const A> advantages{};           //!< per token (advantage level token)
  std::span<const A> sequence_advantages{};   //!< [B] (advantage level sequence)
};

//! Counts and slime's metric; every field is a sum over rows (add partial results with +=).
struct off_policy_mask_stats {
  std::size_t rows = 0;
  std::size_t tokens = 0;            //!< valid tokens (m == 1)
  std::size_t off_policy_rows = 0;   //!< rows with kl_b > delta
  std::size_t dropped_rows = 0;      //!< rows with at least one dropped position
  std::size_t dropped_tokens = 0;    //!< valid tokens dropped
  double clipfrac = 0.0;             //!< slime's opsm_clipfrac, Σ_b (Σ_t drop[b,t]) / max(n_b, 1)
  off_policy_mask_stats& operator+=(const off_policy_mask_stats& o) noexcept {
    rows += o.rows;
    tokens += o.tokens;
    off_policy_rows += o.off_policy_rows;
    dropped_rows += o.dropped_rows;
    dropped_tokens += o.dropped_tokens;
    clipfrac += o.clipfrac;
    return *this;
  }
  //! Dropped share of the valid tokens (0 without tokens).
  [[nodiscard]] double dropped_token_fraction() const noexcept {
    return tokens ? static_cast<double>(dropped_tokens) / static_cast<double>(tokens) : 0.0;
  }
};

namespace detail {
inline void validate_off_policy_mask_config(std::string_view fn, const off_policy_mask_config& c) {
  require_finite(fn, "delta", c.delta);
  require_known(fn, "advantage", c.advantage, off_policy_advantage_level::sequence, off_policy_advantage_level::token);
  require_known(fn, "form", c.form, off_policy_mask_form::factor, off_policy_mask_form::loss_mask);
}
}  // namespace detail

//! Writes the keep mask into `keep` (log_prob's shape) and, when `seq_kl` is not empty, each row's
//! kl_b into seq_kl [B]; returns the counts. Everything is validated before anything is written:
//! finite delta, known enums, equal shapes and layouts, a 0/1 mask, the advantages of the
//! configured level present (B values, or log_prob's shape) and those of the other level absent,
//! every log-probability and advantage finite at every position (the frameworks' products would
//! turn a non-finite value at a masked position into NaN). An empty row has kl_b = 0.
template <class T, class M, class A, class O>
off_policy_mask_stats off_policy_mask(const off_policy_mask_inputs<T, M, A>& in, token_view<O> keep,
                                      std::span<double> seq_kl, const off_policy_mask_config& cfg) {
  static_assert(std::is_floating_point_v<T>, "log-probabilities must be float or double");
  static_assert(!std::is_const_v<O>, "keep must be writable");
  constexpr std::string_view fn = "off_policy_mask";
  detail::validate_off_policy_mask_config(fn, cfg);
  const auto& lp = in.log_prob;
  validate_layout(fn, "log_prob", lp);
  validate_layout(fn, "old_log_prob", in.old_log_prob);
  require_same_shape(fn, "old_log_prob", in.old_log_prob, "log_prob", lp);
  if (!in.mask.empty()) {
    validate_layout(fn, "mask", in.mask);
    require_same_shape(fn, "mask", in.mask, "log_prob", lp);
    require_binary_mask(fn, "mask", in.mask);
  }
  const bool per_token = cfg.advantage == off_policy_advantage_level::token;
  if (per_token) {
    if (in.advantages.empty()) detail::fail(fn, "advantages", "required (per token) when advantage == token");
    if (!in.sequence_advantages.empty())
      detail::fail(fn, "sequence_advantages", "must be empty when advantage == token (advantages are per token)");
    validate_layout(fn, "advantages", in.advantages);
    require_same_shape(fn, "advantages", in.advantages, "log_prob", lp);
  } else {
    if (!in.advantages.empty())
      detail::fail(fn, "advantages", "must be empty when advantage == sequence (give sequence_advantages [B])");
    require_same_size(fn, "sequence_advantages", in.sequence_advantages.size(), "log_prob rows", lp.rows());
  }
  validate_layout(fn, "keep", keep);
  require_same_shape(fn, "keep", keep, "log_prob", lp);
  if (!seq_kl.empty()) require_same_size(fn, "seq_kl", seq_kl.size(), "log_prob rows", lp.rows());
  require_all_finite(fn, "log_prob", lp);
  require_all_finite(fn, "old_log_prob", in.old_log_prob);
  if (per_token)
    require_all_finite(fn, "advantages", in.advantages);
  else
    for (std::size_t b = 0; b < in.sequence_advantages.size(); ++b)
      if (!std::isfinite(static_cast<double>(in.sequence_advantages[b])))
        detail::fail_at(fn, "sequence_advantages", static_cast<std::int64_t>(b), in.sequence_advantages[b],
                        "must be finite");

  // Row b's mean of old - logp over its valid tokens, and their count. Where the plain sum
  // overflows, the difference of the two scaled means (visited_moments); a mean beyond the double
  // range is an error, found in a pass before anything is written.
  const auto row_kl = [&](std::size_t b, std::size_t& valid) {
    const std::size_t n = lp.row_size(b);
    double sum = 0.0;
    valid = 0;
    for (std::size_t t = 0; t < n; ++t)
      if (in.mask.empty() || in.mask(b, t) != M(0)) {
        sum += static_cast<double>(in.old_log_prob(b, t)) - static_cast<double>(lp(b, t));
        ++valid;
      }
    const double kl = sum / static_cast<double>(valid > 0 ? valid : 1);
    if (std::isfinite(kl)) return kl;
    const auto mean_of = [&](const auto& v) {
      return visited_moments([&](auto&& f) {
               for (std::size_t t = 0; t < n; ++t)
                 if (in.mask.empty() || in.mask(b, t) != M(0)) f(v(b, t));
             })
          .mean;
    };
    return mean_of(in.old_log_prob) - mean_of(lp);
  };
  for (std::size_t b = 0; b < lp.rows(); ++b) {
    std::size_t valid = 0;
    require_result_in_range<double>(fn, "seq_kl", static_cast<std::int64_t>(b), row_kl(b, valid));
  }
  off_policy_mask_stats st;
  st.rows = lp.rows();
  for (std::size_t b = 0; b < lp.rows(); ++b) {
    const std::size_t n = lp.row_size(b);
    std::size_t valid = 0;
    const double kl = row_kl(b, valid);
    if (!seq_kl.empty()) seq_kl[b] = kl;
    const bool off_policy = kl > cfg.delta;
    st.tokens += valid;
    st.off_policy_rows += off_policy;
    std::size_t dropped = 0;
    for (std::size_t t = 0; t < n; ++t) {
      const double a = per_token ? static_cast<double>(in.advantages(b, t)) : static_cast<double>(in.sequence_advantages[b]);
      const bool drop = off_policy && a < 0.0;
      const bool is_valid = in.mask.empty() || in.mask(b, t) != M(0);
      dropped += drop;
      st.dropped_tokens += drop && is_valid;
      const bool kept = cfg.form == off_policy_mask_form::factor ? !drop : !drop && is_valid;
      keep(b, t) = kept ? O(1) : O(0);
    }
    st.dropped_rows += dropped > 0;
    st.clipfrac += static_cast<double>(dropped) / static_cast<double>(valid > 0 ? valid : 1);
  }
  return st;
}

//! The keep mask and the counts, without the rows' kl_b.
template <class T, class M, class A, class O>
off_policy_mask_stats off_policy_mask(const off_policy_mask_inputs<T, M, A>& in, token_view<O> keep,
                                      const off_policy_mask_config& cfg) {
  return off_policy_mask(in, keep, std::span<double>{}, cfg);
}

ULORL_NAMESPACE_END
