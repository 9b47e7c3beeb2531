// ulorl/adapters/torch/ops_cuda.hpp — the CUDA kernels of the `ulorl` operators (ops.hpp) that have
// device code in kernels/, for libtorch built with CUDA: `_policy_loss_forward` (ulorl::cuda::
// policy_loss, kernels/ulorl/kernels/policy_loss.cuh), `_logits_statistics_forward` and
// `_logits_statistics_backward` (logits_forward / logits_backward, logits.cuh) and
// `_policy_loss_from_logits_forward` (the three in sequence, every intermediate on the device). The
// tensors' device pointers go to the launchers on torch's current stream, with workspace from
// torch's caching allocator. Host code (C++20, the host compiler; needs libtorch's c10_cuda and the
// CUDA runtime's headers); the device code is the launchers of ulorl/kernels/torch_launch.hpp,
// defined by including ulorl/kernels/torch_launch.cuh in one .cu file of the program.
// register_cuda_ops() sets the kernels that the library's CUDA entries (ops.hpp) call; until then
// those operators take the host path of ops.hpp (run_on_host).
//
// The policy loss on the device: float32 token tensors, each contiguous (a strided one raises naming
// it, with the fix), a bool / uint8 / float32 mask or none, int64 offsets for the packed layout,
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
#pragma once

#include <ATen/ATen.h>
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

//! The policy loss on the device, its errors named for `fn` (policy_loss or a fused loss calling it).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> policy_loss_on_device(
    std::string_view fn, const at::Tensor& log_prob, const at::Tensor& old_log_prob, const at::Tensor& advantages,
    const opt_tensor& mask_, const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& entropy,
    const opt_tensor& offsets_, const opt_tensor& rollout_log_prob, const policy_loss_config& cfg) {
  ulorl::cuda::validate_policy_loss_config(fn, cfg);
  if (cfg.rollout.has_value() || rollout_log_prob.has_value())
    fail(fn, "rollout_log_prob",
         "the in-pass rollout correction runs on the CPU: on CUDA pass rollout_correction's weights as 'weights'");
  if (log_prob.dim() != 1 && log_prob.dim() != 2)
    fail(fn, "log_prob", "has rank " + std::to_string(log_prob.dim()) + " but must be [B, T] or packed [total]");
  const c10::cuda::CUDAGuard guard(log_prob.device());
  cuda::torch_launch::policy_loss_call c;
  const at::Tensor offsets = value_or_undefined(offsets_);
  if (offsets.defined()) {
    if (log_prob.dim() != 1) fail(fn, "log_prob", "must be [total] with offsets (the packed layout)");
    if (offsets.scalar_type() != c10::ScalarType::Long || offsets.dim() != 1 || !offsets.is_contiguous() ||
        offsets.numel() < 1)
      fail(fn, "offsets", "must be a contiguous int64 [B+1] tensor on the device (CUDA kernel)");
    c.rows = offsets.numel() - 1;
    c.cols = log_prob.numel();
    c.offsets = offsets.data_ptr<std::int64_t>();
  } else {
    if (log_prob.dim() != 2) fail(fn, "log_prob", "must be [B, T] without offsets (the padded layout)");
    c.rows = log_prob.size(0);
    c.cols = log_prob.size(1);
    c.row_stride = c.cols;
  }
  if (c.rows == 0) fail(fn, "log_prob", "has no rows (B = 0): every batch function of ulorl rejects an empty batch");
  for (const auto& [name, t] :
       {std::pair<std::string_view, const at::Tensor*>{"old_log_prob", &old_log_prob}, {"advantages", &advantages}})
    if (t->sizes() != log_prob.sizes())
      fail(fn, name,
           "has shape " + th::detail::sizes_str(*t) + " but 'log_prob' has " + th::detail::sizes_str(log_prob));
  c.log_prob = device_tokens(fn, "log_prob", log_prob);
  c.old_log_prob = device_tokens(fn, "old_log_prob", old_log_prob);
  c.advantages = device_tokens(fn, "advantages", advantages);
  c.ref_log_prob = optional_device_tokens(fn, "ref_log_prob", ref_log_prob, log_prob);
  c.weights = optional_device_tokens(fn, "weights", weights, log_prob);
  c.entropy = optional_device_tokens(fn, "entropy", entropy, log_prob);
  if (cfg.kl_coef != 0.0 && c.ref_log_prob == nullptr) fail(fn, "ref_log_prob", "required when kl_coef != 0");
  if (cfg.entropy_coef != 0.0 && c.entropy == nullptr) fail(fn, "entropy", "required when entropy_coef != 0");
  const at::Tensor mask = value_or_undefined(mask_);
  if (mask.defined()) {
    if (mask.sizes() != log_prob.sizes())
      fail(fn, "mask",
           "has shape " + th::detail::sizes_str(mask) + " but 'log_prob' has " + th::detail::sizes_str(log_prob));
    if (!mask.is_contiguous()) fail(fn, "mask", "must be contiguous on CUDA (pass .contiguous())");
    switch (mask.scalar_type()) {
      case c10::ScalarType::Bool:
      case c10::ScalarType::Byte:
        c.mask_kind = cuda::torch_launch::mask_type::bytes;
        break;
      case c10::ScalarType::Float:
        c.mask_kind = cuda::torch_launch::mask_type::float32;
        break;
      default:
        fail(fn, "mask",
             std::string("has dtype ") + c10::toString(mask.scalar_type()) +
                 " but must be bool, uint8 or float32 on CUDA");
    }
    c.mask = mask.data_ptr();
  }
  auto [loss, glp, gent, result] = policy_loss_outputs(fn, log_prob, entropy, cfg);
  c.grad_log_prob = glp.data_ptr<float>();
  c.grad_entropy = has_entropy_grad(cfg, entropy) ? gent.data_ptr<float>() : nullptr;
  c.result = result.data_ptr<double>();
  const auto dev = log_prob.options();
  at::Tensor status = cfg.check_values ? at::empty({1}, dev.dtype(at::kLong)) : at::Tensor();
  c.status = status.defined() ? status.data_ptr<std::int64_t>() : nullptr;
  c.config = &cfg;
  c.stream = c10::cuda::getCurrentCUDAStream(log_prob.device().index()).stream();
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
                     mask);
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
  if (host_fallback.load(std::memory_order_relaxed) &&
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
  if (host_fallback.load(std::memory_order_relaxed) && logits.scalar_type() == c10::ScalarType::Double)
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
  if (host_fallback.load(std::memory_order_relaxed) && logits.scalar_type() == c10::ScalarType::Double)
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
  const fused_tokens tok(labels, old_log_prob, advantages, mask, ref_log_prob, weights, offsets, rollout_log_prob);
  tok.require_device(fn, "logits", logits);
  const policy_loss_config cfg = config_of(fn, config);
  if (host_fallback.load(std::memory_order_relaxed) &&
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

}  // namespace detail

//! Sets the CUDA kernels of `_policy_loss_forward`, `_logits_statistics_forward`,
//! `_logits_statistics_backward` and `_policy_loss_from_logits_forward` in the `ulorl` library (registering the library
//! first when this process has none). Thread-safe and idempotent.
inline void register_cuda_ops() {
  register_ops();
  detail::cuda_policy_loss_forward.kernel.store(&detail::policy_loss_forward_cuda, std::memory_order_release);
  detail::cuda_logits_statistics_forward.kernel.store(&detail::logits_statistics_forward_cuda,
                                                      std::memory_order_release);
  detail::cuda_logits_statistics_backward.kernel.store(&detail::logits_statistics_backward_cuda,
                                                       std::memory_order_release);
  detail::cuda_logits_loss_forward.kernel.store(&detail::logits_loss_forward_cuda, std::memory_order_release);
}

}  // namespace ops
}  // namespace th

ULORL_NAMESPACE_END
