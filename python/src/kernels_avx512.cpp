// The extension's kernels built for AVX-512 F/BW/DQ/VL + FMA, tag ulorl_py_avx512 (kernels_isa.inc).
#include "kernels_isa.inc"
