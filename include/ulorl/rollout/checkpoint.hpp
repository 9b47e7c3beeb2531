// ulorl/rollout/checkpoint.hpp — save a segment_scheduler to a byte buffer and restore it exactly,
// plus a JSON dump for inspection.
//
// Format: the envelope of core/checkpoint.hpp (magic "ULORLCKP", envelope version, kind
// checkpoint_kind::segment_scheduler, payload version scheduler_checkpoint_version, payload length,
// CRC-64/XZ over header and payload). The payload is the plain `segment_scheduler_state` field by
// field, in the order of the field tables below, which save and restore both follow
// (core/serialize.hpp: little-endian fixed-width integers; vectors are a u64 count followed by
// their elements). restore_scheduler rejects (ulorl::error, function "restore_scheduler") anything the
// envelope rejects (truncation, wrong magic, kind or versions, a length mismatch, a checksum
// mismatch), a count larger than the bytes left, trailing bytes, and then any state outside the
// documented limits or whose invariants do not hold (the segment_scheduler(state) checks, every field
// bounded, run with that function's name), so a corrupted checkpoint never yields a scheduler that
// could lose or duplicate a response or overflow later.
// save_scheduler_to_file / restore_scheduler_from_file (POSIX) put the same bytes in a file through
// core/checkpoint_file.hpp, replaced atomically. The derived group index and the last experience
// batch are not stored; they are rebuilt/empty.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ulorl/core/checkpoint.hpp"
#if defined(__unix__) || defined(__APPLE__)
#include "ulorl/core/checkpoint_file.hpp"  // POSIX: the file functions below exist only there
#endif
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/fields.hpp"
#include "ulorl/core/serialize.hpp"
#include "ulorl/rollout/segment_scheduler.hpp"

ULORL_NAMESPACE_BEGIN

//! Payload format version of a segment_scheduler checkpoint (2: the core/checkpoint.hpp envelope;
//! 1 was the scheduler's own "ULRLSEGS" header with an FNV-1a checksum, no longer read).
inline constexpr std::uint32_t scheduler_checkpoint_version = 2;

//! The field tables (core/fields.hpp) of segment_scheduler_state and the records it holds: the
//! checkpoint's payload is the state's fields in these orders.
template <class C, class F>
  requires detail::record_of<C, segment_scheduler_config>
constexpr void visit_fields(C& c, F&& f) {
  f("group_size", c.group_size), f("max_response_tokens", c.max_response_tokens), f("num_segments", c.num_segments);
  f("max_active_responses", c.max_active_responses), f("max_decode_tokens", c.max_decode_tokens);
  f("max_new_groups_per_step", c.max_new_groups_per_step), f("order", c.order);
  f("release_batch_groups", c.release_batch_groups), f("max_staleness", c.max_staleness), f("on_stale", c.on_stale);
}
template <class G, class F>
  requires detail::record_of<G, group_record>
constexpr void visit_fields(G& g, F&& f) {
  f("group_id", g.group_id), f("status", g.status), f("done", g.done), f("admitted_step", g.admitted_step);
  f("completed_step", g.completed_step);
}
template <class V, class F>
  requires detail::record_of<V, version_span>
constexpr void visit_fields(V& v, F&& f) {
  f("begin", v.begin), f("end", v.end), f("version", v.version);
}
template <class R, class F>
  requires detail::record_of<R, response_record>
constexpr void visit_fields(R& r, F&& f) {
  f("state", r.state), f("tokens", r.tokens), f("finish_step", r.finish_step), f("failures", r.failures);
  f("decode_steps", r.decode_steps), f("plan_index", r.plan_index), f("spans", r.spans);
}
template <class P, class F>
  requires detail::record_of<P, plan_item>
constexpr void visit_fields(P& p, F&& f) {
  f("response_id", p.response_id), f("group_id", p.group_id), f("index_in_group", p.index_in_group);
  f("start_token", p.start_token), f("max_new_tokens", p.max_new_tokens), f("policy_version", p.policy_version);
}
template <class M, class F>
  requires detail::record_of<M, step_summary>
constexpr void visit_fields(M& m, F&& f) {
  f("step", m.step), f("items", m.items), f("reported", m.reported), f("failed", m.failed), f("aborted", m.aborted);
  f("finished", m.finished), f("truncated", m.truncated), f("new_tokens", m.new_tokens);
  f("completed_groups", m.completed_groups);
}
template <class K, class F>
  requires detail::record_of<K, scheduler_counters>
constexpr void visit_fields(K& k, F&& f) {
  f("offered_groups", k.offered_groups), f("admitted_groups", k.admitted_groups);
  f("released_groups", k.released_groups), f("released_responses", k.released_responses);
  f("finished_responses", k.finished_responses), f("truncated_responses", k.truncated_responses);
  f("planned_items", k.planned_items), f("reported_items", k.reported_items), f("failed_items", k.failed_items);
  f("aborted_items", k.aborted_items), f("stale_drops", k.stale_drops), f("generated_tokens", k.generated_tokens);
  f("released_tokens", k.released_tokens), f("dropped_tokens", k.dropped_tokens);
}
template <class S, class F>
  requires detail::record_of<S, segment_scheduler_state>
constexpr void visit_fields(S& s, F&& f) {
  f("config", s.config), f("phase", s.phase), f("step", s.step), f("policy_version", s.policy_version);
  f("next_group_id", s.next_group_id), f("offered_end", s.offered_end), f("active_responses", s.active_responses);
  f("groups", s.groups), f("responses", s.responses), f("free_slots", s.free_slots), f("live_order", s.live_order);
  f("ready", s.ready), f("ready_head", s.ready_head), f("plan", s.plan), f("plan_reported", s.plan_reported);
  f("current", s.current), f("counters", s.counters);
}

namespace detail {

inline const char* to_string(response_state s) noexcept {
  switch (s) {
    case response_state::queued: return "queued";
    case response_state::decoding: return "decoding";
    case response_state::paused: return "paused";
    case response_state::finished: return "finished";
    case response_state::truncated: return "truncated";
    case response_state::released: return "released";
  }
  return "invalid";
}
inline const char* to_string(group_status s) noexcept {
  switch (s) {
    case group_status::free: return "free";
    case group_status::live: return "live";
    case group_status::complete: return "complete";
  }
  return "invalid";
}
inline const char* to_string(release_order o) noexcept { return o == release_order::completion ? "completion" : "admission"; }
inline const char* to_string(staleness_action a) noexcept { return a == staleness_action::recompute ? "recompute" : "drop"; }

//! Writes `state` as a checkpoint (envelope and payload) into `out` (replaced). The state is not
//! checked here: restore_scheduler checks it. Tests and fuzzers use this to encode crafted states.
inline void save_state(const segment_scheduler_state& state, std::vector<std::byte>& out) {
  out.clear();
  const std::size_t start = begin_checkpoint(out, checkpoint_kind::segment_scheduler, scheduler_checkpoint_version);
  byte_writer w(out);
  write_fields(w, state);
  finish_checkpoint(out, start);
}

}  // namespace detail

//! Serialises the whole scheduler state (envelope, payload, checksum) into `out` (replaced).
inline void save_scheduler(const segment_scheduler& sched, std::vector<std::byte>& out) {
  detail::save_state(sched.state(), out);
}

//! Convenience overload returning a new buffer.
[[nodiscard]] inline std::vector<std::byte> save_scheduler(const segment_scheduler& sched) {
  std::vector<std::byte> out;
  save_scheduler(sched, out);
  return out;
}

//! Rebuilds a scheduler from save_scheduler()'s bytes; rejects any corrupted buffer or state.
[[nodiscard]] inline segment_scheduler restore_scheduler(std::span<const std::byte> bytes) {
  constexpr std::string_view fn = "restore_scheduler";
  auto r = detail::open_checkpoint(bytes, checkpoint_kind::segment_scheduler, scheduler_checkpoint_version, fn);
  segment_scheduler_state state;
  detail::read_fields(r, state);
  detail::close_checkpoint(r, fn);
  return segment_scheduler(std::move(state), detail::scheduler_restore{fn});
}

#if defined(__unix__) || defined(__APPLE__)
//! Saves `sched` to the file `path`, crash-safely: `path` holds the previous checkpoint or this one,
//! complete, whenever the process stops (detail::write_file_atomically: temporary, fsync, rename,
//! fsync of the directory).
inline void save_scheduler_to_file(const segment_scheduler& sched, const std::string& path) {
  const auto bytes = save_scheduler(sched);
  detail::write_file_atomically(path, bytes);
}

//! Rebuilds a scheduler from the checkpoint file `path` (at most checkpoint_file_max_bytes); the
//! bytes are checked as by restore_scheduler, whose name the errors about them carry.
[[nodiscard]] inline segment_scheduler restore_scheduler_from_file(const std::string& path) {
  const auto bytes = detail::read_file(path, "restore_scheduler_from_file");
  return restore_scheduler(bytes);
}
#endif

//! The state as JSON (for inspection and debugging; not a restore format).
[[nodiscard]] inline std::string scheduler_to_json(const segment_scheduler& sched) {
  const auto& s = sched.state();
  const auto& c = s.config;
  std::string o;
  o.reserve(256 + 96 * s.responses.size());
  const auto kv = [&](std::string_view k, std::int64_t v) {
    o += '"';
    o += k;
    o += "\":";
    o += std::to_string(v);
    o += ',';
  };
  const auto ks = [&](std::string_view k, std::string_view v) {
    o += '"';
    o += k;
    o += "\":\"";
    o += v;
    o += "\",";
  };
  // A field of a record's table: an enum by its name, an integer as a number; vectors are written
  // apart.
  const auto scalar = [&](std::string_view k, const auto& v) {
    using V = std::remove_cvref_t<decltype(v)>;
    if constexpr (std::is_enum_v<V>) ks(k, detail::to_string(v));
    else if constexpr (std::is_integral_v<V>) kv(k, static_cast<std::int64_t>(v));
  };
  o += "{\"format\":\"ulorl.segment_scheduler\",";
  kv("format_version", scheduler_checkpoint_version);
  o += "\"config\":{";
  visit_fields(c, [&](std::string_view k, const auto& v) {
    scalar(k, v);
    if (k == "num_segments") kv("segment_tokens", c.segment_tokens());
  });
  o.pop_back();  // the last field's comma
  o += "},";
  ks("phase", s.phase == scheduler_phase::idle ? "idle" : "planned");
  kv("step", s.step);
  kv("policy_version", s.policy_version);
  kv("next_group_id", s.next_group_id);
  kv("offered_end", s.offered_end);
  kv("active_responses", s.active_responses);
  o += "\"counters\":{";
  visit_fields(s.counters, scalar);
  o.pop_back();  // the last counter's comma
  o += "},\"groups\":[";
  bool first = true;
  const auto G = static_cast<std::size_t>(c.group_size);
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    const auto& gr = s.groups[g];
    if (gr.status == group_status::free) continue;
    if (!first) o += ',';
    first = false;
    o += '{';
    kv("slot", static_cast<std::int64_t>(g));
    visit_fields(gr, scalar);
    o += "\"responses\":[";
    for (std::size_t q = 0; q < G; ++q) {
      const auto& r = s.responses[g * G + q];
      if (q) o += ',';
      o += '{';
      kv("response_id", gr.group_id * c.group_size + static_cast<std::int64_t>(q));
      visit_fields(r, scalar);  // the spans follow
      o += "\"spans\":[";
      for (std::size_t j = 0; j < r.spans.size(); ++j) {
        if (j) o += ',';
        o += '[' + std::to_string(r.spans[j].begin) + ',' + std::to_string(r.spans[j].end) + ',' +
             std::to_string(r.spans[j].version) + ']';
      }
      o += "]}";
    }
    o += "]}";
  }
  o += "],\"plan\":[";
  for (std::size_t i = 0; i < s.plan.size(); ++i) {
    const auto& it = s.plan[i];
    if (i) o += ',';
    o += '{';
    kv("response_id", it.response_id);
    kv("start_token", it.start_token);
    kv("max_new_tokens", it.max_new_tokens);
    kv("policy_version", it.policy_version);
    o += "\"reported\":";
    o += s.plan_reported[i] ? "true" : "false";
    o += '}';
  }
  o += "],\"ready_groups\":[";
  first = true;
  for (std::size_t i = s.ready_head; i < s.ready.size(); ++i) {
    if (!first) o += ',';
    first = false;
    o += std::to_string(s.groups[static_cast<std::size_t>(s.ready[i])].group_id);
  }
  o += "]}";
  return o;
}

ULORL_NAMESPACE_END
