// ulorl/kernels/linear_head.cuh — the chunked fused linear head on the GPU (component ulorl::cuda):
// hidden states [N, H] times the unembedding weight [V, H] straight into the policy loss and back to
// the gradients of the hidden states and of the weight, without ever holding the [N, V] logits. The
// device counterpart of policy_loss_from_hidden in ulorl/logits/linear_head.hpp (its two-pass form),
// built from cuBLAS GEMMs and the existing launchers:
//   pass 1, per chunk of C rows:  Z = hidden[chunk] . weight^T         (cublasGemmEx, fp32 Z)
//                                 log_prob, entropy, lse of Z / tau     (logits_forward)
//   the caller's hook on every token's statistics, then the policy loss (policy_loss.cuh's
//   launch_loss) -> d loss / d log_prob and d loss / d entropy of every token;
//   pass 2, per chunk, last first: Z again (not for the last chunk: pass 1 left its Z in the workspace)
//                                 dZ = logits_backward(Z), in place     (d loss / d Z, tau included)
//                                 grad_hidden[chunk]  = dZ . weight     (cublasGemmEx)
//                                 grad_weight        += dZ^T . hidden[chunk]  (cublasGemmEx, fp32)
// The token gradients come from the device loss, which runs once on every token's statistics (a
// hook and the sequence-level objectives need them all), so the backward recomputes the logits:
// four GEMMs per chunk but the last (three). Memory: the workspace holds one chunk of logits and
// five floats per token, O(C V + N); C comes from linear_head_launch_config.
//
// Precision. T (hidden, weight, grad_hidden) is float or __nv_bfloat16. Every GEMM accumulates in
// fp32 (CUBLAS_COMPUTE_32F; with float operands the handle's math mode decides whether TF32 tensor
// cores may be used, e.g. CUBLAS_TF32_TENSOR_OP_MATH). The logits chunk is fp32 for both types, so
// the statistics and dZ are those of the unrounded products; with bf16 operands dZ is rounded to
// bf16 (a separate [C, V] bf16 buffer) for the two gradient GEMMs, whose operands must share a type.
// grad_hidden is written in T (one rounding of the fp32 sum over the vocabulary). grad_weight is
// always fp32 and accumulated in place in the caller's [V, H] array (overwritten by the first chunk
// of pass 2, or added to with linear_head_launch_config::accumulate_grad_weight): an fp32 [V, H]
// accumulator in the workspace would break the O(C V) bound.
//
// GEMM mapping. cuBLAS is column-major; a row-major [r, c] array with leading dimension c is the
// column-major [c, r] matrix with the same leading dimension, i.e. its transpose. With Hc = the C
// rows of hidden, every product is computed as its transpose (m, n, k, op(A), op(B), C):
//   Z [C, V]           as Z^T = W Hc^T:      m = V, n = C, k = H, A = weight (op T, lda H),
//                                            B = Hc (op N, ldb H), C = Z (ldc V)
//   grad_hidden [C, H] as GH^T = W^T dZ^T:   m = H, n = C, k = V, A = weight (op N, lda H),
//                                            B = dZ (op N, ldb V), C = grad_hidden rows (ldc H)
//   grad_weight [V, H] as GW^T = Hc^T dZ:    m = H, n = V, k = C, A = Hc (op N, lda H),
//                                            B = dZ (op T, ldb V), C = grad_weight (ldc H)
//
// Determinism. For a fixed shape, chunk size, handle configuration and device the result is the
// same bits on every run: the logits and policy-loss kernels are deterministic, cuBLAS GEMMs are
// bitwise reproducible on one architecture with one SM count and one active stream (cuBLAS's rule;
// not with the handle's atomics mode CUBLAS_ATOMICS_ALLOWED), and grad_weight sums the chunks in a
// fixed order (the last chunk first).
//
// The launcher follows the other kernel headers: CUB-style workspace query (d_temp_storage ==
// nullptr: only temp_storage_bytes is set), a cudaStream_t, a cudaError_t return, no allocation, no
// synchronisation, and every host-visible argument validated before anything is launched
// (cudaErrorInvalidValue; cudaErrorNotSupported for in-pass rollout correction, as policy_loss).
// Every objective of the device loss works, the sequence-level ones (GSPO, GMPO) included. cuBLAS
// failures map to cudaError_t by cublas_error below. Values on the device behave as in
// policy_loss_from_logits: an out-of-range label gives its row NaN statistics and no gradient (and
// is reported through logits_config::bad_label_row with its row in [0, N)); a bad value stops the
// loss (NaN loss, `status` set) and leaves the token gradients NaN, so that grad_hidden and
// grad_weight are NaN, never a plausible gradient.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/kernels/logits.cuh"
#include "ulorl/kernels/policy_loss.cuh"

ULORL_NAMESPACE_BEGIN
namespace cuda {
inline namespace ULORL_CUDA_ARCH_NS {

//! Options of policy_loss_from_hidden.
struct linear_head_launch_config {
  //! Rows per chunk C (> 0; at most N is used); 0: automatic, the fewest chunks of equal size whose
  //! logits buffers fit workspace_budget (rounded up to 16 rows where that still fits; at least 1 row).
  int64_t chunk_rows = 0;
  std::size_t workspace_budget = std::size_t{1} << 30;  //!< bytes of logits buffers the automatic C aims at
  //! false: grad_weight = this call's gradient; true: grad_weight += it (micro-batch accumulation).
  bool accumulate_grad_weight = false;
  launch_config loss{};  //!< launch options of the policy loss
};

//! The outputs of policy_loss_from_hidden (device pointers).
template <class T>
struct linear_head_outputs {
  T* grad_hidden = nullptr;              //!< [N, H] row-major, overwritten; nullptr: not computed
  float* grad_weight = nullptr;          //!< [V, H] row-major, fp32 (see the header); nullptr: not computed
  policy_loss_result* result = nullptr;  //!< required: one device policy_loss_result
  int64_t* status = nullptr;             //!< optional: as policy_loss_outputs::status
};

//! The cudaError_t a cuBLAS status maps to:
//!   SUCCESS -> cudaSuccess;                 NOT_INITIALIZED -> cudaErrorInvalidResourceHandle (bad handle);
//!   ALLOC_FAILED -> cudaErrorMemoryAllocation;  INVALID_VALUE -> cudaErrorInvalidValue;
//!   ARCH_MISMATCH, NOT_SUPPORTED -> cudaErrorNotSupported;  EXECUTION_FAILED -> cudaErrorLaunchFailure;
//!   MAPPING_ERROR, INTERNAL_ERROR, LICENSE_ERROR and anything else -> cudaErrorUnknown.
inline cudaError_t cublas_error(cublasStatus_t s) noexcept {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return cudaSuccess;
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return cudaErrorInvalidResourceHandle;
    case CUBLAS_STATUS_ALLOC_FAILED:
      return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_INVALID_VALUE:
      return cudaErrorInvalidValue;
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return cudaErrorNotSupported;
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return cudaErrorNotSupported;
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return cudaErrorLaunchFailure;
    default:
      return cudaErrorUnknown;
  }
}

namespace detail {

template <class T>
inline constexpr bool is_head_value_v = std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16>;

template <class T>
constexpr cudaDataType_t cublas_type() noexcept {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

//! Bytes of the logits buffers per chunk row: the fp32 logits, plus the bf16 copy of dZ for bf16 operands.
template <class T>
std::size_t head_row_bytes(int64_t vocab) noexcept {
  const std::size_t v = static_cast<std::size_t>(vocab);
  return v * sizeof(float) + (std::is_same_v<T, float> ? 0 : v * sizeof(T));
}

//! The workspace of policy_loss_from_hidden: regions in this order, each 256-byte aligned.
struct head_plan {
  int64_t chunk = 0;        // C
  std::size_t logits = 0;   // fp32 [C, V]
  std::size_t dz = 0;       // bf16 [C, V] (bf16 operands only)
  std::size_t forward = 0;  // logits_forward's split states (the largest over the chunk sizes)
  std::size_t loss = 0;     // policy_loss's workspace
  std::size_t floats = 0;  // one [N] float array; five: log_prob, entropy, lse, d loss / d log_prob, d loss / d entropy
  std::size_t total() const { return logits + dz + forward + loss + 5 * floats; }
};

//! The most elements of any array (hidden, weight, a logits chunk): keeps every byte count below 2^62.
inline constexpr int64_t max_elements = int64_t{1} << 58;

template <class T>
cudaError_t plan_head(int64_t tokens, int64_t vocab, int64_t rows, const logits_config& lcfg,
                      const linear_head_launch_config& opt, head_plan& plan) {
  int64_t c = opt.chunk_rows;
  if (c == 0) {
    // The fewest chunks that fit the budget, of equal size (no short last chunk), rounded up to 16
    // rows (whole GEMM tiles) where the budget allows.
    const std::size_t rows_fit = opt.workspace_budget / head_row_bytes<T>(vocab);
    int64_t fit = rows_fit > static_cast<std::size_t>(max_elements / vocab) ? max_elements / vocab
                                                                            : static_cast<int64_t>(rows_fit);
    if (fit < 1) fit = 1;
    if (fit >= tokens) {
      c = tokens;
    } else {
      const int64_t chunks = (tokens + fit - 1) / fit;
      c = (tokens + chunks - 1) / chunks;
      if ((c + 15) / 16 * 16 <= fit) c = (c + 15) / 16 * 16;
    }
  }
  if (c > tokens) c = tokens;
  if (c > 0x7fffffff || c > max_elements / vocab) return cudaErrorInvalidValue;
  plan = {};
  plan.chunk = c;
  const std::size_t elems = static_cast<std::size_t>(c) * static_cast<std::size_t>(vocab);
  plan.logits = align_up(elems * sizeof(float));
  plan.dz = std::is_same_v<T, float> ? 0 : align_up(elems * sizeof(T));
  if (tokens > 0) {
    // The split count (so the split states) depends on the rows of a call: size for the full chunks
    // and for the last, shorter one.
    std::size_t full = 0, last = 0;
    if (cudaError_t e = logits_forward_workspace_bytes(c, vocab, full, lcfg); e != cudaSuccess) return e;
    const int64_t tail = tokens % c;
    if (tail != 0)
      if (cudaError_t e = logits_forward_workspace_bytes(tail, vocab, last, lcfg); e != cudaSuccess) return e;
    plan.forward = align_up(full > last ? full : last);
  }
  plan.loss = align_up(policy_loss_workspace_bytes(rows));
  plan.floats = align_up(static_cast<std::size_t>(tokens) * sizeof(float));
  return cudaSuccess;
}

//! Whether the byte ranges [a, a + na) and [b, b + nb) share a byte.
inline bool overlap(const void* a, std::size_t na, const void* b, std::size_t nb) noexcept {
  if (a == nullptr || b == nullptr || na == 0 || nb == 0) return false;
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return x < y + nb && y < x + na;
}

//! Every host-visible argument of policy_loss_from_hidden but the workspace and the handle (the
//! loss's through validate_loss, before pass 1 launches anything: the log-probs, entropies and token
//! gradients are the head's own workspace arrays).
template <class T, class T2, class M>
cudaError_t validate_head(const T* hidden, int64_t tokens, int64_t hidden_size, const T* weight, int64_t vocab,
                       const int64_t* labels, const token_layout& lay, const policy_loss_inputs<T2, M, float>& in,
                       const linear_head_outputs<T>& out, const policy_loss_config& cfg, const logits_config& lcfg,
                       const linear_head_launch_config& opt) {
  if (tokens < 0 || tokens > 0x7fffffff || hidden_size < 1 || hidden_size > 0x7fffffff || vocab < 1 ||
      vocab > 0x7fffffff || opt.chunk_rows < 0 || tokens > max_elements / hidden_size ||
      vocab > max_elements / hidden_size)
    return cudaErrorInvalidValue;
  // The layout: row i of hidden is the token of flat index i (a padded layout must be dense).
  if (fused_tokens(lay) != tokens) return cudaErrorInvalidValue;  // tokens >= 0 checked above
  // The temperature and the split count (validate_common with no rows reads no pointer).
  if (cudaError_t e = validate_common(static_cast<const float*>(nullptr), 0, vocab, vocab, nullptr, lcfg);
      e != cudaSuccess)
    return e;
  if (in.log_prob != nullptr || in.entropy != nullptr) return cudaErrorInvalidValue;  // computed here
  if (tokens > 0 && (hidden == nullptr || weight == nullptr || labels == nullptr)) return cudaErrorInvalidValue;
  if (!aligned_or_null<T>(hidden) || !aligned_or_null<T>(weight) || !aligned_or_null<int64_t>(labels) ||
      !aligned_or_null<T>(out.grad_hidden) || !aligned_or_null<float>(out.grad_weight))
    return cudaErrorInvalidValue;
  // The gradients are written while hidden and weight are still read: no overlap.
  const std::size_t h = static_cast<std::size_t>(hidden_size);
  const std::size_t hid_bytes = static_cast<std::size_t>(tokens) * h * sizeof(T);
  const std::size_t w_bytes = static_cast<std::size_t>(vocab) * h * sizeof(T);
  const std::size_t gw_bytes = static_cast<std::size_t>(vocab) * h * sizeof(float);
  if (overlap(out.grad_hidden, hid_bytes, hidden, hid_bytes) || overlap(out.grad_hidden, hid_bytes, weight, w_bytes) ||
      overlap(out.grad_weight, gw_bytes, hidden, hid_bytes) || overlap(out.grad_weight, gw_bytes, weight, w_bytes) ||
      overlap(out.grad_hidden, hid_bytes, out.grad_weight, gw_bytes))
    return cudaErrorInvalidValue;
  return validate_loss(lay, in, policy_loss_outputs{nullptr, nullptr, out.result, out.status}, cfg, opt.loss, true);
}

//! Reports every out-of-range label with its row in [0, N) (the chunk calls would see chunk rows).
__global__ void __launch_bounds__(block_threads)
    head_label_scan_kernel(const int64_t* __restrict__ labels, int64_t n, int64_t vocab, int* bad_label_row) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    if (labels[i] < 0 || labels[i] >= vocab) report_bad_label(bad_label_row, i);
}

//! dst[i] = bf16(src[i]) for i < n: 16-byte loads and stores (both buffers 16-byte aligned), then the tail.
__global__ void __launch_bounds__(block_threads) head_to_bf16_kernel(const float* src, __nv_bfloat16* dst, int64_t n) {
  constexpr int w = pack<__nv_bfloat16>::n;  // 8 values: two fp32 packs in, one bf16 pack out
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / w;
  for (int64_t i = first; i < packs; i += stride) {
    const pack<float> a = load16<float, false>(src + i * w), b = load16<float, false>(src + i * w + w / 2);
    float v[w];
#pragma unroll
    for (int q = 0; q < w / 2; ++q) v[q] = a.v[q], v[q + w / 2] = b.v[q];
    store16<__nv_bfloat16>(dst + i * w, v);
  }
  for (int64_t i = packs * w + first; i < n; i += stride) dst[i] = __float2bfloat16_rn(src[i]);
}

inline unsigned grid_for(int64_t work) {
  int64_t blocks = (work + block_threads - 1) / block_threads;
  if (blocks > 8192) blocks = 8192;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

//! C = A B + beta C in cuBLAS's column-major terms (alpha = 1, fp32 accumulation, host scalars).
inline cudaError_t gemm(cublasHandle_t handle, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                        int64_t k, const void* a, cudaDataType_t at, int64_t lda, const void* b, cudaDataType_t bt,
                        int64_t ldb, float beta, void* c, cudaDataType_t ct, int64_t ldc) {
  const float alpha = 1.0f;
  return cublas_error(cublasGemmEx(handle, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                                   &alpha, a, at, static_cast<int>(lda), b, bt, static_cast<int>(ldb), &beta, c, ct,
                                   static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

//! z [c, V] row-major fp32 = hid [c, H] . weight^T (see the header's GEMM mapping).
template <class T>
cudaError_t head_logits(cublasHandle_t handle, const T* hid, int64_t c, int64_t hs, const T* weight, int64_t vocab,
                        float* z) {
  return gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, vocab, c, hs, weight, cublas_type<T>(), hs, hid, cublas_type<T>(), hs,
              0.0f, z, CUDA_R_32F, vocab);
}

//! grad_hid [c, H] = dz [c, V] . weight.
template <class T>
cudaError_t head_grad_hidden(cublasHandle_t handle, const T* dz, int64_t c, int64_t hs, const T* weight, int64_t vocab,
                             T* grad_hid) {
  return gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, hs, c, vocab, weight, cublas_type<T>(), hs, dz, cublas_type<T>(), vocab,
              0.0f, grad_hid, cublas_type<T>(), hs);
}

//! grad_weight [V, H] = dz^T . hid (+ grad_weight when `add`).
template <class T>
cudaError_t head_grad_weight(cublasHandle_t handle, const T* dz, int64_t c, int64_t hs, const T* hid, int64_t vocab,
                             float* grad_weight, bool add) {
  return gemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, hs, vocab, c, hid, cublas_type<T>(), hs, dz, cublas_type<T>(), vocab,
              add ? 1.0f : 0.0f, grad_weight, CUDA_R_32F, hs);
}

//! Binds the handle to the stream (only when it is on another one: cublasSetStream also resets a
//! workspace set with cublasSetWorkspace) with host scalars for this call; restores the pointer mode.
class cublas_scope {
 public:
  cublas_scope() = default;
  cublas_scope(const cublas_scope&) = delete;
  cublas_scope& operator=(const cublas_scope&) = delete;
  ~cublas_scope() {
    if (handle_ != nullptr && mode_ != CUBLAS_POINTER_MODE_HOST) cublasSetPointerMode(handle_, mode_);
  }
  cudaError_t enter(cublasHandle_t handle, cudaStream_t stream) {
    cudaStream_t current = nullptr;
    if (cublasStatus_t s = cublasGetStream(handle, &current); s != CUBLAS_STATUS_SUCCESS) return cublas_error(s);
    if (current != stream)
      if (cublasStatus_t s = cublasSetStream(handle, stream); s != CUBLAS_STATUS_SUCCESS) return cublas_error(s);
    if (cublasStatus_t s = cublasGetPointerMode(handle, &mode_); s != CUBLAS_STATUS_SUCCESS) return cublas_error(s);
    handle_ = handle;
    if (mode_ != CUBLAS_POINTER_MODE_HOST)
      if (cublasStatus_t s = cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST); s != CUBLAS_STATUS_SUCCESS)
        return cublas_error(s);
    return cudaSuccess;
  }

 private:
  cublasHandle_t handle_ = nullptr;
  cublasPointerMode_t mode_ = CUBLAS_POINTER_MODE_HOST;
};

}  // namespace detail

//! Workspace of policy_loss_from_hidden (what a query call returns), and the chunk rows it plans.
//! Needs the device's SM count only when lcfg.splits == 0.
template <class T>
cudaError_t linear_head_workspace_bytes(int64_t tokens, int64_t vocab, int64_t layout_rows, std::size_t& bytes,
                                        int64_t& chunk_rows, const logits_config& lcfg = {},
                                        const linear_head_launch_config& opt = {}) {
  static_assert(detail::is_head_value_v<T>, "hidden and weight must be float or __nv_bfloat16");
  if (tokens < 0 || tokens > 0x7fffffff || vocab < 1 || vocab > 0x7fffffff || layout_rows < 0 || opt.chunk_rows < 0 ||
      lcfg.splits < 0)
    return cudaErrorInvalidValue;
  detail::head_plan plan{};
  if (cudaError_t e = detail::plan_head<T>(tokens, vocab, layout_rows, lcfg, opt, plan); e != cudaSuccess) return e;
  bytes = plan.total();
  chunk_rows = plan.chunk;
  return cudaSuccess;
}

//! Loss, metrics and the gradients of hidden [N, H] and weight [V, H] (both row-major, dense; T float
//! or __nv_bfloat16) for logits = hidden . weight^T / lcfg.temperature (see the header). Row i of
//! hidden is the token of flat index i of `lay` (a padded layout must be dense, row_stride == cols,
//! so N = rows * cols; packed: N = cols); `tokens` is N. `labels`: device [N], ids in [0, V).
//! `in.log_prob` and `in.entropy` must be nullptr: pass 1 computes them. `hook` as for
//! policy_loss_from_logits: it sees every token's statistics (workspace memory) before the loss.
//! cuBLAS runs on `handle`, bound to `stream` (the handle stays on it; its pointer mode is kept);
//! the handle is not needed for the workspace query, nor when N == 0.
template <class T, class T2, class M, class Hook = no_device_hook>
cudaError_t policy_loss_from_hidden(void* d_temp_storage, std::size_t& temp_storage_bytes, cublasHandle_t handle,
                                    const T* hidden, int64_t tokens, int64_t hidden_size, const T* weight,
                                    int64_t vocab, const int64_t* labels, const token_layout& lay,
                                    const policy_loss_inputs<T2, M, float>& in, const linear_head_outputs<T>& out,
                                    const policy_loss_config& cfg, const logits_config& lcfg = {},
                                    const linear_head_launch_config& opt = {}, cudaStream_t stream = nullptr,
                                    Hook&& hook = {}) {
  static_assert(detail::is_head_value_v<T>, "hidden and weight must be float or __nv_bfloat16");
  if (cudaError_t e =
          detail::validate_head(hidden, tokens, hidden_size, weight, vocab, labels, lay, in, out, cfg, lcfg, opt);
      e != cudaSuccess)
    return e;
  detail::head_plan plan{};
  if (cudaError_t e = detail::plan_head<T>(tokens, vocab, lay.rows, lcfg, opt, plan); e != cudaSuccess) return e;
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = plan.total();
    return cudaSuccess;
  }
  if (temp_storage_bytes < plan.total() || reinterpret_cast<std::uintptr_t>(d_temp_storage) % 256 != 0)
    return cudaErrorInvalidValue;
  if (tokens > 0 && handle == nullptr) return cudaErrorInvalidValue;

  char* base = static_cast<char*>(d_temp_storage);
  auto* z = reinterpret_cast<float*>(base);
  [[maybe_unused]] auto* dz16 = reinterpret_cast<T*>(base + plan.logits);  // bf16 operands only
  void* fw_ws = base + plan.logits + plan.dz;  // non-null even when the forward needs no bytes
  void* loss_ws = base + plan.logits + plan.dz + plan.forward;
  const detail::token_arrays arrays =
      detail::carve_token_arrays(base + plan.logits + plan.dz + plan.forward + plan.loss, plan.floats);
  float *lp = arrays.log_prob, *ent = arrays.entropy, *lse = arrays.lse, *glp = arrays.grad_log_prob,
        *gent = arrays.grad_entropy;
  const bool has_ent = cfg.entropy_coef != 0.0;
  const int64_t hs = hidden_size, C = plan.chunk;
  const int64_t chunks = C > 0 ? (tokens + C - 1) / C : 0;

  detail::cublas_scope scope;
  if (tokens > 0)
    if (cudaError_t e = scope.enter(handle, stream); e != cudaSuccess) return e;
  // Bad labels are reported once, with their row in [0, N); the chunk calls report none.
  logits_config chunk_cfg = lcfg;
  chunk_cfg.bad_label_row = nullptr;
  if (tokens > 0 && lcfg.bad_label_row != nullptr) {
    detail::head_label_scan_kernel<<<detail::grid_for(tokens), detail::block_threads, 0, stream>>>(
        labels, tokens, vocab, lcfg.bad_label_row);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  // 1. Statistics, chunk by chunk (the entropy always: free in the pass, and a hook may want it).
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t r0 = k * C, c = tokens - r0 < C ? tokens - r0 : C;
    if (cudaError_t e = detail::head_logits(handle, hidden + r0 * hs, c, hs, weight, vocab, z); e != cudaSuccess)
      return e;
    std::size_t fw_bytes = plan.forward;
    if (cudaError_t e = logits_forward(fw_ws, fw_bytes, static_cast<const float*>(z), c, vocab, vocab, labels + r0,
                                       lp + r0, ent + r0, lse + r0, chunk_cfg, stream);
        e != cudaSuccess)
      return e;
  }
  // 2-3. The caller's hook, then the loss on the statistics (a bad value leaves the token gradients
  // NaN, and so the gradients of hidden and weight).
  if (cudaError_t e = detail::hook_and_loss(loss_ws, plan.loss, lay, tokens, in, arrays, out.result, out.status, cfg,
                                            opt.loss, stream, hook);
      e != cudaSuccess)
    return e;
  // 4. The gradients, last chunk first: its logits are still in the workspace.
  if (tokens == 0) {
    if (out.grad_weight != nullptr && !opt.accumulate_grad_weight)
      return cudaMemsetAsync(out.grad_weight, 0,
                             static_cast<std::size_t>(vocab) * static_cast<std::size_t>(hs) * sizeof(float), stream);
    return cudaSuccess;
  }
  if (out.grad_hidden == nullptr && out.grad_weight == nullptr) return cudaSuccess;
  for (int64_t k = chunks - 1; k >= 0; --k) {
    const int64_t r0 = k * C, c = tokens - r0 < C ? tokens - r0 : C;
    const T* hid = hidden + r0 * hs;
    if (k != chunks - 1)
      if (cudaError_t e = detail::head_logits(handle, hid, c, hs, weight, vocab, z); e != cudaSuccess) return e;
    if (cudaError_t e = logits_backward(static_cast<const float*>(z), c, vocab, vocab, labels + r0, lse + r0,
                                        has_ent ? ent + r0 : nullptr, glp + r0, has_ent ? gent + r0 : nullptr, z, vocab,
                                        chunk_cfg, stream);
        e != cudaSuccess)
      return e;
    const T* dz = nullptr;
    if constexpr (std::is_same_v<T, float>) {
      dz = z;
    } else {
      const int64_t n = c * vocab;
      detail::head_to_bf16_kernel<<<detail::grid_for((n + 7) / 8), detail::block_threads, 0, stream>>>(z, dz16, n);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
      dz = dz16;
    }
    if (out.grad_hidden != nullptr)
      if (cudaError_t e = detail::head_grad_hidden(handle, dz, c, hs, weight, vocab, out.grad_hidden + r0 * hs);
          e != cudaSuccess)
        return e;
    if (out.grad_weight != nullptr) {
      const bool add = opt.accumulate_grad_weight || k != chunks - 1;
      if (cudaError_t e = detail::head_grad_weight(handle, dz, c, hs, hid, vocab, out.grad_weight, add);
          e != cudaSuccess)
        return e;
    }
  }
  return cudaSuccess;
}

}  // namespace ULORL_CUDA_ARCH_NS
}  // namespace cuda
ULORL_NAMESPACE_END
