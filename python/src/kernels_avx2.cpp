// The extension's kernels built for AVX2 + FMA (-mavx2 -mfma: python/CMakeLists.txt,
// python/setup.py), in a library linked after the default-flags code: every kernel of
// ULORL_PY_AVX2_KERNEL_LIST (kernels_avx2.hpp). losses.cpp installs them at import time where the CPU
// has AVX2 and FMA (ulorl::install_kernel_of); nothing here runs before that check.
#include "kernels_avx2.hpp"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "kernels_avx2.cpp must be compiled with -mavx2 -mfma"
#endif
#if defined(ULORL_EXTERN_KERNELS)
#error "kernels_avx2.cpp must not declare the default build's kernels extern (ULORL_EXTERN_KERNELS)"
#endif

#define ULORL_PY_DEFINE_(OP, ...) ULORL_KERNEL_GETTER(ulorl_py_avx2, OP, __VA_ARGS__)
ULORL_PY_AVX2_KERNEL_LIST(ULORL_PY_DEFINE_)
