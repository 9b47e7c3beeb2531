// Conformance op `trl_grpo_loss` (golden README §4.5, TRL GRPOTrainer._compute_loss) — JSON to
// ulorl::presets::trl::grpo_loss (ulorl/presets/trl.hpp) and its result back to JSON.
// Absent params take grpo_loss_options' defaults (TRL's).
#include <optional>
#include <string>

#include <ulorl/presets/trl.hpp>

#include "conformance/registry.hpp"

namespace {
using conformance::json;
using conformance::matrix;
namespace P = ulorl::presets;

ulorl::token_view<const double> optional_view(const std::optional<matrix>& m) {
  return m ? conformance::padded_view(*m) : ulorl::token_view<const double>{};
}
matrix zeros_like(const matrix& like) {
  matrix m = like;
  for (auto& x : m.data) x = 0.0;
  return m;
}

const conformance::registrar reg("trl_grpo_loss", [](const std::string& preset, const json& params, const json& inputs) -> json {
  if (preset != "trl") throw conformance::reject("trl_grpo_loss: unknown preset '" + preset + "'");
  const auto lp = conformance::to_matrix(inputs.at("per_token_logps"), "per_token_logps");
  const auto old = conformance::to_matrix(inputs.at("old_per_token_logps"), "old_per_token_logps");
  const auto mask = conformance::to_matrix(inputs.at("completion_mask"), "completion_mask");
  const auto adv = conformance::to_vector(inputs.at("advantages"), "advantages");
  const auto ref = conformance::optional_matrix(inputs, "ref_per_token_logps");
  const auto sampling = conformance::optional_matrix(inputs, "sampling_per_token_logps");
  const auto entropies = conformance::optional_matrix(inputs, "entropies");
  const auto is_ratio = conformance::optional_matrix(inputs, "importance_sampling_ratio");

  const P::trl::grpo_loss_options d{};
  const auto num = [&](const char* name, double fallback) { return conformance::param_double(params, name, fallback); };
  const P::trl::grpo_loss_options o{
      .loss_type = P::trl::loss_type_from_name(conformance::param_string(params, "loss_type", "dapo")),
      .epsilon = num("epsilon", d.epsilon),
      .epsilon_high = conformance::param_optional(params, "epsilon_high"),
      .delta = conformance::param_optional(params, "delta"),
      .beta = num("beta", d.beta),
      .importance_sampling_level =
          P::trl::importance_sampling_level_from_name(conformance::param_string(params, "importance_sampling_level", "token")),
      .use_bias_correction_kl = conformance::param_bool(params, "use_bias_correction_kl", d.use_bias_correction_kl),
      .max_completion_length = num("max_completion_length", d.max_completion_length),
      .gradient_accumulation_steps = num("gradient_accumulation_steps", d.gradient_accumulation_steps),
      .num_items_in_batch = conformance::param_optional(params, "num_items_in_batch"),
      .num_processes = num("num_processes", d.num_processes),
      .sapo_temperature_pos = num("sapo_temperature_pos", d.sapo_temperature_pos),
      .sapo_temperature_neg = num("sapo_temperature_neg", d.sapo_temperature_neg),
      .vespo_k_pos = num("vespo_k_pos", d.vespo_k_pos),
      .vespo_lambda_pos = num("vespo_lambda_pos", d.vespo_lambda_pos),
      .vespo_k_neg = num("vespo_k_neg", d.vespo_k_neg),
      .vespo_lambda_neg = num("vespo_lambda_neg", d.vespo_lambda_neg),
      .off_policy_mask_threshold = conformance::param_optional(params, "off_policy_mask_threshold"),
      .top_entropy_quantile = num("top_entropy_quantile", d.top_entropy_quantile),
      .entropy_coef = num("entropy_coef", d.entropy_coef)};

  P::trl::grpo_loss_inputs<double> in{conformance::padded_view(lp), conformance::padded_view(old),
                                      conformance::padded_view(mask), adv};
  in.ref_per_token_logps = optional_view(ref);
  in.sampling_per_token_logps = optional_view(sampling);
  in.entropies = optional_view(entropies);
  in.importance_sampling_ratio = optional_view(is_ratio);
  matrix grad = zeros_like(lp), grad_entropies = zeros_like(lp);
  P::trl::grpo_loss_outputs<double> out{conformance::padded_view(grad)};
  if (o.entropy_coef != 0.0) out.grad_entropies = conformance::padded_view(grad_entropies);
  const auto r = P::trl::grpo_loss(in, out, o);

  json res{{"loss", r.loss}, {"grad_per_token_logps", conformance::from_matrix(grad)}};
  if (o.entropy_coef != 0.0) res["grad_entropies"] = conformance::from_matrix(grad_entropies);
  const auto put = [&](const char* name, const std::optional<double>& v) {
    if (v) res[name] = *v;
  };
  put("clip_ratio_low_mean", r.clip_ratio_low_mean);
  put("clip_ratio_high_mean", r.clip_ratio_high_mean);
  put("clip_ratio_region_mean", r.clip_ratio_region_mean);
  put("cispo_clip_ratio", r.cispo_clip_ratio);
  put("vespo_phi_seq_mean", r.vespo_phi_seq_mean);
  put("entropy_mean", r.entropy_mean);
  put("kl_mean", r.kl_mean);
  return res;
});
}  // namespace
