// ulorl/logits/linear_head.hpp — the chunked fused linear head: hidden states [N, H] times the
// unembedding [V, H] (plus an optional bias [V]) straight into the per-row statistics and back to the
// gradients of the hidden states, the weight and the bias, without ever holding the [N, V] logits.
// Rows are processed in chunks of C; per chunk, in a caller-provided workspace of C x V values:
//   Z   = hidden[c] . weight^T + bias                 (GEMM, "A B^T")
//   log_prob, entropy, lse = logits_forward(Z / tau)   (the kernels of forward.hpp, unchanged)
//   g_lp, g_ent           = the loss's per-row gradients for the chunk (given, or from a functor)
//   dZ  = logits_backward(Z, ...)                     (in place in the workspace)
//   grad_hidden[c]  (+)= dZ . weight                  (GEMM, "A B")
//   grad_weight     (+)= dZ^T . hidden[c]             (GEMM, "A^T B"),   grad_bias (+)= colsum(dZ)
// Memory O(C x V) (plus 5 C doubles); W is read three times per chunk. This is what Liger's
// FusedLinearCrossEntropy and verl's fused linear-for-ppo compute, for any loss of the row's log-prob
// and entropy. policy_loss_from_hidden runs the whole policy loss of ulorl/loss/policy_loss.hpp on top:
// in one pass (three GEMMs per chunk) where a token's gradient follows from its own statistics (a
// token-level objective: the normaliser's row weights come from the mask), in two passes otherwise
// (a sequence-level objective, the rollout correction inside the loss or a statistics hook need every
// row's log-prob first: the forward GEMM runs twice, four GEMMs in all).
//
// Every gradient element is summed in a fixed order that does not depend on the chunk size or the
// executor's split (grad_weight and grad_bias accumulate in place, row after row), so the results are
// bitwise identical for any chunk_rows and any thread count.
// The GEMMs are plain header code: register-tiled micro-kernels over GCC/Clang vector extensions at
// the width of simd.hpp (float; double and other compilers use scalar loops), cache-blocked, and a
// simple loop nest for operands whose inner stride is not 1. A caller with a BLAS passes it as the
// `gemm` functor (see builtin_gemm): the three GEMMs per chunk then go to it, and the summation
// order (so the bitwise independence of chunk size and thread count) is whatever that BLAS does.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/views.hpp"
#include "ulorl/logits/backward.hpp"
#include "ulorl/logits/forward.hpp"
#include "ulorl/logits/fused_loss.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/logits/simd.hpp"
#include "ulorl/loss/policy_loss.hpp"

ULORL_NAMESPACE_BEGIN

//! How a gradient output is written.
enum class grad_mode {
  overwrite,   //!< output = this call's gradient
  accumulate,  //!< output += this call's gradient (micro-batch accumulation, torch's .grad)
};

//! Options of the linear-head functions.
struct linear_head_config {
  double temperature = 1.0;                            //!< logits are (hidden . weight^T + bias) / temperature
  std::size_t chunk_rows = 0;                          //!< rows per chunk C; 0: automatic from workspace_budget
  std::size_t workspace_budget = std::size_t{256} << 20;  //!< bytes the automatic C aims at (C >= 1 always)
  //! The value scan (every function): reject NaN / inf in hidden, weight, bias and magnitudes whose
  //! logits could overflow, before writing anything (one read of hidden and weight, small next to
  //! the GEMM). false: a NaN / inf reaches the logits, and the rows it touches get NaN statistics
  //! and gradients (a NaN in a weight row touches every row).
  bool check_values = true;
  bool fast_backward = false;                          //!< logits_config::fast_backward
  grad_mode grad_hidden = grad_mode::overwrite;        //!< grad_hidden: activations of this batch
  grad_mode grad_weight = grad_mode::accumulate;       //!< grad_weight and grad_bias: parameters
};

//! The head's inputs: hidden [N, H] and weight [V, H] (float or double, any strides; unit column
//! strides take the fast path), bias [V] or empty.
template <class T>
struct linear_head_inputs {
  matrix_view<const T> hidden;
  matrix_view<const T> weight;
  vector_view<const T> bias{};
};

//! Gradient outputs; each may be empty (not wanted): hidden [N, H], weight [V, H], bias [V].
template <class T>
struct linear_head_grads {
  matrix_view<T> hidden{};
  matrix_view<T> weight{};
  vector_view<T> bias{};
};

//! The default `gemm` of the linear-head functions: ulorl's own kernels above, on the executor.
//! Any other functor is called as
//!   gemm(matrix_view<const T> a, matrix_view<const T> b, matrix_view<T> c, bool accumulate)
//! and must compute c = a b (accumulate: c += a b) for a [m, k], b [k, n], c [m, n] with any
//! strides (transposed operands arrive as views with swapped strides; c never aliases a or b).
//! Per chunk of C rows it is called three times: Z = hidden[c] weight^T (into the workspace),
//! grad_hidden[c] += dZ weight, grad_weight += dZ^T hidden[c]; the bias and its gradient stay on
//! the executor. The functor does its own threading (a BLAS's pool).
struct builtin_gemm {};

namespace detail::head {
// Workspace layout constants (ISA-independent: the size query must agree across builds).
inline constexpr std::size_t ws_align = 64;
inline constexpr std::size_t row_doubles = 5;  // log_prob, entropy, lse, grad_log_prob, grad_entropy
template <class T>
constexpr std::size_t row_bytes(std::size_t v) noexcept {
  return v * sizeof(T) + row_doubles * sizeof(double);
}

inline namespace ULORL_ISA {

// ---- GEMM micro-kernels -------------------------------------------------------------------------

//! Lanes of the micro-kernels (core/simd.hpp): the native vector of float, else one element.
#ifdef ULORL_SIMD
template <class T>
using lanes = std::conditional_t<std::is_same_v<T, float>, simd::vec_lanes<float>, simd::scalar_lanes<T>>;
#else
template <class T>
using lanes = simd::scalar_lanes<T>;
#endif

//! Register tile sizes: 32 vector registers with AVX-512, 16 elsewhere.
template <class T>
inline constexpr int nt_mr = 4;
template <class T>
inline constexpr int nt_nr = lanes<T>::N >= 16 ? 4 : 2;
template <class T>
inline constexpr int nn_mr = 4;
template <class T>
inline constexpr int nn_nv = lanes<T>::N >= 16 ? 4 : 2;

using idx = std::ptrdiff_t;
ULORL_ALWAYS_INLINE idx sx(std::size_t v) noexcept { return static_cast<idx>(v); }

//! c[i, j] = sum_k a[i, k] b[j, k] for an MR x NR tile; a and b rows contiguous in k.
template <class T, int MR, int NR>
ULORL_ALWAYS_INLINE void nt_tile(const T* a, idx lda, const T* b, idx ldb, std::size_t k, T* c, idx ldc) noexcept {
  using L = lanes<T>;
  typename L::V acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = L::splat(T(0));
  std::size_t p = 0;
  for (; p + L::N <= k; p += L::N) {
    typename L::V bv[NR];
    for (int j = 0; j < NR; ++j) bv[j] = L::load(b + j * ldb + sx(p));
    for (int i = 0; i < MR; ++i) {
      const typename L::V av = L::load(a + i * lda + sx(p));
      for (int j = 0; j < NR; ++j) acc[i][j] += av * bv[j];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      T s = L::sum(acc[i][j]);
      for (std::size_t q = p; q < k; ++q) s += a[i * lda + sx(q)] * b[j * ldb + sx(q)];
      c[i * ldc + j] = s;
    }
}

template <class T, int MR>
void nt_row_block(const T* a, idx lda, const T* b, idx ldb, std::size_t j0, std::size_t j1, std::size_t k, T* c,
                  idx ldc) noexcept {
  constexpr int NR = nt_nr<T>;
  std::size_t j = j0;
  for (; j + NR <= j1; j += NR) nt_tile<T, MR, NR>(a, lda, b + sx(j) * ldb, ldb, k, c + sx(j), ldc);
  for (; j < j1; ++j) nt_tile<T, MR, 1>(a, lda, b + sx(j) * ldb, ldb, k, c + sx(j), ldc);
}

//! c[i, j] = sum_k a[i, k] b[j, k], i < m, j in [j0, j1); a, b rows contiguous in k, c rows contiguous.
//! Blocks of b rows stay in L2 while every row group of a passes over them.
template <class T>
void gemm_nt(const T* a, idx lda, std::size_t m, const T* b, idx ldb, std::size_t j0, std::size_t j1, std::size_t k,
             T* c, idx ldc) noexcept {
  constexpr int MR = nt_mr<T>;
  const std::size_t nb = std::max<std::size_t>(16, (std::size_t{256} << 10) / (std::max<std::size_t>(k, 1) * sizeof(T)));
  for (std::size_t jb = j0; jb < j1; jb += nb) {
    const std::size_t je = std::min(j1, jb + nb);
    const std::size_t full = m - m % MR;
    for (std::size_t i = 0; i < full; i += MR)
      nt_row_block<T, MR>(a + sx(i) * lda, lda, b, ldb, jb, je, k, c + sx(i) * ldc, ldc);
    for (std::size_t i = full; i < m; ++i) nt_row_block<T, 1>(a + sx(i) * lda, lda, b, ldb, jb, je, k, c + sx(i) * ldc, ldc);
  }
}

//! c[i, h] += sum_{p < k} a[i ams + p aks] b[p, h] for an MR x (NV lanes) tile, p in order.
template <class T, int MR, int NV>
ULORL_ALWAYS_INLINE void nn_tile(const T* a, idx ams, idx aks, const T* b, idx ldb, std::size_t k, T* c,
                                 idx ldc) noexcept {
  using L = lanes<T>;
  constexpr idx w = static_cast<idx>(L::N);
  typename L::V acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = L::load(c + i * ldc + v * w);
  for (std::size_t p = 0; p < k; ++p) {
    const T* bp = b + sx(p) * ldb;
    typename L::V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = L::load(bp + v * w);
    for (int i = 0; i < MR; ++i) {
      const typename L::V av = L::splat(a[i * ams + sx(p) * aks]);
      for (int v = 0; v < NV; ++v) acc[i][v] += av * bv[v];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) L::store(c + i * ldc + v * w, acc[i][v]);
}

template <class T, int MR>
void nn_row_block(const T* a, idx ams, idx aks, const T* b, idx ldb, std::size_t h0, std::size_t h1, std::size_t k,
                  T* c, idx ldc) noexcept {
  constexpr std::size_t w = lanes<T>::N;
  constexpr int NV = nn_nv<T>;
  std::size_t h = h0;
  for (; h + NV * w <= h1; h += NV * w) nn_tile<T, MR, NV>(a, ams, aks, b + sx(h), ldb, k, c + sx(h), ldc);
  for (; h + w <= h1; h += w) nn_tile<T, MR, 1>(a, ams, aks, b + sx(h), ldb, k, c + sx(h), ldc);
  for (; h < h1; ++h)
    for (int i = 0; i < MR; ++i) {
      T s = c[i * ldc + sx(h)];
      for (std::size_t p = 0; p < k; ++p) s += a[i * ams + sx(p) * aks] * b[sx(p) * ldb + sx(h)];
      c[i * ldc + sx(h)] = s;
    }
}

//! c[i, h] += sum_p a[i ams + p aks] b[p, h], i < m, h in [h0, h1), p in order 0..k-1 (in blocks of
//! kc: each element sees the same sequence of additions whatever the blocking); b and c rows contiguous.
template <class T>
void gemm_nn(const T* a, idx ams, idx aks, std::size_t m, const T* b, idx ldb, std::size_t h0, std::size_t h1,
             std::size_t k, T* c, idx ldc) noexcept {
  constexpr int MR = nn_mr<T>;
  // A kc x (h1 - h0) panel of b (~256 KiB) stays in L2 while every row group of c passes over it.
  const std::size_t kc =
      std::max<std::size_t>(16, (std::size_t{256} << 10) / (std::max<std::size_t>(h1 - h0, 1) * sizeof(T)));
  for (std::size_t p0 = 0; p0 < k; p0 += kc) {
    const std::size_t kn = std::min(kc, k - p0);
    const T* ap = a + sx(p0) * aks;
    const T* bp = b + sx(p0) * ldb;
    const std::size_t full = m - m % MR;
    for (std::size_t i = 0; i < full; i += MR)
      nn_row_block<T, MR>(ap + sx(i) * ams, ams, aks, bp, ldb, h0, h1, kn, c + sx(i) * ldc, ldc);
    for (std::size_t i = full; i < m; ++i)
      nn_row_block<T, 1>(ap + sx(i) * ams, ams, aks, bp, ldb, h0, h1, kn, c + sx(i) * ldc, ldc);
  }
}

// ---- validation -----------------------------------------------------------------------------------

template <class T>
void require_matrix(const char* fn, const char* arg, matrix_view<T> m) {
  logits::require_pointer(fn, arg, m.data(), m.size());
}

//! The largest |m(r, c)| of a matrix whose every element is finite; a non-finite element raises
//! ulorl::error naming `arg`, its flat index, row and column. One vectorised pass over unit-stride
//! rows (simd::max_abs_bits); only when that pass finds a non-finite value, or a row is strided,
//! does the element-wise loop run.
template <class T>
double finite_max_abs(const char* fn, const char* arg, matrix_view<const T> m) {
  using U = simd::uint_of_t<T>;
  constexpr U inf_bits = simd::inf_bits<T>;
  U hi = 0;
  bool exact = m.col_stride() != 1 && m.cols() > 1;
  for (std::size_t r = 0; r < m.rows() && !exact; ++r) {
    const U b = simd::max_abs_bits(&m(r, 0), m.cols());
    hi = hi > b ? hi : b;
    exact = hi >= inf_bits;
  }
  if (!exact) return static_cast<double>(ulorl::detail::bit_cast<T>(hi));
  double a = 0;
  for (std::size_t r = 0; r < m.rows(); ++r)
    for (std::size_t c = 0; c < m.cols(); ++c) {
      const double x = static_cast<double>(m(r, c));
      if (!std::isfinite(x))
        detail::fail_at(fn, arg, static_cast<std::int64_t>(r * m.cols() + c), x,
                        "must be finite (row " + std::to_string(r) + ", column " + std::to_string(c) + ")");
      a = std::max(a, std::fabs(x));
    }
  return a;
}

template <class T, class I>
void validate_inputs(const char* fn, const linear_head_inputs<T>& in, std::span<const I> labels, double temperature) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "hidden and weight are float or double");
  static_assert(std::is_integral_v<I>, "labels must be integers");
  logits::require_temperature<T>(fn, temperature);
  const std::size_t n = in.hidden.rows(), h = in.hidden.cols(), v = in.weight.rows();
  if (v == 0) detail::fail(fn, "weight", "has V = 0 rows: no vocabulary");
  if (h == 0) detail::fail(fn, "hidden", "has H = 0 columns");
  if (in.weight.cols() != h)
    detail::fail(fn, "weight",
                 "has " + std::to_string(in.weight.cols()) + " columns but 'hidden' has H = " + std::to_string(h) +
                     " (weight is [V, H], the unembedding as stored by torch's nn.Linear)");
  require_matrix(fn, "hidden", in.hidden);
  require_matrix(fn, "weight", in.weight);
  if (in.bias.size() != 0) {
    require_same_size(fn, "bias", in.bias.size(), "weight rows", v);
    logits::require_pointer(fn, "bias", in.bias.data(), in.bias.size());
  }
  require_same_size(fn, "labels", labels.size(), "hidden rows", n);
  for (std::size_t r = 0; r < n; ++r) {
    const I y = labels[r];
    if (y < I(0) || static_cast<std::uint64_t>(y) >= static_cast<std::uint64_t>(v))
      detail::fail_at(fn, "labels", static_cast<std::int64_t>(r), static_cast<std::int64_t>(y),
                      "must be in [0, V) with V = " + std::to_string(v) + " (row " + std::to_string(r) + ")");
  }
}

//! Non-finite values, magnitudes whose products could overflow T (H max|h| max|w| + max|b|), and
//! that bound over the temperature beyond half the range of T (logits_forward's value-scan rule):
//! after this no logit, no scaled logit, and so no statistic can be non-finite.
template <class T>
void validate_values(const char* fn, const linear_head_inputs<T>& in, double temperature) {
  const double mh = finite_max_abs(fn, "hidden", in.hidden), mw = finite_max_abs(fn, "weight", in.weight);
  double mb = 0;
  for (std::size_t j = 0; j < in.bias.size(); ++j) {
    const double b = static_cast<double>(in.bias[j]);
    if (!std::isfinite(b)) detail::fail_at(fn, "bias", static_cast<std::int64_t>(j), b, "must be finite");
    mb = std::max(mb, std::fabs(b));
  }
  const double lim = static_cast<double>(std::numeric_limits<T>::max()) / 4;
  const bool over = mb > lim || (mh > 0 && mw > 0 &&
                                 std::log(mh) + std::log(mw) + std::log(static_cast<double>(in.hidden.cols())) >
                                     std::log(lim - mb));
  if (over)
    detail::fail_value(fn, "hidden", mh,
                       "is the largest |hidden| and with the largest |weight| = " + std::to_string(mw) +
                           " a logit could overflow (H max|hidden| max|weight| + max|bias| must stay below "
                           "max/4 of the element type)");
  // Below max/4, the bound itself is finite in double.
  const double bound = static_cast<double>(in.hidden.cols()) * mh * mw + mb;
  if (bound / temperature > static_cast<double>(std::numeric_limits<T>::max()) / 2)
    detail::fail_value(fn, "temperature", temperature,
                       "scales logits up to H max|hidden| max|weight| + max|bias| = " + std::to_string(bound) +
                           " beyond half the range of the element type (the log-sum-exp would overflow)");
}

template <class T>
void require_grad_matrix(const char* fn, const char* arg, matrix_view<T> g, std::size_t rows, std::size_t cols,
                       const char* shape) {
  if (g.size() == 0 && g.data() == nullptr) return;
  if (g.rows() != rows || g.cols() != cols)
    detail::fail(fn, arg,
                 "has shape [" + std::to_string(g.rows()) + ", " + std::to_string(g.cols()) + "] but must be " +
                     shape + " = [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  logits::require_pointer(fn, arg, g.data(), g.size());
  require_distinct_elements(fn, arg, g);
}

template <class S>
void require_stat_output(const char* fn, const char* arg, vector_view<S> out, std::size_t n, bool optional) {
  if (optional && out.size() == 0) return;
  require_same_size(fn, arg, out.size(), "hidden rows", n);
  logits::require_pointer(fn, arg, out.data(), out.size());
}

// ---- workspace ------------------------------------------------------------------------------------

inline std::byte* align_up(std::byte* p) noexcept {
  const auto u = reinterpret_cast<std::uintptr_t>(p);
  return p + static_cast<std::ptrdiff_t>((ws_align - u % ws_align) % ws_align);
}

}  // namespace ULORL_ISA
}  // namespace detail::head

//! Rows per chunk for N rows and vocabulary V: cfg.chunk_rows if set, else the most rows whose
//! workspace fits cfg.workspace_budget (at least 1); never more than N.
template <class T>
[[nodiscard]] constexpr std::size_t linear_head_chunk_rows(std::size_t n, std::size_t v,
                                                           const linear_head_config& cfg = {}) noexcept {
  std::size_t c = cfg.chunk_rows;
  if (c == 0) {
    const std::size_t avail = cfg.workspace_budget > 2 * detail::head::ws_align ? cfg.workspace_budget - 2 * detail::head::ws_align : 0;
    c = std::max<std::size_t>(1, avail / detail::head::row_bytes<T>(v));
  }
  return std::min(c, n);
}

//! Bytes of the workspace the linear-head functions need for N rows, V = weight rows, element type T:
//!   C (V sizeof(T) + 5 sizeof(double)) + 128 (alignment),  C = linear_head_chunk_rows<T>(N, V, cfg).
template <class T>
[[nodiscard]] constexpr std::size_t linear_head_workspace_bytes(std::size_t n, std::size_t v,
                                                                const linear_head_config& cfg = {}) noexcept {
  const std::size_t c = linear_head_chunk_rows<T>(n, v, cfg);
  return c == 0 ? 0 : c * detail::head::row_bytes<T>(v) + 2 * detail::head::ws_align;
}

namespace detail::head {
inline namespace ULORL_ISA {

//! The caller's workspace, or one allocated for this call when the caller passed none.
template <class T>
struct scratch {
  std::unique_ptr<std::byte[]> owned;
  T* logits = nullptr;
  double* stats = nullptr;  // [5][C]
  std::size_t rows = 0;
};

template <class T>
scratch<T> make_scratch(const char* fn, std::size_t n, std::size_t v, const linear_head_config& cfg,
                        std::span<std::byte> ws) {
  scratch<T> s;
  s.rows = linear_head_chunk_rows<T>(n, v, cfg);
  const std::size_t need = linear_head_workspace_bytes<T>(n, v, cfg);
  if (need == 0) return s;
  std::byte* base = ws.data();
  if (ws.empty()) {
    s.owned.reset(new std::byte[need]);
    base = s.owned.get();
  } else if (ws.size() < need) {
    detail::fail(fn, "workspace",
                 "has " + std::to_string(ws.size()) + " bytes but chunks of " + std::to_string(s.rows) + " rows need " +
                     std::to_string(need) + " (linear_head_workspace_bytes)");
  }
  std::byte* p = align_up(base);
  s.logits = reinterpret_cast<T*>(p);
  s.stats = reinterpret_cast<double*>(align_up(p + static_cast<std::ptrdiff_t>(s.rows * v * sizeof(T))));
  return s;
}

template <class Gemm>
inline constexpr bool is_builtin_gemm_v = std::is_same_v<std::remove_cvref_t<Gemm>, builtin_gemm>;

//! Rows [r0, r0 + c) of a matrix view.
template <class T>
matrix_view<T> rows_of(matrix_view<T> m, std::size_t r0, std::size_t c) noexcept {
  return {m.data() + sx(r0) * m.row_stride(), c, m.cols(), m.row_stride(), m.col_stride()};
}
//! The transpose of a matrix view (no copy: swapped strides).
template <class T>
matrix_view<T> transposed(matrix_view<T> m) noexcept {
  return {m.data(), m.cols(), m.rows(), m.col_stride(), m.row_stride()};
}

//! Logits of rows [r0, r0 + c) into z [c, V] (row stride V): z = hidden . weight^T + bias.
template <class T, class Exec, class Gemm = builtin_gemm>
void chunk_logits(const linear_head_inputs<T>& in, std::size_t r0, std::size_t c, T* z, Exec& exec, Gemm&& gemm = {}) {
  const std::size_t v = in.weight.rows(), h = in.hidden.cols();
  const matrix_view<const T> hid = in.hidden, w = in.weight;
  if constexpr (!is_builtin_gemm_v<Gemm>) {
    gemm(rows_of(hid, r0, c), transposed(w), matrix_view<T>(z, c, v), false);
    if (in.bias.size() != 0)
      exec(c, [&](std::size_t i0, std::size_t i1) {
        for (std::size_t i = i0; i < i1; ++i)
          for (std::size_t j = 0; j < v; ++j) z[sx(i * v + j)] += in.bias[j];
      });
    return;
  }
  const bool fast = (hid.col_stride() == 1 || h == 1) && (w.col_stride() == 1 || h == 1);
  const std::size_t nb = 64;  // vocabulary rows per task
  exec((v + nb - 1) / nb, [&](std::size_t b0, std::size_t b1) {
    const std::size_t j0 = b0 * nb, j1 = std::min(v, b1 * nb);
    if (fast) {
      gemm_nt<T>(&hid(r0, 0), hid.row_stride(), c, w.data(), w.row_stride(), j0, j1, h, z, sx(v));
    } else {
      for (std::size_t i = 0; i < c; ++i)
        for (std::size_t j = j0; j < j1; ++j) {
          T s = 0;
          for (std::size_t k = 0; k < h; ++k) s += hid(r0 + i, k) * w(j, k);
          z[sx(i * v + j)] = s;
        }
    }
    if (in.bias.size() != 0)
      for (std::size_t i = 0; i < c; ++i)
        for (std::size_t j = j0; j < j1; ++j) z[sx(i * v + j)] += in.bias[j];
  });
}

//! grad_hidden[r0 + i, :] += dz[i, :] . weight (every element summed over j = 0..V-1 in order); with
//! a caller's GEMM and `overwrite`, = instead of += (the builtin GEMM always adds: run() zeroes first).
template <class T, class Exec, class Gemm = builtin_gemm>
void chunk_grad_hidden(const linear_head_inputs<T>& in, std::size_t r0, std::size_t c, const T* dz,
                       matrix_view<T> gh, bool overwrite, Exec& exec, Gemm&& gemm = {}) {
  const std::size_t v = in.weight.rows(), h = in.hidden.cols();
  const matrix_view<const T> w = in.weight;
  if constexpr (!is_builtin_gemm_v<Gemm>) {
    gemm(matrix_view<const T>(dz, c, v), w, rows_of(gh, r0, c), !overwrite);
    return;
  }
  ULORL_ASSERT(!overwrite && "the builtin GEMM adds: run() zeroes first");
  (void)overwrite;
  const bool fast = (w.col_stride() == 1 || h == 1) && (gh.col_stride() == 1 || h == 1);
  const std::size_t hb = lanes<T>::N * static_cast<std::size_t>(nn_nv<T>);  // columns per task
  exec((h + hb - 1) / hb, [&](std::size_t b0, std::size_t b1) {
    const std::size_t h0 = b0 * hb, h1 = std::min(h, b1 * hb);
    if (fast) {
      gemm_nn<T>(dz, sx(v), 1, c, w.data(), w.row_stride(), h0, h1, v, &gh(r0, 0), gh.row_stride());
    } else {
      for (std::size_t i = 0; i < c; ++i)
        for (std::size_t k = h0; k < h1; ++k) {
          T s = gh(r0 + i, k);
          for (std::size_t j = 0; j < v; ++j) s += dz[sx(i * v + j)] * w(j, k);
          gh(r0 + i, k) = s;
        }
    }
  });
}

//! grad_weight[j, :] += sum_i dz[i, j] hidden[r0 + i, :] (i in order), grad_bias[j] += sum_i dz[i, j];
//! with a caller's GEMM and `overwrite`, grad_weight = instead of += (the bias always adds).
template <class T, class Exec, class Gemm = builtin_gemm>
void chunk_grad_weight(const linear_head_inputs<T>& in, std::size_t r0, std::size_t c, const T* dz,
                       matrix_view<T> gw, vector_view<T> gb, bool overwrite, Exec& exec, Gemm&& gemm = {}) {
  const std::size_t v = in.weight.rows(), h = in.hidden.cols();
  const matrix_view<const T> hid = in.hidden;
  if constexpr (!is_builtin_gemm_v<Gemm>) {
    if (gw.data() != nullptr) gemm(transposed(matrix_view<const T>(dz, c, v)), rows_of(hid, r0, c), gw, !overwrite);
    if (gb.size() != 0)
      exec(v, [&](std::size_t j0, std::size_t j1) {
        for (std::size_t i = 0; i < c; ++i)
          for (std::size_t j = j0; j < j1; ++j) gb[j] += dz[sx(i * v + j)];
      });
    return;
  }
  ULORL_ASSERT(!overwrite && "the builtin GEMM adds: run() zeroes first");
  (void)overwrite;
  const bool fast = (hid.col_stride() == 1 || h == 1) && (gw.col_stride() == 1 || h == 1);
  const std::size_t nb = 64;  // vocabulary rows per task
  exec((v + nb - 1) / nb, [&](std::size_t b0, std::size_t b1) {
    const std::size_t j0 = b0 * nb, j1 = std::min(v, b1 * nb);
    if (gw.data() != nullptr) {
      if (fast) {
        gemm_nn<T>(dz + sx(j0), 1, sx(v), j1 - j0, &hid(r0, 0), hid.row_stride(), 0, h, c, &gw(j0, 0),
                   gw.row_stride());
      } else {
        for (std::size_t j = j0; j < j1; ++j)
          for (std::size_t k = 0; k < h; ++k) {
            T s = gw(j, k);
            for (std::size_t i = 0; i < c; ++i) s += dz[sx(i * v + j)] * hid(r0 + i, k);
            gw(j, k) = s;
          }
      }
    }
    if (gb.size() != 0)
      for (std::size_t i = 0; i < c; ++i)
        for (std::size_t j = j0; j < j1; ++j) gb[j] += dz[sx(i * v + j)];
  });
}

template <class T>
void zero(matrix_view<T> m) noexcept {
  for (std::size_t r = 0; r < m.rows(); ++r)
    for (std::size_t c = 0; c < m.cols(); ++c) m(r, c) = T(0);
}

//! Receives nothing: the forward-only and statistics-free paths.
struct no_stats {
  void operator()(std::size_t, std::size_t, const double*, const double*, const double*) const noexcept {}
};
//! Marks the forward-only path.
struct no_grad {};

//! The chunk loop shared by every public function. `stats(first, count, log_prob, entropy, lse)`
//! sees each chunk's statistics; `grad_fn` (unless no_grad) maps them to the per-row gradients.
//! Inputs are validated by the caller.
template <class T, class I, class Stats, class GradFn, class Exec, class Gemm = builtin_gemm>
void run(const char* fn, const linear_head_inputs<T>& in, std::span<const I> labels, Stats&& stats, GradFn& grad_fn,
         const linear_head_grads<T>& g, const linear_head_config& cfg, std::span<std::byte> workspace, Exec& exec,
         Gemm&& gemm = {}) {
  constexpr bool backward = !std::is_same_v<std::remove_cvref_t<GradFn>, no_grad>;
  const std::size_t n = in.hidden.rows(), v = in.weight.rows();
  scratch<T> s = make_scratch<T>(fn, n, v, cfg, workspace);
  // A caller's GEMM overwrites instead of adding to zeros: each chunk's own rows of grad_hidden,
  // and grad_weight in the first chunk (a pass over [V, H] less; a sum that starts at the GEMM's
  // product instead of 0 + product differs only in the sign of a zero). The builtin GEMM adds,
  // and with no rows there is no first chunk: zeroes first in both cases.
  const bool gemm_overwrites = !is_builtin_gemm_v<Gemm> && n > 0;
  const bool over_w = cfg.grad_weight == grad_mode::overwrite;
  // Whether the GEMM writes (=) instead of adding: exactly the gradients not zeroed here.
  const bool write_h = gemm_overwrites && cfg.grad_hidden == grad_mode::overwrite, write_w = gemm_overwrites && over_w;
  if constexpr (backward) {
    if (g.hidden.data() != nullptr && cfg.grad_hidden == grad_mode::overwrite && !write_h) zero(g.hidden);
    if (over_w) {
      if (g.weight.data() != nullptr && !write_w) zero(g.weight);
      for (std::size_t j = 0; j < g.bias.size(); ++j) g.bias[j] = T(0);
    }
  }
  const logits_config lcfg{.temperature = cfg.temperature, .check_values = false, .fast_backward = cfg.fast_backward};
  const std::size_t cmax = s.rows;
  double* const lp = s.stats;
  double* const ent = s.stats + cmax;
  double* const lse = s.stats + 2 * cmax;
  double* const glp = s.stats + 3 * cmax;
  double* const gent = s.stats + 4 * cmax;
  for (std::size_t r0 = 0; r0 < n; r0 += cmax) {
    const std::size_t c = std::min(cmax, n - r0);
    chunk_logits(in, r0, c, s.logits, exec, gemm);
    const matrix_view<T> z(s.logits, c, v);
    const auto y = labels.subspan(r0, c);
    logits_forward(matrix_view<const T>(z), y, vector_view<double>(lp, c), vector_view<double>(ent, c),
                   vector_view<double>(lse, c), lcfg, exec);
    stats(r0, c, static_cast<const double*>(lp), static_cast<const double*>(ent), static_cast<const double*>(lse));
    if constexpr (backward) {
      std::fill(glp, glp + c, 0.0);
      std::fill(gent, gent + c, 0.0);
      grad_fn(r0, std::span<const double>(lp, c), std::span<const double>(ent, c), std::span<double>(glp, c),
              std::span<double>(gent, c));
      for (std::size_t i = 0; i < c; ++i) {
        if (!std::isfinite(glp[i]))
          detail::fail_at(fn, "grad_log_prob", static_cast<std::int64_t>(r0 + i), glp[i],
                          "must be finite (from the gradient functor; earlier chunks' gradients are already written)");
        if (!std::isfinite(gent[i]))
          detail::fail_at(fn, "grad_entropy", static_cast<std::int64_t>(r0 + i), gent[i],
                          "must be finite (from the gradient functor; earlier chunks' gradients are already written)");
      }
      logits_backward(matrix_view<const T>(z), y, vector_view<const double>(lse, c), vector_view<const double>(ent, c),
                      vector_view<const double>(glp, c), vector_view<const double>(gent, c), z, lcfg, exec);
      if (g.hidden.data() != nullptr) chunk_grad_hidden(in, r0, c, s.logits, g.hidden, write_h, exec, gemm);
      if (g.weight.data() != nullptr || g.bias.size() != 0)
        chunk_grad_weight(in, r0, c, s.logits, g.weight, g.bias, write_w && r0 == 0, exec, gemm);
    }
  }
}

template <class T>
void validate_grads(const char* fn, const linear_head_inputs<T>& in, const linear_head_grads<T>& g) {
  const std::size_t n = in.hidden.rows(), h = in.hidden.cols(), v = in.weight.rows();
  require_grad_matrix(fn, "grad_hidden", g.hidden, n, h, "[N, H]");
  require_grad_matrix(fn, "grad_weight", g.weight, v, h, "[V, H]");
  if (g.bias.size() != 0) {
    require_same_size(fn, "grad_bias", g.bias.size(), "weight rows", v);
    logits::require_pointer(fn, "grad_bias", g.bias.data(), g.bias.size());
  }
}

//! Writes a chunk's statistics into the caller's [N] outputs (each may be empty).
template <class S>
struct stats_sink {
  vector_view<S> log_prob, entropy, lse;
  void operator()(std::size_t r0, std::size_t c, const double* lp, const double* ent, const double* ls) const noexcept {
    for (std::size_t i = 0; i < c; ++i) {
      if (log_prob.size() != 0) log_prob[r0 + i] = static_cast<S>(lp[i]);
      if (entropy.size() != 0) entropy[r0 + i] = static_cast<S>(ent[i]);
      if (lse.size() != 0) lse[r0 + i] = static_cast<S>(ls[i]);
    }
  }
};

//! Flat token index -> element of a token_view, for indices visited in increasing order.
template <class T>
struct token_cursor {
  const token_view<T>* view;
  std::size_t b = 0;
  T& operator()(std::size_t flat) {
    while (flat >= view->row_begin(b) + view->row_size(b)) ++b;
    return (*view)(b, flat - view->row_begin(b));
  }
};

//! Whether policy_loss_from_hidden takes each token's gradient from its own chunk (one pass): a
//! token-level objective (a sequence-level one needs its whole row), no rollout correction inside
//! the loss (its weights need the row), and log-probs whose check does not wait for the loss's value
//! scan (the head's scan on, which makes them finite, or the loss's scan off).
inline bool one_pass_applies(const char* fn, const policy_loss_config& cfg, const linear_head_config& hcfg) {
  if (cfg.rollout || (cfg.check_values && !hcfg.check_values)) return false;
  return visit_objective(fn, cfg.objective,
                         [](const auto& d) { return std::remove_cvref_t<decltype(d)>::level == objective_level::token; });
}

//! Validates every token input and output of the loss before the one pass writes the first gradient:
//! the statistics do not exist yet, so a broadcast 0 in old_log_prob's layout stands in for the
//! log-probs and the entropies (the loss checks the real ones after the pass).
template <class P, class M>
void validate_one_pass_loss(const char* fn, const policy_loss_inputs<P, M>& in, const policy_loss_config& cfg,
                            const logits_loss_buffers<P>& buf) {
  static constexpr P zero = 0;
  policy_loss_inputs<P, M> stand_in = in;
  stand_in.log_prob = token_view<const P>::broadcast(&zero, in.old_log_prob);
  if (cfg.entropy_coef != 0.0) stand_in.entropy = stand_in.log_prob;
  validate_policy_loss(fn, stand_in, buf.grad_log_prob, cfg.entropy_coef != 0.0 ? buf.grad_entropy : token_view<P>(),
                       cfg, sequential_executor{});
}

//! The per-token gradients of the loss for the head, chunk by chunk (a token-level objective): for
//! token (b, t), policy_token_loss on the chunk's statistics (as written into `buf`) times row b's
//! aggregation weight, as the loss's row kernels compute it (up to FMA contraction).
template <class P, class M>
struct one_pass_gradients {
  const policy_loss_inputs<P, M>& in;  // mask: the caller's or the all-valid broadcast
  const logits_loss_buffers<P>& buf;
  const policy_loss_config& cfg;
  token_loss_params<P> params;
  std::vector<double> row_w;  // d loss / d L[b, t] of each row's valid tokens
  std::size_t b = 0;

  one_pass_gradients(const policy_loss_inputs<P, M>& in_, const logits_loss_buffers<P>& buf_, const policy_loss_config& cfg_)
      : in(in_), buf(buf_), cfg(cfg_), params(make_token_loss_params<P>(cfg_)), row_w(in_.old_log_prob.rows()) {
    for (std::size_t r = 0; r < row_w.size(); ++r) row_w[r] = row_weight(cfg.normalizer, row_tokens(in.mask, r));
  }
  void operator()(std::size_t r0, std::span<const double>, std::span<const double>, std::span<double> glp,
                  std::span<double> gent) {
    const token_view<const P>& old = in.old_log_prob;
    const bool has_kl = cfg.kl_coef != 0.0, has_w = !in.weights.empty(), with_entropy = cfg.entropy_coef != 0.0;
    for (std::size_t i = 0; i < glp.size(); ++i) {
      const std::size_t f = r0 + i;
      while (f >= old.row_begin(b) + old.row_size(b)) ++b;
      const std::size_t t = f - old.row_begin(b);
      if (in.mask(b, t) == M(0)) continue;  // glp and gent arrive zeroed
      const token_loss<P> tl =
          policy_token_loss<P>(buf.log_prob(b, t), old(b, t), has_kl ? in.ref_log_prob(b, t) : P(0), in.advantages(b, t),
                               has_w ? in.weights(b, t) : P(1), with_entropy ? buf.entropy(b, t) : P(0), params);
      glp[i] = static_cast<double>(static_cast<P>(row_w[b]) * tl.dlogp);
      if (with_entropy) gent[i] = static_cast<double>(static_cast<P>(-row_w[b] * cfg.entropy_coef));
    }
  }
};

}  // namespace ULORL_ISA
}  // namespace detail::head

inline namespace ULORL_ISA {

//! Per-row chosen-token log-prob, entropy and log-sum-exp of (hidden . weight^T + bias) / temperature,
//! in chunks of C rows (O(C V) workspace). `labels` [N] in [0, V); outputs [N] (float or double),
//! `entropy` and `lse` may be empty. `workspace`: linear_head_workspace_bytes<T>(N, V, cfg) bytes, or
//! empty to allocate them for this call. `exec` splits the GEMM over vocabulary blocks and the
//! statistics over rows (parallel.hpp); `gemm` runs the GEMM (builtin_gemm: ulorl's own, on `exec`).
//! Throws ulorl::error before writing anything.
template <class T, class I, class S, class Exec = sequential_executor, class Gemm = builtin_gemm>
void linear_head_forward(const linear_head_inputs<T>& in, std::span<const I> labels, vector_view<S> log_prob,
                         vector_view<S> entropy, vector_view<S> lse, const linear_head_config& cfg = {},
                         std::span<std::byte> workspace = {}, Exec&& exec = {}, Gemm&& gemm = {}) {
  static_assert(std::is_floating_point_v<S>, "statistics are float or double");
  constexpr const char* fn = "linear_head_forward";
  detail::head::validate_inputs(fn, in, labels, cfg.temperature);
  const std::size_t n = in.hidden.rows();
  detail::head::require_stat_output(fn, "log_prob", log_prob, n, false);
  detail::head::require_stat_output(fn, "entropy", entropy, n, true);
  detail::head::require_stat_output(fn, "lse", lse, n, true);
  if (cfg.check_values) detail::head::validate_values(fn, in, cfg.temperature);
  detail::head::no_grad none;
  detail::head::run(fn, in, labels, detail::head::stats_sink<S>{log_prob, entropy, lse}, none, linear_head_grads<T>{},
                    cfg, workspace, exec, gemm);
}

//! Forward and backward in one pass over the chunks, for a loss L(log_prob, entropy) whose per-row
//! gradients a functor gives chunk by chunk:
//!   grad_fn(std::size_t first_row, std::span<const double> log_prob, std::span<const double> entropy,
//!           std::span<double> grad_log_prob, std::span<double> grad_entropy)
//! for rows [first_row, first_row + log_prob.size()) (the grad spans arrive zeroed). Writes the
//! statistics (each output [N] or empty) and the gradients `grads` (each [N, H] / [V, H] / [V] or
//! empty) per cfg.grad_hidden / cfg.grad_weight (overwrite or accumulate). Validates everything,
//! including that hidden, weight, bias are finite, before writing; a non-finite gradient returned by
//! grad_fn throws ulorl::error naming its row after earlier chunks were written.
template <class T, class I, class GradFn, class S = double, class Exec = sequential_executor,
          class Gemm = builtin_gemm>
void linear_head_forward_backward(const linear_head_inputs<T>& in, std::span<const I> labels, GradFn&& grad_fn,
                                  const linear_head_grads<T>& grads, vector_view<S> log_prob = {},
                                  vector_view<S> entropy = {}, vector_view<S> lse = {},
                                  const linear_head_config& cfg = {}, std::span<std::byte> workspace = {},
                                  Exec&& exec = {}, Gemm&& gemm = {}) {
  static_assert(std::is_floating_point_v<S>, "statistics are float or double");
  constexpr const char* fn = "linear_head_forward_backward";
  detail::head::validate_inputs(fn, in, labels, cfg.temperature);
  const std::size_t n = in.hidden.rows();
  detail::head::require_stat_output(fn, "log_prob", log_prob, n, true);
  detail::head::require_stat_output(fn, "entropy", entropy, n, true);
  detail::head::require_stat_output(fn, "lse", lse, n, true);
  detail::head::validate_grads(fn, in, grads);
  if (cfg.check_values) detail::head::validate_values(fn, in, cfg.temperature);
  detail::head::run(fn, in, labels, detail::head::stats_sink<S>{log_prob, entropy, lse}, grad_fn, grads, cfg, workspace,
                    exec, gemm);
}

//! Gradients of L = sum_i grad_log_prob_i log_prob_i + grad_entropy_i entropy_i with respect to
//! hidden, weight and bias (the forward is recomputed chunk by chunk; nothing is saved between calls).
//! `grad_log_prob` [N]; `grad_entropy` [N] or empty (no entropy term). Throws before writing anything.
template <class T, class I, class D, class Exec = sequential_executor, class Gemm = builtin_gemm>
void linear_head_backward(const linear_head_inputs<T>& in, std::span<const I> labels,
                          vector_view<const D> grad_log_prob, vector_view<const D> grad_entropy,
                          const linear_head_grads<T>& grads, const linear_head_config& cfg = {},
                          std::span<std::byte> workspace = {}, Exec&& exec = {}, Gemm&& gemm = {}) {
  static_assert(std::is_floating_point_v<D>, "gradients are float or double");
  constexpr const char* fn = "linear_head_backward";
  detail::head::validate_inputs(fn, in, labels, cfg.temperature);
  const std::size_t n = in.hidden.rows();
  const auto check = [&](const char* arg, vector_view<const D> g) {
    require_same_size(fn, arg, g.size(), "hidden rows", n);
    detail::logits::require_pointer(fn, arg, g.data(), g.size());
    for (std::size_t r = 0; r < n; ++r)
      if (!std::isfinite(static_cast<double>(g[r])))
        detail::fail_at(fn, arg, static_cast<std::int64_t>(r), static_cast<double>(g[r]), "must be finite");
  };
  check("grad_log_prob", grad_log_prob);
  if (grad_entropy.size() != 0) check("grad_entropy", grad_entropy);
  detail::head::validate_grads(fn, in, grads);
  if (cfg.check_values) detail::head::validate_values(fn, in, cfg.temperature);
  auto copy = [&](std::size_t r0, std::span<const double>, std::span<const double>, std::span<double> glp,
                  std::span<double> gent) {
    for (std::size_t i = 0; i < glp.size(); ++i) {
      glp[i] = static_cast<double>(grad_log_prob[r0 + i]);
      if (grad_entropy.size() != 0) gent[i] = static_cast<double>(grad_entropy[r0 + i]);
    }
  };
  detail::head::run(fn, in, labels, detail::head::no_stats{}, copy, grads, cfg, workspace, exec, gemm);
}

//! The policy loss of ulorl/loss/policy_loss.hpp straight from the hidden states: row i of `hidden`
//! is the token of flat index i of the token layout (as policy_loss_from_logits). Statistics go into
//! `buf` (log_prob, entropy, lse), the loss (the loss area's own math, any objective, KL, entropy
//! term and normaliser) into the result and `buf`'s gradients, the backward into `grads`.
//!   - One pass over the chunks (three GEMMs per chunk) for a token-level objective without `hook`,
//!     without cfg.rollout, and with hcfg.check_values on (or cfg.check_values off): each token's
//!     gradient comes from policy_token_loss on its chunk's statistics, times its row's aggregation
//!     weight; policy_loss then runs on `buf` for the loss and the metrics. The gradients behind
//!     `grads` equal `buf.grad_log_prob` up to FMA contraction in the loss's row kernels.
//!   - Otherwise two passes (four GEMMs per chunk): statistics, the hook, policy_loss, then the
//!     backward recomputing each chunk's logits.
//! `in.log_prob` and `in.entropy` must be empty. Throws before writing `grads`. `hook` as
//! policy_loss_from_logits's: it sees the statistics in `buf` before the loss.
template <class T, class I, class P, class M, class Exec = sequential_executor, class Gemm = builtin_gemm,
          class Hook = no_statistics_hook>
[[nodiscard]] policy_loss_result policy_loss_from_hidden(const linear_head_inputs<T>& head, std::span<const I> labels,
                                                         const policy_loss_inputs<P, M>& in, const logits_loss_buffers<P>& buf,
                                                         const linear_head_grads<T>& grads, const policy_loss_config& cfg,
                                                         const linear_head_config& hcfg = {},
                                                         std::span<std::byte> workspace = {}, Exec&& exec = {},
                                                         Gemm&& gemm = {}, Hook&& hook = {}) {
  constexpr const char* fn = "policy_loss_from_hidden";
  const std::size_t n = detail::logits::validate_loss_buffers(fn, "hidden states", in, cfg, buf);
  if (!buf.sum_pi_squared.empty())
    detail::fail(fn, "buf.sum_pi_squared", "must be empty: the linear head does not compute sum_v p_v^2");
  detail::head::validate_inputs(fn, head, labels, hcfg.temperature);
  if (head.hidden.rows() != n)
    detail::fail(fn, "hidden",
                 "has " + std::to_string(head.hidden.rows()) + " rows but the token layout has " + std::to_string(n) +
                     " tokens (row i of hidden is token flat_index i)");
  const bool with_entropy = cfg.entropy_coef != 0.0, entropy_out = !buf.entropy.empty();
  detail::head::validate_grads(fn, head, grads);
  if (hcfg.check_values) detail::head::validate_values(fn, head, hcfg.temperature);

  detail::head::token_cursor<P> lp_at{&buf.log_prob}, ent_at{&buf.entropy};
  const vector_view<P> lse_out = buf.lse;
  auto sink = [&](std::size_t r0, std::size_t c, const double* lp, const double* ent, const double* lse) {
    for (std::size_t i = 0; i < c; ++i) {
      lp_at(r0 + i) = static_cast<P>(lp[i]);
      if (entropy_out) ent_at(r0 + i) = static_cast<P>(ent[i]);
      lse_out[r0 + i] = static_cast<P>(lse[i]);
    }
  };
  if constexpr (std::is_same_v<std::remove_cvref_t<Hook>, no_statistics_hook>) {
    if (detail::head::one_pass_applies(fn, cfg, hcfg)) {
      detail::head::validate_one_pass_loss(fn, in, cfg, buf);
      policy_loss_inputs<P, M> valid = in;  // an absent mask: every token of old_log_prob's layout valid
      valid.mask = mask_or_all_valid(in.mask, in.old_log_prob);
      detail::head::one_pass_gradients<P, M> grad_fn(valid, buf, cfg);
      detail::head::run(fn, head, labels, sink, grad_fn, grads, hcfg, workspace, exec, gemm);
      return detail::logits::loss_on_buffers(in, cfg, buf, exec);
    }
  }
  // 1. Statistics of every token.
  detail::head::no_grad none;
  detail::head::run(fn, head, labels, sink, none, linear_head_grads<T>{}, hcfg, workspace, exec, gemm);
  // 2. The caller's hook, then the policy loss on those log-probs (validates every token input,
  // writes the token gradients).
  hook(detail::logits::statistics_of(buf));
  const policy_loss_result res = detail::logits::loss_on_buffers(in, cfg, buf, exec);
  // 3. Gradients, recomputing each chunk's logits.
  detail::head::token_cursor<P> glp_at{&buf.grad_log_prob}, gent_at{&buf.grad_entropy};
  auto grad_fn = [&](std::size_t r0, std::span<const double>, std::span<const double>, std::span<double> glp,
                     std::span<double> gent) {
    for (std::size_t i = 0; i < glp.size(); ++i) {
      glp[i] = static_cast<double>(glp_at(r0 + i));
      if (with_entropy) gent[i] = static_cast<double>(gent_at(r0 + i));
    }
  };
  detail::head::run(fn, head, labels, detail::head::no_stats{}, grad_fn, grads, hcfg, workspace, exec, gemm);
  return res;
}

}  // namespace ULORL_ISA

ULORL_NAMESPACE_END
