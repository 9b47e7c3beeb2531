// tests/fuzz/fuzz_common.hpp — helpers shared by the libFuzzer targets: a check that aborts (so
// libFuzzer records the input) with the failed expression, fuzzed values biased towards the
// extremes that break numerics and towards counter limits, a scratch file for the file-reading
// paths, and byte-buffer conversions.
#pragma once

#include <fcntl.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ulorl/core/error.hpp"

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

//! A counter value that is often at or next to one of ulorl's counter limits: 2^31 - 1 (a
//! response's counts), 2^42 (offered prompts), 2^62 (the scheduler's counters), 2^63 - 1
//! (checkpoint_counter_limit) or 2^64 - 1, minus 0..3 or plus 1; else small or arbitrary.
inline std::uint64_t near_limit(FuzzedDataProvider& p) {
  static constexpr std::uint64_t limits[] = {(std::uint64_t{1} << 31) - 1, std::uint64_t{1} << 42, std::uint64_t{1} << 62,
                                             (std::uint64_t{1} << 63) - 1, ~std::uint64_t{0}};
  switch (p.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: return p.ConsumeIntegralInRange<std::uint64_t>(0, 8);
    case 1: return p.ConsumeIntegral<std::uint64_t>();
    default: {
      const auto limit = limits[p.ConsumeIntegralInRange<std::size_t>(0, std::size(limits) - 1)];
      const auto below = p.ConsumeIntegralInRange<std::uint64_t>(0, 4);  // 4: one above the limit
      return below == 4 ? limit + 1 : limit - below;
    }
  }
}

//! Writes `bytes` to this process's scratch file, a regular file in a directory of its own under
//! $TMPDIR (or /tmp) that is removed at exit, and returns its path: the file-reading paths
//! (restore_from_file, restore_scheduler_from_file) are fuzzed on the same bytes as the in-memory
//! ones.
inline const std::string& scratch_file(std::span<const std::byte> bytes) {
  struct scratch {
    std::string dir, file;
    scratch() {
      const char* base = std::getenv("TMPDIR");
      std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ulorl_fuzz_XXXXXX";
      FUZZ_CHECK(::mkdtemp(tmpl.data()) != nullptr);
      dir = tmpl;
      file = dir + "/checkpoint";
    }
    ~scratch() {
      (void)::unlink(file.c_str());
      (void)::rmdir(dir.c_str());
    }
  };
  static scratch s;
  const int fd = ::open(s.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ::ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    FUZZ_CHECK(n > 0);
    done += static_cast<std::size_t>(n);
  }
  FUZZ_CHECK(::close(fd) == 0);
  return s.file;
}

//! `from_bytes(b)`, or nothing when it throws ulorl::error. With `via_file`, the same bytes are
//! also restored from a file (`from_file(scratch_file(b))`), which must agree: both refuse, or
//! `same(from bytes, from file)`.
template <class R, class FromBytes, class FromFile, class Same>
std::optional<R> restore_both(std::span<const std::byte> b, bool via_file, FromBytes from_bytes, FromFile from_file, Same same) {
  const auto attempt = [](auto&& make) {
    std::optional<R> r;
    try {
      r.emplace(make());
    } catch (const ulorl::error&) {
    }
    return r;
  };
  std::optional<R> r = attempt([&] { return from_bytes(b); });
  if (via_file) {
    const std::optional<R> f = attempt([&] { return from_file(scratch_file(b)); });
    FUZZ_CHECK(r.has_value() == f.has_value());
    if (r) FUZZ_CHECK(same(*r, *f));
  }
  return r;
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
