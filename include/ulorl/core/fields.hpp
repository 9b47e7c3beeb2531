// ulorl/core/fields.hpp — records as flat arrays of doubles: the form an operator schema carries
// (`float[]` in, one float64 tensor out). A record is a struct with a field table,
//   visit_fields(record, f)   f(name, field&) for every field, in a fixed order,
// defined in its area's fields.hpp (found by argument-dependent lookup). A field is a double, a
// bool, an enum, a std::size_t (a count up to 2^53), a bounded_count (a count up to its bound), a
// std::optional of one of those, a record (visited whole: its fields follow in its own table's
// order) or a std::optional of a record. The table is the only list of the struct's fields outside the struct:
// the encodings, the operators' schemas and the Python surface are derived from it. The
// checkpoints write and read the same tables as bytes (core/serialize.hpp's write_fields /
// read_fields), where a field may also be a fixed-width integer or a std::vector; the functions
// below take the field kinds listed here.
//   encoded_size_of<R>        number of doubles of R's encoding
//   encode_fields(r)          the doubles (numbers as they are, enums as their values, bools 0 / 1,
//                             an optional as 0 / 1 and then its value's fields)
//   decode_fields<R>(fn, arg, doubles)   the inverse; a malformed array is ulorl::error naming fn,
//                             arg, the field and its index
//   field_names<R>()          the names of the encoded doubles, in order
// A record names itself in errors through record_name<R>.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN

//! A count field whose decoded value must not exceed Max (e.g. the used size of a fixed array the
//! record also visits); a table visits it as a local `bounded_count<std::size_t, Max> c{s.size}`
//! (`const std::size_t` in a const visit).
template <class T, std::size_t Max>
struct bounded_count {
  T& value;
};

//! The name of a record in errors ("an encoded <name> has N values"); specialise beside its table.
template <class R>
inline constexpr std::string_view record_name = "record";

namespace detail {

template <class S, class T>
concept record_of = std::is_same_v<std::remove_const_t<S>, T>;
//! T, const when S is (a table's local views of fields in a const visit).
template <class S, class T>
using like_const = std::conditional_t<std::is_const_v<S>, const T, T>;

template <class X>
struct bound_of {
  static constexpr bool counted = false;
};
template <class T, std::size_t Max>
struct bound_of<bounded_count<T, Max>> {
  static constexpr bool counted = true;
  static constexpr std::size_t max = Max;
};

struct any_field_visitor {
  template <class X>
  constexpr void operator()(std::string_view, X&) const noexcept {}
};

template <class R>
concept record = std::is_class_v<R> && requires(R& r) {
  visit_fields(r, any_field_visitor{});
};

template <class X>
struct optional_value {
  using type = void;
};
template <class X>
struct optional_value<std::optional<X>> {
  using type = X;
};

template <class X>
constexpr std::size_t encoded_width();

template <class R>
constexpr std::size_t encoded_record_size() {
  std::size_t n = 0;
  R r{};
  visit_fields(r, [&](std::string_view, auto& x) { n += encoded_width<std::remove_cvref_t<decltype(x)>>(); });
  return n;
}

//! Number of doubles a field takes in the flat encoding.
template <class X>
constexpr std::size_t encoded_width() {
  using V = typename optional_value<X>::type;
  if constexpr (record<X>)
    return encoded_record_size<X>();
  else if constexpr (record<V>)
    return 1 + encoded_record_size<V>();  // present?, the fields
  else if constexpr (!std::is_void_v<V>)
    return 1 + encoded_width<V>();  // present?, value
  else
    return 1;
}

template <class X>
void encode_field(std::span<double> out, std::size_t& i, const X& x) noexcept {
  using V = typename optional_value<X>::type;
  if constexpr (record<X>) {
    visit_fields(x, [&](std::string_view, const auto& y) { encode_field(out, i, y); });
  } else if constexpr (record<V>) {
    out[i++] = x ? 1.0 : 0.0;
    const V v = x.value_or(V{});
    visit_fields(v, [&](std::string_view, const auto& y) { encode_field(out, i, y); });
  } else if constexpr (!std::is_void_v<V>) {  // an optional number or enum: present?, value
    out[i++] = x ? 1.0 : 0.0;
    encode_field(out, i, x.value_or(V{}));
  } else if constexpr (bound_of<X>::counted) {
    out[i++] = static_cast<double>(x.value);
  } else if constexpr (std::is_enum_v<X>) {
    out[i++] = static_cast<double>(static_cast<std::int64_t>(x));
  } else {
    out[i++] = static_cast<double>(x);
  }
}

//! One name per encoded double: a record's fields as "<name>.<field>", an optional's presence as its
//! name and its value as "<name>.value" (a double) or its record's fields.
template <class X>
void leaf_names(std::vector<std::string>& out, const std::string& name) {
  using V = typename optional_value<X>::type;
  const auto fields = [&](auto r) {
    visit_fields(r, [&](std::string_view n, auto& y) {
      leaf_names<std::remove_cvref_t<decltype(y)>>(out, name + "." + std::string(n));
    });
  };
  if constexpr (record<X>) {
    fields(X{});
  } else if constexpr (record<V>) {
    out.push_back(name);
    fields(V{});
  } else if constexpr (!std::is_void_v<V>) {
    out.push_back(name);
    leaf_names<V>(out, name + ".value");
  } else {
    out.push_back(name);
  }
}

//! Reads field `prefix` + `name` from `in` at `pos` (advancing it): an enum is an integer value (the
//! function given the record then rejects the values no name has), a count a non-negative integer
//! up to 2^53 (a bounded_count up to its bound), a bool 0 or 1. The field's full name is formed only for an error.
template <class X>
void decode_field(std::string_view fn, std::string_view arg, std::string_view prefix, std::string_view name,
                  std::span<const double> in, std::size_t& pos, X& x) {
  using V = typename optional_value<X>::type;
  const auto next = [&] { return in[pos++]; };
  const auto full = [&] { return std::string(prefix) + std::string(name); };
  const auto integer = [&](double v, double hi) {
    if (!(v >= 0 && v <= hi && v == std::floor(v)))
      fail_value(fn, arg, v,
                 "field '" + full() + "' (index " + std::to_string(pos - 1) + ") must be an integer in [0, " +
                     std::to_string(static_cast<std::int64_t>(hi)) + "]");
    return static_cast<std::int64_t>(v);
  };
  const auto fields = [&](auto& r) {
    const std::string sub = full() + ".";
    visit_fields(r, [&](std::string_view n, auto& y) { decode_field(fn, arg, sub, n, in, pos, y); });
  };
  if constexpr (record<X>) {
    fields(x);
  } else if constexpr (record<V>) {
    const bool present = integer(next(), 1) != 0;
    V v{};
    fields(v);
    x = present ? std::optional<V>(v) : std::nullopt;
  } else if constexpr (!std::is_void_v<V>) {
    const bool present = integer(next(), 1) != 0;
    V v{};
    decode_field(fn, arg, full() + ".", "value", in, pos, v);
    x = present ? std::optional<V>(v) : std::nullopt;
  } else if constexpr (std::is_same_v<X, bool>) {
    x = integer(next(), 1) != 0;
  } else if constexpr (std::is_enum_v<X>) {  // within the underlying type: no value wraps onto a named one
    using U = std::underlying_type_t<X>;
    constexpr double hi = std::numeric_limits<U>::max() < (1 << 30) ? static_cast<double>(std::numeric_limits<U>::max())
                                                                    : static_cast<double>(1 << 30);
    x = static_cast<X>(integer(next(), hi));
  } else if constexpr (std::is_same_v<X, std::size_t>) {
    x = static_cast<std::size_t>(integer(next(), 9007199254740992.0));
  } else if constexpr (bound_of<X>::counted) {
    x.value = static_cast<std::size_t>(integer(next(), static_cast<double>(bound_of<X>::max)));
  } else {
    static_assert(std::is_same_v<X, double>, "a field is a double, bool, enum, count, optional or record");
    x = next();
  }
}

}  // namespace detail

//! Number of doubles of encode_fields' array of a record R.
template <class R>
inline constexpr std::size_t encoded_size_of = detail::encoded_record_size<R>();

//! Writes the record's encoded_size_of<R> doubles, in visit_fields' order, to `out` (that long).
template <class R>
void encode_fields_into(const R& r, std::span<double> out) noexcept {
  std::size_t i = 0;
  visit_fields(r, [&](std::string_view, const auto& x) { detail::encode_field(out, i, x); });
}

//! The record as encoded_size_of<R> doubles, in visit_fields' order.
template <class R>
[[nodiscard]] std::vector<double> encode_fields(const R& r) {
  std::vector<double> out(encoded_size_of<R>);
  encode_fields_into(r, std::span<double>(out));
  return out;
}

//! The inverse of encode_fields; a wrong length, a bool other than 0 / 1 or a non-integral enum or
//! count throws ulorl::error naming `fn`, `arg`, the field and its index. Values are not otherwise
//! checked here: the function given the record validates it.
template <class R>
[[nodiscard]] R decode_fields(std::string_view fn, std::string_view arg, std::span<const double> in) {
  if (in.size() != encoded_size_of<R>)
    detail::fail(fn, arg,
                 "has " + std::to_string(in.size()) + " values but an encoded " + std::string(record_name<R>) +
                     " has " + std::to_string(encoded_size_of<R>) + " (encode_fields)");
  R r{};
  std::size_t pos = 0;
  visit_fields(r, [&](std::string_view name, auto& x) { detail::decode_field(fn, arg, "", name, in, pos, x); });
  return r;
}

//! The names of the doubles of R's encoding, in order (field_names<R>()[i] names
//! encode_fields(r)[i]; nested fields as "<record>.<field>").
template <class R>
[[nodiscard]] std::vector<std::string> field_names() {
  std::vector<std::string> names;
  names.reserve(encoded_size_of<R>);
  R r{};
  visit_fields(r, [&](std::string_view n, auto& x) {
    detail::leaf_names<std::remove_cvref_t<decltype(x)>>(names, std::string(n));
  });
  return names;
}

ULORL_NAMESPACE_END
