// Tests of ulorl/rollout/segment_autotune.hpp: the tuner's decisions against the simulator's own
// ranking of fixed counts (computed here candidate by candidate, apart from the tuner), hysteresis,
// the window, state round trip and validation; the adaptive simulation against every fixed count on
// the settings of docs/segment_rollout.md's sensitivity table, whose best count differs.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "catch.hpp"
#include "ulorl/rollout/segment_autotune.hpp"

namespace {

// A small run shape: L_max 2000, 16 prompts x 4, lognormal lengths.
ulorl::rollout_sim_config small_config() {
  ulorl::rollout_sim_config c;
  c.max_response_tokens = 2000;
  c.prompt_tokens = 50;
  c.group_size = 4;
  c.prompts_per_step = 16;
  c.warmup_steps = 2;
  c.measured_steps = 12;
  c.engine = {.iteration_s = 10e-3, .per_sequence_s = 2e-6, .per_context_token_s = 1e-9, .prefill_token_s = 2e-6};
  c.trainer = {.per_token_s = 2e-6, .per_step_s = 1.0};
  return c;
}

// The fastest fixed count among `candidates` by simulate_segment_rollout, and its step time.
std::pair<std::int32_t, double> best_fixed(const ulorl::rollout_sim_config& c, const std::vector<std::int32_t>& candidates) {
  std::int32_t best = 0;
  double t = std::numeric_limits<double>::infinity();
  for (const auto n : candidates) {
    const double s = ulorl::simulate_segment_rollout(c, n).step_time;
    if (s < t) t = s, best = n;
  }
  return {best, t};
}

}  // namespace

TEST_CASE("segment_autotuner: keeps its initial count until it has lengths and costs, then picks the predicted best",
          "[rollout][autotune]") {
  auto c = small_config();
  ulorl::segment_autotune_config a{.candidates = {1, 2, 4, 8}, .initial = 1, .min_groups = 4, .window_groups = 64};
  ulorl::segment_autotuner t(c, a);
  CHECK(t.current() == 1);
  CHECK(t.choose() == 1);  // nothing observed
  CHECK(t.predictions().empty());

  // Observed groups: lengths drawn from the simulator's own lognormal law for this shape.
  std::vector<std::int64_t> g(4);
  for (std::int64_t gid = 0; gid < 64; ++gid) {
    for (std::int32_t k = 0; k < 4; ++k) g[static_cast<std::size_t>(k)] = ulorl::simulated_length(c, gid, k);
    t.observe_group(g);
    if (gid == 2) CHECK(t.choose() == 1);  // 3 groups < min_groups (and no costs yet)
  }
  CHECK(t.observed_groups() == 64);
  CHECK(t.choose() == 1);  // costs unknown
  t.observe_costs(c.engine, c.trainer);
  const auto chosen = t.choose();

  // What the tuner must have predicted: the fixed counts simulated on exactly those groups and costs.
  auto ref = c;
  ref.lengths.empirical = t.state().lengths;
  ref.lengths.empirical_grouped = true;
  ref.warmup_steps = a.simulated_warmup;
  ref.measured_steps = a.simulated_steps;
  const auto [best, best_time] = best_fixed(ref, a.candidates);
  REQUIRE(t.predictions().size() == 4);
  for (const auto& p : t.predictions())
    CHECK(p.step_time == ulorl::simulate_segment_rollout(ref, p.segments).step_time);
  const double one = ulorl::simulate_segment_rollout(ref, 1).step_time;
  CHECK(chosen == (best_time < one * (1 - a.min_gain) ? best : 1));
  CHECK(chosen > 1);  // this engine is latency-bound and the tail long: segments pay
  CHECK(t.state().decisions == 1);
}

TEST_CASE("segment_autotuner: hysteresis, window and observation checks", "[rollout][autotune]") {
  auto c = small_config();
  // Every response the same length: no tail, so every count predicts the same time (or 1 is best,
  // since resumes cost a rebuild); the tuner never leaves its count for a gain below min_gain.
  ulorl::segment_autotune_config a{.candidates = {4, 1, 2}, .initial = 4, .min_groups = 1, .window_groups = 3};
  ulorl::segment_autotuner t(c, a);
  t.observe_costs(c.engine, c.trainer);
  const std::vector<std::int64_t> flat{300, 300, 300, 300};
  t.observe_group(flat);
  const auto n = t.choose();
  // 300 tokens fit one segment of L_max / 4 = 500: every count runs the same iterations.
  CHECK(n == 4);
  const auto& p = t.predictions();
  REQUIRE(p.size() == 3);
  CHECK(p[0].step_time == p[1].step_time);
  CHECK(p[1].step_time == p[2].step_time);

  // The window keeps the most recent window_groups groups, oldest first.
  for (std::int64_t L = 1; L <= 5; ++L) t.observe_group(std::vector<std::int64_t>(4, L));
  CHECK(t.observed_groups() == 3);
  CHECK(t.state().lengths.front() == 3);
  CHECK(t.state().lengths.back() == 5);

  const auto before = t.state().lengths;
  CHECK_THROWS_WITH(t.observe_group(std::vector<std::int64_t>(3, 10)), Catch::Contains("lengths"));
  CHECK_THROWS_WITH(t.observe_group(std::vector<std::int64_t>{10, 0, 10, 10}), Catch::Contains("[1]"));
  CHECK(t.state().lengths == before);  // nothing recorded on error
  auto bad_engine = c.engine;
  bad_engine.iteration_s = -1;
  CHECK_THROWS_WITH(t.observe_costs(bad_engine, c.trainer), Catch::Contains("engine.iteration_s"));
  CHECK(t.state().engine.iteration_s == c.engine.iteration_s);
}

TEST_CASE("segment_autotuner: configuration and state validation, state round trip", "[rollout][autotune]") {
  const auto c = small_config();
  using A = ulorl::segment_autotune_config;
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.candidates = {}}), Catch::Contains("config.candidates"));
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.candidates = {1, 0}}), Catch::Contains("config.candidates"));
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.candidates = {1, 2001}}), Catch::Contains("config.candidates"));
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.candidates = {1, 2, 1}}), Catch::Contains("listed twice"));
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.candidates = {2, 4}, .initial = 1}), Catch::Contains("config.initial"));
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.min_groups = 0}), Catch::Contains("config.min_groups"));
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.min_groups = 9, .window_groups = 8}), Catch::Contains("config.min_groups"));
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.window_groups = 0}), Catch::Contains("config.window_groups"));
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.simulated_steps = 0}), Catch::Contains("config.simulated_steps"));
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.simulated_warmup = -1}), Catch::Contains("config.simulated_warmup"));
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.min_gain = 1.0}), Catch::Contains("config.min_gain"));
  auto bad = c;
  bad.group_size = 0;
  CHECK_THROWS_WITH(ulorl::segment_autotuner(bad, A{}), Catch::Contains("group_size"));

  // Round trip: a tuner rebuilt from another's state decides the same from then on.
  const A a{.candidates = {1, 2, 4, 8}, .min_groups = 4, .window_groups = 32};
  ulorl::segment_autotuner t(c, a);
  t.observe_costs(c.engine, c.trainer);
  std::vector<std::int64_t> g(4);
  for (std::int64_t gid = 0; gid < 20; ++gid) {
    for (std::int32_t k = 0; k < 4; ++k) g[static_cast<std::size_t>(k)] = ulorl::simulated_length(c, gid, k);
    t.observe_group(g);
  }
  (void)t.choose();
  ulorl::segment_autotuner u(c, a, t.state());
  for (std::int64_t gid = 20; gid < 40; ++gid) {
    for (std::int32_t k = 0; k < 4; ++k) g[static_cast<std::size_t>(k)] = 7 * ulorl::simulated_length(c, gid, k) / 4 + 1;
    t.observe_group(g);
    u.observe_group(g);
    CHECK(t.choose() == u.choose());
  }
  CHECK(t.state().lengths == u.state().lengths);
  CHECK(t.state().decisions == u.state().decisions);

  auto s = t.state();
  s.current = 3;
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, a, s), Catch::Contains("state.current"));
  s = t.state();
  s.lengths.pop_back();
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, a, s), Catch::Contains("state.lengths"));
  s = t.state();
  s.lengths[5] = 0;
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, a, s), Catch::Contains("[5]"));
  s = t.state();
  s.lengths.insert(s.lengths.end(), 4 * 33, 10);  // more than window_groups groups
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, a, s), Catch::Contains("state.lengths"));
  s = t.state();
  s.engine.prefill_token_s = -1;
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, a, s), Catch::Contains("engine.prefill_token_s"));
  s = t.state();
  s.decisions = -1;
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, a, s), Catch::Contains("state.decisions"));
}

TEST_CASE("segment_autotuner: a base that cannot be simulated is refused by the constructor, naming its field",
          "[rollout][autotune][errors]") {
  using A = ulorl::segment_autotune_config;
  const auto refused = [](auto change, const char* field) {
    auto c = small_config();
    change(c);
    CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{}), Catch::Contains(std::string("segment_autotuner: argument '") + field + "'"));
    CHECK_THROWS_WITH(ulorl::simulate_segment_rollout_auto(c, A{}), Catch::Contains(std::string("'") + field + "'"));
  };
  refused([](auto& c) { c.prompts_per_step = std::int64_t{1} << 40; }, "prompts_per_step");
  refused([](auto& c) { c.group_size = (1 << 20) + 1; }, "group_size");
  refused([](auto& c) { c.max_response_tokens = std::int64_t{1} << 50; }, "max_response_tokens");
  refused([](auto& c) { c.engine.iteration_s = 1e-320; }, "engine.iteration_s");
  // The base's own step counts fit, the tuner's (4096 + 4096 simulated steps) do not: refused now,
  // not at the first choose().
  auto c = small_config();
  c.warmup_steps = 0;
  c.measured_steps = 1;
  c.prompts_per_step = 1 << 10;
  c.max_response_tokens = std::int64_t{1} << 40;  // (3 * 2^10 * 4 + 2^10 * 4) * 2^40 = 2^54 tokens
  CHECK_NOTHROW(ulorl::segment_autotuner(c, A{}));  // 12 + 2 simulated steps: 68 * 2^52 tokens
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, A{.simulated_steps = 4096, .simulated_warmup = 4096}),
                    Catch::Contains("'max_response_tokens'"));
}

TEST_CASE("simulate_segment_rollout_auto: within a few percent of the best fixed count, whichever it is",
          "[rollout][autotune]") {
  // docs/segment_rollout.md's sensitivity rows at a smaller scale (L_max 4096, 16 prompts x 8), where
  // the best fixed count differs: the tuner, which starts at 1 segment and knows neither the best
  // count nor the length law, must come within 5 % of the best fixed count's step time over the
  // measured steps, and beat 1 segment wherever some count does by more than 10 %.
  struct row {
    const char* name;
    double median_fraction, prefill_us, iteration_ms, train_token_us;
  };
  const std::vector<row> rows{{"preset", 0.2, 0.5, 15, 4},     {"expensive resume", 0.2, 40, 15, 4},
                              {"short responses", 0.1, 0.5, 15, 4}, {"long responses", 0.35, 0.5, 15, 4},
                              {"less latency-bound", 0.2, 0.5, 1, 4}, {"slow trainer", 0.2, 0.5, 15, 40},
                              {"costly resume, long responses", 0.35, 200, 15, 4}};
  const std::vector<std::int32_t> candidates{1, 2, 4, 8, 16};
  std::vector<std::int32_t> bests;
  for (const auto& r : rows) {
    INFO(r.name);
    auto c = ulorl::rollout_sim_preset("ulorl-64k");
    c.max_response_tokens = 4096;
    c.prompts_per_step = 16;
    c.warmup_steps = 4;
    c.measured_steps = 16;
    c.lengths.median_fraction = r.median_fraction;
    c.engine.prefill_token_s = r.prefill_us * 1e-6;
    c.engine.iteration_s = r.iteration_ms * 1e-3;
    c.trainer.per_token_s = r.train_token_us * 1e-6;
    c.trainer.per_step_s = 2.0;
    const auto [best, best_time] = best_fixed(c, candidates);
    bests.push_back(best);
    const double one = ulorl::simulate_segment_rollout(c, 1).step_time;
    const auto a = ulorl::simulate_segment_rollout_auto(
        c, {.candidates = candidates, .initial = 1, .min_groups = 16, .window_groups = 256});
    INFO("best fixed " << best << ": " << best_time << " s; auto: " << a.step_time << " s, final count "
                       << a.final_segments << "; 1 segment " << one << " s");
    CHECK(a.segments == 0);
    CHECK(a.step_time <= best_time * 1.05);
    if (best_time < one * 0.9) CHECK(a.step_time < one * 0.95);
  }
  // The rows do need different counts (else the test would not show adaptation).
  std::sort(bests.begin(), bests.end());
  CHECK(std::unique(bests.begin(), bests.end()) - bests.begin() >= 3);
}

TEST_CASE("segment_autotuner: the decision counter stops at its limit; the state there restores and round-trips",
          "[rollout][autotune][errors]") {
  using A = ulorl::segment_autotune_config;
  const auto c = small_config();
  const A a{.candidates = {1, 2}, .min_groups = 1, .window_groups = 4, .simulated_steps = 2, .simulated_warmup = 0};
  ulorl::segment_autotuner t(c, a);
  t.observe_costs(c.engine, c.trainer);
  std::vector<std::int64_t> g{100, 200, 300, 400};
  t.observe_group(g);
  auto s = t.state();
  constexpr std::int64_t limit = std::numeric_limits<std::int64_t>::max();  // 2^63 - 1
  s.decisions = limit - 1;
  ulorl::segment_autotuner u(c, a, s);  // any count below the limit is accepted
  (void)u.choose();
  CHECK(u.state().decisions == limit);
  // At the limit the tuner's own state restores ...
  ulorl::segment_autotuner v(c, a, u.state());
  CHECK(v.state().decisions == limit);
  // ... and a decision that would pass it is refused, naming the counter, with nothing changed.
  const auto before = v.state();
  const std::vector<ulorl::segment_prediction> predictions(v.predictions().begin(), v.predictions().end());
  CHECK_THROWS_WITH(v.choose(), Catch::Contains("segment_autotuner::choose") && Catch::Contains("state.decisions") &&
                                    Catch::Contains("2^63 - 1"));
  CHECK(v.state().decisions == before.decisions);
  CHECK(v.state().current == before.current);
  CHECK(v.predictions().size() == predictions.size());
  // Observing still works, and the state still restores.
  v.observe_group(g);
  CHECK_NOTHROW(ulorl::segment_autotuner(c, a, v.state()));
  // Before min_groups or the costs are known choose() decides nothing and counts nothing.
  ulorl::segment_autotuner w(c, a);
  auto ws = w.state();
  ws.decisions = limit;
  ulorl::segment_autotuner x(c, a, ws);
  CHECK(x.choose() == a.initial);
  CHECK(x.state().decisions == limit);
}

TEST_CASE("segment_autotuner: observed lengths are bounded as the simulator bounds them, so choose() can always decide",
          "[rollout][autotune][errors]") {
  using A = ulorl::segment_autotune_config;
  const auto c = small_config();
  const A a{.candidates = {1, 2}, .min_groups = 1, .window_groups = 4, .simulated_steps = 2, .simulated_warmup = 0};
  constexpr std::int64_t most = std::int64_t{1} << 62;  // rollout_sim_limits::max_empirical_length
  ulorl::segment_autotuner t(c, a);
  t.observe_costs(c.engine, c.trainer);
  CHECK_THROWS_WITH(t.observe_group(std::vector<std::int64_t>{10, most + 1, 10, 10}),
                    Catch::Contains("segment_autotuner::observe_group") && Catch::Contains("'lengths'[1]"));
  CHECK(t.observed_groups() == 0);
  t.observe_group(std::vector<std::int64_t>{10, most, 10, std::int64_t{1} << 40});  // truncated, however long
  CHECK_NOTHROW(t.choose());
  CHECK(t.state().decisions == 1);
  auto s = t.state();
  s.lengths[2] = most + 1;
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, a, s), Catch::Contains("'state.lengths'[2]"));
  s.lengths[2] = std::numeric_limits<std::int64_t>::max();
  CHECK_THROWS_WITH(ulorl::segment_autotuner(c, a, s), Catch::Contains("'state.lengths'[2]"));
}
