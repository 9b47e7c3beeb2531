// tests/support/rollout_oracle_mapping.hpp — how the naive model of rollout_oracle.hpp (which
// includes nothing of ulorl) is mapped onto ulorl's segment scheduler, shared by the property test
// (tests/test_rollout_scheduler_property.cpp) and the API fuzzer (tests/fuzz/fuzz_scheduler_api.cpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "support/rollout_oracle.hpp"
#include "ulorl/rollout.hpp"

namespace oracle {

//! The scheduler's report outcome in the model's terms; a value outside the enum (the fuzzer sends
//! them) is a failure for the model, which the scheduler must reject or treat alike.
inline outcome to_oracle(ulorl::decode_outcome o) {
  switch (o) {
    case ulorl::decode_outcome::segment_end: return outcome::segment_end;
    case ulorl::decode_outcome::eos: return outcome::eos;
    default: return outcome::failed;
  }
}

//! The model's configuration for a scheduler configuration.
inline config to_oracle(const ulorl::segment_scheduler_config& c) {
  config oc;
  oc.group_size = c.group_size;
  oc.max_tokens = c.max_response_tokens;
  oc.segments = c.num_segments;
  oc.max_active = c.max_active_responses;
  oc.max_decode_tokens = c.max_decode_tokens;
  oc.max_new_groups = c.max_new_groups_per_step;
  oc.admission_order = c.order == ulorl::release_order::admission;
  oc.batch_groups = c.release_batch_groups;
  oc.max_staleness = c.max_staleness;
  oc.drop_stale = c.on_stale == ulorl::staleness_action::drop;
  return oc;
}

//! Provenance spans as one version per token (the model's representation).
inline std::vector<std::int64_t> expand(std::span<const ulorl::version_span> spans) {
  std::vector<std::int64_t> v;
  for (const auto& s : spans)
    for (auto t = s.begin; t < s.end; ++t) v.push_back(s.version);
  return v;
}

}  // namespace oracle
