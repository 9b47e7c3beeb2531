// Fuzz target: sequences of segment_scheduler calls (offer_prompts, plan, report with any outcome,
// length and id, abort, end_step, take_experience, update_policy, save + restore), compared call
// by call with the naive model of tests/support/rollout_oracle.hpp (mapped onto the scheduler by
// tests/support/rollout_oracle_mapping.hpp, as in the property test). Every call the model rejects
// must throw ulorl::error and leave the checkpoint byte-identical; every accepted call must give the
// model's answer.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "fuzz_common.hpp"
#include "scheduler_fuzz.hpp"
#include "support/rollout_oracle.hpp"
#include "support/rollout_oracle_mapping.hpp"
#include "ulorl/rollout.hpp"

namespace {

using ulorl::decode_outcome;
using ulorl::segment_scheduler;

//! A call the model rejects: the scheduler must throw and its checkpoint must not change.
template <class F>
void expect_reject(const segment_scheduler& s, F&& call) {
  const auto before = ulorl::save_scheduler(s);
  bool threw = false;
  try {
    call();
  } catch (const ulorl::error&) {
    threw = true;
  }
  FUZZ_CHECK(threw);
  FUZZ_CHECK(ulorl::save_scheduler(s) == before);
}

class session {
 public:
  explicit session(const ulorl::segment_scheduler_config& c) : cfg_(c), model_(oracle::to_oracle(c)) { sched_.emplace(c); }

  void run(FuzzedDataProvider& p) {
    for (int i = 0; i < 256 && p.remaining_bytes() > 0; ++i) {
      switch (p.ConsumeIntegralInRange<int>(0, 9)) {
        case 0: offer(p); break;
        case 1: plan(); break;
        case 2:
        case 3:
        case 4: report(p); break;
        case 5: end_step(); break;
        case 6: take(p.ConsumeBool()); break;
        case 7: update_policy(p); break;
        case 8: fuzz::roundtrip(sched_); break;
        default: abort(p); break;
      }
      compare();
    }
  }

 private:
  void offer(FuzzedDataProvider& p) {
    const std::int64_t n = p.ConsumeIntegralInRange<std::int64_t>(-1, 3);
    if (n < 0) {
      expect_reject(*sched_, [&] { (void)sched_->offer_prompts(n); });
      return;
    }
    sched_->offer_prompts(n);
    model_.offer(n);
  }

  void plan() {
    std::vector<oracle::item> want;
    if (!model_.plan(want)) {
      expect_reject(*sched_, [&] { (void)sched_->plan(); });
      return;
    }
    const auto got = sched_->plan();
    FUZZ_CHECK(got.items.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      const auto& a = got.items[i];
      FUZZ_CHECK(a.response_id == want[i].response_id && a.start_token == want[i].start);
      FUZZ_CHECK(a.max_new_tokens == want[i].quota && a.policy_version == want[i].version);
      FUZZ_CHECK(a.group_id == a.response_id / cfg_.group_size);
    }
    plan_.assign(want.begin(), want.end());
  }

  std::int64_t pick_id(FuzzedDataProvider& p, std::int64_t& quota) {
    quota = 0;
    switch (p.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
      case 1:
        if (!plan_.empty()) {
          const auto& it = plan_[p.ConsumeIntegralInRange<std::size_t>(0, plan_.size() - 1)];
          quota = it.quota;
          return it.response_id;
        }
        return 0;
      case 2: return p.ConsumeIntegralInRange<std::int64_t>(-2, 64);  // live, queued, released or unknown
      default: return fuzz::any_int64(p);
    }
  }

  void report(FuzzedDataProvider& p) {
    std::int64_t quota;
    const std::int64_t id = pick_id(p, quota);
    std::int64_t n;
    switch (p.ConsumeIntegralInRange<int>(0, 4)) {
      case 0: n = quota; break;
      case 1: n = p.ConsumeIntegralInRange<std::int64_t>(0, std::max<std::int64_t>(quota, 0)); break;
      case 2: n = quota + 1; break;
      case 3: n = -1; break;
      default: n = fuzz::any_int64(p); break;
    }
    const int raw = p.ConsumeIntegralInRange<int>(0, 3);  // 3: not a decode_outcome
    const auto o = static_cast<decode_outcome>(raw);
    if (raw == 3) {
      expect_reject(*sched_, [&] { sched_->report(id, n, o); });
      return;
    }
    // The model mutates only when it accepts, so ask it first.
    if (!model_.report(id, n, oracle::to_oracle(o))) {
      expect_reject(*sched_, [&] { sched_->report(id, n, o); });
      return;
    }
    sched_->report(id, n, o);
  }

  void abort(FuzzedDataProvider& p) {
    std::int64_t quota;
    const std::int64_t id = pick_id(p, quota);
    if (!model_.report(id, 0, oracle::outcome::failed)) {
      expect_reject(*sched_, [&] { sched_->abort(id); });
      return;
    }
    sched_->abort(id);
  }

  void end_step() {
    if (!model_.end_step()) {
      expect_reject(*sched_, [&] { (void)sched_->end_step(); });
      return;
    }
    const auto sum = sched_->end_step();
    FUZZ_CHECK(sum.items == static_cast<std::int64_t>(plan_.size()) && sum.reported + sum.aborted == sum.items);
    plan_.clear();
  }

  void update_policy(FuzzedDataProvider& p) {
    const std::int64_t v = model_.version() + p.ConsumeIntegralInRange<std::int64_t>(-1, 2);
    if (v <= model_.version()) {
      expect_reject(*sched_, [&] { sched_->update_policy(v); });
      return;
    }
    sched_->update_policy(v);
    model_.update_policy(v);
  }

  void take(bool partial) {
    const auto& batch = sched_->take_experience(partial);
    const auto want = model_.take(partial);
    const auto G = static_cast<std::size_t>(cfg_.group_size);
    FUZZ_CHECK(batch.group_ids.size() == want.size());
    FUZZ_CHECK(batch.responses.size() == want.size() * G);
    for (std::size_t g = 0; g < want.size(); ++g) {
      FUZZ_CHECK(batch.group_ids[g] == want[g].group_id);
      for (std::size_t k = 0; k < G; ++k) {
        const auto& r = batch.responses[g * G + k];
        const auto& m = want[g].responses[k];
        FUZZ_CHECK(r.response_id == want[g].group_id * cfg_.group_size + static_cast<std::int64_t>(k));
        FUZZ_CHECK(r.final_state == (m.st == oracle::rstate::finished ? ulorl::response_state::finished : ulorl::response_state::truncated));
        FUZZ_CHECK(r.tokens == static_cast<std::int64_t>(m.versions.size()));
        FUZZ_CHECK(r.failures == m.failures && r.decode_steps == m.decode_steps && r.finish_step == m.finish_step);
        FUZZ_CHECK(r.admitted_step == want[g].admitted_step);
        FUZZ_CHECK(oracle::expand(batch.spans_of(r)) == m.versions);
        FUZZ_CHECK(released_.insert(r.response_id).second);
      }
    }
  }

  void compare() {
    const auto& k = sched_->counters();
    FUZZ_CHECK(k.generated_tokens == model_.generated());
    FUZZ_CHECK(k.dropped_tokens == model_.dropped());
    FUZZ_CHECK(k.released_tokens == model_.released_tokens());
    FUZZ_CHECK(sched_->active_responses() == model_.active());
    FUZZ_CHECK(sched_->step() == model_.step());
    FUZZ_CHECK(sched_->policy_version() == model_.version());
    FUZZ_CHECK((sched_->phase() == ulorl::scheduler_phase::planned) == model_.open());
    FUZZ_CHECK(sched_->live_groups() == static_cast<std::int64_t>(model_.live().size()));
    for (const auto& [id, g] : model_.live())
      for (std::size_t q = 0; q < g.r.size(); ++q)
        FUZZ_CHECK(oracle::expand(sched_->spans_of(id * cfg_.group_size + static_cast<std::int64_t>(q))) == g.r[q].versions);
    fuzz::check_invariants(*sched_);
  }

  ulorl::segment_scheduler_config cfg_;
  std::optional<segment_scheduler> sched_;
  oracle::naive_scheduler model_;
  std::vector<oracle::item> plan_;
  std::set<std::int64_t> released_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider p(data, size);
  session s(fuzz::scheduler_config(p));
  s.run(p);
  return 0;
}
