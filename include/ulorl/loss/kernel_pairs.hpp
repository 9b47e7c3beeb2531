// ulorl/loss/kernel_pairs.hpp — the (value, mask) pairs of the policy loss compiled once per
// program: value float or double, mask the value type, std::uint8_t (the torch adapter's) or bool.
// The one list: loss/policy_loss.hpp declares these pairs extern under ULORL_EXTERN_KERNELS, and
// cmake/ulorl_kernels.cmake reads this file for the pairs its kernel libraries compile (one
// `ULORL_PAIR(value, mask)` per line between the markers). Any other pair is instantiated where it
// is used.
#pragma once

#include <cstdint>

// clang-format off
// pairs: begin
#define ULORL_POLICY_LOSS_PAIRS        \
  ULORL_PAIR(float, float)             \
  ULORL_PAIR(float, std::uint8_t)      \
  ULORL_PAIR(float, bool)              \
  ULORL_PAIR(double, double)           \
  ULORL_PAIR(double, std::uint8_t)     \
  ULORL_PAIR(double, bool)
// pairs: end
// clang-format on
