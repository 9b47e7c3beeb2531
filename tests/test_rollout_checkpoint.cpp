// Tests of ulorl/rollout/checkpoint.hpp: exact save/restore (idle and mid-step, after failures),
// a restored scheduler continues exactly like the original, every corrupted buffer is rejected, the
// bytes are core/checkpoint.hpp's envelope, states that break an invariant are rejected by the
// validating constructor, checkpoint files round-trip (a FIFO is refused without blocking), and a
// pinned checkpoint (hexadecimal in this file) is what save_scheduler gives and restore_scheduler
// reads back.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/fifo_watchdog.hpp"
#include "support/golden_bytes.hpp"
#include "support/rejection.hpp"
#include "ulorl/rollout/checkpoint.hpp"

using ulorl::decode_outcome;
using ulorl::segment_scheduler;

namespace {

// A scheduler with live groups in every state, a policy update, a failure and an open step with
// some items reported: the richest state to round-trip.
segment_scheduler busy_scheduler() {
  segment_scheduler s({.group_size = 3, .max_response_tokens = 12, .num_segments = 3, .max_active_responses = 9,
                       .release_batch_groups = 2, .max_staleness = 2});
  s.offer_prompts(6);
  auto p = s.plan();
  for (const auto& it : p.items) {
    if (it.response_id % 4 == 0) s.report(it.response_id, 2, decode_outcome::eos);
    else if (it.response_id == 5) s.report(it.response_id, 1, decode_outcome::failed);
    else s.report(it.response_id, it.max_new_tokens, decode_outcome::segment_end);
  }
  (void)s.end_step();
  s.update_policy(1);
  p = s.plan();
  s.report(p.items[0].response_id, 1, decode_outcome::eos);
  s.report(p.items[1].response_id, p.items[1].max_new_tokens, decode_outcome::segment_end);
  return s;  // step open, remaining items unreported
}

// Drives two schedulers with the same calls and checks they answer identically.
void lockstep(segment_scheduler& a, segment_scheduler& b, int steps) {
  if (a.phase() == ulorl::scheduler_phase::planned) {
    const auto items = a.current_plan();
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (a.state().plan_reported[i]) continue;
      a.report(items[i].response_id, 1, decode_outcome::eos);
      b.report(items[i].response_id, 1, decode_outcome::eos);
    }
    CHECK(a.end_step() == b.end_step());
  }
  for (int i = 0; i < steps; ++i) {
    a.offer_prompts(1);
    b.offer_prompts(1);
    const auto pa = a.plan();
    const auto pb = b.plan();
    REQUIRE(pa.items.size() == pb.items.size());
    for (std::size_t k = 0; k < pa.items.size(); ++k) {
      REQUIRE(pa.items[k] == pb.items[k]);
      const auto& it = pa.items[k];
      const bool eos = (it.response_id + i) % 3 == 0;
      a.report(it.response_id, eos ? 1 : it.max_new_tokens, eos ? decode_outcome::eos : decode_outcome::segment_end);
      b.report(it.response_id, eos ? 1 : it.max_new_tokens, eos ? decode_outcome::eos : decode_outcome::segment_end);
    }
    CHECK(a.end_step() == b.end_step());
    const auto& ea = a.take_experience(true);
    const auto& eb = b.take_experience(true);
    CHECK(ea.group_ids == eb.group_ids);
    CHECK(ea.spans == eb.spans);
    REQUIRE(a.state() == b.state());
  }
}

}  // namespace

TEST_CASE("checkpoint round-trips exactly, mid-step after failures", "[rollout][checkpoint]") {
  auto s = busy_scheduler();
  REQUIRE(s.phase() == ulorl::scheduler_phase::planned);
  const auto bytes = ulorl::save_scheduler(s);
  auto r = ulorl::restore_scheduler(bytes);
  CHECK(r.state() == s.state());
  CHECK(ulorl::save_scheduler(r) == bytes);  // byte-exact
  CHECK(ulorl::scheduler_to_json(r) == ulorl::scheduler_to_json(s));
  lockstep(s, r, 12);

  // Idle state, and a fresh scheduler.
  const auto idle = ulorl::save_scheduler(s);
  CHECK(ulorl::restore_scheduler(idle).state() == s.state());
  segment_scheduler fresh;
  CHECK(ulorl::restore_scheduler(ulorl::save_scheduler(fresh)).state() == fresh.state());
}

TEST_CASE("checkpoint JSON shows the state", "[rollout][checkpoint]") {
  const auto s = busy_scheduler();
  const auto j = ulorl::scheduler_to_json(s);
  for (const char* key : {"\"format\":\"ulorl.segment_scheduler\"", "\"phase\":\"planned\"", "\"policy_version\":1",
                          "\"num_segments\":3", "\"segment_tokens\":4", "\"groups\":[", "\"spans\":[[0,4,0]",
                          "\"state\":\"decoding\"", "\"state\":\"finished\"", "\"reported\":true", "\"reported\":false",
                          "\"counters\":{"})
    CHECK(j.find(key) != std::string::npos);
  // Balanced brackets outside strings (the dump has no escapes).
  int depth = 0;
  bool in_str = false;
  for (const char ch : j) {
    if (ch == '"') in_str = !in_str;
    if (in_str) continue;
    if (ch == '{' || ch == '[') ++depth;
    if (ch == '}' || ch == ']') --depth;
    REQUIRE(depth >= 0);
  }
  CHECK(depth == 0);
  CHECK_FALSE(in_str);
}

TEST_CASE("corrupted checkpoints are rejected", "[rollout][checkpoint]") {
  const auto s = busy_scheduler();
  const auto bytes = ulorl::save_scheduler(s);
  // Every single-bit flip anywhere: header, payload or checksum.
  std::int64_t rejected = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    for (int bit : {0, 3, 7}) {
      auto b = bytes;
      b[i] ^= static_cast<std::byte>(1u << bit);
      CHECK_THROWS_AS(ulorl::restore_scheduler(b), ulorl::error);
      ++rejected;
    }
  }
  CHECK(rejected == static_cast<std::int64_t>(3 * bytes.size()));
  // Every truncation, and trailing bytes.
  for (std::size_t n = 0; n < bytes.size(); n += 7)
    CHECK_THROWS_AS(ulorl::restore_scheduler(std::span<const std::byte>(bytes).first(n)), ulorl::error);
  auto longer = bytes;
  longer.push_back(std::byte{0});
  CHECK_THROWS_AS(ulorl::restore_scheduler(longer), ulorl::error);
  // Header fields with a recomputed checksum (so that the field's own check is what rejects them):
  // envelope version (offset 8), kind (10), payload version (12), payload length (16).
  const auto reseal = [](std::vector<std::byte> b) {
    const auto body = b.size() - 8;
    const auto sum = ulorl::detail::crc64(std::span<const std::byte>(b).first(body));
    for (std::size_t i = 0; i < 8; ++i) b[body + i] = static_cast<std::byte>((sum >> (8 * i)) & 0xFFu);
    return b;
  };
  CHECK_NOTHROW(ulorl::restore_scheduler(reseal(bytes)));
  const auto rejected_with = [&](std::size_t offset, std::uint8_t value, const char* what) {
    auto b = bytes;
    b[offset] = static_cast<std::byte>(value);
    try {
      (void)ulorl::restore_scheduler(reseal(b));
      FAIL("accepted a checkpoint with a changed byte " << offset);
    } catch (const ulorl::error& e) {
      CHECK(e.function() == "restore_scheduler");
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  rejected_with(8, 2, "envelope version");
  rejected_with(10, static_cast<std::uint8_t>(ulorl::checkpoint_kind::kl_controller), "another kind");
  rejected_with(12, static_cast<std::uint8_t>(ulorl::scheduler_checkpoint_version + 1), "payload format version");
  rejected_with(12, 1, "payload format version");  // the ULRLSEGS-era payload is not read
  rejected_with(16, static_cast<std::uint8_t>(bytes[16]) ^ 1u, "payload length");
}

TEST_CASE("checkpoint layout: the core envelope of kind segment_scheduler", "[rollout][checkpoint]") {
  const auto s = busy_scheduler();
  const auto bytes = ulorl::save_scheduler(s);
  REQUIRE(bytes.size() > 32);
  const std::string magic(reinterpret_cast<const char*>(bytes.data()), 8);
  CHECK(magic == "ULORLCKP");
  const auto u = [&](std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(bytes[at + static_cast<std::size_t>(i)]) << (8 * i);
    return v;
  };
  CHECK(u(8, 2) == ulorl::checkpoint_envelope_version);
  CHECK(u(10, 2) == static_cast<std::uint64_t>(ulorl::checkpoint_kind::segment_scheduler));
  CHECK(u(12, 4) == 2);  // payload version 2: the first in this envelope
  CHECK(u(16, 8) == bytes.size() - 32);
  CHECK(u(bytes.size() - 8, 8) == ulorl::detail::crc64(std::span<const std::byte>(bytes).first(bytes.size() - 8)));
  // Every error of a rejected buffer names restore_scheduler.
  try {
    (void)ulorl::restore_scheduler(std::span<const std::byte>(bytes).first(bytes.size() - 1));
    FAIL("accepted a truncated checkpoint");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "restore_scheduler");
  }
  // An invariant broken under a valid checksum is reported by restore_scheduler too.
  auto st = s.state();
  st.active_responses += 1;
  std::vector<std::byte> forged;
  ulorl::detail::save_state(st, forged);
  try {
    (void)ulorl::restore_scheduler(forged);
    FAIL("accepted a state that breaks an invariant");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "restore_scheduler");
    CHECK(e.argument() == "active_responses");
  }
}

TEST_CASE("pinned checkpoint: a scheduler mid-step saves these bytes and restores them", "[rollout][checkpoint][golden]") {
  // Every vector of the state is non-empty: a released group's free slot, groups ready and live, a
  // response with two version spans, an open plan with one item reported.
  segment_scheduler s({.group_size = 2, .max_response_tokens = 4, .num_segments = 2, .release_batch_groups = 1,
                       .max_staleness = 1});
  s.offer_prompts(3);
  for (const auto& it : s.plan().items) {
    const auto r = it.response_id;
    if (r == 2) s.report(r, 2, decode_outcome::segment_end);
    else if (r == 3) s.report(r, 1, decode_outcome::failed);
    else s.report(r, r % 2 == 0 ? 1 : 2, decode_outcome::eos);
  }
  (void)s.end_step();
  (void)s.take_experience();
  s.update_policy(1);
  const auto p = s.plan();
  s.report(p.items[1].response_id, p.items[1].max_new_tokens, decode_outcome::segment_end);
  const auto& st = s.state();
  REQUIRE((st.free_slots.size() == 1 && st.ready.size() == 2 && st.plan.size() == 2 && st.responses[3].spans.size() == 2));
  const auto golden = from_hex(
      "554c4f524c434b500100040002000000a603000000000000020000000400000000000000020000000004000000000000"
      "000000000000000000000000000000000001000000000000000100000000000000000101000000000000000100000000"
      "000000030000000000000003000000000000000200000000000000030000000000000000000000000000000002000000"
      "00000000000000000000000000000000010000000000000001000000000000000000000000ffffffffffffffff020000"
      "000000000002020000000000000000000000000000000000000006000000000000000501000000000000000000000000"
      "0000000000000001000000ffffffff010000000000000000000000000000000100000000000000000000000000000005"
      "020000000000000000000000000000000000000001000000ffffffff0100000000000000000000000000000002000000"
      "000000000000000000000000010200000000000000ffffffffffffffff00000000010000000000000001000000000000"
      "00000000000000000002000000000000000000000000000000020200000000000000ffffffffffffffff010000000200"
      "000001000000020000000000000000000000000000000100000000000000000000000000000001000000000000000200"
      "000000000000010000000000000003010000000000000000000000000000000000000001000000ffffffff0100000000"
      "000000000000000000000001000000000000000000000000000000030200000000000000000000000000000000000000"
      "01000000ffffffff01000000000000000000000000000000020000000000000000000000000000000100000000000000"
      "000000000200000000000000010000000200000002000000000000000000000002000000010000000000000002000000"
      "000000000200000000000000010000000000000000000000020000000000000002000000000000000100000000000000"
      "030000000000000001000000000000000100000001000000000000000100000000000000010000000000000002000000"
      "000000000001010000000000000002000000000000000100000000000000000000000000000000000000000000000000"
      "000000000000000000000000000001000000000000000000000000000000030000000000000003000000000000000100"
      "000000000000020000000000000004000000000000000000000000000000080000000000000007000000000000000100"
      "000000000000000000000000000000000000000000000a000000000000000300000000000000000000000000000088af"
      "5d81cfb8c491");
  CHECK(ulorl::save_scheduler(s) == golden);
  const auto r = ulorl::restore_scheduler(golden);
  CHECK(r.state() == st);
  CHECK(ulorl::save_scheduler(r) == golden);
  // The fewest bytes of an element, which bound each count against the bytes left.
  STATIC_REQUIRE(ulorl::detail::min_field_bytes<ulorl::group_record>() == 29);
  STATIC_REQUIRE(ulorl::detail::min_field_bytes<ulorl::response_record>() == 37);
  STATIC_REQUIRE(ulorl::detail::min_field_bytes<ulorl::version_span>() == 24);
  STATIC_REQUIRE(ulorl::detail::min_field_bytes<ulorl::plan_item>() == 44);
}

TEST_CASE("states that break an invariant are rejected on restore", "[rollout][checkpoint]") {
  const auto good = busy_scheduler().state();
  const auto expect_reject = [&](auto mutate, const char* what) {
    auto st = good;
    mutate(st);
    INFO(what);
    CHECK_THROWS_AS(segment_scheduler(std::move(st)), ulorl::error);
  };
  CHECK_NOTHROW(segment_scheduler(good));
  expect_reject([](auto& st) { st.active_responses += 1; }, "active count");
  expect_reject([](auto& st) { st.counters.generated_tokens += 1; }, "token conservation");
  expect_reject([](auto& st) { st.responses[0].tokens += 1; }, "tokens vs spans");
  expect_reject([](auto& st) { st.responses[0].spans.at(0).version = 7; }, "version newer than policy");
  expect_reject([](auto& st) { st.groups[0].done += 1; }, "done count");
  expect_reject([](auto& st) { st.groups[1].group_id = st.groups[0].group_id; }, "duplicate group id");
  expect_reject([](auto& st) { st.live_order.pop_back(); }, "live group missing from live_order");
  expect_reject([](auto& st) { std::swap(st.live_order[0], st.live_order[1]); }, "admission order");
  expect_reject([](auto& st) { st.plan_reported[0] = 0; }, "reported item flag");
  expect_reject([](auto& st) { st.plan.back().max_new_tokens = 100; }, "plan item beyond L_max");
  expect_reject([](auto& st) { st.phase = ulorl::scheduler_phase::idle; }, "decoding while idle");
  expect_reject([](auto& st) { st.config.num_segments = 0; }, "config");
  expect_reject([](auto& st) { st.free_slots.push_back(0); }, "free list names a live slot");
  expect_reject([](auto& st) { st.responses[1].state = static_cast<ulorl::response_state>(42); }, "unknown state");
  expect_reject([](auto& st) { st.offered_end = st.next_group_id - 1; }, "offered before admitted");
}

// Every enum of the state (config.order, config.on_stale, phase, groups.status, responses.state)
// with a value no enumerator has, under a valid checksum: restore_scheduler rejects it naming the
// field, the slot and the value, and segment_scheduler(state) does the same under its own name.
TEST_CASE("unknown enum values in a restored state are rejected naming the field", "[rollout][checkpoint][enum]") {
  const auto good = busy_scheduler().state();
  REQUIRE(good.groups.size() >= 2);
  struct forged_enum {
    std::string argument;
    std::int64_t index;
    long long value;
    void (*mutate)(ulorl::segment_scheduler_state&);
  };
  const std::vector<forged_enum> cases = {
      {"config.order", -1, 2, [](auto& st) { st.config.order = static_cast<ulorl::release_order>(2); }},
      {"config.on_stale", -1, 255, [](auto& st) { st.config.on_stale = static_cast<ulorl::staleness_action>(255); }},
      {"phase", -1, 2, [](auto& st) { st.phase = static_cast<ulorl::scheduler_phase>(2); }},
      {"groups.status", 1, 3, [](auto& st) { st.groups[1].status = static_cast<ulorl::group_status>(3); }},
      {"responses.state", 4, 6, [](auto& st) { st.responses[4].state = static_cast<ulorl::response_state>(6); }},
      {"responses.state", 0, 42, [](auto& st) { st.responses[0].state = static_cast<ulorl::response_state>(42); }},
  };
  std::vector<std::byte> bytes;
  for (const auto& c : cases) {
    INFO(c.argument << "[" << c.index << "] = " << c.value);
    auto st = good;
    c.mutate(st);
    ulorl::detail::save_state(st, bytes);
    require_unknown_enum([&] { (void)ulorl::restore_scheduler(bytes); }, "restore_scheduler", c.argument, c.value, c.index);
    require_unknown_enum([&] { (void)segment_scheduler(st); }, "segment_scheduler(state)", c.argument, c.value, c.index);
  }
  ulorl::detail::save_state(good, bytes);
  CHECK(ulorl::restore_scheduler(bytes).state() == good);
}

TEST_CASE("checkpoint files: save_scheduler_to_file and restore_scheduler_from_file", "[rollout][checkpoint]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ulorl_sched_ckpt_" + std::to_string(static_cast<long long>(::getpid())));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "scheduler.ckpt").string();
  auto s = busy_scheduler();
  ulorl::save_scheduler_to_file(s, path);
  {
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto bytes = ulorl::save_scheduler(s);
    REQUIRE(raw.size() == bytes.size());
    CHECK(std::equal(raw.begin(), raw.end(), bytes.begin(), [](char a, std::byte b) { return static_cast<std::byte>(a) == b; }));
  }
  auto r = ulorl::restore_scheduler_from_file(path);
  CHECK(r.state() == s.state());
  lockstep(s, r, 4);
  // Replacing the file keeps one complete checkpoint (the newer one).
  ulorl::save_scheduler_to_file(s, path);
  CHECK(ulorl::restore_scheduler_from_file(path).state() == s.state());
  // A missing file, and a corrupted one, are ulorl::errors of restore_scheduler_from_file / restore_scheduler.
  try {
    (void)ulorl::restore_scheduler_from_file((dir / "missing.ckpt").string());
    FAIL("restored a missing file");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "restore_scheduler_from_file");
    CHECK(e.argument() == "path");
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << "not a checkpoint at all, but long enough to hold a header";
  }
  CHECK_THROWS_AS(ulorl::restore_scheduler_from_file(path), ulorl::error);
  std::filesystem::remove_all(dir);
}

TEST_CASE("restore_scheduler_from_file refuses a FIFO without blocking", "[rollout][checkpoint]") {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ulorl_sched_fifo_" + std::to_string(static_cast<long long>(::getpid())));
  std::filesystem::create_directories(dir);
  const auto fifo = (dir / "scheduler.ckpt").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  std::string function, message;
  // Nobody writes to the FIFO: a reader that opened it would wait until the watchdog releases it.
  const bool blocked = blocked_on_fifo(fifo, [&] {
    try {
      (void)ulorl::restore_scheduler_from_file(fifo);
    } catch (const ulorl::error& e) {
      function = e.function();
      message = e.what();
    }
  });
  CHECK_FALSE(blocked);
  CHECK(function == "restore_scheduler_from_file");
  CHECK_THAT(message, Catch::Contains(fifo) && Catch::Contains("is not a regular file"));
  std::filesystem::remove_all(dir);
}
