// op `logits_stats` (golden README section 4.6): verl's chosen-token log-prob and entropy from logits,
// and the gradient of sum(grad_log_prob * log_prob + grad_entropy * entropy) w.r.t. the raw logits.
// Thin adapter over ulorl::logits_forward / logits_backward on float64 logits. The value scan (`check_values`) makes
// the library reject NaN / +inf logits (the README rejects non-finite inputs); labels outside
// [0, V) and non-finite upstream gradients are rejected by the library's own validation.
#include <cstdint>
#include <span>
#include <vector>

#include <ulorl/logits.hpp>

#include "conformance/registry.hpp"

namespace {

using conformance::json;

json logits_stats(const std::string& /*preset*/, const json& params, const json& inputs) {
  const auto logits = conformance::to_matrix(inputs.at("logits"), "logits");
  const auto labels = conformance::to_ints(inputs.at("labels"), "labels");
  const auto g_lp = conformance::to_vector(inputs.at("grad_logprob"), "grad_logprob");
  const auto g_ent = conformance::to_vector(inputs.at("grad_entropy"), "grad_entropy");
  const ulorl::logits_config cfg{.temperature = conformance::param_double(params, "temperature", 1.0),
                                 .check_values = true};
  const std::size_t n = logits.rows, v = logits.cols;
  const ulorl::matrix_view<const double> x(logits.data.data(), n, v);
  std::vector<double> log_prob(n), entropy(n), lse(n);
  ulorl::logits_forward(x, std::span<const std::int64_t>(labels), ulorl::vector_view<double>(log_prob.data(), n),
                        ulorl::vector_view<double>(entropy.data(), n), ulorl::vector_view<double>(lse.data(), n), cfg);
  conformance::matrix grad;
  grad.rows = n;
  grad.cols = v;
  grad.data.resize(n * v);
  ulorl::logits_backward(x, std::span<const std::int64_t>(labels), ulorl::vector_view<const double>(lse.data(), n),
                         ulorl::vector_view<const double>(entropy.data(), n),
                         ulorl::vector_view<const double>(g_lp.data(), g_lp.size()),
                         ulorl::vector_view<const double>(g_ent.data(), g_ent.size()),
                         ulorl::matrix_view<double>(grad.data.data(), n, v), cfg);
  return json{{"logprob", conformance::from_vector(log_prob)},
              {"entropy", conformance::from_vector(entropy)},
              {"lse", conformance::from_vector(lse)},
              {"grad_logits", conformance::from_matrix(grad)}};
}

const conformance::registrar reg("logits_stats", logits_stats);

}  // namespace
