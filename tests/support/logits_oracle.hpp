// tests/support/logits_oracle.hpp — independent textbook reference for the logits kernels, in long
// double: z = x / tau, lse = max + log sum exp(z - max), p = exp(z - lse), log_prob = z_y - lse,
// with every z - max formed as (x - max x) / tau (exact differences of the doubles, one rounding
// of the quotient), so a tiny or huge temperature costs no digits (z itself, 1e20 at tau = 1e-20,
// would carry an error of |z| * 5e-20),
// entropy = -sum p log p (the definition, not the kernels' log s - t/s), and the gradient of
// g_lp * log_prob + g_ent * entropy written from the softmax Jacobian:
//   dlog_prob/dz_j = [j == y] - p_j,   dentropy/dz_j = -p_j (log p_j + entropy).
// Never calls the production code. Also: `logits_data::make`, random test batches (normal values
// times a scale plus a shift, a fraction of -inf masked entries, labels never masked).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace oracle {

struct row_stats {
  long double lse, log_prob, entropy;
};

//! x: one row of raw logits (as doubles, exactly the values the kernel reads), -inf allowed.
//! log p_j of one row: (x_j - max x) / tau - log sum_k exp((x_k - max x) / tau).
inline std::vector<long double> log_softmax_row(const std::vector<double>& x, double tau) {
  long double m = -std::numeric_limits<long double>::infinity();
  for (double v : x) m = std::max(m, static_cast<long double>(v));
  const long double t = tau;
  long double s = 0;
  for (double v : x) s += std::exp((static_cast<long double>(v) - m) / t);
  const long double log_s = std::log(s);
  std::vector<long double> lp(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) lp[j] = (static_cast<long double>(x[j]) - m) / t - log_s;
  return lp;
}

inline row_stats logits_row(const std::vector<double>& x, std::size_t label, double tau) {
  long double m = -std::numeric_limits<long double>::infinity();
  for (double v : x) m = std::max(m, static_cast<long double>(v));
  const std::vector<long double> lp = log_softmax_row(x, tau);
  long double h = 0;
  for (long double l : lp) {
    const long double p = std::exp(l);
    if (p > 0) h -= p * l;
  }
  // lse = max z - log p of a maximal entry.
  long double lse = 0;
  for (std::size_t j = 0; j < x.size(); ++j)
    if (static_cast<long double>(x[j]) == m) lse = m / static_cast<long double>(tau) - lp[j];
  return {lse, lp[label], h};
}

//! sum_j p_j^2 of one row, from the probabilities themselves.
inline long double sum_pi_squared(const std::vector<double>& x, double tau) {
  long double q = 0;
  for (long double l : log_softmax_row(x, tau)) {
    const long double p = std::exp(l);
    q += p * p;
  }
  return q;
}

//! d(g_lp log_prob + g_ent entropy) / d x_j for one row.
inline std::vector<long double> logits_row_grad(const std::vector<double>& x, std::size_t label, double tau,
                                                double g_lp, double g_ent) {
  const row_stats st = logits_row(x, label, tau);
  const std::vector<long double> lps = log_softmax_row(x, tau);
  std::vector<long double> g(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) {
    const long double lp = lps[j];
    const long double p = std::exp(lp);
    const long double dlog_prob = (j == label ? 1.0L : 0.0L) - p;
    const long double dentropy = p > 0 ? -p * (lp + st.entropy) : 0.0L;
    g[j] = (g_lp * dlog_prob + g_ent * dentropy) / tau;
  }
  return g;
}

//! The magnitude the gradient's rounding is relative to: sum of |terms| of element j.
inline std::vector<long double> logits_row_grad_scale(const std::vector<double>& x, std::size_t label, double tau,
                                                      double g_lp, double g_ent) {
  const row_stats st = logits_row(x, label, tau);
  const std::vector<long double> lps = log_softmax_row(x, tau);
  std::vector<long double> s(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) {
    const long double lp = lps[j];
    const long double p = std::exp(lp);
    s[j] = (std::fabs(g_lp) * ((j == label ? 1.0L : 0.0L) + p) +
            (p > 0 ? std::fabs(g_ent) * p * (std::fabs(lp) + st.entropy) : 0.0L)) / tau;
  }
  return s;
}

}  // namespace oracle

namespace logits_data {

struct batch {
  std::size_t rows = 0, cols = 0;
  std::vector<float> x;  // row-major [rows, cols]
  std::vector<std::int64_t> labels;
  std::vector<double> g_lp, g_ent;
  std::vector<double> row(std::size_t r) const {
    return std::vector<double>(x.begin() + static_cast<std::ptrdiff_t>(r * cols),
                               x.begin() + static_cast<std::ptrdiff_t>((r + 1) * cols));
  }
  std::vector<std::vector<double>> all_rows() const {
    std::vector<std::vector<double>> out;
    for (std::size_t r = 0; r < rows; ++r) out.push_back(row(r));
    return out;
  }
};

inline batch make(std::mt19937_64& rng, std::size_t rows, std::size_t cols, double scale, double shift,
                  double masked_fraction) {
  batch b;
  b.rows = rows;
  b.cols = cols;
  b.x.resize(rows * cols);
  std::normal_distribution<double> nd;
  std::uniform_real_distribution<double> u;
  for (auto& v : b.x)
    v = u(rng) < masked_fraction ? -std::numeric_limits<float>::infinity() : static_cast<float>(nd(rng) * scale + shift);
  for (std::size_t r = 0; r < rows; ++r) {
    const auto y = static_cast<std::int64_t>(rng() % cols);
    b.labels.push_back(y);
    b.x[r * cols + static_cast<std::size_t>(y)] = static_cast<float>(nd(rng) * scale + shift);
    b.g_lp.push_back(nd(rng));
    b.g_ent.push_back(nd(rng));
  }
  return b;
}

}  // namespace logits_data
