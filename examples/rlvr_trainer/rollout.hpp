// rollout.hpp — the segment scheduler driving the decoding engine on the countdown task.
//
// segment_rollout owns a ulorl::segment_scheduler and keeps, per live response, the tokens the
// engine produced with their sampling log-probs and the weight version that sampled each one.
// One step() is exactly the scheduler's protocol:
//   plan()                        which responses decode this step, from where, for how many tokens
//   engine.generate(requests)     each item: context = prompt + committed tokens (re-prefilled under
//                                 the current weights), at most max_new_tokens new ones
//   report(id, n, eos|segment_end) per item, then end_step()
// take_experience() turns the scheduler's released groups into trainer-ready responses (tokens,
// log-probs, per-token versions, provenance spans, verifier verdict and reward);
// update_policy(v) declares new weights to the engine and the scheduler together. Nothing else
// decides what is decoded: segments, pauses, resumes and releases are all the scheduler's.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ulorl/rollout/segment_scheduler.hpp>

#include "engine.hpp"
#include "task.hpp"

namespace rlvr {

//! One released response, ready for the trainer.
struct rollout_response {
  ulorl::released_response info;               //!< the scheduler's record (ids, state, steps, versions)
  std::vector<ulorl::version_span> spans;      //!< provenance: tokens [b, e) sampled by version v
  std::int64_t target = 0;                     //!< the prompt's S
  std::vector<std::int64_t> prompt;
  std::vector<std::int64_t> tokens;            //!< the response (EOS included when finished)
  std::vector<double> log_probs;                //!< sampling log-prob of each token (engine, at its version)
  std::vector<std::int64_t> versions;          //!< engine weight version that sampled each token
  verdict result = verdict::truncated;
  double reward = 0;
};

//! Whole groups released by one take_experience(); storage is reused by the next call.
struct rollout_batch {
  std::int64_t policy_version = 0;  //!< current version at release (POIS's old policy)
  std::int64_t step = 0;
  std::vector<std::int64_t> group_ids;
  std::vector<rollout_response> responses;  //!< G per group, group-major
};

//! What one scheduler step did.
struct rollout_step_stats {
  std::int64_t step = 0;
  std::int64_t items = 0;           //!< plan items decoded
  std::int64_t resumed_items = 0;   //!< of which continue a paused response
  std::int64_t new_groups = 0;
  std::int64_t new_tokens = 0;
  std::int64_t finished = 0;        //!< responses that reached EOS this step
  std::int64_t truncated = 0;       //!< responses that reached L_max this step
  std::int64_t completed_groups = 0;
  std::int64_t prefill_tokens = 0;
  double seconds = 0;               //!< wall time of the step (prefill, decode, bookkeeping)
};

class segment_rollout {
 public:
  //! S of each prompt, by group id.
  using target_source = std::function<std::int64_t(std::int64_t group_id)>;

  //! `config.max_response_tokens` must equal the task's L_max. A scheduler starts at the engine's
  //! current policy version, so an evaluation rollout can be created at any point of training.
  segment_rollout(const countdown_task& task, decode_engine& engine, const ulorl::segment_scheduler_config& config,
                  target_source targets, std::uint64_t stream = 0)
      : task_(task), engine_(engine), sched_(config), targets_(std::move(targets)), stream_(stream) {
    if (config.max_response_tokens != task.max_response_tokens())
      throw std::invalid_argument("segment_rollout: scheduler max_response_tokens " +
                                  std::to_string(config.max_response_tokens) + " differs from the task's " +
                                  std::to_string(task.max_response_tokens()));
    if (engine.policy_version() > 0) sched_.update_policy(engine.policy_version());
  }

  [[nodiscard]] const ulorl::segment_scheduler& scheduler() const noexcept { return sched_; }
  [[nodiscard]] decode_engine& engine() noexcept { return engine_; }
  std::int64_t offer_prompts(std::int64_t n) { return sched_.offer_prompts(n); }

  //! One scheduler step: plan, decode every item, report, end_step.
  rollout_step_stats step() {
    const auto t0 = std::chrono::steady_clock::now();
    const auto prefill_before = engine_.costs().prefill_tokens;
    const auto plan = sched_.plan();
    // plan.items is valid only until the next mutating call, and report() is one: keep a copy.
    items_.assign(plan.items.begin(), plan.items.end());
    for (std::int64_t g = plan.first_new_group; g < plan.first_new_group + plan.new_groups; ++g) {
      const auto s = targets_(g);
      groups_.emplace(g, group_data{s, task_.prompt(s)});
    }
    contexts_.resize(items_.size());
    requests_.resize(items_.size());
    for (std::size_t i = 0; i < items_.size(); ++i) {
      const auto& it = items_[i];
      if (it.policy_version != engine_.policy_version())
        throw std::logic_error("segment_rollout::step: item planned under version " + std::to_string(it.policy_version) +
                               " but the engine holds version " + std::to_string(engine_.policy_version()));
      auto& buf = live_[it.response_id];
      // The scheduler's committed count is the truth: a staleness drop restarts a response at 0.
      if (static_cast<std::int64_t>(buf.tokens.size()) < it.start_token)
        throw std::logic_error("segment_rollout::step: response " + std::to_string(it.response_id) + " has " +
                               std::to_string(buf.tokens.size()) + " tokens, the plan resumes it at " +
                               std::to_string(it.start_token));
      buf.resize(static_cast<std::size_t>(it.start_token));
      const auto& prompt = groups_.at(it.group_id).prompt;
      auto& ctx = contexts_[i];
      ctx.assign(prompt.begin(), prompt.end());
      ctx.insert(ctx.end(), buf.tokens.begin(), buf.tokens.end());
      requests_[i] = decode_request{.sequence_id = it.response_id,
                                    .context = ctx,
                                    .first_index = it.start_token,
                                    .max_new_tokens = it.max_new_tokens,
                                    .stream = stream_};
    }
    try {
      engine_.generate(requests_, results_);
    } catch (...) {
      (void)sched_.end_step();  // unreported items count as aborted: their committed tokens stay
      throw;
    }
    for (std::size_t i = 0; i < items_.size(); ++i) {
      const auto& it = items_[i];
      const auto& res = results_[i];
      auto& buf = live_[it.response_id];
      buf.tokens.insert(buf.tokens.end(), res.tokens.begin(), res.tokens.end());
      buf.log_probs.insert(buf.log_probs.end(), res.log_probs.begin(), res.log_probs.end());
      buf.versions.insert(buf.versions.end(), res.tokens.size(), it.policy_version);
      sched_.report(it.response_id, static_cast<std::int64_t>(res.tokens.size()),
                    res.eos ? ulorl::decode_outcome::eos : ulorl::decode_outcome::segment_end);
    }
    const auto summary = sched_.end_step();
    rollout_step_stats st;
    st.step = summary.step;
    st.items = summary.items;
    st.resumed_items = plan.resumed_items;
    st.new_groups = plan.new_groups;
    st.new_tokens = summary.new_tokens;
    st.finished = summary.finished;
    st.truncated = summary.truncated;
    st.completed_groups = summary.completed_groups;
    st.prefill_tokens = engine_.costs().prefill_tokens - prefill_before;
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return st;
  }

  //! Released whole groups (see ulorl::segment_scheduler::take_experience), verified and rewarded.
  const rollout_batch& take_experience(bool allow_partial = false) {
    const auto& b = sched_.take_experience(allow_partial);
    batch_.policy_version = b.policy_version;
    batch_.step = b.step;
    batch_.group_ids.assign(b.group_ids.begin(), b.group_ids.end());
    batch_.responses.resize(b.responses.size());
    for (std::size_t i = 0; i < b.responses.size(); ++i) {
      const auto& r = b.responses[i];
      auto node = live_.extract(r.response_id);
      if (node.empty() || static_cast<std::int64_t>(node.mapped().tokens.size()) != r.tokens)
        throw std::logic_error("segment_rollout::take_experience: response " + std::to_string(r.response_id) +
                               " released with tokens the engine did not produce");
      auto& out = batch_.responses[i];
      const auto& g = groups_.at(r.group_id);
      const auto spans = b.spans_of(r);
      out.info = r;
      out.spans.assign(spans.begin(), spans.end());
      out.target = g.target;
      out.prompt = g.prompt;
      out.tokens = std::move(node.mapped().tokens);
      out.log_probs = std::move(node.mapped().log_probs);
      out.versions = std::move(node.mapped().versions);
      out.result = task_.verify(out.target, out.tokens);
      out.reward = out.result == verdict::correct ? 1.0 : 0.0;
    }
    for (const auto g : b.group_ids) groups_.erase(g);
    return batch_;
  }

  //! The weights changed: the engine and the scheduler move to `version` together.
  void update_policy(std::int64_t version) {
    engine_.set_policy_version(version);
    sched_.update_policy(version);
  }

 private:
  struct group_data {
    std::int64_t target = 0;
    std::vector<std::int64_t> prompt;
  };
  struct response_buffer {
    std::vector<std::int64_t> tokens;
    std::vector<double> log_probs;
    std::vector<std::int64_t> versions;
    void resize(std::size_t n) {
      tokens.resize(n);
      log_probs.resize(n);
      versions.resize(n);
    }
  };

  const countdown_task& task_;
  decode_engine& engine_;
  ulorl::segment_scheduler sched_;
  target_source targets_;
  std::uint64_t stream_;
  std::unordered_map<std::int64_t, group_data> groups_;        // admitted, unreleased groups
  std::unordered_map<std::int64_t, response_buffer> live_;     // admitted, unreleased responses
  std::vector<ulorl::plan_item> items_;                       // the open step's plan
  std::vector<std::vector<std::int64_t>> contexts_;            // per plan item, reused
  std::vector<decode_request> requests_;
  std::vector<decode_result> results_;
  rollout_batch batch_;
};

//! Sampled accuracy on `targets` (one response each, one segment): an evaluation rollout through
//! its own scheduler, at the engine's current weights, on a sampling stream of its own. With the
//! engine in greedy mode it is the greedy accuracy (greedy_accuracy).
[[nodiscard]] inline double sampled_accuracy(const countdown_task& task, decode_engine& engine,
                                             const std::vector<std::int64_t>& targets, std::uint64_t stream = 0x5A1u) {
  if (targets.empty()) return 0.0;
  const auto n = static_cast<std::int64_t>(targets.size());
  segment_rollout eval(task, engine,
                       {.group_size = 1,
                        .max_response_tokens = task.max_response_tokens(),
                        .num_segments = 1,
                        .max_active_responses = 0,
                        .release_batch_groups = 0},
                       [&](std::int64_t g) { return targets[static_cast<std::size_t>(g)]; }, stream);
  eval.offer_prompts(n);
  double correct = 0;
  std::int64_t released = 0;
  while (released < n) {
    (void)eval.step();
    for (const auto& r : eval.take_experience().responses) {
      correct += r.reward;
      ++released;
    }
  }
  return correct / static_cast<double>(n);
}

//! Greedy accuracy on `targets`: sampled_accuracy with the engine decoding greedily, restored after.
[[nodiscard]] inline double greedy_accuracy(const countdown_task& task, decode_engine& engine,
                                            const std::vector<std::int64_t>& targets) {
  struct restore {
    decode_engine& e;
    bool was;
    ~restore() { e.set_greedy(was); }
  } r{engine, engine.greedy()};
  engine.set_greedy(true);
  return sampled_accuracy(task, engine, targets);
}

}  // namespace rlvr
