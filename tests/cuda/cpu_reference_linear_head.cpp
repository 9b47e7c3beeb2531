// cpu_reference_linear_head.cpp — see cpu_reference_linear_head.hpp.
#include "cpu_reference_linear_head.hpp"

#include <span>
#include <vector>

#include <ulorl/logits/linear_head.hpp>

#include "cpu_views.hpp"

namespace ulorl_cuda_test {


ulorl::policy_loss_result cpu_loss_from_hidden(const float* hidden, std::int64_t tokens, std::int64_t hidden_size,
                                               const float* weight, std::int64_t vocab, const std::int64_t* labels,
                                               const loss_case& c, const ulorl::policy_loss_config& cfg, float temperature,
                                               std::size_t chunk_rows, float* grad_hidden, float* grad_weight,
                                               float* log_prob, float* entropy, float* lse) {
  const auto n = static_cast<std::size_t>(tokens), h = static_cast<std::size_t>(hidden_size),
             v = static_cast<std::size_t>(vocab);
  std::vector<float> glp(n), gent(n);
  const ulorl::logits_loss_buffers<float> buf{view(c, log_prob), view(c, entropy), view(c, glp.data()), view(c, gent.data()),
                                              ulorl::vector_view<float>(lse, n)};
  loss_case stats_computed = c;
  stats_computed.log_prob = stats_computed.entropy = nullptr;  // computed from the hidden states
  const ulorl::policy_loss_inputs<float, float> in = loss_inputs(stats_computed);
  const ulorl::linear_head_inputs<float> head{ulorl::matrix_view<const float>(hidden, n, h),
                                              ulorl::matrix_view<const float>(weight, v, h)};
  const ulorl::linear_head_grads<float> grads{ulorl::matrix_view<float>(grad_hidden, n, h),
                                              ulorl::matrix_view<float>(grad_weight, v, h)};
  ulorl::linear_head_config hcfg;
  hcfg.temperature = temperature;
  hcfg.chunk_rows = chunk_rows;
  hcfg.grad_hidden = ulorl::grad_mode::overwrite;
  hcfg.grad_weight = ulorl::grad_mode::overwrite;
  return ulorl::policy_loss_from_hidden(head, std::span<const std::int64_t>(labels, n), in, buf, grads, cfg, hcfg);
}

}  // namespace ulorl_cuda_test
