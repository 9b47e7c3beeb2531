// ulorl/kernels/torch_launch.cuh — the definitions of torch_launch.hpp's launchers: include it in
// exactly one .cu file of a program that registers the torch operators' CUDA kernels
// (ulorl/adapters/torch/ops_cuda.hpp); it instantiates ulorl::cuda::policy_loss for float32 token
// arrays with no mask, a uint8 mask or a float32 mask, ulorl::cuda::logits_forward /
// logits_backward for float32, float16 and bfloat16 logits, and ulorl::cuda::policy_loss_from_hidden
// for float32 and bfloat16 hidden states and weights with those token arrays (the program links
// cuBLAS).
#pragma once

#include <cstdint>

#include "ulorl/kernels/linear_head.cuh"
#include "ulorl/kernels/logits.cuh"
#include "ulorl/kernels/policy_loss.cuh"
#include "ulorl/kernels/torch_launch.hpp"

ULORL_NAMESPACE_BEGIN
namespace cuda {
namespace torch_launch {

namespace detail {

inline token_layout layout_of(const policy_loss_call& c) {
  return c.offsets != nullptr ? token_layout::packed(c.rows, c.cols, c.offsets)
                              : token_layout::padded(c.rows, c.cols, c.row_stride);
}

//! f(inputs) with the call's token inputs as policy_loss_inputs<float, M> for its mask's type M.
template <class F>
cudaError_t with_loss_inputs(const policy_loss_call& c, F&& f) {
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
    return f(in);
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

//! The statistics hook of the linear head: copies each token's log-prob and entropy out of the
//! workspace (into the caller's arrays; nullptr: not copied).
struct copy_statistics {
  float* log_prob;
  float* entropy;
  cudaError_t operator()(const device_token_statistics& s, cudaStream_t stream) const noexcept {
    const std::size_t bytes = static_cast<std::size_t>(s.tokens) * sizeof(float);
    if (bytes == 0) return cudaSuccess;
    if (log_prob != nullptr)
      if (cudaError_t e = cudaMemcpyAsync(log_prob, s.log_prob, bytes, cudaMemcpyDeviceToDevice, stream);
          e != cudaSuccess)
        return e;
    if (entropy != nullptr) return cudaMemcpyAsync(entropy, s.entropy, bytes, cudaMemcpyDeviceToDevice, stream);
    return cudaSuccess;
  }
};

}  // namespace detail

cudaError_t policy_loss(policy_loss_call& c) {
  if (c.config == nullptr) return cudaErrorInvalidValue;
  policy_loss_outputs out;
  out.grad_log_prob = c.grad_log_prob;
  out.grad_entropy = c.grad_entropy;
  out.result = static_cast<policy_loss_result*>(c.result);
  out.status = c.status;
  return detail::with_loss_inputs(c, [&](const auto& in) {
    return ulorl::cuda::policy_loss(c.workspace, c.workspace_bytes, detail::layout_of(c), in, out, *c.config,
                                    launch_config{}, c.stream);
  });
}

cudaError_t linear_head(head_call& h) {
  policy_loss_call& c = h.loss;
  if (c.config == nullptr || c.log_prob != nullptr || c.entropy != nullptr) return cudaErrorInvalidValue;
  logits_config lcfg;
  lcfg.temperature = h.temperature;
  lcfg.bad_label_row = h.bad_label_row;
  linear_head_launch_config opt;
  opt.chunk_rows = h.chunk_rows;
  opt.workspace_budget = h.workspace_budget;
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    linear_head_outputs<T> out;
    out.grad_hidden = static_cast<T*>(h.grad_hidden);
    out.grad_weight = h.grad_weight;
    out.result = static_cast<policy_loss_result*>(c.result);
    out.status = c.status;
    return detail::with_loss_inputs(c, [&](const auto& in) {
      return ulorl::cuda::policy_loss_from_hidden(
          c.workspace, c.workspace_bytes, h.blas, static_cast<const T*>(h.hidden), h.tokens, h.hidden_size,
          static_cast<const T*>(h.weight), h.vocab, h.labels, detail::layout_of(c), in, out, *c.config, lcfg, opt,
          c.stream, detail::copy_statistics{h.log_prob, h.entropy});
    });
  };
  switch (h.type) {
    case head_type::float32:
      return run(float{});
    case head_type::bfloat16:
      return run(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;  // a head_type value no enumerator names
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
