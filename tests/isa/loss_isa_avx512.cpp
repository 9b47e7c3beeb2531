// Compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma (tests/CMakeLists.txt).
#define LOSS_ISA_NAME avx512
#define LOSS_ISA_DOUBLE_MASK double
#define LOSS_ISA_FLOAT_MASK std::uint8_t
#include "loss_isa_tu.inc"
