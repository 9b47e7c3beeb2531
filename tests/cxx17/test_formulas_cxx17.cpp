// test_formulas_cxx17 — the headers the CUDA kernels include compile as C++17 (nvcc 11.8 has no
// C++20), in two include orders, and the per-token formula they carry gives, in a C++17 build, what
// an independent float64 reference gives: PPO with clip-higher and the k3 KL term, value and
// d / d log_prob, over ratios inside and outside the clip range. Built by the host compiler with
// -std=c++17 wherever the suite builds, with or without nvcc.
#if __cplusplus >= 202002L
#error "test_formulas_cxx17 must be compiled as C++17"
#endif

#include <ulorl/loss/policy_loss_types.hpp>
#include <ulorl/loss/detail/token_loss.hpp>
#include <ulorl/loss/detail/row_sums.hpp>
#include <ulorl/loss/entropy.hpp>
#include <ulorl/loss/aggregation.hpp>
#include <ulorl/loss/metrics.hpp>
#include <ulorl/logits/online_softmax.hpp>
#include <ulorl/core/ragged.hpp>

#include <cmath>
#include <cstdio>

namespace {

//! PPO clip-higher + beta k3, float64, written from the formulas: loss = -min(r A, clip(r) A) +
//! beta (e^(ref - lp) - (ref - lp) - 1).
struct reference {
  double loss, dlogp;
};
reference ppo_k3(double lp, double old, double ref, double adv, double eps_low, double eps_high, double beta) {
  const double r = std::exp(lp - old);
  const double c = std::fmin(std::fmax(r, 1.0 - eps_low), 1.0 + eps_high);
  const bool unclipped = r * adv <= c * adv;  // min(r A, c A) picks r A
  const double pg = -(unclipped ? r * adv : c * adv);
  const double dpg = unclipped ? -adv * r : 0.0;
  const double e = ref - lp;
  return {pg + beta * (std::exp(e) - e - 1.0), dpg + beta * (1.0 - std::exp(e))};
}

}  // namespace

int main() {
  ulorl::policy_loss_config cfg;
  cfg.objective.eps_low = 0.2, cfg.objective.eps_high = 0.28;
  cfg.kl.estimator = ulorl::kl_estimator::k3;
  cfg.kl_coef = 0.05;
  const auto p = ulorl::make_token_loss_params<float>(cfg);
  using L = ulorl::simd::scalar_lanes<float>;
  int failures = 0, n = 0;
  for (double x = -0.9; x <= 0.9; x += 0.05)      // log-ratios across both clip bounds
    for (double adv : {-1.5, -0.25, 0.5, 2.0}) {  // both signs of the advantage
      const float old = -1.25f, lp = static_cast<float>(old + x), ref = static_cast<float>(lp + 0.3 * x - 0.1);
      const auto t = ulorl::detail::token_loss_lanes<ulorl::ppo_clip_objective::plain_form, ulorl::k3_estimator, false, L>(
          lp, old, ref, static_cast<float>(adv), 1.0f, p);
      const float loss = t.pg + p.kl_coef * t.kl;
      const reference r = ppo_k3(lp, old, ref, adv, 0.2, 0.28, 0.05);
      ++n;
      if (std::fabs(loss - r.loss) > 1e-5 * (1 + std::fabs(r.loss)) || std::fabs(t.dlogp - r.dlogp) > 1e-5 * (1 + std::fabs(r.dlogp))) {
        ++failures;
        std::printf("FAIL x %g A %g: loss %.8g (reference %.8g), dlogp %.8g (reference %.8g)\n", x, adv, loss, r.loss, t.dlogp,
                    r.dlogp);
      }
    }
  // The row fold and the normaliser, as the kernels use them: two valid tokens of one row.
  ulorl::detail::row_sums s;
  const auto t = ulorl::detail::token_loss_lanes<ulorl::ppo_clip_objective::plain_form, ulorl::no_kl, false, L>(-1.0f, -1.0f, 0.0f,
                                                                                                                1.0f, 1.0f, p);
  ulorl::detail::fold_token(s, true, t.pg, t.kl, t.ratio, t.flags, -1.0f, -1.0f, 0.0f);
  ulorl::detail::fold_token(s, true, t.pg, t.kl, t.ratio, t.flags, -1.0f, -1.0f, 0.0f);
  ulorl::policy_loss_result res;
  const ulorl::agg_normalizer norm = ulorl::global_normalizer(ulorl::agg_mode::token_mean, {4.0, 2.0, 2.0});
  ulorl::detail::fold_row(res, s, ulorl::row_weight(norm, 2), 0.0, 0.0, 2.0);
  if (res.pg_loss != -0.5 || res.metrics.tokens != 2.0 || res.metrics.ratio_sum != 2.0) {  // 2 x (-1 x 1) / 4
    ++failures;
    std::printf("FAIL fold: pg_loss %g tokens %g ratio_sum %g\n", res.pg_loss, res.metrics.tokens, res.metrics.ratio_sum);
  }
  std::printf("test_formulas_cxx17 (C++ %ld): %d token cases, %s\n", static_cast<long>(__cplusplus), n, failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
