// ulorl/control/entropy_controller.hpp — an adaptive entropy-bonus coefficient alpha for
// `loss - alpha · H`, steering the policy's mean token entropy H towards a target (an alternative
// to MPT masking against entropy collapse).
//   step:          c <- c + step_up    if H < target - tolerance
//                  c <- c - step_down  if H > target + tolerance          (Skywork-OR1's adaptive
//                                                                          entropy control, Δ = 0.005)
//   proportional:  c <- c + gain · (target - H)                           (outside the dead band)
//   bounds:        c <- clamp(c, min_coef, max_coef)
//   applied:       alpha = c · [H <= target]  when gate_above_target, else alpha = c
// The gate is Skywork-OR1's: the bonus only acts while entropy is at or below the target, so the
// controller never pushes entropy up past it. Small explicit state machine; state checkpoints exactly.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ulorl/control/checkpoint.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN

enum class entropy_control_rule : std::uint8_t { step, proportional };

struct entropy_controller_config {
  entropy_control_rule rule = entropy_control_rule::step;
  double target_entropy = 0.2;  //!< nats, finite >= 0 (same default as UloRL's sigma)
  double init_coef = 0.0;       //!< initial c, in [min_coef, max_coef]
  double step_up = 0.005;       //!< step rule: increase when below target, finite >= 0
  double step_down = 0.005;     //!< step rule: decrease when above target, finite >= 0
  double gain = 0.05;           //!< proportional rule: dc / dH error, finite >= 0
  double tolerance = 0.0;       //!< dead band half-width around the target, finite >= 0
  double min_coef = 0.0;        //!< finite >= 0
  double max_coef = 0.1;        //!< finite >= min_coef
  bool gate_above_target = true;  //!< alpha = 0 while H > target (Skywork-OR1)
};

struct entropy_controller_state {
  double coef = 0.0;          //!< c, the ungated coefficient
  std::uint64_t updates = 0;
  double last_entropy = 0.0;  //!< H of the last update (0 before the first)
};

inline void validate(const entropy_controller_config& c, std::string_view fn = "entropy_controller") {
  if (c.rule != entropy_control_rule::step && c.rule != entropy_control_rule::proportional)
    detail::fail_value(fn, "rule", static_cast<unsigned>(c.rule), "unknown entropy control rule");
  require_non_negative(fn, "target_entropy", c.target_entropy);
  require_non_negative(fn, "step_up", c.step_up);
  require_non_negative(fn, "step_down", c.step_down);
  require_non_negative(fn, "gain", c.gain);
  require_non_negative(fn, "tolerance", c.tolerance);
  require_non_negative(fn, "min_coef", c.min_coef);
  require_finite(fn, "max_coef", c.max_coef);
  if (!(c.max_coef >= c.min_coef)) detail::fail_value(fn, "max_coef", c.max_coef, "must be >= min_coef");
  require_finite(fn, "init_coef", c.init_coef);
  if (!(c.init_coef >= c.min_coef && c.init_coef <= c.max_coef))
    detail::fail_value(fn, "init_coef", c.init_coef, "must lie in [min_coef, max_coef]");
}

[[nodiscard]] inline entropy_controller_state initial_state(const entropy_controller_config& c) {
  validate(c);
  return entropy_controller_state{.coef = c.init_coef};
}

//! The coefficient to apply to a loss whose batch has mean entropy `entropy`, given state `s`
//! (Skywork-OR1's alpha_k = c_k · 1[e_k <= target] uses c before the update for that batch).
[[nodiscard]] inline double entropy_bonus(const entropy_controller_config& c, const entropy_controller_state& s,
                                          double entropy) {
  require_finite("entropy_controller::bonus", "entropy", entropy);
  return c.gate_above_target && entropy > c.target_entropy ? 0.0 : s.coef;
}

//! The transition: folds one measured mean entropy into the state.
//! Invariant: min_coef <= coef <= max_coef.
[[nodiscard]] inline entropy_controller_state entropy_update(const entropy_controller_config& c,
                                                             entropy_controller_state s, double entropy) {
  require_finite("entropy_controller::update", "entropy", entropy);
  ++s.updates;
  s.last_entropy = entropy;
  const double err = c.target_entropy - entropy;  // > 0: entropy too low, raise the bonus
  double v = s.coef;
  if (err > c.tolerance) {
    v = c.rule == entropy_control_rule::step ? v + c.step_up : v + c.gain * err;
  } else if (err < -c.tolerance) {
    v = c.rule == entropy_control_rule::step ? v - c.step_down : v + c.gain * err;
  }
  s.coef = v < c.min_coef ? c.min_coef : (v > c.max_coef ? c.max_coef : v);
  return s;
}

class entropy_controller {
 public:
  explicit entropy_controller(const entropy_controller_config& c = {}) : config_(c), state_(initial_state(c)) {}

  //! alpha for a batch of mean entropy H, before this batch's update.
  [[nodiscard]] double bonus(double entropy) const { return entropy_bonus(config_, state_, entropy); }
  //! Folds H in; returns the new ungated coefficient c.
  double update(double entropy) {
    state_ = entropy_update(config_, state_, entropy);
    return state_.coef;
  }
  [[nodiscard]] double value() const noexcept { return state_.coef; }
  [[nodiscard]] const entropy_controller_config& config() const noexcept { return config_; }
  [[nodiscard]] const entropy_controller_state& state() const noexcept { return state_; }

  void save(std::vector<std::byte>& out) const {
    const auto at = detail::begin_checkpoint(out, checkpoint_kind::entropy_controller);
    detail::byte_writer w(out);
    w.u8(static_cast<std::uint8_t>(config_.rule));
    w.f64(config_.target_entropy);
    w.f64(config_.init_coef);
    w.f64(config_.step_up);
    w.f64(config_.step_down);
    w.f64(config_.gain);
    w.f64(config_.tolerance);
    w.f64(config_.min_coef);
    w.f64(config_.max_coef);
    w.boolean(config_.gate_above_target);
    w.f64(state_.coef);
    w.u64(state_.updates);
    w.f64(state_.last_entropy);
    detail::finish_checkpoint(out, at);
  }
  [[nodiscard]] std::vector<std::byte> save() const {
    std::vector<std::byte> out;
    save(out);
    return out;
  }
  [[nodiscard]] static entropy_controller restore(std::span<const std::byte> bytes) {
    constexpr std::string_view fn = "entropy_controller::restore";
    auto r = detail::open_checkpoint(bytes, checkpoint_kind::entropy_controller, fn);
    entropy_controller_config c;
    c.rule = static_cast<entropy_control_rule>(r.u8());
    c.target_entropy = r.f64();
    c.init_coef = r.f64();
    c.step_up = r.f64();
    c.step_down = r.f64();
    c.gain = r.f64();
    c.tolerance = r.f64();
    c.min_coef = r.f64();
    c.max_coef = r.f64();
    c.gate_above_target = r.boolean();
    entropy_controller_state s;
    s.coef = r.f64();
    s.updates = r.u64();
    s.last_entropy = r.f64();
    detail::close_checkpoint(r, fn);
    validate(c, fn);
    if (!(s.coef >= c.min_coef && s.coef <= c.max_coef))
      detail::fail_value(fn, "state.coef", s.coef, "must lie in [min_coef, max_coef]");
    entropy_controller e(c);
    e.state_ = s;
    return e;
  }

 private:
  entropy_controller_config config_;
  entropy_controller_state state_;
};

ULORL_NAMESPACE_END
