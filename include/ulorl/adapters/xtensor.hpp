// ulorl/adapters/xtensor.hpp — non-owning ulorl views of xtensor objects (optional: needs xtensor
// 0.24+, CMake component `xtensor`, target ulorl::xtensor). Any xtensor expression with direct
// access maps without a copy: xt::xtensor, xt::xarray, xt::xtensor_fixed, the adaptors of xt::adapt
// and the strided views (xt::view of integers, ranges and steps, xt::strided_view, xt::transpose,
// xt::flip), row- or column-major, with any strides xtensor expresses, negative ones included (the
// first element is data() + data_offset()).
//   as_matrix_view(m)            2-D -> matrix_view (token matrices, logits [N, V])
//   as_vector_view(v)            1-D -> vector_view (any stride)
//   as_span(v)                   contiguous 1-D -> std::span (labels, scores, group ids)
//   as_padded(m)                 2-D -> padded token_view [B, T]
//   as_packed(values, offsets)   1-D values + contiguous offsets[B+1] (int32 or int64) -> packed token_view
// A const object (or an xtensor view of one) gives views of const elements. An
// expression without direct access (xt::broadcast, arithmetic, xt::keep / xt::drop views) or of a
// static rank other than the view's does not compile; neither does a temporary that owns its data
// (the view would dangle), while a temporary view of a named object (`as_matrix_view(xt::transpose(a))`)
// is fine. Rejected at run time with ulorl::error naming the adapter and its parameter: a dynamic
// rank (xt::xarray, xt::view) other than the view's, a std::span of a strided vector, empty
// offsets, and a view of mutable elements whose strides make distinct elements share memory (a
// stride-0 broadcast of extent > 1, overlapping rows): ulorl writes its outputs through mutable
// views, which need distinct elements; read such an object as an input through std::as_const.
#pragma once

// xtensor 0.26 moved its headers into folders (containers/, core/, views/, utils/).
#if __has_include(<xtensor/core/xtensor_forward.hpp>)
#include <xtensor/containers/xbuffer_adaptor.hpp>
#include <xtensor/core/xexpression.hpp>
#include <xtensor/core/xtensor_forward.hpp>
#include <xtensor/utils/xutils.hpp>
#include <xtensor/views/xstrided_view.hpp>
#include <xtensor/views/xview.hpp>
#else
#include <xtensor/xbuffer_adaptor.hpp>
#include <xtensor/xexpression.hpp>
#include <xtensor/xstrided_view.hpp>
#include <xtensor/xtensor_forward.hpp>
#include <xtensor/xutils.hpp>
#include <xtensor/xview.hpp>
#endif

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/views.hpp"

ULORL_NAMESPACE_BEGIN

namespace detail::xt_adapter {

//! An xtensor expression with data(), data_offset() and strides().
template <class E>
concept strided = xt::is_xexpression<std::decay_t<E>>::value && xt::has_data_interface<std::decay_t<E>>::value &&
                  xt::has_strides<std::decay_t<E>>::value;

//! Whether an object of closure type E reads memory that outlives it: a reference, a view whose
//! closure does, or an adaptor of a borrowed buffer (xt::adapt of a pointer with no_ownership, or
//! of a named container).
template <class E>
struct borrows : std::bool_constant<std::is_lvalue_reference_v<E>> {};
template <class E>
  requires(!std::is_reference_v<E> && !std::is_same_v<E, std::remove_cv_t<E>>)
struct borrows<E> : borrows<std::remove_cv_t<E>> {};
template <class CT, class... S>
struct borrows<xt::xview<CT, S...>> : borrows<CT> {};
template <class CT, class S, xt::layout_type L, class FST>
struct borrows<xt::xstrided_view<CT, S, L, FST>> : borrows<CT> {};
template <class EC>
struct borrowed_storage : std::bool_constant<std::is_lvalue_reference_v<EC>> {};
template <class CP, class A>
struct borrowed_storage<xt::xbuffer_adaptor<CP, xt::no_ownership, A>> : std::true_type {};
template <class EC, std::size_t N, xt::layout_type L, class Tag>
struct borrows<xt::xtensor_adaptor<EC, N, L, Tag>> : borrowed_storage<EC> {};
template <class EC, xt::layout_type L, class SC, class Tag>
struct borrows<xt::xarray_adaptor<EC, L, SC, Tag>> : borrowed_storage<EC> {};

//! An argument the adapters of rank N take: strided, of rank N or of a dynamic rank, and either a
//! named object (an lvalue) or a temporary that borrows its memory.
template <class E, std::size_t N>
concept adaptable = strided<E> &&
                    (xt::get_rank<std::decay_t<E>>::value == N || xt::get_rank<std::decay_t<E>>::value == SIZE_MAX) &&
                    (std::is_lvalue_reference_v<E> || borrows<E>::value);

//! The element type of the expression's data: const for a const object or a view of one.
template <class E>
using element_t = std::remove_reference_t<decltype(*std::declval<E&>().data())>;

//! The first element: data() is the start of the underlying storage, data_offset() the first
//! element's distance from it (non-zero for views, also for those with negative strides).
template <class E>
[[nodiscard]] element_t<E>* first_element(E& e) noexcept {
  return e.data() + static_cast<std::ptrdiff_t>(e.data_offset());
}

template <class C>
[[nodiscard]] std::string list_str(const C& c, const char* open, const char* close) {
  std::string s = open;
  for (std::size_t d = 0; d < c.size(); ++d) s += (d ? ", " : "") + std::to_string(c[d]);
  return s + close;
}

//! The expression has rank N (checked here for a dynamic rank; a static one is in `adaptable`).
template <std::size_t N, class E>
void require_rank(std::string_view fn, std::string_view arg, const E& e) {
  if (e.dimension() != N)
    detail::fail(fn, arg,
                 "has rank " + std::to_string(e.dimension()) + " (shape " + list_str(e.shape(), "[", "]") +
                     ") but must have rank " + std::to_string(N));
}

//! Whether distinct indices of the view address distinct elements, exactly: (r, c) and
//! (r + dr, c + dc) share one when dr * row_stride + dc * col_stride = 0, whose smallest solution
//! other than (0, 0) is |dr| = |col_stride| / g, |dc| = |row_stride| / g (g their gcd). Unlike
//! detail::distinct_elements (which the kernels' output checks use, and which rejects interleaved
//! layouts too), a stepped view whose rows interleave without sharing an element passes here.
template <class T>
[[nodiscard]] constexpr bool distinct(const vector_view<T>& v) noexcept {
  return detail::distinct_elements(v);
}
template <class T>
[[nodiscard]] constexpr bool distinct(const matrix_view<T>& m) noexcept {
  if (m.rows() == 0 || m.cols() == 0) return true;
  if (m.rows() == 1) return m.cols() == 1 || m.col_stride() != 0;
  if (m.cols() == 1) return m.row_stride() != 0;
  const std::size_t rs = detail::abs_stride(m.row_stride()), cs = detail::abs_stride(m.col_stride());
  if (rs == 0 || cs == 0) return false;
  const std::size_t g = std::gcd(rs, cs);
  return cs / g >= m.rows() || rs / g >= m.cols();
}

//! A view of mutable elements is an output: distinct indices must address distinct elements.
template <class V, class E>
void require_output_strides(std::string_view fn, std::string_view arg, const V& view, const E& e) {
  if constexpr (!std::is_const_v<typename V::element_type>)
    if (!distinct(view))
      detail::fail(fn, arg,
                   "has strides " + list_str(e.strides(), "(", ")") + " for shape " + list_str(e.shape(), "[", "]") +
                       ", so distinct elements share memory: a view of mutable elements is an output and needs "
                       "distinct elements (pass it through std::as_const to read it as an input)");
}

template <class E>
[[nodiscard]] auto matrix_of(std::string_view fn, std::string_view arg, E& e) {
  require_rank<2>(fn, arg, e);
  const matrix_view<element_t<E>> m(first_element(e), e.shape()[0], e.shape()[1],
                                    static_cast<std::ptrdiff_t>(e.strides()[0]),
                                    static_cast<std::ptrdiff_t>(e.strides()[1]));
  require_output_strides(fn, arg, m, e);
  return m;
}

template <class E>
[[nodiscard]] auto vector_of(std::string_view fn, std::string_view arg, E& e) {
  require_rank<1>(fn, arg, e);
  const vector_view<element_t<E>> v(first_element(e), e.shape()[0], static_cast<std::ptrdiff_t>(e.strides()[0]));
  require_output_strides(fn, arg, v, e);
  return v;
}

template <class E>
[[nodiscard]] std::span<element_t<E>> span_of(std::string_view fn, std::string_view arg, E& e) {
  require_rank<1>(fn, arg, e);
  const std::size_t n = e.shape()[0];
  // xtensor gives a dimension of extent 1 the stride 0: any stride is contiguous there.
  if (n > 1 && e.strides()[0] != 1)
    detail::fail(fn, arg,
                 "has stride " + std::to_string(e.strides()[0]) +
                     " but must be contiguous (it is read as a dense array; copy it into an xt::xtensor first)");
  return {first_element(e), n};
}

//! A non-null address for a view of no elements, so that a given zero-size object is never taken
//! for an absent token_view (an absent mask reads as all valid); nothing is read or written there.
template <class T>
[[nodiscard]] T* present(T* p) noexcept {
  alignas(64) static std::byte no_elements[64];
  return p != nullptr ? p : reinterpret_cast<T*>(no_elements);
}

}  // namespace detail::xt_adapter

//! A [rows, cols] view of a 2-D xtensor expression with direct access; strides come from xtensor.
template <class E>
  requires detail::xt_adapter::adaptable<E, 2>
[[nodiscard]] auto as_matrix_view(E&& m) {
  return detail::xt_adapter::matrix_of("as_matrix_view", "m", m);
}

//! A strided view of a 1-D xtensor expression with direct access.
template <class E>
  requires detail::xt_adapter::adaptable<E, 1>
[[nodiscard]] auto as_vector_view(E&& v) {
  return detail::xt_adapter::vector_of("as_vector_view", "v", v);
}

//! A span of a contiguous 1-D xtensor expression (what ulorl reads as a dense array: labels,
//! scores, group ids); a strided one is an error.
template <class E>
  requires detail::xt_adapter::adaptable<E, 1>
[[nodiscard]] auto as_span(E&& v) {
  return detail::xt_adapter::span_of("as_span", "v", v);
}

//! The padded ragged layout of a [B, T] xtensor expression.
template <class E>
  requires detail::xt_adapter::adaptable<E, 2>
[[nodiscard]] auto as_padded(E&& m) {
  auto v = detail::xt_adapter::matrix_of("as_padded", "m", m);
  return padded(decltype(v)(detail::xt_adapter::present(v.data()), v.rows(), v.cols(), v.row_stride(), v.col_stride()));
}

//! The packed ragged layout: row b of the batch is values[offsets[b] .. offsets[b+1]) of a 1-D
//! `values` (any stride), with contiguous int32 or int64 `offsets` of B+1 >= 1 entries.
template <class E, class O>
  requires detail::xt_adapter::adaptable<E, 1> && detail::xt_adapter::adaptable<O, 1>
[[nodiscard]] auto as_packed(E&& values, O&& offsets) {
  using offset_t = std::remove_const_t<detail::xt_adapter::element_t<O>>;
  static_assert(std::is_same_v<offset_t, std::int64_t> || std::is_same_v<offset_t, std::int32_t>,
                "as_packed: offsets must hold std::int64_t or std::int32_t");
  constexpr std::string_view fn = "as_packed";
  const auto v = detail::xt_adapter::vector_of(fn, "values", values);
  const auto o = detail::xt_adapter::span_of(fn, "offsets", offsets);
  if (o.empty()) detail::fail(fn, "offsets", "must have B+1 >= 1 entries");
  return packed(decltype(v)(detail::xt_adapter::present(v.data()), v.size(), v.stride()),
                std::span<const offset_t>(o));
}

ULORL_NAMESPACE_END
