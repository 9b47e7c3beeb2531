// ulorl/core/ragged.hpp — the two ragged batch layouts RLVR trainers use, as one non-owning view:
//   padded [B, T] (any strides) + a 0/1 response mask of the same shape, and
//   packed tokens + offsets[B+1] (flash-attention's cu_seqlens, int32 or int64), optionally masked.
// `token_view<T>` addresses element (b, t) of either layout; validation helpers check offsets, masks,
// shapes and finiteness and name the offending argument and flat index.
//
// Masks: every function of ulorl that takes a token mask takes an absent one (an empty view,
// `token_view<const M>{}`; a given view of zero elements is not absent) as "every token valid":
// all B x T tokens of the padded layout, every
// token inside the offsets of the packed layout, in the shape of the function's other token arrays
// (log_prob, or what it names). The results are the same bits as with an explicit all-ones mask.
// `mask_or_all_valid` is that rule: the mask, or a view of the other array's tokens that reads 1.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/views.hpp"

ULORL_NAMESPACE_BEGIN

enum class layout { padded, packed };

//! Per-token values of a batch of responses. Row b holds `row_size(b)` tokens; in the padded layout
//! every row has T slots (validity comes from a mask), in the packed layout row b is the slice
//! [offsets[b], offsets[b+1]) of a flat array.
template <class T>
class token_view {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  constexpr token_view() noexcept = default;

  //! Padded layout: a [B, T] strided matrix.
  constexpr static token_view padded(matrix_view<T> m) noexcept {
    token_view v;
    v.kind_ = layout::padded;
    v.data_ = m.data();
    v.rows_ = m.rows();
    v.cols_ = m.cols();
    v.row_stride_ = m.row_stride();
    v.stride_ = m.col_stride();
    return v;
  }
  //! Packed layout: tokens of row b are values[offsets[b] .. offsets[b+1]).
#if ULORL_CXX20
  constexpr static token_view packed(vector_view<T> values, std::span<const std::int64_t> offsets) noexcept {
    token_view v = packed_common(values, offsets.empty() ? 0 : offsets.size() - 1);
    v.off64_ = offsets.data();
    return v;
  }
  constexpr static token_view packed(vector_view<T> values, std::span<const std::int32_t> offsets) noexcept {
    token_view v = packed_common(values, offsets.empty() ? 0 : offsets.size() - 1);
    v.off32_ = offsets.data();
    return v;
  }
#endif

  //! The tokens of `shape` (its layout, B, T or offsets), every one reading `*value` (strides 0):
  //! a broadcast, e.g. the all-valid mask of mask_or_all_valid.
  template <class U>
  constexpr static token_view broadcast(T* value, const token_view<U>& shape) noexcept {
    token_view v;
    v.kind_ = shape.kind_;
    v.data_ = value;
    v.rows_ = shape.rows_;
    v.cols_ = shape.cols_;
    v.row_stride_ = 0;
    v.stride_ = 0;
    v.total_ = shape.total_;
    v.off64_ = shape.off64_;
    v.off32_ = shape.off32_;
    return v;
  }

  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  constexpr token_view(const token_view<U>& o) noexcept  // NOLINT
      : kind_(o.kind_), data_(o.data_), rows_(o.rows_), cols_(o.cols_), row_stride_(o.row_stride_),
        stride_(o.stride_), total_(o.total_), off64_(o.off64_), off32_(o.off32_) {}

  [[nodiscard]] constexpr layout kind() const noexcept { return kind_; }
  [[nodiscard]] constexpr T* data() const noexcept { return data_; }
  //! Whether this is the absent view (an optional argument not given): no memory and no shape, as
  //! default-constructed. A view of zero elements that has a shape (padded [0, T], or packed with
  //! offsets) is present, so a function checks it against its other arrays like any given argument.
  [[nodiscard]] constexpr bool empty() const noexcept {
    return data_ == nullptr && rows_ == 0 && cols_ == 0 && !has_offsets();
  }
  //! Packed views only: whether offsets were given (a view with none has no rows to address).
  [[nodiscard]] constexpr bool has_offsets() const noexcept { return off64_ != nullptr || off32_ != nullptr; }
  //! Number of responses B.
  [[nodiscard]] constexpr std::size_t rows() const noexcept { return rows_; }
  //! T for the padded layout; 0 for the packed layout.
  [[nodiscard]] constexpr std::size_t cols() const noexcept { return cols_; }
  //! Number of addressable elements: B*T (padded) or the packed token count.
  [[nodiscard]] constexpr std::size_t size() const noexcept {
    return kind_ == layout::padded ? rows_ * cols_ : total_;
  }
  [[nodiscard]] constexpr std::size_t row_begin(std::size_t b) const noexcept {
    if (kind_ == layout::padded) return b * cols_;
    return off64_ ? static_cast<std::size_t>(off64_[b]) : static_cast<std::size_t>(off32_[b]);
  }
  [[nodiscard]] constexpr std::size_t row_size(std::size_t b) const noexcept {
    return kind_ == layout::padded ? cols_ : row_begin(b + 1) - row_begin(b);
  }
  //! Flat element index of (b, t): b*T + t, or offsets[b] + t. Used in error messages.
  [[nodiscard]] constexpr std::size_t flat_index(std::size_t b, std::size_t t) const noexcept {
    return row_begin(b) + t;
  }
  //! Row b. An empty view (an absent optional input: null data) gives null rows of the layout's
  //! sizes, without offsetting the null pointer.
  [[nodiscard]] constexpr vector_view<T> row(std::size_t b) const noexcept {
    if (data_ == nullptr) return {nullptr, kind_ == layout::padded || !has_offsets() ? cols_ : row_size(b), stride_};
    if (kind_ == layout::padded)
      return {data_ + static_cast<std::ptrdiff_t>(b) * row_stride_, cols_, stride_};
    return {data_ + static_cast<std::ptrdiff_t>(row_begin(b)) * stride_, row_size(b), stride_};
  }
  [[nodiscard]] constexpr T& operator()(std::size_t b, std::size_t t) const noexcept {
    if (kind_ == layout::padded)
      return data_[static_cast<std::ptrdiff_t>(b) * row_stride_ + static_cast<std::ptrdiff_t>(t) * stride_];
    return data_[static_cast<std::ptrdiff_t>(row_begin(b) + t) * stride_];
  }
  //! Rows [lo, hi) (lo <= hi <= rows()) as a view of the same memory: row b of the slice is row
  //! lo + b; an empty view stays empty. A padded slice starts at row lo and is a padded view like
  //! any other. A packed slice keeps the flat array and reads its offsets from lo, so its
  //! flat_index is still the index in that array and size() counts from the array's start; its
  //! offsets do not start at 0, so it is for code that addresses rows (row(), operator()), not an
  //! argument of the library's batch functions (validate_layout rejects it).
  [[nodiscard]] constexpr token_view slice(std::size_t lo, std::size_t hi) const noexcept {
    if (empty()) return *this;
    token_view v = *this;
    v.rows_ = hi - lo;
    if (kind_ == layout::padded) {
      if (data_ != nullptr) v.data_ = data_ + static_cast<std::ptrdiff_t>(lo) * row_stride_;
    } else if (has_offsets()) {
      v.total_ = row_begin(hi);
      if (off64_ != nullptr) v.off64_ = off64_ + lo;
      else v.off32_ = off32_ + lo;
    }
    return v;
  }
  //! True when another view addresses the same (b, t) set: same layout, B and T or offsets.
  template <class U>
  [[nodiscard]] constexpr bool same_shape(const token_view<U>& o) const noexcept {
    if (kind_ != o.kind() || rows_ != o.rows() || size() != o.size()) return false;
    if (kind_ == layout::padded) return cols_ == o.cols();
    for (std::size_t b = 0; b <= rows_; ++b)
      if (row_begin(b) != o.row_begin(b)) return false;
    return true;
  }

 private:
  template <class>
  friend class token_view;
  constexpr static token_view packed_common(vector_view<T> values, std::size_t rows) noexcept {
    token_view v;
    v.kind_ = layout::packed;
    v.data_ = values.data();
    v.rows_ = rows;
    v.total_ = values.size();
    v.stride_ = values.stride();
    return v;
  }

  layout kind_ = layout::padded;
  T* data_ = nullptr;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  std::ptrdiff_t row_stride_ = 0;
  std::ptrdiff_t stride_ = 1;
  std::size_t total_ = 0;
  const std::int64_t* off64_ = nullptr;
  const std::int32_t* off32_ = nullptr;
};

//! Convenience constructors.
template <class T>
[[nodiscard]] constexpr token_view<T> padded(matrix_view<T> m) noexcept {
  return token_view<T>::padded(m);
}
#if ULORL_CXX20
template <class T, class O>
[[nodiscard]] constexpr token_view<T> packed(vector_view<T> values, std::span<const O> offsets) noexcept {
  return token_view<T>::packed(values, offsets);
}
template <class T, class O>
[[nodiscard]] constexpr token_view<T> packed(std::span<T> values, std::span<O> offsets) noexcept {
  return token_view<T>::packed(vector_view<T>(values), std::span<const O>(offsets));
}
#endif

// ---- absent masks ----------------------------------------------------------------------------------

namespace detail {
//! The value an all-valid mask reads, as many times as the widest SIMD vector has lanes (16), so
//! that a vector load of a broadcast row reads ones only (loss/detail/token_rows.hpp).
template <class M>
struct all_valid {
  static constexpr std::array<M, 16> ones = [] {
    std::array<M, 16> a{};
    for (auto& x : a) x = M(1);
    return a;
  }();
};
}  // namespace detail

//! A function's mask argument: `mask` itself, or for an absent mask (an empty view) the tokens of
//! `shape` (the function's reference array, e.g. log_prob) all reading 1: every token valid. The
//! view returned for an absent mask has strides 0 (token_view::broadcast).
template <class M, class U>
[[nodiscard]] constexpr token_view<const M> mask_or_all_valid(token_view<const M> mask, const token_view<U>& shape) noexcept {
  if (!mask.empty()) return mask;
  return token_view<const M>::broadcast(detail::all_valid<std::remove_cv_t<M>>::ones.data(), shape);
}

// ---- validation (throwing; call before writing any output) --------------------------------------

//! Checks the internal consistency of a view: a packed view's offsets start at 0, never decrease
//! and end at the token count.
template <class T>
void validate_layout(std::string_view fn, std::string_view arg, const token_view<T>& v) {
  if (v.kind() != layout::packed) return;
  if (!v.has_offsets()) detail::fail(fn, arg, "packed layout needs offsets with B+1 >= 1 entries");
  const std::size_t n = v.rows() + 1;
  // Re-read the offsets through row_begin so both index widths share one check.
  if (v.row_begin(0) != 0) detail::fail_at(fn, arg, 0, v.row_begin(0), "offsets must start at 0");
  for (std::size_t i = 1; i < n; ++i) {
    auto cur = static_cast<std::int64_t>(v.row_begin(i)), prev = static_cast<std::int64_t>(v.row_begin(i - 1));
    if (cur < prev) detail::fail_at(fn, arg, static_cast<std::int64_t>(i), cur, "offsets must not decrease");
  }
  if (v.row_begin(n - 1) != v.size())
    detail::fail_at(fn, arg, static_cast<std::int64_t>(n - 1), v.row_begin(n - 1),
                    "last offset must equal the token count " + std::to_string(v.size()));
}

template <class T, class U>
void require_same_shape(std::string_view fn, std::string_view arg, const token_view<T>& v, std::string_view ref,
                        const token_view<U>& r) {
  if (!v.same_shape(r)) {
    std::string what = "shape differs from '" + std::string(ref) + "' (";
    what += v.kind() == layout::padded ? "padded [" + std::to_string(v.rows()) + ", " + std::to_string(v.cols()) + "]"
                                       : "packed B=" + std::to_string(v.rows()) + " tokens=" + std::to_string(v.size());
    what += " vs ";
    what += r.kind() == layout::padded ? "padded [" + std::to_string(r.rows()) + ", " + std::to_string(r.cols()) + "]"
                                       : "packed B=" + std::to_string(r.rows()) + " tokens=" + std::to_string(r.size());
    what += ")";
    detail::fail(fn, arg, what);
  }
}

//! Every element finite; the error names the flat index and the (row, token) position.
template <class T>
void require_all_finite(std::string_view fn, std::string_view arg, const token_view<T>& v) {
  for (std::size_t b = 0; b < v.rows(); ++b) {
    const auto r = v.row(b);
    for (std::size_t t = 0; t < r.size(); ++t)
      if (!std::isfinite(static_cast<double>(r[t])))
        detail::fail_at(fn, arg, static_cast<std::int64_t>(v.flat_index(b, t)), r[t],
                        "must be finite (row " + std::to_string(b) + ", token " + std::to_string(t) + ")");
  }
}
template <class T>
void require_all_finite(std::string_view fn, std::string_view arg, vector_view<T> v) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(static_cast<double>(v[i])))
      detail::fail_at(fn, arg, static_cast<std::int64_t>(i), v[i], "must be finite");
}

//! Mask values must be exactly 0 or 1.
template <class M>
void require_binary_mask(std::string_view fn, std::string_view arg, const token_view<M>& m) {
  for (std::size_t b = 0; b < m.rows(); ++b) {
    const auto r = m.row(b);
    for (std::size_t t = 0; t < r.size(); ++t) {
      const auto x = r[t];
      if (!(x == M(0) || x == M(1)))
        detail::fail_at(fn, arg, static_cast<std::int64_t>(m.flat_index(b, t)), x, "mask values must be 0 or 1");
    }
  }
}

//! Number of valid tokens of row b (of a mask view; an absent mask goes through mask_or_all_valid first).
template <class M>
[[nodiscard]] std::size_t row_tokens(const token_view<M>& mask, std::size_t b) noexcept {
  const auto r = mask.row(b);
  std::size_t n = 0;
  for (std::size_t t = 0; t < r.size(); ++t) n += r[t] != M(0);
  return n;
}

ULORL_NAMESPACE_END
