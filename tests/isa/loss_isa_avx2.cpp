// Compiled with -mavx2 -mfma (tests/CMakeLists.txt).
#define LOSS_ISA_NAME avx2
#define LOSS_ISA_DOUBLE_MASK std::uint8_t
#define LOSS_ISA_FLOAT_MASK float
#include "loss_isa_tu.inc"
