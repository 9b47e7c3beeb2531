// cpu_reference_linear_head.hpp — the bridge between the CUDA linear-head test (nvcc, C++17) and the
// CPU linear head of ulorl/logits/linear_head.hpp (C++20), compiled in cpu_reference_linear_head.cpp
// by the host compiler.
#pragma once

#include <cstddef>
#include <cstdint>

#include <ulorl/loss/policy_loss_types.hpp>

#include "cpu_reference.hpp"

namespace ulorl_cuda_test {

//! ulorl::policy_loss_from_hidden (CPU, float) on hidden [tokens, H] and weight [V, H] (row-major,
//! dense; row i of hidden is flat token i of `c`, a dense padded or a packed layout; c.log_prob and
//! c.entropy are not read), labels [tokens], logits / temperature, chunks of `chunk_rows` rows.
//! Writes grad_hidden [tokens, H] and grad_weight [V, H] (both overwritten) and the statistics
//! log_prob, entropy, lse [tokens] in flat token order.
ulorl::policy_loss_result cpu_loss_from_hidden(const float* hidden, std::int64_t tokens, std::int64_t hidden_size,
                                               const float* weight, std::int64_t vocab, const std::int64_t* labels,
                                               const loss_case& c, const ulorl::policy_loss_config& cfg, float temperature,
                                               std::size_t chunk_rows, float* grad_hidden, float* grad_weight,
                                               float* log_prob, float* entropy, float* lse);

}  // namespace ulorl_cuda_test
