// Compiled with the project's default flags.
#define LOSS_ISA_NAME portable
#define LOSS_ISA_DOUBLE_MASK double
#define LOSS_ISA_FLOAT_MASK std::uint8_t
#include "loss_isa_tu.inc"
