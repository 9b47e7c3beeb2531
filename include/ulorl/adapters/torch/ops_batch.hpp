// ulorl/adapters/torch/ops_batch.hpp — the batch functions around the policy loss as operators of
// the `ulorl` torch library (ops.hpp registers them with the loss operators): advantages, token
// broadcast, masks, filters and the rollout correction. None is differentiable: rewards,
// advantages, weights and masks are constants of the loss (autograd passes the operators by and
// their outputs never require grad). Kernels: CPU (ulorl's functions on views of the tensors) and
// Meta (shapes and dtypes, so FakeTensor and torch.compile trace through); on CUDA tensors the CPU
// kernels on copies (ops.hpp's host path). Schemas (`config` is encode_fields of the named record, a `counts`
// / `stats` / `statistics` output one float64 tensor of a result record, field_names' order):
//   group_advantages(rewards, group_ids?, group_size?, config: group_advantage_config) -> [B]
//   broadcast_to_tokens(advantages, mask?, offsets?, config: broadcast_config) -> mask's shape
//   dynamic_sampling_filter(metric, group_ids?, group_size?, config) -> (keep [B] bool, counts)
//   mpt_mask(log_prob?, old_log_prob?, entropy, mask?, response_score, offsets?, config)
//       -> (keep, stats: mpt_stats)
//   off_policy_mask(log_prob, old_log_prob, advantages, mask?, offsets?, config)
//       -> (keep, seq_kl [rows] float64, stats: off_policy_mask_stats)
//   rollout_correction(old_log_prob, rollout_log_prob, mask?, offsets?, config: rollout_correction::config)
//       -> (weights, keep, statistics: rollout_correction::statistics)
//   gpg_advantages(scores, group_ids?, group_size?, config: gpg_config) -> [B]
//   opo_advantages(scores, mask, group_ids?, group_size?, offsets?) -> [B]
//   reinforce_plus_plus_advantages(token_level_rewards, mask?, offsets?, gamma, scan) -> (advantages, returns)
//   reinforce_plus_plus_baseline_advantages(scores, group_ids?, group_size?, mask, offsets?, config) -> mask's shape
//   gae_advantages(token_level_rewards, values, mask?, offsets?, config: gae_config) -> (advantages, returns)
//   remax_advantages(token_level_rewards, reward_baselines [B], mask?, offsets?) -> (advantages, returns)
//   pass_at_k_advantages(scores, group_ids?, group_size?, config: pass_at_k_config) -> [B]
//   multi_reward_advantages(reward_components, reward_weights, group_ids?, group_size?, mask, offsets?,
//       config: multi_reward_config) -> mask's shape
//   optimal_token_baseline_advantages(token_level_rewards, mask?, group_ids, old_log_prob?,
//       sum_pi_squared?, rollout_is_weights?, offsets?, config) -> (advantages, returns)
//   dppo_weights(old_log_prob, log_prob, advantages, mask?, rollout_is_weights?, offsets?,
//       config: dppo_config) -> (weights, stats: token_selection_stats)
//   kl_cov_selection(old_log_prob, log_prob, advantages, mask?, offsets?, config: kl_cov_config)
//       -> (selected, stats: token_selection_stats)
//   clip_cov_weights(old_log_prob, log_prob, advantages, mask?, clip_cov_selection,
//       rollout_is_weights?, offsets?, config: clip_cov_config) -> (weights, stats)
//       (loss/token_selection.hpp; the outputs in log_prob's shape and dtype)
//   dapo_overlong_penalties(lengths, config: dapo_overlong_config) -> [B] float64
//   soft_overlong_penalties(lengths, config: soft_overlong_config) -> [B] float64
//       (advantage/overlong.hpp; lengths [B] int64, int32, float32 or float64)
//   logits_statistics_torch_rounding(logits [N, V] bf16 | f16, labels [N, K]) -> (log_prob [N, K], entropy [N])
//       (logits/torch_rounding.hpp: torch's CPU rounding steps, for the frameworks' 16-bit values)
//   count_batch(mask?, offsets?, tokens?) -> counts (batch_counts: tokens, sequences, rows)
//   logits_statistics_float64(logits [N, V], labels [N], temperature, check_values)
//       -> (log_prob, entropy, lse) float64 [N] (logits/forward.hpp, no autograd)
//   nemo_rl_logged_ratios(log_prob, old_log_prob, mask?, offsets?, options: clipped_pg_loss_options,
//       global_valid_toks?) -> ratios (ratio_metrics: probs_ratio, probs_ratio_clamped;
//       presets/nemo_rl.hpp)
// Groups are group_ids [B] (int64 / int32, any ids >= 0) or contiguous blocks of group_size, one of
// the two. Token tensors are [B, T] (any strides) or [total] with offsets [B + 1]; masks bool,
// uint8 or the values' dtype (checked 0/1); an absent mask means every token valid.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ulorl/adapters/torch/autograd.hpp"
#include "ulorl/adapters/torch/tensor_views.hpp"
#include "ulorl/advantage/fields.hpp"
#include "ulorl/advantage/groups.hpp"
#include "ulorl/advantage/remax.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/fields.hpp"
#include "ulorl/logits/forward.hpp"
#include "ulorl/logits/torch_rounding.hpp"
#include "ulorl/loss/fields.hpp"
#include "ulorl/loss/rollout_correction.hpp"
#include "ulorl/masking/fields.hpp"
#include "ulorl/presets/nemo_rl.hpp"

ULORL_NAMESPACE_BEGIN

namespace th {

namespace ops {

//! The batch operators' schemas (registered by register_ops(), ops.hpp).
[[nodiscard]] inline std::vector<std::string> batch_schemas() {
  return {"group_advantages(Tensor rewards, Tensor? group_ids, int? group_size, float[] config) -> Tensor",
          "broadcast_to_tokens(Tensor advantages, Tensor? mask, Tensor? offsets, float[] config) -> Tensor",
          "dynamic_sampling_filter(Tensor metric, Tensor? group_ids, int? group_size, float[] config) "
          "-> (Tensor keep, Tensor counts)",
          "mpt_mask(Tensor? log_prob, Tensor? old_log_prob, Tensor entropy, Tensor? mask, Tensor response_score, "
          "Tensor? offsets, float[] config) -> (Tensor keep, Tensor stats)",
          "off_policy_mask(Tensor log_prob, Tensor old_log_prob, Tensor advantages, Tensor? mask, Tensor? offsets, "
          "float[] config) -> (Tensor keep, Tensor seq_kl, Tensor stats)",
          "rollout_correction(Tensor old_log_prob, Tensor rollout_log_prob, Tensor? mask, Tensor? offsets, "
          "float[] config) -> (Tensor weights, Tensor keep, Tensor statistics)",
          "gpg_advantages(Tensor scores, Tensor? group_ids, int? group_size, float[] config) -> Tensor",
          "opo_advantages(Tensor scores, Tensor mask, Tensor? group_ids, int? group_size, Tensor? offsets) -> Tensor",
          "reinforce_plus_plus_advantages(Tensor token_level_rewards, Tensor? mask, Tensor? offsets, float gamma, "
          "str scan='reset_after_eos') -> (Tensor advantages, Tensor returns)",
          "reinforce_plus_plus_baseline_advantages(Tensor scores, Tensor? group_ids, int? group_size, Tensor mask, "
          "Tensor? offsets, float[] config) -> Tensor",
          "gae_advantages(Tensor token_level_rewards, Tensor values, Tensor? mask, Tensor? offsets, float[] config) "
          "-> (Tensor advantages, Tensor returns)",
          "remax_advantages(Tensor token_level_rewards, Tensor reward_baselines, Tensor? mask, Tensor? offsets) "
          "-> (Tensor advantages, Tensor returns)",
          "pass_at_k_advantages(Tensor scores, Tensor? group_ids, int? group_size, float[] config) -> Tensor",
          "multi_reward_advantages(Tensor reward_components, float[] reward_weights, Tensor? group_ids, "
          "int? group_size, Tensor mask, Tensor? offsets, float[] config) -> Tensor",
          "optimal_token_baseline_advantages(Tensor token_level_rewards, Tensor? mask, Tensor group_ids, "
          "Tensor? old_log_prob, Tensor? sum_pi_squared, Tensor? rollout_is_weights, Tensor? offsets, float[] config) "
          "-> (Tensor advantages, Tensor returns)",
          "dppo_weights(Tensor old_log_prob, Tensor log_prob, Tensor advantages, Tensor? mask, "
          "Tensor? rollout_is_weights, Tensor? offsets, float[] config) -> (Tensor weights, Tensor stats)",
          "kl_cov_selection(Tensor old_log_prob, Tensor log_prob, Tensor advantages, Tensor? mask, Tensor? offsets, "
          "float[] config) -> (Tensor selected, Tensor stats)",
          "clip_cov_weights(Tensor old_log_prob, Tensor log_prob, Tensor advantages, Tensor? mask, "
          "Tensor clip_cov_selection, Tensor? rollout_is_weights, Tensor? offsets, float[] config) "
          "-> (Tensor weights, Tensor stats)",
          "dapo_overlong_penalties(Tensor lengths, float[] config) -> Tensor",
          "soft_overlong_penalties(Tensor lengths, float[] config) -> Tensor",
          "logits_statistics_torch_rounding(Tensor logits, Tensor labels) -> (Tensor log_prob, Tensor entropy)",
          "count_batch(Tensor? mask, Tensor? offsets, Tensor? tokens) -> Tensor",
          "logits_statistics_float64(Tensor logits, Tensor labels, float temperature=1.0, bool check_values=True) "
          "-> (Tensor log_prob, Tensor entropy, Tensor lse)",
          "nemo_rl_logged_ratios(Tensor log_prob, Tensor old_log_prob, Tensor? mask, Tensor? offsets, float[] options, "
          "float? global_valid_toks) -> Tensor"};
}

namespace detail {

using opt_tensor = c10::optional<at::Tensor>;
using opt_int = c10::optional<std::int64_t>;
using th::detail::byte_mask;
using th::detail::require_cpu;
using th::detail::value_dtype;
using th::detail::with_token_type;
using th::detail::with_value_dtype;
using ulorl::detail::fail;

inline at::Tensor given(const opt_tensor& t) { return t.has_value() ? *t : at::Tensor(); }

template <class R>
R record_of(std::string_view fn, c10::ArrayRef<double> config) {
  return decode_fields<R>(fn, "config", std::span<const double>(config.data(), config.size()));
}

//! A result record as one float64 tensor [encoded_size_of<R>] (field_names<R>' order).
template <class R>
at::Tensor record_tensor(const R* r) {
  at::Tensor t = at::empty({static_cast<std::int64_t>(encoded_size_of<R>)}, at::TensorOptions().dtype(at::kDouble));
  if (r) encode_fields_into(*r, std::span<double>(t.data_ptr<double>(), encoded_size_of<R>));
  return t;
}
template <class R>
at::Tensor meta_record_tensor() {
  return at::empty({static_cast<std::int64_t>(encoded_size_of<R>)},
                   at::TensorOptions().dtype(at::kDouble).device(at::kMeta));
}

//! A per-response tensor's length B (1-D), for the Meta kernels.
inline std::int64_t responses_of(std::string_view fn, std::string_view arg, const at::Tensor& t) {
  if (t.dim() != 1) fail(fn, arg, "must be 1-D [B] (got " + std::to_string(t.dim()) + " dimensions)");
  return t.size(0);
}

//! The mask dtype of a keep mask written like the given mask: its dtype (bool without one).
inline c10::ScalarType keep_dtype(const at::Tensor& mask) {
  return mask.defined() ? mask.scalar_type() : c10::ScalarType::Bool;
}

//! Groups by ids [B] (int64 / int32) or contiguous blocks of group_size (one of the two).
inline group_layout groups_of(std::string_view fn, std::size_t responses, const opt_tensor& ids, opt_int group_size) {
  if (ids.has_value() && group_size.has_value()) fail(fn, "group_size", "give group_ids or group_size, not both");
  if (ids.has_value()) {
    const at::Tensor& t = *ids;
    require_cpu(fn, "group_ids", t, 1);
    if (t.scalar_type() == c10::ScalarType::Long)
      return group_layout::from_ids(span_of<const std::int64_t>(fn, "group_ids", t), fn, "group_ids");
    if (t.scalar_type() == c10::ScalarType::Int)
      return group_layout::from_ids(span_of<const std::int32_t>(fn, "group_ids", t), fn, "group_ids");
    fail(fn, "group_ids", std::string("has dtype ") + c10::toString(t.scalar_type()) + " but must be int64 or int32");
  }
  if (!group_size.has_value()) fail(fn, "group_ids", "required (or group_size for contiguous groups of that size)");
  if (*group_size < 1) ulorl::detail::fail_value(fn, "group_size", *group_size, "must be >= 1");
  return group_layout::fixed(responses, static_cast<std::size_t>(*group_size), fn, "group_size");
}
//! The Meta kernels' group checks: what can be checked without values.
inline void meta_groups(std::string_view fn, const opt_tensor& ids, opt_int group_size) {
  if (ids.has_value() && group_size.has_value()) fail(fn, "group_size", "give group_ids or group_size, not both");
  if (!ids.has_value() && !group_size.has_value())
    fail(fn, "group_ids", "required (or group_size for contiguous groups of that size)");
  if (group_size.has_value() && *group_size < 1)
    ulorl::detail::fail_value(fn, "group_size", *group_size, "must be >= 1");
}

//! A 0/1 mask read as bytes (bool / uint8 as they are; a mask of any other integer or floating
//! dtype checked 0/1 and converted: byte_mask): `view` is empty for an absent mask (every token valid).
struct mask_bytes {
  at::Tensor bytes;
  token_view<const std::uint8_t> view{};
};
template <class T, class U>
mask_bytes optional_mask_of(std::string_view fn, std::string_view arg, const at::Tensor& m, const offsets_view& off,
                            std::string_view ref_name, const token_view<U>& ref) {
  mask_bytes r;
  if (!m.defined()) return r;
  r.bytes = byte_mask<T>(fn, arg, m, off);
  r.view = optional_tokens_of<const std::uint8_t>(fn, arg, r.bytes, off, ref_name, ref);
  return r;
}
//! A required mask that is the layout of the call (its result has the mask's shape).
template <class T>
mask_bytes mask_of(std::string_view fn, std::string_view arg, const at::Tensor& m, const offsets_view& off) {
  mask_bytes r;
  r.bytes = byte_mask<T>(fn, arg, m, off);
  r.view = tokens_of<const std::uint8_t>(fn, arg, r.bytes, off);
  return r;
}

//! A new CPU tensor of `sizes` and dtype (never requiring grad).
inline at::Tensor new_tensor(at::IntArrayRef sizes, c10::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype));
}
inline at::Tensor new_meta(at::IntArrayRef sizes, c10::ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).device(at::kMeta));
}

//! A per-response function of scores [B] over groups, -> [B] in the scores' dtype:
//! f(std::span<const T> scores, const group_layout&, std::span<T> out).
template <bool Meta, class F>
at::Tensor per_response(std::string_view fn, std::string_view arg, const at::Tensor& scores,
                        const opt_tensor& group_ids, opt_int group_size, F&& f) {
  if constexpr (Meta) {
    meta_groups(fn, group_ids, group_size);
    return new_meta({responses_of(fn, arg, scores)}, value_dtype(fn, arg, scores));
  } else {
    return with_value_dtype(fn, arg, scores, [&](auto tag) {
      using T = decltype(tag);
      const auto s = span_of<const T>(fn, arg, scores);
      const group_layout g = groups_of(fn, s.size(), group_ids, group_size);
      at::Tensor out = new_tensor({scores.size(0)}, scores.scalar_type());
      f(s, g, span_of<T>(fn, "out", out));
      return out;
    });
  }
}

// ---- group statistics, broadcast, filters -------------------------------------------------------------

template <bool Meta>
at::Tensor group_advantages(const at::Tensor& rewards, const opt_tensor& group_ids, opt_int group_size,
                            c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "group_advantages";
  const auto cfg = record_of<group_advantage_config>(fn, config);
  return per_response<Meta>(fn, "rewards", rewards, group_ids, group_size,
                            [&](auto s, const group_layout& g, auto out) { ulorl::group_advantages(s, g, out, cfg); });
}

template <bool Meta>
at::Tensor broadcast_to_tokens(const at::Tensor& advantages, const opt_tensor& mask_, const opt_tensor& offsets,
                               c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "broadcast_to_tokens";
  const auto cfg = record_of<broadcast_config>(fn, config);
  const at::Tensor mask = given(mask_);
  const bool packed = offsets.has_value() && offsets->defined();
  if (!mask.defined() && !packed)
    fail(fn, "mask",
         "is undefined without offsets: the padded layout takes its [B, T] shape from the mask "
         "(an absent mask means every token valid only in the packed layout, with offsets)");
  if constexpr (Meta) {
    if (!mask.defined())
      fail(fn, "mask", "is required for a shape-only (meta) call: without it the result's size is the last offset");
    return new_meta(mask.sizes(), value_dtype(fn, "advantages", advantages));
  } else {
    const offsets_view off = offsets_of(fn, "offsets", given(offsets));
    return with_value_dtype(fn, "advantages", advantages, [&](auto tag) {
      using T = decltype(tag);
      const auto adv = span_of<const T>(fn, "advantages", advantages);
      if (!mask.defined()) {
        // The token count is the last offset: the offsets are checked (on a view of no memory)
        // before the result of that size is allocated.
        const std::int64_t last = static_cast<std::int64_t>(off.i64.size() + off.i32.size()) - 1;
        const std::int64_t total = off.i64.empty() ? std::int64_t{off.i32.back()} : off.i64.back();
        if (total < 0)
          ulorl::detail::fail_at(fn, "offsets", last, total, "the last offset (the token count) must be >= 0");
        const vector_view<T> no_memory(nullptr, static_cast<std::size_t>(total));
        validate_layout(
            fn, "offsets",
            off.i64.empty() ? token_view<T>::packed(no_memory, off.i32) : token_view<T>::packed(no_memory, off.i64));
        at::Tensor out = new_tensor({total}, advantages.scalar_type());
        ulorl::broadcast_to_tokens(adv, token_view<const std::uint8_t>{}, tokens_of<T>(fn, "out", out, off), cfg);
        return out;
      }
      require_cpu(fn, "mask", mask, -1);
      at::Tensor out = new_tensor(mask.sizes(), advantages.scalar_type());
      const auto run = [&](const at::Tensor& m, auto mtag) {
        using M = decltype(mtag);
        ulorl::broadcast_to_tokens(adv, tokens_of<const M>(fn, "mask", m, off), tokens_of<T>(fn, "out", out, off), cfg);
      };
      // A mask of T as it is; any other as its bytes (byte_mask: bool / uint8 as they are, another
      // integer or floating mask checked 0/1 and converted).
      if (mask.scalar_type() == scalar_type_of<T>())
        run(mask, T{});
      else
        run(byte_mask<T>(fn, "mask", mask, off), std::uint8_t{});
      return out;
    });
  }
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor> dynamic_sampling_filter(const at::Tensor& metric, const opt_tensor& group_ids,
                                                           opt_int group_size, c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "dynamic_sampling_filter";
  const auto cfg = record_of<dynamic_sampling_config>(fn, config);
  if constexpr (Meta) {
    meta_groups(fn, group_ids, group_size);
    (void)value_dtype(fn, "metric", metric);
    return {new_meta({responses_of(fn, "metric", metric)}, at::kBool), meta_record_tensor<dynamic_sampling_result>()};
  } else {
    return with_value_dtype(fn, "metric", metric, [&](auto tag) {
      using T = decltype(tag);
      const auto m = span_of<const T>(fn, "metric", metric);
      const group_layout g = groups_of(fn, m.size(), group_ids, group_size);
      at::Tensor keep = new_tensor({metric.size(0)}, at::kBool);
      const dynamic_sampling_result r =
          ulorl::dynamic_sampling_filter(m, g, span_of<std::uint8_t>(fn, "keep", keep), cfg);
      return std::make_tuple(keep, record_tensor(&r));
    });
  }
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor> mpt_mask(const opt_tensor& log_prob, const opt_tensor& old_log_prob,
                                            const at::Tensor& entropy, const opt_tensor& mask_,
                                            const at::Tensor& response_score, const opt_tensor& offsets,
                                            c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "mpt_mask";
  const auto cfg = record_of<mpt_config>(fn, config);
  const bool rollout = cfg.probability == mpt_probability::rollout;
  const at::Tensor lp = given(rollout ? old_log_prob : log_prob), mask = given(mask_);
  const std::string_view lp_name = rollout ? "old_log_prob" : "log_prob";
  if (!lp.defined())
    fail(fn, lp_name, rollout ? "required when probability == rollout" : "required when probability == current");
  const c10::ScalarType keep_type = keep_dtype(mask);
  return with_value_dtype(fn, lp_name, lp, [&](auto tag) {
    using T = decltype(tag);
    // bool / uint8 / T masks are read as they are; another integer or floating one as its 0/1 bytes,
    // the keep mask then converted to its dtype.
    const bool direct =
        keep_type == c10::ScalarType::Bool || keep_type == c10::ScalarType::Byte || keep_type == scalar_type_of<T>();
    if (!direct) th::detail::require_mask_dtype(fn, "mask", keep_type);
    if constexpr (Meta) {
      (void)value_dtype(fn, "response_score", response_score);
      return std::make_tuple(new_meta(lp.sizes(), keep_type), meta_record_tensor<mpt_stats>());
    } else {
      const offsets_view off = offsets_of(fn, "offsets", given(offsets));
      return with_value_dtype(fn, "response_score", response_score, [&](auto stag) {
        using S = decltype(stag);
        const at::Tensor m = direct ? mask : byte_mask<T>(fn, "mask", mask, off);
        at::Tensor keep = new_tensor(lp.sizes(), direct ? keep_type : c10::ScalarType::Byte);
        const auto run = [&](auto mtag) {
          using M = decltype(mtag);
          mpt_batch<T, M, S> b;
          const token_view<const T> lp_v = tokens_of<const T>(fn, lp_name, lp, off);
          (rollout ? b.old_log_prob : b.log_prob) = lp_v;
          b.entropy = tokens_of<const T>(fn, "entropy", entropy, off);
          b.mask = optional_tokens_of<const M>(fn, "mask", m, off, lp_name, lp_v);
          b.response_score = span_of<const S>(fn, "response_score", response_score);
          return ulorl::mpt_mask(b, tokens_of<M>(fn, "keep", keep, off), cfg);
        };
        const mpt_stats st = keep_type == scalar_type_of<T>() ? run(T{}) : run(std::uint8_t{});
        return std::make_tuple(direct ? keep : keep.to(keep_type), record_tensor(&st));
      });
    }
  });
}

//! The CPU body of an operator over log_prob's token layout (padded, or packed by offsets):
//! f(T{}, log_prob's view, the mask's bytes, the offsets) for log_prob's dtype T.
template <class F>
auto with_log_prob_tokens(std::string_view fn, const at::Tensor& log_prob, const opt_tensor& mask,
                          const opt_tensor& offsets, F&& f) {
  const offsets_view off = offsets_of(fn, "offsets", given(offsets));
  return with_token_type(fn, "log_prob", log_prob, [&](auto tag) {
    using T = decltype(tag);
    const auto lp = tokens_of<const T>(fn, "log_prob", log_prob, off);
    const mask_bytes mv = optional_mask_of<T>(fn, "mask", given(mask), off, "log_prob", lp);
    return f(tag, lp, mv, off);
  });
}

//! The rows of a token tensor's layout: B of [B, T], or offsets.size(0) - 1 when packed.
inline std::int64_t layout_rows(std::string_view fn, const at::Tensor& tokens, const opt_tensor& offsets) {
  if (offsets.has_value() && offsets->defined()) {
    if (offsets->dim() != 1 || offsets->size(0) < 1) fail(fn, "offsets", "must be 1-D [B + 1]");
    return offsets->size(0) - 1;
  }
  if (tokens.dim() != 2) fail(fn, "log_prob", "must be [B, T] (or [total] with offsets)");
  return tokens.size(0);
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor, at::Tensor> off_policy_mask(const at::Tensor& log_prob,
                                                               const at::Tensor& old_log_prob,
                                                               const at::Tensor& advantages, const opt_tensor& mask,
                                                               const opt_tensor& offsets,
                                                               c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "off_policy_mask";
  const auto cfg = record_of<off_policy_mask_config>(fn, config);
  if constexpr (Meta) {
    const auto dtype = value_dtype(fn, "log_prob", log_prob);
    return {new_meta(log_prob.sizes(), dtype), new_meta({layout_rows(fn, log_prob, offsets)}, at::kDouble),
            meta_record_tensor<off_policy_mask_stats>()};
  } else {
    return with_log_prob_tokens(
        fn, log_prob, mask, offsets, [&](auto tag, auto lp, const mask_bytes& mv, const offsets_view& off) {
          using T = decltype(tag);
          off_policy_mask_inputs<T, std::uint8_t, T> in{
              .log_prob = lp,
              .old_log_prob = tokens_of<const T>(fn, "old_log_prob", old_log_prob, off),
              .mask = mv.view};
          if (cfg.advantage == off_policy_advantage_level::token)
            in.advantages = tokens_of<const T>(fn, "advantages", advantages, off);
          else
            in.sequence_advantages = span_of<const T>(fn, "advantages", advantages);
          at::Tensor keep = new_tensor(log_prob.sizes(), log_prob.scalar_type());
          at::Tensor seq_kl = new_tensor({static_cast<std::int64_t>(lp.rows())}, at::kDouble);
          const off_policy_mask_stats st = ulorl::off_policy_mask(in, tokens_of<T>(fn, "keep", keep, off),
                                                                  span_of<double>(fn, "seq_kl", seq_kl), cfg);
          return std::make_tuple(keep, seq_kl, record_tensor(&st));
        });
  }
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor, at::Tensor> rollout_correction(const at::Tensor& old_log_prob,
                                                                  const at::Tensor& rollout_log_prob,
                                                                  const opt_tensor& mask_, const opt_tensor& offsets,
                                                                  c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "rollout_correction";
  namespace rc = ulorl::rollout_correction;
  const auto cfg = record_of<rc::config>(fn, config);
  const at::Tensor mask = given(mask_);
  // The keep mask in the mask's dtype: bool / uint8 written as bytes, a float mask converted after.
  const bool bytes_in =
      mask.defined() && (mask.scalar_type() == c10::ScalarType::Bool || mask.scalar_type() == c10::ScalarType::Byte);
  const c10::ScalarType written = bytes_in ? mask.scalar_type() : mask.defined() ? at::kByte : at::kBool;
  if constexpr (Meta) {
    const auto dtype = value_dtype(fn, "old_log_prob", old_log_prob);
    return {new_meta(old_log_prob.sizes(), dtype),
            new_meta(old_log_prob.sizes(), mask.defined() ? mask.scalar_type() : at::kBool),
            meta_record_tensor<rc::statistics>()};
  } else {
    const offsets_view off = offsets_of(fn, "offsets", given(offsets));
    return with_token_type(fn, "old_log_prob", old_log_prob, [&](auto tag) {
      using T = decltype(tag);
      const auto olp = tokens_of<const T>(fn, "old_log_prob", old_log_prob, off);
      const mask_bytes mv = optional_mask_of<T>(fn, "mask", mask, off, "old_log_prob", olp);
      const rc::inputs<T, std::uint8_t> in{olp, tokens_of<const T>(fn, "rollout_log_prob", rollout_log_prob, off),
                                           mv.view};
      at::Tensor weights = new_tensor(old_log_prob.sizes(), old_log_prob.scalar_type());
      at::Tensor keep = new_tensor(old_log_prob.sizes(), written);
      const rc::metrics m = rc::apply(in,
                                      rc::outputs<T, std::uint8_t>{tokens_of<T>(fn, "weights", weights, off),
                                                                   tokens_of<std::uint8_t>(fn, "keep", keep, off)},
                                      cfg);
      if (mask.defined() && !bytes_in) keep = keep.to(mask.scalar_type());
      return std::make_tuple(weights, keep, record_tensor(&m.totals));
    });
  }
}

// ---- token selection ------------------------------------------------------------------------------------

//! A token-selection pass (loss/token_selection.hpp) over old_log_prob, log_prob and advantages in
//! log_prob's layout: one output in log_prob's shape and dtype and the pass's statistics;
//! pass(old, lp, adv, mask bytes, rollout weights (empty: absent), offsets, out) -> token_selection_stats.
template <bool Meta, class F>
std::tuple<at::Tensor, at::Tensor> token_selection_pass(std::string_view fn, const at::Tensor& old_log_prob,
                                                        const at::Tensor& log_prob, const at::Tensor& advantages,
                                                        const opt_tensor& mask, const opt_tensor& rollout_is_weights,
                                                        const opt_tensor& offsets, std::string_view out_name,
                                                        F&& pass) {
  if constexpr (Meta) {
    return {new_meta(log_prob.sizes(), value_dtype(fn, "log_prob", log_prob)),
            meta_record_tensor<token_selection_stats>()};
  } else {
    return with_log_prob_tokens(
        fn, log_prob, mask, offsets, [&](auto tag, auto lp, const mask_bytes& mv, const offsets_view& off) {
          using T = decltype(tag);
          const auto w =
              optional_tokens_of<const T>(fn, "rollout_is_weights", given(rollout_is_weights), off, "log_prob", lp);
          at::Tensor out = new_tensor(log_prob.sizes(), log_prob.scalar_type());
          const token_selection_stats st = pass(tokens_of<const T>(fn, "old_log_prob", old_log_prob, off), lp,
                                                tokens_of<const T>(fn, "advantages", advantages, off), mv.view, w, off,
                                                tokens_of<T>(fn, out_name, out, off));
          return std::make_tuple(out, record_tensor(&st));
        });
  }
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor> dppo_weights(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                const at::Tensor& advantages, const opt_tensor& mask,
                                                const opt_tensor& rollout_is_weights, const opt_tensor& offsets,
                                                c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "dppo_weights";
  const auto cfg = record_of<dppo_config>(fn, config);
  return token_selection_pass<Meta>(fn, old_log_prob, log_prob, advantages, mask, rollout_is_weights, offsets,
                                    "weights",
                                    [&](auto old, auto lp, auto adv, auto m, auto w, const offsets_view&, auto out) {
                                      return ulorl::dppo_weights(old, lp, adv, m, w, out, cfg);
                                    });
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor> kl_cov_selection(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                    const at::Tensor& advantages, const opt_tensor& mask,
                                                    const opt_tensor& offsets, c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "kl_cov_selection";
  const auto cfg = record_of<kl_cov_config>(fn, config);
  return token_selection_pass<Meta>(fn, old_log_prob, log_prob, advantages, mask, opt_tensor(), offsets, "selected",
                                    [&](auto old, auto lp, auto adv, auto m, auto, const offsets_view&, auto out) {
                                      return ulorl::kl_cov_selection(old, lp, adv, m, out, cfg);
                                    });
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor> clip_cov_weights(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                    const at::Tensor& advantages, const opt_tensor& mask,
                                                    const at::Tensor& clip_cov_selection,
                                                    const opt_tensor& rollout_is_weights, const opt_tensor& offsets,
                                                    c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "clip_cov_weights";
  const auto cfg = record_of<clip_cov_config>(fn, config);
  return token_selection_pass<Meta>(
      fn, old_log_prob, log_prob, advantages, mask, rollout_is_weights, offsets, "weights",
      [&](auto old, auto lp, auto adv, auto m, auto w, const offsets_view& off, auto out) {
        using T = std::remove_const_t<typename decltype(lp)::element_type>;
        if (!clip_cov_selection.defined())
          fail(fn, "clip_cov_selection", "required (a 0/1 tensor in log_prob's shape)");
        const mask_bytes sel = optional_mask_of<T>(fn, "clip_cov_selection", clip_cov_selection, off, "log_prob", lp);
        return ulorl::clip_cov_weights(old, lp, adv, m, sel.view, w, out, cfg);
      });
}

// ---- further advantage estimators -----------------------------------------------------------------------

template <bool Meta>
at::Tensor gpg_advantages(const at::Tensor& scores, const opt_tensor& group_ids, opt_int group_size,
                          c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "gpg_advantages";
  const auto cfg = record_of<gpg_config>(fn, config);
  return per_response<Meta>(fn, "scores", scores, group_ids, group_size,
                            [&](auto s, const group_layout& g, auto out) { ulorl::gpg_advantages(s, g, out, cfg); });
}

template <bool Meta>
at::Tensor opo_advantages(const at::Tensor& scores, const at::Tensor& mask, const opt_tensor& group_ids,
                          opt_int group_size, const opt_tensor& offsets) {
  constexpr std::string_view fn = "opo_advantages";
  const offsets_view off = Meta ? offsets_view{} : offsets_of(fn, "offsets", given(offsets));
  return per_response<Meta>(fn, "scores", scores, group_ids, group_size, [&](auto s, const group_layout& g, auto out) {
    using T = std::remove_cv_t<typename decltype(s)::element_type>;
    const mask_bytes mv = mask_of<T>(fn, "mask", mask, off);
    require_binary_mask(fn, "mask", mv.view);
    require_same_size(fn, "mask rows", mv.view.rows(), "scores", s.size());
    std::vector<double> lengths(s.size());  // OPO's response lengths: the valid tokens of each row
    for (std::size_t i = 0; i < lengths.size(); ++i) lengths[i] = static_cast<double>(row_tokens(mv.view, i));
    ulorl::opo_advantages(s, std::span<const double>(lengths), g, out);
  });
}

//! The names of return_scan, for the operator's `scan` argument.
inline return_scan return_scan_of(std::string_view fn, c10::string_view name) {
  static constexpr std::pair<std::string_view, return_scan> names[] = {
      {"reset_after_eos", return_scan::reset_after_eos}, {"skip_masked", return_scan::skip_masked}};
  return value_of_name(fn, "scan", std::string_view(name.data(), name.size()), names);
}

//! (advantages, returns) in the shape and dtype of per-token rewards with an optional mask:
//! f(rewards view, mask view, returns view, advantages view, offsets) writes them.
template <bool Meta, class F>
std::tuple<at::Tensor, at::Tensor> advantages_and_returns(std::string_view fn, const at::Tensor& token_rewards,
                                                          const opt_tensor& mask, const opt_tensor& offsets, F&& f) {
  if constexpr (Meta) {
    const auto dtype = value_dtype(fn, "token_level_rewards", token_rewards);
    return {new_meta(token_rewards.sizes(), dtype), new_meta(token_rewards.sizes(), dtype)};
  } else {
    const offsets_view off = offsets_of(fn, "offsets", given(offsets));
    return with_token_type(fn, "token_level_rewards", token_rewards, [&](auto tag) {
      using T = decltype(tag);
      const auto rewards = tokens_of<const T>(fn, "token_level_rewards", token_rewards, off);
      const mask_bytes mv = optional_mask_of<T>(fn, "mask", given(mask), off, "token_level_rewards", rewards);
      at::Tensor adv = new_tensor(token_rewards.sizes(), token_rewards.scalar_type());
      at::Tensor ret = new_tensor(token_rewards.sizes(), token_rewards.scalar_type());
      f(rewards, mv.view, tokens_of<T>(fn, "returns", ret, off), tokens_of<T>(fn, "advantages", adv, off), off);
      return std::make_tuple(adv, ret);
    });
  }
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor> reinforce_plus_plus_advantages(const at::Tensor& token_rewards,
                                                                  const opt_tensor& mask, const opt_tensor& offsets,
                                                                  double gamma, c10::string_view scan) {
  constexpr std::string_view fn = "reinforce_plus_plus_advantages";
  const return_scan sc = return_scan_of(fn, scan);
  return advantages_and_returns<Meta>(fn, token_rewards, mask, offsets,
                                      [&](auto rewards, auto m, auto ret, auto adv, const offsets_view&) {
                                        ulorl::reinforce_plus_plus_advantages(rewards, m, ret, adv, gamma, {}, sc);
                                      });
}

//! Per-token advantages in the mask's shape and the values' dtype from per-response values (groups
//! by ids or size): f(T{}, values' responses -> group_layout, mask view, token view of the output).
template <bool Meta, class F>
at::Tensor mask_shaped(std::string_view fn, std::string_view arg, const at::Tensor& values, const opt_tensor& group_ids,
                       opt_int group_size, const at::Tensor& mask, const opt_tensor& offsets, F&& f) {
  if constexpr (Meta) {
    meta_groups(fn, group_ids, group_size);
    return new_meta(mask.sizes(), value_dtype(fn, arg, values));
  } else {
    const offsets_view off = offsets_of(fn, "offsets", given(offsets));
    return with_value_dtype(fn, arg, values, [&](auto tag) {
      using T = decltype(tag);
      const mask_bytes mv = mask_of<T>(fn, "mask", mask, off);
      const auto groups = [&](std::size_t responses) { return groups_of(fn, responses, group_ids, group_size); };
      at::Tensor out = new_tensor(mask.sizes(), values.scalar_type());
      f(tag, groups, mv.view, tokens_of<T>(fn, "advantages", out, off));
      return out;
    });
  }
}

template <bool Meta>
at::Tensor reinforce_plus_plus_baseline_advantages(const at::Tensor& scores, const opt_tensor& group_ids,
                                                   opt_int group_size, const at::Tensor& mask,
                                                   const opt_tensor& offsets, c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "reinforce_plus_plus_baseline_advantages";
  const auto cfg = record_of<reinforce_plus_plus_baseline_config>(fn, config);
  return mask_shaped<Meta>(fn, "scores", scores, group_ids, group_size, mask, offsets,
                           [&](auto tag, const auto& groups, const auto& m, const auto& out) {
                             const auto s = span_of<const decltype(tag)>(fn, "scores", scores);
                             ulorl::reinforce_plus_plus_baseline_advantages(s, groups(s.size()), m, out, cfg);
                           });
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor> gae_advantages(const at::Tensor& token_rewards, const at::Tensor& values,
                                                  const opt_tensor& mask, const opt_tensor& offsets,
                                                  c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "gae_advantages";
  const auto cfg = record_of<gae_config>(fn, config);
  return advantages_and_returns<Meta>(
      fn, token_rewards, mask, offsets, [&](auto rewards, auto m, auto ret, auto adv, const offsets_view& off) {
        using T = std::remove_cv_t<typename decltype(rewards)::value_type>;
        ulorl::gae_advantages(rewards, tokens_of<const T>(fn, "values", values, off), m, ret, adv, cfg);
      });
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor> remax_advantages(const at::Tensor& token_rewards, const at::Tensor& baselines,
                                                    const opt_tensor& mask, const opt_tensor& offsets) {
  constexpr std::string_view fn = "remax_advantages";
  if constexpr (Meta) (void)responses_of(fn, "reward_baselines", baselines);
  return advantages_and_returns<Meta>(
      fn, token_rewards, mask, offsets, [&](auto rewards, auto m, auto ret, auto adv, const offsets_view&) {
        using T = std::remove_cv_t<typename decltype(rewards)::value_type>;
        ulorl::remax_advantages(rewards, span_of<const T>(fn, "reward_baselines", baselines), m, ret, adv);
      });
}

template <bool Meta>
at::Tensor pass_at_k_advantages(const at::Tensor& scores, const opt_tensor& group_ids, opt_int group_size,
                                c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "pass_at_k_advantages";
  const auto cfg = record_of<pass_at_k_config>(fn, config);
  return per_response<Meta>(fn, "scores", scores, group_ids, group_size, [&](auto s, const group_layout& g, auto out) {
    ulorl::pass_at_k_advantages(s, g, out, cfg);
  });
}

template <bool Meta>
at::Tensor multi_reward_advantages(const at::Tensor& components, c10::ArrayRef<double> weights,
                                   const opt_tensor& group_ids, opt_int group_size, const at::Tensor& mask,
                                   const opt_tensor& offsets, c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "multi_reward_advantages";
  const auto cfg = record_of<multi_reward_config>(fn, config);
  return mask_shaped<Meta>(fn, "reward_components", components, group_ids, group_size, mask, offsets,
                           [&](auto tag, const auto& groups, const auto& m, const auto& out) {
                             const auto comp = matrix_of<const decltype(tag)>(fn, "reward_components", components);
                             ulorl::multi_reward_advantages(comp,
                                                            std::span<const double>(weights.data(), weights.size()),
                                                            groups(comp.rows()), m, out, cfg);
                           });
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor> optimal_token_baseline_advantages(
    const at::Tensor& token_rewards, const opt_tensor& mask, const at::Tensor& group_ids,
    const opt_tensor& old_log_prob, const opt_tensor& sum_pi_squared, const opt_tensor& rollout_is_weights,
    const opt_tensor& offsets, c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "optimal_token_baseline_advantages";
  const auto cfg = record_of<optimal_token_baseline_config>(fn, config);
  if constexpr (Meta) {
    const auto dtype = value_dtype(fn, "token_level_rewards", token_rewards);
    return {new_meta(token_rewards.sizes(), dtype), new_meta(token_rewards.sizes(), dtype)};
  } else {
    const offsets_view off = offsets_of(fn, "offsets", given(offsets));
    return with_token_type(fn, "token_level_rewards", token_rewards, [&](auto tag) {
      using T = decltype(tag);
      constexpr std::string_view ref = "token_level_rewards";
      const auto rewards = tokens_of<const T>(fn, ref, token_rewards, off);
      const mask_bytes mv = optional_mask_of<T>(fn, "mask", given(mask), off, ref, rewards);
      const auto optional = [&](std::string_view arg, const opt_tensor& t) {
        return optional_tokens_of<const T>(fn, arg, given(t), off, ref, rewards);
      };
      const optimal_token_baseline_inputs<T, std::uint8_t> in{
          .token_rewards = rewards,
          .mask = mv.view,
          .old_log_prob = optional("old_log_prob", old_log_prob),
          .sum_pi_squared = optional("sum_pi_squared", sum_pi_squared),
          .rollout_is_weights = optional("rollout_is_weights", rollout_is_weights)};
      const group_layout g = groups_of(fn, rewards.rows(), group_ids, c10::nullopt);
      at::Tensor adv = new_tensor(token_rewards.sizes(), token_rewards.scalar_type());
      at::Tensor ret = new_tensor(token_rewards.sizes(), token_rewards.scalar_type());
      ulorl::optimal_token_baseline_advantages(in, g, tokens_of<T>(fn, "returns", ret, off),
                                               tokens_of<T>(fn, "advantages", adv, off), cfg);
      return std::make_tuple(adv, ret);
    });
  }
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor> logits_statistics_torch_rounding(const at::Tensor& logits,
                                                                    const at::Tensor& labels) {
  constexpr std::string_view fn = "logits_statistics_torch_rounding";
  if (logits.dim() != 2) fail(fn, "logits", "must be [N, V] (got " + std::to_string(logits.dim()) + " dimensions)");
  if (labels.dim() != 2) fail(fn, "labels", "must be [N, K] (got " + std::to_string(labels.dim()) + " dimensions)");
  const auto st = logits.scalar_type();
  if (st != c10::ScalarType::BFloat16 && st != c10::ScalarType::Half)
    fail(fn, "logits", std::string("has dtype ") + c10::toString(st) + " but must be bfloat16 or float16");
  const auto lt = labels.scalar_type();
  if (lt != c10::ScalarType::Long && lt != c10::ScalarType::Int)
    fail(fn, "labels", std::string("has dtype ") + c10::toString(lt) + " but must be int64 or int32");
  if constexpr (Meta) {
    return {new_meta(labels.sizes(), st), new_meta({logits.size(0)}, st)};
  } else {
    at::Tensor lp = new_tensor(labels.sizes(), st), ent = new_tensor({logits.size(0)}, st);
    const auto run = [&](auto ltag, auto ytag) {
      using L = decltype(ltag);
      using Y = decltype(ytag);
      ulorl::logits_statistics_torch_rounding(matrix_of<const L>(fn, "logits", logits),
                                              matrix_of<const Y>(fn, "labels", labels),
                                              matrix_of<L>(fn, "log_prob", lp), span_of<L>(fn, "entropy", ent));
    };
    const auto with_labels = [&](auto ltag) {
      if (lt == c10::ScalarType::Long)
        run(ltag, std::int64_t{});
      else
        run(ltag, std::int32_t{});
    };
    if (st == c10::ScalarType::BFloat16)
      with_labels(bf16{});
    else
      with_labels(f16{});
    return {lp, ent};
  }
}

// ---- overlong shaping ------------------------------------------------------------------------------------

//! Per-response penalties [B] float64 from lengths [B] (int64, int32, float32 or float64):
//! penalties(std::span<const L> lengths, std::span<double> out).
template <bool Meta, class F>
at::Tensor per_length(std::string_view fn, const at::Tensor& lengths, F&& penalties) {
  const auto st = lengths.scalar_type();
  if (st != c10::ScalarType::Long && st != c10::ScalarType::Int && st != c10::ScalarType::Float &&
      st != c10::ScalarType::Double)
    fail(fn, "lengths", std::string("must be int64, int32, float32 or float64 (got ") + c10::toString(st) + ")");
  if constexpr (Meta) {
    return new_meta({responses_of(fn, "lengths", lengths)}, c10::ScalarType::Double);
  } else {
    const auto run = [&](auto tag) {
      using L = decltype(tag);
      const auto l = span_of<const L>(fn, "lengths", lengths);
      at::Tensor out = new_tensor({lengths.size(0)}, c10::ScalarType::Double);
      penalties(l, span_of<double>(fn, "out", out));
      return out;
    };
    if (st == c10::ScalarType::Long) return run(std::int64_t{});
    if (st == c10::ScalarType::Int) return run(std::int32_t{});
    if (st == c10::ScalarType::Float) return run(float{});
    return run(double{});
  }
}

template <bool Meta>
at::Tensor dapo_overlong_penalties(const at::Tensor& lengths, c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "dapo_overlong_penalties";
  const auto cfg = record_of<dapo_overlong_config>(fn, config);
  return per_length<Meta>(fn, lengths,
                          [&](auto l, std::span<double> out) { ulorl::dapo_overlong_penalties(l, out, cfg); });
}

template <bool Meta>
at::Tensor soft_overlong_penalties(const at::Tensor& lengths, c10::ArrayRef<double> config) {
  constexpr std::string_view fn = "soft_overlong_penalties";
  const auto cfg = record_of<soft_overlong_config>(fn, config);
  return per_length<Meta>(fn, lengths,
                          [&](auto l, std::span<double> out) { ulorl::soft_overlong_penalties(l, out, cfg); });
}

//! The logits statistics (logits/forward.hpp) of logits [N, V] (float32, float64, bfloat16 or float16)
//! and labels [N] (int64 / int32) in float64 [N] tensors: log-prob, entropy, log-sum-exp. The CPU
//! kernel of logits_statistics_float64 and of `_logits_statistics_forward` (ops.hpp).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> float64_statistics(std::string_view fn, const at::Tensor& logits,
                                                                         const at::Tensor& labels,
                                                                         const logits_config& cfg) {
  return th::detail::with_logits_type(fn, "logits", logits, [&](auto ltag) {
    using L = decltype(ltag);
    return th::detail::with_label_type(fn, "labels", labels, [&](auto y) {
      const matrix_view<const L> z = matrix_of<const L>(fn, "logits", logits);
      const auto n = static_cast<std::int64_t>(z.rows());
      const auto dbl = at::TensorOptions().dtype(at::kDouble);
      at::Tensor lp = at::empty({n}, dbl), ent = at::empty({n}, dbl), lse = at::empty({n}, dbl);
      logits_forward(z, y, vector_of<double>(fn, "log_prob", lp), vector_of<double>(fn, "entropy", ent),
                     vector_of<double>(fn, "lse", lse), cfg, torch_executor{});
      return std::make_tuple(lp, ent, lse);
    });
  });
}

template <bool Meta>
std::tuple<at::Tensor, at::Tensor, at::Tensor> logits_statistics_float64(const at::Tensor& logits,
                                                                         const at::Tensor& labels, double temperature,
                                                                         bool check_values) {
  constexpr std::string_view fn = "logits_statistics";
  th::detail::require_same_device(fn, "logits", logits, {{"labels", &labels}});
  if constexpr (Meta) {
    if (logits.dim() != 2) fail(fn, "logits", "must be [N, V] (got " + std::to_string(logits.dim()) + " dimensions)");
    return {new_meta({logits.size(0)}, at::kDouble), new_meta({logits.size(0)}, at::kDouble),
            new_meta({logits.size(0)}, at::kDouble)};
  } else {
    return float64_statistics(fn, logits, labels, {.temperature = temperature, .check_values = check_values});
  }
}

//! count_batch (loss/aggregation.hpp) of a 0/1 mask (bool, or any integer or floating type; checked), or
//! with `tokens` (a float32 / float64 token tensor of the batch: its layout) of the mask against
//! that layout, an absent mask counting every token of it: one float64 tensor [3] of batch_counts
//! (tokens, sequences, rows) on the device of the inputs.
template <bool Meta>
at::Tensor count_batch(const opt_tensor& mask_, const opt_tensor& offsets_, const opt_tensor& tokens_) {
  constexpr std::string_view fn = "count_batch";
  const at::Tensor mask = given(mask_), offsets = given(offsets_), tokens = given(tokens_);
  if (!mask.defined() && !tokens.defined())
    fail(fn, "mask", "required without tokens (an absent mask counts the tokens' layout as valid)");
  const at::Tensor& like = mask.defined() ? mask : tokens;
  th::detail::require_same_device(fn, mask.defined() ? "mask" : "tokens", like,
                                  {{"offsets", &offsets}, {"tokens", &tokens}});
  if constexpr (Meta) {
    return meta_record_tensor<batch_counts>();
  } else {
    const offsets_view off = offsets_of(fn, "offsets", offsets);
    const auto count = [&](auto mask_view) {
      if (!tokens.defined()) return ulorl::count_batch(mask_view);
      return with_token_type(fn, "tokens", tokens, [&](auto tag) {
        using T = decltype(tag);
        return ulorl::count_batch(mask_view, tokens_of<const T>(fn, "tokens", tokens, off));
      });
    };
    // Any mask as its checked 0/1 bytes (byte_mask; undefined stays undefined: every token valid).
    const at::Tensor bytes = byte_mask<double>(fn, "mask", mask, off);
    const batch_counts c = count(optional_tokens_of<const std::uint8_t>(fn, "mask", bytes, off));
    return record_tensor(&c);
  }
}

//! NeMo-RL's logged ratios (presets::nemo_rl::logged_ratios) of log_prob and old_log_prob (float32 /
//! float64, one layout) under a mask (absent: every token valid), with the encoded
//! clipped_pg_loss_options and global_valid_toks (absent: the batch's valid tokens): one float64
//! tensor [2] of ratio_metrics.
template <bool Meta>
at::Tensor nemo_rl_logged_ratios(const at::Tensor& log_prob, const at::Tensor& old_log_prob, const opt_tensor& mask,
                                 const opt_tensor& offsets, c10::ArrayRef<double> options,
                                 c10::optional<double> global_valid_toks) {
  namespace N = presets::nemo_rl;
  constexpr std::string_view fn = "presets::nemo_rl::logged_ratios";
  const at::Tensor m = given(mask), o = given(offsets);
  th::detail::require_same_device(fn, "log_prob", log_prob,
                                  {{"old_log_prob", &old_log_prob}, {"mask", &m}, {"offsets", &o}});
  const auto opts =
      decode_fields<N::clipped_pg_loss_options>(fn, "options", std::span<const double>(options.data(), options.size()));
  if constexpr (Meta) {
    (void)value_dtype(fn, "log_prob", log_prob);
    return meta_record_tensor<N::ratio_metrics>();
  } else {
    return with_log_prob_tokens(
        fn, log_prob, mask, offsets, [&](auto tag, const auto& lp, const mask_bytes& mv, const offsets_view& off) {
          using T = decltype(tag);
          N::global_counts g;
          if (global_valid_toks.has_value()) g.global_valid_toks = *global_valid_toks;
          const N::ratio_metrics r =
              N::logged_ratios(lp, tokens_of<const T>(fn, "old_log_prob", old_log_prob, off), mv.view, opts, g);
          return record_tensor(&r);
        });
  }
}

//! Registers the batch operators' CPU and Meta kernels (the schemas are batch_schemas(); autograd
//! passes them by; on CUDA tensors they take ops.hpp's host path). Called once, by register_ops().
inline void register_batch_kernels(torch::Library& cpu, torch::Library& meta) {
  const auto both = [&](const char* name, auto cpu_kernel, auto meta_kernel) {
    cpu.impl(name, cpu_kernel);
    meta.impl(name, meta_kernel);
  };
  both("group_advantages", &group_advantages<false>, &group_advantages<true>);
  both("broadcast_to_tokens", &broadcast_to_tokens<false>, &broadcast_to_tokens<true>);
  both("dynamic_sampling_filter", &dynamic_sampling_filter<false>, &dynamic_sampling_filter<true>);
  both("mpt_mask", &mpt_mask<false>, &mpt_mask<true>);
  both("off_policy_mask", &off_policy_mask<false>, &off_policy_mask<true>);
  both("rollout_correction", &rollout_correction<false>, &rollout_correction<true>);
  both("gpg_advantages", &gpg_advantages<false>, &gpg_advantages<true>);
  both("opo_advantages", &opo_advantages<false>, &opo_advantages<true>);
  both("reinforce_plus_plus_advantages", &reinforce_plus_plus_advantages<false>, &reinforce_plus_plus_advantages<true>);
  both("reinforce_plus_plus_baseline_advantages", &reinforce_plus_plus_baseline_advantages<false>,
       &reinforce_plus_plus_baseline_advantages<true>);
  both("gae_advantages", &gae_advantages<false>, &gae_advantages<true>);
  both("remax_advantages", &remax_advantages<false>, &remax_advantages<true>);
  both("pass_at_k_advantages", &pass_at_k_advantages<false>, &pass_at_k_advantages<true>);
  both("multi_reward_advantages", &multi_reward_advantages<false>, &multi_reward_advantages<true>);
  both("optimal_token_baseline_advantages", &optimal_token_baseline_advantages<false>,
       &optimal_token_baseline_advantages<true>);
  both("dppo_weights", &dppo_weights<false>, &dppo_weights<true>);
  both("kl_cov_selection", &kl_cov_selection<false>, &kl_cov_selection<true>);
  both("clip_cov_weights", &clip_cov_weights<false>, &clip_cov_weights<true>);
  both("dapo_overlong_penalties", &dapo_overlong_penalties<false>, &dapo_overlong_penalties<true>);
  both("soft_overlong_penalties", &soft_overlong_penalties<false>, &soft_overlong_penalties<true>);
  both("logits_statistics_torch_rounding", &logits_statistics_torch_rounding<false>,
       &logits_statistics_torch_rounding<true>);
  both("count_batch", &count_batch<false>, &count_batch<true>);
  both("logits_statistics_float64", &logits_statistics_float64<false>, &logits_statistics_float64<true>);
  both("nemo_rl_logged_ratios", &nemo_rl_logged_ratios<false>, &nemo_rl_logged_ratios<true>);
}

}  // namespace detail

}  // namespace ops

}  // namespace th

ULORL_NAMESPACE_END
