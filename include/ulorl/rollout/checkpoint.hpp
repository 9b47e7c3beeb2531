// ulorl/rollout/checkpoint.hpp — save a segment_scheduler to a byte buffer and restore it exactly,
// plus a JSON dump for inspection.
//
// Format: the envelope of core/checkpoint.hpp (magic "ULORLCKP", envelope version, kind
// checkpoint_kind::segment_scheduler, payload version scheduler_checkpoint_version, payload length,
// CRC-64/XZ over header and payload). The payload is the plain `segment_scheduler_state` field by
// field (core/serialize.hpp: little-endian fixed-width integers); vectors are a u64 count followed by
// their elements. restore_scheduler rejects (ulorl::error, function "restore_scheduler") anything the
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
#include <vector>

#include "ulorl/core/checkpoint.hpp"
#if defined(__unix__) || defined(__APPLE__)
#include "ulorl/core/checkpoint_file.hpp"  // POSIX: the file functions below exist only there
#endif
#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/serialize.hpp"
#include "ulorl/rollout/segment_scheduler.hpp"

ULORL_NAMESPACE_BEGIN

//! Payload format version of a segment_scheduler checkpoint (2: the core/checkpoint.hpp envelope;
//! 1 was the scheduler's own "ULRLSEGS" header with an FNV-1a checksum, no longer read).
inline constexpr std::uint32_t scheduler_checkpoint_version = 2;

namespace detail {

inline void write_state(byte_writer& w, const segment_scheduler_state& s) {
  const auto& c = s.config;
  w.i32(c.group_size);
  w.i64(c.max_response_tokens);
  w.i32(c.num_segments);
  w.i64(c.max_active_responses);
  w.i64(c.max_decode_tokens);
  w.i64(c.max_new_groups_per_step);
  w.u8(static_cast<std::uint8_t>(c.order));
  w.i64(c.release_batch_groups);
  w.i64(c.max_staleness);
  w.u8(static_cast<std::uint8_t>(c.on_stale));
  w.u8(static_cast<std::uint8_t>(s.phase));
  w.i64(s.step);
  w.i64(s.policy_version);
  w.i64(s.next_group_id);
  w.i64(s.offered_end);
  w.i64(s.active_responses);
  w.u64(s.groups.size());
  for (const auto& g : s.groups) {
    w.i64(g.group_id);
    w.u8(static_cast<std::uint8_t>(g.status));
    w.i32(g.done);
    w.i64(g.admitted_step);
    w.i64(g.completed_step);
  }
  w.u64(s.responses.size());
  for (const auto& r : s.responses) {
    w.u8(static_cast<std::uint8_t>(r.state));
    w.i64(r.tokens);
    w.i64(r.finish_step);
    w.i32(r.failures);
    w.i32(r.decode_steps);
    w.i32(r.plan_index);
    w.u64(r.spans.size());
    for (const auto& sp : r.spans) {
      w.i64(sp.begin);
      w.i64(sp.end);
      w.i64(sp.version);
    }
  }
  const auto write_i32s = [&](const std::vector<std::int32_t>& v) {
    w.u64(v.size());
    for (const auto x : v) w.i32(x);
  };
  write_i32s(s.free_slots);
  write_i32s(s.live_order);
  write_i32s(s.ready);
  w.u64(s.ready_head);
  w.u64(s.plan.size());
  for (const auto& it : s.plan) {
    w.i64(it.response_id);
    w.i64(it.group_id);
    w.i32(it.index_in_group);
    w.i64(it.start_token);
    w.i64(it.max_new_tokens);
    w.i64(it.policy_version);
  }
  w.u64(s.plan_reported.size());
  for (const auto x : s.plan_reported) w.u8(x);
  const auto& m = s.current;
  for (const auto v : {m.step, m.items, m.reported, m.failed, m.aborted, m.finished, m.truncated, m.new_tokens, m.completed_groups})
    w.i64(v);
  const auto& k = s.counters;
  for (const auto v : {k.offered_groups, k.admitted_groups, k.released_groups, k.released_responses, k.finished_responses,
                       k.truncated_responses, k.planned_items, k.reported_items, k.failed_items, k.aborted_items,
                       k.stale_drops, k.generated_tokens, k.released_tokens, k.dropped_tokens})
    w.i64(v);
}

inline segment_scheduler_state read_state(byte_reader& r) {
  segment_scheduler_state s;
  auto& c = s.config;
  c.group_size = r.i32("config.group_size");
  c.max_response_tokens = r.i64("config.max_response_tokens");
  c.num_segments = r.i32("config.num_segments");
  c.max_active_responses = r.i64("config.max_active_responses");
  c.max_decode_tokens = r.i64("config.max_decode_tokens");
  c.max_new_groups_per_step = r.i64("config.max_new_groups_per_step");
  c.order = static_cast<release_order>(r.u8("config.order"));
  c.release_batch_groups = r.i64("config.release_batch_groups");
  c.max_staleness = r.i64("config.max_staleness");
  c.on_stale = static_cast<staleness_action>(r.u8("config.on_stale"));
  s.phase = static_cast<scheduler_phase>(r.u8("phase"));
  s.step = r.i64("step");
  s.policy_version = r.i64("policy_version");
  s.next_group_id = r.i64("next_group_id");
  s.offered_end = r.i64("offered_end");
  s.active_responses = r.i64("active_responses");
  s.groups.resize(r.count("groups", 29));
  for (auto& g : s.groups) {
    g.group_id = r.i64("groups.group_id");
    g.status = static_cast<group_status>(r.u8("groups.status"));
    g.done = r.i32("groups.done");
    g.admitted_step = r.i64("groups.admitted_step");
    g.completed_step = r.i64("groups.completed_step");
  }
  s.responses.resize(r.count("responses", 37));
  for (auto& x : s.responses) {
    x.state = static_cast<response_state>(r.u8("responses.state"));
    x.tokens = r.i64("responses.tokens");
    x.finish_step = r.i64("responses.finish_step");
    x.failures = r.i32("responses.failures");
    x.decode_steps = r.i32("responses.decode_steps");
    x.plan_index = r.i32("responses.plan_index");
    x.spans.resize(r.count("responses.spans", 24));
    for (auto& sp : x.spans) {
      sp.begin = r.i64("spans.begin");
      sp.end = r.i64("spans.end");
      sp.version = r.i64("spans.version");
    }
  }
  const auto read_i32s = [&](std::vector<std::int32_t>& v, std::string_view what) {
    v.resize(r.count(what, 4));
    for (auto& x : v) x = r.i32(what);
  };
  read_i32s(s.free_slots, "free_slots");
  read_i32s(s.live_order, "live_order");
  read_i32s(s.ready, "ready");
  s.ready_head = static_cast<std::size_t>(r.u64("ready_head"));
  s.plan.resize(r.count("plan", 44));
  for (auto& it : s.plan) {
    it.response_id = r.i64("plan.response_id");
    it.group_id = r.i64("plan.group_id");
    it.index_in_group = r.i32("plan.index_in_group");
    it.start_token = r.i64("plan.start_token");
    it.max_new_tokens = r.i64("plan.max_new_tokens");
    it.policy_version = r.i64("plan.policy_version");
  }
  s.plan_reported.resize(r.count("plan_reported", 1));
  for (auto& x : s.plan_reported) x = r.u8("plan_reported");
  auto& m = s.current;
  for (auto* v : {&m.step, &m.items, &m.reported, &m.failed, &m.aborted, &m.finished, &m.truncated, &m.new_tokens, &m.completed_groups})
    *v = r.i64("current");
  auto& k = s.counters;
  for (auto* v : {&k.offered_groups, &k.admitted_groups, &k.released_groups, &k.released_responses, &k.finished_responses,
                  &k.truncated_responses, &k.planned_items, &k.reported_items, &k.failed_items, &k.aborted_items,
                  &k.stale_drops, &k.generated_tokens, &k.released_tokens, &k.dropped_tokens})
    *v = r.i64("counters");
  return s;
}

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

//! Writes `state` as a checkpoint (envelope and payload) into `out` (replaced). The state is not
//! checked here: restore_scheduler checks it. Tests and fuzzers use this to encode crafted states.
inline void save_state(const segment_scheduler_state& state, std::vector<std::byte>& out) {
  out.clear();
  const std::size_t start = begin_checkpoint(out, checkpoint_kind::segment_scheduler, scheduler_checkpoint_version);
  byte_writer w(out);
  write_state(w, state);
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
  auto state = detail::read_state(r);
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
  const auto kv = [&](std::string_view k, std::int64_t v, bool comma = true) {
    o += '"';
    o += k;
    o += "\":";
    o += std::to_string(v);
    if (comma) o += ',';
  };
  const auto ks = [&](std::string_view k, std::string_view v, bool comma = true) {
    o += '"';
    o += k;
    o += "\":\"";
    o += v;
    o += '"';
    if (comma) o += ',';
  };
  o += "{\"format\":\"ulorl.segment_scheduler\",";
  kv("format_version", scheduler_checkpoint_version);
  o += "\"config\":{";
  kv("group_size", c.group_size);
  kv("max_response_tokens", c.max_response_tokens);
  kv("num_segments", c.num_segments);
  kv("segment_tokens", c.segment_tokens());
  kv("max_active_responses", c.max_active_responses);
  kv("max_decode_tokens", c.max_decode_tokens);
  kv("max_new_groups_per_step", c.max_new_groups_per_step);
  ks("order", c.order == release_order::completion ? "completion" : "admission");
  kv("release_batch_groups", c.release_batch_groups);
  kv("max_staleness", c.max_staleness);
  ks("on_stale", c.on_stale == staleness_action::recompute ? "recompute" : "drop", false);
  o += "},";
  ks("phase", s.phase == scheduler_phase::idle ? "idle" : "planned");
  kv("step", s.step);
  kv("policy_version", s.policy_version);
  kv("next_group_id", s.next_group_id);
  kv("offered_end", s.offered_end);
  kv("active_responses", s.active_responses);
  const auto& k = s.counters;
  o += "\"counters\":{";
  kv("offered_groups", k.offered_groups);
  kv("admitted_groups", k.admitted_groups);
  kv("released_groups", k.released_groups);
  kv("released_responses", k.released_responses);
  kv("finished_responses", k.finished_responses);
  kv("truncated_responses", k.truncated_responses);
  kv("planned_items", k.planned_items);
  kv("reported_items", k.reported_items);
  kv("failed_items", k.failed_items);
  kv("aborted_items", k.aborted_items);
  kv("stale_drops", k.stale_drops);
  kv("generated_tokens", k.generated_tokens);
  kv("released_tokens", k.released_tokens);
  kv("dropped_tokens", k.dropped_tokens, false);
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
    kv("group_id", gr.group_id);
    ks("status", detail::to_string(gr.status));
    kv("done", gr.done);
    kv("admitted_step", gr.admitted_step);
    kv("completed_step", gr.completed_step);
    o += "\"responses\":[";
    for (std::size_t q = 0; q < G; ++q) {
      const auto& r = s.responses[g * G + q];
      if (q) o += ',';
      o += '{';
      kv("response_id", gr.group_id * c.group_size + static_cast<std::int64_t>(q));
      ks("state", detail::to_string(r.state));
      kv("tokens", r.tokens);
      kv("finish_step", r.finish_step);
      kv("failures", r.failures);
      kv("decode_steps", r.decode_steps);
      kv("plan_index", r.plan_index);
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
