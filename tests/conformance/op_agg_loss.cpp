// Conformance op `agg_loss` (golden README §4.2): presets verl and openrlhf, a thin adapter from
// JSON to ulorl::agg_loss with the presets' normalisers.
#include <optional>

#include <ulorl/loss/aggregation.hpp>
#include <ulorl/presets/openrlhf.hpp>
#include <ulorl/presets/verl.hpp>

#include "conformance/registry.hpp"

namespace {
using conformance::json;


const conformance::registrar reg("agg_loss", [](const std::string& preset, const json& params, const json& inputs) -> json {
  const auto loss_mat = conformance::to_matrix(inputs.at("loss_mat"), "loss_mat");
  const auto mask = conformance::to_matrix(inputs.at("loss_mask"), "loss_mask");
  const auto lv = conformance::padded_view(loss_mat), mv = conformance::padded_view(mask);
  ulorl::require_same_shape("agg_loss", "loss_mask", mv, "loss_mat", lv);
  const auto counts = ulorl::count_batch(mv);
  const double dp = conformance::param_double(params, "dp_size", 1.0);
  ulorl::agg_normalizer norm;
  if (preset == "verl") {
    norm = ulorl::presets::verl::normalizer(
        {.loss_agg_mode = ulorl::presets::verl::loss_agg_mode_from_name(conformance::param_string(params, "loss_agg_mode", "token-mean")),
         .dp_size = dp,
         .batch_num_tokens = conformance::param_optional(params, "batch_num_tokens"),
         .global_batch_size = conformance::param_optional(params, "global_batch_size"),
         .loss_scale_factor = conformance::param_optional(params, "loss_scale_factor"),
         .padded_length = loss_mat.cols,
         .sum_norm_per_sequence = false},  // the verl cases' agg_loss is b178a3cd's (README)
        counts);
  } else if (preset == "openrlhf") {
    norm = ulorl::presets::openrlhf::normalizer({.token_level_loss = conformance::param_bool(params, "token_level_loss", true),
                                                 .dp_size = dp,
                                                 .batch_num_tokens = conformance::param_optional(params, "batch_num_tokens"),
                                                 .global_batch_size = conformance::param_optional(params, "global_batch_size")},
                                                counts);
  } else {
    throw conformance::reject("agg_loss: unknown preset '" + preset + "'");
  }
  conformance::matrix grad = loss_mat;
  const auto gv = ulorl::token_view<double>::padded(ulorl::matrix_view<double>(grad.data.data(), grad.rows, grad.cols));
  const double loss = ulorl::agg_loss(lv, mv, gv, norm);
  return json{{"loss", loss}, {"grad_loss_mat", conformance::from_matrix(grad)}};
});
}  // namespace
