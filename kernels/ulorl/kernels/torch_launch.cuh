// ulorl/kernels/torch_launch.cuh — the definitions of torch_launch.hpp's launchers: include it in
// exactly one .cu file of a program that registers the torch operators' CUDA kernels
// (ulorl/adapters/torch/ops_cuda.hpp); it instantiates ulorl::cuda::policy_loss for float32 token
// arrays with no mask, a uint8 mask or a float32 mask, and ulorl::cuda::logits_forward /
// logits_backward for float32, float16 and bfloat16 logits.
#pragma once

#include <cstdint>

#include "ulorl/kernels/logits.cuh"
#include "ulorl/kernels/policy_loss.cuh"
#include "ulorl/kernels/torch_launch.hpp"

ULORL_NAMESPACE_BEGIN
namespace cuda {
namespace torch_launch {

cudaError_t policy_loss(policy_loss_call& c) {
  if (c.config == nullptr) return cudaErrorInvalidValue;
  const token_layout lay = c.offsets != nullptr ? token_layout::packed(c.rows, c.cols, c.offsets)
                                                : token_layout::padded(c.rows, c.cols, c.row_stride);
  policy_loss_outputs out;
  out.grad_log_prob = c.grad_log_prob;
  out.grad_entropy = c.grad_entropy;
  out.result = static_cast<policy_loss_result*>(c.result);
  out.status = c.status;
  const auto run = [&](const auto* mask) {
    using M = std::remove_cv_t<std::remove_pointer_t<decltype(mask)>>;
    policy_loss_inputs<float, M> in;
    in.log_prob = c.log_prob;
    in.old_log_prob = c.old_log_prob;
    in.advantages = c.advantages;
    in.mask = mask;
    in.ref_log_prob = c.ref_log_prob;
    in.weights = c.weights;
    in.entropy = c.entropy;
    return ulorl::cuda::policy_loss(c.workspace, c.workspace_bytes, lay, in, out, *c.config, launch_config{}, c.stream);
  };
  switch (c.mask_kind) {
    case mask_type::none:
      return run(static_cast<const float*>(nullptr));
    case mask_type::bytes:
      return run(static_cast<const std::uint8_t*>(c.mask));
    case mask_type::float32:
      return run(static_cast<const float*>(c.mask));
  }
  return cudaErrorInvalidValue;  // a mask_type value no enumerator names
}

namespace detail {

//! f(T{}) for the logits' element type.
template <class F>
cudaError_t with_logits_type(logits_type type, F&& f) {
  switch (type) {
    case logits_type::float32:
      return f(float{});
    case logits_type::float16:
      return f(__half{});
    case logits_type::bfloat16:
      return f(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;  // a logits_type value no enumerator names
}

inline logits_config config_of(const logits_call& c) {
  logits_config cfg;
  cfg.temperature = c.temperature;
  cfg.bad_label_row = c.bad_label_row;
  return cfg;
}

}  // namespace detail

cudaError_t logits_forward(logits_call& c) {
  return detail::with_logits_type(c.type, [&](auto tag) {
    using T = decltype(tag);
    return ulorl::cuda::logits_forward(c.workspace, c.workspace_bytes, static_cast<const T*>(c.logits), c.rows, c.cols,
                                       c.row_stride, c.labels, c.log_prob, c.entropy, c.lse, detail::config_of(c),
                                       c.stream);
  });
}

cudaError_t logits_backward(const logits_call& c) {
  return detail::with_logits_type(c.type, [&](auto tag) {
    using T = decltype(tag);
    return ulorl::cuda::logits_backward(static_cast<const T*>(c.logits), c.rows, c.cols, c.row_stride, c.labels,
                                        c.saved_lse, c.saved_entropy, c.grad_log_prob, c.grad_entropy,
                                        static_cast<T*>(c.grad), c.grad_row_stride, detail::config_of(c), c.stream);
  });
}

}  // namespace torch_launch
}  // namespace cuda
ULORL_NAMESPACE_END
