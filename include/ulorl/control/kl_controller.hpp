// ulorl/control/kl_controller.hpp — the KL penalty coefficient beta of `loss + beta · KL`.
//   fixed:     beta never changes.
//   adaptive:  e = clip(KL / target_kl - 1, -0.2, 0.2),  beta <- beta · (1 + e · n_steps / horizon)
// The adaptive rule is Ziegler et al. (2019)'s proportional controller as verl
// (`AdaptiveKLController`) and OpenRLHF implement it; golden op `kl_controller` (README §4.7).
// Bounds [min_coef, max_coef] clamp beta after each update; max_coef defaults to kl_coef_limit
// (1e6), which verl's unbounded beta never reaches in a run that trains. The limits below keep every
// update finite whatever its input, so beta is always a finite number in [min_coef, max_coef] and
// every reachable state restores. A small explicit state machine: the plain `kl_controller_state`
// checkpoints exactly (core/checkpoint.hpp's envelope, payload in docs/checkpoints.md).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ulorl/control/checkpoint.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/fields.hpp"

ULORL_NAMESPACE_BEGIN

enum class kl_control_type : std::uint8_t { fixed, adaptive };

//! Largest beta the controller represents (max_coef <= this).
inline constexpr double kl_coef_limit = 1e6;
//! Smallest horizon (in samples): n_steps / horizon <= 2^63 / 1e-6 < 1e25, so that the multiplier
//! 1 + e · n_steps / horizon and beta · multiplier (< 1e31) stay finite for every n_steps.
inline constexpr double kl_horizon_min = 1e-6;
//! Largest clip of the proportional error: a non-negative KL has e >= -1 anyway, and a symmetric
//! clip beyond 100 % of the target has no use.
inline constexpr double kl_max_error_limit = 1.0;

//! Defaults follow verl's `algorithm.kl_ctrl` (type fixed, kl_coef 0.001, target_kl 0.1, horizon 10000).
//! Limits (checked by validate, which names the field): every value finite, and the ranges below.
struct kl_controller_config {
  kl_control_type type = kl_control_type::fixed;
  double init_coef = 0.001;        //!< initial beta, in [min_coef, max_coef]
  double target_kl = 0.1;          //!< adaptive: > 0
  double horizon = 10000.0;        //!< adaptive: >= kl_horizon_min (1e-6), in samples as n_steps
  double max_error = 0.2;          //!< adaptive: clip of the proportional error, in (0, 1] (verl: 0.2)
  double min_coef = 0.0;           //!< lower bound on beta, in [0, max_coef]
  double max_coef = kl_coef_limit;  //!< upper bound on beta, in [min_coef, kl_coef_limit = 1e6]
};

//! The controller's whole mutable state. Invariants (re-checked by every update and by restore):
//! coef finite in [min_coef, max_coef] (== init_coef when fixed); updates <= control_counter_limit;
//! last_kl finite; last_error 0 when fixed, in [-max_error, max_error] when adaptive; before the
//! first update coef == init_coef and last_kl == last_error == 0.
struct kl_controller_state {
  double coef = 0.0;          //!< current beta
  std::uint64_t updates = 0;  //!< update() calls so far, <= 2^63 - 1
  double last_kl = 0.0;       //!< KL of the last update (0 before the first)
  double last_error = 0.0;    //!< clipped proportional error of the last update (0 when fixed)
};

//! The field tables (core/fields.hpp) of the configuration and the state: a checkpoint's payload is
//! the configuration's fields and then the state's, in these orders (docs/checkpoints.md §3).
template <class C, class F>
  requires detail::record_of<C, kl_controller_config>
constexpr void visit_fields(C& c, F&& f) {
  f("type", c.type), f("init_coef", c.init_coef), f("target_kl", c.target_kl), f("horizon", c.horizon);
  f("max_error", c.max_error), f("min_coef", c.min_coef), f("max_coef", c.max_coef);
}
template <class S, class F>
  requires detail::record_of<S, kl_controller_state>
constexpr void visit_fields(S& s, F&& f) {
  f("coef", s.coef), f("updates", s.updates), f("last_kl", s.last_kl), f("last_error", s.last_error);
}

//! Throws ulorl::error naming the offending field. Adaptive-only fields are checked only when
//! adaptive (a fixed controller never reads them; the golden fixed case passes null for them).
inline void validate(const kl_controller_config& c, std::string_view fn = "kl_controller") {
  require_known(fn, "type", c.type, kl_control_type::fixed, kl_control_type::adaptive);
  require_non_negative(fn, "init_coef", c.init_coef);
  require_non_negative(fn, "min_coef", c.min_coef);
  if (!(c.max_coef >= c.min_coef)) detail::fail_value(fn, "max_coef", c.max_coef, "must be >= min_coef");
  detail::require_in_range(fn, "max_coef", c.max_coef, c.min_coef, kl_coef_limit);
  if (!(c.init_coef >= c.min_coef && c.init_coef <= c.max_coef))
    detail::fail_value(fn, "init_coef", c.init_coef, "must lie in [min_coef, max_coef]");
  if (c.type == kl_control_type::adaptive) {
    require_positive(fn, "target_kl", c.target_kl);
    if (!(std::isfinite(c.horizon) && c.horizon >= kl_horizon_min))
      detail::fail_value(fn, "horizon", c.horizon,
                         "must be finite and >= 1e-6 (kl_horizon_min: a smaller horizon lets n_steps / horizon overflow)");
    if (!(c.max_error > 0.0 && c.max_error <= kl_max_error_limit))
      detail::fail_value(fn, "max_error", c.max_error, "must be in (0, 1] (kl_max_error_limit)");
  }
}

//! Throws ulorl::error naming the first field of `s` that breaks an invariant of kl_controller_state
//! under the (validated) configuration `c`.
inline void validate(const kl_controller_config& c, const kl_controller_state& s, std::string_view fn) {
  detail::require_in_range(fn, "state.coef", s.coef, c.min_coef, c.max_coef);
  if (c.type == kl_control_type::fixed && s.coef != c.init_coef)
    detail::fail_value(fn, "state.coef", s.coef, "a fixed controller keeps init_coef");
  detail::require_counter(fn, "state.updates", s.updates);
  require_finite(fn, "state.last_kl", s.last_kl);
  if (c.type == kl_control_type::fixed) {
    if (s.last_error != 0.0) detail::fail_value(fn, "state.last_error", s.last_error, "a fixed controller has no error (0)");
  } else {
    detail::require_in_range(fn, "state.last_error", s.last_error, -c.max_error, c.max_error);
  }
  if (s.updates == 0) {
    if (s.coef != c.init_coef) detail::fail_value(fn, "state.coef", s.coef, "before the first update beta is init_coef");
    if (s.last_kl != 0.0) detail::fail_value(fn, "state.last_kl", s.last_kl, "is 0 before the first update");
    if (s.last_error != 0.0) detail::fail_value(fn, "state.last_error", s.last_error, "is 0 before the first update");
  }
}

//! The initial state of a validated configuration.
[[nodiscard]] inline kl_controller_state initial_state(const kl_controller_config& c) {
  validate(c);
  return kl_controller_state{.coef = c.init_coef};
}

//! The transition: folds one observation (the batch's mean KL and the number of samples it covers,
//! verl's `n_steps = batch size`) into the state. Checks the configuration and the state first.
//! Within the limits every intermediate is finite: e in [-max_error, max_error] (KL / target_kl may
//! overflow to inf, which the clip maps to max_error), |e · n_steps| <= 2^63, the multiplier below
//! 1e25 in magnitude, beta · multiplier below 1e31; the clamp then restores the invariant.
[[nodiscard]] inline kl_controller_state kl_update(const kl_controller_config& c, kl_controller_state s,
                                                   double current_kl, std::int64_t n_steps) {
  constexpr std::string_view fn = "kl_controller::update";
  validate(c, fn);
  validate(c, s, fn);
  require_finite(fn, "current_kl", current_kl);
  if (n_steps < 0) detail::fail_value(fn, "n_steps", n_steps, "must be >= 0");
  detail::require_counter_room(fn, "state.updates", s.updates);
  ++s.updates;
  s.last_kl = current_kl;
  if (c.type == kl_control_type::adaptive) {
    double e = current_kl / c.target_kl - 1.0;
    e = e < -c.max_error ? -c.max_error : (e > c.max_error ? c.max_error : e);
    s.last_error = e;
    // Same association as verl: (e · n_steps) / horizon.
    const double mult = 1.0 + e * static_cast<double>(n_steps) / c.horizon;
    double v = s.coef * mult;
    v = v < c.min_coef ? c.min_coef : (v > c.max_coef ? c.max_coef : v);
    s.coef = v;
  }
  return s;
}

//! A configuration plus its state, with checkpointing (config(), state(), save(), restore(): the
//! shared detail::controller_base). No I/O, no clocks: the host drives updates.
class kl_controller : public detail::controller_base<kl_controller, kl_controller_config, kl_controller_state> {
 public:
  //! Its checkpoint: kind, payload version, and the function restore's errors name.
  static constexpr detail::controller_format checkpoint_format{checkpoint_kind::kl_controller,
                                                               kl_controller_payload_version, "kl_controller::restore"};

  explicit kl_controller(const kl_controller_config& c = {}) : controller_base(c, initial_state(c)) {}

  //! One update; returns the new beta.
  double update(double current_kl, std::int64_t n_steps) {
    state_ = kl_update(config_, state_, current_kl, n_steps);
    return state_.coef;
  }
  [[nodiscard]] double value() const noexcept { return state_.coef; }
};

ULORL_NAMESPACE_END
