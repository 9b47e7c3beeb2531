// python/src/losses.cpp — the tensor functions of ulorl::th without logits: the registration of the
// `ulorl` torch operators with the encodings of the policy loss's configuration and result, batch
// counts, group advantages and their token broadcast, DAPO's dynamic sampling filter and UloRL's
// MPT mask. Every check is the adapter's (ulorl::error, raised before
// any output exists).
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>

#include <ulorl/adapters/torch.hpp>
#include <ulorl/advantage/fields.hpp>
#include <ulorl/loss/aggregation.hpp>
#include <ulorl/loss/fields.hpp>
#include <ulorl/masking/fields.hpp>

#include "common.hpp"

namespace ulorl_py {

namespace {

using namespace pybind11::literals;
namespace th = ulorl::th;
using opt_tensor = std::optional<at::Tensor>;

using th::or_undefined;

}  // namespace

}  // namespace ulorl_py

#if defined(ULORL_PY_ISA_KERNELS)
// kernels_avx2.cpp and kernels_avx512.cpp (x86-64 only): the policy-loss kernels of the extension's
// pairs and the logits kernels of the adapter's element types, once per wider instruction set.
#include "kernels_isa.hpp"
#endif

namespace ulorl_py {
namespace {
//! The instruction sets whose kernels the extension may install, narrowest first ("default": the
//! default build's own); ULORL_PYTHON_ISA names one of them.
constexpr std::string_view isa_names[] = {"default", "avx2", "avx512"};

//! Whether this CPU (and its operating system) runs the kernels of instruction set `isa`.
bool cpu_runs([[maybe_unused]] std::string_view isa) {
#if defined(ULORL_PY_ISA_KERNELS)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == "avx2") return avx2;
  if (isa == "avx512")
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  return isa == "default";
}

//! The instruction set to install at import: the widest this CPU runs, or at most the one
//! ULORL_PYTHON_ISA names (default, avx2 or avx512; another value is ulorl::error naming it).
std::string_view chosen_isa() {
  const char* env = std::getenv("ULORL_PYTHON_ISA");
  std::size_t limit = std::size(isa_names) - 1;
  if (env != nullptr) {
    const auto it = std::find(std::begin(isa_names), std::end(isa_names), std::string_view(env));
    if (it == std::end(isa_names)) {
      std::string known;
      for (const std::string_view n : isa_names) known += (known.empty() ? "" : ", ") + std::string(n);
      ulorl::detail::fail(
          "install_kernels", "ULORL_PYTHON_ISA",
          "is '" + std::string(env) + "'; known: " + known + " (the widest instruction set to install)");
    }
    limit = static_cast<std::size_t>(it - std::begin(isa_names));
  }
  for (std::size_t i = limit; i > 0; --i)
    if (cpu_runs(isa_names[i])) return isa_names[i];
  return isa_names[0];
}

#if defined(ULORL_PY_ISA_KERNELS)
template <class Tag>
void install_kernels_of() {
#define ULORL_PY_INSTALL_(OP, ...) ulorl::install_kernel_of<Tag, ulorl::isa_op::OP, __VA_ARGS__>();
  ULORL_PY_ISA_KERNEL_LIST(ULORL_PY_INSTALL_)
#undef ULORL_PY_INSTALL_
}
#endif

//! Run-time instruction-set dispatch of the policy-loss and logits kernels (kernels_isa.hpp):
//! installs the kernels of `isa` (the default build's stay for "default") and returns it.
std::string install_kernels(std::string_view isa) {
#if defined(ULORL_PY_ISA_KERNELS)
  if (isa == "avx512") install_kernels_of<ulorl_py_avx512>();
  if (isa == "avx2") install_kernels_of<ulorl_py_avx2>();
#endif
  return std::string(isa);
}
}  // namespace

#if defined(ULORL_PY_CUDA)
void register_cuda_kernels();  // ops_cuda.cpp
#endif

template <class... R>
struct record_list {};
template <class R>
struct record_tag {
  using type = R;
};
//! f(record_tag<R>) for the record R of `lists` whose record_name is `name`; ulorl::error listing the names otherwise.
template <class F, class... R>
auto for_record(const std::string& name, F f, record_list<R...>) {
  using out = decltype(f(record_tag<std::tuple_element_t<0, std::tuple<R...>>>{}));
  std::optional<out> r;
  ((!r && ulorl::record_name<R> == name ? (r = f(record_tag<R>{}), 0) : 0), ...);
  if (r) return *r;
  std::string known;
  ((known += (known.empty() ? "" : ", ") + std::string(ulorl::record_name<R>)), ...);
  ulorl::detail::fail("record_fields", "record", "unknown record '" + name + "' (known: " + known + ")");
}

void bind_losses(py::module_& m) {
  const std::string isa = install_kernels(chosen_isa());
  m.attr("policy_loss_isa") = isa;
  m.attr("logits_isa") = isa;
  m.def(
      "count_batch",
      [](const opt_tensor& mask, const opt_tensor& offsets, const opt_tensor& tokens) {
        return th::count_batch(or_undefined(mask), or_undefined(offsets), or_undefined(tokens));
      },
      "mask"_a = py::none(), "offsets"_a = py::none(), py::kw_only(), "tokens"_a = py::none(),
      "Valid tokens, non-empty rows and rows of a 0/1 mask ([B, T], or [total] with offsets[B+1]); checked to be "
      "0/1. With tokens= (a float32 / float64 token tensor of the batch, e.g. its log-probs) the mask may be None: "
      "every token of that layout valid (a given mask must then have its shape). Sum the counts of every "
      "micro-batch and rank of a step (all-reduce) and build the step's normaliser with global_normalizer.");

  // The operators (torch.ops.ulorl.*) and the encodings their Python wrappers use.
  ulorl::th::ops::register_ops();
#if defined(ULORL_PY_CUDA)
  register_cuda_kernels();
  m.attr("cuda_kernels") = true;
#else
  m.attr("cuda_kernels") = false;
#endif
  m.def("set_host_fallback", &ulorl::th::ops::set_host_fallback, "enabled"_a,
        "Whether a CUDA call that no device kernel of this build takes runs on the CPU on copies of its tensors, "
        "its outputs copied back to the device (True; the call waits for the device, and the first such call "
        "warns), or raises ulorl.Error naming the CUDA tensor (False). Until set: True in a build with the CUDA "
        "kernels (cuda_kernels), False in one without. Returns the previous setting.");
  m.def("host_fallback", &ulorl::th::ops::host_fallback, "The setting of set_host_fallback now.");
  m.def(
      "_policy_loss",
      [](const at::Tensor& log_prob, const at::Tensor& old_log_prob, const at::Tensor& advantages,
         const opt_tensor& mask, const ulorl::policy_loss_config& cfg, const opt_tensor& ref_log_prob,
         const opt_tensor& weights, const opt_tensor& entropy, const opt_tensor& offsets,
         const opt_tensor& rollout_log_prob) {
        const th::policy_loss_tensors extra{or_undefined(ref_log_prob), or_undefined(weights), or_undefined(entropy),
                                            or_undefined(offsets), or_undefined(rollout_log_prob)};
        th::policy_loss_output out;
        {
          const py::gil_scoped_release nogil;
          out = th::policy_loss(log_prob, old_log_prob, advantages, or_undefined(mask), cfg, extra);
        }
        return py::make_tuple(out.loss, out.result);
      },
      "log_prob"_a, "old_log_prob"_a, "advantages"_a, "mask"_a, "config"_a, "ref_log_prob"_a = py::none(),
      "weights"_a = py::none(), "entropy"_a = py::none(), "offsets"_a = py::none(), "rollout_log_prob"_a = py::none(),
      "th::policy_loss: the operator ulorl::policy_loss called from C++ (no argument boxing), the result decoded.");
  m.def(
      "encode_fields", [](const ulorl::policy_loss_config& cfg) { return ulorl::encode_fields(cfg); }, "config"_a,
      "The configuration as the `float[] config` argument of torch.ops.ulorl.policy_loss (ulorl::encode_fields).");
  m.def(
      "encode_fields", [](const ulorl::agg_normalizer& n) { return ulorl::encode_fields(n); }, "normalizer"_a,
      "The normaliser as the `float[] normalizer` argument of torch.ops.ulorl.agg_loss (ulorl::encode_fields).");
  m.def(
      "decode_result",
      [](const at::Tensor& result) {
        constexpr std::string_view fn = "decode_result";
        const at::Tensor r = result.to(at::kCPU).contiguous();
        th::detail::require_dtype(fn, "result", r, c10::ScalarType::Double);
        if (r.dim() != 1 || r.size(0) != static_cast<std::int64_t>(ulorl::encoded_result_size))
          ulorl::detail::fail(fn, "result",
                              "has shape " + th::detail::sizes_str(r) + " but must be [" +
                                  std::to_string(ulorl::encoded_result_size) +
                                  "] (torch.ops.ulorl.policy_loss's result)");
        return ulorl::decode_result(std::span<const double>(r.data_ptr<double>(), ulorl::encoded_result_size));
      },
      "result"_a, "The PolicyLossResult of the result tensor of torch.ops.ulorl.policy_loss (ulorl::decode_result).");
  // Every record an operator carries, by its record_name: the names and default values of its encoding.
  const auto by_name = [](const std::string& name, auto f) {
    using namespace ulorl;
    return for_record(
        name, f,
        record_list<policy_loss_config, kl_config, agg_normalizer, policy_loss_result, rollout_correction::config,
                    rollout_correction::statistics, group_advantage_config, broadcast_config, dynamic_sampling_config,
                    dynamic_sampling_result, gpg_config, reinforce_plus_plus_baseline_config, multi_reward_config,
                    optimal_token_baseline_config, mpt_config, mpt_stats, off_policy_mask_config, off_policy_mask_stats,
                    dapo_overlong_config, soft_overlong_config, gae_config, pass_at_k_config, dppo_config,
                    kl_cov_config, clip_cov_config, token_selection_stats, weighted_kl_config,
                    presets::trl::grpo_loss_options, presets::trl::grpo_loss_result,
                    presets::nemo_rl::clipped_pg_loss_options, presets::nemo_rl::ratio_metrics>{});
  };
  m.def(
      "record_fields",
      [by_name](const std::string& name) {
        return by_name(name, [](auto tag) { return ulorl::field_names<typename decltype(tag)::type>(); });
      },
      "record"_a,
      "The names of the doubles of an encoded record (a `float[] config` argument or a result tensor of "
      "torch.ops.ulorl), "
      "in order (ulorl::field_names).");
  m.def(
      "record_defaults",
      [by_name](const std::string& name) {
        return by_name(name, [](auto tag) { return ulorl::encode_fields(typename decltype(tag)::type{}); });
      },
      "record"_a, "The encoding of a record's default value (ulorl::encode_fields), record_fields' order.");
  m.def("config_fields", &ulorl::field_names<ulorl::policy_loss_config>,
        "The fields of a PolicyLossConfig one per encoded double, in order (ulorl::field_names).");
  m.def("result_fields", &ulorl::field_names<ulorl::policy_loss_result>,
        "The numbers of the result tensor of torch.ops.ulorl.policy_loss, in order (ulorl::field_names).");

  m.def(
      "_group_advantages",
      [](const at::Tensor& rewards, const opt_tensor& group_ids, std::optional<std::int64_t> group_size,
         const ulorl::advantage_preset& preset) {
        return th::group_advantages(rewards, th::group_spec(or_undefined(group_ids), group_size), preset.group);
      },
      "rewards"_a, "group_ids"_a, "group_size"_a, "preset"_a);
  m.def(
      "_broadcast_to_tokens",
      [](const at::Tensor& advantages, const opt_tensor& mask, const ulorl::advantage_preset& preset,
         const opt_tensor& offsets) {
        return th::broadcast_to_tokens(advantages, or_undefined(mask), preset.broadcast, or_undefined(offsets));
      },
      "advantages"_a, "mask"_a, "preset"_a, "offsets"_a = py::none());

  m.def(
      "_dynamic_sampling_filter",
      [](const at::Tensor& metric, const at::Tensor& group_ids, bool drop_zero_variance, double min_accuracy,
         double max_accuracy, bool use_window) {
        const ulorl::dynamic_sampling_config cfg{.drop_zero_variance = drop_zero_variance,
                                                 .min_accuracy = min_accuracy,
                                                 .max_accuracy = max_accuracy,
                                                 .use_window = use_window};
        const auto [keep, r] = th::dynamic_sampling_filter(metric, group_ids, cfg);
        return py::make_tuple(
            keep, py::dict("groups"_a = r.groups, "kept_groups"_a = r.kept_groups,
                           "zero_variance_groups"_a = r.zero_variance_groups,
                           "outside_window_groups"_a = r.outside_window_groups, "kept_responses"_a = r.kept_responses));
      },
      "metric"_a, "group_ids"_a, "drop_zero_variance"_a, "min_accuracy"_a, "max_accuracy"_a, "use_window"_a);

  m.def(
      "_mpt_mask",
      [](const opt_tensor& log_prob, const opt_tensor& old_log_prob, const at::Tensor& entropy, const opt_tensor& mask,
         const at::Tensor& response_score, const opt_tensor& offsets, const std::string& mode, double tau, double sigma,
         const std::string& positive, double positive_reward, const std::string& probability,
         const std::string& scope) {
        constexpr std::string_view fn = "mpt_mask";
        ulorl::mpt_config cfg;
        cfg.mode = parse_name<ulorl::mpt_mode>(fn, "mode", mode,
                                               {{"off", ulorl::mpt_mode::off},
                                                {"static", ulorl::mpt_mode::static_mask},
                                                {"dynamic", ulorl::mpt_mode::dynamic_mask}});
        cfg.tau = tau, cfg.sigma = sigma, cfg.positive_reward = positive_reward;
        cfg.positive = parse_name<ulorl::mpt_positive>(
            fn, "positive", positive,
            {{"reward", ulorl::mpt_positive::reward}, {"advantage", ulorl::mpt_positive::advantage}});
        cfg.probability = parse_name<ulorl::mpt_probability>(
            fn, "probability", probability,
            {{"current", ulorl::mpt_probability::current}, {"rollout", ulorl::mpt_probability::rollout}});
        cfg.scope = parse_name<ulorl::mpt_entropy_scope>(
            fn, "scope", scope,
            {{"response", ulorl::mpt_entropy_scope::response}, {"batch", ulorl::mpt_entropy_scope::batch}});
        const th::mpt_tensors t{or_undefined(log_prob), or_undefined(old_log_prob), entropy, or_undefined(mask),
                                response_score,         or_undefined(offsets)};
        const auto [keep, st] = th::mpt_mask(t, cfg);
        return py::make_tuple(
            keep, py::dict("responses"_a = st.responses, "tokens"_a = st.tokens,
                           "positive_responses"_a = st.positive_responses, "mpt_tokens"_a = st.mpt_tokens,
                           "masked_tokens"_a = st.masked_tokens, "responses_below_target"_a = st.responses_below_target,
                           "batch_below_target"_a = st.batch_below_target, "mean_entropy"_a = st.mean_entropy,
                           "mpt_fraction"_a = st.mpt_fraction(), "masked_fraction"_a = st.masked_fraction()));
      },
      "log_prob"_a, "old_log_prob"_a, "entropy"_a, "mask"_a, "response_score"_a, "offsets"_a, "mode"_a, "tau"_a,
      "sigma"_a, "positive"_a, "positive_reward"_a, "probability"_a, "scope"_a);
}

}  // namespace ulorl_py
