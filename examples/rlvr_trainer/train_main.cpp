// rlvr_train — the libtorch RLVR trainer: a small transformer (policy.hpp), a supervised warm-up
// (warmup.hpp), then RL on the countdown task (task.hpp): the segment scheduler drives the KV-cache
// engine (rollout.hpp), each released batch of whole groups gets one GRPO update (trainer.hpp:
// dynamic sampling, POIS/SAIS, MPT, clip-higher + adaptive k3 KL, token-mean, AdamW, reference
// resets on validation plateaus), and the engine and scheduler move to the new weights.
//
//   rlvr_train [--steps N] [--segments K] [--mpt off|static|dynamic] [--resets on|off] [--is pois|sais]
//              [--prompts P] [--group G] [--max-response L] [--warmup N] [--checkpoint FILE]
//              [--lr X] [--lr-warmup N] [--mini-batches M] [--temperature T] [--validate N] [--validate-every K]
//              [--seed S] [--threads N] [--csv FILE] [--json FILE] [--svg FILE] [--min-target S] [--max-target S]
//              [--validation greedy|sampled]
//              [--agg token-mean|seq-mean-token-mean] [--mpt-tau P] [--mpt-sigma H] [--lengths-out FILE]
//
// One line per training step: rollout and update seconds, responses released / kept by dynamic
// sampling, mean reward, entropy, KL to the reference and beta, clip fraction, MPT-masked share,
// median response length, decode tokens/s; validation accuracy every --validate-every steps (and
// resets when they happen). --csv writes the same per step, --svg its curves (validation accuracy,
// reward, entropy, KL, response lengths; resets marked), --json a summary at the end. On a terminal a
// progress bar on stderr shows step, reward, accuracy, entropy, tokens/s and the time left.
// Validation is greedy decoding (default) or sampling at the training temperature.
// --checkpoint FILE loads warmed-up weights from FILE when it exists, else warms up and saves them.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine.hpp"
#include "plot.hpp"
#include "policy.hpp"
#include "rollout.hpp"
#include "task.hpp"
#include "trainer.hpp"
#include "warmup.hpp"

namespace {

// The defaults are the measured default run (examples/rlvr_trainer/README.md, docs/trainer.md): RL on
// targets 90..270 with a 128-token budget, where the warmed-up policy's uniform digit choices often
// run out of tokens and larger steps fit.
struct options {
  int steps = 30;
  int segments = 1;
  int prompts = 8;
  int group = 8;
  int max_response = 128;
  int warmup = 800;
  int mini_batches = 2;
  int validate = 128;
  int validate_every = 5;
  int threads = 1;
  int max_target = 270;
  int min_target = 90;
  double lr = 3e-4;
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
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "%s\nusage: rlvr_train [--steps N] [--segments K] [--mpt off|static|dynamic] [--resets on|off]\n"
               "       [--is pois|sais] [--prompts P] [--group G] [--max-response L] [--warmup N]\n"
               "       [--checkpoint FILE] [--lr X] [--lr-warmup N] [--mini-batches M] [--temperature T] [--validate N]\n"
               "       [--validate-every K] [--seed S] [--threads N] [--csv FILE] [--json FILE] [--svg FILE]\n"
               "       [--min-target S] [--max-target S] [--validation greedy|sampled]\n"
               "       [--agg token-mean|seq-mean-token-mean] [--mpt-tau P] [--mpt-sigma H] [--lengths-out FILE]\n",
               why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") usage("rlvr_train: RLVR on the countdown task through ulorl");
    if (i + 1 >= argc) usage("missing value for " + a);
    const std::string v = argv[++i];
    try {
      if (a == "--steps") o.steps = std::stoi(v);
      else if (a == "--segments") o.segments = std::stoi(v);
      else if (a == "--prompts") o.prompts = std::stoi(v);
      else if (a == "--group") o.group = std::stoi(v);
      else if (a == "--max-response") o.max_response = std::stoi(v);
      else if (a == "--warmup") o.warmup = std::stoi(v);
      else if (a == "--mini-batches") o.mini_batches = std::stoi(v);
      else if (a == "--validate") o.validate = std::stoi(v);
      else if (a == "--validate-every") o.validate_every = std::stoi(v);
      else if (a == "--threads") o.threads = std::stoi(v);
      else if (a == "--max-target") o.max_target = std::stoi(v);
      else if (a == "--min-target") o.min_target = std::stoi(v);
      else if (a == "--validation") o.validation = v;
      else if (a == "--agg") o.agg = v;
      else if (a == "--svg") o.svg = v;
      else if (a == "--lengths-out") o.lengths_out = v;
      else if (a == "--lr") o.lr = std::stod(v);
      else if (a == "--lr-warmup") o.lr_warmup = std::stoi(v);
      else if (a == "--mpt-tau") o.mpt_tau = std::stod(v);
      else if (a == "--mpt-sigma") o.mpt_sigma = std::stod(v);
      else if (a == "--temperature") o.temperature = std::stod(v);
      else if (a == "--seed") o.seed = std::stoull(v);
      else if (a == "--mpt") o.mpt = v;
      else if (a == "--resets") o.resets = v;
      else if (a == "--is") o.is = v;
      else if (a == "--checkpoint") o.checkpoint = v;
      else if (a == "--csv") o.csv = v;
      else if (a == "--json") o.json = v;
      else usage("unknown option " + a);
    } catch (const std::logic_error&) {
      usage("invalid value '" + v + "' for " + a);
    }
  }
  if (o.steps < 0 || o.segments < 1 || o.prompts < 1 || o.group < 2 || o.max_response < 1 || o.warmup < 0 ||
      o.mini_batches < 1 || o.validate < 0 || o.validate_every < 1 || o.threads < 1 || o.lr_warmup < 0 ||
      !(o.mpt_tau > 0 && o.mpt_tau <= 1) || !(o.mpt_sigma >= 0) ||
      o.max_target < 10 || o.max_target > 999 || o.min_target < 1 || o.min_target > o.max_target || !(o.lr > 0) || !(o.temperature > 0))
    usage("option value out of range");
  if (o.mpt != "off" && o.mpt != "static" && o.mpt != "dynamic") usage("--mpt must be off, static or dynamic");
  if (o.resets != "on" && o.resets != "off") usage("--resets must be on or off");
  if (o.is != "pois" && o.is != "sais") usage("--is must be pois or sais");
  if (o.validation != "greedy" && o.validation != "sampled") usage("--validation must be greedy or sampled");
  if (o.agg != "token-mean" && o.agg != "seq-mean-token-mean") usage("--agg must be token-mean or seq-mean-token-mean");
  return o;
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

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
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
  std::printf("policy: %lld parameters; countdown task, L_max %d; %d segments, MPT %s, resets %s, %s\n",
              static_cast<long long>(policy->parameter_count()), o.max_response, o.segments, o.mpt.c_str(),
              o.resets.c_str(), o.is == "pois" ? "POIS" : "SAIS");

  // Supervised warm-up (or its saved result).
  if (!o.checkpoint.empty() && std::ifstream(o.checkpoint).good()) {
    torch::load(policy, o.checkpoint);
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
    if (!o.checkpoint.empty()) torch::save(policy, o.checkpoint);
  }
  const double t_warm = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();

  rlvr::decode_engine engine(policy, {.max_batch = 2 * o.prompts * o.group, .temperature = o.temperature,
                                      .eos_token = rlvr::countdown_task::eos_token, .seed = o.seed});
  const auto val_targets = task.validation_targets(o.validate);
  const auto validate = [&] {
    if (o.validate == 0) return 0.0;
    return o.validation == "greedy" ? rlvr::greedy_accuracy(task, engine, val_targets)
                                    : rlvr::sampled_accuracy(task, engine, val_targets);
  };
  const double val0 = validate();
  std::printf("validation accuracy after warm-up (%d held-out targets, %s): %.3f\n", o.validate,
              o.validation == "greedy" ? "greedy" : "sampled", val0);

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
  rlvr::grpo_trainer trainer(policy, tc);
  rlvr::segment_rollout rollout(task, engine,
                                {.group_size = o.group,
                                 .max_response_tokens = o.max_response,
                                 .num_segments = o.segments,
                                 .max_active_responses = 2 * o.prompts * o.group,
                                 .release_batch_groups = o.prompts},
                                [&](std::int64_t g) { return task.training_target(static_cast<std::uint64_t>(g)); });

  rlvr::plot::csv_table record{.names = {"step", "rollout_s", "train_s", "released", "kept", "reward", "entropy", "kl",
                                          "kl_coef", "clip_fraction", "mpt_masked", "median_length", "p90_length",
                                          "decode_tokens_per_s", "validation_accuracy", "reset", "elapsed_s"}};
  record.append({0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, o.validate > 0 ? val0 : NAN, 0, 0});
  progress_bar bar(o.steps);
  std::vector<std::int64_t> released_lengths;
  const auto t_rl = std::chrono::steady_clock::now();
  std::printf("%4s %7s %6s %5s %4s %6s %7s %8s %8s %6s %5s %5s %6s %6s\n", "step", "roll_s", "upd_s", "resp", "kept",
              "reward", "entropy", "kl", "beta", "clip", "mpt%", "len50", "tok/s", "val");
  double best_val = val0, last_val = val0, rollout_s = 0, train_s = 0;
  std::int64_t tokens = 0, resets = 0, version = engine.policy_version();
  for (int step = 1; step <= o.steps; ++step) {
    // Rollout steps until the scheduler releases a batch of whole groups.
    double roll = 0;
    std::int64_t new_tokens = 0;
    const rlvr::rollout_batch* batch = nullptr;
    while (true) {
      if (rollout.scheduler().queued_groups() < o.prompts) rollout.offer_prompts(o.prompts);
      const auto rs = rollout.step();
      roll += rs.seconds;
      new_tokens += rs.new_tokens;
      const auto& b = rollout.take_experience();
      if (!b.responses.empty()) {
        batch = &b;
        break;
      }
    }
    std::vector<std::int64_t> lengths;
    for (const auto& r : batch->responses) lengths.push_back(static_cast<std::int64_t>(r.tokens.size()));
    released_lengths.insert(released_lengths.end(), lengths.begin(), lengths.end());
    const auto st = trainer.train(*batch, step);
    if (st.updated) rollout.update_policy(++version);
    rollout_s += roll;
    train_s += st.seconds;
    tokens += new_tokens;
    std::string val = "";
    double val_now = NAN;
    bool reset = false;
    if (o.validate > 0 && step % o.validate_every == 0) {
      last_val = validate();
      val_now = last_val;
      best_val = std::max(best_val, last_val);
      const auto a = trainer.on_validation(step, last_val);
      reset = a.reset_reference;
      resets += reset ? 1 : 0;
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3f%s", last_val, reset ? " R" : "");
      val = buf;
    }
    const double mpt_share = st.tokens > 0 ? 100.0 * st.mpt_masked / st.tokens : 0.0;
    const double tok_s = roll > 0 ? static_cast<double>(new_tokens) / roll : 0.0;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_rl).count();
    bar.clear();
    std::printf("%4d %7.1f %6.1f %5lld %4lld %6.3f %7.4f %8.5f %8.5f %6.4f %5.1f %5lld %6.0f %6s\n", step, roll,
                st.seconds, static_cast<long long>(st.responses), static_cast<long long>(st.kept_responses),
                st.reward_mean, st.entropy_mean, st.kl_mean, st.kl_coef, st.clip_fraction, mpt_share,
                static_cast<long long>(quantile(lengths, 0.5)), tok_s, val.c_str());
    std::fflush(stdout);
    bar.show(step, st.reward_mean, last_val, st.entropy_mean, tok_s, elapsed);
    const auto updated = [&](double v) { return st.updated ? v : NAN; };
    record.append({static_cast<double>(step), roll, st.seconds, static_cast<double>(st.responses),
                   static_cast<double>(st.kept_responses), st.reward_mean, updated(st.entropy_mean), updated(st.kl_mean),
                   st.kl_coef, updated(st.clip_fraction), mpt_share, static_cast<double>(quantile(lengths, 0.5)),
                   static_cast<double>(quantile(lengths, 0.9)), tok_s, val_now, reset ? 1.0 : 0.0, elapsed});
  }
  bar.clear();
  if (!o.csv.empty()) record.write(o.csv);
  if (!o.svg.empty()) {
    const std::vector<rlvr::plot::panel_spec> panels{
        {.column = "validation_accuracy", .title = "Validation accuracy (" + o.validation + ")", .y_label = "accuracy"},
        {.column = "reward", .title = "Mean reward of the released responses", .y_label = "reward"},
        {.column = "entropy", .title = "Entropy per response token", .y_label = "nats"},
        {.column = "kl", .title = "k3 KL to the reference per loss token", .y_label = "nats"},
        {.column = "median_length", .title = "Median response length", .y_label = "tokens"},
        {.column = "p90_length", .title = "p90 response length", .y_label = "tokens"}};
    rlvr::plot::write_svg(o.svg, rlvr::plot::panels_of({{.label = "", .table = record}}, panels, "step", "reset"));
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::printf("validation accuracy: %.3f after warm-up, %.3f last, %.3f best; %lld resets\n", val0, last_val, best_val,
              static_cast<long long>(resets));
  std::printf("time: warm-up %.1f s, rollout %.1f s (%lld tokens, %.0f tokens/s), updates %.1f s, total %.1f s\n", t_warm,
              rollout_s, static_cast<long long>(tokens), rollout_s > 0 ? static_cast<double>(tokens) / rollout_s : 0.0,
              train_s, total);
  std::printf("engine cost model (segment_rollout_sim): %s\n",
              rlvr::simulator_flags(rlvr::fit_engine_model(engine.costs())).c_str());
  if (!o.lengths_out.empty()) {
    std::ofstream f(o.lengths_out);
    for (const auto L : released_lengths) f << L << '\n';
  }
  if (!o.json.empty()) {
    std::ofstream j(o.json);
    j << "{\"steps\": " << o.steps << ", \"segments\": " << o.segments << ", \"mpt\": \"" << o.mpt << "\", \"resets\": \""
      << o.resets << "\", \"is\": \"" << o.is << "\", \"seed\": " << o.seed << ", \"validation_after_warmup\": " << val0
      << ", \"validation_last\": " << last_val << ", \"validation_best\": " << best_val << ", \"resets_done\": " << resets
      << ", \"rollout_seconds\": " << rollout_s << ", \"update_seconds\": " << train_s << ", \"rollout_tokens\": " << tokens
      << ", \"total_seconds\": " << total << "}\n";
  }
  return 0;
}
