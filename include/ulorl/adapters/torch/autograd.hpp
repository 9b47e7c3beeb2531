// ulorl/adapters/torch/autograd.hpp — the in-place policy loss from logits as a torch autograd
// function (optional: needs libtorch, CMake target ulorl::torch), and what the operators of ops.hpp
// share with it (dtype dispatch, the byte mask, the once-differentiable gradient, the fused paths'
// kernel calls on views of the tensors, tensor_views.hpp):
//   policy_loss_from_logits with `in_place`: the [N, V] gradient is computed in the forward pass
//       into the logits' own memory (an autograd function, not an operator: it writes its input);
//   logits_loss_into / head_loss_into: the fused losses from logits, resp. from hidden states
//       (chunked: never the [N, V] logits; its GEMMs go to libtorch, at::mm_out, OpenBLAS/MKL,
//       through torch_gemm), with the gradients written into given tensors: the CPU kernels of the
//       operators policy_loss_from_logits and linear_head_policy_loss (ops.hpp).
// CPU tensors run the CPU kernels on torch's intra-op pool (torch_executor). Bad input raises
// ulorl::error (function, argument, index, value) before any output exists. Backward runs once per
// forward: the saved gradients are handed to autograd without a copy (retain_graph is not
// supported: a second backward raises ulorl::error). Every function is differentiable once: a
// gradient taken with create_graph=True is returned as usual, and differentiating it raises
// ulorl::error naming the function (no silent zero).
#pragma once

#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/variable.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ulorl/adapters/torch/tensor_views.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/logits/backward.hpp"
#include "ulorl/logits/forward.hpp"
#include "ulorl/logits/fused_loss.hpp"
#include "ulorl/logits/linear_head.hpp"
#include "ulorl/loss/policy_loss.hpp"

ULORL_NAMESPACE_BEGIN

namespace th {

//! Optional per-token tensors of the policy losses, in the layout of log_prob / old_log_prob.
struct policy_loss_tensors {
  at::Tensor ref_log_prob{};  //!< required when kl_coef != 0 (treated as a constant)
  at::Tensor weights{};       //!< rollout-correction weights (treated as a constant); absent: 1
  at::Tensor entropy{};       //!< required when entropy_coef != 0; policy_loss differentiates it
  //! Packed layout: offsets[B+1] (int32 or int64) and 1-D [total] token tensors. Undefined: the
  //! padded layout, [B, T] token tensors.
  at::Tensor offsets{};
  //! The inference engine's log-probs: required with cfg.rollout (the rollout correction inside the
  //! loss pass, policy_loss_config::rollout; its statistics in result.rollout), rejected without it.
  at::Tensor rollout_log_prob{};
};

//! What the policy losses return. `loss` is a 0-dim tensor of the token dtype with a grad_fn;
//! `result` holds its parts and the metrics (loss_metrics: clip fractions, approx KL, ratios, ...).
//! The fused paths also return the per-token log_prob and (with an entropy term) entropy they
//! computed, detached, in the token layout.
struct policy_loss_output {
  at::Tensor loss;
  policy_loss_result result{};
  at::Tensor log_prob{};
  at::Tensor entropy{};
};

//! Options of policy_loss_from_logits.
struct logits_loss_config {
  policy_loss_tensors extra{};  //!< ref_log_prob, weights, offsets (entropy must stay undefined)
  logits_config logits{};       //!< temperature, check_values, fast_backward
  //! Write d loss / d logits into the logits' own memory instead of a new [N, V] tensor. The
  //! logits' values are gone after the call; their version counter is bumped, so autograd rejects
  //! any other saved use of them ("modified by an inplace operation").
  bool in_place = false;
};

//! Options of linear_head_policy_loss.
struct linear_head_loss_config {
  policy_loss_tensors extra{};  //!< ref_log_prob, weights, offsets (entropy must stay undefined)
  //! temperature, chunk_rows / workspace_budget; the gradient modes are the adapter's (overwrite).
  linear_head_config head{};
};

namespace detail {

using ulorl::detail::fail;

//! Value dtype dispatch on any device (the Meta kernels' too): float32 -> f(float{}), float64 ->
//! f(double{}); an undefined tensor or another dtype is ulorl::error naming `arg`.
template <class F>
decltype(auto) with_value_dtype(std::string_view fn, std::string_view arg, const at::Tensor& t, F&& f) {
  if (!t.defined()) fail(fn, arg, "is an undefined tensor");
  switch (t.scalar_type()) {
    case c10::ScalarType::Float:
      return f(float{});
    case c10::ScalarType::Double:
      return f(double{});
    default:
      fail(fn, arg, std::string("has dtype ") + c10::toString(t.scalar_type()) + " but must be float32 or float64");
  }
}

//! The float32 / float64 dtype of a value tensor (what the Meta kernels allocate).
inline c10::ScalarType value_dtype(std::string_view fn, std::string_view arg, const at::Tensor& t) {
  return with_value_dtype(fn, arg, t, [](auto tag) { return scalar_type_of<decltype(tag)>(); });
}

//! Token dtype dispatch of a CPU tensor: float32 -> f(float{}), float64 -> f(double{}).
template <class F>
decltype(auto) with_token_type(std::string_view fn, std::string_view arg, const at::Tensor& t, F&& f) {
  require_cpu(fn, arg, t, -1);
  return with_value_dtype(fn, arg, t, std::forward<F>(f));
}

//! Logits dtype dispatch: float32, float64, bfloat16 or float16 storage.
template <class F>
decltype(auto) with_logits_type(std::string_view fn, std::string_view arg, const at::Tensor& t, F&& f) {
  require_cpu(fn, arg, t, -1);
  switch (t.scalar_type()) {
    case c10::ScalarType::Float:
      return f(float{});
    case c10::ScalarType::Double:
      return f(double{});
    case c10::ScalarType::BFloat16:
      return f(bf16{});
    case c10::ScalarType::Half:
      return f(f16{});
    default:
      fail(fn, arg,
           std::string("has dtype ") + c10::toString(t.scalar_type()) +
               " but must be float32, float64, bfloat16 or float16");
  }
}

//! A mask's dtype: bool or any integer or floating type (else ulorl::error naming it).
inline void require_mask_dtype(std::string_view fn, std::string_view arg, c10::ScalarType st) {
  if (st != c10::ScalarType::Bool && !c10::isIntegralType(st, false) && !c10::isFloatingType(st))
    fail(fn, arg, std::string("has dtype ") + c10::toString(st) + " but must be bool, an integer or a floating type");
}

//! The mask as a byte tensor: bool and uint8 masks as they are (bool is read as bytes); a mask of
//! the token dtype T, or of any other integer or floating dtype (the frameworks' int64 / int32
//! attention masks), is checked to be 0/1 (the error names the element) and converted to uint8, one
//! byte per token. Other dtypes are read as float64 for the check: no value but 0 and 1 becomes 0 or
//! 1 there. One mask type keeps the policy loss compiled once per token dtype. An undefined mask
//! stays undefined (every token valid: optional_tokens_of makes it an empty view).
template <class T>
at::Tensor byte_mask(std::string_view fn, std::string_view arg, const at::Tensor& m, const offsets_view& off) {
  if (!m.defined()) return m;
  require_cpu(fn, arg, m, -1);
  const auto st = m.scalar_type();
  if (st == c10::ScalarType::Bool || st == c10::ScalarType::Byte) return m;
  if (st == scalar_type_of<T>()) {
    require_binary_mask(fn, arg, tokens_of<const T>(fn, arg, m, off));
  } else {
    require_mask_dtype(fn, arg, st);
    const at::Tensor wide = m.to(c10::ScalarType::Double);
    require_binary_mask(fn, arg, tokens_of<const double>(fn, arg, wide, off));
  }
  return m.to(c10::ScalarType::Byte);
}

//! Label dtype dispatch: int64 or int32, contiguous [N].
template <class F>
decltype(auto) with_label_type(std::string_view fn, std::string_view arg, const at::Tensor& t, F&& f) {
  require_cpu(fn, arg, t, 1);
  switch (t.scalar_type()) {
    case c10::ScalarType::Long:
      return f(span_of<const std::int64_t>(fn, arg, t));
    case c10::ScalarType::Int:
      return f(span_of<const std::int32_t>(fn, arg, t));
    default:
      fail(fn, arg, std::string("has dtype ") + c10::toString(t.scalar_type()) + " but must be int64 or int32");
  }
}

//! Stands in for an absent optional tensor input of an autograd function (libtorch 1.13's
//! Function::apply cannot take undefined tensors); never read.
inline at::Tensor placeholder() { return at::empty({0}); }

//! A new contiguous tensor shaped like the token layout of `like`.
inline at::Tensor new_tokens(const at::Tensor& like, c10::ScalarType dtype) {
  return at::empty(like.sizes(), at::TensorOptions().dtype(dtype).device(at::kCPU));
}

//! The node that differentiating a gradient of ulorl's functions reaches: it raises ulorl::error
//! naming the function and the gradient. The kernels compute their gradients without a graph, so
//! their derivative would otherwise be a silent zero (torch's once_differentiable rule: the error
//! comes at the second differentiation, not at create_graph=True).
struct differentiated_twice : public torch::autograd::Function<differentiated_twice> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& grad, const std::string& fn,
                            const std::string& arg) {
    ctx->saved_data["fn"] = fn;
    ctx->saved_data["arg"] = arg;
    return grad;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list) {
    fail(ctx->saved_data["fn"].toStringRef(), ctx->saved_data["arg"].toStringRef(),
         "is differentiable once: the kernel computes this gradient without an autograd graph, so its derivative "
         "(double backward: a gradient taken with create_graph=True, then differentiated) is not available");
  }
};

//! A gradient returned by a backward: as it is, or where the backward runs with create_graph=True
//! (grad mode on), an alias whose differentiation raises (differentiated_twice).
inline at::Tensor once_differentiable(std::string_view fn, std::string_view arg, const at::Tensor& grad) {
  if (!grad.defined() || !c10::GradMode::is_enabled()) return grad;
  return differentiated_twice::apply(grad.detach().requires_grad_(true), std::string(fn), std::string(arg));
}

//! Takes a saved gradient out of the context (so that autograd can keep it without a copy) and
//! scales it by the incoming 0-dim gradient; differentiable once (once_differentiable).
inline at::Tensor take_scaled(std::string_view fn, torch::autograd::AutogradContext* ctx, const std::string& key,
                              const at::Tensor& grad_out) {
  auto it = ctx->saved_data.find(key);
  if (it == ctx->saved_data.end()) return {};
  if (!it->second.isTensor())
    fail(fn, key,
         "was already handed to autograd by an earlier backward: this function supports one backward per forward "
         "(no retain_graph)");
  at::Tensor g = it->second.toTensor();
  it->second = at::IValue();
  if (!g.defined()) return g;
  // A CPU scalar with data is read (no pass over g when it is 1); any other (a CUDA tensor, or a
  // FakeTensor / functional tensor that torch.compile traces) multiplies without a host read.
  const bool readable = grad_out.is_cpu() && !grad_out.unsafeGetTensorImpl()->is_python_dispatch() &&
                        !at::functionalization::impl::isFunctionalTensor(grad_out);
  if (!readable) {
    g.mul_(grad_out);
  } else if (const double s = grad_out.item<double>(); s != 1.0) {
    g.mul_(s);
  }
  return once_differentiable(fn, key, g);
}

//! Buffers of the fused paths in the token layout of old_log_prob.
template <class T>
struct token_buffers {
  at::Tensor log_prob, entropy, grad_log_prob, grad_entropy, lse;
  logits_loss_buffers<T> views;
};

template <class T>
token_buffers<T> make_token_buffers(std::string_view fn, const at::Tensor& like, const offsets_view& off,
                                    bool with_entropy) {
  token_buffers<T> b;
  const auto dt = scalar_type_of<T>();
  b.log_prob = new_tokens(like, dt);
  b.grad_log_prob = new_tokens(like, dt);
  b.lse = at::empty({like.numel()}, at::TensorOptions().dtype(dt));
  b.views.log_prob = tokens_of<T>(fn, "log_prob", b.log_prob, off);
  b.views.grad_log_prob = tokens_of<T>(fn, "grad_log_prob", b.grad_log_prob, off);
  b.views.lse = vector_of<T>(fn, "lse", b.lse);
  if (with_entropy) {
    b.entropy = new_tokens(like, dt);
    b.grad_entropy = new_tokens(like, dt);
    b.views.entropy = tokens_of<T>(fn, "entropy", b.entropy, off);
    b.views.grad_entropy = tokens_of<T>(fn, "grad_entropy", b.grad_entropy, off);
  }
  return b;
}

//! The token inputs of the fused paths (log_prob and entropy come from the logits / hidden states).
template <class T, class M>
policy_loss_inputs<T, M> fused_inputs(std::string_view fn, const at::Tensor& old_log_prob, const at::Tensor& advantages,
                                      const at::Tensor& mask, const policy_loss_tensors& extra,
                                      const offsets_view& off) {
  if (extra.entropy.defined()) fail(fn, "entropy", "must be undefined: it is computed from the logits");
  policy_loss_inputs<T, M> in;
  in.old_log_prob = tokens_of<const T>(fn, "old_log_prob", old_log_prob, off);
  in.advantages = tokens_of<const T>(fn, "advantages", advantages, off);
  const auto& ref = in.old_log_prob;
  in.mask = optional_tokens_of<const M>(fn, "mask", mask, off, "old_log_prob", ref);
  in.ref_log_prob = optional_tokens_of<const T>(fn, "ref_log_prob", extra.ref_log_prob, off, "old_log_prob", ref);
  in.weights = optional_tokens_of<const T>(fn, "weights", extra.weights, off, "old_log_prob", ref);
  in.rollout_log_prob =
      optional_tokens_of<const T>(fn, "rollout_log_prob", extra.rollout_log_prob, off, "old_log_prob", ref);
  return in;
}

struct fused_args {
  const at::Tensor* labels;
  const at::Tensor* old_log_prob;
  const at::Tensor* advantages;
  const at::Tensor* mask;
  const policy_loss_config* cfg;
  policy_loss_output* out;
};

//! The steps both fused paths share: the token dtype of the inputs, the 0/1 mask as bytes, the
//! labels' index type, the loss inputs and the token output buffers. `run(T{}, labels, inputs,
//! buffers)` calls the fused kernel and sets a->out->result; returns the 0-dim loss.
template <class Options, class Run>
at::Tensor fused_forward(std::string_view fn, const fused_args* a, const Options* opt, Run&& run) {
  const offsets_view off = offsets_of(fn, "offsets", opt->extra.offsets);
  return with_token_type(fn, "old_log_prob", *a->old_log_prob, [&](auto ttag) {
    using T = decltype(ttag);
    const at::Tensor mask = byte_mask<T>(fn, "mask", *a->mask, off);
    return with_label_type(fn, "labels", *a->labels, [&](auto y) {
      const auto in = fused_inputs<T, std::uint8_t>(fn, *a->old_log_prob, *a->advantages, mask, opt->extra, off);
      auto buf = make_token_buffers<T>(fn, *a->old_log_prob, off, a->cfg->entropy_coef != 0.0);
      run(ttag, y, in, buf);
      a->out->log_prob = buf.log_prob;
      a->out->entropy = buf.entropy;
      return at::scalar_tensor(a->out->result.loss, at::TensorOptions().dtype(scalar_type_of<T>()));
    });
  });
}

//! The fused loss from logits with d loss / d logits written into `grad` ([N, V] of the logits'
//! dtype: a new tensor, or the logits themselves); returns the 0-dim loss.
inline at::Tensor logits_loss_into(const at::Tensor& logits, const at::Tensor& grad, const fused_args* a,
                                   const logits_loss_config* opt) {
  constexpr std::string_view fn = "policy_loss_from_logits";
  return fused_forward(fn, a, opt, [&](auto, auto y, const auto& in, auto& buf) {
    with_logits_type(fn, "logits", logits, [&](auto ltag) {
      using L = decltype(ltag);
      a->out->result =
          ulorl::policy_loss_from_logits(matrix_of<const L>(fn, "logits", logits), y, in, buf.views,
                                         matrix_of<L>(fn, "grad_logits", grad), *a->cfg, opt->logits, torch_executor{});
    });
  });
}

//! The in-place form (the gradient overwrites the logits): an autograd function, not an operator,
//! since it writes into its input.
struct logits_loss_function : public torch::autograd::Function<logits_loss_function> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits, const fused_args* a,
                            const logits_loss_config* opt) {
    const at::Tensor loss = logits_loss_into(logits, logits, a, opt);
    torch::autograd::impl::bump_version(logits);
    ctx->saved_data["grad_logits"] = logits;
    return loss;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {take_scaled("policy_loss_from_logits", ctx, "grad_logits", grads[0]), at::Tensor(), at::Tensor()};
  }
};

//! The fused loss from hidden states [N, H], weight [V, H] and bias [V] (undefined: none) with the
//! gradients written into grad_hidden, grad_weight and grad_bias (each of hidden's shape, dtype
//! and device resp. weight's and bias's, or undefined: not computed); returns the 0-dim loss.
inline at::Tensor head_loss_into(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                 const at::Tensor& grad_hidden, const at::Tensor& grad_weight,
                                 const at::Tensor& grad_bias, const fused_args* a, const linear_head_loss_config* opt) {
  constexpr std::string_view fn = "linear_head_policy_loss";
  return fused_forward(fn, a, opt, [&](auto, auto y, const auto& in, auto& buf) {
    with_token_type(fn, "hidden", hidden, [&](auto htag) {
      using H = decltype(htag);
      linear_head_inputs<H> head;
      head.hidden = matrix_of<const H>(fn, "hidden", hidden);
      head.weight = matrix_of<const H>(fn, "weight", weight);
      if (bias.defined()) head.bias = optional_vector_of<const H>(fn, "bias", bias, "weight rows", head.weight.rows());
      linear_head_grads<H> g;
      if (grad_hidden.defined()) g.hidden = matrix_of<H>(fn, "grad_hidden", grad_hidden);
      if (grad_weight.defined()) g.weight = matrix_of<H>(fn, "grad_weight", grad_weight);
      if (grad_bias.defined()) g.bias = vector_of<H>(fn, "grad_bias", grad_bias);
      linear_head_config hcfg = opt->head;
      hcfg.grad_hidden = grad_mode::overwrite;
      hcfg.grad_weight = grad_mode::overwrite;
      const std::size_t ws = linear_head_workspace_bytes<H>(head.hidden.rows(), head.weight.rows(), hcfg);
      at::Tensor workspace = at::empty({static_cast<std::int64_t>(ws)}, at::TensorOptions().dtype(at::kByte));
      a->out->result = ulorl::policy_loss_from_hidden(
          head, y, in, buf.views, g, *a->cfg, hcfg,
          std::span<std::byte>(reinterpret_cast<std::byte*>(workspace.data_ptr()), ws), torch_executor{}, torch_gemm{});
    });
  });
}

}  // namespace detail

}  // namespace th

ULORL_NAMESPACE_END
