// ulorl/logits/bf16.hpp — `ulorl::bf16`, a 16-bit brain-float *storage* type (1 sign, 8 exponent,
// 7 mantissa bits: the upper half of an IEEE float32, as torch.bfloat16 and CUDA's __nv_bfloat16).
// It only converts: float -> bf16 rounds to nearest, ties to even (torch's rounding; NaN stays a
// quiet NaN), bf16 -> float is exact. Arithmetic is always done in float by the kernels.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "ulorl/core/config.hpp"

ULORL_NAMESPACE_BEGIN

//! bf16 storage: trivially copyable, same size and layout as torch.bfloat16 / __nv_bfloat16.
struct bf16 {
  std::uint16_t bits = 0;

  //! The exact float value.
  [[nodiscard]] constexpr float to_float() const noexcept {
    return ulorl::detail::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  //! Round to nearest even; NaN -> quiet NaN with the sign kept; +-inf and overflow -> +-inf.
  [[nodiscard]] static constexpr bf16 from_float(float f) noexcept {
    const std::uint32_t u = ulorl::detail::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
    const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    return bf16{static_cast<std::uint16_t>(rounded >> 16)};
  }
  [[nodiscard]] static constexpr bf16 from_bits(std::uint16_t b) noexcept { return bf16{b}; }
  explicit constexpr operator float() const noexcept { return to_float(); }
  friend constexpr bool operator==(bf16 a, bf16 b) noexcept { return a.bits == b.bits; }
};
static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2);

//! Widen n contiguous bf16 values to float (exact). Written so that GCC/Clang vectorise it.
inline void bf16_to_float(const bf16* ULORL_RESTRICT in, float* ULORL_RESTRICT out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = ulorl::detail::bit_cast<float>(static_cast<std::uint32_t>(in[i].bits) << 16);
}

//! Round n contiguous floats to bf16 (nearest even), vectorisable.
inline void float_to_bf16(const float* ULORL_RESTRICT in, bf16* ULORL_RESTRICT out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t u = ulorl::detail::bit_cast<std::uint32_t>(in[i]);
    const std::uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const std::uint32_t nan = (u >> 16) | 0x0040u;
    out[i].bits = static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
  }
}

ULORL_NAMESPACE_END
