// Fuzz target: logits_forward and logits_backward over the temperature range 1e-30 .. 1.8e308 and
// logit magnitudes from 0 to 1e6 offsets and beyond half a type's range (with -inf masked
// entries), for float64, float32 and bf16
// logits with float64 or float32 statistics, against the long-double oracle
// (tests/support/logits_oracle.hpp via tests/support/logits_temperature.hpp). Each batch is either
// refused with a ulorl::error that names 'logits' or 'temperature', or its statistics and its
// gradient (normwise, per row) match the oracle to the tolerance of its types.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "support/logits_temperature.hpp"

namespace {

double temperature(FuzzedDataProvider& p) {
  static constexpr double table[] = {1e-30, 1e-28, 1e-25, 1e-20, 1e-15, 1e-6, 1.0, 0.6, 1.7, 1e38, 1e40, 1e45,
                                     1e300, 1e308, std::numeric_limits<double>::max()};
  if (p.ConsumeIntegralInRange<int>(0, 3) == 0) return table[p.ConsumeIntegralInRange<std::size_t>(0, std::size(table) - 1)];
  return std::pow(10.0, p.ConsumeFloatingPointInRange<double>(-30.0, 308.25));
}

template <class L, class S, class G>
void run(FuzzedDataProvider& p, double grad_tol, double stat_tol, double max_x) {
  const std::size_t n = p.ConsumeIntegralInRange<std::size_t>(1, 3);
  const std::size_t v = p.ConsumeIntegralInRange<int>(0, 7) == 0 ? p.ConsumeIntegralInRange<std::size_t>(1025, 1200)
                                                                 : p.ConsumeIntegralInRange<std::size_t>(1, 40);
  const double tau = temperature(p);
  const bool fast = p.ConsumeBool();
  // The last three: beyond half of float's range (refused for float / bf16 logits) and of double's.
  static constexpr double bases[] = {0.0, 1.0, -1.0, 0.5, -1e4, 1e6, 3.0, 2e38, -3e38, 1e308};
  std::vector<double> x(n * v);
  std::vector<std::int64_t> labels(n);
  std::vector<double> g_lp(n), g_ent(n);
  // Scaled logits of order 1 on an offset (x = base + t u), or fixed magnitudes (x = s u).
  const double t = std::min(tau, max_x / 64);
  for (std::size_t r = 0; r < n; ++r) {
    const bool scaled = p.ConsumeBool();
    const double base = bases[p.ConsumeIntegralInRange<std::size_t>(0, std::size(bases) - 1)];
    const double s = std::pow(10.0, p.ConsumeFloatingPointInRange<double>(-3.0, 3.0));
    for (std::size_t c = 0; c < v; ++c) {
      const double u = p.ConsumeFloatingPointInRange<double>(-8.0, 8.0);
      x[r * v + c] = p.ConsumeIntegralInRange<int>(0, 9) == 0 ? -std::numeric_limits<double>::infinity()
                     : scaled                                 ? base + t * u
                                                              : s * u;
    }
    labels[r] = static_cast<std::int64_t>(p.ConsumeIntegralInRange<std::size_t>(0, v - 1));
    double& xl = x[r * v + static_cast<std::size_t>(labels[r])];
    if (std::isinf(xl)) xl = scaled ? base : 0.0;  // the chosen token is never masked
    g_lp[r] = p.ConsumeFloatingPointInRange<double>(-2.0, 2.0);
    g_ent[r] = p.ConsumeBool() ? p.ConsumeFloatingPointInRange<double>(-2.0, 2.0) : 0.0;
  }
  const temperature_check::result res = temperature_check::run<L, S, G>(x, n, v, labels, g_lp, g_ent, tau, fast);
  if (res.refused) {
    FUZZ_CHECK(res.what.find("'logits'") != std::string::npos || res.what.find("'temperature'") != std::string::npos);
    return;
  }
  if (!(res.grad_err <= grad_tol && res.stat_err <= stat_tol))
    std::fprintf(stderr, "tau %.17g n %zu v %zu row %zu: gradient error %.3g (tolerance %.3g), statistics %.3g (%.3g)\n",
                 tau, n, v, res.worst_row, res.grad_err, grad_tol, res.stat_err, stat_tol);
  FUZZ_CHECK(res.grad_err <= grad_tol);
  FUZZ_CHECK(res.stat_err <= stat_tol);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider p(data, size);
  using ulorl::bf16;
  constexpr double dmax = 1e300, fmax = 1e37;
  switch (p.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: run<double, double, double>(p, 1e-9, 1e-12, dmax); break;
    case 1: run<double, float, double>(p, 3e-4, 1e-6, dmax / 1e262); break;  // float statistics: |x| / tau within float
    case 2: run<float, double, float>(p, 1e-5, 1e-6, fmax); break;
    case 3: run<float, float, float>(p, 3e-4, 1e-6, fmax); break;
    case 4: run<bf16, double, bf16>(p, 1e-2, 1e-6, fmax); break;
    default: run<bf16, float, float>(p, 3e-4, 1e-6, fmax); break;
  }
  return 0;
}
