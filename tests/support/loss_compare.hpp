// tests/support/loss_compare.hpp — two policy_loss results that must agree: the loss parts and the
// metric sums to `tol` (relative, with a margin scaled by the magnitudes involved), every count
// exactly. Used where the same problem runs through two code paths (vectorised vs strided, one
// instruction set vs another).
#pragma once

#include <ulorl/loss/policy_loss.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <random>

#include "catch.hpp"
#include "support/loss_combos.hpp"
#include "support/loss_paths.hpp"

namespace loss_compare {

inline void require_same_result(const ulorl::policy_loss_result& r, const ulorl::policy_loss_result& s, double tol) {
  const auto same = [&](double x, double y, double scale) { REQUIRE(x == Approx(y).epsilon(tol).margin(tol * (1 + scale))); };
  same(r.loss, s.loss, std::fabs(r.pg_loss) + std::fabs(r.kl_loss));
  same(r.pg_loss, s.pg_loss, 0);
  same(r.kl_loss, s.kl_loss, 0);
  same(r.entropy_loss, s.entropy_loss, 0);
  const auto &m = r.metrics, &q = s.metrics;
  REQUIRE(m.tokens == q.tokens);
  REQUIRE(m.sequences == q.sequences);
  REQUIRE(m.rows == q.rows);
  REQUIRE(m.clipped == q.clipped);
  REQUIRE(m.clipped_low == q.clipped_low);
  REQUIRE(m.clipped_high == q.clipped_high);
  REQUIRE(m.dual_clipped == q.dual_clipped);
  REQUIRE(m.seq_clipped_low == q.seq_clipped_low);
  REQUIRE(m.seq_clipped_high == q.seq_clipped_high);
  REQUIRE(m.seq_clipped_region == q.seq_clipped_region);
  same(m.neg_log_ratio, q.neg_log_ratio, m.tokens);
  same(m.neg_log_ratio_clamped, q.neg_log_ratio_clamped, m.tokens);
  same(m.approx_kl_k3, q.approx_kl_k3, m.tokens);
  same(m.ratio_sum, q.ratio_sum, m.tokens);
  if (m.tokens > 0) {
    REQUIRE(m.ratio_min == Approx(q.ratio_min).epsilon(tol));
    REQUIRE(m.ratio_max == Approx(q.ratio_max).epsilon(tol));
  }
  same(m.kl_sum, q.kl_sum, m.tokens);
  same(m.entropy_sum, q.entropy_sum, m.tokens);
}

//! Two runs of the same problem agree: gradients token by token (to tol, with a margin scaled by
//! the largest gradient), masked tokens' gradients 0 in both, entropy gradients exactly, and the
//! rest as require_same_result.
inline void require_same_paths(const loss_paths::run_result& a, const loss_paths::run_result& b, const loss_paths::problem& p,
                               double tol, bool entropy) {
  double gmax = 0;
  for (double g : b.grad) gmax = std::max(gmax, std::fabs(g));
  for (std::size_t i = 0; i < b.grad.size(); ++i) {
    INFO("token " << i);
    REQUIRE(a.grad[i] == Approx(b.grad[i]).epsilon(tol).margin(tol * gmax));
    if (p.mask[i] == 0) REQUIRE((a.grad[i] == 0 && b.grad[i] == 0));
    if (entropy) REQUIRE(a.grad_entropy[i] == b.grad_entropy[i]);
  }
  require_same_result(a.res, b.res, tol);
}

//! Rows at every alignment (the kernel's peel of the tokens before the first vector-aligned logp,
//! in rows of >= 8 vectors): every array, or logp alone, starts 0..15 elements past a 64-byte
//! boundary, so rows of T tokens start at every offset; lengths straddle each width's threshold
//! (8 vectors: 16 / 32 / 64 / 128 tokens). `run(p, cfg, t, full)` runs element-type pair t (0:
//! double/double, 1: double/uint8, 2: float/uint8, 3: float/float) on both paths, `full` with
//! weights and entropy; both must leave everything outside their tokens alone and agree. Returns
//! the number of runs.
template <class Run>
int require_every_alignment(std::mt19937_64& rng, const char* label, Run run) {
  int runs = 0;
  for (std::size_t off = 0; off < 16; ++off)
    for (const bool lp_only : {false, true})
      for (const std::size_t Tn : {15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 300})
        for (const bool full : {false, true}) {
          auto p = loss_paths::random_problem(rng, 3, Tn);
          p.offset = lp_only ? 0 : off, p.lp_offset = off;
          auto cfg = full ? make_combo("ppo_dual", "k3_iw", "seq_mean", 37.0).cfg : make_combo("ppo", "k3", "token", 37.0).cfg;
          if (!full) cfg.entropy_coef = 0;
          for (int t = 0; t < 4; ++t) {
            INFO(label << ": T=" << Tn << " offset " << off << (lp_only ? " (logp only)" : "")
                       << (full ? " ppo_dual k3_iw seq_mean" : " ppo k3 token") << " type pair " << t);
            const loss_paths::paths r = run(p, cfg, t, full);
            REQUIRE(r.fast.gaps_untouched);
            REQUIRE(r.generic.gaps_untouched);
            require_same_paths(r.fast, r.generic, p, t < 2 ? 1e-12 : 2e-5, full);
            ++runs;
          }
        }
  return runs;
}

}  // namespace loss_compare
