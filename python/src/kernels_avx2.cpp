// The extension's kernels built for AVX2 + FMA (-mavx2 -mfma: python/CMakeLists.txt,
// python/setup.py), in a library linked after the default-flags code: the policy loss of its pairs
// (float / uint8, double / uint8: the masks of the torch adapter) and logits_forward /
// logits_backward of every element-type combination the torch adapter instantiates
// (kernels_avx2.hpp). losses.cpp installs them at import time where the CPU has AVX2 and FMA
// (ulorl::install_policy_loss_kernel, install_logits_forward_kernel, install_logits_backward_kernel);
// nothing here runs before that check.
#include <cstdint>

#include <ulorl/loss/extern_kernels.hpp>

#include "kernels_avx2.hpp"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "kernels_avx2.cpp must be compiled with -mavx2 -mfma"
#endif

ULORL_POLICY_LOSS_KERNEL_GETTER(ulorl_py_avx2_policy_loss_f32, float, std::uint8_t)
ULORL_POLICY_LOSS_KERNEL_GETTER(ulorl_py_avx2_policy_loss_f64, double, std::uint8_t)

#define ULORL_PY_BACKWARD_GETTER_(NAME, L, I, S, D) ULORL_LOGITS_BACKWARD_KERNEL_GETTER(NAME, L, I, S, D, L)
ULORL_PY_LOGITS_FORWARD_KERNELS(ULORL_LOGITS_FORWARD_KERNEL_GETTER)
ULORL_PY_LOGITS_BACKWARD_KERNELS(ULORL_PY_BACKWARD_GETTER_)
