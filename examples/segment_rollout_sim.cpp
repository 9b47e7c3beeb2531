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
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ulorl/rollout/segment_autotune.hpp"
#include "ulorl/rollout/simulator.hpp"

namespace {

void usage() {
  std::fprintf(stderr,
               "usage: segment_rollout_sim [--preset ulorl-64k|ulorl-128k] [--segments 1,2,4[,auto]] [--json]\n"
               "       [--lengths FILE | --length-groups FILE] [--max-tokens N] [--prompts N] [--group-size G] [--prompt-tokens N]\n"
               "       [--capacity N]\n"
               "       [--steps N] [--warmup N] [--seed S] [--iteration-ms X] [--per-seq-us X] [--kv-ns X]\n"
               "       [--prefill-us X] [--no-kv-rebuild] [--padded-kv] [--train-token-us X] [--train-step-s X]\n"
               "       [--median-fraction X] [--prompt-sigma X] [--response-sigma X]\n");
}

constexpr std::int32_t auto_segments = -1;  // "auto" in --segments: the adaptive count

std::vector<std::int32_t> parse_list(const char* s) {
  std::vector<std::int32_t> out;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (cur.empty()) throw std::runtime_error("empty entry in --segments");
      out.push_back(cur == "auto" ? auto_segments : static_cast<std::int32_t>(std::stol(cur)));
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  return out;
}

std::vector<std::int64_t> read_lengths(const char* path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(std::string("cannot open lengths file ") + path);
  std::vector<std::int64_t> v;
  long long x;
  while (in >> x) v.push_back(static_cast<std::int64_t>(x));
  if (!in.eof()) throw std::runtime_error(std::string("lengths file has a non-integer entry: ") + path);
  if (v.empty()) throw std::runtime_error(std::string("lengths file is empty: ") + path);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string preset = "ulorl-64k";
    bool preset_given = false, json = false;
    std::vector<std::int32_t> segments;
    // Options are applied after the preset, whatever their order on the command line.
    std::vector<std::pair<std::string, std::string>> opts;
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      if (a == "--json") {
        json = true;
      } else if (a == "--no-kv-rebuild" || a == "--padded-kv") {
        opts.emplace_back(a, "");
      } else if (a == "--help" || a == "-h") {
        usage();
        return 0;
      } else if (a.substr(0, 2) == "--" && i + 1 < argc) {
        if (a == "--preset") {
          preset = argv[++i];
          preset_given = true;
        } else if (a == "--segments") {
          segments = parse_list(argv[++i]);
        } else {
          opts.emplace_back(a, argv[++i]);
        }
      } else {
        usage();
        return 2;
      }
    }
    auto cfg = ulorl::rollout_sim_preset(preset);
    for (const auto& [k, v] : opts) {
      const char* s = v.c_str();
      if (k == "--lengths" || k == "--length-groups") {
        cfg.lengths.empirical = read_lengths(s);
        cfg.lengths.empirical_grouped = k == "--length-groups";
      }
      else if (k == "--max-tokens") cfg.max_response_tokens = std::stoll(v);
      else if (k == "--prompts") cfg.prompts_per_step = std::stoll(v);
      else if (k == "--capacity") cfg.engine_capacity = std::stoll(v);
      else if (k == "--group-size") cfg.group_size = static_cast<std::int32_t>(std::stol(v));
      else if (k == "--prompt-tokens") cfg.prompt_tokens = std::stoll(v);
      else if (k == "--steps") cfg.measured_steps = std::stoll(v);
      else if (k == "--warmup") cfg.warmup_steps = std::stoll(v);
      else if (k == "--seed") cfg.seed = std::stoull(v);
      else if (k == "--iteration-ms") cfg.engine.iteration_s = std::atof(s) * 1e-3;
      else if (k == "--per-seq-us") cfg.engine.per_sequence_s = std::atof(s) * 1e-6;
      else if (k == "--kv-ns") cfg.engine.per_context_token_s = std::atof(s) * 1e-9;
      else if (k == "--prefill-us") cfg.engine.prefill_token_s = std::atof(s) * 1e-6;
      else if (k == "--no-kv-rebuild") cfg.engine.rebuild_kv_on_resume = false;
      else if (k == "--padded-kv") cfg.engine.padded_kv = true;
      else if (k == "--train-token-us") cfg.trainer.per_token_s = std::atof(s) * 1e-6;
      else if (k == "--train-step-s") cfg.trainer.per_step_s = std::atof(s);
      else if (k == "--median-fraction") cfg.lengths.median_fraction = std::atof(s);
      else if (k == "--prompt-sigma") cfg.lengths.prompt_sigma = std::atof(s);
      else if (k == "--response-sigma") cfg.lengths.response_sigma = std::atof(s);
      else {
        std::fprintf(stderr, "unknown option %s\n", k.c_str());
        usage();
        return 2;
      }
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
  } catch (const std::exception& e) {
    std::fprintf(stderr, "segment_rollout_sim: %s\n", e.what());
    return 1;
  }
}
