// Tests of ulorl/control/checkpoint.hpp: exact round trip of every field type, little-endian layout,
// header checks and truncation.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <ulorl/control/checkpoint.hpp>

#include "catch.hpp"

TEST_CASE("checkpoint fields round-trip exactly", "[control][checkpoint]") {
  std::vector<std::byte> buf;
  const auto at = ulorl::detail::begin_checkpoint(buf, ulorl::checkpoint_kind::entropy_controller);
  ulorl::detail::byte_writer w(buf);
  const double values[] = {0.0, -0.0, 1.0 / 3.0, -1e-308, 4.9e-324, std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::max()};
  for (double v : values) w.f64(v);
  w.u8(0xAB);
  w.u16(0xBEEF);
  w.u32(0xDEADBEEFu);
  w.u64(0x0123456789ABCDEFull);
  w.i64(-42);
  w.boolean(true);
  w.boolean(false);
  ulorl::detail::finish_checkpoint(buf, at);

  // Header: magic, version 1, kind 2, payload length, all little-endian.
  CHECK(static_cast<char>(buf[0]) == 'U');
  CHECK(static_cast<char>(buf[3]) == 'C');
  CHECK(static_cast<int>(buf[4]) == 1);
  CHECK(static_cast<int>(buf[5]) == 0);
  CHECK(static_cast<int>(buf[6]) == 2);
  const std::size_t payload = buf.size() - 12;
  CHECK(static_cast<std::size_t>(buf[8]) + (static_cast<std::size_t>(buf[9]) << 8) == payload);
  // The u64 0x0123456789ABCDEF is stored low byte first.
  const std::size_t u64_at = 12 + 8 * 8 + 1 + 2 + 4;
  CHECK(static_cast<int>(buf[u64_at]) == 0xEF);
  CHECK(static_cast<int>(buf[u64_at + 7]) == 0x01);

  auto r = ulorl::detail::open_checkpoint(buf, ulorl::checkpoint_kind::entropy_controller, "t");
  for (double v : values) {
    const double got = r.f64();
    CHECK(std::memcmp(&got, &v, sizeof v) == 0);
  }
  CHECK(r.u8() == 0xAB);
  CHECK(r.u16() == 0xBEEF);
  CHECK(r.u32() == 0xDEADBEEFu);
  CHECK(r.u64() == 0x0123456789ABCDEFull);
  CHECK(r.i64() == -42);
  CHECK(r.boolean());
  CHECK_FALSE(r.boolean());
  CHECK(r.remaining() == 0);
  CHECK_NOTHROW(ulorl::detail::close_checkpoint(r, "t"));
  CHECK_THROWS_AS(r.u8(), ulorl::error);  // reading past the end

  // NaN payload bits survive too.
  std::vector<std::byte> nb;
  ulorl::detail::byte_writer nw(nb);
  const double qnan = std::numeric_limits<double>::quiet_NaN();
  nw.f64(qnan);
  ulorl::detail::byte_reader nr(nb, "t");
  CHECK(std::isnan(nr.f64()));
}

TEST_CASE("checkpoint header checks", "[control][checkpoint][error]") {
  std::vector<std::byte> buf;
  const auto at = ulorl::detail::begin_checkpoint(buf, ulorl::checkpoint_kind::kl_controller);
  ulorl::detail::byte_writer(buf).u64(7);
  ulorl::detail::finish_checkpoint(buf, at);
  using ulorl::checkpoint_kind;
  CHECK_NOTHROW(ulorl::detail::open_checkpoint(buf, checkpoint_kind::kl_controller, "t"));
  CHECK_THROWS_AS(ulorl::detail::open_checkpoint(buf, checkpoint_kind::reference_reset, "t"), ulorl::error);
  auto bad = buf;
  bad[1] = std::byte{'x'};
  CHECK_THROWS_AS(ulorl::detail::open_checkpoint(bad, checkpoint_kind::kl_controller, "t"), ulorl::error);
  bad = buf;
  bad[8] = std::byte{9};  // length disagrees
  CHECK_THROWS_AS(ulorl::detail::open_checkpoint(bad, checkpoint_kind::kl_controller, "t"), ulorl::error);
  bad = std::vector<std::byte>(buf.begin(), buf.begin() + 5);
  CHECK_THROWS_AS(ulorl::detail::open_checkpoint(bad, checkpoint_kind::kl_controller, "t"), ulorl::error);
  auto r = ulorl::detail::open_checkpoint(buf, checkpoint_kind::kl_controller, "t");
  CHECK_THROWS_AS(ulorl::detail::close_checkpoint(r, "t"), ulorl::error);  // payload not consumed
  std::vector<std::byte> b2{std::byte{2}};
  ulorl::detail::byte_reader br(b2, "t");
  CHECK_THROWS_AS(br.boolean(), ulorl::error);
}
