// Tests for ulorl/adapters/xtensor.hpp: containers of both layouts, xarray, xt::adapt and strided
// views (steps, negative steps, transposes, flips, integer indices) become views of the same
// elements; every entry point called through the adapter gives the bits of the same call on raw
// ulorl views written by hand; ranks, strides and overlaps the views cannot take are named errors;
// what the adapter must not take (owning temporaries, expressions without memory) does not compile.
#include <ulorl/adapters/xtensor.hpp>
#include <ulorl/advantage.hpp>
#include <ulorl/logits/backward.hpp>
#include <ulorl/logits/forward.hpp>
#include <ulorl/logits/fused_loss.hpp>
#include <ulorl/loss/aggregation.hpp>
#include <ulorl/loss/kl.hpp>
#include <ulorl/loss/policy_loss.hpp>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xbroadcast.hpp>
#include <xtensor/xfixed.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xstrided_view.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "catch.hpp"

namespace {

constexpr std::uint64_t seed = 20261206;
constexpr double sentinel = 7.25;  // what output buffers hold outside the elements a call writes

using xt::placeholders::_;

// What the adapter accepts, as concepts (a rejected argument is a constraint failure).
template <class E>
concept matrix_adaptable = requires(E&& e) { ulorl::as_matrix_view(static_cast<E&&>(e)); };
template <class E>
concept vector_adaptable = requires(E&& e) { ulorl::as_vector_view(static_cast<E&&>(e)); };

//! Uniform values in [lo, hi) into every element of `e` (any xtensor expression with elements).
template <class E>
void fill(E&& e, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  for (auto& x : e) x = static_cast<std::remove_reference_t<decltype(x)>>(u(rng));
}

//! A view addresses exactly the elements of the xtensor expression it was made of.
template <class T, class E>
void require_same_elements(const ulorl::matrix_view<T>& m, E&& e) {
  REQUIRE(e.dimension() == 2);
  REQUIRE(m.rows() == e.shape()[0]);
  REQUIRE(m.cols() == e.shape()[1]);
  for (std::size_t r = 0; r < m.rows(); ++r)
    for (std::size_t c = 0; c < m.cols(); ++c) REQUIRE(&m(r, c) == &e(r, c));
}
template <class T, class E>
void require_same_elements(const ulorl::vector_view<T>& v, E&& e) {
  REQUIRE(e.dimension() == 1);
  REQUIRE(v.size() == e.shape()[0]);
  for (std::size_t i = 0; i < v.size(); ++i) REQUIRE(&v[i] == &e(i));
}

//! Every element of two containers of one shape and layout has the same bits (storage order).
template <class A, class B>
bool same_bits(const A& a, const B& b) {
  using T = typename A::value_type;
  static_assert(std::is_same_v<T, typename B::value_type>);
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
bool same_bits(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }
bool same_bits(const ulorl::policy_loss_result& a, const ulorl::policy_loss_result& b) {
  return same_bits(a.loss, b.loss) && same_bits(a.pg_loss, b.pg_loss) && same_bits(a.kl_loss, b.kl_loss) &&
         same_bits(a.entropy_loss, b.entropy_loss) &&
         std::memcmp(&a.metrics, &b.metrics, sizeof(ulorl::loss_metrics)) == 0;
}

//! The ulorl::error that `f()` throws (function, argument, index, message); fails when none.
struct thrown {
  std::string function, argument, what;
  std::int64_t index = 0;
};
template <class F>
thrown error_of(F&& f) {
  try {
    f();
  } catch (const ulorl::error& e) {
    return {e.function(), e.argument(), e.what(), e.index()};
  }
  FAIL("no ulorl::error thrown");
  return {};
}

using ulorl::matrix_view;
using ulorl::token_view;
using ulorl::vector_view;
using col_major = xt::xtensor<double, 2, xt::layout_type::column_major>;

//! Padded token views written by hand: an input (const elements) and an output.
template <class T>
token_view<const T> raw_in(const T* p, std::size_t rows, std::size_t cols, std::ptrdiff_t rs, std::ptrdiff_t cs) {
  return token_view<const T>::padded(matrix_view<const T>(p, rows, cols, rs, cs));
}
template <class T>
token_view<T> raw_out(T* p, std::size_t rows, std::size_t cols, std::ptrdiff_t rs, std::ptrdiff_t cs) {
  return token_view<T>::padded(matrix_view<T>(p, rows, cols, rs, cs));
}

}  // namespace

TEST_CASE("xtensor containers of both layouts, xarray, fixed tensors and adaptors map element for element",
          "[adapters]") {
  xt::xtensor<double, 2> rm = xt::zeros<double>({3, 4});
  col_major cm = xt::zeros<double>({3, 4});
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t c = 0; c < 4; ++c) rm(r, c) = cm(r, c) = static_cast<double>(10 * r + c);
  const auto a = ulorl::as_matrix_view(rm);
  const auto b = ulorl::as_matrix_view(cm);
  CHECK(a.row_stride() == 4);
  CHECK(a.col_stride() == 1);
  CHECK(b.row_stride() == 1);
  CHECK(b.col_stride() == 3);
  require_same_elements(a, rm);
  require_same_elements(b, cm);
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t c = 0; c < 4; ++c) REQUIRE(a(r, c) == b(r, c));
  b(2, 1) = -1;  // writes through
  CHECK(cm(2, 1) == -1);

  // A const object gives views of const elements.
  static_assert(std::is_same_v<decltype(ulorl::as_matrix_view(std::as_const(rm))), matrix_view<const double>>);
  static_assert(std::is_same_v<decltype(ulorl::as_matrix_view(rm)), matrix_view<double>>);
  static_assert(std::is_same_v<decltype(ulorl::as_padded(std::as_const(cm))), token_view<const double>>);

  xt::xarray<float> xa = xt::zeros<float>({2, 5});
  xt::xarray<float, xt::layout_type::column_major> xc = xt::zeros<float>({2, 5});
  require_same_elements(ulorl::as_matrix_view(xa), xa);
  require_same_elements(ulorl::as_matrix_view(xc), xc);
  xt::xarray<double, xt::layout_type::dynamic> xd(std::vector<std::size_t>{3, 2}, xt::layout_type::column_major);
  require_same_elements(ulorl::as_matrix_view(xd), xd);
  CHECK(ulorl::as_matrix_view(xd).row_stride() == 1);
  xt::xtensor_fixed<double, xt::xshape<2, 3>> fx = {{1, 2, 3}, {4, 5, 6}};
  require_same_elements(ulorl::as_matrix_view(fx), fx);
  xt::xtensor<std::int64_t, 1> v = {4, 5, 6};
  require_same_elements(ulorl::as_vector_view(v), v);

  // xt::adapt of a pointer (no ownership, with or without strides) and of a named vector.
  std::vector<double> buf(12);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<double>(i);
  auto ad = xt::adapt(buf.data(), buf.size(), xt::no_ownership(), std::array<std::size_t, 2>{3, 4});
  require_same_elements(ulorl::as_matrix_view(ad), ad);
  auto av = xt::adapt(buf, std::array<std::size_t, 2>{4, 3});
  require_same_elements(ulorl::as_matrix_view(av), av);
  auto as = xt::adapt(buf.data(), 6, xt::no_ownership(), std::array<std::size_t, 2>{3, 2},
                      std::array<std::ptrdiff_t, 2>{1, 6});
  require_same_elements(ulorl::as_matrix_view(as), as);
  CHECK(ulorl::as_matrix_view(as)(2, 1) == 8.0);
}

TEST_CASE("strided views map with their offsets and strides, negative ones included", "[adapters]") {
  xt::xtensor<double, 2> a = xt::zeros<double>({6, 8});
  std::mt19937_64 rng(seed);
  fill(a, rng, -1, 1);
  col_major c = a;
  xt::xarray<double> x = a;

  // Ranges and steps, forward and backward (rows 8 apart, columns 3: they interleave without
  // sharing an element); a view of a view; a temporary view of a named object.
  require_same_elements(ulorl::as_matrix_view(xt::view(a, xt::range(1, 5), xt::range(0, 8, 3))),
                        xt::view(a, xt::range(1, 5), xt::range(0, 8, 3)));
  auto back = xt::view(a, xt::range(5, _, -2), xt::range(6, 1, -1));
  const auto mb = ulorl::as_matrix_view(back);
  CHECK(mb.row_stride() == -16);
  CHECK(mb.col_stride() == -1);
  CHECK(mb.data() == &a(5, 6));
  require_same_elements(mb, back);
  auto inner = xt::view(c, xt::range(1, _), xt::all());
  require_same_elements(ulorl::as_matrix_view(xt::view(inner, xt::range(4, 0, -1), xt::range(1, 8, 2))),
                        xt::view(inner, xt::range(4, 0, -1), xt::range(1, 8, 2)));
  require_same_elements(ulorl::as_matrix_view(xt::view(xt::view(x, xt::range(1, 5)), xt::all(), xt::range(2, 6))),
                        xt::view(x, xt::range(1, 5), xt::range(2, 6)));

  // Transposes and flips (xt::flip gives a negative stride and a data offset).
  require_same_elements(ulorl::as_matrix_view(xt::transpose(a)), xt::transpose(a));
  require_same_elements(ulorl::as_matrix_view(xt::transpose(c)), xt::transpose(c));
  for (const std::size_t axis : {std::size_t{0}, std::size_t{1}}) {
    require_same_elements(ulorl::as_matrix_view(xt::flip(a, axis)), xt::flip(a, axis));
    require_same_elements(ulorl::as_matrix_view(xt::flip(c, axis)), xt::flip(c, axis));
    require_same_elements(ulorl::as_matrix_view(xt::flip(x, axis)), xt::flip(x, axis));
  }
  require_same_elements(ulorl::as_matrix_view(xt::strided_view(a, {xt::range(1, 4), xt::range(7, _, -3)})),
                        xt::strided_view(a, {xt::range(1, 4), xt::range(7, _, -3)}));
  // A new axis (extent 1, stride 0 in xtensor) and an integer index.
  require_same_elements(ulorl::as_matrix_view(xt::view(a, 2, xt::newaxis(), xt::all())),
                        xt::view(a, 2, xt::newaxis(), xt::all()));
  require_same_elements(ulorl::as_matrix_view(xt::view(a, xt::all(), 3, xt::newaxis())),
                        xt::view(a, xt::all(), 3, xt::newaxis()));

  // Vectors: rows and columns of both layouts, steps, reversed.
  require_same_elements(ulorl::as_vector_view(xt::view(a, 2, xt::all())), xt::view(a, 2, xt::all()));
  require_same_elements(ulorl::as_vector_view(xt::view(a, xt::all(), 2)), xt::view(a, xt::all(), 2));
  require_same_elements(ulorl::as_vector_view(xt::view(c, 2, xt::all())), xt::view(c, 2, xt::all()));
  require_same_elements(ulorl::as_vector_view(xt::view(x, xt::range(5, _, -1), 7)), xt::view(x, xt::range(5, _, -1), 7));
  xt::xtensor<double, 1> v = xt::view(a, 1, xt::all());
  require_same_elements(ulorl::as_vector_view(xt::flip(v, 0)), xt::flip(v, 0));
  CHECK(ulorl::as_vector_view(xt::flip(v, 0)).stride() == -1);
  require_same_elements(ulorl::as_vector_view(xt::view(v, xt::range(1, _, 3))), xt::view(v, xt::range(1, _, 3)));

  // A view of a const object gives views of const elements.
  static_assert(std::is_same_v<decltype(ulorl::as_matrix_view(xt::view(std::as_const(a), xt::all(), xt::all()))),
                               matrix_view<const double>>);
  static_assert(std::is_same_v<decltype(ulorl::as_vector_view(xt::view(a, 1, xt::all()))), vector_view<double>>);
}

TEST_CASE("spans and the packed layout", "[adapters]") {
  xt::xtensor<double, 2> a = {{1, 2, 3}, {4, 5, 6}};
  const xt::xtensor<std::int64_t, 1> labels = {3, 1, 4, 1, 5};
  const auto s = ulorl::as_span(labels);
  static_assert(std::is_same_v<decltype(s), const std::span<const std::int64_t>>);
  CHECK(s.data() == labels.data());
  CHECK(s.size() == 5);
  const auto row = ulorl::as_span(xt::view(a, 1, xt::all()));  // a contiguous row of a matrix
  CHECK(row.data() == &a(1, 0));
  CHECK(row.size() == 3);
  // One element is contiguous whatever its stride (xtensor gives an extent of 1 the stride 0).
  CHECK(ulorl::as_span(xt::view(a, xt::range(1, 2), 2)).data() == &a(1, 2));
  const xt::xarray<float> empty = xt::zeros<float>({0});
  CHECK(ulorl::as_span(empty).empty());

  // Packed: strided values, int32 and int64 offsets.
  xt::xtensor<double, 1> flat = xt::arange<double>(0.0, 14.0);
  const xt::xtensor<std::int32_t, 1> off32 = {0, 2, 2, 7};
  const xt::xtensor<std::int64_t, 1> off64 = {0, 2, 2, 7};
  auto every_other = xt::view(flat, xt::range(0, 14, 2));
  for (const auto& t : {ulorl::as_packed(every_other, off32), ulorl::as_packed(every_other, off64)}) {
    REQUIRE(t.kind() == ulorl::layout::packed);
    REQUIRE(t.rows() == 3);
    REQUIRE(t.size() == 7);
    REQUIRE(t.row_size(1) == 0);
    REQUIRE(&t(2, 4) == &flat(12));
  }
  const auto tp = ulorl::as_packed(std::as_const(flat), off64);
  static_assert(std::is_same_v<decltype(tp), const token_view<const double>>);
  CHECK(&tp(2, 0) == &flat(2));

  // A given object of no elements is present (not the absent view, which reads as all valid).
  const xt::xtensor<double, 2> none;
  REQUIRE(none.size() == 0);
  CHECK_FALSE(ulorl::as_padded(none).empty());
  CHECK(ulorl::as_padded(none).size() == 0);
  const xt::xtensor<double, 1> no_values;
  const xt::xtensor<std::int64_t, 1> one_offset = {0};
  CHECK_FALSE(ulorl::as_packed(no_values, one_offset).empty());
}

TEST_CASE("ranks, strides and overlaps the views cannot take are named errors", "[adapters]") {
  xt::xarray<double> three = xt::zeros<double>({2, 3, 4});
  auto e = error_of([&] { (void)ulorl::as_matrix_view(three); });
  CHECK(e.function == "as_matrix_view");
  CHECK(e.argument == "m");
  CHECK(e.index == -1);
  CHECK(e.what == "ulorl::as_matrix_view: argument 'm': has rank 3 (shape [2, 3, 4]) but must have rank 2");
  xt::xarray<double> two = xt::zeros<double>({2, 3});
  e = error_of([&] { (void)ulorl::as_vector_view(two); });
  CHECK(e.what == "ulorl::as_vector_view: argument 'v': has rank 2 (shape [2, 3]) but must have rank 1");
  e = error_of([&] { (void)ulorl::as_padded(xt::view(two, 1)); });
  CHECK(e.function == "as_padded");
  CHECK(e.argument == "m");
  e = error_of([&] { (void)ulorl::as_span(two); });
  CHECK(e.function == "as_span");

  // A span is contiguous: a column, a step or a reversed vector is not.
  e = error_of([&] { (void)ulorl::as_span(xt::view(two, xt::all(), 1)); });
  CHECK(e.function == "as_span");
  CHECK(e.argument == "v");
  CHECK(e.index == -1);
  CHECK(e.what == "ulorl::as_span: argument 'v': has stride 3 but must be contiguous (it is read as a dense array; "
                  "copy it into an xt::xtensor first)");
  xt::xtensor<std::int64_t, 1> ids = {1, 2, 3, 4};
  e = error_of([&] { (void)ulorl::as_span(xt::flip(ids, 0)); });
  CHECK(e.what.find("has stride -1 but must be contiguous") != std::string::npos);
  e = error_of([&] { (void)ulorl::as_span(xt::view(ids, xt::range(0, 4, 2))); });
  CHECK(e.what.find("has stride 2") != std::string::npos);

  // Packed offsets: contiguous, B+1 >= 1 entries.
  xt::xtensor<double, 1> values = xt::zeros<double>({4});
  xt::xtensor<std::int64_t, 1> off = {0, 1, 1, 2, 2, 4};
  e = error_of([&] { (void)ulorl::as_packed(values, xt::view(off, xt::range(0, 6, 2))); });
  CHECK(e.function == "as_packed");
  CHECK(e.argument == "offsets");
  CHECK(e.what.find("has stride 2") != std::string::npos);
  const xt::xtensor<std::int64_t, 1> no_offsets;
  e = error_of([&] { (void)ulorl::as_packed(values, no_offsets); });
  CHECK(e.what == "ulorl::as_packed: argument 'offsets': must have B+1 >= 1 entries");
  e = error_of([&] { (void)ulorl::as_packed(two, off); });
  CHECK(e.argument == "values");

  // A broadcast (stride 0, extent > 1) or overlapping rows: a mutable view would be an output whose
  // distinct elements share memory; as const it is an input and reads the broadcast values.
  xt::xtensor<double, 1> row = {1, 2, 3, 4};
  const auto strided = [&](auto shape, auto strides) {
    return xt::strided_view(row, std::move(shape), std::move(strides), 0, xt::layout_type::dynamic);
  };
  auto bcast = strided(std::array<std::size_t, 2>{3, 4}, std::array<std::ptrdiff_t, 2>{0, 1});
  e = error_of([&] { (void)ulorl::as_matrix_view(bcast); });
  CHECK(e.function == "as_matrix_view");
  CHECK(e.argument == "m");
  CHECK(e.index == -1);
  CHECK(e.what == "ulorl::as_matrix_view: argument 'm': has strides (0, 1) for shape [3, 4], so distinct elements "
                  "share memory: a view of mutable elements is an output and needs distinct elements (pass it "
                  "through std::as_const to read it as an input)");
  e = error_of([&] { (void)ulorl::as_padded(bcast); });
  CHECK(e.function == "as_padded");
  const auto in = ulorl::as_matrix_view(std::as_const(bcast));
  CHECK(in.row_stride() == 0);
  CHECK(in(2, 3) == 4.0);
  auto overlapping = strided(std::array<std::size_t, 2>{2, 3}, std::array<std::ptrdiff_t, 2>{1, 1});
  e = error_of([&] { (void)ulorl::as_matrix_view(overlapping); });
  CHECK(e.what.find("has strides (1, 1) for shape [2, 3]") != std::string::npos);
  CHECK(ulorl::as_matrix_view(std::as_const(overlapping))(1, 2) == 4.0);
  auto same = strided(std::array<std::size_t, 1>{3}, std::array<std::ptrdiff_t, 1>{0});
  e = error_of([&] { (void)ulorl::as_vector_view(same); });
  CHECK(e.what.find("has strides (0) for shape [3]") != std::string::npos);
  e = error_of([&] { (void)ulorl::as_packed(same, off); });
  CHECK(e.argument == "values");
  CHECK(ulorl::as_vector_view(std::as_const(same))[2] == 1.0);
  // Rows that interleave without sharing an element are distinct: (3, 2) over [2, 2].
  auto interleaved = strided(std::array<std::size_t, 2>{2, 2}, std::array<std::ptrdiff_t, 2>{1, 2});
  require_same_elements(ulorl::as_matrix_view(interleaved), interleaved);
  e = error_of([&] { (void)ulorl::as_matrix_view(strided(std::array<std::size_t, 2>{2, 3}, std::array<std::ptrdiff_t, 2>{-2, 1})); });
  CHECK(e.what.find("has strides (-2, 1) for shape [2, 3]") != std::string::npos);
  // A stride 0 over an extent of 1 (xtensor's own convention) is not an overlap.
  xt::xtensor<double, 2> one_row = xt::zeros<double>({1, 4});
  REQUIRE(one_row.strides()[0] == 0);
  CHECK(ulorl::as_matrix_view(one_row).cols() == 4);
}

TEST_CASE("what the adapter must not take does not compile", "[adapters]") {
  using mat = xt::xtensor<double, 2>;
  using vec = xt::xtensor<double, 1>;
  mat a = xt::zeros<double>({3, 4});
  std::vector<double> buf(12);
  // Named objects and temporaries that borrow them.
  static_assert(matrix_adaptable<mat&>);
  static_assert(matrix_adaptable<const mat&>);
  static_assert(matrix_adaptable<xt::xarray<double>&>);
  static_assert(matrix_adaptable<decltype(xt::view(a, xt::all(), xt::range(0, 2)))>);
  static_assert(matrix_adaptable<decltype(xt::transpose(a))>);
  static_assert(matrix_adaptable<decltype(xt::flip(a, 0))>);
  static_assert(matrix_adaptable<decltype(xt::view(xt::view(a, xt::range(0, 2)), xt::all(), 1, xt::newaxis()))>);
  static_assert(matrix_adaptable<decltype(xt::adapt(buf.data(), 12, xt::no_ownership(), std::array<std::size_t, 2>{3, 4}))>);
  static_assert(matrix_adaptable<decltype(xt::adapt(buf, std::array<std::size_t, 2>{3, 4}))>);
  // Temporaries that own their data: the view would dangle.
  static_assert(!matrix_adaptable<mat>);
  static_assert(!matrix_adaptable<xt::xarray<double>>);
  static_assert(!matrix_adaptable<decltype(xt::view(mat{}, xt::all(), xt::all()))>);
  static_assert(!matrix_adaptable<decltype(xt::transpose(mat{}))>);
  static_assert(!matrix_adaptable<decltype(xt::adapt(std::vector<double>(12), std::array<std::size_t, 2>{3, 4}))>);
  // Expressions without memory of their own.
  static_assert(!matrix_adaptable<decltype(a + a)>);
  static_assert(!matrix_adaptable<decltype(xt::broadcast(buf[0], std::array<std::size_t, 2>{3, 4}))>);
  static_assert(!matrix_adaptable<decltype(xt::view(a, xt::keep(0, 2), xt::all()))>);
  static_assert(!matrix_adaptable<decltype(xt::view(a + a, xt::all(), xt::all()))>);
  // Static ranks other than the view's.
  static_assert(!matrix_adaptable<vec&>);
  static_assert(!matrix_adaptable<xt::xtensor<double, 3>&>);
  static_assert(!vector_adaptable<mat&>);
  static_assert(vector_adaptable<vec&>);
  static_assert(vector_adaptable<decltype(xt::view(a, 1, xt::all()))>);
  SUCCEED("checked at compile time");
}

TEST_CASE("advantages and their token broadcast through the adapter are the raw calls' bits", "[adapters]") {
  std::mt19937_64 rng(seed + 1);
  CAPTURE(seed);
  constexpr std::size_t n = 12, B = 5, T = 6;
  xt::xarray<double> scores = xt::zeros<double>({std::size_t{2}, n});
  fill(scores, rng, 0, 1);
  const xt::xtensor<std::int64_t, 1> ids = {7, 7, 3, 7, 3, 9, 3, 3, 7, 1, 1, 9};
  // Scores: row 1 of a matrix (contiguous); group ids; group size.
  xt::xtensor<double, 1> adv = xt::xtensor<double, 1>::from_shape({n}), adv_raw = adv;
  adv.fill(sentinel), adv_raw.fill(sentinel);
  ulorl::group_advantages(ulorl::as_span(xt::view(std::as_const(scores), 1, xt::all())), ulorl::as_span(ids),
                          ulorl::as_span(adv));
  ulorl::group_advantages(std::span<const double>(scores.data() + n, n), std::span<const std::int64_t>(ids.data(), n),
                          std::span<double>(adv_raw.data(), n));
  CHECK(same_bits(adv, adv_raw));
  ulorl::group_advantages(ulorl::as_span(xt::view(std::as_const(scores), 0, xt::all())), std::size_t{4},
                          ulorl::as_span(adv));
  ulorl::group_advantages(std::span<const double>(scores.data(), n), std::size_t{4}, std::span<double>(adv_raw.data(), n));
  CHECK(same_bits(adv, adv_raw));

  // Padded: a column-major mask, the output every other column of a wider row-major matrix.
  col_major mask = xt::ones<double>({B, T});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = T - b; t < T; ++t) mask(b, t) = 0;
  xt::xtensor<double, 2> wide = xt::xtensor<double, 2>::from_shape({B, 2 * T}), wide_raw = wide;
  wide.fill(sentinel), wide_raw.fill(sentinel);
  const auto a5 = xt::view(std::as_const(adv), xt::range(0, B));
  ulorl::broadcast_to_tokens(ulorl::as_span(a5), ulorl::as_padded(std::as_const(mask)),
                             ulorl::as_padded(xt::view(wide, xt::all(), xt::range(0, 2 * T, 2))));
  ulorl::broadcast_to_tokens(std::span<const double>(adv.data(), B), raw_in(mask.data(), B, T, 1, B),
                             raw_out(wide_raw.data(), B, T, 2 * T, 2));
  CHECK(same_bits(wide, wide_raw));
  CHECK(wide(1, 2) == adv(1));
  CHECK(wide(1, 1) == sentinel);

  // Packed: values every third element of a flat array, int32 offsets, a float mask.
  const xt::xtensor<std::int32_t, 1> off = {0, 3, 3, 7, 12, 13};
  xt::xtensor<float, 1> pmask = xt::ones<float>({13});
  pmask(5) = 0;
  xt::xtensor<double, 1> flat = xt::xtensor<double, 1>::from_shape({39}), flat_raw = flat;
  flat.fill(sentinel), flat_raw.fill(sentinel);
  const ulorl::broadcast_config bcfg{.allow_empty_rows = true};  // row 1 has no token
  ulorl::broadcast_to_tokens(ulorl::as_span(a5), ulorl::as_packed(std::as_const(pmask), off),
                             ulorl::as_packed(xt::view(flat, xt::range(0, 39, 3)), off), bcfg);
  const std::span<const std::int32_t> off_raw(off.data(), 6);
  ulorl::broadcast_to_tokens(std::span<const double>(adv.data(), B),
                             token_view<const float>::packed(vector_view<const float>(pmask.data(), 13), off_raw),
                             token_view<double>::packed(vector_view<double>(flat_raw.data(), 13, 3), off_raw), bcfg);
  CHECK(same_bits(flat, flat_raw));
  CHECK(flat(0) == adv(0));
}

TEST_CASE("policy_loss, agg_loss and kl_penalty through the adapter are the raw calls' bits", "[adapters]") {
  std::mt19937_64 rng(seed + 2);
  CAPTURE(seed);
  constexpr std::size_t B = 5, T = 7;
  constexpr auto Bp = static_cast<std::ptrdiff_t>(B), Tp = static_cast<std::ptrdiff_t>(T);
  // Every input in another layout: column-major; a flipped xarray (negative row stride); a per-row
  // advantage broadcast along T (column stride 0, read as const); a window of a wider uint8 mask; a
  // transpose; an xarray.
  col_major lp = xt::zeros<double>({B, T});
  xt::xarray<double> old_rows = xt::zeros<double>({B, T});
  xt::xtensor<double, 1> adv_row = xt::zeros<double>({B});
  xt::xtensor<std::uint8_t, 2> mask_big = xt::zeros<std::uint8_t>({B + 1, T + 3});
  xt::xtensor<double, 2> ref_t = xt::zeros<double>({T, B});
  xt::xarray<double> ent = xt::zeros<double>({B, T});
  fill(old_rows, rng, -4, -0.1);
  fill(adv_row, rng, -2, 2);
  fill(ref_t, rng, -4, -0.1);
  fill(ent, rng, 0, 3);
  std::uniform_real_distribution<double> u(-0.6, 0.6);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      lp(b, t) = old_rows(B - 1 - b, t) + u(rng);
      mask_big(b + 1, t + 2) = static_cast<std::uint8_t>(t < T - b ? 1 : 0);
    }
  const auto old = xt::flip(std::as_const(old_rows), 0);
  const auto adv = xt::strided_view(std::as_const(adv_row), std::array<std::size_t, 2>{B, T},
                                    std::array<std::ptrdiff_t, 2>{1, 0}, 0, xt::layout_type::dynamic);
  const auto mask = xt::view(std::as_const(mask_big), xt::range(1, B + 1), xt::range(2, T + 2));
  const auto ref = xt::transpose(std::as_const(ref_t));

  const ulorl::policy_loss_inputs<double, std::uint8_t> in{
      .log_prob = ulorl::as_padded(std::as_const(lp)), .old_log_prob = ulorl::as_padded(old),
      .advantages = ulorl::as_padded(adv), .mask = ulorl::as_padded(mask), .ref_log_prob = ulorl::as_padded(ref),
      .entropy = ulorl::as_padded(std::as_const(ent))};
  const ulorl::policy_loss_inputs<double, std::uint8_t> in_raw{
      .log_prob = raw_in(lp.data(), B, T, 1, Bp),
      .old_log_prob = raw_in(old_rows.data() + (Bp - 1) * Tp, B, T, -Tp, 1),
      .advantages = raw_in(adv_row.data(), B, T, 1, 0),
      .mask = raw_in(mask_big.data() + (Tp + 3) + 2, B, T, Tp + 3, 1),
      .ref_log_prob = raw_in(ref_t.data(), B, T, 1, Bp),
      .entropy = raw_in(ent.data(), B, T, Tp, 1)};

  ulorl::policy_loss_config cfg;
  cfg.objective.eps_low = 0.2;
  cfg.objective.eps_high = 0.28;
  cfg.kl_coef = 0.1;
  cfg.entropy_coef = 0.01;
  cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, ulorl::count_batch(in_raw.mask));

  // Outputs: a column-major gradient, an entropy gradient in every other column of a wider matrix.
  col_major g = col_major::from_shape({B, T}), g_raw = g;
  xt::xtensor<double, 2> ge = xt::xtensor<double, 2>::from_shape({B, 2 * T}), ge_raw = ge;
  g.fill(sentinel), g_raw.fill(sentinel), ge.fill(sentinel), ge_raw.fill(sentinel);
  auto odd_columns = xt::view(ge, xt::all(), xt::range(1, 2 * T, 2));
  const auto r = ulorl::policy_loss(in, ulorl::as_padded(g), ulorl::as_padded(odd_columns), cfg);
  const auto r_raw = ulorl::policy_loss(in_raw, raw_out(g_raw.data(), B, T, 1, Bp),
                                        raw_out(ge_raw.data() + 1, B, T, 2 * Tp, 2), cfg);
  CHECK(same_bits(r, r_raw));
  CHECK(same_bits(g, g_raw));
  CHECK(same_bits(ge, ge_raw));
  CHECK(r.metrics.tokens > 0);
  CHECK(ge(0, 0) == sentinel);

  // agg_loss: a column-major xarray loss with a bool mask; kl_penalty: a row-reversed log-prob.
  xt::xarray<double, xt::layout_type::column_major> loss_mat = xt::zeros<double>({B, T});
  fill(loss_mat, rng, -1, 1);
  xt::xtensor<bool, 2> bmask = xt::zeros<bool>({B, T});
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) bmask(b, t) = (b + t) % 3 != 0;
  xt::xtensor<double, 2> ga = xt::xtensor<double, 2>::from_shape({B, T}), ga_raw = ga;
  ga.fill(sentinel), ga_raw.fill(sentinel);
  const auto norm = ulorl::global_normalizer(ulorl::agg_mode::seq_mean_token_mean, {.tokens = 20, .sequences = 5, .rows = 5});
  const double l = ulorl::agg_loss(ulorl::as_padded(std::as_const(loss_mat)), ulorl::as_padded(std::as_const(bmask)),
                                   ulorl::as_padded(ga), norm);
  const double l_raw = ulorl::agg_loss(raw_in(loss_mat.data(), B, T, 1, Bp), raw_in(bmask.data(), B, T, Tp, 1),
                                       raw_out(ga_raw.data(), B, T, Tp, 1), norm);
  CHECK(same_bits(l, l_raw));
  CHECK(same_bits(ga, ga_raw));
  CHECK(ga(0, 1) != sentinel);

  xt::xtensor<double, 2> kl = xt::xtensor<double, 2>::from_shape({B, T}), kl_raw = kl;
  col_major gk = col_major::from_shape({B, T}), gk_raw = gk;
  kl.fill(sentinel), kl_raw.fill(sentinel), gk.fill(sentinel), gk_raw.fill(sentinel);
  ulorl::kl_config kcfg;
  kcfg.estimator = ulorl::kl_estimator::k3;
  ulorl::kl_penalty(ulorl::as_padded(old), ulorl::as_padded(ref), ulorl::as_padded(xt::flip(kl, 1)), ulorl::as_padded(gk),
                    kcfg);
  ulorl::kl_penalty(in_raw.old_log_prob, in_raw.ref_log_prob, raw_out(kl_raw.data() + Tp - 1, B, T, Tp, -1),
                    raw_out(gk_raw.data(), B, T, 1, Bp), kcfg);
  CHECK(same_bits(kl, kl_raw));
  CHECK(same_bits(gk, gk_raw));
  CHECK((kl(0, 0) != sentinel && gk(0, 0) != sentinel));

  // Packed: the valid tokens of each row, values every other element, int64 offsets.
  xt::xtensor<std::int64_t, 1> off = xt::zeros<std::int64_t>({B + 1});
  for (std::size_t b = 0; b < B; ++b) off(b + 1) = off(b) + static_cast<std::int64_t>(T - b);
  const auto N = static_cast<std::size_t>(off(B));
  xt::xtensor<double, 1> plp = xt::zeros<double>({2 * N}), pold = xt::zeros<double>({N}), padv = xt::zeros<double>({N});
  fill(pold, rng, -4, -0.1);
  fill(padv, rng, -2, 2);
  for (std::size_t i = 0; i < N; ++i) plp(2 * i) = pold(i) + u(rng);
  const std::span<const std::int64_t> off_raw(off.data(), B + 1);
  const auto plp_view = xt::view(std::as_const(plp), xt::range(0, 2 * N, 2));
  const ulorl::policy_loss_inputs<double, double> pin{.log_prob = ulorl::as_packed(plp_view, off),
                                                      .old_log_prob = ulorl::as_packed(std::as_const(pold), off),
                                                      .advantages = ulorl::as_packed(xt::flip(std::as_const(padv), 0), off)};
  const ulorl::policy_loss_inputs<double, double> pin_raw{
      .log_prob = token_view<const double>::packed(vector_view<const double>(plp.data(), N, 2), off_raw),
      .old_log_prob = token_view<const double>::packed(vector_view<const double>(pold.data(), N), off_raw),
      .advantages = token_view<const double>::packed(vector_view<const double>(padv.data() + N - 1, N, -1), off_raw)};
  ulorl::policy_loss_config pcfg = cfg;
  pcfg.kl_coef = 0, pcfg.entropy_coef = 0;
  pcfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::seq_mean_token_sum, {.tokens = 25, .sequences = 5, .rows = 5});
  xt::xtensor<double, 1> pg = xt::xtensor<double, 1>::from_shape({N}), pg_raw = pg;
  pg.fill(sentinel), pg_raw.fill(sentinel);
  const auto pr = ulorl::policy_loss(pin, ulorl::as_packed(xt::flip(pg, 0), off), pcfg);
  const auto pr_raw = ulorl::policy_loss(
      pin_raw, token_view<double>::packed(vector_view<double>(pg_raw.data() + N - 1, N, -1), off_raw), pcfg);
  CHECK(same_bits(pr, pr_raw));
  CHECK(same_bits(pg, pg_raw));
  CHECK(pg(0) != sentinel);
}

TEST_CASE("logits_forward, logits_backward and policy_loss_from_logits through the adapter are the raw calls' bits",
          "[adapters]") {
  std::mt19937_64 rng(seed + 3);
  CAPTURE(seed);
  constexpr std::size_t N = 9, V = 37;
  constexpr auto Np = static_cast<std::ptrdiff_t>(N), Vp = static_cast<std::ptrdiff_t>(V);
  xt::xtensor<std::int64_t, 1> labels = xt::zeros<std::int64_t>({N});
  for (auto& y : labels) y = static_cast<std::int64_t>(rng() % V);
  const std::span<const std::int64_t> labels_raw(labels.data(), N);
  ulorl::logits_config lcfg;
  lcfg.temperature = 0.9;

  // Outputs: the three columns of a row-major [N, 3] matrix (stride 3).
  using stats_t = xt::xtensor<double, 2>;
  const auto run_forward = [&](auto logits, auto logits_raw, stats_t& s, stats_t& s_raw) {
    s = stats_t::from_shape({N, 3}), s_raw = s;
    s.fill(sentinel), s_raw.fill(sentinel);
    ulorl::logits_forward(logits, ulorl::as_span(std::as_const(labels)), ulorl::as_vector_view(xt::view(s, xt::all(), 0)),
                          ulorl::as_vector_view(xt::view(s, xt::all(), 1)),
                          ulorl::as_vector_view(xt::view(s, xt::all(), 2)), lcfg);
    ulorl::logits_forward(logits_raw, labels_raw, vector_view<double>(s_raw.data(), N, 3),
                          vector_view<double>(s_raw.data() + 1, N, 3), vector_view<double>(s_raw.data() + 2, N, 3), lcfg);
    CHECK(same_bits(s, s_raw));
    CHECK(s(0, 0) != sentinel);
  };
  stats_t s, s_raw;
  // float column-major; double flipped xarray (negative row stride); bf16 row-major.
  xt::xtensor<float, 2, xt::layout_type::column_major> xf = xt::zeros<float>({N, V});
  fill(xf, rng, -4, 4);
  run_forward(ulorl::as_matrix_view(std::as_const(xf)), matrix_view<const float>(xf.data(), N, V, 1, Np), s, s_raw);
  xt::xarray<double> xd = xt::zeros<double>({N, V});
  fill(xd, rng, -4, 4);
  run_forward(ulorl::as_matrix_view(xt::flip(std::as_const(xd), 0)),
              matrix_view<const double>(xd.data() + (Np - 1) * Vp, N, V, -Vp, 1), s, s_raw);
  xt::xtensor<ulorl::bf16, 2> xb = xt::xtensor<ulorl::bf16, 2>::from_shape({N, V});
  std::normal_distribution<float> nd(0, 2);
  for (auto& x : xb) x = ulorl::bf16::from_float(nd(rng));
  run_forward(ulorl::as_matrix_view(std::as_const(xb)), matrix_view<const ulorl::bf16>(xb.data(), N, V), s, s_raw);

  // Backward of the float logits into a transposed [V, N] buffer (strides (1, N)).
  run_forward(ulorl::as_matrix_view(std::as_const(xf)), matrix_view<const float>(xf.data(), N, V, 1, Np), s, s_raw);
  xt::xtensor<double, 1> glp = xt::zeros<double>({N}), gent = xt::zeros<double>({N});
  fill(glp, rng, -1, 1);
  fill(gent, rng, -0.1, 0.1);
  xt::xtensor<float, 2> gt = xt::xtensor<float, 2>::from_shape({V, N}), gt_raw = gt;
  gt.fill(static_cast<float>(sentinel)), gt_raw.fill(static_cast<float>(sentinel));
  const stats_t& cs = s;
  ulorl::logits_backward(ulorl::as_matrix_view(std::as_const(xf)), ulorl::as_span(std::as_const(labels)),
                         ulorl::as_vector_view(xt::view(cs, xt::all(), 2)), ulorl::as_vector_view(xt::view(cs, xt::all(), 1)),
                         ulorl::as_vector_view(std::as_const(glp)), ulorl::as_vector_view(std::as_const(gent)),
                         ulorl::as_matrix_view(xt::transpose(gt)), lcfg);
  ulorl::logits_backward(matrix_view<const float>(xf.data(), N, V, 1, Np), labels_raw,
                         vector_view<const double>(s.data() + 2, N, 3), vector_view<const double>(s.data() + 1, N, 3),
                         vector_view<const double>(glp.data(), N), vector_view<const double>(gent.data(), N),
                         matrix_view<float>(gt_raw.data(), N, V, 1, Np), lcfg);
  CHECK(same_bits(gt, gt_raw));
  CHECK(gt(0, 0) != static_cast<float>(sentinel));

  // The fused loss from [B * T, V] logits: padded [3, 3] token inputs, column-major buffers and
  // gradient of the logits.
  constexpr std::size_t B = 3, T = 3;
  xt::xtensor<double, 2> old = xt::zeros<double>({B, T}), adv = xt::zeros<double>({B, T});
  fill(old, rng, -4, -2);
  fill(adv, rng, -2, 2);
  col_major mask = xt::ones<double>({B, T});
  mask(2, 2) = 0;
  ulorl::policy_loss_config cfg;
  cfg.entropy_coef = 0.01;
  cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, {.tokens = 8, .sequences = 3, .rows = 3});
  std::array<col_major, 4> bufs, bufs_raw;
  for (auto* set : {&bufs, &bufs_raw})
    for (auto& b : *set) b = col_major::from_shape({B, T}), b.fill(sentinel);
  xt::xtensor<double, 1> lse = xt::xtensor<double, 1>::from_shape({N}), lse_raw = lse;
  lse.fill(sentinel), lse_raw.fill(sentinel);
  col_major gl = col_major::from_shape({N, V}), gl_raw = gl;
  gl.fill(sentinel), gl_raw.fill(sentinel);
  const ulorl::policy_loss_inputs<double> in{.log_prob = {}, .old_log_prob = ulorl::as_padded(std::as_const(old)),
                                             .advantages = ulorl::as_padded(std::as_const(adv)),
                                             .mask = ulorl::as_padded(std::as_const(mask))};
  const ulorl::policy_loss_inputs<double> in_raw{.log_prob = {}, .old_log_prob = raw_in(old.data(), B, T, 3, 1),
                                                 .advantages = raw_in(adv.data(), B, T, 3, 1),
                                                 .mask = raw_in(mask.data(), B, T, 1, 3)};
  const ulorl::logits_loss_buffers<double> buf{ulorl::as_padded(bufs[0]), ulorl::as_padded(bufs[1]),
                                               ulorl::as_padded(bufs[2]), ulorl::as_padded(bufs[3]),
                                               ulorl::as_vector_view(lse)};
  const auto col = [&](col_major& b) { return raw_out(b.data(), B, T, 1, 3); };
  const ulorl::logits_loss_buffers<double> buf_raw{col(bufs_raw[0]), col(bufs_raw[1]), col(bufs_raw[2]), col(bufs_raw[3]),
                                                   vector_view<double>(lse_raw.data(), N)};
  const auto r = ulorl::policy_loss_from_logits(ulorl::as_matrix_view(xt::flip(std::as_const(xd), 0)),
                                                ulorl::as_span(std::as_const(labels)), in, buf, ulorl::as_matrix_view(gl),
                                                cfg, lcfg);
  const auto r_raw = ulorl::policy_loss_from_logits(matrix_view<const double>(xd.data() + (Np - 1) * Vp, N, V, -Vp, 1),
                                                    labels_raw, in_raw, buf_raw, matrix_view<double>(gl_raw.data(), N, V, 1, Np),
                                                    cfg, lcfg);
  CHECK(same_bits(r, r_raw));
  for (std::size_t i = 0; i < bufs.size(); ++i) CHECK(same_bits(bufs[i], bufs_raw[i]));
  CHECK(same_bits(lse, lse_raw));
  CHECK(same_bits(gl, gl_raw));
  CHECK((gl(0, 0) != sentinel && lse(0) != sentinel && bufs[2](0, 0) != sentinel));
}
