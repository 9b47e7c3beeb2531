// segment_rollout_sim — discrete-event simulation of UloRL segment rollout (docs/segment_rollout.md).
//
//   segment_rollout_sim [--preset ulorl-64k|ulorl-128k] [--segments 1,2,4,8[,auto]] [--json]
//                       [--lengths FILE | --length-groups FILE] [--max-tokens N] [--prompts N] [--group-size G]
//                       [--capacity N]
//                       [--prompt-tokens N] [--steps N] [--warmup N] [--seed S]
//                       [--iteration-ms X] [--per-seq-us X] [--kv-ns X] [--prefill-us X]
//                       [--no-kv-rebuild] [--padded-kv] [--train-token-us X] [--train-step-s X]
//                       [--median-fraction X] [--prompt-sigma X] [--response-sigma X]
//
// Every configuration is driven by the real ulorl::segment_scheduler; the engine and trainer are
// the cost model of ulorl/rollout/simulator.hpp. --lengths FILE reads whitespace-separated response
// lengths (tokens; values above the output limit are truncated responses) and bootstraps from them;
// --length-groups FILE reads whole groups (group-size lengths each, e.g. rlvr_train --lengths-out) and
// bootstraps groups, so that the responses of one prompt keep their correlated lengths.
// `auto` in --segments adds the adaptive count (ulorl::segment_autotuner): it starts at 1 segment,
// sees only the lengths of the groups released so far and the model's costs, and chooses among the
// listed fixed counts (1, 2, 4, 8, 16, 32 when none is listed) after every training step.
// Every option is checked before anything runs (examples/common/args.hpp): whole-token numbers in
// each flag's range, the configuration's bounds (ulorl::rollout_sim_limits) reported against the
// flag that set the value; a usage error exits with status 2, a file or run error with status 1.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/args.hpp"
#include "ulorl/rollout/segment_autotune.hpp"
#include "ulorl/rollout/simulator.hpp"

namespace {

void usage() {
  std::printf("usage: segment_rollout_sim [--preset ulorl-64k|ulorl-128k] [--segments 1,2,4[,auto]] [--json]\n"
              "       [--lengths FILE | --length-groups FILE] [--max-tokens N] [--prompts N] [--group-size G] [--prompt-tokens N]\n"
              "       [--capacity N]\n"
              "       [--steps N] [--warmup N] [--seed S] [--iteration-ms X] [--per-seq-us X] [--kv-ns X]\n"
              "       [--prefill-us X] [--no-kv-rebuild] [--padded-kv] [--train-token-us X] [--train-step-s X]\n"
              "       [--median-fraction X] [--prompt-sigma X] [--response-sigma X]\n");
}

constexpr std::int32_t auto_segments = -1;  // "auto" in --segments: the adaptive count

//! --segments: a comma-separated list of counts in [1, 2^31 - 1] and "auto", at most 64 entries, none twice.
std::vector<std::int32_t> parse_list(std::string_view s) {
  constexpr std::string_view flag = "--segments";
  std::vector<std::int32_t> out;
  for (std::size_t at = 0;;) {
    const auto comma = s.find(',', at);
    const auto item = s.substr(at, comma == std::string_view::npos ? std::string_view::npos : comma - at);
    if (item.empty()) cli::fail(flag, "empty entry in '" + std::string(s.substr(0, 64)) + "'");
    const auto n = item == "auto" ? auto_segments : cli::integer<std::int32_t>(flag, item, 1, INT32_MAX);
    if (std::find(out.begin(), out.end(), n) != out.end()) cli::fail(flag, "'" + std::string(item) + "' is listed twice");
    out.push_back(n);
    if (out.size() > 64) cli::fail(flag, "more than 64 entries");
    if (comma == std::string_view::npos) break;
    at = comma + 1;
  }
  return out;
}

//! Whitespace-separated response lengths, each an integer in [1, 2^62] (the file is read through
//! ulorl's bounded reader: a regular file of at most 1 GiB).
std::vector<std::int64_t> read_lengths(std::string_view flag, const std::string& path) {
  const std::string text = cli::read_text_file(flag, path);
  std::vector<std::int64_t> v;
  const char* p = text.data();
  const char* const end = p + text.size();
  for (;;) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\v' || *p == '\f')) ++p;
    if (p == end) break;
    const char* q = p;
    while (q < end && !(*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r' || *q == '\v' || *q == '\f')) ++q;
    std::int64_t x = 0;
    const auto [stop, ec] = std::from_chars(p, q, x);
    if (ec != std::errc() || stop != q || x < 1 || x > ulorl::rollout_sim_limits::max_empirical_length)
      throw cli::file_error(flag, path, "entry " + std::to_string(v.size()) + " " + cli::detail::quoted(std::string_view(p, static_cast<std::size_t>(q - p))) +
                                            " is not a length in [1, 2^62]");
    v.push_back(x);
    p = q;
  }
  if (v.empty()) throw cli::file_error(flag, path, "holds no lengths");
  return v;
}

//! The flag that sets a field of rollout_sim_config (for the library's refusals).
std::string_view flag_of(std::string_view field) {
  static constexpr std::pair<std::string_view, std::string_view> table[] = {
      {"max_response_tokens", "--max-tokens"},
      {"prompt_tokens", "--prompt-tokens"},
      {"group_size", "--group-size"},
      {"prompts_per_step", "--prompts"},
      {"engine_capacity", "--capacity"},
      {"warmup_steps", "--warmup"},
      {"measured_steps", "--steps"},
      {"segments", "--segments"},
      {"lengths.median_fraction", "--median-fraction"},
      {"lengths.prompt_sigma", "--prompt-sigma"},
      {"lengths.response_sigma", "--response-sigma"},
      {"lengths.empirical", "--lengths/--length-groups"},
      {"engine.iteration_s", "--iteration-ms"},
      {"engine.per_sequence_s", "--per-seq-us"},
      {"engine.per_context_token_s", "--kv-ns"},
      {"engine.prefill_token_s", "--prefill-us"},
      {"engine", "--iteration-ms/--per-seq-us/--kv-ns"},
      {"trainer.per_token_s", "--train-token-us"},
      {"trainer.per_step_s", "--train-step-s"},
      {"trainer", "--train-token-us/--train-step-s"}};
  for (const auto& [f, flag] : table)
    if (f == field) return flag;
  return "";
}

//! The options that take a value (besides --preset and --segments).
bool flag_known(std::string_view a) {
  for (const std::string_view f : {"--lengths", "--length-groups", "--max-tokens", "--prompts", "--capacity", "--group-size",
                                   "--prompt-tokens", "--steps", "--warmup", "--seed", "--iteration-ms", "--per-seq-us",
                                   "--kv-ns", "--prefill-us", "--train-token-us", "--train-step-s", "--median-fraction",
                                   "--prompt-sigma", "--response-sigma"})
    if (a == f) return true;
  return false;
}

int run(int argc, char** argv) {
    std::string preset = "ulorl-64k";
    bool preset_given = false, json = false;
    std::vector<std::int32_t> segments;
    // Options are applied after the preset, whatever their order on the command line.
    std::vector<std::pair<std::string, std::string>> opts;
    cli::reader args(argc, argv);
    while (args.next()) {
      const std::string_view a = args.flag();
      if (a == "--json") {
        json = true;
      } else if (a == "--no-kv-rebuild" || a == "--padded-kv") {
        opts.emplace_back(a, "");
      } else if (a == "--help" || a == "-h") {
        usage();
        return 0;
      } else if (a == "--preset") {
        preset = cli::choice(a, args.value(), {"ulorl-64k", "ulorl-128k"});
        preset_given = true;
      } else if (a == "--segments") {
        segments = parse_list(args.value());
      } else if (a.substr(0, 2) == "--" && flag_known(a)) {
        opts.emplace_back(a, args.value());
      } else {
        args.unknown();
      }
    }
    auto cfg = ulorl::rollout_sim_preset(preset);
    for (const auto& [k, v] : opts) {
      const std::string_view f = k;
      constexpr std::int64_t t40 = std::int64_t{1} << 40, t20 = std::int64_t{1} << 20;
      if (k == "--lengths" || k == "--length-groups") {
        cfg.lengths.empirical = read_lengths(f, cli::path(f, v));
        cfg.lengths.empirical_grouped = k == "--length-groups";
      }
      else if (k == "--max-tokens") cfg.max_response_tokens = cli::integer<std::int64_t>(f, v, 1, t40);
      else if (k == "--prompts") cfg.prompts_per_step = cli::integer<std::int64_t>(f, v, 1, INT32_MAX);
      else if (k == "--capacity") cfg.engine_capacity = cli::integer<std::int64_t>(f, v, 0, INT32_MAX);
      else if (k == "--group-size") cfg.group_size = cli::integer<std::int32_t>(f, v, 1, 1 << 20);
      else if (k == "--prompt-tokens") cfg.prompt_tokens = cli::integer<std::int64_t>(f, v, 0, t40);
      else if (k == "--steps") cfg.measured_steps = cli::integer<std::int64_t>(f, v, 1, t20);
      else if (k == "--warmup") cfg.warmup_steps = cli::integer<std::int64_t>(f, v, 0, t20);
      else if (k == "--seed") cfg.seed = cli::integer<std::uint64_t>(f, v, 0, UINT64_MAX);
      else if (k == "--iteration-ms") cfg.engine.iteration_s = cli::real(f, v, 0, 1e9) * 1e-3;
      else if (k == "--per-seq-us") cfg.engine.per_sequence_s = cli::real(f, v, 0, 1e12) * 1e-6;
      else if (k == "--kv-ns") cfg.engine.per_context_token_s = cli::real(f, v, 0, 1e15) * 1e-9;
      else if (k == "--prefill-us") cfg.engine.prefill_token_s = cli::real(f, v, 0, 1e12) * 1e-6;
      else if (k == "--no-kv-rebuild") cfg.engine.rebuild_kv_on_resume = false;
      else if (k == "--padded-kv") cfg.engine.padded_kv = true;
      else if (k == "--train-token-us") cfg.trainer.per_token_s = cli::real(f, v, 0, 1e12) * 1e-6;
      else if (k == "--train-step-s") cfg.trainer.per_step_s = cli::real(f, v, 0, 1e6);
      else if (k == "--median-fraction") cfg.lengths.median_fraction = cli::real(f, v, 0, 1e6, true);
      else if (k == "--prompt-sigma") cfg.lengths.prompt_sigma = cli::real(f, v, 0, 100);
      else if (k == "--response-sigma") cfg.lengths.response_sigma = cli::real(f, v, 0, 100);
    }
    // The configuration's own bounds (sums and products of several values, costs in seconds), as a
    // usage error naming the flag that set the refused value.
    try {
      ulorl::detail::validate_sim_config("segment_rollout_sim", cfg);
      for (const auto n : segments)
        if (n != auto_segments && n > cfg.max_response_tokens)
          cli::fail("--segments", std::to_string(n) + " exceeds --max-tokens " + std::to_string(cfg.max_response_tokens));
    } catch (const ulorl::error& e) {
      const auto flag = flag_of(e.argument());
      cli::fail(flag.empty() ? std::string_view("option") : flag, e.what());
    }
    if (segments.empty()) segments = preset_given ? std::vector<std::int32_t>{1, 2, 4} : std::vector<std::int32_t>{1, 2, 4, 8};
    // "auto": ulorl::segment_autotuner chooses among the listed fixed counts (1, 2, 4, 8, 16, 32 when
    // none is listed), starting from 1.
    std::vector<std::int32_t> fixed;
    for (const auto n : segments)
      if (n != auto_segments) fixed.push_back(n);
    const bool with_auto = fixed.size() != segments.size();
    auto runs = ulorl::simulate_segment_rollouts(cfg, fixed);
    if (with_auto) {
      ulorl::segment_autotune_config a;
      a.candidates = fixed.empty() ? std::vector<std::int32_t>{1, 2, 4, 8, 16, 32} : fixed;
      if (std::find(a.candidates.begin(), a.candidates.end(), 1) == a.candidates.end()) a.candidates.insert(a.candidates.begin(), 1);
      a.min_groups = std::min<std::int64_t>(a.window_groups, std::max<std::int64_t>(16, cfg.prompts_per_step));
      auto r = ulorl::simulate_segment_rollout_auto(cfg, a);
      const auto one = std::find_if(runs.begin(), runs.end(), [](const auto& x) { return x.segments == 1; });
      r.speedup = (one != runs.end() ? one->step_time : ulorl::simulate_segment_rollout(cfg, 1).step_time) / r.step_time;
      runs.push_back(r);
    }

    if (json) {
      std::printf("{\"preset\":\"%s\",\"config\":{\"max_response_tokens\":%lld,\"prompts_per_step\":%lld,\"group_size\":%d,"
                  "\"prompt_tokens\":%lld,\"engine_capacity\":%lld,\"measured_steps\":%lld,\"warmup_steps\":%lld,\"seed\":%llu,"
                  "\"lengths\":\"%s\",\"engine\":{\"iteration_s\":%.9g,\"per_sequence_s\":%.9g,\"per_context_token_s\":%.9g,"
                  "\"prefill_token_s\":%.9g,\"rebuild_kv_on_resume\":%s,\"padded_kv\":%s},\"trainer\":{\"per_token_s\":%.9g,\"per_step_s\":%.9g}},",
                  preset.c_str(), static_cast<long long>(cfg.max_response_tokens), static_cast<long long>(cfg.prompts_per_step),
                  cfg.group_size, static_cast<long long>(cfg.prompt_tokens),
                  static_cast<long long>(cfg.engine_capacity > 0 ? cfg.engine_capacity : cfg.prompts_per_step * cfg.group_size),
                  static_cast<long long>(cfg.measured_steps),
                  static_cast<long long>(cfg.warmup_steps), static_cast<unsigned long long>(cfg.seed),
                  cfg.lengths.empirical.empty() ? "lognormal" : cfg.lengths.empirical_grouped ? "file, groups" : "file", cfg.engine.iteration_s, cfg.engine.per_sequence_s,
                  cfg.engine.per_context_token_s, cfg.engine.prefill_token_s, cfg.engine.rebuild_kv_on_resume ? "true" : "false", cfg.engine.padded_kv ? "true" : "false",
                  cfg.trainer.per_token_s, cfg.trainer.per_step_s);
      std::printf("\"runs\":[");
      for (std::size_t i = 0; i < runs.size(); ++i) {
        const auto& r = runs[i];
        std::printf("%s{\"segments\":%s,\"final_segments\":%d,\"step_time\":%.6g,\"speedup\":%.6g,\"tokens_per_s\":%.6g,\"idle_fraction\":%.6g,"
                    "\"tail_idle_fraction\":%.6g,\"rollout_time\":%.6g,\"train_time\":%.6g,\"rollout_steps_per_train_step\":%.6g,"
                    "\"mean_response_tokens\":%.6g,\"truncated_fraction\":%.6g,\"staleness\":{\"mean_lag\":%.6g,\"max_lag\":%lld,"
                    "\"mean_versions_spanned\":%.6g,\"lag_histogram\":[%lld,%lld,%lld,%lld]}}",
                    i ? "," : "", r.segments == 0 ? "\"auto\"" : std::to_string(r.segments).c_str(), r.final_segments,
                    r.step_time, r.speedup, r.tokens_per_s, r.idle_fraction, r.tail_idle_fraction,
                    r.rollout_time, r.train_time, r.rollout_steps_per_train_step, r.mean_response_tokens, r.truncated_fraction,
                    r.mean_lag, static_cast<long long>(r.max_lag), r.mean_versions_spanned,
                    static_cast<long long>(r.lag_histogram[0]), static_cast<long long>(r.lag_histogram[1]),
                    static_cast<long long>(r.lag_histogram[2]), static_cast<long long>(r.lag_histogram[3]));
      }
      std::printf("]");
      if (preset == "ulorl-64k")
        std::printf(",\"paper\":{\"step_time\":{\"1\":1240,\"2\":774,\"4\":601},\"speedup\":{\"1\":1.0,\"2\":1.6,\"4\":2.06}}");
      std::printf("}\n");
      return 0;
    }
    std::printf("UloRL segment rollout simulation: preset %s, L_max %lld, %lld prompts x %d, lengths %s\n", preset.c_str(),
                static_cast<long long>(cfg.max_response_tokens), static_cast<long long>(cfg.prompts_per_step), cfg.group_size,
                cfg.lengths.empirical.empty()  ? "lognormal (default)"
                : cfg.lengths.empirical_grouped ? "from file, whole groups"
                                                : "from file");
    std::printf("%8s %10s %8s %11s %6s %9s %9s %8s %10s %9s %8s %7s\n", "segments", "step_s", "speedup", "tokens/s", "idle",
                "tail_idle", "rollout_s", "train_s", "rsteps/ts", "mean_len", "mean_lag", "max_lag");
    for (const auto& r : runs)
      std::printf("%8s %10.1f %8.2f %11.0f %6.2f %9.2f %9.1f %8.1f %10.2f %9.0f %8.2f %7lld\n",
                  r.segments == 0 ? ("auto->" + std::to_string(r.final_segments)).c_str() : std::to_string(r.segments).c_str(),
                  r.step_time, r.speedup,
                  r.tokens_per_s, r.idle_fraction, r.tail_idle_fraction, r.rollout_time, r.train_time,
                  r.rollout_steps_per_train_step, r.mean_response_tokens, r.mean_lag, static_cast<long long>(r.max_lag));
    if (preset == "ulorl-64k") std::printf("paper (Qwen3-30B-A3B, 64k): 1240 s / 774 s / 601 s per step = 1.00x / 1.60x / 2.06x\n");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return cli::run("segment_rollout_sim", [&] { return run(argc, argv); });
}
