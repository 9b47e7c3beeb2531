// Tests of ulorl/logits/f16.hpp against an independent reference: binary16 values decoded from their
// fields with ldexp, and float -> binary16 as the nearest value of the table of all finite binary16
// values (ties to the even encoding; from 65520 = 65504 + half an ulp up, infinity).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <ulorl/logits/f16.hpp>

#include "catch.hpp"

using ulorl::f16;

namespace {
// The value of binary16 bits from the format's definition.
long double decode(std::uint16_t b) {
  const int sign = (b >> 15) ? -1 : 1;
  const int e = (b >> 10) & 0x1f, m = b & 0x3ff;
  if (e == 0x1f) return m ? std::numeric_limits<long double>::quiet_NaN() : sign * std::numeric_limits<long double>::infinity();
  if (e == 0) return sign * std::ldexp(static_cast<long double>(m), -24);
  return sign * std::ldexp(static_cast<long double>(1024 + m), e - 25);
}

// Nearest binary16 encoding of f (finite f; ties to the even encoding).
std::uint16_t nearest_f16(float f) {
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const long double a = std::fabs(static_cast<long double>(f));
  if (a >= 65520.0L) return sign | 0x7c00;
  std::uint16_t lo = 0;  // the largest positive encoding <= a (encodings 0 .. 0x7bff ascend with the value)
  std::uint16_t l = 0, h = 0x7bff;
  while (l < h) {
    const std::uint16_t mid = static_cast<std::uint16_t>((l + h + 1) / 2);
    if (decode(mid) <= a) l = mid; else h = static_cast<std::uint16_t>(mid - 1);
  }
  lo = l;
  if (decode(lo) == a || lo == 0x7bff) return sign | lo;
  const std::uint16_t hi = static_cast<std::uint16_t>(lo + 1);
  const long double da = a - decode(lo), db = decode(hi) - a;
  if (da < db) return sign | lo;
  if (db < da) return sign | hi;
  return sign | ((lo & 1u) ? hi : lo);
}
}  // namespace

TEST_CASE("f16 widening is exact") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const f16 h = f16::from_bits(static_cast<std::uint16_t>(b));
    const long double want = decode(static_cast<std::uint16_t>(b));
    const float got = h.to_float();
    INFO("bits " << b);
    if (std::isnan(want)) {
      REQUIRE(std::isnan(got));
      continue;
    }
    REQUIRE(static_cast<long double>(got) == want);
    REQUIRE(std::signbit(got) == std::signbit(want));
    REQUIRE(f16::from_float(got) == h);  // round trip
  }
}

TEST_CASE("f16 narrowing rounds to nearest even") {
  const std::uint64_t seed = 1601;
  std::printf("test_logits_f16 seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> exponent(-30.0f, 17.0f);
  for (int i = 0; i < 200000; ++i) {
    // Half the draws over every float bit pattern, half over binary16's range (subnormals and ties).
    float f;
    if (i % 2)
      f = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    else
      f = std::ldexp(static_cast<float>(rng() % 4096), static_cast<int>(exponent(rng)) - 12) * (rng() % 2 ? 1 : -1);
    if (!std::isfinite(f)) continue;
    INFO("bits " << std::bit_cast<std::uint32_t>(f));
    REQUIRE(f16::from_float(f).bits == nearest_f16(f));
  }
  CHECK(f16::from_float(1.0f).bits == 0x3c00);
  CHECK(f16::from_float(1.0f + 0x1p-11f).bits == 0x3c00);      // tie -> even
  CHECK(f16::from_float(1.0f + 3 * 0x1p-11f).bits == 0x3c02);  // tie -> even (up)
  CHECK(f16::from_float(65504.0f).bits == 0x7bff);
  CHECK(f16::from_float(65519.996f).bits == 0x7bff);
  CHECK(f16::from_float(65520.0f).bits == 0x7c00);  // the tie above the largest value -> inf
  CHECK(f16::from_float(0x1p-24f).bits == 0x0001);  // smallest subnormal
  CHECK(f16::from_float(0x1p-25f).bits == 0x0000);  // tie -> even zero
  CHECK(f16::from_float(0x1.8p-25f).bits == 0x0001);
  CHECK(f16::from_float(-0.0f).bits == 0x8000);
  CHECK(f16::from_float(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(f16::from_float(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
  CHECK(std::isnan(f16::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
  CHECK(std::isnan(f16::from_float(std::bit_cast<float>(0x7f800001u)).to_float()));  // sNaN stays NaN
  CHECK(f16::from_float(-std::numeric_limits<float>::quiet_NaN()).bits & 0x8000);   // sign kept
  static_assert(f16::from_float(2.0f).to_float() == 2.0f);
}

TEST_CASE("f16 array converters equal the scalar conversions") {
  std::mt19937_64 rng(7);
  std::vector<float> f(1037);
  for (auto& x : f) x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
  f[3] = std::numeric_limits<float>::quiet_NaN();
  f[4] = -std::numeric_limits<float>::infinity();
  f[5] = 1e-6f;
  std::vector<f16> h(f.size());
  ulorl::float_to_f16(f.data(), h.data(), f.size());
  std::vector<float> back(f.size());
  ulorl::f16_to_float(h.data(), back.data(), h.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    CHECK(h[i] == f16::from_float(f[i]));
    CHECK(std::bit_cast<std::uint32_t>(back[i]) == std::bit_cast<std::uint32_t>(h[i].to_float()));
  }
}
