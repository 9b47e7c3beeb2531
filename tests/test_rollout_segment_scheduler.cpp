// Unit tests of ulorl/rollout/segment_scheduler.hpp: every transition of the response life cycle,
// the budgets, release policies, staleness actions, and every rejected call (which must leave the
// state untouched). The long randomized comparison with a naive model is in
// test_rollout_scheduler_property.cpp.
#include <cstdint>
#include <vector>

#include "catch.hpp"
#include "support/rejection.hpp"
#include "ulorl/rollout/segment_scheduler.hpp"

using ulorl::decode_outcome;
using ulorl::response_state;
using ulorl::segment_scheduler;
using ulorl::version_span;

namespace {

// Checks that `f` throws ulorl::error naming `arg`, and that the scheduler did not change.
template <class F>
void rejects(segment_scheduler& s, F&& f, const char* arg) {
  const auto before = s.state();
  try {
    f();
    FAIL("expected ulorl::error for " << arg);
  } catch (const ulorl::error& e) {
    CHECK(e.argument() == arg);
    CHECK(std::string(e.what()).find("ulorl::") == 0);
  }
  CHECK(s.state() == before);
}

}  // namespace

TEST_CASE("scheduler config validation", "[rollout][scheduler]") {
  using C = ulorl::segment_scheduler_config;
  CHECK_NOTHROW(segment_scheduler(C{}));
  CHECK(C{}.segment_tokens() == 16384);
  CHECK(C{.max_response_tokens = 10, .num_segments = 3}.segment_tokens() == 4);
  CHECK_THROWS_AS(segment_scheduler(C{.group_size = 0}), ulorl::error);
  CHECK_THROWS_AS(segment_scheduler(C{.max_response_tokens = 0}), ulorl::error);
  CHECK_THROWS_AS(segment_scheduler(C{.num_segments = 0}), ulorl::error);
  CHECK_THROWS_AS(segment_scheduler(C{.max_response_tokens = 3, .num_segments = 4}), ulorl::error);
  CHECK_THROWS_AS(segment_scheduler(C{.group_size = 8, .max_active_responses = 7}), ulorl::error);
  CHECK_THROWS_AS(segment_scheduler(C{.max_active_responses = -1}), ulorl::error);
  CHECK_THROWS_AS(segment_scheduler(C{.group_size = 2, .max_response_tokens = 10, .num_segments = 2, .max_decode_tokens = 9}), ulorl::error);
  CHECK_NOTHROW(segment_scheduler(C{.group_size = 2, .max_response_tokens = 10, .num_segments = 2, .max_decode_tokens = 10}));
  CHECK_THROWS_AS(segment_scheduler(C{.max_new_groups_per_step = -1}), ulorl::error);
  CHECK_THROWS_AS(segment_scheduler(C{.order = static_cast<ulorl::release_order>(7)}), ulorl::error);
  CHECK_THROWS_AS(segment_scheduler(C{.release_batch_groups = -1}), ulorl::error);
  CHECK_THROWS_AS(segment_scheduler(C{.max_staleness = -2}), ulorl::error);
  CHECK_THROWS_AS(segment_scheduler(C{.on_stale = static_cast<ulorl::staleness_action>(9)}), ulorl::error);
}

TEST_CASE("unknown release_order, staleness_action and decode_outcome are rejected naming them",
          "[rollout][scheduler][enum]") {
  using C = ulorl::segment_scheduler_config;
  REQUIRE_THROWS_WITH(segment_scheduler(C{.order = static_cast<ulorl::release_order>(7)}),
                      Catch::Equals("ulorl::segment_scheduler: argument 'config.order' = 7: unknown enum value "
                                    "(known: 0, 1)"));
  require_unknown_enum([] { (void)segment_scheduler(C{.order = static_cast<ulorl::release_order>(255)}); }, "segment_scheduler",
                       "config.order", 255);
  require_unknown_enum([] { (void)segment_scheduler(C{.on_stale = static_cast<ulorl::staleness_action>(9)}); },
                       "segment_scheduler", "config.on_stale", 9);
  // Also without a staleness bound, where on_stale is never read.
  require_unknown_enum([] { (void)segment_scheduler(C{.max_staleness = -1, .on_stale = static_cast<ulorl::staleness_action>(2)}); },
                       "segment_scheduler", "config.on_stale", 2);
  // An unknown outcome of a planned item: rejected, the scheduler unchanged.
  segment_scheduler s({.group_size = 2, .max_response_tokens = 10, .num_segments = 2});
  s.offer_prompts(1);
  (void)s.plan();
  const auto before = s.state();
  for (const int bad : {3, 9, 255}) {
    require_unknown_enum([&] { s.report(0, 5, static_cast<decode_outcome>(bad)); }, "segment_scheduler::report", "outcome",
                         bad);
    CHECK(s.state() == before);
  }
  s.report(0, 5, decode_outcome::segment_end);  // the item is still open
  CHECK(s.state_of(0) == response_state::paused);
}

TEST_CASE("life cycle: queued -> decoding -> paused -> finished | truncated -> released", "[rollout][scheduler]") {
  segment_scheduler s({.group_size = 2, .max_response_tokens = 10, .num_segments = 2, .max_active_responses = 2});
  CHECK(s.offer_prompts(2) == 0);
  CHECK(s.state_of(0) == response_state::queued);
  CHECK(s.state_of(3) == response_state::queued);

  auto p = s.plan();  // step 0: group 0 admitted; group 1 waits (budget of 2 active responses)
  CHECK(s.phase() == ulorl::scheduler_phase::planned);
  REQUIRE(p.items.size() == 2);
  CHECK(p.step == 0);
  CHECK(p.new_groups == 1);
  CHECK(p.first_new_group == 0);
  CHECK(p.planned_tokens == 10);
  CHECK(p.items[0] == ulorl::plan_item{0, 0, 0, 0, 5, 0});
  CHECK(p.items[1] == ulorl::plan_item{1, 0, 1, 0, 5, 0});
  CHECK(s.state_of(0) == response_state::decoding);
  CHECK(s.state_of(2) == response_state::queued);
  CHECK(s.active_responses() == 2);

  s.report(0, 3, decode_outcome::eos);
  CHECK(s.state_of(0) == response_state::finished);
  s.report(1, 5, decode_outcome::segment_end);
  CHECK(s.state_of(1) == response_state::paused);
  auto sum = s.end_step();
  CHECK(sum.items == 2);
  CHECK(sum.reported == 2);
  CHECK(sum.finished == 1);
  CHECK(sum.new_tokens == 8);
  CHECK(sum.completed_groups == 0);
  CHECK(s.step() == 1);
  CHECK(s.take_experience().group_ids.empty());  // the group barrier holds group 0 back
  CHECK(s.active_responses() == 1);

  s.update_policy(3);
  p = s.plan();  // step 1: response 1 continues from token 5 under version 3; group 1 still waits
  REQUIRE(p.items.size() == 1);
  CHECK(p.items[0] == ulorl::plan_item{1, 0, 1, 5, 5, 3});
  CHECK(p.resumed_items == 1);
  CHECK(p.new_groups == 0);
  s.update_policy(4);  // mid-step update: planned tokens keep version 3
  s.report(1, 5, decode_outcome::segment_end);
  CHECK(s.state_of(1) == response_state::truncated);
  sum = s.end_step();
  CHECK(sum.truncated == 1);
  CHECK(sum.completed_groups == 1);
  CHECK(s.ready_groups() == 1);

  const auto& b = s.take_experience();
  REQUIRE(b.group_ids == std::vector<std::int64_t>{0});
  REQUIRE(b.responses.size() == 2);
  CHECK(b.policy_version == 4);
  CHECK(b.responses[0].final_state == response_state::finished);
  CHECK(b.responses[0].tokens == 3);
  CHECK(b.responses[1].final_state == response_state::truncated);
  CHECK(b.responses[1].tokens == 10);
  CHECK(b.responses[1].decode_steps == 2);
  CHECK(b.responses[1].finish_step == 1);
  const auto sp1 = b.spans_of(b.responses[1]);
  REQUIRE(sp1.size() == 2);
  CHECK(sp1[0] == version_span{0, 5, 0});
  CHECK(sp1[1] == version_span{5, 10, 3});
  CHECK(b.staleness(b.responses[1]).versions_spanned == 3);
  CHECK(b.staleness(b.responses[1]).max_lag == 4);
  CHECK(b.age_steps(b.responses[1]) == 2);
  CHECK(s.state_of(0) == response_state::released);
  CHECK(s.state_of(1) == response_state::released);
  CHECK(s.counters().released_tokens == 13);
  CHECK(s.live_tokens() == 0);

  p = s.plan();  // step 2: the freed budget admits group 1 into the recycled slot
  CHECK(p.new_groups == 1);
  CHECK(p.first_new_group == 1);
  REQUIRE(p.items.size() == 2);
  CHECK(p.items[0].response_id == 2);
  CHECK(p.items[0].policy_version == 4);
}

TEST_CASE("set_num_segments: the next quotas follow the new L_seg, committed tokens stay", "[rollout][scheduler]") {
  segment_scheduler s({.group_size = 1, .max_response_tokens = 12, .num_segments = 3, .max_active_responses = 1});
  s.offer_prompts(2);
  auto p = s.plan();  // L_seg 4
  REQUIRE(p.items.size() == 1);
  CHECK(p.items[0].max_new_tokens == 4);
  rejects(s, [&] { s.set_num_segments(2); }, "n");  // a plan is open
  s.report(0, 4, decode_outcome::segment_end);
  (void)s.end_step();
  rejects(s, [&] { s.set_num_segments(0); }, "n");
  rejects(s, [&] { s.set_num_segments(13); }, "n");
  s.set_num_segments(2);  // L_seg 6: the paused response runs to token 6
  CHECK(s.config().num_segments == 2);
  CHECK(s.config().segment_tokens() == 6);
  p = s.plan();
  REQUIRE(p.items.size() == 1);
  CHECK(p.items[0] == ulorl::plan_item{0, 0, 0, 4, 2, 0});
  s.report(0, 2, decode_outcome::segment_end);
  (void)s.end_step();
  s.set_num_segments(1);  // one segment: the rest of L_max
  p = s.plan();
  REQUIRE(p.items.size() == 1);
  CHECK(p.items[0] == ulorl::plan_item{0, 0, 0, 6, 6, 0});
  s.report(0, 3, decode_outcome::eos);
  (void)s.end_step();
  REQUIRE(s.take_experience().responses.size() == 1);
  s.set_num_segments(12);  // L_seg 1 for the next response
  p = s.plan();
  REQUIRE(p.items.size() == 1);
  CHECK(p.items[0] == ulorl::plan_item{1, 1, 0, 0, 1, 0});
  // A token budget that holds one segment of the old L_seg but not of the new one refuses the change.
  segment_scheduler t({.group_size = 2, .max_response_tokens = 10, .num_segments = 2, .max_decode_tokens = 10});
  rejects(t, [&] { t.set_num_segments(1); }, "config.max_decode_tokens");
  CHECK(t.config().num_segments == 2);
}

TEST_CASE("failures and aborts keep committed tokens and re-queue the item", "[rollout][scheduler]") {
  segment_scheduler s({.group_size = 3, .max_response_tokens = 12, .num_segments = 3});
  s.offer_prompts(1);
  auto p = s.plan();
  REQUIRE(p.items.size() == 3);
  s.report(0, 2, decode_outcome::failed);  // engine crash after 2 tokens
  s.abort(1);                              // preempted before any token
  // response 2 never reported: end_step() aborts it
  const auto sum = s.end_step();
  CHECK(sum.failed == 2);
  CHECK(sum.aborted == 1);
  CHECK(s.state_of(0) == response_state::paused);
  CHECK(s.tokens_of(0) == 2);
  CHECK(s.state_of(2) == response_state::paused);
  p = s.plan();
  REQUIRE(p.items.size() == 3);
  // Segments stay aligned: the response at 2 tokens finishes its first segment (4 tokens) with 2.
  CHECK(p.items[0].start_token == 2);
  CHECK(p.items[0].max_new_tokens == 2);
  CHECK(p.items[1].max_new_tokens == 4);
  CHECK(p.resumed_items == 1);
  s.report(0, 2, decode_outcome::segment_end);
  s.report(1, 4, decode_outcome::failed);  // a failure that still delivered a whole segment
  s.report(2, 1, decode_outcome::eos);
  (void)s.end_step();
  CHECK(s.tokens_of(0) == 4);
  CHECK(s.tokens_of(1) == 4);
  CHECK(s.state_of(2) == response_state::finished);
  CHECK(s.counters().failed_items == 3);
  CHECK(s.counters().aborted_items == 1);
  CHECK(s.counters().generated_tokens == 9);

  // A failure whose committed tokens reach L_max completes the response (truncated).
  segment_scheduler t({.group_size = 1, .max_response_tokens = 4, .num_segments = 1});
  t.offer_prompts(1);
  (void)t.plan();
  t.report(0, 4, decode_outcome::failed);
  CHECK(t.state_of(0) == response_state::truncated);
  (void)t.end_step();
  CHECK(t.take_experience().responses.at(0).failures == 1);
}

TEST_CASE("rejected calls name the argument and change nothing", "[rollout][scheduler]") {
  segment_scheduler s({.group_size = 2, .max_response_tokens = 10, .num_segments = 2});
  rejects(s, [&] { s.report(0, 1, decode_outcome::eos); }, "response_id");  // no step open
  rejects(s, [&] { (void)s.end_step(); }, "phase");
  rejects(s, [&] { s.offer_prompts(-1); }, "n");
  rejects(s, [&] { (void)s.state_of(0); }, "response_id");  // never offered
  rejects(s, [&] { s.update_policy(0); }, "version");
  s.update_policy(2);
  rejects(s, [&] { s.update_policy(2); }, "version");
  rejects(s, [&] { s.update_policy(1); }, "version");
  s.offer_prompts(3);
  (void)s.plan();  // admits groups 0..2 (no active budget)
  rejects(s, [&] { (void)s.plan(); }, "phase");
  rejects(s, [&] { s.report(-1, 0, decode_outcome::failed); }, "response_id");
  rejects(s, [&] { s.report(6, 0, decode_outcome::failed); }, "response_id");  // never admitted
  rejects(s, [&] { s.report(0, 6, decode_outcome::eos); }, "new_tokens");      // beyond the quota
  rejects(s, [&] { s.report(0, -1, decode_outcome::eos); }, "new_tokens");
  rejects(s, [&] { s.report(0, 4, decode_outcome::segment_end); }, "new_tokens");  // short segment without EOS
  rejects(s, [&] { s.report(0, 1, static_cast<decode_outcome>(9)); }, "outcome");
  s.report(0, 5, decode_outcome::segment_end);
  rejects(s, [&] { s.report(0, 5, decode_outcome::segment_end); }, "response_id");  // duplicate
  rejects(s, [&] { s.abort(0); }, "response_id");                                  // duplicate
  for (std::int64_t id = 1; id < 6; ++id) s.report(id, 1, decode_outcome::eos);
  (void)s.end_step();
  const auto& b = s.take_experience();
  CHECK(b.group_ids.size() == 2);  // groups 1, 2 complete; group 0 waits for response 0
  (void)s.plan();
  rejects(s, [&] { s.report(2, 0, decode_outcome::eos); }, "response_id");  // released
  rejects(s, [&] { s.report(1, 0, decode_outcome::eos); }, "response_id");  // finished, not planned
  rejects(s, [&] { (void)s.spans_of(2); }, "response_id");
  CHECK(s.spans_of(0).size() == 1);
}

TEST_CASE("admission budgets: active responses, decode tokens, groups per step", "[rollout][scheduler]") {
  SECTION("active responses: unfinished responses hold the budget, finished ones free it") {
    segment_scheduler s({.group_size = 2, .max_response_tokens = 10, .num_segments = 2, .max_active_responses = 4});
    s.offer_prompts(5);
    auto p = s.plan();
    CHECK(p.new_groups == 2);
    s.report(0, 1, decode_outcome::eos);
    s.report(1, 1, decode_outcome::eos);
    s.report(2, 1, decode_outcome::eos);
    s.report(3, 5, decode_outcome::segment_end);
    (void)s.end_step();
    CHECK(s.active_responses() == 1);
    p = s.plan();  // 1 continuing + room for 1 more group (3 + 2 > 4 would not fit)
    CHECK(p.items.size() == 3);
    CHECK(p.items[0].response_id == 3);
    CHECK(p.new_groups == 1);
    CHECK(s.queued_groups() == 2);
  }
  SECTION("decode tokens: head-of-line, older responses first") {
    segment_scheduler s({.group_size = 2, .max_response_tokens = 10, .num_segments = 2, .max_decode_tokens = 14});
    s.offer_prompts(3);
    auto p = s.plan();
    CHECK(p.new_groups == 1);  // 10 tokens; a second group would need 20
    CHECK(p.planned_tokens == 10);
    s.report(0, 3, decode_outcome::failed);
    s.report(1, 5, decode_outcome::segment_end);
    (void)s.end_step();
    p = s.plan();  // response 0 needs 2, response 1 needs 5: 7 <= 14, then a group needs 10 > 7
    CHECK(p.items.size() == 2);
    CHECK(p.planned_tokens == 7);
    CHECK(p.new_groups == 0);
  }
  SECTION("new groups per step") {
    segment_scheduler s({.group_size = 1, .max_response_tokens = 4, .num_segments = 1, .max_new_groups_per_step = 2});
    s.offer_prompts(5);
    CHECK(s.plan().new_groups == 2);
  }
}

TEST_CASE("release order and batch size", "[rollout][scheduler]") {
  const auto drive = [](ulorl::release_order order, std::int64_t batch) {
    segment_scheduler s({.group_size = 1, .max_response_tokens = 4, .num_segments = 2, .order = order, .release_batch_groups = batch});
    s.offer_prompts(3);
    (void)s.plan();
    s.report(0, 2, decode_outcome::segment_end);  // group 0 needs another step
    s.report(1, 1, decode_outcome::eos);
    s.report(2, 1, decode_outcome::eos);
    (void)s.end_step();
    return s;
  };
  SECTION("completion order releases groups as they complete") {
    auto s = drive(ulorl::release_order::completion, 0);
    CHECK(s.ready_groups() == 2);
    CHECK(s.take_experience().group_ids == std::vector<std::int64_t>{1, 2});
  }
  SECTION("admission order waits for earlier prompts") {
    auto s = drive(ulorl::release_order::admission, 0);
    CHECK(s.ready_groups() == 0);
    CHECK(s.take_experience().group_ids.empty());
    (void)s.plan();
    s.report(0, 1, decode_outcome::eos);
    (void)s.end_step();
    CHECK(s.take_experience().group_ids == std::vector<std::int64_t>{0, 1, 2});
  }
  SECTION("batches of exactly release_batch_groups, or a partial one on request") {
    auto s = drive(ulorl::release_order::completion, 3);
    CHECK(s.take_experience().group_ids.empty());
    CHECK(s.take_experience(true).group_ids == std::vector<std::int64_t>{1, 2});
    auto t = drive(ulorl::release_order::completion, 1);
    CHECK(t.take_experience().group_ids == std::vector<std::int64_t>{1});
    CHECK(t.take_experience().group_ids == std::vector<std::int64_t>{2});
    CHECK(t.take_experience().group_ids.empty());
  }
}

TEST_CASE("staleness bound: drop restarts stale unfinished responses", "[rollout][scheduler]") {
  segment_scheduler s({.group_size = 1, .max_response_tokens = 9, .num_segments = 3, .max_staleness = 1,
                       .on_stale = ulorl::staleness_action::drop});
  s.offer_prompts(1);
  (void)s.plan();
  s.report(0, 3, decode_outcome::segment_end);
  (void)s.end_step();
  s.update_policy(1);  // lag 1: within the bound
  auto p = s.plan();
  CHECK(p.items[0].start_token == 3);
  s.report(0, 3, decode_outcome::segment_end);
  (void)s.end_step();
  s.update_policy(2);  // first token now lags by 2 > 1: decoded again from token 0 under version 2
  p = s.plan();
  CHECK(p.items[0].start_token == 0);
  CHECK(p.items[0].policy_version == 2);
  CHECK(s.counters().stale_drops == 1);
  CHECK(s.counters().dropped_tokens == 6);
  CHECK(s.tokens_of(0) == 0);
  CHECK(s.spans_of(0).empty());
  s.report(0, 2, decode_outcome::eos);
  (void)s.end_step();
  const auto& b = s.take_experience();
  CHECK(b.responses.at(0).tokens == 2);
  CHECK(b.spans_of(b.responses[0]).size() == 1);
  CHECK(s.counters().generated_tokens == 8);
}

TEST_CASE("synchronous rollout is the one-segment special case", "[rollout][scheduler]") {
  segment_scheduler s({.group_size = 4, .max_response_tokens = 100, .num_segments = 1, .max_active_responses = 8});
  s.offer_prompts(10);
  for (int step = 0; step < 5; ++step) {
    const auto p = s.plan();
    REQUIRE(p.items.size() == 8);
    CHECK(p.new_groups == 2);
    for (const auto& it : p.items) {
      CHECK(it.max_new_tokens == 100);
      CHECK(it.start_token == 0);
      s.report(it.response_id, it.response_id % 7 == 0 ? 100 : 1 + it.response_id % 50,
               it.response_id % 7 == 0 ? decode_outcome::segment_end : decode_outcome::eos);
    }
    (void)s.end_step();
    const auto& b = s.take_experience();
    CHECK(b.group_ids.size() == 2);
    for (const auto& r : b.responses) CHECK(r.first_version == r.last_version);
    s.update_policy(s.policy_version() + 1);
  }
  CHECK(s.counters().released_groups == 10);
  CHECK(s.live_groups() == 0);
}
