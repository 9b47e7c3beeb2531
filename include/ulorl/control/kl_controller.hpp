// ulorl/control/kl_controller.hpp — the KL penalty coefficient beta of `loss + beta · KL`.
//   fixed:     beta never changes.
//   adaptive:  e = clip(KL / target_kl - 1, -0.2, 0.2),  beta <- beta · (1 + e · n_steps / horizon)
// The adaptive rule is Ziegler et al. (2019)'s proportional controller as verl
// (`AdaptiveKLController`) and OpenRLHF implement it; golden op `kl_controller` (README §4.7).
// Optional bounds [min_coef, max_coef] clamp beta after each update (defaults leave it unbounded,
// as in verl). A small explicit state machine: the plain `kl_controller_state` checkpoints exactly.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "ulorl/control/checkpoint.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

ULORL_NAMESPACE_BEGIN

enum class kl_control_type : std::uint8_t { fixed, adaptive };

//! Defaults follow verl's `algorithm.kl_ctrl` (type fixed, kl_coef 0.001, target_kl 0.1, horizon 10000).
struct kl_controller_config {
  kl_control_type type = kl_control_type::fixed;
  double init_coef = 0.001;   //!< initial beta, finite >= 0
  double target_kl = 0.1;     //!< adaptive: finite > 0
  double horizon = 10000.0;   //!< adaptive: finite > 0 (in samples, as n_steps)
  double max_error = 0.2;     //!< adaptive: clip of the proportional error, finite > 0 (verl: 0.2)
  double min_coef = 0.0;      //!< lower bound on beta, finite >= 0
  double max_coef = std::numeric_limits<double>::infinity();  //!< upper bound, >= min_coef (may be inf)
};

//! The controller's whole mutable state.
struct kl_controller_state {
  double coef = 0.0;          //!< current beta
  std::uint64_t updates = 0;  //!< update() calls so far
  double last_kl = 0.0;       //!< KL of the last update (0 before the first)
  double last_error = 0.0;    //!< clipped proportional error of the last update (0 when fixed)
};

//! Throws ulorl::error naming the offending field. Adaptive-only fields are checked only when adaptive.
inline void validate(const kl_controller_config& c, std::string_view fn = "kl_controller") {
  if (c.type != kl_control_type::fixed && c.type != kl_control_type::adaptive)
    detail::fail_value(fn, "type", static_cast<unsigned>(c.type), "unknown KL controller type");
  require_non_negative(fn, "init_coef", c.init_coef);
  require_non_negative(fn, "min_coef", c.min_coef);
  if (!(c.max_coef >= c.min_coef)) detail::fail_value(fn, "max_coef", c.max_coef, "must be >= min_coef");
  if (!(c.init_coef >= c.min_coef && c.init_coef <= c.max_coef))
    detail::fail_value(fn, "init_coef", c.init_coef, "must lie in [min_coef, max_coef]");
  if (c.type == kl_control_type::adaptive) {
    require_positive(fn, "target_kl", c.target_kl);
    require_positive(fn, "horizon", c.horizon);
    require_positive(fn, "max_error", c.max_error);
  }
}

//! The initial state of a validated configuration.
[[nodiscard]] inline kl_controller_state initial_state(const kl_controller_config& c) {
  validate(c);
  return kl_controller_state{.coef = c.init_coef};
}

//! The transition: folds one observation (the batch's mean KL and the number of samples it covers,
//! verl's `n_steps = batch size`) into the state. Invariant: min_coef <= coef <= max_coef.
[[nodiscard]] inline kl_controller_state kl_update(const kl_controller_config& c, kl_controller_state s,
                                                   double current_kl, std::int64_t n_steps) {
  constexpr std::string_view fn = "kl_controller::update";
  require_finite(fn, "current_kl", current_kl);
  if (n_steps < 0) detail::fail_value(fn, "n_steps", n_steps, "must be >= 0");
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

  //! Appends configuration and state to `out` (format: ulorl/control/checkpoint.hpp).
  void save(std::vector<std::byte>& out) const {
    const auto at = detail::begin_checkpoint(out, checkpoint_kind::kl_controller);
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
  //! Rebuilds a controller from `save`'s bytes; malformed bytes or an invalid state throw ulorl::error.
  [[nodiscard]] static kl_controller restore(std::span<const std::byte> bytes) {
    constexpr std::string_view fn = "kl_controller::restore";
    auto r = detail::open_checkpoint(bytes, checkpoint_kind::kl_controller, fn);
    kl_controller_config c;
    c.type = static_cast<kl_control_type>(r.u8());
    c.init_coef = r.f64();
    c.target_kl = r.f64();
    c.horizon = r.f64();
    c.max_error = r.f64();
    c.min_coef = r.f64();
    c.max_coef = r.f64();
    kl_controller_state s;
    s.coef = r.f64();
    s.updates = r.u64();
    s.last_kl = r.f64();
    s.last_error = r.f64();
    detail::close_checkpoint(r, fn);
    validate(c, fn);
    if (!(s.coef >= c.min_coef && s.coef <= c.max_coef) || !std::isfinite(s.coef))
      detail::fail_value(fn, "state.coef", s.coef, "must be finite and lie in [min_coef, max_coef]");
    kl_controller k(c);
    k.state_ = s;
    return k;
  }

 private:
  kl_controller_config config_;
  kl_controller_state state_;
};

ULORL_NAMESPACE_END
