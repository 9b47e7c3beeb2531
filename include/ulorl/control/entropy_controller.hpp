// ulorl/control/entropy_controller.hpp — an adaptive entropy-bonus coefficient alpha for
// `loss - alpha · H`, steering the policy's mean token entropy H towards a target (an alternative
// to MPT masking against entropy collapse).
//   step:          c <- c + step_up    if H < target - tolerance
//                  c <- c - step_down  if H > target + tolerance          (Skywork-OR1's adaptive
//                                                                          entropy control, Δ = 0.005)
//   proportional:  c <- c + gain · (target - H)                           (outside the dead band)
//   bounds:        c <- min(c, max_coef) after a raise, max(c, min_coef) after a lowering
//   applied:       alpha = c · [H <= target]  when gate_above_target, else alpha = c
// The gate is Skywork-OR1's: the bonus only acts while entropy is at or below the target, so the
// controller never pushes entropy up past it. Two typed options give TRL's `use_adaptive_entropy`
// (presets::trl::adaptive_entropy in ulorl/presets/trl.hpp): `gate_source = last_update` gates on
// the entropy of the last update instead of the batch's own (closed before the first update:
// TRL's H_prev = +inf), and `raise_at_target` makes H == target - tolerance raise c (TRL:
// c <- min(c + delta, max) when H <= target, else c <- max(c - delta, min)). Every number of the
// configuration and every measured entropy has magnitude <= entropy_controller_limit (1e6), so each
// update is finite. Each update bounds c on the side it moves (TRL's min(c + delta, max) /
// max(c - delta, min)): from init_coef in [min_coef, max_coef] the coefficient stays there (the
// same as clamping to both bounds); from an init_coef outside, which TRL accepts, it moves towards
// the range by one step per update and stays in [min(init_coef, min_coef), max(init_coef,
// max_coef)]. Small explicit state machine; its state checkpoints exactly (core/checkpoint.hpp's
// envelope, payload in docs/checkpoints.md).
#pragma once

#include <array>
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

enum class entropy_control_rule : std::uint8_t { step, proportional };
//! Which measured entropy the gate (gate_above_target) compares with the target.
enum class entropy_gate_source : std::uint8_t {
  current_batch,  //!< the entropy of the batch the bonus is applied to (Skywork-OR1): bonus(H)
  last_update,    //!< the entropy of the last update (TRL): bonus(); closed before the first update
};

//! Bound on the magnitude of every configuration value and every entropy (nats; a mean token
//! entropy is at most ln |vocabulary|, below 50): with it target - H is at most 2e6 and
//! gain · (target - H) at most 2e12, far from overflow, so no update can produce inf or NaN.
inline constexpr double entropy_controller_limit = 1e6;

//! Limits (checked by validate, which names the field): every value finite, and the ranges below.
struct entropy_controller_config {
  entropy_control_rule rule = entropy_control_rule::step;
  double target_entropy = 0.2;  //!< nats, in [0, 1e6] (same default as UloRL's sigma)
  double init_coef = 0.0;       //!< initial c, in [-1e6, 1e6] (outside [min_coef, max_coef]: see above)
  double step_up = 0.005;       //!< step rule: increase when below target, in [0, 1e6]
  double step_down = 0.005;     //!< step rule: decrease when above target, in [0, 1e6]
  double gain = 0.05;           //!< proportional rule: dc / dH error, in [0, 1e6]
  double tolerance = 0.0;       //!< dead band half-width around the target, in [0, 1e6]
  double min_coef = 0.0;        //!< in [0, max_coef]
  double max_coef = 0.1;        //!< in [min_coef, 1e6]
  bool gate_above_target = true;  //!< alpha = 0 while H > target (Skywork-OR1)
  entropy_gate_source gate_source = entropy_gate_source::current_batch;  //!< which H the gate reads
  //! true: H == target - tolerance raises c (TRL's `H <= target`); false: it holds c (Skywork-OR1
  //! raises only for H < target).
  bool raise_at_target = false;
};

//! Invariants (re-checked by every update and by restore): coef finite in [min(init_coef, min_coef),
//! max(init_coef, max_coef)];
//! updates <= control_counter_limit; last_entropy finite with magnitude <= 1e6; before the first
//! update coef == init_coef and last_entropy == 0.
struct entropy_controller_state {
  double coef = 0.0;          //!< c, the ungated coefficient
  std::uint64_t updates = 0;  //!< update() calls so far, <= 2^63 - 1
  double last_entropy = 0.0;  //!< H of the last update (0 before the first)
};

//! The field tables (core/fields.hpp) of the configuration and the state: a checkpoint's payload is
//! the configuration's fields and then the state's, in these orders (docs/checkpoints.md §3).
template <class C, class F>
  requires detail::record_of<C, entropy_controller_config>
constexpr void visit_fields(C& c, F&& f) {
  f("rule", c.rule), f("target_entropy", c.target_entropy), f("init_coef", c.init_coef), f("step_up", c.step_up);
  f("step_down", c.step_down), f("gain", c.gain), f("tolerance", c.tolerance), f("min_coef", c.min_coef);
  f("max_coef", c.max_coef), f("gate_above_target", c.gate_above_target), f("gate_source", c.gate_source);
  f("raise_at_target", c.raise_at_target);
}
template <class S, class F>
  requires detail::record_of<S, entropy_controller_state>
constexpr void visit_fields(S& s, F&& f) {
  f("coef", s.coef), f("updates", s.updates), f("last_entropy", s.last_entropy);
}

namespace detail {
//! The configuration fields that payload version 1 does not hold (restored at their defaults,
//! current_batch and false: what a version 1 controller behaved as).
inline constexpr std::array<std::string_view, 2> entropy_controller_v1_absent{"gate_source", "raise_at_target"};
}  // namespace detail

inline void validate(const entropy_controller_config& c, std::string_view fn = "entropy_controller") {
  constexpr double L = entropy_controller_limit;
  require_known(fn, "rule", c.rule, entropy_control_rule::step, entropy_control_rule::proportional);
  require_known(fn, "gate_source", c.gate_source, entropy_gate_source::current_batch,
                entropy_gate_source::last_update);
  detail::require_in_range(fn, "target_entropy", c.target_entropy, 0.0, L);
  detail::require_in_range(fn, "step_up", c.step_up, 0.0, L);
  detail::require_in_range(fn, "step_down", c.step_down, 0.0, L);
  detail::require_in_range(fn, "gain", c.gain, 0.0, L);
  detail::require_in_range(fn, "tolerance", c.tolerance, 0.0, L);
  detail::require_in_range(fn, "min_coef", c.min_coef, 0.0, L);
  require_finite(fn, "max_coef", c.max_coef);
  if (!(c.max_coef >= c.min_coef)) detail::fail_value(fn, "max_coef", c.max_coef, "must be >= min_coef");
  detail::require_in_range(fn, "max_coef", c.max_coef, c.min_coef, L);
  detail::require_in_range(fn, "init_coef", c.init_coef, -L, L);
}

//! Throws ulorl::error naming the first field of `s` that breaks an invariant of
//! entropy_controller_state under the (validated) configuration `c`.
inline void validate(const entropy_controller_config& c, const entropy_controller_state& s, std::string_view fn) {
  detail::require_in_range(fn, "state.coef", s.coef, std::fmin(c.init_coef, c.min_coef), std::fmax(c.init_coef, c.max_coef));
  detail::require_counter(fn, "state.updates", s.updates);
  detail::require_in_range(fn, "state.last_entropy", s.last_entropy, -entropy_controller_limit, entropy_controller_limit);
  if (s.updates == 0) {
    if (s.coef != c.init_coef) detail::fail_value(fn, "state.coef", s.coef, "before the first update c is init_coef");
    if (s.last_entropy != 0.0)
      detail::fail_value(fn, "state.last_entropy", s.last_entropy, "is 0 before the first update");
  }
}

namespace detail {
//! A measured mean entropy: finite, magnitude <= 1e6 (slightly negative values from the host's
//! rounding are accepted).
inline void require_entropy(std::string_view fn, double entropy) {
  require_in_range(fn, "entropy", entropy, -entropy_controller_limit, entropy_controller_limit);
}
}  // namespace detail

[[nodiscard]] inline entropy_controller_state initial_state(const entropy_controller_config& c) {
  validate(c);
  return entropy_controller_state{.coef = c.init_coef};
}

//! The coefficient to apply to a loss whose batch has mean entropy `entropy`, given state `s`
//! (Skywork-OR1's alpha_k = c_k · 1[e_k <= target] uses c before the update for that batch).
//! A gate on the last update's entropy (gate_source == last_update) does not read the batch's
//! entropy: that configuration is rejected here (argument 'gate_source'); call the overload
//! without an entropy.
[[nodiscard]] inline double entropy_bonus(const entropy_controller_config& c, const entropy_controller_state& s,
                                          double entropy) {
  constexpr std::string_view fn = "entropy_controller::bonus";
  validate(c, fn);
  validate(c, s, fn);
  detail::require_entropy(fn, entropy);
  if (c.gate_above_target && c.gate_source == entropy_gate_source::last_update)
    detail::fail_value(fn, "gate_source", detail::enum_value(c.gate_source),
                       "the gate reads the last update's entropy (last_update): call bonus() without an entropy");
  return c.gate_above_target && entropy > c.target_entropy ? 0.0 : s.coef;
}

//! The coefficient for the next batch from the state alone (TRL: alpha = c if H_prev <= target
//! else 0, with H_prev = +inf before the first update). Needs a gate on the last update's entropy
//! or no gate; a gate on the batch's own entropy (gate_source == current_batch) is rejected here
//! (argument 'gate_source'): call the overload that takes it.
[[nodiscard]] inline double entropy_bonus(const entropy_controller_config& c, const entropy_controller_state& s) {
  constexpr std::string_view fn = "entropy_controller::bonus";
  validate(c, fn);
  validate(c, s, fn);
  if (!c.gate_above_target) return s.coef;
  if (c.gate_source == entropy_gate_source::current_batch)
    detail::fail_value(fn, "gate_source", detail::enum_value(c.gate_source),
                       "the gate reads the batch's own entropy (current_batch): call bonus(entropy)");
  return s.updates > 0 && s.last_entropy <= c.target_entropy ? s.coef : 0.0;
}

//! The transition: folds one measured mean entropy into the state. Checks the configuration and
//! the state first. A raise is bounded by max_coef, a lowering by min_coef (module comment).
[[nodiscard]] inline entropy_controller_state entropy_update(const entropy_controller_config& c,
                                                             entropy_controller_state s, double entropy) {
  constexpr std::string_view fn = "entropy_controller::update";
  validate(c, fn);
  validate(c, s, fn);
  detail::require_entropy(fn, entropy);
  detail::require_counter_room(fn, "state.updates", s.updates);
  ++s.updates;
  s.last_entropy = entropy;
  const double err = c.target_entropy - entropy;  // > 0: entropy too low, raise the bonus
  const double v = s.coef;
  if (err > c.tolerance || (c.raise_at_target && err == c.tolerance)) {
    const double up = c.rule == entropy_control_rule::step ? v + c.step_up : v + c.gain * err;
    s.coef = up > c.max_coef ? c.max_coef : up;
  } else if (err < -c.tolerance) {
    const double down = c.rule == entropy_control_rule::step ? v - c.step_down : v + c.gain * err;
    s.coef = down < c.min_coef ? c.min_coef : down;
  }
  return s;
}

//! A configuration plus its state, with checkpointing (config(), state(), save(): the shared
//! detail::controller_base; restore below).
class entropy_controller
    : public detail::controller_base<entropy_controller, entropy_controller_config, entropy_controller_state> {
 public:
  //! Its checkpoint: kind, payload version, and the function restore's errors name.
  static constexpr detail::controller_format checkpoint_format{
      checkpoint_kind::entropy_controller, entropy_controller_payload_version, "entropy_controller::restore"};

  explicit entropy_controller(const entropy_controller_config& c = {}) : controller_base(c, initial_state(c)) {}

  //! alpha for a batch of mean entropy H, before this batch's update.
  [[nodiscard]] double bonus(double entropy) const { return entropy_bonus(config_, state_, entropy); }
  //! alpha for the next batch from the state alone (gate on the last update's entropy, or none).
  [[nodiscard]] double bonus() const { return entropy_bonus(config_, state_); }
  //! Folds H in; returns the new ungated coefficient c.
  double update(double entropy) {
    state_ = entropy_update(config_, state_, entropy);
    return state_.coef;
  }
  [[nodiscard]] double value() const noexcept { return state_.coef; }

  //! Rebuilds a controller from exactly one checkpoint written by `save`. A damaged envelope, a
  //! field out of its documented range or a state that breaks an invariant throws ulorl::error
  //! naming the field. Payload version 1 (written before gate_source and raise_at_target existed)
  //! is read too, with those two at their defaults (current_batch, false): what it behaved as.
  [[nodiscard]] static entropy_controller restore(std::span<const std::byte> bytes) {
    constexpr std::string_view fn = checkpoint_format.restore_fn;
    // The payload version sits at header offset 12 (u32, little-endian); open_checkpoint then
    // checks the whole envelope, checksum first, against the version read here.
    std::uint32_t version = entropy_controller_payload_version;
    std::span<const std::string_view> absent;
    if (bytes.size() >= detail::checkpoint_header_bytes) {
      std::uint32_t pv = 0;
      for (std::size_t i = 0; i < 4; ++i) pv |= static_cast<std::uint32_t>(bytes[12 + i]) << (8 * i);
      if (pv == 1) version = 1, absent = detail::entropy_controller_v1_absent;
    }
    return restored(detail::restore_controller<entropy_controller_config, entropy_controller_state>(
        bytes, checkpoint_format.kind, version, fn, absent));
  }
};

ULORL_NAMESPACE_END
