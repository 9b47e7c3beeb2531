// Conformance op `entropy_controller` (golden README §4.11): preset trl (`use_adaptive_entropy`) —
// JSON to ulorl::entropy_controller with presets::trl::adaptive_entropy. For each optimizer step,
// `applied` is the coefficient of that step's loss (bonus(), before the update) and `values` the
// coefficient after folding the step's entropy in.
#include <ulorl/control/entropy_controller.hpp>
#include <ulorl/presets/trl.hpp>

#include "conformance/registry.hpp"

namespace {
using conformance::json;

json run_entropy_controller(const std::string& preset, const json& params, const json& inputs) {
  if (preset != "trl") throw conformance::reject("entropy_controller: unknown preset '" + preset + "'");
  const ulorl::presets::trl::adaptive_entropy_params d;
  const auto cfg = ulorl::presets::trl::adaptive_entropy(
      {.entropy_coef = conformance::param_double(params, "entropy_coef", d.entropy_coef),
       .entropy_target = conformance::param_double(params, "entropy_target", d.entropy_target),
       .entropy_coef_delta = conformance::param_double(params, "entropy_coef_delta", d.entropy_coef_delta),
       .entropy_coef_min = conformance::param_double(params, "entropy_coef_min", d.entropy_coef_min),
       .entropy_coef_max = conformance::param_double(params, "entropy_coef_max", d.entropy_coef_max)});
  const auto h = conformance::to_vector(inputs.at("entropy"), "entropy");
  ulorl::entropy_controller ctl(cfg);
  std::vector<double> values, applied;
  values.reserve(h.size());
  applied.reserve(h.size());
  for (double e : h) {
    applied.push_back(ctl.bonus());
    values.push_back(ctl.update(e));
  }
  return json{{"values", conformance::from_vector(values)}, {"applied", conformance::from_vector(applied)}};
}

const conformance::registrar reg("entropy_controller", run_entropy_controller);
}  // namespace
