// ulorl/core/simd.hpp — the SIMD layer of the library: which vector width the including translation
// unit gets, the ISA-tag inline namespace that keeps differently compiled kernels apart, the one
// off switch, the lane types the per-token formulas and the linear head's GEMM micro-kernels are
// written against, and the exponential of every CPU kernel: `exp_in_range` (e^x and e^x - 1 - x,
// float and double: the loss, rollout correction, the logits' vec_exp) with its base-2 core
// `exp2_poly` (2^f for |f| <= 1/2, float: the logits sums and gradients, whose arguments arrive
// already in base 2).
//
// Lane types. Every per-token formula of ulorl (objectives, KL estimators, ratios) is one function
// template over a lane type `L`: `typename L::V` is the value (one float or double, or a GCC/Clang
// vector of them), `typename L::M` the matching mask (bool, or the integer vector a comparison
// yields). Arithmetic and comparisons are the language's own operators on both; lane selection,
// clamps and constants go through `L`:
//   scalar_lanes<T>      one element (CPU scalar loops, the sequence-level rows, CUDA device code)
//   vec_lanes<T, Bytes>  a vector of Bytes / sizeof(T) elements (the CPU row kernels)
// so the scalar path, the SIMD kernels and the device kernels evaluate the same source.
//
// Width. With GCC or Clang (not under nvcc), vectors are as wide as the ISA of the including
// translation unit: 64 bytes with AVX-512F, 32 with AVX, 16 otherwise (SSE2, NEON); a vector
// argument therefore never changes the ABI. ULORL_SIMD_BYTES overrides the width (16, 32 or 64, at
// most the ISA's). Define ULORL_NO_SIMD to compile every kernel of the library as scalar loops.
//
// ISA tag. Code that depends on the ISA (every kernel, and the lane types themselves) lives in the
// inline namespace ULORL_ISA, named after width and FMA: objects built with different flags
// (-march=native next to a portable build) never merge one variant into the other at link time,
// which would run AVX-512 code on a CPU without it. Configuration types are not tagged.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ulorl/core/config.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__) && !defined(ULORL_DEVICE_COMPILE)
#include <immintrin.h>
#endif

#if !defined(ULORL_NO_SIMD) && (defined(__GNUC__) || defined(__clang__)) && !defined(ULORL_DEVICE_COMPILE)
#define ULORL_SIMD 1
#if defined(ULORL_SIMD_BYTES)
static_assert(ULORL_SIMD_BYTES == 16 || ULORL_SIMD_BYTES == 32 || ULORL_SIMD_BYTES == 64,
              "ULORL_SIMD_BYTES must be 16, 32 or 64");
#elif defined(__AVX512F__)
#define ULORL_SIMD_BYTES 64
#elif defined(__AVX__)
#define ULORL_SIMD_BYTES 32
#else
#define ULORL_SIMD_BYTES 16
#endif
//! The CPU has a fused multiply-add the compiler may use (contraction changes roundings).
#if defined(__FMA__) || defined(__AVX512F__)
#define ULORL_SIMD_FMA 1
#endif
#endif

#define ULORL_ISA_CAT3(a, b, c) a##b##c
#define ULORL_ISA_NAME(a, b, c) ULORL_ISA_CAT3(a, b, c)
#if !defined(ULORL_SIMD)
#define ULORL_ISA isa_scalar
#elif defined(ULORL_SIMD_FMA)
#define ULORL_ISA ULORL_ISA_NAME(isa_v, ULORL_SIMD_BYTES, _fma)
#else
#define ULORL_ISA ULORL_ISA_NAME(isa_v, ULORL_SIMD_BYTES, )
#endif

ULORL_NAMESPACE_BEGIN

namespace detail {
template <class T>
struct exp_constants;
template <>
struct exp_constants<float> {
  // Arguments are clamped so that the exponent 2^n stays normal: results are finite and > 0.
  static constexpr float lo = -87.0f, hi = 88.3f;
  static constexpr float log2e = 1.44269504088896341f;
  static constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;  // Cephes split, n*ln2_hi exact
  static constexpr float round_magic = 12582912.0f;                      // 1.5 * 2^23
};
template <>
struct exp_constants<double> {
  static constexpr double lo = -708.0, hi = 709.0;
  static constexpr double log2e = 1.4426950408889634074;
  static constexpr double ln2_hi = 6.93145751953125e-1, ln2_lo = 1.42860682030941723212e-6;
  static constexpr double round_magic = 6755399441055744.0;  // 1.5 * 2^52
};

//! The reduction and polynomial of the loss exponential (`V` is T or a GCC/Clang vector of T): for
//! an already clamped x, rounds x*log2(e) to n with the magic-number trick (exact, no libm call; `t`
//! receives the biased n) and reduces r = x - n ln2 (|r| <= ln2/2). exp(r) = 1 + (r + s) with
//! s = r^2 q(r), q the Taylor series of (exp(r) - 1 - r) / r^2, evaluated by Estrin's scheme (a few
//! dependent steps instead of a Horner chain). `s` is exp(x) - 1 - x itself whenever n = 0
//! (|x| < ln2/2: r = x exactly), so the k3 estimators get that difference without cancellation.
//! Truncation of q relative to 1/2: <= 9e-8 (float, to r^5/7!), ~7e-17 (double, to r^11/13!).
template <class V, class T = V>
ULORL_HD ULORL_ALWAYS_INLINE constexpr void exp_poly(V x, V& t, V& r, V& s) noexcept {
  using C = exp_constants<T>;
  t = x * C::log2e + C::round_magic;
  const V n = t - C::round_magic;
  r = (x - n * C::ln2_hi) - n * C::ln2_lo;
  const V r2 = r * r;
  V q;
  if constexpr (std::is_same_v<T, float>) {
    const V a01 = r * T(1.0 / 6) + T(0.5), a23 = r * T(1.0 / 120) + T(1.0 / 24), a45 = r * T(1.0 / 5040) + T(1.0 / 720);
    q = r2 * (r2 * a45 + a23) + a01;
  } else {
    const V p0 = r * (1.0 / 6.0) + 0.5, p1 = r * (1.0 / 120.0) + 1.0 / 24.0, p2 = r * (1.0 / 5040.0) + 1.0 / 720.0;
    const V p3 = r * (1.0 / 362880.0) + 1.0 / 40320.0, p4 = r * (1.0 / 39916800.0) + 1.0 / 3628800.0;
    const V p5 = r * (1.0 / 6227020800.0) + 1.0 / 479001600.0;
    const V r4 = r2 * r2;
    const V q0 = r2 * p1 + p0, q1 = r2 * p3 + p2, q2 = r2 * p5 + p4;
    q = r4 * (r4 * q2 + q1) + q0;
  }
  s = q * r2;
}

//! 2^f for |f| <= 1/2 in float (`V`: float or a GCC/Clang vector of float): the degree-7 Taylor
//! polynomial of 2^f in Horner form (truncation 5e-9 relative). Callers that hold x log2(e) already
//! (the logits kernels scale by log2(e) / tau once per row) split it as n + f with n = round and f
//! exact, and build 2^n in the exponent field themselves.
template <class V>
ULORL_HD ULORL_ALWAYS_INLINE constexpr V exp2_poly(V f) noexcept {
  V q = f * 1.525273380405984e-05f + 1.5403530393381608e-04f;
  q = q * f + 1.3333558146428443e-03f;
  q = q * f + 9.6181291076284772e-03f;
  q = q * f + 5.5504108664821580e-02f;
  q = q * f + 2.4022650695910071e-01f;
  q = q * f + 6.9314718055994531e-01f;
  return q * f + 1.0f;
}

//! exp(x) and exp(x) - 1 - x (`em1`) for x already clamped to exp's range (`IV`: the integer type or
//! vector of T's width). exp(x) = 2^n (r + s) + 2^n, 2^n built in the exponent field directly.
template <class V, class T = V, class IV = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>>
ULORL_HD ULORL_ALWAYS_INLINE constexpr V exp_in_range(V x, V& em1) noexcept {
  using C = exp_constants<T>;
  using I = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
  constexpr int mant = sizeof(T) == 4 ? 23 : 52;
  constexpr I bias = sizeof(T) == 4 ? 127 : 1023;
  V t, r, s;
  exp_poly<V, T>(x, t, r, s);
  const IV ni = ulorl::detail::bit_cast<IV>(t) - ulorl::detail::bit_cast<I>(C::round_magic);
  const V scale = ulorl::detail::bit_cast<V>(static_cast<IV>((ni + bias) << mant));
  const V e = (r + s) * scale + scale;
  em1 = t == C::round_magic ? s : (e - T(1)) - x;
  return e;
}
}  // namespace detail

namespace simd {
inline namespace ULORL_ISA {

//! One element as a lane: the scalar loops and device code.
template <class T>
struct scalar_lanes {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "scalar_lanes: float or double");
  using value_type = T;
  using V = T;
  using M = bool;
  static constexpr std::size_t N = 1;

  ULORL_HD static ULORL_ALWAYS_INLINE constexpr V splat(T x) noexcept { return x; }
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr V load(const T* p) noexcept { return *p; }
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr void store(T* p, V v) noexcept { *p = v; }
  //! The sum of the lanes: the element itself.
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr T sum(V v) noexcept { return v; }
  //! A loop-invariant condition as a mask.
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr M mask_of(bool b) noexcept { return b; }
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr V select(M m, V a, V b) noexcept { return m ? a : b; }
  //! clamp(x, lo, hi) for lo <= hi; NaN stays NaN.
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr V clamp(V x, V lo, V hi) noexcept {
    const V t = x > hi ? hi : x;
    return t < lo ? lo : t;
  }
  //! lo <= x <= hi (false for NaN): where a clamp passes the gradient (torch's closed interval).
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr M passes(V x, V lo, V hi) noexcept { return (lo <= x) & (x <= hi); }
  //! exp(x) and exp(x) - 1 - x for x already inside exp_constants' range.
  ULORL_HD static ULORL_ALWAYS_INLINE constexpr V exp_in_range(V x, V& em1) noexcept { return detail::exp_in_range<T>(x, em1); }
};

//! Orders the non-temporal stores made so far (store_stream) before later stores: once after a
//! streamed output. Nothing where there are none.
ULORL_ALWAYS_INLINE void fence_streams() noexcept {
#if defined(ULORL_SIMD) && (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__)
  _mm_sfence();
#endif
}

#if defined(ULORL_SIMD)
//! A non-temporal store (it bypasses the caches and needs no read of the line first) of one
//! vector V (16, 32 or 64 bytes of float or double, a GCC/Clang vector) to an address aligned to
//! sizeof(V): for a large output nothing reads soon. An ordinary store where the instruction set
//! has none. fence_streams() orders such stores before later ones.
template <class T, class V>
ULORL_ALWAYS_INLINE void store_stream(T* p, V v) noexcept {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "store_stream: float or double");
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    if constexpr (sizeof(T) == 4) _mm512_stream_ps(p, reinterpret_cast<__m512>(v));
    else _mm512_stream_pd(p, reinterpret_cast<__m512d>(v));
    return;
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32) {
    if constexpr (sizeof(T) == 4) _mm256_stream_ps(p, reinterpret_cast<__m256>(v));
    else _mm256_stream_pd(p, reinterpret_cast<__m256d>(v));
    return;
  }
#endif
#if (defined(__x86_64__) || defined(__i386__)) && defined(__SSE2__)
  if constexpr (sizeof(V) == 16) {
    if constexpr (sizeof(T) == 4) _mm_stream_ps(p, reinterpret_cast<__m128>(v));
    else _mm_stream_pd(p, reinterpret_cast<__m128d>(v));
    return;
  }
#endif
  std::memcpy(p, &v, sizeof v);
}

//! bool masks are read as bytes (a vector of bool does not exist).
template <class M>
using mask_elem_t = std::conditional_t<std::is_same_v<std::remove_cv_t<M>, bool>, std::uint8_t, std::remove_cv_t<M>>;

//! Bytes / sizeof(T) elements as lanes (GCC/Clang vector extensions).
template <class T, std::size_t Bytes = ULORL_SIMD_BYTES>
struct vec_lanes {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "vec_lanes: float or double");
  using value_type = T;
  static constexpr std::size_t N = Bytes / sizeof(T);
  using I = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
  typedef T V __attribute__((vector_size(Bytes)));
  typedef I IV __attribute__((vector_size(Bytes)));
  using M = IV;                                                           //!< -1 / 0 lanes
  typedef double DV __attribute__((vector_size(N * sizeof(double))));  // never passed by value

  // `x - 0` keeps the sign of -0 (`0 + x` would not).
  static ULORL_ALWAYS_INLINE V splat(T x) noexcept { return x - V{}; }
  static ULORL_ALWAYS_INLINE M mask_of(bool b) noexcept { return b ? ~IV{} : IV{}; }
  static ULORL_ALWAYS_INLINE V select(M m, V a, V b) noexcept { return m ? a : b; }
  static ULORL_ALWAYS_INLINE V load(const T* p) noexcept {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static ULORL_ALWAYS_INLINE void store(T* p, V v) noexcept { std::memcpy(p, &v, sizeof v); }
  //! A non-temporal store of one vector to a Bytes-aligned address (simd::store_stream).
  static ULORL_ALWAYS_INLINE void store_stream(T* p, V v) noexcept { simd::store_stream(p, v); }
  //! The sum of the lanes by a pairwise tree (lane l + lane l + N/2, halving), the same order for
  //! every vector: results do not depend on which lanes a tiling put the terms in.
  static ULORL_ALWAYS_INLINE T sum(V v) noexcept {
    alignas(64) T t[N];
    std::memcpy(t, &v, sizeof v);
    for (std::size_t w = N / 2; w >= 1; w /= 2)
      for (std::size_t l = 0; l < w; ++l) t[l] += t[l + w];
    return t[0];
  }
  //! -1 where mask != 0, else 0.
  template <class Mask>
  static ULORL_ALWAYS_INLINE IV valid_lanes(const Mask* p) noexcept {
    using E = mask_elem_t<Mask>;
    typedef E MV __attribute__((vector_size(N * sizeof(E))));
    MV m;
    std::memcpy(&m, p, sizeof m);
    return __builtin_convertvector(m != E(0), IV);
  }
  //! clamp(x, lo, hi) for lo <= hi (NaN stays NaN), min then max: the two instructions
  //! (minps/maxps have exactly these select semantics).
  static ULORL_ALWAYS_INLINE V clamp(V x, V lo, V hi) noexcept {
    const V t = x > hi ? hi : x;
    return t < lo ? lo : t;
  }
  static ULORL_ALWAYS_INLINE M passes(V x, V lo, V hi) noexcept { return (lo <= x) & (x <= hi); }
  static ULORL_ALWAYS_INLINE V exp_in_range(V x, V& em1) noexcept { return detail::exp_in_range<V, T, IV>(x, em1); }

  // Masked accumulation. `acc + (m ? x : 0)` and `m ? acc + x : acc` are the same bits (a sum that
  // starts at +0 is never -0, and acc + 0 == acc otherwise). With AVX-512 the second form is one
  // merge-masked instruction and the first two; without mask registers the first is shorter (an
  // and, then the add), so each ISA gets its own. min/max keep minps/maxps semantics (a NaN x
  // leaves acc as it is); counters subtract the -1/0 valid lanes.
#if defined(__AVX512F__)
  static constexpr bool mask_registers = true;
#else
  static constexpr bool mask_registers = false;
#endif
  static ULORL_ALWAYS_INLINE V add_where(V acc, IV m, V x) noexcept {
    if constexpr (mask_registers) return m ? acc + x : acc;
    else return acc + (m ? x : V{});
  }
  static ULORL_ALWAYS_INLINE V sub_where(V acc, IV m, V x) noexcept {
    if constexpr (mask_registers) return m ? acc - x : acc;
    else return acc - (m ? x : V{});
  }
  //! acc + 1 where f and valid (valid: -1 / 0 lanes).
  static ULORL_ALWAYS_INLINE IV count_where(IV acc, IV f, IV valid) noexcept {
    if constexpr (mask_registers) return f ? acc - valid : acc;
    else return acc - (valid & f);
  }
  static ULORL_ALWAYS_INLINE V min_where(V acc, IV m, V x) noexcept {
    if constexpr (mask_registers) {
      return m ? (x < acc ? x : acc) : acc;
    } else {
      const V y = m ? x : splat(std::numeric_limits<T>::infinity());
      return y < acc ? y : acc;
    }
  }
  static ULORL_ALWAYS_INLINE V max_where(V acc, IV m, V x) noexcept {
    if constexpr (mask_registers) {
      return m ? (x > acc ? x : acc) : acc;
    } else {
      const V y = m ? x : splat(-std::numeric_limits<T>::infinity());
      return y > acc ? y : acc;
    }
  }
  //! a += x (lane-wise, in double); x = 0.
  static ULORL_ALWAYS_INLINE void flush(DV& a, V& x) noexcept {
    a += __builtin_convertvector(x, DV);
    x = V{};
  }
};

//! Elements of a unit-stride row before the first element of `p` on a vector boundary (64 bytes at
//! most): the kernels take them separately (the peel), so that the vector loop's loads and stores
//! do not straddle cache lines when the arrays share p's alignment (malloc'd blocks sit 16 bytes
//! past one). 0 for rows of fewer than 8 vectors, where one more partial vector would cost more
//! than it saves, and for a pointer not aligned to T.
template <class T, std::size_t Bytes>
[[nodiscard]] inline std::size_t peel(const T* p, std::size_t n) noexcept {
  constexpr std::size_t align = Bytes < 64 ? Bytes : 64;
  const std::size_t off = reinterpret_cast<std::uintptr_t>(p) % align;
  return off != 0 && off % sizeof(T) == 0 && n >= 8 * (Bytes / sizeof(T)) ? (align - off) / sizeof(T) : 0;
}
#endif  // ULORL_SIMD

//! The unsigned integer as wide as T.
template <class T>
using uint_of_t = std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                     std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;

//! The bits of +inf in T's format (bfloat16 storage for 2 bytes): a magnitude's bits at least this
//! are inf or NaN.
template <class T>
inline constexpr uint_of_t<T> inf_bits = sizeof(T) == 2   ? uint_of_t<T>(0x7f80u)
                                         : sizeof(T) == 4 ? uint_of_t<T>(0x7f800000u)
                                                          : uint_of_t<T>(0x7ff0000000000000ull);

//! The largest |x| of p[0, n) as the bits of |x| (sign cleared) in the unsigned integer of T's
//! width; T is an IEEE binary format with its sign in the top bit (float, double, or 2-byte
//! bfloat16 storage). For non-negative IEEE values the integer order is the value order, so one
//! integer maximum answers both questions of a value scan: the result is at least the bits of
//! +inf exactly when some element is inf or NaN, and otherwise it is the bits of the largest
//! magnitude. An integer reduction vectorises without fast-math, which a floating-point maximum
//! (NaN semantics) does not.
template <class T>
[[nodiscard]] inline uint_of_t<T> max_abs_bits(const T* p, std::size_t n) noexcept {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "max_abs_bits: a 2-, 4- or 8-byte IEEE format");
  static_assert(std::is_trivially_copyable_v<T>, "max_abs_bits: a trivially copyable value type");
  using U = uint_of_t<T>;
  constexpr U abs_mask = static_cast<U>(static_cast<U>(~U{0}) >> 1);
  U hi = 0;
  std::size_t i = 0;
#if defined(ULORL_SIMD)
  constexpr std::size_t N = ULORL_SIMD_BYTES / sizeof(T);
  typedef U UV __attribute__((vector_size(ULORL_SIMD_BYTES)));
  UV acc0{}, acc1{};
  const auto load = [](const T* q) {
    UV v;
    std::memcpy(&v, q, sizeof v);
    return v & abs_mask;
  };
  for (; i + 2 * N <= n; i += 2 * N) {
    const UV a = load(p + i), b = load(p + i + N);
    acc0 = acc0 > a ? acc0 : a;
    acc1 = acc1 > b ? acc1 : b;
  }
  acc0 = acc0 > acc1 ? acc0 : acc1;
  for (std::size_t l = 0; l < N; ++l) hi = hi > acc0[l] ? hi : acc0[l];
#endif
  for (; i < n; ++i) {
    const U b = static_cast<U>(ulorl::detail::bit_cast<U>(p[i]) & abs_mask);
    hi = hi > b ? hi : b;
  }
  return hi;
}

}  // namespace ULORL_ISA
}  // namespace simd

ULORL_NAMESPACE_END
