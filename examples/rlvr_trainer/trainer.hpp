// trainer.hpp — the RL half of the libtorch trainer: one GRPO update per released batch of whole
// groups (rollout.hpp's take_experience), through ulorl::torch.
//
// train(batch), in order:
//  1. DAPO dynamic sampling (ulorl::th::dynamic_sampling_filter): groups whose rewards are all equal
//     carry no group-relative signal and are dropped; nothing left: no update.
//  2. The kept responses as one padded batch, sorted by length: input = prompt + response without
//     its last token, position t predicts token t + 1, the loss mask covers the response's tokens.
//  3. A no-grad pass of the current policy (ulorl::th::logits_statistics at the sampling temperature):
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
//
// training_loop is the RL loop of rlvr_train, one training step per step() call: scheduler steps
// until a batch of whole groups is released, train() on it, the new version declared, and every
// validate_every steps a validation that feeds on_validation. Its save / load_checkpoint write and
// restore the whole state at a step boundary (checkpoint.hpp's file): trainer, rollout, step count,
// random state; a run resumed from step K gives the same numbers, bit for bit, as one that never
// stopped (tests/trainer/test_checkpoint.cpp).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ulorl/adapters/torch.hpp>
#include <ulorl/control/kl_controller.hpp>
#include <ulorl/control/reference_reset.hpp>
#include <ulorl/presets/verl.hpp>

#include "batching.hpp"
#include "checkpoint.hpp"
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
  std::int64_t lr_warmup_steps =
      0;  //!< linear learning-rate ramp over the first optimizer steps (after each optimizer reset)
  double weight_decay = 0.0;
  double max_grad_norm = 1.0;
  double eps_low = 0.2;  //!< clip-higher (DAPO): [1 - eps_low, 1 + eps_high]
  double eps_high = 0.28;
  old_policy is = old_policy::pois;
  ulorl::mpt_config mpt{};  //!< mode off / static_mask / dynamic_mask, tau, sigma (masking/mpt.hpp)
  bool dynamic_sampling = true;
  ulorl::kl_controller_config kl{
      .type = ulorl::kl_control_type::adaptive, .init_coef = 1e-3, .target_kl = 0.02, .horizon = 2000.0};
  ulorl::reference_reset_config resets{.on_plateau = true, .patience = 3, .min_delta = 0.0, .cooldown_steps = 10};
  bool resets_enabled = true;
  //! Loss aggregation over the mini-batch, with its global counts as the normaliser: token_mean
  //! (DAPO) or seq_mean_token_mean (GRPO: each response weighs the same, whatever its length).
  ulorl::agg_mode agg = ulorl::agg_mode::token_mean;
  std::int64_t mini_batches = 1;                   //!< optimizer steps per released batch
  std::int64_t max_tokens_per_micro_batch = 8192;  //!< padded tokens per forward / backward
  double temperature = 1.0;                        //!< the engine's sampling temperature
};

//! What one train() call did.
struct train_stats {
  bool updated = false;             //!< false: every group had equal rewards (nothing to learn from)
  std::int64_t responses = 0;       //!< released
  std::int64_t kept_responses = 0;  //!< after dynamic sampling
  std::int64_t kept_groups = 0;
  double reward_mean = 0;                     //!< over all released responses
  double tokens = 0;                          //!< response tokens of the kept responses
  double loss_tokens = 0;                     //!< of which in the loss (MPT removes mastered positives)
  double mpt_masked = 0;                      //!< tokens MPT removed
  double entropy_mean = 0;                    //!< current policy, over the kept responses' tokens (before the update)
  double loss = 0, pg_loss = 0, kl_loss = 0;  //!< summed over the mini-batches' updates
  double kl_mean = 0;                         //!< k3 KL to the reference, per loss token
  double kl_coef = 0;                         //!< beta used in this update
  double clip_fraction = 0;
  double ratio_max = 0;
  double grad_norm = 0;  //!< before clipping, last mini-batch
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
    if (c_.max_tokens_per_micro_batch < 1)
      throw std::invalid_argument("grpo_trainer: max_tokens_per_micro_batch must be >= 1");
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

  //! Optimizer steps since the last optimizer reset: the learning-rate ramp's position.
  [[nodiscard]] std::int64_t optimizer_steps() const noexcept { return optimizer_steps_; }

  //! Writes the trainer's state (entries "trainer/..."): the policy's and the reference's parameters
  //! with the model's shape, the AdamW state (torch's serialisation: each parameter's step count and
  //! both moments), the learning-rate ramp's position, the KL controller and the reference-reset
  //! policy (their ulorl checkpoints, configuration included), and this trainer's configuration.
  void save(torch::serialize::OutputArchive& a) const {
    save_policy(a, "trainer/policy", policy_);
    save_policy(a, "trainer/reference", reference_);
    torch::serialize::OutputArchive opt(a.compilation_unit());
    opt_->save(opt);
    a.write("trainer/optimizer", opt);
    ckpt::put_int(a, "trainer/optimizer_steps", optimizer_steps_);
    ckpt::put_bytes(a, "trainer/kl_controller", kl_.save());
    ckpt::put_bytes(a, "trainer/reset_policy", resets_.save());
    for (const auto& [key, value] : fingerprint(c_)) ckpt::put_string(a, "trainer/config/" + key, value);
  }

  //! A trainer state read from a checkpoint and checked against this trainer, not yet applied.
  struct loaded_state {
    std::vector<torch::Tensor> policy, reference;
    std::unique_ptr<torch::optim::AdamW> optimizer;
    std::int64_t optimizer_steps = 0;
    ulorl::kl_controller kl;
    ulorl::reference_reset_policy resets;
  };

  //! Reads what save() wrote and checks it fits: the same configuration (every field of
  //! trainer_config, the controllers' configurations compared through their own serialisation) and
  //! a policy of the same shape and dtype (its current weights do not matter). Changes nothing;
  //! throws checkpoint_error naming the entry or field that does not fit.
  [[nodiscard]] loaded_state read_checkpoint(torch::serialize::InputArchive& a) {
    for (const auto& [key, value] : fingerprint(c_))
      ckpt::require_equal("trainer " + key, ckpt::get_string(a, "trainer/config/" + key), value);
    loaded_state s;
    s.policy = read_policy(a, "trainer/policy", policy_);
    s.reference = read_policy(a, "trainer/reference", reference_);
    s.optimizer_steps = ckpt::get_int(a, "trainer/optimizer_steps");
    if (s.optimizer_steps < 0) throw checkpoint_error("checkpoint: trainer/optimizer_steps is negative");
    const auto restore_machine = [&](const char* key, auto machine) {
      const auto bytes = ckpt::get_bytes(a, key);
      try {
        return decltype(machine)::restore(bytes);
      } catch (const std::exception& e) {
        throw checkpoint_error(std::string("checkpoint: entry '") + key + "': " + e.what());
      }
    };
    s.kl = restore_machine("trainer/kl_controller", kl_);
    s.resets = restore_machine("trainer/reset_policy", resets_);
    if (ulorl::kl_controller(s.kl.config()).save() != ulorl::kl_controller(c_.kl).save())
      throw checkpoint_error("checkpoint does not fit: the KL controller's configuration differs");
    if (ulorl::reference_reset_policy(s.resets.config()).save() != ulorl::reference_reset_policy(c_.resets).save())
      throw checkpoint_error("checkpoint does not fit: the reference-reset policy's configuration differs");
    // The optimizer's state is keyed by the parameters it was built over: this policy's.
    s.optimizer = make_optimizer();
    auto opt = ckpt::get_archive(a, "trainer/optimizer");
    try {
      s.optimizer->load(opt);
    } catch (const c10::Error& e) {
      throw checkpoint_error(std::string("checkpoint: entry 'trainer/optimizer': ") + e.what_without_backtrace());
    }
    for (const auto& p : policy_->parameters()) {
      const auto it = s.optimizer->state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (it == s.optimizer->state().end()) continue;  // not stepped since the last optimizer reset
      const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      if (!st.exp_avg().defined() || !st.exp_avg_sq().defined() || st.exp_avg().sizes() != p.sizes() ||
          st.exp_avg_sq().sizes() != p.sizes() || st.exp_avg().scalar_type() != p.scalar_type())
        throw checkpoint_error("checkpoint: the AdamW state does not match the policy's parameters");
    }
    return s;
  }

  //! Applies a state from read_checkpoint (of this trainer).
  void restore(loaded_state&& s) {
    load_parameters(policy_, s.policy);
    load_parameters(reference_, s.reference);
    opt_ = std::move(s.optimizer);
    optimizer_steps_ = s.optimizer_steps;
    kl_ = std::move(s.kl);
    resets_ = std::move(s.resets);
  }

  //! read_checkpoint then restore: on a throw the trainer is as it was.
  void load(torch::serialize::InputArchive& a) { restore(read_checkpoint(a)); }

  //! The padded batch and per-token tensors of one update (public for the tests).
  struct prepared {
    torch::Tensor input, labels, attention;  // [B, T] int64, int64, bool
    torch::Tensor mask, loss_mask;           // [B, T] bool: response tokens; of them those in the loss
    torch::Tensor old_log_prob, ref_log_prob, log_prob, entropy;  // [B, T] policy dtype
    torch::Tensor advantages;                                     // [B, T] policy dtype (0 off the mask)
    torch::Tensor rewards, group_ids;                             // [B]
    std::vector<std::int64_t> lengths;                            // input length of each row, ascending
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
      p.loss_mask = ulorl::th::mpt_mask({.log_prob = p.log_prob,
                                         .old_log_prob = p.old_log_prob,
                                         .entropy = p.entropy,
                                         .mask = p.mask,
                                         .response_score = p.rewards},
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
    for (const auto& [dst, src] : std::initializer_list<field>{{&q.input, &p.input},
                                                               {&q.labels, &p.labels},
                                                               {&q.attention, &p.attention},
                                                               {&q.loss_mask, &p.loss_mask},
                                                               {&q.old_log_prob, &p.old_log_prob},
                                                               {&q.ref_log_prob, &p.ref_log_prob},
                                                               {&q.advantages, &p.advantages}})
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
      auto out = ulorl::th::policy_loss_from_logits(flat, sub(q.labels).reshape({-1}), sub(q.old_log_prob),
                                                    sub(q.advantages), sub(q.loss_mask), cfg,
                                                    {.extra = {.ref_log_prob = sub(q.ref_log_prob)},
                                                     .logits = {.temperature = c_.temperature},
                                                     .in_place = true});
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
    const auto [lp, ent] = ulorl::th::logits_statistics(logits.view({n * tj, logits.size(2)}),
                                                        sub(p.labels).reshape({-1}), c_.temperature);
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
      const double ramp =
          c_.lr_warmup_steps > 0
              ? std::min(1.0, static_cast<double>(optimizer_steps_) / static_cast<double>(c_.lr_warmup_steps))
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
    opt_ = make_optimizer();
  }

  [[nodiscard]] std::unique_ptr<torch::optim::AdamW> make_optimizer() {
    return std::make_unique<torch::optim::AdamW>(policy_->parameters(),
                                                 torch::optim::AdamWOptions(c_.lr).weight_decay(c_.weight_decay));
  }

  //! Every field of the configuration as text (doubles exactly), apart from the controllers'
  //! configurations, which their own checkpoints carry.
  [[nodiscard]] static std::vector<std::pair<std::string, std::string>> fingerprint(const trainer_config& c) {
    const auto f = [](double v) {
      char b[32];
      std::snprintf(b, sizeof b, "%.17g", v);
      return std::string(b);
    };
    const auto i = [](auto v) { return std::to_string(static_cast<long long>(v)); };
    return {{"lr", f(c.lr)},
            {"lr_warmup_steps", i(c.lr_warmup_steps)},
            {"weight_decay", f(c.weight_decay)},
            {"max_grad_norm", f(c.max_grad_norm)},
            {"eps_low", f(c.eps_low)},
            {"eps_high", f(c.eps_high)},
            {"is", i(c.is)},
            {"mpt_mode", i(c.mpt.mode)},
            {"mpt_tau", f(c.mpt.tau)},
            {"mpt_sigma", f(c.mpt.sigma)},
            {"mpt_positive", i(c.mpt.positive)},
            {"mpt_positive_reward", f(c.mpt.positive_reward)},
            {"mpt_probability", i(c.mpt.probability)},
            {"mpt_scope", i(c.mpt.scope)},
            {"dynamic_sampling", i(c.dynamic_sampling)},
            {"resets_enabled", i(c.resets_enabled)},
            {"agg", i(c.agg)},
            {"mini_batches", i(c.mini_batches)},
            {"max_tokens_per_micro_batch", i(c.max_tokens_per_micro_batch)},
            {"temperature", f(c.temperature)}};
  }

  //! The model's shape, dtype, parameter names and parameters under `key`.
  static void save_policy(torch::serialize::OutputArchive& a, const std::string& key, const transformer_policy& m) {
    for (const auto& [name, value] : shape_of(m)) ckpt::put_string(a, key + "/shape/" + name, value);
    const auto named = m->named_parameters();
    for (std::size_t i = 0; i < named.size(); ++i) ckpt::put_tensor(a, key + "/" + std::to_string(i), named[i].value());
  }

  //! The parameters under `key`, checked against `m`'s shape, dtype, names and sizes.
  [[nodiscard]] static std::vector<torch::Tensor> read_policy(torch::serialize::InputArchive& a, const std::string& key,
                                                              const transformer_policy& m) {
    for (const auto& [name, value] : shape_of(m))
      ckpt::require_equal(key.substr(key.find('/') + 1) + " " + name, ckpt::get_string(a, key + "/shape/" + name),
                          value);
    std::vector<torch::Tensor> out;
    const auto params = m->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto name = key + "/" + std::to_string(i);
      auto t = ckpt::get_tensor(a, name, params[i].scalar_type(), params[i].dim());
      if (t.sizes() != params[i].sizes())
        throw checkpoint_error("checkpoint does not fit: entry '" + name + "' has another shape than the policy's");
      out.push_back(std::move(t));
    }
    return out;
  }

  [[nodiscard]] static std::vector<std::pair<std::string, std::string>> shape_of(const transformer_policy& m) {
    const auto& c = m->config();
    char rope[32];
    std::snprintf(rope, sizeof rope, "%.17g", c.rope_base);
    std::string names;
    for (const auto& p : m->named_parameters()) names += p.key() + ";";
    return {{"vocab_size", std::to_string(c.vocab_size)},
            {"d_model", std::to_string(c.d_model)},
            {"n_heads", std::to_string(c.n_heads)},
            {"n_layers", std::to_string(c.n_layers)},
            {"d_mlp", std::to_string(c.d_mlp)},
            {"max_seq", std::to_string(c.max_seq)},
            {"rope_base", rope},
            {"dtype", std::string(c10::toString(m->dtype()))},
            {"parameters", names}};
  }

  transformer_policy policy_;
  transformer_policy reference_;
  trainer_config c_;
  ulorl::kl_controller kl_;
  ulorl::reference_reset_policy resets_;
  std::unique_ptr<torch::optim::AdamW> opt_;
  std::int64_t optimizer_steps_ = 0;  // since the last optimizer reset
};

struct training_loop_config {
  std::int64_t prompts_per_step = 8;  //!< prompts offered whenever fewer are queued; the batch released per step
  std::int64_t validate_every = 0;    //!< a validation every this many steps (0: none)
};

//! What one training step did.
struct step_report {
  std::int64_t step = 0;           //!< 1, 2, ...
  std::int64_t rollout_steps = 0;  //!< scheduler steps until a batch was released
  double rollout_seconds = 0;
  std::int64_t new_tokens = 0;        //!< decoded by those scheduler steps
  std::vector<std::int64_t> lengths;  //!< of the released responses (group-major, G per group)
  std::vector<bool> truncated;        //!< of the released responses: no EOS within L_max
  train_stats train;
  bool validated = false;
  double validation = 0;  //!< when validated
  bool reset = false;     //!< the validation reset the reference
};

//! The RL loop (see the top of this file): the driver and the tests run training through step().
class training_loop {
 public:
  using validator = std::function<double()>;

  //! `rollout`'s scheduler must release `config.prompts_per_step` groups per batch (or all ready
  //! ones); `validate` measures the current policy (it must not change the rollout's state).
  training_loop(grpo_trainer& trainer, segment_rollout& rollout, const training_loop_config& config,
                validator validate = {})
      : trainer_(trainer), rollout_(rollout), c_(config), validate_(std::move(validate)) {
    if (c_.prompts_per_step < 1) throw std::invalid_argument("training_loop: prompts_per_step must be >= 1");
    if (c_.validate_every < 0) throw std::invalid_argument("training_loop: validate_every must be >= 0");
  }

  [[nodiscard]] std::int64_t steps_done() const noexcept { return step_; }
  [[nodiscard]] grpo_trainer& trainer() noexcept { return trainer_; }
  [[nodiscard]] segment_rollout& rollout() noexcept { return rollout_; }

  //! One training step: rollout until a batch is released, one update, the new version, validation.
  step_report step() {
    step_report r;
    r.step = step_ + 1;
    const rollout_batch* batch = nullptr;
    while (batch == nullptr) {
      if (rollout_.scheduler().queued_groups() < c_.prompts_per_step) rollout_.offer_prompts(c_.prompts_per_step);
      const auto rs = rollout_.step();
      ++r.rollout_steps;
      r.rollout_seconds += rs.seconds;
      r.new_tokens += rs.new_tokens;
      const auto& b = rollout_.take_experience();
      if (!b.responses.empty()) batch = &b;
    }
    for (const auto& x : batch->responses) {
      r.lengths.push_back(static_cast<std::int64_t>(x.tokens.size()));
      r.truncated.push_back(x.result == verdict::truncated);
    }
    r.train = trainer_.train(*batch, r.step);
    if (r.train.updated) rollout_.update_policy(rollout_.engine().policy_version() + 1);
    step_ = r.step;
    if (c_.validate_every > 0 && validate_ && r.step % c_.validate_every == 0) {
      r.validated = true;
      r.validation = validate_();
      r.reset = trainer_.on_validation(r.step, r.validation).reset_reference;
    }
    return r;
  }

  //! The whole state at this step boundary: "loop/..." (step count, this loop's configuration),
  //! "rng/torch_cpu" (torch's default CPU generator; the trainer draws nothing from it, its own
  //! random numbers are counter-based functions of seeds and ids, engine.hpp and task.hpp), then
  //! grpo_trainer::save and segment_rollout::save.
  void save(torch::serialize::OutputArchive& a) const {
    ckpt::put_string(a, "format", "rlvr_trainer training checkpoint");
    ckpt::put_int(a, "loop/step", step_);
    ckpt::put_int(a, "loop/prompts_per_step", c_.prompts_per_step);
    ckpt::put_int(a, "loop/validate_every", c_.validate_every);
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      ckpt::put_tensor(a, "rng/torch_cpu", gen.get_state());
    }
    trainer_.save(a);
    rollout_.save(a);
  }

  //! Restores what save() wrote into this loop, whose trainer and rollout are built like the saved
  //! ones. Everything is read and checked before anything changes: on a throw (checkpoint_error
  //! naming what does not fit) the loop, trainer and rollout are as they were.
  void load(torch::serialize::InputArchive& a) {
    ckpt::require_equal<std::string>("format", ckpt::get_string(a, "format"), "rlvr_trainer training checkpoint");
    ckpt::require_equal("prompts per step", ckpt::get_int(a, "loop/prompts_per_step"), c_.prompts_per_step);
    ckpt::require_equal("validate every", ckpt::get_int(a, "loop/validate_every"), c_.validate_every);
    const auto step = ckpt::get_int(a, "loop/step");
    if (step < 0) throw checkpoint_error("checkpoint: loop/step is negative");
    const auto rng = ckpt::get_tensor(a, "rng/torch_cpu", torch::kUInt8, 1);
    auto trainer = trainer_.read_checkpoint(a);
    auto rollout = rollout_.read_checkpoint(a);
    auto gen = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      const auto before = gen.get_state();
      try {
        gen.set_state(rng);
      } catch (const c10::Error& e) {
        gen.set_state(before);
        throw checkpoint_error(std::string("checkpoint: entry 'rng/torch_cpu': ") + e.what_without_backtrace());
      }
    }
    trainer_.restore(std::move(trainer));
    rollout_.restore(std::move(rollout));
    step_ = step;
  }

  //! save() and the entries `extra` writes (the driver's records), to the file `path`, atomically.
  void save_checkpoint(const std::string& path,
                       const std::function<void(torch::serialize::OutputArchive&)>& extra = {}) const {
    torch::serialize::OutputArchive a;
    save(a);
    if (extra) extra(a);
    write_checkpoint_file(path, a);
  }

  //! Reads the checkpoint file `path` (checkpoint.hpp's checks), then `extra` (the driver's records;
  //! it runs first, so that a record that does not fit leaves the loop untouched), then load().
  void load_checkpoint(const std::string& path,
                       const std::function<void(torch::serialize::InputArchive&)>& extra = {}) {
    auto a = read_checkpoint_file(path);
    if (extra) extra(a);
    load(a);
  }

 private:
  grpo_trainer& trainer_;
  segment_rollout& rollout_;
  training_loop_config c_;
  validator validate_;
  std::int64_t step_ = 0;
};

}  // namespace rlvr
