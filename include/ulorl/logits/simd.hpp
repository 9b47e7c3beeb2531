// ulorl/logits/simd.hpp — the vectorised inner loops of the CPU logits kernels: the chunk maximum,
// the chunk's online-softmax sums (sum e^d, sum e^d d) and the chunk's gradient p (a + b log p),
// and vec_exp. The exponentials are core/simd.hpp's: the sums and gradients evaluate
// 2^x = 2^n 2^f with n = round(x) and f = x - n exact (`detail::exp2_poly`, the arguments scaled
// to base 2 once per row); vec_exp is `exp_in_range` (max relative error ~1e-7 on [-87, 88.3]).
//
// The loops use core/simd.hpp's float vector at the native width (16 floats with AVX-512, 8 with
// AVX, 4 with SSE2/NEON) and its ISA tag, so one source serves every ISA the compiler targets; with
// another compiler, with ULORL_NO_SIMD defined, or under nvcc, scalar loops compute the same
// quantities with std::exp.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/simd.hpp"

ULORL_NAMESPACE_BEGIN
namespace simd {
inline namespace ULORL_ISA {

//! Logits below the row maximum by more than this (after /tau) have e^d < 1.7e-38: flushed to 0.
inline constexpr float exp_floor = -87.0f;

#ifdef ULORL_SIMD
inline constexpr int width = ULORL_SIMD_BYTES / 4;
using vfloat = vec_lanes<float>::V;
using vint = vec_lanes<float>::IV;

ULORL_ALWAYS_INLINE vfloat load(const float* p) noexcept {
  vfloat v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
ULORL_ALWAYS_INLINE void store(float* p, vfloat v) noexcept { std::memcpy(p, &v, sizeof v); }
ULORL_ALWAYS_INLINE vfloat splat(float x) noexcept { return vfloat{} + x; }
#ifdef ULORL_SIMD_FMA
//! a * b + c with one rounding (the hardware FMA, whatever the -ffp-contract setting).
ULORL_ALWAYS_INLINE vfloat fma(vfloat a, vfloat b, vfloat c) noexcept {
#if ULORL_SIMD_BYTES == 64
  return _mm512_fmadd_ps(a, b, c);
#elif ULORL_SIMD_BYTES == 32
  return _mm256_fmadd_ps(a, b, c);
#else
  return _mm_fmadd_ps(a, b, c);
#endif
}
#endif
//! m ? a : b lane by lane (m lanes are all-ones or zero, as produced by a comparison).
ULORL_ALWAYS_INLINE vfloat select(vint m, vfloat a, vfloat b) noexcept {
  return (vfloat)((m & (vint)a) | (~m & (vint)b));
}

// Half-width float lanes next to full-width double lanes (same lane count: native registers both).
inline constexpr int half = width / 2;
typedef float hfloat __attribute__((vector_size(half * 4)));
typedef std::int32_t hint __attribute__((vector_size(half * 4)));
typedef double hdouble __attribute__((vector_size(half * 8)));
typedef std::int64_t hlong __attribute__((vector_size(half * 8)));
ULORL_ALWAYS_INLINE hdouble splat_d(double x) noexcept { return hdouble{} + x; }
ULORL_ALWAYS_INLINE hdouble select(hlong m, hdouble a, hdouble b) noexcept {
  return (hdouble)((m & (hlong)a) | (~m & (hlong)b));
}
ULORL_ALWAYS_INLINE hfloat select(hint m, hfloat a, hfloat b) noexcept {
  return (hfloat)((m & (hint)a) | (~m & (hint)b));
}

//! e^x on the whole float line (core/simd.hpp's exp_in_range): clamps into [exp_floor, 88.3],
//! flushes x < exp_floor to +0; NaN propagates.
ULORL_ALWAYS_INLINE vfloat exp(vfloat x) noexcept {
  const vint dead = x < exp_floor;
  vfloat c = select(dead, splat(exp_floor), x);
  c = select(c > ::ulorl::detail::exp_constants<float>::hi, splat(::ulorl::detail::exp_constants<float>::hi), c);
  vfloat em1;
  return select(dead, splat(0.0f), vec_lanes<float>::exp_in_range(c, em1));
}
#endif

//! A positive scale (1 / tau, or it times log2 e) in float, never rounded to 0: past tau ~ 2^149,
//! 1 / tau is below float's range, and a scale of 0 would make masked (-inf) logits NaN (-inf * 0)
//! where their exponent must be -inf. The smallest subnormal moves no finite scaled difference by
//! more than 6.8e38 * 1.4e-45 ~ 1e-6.
inline float positive_scale(double k) noexcept {
  const auto f = static_cast<float>(k);
  return f > 0.0f ? f : std::numeric_limits<float>::denorm_min();
}

//! Scalar e^x with the vector routine's semantics (used for tails in tests and fallbacks).
inline float exp_scalar(float x) noexcept { return x < exp_floor ? 0.0f : std::exp(x); }

//! Prefetch the cache lines of next[offset, offset + span) that lie below next_bytes.
ULORL_ALWAYS_INLINE void prefetch_lines(const char* next, std::size_t next_bytes, std::size_t offset,
                                        std::size_t span) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  if (next == nullptr) return;
  for (std::size_t o = offset; o < offset + span && o < next_bytes; o += 64) __builtin_prefetch(next + o, 0, 3);
#else
  (void)next, (void)next_bytes, (void)offset, (void)span;
#endif
}

//! Largest element of p[0, n) ignoring NaN; -inf for n = 0. With Scan, also raises *hi to the
//! largest |x| bits of p[0, n) (max_abs_bits, core/simd.hpp) in the same loop: the value scan of a
//! chunk that is being read anyway.
template <bool Scan = false>
inline float chunk_max(const float* ULORL_RESTRICT p, std::size_t n, std::uint32_t* hi = nullptr) noexcept {
  constexpr std::uint32_t abs_mask = 0x7fffffffu;
  float m = -std::numeric_limits<float>::infinity();
  std::uint32_t h = 0;
  std::size_t i = 0;
#ifdef ULORL_SIMD
  if (n >= 2 * width) {
    vfloat m0 = splat(m), m1 = m0;
    vint h0{}, h1{};  // |x| bits are below 2^31: the signed maximum orders them
    for (; i + 2 * width <= n; i += 2 * width) {
      const vfloat a = load(p + i), b = load(p + i + width);
      m0 = select(a > m0, a, m0);
      m1 = select(b > m1, b, m1);
      if constexpr (Scan) {
        const vint ab = (vint)a & static_cast<std::int32_t>(abs_mask), bb = (vint)b & static_cast<std::int32_t>(abs_mask);
        h0 = ab > h0 ? ab : h0;
        h1 = bb > h1 ? bb : h1;
      }
    }
    m0 = select(m1 > m0, m1, m0);
    for (int l = 0; l < width; ++l) m = m0[l] > m ? m0[l] : m;
    if constexpr (Scan) {
      h0 = h1 > h0 ? h1 : h0;
      for (int l = 0; l < width; ++l) h = static_cast<std::uint32_t>(h0[l]) > h ? static_cast<std::uint32_t>(h0[l]) : h;
    }
  }
#endif
  for (; i < n; ++i) {
    m = p[i] > m ? p[i] : m;
    if constexpr (Scan) {
      const std::uint32_t b = ::ulorl::detail::bit_cast<std::uint32_t>(p[i]) & abs_mask;
      h = b > h ? b : h;
    }
  }
  if constexpr (Scan) *hi = h > *hi ? h : *hi;
  return m;
}

//! Adds sum e^d and sum e^d d over p[0, n), d = (x - m) * inv_tau (entries with d < exp_floor add
//! exactly 0), into s and t. Evaluated in base 2: d2 = d log2(e), 2^d2 = 2^n 2^f with n = round(d2)
//! and f = d2 - n exact, 2^f by its degree-7 Taylor polynomial (|f| <= 1/2: truncation 5e-9); this
//! saves the Cody-Waite steps of e^x. Sums are kept per lane in float (a chunk is short) and folded
//! into the double totals. `next`, `next_bytes`: the next chunk's storage, prefetched while this one
//! computes, so that the memory stream overlaps the arithmetic.
//! `Sq`: also q += sum_j e^{2 d_j} (the squares of the same exponentials: one more FMA per entry).
template <bool Sq = false>
inline void chunk_sums(const float* ULORL_RESTRICT p, std::size_t n, float m, float inv_tau, double& s, double& t,
                       double& q, const char* next = nullptr, std::size_t next_bytes = 0) noexcept {
  std::size_t i = 0;
#ifdef ULORL_SIMD
  if (n >= 2 * width) {
    const float k = inv_tau * 1.44269504088896341f;
    const float floor2 = exp_floor * 1.44269504088896341f;
    const float magic = 12582912.0f;
    vfloat s0{}, s1{}, t0{}, t1{}, q0{}, q1{};
    for (; i + 2 * width <= n; i += 2 * width) {
      prefetch_lines(next, next_bytes, i * sizeof(float), 2 * width * sizeof(float));
      vfloat d0 = (load(p + i) - m) * k;
      vfloat d1 = (load(p + i + width) - m) * k;
      // Entries below the floor (masked -inf ones included) contribute exactly 0; NaN passes through.
      const vint dead0 = d0 < floor2, dead1 = d1 < floor2;
      d0 = select(dead0, splat(floor2), d0);
      d1 = select(dead1, splat(floor2), d1);
      const vfloat n0 = (d0 + magic) - magic, n1 = (d1 + magic) - magic;
      const vint b0 = (__builtin_convertvector(n0, vint) + 127) << 23;
      const vint b1 = (__builtin_convertvector(n1, vint) + 127) << 23;
      const vfloat e0 = select(dead0, splat(0.0f), ::ulorl::detail::exp2_poly(d0 - n0) * (vfloat)b0);
      const vfloat e1 = select(dead1, splat(0.0f), ::ulorl::detail::exp2_poly(d1 - n1) * (vfloat)b1);
      s0 += e0;
      s1 += e1;
      t0 += e0 * d0;
      t1 += e1 * d1;
      if constexpr (Sq) {
        q0 += e0 * e0;
        q1 += e1 * e1;
      }
    }
    s0 += s1;
    t0 += t1;
    q0 += q1;
    double ss = 0, tt = 0, qq = 0;
    for (int l = 0; l < width; ++l) {
      ss += static_cast<double>(s0[l]);
      tt += static_cast<double>(t0[l]);
      if constexpr (Sq) qq += static_cast<double>(q0[l]);
    }
    s += ss;
    t += tt * 0.6931471805599453;  // base-2 exponents back to natural units
    q += qq;
  }
#else
  (void)next, (void)next_bytes;
#endif
  for (; i < n; ++i) {
    const float d0 = (p[i] - m) * inv_tau;
    const double d = d0 < exp_floor ? 0.0 : static_cast<double>(d0);
    const double e = d0 < exp_floor ? 0.0 : std::exp(d);
    s += e;
    t += e * d;
    if constexpr (Sq) q += e * e;
  }
}

//! out[j] = p_j (a + b lp_j) with lp_j = (x_j - c) * inv_tau - r = log p_j; 0 where lp_j < exp_floor.
//! `Precise`: p to ~2e-7 relative for every |log p| (float with error-free transformations when
//! the CPU has FMA, else log p formed and range-reduced in double); otherwise log p in float like
//! torch (relative error of p up to |log p| * 6e-8 + 1e-7), ~1.3x cheaper.
//! `stream`: write `out` with non-temporal stores (large outputs that will not be re-read soon).
//! p and out may be the same array (in place), hence no restrict.
template <bool Precise>
inline void chunk_grad(const float* p, float* out, std::size_t n, double c, double inv_tau, double r, float a, float b,
                       bool stream = false, const char* next = nullptr, std::size_t next_bytes = 0) noexcept {
  std::size_t i = 0;
#ifdef ULORL_SIMD
  const bool stream_full = stream && reinterpret_cast<std::uintptr_t>(out) % sizeof(vfloat) == 0;
  stream = stream && reinterpret_cast<std::uintptr_t>(out) % sizeof(hfloat) == 0;
  const auto put = [&](float* dst, hfloat v) {
    if (stream)
      store_stream(dst, v);
    else
      std::memcpy(dst, &v, sizeof v);
  };
#ifdef ULORL_SIMD_FMA
  if constexpr (Precise) {
    // Full-width float with error-free transformations, base 2. With u = x - c (rounded) and e1 its
    // exact error (TwoSum), k + k_lo = log2(e) / tau, lp2 = log2 p = (u + e1)(k + k_lo) - rr:
    // prod = u k rounded, e2 = fma(u, k, -prod) its exact error; n = round(prod - rr);
    // f = (prod - n) + (e2 + e1 k + u k_lo - rr), where prod - n is exact (Sterbenz) and the bracket
    // is tiny: 2^f to ~1e-7 relative for every |log p|, at ~1.3x the fast path's arithmetic.
    const double kd = inv_tau * 1.4426950408889634;
    const auto cf = static_cast<float>(c), k = positive_scale(kd);
    const auto k_lo = static_cast<float>(kd - static_cast<double>(k));
    const auto rr = static_cast<float>(r * 1.4426950408889634);
    const float b2 = b * 0.6931471805599453f, floor2 = exp_floor * 1.44269504088896341f, magic = 12582912.0f;
    const vfloat ncf = splat(-cf), vk = splat(k), vklo = splat(k_lo), nrr = splat(-rr);
    for (; i + width <= n; i += width) {
      prefetch_lines(next, next_bytes, i * sizeof(float), width * sizeof(float));
      const vfloat x = load(p + i);
      const vfloat u = x + ncf;
      const vfloat bv = u - x;
      const vfloat e1 = (x - (u - bv)) + (ncf - bv);
      const vfloat prod = u * vk;
      const vfloat e2 = fma(u, vk, -prod);
      const vfloat lp2 = prod + nrr;
      const vint dead = lp2 < floor2;
      vfloat lc = select(dead, splat(floor2), lp2);
      lc = select(lc > 127.0f, splat(127.0f), lc);
      const vfloat nf = (lc + magic) - magic;
      vfloat f = (prod - nf) + (e2 + fma(e1, vk, fma(u, vklo, nrr)));
      f = select(f > 1.0f, splat(1.0f), f);  // only for inconsistent statistics (log p > 127)
      const vfloat q = ::ulorl::detail::exp2_poly(f);
      const vint bits = (__builtin_convertvector(nf, vint) + 127) << 23;
      const vfloat g = select(dead, splat(0.0f), q * (vfloat)bits * (a + b2 * lc));
      if (stream_full)
        store_stream(out + i, g);
      else
        std::memcpy(out + i, &g, sizeof g);
    }
  } else
#endif
  if constexpr (Precise) {
    const double magic = 6755399441055744.0;  // 1.5 * 2^52
    for (; i + half <= n; i += half) {
      prefetch_lines(next, next_bytes, i * sizeof(float), half * sizeof(float));
      hfloat x;
      std::memcpy(&x, p + i, sizeof x);
      const hdouble lpd = (__builtin_convertvector(x, hdouble) - c) * inv_tau - r;
      const hlong dead = lpd < double(exp_floor);
      hdouble lpc = select(dead, splat_d(double(exp_floor)), lpd);  // NaN kept
      lpc = select(lpc > 88.3, splat_d(88.3), lpc);
      // Base 2 in double: lpc log2(e) = n + f, f exact to float's precision; 2^f in float.
      const hdouble l2 = lpc * 1.4426950408889634;
      const hdouble nd = (l2 + magic) - magic;
      const hfloat f = __builtin_convertvector(l2 - nd, hfloat);
      const hfloat lp = __builtin_convertvector(lpc, hfloat);
      const hint bits = (__builtin_convertvector(nd, hint) + 127) << 23;
      const hfloat g = ::ulorl::detail::exp2_poly(f) * (hfloat)bits * (a + b * lp);
      put(out + i, select(__builtin_convertvector(dead, hint), hfloat{}, g));
    }
  } else {
    // Full-width float, base 2: lp2 = log2 p, 2^lp2 = 2^n 2^f, and a + b lp = a + (b ln2) lp2.
    const float l2e = 1.44269504088896341f;
    const auto cf = static_cast<float>(c), k = positive_scale(inv_tau * 1.4426950408889634),
               r2 = static_cast<float>(r) * l2e;
    const float b2 = b * 0.6931471805599453f, floor2 = exp_floor * l2e, magic = 12582912.0f;
    const auto store_full = [&](float* dst, vfloat v) {
      if (stream_full) {
        store_stream(dst, v);
      } else {
        std::memcpy(dst, &v, sizeof v);
      }
    };
    for (; i + width <= n; i += width) {
      prefetch_lines(next, next_bytes, i * sizeof(float), width * sizeof(float));
      const vfloat lp2 = (load(p + i) - cf) * k - r2;
      const vint dead = lp2 < floor2;
      vfloat lc = select(dead, splat(floor2), lp2);
      lc = select(lc > 127.0f, splat(127.0f), lc);
      const vfloat nf = (lc + magic) - magic;
      const vfloat f = lc - nf;
      const vfloat q = ::ulorl::detail::exp2_poly(f);
      const vint bits = (__builtin_convertvector(nf, vint) + 127) << 23;
      store_full(out + i, select(dead, splat(0.0f), q * (vfloat)bits * (a + b2 * lc)));
    }
  }
#else
  (void)stream, (void)next, (void)next_bytes;
#endif
  for (; i < n; ++i) {
    const double lp = (static_cast<double>(p[i]) - c) * inv_tau - r;
    out[i] = lp < exp_floor ? 0.0f : static_cast<float>(std::exp(lp) * (a + b * lp));
  }
}

}  // namespace ULORL_ISA
}  // namespace simd

inline namespace ULORL_ISA {

//! out[i] = e^{in[i]} with the kernels' vectorised exp (max relative error ~1e-7 for
//! x in [-87, 88.3]; +0 below -87, clamps above 88.3; NaN propagates). For testing and reuse.
inline void vec_exp(const float* in, float* out, std::size_t n) noexcept {
  std::size_t i = 0;
#ifdef ULORL_SIMD
  for (; i + simd::width <= n; i += simd::width)
    simd::store(out + i, simd::exp(simd::load(in + i)));
#endif
  for (; i < n; ++i) out[i] = simd::exp_scalar(in[i] > 88.3f ? 88.3f : in[i]);
}

}  // namespace ULORL_ISA

ULORL_NAMESPACE_END
