// ulorl/core/views.hpp — non-owning views of the caller's memory: a strided 1-D `vector_view` and a
// strided 2-D `matrix_view` (row-major by default, any element strides, like a torch tensor's
// data_ptr + strides). Contiguous 1-D inputs are plain `std::span`. Views never allocate or own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "ulorl/core/config.hpp"

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
  constexpr vector_view(std::span<T> s) noexcept : data_(s.data()), size_(s.size()), stride_(1) {}  // NOLINT
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

template <class T>
vector_view(std::span<T>) -> vector_view<T>;

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

ULORL_NAMESPACE_END
