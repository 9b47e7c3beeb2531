// The CUDA kernels of the `ulorl` operators (ulorl/adapters/torch/ops_cuda.hpp) against the CPU kernels
// of the same operators: the policy loss (loss, metrics and gradients for several objectives, KL
// estimators, masks and both layouts), the logits statistics and their backward (float32, float16,
// bfloat16 logits) and the loss from logits; the host path of the operators without a device kernel
// (outputs on the device, the CPU's values, the error with the fallback off); errors naming the
// argument for what the device path refuses or finds (a float64 tensor, a strided one, a NaN token,
// a non-0/1 mask value, a CPU mask, a bad label). Without a GPU it checks that the kernels are set
// and exits 77 (CTest: skipped).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/autograd.h>

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
  return a.sizes() == b.sizes() &&
         at::allclose(a.to(at::kCPU).to(at::kDouble), b.to(at::kCPU).to(at::kDouble), rtol, atol);
}

void expect_error(const std::string& what, const std::string& needle, const std::function<void()>& f) {
  try {
    f();
  } catch (const ulorl::error& e) {
    expect(std::string(e.what()).find(needle) != std::string::npos,
           what + ": message '" + e.what() + "' lacks '" + needle + "'");
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

//! The fused losses' configuration: clip-higher, a k3 KL term, the token-mean of the batch's mask.
ulorl::policy_loss_config fused_config(const batch& x, double entropy_coef) {
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_high = 0.28;
  cfg.kl_coef = 0.05;
  cfg.entropy_coef = entropy_coef;
  cfg.normalizer =
      ulorl::global_normalizer(ulorl::agg_mode::token_mean, ulorl::batch_counts{x.mask.sum().item<double>(), 3, 3});
  return cfg;
}

}  // namespace

int main() {
  namespace d = th::ops::detail;
  th::ops::register_ops();
  expect(d::cuda_policy_loss_forward.kernel.load() == nullptr && d::cuda_logits_loss_forward.kernel.load() == nullptr,
         "no CUDA kernel before register_cuda_ops()");
  if (c10::cuda::device_count() > 0) {
    // Before register_cuda_ops() a CUDA tensor is an error naming it (a program without the device
    // kernels); set_host_fallback(true) runs the call on the host; false is the error again.
    const batch x = make(2, 3, 1);
    ulorl::policy_loss_config cfg;
    cfg.normalizer.denominator = 6;
    const at::Device gpu(at::kCUDA, 0);
    expect(!th::ops::host_fallback(), "the host fallback is off without the device kernels");
    expect_error("a CUDA call without the device kernels", "argument 'log_prob': is a CUDA tensor (cuda:0)",
                 [&] { (void)th::policy_loss(x.lp.to(gpu), x.old.to(gpu), x.adv.to(gpu), at::Tensor(), cfg); });
    expect(!th::ops::set_host_fallback(true), "set_host_fallback returns the previous setting");
    const auto host = th::policy_loss(x.lp.to(gpu), x.old.to(gpu), x.adv.to(gpu), at::Tensor(), cfg);
    const auto cpu = th::policy_loss(x.lp, x.old, x.adv, at::Tensor(), cfg);
    expect(host.loss.device().is_cuda() && close(host.loss, cpu.loss, 0, 0), "the host path when set on");
    expect(th::ops::set_host_fallback(false), "set on, returned");
    expect_error("a CUDA call with the host fallback off", "the host fallback is off",
                 [&] { (void)th::policy_loss(x.lp.to(gpu), x.old.to(gpu), x.adv.to(gpu), at::Tensor(), cfg); });
  }
  // The automatic setting again (a test-only reset), so that register_cuda_ops() turns it on.
  d::host_fallback_setting.store(d::host_fallback_mode::automatic);
  expect(!th::ops::host_fallback(), "automatic: off before register_cuda_ops()");
  th::ops::register_cuda_ops();
  expect(th::ops::host_fallback(), "automatic: on once the device kernels are set");
  expect(d::cuda_policy_loss_forward.kernel.load() == &d::policy_loss_forward_cuda &&
             d::cuda_logits_statistics_forward.kernel.load() == &d::logits_statistics_forward_cuda &&
             d::cuda_logits_statistics_backward.kernel.load() == &d::logits_statistics_backward_cuda &&
             d::cuda_logits_loss_forward.kernel.load() == &d::logits_loss_forward_cuda &&
             d::cuda_head_loss_forward.kernel.load() == &d::head_loss_forward_cuda,
         "register_cuda_ops() sets the CUDA kernels");
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
      {"ppo clip-higher + k3 + entropy, token_mean", ulorl::objective_kind::ppo_clip, ulorl::kl_estimator::k3, 0.05,
       0.01, ulorl::agg_mode::token_mean},
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
        const auto to = [&](const at::Tensor& t) {
          return t.defined() ? th::ops::opt_tensor(t.to(d)) : th::ops::opt_tensor();
        };
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
    // float64 takes the host path (the CPU's values on the device); with the fallback off, the dtype is named.
    {
      const at::Tensor lp64 = x.lp.to(at::kDouble);
      const auto host = th::policy_loss(lp64.to(gpu), x.old.to(at::kDouble).to(gpu), x.adv.to(at::kDouble).to(gpu),
                                        at::Tensor(), cfg);
      const auto cpu = th::policy_loss(lp64, x.old.to(at::kDouble), x.adv.to(at::kDouble), at::Tensor(), cfg);
      expect(host.loss.device().is_cuda() && close(host.loss, cpu.loss, 0, 0), "float64 on CUDA: the host path");
    }
    th::ops::set_host_fallback(false);
    expect_error("float64 on CUDA, fallback off", "argument 'log_prob': has dtype Double",
                 [&] { run(x.lp.to(gpu).to(at::kDouble), at::Tensor()); });
    th::ops::set_host_fallback(true);
    expect_error("a strided log_prob", "argument 'log_prob': has strides", [&] {
      (void)th::policy_loss(x.lp.t().contiguous().t().to(gpu), x.old.to(gpu), x.adv.to(gpu), at::Tensor(), cfg);
    });
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
  // The logits statistics and their gradient, every logits dtype, against the CPU kernel.
  for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    at::manual_seed(7);
    const at::Tensor z = (at::randn({5, 1000}) * 3).to(dtype), y = at::randint(0, 1000, {5}, at::kLong);
    const at::Tensor g_lp = at::randn({5}), g_ent = at::randn({5});
    const auto run = [&](const at::Device& dev) {
      const at::Tensor zz = z.to(dev).requires_grad_(true);
      auto [lp, ent] = th::ops::detail::op<th::ops::detail::logits_statistics_sig>("ulorl::logits_statistics")
                           .call(zz, y.to(dev), 0.7, true, false);
      torch::autograd::backward({lp, ent}, {g_lp.to(dev).to(lp.scalar_type()), g_ent.to(dev).to(ent.scalar_type())});
      return std::make_tuple(lp, ent, zz.grad());
    };
    const auto [lp_c, ent_c, gz_c] = run(at::kCPU);
    const auto [lp_g, ent_g, gz_g] = run(gpu);
    const double tol = dtype == at::kFloat ? 1e-5 : 1e-2;
    const std::string name = std::string("logits_statistics ") + c10::toString(dtype);
    expect(lp_g.device().is_cuda() && lp_g.scalar_type() == dtype && gz_g.scalar_type() == dtype, name + ": outputs");
    expect(close(lp_c, lp_g, tol, 1e-5) && close(ent_c, ent_g, tol, 1e-5), name + ": log_prob and entropy");
    expect(close(gz_c, gz_g, tol, 1e-6), name + ": the gradient of the logits");
  }
  // The loss from logits on the device against the CPU: loss, gradient, statistics, metrics.
  for (const double entropy_coef : {0.0, 0.01}) {
    const batch x = make(3, 11, 9);
    at::manual_seed(9);
    const at::Tensor z = at::randn({33, 257}), y = at::randint(0, 257, {33}, at::kLong);
    const ulorl::policy_loss_config cfg = fused_config(x, entropy_coef);
    const auto opt = [&](const at::Device& dev) {
      th::logits_loss_config o;
      o.extra.ref_log_prob = x.ref.to(dev);
      return o;
    };
    const auto run = [&](const at::Device& dev) {
      const at::Tensor zz = z.to(dev).requires_grad_(true);
      const th::policy_loss_output out =
          th::policy_loss_from_logits(zz, y.to(dev), x.old.to(dev), x.adv.to(dev), x.mask.to(dev), cfg, opt(dev));
      (out.loss * 2).backward();
      return std::make_pair(out, zz.grad());
    };
    const auto [c, gc] = run(at::kCPU);
    const auto [g, gg] = run(gpu);
    const std::string name = std::string("policy_loss_from_logits, entropy_coef ") + std::to_string(entropy_coef);
    expect(g.loss.device().is_cuda() && close(c.loss, g.loss, 1e-5, 1e-7), name + ": loss");
    expect(close(gc, gg, 1e-5, 1e-7), name + ": the gradient of the logits");
    expect(close(c.log_prob, g.log_prob, 1e-5, 1e-6), name + ": log_prob");
    expect(c.result.metrics.tokens == g.result.metrics.tokens, name + ": metrics");
    expect_error(name + ": a label out of range", "labels", [&] {
      (void)th::policy_loss_from_logits(z.to(gpu), at::full({33}, 300, at::kLong).to(gpu), x.old.to(gpu), x.adv.to(gpu),
                                        x.mask.to(gpu), cfg, opt(gpu));
    });
  }
  // The linear head on the device against the CPU: loss, both gradients, statistics; a bias takes the
  // host path (the CPU's bits).
  for (const double entropy_coef : {0.0, 0.01}) {
    const batch x = make(3, 11, 21);
    at::manual_seed(21);
    const at::Tensor hidden = at::randn({33, 24}) * 0.5, weight = at::randn({301, 24}) * 0.3;
    const at::Tensor bias = at::randn({301}) * 0.1, y = at::randint(0, 301, {33}, at::kLong);
    const ulorl::policy_loss_config cfg = fused_config(x, entropy_coef);
    const auto run = [&](const at::Device& dev, const at::Tensor& b) {
      th::linear_head_loss_config o;
      o.extra.ref_log_prob = x.ref.to(dev);
      o.head.chunk_rows = 8;
      const at::Tensor h = hidden.to(dev).requires_grad_(true), w = weight.to(dev).requires_grad_(true);
      const th::policy_loss_output out = th::linear_head_policy_loss(
          h, w, b.defined() ? b.to(dev) : b, y.to(dev), x.old.to(dev), x.adv.to(dev), x.mask.to(dev), cfg, o);
      (out.loss * 2).backward();
      return std::make_tuple(out, h.grad(), w.grad());
    };
    const auto [c, hc, wc] = run(at::kCPU, at::Tensor());
    const auto [g, hg, wg] = run(gpu, at::Tensor());
    const std::string name = std::string("linear_head_policy_loss, entropy_coef ") + std::to_string(entropy_coef);
    expect(g.loss.device().is_cuda() && close(c.loss, g.loss, 1e-5, 1e-6), name + ": loss");
    expect(close(hc, hg, 1e-4, 1e-6) && close(wc, wg, 1e-4, 1e-6), name + ": the gradients of hidden and weight");
    expect(close(c.log_prob, g.log_prob, 1e-5, 1e-5), name + ": log_prob");
    expect(entropy_coef == 0.0 || close(c.entropy, g.entropy, 1e-5, 1e-5), name + ": entropy");
    expect(c.result.metrics.tokens == g.result.metrics.tokens, name + ": metrics");
    const auto [cb, hcb, wcb] = run(at::kCPU, bias);
    const auto [gb, hgb, wgb] = run(gpu, bias);
    expect(close(cb.loss, gb.loss, 0, 0) && close(hcb, hgb, 0, 0) && close(wcb, wgb, 0, 0),
           name + ": with a bias, the host path");
  }
  // An operator without a device kernel: the host path gives the CPU's values on the device.
  {
    const batch x = make(4, 9, 13);
    ulorl::kl_config kc;
    const at::Tensor kl_c = th::kl_penalty(x.lp, x.ref, kc), kl_g = th::kl_penalty(x.lp.to(gpu), x.ref.to(gpu), kc);
    expect(kl_g.device().is_cuda() && close(kl_c, kl_g, 0, 0), "kl_penalty on the host path");
  }
  std::printf("test_torch_ops_cuda: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
