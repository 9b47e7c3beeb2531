// tests/support/linear_head_oracle.hpp — independent textbook reference for the chunked linear head,
// in long double, written from the definitions and never calling the production code:
//   z_ij = (sum_k h_ik w_jk + b_j) / tau,  lse_i = log sum_j e^{z_ij},  p_ij = e^{z_ij - lse_i},
//   log_prob_i = z_{i,y_i} - lse_i,         entropy_i = -sum_j p_ij log p_ij,
// and, for L = sum_i g_lp,i log_prob_i + g_ent,i entropy_i, the chain rule through the softmax Jacobian:
//   dL/dx_ij = (g_lp,i ([j == y_i] - p_ij) - g_ent,i p_ij (log p_ij + entropy_i)) / tau   (x = tau z)
//   dL/dh_ik = sum_j dL/dx_ij w_jk,   dL/dw_jk = sum_i dL/dx_ij h_ik,   dL/db_j = sum_i dL/dx_ij.
// Alongside each gradient, the sum of the magnitudes of its terms (|dL/dx| |w| etc., with |dL/dx|
// itself the sum of its terms' magnitudes): the scale a float computation's rounding is relative to.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace oracle {

struct head_problem {
  std::size_t n = 0, h = 0, v = 0;
  std::vector<double> hidden;  // [n, h] row-major (the exact values the kernel reads)
  std::vector<double> weight;  // [v, h]
  std::vector<double> bias;    // [v] or empty
  std::vector<std::int64_t> labels;
  std::vector<double> g_lp, g_ent;  // [n] loss gradients w.r.t. log_prob, entropy
  double tau = 1.0;
};

struct head_result {
  std::vector<long double> log_prob, entropy, lse;              // [n]
  std::vector<long double> grad_hidden, grad_weight, grad_bias;  // [n, h], [v, h], [v]
  std::vector<long double> scale_hidden, scale_weight, scale_bias;
  long double loss = 0;  // sum_i g_lp,i log_prob_i + g_ent,i entropy_i
};

inline head_result linear_head(const head_problem& q) {
  head_result r;
  r.log_prob.resize(q.n);
  r.entropy.resize(q.n);
  r.lse.resize(q.n);
  std::vector<long double> dx(q.n * q.v), dxabs(q.n * q.v);
  for (std::size_t i = 0; i < q.n; ++i) {
    std::vector<long double> z(q.v);
    for (std::size_t j = 0; j < q.v; ++j) {
      long double s = q.bias.empty() ? 0.0L : static_cast<long double>(q.bias[j]);
      for (std::size_t k = 0; k < q.h; ++k)
        s += static_cast<long double>(q.hidden[i * q.h + k]) * static_cast<long double>(q.weight[j * q.h + k]);
      z[j] = s / q.tau;
    }
    const long double m = *std::max_element(z.begin(), z.end());
    long double se = 0;
    for (long double zj : z) se += std::exp(zj - m);
    const long double lse = m + std::log(se);
    long double ent = 0;
    for (long double zj : z) {
      const long double lp = zj - lse;
      ent -= std::exp(lp) * lp;
    }
    const auto y = static_cast<std::size_t>(q.labels[i]);
    r.lse[i] = lse;
    r.entropy[i] = ent;
    r.log_prob[i] = z[y] - lse;
    r.loss += q.g_lp[i] * r.log_prob[i] + q.g_ent[i] * ent;
    for (std::size_t j = 0; j < q.v; ++j) {
      const long double lp = z[j] - lse, p = std::exp(lp), d = j == y ? 1.0L : 0.0L;
      dx[i * q.v + j] = (q.g_lp[i] * (d - p) - q.g_ent[i] * p * (lp + ent)) / q.tau;
      dxabs[i * q.v + j] = (std::fabs(q.g_lp[i]) * (d + p) + std::fabs(q.g_ent[i]) * p * (std::fabs(lp) + ent)) / q.tau;
    }
  }
  r.grad_hidden.assign(q.n * q.h, 0.0L);
  r.scale_hidden.assign(q.n * q.h, 0.0L);
  r.grad_weight.assign(q.v * q.h, 0.0L);
  r.scale_weight.assign(q.v * q.h, 0.0L);
  r.grad_bias.assign(q.v, 0.0L);
  r.scale_bias.assign(q.v, 0.0L);
  for (std::size_t i = 0; i < q.n; ++i)
    for (std::size_t j = 0; j < q.v; ++j) {
      const long double g = dx[i * q.v + j], ga = dxabs[i * q.v + j];
      r.grad_bias[j] += g;
      r.scale_bias[j] += ga;
      for (std::size_t k = 0; k < q.h; ++k) {
        const long double hk = q.hidden[i * q.h + k], wk = q.weight[j * q.h + k];
        r.grad_hidden[i * q.h + k] += g * wk;
        r.scale_hidden[i * q.h + k] += ga * std::fabs(wk);
        r.grad_weight[j * q.h + k] += g * hk;
        r.scale_weight[j * q.h + k] += ga * std::fabs(hk);
      }
    }
  return r;
}

//! Normwise relative error: max_e |got_e - exact_e| / max_e scale_e (0 when both are empty).
template <class G>
double normwise_error(const std::vector<G>& got, const std::vector<long double>& exact,
                      const std::vector<long double>& scale) {
  long double err = 0, den = 0;
  for (std::size_t e = 0; e < exact.size(); ++e) {
    err = std::max(err, std::fabs(static_cast<long double>(got[e]) - exact[e]));
    den = std::max(den, scale[e]);
  }
  return den > 0 ? static_cast<double>(err / den) : static_cast<double>(err);
}

}  // namespace oracle
