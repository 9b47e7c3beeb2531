// ulorl/core/checkpoint.hpp — the one envelope in which every state machine of ulorl (segment
// scheduler, KL and entropy controllers, reference-reset policy) saves its state.
//
// Layout (integers little-endian, fixed width; the payload's encoding is core/serialize.hpp's):
//   offset  0  magic "ULORLCKP"                          8 bytes
//           8  envelope version (checkpoint_envelope_version)  u16
//          10  kind (checkpoint_kind)                    u16
//          12  payload format version (the kind's own)   u32
//          16  payload bytes                             u64
//          24  payload
//   24 + n     CRC-64/XZ of bytes [0, 24 + n)            u64
// Opening checks, in this order, each with a ulorl::error naming the function and "bytes": the
// buffer holds at least a header and a checksum, the magic, the checksum (so a flipped bit anywhere,
// header included, is reported as corruption before any field is believed), the envelope version,
// the kind, the payload version, and that the payload length is exactly what lies between header
// and checksum. CRC-64 detects every error burst of up to 64 bits and every odd number of flipped
// bits; it guards against accidental corruption, not against an adversary who recomputes it, which
// is why every restore also re-checks every field's bounds and every invariant of the state.
#pragma once

#include <array>
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

//! Which state machine a checkpoint holds; a checkpoint restores only into its own kind.
enum class checkpoint_kind : std::uint16_t {
  kl_controller = 1,
  entropy_controller = 2,
  reference_reset = 3,
  segment_scheduler = 4,
};

//! The version of the envelope layout above (each kind versions its payload separately).
inline constexpr std::uint16_t checkpoint_envelope_version = 1;

//! The limit of every event counter a state machine keeps in its state (a controller's updates,
//! the reference-reset policy's evaluations and resets, the segment tuner's decisions): 2^63 - 1,
//! so that it also fits a signed 64-bit integer on the host's side (Python, JSON, torch.int64).
//! Restore accepts every value up to it; a call that would take a counter past it is rejected
//! before anything changes, so a machine never holds, nor saves, a state its restore refuses.
//! (The segment scheduler's counters have their own, lower limit: segment_scheduler_limits.)
inline constexpr std::uint64_t checkpoint_counter_limit = static_cast<std::uint64_t>(INT64_MAX);

namespace detail {

//! Throws unless the counter `v` is <= checkpoint_counter_limit.
inline void require_counter(std::string_view fn, std::string_view arg, std::uint64_t v) {
  if (v > checkpoint_counter_limit)
    fail_value(fn, arg, v, "counter exceeds its limit 2^63 - 1 (checkpoint_counter_limit)");
}

//! Throws when the counter `v` is at checkpoint_counter_limit and the call would increment it.
inline void require_counter_room(std::string_view fn, std::string_view arg, std::uint64_t v) {
  if (v >= checkpoint_counter_limit)
    fail_value(fn, arg, v, "counter is at its limit 2^63 - 1 (checkpoint_counter_limit): the call would take it past");
}

inline constexpr std::array<char, 8> checkpoint_magic{'U', 'L', 'O', 'R', 'L', 'C', 'K', 'P'};
inline constexpr std::size_t checkpoint_header_bytes = 24;
inline constexpr std::size_t checkpoint_trailer_bytes = 8;

//! CRC-64/XZ (ECMA-182 polynomial, reflected, init and final xor all ones): check value of
//! "123456789" is 0x995dc9bbdf1939fa.
inline constexpr std::array<std::uint64_t, 256> crc64_table = [] {
  std::array<std::uint64_t, 256> t{};
  for (std::uint64_t i = 0; i < 256; ++i) {
    std::uint64_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0xC96C5795D7870F42ull : c >> 1;
    t[static_cast<std::size_t>(i)] = c;
  }
  return t;
}();

[[nodiscard]] inline std::uint64_t crc64(std::span<const std::byte> bytes) noexcept {
  std::uint64_t c = ~0ull;
  for (const auto b : bytes) c = crc64_table[static_cast<std::size_t>((c ^ static_cast<std::uint64_t>(b)) & 0xFFu)] ^ (c >> 8);
  return ~c;
}

//! Appends the header (payload length 0, patched by finish_checkpoint) to `out`; returns where the
//! envelope starts. Write the payload with a byte_writer on `out`, then call finish_checkpoint.
inline std::size_t begin_checkpoint(std::vector<std::byte>& out, checkpoint_kind kind, std::uint32_t payload_version) {
  const std::size_t start = out.size();
  byte_writer w(out);
  for (const char c : checkpoint_magic) w.u8(static_cast<std::uint8_t>(c));
  w.u16(checkpoint_envelope_version);
  w.u16(static_cast<std::uint16_t>(kind));
  w.u32(payload_version);
  w.u64(0);
  return start;
}

//! Patches the payload length of the envelope that starts at `start` and appends its checksum.
inline void finish_checkpoint(std::vector<std::byte>& out, std::size_t start) {
  const std::uint64_t n = out.size() - start - checkpoint_header_bytes;
  for (std::size_t i = 0; i < 8; ++i) out[start + 16 + i] = static_cast<std::byte>((n >> (8 * i)) & 0xFFu);
  const std::uint64_t sum = crc64(std::span<const std::byte>(out).subspan(start));
  byte_writer(out).u64(sum);
}

//! Checks the envelope (see the header comment for the order of checks) and returns a reader over
//! the payload alone; the caller reads every field and then calls close_checkpoint.
[[nodiscard]] inline byte_reader open_checkpoint(std::span<const std::byte> in, checkpoint_kind kind,
                                                 std::uint32_t payload_version, std::string_view fn) {
  if (in.size() < checkpoint_header_bytes + checkpoint_trailer_bytes)
    fail_value(fn, "bytes", in.size(), "truncated: a ulorl checkpoint has at least " +
                                           std::to_string(checkpoint_header_bytes + checkpoint_trailer_bytes) +
                                           " bytes (header and checksum)");
  for (std::size_t i = 0; i < checkpoint_magic.size(); ++i)
    if (in[i] != static_cast<std::byte>(checkpoint_magic[i]))
      fail_at(fn, "bytes", static_cast<std::int64_t>(i), static_cast<unsigned>(in[i]),
              "not a ulorl checkpoint (bad magic; expected \"ULORLCKP\")");
  const std::size_t body = in.size() - checkpoint_trailer_bytes;
  byte_reader trailer(in.subspan(body), fn);
  const std::uint64_t stored = trailer.u64("checksum");
  if (stored != crc64(in.first(body)))
    fail_value(fn, "bytes", in.size(), "corrupted: the CRC-64 checksum does not match the contents");
  byte_reader r(in.first(body), fn);
  for (std::size_t i = 0; i < checkpoint_magic.size(); ++i) (void)r.u8("magic");
  const auto version = r.u16("envelope version");
  if (version != checkpoint_envelope_version)
    fail_value(fn, "bytes", version, "unsupported checkpoint envelope version (this build reads " +
                                         std::to_string(checkpoint_envelope_version) + ")");
  const auto k = r.u16("kind");
  if (k != static_cast<std::uint16_t>(kind))
    fail_value(fn, "bytes", k, "checkpoint holds another kind of state (expected kind " +
                                   std::to_string(static_cast<unsigned>(kind)) + ")");
  const auto pv = r.u32("payload version");
  if (pv != payload_version)
    fail_value(fn, "bytes", pv, "unsupported payload format version (this build reads " +
                                    std::to_string(payload_version) + ")");
  const auto length = r.u64("payload bytes");
  if (length != r.remaining())
    fail_value(fn, "bytes", length, "payload length does not match the " + std::to_string(r.remaining()) +
                                        " bytes between header and checksum");
  return byte_reader(in.subspan(checkpoint_header_bytes, static_cast<std::size_t>(length)), fn);
}

//! The payload must be read to its end: trailing bytes mean a writer of another layout.
inline void close_checkpoint(const byte_reader& r, std::string_view fn) {
  if (r.remaining() != 0) fail_value(fn, "bytes", r.remaining(), "trailing bytes after the checkpoint payload");
}

}  // namespace detail

ULORL_NAMESPACE_END
