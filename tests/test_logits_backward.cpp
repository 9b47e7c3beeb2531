// Tests of ulorl/logits/backward.hpp: against the long-double oracle's softmax-Jacobian gradient,
// against central finite differences of logits_forward (double), in place, strided, bf16, errors.
// Gradient error metrics, per row (float32 results cannot hold more):
//   termwise:  |g_j - exact_j| / s_j, s_j = sum of |terms| of exact_j (|g_lp| (delta + p_j) +
//              |g_ent| p_j (|log p_j| + H)) / tau — for entries with p_j >= 1e-6;
//   normwise:  max_j |g_j - exact_j| / max_j s_j over the whole row (every entry, -inf included).
// (|exact_j| itself can be 1e-9 |g_lp| for a token of probability 1 - 1e-9: no float32 algorithm,
// torch's included, gets that difference of two O(1) numbers to 1e-6 relative.)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <ulorl/logits/backward.hpp>
#include <ulorl/logits/forward.hpp>

#include "catch.hpp"
#include "support/logits_oracle.hpp"
#include "support/logits_temperature.hpp"

using namespace ulorl;

namespace {

constexpr std::uint64_t seed = 777123;
const float finf = std::numeric_limits<float>::infinity();

template <class L>
struct saved {
  std::vector<double> lp, h, lse;
};

template <class L>
saved<L> forward(const std::vector<L>& x, std::size_t rows, std::size_t cols, const std::vector<std::int64_t>& y,
                 double tau) {
  saved<L> s{std::vector<double>(rows), std::vector<double>(rows), std::vector<double>(rows)};
  logits_forward(matrix_view<const L>(x.data(), rows, cols), std::span<const std::int64_t>(y),
                 vector_view<double>(s.lp.data(), rows), vector_view<double>(s.h.data(), rows),
                 vector_view<double>(s.lse.data(), rows), {.temperature = tau});
  return s;
}

template <class L, class G>
std::vector<G> backward(const std::vector<L>& x, std::size_t rows, std::size_t cols, const std::vector<std::int64_t>& y,
                        const std::vector<double>& glp, const std::vector<double>& gent, double tau,
                        bool fast = false) {
  const auto s = forward(x, rows, cols, y, tau);
  std::vector<G> g(rows * cols);
  logits_backward(matrix_view<const L>(x.data(), rows, cols), std::span<const std::int64_t>(y),
                  vector_view<const double>(s.lse.data(), rows), vector_view<const double>(s.h.data(), rows),
                  vector_view<const double>(glp.data(), rows), vector_view<const double>(gent.data(), rows),
                  matrix_view<G>(g.data(), rows, cols), {.temperature = tau, .fast_backward = fast});
  return g;
}

double to_d(float v) { return v; }
double to_d(double v) { return v; }
double to_d(bf16 v) { return v.to_float(); }

struct errs {
  double normwise = 0, termwise = 0;
};
template <class G>
errs grad_errors(const std::vector<G>& g, const std::vector<std::vector<double>>& rows, const logits_data::batch& b,
                 double tau) {
  errs e;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto y = static_cast<std::size_t>(b.labels[r]);
    const auto ex = oracle::logits_row_grad(rows[r], y, tau, b.g_lp[r], b.g_ent[r]);
    const auto sc = oracle::logits_row_grad_scale(rows[r], y, tau, b.g_lp[r], b.g_ent[r]);
    const auto st = oracle::logits_row(rows[r], y, tau);
    long double gmax = 0;
    for (auto v : sc) gmax = std::max(gmax, v);
    for (std::size_t j = 0; j < ex.size(); ++j) {
      const long double d = std::fabs(to_d(g[r * b.cols + j]) - ex[j]);
      e.normwise = std::max(e.normwise, static_cast<double>(d / (gmax + 1e-36L)));
      const long double p = std::exp(static_cast<long double>(rows[r][j]) / tau - st.lse);
      if (p >= 1e-6L) e.termwise = std::max(e.termwise, static_cast<double>(d / sc[j]));
    }
  }
  return e;
}

}  // namespace

TEST_CASE("logits_backward float32 matches the oracle gradient") {
  std::printf("test_logits_backward seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  errs worst;
  for (std::size_t v : {1u, 3u, 47u, 1023u, 1025u, 4099u})
    for (double scale : {1.0, 10.0, 1e3})
      for (double shift : {0.0, 1e4})
        for (double tau : {1.0, 0.6, 1.7}) {
          const auto b = logits_data::make(rng, 4, v, scale, shift, v == 1 ? 0.0 : 0.15);
          const auto g = backward<float, float>(b.x, b.rows, v, b.labels, b.g_lp, b.g_ent, tau);
          const auto e = grad_errors(g, b.all_rows(), b, tau);
          INFO("V=" << v << " scale=" << scale << " shift=" << shift << " tau=" << tau << " normwise=" << e.normwise
                    << " termwise=" << e.termwise);
          CHECK(e.normwise < 1e-6);
          CHECK(e.termwise < 1e-6);
          worst.normwise = std::max(worst.normwise, e.normwise);
          worst.termwise = std::max(worst.termwise, e.termwise);
        }
  std::printf("  float32 backward: worst normwise %.3g, termwise (p >= 1e-6) %.3g (bound 1e-6)\n", worst.normwise,
              worst.termwise);
}

TEST_CASE("logits_backward fast_backward (log p in float, torch's precision)") {
  std::mt19937_64 rng(seed + 5);
  errs worst;
  for (std::size_t v : {47u, 1025u, 40000u})
    for (double scale : {1.0, 10.0})
      for (double tau : {1.0, 1.7}) {
        const auto b = logits_data::make(rng, 3, v, scale, 0.0, 0.1);
        const auto g = backward<float, float>(b.x, b.rows, v, b.labels, b.g_lp, b.g_ent, tau, true);
        const auto e = grad_errors(g, b.all_rows(), b, tau);
        CHECK(e.normwise < 1e-6);
        CHECK(e.termwise < 3e-6);  // |log p| <= 13.8 for p >= 1e-6: 13.8 * 6e-8 * (1 + 1/tau) + exp's 1.2e-7
        worst.normwise = std::max(worst.normwise, e.normwise);
        worst.termwise = std::max(worst.termwise, e.termwise);
      }
  std::printf("  float32 fast backward: worst normwise %.3g, termwise (p >= 1e-6) %.3g\n", worst.normwise,
              worst.termwise);
}

TEST_CASE("logits_backward double and bf16 storage") {
  std::mt19937_64 rng(seed + 1);
  for (std::size_t v : {3u, 47u, 2000u}) {
    const auto b = logits_data::make(rng, 3, v, 4.0, 50.0, 0.1);
    std::vector<double> xd(b.x.begin(), b.x.end());
    const auto gd = backward<double, double>(xd, b.rows, v, b.labels, b.g_lp, b.g_ent, 0.8);
    const auto ed = grad_errors(gd, b.all_rows(), b, 0.8);
    CHECK(ed.normwise < 1e-13);
    CHECK(ed.termwise < 1e-12);
    // bf16 in, float out (exact on the bf16 values); bf16 in, bf16 out (output rounding ~2^-9).
    const auto bu = logits_data::make(rng, 3, v, 1.0, 0.0, 0.1);
    std::vector<bf16> xb;
    for (float x : bu.x) xb.push_back(bf16::from_float(x));
    logits_data::batch exact = bu;
    for (std::size_t i = 0; i < xb.size(); ++i) exact.x[i] = xb[i].to_float();
    const auto gf = backward<bf16, float>(xb, bu.rows, v, bu.labels, bu.g_lp, bu.g_ent, 1.0);
    CHECK(grad_errors(gf, exact.all_rows(), exact, 1.0).normwise < 1e-6);
    const auto gb = backward<bf16, bf16>(xb, bu.rows, v, bu.labels, bu.g_lp, bu.g_ent, 1.0);
    CHECK(grad_errors(gb, exact.all_rows(), exact, 1.0).termwise < 1e-2);
    CHECK(grad_errors(gb, bu.all_rows(), bu, 1.0).normwise < 1e-2);
  }
}

TEST_CASE("logits_backward agrees with central finite differences of logits_forward") {
  std::mt19937_64 rng(seed + 2);
  for (std::size_t v : {2u, 7u, 33u})
    for (double tau : {1.0, 0.6}) {
      const auto b = logits_data::make(rng, 3, v, 2.0, 0.0, 0.0);
      std::vector<double> x(b.x.begin(), b.x.end());
      const auto g = backward<double, double>(x, b.rows, v, b.labels, b.g_lp, b.g_ent, tau);
      const double h = 1e-6;
      for (std::size_t r = 0; r < b.rows; ++r)
        for (std::size_t j = 0; j < v; ++j) {
          auto loss = [&](double dx) {
            auto xp = x;
            xp[r * v + j] += dx;
            const auto s = forward(xp, b.rows, v, b.labels, tau);
            return b.g_lp[r] * s.lp[r] + b.g_ent[r] * s.h[r];
          };
          const double fd = (loss(h) - loss(-h)) / (2 * h);
          INFO("row " << r << " col " << j << " V=" << v << " tau=" << tau);
          CHECK(std::fabs(g[r * v + j] - fd) <= 1e-7 + 1e-6 * std::fabs(fd));
        }
    }
}

TEST_CASE("logits_backward: masked entries, in place, strided output") {
  std::mt19937_64 rng(seed + 3);
  const std::size_t rows = 3, v = 2500;
  auto b = logits_data::make(rng, rows, v, 3.0, 0.0, 0.2);
  b.x[0 * v + 7] = -finf;
  b.labels[1] = 9;
  b.x[1 * v + 9] = -finf;  // a masked label: log_prob -inf, gradient g_lp / tau there, 0 elsewhere masked
  const auto ref = backward<float, float>(b.x, rows, v, b.labels, b.g_lp, b.g_ent, 0.9);
  for (std::size_t i = 0; i < b.x.size(); ++i)
    if (b.x[i] == -finf && i != 1 * v + 9) CHECK(ref[i] == 0.0f);
  CHECK(ref[1 * v + 9] == static_cast<float>(b.g_lp[1] / 0.9));
  // In place: the gradient overwrites the logits buffer.
  const auto s = forward(b.x, rows, v, b.labels, 0.9);
  auto buf = b.x;
  logits_backward(matrix_view<float>(buf.data(), rows, v), std::span<const std::int64_t>(b.labels),
                  vector_view<const double>(s.lse.data(), rows), vector_view<const double>(s.h.data(), rows),
                  vector_view<const double>(b.g_lp.data(), rows), vector_view<const double>(b.g_ent.data(), rows),
                  matrix_view<float>(buf.data(), rows, v), {.temperature = 0.9});
  CHECK(buf == ref);
  // Column-major output, and bf16 strided output.
  std::vector<float> cm(rows * v);
  std::vector<bf16> wide(rows * v * 2);
  logits_backward(matrix_view<const float>(b.x.data(), rows, v), std::span<const std::int64_t>(b.labels),
                  vector_view<const double>(s.lse.data(), rows), vector_view<const double>(s.h.data(), rows),
                  vector_view<const double>(b.g_lp.data(), rows), vector_view<const double>(b.g_ent.data(), rows),
                  matrix_view<float>(cm.data(), rows, v, 1, static_cast<std::ptrdiff_t>(rows)), {.temperature = 0.9});
  logits_backward(matrix_view<const float>(b.x.data(), rows, v), std::span<const std::int64_t>(b.labels),
                  vector_view<const double>(s.lse.data(), rows), vector_view<const double>(s.h.data(), rows),
                  vector_view<const double>(b.g_lp.data(), rows), vector_view<const double>(b.g_ent.data(), rows),
                  matrix_view<bf16>(wide.data(), rows, v, static_cast<std::ptrdiff_t>(2 * v), 2), {.temperature = 0.9});
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < v; ++c) {
      CHECK(cm[c * rows + r] == ref[r * v + c]);
      CHECK(wide[r * 2 * v + 2 * c] == bf16::from_float(ref[r * v + c]));
    }
  // Without an entropy term (empty grad_entropy and entropy): equals g_ent = 0.
  std::vector<double> zeros(rows, 0.0);
  const auto g0 = backward<float, float>(b.x, rows, v, b.labels, b.g_lp, zeros, 0.9);
  std::vector<float> g1(rows * v);
  logits_backward(matrix_view<const float>(b.x.data(), rows, v), std::span<const std::int64_t>(b.labels),
                  vector_view<const double>(s.lse.data(), rows), vector_view<const double>(),
                  vector_view<const double>(b.g_lp.data(), rows), vector_view<const double>(),
                  matrix_view<float>(g1.data(), rows, v), {.temperature = 0.9});
  CHECK(g1 == g0);
}

TEST_CASE("logits_backward with a thread executor gives the same bits") {
  std::mt19937_64 rng(seed + 4);
  const auto b = logits_data::make(rng, 9, 3000, 2.0, 0.0, 0.1);
  const auto ref = backward<float, float>(b.x, b.rows, b.cols, b.labels, b.g_lp, b.g_ent, 1.0);
  const auto s = forward(b.x, b.rows, b.cols, b.labels, 1.0);
  std::vector<float> g(b.x.size());
  logits_backward(matrix_view<const float>(b.x.data(), b.rows, b.cols), std::span<const std::int64_t>(b.labels),
                  vector_view<const double>(s.lse.data(), b.rows), vector_view<const double>(s.h.data(), b.rows),
                  vector_view<const double>(b.g_lp.data(), b.rows), vector_view<const double>(b.g_ent.data(), b.rows),
                  matrix_view<float>(g.data(), b.rows, b.cols), {}, thread_executor{3});
  CHECK(g == ref);
}

TEST_CASE("logits_backward rejects bad input before writing") {
  const std::size_t rows = 2, v = 5;
  std::vector<float> x(rows * v, 0.5f), g(rows * v, 42.0f);
  std::vector<double> lse{1.0, 1.0}, h{0.5, 0.5}, glp{1.0, 1.0}, gent{0.1, 0.1};
  std::vector<std::int64_t> y{1, 2};
  auto call = [&](matrix_view<float> out, std::vector<std::int64_t> labels = {1, 2}) {
    logits_backward(matrix_view<const float>(x.data(), rows, v), std::span<const std::int64_t>(labels),
                    vector_view<const double>(lse.data(), lse.size()), vector_view<const double>(h.data(), h.size()),
                    vector_view<const double>(glp.data(), glp.size()),
                    vector_view<const double>(gent.data(), gent.size()), out);
  };
  const matrix_view<float> out(g.data(), rows, v);
  CHECK_THROWS_WITH(call(out, {1, 5}), Catch::Matchers::Contains("row 1"));
  lse[1] = std::numeric_limits<double>::quiet_NaN();
  try {
    call(out);
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.argument() == "lse");
    CHECK(e.index() == 1);
  }
  lse[1] = 1.0;
  glp[0] = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(call(out), Catch::Matchers::Contains("'grad_log_prob'[0]"));
  glp[0] = 1.0;
  h.pop_back();
  CHECK_THROWS_WITH(call(out), Catch::Matchers::Contains("'entropy'"));
  h.push_back(0.5);
  CHECK_THROWS_WITH(call(matrix_view<float>(g.data(), rows, v - 1)), Catch::Matchers::Contains("shape"));
  CHECK_THROWS_WITH(call(matrix_view<float>(g.data(), rows, v, 3, 1)), Catch::Matchers::Contains("overlap"));
  CHECK_THROWS_WITH(call(matrix_view<float>(g.data(), rows, v, static_cast<std::ptrdiff_t>(v), 0)),
                    Catch::Matchers::Contains("overlap"));
  CHECK(g == std::vector<float>(rows * v, 42.0f));
  call(out);  // valid
  CHECK(g != std::vector<float>(rows * v, 42.0f));
}

TEST_CASE(
    "logits_backward: the temperature rule of logits_forward (finite reciprocal; scaled rows with the value scan)") {
  const std::size_t rows = 2, v = 2;
  std::vector<double> x{1.0, 0.0, -3.0, 2.0}, g(rows * v, 42.0);
  std::vector<double> lse{1.0, 1.0}, h{0.5, 0.5}, glp{1.0, 1.0}, gent{0.1, 0.1};
  const std::vector<std::int64_t> y{0, 1};
  const auto call = [&](const std::vector<double>& logits, double tau, bool check) {
    logits_backward(matrix_view<const double>(logits.data(), rows, v), std::span<const std::int64_t>(y),
                    vector_view<const double>(lse.data(), rows), vector_view<const double>(h.data(), rows),
                    vector_view<const double>(glp.data(), rows), vector_view<const double>(gent.data(), rows),
                    matrix_view<double>(g.data(), rows, v), {.temperature = tau, .check_values = check});
  };
  try {
    call(x, 1e-320, false);
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "logits_backward");
    CHECK(e.argument() == "temperature");
    CHECK(std::string(e.what()).find("reciprocal") != std::string::npos);
  }
  std::vector<float> xf(x.begin(), x.end()), gf(rows * v, 42.0f);
  CHECK_THROWS_WITH(
      logits_backward(matrix_view<const float>(xf.data(), rows, v), std::span<const std::int64_t>(y),
                      vector_view<const double>(lse.data(), rows), vector_view<const double>(h.data(), rows),
                      vector_view<const double>(glp.data(), rows), vector_view<const double>(gent.data(), rows),
                      matrix_view<float>(gf.data(), rows, v), {.temperature = 1e-300}),
      Catch::Matchers::Contains("'temperature'"));
  std::vector<double> big{1e10, 0.0, 1.0, 2.0};
  CHECK_THROWS_WITH(call(big, 1e-300, true),
                    Catch::Matchers::Contains("'logits'") && Catch::Matchers::Contains("row 0"));
  CHECK(g == std::vector<double>(rows * v, 42.0));
  CHECK(gf == std::vector<float>(rows * v, 42.0f));
}

// Extreme temperatures. The backward's log p_j = (x_j - c) / tau - r takes its anchor from the saved
// lse only while |lse| is small enough for the stored lse to place log p (lse_anchor_limit) and
// lse * tau is finite in the arithmetic type; otherwise from the row's own maximum and sum.

namespace {

template <class L, class S, class G>
temperature_check::result temp_run(const std::vector<double>& x, std::size_t cols, std::int64_t label, double g_lp,
                                   double g_ent, double tau) {
  return temperature_check::run<L, S, G>(x, x.size() / cols, cols, std::vector<std::int64_t>(x.size() / cols, label),
                                         std::vector<double>(x.size() / cols, g_lp),
                                         std::vector<double>(x.size() / cols, g_ent), tau);
}

}  // namespace

TEST_CASE("logits_backward at tiny temperatures: float64 matches the oracle where lse has lost log p's digits") {
  // T = 1e-15, logits 1 + k 2^-50: lse ~ 1e15 carries log p to +-0.1 only (the stored-lse anchor was 21% off).
  std::vector<double> x;
  for (int k = 0; k < 5; ++k) x.push_back(1.0 + k * std::ldexp(1.0, -50));
  const auto e = temp_run<double, double, double>(x, 5, 0, 1.0, 0.3, 1e-15);
  REQUIRE(!e.refused);
  CHECK(e.grad_err < 1e-9);
  CHECK(e.stat_err < 1e-12);
  // T = 1e-20 .. 1e-28, row {1, 0.5}, label 1: p = (1, 0), so dlog_prob_1 / dx_0 = -1 / T (was 0, then -inf).
  for (double tau : {1e-20, 1e-22, 1e-25, 1e-28}) {
    std::vector<double> g(2);
    const std::vector<double> xs{1.0, 0.5}, lse{1.0 / tau}, h{0.0}, glp{1.0}, gent{0.0};
    const std::vector<std::int64_t> y{1};
    const auto s = forward(xs, 1, 2, y, tau);
    logits_backward(matrix_view<const double>(xs.data(), 1, 2), std::span<const std::int64_t>(y),
                    vector_view<const double>(s.lse.data(), 1), vector_view<const double>(s.h.data(), 1),
                    vector_view<const double>(glp.data(), 1), vector_view<const double>(gent.data(), 1),
                    matrix_view<double>(g.data(), 1, 2), {.temperature = tau});
    INFO("tau " << tau);
    CHECK(std::fabs(g[0] + 1.0 / tau) <= 1e-15 / tau);
    CHECK(std::fabs(g[1] - 1.0 / tau) <= 1e-15 / tau);
    CHECK(temp_run<double, double, double>(xs, 2, 1, 1.0, 0.2, tau).grad_err < 1e-9);
  }
}

TEST_CASE("logits_backward at T = 1e-20: float32 and bf16 give -1/T, not -inf") {
  const std::vector<double> x{1.0, 0.5, 1.0, 0.5};  // two rows
  for (double tau : {1e-20, 1e-30}) {
    INFO("tau " << tau);
    const auto ef = temp_run<float, double, float>(x, 2, 1, 1.0, 0.0, tau);
    const auto eff = temp_run<float, float, float>(x, 2, 1, 1.0, 0.0, tau);
    const auto eb = temp_run<bf16, double, bf16>(x, 2, 1, 1.0, 0.0, tau);
    const auto ebf = temp_run<bf16, float, float>(x, 2, 1, 1.0, 0.3, tau);
    REQUIRE(!(ef.refused || eff.refused || eb.refused || ebf.refused));
    CHECK(ef.grad_err < 1e-6);
    CHECK(eff.grad_err < 1e-6);
    CHECK(eb.grad_err < 1e-2);
    CHECK(ebf.grad_err < 1e-6);
  }
  std::vector<float> g(2);
  const std::vector<float> xs{1.0f, 0.5f};
  const std::vector<double> glp{1.0}, gent{0.0};
  const std::vector<std::int64_t> y{1};
  const auto s = forward(xs, 1, 2, y, 1e-20);
  logits_backward(matrix_view<const float>(xs.data(), 1, 2), std::span<const std::int64_t>(y),
                  vector_view<const double>(s.lse.data(), 1), vector_view<const double>(s.h.data(), 1),
                  vector_view<const double>(glp.data(), 1), vector_view<const double>(gent.data(), 1),
                  matrix_view<float>(g.data(), 1, 2), {.temperature = 1e-20});
  CHECK(g[0] == Approx(-1e20).epsilon(1e-6));
  CHECK(g[1] == Approx(1e20).epsilon(1e-6));
}

TEST_CASE("logits_backward at huge temperatures: finite gradients (T >= 1e40 float32 / bf16, 1e308 float64)") {
  const std::vector<double> x{1.0, 0.5, -2.0, 3.0, 0.0, 1.0};  // two rows of three
  for (double tau : {1e40, 1e45, 1e300}) {
    INFO("tau " << tau);
    const auto ef = temp_run<float, double, float>(x, 3, 0, 1.0, 0.5, tau);
    const auto eff = temp_run<float, float, float>(x, 3, 0, 1.0, 0.5, tau);
    const auto eb = temp_run<bf16, double, bf16>(x, 3, 0, 1.0, 0.5, tau);
    REQUIRE(!(ef.refused || eff.refused || eb.refused));
    CHECK(ef.grad_err < 1e-5);
    CHECK(eff.grad_err < 1e-5);
    CHECK(eb.grad_err < 1e-2);
  }
  for (double tau : {1e300, 1e308, 1.7e308}) {
    INFO("tau " << tau);
    std::vector<double> xs = x;
    for (double& v : xs) v *= 1e307;  // scaled logits of order 1e-1
    const auto e = temp_run<double, double, double>(xs, 3, 2, 1.0, 0.5, tau);
    REQUIRE(!e.refused);
    CHECK(e.grad_err < 1e-9);
    CHECK(temp_run<double, double, double>(x, 3, 2, 1.0, 0.5, tau).grad_err < 1e-9);
  }
}

TEST_CASE("logits_backward: an anchor lse * T past half of float's range does not overflow x - c") {
  // T ~ 1e38 and logits of order +-6e37 (scaled logits ~0.6, lse ~ 3.55): lse * T ~ 3.3e38 is a
  // finite float, but x_j - c for negative x_j is past float's range; the anchor must come from the
  // row, or those p_j (a third of the gradient) come out 0.
  const std::size_t cols = 33;
  std::vector<double> x(2 * cols);
  for (std::size_t j = 0; j < x.size(); ++j) x[j] = (j % 2 ? -1.0 : 1.0) * 6e37 * static_cast<double>(j % cols) / cols;
  const std::vector<std::int64_t> y{6, 7};
  const std::vector<double> glp{-1.1, 0.7}, gent{0.0, 0.4};
  for (double tau : {9e37, 9.5e37})
    for (bool fast : {false, true}) {
      INFO("tau " << tau << " fast " << fast);
      const auto ff = temperature_check::run<float, float, float>(x, 2, cols, y, glp, gent, tau, fast);
      const auto fd = temperature_check::run<float, double, float>(x, 2, cols, y, glp, gent, tau, fast);
      const auto bf = temperature_check::run<bf16, float, float>(x, 2, cols, y, glp, gent, tau, fast);
      REQUIRE(!(ff.refused || fd.refused || bf.refused));
      CHECK(ff.grad_err < 3e-4);
      CHECK(fd.grad_err < 3e-4);
      CHECK(bf.grad_err < 3e-4);
    }
}

namespace {
// max_j |d entropy / d x_j| of the row x (label y) from logits_forward's statistics (type S).
template <class L, class S>
double entropy_grad_max(const std::vector<double>& xd, std::int64_t y, double tau) {
  const std::size_t v = xd.size();
  const std::vector<L> x(xd.begin(), xd.end());
  std::vector<S> lp(1), h(1), lse(1), glp{S(0)}, gent{S(1)};
  const std::vector<std::int64_t> yy{y};
  logits_forward(matrix_view<const L>(x.data(), 1, v), std::span<const std::int64_t>(yy), vector_view<S>(lp.data(), 1),
                 vector_view<S>(h.data(), 1), vector_view<S>(lse.data(), 1), {.temperature = tau});
  std::vector<L> g(v, L(42));
  logits_backward(matrix_view<const L>(x.data(), 1, v), std::span<const std::int64_t>(yy),
                  vector_view<const S>(lse.data(), 1), vector_view<const S>(h.data(), 1),
                  vector_view<const S>(glp.data(), 1), vector_view<const S>(gent.data(), 1),
                  matrix_view<L>(g.data(), 1, v), {.temperature = tau});
  double m = 0;
  for (L q : g) m = std::max(m, std::fabs(static_cast<double>(q)));
  return h[0] == S(0) ? m : -1.0;  // -1: not a one-hot row
}
}  // namespace

TEST_CASE("logits_backward: the entropy gradient of a one-hot row at a tiny temperature is exactly 0") {
  // p = (1, 0, 0): entropy 0 and flat in x; the stored-lse anchor gave 5e13 (float64, T = 1e-15,
  // label not the maximum) and inf (float32 statistics, T <= 1e-10).
  for (double base : {0.1, 3.0, 100.0})
    for (std::int64_t y : {0, 1}) {
      const std::vector<double> x{base, base - 1.0, base - 2.0};
      INFO("base " << base << " label " << y);
      for (double tau : {1e-12, 1e-15, 1e-20, 1e-30}) {
        INFO("tau " << tau);
        CHECK(entropy_grad_max<double, double>(x, y, tau) == 0.0);
        CHECK(entropy_grad_max<float, double>(x, y, tau) == 0.0);
      }
      for (double tau : {1e-8, 1e-10, 1e-13, 1e-20}) CHECK(entropy_grad_max<float, float>(x, y, tau) == 0.0);
    }
}

TEST_CASE("logits_backward: huge incoming gradients on a row with p_j = 0 give 0 there, not NaN (float64)") {
  // A golden verl entropy case scaled by 1e307: row (-1.394e307, -1.577e307), label 0, so p = (1, 0)
  // and log p_1 = -1.8e306; grad_entropy = -3.2e306 made b log p_1 = inf and inf * p_1 = NaN.
  const std::vector<double> x{-1.3943856932934434e+307, -1.5770620895327965e+307};
  const std::vector<std::int64_t> y{0};
  std::vector<double> lp(1), h(1), lse(1);
  logits_forward(matrix_view<const double>(x.data(), 1, 2), std::span<const std::int64_t>(y),
                 vector_view<double>(lp.data(), 1), vector_view<double>(h.data(), 1),
                 vector_view<double>(lse.data(), 1));
  REQUIRE(h[0] == 0.0);
  for (const double ge : {-3.21679719686385e+306, 1e308, 0.0}) {
    INFO("grad_entropy " << ge);
    const std::vector<double> glp{-9.899371834621485e+306}, gent{ge};
    std::vector<double> g(2, 42.0);
    logits_backward(matrix_view<const double>(x.data(), 1, 2), std::span<const std::int64_t>(y),
                    vector_view<const double>(lse.data(), 1), vector_view<const double>(h.data(), 1),
                    vector_view<const double>(glp.data(), 1), vector_view<const double>(gent.data(), 1),
                    matrix_view<double>(g.data(), 1, 2));
    CHECK(g[0] == 0.0);
    CHECK(g[1] == 0.0);
  }
}

TEST_CASE("logits_backward: temperature sweep 1e-30 .. 1e308 against the oracle (float32, float64, bf16)") {
  // Log-spaced temperatures (with the examples above), rows of several magnitudes: scaled logits of
  // order 1 (x = T u), offsets (x = base + T u), fixed magnitudes (x = s u), masked entries. Every
  // batch is either refused (ulorl::error) or matches the oracle to the type's tolerance.
  std::vector<double> taus;
  for (int e = -30; e <= 308; e += 12) taus.push_back(std::pow(10.0, e));
  for (double t : {1e-28, 1e-25, 1e-20, 1e-15, 1e-6, 3.7e-3, 0.6, 1.0, 1.7, 1e40, 1e45, 1e300, 1e308, 1.7e308})
    taus.push_back(t);
  std::mt19937_64 rng(seed + 17);
  std::normal_distribution<double> nd;
  int checked = 0, refused = 0;
  double worst[6] = {};
  for (double tau : taus)
    for (std::size_t cols : {37u, 1100u}) {
      // max_x: a bound on |x| that keeps every type's logits and x - max finite.
      const auto make = [&](double max_x) {
        std::vector<double> x;
        const double t = std::min(tau, max_x / 64);
        const double bases[] = {0.0, 1.0, -1e4, 1e6};
        for (double base : bases)
          for (std::size_t j = 0; j < cols; ++j) x.push_back(base + t * std::clamp(3 * nd(rng), -8.0, 8.0));
        for (double s : {1.0, 1e3})
          for (std::size_t j = 0; j < cols; ++j) x.push_back(s * nd(rng));
        for (std::size_t j = 0; j < x.size(); ++j)
          if (j % cols % 5 == 0) x[j] = -std::numeric_limits<double>::infinity();
        return x;
      };
      const std::size_t rows = 6;
      std::vector<std::int64_t> y(rows);
      std::vector<double> glp(rows), gent(rows);
      for (std::size_t r = 0; r < rows; ++r) {
        y[r] = static_cast<std::int64_t>(1 + 5 * (rng() % ((cols - 2) / 5)));  // never a masked column
        glp[r] = nd(rng);
        gent[r] = nd(rng);
      }
      const auto xd = make(1e300), xf = make(1e37);
      const temperature_check::result res[6] = {
          temperature_check::run<double, double, double>(xd, rows, cols, y, glp, gent, tau),
          temperature_check::run<float, double, float>(xf, rows, cols, y, glp, gent, tau),
          temperature_check::run<float, float, float>(xf, rows, cols, y, glp, gent, tau),
          temperature_check::run<bf16, double, float>(xf, rows, cols, y, glp, gent, tau),
          temperature_check::run<bf16, float, bf16>(xf, rows, cols, y, glp, gent, tau),
          temperature_check::run<float, double, float>(xf, rows, cols, y, glp, gent, tau, true)};
      const double grad_tol[6] = {1e-9, 1e-5, 3e-4, 1e-5, 1e-2, 1e-5};
      const double stat_tol[6] = {1e-12, 1e-6, 1e-6, 1e-6, 1e-6, 1e-6};
      for (int k = 0; k < 6; ++k) {
        INFO("tau " << tau << " cols " << cols << " case " << k << " row " << res[k].worst_row << " refused "
                    << res[k].refused << " " << res[k].what);
        if (res[k].refused) {
          ++refused;
          CHECK(res[k].what.find("'logits'") != std::string::npos);
          continue;
        }
        ++checked;
        CHECK(res[k].grad_err <= grad_tol[k]);
        CHECK(res[k].stat_err <= stat_tol[k]);
        worst[k] = std::max(worst[k], res[k].grad_err);
      }
    }
  std::printf(
      "  temperature sweep: %d batches checked, %d refused; worst gradient error f64 %.3g, f32 %.3g, "
      "f32/f32 stats %.3g, bf16 %.3g, bf16->bf16 %.3g, f32 fast %.3g\n",
      checked, refused, worst[0], worst[1], worst[2], worst[3], worst[4], worst[5]);
}

TEST_CASE("logits_forward / logits_backward refuse logits beyond half their type's range at any temperature") {
  // Float logits {3e38, -3e38} at T = 1e38: the scaled row {3, -3} is tame, but x - max x = -6e38
  // overflows float, so the forward dropped p_1 = e^-6 / (1 + e^-6) (lse 3.0 instead of 3.0025).
  const std::vector<double> x{3e38, -3e38};
  for (double tau : {1e38, 1e300}) {
    INFO("tau " << tau);
    const auto f = temp_run<float, double, float>(x, 2, 1, 1.0, 0.5, tau);
    CHECK(f.refused);
    CHECK(f.what.find("'logits'") != std::string::npos);
    CHECK(f.what.find("row 0") != std::string::npos);
    CHECK(temp_run<bf16, float, float>(x, 2, 1, 1.0, 0.5, tau).refused);
    // Double logits hold the difference: accepted and exact.
    const auto d = temp_run<double, double, double>(x, 2, 1, 1.0, 0.5, tau);
    REQUIRE(!d.refused);
    CHECK(d.grad_err < 1e-9);
    CHECK(d.stat_err < 1e-12);
  }
  std::vector<float> g(2, 42.0f);
  const std::vector<float> xf{3e38f, -3e38f};
  const std::vector<double> lse{3.0}, h{0.0}, glp{1.0}, gent{0.0};
  const std::vector<std::int64_t> y{1};
  CHECK_THROWS_WITH(logits_backward(matrix_view<const float>(xf.data(), 1, 2), std::span<const std::int64_t>(y),
                                    vector_view<const double>(lse.data(), 1), vector_view<const double>(h.data(), 1),
                                    vector_view<const double>(glp.data(), 1), vector_view<const double>(gent.data(), 1),
                                    matrix_view<float>(g.data(), 1, 2), {.temperature = 1e38}),
                    Catch::Matchers::Contains("'logits'") && Catch::Matchers::Contains("half the range of float"));
  CHECK(g == std::vector<float>(2, 42.0f));
}
