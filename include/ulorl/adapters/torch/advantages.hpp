// ulorl/adapters/torch/advantages.hpp — ulorl's advantage, masking and filtering functions on
// torch tensors (optional: needs libtorch, CMake target ulorl::torch). None is differentiable
// (rewards, advantages and masks are constants of the loss); each returns new tensors:
//   group_advantages(rewards [B], group_ids [B] | group_size, cfg | preset) -> advantages [B]
//   broadcast_to_tokens(advantages [B], mask [B, T] | [total] + offsets, cfg | preset) -> [B, T] | [total]
//       (packed: an undefined mask means every token inside the offsets valid)
//   mpt_mask({log_prob, entropy, mask, response_score, ...}, cfg) -> keep mask + mpt_stats (UloRL MPT)
//   dynamic_sampling_filter(metric [B], group_ids [B] | group_size, cfg) -> keep [B] (bool) + counts
// Per-response tensors (rewards, ids, scores) must be contiguous 1-D; per-token tensors take any
// strides. Errors are ulorl::error, raised before any output exists.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "ulorl/adapters/torch/tensor_views.hpp"
#include "ulorl/advantage/dynamic_sampling.hpp"
#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/groups.hpp"
#include "ulorl/advantage/token_broadcast.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/masking/mpt.hpp"

ULORL_NAMESPACE_BEGIN

namespace th {

namespace detail {

//! float32 -> f(float{}), float64 -> f(double{}) for per-response / per-token value tensors.
template <class F>
decltype(auto) with_value_type(std::string_view fn, std::string_view arg, const at::Tensor& t, F&& f) {
  require_cpu(fn, arg, t, -1);
  switch (t.scalar_type()) {
    case c10::ScalarType::Float: return f(float{});
    case c10::ScalarType::Double: return f(double{});
    default:
      ulorl::detail::fail(fn, arg,
                          std::string("has dtype ") + c10::toString(t.scalar_type()) + " but must be float32 or float64");
  }
}

//! Group ids (int64 or int32, contiguous [B]) as a group_layout.
inline group_layout groups_of(std::string_view fn, const at::Tensor& ids) {
  require_cpu(fn, "group_ids", ids, 1);
  if (ids.scalar_type() == c10::ScalarType::Long)
    return group_layout::from_ids(span_of<const std::int64_t>(fn, "group_ids", ids), fn, "group_ids");
  if (ids.scalar_type() == c10::ScalarType::Int)
    return group_layout::from_ids(span_of<const std::int32_t>(fn, "group_ids", ids), fn, "group_ids");
  ulorl::detail::fail(fn, "group_ids",
                      std::string("has dtype ") + c10::toString(ids.scalar_type()) + " but must be int64 or int32");
}

inline group_layout groups_of(std::string_view fn, const at::Tensor& scores, std::int64_t group_size) {
  if (group_size < 1) ulorl::detail::fail_value(fn, "group_size", group_size, "must be >= 1");
  require_cpu(fn, "rewards", scores, 1);
  return group_layout::fixed(static_cast<std::size_t>(scores.size(0)), static_cast<std::size_t>(group_size), fn,
                             "group_size");
}

inline at::Tensor advantages_impl(const at::Tensor& rewards, const group_layout& groups,
                                  const group_advantage_config& cfg) {
  constexpr std::string_view fn = "group_advantages";
  return with_value_type(fn, "rewards", rewards, [&](auto tag) {
    using T = decltype(tag);
    const auto scores = span_of<const T>(fn, "rewards", rewards);
    at::Tensor out = at::empty({rewards.size(0)}, rewards.options());
    ulorl::group_advantages(scores, groups, span_of<T>(fn, "out", out), cfg);
    return out;
  });
}

}  // namespace detail

//! Per-response advantages of rewards [B] grouped by group_ids [B] (any ids >= 0, any order).
[[nodiscard]] inline at::Tensor group_advantages(const at::Tensor& rewards, const at::Tensor& group_ids,
                                                 const group_advantage_config& cfg = {}) {
  detail::require_cpu("group_advantages", "rewards", rewards, 1);
  return detail::advantages_impl(rewards, detail::groups_of("group_advantages", group_ids), cfg);
}
//! Contiguous groups of `group_size` responses (TRL num_generations, OpenRLHF n_samples_per_prompt).
[[nodiscard]] inline at::Tensor group_advantages(const at::Tensor& rewards, std::int64_t group_size,
                                                 const group_advantage_config& cfg = {}) {
  return detail::advantages_impl(rewards, detail::groups_of("group_advantages", rewards, group_size), cfg);
}
[[nodiscard]] inline at::Tensor group_advantages(const at::Tensor& rewards, const at::Tensor& group_ids,
                                                 const advantage_preset& preset) {
  return group_advantages(rewards, group_ids, preset.group);
}

//! Per-token advantages from per-response advantages [B] and the 0/1 mask (bool, uint8 or the
//! advantages' dtype; [B, T] padded, or [total] with offsets[B+1]); the result has the mask's shape
//! and the advantages' dtype. An undefined mask with offsets: every token inside the offsets valid,
//! the result [offsets[B]]; without offsets the mask is required (it gives the result's [B, T]).
[[nodiscard]] inline at::Tensor broadcast_to_tokens(const at::Tensor& advantages, const at::Tensor& mask,
                                                    const broadcast_config& cfg = {},
                                                    const at::Tensor& offsets = {}) {
  constexpr std::string_view fn = "broadcast_to_tokens";
  const offsets_view off = offsets_of(fn, "offsets", offsets);
  if (!mask.defined() && !off.packed)
    ulorl::detail::fail(fn, "mask",
                        "is undefined without offsets: the padded layout takes its [B, T] shape from the mask "
                        "(an absent mask means every token valid only in the packed layout, with offsets)");
  return detail::with_value_type(fn, "advantages", advantages, [&](auto tag) {
    using T = decltype(tag);
    const auto adv = span_of<const T>(fn, "advantages", advantages);
    if (!mask.defined()) {
      // The token count is the last offset: the offsets are checked (on a view of no memory) before
      // the result of that size is allocated.
      const std::int64_t last = static_cast<std::int64_t>(off.i64.size() + off.i32.size()) - 1;
      const std::int64_t total = off.i64.empty() ? std::int64_t{off.i32.back()} : off.i64.back();
      if (total < 0)
        ulorl::detail::fail_at(fn, "offsets", last, total, "the last offset (the token count) must be >= 0");
      const vector_view<T> no_memory(nullptr, static_cast<std::size_t>(total));
      validate_layout(fn, "offsets", off.i64.empty() ? token_view<T>::packed(no_memory, off.i32)
                                                     : token_view<T>::packed(no_memory, off.i64));
      at::Tensor out = at::empty({total}, advantages.options());
      const token_view<T> out_v = tokens_of<T>(fn, "out", out, off);
      ulorl::broadcast_to_tokens(adv, token_view<const std::uint8_t>{}, out_v, cfg);
      return out;
    }
    detail::require_cpu(fn, "mask", mask, -1);
    at::Tensor out = at::empty(mask.sizes(), advantages.options());
    const auto run = [&](auto mtag) {
      using M = decltype(mtag);
      ulorl::broadcast_to_tokens(adv, tokens_of<const M>(fn, "mask", mask, off), tokens_of<T>(fn, "out", out, off), cfg);
    };
    if (mask.scalar_type() == c10::ScalarType::Bool || mask.scalar_type() == c10::ScalarType::Byte)
      run(std::uint8_t{});
    else if (mask.scalar_type() == scalar_type_of<T>())
      run(T{});
    else
      ulorl::detail::fail(fn, "mask",
                          std::string("has dtype ") + c10::toString(mask.scalar_type()) + " but must be bool, uint8 or " +
                              c10::toString(scalar_type_of<T>()) + " (the dtype of the advantages)");
    return out;
  });
}
[[nodiscard]] inline at::Tensor broadcast_to_tokens(const at::Tensor& advantages, const at::Tensor& mask,
                                                    const advantage_preset& preset, const at::Tensor& offsets = {}) {
  return broadcast_to_tokens(advantages, mask, preset.broadcast, offsets);
}

//! Inputs of mpt_mask (masking/mpt.hpp's mpt_batch): per-token tensors in one layout ([B, T], or
//! [total] with offsets), float32 or float64; response_score [B] (float32 or float64, contiguous).
struct mpt_tensors {
  at::Tensor log_prob{};      //!< current policy (probability == current)
  at::Tensor old_log_prob{};  //!< rollout policy (probability == rollout)
  at::Tensor entropy{};
  at::Tensor mask{};          //!< bool, uint8 or the log-probs' dtype; undefined: every token valid
  at::Tensor response_score{};
  at::Tensor offsets{};
};

//! The UloRL MPT keep mask (1 = token trains) in the mask's dtype (bool without a mask) and its counts.
[[nodiscard]] inline std::pair<at::Tensor, mpt_stats> mpt_mask(const mpt_tensors& t, const mpt_config& cfg = {}) {
  constexpr std::string_view fn = "mpt_mask";
  const offsets_view off = offsets_of(fn, "offsets", t.offsets);
  const bool rollout = cfg.probability == mpt_probability::rollout;
  const at::Tensor& lp = rollout ? t.old_log_prob : t.log_prob;
  const std::string_view lp_name = rollout ? "old_log_prob" : "log_prob";
  if (!lp.defined()) ulorl::detail::fail(fn, lp_name, rollout ? "required when probability == rollout"
                                                              : "required when probability == current");
  return detail::with_value_type(fn, lp_name, lp, [&](auto tag) {
    using T = decltype(tag);
    return detail::with_value_type(fn, "response_score", t.response_score, [&](auto stag) {
      using S = decltype(stag);
      const auto keep_dtype = t.mask.defined() ? t.mask.scalar_type() : c10::ScalarType::Bool;
      const auto run = [&](auto mtag) {
        using M = decltype(mtag);
        mpt_batch<T, M, S> b;
        const token_view<const T> lp_v = tokens_of<const T>(fn, lp_name, lp, off);
        (rollout ? b.old_log_prob : b.log_prob) = lp_v;
        b.entropy = tokens_of<const T>(fn, "entropy", t.entropy, off);
        b.mask = optional_tokens_of<const M>(fn, "mask", t.mask, off, lp_name, lp_v);
        b.response_score = span_of<const S>(fn, "response_score", t.response_score);
        at::Tensor keep = at::empty(lp.sizes(), at::TensorOptions().dtype(keep_dtype));
        const mpt_stats st = ulorl::mpt_mask(b, tokens_of<M>(fn, "keep", keep, off), cfg);
        return std::pair<at::Tensor, mpt_stats>{keep, st};
      };
      if (keep_dtype == c10::ScalarType::Bool || keep_dtype == c10::ScalarType::Byte) return run(std::uint8_t{});
      if (keep_dtype != scalar_type_of<T>())
        ulorl::detail::fail(fn, "mask",
                            std::string("has dtype ") + c10::toString(keep_dtype) + " but must be bool, uint8 or " +
                                c10::toString(scalar_type_of<T>()) + " (the dtype of the log-probs)");
      return run(T{});
    });
  });
}

//! DAPO's dynamic-sampling filter: keep [B] (bool) is true for responses of kept groups.
[[nodiscard]] inline std::pair<at::Tensor, dynamic_sampling_result> dynamic_sampling_filter(
    const at::Tensor& metric, const at::Tensor& group_ids, const dynamic_sampling_config& cfg = {}) {
  constexpr std::string_view fn = "dynamic_sampling_filter";
  return detail::with_value_type(fn, "metric", metric, [&](auto tag) {
    using T = decltype(tag);
    const auto m = span_of<const T>(fn, "metric", metric);
    const group_layout groups = detail::groups_of(fn, group_ids);
    at::Tensor keep = at::empty({metric.size(0)}, at::TensorOptions().dtype(at::kBool));
    const auto r = ulorl::dynamic_sampling_filter(m, groups, span_of<std::uint8_t>(fn, "keep", keep), cfg);
    return std::pair<at::Tensor, dynamic_sampling_result>{keep, r};
  });
}

}  // namespace th

ULORL_NAMESPACE_END
