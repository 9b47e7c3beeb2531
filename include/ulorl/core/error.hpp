// ulorl/core/error.hpp — `ulorl::error`, the one exception type of the host API, and the helpers
// that build its message: "ulorl::<function>: argument '<arg>'[<index>] = <value>: <what>".
// Preconditions are checked at the API boundary before any output is written (see docs/design.md).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "ulorl/core/config.hpp"

ULORL_NAMESPACE_BEGIN

//! Raised for every rejected input of the host API. `function()` and `argument()` name the
//! boundary and the offending argument; `index()` is the flat element index or -1 when none.
class error : public std::invalid_argument {
 public:
  error(std::string_view function, std::string_view argument, std::int64_t index, const std::string& what)
      : std::invalid_argument(what), function_(function), argument_(argument), index_(index) {}
  [[nodiscard]] const std::string& function() const noexcept { return function_; }
  [[nodiscard]] const std::string& argument() const noexcept { return argument_; }
  [[nodiscard]] std::int64_t index() const noexcept { return index_; }

 private:
  std::string function_;
  std::string argument_;
  std::int64_t index_;
};

namespace detail {

template <class V>
void append_value(std::ostringstream& os, const V& value) {
  if constexpr (std::is_floating_point_v<V>) {
    os.precision(17);
    os << value;
  } else if constexpr (std::is_same_v<V, bool>) {
    os << (value ? "true" : "false");
  } else if constexpr (std::is_integral_v<V> && sizeof(V) == 1) {
    os << static_cast<int>(value);
  } else {
    os << value;
  }
}

[[noreturn]] inline void raise(std::string_view function, std::string_view argument, std::int64_t index,
                               const std::string& message) {
#ifdef ULORL_NO_EXCEPTIONS
  std::fprintf(stderr, "%s\n", message.c_str());
  std::abort();
#else
  throw error(function, argument, index, message);
#endif
}

//! Throws with a message naming the function, the argument and a free-text reason.
[[noreturn]] inline void fail(std::string_view function, std::string_view argument, std::string_view what) {
  std::ostringstream os;
  os << "ulorl::" << function << ": argument '" << argument << "': " << what;
  raise(function, argument, -1, os.str());
}

//! Throws with a message naming the function, the argument, the offending element and its value.
template <class V>
[[noreturn]] void fail_at(std::string_view function, std::string_view argument, std::int64_t index,
                          const V& value, std::string_view what) {
  std::ostringstream os;
  os << "ulorl::" << function << ": argument '" << argument << "'[" << index << "] = ";
  append_value(os, value);
  os << ": " << what;
  raise(function, argument, index, os.str());
}

//! Throws naming an argument whose scalar value is out of range.
template <class V>
[[noreturn]] void fail_value(std::string_view function, std::string_view argument, const V& value,
                             std::string_view what) {
  std::ostringstream os;
  os << "ulorl::" << function << ": argument '" << argument << "' = ";
  append_value(os, value);
  os << ": " << what;
  raise(function, argument, -1, os.str());
}

}  // namespace detail

//! Convenience checks used at API boundaries.
template <class V>
void require_finite(std::string_view function, std::string_view argument, V value) {
  if (!std::isfinite(static_cast<double>(value)))
    detail::fail_value(function, argument, value, "must be finite");
}
//! A floating option is never NaN, whether or not the call uses it (an unused NaN option is a
//! caller's bug all the same); an absent optional passes.
inline void require_not_nan(std::string_view function, std::string_view argument, double value) {
  if (std::isnan(value)) detail::fail_value(function, argument, value, "must not be NaN");
}
inline void require_not_nan(std::string_view function, std::string_view argument, const std::optional<double>& value) {
  if (value) require_not_nan(function, argument, *value);
}
template <class V>
void require_positive(std::string_view function, std::string_view argument, V value) {
  if (!(value > V(0)) || !std::isfinite(static_cast<double>(value)))
    detail::fail_value(function, argument, value, "must be finite and > 0");
}
template <class V>
void require_non_negative(std::string_view function, std::string_view argument, V value) {
  if (!(value >= V(0)) || !std::isfinite(static_cast<double>(value)))
    detail::fail_value(function, argument, value, "must be finite and >= 0");
}
namespace detail {
template <class T>
[[nodiscard]] constexpr const char* range_type_name() noexcept {
  return sizeof(T) == 4 ? "float32" : "float64";
}
}  // namespace detail
//! A divisor taken from a configuration or a caller (an eps, a temperature, tau, a normaliser, a
//! global count, a size as a double): finite, > 0, and with a reciprocal that is finite in T (the
//! arithmetic type that divides by it): a subnormal such as 5e-324 has 1 / x = inf and is rejected.
//! `signed_ok`: a negative divisor is allowed too (only 0 is not).
template <class T = double, class V>
void require_divisor(std::string_view function, std::string_view argument, V value, bool signed_ok = false) {
  if (!signed_ok) require_positive(function, argument, value);
  else if (!std::isfinite(static_cast<double>(value)) || value == V(0))
    detail::fail_value(function, argument, value, "must be finite and non-zero");
  if (!(std::fabs(1.0 / static_cast<double>(value)) <= static_cast<double>(std::numeric_limits<T>::max())))
    detail::fail_value(function, argument, value,
                       std::string("its reciprocal overflows ") + detail::range_type_name<T>() + " (a divisor must have a finite reciprocal)");
}
//! A result of `function` (a loss, a gradient, a KL value, an advantage, a metric) must lie within
//! the range of its output type T: one beyond it (or NaN from finite inputs) is an error, never
//! inf. `what` names the result and `index` its flat element (-1 for a scalar). The message:
//! "ulorl::<function>: result '<what>'[<index>] = inf: overflows float32".
template <class T>
void require_result_in_range(std::string_view function, std::string_view what, std::int64_t index, double value,
                             std::string_view where = {}) {
  if (std::fabs(value) <= static_cast<double>(std::numeric_limits<T>::max())) return;
  std::ostringstream os;
  os << "ulorl::" << function << ": result '" << what << "'";
  if (index >= 0) os << "[" << index << "]";
  os << " = ";
  detail::append_value(os, value);
  os << (value != value ? ": is NaN" : ": overflows ") << (value != value ? "" : detail::range_type_name<T>())
     << (where.empty() ? "" : " (") << where << (where.empty() ? "" : ")")
     << ": a result beyond the output type's range is an error";
  detail::raise(function, what, index, os.str());
}
namespace detail {
template <class E>
[[nodiscard]] constexpr long long enum_value(E value) noexcept {
  return static_cast<long long>(static_cast<std::underlying_type_t<E>>(value));
}
//! "unknown enum value (known: 0, 1, 2)", the reason given by require_known and require_known_at.
template <class... Known>
[[nodiscard]] std::string unknown_enum_value(Known... known) {
  std::ostringstream os;
  os << "unknown enum value";
  const char* sep = " (known: ";
  ((os << sep << enum_value(known), sep = ", "), ...);
  os << ")";
  return os.str();
}
}  // namespace detail

//! An enum argument must hold one of its named values: a value cast from a wrong integer or read
//! from a corrupted config or checkpoint is rejected here, at validation, instead of falling into
//! some branch. The message names the argument, the value and the known values. constexpr so that
//! constexpr functions (the presets) can validate their enum arguments.
template <class E, class... Known>
constexpr void require_known(std::string_view function, std::string_view argument, E value, Known... known) {
  static_assert(std::is_enum_v<E> && sizeof...(Known) > 0 && (std::is_same_v<E, Known> && ...));
  if (((value != known) && ...))
    detail::fail_value(function, argument, detail::enum_value(value), detail::unknown_enum_value(known...));
}
//! The same for element `index` of an array argument (a record of a restored state).
template <class E, class... Known>
constexpr void require_known_at(std::string_view function, std::string_view argument, std::int64_t index, E value,
                                Known... known) {
  static_assert(std::is_enum_v<E> && sizeof...(Known) > 0 && (std::is_same_v<E, Known> && ...));
  if (((value != known) && ...))
    detail::fail_at(function, argument, index, detail::enum_value(value), detail::unknown_enum_value(known...));
}
//! The value that `name` maps to in `table` (entries of a name and a value, e.g. std::pair or any
//! two-member aggregate): the one parser of every `*_from_name`. An unknown name throws
//! ulorl::error "unknown name 'x' (known: a, b, ...)".
template <class Table>
[[nodiscard]] auto value_of_name(std::string_view function, std::string_view argument, std::string_view name,
                                 const Table& table) {
  for (const auto& [n, v] : table)
    if (n == name) return v;
  std::string what = "unknown name '" + std::string(name) + "' (known:";
  const char* sep = " ";
  for (const auto& [n, v] : table) what += sep + std::string(n), sep = ", ";
  detail::fail(function, argument, what + ")");
}
inline void require_same_size(std::string_view function, std::string_view argument, std::size_t actual,
                              std::string_view reference, std::size_t expected) {
  if (actual != expected) {
    std::ostringstream os;
    os << "has " << actual << " elements but '" << reference << "' has " << expected;
    detail::fail(function, argument, os.str());
  }
}

ULORL_NAMESPACE_END
