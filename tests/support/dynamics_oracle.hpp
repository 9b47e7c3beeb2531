// tests/support/dynamics_oracle.hpp — independent float64 oracles for the training-dynamics pieces
// (masking/, control/). Written from the formulas in docs/dynamics.md, never calling ulorl: plain
// nested vectors, recomputation from the full history instead of incremental state.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace dynamics_oracle {

// ---- MPT masks (UloRL Eq. 9-10) -------------------------------------------------------------------
struct mpt_params {
  int mode = 2;                 // 0 off, 1 static, 2 dynamic
  double tau = 0.99;
  double sigma = 0.2;
  bool positive_by_advantage = false;
  double positive_reward = 1.0;
  bool batch_scope = false;
};
struct mpt_result {
  std::vector<std::vector<double>> keep;
  long tokens = 0, positive = 0, mpt = 0, masked = 0, below = 0;
  bool batch_below = false;
  double mean_entropy = 0.0;
};

//! rows[b][t] of log-probabilities, entropies and validity; one score per row.
inline mpt_result mpt(const std::vector<std::vector<double>>& logp, const std::vector<std::vector<double>>& ent,
                      const std::vector<std::vector<int>>& valid, const std::vector<double>& score,
                      const mpt_params& p) {
  mpt_result r;
  // Collect every valid entropy first, then sum in one go (a different order than a fused loop).
  std::vector<double> all;
  std::vector<double> row_mean(logp.size(), 0.0);
  std::vector<long> row_n(logp.size(), 0);
  for (std::size_t b = 0; b < logp.size(); ++b)
    for (std::size_t t = 0; t < logp[b].size(); ++t)
      if (valid[b][t]) {
        all.push_back(ent[b][t]);
        row_mean[b] += ent[b][t];
        ++row_n[b];
      }
  double s = 0.0;
  for (double x : all) s += x;
  r.tokens = static_cast<long>(all.size());
  r.mean_entropy = all.empty() ? 0.0 : s / static_cast<double>(all.size());
  r.batch_below = !all.empty() && r.mean_entropy < p.sigma;
  for (std::size_t b = 0; b < logp.size(); ++b) {
    if (row_n[b] > 0) row_mean[b] /= static_cast<double>(row_n[b]);
    const bool below = row_n[b] > 0 && row_mean[b] < p.sigma;
    if (below) ++r.below;
    const bool pos = p.positive_by_advantage ? score[b] > 0.0 : score[b] >= p.positive_reward;
    if (pos) ++r.positive;
    bool active = false;
    if (p.mode == 1) active = true;
    if (p.mode == 2) active = p.batch_scope ? r.batch_below : below;
    std::vector<double> k(logp[b].size(), 0.0);
    for (std::size_t t = 0; t < logp[b].size(); ++t) {
      if (!valid[b][t]) continue;
      const double prob = std::exp(logp[b][t]);
      const bool is_mpt = pos && prob >= p.tau;
      if (is_mpt) ++r.mpt;
      if (is_mpt && active) {
        ++r.masked;
      } else {
        k[t] = 1.0;
      }
    }
    r.keep.push_back(k);
  }
  return r;
}

// ---- KL controllers (verl AdaptiveKLController / FixedKLController) -------------------------------
//! beta after each update, from the textbook rule; bounds [lo, hi] clamp after each update.
inline std::vector<double> kl_adaptive(double beta, double target, double horizon, const std::vector<double>& kl,
                                       const std::vector<long>& n, double lo = 0.0, double hi = INFINITY) {
  std::vector<double> out;
  for (std::size_t i = 0; i < kl.size(); ++i) {
    const double e = std::min(0.2, std::max(-0.2, kl[i] / target - 1.0));
    beta = beta * (1.0 + e * static_cast<double>(n[i]) / horizon);
    beta = std::min(hi, std::max(lo, beta));
    out.push_back(beta);
  }
  return out;
}

// ---- entropy-coefficient controller ---------------------------------------------------------------
struct entropy_params {
  bool proportional = false;
  double target = 0.2, c0 = 0.0, up = 0.005, down = 0.005, gain = 0.05, tol = 0.0, lo = 0.0, hi = 0.1;
  bool gate = true;
};
//! For each measured entropy: (coefficient applied to that batch, coefficient after the update).
inline std::vector<std::pair<double, double>> entropy_run(const entropy_params& p, const std::vector<double>& h) {
  std::vector<std::pair<double, double>> out;
  double c = p.c0;
  for (double e : h) {
    const double applied = (p.gate && e > p.target) ? 0.0 : c;
    double next = c;
    if (e < p.target - p.tol) next = p.proportional ? c + p.gain * (p.target - e) : c + p.up;
    if (e > p.target + p.tol) next = p.proportional ? c + p.gain * (p.target - e) : c - p.down;
    c = std::clamp(next, p.lo, p.hi);
    out.emplace_back(applied, c);
  }
  return out;
}

// ---- reference-reset policy (ProRL) -----------------------------------------------------------------
struct reset_params {
  long every = 0;
  bool plateau = true;
  long patience = 5;
  double min_delta = 0.0;
  bool higher = true;
  bool drop = false;
  double max_drop = 0.05;
  bool kl = false;
  double max_share = 0.5;
  long kl_patience = 1;
  long cooldown = 0;
  bool manual_ignores = false;
};
//! One host call: kind 's' (step: a = kl term, b = policy term), 'v' (validation: a = metric), 'm'.
struct call {
  char kind;
  long step;
  double a = 0.0, b = 0.0;
};
//! Outcome code per call: 0 nothing, else 10*trigger + (1 reset | 2 suppressed), trigger numbering
//! 1 periodic, 2 plateau, 3 drop, 4 kl_share, 5 manual.
//! Recomputes each decision from the full history of calls, the outcomes so far, and the definitions.
inline std::vector<int> reset_run(const reset_params& p, const std::vector<call>& calls) {
  std::vector<int> out;
  auto better = [&](double x, double ref) { return p.higher ? x - ref : ref - x; };
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const call& c = calls[i];
    // The most recent reset before call i (index into calls), if any.
    long last_reset = -1;
    for (std::size_t j = 0; j < i; ++j)
      if (out[j] % 10 == 1) last_reset = static_cast<long>(j);
    const long last_reset_step = last_reset >= 0 ? calls[static_cast<std::size_t>(last_reset)].step : 0;
    int trig = 0;
    double unused = 0.0;
    (void)unused;
    if (c.kind == 's') {
      if (p.kl) {
        // Consecutive steps (since the later of the last reset and the last step at or below the
        // threshold) whose share exceeds max_share, this one included.
        long run = 0;
        for (long j = static_cast<long>(i); j > last_reset; --j) {
          const call& d = calls[static_cast<std::size_t>(j)];
          if (d.kind != 's') continue;
          const double k = std::fabs(d.a), q = std::fabs(d.b);
          const double share = (k + q) > 0 ? k / (k + q) : 0.0;
          if (share > p.max_share) ++run; else break;
        }
        if (run >= p.kl_patience) trig = 4;
      }
      if (!trig && p.every > 0 && c.step - last_reset_step >= p.every) trig = 1;
    } else if (c.kind == 'v') {
      // Best: fold of all previous validations (an improvement must beat the best by > min_delta).
      bool have = false;
      double best = 0.0;
      long last_improve = -1;  // index of the last validation that set the best
      for (std::size_t j = 0; j < i; ++j) {
        if (calls[j].kind != 'v') continue;
        if (!have || better(calls[j].a, best) > p.min_delta) {
          have = true;
          best = calls[j].a;
          last_improve = static_cast<long>(j);
        }
      }
      if (have) {
        const bool improves = better(c.a, best) > p.min_delta;
        const bool dropped = p.drop && -better(c.a, best) > p.max_drop;
        long stale = 0;
        if (!improves) {
          const long from = std::max(last_improve, last_reset);
          for (long j = from + 1; j <= static_cast<long>(i); ++j)
            if (calls[static_cast<std::size_t>(j)].kind == 'v') ++stale;
        }
        if (dropped) trig = 3;
        else if (p.plateau && stale >= p.patience) trig = 2;
      }
    } else {
      trig = 5;
    }
    if (!trig) {
      out.push_back(0);
      continue;
    }
    const bool cool = last_reset >= 0 && c.step - last_reset_step < p.cooldown && !(trig == 5 && p.manual_ignores);
    out.push_back(trig * 10 + (cool ? 2 : 1));
  }
  return out;
}

}  // namespace dynamics_oracle
