// Tests for ulorl/core/serialize.hpp: exact round trips and errors on malformed buffers.
#include <ulorl/core/serialize.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "catch.hpp"

TEST_CASE("byte_writer / byte_reader round-trip every field exactly", "[serialize]") {
  std::vector<std::byte> buf;
  ulorl::detail::byte_writer w(buf);
  w.u8(200);
  w.u16(65000);
  w.u32(4000000000u);
  w.u64(0xfedcba9876543210ull);
  w.i32(-7);
  w.i64(-(std::int64_t{1} << 60));
  w.f64(-0.0);
  w.f64(std::numeric_limits<double>::infinity());
  w.f64(0.1);
  w.boolean(true);
  w.u64(3);  // a count of 3 elements of 8 bytes that are not there
  REQUIRE(buf.size() == 1 + 2 + 4 + 8 + 4 + 8 + 8 + 8 + 8 + 1 + 8);
  REQUIRE(buf[1] == std::byte{0xE8});  // little-endian: 65000 = 0xFDE8
  ulorl::detail::byte_reader r(buf, "restore");
  REQUIRE(r.u8() == 200);
  REQUIRE(r.u16() == 65000);
  REQUIRE(r.u32() == 4000000000u);
  REQUIRE(r.u64() == 0xfedcba9876543210ull);
  REQUIRE(r.i32() == -7);
  REQUIRE(r.i64() == -(std::int64_t{1} << 60));
  const double z = r.f64();
  REQUIRE((z == 0.0 && std::signbit(z)));
  REQUIRE(r.f64() == std::numeric_limits<double>::infinity());
  REQUIRE(r.f64() == 0.1);
  REQUIRE(r.boolean());
  REQUIRE_THROWS_WITH(r.count("spans", 8), Catch::Contains("count of 'spans' exceeds the remaining bytes"));
  REQUIRE(r.remaining() == 0);
  REQUIRE_THROWS_WITH(r.u8("tail"), Catch::Contains("ulorl::restore: argument 'bytes'") && Catch::Contains("field 'tail'"));
  std::vector<std::byte> bad{std::byte{2}};
  ulorl::detail::byte_reader rb(bad, "restore", "buffer");
  REQUIRE_THROWS_WITH(rb.boolean("flag"), Catch::Contains("'buffer'[0] = 2"));
}
