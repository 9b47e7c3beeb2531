// ulorl/logits/torch_rounding.hpp — log-softmax statistics of bfloat16 / float16 logits with the
// rounding steps of torch's CPU kernels, for framework functions whose values are defined by them:
// TRL's selective_log_softmax (`log_softmax(logits).gather(index)`) and entropy_from_logits
// (`-(exp(logps) * logps).sum(-1)`) on 16-bit logits run torch's 16-bit operations, each rounded.
// logits_forward (forward.hpp) rounds each statistic once from a float32 accumulation: the
// correctly rounded value. torch's CPU log_softmax of 16-bit logits rounds the row's sum and its
// logarithm first and agrees with the correctly rounded value in about 81% (bfloat16) / 84%
// (float16) of entries (torch 2.6, randn logits, V = 1024). This file computes, with r() rounding a
// float to the logits' type:
//   m = max_v x_v,  S = r(sum_v e^{x_v - m}),  L = r(log S),  lp_v = r((x_v - m) - L)
//   log_prob_k = lp_{y_k},  entropy = r(-sum_v r(r(e^{lp_v}) * lp_v))   (sums in double)
// A -inf logit (masked vocabulary) has lp = -inf and contributes 0 to the entropy (torch's product
// 0 * -inf is NaN there). The exact gradients are logits_backward's (the values differ from the
// mathematical function by the roundings only). Plain loops: for compatibility, not speed.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <type_traits>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/views.hpp"
#include "ulorl/logits/bf16.hpp"
#include "ulorl/logits/f16.hpp"

ULORL_NAMESPACE_BEGIN

//! For each row i of logits [N, V] (bf16 or f16, any strides): log_prob(i, k) = lp_{labels(i, k)}
//! for labels [N, K] (int64 or int32; K may be 0) and entropy[i] (an empty span: not computed), with
//! torch's CPU rounding steps (see the file comment). Every logit must be finite or -inf and every
//! row must have a finite logit; labels in [0, V). Checks everything before writing.
template <class L, class I>
void logits_statistics_torch_rounding(matrix_view<const L> logits, matrix_view<const I> labels, matrix_view<L> log_prob,
                                      std::span<L> entropy) {
  static_assert(std::is_same_v<L, bf16> || std::is_same_v<L, f16>, "16-bit logits (bf16 or f16)");
  constexpr std::string_view fn = "logits_statistics_torch_rounding";
  const std::size_t n = logits.rows(), v = logits.cols();
  require_same_size(fn, "labels rows", labels.rows(), "logits rows", n);
  require_same_size(fn, "log_prob rows", log_prob.rows(), "logits rows", n);
  require_same_size(fn, "log_prob cols", log_prob.cols(), "labels cols", labels.cols());
  if (!entropy.empty()) require_same_size(fn, "entropy", entropy.size(), "logits rows", n);
  if (n > 0 && v == 0) detail::fail(fn, "logits", "has no columns (V = 0)");
  for (std::size_t i = 0; i < n; ++i) {
    bool finite = false;
    for (std::size_t j = 0; j < v; ++j) {
      const float x = logits(i, j).to_float();
      if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
        detail::fail_at(fn, "logits", static_cast<std::int64_t>(i * v + j), x, "must be finite or -inf");
      finite = finite || std::isfinite(x);
    }
    if (!finite) detail::fail_at(fn, "logits", static_cast<std::int64_t>(i), 0, "row has no finite logit");
    for (std::size_t k = 0; k < labels.cols(); ++k) {
      const auto y = labels(i, k);
      if (y < 0 || static_cast<std::uint64_t>(y) >= v)
        detail::fail_at(fn, "labels", static_cast<std::int64_t>(i * labels.cols() + k), y, "must be in [0, V)");
    }
  }
  const auto r = [](float x) { return L::from_float(x).to_float(); };
  for (std::size_t i = 0; i < n; ++i) {
    float m = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < v; ++j) m = std::fmax(m, logits(i, j).to_float());
    double s = 0.0;
    for (std::size_t j = 0; j < v; ++j) s += static_cast<double>(std::exp(logits(i, j).to_float() - m));
    const float lse = r(std::log(r(static_cast<float>(s))));
    const auto lp = [&](std::size_t j) { return r((logits(i, j).to_float() - m) - lse); };
    for (std::size_t k = 0; k < labels.cols(); ++k)
      log_prob(i, k) = L::from_float(lp(static_cast<std::size_t>(labels(i, k))));
    if (entropy.empty()) continue;
    double h = 0.0;
    for (std::size_t j = 0; j < v; ++j) {
      const float l = lp(j);
      if (l != -std::numeric_limits<float>::infinity()) h += static_cast<double>(r(r(std::exp(l)) * l));
    }
    entropy[i] = L::from_float(static_cast<float>(-h));
  }
}

ULORL_NAMESPACE_END
