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

//! A configuration plus its state, with checkpointing. No I/O, no clocks: the host drives updates.
class kl_controller {
 public:
  explicit kl_controller(const kl_controller_config& c = {}) : config_(c), state_(initial_state(c)) {}

  //! One update; returns the new beta.
  double update(double current_kl, std::int64_t n_steps) {
    state_ = kl_update(config_, state_, current_kl, n_steps);
    return state_.coef;
  }
  [[nodiscard]] double value() const noexcept { return state_.coef; }
  [[nodiscard]] const kl_controller_config& config() const noexcept { return config_; }
  [[nodiscard]] const kl_controller_state& state() const noexcept { return state_; }

  //! Appends configuration and state to `out` as one checkpoint (core/checkpoint.hpp's envelope,
  //! kind kl_controller, payload version kl_controller_payload_version; docs/checkpoints.md).
  void save(std::vector<std::byte>& out) const {
    const auto at = detail::begin_checkpoint(out, checkpoint_kind::kl_controller, kl_controller_payload_version);
    detail::byte_writer w(out);
    w.u8(static_cast<std::uint8_t>(config_.type));
    w.f64(config_.init_coef);
    w.f64(config_.target_kl);
    w.f64(config_.horizon);
    w.f64(config_.max_error);
    w.f64(config_.min_coef);
    w.f64(config_.max_coef);
    w.f64(state_.coef);
    w.u64(state_.updates);
    w.f64(state_.last_kl);
    w.f64(state_.last_error);
    detail::finish_checkpoint(out, at);
  }
  [[nodiscard]] std::vector<std::byte> save() const {
    std::vector<std::byte> out;
    save(out);
    return out;
  }
  //! Rebuilds a controller from exactly one checkpoint written by `save`. A damaged envelope, a
  //! field out of its documented range or a state that breaks an invariant throws ulorl::error
  //! naming the field ("state.coef", "horizon", ...).
  [[nodiscard]] static kl_controller restore(std::span<const std::byte> bytes) {
    constexpr std::string_view fn = "kl_controller::restore";
    auto r = detail::open_checkpoint(bytes, checkpoint_kind::kl_controller, kl_controller_payload_version, fn);
    kl_controller_config c;
    c.type = static_cast<kl_control_type>(r.u8("type"));
    c.init_coef = r.f64("init_coef");
    c.target_kl = r.f64("target_kl");
    c.horizon = r.f64("horizon");
    c.max_error = r.f64("max_error");
    c.min_coef = r.f64("min_coef");
    c.max_coef = r.f64("max_coef");
    kl_controller_state s;
    s.coef = r.f64("state.coef");
    s.updates = r.u64("state.updates");
    s.last_kl = r.f64("state.last_kl");
    s.last_error = r.f64("state.last_error");
    detail::close_checkpoint(r, fn);
    validate(c, fn);
    validate(c, s, fn);
    kl_controller k(c);
    k.state_ = s;
    return k;
  }

 private:
  kl_controller_config config_;
  kl_controller_state state_;
};

ULORL_NAMESPACE_END
