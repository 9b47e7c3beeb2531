// ulorl/masking/mpt.hpp — masks of well-mastered positive tokens (MPTs), UloRL (Du et al. 2025,
// arXiv 2507.19766, Eq. 9-10).
//   MPT:      token t of response k with  positive(k)  and  p(t) = exp(log p(t)) >= tau
//   static:   keep(t) = m(t) · [t not MPT]
//   dynamic:  keep(t) = m(t) · [t not MPT  or  H >= sigma]          (DMMPT)
// where H is the mean token entropy of the response (default) or of the whole batch (the paper's
// "model entropy" reading), tau = 0.99 and sigma = 0.2 (the paper's values). `keep` is the 0/1
// token mask the host multiplies into every loss term (and the aggregation's token count).
// positive(k) is `reward_k >= positive_reward` (UloRL: r = 1 for binary rewards) or `advantage_k > 0`.
// The paper does not say which policy's probability p is; `mpt_probability` names the choice.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"

ULORL_NAMESPACE_BEGIN

//! What is masked: nothing (diagnostics only), every MPT, or MPTs only under the entropy target.
enum class mpt_mode : std::uint8_t { off, static_mask, dynamic_mask };
//! Which responses count as positive.
enum class mpt_positive : std::uint8_t {
  reward,     //!< response_score >= positive_reward (UloRL: reward == 1 with binary rewards)
  advantage,  //!< response_score > 0 (the response's advantage)
};
//! Which policy's probability decides mastery: the current policy being trained (default) or the
//! rollout policy that sampled the tokens. Equal on the first on-policy minibatch.
enum class mpt_probability : std::uint8_t { current, rollout };
//! Over which tokens the entropy compared with sigma is averaged (dynamic mode).
enum class mpt_entropy_scope : std::uint8_t {
  response,  //!< each response's mean token entropy decides for that response (default)
  batch,     //!< the batch's token-mean entropy decides for every response
};

//! MPT masking parameters. Defaults: UloRL's tau = 0.99, sigma = 0.2, dynamic masking.
struct mpt_config {
  mpt_mode mode = mpt_mode::dynamic_mask;
  double tau = 0.99;              //!< mastery threshold on p, in (0, 1]
  double sigma = 0.2;             //!< target entropy (nats), >= 0; dynamic mode masks when H < sigma
  mpt_positive positive = mpt_positive::reward;
  double positive_reward = 1.0;   //!< reward threshold for `mpt_positive::reward`
  mpt_probability probability = mpt_probability::current;
  mpt_entropy_scope scope = mpt_entropy_scope::response;
};

//! One batch of per-token inputs; every token view has the same shape (either layout).
template <class T, class M = std::uint8_t, class S = double>
struct mpt_batch {
  token_view<const T> log_prob{};      //!< log pi_theta(t), current policy (needed for probability == current)
  token_view<const T> old_log_prob{};  //!< log pi_old(t), rollout policy (needed for probability == rollout)
  token_view<const T> entropy{};       //!< per-token entropy of the current policy (nats)
  token_view<const M> mask{};          //!< 0/1 response mask; an empty view means every token is valid
  std::span<const S> response_score{}; //!< [B]: reward or advantage of each response (see mpt_positive)
};

//! Counts over valid tokens (mask == 1) and responses.
struct mpt_stats {
  std::size_t responses = 0;
  std::size_t tokens = 0;                  //!< valid tokens
  std::size_t positive_responses = 0;
  std::size_t mpt_tokens = 0;              //!< MPTs, masked or not
  std::size_t masked_tokens = 0;           //!< tokens whose keep value is 0 although valid
  std::size_t responses_below_target = 0;  //!< responses whose mean entropy < sigma (with >= 1 token)
  bool batch_below_target = false;         //!< batch token-mean entropy < sigma
  double mean_entropy = 0.0;               //!< batch token-mean entropy (0 without tokens)
  [[nodiscard]] double mpt_fraction() const noexcept {
    return tokens ? static_cast<double>(mpt_tokens) / static_cast<double>(tokens) : 0.0;
  }
  [[nodiscard]] double masked_fraction() const noexcept {
    return tokens ? static_cast<double>(masked_tokens) / static_cast<double>(tokens) : 0.0;
  }
};

namespace detail {

inline void validate_mpt_config(std::string_view fn, const mpt_config& c) {
  if (!(c.tau > 0.0 && c.tau <= 1.0)) fail_value(fn, "tau", c.tau, "must be in (0, 1]");
  if (!(c.sigma >= 0.0) || !std::isfinite(c.sigma)) fail_value(fn, "sigma", c.sigma, "must be finite and >= 0");
  if (!std::isfinite(c.positive_reward)) fail_value(fn, "positive_reward", c.positive_reward, "must be finite");
  require_known(fn, "mode", c.mode, mpt_mode::off, mpt_mode::static_mask, mpt_mode::dynamic_mask);
  require_known(fn, "positive", c.positive, mpt_positive::reward, mpt_positive::advantage);
  require_known(fn, "probability", c.probability, mpt_probability::current, mpt_probability::rollout);
  require_known(fn, "scope", c.scope, mpt_entropy_scope::response, mpt_entropy_scope::batch);
}

template <class M>
[[nodiscard]] inline bool mpt_valid(const token_view<const M>& mask, std::size_t b, std::size_t t) noexcept {
  return mask.empty() || mask(b, t) != M(0);
}

//! Finite at every valid token; masked positions are never read into a result, so are not checked.
template <class T, class M>
void require_finite_where_valid(std::string_view fn, std::string_view arg, const token_view<const T>& v,
                                const token_view<const M>& mask) {
  for (std::size_t b = 0; b < v.rows(); ++b) {
    const std::size_t n = v.row_size(b);
    for (std::size_t t = 0; t < n; ++t)
      if (mpt_valid(mask, b, t) && !std::isfinite(static_cast<double>(v(b, t))))
        fail_at(fn, arg, static_cast<std::int64_t>(v.flat_index(b, t)), v(b, t),
                "must be finite (row " + std::to_string(b) + ", token " + std::to_string(t) + ")");
  }
}

}  // namespace detail

//! Writes the keep mask of a batch into `keep` (same shape as the inputs; 1 = token trains,
//! 0 = masked MPT or invalid token) and returns the counts. Every input is validated before
//! `keep` is written: tau in (0, 1], sigma finite >= 0, finite log-probabilities and entropies at
//! valid tokens, 0/1 mask, equal shapes, one score per response. Log-probabilities above 0 and
//! tiny negative entropies (rounding of the host's kernels) are accepted as given.
template <class T, class M, class S, class O>
[[nodiscard]] mpt_stats mpt_mask(const mpt_batch<T, M, S>& in, token_view<O> keep, const mpt_config& cfg = {}) {
  static_assert(std::is_floating_point_v<T>, "log-probabilities and entropies must be float or double");
  static_assert(!std::is_const_v<O>, "keep must be writable");
  constexpr std::string_view fn = "mpt_mask";
  detail::validate_mpt_config(fn, cfg);

  const bool use_rollout = cfg.probability == mpt_probability::rollout;
  const token_view<const T>& lp = use_rollout ? in.old_log_prob : in.log_prob;
  const std::string_view lp_name = use_rollout ? "old_log_prob" : "log_prob";
  if (lp.empty() && !in.entropy.empty())
    detail::fail(fn, lp_name, use_rollout ? "required when probability == rollout" : "required when probability == current");
  validate_layout(fn, lp_name, lp);
  validate_layout(fn, "entropy", in.entropy);
  require_same_shape(fn, "entropy", in.entropy, lp_name, lp);
  if (!in.mask.empty()) {
    validate_layout(fn, "mask", in.mask);
    require_same_shape(fn, "mask", in.mask, lp_name, lp);
    require_binary_mask(fn, "mask", in.mask);
  }
  validate_layout(fn, "keep", keep);
  require_same_shape(fn, "keep", keep, lp_name, lp);
  require_same_size(fn, "response_score", in.response_score.size(), std::string(lp_name) + " rows", lp.rows());
  for (std::size_t b = 0; b < in.response_score.size(); ++b)
    if (!std::isfinite(static_cast<double>(in.response_score[b])))
      detail::fail_at(fn, "response_score", static_cast<std::int64_t>(b), in.response_score[b], "must be finite");
  detail::require_finite_where_valid<T, M>(fn, lp_name, lp, in.mask);
  detail::require_finite_where_valid<T, M>(fn, "entropy", in.entropy, in.mask);

  mpt_stats st;
  st.responses = lp.rows();
  const std::size_t rows = lp.rows();

  // Batch token-mean entropy: needed by the batch scope and reported by both.
  double h_sum = 0.0;
  for (std::size_t b = 0; b < rows; ++b)
    for (std::size_t t = 0, n = lp.row_size(b); t < n; ++t)
      if (detail::mpt_valid(in.mask, b, t)) {
        h_sum += static_cast<double>(in.entropy(b, t));
        ++st.tokens;
      }
  st.mean_entropy = st.tokens ? h_sum / static_cast<double>(st.tokens) : 0.0;
  st.batch_below_target = st.tokens > 0 && st.mean_entropy < cfg.sigma;

  for (std::size_t b = 0; b < rows; ++b) {
    const std::size_t n = lp.row_size(b);
    double rh = 0.0;
    std::size_t rn = 0;
    for (std::size_t t = 0; t < n; ++t)
      if (detail::mpt_valid(in.mask, b, t)) {
        rh += static_cast<double>(in.entropy(b, t));
        ++rn;
      }
    const bool row_below = rn > 0 && rh / static_cast<double>(rn) < cfg.sigma;
    st.responses_below_target += row_below;

    const double score = static_cast<double>(in.response_score[b]);
    const bool positive = cfg.positive == mpt_positive::reward ? score >= cfg.positive_reward : score > 0.0;
    st.positive_responses += positive;
    bool mask_mpts = false;
    switch (cfg.mode) {
      case mpt_mode::off: break;
      case mpt_mode::static_mask: mask_mpts = true; break;
      case mpt_mode::dynamic_mask:
        mask_mpts = cfg.scope == mpt_entropy_scope::response ? row_below : st.batch_below_target;
        break;
    }
    for (std::size_t t = 0; t < n; ++t) {
      if (!detail::mpt_valid(in.mask, b, t)) {
        keep(b, t) = O(0);
        continue;
      }
      const bool mpt = positive && std::exp(static_cast<double>(lp(b, t))) >= cfg.tau;
      st.mpt_tokens += mpt;
      const bool drop = mpt && mask_mpts;
      st.masked_tokens += drop;
      keep(b, t) = drop ? O(0) : O(1);
    }
  }
  return st;
}

ULORL_NAMESPACE_END
