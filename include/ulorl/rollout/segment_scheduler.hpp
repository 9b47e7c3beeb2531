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
// Limits (segment_scheduler_limits, docs/segment_rollout.md §3): every configuration value and
// counter has a documented bound, checked by the constructor, by restore and by each call that grows
// a counter, so that no sum or product the scheduler forms can overflow.
// Strong guarantee: a transition either completes or, when an allocation fails (std::bad_alloc) or
// a check rejects it (ulorl::error), leaves the state exactly as it was. Each transition first
// gives every container it will grow the room it needs, and only then changes anything.
//
// Cost: plan() is O(live groups * G), report() O(1) (a flat hash of live group ids), end_step()
// O(planned items), take_experience() O(released responses + their spans). Containers grow with
// use (a budget is a bound, never a reservation); in steady state nothing allocates: slots, span
// vectors and output buffers are recycled.
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

//! Limits on every configuration value and counter (docs/segment_rollout.md §3, "Limits"). With
//! them no arithmetic of the scheduler can overflow: token counts and cumulative counters stay at or
//! below 2^62, response ids (group id * G + k) below 2^42 * 2^20 = 2^62, and slot and plan indices
//! fit in 32 bits.
struct segment_scheduler_limits {
  static constexpr std::int32_t max_group_size = 1 << 20;                  //!< G
  static constexpr std::int64_t max_response_tokens = std::int64_t{1} << 40;  //!< L_max
  //! Response slots: admitted, unreleased responses (finished ones waiting for their group
  //! included). Bounds max_active_responses, the open plan, and admission when no budget is set.
  static constexpr std::int64_t max_live_responses = std::numeric_limits<std::int32_t>::max();
  //! Prompts (groups) offered over the scheduler's whole life (offer_prompts in total).
  static constexpr std::int64_t max_offered_groups = std::int64_t{1} << 42;
  //! step, policy versions, max_decode_tokens, max_staleness, and every cumulative counter
  //! (tokens, items, responses).
  static constexpr std::int64_t max_count = std::int64_t{1} << 62;
  //! A response's `failures` and `decode_steps` count up to here and then stay (saturate).
  static constexpr std::int32_t max_response_count = std::numeric_limits<std::int32_t>::max();
};

//! Scheduler parameters. Defaults follow the UloRL 64k setting with 4 segments. The bounds are
//! segment_scheduler_limits'; a value outside them is rejected (ulorl::error naming the field).
struct segment_scheduler_config {
  std::int32_t group_size = 8;                 //!< G responses per prompt, in [1, 2^20]
  std::int64_t max_response_tokens = 65536;    //!< L_max, in [1, 2^40]
  std::int32_t num_segments = 4;               //!< n_seg in [1, L_max]; L_seg = ceil(L_max / n_seg)
  //! Admitted, unfinished responses: 0 (no budget; admission still stops at 2^31 - 1 response
  //! slots) or in [G, 2^31 - 1]. A bound, not a reservation: memory grows with use.
  std::int64_t max_active_responses = 1024;
  //! Planned new tokens per step: 0 (no budget, i.e. 2^62) or in [G * L_seg, 2^62].
  std::int64_t max_decode_tokens = 0;
  std::int64_t max_new_groups_per_step = 0;    //!< admissions per step: 0 (unbounded) or <= 2^42
  release_order order = release_order::completion;
  std::int64_t release_batch_groups = 0;       //!< groups per released batch (0 = all ready), <= 2^42
  std::int64_t max_staleness = -1;             //!< versions: -1 = no bound, else in [0, 2^62]
  staleness_action on_stale = staleness_action::recompute;

  //! L_seg, the tokens of one segment (ceil(L_max / n_seg), written so that it cannot overflow).
  [[nodiscard]] constexpr std::int64_t segment_tokens() const noexcept {
    return num_segments > 0 ? max_response_tokens / num_segments + (max_response_tokens % num_segments > 0 ? 1 : 0) : 0;
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
  std::int32_t failures = 0;        //!< failed or aborted decode items (saturates at 2^31 - 1)
  std::int32_t decode_steps = 0;    //!< plan items that committed at least one token (saturates)
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
  std::int32_t failures = 0;        //!< saturates at segment_scheduler_limits::max_response_count
  std::int32_t decode_steps = 0;    //!< saturates likewise
  std::int32_t plan_index = -1;     //!< index in the open plan, -1 when not planned
  std::vector<version_span> spans;  //!< capacity reused when the slot is recycled
  friend bool operator==(const response_record&, const response_record&) = default;
};

//! The whole checkpointable state. Everything else in the scheduler is derived from it. The
//! checkpoint writes and reads it through the field tables in rollout/checkpoint.hpp (one for this
//! struct and one for each record it holds): a new member goes in its table too.
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
  //! The open step's items, in increasing response id; an item whose group was released during
  //! the step (take_experience while planned) stays, reported, naming a response no longer live.
  std::vector<plan_item> plan;
  std::vector<std::uint8_t> plan_reported;
  step_summary current{};
  scheduler_counters counters{};
  friend bool operator==(const segment_scheduler_state&, const segment_scheduler_state&) = default;
};

namespace detail {

inline void validate_scheduler_config(std::string_view fn, const segment_scheduler_config& c) {
  using lim = segment_scheduler_limits;
  if (c.group_size < 1 || c.group_size > lim::max_group_size)
    fail_value(fn, "config.group_size", c.group_size, "must be in [1, 2^20]");
  if (c.max_response_tokens < 1 || c.max_response_tokens > lim::max_response_tokens)
    fail_value(fn, "config.max_response_tokens", c.max_response_tokens, "must be in [1, 2^40]");
  if (c.num_segments < 1) fail_value(fn, "config.num_segments", c.num_segments, "must be >= 1");
  if (c.num_segments > c.max_response_tokens)
    fail_value(fn, "config.num_segments", c.num_segments, "must not exceed max_response_tokens");
  if (c.max_active_responses < 0 || c.max_active_responses > lim::max_live_responses)
    fail_value(fn, "config.max_active_responses", c.max_active_responses, "must be in [0, 2^31 - 1] (0 = no budget)");
  if (c.max_active_responses > 0 && c.max_active_responses < c.group_size)
    fail_value(fn, "config.max_active_responses", c.max_active_responses,
               "must hold at least one whole group (>= group_size), or be 0 (unbounded)");
  if (c.max_decode_tokens < 0 || c.max_decode_tokens > lim::max_count)
    fail_value(fn, "config.max_decode_tokens", c.max_decode_tokens, "must be in [0, 2^62] (0 = no budget)");
  // segment_tokens() <= 2^40 and group_size <= 2^20: the product is below 2^61.
  if (c.max_decode_tokens > 0 && c.max_decode_tokens < c.segment_tokens() * c.group_size)
    fail_value(fn, "config.max_decode_tokens", c.max_decode_tokens,
               "must fit one whole group's segment (>= group_size * segment_tokens()), or be 0 (unbounded)");
  if (c.max_new_groups_per_step < 0 || c.max_new_groups_per_step > lim::max_offered_groups)
    fail_value(fn, "config.max_new_groups_per_step", c.max_new_groups_per_step, "must be in [0, 2^42] (0 = unbounded)");
  require_known(fn, "config.order", c.order, release_order::completion, release_order::admission);
  if (c.release_batch_groups < 0 || c.release_batch_groups > lim::max_offered_groups)
    fail_value(fn, "config.release_batch_groups", c.release_batch_groups, "must be in [0, 2^42]");
  if (c.max_staleness < -1 || c.max_staleness > lim::max_count)
    fail_value(fn, "config.max_staleness", c.max_staleness, "must be -1 (none) or in [0, 2^62]");
  require_known(fn, "config.on_stale", c.on_stale, staleness_action::recompute, staleness_action::drop);
}

//! Gives `v` room for `n` elements, growing geometrically so that repeated calls stay amortised
//! O(1); the elements are untouched (a failed allocation leaves `v` as it was).
template <class T>
void reserve_room(std::vector<T>& v, std::size_t n) {
  if (n > v.capacity()) v.reserve(std::max(n, v.capacity() + v.capacity() / 2));
}

//! Adds one to a per-response counter that stays at its limit once it gets there.
inline void saturating_increment(std::int32_t& x) noexcept {
  if (x < segment_scheduler_limits::max_response_count) ++x;
}

//! Names the API call a restored state comes from, for the errors of its checks.
struct scheduler_restore {
  std::string_view function;
};

}  // namespace detail

//! The UloRL segment-rollout scheduler. See the header comment for the protocol.
class segment_scheduler {
  using limits = segment_scheduler_limits;

 public:
  explicit segment_scheduler(const segment_scheduler_config& config = {}) {
    detail::validate_scheduler_config("segment_scheduler", config);
    s_.config = config;
  }

  //! Rebuilds a scheduler from a saved state; every bound and invariant is checked (throws
  //! ulorl::error naming "segment_scheduler(state)").
  explicit segment_scheduler(segment_scheduler_state state) : s_(std::move(state)) {
    validate_state("segment_scheduler(state)");  // also builds the derived group index and plan slots
  }
  //! As segment_scheduler(state), with errors naming `from.function` (restore_scheduler's).
  segment_scheduler(segment_scheduler_state state, detail::scheduler_restore from) : s_(std::move(state)) {
    validate_state(from.function);
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
  //! At most 2^42 prompts are offered over the scheduler's life (segment_scheduler_limits).
  std::int64_t offer_prompts(std::int64_t n) {
    constexpr std::string_view fn = "segment_scheduler::offer_prompts";
    if (n < 0) detail::fail_value(fn, "n", n, "must be >= 0");
    if (n > limits::max_offered_groups - s_.offered_end)
      detail::fail_value(fn, "n", n,
                         "would offer more than 2^42 prompts in total (" + std::to_string(s_.offered_end) +
                             " offered so far)");
    const std::int64_t first = s_.offered_end;
    s_.offered_end += n;
    s_.counters.offered_groups += n;
    return first;
  }

  //! Opens a step: applies the staleness drop, gives every unfinished response its next segment
  //! (admission order), then admits whole new groups while the budgets allow.
  //!
  //! Built in two halves for the strong guarantee. The first writes the resumed items into the plan
  //! (empty while idle) and marks their responses decoding, after giving the plan room for one item
  //! per unfinished response; it then sizes the admissions and gives every container they grow its
  //! room. If anything there throws (std::bad_alloc, or ulorl::error at a counter limit), the marks
  //! are undone and the plan emptied: the scheduler is as it was. The second half (staleness drops,
  //! admissions, counters) cannot throw.
  [[nodiscard]] step_plan plan() {
    constexpr std::string_view fn = "segment_scheduler::plan";
    if (s_.phase != scheduler_phase::idle)
      detail::fail_value(fn, "phase", "planned", "a step is already open; call end_step() first");
    if (s_.step >= limits::max_count) detail::fail_value(fn, "step", s_.step, "the step counter is at its limit 2^62");
    const auto& c = s_.config;
    const std::int32_t G = c.group_size;
    const std::int64_t budget = c.max_decode_tokens > 0 ? c.max_decode_tokens : limits::max_count;
    const bool drop = c.on_stale == staleness_action::drop && c.max_staleness >= 0;
    ULORL_ASSERT(s_.plan.empty() && s_.plan_reported.empty());
    plan_slot_.clear();
    drops_.clear();
    step_plan out;
    out.step = s_.step;
    out.policy_version = s_.policy_version;
    std::int64_t planned = 0;
    std::int64_t new_groups = 0;
    bool blocked = false;
    try {
      // Resumed items: at most one per unfinished response.
      const auto active = static_cast<std::size_t>(s_.active_responses);
      reserve_items(active);
      if (drop) detail::reserve_room(drops_, active);
      for (const std::int32_t g : s_.live_order) {
        const auto& gr = s_.groups[static_cast<std::size_t>(g)];
        if (gr.status != group_status::live) continue;  // complete, or released (free slots linger)
        for (std::int32_t k = 0; k < G; ++k) {
          const auto slot = slot_of(g, k);
          auto& r = s_.responses[slot];
          if (r.state != response_state::paused) continue;
          std::int64_t start = r.tokens;
          if (drop && r.tokens > 0 && s_.policy_version - r.spans.front().version > c.max_staleness) {
            drops_.push_back(slot);  // applied at commit: its tokens are discarded, decoding restarts at 0
            start = 0;
          }
          if (blocked) continue;
          const std::int64_t quota = quota_of(start);
          if (quota > budget - planned) {
            blocked = true;  // head-of-line: nothing later may overtake an older response
            continue;
          }
          r.state = response_state::decoding;  // undone below if the plan cannot be completed
          r.plan_index = static_cast<std::int32_t>(s_.plan.size());
          append_item(gr.group_id, g, k, start, quota);
          planned += quota;
          if (start > 0) ++out.resumed_items;
        }
      }
      // Admissions: as many whole groups as the queue, every budget and the slot limit allow (each
      // bound is a quotient, so nothing here can overflow).
      if (!blocked) {
        const std::int64_t group_quota = quota_of(0) * G;  // <= 2^40 * 2^20
        new_groups = std::min(s_.offered_end - s_.next_group_id, limits::max_live_responses / G - live_groups());
        if (c.max_active_responses > 0)
          new_groups = std::min(new_groups, std::max<std::int64_t>(0, c.max_active_responses - s_.active_responses) / G);
        if (c.max_new_groups_per_step > 0) new_groups = std::min(new_groups, c.max_new_groups_per_step);
        new_groups = std::min(new_groups, (budget - planned) / group_quota);
        planned += new_groups * group_quota;  // <= budget
      }
      const auto items = s_.plan.size() + static_cast<std::size_t>(new_groups) * static_cast<std::size_t>(G);
      if (s_.counters.planned_items > limits::max_count - static_cast<std::int64_t>(items))
        detail::fail_value(fn, "counters.planned_items", s_.counters.planned_items,
                           "this step's items would take it past its limit 2^62");
      if (new_groups > 0) {
        const auto n = static_cast<std::size_t>(new_groups);
        const auto fresh = n - std::min(n, s_.free_slots.size());
        reserve_items(items);
        detail::reserve_room(s_.groups, s_.groups.size() + fresh);
        detail::reserve_room(s_.responses, s_.responses.size() + fresh * static_cast<std::size_t>(G));
        detail::reserve_room(s_.live_order, s_.live_order.size() + n);
        index_.reserve(index_.size() + n);
      }
    } catch (...) {
      // Every response planned so far was paused and unplanned (it is idle): put them back.
      for (std::size_t i = 0; i < s_.plan.size(); ++i) {
        auto& r = s_.responses[slot_of(plan_slot_[i], s_.plan[i].index_in_group)];
        r.state = response_state::paused;
        r.plan_index = -1;
      }
      s_.plan.clear();
      s_.plan_reported.clear();
      plan_slot_.clear();
      drops_.clear();
      throw;
    }

    // Commit (nothing below allocates: every container has its room).
    std::size_t w = 0;  // released groups leave live_order (stable: admission order is kept)
    for (std::size_t i = 0; i < s_.live_order.size(); ++i) {
      const auto g = s_.live_order[i];
      if (s_.groups[static_cast<std::size_t>(g)].status != group_status::free) s_.live_order[w++] = g;
    }
    s_.live_order.resize(w);
    for (const auto slot : drops_) {
      auto& r = s_.responses[slot];
      s_.counters.dropped_tokens += r.tokens;
      s_.counters.stale_drops += 1;
      r.tokens = 0;
      r.spans.clear();
    }
    drops_.clear();
    out.first_new_group = s_.next_group_id;
    const std::int64_t first_quota = quota_of(0);
    for (std::int64_t n = 0; n < new_groups; ++n) {
      const std::int32_t g = admit_group();
      const std::int64_t gid = s_.groups[static_cast<std::size_t>(g)].group_id;
      for (std::int32_t k = 0; k < G; ++k) {
        auto& r = s_.responses[slot_of(g, k)];
        r.state = response_state::decoding;
        r.plan_index = static_cast<std::int32_t>(s_.plan.size());
        append_item(gid, g, k, 0, first_quota);
      }
    }
    out.new_groups = new_groups;
    report_hint_ = 0;
    s_.current = step_summary{};
    s_.current.step = s_.step;
    s_.current.items = static_cast<std::int64_t>(s_.plan.size());
    s_.counters.planned_items += s_.current.items;
    s_.phase = scheduler_phase::planned;
    out.items = s_.plan;
    out.planned_tokens = planned;
    return out;
  }

  //! The open step's items (empty when idle).
  [[nodiscard]] std::span<const plan_item> current_plan() const noexcept { return s_.plan; }

  //! Reports one item's result. Validated completely before any change: unknown or unplanned
  //! response, a second report, `new_tokens` outside [0, max_new_tokens], `segment_end` with
  //! fewer tokens than planned, or tokens that would take counters.generated_tokens past 2^62 are
  //! rejected.
  void report(std::int64_t response_id, std::int64_t new_tokens, decode_outcome outcome) {
    report_item("segment_scheduler::report", response_id, new_tokens, outcome);
  }

  //! Same as report(response_id, 0, decode_outcome::failed): the item is re-queued unchanged.
  void abort(std::int64_t response_id) { report_item("segment_scheduler::abort", response_id, 0, decode_outcome::failed); }

  //! Closes the step. Items never reported count as aborted (engine crash): they go back to the
  //! unfinished pool with their committed tokens.
  step_summary end_step() {
    if (s_.phase != scheduler_phase::planned)
      detail::fail_value("segment_scheduler::end_step", "phase", "idle", "no step is open; call plan() first");
    for (std::size_t i = 0; i < s_.plan.size(); ++i) {
      const std::int32_t g = plan_slot_[i];
      if (g < 0) continue;  // reported, and its group was released during the step
      auto& r = s_.responses[slot_of(g, s_.plan[i].index_in_group)];
      if (!s_.plan_reported[i]) {
        r.state = response_state::paused;
        detail::saturating_increment(r.failures);
        ++s_.current.aborted;
        ++s_.counters.aborted_items;
      }
      r.plan_index = -1;
    }
    s_.plan.clear();
    s_.plan_reported.clear();
    plan_slot_.clear();
    s_.phase = scheduler_phase::idle;
    ++s_.step;  // plan() refuses to open step 2^62, so this stays <= 2^62
    return s_.current;
  }

  //! Declares that the trainer now holds policy `version` (strictly increasing, at most 2^62).
  //! Tokens already planned keep the version they were planned under.
  void update_policy(std::int64_t version) {
    constexpr std::string_view fn = "segment_scheduler::update_policy";
    if (version <= s_.policy_version)
      detail::fail_value(fn, "version", version,
                         "policy versions must strictly increase (current is " + std::to_string(s_.policy_version) + ")");
    if (version > limits::max_count) detail::fail_value(fn, "version", version, "must be <= 2^62");
    s_.policy_version = version;
  }

  //! Changes the segment count (an adaptive policy, segment_autotune.hpp) for the plans that follow:
  //! L_seg becomes ceil(L_max / n). Between steps only (not while a plan is open). Committed tokens
  //! stay; a paused response's next quota runs to the next multiple of the new L_seg (or L_max). The
  //! configuration, with the new count, is part of the saved state. On error nothing changes.
  void set_num_segments(std::int32_t n) {
    constexpr std::string_view fn = "segment_scheduler::set_num_segments";
    if (s_.phase != scheduler_phase::idle) detail::fail_value(fn, "n", n, "a plan is open; call end_step() first");
    if (n < 1 || n > s_.config.max_response_tokens)
      detail::fail_value(fn, "n", n, "must be in [1, max_response_tokens = " + std::to_string(s_.config.max_response_tokens) + "]");
    auto c = s_.config;
    c.num_segments = n;
    detail::validate_scheduler_config(fn, c);
    s_.config.num_segments = n;
  }

  //! Releases whole completed groups: a batch of exactly `release_batch_groups` when that many are
  //! ready (nothing otherwise), or every ready group when it is 0. `allow_partial` releases a short
  //! final batch. The returned storage is reused by the next call. The groups to release are
  //! chosen and every container the release grows gets its room before anything changes, so a
  //! failed allocation releases nothing (the batch is then empty).
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
    const auto groups = static_cast<std::size_t>(n);
    const auto G = static_cast<std::size_t>(c.group_size);
    detail::reserve_room(release_slots_, groups);
    release_slots_.clear();
    if (c.order == release_order::completion) {
      release_slots_.insert(release_slots_.end(), s_.ready.begin() + static_cast<std::ptrdiff_t>(s_.ready_head),
                            s_.ready.begin() + static_cast<std::ptrdiff_t>(s_.ready_head + groups));
    } else {
      for (std::size_t i = 0; i < s_.live_order.size() && release_slots_.size() < groups; ++i) {
        const auto g = s_.live_order[i];
        if (s_.groups[static_cast<std::size_t>(g)].status != group_status::free) release_slots_.push_back(g);
      }
    }
    std::size_t spans = 0;
    for (const auto g : release_slots_)
      for (std::size_t k = 0; k < G; ++k) spans += s_.responses[static_cast<std::size_t>(g) * G + k].spans.size();
    detail::reserve_room(batch_.group_ids, groups);
    detail::reserve_room(batch_.responses, groups * G);
    detail::reserve_room(batch_.spans, spans);
    detail::reserve_room(s_.free_slots, s_.free_slots.size() + groups);

    for (const auto g : release_slots_) release_group(g);
    if (c.order == release_order::completion) {
      s_.ready_head += groups;
      if (s_.ready_head == s_.ready.size()) {
        s_.ready.clear();
        s_.ready_head = 0;
      } else if (s_.ready_head > 1024 && 2 * s_.ready_head > s_.ready.size()) {
        s_.ready.erase(s_.ready.begin(), s_.ready.begin() + static_cast<std::ptrdiff_t>(s_.ready_head));
        s_.ready_head = 0;
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
  // tokens / L_seg + 1 segments end at most L_seg past `tokens` <= 2^40: no overflow.
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
  [[nodiscard]] std::int32_t planned_index(std::string_view fn, std::int64_t response_id) const {
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
    return idx;
  }
  // report() and abort(); `fn` names the one the host called.
  void report_item(std::string_view fn, std::int64_t response_id, std::int64_t new_tokens, decode_outcome outcome) {
    const std::int32_t idx = planned_index(fn, response_id);
    const std::int32_t g = plan_slot_[static_cast<std::size_t>(idx)];
    const plan_item& it = s_.plan[static_cast<std::size_t>(idx)];
    require_known(fn, "outcome", outcome, decode_outcome::segment_end, decode_outcome::eos, decode_outcome::failed);
    if (new_tokens < 0 || new_tokens > it.max_new_tokens)
      detail::fail_at(fn, "new_tokens", response_id, new_tokens, "must be in [0, max_new_tokens] of the plan item");
    if (outcome == decode_outcome::segment_end && new_tokens != it.max_new_tokens)
      detail::fail_at(fn, "new_tokens", response_id, new_tokens,
                      "segment_end must produce exactly max_new_tokens; report eos or failed otherwise");
    if (new_tokens > limits::max_count - s_.counters.generated_tokens)
      detail::fail_at(fn, "new_tokens", response_id, new_tokens,
                      "would take counters.generated_tokens past its limit 2^62");
    auto& r = s_.responses[slot_of(g, it.index_in_group)];
    const auto& gr = s_.groups[static_cast<std::size_t>(g)];
    // start_token == r.tokens and start_token + max_new_tokens <= L_max (plan invariants).
    const bool full = r.tokens + new_tokens >= s_.config.max_response_tokens;
    const bool done = outcome == decode_outcome::eos || full;
    // The two containers a report can grow get their room before anything changes.
    if (new_tokens > 0 && (r.spans.empty() || r.spans.back().version != it.policy_version))
      detail::reserve_room(r.spans, r.spans.size() + 1);
    if (done && gr.done + 1 == s_.config.group_size && s_.config.order == release_order::completion)
      detail::reserve_room(s_.ready, s_.ready.size() + 1);

    report_hint_ = static_cast<std::size_t>(idx) + 1;
    s_.plan_reported[static_cast<std::size_t>(idx)] = 1;
    commit(r, it, new_tokens);
    ++s_.current.reported;
    ++s_.counters.reported_items;
    s_.current.new_tokens += new_tokens;
    if (outcome == decode_outcome::failed) {
      detail::saturating_increment(r.failures);
      ++s_.current.failed;
      ++s_.counters.failed_items;
    }
    // Tokens committed before a failure are kept; a response they fill up is complete.
    if (outcome == decode_outcome::eos) finish(r, g, response_state::finished);
    else if (full) finish(r, g, response_state::truncated);
    else r.state = response_state::paused;
  }
  // Appends one item (the plan's containers have room: reserve_items ran).
  void append_item(std::int64_t gid, std::int32_t g, std::int32_t k, std::int64_t start, std::int64_t quota) {
    s_.plan.push_back(plan_item{gid * s_.config.group_size + k, gid, k, start, quota, s_.policy_version});
    s_.plan_reported.push_back(0);
    plan_slot_.push_back(g);
  }
  void reserve_items(std::size_t n) {
    detail::reserve_room(s_.plan, n);
    detail::reserve_room(s_.plan_reported, n);
    detail::reserve_room(plan_slot_, n);
  }
  // Takes a free slot or appends one (plan() gave groups, responses, live_order and the index room).
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
    for (std::int32_t k = 0; k < G; ++k) {
      auto& r = s_.responses[slot_of(g, k)];
      r.state = response_state::paused;
      r.tokens = 0;
      r.finish_step = -1;
      r.failures = 0;
      r.decode_steps = 0;
      r.plan_index = -1;
      r.spans.clear();  // keeps its capacity: a recycled slot's spans do not allocate again
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
    detail::saturating_increment(r.decode_steps);
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
  // Moves a complete group into the batch and frees its slot (take_experience gave every container
  // room). Responses reported in the open step leave the plan's bookkeeping: their items stay in
  // the plan, reported, and end_step() skips them.
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
      if (r.plan_index >= 0) {
        plan_slot_[static_cast<std::size_t>(r.plan_index)] = -1;
        r.plan_index = -1;
      }
    }
    s_.counters.released_responses += s_.config.group_size;
    ++s_.counters.released_groups;
    index_.erase(gr.group_id);
    gr.status = group_status::free;
    s_.free_slots.push_back(g);
  }
  void validate_state(std::string_view fn);

  segment_scheduler_state s_;
  detail::flat_int_map<std::int64_t, std::int32_t> index_;  // live group id -> slot (derived data)
  std::vector<std::int32_t> plan_slot_;  // group slot of each plan item, -1 once released (derived)
  std::size_t report_hint_ = 0;          // plan index after the last report
  std::vector<std::size_t> drops_;       // plan(): response slots the staleness drop restarts
  std::vector<std::int32_t> release_slots_;  // take_experience(): the group slots it releases
  experience_batch batch_;
};

// Restoring is the trust boundary of a checkpoint: every field is bounds-checked and checked against
// every other, with no arithmetic that can overflow on any input, so that a corrupted (but
// well-formed) state can neither produce a scheduler that violates its invariants nor make a later
// call overflow. The checks follow docs/segment_rollout.md §3 (invariants and limits).
inline void segment_scheduler::validate_state(std::string_view fn) {
  using lim = segment_scheduler_limits;
  const auto& c = s_.config;
  detail::validate_scheduler_config(fn, c);
  const std::int32_t G = c.group_size;
  const auto Gz = static_cast<std::size_t>(G);
  const std::int64_t L = c.max_response_tokens;
  const auto fail = [&](std::string_view arg, std::int64_t index, std::int64_t value, std::string_view what) {
    detail::fail_at(fn, arg, index, value, what);
  };
  const auto count_in = [&](std::string_view arg, std::int64_t v, std::int64_t hi) {
    if (v < 0 || v > hi) fail(arg, -1, v, "outside [0, " + std::to_string(hi) + "]");
  };
  require_known(fn, "phase", s_.phase, scheduler_phase::idle, scheduler_phase::planned);
  const bool planned = s_.phase == scheduler_phase::planned;
  count_in("step", s_.step, lim::max_count);
  if (planned && s_.step == lim::max_count) fail("step", -1, s_.step, "an open step must end below the limit 2^62");
  count_in("policy_version", s_.policy_version, lim::max_count);
  count_in("offered_end", s_.offered_end, lim::max_offered_groups);
  if (s_.next_group_id < 0 || s_.next_group_id > s_.offered_end)
    fail("next_group_id", -1, s_.next_group_id, "must be in [0, offered_end]");
  count_in("active_responses", s_.active_responses, lim::max_live_responses);
  if (s_.groups.size() > static_cast<std::size_t>(lim::max_live_responses / G))
    fail("groups", -1, static_cast<std::int64_t>(s_.groups.size()), "more response slots than 2^31 - 1");
  if (s_.responses.size() != s_.groups.size() * Gz)
    fail("responses", -1, static_cast<std::int64_t>(s_.responses.size()), "must hold group_size entries per group slot");
  if (s_.plan.size() > s_.responses.size())
    fail("plan", -1, static_cast<std::int64_t>(s_.plan.size()), "more items than response slots");
  if (s_.plan.size() != s_.plan_reported.size())
    fail("plan_reported", -1, static_cast<std::int64_t>(s_.plan_reported.size()), "must match plan");
  if (!planned && !s_.plan.empty()) fail("plan", -1, static_cast<std::int64_t>(s_.plan.size()), "must be empty when idle");

  // Slots. Live tokens are summed with a bound check: up to 2^31 responses of 2^40 tokens each.
  std::int64_t active = 0, live_tokens = 0, live_groups = 0, live_done = 0, free_count = 0, complete = 0;
  for (std::size_t g = 0; g < s_.groups.size(); ++g) {
    const auto& gr = s_.groups[g];
    const auto gi = static_cast<std::int64_t>(g);
    require_known_at(fn, "groups.status", gi, gr.status, group_status::free, group_status::live, group_status::complete);
    const bool is_free = gr.status == group_status::free;
    if (gr.group_id < 0 || gr.group_id >= s_.next_group_id) fail("groups.group_id", gi, gr.group_id, "not an admitted group id");
    if (gr.admitted_step < 0 || gr.admitted_step > s_.step) fail("groups.admitted_step", gi, gr.admitted_step, "outside [0, step]");
    if (gr.done < 0 || gr.done > G) fail("groups.done", gi, gr.done, "outside [0, group_size]");
    // A free slot holds the released group it last served: complete, all responses released.
    const bool is_complete = is_free || gr.status == group_status::complete;
    if (is_complete != (gr.completed_step >= 0) || gr.completed_step > s_.step ||
        (gr.completed_step >= 0 && gr.completed_step < gr.admitted_step))
      fail("groups.completed_step", gi, gr.completed_step, "inconsistent with status (in [admitted_step, step] iff complete)");
    std::int32_t done = 0;
    for (std::size_t k = 0; k < Gz; ++k) {
      const auto& r = s_.responses[g * Gz + k];
      const auto ri = static_cast<std::int64_t>(g * Gz + k);
      require_known_at(fn, "responses.state", ri, r.state, response_state::queued, response_state::decoding,
                       response_state::paused, response_state::finished, response_state::truncated,
                       response_state::released);
      bool unfinished = false;
      switch (r.state) {
        case response_state::finished:
        case response_state::truncated: ++done; break;
        case response_state::paused: unfinished = true; break;
        case response_state::decoding:
          unfinished = true;
          if (!planned) fail("responses.state", ri, static_cast<int>(r.state), "decoding while no step is open");
          break;
        case response_state::released:
        case response_state::queued: break;
      }
      const bool legal = is_free ? r.state == response_state::released
                                 : (unfinished || r.state == response_state::finished || r.state == response_state::truncated);
      if (!legal) fail("responses.state", ri, static_cast<int>(r.state), is_free ? "a free slot holds released responses" : "invalid state for a live group");
      if (r.tokens < 0 || r.tokens > L) fail("responses.tokens", ri, r.tokens, "outside [0, max_response_tokens]");
      if (r.state == response_state::truncated && r.tokens != L) fail("responses.tokens", ri, r.tokens, "truncated response must hold max_response_tokens");
      if (unfinished && r.tokens == L) fail("responses.tokens", ri, r.tokens, "an unfinished response cannot hold max_response_tokens");
      if (r.failures < 0) fail("responses.failures", ri, r.failures, "must be >= 0");
      // Saturated at its limit, decode_steps may be below the span count; otherwise each span needs one.
      if (r.decode_steps < 0 || (r.decode_steps < lim::max_response_count && static_cast<std::size_t>(r.decode_steps) < r.spans.size()))
        fail("responses.decode_steps", ri, r.decode_steps, "counters inconsistent with spans");
      detail::validate_version_spans(fn, r.spans, s_.policy_version);
      if (span_tokens(r.spans) != r.tokens) fail("responses.spans", ri, span_tokens(r.spans), "spans must cover exactly the committed tokens");
      for (std::size_t j = 1; j < r.spans.size(); ++j)
        if (r.spans[j].version == r.spans[j - 1].version) fail("responses.spans", ri, r.spans[j].version, "adjacent spans of one version must be merged");
      const bool has_finished = r.state == response_state::finished || r.state == response_state::truncated ||
                                r.state == response_state::released;
      if (has_finished != (r.finish_step >= 0) || r.finish_step > s_.step || (r.finish_step >= 0 && r.finish_step < gr.admitted_step))
        fail("responses.finish_step", ri, r.finish_step, "inconsistent with state (in [admitted_step, step] iff finished)");
      if (r.plan_index < -1) fail("responses.plan_index", ri, r.plan_index, "must be -1 or a plan index");
      if (r.state == response_state::decoding && r.plan_index < 0) fail("responses.plan_index", ri, r.plan_index, "decoding response without a plan item");
      if (r.plan_index >= 0) {
        if (is_free || static_cast<std::size_t>(r.plan_index) >= s_.plan.size())
          fail("responses.plan_index", ri, r.plan_index, "no such plan item");
        const auto& it = s_.plan[static_cast<std::size_t>(r.plan_index)];
        if (it.group_id != gr.group_id || it.index_in_group != static_cast<std::int32_t>(k))
          fail("responses.plan_index", ri, r.plan_index, "plan item belongs to another response");
      }
      if (!is_free) {
        if (r.tokens > lim::max_count - live_tokens) fail("responses.tokens", ri, r.tokens, "live tokens exceed 2^62");
        live_tokens += r.tokens;
        active += unfinished;
      }
    }
    if (is_free) {
      ++free_count;
      if (gr.done != G) fail("groups.done", gi, gr.done, "a free slot's released group was complete");
      continue;
    }
    ++live_groups;
    live_done += done;
    complete += gr.status == group_status::complete;
    if (done != gr.done) fail("groups.done", gi, gr.done, "does not match the finished/truncated responses");
    if ((gr.status == group_status::complete) != (done == G)) fail("groups.status", gi, static_cast<int>(gr.status), "complete iff all responses are done");
  }
  if (active != s_.active_responses) fail("active_responses", -1, s_.active_responses, "does not match the unfinished responses");

  // The group index; a live id twice would make it ambiguous.
  index_.clear();
  index_.reserve(static_cast<std::size_t>(live_groups));
  for (std::size_t g = 0; g < s_.groups.size(); ++g)
    if (s_.groups[g].status != group_status::free && !index_.try_emplace(s_.groups[g].group_id, static_cast<std::int32_t>(g)).second)
      fail("groups.group_id", static_cast<std::int64_t>(g), s_.groups[g].group_id, "duplicate live group id");

  std::vector<std::uint8_t> seen(s_.groups.size(), 0);
  for (std::size_t i = 0; i < s_.free_slots.size(); ++i) {
    const auto g = s_.free_slots[i];
    if (g < 0 || static_cast<std::size_t>(g) >= s_.groups.size() || s_.groups[static_cast<std::size_t>(g)].status != group_status::free || seen[static_cast<std::size_t>(g)])
      fail("free_slots", static_cast<std::int64_t>(i), g, "must list each free slot once");
    seen[static_cast<std::size_t>(g)] = 1;
  }
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
  for (std::size_t i = 0; i < s_.ready_head; ++i)  // released entries not yet compacted away
    if (s_.ready[i] < 0 || static_cast<std::size_t>(s_.ready[i]) >= s_.groups.size())
      fail("ready", static_cast<std::int64_t>(i), s_.ready[i], "not a slot");
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

  // Plan: increasing response ids (so each response once), one version, aligned quotas, and each
  // item consistent with its response; an item of a group released during the step is reported.
  plan_slot_.clear();
  plan_slot_.reserve(s_.plan.size());
  std::int64_t unreported = 0, prev_response = -1;
  for (std::size_t i = 0; i < s_.plan.size(); ++i) {
    const auto& it = s_.plan[i];
    const auto ii = static_cast<std::int64_t>(i);
    const bool reported = s_.plan_reported[i] != 0;
    if (s_.plan_reported[i] > 1) fail("plan_reported", ii, s_.plan_reported[i], "must be 0 or 1");
    if (it.group_id < 0 || it.group_id >= s_.next_group_id) fail("plan.group_id", ii, it.group_id, "not an admitted group id");
    if (it.index_in_group < 0 || it.index_in_group >= G) fail("plan.index_in_group", ii, it.index_in_group, "outside [0, group_size)");
    if (it.response_id != it.group_id * G + it.index_in_group) fail("plan.response_id", ii, it.response_id, "must be group_id * group_size + index_in_group");
    if (it.response_id <= prev_response) fail("plan.response_id", ii, it.response_id, "plan items must be in increasing response id");
    prev_response = it.response_id;
    if (it.policy_version < 0 || it.policy_version > s_.policy_version || it.policy_version != s_.plan.front().policy_version)
      fail("plan.policy_version", ii, it.policy_version, "every item carries the version current at plan(), <= policy_version");
    if (it.start_token < 0 || it.start_token >= L) fail("plan.start_token", ii, it.start_token, "outside [0, max_response_tokens)");
    if (it.max_new_tokens != quota_of(it.start_token)) fail("plan.max_new_tokens", ii, it.max_new_tokens, "must run to the next segment boundary");
    const std::int32_t g = index_.value_or(it.group_id, -1);
    plan_slot_.push_back(g);
    unreported += !reported;
    if (g < 0) {
      if (!reported) fail("plan_reported", ii, 0, "an unreported item must name a live response");
      continue;
    }
    const auto& r = s_.responses[slot_of(g, it.index_in_group)];
    if (r.plan_index != static_cast<std::int32_t>(i)) fail("plan.response_id", ii, it.response_id, "response does not point back at this item");
    if (!reported && r.state != response_state::decoding) fail("plan_reported", ii, 0, "unreported item must be decoding");
    if (reported && r.state == response_state::decoding) fail("plan_reported", ii, 1, "reported item cannot still be decoding");
    if (!reported && it.start_token != r.tokens) fail("plan.start_token", ii, it.start_token, "must equal the committed tokens");
    if (reported && (r.tokens < it.start_token || r.tokens - it.start_token > it.max_new_tokens))
      fail("plan.start_token", ii, it.start_token, "the response holds other tokens than this item can have committed");
    if (!r.spans.empty() && r.spans.back().version > it.policy_version)
      fail("plan.policy_version", ii, it.policy_version, "older than tokens the response already holds");
  }

  // Step summary: the open step's (planned) or the last one's (idle).
  const auto& m = s_.current;
  for (const auto* v : {&m.step, &m.items, &m.reported, &m.failed, &m.aborted, &m.finished, &m.truncated, &m.new_tokens, &m.completed_groups})
    count_in("current", *v, lim::max_count);
  if (m.step > s_.step || (planned && m.step != s_.step)) fail("current.step", -1, m.step, "must be the open (or last) step");
  if (planned && (m.items != static_cast<std::int64_t>(s_.plan.size()) || m.reported != m.items - unreported || m.aborted != 0))
    fail("current.items", -1, m.items, "must count the open plan's items and reports");
  if (!planned && (m.reported > m.items || m.aborted != m.items - m.reported))
    fail("current.items", -1, m.items, "items must be reported + aborted once the step has ended");
  if (m.failed > m.reported || m.finished > m.reported || m.truncated > m.reported - m.finished || m.completed_groups > m.finished + m.truncated)
    fail("current.reported", -1, m.reported, "fewer reports than failures or finished responses");

  // Counters: each in [0, 2^62], related to the state by subtractions that cannot overflow.
  const auto& k = s_.counters;
  for (const auto* v : {&k.offered_groups, &k.admitted_groups, &k.released_groups, &k.released_responses, &k.finished_responses,
                        &k.truncated_responses, &k.planned_items, &k.reported_items, &k.failed_items, &k.aborted_items,
                        &k.stale_drops, &k.generated_tokens, &k.released_tokens, &k.dropped_tokens})
    count_in("counters", *v, lim::max_count);
  if (k.offered_groups != s_.offered_end) fail("counters.offered_groups", -1, k.offered_groups, "must equal offered_end");
  if (k.admitted_groups != s_.next_group_id) fail("counters.admitted_groups", -1, k.admitted_groups, "must equal next_group_id");
  if (k.released_groups != k.admitted_groups - live_groups) fail("counters.released_groups", -1, k.released_groups, "must be admitted - live groups");
  if (k.released_responses != k.released_groups * G) fail("counters.released_responses", -1, k.released_responses, "must be released_groups * group_size");
  if (k.truncated_responses > lim::max_count - k.finished_responses ||
      k.finished_responses + k.truncated_responses != k.released_responses + live_done)
    fail("counters.finished_responses", -1, k.finished_responses, "finished + truncated must be released + done live responses");
  if (k.reported_items > k.planned_items || k.aborted_items > k.planned_items - k.reported_items ||
      k.planned_items - k.reported_items - k.aborted_items != unreported)
    fail("counters.planned_items", -1, k.planned_items, "must be reported + aborted + the open plan's unreported items");
  if (k.failed_items > k.reported_items) fail("counters.failed_items", -1, k.failed_items, "failed items are reported items");
  if (k.released_tokens > k.generated_tokens || k.dropped_tokens > k.generated_tokens - k.released_tokens ||
      k.generated_tokens - k.released_tokens - k.dropped_tokens != live_tokens)
    fail("counters.generated_tokens", -1, k.generated_tokens, "token conservation violated (generated != released + live + dropped)");
  if (k.stale_drops > k.dropped_tokens) fail("counters.stale_drops", -1, k.stale_drops, "each drop discards at least one token");
  if (m.new_tokens > k.generated_tokens) fail("current.new_tokens", -1, m.new_tokens, "more than every token generated");
}

ULORL_NAMESPACE_END
