// python/src/common.hpp — shared declarations of the `ulorl._ulorl` extension's translation units:
// module.cpp (configurations, presets, controllers, scheduler; no torch headers), losses.cpp
// (policy loss, advantages, masks on tensors), logits.cpp (the fused logits / linear-head paths) and
// corrections.cpp (rollout correction, further advantage estimators, aggregation, KL penalty,
// off-policy mask, the frameworks' batch passes).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <ulorl/core/error.hpp>
#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/presets/trl.hpp>
#include <ulorl/presets/verl.hpp>

namespace ulorl_py {

namespace py = pybind11;

//! Name -> enum value through the library's one parser (ulorl::value_of_name): ulorl::error listing
//! the known names.
template <class E>
E parse_name(std::string_view fn, std::string_view arg, std::string_view name,
             std::initializer_list<std::pair<std::string_view, E>> known) {
  return ulorl::value_of_name(fn, arg, name, known);
}

//! TRL's `scale_rewards` names.
inline ulorl::presets::trl::scale_rewards trl_scale_rewards_of(std::string_view fn, std::string_view name) {
  using S = ulorl::presets::trl::scale_rewards;
  return parse_name<S>(fn, "scale_rewards", name, {{"group", S::group}, {"batch", S::batch}, {"none", S::none}});
}

//! verl's normaliser options from its option names (`loss_agg_mode` by name).
inline ulorl::presets::verl::normalizer_options verl_normalizer_options(const std::string& loss_agg_mode, double dp_size,
                                                                        std::optional<double> batch_num_tokens,
                                                                        std::optional<double> global_batch_size,
                                                                        std::optional<double> loss_scale_factor,
                                                                        std::size_t padded_length) {
  return {.loss_agg_mode = ulorl::presets::verl::loss_agg_mode_from_name(loss_agg_mode),
          .dp_size = dp_size,
          .batch_num_tokens = batch_num_tokens,
          .global_batch_size = global_batch_size,
          .loss_scale_factor = loss_scale_factor,
          .padded_length = padded_length};
}

//! The metrics and loss parts of one call as a Python dict.
py::dict result_dict(const ulorl::policy_loss_result& r);

void bind_losses(py::module_& m);
void bind_logits(py::module_& m);
void bind_corrections(py::module_& m);

}  // namespace ulorl_py
