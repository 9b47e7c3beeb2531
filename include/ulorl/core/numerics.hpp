// ulorl/core/numerics.hpp — scalar and reduction numerics shared by every layer:
//   clamp with torch's gradient convention, exp of a clamped log-ratio, a numerically stable
//   log-sum-exp step (online softmax), and robust mean/variance (two passes in double, never
//   E[x^2] - E[x]^2, which loses every digit for rewards such as 1e6 + {0, 1e-3}; scaled by a
//   power of two so that no finite input overflows or underflows them).
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

//! Mean and sum of squared deviations (M2) of a sequence, in double, with every step scaled by a
//! power of two 2^exponent >= max |x| so that nothing overflows or underflows for any finite
//! values: the deviations (x - mean) / 2^exponent lie in [-2, 2] and their squares cannot
//! overflow, even where M2 itself (e.g. {1e200, 0}: 5e399) or the std ({max, -max}: sqrt(2) max)
//! exceeds the double range. Scaling by a power of two is exact, so within the range the results
//! are the bits of the unscaled two-pass formula.
struct moments {
  std::size_t count = 0;
  double mean = 0.0;         //!< between the smallest and the largest value: never overflows
  double m2 = 0.0;           //!< Σ (x - mean)^2; +inf where it exceeds the double range
  int exponent = 0;          //!< the scale 2^exponent of the members below
  double scaled_mean = 0.0;  //!< mean / 2^exponent
  double scaled_m2 = 0.0;    //!< Σ ((x - mean) / 2^exponent)^2, always finite (<= 4 count)

  //! (x - mean) / 2^exponent without forming x - mean, which can overflow ({max, -max, -max}).
  [[nodiscard]] double scaled_deviation(double x) const noexcept { return std::ldexp(x, -exponent) - scaled_mean; }
  //! Variance / 2^(2 exponent): unbiased (n-1) or biased (n); 0 for fewer than 2 (unbiased) or 1 (biased) values.
  [[nodiscard]] double scaled_variance(bool unbiased) const noexcept {
    if (unbiased) return count >= 2 ? scaled_m2 / static_cast<double>(count - 1) : 0.0;
    return count >= 1 ? scaled_m2 / static_cast<double>(count) : 0.0;
  }
  //! Standard deviation / 2^exponent, always finite.
  [[nodiscard]] double scaled_stddev(bool unbiased) const noexcept { return std::sqrt(scaled_variance(unbiased)); }
  //! Unbiased or biased variance; +inf where it exceeds the double range.
  [[nodiscard]] double variance(bool unbiased) const noexcept {
    return std::ldexp(scaled_variance(unbiased), 2 * exponent);
  }
  //! Standard deviation; +inf only where it exceeds the double range (above max / sqrt(2) or so).
  [[nodiscard]] double stddev(bool unbiased) const noexcept { return std::ldexp(scaled_stddev(unbiased), exponent); }
};

//! The moments (see two_pass_moments below) of the values that `for_each(f)` passes to f, one by
//! one, in the same order on each of its three calls (e.g. the valid tokens of a masked batch,
//! without copying them).
template <class ForEach>
[[nodiscard]] moments visited_moments(ForEach&& for_each) {
  moments m;
  std::size_t n = 0;
  double biggest = 0.0;
  for_each([&](auto x) {
    const double a = std::fabs(static_cast<double>(x));
    biggest = (a > biggest || a != a) ? a : biggest;  // NaN sticks
    ++n;
  });
  m.count = n;
  if (n == 0) return m;
  if (!std::isfinite(biggest)) {
    m.mean = m.m2 = m.scaled_mean = m.scaled_m2 = std::numeric_limits<double>::quiet_NaN();
    return m;
  }
  // 2^exponent > biggest: the scaled values are below 1 in magnitude, their sum below n.
  m.exponent = biggest > 0.0 ? std::ilogb(biggest) + 1 : 0;
  const auto scaled = [&](auto x) { return std::ldexp(static_cast<double>(x), -m.exponent); };
  double s = 0.0, lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for_each([&](auto x) {
    const double y = scaled(x);
    s += y;
    lo = y < lo ? y : lo;
    hi = y > hi ? y : hi;
  });
  // The mean lies between the extremes; rounding of the sum must not push it outside (nor past max).
  m.scaled_mean = clamp(s / static_cast<double>(n), lo, hi);
  m.mean = std::ldexp(m.scaled_mean, m.exponent);
  double m2 = 0.0, c = 0.0;
  for_each([&](auto x) {
    const double d = scaled(x) - m.scaled_mean;
    m2 += d * d;
    c += d;
  });
  m.scaled_m2 = m2 - c * c / static_cast<double>(n);
  if (m.scaled_m2 < 0.0) m.scaled_m2 = 0.0;
  m.m2 = std::ldexp(m.scaled_m2, 2 * m.exponent);
  return m;
}

//! Moments of value(i) for i in [0, n) (`value` is any callable i -> arithmetic, called three times
//! per index): the largest magnitude (for the scale), the scaled mean, then the scaled deviations
//! with the compensation term Σ (x - mean), which is ~0 but absorbs the rounding of the mean.
//! Finite values give finite `mean`, `scaled_m2` and `scaled_stddev`; a non-finite value gives NaN.
template <class F>
[[nodiscard]] moments two_pass_moments(std::size_t n, F&& value) {
  return visited_moments([&](auto&& f) {
    for (std::size_t i = 0; i < n; ++i) f(value(i));
  });
}

ULORL_NAMESPACE_END
