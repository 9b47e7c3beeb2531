// Compiled with -mavx2 -mfma (tests/CMakeLists.txt).
#define ISA_PROBE_NAME avx2
#include "isa_tu.inc"
