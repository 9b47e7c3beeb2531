// cpu_reference.cpp — see cpu_reference.hpp.
#include "cpu_reference.hpp"

#include <span>

#include <ulorl/logits.hpp>

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

}  // namespace ulorl_cuda_test
