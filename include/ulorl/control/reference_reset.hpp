// ulorl/control/reference_reset.hpp — when to hard-reset the KL reference policy to the current
// policy (and the optimizer state with it), ProRL (Liu et al. 2025, arXiv 2505.24864): training
// keeps a KL penalty  L = L_GRPO - beta · KL(pi_theta || pi_ref),  and when validation stalls or the
// KL term comes to dominate, pi_ref <- pi_theta and the optimizer state is reinitialised.
// Triggers (each optional), checked when the host reports a training step or a validation result:
//   periodic   step - (step of the last reset, or 0) >= every_n_steps
//   plateau    no validation improvement larger than min_delta over the best for `patience`
//              consecutive evaluations (the best is kept across resets; Keras EarlyStopping's rule)
//   drop       a validation result worse than the best by more than max_drop
//   kl_share   |KL term| / (|KL term| + |policy term|) > max_kl_share for kl_share_patience
//              consecutive steps
//   manual     the host asks
// A fired trigger resets unless fewer than cooldown_steps steps have passed since the last reset
// (then it is reported as suppressed and its counter keeps running). The host owns the clock: every
// call names the step, steps never decrease. The plain `reference_reset_state` checkpoints exactly.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ulorl/control/checkpoint.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN

//! Why a reset fired (or would have fired). Values are part of the checkpoint format.
enum class reset_trigger : std::uint8_t { none = 0, periodic = 1, plateau = 2, drop = 3, kl_share = 4, manual = 5 };

[[nodiscard]] constexpr std::string_view to_string(reset_trigger t) noexcept {
  switch (t) {
    case reset_trigger::none: return "none";
    case reset_trigger::periodic: return "periodic";
    case reset_trigger::plateau: return "plateau";
    case reset_trigger::drop: return "drop";
    case reset_trigger::kl_share: return "kl_share";
    case reset_trigger::manual: return "manual";
  }
  return "unknown";
}

//! Defaults: only the plateau trigger (ProRL resets "when validation stagnates"), patience 5.
struct reference_reset_config {
  std::int64_t every_n_steps = 0;      //!< periodic trigger; 0 = off, else >= 1
  bool on_plateau = true;
  std::int64_t patience = 5;           //!< evaluations without improvement; >= 1
  double min_delta = 0.0;              //!< an improvement must exceed this; finite >= 0
  bool higher_is_better = true;        //!< direction of the validation metric
  bool on_drop = false;
  double max_drop = 0.05;              //!< drop trigger threshold below the best; finite >= 0
  bool on_kl_share = false;
  double max_kl_share = 0.5;           //!< in [0, 1)
  std::int64_t kl_share_patience = 1;  //!< consecutive steps above max_kl_share; >= 1
  std::int64_t cooldown_steps = 0;     //!< minimum steps between resets; >= 0
  bool manual_ignores_cooldown = false;
  bool reset_optimizer = true;         //!< ProRL reinitialises the optimizer with the reference
};

//! One reset, as recorded for the host's log.
struct reset_event {
  std::int64_t step = -1;               //!< step at which the reset happened
  reset_trigger trigger = reset_trigger::none;
  double value = 0.0;                   //!< the measurement that fired it: metric, KL share, or steps since anchor
  std::uint64_t index = 0;              //!< 1 for the first reset, 2 for the second, ...
};

//! What the host must do after a call.
struct reset_action {
  bool reset_reference = false;         //!< set pi_ref <- pi_theta
  bool reset_optimizer = false;         //!< reinitialise the optimizer state
  reset_trigger trigger = reset_trigger::none;  //!< the trigger that fired (also when suppressed)
  bool suppressed_by_cooldown = false;  //!< a trigger fired inside the cooldown: no reset
  reset_event event;                    //!< the record of this reset (when reset_reference)
};

//! The policy's whole mutable state.
struct reference_reset_state {
  bool has_step = false;
  std::int64_t last_step = 0;            //!< last step the host reported (steps never decrease)
  std::int64_t anchor_step = 0;          //!< step of the last reset, or 0: the periodic trigger counts from here
  bool has_reset = false;
  bool has_best = false;
  double best = 0.0;                     //!< best validation metric so far (improvements > min_delta only)
  std::int64_t evals_without_improvement = 0;
  std::int64_t kl_over_steps = 0;        //!< consecutive steps with KL share above max_kl_share
  std::uint64_t evaluations = 0;
  std::uint64_t resets = 0;
  reset_event last_event;                //!< the last reset (step -1 before the first)
};

inline void validate(const reference_reset_config& c, std::string_view fn = "reference_reset_policy") {
  if (c.every_n_steps < 0) detail::fail_value(fn, "every_n_steps", c.every_n_steps, "must be >= 0 (0 = off)");
  if (c.patience < 1) detail::fail_value(fn, "patience", c.patience, "must be >= 1");
  require_non_negative(fn, "min_delta", c.min_delta);
  require_non_negative(fn, "max_drop", c.max_drop);
  if (!(c.max_kl_share >= 0.0 && c.max_kl_share < 1.0))
    detail::fail_value(fn, "max_kl_share", c.max_kl_share, "must be in [0, 1)");
  if (c.kl_share_patience < 1) detail::fail_value(fn, "kl_share_patience", c.kl_share_patience, "must be >= 1");
  if (c.cooldown_steps < 0) detail::fail_value(fn, "cooldown_steps", c.cooldown_steps, "must be >= 0");
}

//! The KL term's share of the loss magnitude, |kl| / (|kl| + |policy|); 0 when both are 0.
[[nodiscard]] inline double kl_share(double kl_term, double policy_term) noexcept {
  const double k = std::fabs(kl_term), p = std::fabs(policy_term);
  return k + p > 0.0 ? k / (k + p) : 0.0;
}

class reference_reset_policy {
 public:
  explicit reference_reset_policy(const reference_reset_config& c = {}) : config_(c) { validate(c); }

  //! Reports training step `step` and its loss terms (the KL term as added to the loss, beta · KL,
  //! and the policy-gradient term). Checks the kl_share and periodic triggers, in that order.
  reset_action observe_step(std::int64_t step, double kl_term, double policy_term) {
    constexpr std::string_view fn = "reference_reset_policy::observe_step";
    check_clock(fn, step);
    require_finite(fn, "kl_term", kl_term);
    require_finite(fn, "policy_term", policy_term);
    advance_clock(step);
    const double share = kl_share(kl_term, policy_term);
    if (config_.on_kl_share && share > config_.max_kl_share)
      ++state_.kl_over_steps;
    else
      state_.kl_over_steps = 0;
    if (config_.on_kl_share && state_.kl_over_steps >= config_.kl_share_patience)
      return fire(step, reset_trigger::kl_share, share, false);
    if (config_.every_n_steps > 0 && step - state_.anchor_step >= config_.every_n_steps)
      return fire(step, reset_trigger::periodic, static_cast<double>(step - state_.anchor_step), false);
    return {};
  }

  //! Reports a validation result measured at step `step`. Checks the drop and plateau triggers.
  reset_action observe_validation(std::int64_t step, double metric) {
    constexpr std::string_view fn = "reference_reset_policy::observe_validation";
    check_clock(fn, step);
    require_finite(fn, "metric", metric);
    advance_clock(step);
    ++state_.evaluations;
    if (!state_.has_best) {
      state_.has_best = true;
      state_.best = metric;
      state_.evals_without_improvement = 0;
      return {};
    }
    const double sign = config_.higher_is_better ? 1.0 : -1.0;
    const double gain = sign * (metric - state_.best);  // > 0: better than the best
    const bool dropped = config_.on_drop && -gain > config_.max_drop;
    if (gain > config_.min_delta) {
      state_.best = metric;
      state_.evals_without_improvement = 0;
    } else {
      ++state_.evals_without_improvement;
    }
    if (dropped) return fire(step, reset_trigger::drop, metric, false);
    if (config_.on_plateau && state_.evals_without_improvement >= config_.patience)
      return fire(step, reset_trigger::plateau, metric, false);
    return {};
  }

  //! The host asks for a reset at step `step` (subject to the cooldown unless manual_ignores_cooldown).
  //! A suppressed request is not remembered: the host asks again later.
  reset_action request_manual(std::int64_t step) {
    check_clock("reference_reset_policy::request_manual", step);
    advance_clock(step);
    return fire(step, reset_trigger::manual, 0.0, config_.manual_ignores_cooldown);
  }

  [[nodiscard]] const reference_reset_config& config() const noexcept { return config_; }
  [[nodiscard]] const reference_reset_state& state() const noexcept { return state_; }
  //! Steps left before a trigger may reset again (0 when none).
  [[nodiscard]] std::int64_t cooldown_remaining() const noexcept {
    if (!state_.has_reset) return 0;
    const std::int64_t left = config_.cooldown_steps - (state_.last_step - state_.last_event.step);
    return left > 0 ? left : 0;
  }

  void save(std::vector<std::byte>& out) const {
    const auto at = detail::begin_checkpoint(out, checkpoint_kind::reference_reset);
    detail::byte_writer w(out);
    w.i64(config_.every_n_steps);
    w.boolean(config_.on_plateau);
    w.i64(config_.patience);
    w.f64(config_.min_delta);
    w.boolean(config_.higher_is_better);
    w.boolean(config_.on_drop);
    w.f64(config_.max_drop);
    w.boolean(config_.on_kl_share);
    w.f64(config_.max_kl_share);
    w.i64(config_.kl_share_patience);
    w.i64(config_.cooldown_steps);
    w.boolean(config_.manual_ignores_cooldown);
    w.boolean(config_.reset_optimizer);
    w.boolean(state_.has_step);
    w.i64(state_.last_step);
    w.i64(state_.anchor_step);
    w.boolean(state_.has_reset);
    w.boolean(state_.has_best);
    w.f64(state_.best);
    w.i64(state_.evals_without_improvement);
    w.i64(state_.kl_over_steps);
    w.u64(state_.evaluations);
    w.u64(state_.resets);
    w.i64(state_.last_event.step);
    w.u8(static_cast<std::uint8_t>(state_.last_event.trigger));
    w.f64(state_.last_event.value);
    w.u64(state_.last_event.index);
    detail::finish_checkpoint(out, at);
  }
  [[nodiscard]] std::vector<std::byte> save() const {
    std::vector<std::byte> out;
    save(out);
    return out;
  }
  [[nodiscard]] static reference_reset_policy restore(std::span<const std::byte> bytes) {
    constexpr std::string_view fn = "reference_reset_policy::restore";
    auto r = detail::open_checkpoint(bytes, checkpoint_kind::reference_reset, fn);
    reference_reset_config c;
    c.every_n_steps = r.i64();
    c.on_plateau = r.boolean();
    c.patience = r.i64();
    c.min_delta = r.f64();
    c.higher_is_better = r.boolean();
    c.on_drop = r.boolean();
    c.max_drop = r.f64();
    c.on_kl_share = r.boolean();
    c.max_kl_share = r.f64();
    c.kl_share_patience = r.i64();
    c.cooldown_steps = r.i64();
    c.manual_ignores_cooldown = r.boolean();
    c.reset_optimizer = r.boolean();
    reference_reset_state s;
    s.has_step = r.boolean();
    s.last_step = r.i64();
    s.anchor_step = r.i64();
    s.has_reset = r.boolean();
    s.has_best = r.boolean();
    s.best = r.f64();
    s.evals_without_improvement = r.i64();
    s.kl_over_steps = r.i64();
    s.evaluations = r.u64();
    s.resets = r.u64();
    s.last_event.step = r.i64();
    const auto trig = r.u8();
    if (trig > static_cast<std::uint8_t>(reset_trigger::manual))
      detail::fail_value(fn, "state.last_event.trigger", static_cast<unsigned>(trig), "unknown reset trigger");
    s.last_event.trigger = static_cast<reset_trigger>(trig);
    s.last_event.value = r.f64();
    s.last_event.index = r.u64();
    detail::close_checkpoint(r, fn);
    validate(c, fn);
    if (s.evals_without_improvement < 0 || s.kl_over_steps < 0 || s.last_step < 0 || s.anchor_step < 0 ||
        (s.has_best && !std::isfinite(s.best)) || s.has_reset != (s.resets > 0))
      detail::fail(fn, "bytes", "inconsistent reference_reset_state");
    reference_reset_policy p(c);
    p.state_ = s;
    return p;
  }

 private:
  // Validation never changes the state: a rejected call leaves the policy as it was.
  void check_clock(std::string_view fn, std::int64_t step) const {
    if (step < 0) detail::fail_value(fn, "step", step, "must be >= 0");
    if (state_.has_step && step < state_.last_step)
      detail::fail_value(fn, "step", step, "steps must not decrease (last reported step " +
                                               std::to_string(state_.last_step) + ")");
  }
  void advance_clock(std::int64_t step) noexcept {
    state_.has_step = true;
    state_.last_step = step;
  }

  //! A trigger fired at `step`: reset unless inside the cooldown. Invariant after a reset: every
  //! trigger counter is 0 and the periodic anchor is `step`; the best metric is kept.
  reset_action fire(std::int64_t step, reset_trigger why, double value, bool ignore_cooldown) {
    reset_action a;
    a.trigger = why;
    if (!ignore_cooldown && state_.has_reset && step - state_.last_event.step < config_.cooldown_steps) {
      a.suppressed_by_cooldown = true;
      return a;
    }
    state_.has_reset = true;
    state_.anchor_step = step;
    state_.evals_without_improvement = 0;
    state_.kl_over_steps = 0;
    ++state_.resets;
    state_.last_event = reset_event{.step = step, .trigger = why, .value = value, .index = state_.resets};
    a.reset_reference = true;
    a.reset_optimizer = config_.reset_optimizer;
    a.event = state_.last_event;
    return a;
  }

  reference_reset_config config_;
  reference_reset_state state_;
};

ULORL_NAMESPACE_END
