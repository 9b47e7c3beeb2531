// python/src/logits.cpp — the fused logits paths of ulorl::th: the policy loss straight from
// logits (gradient computed in the forward pass; the operator ulorl::policy_loss_from_logits, or
// an autograd function writing into the logits' own memory) and the chunked linear head + loss from
// hidden states (the operator ulorl::linear_head_policy_loss); per-row log-prob and entropy from
// logits through the operator ulorl::logits_statistics (ulorl/adapters/torch/ops.hpp).
#include <torch/csrc/utils/pybind.h>

#include <pybind11/stl.h>

#include <cstddef>
#include <optional>

#include <ulorl/adapters/torch.hpp>

#include "common.hpp"

namespace ulorl_py {

namespace {
using namespace pybind11::literals;
namespace th = ulorl::th;
using opt_tensor = std::optional<at::Tensor>;
using th::or_undefined;
}  // namespace

void bind_logits(py::module_& m) {
  m.def(
      "_logits_statistics_op",
      [](const at::Tensor& logits, const at::Tensor& labels, double temperature, bool check_values, bool fast_backward) {
        const ulorl::logits_config cfg{.temperature = temperature, .check_values = check_values,
                                       .fast_backward = fast_backward};
        std::pair<at::Tensor, at::Tensor> r;
        {
          const py::gil_scoped_release nogil;
          r = th::logits_statistics(logits, labels, cfg);
        }
        return py::make_tuple(r.first, r.second);
      },
      "logits"_a, "labels"_a, "temperature"_a, "check_values"_a, "fast_backward"_a,
      "th::logits_statistics: the operator ulorl::logits_statistics called from C++ (no argument boxing).");
  m.def(
      "_logits_statistics_torch_rounding",
      [](const at::Tensor& logits, const at::Tensor& labels) {
        std::pair<at::Tensor, at::Tensor> r;
        {
          const py::gil_scoped_release nogil;
          r = th::logits_statistics_torch_rounding(logits, labels);
        }
        return py::make_tuple(r.first, r.second);
      },
      "logits"_a, "labels"_a,
      "th::logits_statistics_torch_rounding: 16-bit log-probs [N, K] and entropy [N] with torch's CPU rounding steps.");

  m.def(
      "_policy_loss_from_logits",
      [](const at::Tensor& logits, const at::Tensor& labels, const at::Tensor& old_log_prob,
         const at::Tensor& advantages, const opt_tensor& mask, const ulorl::policy_loss_config& cfg,
         const opt_tensor& ref_log_prob, const opt_tensor& weights, const opt_tensor& offsets, double temperature,
         bool check_values, bool fast_backward, bool in_place) {
        th::logits_loss_config opt;
        opt.extra = {or_undefined(ref_log_prob), or_undefined(weights), at::Tensor(), or_undefined(offsets)};
        opt.logits = {.temperature = temperature, .check_values = check_values, .fast_backward = fast_backward};
        opt.in_place = in_place;
        th::policy_loss_output out;
        {
          const py::gil_scoped_release nogil;
          out = th::policy_loss_from_logits(logits, labels, old_log_prob, advantages, or_undefined(mask), cfg, opt);
        }
        return py::make_tuple(out.loss, out.result, out.log_prob, out.entropy);
      },
      "logits"_a, "labels"_a, "old_log_prob"_a, "advantages"_a, "mask"_a, "config"_a, "ref_log_prob"_a, "weights"_a,
      "offsets"_a, "temperature"_a, "check_values"_a, "fast_backward"_a, "in_place"_a);

  m.def(
      "_linear_head_policy_loss",
      [](const at::Tensor& hidden, const at::Tensor& weight, const opt_tensor& bias, const at::Tensor& labels,
         const at::Tensor& old_log_prob, const at::Tensor& advantages, const opt_tensor& mask,
         const ulorl::policy_loss_config& cfg, const opt_tensor& ref_log_prob, const opt_tensor& weights,
         const opt_tensor& offsets, double temperature, std::size_t chunk_rows, std::size_t workspace_budget,
         bool check_values, bool fast_backward) {
        th::linear_head_loss_config opt;
        opt.extra = {or_undefined(ref_log_prob), or_undefined(weights), at::Tensor(), or_undefined(offsets)};
        opt.head.temperature = temperature;
        opt.head.chunk_rows = chunk_rows;
        opt.head.workspace_budget = workspace_budget;
        opt.head.check_values = check_values;
        opt.head.fast_backward = fast_backward;
        th::policy_loss_output out;
        {
          const py::gil_scoped_release nogil;
          out = th::linear_head_policy_loss(hidden, weight, or_undefined(bias), labels, old_log_prob, advantages,
                                            or_undefined(mask), cfg, opt);
        }
        return py::make_tuple(out.loss, out.result, out.log_prob, out.entropy);
      },
      "hidden"_a, "weight"_a, "bias"_a, "labels"_a, "old_log_prob"_a, "advantages"_a, "mask"_a, "config"_a,
      "ref_log_prob"_a, "weights"_a, "offsets"_a, "temperature"_a, "chunk_rows"_a, "workspace_budget"_a,
      "check_values"_a, "fast_backward"_a);
}

}  // namespace ulorl_py
