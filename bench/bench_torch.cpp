// bench_torch — the libtorch adapter (ulorl/adapters/torch.hpp) against the same formulas in plain
// torch eager, forward + backward, in one process: each pair is registered twice and run
// alternately (ulorl, torch, ulorl, torch), and the summary takes each variant's faster round.
// Peak memory is measured once per variant with a counting wrapper around torch's CPU allocator:
// bytes of live tensors above those alive before the call, minus the gradients both paths must
// return (logits.grad, weight.grad, hidden.grad); the inputs exist before and are not counted.
//   policy_loss           [B, T] = [256, 4096] float32, clip-higher + k3 KL + entropy, token-mean
//   logits_statistics          [N, V] = [256, 151936] float32 (memory at ULORL_BENCH_TORCH_MEM_N = 1024)
//   policy_loss_from_logits  same logits, in place
//   linear_head           V = 151936, H = 1024, N = 64 (memory at N = ULORL_BENCH_TORCH_MEM_N)
// One intra-op thread (at::set_num_threads(1)); run with OPENBLAS_NUM_THREADS=1 for one BLAS
// thread too (OpenBLAS reads it when it loads). Targets: >= 5x torch for policy_loss and
// logits_statistics, >= 10x less peak memory for logits_statistics and the linear head, linear head >= 1.0x.
#include <benchmark/benchmark.h>

#include <ulorl/adapters/torch.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "bench_common.hpp"
#include "support/torch_counting_allocator.hpp"

namespace th = ulorl::th;

namespace {

// ---- counting allocator (tests/support/torch_counting_allocator.hpp) -----------------------------

using testing_support::counting_allocator;
counting_allocator& allocator() { return counting_allocator::install(); }

//! Extra peak bytes of f() (see the header comment); `keep` bytes are subtracted.
std::int64_t extra_peak(const std::function<std::int64_t()>& f) {
  auto& a = allocator();
  const std::int64_t before = a.current.load();
  a.peak = before;
  const std::int64_t keep = f();
  return a.peak.load() - before - keep;
}

// ---- plain-torch formulas -------------------------------------------------------------------------

at::Tensor ref_loss(const at::Tensor& lp, const at::Tensor& old, const at::Tensor& adv, const at::Tensor& m,
                    const at::Tensor& ref, const at::Tensor& ent) {
  const at::Tensor r = at::exp(lp - old);
  const at::Tensor pg = at::max(-adv * r, -adv * at::clamp(r, 0.8, 1.28));
  const at::Tensor d = ref - lp;
  const at::Tensor tok = pg + 0.05 * (at::exp(d) - d - 1) - 0.01 * ent;
  return (tok * m).sum() / m.sum();
}
std::pair<at::Tensor, at::Tensor> ref_stats(const at::Tensor& z, const at::Tensor& y) {
  const at::Tensor logp = at::log_softmax(z, -1);
  return {logp.gather(1, y.unsqueeze(1)).squeeze(1), -(at::exp(logp) * logp).sum(-1)};
}

ulorl::policy_loss_config loss_config(double tokens) {
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_low = 0.2;
  cfg.objective.eps_high = 0.28;
  cfg.kl_coef = 0.05;
  cfg.entropy_coef = 0.01;
  cfg.normalizer = {ulorl::agg_mode::token_mean, tokens, 1.0};
  return cfg;
}

// ---- data ----------------------------------------------------------------------------------------

constexpr std::int64_t vocab = 151936;

struct tokens_data {
  at::Tensor lp, old, adv, mask, ref, ent;
  double n = 0;
};
tokens_data make_tokens(std::int64_t b, std::int64_t t) {
  tokens_data d;
  d.old = -at::rand({b, t}) * 3;
  d.lp = d.old + (at::rand({b, t}) - 0.5) * 0.6;
  d.ref = d.old + (at::rand({b, t}) - 0.5) * 0.2;
  d.adv = at::randn({b, 1}).expand({b, t}).contiguous();
  d.mask = at::arange(t).unsqueeze(0).lt(at::randint(t / 2, t + 1, {b, 1}));
  d.ent = at::rand({b, t}) * 2;
  d.n = d.mask.sum().item<double>();
  return d;
}

struct head_data {
  at::Tensor hidden, weight, labels;
  tokens_data tok;
};
head_data make_head(std::int64_t n, std::int64_t h) {
  head_data d;
  d.hidden = at::randn({n, h});
  d.weight = at::randn({vocab, h}) / std::sqrt(static_cast<double>(h));
  d.labels = at::randint(0, vocab, {n}, at::TensorOptions().dtype(at::kLong));
  d.tok = make_tokens(1, n);
  return d;
}

// ---- the variants: forward + backward once; return the bytes of the gradients they must return ---

std::int64_t run_loss(bool ours, const tokens_data& d) {
  at::Tensor lp = d.lp.clone().requires_grad_(), ent = d.ent.clone().requires_grad_();
  if (ours)
    th::policy_loss(lp, d.old, d.adv, d.mask, loss_config(d.n), {.ref_log_prob = d.ref, .entropy = ent})
        .loss.backward();
  else
    ref_loss(lp, d.old, d.adv, d.mask, d.ref, ent).backward();
  return lp.grad().nbytes() + ent.grad().nbytes();
}

std::int64_t run_stats(bool ours, const at::Tensor& logits, const at::Tensor& y, const at::Tensor& a,
                       const at::Tensor& c) {
  at::Tensor z = logits.detach().requires_grad_();
  {
    auto [lp, ent] = ours ? th::logits_statistics(z, y) : ref_stats(z, y);
    (lp * a + ent * c).sum().backward();
  }
  const std::int64_t g = z.grad().nbytes();
  z.mutable_grad() = at::Tensor();
  return g;
}

std::int64_t run_from_logits(bool ours, const at::Tensor& logits, const at::Tensor& y, const tokens_data& d) {
  // The logits as a model's output (a non-leaf), which the in-place path may overwrite.
  at::Tensor leaf = logits.detach().requires_grad_();
  {
    at::Tensor z = leaf.view(logits.sizes());
    const std::int64_t b = d.old.size(0), t = d.old.size(1);
    if (ours) {
      th::policy_loss_from_logits(z, y, d.old, d.adv, d.mask, loss_config(d.n),
                                  {.extra = {.ref_log_prob = d.ref}, .in_place = true})
          .loss.backward();
    } else {
      auto [lp, ent] = ref_stats(z, y);
      ref_loss(lp.view({b, t}), d.old, d.adv, d.mask, d.ref, ent.view({b, t})).backward();
    }
  }
  const std::int64_t g = leaf.grad().nbytes();
  leaf.mutable_grad() = at::Tensor();
  return g;
}

std::int64_t run_head(bool ours, const head_data& d) {
  at::Tensor h = d.hidden.detach().requires_grad_(), w = d.weight.detach().requires_grad_();
  const std::int64_t n = d.hidden.size(0);
  if (ours) {
    th::linear_head_policy_loss(h, w, at::Tensor(), d.labels, d.tok.old, d.tok.adv, d.tok.mask, loss_config(d.tok.n),
                                {.extra = {.ref_log_prob = d.tok.ref}})
        .loss.backward();
  } else {
    auto [lp, ent] = ref_stats(at::mm(h, w.t()), d.labels);
    ref_loss(lp.view({1, n}), d.tok.old, d.tok.adv, d.tok.mask, d.tok.ref, ent.view({1, n})).backward();
  }
  return h.grad().nbytes() + w.grad().nbytes();
}

// ---- benchmarks ---------------------------------------------------------------------------------

std::map<std::string, double>& best_seconds() {
  static std::map<std::string, double> m;
  return m;
}

void timed(benchmark::State& state, const std::string& key, std::int64_t items, std::int64_t bytes,
           const std::function<void()>& f) {
  double total = 0;
  for (auto _ : state) {
    bench::stopwatch sw;
    f();
    total += sw.seconds();
  }
  const double per = total / static_cast<double>(state.iterations());
  auto& b = best_seconds()[key];
  if (b == 0 || per < b) b = per;
  state.SetItemsProcessed(state.iterations() * items);
  state.SetBytesProcessed(state.iterations() * bytes);
}

const tokens_data& loss_data() {
  static tokens_data d = make_tokens(256, 4096);
  return d;
}
struct logits_set {
  at::Tensor z, y, a, c;
  tokens_data tok;
};
const logits_set& logits_data() {
  static logits_set s = [] {
    logits_set x;
    const std::int64_t n = bench::env_size("ULORL_BENCH_TORCH_N", 256);
    x.z = at::randn({n, vocab}) * 2;
    x.y = at::randint(0, vocab, {n}, at::TensorOptions().dtype(at::kLong));
    x.a = at::randn({n});
    x.c = at::randn({n});
    x.tok = make_tokens(n / 16, 16);
    return x;
  }();
  return s;
}
const head_data& head() {
  static head_data d =
      make_head(bench::env_size("ULORL_BENCH_TORCH_HEAD_N", 64), bench::env_size("ULORL_BENCH_HEAD_H", 1024));
  return d;
}

void BM_policy_loss(benchmark::State& state, bool ours) {
  const auto& d = loss_data();
  timed(state, std::string("policy_loss/") + (ours ? "ulorl" : "torch"), d.lp.numel(), d.lp.numel() * 4 * 5,
        [&] { run_loss(ours, d); });
}
void BM_logits_statistics(benchmark::State& state, bool ours) {
  const auto& s = logits_data();
  timed(state, std::string("logits_statistics/") + (ours ? "ulorl" : "torch"), s.z.numel(), s.z.numel() * 4 * 2,
        [&] { run_stats(ours, s.z, s.y, s.a, s.c); });
}
void BM_from_logits(benchmark::State& state, bool ours) {
  const auto& s = logits_data();
  // In place overwrites the logits: each iteration starts from a fresh copy (for both variants).
  timed(state, std::string("policy_loss_from_logits/") + (ours ? "ulorl" : "torch"), s.z.numel(), s.z.numel() * 4 * 2,
        [&] { run_from_logits(ours, s.z.clone(), s.y, s.tok); });
}
void BM_linear_head(benchmark::State& state, bool ours) {
  const auto& d = head();
  timed(state, std::string("linear_head/") + (ours ? "ulorl" : "torch"), d.hidden.size(0) * vocab, d.weight.nbytes(),
        [&] { run_head(ours, d); });
}

void register_all() {
  for (int round = 0; round < 2; ++round) {
    const std::string r = "/round:" + std::to_string(round);
    for (bool ours : {true, false}) {
      const std::string who = ours ? "/ulorl" : "/torch";
      benchmark::RegisterBenchmark(("policy_loss" + who + r).c_str(), BM_policy_loss, ours)
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.5);
    }
    for (bool ours : {true, false}) {
      const std::string who = ours ? "/ulorl" : "/torch";
      benchmark::RegisterBenchmark(("logits_statistics" + who + r).c_str(), BM_logits_statistics, ours)
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.5);
    }
    for (bool ours : {true, false}) {
      const std::string who = ours ? "/ulorl" : "/torch";
      benchmark::RegisterBenchmark(("policy_loss_from_logits" + who + r).c_str(), BM_from_logits, ours)
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.5);
    }
    for (bool ours : {true, false}) {
      const std::string who = ours ? "/ulorl" : "/torch";
      benchmark::RegisterBenchmark(("linear_head" + who + r).c_str(), BM_linear_head, ours)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(3);
    }
  }
}

void memory_summary() {
  const std::int64_t n = bench::env_size("ULORL_BENCH_TORCH_MEM_N", 1024);
  const std::int64_t hh = bench::env_size("ULORL_BENCH_TORCH_MEM_H", 256);
  std::printf("\npeak memory beyond inputs and returned gradients (counting CPU allocator):\n");
  {
    const at::Tensor z = at::randn({n, vocab});
    const at::Tensor y = at::randint(0, vocab, {n}, at::TensorOptions().dtype(at::kLong));
    const at::Tensor a = at::randn({n}), c = at::randn({n});
    const std::int64_t ours = extra_peak([&] { return run_stats(true, z, y, a, c); });
    const std::int64_t theirs = extra_peak([&] { return run_stats(false, z, y, a, c); });
    std::printf("  logits_statistics  N=%lld V=%lld: ulorl %.3f MB, torch %.1f MB: %.0fx less ([N,V] = %.1f MB)\n",
                static_cast<long long>(n), static_cast<long long>(vocab), static_cast<double>(ours) / 1e6,
                static_cast<double>(theirs) / 1e6, static_cast<double>(theirs) / static_cast<double>(ours),
                static_cast<double>(z.nbytes()) / 1e6);
  }
  {
    const head_data d = make_head(n, hh);
    const std::int64_t ours = extra_peak([&] { return run_head(true, d); });
    const std::int64_t theirs = extra_peak([&] { return run_head(false, d); });
    std::printf("  linear_head   N=%lld V=%lld H=%lld: ulorl %.1f MB, torch %.1f MB: %.1fx less\n",
                static_cast<long long>(n), static_cast<long long>(vocab), static_cast<long long>(hh),
                static_cast<double>(ours) / 1e6, static_cast<double>(theirs) / 1e6,
                static_cast<double>(theirs) / static_cast<double>(ours));
  }
}

void time_summary() {
  std::printf("\ntime, forward + backward, best round (torch eager / ulorl):\n");
  for (const char* k : {"policy_loss", "logits_statistics", "policy_loss_from_logits", "linear_head"}) {
    const double u = best_seconds()[std::string(k) + "/ulorl"], t = best_seconds()[std::string(k) + "/torch"];
    if (u > 0 && t > 0) std::printf("  %-24s ulorl %9.2f ms  torch %9.2f ms  %.2fx\n", k, u * 1e3, t * 1e3, t / u);
  }
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  (void)allocator();
  at::manual_seed(7);
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  time_summary();
  if (bench::env_size("ULORL_BENCH_TORCH_SKIP_MEMORY", 0) == 0) memory_summary();
  benchmark::Shutdown();
  return 0;
}
