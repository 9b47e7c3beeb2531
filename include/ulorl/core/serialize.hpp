// ulorl/core/serialize.hpp — the byte-level encoding shared by every checkpoint format of ulorl
// (controllers, segment scheduler): fixed-width little-endian integers, doubles as their IEEE-754
// bit pattern (so -0.0, infinities and NaN payloads round-trip exactly on any host), and a reader
// that turns every overrun or malformed field into a ulorl::error naming the byte offset.
// A record with a field table (core/fields.hpp's visit_fields) is written and read through that
// table alone, so its field list is written once for save and restore:
//   write_fields(w, r)                 r's fields, in the table's order
//   read_fields(r, x, prefix, absent)  the inverse; errors name a field as prefix + its path
// Each field's bytes follow from its C++ type: a bool is one byte 0 / 1 (any other value is
// rejected), an enum its underlying integer, an integer its own width (std::size_t as u64), a
// double its f64 bit pattern, a record its own fields in order, and a std::vector<X> a u64
// count and then its elements (read_fields bounds the count by the bytes left over the fewest bytes
// an X takes, min_field_bytes<X>, before it allocates).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/fields.hpp"

ULORL_NAMESPACE_BEGIN
namespace detail {

//! An integer field of any fixed width (bool is a field of its own).
template <class T>
concept wire_integer = std::is_integral_v<T> && !std::is_same_v<T, bool>;
//! The bytes of an integer field: its own width; std::size_t is always 8.
template <wire_integer T>
inline constexpr int integer_bytes = std::is_same_v<T, std::size_t> ? 8 : static_cast<int>(sizeof(T));

//! Appends fixed-width little-endian fields to a byte vector.
class byte_writer {
 public:
  explicit byte_writer(std::vector<std::byte>& out) : out_(out) {}
  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u16(std::uint16_t v) { put(v, 2); }
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void i32(std::int32_t v) { put(static_cast<std::uint32_t>(v), 4); }
  void i64(std::int64_t v) { put(static_cast<std::uint64_t>(v), 8); }
  void f64(double v) { put(ulorl::detail::bit_cast<std::uint64_t>(v), 8); }
  void boolean(bool v) { u8(v ? 1u : 0u); }
  //! Any integer in integer_bytes<T> bytes (a negative one in two's complement, as i32 / i64).
  template <wire_integer T>
  void integer(T v) {
    put(static_cast<std::uint64_t>(v), integer_bytes<T>);
  }

 private:
  void put(std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xFFu));
  }
  std::vector<std::byte>& out_;
};

//! Reads what byte_writer wrote. `fn` and `arg` name the API call and the buffer argument in errors;
//! `what` names the field being read.
class byte_reader {
 public:
  byte_reader(std::span<const std::byte> in, std::string_view fn, std::string_view arg = "bytes")
      : in_(in), fn_(fn), arg_(arg) {}
  std::uint8_t u8(std::string_view what = "field") { return static_cast<std::uint8_t>(get(1, what)); }
  std::uint16_t u16(std::string_view what = "field") { return static_cast<std::uint16_t>(get(2, what)); }
  std::uint32_t u32(std::string_view what = "field") { return static_cast<std::uint32_t>(get(4, what)); }
  std::uint64_t u64(std::string_view what = "field") { return get(8, what); }
  std::int32_t i32(std::string_view what = "field") { return static_cast<std::int32_t>(get(4, what)); }
  std::int64_t i64(std::string_view what = "field") { return static_cast<std::int64_t>(get(8, what)); }
  double f64(std::string_view what = "field") { return ulorl::detail::bit_cast<double>(get(8, what)); }
  //! What byte_writer::integer<T> wrote.
  template <wire_integer T>
  T integer(std::string_view what = "field") {
    return static_cast<T>(get(static_cast<std::size_t>(integer_bytes<T>), what));
  }
  bool boolean(std::string_view what = "field") {
    const auto at = pos_;
    const auto v = u8(what);
    if (v > 1u)
      fail_at(fn_, arg_, static_cast<std::int64_t>(at), static_cast<unsigned>(v),
              "boolean field '" + std::string(what) + "' must be 0 or 1");
    return v == 1u;
  }
  //! A vector length, bounded by the bytes left so a corrupted count cannot trigger a huge allocation.
  std::size_t count(std::string_view what, std::size_t min_element_bytes) {
    const std::uint64_t n = u64(what);
    if (min_element_bytes > 0 && n > remaining() / min_element_bytes)
      fail_value(fn_, arg_, n, "corrupted: count of '" + std::string(what) + "' exceeds the remaining bytes");
    return static_cast<std::size_t>(n);
  }
  [[nodiscard]] std::size_t position() const noexcept { return pos_; }
  [[nodiscard]] std::size_t remaining() const noexcept { return in_.size() - pos_; }

 private:
  std::uint64_t get(std::size_t bytes, std::string_view what) {
    if (remaining() < bytes)
      fail_value(fn_, arg_, in_.size(),
                 "truncated: field '" + std::string(what) + "' at byte " + std::to_string(pos_) + " needs " +
                     std::to_string(bytes) + " bytes");
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(in_[pos_ + i]) << (8 * i);
    pos_ += bytes;
    return v;
  }
  std::span<const std::byte> in_;
  std::string_view fn_;
  std::string_view arg_;
  std::size_t pos_ = 0;
};

template <class X>
struct vector_element {
  using type = void;
};
template <class T, class A>
struct vector_element<std::vector<T, A>> {
  using type = T;
};

//! The fewest bytes a field of type X takes (a vector: its count alone).
template <class X>
constexpr std::size_t min_field_bytes() {
  if constexpr (!std::is_void_v<typename vector_element<X>::type>) {
    return 8;
  } else if constexpr (record<X>) {
    std::size_t n = 0;
    X x{};
    visit_fields(x, [&](std::string_view, const auto& y) { n += min_field_bytes<std::remove_cvref_t<decltype(y)>>(); });
    return n;
  } else if constexpr (std::is_enum_v<X>) {
    return min_field_bytes<std::underlying_type_t<X>>();
  } else if constexpr (std::is_same_v<X, bool>) {
    return 1;
  } else if constexpr (std::is_same_v<X, double>) {
    return 8;
  } else {
    static_assert(wire_integer<X>, "a field is a bool, enum, integer, double, record or vector");
    return integer_bytes<X>;
  }
}

//! Appends the field `x` (its bytes as the header comment lists them).
template <class X>
void write_field(byte_writer& w, const X& x) {
  if constexpr (!std::is_void_v<typename vector_element<X>::type>) {
    w.u64(x.size());
    for (const auto& e : x) write_field(w, e);
  } else if constexpr (record<X>) {
    visit_fields(x, [&](std::string_view, const auto& y) { write_field(w, y); });
  } else if constexpr (std::is_same_v<X, bool>) {
    w.boolean(x);
  } else if constexpr (std::is_enum_v<X>) {
    write_field(w, static_cast<std::underlying_type_t<X>>(x));
  } else if constexpr (std::is_same_v<X, double>) {
    w.f64(x);
  } else {
    static_assert(wire_integer<X>, "a field is a bool, enum, integer, double, record or vector");
    w.integer(x);
  }
}

//! Appends the fields of the record `r`, in its table's order.
template <class R>
void write_fields(byte_writer& w, const R& r) {
  static_assert(record<R>, "write_fields needs a record with a visit_fields table");
  write_field(w, r);
}

//! Reads records field by field; `path` is the name of the field being read (prefix, the names of
//! the records and vectors it lies in, each followed by '.', and its own name), kept in one buffer.
class field_reader {
 public:
  field_reader(byte_reader& in, std::string_view prefix, std::span<const std::string_view> absent)
      : in_(in), path_(prefix), absent_(absent) {}

  template <class R>
  void fields(R& r) {
    visit_fields(r, [&](std::string_view name, auto& x) { field(name, x); });
  }

 private:
  template <class X>
  void field(std::string_view name, X& x) {
    const std::size_t at = path_.size();
    path_ += name;
    if (!is_absent()) value(x);
    path_.resize(at);
  }
  [[nodiscard]] bool is_absent() const noexcept {
    for (const auto a : absent_)
      if (a == path_) return true;
    return false;
  }
  template <class X>
  void value(X& x) {
    using E = typename vector_element<X>::type;
    if constexpr (!std::is_void_v<E>) {
      constexpr std::size_t element_bytes = min_field_bytes<E>();
      x.resize(in_.count(path_, element_bytes));
      if constexpr (record<E>) {  // an element's fields are named under the vector's name
        path_ += '.';
        for (auto& e : x) fields(e);
      } else {  // an element is named as the vector
        for (auto& e : x) leaf(e);
      }
    } else if constexpr (record<X>) {
      path_ += '.';
      fields(x);
    } else {
      leaf(x);
    }
  }
  //! A bool, enum, double or integer, named `path_`.
  template <class X>
  void leaf(X& x) {
    if constexpr (std::is_same_v<X, bool>) {
      x = in_.boolean(path_);
    } else if constexpr (std::is_enum_v<X>) {  // the state's validation rejects the values no name has
      std::underlying_type_t<X> u{};
      leaf(u);
      x = static_cast<X>(u);
    } else if constexpr (std::is_same_v<X, double>) {
      x = in_.f64(path_);
    } else {
      static_assert(wire_integer<X>, "a field is a bool, enum, integer, double, record or vector");
      x = in_.integer<X>(path_);
    }
  }

  byte_reader& in_;
  std::string path_;
  std::span<const std::string_view> absent_;
};

//! Reads the fields of the record `x` as write_fields wrote them. Errors name a field as `prefix`
//! followed by its path ("state.coef", "groups.status", "responses.spans.begin"). The fields whose
//! full names `absent` lists are not in the bytes (an older layout) and keep their values in `x`.
template <class R>
void read_fields(byte_reader& in, R& x, std::string_view prefix = {}, std::span<const std::string_view> absent = {}) {
  static_assert(record<R>, "read_fields needs a record with a visit_fields table");
  field_reader(in, prefix, absent).fields(x);
}

}  // namespace detail
ULORL_NAMESPACE_END
