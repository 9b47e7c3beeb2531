// Tests of ulorl/logits/simd.hpp: the vectorised exp's relative error on a dense sweep of its range
// against long-double exp, its edge behaviour, and the chunk kernels against plain loops.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <ulorl/logits/simd.hpp>

#include "catch.hpp"

using namespace ulorl;

TEST_CASE("vec_exp: max relative error ~1e-7 on [-87, 88.3]") {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.3f; v += 0.000731f) x.push_back(v);
  x.push_back(0.0f);
  x.push_back(-0.0f);
  x.push_back(1e-30f);
  std::vector<float> y(x.size());
  vec_exp(x.data(), y.data(), x.size());
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const long double e = std::exp(static_cast<long double>(x[i]));
    worst = std::max(worst, static_cast<double>(std::fabs(y[i] - e) / e));
  }
  std::printf("test_logits_simd: vec_exp max relative error %.3g over %zu points\n", worst, x.size());
  CHECK(worst < 2e-7);
  CHECK(y[x.size() - 3] == 1.0f);
}

TEST_CASE("vec_exp edges: flush below -87, NaN propagates, -inf gives 0") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> x{-87.5f, -100.0f, -inf, nan, 100.0f, inf, -86.9f, 0.5f,
                       -87.5f, -100.0f, -inf, nan, 100.0f, inf, -86.9f, 0.5f, 3.0f};
  std::vector<float> y(x.size());
  vec_exp(x.data(), y.data(), x.size());
  for (std::size_t i : {0u, 8u, 16u - 15u}) CHECK(y[i] == 0.0f);
  for (std::size_t i : {2u, 10u}) CHECK(y[i] == 0.0f);
  for (std::size_t i : {3u, 11u}) CHECK(std::isnan(y[i]));
  for (std::size_t i : {4u, 5u, 12u, 13u}) CHECK(std::isfinite(y[i]));  // clamped, no overflow UB
  CHECK(std::fabs(y[6] / std::exp(static_cast<double>(x[6])) - 1) < 2e-7);
  CHECK(std::fabs(y[16] / std::exp(3.0) - 1) < 2e-7);
}

TEST_CASE("chunk kernels equal plain loops") {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> nd;
  for (std::size_t n : {0u, 1u, 7u, 31u, 32u, 33u, 1024u}) {
    std::vector<float> x(n);
    for (auto& v : x) v = static_cast<float>(3 * nd(rng));
    if (n > 3) {
      x[2] = -std::numeric_limits<float>::infinity();
      x[n - 1] = 9.0f;
    }
    float ref_max = -std::numeric_limits<float>::infinity();
    for (float v : x) ref_max = std::max(ref_max, v);
    CHECK(simd::chunk_max(x.data(), n) == ref_max);
    const float m = n ? ref_max : 0.0f;
    double s = 0, t = 0, q = 0;
    simd::chunk_sums<true>(x.data(), n, m, 0.8f, s, t, q);
    long double rs = 0, rt = 0, rq = 0;
    for (float v : x) {
      const long double d = (static_cast<long double>(v) - m) * static_cast<long double>(0.8f);
      if (std::isinf(static_cast<double>(d))) continue;
      rs += std::exp(d);
      rt += std::exp(d) * d;
      rq += std::exp(2 * d);
    }
    CHECK(std::fabs(s - rs) <= 1e-6 * std::max(1.0L, rs));
    CHECK(std::fabs(t - rt) <= 1e-6 * std::max(1.0L, std::fabs(rt)));
    CHECK(std::fabs(q - rq) <= 1e-6 * std::max(1.0L, rq));
    std::vector<float> g(n), gs(n + 16), gf(n);
    simd::chunk_grad<true>(x.data(), g.data(), n, static_cast<double>(m), 0.8, 1.25, 0.5f, -0.25f);
    // Non-temporal stores (to a 64-byte aligned address) and prefetching change nothing.
    float* aligned = gs.data() + (64 - reinterpret_cast<std::uintptr_t>(gs.data()) % 64) % 64 / sizeof(float);
    simd::chunk_grad<true>(x.data(), aligned, n, static_cast<double>(m), 0.8, 1.25, 0.5f, -0.25f, true,
                                   reinterpret_cast<const char*>(x.data()), n * sizeof(float));
    simd::fence_streams();
    simd::chunk_grad<false>(x.data(), gf.data(), n, static_cast<double>(m), 0.8, 1.25, 0.5f, -0.25f);
    for (std::size_t i = 0; i < n; ++i) {
      CHECK(aligned[i] == g[i]);
      const long double lp = (static_cast<long double>(x[i]) - m) * 0.8L - 1.25L;
      const long double ref = std::isinf(static_cast<double>(lp)) ? 0.0L : std::exp(lp) * (0.5L - 0.25L * lp);
      if (std::isinf(static_cast<double>(lp))) {
        CHECK(g[i] == 0.0f);
        CHECK(gf[i] == 0.0f);
        continue;
      }
      CHECK(std::fabs(g[i] - ref) <= 5e-7L * std::exp(lp) * (0.5L + 0.25L * std::fabs(lp)) + 1e-37L);
      // float log p: p off by up to |log p| 6e-8 (here |log p| < 40).
      CHECK(std::fabs(gf[i] - ref) <= 5e-6L * std::exp(lp) * (0.5L + 0.25L * std::fabs(lp)) + 1e-37L);
    }
  }
  // NaN: ignored by the max, propagated by the sums and the gradient.
  std::vector<float> x(40, 1.0f);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  CHECK(simd::chunk_max(x.data(), x.size()) == 1.0f);
  double s = 0, t = 0, q = 0;
  simd::chunk_sums<true>(x.data(), x.size(), 1.0f, 1.0f, s, t, q);
  CHECK(std::isnan(s));
  CHECK(std::isnan(q));
  std::vector<float> g(40);
  simd::chunk_grad<true>(x.data(), g.data(), 40, 1.0, 1.0, 3.0, 1.0f, 1.0f);
  CHECK(std::isnan(g[17]));
  CHECK(std::isfinite(g[16]));
}

// simd::max_abs_bits against a plain loop: every length 0..300 (vector body, pair body, tail), the
// extreme at every position class, the sign of the extreme, NaN / inf (either sign, any position)
// at or beyond the exponent mask, subnormals and zeros.
template <class T>
void check_max_abs_bits() {
  using U = simd::uint_of_t<T>;
  const U inf_bits = std::bit_cast<U>(std::numeric_limits<T>::infinity());
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-3, 3);
  for (std::size_t n = 0; n <= 300; ++n) {
    std::vector<T> x(n + 1);  // x[0] unused: an odd start off any vector boundary
    for (std::size_t i = 1; i <= n; ++i) x[i] = static_cast<T>(u(rng));
    const T* p = x.data() + 1;
    double ref = 0;
    for (std::size_t i = 0; i < n; ++i) ref = std::max(ref, std::fabs(static_cast<double>(p[i])));
    INFO("n " << n);
    CHECK(static_cast<double>(std::bit_cast<T>(simd::max_abs_bits(p, n))) == ref);
    if (n == 0) continue;
    for (std::size_t at : {std::size_t{0}, n / 3, n / 2, n - 1}) {
      auto y = x;
      y[1 + at] = static_cast<T>(-1e6);  // the extreme is negative: |x| counts
      CHECK(std::bit_cast<T>(simd::max_abs_bits(y.data() + 1, n)) == static_cast<T>(1e6));
      for (T bad : {std::numeric_limits<T>::quiet_NaN(), -std::numeric_limits<T>::quiet_NaN(),
                    std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity()}) {
        y[1 + at] = bad;
        CHECK(simd::max_abs_bits(y.data() + 1, n) >= inf_bits);
      }
    }
  }
  const std::vector<T> tiny{T(0), -T(0), std::numeric_limits<T>::denorm_min(), -std::numeric_limits<T>::denorm_min() * 3};
  CHECK(std::bit_cast<T>(simd::max_abs_bits(tiny.data(), tiny.size())) == std::numeric_limits<T>::denorm_min() * 3);
  const std::size_t m = 40 + rng() % 3;  // a run-time length (a constant one draws GCC's loop-bound warning)
  const std::vector<T> zeros(m, -T(0));
  CHECK(simd::max_abs_bits(zeros.data(), zeros.size()) == 0);
  const std::vector<T> big(m, -std::numeric_limits<T>::max());
  CHECK(std::bit_cast<T>(simd::max_abs_bits(big.data(), big.size())) == std::numeric_limits<T>::max());
}

TEST_CASE("simd::max_abs_bits: the largest magnitude, and >= inf's bits exactly when a value is inf or NaN") {
  check_max_abs_bits<float>();
  check_max_abs_bits<double>();
}
