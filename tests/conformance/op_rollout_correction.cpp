// Conformance op `rollout_correction` (golden README §4.9): presets verl, trl, openrlhf, nemo_rl —
// the frameworks' option names and strings to the typed ulorl::presets::<fw>::rollout_correction
// options (through the *_from_name parsers and verl's string parsers), then
// ulorl::rollout_correction::apply. No formula lives here.
#include <optional>
#include <string>

#include <ulorl/loss/rollout_correction.hpp>
#include <ulorl/presets.hpp>

#include "conformance/registry.hpp"

namespace {
using namespace conformance;
namespace rc = ulorl::rollout_correction;

struct batch {
  matrix old_lp, rollout_lp, mask;
};
batch read_batch(const json& in) {
  return {to_matrix(in.at("old_log_prob"), "old_log_prob"), to_matrix(in.at("rollout_log_prob"), "rollout_log_prob"),
          to_matrix(in.at("response_mask"), "response_mask")};
}

//! apply() on the padded batch: weights, keep-mask, metrics.
struct result {
  matrix weights, mask;
  rc::metrics m;
};
result run(const batch& b, const rc::config& cfg) {
  result r{b.old_lp, b.mask, {}};
  const rc::inputs<double, double> in{padded_view(b.old_lp), padded_view(b.rollout_lp), padded_view(b.mask)};
  r.m = rc::apply(in, rc::outputs<double, double>{padded_view(r.weights), padded_view(r.mask)}, cfg);
  return r;
}

std::optional<std::string> optional_string(const json& params, const char* name) {
  if (!has_param(params, name)) return std::nullopt;
  if (!params[name].is_string()) throw reject(std::string("param '") + name + "' must be a string or null");
  return params[name].get<std::string>();
}
//! A bound that may be null (absent); a missing key gives the framework's default.
std::optional<double> bound(const json& params, const char* name, std::optional<double> fallback) {
  if (!params.contains(name)) return fallback;
  return param_optional(params, name);
}

json verl(const json& params, const json& inputs) {
  ulorl::presets::verl::rollout_correction_options o;
  if (const auto level = optional_string(params, "rollout_is")) o.rollout_is = rc::is_level_from_name(*level, "rollout_is");
  if (!has_param(params, "rollout_is_threshold")) {
    o.rollout_is_threshold = std::nullopt;
  } else {
    const json& th = params["rollout_is_threshold"];
    if (th.is_boolean()) throw reject("rollout_is_threshold: a boolean is neither a number nor \"l_u\"");
    if (th.is_string()) o.rollout_is_threshold = ulorl::presets::verl::parse_rollout_is_threshold(th.get<std::string>());
    else o.rollout_is_threshold = ulorl::presets::verl::is_threshold{.upper = to_double(th)};
  }
  o.rollout_is_batch_normalize = param_bool(params, "rollout_is_batch_normalize", false);
  if (const auto rs = optional_string(params, "rollout_rs")) {
    if (!has_param(params, "rollout_rs_threshold")) {
      o.rollout_rs = ulorl::presets::verl::parse_rollout_rs(*rs, std::nullopt);
    } else {
      const json& th = params["rollout_rs_threshold"];
      if (th.is_boolean()) throw reject("rollout_rs_threshold: a boolean is not a threshold");
      if (th.is_string()) {
        const std::string text = th.get<std::string>();
        o.rollout_rs = ulorl::presets::verl::parse_rollout_rs(*rs, std::optional<std::string_view>(text));
      } else {
        o.rollout_rs = ulorl::presets::verl::parse_rollout_rs(*rs, to_double(th));
      }
    }
  }
  const auto cfg = ulorl::presets::verl::rollout_correction(o);
  const auto r = run(read_batch(inputs), cfg);
  const auto& m = r.m;
  json out{{"mask", from_matrix(r.mask)},
           {"rollout_rs_masked_fraction", m.rejected_token_fraction},
           {"rollout_rs_seq_masked_fraction", m.rejected_row_fraction},
           {"kl", m.kl},
           {"k3_kl", m.k3_kl},
           {"chi2_token", m.chi2_token},
           {"chi2_seq", m.chi2_seq},
           {"training_ppl", m.training_ppl},
           {"training_log_ppl", m.training_log_ppl},
           {"rollout_ppl", m.rollout_ppl},
           {"rollout_log_ppl", m.rollout_log_ppl},
           {"log_ppl_diff", m.log_ppl_diff},
           {"log_ppl_abs_diff", m.log_ppl_abs_diff},
           {"log_ppl_diff_max", m.log_ppl_diff_max},
           {"log_ppl_diff_min", m.log_ppl_diff_min},
           {"ppl_ratio", m.ppl_ratio}};
  if (cfg.importance.level != rc::is_level::none) {
    out["weights"] = from_matrix(r.weights);
    out["rollout_is_mean"] = m.weight_mean;
    out["rollout_is_eff_sample_size"] = m.effective_sample_size;
    if (cfg.importance.batch_normalize) out["rollout_is_batch_norm_factor"] = m.batch_norm_factor;
  }
  return out;
}

json trl(const json& params, const json& inputs) {
  namespace p = ulorl::presets::trl;
  p::rollout_correction_options o;
  o.vllm_importance_sampling_mode =
      p::importance_sampling_mode_from_name(param_string(params, "vllm_importance_sampling_mode", "sequence_mask"));
  o.vllm_importance_sampling_clip_min = bound(params, "vllm_importance_sampling_clip_min", std::nullopt);
  o.vllm_importance_sampling_clip_max = bound(params, "vllm_importance_sampling_clip_max", 3.0);
  const auto r = run(read_batch(inputs), p::rollout_correction(o));
  return json{{"weights", from_matrix(r.weights)},
              {"importance_sampling_ratio_min", r.m.unit_weight_min},
              {"importance_sampling_ratio_mean", r.m.unit_weight_mean},
              {"importance_sampling_ratio_max", r.m.unit_weight_max},
              {"sampling_logp_difference_mean", r.m.abs_log_ratio_mean},
              {"sampling_logp_difference_max", r.m.abs_log_ratio_max}};
}

json openrlhf(const json& params, const json& inputs) {
  namespace p = ulorl::presets::openrlhf;
  p::rollout_correction_options o;
  o.vllm_is_correction_type = rc::is_weighting_from_name(param_string(params, "vllm_is_correction_type", "tis"), "vllm_is_correction_type");
  if (has_param(params, "vllm_is_truncated_threshold")) {
    const auto th = to_vector(params["vllm_is_truncated_threshold"], "vllm_is_truncated_threshold");
    if (th.size() != 2) throw reject("vllm_is_truncated_threshold must hold [lo, hi]");
    o.vllm_is_truncated_threshold = {th[0], th[1]};
  }
  const auto r = run(read_batch(inputs), p::rollout_correction(o));
  return json{{"weights", from_matrix(r.weights)}, {"vllm_kl", r.m.kl}};
}

json nemo_rl(const json& params, const json& inputs) {
  namespace p = ulorl::presets::nemo_rl;
  p::rollout_correction_options o;
  if (const auto type = optional_string(params, "truncated_importance_sampling_type"))
    o.truncated_importance_sampling_type = rc::is_weighting_from_name(*type, "truncated_importance_sampling_type");
  o.truncated_importance_sampling_ratio = param_optional(params, "truncated_importance_sampling_ratio");
  o.truncated_importance_sampling_ratio_min = param_optional(params, "truncated_importance_sampling_ratio_min");
  o.sequence_level_importance_ratios = param_bool(params, "sequence_level_importance_ratios", false);
  const auto r = run(read_batch(inputs), p::rollout_correction(o));
  const auto logged = p::rollout_correction_logged(r.m, o,
                                                   {.global_valid_toks = param_optional(params, "global_valid_toks"),
                                                    .global_valid_seqs = param_optional(params, "global_valid_seqs")});
  json out{{"weights", from_matrix(r.weights)}, {"sampling_importance_ratio", logged.sampling_importance_ratio}};
  if (o.truncated_importance_sampling_type) out["is_oob_ratio"] = logged.is_oob_ratio;
  return out;
}

const registrar reg("rollout_correction", [](const std::string& preset, const json& params, const json& inputs) -> json {
  if (preset == "verl") return verl(params, inputs);
  if (preset == "trl") return trl(params, inputs);
  if (preset == "openrlhf") return openrlhf(params, inputs);
  if (preset == "nemo_rl") return nemo_rl(params, inputs);
  throw reject("rollout_correction: unknown preset '" + preset + "'");
});

}  // namespace
