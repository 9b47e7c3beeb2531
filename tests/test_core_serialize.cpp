// Tests for ulorl/core/serialize.hpp: exact round trips and errors on malformed buffers; a record
// written and read through its field table has the bytes a hand-written byte_writer sequence gives,
// errors name the field by its path, and a corrupted count is refused before anything is allocated.
#include <ulorl/core/serialize.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "catch.hpp"

namespace probe {
enum class colour : std::uint8_t { red, green };
struct point {
  std::int32_t x = 0;
  double y = 0.0;
};
struct record {
  bool flag = false;
  colour c = colour::red;
  std::int64_t n = 0;
  std::uint64_t u = 0;
  std::size_t z = 0;
  point at;
  std::vector<point> points;
  std::vector<std::uint8_t> marks;
};
template <class P, class F>
  requires ulorl::detail::record_of<P, point>
constexpr void visit_fields(P& p, F&& f) {
  f("x", p.x), f("y", p.y);
}
template <class R, class F>
  requires ulorl::detail::record_of<R, record>
constexpr void visit_fields(R& r, F&& f) {
  f("flag", r.flag), f("c", r.c), f("n", r.n), f("u", r.u), f("z", r.z), f("at", r.at), f("points", r.points);
  f("marks", r.marks);
}
}  // namespace probe

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

TEST_CASE("write_fields / read_fields follow the field table", "[serialize][fields]") {
  using ulorl::detail::byte_reader;
  using ulorl::detail::byte_writer;
  const probe::record rec{.flag = true, .c = probe::colour::green, .n = -5, .u = 1ull << 63, .z = 7,
                          .at = {.x = -2, .y = -0.0}, .points = {{1, 0.5}, {2, 1.5}}, .marks = {9}};
  std::vector<std::byte> got, want;
  byte_writer g(got);
  ulorl::detail::write_fields(g, rec);
  byte_writer w(want);
  w.boolean(true), w.u8(1), w.i64(-5), w.u64(1ull << 63), w.u64(7), w.i32(-2), w.f64(-0.0);
  w.u64(2), w.i32(1), w.f64(0.5), w.i32(2), w.f64(1.5), w.u64(1), w.u8(9);
  REQUIRE(got == want);
  STATIC_REQUIRE(ulorl::detail::min_field_bytes<probe::point>() == 12);
  STATIC_REQUIRE(ulorl::detail::min_field_bytes<probe::record>() == 1 + 1 + 8 + 8 + 8 + 12 + 8 + 8);

  probe::record back;
  byte_reader r(got, "restore");
  ulorl::detail::read_fields(r, back);
  CHECK(r.remaining() == 0);
  CHECK((back.flag && back.c == probe::colour::green && back.n == -5 && back.u == rec.u && back.z == 7));
  CHECK((back.at.x == -2 && back.at.y == 0.0 && std::signbit(back.at.y)));
  REQUIRE(back.points.size() == 2);
  CHECK((back.points[1].x == 2 && back.points[1].y == 1.5 && back.marks == rec.marks));

  const auto read_error = [](std::vector<std::byte> bytes, std::string_view prefix = {}) -> std::string {
    probe::record x;
    byte_reader in(bytes, "restore");
    try {
      ulorl::detail::read_fields(in, x, prefix);
    } catch (const ulorl::error& e) {
      return e.what();
    }
    return "";
  };
  // A truncated buffer names the field by its path; a prefix goes in front.
  CHECK_THAT(read_error({got.begin(), got.begin() + 28}), Catch::Contains("field 'at.x'"));
  CHECK_THAT(read_error({got.begin(), got.begin() + 28}, "state."), Catch::Contains("field 'state.at.x'"));
  CHECK_THAT(read_error({got.begin(), got.end() - 1}), Catch::Contains("count of 'marks' exceeds the remaining bytes"));
  // A boolean other than 0 / 1, and a count larger than the bytes left (12 a point).
  auto bad = got;
  bad[0] = std::byte{2};
  CHECK_THAT(read_error(bad), Catch::Contains("boolean field 'flag'"));
  bad = got;
  bad[38] = std::byte{4};  // the count of points: 2 -> 4, while 33 bytes remain
  CHECK_THAT(read_error(bad), Catch::Contains("count of 'points' exceeds the remaining bytes"));
  bad[38] = std::byte{2};
  bad[38 + 7] = std::byte{0x80};  // 2^63 + 2 points
  CHECK_THAT(read_error(bad), Catch::Contains("count of 'points' exceeds the remaining bytes"));

  // Fields an older layout lacks are skipped and keep their values.
  std::vector<std::byte> older;
  byte_writer o(older);
  o.boolean(false), o.u8(0), o.i64(3), o.i32(4), o.f64(5.0), o.u64(0), o.u64(0);
  probe::record y;
  y.u = 11, y.z = 12;
  const std::array<std::string_view, 2> absent{"u", "z"};
  byte_reader in(older, "restore");
  ulorl::detail::read_fields(in, y, {}, absent);
  CHECK(in.remaining() == 0);
  CHECK((y.n == 3 && y.u == 11 && y.z == 12 && y.at.x == 4 && y.at.y == 5.0));
}
