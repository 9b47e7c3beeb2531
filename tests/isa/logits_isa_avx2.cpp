// Compiled with -mavx2 -mfma (tests/CMakeLists.txt).
#define LOGITS_ISA_NAME avx2
#define LOGITS_ISA_INSTALL install_avx2
#include "logits_isa_tu.inc"
