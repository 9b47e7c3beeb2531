#define ISA_PROBE_NAME portable
#include "isa_tu.inc"
