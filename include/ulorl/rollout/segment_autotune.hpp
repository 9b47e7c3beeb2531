// ulorl/rollout/segment_autotune.hpp — an adaptive segment count for segment rollout.
//
// UloRL fixes the segment count by hand. The best count moves with the length tail, with how
// latency-bound the engine is and with the cost of a resume (docs/segment_rollout.md §7,
// sensitivity), so a count tuned for one model, engine or stage of training is wrong for another.
// segment_autotuner picks it online, from what the host observes:
//   * the natural lengths of the released groups (a truncated response as any value > L_max),
//     a window of the most recent `window_groups` groups;
//   * the engine's and the trainer's costs in the simulator's terms (decode_engine_model,
//     trainer_model: e.g. least-squares fits of measured decode iterations and update steps).
// At each decision it simulates every candidate count on those lengths (bootstrapping whole groups,
// so a prompt's correlated lengths stay together) and those costs with the same discrete-event
// model as simulate_segment_rollout, and switches to the fastest predicted count when it beats the
// current one by more than `min_gain`. Until `min_groups` groups have been observed it keeps
// `initial`. The host applies the choice between steps with segment_scheduler::set_num_segments.
//
// simulate_segment_rollout_auto runs the simulator with this policy in the loop (the tuner sees the
// simulator's own costs and the lengths of the groups it released), to compare it with every fixed
// count on the same lengths. State (the window, the costs, the current count) round-trips through
// state() and the constructor from a state, which checks every field.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ulorl/core/checkpoint.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/rollout/segment_scheduler.hpp"
#include "ulorl/rollout/simulator.hpp"

ULORL_NAMESPACE_BEGIN

struct segment_autotune_config {
  std::vector<std::int32_t> candidates{1, 2, 4, 8};  //!< counts to choose from: distinct, each in [1, L_max], at most 64
  std::int32_t initial = 1;             //!< count used until min_groups groups are observed; one of the candidates
  std::int64_t min_groups = 8;          //!< observed groups before the first decision, in [1, window_groups]
  std::int64_t window_groups = 256;     //!< most recent groups kept, in [1, 2^20]
  std::int64_t simulated_steps = 12;    //!< training steps simulated per candidate, in [1, 4096]
  std::int64_t simulated_warmup = 2;    //!< simulated steps before measuring (pipeline fill), in [0, 4096]
  double min_gain = 0.02;               //!< switch only when predicted step time falls by more than this share, in [0, 1)
};

//! The tuner's whole state (plain data; what a checkpoint holds).
struct segment_autotune_state {
  std::int32_t current = 1;              //!< the count in use
  std::vector<std::int64_t> lengths;     //!< observed groups, oldest first, group_size lengths each, in [1, 2^62]
  decode_engine_model engine{};          //!< last costs given to observe_costs
  trainer_model trainer{};
  bool costs_known = false;              //!< observe_costs has been called
  //! choose() calls that evaluated the candidates, in [0, 2^63 - 1] (checkpoint_counter_limit):
  //! a choose() that would evaluate past the limit throws and changes nothing.
  std::int64_t decisions = 0;
};

//! One candidate's prediction at the last decision.
struct segment_prediction {
  std::int32_t segments = 0;
  double step_time = 0;  //!< predicted seconds per training step
};

class segment_autotuner {
 public:
  //! `base`: the run's shape (L_max, prompt tokens, G, prompts per step, engine capacity, seed);
  //! its lengths and costs are replaced by the observed ones, its step counts by the config's.
  segment_autotuner(const rollout_sim_config& base, const segment_autotune_config& config) : base_(base), c_(config) {
    validate("segment_autotuner");
    s_.current = c_.initial;
  }
  //! Continues from a saved state (checked against the configuration; throws naming the field).
  segment_autotuner(const rollout_sim_config& base, const segment_autotune_config& config, segment_autotune_state state)
      : base_(base), c_(config), s_(std::move(state)) {
    constexpr std::string_view fn = "segment_autotuner(state)";
    validate(fn);
    if (std::find(c_.candidates.begin(), c_.candidates.end(), s_.current) == c_.candidates.end())
      detail::fail_value(fn, "state.current", s_.current, "is not one of the candidates");
    const auto G = static_cast<std::size_t>(base_.group_size);
    if (s_.lengths.size() % G != 0 || s_.lengths.size() / G > static_cast<std::size_t>(c_.window_groups))
      detail::fail_value(fn, "state.lengths", static_cast<std::int64_t>(s_.lengths.size()),
                         "must hold whole groups, at most window_groups of them");
    for (std::size_t i = 0; i < s_.lengths.size(); ++i)
      if (s_.lengths[i] < 1 || s_.lengths[i] > rollout_sim_limits::max_empirical_length)
        detail::fail_at(fn, "state.lengths", static_cast<std::int64_t>(i), s_.lengths[i], "lengths must be in [1, 2^62]");
    // Every value in [0, 2^63 - 1] (checkpoint_counter_limit) is one choose() can reach (it stops
    // there), so all of them are accepted.
    if (s_.decisions < 0) detail::fail_value(fn, "state.decisions", s_.decisions, "must be >= 0");
    if (s_.costs_known) detail::validate_costs(fn, s_.engine, s_.trainer);
  }

  [[nodiscard]] const segment_autotune_state& state() const noexcept { return s_; }
  [[nodiscard]] const segment_autotune_config& config() const noexcept { return c_; }
  [[nodiscard]] std::int32_t current() const noexcept { return s_.current; }
  [[nodiscard]] std::int64_t observed_groups() const noexcept {
    return static_cast<std::int64_t>(s_.lengths.size()) / base_.group_size;
  }
  //! Every candidate's predicted step time at the last decision (empty before the first).
  [[nodiscard]] std::span<const segment_prediction> predictions() const noexcept { return predictions_; }

  //! One released group's natural lengths (group_size of them, each in [1, 2^62]; a truncated
  //! response as L_max + 1).
  void observe_group(std::span<const std::int64_t> lengths) {
    constexpr std::string_view fn = "segment_autotuner::observe_group";
    if (static_cast<std::int64_t>(lengths.size()) != base_.group_size)
      detail::fail_value(fn, "lengths", static_cast<std::int64_t>(lengths.size()), "must hold group_size lengths");
    for (std::size_t i = 0; i < lengths.size(); ++i)
      if (lengths[i] < 1 || lengths[i] > rollout_sim_limits::max_empirical_length)
        detail::fail_at(fn, "lengths", static_cast<std::int64_t>(i), lengths[i], "lengths must be in [1, 2^62]");
    const auto G = static_cast<std::size_t>(base_.group_size);
    if (s_.lengths.size() / G >= static_cast<std::size_t>(c_.window_groups))
      s_.lengths.erase(s_.lengths.begin(), s_.lengths.begin() + static_cast<std::ptrdiff_t>(G));
    s_.lengths.insert(s_.lengths.end(), lengths.begin(), lengths.end());
  }

  //! The engine's and the trainer's current costs (replacing earlier ones).
  void observe_costs(const decode_engine_model& engine, const trainer_model& trainer) {
    detail::validate_costs("segment_autotuner::observe_costs", engine, trainer);
    s_.engine = engine;
    s_.trainer = trainer;
    s_.costs_known = true;
  }

  //! Decides: once min_groups groups and the costs are known, simulates every candidate and
  //! returns the count to use next (also current()). Deterministic in its inputs. A decision with
  //! state().decisions at its limit 2^63 - 1 throws ulorl::error, before anything changes.
  std::int32_t choose() {
    if (!s_.costs_known || observed_groups() < c_.min_groups) return s_.current;
    detail::require_counter_room("segment_autotuner::choose", "state.decisions", static_cast<std::uint64_t>(s_.decisions));
    auto cfg = base_;
    cfg.lengths.empirical = s_.lengths;
    cfg.lengths.empirical_grouped = true;
    cfg.engine = s_.engine;
    cfg.trainer = s_.trainer;
    cfg.warmup_steps = c_.simulated_warmup;
    cfg.measured_steps = c_.simulated_steps;
    predictions_.clear();
    double best_time = std::numeric_limits<double>::infinity(), current_time = best_time;
    std::int32_t best = s_.current;
    for (const auto n : c_.candidates) {
      const double t = simulate_segment_rollout(cfg, n).step_time;
      predictions_.push_back({n, t});
      if (t < best_time) best_time = t, best = n;
      if (n == s_.current) current_time = t;
    }
    ++s_.decisions;
    if (best != s_.current && best_time < current_time * (1.0 - c_.min_gain)) s_.current = best;
    return s_.current;
  }

 private:
  void validate(std::string_view fn) const {
    detail::validate_sim_config(fn, base_);
    if (c_.candidates.empty() || c_.candidates.size() > 64)
      detail::fail_value(fn, "config.candidates", static_cast<std::int64_t>(c_.candidates.size()), "must hold 1 to 64 counts");
    for (std::size_t i = 0; i < c_.candidates.size(); ++i) {
      const auto n = c_.candidates[i];
      if (n < 1 || n > base_.max_response_tokens)
        detail::fail_at(fn, "config.candidates", static_cast<std::int64_t>(i), n, "must be in [1, max_response_tokens]");
      if (std::find(c_.candidates.begin(), c_.candidates.begin() + static_cast<std::ptrdiff_t>(i), n) !=
          c_.candidates.begin() + static_cast<std::ptrdiff_t>(i))
        detail::fail_at(fn, "config.candidates", static_cast<std::int64_t>(i), n, "is listed twice");
    }
    if (std::find(c_.candidates.begin(), c_.candidates.end(), c_.initial) == c_.candidates.end())
      detail::fail_value(fn, "config.initial", c_.initial, "must be one of the candidates");
    if (c_.window_groups < 1 || c_.window_groups > (std::int64_t{1} << 20))
      detail::fail_value(fn, "config.window_groups", c_.window_groups, "must be in [1, 2^20]");
    if (c_.min_groups < 1 || c_.min_groups > c_.window_groups)
      detail::fail_value(fn, "config.min_groups", c_.min_groups, "must be in [1, window_groups]");
    if (c_.simulated_steps < 1 || c_.simulated_steps > 4096)
      detail::fail_value(fn, "config.simulated_steps", c_.simulated_steps, "must be in [1, 4096]");
    if (c_.simulated_warmup < 0 || c_.simulated_warmup > 4096)
      detail::fail_value(fn, "config.simulated_warmup", c_.simulated_warmup, "must be in [0, 4096]");
    if (!(c_.min_gain >= 0 && c_.min_gain < 1)) detail::fail_value(fn, "config.min_gain", c_.min_gain, "must be in [0, 1)");
    // The runs choose() simulates: the base's shape with the configured step counts, checked here
    // so that a base that cannot be simulated is refused now, naming its own field.
    auto simulated = base_;
    simulated.warmup_steps = c_.simulated_warmup;
    simulated.measured_steps = c_.simulated_steps;
    detail::validate_sim_config(fn, simulated);
  }

  rollout_sim_config base_;
  segment_autotune_config c_;
  segment_autotune_state s_;
  std::vector<segment_prediction> predictions_;
};

//! The simulator with the tuner in the loop: after each training step the tuner observes the
//! released groups' natural lengths (the simulator's own) and the simulator's costs, decides, and
//! the scheduler takes the count. Compare with simulate_segment_rollout of each fixed candidate on
//! the same config. `segments` of the result is 0 (adaptive), final_segments the last choice.
[[nodiscard]] inline rollout_sim_result simulate_segment_rollout_auto(const rollout_sim_config& c,
                                                                     const segment_autotune_config& a) {
  segment_autotuner tuner(c, a);
  tuner.observe_costs(c.engine, c.trainer);
  const auto most = *std::max_element(a.candidates.begin(), a.candidates.end());
  std::vector<std::int64_t> group;
  auto r = detail::simulate_rollout_with(
      "simulate_segment_rollout_auto", c, tuner.current(), most, [&](segment_scheduler& sched, const experience_batch& b) {
        const auto G = static_cast<std::size_t>(c.group_size);
        for (std::size_t g = 0; g < b.group_ids.size(); ++g) {
          group.clear();
          for (std::size_t k = 0; k < G; ++k) {
            const auto& x = b.responses[g * G + k];
            group.push_back(x.final_state == response_state::truncated ? c.max_response_tokens + 1 : x.tokens);
          }
          tuner.observe_group(group);
        }
        const auto n = tuner.choose();
        if (n != sched.config().num_segments) sched.set_num_segments(n);
      });
  r.segments = 0;
  return r;
}

ULORL_NAMESPACE_END
