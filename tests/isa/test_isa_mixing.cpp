// test_isa_mixing — one program linking translation units built for different instruction sets
// (the project's default flags, and -mavx2 -mfma). The vectorised kernels' code depends on those
// flags, so each TU must get its own instantiation (ISA-tagged inline namespaces); otherwise the
// linker keeps one of the two COMDAT copies for both TUs and a portable build could run AVX2 code.
// The test compares the addresses the two TUs linked to, then (on a CPU with AVX2 + FMA) that both
// compute the same results.
#include <cmath>

#include "catch.hpp"
#include "isa_probe.hpp"

namespace {
// Any call into the -mavx2 TU may execute AVX2 instructions (even zeroing its result struct).
bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
}  // namespace

TEST_CASE("isa mixing: TUs built for different instruction sets keep their own kernel instantiations") {
  if (!cpu_has_avx2_fma()) {
    WARN("CPU without AVX2/FMA: the -mavx2 translation unit cannot be called here");
    return;
  }
  const auto a = isa_probe::portable(false), b = isa_probe::avx2(false);
  CHECK(a.policy_loss_fn != b.policy_loss_fn);
  CHECK(a.logits_forward_fn != b.logits_forward_fn);
}

TEST_CASE("isa mixing: both variants compute the same results") {
  if (!cpu_has_avx2_fma()) {
    WARN("CPU without AVX2/FMA: only the portable variant runs");
    const auto a = isa_probe::portable(true);
    CHECK(std::isfinite(a.loss));
    return;
  }
  const auto a = isa_probe::portable(true), b = isa_probe::avx2(true);
  // Different vector widths change the order of the float block sums, which lanes the peel of
  // each row's misaligned head fills, and FMA contraction: the results agree to float rounding,
  // not bitwise. The loss is a sum of terms of both signs (0.018 here from terms adding up to
  // ~0.8 in magnitude), so its rounding is relative to the terms (loss_scale), not to the sum
  // (observed: 1.9e-8 apart). A lost or doubled token would move it by ~2e-3.
  CHECK(a.loss_scale > 0.1);
  CHECK(std::fabs(a.loss - b.loss) <= 1e-6 * a.loss_scale);
  REQUIRE(a.grad.size() == b.grad.size());
  for (std::size_t i = 0; i < a.grad.size(); ++i) CHECK(std::fabs(a.grad[i] - b.grad[i]) <= 1e-6f * std::fabs(a.grad[i]) + 1e-9f);
  for (std::size_t i = 0; i < a.log_prob.size(); ++i) {
    CHECK(std::fabs(a.log_prob[i] - b.log_prob[i]) <= 1e-5f * std::fabs(a.log_prob[i]));
    CHECK(std::fabs(a.entropy[i] - b.entropy[i]) <= 1e-5f * std::fabs(a.entropy[i]) + 1e-6f);
  }
}
