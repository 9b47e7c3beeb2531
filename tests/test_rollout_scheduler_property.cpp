// Property tests of the UloRL segment scheduler against the naive model in
// tests/support/rollout_oracle.hpp: >= 1e5 random steps over many small episodes with random
// configurations, response lengths, failures, aborts, rejected calls, policy updates, releases
// (between steps and mid-step) and checkpoint/restore points (between steps and mid-step, also right
// after a mid-step release).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <span>
#include <random>
#include <set>
#include <vector>

#include "catch.hpp"
#include "support/rollout_oracle.hpp"
#include "support/rollout_oracle_mapping.hpp"
#include "ulorl/rollout.hpp"

// Catch records every assertion; with ~1e7 checks that dominates the runtime under ASan, so the hot
// loops use this cheap form, which reports the failing expression (and the episode seed via INFO).
#define PROP_CHECK(...)                                  \
  do {                                                   \
    if (!(__VA_ARGS__)) FAIL("property violated: " #__VA_ARGS__); \
  } while (false)

namespace {

using ulorl::decode_outcome;
using ulorl::segment_scheduler;

struct episode_stats {
  std::int64_t steps = 0, items = 0, failures = 0, aborts = 0, rejections = 0, restores = 0, releases = 0,
               tokens = 0, provenance_checks = 0, stale_drops = 0;
};

class episode {
 public:
  episode(std::uint64_t seed, episode_stats& st) : rng_(seed), st_(st) {
    auto pick = [&](std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_); };
    const int gs[] = {1, 2, 3, 4, 8};
    cfg_.group_size = gs[pick(0, 4)];
    cfg_.max_response_tokens = pick(1, 3) == 1 ? pick(1, 6) : pick(7, 48);
    cfg_.num_segments = static_cast<std::int32_t>(std::min<std::int64_t>(pick(1, 6), cfg_.max_response_tokens));
    const auto G = cfg_.group_size;
    cfg_.max_active_responses = pick(0, 4) == 0 ? 0 : G * pick(1, std::max<std::int64_t>(1, 24 / G));
    cfg_.max_decode_tokens = pick(0, 2) == 0 ? cfg_.segment_tokens() * G * pick(1, 5) + pick(0, 7) : 0;
    cfg_.max_new_groups_per_step = pick(0, 2) == 0 ? pick(1, 3) : 0;
    cfg_.order = pick(0, 1) ? ulorl::release_order::completion : ulorl::release_order::admission;
    cfg_.release_batch_groups = pick(0, 1) ? pick(1, 4) : 0;
    cfg_.max_staleness = pick(0, 2) == 0 ? pick(0, 3) : -1;
    cfg_.on_stale = pick(0, 1) ? ulorl::staleness_action::drop : ulorl::staleness_action::recompute;
    sched_.emplace(cfg_);
    model_.emplace(oracle::to_oracle(cfg_));
    p_fail_ = pick(0, 1) ? 0.0 : 0.05;
    p_skip_ = pick(0, 1) ? 0.0 : 0.03;
    p_update_ = 0.1 * static_cast<double>(pick(0, 6));
  }

  void run(std::int64_t steps) {
    for (std::int64_t i = 0; i < steps; ++i) step(false);
    // Drain: no new prompts, no failures, no policy updates; everything admitted must come out.
    const auto groups = static_cast<std::size_t>(sched_->live_groups() + sched_->queued_groups());
    const auto limit = 4 * static_cast<std::size_t>(cfg_.num_segments + 2) * (groups + 2) + 100;
    std::size_t guard = 0;
    while (sched_->live_groups() > 0 || sched_->queued_groups() > 0) {
      step(true);
      PROP_CHECK(++guard < limit);
    }
    PROP_CHECK(model_->live().empty());
    PROP_CHECK(released_ == admitted_);
    const auto& k = sched_->counters();
    PROP_CHECK(k.generated_tokens == k.released_tokens + k.dropped_tokens);
    PROP_CHECK(k.released_responses == static_cast<std::int64_t>(admitted_.size()));
  }

 private:
  double uni() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  std::int64_t pick(std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_); }

  std::int64_t target(std::int64_t rid) {
    auto it = target_.find(rid);
    if (it != target_.end()) return it->second;
    const auto L = cfg_.max_response_tokens;
    std::int64_t t;
    const double u = uni();
    if (u < 0.05) t = 0;
    else if (u < 0.25) t = L + pick(0, 3);  // truncated
    else t = pick(1, L);
    target_[rid] = t;
    return t;
  }

  void expect_reject(std::int64_t id, std::int64_t n, decode_outcome o) {
    const auto before = sched_->state();
    CHECK_THROWS_AS(sched_->report(id, n, o), ulorl::error);
    CHECK_FALSE(model_->report(id, n, oracle::to_oracle(o)));
    PROP_CHECK(sched_->state() == before);  // a rejected call changes nothing
    ++st_.rejections;
  }

  void checkpoint_roundtrip() {
    const auto bytes = ulorl::save_scheduler(*sched_);
    const auto before = sched_->state();
    sched_.emplace(ulorl::restore_scheduler(bytes));
    PROP_CHECK(sched_->state() == before);
    ++st_.restores;
  }

  void step(bool drain) {
    if (!drain && uni() < 0.5) {
      const auto n = pick(0, 3);
      sched_->offer_prompts(n);
      model_->offer(n);
    }
    if (!drain && uni() < p_update_) {
      const auto v = sched_->policy_version() + pick(1, 2);
      sched_->update_policy(v);
      model_->update_policy(v);
    }
    const auto plan = sched_->plan();
    std::vector<oracle::item> want;
    PROP_CHECK(model_->plan(want));
    PROP_CHECK(plan.items.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      const auto& a = plan.items[i];
      const auto& b = want[i];
      PROP_CHECK(a.response_id == b.response_id);
      PROP_CHECK(a.start_token == b.start);
      PROP_CHECK(a.max_new_tokens == b.quota);
      PROP_CHECK(a.policy_version == b.version);
      PROP_CHECK(a.group_id == a.response_id / cfg_.group_size);
      PROP_CHECK(a.max_new_tokens >= 1);
      if (a.start_token == 0) admitted_.insert(a.response_id);
    }
    st_.items += static_cast<std::int64_t>(want.size());
    std::vector<plan_copy> items;
    for (const auto& a : plan.items) items.push_back({a.response_id, a.start_token, a.max_new_tokens});
    std::shuffle(items.begin(), items.end(), rng_);
    std::vector<std::int64_t> done_ids;
    for (const auto& it : items) {
      if (!drain && uni() < 0.02) inject_bad_call(it, done_ids);
      if (!drain && uni() < p_skip_) {
        ++st_.aborts;
        continue;  // never reported: end_step() aborts it
      }
      if (!drain && uni() < 0.01) {
        sched_->abort(it.id);
        PROP_CHECK(model_->report(it.id, 0, oracle::outcome::failed));
        done_ids.push_back(it.id);
        ++st_.aborts;
        continue;
      }
      std::int64_t n;
      decode_outcome o;
      const auto remaining = std::max<std::int64_t>(0, target(it.id) - it.start);
      if (!drain && uni() < p_fail_) {
        n = pick(0, it.quota);
        o = decode_outcome::failed;
        ++st_.failures;
      } else if (remaining <= it.quota && target(it.id) <= cfg_.max_response_tokens) {
        n = remaining;
        o = decode_outcome::eos;
      } else {
        n = it.quota;
        o = decode_outcome::segment_end;
      }
      sched_->report(it.id, n, o);
      PROP_CHECK(model_->report(it.id, n, oracle::to_oracle(o)));
      done_ids.push_back(it.id);
      st_.tokens += n;
      if (!drain && uni() < 0.003) checkpoint_roundtrip();  // mid-step
      if (!drain && uni() < 0.01) {  // release while the step is open (docs §2 allows it any time)
        take(uni() < 0.1);
        if (uni() < 0.3) checkpoint_roundtrip();
      }
    }
    const auto sum = sched_->end_step();
    PROP_CHECK(model_->end_step());
    PROP_CHECK(sum.items == static_cast<std::int64_t>(items.size()));
    PROP_CHECK(sum.reported + sum.aborted == sum.items);
    if (uni() < 0.05) CHECK_THROWS_AS(sched_->end_step(), ulorl::error);
    ++st_.steps;

    if (drain || uni() < 0.6) take(drain || uni() < 0.1);
    if (!drain && uni() < 0.02) checkpoint_roundtrip();
    check_invariants(drain || uni() < 0.05);
  }

  struct plan_copy {
    std::int64_t id, start, quota;
  };

  void inject_bad_call(const plan_copy& it, const std::vector<std::int64_t>& done_ids) {
    switch (pick(0, 4)) {
      case 0:
        if (!done_ids.empty()) expect_reject(done_ids[static_cast<std::size_t>(pick(0, static_cast<std::int64_t>(done_ids.size()) - 1))], 0, decode_outcome::failed);
        break;
      case 1: expect_reject(it.id, it.quota + 1, decode_outcome::eos); break;
      case 2:
        if (it.quota > 1) expect_reject(it.id, it.quota - 1, decode_outcome::segment_end);
        break;
      case 3: expect_reject(it.id, -1, decode_outcome::failed); break;
      default: {
        // Unknown: a released id, a queued id, or one far beyond anything offered.
        std::int64_t id = 1'000'000'000 + pick(0, 100);
        if (!released_.empty() && uni() < 0.5) id = *released_.begin();
        expect_reject(id, 0, decode_outcome::failed);
      }
    }
  }

  void take(bool partial) {
    const auto& batch = sched_->take_experience(partial);
    const auto want = model_->take(partial);
    PROP_CHECK(batch.group_ids.size() == want.size());
    const auto G = static_cast<std::size_t>(cfg_.group_size);
    PROP_CHECK(batch.responses.size() == want.size() * G);  // groups are whole
    if (cfg_.release_batch_groups > 0 && !partial) PROP_CHECK((want.empty() || static_cast<std::int64_t>(want.size()) == cfg_.release_batch_groups));
    for (std::size_t g = 0; g < want.size(); ++g) {
      PROP_CHECK(batch.group_ids[g] == want[g].group_id);
      for (std::size_t k = 0; k < G; ++k) {
        const auto& r = batch.responses[g * G + k];
        const auto& m = want[g].responses[k];
        PROP_CHECK(r.group_id == want[g].group_id);
        PROP_CHECK(r.index_in_group == static_cast<std::int32_t>(k));
        PROP_CHECK(r.response_id == want[g].group_id * cfg_.group_size + static_cast<std::int64_t>(k));
        PROP_CHECK(r.final_state == (m.st == oracle::rstate::finished ? ulorl::response_state::finished : ulorl::response_state::truncated));
        PROP_CHECK(r.tokens == static_cast<std::int64_t>(m.versions.size()));
        PROP_CHECK(r.failures == m.failures);
        PROP_CHECK(r.decode_steps == m.decode_steps);
        PROP_CHECK(r.finish_step == m.finish_step);
        PROP_CHECK(r.admitted_step == want[g].admitted_step);
        PROP_CHECK(r.tokens <= cfg_.max_response_tokens);
        const auto spans = batch.spans_of(r);
        const auto toks = oracle::expand(spans);
        PROP_CHECK(toks == m.versions);
        // Versions never decrease along a response.
        PROP_CHECK(std::is_sorted(toks.begin(), toks.end()));
        const auto st = batch.staleness(r);
        PROP_CHECK(st.max_lag == (toks.empty() ? 0 : model_->version() - toks.front()));
        PROP_CHECK(st.versions_spanned == (toks.empty() ? 0 : toks.back() - toks.front()));
        PROP_CHECK(batch.age_steps(r) == model_->step() - want[g].admitted_step);
        // Released exactly once.
        PROP_CHECK(released_.insert(r.response_id).second);
        PROP_CHECK(admitted_.count(r.response_id) == 1);
        if (uni() < 0.25) check_provenance(spans, m.versions, batch.policy_version);
      }
    }
    st_.releases += static_cast<std::int64_t>(want.size());
  }

  void check_provenance(std::span<const ulorl::version_span> spans, const std::vector<std::int64_t>& toks, std::int64_t current) {
    const int modes = 3;
    const auto mi = pick(0, modes - 1);
    const auto m = static_cast<oracle::mode>(mi);
    ulorl::old_log_prob_config q{.mode = static_cast<ulorl::is_mode>(mi),
                                .current_version = current,
                                .max_staleness = pick(0, 2) == 0 ? pick(0, 3) : -1,
                                .trust_rollout_log_probs = pick(0, 4) != 0};
    const auto want = oracle::old_versions(toks, m, current, q.max_staleness);
    std::vector<std::int64_t> got(toks.size());
    if (!want) {
      CHECK_THROWS_AS(ulorl::fill_old_log_prob_versions(spans, got, q), ulorl::error);
      return;
    }
    ulorl::fill_old_log_prob_versions(spans, got, q);
    PROP_CHECK(got == *want);
    const auto flags = oracle::recompute_flags(toks, *want, q.trust_rollout_log_probs);
    std::vector<std::uint8_t> mask(toks.size());
    ulorl::fill_recompute_mask(spans, mask, q);
    PROP_CHECK(mask == flags);
    PROP_CHECK(ulorl::recompute_token_count(spans, q) == std::count(flags.begin(), flags.end(), 1));
    std::vector<ulorl::old_log_prob_span> runs(spans.size());
    const auto n = ulorl::old_log_prob_plan(spans, runs, q);
    std::vector<std::int64_t> from_runs;
    std::vector<std::uint8_t> mask_runs;
    for (std::size_t j = 0; j < n; ++j)
      for (auto t = runs[j].begin; t < runs[j].end; ++t) {
        from_runs.push_back(runs[j].old_version);
        mask_runs.push_back(runs[j].recompute ? 1 : 0);
      }
    PROP_CHECK(from_runs == *want);
    PROP_CHECK(mask_runs == flags);
    if (!toks.empty()) {
      const auto t = pick(0, static_cast<std::int64_t>(toks.size()) - 1);
      PROP_CHECK(ulorl::old_log_prob_version(spans, t, q) == (*want)[static_cast<std::size_t>(t)]);
    }
    ++st_.provenance_checks;
  }

  void check_invariants(bool deep) {
    const auto& k = sched_->counters();
    PROP_CHECK(k.generated_tokens == model_->generated());
    PROP_CHECK(k.dropped_tokens == model_->dropped());
    PROP_CHECK(k.released_tokens == model_->released_tokens());
    PROP_CHECK(sched_->active_responses() == model_->active());
    if (!deep) return;
    std::int64_t live_tokens = 0;
    for (const auto& [id, g] : model_->live())
      for (std::size_t q = 0; q < g.r.size(); ++q) {
        const auto rid = id * cfg_.group_size + static_cast<std::int64_t>(q);
        live_tokens += static_cast<std::int64_t>(g.r[q].versions.size());
        PROP_CHECK(oracle::expand(sched_->spans_of(rid)) == g.r[q].versions);
      }
    PROP_CHECK(sched_->live_tokens() == live_tokens);
    PROP_CHECK(k.generated_tokens == k.released_tokens + live_tokens + k.dropped_tokens);  // conservation
    PROP_CHECK(sched_->live_groups() == static_cast<std::int64_t>(model_->live().size()));
    st_.stale_drops = std::max(st_.stale_drops, k.stale_drops);
  }

  std::mt19937_64 rng_;
  episode_stats& st_;
  ulorl::segment_scheduler_config cfg_;
  std::optional<segment_scheduler> sched_;
  std::optional<oracle::naive_scheduler> model_;
  std::map<std::int64_t, std::int64_t> target_;
  std::set<std::int64_t> admitted_, released_;
  double p_fail_ = 0, p_skip_ = 0, p_update_ = 0;
};

}  // namespace

TEST_CASE("segment_scheduler equals the naive model over >= 1e5 random steps", "[rollout][property]") {
  const std::uint64_t seed = 20260729;
  std::printf("rollout property test seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 master(seed);
  episode_stats st;
  std::int64_t episodes = 0;
  while (st.steps < 100000) {
    const auto s = master();
    INFO("episode seed " << s);
    episode e(s, st);
    e.run(static_cast<std::int64_t>(150 + s % 250));
    ++episodes;
  }
  std::printf("episodes %lld steps %lld items %lld tokens %lld failures %lld aborts %lld rejected %lld restores %lld "
              "groups released %lld provenance checks %lld\n",
              static_cast<long long>(episodes), static_cast<long long>(st.steps), static_cast<long long>(st.items),
              static_cast<long long>(st.tokens), static_cast<long long>(st.failures), static_cast<long long>(st.aborts),
              static_cast<long long>(st.rejections), static_cast<long long>(st.restores), static_cast<long long>(st.releases),
              static_cast<long long>(st.provenance_checks));
  CHECK(st.steps >= 100000);
  CHECK(st.failures > 0);
  CHECK(st.aborts > 0);
  CHECK(st.rejections > 0);
  CHECK(st.restores > 0);
}
