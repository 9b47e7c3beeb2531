// ulorl/loss/rollout_correction/presets.hpp — the frameworks' rollout corrections as typed option
// structs (fields named as each framework names its options) and functions returning the
// rollout_correction::config that reproduces them:
//
//   verl      rollout_corr_helper: rollout_is token / sequence, TIS ("u") or IcePop ("l_u"),
//             rollout_is_batch_normalize, rollout_rs chains (verl-project/verl 1dda039b)
//   trl       vllm_importance_sampling_mode token_truncate / token_mask / sequence_truncate /
//             sequence_mask with clip_min / clip_max (TRL f2cd5771)
//   openrlhf  vllm_is_correction_type tis / icepop / seq-mask-tis (OpenRLHF 3c3be623)
//   nemo_rl   truncated_importance_sampling_type tis / icepop / seq-mask-tis, token or sequence
//             level, and its logged metrics with the global normalisers (NeMo-RL 7ea279ab)
//
// The parsers of verl's string options (rollout_is_threshold "l_u", rollout_rs "a,b" with
// rollout_rs_threshold "x,y") read config files; the C++ API itself is typed.
#pragma once

#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/loss/rollout_correction/compute.hpp"
#include "ulorl/loss/rollout_correction/config.hpp"

ULORL_NAMESPACE_BEGIN
namespace presets {

namespace detail_rc_presets {
[[nodiscard]] inline std::string_view strip(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}
//! A finite number spelling the whole (stripped) text, else nothing.
[[nodiscard]] inline std::optional<double> number(std::string_view s) noexcept {
  s = strip(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}
[[nodiscard]] inline std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t p = 0;;) {
    const std::size_t q = s.find(sep, p);
    out.push_back(s.substr(p, q == std::string_view::npos ? std::string_view::npos : q - p));
    if (q == std::string_view::npos) return out;
    p = q + 1;
  }
}
//! The shortest text of a double that reads back to it (Python's str of a float, up to format).
[[nodiscard]] inline std::string text_of(double v) {
  std::array<char, 64> buf{};
  const auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), r.ptr);
}
}  // namespace detail_rc_presets

// ---- verl -----------------------------------------------------------------------------------------
namespace verl {

//! `rollout_is_threshold`: an upper bound u (TIS), or bounds lower_upper (IcePop).
struct is_threshold {
  double upper = 2.0;
  std::optional<double> lower{};
};

//! verl's `rollout_is_threshold` string: "u" or "l_u"; rejected: empty or unparsable text, u <= 0,
//! l <= 0, l > u.
[[nodiscard]] inline is_threshold parse_rollout_is_threshold(std::string_view text) {
  constexpr std::string_view fn = "presets::verl::parse_rollout_is_threshold", arg = "rollout_is_threshold";
  const auto parts = detail_rc_presets::split(text, '_');
  if (parts.size() > 2) detail::fail(fn, arg, "'" + std::string(text) + "' is neither \"u\" nor \"l_u\"");
  std::array<double, 2> v{};
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const auto x = detail_rc_presets::number(parts[i]);
    if (!x) detail::fail(fn, arg, "'" + std::string(text) + "' is not a number nor \"l_u\"");
    v[i] = *x;
  }
  is_threshold th;
  if (parts.size() == 2) th.lower = v[0], th.upper = v[1];
  else th.upper = v[0];
  if (!(th.upper > 0)) detail::fail_value(fn, arg, th.upper, "the upper bound must be > 0");
  if (th.lower && !(*th.lower > 0)) detail::fail_value(fn, arg, *th.lower, "the lower bound must be > 0");
  if (th.lower && *th.lower > th.upper) detail::fail_value(fn, arg, *th.lower, "the lower bound exceeds the upper bound");
  return th;
}

//! verl's `rollout_rs` options ("token_k1, seq_mean_k3": split on ',', whitespace stripped, empty
//! items and repeats dropped, the first kept) with `rollout_rs_threshold` (one value for every
//! option or one per option, comma-separated; k1 options take "l_u" or "u" meaning l = 1/u, the
//! others one u > 0).
[[nodiscard]] inline rollout_correction::rejection_chain parse_rollout_rs(std::string_view rollout_rs,
                                                                          std::optional<std::string_view> rollout_rs_threshold) {
  constexpr std::string_view fn = "presets::verl::parse_rollout_rs";
  static constexpr std::array<std::string_view, 11> known = {"token_k1",    "token_k2",    "token_k3",    "seq_sum_k1",
                                                             "seq_sum_k2",  "seq_sum_k3",  "seq_mean_k1", "seq_mean_k2",
                                                             "seq_mean_k3", "seq_max_k2",  "seq_max_k3"};
  std::vector<std::string_view> names;
  for (auto item : detail_rc_presets::split(rollout_rs, ',')) {
    item = detail_rc_presets::strip(item);
    if (item.empty()) continue;
    bool is_known = false;
    for (auto k : known) is_known = is_known || k == item;
    if (!is_known) {
      std::string what = "unknown option '" + std::string(item) + "' (known:";
      const char* sep = " ";
      for (auto k : known) what += sep + std::string(k), sep = ", ";
      detail::fail(fn, "rollout_rs", what + ")");
    }
    bool repeat = false;
    for (auto n : names) repeat = repeat || n == item;
    if (!repeat) names.push_back(item);
  }
  if (names.empty()) detail::fail(fn, "rollout_rs", "no option in '" + std::string(rollout_rs) + "'");
  if (!rollout_rs_threshold) detail::fail(fn, "rollout_rs_threshold", "required with rollout_rs");
  auto values = detail_rc_presets::split(*rollout_rs_threshold, ',');
  if (values.size() != 1 && values.size() != names.size())
    detail::fail(fn, "rollout_rs_threshold",
                 std::to_string(values.size()) + " thresholds for " + std::to_string(names.size()) + " rollout_rs options");
  rollout_correction::rejection_chain chain;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const std::string_view name = names[i], text = values.size() == 1 ? values[0] : values[i];
    const std::size_t cut = name.rfind('_');
    rollout_correction::rejection_criterion c{
        .statistic = rollout_correction::rs_statistic_from_name(name.substr(0, cut), "rollout_rs"),
        .estimator = rollout_correction::rs_estimator_from_name(name.substr(cut + 1), "rollout_rs")};
    const auto parts = detail_rc_presets::split(text, '_');
    auto bad = [&](const std::string& why) {
      detail::fail(fn, "rollout_rs_threshold", "'" + std::string(text) + "' for " + std::string(name) + ": " + why);
    };
    if (c.estimator == rollout_correction::rs_estimator::k1) {
      if (parts.size() > 2) bad("k1 takes \"l_u\" or \"u\"");
      const auto a = detail_rc_presets::number(parts[0]);
      const auto u = detail_rc_presets::number(parts.back());
      if (!a || !u) bad("not a number");
      c.upper = *u;
      c.lower = parts.size() == 2 ? *a : 1.0 / *u;
      if (!(c.lower > 0 && c.lower <= c.upper) || !std::isfinite(c.lower)) bad("needs 0 < lower <= upper");
    } else {
      if (parts.size() != 1) bad("takes a single upper bound");
      const auto u = detail_rc_presets::number(parts[0]);
      if (!u) bad("not a number");
      if (!(*u > 0)) bad("the upper bound must be > 0");
      c.upper = *u;
    }
    chain.push_back(c);
  }
  return chain;
}
//! The same with a numeric `rollout_rs_threshold` (verl reads its Python str).
[[nodiscard]] inline rollout_correction::rejection_chain parse_rollout_rs(std::string_view rollout_rs, double rollout_rs_threshold) {
  const std::string text = detail_rc_presets::text_of(rollout_rs_threshold);
  return parse_rollout_rs(rollout_rs, std::optional<std::string_view>(text));
}

//! verl `algorithm.rollout_correction` options. `rollout_is` none (null) disables the weights, as
//! does a null threshold.
struct rollout_correction_options {
  rollout_correction::is_level rollout_is = rollout_correction::is_level::none;
  std::optional<is_threshold> rollout_is_threshold = is_threshold{};
  bool rollout_is_batch_normalize = false;
  rollout_correction::rejection_chain rollout_rs{};  //!< empty: no rejection sampling
};

//! verl's semantics: log-ratios clamped to +-20 (after the sum at sequence level), TIS without a
//! lower bound or IcePop, 0 at masked positions, RS estimators on the clamped log-ratio; an empty
//! batch and an all-zero weight batch (its ESS metric is 1/0) are rejected.
[[nodiscard]] inline rollout_correction::config rollout_correction(const rollout_correction_options& o) {
  using namespace ::ulorl::rollout_correction;
  constexpr std::string_view fn = "presets::verl::rollout_correction";
  require_known(fn, "rollout_is", o.rollout_is, is_level::none, is_level::token, is_level::sequence);
  config c{.importance = {.level = o.rollout_is_threshold ? o.rollout_is : is_level::none,
                          .log_ratio_clamp = 20.0,
                          .overflow = ratio_overflow::infinity,
                          .masked = masked_positions::zero,
                          .batch_normalize = o.rollout_is_batch_normalize},
           .rejection = {.chain = o.rollout_rs, .log_ratio_clamp = 20.0},
           .diagnostic_log_ratio_clamp = 20.0,
           .reject_empty_batch = true,
           .require_effective_sample_size = true};
  if (c.importance.level != is_level::none) {
    const auto& th = *o.rollout_is_threshold;
    if (!(th.upper > 0) || !std::isfinite(th.upper))
      detail::fail_value(fn, "rollout_is_threshold", th.upper, "the upper bound must be finite and > 0");
    if (th.lower) {
      if (!(*th.lower > 0)) detail::fail_value(fn, "rollout_is_threshold", *th.lower, "the lower bound must be > 0");
      if (*th.lower > th.upper) detail::fail_value(fn, "rollout_is_threshold", *th.lower, "the lower bound exceeds the upper bound");
      c.importance.weighting = is_weighting::mask, c.importance.lower = *th.lower;
    } else {
      c.importance.weighting = is_weighting::truncate, c.importance.lower = 0.0;
    }
    c.importance.upper = th.upper;
  }
  validate(fn, c);
  return c;
}

}  // namespace verl

// ---- TRL ------------------------------------------------------------------------------------------
namespace trl {

//! `vllm_importance_sampling_mode`.
enum class importance_sampling_mode { token_truncate, token_mask, sequence_truncate, sequence_mask };

//! "token_truncate", "token_mask", "sequence_truncate", "sequence_mask".
[[nodiscard]] inline importance_sampling_mode importance_sampling_mode_from_name(
    std::string_view name, std::string_view argument = "vllm_importance_sampling_mode") {
  using M = importance_sampling_mode;
  return rollout_correction::detail_rc::from_name<M, 4>(
      "presets::trl::importance_sampling_mode_from_name", argument, name,
      {{{"token_truncate", M::token_truncate}, {"token_mask", M::token_mask}, {"sequence_truncate", M::sequence_truncate},
        {"sequence_mask", M::sequence_mask}}});
}

//! GRPOConfig's vLLM importance-sampling options.
struct rollout_correction_options {
  importance_sampling_mode vllm_importance_sampling_mode = importance_sampling_mode::sequence_mask;
  std::optional<double> vllm_importance_sampling_clip_min{};
  std::optional<double> vllm_importance_sampling_clip_max = 3.0;
};

//! TRL's semantics: r = exp(L) unclamped (an overflow is +inf), truncate = clamp(r, min, max) with
//! absent bounds absent, mask = 0 outside; masked positions hold the weight of L = 0 (token modes)
//! or the row's (sequence modes). Rejected: min >= max, a truncate mode without bounds.
[[nodiscard]] inline rollout_correction::config rollout_correction(const rollout_correction_options& o) {
  using namespace ::ulorl::rollout_correction;
  using M = importance_sampling_mode;
  constexpr std::string_view fn = "presets::trl::rollout_correction";
  const M mode = o.vllm_importance_sampling_mode;
  require_known(fn, "vllm_importance_sampling_mode", mode, M::token_truncate, M::token_mask, M::sequence_truncate, M::sequence_mask);
  const auto& lo = o.vllm_importance_sampling_clip_min;
  const auto& hi = o.vllm_importance_sampling_clip_max;
  if (lo) require_non_negative(fn, "vllm_importance_sampling_clip_min", *lo);
  if (hi) require_positive(fn, "vllm_importance_sampling_clip_max", *hi);
  if (lo && hi && !(*lo < *hi))
    detail::fail_value(fn, "vllm_importance_sampling_clip_min", *lo, "must be < vllm_importance_sampling_clip_max");
  const bool truncate = mode == M::token_truncate || mode == M::sequence_truncate;
  if (truncate && !lo && !hi)
    detail::fail(fn, "vllm_importance_sampling_clip_max", "a *_truncate mode needs clip_min or clip_max");
  config c{.importance = {.level = mode == M::token_truncate || mode == M::token_mask ? is_level::token : is_level::sequence,
                          .weighting = truncate ? is_weighting::truncate : is_weighting::mask,
                          .lower = lo.value_or(0.0),
                          .upper = hi.value_or(unbounded),
                          .log_ratio_clamp = unbounded,
                          .overflow = ratio_overflow::infinity,
                          .masked = masked_positions::neutral}};
  validate(fn, c);
  return c;
}

}  // namespace trl

// ---- OpenRLHF -------------------------------------------------------------------------------------
namespace openrlhf {

//! `--algo.advantage.is_correction_type` options (vLLM importance-sampling correction).
struct rollout_correction_options {
  rollout_correction::is_weighting vllm_is_correction_type = rollout_correction::is_weighting::truncate;  //!< tis / icepop / seq-mask-tis
  std::array<double, 2> vllm_is_truncated_threshold = {0.5, 5.0};                                          //!< [lo, hi]
};

//! OpenRLHF's semantics: e = exp(x) unclamped at every position (masked ones included); tis
//! clamp(e, lo, hi); icepop e * [lo <= e <= hi]; seq-mask-tis e * [lo <= exp(mean_t x m) <= hi], raw
//! token weights, empty rows dropped. Masks multiply, so an overflowing e that is masked is NaN and
//! rejected; an empty batch is rejected (vllm_kl is 0/0).
[[nodiscard]] inline rollout_correction::config rollout_correction(const rollout_correction_options& o) {
  using namespace ::ulorl::rollout_correction;
  constexpr std::string_view fn = "presets::openrlhf::rollout_correction";
  require_known(fn, "vllm_is_correction_type", o.vllm_is_correction_type, is_weighting::truncate, is_weighting::mask,
                is_weighting::geometric_gate);
  const auto [lo, hi] = o.vllm_is_truncated_threshold;
  require_non_negative(fn, "vllm_is_truncated_threshold", lo);
  require_positive(fn, "vllm_is_truncated_threshold", hi);
  if (!(lo <= hi)) detail::fail_value(fn, "vllm_is_truncated_threshold", lo, "the lower bound exceeds the upper bound");
  config c{.importance = {.level = is_level::token,
                          .weighting = o.vllm_is_correction_type,
                          .lower = lo,
                          .upper = hi,
                          .log_ratio_clamp = unbounded,
                          .overflow = ratio_overflow::nan_when_masked,
                          .masked = masked_positions::as_valid,
                          .empty_rows = empty_row_gate::drop},
           .reject_empty_batch = true};
  validate(fn, c);
  return c;
}

}  // namespace openrlhf

// ---- NeMo-RL --------------------------------------------------------------------------------------
namespace nemo_rl {

//! ClippedPGLossFn's importance-sampling options.
struct rollout_correction_options {
  std::optional<rollout_correction::is_weighting> truncated_importance_sampling_type{};  //!< tis / icepop / seq-mask-tis; absent: raw weights
  std::optional<double> truncated_importance_sampling_ratio{};                           //!< hi
  std::optional<double> truncated_importance_sampling_ratio_min{};                       //!< lo
  bool sequence_level_importance_ratios = false;
};

//! NeMo-RL's semantics: w = exp(x) (token) or exp(sum_t x m) (sequence, on the whole row), computed
//! at every position, +inf mapped to 0; tis clamp(w, lo or 0, hi), icepop w [lo <= w <= hi],
//! seq-mask-tis w [lo <= exp(mean_t x m) <= hi] (an empty row's ratio is 1).
[[nodiscard]] inline rollout_correction::config rollout_correction(const rollout_correction_options& o) {
  using namespace ::ulorl::rollout_correction;
  constexpr std::string_view fn = "presets::nemo_rl::rollout_correction";
  const auto& type = o.truncated_importance_sampling_type;
  const auto& hi = o.truncated_importance_sampling_ratio;
  const auto& lo = o.truncated_importance_sampling_ratio_min;
  config c{.importance = {.level = o.sequence_level_importance_ratios ? is_level::sequence : is_level::token,
                          .weighting = is_weighting::truncate,
                          .lower = 0.0,
                          .upper = unbounded,
                          .log_ratio_clamp = unbounded,
                          .overflow = ratio_overflow::zero,
                          .masked = masked_positions::as_valid,
                          .empty_rows = empty_row_gate::ratio_one}};
  if (!type) {
    if (hi) detail::fail_value(fn, "truncated_importance_sampling_ratio", *hi, "set without truncated_importance_sampling_type");
    if (lo) detail::fail_value(fn, "truncated_importance_sampling_ratio_min", *lo, "set without truncated_importance_sampling_type");
  } else {
    require_known(fn, "truncated_importance_sampling_type", *type, is_weighting::truncate, is_weighting::mask,
                  is_weighting::geometric_gate);
    if (!hi) detail::fail(fn, "truncated_importance_sampling_ratio", "required with truncated_importance_sampling_type");
    require_positive(fn, "truncated_importance_sampling_ratio", *hi);
    if (lo) require_non_negative(fn, "truncated_importance_sampling_ratio_min", *lo);
    if (lo && *lo > *hi)
      detail::fail_value(fn, "truncated_importance_sampling_ratio_min", *lo, "exceeds truncated_importance_sampling_ratio");
    if (*type != is_weighting::truncate && !lo)
      detail::fail(fn, "truncated_importance_sampling_ratio_min", "required by icepop and seq-mask-tis");
    if (*type == is_weighting::geometric_gate && o.sequence_level_importance_ratios)
      detail::fail(fn, "sequence_level_importance_ratios", "seq-mask-tis works on token-level ratios");
    c.importance.weighting = *type, c.importance.upper = *hi, c.importance.lower = lo.value_or(0.0);
  }
  validate(fn, c);
  return c;
}

//! NeMo-RL's global normalisers of a loss call, `global_valid_toks` and `global_valid_seqs` (the
//! step's valid tokens and sequences over every micro-batch and rank); absent: this batch's own.
struct global_counts {
  std::optional<double> global_valid_toks{};  //!< Gt; absent: this batch's N
  std::optional<double> global_valid_seqs{};  //!< Gs; absent: this batch's B
};
//! Each given count is finite and >= 0, and a non-zero one a divisor (require_divisor: 5e-324 is not).
inline void validate(std::string_view fn, const global_counts& g) {
  for (const auto& [name, v] : {std::pair<std::string_view, const std::optional<double>*>{"global_valid_toks", &g.global_valid_toks},
                                std::pair<std::string_view, const std::optional<double>*>{"global_valid_seqs", &g.global_valid_seqs}})
    if (*v) {
      require_non_negative(fn, name, **v);
      if (**v != 0.0) require_divisor(fn, name, **v);
    }
}

//! NeMo-RL's logged metrics, with its global normalisers (global_counts).
struct rollout_correction_metrics {
  //! Token level: sum w m / Gt; sequence level: B * sum_b w_b / Gs (NeMo's masked mean broadcasts
  //! the [B, 1] weights against the [B] sample mask).
  double sampling_importance_ratio = 0;
  //! Out-of-bounds fraction: seq-mask-tis rows / Gs, otherwise tokens / Gt (0 without a type).
  double is_oob_ratio = 0;
};
[[nodiscard]] inline rollout_correction_metrics rollout_correction_logged(const rollout_correction::metrics& m,
                                                                          const rollout_correction_options& o,
                                                                          const global_counts& g = {}) {
  constexpr std::string_view fn = "presets::nemo_rl::rollout_correction_logged";
  validate(fn, g);
  const auto& s = m.totals;
  const double gt = g.global_valid_toks.value_or(s.tokens), gs = g.global_valid_seqs.value_or(s.rows);
  auto per = [](double a, double d) { return d > 0 ? a / d : 0.0; };
  rollout_correction_metrics r;
  r.sampling_importance_ratio = o.sequence_level_importance_ratios ? per(s.rows * s.unit_sum, gs) : per(s.weight_sum, gt);
  if (o.truncated_importance_sampling_type)
    r.is_oob_ratio = *o.truncated_importance_sampling_type == rollout_correction::is_weighting::geometric_gate
                         ? per(s.out_of_bounds_rows, gs)
                         : per(s.out_of_bounds_tokens, gt);
  return r;
}

}  // namespace nemo_rl
}  // namespace presets
ULORL_NAMESPACE_END
