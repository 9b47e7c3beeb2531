// Fuzz target: restore_scheduler (ulorl/rollout/checkpoint.hpp) and the segment_scheduler(state)
// constructor. Whatever the bytes, restoring either throws ulorl::error or gives a scheduler that
// keeps the invariants (tests/fuzz/scheduler_fuzz.hpp), checkpoints again to the same bytes, and
// survives arbitrary API calls. The first input byte picks the mode:
//   0  raw: the rest of the input is the checkpoint (reaches the header, size and checksum checks);
//   1  checksummed: the rest is a checkpoint whose envelope (magic, versions, kind, length, CRC-64)
//      is rewritten around its payload with the library's own writer, so mutations reach the
//      payload parser and the state validation instead of stopping at the checksum;
//   2  structured: a real mid-run state (fuzzed configuration and engine behaviour) with a few
//      fields overwritten by fuzzed values, given to segment_scheduler(state) directly.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
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

void restore_bytes(std::span<const std::byte> bytes, FuzzedDataProvider& p) {
  std::optional<segment_scheduler> s;
  try {
    s.emplace(ulorl::restore_scheduler(bytes));
  } catch (const ulorl::error&) {
    return;
  }
  after_restore(s, bytes, p);
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const int mode = data[0] % 3;
  const auto rest = fuzz::as_bytes(data + 1, size - 1);
  if (mode == 2) {
    FuzzedDataProvider p(data + 1, size - 1);
    structured(p);
    return 0;
  }
  // The API calls after a successful restore draw from the same bytes (the checkpoint's tail).
  FuzzedDataProvider p(data + 1, size - 1);
  if (mode == 0) {
    restore_bytes(rest, p);
  } else {
    restore_bytes(rewrap(rest), p);
  }
  return 0;
}
