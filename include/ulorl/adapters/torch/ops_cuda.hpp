// ulorl/adapters/torch/ops_cuda.hpp — the CUDA kernels of the `ulorl` operators (ops.hpp) that have
// device code in kernels/, for libtorch built with CUDA: `_policy_loss_forward` (ulorl::cuda::
// policy_loss, kernels/ulorl/kernels/policy_loss.cuh), `_logits_statistics_forward` and
// `_logits_statistics_backward` (logits_forward / logits_backward, logits.cuh),
// `_policy_loss_from_logits_forward` (the three in sequence, every intermediate on the device) and
// `_linear_head_policy_loss_forward` (policy_loss_from_hidden, linear_head.cuh: cuBLAS on torch's
// handle). The tensors' device pointers go to the launchers on torch's current stream, with
// workspace from torch's caching allocator. Host code (C++20, the host compiler; needs libtorch's
// c10_cuda / torch_cuda and the CUDA toolkit's headers); the device code is the launchers of
// ulorl/kernels/torch_launch.hpp, defined by including ulorl/kernels/torch_launch.cuh in one .cu
// file of the program, which links cuBLAS. register_cuda_ops() sets the kernels that the library's
// CUDA entries (ops.hpp) call, and turns the automatic host fallback on; until then a CUDA tensor
// is ulorl::error naming it (set_host_fallback(true): the host path of ops.hpp, run_on_host).
//
// The policy loss on the device: float32 token tensors, each contiguous (a strided one raises naming
// it, with the fix), a bool / uint8 / float32 mask (another integer or floating one is widened to
// float32 on the device) or none, int64 offsets for the packed layout,
// every objective, KL estimator, entropy term and aggregation of the CPU path. float64 tensors and
// the in-pass rollout correction (config.rollout) take the host path (ops.hpp's run_on_host; with
// the host fallback off, ulorl::error naming `log_prob` resp. `rollout_log_prob`). With
// config.check_values (the default) the call reads one int64 status back from the device after the
// launch, so that a NaN / Inf input, a mask value other than 0 / 1 or a bad offsets row raises
// ulorl::error naming the argument and the token, as on the CPU (nothing is written to the
// gradients then); check_values = false launches without any device-to-host synchronisation.
//
// The logits on the device: float32, float16 or bfloat16 [N, V] with consecutive columns (any row
// stride; float64 logits take the host path), int64 or int32 labels; statistics in float32 (the CPU accumulates in float64), returned in
// the logits' dtype as on the CPU; `fast_backward` has no effect (the device backward is one pass in
// float32). With check_values one more synchronisation reads back the first out-of-range label and
// whether a statistic is NaN, and then the CPU kernel runs on copies to raise the CPU's error;
// without, an out-of-range label makes its row NaN (its gradient row 0) and nothing is read back.
//
// The linear head on the device: hidden [N, H] and weight [V, H], both float32 or both bfloat16,
// dense row-major; token tensors as the policy loss's; no bias (a bias, float16 / float64 states and
// the in-pass rollout correction take the host path). Every GEMM accumulates in float32 (with float32
// states, torch's allow_tf32 setting of its cuBLAS handle decides on TF32); grad_weight is summed in
// float32 and returned in the weight's dtype; log_prob and entropy are float32. With the checks on,
// one synchronisation reads back the loss's status and the first out-of-range label; a bad one runs
// the CPU kernel on copies to raise the CPU's error.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "ulorl/adapters/torch/ops.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/kernels/policy_loss_config.hpp"
#include "ulorl/kernels/torch_launch.hpp"
#include "ulorl/loss/fields.hpp"

ULORL_NAMESPACE_BEGIN

namespace th {
namespace ops {
namespace detail {

//! A token tensor the device kernel reads in place: float32 and contiguous (the kernel takes one
//! layout for every array). `t` is defined.
inline const float* device_tokens(std::string_view fn, std::string_view arg, const at::Tensor& t) {
  if (t.scalar_type() != c10::ScalarType::Float)
    ulorl::detail::fail(fn, arg,
                        std::string("has dtype ") + c10::toString(t.scalar_type()) +
                            " but the CUDA kernel takes float32 token tensors (float64 ones run on the CPU)");
  if (!t.is_contiguous())
    ulorl::detail::fail(
        fn, arg,
        "has strides " + th::detail::strides_str(t) +
            " but the CUDA kernel reads every token tensor in one contiguous layout (pass .contiguous())");
  return t.data_ptr<float>();
}

inline const float* optional_device_tokens(std::string_view fn, std::string_view arg, const opt_tensor& t,
                                           const at::Tensor& log_prob) {
  if (!t.has_value() || !t->defined()) return nullptr;
  if (t->sizes() != log_prob.sizes())
    ulorl::detail::fail(
        fn, arg, "has shape " + th::detail::sizes_str(*t) + " but 'log_prob' has " + th::detail::sizes_str(log_prob));
  return device_tokens(fn, arg, *t);
}

//! The argument and the reason of a bad token the device's value scan found at flat index `i`
//! (status i + 1): each input's element i is read back (a few scalars; the error path only) and
//! checked as the scan checks it, in the order the CPU names them, in the CPU's message format.
[[noreturn]] inline void fail_bad_token(std::string_view fn, std::int64_t i, const at::Tensor& offsets,
                                        std::int64_t cols,
                                        std::initializer_list<std::pair<std::string_view, const at::Tensor*>> values,
                                        const at::Tensor& mask) {
  std::int64_t row = 0, token = i;
  if (offsets.defined()) {
    const at::Tensor o = offsets.to(at::kCPU);
    while (row + 1 < o.numel() - 1 && o[row + 1].item<std::int64_t>() <= i) ++row;
    token = i - o[row].item<std::int64_t>();
  } else if (cols > 0) {
    row = i / cols, token = i % cols;
  }
  const std::string where = " (row " + std::to_string(row) + ", token " + std::to_string(token) + ")";
  for (const auto& [name, t] : values) {
    if (!t->defined()) continue;
    const double v = t->reshape({-1})[i].item<double>();
    if (!std::isfinite(v)) ulorl::detail::fail_at(fn, name, i, v, "must be finite" + where);
  }
  if (mask.defined()) {
    const double m = mask.reshape({-1})[i].to(at::kDouble).item<double>();
    if (m != 0.0 && m != 1.0) ulorl::detail::fail_at(fn, "mask", i, m, "mask values must be 0 or 1" + where);
  }
  ulorl::detail::fail(fn, "log_prob", "the device's value scan rejected token " + std::to_string(i) + where);
}

//! A device loss call's token inputs, checked as the CPU checks them: the layout of `tokens` (its
//! name `tokens_name`: log_prob, or old_log_prob for the fused losses, which compute the log-probs and
//! entropies themselves: `fused`), the token arrays and the mask. The tensors stay the caller's; a
//! mask of another integer or floating dtype than the kernel reads is widened to float32 into
//! `widened_mask` (the device's 0/1 check then sees its values: only 0 and 1 become 0 and 1).
inline cuda::torch_launch::policy_loss_call device_loss_call(
    std::string_view fn, std::string_view tokens_name, const at::Tensor& tokens, bool fused,
    const at::Tensor& old_log_prob, const at::Tensor& advantages, const opt_tensor& mask_,
    const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& entropy, const at::Tensor& offsets,
    const opt_tensor& rollout_log_prob, const policy_loss_config& cfg, at::Tensor& widened_mask) {
  ulorl::cuda::validate_policy_loss_config(fn, cfg);
  if (cfg.rollout.has_value() || rollout_log_prob.has_value())
    fail(fn, "rollout_log_prob",
         "the in-pass rollout correction runs on the CPU: on CUDA pass rollout_correction's weights as 'weights'");
  const std::string tn(tokens_name);
  if (tokens.dim() != 1 && tokens.dim() != 2)
    fail(fn, tn, "has rank " + std::to_string(tokens.dim()) + " but must be [B, T] or packed [total]");
  cuda::torch_launch::policy_loss_call c;
  if (offsets.defined()) {
    if (tokens.dim() != 1) fail(fn, tn, "must be [total] with offsets (the packed layout)");
    if (offsets.scalar_type() != c10::ScalarType::Long || offsets.dim() != 1 || !offsets.is_contiguous() ||
        offsets.numel() < 1)
      fail(fn, "offsets", "must be a contiguous int64 [B+1] tensor on the device (CUDA kernel)");
    c.rows = offsets.numel() - 1;
    c.cols = tokens.numel();
    c.offsets = offsets.data_ptr<std::int64_t>();
  } else {
    if (tokens.dim() != 2) fail(fn, tn, "must be [B, T] without offsets (the padded layout)");
    c.rows = tokens.size(0);
    c.cols = tokens.size(1);
    c.row_stride = c.cols;
  }
  if (c.rows == 0) fail(fn, tn, "has no rows (B = 0): every batch function of ulorl rejects an empty batch");
  for (const auto& [name, t] :
       {std::pair<std::string_view, const at::Tensor*>{"old_log_prob", &old_log_prob}, {"advantages", &advantages}})
    if (t->sizes() != tokens.sizes())
      fail(fn, name,
           "has shape " + th::detail::sizes_str(*t) + " but '" + tn + "' has " + th::detail::sizes_str(tokens));
  if (!fused) c.log_prob = device_tokens(fn, tn, tokens);
  c.old_log_prob = device_tokens(fn, "old_log_prob", old_log_prob);
  c.advantages = device_tokens(fn, "advantages", advantages);
  c.ref_log_prob = optional_device_tokens(fn, "ref_log_prob", ref_log_prob, tokens);
  c.weights = optional_device_tokens(fn, "weights", weights, tokens);
  if (!fused) c.entropy = optional_device_tokens(fn, "entropy", entropy, tokens);
  if (cfg.kl_coef != 0.0 && c.ref_log_prob == nullptr) fail(fn, "ref_log_prob", "required when kl_coef != 0");
  if (!fused && cfg.entropy_coef != 0.0 && c.entropy == nullptr) fail(fn, "entropy", "required when entropy_coef != 0");
  at::Tensor mask = value_or_undefined(mask_);
  if (mask.defined()) {
    if (mask.sizes() != tokens.sizes())
      fail(fn, "mask",
           "has shape " + th::detail::sizes_str(mask) + " but '" + tn + "' has " + th::detail::sizes_str(tokens));
    const c10::ScalarType st = mask.scalar_type();
    if (st != c10::ScalarType::Bool && st != c10::ScalarType::Byte && st != c10::ScalarType::Float) {
      th::detail::require_mask_dtype(fn, "mask", st);
      widened_mask = mask.to(at::kFloat).contiguous();
      mask = widened_mask;
    }
    if (!mask.is_contiguous()) fail(fn, "mask", "must be contiguous on CUDA (pass .contiguous())");
    c.mask_kind = mask.scalar_type() == c10::ScalarType::Float ? cuda::torch_launch::mask_type::float32
                                                               : cuda::torch_launch::mask_type::bytes;
    c.mask = mask.data_ptr();
  }
  c.config = &cfg;
  c.stream = c10::cuda::getCurrentCUDAStream(tokens.device().index()).stream();
  return c;
}

//! The policy loss on the device, its errors named for `fn` (policy_loss or a fused loss calling it).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> policy_loss_on_device(
    std::string_view fn, const at::Tensor& log_prob, const at::Tensor& old_log_prob, const at::Tensor& advantages,
    const opt_tensor& mask_, const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& entropy,
    const opt_tensor& offsets_, const opt_tensor& rollout_log_prob, const policy_loss_config& cfg) {
  const c10::cuda::CUDAGuard guard(log_prob.device());
  const at::Tensor offsets = value_or_undefined(offsets_);
  at::Tensor widened_mask;
  cuda::torch_launch::policy_loss_call c =
      device_loss_call(fn, "log_prob", log_prob, false, old_log_prob, advantages, mask_, ref_log_prob, weights, entropy,
                       offsets, rollout_log_prob, cfg, widened_mask);
  auto [loss, glp, gent, result] = policy_loss_outputs(fn, log_prob, entropy, cfg);
  c.grad_log_prob = glp.data_ptr<float>();
  c.grad_entropy = has_entropy_grad(cfg, entropy) ? gent.data_ptr<float>() : nullptr;
  c.result = result.data_ptr<double>();
  const auto dev = log_prob.options();
  at::Tensor status = cfg.check_values ? at::empty({1}, dev.dtype(at::kLong)) : at::Tensor();
  c.status = status.defined() ? status.data_ptr<std::int64_t>() : nullptr;
  const auto check = [&](cudaError_t e, std::string_view what) {
    if (e != cudaSuccess)
      fail(fn, "log_prob", std::string("CUDA kernel ") + std::string(what) + ": " + cudaGetErrorString(e));
  };
  check(cuda::torch_launch::policy_loss(c), "workspace query");
  at::Tensor workspace = at::empty({static_cast<std::int64_t>(c.workspace_bytes)}, dev.dtype(at::kByte));
  c.workspace = workspace.data_ptr();
  check(cuda::torch_launch::policy_loss(c), "launch");
  if (status.defined()) {
    const std::int64_t s = status.item<std::int64_t>();  // the one synchronisation of a checked call
    if (s > 0) {
      // The scan reads the reference only with a KL term and the entropies only with an entropy term.
      const at::Tensor ref = cfg.kl_coef != 0.0 ? value_or_undefined(ref_log_prob) : at::Tensor();
      const at::Tensor ent = cfg.entropy_coef != 0.0 ? value_or_undefined(entropy) : at::Tensor();
      const at::Tensor w = value_or_undefined(weights);
      fail_bad_token(fn, s - 1, offsets, c.cols,
                     {{"log_prob", &log_prob},
                      {"old_log_prob", &old_log_prob},
                      {"advantages", &advantages},
                      {"ref_log_prob", &ref},
                      {"weights", &w},
                      {"entropy", &ent}},
                     value_or_undefined(mask_));
    }
    if (s < 0)
      ulorl::detail::fail_value(fn, "offsets", -s - 1,
                                "is the first row whose offsets are not within [0, total] or decrease");
  }
  loss.copy_(result.select(0, 0));  // result[0] is the loss (its visit_fields table), rounded to float32
  return std::make_tuple(loss, glp, gent, result);
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> policy_loss_forward_cuda(
    const at::Tensor& log_prob, const at::Tensor& old_log_prob, const at::Tensor& advantages, const opt_tensor& mask,
    const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& entropy, const opt_tensor& offsets,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "policy_loss";
  require_policy_loss_device(log_prob, old_log_prob, advantages, mask, ref_log_prob, weights, entropy, offsets,
                             rollout_log_prob);
  const policy_loss_config cfg = config_of(fn, config);
  // What the device kernel does not take runs on the host with the fallback on (else its error).
  if (host_fallback_on() &&
      (log_prob.scalar_type() == c10::ScalarType::Double || cfg.rollout.has_value() || rollout_log_prob.has_value()))
    return call_on_host<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>>(
        "ulorl::_policy_loss_forward", log_prob, old_log_prob, advantages, mask, ref_log_prob, weights, entropy,
        offsets, rollout_log_prob, config);
  return policy_loss_on_device(fn, log_prob, old_log_prob, advantages, mask, ref_log_prob, weights, entropy, offsets,
                               rollout_log_prob, cfg);
}

// ---- logits: statistics, their backward, the loss from logits --------------------------------------------

//! A launcher's error as ulorl::error naming `arg`.
inline void check_launch(std::string_view fn, std::string_view arg, cudaError_t e, std::string_view what) {
  if (e != cudaSuccess) fail(fn, arg, std::string("CUDA kernel ") + std::string(what) + ": " + cudaGetErrorString(e));
}

//! The logits and labels of a device call: logits [N, V] float32 / float16 / bfloat16 with unit
//! column stride (any row stride), labels int64 [N] (int32 ones widened on the device), the
//! temperature's rule of the CPU kernels. `labels64` keeps the widened labels alive.
inline cuda::torch_launch::logits_call logits_call_of(std::string_view fn, const at::Tensor& logits,
                                                      const at::Tensor& labels, double temperature,
                                                      at::Tensor& labels64) {
  using cuda::torch_launch::logits_type;
  cuda::torch_launch::logits_call c;
  c.rows = logits_rows(fn, logits);
  c.cols = logits.size(1);
  switch (logits.scalar_type()) {
    case c10::ScalarType::Float:
      c.type = logits_type::float32;
      break;
    case c10::ScalarType::Half:
      c.type = logits_type::float16;
      break;
    case c10::ScalarType::BFloat16:
      c.type = logits_type::bfloat16;
      break;
    default:
      fail(fn, "logits",
           std::string("has dtype ") + c10::toString(logits.scalar_type()) +
               " but the CUDA kernels take float32, float16 or bfloat16 logits (float64 ones run on the CPU)");
  }
  if (c.rows > 0 && c.cols == 0) fail(fn, "logits", "has V = 0 columns: no vocabulary");
  if (c.cols > 1 && logits.stride(1) != 1)
    fail(fn, "logits",
         "has strides " + th::detail::strides_str(logits) +
             " but the CUDA kernels read rows of consecutive logits (pass .contiguous())");
  c.row_stride = c.rows > 1 ? logits.stride(0) : c.cols;
  if (labels.dim() != 1 || labels.size(0) != c.rows)
    fail(fn, "labels",
         "has shape " + th::detail::sizes_str(labels) + " but must be [" + std::to_string(c.rows) +
             "] (one label per row of 'logits')");
  if (labels.scalar_type() != c10::ScalarType::Long && labels.scalar_type() != c10::ScalarType::Int)
    fail(fn, "labels", std::string("has dtype ") + c10::toString(labels.scalar_type()) + " but must be int64 or int32");
  ulorl::require_divisor<float>(fn, "temperature", temperature);
  labels64 = labels.to(at::kLong).contiguous();
  c.logits = logits.data_ptr();
  c.labels = labels64.data_ptr<std::int64_t>();
  c.temperature = static_cast<float>(temperature);
  c.stream = c10::cuda::getCurrentCUDAStream(logits.device().index()).stream();
  return c;
}

//! The float32 statistics of the device's forward pass.
struct device_statistics {
  at::Tensor log_prob, entropy, lse;
};

//! The logits statistics on the device. With check_values, one synchronisation reads back the first
//! out-of-range label and whether a statistic is NaN; then the CPU kernel runs on copies to raise
//! its own error (a label, a NaN / +inf logit, a row beyond the float range: the CPU's message).
inline device_statistics logits_statistics_on_device(std::string_view fn, const at::Tensor& logits,
                                                     const at::Tensor& labels, double temperature, bool check_values) {
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor labels64;
  cuda::torch_launch::logits_call c = logits_call_of(fn, logits, labels, temperature, labels64);
  const auto f = logits.options().dtype(at::kFloat);
  device_statistics out{at::empty({c.rows}, f), at::empty({c.rows}, f), at::empty({c.rows}, f)};
  const at::Tensor bad = check_values ? at::zeros({1}, logits.options().dtype(at::kInt)) : at::Tensor();
  c.log_prob = out.log_prob.data_ptr<float>();
  c.entropy = out.entropy.data_ptr<float>();
  c.lse = out.lse.data_ptr<float>();
  c.bad_label_row = bad.defined() ? bad.data_ptr<int>() : nullptr;
  check_launch(fn, "logits", cuda::torch_launch::logits_forward(c), "workspace query");
  // At least one byte: a null workspace asks for its size again instead of launching.
  const at::Tensor workspace =
      at::empty({static_cast<std::int64_t>(std::max<std::size_t>(c.workspace_bytes, 16))}, f.dtype(at::kByte));
  c.workspace = workspace.data_ptr();
  check_launch(fn, "logits", cuda::torch_launch::logits_forward(c), "launch");
  if (check_values && c.rows > 0) {
    const at::Tensor nan = at::logical_or(at::isnan(out.log_prob), at::isnan(out.entropy)).any().to(at::kInt);
    const at::Tensor status = at::cat({bad, nan.reshape({1})}).cpu();  // the one synchronisation
    const std::int32_t* st = status.data_ptr<std::int32_t>();
    if (st[0] != 0 || st[1] != 0) {
      logits_statistics_forward_cpu(logits.cpu(), labels.cpu(), temperature, true, false);  // raises the CPU's error
      if (st[0] != 0)
        ulorl::detail::fail_value(fn, "labels", static_cast<std::int64_t>(st[0]) - 1,
                                  "is the first row whose label is outside [0, V)");
      fail(fn, "logits", "the device's statistics are NaN in a row the CPU kernel accepts");
    }
  }
  return out;
}

//! d loss / d logits on the device into `grad` (a new tensor of the logits' shape and dtype), from the
//! forward's float32 lse and entropy and float32 [N] gradients of the statistics (grad_entropy may
//! be undefined: no entropy term).
inline void logits_backward_on_device(std::string_view fn, const at::Tensor& logits, const at::Tensor& labels,
                                      const at::Tensor& lse, const at::Tensor& entropy, const at::Tensor& grad_log_prob,
                                      const at::Tensor& grad_entropy, double temperature, const at::Tensor& grad) {
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor labels64;
  cuda::torch_launch::logits_call c = logits_call_of(fn, logits, labels, temperature, labels64);
  const auto rows_of = [&](std::string_view arg, const at::Tensor& t) {
    if (t.numel() != c.rows)
      fail(fn, arg, "has shape " + th::detail::sizes_str(t) + " but must have one value per row of 'logits'");
    return t.to(at::kFloat).contiguous();
  };
  const at::Tensor lse32 = rows_of("lse", lse), glp = rows_of("grad_log_prob", grad_log_prob);
  const at::Tensor ent32 = grad_entropy.defined() ? rows_of("entropy", entropy) : at::Tensor();
  const at::Tensor gent = grad_entropy.defined() ? rows_of("grad_entropy", grad_entropy) : at::Tensor();
  c.saved_lse = lse32.data_ptr<float>();
  c.saved_entropy = ent32.defined() ? ent32.data_ptr<float>() : nullptr;
  c.grad_log_prob = glp.data_ptr<float>();
  c.grad_entropy = gent.defined() ? gent.data_ptr<float>() : nullptr;
  c.grad = grad.data_ptr();
  c.grad_row_stride = c.cols;
  check_launch(fn, "logits", cuda::torch_launch::logits_backward(c), "launch");
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logits_statistics_forward_cuda(
    const at::Tensor& logits, const at::Tensor& labels, double temperature, bool check_values, bool fast_backward) {
  constexpr std::string_view fn = "logits_statistics";
  th::detail::require_same_device(fn, "logits", logits, {{"labels", &labels}});
  if (host_fallback_on() && logits.scalar_type() == c10::ScalarType::Double)
    return call_on_host<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>>(
        "ulorl::_logits_statistics_forward", logits, labels, temperature, check_values, fast_backward);
  const device_statistics d = logits_statistics_on_device(fn, logits, labels, temperature, check_values);
  const auto st = stats_dtype(fn, logits);
  // st is float32 or 16-bit here (float64 takes the host path), so entropy_f64 is a tensor of its own.
  return {d.log_prob.to(st), d.entropy.to(st), d.lse.to(at::kDouble), d.entropy.to(at::kDouble)};
}

inline at::Tensor logits_statistics_backward_cuda(const at::Tensor& logits, const at::Tensor& labels,
                                                  const at::Tensor& lse, const at::Tensor& ent,
                                                  const opt_tensor& grad_log_prob, const opt_tensor& grad_entropy,
                                                  double temperature, bool fast_backward) {
  constexpr std::string_view fn = "logits_statistics";
  require_backward_device(logits, labels, lse, ent, grad_log_prob, grad_entropy);
  if (host_fallback_on() && logits.scalar_type() == c10::ScalarType::Double)
    return call_on_host<at::Tensor>("ulorl::_logits_statistics_backward", logits, labels, lse, ent, grad_log_prob,
                                    grad_entropy, temperature, fast_backward);
  at::Tensor g_lp = value_or_undefined(grad_log_prob), g_ent = value_or_undefined(grad_entropy);
  at::Tensor out = at::empty(logits.sizes(), logits.options().memory_format(at::MemoryFormat::Contiguous));
  if (!g_lp.defined() && !g_ent.defined()) return out.zero_();
  if (!g_lp.defined()) g_lp = at::zeros({logits.size(0)}, g_ent.options().dtype(at::kFloat));
  logits_backward_on_device(fn, logits, labels, lse, ent, g_lp, g_ent, temperature, out);
  return out;
}

//! policy_loss_from_logits on the device: the statistics, the policy loss of policy_loss_on_device on
//! them (log_prob in old_log_prob's layout), the gradient of the logits from its token gradients.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> logits_loss_forward_cuda(
    const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& old_log_prob, const at::Tensor& advantages,
    const opt_tensor& mask, const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& offsets,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config, double temperature, bool check_values,
    bool fast_backward) {
  constexpr std::string_view fn = "policy_loss_from_logits";
  const fused_tokens tok(fn, "logits", logits, labels, old_log_prob, advantages, mask, ref_log_prob, weights, offsets,
                         rollout_log_prob, config);
  const policy_loss_config& cfg = tok.cfg;
  if (host_fallback_on() &&
      (logits.scalar_type() == c10::ScalarType::Double || old_log_prob.scalar_type() == c10::ScalarType::Double ||
       cfg.rollout.has_value() || rollout_log_prob.has_value()))
    return call_on_host<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>>(
        "ulorl::_policy_loss_from_logits_forward", logits, labels, old_log_prob, advantages, mask, ref_log_prob,
        weights, offsets, rollout_log_prob, config, temperature, check_values, fast_backward);
  if (logits.dim() == 2 && logits.size(0) != old_log_prob.numel())
    fail(fn, "logits",
         "has " + std::to_string(logits.size(0)) + " rows but 'old_log_prob' has " +
             std::to_string(old_log_prob.numel()) + " tokens (one row of logits per token of the layout)");
  const device_statistics d = logits_statistics_on_device(fn, logits, labels, temperature, check_values);
  const at::Tensor lp = d.log_prob.view(old_log_prob.sizes());
  const bool entropy_term = cfg.entropy_coef != 0.0;
  const opt_tensor ent = entropy_term ? opt_tensor(d.entropy.view(old_log_prob.sizes())) : opt_tensor();
  auto [loss, glp, gent, result] = policy_loss_on_device(fn, lp, old_log_prob, advantages, mask, ref_log_prob, weights,
                                                         ent, offsets, rollout_log_prob, cfg);
  const at::Tensor grad = at::empty(logits.sizes(), logits.options().memory_format(at::MemoryFormat::Contiguous));
  logits_backward_on_device(fn, logits, labels, d.lse, d.entropy, glp.reshape({-1}),
                            entropy_term ? gent.reshape({-1}) : at::Tensor(), temperature, grad);
  return {loss, grad, lp, entropy_term ? *ent : at::empty({0}, lp.options()), result};
}

// ---- the linear head ---------------------------------------------------------------------------------

using head_outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

//! A dense row-major matrix the head reads on the device (`cols` columns, those of `cols_of`, when >= 0).
inline void require_device_matrix(std::string_view fn, std::string_view arg, const at::Tensor& t, std::int64_t cols,
                                  std::string_view cols_of) {
  if (t.dim() != 2) fail(fn, arg, "has shape " + th::detail::sizes_str(t) + " but must have rank 2");
  if (!t.is_contiguous())
    fail(fn, arg,
         "has strides " + th::detail::strides_str(t) +
             " but the CUDA kernel reads it row-major and dense (pass .contiguous())");
  if (cols >= 0 && t.size(1) != cols)
    fail(fn, arg,
         "has " + std::to_string(t.size(1)) + " columns but " + std::string(cols_of) + " has " + std::to_string(cols));
}

//! linear_head_policy_loss on the device (ulorl::cuda::policy_loss_from_hidden: cuBLAS GEMMs on
//! torch's handle and stream, the statistics and the policy loss of every token, never the [N, V]
//! logits). float32 or bfloat16 hidden states and weight of one dtype, float32 token tensors, no
//! bias; the rest takes the host path. grad_weight is accumulated in float32 and returned in the
//! weight's dtype. With check_values / config.check_values, one synchronisation reads back the first
//! out-of-range label and the loss's value scan; then the CPU kernel runs on copies to raise its error.
inline head_outputs head_loss_forward_cuda(const at::Tensor& hidden, const at::Tensor& weight, const opt_tensor& bias,
                                           const at::Tensor& labels, const at::Tensor& old_log_prob,
                                           const at::Tensor& advantages, const opt_tensor& mask,
                                           const opt_tensor& ref_log_prob, const opt_tensor& weights,
                                           const opt_tensor& offsets, const opt_tensor& rollout_log_prob,
                                           c10::ArrayRef<double> config, double temperature, bool check_values,
                                           bool fast_backward, std::int64_t chunk_rows, std::int64_t workspace_budget,
                                           std::array<bool, 3> output_mask) {
  constexpr std::string_view fn = "linear_head_policy_loss";
  const at::Tensor b = head_bias(fn, hidden, weight, bias);
  const fused_tokens tok(fn, "hidden", hidden, labels, old_log_prob, advantages, mask, ref_log_prob, weights, offsets,
                         rollout_log_prob, config);
  const policy_loss_config& cfg = tok.cfg;
  (void)head_config_of(fn, temperature, check_values, fast_backward, chunk_rows, workspace_budget);  // its checks
  const c10::ScalarType ht = hidden.scalar_type();
  const bool head_dtype = ht == c10::ScalarType::Float || ht == c10::ScalarType::BFloat16;
  if (host_fallback_on() && (!head_dtype || weight.scalar_type() != ht || b.defined() ||
                             old_log_prob.scalar_type() == c10::ScalarType::Double || cfg.rollout.has_value() ||
                             rollout_log_prob.has_value()))
    return call_on_host<head_outputs>("ulorl::_linear_head_policy_loss_forward", hidden, weight, bias, labels,
                                      old_log_prob, advantages, mask, ref_log_prob, weights, offsets, rollout_log_prob,
                                      config, temperature, check_values, fast_backward, chunk_rows, workspace_budget,
                                      c10::List<bool>({output_mask[0], output_mask[1], output_mask[2]}));
  if (!head_dtype)
    fail(fn, "hidden",
         std::string("has dtype ") + c10::toString(ht) +
             " but the CUDA kernel takes float32 or bfloat16 hidden states (the others run on the CPU)");
  if (weight.scalar_type() != ht)
    fail(fn, "weight",
         std::string("has dtype ") + c10::toString(weight.scalar_type()) + " but 'hidden' has " + c10::toString(ht));
  if (b.defined()) fail(fn, "bias", "the CUDA kernel takes no bias (a head with a bias runs on the CPU)");
  require_device_matrix(fn, "hidden", hidden, -1, "");
  require_device_matrix(fn, "weight", weight, hidden.size(1), "'hidden'");
  const std::int64_t n = hidden.size(0);
  if (n != old_log_prob.numel())
    fail(fn, "hidden",
         "has " + std::to_string(n) + " rows but 'old_log_prob' has " + std::to_string(old_log_prob.numel()) +
             " tokens (one row of hidden states per token of the layout)");
  if (weight.size(0) == 0) fail(fn, "weight", "has V = 0 rows: no vocabulary");
  if (labels.dim() != 1 || labels.size(0) != n)
    fail(fn, "labels",
         "has shape " + th::detail::sizes_str(labels) + " but must be [" + std::to_string(n) +
             "] (one label per row of 'hidden')");
  if (labels.scalar_type() != c10::ScalarType::Long && labels.scalar_type() != c10::ScalarType::Int)
    fail(fn, "labels", std::string("has dtype ") + c10::toString(labels.scalar_type()) + " but must be int64 or int32");
  ulorl::require_divisor<float>(fn, "temperature", temperature);

  const c10::cuda::CUDAGuard guard(hidden.device());
  cuda::torch_launch::head_call h;
  at::Tensor widened_mask;
  h.loss = device_loss_call(fn, "old_log_prob", old_log_prob, true, old_log_prob, advantages, mask, ref_log_prob,
                            weights, opt_tensor(), tok.offsets, rollout_log_prob, cfg, widened_mask);
  const auto f32 = old_log_prob.options().dtype(at::kFloat);
  const bool want_h = output_mask[0], want_w = output_mask[1], entropy_term = cfg.entropy_coef != 0.0;
  const at::Tensor labels64 = labels.to(at::kLong).contiguous();
  const at::Tensor lp = at::empty(old_log_prob.sizes(), f32);
  const at::Tensor ent = entropy_term ? at::empty(old_log_prob.sizes(), f32) : at::empty({0}, f32);
  const at::Tensor gh = want_h ? at::empty(hidden.sizes(), hidden.options()) : at::empty({0}, hidden.options());
  const at::Tensor gw = want_w ? at::empty(weight.sizes(), f32) : at::Tensor();
  const at::Tensor result = result_tensor(old_log_prob);
  const at::Tensor status = cfg.check_values ? at::zeros({1}, f32.dtype(at::kLong)) : at::Tensor();
  const at::Tensor bad = check_values ? at::zeros({1}, f32.dtype(at::kInt)) : at::Tensor();
  h.tokens = n;
  h.hidden_size = hidden.size(1);
  h.vocab = weight.size(0);
  h.hidden = hidden.data_ptr();
  h.weight = weight.data_ptr();
  h.type =
      ht == c10::ScalarType::Float ? cuda::torch_launch::head_type::float32 : cuda::torch_launch::head_type::bfloat16;
  h.labels = labels64.data_ptr<std::int64_t>();
  h.temperature = static_cast<float>(temperature);
  h.bad_label_row = bad.defined() ? bad.data_ptr<int>() : nullptr;
  h.grad_hidden = want_h ? gh.data_ptr() : nullptr;
  h.grad_weight = want_w ? gw.data_ptr<float>() : nullptr;
  h.log_prob = lp.data_ptr<float>();
  h.entropy = entropy_term ? ent.data_ptr<float>() : nullptr;
  h.chunk_rows = chunk_rows;
  h.workspace_budget = static_cast<std::size_t>(workspace_budget);
  h.blas = at::cuda::getCurrentCUDABlasHandle();
  h.loss.result = result.data_ptr<double>();
  h.loss.status = status.defined() ? status.data_ptr<std::int64_t>() : nullptr;
  check_launch(fn, "hidden", cuda::torch_launch::linear_head(h), "workspace query");
  const at::Tensor workspace =
      at::empty({static_cast<std::int64_t>(std::max<std::size_t>(h.loss.workspace_bytes, 256))}, f32.dtype(at::kByte));
  h.loss.workspace = workspace.data_ptr();
  check_launch(fn, "hidden", cuda::torch_launch::linear_head(h), "launch");
  if (status.defined() || bad.defined()) {
    const at::Tensor none = at::zeros({1}, f32.dtype(at::kLong));
    const at::Tensor flags = at::cat({status.defined() ? status : none, bad.defined() ? bad.to(at::kLong) : none})
                                 .cpu();  // the one synchronisation of a checked call
    const std::int64_t s = flags[0].item<std::int64_t>(), label_row = flags[1].item<std::int64_t>();
    if (s != 0 || label_row != 0) {
      // The CPU kernel on copies raises the CPU's error (bfloat16 states widened: it takes float32).
      const auto host = [](const at::Tensor& t) {
        return t.scalar_type() == c10::ScalarType::BFloat16 ? t.cpu().to(at::kFloat) : t.cpu();
      };
      const auto host_opt = [](const opt_tensor& t) { return t.has_value() ? opt_tensor(t->cpu()) : opt_tensor(); };
      (void)head_loss_forward<false>(host(hidden), host(weight), opt_tensor(), labels.cpu(), old_log_prob.cpu(),
                                     advantages.cpu(), host_opt(mask), host_opt(ref_log_prob), host_opt(weights),
                                     host_opt(offsets), opt_tensor(), config, temperature, check_values, fast_backward,
                                     chunk_rows, workspace_budget, {false, false, false});
      if (label_row != 0)
        ulorl::detail::fail_value(fn, "labels", label_row - 1, "is the first token whose label is outside [0, V)");
      if (s < 0)
        ulorl::detail::fail_value(fn, "offsets", -s - 1,
                                  "is the first row whose offsets are not within [0, total] or decrease");
      fail(fn, "hidden",
           "the device's value scan rejected token " + std::to_string(s - 1) +
               " (its log-prob from 'hidden' in float32, or an input), which the CPU kernel accepts");
    }
  }
  const at::Tensor loss = at::empty({}, f32);
  loss.copy_(result.select(0, 0));
  const at::Tensor grad_weight = !want_w                        ? at::empty({0}, hidden.options())
                                 : ht == c10::ScalarType::Float ? gw
                                                                : gw.to(ht);
  return {loss, gh, grad_weight, at::empty({0}, hidden.options()), lp, ent, result};
}

}  // namespace detail

//! Sets the CUDA kernels of `_policy_loss_forward`, `_logits_statistics_forward`,
//! `_logits_statistics_backward`, `_policy_loss_from_logits_forward` and
//! `_linear_head_policy_loss_forward` in the `ulorl` library (registering the library first when this
//! process has none), which turns the automatic host fallback on. Thread-safe and idempotent.
inline void register_cuda_ops() {
  register_ops();
  detail::cuda_policy_loss_forward.kernel.store(&detail::policy_loss_forward_cuda, std::memory_order_release);
  detail::cuda_logits_statistics_forward.kernel.store(&detail::logits_statistics_forward_cuda,
                                                      std::memory_order_release);
  detail::cuda_logits_statistics_backward.kernel.store(&detail::logits_statistics_backward_cuda,
                                                       std::memory_order_release);
  detail::cuda_logits_loss_forward.kernel.store(&detail::logits_loss_forward_cuda, std::memory_order_release);
  detail::cuda_head_loss_forward.kernel.store(&detail::head_loss_forward_cuda, std::memory_order_release);
  detail::cuda_kernels_set.store(true, std::memory_order_release);
}

}  // namespace ops
}  // namespace th

ULORL_NAMESPACE_END
