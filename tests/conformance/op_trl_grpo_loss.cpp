// Conformance op `trl_grpo_loss` (golden README §4.5, TRL GRPOTrainer._compute_loss) — JSON to
// ulorl::policy_loss with the TRL preset. TRL's advantages are one per sequence: broadcast here.
#include <optional>

#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/loss/presets.hpp>

#include "conformance/registry.hpp"

namespace {
using conformance::json;


const conformance::registrar reg("trl_grpo_loss", [](const std::string& preset, const json& params, const json& inputs) -> json {
  namespace P = ulorl::presets;
  if (preset != "trl") throw conformance::reject("trl_grpo_loss: unknown preset '" + preset + "'");
  const auto lp = conformance::to_matrix(inputs.at("per_token_logps"), "per_token_logps");
  const auto old = conformance::to_matrix(inputs.at("old_per_token_logps"), "old_per_token_logps");
  const auto mask = conformance::to_matrix(inputs.at("completion_mask"), "completion_mask");
  const auto adv_b = conformance::to_vector(inputs.at("advantages"), "advantages");
  const double beta = conformance::param_double(params, "beta", 0.0);
  std::optional<conformance::matrix> ref;
  if (inputs.contains("ref_per_token_logps") && !inputs["ref_per_token_logps"].is_null())
    ref = conformance::to_matrix(inputs["ref_per_token_logps"], "ref_per_token_logps");

  ulorl::require_same_size("trl_grpo_loss", "advantages", adv_b.size(), "per_token_logps rows", lp.rows);
  conformance::matrix adv = lp;
  for (std::size_t b = 0; b < lp.rows; ++b)
    for (std::size_t t = 0; t < lp.cols; ++t) adv(b, t) = adv_b[b];

  ulorl::policy_loss_inputs<double, double> in{conformance::padded_view(lp), conformance::padded_view(old), conformance::padded_view(adv), conformance::padded_view(mask)};
  if (ref) in.ref_log_prob = conformance::padded_view(*ref);
  ulorl::require_same_shape("trl_grpo_loss", "completion_mask", in.mask, "per_token_logps", in.log_prob);
  const auto counts = ulorl::count_batch(in.mask);

  const auto level = conformance::param_string(params, "importance_sampling_level", "token");
  ulorl::policy_loss_config cfg;
  cfg.objective = P::trl::objective(conformance::param_double(params, "epsilon", 0.2), conformance::param_optional(params, "epsilon_high"),
                                    conformance::param_optional(params, "delta"), level);
  cfg.kl = P::trl::kl(conformance::param_bool(params, "use_bias_correction_kl", false));
  cfg.kl_coef = beta;
  cfg.normalizer = P::trl::normalizer(conformance::param_string(params, "loss_type", "dapo"), counts,
                                      conformance::param_double(params, "max_completion_length", 0.0),
                                      conformance::param_double(params, "gradient_accumulation_steps", 1.0),
                                      conformance::param_optional(params, "num_items_in_batch"), conformance::param_double(params, "num_processes", 1.0));

  conformance::matrix grad = lp;
  const auto gv = ulorl::token_view<double>::padded(ulorl::matrix_view<double>(grad.data.data(), grad.rows, grad.cols));
  const auto res = ulorl::policy_loss(in, cfg, gv);
  const auto clip = P::trl::clip_ratios(res.metrics, level);
  json out{{"loss", res.loss},
           {"grad_per_token_logps", conformance::from_matrix(grad)},
           {"clip_ratio_low_mean", clip.low_mean},
           {"clip_ratio_high_mean", clip.high_mean},
           {"clip_ratio_region_mean", clip.region_mean}};
  if (beta != 0.0) out["kl_mean"] = res.metrics.kl_mean();
  return out;
});
}  // namespace
