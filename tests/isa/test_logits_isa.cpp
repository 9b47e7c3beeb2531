// test_logits_isa — run-time instruction-set dispatch of the logits kernels: with the AVX2 + FMA
// probe's kernels installed (ulorl::install_kernel),
// the default-flags probe's logits_forward and logits_backward, and its policy_loss_from_logits,
// give the AVX2 probe's bits; uninstalled, their own again. The builds' bits differ (8 float lanes
// against 4 change the order of the partial sums; FMA changes the backward's log p), so a call that
// is not routed is seen. The AVX2 probe is called only on a CPU that has AVX2 and FMA.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <ulorl/logits/backward.hpp>
#include <ulorl/logits/forward.hpp>

#include "catch.hpp"
#include "logits_isa_probe.hpp"

namespace {

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

constexpr std::uint64_t seed = 20261203;

//! Logits of n rows x v columns (a few -inf: masked vocabulary), and the backward's inputs: the
//! statistics of the logits in double (a plain two-pass log-sum-exp), random row gradients.
logits_isa::problem make_problem(std::mt19937_64& rng, std::size_t n, std::size_t v, double temperature) {
  logits_isa::problem p;
  p.n = n;
  p.v = v;
  p.temperature = temperature;
  std::normal_distribution<double> nd;
  for (std::size_t i = 0; i < n * v; ++i) p.x.push_back(i % 97 == 5 ? -std::numeric_limits<double>::infinity() : 3 * nd(rng));
  for (std::size_t r = 0; r < n; ++r) {
    std::size_t y = static_cast<std::size_t>(rng() % v);
    while (std::isinf(p.x[r * v + y])) y = (y + 1) % v;
    p.labels.push_back(static_cast<std::int64_t>(y));
    double m = -std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < v; ++j) m = std::max(m, p.x[r * v + j] / temperature);
    double s = 0, t = 0;
    for (std::size_t j = 0; j < v; ++j) {
      const double z = p.x[r * v + j] / temperature;
      if (std::isinf(z)) continue;
      s += std::exp(z - m);
      t += std::exp(z - m) * z;
    }
    const double lse = m + std::log(s);
    p.lse.push_back(lse);
    p.entropy.push_back(lse - t / s);
    p.g_lp.push_back(nd(rng));
    p.g_ent.push_back(0.1 * nd(rng));
  }
  return p;
}

bool same_forward(const logits_isa::result& a, const logits_isa::result& b) {
  return a.log_prob == b.log_prob && a.entropy == b.entropy && a.lse == b.lse && a.sum_pi_squared == b.sum_pi_squared;
}

}  // namespace

TEST_CASE("logits isa: install_kernel routes every unit's logits_forward / logits_backward") {
  if (!cpu_has_avx2_fma()) {
    WARN("CPU without AVX2/FMA: the -mavx2 logits kernels cannot be installed here (not checked)");
    return;
  }
  std::printf("test_logits_isa seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const logits_isa::types all[] = {logits_isa::types::f32_i64_f32_f32, logits_isa::types::bf16_i64_f64_f32,
                                   logits_isa::types::f32_i32_f64_f32, logits_isa::types::f64_i32_f64_f64};
  const char* names[] = {"float/int64/float/float", "bf16/int64/double/float", "float/int32/double/float",
                         "double/int32/double/double"};
  int forward_differs = 0, backward_differs = 0, runs = 0;
  for (const std::size_t v : {std::size_t{3}, std::size_t{1000}, std::size_t{3001}}) {
    const auto p = make_problem(rng, 7, v, 0.7);
    for (std::size_t t = 0; t < 4; ++t)
      for (const bool threaded : {false, true}) {
        INFO(names[t] << " V=" << v << " threaded=" << threaded);
        REQUIRE(ulorl::installed_kernel<ulorl::isa_op::logits_forward, float, std::int64_t, float>() == nullptr);
        REQUIRE((ulorl::installed_kernel<ulorl::isa_op::logits_backward, float, std::int64_t, float, float, float>() == nullptr));
        const auto own = logits_isa::portable(p, all[t], false);
        const auto wide = logits_isa::avx2(p, all[t], false);
        logits_isa::install_avx2(true);
        CHECK(ulorl::installed_kernel<ulorl::isa_op::logits_forward, float, std::int64_t, float>() != nullptr);
        CHECK((ulorl::installed_kernel<ulorl::isa_op::logits_backward, ulorl::bf16, std::int64_t, double, float, ulorl::bf16>() != nullptr));
        const auto routed = logits_isa::portable(p, all[t], threaded);
        logits_isa::install_avx2(false);
        const auto again = logits_isa::portable(p, all[t], threaded);
        CHECK(same_forward(routed, wide));
        CHECK(routed.grad == wide.grad);
        CHECK(same_forward(again, own));
        CHECK(again.grad == own.grad);
        forward_differs += same_forward(own, wide) ? 0 : 1;
        backward_differs += own.grad == wide.grad ? 0 : 1;
        ++runs;
      }
  }
  std::printf("install_kernel: of %d runs, %d forward and %d backward results differ between the default "
              "and AVX2 kernels\n",
              runs, forward_differs, backward_differs);
  CHECK(forward_differs > 0);
  CHECK(backward_differs > 0);
}

TEST_CASE("logits isa: policy_loss_from_logits runs the installed logits kernels") {
  if (!cpu_has_avx2_fma()) {
    WARN("CPU without AVX2/FMA: the -mavx2 logits kernels cannot be installed here (not checked)");
    return;
  }
  std::mt19937_64 rng(seed + 1);
  const auto p = make_problem(rng, 9, 2053, 0.9);
  std::normal_distribution<double> nd;
  std::vector<double> old, adv;
  for (std::size_t r = 0; r < p.n; ++r) {
    old.push_back(-p.lse[r] + p.x[r * p.v + static_cast<std::size_t>(p.labels[r])] / p.temperature + 0.05 * nd(rng));
    adv.push_back(nd(rng));
  }
  const auto own = logits_isa::portable_from_logits(p, old, adv);
  logits_isa::install_avx2(true);
  const auto routed = logits_isa::portable_from_logits(p, old, adv);
  logits_isa::install_avx2(false);
  const auto again = logits_isa::portable_from_logits(p, old, adv);
  // The statistics are the AVX2 forward's ...
  const auto wide = logits_isa::avx2(p, logits_isa::types::f32_i64_f32_f32, false);
  CHECK(routed.log_prob == wide.log_prob);
  CHECK(routed.entropy == wide.entropy);
  CHECK(routed.lse == wide.lse);
  // ... and d loss / d logits the AVX2 backward's of those statistics and token gradients.
  logits_isa::problem q = p;
  q.lse = routed.lse;
  q.entropy = routed.entropy;
  q.g_lp = routed.grad_log_prob;
  q.g_ent = routed.grad_entropy;
  CHECK(routed.grad_logits == logits_isa::avx2(q, logits_isa::types::f32_i64_f32_f32, false).grad);
  CHECK(own.grad_logits != routed.grad_logits);
  CHECK(again.loss == own.loss);
  CHECK(again.log_prob == own.log_prob);
  CHECK(again.grad_logits == own.grad_logits);
}
