// ulorl/kernels/policy_loss.cuh — the policy loss on device arrays (component ulorl::cuda), every
// objective of the CPU's policy_loss, and the fused loss from logits:
//   policy_loss:             log-probs, old log-probs, advantages (+ mask, reference log-probs,
//                            rollout-correction weights, entropies) -> loss, d loss / d log_prob,
//                            d loss / d entropy and every field of loss_metrics, in one pass;
//   policy_loss_from_logits: logits [N, V] -> statistics (logits_forward) -> the caller's hook ->
//                            policy_loss -> d loss / d logits (logits_backward, in place allowed).
// Every token evaluates detail::token_loss_lanes with the scalar lane type (the CPU's one formula,
// ulorl/loss/detail/token_loss.hpp) and folds into the CPU's row sums (detail::fold_token,
// detail::fold_out in ulorl/loss/detail/row_sums.hpp): no formula is restated here.
//
// Layouts: padded [B, T] (row b at b * row_stride) with an optional 0/1 mask, or packed (row b is
// tokens offsets[b] .. offsets[b + 1] of the arrays, offsets on the device). Inputs are float or
// __nv_bfloat16 (converted to float exactly); math in float as the CPU's float path, sums in double.
//
// Determinism: one block per row at a time, a fixed thread count and fixed reduction trees; each
// row's sums go to the workspace, and one block folds the rows in a fixed order. The result is the
// same bits on every run and for every grid size (launch_config::grid_blocks).
//
// Launchers are CUB style: with d_temp_storage == nullptr only temp_storage_bytes is set. They take
// a stream, never allocate or synchronise, and validate every host-visible argument and the
// configuration before launching anything (cudaErrorInvalidValue; cudaErrorNotSupported for what the
// device path does not implement: in-pass rollout correction (policy_loss_config::rollout); pass
// rollout-correction weights as `weights` instead). Sequence-level objectives (GSPO, GMPO) run one
// block per row through the descriptor's row and token steps (loss/objectives.hpp), as the CPU's rows do.
// Values on the device are checked on the device: with policy_loss_config::check_values (default
// true) a NaN/Inf input or a mask value other than 0/1 anywhere in the arrays' extent (padded: the
// gaps beyond each row excepted), and in the packed layout always a bad
// offsets row, stops the loss before anything is written to the gradients; the result's loss is
// NaN and `status` (if given) names the first bad flat token index + 1, or -(row + 1) for a bad
// offsets row (policy_loss_outputs::status).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/kernels/logits.cuh"
#include "ulorl/kernels/policy_loss_config.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/detail/row_sums.hpp"
#include "ulorl/loss/detail/token_loss.hpp"
#include "ulorl/loss/metrics.hpp"
#include "ulorl/loss/policy_loss_types.hpp"

ULORL_NAMESPACE_BEGIN
namespace cuda {
inline namespace ULORL_CUDA_ARCH_NS {

//! Where the token arrays of the loss live: every array of one call shares this layout.
struct token_layout {
  int64_t rows = 0;                  //!< B
  int64_t cols = 0;                  //!< padded: T; packed: the arrays' length (tokens)
  int64_t row_stride = 0;            //!< padded: elements from row b to row b + 1 (>= cols); packed: unused
  const int64_t* offsets = nullptr;  //!< packed: device [rows + 1], non-decreasing, within [0, cols]; nullptr: padded

  static token_layout padded(int64_t rows, int64_t cols) noexcept { return {rows, cols, cols, nullptr}; }
  static token_layout padded(int64_t rows, int64_t cols, int64_t row_stride) noexcept {
    return {rows, cols, row_stride, nullptr};
  }
  static token_layout packed(int64_t rows, int64_t tokens, const int64_t* offsets) noexcept {
    return {rows, tokens, 0, offsets};
  }
  [[nodiscard]] __host__ __device__ bool is_packed() const noexcept { return offsets != nullptr; }
  //! Elements an array of this layout spans (padded: to the end of the last row).
  [[nodiscard]] __host__ __device__ int64_t extent() const noexcept {
    if (is_packed()) return cols;
    return rows == 0 ? 0 : (rows - 1) * row_stride + cols;
  }
};

//! The loss's token inputs (device pointers in one token_layout). T: float or __nv_bfloat16 (TL, the
//! log-probs' type, may differ: the fused path computes them in float). M: the mask's element type.
template <class T, class M = float, class TL = T>
struct policy_loss_inputs {
  const TL* log_prob = nullptr;
  const T* old_log_prob = nullptr;
  const T* advantages = nullptr;
  const M* mask = nullptr;          //!< 0/1; nullptr: every token of the layout is valid
  const T* ref_log_prob = nullptr;  //!< required when kl_coef != 0
  const T* weights = nullptr;       //!< rollout-correction weights (detached); nullptr: 1
  const T* entropy = nullptr;       //!< required when entropy_coef != 0
};

//! The outputs (device pointers). The gradients are float, in the inputs' layout; masked tokens and
//! the gaps of a padded layout with row_stride > cols: masked tokens get 0, gaps are not written.
struct policy_loss_outputs {
  float* grad_log_prob = nullptr;        //!< required
  float* grad_entropy = nullptr;         //!< required when entropy_coef != 0 (nullptr otherwise: not written)
  policy_loss_result* result = nullptr;  //!< required: one device policy_loss_result (rollout stays zero)
  //! optional device int64: 0 when the call ran; else (first bad flat token index) + 1 for a bad
  //! value or mask, or -(first bad row + 1) for a bad packed offsets row.
  int64_t* status = nullptr;
};

//! Launch options (the defaults fill the device).
struct launch_config {
  int grid_blocks = 0;  //!< blocks of the row pass; 0: automatic. Any count gives the same bits.
};

namespace detail {

inline constexpr int loss_threads = 256;
inline constexpr int loss_warps = loss_threads / 32;

template <class T>
inline constexpr bool is_loss_value_v = std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16>;

template <class T>
__device__ __forceinline__ float ld(const T* p, int64_t i) {
  return to_float(p[i]);
}

//! One row's record in the workspace: the CPU's row_out (sums, aggregation weight, valid tokens,
//! the sequence-level objectives' row terms).
using row_record = ulorl::detail::row_out;

//! What the final fold accumulates (fold_row's result type).
struct loss_partial {
  double pg_loss, kl_loss, entropy_loss;
  loss_metrics metrics;
};

//! A struct of doubles through a warp shuffle, field by field.
template <class S>
__device__ __forceinline__ S shfl_down(const S& v, int off) {
  static_assert(sizeof(S) % sizeof(double) == 0, "shfl_down: a struct of doubles");
  constexpr int k = sizeof(S) / sizeof(double);
  double a[k];
  memcpy(a, &v, sizeof(S));
#pragma unroll
  for (int i = 0; i < k; ++i) a[i] = __shfl_down_sync(0xffffffffu, a[i], off);
  S r;
  memcpy(&r, a, sizeof(S));
  return r;
}

__device__ __forceinline__ void merge(ulorl::detail::row_sums& a, const ulorl::detail::row_sums& b) {
  ulorl::detail::merge_sums(a, b);
}
__device__ __forceinline__ void merge(loss_partial& a, const loss_partial& b) {
  a.pg_loss += b.pg_loss, a.kl_loss += b.kl_loss, a.entropy_loss += b.entropy_loss;
  a.metrics.merge(b.metrics);
}
__device__ __forceinline__ void merge(double& a, const double& b) { a += b; }

//! The block's values merged by a fixed tree (shuffle-down within warps, then warps 0..7 in order
//! by thread 0): the same bits on every run. The result is valid in thread 0. (Shared memory as raw
//! doubles: a __shared__ object of a type with member initialisers is not allowed.)
template <class S>
__device__ __forceinline__ S block_merge(S v) {
  constexpr int k = sizeof(S) / sizeof(double);
  __shared__ double shared[loss_warps * k];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const S o = shfl_down(v, off);
    merge(v, o);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) memcpy(shared + warp * k, &v, sizeof(S));
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < loss_warps; ++w) {
      S o;
      memcpy(&o, shared + w * k, sizeof(S));
      merge(v, o);
    }
  __syncthreads();
  return v;
}
//! block_merge with the result in every thread.
template <class S>
__device__ __forceinline__ S block_merge_all(S v) {
  __shared__ double result[sizeof(S) / sizeof(double)];
  v = block_merge(v);
  if (threadIdx.x == 0) memcpy(result, &v, sizeof(S));
  __syncthreads();
  memcpy(&v, result, sizeof(S));
  __syncthreads();
  return v;
}

//! Row b's first element and length.
__device__ __forceinline__ void row_extent(const token_layout& lay, int64_t b, int64_t& begin, int64_t& n) {
  if (lay.offsets != nullptr) {
    begin = lay.offsets[b];
    n = lay.offsets[b + 1] - begin;
  } else {
    begin = b * lay.row_stride;
    n = lay.cols;
  }
}

//! A finite float (no NaN, no Inf).
__device__ __forceinline__ bool finite(float x) { return fabsf(x) <= 3.402823466e38f; }

//! The value scan: a bad packed offsets row (always; with `cover`, also offsets[0] != 0 or
//! offsets[rows] != cols) and, with `values`, a non-finite input or a
//! mask value other than 0/1. Stores the smallest code in `status`: rows before tokens (offsets are
//! checked first), then by flat index.
template <class T, class M, class TL>
__global__ void __launch_bounds__(loss_threads)
    scan_kernel(token_layout lay, policy_loss_inputs<T, M, TL> in, bool has_kl, bool has_ent, bool values, bool cover,
                unsigned long long* status) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Codes: 1 + row for offsets, 2^62 + flat index for values, so that offsets errors come first.
  if (lay.offsets != nullptr && cover && first == 0 && lay.rows > 0) {  // the rows cover the arrays exactly
    if (lay.offsets[0] != 0) atomicMin(status, 1ull);
    if (lay.offsets[lay.rows] != lay.cols) atomicMin(status, static_cast<unsigned long long>(lay.rows));
  }
  if (lay.offsets != nullptr)
    for (int64_t b = first; b < lay.rows; b += stride) {
      const int64_t lo = lay.offsets[b], hi = lay.offsets[b + 1];
      if (lo < 0 || hi < lo || hi > lay.cols) atomicMin(status, static_cast<unsigned long long>(b + 1));
    }
  if (!values) return;
  const int64_t n = lay.extent();
  for (int64_t i = first; i < n; i += stride) {
    if (lay.offsets == nullptr && lay.row_stride > lay.cols && i % lay.row_stride >= lay.cols) continue;  // a gap
    bool ok = finite(ld(in.log_prob, i)) && finite(ld(in.old_log_prob, i)) && finite(ld(in.advantages, i));
    if (has_kl) ok = ok && finite(ld(in.ref_log_prob, i));
    if (in.weights != nullptr) ok = ok && finite(ld(in.weights, i));
    if (has_ent) ok = ok && finite(ld(in.entropy, i));
    if (in.mask != nullptr) ok = ok && (in.mask[i] == M(0) || in.mask[i] == M(1));
    if (!ok) atomicMin(status, (1ull << 62) + static_cast<unsigned long long>(i));
  }
}

//! The row pass: blocks take rows b = blockIdx.x, blockIdx.x + gridDim.x, ...; every token of a row
//! runs token_loss_lanes and fold_token; the row's sums (fixed tree) go to records[b].
template <class Obj, class Est, class T, class M, class TL, class P>
__global__ void __launch_bounds__(loss_threads)
    rows_kernel(token_layout lay, policy_loss_inputs<T, M, TL> in, policy_loss_outputs out,
                token_loss_params<float, P> p, agg_normalizer norm, const unsigned long long* status,
                row_record* records) {
  using L = ulorl::simd::scalar_lanes<float>;
  constexpr bool has_kl = !std::is_same_v<Est, ulorl::no_kl>;
  if (*status != ~0ull) return;  // the scan found a bad value: nothing is written
  const bool per_row_weight = norm.mode == agg_mode::seq_mean_token_mean;
  const bool has_ent = p.entropy_coef != 0.0f;
  for (int64_t b = blockIdx.x; b < lay.rows; b += gridDim.x) {
    int64_t begin = 0, n = 0;
    row_extent(lay, b, begin, n);
    // The row's valid tokens: a pass of their own when the row's weight depends on them
    // (seq_mean_token_mean), else counted with the tokens (no second read of the mask).
    double count = 0;
    if (per_row_weight) {
      for (int64_t t = threadIdx.x; t < n; t += loss_threads)
        count += in.mask == nullptr || in.mask[begin + t] != M(0) ? 1.0 : 0.0;
      count = block_merge_all(count);
    }
    const double wd = row_weight(norm, per_row_weight ? static_cast<std::size_t>(count) : 0);
    const float w = static_cast<float>(wd);
    const float gent = static_cast<float>(-wd * static_cast<double>(p.entropy_coef));
    ulorl::detail::row_sums s;
    for (int64_t t = threadIdx.x; t < n; t += loss_threads) {
      const int64_t i = begin + t;
      const bool valid = in.mask == nullptr || in.mask[i] != M(0);
      if (!per_row_weight) count += valid ? 1.0 : 0.0;
      const float lp = ld(in.log_prob, i), old = ld(in.old_log_prob, i);
      const float ref = has_kl ? ld(in.ref_log_prob, i) : 0.0f;
      const float wt = in.weights != nullptr ? ld(in.weights, i) : 1.0f;
      const float e = has_ent ? ld(in.entropy, i) : 0.0f;
      const auto r = ulorl::detail::token_loss_lanes<Obj, Est, true, L>(lp, old, ref, ld(in.advantages, i), wt, p);
      out.grad_log_prob[i] = valid ? w * r.dlogp : 0.0f;
      if (out.grad_entropy != nullptr) out.grad_entropy[i] = valid ? gent : 0.0f;
      ulorl::detail::fold_token(s, valid, r.pg, r.kl, r.ratio, r.flags, lp, old, e);
    }
    s = block_merge(s);
    if (!per_row_weight) count = block_merge(count);
    if (threadIdx.x == 0) {
      row_record rec;
      rec.s = s, rec.w = wd, rec.tokens = static_cast<std::size_t>(count);
      records[b] = rec;
    }
  }
}

//! Sums of a row's statistics (a struct of doubles for block_merge).
struct row_stats {
  double n, a, b, c;
};
__device__ __forceinline__ void merge(row_stats& x, const row_stats& y) {
  x.n += y.n, x.a += y.a, x.b += y.b, x.c += y.c;
}

//! The rows of a sequence-level objective descriptor, as loss/detail/sequence_rows.hpp computes them
//! on the CPU, with the descriptor's row and token steps: a pass for the row's sums (fixed tree),
//! the tokens, and, where the row spreads its gradient through the mean, a pass adding the row's
//! gradient to its valid tokens.
template <class Obj, class T, class M, class TL, class P>
__global__ void __launch_bounds__(loss_threads)
    sequence_rows_kernel(token_layout lay, policy_loss_inputs<T, M, TL> in, policy_loss_outputs out,
                         token_loss_params<float, P> p, agg_normalizer norm, const unsigned long long* status,
                         row_record* records) {
  if (*status != ~0ull) return;
  const auto& op = p.objective;
  const bool has_ref = p.kl_coef != 0.0f, has_w = in.weights != nullptr, has_ent = p.entropy_coef != 0.0f;
  for (int64_t b = blockIdx.x; b < lay.rows; b += gridDim.x) {
    int64_t begin = 0, n = 0;
    row_extent(lay, b, begin, n);
    // The row's statistics over its valid tokens: the count and the descriptor's sums.
    row_stats st{0.0, 0.0, 0.0, 0.0};
    for (int64_t t = threadIdx.x; t < n; t += loss_threads) {
      const int64_t i = begin + t;
      if (in.mask != nullptr && in.mask[i] == M(0)) continue;
      const float lp = ld(in.log_prob, i), old = ld(in.old_log_prob, i), adv = ld(in.advantages, i);
      const float w = has_w ? ld(in.weights, i) : 1.0f;
      const sequence_sums k = Obj::row_token(lp, old, adv, w, has_w, op);
      st.n += 1.0, st.a += k.a, st.b += k.b, st.c += k.c;
    }
    st = block_merge_all(st);
    const double wd = row_weight(norm, static_cast<std::size_t>(st.n));
    const float gent = static_cast<float>(-wd * static_cast<double>(p.entropy_coef));
    const sequence_row_terms<float> terms = Obj::row(sequence_sums{st.a, st.b, st.c}, st.n, has_w, norm, op);
    ulorl::detail::row_sums s;
    row_stats flags{0.0, 0.0, 0.0, 0.0};  // n: row gradient (through_mean), a: low, b: high
    for (int64_t t = threadIdx.x; t < n; t += loss_threads) {
      const int64_t i = begin + t;
      const bool valid = in.mask == nullptr || in.mask[i] != M(0);
      const float lp = ld(in.log_prob, i), old = ld(in.old_log_prob, i), adv = ld(in.advantages, i);
      const float wt = has_w ? ld(in.weights, i) : 1.0f;
      const float ref = has_ref ? ld(in.ref_log_prob, i) : 0.0f;
      const float e = has_ent ? ld(in.entropy, i) : 0.0f;
      const sequence_token<float> k = Obj::token(lp, old, adv, wt, ref, valid, wd, terms, p, has_ref);
      flags.n += k.to_row_pg;
      flags.n += k.to_row_kl;
      flags.a += valid && k.flags.low ? 1.0 : 0.0;
      flags.b += valid && k.flags.high ? 1.0 : 0.0;
      out.grad_log_prob[i] = valid ? static_cast<float>(k.grad) : 0.0f;
      if (out.grad_entropy != nullptr) out.grad_entropy[i] = valid ? gent : 0.0f;
      ulorl::detail::fold_token(s, valid, k.pg, k.kl, k.ratio, k.flags, lp, old, e);
    }
    s = block_merge(s);
    flags = block_merge_all(flags);
    if (terms.through_mean) {
      const double spread = st.n > 0 ? flags.n / st.n : 0.0;
      if (st.n > 0)  // each thread adds to the tokens it wrote
        for (int64_t t = threadIdx.x; t < n; t += loss_threads) {
          const int64_t i = begin + t;
          if (in.mask == nullptr || in.mask[i] != M(0))
            out.grad_log_prob[i] = static_cast<float>(static_cast<double>(out.grad_log_prob[i]) + spread);
        }
    }
    if (threadIdx.x == 0) {
      row_record rec;
      rec.s = s, rec.w = wd, rec.tokens = static_cast<std::size_t>(st.n);
      rec.sequence_clip = terms.sequence_clip, rec.seq_low = flags.a > 0, rec.seq_high = flags.b > 0;
      rec.has_direct = terms.has_direct, rec.pg_direct = terms.pg_direct;
      records[b] = rec;
    }
  }
}

//! The fold: thread j folds rows j, j + 256, ... in order (fold_row), then the fixed tree.
__global__ void __launch_bounds__(loss_threads)
    fold_kernel(int64_t rows, const row_record* records, double kl_coef, double ent_coef,
                const unsigned long long* status, policy_loss_result* result, int64_t* status_out) {
  loss_partial acc{};
  const bool bad = *status != ~0ull;
  if (!bad)
    for (int64_t b = threadIdx.x; b < rows; b += loss_threads)
      ulorl::detail::fold_out(acc, records[b], kl_coef, ent_coef);
  acc = block_merge(acc);
  if (threadIdx.x != 0) return;
  policy_loss_result r{};
  r.pg_loss = acc.pg_loss;
  r.kl_loss = acc.kl_loss;
  r.entropy_loss = acc.entropy_loss;
  r.loss = acc.pg_loss + acc.kl_loss + acc.entropy_loss;
  r.metrics = acc.metrics;
  if (bad) r.loss = r.pg_loss = r.kl_loss = r.entropy_loss = __longlong_as_double(0x7ff8000000000000ll);
  *result = r;
  if (status_out != nullptr) {
    const unsigned long long c = *status;
    *status_out = !bad ? 0 : c >= (1ull << 62) ? static_cast<int64_t>(c - (1ull << 62)) + 1 : -static_cast<int64_t>(c);
  }
}

__global__ void init_status_kernel(unsigned long long* status) { *status = ~0ull; }

template <class T>
bool aligned_or_null(const void* p) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % alignof(T) == 0;
}

//! The configuration as the device path runs it; ulorl::error for what policy_loss_validate_config rejects.
inline void validate_config(const policy_loss_config& cfg) { validate_policy_loss_config("cuda::policy_loss", cfg); }

inline std::size_t align_up(std::size_t x) { return (x + 255) / 256 * 256; }

}  // namespace detail

//! Throws ulorl::error (naming the argument) for a configuration the device loss rejects with
//! cudaErrorInvalidValue; the launchers call it and return that code instead of throwing.
inline void policy_loss_validate_config(const policy_loss_config& cfg) { detail::validate_config(cfg); }

//! Workspace of policy_loss for `rows` rows.
inline std::size_t policy_loss_workspace_bytes(int64_t rows) {
  return detail::align_up(sizeof(unsigned long long)) +
         static_cast<std::size_t>(rows > 0 ? rows : 0) * sizeof(detail::row_record);
}

namespace detail {
//! Every host-visible argument of the loss but the workspace: the layout (its extent within
//! int64), the configuration (the CPU's validators), the inputs and outputs (present where required,
//! aligned). `computed`: the fused paths' call, whose log-probs, entropies and token gradients are
//! their own (in.log_prob and in.entropy must be null; out's gradient pointers are not read).
template <class T, class M, class TL>
cudaError_t validate_loss(const token_layout& lay, const policy_loss_inputs<T, M, TL>& in, const policy_loss_outputs& out,
                       const policy_loss_config& cfg, const launch_config& opt, bool computed) {
  static_assert(is_loss_value_v<T> && is_loss_value_v<TL>, "inputs must be float or __nv_bfloat16");
  if (lay.rows < 0 || lay.rows > 0x7fffffff || lay.cols < 0 || opt.grid_blocks < 0) return cudaErrorInvalidValue;
  if (!lay.is_packed() && lay.rows > 1 &&
      (lay.row_stride < lay.cols || lay.row_stride > (INT64_MAX - lay.cols) / (lay.rows - 1)))
    return cudaErrorInvalidValue;
#if !defined(ULORL_NO_EXCEPTIONS)
  try {
    validate_config(cfg);
  } catch (const ulorl::error&) {
    return cudaErrorInvalidValue;
  }
#endif
  if (cfg.rollout.has_value() || cfg.rollout_batch_norm_factor.has_value()) return cudaErrorNotSupported;
  const bool has_kl = cfg.kl_coef != 0.0, has_ent = cfg.entropy_coef != 0.0;
  if (computed) {
    if (in.log_prob != nullptr || in.entropy != nullptr) return cudaErrorInvalidValue;
  } else if (in.log_prob == nullptr || out.grad_log_prob == nullptr ||
             (has_ent && (in.entropy == nullptr || out.grad_entropy == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (in.old_log_prob == nullptr || in.advantages == nullptr || out.result == nullptr ||
      (has_kl && in.ref_log_prob == nullptr))
    return cudaErrorInvalidValue;
  if (!aligned_or_null<TL>(in.log_prob) || !aligned_or_null<T>(in.old_log_prob) || !aligned_or_null<T>(in.advantages) ||
      !aligned_or_null<M>(in.mask) || !aligned_or_null<T>(in.ref_log_prob) || !aligned_or_null<T>(in.weights) ||
      !aligned_or_null<T>(in.entropy) || !aligned_or_null<float>(out.grad_log_prob) ||
      !aligned_or_null<float>(out.grad_entropy) || !aligned_or_null<double>(out.result) ||
      !aligned_or_null<int64_t>(out.status) || !aligned_or_null<int64_t>(lay.offsets))
    return cudaErrorInvalidValue;
  return cudaSuccess;
}

//! The loss's launch sequence (policy_loss; the fused paths with `cover`: a packed layout's rows must
//! cover its arrays exactly).
template <class T, class M, class TL>
cudaError_t launch_loss(void* d_temp_storage, std::size_t& temp_storage_bytes, const token_layout& lay,
                        const policy_loss_inputs<T, M, TL>& in, const policy_loss_outputs& out,
                        const policy_loss_config& cfg, const launch_config& opt, cudaStream_t stream, bool cover) {
  if (lay.rows < 0 || lay.rows > 0x7fffffff) return cudaErrorInvalidValue;
  const std::size_t need = policy_loss_workspace_bytes(lay.rows);
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = need;
    return cudaSuccess;
  }
  if (temp_storage_bytes < need || reinterpret_cast<std::uintptr_t>(d_temp_storage) % 16 != 0)
    return cudaErrorInvalidValue;
  if (cudaError_t e = validate_loss(lay, in, out, cfg, opt, false); e != cudaSuccess) return e;
  const bool has_kl = cfg.kl_coef != 0.0, has_ent = cfg.entropy_coef != 0.0;

  auto* status = static_cast<unsigned long long*>(d_temp_storage);
  auto* records =
      reinterpret_cast<row_record*>(static_cast<char*>(d_temp_storage) + align_up(sizeof(unsigned long long)));
  int blocks = opt.grid_blocks;
  if (blocks == 0) {
    int dev = 0, sms = 0;
    if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
    if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev); e != cudaSuccess) return e;
    blocks = 8 * sms;
  }
  if (lay.rows < blocks) blocks = static_cast<int>(lay.rows > 0 ? lay.rows : 1);

  detail::init_status_kernel<<<1, 1, 0, stream>>>(status);
  if (lay.is_packed() || cfg.check_values) {
    const int64_t work = lay.extent() > lay.rows ? lay.extent() : lay.rows;
    int64_t scan_blocks = (work + detail::loss_threads - 1) / detail::loss_threads;
    if (scan_blocks > 4096) scan_blocks = 4096;
    if (scan_blocks < 1) scan_blocks = 1;
    // The status starts at ~0; the scan lowers it to the first error's code.
    detail::scan_kernel<T, M, TL><<<static_cast<unsigned>(scan_blocks), detail::loss_threads, 0, stream>>>(
        lay, in, has_kl, has_ent, cfg.check_values, cover, status);
  }
  // Sequence-level objectives come with no_kl: their rows evaluate the estimator at run time, as on the CPU.
  const cudaError_t launched =
      ulorl::detail::visit_token_loss("cuda::policy_loss", cfg, [&](const auto& obj, const auto& est) -> cudaError_t {
        using Obj = ulorl::detail::remove_cvref_t<decltype(obj)>;
        using Est = ulorl::detail::remove_cvref_t<decltype(est)>;
        using P = decltype(obj.template params<float>());
        const token_loss_params<float, P> p{obj.template params<float>(), make_kl_params<float>(cfg.kl),
                                            static_cast<float>(cfg.kl_coef), static_cast<float>(cfg.entropy_coef)};
        policy_loss_outputs o = out;
        if (!has_ent) o.grad_entropy = nullptr;
        if (lay.rows == 0) return cudaSuccess;
        const auto grid = static_cast<unsigned>(blocks);
        if constexpr (Obj::level == objective_level::sequence) {
          sequence_rows_kernel<Obj, T, M, TL, P>
              <<<grid, loss_threads, 0, stream>>>(lay, in, o, p, cfg.normalizer, status, records);
        } else {
          rows_kernel<Obj, Est, T, M, TL, P>
              <<<grid, loss_threads, 0, stream>>>(lay, in, o, p, cfg.normalizer, status, records);
        }
        return cudaGetLastError();
      });
  if (launched != cudaSuccess) return launched;
  detail::fold_kernel<<<1, detail::loss_threads, 0, stream>>>(
      lay.rows, records, static_cast<double>(static_cast<float>(cfg.kl_coef)),
      static_cast<double>(static_cast<float>(cfg.entropy_coef)), status, out.result, out.status);
  return cudaGetLastError();
}
}  // namespace detail

//! The policy loss of one micro-batch (see the header comment). cfg.normalizer is the step's global
//! normaliser (ulorl::global_normalizer on the host), as for the CPU policy_loss.
template <class T, class M, class TL>
cudaError_t policy_loss(void* d_temp_storage, std::size_t& temp_storage_bytes, const token_layout& lay,
                        const policy_loss_inputs<T, M, TL>& in, const policy_loss_outputs& out,
                        const policy_loss_config& cfg, const launch_config& opt = {}, cudaStream_t stream = nullptr) {
  return detail::launch_loss(d_temp_storage, temp_storage_bytes, lay, in, out, cfg, opt, stream, false);
}

// ---- fused from logits -----------------------------------------------------------------------------

//! What a statistics hook sees (device pointers, flat token order of the layout; entropy nullptr
//! when not computed). It runs on the host between the forward statistics and the loss and may
//! launch work on `stream` that writes the memory behind the inputs' mask and weights (UloRL's
//! dynamic MPT mask, entropy-based token selection).
struct device_token_statistics {
  const float* log_prob;
  const float* entropy;
  const float* lse;
  int64_t tokens;
  token_layout layout;
};

//! The default statistics hook: does nothing.
struct no_device_hook {
  cudaError_t operator()(const device_token_statistics&, cudaStream_t) const noexcept { return cudaSuccess; }
};

//! The outputs of policy_loss_from_logits.
template <class G>
struct logits_loss_outputs {
  G* grad_logits = nullptr;  //!< [N, V], may be the logits (in place, same row stride)
  int64_t grad_row_stride = 0;
  policy_loss_result* result = nullptr;  //!< required (device)
  int64_t* status = nullptr;             //!< optional: as policy_loss_outputs::status
};

namespace detail {
struct logits_loss_plan {
  std::size_t forward, loss, floats;
  std::size_t total() const { return forward + loss + 5 * floats; }
};
inline cudaError_t plan_logits_loss(int64_t tokens, int64_t vocab, int64_t rows, const logits_config& lcfg,
                                    logits_loss_plan& plan) {
  std::size_t fw = 0;
  if (cudaError_t e = logits_forward_workspace_bytes(tokens, vocab, fw, lcfg); e != cudaSuccess) return e;
  plan = {align_up(fw), align_up(policy_loss_workspace_bytes(rows)),
          align_up(static_cast<std::size_t>(tokens) * sizeof(float))};
  return cudaSuccess;
}

//! The tokens of a fused path's layout (row i of its logits or hidden states is flat token i): a
//! padded layout must be dense (row_stride == cols) and its rows x cols within int64; -1 for a
//! layout that is not.
inline int64_t fused_tokens(const token_layout& lay) noexcept {
  if (lay.rows < 0 || lay.cols < 0) return -1;
  if (lay.is_packed()) return lay.cols;
  if ((lay.rows > 1 && lay.row_stride != lay.cols) || (lay.cols > 0 && lay.rows > INT64_MAX / lay.cols)) return -1;
  return lay.rows * lay.cols;
}

//! The fused paths' statistics arrays in the workspace: five floats per token.
struct token_arrays {
  float *log_prob, *entropy, *lse, *grad_log_prob, *grad_entropy;
  std::size_t bytes;  //!< of each array
};
inline token_arrays carve_token_arrays(char* base, std::size_t bytes_each) {
  auto* lp = reinterpret_cast<float*>(base);
  const std::size_t n = bytes_each / sizeof(float);
  return {lp, lp + n, lp + 2 * n, lp + 3 * n, lp + 4 * n, bytes_each};
}

//! The fused paths' step between the statistics and the backward: the caller's hook on every
//! token's statistics, then the policy loss on them (the rows must cover the arrays). A bad value
//! stops the loss before it writes the token gradients: they stay NaN (all bits set), so that the
//! backward's gradients are NaN, never plausible ones, beside the NaN loss and `status`.
template <class T, class M, class Hook>
cudaError_t hook_and_loss(void* loss_ws, std::size_t loss_bytes, const token_layout& lay, int64_t tokens,
                          const policy_loss_inputs<T, M, float>& in, const token_arrays& a, policy_loss_result* result,
                          int64_t* status, const policy_loss_config& cfg, const launch_config& opt, cudaStream_t stream,
                          Hook& hook) {
  const bool has_ent = cfg.entropy_coef != 0.0;
  if (cudaError_t e = hook(device_token_statistics{a.log_prob, a.entropy, a.lse, tokens, lay}, stream);
      e != cudaSuccess)
    return e;
  policy_loss_inputs<T, M, float> full = in;
  full.log_prob = a.log_prob;
  full.entropy = has_ent ? a.entropy : nullptr;
  const policy_loss_outputs lo{a.grad_log_prob, has_ent ? a.grad_entropy : nullptr, result, status};
  if (tokens > 0) {
    if (cudaError_t e = cudaMemsetAsync(a.grad_log_prob, 0xff, a.bytes, stream); e != cudaSuccess) return e;
    if (has_ent)
      if (cudaError_t e = cudaMemsetAsync(a.grad_entropy, 0xff, a.bytes, stream); e != cudaSuccess) return e;
  }
  return launch_loss(loss_ws, loss_bytes, lay, full, lo, cfg, opt, stream, true);
}
}  // namespace detail

//! Loss, metrics and d loss / d logits of one micro-batch from logits [N, V] (row i: the token of
//! flat index i of `lay`; a padded layout must be dense, row_stride == cols, so N = rows * cols;
//! packed: N = cols). `in.log_prob` and `in.entropy` must be nullptr: the forward pass computes them
//! (in the workspace, with the lse, the token gradients). Labels: device [N], ids in [0, V) for every
//! row. One launcher sequence on `stream`: logits_forward, hook, policy_loss, logits_backward.
template <class G, class T, class M, class Hook = no_device_hook>
cudaError_t policy_loss_from_logits(void* d_temp_storage, std::size_t& temp_storage_bytes, const G* logits,
                                    int64_t vocab, int64_t row_stride, const int64_t* labels, const token_layout& lay,
                                    const policy_loss_inputs<T, M, float>& in, const logits_loss_outputs<G>& out,
                                    const policy_loss_config& cfg, const logits_config& lcfg = {},
                                    const launch_config& opt = {}, cudaStream_t stream = nullptr, Hook&& hook = {}) {
  const int64_t tokens = detail::fused_tokens(lay);
  if (tokens < 0 || vocab < 0) return cudaErrorInvalidValue;
  if (out.grad_logits == nullptr) return cudaErrorInvalidValue;
  if (tokens > 0 && (logits == nullptr || labels == nullptr)) return cudaErrorInvalidValue;
  if (reinterpret_cast<const void*>(out.grad_logits) == reinterpret_cast<const void*>(logits) &&
      out.grad_row_stride != row_stride)
    return cudaErrorInvalidValue;
  if (tokens > 1 && (row_stride < vocab || out.grad_row_stride < vocab)) return cudaErrorInvalidValue;
  // The loss's own arguments, before anything is launched.
  if (cudaError_t e =
          detail::validate_loss(lay, in, policy_loss_outputs{nullptr, nullptr, out.result, out.status}, cfg, opt, true);
      e != cudaSuccess)
    return e;
  // The workspace (the forward's share needs the device's SM count when lcfg.splits == 0).
  detail::logits_loss_plan plan{};
  if (cudaError_t e = detail::plan_logits_loss(tokens, vocab, lay.rows, lcfg, plan); e != cudaSuccess) return e;
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = plan.total();
    return cudaSuccess;
  }
  if (temp_storage_bytes < plan.total() || reinterpret_cast<std::uintptr_t>(d_temp_storage) % 256 != 0)
    return cudaErrorInvalidValue;
  const bool has_ent = cfg.entropy_coef != 0.0;
  char* base = static_cast<char*>(d_temp_storage);
  void* loss_ws = base + plan.forward;
  const detail::token_arrays a = detail::carve_token_arrays(base + plan.forward + plan.loss, plan.floats);
  // 1. Statistics (the entropy always: free in the pass, and a hook may want it).
  std::size_t fw_bytes = plan.forward;
  if (tokens > 0)
    if (cudaError_t e = logits_forward(base, fw_bytes, logits, tokens, vocab, row_stride, labels, a.log_prob, a.entropy,
                                       a.lse, lcfg, stream);
        e != cudaSuccess)
      return e;
  // 2-3. The caller's hook, the loss on the statistics.
  if (cudaError_t e =
          detail::hook_and_loss(loss_ws, plan.loss, lay, tokens, in, a, out.result, out.status, cfg, opt, stream, hook);
      e != cudaSuccess)
    return e;
  // 4. d loss / d logits.
  if (tokens == 0) return cudaSuccess;
  return logits_backward(logits, tokens, vocab, row_stride, labels, a.lse, has_ent ? a.entropy : nullptr,
                         a.grad_log_prob, has_ent ? a.grad_entropy : nullptr, out.grad_logits, out.grad_row_stride,
                         lcfg, stream);
}

}  // namespace ULORL_CUDA_ARCH_NS
}  // namespace cuda
ULORL_NAMESPACE_END
