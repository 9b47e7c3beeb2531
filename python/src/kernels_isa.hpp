// python/src/kernels_isa.hpp — the kernels the extension builds once more per wider instruction set
// (kernels_avx2.cpp: AVX2 + FMA; kernels_avx512.cpp: AVX-512 F/BW/DQ/VL + FMA; both define them
// through kernels_isa.inc) and losses.cpp installs at import (core/isa_dispatch.hpp): one list,
// read three ways (declare, define, install).
//
// The kernels are every element-type combination the torch adapter instantiates:
//   policy_loss: float32 / float64 values with std::uint8_t masks (the adapter's masks);
//   logits_forward (L logits, I labels, S statistics) and logits_backward (S, row gradients D; the
//   logits gradient has the logits' type):
//     logits_statistics (and the logits statistics of corrections.cpp): S = double for float32, float64,
//         bfloat16 and float16 logits; its backward's row gradients D are float32 or float64;
//     policy_loss_from_logits: S = D = the token dtype (float32 or float64), whatever the logits';
//     linear_head_policy_loss (float32 / float64 hidden states): S = D = double.
//   Labels are int64 or int32 throughout.
#pragma once

#include <cstdint>

#include <ulorl/core/isa_dispatch.hpp>
#include <ulorl/logits/backward.hpp>
#include <ulorl/logits/forward.hpp>
#include <ulorl/loss/policy_loss.hpp>

//! X(L, I, ...) for every logits and label type of the adapter.
#define ULORL_PY_LOGITS_LABELS_(X, ...)       \
  X(float, std::int64_t, __VA_ARGS__)         \
  X(float, std::int32_t, __VA_ARGS__)         \
  X(double, std::int64_t, __VA_ARGS__)        \
  X(double, std::int32_t, __VA_ARGS__)        \
  X(::ulorl::bf16, std::int64_t, __VA_ARGS__) \
  X(::ulorl::bf16, std::int32_t, __VA_ARGS__) \
  X(::ulorl::f16, std::int64_t, __VA_ARGS__)  \
  X(::ulorl::f16, std::int32_t, __VA_ARGS__)
#define ULORL_PY_LOGITS_(L, I, K)            \
  K(logits_forward, L, I, float)             \
  K(logits_forward, L, I, double)            \
  K(logits_backward, L, I, float, float, L)  \
  K(logits_backward, L, I, double, float, L) \
  K(logits_backward, L, I, double, double, L)

//! K(op, types...) for every kernel the extension installs (op: a name of ulorl::isa_op).
#define ULORL_PY_ISA_KERNEL_LIST(K)    \
  K(policy_loss, float, std::uint8_t)  \
  K(policy_loss, double, std::uint8_t) \
  ULORL_PY_LOGITS_LABELS_(ULORL_PY_LOGITS_, K)

//! The tags of the two sets: ulorl::kernel_of<ulorl_py_avx2, op, types...> (kernels_avx2.cpp) and
//! ulorl::kernel_of<ulorl_py_avx512, op, types...> (kernels_avx512.cpp).
struct ulorl_py_avx2;
struct ulorl_py_avx512;
