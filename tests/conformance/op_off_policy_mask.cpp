// Conformance op `off_policy_mask` (golden README §4.10): presets trl (one advantage per row) and
// slime (per-token advantages, opsm_clipfrac) — JSON to ulorl::off_policy_mask in the `factor` form
// (the frameworks' mask tensor: 1 - drop at every position). `delta` is required.
#include <ulorl/masking/off_policy.hpp>
#include <ulorl/presets/slime.hpp>
#include <ulorl/presets/trl.hpp>

#include "conformance/registry.hpp"

namespace {
using conformance::json;

json run_off_policy_mask(const std::string& preset, const json& params, const json& inputs) {
  if (!conformance::has_param(params, "delta")) throw conformance::reject("off_policy_mask: argument 'delta': must be given");
  const double delta = conformance::param_double(params, "delta", 0.0);
  ulorl::off_policy_mask_config cfg;
  if (preset == "trl") cfg = ulorl::presets::trl::off_policy_mask(delta);
  else if (preset == "slime") cfg = ulorl::presets::slime::off_policy_mask(delta);
  else throw conformance::reject("off_policy_mask: unknown preset '" + preset + "'");
  cfg.form = ulorl::off_policy_mask_form::factor;

  const auto lp = conformance::to_matrix(inputs.at("log_prob"), "log_prob");
  const auto old = conformance::to_matrix(inputs.at("old_log_prob"), "old_log_prob");
  const auto mask = conformance::to_matrix(inputs.at("response_mask"), "response_mask");
  ulorl::off_policy_mask_inputs<double, double, double> in{.log_prob = conformance::padded_view(lp),
                                                           .old_log_prob = conformance::padded_view(old),
                                                           .mask = conformance::padded_view(mask)};
  conformance::matrix adv_tokens;
  std::vector<double> adv_rows;
  if (cfg.advantage == ulorl::off_policy_advantage_level::token) {
    adv_tokens = conformance::to_matrix(inputs.at("advantages"), "advantages");
    in.advantages = conformance::padded_view(adv_tokens);
  } else {
    adv_rows = conformance::to_vector(inputs.at("advantages"), "advantages");
    in.sequence_advantages = adv_rows;
  }
  conformance::matrix keep = lp;
  std::vector<double> seq_kl(lp.rows);
  const auto st = ulorl::off_policy_mask(in, conformance::padded_view(keep), std::span<double>(seq_kl), cfg);
  json out{{"mask", conformance::from_matrix(keep)}, {"seq_kl", conformance::from_vector(seq_kl)}};
  if (preset == "slime") out["opsm_clipfrac"] = st.clipfrac;
  return out;
}

const conformance::registrar reg("off_policy_mask", run_off_policy_mask);
}  // namespace
