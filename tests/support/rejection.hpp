// tests/support/rejection.hpp — bad-input test helpers: batch shapes (padded or packed) and
// shapes that differ from them (some with the same element count, so that only a real shape
// comparison catches them), and the check that a call threw ulorl::error naming the function, the
// argument and the flat index. Internal linkage (anonymous namespace), like the tests' own helpers.
#pragma once

#include <ulorl/core/error.hpp>
#include <ulorl/core/ragged.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"

namespace {
//! The argument named by the ulorl::error that `f()` throws, or "<no error>" when it returns.
template <class F>
std::string arg_of(F&& f) {
  try {
    f();
  } catch (const ulorl::error& e) {
    return e.argument();
  }
  return "<no error>";
}

//! A batch layout of the tests: padded [B, T] when `offsets` is empty, else packed by `offsets`.
struct shape {
  std::size_t B = 0, T = 0;
  std::vector<std::int64_t> offsets;
  [[nodiscard]] std::size_t size() const { return offsets.empty() ? B * T : static_cast<std::size_t>(offsets.back()); }
  [[nodiscard]] std::size_t rows() const { return offsets.empty() ? B : offsets.size() - 1; }
  [[nodiscard]] std::size_t row_begin(std::size_t b) const { return offsets.empty() ? b * T : static_cast<std::size_t>(offsets[b]); }
  [[nodiscard]] std::size_t row_size(std::size_t b) const { return offsets.empty() ? T : static_cast<std::size_t>(offsets[b + 1] - offsets[b]); }
};
template <class V>
ulorl::token_view<V> view_of(V* data, const shape& s) {
  if (s.offsets.empty()) return ulorl::token_view<V>::padded(ulorl::matrix_view<V>(data, s.B, s.T));
  return ulorl::token_view<V>::packed(ulorl::vector_view<V>(data, s.size()), std::span<const std::int64_t>(s.offsets));
}
//! A padded [B, T] view of `data`.
template <class V>
ulorl::token_view<V> padded_of(V* data, std::size_t B, std::size_t T) {
  return view_of(data, shape{B, T, {}});
}
//! Shapes that differ from `s` (padded [3, 4] or packed {0, 3, 3, 7, 12}) but some of which have the
//! same element count, so that only a real shape comparison catches them.
inline std::vector<shape> wrong_shapes(const shape& s) {
  if (s.offsets.empty())
    return {{s.B, s.T + 1, {}}, {s.B + 1, s.T, {}}, {s.T, s.B, {}}, {0, 0, {0, 4, 8, 12}}, {0, 0, {0, 5, 8, 12}}};
  return {{0, 0, {0, 3, 4, 7, 12}}, {0, 0, {0, 3, 3, 7, 13}}, {0, 0, {0, 3, 7, 12}}, {1, 12, {}}, {4, 3, {}}};
}
const shape padded_shape{3, 4, {}};
const shape packed_shape{0, 0, {0, 3, 3, 7, 12}};  // row 1 empty

//! What a call threw (or that it threw nothing).
struct outcome {
  bool threw = false;
  std::string function, argument, what;
  std::int64_t index = -2;
};
template <class F>
outcome outcome_of(F&& f) {
  outcome o;
  try {
    f();
  } catch (const ulorl::error& e) {
    o = {true, e.function(), e.argument(), e.what(), e.index()};
  }
  return o;
}
inline void require_rejected(const outcome& o, const std::string& fn, const std::string& arg, std::int64_t index) {
  INFO("expected " << fn << " '" << arg << "'[" << index << "], got: " << (o.threw ? o.what : std::string("no error")));
  REQUIRE(o.threw);
  REQUIRE(o.function == fn);
  REQUIRE(o.argument == arg);
  REQUIRE(o.index == index);
  REQUIRE(o.what.find("ulorl::" + fn) != std::string::npos);
  REQUIRE(o.what.find("'" + arg + "'") != std::string::npos);
  if (index >= 0) REQUIRE(o.what.find("'[" + std::to_string(index) + "]") != std::string::npos);
}
//! `f()` must throw the ulorl::error of require_known / require_known_at for `value` of argument
//! `arg` (element `index`, -1 for none) of `fn`: "ulorl::<fn>: argument '<arg>'[[<index>]] = <value>:
//! unknown enum value (known: ...)".
template <class F>
void require_unknown_enum(F&& f, const std::string& fn, const std::string& arg, long long value,
                          std::int64_t index = -1) {
  const outcome o = outcome_of(std::forward<F>(f));
  require_rejected(o, fn, arg, index);
  const std::string element = index >= 0 ? "[" + std::to_string(index) + "]" : "";
  REQUIRE_THAT(o.what, Catch::StartsWith("ulorl::" + fn + ": argument '" + arg + "'" + element + " = " +
                                         std::to_string(value) + ": unknown enum value (known: "));
}
template <class V>
bool all_equal(const std::vector<V>& v, V x) {
  return std::all_of(v.begin(), v.end(), [&](V y) { return y == x; });
}

//! Masks that are not 0/1 at two positions of `base` (a uint8 2; double and float 0.5, 2, -1, NaN):
//! each call must throw naming "mask" and the flat index and leave the output untouched.
//! `Case<M>(base)` holds `mask` and `run()`; `out(c)` is its output, pre-filled with `sentinel`.
//! Returns the number of rejected calls.
template <template <class> class Case, class Out>
int require_bad_masks_rejected(const shape& base, const std::string& fn, Out out, double sentinel) {
  int rejected = 0;
  for (std::size_t i : {std::size_t{2}, base.size() - 1}) {
    Case<std::uint8_t> c8(base);
    c8.mask[i] = 2;
    require_rejected(outcome_of([&] { (void)c8.run(); }), fn, "mask", static_cast<std::int64_t>(i));
    REQUIRE(all_equal(out(c8), sentinel));
    ++rejected;
    for (double bad : {0.5, 2.0, -1.0, std::nan("")}) {
      Case<double> c(base);
      c.mask[i] = bad;
      INFO("mask[" << i << "] = " << bad);
      require_rejected(outcome_of([&] { (void)c.run(); }), fn, "mask", static_cast<std::int64_t>(i));
      REQUIRE(all_equal(out(c), sentinel));
      Case<float> cf(base);
      cf.mask[i] = static_cast<float>(bad);
      require_rejected(outcome_of([&] { (void)cf.run(); }), fn, "mask", static_cast<std::int64_t>(i));
      REQUIRE(all_equal(out(cf), sentinel));
      rejected += 2;
    }
  }
  return rejected;
}
}  // namespace
