// cpu_views.hpp — a loss_case's host arrays as the CPU kernels' views (C++20: included by the CPU
// references' .cpp files only, never by a .cu file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <ulorl/loss/policy_loss.hpp>

#include "cpu_reference.hpp"

namespace ulorl_cuda_test {

//! `p` in the layout of `c` (an empty view for nullptr).
template <class T>
ulorl::token_view<T> view(const loss_case& c, T* p) {
  if (p == nullptr) return {};
  if (c.offsets != nullptr)
    return ulorl::token_view<T>::packed(ulorl::vector_view<T>(p, static_cast<std::size_t>(c.cols)),
                                        std::span<const std::int64_t>(c.offsets, static_cast<std::size_t>(c.rows) + 1));
  return ulorl::token_view<T>::padded(ulorl::matrix_view<T>(p, static_cast<std::size_t>(c.rows), static_cast<std::size_t>(c.cols),
                                                            static_cast<std::ptrdiff_t>(c.row_stride), 1));
}

//! The loss inputs of `c` (log_prob and entropy as `c` has them: null in the fused paths' cases).
inline ulorl::policy_loss_inputs<float, float> loss_inputs(const loss_case& c) {
  ulorl::policy_loss_inputs<float, float> in;
  in.log_prob = view(c, c.log_prob);
  in.old_log_prob = view(c, c.old_log_prob);
  in.advantages = view(c, c.advantages);
  in.mask = view(c, c.mask);
  in.ref_log_prob = view(c, c.ref_log_prob);
  in.weights = view(c, c.weights);
  in.entropy = view(c, c.entropy);
  return in;
}

}  // namespace ulorl_cuda_test
