// ulorl/adapters/torch/ops.hpp — ulorl's tensor functions as operators of a `ulorl` torch library
// (optional: needs libtorch, CMake target ulorl::torch), one table for libtorch and Python:
//   ulorl::policy_loss(log_prob, old_log_prob, advantages, mask?, ref_log_prob?, weights?, entropy?,
//                      offsets?, rollout_log_prob?, float[] config) -> (loss, result)
//   ulorl::logits_statistics(logits, labels, temperature=1, check_values=True, fast_backward=False)
//                      -> (log_prob, entropy)
//   ulorl::policy_loss_from_logits(logits, labels, old_log_prob, advantages, mask?, ref_log_prob?,
//                      weights?, offsets?, rollout_log_prob?, float[] config, temperature=1,
//                      check_values=True, fast_backward=False) -> (loss, result, log_prob, entropy)
//   ulorl::linear_head_policy_loss(hidden, weight, bias?, labels, old_log_prob, advantages, mask?,
//                      ref_log_prob?, weights?, offsets?, rollout_log_prob?, float[] config,
//                      temperature=1, check_values=True, fast_backward=False, chunk_rows=0,
//                      workspace_budget=256 MiB) -> (loss, result, log_prob, entropy)
//   ulorl::agg_loss(loss_mat, mask?, offsets?, float[] normalizer) -> loss
//   ulorl::kl_penalty(log_prob, ref_log_prob, offsets?, float[] config) -> kl
//   ulorl::weighted_kl_loss(log_prob, ref_log_prob, rollout_log_prob?, mask?, offsets?, float[] config,
//                      float[] normalizer) -> loss   (loss/weighted_kl.hpp: the importance-weighted KL term)
//   ulorl::trl_grpo_loss(per_token_logps, old_per_token_logps, advantages, completion_mask?,
//                      ref_per_token_logps?, sampling_per_token_logps?, entropies?,
//                      importance_sampling_ratio?, float[] config) -> (loss, result)
//                      (presets::trl::grpo_loss: TRL's GRPOTrainer loss, padded [B, T])
// and the non-differentiable primitives they are built of (`_policy_loss_forward`,
// `_logits_statistics_forward`, `_logits_statistics_backward`, `_policy_loss_from_logits_forward`,
// `_linear_head_policy_loss_forward` (its arguments and `bool[3] output_mask`: which of the
// gradients of hidden, weight, bias to compute), `_agg_loss_forward`, `_kl_penalty_forward`,
// `_weighted_kl_loss_forward`, `_trl_grpo_loss_forward`,
// each returning the values and the gradients the autograd kernels keep), and the batch operators
// of ops_batch.hpp (advantages, masks, filters, rollout correction). Kernels per dispatch key:
//   CPU     ulorl's CPU kernels (the installed ISA variants) on torch's intra-op pool;
//   CUDA    the device kernels of the policy loss, the logits statistics (forward and backward),
//           the loss from logits and the linear head once register_cuda_ops() (ops_cuda.hpp) has
//           set them; the other operators (and the dtypes or options the device kernels do not
//           take) run on the CPU on copies of their tensors and return their outputs on the device
//           (run_on_host: a synchronising round trip, warned once; set_host_fallback(false) makes
//           it ulorl::error naming the CUDA tensor). In a program without the device kernels
//           (register_cuda_ops() not called) a CUDA tensor is that error unless
//           set_host_fallback(true). A tensor on another device than the first is named always;
//   Meta    shapes and dtypes only, so FakeTensor and torch.compile trace through the calls;
//   Autograd (the public operators) the exact gradients, computed in the forward pass or by the
//           backward primitive, differentiable once (a double backward raises ulorl::error);
//   CompositeExplicitAutograd (the public operators) the primitive without a graph, for calls
//           under torch.inference_mode and below autograd; the primitives pass autograd by
//           (their outputs never require grad).
// `config` is encode_fields of a policy_loss_config, resp. kl_config, and `normalizer` of an
// agg_normalizer (core/fields.hpp, the tables in loss/fields.hpp), and trl_grpo_loss's of a
// presets::trl::grpo_loss_options; `result` is one float64 tensor [encoded_result_size],
// decode_result's input: the loss parts, the metrics' sums and the rollout correction's
// statistics (trl_grpo_loss: an encoded presets::trl::grpo_loss_result).
//
// register_ops() registers the library once per process (the first caller; the Python module calls
// it at import). If another copy of ulorl in the process (the Python module beside a C++ library)
// registered it first, that registration is used. The th:: functions below call the operators
// through the dispatcher and register them on first use.
#pragma once

#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ulorl/adapters/torch/autograd.hpp"
#include "ulorl/adapters/torch/ops_batch.hpp"
#include "ulorl/adapters/torch/tensor_views.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/logits/backward.hpp"
#include "ulorl/logits/forward.hpp"
#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/fields.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/policy_loss.hpp"
#include "ulorl/loss/weighted_kl.hpp"
#include "ulorl/presets/trl.hpp"

ULORL_NAMESPACE_BEGIN

namespace th {

namespace ops {

using opt_tensor = c10::optional<at::Tensor>;

//! The operators' schemas, in registration order (the public ones last). The public operators take
//! the primitives' arguments, so one argument list serves both.
inline constexpr std::string_view policy_loss_args =
    "(Tensor log_prob, Tensor old_log_prob, Tensor advantages, Tensor? mask, Tensor? ref_log_prob, Tensor? weights, "
    "Tensor? entropy, Tensor? offsets, Tensor? rollout_log_prob, float[] config)";
//! The logits options as schema arguments, with logits_config's defaults.
inline std::string logits_params() {
  const logits_config d{};
  const auto flag = [](bool v) { return v ? "True" : "False"; };
  std::array<char, 32> t{};
  std::snprintf(t.data(), t.size(), "%.17g", d.temperature);
  std::string temperature = t.data();
  if (temperature.find_first_of(".en") == std::string::npos) temperature += ".0";  // a float literal
  return "float temperature=" + temperature + ", bool check_values=" + flag(d.check_values) +
         ", bool fast_backward=" + flag(d.fast_backward);
}
inline std::string logits_statistics_args() { return "(Tensor logits, Tensor labels, " + logits_params() + ")"; }
inline std::string logits_loss_args() {
  return "(Tensor logits, Tensor labels, Tensor old_log_prob, Tensor advantages, Tensor? mask, Tensor? ref_log_prob, "
         "Tensor? weights, Tensor? offsets, Tensor? rollout_log_prob, float[] config, " +
         logits_params() + ")";
}
//! The linear head's arguments without the parentheses (the primitive appends its output_mask); the
//! chunking defaults are linear_head_config's.
inline std::string head_loss_params() {
  const linear_head_config d{};
  return "Tensor hidden, Tensor weight, Tensor? bias, Tensor labels, Tensor old_log_prob, Tensor advantages, "
         "Tensor? mask, Tensor? ref_log_prob, Tensor? weights, Tensor? offsets, Tensor? rollout_log_prob, "
         "float[] config, " +
         logits_params() + ", int chunk_rows=" + std::to_string(d.chunk_rows) +
         ", int workspace_budget=" + std::to_string(d.workspace_budget);
}
inline constexpr std::string_view agg_loss_args =
    "(Tensor loss_mat, Tensor? mask, Tensor? offsets, float[] normalizer)";
inline constexpr std::string_view kl_penalty_args =
    "(Tensor log_prob, Tensor ref_log_prob, Tensor? offsets, float[] config)";
inline constexpr std::string_view weighted_kl_loss_args =
    "(Tensor log_prob, Tensor ref_log_prob, Tensor? rollout_log_prob, Tensor? mask, Tensor? offsets, float[] config, "
    "float[] normalizer)";
inline constexpr std::string_view trl_grpo_loss_args =
    "(Tensor per_token_logps, Tensor old_per_token_logps, Tensor advantages, Tensor? completion_mask, "
    "Tensor? ref_per_token_logps, Tensor? sampling_per_token_logps, Tensor? entropies, "
    "Tensor? importance_sampling_ratio, float[] config)";

[[nodiscard]] inline std::vector<std::string> schemas() {
  const auto s = [](std::string_view name, std::string_view args, std::string_view ret) {
    return std::string(name) + std::string(args) + " -> " + std::string(ret);
  };
  return {
      s("_policy_loss_forward", policy_loss_args,
        "(Tensor loss, Tensor grad_log_prob, Tensor grad_entropy, Tensor result)"),
      s("policy_loss", policy_loss_args, "(Tensor loss, Tensor result)"),
      s("_logits_statistics_forward", logits_statistics_args(),
        "(Tensor log_prob, Tensor entropy, Tensor lse, Tensor entropy_f64)"),
      "_logits_statistics_backward(Tensor logits, Tensor labels, Tensor lse, Tensor entropy_f64, Tensor? "
      "grad_log_prob, "
      "Tensor? grad_entropy, float temperature, bool fast_backward) -> Tensor",
      s("logits_statistics", logits_statistics_args(), "(Tensor log_prob, Tensor entropy)"),
      s("_policy_loss_from_logits_forward", logits_loss_args(),
        "(Tensor loss, Tensor grad_logits, Tensor log_prob, Tensor entropy, Tensor result)"),
      s("policy_loss_from_logits", logits_loss_args(), "(Tensor loss, Tensor result, Tensor log_prob, Tensor entropy)"),
      s("_linear_head_policy_loss_forward", "(" + head_loss_params() + ", bool[3] output_mask=[True, True, True])",
        "(Tensor loss, Tensor grad_hidden, Tensor grad_weight, Tensor grad_bias, Tensor log_prob, Tensor entropy, "
        "Tensor result)"),
      s("linear_head_policy_loss", "(" + head_loss_params() + ")",
        "(Tensor loss, Tensor result, Tensor log_prob, Tensor entropy)"),
      s("_agg_loss_forward", agg_loss_args, "(Tensor loss, Tensor grad)"),
      s("agg_loss", agg_loss_args, "Tensor"),
      s("_kl_penalty_forward", kl_penalty_args, "(Tensor kl, Tensor grad)"),
      s("kl_penalty", kl_penalty_args, "Tensor"),
      s("_weighted_kl_loss_forward", weighted_kl_loss_args, "(Tensor loss, Tensor grad)"),
      s("weighted_kl_loss", weighted_kl_loss_args, "Tensor"),
      s("_trl_grpo_loss_forward", trl_grpo_loss_args,
        "(Tensor loss, Tensor grad_per_token_logps, Tensor grad_entropies, Tensor result)"),
      s("trl_grpo_loss", trl_grpo_loss_args, "(Tensor loss, Tensor result)")};
}

namespace detail {

using th::detail::byte_mask;
using th::detail::new_tokens;
using th::detail::with_label_type;
using th::detail::with_logits_type;
using th::detail::with_token_type;
using ulorl::detail::fail;

inline at::Tensor value_or_undefined(const opt_tensor& t) { return t.has_value() ? *t : at::Tensor(); }
//! The inverse: an undefined tensor is an absent optional argument.
inline opt_tensor optional(const at::Tensor& t) { return t.defined() ? opt_tensor(t) : opt_tensor(); }

//! The policy loss's tensors, all on log_prob's device (the first check of every kernel).
inline void require_policy_loss_device(const at::Tensor& log_prob, const at::Tensor& old_log_prob,
                                       const at::Tensor& advantages, const opt_tensor& mask,
                                       const opt_tensor& ref_log_prob, const opt_tensor& weights,
                                       const opt_tensor& entropy, const opt_tensor& offsets,
                                       const opt_tensor& rollout_log_prob) {
  const at::Tensor m = value_or_undefined(mask), r = value_or_undefined(ref_log_prob), w = value_or_undefined(weights),
                   e = value_or_undefined(entropy), o = value_or_undefined(offsets),
                   ro = value_or_undefined(rollout_log_prob);
  th::detail::require_same_device("policy_loss", "log_prob", log_prob,
                                  {{"old_log_prob", &old_log_prob},
                                   {"advantages", &advantages},
                                   {"mask", &m},
                                   {"ref_log_prob", &r},
                                   {"weights", &w},
                                   {"entropy", &e},
                                   {"offsets", &o},
                                   {"rollout_log_prob", &ro}});
}

//! The decoded configuration of a call (the error names `config` and the field).
inline policy_loss_config config_of(std::string_view fn, c10::ArrayRef<double> config) {
  return decode_fields<policy_loss_config>(fn, "config", std::span<const double>(config.data(), config.size()));
}

//! The token dtype of log_prob, for the Meta kernels (the CPU kernels check it through the views).
inline c10::ScalarType token_dtype(std::string_view fn, const at::Tensor& t, std::string_view arg = "log_prob") {
  return th::detail::value_dtype(fn, arg, t);
}

inline at::Tensor result_tensor(const at::Tensor& like) {
  return at::empty({static_cast<std::int64_t>(encoded_result_size)}, like.options().dtype(at::kDouble));
}

//! Whether `entropy` receives a gradient: an entropy term and a given entropy tensor.
inline bool has_entropy_grad(const policy_loss_config& cfg, const opt_tensor& entropy) {
  return cfg.entropy_coef != 0.0 && entropy.has_value() && entropy->defined();
}

//! The outputs' shapes and dtypes (the CPU kernel allocates the same; grad_entropy is [0] without
//! an entropy gradient).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> policy_loss_outputs(std::string_view fn,
                                                                                      const at::Tensor& log_prob,
                                                                                      const opt_tensor& entropy,
                                                                                      const policy_loss_config& cfg) {
  const auto opts = log_prob.options().dtype(token_dtype(fn, log_prob));
  // The gradients first, the small outputs after them: the loss, which the caller keeps, then sits
  // above the gradients in glibc's heap, which therefore reuses their pages call after call instead
  // of returning them to the system when autograd frees them (about 25% of a 1M-token call in
  // page faults, measured).
  at::Tensor glp = at::empty(log_prob.sizes(), opts);
  at::Tensor gent = has_entropy_grad(cfg, entropy) ? at::empty(entropy->sizes(), opts) : at::empty({0}, opts);
  at::Tensor loss = at::empty({}, opts);
  return {loss, glp, gent, result_tensor(log_prob)};
}

//! The forward primitive's kernel: CPU (Meta = false) or shapes only (Meta = true).
template <bool Meta>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> policy_loss_forward(
    const at::Tensor& log_prob, const at::Tensor& old_log_prob, const at::Tensor& advantages, const opt_tensor& mask_,
    const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& entropy, const opt_tensor& offsets,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "policy_loss";
  require_policy_loss_device(log_prob, old_log_prob, advantages, mask_, ref_log_prob, weights, entropy, offsets,
                             rollout_log_prob);
  const policy_loss_config cfg = config_of(fn, config);
  if constexpr (Meta) {
    return policy_loss_outputs(fn, log_prob, entropy, cfg);
  } else {
    const offsets_view off = offsets_of(fn, "offsets", value_or_undefined(offsets));
    return with_token_type(fn, "log_prob", log_prob, [&](auto tag) {
      using T = decltype(tag);
      using M = std::uint8_t;
      const at::Tensor mask = byte_mask<T>(fn, "mask", value_or_undefined(mask_), off);
      const auto optional = [&](std::string_view arg, const opt_tensor& t, const token_view<const T>& ref) {
        return optional_tokens_of<const T>(fn, arg, value_or_undefined(t), off, "log_prob", ref);
      };
      policy_loss_inputs<T, M> in;
      in.log_prob = tokens_of<const T>(fn, "log_prob", log_prob, off);
      in.old_log_prob = tokens_of<const T>(fn, "old_log_prob", old_log_prob, off);
      in.advantages = tokens_of<const T>(fn, "advantages", advantages, off);
      in.mask = optional_tokens_of<const M>(fn, "mask", mask, off, "log_prob", in.log_prob);
      in.ref_log_prob = optional("ref_log_prob", ref_log_prob, in.log_prob);
      in.weights = optional("weights", weights, in.log_prob);
      in.rollout_log_prob = optional("rollout_log_prob", rollout_log_prob, in.log_prob);
      in.entropy = optional("entropy", entropy, in.log_prob);
      auto [loss, glp, gent, result] = policy_loss_outputs(fn, log_prob, entropy, cfg);
      const token_view<T> glp_v = tokens_of<T>(fn, "grad_log_prob", glp, off);
      const token_view<T> gent_v =
          has_entropy_grad(cfg, entropy) ? tokens_of<T>(fn, "grad_entropy", gent, off) : token_view<T>();
      const policy_loss_result r = ulorl::policy_loss(in, glp_v, gent_v, cfg, torch_executor{});
      loss.fill_(r.loss);
      encode_result(r, std::span<double>(result.data_ptr<double>(), encoded_result_size));
      return std::make_tuple(loss, glp, gent, result);
    });
  }
}

using policy_loss_forward_sig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const opt_tensor&, const opt_tensor&, const opt_tensor&,
    const opt_tensor&, const opt_tensor&, const opt_tensor&, c10::ArrayRef<double>);

//! The host fallback's setting (set_host_fallback): automatic until a call sets it on or off.
enum class host_fallback_mode : int { automatic, on, off };
inline std::atomic<host_fallback_mode> host_fallback_setting{host_fallback_mode::automatic};
//! Whether register_cuda_ops() (ops_cuda.hpp) has set the device kernels in this program.
inline std::atomic<bool> cuda_kernels_set{false};

//! Whether a CUDA call that no device kernel takes runs on host copies of its tensors (run_on_host)
//! or raises ulorl::error naming the CUDA tensor. Automatic: on in a program with the device kernels
//! (a few operators or dtypes without device code should not stop a CUDA build), off in one without
//! them (a build without CUDA kernels names the CUDA tensor instead of moving every call to the CPU).
[[nodiscard]] inline bool host_fallback_on() {
  switch (host_fallback_setting.load(std::memory_order_relaxed)) {
    case host_fallback_mode::on:
      return true;
    case host_fallback_mode::off:
      return false;
    case host_fallback_mode::automatic:
      return cuda_kernels_set.load(std::memory_order_acquire);
  }
  return false;  // a host_fallback_mode value no enumerator names
}

[[noreturn]] inline void no_cuda_kernel(std::string_view fn, std::string_view arg, const at::Tensor& t,
                                        std::string_view why) {
  fail(fn, arg, "is a CUDA tensor (" + t.device().str() + "): " + std::string(why) + "; move the tensors with .cpu()");
}

//! The operators whose CUDA key always takes the host path (run_on_host): the primitives without a
//! device kernel in kernels/, and the batch operators (the public loss operators reach the
//! primitives through their Autograd and CompositeExplicitAutograd kernels on every device). With
//! device_kernels()' primitives, these are the operators that autograd passes by.
inline std::vector<std::string> host_operators() {
  std::vector<std::string> names = {"_agg_loss_forward", "_kl_penalty_forward", "_weighted_kl_loss_forward",
                                    "_trl_grpo_loss_forward"};
  for (const std::string& s : batch_schemas()) names.push_back(s.substr(0, s.find('(')));
  return names;
}

//! The CUDA key's kernel of an operator on the host: every tensor argument must be on one device
//! (else the second device is named); then, with host_fallback, the operator runs on CPU copies of
//! its tensors and its tensor outputs are copied to that device (a synchronising round trip, warned
//! once per process); without, the first CUDA tensor is named. Public names drop a leading `_` and
//! the primitive's suffix.
inline void run_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  std::string fn = op.schema().name();
  fn = fn.substr(fn.find("::") + 2);
  if (fn.front() == '_') {  // a primitive: the public operator's name
    fn = fn.substr(1);
    fn = fn.substr(0, fn.rfind('_'));
  }
  const std::size_t first = stack->size() - args.size();
  const at::Tensor* ref = nullptr;
  std::string_view ref_name;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    const at::Tensor& t = v.toTensor();
    if (ref && t.device() != ref->device())
      fail(fn, args[i].name(),
           "is on device " + t.device().str() + " but '" + std::string(ref_name) + "' is on " + ref->device().str() +
               " (every tensor of a call must be on one device)");
    if (!ref) ref = &t, ref_name = args[i].name();
  }
  if (!ref) fail(fn, "", "has no CUDA kernel");
  if (!host_fallback_on()) {
    if (host_fallback_setting.load(std::memory_order_relaxed) == host_fallback_mode::automatic)
      no_cuda_kernel(fn, ref_name, *ref,
                     "this program has no CUDA kernels of ulorl (a build without CUDA, or register_cuda_ops() not "
                     "called); set_host_fallback(true) runs such calls on CPU copies of the tensors");
    no_cuda_kernel(fn, ref_name, *ref, fn + " has no CUDA kernel for this call and the host fallback is off");
  }
  TORCH_WARN_ONCE("ulorl: ", fn,
                  " has no CUDA kernel for this call: it runs on the CPU, on copies of its CUDA tensors (the "
                  "call waits for the device); set_host_fallback(false) makes such a call an error");
  const c10::Device device = ref->device();
  for (std::size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (v.isTensor() && v.toTensor().defined()) v = v.toTensor().cpu();
  }
  op.callBoxed(stack);
  const std::size_t outputs = op.schema().returns().size();
  for (std::size_t i = stack->size() - outputs; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined()) v = v.toTensor().to(device);
  }
}

//! A primitive's kernel for the CUDA key that register_cuda_ops() (ops_cuda.hpp, in builds with
//! CUDA) sets; until then, and in builds without CUDA, the primitive runs on the host (run_on_host).
template <class Sig>
struct device_kernel;
template <class R, class... A>
struct device_kernel<R(A...)> {
  using signature = R(A...);
  const char* name;  //!< the operator, "ulorl::_..."
  std::atomic<R (*)(A...)> kernel{nullptr};
};

//! Operator `name` (a primitive returning R: a tensor or a tuple of tensors) through run_on_host.
template <class R, class... A>
R call_on_host(const char* name, const A&... a) {
  torch::jit::Stack stack;
  torch::jit::push(stack, a...);
  run_on_host(c10::Dispatcher::singleton().findSchemaOrThrow(name, ""), &stack);
  if constexpr (std::is_same_v<R, at::Tensor>) {
    return std::move(stack.back()).toTensor();
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return R{std::move(stack[I]).toTensor()...}; }
    (std::make_index_sequence<std::tuple_size_v<R>>{});
  }
}

//! The CUDA key's entry of a primitive with a device kernel K: K's kernel when set, else run_on_host.
template <auto& K, class Sig = typename std::remove_cvref_t<decltype(K)>::signature>
struct cuda_entry;
template <auto& K, class R, class... A>
struct cuda_entry<K, R(A...)> {
  static R call(A... a) {
    if (const auto k = K.kernel.load(std::memory_order_acquire)) return k(a...);
    return call_on_host<R>(K.name, a...);
  }
};

//! The typed handle of operator `name` (registered by register_ops()), looked up once: each
//! signature below belongs to one operator, and the dispatcher keeps a registered handle valid.
template <class Sig>
const c10::TypedOperatorHandle<Sig>& op(const char* name) {
  static const c10::TypedOperatorHandle<Sig> handle =
      c10::Dispatcher::singleton().findSchemaOrThrow(name, "").template typed<Sig>();
  return handle;
}

using policy_loss_sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                           const opt_tensor&, const opt_tensor&, const opt_tensor&,
                                                           const opt_tensor&, const opt_tensor&, const opt_tensor&,
                                                           c10::ArrayRef<double>);

//! Everything the autograd function passes through besides the differentiable tensors (libtorch
//! 1.13's Function::apply takes no undefined tensors: entropy is a placeholder when absent).
struct policy_loss_call {
  const at::Tensor* old_log_prob;
  const at::Tensor* advantages;
  const opt_tensor* mask;
  const opt_tensor* ref_log_prob;
  const opt_tensor* weights;
  const opt_tensor* entropy;
  const opt_tensor* offsets;
  const opt_tensor* rollout_log_prob;
  c10::ArrayRef<double> config;
};

struct policy_loss_function : public torch::autograd::Function<policy_loss_function> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& log_prob,
                                                const at::Tensor&, const policy_loss_call* c) {
    at::Tensor loss, glp, gent, result;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(loss, glp, gent, result) =
          op<policy_loss_forward_sig>("ulorl::_policy_loss_forward")
              .call(log_prob, *c->old_log_prob, *c->advantages, *c->mask, *c->ref_log_prob, *c->weights, *c->entropy,
                    *c->offsets, *c->rollout_log_prob, c->config);
    }
    ctx->saved_data["grad_log_prob"] = glp;
    if (has_entropy_grad(config_of("policy_loss", c->config), *c->entropy)) ctx->saved_data["grad_entropy"] = gent;
    ctx->mark_non_differentiable({result});
    return {loss, result};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    constexpr std::string_view fn = "policy_loss";
    return {th::detail::take_scaled(fn, ctx, "grad_log_prob", grads[0]),
            th::detail::take_scaled(fn, ctx, "grad_entropy", grads[0]), at::Tensor()};
  }
};

inline std::tuple<at::Tensor, at::Tensor> policy_loss_autograd(
    const at::Tensor& log_prob, const at::Tensor& old_log_prob, const at::Tensor& advantages, const opt_tensor& mask,
    const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& entropy, const opt_tensor& offsets,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config) {
  const policy_loss_call c{&old_log_prob, &advantages,       &mask, &ref_log_prob, &weights, &entropy,
                           &offsets,      &rollout_log_prob, config};
  const bool has_entropy = entropy.has_value() && entropy->defined();
  auto r = policy_loss_function::apply(log_prob, has_entropy ? *entropy : th::detail::placeholder(), &c);
  return {r[0], r[1]};
}

inline std::tuple<at::Tensor, at::Tensor> policy_loss_composite(
    const at::Tensor& log_prob, const at::Tensor& old_log_prob, const at::Tensor& advantages, const opt_tensor& mask,
    const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& entropy, const opt_tensor& offsets,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config) {
  auto [loss, glp, gent, result] = op<policy_loss_forward_sig>("ulorl::_policy_loss_forward")
                                       .call(log_prob, old_log_prob, advantages, mask, ref_log_prob, weights, entropy,
                                             offsets, rollout_log_prob, config);
  return {loss, result};
}

// ---- logits_statistics -----------------------------------------------------------------------------------

//! The statistics' dtype of a logits dtype: the logits' own (float32, float64, bfloat16 or float16,
//! as torch's log_softmax returns; the kernels accumulate in float32 or float64 and round once).
inline c10::ScalarType stats_dtype(std::string_view fn, const at::Tensor& logits) {
  if (!logits.defined()) fail(fn, "logits", "is an undefined tensor");
  switch (logits.scalar_type()) {
    case c10::ScalarType::Double:
    case c10::ScalarType::Float:
    case c10::ScalarType::BFloat16:
    case c10::ScalarType::Half:
      return logits.scalar_type();
    default:
      fail(fn, "logits",
           std::string("has dtype ") + c10::toString(logits.scalar_type()) +
               " but must be float32, float64, bfloat16 or float16");
  }
}

//! A row gradient of a 16-bit statistic as float32 (the backward kernels read float32 or float64).
inline at::Tensor widened_grad(const at::Tensor& g) {
  if (!g.defined()) return g;
  const auto st = g.scalar_type();
  return st == c10::ScalarType::BFloat16 || st == c10::ScalarType::Half ? g.to(at::kFloat) : g;
}

inline std::int64_t logits_rows(std::string_view fn, const at::Tensor& logits) {
  if (logits.dim() != 2)
    fail(fn, "logits",
         "has rank " + std::to_string(logits.dim()) + " (shape " + th::detail::sizes_str(logits) +
             ") but must have rank 2");
  return logits.size(0);
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logits_statistics_forward_meta(
    const at::Tensor& logits, const at::Tensor& labels, double, bool, bool) {
  constexpr std::string_view fn = "logits_statistics";
  th::detail::require_same_device(fn, "logits", logits, {{"labels", &labels}});
  const auto s = logits.options().dtype(stats_dtype(fn, logits));
  const auto d = logits.options().dtype(at::kDouble);
  const std::int64_t n = logits_rows(fn, logits);
  return {at::empty({n}, s), at::empty({n}, s), at::empty({n}, d), at::empty({n}, d)};
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logits_statistics_forward_cpu(
    const at::Tensor& logits, const at::Tensor& labels, double temperature, bool check_values, bool fast_backward) {
  constexpr std::string_view fn = "logits_statistics";
  th::detail::require_same_device(fn, "logits", logits, {{"labels", &labels}});
  const logits_config cfg{.temperature = temperature, .check_values = check_values, .fast_backward = fast_backward};
  // Statistics in double (lse feeds the backward's exp(z - lse)), outputs in the stats dtype.
  const auto [lp, ent, lse] = float64_statistics(fn, logits, labels, cfg);
  const auto st = stats_dtype(fn, logits);
  if (st == c10::ScalarType::Double) return {lp, ent.clone(), lse, ent};
  return {lp.to(st), ent.to(st), lse, ent};
}

//! The backward primitive's tensors, all on the logits' device.
inline void require_backward_device(const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& lse,
                                    const at::Tensor& ent, const opt_tensor& grad_log_prob,
                                    const opt_tensor& grad_entropy) {
  const at::Tensor gl = value_or_undefined(grad_log_prob), ge = value_or_undefined(grad_entropy);
  th::detail::require_same_device(
      "logits_statistics", "logits", logits,
      {{"labels", &labels}, {"lse", &lse}, {"entropy_f64", &ent}, {"grad_log_prob", &gl}, {"grad_entropy", &ge}});
}

inline at::Tensor logits_statistics_backward_meta(const at::Tensor& logits, const at::Tensor& labels,
                                                  const at::Tensor& lse, const at::Tensor& ent,
                                                  const opt_tensor& grad_log_prob, const opt_tensor& grad_entropy,
                                                  double, bool) {
  require_backward_device(logits, labels, lse, ent, grad_log_prob, grad_entropy);
  return at::empty(logits.sizes(), logits.options());
}

inline at::Tensor logits_statistics_backward_cpu(const at::Tensor& logits, const at::Tensor& labels,
                                                 const at::Tensor& lse, const at::Tensor& ent,
                                                 const opt_tensor& grad_log_prob, const opt_tensor& grad_entropy,
                                                 double temperature, bool fast_backward) {
  constexpr std::string_view fn = "logits_statistics";
  require_backward_device(logits, labels, lse, ent, grad_log_prob, grad_entropy);
  const logits_config cfg{.temperature = temperature, .check_values = false, .fast_backward = fast_backward};
  at::Tensor g_lp = widened_grad(value_or_undefined(grad_log_prob)),
             g_ent = widened_grad(value_or_undefined(grad_entropy));
  at::Tensor out = at::empty(logits.sizes(), logits.options());
  if (!g_lp.defined() && !g_ent.defined()) return out.zero_();
  if (!g_lp.defined()) g_lp = at::zeros({logits.size(0)}, g_ent.options());
  with_logits_type(fn, "logits", logits, [&](auto ltag) {
    using L = decltype(ltag);
    with_token_type(fn, "grad_log_prob", g_lp, [&](auto dtag) {
      using D = decltype(dtag);
      with_label_type(fn, "labels", labels, [&](auto y) {
        const vector_view<const D> ge =
            g_ent.defined() ? vector_of<const D>(fn, "grad_entropy", g_ent) : vector_view<const D>();
        logits_backward(matrix_of<const L>(fn, "logits", logits), y, vector_of<const double>(fn, "lse", lse),
                        vector_of<const double>(fn, "entropy", ent), vector_of<const D>(fn, "grad_log_prob", g_lp), ge,
                        matrix_of<L>(fn, "grad_logits", out), cfg, torch_executor{});
      });
    });
  });
  return out;
}

using logits_statistics_forward_sig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&,
                                                                                                 const at::Tensor&,
                                                                                                 double, bool, bool);
using logits_statistics_backward_sig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, const opt_tensor&, const opt_tensor&, double,
                                                  bool);
using logits_statistics_sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, double, bool,
                                                                 bool);

struct logits_statistics_function : public torch::autograd::Function<logits_statistics_function> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                                                const at::Tensor& labels, double temperature, bool check_values,
                                                bool fast_backward) {
    at::Tensor lp, ent, lse, ent64;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(lp, ent, lse, ent64) = op<logits_statistics_forward_sig>("ulorl::_logits_statistics_forward")
                                          .call(logits, labels, temperature, check_values, fast_backward);
    }
    ctx->save_for_backward({logits});
    ctx->saved_data["labels"] = labels;
    ctx->saved_data["lse"] = lse;
    ctx->saved_data["entropy"] = ent64;
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["fast_backward"] = fast_backward;
    ctx->set_materialize_grads(false);
    return {lp, ent};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    constexpr std::string_view fn = "logits_statistics";
    const at::Tensor logits = ctx->get_saved_variables()[0];
    if (!grads[0].defined() && !grads[1].defined())
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    at::Tensor out = op<logits_statistics_backward_sig>("ulorl::_logits_statistics_backward")
                         .call(logits, ctx->saved_data["labels"].toTensor(), ctx->saved_data["lse"].toTensor(),
                               ctx->saved_data["entropy"].toTensor(), optional(grads[0]), optional(grads[1]),
                               ctx->saved_data["temperature"].toDouble(), ctx->saved_data["fast_backward"].toBool());
    return {th::detail::once_differentiable(fn, "grad_logits", out), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

inline std::tuple<at::Tensor, at::Tensor> logits_statistics_autograd(const at::Tensor& logits, const at::Tensor& labels,
                                                                     double temperature, bool check_values,
                                                                     bool fast_backward) {
  auto r = logits_statistics_function::apply(logits, labels, temperature, check_values, fast_backward);
  return {r[0], r[1]};
}

inline std::tuple<at::Tensor, at::Tensor> logits_statistics_composite(const at::Tensor& logits,
                                                                      const at::Tensor& labels, double temperature,
                                                                      bool check_values, bool fast_backward) {
  auto [lp, ent, lse, ent64] = op<logits_statistics_forward_sig>("ulorl::_logits_statistics_forward")
                                   .call(logits, labels, temperature, check_values, fast_backward);
  return {lp, ent};
}

// ---- the fused losses: policy_loss_from_logits, linear_head_policy_loss --------------------------------

//! The token tensors of the fused losses, the optional ones unwrapped (undefined: absent).
struct fused_tokens {
  const at::Tensor &labels, &old_log_prob, &advantages;
  at::Tensor mask, ref_log_prob, weights, offsets, rollout_log_prob;

  policy_loss_config cfg;

  //! Unwraps the optional tensors, requires every one on the device of `ref` (the logits, the
  //! hidden states) and decodes the configuration.
  fused_tokens(std::string_view fn, std::string_view ref_name, const at::Tensor& ref, const at::Tensor& labels_,
               const at::Tensor& old_log_prob_, const at::Tensor& advantages_, const opt_tensor& mask_,
               const opt_tensor& ref_log_prob_, const opt_tensor& weights_, const opt_tensor& offsets_,
               const opt_tensor& rollout_log_prob_, c10::ArrayRef<double> config)
      : labels(labels_),
        old_log_prob(old_log_prob_),
        advantages(advantages_),
        mask(value_or_undefined(mask_)),
        ref_log_prob(value_or_undefined(ref_log_prob_)),
        weights(value_or_undefined(weights_)),
        offsets(value_or_undefined(offsets_)),
        rollout_log_prob(value_or_undefined(rollout_log_prob_)) {
    th::detail::require_same_device(fn, ref_name, ref,
                                    {{"labels", &labels},
                                     {"old_log_prob", &old_log_prob},
                                     {"advantages", &advantages},
                                     {"mask", &mask},
                                     {"ref_log_prob", &ref_log_prob},
                                     {"weights", &weights},
                                     {"offsets", &offsets},
                                     {"rollout_log_prob", &rollout_log_prob}});
    cfg = config_of(fn, config);
  }
  [[nodiscard]] policy_loss_tensors extra() const {
    return {ref_log_prob, weights, at::Tensor(), offsets, rollout_log_prob};
  }
  //! The Meta kernels' loss, log_prob, entropy ([0] without an entropy term) and result.
  [[nodiscard]] std::array<at::Tensor, 4> meta_outputs(std::string_view fn) const {
    const auto opts = old_log_prob.options().dtype(token_dtype(fn, old_log_prob, "old_log_prob"));
    return {at::empty({}, opts), at::empty(old_log_prob.sizes(), opts),
            cfg.entropy_coef != 0.0 ? at::empty(old_log_prob.sizes(), opts) : at::empty({0}, opts),
            result_tensor(old_log_prob)};
  }
  //! The CPU kernels' entropy ([0] without an entropy term) and encoded result of a call's output.
  [[nodiscard]] std::pair<at::Tensor, at::Tensor> cpu_outputs(const policy_loss_output& out) const {
    at::Tensor result = result_tensor(old_log_prob);
    encode_result(out.result, std::span<double>(result.data_ptr<double>(), encoded_result_size));
    return {out.entropy.defined() ? out.entropy : at::empty({0}, out.log_prob.options()), result};
  }
};

//! The linear head's bias (undefined when absent), with the weight and the bias required on the
//! device of the hidden states.
inline at::Tensor head_bias(std::string_view fn, const at::Tensor& hidden, const at::Tensor& weight,
                            const opt_tensor& bias) {
  at::Tensor b = value_or_undefined(bias);
  th::detail::require_same_device(fn, "hidden", hidden, {{"weight", &weight}, {"bias", &b}});
  return b;
}

using logits_loss_forward_sig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const opt_tensor&, const opt_tensor&,
    const opt_tensor&, const opt_tensor&, const opt_tensor&, c10::ArrayRef<double>, double, bool, bool);
using logits_loss_sig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const opt_tensor&, const opt_tensor&,
    const opt_tensor&, const opt_tensor&, const opt_tensor&, c10::ArrayRef<double>, double, bool, bool);

//! The th:: fused functions take no entropy: they compute it.
inline void require_no_entropy(std::string_view fn, const policy_loss_tensors& extra) {
  if (extra.entropy.defined()) fail(fn, "entropy", "must be undefined: it is computed from the logits");
}

//! A fused operator's (loss, result, log_prob, entropy) as the th:: functions return it: entropy
//! only with an entropy term, the result decoded (left default for meta tensors, which carry no
//! values).
inline policy_loss_output fused_output(const std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>& r,
                                       const policy_loss_config& cfg) {
  const auto& [loss, result, lp, ent] = r;
  policy_loss_output out;
  out.loss = loss;
  out.log_prob = lp;
  if (cfg.entropy_coef != 0.0) out.entropy = ent;
  if (result.device().is_meta()) return out;
  const at::Tensor host = result.to(at::kCPU).contiguous();
  out.result = decode_result(std::span<const double>(host.data_ptr<double>(), encoded_result_size));
  return out;
}

//! The forward primitive of policy_loss_from_logits: CPU (Meta = false) or shapes only. grad_logits
//! has the logits' shape and dtype; log_prob and entropy old_log_prob's (entropy [0] without an
//! entropy term); result as policy_loss's.
template <bool Meta>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> logits_loss_forward(
    const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& old_log_prob, const at::Tensor& advantages,
    const opt_tensor& mask, const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& offsets,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config, double temperature, bool check_values,
    bool fast_backward) {
  constexpr std::string_view fn = "policy_loss_from_logits";
  const fused_tokens tok(fn, "logits", logits, labels, old_log_prob, advantages, mask, ref_log_prob, weights, offsets,
                         rollout_log_prob, config);
  const policy_loss_config& cfg = tok.cfg;
  if constexpr (Meta) {
    const auto [loss, lp, ent, result] = tok.meta_outputs(fn);
    return {loss, at::empty(logits.sizes(), logits.options().dtype(stats_dtype(fn, logits))), lp, ent, result};
  } else {
    policy_loss_output out;
    const th::detail::fused_args a{&labels, &old_log_prob, &advantages, &tok.mask, &cfg, &out};
    logits_loss_config opt;
    opt.extra = tok.extra();
    opt.logits = {.temperature = temperature, .check_values = check_values, .fast_backward = fast_backward};
    const at::Tensor grad = at::empty(logits.sizes(), logits.options());
    const at::Tensor loss = th::detail::logits_loss_into(logits, grad, &a, &opt);
    const auto [entropy, result] = tok.cpu_outputs(out);
    return {loss, grad, out.log_prob, entropy, result};
  }
}

//! The non-tensor arguments of policy_loss_from_logits through autograd.
struct logits_loss_call {
  const at::Tensor *labels, *old_log_prob, *advantages;
  const opt_tensor *mask, *ref_log_prob, *weights, *offsets, *rollout_log_prob;
  c10::ArrayRef<double> config;
  double temperature;
  bool check_values, fast_backward;
};

struct logits_loss_op_function : public torch::autograd::Function<logits_loss_op_function> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& logits,
                                                const logits_loss_call* c) {
    at::Tensor loss, grad, lp, ent, result;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(loss, grad, lp, ent, result) =
          op<logits_loss_forward_sig>("ulorl::_policy_loss_from_logits_forward")
              .call(logits, *c->labels, *c->old_log_prob, *c->advantages, *c->mask, *c->ref_log_prob, *c->weights,
                    *c->offsets, *c->rollout_log_prob, c->config, c->temperature, c->check_values, c->fast_backward);
    }
    ctx->saved_data["grad_logits"] = grad;
    ctx->mark_non_differentiable({result, lp, ent});
    return {loss, result, lp, ent};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {th::detail::take_scaled("policy_loss_from_logits", ctx, "grad_logits", grads[0]), at::Tensor()};
  }
};

inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logits_loss_autograd(
    const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& old_log_prob, const at::Tensor& advantages,
    const opt_tensor& mask, const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& offsets,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config, double temperature, bool check_values,
    bool fast_backward) {
  const logits_loss_call c{&labels,  &old_log_prob,     &advantages, &mask,       &ref_log_prob, &weights,
                           &offsets, &rollout_log_prob, config,      temperature, check_values,  fast_backward};
  auto v = logits_loss_op_function::apply(logits, &c);
  return {v[0], v[1], v[2], v[3]};
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> logits_loss_composite(
    const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& old_log_prob, const at::Tensor& advantages,
    const opt_tensor& mask, const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& offsets,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config, double temperature, bool check_values,
    bool fast_backward) {
  auto [loss, grad, lp, ent, result] =
      op<logits_loss_forward_sig>("ulorl::_policy_loss_from_logits_forward")
          .call(logits, labels, old_log_prob, advantages, mask, ref_log_prob, weights, offsets, rollout_log_prob,
                config, temperature, check_values, fast_backward);
  return {loss, result, lp, ent};
}

// ---- linear_head_policy_loss --------------------------------------------------------------------------

using head_loss_forward_sig =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const opt_tensor&, const at::Tensor&, const at::Tensor&,
        const at::Tensor&, const opt_tensor&, const opt_tensor&, const opt_tensor&, const opt_tensor&,
        const opt_tensor&, c10::ArrayRef<double>, double, bool, bool, std::int64_t, std::int64_t, std::array<bool, 3>);
using head_loss_sig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const opt_tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const opt_tensor&, const opt_tensor&, const opt_tensor&, const opt_tensor&, const opt_tensor&,
    c10::ArrayRef<double>, double, bool, bool, std::int64_t, std::int64_t);

//! The head's options of a call (chunk_rows >= 0 and workspace_budget >= 0, else ulorl::error).
inline linear_head_config head_config_of(std::string_view fn, double temperature, bool check_values, bool fast_backward,
                                         std::int64_t chunk_rows, std::int64_t workspace_budget) {
  if (chunk_rows < 0) fail(fn, "chunk_rows", "= " + std::to_string(chunk_rows) + ": must be >= 0");
  if (workspace_budget < 0) fail(fn, "workspace_budget", "= " + std::to_string(workspace_budget) + ": must be >= 0");
  linear_head_config h;
  h.temperature = temperature;
  h.chunk_rows = static_cast<std::size_t>(chunk_rows);
  h.workspace_budget = static_cast<std::size_t>(workspace_budget);
  h.check_values = check_values;
  h.fast_backward = fast_backward;
  return h;
}

//! The forward primitive of linear_head_policy_loss: CPU (Meta = false) or shapes only. The
//! gradients have hidden's dtype and the shapes of hidden, weight and bias; one that output_mask
//! leaves out (and grad_bias without a bias) is [0]. log_prob and entropy have old_log_prob's shape
//! and dtype (entropy [0] without an entropy term); result as policy_loss's.
template <bool Meta>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> head_loss_forward(
    const at::Tensor& hidden, const at::Tensor& weight, const opt_tensor& bias_, const at::Tensor& labels,
    const at::Tensor& old_log_prob, const at::Tensor& advantages, const opt_tensor& mask,
    const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& offsets,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config, double temperature, bool check_values,
    bool fast_backward, std::int64_t chunk_rows, std::int64_t workspace_budget, std::array<bool, 3> output_mask) {
  constexpr std::string_view fn = "linear_head_policy_loss";
  const at::Tensor b = head_bias(fn, hidden, weight, bias_);
  const fused_tokens tok(fn, "hidden", hidden, labels, old_log_prob, advantages, mask, ref_log_prob, weights, offsets,
                         rollout_log_prob, config);
  const policy_loss_config& cfg = tok.cfg;
  const linear_head_config head =
      head_config_of(fn, temperature, check_values, fast_backward, chunk_rows, workspace_budget);
  const auto hopts = hidden.options().dtype(th::detail::value_dtype(fn, "hidden", hidden));
  const bool want_h = output_mask[0], want_w = output_mask[1], want_b = output_mask[2] && b.defined();
  const auto grad = [&](bool wanted, const at::Tensor& like) {
    return wanted ? at::empty(like.sizes(), hopts) : at::empty({0}, hopts);
  };
  if constexpr (Meta) {
    const auto [loss, lp, ent, result] = tok.meta_outputs(fn);
    return {loss, grad(want_h, hidden), grad(want_w, weight), grad(want_b, b), lp, ent, result};
  } else {
    policy_loss_output out;
    const th::detail::fused_args a{&labels, &old_log_prob, &advantages, &tok.mask, &cfg, &out};
    linear_head_loss_config opt;
    opt.extra = tok.extra();
    opt.head = head;
    const at::Tensor gh = grad(want_h, hidden), gw = grad(want_w, weight), gb = grad(want_b, b);
    const auto given = [](bool wanted, const at::Tensor& g) { return wanted ? g : at::Tensor(); };
    const at::Tensor loss = th::detail::head_loss_into(hidden, weight, b, given(want_h, gh), given(want_w, gw),
                                                       given(want_b, gb), &a, &opt);
    const auto [entropy, result] = tok.cpu_outputs(out);
    return {loss, gh, gw, gb, out.log_prob, entropy, result};
  }
}

//! The non-tensor arguments of linear_head_policy_loss through autograd (libtorch 1.13's
//! Function::apply takes no undefined tensors: bias is a placeholder when absent).
struct head_loss_call {
  const at::Tensor *labels, *old_log_prob, *advantages;
  const opt_tensor *bias, *mask, *ref_log_prob, *weights, *offsets, *rollout_log_prob;
  c10::ArrayRef<double> config;
  double temperature;
  bool check_values, fast_backward;
  std::int64_t chunk_rows, workspace_budget;
};

inline bool has_tensor(const opt_tensor& t) { return t.has_value() && t->defined(); }

struct head_loss_op_function : public torch::autograd::Function<head_loss_op_function> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                                                const at::Tensor& weight, const at::Tensor& bias,
                                                const head_loss_call* c) {
    // Only the gradients autograd asks for: a frozen weight costs no weight GEMM.
    const std::array<bool, 3> wanted{hidden.requires_grad(), weight.requires_grad(),
                                     has_tensor(*c->bias) && bias.requires_grad()};
    at::Tensor loss, gh, gw, gb, lp, ent, result;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(loss, gh, gw, gb, lp, ent, result) =
          op<head_loss_forward_sig>("ulorl::_linear_head_policy_loss_forward")
              .call(hidden, weight, *c->bias, *c->labels, *c->old_log_prob, *c->advantages, *c->mask, *c->ref_log_prob,
                    *c->weights, *c->offsets, *c->rollout_log_prob, c->config, c->temperature, c->check_values,
                    c->fast_backward, c->chunk_rows, c->workspace_budget, wanted);
    }
    if (wanted[0]) ctx->saved_data["grad_hidden"] = gh;
    if (wanted[1]) ctx->saved_data["grad_weight"] = gw;
    if (wanted[2]) ctx->saved_data["grad_bias"] = gb;
    ctx->mark_non_differentiable({result, lp, ent});
    return {loss, result, lp, ent};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    constexpr std::string_view fn = "linear_head_policy_loss";
    return {th::detail::take_scaled(fn, ctx, "grad_hidden", grads[0]),
            th::detail::take_scaled(fn, ctx, "grad_weight", grads[0]),
            th::detail::take_scaled(fn, ctx, "grad_bias", grads[0]), at::Tensor()};
  }
};

inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> head_loss_autograd(
    const at::Tensor& hidden, const at::Tensor& weight, const opt_tensor& bias, const at::Tensor& labels,
    const at::Tensor& old_log_prob, const at::Tensor& advantages, const opt_tensor& mask,
    const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& offsets,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config, double temperature, bool check_values,
    bool fast_backward, std::int64_t chunk_rows, std::int64_t workspace_budget) {
  const head_loss_call c{&labels,       &old_log_prob, &advantages,       &bias,  &mask,       &ref_log_prob,
                         &weights,      &offsets,      &rollout_log_prob, config, temperature, check_values,
                         fast_backward, chunk_rows,    workspace_budget};
  auto v = head_loss_op_function::apply(hidden, weight, has_tensor(bias) ? *bias : th::detail::placeholder(), &c);
  return {v[0], v[1], v[2], v[3]};
}

inline std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> head_loss_composite(
    const at::Tensor& hidden, const at::Tensor& weight, const opt_tensor& bias, const at::Tensor& labels,
    const at::Tensor& old_log_prob, const at::Tensor& advantages, const opt_tensor& mask,
    const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& offsets,
    const opt_tensor& rollout_log_prob, c10::ArrayRef<double> config, double temperature, bool check_values,
    bool fast_backward, std::int64_t chunk_rows, std::int64_t workspace_budget) {
  auto [loss, gh, gw, gb, lp, ent, result] =
      op<head_loss_forward_sig>("ulorl::_linear_head_policy_loss_forward")
          .call(hidden, weight, bias, labels, old_log_prob, advantages, mask, ref_log_prob, weights, offsets,
                rollout_log_prob, config, temperature, check_values, fast_backward, chunk_rows, workspace_budget,
                {false, false, false});
  return {loss, result, lp, ent};
}

// ---- agg_loss and kl_penalty ------------------------------------------------------------------------

//! The forward primitive of agg_loss: CPU (Meta = false) or shapes only. `loss` is 0-dim, `grad`
//! d loss / d loss_mat, both of loss_mat's dtype.
template <bool Meta>
std::tuple<at::Tensor, at::Tensor> agg_loss_forward(const at::Tensor& loss_mat, const opt_tensor& mask_,
                                                    const opt_tensor& offsets, c10::ArrayRef<double> normalizer) {
  constexpr std::string_view fn = "agg_loss";
  const at::Tensor m = value_or_undefined(mask_), o = value_or_undefined(offsets);
  th::detail::require_same_device(fn, "loss_mat", loss_mat, {{"mask", &m}, {"offsets", &o}});
  const auto norm = decode_fields<agg_normalizer>(fn, "normalizer", {normalizer.data(), normalizer.size()});
  const auto opts = loss_mat.options().dtype(token_dtype(fn, loss_mat));
  if constexpr (Meta) {
    return {at::empty({}, opts), at::empty(loss_mat.sizes(), opts)};
  } else {
    const offsets_view off = offsets_of(fn, "offsets", o);
    return with_token_type(fn, "loss_mat", loss_mat, [&](auto tag) {
      using T = decltype(tag);
      const token_view<const T> lm = tokens_of<const T>(fn, "loss_mat", loss_mat, off);
      const at::Tensor mask = byte_mask<T>(fn, "mask", m, off);
      const auto mv = optional_tokens_of<const std::uint8_t>(fn, "mask", mask, off, "loss_mat", lm);
      at::Tensor grad = at::empty(loss_mat.sizes(), opts);
      const double loss = ulorl::agg_loss(lm, mv, tokens_of<T>(fn, "grad", grad, off), norm);
      return std::make_tuple(at::scalar_tensor(loss, opts), grad);
    });
  }
}

//! The forward primitive of kl_penalty: CPU (Meta = false) or shapes only. `kl` and `grad`
//! (d kl / d log_prob, element-wise) have log_prob's shape and dtype.
template <bool Meta>
std::tuple<at::Tensor, at::Tensor> kl_penalty_forward(const at::Tensor& log_prob, const at::Tensor& ref_log_prob,
                                                      const opt_tensor& offsets, c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "kl_penalty";
  const at::Tensor o = value_or_undefined(offsets);
  th::detail::require_same_device(fn, "log_prob", log_prob, {{"ref_log_prob", &ref_log_prob}, {"offsets", &o}});
  const auto cfg = decode_fields<kl_config>(fn, "config", {config.data(), config.size()});
  const auto opts = log_prob.options().dtype(token_dtype(fn, log_prob));
  at::Tensor kl = at::empty(log_prob.sizes(), opts), grad = at::empty(log_prob.sizes(), opts);
  if constexpr (!Meta) {
    const offsets_view off = offsets_of(fn, "offsets", o);
    with_token_type(fn, "log_prob", log_prob, [&](auto tag) {
      using T = decltype(tag);
      ulorl::kl_penalty<T>(tokens_of<const T>(fn, "log_prob", log_prob, off),
                           tokens_of<const T>(fn, "ref_log_prob", ref_log_prob, off), tokens_of<T>(fn, "kl", kl, off),
                           tokens_of<T>(fn, "grad", grad, off), cfg);
    });
  }
  return {kl, grad};
}

using agg_loss_forward_sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const opt_tensor&, const opt_tensor&,
                                                                c10::ArrayRef<double>);
using agg_loss_sig = at::Tensor(const at::Tensor&, const opt_tensor&, const opt_tensor&, c10::ArrayRef<double>);
using kl_penalty_forward_sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                  const opt_tensor&, c10::ArrayRef<double>);
using kl_penalty_sig = at::Tensor(const at::Tensor&, const at::Tensor&, const opt_tensor&, c10::ArrayRef<double>);

//! The saved gradient times the incoming one (a 0-dim or an element-wise one), differentiable once.
//! The saved tensor is kept, so backward may run more than once (retain_graph, gradcheck).
inline at::Tensor scaled_grad(std::string_view fn, std::string_view arg, torch::autograd::AutogradContext* ctx,
                              const at::Tensor& grad_out) {
  if (!grad_out.defined()) return {};
  return th::detail::once_differentiable(fn, arg, ctx->get_saved_variables()[0] * grad_out);
}

//! The non-tensor arguments of agg_loss / kl_penalty through autograd.
struct token_op_call {
  const opt_tensor* mask;
  const opt_tensor* offsets;
  c10::ArrayRef<double> config;
};

struct agg_loss_function : public torch::autograd::Function<agg_loss_function> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& loss_mat, const token_op_call* c) {
    at::Tensor loss, grad;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(loss, grad) =
          op<agg_loss_forward_sig>("ulorl::_agg_loss_forward").call(loss_mat, *c->mask, *c->offsets, c->config);
    }
    ctx->save_for_backward({grad});
    return loss;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {scaled_grad("agg_loss", "grad_loss_mat", ctx, grads[0]), at::Tensor()};
  }
};

struct kl_penalty_function : public torch::autograd::Function<kl_penalty_function> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& log_prob,
                            const at::Tensor& ref_log_prob, const token_op_call* c) {
    at::Tensor kl, grad;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(kl, grad) =
          op<kl_penalty_forward_sig>("ulorl::_kl_penalty_forward").call(log_prob, ref_log_prob, *c->offsets, c->config);
    }
    ctx->save_for_backward({grad});
    return kl;
  }
  //! Every estimator is a function of ref - logp (loss/kl.hpp), so the reference's gradient is minus
  //! the log-prob's.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor g = scaled_grad("kl_penalty", "grad_log_prob", ctx, grads[0]);
    return {g, g.defined() && ctx->needs_input_grad(1) ? -g : at::Tensor(), at::Tensor()};
  }
};

inline at::Tensor agg_loss_autograd(const at::Tensor& loss_mat, const opt_tensor& mask, const opt_tensor& offsets,
                                    c10::ArrayRef<double> normalizer) {
  const token_op_call c{&mask, &offsets, normalizer};
  return agg_loss_function::apply(loss_mat, &c);
}
inline at::Tensor agg_loss_composite(const at::Tensor& loss_mat, const opt_tensor& mask, const opt_tensor& offsets,
                                     c10::ArrayRef<double> normalizer) {
  return std::get<0>(op<agg_loss_forward_sig>("ulorl::_agg_loss_forward").call(loss_mat, mask, offsets, normalizer));
}
inline at::Tensor kl_penalty_autograd(const at::Tensor& log_prob, const at::Tensor& ref_log_prob,
                                      const opt_tensor& offsets, c10::ArrayRef<double> config) {
  const opt_tensor none;
  const token_op_call c{&none, &offsets, config};
  return kl_penalty_function::apply(log_prob, ref_log_prob, &c);
}
inline at::Tensor kl_penalty_composite(const at::Tensor& log_prob, const at::Tensor& ref_log_prob,
                                       const opt_tensor& offsets, c10::ArrayRef<double> config) {
  return std::get<0>(
      op<kl_penalty_forward_sig>("ulorl::_kl_penalty_forward").call(log_prob, ref_log_prob, offsets, config));
}

// ---- weighted_kl_loss -------------------------------------------------------------------------------------

using weighted_kl_loss_forward_sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                        const opt_tensor&, const opt_tensor&,
                                                                        const opt_tensor&, c10::ArrayRef<double>,
                                                                        c10::ArrayRef<double>);
using weighted_kl_loss_sig = at::Tensor(const at::Tensor&, const at::Tensor&, const opt_tensor&, const opt_tensor&,
                                        const opt_tensor&, c10::ArrayRef<double>, c10::ArrayRef<double>);

//! The forward primitive of weighted_kl_loss: the 0-dim loss in log_prob's dtype and d loss / d
//! log_prob (0 on masked tokens); CPU (Meta = false) or shapes only.
template <bool Meta>
std::tuple<at::Tensor, at::Tensor> weighted_kl_loss_forward(const at::Tensor& log_prob, const at::Tensor& ref_log_prob,
                                                            const opt_tensor& rollout_log_prob, const opt_tensor& mask,
                                                            const opt_tensor& offsets, c10::ArrayRef<double> config,
                                                            c10::ArrayRef<double> normalizer) {
  constexpr std::string_view fn = "weighted_kl_loss";
  const at::Tensor r = value_or_undefined(rollout_log_prob), m = value_or_undefined(mask),
                   o = value_or_undefined(offsets);
  th::detail::require_same_device(
      fn, "log_prob", log_prob,
      {{"ref_log_prob", &ref_log_prob}, {"rollout_log_prob", &r}, {"mask", &m}, {"offsets", &o}});
  const auto cfg =
      decode_fields<weighted_kl_config>(fn, "config", std::span<const double>(config.data(), config.size()));
  const auto norm =
      decode_fields<agg_normalizer>(fn, "normalizer", std::span<const double>(normalizer.data(), normalizer.size()));
  const auto opts = log_prob.options().dtype(token_dtype(fn, log_prob));
  at::Tensor loss = at::empty({}, opts),
             grad = Meta ? at::empty(log_prob.sizes(), opts) : at::zeros(log_prob.sizes(), opts);
  if constexpr (!Meta) {
    const offsets_view off = offsets_of(fn, "offsets", o);
    with_token_type(fn, "log_prob", log_prob, [&](auto tag) {
      using T = decltype(tag);
      const auto lp = tokens_of<const T>(fn, "log_prob", log_prob, off);
      const at::Tensor mb = byte_mask<T>(fn, "mask", m, off);
      loss.fill_(ulorl::weighted_kl_loss(lp, tokens_of<const T>(fn, "ref_log_prob", ref_log_prob, off),
                                         optional_tokens_of<const T>(fn, "rollout_log_prob", r, off, "log_prob", lp),
                                         optional_tokens_of<const std::uint8_t>(fn, "mask", mb, off, "log_prob", lp),
                                         tokens_of<T>(fn, "grad", grad, off), cfg, norm));
    });
  }
  return {loss, grad};
}

//! The non-tensor arguments of weighted_kl_loss through autograd.
struct weighted_kl_call {
  const at::Tensor* ref_log_prob;
  const opt_tensor* rollout_log_prob;
  const opt_tensor* mask;
  const opt_tensor* offsets;
  c10::ArrayRef<double> config, normalizer;
};

struct weighted_kl_loss_function : public torch::autograd::Function<weighted_kl_loss_function> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& log_prob,
                            const weighted_kl_call* c) {
    at::Tensor loss, grad;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(loss, grad) =
          op<weighted_kl_loss_forward_sig>("ulorl::_weighted_kl_loss_forward")
              .call(log_prob, *c->ref_log_prob, *c->rollout_log_prob, *c->mask, *c->offsets, c->config, c->normalizer);
    }
    ctx->save_for_backward({grad});
    return loss;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {scaled_grad("weighted_kl_loss", "grad_log_prob", ctx, grads[0]), at::Tensor()};
  }
};

inline at::Tensor weighted_kl_loss_autograd(const at::Tensor& log_prob, const at::Tensor& ref_log_prob,
                                            const opt_tensor& rollout_log_prob, const opt_tensor& mask,
                                            const opt_tensor& offsets, c10::ArrayRef<double> config,
                                            c10::ArrayRef<double> normalizer) {
  const weighted_kl_call c{&ref_log_prob, &rollout_log_prob, &mask, &offsets, config, normalizer};
  return weighted_kl_loss_function::apply(log_prob, &c);
}
inline at::Tensor weighted_kl_loss_composite(const at::Tensor& log_prob, const at::Tensor& ref_log_prob,
                                             const opt_tensor& rollout_log_prob, const opt_tensor& mask,
                                             const opt_tensor& offsets, c10::ArrayRef<double> config,
                                             c10::ArrayRef<double> normalizer) {
  return std::get<0>(op<weighted_kl_loss_forward_sig>("ulorl::_weighted_kl_loss_forward")
                         .call(log_prob, ref_log_prob, rollout_log_prob, mask, offsets, config, normalizer));
}

// ---- TRL's GRPO loss ---------------------------------------------------------------------------------------

using trl_grpo_loss_forward_sig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const opt_tensor&, const opt_tensor&, const opt_tensor&,
    const opt_tensor&, const opt_tensor&, c10::ArrayRef<double>);
using trl_grpo_loss_sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                             const opt_tensor&, const opt_tensor&, const opt_tensor&,
                                                             const opt_tensor&, const opt_tensor&,
                                                             c10::ArrayRef<double>);

//! The forward primitive of trl_grpo_loss: CPU (Meta = false) or shapes only. The loss is 0-dim in
//! per_token_logps' dtype, the gradients in their tensors' shapes (grad_entropies [0] without an
//! entropy bonus), the result an encoded presets::trl::grpo_loss_result.
template <bool Meta>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> trl_grpo_loss_forward(
    const at::Tensor& per_token_logps, const at::Tensor& old_per_token_logps, const at::Tensor& advantages,
    const opt_tensor& completion_mask, const opt_tensor& ref_per_token_logps,
    const opt_tensor& sampling_per_token_logps, const opt_tensor& entropies,
    const opt_tensor& importance_sampling_ratio, c10::ArrayRef<double> config) {
  namespace P = presets::trl;
  constexpr std::string_view fn = "presets::trl::grpo_loss";
  constexpr std::string_view lp_name = "per_token_logps";
  const at::Tensor m = value_or_undefined(completion_mask), r = value_or_undefined(ref_per_token_logps),
                   sp = value_or_undefined(sampling_per_token_logps), e = value_or_undefined(entropies),
                   q = value_or_undefined(importance_sampling_ratio);
  th::detail::require_same_device(fn, lp_name, per_token_logps,
                                  {{"old_per_token_logps", &old_per_token_logps},
                                   {"advantages", &advantages},
                                   {"completion_mask", &m},
                                   {"ref_per_token_logps", &r},
                                   {"sampling_per_token_logps", &sp},
                                   {"entropies", &e},
                                   {"importance_sampling_ratio", &q}});
  const auto o =
      decode_fields<P::grpo_loss_options>(fn, "config", std::span<const double>(config.data(), config.size()));
  const auto opts = per_token_logps.options().dtype(token_dtype(fn, per_token_logps, lp_name));
  const bool entropy_grad = o.entropy_coef != 0.0 && e.defined();
  if constexpr (Meta) {
    return {at::empty({}, opts), at::empty(per_token_logps.sizes(), opts),
            entropy_grad ? at::empty(e.sizes(), opts) : at::empty({0}, opts),
            at::empty({static_cast<std::int64_t>(encoded_size_of<P::grpo_loss_result>)}, opts.dtype(at::kDouble))};
  } else {
    const offsets_view padded{};
    return with_token_type(fn, lp_name, per_token_logps, [&](auto tag) {
      using T = decltype(tag);
      using M = std::uint8_t;
      const auto lp = tokens_of<const T>(fn, lp_name, per_token_logps, padded);
      const at::Tensor mask = byte_mask<T>(fn, "completion_mask", m, padded);
      const auto optional = [&](std::string_view arg, const at::Tensor& t) {
        return optional_tokens_of<const T>(fn, arg, t, padded, lp_name, lp);
      };
      P::grpo_loss_inputs<T, M> in{lp, tokens_of<const T>(fn, "old_per_token_logps", old_per_token_logps, padded),
                                   optional_tokens_of<const M>(fn, "completion_mask", mask, padded, lp_name, lp),
                                   span_of<const T>(fn, "advantages", advantages)};
      in.ref_per_token_logps = optional("ref_per_token_logps", r);
      in.sampling_per_token_logps = optional("sampling_per_token_logps", sp);
      in.entropies = optional("entropies", e);
      // [B, T] or [B, 1]: the loss checks its shape.
      in.importance_sampling_ratio = optional_tokens_of<const T>(fn, "importance_sampling_ratio", q, padded);
      at::Tensor grad = at::zeros(per_token_logps.sizes(), opts);
      at::Tensor grad_e = entropy_grad ? at::zeros(e.sizes(), opts) : at::empty({0}, opts);
      P::grpo_loss_outputs<T> out{tokens_of<T>(fn, "grad_per_token_logps", grad, padded)};
      if (entropy_grad) out.grad_entropies = tokens_of<T>(fn, "grad_entropies", grad_e, padded);
      const P::grpo_loss_result res = P::grpo_loss(in, out, o, torch_executor{});
      at::Tensor loss = at::empty({}, opts);
      loss.fill_(res.loss);
      return std::make_tuple(loss, grad, grad_e, record_tensor(&res));
    });
  }
}

//! The tensors trl_grpo_loss passes through autograd besides the differentiable ones.
struct trl_grpo_loss_call {
  const at::Tensor* old_per_token_logps;
  const at::Tensor* advantages;
  const opt_tensor* completion_mask;
  const opt_tensor* ref_per_token_logps;
  const opt_tensor* sampling_per_token_logps;
  const opt_tensor* entropies;
  const opt_tensor* importance_sampling_ratio;
  c10::ArrayRef<double> config;
};

struct trl_grpo_loss_function : public torch::autograd::Function<trl_grpo_loss_function> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& per_token_logps, const at::Tensor&,
                                                const trl_grpo_loss_call* c) {
    at::Tensor loss, glp, gent, result;
    {
      const at::AutoDispatchBelowADInplaceOrView below;
      std::tie(loss, glp, gent, result) =
          op<trl_grpo_loss_forward_sig>("ulorl::_trl_grpo_loss_forward")
              .call(per_token_logps, *c->old_per_token_logps, *c->advantages, *c->completion_mask,
                    *c->ref_per_token_logps, *c->sampling_per_token_logps, *c->entropies, *c->importance_sampling_ratio,
                    c->config);
    }
    ctx->saved_data["grad_per_token_logps"] = glp;
    const auto o = decode_fields<presets::trl::grpo_loss_options>(
        "presets::trl::grpo_loss", "config", std::span<const double>(c->config.data(), c->config.size()));
    if (o.entropy_coef != 0.0 && c->entropies->has_value() && (*c->entropies)->defined())
      ctx->saved_data["grad_entropies"] = gent;
    ctx->mark_non_differentiable({result});
    return {loss, result};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    constexpr std::string_view fn = "trl_grpo_loss";
    return {th::detail::take_scaled(fn, ctx, "grad_per_token_logps", grads[0]),
            th::detail::take_scaled(fn, ctx, "grad_entropies", grads[0]), at::Tensor()};
  }
};

inline std::tuple<at::Tensor, at::Tensor> trl_grpo_loss_autograd(
    const at::Tensor& per_token_logps, const at::Tensor& old_per_token_logps, const at::Tensor& advantages,
    const opt_tensor& completion_mask, const opt_tensor& ref_per_token_logps,
    const opt_tensor& sampling_per_token_logps, const opt_tensor& entropies,
    const opt_tensor& importance_sampling_ratio, c10::ArrayRef<double> config) {
  const trl_grpo_loss_call c{&old_per_token_logps,      &advantages, &completion_mask,           &ref_per_token_logps,
                             &sampling_per_token_logps, &entropies,  &importance_sampling_ratio, config};
  const bool has_entropies = entropies.has_value() && entropies->defined();
  auto r = trl_grpo_loss_function::apply(per_token_logps, has_entropies ? *entropies : th::detail::placeholder(), &c);
  return {r[0], r[1]};
}

inline std::tuple<at::Tensor, at::Tensor> trl_grpo_loss_composite(
    const at::Tensor& per_token_logps, const at::Tensor& old_per_token_logps, const at::Tensor& advantages,
    const opt_tensor& completion_mask, const opt_tensor& ref_per_token_logps,
    const opt_tensor& sampling_per_token_logps, const opt_tensor& entropies,
    const opt_tensor& importance_sampling_ratio, c10::ArrayRef<double> config) {
  auto [loss, glp, gent, result] =
      op<trl_grpo_loss_forward_sig>("ulorl::_trl_grpo_loss_forward")
          .call(per_token_logps, old_per_token_logps, advantages, completion_mask, ref_per_token_logps,
                sampling_per_token_logps, entropies, importance_sampling_ratio, config);
  return {loss, result};
}

// ---- the primitives with device kernels (ops_cuda.hpp) ------------------------------------------------

inline device_kernel<policy_loss_forward_sig> cuda_policy_loss_forward{"ulorl::_policy_loss_forward"};
inline device_kernel<logits_statistics_forward_sig> cuda_logits_statistics_forward{"ulorl::_logits_statistics_forward"};
inline device_kernel<logits_statistics_backward_sig> cuda_logits_statistics_backward{
    "ulorl::_logits_statistics_backward"};
inline device_kernel<logits_loss_forward_sig> cuda_logits_loss_forward{"ulorl::_policy_loss_from_logits_forward"};
inline device_kernel<head_loss_forward_sig> cuda_head_loss_forward{"ulorl::_linear_head_policy_loss_forward"};

}  // namespace detail

//! Registers the `ulorl` operators (schemas and kernels) unless this process has them already.
//! Thread-safe; returns whether this call's copy of ulorl registered them.
inline bool register_ops() {
  static const bool registered = [] {
    if (c10::Dispatcher::singleton().findSchema({"ulorl::policy_loss", ""}).has_value()) return false;
    static torch::Library def(torch::Library::DEF, "ulorl", c10::nullopt, __FILE__, __LINE__);
    for (const std::string& s : schemas()) def.def(s.c_str());
    for (const std::string& s : batch_schemas()) def.def(s.c_str());
    static torch::Library cpu(torch::Library::IMPL, "ulorl", c10::DispatchKey::CPU, __FILE__, __LINE__);
    cpu.impl("_policy_loss_forward", &detail::policy_loss_forward<false>);
    cpu.impl("_logits_statistics_forward", &detail::logits_statistics_forward_cpu);
    cpu.impl("_logits_statistics_backward", &detail::logits_statistics_backward_cpu);
    cpu.impl("_agg_loss_forward", &detail::agg_loss_forward<false>);
    cpu.impl("_kl_penalty_forward", &detail::kl_penalty_forward<false>);
    cpu.impl("_policy_loss_from_logits_forward", &detail::logits_loss_forward<false>);
    cpu.impl("_linear_head_policy_loss_forward", &detail::head_loss_forward<false>);
    cpu.impl("_trl_grpo_loss_forward", &detail::trl_grpo_loss_forward<false>);
    cpu.impl("_weighted_kl_loss_forward", &detail::weighted_kl_loss_forward<false>);
    static torch::Library meta(torch::Library::IMPL, "ulorl", c10::DispatchKey::Meta, __FILE__, __LINE__);
    meta.impl("_policy_loss_forward", &detail::policy_loss_forward<true>);
    meta.impl("_logits_statistics_forward", &detail::logits_statistics_forward_meta);
    meta.impl("_logits_statistics_backward", &detail::logits_statistics_backward_meta);
    meta.impl("_agg_loss_forward", &detail::agg_loss_forward<true>);
    meta.impl("_kl_penalty_forward", &detail::kl_penalty_forward<true>);
    meta.impl("_policy_loss_from_logits_forward", &detail::logits_loss_forward<true>);
    meta.impl("_linear_head_policy_loss_forward", &detail::head_loss_forward<true>);
    meta.impl("_trl_grpo_loss_forward", &detail::trl_grpo_loss_forward<true>);
    meta.impl("_weighted_kl_loss_forward", &detail::weighted_kl_loss_forward<true>);
    detail::register_batch_kernels(cpu, meta);
    // CUDA: the device kernels that register_cuda_ops() sets, else (and for the other operators)
    // the host path.
    static torch::Library cuda(torch::Library::IMPL, "ulorl", c10::DispatchKey::CUDA, __FILE__, __LINE__);
    cuda.impl("_policy_loss_forward", &detail::cuda_entry<detail::cuda_policy_loss_forward>::call);
    cuda.impl("_logits_statistics_forward", &detail::cuda_entry<detail::cuda_logits_statistics_forward>::call);
    cuda.impl("_logits_statistics_backward", &detail::cuda_entry<detail::cuda_logits_statistics_backward>::call);
    cuda.impl("_policy_loss_from_logits_forward", &detail::cuda_entry<detail::cuda_logits_loss_forward>::call);
    cuda.impl("_linear_head_policy_loss_forward", &detail::cuda_entry<detail::cuda_head_loss_forward>::call);
    for (const std::string& name : detail::host_operators())
      cuda.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&detail::run_on_host>());
    static torch::Library autograd(torch::Library::IMPL, "ulorl", c10::DispatchKey::Autograd, __FILE__, __LINE__);
    autograd.impl("policy_loss", &detail::policy_loss_autograd);
    autograd.impl("logits_statistics", &detail::logits_statistics_autograd);
    autograd.impl("agg_loss", &detail::agg_loss_autograd);
    autograd.impl("kl_penalty", &detail::kl_penalty_autograd);
    autograd.impl("policy_loss_from_logits", &detail::logits_loss_autograd);
    autograd.impl("linear_head_policy_loss", &detail::head_loss_autograd);
    autograd.impl("trl_grpo_loss", &detail::trl_grpo_loss_autograd);
    autograd.impl("weighted_kl_loss", &detail::weighted_kl_loss_autograd);
    // The primitives are not differentiable: their outputs are gradients and statistics, and
    // autograd passes them by (torch 1.13 has no fallthrough of its own for AutogradMeta).
    // The batch operators are not differentiable either (their inputs are constants of the loss).
    for (const char* name : {"_policy_loss_forward", "_logits_statistics_forward", "_logits_statistics_backward",
                             "_policy_loss_from_logits_forward", "_linear_head_policy_loss_forward"})
      autograd.impl(name, torch::CppFunction::makeFallthrough());
    for (const std::string& name : detail::host_operators())
      autograd.impl(name.c_str(), torch::CppFunction::makeFallthrough());
    static torch::Library composite(torch::Library::IMPL, "ulorl", c10::DispatchKey::CompositeExplicitAutograd,
                                    __FILE__, __LINE__);
    composite.impl("policy_loss", &detail::policy_loss_composite);
    composite.impl("logits_statistics", &detail::logits_statistics_composite);
    composite.impl("agg_loss", &detail::agg_loss_composite);
    composite.impl("kl_penalty", &detail::kl_penalty_composite);
    composite.impl("policy_loss_from_logits", &detail::logits_loss_composite);
    composite.impl("linear_head_policy_loss", &detail::head_loss_composite);
    composite.impl("trl_grpo_loss", &detail::trl_grpo_loss_composite);
    composite.impl("weighted_kl_loss", &detail::weighted_kl_loss_composite);
    return true;
  }();
  return registered;
}

//! Whether a CUDA call that no device kernel of this program takes runs on the CPU on copies of its
//! tensors, its outputs copied back (true; warned once per process), or raises ulorl::error naming
//! the CUDA tensor (false). Until set, automatic: on once register_cuda_ops() (ops_cuda.hpp) has set
//! the device kernels, off in a program without them. Process-wide for the registration of this
//! copy of ulorl; returns the previous effective setting.
inline bool set_host_fallback(bool enabled) {
  const bool previous = detail::host_fallback_on();
  detail::host_fallback_setting.store(enabled ? detail::host_fallback_mode::on : detail::host_fallback_mode::off,
                                      std::memory_order_relaxed);
  return previous;
}
//! The effective setting of set_host_fallback.
[[nodiscard]] inline bool host_fallback() { return detail::host_fallback_on(); }

}  // namespace ops

//! The fused policy loss of one micro-batch (ulorl::policy_loss) through the `ulorl::policy_loss`
//! operator. Token tensors are [B, T] (padded; any strides) or, with extra.offsets, [total]
//! (packed); log-probs float32 or float64, the mask bool, uint8 or any integer or floating dtype (converted
//! to uint8 after a 0/1 check: one byte per token), or undefined: every token of log_prob's layout
//! valid (padded: all B x T, packed: every token inside the offsets), the same bits as an all-ones
//! mask. Gradients flow to `log_prob` and (entropy_coef != 0) `extra.entropy`; every other input is
//! a constant. cfg.normalizer is the step's global normaliser (aggregation.hpp): sum the
//! micro-batch losses, as in ulorl. `result` is decoded from the operator's result tensor (left
//! default for meta tensors, which carry no values).
[[nodiscard]] inline policy_loss_output policy_loss(const at::Tensor& log_prob, const at::Tensor& old_log_prob,
                                                    const at::Tensor& advantages, const at::Tensor& mask,
                                                    const policy_loss_config& cfg,
                                                    const policy_loss_tensors& extra = {}) {
  ops::register_ops();
  const auto opt = ops::detail::optional;
  const std::vector<double> config = encode_fields(cfg);
  auto [loss, result] =
      ops::detail::op<ops::detail::policy_loss_sig>("ulorl::policy_loss")
          .call(log_prob, old_log_prob, advantages, opt(mask), opt(extra.ref_log_prob), opt(extra.weights),
                opt(extra.entropy), opt(extra.offsets), opt(extra.rollout_log_prob), config);
  policy_loss_output out;
  out.loss = loss;
  if (result.device().is_meta()) return out;  // shapes only: no values to decode
  const at::Tensor r = result.to(at::kCPU).contiguous();
  out.result = decode_result(std::span<const double>(r.data_ptr<double>(), encoded_result_size));
  return out;
}

//! The policy loss straight from logits [N, V] (ulorl::policy_loss_from_logits): row i of the
//! logits is token flat_index i of the token layout of old_log_prob (padded: b * T + t). The mask
//! as policy_loss's (undefined: every token of old_log_prob's layout valid). The gradient d loss /
//! d logits is computed in the forward pass and handed to autograd in backward (scaled by the
//! incoming gradient in place): one [N, V] tensor, through the `ulorl::policy_loss_from_logits`
//! operator; or, with opt.in_place, none: the gradient overwrites the logits (an autograd function,
//! not an operator, since it writes into its input).
[[nodiscard]] inline policy_loss_output policy_loss_from_logits(const at::Tensor& logits, const at::Tensor& labels,
                                                                const at::Tensor& old_log_prob,
                                                                const at::Tensor& advantages, const at::Tensor& mask,
                                                                const policy_loss_config& cfg,
                                                                const logits_loss_config& opt = {}) {
  policy_loss_output out;
  if (opt.in_place) {
    const detail::fused_args a{&labels, &old_log_prob, &advantages, &mask, &cfg, &out};
    out.loss = detail::logits_loss_function::apply(logits, &a, &opt);
    return out;
  }
  ops::register_ops();
  const auto o = ops::detail::optional;
  ops::detail::require_no_entropy("policy_loss_from_logits", opt.extra);
  return ops::detail::fused_output(
      ops::detail::op<ops::detail::logits_loss_sig>("ulorl::policy_loss_from_logits")
          .call(logits, labels, old_log_prob, advantages, o(mask), o(opt.extra.ref_log_prob), o(opt.extra.weights),
                o(opt.extra.offsets), o(opt.extra.rollout_log_prob), encode_fields(cfg), opt.logits.temperature,
                opt.logits.check_values, opt.logits.fast_backward),
      cfg);
}

//! The policy loss straight from hidden states [N, H], the unembedding weight [V, H] (torch's
//! nn.Linear layout) and an optional bias [V] (ulorl::policy_loss_from_hidden) through the
//! `ulorl::linear_head_policy_loss` operator: chunks of C rows, never the [N, V] logits; the GEMMs
//! run in libtorch (torch_gemm). The mask as policy_loss_from_logits's (undefined: every token
//! valid). Gradients for whichever of hidden, weight, bias require grad, computed in forward
//! ([N, H], [V, H], [V]) and handed to autograd in backward.
[[nodiscard]] inline policy_loss_output linear_head_policy_loss(const at::Tensor& hidden, const at::Tensor& weight,
                                                                const at::Tensor& bias, const at::Tensor& labels,
                                                                const at::Tensor& old_log_prob,
                                                                const at::Tensor& advantages, const at::Tensor& mask,
                                                                const policy_loss_config& cfg,
                                                                const linear_head_loss_config& opt = {}) {
  ops::register_ops();
  const auto o = ops::detail::optional;
  ops::detail::require_no_entropy("linear_head_policy_loss", opt.extra);
  // A size beyond int64 (the schema's `int`) means "unbounded" as it did as a size_t.
  const auto as_int = [](std::size_t n) {
    return static_cast<std::int64_t>(std::min<std::size_t>(n, std::numeric_limits<std::int64_t>::max()));
  };
  return ops::detail::fused_output(
      ops::detail::op<ops::detail::head_loss_sig>("ulorl::linear_head_policy_loss")
          .call(hidden, weight, o(bias), labels, old_log_prob, advantages, o(mask), o(opt.extra.ref_log_prob),
                o(opt.extra.weights), o(opt.extra.offsets), o(opt.extra.rollout_log_prob), encode_fields(cfg),
                opt.head.temperature, opt.head.check_values, opt.head.fast_backward, as_int(opt.head.chunk_rows),
                as_int(opt.head.workspace_budget)),
      cfg);
}

//! Per-row log-prob and entropy of logits [N, V] / temperature at labels [N] (int64 or int32,
//! contiguous), through the `ulorl::logits_statistics` operator. Logits float32, float64, bfloat16 or
//! float16, any strides, no copy; outputs [N] in the logits' dtype (16-bit ones rounded once from the
//! float32 accumulation). Backward:
//! logits_backward (one read of the logits, one write of the gradient) from the saved O(N)
//! statistics.
[[nodiscard]] inline std::pair<at::Tensor, at::Tensor> logits_statistics(const at::Tensor& logits,
                                                                         const at::Tensor& labels,
                                                                         const logits_config& cfg = {}) {
  ops::register_ops();
  auto [lp, ent] = ops::detail::op<ops::detail::logits_statistics_sig>("ulorl::logits_statistics")
                       .call(logits, labels, cfg.temperature, cfg.check_values, cfg.fast_backward);
  return {lp, ent};
}
[[nodiscard]] inline std::pair<at::Tensor, at::Tensor> logits_statistics(const at::Tensor& logits,
                                                                         const at::Tensor& labels, double temperature) {
  return logits_statistics(logits, labels, logits_config{.temperature = temperature});
}

//! The aggregated loss of a token matrix (ulorl::agg_loss: scale · Σ L m / D_b) through the
//! `ulorl::agg_loss` operator: `loss_mat` [B, T] (any strides) or [total] with `offsets`, float32
//! or float64; `mask` as policy_loss's (undefined: every token valid). A 0-dim tensor of
//! loss_mat's dtype, differentiable in loss_mat (once).
[[nodiscard]] inline at::Tensor agg_loss(const at::Tensor& loss_mat, const at::Tensor& mask, const agg_normalizer& norm,
                                         const at::Tensor& offsets = {}) {
  ops::register_ops();
  const auto opt = ops::detail::optional;
  return ops::detail::op<ops::detail::agg_loss_sig>("ulorl::agg_loss")
      .call(loss_mat, opt(mask), opt(offsets), encode_fields(norm));
}

//! The element-wise KL estimate of log_prob against ref_log_prob (ulorl::kl_penalty, every element,
//! no mask) through the `ulorl::kl_penalty` operator: a tensor of log_prob's shape and dtype,
//! differentiable in log_prob (once); ref_log_prob is a constant.
[[nodiscard]] inline at::Tensor kl_penalty(const at::Tensor& log_prob, const at::Tensor& ref_log_prob,
                                           const kl_config& cfg, const at::Tensor& offsets = {}) {
  ops::register_ops();
  return ops::detail::op<ops::detail::kl_penalty_sig>("ulorl::kl_penalty")
      .call(log_prob, ref_log_prob, ops::detail::optional(offsets), encode_fields(cfg));
}

//! The importance-weighted reference-KL term (ulorl::weighted_kl_loss: β Σ_b w_b Σ_t K m) through
//! the `ulorl::weighted_kl_loss` operator: a 0-dim tensor of log_prob's dtype, differentiable
//! (once) in log_prob; ref_log_prob and rollout_log_prob (read with the rollout_policy weight) are
//! constants. The mask as policy_loss's (undefined: every token valid).
[[nodiscard]] inline at::Tensor weighted_kl_loss(const at::Tensor& log_prob, const at::Tensor& ref_log_prob,
                                                 const at::Tensor& rollout_log_prob, const at::Tensor& mask,
                                                 const weighted_kl_config& cfg, const agg_normalizer& norm,
                                                 const at::Tensor& offsets = {}) {
  ops::register_ops();
  const auto opt = ops::detail::optional;
  return ops::detail::op<ops::detail::weighted_kl_loss_sig>("ulorl::weighted_kl_loss")
      .call(log_prob, ref_log_prob, opt(rollout_log_prob), opt(mask), opt(offsets), encode_fields(cfg),
            encode_fields(norm));
}

//! TRL's optional tensors of trl_grpo_loss (undefined: absent), by TRL's names.
struct trl_grpo_loss_tensors {
  at::Tensor completion_mask{};            //!< bool, uint8 or the log-probs' dtype; absent: every token valid
  at::Tensor ref_per_token_logps{};        //!< required when beta != 0
  at::Tensor sampling_per_token_logps{};   //!< the off-policy mask's behaviour log-probs (absent: old)
  at::Tensor entropies{};                  //!< the top-entropy mask and the entropy bonus (differentiated)
  at::Tensor importance_sampling_ratio{};  //!< vLLM's ratio, [B, T] or [B, 1]
};
//! TRL's GRPO loss of one micro-batch (presets::trl::grpo_loss: GRPOTrainer._compute_loss) through
//! the `ulorl::trl_grpo_loss` operator: padded [B, T] log-probs (float32 or float64), advantages
//! [B]. `loss` is 0-dim, differentiable (once) in per_token_logps and, with an entropy bonus, in
//! extra.entropies; `result` is decoded from the operator's result tensor (left default for meta
//! tensors).
struct trl_grpo_loss_output {
  at::Tensor loss;
  presets::trl::grpo_loss_result result;
};
[[nodiscard]] inline trl_grpo_loss_output trl_grpo_loss(const at::Tensor& per_token_logps,
                                                        const at::Tensor& old_per_token_logps,
                                                        const at::Tensor& advantages,
                                                        const presets::trl::grpo_loss_options& options,
                                                        const trl_grpo_loss_tensors& extra = {}) {
  ops::register_ops();
  const auto opt = ops::detail::optional;
  auto [loss, result] = ops::detail::op<ops::detail::trl_grpo_loss_sig>("ulorl::trl_grpo_loss")
                            .call(per_token_logps, old_per_token_logps, advantages, opt(extra.completion_mask),
                                  opt(extra.ref_per_token_logps), opt(extra.sampling_per_token_logps),
                                  opt(extra.entropies), opt(extra.importance_sampling_ratio), encode_fields(options));
  trl_grpo_loss_output out{loss, {}};
  if (result.device().is_meta()) return out;
  const at::Tensor r = result.to(at::kCPU).contiguous();
  out.result = decode_fields<presets::trl::grpo_loss_result>(
      "trl_grpo_loss", "result", std::span<const double>(r.data_ptr<double>(), static_cast<std::size_t>(r.numel())));
  return out;
}

}  // namespace th

ULORL_NAMESPACE_END
