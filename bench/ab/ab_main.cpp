// bench/ab/ab_main.cpp — the driver of bench_loss_ab and bench_logits_ab: old and new library code
// measured alternately in one process, and a verdict per case.
//
// This VM's speed drifts by up to ~35% between processes (bench/RESULTS.md), so two builds timed in
// two processes cannot resolve a few percent. Here both versions of ulorl are linked into one
// program (bench/ab/README.md); each side fills a table of cases (ab_common.hpp) and this driver
// registers every case twice, "<case>/new" and "<case>/old", with Google Benchmark. Two modes:
//
//   default   Google Benchmark with random interleaving: the repetitions of all benchmarks run in a
//             shuffled order, so old and new alternate through the same drift. Per case: median CPU
//             time per call of each side over the repetitions, ratio = old / new of the medians,
//             best = the same of the fastest repetitions, spread = the larger interquartile range.
//   --ab_paired   rounds of ABBA blocks (old, new, new, old or the mirror, ~ULORL_AB_BLOCK_MS each),
//             the cases in a shuffled order every round: per round ratio = (old1 + old2) /
//             (new1 + new2), CPU time. Per case: median of the per-round ratios and its 95%
//             confidence interval (order statistics). Pairs that are tens of milliseconds apart cancel
//             the slow drift and most of the load of other processes; the mode to use on a busy machine.
//
// Both print a summary on stderr: per case the median time per call of each side, the ratio
// (> 1: new faster), the relative difference of the loss the two sides computed (dloss), and a flag
// on every case whose ratio is below the threshold (acceptance rule: no case below 0.97x of the old
// code).
//
// Every program is also linked with the other side's objects first (bench_<area>_ab_swapped):
// where the linker puts a hot loop moves its speed by a few percent, so a case counts as below the
// threshold only when it is below in both link orders (bench/ab/README.md).
//
// Build (bench/ab/README.md; the baseline e.g. `git worktree add /tmp/loss_base <commit>`):
//   cmake -S . -B build/ab -DCMAKE_BUILD_TYPE=Release -DULORL_BUILD_BENCH=ON
//         -DULORL_BENCH_BASELINE_INCLUDE=/tmp/loss_base/include      (one command)
//   cmake --build build/ab -j2 --target bench_loss_ab bench_loss_ab_swapped bench_logits_ab bench_logits_ab_swapped
// Run:
//   build/ab/bench/bench_loss_ab                            # ~2 minutes on the 2-vCPU VM
//   build/ab/bench/bench_loss_ab --ab_paired                # ~2.5 minutes
//   build/ab/bench/bench_loss_ab_swapped --ab_paired
//   build/ab/bench/bench_logits_ab [--ab_paired]            # ~1.5 / ~2 minutes; and _swapped
// Defaults (default mode): --benchmark_enable_random_interleaving=true --benchmark_repetitions=10
// --benchmark_min_time=0.1 (loss; logits 0.2); a Google Benchmark flag on the command line overrides
// them (--benchmark_filter=f32/ppo_clip, --benchmark_repetitions=20, --benchmark_out=ab.json ...).
// --benchmark_filter selects the cases in --ab_paired mode too (a regex searched in "<case>/new").
// Environment: ULORL_AB_REPETITIONS, ULORL_AB_MIN_TIME (default mode); ULORL_AB_ROUNDS (30),
// ULORL_AB_BLOCK_MS (20) (--ab_paired); ULORL_AB_MODE=paired; ULORL_AB_THRESHOLD (0.97);
// ULORL_AB_VERBOSE=1 prints every repetition (default: the median and cv aggregates);
// ULORL_AB_STRICT=1 makes the exit status 3 when a case is below the threshold.
#include <benchmark/benchmark.h>

#include "ab_common.hpp"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

namespace ab::side_new {
void register_cases();
}
namespace ab::side_old {
void register_cases();
}

#ifndef AB_SUITE_MIN_TIME
#define AB_SUITE_MIN_TIME "0.1"
#endif
#ifndef AB_NEW_INCLUDE
#define AB_NEW_INCLUDE "the current include/"
#endif
#ifndef AB_OLD_INCLUDE
#define AB_OLD_INCLUDE "the baseline include/"
#endif
#ifndef AB_LINK_ORDER
#define AB_LINK_ORDER "?"
#endif

namespace {

const char* const sides[2] = {"new", "old"};

std::string env_or(const char* name, const char* fallback) {
  const char* e = std::getenv(name);
  return e && *e ? e : fallback;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}
double iqr(const std::vector<double>& v) { return (quantile(v, 0.75) - quantile(v, 0.25)) / quantile(v, 0.5); }

//! What the runs leave for the summary, per case.
struct results {
  std::map<std::string, std::map<std::string, std::vector<double>>> seconds;  //!< [case][side]: per call
  std::map<std::string, std::vector<double>> paired;                         //!< [case]: old / new per round
  std::map<std::string, std::map<std::string, double>> value;                //!< [case][side]: the loss
  std::map<std::string, std::string> error;                                  //!< [case]: "side: what"
};

//! Forwards the runs to the display reporter (by default only the median and cv aggregates) and
//! keeps every repetition's CPU time per call, by case and side.
class ab_reporter : public benchmark::BenchmarkReporter {
 public:
  ab_reporter(benchmark::BenchmarkReporter* inner, bool verbose, results& res) : inner_(inner), verbose_(verbose), res_(res) {}
  bool ReportContext(const Context& c) override { return inner_->ReportContext(c); }
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> shown;
    for (const auto& r : runs) {
      if (verbose_ || r.error_occurred ||
          (r.run_type == Run::RT_Aggregate && (r.aggregate_name == "median" || r.aggregate_name == "cv")))
        shown.push_back(r);
      const std::string& fn = r.run_name.function_name;  // "<case>/<side>"
      const auto slash = fn.rfind('/');
      if (slash == std::string::npos) continue;
      if (r.error_occurred) res_.error[fn.substr(0, slash)] = fn.substr(slash + 1) + ": " + r.error_message;
      if (r.error_occurred || r.run_type != Run::RT_Iteration || r.iterations <= 0) continue;
      res_.seconds[fn.substr(0, slash)][fn.substr(slash + 1)].push_back(r.cpu_accumulated_time / static_cast<double>(r.iterations));
    }
    if (!shown.empty()) inner_->ReportRuns(shown);
  }
  void Finalize() override { inner_->Finalize(); }

 private:
  benchmark::BenchmarkReporter* inner_;
  bool verbose_;
  results& res_;
};

//! One Google Benchmark per case and side.
void register_benchmarks(results& res) {
  for (const char* side : sides)
    for (const auto& c : ab::cases_of(side)) {
      const std::string name = c.name + "/" + side;
      benchmark::RegisterBenchmark(name.c_str(), [&c, side, &res](benchmark::State& st) {
        ab::prepared_case p;
        try {
          p = c.prepare();
          res.value[c.name][side] = p.call();  // fails loudly here, not in the loop
        } catch (const std::exception& e) {
          st.SkipWithError(e.what());
          return;
        }
        for (auto _ : st) {
          benchmark::DoNotOptimize(p.call());
          benchmark::ClobberMemory();
        }
        st.SetItemsProcessed(static_cast<std::int64_t>(static_cast<double>(st.iterations()) * p.items));
        st.SetBytesProcessed(static_cast<std::int64_t>(static_cast<double>(st.iterations()) * p.bytes));
      })->Unit(benchmark::kMillisecond);
    }
}

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

//! --ab_paired: rounds of ABBA blocks per case, the cases shuffled every round.
void run_paired(const std::string& filter, results& res) {
  struct entry {
    std::string name;
    ab::prepared_case side[2];  // new, old
    int calls = 1;              // per block
  };
  const std::regex re(filter.empty() ? std::string(".") : filter);
  std::vector<entry> todo;
  const auto& nc = ab::cases_of("new");
  const auto& oc = ab::cases_of("old");
  for (std::size_t i = 0; i < nc.size() && i < oc.size(); ++i) {
    if (!std::regex_search(nc[i].name + "/new", re)) continue;
    entry e;
    e.name = nc[i].name;
    try {
      for (int s = 0; s < 2; ++s) {
        e.side[s] = (s == 0 ? nc[i] : oc[i]).prepare();
        res.value[e.name][sides[s]] = e.side[s].call();  // also the warm-up
      }
    } catch (const std::exception& ex) {
      res.error[e.name] = ex.what();
      continue;
    }
    todo.push_back(std::move(e));
  }
  const double block = std::strtod(env_or("ULORL_AB_BLOCK_MS", "20").c_str(), nullptr) * 1e-3;
  const int rounds = std::max(1, std::atoi(env_or("ULORL_AB_ROUNDS", "30").c_str()));
  // Calls per block from a few timed calls of each side.
  for (auto& e : todo) {
    double t = 1e300;
    for (int s = 0; s < 2; ++s)
      for (int k = 0; k < 2; ++k) {
        const double t0 = thread_seconds();
        benchmark::DoNotOptimize(e.side[s].call());
        t = std::min(t, thread_seconds() - t0);
      }
    e.calls = std::max(1, static_cast<int>(std::lround(block / std::max(t, 1e-9))));
  }
  std::fprintf(stderr, "paired mode: %zu cases, %d rounds of ABBA blocks of ~%.0f ms\n", todo.size(), rounds, block * 1e3);
  std::mt19937_64 rng(std::random_device{}());
  std::vector<std::size_t> order(todo.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto time_block = [](entry& e, int s) {
    const double t0 = thread_seconds();
    for (int k = 0; k < e.calls; ++k) benchmark::DoNotOptimize(e.side[s].call());
    return thread_seconds() - t0;
  };
  for (int r = 0; r < rounds; ++r) {
    std::shuffle(order.begin(), order.end(), rng);
    for (const std::size_t i : order) {
      entry& e = todo[i];
      const int first = static_cast<int>(rng() & 1u);  // 0: new first
      double t[2] = {0, 0};
      t[first] += time_block(e, first);
      t[1 - first] += time_block(e, 1 - first);
      t[1 - first] += time_block(e, 1 - first);
      t[first] += time_block(e, first);
      for (int s = 0; s < 2; ++s) res.seconds[e.name][sides[s]].push_back(t[s] / (2.0 * e.calls));
      res.paired[e.name].push_back(t[1] / t[0]);
    }
    std::fprintf(stderr, "\r  round %d / %d", r + 1, rounds);
  }
  std::fprintf(stderr, "\n");
}

//! Prints the summary; returns the number of cases below the threshold.
int summary(const results& res, double threshold, bool paired) {
  std::fprintf(stderr,
               "\nA/B summary: new = %s, old = %s (in ulorl::v0_base), one process; linked: %s.\n"
               "CPU time per call, median; ratio = old / new (the speed of new relative to old, > 1: new faster)%s\n"
               "dloss = |new - old| / |old| of the loss (or statistic) computed.\n",
               AB_NEW_INCLUDE, AB_OLD_INCLUDE, AB_LINK_ORDER,
               paired ? ": the median of the per-round ABBA ratios, with its 95% confidence interval; spread = the\n"
                        "interquartile range of the per-round ratios."
                      : " of the medians over the randomly interleaved repetitions; best = the same of the fastest\n"
                        "repetitions; spread = the larger interquartile range of the two sides' repetitions.");
  std::size_t width = 4;
  for (const auto& c : ab::cases_of("new")) width = std::max(width, c.name.size());
  const int w = static_cast<int>(width);
  if (paired)
    std::fprintf(stderr, "%-*s %6s %10s %10s %7s %15s %7s %8s\n", w, "case", "rounds", "new ms", "old ms", "ratio",
                 "95% CI", "spread", "dloss");
  else
    std::fprintf(stderr, "%-*s %6s %10s %10s %7s %7s %7s %8s\n", w, "case", "reps", "new ms", "old ms", "ratio", "best",
                 "spread", "dloss");
  int below = 0, n = 0;
  double log_sum = 0, lo_ratio = 1e300, hi_ratio = 0;
  std::string lo_name, hi_name;
  for (const auto& c : ab::cases_of("new")) {
    if (const auto e = res.error.find(c.name); e != res.error.end()) {
      std::fprintf(stderr, "%-*s  error: %s\n", w, c.name.c_str(), e->second.c_str());
      continue;
    }
    const auto it = res.seconds.find(c.name);
    if (it == res.seconds.end()) continue;  // filtered out
    const auto nw = it->second.find("new"), od = it->second.find("old");
    if (nw == it->second.end() || od == it->second.end()) {
      std::fprintf(stderr, "%-*s  only one side ran (--benchmark_filter?)\n", w, c.name.c_str());
      continue;
    }
    const double mn = quantile(nw->second, 0.5), mo = quantile(od->second, 0.5);
    char dloss[32] = "-";
    if (const auto v = res.value.find(c.name); v != res.value.end() && v->second.count("new") && v->second.count("old")) {
      const double vn = v->second.at("new"), vo = v->second.at("old");
      std::snprintf(dloss, sizeof dloss, "%.1e", vo != 0 ? std::fabs(vn - vo) / std::fabs(vo) : std::fabs(vn));
    }
    double ratio;
    if (paired) {
      std::vector<double> rs = res.paired.at(c.name);
      std::sort(rs.begin(), rs.end());
      ratio = quantile(rs, 0.5);
      // Distribution-free 95% interval of the median: ranks n/2 -+ 0.98 sqrt(n).
      const double m = static_cast<double>(rs.size());
      const auto rank = [&](double k) { return rs[static_cast<std::size_t>(std::clamp(k, 0.0, m - 1))]; };
      const double lo = rank(std::floor(m / 2 - 0.98 * std::sqrt(m))), hi = rank(std::ceil(m / 2 + 0.98 * std::sqrt(m)) - 1);
      char ci[32];
      std::snprintf(ci, sizeof ci, "[%.3f, %.3f]", lo, hi);
      std::fprintf(stderr, "%-*s %6zu %10.4f %10.4f %7.3f %15s %6.1f%% %8s%s\n", w, c.name.c_str(), rs.size(), mn * 1e3, mo * 1e3,
                   ratio, ci, 100 * (quantile(rs, 0.75) - quantile(rs, 0.25)), dloss, ratio < threshold ? "  <-- BELOW" : "");
    } else {
      ratio = mo / mn;
      const double best = *std::min_element(od->second.begin(), od->second.end()) /
                          *std::min_element(nw->second.begin(), nw->second.end());
      std::fprintf(stderr, "%-*s %3zu/%-2zu %10.4f %10.4f %7.3f %7.3f %6.1f%% %8s%s\n", w, c.name.c_str(), nw->second.size(),
                   od->second.size(), mn * 1e3, mo * 1e3, ratio, best, 100 * std::max(iqr(nw->second), iqr(od->second)), dloss,
                   ratio < threshold ? "  <-- BELOW" : "");
    }
    below += ratio < threshold;
    ++n;
    log_sum += std::log(ratio);
    if (ratio < lo_ratio) lo_ratio = ratio, lo_name = c.name;
    if (ratio > hi_ratio) hi_ratio = ratio, hi_name = c.name;
  }
  if (n > 0)
    std::fprintf(stderr, "%d cases: ratio geomean %.3f, min %.3f (%s), max %.3f (%s); below %.2f: %d\n", n, std::exp(log_sum / n),
                 lo_ratio, lo_name.c_str(), hi_ratio, hi_name.c_str(), threshold, below);
  return below;
}

}  // namespace

int main(int argc, char** argv) {
  ab::side_new::register_cases();
  ab::side_old::register_cases();
  const auto& nc = ab::cases_of("new");
  const auto& oc = ab::cases_of("old");
  bool same = nc.size() == oc.size();
  for (std::size_t i = 0; same && i < nc.size(); ++i) same = nc[i].name == oc[i].name;
  if (!same) {
    std::fprintf(stderr, "bench_ab: the two sides register different cases\n");
    return 1;
  }

  bool paired = env_or("ULORL_AB_MODE", "") == "paired";
  std::string filter;
  // Defaults first: a flag given on the command line comes later and wins.
  std::vector<std::string> defaults = {"--benchmark_enable_random_interleaving=true",
                                       "--benchmark_repetitions=" + env_or("ULORL_AB_REPETITIONS", "10"),
                                       "--benchmark_min_time=" + env_or("ULORL_AB_MIN_TIME", AB_SUITE_MIN_TIME)};
  std::vector<char*> args{argv[0]};
  for (auto& d : defaults) args.push_back(d.data());
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ab_paired") {
      paired = true;
      continue;
    }
    if (a.rfind("--benchmark_filter=", 0) == 0) filter = a.substr(19);
    args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;

  results res;
  const double threshold = std::strtod(env_or("ULORL_AB_THRESHOLD", "0.97").c_str(), nullptr);
  if (paired) {
    run_paired(filter, res);
  } else {
    register_benchmarks(res);
    ab_reporter rep(benchmark::CreateDefaultDisplayReporter(), env_or("ULORL_AB_VERBOSE", "0") != "0", res);
    benchmark::RunSpecifiedBenchmarks(&rep);
  }
  const int below = summary(res, threshold, paired);
  benchmark::Shutdown();
  return below > 0 && env_or("ULORL_AB_STRICT", "0") != "0" ? 3 : 0;
}
