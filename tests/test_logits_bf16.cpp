// Tests of ulorl/logits/bf16.hpp: exact widening, round-to-nearest-even narrowing (checked against a
// long-double nearest-value search), NaN/inf handling, and the array converters.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <ulorl/logits/bf16.hpp>

#include "catch.hpp"

using ulorl::bf16;

namespace {
// Independent rounding: among the two bf16 neighbours of f, the nearer one (ties: even mantissa).
std::uint16_t nearest_bf16(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  const auto lo = static_cast<std::uint16_t>(u >> 16);
  const auto hi = static_cast<std::uint16_t>(lo + 1);
  const long double a = std::bit_cast<float>(static_cast<std::uint32_t>(lo) << 16);
  const long double b = std::bit_cast<float>(static_cast<std::uint32_t>(hi) << 16);
  const long double da = std::fabs(static_cast<long double>(f) - a), db = std::fabs(b - static_cast<long double>(f));
  if (da < db) return lo;
  if (db < da) return hi;
  return (lo & 1u) ? hi : lo;
}
}  // namespace

TEST_CASE("bf16 widening is exact and narrowing rounds to nearest even") {
  const std::uint64_t seed = 99;
  std::printf("test_logits_bf16 seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 200000; ++i) {
    const auto bits = static_cast<std::uint32_t>(rng());
    const float f = std::bit_cast<float>(bits);
    if (!std::isfinite(f) || std::fabs(f) > 3.38e38f) continue;  // near FLT_MAX rounds to inf: tested below
    INFO("bits " << bits);
    REQUIRE(bf16::from_float(f).bits == nearest_bf16(f));
  }
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const bf16 h = bf16::from_bits(static_cast<std::uint16_t>(b));
    const float f = h.to_float();
    if (std::isnan(f)) continue;
    REQUIRE(bf16::from_float(f) == h);  // round trip
  }
  CHECK(bf16::from_float(1.0f).bits == 0x3f80);
  CHECK(bf16::from_float(1.0f + 0x1p-8f).bits == 0x3f80);                 // tie -> even
  CHECK(bf16::from_float(1.0f + 3 * 0x1p-8f).bits == 0x3f82);             // tie -> even (up)
  CHECK(bf16::from_float(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  CHECK(bf16::from_float(-std::numeric_limits<float>::infinity()).bits == 0xff80);
  CHECK(bf16::from_float(std::numeric_limits<float>::max()).bits == 0x7f80);  // overflow -> inf
  CHECK(std::isnan(bf16::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
  CHECK(std::isnan(bf16::from_float(std::bit_cast<float>(0x7f800001u)).to_float()));  // sNaN stays NaN
  static_assert(bf16::from_float(2.0f).to_float() == 2.0f);
}

TEST_CASE("bf16 array converters equal the scalar conversions") {
  std::mt19937_64 rng(7);
  std::vector<float> f(1037);
  for (auto& x : f) x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
  f[3] = std::numeric_limits<float>::quiet_NaN();
  f[4] = -std::numeric_limits<float>::infinity();
  std::vector<bf16> h(f.size());
  ulorl::float_to_bf16(f.data(), h.data(), f.size());
  std::vector<float> back(f.size());
  ulorl::bf16_to_float(h.data(), back.data(), h.size());
  for (std::size_t i = 0; i < f.size(); ++i) {
    CHECK(h[i] == bf16::from_float(f[i]));
    CHECK(std::bit_cast<std::uint32_t>(back[i]) == std::bit_cast<std::uint32_t>(h[i].to_float()));
  }
}
