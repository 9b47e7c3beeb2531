// cpu_reference.hpp — the bridge between the CUDA tests (nvcc, C++17: CUDA 11.8 has no C++20) and
// the CPU kernels of ulorl/logits.hpp (C++20), compiled in cpu_reference.cpp by the host compiler.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ulorl_cuda_test {

//! ulorl::logits_forward + ulorl::logits_backward on contiguous float32 logits [rows, cols] with
//! double statistics: log_prob/entropy/lse [rows] and grad_logits [rows, cols] (float32).
void cpu_logits(const float* logits, std::size_t rows, std::size_t cols, const std::int64_t* labels, float temperature,
                const double* grad_log_prob, const double* grad_entropy, double* log_prob, double* entropy, double* lse,
                float* grad_logits);

}  // namespace ulorl_cuda_test
