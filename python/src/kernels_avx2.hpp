// python/src/kernels_avx2.hpp — the kernels kernels_avx2.cpp builds for AVX2 + FMA and losses.cpp
// installs at import: the getters' declarations and the element types of the logits kernels.
//
// The logits kernels' types are every (logits L, labels I, statistics S[, row gradients D]) that the
// torch adapter instantiates (grad_logits always has the logits' type):
//   logits_stats (and the logits statistics of corrections.cpp): S = double for float32, float64,
//       bfloat16 and float16 logits; its backward's row gradients D are float32 or float64;
//   policy_loss_from_logits: S = D = the token dtype (float32 or float64), whatever the logits';
//   linear_head_policy_loss (float32 / float64 hidden states): S = D = double.
// Labels are int64 or int32 throughout.
#pragma once

#include <cstdint>

#include <ulorl/logits/backward.hpp>
#include <ulorl/logits/forward.hpp>
#include <ulorl/loss/policy_loss.hpp>

//! X(ID, L, I) for every logits and label type of the adapter; ID names the pair in the getters.
#define ULORL_PY_LOGITS_LABELS(X, ...)               \
  X(f32_i64, float, std::int64_t, __VA_ARGS__)       \
  X(f32_i32, float, std::int32_t, __VA_ARGS__)       \
  X(f64_i64, double, std::int64_t, __VA_ARGS__)      \
  X(f64_i32, double, std::int32_t, __VA_ARGS__)      \
  X(bf16_i64, ::ulorl::bf16, std::int64_t, __VA_ARGS__) \
  X(bf16_i32, ::ulorl::bf16, std::int32_t, __VA_ARGS__) \
  X(f16_i64, ::ulorl::f16, std::int64_t, __VA_ARGS__)   \
  X(f16_i32, ::ulorl::f16, std::int32_t, __VA_ARGS__)

//! The getters' names: ulorl_py_avx2_logits_forward_<pair>_<S>, ulorl_py_avx2_logits_backward_<pair>_<S>_<D>.
#define ULORL_PY_FORWARD_NAME(ID, S) ulorl_py_avx2_logits_forward_##ID##_##S
#define ULORL_PY_BACKWARD_NAME(ID, S, D) ulorl_py_avx2_logits_backward_##ID##_##S##_##D

//! F(NAME, L, I, S) for every forward kernel and B(NAME, L, I, S, D) for every backward kernel.
#define ULORL_PY_FORWARD_S_(ID, L, I, F)                      \
  F(ULORL_PY_FORWARD_NAME(ID, float), L, I, float)            \
  F(ULORL_PY_FORWARD_NAME(ID, double), L, I, double)
#define ULORL_PY_BACKWARD_SD_(ID, L, I, B)                    \
  B(ULORL_PY_BACKWARD_NAME(ID, float, float), L, I, float, float)    \
  B(ULORL_PY_BACKWARD_NAME(ID, double, float), L, I, double, float)  \
  B(ULORL_PY_BACKWARD_NAME(ID, double, double), L, I, double, double)
#define ULORL_PY_LOGITS_FORWARD_KERNELS(F) ULORL_PY_LOGITS_LABELS(ULORL_PY_FORWARD_S_, F)
#define ULORL_PY_LOGITS_BACKWARD_KERNELS(B) ULORL_PY_LOGITS_LABELS(ULORL_PY_BACKWARD_SD_, B)

// The getters (defined in kernels_avx2.cpp: call only after the CPU check).
ulorl::policy_loss_kernel<float, std::uint8_t> ulorl_py_avx2_policy_loss_f32() noexcept;
ulorl::policy_loss_kernel<double, std::uint8_t> ulorl_py_avx2_policy_loss_f64() noexcept;
#define ULORL_PY_DECLARE_FORWARD_(NAME, L, I, S) ::ulorl::logits_forward_kernel<L, I, S> NAME() noexcept;
#define ULORL_PY_DECLARE_BACKWARD_(NAME, L, I, S, D) ::ulorl::logits_backward_kernel<L, I, S, D, L> NAME() noexcept;
ULORL_PY_LOGITS_FORWARD_KERNELS(ULORL_PY_DECLARE_FORWARD_)
ULORL_PY_LOGITS_BACKWARD_KERNELS(ULORL_PY_DECLARE_BACKWARD_)
