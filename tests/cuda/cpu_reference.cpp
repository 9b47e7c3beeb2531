// cpu_reference.cpp — see cpu_reference.hpp.
#include "cpu_reference.hpp"

#include <span>
#include <vector>

#include <ulorl/logits.hpp>
#include <ulorl/logits/fused_loss.hpp>
#include <ulorl/loss/policy_loss.hpp>

#include "cpu_views.hpp"

namespace ulorl_cuda_test {

void cpu_logits(const float* logits, std::size_t rows, std::size_t cols, const std::int64_t* labels, float temperature,
                const double* grad_log_prob, const double* grad_entropy, double* log_prob, double* entropy, double* lse,
                float* grad_logits) {
  const ulorl::logits_config cfg{.temperature = temperature};
  const ulorl::matrix_view<const float> x(logits, rows, cols);
  const std::span<const std::int64_t> y(labels, rows);
  ulorl::logits_forward(x, y, ulorl::vector_view<double>(log_prob, rows), ulorl::vector_view<double>(entropy, rows),
                        ulorl::vector_view<double>(lse, rows), cfg);
  ulorl::logits_backward(x, y, ulorl::vector_view<const double>(lse, rows), ulorl::vector_view<const double>(entropy, rows),
                         ulorl::vector_view<const double>(grad_log_prob, rows),
                         ulorl::vector_view<const double>(grad_entropy, rows), ulorl::matrix_view<float>(grad_logits, rows, cols),
                         cfg);
}

ulorl::policy_loss_result cpu_policy_loss(const loss_case& c, const ulorl::policy_loss_config& cfg, float* grad_log_prob,
                                          float* grad_entropy) {
  return ulorl::policy_loss(loss_inputs(c), view(c, grad_log_prob), view(c, grad_entropy), cfg);
}

ulorl::policy_loss_result cpu_loss_from_logits(const float* logits, std::int64_t vocab, const std::int64_t* labels,
                                               const loss_case& c, const ulorl::policy_loss_config& cfg, float temperature,
                                               float* grad_logits) {
  const std::size_t n = c.offsets != nullptr ? static_cast<std::size_t>(c.cols) : static_cast<std::size_t>(c.rows * c.cols);
  std::vector<float> lp(n), ent(n), glp(n), gent(n), lse(n);
  ulorl::logits_loss_buffers<float> buf{view(c, lp.data()), view(c, ent.data()), view(c, glp.data()), view(c, gent.data()),
                                        ulorl::vector_view<float>(lse.data(), n)};
  loss_case stats_computed = c;
  stats_computed.log_prob = stats_computed.entropy = nullptr;  // computed from the logits
  const ulorl::policy_loss_inputs<float, float> in = loss_inputs(stats_computed);
  ulorl::logits_config lcfg;
  lcfg.temperature = temperature;
  const auto v = static_cast<std::size_t>(vocab);
  return ulorl::policy_loss_from_logits(ulorl::matrix_view<const float>(logits, n, v), std::span<const std::int64_t>(labels, n), in,
                                        buf, ulorl::matrix_view<float>(grad_logits, n, v), cfg, lcfg);
}

}  // namespace ulorl_cuda_test
