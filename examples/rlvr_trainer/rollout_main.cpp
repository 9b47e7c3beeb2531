// rlvr_rollout — the rollout half of the libtorch RLVR trainer: a small transformer policy, an
// optional supervised warm-up, then rollout steps of the KV-cache decoding engine driven by UloRL's
// segment scheduler on the countdown task (task.hpp).
//
//   rlvr_rollout [--segments 1|2|4] [--steps N] [--warmup N] [--prompts P] [--group G]
//                [--max-batch B] [--max-response L] [--temperature T] [--seed S] [--threads N]
//                [--layers N] [--d-model D] [--validate N] [--lengths-out FILE] [--measure] [--fit]
//                [--checkpoint FILE]
//
// Per rollout step (one plan / decode / report / end_step) it prints the plan items (resumed ones
// in parentheses), the responses released, the tokens decoded, tokens/s and the accuracy of the
// released responses; at the end the engine's measured costs in the terms of
// ulorl/rollout/simulator.hpp (t_iter, t_seq, t_kv, t_prefill). The weights do not change between
// steps: the trainer's loss and optimizer step are the other half. --measure times decoding at
// batch 32 and prefill instead; --fit calibrates the engine's cost model on a grid instead (below). --lengths-out writes the released response lengths, one group per
// line (a truncated response as L_max + 1), for `segment_rollout_sim --length-groups FILE`.
// --checkpoint FILE loads the warmed-up weights from FILE when it exists (skipping the warm-up) and
// saves them there otherwise.
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "../common/args.hpp"
#include "checkpoint.hpp"
#include "engine.hpp"
#include "policy.hpp"
#include "rollout.hpp"
#include "task.hpp"
#include "warmup.hpp"

namespace {

struct options {
  int segments = 2;
  int steps = 20;
  int warmup = 300;
  int prompts = 8;  // groups per released batch
  int group = 8;
  int max_batch = 64;
  int max_response = 1024;
  int layers = 3;
  int d_model = 128;
  int validate = 128;
  int threads = 1;  // intra-op threads: the batches are small, and on a shared machine more threads spin
  double temperature = 1.0;
  std::uint64_t seed = 1;
  bool measure = false;
  bool fit = false;
  std::string lengths_out;
  std::string checkpoint;
};

[[noreturn]] void usage(const char* why) {
  std::printf("%s\nusage: rlvr_rollout [--segments K] [--steps N] [--warmup N] [--prompts P] [--group G]\n"
              "       [--max-batch B] [--max-response L] [--temperature T] [--seed S] [--threads N]\n"
              "       [--layers N] [--d-model D] [--validate N] [--lengths-out FILE] [--measure] [--fit]\n"
              "       [--checkpoint FILE]\n",
              why);
  std::fflush(stdout);
  std::exit(std::ferror(stdout) ? cli::failure_status : 0);
}

//! Every option checked (examples/common/args.hpp): whole-token numbers in the ranges below; the
//! engine's KV cache bounded before anything is allocated; a refusal names the flag.
options parse(int argc, char** argv) {
  options o;
  cli::reader args(argc, argv);
  while (args.next()) {
    const std::string_view a = args.flag();
    if (a == "--measure") o.measure = true;
    else if (a == "--fit") o.fit = true;
    else if (a == "--help" || a == "-h") usage("rlvr_rollout: rollout steps of a transformer policy through the segment scheduler");
    else if (a == "--segments") o.segments = cli::integer(a, args.value(), 1, 8192);
    else if (a == "--steps") o.steps = cli::integer(a, args.value(), 0, 1'000'000);
    else if (a == "--warmup") o.warmup = cli::integer(a, args.value(), 0, 10'000'000);
    else if (a == "--prompts") o.prompts = cli::integer(a, args.value(), 1, 4096);
    else if (a == "--group") o.group = cli::integer(a, args.value(), 1, 1024);
    else if (a == "--max-batch") o.max_batch = cli::integer(a, args.value(), 1, 65536);
    else if (a == "--max-response") o.max_response = cli::integer(a, args.value(), 1, 8188);
    else if (a == "--layers") o.layers = cli::integer(a, args.value(), 1, 64);
    else if (a == "--d-model") o.d_model = cli::integer(a, args.value(), 8, 4096);
    else if (a == "--validate") o.validate = cli::integer(a, args.value(), 0, 1 << 20);
    else if (a == "--threads") o.threads = cli::integer(a, args.value(), 1, 1024);
    else if (a == "--temperature") o.temperature = cli::real(a, args.value(), 0, 100, true);
    else if (a == "--seed") o.seed = cli::integer<std::uint64_t>(a, args.value(), 0, UINT64_MAX);
    else if (a == "--lengths-out") o.lengths_out = cli::output_path(a, args.value());
    else if (a == "--checkpoint") o.checkpoint = cli::output_path(a, args.value());
    else args.unknown();
  }
  if (o.d_model % 8 != 0) cli::fail("--d-model", std::to_string(o.d_model) + " is not a multiple of 8 (4 heads of an even width)");
  if (o.segments > o.max_response)
    cli::fail("--segments", std::to_string(o.segments) + " exceeds --max-response " + std::to_string(o.max_response));
  // KV cache: keys and values of every layer, float32, max_batch rows of prompt + response tokens;
  // the rollout keeps 2 * prompts * group responses in flight.
  const double kv = 8.0 * o.max_batch * static_cast<double>(rlvr::countdown_task::prompt_tokens + o.max_response) * o.d_model * o.layers;
  if (kv > 16.0 * (1 << 30)) {
    char b[200];
    std::snprintf(b, sizeof b, "%d x --max-response %d x --d-model %d x --layers %d: the KV cache would take %.1f GiB, more than 16 GiB",
                  o.max_batch, o.max_response, o.d_model, o.layers, kv / (1 << 30));
    cli::fail("--max-batch", b);
  }
  if (2.0 * o.prompts * o.group > 1 << 20)
    cli::fail("--prompts", std::to_string(o.prompts) + " x --group " + std::to_string(o.group) + ": more than 2^19 responses per batch");
  return o;
}

double percentile(std::vector<std::int64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return static_cast<double>(v[i]);
}

void print_lengths(const char* what, const std::vector<std::int64_t>& lengths) {
  std::printf("%s (n=%zu): p10 %.0f  p50 %.0f  p90 %.0f  p99 %.0f  max %.0f tokens\n", what, lengths.size(),
              percentile(lengths, 0.10), percentile(lengths, 0.50), percentile(lengths, 0.90), percentile(lengths, 0.99),
              percentile(lengths, 1.0));
}

// Decode tokens/s at batch 32 (contexts of 64 tokens, 192 new tokens each, EOS disabled) and
// prefill tokens/s (32 contexts of 256 tokens), each the best of three runs.
void measure(rlvr::transformer_policy& policy, const options& o) {
  const auto V = policy->config().vocab_size;
  std::vector<std::vector<std::int64_t>> ctx(32);
  for (std::size_t i = 0; i < ctx.size(); ++i)
    for (int t = 0; t < 256; ++t) ctx[i].push_back(static_cast<std::int64_t>(rlvr::counter_hash(7, i, static_cast<std::uint64_t>(t)) % static_cast<std::uint64_t>(V)));
  rlvr::decode_engine engine(policy, {.max_batch = 32, .temperature = o.temperature, .eos_token = -1, .seed = o.seed});
  std::vector<rlvr::decode_request> reqs(32);
  std::vector<rlvr::decode_result> out;
  double best_decode = 0, best_prefill = 0;
  for (int rep = 0; rep < 3; ++rep) {
    for (std::size_t i = 0; i < reqs.size(); ++i)
      reqs[i] = {.sequence_id = static_cast<std::int64_t>(i), .context = std::span(ctx[i]).first(64), .max_new_tokens = 192};
    engine.reset_costs();
    engine.generate(reqs, out);
    best_decode = std::max(best_decode, engine.costs().decode_tokens_per_s());
    for (std::size_t i = 0; i < reqs.size(); ++i) reqs[i] = {.sequence_id = static_cast<std::int64_t>(i), .context = ctx[i], .max_new_tokens = 1};
    engine.reset_costs();
    engine.generate(reqs, out);
    best_prefill = std::max(best_prefill, engine.costs().prefill_tokens_per_s());
  }
  std::printf("decode  batch 32, context 64..256: %.0f tokens/s (%.2f ms per iteration)\n", best_decode, 32e3 / best_decode);
  std::printf("prefill 32 x 256 tokens:           %.0f tokens/s\n", best_prefill);
}

// The engine's cost model in segment_rollout_sim's terms, from a calibration grid rather than from
// a run (where the batch size and the context grow and shrink together and a least-squares fit
// cannot tell their costs apart): decode 32 iterations at every batch size 1, 2, 4, ..., max_batch
// from every starting context 4, L_max / 8, L_max / 4, L_max / 2 (EOS disabled), fitted as
// tau(b, C) = t_iter + t_seq b + t_kv C; prefill of max_batch contexts of L_max / 2 tokens (the mean
// context a resumed response re-prefills), seconds per token, the best of three.
void fit(rlvr::transformer_policy& policy, const options& o) {
  const auto V = policy->config().vocab_size;
  const std::int64_t L = o.max_response, new_tokens = 32;
  std::vector<std::vector<std::int64_t>> ctx(static_cast<std::size_t>(o.max_batch));
  for (std::size_t i = 0; i < ctx.size(); ++i)
    for (std::int64_t t = 0; t < L / 2 + 4; ++t)
      ctx[i].push_back(static_cast<std::int64_t>(rlvr::counter_hash(11, i, static_cast<std::uint64_t>(t)) % static_cast<std::uint64_t>(V)));
  rlvr::decode_engine engine(policy, {.max_batch = o.max_batch, .temperature = o.temperature, .eos_token = -1, .seed = o.seed});
  std::vector<rlvr::decode_request> reqs;
  std::vector<rlvr::decode_result> out;
  engine.reset_costs();
  for (std::int64_t b = 1;; b = std::min<std::int64_t>(2 * b, o.max_batch)) {
    for (const std::int64_t c0 : {std::int64_t{4}, L / 8, L / 4, L / 2}) {
      if (c0 < 1 || c0 + new_tokens > policy->config().max_seq) continue;
      reqs.clear();
      for (std::int64_t i = 0; i < b; ++i)
        reqs.push_back({.sequence_id = i, .context = std::span(ctx[static_cast<std::size_t>(i)]).first(static_cast<std::size_t>(c0)),
                        .max_new_tokens = new_tokens});
      engine.generate(reqs, out);
    }
    if (b == o.max_batch) break;
  }
  auto m = rlvr::fit_engine_model(engine.costs());
  const auto decode_iterations = engine.costs().decode_iterations;
  double prefill = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 3; ++rep) {
    reqs.clear();
    for (std::int64_t i = 0; i < o.max_batch; ++i)
      reqs.push_back({.sequence_id = i, .context = std::span(ctx[static_cast<std::size_t>(i)]).first(static_cast<std::size_t>(L / 2)),
                      .max_new_tokens = 1});
    engine.reset_costs();
    engine.generate(reqs, out);
    prefill = std::min(prefill, engine.costs().prefill_s / static_cast<double>(engine.costs().prefill_tokens));
  }
  m.prefill_token_s = prefill;
  std::printf("calibration: %lld decode iterations (batch 1..%d, contexts 4..%lld), prefill %d x %lld tokens\n",
              static_cast<long long>(decode_iterations), o.max_batch, static_cast<long long>(L / 2 + new_tokens), o.max_batch,
              static_cast<long long>(L / 2));
  std::printf("cost model (segment_rollout_sim): %s\n", rlvr::simulator_flags(m).c_str());
}

int run(const options& o) {
  torch::set_num_threads(o.threads);
  const rlvr::countdown_task task({.max_target = 999, .max_response_tokens = o.max_response, .seed = o.seed});
  rlvr::transformer_policy policy(rlvr::policy_config{.vocab_size = rlvr::countdown_task::vocab_size,
                                                      .d_model = o.d_model,
                                                      .n_heads = 4,
                                                      .n_layers = o.layers,
                                                      .d_mlp = 4 * o.d_model,
                                                      .max_seq = task.max_sequence_tokens(),
                                                      .seed = o.seed});
  policy->eval();
  std::printf("policy: %d layers, d_model %d, 4 heads, %lld parameters; task: countdown, S log-uniform on [1, 999], L_max %d\n",
              o.layers, o.d_model, static_cast<long long>(policy->parameter_count()), o.max_response);
  if (o.measure || o.fit) {
    o.fit ? fit(policy, o) : measure(policy, o);
    return 0;
  }
  {
    rlvr::sequential_rng rng(o.seed);
    std::vector<std::int64_t> lengths;
    for (std::uint64_t k = 0; k < 4000; ++k)
      lengths.push_back(static_cast<std::int64_t>(task.random_answer(task.training_target(k), rng).size()));
    print_lengths("random correct answers", lengths);
  }

  const auto t_start = std::chrono::steady_clock::now();
  const bool have_checkpoint = !o.checkpoint.empty() && rlvr::load_weights_if_present(policy, o.checkpoint, "--checkpoint");
  if (have_checkpoint) {
    policy->eval();
    std::printf("weights loaded from %s (warm-up skipped)\n", o.checkpoint.c_str());
  } else if (o.warmup > 0) {
    rlvr::supervised_warmup warm(policy, task, {.steps = o.warmup, .seed = o.seed});
    double loss = 0, acc = 0, secs = 0;
    for (int s = 1; s <= o.warmup; ++s) {
      const auto st = warm.step();
      loss += st.loss;
      acc += st.token_accuracy;
      secs += st.seconds;
      if (s % 50 == 0 || s == o.warmup) {
        std::printf("warm-up %4d  loss %.4f  token accuracy %.4f  %.2f s/step\n", s, loss / 50, acc / 50, secs / 50);
        loss = acc = secs = 0;
      }
      std::fflush(stdout);
    }
    if (!o.checkpoint.empty()) rlvr::save_weights(policy, o.checkpoint, "--checkpoint");
  }

  rlvr::decode_engine engine(policy, {.max_batch = o.max_batch, .temperature = o.temperature,
                                      .eos_token = rlvr::countdown_task::eos_token, .seed = o.seed});
  if (o.validate > 0)
    std::printf("validation (%d held-out prompts, sampled at T=%.2f): accuracy %.3f\n", o.validate, o.temperature,
                rlvr::sampled_accuracy(task, engine, task.validation_targets(o.validate)));
  engine.reset_costs();

  const std::int64_t batch_groups = o.prompts;
  rlvr::segment_rollout rollout(task, engine,
                                {.group_size = o.group,
                                 .max_response_tokens = o.max_response,
                                 .num_segments = o.segments,
                                 .max_active_responses = 2 * batch_groups * o.group,
                                 .release_batch_groups = batch_groups},
                                [&](std::int64_t g) { return task.training_target(static_cast<std::uint64_t>(g)); });
  std::printf("%5s %12s %9s %8s %9s %9s\n", "step", "items(res)", "released", "tokens", "tokens/s", "accuracy");
  std::int64_t total_tokens = 0, released = 0;
  double correct = 0, seconds = 0;
  std::vector<std::int64_t> lengths, correct_lengths, sim_lengths;
  for (int step = 1; step <= o.steps; ++step) {
    if (rollout.scheduler().queued_groups() < batch_groups) rollout.offer_prompts(batch_groups);
    const auto st = rollout.step();
    const auto& batch = rollout.take_experience();
    double step_correct = 0;
    for (const auto& r : batch.responses) {
      step_correct += r.reward;
      lengths.push_back(static_cast<std::int64_t>(r.tokens.size()));
      // The simulator reads a length above L_max as a truncated response.
      sim_lengths.push_back(lengths.back() + (r.result == rlvr::verdict::truncated ? 1 : 0));
      if (r.reward > 0) correct_lengths.push_back(static_cast<std::int64_t>(r.tokens.size()));
    }
    // The trainer's step on `batch` goes here; after it, rollout.update_policy(version + 1).
    total_tokens += st.new_tokens;
    seconds += st.seconds;
    released += static_cast<std::int64_t>(batch.responses.size());
    correct += step_correct;
    char items[32];
    std::snprintf(items, sizeof items, "%lld(%lld)", static_cast<long long>(st.items), static_cast<long long>(st.resumed_items));
    std::printf("%5d %12s %9zu %8lld %9.0f ", step, items, batch.responses.size(), static_cast<long long>(st.new_tokens),
                static_cast<double>(st.new_tokens) / st.seconds);
    if (batch.responses.empty()) std::printf("%9s\n", "-");
    else std::printf("%9.3f\n", step_correct / static_cast<double>(batch.responses.size()));
    std::fflush(stdout);
  }
  const auto& c = engine.costs();
  const auto m = rlvr::fit_engine_model(c);
  std::printf("rollout: %lld tokens in %.1f s (%.0f tokens/s), %lld responses released, accuracy %.3f\n",
              static_cast<long long>(total_tokens), seconds, seconds > 0 ? static_cast<double>(total_tokens) / seconds : 0.0,
              static_cast<long long>(released), released > 0 ? correct / static_cast<double>(released) : 0.0);
  print_lengths("released responses", lengths);
  print_lengths("correct responses", correct_lengths);
  std::printf("engine: %lld iterations, %.0f decode tokens/s, %.0f prefill tokens/s (%lld tokens, %.0f%% padding)\n",
              static_cast<long long>(c.decode_iterations), c.decode_tokens_per_s(), c.prefill_tokens_per_s(),
              static_cast<long long>(c.prefill_tokens),
              c.prefill_padded_tokens > 0 ? 100.0 * static_cast<double>(c.prefill_padded_tokens - c.prefill_tokens) / static_cast<double>(c.prefill_padded_tokens) : 0.0);
  std::printf("cost model (segment_rollout_sim): %s\n", rlvr::simulator_flags(m).c_str());
  if (!o.lengths_out.empty()) rlvr::write_length_groups(o.lengths_out, sim_lengths, o.group);
  std::printf("total %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A usage error exits 2; a file, checkpoint or torch error prints one line naming it and exits 1.
  return cli::run("rlvr_rollout", [&] { return run(parse(argc, argv)); });
}
