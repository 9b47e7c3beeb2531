// ulorl/kernels/logits.cuh — CUDA versions of ulorl/logits/{forward,backward}.hpp for bf16, fp16 and
// fp32 logits with fp32 statistics (component ulorl::cuda):
//   forward:  per row, one pass over the logits -> log_prob[y], entropy, lse (online softmax with the
//             running sum of e^d d, merged across threads, warps and vocabulary splits by the same
//             ULORL_HD math as the CPU: ulorl/logits/online_softmax.hpp);
//   backward: d loss/d logits = p (a + b log p) + [j == y] g_lp / tau from the saved lse and entropy:
//             one read of the logits, one write of the gradient (may alias the logits: in place).
// 16-byte vectorised loads and stores when the rows are 16-byte aligned (scalar otherwise). Rows too
// long for one block are split across `splits` blocks whose partial states are merged by a second
// tiny kernel (flash-decoding's split-K idea); the partial states live in caller-provided workspace,
// queried CUB style: call with d_temp_storage == nullptr to get temp_storage_bytes. Launchers take a
// cudaStream_t, return cudaError_t, never allocate, never synchronise, and validate every host-visible
// argument before launching (cudaErrorInvalidValue). Labels live on the device: an out-of-range label
// gives that row NaN outputs (and a zero gradient row) and, when `bad_label_row` is set, the first
// such row + 1 is stored there (atomicCAS from 0), since a launcher cannot read device memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/logits/online_softmax.hpp"

// Inline namespace tagged with the architectures this translation unit is compiled for (CUB's
// CUB_DETAIL_MAGIC_NS_NAME): objects built for different arch lists never share kernel symbols.
#define ULORL_CUDA_CAT_(a, b) a##b
#define ULORL_CUDA_CAT(a, b) ULORL_CUDA_CAT_(a, b)
#define ULORL_CUDA_NS_1(a) ULORL_CUDA_CAT(sm_, a)
#define ULORL_CUDA_NS_2(a, b) ULORL_CUDA_CAT(ULORL_CUDA_NS_1(a), ULORL_CUDA_CAT(_, b))
#define ULORL_CUDA_NS_3(a, b, c) ULORL_CUDA_CAT(ULORL_CUDA_NS_2(a, b), ULORL_CUDA_CAT(_, c))
#define ULORL_CUDA_NS_4(a, b, c, d) ULORL_CUDA_CAT(ULORL_CUDA_NS_3(a, b, c), ULORL_CUDA_CAT(_, d))
#define ULORL_CUDA_NS_5(a, b, c, d, e) ULORL_CUDA_CAT(ULORL_CUDA_NS_4(a, b, c, d), ULORL_CUDA_CAT(_, e))
#define ULORL_CUDA_NS_6(a, b, c, d, e, f) ULORL_CUDA_CAT(ULORL_CUDA_NS_5(a, b, c, d, e), ULORL_CUDA_CAT(_, f))
#define ULORL_CUDA_NS_PICK(_1, _2, _3, _4, _5, _6, name, ...) name
#define ULORL_CUDA_NS_NAME(...)                                                                        \
  ULORL_CUDA_NS_PICK(__VA_ARGS__, ULORL_CUDA_NS_6, ULORL_CUDA_NS_5, ULORL_CUDA_NS_4, ULORL_CUDA_NS_3, \
                     ULORL_CUDA_NS_2, ULORL_CUDA_NS_1, unused)(__VA_ARGS__)
#ifdef __CUDA_ARCH_LIST__
#define ULORL_CUDA_ARCH_NS ULORL_CUDA_NS_NAME(__CUDA_ARCH_LIST__)
#else
#define ULORL_CUDA_ARCH_NS sm_default
#endif

ULORL_NAMESPACE_BEGIN
namespace cuda {
inline namespace ULORL_CUDA_ARCH_NS {

//! Options of the CUDA logits kernels.
struct logits_config {
  float temperature = 1.0f;     //!< z = logits / temperature; finite and > 0
  int splits = 0;               //!< forward: blocks per row; 0 = automatic (fills the GPU for few long rows)
  int* bad_label_row = nullptr;  //!< optional device int, 0 on entry: set to (first bad row) + 1
};

namespace detail {

inline constexpr int block_threads = 256;
inline constexpr float log2e = 1.4426950408889634f;
inline constexpr float ln2 = 0.6931471805599453f;

template <class T>
inline constexpr bool is_logit_v =
    std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

//! Storage <-> float conversions (host and device: the tests convert with the same functions).
template <class T>
__host__ __device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else
    return __bfloat162float(v);
}
template <class T>
__host__ __device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>)
    return v;
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(v);
  else
    return __float2bfloat16_rn(v);
}

//! 16 bytes of logits.
template <class T>
struct pack {
  static constexpr int n = 16 / sizeof(T);
  float v[n];
};
//! Streaming 16-byte load. `ReadOnly`: through the non-coherent read-only path (forward); the
//! backward may run in place, so it uses coherent evict-first loads.
template <class T, bool ReadOnly>
__device__ __forceinline__ pack<T> load16(const T* p) {
  const uint4 raw = ReadOnly ? __ldg(reinterpret_cast<const uint4*>(p)) : __ldcs(reinterpret_cast<const uint4*>(p));
  T t[pack<T>::n];
  memcpy(t, &raw, 16);
  pack<T> r;
#pragma unroll
  for (int i = 0; i < pack<T>::n; ++i) r.v[i] = to_float(t[i]);
  return r;
}
template <class T>
__device__ __forceinline__ void store16(T* p, const float (&v)[pack<T>::n]) {
  T t[pack<T>::n];
#pragma unroll
  for (int i = 0; i < pack<T>::n; ++i) t[i] = from_float<T>(v[i]);
  uint4 raw;
  memcpy(&raw, t, 16);
  __stcs(reinterpret_cast<uint4*>(p), raw);
}

//! Per-thread online state in base-2 units: d2 = (x - m) * k, k = log2(e) / tau;
//! s = sum 2^d2, t2 = sum 2^d2 d2. Converted to the shared natural-unit state for merging.
struct thread_state {
  float m = -INFINITY, s = 0.f, t2 = 0.f;

  __device__ __forceinline__ void raise_max(float vm, float k) {
    if (vm > m) {
      if (s != 0.f) {
        const float delta = (m - vm) * k;
        const float scale = exp2f(delta);
        t2 = scale * (t2 + delta * s);
        s *= scale;
      }
      m = vm;
    }
  }
  __device__ __forceinline__ void add(float x, float k) {
    const float d2 = (x - m) * k;
    const float e = exp2f(d2);
    s += e;
    t2 += e > 0.f ? e * d2 : 0.f;  // -inf logits (masked): e = 0 and d2 = -inf must not give NaN
  }
  __device__ __forceinline__ softmax_partial<float> natural() const {
    if (m == -INFINITY) return {};
    return {m, s, t2 * ln2};
  }
};

__device__ __forceinline__ softmax_partial<float> shfl_xor(const softmax_partial<float>& p, int lane_mask) {
  return {__shfl_xor_sync(0xffffffffu, p.max, lane_mask), __shfl_xor_sync(0xffffffffu, p.sum, lane_mask),
          __shfl_xor_sync(0xffffffffu, p.tsum, lane_mask)};
}

//! Block-wide merge of the threads' states; the result is valid in thread 0.
__device__ __forceinline__ softmax_partial<float> block_merge(softmax_partial<float> p, float inv_tau) {
  __shared__ softmax_partial<float> warp_states[block_threads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) p = merge(p, shfl_xor(p, o), inv_tau);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_states[warp] = p;
  __syncthreads();
  if (warp == 0) {
    p = lane < block_threads / 32 ? warp_states[lane] : softmax_partial<float>{};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) p = merge(p, shfl_xor(p, o), inv_tau);
  }
  return p;
}

__device__ __forceinline__ void report_bad_label(int* flag, int64_t row) {
  if (flag != nullptr) atomicCAS(flag, 0, static_cast<int>(row < 0x7ffffffe ? row + 1 : 0x7fffffff));
}

template <class T>
__device__ void finish_row(const T* row, int64_t cols, int64_t r, const int64_t* labels,
                           const softmax_partial<float>& st, float inv_tau, float* log_prob, float* entropy, float* lse,
                           int* bad_label_row) {
  const int64_t y = labels[r];
  token_stats<float> out;
  if (y < 0 || y >= cols) {
    report_bad_label(bad_label_row, r);
    out = {NAN, NAN, NAN};
  } else {
    out = finalize(st, to_float(row[y]), inv_tau);
  }
  log_prob[r] = out.log_prob;
  if (entropy != nullptr) entropy[r] = out.entropy;
  if (lse != nullptr) lse[r] = out.lse;
}

//! Partial state of columns [begin, end) of one row, computed by one block. `Vec`: the row is
//! 16-byte aligned and `begin` is a multiple of the pack size.
template <class T, bool Vec>
__device__ softmax_partial<float> block_partial(const T* row, int64_t begin, int64_t end, float inv_tau) {
  const float k = inv_tau * log2e;
  thread_state ts;
  int64_t j = begin;
  if constexpr (Vec) {
    constexpr int n = pack<T>::n;
    const int64_t vec_end = begin + (end - begin) / n * n;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * n; i < vec_end; i += int64_t{block_threads} * n) {
      const pack<T> x = load16<T, true>(row + i);
      float vm = x.v[0];
#pragma unroll
      for (int q = 1; q < n; ++q) vm = fmaxf(vm, x.v[q]);  // fmaxf ignores NaN: the sums carry it
      ts.raise_max(vm, k);
      if (ts.m != -INFINITY) {
#pragma unroll
        for (int q = 0; q < n; ++q) ts.add(x.v[q], k);
        // A NaN in a pack whose other entries are all -inf would be skipped above: carry it.
      } else {
#pragma unroll
        for (int q = 0; q < n; ++q)
          if (x.v[q] != x.v[q]) ts.s = NAN;
      }
    }
    j = vec_end;
  }
  for (int64_t i = j + threadIdx.x; i < end; i += block_threads) {
    const float x = to_float(row[i]);
    if (x != x) {
      ts.s = NAN;
      continue;
    }
    ts.raise_max(x, k);
    if (ts.m != -INFINITY) ts.add(x, k);
  }
  softmax_partial<float> p = ts.natural();
  if (ts.s != ts.s) p = {0.f, NAN, NAN};  // keep NaN through merges
  return block_merge(p, inv_tau);
}

template <class T, bool Vec>
__global__ void __launch_bounds__(block_threads)
    forward_kernel(const T* __restrict__ logits, int64_t cols, int64_t row_stride, const int64_t* __restrict__ labels,
                   float inv_tau, int splits, int64_t split_len, softmax_partial<float>* __restrict__ partials,
                   float* __restrict__ log_prob, float* __restrict__ entropy, float* __restrict__ lse,
                   int* bad_label_row) {
  const int64_t r = blockIdx.x;
  const int split = static_cast<int>(blockIdx.y);
  const T* row = logits + r * row_stride;
  const int64_t begin = split * split_len;
  const int64_t end = begin + split_len < cols ? begin + split_len : cols;
  const softmax_partial<float> p = block_partial<T, Vec>(row, begin < cols ? begin : cols, end, inv_tau);
  if (threadIdx.x != 0) return;
  if (splits == 1)
    finish_row(row, cols, r, labels, p, inv_tau, log_prob, entropy, lse, bad_label_row);
  else
    partials[r * splits + split] = p;
}

//! One warp per row merges the split states.
template <class T>
__global__ void __launch_bounds__(block_threads)
    combine_kernel(const T* __restrict__ logits, int64_t rows, int64_t cols, int64_t row_stride,
                   const int64_t* __restrict__ labels, float inv_tau, int splits,
                   const softmax_partial<float>* __restrict__ partials, float* __restrict__ log_prob,
                   float* __restrict__ entropy, float* __restrict__ lse, int* bad_label_row) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (block_threads / 32) + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  softmax_partial<float> p;
  for (int s = lane; s < splits; s += 32) p = merge(p, partials[r * splits + s], inv_tau);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) p = merge(p, shfl_xor(p, o), inv_tau);
  if (lane == 0) finish_row(logits + r * row_stride, cols, r, labels, p, inv_tau, log_prob, entropy, lse, bad_label_row);
}

//! Gradient of one element: p (a + b lp), lp = (x - c) / tau - rr with the CPU's anchor rule
//! (anchor_of_lse / anchor_of_row, ulorl/logits/online_softmax.hpp): c near lse * tau keeps x - c
//! exact for the large logits; 0 for p below float range and masked entries.
struct grad_row {
  float c, inv_tau, rr, a, b;
  __device__ __forceinline__ float operator()(float x) const {
    const float lp = (x - c) * inv_tau - rr;
    if (lp < -87.0f) return 0.f;
    return __expf(lp) * (a + b * lp);
  }
};

template <class T, bool Vec>
__global__ void __launch_bounds__(block_threads)
    backward_kernel(const T* logits, int64_t cols, int64_t row_stride, const int64_t* __restrict__ labels,
                    const float* __restrict__ lse, const float* __restrict__ entropy,
                    const float* __restrict__ grad_log_prob, const float* __restrict__ grad_entropy, T* grad,
                    int64_t grad_row_stride, float tau, int64_t cols_per_block, int* bad_label_row) {
  const int64_t r = blockIdx.x;
  const T* row = logits + r * row_stride;
  T* out = grad + r * grad_row_stride;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * cols_per_block;
  const int64_t end = begin + cols_per_block < cols ? begin + cols_per_block : cols;
  const float inv_tau = 1.0f / tau;
  const int64_t y = labels[r];
  const bool bad = y < 0 || y >= cols;
  const float g_lp = grad_log_prob[r];
  const float g_ent = grad_entropy != nullptr ? grad_entropy[r] : 0.f;
  const float h = grad_entropy != nullptr ? entropy[r] : 0.f;
  const float l = lse[r];
  const grad_coeffs<float> k = backward_coeffs(g_lp, g_ent, h, inv_tau);
  bool lse_ok = false;
  log_softmax_anchor<float> an = anchor_of_lse<float, float>(l, tau, inv_tau, lse_ok);
  if (!lse_ok) {
    // The float lse cannot place log p (a tiny temperature, huge logits): the row's own maximum and
    // sum, computed by this block over the whole row (the branch is uniform: it depends on lse[r]
    // and tau only). In place, the launcher gives each row one block, so no other block has
    // written over the row yet.
    __shared__ log_softmax_anchor<float> row_anchor;
    const softmax_partial<float> st = block_partial<T, Vec>(row, 0, cols, inv_tau);
    if (threadIdx.x == 0) row_anchor = anchor_of_row(st);
    __syncthreads();
    an = row_anchor;
  }
  const grad_row f{an.c, inv_tau, an.r, k.a, k.b};
  // The label's element without cancellation. Only the block that owns column y reads it, before
  // any of its threads writes (in place, other blocks may already have overwritten their columns).
  const bool own_label = !bad && y >= begin && y < end;
  const float g_label =
      own_label ? label_gradient((to_float(row[y]) - an.c) * inv_tau - an.r, g_lp, g_ent, h, inv_tau) : 0.f;
  if (bad && blockIdx.y == 0 && threadIdx.x == 0) report_bad_label(bad_label_row, r);
  __syncthreads();
  int64_t j = begin;
  if constexpr (Vec) {
    constexpr int n = pack<T>::n;
    const int64_t vec_end = begin + (end - begin) / n * n;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * n; i < vec_end; i += int64_t{block_threads} * n) {
      const pack<T> x = load16<T, false>(row + i);
      float g[n];
#pragma unroll
      for (int q = 0; q < n; ++q) g[q] = bad ? 0.f : (i + q == y ? g_label : f(x.v[q]));
      store16<T>(out + i, g);
    }
    j = vec_end;
  }
  for (int64_t i = j + threadIdx.x; i < end; i += block_threads)
    out[i] = from_float<T>(bad ? 0.f : (i == y ? g_label : f(to_float(row[i]))));
}

template <class T>
bool aligned(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % alignof(T) == 0;
}
template <class T>
bool vec_ok(const void* p, int64_t row_stride) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && (row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}

//! The split count the forward launcher uses for this shape (needs the current device's SM count
//! only when cfg.splits == 0).
inline cudaError_t choose_splits(int64_t rows, int64_t cols, const logits_config& cfg, int& splits) {
  if (cfg.splits > 0) {
    splits = cfg.splits;
  } else {
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    // Aim for >= 2 blocks per SM, but keep >= 8192 columns per split so the merge stays negligible.
    const int64_t want = rows >= 2 * sms ? 1 : (2 * sms + rows - 1) / (rows > 0 ? rows : 1);
    const int64_t cap = (cols + 8191) / 8192;
    splits = static_cast<int>(want < cap ? want : cap);
  }
  if (splits < 1) splits = 1;
  if (static_cast<int64_t>(splits) > cols && cols > 0) splits = static_cast<int>(cols);
  if (splits > 65535) splits = 65535;
  return cudaSuccess;
}

template <class T>
cudaError_t validate_common(const T* logits, int64_t rows, int64_t cols, int64_t row_stride, const int64_t* labels,
                         const logits_config& cfg) {
  if (rows < 0 || rows > 0x7fffffff || cols < 0) return cudaErrorInvalidValue;
  if (rows > 0 && cols == 0) return cudaErrorInvalidValue;  // V = 0: no vocabulary
  if (rows > 1 && row_stride < cols) return cudaErrorInvalidValue;
  // 1 / temperature must be finite in float (a subnormal temperature makes every scaled logit +-inf).
  if (!(cfg.temperature > 0.f) || !std::isfinite(cfg.temperature) || !std::isfinite(1.0f / cfg.temperature) ||
      cfg.splits < 0)
    return cudaErrorInvalidValue;
  if (rows > 0 && (logits == nullptr || labels == nullptr || !aligned<T>(logits) || !aligned<int64_t>(labels)))
    return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace detail

//! Workspace of logits_forward for this shape (0 when one block per row suffices).
inline cudaError_t logits_forward_workspace_bytes(int64_t rows, int64_t cols, std::size_t& bytes,
                                                  const logits_config& cfg) {
  int splits = 1;
  const cudaError_t e = detail::choose_splits(rows, cols, cfg, splits);
  if (e != cudaSuccess) return e;
  bytes = splits > 1 ? static_cast<std::size_t>(rows) * static_cast<std::size_t>(splits) * sizeof(softmax_partial<float>)
                     : 0;
  return cudaSuccess;
}

//! Forward statistics of `rows` rows of `cols` logits (row r at logits + r * row_stride elements):
//! log_prob[r] (required), entropy[r], lse[r] (each may be nullptr). CUB-style two-phase call: with
//! d_temp_storage == nullptr only temp_storage_bytes is set. T: float, __half or __nv_bfloat16.
template <class T>
cudaError_t logits_forward(void* d_temp_storage, std::size_t& temp_storage_bytes, const T* logits, int64_t rows,
                           int64_t cols, int64_t row_stride, const int64_t* labels, float* log_prob, float* entropy,
                           float* lse, const logits_config& cfg = {}, cudaStream_t stream = nullptr) {
  static_assert(detail::is_logit_v<T>, "logits must be float, __half or __nv_bfloat16");
  if (cudaError_t e = detail::validate_common(logits, rows, cols, row_stride, labels, cfg); e != cudaSuccess) return e;
  std::size_t need = 0;
  if (cudaError_t e = logits_forward_workspace_bytes(rows, cols, need, cfg); e != cudaSuccess) return e;
  if (d_temp_storage == nullptr) {
    temp_storage_bytes = need;
    return cudaSuccess;
  }
  if (temp_storage_bytes < need || reinterpret_cast<std::uintptr_t>(d_temp_storage) % 16 != 0)
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (log_prob == nullptr) return cudaErrorInvalidValue;
  int splits = 1;
  detail::choose_splits(rows, cols, cfg, splits);
  constexpr int n = detail::pack<T>::n;
  // Split boundaries on pack multiples so every split starts 16-byte aligned.
  const int64_t split_len = ((cols + splits - 1) / splits + n - 1) / n * n;
  auto* partials = static_cast<softmax_partial<float>*>(d_temp_storage);
  const float inv_tau = 1.0f / cfg.temperature;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(splits));
  if (detail::vec_ok<T>(logits, row_stride))
    detail::forward_kernel<T, true><<<grid, detail::block_threads, 0, stream>>>(
        logits, cols, row_stride, labels, inv_tau, splits, split_len, partials, log_prob, entropy, lse, cfg.bad_label_row);
  else
    detail::forward_kernel<T, false><<<grid, detail::block_threads, 0, stream>>>(
        logits, cols, row_stride, labels, inv_tau, splits, split_len, partials, log_prob, entropy, lse, cfg.bad_label_row);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (splits > 1) {
    const auto blocks = static_cast<unsigned>((rows + detail::block_threads / 32 - 1) / (detail::block_threads / 32));
    detail::combine_kernel<T><<<blocks, detail::block_threads, 0, stream>>>(
        logits, rows, cols, row_stride, labels, inv_tau, splits, partials, log_prob, entropy, lse, cfg.bad_label_row);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

//! d loss/d logits for loss = sum_r grad_log_prob[r] log_prob[r] + grad_entropy[r] entropy[r], from the
//! forward's lse and entropy. grad_entropy == nullptr: no entropy term (entropy may then be nullptr).
//! grad may alias logits (same row_stride): in place. One read of the logits, one write of grad.
template <class T>
cudaError_t logits_backward(const T* logits, int64_t rows, int64_t cols, int64_t row_stride, const int64_t* labels,
                            const float* lse, const float* entropy, const float* grad_log_prob,
                            const float* grad_entropy, T* grad, int64_t grad_row_stride,
                            const logits_config& cfg = {}, cudaStream_t stream = nullptr) {
  static_assert(detail::is_logit_v<T>, "logits must be float, __half or __nv_bfloat16");
  if (cudaError_t e = detail::validate_common(logits, rows, cols, row_stride, labels, cfg); e != cudaSuccess) return e;
  if (rows == 0) return cudaSuccess;
  if (lse == nullptr || grad_log_prob == nullptr || grad == nullptr || !detail::aligned<T>(grad))
    return cudaErrorInvalidValue;
  if (grad_entropy != nullptr && entropy == nullptr) return cudaErrorInvalidValue;
  if (rows > 1 && grad_row_stride < cols) return cudaErrorInvalidValue;
  if (reinterpret_cast<const void*>(grad) == reinterpret_cast<const void*>(logits) && grad_row_stride != row_stride)
    return cudaErrorInvalidValue;  // in place must be element for element
  // ~16 packs per thread per block: long rows use many blocks, short rows one. In place, one block
  // per row: a row whose lse cannot place log p is re-read whole by its block, which must find the
  // logits, not another block's gradients.
  const int64_t per_block = int64_t{detail::block_threads} * detail::pack<T>::n * 16;
  const bool in_place = reinterpret_cast<const void*>(grad) == reinterpret_cast<const void*>(logits);
  int64_t col_blocks = in_place ? 1 : (cols + per_block - 1) / per_block;
  if (col_blocks > 65535) col_blocks = 65535;
  const int64_t n = detail::pack<T>::n;
  const int64_t cols_per_block = ((cols + col_blocks - 1) / col_blocks + n - 1) / n * n;
  col_blocks = (cols + cols_per_block - 1) / cols_per_block;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(col_blocks));
  if (detail::vec_ok<T>(logits, row_stride) && detail::vec_ok<T>(grad, grad_row_stride))
    detail::backward_kernel<T, true><<<grid, detail::block_threads, 0, stream>>>(
        logits, cols, row_stride, labels, lse, entropy, grad_log_prob, grad_entropy, grad, grad_row_stride,
        cfg.temperature, cols_per_block, cfg.bad_label_row);
  else
    detail::backward_kernel<T, false><<<grid, detail::block_threads, 0, stream>>>(
        logits, cols, row_stride, labels, lse, entropy, grad_log_prob, grad_entropy, grad, grad_row_stride,
        cfg.temperature, cols_per_block, cfg.bad_label_row);
  return cudaGetLastError();
}

}  // namespace ULORL_CUDA_ARCH_NS
}  // namespace cuda
ULORL_NAMESPACE_END
