// op kl_controller (golden README §4.7): a thin adapter from a case's JSON to ulorl::kl_controller.
// Presets verl and openrlhf implement the same controller; `values` is beta after each update.
#include <ulorl/control/kl_controller.hpp>

#include "conformance/registry.hpp"

namespace {

using conformance::json;

json run_kl_controller(const std::string& preset, const json& params, const json& inputs) {
  if (preset != "verl" && preset != "openrlhf") throw conformance::reject("kl_controller: unknown preset '" + preset + "'");
  const auto type = conformance::param_string(params, "type", "fixed");
  ulorl::kl_controller_config cfg;
  if (type == "adaptive")
    cfg.type = ulorl::kl_control_type::adaptive;
  else if (type == "fixed")
    cfg.type = ulorl::kl_control_type::fixed;
  else
    throw conformance::reject("kl_controller: unknown type '" + type + "'");
  cfg.init_coef = conformance::param_double(params, "kl_coef", cfg.init_coef);
  cfg.target_kl = conformance::param_double(params, "target_kl", cfg.target_kl);
  cfg.horizon = conformance::param_double(params, "horizon", cfg.horizon);

  const auto kl = conformance::to_vector(inputs.at("current_kl"), "current_kl");
  const auto n = conformance::to_ints(inputs.at("n_steps"), "n_steps");
  ulorl::require_same_size("kl_controller", "n_steps", n.size(), "current_kl", kl.size());

  ulorl::kl_controller ctl(cfg);
  std::vector<double> values;
  values.reserve(kl.size());
  for (std::size_t i = 0; i < kl.size(); ++i) values.push_back(ctl.update(kl[i], n[i]));
  return json{{"values", conformance::from_vector(values)}};
}

const conformance::registrar reg("kl_controller", run_kl_controller);

}  // namespace
