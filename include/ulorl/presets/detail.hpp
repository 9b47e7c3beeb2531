// ulorl/presets/detail.hpp — what the framework presets share: the parser of a framework's option
// names (`*_from_name`), the check of a framework's subset of KL estimators, and the text helpers
// of the option strings read from configuration files (verl's "l_u" thresholds and "a, b" lists).
// Not part of the API: each framework's header (ulorl/presets/<framework>.hpp) uses these.
#pragma once

#include <array>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/loss/kl.hpp"

ULORL_NAMESPACE_BEGIN
namespace presets::detail {

template <class E>
struct name_entry {
  std::string_view name;
  E value;
};
//! The value of `name` in `table`; an unknown name throws ulorl::error listing the known ones.
template <class E, std::size_t N>
[[nodiscard]] E parse(std::string_view fn, std::string_view arg, std::string_view name, const name_entry<E> (&table)[N]) {
  return value_of_name(fn, arg, name, table);
}
//! The subset of KL estimators a framework offers.
inline void require_estimator(std::string_view fn, std::string_view arg, kl_estimator e, bool offered) {
  require_known(fn, arg, e, kl_estimator::k1, kl_estimator::abs, kl_estimator::k2, kl_estimator::k3);
  if (!offered) ulorl::detail::fail_value(fn, arg, static_cast<int>(e), "this framework does not offer that estimator");
}

//! `s` without leading and trailing blanks (space, tab, newline, carriage return).
[[nodiscard]] inline std::string_view strip(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}
//! A finite number spelling the whole (stripped) text, else nothing.
[[nodiscard]] inline std::optional<double> number(std::string_view s) noexcept {
  s = strip(s);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}
//! The pieces of `s` between the separators (an empty text gives one empty piece).
[[nodiscard]] inline std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (std::size_t p = 0;;) {
    const std::size_t q = s.find(sep, p);
    out.push_back(s.substr(p, q == std::string_view::npos ? std::string_view::npos : q - p));
    if (q == std::string_view::npos) return out;
    p = q + 1;
  }
}
//! The shortest text of a double that reads back to it (Python's str of a float, up to format).
[[nodiscard]] inline std::string text_of(double v) {
  std::array<char, 64> buf{};
  const auto r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), r.ptr);
}

}  // namespace presets::detail
ULORL_NAMESPACE_END
