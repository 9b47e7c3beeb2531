// Compiled with the project's default flags.
#define LOSS_ISA_NAME portable
#include "loss_isa_tu.inc"
