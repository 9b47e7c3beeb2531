// tests/support/golden_bytes.hpp — checkpoints pinned as hexadecimal text in the tests: the bytes a
// given state saves to, which every build must save and restore to exactly (existing checkpoints
// keep loading, and a layout change cannot pass unnoticed).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace {
//! The bytes spelt by lower-case hexadecimal digits, two a byte.
inline std::vector<std::byte> from_hex(std::string_view hex) {
  const auto digit = [](char c) -> unsigned {
    if (c >= '0' && c <= '9') return static_cast<unsigned>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<unsigned>(c - 'a' + 10);
    throw std::invalid_argument("from_hex: not a lower-case hexadecimal digit");
  };
  if (hex.size() % 2 != 0) throw std::invalid_argument("from_hex: an odd number of digits");
  std::vector<std::byte> out;
  for (std::size_t i = 0; i < hex.size(); i += 2)
    out.push_back(static_cast<std::byte>(digit(hex[i]) * 16 + digit(hex[i + 1])));
  return out;
}
}  // namespace
