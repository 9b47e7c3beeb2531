// bench_loss_features: what each loss feature costs, as a percentage of the plain fused pass, measured
// in the same run. The plain pass is bench_loss's (float, 4M tokens in rows of 8192, uint8 mask,
// clip-higher 0.2/0.28 + k3 KL with verl's clamps + token-mean, forward, backward and metrics, value
// scan on). Each feature changes one thing:
//   weights          policy_loss_inputs::weights given (rollout-correction / OPSM / DPPO factors)
//   rc_apply         rollout_correction::apply alone (TRL token_truncate, clip_max 3): weights + mask
//   rc_then_loss     rollout_correction::apply, then the loss with its weights and mask (the
//                    composition: apply's passes, then the loss's)
//   rc_in_loss       the same correction inside the loss pass (policy_loss_config::rollout):
//                    the same bits as rc_then_loss, no weights or keep-mask written or read
//   rc_rs_in_loss    rc_in_loss with a rejection chain (token k2, sequence-mean k3): the statistics
//                    pass (rollout_correction::accumulate, no outputs) for the kept-token normaliser,
//                    then the loss pass
//   cispo / sapo / policy_gradient / penalized_pg (verl dro)   the objective instead of PPO clip
// Run with --benchmark_enable_random_interleaving=true --benchmark_repetitions=5 so that the
// variants alternate in one process (this VM's speed drifts between processes); the summary on
// stderr compares the best repetitions.
#include <benchmark/benchmark.h>

#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/loss/rollout_correction.hpp>
#include <ulorl/presets/trl.hpp>
#include <ulorl/presets/verl.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr std::size_t row_len = 8192;
constexpr std::size_t tokens = std::size_t{1} << 22;

struct batch {
  std::size_t B = tokens / row_len;
  bench::aligned_vector<float> lp, old, ref, adv, rollout, weights, grad;
  bench::aligned_vector<std::uint8_t> mask, keep;
  double valid = 0;
  batch()
      : lp(tokens), old(tokens), ref(tokens), adv(tokens), rollout(tokens), weights(tokens, 1.0f), grad(tokens),
        mask(tokens), keep(tokens) {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> u(0, 1);
    for (std::size_t i = 0; i < tokens; ++i) {
      old[i] = static_cast<float>(-4 * u(rng));
      lp[i] = static_cast<float>(old[i] + (u(rng) - 0.5) * 0.8);
      ref[i] = static_cast<float>(lp[i] + (u(rng) - 0.5) * 0.5);
      rollout[i] = static_cast<float>(old[i] + (u(rng) - 0.5) * 0.2);
      adv[i] = static_cast<float>((u(rng) - 0.5) * 2);
      mask[i] = (i % row_len) < row_len - (i / row_len) % 1000;
      valid += mask[i];
    }
  }
  template <class T>
  ulorl::token_view<const T> view(const bench::aligned_vector<T>& v) const {
    return ulorl::token_view<const T>::padded(ulorl::matrix_view<const T>(v.data(), B, row_len));
  }
  template <class T>
  ulorl::token_view<T> out(bench::aligned_vector<T>& v) const {
    return ulorl::token_view<T>::padded(ulorl::matrix_view<T>(v.data(), B, row_len));
  }
};

batch& data() {
  static batch b;
  return b;
}

ulorl::policy_loss_config plain_config(double valid) {
  ulorl::policy_loss_config c;
  c.objective = {.eps_low = 0.2, .eps_high = 0.28, .log_ratio_clamp = 20.0};
  c.kl = {.estimator = ulorl::kl_estimator::k3, .input_clamp = 20.0, .output_clamp = 10.0};
  c.kl_coef = 0.04;
  c.normalizer = {ulorl::agg_mode::token_mean, valid, 1.0};
  return c;
}

enum class feature { plain, weights, rc_apply, rc_then_loss, rc_in_loss, rc_rs_in_loss, cispo, sapo, policy_gradient, penalized_pg };
const char* const feature_names[] = {"plain", "weights", "rc_apply",        "rc_then_loss", "rc_in_loss", "rc_rs_in_loss",
                                     "cispo", "sapo",    "policy_gradient", "penalized_pg"};

ulorl::policy_loss_config config_of(feature f, double valid) {
  auto c = plain_config(valid);
  namespace verl = ulorl::presets::verl;
  switch (f) {
    case feature::plain:
    case feature::weights:
    case feature::rc_apply:
    case feature::rc_then_loss:
    case feature::rc_in_loss:
    case feature::rc_rs_in_loss: break;
    case feature::cispo: c.objective = verl::objective({.loss_mode = verl::loss_mode_kind::cispo, .clip_ratio_high = 0.28}); break;
    case feature::sapo: c.objective = verl::objective({.loss_mode = verl::loss_mode_kind::sapo}); break;
    case feature::policy_gradient: c.objective = verl::objective({.loss_mode = verl::loss_mode_kind::gpg}); break;
    case feature::penalized_pg: c.objective = verl::objective({.loss_mode = verl::loss_mode_kind::dro, .dro_beta = 0.1}); break;
  }
  return c;
}

void BM_feature(benchmark::State& st) {
  auto& d = data();
  const auto f = static_cast<feature>(st.range(0));
  const auto cfg = config_of(f, d.valid);
  const auto rc = ulorl::presets::trl::rollout_correction(
      {.vllm_importance_sampling_mode = ulorl::presets::trl::importance_sampling_mode::token_truncate});
  ulorl::policy_loss_inputs<float, std::uint8_t> in{d.view(d.lp), d.view(d.old), d.view(d.adv), d.view(d.mask), d.view(d.ref)};
  if (f == feature::weights) in.weights = d.view(d.weights);
  const ulorl::rollout_correction::inputs<float, std::uint8_t> rin{d.view(d.old), d.view(d.rollout), d.view(d.mask)};
  const ulorl::rollout_correction::outputs<float, std::uint8_t> rout{d.out(d.weights), d.out(d.keep)};
  auto rc_rs = rc;
  rc_rs.rejection.chain.push_back({ulorl::rollout_correction::rs_statistic::token, ulorl::rollout_correction::rs_estimator::k2, 0.0, 0.004});
  rc_rs.rejection.chain.push_back(
      {ulorl::rollout_correction::rs_statistic::sequence_mean, ulorl::rollout_correction::rs_estimator::k3, 0.0, 0.002});
  for (auto _ : st) {
    double v = 0;
    if (f == feature::rc_apply || f == feature::rc_then_loss) v += ulorl::rollout_correction::apply(rin, rout, rc).kl;
    if (f != feature::rc_apply) {
      auto run = in;
      auto c = cfg;
      if (f == feature::rc_then_loss) run.weights = d.view(d.weights), run.mask = d.view(d.keep);
      if (f == feature::rc_in_loss || f == feature::rc_rs_in_loss) {
        run.rollout_log_prob = d.view(d.rollout);
        c.rollout = f == feature::rc_in_loss ? rc : rc_rs;
      }
      if (f == feature::rc_rs_in_loss) {
        const auto s = ulorl::rollout_correction::accumulate(rin, ulorl::rollout_correction::outputs<float, std::uint8_t>{}, rc_rs);
        c.normalizer.denominator = s.tokens - s.rejected_tokens;
      }
      v += ulorl::policy_loss(run, d.out(d.grad), c).loss;
    }
    benchmark::DoNotOptimize(v);
    benchmark::ClobberMemory();
  }
  st.SetLabel(feature_names[st.range(0)]);
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(tokens));
}
BENCHMARK(BM_feature)->DenseRange(0, 9)->Unit(benchmark::kMillisecond);

//! Forwards every run and prints each feature's time as a percentage of the plain pass (best
//! repetitions of this run).
class summary_reporter : public benchmark::BenchmarkReporter {
 public:
  explicit summary_reporter(benchmark::BenchmarkReporter* inner) : inner_(inner) {}
  bool ReportContext(const Context& c) override { return inner_->ReportContext(c); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs)
      if (r.run_type == Run::RT_Iteration && r.iterations > 0) {
        const double t = r.GetAdjustedRealTime();
        auto& best = best_[r.report_label];
        best = best == 0 ? t : std::min(best, t);
      }
    inner_->ReportRuns(runs);
  }
  void Finalize() override {
    inner_->Finalize();
    const double plain = best_["plain"];
    if (plain <= 0) return;
    std::fprintf(stderr, "\nfeature cost (float, %zu tokens; best repetition; %% of the plain fused pass, %.2f ms):\n", tokens,
                 plain);
    for (const char* name : feature_names)
      if (best_[name] > 0)
        std::fprintf(stderr, "  %-16s %8.2f ms  %6.1f %%  (%+.1f %%)\n", name, best_[name], 100.0 * best_[name] / plain,
                     100.0 * (best_[name] / plain - 1.0));
  }

 private:
  benchmark::BenchmarkReporter* inner_;
  std::map<std::string, double> best_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::ConsoleReporter console;
  summary_reporter summary(&console);
  benchmark::RunSpecifiedBenchmarks(&summary);
  benchmark::Shutdown();
  return 0;
}
