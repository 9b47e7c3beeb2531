// tests/support/logits_temperature.hpp — runs logits_forward + logits_backward on one batch at one
// temperature and measures them against the long-double oracle (logits_oracle.hpp): the worst
// normwise gradient error per row, max_j |g_j - exact_j| / max_j s_j (s_j: the sum of |terms| of
// exact_j, oracle::logits_row_grad_scale), less two of the output type's smallest subnormals (an
// output near the bottom of its range cannot hold more) and less what the stored lse carries: the
// backward places log p from the lse of type S, known to max(|lse| eps(S), the smallest subnormal
// of S) (while |lse| is within lse_anchor_limit<S>; past it the row is read again), which moves
// element j by up to that much times (|exact_j| + |g_ent| p_j / T); and the worst error of the statistics
// (log_prob, entropy, lse relative to 1 + their size). A batch the kernels refuse (ulorl::error)
// reports `refused` and leaves the errors at 0. Shared by the temperature sweep test and the
// temperature fuzz target.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <ulorl/logits/backward.hpp>
#include <ulorl/logits/forward.hpp>

#include "support/logits_oracle.hpp"

namespace temperature_check {

struct result {
  bool refused = false;
  std::string what;     // the refusal's message
  double grad_err = 0;  // worst normwise gradient error over the rows
  double stat_err = 0;  // worst error of log_prob / entropy / lse
  std::size_t worst_row = 0;
};

inline double as_double(float v) { return v; }
inline double as_double(double v) { return v; }
inline double as_double(ulorl::bf16 v) { return v.to_float(); }

//! The value of `v` in storage type L (bf16: round to nearest), as L.
template <class L>
L to_storage(double v) {
  if constexpr (std::is_same_v<L, ulorl::bf16>)
    return ulorl::bf16::from_float(static_cast<float>(v));
  else
    return static_cast<L>(v);
}

//! The smallest positive subnormal of the output type G.
template <class G>
double output_floor() {
  if constexpr (std::is_same_v<G, ulorl::bf16>)
    return std::ldexp(1.0, -133);
  else
    return static_cast<double>(std::numeric_limits<G>::denorm_min());
}

//! Logits L [rows, cols] (given as doubles, rounded to L here; the oracle sees the rounded values),
//! statistics S, gradient G. `fast`: logits_config::fast_backward.
template <class L, class S, class G>
result run(const std::vector<double>& x, std::size_t rows, std::size_t cols, const std::vector<std::int64_t>& labels,
           const std::vector<double>& g_lp, const std::vector<double>& g_ent, double tau, bool fast = false) {
  using namespace ulorl;
  result res;
  std::vector<L> xl(x.size());
  std::vector<double> xr(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    xl[i] = to_storage<L>(x[i]);
    xr[i] = as_double(xl[i]);
  }
  std::vector<S> lp(rows), h(rows), lse(rows), glp(rows), gent(rows);
  for (std::size_t r = 0; r < rows; ++r) glp[r] = static_cast<S>(g_lp[r]), gent[r] = static_cast<S>(g_ent[r]);
  std::vector<G> g(rows * cols);
  const logits_config cfg{.temperature = tau, .fast_backward = fast};
  try {
    logits_forward(matrix_view<const L>(xl.data(), rows, cols), std::span<const std::int64_t>(labels),
                   vector_view<S>(lp.data(), rows), vector_view<S>(h.data(), rows), vector_view<S>(lse.data(), rows),
                   cfg);
    logits_backward(matrix_view<const L>(xl.data(), rows, cols), std::span<const std::int64_t>(labels),
                    vector_view<const S>(lse.data(), rows), vector_view<const S>(h.data(), rows),
                    vector_view<const S>(glp.data(), rows), vector_view<const S>(gent.data(), rows),
                    matrix_view<G>(g.data(), rows, cols), cfg);
  } catch (const ulorl::error& e) {
    res.refused = true;
    res.what = e.what();
    return res;
  }
  const double floor2 = 2 * output_floor<G>();
  for (std::size_t r = 0; r < rows; ++r) {
    const std::vector<double> row(xr.begin() + static_cast<std::ptrdiff_t>(r * cols),
                                  xr.begin() + static_cast<std::ptrdiff_t>((r + 1) * cols));
    const auto y = static_cast<std::size_t>(labels[r]);
    // The oracle's gradient of the loss with the gradients as the kernel saw them (rounded to S).
    const double gl = static_cast<double>(glp[r]), ge = static_cast<double>(gent[r]);
    const auto ex = oracle::logits_row_grad(row, y, tau, gl, ge);
    const auto sc = oracle::logits_row_grad_scale(row, y, tau, gl, ge);
    const oracle::row_stats st = oracle::logits_row(row, y, tau);
    long double gmax = 0;
    for (auto v : sc) gmax = std::max(gmax, v);
    const std::vector<long double> lps = oracle::log_softmax_row(row, tau);
    const long double lse_abs =
        std::min(std::fabs(static_cast<long double>(lse[r])), static_cast<long double>(lse_anchor_limit<S>()));
    const long double lse_digits = 2 * std::max(lse_abs * static_cast<long double>(std::numeric_limits<S>::epsilon()),
                                                static_cast<long double>(std::numeric_limits<S>::denorm_min()));
    double e = 0;
    for (std::size_t j = 0; j < cols; ++j) {
      const long double d = std::fabs(static_cast<long double>(as_double(g[r * cols + j])) - ex[j]);
      const long double carried = lse_digits * (std::fabs(ex[j]) + std::fabs(ge) * std::exp(lps[j]) / tau);
      const long double over = d - floor2 - carried;
      if (over > 0)
        e = std::max(e, gmax > 0 ? static_cast<double>(over / gmax) : std::numeric_limits<double>::infinity());
      if (std::isnan(as_double(g[r * cols + j]))) e = std::numeric_limits<double>::infinity();
    }
    if (!(e <= res.grad_err)) res.grad_err = e, res.worst_row = r;
    const auto rel = [](double got, long double want) {
      return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / (1 + std::fabs(want)));
    };
    const double se = std::max({rel(static_cast<double>(lp[r]), st.log_prob),
                                rel(static_cast<double>(h[r]), st.entropy), rel(static_cast<double>(lse[r]), st.lse)});
    res.stat_err = std::isnan(se) ? std::numeric_limits<double>::infinity() : std::max(res.stat_err, se);
  }
  return res;
}

}  // namespace temperature_check
