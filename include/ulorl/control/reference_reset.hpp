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
// call names the step, steps never decrease. Each call works on a copy of the state and commits it
// only when it succeeds, so a rejected call changes nothing. The plain `reference_reset_state`
// checkpoints exactly (core/checkpoint.hpp's envelope, payload in docs/checkpoints.md), and restore
// re-checks every invariant listed with it, so no restored state can overflow a counter or a step
// difference.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ulorl/control/checkpoint.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/fields.hpp"

ULORL_NAMESPACE_BEGIN

//! Why a reset fired (or would have fired). Values are part of the checkpoint format.
enum class reset_trigger : std::uint8_t { none = 0, periodic = 1, plateau = 2, drop = 3, kl_share = 4, manual = 5 };

[[nodiscard]] constexpr std::string_view to_string(reset_trigger t) noexcept {
  switch (t) {
    case reset_trigger::none:
      return "none";
    case reset_trigger::periodic:
      return "periodic";
    case reset_trigger::plateau:
      return "plateau";
    case reset_trigger::drop:
      return "drop";
    case reset_trigger::kl_share:
      return "kl_share";
    case reset_trigger::manual:
      return "manual";
  }
  return "unknown";
}

//! Defaults: only the plateau trigger (ProRL resets "when validation stagnates"), patience 5.
//! Limits (checked by validate, which names the field): integers up to 2^63 - 1, doubles finite.
struct reference_reset_config {
  std::int64_t every_n_steps = 0;  //!< periodic trigger; 0 = off, else in [1, 2^63 - 1]
  bool on_plateau = true;
  std::int64_t patience = 5;     //!< evaluations without improvement; in [1, 2^63 - 1]
  double min_delta = 0.0;        //!< an improvement must exceed this; finite >= 0
  bool higher_is_better = true;  //!< direction of the validation metric
  bool on_drop = false;
  double max_drop = 0.05;  //!< drop trigger threshold below the best; finite >= 0
  bool on_kl_share = false;
  double max_kl_share = 0.5;           //!< in [0, 1)
  std::int64_t kl_share_patience = 1;  //!< consecutive steps above max_kl_share; in [1, 2^63 - 1]
  std::int64_t cooldown_steps = 0;     //!< minimum steps between resets; in [0, 2^63 - 1]
  bool manual_ignores_cooldown = false;
  bool reset_optimizer = true;  //!< ProRL reinitialises the optimizer with the reference
};

//! One reset, as recorded for the host's log.
struct reset_event {
  std::int64_t step = -1;  //!< step at which the reset happened
  reset_trigger trigger = reset_trigger::none;
  double value = 0.0;       //!< the measurement that fired it: metric, KL share, or steps since anchor
  std::uint64_t index = 0;  //!< 1 for the first reset, 2 for the second, ...
};

//! What the host must do after a call.
struct reset_action {
  bool reset_reference = false;                 //!< set pi_ref <- pi_theta
  bool reset_optimizer = false;                 //!< reinitialise the optimizer state
  reset_trigger trigger = reset_trigger::none;  //!< the trigger that fired (also when suppressed)
  bool suppressed_by_cooldown = false;          //!< a trigger fired inside the cooldown: no reset
  reset_event event;                            //!< the record of this reset (when reset_reference)
};

//! The policy's whole mutable state. Invariants (re-checked by restore; docs/dynamics.md §4):
//!  * before the first call (has_step false) every field has its initial value;
//!  * 0 <= anchor_step <= last_step; has_reset == (resets > 0); resets <= 2^63 - 1;
//!  * after a reset: last_event = {anchor_step, an enabled trigger, its value, resets}, the value
//!    finite (manual 0, kl_share in (max_kl_share, 1], periodic a whole number in
//!    [every_n_steps, last_event.step]); plateau and drop need a best; before one: anchor_step 0 and
//!    last_event = {-1, none, 0, 0};
//!  * has_best == (evaluations > 0), evaluations <= 2^63 - 1; with a best it is finite and
//!    0 <= evals_without_improvement < evaluations; without one best and the count are 0;
//!  * 0 <= kl_over_steps <= 2^63 - 1 (it saturates there), and 0 when on_kl_share is off.
struct reference_reset_state {
  bool has_step = false;
  std::int64_t last_step = 0;    //!< last step the host reported (steps never decrease)
  std::int64_t anchor_step = 0;  //!< step of the last reset, or 0: the periodic trigger counts from here
  bool has_reset = false;
  bool has_best = false;
  double best = 0.0;  //!< best validation metric so far (improvements > min_delta only)
  std::int64_t evals_without_improvement = 0;
  std::int64_t kl_over_steps = 0;  //!< consecutive steps with KL share above max_kl_share
  std::uint64_t evaluations = 0;   //!< observe_validation calls so far
  std::uint64_t resets = 0;        //!< resets so far
  reset_event last_event;          //!< the last reset (step -1 before the first)
};

//! The field tables (core/fields.hpp) of the configuration, an event and the state: a checkpoint's
//! payload is the configuration's fields and then the state's, in these orders, the state's
//! last_event as its own fields (docs/checkpoints.md §3).
template <class C, class F>
  requires detail::record_of<C, reference_reset_config>
constexpr void visit_fields(C& c, F&& f) {
  f("every_n_steps", c.every_n_steps), f("on_plateau", c.on_plateau), f("patience", c.patience);
  f("min_delta", c.min_delta), f("higher_is_better", c.higher_is_better), f("on_drop", c.on_drop);
  f("max_drop", c.max_drop), f("on_kl_share", c.on_kl_share), f("max_kl_share", c.max_kl_share);
  f("kl_share_patience", c.kl_share_patience), f("cooldown_steps", c.cooldown_steps);
  f("manual_ignores_cooldown", c.manual_ignores_cooldown), f("reset_optimizer", c.reset_optimizer);
}
template <class E, class F>
  requires detail::record_of<E, reset_event>
constexpr void visit_fields(E& e, F&& f) {
  f("step", e.step), f("trigger", e.trigger), f("value", e.value), f("index", e.index);
}
template <class S, class F>
  requires detail::record_of<S, reference_reset_state>
constexpr void visit_fields(S& s, F&& f) {
  f("has_step", s.has_step), f("last_step", s.last_step), f("anchor_step", s.anchor_step);
  f("has_reset", s.has_reset), f("has_best", s.has_best), f("best", s.best);
  f("evals_without_improvement", s.evals_without_improvement), f("kl_over_steps", s.kl_over_steps);
  f("evaluations", s.evaluations), f("resets", s.resets), f("last_event", s.last_event);
}

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

//! The KL term's share of the loss magnitude, |kl| / (|kl| + |policy|); 0 when both are 0. When
//! the sum overflows (terms near DBL_MAX) both are halved first, which is exact and keeps the ratio.
[[nodiscard]] inline double kl_share(double kl_term, double policy_term) noexcept {
  double k = std::fabs(kl_term), p = std::fabs(policy_term);
  if (std::isinf(k + p) && std::isfinite(k) && std::isfinite(p)) {
    k *= 0.5;
    p *= 0.5;
  }
  return k + p > 0.0 ? k / (k + p) : 0.0;
}

//! Throws ulorl::error naming the first field of `s` that breaks an invariant of
//! reference_reset_state (listed with it) under the (validated) configuration `c`.
inline void validate(const reference_reset_config& c, const reference_reset_state& s, std::string_view fn) {
  require_known(fn, "state.last_event.trigger", s.last_event.trigger, reset_trigger::none, reset_trigger::periodic,
                reset_trigger::plateau, reset_trigger::drop, reset_trigger::kl_share, reset_trigger::manual);
  detail::require_counter(fn, "state.evaluations", s.evaluations);
  detail::require_counter(fn, "state.resets", s.resets);
  if (s.last_step < 0) detail::fail_value(fn, "state.last_step", s.last_step, "must be >= 0");
  if (s.anchor_step < 0 || s.anchor_step > s.last_step)
    detail::fail_value(fn, "state.anchor_step", s.anchor_step, "must lie in [0, state.last_step]");
  if (s.evals_without_improvement < 0)
    detail::fail_value(fn, "state.evals_without_improvement", s.evals_without_improvement, "must be >= 0");
  if (s.kl_over_steps < 0) detail::fail_value(fn, "state.kl_over_steps", s.kl_over_steps, "must be >= 0");
  if (!c.on_kl_share && s.kl_over_steps != 0)
    detail::fail_value(fn, "state.kl_over_steps", s.kl_over_steps, "must be 0 while the kl_share trigger is off");
  if (!s.has_step) {
    if (s.last_step != 0) detail::fail_value(fn, "state.last_step", s.last_step, "must be 0 before the first call");
    if (s.has_reset) detail::fail_value(fn, "state.has_reset", s.has_reset, "no reset before the first call");
    if (s.has_best) detail::fail_value(fn, "state.has_best", s.has_best, "no validation before the first call");
    if (s.kl_over_steps != 0)
      detail::fail_value(fn, "state.kl_over_steps", s.kl_over_steps, "must be 0 before the first call");
  }
  if (s.has_reset != (s.resets > 0))
    detail::fail_value(fn, "state.has_reset", s.has_reset, "must be true exactly when state.resets > 0");
  const reset_event& e = s.last_event;
  if (s.has_reset) {
    if (e.index != s.resets)
      detail::fail_value(fn, "state.last_event.index", e.index,
                         "must equal state.resets (" + std::to_string(s.resets) + ")");
    if (e.step != s.anchor_step)
      detail::fail_value(
          fn, "state.last_event.step", e.step,
          "must equal state.anchor_step (" + std::to_string(s.anchor_step) + "): a reset moves the anchor");
    require_finite(fn, "state.last_event.value", e.value);
    switch (e.trigger) {  // exhaustive: an unknown trigger was rejected above
      case reset_trigger::none:
        detail::fail_value(fn, "state.last_event.trigger", static_cast<unsigned>(e.trigger), "a reset has a trigger");
        break;
      case reset_trigger::periodic:
        if (c.every_n_steps == 0)
          detail::fail_value(fn, "state.last_event.trigger", static_cast<unsigned>(e.trigger),
                             "the periodic trigger is off");
        if (!(e.value >= static_cast<double>(c.every_n_steps) && e.value <= static_cast<double>(e.step) &&
              e.value == std::floor(e.value)))
          detail::fail_value(
              fn, "state.last_event.value", e.value,
              "a periodic reset records the whole number of steps since the anchor, in [every_n_steps, step]");
        break;
      case reset_trigger::plateau:
      case reset_trigger::drop:
        if (e.trigger == reset_trigger::plateau ? !c.on_plateau : !c.on_drop)
          detail::fail_value(fn, "state.last_event.trigger", static_cast<unsigned>(e.trigger), "that trigger is off");
        if (!s.has_best)
          detail::fail_value(fn, "state.last_event.trigger", static_cast<unsigned>(e.trigger),
                             "a validation trigger needs a validation result");
        break;
      case reset_trigger::kl_share:
        if (!c.on_kl_share)
          detail::fail_value(fn, "state.last_event.trigger", static_cast<unsigned>(e.trigger),
                             "the kl_share trigger is off");
        if (!(e.value > c.max_kl_share && e.value <= 1.0))
          detail::fail_value(fn, "state.last_event.value", e.value,
                             "a kl_share reset records a share in (max_kl_share, 1]");
        break;
      case reset_trigger::manual:
        if (e.value != 0.0) detail::fail_value(fn, "state.last_event.value", e.value, "a manual reset records 0");
        break;
    }
  } else {
    if (s.anchor_step != 0)
      detail::fail_value(fn, "state.anchor_step", s.anchor_step, "must be 0 before the first reset");
    if (e.step != -1) detail::fail_value(fn, "state.last_event.step", e.step, "must be -1 before the first reset");
    if (e.trigger != reset_trigger::none)
      detail::fail_value(fn, "state.last_event.trigger", static_cast<unsigned>(e.trigger),
                         "must be none before the first reset");
    if (e.value != 0.0) detail::fail_value(fn, "state.last_event.value", e.value, "must be 0 before the first reset");
    if (e.index != 0) detail::fail_value(fn, "state.last_event.index", e.index, "must be 0 before the first reset");
  }
  if (s.has_best != (s.evaluations > 0))
    detail::fail_value(fn, "state.has_best", s.has_best, "must be true exactly when state.evaluations > 0");
  if (s.has_best) {
    require_finite(fn, "state.best", s.best);
    if (static_cast<std::uint64_t>(s.evals_without_improvement) >= s.evaluations)
      detail::fail_value(fn, "state.evals_without_improvement", s.evals_without_improvement,
                         "must be below state.evaluations (" + std::to_string(s.evaluations) + ")");
  } else {
    if (s.best != 0.0) detail::fail_value(fn, "state.best", s.best, "must be 0 before the first validation");
    if (s.evals_without_improvement != 0)
      detail::fail_value(fn, "state.evals_without_improvement", s.evals_without_improvement,
                         "must be 0 before the first validation");
  }
}

//! A configuration plus its state, with checkpointing (config(), state(), save(), restore(): the
//! shared detail::controller_base). No I/O, no clocks: the host reports steps and validation results.
class reference_reset_policy
    : public detail::controller_base<reference_reset_policy, reference_reset_config, reference_reset_state> {
 public:
  //! Its checkpoint: kind, payload version, and the function restore's errors name.
  static constexpr detail::controller_format checkpoint_format{
      checkpoint_kind::reference_reset, reference_reset_payload_version, "reference_reset_policy::restore"};

  explicit reference_reset_policy(const reference_reset_config& c = {}) : controller_base(c, {}) { validate(c); }

  //! Reports training step `step` and its loss terms (the KL term as added to the loss, beta · KL,
  //! and the policy-gradient term). Checks the kl_share and periodic triggers, in that order.
  reset_action observe_step(std::int64_t step, double kl_term, double policy_term) {
    constexpr std::string_view fn = "reference_reset_policy::observe_step";
    require_clock(fn, step);
    require_finite(fn, "kl_term", kl_term);
    require_finite(fn, "policy_term", policy_term);
    reference_reset_state s = state_;
    advance_clock(s, step);
    const double share = kl_share(kl_term, policy_term);
    if (config_.on_kl_share && share > config_.max_kl_share) {
      // A consecutive-step count only matters up to kl_share_patience: it saturates at the limit.
      if (s.kl_over_steps < std::numeric_limits<std::int64_t>::max()) ++s.kl_over_steps;
    } else {
      s.kl_over_steps = 0;
    }
    reset_action a;
    if (config_.on_kl_share && s.kl_over_steps >= config_.kl_share_patience)
      a = fire(fn, s, step, reset_trigger::kl_share, share, false);
    else if (config_.every_n_steps > 0 && step - s.anchor_step >= config_.every_n_steps)
      a = fire(fn, s, step, reset_trigger::periodic, static_cast<double>(step - s.anchor_step), false);
    state_ = s;
    return a;
  }

  //! Reports a validation result measured at step `step`. Checks the drop and plateau triggers.
  reset_action observe_validation(std::int64_t step, double metric) {
    constexpr std::string_view fn = "reference_reset_policy::observe_validation";
    require_clock(fn, step);
    require_finite(fn, "metric", metric);
    detail::require_counter_room(fn, "state.evaluations", state_.evaluations);
    reference_reset_state s = state_;
    advance_clock(s, step);
    ++s.evaluations;
    reset_action a;
    if (!s.has_best) {
      s.has_best = true;
      s.best = metric;
      s.evals_without_improvement = 0;
      state_ = s;
      return a;
    }
    const double sign = config_.higher_is_better ? 1.0 : -1.0;
    const double gain = sign * (metric - s.best);  // > 0: better than the best (may be +-inf, never NaN)
    const bool dropped = config_.on_drop && -gain > config_.max_drop;
    if (gain > config_.min_delta) {
      s.best = metric;
      s.evals_without_improvement = 0;
    } else {
      // Below s.evaluations - 1 <= 2^63 - 2 before the increment (invariant), so it cannot overflow.
      ++s.evals_without_improvement;
    }
    if (dropped)
      a = fire(fn, s, step, reset_trigger::drop, metric, false);
    else if (config_.on_plateau && s.evals_without_improvement >= config_.patience)
      a = fire(fn, s, step, reset_trigger::plateau, metric, false);
    state_ = s;
    return a;
  }

  //! The host asks for a reset at step `step` (subject to the cooldown unless manual_ignores_cooldown).
  //! A suppressed request is not remembered: the host asks again later.
  reset_action request_manual(std::int64_t step) {
    constexpr std::string_view fn = "reference_reset_policy::request_manual";
    require_clock(fn, step);
    reference_reset_state s = state_;
    advance_clock(s, step);
    const reset_action a = fire(fn, s, step, reset_trigger::manual, 0.0, config_.manual_ignores_cooldown);
    state_ = s;
    return a;
  }

  //! Steps left before a trigger may reset again (0 when none). The invariants keep
  //! 0 <= last_step - last_event.step, so the difference cannot overflow.
  [[nodiscard]] std::int64_t cooldown_remaining() const noexcept {
    if (!state_.has_reset) return 0;
    const std::int64_t left = config_.cooldown_steps - (state_.last_step - state_.last_event.step);
    return left > 0 ? left : 0;
  }

 private:
  // Validation never changes the state: a rejected call leaves the policy as it was.
  void require_clock(std::string_view fn, std::int64_t step) const {
    if (step < 0) detail::fail_value(fn, "step", step, "must be >= 0");
    if (state_.has_step && step < state_.last_step)
      detail::fail_value(fn, "step", step,
                         "steps must not decrease (last reported step " + std::to_string(state_.last_step) + ")");
  }
  static void advance_clock(reference_reset_state& s, std::int64_t step) noexcept {
    s.has_step = true;
    s.last_step = step;
  }

  //! A trigger fired at `step`: reset `s` unless inside the cooldown. Invariant after a reset: every
  //! trigger counter is 0 and the periodic anchor is `step`; the best metric is kept. Throws (before
  //! changing `s`) when the reset counter is at its limit.
  reset_action fire(std::string_view fn, reference_reset_state& s, std::int64_t step, reset_trigger why, double value,
                    bool ignore_cooldown) const {
    reset_action a;
    a.trigger = why;
    // 0 <= s.last_event.step <= step once a reset happened, so the difference cannot overflow.
    if (!ignore_cooldown && s.has_reset && step - s.last_event.step < config_.cooldown_steps) {
      a.suppressed_by_cooldown = true;
      return a;
    }
    detail::require_counter_room(fn, "state.resets", s.resets);
    s.has_reset = true;
    s.anchor_step = step;
    s.evals_without_improvement = 0;
    s.kl_over_steps = 0;
    ++s.resets;
    s.last_event = reset_event{.step = step, .trigger = why, .value = value, .index = s.resets};
    a.reset_reference = true;
    a.reset_optimizer = config_.reset_optimizer;
    a.event = s.last_event;
    return a;
  }
};

ULORL_NAMESPACE_END
