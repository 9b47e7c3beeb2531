// Conformance op `policy_loss` (golden README §4.3): presets verl (vanilla, gspo, cispo, geo_mean,
// sapo, gpg) and openrlhf (ppo, gspo, dual clip) — JSON to ulorl::policy_loss with the presets.
#include <optional>

#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/loss/presets.hpp>

#include "conformance/registry.hpp"

namespace {
using conformance::json;


const conformance::registrar reg("policy_loss", [](const std::string& preset, const json& params, const json& inputs) -> json {
  namespace P = ulorl::presets;
  const auto old = conformance::to_matrix(inputs.at("old_log_prob"), "old_log_prob");
  const auto lp = conformance::to_matrix(inputs.at("log_prob"), "log_prob");
  const auto adv = conformance::to_matrix(inputs.at("advantages"), "advantages");
  const auto mask = conformance::to_matrix(inputs.at("response_mask"), "response_mask");
  std::optional<conformance::matrix> weights;
  if (inputs.contains("rollout_is_weights") && !inputs["rollout_is_weights"].is_null())
    weights = conformance::to_matrix(inputs["rollout_is_weights"], "rollout_is_weights");

  ulorl::policy_loss_inputs<double, double> in{conformance::padded_view(lp), conformance::padded_view(old), conformance::padded_view(adv), conformance::padded_view(mask)};
  if (weights) in.weights = conformance::padded_view(*weights);
  ulorl::require_same_shape("policy_loss", "response_mask", in.mask, "log_prob", in.log_prob);
  const auto counts = ulorl::count_batch(in.mask);
  const double dp = conformance::param_double(params, "dp_size", 1.0);

  ulorl::policy_loss_config cfg;
  std::string mode;
  if (preset == "verl") {
    mode = conformance::param_string(params, "loss_mode", "vanilla");
    cfg.objective = P::verl::objective(mode, conformance::param_double(params, "clip_ratio_low", 0.2),
                                       conformance::param_double(params, "clip_ratio_high", 0.2),
                                       conformance::param_double(params, "clip_ratio_c", 3.0),
                                       conformance::param_double(params, "tau_pos", 1.0),
                                       conformance::param_double(params, "tau_neg", 1.05));
    const auto agg = P::verl::agg_mode_from_name(conformance::param_string(params, "loss_agg_mode", "token-mean"));
    cfg.normalizer = P::verl::policy_normalizer(mode, agg, counts, dp, conformance::param_optional(params, "batch_num_tokens"),
                                                conformance::param_optional(params, "global_batch_size"), conformance::param_optional(params, "loss_scale_factor"), lp.cols);
  } else if (preset == "openrlhf") {
    if (weights) throw conformance::reject("policy_loss: rollout_is_weights is a verl input");
    mode = conformance::param_string(params, "policy_loss_type", "ppo");
    cfg.objective = P::openrlhf::objective(mode, conformance::param_double(params, "clip_eps_low", 0.2),
                                           conformance::param_double(params, "clip_eps_high", 0.2), conformance::param_optional(params, "dual_clip"));
    if (counts.tokens == 0) throw conformance::reject("policy_loss: openrlhf metrics divide by N = 0 valid tokens");
    cfg.normalizer = P::openrlhf::policy_normalizer(mode, conformance::param_bool(params, "token_level_loss", true), counts, dp,
                                                    conformance::param_optional(params, "batch_num_tokens"),
                                                    conformance::param_optional(params, "global_batch_size"));
  } else {
    throw conformance::reject("policy_loss: unknown preset '" + preset + "'");
  }

  conformance::matrix grad = lp;
  const auto gv = ulorl::token_view<double>::padded(ulorl::matrix_view<double>(grad.data.data(), grad.rows, grad.cols));
  const auto res = ulorl::policy_loss(in, cfg, gv);
  json out{{"pg_loss", res.pg_loss}, {"grad_log_prob", conformance::from_matrix(grad)}};
  if (preset == "verl") {
    const auto m = P::verl::metrics(mode, res.metrics);
    out["pg_clipfrac"] = m.pg_clipfrac;
    out["ppo_kl"] = m.ppo_kl;
    out["pg_clipfrac_lower"] = m.pg_clipfrac_lower;
  } else {
    out["clip_ratio"] = res.metrics.clip_fraction();
    out["ppo_kl"] = res.metrics.approx_kl_k1();
  }
  return out;
});
}  // namespace
