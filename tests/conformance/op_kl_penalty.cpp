// Conformance op `kl_penalty` (golden README §4.4): presets verl, openrlhf, nemo_rl — JSON to
// ulorl::kl_penalty with the presets' estimator configurations.
#include <optional>

#include <ulorl/loss/kl.hpp>
#include <ulorl/presets/nemo_rl.hpp>
#include <ulorl/presets/openrlhf.hpp>
#include <ulorl/presets/verl.hpp>

#include "conformance/registry.hpp"

namespace {
using conformance::json;


const conformance::registrar reg("kl_penalty", [](const std::string& preset, const json& params, const json& inputs) -> json {
  const auto lp = conformance::to_matrix(inputs.at("logprob"), "logprob");
  const auto ref = conformance::to_matrix(inputs.at("ref_logprob"), "ref_logprob");
  ulorl::kl_config cfg;
  namespace P = ulorl::presets;
  if (preset == "verl") cfg = P::verl::kl(P::verl::kl_penalty_from_name(conformance::param_string(params, "kl_penalty", "kl")));
  else if (preset == "openrlhf")
    cfg = P::openrlhf::kl({.kl_estimator = P::openrlhf::kl_estimator_from_name(conformance::param_string(params, "kl_estimator", "k1"))});
  else if (preset == "nemo_rl")
    cfg = P::nemo_rl::kl({.reference_policy_kl_type = P::nemo_rl::kl_type_from_name(conformance::param_string(params, "kl_type", "k3")),
                          .kl_input_clamp_value = conformance::param_optional(params, "input_clamp_value"),
                          .kl_output_clamp_value = conformance::param_optional(params, "output_clamp_value")});
  else throw conformance::reject("kl_penalty: unknown preset '" + preset + "'");
  conformance::matrix kl = lp, grad = lp;
  auto cv = [](const conformance::matrix& m) {
    return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(m.data.data(), m.rows, m.cols));
  };
  auto mv = [](conformance::matrix& m) {
    return ulorl::token_view<double>::padded(ulorl::matrix_view<double>(m.data.data(), m.rows, m.cols));
  };
  ulorl::kl_penalty(cv(lp), cv(ref), mv(kl), mv(grad), cfg);
  return json{{"kl", conformance::from_matrix(kl)}, {"grad_logprob", conformance::from_matrix(grad)}};
});
}  // namespace
