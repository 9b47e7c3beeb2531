// Tests of ulorl/loss/rollout_correction.hpp: weights, keep-mask and every metric against an
// independent float64 oracle written from the formulas (random sizes and configurations, fixed
// printed seeds), padded and packed layouts agree, the two-phase batch normalisation is
// partition-exact, the presets' mappings and parsers, every rejection rule (ulorl::error naming the
// function and argument, outputs untouched) and unknown enum values.
#include <ulorl/loss/rollout_correction.hpp>
#include <ulorl/presets.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "catch.hpp"
#include "support/rejection.hpp"

namespace {
namespace rc = ulorl::rollout_correction;
constexpr double inf = std::numeric_limits<double>::infinity();
constexpr std::uint64_t seed = 4909;

// ---- the oracle ------------------------------------------------------------------------------------

struct oracle_result {
  std::vector<double> weights, keep;
  std::map<std::string, double> m;
};

double clampd(double v, double c) { return v < -c ? -c : (v > c ? c : v); }

//! Textbook float64 rollout correction over a batch laid out by `s` (flat arrays).
oracle_result oracle(const shape& s, const std::vector<double>& o, const std::vector<double>& r, const std::vector<double>& mask,
                     const rc::config& c) {
  const auto& is = c.importance;
  const std::size_t B = s.rows();
  oracle_result out;
  out.weights.assign(s.size(), 0.0);
  out.keep.assign(s.size(), 0.0);
  double N = 0;
  std::vector<double> n(B, 0), S(B, 0), mo(B, 0), mr(B, 0);
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t t = 0; t < s.row_size(b); ++t) {
      const std::size_t i = s.row_begin(b) + t;
      if (mask[i] == 1) n[b] += 1, S[b] += o[i] - r[i], mo[b] += o[i], mr[b] += r[i];
    }
    N += n[b];
    if (n[b] > 0) mo[b] /= n[b], mr[b] /= n[b];
  }
  auto exp_of = [&](double L) {
    double v = std::exp(clampd(L, is.log_ratio_clamp));
    if (is.overflow == rc::ratio_overflow::zero && std::isinf(v)) v = 0;
    return v;
  };
  auto drop = [&](double rho) { return is.overflow == rc::ratio_overflow::nan_when_masked ? rho * 0.0 : 0.0; };
  auto in_bounds = [&](double rho) { return rho >= is.lower && rho <= is.upper; };
  auto weight_of = [&](double rho) {
    switch (is.weighting) {
      case rc::is_weighting::truncate: return rho < is.lower ? is.lower : (rho > is.upper ? is.upper : rho);
      case rc::is_weighting::mask: return in_bounds(rho) ? rho : drop(rho);
      case rc::is_weighting::geometric_gate: return rho;
    }
    return std::nan("");
  };
  // importance weights
  std::vector<double> units;
  double oob_tokens = 0, oob_rows = 0;
  if (is.level != rc::is_level::none) {
    for (std::size_t b = 0; b < B; ++b) {
      const double rho_b = exp_of(S[b]);
      const double w_b = weight_of(rho_b);
      bool gate = true;
      if (is.level == rc::is_level::sequence) {
        units.push_back(w_b);
        if (!in_bounds(rho_b)) oob_rows += 1, oob_tokens += n[b];
      } else if (is.weighting == rc::is_weighting::geometric_gate) {
        const double g = n[b] > 0 ? std::exp(S[b] / n[b]) : 1.0;
        gate = n[b] > 0 ? in_bounds(g) : (is.empty_rows == rc::empty_row_gate::ratio_one && in_bounds(g));
        if (!gate) oob_rows += 1, oob_tokens += n[b];
      }
      for (std::size_t t = 0; t < s.row_size(b); ++t) {
        const std::size_t i = s.row_begin(b) + t;
        const bool v = mask[i] == 1;
        double w;
        if (!v && is.masked == rc::masked_positions::zero) w = 0;
        else if (is.level == rc::is_level::sequence) w = w_b;
        else {
          const double x = (!v && is.masked == rc::masked_positions::neutral) ? 0.0 : o[i] - r[i];
          const double rho = exp_of(x);
          w = is.weighting == rc::is_weighting::geometric_gate ? (gate ? rho : drop(rho)) : weight_of(rho);
          if (v && is.weighting != rc::is_weighting::geometric_gate && !in_bounds(rho)) oob_tokens += 1;
          if (v) units.push_back(w);
        }
        out.weights[i] = w;
      }
    }
  } else {
    std::fill(out.weights.begin(), out.weights.end(), 1.0);
  }
  // rejection sampling
  const double rc_clamp = c.rejection.log_ratio_clamp;
  auto k_of = [&](rc::rs_estimator e, double x) {
    const double xh = clampd(x, rc_clamp);
    return e == rc::rs_estimator::k1 ? -xh : e == rc::rs_estimator::k2 ? xh * xh / 2 : std::exp(xh) - 1 - xh;
  };
  auto kept = [](const rc::rejection_criterion& cr, double stat) {
    if (cr.estimator == rc::rs_estimator::k1) return std::log(cr.lower) <= stat && stat <= std::log(cr.upper);
    return stat <= cr.upper;
  };
  double rejected = 0, rejected_rows = 0;
  for (std::size_t b = 0; b < B; ++b) {
    bool row_rejected = false;
    for (std::size_t t = 0; t < s.row_size(b); ++t) {
      const std::size_t i = s.row_begin(b) + t;
      if (mask[i] != 1) continue;
      bool keep = true;
      for (const auto& cr : c.rejection.chain) {
        double stat = 0;
        if (cr.statistic == rc::rs_statistic::token) {
          stat = k_of(cr.estimator, o[i] - r[i]);
        } else {
          double sum = 0, mx = -inf;
          for (std::size_t u = 0; u < s.row_size(b); ++u) {
            const std::size_t j = s.row_begin(b) + u;
            if (mask[j] != 1) continue;
            sum += k_of(cr.estimator, o[j] - r[j]), mx = std::max(mx, k_of(cr.estimator, o[j] - r[j]));
          }
          stat = cr.statistic == rc::rs_statistic::sequence_sum ? sum : cr.statistic == rc::rs_statistic::sequence_mean ? sum / n[b] : mx;
        }
        keep = keep && kept(cr, stat);
      }
      out.keep[i] = keep ? 1 : 0;
      if (!keep) rejected += 1, row_rejected = true;
    }
    rejected_rows += row_rejected ? 1 : 0;
  }
  // metrics
  auto& m = out.m;
  auto tok_mean = [&](auto f) {
    double a = 0;
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < s.row_size(b); ++t) {
        const std::size_t i = s.row_begin(b) + t;
        if (mask[i] == 1) a += f(i);
      }
    return N > 0 ? a / N : 0.0;
  };
  auto row_mean = [&](auto f) {
    double a = 0;
    for (std::size_t b = 0; b < B; ++b) a += f(b);
    return B > 0 ? a / static_cast<double>(B) : 0.0;
  };
  const double dc = c.diagnostic_log_ratio_clamp;
  m["kl"] = tok_mean([&](std::size_t i) { return r[i] - o[i]; });
  m["k3_kl"] = tok_mean([&](std::size_t i) { return std::exp(o[i] - r[i]) - (o[i] - r[i]) - 1; });
  m["chi2_token"] = N > 0 ? tok_mean([&](std::size_t i) { return std::pow(std::exp(clampd(o[i] - r[i], dc)), 2); }) - 1 : 0.0;
  m["chi2_seq"] = B > 0 ? row_mean([&](std::size_t b) { return std::exp(2 * clampd(S[b], dc)); }) - 1 : 0.0;
  m["training_ppl"] = row_mean([&](std::size_t b) { return std::exp(-mo[b]); });
  m["training_log_ppl"] = row_mean([&](std::size_t b) { return -mo[b]; });
  m["rollout_ppl"] = row_mean([&](std::size_t b) { return std::exp(-mr[b]); });
  m["rollout_log_ppl"] = row_mean([&](std::size_t b) { return -mr[b]; });
  m["log_ppl_diff"] = row_mean([&](std::size_t b) { return mr[b] - mo[b]; });
  m["log_ppl_abs_diff"] = row_mean([&](std::size_t b) { return std::fabs(mr[b] - mo[b]); });
  m["ppl_ratio"] = row_mean([&](std::size_t b) { return std::exp(mr[b] - mo[b]); });
  double dmax = 0, dmin = 0;
  for (std::size_t b = 0; b < B; ++b) {
    const double d = mr[b] - mo[b];
    dmax = b == 0 ? d : std::max(dmax, d), dmin = b == 0 ? d : std::min(dmin, d);
  }
  m["log_ppl_diff_max"] = dmax, m["log_ppl_diff_min"] = dmin;
  m["abs_log_ratio_mean"] = tok_mean([&](std::size_t i) { return std::fabs(o[i] - r[i]); });
  double amax = 0;
  for (std::size_t i = 0; i < s.size(); ++i)
    if (mask[i] == 1) amax = std::max(amax, std::fabs(o[i] - r[i]));
  m["abs_log_ratio_max"] = amax;
  m["rejected_token_fraction"] = N > 0 ? rejected / N : 0.0;
  m["rejected_row_fraction"] = B > 0 ? rejected_rows / static_cast<double>(B) : 0.0;
  m["batch_norm_factor"] = 1;
  if (is.level != rc::is_level::none) {
    const double mean = tok_mean([&](std::size_t i) { return out.weights[i]; });
    m["weight_mean"] = mean;
    const double capped_mean = tok_mean([&](std::size_t i) { return std::min(out.weights[i], is.upper); });
    const double z2 = tok_mean([&](std::size_t i) { return std::pow(std::min(out.weights[i], is.upper) / (capped_mean + 1e-8), 2); });
    m["effective_sample_size"] = N == 0 ? 0.0 : z2 > 0 ? 1 / z2 : inf;
    double us = 0, umin = inf, umax = -inf;
    for (double u : units) us += u, umin = std::min(umin, u), umax = std::max(umax, u);
    m["unit_weight_mean"] = units.empty() ? 0.0 : us / static_cast<double>(units.size());
    m["unit_weight_min"] = units.empty() ? 0.0 : umin;
    m["unit_weight_max"] = units.empty() ? 0.0 : umax;
    m["out_of_bounds_token_fraction"] = N > 0 ? oob_tokens / N : 0.0;
    m["out_of_bounds_row_fraction"] = B > 0 ? oob_rows / static_cast<double>(B) : 0.0;
    if (is.batch_normalize) {
      double mu = mean;
      if (is.level == rc::is_level::sequence) {
        double num = 0, q = 0;
        for (std::size_t b = 0; b < B; ++b) {
          if (n[b] == 0) continue;
          double sw = 0;
          for (std::size_t t = 0; t < s.row_size(b); ++t)
            if (mask[s.row_begin(b) + t] == 1) sw += out.weights[s.row_begin(b) + t];
          num += sw / n[b], q += 1;
        }
        mu = num / std::max(q, 1e-8);
      }
      if (mu > 1e-8) {
        m["batch_norm_factor"] = mu;
        for (auto& w : out.weights) w /= mu;
      }
    }
  }
  return out;
}

std::map<std::string, double> named(const rc::metrics& m) {
  return {{"kl", m.kl},
          {"k3_kl", m.k3_kl},
          {"chi2_token", m.chi2_token},
          {"chi2_seq", m.chi2_seq},
          {"training_ppl", m.training_ppl},
          {"training_log_ppl", m.training_log_ppl},
          {"rollout_ppl", m.rollout_ppl},
          {"rollout_log_ppl", m.rollout_log_ppl},
          {"log_ppl_diff", m.log_ppl_diff},
          {"log_ppl_abs_diff", m.log_ppl_abs_diff},
          {"ppl_ratio", m.ppl_ratio},
          {"log_ppl_diff_max", m.log_ppl_diff_max},
          {"log_ppl_diff_min", m.log_ppl_diff_min},
          {"abs_log_ratio_mean", m.abs_log_ratio_mean},
          {"abs_log_ratio_max", m.abs_log_ratio_max},
          {"rejected_token_fraction", m.rejected_token_fraction},
          {"rejected_row_fraction", m.rejected_row_fraction},
          {"batch_norm_factor", m.batch_norm_factor},
          {"weight_mean", m.weight_mean},
          {"effective_sample_size", m.effective_sample_size},
          {"unit_weight_mean", m.unit_weight_mean},
          {"unit_weight_min", m.unit_weight_min},
          {"unit_weight_max", m.unit_weight_max},
          {"out_of_bounds_token_fraction", m.out_of_bounds_token_fraction},
          {"out_of_bounds_row_fraction", m.out_of_bounds_row_fraction}};
}

void require_close(double a, double e, double rtol, const std::string& what) {
  INFO(what << ": actual " << a << " expected " << e);
  if (std::isinf(e)) {
    // k3_kl: kl.hpp's k3 saturates exp near 8e307 instead of overflowing to +inf.
    REQUIRE((a == e || (what == "k3_kl" && a > 1e307)));
    return;
  }
  REQUIRE(std::fabs(a - e) <= 1e-12 + rtol * std::fabs(e));
}

// ---- random batches and configurations ---------------------------------------------------------------

struct batch {
  shape s;
  std::vector<double> o, r, mask;
};

batch random_batch(std::mt19937_64& rng, bool packed, std::size_t B, std::size_t T, double spread) {
  batch x;
  std::uniform_int_distribution<std::size_t> len(0, T);
  if (packed) {
    x.s.offsets = {0};
    for (std::size_t b = 0; b < B; ++b) x.s.offsets.push_back(x.s.offsets.back() + static_cast<std::int64_t>(len(rng)));
  } else {
    x.s.B = B, x.s.T = T;
  }
  std::normal_distribution<double> lp(-1.5, 1.0), d(0.0, spread);
  std::bernoulli_distribution valid(0.8);
  for (std::size_t i = 0; i < x.s.size(); ++i) {
    const double ol = std::min(lp(rng), -1e-3);
    x.o.push_back(ol), x.r.push_back(ol - d(rng)), x.mask.push_back(valid(rng) ? 1.0 : 0.0);
  }
  return x;
}

rc::config random_config(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> pick(0, 1000);
  rc::config c;
  auto& is = c.importance;
  is.level = static_cast<rc::is_level>(pick(rng) % 3);
  is.weighting = static_cast<rc::is_weighting>(pick(rng) % 3);
  if (is.level == rc::is_level::sequence && is.weighting == rc::is_weighting::geometric_gate) is.weighting = rc::is_weighting::mask;
  const double los[] = {0.0, 0.5, 0.8, 0.97};
  const double his[] = {1.05, 1.5, 2.0, 5.0, inf};
  is.lower = los[pick(rng) % 4], is.upper = his[pick(rng) % 5];
  is.log_ratio_clamp = pick(rng) % 2 ? 20.0 : inf;
  is.overflow = rc::ratio_overflow::zero;  // random log-ratios stay far below the exp range; overflow has its own test
  is.masked = static_cast<rc::masked_positions>(pick(rng) % 3);
  is.empty_rows = static_cast<rc::empty_row_gate>(pick(rng) % 2);
  is.batch_normalize = pick(rng) % 2 == 0;
  const rc::rs_statistic stats[] = {rc::rs_statistic::token, rc::rs_statistic::sequence_sum, rc::rs_statistic::sequence_mean,
                                    rc::rs_statistic::sequence_max};
  const int k = pick(rng) % 4;
  for (int i = 0; i < k; ++i) {
    rc::rejection_criterion cr{.statistic = stats[pick(rng) % 4], .estimator = static_cast<rc::rs_estimator>(pick(rng) % 3)};
    if (cr.statistic == rc::rs_statistic::sequence_max && cr.estimator == rc::rs_estimator::k1) cr.estimator = rc::rs_estimator::k2;
    if (cr.estimator == rc::rs_estimator::k1) cr.lower = 0.3 + 0.6 * (pick(rng) / 1000.0), cr.upper = 1.0 / cr.lower + 0.2;
    else cr.upper = 0.05 + 2.0 * (pick(rng) / 1000.0);
    bool repeat = false;
    for (const auto& e : c.rejection.chain) repeat = repeat || (e.statistic == cr.statistic && e.estimator == cr.estimator);
    if (!repeat) c.rejection.chain.push_back(cr);
  }
  return c;
}

template <class T = double>
struct run_result {
  std::vector<T> w, keep;
  rc::metrics m;
};
template <class T = double>
run_result<T> run_apply(const batch& x, const rc::config& c) {
  run_result<T> out;
  out.w.assign(x.s.size(), T(-7)), out.keep.assign(x.s.size(), T(-7));
  std::vector<T> o(x.o.begin(), x.o.end()), r(x.r.begin(), x.r.end()), mk(x.mask.begin(), x.mask.end());
  const rc::inputs<T, T> in{view_of<const T>(o.data(), x.s), view_of<const T>(r.data(), x.s), view_of<const T>(mk.data(), x.s)};
  out.m = rc::apply(in, rc::outputs<T, T>{view_of<T>(out.w.data(), x.s), view_of<T>(out.keep.data(), x.s)}, c);
  return out;
}

void compare_with_oracle(const batch& x, const rc::config& c, const run_result<double>& got, double rtol) {
  const auto want = oracle(x.s, x.o, x.r, x.mask, c);
  for (std::size_t i = 0; i < x.s.size(); ++i) {
    require_close(got.w[i], want.weights[i], rtol, "weights[" + std::to_string(i) + "]");
    REQUIRE(got.keep[i] == (x.mask[i] == 1 ? want.keep[i] : 0.0));
  }
  const auto have = named(got.m);
  for (const auto& [k, v] : want.m) require_close(have.at(k), v, rtol, k);
}

// ---- the row scan's paths: vectors (the build's ISA) and one lane (the scalar build's code) --------

//! The lane type of the scalar build (ULORL_NO_SIMD): detail::apply_in with it runs the scalar
//! path of this translation unit.
using scalar_path = ulorl::simd::scalar_lanes<double>;

//! How run_apply_as lays the arrays out.
struct layout_options {
  bool strided = false;       //!< every array's elements two apart, NaN (inputs) or -9 (outputs) between them
  bool absent_mask = false;   //!< no mask view (the batch's mask must be all 1)
};

//! apply() with value type T and mask type M, through the public function (L = void) or
//! detail::apply_in<L>. Strided outputs: the elements between must stay -9.
template <class T, class M = T, class L = void>
run_result<T> run_apply_as(const batch& x, const rc::config& c, layout_options opt = {}) {
  const std::size_t n = x.s.size(), step = opt.strided ? 2 : 1;
  std::vector<T> o(n * step, std::numeric_limits<T>::quiet_NaN()), r(n * step, std::numeric_limits<T>::quiet_NaN());
  std::unique_ptr<M[]> mk(new M[n * step + 1]), keep(new M[n * step + 1]);  // M may be bool: no std::vector
  std::fill(mk.get(), mk.get() + n * step, M(1)), std::fill(keep.get(), keep.get() + n * step, M(-9));
  std::vector<T> w(n * step, T(-9));
  for (std::size_t i = 0; i < n; ++i) o[i * step] = T(x.o[i]), r[i * step] = T(x.r[i]), mk[i * step] = M(x.mask[i]), keep[i * step] = M(-7), w[i * step] = T(-7);
  auto view = [&](auto* p) {
    using E = std::remove_pointer_t<decltype(p)>;
    if (!opt.strided) return view_of<E>(p, x.s);
    if (x.s.offsets.empty())
      return ulorl::token_view<E>::padded(ulorl::matrix_view<E>(p, x.s.B, x.s.T, static_cast<std::ptrdiff_t>(2 * x.s.T), 2));
    return ulorl::token_view<E>::packed(ulorl::vector_view<E>(p, n, 2), std::span<const std::int64_t>(x.s.offsets));
  };
  rc::inputs<T, M> in{view(static_cast<const T*>(o.data())), view(static_cast<const T*>(r.data()))};
  if (!opt.absent_mask) in.mask = view(static_cast<const M*>(mk.get()));
  const rc::outputs<T, M> out{view(w.data()), view(keep.get())};
  run_result<T> res;
  if constexpr (std::is_same_v<L, void>) res.m = rc::apply(in, out, c);
  else res.m = rc::detail::apply_in<L>("rollout_correction::apply", in, c, out);
  for (std::size_t i = 0; i < n; ++i) res.w.push_back(w[i * step]), res.keep.push_back(static_cast<T>(keep[i * step]));
  for (std::size_t i = 0; opt.strided && i < n; ++i) {
    REQUIRE(w[2 * i + 1] == T(-9));
    REQUIRE(keep[2 * i + 1] == M(-9));
  }
  return res;
}

//! The same bits (NaN equal to NaN).
template <class T>
bool same_value(T a, T b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

//! Every field of two statistics: the counts and the token-wise extrema exactly; the sums, and what
//! follows from them (row means, sequence-level weights), to `rtol` relative to max(|value|, scale):
//! one path may fold its lanes in another order, and a sum can be much smaller than its terms (a sum
//! of differences of row means, log-ratios of +-800 that cancel); `scale` bounds the terms.
void require_statistics_agree(const rc::statistics& a, const rc::statistics& b, double rtol, bool token_extrema_exact,
                              double scale = 1.0) {
  auto close = [&](double x, double y, const char* what) {
    INFO(what << ": " << x << " vs " << y);
    REQUIRE((same_value(x, y) || std::fabs(x - y) <= rtol * std::max(std::fabs(y), scale)));
  };
  auto exact = [&](double x, double y, const char* what) {
    INFO(what << ": " << x << " vs " << y);
    REQUIRE(same_value(x, y));
  };
  exact(a.rows, b.rows, "rows"), exact(a.tokens, b.tokens, "tokens"), exact(a.nonempty_rows, b.nonempty_rows, "nonempty_rows");
  exact(a.unit_count, b.unit_count, "unit_count");
  exact(a.out_of_bounds_tokens, b.out_of_bounds_tokens, "out_of_bounds_tokens");
  exact(a.out_of_bounds_rows, b.out_of_bounds_rows, "out_of_bounds_rows");
  exact(a.rejected_tokens, b.rejected_tokens, "rejected_tokens"), exact(a.rejected_rows, b.rejected_rows, "rejected_rows");
  exact(a.abs_log_ratio_max, b.abs_log_ratio_max, "abs_log_ratio_max");
  if (token_extrema_exact) exact(a.unit_min, b.unit_min, "unit_min"), exact(a.unit_max, b.unit_max, "unit_max");
  else close(a.unit_min, b.unit_min, "unit_min"), close(a.unit_max, b.unit_max, "unit_max");
  close(a.weight_sum, b.weight_sum, "weight_sum"), close(a.capped_weight_sum, b.capped_weight_sum, "capped_weight_sum");
  close(a.capped_weight_sq_sum, b.capped_weight_sq_sum, "capped_weight_sq_sum");
  close(a.row_mean_weight_sum, b.row_mean_weight_sum, "row_mean_weight_sum"), close(a.unit_sum, b.unit_sum, "unit_sum");
  close(a.log_ratio_sum, b.log_ratio_sum, "log_ratio_sum"), close(a.abs_log_ratio_sum, b.abs_log_ratio_sum, "abs_log_ratio_sum");
  close(a.k3_sum, b.k3_sum, "k3_sum"), close(a.chi2_token_sum, b.chi2_token_sum, "chi2_token_sum");
  close(a.chi2_seq_sum, b.chi2_seq_sum, "chi2_seq_sum");
  close(a.training_ppl_sum, b.training_ppl_sum, "training_ppl_sum"), close(a.training_log_ppl_sum, b.training_log_ppl_sum, "training_log_ppl_sum");
  close(a.rollout_ppl_sum, b.rollout_ppl_sum, "rollout_ppl_sum"), close(a.rollout_log_ppl_sum, b.rollout_log_ppl_sum, "rollout_log_ppl_sum");
  close(a.log_ppl_diff_sum, b.log_ppl_diff_sum, "log_ppl_diff_sum"), close(a.log_ppl_abs_diff_sum, b.log_ppl_abs_diff_sum, "log_ppl_abs_diff_sum");
  close(a.ppl_ratio_sum, b.ppl_ratio_sum, "ppl_ratio_sum");
  close(a.log_ppl_diff_max, b.log_ppl_diff_max, "log_ppl_diff_max"), close(a.log_ppl_diff_min, b.log_ppl_diff_min, "log_ppl_diff_min");
}

//! The vector path against the scalar one: the same keep-mask and, where a weight is a function of
//! its own token only (level none or token, batch normalisation off), the same weight bits; every
//! statistic as require_statistics_agree. A sequence-level weight exp(sum) moves by the sum's
//! rounding: rtol * scale relative.
template <class T>
void require_paths_agree(const run_result<T>& vec, const run_result<T>& one, const rc::config& c, double scale = 1.0) {
  constexpr double rtol = 1e-13;
  const bool token_wise = c.importance.level != rc::is_level::sequence && !c.importance.batch_normalize;
  for (std::size_t i = 0; i < vec.w.size(); ++i) {
    INFO("position " << i << ": " << vec.w[i] << " vs " << one.w[i]);
    REQUIRE(vec.keep[i] == one.keep[i]);
    if (token_wise) REQUIRE(same_value(vec.w[i], one.w[i]));
    else REQUIRE((same_value(vec.w[i], one.w[i]) || std::fabs(vec.w[i] - one.w[i]) <= rtol * scale * std::fabs(one.w[i])));
  }
  require_statistics_agree(vec.m.totals, one.m.totals, rtol, token_wise, scale);
}

//! Rows of `lengths` tokens (packed), log-ratios from `draw(rng)`, masks with holes where the
//! vectors of 2, 4 and 8 lanes begin and end, one valid token or none (row r: pattern r % 7), old
//! log-probs in (-3, -0.01).
template <class Draw>
batch lane_boundary_batch(std::mt19937_64& rng, const std::vector<std::size_t>& lengths, Draw&& draw) {
  batch x;
  x.s.offsets = {0};
  std::uniform_real_distribution<double> lp(-3.0, -0.01);
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    for (std::size_t t = 0; t < lengths[r]; ++t) {
      const std::size_t p = r % 7;
      const bool hole = p == 1   ? t % 2 == 1
                        : p == 2 ? (t % 4 == 0 || t % 4 == 3)
                        : p == 3 ? (t % 8 == 0 || t % 8 == 7)
                        : p == 4 ? (t % 16 == 15 || t % 16 == 8)
                        : p == 5 ? t + 1 != lengths[r]  // one valid token, the row's last
                        : p == 6;                       // none

      const double o = lp(rng);
      x.o.push_back(o), x.r.push_back(o - draw(rng)), x.mask.push_back(hole ? 0.0 : 1.0);
    }
    x.s.offsets.push_back(static_cast<std::int64_t>(x.o.size()));
  }
  return x;
}
}  // namespace

TEST_CASE("rollout_correction::apply: weights, keep-mask and metrics against a float64 oracle, both layouts") {
  std::printf("test_loss_rollout_correction seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const std::size_t sizes[][2] = {{1, 1}, {1, 7}, {3, 5}, {4, 47}, {17, 3}, {9, 64}};
  int checked = 0;
  for (int rep = 0; rep < 60; ++rep)
    for (const auto& sz : sizes)
      for (bool packed : {false, true}) {
        const batch x = random_batch(rng, packed, sz[0], sz[1], rep % 3 == 0 ? 0.05 : 0.6);
        const rc::config c = random_config(rng);
        INFO("rep " << rep << " B " << sz[0] << " T " << sz[1] << " packed " << packed << " level " << int(c.importance.level)
                    << " weighting " << int(c.importance.weighting) << " masked " << int(c.importance.masked) << " criteria "
                    << c.rejection.chain.size);
        double tokens = 0;
        for (double v : x.mask) tokens += v;
        const bool all_zero_weights = [&] {
          if (c.importance.level == rc::is_level::none || tokens == 0) return false;
          const auto o = oracle(x.s, x.o, x.r, x.mask, c);
          for (std::size_t i = 0; i < x.s.size(); ++i)
            if (x.mask[i] == 1 && o.weights[i] != 0) return false;
          return true;
        }();
        const auto got = run_apply(x, c);
        compare_with_oracle(x, c, got, 1e-11);
        if (all_zero_weights) REQUIRE(std::isinf(got.m.effective_sample_size));
        ++checked;
        // float storage: the same to float rounding
        const auto f = run_apply<float>(x, c);
        for (std::size_t i = 0; i < x.s.size(); ++i) REQUIRE(f.keep[i] == static_cast<float>(got.keep[i]));
      }
  REQUIRE(checked == 720);
}

TEST_CASE("rollout_correction: the packed layout gives the padded layout's results on the same rows") {
  std::mt19937_64 rng(seed + 1);
  for (int rep = 0; rep < 100; ++rep) {
    const batch p = random_batch(rng, false, 1 + rep % 6, 1 + rep % 9, 0.5);
    // The same rows packed: every padded row kept whole (masked positions included).
    batch k;
    k.s.offsets = {0};
    for (std::size_t b = 0; b < p.s.B; ++b) k.s.offsets.push_back(k.s.offsets.back() + static_cast<std::int64_t>(p.s.T));
    k.o = p.o, k.r = p.r, k.mask = p.mask;
    const rc::config c = random_config(rng);
    const auto a = run_apply(p, c), b = run_apply(k, c);
    REQUIRE(a.w == b.w);
    REQUIRE(a.keep == b.keep);
    const auto na = named(a.m), nb = named(b.m);
    for (const auto& [key, v] : na) REQUIRE((v == nb.at(key) || (std::isnan(v) && std::isnan(nb.at(key)))));
    // Trimming the masked tail of each row changes no valid position's result.
    batch t;
    t.s.offsets = {0};
    std::vector<std::size_t> src;
    for (std::size_t r = 0; r < p.s.B; ++r) {
      std::size_t last = 0;
      for (std::size_t j = 0; j < p.s.T; ++j)
        if (p.mask[r * p.s.T + j] == 1) last = j + 1;
      for (std::size_t j = 0; j < last; ++j) src.push_back(r * p.s.T + j);
      t.s.offsets.push_back(static_cast<std::int64_t>(src.size()));
    }
    for (auto i : src) t.o.push_back(p.o[i]), t.r.push_back(p.r[i]), t.mask.push_back(p.mask[i]);
    const auto tr = run_apply(t, c);
    for (std::size_t j = 0; j < src.size(); ++j)
      if (t.mask[j] == 1) {
        REQUIRE(tr.w[j] == Approx(a.w[src[j]]).epsilon(1e-14));
        REQUIRE(tr.keep[j] == a.keep[src[j]]);
      }
    REQUIRE(tr.m.weight_mean == Approx(a.m.weight_mean).epsilon(1e-13).margin(1e-300));
    REQUIRE(tr.m.kl == Approx(a.m.kl).epsilon(1e-13).margin(1e-15));
  }
}

TEST_CASE("rollout_correction: accumulate on two parts + finalize + normalize_weights == apply on the whole batch") {
  std::mt19937_64 rng(seed + 2);
  for (int rep = 0; rep < 200; ++rep) {
    const bool packed = rep % 2 == 1;
    batch x = random_batch(rng, packed, 2 + rep % 11, 1 + rep % 13, 0.5);
    rc::config c = random_config(rng);
    c.importance.batch_normalize = true;
    if (c.importance.level == rc::is_level::none) c.importance.level = rc::is_level::token;
    INFO("rep " << rep << " level " << int(c.importance.level));
    const auto whole = run_apply(x, c);
    // Split rows at `cut`: [0, cut) and [cut, B), each its own batch (offsets rebased).
    const std::size_t B = x.s.rows(), cut = 1 + static_cast<std::size_t>(rep) % (B - 1);
    std::vector<double> w(x.s.size(), -7), keep(x.s.size(), -7);
    rc::statistics total;
    std::vector<std::pair<shape, std::size_t>> parts;
    for (auto [lo, hi] : {std::pair<std::size_t, std::size_t>{0, cut}, {cut, B}}) {
      shape s;
      if (packed) {
        s.offsets = {0};
        for (std::size_t b = lo; b < hi; ++b) s.offsets.push_back(s.offsets.back() + static_cast<std::int64_t>(x.s.row_size(b)));
      } else {
        s.B = hi - lo, s.T = x.s.T;
      }
      const std::size_t begin = x.s.row_begin(lo);
      const rc::inputs<double, double> in{view_of<const double>(x.o.data() + begin, s), view_of<const double>(x.r.data() + begin, s),
                                          view_of<const double>(x.mask.data() + begin, s)};
      total += rc::accumulate(in, rc::outputs<double, double>{view_of<double>(w.data() + begin, s), view_of<double>(keep.data() + begin, s)}, c);
      parts.emplace_back(s, begin);
    }
    const rc::metrics m = rc::finalize(total, c);
    for (const auto& [s, begin] : parts) rc::normalize_weights(view_of<double>(w.data() + begin, s), m);
    for (std::size_t i = 0; i < x.s.size(); ++i) {
      REQUIRE(w[i] == Approx(whole.w[i]).epsilon(1e-12).margin(1e-300));
      REQUIRE(keep[i] == whole.keep[i]);
    }
    const auto a = named(m), e = named(whole.m);
    for (const auto& [k, v] : e) require_close(a.at(k), v, 1e-12, k);
  }
}

TEST_CASE("rollout_correction: exp overflow per policy, masked-position values, empty rows of the gate") {
  // Row 0 overflows at a valid token (x = 800); row 1 is ordinary; row 2's first (masked) token has x = 2.
  const shape s{3, 3, {}};
  const std::vector<double> o{-1, -1, -1, -1, -1.25, -1, -1, -1, -1};
  const std::vector<double> r{-801, -1, -1, -1.5, -1, -1, -3, -1, -1};
  const std::vector<double> m{1, 1, 0, 1, 1, 1, 0, 1, 1};
  const batch x{s, o, r, m};
  rc::config c{.importance = {.level = rc::is_level::token, .weighting = rc::is_weighting::truncate, .lower = 0.5, .upper = 3.0,
                              .log_ratio_clamp = inf, .overflow = rc::ratio_overflow::infinity, .masked = rc::masked_positions::neutral}};
  auto got = run_apply(x, c);
  REQUIRE(got.w[0] == 3.0);  // +inf truncated to the bound
  REQUIRE(got.w[6] == 1.0);  // neutral: the weight of log-ratio 0
  compare_with_oracle(x, c, got, 1e-12);
  c.importance.masked = rc::masked_positions::as_valid;
  got = run_apply(x, c);
  REQUIRE(got.w[6] == 3.0);  // its own ratio exp(2), truncated
  compare_with_oracle(x, c, got, 1e-12);
  c.importance.weighting = rc::is_weighting::mask;  // TRL: the overflowing ratio is masked to 0
  got = run_apply(x, c);
  REQUIRE(got.w[0] == 0.0);
  compare_with_oracle(x, c, got, 1e-12);
  c.importance.overflow = rc::ratio_overflow::zero;  // NeMo-RL: 0 before the weighting, then truncation gives the lower bound
  c.importance.weighting = rc::is_weighting::truncate;
  got = run_apply(x, c);
  REQUIRE(got.w[0] == 0.5);
  REQUIRE(got.m.out_of_bounds_token_fraction == Approx(1.0 / 7));
  // OpenRLHF: a masked-out overflow is inf * 0 = NaN and rejected; an unbounded truncation is +inf and rejected.
  c.importance.overflow = rc::ratio_overflow::nan_when_masked;
  c.importance.weighting = rc::is_weighting::mask;
  require_rejected(outcome_of([&] { (void)run_apply(x, c); }), "rollout_correction::apply", "rollout_log_prob", 0);
  c.importance.overflow = rc::ratio_overflow::infinity;
  c.importance.weighting = rc::is_weighting::truncate;
  c.importance.upper = rc::unbounded;
  require_rejected(outcome_of([&] { (void)run_apply(x, c); }), "rollout_correction::apply", "rollout_log_prob", 0);
  // float storage: exp(100) is finite in double, not in float.
  const batch y{{1, 1, {}}, {-1.0}, {-101.0}, {1.0}};
  require_rejected(outcome_of([&] { (void)run_apply<float>(y, c); }), "rollout_correction::apply", "rollout_log_prob", 0);
  // The clamp keeps everything finite (verl).
  c.importance.log_ratio_clamp = 20;
  got = run_apply(x, c);
  REQUIRE(got.w[0] == Approx(std::exp(20.0)).epsilon(1e-15));
  // geometric_gate: empty rows are dropped or use a ratio of 1.
  batch e;
  e.s.offsets = {0, 2, 2, 4};
  e.o = {-1, -1, -1, -1}, e.r = {-1.1, -0.9, -1, -1}, e.mask = {1, 1, 1, 1};
  rc::config g{.importance = {.level = rc::is_level::token, .weighting = rc::is_weighting::geometric_gate, .lower = 0.9, .upper = 1.1,
                              .log_ratio_clamp = inf, .masked = rc::masked_positions::as_valid}};
  auto ge = run_apply(e, g);
  REQUIRE(ge.m.out_of_bounds_row_fraction == Approx(1.0 / 3));
  REQUIRE(ge.w[0] == Approx(std::exp(0.1)).epsilon(1e-14));  // raw token ratio kept, not truncated
  g.importance.empty_rows = rc::empty_row_gate::ratio_one;
  ge = run_apply(e, g);
  REQUIRE(ge.m.out_of_bounds_row_fraction == 0.0);
}

TEST_CASE("rollout_correction: every weight 0 gives an infinite ESS, or an error when required; empty batches") {
  const batch x{{2, 2, {}}, {-1, -1, -1, -1}, {-5, -5, -5, -5}, {1, 1, 0, 1}};
  rc::config c{.importance = {.level = rc::is_level::token, .weighting = rc::is_weighting::mask, .lower = 0.5, .upper = 2.0}};
  REQUIRE(std::isinf(run_apply(x, c).m.effective_sample_size));
  c.require_effective_sample_size = true;
  std::vector<double> w(4, -7), k(4, -7);
  auto call = [&] {
    const rc::inputs<double, double> in{view_of<const double>(x.o.data(), x.s), view_of<const double>(x.r.data(), x.s),
                                        view_of<const double>(x.mask.data(), x.s)};
    (void)rc::apply(in, rc::outputs<double, double>{view_of<double>(w.data(), x.s), view_of<double>(k.data(), x.s)}, c);
  };
  require_rejected(outcome_of(call), "rollout_correction::apply", "weights", -1);
  REQUIRE(w == std::vector<double>(4, -7));
  REQUIRE(k == std::vector<double>(4, -7));
  const batch empty{{2, 2, {}}, {-1, -1, -1, -1}, {-5, -5, -5, -5}, {0, 0, 0, 0}};
  const auto z = run_apply(empty, rc::config{});
  REQUIRE(z.m.kl == 0.0);
  REQUIRE(z.m.weight_mean == 0.0);
  REQUIRE(z.m.effective_sample_size == 0.0);
  REQUIRE(z.w == std::vector<double>(4, 0.0));
  require_rejected(outcome_of([&] { (void)run_apply(empty, rc::config{.reject_empty_batch = true}); }), "rollout_correction::apply",
                   "mask", -1);
  require_rejected(outcome_of([&] { (void)rc::finalize(rc::statistics{}, rc::config{.reject_empty_batch = true}); }),
                   "rollout_correction::finalize", "mask", -1);
  // An empty mask view: every token valid.
  std::vector<double> w2(4), k2(4);
  const rc::inputs<double, double> in{view_of<const double>(x.o.data(), x.s), view_of<const double>(x.r.data(), x.s)};
  const auto m = rc::apply(in, rc::outputs<double, double>{view_of<double>(w2.data(), x.s), view_of<double>(k2.data(), x.s)},
                           rc::config{.importance = {.level = rc::is_level::none}});
  REQUIRE(m.tokens == 4);
  REQUIRE(w2 == std::vector<double>(4, 1.0));
  REQUIRE(k2 == std::vector<double>(4, 1.0));
}

TEST_CASE("rollout_correction: bad input names the function and the argument; outputs untouched") {
  const std::string fn = "rollout_correction::apply";
  for (const shape& s : {padded_shape, packed_shape}) {
    const std::size_t n = s.size();
    std::vector<double> o(n, -1.0), r(n, -1.2), mk(n, 1.0), w(n, -7), k(n, -7);
    auto call = [&](const shape& so, const shape& sr, const shape& sm, const shape& sw, const shape& sk, const rc::config& c) {
      std::vector<double> oo(so.size(), -1.0), rr(sr.size(), -1.2), mm(sm.size(), 1.0);
      std::copy_n(o.begin(), std::min(n, oo.size()), oo.begin());
      std::copy_n(r.begin(), std::min(n, rr.size()), rr.begin());
      std::copy_n(mk.begin(), std::min(n, mm.size()), mm.begin());
      w.assign(sw.size(), -7), k.assign(sk.size(), -7);
      return outcome_of([&] {
        (void)rc::apply(rc::inputs<double, double>{view_of<const double>(oo.data(), so), view_of<const double>(rr.data(), sr),
                                                   view_of<const double>(mm.data(), sm)},
                        rc::outputs<double, double>{view_of<double>(w.data(), sw), view_of<double>(k.data(), sk)}, c);
      });
    };
    auto untouched = [&] {
      for (double v : w) REQUIRE(v == -7);
      for (double v : k) REQUIRE(v == -7);
    };
    const rc::config ok{};
    for (const shape& bad : wrong_shapes(s)) {
      require_rejected(call(s, bad, s, s, s, ok), fn, "rollout_log_prob", -1), untouched();
      require_rejected(call(s, s, bad, s, s, ok), fn, "mask", -1), untouched();
      require_rejected(call(s, s, s, bad, s, ok), fn, "outputs.weights", -1), untouched();
      require_rejected(call(s, s, s, s, bad, ok), fn, "outputs.mask", -1), untouched();
    }
    const std::size_t at = 4;
    for (double bad : {std::nan(""), inf, -inf}) {
      o[at] = bad;
      require_rejected(call(s, s, s, s, s, ok), fn, "old_log_prob", static_cast<std::int64_t>(at)), untouched();
      o[at] = -1.0, r[at] = bad;
      require_rejected(call(s, s, s, s, s, ok), fn, "rollout_log_prob", static_cast<std::int64_t>(at)), untouched();
      r[at] = -1.2;
    }
    o[at] = 1e308, r[at] = -1e308;  // finite inputs whose difference overflows
    require_rejected(call(s, s, s, s, s, ok), fn, "rollout_log_prob", static_cast<std::int64_t>(at)), untouched();
    o[at] = -1.0, r[at] = -1.2;
    mk[at] = 0.5;
    require_rejected(call(s, s, s, s, s, ok), fn, "mask", static_cast<std::int64_t>(at)), untouched();
    mk[at] = 1.0;
    // Configuration rules.
    auto with = [&](auto edit) {
      rc::config c{};
      edit(c);
      return call(s, s, s, s, s, c);
    };
    using C = rc::config;
    require_rejected(with([](C& c) { c.importance.level = static_cast<rc::is_level>(9); }), fn, "importance.level", -1), untouched();
    require_rejected(with([](C& c) { c.importance.weighting = static_cast<rc::is_weighting>(9); }), fn, "importance.weighting", -1), untouched();
    require_rejected(with([](C& c) { c.importance.overflow = static_cast<rc::ratio_overflow>(9); }), fn, "importance.overflow", -1), untouched();
    require_rejected(with([](C& c) { c.importance.masked = static_cast<rc::masked_positions>(9); }), fn, "importance.masked", -1), untouched();
    require_rejected(with([](C& c) { c.importance.empty_rows = static_cast<rc::empty_row_gate>(9); }), fn, "importance.empty_rows", -1), untouched();
    require_rejected(with([](C& c) { c.importance.lower = -0.1; }), fn, "importance.lower", -1), untouched();
    require_rejected(with([](C& c) { c.importance.lower = std::nan(""); }), fn, "importance.lower", -1), untouched();
    require_rejected(with([](C& c) { c.importance.upper = 0; }), fn, "importance.upper", -1), untouched();
    require_rejected(with([](C& c) { c.importance.upper = std::nan(""); }), fn, "importance.upper", -1), untouched();
    require_rejected(with([](C& c) { c.importance.lower = 3, c.importance.upper = 2; }), fn, "importance.lower", -1), untouched();
    require_rejected(with([](C& c) { c.importance.log_ratio_clamp = 0; }), fn, "importance.log_ratio_clamp", -1), untouched();
    require_rejected(with([](C& c) { c.rejection.log_ratio_clamp = -1; }), fn, "rejection.log_ratio_clamp", -1), untouched();
    require_rejected(with([](C& c) { c.diagnostic_log_ratio_clamp = std::nan(""); }), fn, "diagnostic_log_ratio_clamp", -1), untouched();
    require_rejected(with([](C& c) { c.importance.level = rc::is_level::sequence, c.importance.weighting = rc::is_weighting::geometric_gate; }),
                     fn, "importance.weighting", -1), untouched();
    auto crit = [&](rc::rejection_criterion cr, const char* arg, std::int64_t idx) {
      require_rejected(with([&](C& c) {
                         c.rejection.chain.push_back({.statistic = rc::rs_statistic::token, .estimator = rc::rs_estimator::k3, .upper = 1});
                         c.rejection.chain.push_back(cr);
                       }),
                       fn, arg, idx);
      untouched();
    };
    crit({.statistic = static_cast<rc::rs_statistic>(9)}, "rejection.chain.statistic", 1);
    crit({.estimator = static_cast<rc::rs_estimator>(9)}, "rejection.chain.estimator", 1);
    crit({.statistic = rc::rs_statistic::sequence_max, .estimator = rc::rs_estimator::k1, .lower = 0.5, .upper = 2}, "rejection.chain.estimator", 1);
    crit({.estimator = rc::rs_estimator::k1, .lower = 0, .upper = 2}, "rejection.chain.lower", 1);
    crit({.estimator = rc::rs_estimator::k1, .lower = 3, .upper = 2}, "rejection.chain.lower", 1);
    crit({.estimator = rc::rs_estimator::k1, .lower = 0.5, .upper = inf}, "rejection.chain.upper", 1);
    crit({.estimator = rc::rs_estimator::k2, .upper = 0}, "rejection.chain.upper", 1);
    crit({.estimator = rc::rs_estimator::k2, .upper = inf}, "rejection.chain.upper", 1);
    crit({.estimator = rc::rs_estimator::k2, .lower = 0.1, .upper = 1}, "rejection.chain.lower", 1);
    crit({.statistic = rc::rs_statistic::token, .estimator = rc::rs_estimator::k3, .upper = 2}, "rejection.chain", 1);
    require_rejected(with([](C& c) { c.rejection.chain.size = rc::rejection_chain::capacity + 1; }), fn, "rejection.chain.size", -1), untouched();
  }
  // The other entry points.
  rc::rejection_chain full;
  for (std::size_t i = 0; i < rc::rejection_chain::capacity; ++i) full.push_back({});
  REQUIRE(arg_of([&] { full.push_back({}); }) == "size");
  REQUIRE(arg_of([] { (void)rc::finalize({}, rc::config{.importance = {.upper = -1}}); }) == "importance.upper");
  std::vector<double> w{1e308, 1.0};
  const shape s1{1, 2, {}};
  rc::metrics m;
  m.batch_norm_factor = 1e-9;
  require_rejected(outcome_of([&] { rc::normalize_weights(view_of<double>(w.data(), s1), m); }), "rollout_correction::normalize_weights",
                   "weights", 0);
  REQUIRE(w == std::vector<double>{1e308, 1.0});
  m.batch_norm_factor = 0;
  require_rejected(outcome_of([&] { rc::normalize_weights(view_of<double>(w.data(), s1), m); }), "rollout_correction::normalize_weights",
                   "batch_norm_factor", -1);
}

// ---- the vectorised row scan --------------------------------------------------------------------------

TEST_CASE("rollout_correction: vector and scalar row scans match the oracle for every level, weighting, masked rule, overflow rule and criterion; odd rows, holes at lane boundaries") {
  std::mt19937_64 rng(seed + 10);
  const std::vector<std::size_t> lengths = {1, 3, 5, 7, 9, 17, 33, 2, 4, 8, 16, 0, 31, 64, 15};
  // Log-ratios: mostly N(0, 0.3); some on the log-ratio clamp 20, one ulp inside or outside it, or past it.
  std::normal_distribution<double> nd(0.0, 0.3);
  std::uniform_int_distribution<int> pick(0, 19);
  const double edges[] = {20.0, -20.0, std::nextafter(20.0, 0.0), std::nextafter(20.0, 99.0), -std::nextafter(20.0, 99.0), 20.5, -21.0};
  const batch x = lane_boundary_batch(rng, lengths, [&](std::mt19937_64& g) {
    const int k = pick(g);
    return k < 13 ? nd(g) : edges[k - 13];
  });
  using S = rc::rs_statistic;
  using E = rc::rs_estimator;
  const std::vector<std::vector<rc::rejection_criterion>> chains = {
      {},
      {{S::token, E::k1, 0.8, 1.25}},
      {{S::token, E::k2, 0.0, 0.02}},
      {{S::token, E::k3, 0.0, 0.02}},
      {{S::sequence_sum, E::k1, 0.05, 20.0}},
      {{S::sequence_sum, E::k2, 0.0, 0.5}},
      {{S::sequence_sum, E::k3, 0.0, 0.5}},
      {{S::sequence_mean, E::k1, 0.9, 1.1}},
      {{S::sequence_mean, E::k2, 0.0, 0.03}},
      {{S::sequence_mean, E::k3, 0.0, 0.03}},
      {{S::sequence_max, E::k2, 0.0, 0.2}},
      {{S::sequence_max, E::k3, 0.0, 0.2}},
      {{S::token, E::k2, 0.0, 0.1}, {S::sequence_mean, E::k3, 0.0, 0.05}, {S::sequence_max, E::k2, 0.0, 1.0}},
  };
  int checked = 0;
  for (auto level : {rc::is_level::none, rc::is_level::token, rc::is_level::sequence})
    for (auto weighting : {rc::is_weighting::truncate, rc::is_weighting::mask, rc::is_weighting::geometric_gate})
      for (auto masked : {rc::masked_positions::zero, rc::masked_positions::neutral, rc::masked_positions::as_valid})
        for (auto overflow : {rc::ratio_overflow::infinity, rc::ratio_overflow::zero, rc::ratio_overflow::nan_when_masked})
          for (double clamp : {20.0, inf})
            for (const auto& chain : chains) {
              if (level == rc::is_level::sequence && weighting == rc::is_weighting::geometric_gate) continue;
              rc::config c;
              auto& is = c.importance;
              is.level = level, is.weighting = weighting, is.masked = masked, is.overflow = overflow, is.log_ratio_clamp = clamp;
              is.lower = weighting == rc::is_weighting::truncate ? 0.5 : weighting == rc::is_weighting::mask ? 0.8 : 0.9;
              is.upper = weighting == rc::is_weighting::truncate ? 2.0 : weighting == rc::is_weighting::mask ? 1.25 : 1.1;
              is.empty_rows = checked % 2 ? rc::empty_row_gate::drop : rc::empty_row_gate::ratio_one;
              is.batch_normalize = checked % 5 == 0;
              c.diagnostic_log_ratio_clamp = checked % 3 ? 20.0 : inf;
              c.rejection.log_ratio_clamp = checked % 4 ? 20.0 : inf;
              for (const auto& cr : chain) c.rejection.chain.push_back(cr);
              INFO("level " << int(level) << " weighting " << int(weighting) << " masked " << int(masked) << " overflow " << int(overflow)
                            << " clamp " << clamp << " chain " << c.rejection.chain.size << " first "
                            << (chain.empty() ? -1 : int(chain[0].statistic)) << (chain.empty() ? -1 : int(chain[0].estimator)));
              const auto vec = run_apply_as<double>(x, c);
              compare_with_oracle(x, c, vec, 1e-12);
              require_paths_agree(vec, run_apply_as<double, double, scalar_path>(x, c), c);
              ++checked;
            }
  REQUIRE(checked == 8 * 3 * 3 * 2 * 13);
}

TEST_CASE("rollout_correction: strided views, float storage, uint8 / bool masks and an absent mask give the contiguous results") {
  std::mt19937_64 rng(seed + 11);
  for (int rep = 0; rep < 120; ++rep) {
    const bool packed = rep % 2 == 1;
    batch x = random_batch(rng, packed, 1 + rep % 7, 1 + (rep * 7) % 41, rep % 3 == 0 ? 0.05 : 0.6);
    rc::config c = random_config(rng);
    c.importance.overflow = static_cast<rc::ratio_overflow>(rep % 3);
    INFO("rep " << rep << " packed " << packed << " level " << int(c.importance.level) << " weighting " << int(c.importance.weighting));
    const auto a = run_apply_as<double>(x, c);
    const auto same = [&](const auto& b) {
      for (std::size_t i = 0; i < a.w.size(); ++i) {
        REQUIRE(same_value(static_cast<double>(b.w[i]), a.w[i]));
        REQUIRE(static_cast<double>(b.keep[i]) == a.keep[i]);
      }
      const auto na = named(a.m), nb = named(b.m);
      for (const auto& [k, v] : na) {
        INFO(k);
        REQUIRE(same_value(nb.at(k), v));
      }
      require_statistics_agree(b.m.totals, a.m.totals, 0.0, true);
    };
    same(run_apply_as<double>(x, c, {.strided = true}));  // the element-wise loads and stores
    same(run_apply_as<double, std::uint8_t>(x, c));
    same(run_apply_as<double, bool>(x, c));
    same(run_apply_as<double, float>(x, c, {.strided = true}));
    // float storage: the double path on the float-rounded inputs, its weights rounded to float.
    batch xf = x;
    for (auto& v : xf.o) v = static_cast<float>(v);
    for (auto& v : xf.r) v = static_cast<float>(v);
    const auto d = run_apply_as<double>(xf, c);
    for (const auto& f : {run_apply_as<float>(xf, c), run_apply_as<float, std::uint8_t>(xf, c), run_apply_as<float>(xf, c, {.strided = true})}) {
      for (std::size_t i = 0; i < d.w.size(); ++i) {
        REQUIRE(same_value(f.w[i], static_cast<float>(d.w[i])));
        REQUIRE(f.keep[i] == static_cast<float>(d.keep[i]));
      }
      require_statistics_agree(f.m.totals, d.m.totals, 0.0, true);
    }
    // An absent mask: every token valid.
    std::fill(x.mask.begin(), x.mask.end(), 1.0);
    const auto all = run_apply_as<double>(x, c);
    const auto absent = run_apply_as<double, std::uint8_t>(x, c, {.absent_mask = true});
    for (std::size_t i = 0; i < all.w.size(); ++i) REQUIRE((same_value(absent.w[i], all.w[i]) && absent.keep[i] == all.keep[i]));
    require_statistics_agree(absent.m.totals, all.m.totals, 0.0, true);
    require_paths_agree(absent, run_apply_as<double, std::uint8_t, scalar_path>(x, c, {.absent_mask = true}), c);
  }
}

TEST_CASE("rollout_correction: log-ratios at the exponential's edges (+inf, subnormals, 0) on both paths") {
  // Log-ratios around libm's overflow (709.78) and underflow (-745.13) and the ends of the library
  // exponential's range [-708, 709], where it hands over to libm; each row mixes them with ordinary ones.
  const std::vector<double> xs = {-800.0, -745.2, -720.0, -708.5, -707.9, -30.0, -1e-300, 0.0, 0.3, 30.0, 354.5, 355.0,
                                  707.9,  708.5,  709.0,  710.0,  745.0,  800.0, -380.0, -360.0};
  std::mt19937_64 rng(seed + 12);
  std::uniform_real_distribution<double> lp(-3.0, -0.01);
  std::vector<batch> batches;
  for (const std::size_t len : {std::size_t{1}, std::size_t{3}, std::size_t{9}, std::size_t{17}, std::size_t{33}}) {
    batch x;
    x.s.offsets = {0};
    for (std::size_t r = 0; r < xs.size(); ++r) {
      for (std::size_t t = 0; t < len; ++t) {
        const double o = lp(rng);
        // Token t of row r: the edge value xs[(r + t) % n] at every third position, else ordinary.
        const double v = t % 3 == 0 || len == 1 ? xs[(r + t) % xs.size()] : 0.1 * static_cast<double>(t % 5) - 0.2;
        x.o.push_back(o), x.r.push_back(o - v), x.mask.push_back((r + t) % 4 == 3 ? 0.0 : 1.0);
      }
      x.s.offsets.push_back(static_cast<std::int64_t>(x.o.size()));
    }
    batches.push_back(x);
  }
  int compared = 0, rejected = 0;
  for (const auto& x : batches)
    for (auto level : {rc::is_level::token, rc::is_level::sequence})
      for (auto weighting : {rc::is_weighting::truncate, rc::is_weighting::mask, rc::is_weighting::geometric_gate})
        for (auto overflow : {rc::ratio_overflow::infinity, rc::ratio_overflow::zero, rc::ratio_overflow::nan_when_masked})
          for (auto masked : {rc::masked_positions::zero, rc::masked_positions::neutral, rc::masked_positions::as_valid})
            for (double clamp : {inf, 709.5, 20.0})
              for (double dc : {inf, 20.0}) {
                if (level == rc::is_level::sequence && weighting == rc::is_weighting::geometric_gate) continue;
                rc::config c{.importance = {.level = level, .weighting = weighting, .lower = 0.5, .upper = 2.0, .log_ratio_clamp = clamp,
                                            .overflow = overflow, .masked = masked},
                             .diagnostic_log_ratio_clamp = dc};
                c.rejection.chain.push_back({rc::rs_statistic::token, rc::rs_estimator::k3, 0.0, 5.0});
                INFO("tokens " << x.s.size() << " level " << int(level) << " weighting " << int(weighting) << " overflow " << int(overflow)
                               << " masked " << int(masked) << " clamp " << clamp << " dc " << dc);
                const outcome vo = outcome_of([&] { (void)run_apply_as<double>(x, c); });
                const outcome so = outcome_of([&] { (void)run_apply_as<double, double, scalar_path>(x, c); });
                REQUIRE(vo.threw == so.threw);
                const auto want = oracle(x.s, x.o, x.r, x.mask, c);
                bool finite = true;  // every weight the library checks is finite
                for (std::size_t i = 0; i < x.s.size(); ++i)
                  finite = finite && (std::isfinite(want.weights[i]) || (x.mask[i] != 1 && masked == rc::masked_positions::zero));
                if (vo.threw && vo.argument.rfind("metrics.", 0) == 0) {
                  // A metric beyond the double range (e.g. ppl_ratio = mean exp(delta) of log-ratios of 800): the
                  // oracle's value is not finite either, and both paths name it.
                  REQUIRE(!std::isfinite(want.m.at(vo.argument.substr(8))));
                  REQUIRE(vo.argument == so.argument);
                  ++rejected;
                  continue;
                }
                if (vo.threw) {
                  // A NaN (an overflowed ratio dropped by nan_when_masked) or +inf weight: both paths name the same element.
                  REQUIRE(!finite);
                  REQUIRE(vo.argument == "rollout_log_prob");
                  REQUIRE(vo.argument == so.argument);
                  REQUIRE(vo.index == so.index);
                  REQUIRE(vo.what == so.what);
                  ++rejected;
                  continue;
                }
                REQUIRE(finite);
                const auto vec = run_apply_as<double>(x, c);
                for (std::size_t i = 0; i < x.s.size(); ++i) {
                  require_close(vec.w[i], want.weights[i], 1e-12, "weights[" + std::to_string(i) + "]");
                  REQUIRE(vec.keep[i] == (x.mask[i] == 1 ? want.keep[i] : 0.0));
                }
                const auto have = named(vec.m);
                for (const auto& [k, v] : want.m)
                  if (k != "k3_kl") require_close(have.at(k), v, 1e-12, k);
                // k3 takes exp of the log-ratio clamped to [-708, 709] (kl.hpp's k3 estimator saturates).
                double k3 = 0, n = 0;
                for (std::size_t i = 0; i < x.s.size(); ++i)
                  if (x.mask[i] == 1) {
                    const double u = std::min(std::max(x.o[i] - x.r[i], -708.0), 709.0);
                    k3 += std::ldexp(std::expm1(u) - u, -64), n += 1;  // terms near 8e307: a scaled sum
                  }
                require_close(vec.m.k3_kl, std::ldexp(k3 / n, 64), 1e-12, "k3_kl (saturating)");
                require_paths_agree(vec, run_apply_as<double, double, scalar_path>(x, c), c, 1e4);  // sums of +-800
                ++compared;
              }
  // About half of the configurations have a metric beyond the double range (unclamped chi-square
  // of log-ratios of 800, perplexities of a row of one such token): rejected above.
  REQUIRE(compared > 400);
  REQUIRE(rejected > 50);
}

TEST_CASE("rollout_correction: a weight not finite in the element type is named by its flat index at every position, on both paths") {
  for (const bool packed : {false, true})
    for (const std::size_t len : {std::size_t{17}, std::size_t{33}})
      for (std::size_t p = 0; p < len; ++p)
        for (auto masked : {rc::masked_positions::zero, rc::masked_positions::as_valid}) {
          // Row 1 of three; position p is masked when p % 3 == 1. x = 800 overflows double, 100 float.
          batch x;
          if (packed) x.s.offsets = {0, 5, static_cast<std::int64_t>(5 + len), static_cast<std::int64_t>(5 + len + 2)};
          else x.s.B = 3, x.s.T = len;
          const std::size_t begin = x.s.row_begin(1);
          x.o.assign(x.s.size(), -1.0), x.r.assign(x.s.size(), -1.1), x.mask.assign(x.s.size(), 1.0);
          rc::config c{.importance = {.level = rc::is_level::token, .upper = rc::unbounded, .log_ratio_clamp = inf, .masked = masked}};
          const bool masked_p = p % 3 == 1;
          if (masked_p) x.mask[begin + p] = 0;
          if (p + 2 < len) x.r[begin + p + 2] = -801.0;  // a later one (never masked): named only when p is not
          INFO("packed " << packed << " len " << len << " p " << p << " masked " << int(masked));
          const bool named_p = !masked_p || masked == rc::masked_positions::as_valid;
          for (const bool f32 : {false, true}) {
            x.r[begin + p] = f32 ? -101.0 : -801.0;
            const auto expect = [&](const outcome& o) {
              if (named_p) {
                require_rejected(o, "rollout_correction::apply", "rollout_log_prob", static_cast<std::int64_t>(begin + p));
              } else if (p + 2 < len) {
                require_rejected(o, "rollout_correction::apply", "rollout_log_prob", static_cast<std::int64_t>(begin + p + 2));
              } else {
                REQUIRE(!o.threw);
              }
            };
            if (f32) {
              expect(outcome_of([&] { (void)run_apply_as<float, std::uint8_t>(x, c); }));
              expect(outcome_of([&] { (void)run_apply_as<float, float, scalar_path>(x, c, {.strided = true}); }));
            } else {
              expect(outcome_of([&] { (void)run_apply_as<double>(x, c); }));
              expect(outcome_of([&] { (void)run_apply_as<double, double, scalar_path>(x, c); }));
              expect(outcome_of([&] { (void)run_apply_as<double, std::uint8_t>(x, c, {.strided = true}); }));
            }
          }
          // Nothing written: the weights and keep-mask still hold their sentinel.
          x.r[begin + p] = -801.0;
          std::vector<double> w(x.s.size(), -7), k(x.s.size(), -7);
          const rc::inputs<double, double> in{view_of<const double>(x.o.data(), x.s), view_of<const double>(x.r.data(), x.s),
                                              view_of<const double>(x.mask.data(), x.s)};
          if (outcome_of([&] { (void)rc::apply(in, rc::outputs<double, double>{view_of<double>(w.data(), x.s), view_of<double>(k.data(), x.s)}, c); }).threw) {
            REQUIRE(all_equal(w, -7.0));
            REQUIRE(all_equal(k, -7.0));
          }
        }
}

TEST_CASE("rollout_correction: a row whose log-ratios sum past the double range is rejected naming its first element, on both paths") {
  for (const std::size_t len : {std::size_t{2}, std::size_t{9}, std::size_t{17}})
    for (std::size_t p = 0; p + 1 < len; ++p) {
      // Row 1 of two (packed): two valid log-ratios of 1.5e308 at p and the row's last token.
      batch x;
      x.s.offsets = {0, 3, static_cast<std::int64_t>(3 + len)};
      x.o.assign(x.s.size(), -1.0), x.r.assign(x.s.size(), -1.25), x.mask.assign(x.s.size(), 1.0);
      x.r[3 + p] = x.r[3 + len - 1] = -1.5e308;
      INFO("len " << len << " p " << p);
      for (const outcome& o : {outcome_of([&] { (void)run_apply_as<double>(x, rc::config{}); }),
                               outcome_of([&] { (void)run_apply_as<double, double, scalar_path>(x, rc::config{}); }),
                               outcome_of([&] { (void)run_apply_as<double, std::uint8_t>(x, rc::config{}, {.strided = true}); })}) {
        require_rejected(o, "rollout_correction::apply", "rollout_log_prob", 3);
        REQUIRE(o.what.find("row 1") != std::string::npos);
      }
      x.mask[3 + len - 1] = 0;  // one of them masked: the row's sum is finite
      // (Its perplexities exp(1.5e308 / n) are beyond the double range: finalize names that metric.)
      const outcome o = outcome_of([&] { (void)run_apply_as<double>(x, rc::config{.diagnostic_log_ratio_clamp = 20}); });
      REQUIRE((!o.threw || o.argument.rfind("metrics.", 0) == 0));
    }
}

TEST_CASE("rollout_correction: the lane-wise checks of a finite weight in float and double match the scalar ones") {
  using V = rc::detail::scan_lanes;
  const float fmax = std::numeric_limits<float>::max();
  const double mid = 0x1.ffffffp127;  // halfway between FLT_MAX and 2^128
  const std::vector<double> ws = {0.0, 1.0, static_cast<double>(fmax), std::nextafter(mid, 0.0), mid, std::nextafter(mid, inf), 0x1p128,
                                  std::numeric_limits<double>::max(), inf, -static_cast<double>(fmax), -mid, -inf, std::nan("")};
  for (const double w : ws) {
    INFO("w = " << w);
    const bool in_float = rc::detail::lane<V>(rc::detail::representable_lanes<V, float>(V::splat(w)), 0) != 0;
    const bool in_double = rc::detail::lane<V>(rc::detail::representable_lanes<V, double>(V::splat(w)), 0) != 0;
    REQUIRE(in_float == rc::detail::representable<float>(w));
    REQUIRE(in_double == rc::detail::representable<double>(w));
    REQUIRE(rc::detail::representable_lanes<scalar_path, float>(w) == rc::detail::representable<float>(w));
  }
}

TEST_CASE("rollout_correction: *_from_name parsers accept their names and reject unknown ones") {
  REQUIRE(rc::is_level_from_name("sequence") == rc::is_level::sequence);
  REQUIRE(rc::is_weighting_from_name("icepop") == rc::is_weighting::mask);
  REQUIRE(rc::is_weighting_from_name("seq-mask-tis") == rc::is_weighting::geometric_gate);
  REQUIRE(rc::is_weighting_from_name("tis") == rc::is_weighting::truncate);
  REQUIRE(rc::masked_positions_from_name("as_valid") == rc::masked_positions::as_valid);
  REQUIRE(rc::ratio_overflow_from_name("nan_when_masked") == rc::ratio_overflow::nan_when_masked);
  REQUIRE(rc::empty_row_gate_from_name("ratio_one") == rc::empty_row_gate::ratio_one);
  REQUIRE(rc::rs_statistic_from_name("seq_max") == rc::rs_statistic::sequence_max);
  REQUIRE(rc::rs_estimator_from_name("k2") == rc::rs_estimator::k2);
  REQUIRE(ulorl::presets::trl::importance_sampling_mode_from_name("token_mask") == ulorl::presets::trl::importance_sampling_mode::token_mask);
  REQUIRE(arg_of([] { (void)rc::is_level_from_name("tokens", "rollout_is"); }) == "rollout_is");
  REQUIRE(arg_of([] { (void)rc::is_weighting_from_name("mis"); }) == "name");
  REQUIRE(arg_of([] { (void)rc::masked_positions_from_name(""); }) == "name");
  REQUIRE(arg_of([] { (void)rc::ratio_overflow_from_name("nan"); }) == "name");
  REQUIRE(arg_of([] { (void)rc::empty_row_gate_from_name("keep"); }) == "name");
  REQUIRE(arg_of([] { (void)rc::rs_statistic_from_name("seq_min"); }) == "name");
  REQUIRE(arg_of([] { (void)rc::rs_estimator_from_name("k4"); }) == "name");
  REQUIRE(arg_of([] { (void)ulorl::presets::trl::importance_sampling_mode_from_name("sequence"); }) == "vllm_importance_sampling_mode");
}

TEST_CASE("rollout_correction presets: typed options map onto the configuration; their rejections name the option") {
  namespace pv = ulorl::presets::verl;
  namespace pt = ulorl::presets::trl;
  namespace po = ulorl::presets::openrlhf;
  namespace pn = ulorl::presets::nemo_rl;
  // verl
  auto v = pv::rollout_correction({.rollout_is = rc::is_level::token, .rollout_is_threshold = pv::is_threshold{.upper = 2.0}});
  REQUIRE(v.importance.level == rc::is_level::token);
  REQUIRE(v.importance.weighting == rc::is_weighting::truncate);
  REQUIRE(v.importance.log_ratio_clamp == 20.0);
  REQUIRE(v.reject_empty_batch);
  v = pv::rollout_correction({.rollout_is = rc::is_level::sequence, .rollout_is_threshold = pv::parse_rollout_is_threshold("0.5_2.0")});
  REQUIRE(v.importance.weighting == rc::is_weighting::mask);
  REQUIRE(v.importance.lower == 0.5);
  REQUIRE(pv::rollout_correction({.rollout_is = rc::is_level::token, .rollout_is_threshold = std::nullopt}).importance.level == rc::is_level::none);
  REQUIRE(arg_of([] { (void)pv::parse_rollout_is_threshold("2_1"); }) == "rollout_is_threshold");
  REQUIRE(arg_of([] { (void)pv::parse_rollout_is_threshold(""); }) == "rollout_is_threshold");
  REQUIRE(arg_of([] { (void)pv::parse_rollout_is_threshold("a"); }) == "rollout_is_threshold");
  REQUIRE(arg_of([] { (void)pv::parse_rollout_is_threshold("0_1"); }) == "rollout_is_threshold");
  REQUIRE(arg_of([] { (void)pv::parse_rollout_is_threshold("-1"); }) == "rollout_is_threshold");
  REQUIRE(arg_of([] { (void)pv::rollout_correction({.rollout_is = static_cast<rc::is_level>(5)}); }) == "rollout_is");
  REQUIRE(arg_of([] { (void)pv::rollout_correction({.rollout_is = rc::is_level::token, .rollout_is_threshold = pv::is_threshold{.upper = 0}}); }) ==
          "rollout_is_threshold");
  const auto chain = pv::parse_rollout_rs("token_k1, seq_mean_k3,token_k1,,", std::optional<std::string_view>("0.5_2.0,0.02"));
  REQUIRE(chain.size == 2);
  REQUIRE(chain.criteria[0] == rc::rejection_criterion{rc::rs_statistic::token, rc::rs_estimator::k1, 0.5, 2.0});
  REQUIRE(chain.criteria[1] == rc::rejection_criterion{rc::rs_statistic::sequence_mean, rc::rs_estimator::k3, 0.0, 0.02});
  const auto one = pv::parse_rollout_rs("seq_sum_k1", 2.0);
  REQUIRE(one.criteria[0].lower == 0.5);
  REQUIRE(one.criteria[0].upper == 2.0);
  REQUIRE(arg_of([] { (void)pv::parse_rollout_rs("token_k4", 1.0); }) == "rollout_rs");
  REQUIRE(arg_of([] { (void)pv::parse_rollout_rs(" , ", 1.0); }) == "rollout_rs");
  REQUIRE(arg_of([] { (void)pv::parse_rollout_rs("token_k2", std::nullopt); }) == "rollout_rs_threshold");
  REQUIRE(arg_of([] { (void)pv::parse_rollout_rs("token_k1", std::optional<std::string_view>("0.5")); }) == "rollout_rs_threshold");
  REQUIRE(arg_of([] { (void)pv::parse_rollout_rs("seq_sum_k2", std::optional<std::string_view>("0.1_1")); }) == "rollout_rs_threshold");
  REQUIRE(arg_of([] { (void)pv::parse_rollout_rs("token_k2,token_k3,seq_max_k2", std::optional<std::string_view>("1,2")); }) ==
          "rollout_rs_threshold");
  REQUIRE(arg_of([] { (void)pv::parse_rollout_rs("token_k2", std::optional<std::string_view>("_")); }) == "rollout_rs_threshold");
  REQUIRE(arg_of([] { (void)pv::parse_rollout_rs("token_k2", std::optional<std::string_view>("0")); }) == "rollout_rs_threshold");
  // TRL
  auto t = pt::rollout_correction({});
  REQUIRE(t.importance.level == rc::is_level::sequence);
  REQUIRE(t.importance.weighting == rc::is_weighting::mask);
  REQUIRE(t.importance.upper == 3.0);
  REQUIRE(t.importance.masked == rc::masked_positions::neutral);
  t = pt::rollout_correction({.vllm_importance_sampling_mode = pt::importance_sampling_mode::token_truncate,
                              .vllm_importance_sampling_clip_min = 0.5, .vllm_importance_sampling_clip_max = std::nullopt});
  REQUIRE(t.importance.upper == rc::unbounded);
  REQUIRE(t.importance.lower == 0.5);
  REQUIRE(arg_of([] { (void)pt::rollout_correction({.vllm_importance_sampling_mode = pt::importance_sampling_mode::token_mask,
                                                     .vllm_importance_sampling_clip_min = 2.0, .vllm_importance_sampling_clip_max = 2.0}); }) ==
          "vllm_importance_sampling_clip_min");
  REQUIRE(arg_of([] { (void)pt::rollout_correction({.vllm_importance_sampling_mode = pt::importance_sampling_mode::token_truncate,
                                                     .vllm_importance_sampling_clip_max = std::nullopt}); }) == "vllm_importance_sampling_clip_max");
  REQUIRE(arg_of([] { (void)pt::rollout_correction({.vllm_importance_sampling_mode = static_cast<pt::importance_sampling_mode>(7)}); }) ==
          "vllm_importance_sampling_mode");
  // OpenRLHF
  const auto o = po::rollout_correction({.vllm_is_correction_type = rc::is_weighting::geometric_gate});
  REQUIRE(o.importance.lower == 0.5);
  REQUIRE(o.importance.overflow == rc::ratio_overflow::nan_when_masked);
  REQUIRE(o.importance.empty_rows == rc::empty_row_gate::drop);
  REQUIRE(arg_of([] { (void)po::rollout_correction({.vllm_is_truncated_threshold = {2.0, 1.0}}); }) == "vllm_is_truncated_threshold");
  REQUIRE(arg_of([] { (void)po::rollout_correction({.vllm_is_correction_type = static_cast<rc::is_weighting>(8)}); }) == "vllm_is_correction_type");
  // NeMo-RL
  const auto n = pn::rollout_correction(pn::rollout_correction_options{.truncated_importance_sampling_type = rc::is_weighting::truncate, .truncated_importance_sampling_ratio = 2.0});
  REQUIRE(n.importance.lower == 0.0);
  REQUIRE(n.importance.overflow == rc::ratio_overflow::zero);
  REQUIRE(pn::rollout_correction(pn::rollout_correction_options{}).importance.upper == rc::unbounded);
  REQUIRE(arg_of([] { (void)pn::rollout_correction(pn::rollout_correction_options{.truncated_importance_sampling_ratio = 2.0}); }) == "truncated_importance_sampling_ratio");
  REQUIRE(arg_of([] { (void)pn::rollout_correction(pn::rollout_correction_options{.truncated_importance_sampling_type = rc::is_weighting::mask,
                                                     .truncated_importance_sampling_ratio = 2.0}); }) == "truncated_importance_sampling_ratio_min");
  REQUIRE(arg_of([] { (void)pn::rollout_correction(pn::rollout_correction_options{.truncated_importance_sampling_type = rc::is_weighting::truncate}); }) ==
          "truncated_importance_sampling_ratio");
  REQUIRE(arg_of([] { (void)pn::rollout_correction(pn::rollout_correction_options{.truncated_importance_sampling_type = rc::is_weighting::truncate,
                                                     .truncated_importance_sampling_ratio = 2.0, .truncated_importance_sampling_ratio_min = 3.0}); }) ==
          "truncated_importance_sampling_ratio_min");
  REQUIRE(arg_of([] { (void)pn::rollout_correction(pn::rollout_correction_options{.truncated_importance_sampling_type = rc::is_weighting::geometric_gate,
                                                     .truncated_importance_sampling_ratio = 1.002, .truncated_importance_sampling_ratio_min = 0.999,
                                                     .sequence_level_importance_ratios = true}); }) == "sequence_level_importance_ratios");
  // NeMo-RL's logged metrics with global normalisers.
  rc::metrics m;
  m.totals.tokens = 10, m.totals.rows = 4, m.totals.weight_sum = 12, m.totals.unit_sum = 5, m.totals.out_of_bounds_tokens = 2,
  m.totals.out_of_bounds_rows = 1;
  const pn::rollout_correction_options tis{.truncated_importance_sampling_type = rc::is_weighting::truncate, .truncated_importance_sampling_ratio = 2.0};
  REQUIRE(pn::rollout_correction_logged(m, tis).sampling_importance_ratio == Approx(1.2));
  REQUIRE(pn::rollout_correction_logged(m, tis, {.global_valid_toks = 20.0}).is_oob_ratio == Approx(0.1));
  pn::rollout_correction_options seq = tis;
  seq.sequence_level_importance_ratios = true;
  REQUIRE(pn::rollout_correction_logged(m, seq, {.global_valid_seqs = 8.0}).sampling_importance_ratio == Approx(4 * 5 / 8.0));
  // with a sample mask of 3 valid samples: 3 * sum_b w_b / Gs (NeMo-RL's [B, 1] x [B] broadcast)
  REQUIRE(pn::rollout_correction_logged(m, seq, {.global_valid_seqs = 8.0}, 3.0).sampling_importance_ratio == Approx(3 * 5 / 8.0));
  REQUIRE(pn::rollout_correction_logged(m, tis, {}, 3.0).sampling_importance_ratio == Approx(1.2));
  REQUIRE(arg_of([&] { (void)pn::rollout_correction_logged(m, seq, {}, 5.0); }) == "num_valid_samples");
  REQUIRE(arg_of([&] { (void)pn::rollout_correction_logged(m, seq, {}, -1.0); }) == "num_valid_samples");
  REQUIRE(arg_of([&] { (void)pn::rollout_correction_logged(m, seq, {}, std::nan("")); }) == "num_valid_samples");
  pn::rollout_correction_options gate{.truncated_importance_sampling_type = rc::is_weighting::geometric_gate,
                                      .truncated_importance_sampling_ratio = 1.1, .truncated_importance_sampling_ratio_min = 0.9};
  REQUIRE(pn::rollout_correction_logged(m, gate).is_oob_ratio == Approx(0.25));
}
