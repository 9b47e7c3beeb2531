// ulorl/core/config.hpp — version, the versioned inline namespace, the host/device qualifier for
// scalar math shared with CUDA, the exception switch and the compiler portability macros.
// Every other ulorl header includes this.
#pragma once

#define ULORL_VERSION_MAJOR 0
#define ULORL_VERSION_MINOR 1
#define ULORL_VERSION_PATCH 0
#define ULORL_VERSION (ULORL_VERSION_MAJOR * 10000 + ULORL_VERSION_MINOR * 100 + ULORL_VERSION_PATCH)

//! Two builds of different ulorl versions in one program must not violate the ODR (fmt, CUB):
//! every declaration lives in `ulorl::v0`, reachable as `ulorl::` through the inline namespace.
#ifndef ULORL_ABI_NAMESPACE
#define ULORL_ABI_NAMESPACE v0
#endif
#define ULORL_NAMESPACE_BEGIN \
  namespace ulorl {           \
  inline namespace ULORL_ABI_NAMESPACE {
#define ULORL_NAMESPACE_END \
  }                         \
  }

//! Scalar math written once for the CPU loops, the CUDA kernels and the presets.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define ULORL_HD __host__ __device__
#define ULORL_DEVICE_COMPILE 1
#else
#define ULORL_HD
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ULORL_RESTRICT __restrict__
//! Forces inlining: the per-token formulas inside the kernels' loops (a call left in a loop body
//! stops vectorisation), the lane operations. Only in optimised builds: at -O0 forced inlining
//! copies every lane operation into every kernel and doubles the compile time of a debug build
//! (a sanitised kernel translation unit: 125 s -> 66 s), for code that is not vectorised anyway.
#if defined(__OPTIMIZE__)
#define ULORL_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ULORL_ALWAYS_INLINE inline
#endif
#define ULORL_NOINLINE __attribute__((noinline))
#else
#define ULORL_RESTRICT
#define ULORL_ALWAYS_INLINE inline
#define ULORL_NOINLINE
#endif

//! GCC does not schedule instructions before register allocation on x86 by default. The loss row
//! kernels are long chains of dependent vector operations (two exponentials per token); the
//! register-pressure-aware pre-RA scheduler interleaves their independent chains (bench/RESULTS.md,
//! bench_loss). Only those kernels get it, in optimised builds; define ULORL_NO_SCHED_PRESSURE to turn it off.
#if defined(__GNUC__) && !defined(__clang__) && !defined(ULORL_NO_SCHED_PRESSURE) && defined(__OPTIMIZE__)
#define ULORL_SCHED_PRESSURE __attribute__((optimize("schedule-insns", "sched-pressure")))
#else
#define ULORL_SCHED_PRESSURE
#endif

//! Define ULORL_NO_EXCEPTIONS to turn every `throw ulorl::error` into a message on stderr and
//! `std::abort()` (the documented abort path for builds without exceptions).
#if !defined(ULORL_NO_EXCEPTIONS) && !defined(__cpp_exceptions) && !defined(__EXCEPTIONS)
#define ULORL_NO_EXCEPTIONS
#endif

//! The C++ standard of this translation unit. The library is C++20; the headers the CUDA kernels
//! include (the formula headers: core/config, core/simd's scalar lanes, core/numerics, core/views,
//! core/ragged, core/error, core/dispatch, loss/ratio, loss/objectives, loss/kl, loss/aggregation,
//! loss/metrics, loss/entropy, loss/policy_loss_types, loss/detail/token_loss and
//! logits/online_softmax) also compile as C++17, for nvcc 11.8; what needs C++20 there (the
//! std::span constructors of the views) is left out of a C++17 translation unit.
#if __cplusplus >= 202002L
#define ULORL_CXX20 1
#else
#define ULORL_CXX20 0
#endif

//! Internal invariants (not user preconditions): checked in debug builds only.
#ifndef ULORL_ASSERT
#include <cassert>
#define ULORL_ASSERT(cond) assert(cond)
#endif

#include <cstring>
#include <type_traits>
#if ULORL_CXX20
#include <bit>
#endif

ULORL_NAMESPACE_BEGIN
namespace detail {
//! std::bit_cast where the standard library has it; a memcpy (not constexpr) in C++17.
template <class To, class From>
[[nodiscard]] ULORL_HD ULORL_ALWAYS_INLINE constexpr To bit_cast(From from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "bit_cast: sizes differ");
#if defined(__cpp_lib_bit_cast)
  return std::bit_cast<To>(from);
#else
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
#endif
}
//! std::remove_cvref_t, which C++17 lacks.
template <class T>
using remove_cvref_t = std::remove_cv_t<std::remove_reference_t<T>>;
}  // namespace detail
ULORL_NAMESPACE_END
