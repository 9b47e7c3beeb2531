// ulorl/adapters/torch/ops_cuda.hpp — the CUDA kernel of the `ulorl::_policy_loss_forward`
// operator (ops.hpp), for libtorch built with CUDA: the tensors' device pointers go to
// ulorl::cuda::policy_loss (kernels/ulorl/kernels/policy_loss.cuh) on torch's current stream, with
// its workspace from torch's caching allocator. Host code (C++20, the host compiler; needs
// libtorch's c10_cuda and the CUDA runtime's headers); the device code is the launcher of
// ulorl/kernels/torch_launch.hpp, defined by including ulorl/kernels/torch_launch.cuh in one .cu
// file of the program. register_cuda_ops() sets the kernel that the library's CUDA entry
// (ops.hpp) calls; until then a CUDA tensor is an error naming it.
//
// What runs on the device: float32 token tensors (float64 ones raise ulorl::error naming
// `log_prob`: the CPU kernels take them), each contiguous (a strided one raises naming it, with the
// fix), a bool / uint8 / float32 mask or none, int64 offsets for the packed layout, every
// objective, KL estimator, entropy term and aggregation of the CPU path; the in-pass rollout
// correction (config.rollout) is refused (pass rollout_correction's weights as `weights`). With
// config.check_values (the default) the call reads one int64 status back from the device after the
// launch, so that a NaN / Inf input, a mask value other than 0 / 1 or a bad offsets row raises
// ulorl::error naming the argument and the token, as on the CPU (nothing is written to the
// gradients then); check_values = false launches without any device-to-host synchronisation.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

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

inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> policy_loss_forward_cuda(
    const at::Tensor& log_prob, const at::Tensor& old_log_prob, const at::Tensor& advantages, const opt_tensor& mask_,
    const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& entropy, const opt_tensor& offsets_,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "policy_loss";
  require_policy_loss_device(log_prob, old_log_prob, advantages, mask_, ref_log_prob, weights, entropy, offsets_,
                             rollout_log_prob);
  const policy_loss_config cfg = config_of(fn, config);
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

}  // namespace detail

//! Sets the CUDA kernel of `_policy_loss_forward` in the `ulorl` library (registering the library
//! first when this process has none). Thread-safe and idempotent.
inline void register_cuda_ops() {
  register_ops();
  detail::cuda_policy_loss_forward.store(&detail::policy_loss_forward_cuda, std::memory_order_release);
}

}  // namespace ops
}  // namespace th

ULORL_NAMESPACE_END
