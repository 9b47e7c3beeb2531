// test_loss_token_cuda — the per-token loss formulas of ulorl/loss/ (objectives.hpp, kl.hpp, through
// detail/token_loss.hpp) evaluated on the device with the scalar lane type, against the same
// function evaluated on the host by the host compiler: every built-in token-level objective (plain
// ppo_clip included) x every built-in KL estimator and no KL, with rollout weights and importance
// weighting, on float inputs that put ratios inside and outside the clip range and KL arguments
// inside and outside the clamps. The device and the host may differ by FMA contraction only. C++17
// (nvcc 11.8 and newer); without a GPU it exits 77 (CTest: skipped).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include <ulorl/loss/detail/token_loss.hpp>
#include <ulorl/loss/policy_loss_types.hpp>

#include "cuda_check.hpp"
#include "test_rng.hpp"

namespace {

int failures = 0;

struct token_in {
  float lp, old, ref, adv, w;
};
struct token_out {
  float pg, kl, dlogp;
  unsigned flags;
};

template <class Obj, class Est>
__global__ void token_kernel(const token_in* in, token_out* out, ulorl::token_loss_params<float> p, int n) {
  using L = ulorl::simd::scalar_lanes<float>;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const token_in t = in[i];
  const auto r = ulorl::detail::token_loss_lanes<Obj, Est, true, L>(t.lp, t.old, t.ref, t.adv, t.w, p);
  out[i] = {r.pg, r.kl, r.dlogp, ulorl::flag_bits(r.flags)};
}

//! The descriptor has a run-time configuration (`config`).
template <class D, class = void>
inline constexpr bool has_config = false;
template <class D>
inline constexpr bool has_config<D, std::void_t<decltype(std::declval<D&>().config)>> = true;

bool close(float a, float b) { return std::fabs(a - b) <= 2e-6f * (1.0f + std::fabs(b)); }

template <class Obj, class Est>
void check(const char* name, const std::vector<token_in>& host, const ulorl::policy_loss_config& cfg) {
  const int n = static_cast<int>(host.size());
  token_in* din = nullptr;
  token_out* dout = nullptr;
  CUDA_OK(cudaMalloc(&din, n * sizeof(token_in)));
  CUDA_OK(cudaMalloc(&dout, n * sizeof(token_out)));
  CUDA_OK(cudaMemcpy(din, host.data(), n * sizeof(token_in), cudaMemcpyHostToDevice));
  Obj obj;
  if constexpr (has_config<Obj>) obj.config = cfg.objective;
  const ulorl::token_loss_params<float> p{obj.template params<float>(), ulorl::make_kl_params<float>(cfg.kl),
                                          static_cast<float>(cfg.kl_coef), 0.0f};
  token_kernel<Obj, Est><<<(n + 127) / 128, 128>>>(din, dout, p, n);
  CUDA_OK(cudaGetLastError());
  std::vector<token_out> dev(n);
  CUDA_OK(cudaMemcpy(dev.data(), dout, n * sizeof(token_out), cudaMemcpyDeviceToHost));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const auto& t = host[i];
    const auto r = ulorl::detail::token_loss_lanes<Obj, Est, true, ulorl::simd::scalar_lanes<float>>(t.lp, t.old, t.ref, t.adv, t.w, p);
    const token_out h{r.pg, r.kl, r.dlogp, ulorl::flag_bits(r.flags)};
    if (!close(dev[i].pg, h.pg) || !close(dev[i].kl, h.kl) || !close(dev[i].dlogp, h.dlogp) || dev[i].flags != h.flags) {
      if (bad++ < 3)
        std::printf("FAIL %s token %d: device (%g, %g, %g, %u) host (%g, %g, %g, %u)\n", name, i, dev[i].pg, dev[i].kl,
                    dev[i].dlogp, dev[i].flags, h.pg, h.kl, h.dlogp, h.flags);
    }
  }
  failures += bad;
  std::printf("%-40s %d tokens, %d mismatches\n", name, n, bad);
  cudaFree(din);
  cudaFree(dout);
}

template <class Obj>
void check_estimators(const char* name, const std::vector<token_in>& host, ulorl::policy_loss_config cfg) {
  std::string base(name);
  cfg.kl_coef = 0.04;
  cfg.kl.input_clamp = 20.0, cfg.kl.output_clamp = 10.0;
  check<Obj, ulorl::no_kl>((base + " / no KL").c_str(), host, cfg);
  check<Obj, ulorl::k1_estimator>((base + " / k1").c_str(), host, cfg);
  check<Obj, ulorl::abs_estimator>((base + " / abs").c_str(), host, cfg);
  check<Obj, ulorl::k2_estimator>((base + " / k2").c_str(), host, cfg);
  check<Obj, ulorl::k3_estimator>((base + " / k3").c_str(), host, cfg);
  cfg.kl.importance_weighted = true;
  check<Obj, ulorl::importance_weighted<ulorl::k3_estimator>>((base + " / k3 importance-weighted").c_str(), host, cfg);
  cfg.kl.importance_weighted = false, cfg.kl.straight_through = true;
  check<Obj, ulorl::k3_estimator>((base + " / k3 straight-through").c_str(), host, cfg);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("test_loss_token_cuda: no CUDA device, skipped\n");
    return 77;
  }
  ulorl_cuda_test::rng rng(11);
  auto u = [&rng](ulorl_cuda_test::rng&) { return static_cast<float>(rng.uniform()); };
  std::vector<token_in> host(4099);
  for (auto& t : host) {
    t.old = -4 * u(rng);
    t.lp = t.old + (u(rng) - 0.5f) * 1.5f;
    t.ref = t.lp + (u(rng) - 0.5f) * (u(rng) < 0.05f ? 60.0f : 1.0f);  // some beyond the input clamp
    t.adv = (u(rng) - 0.5f) * 4;
    t.w = 0.5f + u(rng);
  }
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_low = 0.2, cfg.objective.eps_high = 0.28;
  check_estimators<ulorl::ppo_clip_objective::plain_form>("ppo_clip (plain)", host, cfg);
  cfg.objective.dual_clip = 3.0, cfg.objective.delta = 1.5;
  check_estimators<ulorl::ppo_clip_objective>("ppo_clip (dual clip, delta)", host, cfg);
  check_estimators<ulorl::cispo_objective>("cispo", host, cfg);
  check_estimators<ulorl::sapo_objective>("sapo", host, cfg);
  check_estimators<ulorl::policy_gradient_objective>("policy_gradient", host, cfg);
  std::printf("%s\n", failures == 0 ? "test_loss_token_cuda: PASS" : "test_loss_token_cuda: FAIL");
  return failures == 0 ? 0 : 1;
}
