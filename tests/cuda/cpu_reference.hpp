// cpu_reference.hpp — the bridge between the CUDA tests (nvcc, C++17: CUDA 11.8 has no C++20) and
// the CPU kernels of ulorl/logits.hpp and ulorl/loss/policy_loss.hpp (C++20), compiled in cpu_reference.cpp by the host compiler.
#pragma once

#include <cstddef>
#include <cstdint>

#include <ulorl/loss/policy_loss_types.hpp>

namespace ulorl_cuda_test {

//! ulorl::logits_forward + ulorl::logits_backward on contiguous float32 logits [rows, cols] with
//! double statistics: log_prob/entropy/lse [rows] and grad_logits [rows, cols] (float32).
void cpu_logits(const float* logits, std::size_t rows, std::size_t cols, const std::int64_t* labels, float temperature,
                const double* grad_log_prob, const double* grad_entropy, double* log_prob, double* entropy, double* lse,
                float* grad_logits);

//! Host arrays of one policy-loss case: padded [rows, cols] with row_stride, or packed (offsets
//! [rows + 1] and `cols` tokens). mask (0/1 floats), ref, weights, entropy may be nullptr.
struct loss_case {
  std::int64_t rows = 0, cols = 0, row_stride = 0;
  const std::int64_t* offsets = nullptr;
  const float *log_prob = nullptr, *old_log_prob = nullptr, *advantages = nullptr, *mask = nullptr;
  const float *ref_log_prob = nullptr, *weights = nullptr, *entropy = nullptr;
};

//! ulorl::policy_loss (the CPU kernels, float) on `c`: the gradients in the layout of the inputs
//! (grad_entropy may be nullptr when entropy_coef == 0).
ulorl::policy_loss_result cpu_policy_loss(const loss_case& c, const ulorl::policy_loss_config& cfg, float* grad_log_prob,
                                          float* grad_entropy);

//! ulorl::policy_loss_from_logits (CPU, float) on logits [tokens, vocab] (row i: flat token i of
//! `c`, a dense padded or a packed layout; c.log_prob and c.entropy are not read), labels [tokens].
ulorl::policy_loss_result cpu_loss_from_logits(const float* logits, std::int64_t vocab, const std::int64_t* labels,
                                               const loss_case& c, const ulorl::policy_loss_config& cfg, float temperature,
                                               float* grad_logits);

}  // namespace ulorl_cuda_test
