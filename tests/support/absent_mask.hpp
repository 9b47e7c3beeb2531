// tests/support/absent_mask.hpp — the two layouts of one batch for the checks that an absent mask
// (an empty view) means "every token valid": padded [B, T] and packed (row b holds len[b] tokens,
// row 1 none), random values per layout, and bitwise comparisons of the results.
#pragma once

#include <ulorl/core/ragged.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

namespace absent_mask {

struct layout {
  bool packed = false;
  std::size_t B = 0, T = 0;
  std::vector<std::int64_t> off;  //!< packed only

  [[nodiscard]] std::size_t size() const { return packed ? static_cast<std::size_t>(off.back()) : B * T; }
  template <class U>
  [[nodiscard]] ulorl::token_view<U> view(U* data) const {
    if (packed) return ulorl::token_view<U>::packed(ulorl::vector_view<U>(data, size()), std::span<const std::int64_t>(off));
    return ulorl::token_view<U>::padded(ulorl::matrix_view<U>(data, B, T));
  }
  template <class U>
  [[nodiscard]] ulorl::token_view<const U> cview(const std::vector<U>& v) const {
    return view<const U>(v.data());
  }
  template <class U>
  [[nodiscard]] ulorl::token_view<U> mview(std::vector<U>& v) const {
    return view<U>(v.data());
  }
};

//! Padded [B, T] and packed with random row lengths in [1, T] (row 1 empty, B >= 2).
inline std::vector<layout> layouts(std::mt19937_64& rng, std::size_t B, std::size_t T) {
  layout pad{false, B, T, {}}, pk{true, B, 0, {0}};
  for (std::size_t b = 0; b < B; ++b)
    pk.off.push_back(pk.off.back() + static_cast<std::int64_t>(b == 1 ? 0 : 1 + rng() % T));
  return {pad, pk};
}

//! n values uniform in [lo, hi).
inline std::vector<double> uniform(std::mt19937_64& rng, std::size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

template <class T>
[[nodiscard]] bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
template <class T>
[[nodiscard]] bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

}  // namespace absent_mask
