// Tests of ulorl/core/checkpoint.hpp, the one checkpoint envelope: the CRC-64/XZ check value and a
// bit-by-bit CRC written here from the definition, the byte layout by hand, exact round trips,
// every single-bit flip and every truncation rejected, and a wrong kind, envelope version, payload
// version or length (each with a valid checksum) rejected with a message that says which.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <ulorl/core/checkpoint.hpp>

#include "catch.hpp"

namespace {

constexpr std::uint64_t kSeed = 20250611;

//! CRC-64/XZ from its definition, one bit at a time: reflected ECMA-182 polynomial 0xC96C5795D7870F42,
//! register preset to all ones, result complemented.
std::uint64_t crc64_bitwise(const std::vector<std::byte>& bytes, std::size_t n) {
  std::uint64_t r = ~0ull;
  for (std::size_t i = 0; i < n; ++i) {
    r ^= static_cast<std::uint64_t>(bytes[i]);
    for (int k = 0; k < 8; ++k) r = (r & 1u) ? (r >> 1) ^ 0xC96C5795D7870F42ull : r >> 1;
  }
  return ~r;
}

std::vector<std::byte> to_bytes(std::string_view s) {
  std::vector<std::byte> b;
  for (char c : s) b.push_back(static_cast<std::byte>(c));
  return b;
}

std::uint64_t le(const std::vector<std::byte>& b, std::size_t at, int width) {
  std::uint64_t v = 0;
  for (int i = 0; i < width; ++i) v |= static_cast<std::uint64_t>(b[at + static_cast<std::size_t>(i)]) << (8 * i);
  return v;
}
void put_le(std::vector<std::byte>& b, std::size_t at, std::uint64_t v, int width) {
  for (int i = 0; i < width; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xFFu);
}
//! Recomputes the trailing checksum with the bitwise CRC, so that a deliberately wrong header field
//! is reported for what it is rather than as corruption.
void reseal(std::vector<std::byte>& b) { put_le(b, b.size() - 8, crc64_bitwise(b, b.size() - 8), 8); }

//! An envelope of kind `kind`, payload version 7, holding a u64, an f64 and a boolean.
std::vector<std::byte> sample(ulorl::checkpoint_kind kind = ulorl::checkpoint_kind::entropy_controller) {
  std::vector<std::byte> out;
  const auto at = ulorl::detail::begin_checkpoint(out, kind, 7);
  ulorl::detail::byte_writer w(out);
  w.u64(0x0123456789ABCDEFull);
  w.f64(-0.0);
  w.boolean(true);
  ulorl::detail::finish_checkpoint(out, at);
  return out;
}

std::string message_of(const std::vector<std::byte>& b, ulorl::checkpoint_kind kind, std::uint32_t version = 7) {
  try {
    (void)ulorl::detail::open_checkpoint(b, kind, version, "t::restore");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "t::restore");
    CHECK(e.argument() == "bytes");
    return e.what();
  }
  return "<accepted>";
}

}  // namespace

TEST_CASE("CRC-64/XZ: check value and the bitwise definition", "[core][checkpoint]") {
  CHECK(ulorl::detail::crc64(to_bytes("123456789")) == 0x995dc9bbdf1939faull);
  CHECK(ulorl::detail::crc64({}) == 0);
  std::printf("test_core_checkpoint seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  for (std::size_t n : {1u, 3u, 8u, 47u, 1023u}) {
    std::vector<std::byte> b(n);
    for (auto& x : b) x = static_cast<std::byte>(rng() & 0xFFu);
    CHECK(ulorl::detail::crc64(b) == crc64_bitwise(b, n));
  }
}

TEST_CASE("envelope layout, by hand", "[core][checkpoint]") {
  const auto b = sample();
  const std::size_t payload = 8 + 8 + 1;
  REQUIRE(b.size() == 24 + payload + 8);
  CHECK(std::memcmp(b.data(), "ULORLCKP", 8) == 0);
  CHECK(le(b, 8, 2) == 1);      // envelope version
  CHECK(le(b, 10, 2) == 2);     // kind: entropy_controller
  CHECK(le(b, 12, 4) == 7);     // payload version
  CHECK(le(b, 16, 8) == payload);
  CHECK(le(b, 24, 8) == 0x0123456789ABCDEFull);
  CHECK(le(b, 32, 8) == 0x8000000000000000ull);  // -0.0
  CHECK(static_cast<int>(b[40]) == 1);
  CHECK(le(b, b.size() - 8, 8) == crc64_bitwise(b, b.size() - 8));
  CHECK(static_cast<unsigned>(ulorl::checkpoint_kind::kl_controller) == 1);
  CHECK(static_cast<unsigned>(ulorl::checkpoint_kind::reference_reset) == 3);
  CHECK(static_cast<unsigned>(ulorl::checkpoint_kind::segment_scheduler) == 4);
}

TEST_CASE("envelope round trip, also after other bytes in the buffer", "[core][checkpoint]") {
  std::vector<std::byte> buf(5, std::byte{0xAA});  // the host's own bytes before the checkpoint
  const auto at = ulorl::detail::begin_checkpoint(buf, ulorl::checkpoint_kind::kl_controller, 3);
  CHECK(at == 5);
  ulorl::detail::byte_writer w(buf);
  const double values[] = {0.0, -0.0, 1.0 / 3.0, 4.9e-324, std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::max()};
  for (double v : values) w.f64(v);
  w.i64(-42);
  ulorl::detail::finish_checkpoint(buf, at);
  const std::span<const std::byte> env = std::span<const std::byte>(buf).subspan(at);
  auto r = ulorl::detail::open_checkpoint(env, ulorl::checkpoint_kind::kl_controller, 3, "t");
  for (double v : values) {
    const double got = r.f64();
    CHECK(std::memcmp(&got, &v, sizeof v) == 0);
  }
  CHECK(r.i64() == -42);
  CHECK(r.remaining() == 0);
  CHECK_NOTHROW(ulorl::detail::close_checkpoint(r, "t"));
  CHECK_THROWS_WITH(r.u8("more"), Catch::Contains("truncated") && Catch::Contains("'more'"));

  // An empty payload is a valid envelope of 32 bytes.
  std::vector<std::byte> empty;
  ulorl::detail::finish_checkpoint(empty, ulorl::detail::begin_checkpoint(empty, ulorl::checkpoint_kind::reference_reset, 1));
  CHECK(empty.size() == 32);
  const auto er = ulorl::detail::open_checkpoint(empty, ulorl::checkpoint_kind::reference_reset, 1, "t");
  CHECK(er.remaining() == 0);
}

TEST_CASE("envelope: every bit flip and every truncation is rejected", "[core][checkpoint]") {
  const auto b = sample();
  const auto kind = ulorl::checkpoint_kind::entropy_controller;
  REQUIRE(message_of(b, kind) == "<accepted>");
  std::size_t flips = 0;
  for (std::size_t bit = 0; bit < b.size() * 8; ++bit) {
    auto bad = b;
    bad[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    const auto msg = message_of(bad, kind);
    INFO("bit " << bit << ": " << msg);
    // The magic is checked first; anything else is caught by the checksum before a field is believed.
    if (bit < 64)
      CHECK(msg.find("bad magic") != std::string::npos);
    else
      CHECK(msg.find("corrupted: the CRC-64 checksum does not match") != std::string::npos);
    ++flips;
  }
  for (std::size_t n = 0; n < b.size(); ++n) {
    const std::vector<std::byte> cut(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
    const auto msg = message_of(cut, kind);
    INFO("first " << n << " bytes: " << msg);
    if (n < 32)
      CHECK(msg.find("truncated") != std::string::npos);
    else
      CHECK(msg.find("corrupted") != std::string::npos);
  }
  auto longer = b;
  longer.push_back(std::byte{0});
  CHECK(message_of(longer, kind).find("corrupted") != std::string::npos);
  CHECK(flips == b.size() * 8);
}

TEST_CASE("envelope: wrong kind, versions and length are named", "[core][checkpoint][error]") {
  using ulorl::checkpoint_kind;
  const auto b = sample(checkpoint_kind::kl_controller);
  CHECK_THAT(message_of(b, checkpoint_kind::reference_reset),
             Catch::Contains("argument 'bytes' = 1") && Catch::Contains("another kind of state (expected kind 3)"));
  CHECK_THAT(message_of(b, checkpoint_kind::kl_controller, 8),
             Catch::Contains("= 7") && Catch::Contains("unsupported payload format version (this build reads 8)"));
  auto bad = b;
  put_le(bad, 8, 2, 2);
  reseal(bad);
  CHECK_THAT(message_of(bad, checkpoint_kind::kl_controller),
             Catch::Contains("= 2") && Catch::Contains("unsupported checkpoint envelope version (this build reads 1)"));
  bad = b;
  put_le(bad, 16, 16, 8);
  reseal(bad);
  CHECK_THAT(message_of(bad, checkpoint_kind::kl_controller),
             Catch::Contains("= 16") && Catch::Contains("payload length does not match the 17 bytes"));
  bad = b;
  put_le(bad, 16, ~0ull, 8);
  reseal(bad);
  CHECK_THAT(message_of(bad, checkpoint_kind::kl_controller), Catch::Contains("payload length does not match"));
  bad = b;
  bad[0] = std::byte{'X'};
  CHECK_THAT(message_of(bad, checkpoint_kind::kl_controller),
             Catch::Contains("'bytes'[0] = 88") && Catch::Contains("not a ulorl checkpoint"));
  CHECK_THAT(message_of({}, checkpoint_kind::kl_controller),
             Catch::Contains("'bytes' = 0") && Catch::Contains("truncated: a ulorl checkpoint has at least 32 bytes"));
  // Unread payload bytes.
  auto r = ulorl::detail::open_checkpoint(b, checkpoint_kind::kl_controller, 7, "t::restore");
  (void)r.u64();
  CHECK_THROWS_WITH(ulorl::detail::close_checkpoint(r, "t::restore"),
                    Catch::Contains("ulorl::t::restore: argument 'bytes' = 9: trailing bytes"));
}
