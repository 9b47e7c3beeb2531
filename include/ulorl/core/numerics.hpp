// ulorl/core/numerics.hpp — scalar and reduction numerics shared by every layer:
//   clamp with torch's gradient convention, exp of a clamped log-ratio, a numerically stable
//   log-sum-exp step (online softmax), and robust mean/variance (two passes in double, never
//   E[x^2] - E[x]^2, which loses every digit for rewards such as 1e6 + {0, 1e-3}).
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

#include "ulorl/core/config.hpp"

ULORL_NAMESPACE_BEGIN

//! clamp(x, lo, hi). Its derivative (torch's convention) is 1 on the closed interval [lo, hi].
template <class T>
ULORL_HD constexpr T clamp(T x, T lo, T hi) noexcept {
  return x < lo ? lo : (x > hi ? hi : x);
}
template <class T>
ULORL_HD constexpr bool clamp_passes_gradient(T x, T lo, T hi) noexcept {
  return lo <= x && x <= hi;
}

//! Numerically stable running log-sum-exp: fold one value into (max, sum of exp(x - max)).
template <class T>
struct lse_accumulator {
  T max = -std::numeric_limits<T>::infinity();
  T sum = T(0);
  ULORL_HD void add(T x) noexcept {
    // exp(-inf - -inf) would be NaN: a -inf entry (masked vocabulary) contributes nothing.
    if (x == -std::numeric_limits<T>::infinity()) return;
    if (x > max) {
      sum = sum * std::exp(max - x) + T(1);
      max = x;
    } else {
      sum += std::exp(x - max);
    }
  }
  [[nodiscard]] ULORL_HD T value() const noexcept { return max + std::log(sum); }
};

//! Mean and sum of squared deviations (M2) of a sequence, computed in two passes in double.
struct moments {
  std::size_t count = 0;
  double mean = 0.0;
  double m2 = 0.0;  //!< Σ (x - mean)^2
  //! Unbiased (n-1) or biased (n) variance; 0 for fewer than 2 (unbiased) or 1 (biased) values.
  [[nodiscard]] double variance(bool unbiased) const noexcept {
    if (unbiased) return count >= 2 ? m2 / static_cast<double>(count - 1) : 0.0;
    return count >= 1 ? m2 / static_cast<double>(count) : 0.0;
  }
  [[nodiscard]] double stddev(bool unbiased) const noexcept { return std::sqrt(variance(unbiased)); }
};

//! Two-pass moments of value(i) for i in [0, n). `value` is any callable i -> arithmetic.
template <class F>
[[nodiscard]] moments two_pass_moments(std::size_t n, F&& value) {
  moments m;
  m.count = n;
  if (n == 0) return m;
  double s = 0.0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(value(i));
  m.mean = s / static_cast<double>(n);
  // Second pass plus the compensation term Σ(x - mean), which is ~0 but absorbs the rounding of mean.
  double m2 = 0.0, c = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(value(i)) - m.mean;
    m2 += d * d;
    c += d;
  }
  m.m2 = m2 - c * c / static_cast<double>(n);
  if (m.m2 < 0.0) m.m2 = 0.0;
  return m;
}

ULORL_NAMESPACE_END
