// Compiled with the project's default flags and ULORL_EXTERN_KERNELS (tests/CMakeLists.txt): its
// kernels are ulorl_suite_kernels_opt's, the -O2 default-flags build with std::uint8_t masks.
#define LOSS_ISA_NAME portable
#define LOSS_ISA_DOUBLE_MASK std::uint8_t
#define LOSS_ISA_FLOAT_MASK std::uint8_t
#include "loss_isa_tu.inc"
