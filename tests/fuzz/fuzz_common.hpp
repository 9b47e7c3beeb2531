// tests/fuzz/fuzz_common.hpp — helpers shared by the libFuzzer targets: a check that aborts (so
// libFuzzer records the input) with the failed expression, fuzzed values biased towards the
// extremes that break numerics, and byte-buffer conversions.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

//! A property of the code under test failed: print it and abort (libFuzzer saves the input).
#define FUZZ_CHECK(...)                                                                    \
  do {                                                                                     \
    if (!(__VA_ARGS__)) {                                                                  \
      std::fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #__VA_ARGS__, __FILE__, __LINE__); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (false)

namespace fuzz {

//! A double that is often an edge case: 0, -0, +-inf, NaN, denormals, +-max, tiny and huge powers
//! of ten, small integers, or an arbitrary bit pattern.
inline double any_double(FuzzedDataProvider& p) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  static constexpr double table[] = {0.0,    -0.0,   1.0,     -1.0,    0.5,     2.0,     1e-300, -1e-300,
                                     1e300,  -1e300, 1e-12,   1e12,    0.2,     0.28,    1e-6,   20.0,
                                     inf,    -inf,   std::numeric_limits<double>::quiet_NaN(),
                                     std::numeric_limits<double>::max(), -std::numeric_limits<double>::max(),
                                     std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::min(),
                                     std::numeric_limits<double>::epsilon(), 1.0 + 1e-15, 1e-3, 0.1, 10.0};
  switch (p.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: return table[p.ConsumeIntegralInRange<std::size_t>(0, std::size(table) - 1)];
    case 1: return p.ConsumeFloatingPointInRange<double>(-4.0, 4.0);
    case 2: return static_cast<double>(p.ConsumeIntegralInRange<int>(-100, 100)) / 8.0;
    default: return p.ConsumeFloatingPoint<double>();
  }
}

//! An int64 that is often an edge case: small, negative, near the limits of int32 / int64.
inline std::int64_t any_int64(FuzzedDataProvider& p) {
  static constexpr std::int64_t table[] = {0, 1, -1, 2, 3, 7, 8, 64, 1000, std::int64_t{1} << 31, (std::int64_t{1} << 31) - 1,
                                           std::int64_t{1} << 40, (std::int64_t{1} << 40) + 1, std::numeric_limits<std::int64_t>::max(),
                                           std::numeric_limits<std::int64_t>::max() - 1, std::numeric_limits<std::int64_t>::min(),
                                           std::numeric_limits<std::int64_t>::min() + 1, std::numeric_limits<std::int32_t>::max(),
                                           std::numeric_limits<std::int32_t>::min()};
  switch (p.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: return table[p.ConsumeIntegralInRange<std::size_t>(0, std::size(table) - 1)];
    case 1: return p.ConsumeIntegralInRange<std::int64_t>(-4, 64);
    default: return p.ConsumeIntegral<std::int64_t>();
  }
}

inline std::span<const std::byte> as_bytes(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

inline bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

//! Bits of a double, so that sentinel comparisons also hold for NaN patterns.
template <class T>
inline bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

}  // namespace fuzz
