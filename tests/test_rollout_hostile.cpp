// Hostile tests of the segment scheduler (rollout/segment_scheduler.hpp, rollout/checkpoint.hpp):
// configurations at and beyond the documented limits (docs/segment_rollout.md §3, "Limits"),
// restored states with extreme but well-formed fields, call sequences the docs allow but the other
// tests do not make, and allocation failure inside every state transition.
//
// This executable replaces the global operator new (below) so that a test can make the k-th
// allocation from now throw std::bad_alloc, refuse allocations above a size, and count what a call
// allocates. Every allocation larger than 1 GiB fails here, as on a machine without that memory, so
// an oversized request shows up as std::bad_alloc instead of the sanitizer's out-of-memory abort.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "catch.hpp"
#include "ulorl/rollout/checkpoint.hpp"

namespace fault {

inline std::int64_t countdown = 0;             // > 0: the countdown-th allocation from now fails
inline std::size_t budget = 0;                 // > 0: allocations fail once this many bytes were taken
inline std::size_t taken = 0;                  // bytes allocated since arm()
inline std::int64_t calls = 0;                 // allocations since arm()
inline constexpr std::size_t largest = std::size_t{1} << 30;

inline bool fails(std::size_t n) noexcept {
  if (n > largest) return true;
  ++calls;
  taken += n;
  if (countdown > 0 && --countdown == 0) return true;
  return budget > 0 && taken > budget;
}
inline void arm(std::int64_t k, std::size_t bytes = 0) noexcept {
  calls = 0;
  taken = 0;
  countdown = k;
  budget = bytes;
}
inline void disarm() noexcept {
  countdown = 0;
  budget = 0;
}

inline void* allocate(std::size_t n, std::size_t align) {
  if (fails(n)) throw std::bad_alloc();
  void* p = nullptr;
  if (align <= alignof(std::max_align_t)) p = std::malloc(n ? n : 1);
  else if (posix_memalign(&p, align, n ? n : 1) != 0) p = nullptr;
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace fault

void* operator new(std::size_t n) { return fault::allocate(n, 0); }
void* operator new[](std::size_t n) { return fault::allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return fault::allocate(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return fault::allocate(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return fault::allocate(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return fault::allocate(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

using ulorl::decode_outcome;
using ulorl::segment_scheduler;
using ulorl::segment_scheduler_config;
using ulorl::segment_scheduler_state;

namespace {

constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
constexpr std::int32_t i32_max = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t pow2(int e) { return std::int64_t{1} << e; }

// Checks that `f` throws ulorl::error naming `function` and `argument`.
template <class F>
void rejects(F&& f, const std::string& function, const std::string& argument) {
  try {
    f();
    FAIL("accepted; expected ulorl::error from " << function << " naming " << argument);
  } catch (const ulorl::error& e) {
    CHECK(e.function() == function);
    CHECK(e.argument() == argument);
  }
}

// A state with live groups in several states and an open step (items reported and unreported).
segment_scheduler_state open_step_state() {
  segment_scheduler s({.group_size = 2, .max_response_tokens = 12, .num_segments = 3, .max_active_responses = 6});
  s.offer_prompts(4);
  auto p = s.plan();  // groups 0..2, 4 tokens each
  s.report(0, 4, decode_outcome::segment_end);
  s.report(1, 2, decode_outcome::eos);
  s.report(2, 1, decode_outcome::failed);
  s.report(3, 4, decode_outcome::segment_end);
  s.report(4, 3, decode_outcome::eos);
  s.report(5, 2, decode_outcome::eos);
  (void)s.end_step();
  s.update_policy(1);
  p = s.plan();  // 0 @4, 2 @1, 3 @4 resumed; group 3 admitted
  s.report(0, 4, decode_outcome::segment_end);
  return s.state();
}

}  // namespace

// ---- documented configuration limits: accepted at the limit, rejected one past it ----------------

TEST_CASE("every configuration value is accepted at its documented limit and rejected past it", "[rollout][hostile]") {
  using C = segment_scheduler_config;
  const auto at_limit = [](C c, const char* arg, auto past) {
    INFO(arg);
    CHECK_NOTHROW(segment_scheduler(c));
    past(c);
    rejects([&] { segment_scheduler s(c); }, "segment_scheduler", arg);
  };
  const C small{.group_size = 1, .max_response_tokens = 4, .num_segments = 1, .max_active_responses = 0};
  at_limit(C{.group_size = 1 << 20, .max_response_tokens = 4, .num_segments = 1, .max_active_responses = 0},
           "config.group_size", [](C& c) { c.group_size += 1; });
  at_limit(C{.group_size = 1, .max_response_tokens = pow2(40), .num_segments = 1}, "config.max_response_tokens",
           [](C& c) { c.max_response_tokens += 1; });
  at_limit(C{.group_size = 1, .max_response_tokens = 4, .num_segments = 4}, "config.num_segments",
           [](C& c) { c.num_segments += 1; });
  at_limit(C{.group_size = 1, .max_active_responses = i32_max}, "config.max_active_responses",
           [](C& c) { c.max_active_responses += 1; });
  C c = small;
  c.max_decode_tokens = pow2(62);
  at_limit(c, "config.max_decode_tokens", [](C& x) { x.max_decode_tokens += 1; });
  c = small;
  c.max_new_groups_per_step = pow2(42);
  at_limit(c, "config.max_new_groups_per_step", [](C& x) { x.max_new_groups_per_step += 1; });
  c = small;
  c.release_batch_groups = pow2(42);
  at_limit(c, "config.release_batch_groups", [](C& x) { x.release_batch_groups += 1; });
  c = small;
  c.max_staleness = pow2(62);
  at_limit(c, "config.max_staleness", [](C& x) { x.max_staleness += 1; });
  // ceil(L_max / n_seg) for the largest L_max, without overflow in the rounding.
  CHECK(C{.max_response_tokens = pow2(40), .num_segments = 3}.segment_tokens() == pow2(40) / 3 + 1);
  CHECK(C{.max_response_tokens = i64_max, .num_segments = 2}.segment_tokens() == i64_max / 2 + 1);
}

// ---- 1, 2: active-response budgets beyond the limit, and lazy allocation below it ----------------

TEST_CASE("max_active_responses = 2^62 is rejected instead of looping forever", "[rollout][hostile]") {
  for (const std::int32_t G : {1, 2, 8}) {
    INFO("group_size " << G);
    rejects([&] { segment_scheduler s({.group_size = G, .max_active_responses = pow2(62)}); },
            "segment_scheduler", "config.max_active_responses");
    auto st = open_step_state();
    st.config.max_active_responses = pow2(62);
    rejects([&] { segment_scheduler s(std::move(st)); }, "segment_scheduler(state)", "config.max_active_responses");
  }
}

TEST_CASE("large active budgets are rejected past the limit and never reserved up front", "[rollout][hostile]") {
  rejects([] { segment_scheduler s({.max_active_responses = pow2(40)}); }, "segment_scheduler",
          "config.max_active_responses");
  // The documented limit is 2^31 - 1 response slots; at the limit the constructor takes no more than
  // a small fixed amount of memory (the budget is a bound, not a reservation).
  for (const std::int64_t budget : {std::int64_t{1'000'000'000}, std::int64_t{i32_max} - 7}) {
    INFO("max_active_responses " << budget);
    fault::arm(0);
    try {
      segment_scheduler s({.group_size = 8, .max_active_responses = budget});
      fault::disarm();
      CHECK(fault::taken < (std::size_t{1} << 20));
      s.offer_prompts(3);
      CHECK(s.plan().items.size() == 24);  // grows with use
    } catch (const std::bad_alloc&) {
      fault::disarm();
      FAIL("the constructor reserved the whole budget");
    }
  }
}

// ---- 3: take_experience() while a step is open --------------------------------------------------

TEST_CASE("releasing a group mid-step leaves a checkpoint the scheduler restores", "[rollout][hostile]") {
  for (const auto order : {ulorl::release_order::completion, ulorl::release_order::admission}) {
    segment_scheduler s({.group_size = 2, .max_response_tokens = 8, .num_segments = 2, .order = order});
    s.offer_prompts(2);
    const auto p = s.plan();
    REQUIRE(p.items.size() == 4);
    s.report(0, 1, decode_outcome::eos);
    s.report(1, 2, decode_outcome::eos);
    // docs §2: take_experience may be called at any time, also while a step is open.
    const auto& b = s.take_experience();
    REQUIRE(b.group_ids == std::vector<std::int64_t>{0});
    const auto bytes = ulorl::save_scheduler(s);
    auto r = ulorl::restore_scheduler(bytes);
    CHECK(r.state() == s.state());
    CHECK(ulorl::save_scheduler(r) == bytes);
    // Released items stay reported; the rest of the step goes on in both.
    for (auto* x : {&s, &r}) {
      rejects([&] { x->report(0, 0, decode_outcome::failed); }, "segment_scheduler::report", "response_id");
      x->report(2, 4, decode_outcome::segment_end);
      x->report(3, 3, decode_outcome::eos);
      const auto sum = x->end_step();
      CHECK(sum.items == 4);
      CHECK(sum.reported == 4);
      CHECK(sum.finished == 3);
    }
    CHECK(r.state() == s.state());
    CHECK(ulorl::save_scheduler(r) == ulorl::save_scheduler(s));
    // Group 1 continues with response 2 from token 4 (segment 2 of 2).
    const auto q = s.plan();
    REQUIRE(q.items.size() == 1);
    CHECK(q.items[0] == ulorl::plan_item{2, 1, 0, 4, 4, 0});
  }
}

// ---- 4, 5: restored states with extreme fields ---------------------------------------------------

TEST_CASE("restore checks counters without overflowing", "[rollout][hostile]") {
  const auto good = open_step_state();
  REQUIRE_NOTHROW(segment_scheduler(good));
  const auto expect_reject = [&](auto mutate, const char* what) {
    auto st = good;
    mutate(st);
    INFO(what);
    CHECK_THROWS_AS(segment_scheduler(std::move(st)), ulorl::error);
  };
  expect_reject([](auto& st) { st.counters.released_tokens = i64_max; }, "released_tokens");
  expect_reject([](auto& st) { st.counters.dropped_tokens = i64_max; }, "dropped_tokens");
  expect_reject([](auto& st) { st.counters.generated_tokens = i64_max; st.counters.released_tokens = i64_max - 10; },
                "generated_tokens");
  expect_reject([](auto& st) { st.counters.released_groups = i64_max; }, "released_groups * G");
  expect_reject([](auto& st) { st.counters.released_groups = pow2(62); st.counters.admitted_groups = pow2(62); }, "released_groups");
  expect_reject([](auto& st) { st.plan.back().start_token = i64_max - 1; }, "start_token + max_new_tokens");
  expect_reject([](auto& st) { st.plan.back().max_new_tokens = i64_max; }, "max_new_tokens");
  expect_reject([](auto& st) { st.responses[0].tokens = i64_max; }, "tokens");
}

TEST_CASE("restore bounds the step and the offered prompts and every counter", "[rollout][hostile]") {
  const auto good = open_step_state();
  const auto expect_reject = [&](auto mutate, const char* what) {
    auto st = good;
    mutate(st);
    INFO(what);
    CHECK_THROWS_AS(segment_scheduler(std::move(st)), ulorl::error);
  };
  expect_reject([](auto& st) { st.step = i64_max; st.current.step = i64_max; }, "step");
  expect_reject([](auto& st) { st.offered_end = i64_max - 5; st.counters.offered_groups = i64_max - 5; }, "offered_end");
  expect_reject([](auto& st) { st.policy_version = i64_max; }, "policy_version");
  expect_reject([](auto& st) { st.counters.planned_items = i64_max; }, "planned_items");
  expect_reject([](auto& st) { st.counters.reported_items = i64_max; }, "reported_items");
  expect_reject([](auto& st) { st.current.reported = i64_max; }, "current.reported");
  expect_reject([](auto& st) { st.current.new_tokens = i64_max; }, "current.new_tokens");
  for (const std::int64_t bad : {std::int64_t{-1}, std::numeric_limits<std::int64_t>::min()}) {
    INFO("value " << bad);
    expect_reject([&](auto& st) { st.counters.planned_items = bad; }, "planned_items < 0");
    expect_reject([&](auto& st) { st.counters.reported_items = bad; }, "reported_items < 0");
    expect_reject([&](auto& st) { st.counters.finished_responses = bad; }, "finished_responses < 0");
    expect_reject([&](auto& st) { st.counters.failed_items = bad; }, "failed_items < 0");
    expect_reject([&](auto& st) { st.counters.aborted_items = bad; }, "aborted_items < 0");
    expect_reject([&](auto& st) { st.counters.stale_drops = bad; }, "stale_drops < 0");
    expect_reject([&](auto& st) { st.current.failed = bad; }, "current.failed < 0");
  }
  // A response that has failed 2^31 - 1 times is legal; its failure count stays there.
  auto st = good;
  std::size_t slot = 0;
  for (std::size_t i = 0; i < st.responses.size(); ++i)
    if (st.responses[i].state == ulorl::response_state::decoding) slot = i;
  REQUIRE(st.responses[slot].state == ulorl::response_state::decoding);
  st.responses[slot].failures = i32_max;
  const auto id = st.plan.at(static_cast<std::size_t>(st.responses[slot].plan_index)).response_id;
  segment_scheduler s(std::move(st));
  s.abort(id);
  CHECK(s.state().responses[slot].failures == i32_max);
  CHECK_NOTHROW(ulorl::restore_scheduler(ulorl::save_scheduler(s)));
}

TEST_CASE("a restored step at the step limit cannot be advanced past it", "[rollout][hostile]") {
  // step <= 2^62 (docs): a planned step 2^62 is rejected, an idle one cannot open a step.
  segment_scheduler t({.group_size = 1, .max_response_tokens = 4, .num_segments = 1});
  auto st = t.state();
  st.step = pow2(62);
  segment_scheduler s(st);
  s.offer_prompts(1);
  rejects([&] { (void)s.plan(); }, "segment_scheduler::plan", "step");
  st.step = pow2(62) + 1;
  CHECK_THROWS_AS(segment_scheduler(st), ulorl::error);
}

TEST_CASE("plan() refuses a step whose items would take planned_items past 2^62", "[rollout][hostile]") {
  segment_scheduler t({.group_size = 2, .max_response_tokens = 4, .num_segments = 1});
  auto st = t.state();
  st.counters.planned_items = pow2(62) - 1;  // all reported: planned = reported + aborted + open
  st.counters.reported_items = pow2(62) - 1;
  segment_scheduler s(std::move(st));
  s.offer_prompts(1);
  const auto before = ulorl::save_scheduler(s);
  rejects([&] { (void)s.plan(); }, "segment_scheduler::plan", "counters.planned_items");
  CHECK(ulorl::save_scheduler(s) == before);
  CHECK(s.phase() == ulorl::scheduler_phase::idle);
}

// ---- 6: the offered total -------------------------------------------------------------------------

TEST_CASE("offer_prompts bounds the total and not only each call", "[rollout][hostile]") {
  segment_scheduler s({.group_size = 1});
  // Limit: 2^42 offered prompts in total; 4 calls of 2^40 reach it exactly.
  std::int64_t accepted = 0;
  for (std::int64_t i = 0; i < pow2(23); ++i) {
    try {
      const auto first = s.offer_prompts(pow2(40));
      CHECK(first == i * pow2(40));
      ++accepted;
    } catch (const ulorl::error& e) {
      CHECK(e.function() == "segment_scheduler::offer_prompts");
      CHECK(e.argument() == "n");
      break;
    }
  }
  CHECK(accepted == 4);
  CHECK(s.queued_groups() == pow2(42));
  CHECK(s.offer_prompts(0) == pow2(42));
  rejects([&] { s.offer_prompts(1); }, "segment_scheduler::offer_prompts", "n");
  // The group id times G is a response id: with G = 2^20 the same limit keeps ids below 2^62.
  segment_scheduler big({.group_size = 1 << 20, .max_response_tokens = 4, .num_segments = 1, .max_active_responses = 0});
  CHECK(big.offer_prompts(pow2(42)) == 0);
  CHECK(big.state_of(pow2(62) - 1) == ulorl::response_state::queued);
}

TEST_CASE("update_policy and report stop at the documented counter limits", "[rollout][hostile]") {
  segment_scheduler s({.group_size = 1, .max_response_tokens = pow2(40), .num_segments = 1});
  s.update_policy(pow2(62));
  rejects([&] { s.update_policy(pow2(62) + 1); }, "segment_scheduler::update_policy", "version");
  // generated_tokens <= 2^62: a host that claims 2^40 tokens per report reaches it after 2^22 reports.
  auto st = s.state();
  st.counters.generated_tokens = pow2(62) - pow2(40) + 1;
  st.counters.dropped_tokens = st.counters.generated_tokens;
  segment_scheduler t(std::move(st));
  t.offer_prompts(1);
  (void)t.plan();
  const auto before = ulorl::save_scheduler(t);
  rejects([&] { t.report(0, pow2(40), decode_outcome::segment_end); }, "segment_scheduler::report", "new_tokens");
  CHECK(ulorl::save_scheduler(t) == before);
  t.report(0, pow2(40) - 1, decode_outcome::eos);
  CHECK(t.counters().generated_tokens == pow2(62));
}

// ---- 7: plan items older than the response's tokens ----------------------------------------------

TEST_CASE("restore rejects a plan item whose version is older than its response's spans", "[rollout][hostile]") {
  segment_scheduler s({.group_size = 1, .max_response_tokens = 6, .num_segments = 3});
  s.offer_prompts(1);
  (void)s.plan();
  s.report(0, 2, decode_outcome::segment_end);  // [0,2)@0
  (void)s.end_step();
  s.update_policy(1);
  (void)s.plan();
  s.report(0, 2, decode_outcome::segment_end);  // [2,4)@1
  (void)s.end_step();
  (void)s.plan();  // item: start 4, version 1, unreported
  auto st = s.state();
  REQUIRE(st.plan.size() == 1);
  CHECK_NOTHROW(segment_scheduler(st));
  st.plan[0].policy_version = 0;
  CHECK_THROWS_AS(segment_scheduler(st), ulorl::error);
}

// ---- 8: allocation failure in the middle of admission ---------------------------------------------

TEST_CASE("allocation failure in plan() leaves the scheduler as it was", "[rollout][hostile]") {
  segment_scheduler s({.group_size = 8, .max_response_tokens = 65536, .num_segments = 4, .max_active_responses = 0});
  s.offer_prompts(pow2(40));
  const auto before = ulorl::save_scheduler(s);
  const auto state_before = s.state();
  fault::arm(0, std::size_t{256} << 20);  // 256 MiB, far less than admitting every queued group needs
  bool threw = false;
  try {
    (void)s.plan();
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  fault::disarm();
  CHECK(threw);
  CHECK(s.phase() == ulorl::scheduler_phase::idle);
  CHECK(s.active_responses() == 0);
  CHECK(s.state() == state_before);
  CHECK(ulorl::save_scheduler(s) == before);
  CHECK_NOTHROW(ulorl::restore_scheduler(before));
}

// ---- errors name the function the host called ------------------------------------------------------

TEST_CASE("errors name the public function that was called", "[rollout][hostile]") {
  segment_scheduler s({.group_size = 2, .max_response_tokens = 10, .num_segments = 2});
  rejects([&] { s.abort(0); }, "segment_scheduler::abort", "response_id");
  s.offer_prompts(1);
  (void)s.plan();
  s.abort(0);
  rejects([&] { s.abort(0); }, "segment_scheduler::abort", "response_id");
  rejects([&] { s.abort(7); }, "segment_scheduler::abort", "response_id");
  rejects([&] { s.report(0, 0, decode_outcome::failed); }, "segment_scheduler::report", "response_id");
  rejects([&] { (void)s.plan(); }, "segment_scheduler::plan", "phase");
  rejects([&] { s.offer_prompts(-1); }, "segment_scheduler::offer_prompts", "n");
  rejects([&] { s.update_policy(0); }, "segment_scheduler::update_policy", "version");
  (void)s.end_step();
  rejects([&] { (void)s.end_step(); }, "segment_scheduler::end_step", "phase");
}

// ---- strong guarantee ------------------------------------------------------------------------------

namespace {

// Runs `call` with the k-th allocation failing, for k = 1, 2, ... until it succeeds; after every
// failure the scheduler must be exactly as before (state and checkpoint bytes). Returns the number
// of failures injected.
template <class F>
std::int64_t under_failures(segment_scheduler& s, F&& call) {
  for (std::int64_t k = 1;; ++k) {
    const auto bytes = ulorl::save_scheduler(s);
    const auto state = s.state();
    fault::arm(k);
    try {
      call();
      fault::disarm();
      return k - 1;
    } catch (const std::bad_alloc&) {
      fault::disarm();
    }
    REQUIRE(s.state() == state);
    REQUIRE(ulorl::save_scheduler(s) == bytes);
  }
}

// Drives `s` (under injected failures) and `twin` (without) through the same calls; they must stay
// identical. Returns the failures injected.
std::int64_t drive(const segment_scheduler_config& cfg, int steps, std::uint32_t seed) {
  segment_scheduler s(cfg), twin(cfg);
  std::int64_t injected = 0;
  std::uint32_t x = seed;
  const auto next = [&] {
    x = x * 1664525u + 1013904223u;
    return x >> 8;
  };
  const auto same = [&] { REQUIRE(ulorl::save_scheduler(s) == ulorl::save_scheduler(twin)); };
  for (int step = 0; step < steps; ++step) {
    const std::int64_t n = next() % 3;
    injected += under_failures(s, [&] { s.offer_prompts(n); });
    twin.offer_prompts(n);
    if (next() % 3 == 0) {
      const auto v = s.policy_version() + 1;
      injected += under_failures(s, [&] { s.update_policy(v); });
      twin.update_policy(v);
    }
    ulorl::step_plan p;
    injected += under_failures(s, [&] { p = s.plan(); });
    const std::vector<ulorl::plan_item> items(p.items.begin(), p.items.end());
    (void)twin.plan();
    same();
    for (const auto& it : items) {
      const auto u = next() % 10;
      if (u == 0) continue;  // unreported: end_step aborts it
      if (u == 1) {
        injected += under_failures(s, [&] { s.abort(it.response_id); });
        twin.abort(it.response_id);
        continue;
      }
      std::int64_t m = it.max_new_tokens;
      auto o = decode_outcome::segment_end;
      if (u == 2) {
        m = static_cast<std::int64_t>(next()) % (it.max_new_tokens + 1);
        o = decode_outcome::failed;
      } else if (u < 6) {
        m = static_cast<std::int64_t>(next()) % (it.max_new_tokens + 1);
        o = decode_outcome::eos;
      }
      injected += under_failures(s, [&] { s.report(it.response_id, m, o); });
      twin.report(it.response_id, m, o);
      if (next() % 8 == 0) {  // release mid-step
        const bool partial = next() % 2 == 0;
        injected += under_failures(s, [&] { (void)s.take_experience(partial); });
        (void)twin.take_experience(partial);
      }
    }
    same();
    injected += under_failures(s, [&] { (void)s.end_step(); });
    (void)twin.end_step();
    const bool partial = next() % 4 == 0;
    const ulorl::experience_batch* b = nullptr;
    injected += under_failures(s, [&] { b = &s.take_experience(partial); });
    const auto& tb = twin.take_experience(partial);
    REQUIRE(b->group_ids == tb.group_ids);
    REQUIRE(b->spans == tb.spans);
    REQUIRE(b->responses.size() == tb.responses.size());
    same();
    if (next() % 5 == 0) {  // the restored scheduler keeps going
      s = ulorl::restore_scheduler(ulorl::save_scheduler(s));
      same();
    }
  }
  return injected;
}

}  // namespace

TEST_CASE("every transition gives the strong guarantee under allocation failure", "[rollout][hostile]") {
  std::int64_t injected = 0;
  injected += drive({.group_size = 3, .max_response_tokens = 12, .num_segments = 3, .max_active_responses = 12,
                     .release_batch_groups = 2, .max_staleness = 1, .on_stale = ulorl::staleness_action::drop},
                    60, 1u);
  injected += drive({.group_size = 2, .max_response_tokens = 9, .num_segments = 2, .max_decode_tokens = 30,
                     .max_new_groups_per_step = 3, .order = ulorl::release_order::admission},
                    60, 2u);
  injected += drive({.group_size = 1, .max_response_tokens = 5, .num_segments = 5}, 80, 3u);
  std::printf("strong guarantee: %lld allocation failures injected\n", static_cast<long long>(injected));
  CHECK(injected > 100);
}
