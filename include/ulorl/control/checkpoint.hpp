// ulorl/control/checkpoint.hpp — what the controllers of ulorl/control share for checkpointing:
// each saves its configuration and state as the payload of core/checkpoint.hpp's envelope (magic
// "ULORLCKP", envelope version, kind, payload version, payload length, CRC-64/XZ), with the payload
// versions below, and restores through the same checks its constructor and transitions use: every
// field finite where it must be, in its documented range, every counter within
// control_counter_limit, every invariant of the state re-checked (docs/checkpoints.md lists the
// payloads field by field; docs/dynamics.md the limits).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>

#include "ulorl/core/checkpoint.hpp"
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"

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

}  // namespace detail

ULORL_NAMESPACE_END
