// Compiled with -mavx2 -mfma (tests/CMakeLists.txt).
#define LOSS_ISA_NAME avx2
#include "loss_isa_tu.inc"
