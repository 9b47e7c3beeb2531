// ulorl/logits/f16.hpp — `ulorl::f16`, the IEEE 754 binary16 *storage* type (1 sign, 5 exponent,
// 10 mantissa bits: torch.float16, CUDA's __half). It only converts: f16 -> float is exact
// (subnormals included); float -> f16 rounds to nearest, ties to even, as torch's `.half()`:
// magnitudes from 65520 up become infinity, those at or below 2^-25 zero (the sign kept), NaN a
// quiet NaN with the sign kept. Arithmetic is always done in float by the kernels.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "ulorl/core/config.hpp"

ULORL_NAMESPACE_BEGIN

namespace detail {

//! The float bits of a binary16 value (exact).
[[nodiscard]] constexpr std::uint32_t f16_to_float_bits(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return sign | 0x7f800000u | (mant << 13);  // infinity, NaN (payload kept)
  if (exp != 0) return sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  if (mant == 0) return sign;
  // Subnormal: mant * 2^-24, normalised (the leading 1 moves to bit 10).
  std::uint32_t e = 127 - 15 + 1, m = mant;
  while ((m & 0x400u) == 0) {
    m <<= 1;
    --e;
  }
  return sign | (e << 23) | ((m & 0x3ffu) << 13);
}

//! The binary16 bits of float bits, rounded to nearest, ties to even.
[[nodiscard]] constexpr std::uint16_t float_bits_to_f16(std::uint32_t u) noexcept {
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520 (and inf): inf
  if (a >= 0x38800000u) {  // normal binary16 (>= 2^-14): rebias, round the 13 dropped bits
    const std::uint32_t r = a - ((127u - 15u) << 23) + 0xfffu + ((a >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (r >> 13));
  }
  if (a <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25: ties to the even zero
  // Subnormal binary16: the value in units of 2^-24 is mant24 * 2^(e - 150 + 24); round that shift.
  const std::uint32_t e = a >> 23;                 // 102 .. 112
  const std::uint32_t mant24 = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - e;            // 14 .. 24 bits dropped
  const std::uint32_t q = mant24 >> shift, rem = mant24 & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  const std::uint32_t rounded = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
  return static_cast<std::uint16_t>(sign | rounded);  // 0x400 (the smallest normal) when it rounds up
}

}  // namespace detail

//! binary16 storage: trivially copyable, same size and layout as torch.float16 / __half.
struct f16 {
  std::uint16_t bits = 0;

  //! The exact float value.
  [[nodiscard]] constexpr float to_float() const noexcept {
    return ulorl::detail::bit_cast<float>(detail::f16_to_float_bits(bits));
  }
  //! Round to nearest even (see the header comment for the edges).
  [[nodiscard]] static constexpr f16 from_float(float f) noexcept {
    return f16{detail::float_bits_to_f16(ulorl::detail::bit_cast<std::uint32_t>(f))};
  }
  [[nodiscard]] static constexpr f16 from_bits(std::uint16_t b) noexcept { return f16{b}; }
  explicit constexpr operator float() const noexcept { return to_float(); }
  friend constexpr bool operator==(f16 a, f16 b) noexcept { return a.bits == b.bits; }
};
static_assert(sizeof(f16) == 2 && alignof(f16) == 2);

//! Widen n contiguous f16 values to float (exact).
inline void f16_to_float(const f16* ULORL_RESTRICT in, float* ULORL_RESTRICT out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = in[i].to_float();
}

//! Round n contiguous floats to f16 (nearest even).
inline void float_to_f16(const float* ULORL_RESTRICT in, f16* ULORL_RESTRICT out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = f16::from_float(in[i]);
}

ULORL_NAMESPACE_END
