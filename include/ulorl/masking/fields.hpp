// ulorl/masking/fields.hpp — the field tables (core/fields.hpp) of the masking area's
// configurations and results, the records its operators carry (ulorl/adapters/torch/ops_batch.hpp):
// mpt_config / mpt_stats and off_policy_mask_config / off_policy_mask_stats. Each table is the only
// list of its struct's fields outside the struct.
#pragma once

#include <string_view>

#include "ulorl/core/config.hpp"
#include "ulorl/core/fields.hpp"
#include "ulorl/masking/mpt.hpp"
#include "ulorl/masking/off_policy.hpp"

ULORL_NAMESPACE_BEGIN

template <class C, class F>
  requires detail::record_of<C, mpt_config>
constexpr void visit_fields(C& c, F&& f) {
  f("mode", c.mode), f("tau", c.tau), f("sigma", c.sigma), f("positive", c.positive);
  f("positive_reward", c.positive_reward), f("probability", c.probability), f("scope", c.scope);
}

template <class R, class F>
  requires detail::record_of<R, mpt_stats>
constexpr void visit_fields(R& r, F&& f) {
  f("responses", r.responses), f("tokens", r.tokens), f("positive_responses", r.positive_responses);
  f("mpt_tokens", r.mpt_tokens), f("masked_tokens", r.masked_tokens);
  f("responses_below_target", r.responses_below_target), f("batch_below_target", r.batch_below_target);
  f("mean_entropy", r.mean_entropy);
}

template <class C, class F>
  requires detail::record_of<C, off_policy_mask_config>
constexpr void visit_fields(C& c, F&& f) {
  f("delta", c.delta), f("advantage", c.advantage), f("form", c.form);
}

template <class R, class F>
  requires detail::record_of<R, off_policy_mask_stats>
constexpr void visit_fields(R& r, F&& f) {
  f("rows", r.rows), f("tokens", r.tokens), f("off_policy_rows", r.off_policy_rows);
  f("dropped_rows", r.dropped_rows), f("dropped_tokens", r.dropped_tokens), f("clipfrac", r.clipfrac);
}

template <>
inline constexpr std::string_view record_name<mpt_config> = "mpt_config";
template <>
inline constexpr std::string_view record_name<mpt_stats> = "mpt_stats";
template <>
inline constexpr std::string_view record_name<off_policy_mask_config> = "off_policy_mask_config";
template <>
inline constexpr std::string_view record_name<off_policy_mask_stats> = "off_policy_mask_stats";

ULORL_NAMESPACE_END
