// ulorl/advantage/fields.hpp — the field tables (core/fields.hpp) of the advantage area's
// configurations and results, the records its operators carry (ulorl/adapters/torch/ops_batch.hpp):
// group_advantage_config, broadcast_config, dynamic_sampling_config / _result, gpg_config,
// whiten_config, reinforce_plus_plus_baseline_config, multi_reward_config, optimal_token_baseline_config,
// dapo_overlong_config, soft_overlong_config, gae_config, pass_at_k_config.
// Each table is the only list of its struct's fields outside the struct.
#pragma once

#include <string_view>

#include "ulorl/advantage/baselines.hpp"
#include "ulorl/advantage/dynamic_sampling.hpp"
#include "ulorl/advantage/gae.hpp"
#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/multi_reward.hpp"
#include "ulorl/advantage/optimal_token_baseline.hpp"
#include "ulorl/advantage/overlong.hpp"
#include "ulorl/advantage/pass_at_k.hpp"
#include "ulorl/advantage/reinforce_plus_plus.hpp"
#include "ulorl/advantage/token_broadcast.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/fields.hpp"

ULORL_NAMESPACE_BEGIN

template <class C, class F>
  requires detail::record_of<C, group_advantage_config>
constexpr void visit_fields(C& c, F&& f) {
  f("baseline", c.baseline), f("scale", c.scale), f("std", c.std), f("eps", c.eps), f("eps_at", c.eps_at);
  f("singleton", c.singleton), f("zero_std", c.zero_std);
}

template <class C, class F>
  requires detail::record_of<C, broadcast_config>
constexpr void visit_fields(C& c, F&& f) { f("placement", c.placement), f("allow_empty_rows", c.allow_empty_rows); }

template <class C, class F>
  requires detail::record_of<C, dynamic_sampling_config>
constexpr void visit_fields(C& c, F&& f) {
  f("drop_zero_variance", c.drop_zero_variance), f("min_accuracy", c.min_accuracy);
  f("max_accuracy", c.max_accuracy), f("use_window", c.use_window);
}

template <class R, class F>
  requires detail::record_of<R, dynamic_sampling_result>
constexpr void visit_fields(R& r, F&& f) {
  f("groups", r.groups), f("kept_groups", r.kept_groups), f("zero_variance_groups", r.zero_variance_groups);
  f("outside_window_groups", r.outside_window_groups), f("kept_responses", r.kept_responses);
}

template <class C, class F>
  requires detail::record_of<C, gpg_config>
constexpr void visit_fields(C& c, F&& f) { f("f_norm", c.f_norm); }

template <class C, class F>
  requires detail::record_of<C, whiten_config>
constexpr void visit_fields(C& c, F&& f) {
  f("eps", c.eps), f("unbiased", c.unbiased), f("shift_mean", c.shift_mean), f("eps_at", c.eps_at);
  f("mask_output", c.mask_output);
}

template <class C, class F>
  requires detail::record_of<C, reinforce_plus_plus_baseline_config>
constexpr void visit_fields(C& c, F&& f) { f("group", c.group), f("whiten", c.whiten); }

template <class C, class F>
  requires detail::record_of<C, multi_reward_config>
constexpr void visit_fields(C& c, F&& f) {
  f("aggregation", c.aggregation), f("group", c.group), f("final_norm", c.final_norm), f("batch", c.batch);
  f("whiten", c.whiten), f("broadcast", c.broadcast), f("min_components", c.min_components);
}

template <class C, class F>
  requires detail::record_of<C, optimal_token_baseline_config>
constexpr void visit_fields(C& c, F&& f) {
  f("align", c.align), f("handle_zero_tail", c.handle_zero_tail), f("eps", c.eps);
}

template <class C, class F>
  requires detail::record_of<C, dapo_overlong_config>
constexpr void visit_fields(C& c, F&& f) {
  f("max_length", c.max_length), f("buffer_length", c.buffer_length), f("penalty_factor", c.penalty_factor);
}

template <class C, class F>
  requires detail::record_of<C, soft_overlong_config>
constexpr void visit_fields(C& c, F&& f) { f("max_length", c.max_length), f("cache_length", c.cache_length); }

template <class C, class F>
  requires detail::record_of<C, gae_config>
constexpr void visit_fields(C& c, F&& f) { f("gamma", c.gamma), f("lambda", c.lambda), f("whiten", c.whiten); }

template <class C, class F>
  requires detail::record_of<C, pass_at_k_config>
constexpr void visit_fields(C& c, F&& f) { f("eps", c.eps), f("scale_by_std", c.scale_by_std); }

template <>
inline constexpr std::string_view record_name<group_advantage_config> = "group_advantage_config";
template <>
inline constexpr std::string_view record_name<broadcast_config> = "broadcast_config";
template <>
inline constexpr std::string_view record_name<dynamic_sampling_config> = "dynamic_sampling_config";
template <>
inline constexpr std::string_view record_name<dynamic_sampling_result> = "dynamic_sampling_result";
template <>
inline constexpr std::string_view record_name<gpg_config> = "gpg_config";
template <>
inline constexpr std::string_view record_name<reinforce_plus_plus_baseline_config> =
    "reinforce_plus_plus_baseline_config";
template <>
inline constexpr std::string_view record_name<multi_reward_config> = "multi_reward_config";
template <>
inline constexpr std::string_view record_name<optimal_token_baseline_config> = "optimal_token_baseline_config";
template <>
inline constexpr std::string_view record_name<dapo_overlong_config> = "dapo_overlong_config";
template <>
inline constexpr std::string_view record_name<soft_overlong_config> = "soft_overlong_config";
template <>
inline constexpr std::string_view record_name<gae_config> = "gae_config";
template <>
inline constexpr std::string_view record_name<pass_at_k_config> = "pass_at_k_config";

ULORL_NAMESPACE_END
