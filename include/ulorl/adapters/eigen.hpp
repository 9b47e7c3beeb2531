// ulorl/adapters/eigen.hpp — non-owning ulorl views of Eigen objects (optional: needs Eigen 3.3+).
// `as_matrix_view(m)` maps any Eigen dense expression with direct access (Matrix, Map, Block, Ref;
// row- or column-major, inner/outer strides) onto `matrix_view`, and `as_vector_view(v)` a vector
// onto `vector_view`; `as_padded(m)` gives the padded ragged layout of a [B, T] matrix.
#pragma once

#include <Eigen/Core>

#include <cstddef>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/views.hpp"

ULORL_NAMESPACE_BEGIN

//! A [rows, cols] view of an Eigen dense object with direct access; strides come from Eigen.
template <class Derived>
[[nodiscard]] auto as_matrix_view(Eigen::DenseBase<Derived>& m) noexcept {
  using T = typename Derived::Scalar;
  auto& d = m.derived();
  const auto rs = static_cast<std::ptrdiff_t>(d.rowStride());
  const auto cs = static_cast<std::ptrdiff_t>(d.colStride());
  return matrix_view<T>(d.data(), static_cast<std::size_t>(d.rows()), static_cast<std::size_t>(d.cols()), rs, cs);
}
template <class Derived>
[[nodiscard]] auto as_matrix_view(const Eigen::DenseBase<Derived>& m) noexcept {
  using T = const typename Derived::Scalar;
  const auto& d = m.derived();
  return matrix_view<T>(d.data(), static_cast<std::size_t>(d.rows()), static_cast<std::size_t>(d.cols()),
                        static_cast<std::ptrdiff_t>(d.rowStride()), static_cast<std::ptrdiff_t>(d.colStride()));
}

//! A vector view of an Eigen vector (row or column) with direct access.
template <class Derived>
[[nodiscard]] auto as_vector_view(Eigen::DenseBase<Derived>& v) noexcept {
  using T = typename Derived::Scalar;
  auto& d = v.derived();
  return vector_view<T>(d.data(), static_cast<std::size_t>(d.size()), static_cast<std::ptrdiff_t>(d.innerStride()));
}
template <class Derived>
[[nodiscard]] auto as_vector_view(const Eigen::DenseBase<Derived>& v) noexcept {
  using T = const typename Derived::Scalar;
  const auto& d = v.derived();
  return vector_view<T>(d.data(), static_cast<std::size_t>(d.size()), static_cast<std::ptrdiff_t>(d.innerStride()));
}

//! The padded ragged layout of a [B, T] Eigen matrix.
template <class Derived>
[[nodiscard]] auto as_padded(Eigen::DenseBase<Derived>& m) noexcept {
  return padded(as_matrix_view(m));
}
template <class Derived>
[[nodiscard]] auto as_padded(const Eigen::DenseBase<Derived>& m) noexcept {
  return padded(as_matrix_view(m));
}

ULORL_NAMESPACE_END
