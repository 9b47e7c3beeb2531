// ulorl/core/views.hpp — non-owning views of the caller's memory: a strided 1-D `vector_view` and a
// strided 2-D `matrix_view` (row-major by default, any element strides, like a torch tensor's
// data_ptr + strides). Contiguous 1-D inputs are plain `std::span`. Views never allocate or own.
// The output checks at the end (`require_distinct_elements`, `require_disjoint`) reject strides
// that would make two results land on one element, which would silently keep only the last.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN

//! Strided 1-D view: element i lives at data[i * stride]. Stride in elements, may be negative.
template <class T>
class vector_view {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  constexpr vector_view() noexcept = default;
  constexpr vector_view(T* data, std::size_t size, std::ptrdiff_t stride = 1) noexcept
      : data_(data), size_(size), stride_(stride) {}
#if ULORL_CXX20
  constexpr vector_view(std::span<T> s) noexcept : data_(s.data()), size_(s.size()), stride_(1) {}  // NOLINT
#endif
  //! A view of mutable data converts to a view of const data.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  constexpr vector_view(const vector_view<U>& o) noexcept  // NOLINT
      : data_(o.data()), size_(o.size()), stride_(o.stride()) {}

  [[nodiscard]] constexpr T* data() const noexcept { return data_; }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return size_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] constexpr std::ptrdiff_t stride() const noexcept { return stride_; }
  [[nodiscard]] constexpr bool contiguous() const noexcept { return stride_ == 1 || size_ <= 1; }
  [[nodiscard]] constexpr T& operator[](std::size_t i) const noexcept {
    return data_[static_cast<std::ptrdiff_t>(i) * stride_];
  }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::ptrdiff_t stride_ = 1;
};

#if ULORL_CXX20
template <class T>
vector_view(std::span<T>) -> vector_view<T>;
#endif

//! Strided 2-D view: element (r, c) lives at data[r * row_stride + c * col_stride].
template <class T>
class matrix_view {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  constexpr matrix_view() noexcept = default;
  //! Row-major contiguous [rows, cols].
  constexpr matrix_view(T* data, std::size_t rows, std::size_t cols) noexcept
      : data_(data), rows_(rows), cols_(cols), row_stride_(static_cast<std::ptrdiff_t>(cols)), col_stride_(1) {}
  constexpr matrix_view(T* data, std::size_t rows, std::size_t cols, std::ptrdiff_t row_stride,
                        std::ptrdiff_t col_stride = 1) noexcept
      : data_(data), rows_(rows), cols_(cols), row_stride_(row_stride), col_stride_(col_stride) {}
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  constexpr matrix_view(const matrix_view<U>& o) noexcept  // NOLINT
      : data_(o.data()), rows_(o.rows()), cols_(o.cols()), row_stride_(o.row_stride()), col_stride_(o.col_stride()) {}

  [[nodiscard]] constexpr T* data() const noexcept { return data_; }
  [[nodiscard]] constexpr std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] constexpr std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return rows_ * cols_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return size() == 0; }
  [[nodiscard]] constexpr std::ptrdiff_t row_stride() const noexcept { return row_stride_; }
  [[nodiscard]] constexpr std::ptrdiff_t col_stride() const noexcept { return col_stride_; }
  [[nodiscard]] constexpr T& operator()(std::size_t r, std::size_t c) const noexcept {
    return data_[static_cast<std::ptrdiff_t>(r) * row_stride_ + static_cast<std::ptrdiff_t>(c) * col_stride_];
  }
  [[nodiscard]] constexpr vector_view<T> row(std::size_t r) const noexcept {
    return {data_ + static_cast<std::ptrdiff_t>(r) * row_stride_, cols_, col_stride_};
  }
  [[nodiscard]] constexpr vector_view<T> col(std::size_t c) const noexcept {
    return {data_ + static_cast<std::ptrdiff_t>(c) * col_stride_, rows_, row_stride_};
  }

 private:
  T* data_ = nullptr;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  std::ptrdiff_t row_stride_ = 0;
  std::ptrdiff_t col_stride_ = 1;
};

// ---- aliasing of outputs ------------------------------------------------------------------------

namespace detail {

constexpr std::size_t abs_stride(std::ptrdiff_t s) noexcept { return static_cast<std::size_t>(s < 0 ? -s : s); }

//! Distinct indices address distinct elements: at most one element, or a non-zero stride.
template <class T>
[[nodiscard]] constexpr bool distinct_elements(const vector_view<T>& v) noexcept {
  return v.size() <= 1 || v.stride() != 0;
}
//! Distinct (row, column) pairs address distinct elements when the layout is row-major (each row
//! fits in the row stride) or column-major (each column fits in the column stride), any signs.
//! Sufficient, not necessary: interleavings that are neither are rejected too, as no kernel here
//! produces them.
template <class T>
[[nodiscard]] constexpr bool distinct_elements(const matrix_view<T>& m) noexcept {
  const std::size_t rows = m.rows(), cols = m.cols();
  if (rows * cols <= 1) return true;
  const std::size_t rs = abs_stride(m.row_stride()), cs = abs_stride(m.col_stride());
  // A dimension of extent > 1 needs a non-zero stride; the outer one must also step over the inner.
  const bool row_major = (cols == 1 || cs >= 1) && (rows == 1 || (rs >= 1 && rs >= cols * cs));
  const bool col_major = (rows == 1 || rs >= 1) && (cols == 1 || (cs >= 1 && cs >= rows * rs));
  return row_major || col_major;
}

//! Signed distance from `from` to `to` in elements of T, for pointers aligned to T.
template <class T>
[[nodiscard]] inline std::ptrdiff_t element_distance(const T* from, const T* to) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(from), b = reinterpret_cast<std::uintptr_t>(to);
  return a <= b ? static_cast<std::ptrdiff_t>((b - a) / sizeof(T)) : -static_cast<std::ptrdiff_t>((a - b) / sizeof(T));
}
//! Whether element `p` is one of the elements of `v`.
template <class T>
[[nodiscard]] inline bool addresses(const vector_view<T>& v, const T* p) noexcept {
  if (v.size() == 0) return false;
  const std::ptrdiff_t k = element_distance<T>(v.data(), p);
  if (v.size() == 1 || v.stride() == 0) return k == 0;
  if (k % v.stride() != 0) return false;
  const std::ptrdiff_t j = k / v.stride();
  return j >= 0 && static_cast<std::size_t>(j) < v.size();
}
//! Whether two views share an element. Exact when either has one element or both have the same
//! stride (the O(1) cases); views with different strides are reported as disjoint.
template <class T>
[[nodiscard]] inline bool share_element(const vector_view<T>& a, const vector_view<T>& b) noexcept {
  if (a.size() == 0 || b.size() == 0) return false;
  if (a.size() == 1) return addresses(b, a.data());
  if (b.size() == 1) return addresses(a, b.data());
  if (a.stride() != b.stride()) return false;
  // a[i] == b[j]  <=>  (i - j) * stride == distance(a, b), with 0 <= i < |a|, 0 <= j < |b|.
  const std::ptrdiff_t s = a.stride(), k = element_distance<T>(a.data(), b.data());
  if (s == 0) return k == 0;
  if (k % s != 0) return false;
  const std::ptrdiff_t q = k / s;
  return q > -static_cast<std::ptrdiff_t>(b.size()) && q < static_cast<std::ptrdiff_t>(a.size());
}

}  // namespace detail

//! Throws naming `arg` when distinct indices of the output view address one element.
template <class T>
void require_distinct_elements(std::string_view fn, std::string_view arg, const vector_view<T>& v) {
  if (!detail::distinct_elements(v))
    detail::fail(fn, arg,
                 "stride 0 makes its " + std::to_string(v.size()) +
                     " elements overlap (all are one element): an output needs distinct elements");
}
template <class T>
void require_distinct_elements(std::string_view fn, std::string_view arg, const matrix_view<T>& m) {
  if (!detail::distinct_elements(m))
    detail::fail(fn, arg,
                 "strides (" + std::to_string(m.row_stride()) + ", " + std::to_string(m.col_stride()) +
                     ") make distinct elements overlap: an output needs non-overlapping rows");
}

//! Throws naming `arg` and `other` when two output views share an element (see
//! detail::share_element for which pairs are compared).
template <class T>
void require_disjoint(std::string_view fn, std::string_view arg, const vector_view<T>& a, std::string_view other,
                      const vector_view<T>& b) {
  if (detail::share_element(a, b))
    detail::fail(fn, arg, "shares elements with the output '" + std::string(other) + "': outputs must not overlap");
}

ULORL_NAMESPACE_END
