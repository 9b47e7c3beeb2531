// ulorl/rollout/simulator.hpp — a discrete-event model of UloRL segment rollout (Du et al. 2025,
// arXiv:2507.19766, Table "time per step for 1/2/4 segments") driven by the real segment_scheduler.
//
// Model (all parameters documented in docs/segment_rollout.md):
//  * decode engine, continuous batching, one iteration emits one token for each of the b running
//    sequences with total context C:          tau(b, C) = t_iter + t_seq * b + t_kv * C
//    (t_iter: weights/expert reads, launch and collective latency, paid per iteration whatever b;
//     t_seq: per-sequence compute and sampling; t_kv: attention reading one cached token); with
//    padded_kv, attention reads b * C_max (every row padded to the longest) instead of C;
//  * a resumed response rebuilds its KV cache under the new weights: t_prefill * (prompt + tokens);
//    a new response prefills its prompt;
//  * trainer (colocated, synchronous): t_step + t_token * (prompt + response tokens) per batch of
//    `prompts_per_step` whole groups; the engine is idle while it trains; then the policy version
//    increments;
//  * response lengths: per prompt a difficulty d ~ N(0, prompt_sigma), per response
//    log L = log(median_fraction * L_max) + d + N(0, response_sigma), rounded, >= 1; L > L_max is a
//    truncated response. Or bootstrap from a user's list of lengths.
// One "training step" trains on exactly prompts_per_step groups (release_batch_groups); with n
// segments several rollout steps of L_max / n iterations may precede it. Every configuration sees
// the same lengths for the same prompt (common random numbers), so speedups have little noise.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/rollout/segment_scheduler.hpp"

ULORL_NAMESPACE_BEGIN

//! Response-length distribution of the simulator.
struct length_model {
  double median_fraction = 0.2;   //!< median response length / L_max
  double prompt_sigma = 0.65;     //!< log-std of the per-prompt difficulty (shared by a group)
  double response_sigma = 0.45;   //!< log-std of a response around its prompt's difficulty
  std::vector<std::int64_t> empirical;  //!< non-empty: bootstrap lengths from this list instead
  //! empirical holds whole groups (group_size consecutive lengths each, e.g. one recorded rollout's
  //! released groups): a simulated group draws one recorded group and response k takes its k-th
  //! length, so the per-prompt correlation of lengths is kept. false: each response draws one length.
  bool empirical_grouped = false;
};

//! Decode engine: tau(b, C) = iteration_s + per_sequence_s * b + per_context_token_s * C.
struct decode_engine_model {
  double iteration_s = 15.0e-3;          //!< fixed cost of one decode iteration
  double per_sequence_s = 1.0e-6;        //!< per running sequence per iteration
  double per_context_token_s = 3.0e-10;  //!< per cached context token read per iteration
  double prefill_token_s = 0.5e-6;       //!< per token prefilled (prompt, or KV rebuilt on resume)
  bool rebuild_kv_on_resume = true;      //!< a paused response's KV cache is recomputed after a policy update
  //! Attention reads every row up to the longest context in the batch (an engine without paged or
  //! ragged attention): the context term is per_context_token_s * b * C_max instead of * sum C.
  bool padded_kv = false;
};

//! Trainer (colocated with the engine, synchronous): per_step_s + per_token_s * trained tokens.
struct trainer_model {
  double per_token_s = 4.0e-6;   //!< old-log-prob recomputation (POIS) + reference + forward/backward
  double per_step_s = 20.0;      //!< optimizer step, weight sync to the engine
};

//! Limits of the simulator's configuration (docs/segment_rollout.md §7, "Limits"), checked up front
//! by every simulation and by segment_autotuner's constructor, each naming the field: with them no
//! count, sum or product the simulation forms overflows, and every reported rate is finite.
struct rollout_sim_limits {
  //! warmup_steps and measured_steps, each.
  static constexpr std::int64_t max_steps = std::int64_t{1} << 20;
  static constexpr std::int64_t max_prompt_tokens = std::int64_t{1} << 40;
  //! prompts_per_step * group_size: a training batch's responses are live at once.
  static constexpr std::int64_t max_batch_responses = segment_scheduler_limits::max_live_responses;
  //! (warmup_steps + measured_steps + 2) * prompts_per_step: the prompts the run trains on (2^41,
  //! half the scheduler's offered-groups limit, which leaves room for the ones in flight).
  static constexpr std::int64_t max_run_groups = std::int64_t{1} << 41;
  //! ((warmup_steps + measured_steps + 2) * prompts_per_step + capacity) * group_size *
  //! max_response_tokens: every token the run can generate (the scheduler counts up to 2^62).
  static constexpr double max_run_tokens = 0x1p61;
  //! Every cost is 0 or in [min_cost_s, max_cost_s] seconds: a nonzero cost has a finite
  //! reciprocal, so throughput (tokens / seconds) stays finite.
  static constexpr double min_cost_s = 1e-18;
  static constexpr double max_cost_s = 1e6;
  static constexpr double max_median_fraction = 1e6;  //!< lengths.median_fraction in (0, 1e6]
  static constexpr double max_sigma = 100;            //!< lengths.prompt_sigma, response_sigma in [0, 100]
  //! lengths.empirical: each length in [1, 2^62].
  static constexpr std::int64_t max_empirical_length = segment_scheduler_limits::max_count;
};

struct rollout_sim_config {
  std::int64_t max_response_tokens = 65536;  //!< L_max
  std::int64_t prompt_tokens = 1024;
  std::int32_t group_size = 8;               //!< G
  std::int64_t prompts_per_step = 128;       //!< groups per training batch
  //! Responses the engine holds at once (the scheduler's max_active_responses): 0 = prompts_per_step * G,
  //! else >= G.
  std::int64_t engine_capacity = 0;
  std::int64_t warmup_steps = 4;             //!< training steps before measuring (pipeline fill)
  std::int64_t measured_steps = 12;
  std::uint64_t seed = 1;
  length_model lengths{};
  decode_engine_model engine{};
  trainer_model trainer{};
};

struct rollout_sim_result {
  std::int32_t segments = 1;
  double step_time = 0;            //!< seconds per training step (steady state)
  double speedup = 1;              //!< step_time(1 segment) / step_time
  double tokens_per_s = 0;         //!< trained response tokens per second of wall time
  double idle_fraction = 0;        //!< engine sequence-slot time not decoding (tail, prefill, training)
  double tail_idle_fraction = 0;   //!< the same, counted over decode iterations only (long-tail waste)
  double rollout_time = 0;         //!< seconds of engine work (decode + prefill) per training step
  double train_time = 0;           //!< seconds of training per training step
  double rollout_steps_per_train_step = 0;
  double mean_response_tokens = 0;
  double truncated_fraction = 0;
  double mean_lag = 0;             //!< policy versions between a response's first token and its training
  std::int64_t max_lag = 0;
  std::int64_t lag_histogram[4] = {0, 0, 0, 0};  //!< responses with lag 0, 1, 2, >= 3
  double mean_versions_spanned = 0;
  std::int32_t final_segments = 0;  //!< the segment count at the end (the fixed count, or an adaptive policy's last choice)
};

namespace detail {

inline std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline double unit_double(std::uint64_t x) noexcept { return (static_cast<double>(x >> 11) + 0.5) * 0x1.0p-53; }
// A standard normal from a counter (Box-Muller), identical on every platform and standard library.
inline double hashed_normal(std::uint64_t seed, std::uint64_t key) noexcept {
  const double u1 = unit_double(splitmix64(seed ^ splitmix64(2 * key)));
  const double u2 = unit_double(splitmix64(seed ^ splitmix64(2 * key + 1)));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

//! The cost models' checks (also the segment tuner's, for the costs it is given).
//! A cost in seconds: 0, or in [rollout_sim_limits::min_cost_s, max_cost_s].
inline void require_cost(std::string_view fn, std::string_view arg, double v) {
  using lim = rollout_sim_limits;
  if (!(v == 0.0 || (v >= lim::min_cost_s && v <= lim::max_cost_s)))
    fail_value(fn, arg, v, "must be 0 or in [1e-18, 1e6] seconds");
}
inline void validate_costs(std::string_view fn, const decode_engine_model& e, const trainer_model& t) {
  require_cost(fn, "engine.iteration_s", e.iteration_s);
  require_cost(fn, "engine.per_sequence_s", e.per_sequence_s);
  require_cost(fn, "engine.per_context_token_s", e.per_context_token_s);
  require_cost(fn, "engine.prefill_token_s", e.prefill_token_s);
  require_cost(fn, "trainer.per_token_s", t.per_token_s);
  require_cost(fn, "trainer.per_step_s", t.per_step_s);
  if (e.iteration_s + e.per_sequence_s + e.per_context_token_s <= 0) fail(fn, "engine", "a decode iteration must take some time");
  // Every measured step trains a batch: with a positive training time the measured span is
  // positive, so the rates divided by it are finite.
  if (t.per_step_s + t.per_token_s <= 0) fail(fn, "trainer", "a training step must take some time (per_step_s or per_token_s > 0)");
}

inline void validate_sim_config(std::string_view fn, const rollout_sim_config& c) {
  using lim = rollout_sim_limits;
  if (c.max_response_tokens < 1 || c.max_response_tokens > segment_scheduler_limits::max_response_tokens)
    fail_value(fn, "max_response_tokens", c.max_response_tokens, "must be in [1, 2^40]");
  if (c.prompt_tokens < 0 || c.prompt_tokens > lim::max_prompt_tokens)
    fail_value(fn, "prompt_tokens", c.prompt_tokens, "must be in [0, 2^40]");
  if (c.group_size < 1 || c.group_size > segment_scheduler_limits::max_group_size)
    fail_value(fn, "group_size", c.group_size, "must be in [1, 2^20]");
  if (c.prompts_per_step < 1 || c.prompts_per_step > lim::max_batch_responses / c.group_size)
    fail_value(fn, "prompts_per_step", c.prompts_per_step,
               "must be >= 1, and prompts_per_step * group_size (" + std::to_string(c.group_size) + ") <= 2^31 - 1");
  if (c.engine_capacity != 0 && (c.engine_capacity < c.group_size || c.engine_capacity > segment_scheduler_limits::max_response_count))
    fail_value(fn, "engine_capacity", c.engine_capacity, "must be 0 (prompts_per_step * group_size) or in [group_size, 2^31 - 1]");
  if (c.warmup_steps < 0 || c.warmup_steps > lim::max_steps) fail_value(fn, "warmup_steps", c.warmup_steps, "must be in [0, 2^20]");
  if (c.measured_steps < 1 || c.measured_steps > lim::max_steps)
    fail_value(fn, "measured_steps", c.measured_steps, "must be in [1, 2^20]");
  // Bounded above, these products fit an int64 (2^21 * 2^31) and a double exactly enough.
  const std::int64_t run_groups = (c.warmup_steps + c.measured_steps + 2) * c.prompts_per_step;
  if (run_groups > lim::max_run_groups)
    fail_value(fn, "prompts_per_step", c.prompts_per_step, "times (warmup_steps + measured_steps + 2) must be <= 2^41");
  const std::int64_t capacity = c.engine_capacity > 0 ? c.engine_capacity : c.prompts_per_step * c.group_size;
  if ((static_cast<double>(run_groups) * c.group_size + static_cast<double>(capacity)) * static_cast<double>(c.max_response_tokens) >
      lim::max_run_tokens)
    fail_value(fn, "max_response_tokens", c.max_response_tokens,
               "times ((warmup_steps + measured_steps + 2) * prompts_per_step * group_size + engine capacity) must be <= 2^61 "
               "(the tokens the run can generate)");
  if (!(c.lengths.median_fraction > 0 && c.lengths.median_fraction <= lim::max_median_fraction))
    fail_value(fn, "lengths.median_fraction", c.lengths.median_fraction, "must be in (0, 1e6]");
  if (!(c.lengths.prompt_sigma >= 0 && c.lengths.prompt_sigma <= lim::max_sigma))
    fail_value(fn, "lengths.prompt_sigma", c.lengths.prompt_sigma, "must be in [0, 100]");
  if (!(c.lengths.response_sigma >= 0 && c.lengths.response_sigma <= lim::max_sigma))
    fail_value(fn, "lengths.response_sigma", c.lengths.response_sigma, "must be in [0, 100]");
  for (std::size_t i = 0; i < c.lengths.empirical.size(); ++i)
    if (c.lengths.empirical[i] < 1 || c.lengths.empirical[i] > lim::max_empirical_length)
      fail_at(fn, "lengths.empirical", static_cast<std::int64_t>(i), c.lengths.empirical[i], "lengths must be in [1, 2^62]");
  if (c.lengths.empirical_grouped) {
    if (c.lengths.empirical.empty()) fail(fn, "lengths.empirical", "empirical_grouped needs recorded lengths");
    if (c.lengths.empirical.size() % static_cast<std::size_t>(c.group_size) != 0)
      fail_value(fn, "lengths.empirical", static_cast<std::int64_t>(c.lengths.empirical.size()),
                 "empirical_grouped needs a multiple of group_size lengths");
  }
  validate_costs(fn, c.engine, c.trainer);
}

}  // namespace detail

//! The natural length (possibly > L_max, i.e. truncated) of response k of prompt g.
[[nodiscard]] inline std::int64_t simulated_length(const rollout_sim_config& c, std::int64_t group_id, std::int32_t k) {
  const auto G = static_cast<std::uint64_t>(c.group_size);
  const auto rid = static_cast<std::uint64_t>(group_id) * G + static_cast<std::uint64_t>(k);
  if (c.lengths.empirical_grouped) {
    const auto groups = c.lengths.empirical.size() / G;
    if (groups == 0 || c.lengths.empirical.size() % G != 0 || k < 0 || static_cast<std::uint64_t>(k) >= G)
      detail::fail("simulated_length", "lengths.empirical", "empirical_grouped needs whole groups of group_size lengths and 0 <= k < group_size");
    const auto h = detail::splitmix64(c.seed ^ detail::splitmix64(0x6E11ull + static_cast<std::uint64_t>(group_id)));
    return c.lengths.empirical[(h % groups) * G + static_cast<std::uint64_t>(k)];
  }
  if (!c.lengths.empirical.empty()) {
    const auto h = detail::splitmix64(c.seed ^ detail::splitmix64(0xE11ull + rid));
    return c.lengths.empirical[h % c.lengths.empirical.size()];
  }
  const double d = c.lengths.prompt_sigma * detail::hashed_normal(c.seed, 0x5000000000ull + static_cast<std::uint64_t>(group_id));
  const double e = c.lengths.response_sigma * detail::hashed_normal(c.seed ^ 0xABCDull, rid);
  const double len = c.lengths.median_fraction * static_cast<double>(c.max_response_tokens) * std::exp(d + e);
  // Written so that a NaN (sigmas beyond the validated limits) also maps to the cap.
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(len < 1e15 ? len : 1e15));
}

namespace detail {

//! The discrete-event run behind simulate_segment_rollout. After each training step (the batch
//! trained, the policy version incremented) `after_train(sched, batch)` runs; it may change the
//! scheduler's segment count (an adaptive policy). `max_segments` bounds the counts it may set.
template <class AfterTrain>
[[nodiscard]] rollout_sim_result simulate_rollout_with(std::string_view fn, const rollout_sim_config& c, std::int32_t segments,
                                                       std::int32_t max_segments, AfterTrain&& after_train) {
  validate_sim_config(fn, c);
  if (segments < 1 || segments > c.max_response_tokens) fail_value(fn, "segments", segments, "must be in [1, max_response_tokens]");
  const std::int64_t capacity = c.engine_capacity > 0 ? c.engine_capacity : c.prompts_per_step * c.group_size;
  segment_scheduler sched({.group_size = c.group_size,
                           .max_response_tokens = c.max_response_tokens,
                           .num_segments = segments,
                           .max_active_responses = capacity,
                           .order = release_order::completion,
                           .release_batch_groups = c.prompts_per_step});
  const auto& e = c.engine;
  const double P = static_cast<double>(c.prompt_tokens);
  struct run_item {
    std::int64_t n;   // tokens produced this step
    double ctx;       // context before the step
  };
  std::vector<run_item> run;
  run.reserve(static_cast<std::size_t>(std::min<std::int64_t>(capacity, 1 << 16)));
  std::vector<double> suffix_max;

  double now = 0, t_start = 0;
  double slot_busy = 0, slot_busy_start = 0;   // sum over iterations of b * tau
  double decode_time = 0, decode_time_start = 0;
  double rollout_time = 0, rollout_time_start = 0, train_time_measured = 0;
  std::int64_t train_steps = 0, rollout_steps = 0, rollout_steps_start = 0;
  std::int64_t tokens_measured = 0, responses_measured = 0, truncated_measured = 0;
  double lag_sum = 0, spanned_sum = 0;
  rollout_sim_result out;
  out.segments = segments;
  const std::int64_t total_steps = c.warmup_steps + c.measured_steps;
  // Enough prompts for the whole run; a generous bound so the engine never starves.
  const auto most = static_cast<std::int64_t>(std::max(segments, max_segments));
  // Capped at the scheduler's limit, which the validated run (<= 2^41 groups trained, the rest in
  // flight) never reaches; total_steps + 2 * most + 4 < 2^34 and 2 * prompts_per_step < 2^32.
  const std::int64_t offer_rounds = total_steps + 2 * most + 4;
  sched.offer_prompts(offer_rounds > segment_scheduler_limits::max_offered_groups / (2 * c.prompts_per_step)
                          ? segment_scheduler_limits::max_offered_groups
                          : offer_rounds * c.prompts_per_step * 2);

  const std::int64_t guard_limit = total_steps * (4 * most + 8) + 64;
  for (std::int64_t guard = 0; train_steps < total_steps; ++guard) {
    if (guard > guard_limit) fail(fn, "config", "the simulated pipeline does not produce training batches");
    // ---- one rollout step ------------------------------------------------------------------
    const auto plan = sched.plan();
    run.clear();
    double prefill_tokens = 0;
    for (const auto& it : plan.items) {
      const std::int64_t natural = simulated_length(c, it.group_id, it.index_in_group);
      const std::int64_t remaining = natural - it.start_token;
      const bool eos = natural <= c.max_response_tokens && remaining <= it.max_new_tokens;
      const std::int64_t n = eos ? remaining : it.max_new_tokens;
      run.push_back({n, P + static_cast<double>(it.start_token)});
      if (it.start_token == 0) prefill_tokens += P;
      else if (e.rebuild_kv_on_resume) prefill_tokens += P + static_cast<double>(it.start_token);
      sched.report(it.response_id, n, eos ? decode_outcome::eos : decode_outcome::segment_end);
    }
    (void)sched.end_step();
    ++rollout_steps;
    // Decode iterations in closed form between the points where sequences leave the batch:
    // for iterations j in (prev, n_k], b and the base context S are constant and the context sum
    // is S + (j - 1) * b.
    std::sort(run.begin(), run.end(), [](const run_item& a, const run_item& b) { return a.n < b.n; });
    double S = 0;
    for (const auto& r : run) S += r.ctx;
    // padded_kv: the longest starting context among the items still running (a suffix, as they leave in order).
    if (e.padded_kv) {
      suffix_max.assign(run.size() + 1, 0.0);
      for (std::size_t i = run.size(); i-- > 0;) suffix_max[i] = std::max(suffix_max[i + 1], run[i].ctx);
    }
    double b = static_cast<double>(run.size());
    double step_decode = 0, step_busy = 0;
    std::int64_t prev = 0;
    for (std::size_t i = 0; i < run.size();) {
      const std::int64_t nk = run[i].n;
      if (nk > prev) {
        const double m = static_cast<double>(nk - prev);
        const double sum_jm1 = (static_cast<double>(prev) + static_cast<double>(nk - 1)) * m / 2.0;  // sum of (j-1), j=prev+1..nk
        // Context read over the m iterations: sum C_j = m S + b sum(j - 1), or padded b * (m C_max + sum(j - 1)).
        const double read = e.padded_kv ? b * (m * suffix_max[i] + sum_jm1) : m * S + b * sum_jm1;
        const double t = m * (e.iteration_s + e.per_sequence_s * b) + e.per_context_token_s * read;
        step_decode += t;
        step_busy += b * t;
        prev = nk;
      }
      while (i < run.size() && run[i].n == nk) {
        S -= run[i].ctx;
        b -= 1;
        ++i;
      }
    }
    const double step_rollout = step_decode + e.prefill_token_s * prefill_tokens;
    now += step_rollout;
    rollout_time += step_rollout;
    decode_time += step_decode;
    slot_busy += step_busy;

    // ---- train on every full batch of groups that is ready ------------------------------------
    for (;;) {
      const auto& batch = sched.take_experience();
      if (batch.group_ids.empty()) break;
      std::int64_t tokens = 0;
      for (const auto& r : batch.responses) tokens += r.tokens;
      const double t_train = c.trainer.per_step_s +
                             c.trainer.per_token_s * (static_cast<double>(tokens) + P * static_cast<double>(batch.responses.size()));
      const bool measuring = train_steps >= c.warmup_steps;
      if (measuring) {
        train_time_measured += t_train;
        tokens_measured += tokens;
        for (const auto& r : batch.responses) {
          const auto st = batch.staleness(r);
          lag_sum += static_cast<double>(st.max_lag);
          spanned_sum += static_cast<double>(st.versions_spanned);
          out.max_lag = std::max(out.max_lag, st.max_lag);
          ++out.lag_histogram[std::min<std::int64_t>(st.max_lag, 3)];
          truncated_measured += r.final_state == response_state::truncated;
          ++responses_measured;
        }
      }
      now += t_train;
      sched.update_policy(sched.policy_version() + 1);
      ++train_steps;
      after_train(sched, batch);
      if (train_steps == c.warmup_steps) {
        t_start = now;
        slot_busy_start = slot_busy;
        decode_time_start = decode_time;
        rollout_time_start = rollout_time;
        rollout_steps_start = rollout_steps;
      }
      if (train_steps == total_steps) break;
    }
  }
  const double span = now - t_start;
  const auto M = static_cast<double>(c.measured_steps);
  const double cap = static_cast<double>(capacity);
  out.step_time = span / M;
  out.tokens_per_s = static_cast<double>(tokens_measured) / span;
  out.idle_fraction = 1.0 - (slot_busy - slot_busy_start) / (cap * span);
  const double dt = decode_time - decode_time_start;
  out.tail_idle_fraction = dt > 0 ? 1.0 - (slot_busy - slot_busy_start) / (cap * dt) : 0.0;
  out.rollout_time = (rollout_time - rollout_time_start) / M;
  out.train_time = train_time_measured / M;
  out.rollout_steps_per_train_step = static_cast<double>(rollout_steps - rollout_steps_start) / M;
  const auto R = static_cast<double>(std::max<std::int64_t>(1, responses_measured));
  out.mean_response_tokens = static_cast<double>(tokens_measured) / R;
  out.truncated_fraction = static_cast<double>(truncated_measured) / R;
  out.mean_lag = lag_sum / R;
  out.mean_versions_spanned = spanned_sum / R;
  out.final_segments = sched.config().num_segments;
  return out;
}

}  // namespace detail

//! Runs the model with `segments` segments (the real segment_scheduler decides everything).
[[nodiscard]] inline rollout_sim_result simulate_segment_rollout(const rollout_sim_config& c, std::int32_t segments) {
  return detail::simulate_rollout_with("simulate_segment_rollout", c, segments, segments,
                                       [](segment_scheduler&, const experience_batch&) {});
}

//! Runs every segment count of `segments` and fills `speedup` relative to the 1-segment run
//! (simulated as well when 1 is not listed).
[[nodiscard]] inline std::vector<rollout_sim_result> simulate_segment_rollouts(const rollout_sim_config& c,
                                                                                std::span<const std::int32_t> segments) {
  std::vector<rollout_sim_result> out;
  out.reserve(segments.size());
  double base = 0;
  for (const auto s : segments) {
    out.push_back(simulate_segment_rollout(c, s));
    if (s == 1) base = out.back().step_time;
  }
  if (base == 0 && !segments.empty()) base = simulate_segment_rollout(c, 1).step_time;
  for (auto& r : out) r.speedup = base / r.step_time;
  return out;
}

//! Named presets. "ulorl-64k": the paper's Qwen3-30B-A3B setting (64k outputs, 128 prompts x 8).
[[nodiscard]] inline rollout_sim_config rollout_sim_preset(std::string_view name) {
  rollout_sim_config c;
  if (name == "ulorl-64k") return c;  // the defaults are this preset (see docs/segment_rollout.md)
  if (name == "ulorl-128k") {
    c.max_response_tokens = 131072;
    return c;
  }
  detail::fail_value("rollout_sim_preset", "name", name, "unknown preset (known: ulorl-64k, ulorl-128k)");
}

ULORL_NAMESPACE_END
