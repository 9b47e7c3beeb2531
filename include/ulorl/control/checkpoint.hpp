// ulorl/control/checkpoint.hpp — the byte format in which the controllers of ulorl/control save
// their configuration and state, so that a restored controller behaves bit for bit like the saved
// one. Layout: magic "ULRC", format version (u16), kind (u16), payload length (u32), payload.
// Integers are little-endian fixed width; doubles are stored as their IEEE-754 bit pattern, so
// every value (including -0.0 and infinities) round-trips exactly on any host.
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

//! Which controller a checkpoint holds (a checkpoint restores only into its own kind).
enum class checkpoint_kind : std::uint16_t { kl_controller = 1, entropy_controller = 2, reference_reset = 3 };

inline constexpr std::uint16_t checkpoint_format_version = 1;

namespace detail {

//! Appends fixed-width little-endian fields to a byte vector.
class byte_writer {
 public:
  explicit byte_writer(std::vector<std::byte>& out) : out_(out) {}
  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u16(std::uint16_t v) { put(v, 2); }
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void i64(std::int64_t v) { put(static_cast<std::uint64_t>(v), 8); }
  void f64(double v) { put(std::bit_cast<std::uint64_t>(v), 8); }
  void boolean(bool v) { u8(v ? 1u : 0u); }

 private:
  void put(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFFu));
  }
  std::vector<std::byte>& out_;
};

//! Reads what byte_writer wrote; every overrun or malformed field throws ulorl::error.
class byte_reader {
 public:
  byte_reader(std::span<const std::byte> in, std::string_view fn) : in_(in), fn_(fn) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(get(1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(get(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(get(4)); }
  std::uint64_t u64() { return get(8); }
  std::int64_t i64() { return static_cast<std::int64_t>(get(8)); }
  double f64() { return std::bit_cast<double>(get(8)); }
  bool boolean() {
    const auto at = pos_;
    const auto v = u8();
    if (v > 1u) fail_at(fn_, "bytes", static_cast<std::int64_t>(at), static_cast<unsigned>(v), "boolean field must be 0 or 1");
    return v == 1u;
  }
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return in_.size() - pos_; }

 private:
  std::uint64_t get(std::size_t bytes) {
    if (in_.size() - pos_ < bytes)
      fail_value(fn_, "bytes", in_.size(),
                 "truncated checkpoint: field at byte " + std::to_string(pos_) + " needs " + std::to_string(bytes) + " bytes");
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(in_[pos_ + i]) << (8 * i);
    pos_ += bytes;
    return v;
  }
  std::span<const std::byte> in_;
  std::string_view fn_;
  std::size_t pos_ = 0;
};

//! Writes the header with a zero length, to be patched by finish_checkpoint once the payload is in.
inline std::size_t begin_checkpoint(std::vector<std::byte>& out, checkpoint_kind kind) {
  byte_writer w(out);
  for (char c : std::string_view("ULRC")) w.u8(static_cast<std::uint8_t>(c));
  w.u16(checkpoint_format_version);
  w.u16(static_cast<std::uint16_t>(kind));
  const std::size_t length_at = out.size();
  w.u32(0);
  return length_at;
}
inline void finish_checkpoint(std::vector<std::byte>& out, std::size_t length_at) {
  const auto n = static_cast<std::uint32_t>(out.size() - length_at - 4);
  for (int i = 0; i < 4; ++i) out[length_at + static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xFFu);
}

//! Checks the header and returns a reader positioned at the payload, which must fill the buffer.
inline byte_reader open_checkpoint(std::span<const std::byte> in, checkpoint_kind kind, std::string_view fn) {
  byte_reader r(in, fn);
  for (char c : std::string_view("ULRC"))
    if (r.u8() != static_cast<std::uint8_t>(c)) fail(fn, "bytes", "not a ulorl controller checkpoint (bad magic)");
  const auto version = r.u16();
  if (version != checkpoint_format_version)
    fail_value(fn, "bytes", version, "unsupported checkpoint format version (this build reads 1)");
  const auto k = r.u16();
  if (k != static_cast<std::uint16_t>(kind))
    fail_value(fn, "bytes", k, "checkpoint holds another controller kind (expected " +
                                   std::to_string(static_cast<unsigned>(kind)) + ")");
  const auto length = r.u32();
  if (length != r.remaining())
    fail_value(fn, "bytes", in.size(), "checkpoint payload length " + std::to_string(length) + " does not match the " +
                                           std::to_string(r.remaining()) + " bytes that follow the header");
  return r;
}

inline void close_checkpoint(const byte_reader& r, std::string_view fn) {
  if (r.remaining() != 0)
    fail_value(fn, "bytes", r.remaining(), "trailing bytes after the checkpoint payload");
}

}  // namespace detail

ULORL_NAMESPACE_END
