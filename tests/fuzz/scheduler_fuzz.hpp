// tests/fuzz/scheduler_fuzz.hpp — what the segment-scheduler fuzz targets share: a configuration
// drawn from fuzz input, the scheduler's invariants restated from docs/segment_rollout.md (checked
// on the state, not by calling the scheduler's own validation), a checkpoint round trip, a driver
// that plays a well-behaved engine (to reach realistic mid-run states), and a driver that makes
// arbitrary API calls on a scheduler (possibly restored from a corrupted checkpoint).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "fuzz_common.hpp"
#include "ulorl/rollout.hpp"

namespace fuzz {

//! A small configuration (the ranges of tests/test_rollout_scheduler_property.cpp), always valid.
inline ulorl::segment_scheduler_config scheduler_config(FuzzedDataProvider& p) {
  ulorl::segment_scheduler_config c;
  const std::int32_t gs[] = {1, 2, 3, 4, 8};
  c.group_size = gs[p.ConsumeIntegralInRange<int>(0, 4)];
  c.max_response_tokens = p.ConsumeBool() ? p.ConsumeIntegralInRange<std::int64_t>(1, 6) : p.ConsumeIntegralInRange<std::int64_t>(7, 48);
  c.num_segments = static_cast<std::int32_t>(std::min<std::int64_t>(p.ConsumeIntegralInRange<std::int64_t>(1, 6), c.max_response_tokens));
  const auto G = c.group_size;
  c.max_active_responses = p.ConsumeBool() ? 0 : G * p.ConsumeIntegralInRange<std::int64_t>(1, std::max<std::int64_t>(1, 24 / G));
  c.max_decode_tokens = p.ConsumeBool() ? c.segment_tokens() * G * p.ConsumeIntegralInRange<std::int64_t>(1, 5) + p.ConsumeIntegralInRange<std::int64_t>(0, 7) : 0;
  c.max_new_groups_per_step = p.ConsumeBool() ? p.ConsumeIntegralInRange<std::int64_t>(1, 3) : 0;
  c.order = p.ConsumeBool() ? ulorl::release_order::completion : ulorl::release_order::admission;
  c.release_batch_groups = p.ConsumeBool() ? p.ConsumeIntegralInRange<std::int64_t>(1, 4) : 0;
  c.max_staleness = p.ConsumeBool() ? p.ConsumeIntegralInRange<std::int64_t>(0, 3) : -1;
  c.on_stale = p.ConsumeBool() ? ulorl::staleness_action::drop : ulorl::staleness_action::recompute;
  return c;
}

//! The next segment boundary strictly after t, capped at L (docs: aligned segments).
inline std::int64_t segment_end_after(std::int64_t t, std::int64_t L, std::int64_t n_seg) {
  const std::int64_t seg = L / n_seg + (L % n_seg != 0);
  const std::int64_t b = (t / seg + 1) * seg;
  return b < L ? b : L;
}

//! Spans tile [0, tokens) in order, are non-empty, and versions never decrease nor exceed `current`.
inline void check_spans(std::span<const ulorl::version_span> spans, std::int64_t tokens, std::int64_t current) {
  std::int64_t at = 0, prev = 0;
  for (const auto& sp : spans) {
    FUZZ_CHECK(sp.begin == at);
    FUZZ_CHECK(sp.end > sp.begin);
    FUZZ_CHECK(sp.version >= prev && sp.version <= current);
    at = sp.end;
    prev = sp.version;
  }
  FUZZ_CHECK(at == tokens);
}

//! The scheduler's invariants, from the state: slots, per-response states and tokens, group
//! completion, the active count, token conservation, and the plan against the responses.
inline void check_invariants(const ulorl::segment_scheduler& s) {
  using ulorl::response_state;
  const auto& st = s.state();
  const auto& c = st.config;
  const auto G = static_cast<std::size_t>(c.group_size);
  const std::int64_t L = c.max_response_tokens;
  FUZZ_CHECK(st.responses.size() == st.groups.size() * G);
  std::int64_t active = 0, live_tokens = 0, live = 0, complete = 0;
  for (std::size_t g = 0; g < st.groups.size(); ++g) {
    const auto& gr = st.groups[g];
    if (gr.status == ulorl::group_status::free) continue;
    ++live;
    std::int32_t done = 0;
    for (std::size_t k = 0; k < G; ++k) {
      const auto& r = st.responses[g * G + k];
      FUZZ_CHECK(r.tokens >= 0 && r.tokens <= L);
      check_spans(r.spans, r.tokens, st.policy_version);
      switch (r.state) {
        case response_state::finished: ++done; break;
        case response_state::truncated:
          FUZZ_CHECK(r.tokens == L);
          ++done;
          break;
        case response_state::decoding: FUZZ_CHECK(st.phase == ulorl::scheduler_phase::planned); [[fallthrough]];
        case response_state::paused:
          FUZZ_CHECK(r.tokens < L);
          ++active;
          break;
        default: FUZZ_CHECK(!"live group holds a queued or released response");
      }
      live_tokens += r.tokens;
    }
    FUZZ_CHECK(done == gr.done);
    FUZZ_CHECK((gr.status == ulorl::group_status::complete) == (done == c.group_size));
    complete += gr.status == ulorl::group_status::complete;
  }
  FUZZ_CHECK(active == st.active_responses && active == s.active_responses());
  FUZZ_CHECK(s.live_groups() == live);
  FUZZ_CHECK(s.queued_groups() >= 0);
  FUZZ_CHECK(s.ready_groups() >= 0 && s.ready_groups() <= complete);
  const auto& k = st.counters;
  using wide = __int128;  // restored counters may be near the int64 limits
  FUZZ_CHECK(wide{k.generated_tokens} == wide{k.released_tokens} + live_tokens + k.dropped_tokens);
  FUZZ_CHECK(s.live_tokens() == live_tokens);
  if (st.phase == ulorl::scheduler_phase::idle) FUZZ_CHECK(st.plan.empty());
  FUZZ_CHECK(st.plan.size() == st.plan_reported.size());
}

//! save -> restore must give the same state and the same bytes; the restored scheduler replaces
//! the original so that later calls run on the rebuilt derived data.
inline void roundtrip(std::optional<ulorl::segment_scheduler>& s) {
  const auto bytes = ulorl::save_scheduler(*s);
  std::optional<ulorl::segment_scheduler> back;
  try {
    back.emplace(ulorl::restore_scheduler(bytes));
  } catch (const ulorl::error& e) {
    std::fprintf(stderr, "a scheduler's own checkpoint is rejected: %s\n", e.what());
    FUZZ_CHECK(!"restore_scheduler(save_scheduler(s)) threw");
  }
  FUZZ_CHECK(back->state() == s->state());
  FUZZ_CHECK(ulorl::save_scheduler(*back) == bytes);
  s.swap(back);
}

//! Checks a plan's items against the scheduler they came from.
inline void check_plan(const ulorl::segment_scheduler& s, std::span<const ulorl::plan_item> items) {
  const auto& c = s.config();
  std::set<std::int64_t> ids;
  for (const auto& it : items) {
    FUZZ_CHECK(ids.insert(it.response_id).second);
    FUZZ_CHECK(it.group_id == it.response_id / c.group_size && it.index_in_group == it.response_id % c.group_size);
    FUZZ_CHECK(it.start_token >= 0 && it.max_new_tokens >= 1 && it.max_new_tokens <= c.max_response_tokens - it.start_token);
    FUZZ_CHECK(it.start_token + it.max_new_tokens == segment_end_after(it.start_token, c.max_response_tokens, c.num_segments));
    FUZZ_CHECK(it.policy_version <= s.policy_version());
  }
}

//! Checks a released batch: whole groups, terminal responses, provenance covering the tokens.
inline void check_batch(const ulorl::segment_scheduler& s, const ulorl::experience_batch& b) {
  const auto& c = s.config();
  const auto G = static_cast<std::size_t>(c.group_size);
  FUZZ_CHECK(b.responses.size() == b.group_ids.size() * G);
  if (c.release_batch_groups > 0) FUZZ_CHECK(static_cast<std::int64_t>(b.group_ids.size()) <= c.release_batch_groups);
  std::set<std::int64_t> groups(b.group_ids.begin(), b.group_ids.end());
  FUZZ_CHECK(groups.size() == b.group_ids.size());
  for (std::size_t i = 0; i < b.responses.size(); ++i) {
    const auto& r = b.responses[i];
    FUZZ_CHECK(r.group_id == b.group_ids[i / G] && r.index_in_group == static_cast<std::int32_t>(i % G));
    FUZZ_CHECK(r.final_state == ulorl::response_state::finished || r.final_state == ulorl::response_state::truncated);
    FUZZ_CHECK(r.tokens >= 0 && r.tokens <= c.max_response_tokens);
    if (r.final_state == ulorl::response_state::truncated) FUZZ_CHECK(r.tokens == c.max_response_tokens);
    FUZZ_CHECK(r.span_offset + r.span_count <= b.spans.size());
    check_spans(b.spans_of(r), r.tokens, b.policy_version);
    FUZZ_CHECK(s.state_of(r.response_id) == ulorl::response_state::released);
  }
}

//! One call that must be rejected leaves the state as it was.
template <class F>
inline bool rejected_unchanged(const ulorl::segment_scheduler& s, F&& call) {
  const auto before = s.state();
  try {
    call();
  } catch (const ulorl::error&) {
    FUZZ_CHECK(s.state() == before);
    return true;
  }
  return false;
}

//! A well-behaved host and engine for `steps` steps: offers prompts, plans, reports every item
//! (segment_end, eos at a fuzzed length, failures), sometimes skips one (aborted at end_step),
//! updates the policy and takes experience. `stop_mid_step` leaves the last step open with part of
//! its plan reported, so that checkpoints of an open step are reachable too.
inline void drive_valid(ulorl::segment_scheduler& s, FuzzedDataProvider& p, int steps, bool stop_mid_step) {
  using ulorl::decode_outcome;
  for (int i = 0; i < steps; ++i) {
    if (p.ConsumeBool()) s.offer_prompts(p.ConsumeIntegralInRange<std::int64_t>(0, 3));
    if (p.ConsumeIntegralInRange<int>(0, 3) == 0) s.update_policy(s.policy_version() + p.ConsumeIntegralInRange<std::int64_t>(1, 2));
    const auto plan = s.plan();
    const std::vector<ulorl::plan_item> items(plan.items.begin(), plan.items.end());
    const bool last = i + 1 == steps && stop_mid_step;
    const std::size_t report_n = last ? p.ConsumeIntegralInRange<std::size_t>(0, items.size()) : items.size();
    for (std::size_t j = 0; j < report_n; ++j) {
      const auto& it = items[j];
      switch (p.ConsumeIntegralInRange<int>(0, 5)) {
        case 0: s.report(it.response_id, p.ConsumeIntegralInRange<std::int64_t>(0, it.max_new_tokens), decode_outcome::eos); break;
        case 1: s.report(it.response_id, p.ConsumeIntegralInRange<std::int64_t>(0, it.max_new_tokens), decode_outcome::failed); break;
        case 2: break;  // never reported: aborted by end_step()
        default: s.report(it.response_id, it.max_new_tokens, decode_outcome::segment_end); break;
      }
    }
    if (last) return;
    (void)s.end_step();
    if (p.ConsumeBool()) (void)s.take_experience(p.ConsumeBool());
  }
}

//! An upper bound of the groups the next plan() admits, and whether their responses are few. A configuration without any admission
//! budget (all 0 = unbounded) admits every queued prompt, as documented; the fuzzer only plans when
//! that stays small, so that a restored queue of 2^40 prompts is not an out-of-memory report.
inline bool admission_is_small(const ulorl::segment_scheduler& s) {
  const auto& c = s.config();
  std::int64_t bound = s.queued_groups();
  if (c.max_new_groups_per_step > 0) bound = std::min(bound, c.max_new_groups_per_step);
  if (c.max_active_responses > 0) bound = std::min<std::int64_t>(bound, c.max_active_responses / c.group_size);
  if (c.max_decode_tokens > 0 && c.segment_tokens() > 0)
    bound = std::min<std::int64_t>(bound, c.max_decode_tokens / c.segment_tokens() / c.group_size);
  // Responses, not groups: a restored state may carry any group size up to the limit.
  return bound <= 4096 && bound * static_cast<std::int64_t>(c.group_size) <= 4096;
}

//! Arbitrary API calls (valid and invalid arguments) on `s`, checking after each call that a
//! rejected call changed nothing, that accepted calls keep the invariants, and that every state
//! reached checkpoints and restores exactly.
inline void drive_any(std::optional<ulorl::segment_scheduler>& s, FuzzedDataProvider& p, int calls) {
  using ulorl::decode_outcome;
  using ulorl::scheduler_phase;
  for (int i = 0; i < calls && p.remaining_bytes() > 0; ++i) {
    auto& sc = *s;
    switch (p.ConsumeIntegralInRange<int>(0, 7)) {
      case 0: {
        const std::int64_t n = p.ConsumeBool() ? p.ConsumeIntegralInRange<std::int64_t>(0, 3) : any_int64(p);
        rejected_unchanged(sc, [&] { (void)sc.offer_prompts(n); });
        break;
      }
      case 1:
        if (sc.phase() == scheduler_phase::idle && admission_is_small(sc)) {
          ulorl::step_plan plan;
          if (rejected_unchanged(sc, [&] { plan = sc.plan(); })) {
            // Refused only at a counter limit: the step, or planned items within one plan of 2^62.
            using lim = ulorl::segment_scheduler_limits;
            FUZZ_CHECK(sc.step() >= lim::max_count || sc.counters().planned_items > lim::max_count - lim::max_live_responses);
            break;
          }
          check_plan(sc, plan.items);
          for (const auto& it : plan.items) {
            FUZZ_CHECK(sc.state_of(it.response_id) == ulorl::response_state::decoding);
            FUZZ_CHECK(sc.tokens_of(it.response_id) == it.start_token);
          }
        } else if (sc.phase() != scheduler_phase::idle) {
          FUZZ_CHECK(rejected_unchanged(sc, [&] { (void)sc.plan(); }));
        }
        break;
      case 2:
      case 3: {
        const auto items = sc.current_plan();
        std::int64_t id = any_int64(p), n = any_int64(p), quota = 0;
        if (!items.empty() && p.ConsumeBool()) {
          const auto& it = items[p.ConsumeIntegralInRange<std::size_t>(0, items.size() - 1)];
          id = it.response_id;
          quota = it.max_new_tokens;
          if (p.ConsumeBool()) n = p.ConsumeIntegralInRange<std::int64_t>(0, quota);
        }
        const auto o = static_cast<decode_outcome>(p.ConsumeIntegralInRange<int>(0, 3));
        std::int64_t before_tokens = -1;
        try {
          before_tokens = sc.tokens_of(id);
        } catch (const ulorl::error&) {
        }
        if (!rejected_unchanged(sc, [&] { sc.report(id, n, o); })) {
          FUZZ_CHECK(n >= 0 && before_tokens >= 0 && o <= decode_outcome::failed);
          if (quota > 0) FUZZ_CHECK(n <= quota);
          if (o == decode_outcome::segment_end && quota > 0) FUZZ_CHECK(n == quota);
          FUZZ_CHECK(sc.tokens_of(id) == before_tokens + n);
        }
        break;
      }
      case 4:
        if (sc.phase() == scheduler_phase::planned) {
          const auto items = static_cast<std::int64_t>(sc.current_plan().size());
          const auto sum = sc.end_step();
          FUZZ_CHECK(sum.items == items && sum.reported + sum.aborted == items);
          FUZZ_CHECK(sc.phase() == scheduler_phase::idle && sc.current_plan().empty());
        } else {
          FUZZ_CHECK(rejected_unchanged(sc, [&] { (void)sc.end_step(); }));
        }
        break;
      case 5: check_batch(sc, sc.take_experience(p.ConsumeBool())); break;
      case 6: {
        std::int64_t v = any_int64(p);
        if (p.ConsumeBool()) {
          std::int64_t near;  // just below, at or just above the current version
          if (!__builtin_add_overflow(sc.policy_version(), p.ConsumeIntegralInRange<std::int64_t>(-1, 2), &near)) v = near;
        }
        // Versions must increase; a version of 2^62 or more may be refused as out of range.
        if (rejected_unchanged(sc, [&] { sc.update_policy(v); })) FUZZ_CHECK(v <= sc.policy_version() || v >= (std::int64_t{1} << 62));
        else FUZZ_CHECK(sc.policy_version() == v);
        break;
      }
      default: roundtrip(s); break;
    }
    check_invariants(*s);
  }
}

}  // namespace fuzz
