// Test support for the libtorch adapter: plain-torch oracles (the formulas written with torch ops,
// independent of ulorl's code), central finite differences on float64 tensors, a counting CPU
// allocator, and Catch2 helpers for tensors.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/torch_counting_allocator.hpp"

namespace tsupport {

inline void seed(std::uint64_t s) {
  at::manual_seed(s);
  std::printf("torch test seed %llu\n", static_cast<unsigned long long>(s));
}

//! max |a - b| / (atol + rtol |b|) <= 1, elementwise.
inline bool close(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  if (a.sizes() != b.sizes()) {
    std::printf("shape mismatch\n");
    return false;
  }
  const at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  const double worst = ((x - y).abs() / (atol + rtol * y.abs())).max().item<double>();
  if (!(worst <= 1.0)) std::printf("close: worst scaled error %.3g (rtol %.1g, atol %.1g)\n", worst, rtol, atol);
  return worst <= 1.0;
}

// ---- plain-torch oracles ---------------------------------------------------------------------

//! PPO clip-higher + k3 KL + entropy bonus, token-mean over the mask (verl's formulas):
//!   r = exp(lp - old), pg = max(-A r, -A clamp(r, 1 - el, 1 + eh)) * w,
//!   kl = exp(ref - lp) - (ref - lp) - 1, loss = sum m (pg + beta kl - c H) / sum m.
inline at::Tensor oracle_policy_loss(const at::Tensor& lp, const at::Tensor& old, const at::Tensor& adv,
                                     const at::Tensor& mask, double el, double eh, const at::Tensor& ref = {},
                                     double beta = 0, const at::Tensor& ent = {}, double c = 0,
                                     const at::Tensor& w = {}) {
  const at::Tensor r = at::exp(lp - old);
  at::Tensor pg = at::max(-adv * r, -adv * at::clamp(r, 1 - el, 1 + eh));
  if (w.defined()) pg = pg * w;
  at::Tensor tok = pg;
  if (ref.defined() && beta != 0) {
    const at::Tensor d = ref - lp;
    tok = tok + beta * (at::exp(d) - d - 1);
  }
  if (ent.defined() && c != 0) tok = tok - c * ent;
  const at::Tensor m = mask.to(lp.scalar_type());
  return (tok * m).sum() / m.sum();
}

//! Chosen-token log-prob and entropy of logits / tau with torch's log_softmax.
inline std::pair<at::Tensor, at::Tensor> oracle_logits_statistics(const at::Tensor& logits, const at::Tensor& labels,
                                                                  double tau = 1.0) {
  const at::Tensor logp = at::log_softmax(logits / tau, -1);
  const at::Tensor lp = logp.gather(1, labels.to(at::kLong).unsqueeze(1)).squeeze(1);
  const at::Tensor ent = -(at::exp(logp) * logp).sum(-1);
  return {lp, ent};
}

// ---- finite differences ----------------------------------------------------------------------

//! Central differences of the scalar f() with respect to every element of the float64 tensor x
//! (perturbed in place), compared with `analytic`.
inline bool fd_matches(const std::function<double()>& f, at::Tensor x, const at::Tensor& analytic, double h = 1e-6,
                       double rtol = 1e-5, double atol = 1e-7) {
  REQUIRE(x.scalar_type() == at::kDouble);
  c10::NoGradGuard ng;
  at::Tensor flat = x.view({-1});
  at::Tensor num = at::zeros_like(flat);
  for (std::int64_t i = 0; i < flat.numel(); ++i) {
    const double x0 = flat[i].item<double>();
    flat[i] = x0 + h;
    const double fp = f();
    flat[i] = x0 - h;
    const double fm = f();
    flat[i] = x0;
    num[i] = (fp - fm) / (2 * h);
  }
  return close(analytic.reshape({-1}), num, rtol, atol);
}

using testing_support::counting_allocator;  // tests/support/torch_counting_allocator.hpp

}  // namespace tsupport
