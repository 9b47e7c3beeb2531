// test_loss_isa — the policy loss's vectorised kernel as built for the default flags, for AVX2 +
// FMA and for AVX-512 (mask registers: merge-masked accumulation, 16 float lanes), in one program.
// For every objective x KL estimator x aggregation, weights and entropy on and off, float and
// double, byte and float masks, rows of 1..1023 tokens (vector tails) and rows starting at every
// alignment (the kernel's peel): each build's unit-stride
// kernel must equal the generic strided loop of the same build (which computes the scalar
// formulas token by token), and the AVX2 / AVX-512 results must equal the default build's.
// The one-pass value scan of check_values must find one bad value in every array, at every
// position of a row (vector lanes and tail), and report the array and the index. Counts (tokens,
// clip fractions) must match exactly; values to float rounding (different vector
// widths change the order of the block sums, and FMA contraction the last bits of a token).
// The ISA probes are called only on a CPU that has the instructions; elsewhere the test says so.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "loss_isa_probe.hpp"
#include "support/loss_combos.hpp"
#include "support/loss_compare.hpp"

namespace {

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool cpu_has_avx512() {
  __builtin_cpu_init();
  return cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

using probe_fn = loss_isa::paths (*)(const loss_isa::problem&, const ulorl::policy_loss_config&, loss_isa::types, bool, bool);
using scan_fn = std::size_t (*)(const loss_isa::problem&, const ulorl::policy_loss_config&, loss_isa::types, std::string&);

void check_isa(const char* isa, probe_fn probe, scan_fn scan) {
  std::mt19937_64 rng(20261130);
  const std::size_t lengths[] = {1, 3, 47, 203, 1023};
  const loss_isa::types all_types[] = {loss_isa::types::double_double, loss_isa::types::double_u8, loss_isa::types::float_u8,
                                       loss_isa::types::float_float};
  const char* type_names[] = {"double/double", "double/uint8", "float/uint8", "float/float"};
  int k = 0, runs = 0;
  for (const char* obj : {"ppo", "ppo_dual", "ppo_delta", "cispo", "sapo", "pg", "gspo_own", "gspo_mean", "gmpo"})
    for (const char* kl : {"none", "k1", "abs", "k2", "k3", "k3_st", "k3_iw"})
      for (const char* agg : {"token", "seq_mean"}) {
        const bool weights = (k & 1) != 0, entropy = (k & 2) != 0;
        const std::size_t Tn = lengths[k % 5], B = Tn > 100 ? 3 : 6;
        ++k;
        const auto p = loss_paths::random_problem(rng, B, Tn);
        auto cfg = make_combo(obj, kl, agg, 37.0).cfg;
        if (!entropy) cfg.entropy_coef = 0;
        for (std::size_t t = 0; t < 4; ++t) {
          INFO(isa << ": " << obj << " " << kl << " " << agg << " T=" << Tn << " weights=" << weights << " entropy=" << entropy << " "
                   << type_names[t]);
          const bool dbl = t < 2;
          const double tol = dbl ? 1e-12 : 2e-5;
          const auto mine = probe(p, cfg, all_types[t], weights, entropy);
          REQUIRE(mine.generic.gaps_untouched);
          loss_compare::require_same_paths(mine.fast, mine.generic, p, tol, entropy);  // this build's kernel vs its scalar loop
          if (probe != &loss_isa::portable) {
            const auto base = loss_isa::portable(p, cfg, all_types[t], weights, entropy);
            loss_compare::require_same_paths(mine.fast, base.fast, p, tol, entropy);  // vs the default build's kernel
          }
          ++runs;
        }
      }
  std::printf("%s: %d runs checked\n", isa, runs);
  // Rows at every alignment (the peel): this build's kernel against its strided loop.
  const int aligned_runs = loss_compare::require_every_alignment(
      rng, isa, [&](const loss_isa::problem& p, const ulorl::policy_loss_config& cfg, int t, bool full) { return probe(p, cfg, all_types[t], full, full); });
  std::printf("%s: %d runs at every alignment checked\n", isa, aligned_runs);
  // The value scan: rows of 37 and 70 tokens (float AVX-512: 2 and 4 vectors, then a tail), and of
  // 70 and 150 tokens with the arrays 3 elements past a 64-byte boundary (the scan's peel).
  std::size_t cases = 0;
  for (const auto& [Tn, off] : {std::pair<std::size_t, std::size_t>{37, 0}, {70, 0}, {70, 3}, {150, 3}})
    for (std::size_t t = 0; t < 4; ++t) {
      auto p = loss_paths::random_problem(rng, 3, Tn);
      p.offset = off;
      const auto cfg = make_combo("ppo", "k3", "token", 37.0).cfg;
      std::string failure;
      cases += scan(p, cfg, all_types[t], failure);
      INFO(isa << " value scan, T=" << Tn << " offset " << off << " " << type_names[t] << ": " << failure);
      REQUIRE(failure.empty());
    }
  std::printf("%s: %zu value-scan cases checked\n", isa, cases);
}

}  // namespace

TEST_CASE("loss isa: the default build's vectorised kernel equals its generic strided loop") { check_isa("portable", &loss_isa::portable, &loss_isa::scan_portable); }

TEST_CASE("loss isa: the AVX2 + FMA build equals its strided loop and the default build") {
  if (!cpu_has_avx2_fma()) {
    WARN("CPU without AVX2/FMA: the -mavx2 loss kernel cannot run here (not checked)");
    return;
  }
  check_isa("avx2", &loss_isa::avx2, &loss_isa::scan_avx2);
}

TEST_CASE("loss isa: the AVX-512 build (mask registers) equals its strided loop and the default build") {
  if (!cpu_has_avx512()) {
    WARN("CPU without AVX-512 F/BW/DQ/VL: the -mavx512 loss kernel cannot run here (not checked)");
    return;
  }
  check_isa("avx512", &loss_isa::avx512, &loss_isa::scan_avx512);
}

TEST_CASE("loss isa: install_kernel routes every unit's policy_loss to the installed kernel") {
  if (!cpu_has_avx2_fma()) {
    WARN("CPU without AVX2/FMA: the -mavx2 loss kernel cannot be installed here (not checked)");
    return;
  }
  // The default probe's policy_loss of a pair the wider probe builds (double/uint8: AVX2; float/uint8:
  // AVX-512), with the wider kernels installed, gives the wider probe's bits; uninstalled, its own.
  using install_fn = void (*)(bool);
  struct wider {
    const char* name;
    install_fn install;
    probe_fn probe;
    loss_isa::types ty;
  };
  std::vector<wider> cases{{"avx2 double/uint8", &loss_isa::install_avx2, &loss_isa::avx2, loss_isa::types::double_u8}};
  if (cpu_has_avx512())
    cases.push_back({"avx512 float/uint8", &loss_isa::install_avx512, &loss_isa::avx512, loss_isa::types::float_u8});
  std::mt19937_64 rng(20261202);
  for (const auto& c : cases) {
    int differed = 0;
    for (const char* obj : {"ppo", "gspo_own", "gmpo"}) {
      const auto p = loss_paths::random_problem(rng, 5, 203);
      const auto cfg = make_combo(obj, "k3", "seq_mean", 37.0).cfg;
      REQUIRE(ulorl::installed_kernel<ulorl::isa_op::policy_loss, double, std::uint8_t>() == nullptr);
      REQUIRE(ulorl::installed_kernel<ulorl::isa_op::policy_loss, float, std::uint8_t>() == nullptr);
      const auto own = loss_isa::portable(p, cfg, c.ty, true, true);
      const auto wide = c.probe(p, cfg, c.ty, true, true);
      c.install(true);
      const auto routed = loss_isa::portable(p, cfg, c.ty, true, true);
      c.install(false);
      const auto again = loss_isa::portable(p, cfg, c.ty, true, true);
      INFO(c.name << " " << obj);
      CHECK(routed.fast.res.loss == wide.fast.res.loss);
      CHECK(routed.fast.grad == wide.fast.grad);
      CHECK(routed.fast.grad_entropy == wide.fast.grad_entropy);
      CHECK(routed.generic.res.loss == wide.generic.res.loss);
      CHECK(routed.generic.grad == wide.generic.grad);
      CHECK(again.fast.res.loss == own.fast.res.loss);
      CHECK(again.fast.grad == own.fast.grad);
      differed += (own.fast.res.loss != wide.fast.res.loss || own.fast.grad != wide.fast.grad) ? 1 : 0;
    }
    // The builds' bits differ somewhere (vector widths change partial sums): the routing is seen.
    std::printf("install_kernel, %s: %d of 3 problems differ between the default and wider kernels\n", c.name,
                differed);
    CHECK(differed > 0);
  }
}
