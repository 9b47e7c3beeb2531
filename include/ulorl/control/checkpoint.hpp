// ulorl/control/checkpoint.hpp — what the controllers of ulorl/control share for checkpointing:
// each saves its configuration and state as the payload of core/checkpoint.hpp's envelope (magic
// "ULORLCKP", envelope version, kind, payload version, payload length, CRC-64/XZ), with the payload
// versions below, and restores through the same checks its constructor and transitions use: every
// field finite where it must be, in its documented range, every counter within
// control_counter_limit, every invariant of the state re-checked (docs/checkpoints.md lists the
// payloads field by field; docs/dynamics.md the limits). The payload is the configuration's fields
// and then the state's, each in its visit_fields table's order (core/serialize.hpp's encoding), so
// the table beside each struct is the one list of what a checkpoint holds (save_controller,
// restore_controller). Every controller derives from controller_base, which holds its configuration
// and state and gives config(), state(), save() and restore().
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "ulorl/core/checkpoint.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/serialize.hpp"

ULORL_NAMESPACE_BEGIN

//! Payload format versions of the controllers' checkpoints (the envelope versions itself).
inline constexpr std::uint32_t kl_controller_payload_version = 1;
inline constexpr std::uint32_t entropy_controller_payload_version = 2;
inline constexpr std::uint32_t reference_reset_payload_version = 1;

//! Every counter of a controller's state (updates, evaluations, resets, consecutive-step counts)
//! stays <= 2^63 - 1: core/checkpoint.hpp's checkpoint_counter_limit (detail::require_counter at
//! restore, detail::require_counter_room before an increment).
inline constexpr std::uint64_t control_counter_limit = checkpoint_counter_limit;

namespace detail {

//! Throws unless `v` is finite and lo <= v <= hi; the message states the range.
inline void require_in_range(std::string_view fn, std::string_view arg, double v, double lo, double hi) {
  if (!(std::isfinite(v) && v >= lo && v <= hi)) {
    std::ostringstream os;
    os.precision(17);
    os << "must be finite and in [" << lo << ", " << hi << "]";
    fail_value(fn, arg, v, os.str());
  }
}

//! Appends a controller's configuration `c` and state `s` to `out` as one checkpoint of `kind`.
template <class Config, class State>
void save_controller(std::vector<std::byte>& out, checkpoint_kind kind, std::uint32_t payload_version,
                     const Config& c, const State& s) {
  const auto at = begin_checkpoint(out, kind, payload_version);
  byte_writer w(out);
  write_fields(w, c);
  write_fields(w, s);
  finish_checkpoint(out, at);
}

//! What restore_controller read: a configuration and a state valid under it.
template <class Config, class State>
struct controller_checkpoint {
  Config config;
  State state;
};

//! Reads exactly one checkpoint that save_controller wrote: the envelope (open_checkpoint), the
//! configuration's fields (those named in `absent` are not in this payload version and keep their
//! defaults), the state's ("state.<field>" in errors), nothing after them; then validates the
//! configuration and the state under it (validate(c, fn), validate(c, s, fn)). Every error names
//! `fn`; the caller builds its controller only from what this returns.
template <class Config, class State>
[[nodiscard]] controller_checkpoint<Config, State> restore_controller(std::span<const std::byte> bytes,
                                                                      checkpoint_kind kind,
                                                                      std::uint32_t payload_version, std::string_view fn,
                                                                      std::span<const std::string_view> absent = {}) {
  auto r = open_checkpoint(bytes, kind, payload_version, fn);
  controller_checkpoint<Config, State> x{};
  read_fields(r, x.config, "", absent);
  read_fields(r, x.state, "state.");
  close_checkpoint(r, fn);
  validate(x.config, fn);
  validate(x.config, x.state, fn);
  return x;
}

//! What a controller's checkpoint is: its kind, the payload version `save` writes, and the function
//! the errors of `restore` name.
struct controller_format {
  checkpoint_kind kind;
  std::uint32_t payload_version;
  std::string_view restore_fn;
};

//! What every controller of ulorl/control has: a configuration, a state, and the checkpoint of both.
//! `Machine` derives from controller_base<Machine, Config, State>, names its checkpoint in
//! `static constexpr controller_format checkpoint_format` and is constructible from a Config.
template <class Machine, class Config, class State>
class controller_base {
 public:
  [[nodiscard]] const Config& config() const noexcept { return config_; }
  [[nodiscard]] const State& state() const noexcept { return state_; }

  //! Appends configuration and state to `out` as one checkpoint (core/checkpoint.hpp's envelope, the
  //! machine's kind and payload version; docs/checkpoints.md lists the payloads).
  void save(std::vector<std::byte>& out) const {
    save_controller(out, Machine::checkpoint_format.kind, Machine::checkpoint_format.payload_version, config_, state_);
  }
  [[nodiscard]] std::vector<std::byte> save() const {
    std::vector<std::byte> out;
    save(out);
    return out;
  }
  //! Rebuilds a machine from exactly one checkpoint written by `save`. A damaged envelope, a field
  //! out of its documented range or a state that breaks an invariant throws ulorl::error naming the
  //! field ("state.coef", "horizon", ...).
  [[nodiscard]] static Machine restore(std::span<const std::byte> bytes) {
    constexpr controller_format f = Machine::checkpoint_format;
    return restored(restore_controller<Config, State>(bytes, f.kind, f.payload_version, f.restore_fn));
  }

 protected:
  controller_base(const Config& c, const State& s) : config_(c), state_(s) {}
  //! The machine of restore_controller's configuration and state.
  [[nodiscard]] static Machine restored(const controller_checkpoint<Config, State>& x) {
    Machine m(x.config);
    m.state_ = x.state;
    return m;
  }

  Config config_;
  State state_;
};

}  // namespace detail

ULORL_NAMESPACE_END
