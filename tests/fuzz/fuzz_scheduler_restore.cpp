// Fuzz target: the restores of ulorl/rollout's state: restore_scheduler and
// restore_scheduler_from_file (ulorl/rollout/checkpoint.hpp), the segment_scheduler(state)
// constructor, and the segment_autotuner(state) constructor. Whatever the bytes, restoring either
// throws ulorl::error or gives a machine that keeps its invariants (tests/fuzz/scheduler_fuzz.hpp),
// checkpoints again to the same bytes or state, and survives arbitrary API calls, each of which
// either is refused and changes nothing or leaves a state that restores. The first input byte
// picks the mode (byte % 5) and, for modes 0 and 1, the path ((byte / 5) % 2):
//   0  raw: the rest of the input is the checkpoint (reaches the header, size and checksum checks);
//   1  checksummed: the rest is a checkpoint whose envelope (magic, versions, kind, length, CRC-64)
//      is rewritten around its payload with the library's own writer, so mutations reach the
//      payload parser and the state validation instead of stopping at the checksum;
//   2  structured: a real mid-run state (fuzzed configuration and engine behaviour) with a few
//      fields overwritten by fuzzed values, given to segment_scheduler(state) directly;
//   3  near the limits: a real mid-run state whose step, policy version, offered prompts, token and
//      item counters and per-response counts are moved, consistently, to at or just below their
//      limits (segment_scheduler_limits); it must restore, and every later call must either be
//      refused or keep a state that restores (no overflow: the build runs UBSan);
//   4  segment tuner: a segment_autotuner state (window, costs, decision counter near 2^63 - 1)
//      for segment_autotuner(state), then observe / choose calls;
// and with path bit 1, modes 0 and 1 also write the checkpoint to a regular file and read it with
// restore_scheduler_from_file, which must agree with restore_scheduler.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz_common.hpp"
#include "scheduler_fuzz.hpp"
#include "ulorl/rollout.hpp"

namespace {

using ulorl::segment_scheduler;
using ulorl::segment_scheduler_state;

void after_restore(std::optional<segment_scheduler>& s, std::span<const std::byte> bytes, FuzzedDataProvider& p) {
  fuzz::check_invariants(*s);
  const auto again = ulorl::save_scheduler(*s);
  if (!bytes.empty()) FUZZ_CHECK(fuzz::same_bytes(again, bytes));
  fuzz::roundtrip(s);
  fuzz::drive_any(s, p, 24);
}

void restore_bytes(std::span<const std::byte> bytes, FuzzedDataProvider& p, bool via_file) {
  std::optional<segment_scheduler> s = fuzz::restore_both<segment_scheduler>(
      bytes, via_file, [](auto b) { return ulorl::restore_scheduler(b); },
      [](const std::string& path) { return ulorl::restore_scheduler_from_file(path); },
      [](const segment_scheduler& x, const segment_scheduler& y) { return x.state() == y.state(); });
  if (s) after_restore(s, bytes, p);
}

//! Wraps the payload of `b` (the bytes between a 24-byte header and an 8-byte checksum, or all of
//! `b` when shorter) in a fresh, valid envelope (ulorl/core/checkpoint.hpp's own writer).
std::vector<std::byte> rewrap(std::span<const std::byte> b) {
  const auto payload = b.size() >= 32 ? b.subspan(24, b.size() - 32) : b;
  std::vector<std::byte> out;
  const auto at = ulorl::detail::begin_checkpoint(out, ulorl::checkpoint_kind::segment_scheduler, ulorl::scheduler_checkpoint_version);
  out.insert(out.end(), payload.begin(), payload.end());
  ulorl::detail::finish_checkpoint(out, at);
  return out;
}

template <class I>
void mutate_int(I& x, FuzzedDataProvider& p) {
  using U = std::make_unsigned_t<I>;  // +-1 wraps instead of overflowing
  switch (p.ConsumeIntegralInRange<int>(0, 2)) {
    case 0: x = static_cast<I>(fuzz::any_int64(p)); break;
    case 1: x = static_cast<I>(static_cast<U>(x) + 1u); break;
    default: x = static_cast<I>(static_cast<U>(x) - 1u); break;
  }
}
template <class E>
void mutate_enum(E& e, FuzzedDataProvider& p) {
  e = static_cast<E>(p.ConsumeIntegralInRange<int>(0, 7));
}
template <class V>
V* pick(std::vector<V>& v, FuzzedDataProvider& p) {
  return v.empty() ? nullptr : &v[p.ConsumeIntegralInRange<std::size_t>(0, v.size() - 1)];
}

//! Overwrites one field (or resizes one vector) of a valid state.
void mutate(segment_scheduler_state& s, FuzzedDataProvider& p) {
  auto& c = s.config;
  switch (p.ConsumeIntegralInRange<int>(0, 27)) {
    case 0: mutate_int(c.group_size, p); break;
    case 1: mutate_int(c.max_response_tokens, p); break;
    case 2: mutate_int(c.num_segments, p); break;
    case 3: mutate_int(c.max_active_responses, p); break;
    case 4: mutate_int(c.max_decode_tokens, p); break;
    case 5: mutate_int(c.release_batch_groups, p); break;
    case 6: mutate_int(c.max_staleness, p); break;
    case 7: mutate_enum(p.ConsumeBool() ? reinterpret_cast<std::uint8_t&>(c.order) : reinterpret_cast<std::uint8_t&>(c.on_stale), p); break;
    case 8: mutate_enum(s.phase, p); break;
    case 9: mutate_int(s.step, p); break;
    case 10: mutate_int(s.policy_version, p); break;
    case 11: mutate_int(s.next_group_id, p); break;
    case 12: mutate_int(s.offered_end, p); break;
    case 13: mutate_int(s.active_responses, p); break;
    case 14: mutate_int(s.ready_head, p); break;
    case 15:
      if (auto* g = pick(s.groups, p)) {
        switch (p.ConsumeIntegralInRange<int>(0, 4)) {
          case 0: mutate_int(g->group_id, p); break;
          case 1: mutate_enum(g->status, p); break;
          case 2: mutate_int(g->done, p); break;
          case 3: mutate_int(g->admitted_step, p); break;
          default: mutate_int(g->completed_step, p); break;
        }
      }
      break;
    case 16:
    case 17:
      if (auto* r = pick(s.responses, p)) {
        switch (p.ConsumeIntegralInRange<int>(0, 7)) {
          case 0: mutate_enum(r->state, p); break;
          case 1: mutate_int(r->tokens, p); break;
          case 2: mutate_int(r->finish_step, p); break;
          case 3: mutate_int(r->failures, p); break;
          case 4: mutate_int(r->decode_steps, p); break;
          case 5: mutate_int(r->plan_index, p); break;
          case 6:
            if (auto* sp = pick(r->spans, p)) {
              const int f = p.ConsumeIntegralInRange<int>(0, 2);
              mutate_int(f == 0 ? sp->begin : f == 1 ? sp->end : sp->version, p);
            }
            break;
          default:
            if (p.ConsumeBool() && !r->spans.empty()) r->spans.pop_back();
            else r->spans.push_back({fuzz::any_int64(p), fuzz::any_int64(p), fuzz::any_int64(p)});
            break;
        }
      }
      break;
    case 18:
    case 19: {
      auto& v = p.ConsumeBool() ? s.free_slots : (p.ConsumeBool() ? s.live_order : s.ready);
      const int op = p.ConsumeIntegralInRange<int>(0, 2);
      if (op == 0 && !v.empty()) v.pop_back();
      else if (op == 1) v.push_back(static_cast<std::int32_t>(fuzz::any_int64(p)));
      else if (auto* x = pick(v, p)) mutate_int(*x, p);
      break;
    }
    case 20:
    case 21:
      if (auto* it = pick(s.plan, p)) {
        switch (p.ConsumeIntegralInRange<int>(0, 5)) {
          case 0: mutate_int(it->response_id, p); break;
          case 1: mutate_int(it->group_id, p); break;
          case 2: mutate_int(it->index_in_group, p); break;
          case 3: mutate_int(it->start_token, p); break;
          case 4: mutate_int(it->max_new_tokens, p); break;
          default: mutate_int(it->policy_version, p); break;
        }
      }
      break;
    case 22:
      if (auto* x = pick(s.plan_reported, p)) *x = p.ConsumeIntegral<std::uint8_t>();
      break;
    case 23:
      if (p.ConsumeBool()) {
        // One more group's worth of responses; group_size may itself be mutated (to 2^31 - 1), so
        // the harness adds at most 64 records: the restore must reject the mismatch either way.
        s.groups.emplace_back();
        s.responses.resize(s.responses.size() + static_cast<std::size_t>(std::clamp(c.group_size, 0, 64)));
      } else if (!s.groups.empty()) {
        s.groups.pop_back();
      }
      break;
    case 24:
    case 25: {
      auto& k = s.counters;
      std::int64_t* fields[] = {&k.offered_groups,  &k.admitted_groups, &k.released_groups,   &k.released_responses,
                                &k.finished_responses, &k.truncated_responses, &k.planned_items, &k.reported_items,
                                &k.failed_items,    &k.aborted_items,   &k.stale_drops,       &k.generated_tokens,
                                &k.released_tokens, &k.dropped_tokens};
      mutate_int(*fields[p.ConsumeIntegralInRange<std::size_t>(0, std::size(fields) - 1)], p);
      break;
    }
    case 26: {
      auto& m = s.current;
      std::int64_t* fields[] = {&m.step, &m.items, &m.reported, &m.failed, &m.aborted, &m.finished, &m.truncated, &m.new_tokens, &m.completed_groups};
      mutate_int(*fields[p.ConsumeIntegralInRange<std::size_t>(0, std::size(fields) - 1)], p);
      break;
    }
    default: mutate_int(c.max_new_groups_per_step, p); break;
  }
}

void structured(FuzzedDataProvider& p) {
  std::optional<segment_scheduler> base;
  base.emplace(fuzz::scheduler_config(p));
  fuzz::drive_valid(*base, p, p.ConsumeIntegralInRange<int>(0, 12), p.ConsumeBool());
  auto state = base->state();
  const int edits = p.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < edits; ++i) mutate(state, p);
  std::optional<segment_scheduler> s;
  try {
    s.emplace(std::move(state));
  } catch (const ulorl::error&) {
    return;
  }
  after_restore(s, {}, p);
}

// ---- mode 3: counters at their limits -------------------------------------------------------------

//! `x` moved up to `limit - below` (below in [0, 3]) when that is above it; `also` moves with it.
void raise_to(std::int64_t& x, std::int64_t limit, FuzzedDataProvider& p, std::int64_t* also = nullptr) {
  const std::int64_t target = limit - p.ConsumeIntegralInRange<std::int64_t>(0, 3);
  if (target <= x) return;
  if (also) *also += target - x;
  x = target;
}

void near_limits(FuzzedDataProvider& p) {
  using lim = ulorl::segment_scheduler_limits;
  segment_scheduler base(fuzz::scheduler_config(p));
  fuzz::drive_valid(base, p, p.ConsumeIntegralInRange<int>(0, 8), p.ConsumeBool());
  auto st = base.state();
  auto& k = st.counters;
  const bool planned = st.phase == ulorl::scheduler_phase::planned;
  // Each move keeps every relation restore checks: the step (and the open step's summary) with
  // admitted and finish steps below it; the version above every span and plan item; offered
  // prompts with their counter; token conservation (generated = released + live + dropped) by
  // moving released or dropped tokens along; reported items with planned ones.
  if (p.ConsumeBool()) {
    const auto step = st.step;
    raise_to(st.step, planned ? lim::max_count - 1 : lim::max_count, p);
    if (planned) st.current.step += st.step - step;
  }
  if (p.ConsumeBool()) raise_to(st.policy_version, lim::max_count, p);
  if (p.ConsumeBool()) raise_to(st.offered_end, lim::max_offered_groups, p, &k.offered_groups);
  if (p.ConsumeBool()) raise_to(k.generated_tokens, lim::max_count, p, p.ConsumeBool() ? &k.released_tokens : &k.dropped_tokens);
  if (p.ConsumeBool()) raise_to(k.planned_items, lim::max_count, p, &k.reported_items);
  for (auto& r : st.responses) {
    if (p.ConsumeIntegralInRange<int>(0, 3) != 0) continue;
    r.failures = lim::max_response_count - p.ConsumeIntegralInRange<std::int32_t>(0, 2);
    r.decode_steps = lim::max_response_count - p.ConsumeIntegralInRange<std::int32_t>(0, 2);
  }
  std::vector<std::byte> bytes;
  ulorl::detail::save_state(st, bytes);
  std::optional<segment_scheduler> s;
  try {
    s.emplace(ulorl::restore_scheduler(bytes));
  } catch (const ulorl::error& e) {
    std::fprintf(stderr, "a state at the documented limits is rejected: %s\n", e.what());
    FUZZ_CHECK(!"restore_scheduler rejected a state within the limits");
  }
  FUZZ_CHECK(s->state() == st);
  after_restore(s, bytes, p);
}

// ---- mode 4: the segment tuner's state ------------------------------------------------------------

bool same_state(const ulorl::segment_autotune_state& a, const ulorl::segment_autotune_state& b) {
  return a.current == b.current && a.lengths == b.lengths && a.costs_known == b.costs_known && a.decisions == b.decisions &&
         fuzz::same_bits(a.engine.iteration_s, b.engine.iteration_s) && fuzz::same_bits(a.engine.per_sequence_s, b.engine.per_sequence_s) &&
         fuzz::same_bits(a.engine.per_context_token_s, b.engine.per_context_token_s) &&
         fuzz::same_bits(a.engine.prefill_token_s, b.engine.prefill_token_s) &&
         a.engine.rebuild_kv_on_resume == b.engine.rebuild_kv_on_resume && a.engine.padded_kv == b.engine.padded_kv &&
         fuzz::same_bits(a.trainer.per_token_s, b.trainer.per_token_s) && fuzz::same_bits(a.trainer.per_step_s, b.trainer.per_step_s);
}

//! A cost: usually a plausible one, sometimes an edge case (negative, NaN, huge, denormal).
double cost(FuzzedDataProvider& p, double typical) { return p.ConsumeIntegralInRange<int>(0, 7) != 0 ? typical : fuzz::any_double(p); }

void costs(FuzzedDataProvider& p, ulorl::decode_engine_model& e, ulorl::trainer_model& t) {
  e.iteration_s = cost(p, 10e-3);
  e.per_sequence_s = cost(p, 2e-6);
  e.per_context_token_s = cost(p, 1e-9);
  e.prefill_token_s = cost(p, 2e-6);
  e.rebuild_kv_on_resume = p.ConsumeBool();
  e.padded_kv = p.ConsumeBool();
  t.per_token_s = cost(p, 2e-6);
  t.per_step_s = cost(p, 1.0);
}

std::int64_t length(FuzzedDataProvider& p, std::int64_t L) {
  return p.ConsumeIntegralInRange<int>(0, 7) != 0 ? p.ConsumeIntegralInRange<std::int64_t>(1, L + 1) : fuzz::any_int64(p);
}

void tuner(FuzzedDataProvider& p) {
  ulorl::rollout_sim_config base;
  base.group_size = p.ConsumeIntegralInRange<std::int32_t>(1, 4);
  base.max_response_tokens = p.ConsumeIntegralInRange<std::int64_t>(8, 256);
  base.prompt_tokens = p.ConsumeIntegralInRange<std::int64_t>(1, 64);
  base.prompts_per_step = p.ConsumeIntegralInRange<std::int64_t>(1, 4);
  base.seed = p.ConsumeIntegral<std::uint64_t>();
  ulorl::segment_autotune_config a;
  a.candidates.clear();
  for (const std::int32_t n : {1, 2, 4, 8})
    if (p.ConsumeBool()) a.candidates.push_back(n);
  if (a.candidates.empty()) a.candidates.push_back(1);
  a.initial = a.candidates[p.ConsumeIntegralInRange<std::size_t>(0, a.candidates.size() - 1)];
  a.window_groups = p.ConsumeIntegralInRange<std::int64_t>(1, 8);
  a.min_groups = p.ConsumeIntegralInRange<std::int64_t>(1, a.window_groups);
  a.simulated_steps = p.ConsumeIntegralInRange<std::int64_t>(1, 2);
  a.simulated_warmup = p.ConsumeIntegralInRange<std::int64_t>(0, 1);
  a.min_gain = p.ConsumeBool() ? 0.0 : 0.05;

  ulorl::segment_autotune_state st;
  st.current = p.ConsumeBool() ? a.candidates[p.ConsumeIntegralInRange<std::size_t>(0, a.candidates.size() - 1)]
                               : static_cast<std::int32_t>(fuzz::any_int64(p));
  const auto G = static_cast<std::size_t>(base.group_size);
  const std::size_t n = p.ConsumeIntegralInRange<std::size_t>(0, 10) * G + (p.ConsumeIntegralInRange<int>(0, 7) == 0 ? 1 : 0);
  for (std::size_t i = 0; i < n; ++i) st.lengths.push_back(length(p, base.max_response_tokens));
  costs(p, st.engine, st.trainer);
  st.costs_known = p.ConsumeBool();
  st.decisions = p.ConsumeBool() ? static_cast<std::int64_t>(fuzz::near_limit(p)) : fuzz::any_int64(p);

  std::optional<ulorl::segment_autotuner> t;
  try {
    t.emplace(base, a, st);
  } catch (const ulorl::error&) {
    return;
  }
  FUZZ_CHECK(same_state(t->state(), st));
  // Every state the tuner reaches restores (a rejected call changes nothing).
  const auto restores = [&] {
    try {
      const ulorl::segment_autotuner back(base, a, t->state());
      FUZZ_CHECK(same_state(back.state(), t->state()));
    } catch (const ulorl::error& e) {
      std::fprintf(stderr, "a segment tuner's own state is rejected: %s\n", e.what());
      FUZZ_CHECK(!"segment_autotuner(base, config, t.state()) threw");
    }
  };
  std::vector<std::int64_t> group;
  for (int i = 0; i < 8 && p.remaining_bytes() > 0; ++i) {
    const auto before = t->state();
    const int op = p.ConsumeIntegralInRange<int>(0, 2);
    bool refused = false;
    std::string why;
    try {
      if (op == 0) {
        group.assign(p.ConsumeIntegralInRange<int>(0, 7) == 0 ? G + 1 : G, 0);
        for (auto& x : group) x = length(p, base.max_response_tokens);
        t->observe_group(group);
      } else if (op == 1) {
        ulorl::decode_engine_model e;
        ulorl::trainer_model tr;
        costs(p, e, tr);
        t->observe_costs(e, tr);
      } else {
        const auto n_seg = t->choose();
        FUZZ_CHECK(n_seg == t->current());
        FUZZ_CHECK(std::find(a.candidates.begin(), a.candidates.end(), n_seg) != a.candidates.end());
        const bool decided = before.costs_known && t->observed_groups() >= a.min_groups;
        FUZZ_CHECK(t->state().decisions == before.decisions + (decided ? 1 : 0));
      }
    } catch (const ulorl::error& e) {
      refused = true;
      why = e.what();
      FUZZ_CHECK(same_state(t->state(), before));
    }
    // A decision is refused only with the counter at its limit.
    if (refused && op == 2 && static_cast<std::uint64_t>(before.decisions) < ulorl::checkpoint_counter_limit) {
      std::fprintf(stderr, "choose() refused below the decision limit: %s\n", why.c_str());
      FUZZ_CHECK(!"segment_autotuner::choose refused a decision below its counter limit");
    }
    restores();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 5;
  const bool via_file = (data[0] / 5) % 2 == 1;
  const auto rest = fuzz::as_bytes(data + 1, size - 1);
  FuzzedDataProvider p(data + 1, size - 1);
  switch (mode) {
    // The API calls after a successful restore draw from the same bytes (the checkpoint's tail).
    case 0: restore_bytes(rest, p, via_file); break;
    case 1: restore_bytes(rewrap(rest), p, via_file); break;
    case 2: structured(p); break;
    case 3: near_limits(p); break;
    default: tuner(p); break;
  }
  return 0;
}
