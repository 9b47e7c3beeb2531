// The policy-loss kernels of the extension's pairs (float / uint8, double / uint8: the masks of the
// torch adapter) built for AVX2 + FMA (-mavx2 -mfma: python/CMakeLists.txt, python/setup.py), in a
// library linked after the default-flags code. losses.cpp installs them at import time where the
// CPU has AVX2 and FMA (ulorl::install_policy_loss_kernel); nothing here runs before that check.
#include <cstdint>

#include <ulorl/loss/extern_kernels.hpp>

#if !defined(__AVX2__) || !defined(__FMA__)
#error "kernels_avx2.cpp must be compiled with -mavx2 -mfma"
#endif

ULORL_POLICY_LOSS_KERNEL_GETTER(ulorl_py_avx2_policy_loss_f32, float, std::uint8_t)
ULORL_POLICY_LOSS_KERNEL_GETTER(ulorl_py_avx2_policy_loss_f64, double, std::uint8_t)
