// ulorl/adapters/torch/tensor_views.hpp — non-owning ulorl views of libtorch tensors (optional:
// needs libtorch, CMake target ulorl::torch), the intra-op executor and the GEMM functor.
//   vector_of<T>(fn, arg, t)         1-D tensor -> vector_view (any stride, no copy)
//   matrix_of<T>(fn, arg, t)         2-D tensor -> matrix_view (any strides, no copy)
//   tokens_of<T>(fn, arg, t, offs)   [B, T] tensor (padded) or [total] tensor + offsets[B+1] (packed)
//   span_of<T>(fn, arg, t)           contiguous 1-D tensor -> std::span (labels, ids, offsets)
// Every check throws ulorl::error naming the function, the argument and what is wrong (dtype,
// device, rank, size, stride); nothing is copied: an input the kernels cannot read in place (a
// strided label vector) is rejected with the fix in the message, never silently copied.
// `torch_executor` runs ulorl's row-parallel kernels on torch's intra-op pool (at::parallel_for);
// `torch_gemm` is the linear head's GEMM as at::mm_out / addmm_ on from_blob views (OpenBLAS or
// MKL, whatever libtorch links).
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>  // c10::NoGradGuard, in torch 1.13 and 2.x (2.x's ATen.h declares no at::NoGradGuard)

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/views.hpp"
#include "ulorl/logits/bf16.hpp"
#include "ulorl/logits/f16.hpp"

ULORL_NAMESPACE_BEGIN

//! The libtorch adapter. Not `ulorl::torch`: with `using namespace ulorl` that name would make
//! every `torch::Tensor` of the caller ambiguous.
namespace th {

//! The torch dtype of an ulorl element type (ulorl::bf16 and ulorl::f16 have torch.bfloat16's and
//! torch.float16's bit layouts).
template <class T>
[[nodiscard]] constexpr c10::ScalarType scalar_type_of() noexcept {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return c10::ScalarType::Float;
  else if constexpr (std::is_same_v<U, double>) return c10::ScalarType::Double;
  else if constexpr (std::is_same_v<U, bf16>) return c10::ScalarType::BFloat16;
  else if constexpr (std::is_same_v<U, f16>) return c10::ScalarType::Half;
  else if constexpr (std::is_same_v<U, std::int32_t>) return c10::ScalarType::Int;
  else if constexpr (std::is_same_v<U, std::int64_t>) return c10::ScalarType::Long;
  else if constexpr (std::is_same_v<U, std::uint8_t>) return c10::ScalarType::Byte;
  else if constexpr (std::is_same_v<U, bool>) return c10::ScalarType::Bool;
  else static_assert(sizeof(U) == 0, "no torch dtype for this element type");
}

namespace detail {

[[nodiscard]] inline std::string sizes_str(const at::Tensor& t) {
  std::string s = "[";
  for (std::int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}
[[nodiscard]] inline std::string strides_str(const at::Tensor& t) {
  std::string s = "(";
  for (std::int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.stride(d));
  return s + ")";
}

//! Defined, on the CPU, of rank `dim` (-1: any).
inline void require_cpu(std::string_view fn, std::string_view arg, const at::Tensor& t, std::int64_t dim) {
  if (!t.defined()) ulorl::detail::fail(fn, arg, "is an undefined tensor");
  if (t.is_cuda())
    ulorl::detail::fail(fn, arg,
                        "is a CUDA tensor (" + t.device().str() +
                            "): this adapter runs the CPU kernels; CUDA tensors go to the ulorl::cuda kernels in "
                            "builds with CUDA (move it with .cpu() meanwhile)");
  if (!t.device().is_cpu()) ulorl::detail::fail(fn, arg, "is on device " + t.device().str() + ", not the CPU");
  if (t.layout() != c10::kStrided) ulorl::detail::fail(fn, arg, "must be a dense (strided) tensor, not sparse");
  if (dim >= 0 && t.dim() != dim)
    ulorl::detail::fail(fn, arg,
                        "has rank " + std::to_string(t.dim()) + " (shape " + sizes_str(t) + ") but must have rank " +
                            std::to_string(dim));
}

//! Every defined tensor of `args` ({name, tensor}) is on the device of `ref` (named `ref_name`): a
//! CPU mask beside CUDA log-probs, or a meta tensor among CPU ones, is an error naming it.
inline void require_same_device(std::string_view fn, std::string_view ref_name, const at::Tensor& ref,
                                std::initializer_list<std::pair<std::string_view, const at::Tensor*>> args) {
  for (const auto& [name, t] : args)
    if (t->defined() && ref.defined() && t->device() != ref.device())
      ulorl::detail::fail(fn, name,
                          "is on device " + t->device().str() + " but '" + std::string(ref_name) + "' is on " +
                              ref.device().str() + " (every tensor of a call must be on one device)");
}

inline void require_dtype(std::string_view fn, std::string_view arg, const at::Tensor& t, c10::ScalarType want,
                          std::string_view why = {}) {
  // A bool tensor is read as bytes wherever uint8 is taken (masks): its bytes are 0 or 1.
  if (want == c10::ScalarType::Byte && t.scalar_type() == c10::ScalarType::Bool) return;
  if (t.scalar_type() != want)
    ulorl::detail::fail(fn, arg,
                        std::string("has dtype ") + c10::toString(t.scalar_type()) + " but must be " +
                            c10::toString(want) + (why.empty() ? "" : " (" + std::string(why) + ")"));
}

template <class T>
[[nodiscard]] T* data_of(const at::Tensor& t) noexcept {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, bf16>)
    return reinterpret_cast<T*>(t.data_ptr<at::BFloat16>());
  else if constexpr (std::is_same_v<U, f16>)
    return reinterpret_cast<T*>(t.data_ptr<at::Half>());
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return reinterpret_cast<T*>(t.data_ptr());  // bool and uint8 masks are both read as bytes
  else
    return const_cast<T*>(t.data_ptr<U>());
}

}  // namespace detail

//! A 1-D tensor of element type T as a strided vector_view (no copy).
template <class T>
[[nodiscard]] vector_view<T> vector_of(std::string_view fn, std::string_view arg, const at::Tensor& t) {
  detail::require_cpu(fn, arg, t, 1);
  detail::require_dtype(fn, arg, t, scalar_type_of<T>());
  return {detail::data_of<T>(t), static_cast<std::size_t>(t.size(0)), static_cast<std::ptrdiff_t>(t.stride(0))};
}

//! A 2-D tensor of element type T as a strided matrix_view (no copy; any strides, transposes too).
template <class T>
[[nodiscard]] matrix_view<T> matrix_of(std::string_view fn, std::string_view arg, const at::Tensor& t) {
  detail::require_cpu(fn, arg, t, 2);
  detail::require_dtype(fn, arg, t, scalar_type_of<T>());
  return {detail::data_of<T>(t), static_cast<std::size_t>(t.size(0)), static_cast<std::size_t>(t.size(1)),
          static_cast<std::ptrdiff_t>(t.stride(0)), static_cast<std::ptrdiff_t>(t.stride(1))};
}

//! A contiguous 1-D tensor as a span (labels, group ids, offsets, per-response scores): the kernels
//! that take spans index them densely, so a strided tensor is rejected (call .contiguous()).
template <class T>
[[nodiscard]] std::span<T> span_of(std::string_view fn, std::string_view arg, const at::Tensor& t) {
  detail::require_cpu(fn, arg, t, 1);
  detail::require_dtype(fn, arg, t, scalar_type_of<T>());
  if (t.size(0) > 1 && t.stride(0) != 1)
    ulorl::detail::fail(fn, arg,
                        "has stride " + std::to_string(t.stride(0)) +
                            " but must be contiguous (this argument is read as a dense array; pass .contiguous())");
  return {detail::data_of<T>(t), static_cast<std::size_t>(t.size(0))};
}

//! Packed-layout offsets[B+1] (int32 or int64, contiguous), or none for the padded layout.
struct offsets_view {
  std::span<const std::int64_t> i64{};
  std::span<const std::int32_t> i32{};
  bool packed = false;
};

[[nodiscard]] inline offsets_view offsets_of(std::string_view fn, std::string_view arg, const at::Tensor& offsets) {
  offsets_view o;
  if (!offsets.defined()) return o;
  detail::require_cpu(fn, arg, offsets, 1);
  o.packed = true;
  if (offsets.scalar_type() == c10::ScalarType::Long)
    o.i64 = span_of<const std::int64_t>(fn, arg, offsets);
  else if (offsets.scalar_type() == c10::ScalarType::Int)
    o.i32 = span_of<const std::int32_t>(fn, arg, offsets);
  else
    ulorl::detail::fail(fn, arg,
                        std::string("has dtype ") + c10::toString(offsets.scalar_type()) + " but must be int32 or int64");
  if (o.i64.empty() && o.i32.empty()) ulorl::detail::fail(fn, arg, "must have B+1 >= 1 entries");
  return o;
}

//! Per-token values: a [B, T] tensor (padded; any strides) when `offsets` is not packed, else a
//! [total] tensor (any stride) whose row b is [offsets[b], offsets[b+1]).
template <class T>
[[nodiscard]] token_view<T> tokens_of(std::string_view fn, std::string_view arg, const at::Tensor& t,
                                      const offsets_view& offsets) {
  if (!offsets.packed) return token_view<T>::padded(matrix_of<T>(fn, arg, t));
  detail::require_cpu(fn, arg, t, 1);
  const vector_view<T> v = vector_of<T>(fn, arg, t);
  return offsets.i64.empty() ? token_view<T>::packed(v, offsets.i32) : token_view<T>::packed(v, offsets.i64);
}

//! An optional tensor argument: std::nullopt (Python's None) is the undefined tensor.
[[nodiscard]] inline at::Tensor or_undefined(const std::optional<at::Tensor>& t) { return t ? *t : at::Tensor(); }

//! An optional per-token argument as a view. Only an undefined tensor (None) is absent: the empty
//! view, which the core reads as "not given" (a mask: every token valid; weights: 1). A defined
//! tensor of any size is present: a zero-size one (whose data pointer torch leaves null) gets a
//! non-null address of no elements, so the callee never mistakes it for an absent argument and
//! checks its shape. This overload leaves the shape to the callee (a [B, T] or [B, 1] ratio).
template <class T>
[[nodiscard]] token_view<T> optional_tokens_of(std::string_view fn, std::string_view arg, const at::Tensor& t,
                                               const offsets_view& offsets) {
  if (!t.defined()) return {};
  const token_view<T> v = tokens_of<T>(fn, arg, t, offsets);
  if (v.data() != nullptr) return v;
  alignas(64) static std::byte no_elements[64];
  T* const p = reinterpret_cast<T*>(no_elements);
  if (v.kind() == layout::padded) return token_view<T>::padded(matrix_view<T>(p, v.rows(), v.cols(), 0, 0));
  const vector_view<T> none(p, v.size(), 0);
  return offsets.i64.empty() ? token_view<T>::packed(none, offsets.i32) : token_view<T>::packed(none, offsets.i64);
}
//! The same, and a given tensor must have the token shape of `ref` (named `ref_name`): a [0, T]
//! mask beside [B, T] log-probs is an error naming `arg`, never an absent mask.
template <class T, class U>
[[nodiscard]] token_view<T> optional_tokens_of(std::string_view fn, std::string_view arg, const at::Tensor& t,
                                               const offsets_view& offsets, std::string_view ref_name,
                                               const token_view<U>& ref) {
  const token_view<T> v = optional_tokens_of<T>(fn, arg, t, offsets);
  if (t.defined()) require_same_shape(fn, arg, v, ref_name, ref);
  return v;
}
template <class T>
[[nodiscard]] token_view<T> optional_tokens_of(std::string_view fn, std::string_view arg,
                                               const std::optional<at::Tensor>& t, const offsets_view& offsets) {
  return optional_tokens_of<T>(fn, arg, or_undefined(t), offsets);
}
template <class T, class U>
[[nodiscard]] token_view<T> optional_tokens_of(std::string_view fn, std::string_view arg,
                                               const std::optional<at::Tensor>& t, const offsets_view& offsets,
                                               std::string_view ref_name, const token_view<U>& ref) {
  return optional_tokens_of<T>(fn, arg, or_undefined(t), offsets, ref_name, ref);
}

//! An optional per-row argument (a bias [V]): undefined is absent (an empty view); a defined tensor
//! of any size is present and must hold `size` elements (`ref_name`'s count).
template <class T>
[[nodiscard]] vector_view<T> optional_vector_of(std::string_view fn, std::string_view arg, const at::Tensor& t,
                                                std::string_view ref_name, std::size_t size) {
  if (!t.defined()) return {};
  const vector_view<T> v = vector_of<T>(fn, arg, t);
  require_same_size(fn, arg, v.size(), ref_name, size);
  return v;
}

//! Runs ulorl's row-parallel kernels on torch's intra-op thread pool (at::set_num_threads). The
//! executor concept of ulorl/core/parallel.hpp: body(begin, end) on disjoint ranges of [0, n).
//! Inside another at::parallel_for region it runs on the calling thread, as torch's own ops do.
struct torch_executor {
  std::int64_t grain = 1;  //!< at::parallel_for's grain: rows per task at least

  template <class Body>
  void operator()(std::size_t n, Body&& body) const {
    if (n == 0) return;
    at::parallel_for(0, static_cast<std::int64_t>(n), grain, [&](std::int64_t b, std::int64_t e) {
      body(static_cast<std::size_t>(b), static_cast<std::size_t>(e));
    });
  }
};

//! The linear head's GEMM through libtorch (linear_head.hpp's Gemm concept): c = a b, or c += a b
//! when `accumulate`, a [m, k], b [k, n], c [m, n] with any strides. Views wrap the caller's memory
//! with at::from_blob (no copy of a or b; transposed operands reach BLAS as transposes); the result
//! is written into c itself (at::mm_out, addmm_), so a chunk's logits land in the workspace.
struct torch_gemm {
  template <class T>
  void operator()(matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c, bool accumulate) const {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "torch_gemm: float or double");
    const auto opt = at::TensorOptions().dtype(scalar_type_of<T>());
    const auto wrap = [&](const T* p, std::size_t r, std::size_t k, std::ptrdiff_t rs, std::ptrdiff_t cs) {
      return at::from_blob(const_cast<T*>(p), {static_cast<std::int64_t>(r), static_cast<std::int64_t>(k)},
                           {static_cast<std::int64_t>(rs), static_cast<std::int64_t>(cs)}, opt);
    };
    const c10::NoGradGuard no_grad;
    const at::Tensor ta = wrap(a.data(), a.rows(), a.cols(), a.row_stride(), a.col_stride());
    const at::Tensor tb = wrap(b.data(), b.rows(), b.cols(), b.row_stride(), b.col_stride());
    at::Tensor tc = wrap(c.data(), c.rows(), c.cols(), c.row_stride(), c.col_stride());
    if (accumulate)
      tc.addmm_(ta, tb);
    else
      at::mm_out(tc, ta, tb);
  }
};

}  // namespace th

ULORL_NAMESPACE_END
