// trainer.hpp — the RL half of the libtorch trainer: one GRPO update per released batch of whole
// groups (rollout.hpp's take_experience), through ulorl::torch.
//
// train(batch), in order:
//  1. DAPO dynamic sampling (ulorl::th::dynamic_sampling_filter): groups whose rewards are all equal
//     carry no group-relative signal and are dropped; nothing left: no update.
//  2. The kept responses as one padded batch, sorted by length: input = prompt + response without
//     its last token, position t predicts token t + 1, the loss mask covers the response's tokens.
//  3. A no-grad pass of the current policy (ulorl::th::logits_stats at the sampling temperature):
//     every token's log-prob and entropy; and of the reference policy: the KL anchor's log-probs.
//  4. The old log-probs: POIS (UloRL's choice) takes the current policy's (step 3), so every token is
//     treated as on-policy whatever version sampled it; SAIS takes the engine's sampling log-probs,
//     token by token at the version that sampled it (rollout_response::log_probs).
//  5. GRPO advantages over the kept groups (verl preset), broadcast to the tokens; UloRL's MPT mask
//     (ulorl::th::mpt_mask; off, static or dynamic) removes mastered positive tokens from the loss.
//  6. `mini_batches` optimizer steps, each over an interleaved share of the rows, each in
//     micro-batches of at most `max_tokens_per_micro_batch` padded tokens: the fused loss from the
//     logits (ulorl::th::policy_loss_from_logits: clip-higher, k3 KL to the reference with the
//     adaptive controller's beta, token-mean over the mini-batch's global token count, in-place
//     d loss / d logits), backward per micro-batch (the gradients add up exactly to the
//     mini-batch's), gradient-norm clipping, AdamW.
//  7. The KL controller sees the mean KL; the reference-reset policy sees the step's loss terms.
// The caller then declares the new weights: segment_rollout::update_policy(version + 1).
// on_validation(step, accuracy) feeds ProRL's reset policy: on a plateau the reference becomes a
// copy of the current policy and the optimizer restarts.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ulorl/adapters/torch.hpp>
#include <ulorl/control/kl_controller.hpp>
#include <ulorl/control/reference_reset.hpp>

#include "batching.hpp"
#include "policy.hpp"
#include "rollout.hpp"
#include "task.hpp"

namespace rlvr {

//! Which policy's log-probs are the importance-sampling denominator (UloRL §3.1).
enum class old_policy {
  pois,  //!< pseudo on-policy: the current weights before the update, for every token
  sais,  //!< segment-aware: each token's sampling log-prob, at the version that sampled it
};

struct trainer_config {
  double lr = 1e-5;  //!< AdamW
  std::int64_t lr_warmup_steps = 0;  //!< linear learning-rate ramp over the first optimizer steps (after each optimizer reset)
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
  double eps_low = 0.2;   //!< clip-higher (DAPO): [1 - eps_low, 1 + eps_high]
  double eps_high = 0.28;
  old_policy is = old_policy::pois;
  ulorl::mpt_config mpt{};  //!< mode off / static_mask / dynamic_mask, tau, sigma (masking/mpt.hpp)
  bool dynamic_sampling = true;
  ulorl::kl_controller_config kl{.type = ulorl::kl_control_type::adaptive, .init_coef = 1e-3, .target_kl = 0.02,
                                 .horizon = 2000.0};
  ulorl::reference_reset_config resets{.on_plateau = true, .patience = 3, .min_delta = 0.0, .cooldown_steps = 10};
  bool resets_enabled = true;
  //! Loss aggregation over the mini-batch, with its global counts as the normaliser: token_mean
  //! (DAPO) or seq_mean_token_mean (GRPO: each response weighs the same, whatever its length).
  ulorl::agg_mode agg = ulorl::agg_mode::token_mean;
  std::int64_t mini_batches = 1;                  //!< optimizer steps per released batch
  std::int64_t max_tokens_per_micro_batch = 8192;  //!< padded tokens per forward / backward
  double temperature = 1.0;                       //!< the engine's sampling temperature
};

//! What one train() call did.
struct train_stats {
  bool updated = false;             //!< false: every group had equal rewards (nothing to learn from)
  std::int64_t responses = 0;       //!< released
  std::int64_t kept_responses = 0;  //!< after dynamic sampling
  std::int64_t kept_groups = 0;
  double reward_mean = 0;           //!< over all released responses
  double tokens = 0;                //!< response tokens of the kept responses
  double loss_tokens = 0;           //!< of which in the loss (MPT removes mastered positives)
  double mpt_masked = 0;            //!< tokens MPT removed
  double entropy_mean = 0;          //!< current policy, over the kept responses' tokens (before the update)
  double loss = 0, pg_loss = 0, kl_loss = 0;  //!< summed over the mini-batches' updates
  double kl_mean = 0;               //!< k3 KL to the reference, per loss token
  double kl_coef = 0;               //!< beta used in this update
  double clip_fraction = 0;
  double ratio_max = 0;
  double grad_norm = 0;             //!< before clipping, last mini-batch
  double seconds = 0;
};

class grpo_trainer {
 public:
  grpo_trainer(transformer_policy policy, const trainer_config& config)
      : policy_(std::move(policy)),
        reference_(transformer_policy(policy_->config())),
        c_(config),
        kl_(config.kl),
        resets_(config.resets) {
    if (c_.mini_batches < 1) throw std::invalid_argument("grpo_trainer: mini_batches must be >= 1");
    if (c_.max_tokens_per_micro_batch < 1) throw std::invalid_argument("grpo_trainer: max_tokens_per_micro_batch must be >= 1");
    reference_->to(policy_->dtype());
    load_parameters(reference_, snapshot_parameters(policy_));
    reference_->eval();
    reset_optimizer();
  }

  [[nodiscard]] transformer_policy& policy() noexcept { return policy_; }
  [[nodiscard]] transformer_policy& reference() noexcept { return reference_; }
  [[nodiscard]] const ulorl::kl_controller& kl_controller() const noexcept { return kl_; }
  [[nodiscard]] const ulorl::reference_reset_policy& reset_policy() const noexcept { return resets_; }
  [[nodiscard]] torch::optim::AdamW& optimizer() noexcept { return *opt_; }

  //! One GRPO update on `batch` (see the top of this file). `step` is the training step (the
  //! reset policy's clock).
  train_stats train(const rollout_batch& batch, std::int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    train_stats st;
    st.responses = static_cast<std::int64_t>(batch.responses.size());
    for (const auto& r : batch.responses) st.reward_mean += r.reward;
    if (st.responses > 0) st.reward_mean /= static_cast<double>(st.responses);
    std::vector<std::size_t> kept = kept_rows(batch, st);
    if (!kept.empty()) {
      prepared p = prepare(batch, kept);
      st.tokens = p.mask.sum().item<double>();
      st.loss_tokens = p.loss_mask.sum().item<double>();
      st.mpt_masked = st.tokens - st.loss_tokens;
      st.entropy_mean = (p.entropy * p.mask).sum().item<double>() / std::max(1.0, st.tokens);
      update(p, st);
      st.updated = true;
      if (c_.resets_enabled) apply(resets_.observe_step(step, st.kl_loss, st.pg_loss));
    }
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
  }

  //! A validation result: ProRL's plateau trigger may reset the reference (and the optimizer).
  ulorl::reset_action on_validation(std::int64_t step, double accuracy) {
    if (!c_.resets_enabled) return {};
    const auto a = resets_.observe_validation(step, accuracy);
    apply(a);
    return a;
  }

  //! pi_ref <- pi_theta (and, per the reset policy's configuration, a fresh optimizer).
  void reset_reference(bool reset_optimizer_too) {
    load_parameters(reference_, snapshot_parameters(policy_));
    if (reset_optimizer_too) reset_optimizer();
  }

  //! The padded batch and per-token tensors of one update (public for the tests).
  struct prepared {
    torch::Tensor input, labels, attention;  // [B, T] int64, int64, bool
    torch::Tensor mask, loss_mask;           // [B, T] bool: response tokens; of them those in the loss
    torch::Tensor old_log_prob, ref_log_prob, log_prob, entropy;  // [B, T] policy dtype
    torch::Tensor advantages;                // [B, T] policy dtype (0 off the mask)
    torch::Tensor rewards, group_ids;        // [B]
    std::vector<std::int64_t> lengths;       // input length of each row, ascending
  };

  //! Steps 2-5 for the rows `kept` of `batch`.
  prepared prepare(const rollout_batch& batch, const std::vector<std::size_t>& kept) {
    prepared p;
    const auto dtype = policy_->dtype();
    std::vector<std::size_t> order = kept;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return batch.responses[a].tokens.size() < batch.responses[b].tokens.size();
    });
    const auto B = static_cast<std::int64_t>(order.size());
    const std::int64_t P = countdown_task::prompt_tokens;
    const auto T = P - 1 + static_cast<std::int64_t>(batch.responses[order.back()].tokens.size());
    p.input = torch::full({B, T}, countdown_task::pad_token, torch::kInt64);
    p.labels = torch::full({B, T}, countdown_task::pad_token, torch::kInt64);
    p.attention = torch::zeros({B, T}, torch::kBool);
    p.mask = torch::zeros({B, T}, torch::kBool);
    auto sampled = torch::zeros({B, T}, torch::kFloat64);
    p.rewards = torch::empty({B}, torch::kFloat64);
    p.group_ids = torch::empty({B}, torch::kInt64);
    auto in = p.input.accessor<std::int64_t, 2>();
    auto lab = p.labels.accessor<std::int64_t, 2>();
    auto att = p.attention.accessor<bool, 2>();
    auto m = p.mask.accessor<bool, 2>();
    auto sp = sampled.accessor<double, 2>();
    for (std::int64_t i = 0; i < B; ++i) {
      const auto& r = batch.responses[order[static_cast<std::size_t>(i)]];
      if (static_cast<std::int64_t>(r.prompt.size()) != P || r.tokens.empty() || r.log_probs.size() != r.tokens.size())
        throw std::invalid_argument("grpo_trainer: response " + std::to_string(r.info.response_id) +
                                    " has no tokens or a malformed prompt / log-prob record");
      std::vector<std::int64_t> seq = r.prompt;
      seq.insert(seq.end(), r.tokens.begin(), r.tokens.end());
      const auto len = static_cast<std::int64_t>(seq.size()) - 1;
      p.lengths.push_back(len);
      for (std::int64_t t = 0; t < len; ++t) {
        in[i][t] = seq[static_cast<std::size_t>(t)];
        att[i][t] = true;
        lab[i][t] = seq[static_cast<std::size_t>(t + 1)];
        if (t >= P - 1) {
          m[i][t] = true;
          sp[i][t] = r.log_probs[static_cast<std::size_t>(t - (P - 1))];
        }
      }
      p.rewards[i] = r.reward;
      p.group_ids[i] = r.info.group_id;
    }
    // 3. Current and reference log-probs and entropies, no grad.
    p.log_prob = torch::zeros({B, T}, dtype);
    p.entropy = torch::zeros({B, T}, dtype);
    p.ref_log_prob = torch::zeros({B, T}, dtype);
    {
      torch::NoGradGuard no_grad;
      for_micro_batches(p.lengths, [&](std::int64_t lo, std::int64_t n, std::int64_t tj) {
        const auto [lp, ent] = stats(policy_, p, lo, n, tj);
        p.log_prob.narrow(0, lo, n).narrow(1, 0, tj).copy_(lp);
        p.entropy.narrow(0, lo, n).narrow(1, 0, tj).copy_(ent);
        p.ref_log_prob.narrow(0, lo, n).narrow(1, 0, tj).copy_(stats(reference_, p, lo, n, tj).first);
      });
    }
    // 4. The importance-sampling denominator.
    p.old_log_prob = c_.is == old_policy::pois ? p.log_prob.clone() : sampled.to(dtype);
    // 5. Advantages and the MPT mask.
    const auto preset = ulorl::presets::verl::grpo_advantage();
    const auto adv = ulorl::th::group_advantages(p.rewards, p.group_ids, preset);
    p.advantages = ulorl::th::broadcast_to_tokens(adv.to(dtype), p.mask, preset);
    if (c_.mpt.mode == ulorl::mpt_mode::off) {
      p.loss_mask = p.mask.clone();
    } else {
      p.loss_mask = ulorl::th::mpt_mask({.log_prob = p.log_prob, .old_log_prob = p.old_log_prob, .entropy = p.entropy,
                                         .mask = p.mask, .response_score = p.rewards},
                                        c_.mpt)
                        .first;
    }
    return p;
  }

  //! Step 6 without the optimizer: loss and gradients (accumulated into .grad) of the rows
  //! `rows` of `p` (ascending), normalised by their loss tokens. Returns the summed result.
  ulorl::policy_loss_result loss_and_grad(const prepared& p, const std::vector<std::int64_t>& rows) {
    const auto idx = torch::tensor(rows, torch::kInt64);
    prepared q;
    using field = std::pair<torch::Tensor*, const torch::Tensor*>;
    for (const auto& [dst, src] : std::initializer_list<field>{
             {&q.input, &p.input}, {&q.labels, &p.labels}, {&q.attention, &p.attention}, {&q.loss_mask, &p.loss_mask},
             {&q.old_log_prob, &p.old_log_prob}, {&q.ref_log_prob, &p.ref_log_prob}, {&q.advantages, &p.advantages}})
      *dst = src->index_select(0, idx);
    for (const auto r : rows) q.lengths.push_back(p.lengths[static_cast<std::size_t>(r)]);
    ulorl::policy_loss_config cfg{.objective = {.eps_low = c_.eps_low, .eps_high = c_.eps_high},
                                  .kl = {.estimator = ulorl::kl_estimator::k3},
                                  .kl_coef = kl_.value()};
    // The update's global normaliser: every micro-batch divides by the same token (or response) count.
    const double tokens = q.loss_mask.sum().item<double>();
    const double sequences = q.loss_mask.any(1).sum().item<double>();
    cfg.normalizer = ulorl::global_normalizer(c_.agg, {.tokens = std::max(1.0, tokens),
                                                       .sequences = std::max(1.0, sequences),
                                                       .rows = static_cast<double>(rows.size())});
    ulorl::policy_loss_result total;
    for_micro_batches(q.lengths, [&](std::int64_t lo, std::int64_t n, std::int64_t tj) {
      const auto sub = [&](const torch::Tensor& t) { return t.narrow(0, lo, n).narrow(1, 0, tj); };
      const auto logits = policy_->forward(sub(q.input), sub(q.attention));
      const auto flat = logits.view({n * tj, logits.size(2)});
      auto out = ulorl::th::policy_loss_from_logits(
          flat, sub(q.labels).reshape({-1}), sub(q.old_log_prob), sub(q.advantages), sub(q.loss_mask), cfg,
          {.extra = {.ref_log_prob = sub(q.ref_log_prob)}, .logits = {.temperature = c_.temperature}, .in_place = true});
      out.loss.backward();
      total.loss += out.result.loss;
      total.pg_loss += out.result.pg_loss;
      total.kl_loss += out.result.kl_loss;
      total.entropy_loss += out.result.entropy_loss;
      total.metrics.merge(out.result.metrics);
    });
    return total;
  }

 private:
  //! Row indices of the kept groups' responses (all, without dynamic sampling).
  std::vector<std::size_t> kept_rows(const rollout_batch& batch, train_stats& st) const {
    std::vector<std::size_t> kept;
    if (batch.responses.empty()) return kept;
    const auto B = static_cast<std::int64_t>(batch.responses.size());
    auto rewards = torch::empty({B}, torch::kFloat64);
    auto ids = torch::empty({B}, torch::kInt64);
    for (std::int64_t i = 0; i < B; ++i) {
      rewards[i] = batch.responses[static_cast<std::size_t>(i)].reward;
      ids[i] = batch.responses[static_cast<std::size_t>(i)].info.group_id;
    }
    torch::Tensor keep = torch::ones({B}, torch::kBool);
    if (c_.dynamic_sampling) {
      auto [k, r] = ulorl::th::dynamic_sampling_filter(rewards, ids, {.drop_zero_variance = true});
      keep = k;
      st.kept_groups = static_cast<std::int64_t>(r.kept_groups);
    } else {
      std::set<std::int64_t> groups;
      for (const auto& r : batch.responses) groups.insert(r.info.group_id);
      st.kept_groups = static_cast<std::int64_t>(groups.size());
    }
    const auto kp = keep.accessor<bool, 1>();
    for (std::int64_t i = 0; i < B; ++i)
      if (kp[i]) kept.push_back(static_cast<std::size_t>(i));
    st.kept_responses = static_cast<std::int64_t>(kept.size());
    return kept;
  }

  //! Calls f(first_row, rows, columns) for the micro-batches of the length-sorted rows [0, n).
  template <class F>
  void for_micro_batches(const std::vector<std::int64_t>& lengths, F&& f) const {
    for_padded_micro_batches(
        lengths.size(), c_.max_tokens_per_micro_batch, [&](std::size_t i) { return lengths[i]; },
        [&](std::size_t first, std::size_t count) {
          f(static_cast<std::int64_t>(first), static_cast<std::int64_t>(count), lengths[first + count - 1]);
        });
  }

  //! Log-probs and entropies [n, tj] of rows [lo, lo + n) under `model`.
  std::pair<torch::Tensor, torch::Tensor> stats(transformer_policy& model, const prepared& p, std::int64_t lo,
                                                std::int64_t n, std::int64_t tj) {
    const auto sub = [&](const torch::Tensor& t) { return t.narrow(0, lo, n).narrow(1, 0, tj); };
    const auto logits = model->forward(sub(p.input), sub(p.attention));
    const auto [lp, ent] = ulorl::th::logits_stats(logits.view({n * tj, logits.size(2)}), sub(p.labels).reshape({-1}),
                                                   c_.temperature);
    return {lp.view({n, tj}), ent.view({n, tj})};
  }

  void update(const prepared& p, train_stats& st) {
    const auto B = static_cast<std::int64_t>(p.lengths.size());
    st.kl_coef = kl_.value();
    ulorl::loss_metrics metrics;
    for (std::int64_t mb = 0; mb < c_.mini_batches; ++mb) {
      std::vector<std::int64_t> rows;
      for (std::int64_t i = mb; i < B; i += c_.mini_batches) rows.push_back(i);
      if (rows.empty()) continue;
      policy_->train();
      ++optimizer_steps_;
      const double ramp = c_.lr_warmup_steps > 0 ? std::min(1.0, static_cast<double>(optimizer_steps_) /
                                                                     static_cast<double>(c_.lr_warmup_steps))
                                                 : 1.0;
      for (auto& g : opt_->param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(c_.lr * ramp);
      opt_->zero_grad();
      const auto r = loss_and_grad(p, rows);
      st.grad_norm = torch::nn::utils::clip_grad_norm_(policy_->parameters(), c_.max_grad_norm);
      opt_->step();
      policy_->eval();
      st.loss += r.loss;
      st.pg_loss += r.pg_loss;
      st.kl_loss += r.kl_loss;
      metrics.merge(r.metrics);
    }
    st.kl_mean = metrics.tokens > 0 ? metrics.kl_sum / metrics.tokens : 0.0;
    st.clip_fraction = metrics.clip_fraction();
    st.ratio_max = metrics.ratio_max;
    kl_.update(st.kl_mean, st.kept_responses);
  }

  void apply(const ulorl::reset_action& a) {
    if (a.reset_reference) reset_reference(a.reset_optimizer);
  }

  void reset_optimizer() {
    optimizer_steps_ = 0;
    opt_ = std::make_unique<torch::optim::AdamW>(policy_->parameters(),
                                                 torch::optim::AdamWOptions(c_.lr).weight_decay(c_.weight_decay));
  }

  transformer_policy policy_;
  transformer_policy reference_;
  trainer_config c_;
  ulorl::kl_controller kl_;
  ulorl::reference_reset_policy resets_;
  std::unique_ptr<torch::optim::AdamW> opt_;
  std::int64_t optimizer_steps_ = 0;  // since the last optimizer reset
};

}  // namespace rlvr
