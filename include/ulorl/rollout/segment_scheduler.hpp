// ulorl/rollout/segment_scheduler.hpp — UloRL segment rollout as an explicit, host-driven state
// machine (Du et al. 2025, arXiv:2507.19766, "segment rollout").
//
// Decoding of a response of at most L_max tokens is cut into segments of L_seg = ceil(L_max / n_seg)
// tokens. Each step decodes at most one segment per active response: a response that reaches EOS
// or L_max goes to the experience pool, the rest wait in the unfinished pool and continue next step
// under whatever policy is then current. With n_seg = 1 this is an ordinary synchronous rollout.
//
// Per response:      queued -> decoding -> paused -> ... -> decoding -> finished | truncated -> released
//   (failed/aborted)            decoding -> paused   (committed tokens kept, decoded again next step)
// Per step (host):   plan() -> engine runs the items -> report(id, n, outcome)... -> end_step()
//                    update_policy(v) and take_experience() at any time.
// A group of G responses (one prompt) is released only when all G are finished or truncated.
//
// Design choices the paper leaves open (see docs/segment_rollout.md for the reasoning):
//  * admission is per whole group, in prompt order, after every unfinished response has been given
//    its segment; budgets: active (admitted, unfinished) responses and/or planned decode tokens;
//  * segments are aligned: a response at t committed tokens gets min(next multiple of L_seg, L_max) - t
//    new tokens, so it spans at most n_seg successful decode steps even after partial failures;
//  * release order is completion order (default) or strict prompt order; release happens in batches
//    of `release_batch_groups` whole groups;
//  * provenance is kept as version spans per response (merged when equal), see provenance.hpp.
//
// Cost: plan() is O(live groups * G), report() O(1) (a flat hash of live group ids), end_step()
// O(planned items), take_experience() O(released responses + their spans). In steady state nothing
// allocates: slots, span vectors and output buffers are recycled.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/flat_map.hpp"
#include "ulorl/rollout/provenance.hpp"

ULORL_NAMESPACE_BEGIN

//! Life cycle of one response.
enum class response_state : std::uint8_t {
  queued,     //!< its prompt was offered but not admitted yet
  decoding,   //!< in the open step's plan
  paused,     //!< admitted, unfinished, waiting for its next segment (the unfinished pool)
  finished,   //!< ended with EOS; waits for the rest of its group
  truncated,  //!< reached max_response_tokens; waits for the rest of its group
  released,   //!< handed to the trainer (terminal)
};

//! What the engine reports for one plan item.
enum class decode_outcome : std::uint8_t {
  segment_end,  //!< produced exactly the planned tokens, no EOS
  eos,          //!< stopped at EOS after `new_tokens` tokens (EOS included)
  failed,       //!< engine failure or preemption; `new_tokens` already produced are kept
};

//! Order in which completed groups are released.
enum class release_order : std::uint8_t {
  completion,  //!< first completed, first released (no head-of-line blocking)
  admission,   //!< strict prompt order: a completed group waits for every earlier prompt
};

//! What the staleness bound does when exceeded.
enum class staleness_action : std::uint8_t {
  recompute,  //!< keep the tokens; their old log-probs come from the current policy (see provenance)
  drop,       //!< discard an unfinished response's tokens and decode it again from token 0
};

//! Whether a step is open.
enum class scheduler_phase : std::uint8_t { idle, planned };

//! Scheduler parameters. Defaults follow the UloRL 64k setting with 4 segments.
struct segment_scheduler_config {
  std::int32_t group_size = 8;                 //!< G responses per prompt
  std::int64_t max_response_tokens = 65536;    //!< L_max
  std::int32_t num_segments = 4;               //!< n_seg; L_seg = ceil(L_max / n_seg)
  std::int64_t max_active_responses = 1024;    //!< admitted, unfinished responses (0 = unbounded)
  std::int64_t max_decode_tokens = 0;          //!< planned new tokens per step (0 = unbounded)
  std::int64_t max_new_groups_per_step = 0;    //!< admissions per step (0 = unbounded)
  release_order order = release_order::completion;
  std::int64_t release_batch_groups = 0;       //!< groups per released batch (0 = all ready groups)
  std::int64_t max_staleness = -1;             //!< versions; -1 = no bound
  staleness_action on_stale = staleness_action::recompute;

  //! L_seg, the tokens of one segment.
  [[nodiscard]] constexpr std::int64_t segment_tokens() const noexcept {
    return num_segments > 0 ? (max_response_tokens + num_segments - 1) / num_segments : 0;
  }
  friend constexpr bool operator==(const segment_scheduler_config&, const segment_scheduler_config&) = default;
};

//! One unit of work for the engine: decode up to `max_new_tokens` for one response.
struct plan_item {
  std::int64_t response_id = 0;    //!< group_id * G + index_in_group
  std::int64_t group_id = 0;
  std::int32_t index_in_group = 0;
  std::int64_t start_token = 0;    //!< tokens already committed (the context to resume from)
  std::int64_t max_new_tokens = 0;
  std::int64_t policy_version = 0; //!< version that must generate these tokens
  friend constexpr bool operator==(const plan_item&, const plan_item&) = default;
};

//! What plan() returns; `items` stays valid until the next call that changes the scheduler.
struct step_plan {
  std::int64_t step = 0;
  std::int64_t policy_version = 0;
  std::span<const plan_item> items;
  std::int64_t first_new_group = 0;   //!< admitted this step: group ids [first_new_group, +new_groups)
  std::int64_t new_groups = 0;
  std::int64_t planned_tokens = 0;    //!< sum of max_new_tokens
  std::int64_t resumed_items = 0;     //!< items that continue a response (start_token > 0)
};

//! Cumulative counters (token conservation: generated == released + live + dropped).
struct scheduler_counters {
  std::int64_t offered_groups = 0;
  std::int64_t admitted_groups = 0;
  std::int64_t released_groups = 0;
  std::int64_t released_responses = 0;
  std::int64_t finished_responses = 0;   //!< EOS
  std::int64_t truncated_responses = 0;  //!< hit L_max
  std::int64_t planned_items = 0;
  std::int64_t reported_items = 0;
  std::int64_t failed_items = 0;         //!< reported `failed`
  std::int64_t aborted_items = 0;        //!< not reported before end_step()
  std::int64_t stale_drops = 0;          //!< responses restarted by the staleness bound
  std::int64_t generated_tokens = 0;     //!< every committed token ever reported
  std::int64_t released_tokens = 0;
  std::int64_t dropped_tokens = 0;       //!< discarded by staleness drops
  friend constexpr bool operator==(const scheduler_counters&, const scheduler_counters&) = default;
};

//! Per-step outcome returned by end_step().
struct step_summary {
  std::int64_t step = 0;
  std::int64_t items = 0;
  std::int64_t reported = 0;
  std::int64_t failed = 0;
  std::int64_t aborted = 0;
  std::int64_t finished = 0;
  std::int64_t truncated = 0;
  std::int64_t new_tokens = 0;
  std::int64_t completed_groups = 0;
  friend constexpr bool operator==(const step_summary&, const step_summary&) = default;
};

//! One response handed to the trainer. Its spans are `batch.spans_of(r)`.
struct released_response {
  std::int64_t response_id = 0;
  std::int64_t group_id = 0;
  std::int32_t index_in_group = 0;
  response_state final_state = response_state::finished;  //!< finished (EOS) or truncated
  std::int64_t tokens = 0;
  std::int64_t first_version = 0;   //!< version of token 0 (= last_version when tokens == 0)
  std::int64_t last_version = 0;
  std::int64_t admitted_step = 0;
  std::int64_t finish_step = 0;
  std::int32_t failures = 0;        //!< failed or aborted decode items
  std::int32_t decode_steps = 0;    //!< plan items that committed at least one token
  std::size_t span_offset = 0;
  std::size_t span_count = 0;
};

//! Released experience: whole groups, in release order. Storage is reused by the next call.
struct experience_batch {
  std::int64_t policy_version = 0;  //!< current version at release (the POIS "old" policy)
  std::int64_t step = 0;
  std::vector<std::int64_t> group_ids;
  std::vector<released_response> responses;  //!< G per group, group-major, index order
  std::vector<version_span> spans;
  [[nodiscard]] std::span<const version_span> spans_of(const released_response& r) const noexcept {
    return {spans.data() + r.span_offset, r.span_count};
  }
  //! Versions spanned and lag of response r at release.
  [[nodiscard]] response_staleness staleness(const released_response& r) const noexcept {
    return {r.last_version - r.first_version, policy_version - r.first_version};
  }
  //! Steps from admission to release.
  [[nodiscard]] std::int64_t age_steps(const released_response& r) const noexcept { return step - r.admitted_step; }
};

//! Slot-level group record (plain data, part of the checkpoint).
enum class group_status : std::uint8_t { free, live, complete };
struct group_record {
  std::int64_t group_id = -1;
  group_status status = group_status::free;
  std::int32_t done = 0;           //!< finished + truncated responses
  std::int64_t admitted_step = 0;
  std::int64_t completed_step = -1;
  friend constexpr bool operator==(const group_record&, const group_record&) = default;
};

//! Slot-level response record (slot = group_slot * G + index_in_group).
struct response_record {
  response_state state = response_state::released;
  std::int64_t tokens = 0;
  std::int64_t finish_step = -1;
  std::int32_t failures = 0;
  std::int32_t decode_steps = 0;
  std::int32_t plan_index = -1;     //!< index in the open plan, -1 when not planned
  std::vector<version_span> spans;  //!< capacity reused when the slot is recycled
  friend bool operator==(const response_record&, const response_record&) = default;
};

//! The whole checkpointable state. Everything else in the scheduler is derived from it.
struct segment_scheduler_state {
  segment_scheduler_config config{};
  scheduler_phase phase = scheduler_phase::idle;
  std::int64_t step = 0;              //!< index of the open step, or of the next one when idle
  std::int64_t policy_version = 0;
  std::int64_t next_group_id = 0;     //!< first group id not admitted yet
  std::int64_t offered_end = 0;       //!< group ids [next_group_id, offered_end) are queued
  std::int64_t active_responses = 0;  //!< admitted and unfinished (decoding or paused)
  std::vector<group_record> groups;           //!< slot-indexed
  std::vector<response_record> responses;     //!< slot * G + k
  std::vector<std::int32_t> free_slots;       //!< LIFO
  std::vector<std::int32_t> live_order;       //!< admitted unreleased groups, admission order (lazy)
  std::vector<std::int32_t> ready;            //!< completion order (release_order::completion only)
  std::size_t ready_head = 0;
  std::vector<plan_item> plan;                //!< the open step's items
  std::vector<std::uint8_t> plan_reported;
  step_summary current{};
  scheduler_counters counters{};
  friend bool operator==(const segment_scheduler_state&, const segment_scheduler_state&) = default;
};

namespace detail {

inline void validate_scheduler_config(std::string_view fn, const segment_scheduler_config& c) {
  if (c.group_size < 1) fail_value(fn, "config.group_size", c.group_size, "must be >= 1");
  if (c.group_size > (1 << 20)) fail_value(fn, "config.group_size", c.group_size, "must be <= 2^20");
  if (c.max_response_tokens < 1) fail_value(fn, "config.max_response_tokens", c.max_response_tokens, "must be >= 1");
  if (c.max_response_tokens > (std::int64_t{1} << 40))
    fail_value(fn, "config.max_response_tokens", c.max_response_tokens, "must be <= 2^40");
  if (c.num_segments < 1) fail_value(fn, "config.num_segments", c.num_segments, "must be >= 1");
  if (c.num_segments > c.max_response_tokens)
    fail_value(fn, "config.num_segments", c.num_segments, "must not exceed max_response_tokens");
  if (c.max_active_responses < 0) fail_value(fn, "config.max_active_responses", c.max_active_responses, "must be >= 0 (0 = unbounded)");
  if (c.max_active_responses > 0 && c.max_active_responses < c.group_size)
    fail_value(fn, "config.max_active_responses", c.max_active_responses,
               "must hold at least one whole group (>= group_size), or be 0 (unbounded)");
  if (c.max_decode_tokens < 0) fail_value(fn, "config.max_decode_tokens", c.max_decode_tokens, "must be >= 0 (0 = unbounded)");
  if (c.max_decode_tokens > 0 && c.max_decode_tokens < c.segment_tokens() * c.group_size)
    fail_value(fn, "config.max_decode_tokens", c.max_decode_tokens,
               "must fit one whole group's segment (>= group_size * segment_tokens()), or be 0 (unbounded)");
  if (c.max_new_groups_per_step < 0)
    fail_value(fn, "config.max_new_groups_per_step", c.max_new_groups_per_step, "must be >= 0 (0 = unbounded)");
  if (c.order != release_order::completion && c.order != release_order::admission)
    fail_value(fn, "config.order", static_cast<int>(c.order), "unknown release_order");
  if (c.release_batch_groups < 0) fail_value(fn, "config.release_batch_groups", c.release_batch_groups, "must be >= 0");
  if (c.max_staleness < -1) fail_value(fn, "config.max_staleness", c.max_staleness, "must be -1 (none) or >= 0");
  if (c.on_stale != staleness_action::recompute && c.on_stale != staleness_action::drop)
    fail_value(fn, "config.on_stale", static_cast<int>(c.on_stale), "unknown staleness_action");
}

}  // namespace detail

//! The UloRL segment-rollout scheduler. See the header comment for the protocol.
class segment_scheduler {
 public:
  explicit segment_scheduler(const segment_scheduler_config& config = {}) {
    detail::validate_scheduler_config("segment_scheduler", config);
    s_.config = config;
    reserve_for_budget();
  }

  //! Rebuilds a scheduler from a saved state; every invariant is checked (throws ulorl::error).
  explicit segment_scheduler(segment_scheduler_state state) : s_(std::move(state)) {
    validate_state();  // also builds the group index
    reserve_for_budget();
  }

  [[nodiscard]] const segment_scheduler_state& state() const noexcept { return s_; }
  [[nodiscard]] const segment_scheduler_config& config() const noexcept { return s_.config; }
  [[nodiscard]] const scheduler_counters& counters() const noexcept { return s_.counters; }
  [[nodiscard]] scheduler_phase phase() const noexcept { return s_.phase; }
  [[nodiscard]] std::int64_t step() const noexcept { return s_.step; }
  [[nodiscard]] std::int64_t policy_version() const noexcept { return s_.policy_version; }
  [[nodiscard]] std::int64_t active_responses() const noexcept { return s_.active_responses; }
  [[nodiscard]] std::int64_t queued_groups() const noexcept { return s_.offered_end - s_.next_group_id; }
  [[nodiscard]] std::int64_t live_groups() const noexcept { return static_cast<std::int64_t>(index_.size()); }
  //! Completed groups not yet released.
  [[nodiscard]] std::int64_t ready_groups() const noexcept {
    if (s_.config.order == release_order::completion)
      return static_cast<std::int64_t>(s_.ready.size() - s_.ready_head);
    return static_cast<std::int64_t>(admission_prefix());
  }
  //! Committed tokens held by live (admitted, unreleased) responses.
  [[nodiscard]] std::int64_t live_tokens() const noexcept {
    return s_.counters.generated_tokens - s_.counters.released_tokens - s_.counters.dropped_tokens;
  }

  //! Queues `n` more prompts; returns the group id of the first. Prompts are admitted in id order.
  std::int64_t offer_prompts(std::int64_t n) {
    if (n < 0 || n > (std::int64_t{1} << 40))
      detail::fail_value("segment_scheduler::offer_prompts", "n", n, "must be in [0, 2^40]");
    const std::int64_t first = s_.offered_end;
    s_.offered_end += n;
    s_.counters.offered_groups += n;
    return first;
  }

  //! Opens a step: applies the staleness drop, gives every unfinished response its next segment
  //! (admission order), then admits whole new groups while the budgets allow.
  [[nodiscard]] step_plan plan() {
    constexpr std::string_view fn = "segment_scheduler::plan";
    if (s_.phase != scheduler_phase::idle)
      detail::fail_value(fn, "phase", "planned", "a step is already open; call end_step() first");
    const auto& c = s_.config;
    const std::int32_t G = c.group_size;
    const std::int64_t budget = c.max_decode_tokens > 0 ? c.max_decode_tokens : std::numeric_limits<std::int64_t>::max();
    s_.plan.clear();
    s_.plan_reported.clear();
    plan_slot_.clear();
    report_hint_ = 0;
    s_.current = step_summary{};
    s_.current.step = s_.step;
    step_plan out;
    out.step = s_.step;
    out.policy_version = s_.policy_version;
    std::int64_t planned = 0;
    bool blocked = false;

    // Drop released groups from live_order (stable; admission order is preserved).
    std::size_t w = 0;
    for (std::size_t i = 0; i < s_.live_order.size(); ++i) {
      const auto g = s_.live_order[i];
      if (s_.groups[static_cast<std::size_t>(g)].status != group_status::free) s_.live_order[w++] = g;
    }
    s_.live_order.resize(w);

    for (const std::int32_t g : s_.live_order) {
      const auto& gr = s_.groups[static_cast<std::size_t>(g)];
      if (gr.status != group_status::live) continue;
      for (std::int32_t k = 0; k < G; ++k) {
        auto& r = s_.responses[slot_of(g, k)];
        if (r.state != response_state::paused) continue;
        if (c.on_stale == staleness_action::drop && c.max_staleness >= 0 && r.tokens > 0 &&
            s_.policy_version - r.spans.front().version > c.max_staleness) {
          s_.counters.dropped_tokens += r.tokens;
          s_.counters.stale_drops += 1;
          r.tokens = 0;
          r.spans.clear();
        }
        if (blocked) continue;
        const std::int64_t quota = quota_of(r.tokens);
        if (quota > budget - planned) {
          blocked = true;  // head-of-line: nothing later may overtake an older response
          continue;
        }
        push_item(r, gr.group_id, g, k, quota);
        planned += quota;
        if (r.tokens > 0) ++out.resumed_items;
      }
    }

    out.first_new_group = s_.next_group_id;
    const std::int64_t first_quota = quota_of(0);
    while (!blocked && s_.next_group_id < s_.offered_end) {
      if (c.max_active_responses > 0 && s_.active_responses + G > c.max_active_responses) break;
      if (c.max_new_groups_per_step > 0 && out.new_groups >= c.max_new_groups_per_step) break;
      if (first_quota * G > budget - planned) break;
      const std::int32_t g = admit_group();
      for (std::int32_t k = 0; k < G; ++k) push_item(s_.responses[slot_of(g, k)], s_.groups[static_cast<std::size_t>(g)].group_id, g, k, first_quota);
      planned += first_quota * G;
      ++out.new_groups;
    }
    s_.phase = scheduler_phase::planned;
    s_.current.items = static_cast<std::int64_t>(s_.plan.size());
    s_.counters.planned_items += s_.current.items;
    out.items = s_.plan;
    out.planned_tokens = planned;
    return out;
  }

  //! The open step's items (empty when idle).
  [[nodiscard]] std::span<const plan_item> current_plan() const noexcept { return s_.plan; }

  //! Reports one item's result. Validated completely before any change: unknown or unplanned
  //! response, a second report, `new_tokens` outside [0, max_new_tokens], or `segment_end` with
  //! fewer tokens than planned are rejected.
  void report(std::int64_t response_id, std::int64_t new_tokens, decode_outcome outcome) {
    constexpr std::string_view fn = "segment_scheduler::report";
    const std::int32_t idx = planned_index(fn, response_id);
    const std::int32_t g = plan_slot_[static_cast<std::size_t>(idx)];
    const plan_item& it = s_.plan[static_cast<std::size_t>(idx)];
    if (outcome != decode_outcome::segment_end && outcome != decode_outcome::eos && outcome != decode_outcome::failed)
      detail::fail_value(fn, "outcome", static_cast<int>(outcome), "unknown decode_outcome");
    if (new_tokens < 0 || new_tokens > it.max_new_tokens)
      detail::fail_at(fn, "new_tokens", response_id, new_tokens, "must be in [0, max_new_tokens] of the plan item");
    if (outcome == decode_outcome::segment_end && new_tokens != it.max_new_tokens)
      detail::fail_at(fn, "new_tokens", response_id, new_tokens,
                      "segment_end must produce exactly max_new_tokens; report eos or failed otherwise");
    s_.plan_reported[static_cast<std::size_t>(idx)] = 1;
    auto& r = s_.responses[slot_of(g, it.index_in_group)];
    commit(r, it, new_tokens);
    ++s_.current.reported;
    ++s_.counters.reported_items;
    s_.current.new_tokens += new_tokens;
    switch (outcome) {
      case decode_outcome::failed:
        ++r.failures;
        ++s_.current.failed;
        ++s_.counters.failed_items;
        // Tokens committed before the failure are kept; a response they fill up is complete.
        if (r.tokens >= s_.config.max_response_tokens) finish(r, g, response_state::truncated);
        else r.state = response_state::paused;
        break;
      case decode_outcome::eos:
        finish(r, g, response_state::finished);
        break;
      case decode_outcome::segment_end:
        if (r.tokens >= s_.config.max_response_tokens) finish(r, g, response_state::truncated);
        else r.state = response_state::paused;
        break;
    }
  }

  //! Same as report(response_id, 0, decode_outcome::failed): the item is re-queued unchanged.
  void abort(std::int64_t response_id) { report(response_id, 0, decode_outcome::failed); }

  //! Closes the step. Items never reported count as aborted (engine crash): they go back to the
  //! unfinished pool with their committed tokens.
  step_summary end_step() {
    if (s_.phase != scheduler_phase::planned)
      detail::fail_value("segment_scheduler::end_step", "phase", "idle", "no step is open; call plan() first");
    for (std::size_t i = 0; i < s_.plan.size(); ++i) {
      const auto& it = s_.plan[i];
      auto& r = s_.responses[slot_of(plan_slot_[i], it.index_in_group)];
      if (!s_.plan_reported[i]) {
        r.state = response_state::paused;
        ++r.failures;
        ++s_.current.aborted;
        ++s_.counters.aborted_items;
      }
      r.plan_index = -1;
    }
    s_.plan.clear();
    s_.plan_reported.clear();
    plan_slot_.clear();
    s_.phase = scheduler_phase::idle;
    ++s_.step;
    return s_.current;
  }

  //! Declares that the trainer now holds policy `version` (strictly increasing). Tokens already
  //! planned keep the version they were planned under.
  void update_policy(std::int64_t version) {
    if (version <= s_.policy_version)
      detail::fail_value("segment_scheduler::update_policy", "version", version,
                         "policy versions must strictly increase (current is " + std::to_string(s_.policy_version) + ")");
    s_.policy_version = version;
  }

  //! Releases whole completed groups: a batch of exactly `release_batch_groups` when that many are
  //! ready (nothing otherwise), or every ready group when it is 0. `allow_partial` releases a short
  //! final batch. The returned storage is reused by the next call.
  const experience_batch& take_experience(bool allow_partial = false) {
    const auto& c = s_.config;
    batch_.policy_version = s_.policy_version;
    batch_.step = s_.step;
    batch_.group_ids.clear();
    batch_.responses.clear();
    batch_.spans.clear();
    const auto avail = static_cast<std::int64_t>(ready_groups());
    std::int64_t n = avail;
    if (c.release_batch_groups > 0) n = avail >= c.release_batch_groups ? c.release_batch_groups : (allow_partial ? avail : 0);
    if (n == 0) return batch_;
    if (c.order == release_order::completion) {
      for (std::int64_t i = 0; i < n; ++i) release_group(s_.ready[s_.ready_head++]);
      if (s_.ready_head == s_.ready.size()) {
        s_.ready.clear();
        s_.ready_head = 0;
      } else if (s_.ready_head > 1024 && 2 * s_.ready_head > s_.ready.size()) {
        s_.ready.erase(s_.ready.begin(), s_.ready.begin() + static_cast<std::ptrdiff_t>(s_.ready_head));
        s_.ready_head = 0;
      }
    } else {
      std::int64_t taken = 0;
      for (std::size_t i = 0; i < s_.live_order.size() && taken < n; ++i) {
        const auto g = s_.live_order[i];
        const auto st = s_.groups[static_cast<std::size_t>(g)].status;
        if (st == group_status::free) continue;
        release_group(g);
        ++taken;
      }
    }
    return batch_;
  }

  //! State of any response id ever offered (throws for ids never offered).
  [[nodiscard]] response_state state_of(std::int64_t response_id) const {
    constexpr std::string_view fn = "segment_scheduler::state_of";
    if (response_id < 0 || response_id / s_.config.group_size >= s_.offered_end)
      detail::fail_value(fn, "response_id", response_id, "was never offered");
    const std::int64_t gid = response_id / s_.config.group_size;
    if (gid >= s_.next_group_id) return response_state::queued;
    const std::int32_t g = index_.value_or(gid, -1);
    if (g < 0) return response_state::released;
    return s_.responses[slot_of(g, static_cast<std::int32_t>(response_id % s_.config.group_size))].state;
  }

  //! Provenance of a live response (valid until the next mutating call).
  [[nodiscard]] std::span<const version_span> spans_of(std::int64_t response_id) const {
    const auto& r = live_response("segment_scheduler::spans_of", response_id);
    return r.spans;
  }
  //! Committed tokens of a live response.
  [[nodiscard]] std::int64_t tokens_of(std::int64_t response_id) const {
    return live_response("segment_scheduler::tokens_of", response_id).tokens;
  }

 private:
  [[nodiscard]] std::size_t slot_of(std::int32_t g, std::int32_t k) const noexcept {
    return static_cast<std::size_t>(g) * static_cast<std::size_t>(s_.config.group_size) + static_cast<std::size_t>(k);
  }
  [[nodiscard]] std::int64_t quota_of(std::int64_t tokens) const noexcept {
    const std::int64_t L = s_.config.segment_tokens();
    return std::min((tokens / L + 1) * L, s_.config.max_response_tokens) - tokens;
  }
  [[nodiscard]] std::size_t admission_prefix() const noexcept {
    std::size_t n = 0;
    for (const auto g : s_.live_order) {
      const auto st = s_.groups[static_cast<std::size_t>(g)].status;
      if (st == group_status::free) continue;
      if (st != group_status::complete) break;
      ++n;
    }
    return n;
  }
  const response_record& live_response(std::string_view fn, std::int64_t response_id) const {
    if (response_id < 0) detail::fail_value(fn, "response_id", response_id, "must be >= 0");
    const std::int32_t g = index_.value_or(response_id / s_.config.group_size, -1);
    if (g < 0) detail::fail_value(fn, "response_id", response_id, "is not live (never admitted, or released)");
    return s_.responses[slot_of(g, static_cast<std::int32_t>(response_id % s_.config.group_size))];
  }
  // Hosts usually report in plan order: the hint finds the item without touching the group index.
  std::int32_t planned_index(std::string_view fn, std::int64_t response_id) {
    if (s_.phase != scheduler_phase::planned)
      detail::fail_value(fn, "response_id", response_id, "no step is open; call plan() first");
    std::int32_t idx;
    if (report_hint_ < s_.plan.size() && s_.plan[report_hint_].response_id == response_id) {
      idx = static_cast<std::int32_t>(report_hint_);
    } else {
      const auto& r = live_response(fn, response_id);
      if (r.plan_index < 0) detail::fail_value(fn, "response_id", response_id, "is not in the open step's plan");
      idx = r.plan_index;
    }
    if (s_.plan_reported[static_cast<std::size_t>(idx)])
      detail::fail_value(fn, "response_id", response_id, "was already reported in this step (duplicate report)");
    report_hint_ = static_cast<std::size_t>(idx) + 1;
    return idx;
  }
  void push_item(response_record& r, std::int64_t gid, std::int32_t g, std::int32_t k, std::int64_t quota) {
    r.state = response_state::decoding;
    r.plan_index = static_cast<std::int32_t>(s_.plan.size());
    s_.plan.push_back(plan_item{gid * s_.config.group_size + k, gid, k, r.tokens, quota, s_.policy_version});
    s_.plan_reported.push_back(0);
    plan_slot_.push_back(g);
  }
  std::int32_t admit_group() {
    const std::int32_t G = s_.config.group_size;
    std::int32_t g;
    if (!s_.free_slots.empty()) {
      g = s_.free_slots.back();
      s_.free_slots.pop_back();
    } else {
      g = static_cast<std::int32_t>(s_.groups.size());
      s_.groups.emplace_back();
      s_.responses.resize(s_.responses.size() + static_cast<std::size_t>(G));
    }
    auto& gr = s_.groups[static_cast<std::size_t>(g)];
    gr = group_record{s_.next_group_id, group_status::live, 0, s_.step, -1};
    // One span per segment plus slack for mid-segment updates; capped so huge num_segments do not
    // reserve memory up front (vectors then grow once and keep their capacity when slots recycle).
    const auto span_cap = static_cast<std::size_t>(std::min<std::int32_t>(s_.config.num_segments, 4)) + 1;
    for (std::int32_t k = 0; k < G; ++k) {
      auto& r = s_.responses[slot_of(g, k)];
      r.state = response_state::paused;
      r.tokens = 0;
      r.finish_step = -1;
      r.failures = 0;
      r.decode_steps = 0;
      r.plan_index = -1;
      r.spans.clear();
      if (r.spans.capacity() < span_cap) r.spans.reserve(span_cap);
    }
    index_.try_emplace(s_.next_group_id, g);
    s_.live_order.push_back(g);
    ++s_.next_group_id;
    s_.active_responses += G;
    ++s_.counters.admitted_groups;
    return g;
  }
  void commit(response_record& r, const plan_item& it, std::int64_t n) {
    if (n == 0) return;
    if (!r.spans.empty() && r.spans.back().version == it.policy_version) r.spans.back().end += n;
    else r.spans.push_back(version_span{r.tokens, r.tokens + n, it.policy_version});
    r.tokens += n;
    ++r.decode_steps;
    s_.counters.generated_tokens += n;
  }
  void finish(response_record& r, std::int32_t g, response_state st) {
    r.state = st;
    r.finish_step = s_.step;
    --s_.active_responses;
    if (st == response_state::finished) {
      ++s_.counters.finished_responses;
      ++s_.current.finished;
    } else {
      ++s_.counters.truncated_responses;
      ++s_.current.truncated;
    }
    auto& gr = s_.groups[static_cast<std::size_t>(g)];
    if (++gr.done == s_.config.group_size) {
      gr.status = group_status::complete;
      gr.completed_step = s_.step;
      ++s_.current.completed_groups;
      if (s_.config.order == release_order::completion) s_.ready.push_back(g);
    }
  }
  void release_group(std::int32_t g) {
    auto& gr = s_.groups[static_cast<std::size_t>(g)];
    ULORL_ASSERT(gr.status == group_status::complete);
    batch_.group_ids.push_back(gr.group_id);
    for (std::int32_t k = 0; k < s_.config.group_size; ++k) {
      auto& r = s_.responses[slot_of(g, k)];
      released_response o;
      o.response_id = gr.group_id * s_.config.group_size + k;
      o.group_id = gr.group_id;
      o.index_in_group = k;
      o.final_state = r.state;
      o.tokens = r.tokens;
      o.first_version = r.spans.empty() ? s_.policy_version : r.spans.front().version;
      o.last_version = r.spans.empty() ? s_.policy_version : r.spans.back().version;
      o.admitted_step = gr.admitted_step;
      o.finish_step = r.finish_step;
      o.failures = r.failures;
      o.decode_steps = r.decode_steps;
      o.span_offset = batch_.spans.size();
      o.span_count = r.spans.size();
      batch_.spans.insert(batch_.spans.end(), r.spans.begin(), r.spans.end());
      batch_.responses.push_back(o);
      s_.counters.released_tokens += r.tokens;
      r.state = response_state::released;
    }
    s_.counters.released_responses += s_.config.group_size;
    ++s_.counters.released_groups;
    index_.erase(gr.group_id);
    gr.status = group_status::free;
    s_.free_slots.push_back(g);
  }
  void reserve_for_budget() {
    const auto& c = s_.config;
    if (c.max_active_responses <= 0) return;
    const auto groups = static_cast<std::size_t>(c.max_active_responses / c.group_size) + 1;
    index_.reserve(groups * 2);
    s_.plan.reserve(static_cast<std::size_t>(c.max_active_responses));
    s_.plan_reported.reserve(static_cast<std::size_t>(c.max_active_responses));
    plan_slot_.reserve(static_cast<std::size_t>(c.max_active_responses));
    s_.live_order.reserve(groups * 2);
    s_.free_slots.reserve(groups * 2);
  }
  void rebuild_index() {
    index_.clear();
    for (std::size_t g = 0; g < s_.groups.size(); ++g)
      if (s_.groups[g].status != group_status::free) index_.try_emplace(s_.groups[g].group_id, static_cast<std::int32_t>(g));
  }
  void validate_state();

  segment_scheduler_state s_;
  detail::flat_int_map<std::int64_t, std::int32_t> index_;  // live group id -> slot (derived data)
  std::vector<std::int32_t> plan_slot_;  // group slot of each plan item (derived from plan + index)
  std::size_t report_hint_ = 0;          // plan index after the last report
  experience_batch batch_;
};

// Restoring is the trust boundary of a checkpoint: each field is checked against every other so
// that a corrupted (but well-formed) state cannot produce a scheduler that violates its invariants.
inline void segment_scheduler::validate_state() {
  constexpr std::string_view fn = "segment_scheduler(state)";
  const auto& c = s_.config;
  detail::validate_scheduler_config(fn, c);
  const auto G = static_cast<std::size_t>(c.group_size);
  const auto fail = [&](std::string_view arg, std::int64_t index, std::int64_t value, std::string_view what) {
    detail::fail_at(fn, arg, index, value, what);
  };
  if (s_.phase != scheduler_phase::idle && s_.phase != scheduler_phase::planned)
    fail("phase", -1, static_cast<int>(s_.phase), "unknown phase");
  if (s_.step < 0) fail("step", -1, s_.step, "must be >= 0");
  if (s_.policy_version < 0) fail("policy_version", -1, s_.policy_version, "must be >= 0");
  if (s_.next_group_id < 0 || s_.offered_end < s_.next_group_id)
    fail("offered_end", -1, s_.offered_end, "must be >= next_group_id >= 0");
  if (s_.responses.size() != s_.groups.size() * G)
    fail("responses", -1, static_cast<std::int64_t>(s_.responses.size()), "must hold group_size entries per group slot");
  if (s_.groups.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
    fail("groups", -1, static_cast<std::int64_t>(s_.groups.size()), "too many slots");
  const std::int64_t L = c.max_response_tokens;
  std::int64_t active = 0, live_tokens = 0, live_groups = 0;
  std::vector<std::uint8_t> seen(s_.groups.size(), 0);
  for (std::size_t g = 0; g < s_.groups.size(); ++g) {
    const auto& gr = s_.groups[g];
    const auto gi = static_cast<std::int64_t>(g);
    if (gr.status == group_status::free) continue;
    if (gr.status != group_status::live && gr.status != group_status::complete) fail("groups.status", gi, static_cast<int>(gr.status), "unknown status");
    ++live_groups;
    if (gr.group_id < 0 || gr.group_id >= s_.next_group_id) fail("groups.group_id", gi, gr.group_id, "not an admitted group id");
    if (gr.admitted_step < 0 || gr.admitted_step > s_.step) fail("groups.admitted_step", gi, gr.admitted_step, "outside [0, step]");
    std::int32_t done = 0;
    for (std::size_t k = 0; k < G; ++k) {
      const auto& r = s_.responses[g * G + k];
      const auto ri = static_cast<std::int64_t>(g * G + k);
      switch (r.state) {
        case response_state::finished:
        case response_state::truncated: ++done; break;
        case response_state::paused: ++active; break;
        case response_state::decoding:
          ++active;
          if (s_.phase != scheduler_phase::planned) fail("responses.state", ri, static_cast<int>(r.state), "decoding while no step is open");
          break;
        default: fail("responses.state", ri, static_cast<int>(r.state), "invalid state for a live group");
      }
      if (r.tokens < 0 || r.tokens > L) fail("responses.tokens", ri, r.tokens, "outside [0, max_response_tokens]");
      if (r.state == response_state::truncated && r.tokens != L) fail("responses.tokens", ri, r.tokens, "truncated response must hold max_response_tokens");
      if ((r.state == response_state::paused || r.state == response_state::decoding) && r.tokens == L)
        fail("responses.tokens", ri, r.tokens, "an unfinished response cannot hold max_response_tokens");
      if (r.failures < 0 || r.decode_steps < 0 || static_cast<std::size_t>(r.decode_steps) < r.spans.size())
        fail("responses.decode_steps", ri, r.decode_steps, "counters inconsistent with spans");
      detail::validate_version_spans(fn, r.spans, s_.policy_version);
      if (span_tokens(r.spans) != r.tokens) fail("responses.spans", ri, span_tokens(r.spans), "spans must cover exactly the committed tokens");
      for (std::size_t j = 1; j < r.spans.size(); ++j)
        if (r.spans[j].version == r.spans[j - 1].version) fail("responses.spans", ri, r.spans[j].version, "adjacent spans of one version must be merged");
      const bool is_done = r.state == response_state::finished || r.state == response_state::truncated;
      if (is_done != (r.finish_step >= 0) || r.finish_step > s_.step) fail("responses.finish_step", ri, r.finish_step, "inconsistent with state");
      if (r.state == response_state::decoding) {
        if (r.plan_index < 0 || static_cast<std::size_t>(r.plan_index) >= s_.plan.size()) fail("responses.plan_index", ri, r.plan_index, "decoding response without a plan item");
      }
      if (r.plan_index >= 0) {
        if (s_.phase != scheduler_phase::planned || static_cast<std::size_t>(r.plan_index) >= s_.plan.size())
          fail("responses.plan_index", ri, r.plan_index, "no such plan item");
        const auto& it = s_.plan[static_cast<std::size_t>(r.plan_index)];
        if (it.group_id != gr.group_id || it.index_in_group != static_cast<std::int32_t>(k))
          fail("responses.plan_index", ri, r.plan_index, "plan item belongs to another response");
      }
      live_tokens += r.tokens;
    }
    if (done != gr.done) fail("groups.done", gi, gr.done, "does not match the finished/truncated responses");
    if ((gr.status == group_status::complete) != (done == c.group_size)) fail("groups.status", gi, static_cast<int>(gr.status), "complete iff all responses are done");
    if ((gr.status == group_status::complete) != (gr.completed_step >= 0) || gr.completed_step > s_.step)
      fail("groups.completed_step", gi, gr.completed_step, "inconsistent with status");
  }
  if (active != s_.active_responses) fail("active_responses", -1, s_.active_responses, "does not match the unfinished responses");
  // Duplicate live ids would make the index ambiguous.
  {
    std::vector<std::int64_t> ids;
    ids.reserve(static_cast<std::size_t>(live_groups));
    for (const auto& gr : s_.groups) if (gr.status != group_status::free) ids.push_back(gr.group_id);
    std::sort(ids.begin(), ids.end());
    if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) fail("groups.group_id", -1, *std::adjacent_find(ids.begin(), ids.end()), "duplicate live group id");
  }
  rebuild_index();
  for (std::size_t i = 0; i < s_.free_slots.size(); ++i) {
    const auto g = s_.free_slots[i];
    if (g < 0 || static_cast<std::size_t>(g) >= s_.groups.size() || s_.groups[static_cast<std::size_t>(g)].status != group_status::free || seen[static_cast<std::size_t>(g)])
      fail("free_slots", static_cast<std::int64_t>(i), g, "must list each free slot once");
    seen[static_cast<std::size_t>(g)] = 1;
  }
  std::int64_t free_count = 0;
  for (const auto& gr : s_.groups) free_count += gr.status == group_status::free;
  if (free_count != static_cast<std::int64_t>(s_.free_slots.size())) fail("free_slots", -1, static_cast<std::int64_t>(s_.free_slots.size()), "must list every free slot");
  // live_order: every live group once, in increasing id (= admission) order; free slots may linger.
  std::fill(seen.begin(), seen.end(), 0);
  std::int64_t prev_id = -1, live_listed = 0;
  for (std::size_t i = 0; i < s_.live_order.size(); ++i) {
    const auto g = s_.live_order[i];
    if (g < 0 || static_cast<std::size_t>(g) >= s_.groups.size() || seen[static_cast<std::size_t>(g)])
      fail("live_order", static_cast<std::int64_t>(i), g, "invalid or repeated slot");
    seen[static_cast<std::size_t>(g)] = 1;
    const auto& gr = s_.groups[static_cast<std::size_t>(g)];
    if (gr.status == group_status::free) continue;
    if (gr.group_id <= prev_id) fail("live_order", static_cast<std::int64_t>(i), gr.group_id, "must be in admission order");
    prev_id = gr.group_id;
    ++live_listed;
  }
  if (live_listed != live_groups) fail("live_order", -1, live_listed, "must list every live group");
  // ready: exactly the complete groups, once each (completion order only).
  if (s_.ready_head > s_.ready.size()) fail("ready_head", -1, static_cast<std::int64_t>(s_.ready_head), "past the end of ready");
  std::int64_t complete = 0;
  for (const auto& gr : s_.groups) complete += gr.status == group_status::complete;
  if (c.order == release_order::completion) {
    std::fill(seen.begin(), seen.end(), 0);
    for (std::size_t i = s_.ready_head; i < s_.ready.size(); ++i) {
      const auto g = s_.ready[i];
      if (g < 0 || static_cast<std::size_t>(g) >= s_.groups.size() || seen[static_cast<std::size_t>(g)] ||
          s_.groups[static_cast<std::size_t>(g)].status != group_status::complete)
        fail("ready", static_cast<std::int64_t>(i), g, "must list each complete group once");
      seen[static_cast<std::size_t>(g)] = 1;
    }
    if (static_cast<std::int64_t>(s_.ready.size() - s_.ready_head) != complete) fail("ready", -1, complete, "must list every complete group");
  } else if (s_.ready.size() != s_.ready_head) {
    fail("ready", -1, static_cast<std::int64_t>(s_.ready.size()), "unused with release_order::admission");
  }
  // Plan: consistent with phase and with the responses it names.
  if (s_.plan.size() != s_.plan_reported.size()) fail("plan_reported", -1, static_cast<std::int64_t>(s_.plan_reported.size()), "must match plan");
  if (s_.phase == scheduler_phase::idle && !s_.plan.empty()) fail("plan", -1, static_cast<std::int64_t>(s_.plan.size()), "must be empty when idle");
  plan_slot_.clear();
  for (std::size_t i = 0; i < s_.plan.size(); ++i) {
    const auto& it = s_.plan[i];
    const auto ii = static_cast<std::int64_t>(i);
    if (s_.plan_reported[i] > 1) fail("plan_reported", ii, s_.plan_reported[i], "must be 0 or 1");
    const std::int32_t g = index_.value_or(it.group_id, -1);
    plan_slot_.push_back(g);
    if (g < 0 || it.index_in_group < 0 || it.index_in_group >= c.group_size || it.response_id != it.group_id * c.group_size + it.index_in_group)
      fail("plan.response_id", ii, it.response_id, "does not name a live response");
    const auto& r = s_.responses[slot_of(g, it.index_in_group)];
    if (r.plan_index != static_cast<std::int32_t>(i)) fail("plan.response_id", ii, it.response_id, "response does not point back at this item");
    if (!s_.plan_reported[i] && r.state != response_state::decoding) fail("plan_reported", ii, 0, "unreported item must be decoding");
    if (s_.plan_reported[i] && r.state == response_state::decoding) fail("plan_reported", ii, 1, "reported item cannot still be decoding");
    if (it.policy_version < 0 || it.policy_version > s_.policy_version) fail("plan.policy_version", ii, it.policy_version, "outside [0, policy_version]");
    if (it.max_new_tokens < 1 || it.start_token < 0 || it.start_token + it.max_new_tokens > L) fail("plan.max_new_tokens", ii, it.max_new_tokens, "outside the response");
    if (!s_.plan_reported[i] && it.start_token != r.tokens) fail("plan.start_token", ii, it.start_token, "must equal the committed tokens");
  }
  for (std::size_t i = 0; i < s_.responses.size(); ++i)
    if (s_.responses[i].plan_index >= 0 && s_.groups[i / G].status == group_status::free)
      fail("responses.plan_index", static_cast<std::int64_t>(i), s_.responses[i].plan_index, "free slot cannot be planned");
  const auto& k = s_.counters;
  if (k.generated_tokens != k.released_tokens + live_tokens + k.dropped_tokens || k.released_tokens < 0 || k.dropped_tokens < 0)
    fail("counters.generated_tokens", -1, k.generated_tokens, "token conservation violated (generated != released + live + dropped)");
  if (k.admitted_groups != s_.next_group_id || k.offered_groups != s_.offered_end || k.released_groups != k.admitted_groups - live_groups ||
      k.released_responses != k.released_groups * c.group_size)
    fail("counters.admitted_groups", -1, k.admitted_groups, "group counters inconsistent with the state");
}

ULORL_NAMESPACE_END
