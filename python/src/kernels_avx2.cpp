// The extension's kernels built for AVX2 + FMA (-mavx2 -mfma), tag ulorl_py_avx2 (kernels_isa.inc).
#include "kernels_isa.inc"
