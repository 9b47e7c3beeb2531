// tests/support/forged_checkpoint.hpp — a checkpoint with one byte changed and its checksum
// recomputed (core/checkpoint.hpp's envelope), so that only the restore's field checks can reject it.
#pragma once

#include <ulorl/core/checkpoint.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace {
//! `bytes` (one whole checkpoint) with byte `at` set to `value` and a valid CRC-64 again.
inline std::vector<std::byte> with_byte(std::vector<std::byte> bytes, std::size_t at, std::uint8_t value) {
  bytes.resize(bytes.size() - ulorl::detail::checkpoint_trailer_bytes);  // finish_checkpoint appends a new one
  bytes.at(at) = static_cast<std::byte>(value);
  ulorl::detail::finish_checkpoint(bytes, 0);
  return bytes;
}
//! The offset of the payload's first byte in a checkpoint.
inline constexpr std::size_t payload_start = ulorl::detail::checkpoint_header_bytes;
}  // namespace
