// python/src/corrections.cpp — the batch functions of ulorl around the policy loss, on torch tensors:
// the rollout correction (ulorl/loss/rollout_correction.hpp) with the frameworks' presets, the
// advantage estimators beyond group statistics (GPG, OPO, REINFORCE++, GAE, ReMax, Pass@k,
// multi-reward / GDPO, optimal token baseline), aggregation and the element-wise KL penalty (value
// and gradient, for the Python autograd wrapper), the off-policy sequence mask, the token selections
// of verl's dppo_* / kl_cov / clip_cov (ulorl/loss/token_selection.hpp), OpenRLHF's vLLM IS plan,
// NeMo-RL's ClippedPGLossFn pieces (its reference KL: ulorl/loss/weighted_kl.hpp), TRL's GRPO loss
// and Liger's plan of a fused GRPO call. Every function calls the C++ function of the same name on
// views of the tensors; every check is the library's (ulorl::error, raised before any output
// exists). No formula is restated here.
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ulorl/adapters/torch.hpp>
#include <ulorl/advantage.hpp>
#include <ulorl/loss/aggregation.hpp>
#include <ulorl/loss/entropy.hpp>
#include <ulorl/loss/fields.hpp>
#include <ulorl/loss/kl.hpp>
#include <ulorl/loss/rollout_correction.hpp>
#include <ulorl/loss/token_selection.hpp>
#include <ulorl/loss/weighted_kl.hpp>
#include <ulorl/masking/off_policy.hpp>
#include <ulorl/presets.hpp>

#include "common.hpp"

namespace ulorl_py {

namespace {

using namespace pybind11::literals;
namespace th = ulorl::th;
namespace rc = ulorl::rollout_correction;
namespace P = ulorl::presets;
using opt_tensor = std::optional<at::Tensor>;
using opt = std::optional<double>;

using th::or_undefined;

// ---- rollout correction ----------------------------------------------------------------------------
py::dict rc_metrics_dict(const rc::metrics& m) {
  return py::dict(
      "tokens"_a = m.tokens, "rows"_a = m.rows, "weight_mean"_a = m.weight_mean,
      "effective_sample_size"_a = m.effective_sample_size, "batch_norm_factor"_a = m.batch_norm_factor,
      "unit_weight_mean"_a = m.unit_weight_mean, "unit_weight_min"_a = m.unit_weight_min,
      "unit_weight_max"_a = m.unit_weight_max, "out_of_bounds_token_fraction"_a = m.out_of_bounds_token_fraction,
      "out_of_bounds_row_fraction"_a = m.out_of_bounds_row_fraction,
      "rejected_token_fraction"_a = m.rejected_token_fraction, "rejected_row_fraction"_a = m.rejected_row_fraction,
      "kl"_a = m.kl, "k3_kl"_a = m.k3_kl, "chi2_token"_a = m.chi2_token, "chi2_seq"_a = m.chi2_seq,
      "training_ppl"_a = m.training_ppl, "training_log_ppl"_a = m.training_log_ppl, "rollout_ppl"_a = m.rollout_ppl,
      "rollout_log_ppl"_a = m.rollout_log_ppl, "log_ppl_diff"_a = m.log_ppl_diff,
      "log_ppl_abs_diff"_a = m.log_ppl_abs_diff, "log_ppl_diff_max"_a = m.log_ppl_diff_max,
      "log_ppl_diff_min"_a = m.log_ppl_diff_min, "ppl_ratio"_a = m.ppl_ratio,
      "abs_log_ratio_mean"_a = m.abs_log_ratio_mean, "abs_log_ratio_max"_a = m.abs_log_ratio_max);
}

py::tuple rollout_correction_op(const at::Tensor& old_log_prob, const at::Tensor& rollout_log_prob,
                                const opt_tensor& mask, const rc::config& cfg, const opt_tensor& offsets) {
  th::rollout_correction_output r;
  {
    const py::gil_scoped_release nogil;
    r = th::rollout_correction(old_log_prob, rollout_log_prob, or_undefined(mask), cfg, or_undefined(offsets));
  }
  return py::make_tuple(r.weights, r.keep, r.metrics);
}

//! A verl threshold option: None, a number or a string ("u", "l_u"); a boolean is rejected.
enum class threshold_kind { none, number, text };
threshold_kind kind_of(std::string_view fn, std::string_view arg, const py::object& v) {
  if (v.is_none()) return threshold_kind::none;
  if (py::isinstance<py::bool_>(v))
    ulorl::detail::fail(fn, arg, "a boolean is neither a number nor a threshold string");
  if (py::isinstance<py::str>(v)) return threshold_kind::text;
  if (py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v)) return threshold_kind::number;
  ulorl::detail::fail(fn, arg, "must be a number, a string or None");
}

void bind_rollout_correction(py::module_& m) {
  py::class_<rc::config>(
      m, "RolloutCorrectionConfig",
      "A validated rollout-correction configuration (ulorl::rollout_correction::config): importance "
      "weights, rejection-sampling chain, diagnostics. Build it with ulorl.rollout_correction_config "
      "or a framework preset (ulorl.presets.<fw>.rollout_correction_config).")
      .def_property_readonly(
          "importance_weights", [](const rc::config& c) { return c.importance.level != rc::is_level::none; },
          "Whether the configuration computes importance weights (level is not 'none').")
      .def_property_readonly("rejection_sampling", [](const rc::config& c) { return !c.rejection.chain.empty(); })
      .def_property_readonly("batch_normalize", [](const rc::config& c) { return c.importance.batch_normalize; })
      .def_property_readonly(
          "encoded", [](const rc::config& c) { return ulorl::encode_fields(c); },
          "The configuration as the `float[] config` of torch.ops.ulorl.rollout_correction (ulorl::encode_fields).");

  py::class_<rc::metrics>(m, "RolloutCorrectionMetrics", "The diagnostics of one rollout-correction call.")
      .def("as_dict", &rc_metrics_dict);

  py::class_<rc::statistics>(m, "RolloutCorrectionStatistics",
                             "The sums a rollout correction's metrics are computed from (ulorl::rollout_correction::"
                             "statistics): policy_loss with config.rollout returns them per micro-batch; add them "
                             "(+) over micro-batches and finalize them with rollout_correction_finalize.")
      .def(py::init<>())
      .def_readonly("rows", &rc::statistics::rows)
      .def_readonly("tokens", &rc::statistics::tokens)
      .def_readonly("rejected_tokens", &rc::statistics::rejected_tokens)
      .def("__add__", [](const rc::statistics& a, const rc::statistics& b) { return a + b; });
  m.def(
      "rollout_correction_finalize",
      [](const rc::statistics& s, const rc::config& c) { return rc_metrics_dict(rc::finalize(s, c)); }, "statistics"_a,
      "config"_a,
      "The metrics of summed statistics (the dict rollout_correction returns), with the batch-normalisation divisor "
      "'batch_norm_factor'.");

  m.def(
      "_rollout_correction_config",
      [](const std::string& level, const std::string& weighting, double lower, double upper, double log_ratio_clamp,
         const std::string& overflow, const std::string& masked, const std::string& empty_rows, bool batch_normalize,
         const std::vector<std::tuple<std::string, std::string, double, double>>& rejection,
         double rejection_log_ratio_clamp, double diagnostic_log_ratio_clamp, bool reject_empty_batch,
         bool require_effective_sample_size) {
        rc::config c;
        c.importance.level = rc::is_level_from_name(level, "level");
        c.importance.weighting = rc::is_weighting_from_name(weighting, "weighting");
        c.importance.lower = lower, c.importance.upper = upper, c.importance.log_ratio_clamp = log_ratio_clamp;
        c.importance.overflow = rc::ratio_overflow_from_name(overflow, "overflow");
        c.importance.masked = rc::masked_positions_from_name(masked, "masked");
        c.importance.empty_rows = rc::empty_row_gate_from_name(empty_rows, "empty_rows");
        c.importance.batch_normalize = batch_normalize;
        for (const auto& [statistic, estimator, lo, hi] : rejection)
          c.rejection.chain.push_back({.statistic = rc::rs_statistic_from_name(statistic, "rejection"),
                                       .estimator = rc::rs_estimator_from_name(estimator, "rejection"),
                                       .lower = lo,
                                       .upper = hi});
        c.rejection.log_ratio_clamp = rejection_log_ratio_clamp;
        c.diagnostic_log_ratio_clamp = diagnostic_log_ratio_clamp;
        c.reject_empty_batch = reject_empty_batch, c.require_effective_sample_size = require_effective_sample_size;
        rc::validate("rollout_correction_config", c);
        return c;
      },
      "level"_a, "weighting"_a, "lower"_a, "upper"_a, "log_ratio_clamp"_a, "overflow"_a, "masked"_a, "empty_rows"_a,
      "batch_normalize"_a, "rejection"_a, "rejection_log_ratio_clamp"_a, "diagnostic_log_ratio_clamp"_a,
      "reject_empty_batch"_a, "require_effective_sample_size"_a);

  m.def("_rollout_correction", &rollout_correction_op, "old_log_prob"_a, "rollout_log_prob"_a, "mask"_a, "config"_a,
        "offsets"_a = py::none());

  m.def(
      "_verl_rollout_correction_config",
      [](const std::optional<std::string>& rollout_is, const py::object& rollout_is_threshold, bool batch_normalize,
         const std::optional<std::string>& rollout_rs, const py::object& rollout_rs_threshold) {
        constexpr std::string_view fn = "presets::verl::rollout_correction";
        P::verl::rollout_correction_options o;
        if (rollout_is) o.rollout_is = rc::is_level_from_name(*rollout_is, "rollout_is");
        switch (kind_of(fn, "rollout_is_threshold", rollout_is_threshold)) {
          case threshold_kind::none:
            o.rollout_is_threshold = std::nullopt;
            break;
          case threshold_kind::text:
            o.rollout_is_threshold = P::verl::parse_rollout_is_threshold(rollout_is_threshold.cast<std::string>());
            break;
          case threshold_kind::number:
            o.rollout_is_threshold = P::verl::is_threshold{.upper = rollout_is_threshold.cast<double>()};
            break;
        }
        o.rollout_is_batch_normalize = batch_normalize;
        if (rollout_rs) {
          switch (kind_of(fn, "rollout_rs_threshold", rollout_rs_threshold)) {
            case threshold_kind::none:
              o.rollout_rs = P::verl::parse_rollout_rs(*rollout_rs, std::nullopt);
              break;
            case threshold_kind::text: {
              const std::string text = rollout_rs_threshold.cast<std::string>();
              o.rollout_rs = P::verl::parse_rollout_rs(*rollout_rs, std::optional<std::string_view>(text));
              break;
            }
            case threshold_kind::number:
              o.rollout_rs = P::verl::parse_rollout_rs(*rollout_rs, rollout_rs_threshold.cast<double>());
              break;
          }
        }
        return P::verl::rollout_correction(o);
      },
      "rollout_is"_a, "rollout_is_threshold"_a, "rollout_is_batch_normalize"_a, "rollout_rs"_a,
      "rollout_rs_threshold"_a);

  m.def(
      "_trl_rollout_correction_config",
      [](const std::string& mode, opt clip_min, opt clip_max) {
        return P::trl::rollout_correction(
            {.vllm_importance_sampling_mode = P::trl::importance_sampling_mode_from_name(mode),
             .vllm_importance_sampling_clip_min = clip_min,
             .vllm_importance_sampling_clip_max = clip_max});
      },
      "vllm_importance_sampling_mode"_a, "vllm_importance_sampling_clip_min"_a, "vllm_importance_sampling_clip_max"_a);

  m.def(
      "_openrlhf_rollout_correction_config",
      [](const std::string& type, const std::vector<double>& threshold) {
        constexpr std::string_view fn = "presets::openrlhf::rollout_correction";
        if (threshold.size() != 2)
          ulorl::detail::fail_value(fn, "vllm_is_truncated_threshold", threshold.size(), "must hold [lo, hi]");
        return P::openrlhf::rollout_correction(
            {.vllm_is_correction_type = rc::is_weighting_from_name(type, "vllm_is_correction_type"),
             .vllm_is_truncated_threshold = {threshold[0], threshold[1]}});
      },
      "vllm_is_correction_type"_a, "vllm_is_truncated_threshold"_a);

  const auto nemo_options = [](const std::optional<std::string>& type, opt ratio, opt ratio_min, bool sequence_level) {
    P::nemo_rl::rollout_correction_options o;
    if (type)
      o.truncated_importance_sampling_type = rc::is_weighting_from_name(*type, "truncated_importance_sampling_type");
    o.truncated_importance_sampling_ratio = ratio, o.truncated_importance_sampling_ratio_min = ratio_min;
    o.sequence_level_importance_ratios = sequence_level;
    return o;
  };
  m.def(
      "_nemo_rl_rollout_correction_config",
      [nemo_options](const std::optional<std::string>& type, opt ratio, opt ratio_min, bool sequence_level) {
        return P::nemo_rl::rollout_correction(nemo_options(type, ratio, ratio_min, sequence_level));
      },
      "truncated_importance_sampling_type"_a, "truncated_importance_sampling_ratio"_a,
      "truncated_importance_sampling_ratio_min"_a, "sequence_level_importance_ratios"_a);
  m.def(
      "_nemo_rl_rollout_correction_logged",
      [nemo_options](const rc::metrics& metrics, const std::optional<std::string>& type, bool sequence_level,
                     opt global_valid_toks, opt global_valid_seqs, opt num_valid_samples) {
        const auto o = nemo_options(type, std::nullopt, std::nullopt, sequence_level);
        const auto r = P::nemo_rl::rollout_correction_logged(
            metrics, o, {.global_valid_toks = global_valid_toks, .global_valid_seqs = global_valid_seqs},
            num_valid_samples);
        return py::dict("sampling_importance_ratio"_a = r.sampling_importance_ratio, "is_oob_ratio"_a = r.is_oob_ratio);
      },
      "metrics"_a, "truncated_importance_sampling_type"_a, "sequence_level_importance_ratios"_a, "global_valid_toks"_a,
      "global_valid_seqs"_a, "num_valid_samples"_a = py::none());
}

// ---- advantage estimators -----------------------------------------------------------------------------
//! The groups of a call: ids, a size, or (an error of the operator) both or neither.
th::group_spec groups_of(const opt_tensor& ids, std::optional<std::int64_t> group_size) {
  return {or_undefined(ids), group_size};
}

void bind_advantages(py::module_& m) {
  m.def(
      "_gpg_advantages",
      [](const at::Tensor& scores, const opt_tensor& group_ids, std::optional<std::int64_t> group_size, double f_norm) {
        return th::gpg_advantages(scores, groups_of(group_ids, group_size), {.f_norm = f_norm});
      },
      "scores"_a, "group_ids"_a, "group_size"_a, "f_norm"_a);

  m.def(
      "_dapo_overlong_penalties",
      [](const at::Tensor& lengths, double max_length, double buffer_length, double penalty_factor) {
        return th::dapo_overlong_penalties(
            lengths, {.max_length = max_length, .buffer_length = buffer_length, .penalty_factor = penalty_factor});
      },
      "lengths"_a, "max_length"_a, "buffer_length"_a, "penalty_factor"_a);
  m.def(
      "_soft_overlong_penalties",
      [](const at::Tensor& lengths, double max_length, double cache_length) {
        return th::soft_overlong_penalties(lengths, {.max_length = max_length, .cache_length = cache_length});
      },
      "lengths"_a, "max_length"_a, "cache_length"_a);

  m.def(
      "_opo_advantages",
      [](const at::Tensor& scores, const at::Tensor& mask, const opt_tensor& group_ids,
         std::optional<std::int64_t> group_size, const opt_tensor& offsets) {
        return th::opo_advantages(scores, mask, groups_of(group_ids, group_size), or_undefined(offsets));
      },
      "scores"_a, "mask"_a, "group_ids"_a, "group_size"_a, "offsets"_a = py::none());

  m.def(
      "_reinforce_plus_plus_advantages",
      [](const at::Tensor& token_rewards, const opt_tensor& mask, double gamma, const opt_tensor& offsets,
         const std::string& scan) {
        const auto [adv, ret] =
            th::reinforce_plus_plus_advantages(token_rewards, or_undefined(mask), gamma, scan, or_undefined(offsets));
        return py::make_tuple(adv, ret);
      },
      "token_level_rewards"_a, "mask"_a, "gamma"_a, "offsets"_a = py::none(), "scan"_a = "reset_after_eos");

  m.def(
      "_gae_advantages",
      [](const at::Tensor& token_rewards, const at::Tensor& values, const opt_tensor& mask, double gamma, double lam,
         const opt_tensor& offsets) {
        const auto [adv, ret] = th::gae_advantages(token_rewards, values, or_undefined(mask),
                                                   {.gamma = gamma, .lambda = lam}, or_undefined(offsets));
        return py::make_tuple(adv, ret);
      },
      "token_level_rewards"_a, "values"_a, "mask"_a, "gamma"_a, "lam"_a, "offsets"_a = py::none());

  m.def(
      "_remax_advantages",
      [](const at::Tensor& token_rewards, const at::Tensor& reward_baselines, const opt_tensor& mask,
         const opt_tensor& offsets) {
        const auto [adv, ret] =
            th::remax_advantages(token_rewards, reward_baselines, or_undefined(mask), or_undefined(offsets));
        return py::make_tuple(adv, ret);
      },
      "token_level_rewards"_a, "reward_baselines"_a, "mask"_a, "offsets"_a = py::none());

  m.def(
      "_pass_at_k_advantages",
      [](const at::Tensor& scores, const opt_tensor& group_ids, std::optional<std::int64_t> group_size, double epsilon,
         bool scale_by_std) {
        return th::pass_at_k_advantages(scores, groups_of(group_ids, group_size),
                                        {.eps = epsilon, .scale_by_std = scale_by_std});
      },
      "scores"_a, "group_ids"_a, "group_size"_a, "epsilon"_a, "scale_by_std"_a);

  m.def(
      "_reinforce_plus_plus_baseline_advantages",
      [](const at::Tensor& scores, const opt_tensor& group_ids, std::optional<std::int64_t> group_size,
         const at::Tensor& mask, const std::string& preset, bool minus_baseline, const opt_tensor& offsets) {
        constexpr std::string_view fn = "reinforce_plus_plus_baseline_advantages";
        enum class which { verl, nemo_rl };
        const which w = parse_name<which>(fn, "preset", preset, {{"verl", which::verl}, {"nemo_rl", which::nemo_rl}});
        const ulorl::reinforce_plus_plus_baseline_config cfg =
            w == which::verl ? ulorl::reinforce_plus_plus_baseline_config{}
                             : P::nemo_rl::reinforce_plus_plus_advantage({.minus_baseline = minus_baseline});
        return th::reinforce_plus_plus_baseline_advantages(scores, groups_of(group_ids, group_size), mask, cfg,
                                                           or_undefined(offsets));
      },
      "scores"_a, "group_ids"_a, "group_size"_a, "mask"_a, "preset"_a, "minus_baseline"_a, "offsets"_a = py::none());

  m.def(
      "_multi_reward_advantages",
      [](const at::Tensor& components, const std::vector<double>& weights, const opt_tensor& group_ids,
         std::optional<std::int64_t> group_size, const at::Tensor& mask, const std::string& preset, double epsilon,
         bool norm_adv_by_std, bool leave_one_out, bool normalize, const std::string& scale_rewards,
         const std::string& aggregation, const opt_tensor& offsets) {
        constexpr std::string_view fn = "multi_reward_advantages";
        enum class which { verl, nemo_rl, trl };
        const which w = parse_name<which>(fn, "preset", preset,
                                          {{"verl", which::verl}, {"nemo_rl", which::nemo_rl}, {"trl", which::trl}});
        using A = P::trl::multi_objective_aggregation;
        const ulorl::multi_reward_config cfg =
            w == which::verl ? P::verl::gdpo_advantage({.epsilon = epsilon, .norm_adv_by_std_in_grpo = norm_adv_by_std})
            : w == which::nemo_rl
                ? P::nemo_rl::gdpo_advantage(
                      {.use_leave_one_out_baseline = leave_one_out, .normalize_rewards = normalize})
                : P::trl::multi_reward_advantage(
                      {.scale_rewards = trl_scale_rewards_of(fn, scale_rewards),
                       .multi_objective_aggregation = parse_name<A>(fn, "multi_objective_aggregation", aggregation,
                                                                    {{"sum_then_normalize", A::sum_then_normalize},
                                                                     {"normalize_then_sum", A::normalize_then_sum}})});
        return th::multi_reward_advantages(components, std::span<const double>(weights),
                                           groups_of(group_ids, group_size), mask, cfg, or_undefined(offsets));
      },
      "reward_components"_a, "reward_weights"_a, "group_ids"_a, "group_size"_a, "mask"_a, "preset"_a, "epsilon"_a,
      "norm_adv_by_std"_a, "use_leave_one_out_baseline"_a, "normalize_rewards"_a, "scale_rewards"_a,
      "multi_objective_aggregation"_a, "offsets"_a = py::none());

  m.def(
      "_optimal_token_baseline_advantages",
      [](const at::Tensor& token_rewards, const opt_tensor& mask, const at::Tensor& group_ids,
         const opt_tensor& old_log_prob, const opt_tensor& sum_pi_squared, const opt_tensor& rollout_is_weights,
         bool handle_zero_tail, double epsilon, const std::string& estimator, const opt_tensor& offsets) {
        constexpr std::string_view fn = "optimal_token_baseline_advantages";
        enum class which { position, valid_token };
        const which w = parse_name<which>(
            fn, "estimator", estimator,
            {{"optimal_token_baseline", which::position}, {"tir_optimal_token_baseline", which::valid_token}});
        const P::verl::optimal_token_baseline_options o{.handle_zero_tail = handle_zero_tail, .epsilon = epsilon};
        const auto cfg = w == which::valid_token ? P::verl::tir_optimal_token_baseline_advantage(o)
                                                 : P::verl::optimal_token_baseline_advantage(o);
        const auto [adv, ret] = th::optimal_token_baseline_advantages(
            token_rewards, or_undefined(mask), group_ids,
            {or_undefined(old_log_prob), or_undefined(sum_pi_squared), or_undefined(rollout_is_weights)}, cfg,
            or_undefined(offsets));
        return py::make_tuple(adv, ret);
      },
      "token_level_rewards"_a, "mask"_a, "group_ids"_a, "old_log_prob"_a, "sum_pi_squared"_a, "rollout_is_weights"_a,
      "handle_zero_tail"_a, "epsilon"_a, "estimator"_a, "offsets"_a = py::none());
}

// ---- aggregation, KL penalty, off-policy mask ------------------------------------------------------------
void bind_terms(py::module_& m) {
  m.def(
      "_verl_normalizer",
      [](const std::string& loss_agg_mode, const ulorl::batch_counts& counts, double dp_size, opt batch_num_tokens,
         opt global_batch_size, opt loss_scale_factor, std::size_t padded_length) {
        return P::verl::normalizer(verl_normalizer_options(loss_agg_mode, dp_size, batch_num_tokens, global_batch_size,
                                                           loss_scale_factor, padded_length),
                                   counts);
      },
      "loss_agg_mode"_a, "counts"_a, "dp_size"_a, "batch_num_tokens"_a, "global_batch_size"_a, "loss_scale_factor"_a,
      "padded_length"_a);
  m.def(
      "_openrlhf_normalizer",
      [](bool token_level_loss, const ulorl::batch_counts& counts, double dp_size, opt batch_num_tokens,
         opt global_batch_size) {
        return P::openrlhf::normalizer({.token_level_loss = token_level_loss,
                                        .dp_size = dp_size,
                                        .batch_num_tokens = batch_num_tokens,
                                        .global_batch_size = global_batch_size},
                                       counts);
      },
      "token_level_loss"_a, "counts"_a, "dp_size"_a, "batch_num_tokens"_a, "global_batch_size"_a);

  // A preset's KL configuration by its estimator name (the only preset knowledge kl_penalty needs).
  const auto kl_config_of = [](const std::string& preset, const std::string& name, opt input_clamp, opt output_clamp) {
    constexpr std::string_view fn = "kl_penalty";
    enum class which { verl, openrlhf, nemo_rl };
    const which w = parse_name<which>(
        fn, "preset", preset, {{"verl", which::verl}, {"openrlhf", which::openrlhf}, {"nemo_rl", which::nemo_rl}});
    if (w != which::nemo_rl && (input_clamp || output_clamp))
      ulorl::detail::fail(fn, input_clamp ? "input_clamp" : "output_clamp",
                          "only the nemo_rl preset takes clamps (verl and OpenRLHF fix their own)");
    return w == which::verl       ? P::verl::kl(P::verl::kl_penalty_from_name(name))
           : w == which::openrlhf ? P::openrlhf::kl({.kl_estimator = P::openrlhf::kl_estimator_from_name(name)})
                                  : P::nemo_rl::kl({.reference_policy_kl_type = P::nemo_rl::kl_type_from_name(name),
                                                    .kl_input_clamp_value = input_clamp,
                                                    .kl_output_clamp_value = output_clamp});
  };
  m.def(
      "_kl_config",
      [kl_config_of](const std::string& preset, const std::string& name, opt input_clamp, opt output_clamp) {
        return ulorl::encode_fields(kl_config_of(preset, name, input_clamp, output_clamp));
      },
      "preset"_a, "name"_a, "input_clamp"_a, "output_clamp"_a,
      "The KL configuration of a preset's estimator name, as the `config` of torch.ops.ulorl.kl_penalty.");
  m.def(
      "_kl_penalty",
      [kl_config_of](const at::Tensor& log_prob, const at::Tensor& ref_log_prob, const std::string& preset,
                     const std::string& name, opt input_clamp, opt output_clamp, const opt_tensor& offsets) {
        return th::kl_penalty(log_prob, ref_log_prob, kl_config_of(preset, name, input_clamp, output_clamp),
                              or_undefined(offsets));
      },
      "log_prob"_a, "ref_log_prob"_a, "preset"_a, "name"_a, "input_clamp"_a, "output_clamp"_a, "offsets"_a = py::none(),
      "th::kl_penalty: the operator ulorl::kl_penalty called from C++ (its errors are ulorl.Error whatever torch's "
      "build).");
  m.def(
      "_agg_loss",
      [](const at::Tensor& loss_mat, const opt_tensor& mask, const ulorl::agg_normalizer& norm,
         const opt_tensor& offsets) { return th::agg_loss(loss_mat, or_undefined(mask), norm, or_undefined(offsets)); },
      "loss_mat"_a, "mask"_a, "normalizer"_a, "offsets"_a = py::none(),
      "th::agg_loss: the operator ulorl::agg_loss called from C++ (its errors are ulorl.Error whatever torch's "
      "build).");

  m.def(
      "_off_policy_mask",
      [](const at::Tensor& log_prob, const at::Tensor& old_log_prob, const at::Tensor& advantages,
         const opt_tensor& mask, const std::string& preset, double delta, const std::string& form,
         const opt_tensor& offsets) {
        constexpr std::string_view fn = "off_policy_mask";
        enum class which { trl, slime };
        const which w = parse_name<which>(fn, "preset", preset, {{"trl", which::trl}, {"slime", which::slime}});
        ulorl::off_policy_mask_config cfg =
            w == which::trl ? P::trl::off_policy_mask(delta) : P::slime::off_policy_mask(delta);
        using F = ulorl::off_policy_mask_form;
        cfg.form = parse_name<F>(fn, "form", form, {{"factor", F::factor}, {"loss_mask", F::loss_mask}});
        const auto r =
            th::off_policy_mask(log_prob, old_log_prob, advantages, or_undefined(mask), cfg, or_undefined(offsets));
        const auto& st = r.stats;
        return py::make_tuple(r.keep, r.seq_kl,
                              py::dict("rows"_a = st.rows, "tokens"_a = st.tokens,
                                       "off_policy_rows"_a = st.off_policy_rows, "dropped_rows"_a = st.dropped_rows,
                                       "dropped_tokens"_a = st.dropped_tokens, "opsm_clipfrac"_a = st.clipfrac));
      },
      "log_prob"_a, "old_log_prob"_a, "advantages"_a, "mask"_a, "preset"_a, "delta"_a, "form"_a,
      "offsets"_a = py::none());
}

// ---- verl's token selections, OpenRLHF's IS plan, NeMo-RL's, TRL's and Liger's loss pieces -----------------
// What a token selection counts, under verl's metric names (presets::verl::metrics reads them back).
py::dict stats_dict(const ulorl::token_selection_stats& s) {
  return py::dict("pg_clipfrac"_a = s.dropped_fraction, "pg_clipfrac_lower"_a = s.capped_fraction,
                  "ppo_kl"_a = s.mean_abs_log_ratio);
}

void bind_loss_passes(py::module_& m) {
  m.def(
      "_verl_dppo_weights",
      [](const std::string& loss_mode, double low, double high, double c, const at::Tensor& old_log_prob,
         const at::Tensor& log_prob, const at::Tensor& advantages, const opt_tensor& mask,
         const opt_tensor& rollout_is_weights, const opt_tensor& offsets) {
        const P::verl::objective_options o{.loss_mode = P::verl::loss_mode_from_name(loss_mode),
                                           .clip_ratio_low = low,
                                           .clip_ratio_high = high,
                                           .clip_ratio_c = c};
        const auto r = th::dppo_weights(old_log_prob, log_prob, advantages, or_undefined(mask),
                                        or_undefined(rollout_is_weights), P::verl::dppo(o), or_undefined(offsets));
        return py::make_tuple(r.out, stats_dict(r.stats));
      },
      "loss_mode"_a, "clip_ratio_low"_a, "clip_ratio_high"_a, "clip_ratio_c"_a, "old_log_prob"_a, "log_prob"_a,
      "advantages"_a, "mask"_a, "rollout_is_weights"_a, "offsets"_a = py::none());

  m.def(
      "_verl_kl_cov_selection",
      [](double kl_cov_ratio, double ppo_kl_coef, const at::Tensor& old_log_prob, const at::Tensor& log_prob,
         const at::Tensor& advantages, const opt_tensor& mask, const opt_tensor& rollout_is_weights,
         const opt_tensor& offsets) {
        const P::verl::objective_options o{
            .loss_mode = P::verl::loss_mode_kind::kl_cov, .kl_cov_ratio = kl_cov_ratio, .ppo_kl_coef = ppo_kl_coef};
        if (rollout_is_weights && (rollout_is_weights->sizes() != log_prob.sizes() ||
                                   rollout_is_weights->scalar_type() != log_prob.scalar_type()))
          ulorl::detail::fail("kl_cov_selection", "rollout_is_weights", "must have log_prob's shape and dtype");
        const auto r = th::kl_cov_selection(old_log_prob, log_prob, advantages, or_undefined(mask), P::verl::kl_cov(o),
                                            or_undefined(offsets));
        // The selected tokens take the objective with the |x| penalty (weights w sel), the others
        // the objective without it (weights w (1 - sel)), under one normaliser.
        at::Tensor w_sel = r.out, w_rest = at::ones_like(r.out) - r.out;
        if (rollout_is_weights) w_sel = w_sel * *rollout_is_weights, w_rest = w_rest * *rollout_is_weights;
        return py::make_tuple(w_sel, w_rest, stats_dict(r.stats));
      },
      "kl_cov_ratio"_a, "ppo_kl_coef"_a, "old_log_prob"_a, "log_prob"_a, "advantages"_a, "mask"_a,
      "rollout_is_weights"_a, "offsets"_a = py::none());

  m.def(
      "_verl_clip_cov_weights",
      [](double low, double high, double clip_cov_ratio, double clip_cov_lb, double clip_cov_ub,
         const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& advantages,
         const opt_tensor& mask, const at::Tensor& selection, const opt_tensor& rollout_is_weights,
         const opt_tensor& offsets) {
        const P::verl::objective_options o{.loss_mode = P::verl::loss_mode_kind::clip_cov,
                                           .clip_ratio_low = low,
                                           .clip_ratio_high = high,
                                           .clip_cov_ratio = clip_cov_ratio,
                                           .clip_cov_lb = clip_cov_lb,
                                           .clip_cov_ub = clip_cov_ub};
        const auto r =
            th::clip_cov_weights(old_log_prob, log_prob, advantages, or_undefined(mask), selection,
                                 or_undefined(rollout_is_weights), P::verl::clip_cov(o), or_undefined(offsets));
        return py::make_tuple(r.out, stats_dict(r.stats));
      },
      "clip_ratio_low"_a, "clip_ratio_high"_a, "clip_cov_ratio"_a, "clip_cov_lb"_a, "clip_cov_ub"_a, "old_log_prob"_a,
      "log_prob"_a, "advantages"_a, "mask"_a, "clip_cov_selection"_a, "rollout_is_weights"_a, "offsets"_a = py::none());

  m.def(
      "_openrlhf_vllm_is_plan",
      [](const std::string& policy_loss_type, bool enable) {
        const auto p = P::openrlhf::vllm_is_correction(
            {.policy_loss_type = P::openrlhf::policy_loss_type_from_name(policy_loss_type),
             .enable_vllm_is_correction = enable});
        return py::dict("weights"_a = p.weights, "ratio_against_rollout"_a = p.ratio_against_rollout);
      },
      "policy_loss_type"_a, "enable_vllm_is_correction"_a);

  // NeMo-RL ClippedPGLossFn: its options (validated), the objective / normaliser, the IS weights'
  // configuration, its reference-KL term (value and gradient) and its logged ratios.
  using O = P::nemo_rl::clipped_pg_loss_options;
  py::class_<O> nemo_options(m, "NemoRLClippedPGLossOptions",
                             "NeMo-RL ClippedPGLossFn options (presets::nemo_rl::clipped_pg_loss_options); a "
                             "default-made one holds the defaults.");
  nemo_options.def(py::init<>());
  def_fields(nemo_options, "presets::nemo_rl::clipped_pg_loss", P::nemo_rl::truncated_importance_sampling_type_names,
             P::nemo_rl::reference_policy_kl_type_names);
  nemo_options.def_property_readonly(
      "encoded", [](const O& o) { return ulorl::encode_fields(o); },
      "The float[] options of torch.ops.ulorl.nemo_rl_logged_ratios (ulorl::encode_fields).");
  m.def(
      "_nemo_rl_validate", [](const O& o) { P::nemo_rl::validate(o); }, "options"_a);
  m.def(
      "_nemo_rl_positive_example_nll",
      [](const O& o, double positive_tokens) { return P::nemo_rl::positive_example_nll(o, positive_tokens); },
      "options"_a, "positive_tokens"_a);
  m.def(
      "_nemo_rl_loss_config",
      [](const O& o, const ulorl::batch_counts& counts, opt global_valid_toks, opt global_valid_seqs) {
        ulorl::policy_loss_config cfg;
        cfg.objective = P::nemo_rl::objective(o);
        cfg.normalizer = P::nemo_rl::normalizer(
            o, {.global_valid_toks = global_valid_toks, .global_valid_seqs = global_valid_seqs}, counts);
        return cfg;
      },
      "options"_a, "counts"_a, "global_valid_toks"_a, "global_valid_seqs"_a);
  m.def(
      "_nemo_rl_importance_config", [](const O& o) { return P::nemo_rl::rollout_correction(o); }, "options"_a);
  m.def(
      "_nemo_rl_reference_policy_kl",
      [](const O& o, const at::Tensor& log_prob, const at::Tensor& ref_log_prob, const opt_tensor& rollout_log_prob,
         const opt_tensor& mask, const ulorl::agg_normalizer& norm, const opt_tensor& offsets) {
        namespace D = th::ops::detail;
        th::ops::register_ops();
        // The operator's forward primitive: the term (in log_prob's dtype) and its gradient.
        const auto [loss, grad] =
            D::op<D::weighted_kl_loss_forward_sig>("ulorl::_weighted_kl_loss_forward")
                .call(log_prob, ref_log_prob, D::optional(or_undefined(rollout_log_prob)),
                      D::optional(or_undefined(mask)), D::optional(or_undefined(offsets)),
                      ulorl::encode_fields(P::nemo_rl::reference_policy_kl(o)), ulorl::encode_fields(norm));
        const double kl = loss.item<double>();
        // NeMo-RL logs the penalty without its coefficient (kl_penalty).
        const double unscaled = kl == 0.0 ? 0.0 : kl / o.reference_policy_kl_penalty;
        return py::make_tuple(kl, unscaled, grad);
      },
      "options"_a, "log_prob"_a, "ref_log_prob"_a, "rollout_log_prob"_a, "mask"_a, "normalizer"_a,
      "offsets"_a = py::none());
  m.def(
      "_nemo_rl_logged_ratios",
      [](const O& o, const at::Tensor& log_prob, const at::Tensor& prev_log_prob, const opt_tensor& mask,
         opt global_valid_toks, const opt_tensor& offsets) {
        P::nemo_rl::ratio_metrics r;
        {
          const py::gil_scoped_release nogil;
          r = th::nemo_rl_logged_ratios(log_prob, prev_log_prob, or_undefined(mask), o, global_valid_toks,
                                        or_undefined(offsets));
        }
        py::dict d;
        visit_fields(r, [&](std::string_view name, double v) { d[py::str(std::string(name))] = v; });
        return d;
      },
      "options"_a, "log_prob"_a, "prev_log_prob"_a, "mask"_a, "global_valid_toks"_a, "offsets"_a = py::none());

  // TRL GRPOTrainer._compute_loss: presets::trl::grpo_loss (ulorl/presets/trl.hpp) through the
  // operator ulorl::trl_grpo_loss (th::trl_grpo_loss). Returns (loss, metrics): the 0-dim loss with
  // its gradient function, policy_loss's metric names and TRL's (clip_ratio/low_mean, ...,
  // cispo_clip_ratio, vespo_phi_seq_mean, entropy, kl) where TRL logs them.
  using TO = P::trl::grpo_loss_options;
  py::class_<TO> trl_options(m, "TRLGRPOLossOptions",
                             "TRL GRPOConfig's loss options (presets::trl::grpo_loss_options); a default-made one "
                             "holds GRPOConfig's defaults.");
  trl_options.def(py::init<>());
  def_fields(trl_options, "presets::trl::grpo_loss", P::trl::loss_type_names, P::trl::importance_sampling_level_names);
  trl_options.def_property_readonly(
      "encoded", [](const TO& o) { return ulorl::encode_fields(o); },
      "The float[] config of torch.ops.ulorl.trl_grpo_loss (ulorl::encode_fields).");
  m.def(
      "_trl_grpo_loss",
      [](const at::Tensor& per_token_logps, const at::Tensor& old_per_token_logps, const at::Tensor& advantages,
         const opt_tensor& completion_mask, const opt_tensor& ref_per_token_logps,
         const opt_tensor& sampling_per_token_logps, const opt_tensor& entropies,
         const opt_tensor& importance_sampling_ratio, const TO& o) {
        const th::trl_grpo_loss_tensors extra{or_undefined(completion_mask), or_undefined(ref_per_token_logps),
                                              or_undefined(sampling_per_token_logps), or_undefined(entropies),
                                              or_undefined(importance_sampling_ratio)};
        th::trl_grpo_loss_output out;
        {
          const py::gil_scoped_release nogil;
          out = th::trl_grpo_loss(per_token_logps, old_per_token_logps, advantages, o, extra);
        }
        const P::trl::grpo_loss_result& r = out.result;
        ulorl::policy_loss_result parts;
        parts.loss = r.loss, parts.pg_loss = r.pg_loss, parts.kl_loss = r.kl_loss, parts.entropy_loss = r.entropy_loss;
        parts.metrics = r.metrics;
        py::dict metrics = result_dict(parts);
        // TRL's logged metrics: the result's optional fields, by their table's names (present where TRL logs them).
        visit_fields(r, [&](std::string_view name, const auto& v) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(v)>, std::optional<double>>)
            if (v) metrics[py::str(std::string(name))] = *v;
        });
        return py::make_tuple(out.loss, metrics);
      },
      "per_token_logps"_a, "old_per_token_logps"_a, "advantages"_a, "completion_mask"_a, "ref_per_token_logps"_a,
      "sampling_per_token_logps"_a, "entropies"_a, "importance_sampling_ratio"_a, "options"_a);

  // Liger's LigerFusedLinearGRPOLoss: its options (validated) and the plan of a call
  // (presets::liger::fused_linear_grpo): the fused pass's configuration and the adjustments of its
  // inputs, or (luspo, vespo) the num_items_in_batch of TRL's loss.
  using LO = P::liger::fused_linear_grpo_options;
  py::class_<LO> liger_options(
      m, "LigerFusedLinearGRPOOptions",
      "Liger's LigerFusedLinearGRPOLoss options (presets::liger::fused_linear_grpo_options); a "
      "default-made one holds Liger's defaults.");
  liger_options.def(py::init<>())
      .def_property_readonly(
          "uses_num_items", [](const LO& o) { return P::liger::uses_num_items(o); },
          "Whether the loss type divides by num_items_in_batch (dapo, cispo, luspo, vespo).");
  def_fields(liger_options, "presets::liger::fused_linear_grpo", P::trl::loss_type_names,
             P::liger::importance_sampling_level_names);
  m.def(
      "_liger_validate", [](const LO& o) { P::liger::validate(o); }, "options"_a);
  m.def(
      "_liger_fused_linear_grpo",
      [](const LO& o, const ulorl::batch_counts& counts, opt num_items_in_batch, double world_size) {
        const auto p = P::liger::fused_linear_grpo(o, counts, num_items_in_batch, world_size);
        return py::dict("fused"_a = p.fused, "config"_a = p.config, "old_log_prob_shift"_a = p.old_log_prob_shift,
                        "weight_scale"_a = p.weight_scale, "kl_mean_scale"_a = p.kl_mean_scale,
                        "trl_options"_a = p.trl_options);
      },
      "options"_a, "counts"_a, "num_items_in_batch"_a, "world_size"_a);
}

// ---- logits statistics ----------------------------------------------------------------------------------
void bind_logits_statistics(py::module_& m) {
  m.def(
      "_logits_statistics",
      [](const at::Tensor& logits, const at::Tensor& labels, double temperature, bool check_values) {
        std::tuple<at::Tensor, at::Tensor, at::Tensor> r;
        {
          const py::gil_scoped_release nogil;
          r = th::logits_statistics_float64(logits, labels, {.temperature = temperature, .check_values = check_values});
        }
        return py::make_tuple(std::get<0>(r), std::get<1>(r), std::get<2>(r));
      },
      "logits"_a, "labels"_a, "temperature"_a, "check_values"_a);
}

}  // namespace

void bind_corrections(py::module_& m) {
  bind_rollout_correction(m);
  bind_advantages(m);
  bind_terms(m);
  bind_loss_passes(m);
  bind_logits_statistics(m);
}

}  // namespace ulorl_py
