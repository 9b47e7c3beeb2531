// Tests of the segment-rollout simulator (ulorl/rollout/simulator.hpp): the ulorl-64k preset
// reproduces the paper's speedups (UloRL, Qwen3-30B-A3B, 64k: 1240 s / 774 s / 601 s per step,
// i.e. 1.6x and 2.06x) within +-15%; the cost model matches closed forms worked out by hand.
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "catch.hpp"
#include "ulorl/rollout/simulator.hpp"

TEST_CASE("ulorl-64k preset reproduces the paper's segment-rollout speedups within 15%", "[rollout][simulator]") {
  const auto cfg = ulorl::rollout_sim_preset("ulorl-64k");
  const std::int32_t segs[] = {1, 2, 4};
  const auto runs = ulorl::simulate_segment_rollouts(cfg, segs);
  REQUIRE(runs.size() == 3);
  CHECK(runs[0].speedup == 1.0);
  const double paper2 = 1240.0 / 774.0, paper4 = 1240.0 / 601.0;  // 1.60x and 2.06x
  CHECK(std::abs(runs[1].speedup / paper2 - 1.0) <= 0.15);
  CHECK(std::abs(runs[2].speedup / paper4 - 1.0) <= 0.15);
  // The absolute scale is calibrated too (synchronous step of the paper: 1240 s).
  CHECK(std::abs(runs[0].step_time / 1240.0 - 1.0) <= 0.15);
  // Segments cut the long-tail waste; 1 segment is on-policy, more segments add staleness.
  CHECK(runs[2].tail_idle_fraction < runs[1].tail_idle_fraction);
  CHECK(runs[1].tail_idle_fraction < runs[0].tail_idle_fraction);
  CHECK(runs[0].mean_lag == 0.0);
  CHECK(runs[0].max_lag == 0);
  CHECK(runs[2].mean_lag > 0.0);
  CHECK(runs[2].max_lag <= 4);  // a response spans at most n_seg decode steps (+ the barrier wait)
  for (const auto& r : runs) {
    CHECK(r.tokens_per_s > 0);
    CHECK(r.idle_fraction > 0);
    CHECK(r.idle_fraction < 1);
    CHECK(r.truncated_fraction > 0);  // a long tail reaches the limit
    CHECK(r.truncated_fraction < 0.1);
  }
  // The same prompts are seen by every configuration, so the trained lengths agree closely.
  CHECK(std::abs(runs[2].mean_response_tokens / runs[0].mean_response_tokens - 1.0) < 0.05);
}

namespace {

// 5 prompts x 3 responses of 611 tokens after 37 prompt tokens, L_max 1000, small exact costs.
ulorl::rollout_sim_config closed_form_config() {
  ulorl::rollout_sim_config c;
  c.max_response_tokens = 1000;
  c.prompt_tokens = 37;
  c.group_size = 3;
  c.prompts_per_step = 5;
  c.warmup_steps = 1;
  c.measured_steps = 3;
  c.lengths.empirical = {611};
  c.engine = {.iteration_s = 1e-3, .per_sequence_s = 2e-5, .per_context_token_s = 3e-8, .prefill_token_s = 1e-5};
  c.trainer = {.per_token_s = 7e-5, .per_step_s = 0.5};
  return c;
}

}  // namespace

TEST_CASE("simulator: synchronous rollout of equal lengths matches the closed form", "[rollout][simulator]") {
  auto c = closed_form_config();
  const double B = 15, P = 37, l = 611;
  const double decode = l * (1e-3 + 2e-5 * B + 3e-8 * B * P) + 3e-8 * B * l * (l - 1) / 2;
  const double prefill = 1e-5 * B * P;
  const double train = 0.5 + 7e-5 * B * (l + P);
  const auto r = ulorl::simulate_segment_rollout(c, 1);
  CHECK(r.step_time == Approx(decode + prefill + train).epsilon(1e-12));
  CHECK(r.rollout_time == Approx(decode + prefill).epsilon(1e-12));
  CHECK(r.train_time == Approx(train).epsilon(1e-12));
  CHECK(r.idle_fraction == Approx(1 - decode / (decode + prefill + train)).epsilon(1e-12));
  CHECK(r.tail_idle_fraction == Approx(0.0).margin(1e-12));
  CHECK(r.tokens_per_s == Approx(B * l / (decode + prefill + train)).epsilon(1e-12));
  CHECK(r.truncated_fraction == 0.0);

  // Without length variance there is no tail to cut: when every response fits one segment,
  // 2 segments behave exactly like 1.
  c.lengths.empirical = {500};
  const auto one = ulorl::simulate_segment_rollout(c, 1);
  const auto two = ulorl::simulate_segment_rollout(c, 2);
  CHECK(two.step_time == Approx(one.step_time).epsilon(1e-12));
  CHECK(two.mean_lag == 0.0);

  // All truncated: 4 segments pay the same decode work plus the KV rebuilds on every resume.
  c.lengths.empirical = {5000};
  const auto s1 = ulorl::simulate_segment_rollout(c, 1);
  const auto s4 = ulorl::simulate_segment_rollout(c, 4);
  CHECK(s1.truncated_fraction == 1.0);
  CHECK(s4.truncated_fraction == 1.0);
  CHECK(s4.step_time > s1.step_time);
  // Resumes at 250, 500, 750 tokens rebuild (P + t) tokens each: B * (3P + 1500) extra prefill.
  CHECK(s4.rollout_time - s1.rollout_time == Approx(1e-5 * B * (3 * P + 1500)).epsilon(1e-9));
}

TEST_CASE("simulator: grouped empirical lengths keep each recorded group whole", "[rollout][simulator]") {
  ulorl::rollout_sim_config c;
  c.max_response_tokens = 1000;
  c.group_size = 3;
  // Three recorded groups with distinct lengths: a simulated group must be one of them, in order.
  c.lengths.empirical = {10, 11, 12, 500, 501, 502, 2000, 2001, 2002};
  c.lengths.empirical_grouped = true;
  std::array<int, 3> seen{};
  for (std::int64_t g = 0; g < 300; ++g) {
    const auto first = ulorl::simulated_length(c, g, 0);
    const auto row = first == 10 ? 0 : first == 500 ? 1 : first == 2000 ? 2 : -1;
    REQUIRE(row >= 0);
    ++seen[static_cast<std::size_t>(row)];
    CHECK(ulorl::simulated_length(c, g, 1) == first + 1);
    CHECK(ulorl::simulated_length(c, g, 2) == first + 2);
  }
  for (const int n : seen) CHECK(n > 50);  // every recorded group is drawn (expected 100 each)
  // Per-response bootstrap of the same list mixes groups: some group gets lengths of two rows.
  c.lengths.empirical_grouped = false;
  bool mixed = false;
  for (std::int64_t g = 0; g < 50 && !mixed; ++g)
    mixed = ulorl::simulated_length(c, g, 0) / 100 != ulorl::simulated_length(c, g, 1) / 100;
  CHECK(mixed);
  // A run with grouped lengths: the mean response length is the recorded groups' (truncated at L_max).
  c.lengths.empirical_grouped = true;
  c.prompts_per_step = 4;
  c.warmup_steps = 0;
  c.measured_steps = 30;
  const auto r = ulorl::simulate_segment_rollout(c, 1);
  CHECK(r.truncated_fraction > 0.2);
  CHECK(r.truncated_fraction < 0.47);
  // Not whole groups, or no lengths at all: refused by name.
  auto bad = c;
  bad.lengths.empirical = {10, 11, 12, 500};
  CHECK_THROWS_WITH(ulorl::simulate_segment_rollout(bad, 1), Catch::Contains("lengths.empirical"));
  CHECK_THROWS_WITH(ulorl::simulated_length(bad, 0, 0), Catch::Contains("lengths.empirical"));
  bad.lengths.empirical.clear();
  CHECK_THROWS_WITH(ulorl::simulate_segment_rollout(bad, 1), Catch::Contains("lengths.empirical"));
  CHECK_THROWS_AS(ulorl::simulated_length(bad, 0, 0), ulorl::error);
  CHECK_THROWS_AS(ulorl::simulated_length(c, 0, 3), ulorl::error);
}

TEST_CASE("simulator: padded attention reads b x the longest context", "[rollout][simulator]") {
  auto c = closed_form_config();
  // One segment, equal lengths: every row has the same context, so padding reads nothing more.
  const auto plain = ulorl::simulate_segment_rollout(c, 1);
  c.engine.padded_kv = true;
  const auto padded = ulorl::simulate_segment_rollout(c, 1);
  CHECK(padded.step_time == Approx(plain.step_time).epsilon(1e-12));
  // Two lengths, 2 segments: resumed rows (context 37 + 500) share iterations with new ones
  // (context 37), whose reads padding raises to the longest row's.
  c.lengths.empirical = {900, 900, 900, 100, 100, 100};
  c.lengths.empirical_grouped = true;
  c.engine.padded_kv = false;
  const auto plain2 = ulorl::simulate_segment_rollout(c, 2);
  c.engine.padded_kv = true;
  const auto padded2 = ulorl::simulate_segment_rollout(c, 2);
  CHECK(padded2.rollout_time > plain2.rollout_time * 1.01);
  CHECK(padded2.train_time == Approx(plain2.train_time).epsilon(1e-12));
  // Without a context cost, padding changes nothing.
  c.engine.per_context_token_s = 0;
  const auto free_kv = ulorl::simulate_segment_rollout(c, 2);
  c.engine.padded_kv = false;
  CHECK(ulorl::simulate_segment_rollout(c, 2).step_time == Approx(free_kv.step_time).epsilon(1e-12));
}

TEST_CASE("simulator: the engine's capacity", "[rollout][simulator]") {
  auto c = ulorl::rollout_sim_preset("ulorl-64k");
  c.prompts_per_step = 8;
  c.measured_steps = 6;
  // 0 means prompts_per_step * G: the same run as that capacity given explicitly.
  const auto implicit = ulorl::simulate_segment_rollout(c, 2);
  c.engine_capacity = c.prompts_per_step * c.group_size;
  const auto explicit_ = ulorl::simulate_segment_rollout(c, 2);
  CHECK(explicit_.step_time == implicit.step_time);
  CHECK(explicit_.mean_lag == implicit.mean_lag);
  // Twice the capacity keeps more responses in flight: a different (here longer-lagged) run.
  c.engine_capacity = 2 * c.prompts_per_step * c.group_size;
  const auto twice = ulorl::simulate_segment_rollout(c, 2);
  CHECK(twice.step_time != implicit.step_time);
  CHECK(twice.mean_lag > implicit.mean_lag);
  for (const std::int64_t bad : {std::int64_t{-1}, std::int64_t{7}, std::int64_t{1} << 31}) {
    c.engine_capacity = bad;
    CHECK_THROWS_WITH(ulorl::simulate_segment_rollout(c, 1), Catch::Contains("engine_capacity"));
  }
}

TEST_CASE("simulator: deterministic, and rejects bad parameters", "[rollout][simulator]") {
  auto c = ulorl::rollout_sim_preset("ulorl-64k");
  c.measured_steps = 3;
  const auto a = ulorl::simulate_segment_rollout(c, 4);
  const auto b = ulorl::simulate_segment_rollout(c, 4);
  CHECK(a.step_time == b.step_time);
  CHECK(a.mean_lag == b.mean_lag);
  CHECK_THROWS_AS(ulorl::simulate_segment_rollout(c, 0), ulorl::error);
  CHECK_THROWS_AS(ulorl::rollout_sim_preset("nope"), ulorl::error);
  auto bad = c;
  bad.engine.iteration_s = -1;
  CHECK_THROWS_AS(ulorl::simulate_segment_rollout(bad, 1), ulorl::error);
  bad = c;
  bad.lengths.empirical = {10, 0};
  CHECK_THROWS_AS(ulorl::simulate_segment_rollout(bad, 1), ulorl::error);
  bad = c;
  bad.measured_steps = 0;
  CHECK_THROWS_AS(ulorl::simulate_segment_rollout(bad, 1), ulorl::error);
  bad = c;
  bad.lengths.median_fraction = 0;
  CHECK_THROWS_AS(ulorl::simulate_segment_rollout(bad, 1), ulorl::error);
}

TEST_CASE("simulator: lengths follow the documented lognormal", "[rollout][simulator]") {
  const auto c = ulorl::rollout_sim_preset("ulorl-64k");
  std::vector<double> logs;
  for (std::int64_t g = 0; g < 4000; ++g)
    for (std::int32_t k = 0; k < 8; ++k) logs.push_back(std::log(static_cast<double>(ulorl::simulated_length(c, g, k))));
  double mean = 0;
  for (const double x : logs) mean += x;
  mean /= static_cast<double>(logs.size());
  double var = 0;
  for (const double x : logs) var += (x - mean) * (x - mean);
  var /= static_cast<double>(logs.size() - 1);
  const double want_mean = std::log(c.lengths.median_fraction * 65536.0);
  const double want_var = c.lengths.prompt_sigma * c.lengths.prompt_sigma + c.lengths.response_sigma * c.lengths.response_sigma;
  CHECK(std::abs(mean - want_mean) < 0.05);
  CHECK(std::abs(var / want_var - 1.0) < 0.08);
}

TEST_CASE("simulator: every configuration value is bounded up front, naming the field", "[rollout][simulator][errors]") {
  const auto base = closed_form_config();
  const auto rejects = [&](auto change, const char* field) {
    auto c = base;
    change(c);
    CHECK_THROWS_WITH(ulorl::simulate_segment_rollout(c, 1), Catch::Contains(std::string("'") + field + "'"));
  };
  // Counts whose sums and products (batch responses, steps, offered prompts, the loop's guard) would overflow.
  rejects([](auto& c) { c.prompts_per_step = std::int64_t{1} << 62; }, "prompts_per_step");
  rejects([](auto& c) { c.prompts_per_step = (std::int64_t{1} << 31) / 3 + 1; }, "prompts_per_step");  // * G = 3 > 2^31 - 1
  rejects([](auto& c) { c.measured_steps = INT64_MAX; }, "measured_steps");
  rejects([](auto& c) { c.measured_steps = (std::int64_t{1} << 20) + 1; }, "measured_steps");
  rejects([](auto& c) { c.warmup_steps = std::int64_t{1} << 61; }, "warmup_steps");
  rejects([](auto& c) { c.max_response_tokens = std::int64_t{1} << 50; }, "max_response_tokens");
  rejects([](auto& c) { c.prompt_tokens = (std::int64_t{1} << 40) + 1; }, "prompt_tokens");
  rejects([](auto& c) { c.group_size = (1 << 20) + 1; }, "group_size");
  rejects(
      [](auto& c) {
        c.group_size = 1;
        c.prompts_per_step = (std::int64_t{1} << 31) - 1;
        c.measured_steps = 1 << 20;  // (2^20 + 3) * (2^31 - 1) groups > 2^41
      },
      "prompts_per_step");
  rejects(
      [](auto& c) {
        c.max_response_tokens = std::int64_t{1} << 40;
        c.prompts_per_step = 1 << 17;  // (6 * 2^17 * 3 + 2^17 * 3) * 2^40 = 21 * 2^57 > 2^61 tokens
      },
      "max_response_tokens");
  // Lengths: bounded spreads, no NaN from exp(inf - inf).
  rejects([](auto& c) { c.lengths.median_fraction = 2e6; }, "lengths.median_fraction");
  rejects([](auto& c) { c.lengths.prompt_sigma = 1e308; }, "lengths.prompt_sigma");
  rejects([](auto& c) { c.lengths.response_sigma = 101; }, "lengths.response_sigma");
  rejects([](auto& c) { c.lengths.empirical = {5, (std::int64_t{1} << 62) + 1}; }, "lengths.empirical");
  // Costs: 0 or in [1e-18, 1e6] s; a denormal divisor (1 / 1e-320 = inf) would make the rates infinite.
  rejects([](auto& c) { c.engine.iteration_s = 1e-320; }, "engine.iteration_s");
  rejects([](auto& c) { c.engine.per_sequence_s = 1e7; }, "engine.per_sequence_s");
  rejects([](auto& c) { c.engine.per_context_token_s = std::numeric_limits<double>::infinity(); }, "engine.per_context_token_s");
  rejects([](auto& c) { c.engine.prefill_token_s = std::numeric_limits<double>::quiet_NaN(); }, "engine.prefill_token_s");
  rejects([](auto& c) { c.trainer.per_token_s = 4e-324; }, "trainer.per_token_s");
  rejects([](auto& c) { c.trainer.per_step_s = -1; }, "trainer.per_step_s");
  rejects([](auto& c) { c.trainer = {.per_token_s = 0, .per_step_s = 0}; }, "trainer");

  // At the limits the rates stay finite: the smallest costs, a training step of 1e-18 s.
  auto c = base;
  c.engine = {.iteration_s = 1e-18, .per_sequence_s = 0, .per_context_token_s = 0, .prefill_token_s = 0};
  c.trainer = {.per_token_s = 0, .per_step_s = 1e-18};
  const auto r = ulorl::simulate_segment_rollout(c, 2);
  CHECK(std::isfinite(r.tokens_per_s));
  CHECK(r.tokens_per_s > 0);
  CHECK(std::isfinite(r.step_time));
  CHECK(std::isfinite(r.idle_fraction));
}

TEST_CASE("simulator: simulated_length stays in [1, 1e15] for any spread", "[rollout][simulator]") {
  auto c = closed_form_config();
  c.lengths.empirical.clear();
  c.lengths.prompt_sigma = c.lengths.response_sigma = 1e308;  // beyond the limits: d + e may be inf - inf
  for (std::int64_t g = 0; g < 64; ++g)
    for (std::int32_t k = 0; k < 3; ++k) {
      const auto n = ulorl::simulated_length(c, g, k);
      CHECK(n >= 1);
      CHECK(n <= 1000000000000000);
    }
}
