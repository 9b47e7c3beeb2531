// The CUDA kernel of the `ulorl::_policy_loss_forward` operator (ulorl/adapters/torch/ops_cuda.hpp)
// against the CPU kernel of the same operator: loss, metrics and gradients for several objectives,
// KL estimators, masks and both layouts; errors naming the argument for what the device path
// refuses or finds (a float64 tensor, a strided one, a NaN token, a non-0/1 mask value, a CPU
// mask). Without a GPU it checks that the kernel is set and exits 77 (CTest: skipped).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "ulorl/adapters/torch/ops_cuda.hpp"

namespace {

namespace th = ulorl::th;
int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
    ++failures;
  }
}

bool close(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  return a.sizes() == b.sizes() && at::allclose(a.to(at::kCPU).to(at::kDouble), b.to(at::kCPU).to(at::kDouble), rtol, atol);
}

void expect_error(const std::string& what, const std::string& needle, const std::function<void()>& f) {
  try {
    f();
  } catch (const ulorl::error& e) {
    expect(std::string(e.what()).find(needle) != std::string::npos, what + ": message '" + e.what() + "' lacks '" + needle + "'");
    return;
  }
  expect(false, what + ": no ulorl::error");
}

struct batch {
  at::Tensor lp, old, adv, mask, ref, ent;
};

batch make(std::int64_t b, std::int64_t t, std::uint64_t seed) {
  at::manual_seed(seed);
  batch x;
  x.old = -at::rand({b, t}) * 3;
  x.lp = x.old + (at::rand({b, t}) - 0.5) * 0.6;
  x.adv = at::randn({b, t});
  x.mask = at::rand({b, t}) > 0.2;
  x.ref = x.old + (at::rand({b, t}) - 0.5) * 0.2;
  x.ent = at::rand({b, t}) * 2;
  return x;
}

}  // namespace

int main() {
  th::ops::register_ops();
  expect(th::ops::detail::cuda_policy_loss_forward.load() == nullptr, "no CUDA kernel before register_cuda_ops()");
  if (c10::cuda::device_count() > 0) {
    const at::Tensor x = at::zeros({2, 3}, at::Device(at::kCUDA, 0));
    expect_error("a CUDA call before register_cuda_ops()", "argument 'log_prob': is a CUDA tensor (cuda:0)",
                 [&] { (void)th::policy_loss(x, x, x, at::Tensor(), ulorl::policy_loss_config{}); });
  }
  th::ops::register_cuda_ops();
  expect(th::ops::detail::cuda_policy_loss_forward.load() == &th::ops::detail::policy_loss_forward_cuda,
         "register_cuda_ops() sets the CUDA kernel");
  if (c10::cuda::device_count() == 0) {
    std::printf("test_torch_ops_cuda: no CUDA device; the kernel is set (%s)\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 77;
  }
  const at::Device gpu(at::kCUDA, 0);
  struct variant {
    const char* name;
    ulorl::objective_kind kind;
    ulorl::kl_estimator kl;
    double kl_coef, entropy_coef;
    ulorl::agg_mode mode;
  };
  const std::vector<variant> variants = {
      {"ppo clip-higher + k3 + entropy, token_mean", ulorl::objective_kind::ppo_clip, ulorl::kl_estimator::k3, 0.05, 0.01,
       ulorl::agg_mode::token_mean},
      {"ppo + k2, seq_mean_token_mean", ulorl::objective_kind::ppo_clip, ulorl::kl_estimator::k2, 0.1, 0.0,
       ulorl::agg_mode::seq_mean_token_mean},
      {"gspo", ulorl::objective_kind::gspo, ulorl::kl_estimator::k3, 0.0, 0.0, ulorl::agg_mode::seq_mean_token_mean},
      {"cispo + k1", ulorl::objective_kind::cispo, ulorl::kl_estimator::k1, 0.02, 0.0, ulorl::agg_mode::token_mean},
  };
  for (const auto& v : variants)
    for (const bool packed : {false, true}) {
      const batch x = make(6, 37, 11);
      ulorl::policy_loss_config cfg;
      cfg.objective.kind = v.kind;
      cfg.objective.eps_high = 0.28;
      cfg.kl.estimator = v.kl;
      cfg.kl_coef = v.kl_coef;
      cfg.entropy_coef = v.entropy_coef;
      cfg.normalizer = ulorl::global_normalizer(v.mode, ulorl::batch_counts{x.mask.sum().item<double>(), 6, 6});
      const std::vector<double> enc = ulorl::encode_fields(cfg);
      at::Tensor lp = x.lp, old = x.old, adv = x.adv, mask = x.mask, ref = x.ref, ent = x.ent, off;
      if (packed) {
        lp = lp.reshape({-1}), old = old.reshape({-1}), adv = adv.reshape({-1}), mask = mask.reshape({-1});
        ref = ref.reshape({-1}), ent = ent.reshape({-1});
        off = at::arange(0, 7 * 37, 37, at::kLong);
      }
      const auto call = [&](const at::Device& d) {
        const auto to = [&](const at::Tensor& t) { return t.defined() ? th::ops::opt_tensor(t.to(d)) : th::ops::opt_tensor(); };
        return th::ops::detail::op<th::ops::detail::policy_loss_forward_sig>("ulorl::_policy_loss_forward")
            .call(lp.to(d), old.to(d), adv.to(d), to(mask), to(ref), th::ops::opt_tensor(), to(ent), to(off),
                  th::ops::opt_tensor(), enc);
      };
      const auto [l_cpu, g_cpu, ge_cpu, r_cpu] = call(at::kCPU);
      const auto [l_gpu, g_gpu, ge_gpu, r_gpu] = call(gpu);
      const std::string name = std::string(v.name) + (packed ? ", packed" : ", padded");
      expect(l_gpu.device().is_cuda() && g_gpu.device().is_cuda(), name + ": outputs on the device");
      expect(close(l_cpu, l_gpu, 1e-5, 1e-7), name + ": loss");
      expect(close(g_cpu, g_gpu, 1e-5, 1e-8), name + ": grad_log_prob");
      expect(close(ge_cpu, ge_gpu, 1e-5, 1e-8), name + ": grad_entropy");
      expect(close(r_cpu.slice(0, 0, 22), r_gpu.slice(0, 0, 22), 1e-5, 1e-6), name + ": loss parts and metric sums");
    }
  // Autograd through the public operator on CUDA tensors.
  {
    const batch x = make(4, 16, 3);
    ulorl::policy_loss_config cfg;
    cfg.normalizer.denominator = 40;
    const at::Tensor lp = x.lp.to(gpu).requires_grad_(true), lp_cpu = x.lp.clone().requires_grad_(true);
    auto a = th::policy_loss(lp, x.old.to(gpu), x.adv.to(gpu), x.mask.to(gpu), cfg);
    auto b = th::policy_loss(lp_cpu, x.old, x.adv, x.mask, cfg);
    (a.loss * 3).backward();
    (b.loss * 3).backward();
    expect(close(lp.grad(), lp_cpu.grad(), 1e-5, 1e-8), "autograd on CUDA: the gradient");
    expect(std::fabs(a.result.metrics.tokens - b.result.metrics.tokens) == 0, "autograd on CUDA: the decoded metrics");
  }
  // What the device path refuses or finds, named as on the CPU.
  {
    const batch x = make(3, 8, 5);
    ulorl::policy_loss_config cfg;
    cfg.normalizer.denominator = 10;
    const auto run = [&](const at::Tensor& lp, const at::Tensor& mask) {
      (void)th::policy_loss(lp, x.old.to(lp.device()).to(lp.scalar_type()), x.adv.to(lp.device()).to(lp.scalar_type()),
                            mask, cfg);
    };
    expect_error("float64 on CUDA", "argument 'log_prob': has dtype Double",
                 [&] { run(x.lp.to(gpu).to(at::kDouble), at::Tensor()); });
    expect_error("a strided log_prob", "argument 'log_prob': has strides",
                 [&] { (void)th::policy_loss(x.lp.t().contiguous().t().to(gpu), x.old.to(gpu), x.adv.to(gpu), at::Tensor(), cfg); });
    at::Tensor bad = x.lp.clone();
    bad[1][2] = NAN;
    expect_error("a NaN log-prob", "argument 'log_prob'[10] = nan: must be finite (row 1, token 2)",
                 [&] { run(bad.to(gpu), at::Tensor()); });
    at::Tensor m = x.mask.to(at::kFloat);
    m[2][3] = 0.5;
    expect_error("a mask value 0.5", "argument 'mask'[19] = 0.5", [&] { run(x.lp.to(gpu), m.to(gpu)); });
    expect_error("a CPU mask beside CUDA log-probs", "argument 'mask': is on device cpu but 'log_prob' is on cuda:0",
                 [&] { run(x.lp.to(gpu), m); });
  }
  std::printf("test_torch_ops_cuda: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
