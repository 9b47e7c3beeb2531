// ulorl/adapters/torch/advantages.hpp — ulorl's advantage, masking, filtering and rollout
// correction functions on torch tensors (optional: needs libtorch, CMake target ulorl::torch), each
// through its operator of the `ulorl` library (ops_batch.hpp: CPU and Meta kernels). None is
// differentiable (rewards, advantages, weights and masks are constants of the loss); each returns
// new tensors:
//   group_advantages(rewards [B], groups, cfg | preset) -> advantages [B]
//   broadcast_to_tokens(advantages [B], mask [B, T] | [total] + offsets, cfg | preset) -> [B, T] | [total]
//       (packed: an undefined mask means every token inside the offsets valid)
//   mpt_mask({log_prob, entropy, mask, response_score, ...}, cfg) -> keep mask + mpt_stats (UloRL MPT)
//   dynamic_sampling_filter(metric [B], groups, cfg) -> keep [B] (bool) + counts
//   off_policy_mask(log_prob, old_log_prob, advantages, mask, cfg, offsets) -> keep, seq_kl, stats
//   rollout_correction(old_log_prob, rollout_log_prob, mask, cfg, offsets) -> weights, keep, metrics
//   dppo_weights, kl_cov_selection, clip_cov_weights (loss/token_selection.hpp) -> output, stats
//   gpg_advantages, opo_advantages, reinforce_plus_plus_advantages, reinforce_plus_plus_baseline_advantages,
//   gae_advantages, remax_advantages, pass_at_k_advantages,
//   dapo_overlong_penalties, soft_overlong_penalties,
//   multi_reward_advantages, optimal_token_baseline_advantages (advantage/*.hpp on tensors)
//   logits_statistics_torch_rounding(logits, labels) -> 16-bit log-probs and entropy as torch's CPU rounds them
// `groups` is group_ids [B] (int64 or int32, any ids >= 0, any order) or a group size (contiguous
// groups). Per-response tensors (rewards, ids, scores) must be contiguous 1-D; per-token tensors
// take any strides. Errors are ulorl::error, raised before any output exists.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "ulorl/adapters/torch/ops.hpp"
#include "ulorl/adapters/torch/tensor_views.hpp"
#include "ulorl/advantage/fields.hpp"
#include "ulorl/advantage/token_broadcast.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/loss/fields.hpp"
#include "ulorl/loss/rollout_correction.hpp"
#include "ulorl/masking/fields.hpp"
#include "ulorl/presets/nemo_rl.hpp"

ULORL_NAMESPACE_BEGIN

namespace th {

//! How responses form groups: group_ids [B] (int64 / int32) or contiguous blocks of a group size.
//! Both or neither given is an error of the call that takes them.
struct group_spec {
  at::Tensor ids{};
  std::optional<std::int64_t> size{};
  group_spec() = default;
  group_spec(const at::Tensor& group_ids) : ids(group_ids) {}  // NOLINT: implicit on purpose
  group_spec(std::int64_t group_size) : size(group_size) {}    // NOLINT: implicit on purpose
  group_spec(const at::Tensor& group_ids, std::optional<std::int64_t> group_size) : ids(group_ids), size(group_size) {}
};

namespace detail {

//! The typed operator `name` (registered on first use), looked up per call: several batch
//! operators share a signature, so the handle cannot be cached per signature as ops.hpp's are.
template <class Sig>
c10::TypedOperatorHandle<Sig> batch_op(const char* name) {
  ops::register_ops();
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").template typed<Sig>();
}
inline c10::optional<std::int64_t> size_of(const group_spec& g) {
  return g.size ? c10::optional<std::int64_t>(*g.size) : c10::nullopt;
}
//! A result record from its float64 tensor (default for meta tensors, which carry no values).
template <class R>
R record_from(std::string_view fn, const at::Tensor& t) {
  if (t.device().is_meta()) return R{};
  const at::Tensor c = t.to(at::kCPU).contiguous();
  return decode_fields<R>(fn, "result",
                          std::span<const double>(c.data_ptr<double>(), static_cast<std::size_t>(c.numel())));
}

using opt_tensor = c10::optional<at::Tensor>;
using tensor_sig = at::Tensor(const at::Tensor&, const opt_tensor&, c10::optional<std::int64_t>, c10::ArrayRef<double>);
using pair_sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const opt_tensor&, c10::optional<std::int64_t>,
                                                    c10::ArrayRef<double>);

}  // namespace detail

//! Per-response advantages of rewards [B] by group statistics.
[[nodiscard]] inline at::Tensor group_advantages(const at::Tensor& rewards, const group_spec& groups,
                                                 const group_advantage_config& cfg = {}) {
  const auto opt = ops::detail::optional;
  return detail::batch_op<detail::tensor_sig>("ulorl::group_advantages")
      .call(rewards, opt(groups.ids), detail::size_of(groups), encode_fields(cfg));
}
[[nodiscard]] inline at::Tensor group_advantages(const at::Tensor& rewards, const group_spec& groups,
                                                 const advantage_preset& preset) {
  return group_advantages(rewards, groups, preset.group);
}

//! Per-token advantages from per-response advantages [B] and the 0/1 mask (bool, uint8 or the
//! advantages' dtype; [B, T] padded, or [total] with offsets[B+1]); the result has the mask's shape
//! and the advantages' dtype. An undefined mask with offsets: every token inside the offsets valid,
//! the result [offsets[B]]; without offsets the mask is required (it gives the result's [B, T]).
[[nodiscard]] inline at::Tensor broadcast_to_tokens(const at::Tensor& advantages, const at::Tensor& mask,
                                                    const broadcast_config& cfg = {}, const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using sig =
      at::Tensor(const at::Tensor&, const detail::opt_tensor&, const detail::opt_tensor&, c10::ArrayRef<double>);
  return detail::batch_op<sig>("ulorl::broadcast_to_tokens")
      .call(advantages, opt(mask), opt(offsets), encode_fields(cfg));
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
  at::Tensor mask{};  //!< bool, uint8 or the log-probs' dtype; undefined: every token valid
  at::Tensor response_score{};
  at::Tensor offsets{};
};

//! The UloRL MPT keep mask (1 = token trains) in the mask's dtype (bool without a mask) and its counts.
[[nodiscard]] inline std::pair<at::Tensor, mpt_stats> mpt_mask(const mpt_tensors& t, const mpt_config& cfg = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = std::tuple<at::Tensor, at::Tensor>(const o&, const o&, const at::Tensor&, const o&, const at::Tensor&,
                                                 const o&, c10::ArrayRef<double>);
  auto [keep, stats] = detail::batch_op<sig>("ulorl::mpt_mask")
                           .call(opt(t.log_prob), opt(t.old_log_prob), t.entropy, opt(t.mask), t.response_score,
                                 opt(t.offsets), encode_fields(cfg));
  return {keep, detail::record_from<mpt_stats>("mpt_mask", stats)};
}

//! DAPO's dynamic-sampling filter: keep [B] (bool) is true for responses of kept groups.
[[nodiscard]] inline std::pair<at::Tensor, dynamic_sampling_result> dynamic_sampling_filter(
    const at::Tensor& metric, const group_spec& groups, const dynamic_sampling_config& cfg = {}) {
  const auto opt = ops::detail::optional;
  auto [keep, counts] = detail::batch_op<detail::pair_sig>("ulorl::dynamic_sampling_filter")
                            .call(metric, opt(groups.ids), detail::size_of(groups), encode_fields(cfg));
  return {keep, detail::record_from<dynamic_sampling_result>("dynamic_sampling_filter", counts)};
}

//! The off-policy sequence mask (masking/off_policy.hpp) of one batch: keep in log_prob's shape and
//! dtype, seq_kl [B] float64 (each row's mean KL), and the counts. `advantages` is [B] (advantage
//! level sequence) or log_prob's shape (token).
struct off_policy_mask_output {
  at::Tensor keep, seq_kl;
  off_policy_mask_stats stats;
};
[[nodiscard]] inline off_policy_mask_output off_policy_mask(const at::Tensor& log_prob, const at::Tensor& old_log_prob,
                                                            const at::Tensor& advantages, const at::Tensor& mask,
                                                            const off_policy_mask_config& cfg,
                                                            const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                             const o&, const o&, c10::ArrayRef<double>);
  auto [keep, seq_kl, stats] =
      detail::batch_op<sig>("ulorl::off_policy_mask")
          .call(log_prob, old_log_prob, advantages, opt(mask), opt(offsets), encode_fields(cfg));
  return {keep, seq_kl, detail::record_from<off_policy_mask_stats>("off_policy_mask", stats)};
}

//! A token-selection pass's output (in log_prob's shape and dtype) and its statistics.
struct token_selection_output {
  at::Tensor out;
  token_selection_stats stats;
};
//! DPPO's weights w min(r, c) v (loss/token_selection.hpp); rollout_is_weights undefined: w = 1.
[[nodiscard]] inline token_selection_output dppo_weights(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                         const at::Tensor& advantages, const at::Tensor& mask,
                                                         const at::Tensor& rollout_is_weights, const dppo_config& cfg,
                                                         const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, const o&,
                                                 const o&, const o&, c10::ArrayRef<double>);
  auto [w, stats] = detail::batch_op<sig>("ulorl::dppo_weights")
                        .call(old_log_prob, log_prob, advantages, opt(mask), opt(rollout_is_weights), opt(offsets),
                              encode_fields(cfg));
  return {w, detail::record_from<token_selection_stats>("dppo_weights", stats)};
}
//! KL-Cov's selection (1 on the selected tokens, 0 elsewhere; loss/token_selection.hpp).
[[nodiscard]] inline token_selection_output kl_cov_selection(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                             const at::Tensor& advantages, const at::Tensor& mask,
                                                             const kl_cov_config& cfg, const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, const o&,
                                                 const o&, c10::ArrayRef<double>);
  auto [sel, stats] = detail::batch_op<sig>("ulorl::kl_cov_selection")
                          .call(old_log_prob, log_prob, advantages, opt(mask), opt(offsets), encode_fields(cfg));
  return {sel, detail::record_from<token_selection_stats>("kl_cov_selection", stats)};
}
//! Clip-Cov's weights w (1 - selection) for the caller's draw `clip_cov_selection` (checked;
//! loss/token_selection.hpp).
[[nodiscard]] inline token_selection_output clip_cov_weights(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                             const at::Tensor& advantages, const at::Tensor& mask,
                                                             const at::Tensor& clip_cov_selection,
                                                             const at::Tensor& rollout_is_weights,
                                                             const clip_cov_config& cfg,
                                                             const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&, const o&,
                                                 const at::Tensor&, const o&, const o&, c10::ArrayRef<double>);
  auto [w, stats] = detail::batch_op<sig>("ulorl::clip_cov_weights")
                        .call(old_log_prob, log_prob, advantages, opt(mask), clip_cov_selection,
                              opt(rollout_is_weights), opt(offsets), encode_fields(cfg));
  return {w, detail::record_from<token_selection_stats>("clip_cov_weights", stats)};
}

//! The rollout correction of one batch (loss/rollout_correction.hpp's apply): importance weights in
//! old_log_prob's dtype, the keep mask in the mask's dtype (bool without a mask), and the metrics.
struct rollout_correction_output {
  at::Tensor weights, keep;
  rollout_correction::metrics metrics;
};
[[nodiscard]] inline rollout_correction_output rollout_correction(const at::Tensor& old_log_prob,
                                                                  const at::Tensor& rollout_log_prob,
                                                                  const at::Tensor& mask,
                                                                  const rollout_correction::config& cfg,
                                                                  const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const o&, const o&,
                                                             c10::ArrayRef<double>);
  auto [weights, keep, stats] = detail::batch_op<sig>("ulorl::rollout_correction")
                                    .call(old_log_prob, rollout_log_prob, opt(mask), opt(offsets), encode_fields(cfg));
  rollout_correction_output out{weights, keep, {}};
  if (!stats.device().is_meta())
    out.metrics = rollout_correction::finalize(
        detail::record_from<rollout_correction::statistics>("rollout_correction", stats), cfg);
  return out;
}

//! GPG advantages (advantage/baselines.hpp) of scores [B].
[[nodiscard]] inline at::Tensor gpg_advantages(const at::Tensor& scores, const group_spec& groups,
                                               const gpg_config& cfg = {}) {
  const auto opt = ops::detail::optional;
  return detail::batch_op<detail::tensor_sig>("ulorl::gpg_advantages")
      .call(scores, opt(groups.ids), detail::size_of(groups), encode_fields(cfg));
}

//! DAPO's overlong penalties (advantage/overlong.hpp) of response lengths [B] (int64, int32,
//! float32 or float64): float64 [B].
[[nodiscard]] inline at::Tensor dapo_overlong_penalties(const at::Tensor& lengths, const dapo_overlong_config& cfg) {
  using sig = at::Tensor(const at::Tensor&, c10::ArrayRef<double>);
  return detail::batch_op<sig>("ulorl::dapo_overlong_penalties").call(lengths, encode_fields(cfg));
}
//! TRL's soft overlong punishment (advantage/overlong.hpp) of response lengths [B]: float64 [B].
[[nodiscard]] inline at::Tensor soft_overlong_penalties(const at::Tensor& lengths, const soft_overlong_config& cfg) {
  using sig = at::Tensor(const at::Tensor&, c10::ArrayRef<double>);
  return detail::batch_op<sig>("ulorl::soft_overlong_penalties").call(lengths, encode_fields(cfg));
}

//! count_batch (loss/aggregation.hpp) of a 0/1 mask [B, T] (or [total] with offsets [B + 1]), or with
//! `tokens` (a float32 / float64 token tensor of the batch) of the mask against their layout, an
//! undefined mask counting every token of it valid. The operator's counts are read back to the host
//! (default counts for meta tensors, which carry no values).
[[nodiscard]] inline batch_counts count_batch(const at::Tensor& mask, const at::Tensor& offsets = {},
                                              const at::Tensor& tokens = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = at::Tensor(const o&, const o&, const o&);
  const at::Tensor t = detail::batch_op<sig>("ulorl::count_batch").call(opt(mask), opt(offsets), opt(tokens));
  if (t.device().is_meta()) return {};
  const at::Tensor host = t.to(at::kCPU).contiguous();
  return decode_fields<batch_counts>("count_batch", "counts",
                                     std::span<const double>(host.data_ptr<double>(), encoded_size_of<batch_counts>));
}

//! NeMo-RL's logged ratios (presets::nemo_rl::logged_ratios: probs_ratio, probs_ratio_clamped) of
//! log_prob and old_log_prob under a 0/1 mask (undefined: every token valid), over global_valid_toks
//! (absent: the batch's valid tokens), read back to the host (default values for meta tensors).
[[nodiscard]] inline presets::nemo_rl::ratio_metrics nemo_rl_logged_ratios(
    const at::Tensor& log_prob, const at::Tensor& old_log_prob, const at::Tensor& mask,
    const presets::nemo_rl::clipped_pg_loss_options& options, std::optional<double> global_valid_toks = {},
    const at::Tensor& offsets = {}) {
  using R = presets::nemo_rl::ratio_metrics;
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = at::Tensor(const at::Tensor&, const at::Tensor&, const o&, const o&, c10::ArrayRef<double>,
                         c10::optional<double>);
  const at::Tensor t =
      detail::batch_op<sig>("ulorl::nemo_rl_logged_ratios")
          .call(log_prob, old_log_prob, opt(mask), opt(offsets), encode_fields(options),
                global_valid_toks ? c10::optional<double>(*global_valid_toks) : c10::optional<double>());
  if (t.device().is_meta()) return {};
  const at::Tensor host = t.to(at::kCPU).contiguous();
  return decode_fields<R>("presets::nemo_rl::logged_ratios", "ratios",
                          std::span<const double>(host.data_ptr<double>(), encoded_size_of<R>));
}

//! OPO advantages (advantage/baselines.hpp) of scores [B], response lengths from the mask.
[[nodiscard]] inline at::Tensor opo_advantages(const at::Tensor& scores, const at::Tensor& mask,
                                               const group_spec& groups, const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = at::Tensor(const at::Tensor&, const at::Tensor&, const o&, c10::optional<std::int64_t>, const o&);
  return detail::batch_op<sig>("ulorl::opo_advantages")
      .call(scores, mask, opt(groups.ids), detail::size_of(groups), opt(offsets));
}

//! REINFORCE++ advantages and returns (advantage/reinforce_plus_plus.hpp) of per-token rewards; `scan` is
//! "reset_after_eos" or "skip_masked" (return_scan).
[[nodiscard]] inline std::pair<at::Tensor, at::Tensor> reinforce_plus_plus_advantages(
    const at::Tensor& token_level_rewards, const at::Tensor& mask, double gamma,
    std::string_view scan = "reset_after_eos", const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const o&, const o&, double, c10::string_view);
  auto [adv, ret] =
      detail::batch_op<sig>("ulorl::reinforce_plus_plus_advantages")
          .call(token_level_rewards, opt(mask), opt(offsets), gamma, c10::string_view(scan.data(), scan.size()));
  return {adv, ret};
}

//! REINFORCE++-baseline advantages (advantage/reinforce_plus_plus.hpp): scores [B] -> the mask's shape.
[[nodiscard]] inline at::Tensor reinforce_plus_plus_baseline_advantages(
    const at::Tensor& scores, const group_spec& groups, const at::Tensor& mask,
    const reinforce_plus_plus_baseline_config& cfg = {}, const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = at::Tensor(const at::Tensor&, const o&, c10::optional<std::int64_t>, const at::Tensor&, const o&,
                         c10::ArrayRef<double>);
  return detail::batch_op<sig>("ulorl::reinforce_plus_plus_baseline_advantages")
      .call(scores, opt(groups.ids), detail::size_of(groups), mask, opt(offsets), encode_fields(cfg));
}

//! GAE advantages and returns (advantage/gae.hpp) of per-token rewards and values.
[[nodiscard]] inline std::pair<at::Tensor, at::Tensor> gae_advantages(const at::Tensor& token_level_rewards,
                                                                      const at::Tensor& values, const at::Tensor& mask,
                                                                      const gae_config& cfg = {},
                                                                      const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const o&, const o&,
                                                 c10::ArrayRef<double>);
  auto [adv, ret] = detail::batch_op<sig>("ulorl::gae_advantages")
                        .call(token_level_rewards, values, opt(mask), opt(offsets), encode_fields(cfg));
  return {adv, ret};
}

//! ReMax advantages and returns (advantage/remax.hpp) of per-token rewards and the greedy
//! responses' rewards [B].
[[nodiscard]] inline std::pair<at::Tensor, at::Tensor> remax_advantages(const at::Tensor& token_level_rewards,
                                                                        const at::Tensor& reward_baselines,
                                                                        const at::Tensor& mask,
                                                                        const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const o&, const o&);
  auto [adv, ret] = detail::batch_op<sig>("ulorl::remax_advantages")
                        .call(token_level_rewards, reward_baselines, opt(mask), opt(offsets));
  return {adv, ret};
}

//! Pass@k advantages (advantage/pass_at_k.hpp) of scores [B]: only each group's best response is
//! non-zero.
[[nodiscard]] inline at::Tensor pass_at_k_advantages(const at::Tensor& scores, const group_spec& groups,
                                                     const pass_at_k_config& cfg = {}) {
  const auto opt = ops::detail::optional;
  return detail::batch_op<detail::tensor_sig>("ulorl::pass_at_k_advantages")
      .call(scores, opt(groups.ids), detail::size_of(groups), encode_fields(cfg));
}

//! Multi-reward (GDPO) advantages (advantage/multi_reward.hpp): reward_components [B, K] with K
//! weights -> the mask's shape.
[[nodiscard]] inline at::Tensor multi_reward_advantages(const at::Tensor& reward_components,
                                                        std::span<const double> reward_weights,
                                                        const group_spec& groups, const at::Tensor& mask,
                                                        const multi_reward_config& cfg = {},
                                                        const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = at::Tensor(const at::Tensor&, c10::ArrayRef<double>, const o&, c10::optional<std::int64_t>,
                         const at::Tensor&, const o&, c10::ArrayRef<double>);
  return detail::batch_op<sig>("ulorl::multi_reward_advantages")
      .call(reward_components, c10::ArrayRef<double>(reward_weights.data(), reward_weights.size()), opt(groups.ids),
            detail::size_of(groups), mask, opt(offsets), encode_fields(cfg));
}

//! The optimal-token-baseline inputs beside the rewards (advantage/optimal_token_baseline.hpp).
struct optimal_token_baseline_tensors {
  at::Tensor old_log_prob{};
  at::Tensor sum_pi_squared{};
  at::Tensor rollout_is_weights{};  //!< undefined: 1
};
//! Optimal-token-baseline advantages and returns of per-token rewards, groups by ids [B].
[[nodiscard]] inline std::pair<at::Tensor, at::Tensor> optimal_token_baseline_advantages(
    const at::Tensor& token_level_rewards, const at::Tensor& mask, const at::Tensor& group_ids,
    const optimal_token_baseline_tensors& extra, const optimal_token_baseline_config& cfg = {},
    const at::Tensor& offsets = {}) {
  const auto opt = ops::detail::optional;
  using o = detail::opt_tensor;
  using sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const o&, const at::Tensor&, const o&, const o&,
                                                 const o&, const o&, c10::ArrayRef<double>);
  auto [adv, ret] =
      detail::batch_op<sig>("ulorl::optimal_token_baseline_advantages")
          .call(token_level_rewards, opt(mask), group_ids, opt(extra.old_log_prob), opt(extra.sum_pi_squared),
                opt(extra.rollout_is_weights), opt(offsets), encode_fields(cfg));
  return {adv, ret};
}

//! log_prob [N, K] at labels [N, K] and entropy [N] of bf16 / f16 logits [N, V] with torch's CPU
//! rounding steps (logits/torch_rounding.hpp), in the logits' dtype; not differentiable.
[[nodiscard]] inline std::pair<at::Tensor, at::Tensor> logits_statistics_torch_rounding(const at::Tensor& logits,
                                                                                        const at::Tensor& labels) {
  using sig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&);
  auto [lp, ent] = detail::batch_op<sig>("ulorl::logits_statistics_torch_rounding").call(logits, labels);
  return {lp, ent};
}

//! The logits statistics in float64 [N] tensors, detached: log-prob of the labels, entropy and the
//! log-sum-exp of logits / temperature (logits/forward.hpp; what logits_statistics' backward reads).
[[nodiscard]] inline std::tuple<at::Tensor, at::Tensor, at::Tensor> logits_statistics_float64(
    const at::Tensor& logits, const at::Tensor& labels, const logits_config& cfg = {}) {
  using sig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, double, bool);
  return detail::batch_op<sig>("ulorl::logits_statistics_float64")
      .call(logits, labels, cfg.temperature, cfg.check_values);
}

}  // namespace th

ULORL_NAMESPACE_END
