// test_loss_isa — the policy loss's vectorised kernel as built for the default flags, for AVX2 +
// FMA and for AVX-512 (mask registers: merge-masked accumulation, 16 float lanes), in one program.
// For every objective x KL estimator x aggregation, weights and entropy on and off, float and
// double, byte and float masks, rows of 1..1023 tokens (vector tails): each build's unit-stride
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

#include "catch.hpp"
#include "loss_isa_probe.hpp"
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

loss_isa::problem make_problem(std::mt19937_64& rng, std::size_t B, std::size_t Tn) {
  std::uniform_real_distribution<double> u(0, 1);
  loss_isa::problem p;
  p.B = B, p.T = Tn;
  const std::size_t n = B * Tn;
  for (auto* v : {&p.lp, &p.old, &p.adv, &p.ref, &p.w, &p.ent, &p.mask}) v->resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    // Values representable in float, so that every element type sees the same problem.
    const auto f = [](double x) { return static_cast<double>(static_cast<float>(x)); };
    p.old[i] = f(-5 * u(rng));
    double x = (u(rng) - 0.5) * 1.6;
    if (u(rng) < 0.03) x = u(rng) < 0.5 ? -25 - u(rng) : 25 + u(rng);  // beyond the log-ratio clamp
    p.lp[i] = f(p.old[i] + x);
    p.adv[i] = u(rng) < 0.1 ? 0.0 : f((u(rng) - 0.5) * 4);
    p.ref[i] = f(p.lp[i] + (u(rng) - 0.5) * (u(rng) < 0.1 ? 6 : 0.6));
    p.w[i] = f(0.2 + 1.5 * u(rng));
    p.ent[i] = f(3 * u(rng));
    p.mask[i] = u(rng) < 0.8 ? 1 : 0;
    if (u(rng) < 0.01) p.mask[i] = 0, p.lp[i] = p.old[i] = 0;  // a masked token with a degenerate ratio
  }
  return p;
}

ulorl::policy_loss_config make_config(const std::string& obj, const std::string& kl, const std::string& agg, bool entropy, double denom) {
  ulorl::policy_loss_config c;
  auto& o = c.objective;
  o.eps_low = 0.2, o.eps_high = 0.28, o.log_ratio_clamp = 20, o.seq_log_ratio_max = 10;
  if (obj == "ppo_dual") o.dual_clip = 3;
  if (obj == "ppo_delta") o.delta = 1.5, o.log_ratio_clamp = ulorl::no_limit;
  if (obj == "gspo_own") o.kind = ulorl::objective_kind::gspo, o.seq_gradient = ulorl::sequence_gradient::own_token;
  if (obj == "gspo_mean") o.kind = ulorl::objective_kind::gspo, o.seq_gradient = ulorl::sequence_gradient::through_mean;
  if (obj == "cispo") o.kind = ulorl::objective_kind::cispo;
  if (obj == "gmpo") o.kind = ulorl::objective_kind::gmpo;
  if (obj == "sapo") o.kind = ulorl::objective_kind::sapo;
  if (obj == "pg") o.kind = ulorl::objective_kind::policy_gradient;
  auto& k = c.kl;
  if (kl != "none") c.kl_coef = 0.3;
  if (kl == "k1") k.estimator = ulorl::kl_estimator::k1;
  if (kl == "abs") k.estimator = ulorl::kl_estimator::abs;
  if (kl == "k2") k.estimator = ulorl::kl_estimator::k2;
  if (kl == "k3") k.estimator = ulorl::kl_estimator::k3, k.input_clamp = 1.5, k.output_clamp = 1.2;
  if (kl == "k3_st") k.estimator = ulorl::kl_estimator::k3, k.straight_through = true;
  if (kl == "k3_iw") k.estimator = ulorl::kl_estimator::k3, k.importance_weighted = true;
  c.entropy_coef = entropy ? 0.01 : 0.0;
  c.normalizer = {agg == "seq_mean" ? ulorl::agg_mode::seq_mean_token_mean : ulorl::agg_mode::token_mean, denom, 1.5};
  return c;
}

//! a and b agree: gradients token by token, the rest as loss_compare::require_same_result.
void require_same(const loss_isa::run_result& a, const loss_isa::run_result& b, const loss_isa::problem& p, double tol, bool entropy) {
  double gmax = 0;
  for (double g : b.grad) gmax = std::max(gmax, std::fabs(g));
  for (std::size_t i = 0; i < b.grad.size(); ++i) {
    INFO("token " << i);
    REQUIRE(a.grad[i] == Approx(b.grad[i]).epsilon(tol).margin(tol * gmax));
    if (p.mask[i] == 0) REQUIRE((a.grad[i] == 0 && b.grad[i] == 0));
    if (entropy) REQUIRE(a.grad_entropy[i] == b.grad_entropy[i]);
  }
  loss_compare::require_same_result(a.res, b.res, tol);
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
        const auto p = make_problem(rng, B, Tn);
        const auto cfg = make_config(obj, kl, agg, entropy, 37.0);
        for (std::size_t t = 0; t < 4; ++t) {
          INFO(isa << ": " << obj << " " << kl << " " << agg << " T=" << Tn << " weights=" << weights << " entropy=" << entropy << " "
                   << type_names[t]);
          const bool dbl = t < 2;
          const double tol = dbl ? 1e-12 : 2e-5;
          const auto mine = probe(p, cfg, all_types[t], weights, entropy);
          REQUIRE(mine.generic.gaps_untouched);
          require_same(mine.fast, mine.generic, p, tol, entropy);  // this build's kernel vs its scalar loop
          if (probe != &loss_isa::portable) {
            const auto base = loss_isa::portable(p, cfg, all_types[t], weights, entropy);
            require_same(mine.fast, base.fast, p, tol, entropy);  // vs the default build's kernel
          }
          ++runs;
        }
      }
  std::printf("%s: %d runs checked\n", isa, runs);
  // The value scan: rows of 37 and 70 tokens (float AVX-512: 2 and 4 vectors, then a tail).
  std::size_t cases = 0;
  for (const std::size_t Tn : {std::size_t{37}, std::size_t{70}})
    for (std::size_t t = 0; t < 4; ++t) {
      const auto p = make_problem(rng, 3, Tn);
      const auto cfg = make_config("ppo", "k3", "token", true, 37.0);
      std::string failure;
      cases += scan(p, cfg, all_types[t], failure);
      INFO(isa << " value scan, T=" << Tn << " " << type_names[t] << ": " << failure);
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
