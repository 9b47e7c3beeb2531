// Tests of ulorl/loss/ratio.hpp: loss_exp accuracy against libm, the clamped ratio's gradient rule,
// and the rollout-correction weights against an independent computation.
#include <ulorl/loss/ratio.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/rejection.hpp"

namespace {
constexpr std::uint64_t seed = 71;
constexpr double inf = std::numeric_limits<double>::infinity();
template <class T>
ulorl::token_view<const T> cview(const std::vector<T>& v, std::size_t B, std::size_t Tn) {
  return ulorl::token_view<const T>::padded(ulorl::matrix_view<const T>(v.data(), B, Tn));
}
}  // namespace

TEST_CASE("loss_exp: a few ulp of std::exp over the whole finite range, finite everywhere") {
  std::printf("test_loss_ratio seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-700, 700), small(-30, 30);
  double worst_d = 0, worst_f = 0;
  for (int i = 0; i < 200000; ++i) {
    const double x = i % 2 ? u(rng) : small(rng);
    const double e = std::exp(x);
    worst_d = std::max(worst_d, std::fabs(ulorl::loss_exp(x) - e) / e);
    const float xf = static_cast<float>(small(rng) * 2.8);
    const double ef = std::exp(static_cast<double>(xf));
    worst_f = std::max(worst_f, std::fabs(static_cast<double>(ulorl::loss_exp(xf)) - ef) / ef);
  }
  std::printf("  loss_exp worst relative error: double %.3g, float %.3g\n", worst_d, worst_f);
  REQUIRE(worst_d < 4 * std::numeric_limits<double>::epsilon());
  REQUIRE(worst_f < 4 * std::numeric_limits<float>::epsilon());
  REQUIRE(ulorl::loss_exp(0.0) == 1.0);
  REQUIRE(ulorl::loss_exp(0.0f) == 1.0f);
  // Saturation instead of inf / 0.
  for (double x : {-1e300, -1e4, -800.0, 710.0, 1e4, 1e300}) {
    REQUIRE(std::isfinite(ulorl::loss_exp(x)));
    REQUIRE(ulorl::loss_exp(x) > 0);
    REQUIRE(std::isfinite(ulorl::loss_exp(static_cast<float>(x))));
    REQUIRE(ulorl::loss_exp(static_cast<float>(x)) > 0);
  }
  REQUIRE(ulorl::loss_exp(-1e4) < 1e-300);
  REQUIRE(ulorl::loss_exp(1e4) > 1e307);
}

TEST_CASE("exp_minus_one_minus_x: accurate near 0 and on both sides of the series switch") {
  for (double u : {1e-12, -1e-9, 1e-5, -0.01, 0.2499, 0.25, -0.2501, 0.7, -3.0, 12.0}) {
    // Reference: long double expm1, or its Taylor series where even long double cancels.
    const long double ul = u;
    const long double ref = std::fabs(u) < 1e-3 ? ul * ul / 2 + ul * ul * ul / 6 + ul * ul * ul * ul / 24 : std::expm1(ul) - ul;
    INFO(u);
    REQUIRE(ulorl::exp_minus_one_minus_x(u) == Approx(static_cast<double>(ref)).epsilon(1e-14));
    REQUIRE(ulorl::exp_minus_one_minus_x(u) >= 0);
  }
}

TEST_CASE("clamped_ratio: value, derivative, closed-interval clamp rule") {
  const auto a = ulorl::clamped_ratio(-1.0, -1.5, 20.0);
  REQUIRE(a.ratio == Approx(std::exp(0.5)).epsilon(1e-15));
  REQUIRE(a.dratio == a.ratio);
  const auto b = ulorl::clamped_ratio(30.0, 0.0, 20.0);
  REQUIRE(b.log_ratio == 20.0);
  REQUIRE(b.dratio == 0.0);
  const auto c = ulorl::clamped_ratio(20.0, 0.0, 20.0);  // at the bound: gradient passes
  REQUIRE(c.dratio == c.ratio);
  const auto d = ulorl::clamped_ratio(-70.0, 0.0, std::numeric_limits<double>::infinity());
  REQUIRE(d.ratio == Approx(std::exp(-70.0)).epsilon(1e-14));
}

TEST_CASE("rollout_correction_weights: token / sequence / geometric, truncate / mask") {
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<double> u(0, 1);
  const std::size_t B = 4, T = 6;
  std::vector<double> old(B * T), roll(B * T), mask(B * T), w(B * T);
  for (std::size_t i = 0; i < B * T; ++i) {
    old[i] = -3 * u(rng);
    roll[i] = old[i] + (u(rng) - 0.5) * 2.4;
    mask[i] = (i % T) < 2 + (i / T) ? 1.0 : 0.0;
  }
  for (auto level : {ulorl::rollout_is_level::token, ulorl::rollout_is_level::sequence, ulorl::rollout_is_level::geometric})
    for (auto mode : {ulorl::rollout_is_mode::truncate, ulorl::rollout_is_mode::mask}) {
      const ulorl::rollout_correction_config cfg{.level = level, .mode = mode, .threshold = 1.6, .lower_threshold = 0.5};
      const auto st = ulorl::rollout_correction_weights<double, double>(cview(old, B, T), cview(roll, B, T), cview(mask, B, T),
                                                                        cfg, ulorl::token_view<double>::padded(ulorl::matrix_view<double>(w.data(), B, T)));
      double tokens = 0;
      for (std::size_t b = 0; b < B; ++b) {
        double s = 0, n = 0;
        for (std::size_t t = 0; t < T; ++t)
          if (mask[b * T + t] != 0) s += old[b * T + t] - roll[b * T + t], n += 1;
        for (std::size_t t = 0; t < T; ++t) {
          const std::size_t i = b * T + t;
          if (mask[i] == 0) {
            REQUIRE(w[i] == 0.0);
            continue;
          }
          tokens += 1;
          double rho = level == ulorl::rollout_is_level::token ? std::exp(old[i] - roll[i])
                       : level == ulorl::rollout_is_level::sequence ? std::exp(s) : std::exp(s / n);
          double expect = mode == ulorl::rollout_is_mode::truncate ? std::min(rho, 1.6) : (rho > 1.6 || rho < 0.5 ? 0.0 : rho);
          REQUIRE(w[i] == Approx(expect).epsilon(1e-13));
        }
      }
      REQUIRE(st.tokens == tokens);
    }
  // Bad input: weights untouched.
  std::vector<double> sentinel(B * T, 9.0);
  old[3] = std::nan("");
  REQUIRE_THROWS_AS((ulorl::rollout_correction_weights<double, double>(cview(old, B, T), cview(roll, B, T), cview(mask, B, T), {},
                                                                      ulorl::token_view<double>::padded(ulorl::matrix_view<double>(sentinel.data(), B, T)))),
                    ulorl::error);
  old[3] = -1;
  REQUIRE_THROWS_AS((ulorl::rollout_correction_weights<double, double>(cview(old, B, T), cview(roll, B, T), cview(mask, B, T),
                                                                      {.threshold = 0.0},
                                                                      ulorl::token_view<double>::padded(ulorl::matrix_view<double>(sentinel.data(), B, T)))),
                    ulorl::error);
  for (double v : sentinel) REQUIRE(v == 9.0);
}

// ---- rollout_correction_weights: a float64 reference with stats, and every rejected input ----

namespace {

//! The independent reference: weights and stats of rollout_correction_weights in plain float64.
struct rollout_ref {
  std::vector<double> w;
  double tokens = 0, truncated = 0, weight_sum = 0;
};
rollout_ref rollout_reference(const shape& s, const std::vector<double>& old, const std::vector<double>& roll, const std::vector<double>* mask,
                              const ulorl::rollout_correction_config& c) {
  rollout_ref r;
  r.w.assign(s.size(), 0.0);
  for (std::size_t b = 0; b < s.rows(); ++b) {
    const std::size_t o = s.row_begin(b), n = s.row_size(b);
    auto valid = [&](std::size_t t) { return mask == nullptr || (*mask)[o + t] != 0; };
    double sum = 0, cnt = 0;
    for (std::size_t t = 0; t < n; ++t)
      if (valid(t)) sum += old[o + t] - roll[o + t], cnt += 1;
    for (std::size_t t = 0; t < n; ++t) {
      if (!valid(t)) continue;
      const double lr = c.level == ulorl::rollout_is_level::token ? old[o + t] - roll[o + t]
                        : c.level == ulorl::rollout_is_level::sequence ? sum : sum / cnt;
      const double rho = std::exp(std::clamp(lr, -c.log_ratio_clamp, c.log_ratio_clamp));
      const bool out = c.mode == ulorl::rollout_is_mode::truncate ? rho > c.threshold : (rho > c.threshold || rho < c.lower_threshold);
      const double w = !out ? rho : c.mode == ulorl::rollout_is_mode::truncate ? c.threshold : 0.0;
      r.w[o + t] = w;
      r.tokens += 1, r.truncated += out, r.weight_sum += w;
    }
  }
  return r;
}

//! The inputs of rollout_correction_weights, each with its own shape.
template <class M>
struct rollout_case {
  shape s_old, s_roll, s_mask, s_w;
  std::vector<double> old, roll, w;
  std::vector<M> mask;
  bool with_mask = true;
  ulorl::rollout_correction_config cfg{};
  explicit rollout_case(const shape& s) : s_old(s), s_roll(s), s_mask(s), s_w(s) {
    for (std::size_t i = 0; i < s.size(); ++i) old.push_back(-0.1 * static_cast<double>(i + 1)), roll.push_back(-0.5);
    mask.assign(s.size(), M(1));
    if (s.size() > 2) mask[1] = M(0);
    w.assign(s.size(), 9.0);
  }
  void reshape(const std::string& arg, const shape& s) {
    if (arg == "old_log_prob") s_old = s, old.assign(s.size(), -0.5);
    if (arg == "rollout_log_prob") s_roll = s, roll.assign(s.size(), -0.5);
    if (arg == "mask") s_mask = s, mask.assign(s.size(), M(1));
    if (arg == "weights") s_w = s, w.assign(s.size(), 9.0);
  }
  ulorl::rollout_correction_stats run() {
    return ulorl::rollout_correction_weights<double, M>(view_of<const double>(old.data(), s_old), view_of<const double>(roll.data(), s_roll),
                                                        with_mask ? view_of<const M>(mask.data(), s_mask) : ulorl::token_view<const M>{}, cfg,
                                                        view_of<double>(w.data(), s_w));
  }
};
}  // namespace

TEST_CASE("rollout_correction_weights: packed and padded, with and without a mask, clamp active: weights and stats against a float64 reference") {
  std::mt19937_64 rng(seed + 2);
  std::uniform_real_distribution<double> u(0, 1);
  int configs = 0;
  double truncated_seen = 0, dropped_seen = 0;
  for (const shape& s : {shape{4, 6, {}}, shape{0, 0, {0, 5, 5, 7, 13, 14}}}) {
    const std::size_t n = s.size();
    std::vector<double> old(n), roll(n), mask(n);
    for (std::size_t i = 0; i < n; ++i) {
      old[i] = -3 * u(rng);
      roll[i] = old[i] + (u(rng) - 0.5) * 2.4;
    }
    for (std::size_t b = 0; b < s.rows(); ++b)
      for (std::size_t t = 0; t < s.row_size(b); ++t) mask[s.row_begin(b) + t] = (b == 2 || (t + b) % 3 == 2) ? 0.0 : 1.0;
    std::vector<float> oldf(old.begin(), old.end()), rollf(roll.begin(), roll.end()), maskf(mask.begin(), mask.end());
    const std::vector<double> oldf_d(oldf.begin(), oldf.end()), rollf_d(rollf.begin(), rollf.end());
    for (bool with_mask : {true, false})
      for (auto level : {ulorl::rollout_is_level::token, ulorl::rollout_is_level::sequence, ulorl::rollout_is_level::geometric})
        for (auto mode : {ulorl::rollout_is_mode::truncate, ulorl::rollout_is_mode::mask})
          for (double clampv : {20.0, 0.4, inf})
            for (double lower : {0.0, 0.7}) {
              INFO("layout " << (s.offsets.empty() ? "padded" : "packed") << " mask " << with_mask << " level " << static_cast<int>(level)
                             << " mode " << static_cast<int>(mode) << " clamp " << clampv << " lower " << lower);
              const ulorl::rollout_correction_config cfg{.level = level, .mode = mode, .threshold = 1.3, .lower_threshold = lower,
                                                         .log_ratio_clamp = clampv};
              const auto expect = rollout_reference(s, old, roll, with_mask ? &mask : nullptr, cfg);
              std::vector<double> w(n, 9.0);
              const auto st = ulorl::rollout_correction_weights<double, double>(
                  view_of<const double>(old.data(), s), view_of<const double>(roll.data(), s),
                  with_mask ? view_of<const double>(mask.data(), s) : ulorl::token_view<const double>{}, cfg, view_of<double>(w.data(), s));
              for (std::size_t i = 0; i < n; ++i) {
                INFO("flat index " << i);
                if (with_mask && mask[i] == 0) REQUIRE(w[i] == 0.0);
                REQUIRE(w[i] == Approx(expect.w[i]).epsilon(1e-13).margin(1e-300));
              }
              REQUIRE(st.tokens == expect.tokens);
              REQUIRE(st.truncated == expect.truncated);
              REQUIRE(st.weight_sum == Approx(expect.weight_sum).epsilon(1e-13));
              truncated_seen += st.truncated;
              if (mode == ulorl::rollout_is_mode::mask) dropped_seen += st.truncated;
              // float inputs: the same computation in double, the weights rounded to float.
              const auto expectf = rollout_reference(s, oldf_d, rollf_d, with_mask ? &mask : nullptr, cfg);
              std::vector<float> wf(n, 9.0f);
              const auto stf = ulorl::rollout_correction_weights<float, float>(
                  view_of<const float>(oldf.data(), s), view_of<const float>(rollf.data(), s),
                  with_mask ? view_of<const float>(maskf.data(), s) : ulorl::token_view<const float>{}, cfg, view_of<float>(wf.data(), s));
              for (std::size_t i = 0; i < n; ++i) REQUIRE(static_cast<double>(wf[i]) == Approx(expectf.w[i]).epsilon(1e-7));
              REQUIRE(stf.truncated == expectf.truncated);
              REQUIRE(stf.weight_sum == Approx(expectf.weight_sum).epsilon(1e-13));
              ++configs;
            }
  }
  REQUIRE(configs == 2 * 2 * 3 * 2 * 3 * 2);
  REQUIRE(truncated_seen > 0);  // the thresholds were active: the comparisons above are not vacuous
  REQUIRE(dropped_seen > 0);
  // A huge sequence log-ratio with no clamp saturates: finite weights, truncated to the threshold.
  std::vector<double> big_old{0.0, 0.0}, big_roll{-400.0, -400.0}, w(2, 9.0);
  const shape s2{1, 2, {}};
  const auto st = ulorl::rollout_correction_weights<double, double>(view_of<const double>(big_old.data(), s2), view_of<const double>(big_roll.data(), s2),
                                                                    {}, {.level = ulorl::rollout_is_level::sequence, .log_ratio_clamp = inf},
                                                                    view_of<double>(w.data(), s2));
  REQUIRE(w[0] == 2.0);
  REQUIRE(w[1] == 2.0);
  REQUIRE(st.truncated == 2);
}

TEST_CASE("rollout_correction_weights: bad input names the argument and the flat index; weights untouched") {
  const std::string fn = "rollout_correction_weights";
  int rejected = 0;
  for (const shape& base : {padded_shape, packed_shape}) {
    INFO("base layout " << (base.offsets.empty() ? "padded" : "packed"));
    {
      rollout_case<double> ok(base);
      REQUIRE_NOTHROW(ok.run());
      ok.with_mask = false;
      REQUIRE_NOTHROW(ok.run());
    }
    // Each argument in turn the odd one out ('old_log_prob' odd: named on the first compared with it).
    for (const char* odd : {"old_log_prob", "rollout_log_prob", "mask", "weights"})
      for (const shape& w : wrong_shapes(base)) {
        rollout_case<double> c(base);
        c.reshape(odd, w);
        INFO("odd argument " << odd << ", " << w.rows() << " rows, " << w.size() << " elements");
        require_rejected(outcome_of([&] { c.run(); }), fn, std::string(odd) == "old_log_prob" ? "rollout_log_prob" : odd, -1);
        REQUIRE(all_equal(c.w, 9.0));
        ++rejected;
      }
    // Non-finite log-probabilities, at the first, a masked and the last token, for every level.
    for (const char* arg : {"old_log_prob", "rollout_log_prob"})
      for (double bad : {std::nan(""), inf, -inf})
        for (std::size_t i : {std::size_t{0}, std::size_t{1}, base.size() - 1})
          for (auto level : {ulorl::rollout_is_level::token, ulorl::rollout_is_level::sequence}) {
            rollout_case<double> c(base);
            c.cfg.level = level;
            (std::string(arg) == "old_log_prob" ? c.old : c.roll)[i] = bad;
            INFO(arg << "[" << i << "] = " << bad);
            require_rejected(outcome_of([&] { c.run(); }), fn, arg, static_cast<std::int64_t>(i));
            REQUIRE(all_equal(c.w, 9.0));
            ++rejected;
          }
    // Finite log-probabilities whose difference overflows (a sequence sum of +inf and -inf would
    // be NaN): named at the first such token, for every level.
    for (auto level : {ulorl::rollout_is_level::token, ulorl::rollout_is_level::sequence, ulorl::rollout_is_level::geometric}) {
      rollout_case<double> c(base);
      c.cfg.level = level;
      const std::size_t i = base.size() - 1;
      c.old[0] = 1e308, c.roll[0] = -1e308;
      c.old[i] = -1e308, c.roll[i] = 1e308;
      require_rejected(outcome_of([&] { c.run(); }), fn, "rollout_log_prob", 0);
      REQUIRE(all_equal(c.w, 9.0));
      ++rejected;
    }
    // Masks that are not 0/1.
    rejected += require_bad_masks_rejected<rollout_case>(base, fn, [](auto& c) -> auto& { return c.w; }, 9.0);
    // Configuration: threshold <= 0 / NaN / inf, lower_threshold < 0 / NaN / inf / > threshold,
    // log_ratio_clamp <= 0 / NaN; for both modes.
    auto bad_cfg = [&](const char* arg, auto set) {
      for (auto mode : {ulorl::rollout_is_mode::truncate, ulorl::rollout_is_mode::mask}) {
        rollout_case<double> c(base);
        c.cfg.mode = mode;
        set(c.cfg);
        require_rejected(outcome_of([&] { c.run(); }), fn, arg, -1);
        REQUIRE(all_equal(c.w, 9.0));
        ++rejected;
      }
    };
    for (double bad : {0.0, -0.0, -1.0, std::nan(""), inf}) bad_cfg("threshold", [&](auto& c) { c.threshold = bad; });
    for (double bad : {-0.1, std::nan(""), inf, 2.5}) bad_cfg("lower_threshold", [&](auto& c) { c.lower_threshold = bad; });
    for (double bad : {0.0, -1.0, std::nan("")}) bad_cfg("log_ratio_clamp", [&](auto& c) { c.log_ratio_clamp = bad; });
    {
      rollout_case<double> ok(base);
      ok.cfg.lower_threshold = ok.cfg.threshold;  // lower == threshold is allowed
      REQUIRE_NOTHROW(ok.run());
    }
  }
  REQUIRE(rejected == 2 * (4 * 5 + 2 * 3 * 3 * 2 + 3 + 2 * (1 + 4 * 2) + 2 * (5 + 4 + 3)));
}
