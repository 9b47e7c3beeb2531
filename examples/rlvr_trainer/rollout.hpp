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
// save / load (between steps) checkpoint the scheduler and the unreleased responses' tokens.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ulorl/rollout/checkpoint.hpp>
#include <ulorl/rollout/segment_scheduler.hpp>

#include "checkpoint.hpp"
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
  //! An adaptive segment count (segment_autotune.hpp): set_num_segments() between steps, and a
  //! checkpoint whose count differs from this rollout's configured one still fits.
  void set_adaptive_segments(bool on) noexcept { adaptive_segments_ = on; }
  void set_num_segments(std::int32_t n) { sched_.set_num_segments(n); }
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

  //! Writes the state between two steps (entries "rollout/..."): the scheduler (ulorl::
  //! save_scheduler's bytes: queued prompts, admitted groups, paused responses with their
  //! provenance, counters, the policy version), the targets of the admitted groups, and every
  //! unreleased response's tokens, sampling log-probs and versions, partial responses included; the
  //! stream and the engine's sampling configuration, as checks. The engine keeps no sequence state
  //! between steps (a paused response is re-prefilled under the current weights when it resumes),
  //! so there is no KV cache to save; its version is the scheduler's.
  void save(torch::serialize::OutputArchive& a) const {
    if (sched_.phase() != ulorl::scheduler_phase::idle)
      throw std::logic_error("segment_rollout::save: a scheduler step is open");
    ckpt::put_bytes(a, "rollout/scheduler", ulorl::save_scheduler(sched_));
    for (const auto& [key, value] : fingerprint()) ckpt::put_string(a, "rollout/check/" + key, value);
    std::vector<std::int64_t> ids, targets;
    for (const auto& [g, d] : groups_) ids.push_back(g);
    std::sort(ids.begin(), ids.end());
    for (const auto g : ids) targets.push_back(groups_.at(g).target);
    ckpt::put_tensor(a, "rollout/group_ids", torch::tensor(ids, torch::kInt64));
    ckpt::put_tensor(a, "rollout/group_targets", torch::tensor(targets, torch::kInt64));
    std::vector<std::int64_t> live_ids, lengths, tokens, versions;
    std::vector<double> log_probs;
    for (const auto& [id, b] : live_) live_ids.push_back(id);
    std::sort(live_ids.begin(), live_ids.end());
    for (const auto id : live_ids) {
      const auto& b = live_.at(id);
      lengths.push_back(static_cast<std::int64_t>(b.tokens.size()));
      tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
      log_probs.insert(log_probs.end(), b.log_probs.begin(), b.log_probs.end());
      versions.insert(versions.end(), b.versions.begin(), b.versions.end());
    }
    ckpt::put_tensor(a, "rollout/live_ids", torch::tensor(live_ids, torch::kInt64));
    ckpt::put_tensor(a, "rollout/live_lengths", torch::tensor(lengths, torch::kInt64));
    ckpt::put_tensor(a, "rollout/live_tokens", torch::tensor(tokens, torch::kInt64));
    ckpt::put_tensor(a, "rollout/live_log_probs", torch::tensor(log_probs, torch::kFloat64));
    ckpt::put_tensor(a, "rollout/live_versions", torch::tensor(versions, torch::kInt64));
  }

  //! A rollout state read from a checkpoint and checked against this rollout, not yet applied.
  struct loaded_state {
    ulorl::segment_scheduler scheduler;
    std::unordered_map<std::int64_t, std::int64_t> targets{};  // of the admitted groups
    std::unordered_map<std::int64_t, std::vector<std::int64_t>> tokens{};
    std::unordered_map<std::int64_t, std::vector<double>> log_probs{};
    std::unordered_map<std::int64_t, std::vector<std::int64_t>> versions{};
  };

  //! Reads what save() wrote and checks that it fits this rollout, which must be built like the
  //! saved one (task, scheduler configuration, targets, stream, engine sampling configuration) on
  //! an engine at most at the saved version, and that the response buffers hold exactly the tokens
  //! the scheduler has committed. Changes nothing; throws checkpoint_error naming what does not fit
  //! (a target that differs means another task or seed).
  [[nodiscard]] loaded_state read_checkpoint(torch::serialize::InputArchive& a) const {
    ulorl::segment_scheduler sched = [&] {
      const auto bytes = ckpt::get_bytes(a, "rollout/scheduler");
      try {
        return ulorl::restore_scheduler(bytes);
      } catch (const std::exception& e) {
        throw checkpoint_error(std::string("checkpoint: entry 'rollout/scheduler': ") + e.what());
      }
    }();
    auto saved_config = sched.config();
    if (adaptive_segments_) saved_config.num_segments = sched_.config().num_segments;
    if (!(saved_config == sched_.config()))
      throw checkpoint_error("checkpoint does not fit: the scheduler configuration differs (checkpoint " +
                             describe(sched.config()) + "; here " + describe(sched_.config()) + ")");
    if (sched.phase() != ulorl::scheduler_phase::idle)
      throw checkpoint_error("checkpoint: the saved scheduler has a step open");
    for (const auto& [key, value] : fingerprint())
      ckpt::require_equal("rollout " + key, ckpt::get_string(a, "rollout/check/" + key), value);
    if (sched.policy_version() < engine_.policy_version())
      throw checkpoint_error("checkpoint does not fit: policy version " + std::to_string(sched.policy_version()) +
                             " in the checkpoint, the engine is at " + std::to_string(engine_.policy_version()));

    const auto ids = ckpt::get_tensor(a, "rollout/group_ids", torch::kInt64, 1);
    const auto targets = ckpt::get_tensor(a, "rollout/group_targets", torch::kInt64, 1);
    if (targets.numel() != ids.numel()) throw checkpoint_error("checkpoint: rollout/group_targets has the wrong length");
    loaded_state out{.scheduler = std::move(sched)};
    auto& groups = out.targets;
    for (std::int64_t i = 0; i < ids.numel(); ++i) {
      const auto g = ids[i].item<std::int64_t>(), s = targets[i].item<std::int64_t>();
      if (targets_(g) != s)
        throw checkpoint_error("checkpoint does not fit: group " + std::to_string(g) + " has target " +
                               std::to_string(s) + " in the checkpoint, " + std::to_string(targets_(g)) +
                               " here (another task or seed)");
      groups.emplace(g, s);
    }

    const auto live_ids = ckpt::get_tensor(a, "rollout/live_ids", torch::kInt64, 1);
    const auto lengths = ckpt::get_tensor(a, "rollout/live_lengths", torch::kInt64, 1);
    const auto tokens = ckpt::get_tensor(a, "rollout/live_tokens", torch::kInt64, 1);
    const auto log_probs = ckpt::get_tensor(a, "rollout/live_log_probs", torch::kFloat64, 1);
    const auto versions = ckpt::get_tensor(a, "rollout/live_versions", torch::kInt64, 1);
    const auto total = lengths.numel() > 0 ? lengths.sum().item<std::int64_t>() : 0;
    if (lengths.numel() != live_ids.numel() || (lengths.numel() > 0 && lengths.min().item<std::int64_t>() < 0) ||
        tokens.numel() != total || log_probs.numel() != total || versions.numel() != total)
      throw checkpoint_error("checkpoint: the rollout's response buffers have inconsistent lengths");
    const auto* tok = tokens.data_ptr<std::int64_t>();
    const auto* lp = log_probs.data_ptr<double>();
    const auto* ver = versions.data_ptr<std::int64_t>();
    std::int64_t at = 0;
    for (std::int64_t i = 0; i < live_ids.numel(); ++i) {
      const auto n = lengths[i].item<std::int64_t>(), id = live_ids[i].item<std::int64_t>();
      if (out.tokens.contains(id)) throw checkpoint_error("checkpoint: response " + std::to_string(id) + " is stored twice");
      out.tokens[id].assign(tok + at, tok + at + n);
      out.log_probs[id].assign(lp + at, lp + at + n);
      out.versions[id].assign(ver + at, ver + at + n);
      at += n;
    }

    // Every admitted group has its target, and every response of it exactly its committed tokens.
    const auto& st = out.scheduler.state();
    const auto G = static_cast<std::size_t>(st.config.group_size);
    std::size_t admitted = 0, buffered = 0;
    for (std::size_t slot = 0; slot < st.groups.size(); ++slot) {
      const auto& gr = st.groups[slot];
      if (gr.status == ulorl::group_status::free) continue;
      ++admitted;
      if (!groups.contains(gr.group_id))
        throw checkpoint_error("checkpoint: admitted group " + std::to_string(gr.group_id) + " has no target");
      for (std::size_t k = 0; k < G; ++k) {
        const auto id = gr.group_id * static_cast<std::int64_t>(G) + static_cast<std::int64_t>(k);
        const auto it = out.tokens.find(id);
        const auto held = it == out.tokens.end() ? 0 : static_cast<std::int64_t>(it->second.size());
        buffered += it == out.tokens.end() ? 0 : 1;
        if (held != st.responses[slot * G + k].tokens)
          throw checkpoint_error("checkpoint: response " + std::to_string(id) + " holds " + std::to_string(held) +
                                 " tokens, the scheduler has " + std::to_string(st.responses[slot * G + k].tokens) +
                                 " committed");
      }
    }
    if (admitted != groups.size() || buffered != out.tokens.size())
      throw checkpoint_error("checkpoint: the rollout holds groups or responses the scheduler does not");
    return out;
  }

  //! Applies a state from read_checkpoint (of this rollout) and moves the engine to its version.
  void restore(loaded_state&& s) {
    std::unordered_map<std::int64_t, group_data> groups;
    for (const auto& [g, target] : s.targets) groups.emplace(g, group_data{target, task_.prompt(target)});
    std::unordered_map<std::int64_t, response_buffer> live;
    for (auto& [id, t] : s.tokens)
      live.emplace(id, response_buffer{std::move(t), std::move(s.log_probs.at(id)), std::move(s.versions.at(id))});
    if (s.scheduler.policy_version() > engine_.policy_version()) engine_.set_policy_version(s.scheduler.policy_version());
    sched_ = std::move(s.scheduler);
    groups_ = std::move(groups);
    live_ = std::move(live);
  }

  //! read_checkpoint then restore: on a throw the rollout is as it was.
  void load(torch::serialize::InputArchive& a) { restore(read_checkpoint(a)); }

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

  //! What save() records and load() requires to be the same: the sampling stream and the engine's
  //! sampling configuration (the batch size decides how rows are batched, and so the logits' bits).
  [[nodiscard]] std::vector<std::pair<std::string, std::string>> fingerprint() const {
    const auto& e = engine_.config();
    char t[32];
    std::snprintf(t, sizeof t, "%.17g", e.temperature);
    return {{"stream", std::to_string(stream_)},
            {"engine_max_batch", std::to_string(e.max_batch)},
            {"engine_temperature", t},
            {"engine_eos_token", std::to_string(e.eos_token)},
            {"engine_seed", std::to_string(e.seed)},
            {"engine_max_prefill_tokens", std::to_string(e.max_prefill_tokens)}};
  }

  [[nodiscard]] static std::string describe(const ulorl::segment_scheduler_config& c) {
    return "group_size " + std::to_string(c.group_size) + ", max_response_tokens " +
           std::to_string(c.max_response_tokens) + ", num_segments " + std::to_string(c.num_segments) +
           ", max_active_responses " + std::to_string(c.max_active_responses) + ", max_decode_tokens " +
           std::to_string(c.max_decode_tokens) + ", max_new_groups_per_step " +
           std::to_string(c.max_new_groups_per_step) + ", order " + std::to_string(static_cast<int>(c.order)) +
           ", release_batch_groups " + std::to_string(c.release_batch_groups) + ", max_staleness " +
           std::to_string(c.max_staleness) + ", on_stale " + std::to_string(static_cast<int>(c.on_stale));
  }

  const countdown_task& task_;
  decode_engine& engine_;
  ulorl::segment_scheduler sched_;
  target_source targets_;
  std::uint64_t stream_;
  bool adaptive_segments_ = false;
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

//! Writes released response lengths (group-major, `group` per group) one group per line: the format of
//! segment_rollout_sim --length-groups. `lengths` are natural lengths: a truncated response as L_max + 1.
inline void write_length_groups(const std::string& path, const std::vector<std::int64_t>& lengths, std::int64_t group) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  for (std::size_t i = 0; i < lengths.size(); ++i)
    f << lengths[i] << ((i + 1) % static_cast<std::size_t>(group) == 0 ? '\n' : ' ');
  f.close();  // the last bytes reach the file (or fail, e.g. on a full device) here
  if (!f) throw std::runtime_error("write failed: " + path);
}

}  // namespace rlvr
