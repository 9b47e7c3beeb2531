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
#include "ulorl/core/serialize.hpp"

ULORL_NAMESPACE_BEGIN

//! Which controller a checkpoint holds (a checkpoint restores only into its own kind).
enum class checkpoint_kind : std::uint16_t { kl_controller = 1, entropy_controller = 2, reference_reset = 3 };

inline constexpr std::uint16_t checkpoint_format_version = 1;

namespace detail {

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
