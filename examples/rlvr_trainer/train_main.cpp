// rlvr_train — the libtorch RLVR trainer: a small transformer (policy.hpp), a supervised warm-up
// (warmup.hpp), then RL on the countdown task (task.hpp): the segment scheduler drives the KV-cache
// engine (rollout.hpp), each released batch of whole groups gets one GRPO update (trainer.hpp:
// dynamic sampling, POIS/SAIS, MPT, clip-higher + adaptive k3 KL, token-mean, AdamW, reference
// resets on validation plateaus), and the engine and scheduler move to the new weights.
//
//   rlvr_train [--steps N] [--segments K|auto] [--mpt off|static|dynamic] [--resets on|off] [--is pois|sais]
//              [--prompts P] [--group G] [--max-response L] [--warmup N] [--checkpoint FILE]
//              [--lr X] [--lr-warmup N] [--mini-batches M] [--temperature T] [--validate N] [--validate-every K]
//              [--seed S] [--threads N] [--csv FILE] [--json FILE] [--svg FILE] [--min-target S] [--max-target S]
//              [--validation greedy|sampled]
//              [--agg token-mean|seq-mean-token-mean] [--mpt-tau P] [--mpt-sigma H] [--lengths-out FILE]
//              [--save FILE] [--save-every N] [--resume FILE]
//              [--reset-patience N] [--reset-drop X] [--kl-target X] [--kl-horizon H]
//
// One line per training step: rollout and update seconds, responses released / kept by dynamic
// sampling, mean reward, entropy, KL to the reference and beta, clip fraction, MPT-masked share,
// median response length, decode tokens/s; validation accuracy every --validate-every steps (and
// resets when they happen). --csv writes the same per step, --svg its curves (validation accuracy,
// reward, entropy, KL, response lengths; resets marked), --json a summary at the end. On a terminal a
// progress bar on stderr shows step, reward, accuracy, entropy, tokens/s and the time left.
// Validation is greedy decoding (default) or sampling at the training temperature.
// --checkpoint FILE loads warmed-up weights from FILE when it exists, else warms up and saves them.
// --save FILE writes a training checkpoint (checkpoint.hpp: weights, reference, AdamW, learning-rate
// ramp, step, KL controller, reset policy, scheduler with the responses in flight, random state,
// and this driver's records) after the last step, and every N steps with --save-every N; the file
// is replaced atomically. --resume FILE continues such a run from its step with the same numbers as
// a run that never stopped (--steps is the total; every other option that shapes the run must be as
// saved, else it is refused naming the option); the CSV, JSON and SVG then cover the whole run.
// --reset-patience N and --reset-drop X set ProRL's reset triggers (a plateau of N validations; a
// fall of X below the best), --kl-target and --kl-horizon the adaptive KL controller.
// --segments auto lets ulorl::segment_autotuner choose the count (1, 2, 4 or 8) after every step: it
// simulates each on the released groups' lengths and the fitted costs below and switches when one is
// predicted faster (the choices depend on measured times, so two such runs need not be identical).
// The run ends with its cost model as segment_rollout_sim flags: the engine's decode and prefill
// costs (engine.hpp) and the update's per-step and per-token seconds, least-squares fits over this
// process's steps; --lengths-out FILE writes the released response lengths, one group per line (a
// truncated response as L_max + 1), for segment_rollout_sim --length-groups FILE. Together they are
// the simulator's model of this run (docs/trainer.md, experiment b).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <initializer_list>
#include <sstream>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <ulorl/rollout/segment_autotune.hpp>

#include "../common/args.hpp"
#include "checkpoint.hpp"
#include "engine.hpp"
#include "plot.hpp"
#include "policy.hpp"
#include "rollout.hpp"
#include "task.hpp"
#include "trainer.hpp"
#include "warmup.hpp"

namespace {

// The defaults are the measured default run (examples/rlvr_trainer/README.md, docs/trainer.md): RL on
// targets 60..135 with a 64-token budget (15 steps), where the warmed-up policy's uniform digit
// choices (mean 5) mostly run out of tokens and larger steps fit.
struct options {
  int steps = 120;
  int segments = 1;
  bool auto_segments = false;  // --segments auto: ulorl::segment_autotuner picks the count between steps
  int prompts = 8;
  int group = 8;
  int max_response = 64;
  int warmup = 800;
  int mini_batches = 2;
  int validate = 128;
  int validate_every = 5;
  int threads = 1;
  int max_target = 135;
  int min_target = 60;
  double lr = 2e-4;
  int lr_warmup = 10;
  double mpt_tau = ulorl::mpt_config{}.tau;
  double mpt_sigma = 0.45;  // below the warmed-up policy's entropy (0.53 nats per token), which RL lowers
  double temperature = 1.0;
  std::uint64_t seed = 1;
  std::string mpt = "dynamic";
  std::string resets = "on";
  std::string is = "pois";
  std::string validation = "sampled";
  std::string agg = "token-mean";
  std::string checkpoint, csv, json, svg, lengths_out;
  std::string save, resume;
  int save_every = 0;
  int reset_patience = 3;     // validations without a new best before a plateau reset
  double reset_drop = 0.0;    // > 0: also reset when validation falls this far below its best (ProRL: degrades)
  double kl_target = 0.02;    // the adaptive KL controller's target (nats per token)
  double kl_horizon = 2000;   // and its horizon
};

//! The options that shape a run (all but its length, threads, warm-up and output paths), as a
//! resumed run must repeat them.
std::vector<std::pair<std::string, std::string>> run_options(const options& o) {
  const auto f = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%.17g", v);
    return std::string(b);
  };
  const auto i = [](auto v) { return std::to_string(v); };
  return {{"segments", o.auto_segments ? std::string("auto") : i(o.segments)}, {"prompts", i(o.prompts)},
          {"group", i(o.group)},               {"max-response", i(o.max_response)},
          {"min-target", i(o.min_target)},     {"max-target", i(o.max_target)},
          {"lr", f(o.lr)},                     {"lr-warmup", i(o.lr_warmup)},
          {"mini-batches", i(o.mini_batches)}, {"temperature", f(o.temperature)},
          {"validate", i(o.validate)},         {"validate-every", i(o.validate_every)},
          {"validation", o.validation},        {"seed", i(o.seed)},
          {"mpt", o.mpt},                      {"mpt-tau", f(o.mpt_tau)},
          {"mpt-sigma", f(o.mpt_sigma)},       {"resets", o.resets},
          {"is", o.is},                        {"agg", o.agg},
          {"reset-patience", i(o.reset_patience)}, {"reset-drop", f(o.reset_drop)},
          {"kl-target", f(o.kl_target)},       {"kl-horizon", f(o.kl_horizon)}};
}

//! What the driver reports over a whole run; saved with each training checkpoint ("driver/...").
struct run_record {
  rlvr::plot::csv_table table{};
  std::vector<std::int64_t> released_lengths{};
  double val0 = 0, best_val = 0, last_val = 0;
  double warmup_s = 0, rl_s = 0, rollout_s = 0, train_s = 0;  // rl_s: RL wall time up to the last save
  std::int64_t tokens = 0, resets = 0;

  void save(torch::serialize::OutputArchive& a, const options& o) const {
    namespace ck = rlvr::ckpt;
    for (const auto& [flag, value] : run_options(o)) ck::put_string(a, "driver/option/" + flag, value);
    std::string names;
    for (const auto& n : table.names) names += n + ",";
    ck::put_string(a, "driver/table/names", names);
    const auto rows = static_cast<std::int64_t>(table.columns.empty() ? 0 : table.columns[0].size());
    auto values = torch::empty({static_cast<std::int64_t>(table.names.size()), rows}, torch::kFloat64);
    for (std::size_t c = 0; c < table.columns.size(); ++c)
      for (std::int64_t r = 0; r < rows; ++r) values[static_cast<std::int64_t>(c)][r] = table.columns[c][static_cast<std::size_t>(r)];
    ck::put_tensor(a, "driver/table/values", values);
    ck::put_tensor(a, "driver/released_lengths", torch::tensor(released_lengths, torch::kInt64));
    for (const auto& [key, v] : std::initializer_list<std::pair<const char*, double>>{
             {"val0", val0}, {"best_val", best_val}, {"last_val", last_val}, {"warmup_s", warmup_s},
             {"rl_s", rl_s}, {"rollout_s", rollout_s}, {"train_s", train_s}})
      ck::put_double(a, std::string("driver/") + key, v);
    ck::put_int(a, "driver/tokens", tokens);
    ck::put_int(a, "driver/resets", resets);
  }

  void load(torch::serialize::InputArchive& a, const options& o) {
    namespace ck = rlvr::ckpt;
    for (const auto& [flag, value] : run_options(o)) {
      const auto saved = ck::get_string(a, "driver/option/" + flag);
      if (saved != value)
        throw rlvr::checkpoint_error("the checkpoint's run has --" + flag + " " + saved + ", this one --" + flag + " " +
                                     value + " (a resumed run keeps every option but --steps and the outputs)");
    }
    std::string names;
    for (const auto& n : table.names) names += n + ",";
    if (ck::get_string(a, "driver/table/names") != names)
      throw rlvr::checkpoint_error("checkpoint: the driver's record has other columns");
    const auto values = ck::get_tensor(a, "driver/table/values", torch::kFloat64, 2);
    if (values.size(0) != static_cast<std::int64_t>(table.names.size()))
      throw rlvr::checkpoint_error("checkpoint: the driver's record has other columns");
    table.columns.assign(table.names.size(), {});
    const auto v = values.accessor<double, 2>();
    for (std::int64_t c = 0; c < values.size(0); ++c)
      for (std::int64_t r = 0; r < values.size(1); ++r) table.columns[static_cast<std::size_t>(c)].push_back(v[c][r]);
    const auto lengths = ck::get_tensor(a, "driver/released_lengths", torch::kInt64, 1);
    released_lengths.assign(lengths.data_ptr<std::int64_t>(), lengths.data_ptr<std::int64_t>() + lengths.numel());
    val0 = ck::get_double(a, "driver/val0");
    best_val = ck::get_double(a, "driver/best_val");
    last_val = ck::get_double(a, "driver/last_val");
    warmup_s = ck::get_double(a, "driver/warmup_s");
    rl_s = ck::get_double(a, "driver/rl_s");
    rollout_s = ck::get_double(a, "driver/rollout_s");
    train_s = ck::get_double(a, "driver/train_s");
    tokens = ck::get_int(a, "driver/tokens");
    resets = ck::get_int(a, "driver/resets");
  }
};

[[noreturn]] void usage(const std::string& why) {
  std::printf(
               "%s\nusage: rlvr_train [--steps N] [--segments K|auto] [--mpt off|static|dynamic] [--resets on|off]\n"
               "       [--is pois|sais] [--prompts P] [--group G] [--max-response L] [--warmup N]\n"
               "       [--checkpoint FILE] [--lr X] [--lr-warmup N] [--mini-batches M] [--temperature T] [--validate N]\n"
               "       [--validate-every K] [--seed S] [--threads N] [--csv FILE] [--json FILE] [--svg FILE]\n"
               "       [--min-target S] [--max-target S] [--validation greedy|sampled]\n"
               "       [--agg token-mean|seq-mean-token-mean] [--mpt-tau P] [--mpt-sigma H] [--lengths-out FILE]\n"
               "       [--save FILE] [--save-every N] [--resume FILE]\n"
               "       [--reset-patience N] [--reset-drop X] [--kl-target X] [--kl-horizon H]\n"
               "  --checkpoint FILE   warm-up weights: loaded when FILE exists, else the warm-up runs and saves them\n"
               "  --save FILE         training checkpoint after the last step (and every N steps with --save-every N)\n"
               "  --resume FILE       continue a saved run from its step; --steps is the total, other options as saved\n"
               "  --segments auto     the count (1, 2, 4 or 8) is chosen between steps by simulating each on the\n"
               "                      released lengths and the fitted engine and update costs (ulorl::segment_autotuner)\n"
               "  --reset-patience N  plateau reset after N validations without a new best (default 3)\n"
               "  --reset-drop X      also reset when validation falls X below its best (default 0: off)\n"
               "  --kl-target X, --kl-horizon H   the adaptive KL controller (defaults 0.02, 2000)\n",
               why.c_str());
  std::fflush(stdout);
  std::exit(std::ferror(stdout) ? cli::failure_status : 0);
}

//! The engine's KV cache for `rows` sequences of `max_seq` tokens under the policy's shape, in bytes
//! (keys and values, float32, every layer).
double kv_cache_bytes(double rows, double max_seq, const rlvr::policy_config& p) {
  return rows * max_seq * static_cast<double>(p.d_model) * static_cast<double>(p.n_layers) * 2.0 * 4.0;
}

//! Every option checked (examples/common/args.hpp): whole-token numbers in the ranges below, words
//! from their lists, output directories that exist; a refusal is a cli::usage_error naming the flag.
options parse(int argc, char** argv) {
  options o;
  bool segments_given = false;
  cli::reader args(argc, argv);
  while (args.next()) {
    const std::string_view a = args.flag();
    if (a == "--help" || a == "-h") usage("rlvr_train: RLVR on the countdown task through ulorl");
    if (a == "--steps") o.steps = cli::integer(a, args.value(), 0, 1'000'000);
    else if (a == "--segments") {
      const auto v = args.value();
      o.auto_segments = v == "auto";
      o.segments = o.auto_segments ? 1 : cli::integer(a, v, 1, 8192);
      segments_given = !o.auto_segments;
    }
    else if (a == "--prompts") o.prompts = cli::integer(a, args.value(), 1, 4096);
    else if (a == "--group") o.group = cli::integer(a, args.value(), 2, 1024);
    else if (a == "--max-response") o.max_response = cli::integer(a, args.value(), 1, 8188);
    else if (a == "--warmup") o.warmup = cli::integer(a, args.value(), 0, 10'000'000);
    else if (a == "--mini-batches") o.mini_batches = cli::integer(a, args.value(), 1, 65536);
    else if (a == "--validate") o.validate = cli::integer(a, args.value(), 0, 1 << 20);
    else if (a == "--validate-every") o.validate_every = cli::integer(a, args.value(), 1, 1'000'000);
    else if (a == "--threads") o.threads = cli::integer(a, args.value(), 1, 1024);
    else if (a == "--max-target") o.max_target = cli::integer(a, args.value(), 10, 999);
    else if (a == "--min-target") o.min_target = cli::integer(a, args.value(), 1, 999);
    else if (a == "--validation") o.validation = cli::choice(a, args.value(), {"greedy", "sampled"});
    else if (a == "--agg") o.agg = cli::choice(a, args.value(), {"token-mean", "seq-mean-token-mean"});
    else if (a == "--svg") o.svg = cli::output_path(a, args.value());
    else if (a == "--lengths-out") o.lengths_out = cli::output_path(a, args.value());
    else if (a == "--lr") o.lr = cli::real(a, args.value(), 0, 1, true);
    else if (a == "--lr-warmup") o.lr_warmup = cli::integer(a, args.value(), 0, 1'000'000);
    else if (a == "--mpt-tau") o.mpt_tau = cli::real(a, args.value(), 0, 1, true);
    else if (a == "--mpt-sigma") o.mpt_sigma = cli::real(a, args.value(), 0, 100);
    else if (a == "--temperature") o.temperature = cli::real(a, args.value(), 0, 100, true);
    else if (a == "--seed") o.seed = cli::integer<std::uint64_t>(a, args.value(), 0, UINT64_MAX);
    else if (a == "--mpt") o.mpt = cli::choice(a, args.value(), {"off", "static", "dynamic"});
    else if (a == "--resets") o.resets = cli::choice(a, args.value(), {"on", "off"});
    else if (a == "--is") o.is = cli::choice(a, args.value(), {"pois", "sais"});
    // Loaded when it exists (a regular file), else written there after the warm-up.
    else if (a == "--checkpoint") o.checkpoint = cli::output_path(a, args.value());
    else if (a == "--csv") o.csv = cli::output_path(a, args.value());
    else if (a == "--json") o.json = cli::output_path(a, args.value());
    else if (a == "--save") o.save = cli::output_path(a, args.value());
    else if (a == "--save-every") o.save_every = cli::integer(a, args.value(), 0, 1'000'000);
    else if (a == "--resume") o.resume = cli::path(a, args.value());
    else if (a == "--reset-patience") o.reset_patience = cli::integer(a, args.value(), 1, 1'000'000);
    else if (a == "--reset-drop") o.reset_drop = cli::real(a, args.value(), 0, 1);
    else if (a == "--kl-target") o.kl_target = cli::real(a, args.value(), 0, 1e6, true);
    else if (a == "--kl-horizon") o.kl_horizon = cli::real(a, args.value(), 1, 1e12);
    else args.unknown();
  }
  if (o.min_target > o.max_target)
    cli::fail("--min-target", std::to_string(o.min_target) + " exceeds --max-target " + std::to_string(o.max_target));
  if (segments_given && o.segments > o.max_response)
    cli::fail("--segments", std::to_string(o.segments) + " exceeds --max-response " + std::to_string(o.max_response));
  if (o.save_every > 0 && o.save.empty()) cli::fail("--save-every", "needs --save FILE");
  // The engine holds 2 * prompts * group sequences of up to max(prompt + response, the warm-up's
  // longest sequence) tokens: bounded before anything is allocated.
  const double rows = 2.0 * o.prompts * o.group;
  const double max_seq = static_cast<double>(
      std::max<std::int64_t>(rlvr::countdown_task::prompt_tokens + o.max_response,
                             rlvr::countdown_task::prompt_tokens + rlvr::warmup_config{}.max_answer_tokens));
  constexpr double kv_limit = 16.0 * (1 << 30);
  if (rows > 65536 || kv_cache_bytes(rows, max_seq, rlvr::policy_config{}) > kv_limit) {
    char b[256];
    std::snprintf(b, sizeof b,
                  "%d x --group %d x --max-response %d: the engine's KV cache (%.0f sequences of %.0f tokens) would take "
                  "%.1f GiB; at most 65536 sequences and 16 GiB",
                  o.prompts, o.group, o.max_response, rows, max_seq, kv_cache_bytes(rows, max_seq, rlvr::policy_config{}) / (1 << 30));
    cli::fail("--prompts", b);
  }
  return o;
}

//! The segment tuner's state as checkpoint entries "driver/autotune/..." and back.
void save_tuner_state(torch::serialize::OutputArchive& a, const ulorl::segment_autotune_state& s) {
  namespace ck = rlvr::ckpt;
  ck::put_int(a, "driver/autotune/current", s.current);
  ck::put_tensor(a, "driver/autotune/lengths", torch::tensor(s.lengths, torch::kInt64));
  const std::vector<double> costs{s.engine.iteration_s, s.engine.per_sequence_s, s.engine.per_context_token_s,
                                  s.engine.prefill_token_s, s.trainer.per_token_s, s.trainer.per_step_s};
  ck::put_tensor(a, "driver/autotune/costs", torch::tensor(costs, torch::kFloat64));
  ck::put_int(a, "driver/autotune/rebuild_kv_on_resume", s.engine.rebuild_kv_on_resume ? 1 : 0);
  ck::put_int(a, "driver/autotune/padded_kv", s.engine.padded_kv ? 1 : 0);
  ck::put_int(a, "driver/autotune/costs_known", s.costs_known ? 1 : 0);
  ck::put_int(a, "driver/autotune/decisions", s.decisions);
}

ulorl::segment_autotune_state load_tuner_state(torch::serialize::InputArchive& a) {
  namespace ck = rlvr::ckpt;
  ulorl::segment_autotune_state s;
  const auto current = ck::get_int(a, "driver/autotune/current");
  if (current < 1 || current > 1 << 30) throw rlvr::checkpoint_error("checkpoint: driver/autotune/current is out of range");
  s.current = static_cast<std::int32_t>(current);
  const auto lengths = ck::get_tensor(a, "driver/autotune/lengths", torch::kInt64, 1);
  s.lengths.assign(lengths.data_ptr<std::int64_t>(), lengths.data_ptr<std::int64_t>() + lengths.numel());
  const auto costs = ck::get_tensor(a, "driver/autotune/costs", torch::kFloat64, 1);
  if (costs.numel() != 6) throw rlvr::checkpoint_error("checkpoint: driver/autotune/costs must hold 6 values");
  const auto c = costs.accessor<double, 1>();
  s.engine = {.iteration_s = c[0], .per_sequence_s = c[1], .per_context_token_s = c[2], .prefill_token_s = c[3],
              .rebuild_kv_on_resume = ck::get_int(a, "driver/autotune/rebuild_kv_on_resume") != 0,
              .padded_kv = ck::get_int(a, "driver/autotune/padded_kv") != 0};
  s.trainer = {.per_token_s = c[4], .per_step_s = c[5]};
  s.costs_known = ck::get_int(a, "driver/autotune/costs_known") != 0;
  s.decisions = ck::get_int(a, "driver/autotune/decisions");
  return s;  // segment_autotuner's constructor checks every field
}

//! The q-quantile (nearest rank below) of v; 0 for none.
std::int64_t quantile(std::vector<std::int64_t> v, double q) {
  if (v.empty()) return 0;
  const auto k = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k];
}

//! One line on stderr, rewritten in place, when stderr is a terminal.
class progress_bar {
 public:
  explicit progress_bar(int steps) : steps_(steps), on_(isatty(STDERR_FILENO) != 0) {}
  void show(int step, double reward, double accuracy, double entropy, double tokens_per_s, double elapsed_s) {
    if (!on_ || steps_ <= 0) return;
    constexpr int width = 24;
    const int done = width * step / steps_;
    const double eta = step > 0 ? elapsed_s / step * (steps_ - step) : 0.0;
    std::fprintf(stderr, "\r[%.*s%.*s] %d/%d  reward %.3f  acc %.3f  entropy %.3f  %.0f tok/s  ETA %dm%02ds ", done,
                 "########################", width - done, "........................", step, steps_, reward, accuracy,
                 entropy, tokens_per_s, static_cast<int>(eta) / 60, static_cast<int>(eta) % 60);
    std::fflush(stderr);
  }
  void clear() {
    if (on_) std::fprintf(stderr, "\r%*s\r", 110, "");
  }

 private:
  int steps_;
  bool on_;
};

int train(const options& o) {
  torch::set_num_threads(o.threads);
  const auto t_start = std::chrono::steady_clock::now();
  const rlvr::countdown_task task(
      {.max_target = o.max_target, .min_target = o.min_target, .max_response_tokens = o.max_response, .seed = o.seed});
  rlvr::transformer_policy policy(rlvr::policy_config{.vocab_size = rlvr::countdown_task::vocab_size,
                                                      .max_seq = std::max<std::int64_t>(
                                                          task.max_sequence_tokens(),
                                                          rlvr::countdown_task::prompt_tokens +
                                                              rlvr::warmup_config{}.max_answer_tokens),
                                                      .seed = o.seed});
  policy->eval();
  std::printf("policy: %lld parameters; countdown task, L_max %d; %s segments, MPT %s, resets %s, %s\n",
              static_cast<long long>(policy->parameter_count()), o.max_response,
              o.auto_segments ? "auto" : std::to_string(o.segments).c_str(), o.mpt.c_str(),
              o.resets.c_str(), o.is == "pois" ? "POIS" : "SAIS");

  // Supervised warm-up (or its saved result); a resumed run takes every weight from its checkpoint.
  const bool resuming = !o.resume.empty();
  if (resuming) {
    // Nothing to do here: the training checkpoint is loaded once the trainer and the rollout exist.
  } else if (!o.checkpoint.empty() && rlvr::load_weights_if_present(policy, o.checkpoint, "--checkpoint")) {
    policy->eval();
    std::printf("warm-up weights loaded from %s\n", o.checkpoint.c_str());
  } else if (o.warmup > 0) {
    // The warm-up imitates random correct answers of the full task (targets 1..999, uniform digits,
    // L_max 1024), whatever the RL task's range and L_max: one checkpoint serves every RL setting.
    const rlvr::countdown_task warm_task({.seed = o.seed});
    rlvr::supervised_warmup warm(policy, warm_task, {.steps = o.warmup, .seed = o.seed});
    double loss = 0;
    for (int s = 1; s <= o.warmup; ++s) {
      loss += warm.step().loss;
      if (s % 100 == 0 || s == o.warmup) {
        std::printf("warm-up %4d  loss %.4f\n", s, loss / (s % 100 == 0 ? 100 : s % 100));
        loss = 0;
        std::fflush(stdout);
      }
    }
    if (!o.checkpoint.empty()) rlvr::save_weights(policy, o.checkpoint, "--checkpoint");
  }
  run_record h{.table = {.names = {"step", "rollout_s", "train_s", "released", "kept", "reward", "entropy", "kl",
                                   "kl_coef", "clip_fraction", "mpt_masked", "median_length", "p90_length",
                                   "decode_tokens_per_s", "validation_accuracy", "reset", "elapsed_s", "segments"}}};
  h.warmup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

  rlvr::decode_engine engine(policy, {.max_batch = 2 * o.prompts * o.group, .temperature = o.temperature,
                                      .eos_token = rlvr::countdown_task::eos_token, .seed = o.seed});
  const auto val_targets = task.validation_targets(o.validate);
  const auto validate = [&] {
    if (o.validate == 0) return 0.0;
    return o.validation == "greedy" ? rlvr::greedy_accuracy(task, engine, val_targets)
                                    : rlvr::sampled_accuracy(task, engine, val_targets);
  };

  rlvr::trainer_config tc;
  tc.lr = o.lr;
  tc.lr_warmup_steps = o.lr_warmup;
  tc.mini_batches = o.mini_batches;
  tc.temperature = o.temperature;
  tc.is = o.is == "pois" ? rlvr::old_policy::pois : rlvr::old_policy::sais;
  tc.mpt.mode = o.mpt == "off" ? ulorl::mpt_mode::off : o.mpt == "static" ? ulorl::mpt_mode::static_mask : ulorl::mpt_mode::dynamic_mask;
  tc.mpt.tau = o.mpt_tau;
  tc.mpt.sigma = o.mpt_sigma;
  tc.resets_enabled = o.resets == "on";
  tc.agg = o.agg == "token-mean" ? ulorl::agg_mode::token_mean : ulorl::agg_mode::seq_mean_token_mean;
  tc.resets.patience = o.reset_patience;
  tc.resets.on_drop = o.reset_drop > 0;
  if (tc.resets.on_drop) tc.resets.max_drop = o.reset_drop;
  tc.kl.target_kl = o.kl_target;
  tc.kl.horizon = o.kl_horizon;
  rlvr::grpo_trainer trainer(policy, tc);
  rlvr::segment_rollout rollout(task, engine,
                                {.group_size = o.group,
                                 .max_response_tokens = o.max_response,
                                 .num_segments = o.segments,
                                 .max_active_responses = 2 * o.prompts * o.group,
                                 .release_batch_groups = o.prompts},
                                [&](std::int64_t g) { return task.training_target(static_cast<std::uint64_t>(g)); });
  // --segments auto: the tuner simulates each candidate count on the released groups' lengths and
  // the fitted engine and update costs, between training steps.
  const ulorl::rollout_sim_config tuner_base{.max_response_tokens = o.max_response,
                                             .prompt_tokens = rlvr::countdown_task::prompt_tokens,
                                             .group_size = o.group,
                                             .prompts_per_step = o.prompts,
                                             .engine_capacity = 2 * o.prompts * o.group,
                                             .seed = o.seed};
  const ulorl::segment_autotune_config tuner_config{.candidates = {1, 2, 4, 8},
                                                    .initial = 1,
                                                    .min_groups = std::min(2 * o.prompts, 256),
                                                    .window_groups = 256};
  std::optional<ulorl::segment_autotuner> tuner;
  if (o.auto_segments) {
    tuner.emplace(tuner_base, tuner_config);
    rollout.set_adaptive_segments(true);
  }
  rlvr::training_loop loop(trainer, rollout, {.prompts_per_step = o.prompts, .validate_every = o.validate > 0 ? o.validate_every : 0},
                           validate);

  if (resuming) {
    loop.load_checkpoint(o.resume, [&](torch::serialize::InputArchive& a) {
      h.load(a, o);
      if (tuner) tuner.emplace(tuner_base, tuner_config, load_tuner_state(a));
    });
    std::printf("resumed from %s after step %lld (validation after warm-up %.3f, last %.3f)\n", o.resume.c_str(),
                static_cast<long long>(loop.steps_done()), h.val0, h.last_val);
    if (loop.steps_done() >= o.steps)
      std::printf("the checkpoint is at step %lld, --steps is %d: no step to run\n",
                  static_cast<long long>(loop.steps_done()), o.steps);
  } else {
    h.val0 = validate();
    h.best_val = h.last_val = h.val0;
    std::printf("validation accuracy after warm-up (%d held-out targets, %s): %.3f\n", o.validate,
                o.validation == "greedy" ? "greedy" : "sampled", h.val0);
    h.table.append({0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, o.validate > 0 ? h.val0 : NAN, 0, 0,
                    static_cast<double>(rollout.scheduler().config().num_segments)});
  }
  const auto t_rl = std::chrono::steady_clock::now();
  const double rl_before = h.rl_s;  // RL seconds of the runs this one continues
  const auto rl_elapsed = [&] {
    return rl_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_rl).count();
  };
  const auto save = [&] {
    h.rl_s = rl_elapsed();
    loop.save_checkpoint(o.save, [&](torch::serialize::OutputArchive& a) {
      h.save(a, o);
      if (tuner) save_tuner_state(a, tuner->state());
    });
  };

  rlvr::trainer_costs update_costs;  // this process's steps, like the engine's costs
  progress_bar bar(o.steps);
  std::printf("%4s %7s %6s %5s %4s %6s %7s %8s %8s %6s %5s %5s %6s %6s\n", "step", "roll_s", "upd_s", "resp", "kept",
              "reward", "entropy", "kl", "beta", "clip", "mpt%", "len50", "tok/s", "val");
  while (loop.steps_done() < o.steps) {
    const std::int32_t segments_used = rollout.scheduler().config().num_segments;
    const auto r = loop.step();
    const auto& st = r.train;
    const auto step = static_cast<int>(r.step);
    // The simulator's form: a truncated response counts as L_max + 1.
    for (std::size_t i = 0; i < r.lengths.size(); ++i) h.released_lengths.push_back(r.lengths[i] + (r.truncated[i] ? 1 : 0));
    double trained = 0;  // prompt + response tokens of the released responses
    for (const auto L : r.lengths) trained += static_cast<double>(L + rlvr::countdown_task::prompt_tokens);
    update_costs.add_step(trained, st.seconds);
    if (tuner) {
      const auto G = static_cast<std::size_t>(o.group);
      const auto first = h.released_lengths.size() - r.lengths.size();
      for (std::size_t g = 0; g < r.lengths.size() / G; ++g)
        tuner->observe_group(std::span<const std::int64_t>(h.released_lengths).subspan(first + g * G, G));
      tuner->observe_costs(rlvr::fit_engine_model(engine.costs()), rlvr::fit_trainer_model(update_costs));
      const auto n = tuner->choose();
      if (n != rollout.scheduler().config().num_segments) {
        rollout.set_num_segments(n);
        std::printf("segments: %d from step %d (predicted seconds per step:", n, step + 1);
        for (const auto& p : tuner->predictions()) std::printf(" %d: %.2f", p.segments, p.step_time);
        std::printf(")\n");
      }
    }
    h.rollout_s += r.rollout_seconds;
    h.train_s += st.seconds;
    h.tokens += r.new_tokens;
    std::string val = "";
    double val_now = NAN;
    if (r.validated) {
      h.last_val = val_now = r.validation;
      h.best_val = std::max(h.best_val, h.last_val);
      h.resets += r.reset ? 1 : 0;
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3f%s", h.last_val, r.reset ? " R" : "");
      val = buf;
    }
    const double mpt_share = st.tokens > 0 ? 100.0 * st.mpt_masked / st.tokens : 0.0;
    const double tok_s = r.rollout_seconds > 0 ? static_cast<double>(r.new_tokens) / r.rollout_seconds : 0.0;
    const double elapsed = rl_elapsed();
    bar.clear();
    std::printf("%4d %7.1f %6.1f %5lld %4lld %6.3f %7.4f %8.5f %8.5f %6.4f %5.1f %5lld %6.0f %6s\n", step,
                r.rollout_seconds, st.seconds, static_cast<long long>(st.responses),
                static_cast<long long>(st.kept_responses), st.reward_mean, st.entropy_mean, st.kl_mean, st.kl_coef,
                st.clip_fraction, mpt_share, static_cast<long long>(quantile(r.lengths, 0.5)), tok_s, val.c_str());
    std::fflush(stdout);
    const auto updated = [&](double v) { return st.updated ? v : NAN; };
    h.table.append({static_cast<double>(step), r.rollout_seconds, st.seconds, static_cast<double>(st.responses),
                    static_cast<double>(st.kept_responses), st.reward_mean, updated(st.entropy_mean),
                    updated(st.kl_mean), st.kl_coef, updated(st.clip_fraction), mpt_share,
                    static_cast<double>(quantile(r.lengths, 0.5)), static_cast<double>(quantile(r.lengths, 0.9)),
                    tok_s, val_now, r.reset ? 1.0 : 0.0, elapsed, static_cast<double>(segments_used)});
    if (!o.save.empty() && ((o.save_every > 0 && step % o.save_every == 0) || step == o.steps)) {
      save();
      std::printf("checkpoint after step %d saved to %s\n", step, o.save.c_str());
    }
    bar.show(step, st.reward_mean, h.last_val, st.entropy_mean, tok_s, elapsed);
  }
  bar.clear();
  if (!o.csv.empty()) h.table.write(o.csv);  // each writer checks the closed file and names it
  if (!o.svg.empty()) {
    const std::vector<rlvr::plot::panel_spec> panels{
        {.column = "validation_accuracy", .title = "Validation accuracy (" + o.validation + ")", .y_label = "accuracy"},
        {.column = "reward", .title = "Mean reward of the released responses", .y_label = "reward"},
        {.column = "entropy", .title = "Entropy per response token", .y_label = "nats"},
        {.column = "kl", .title = "k3 KL to the reference per loss token", .y_label = "nats"},
        {.column = "median_length", .title = "Median response length", .y_label = "tokens"},
        {.column = "p90_length", .title = "p90 response length", .y_label = "tokens"}};
    rlvr::plot::write_svg(o.svg, rlvr::plot::panels_of({{.label = "", .table = h.table}}, panels, "step", "reset"));
  }
  const double total = h.warmup_s + rl_elapsed();
  std::printf("validation accuracy: %.3f after warm-up, %.3f last, %.3f best; %lld resets\n", h.val0, h.last_val,
              h.best_val, static_cast<long long>(h.resets));
  std::printf("time: warm-up %.1f s, rollout %.1f s (%lld tokens, %.0f tokens/s), updates %.1f s, total %.1f s\n",
              h.warmup_s, h.rollout_s, static_cast<long long>(h.tokens),
              h.rollout_s > 0 ? static_cast<double>(h.tokens) / h.rollout_s : 0.0, h.train_s, total);
  std::printf("cost model (segment_rollout_sim%s): %s %s\n", resuming ? ", steps of this process" : "",
              rlvr::simulator_flags(rlvr::fit_engine_model(engine.costs())).c_str(),
              rlvr::simulator_flags(rlvr::fit_trainer_model(update_costs)).c_str());
  if (!o.lengths_out.empty()) rlvr::write_length_groups(o.lengths_out, h.released_lengths, o.group);
  if (!o.json.empty()) {
    std::ostringstream j;
    j << "{\"steps\": " << o.steps << ", \"segments\": " << (o.auto_segments ? std::string("\"auto\"") : std::to_string(o.segments)) << ", \"mpt\": \"" << o.mpt << "\", \"resets\": \""
      << o.resets << "\", \"is\": \"" << o.is << "\", \"seed\": " << o.seed << ", \"validation_after_warmup\": " << h.val0
      << ", \"validation_last\": " << h.last_val << ", \"validation_best\": " << h.best_val
      << ", \"resets_done\": " << h.resets << ", \"rollout_seconds\": " << h.rollout_s
      << ", \"update_seconds\": " << h.train_s << ", \"rollout_tokens\": " << h.tokens
      << ", \"total_seconds\": " << total << "}\n";
    cli::write_text_file("--json", o.json, j.str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A usage error exits 2; a file, checkpoint or torch error prints one line naming it and exits 1.
  return cli::run("rlvr_train", [&] { return train(parse(argc, argv)); });
}
