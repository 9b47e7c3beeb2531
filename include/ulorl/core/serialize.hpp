// ulorl/core/serialize.hpp — the byte-level encoding shared by every checkpoint format of ulorl
// (controllers, segment scheduler): fixed-width little-endian integers, doubles as their IEEE-754
// bit pattern (so -0.0, infinities and NaN payloads round-trip exactly on any host), and a reader
// that turns every overrun or malformed field into a ulorl::error naming the byte offset.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN
namespace detail {

//! Appends fixed-width little-endian fields to a byte vector.
class byte_writer {
 public:
  explicit byte_writer(std::vector<std::byte>& out) : out_(out) {}
  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u16(std::uint16_t v) { put(v, 2); }
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void i32(std::int32_t v) { put(static_cast<std::uint32_t>(v), 4); }
  void i64(std::int64_t v) { put(static_cast<std::uint64_t>(v), 8); }
  void f64(double v) { put(ulorl::detail::bit_cast<std::uint64_t>(v), 8); }
  void boolean(bool v) { u8(v ? 1u : 0u); }

 private:
  void put(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFFu));
  }
  std::vector<std::byte>& out_;
};

//! Reads what byte_writer wrote. `fn` and `arg` name the API call and the buffer argument in errors;
//! `what` names the field being read.
class byte_reader {
 public:
  byte_reader(std::span<const std::byte> in, std::string_view fn, std::string_view arg = "bytes")
      : in_(in), fn_(fn), arg_(arg) {}
  std::uint8_t u8(std::string_view what = "field") { return static_cast<std::uint8_t>(get(1, what)); }
  std::uint16_t u16(std::string_view what = "field") { return static_cast<std::uint16_t>(get(2, what)); }
  std::uint32_t u32(std::string_view what = "field") { return static_cast<std::uint32_t>(get(4, what)); }
  std::uint64_t u64(std::string_view what = "field") { return get(8, what); }
  std::int32_t i32(std::string_view what = "field") { return static_cast<std::int32_t>(get(4, what)); }
  std::int64_t i64(std::string_view what = "field") { return static_cast<std::int64_t>(get(8, what)); }
  double f64(std::string_view what = "field") { return ulorl::detail::bit_cast<double>(get(8, what)); }
  bool boolean(std::string_view what = "field") {
    const auto at = pos_;
    const auto v = u8(what);
    if (v > 1u)
      fail_at(fn_, arg_, static_cast<std::int64_t>(at), static_cast<unsigned>(v),
              "boolean field '" + std::string(what) + "' must be 0 or 1");
    return v == 1u;
  }
  //! A vector length, bounded by the bytes left so a corrupted count cannot trigger a huge allocation.
  std::size_t count(std::string_view what, std::size_t min_element_bytes) {
    const std::uint64_t n = u64(what);
    if (min_element_bytes > 0 && n > remaining() / min_element_bytes)
      fail_value(fn_, arg_, n, "corrupted: count of '" + std::string(what) + "' exceeds the remaining bytes");
    return static_cast<std::size_t>(n);
  }
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return in_.size() - pos_; }

 private:
  std::uint64_t get(std::size_t bytes, std::string_view what) {
    if (remaining() < bytes)
      fail_value(fn_, arg_, in_.size(),
                 "truncated: field '" + std::string(what) + "' at byte " + std::to_string(pos_) + " needs " +
                     std::to_string(bytes) + " bytes");
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(in_[pos_ + i]) << (8 * i);
    pos_ += bytes;
    return v;
  }
  std::span<const std::byte> in_;
  std::string_view fn_;
  std::string_view arg_;
  std::size_t pos_ = 0;
};

}  // namespace detail
ULORL_NAMESPACE_END
