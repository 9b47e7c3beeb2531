// Tests of ulorl/logits/forward.hpp against the long-double textbook oracle (tests/support).
// Error metric for statistics in nats: |got - exact| / max(|exact|, 1) (relative above 1 nat,
// absolute below: a float32 log-prob of -1e-9 carries ~1e-8 absolute error in any float algorithm).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <ulorl/logits/forward.hpp>
#include <ulorl/logits/fused_loss.hpp>
#include <ulorl/logits/linear_head.hpp>

#include "catch.hpp"
#include "support/logits_oracle.hpp"

using namespace ulorl;

namespace {

constexpr std::uint64_t seed = 20261129;
const double inf = std::numeric_limits<double>::infinity();

double unit_err(double got, long double exact) {
  if (std::isinf(static_cast<double>(exact)) && got == static_cast<double>(exact)) return 0.0;
  return static_cast<double>(std::fabs(got - exact) / std::max(std::fabs(exact), 1.0L));
}

struct stats {
  std::vector<double> lp, h, lse;
};

template <class L, class S = double>
stats run(const std::vector<L>& x, std::size_t rows, std::size_t cols, const std::vector<std::int64_t>& y,
          logits_config cfg = {}) {
  std::vector<S> lp(rows), h(rows), lse(rows);
  logits_forward(matrix_view<const L>(x.data(), rows, cols), std::span<const std::int64_t>(y),
                 vector_view<S>(lp.data(), rows), vector_view<S>(h.data(), rows), vector_view<S>(lse.data(), rows), cfg);
  return {std::vector<double>(lp.begin(), lp.end()), std::vector<double>(h.begin(), h.end()),
          std::vector<double>(lse.begin(), lse.end())};
}

// Max unit error of the three statistics against the oracle on the given (exact) row values.
double max_err(const stats& s, const std::vector<std::vector<double>>& rows, const std::vector<std::int64_t>& y,
               double tau) {
  double e = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const auto o = oracle::logits_row(rows[r], static_cast<std::size_t>(y[r]), tau);
    e = std::max({e, unit_err(s.lp[r], o.log_prob), unit_err(s.h[r], o.entropy), unit_err(s.lse[r], o.lse)});
  }
  return e;
}

}  // namespace

TEST_CASE("logits_forward float32 matches the float64 oracle (random, -inf, extreme scales and shifts)") {
  std::printf("test_logits_forward seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  double worst = 0;
  for (std::size_t v : {1u, 3u, 47u, 1023u, 1024u, 1025u, 4099u})
    for (double scale : {1.0, 10.0, 1e3})
      for (double shift : {0.0, -30.0, 1e4})
        for (double tau : {1.0, 0.6, 1.7}) {
          const auto b = logits_data::make(rng, 5, v, scale, shift, v == 1 ? 0.0 : 0.15);
          const double e = max_err(run(b.x, b.rows, b.cols, b.labels, {.temperature = tau}), b.all_rows(), b.labels, tau);
          INFO("V=" << v << " scale=" << scale << " shift=" << shift << " tau=" << tau << " err=" << e);
          CHECK(e < 1e-6);
          worst = std::max(worst, e);
        }
  std::printf("  float32 forward: worst unit error %.3g (bound 1e-6)\n", worst);
}

TEST_CASE("logits_forward on a Qwen-sized row (V = 151936)") {
  std::mt19937_64 rng(seed + 1);
  for (double scale : {1.0, 5.0}) {
    const auto b = logits_data::make(rng, 2, 151936, scale, 3.0, 0.05);
    const double e = max_err(run(b.x, b.rows, b.cols, b.labels), b.all_rows(), b.labels, 1.0);
    INFO("scale " << scale << " err " << e);
    CHECK(e < 1e-6);
  }
}

TEST_CASE("logits_forward double storage is float64-accurate") {
  std::mt19937_64 rng(seed + 2);
  for (std::size_t v : {1u, 3u, 47u, 1023u, 5000u})
    for (double tau : {1.0, 0.6}) {
      const auto b = logits_data::make(rng, 4, v, 8.0, 100.0, v == 1 ? 0.0 : 0.1);
      std::vector<double> xd(b.x.begin(), b.x.end());
      for (auto& x : xd)
        if (std::isfinite(x)) x += 1e-3 * static_cast<double>(rng() % 1000) / 1000.0;  // not float-representable
      std::vector<std::vector<double>> rows;
      for (std::size_t r = 0; r < b.rows; ++r) rows.emplace_back(xd.begin() + static_cast<std::ptrdiff_t>(r * v), xd.begin() + static_cast<std::ptrdiff_t>((r + 1) * v));
      const double e = max_err(run(xd, b.rows, v, b.labels, {.temperature = tau}), rows, b.labels, tau);
      INFO("V=" << v << " err=" << e);
      CHECK(e < 1e-12);
    }
}

TEST_CASE("logits_forward bf16 storage") {
  std::mt19937_64 rng(seed + 3);
  for (std::size_t v : {3u, 47u, 1023u, 3000u}) {
    // Unit-scale logits: bf16 rounds a logit x by up to |x| 2^-9, so the bound below needs |x| ~ 1.
    const auto b = logits_data::make(rng, 4, v, 1.0, 0.0, 0.1);
    std::vector<bf16> xb(b.x.size());
    std::vector<std::vector<double>> exact_rows(b.rows), float_rows = b.all_rows();
    for (std::size_t i = 0; i < b.x.size(); ++i) {
      xb[i] = bf16::from_float(b.x[i]);
      exact_rows[i / v].push_back(static_cast<double>(xb[i].to_float()));
    }
    const auto s = run(xb, b.rows, v, b.labels);
    CHECK(max_err(s, exact_rows, b.labels, 1.0) < 1e-6);   // exact on the values bf16 holds
    CHECK(max_err(s, float_rows, b.labels, 1.0) < 1e-2);   // the bound: vs the unrounded logits
    const auto sf = run<bf16, float>(xb, b.rows, v, b.labels);  // float statistics
    CHECK(max_err(sf, exact_rows, b.labels, 1.0) < 1e-6);
  }
}

TEST_CASE("logits_forward: strided views give the same bits as contiguous ones") {
  std::mt19937_64 rng(seed + 4);
  const std::size_t rows = 3, cols = 2100;
  const auto b = logits_data::make(rng, rows, cols, 2.0, 0.0, 0.1);
  const auto ref = run(b.x, rows, cols, b.labels);
  // Column stride 3, padded row stride; and a column-major (transposed) layout.
  std::vector<float> wide(rows * (cols * 3 + 5), 7.0f);
  std::vector<float> colmaj(rows * cols);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) {
      wide[r * (cols * 3 + 5) + 3 * c] = b.x[r * cols + c];
      colmaj[c * rows + r] = b.x[r * cols + c];
    }
  for (const auto& view : {matrix_view<const float>(wide.data(), rows, cols, static_cast<std::ptrdiff_t>(cols * 3 + 5), 3),
                           matrix_view<const float>(colmaj.data(), rows, cols, 1, static_cast<std::ptrdiff_t>(rows))}) {
    std::vector<double> lp(rows), h(rows), lse(rows);
    logits_forward(view, std::span<const std::int64_t>(b.labels), vector_view<double>(lp.data(), rows),
                   vector_view<double>(h.data(), rows), vector_view<double>(lse.data(), rows));
    CHECK(lp == ref.lp);
    CHECK(h == ref.h);
    CHECK(lse == ref.lse);
  }
  // Strided outputs and empty optional outputs.
  std::vector<float> out(rows * 2, -1.0f);
  logits_forward(matrix_view<const float>(b.x.data(), rows, cols), std::span<const std::int64_t>(b.labels),
                 vector_view<float>(out.data(), rows, 2), vector_view<float>(), vector_view<float>());
  for (std::size_t r = 0; r < rows; ++r) {
    CHECK(out[2 * r] == static_cast<float>(ref.lp[r]));
    CHECK(out[2 * r + 1] == -1.0f);
  }
}

TEST_CASE("logits_forward properties: shift invariance, masked entries, temperature") {
  std::mt19937_64 rng(seed + 5);
  const std::size_t v = 3001;
  auto b = logits_data::make(rng, 4, v, 2.0, 0.0, 0.0);
  for (auto& x : b.x) x = std::round(x * 64.0f) / 64.0f;  // shifting by 1024 stays exact in float
  auto shifted = b.x;
  for (auto& x : shifted) x += 1024.0f;
  const auto a = run(b.x, b.rows, v, b.labels, {.temperature = 0.75});
  const auto s = run(shifted, b.rows, v, b.labels, {.temperature = 0.75});
  for (std::size_t r = 0; r < b.rows; ++r) {
    CHECK(std::fabs(a.lp[r] - s.lp[r]) <= 1e-6 * std::max(1.0, std::fabs(a.lp[r])));
    CHECK(std::fabs(a.h[r] - s.h[r]) <= 1e-6 * std::max(1.0, a.h[r]));
    CHECK(std::fabs((s.lse[r] - a.lse[r]) - 1024.0 / 0.75) <= 1e-9 * s.lse[r]);
  }
  // Masking entries with -inf equals deleting them from the row.
  auto masked = b.x;
  std::vector<float> kept;
  std::vector<std::int64_t> kept_label;
  for (std::size_t c = 0; c < v; ++c) {
    if (c % 3 == 1 && static_cast<std::int64_t>(c) != b.labels[0]) {
      masked[c] = -std::numeric_limits<float>::infinity();
    } else {
      if (static_cast<std::int64_t>(c) == b.labels[0]) kept_label.push_back(static_cast<std::int64_t>(kept.size()));
      kept.push_back(b.x[c]);
    }
  }
  const auto m = run(masked, 1, v, {b.labels[0]});
  const auto k = run(kept, 1, kept.size(), kept_label);
  CHECK(std::fabs(m.lp[0] - k.lp[0]) <= 1e-7);
  CHECK(std::fabs(m.h[0] - k.h[0]) <= 1e-7);
  CHECK(std::fabs(m.lse[0] - k.lse[0]) <= 1e-7);
  // A single unmasked entry: certain outcome.
  std::vector<float> one(10, -std::numeric_limits<float>::infinity());
  one[4] = 3.0f;
  const auto o = run(one, 1, 10, {4});
  CHECK(o.lp[0] == 0.0);
  CHECK(o.h[0] == 0.0);
  CHECK(o.lse[0] == 3.0);
  // Uniform row: entropy log V, log_prob -log V.
  std::vector<float> uni(777, 0.5f);
  const auto un = run(uni, 1, 777, {0}, {.temperature = 2.0});
  CHECK(std::fabs(un.h[0] - std::log(777.0)) < 1e-7);
  CHECK(std::fabs(un.lp[0] + std::log(777.0)) < 1e-7);
}

TEST_CASE("logits_forward non-finite logits: rejection by the value scan (default), or propagation per row without it") {
  const float fi = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t v : {5u, 3000u}) {
    std::vector<float> x(4 * v, 0.25f);
    x[0 * v + 2] = nan;               // row 0: NaN
    x[1 * v + v - 1] = fi;            // row 1: +inf
    for (std::size_t c = 0; c < v; ++c) x[2 * v + c] = -fi;  // row 2: all masked
    const std::vector<std::int64_t> y{0, 0, 0, 1};
    const auto s = run(x, 4, v, y, {.check_values = false});
    for (int r : {0, 1}) {
      CHECK(std::isnan(s.lp[r]));
      CHECK(std::isnan(s.h[r]));
      CHECK(std::isnan(s.lse[r]));
    }
    CHECK(s.lse[2] == -inf);
    CHECK(std::isnan(s.lp[2]));
    CHECK(std::isnan(s.h[2]));
    CHECK(std::fabs(s.lp[3] + std::log(static_cast<double>(v))) < 1e-7);  // other rows unaffected
    // NaN alone in a chunk of masked entries still poisons the row.
    std::vector<float> z(2500, -fi);
    z[2100] = nan;
    z[5] = 1.0f;
    CHECK(std::isnan(run(z, 1, 2500, {5}, {.check_values = false}).lp[0]));
    std::vector<double> lp(4, 9.0), h(4, 9.0), lse(4, 9.0);
    try {
      logits_forward(matrix_view<const float>(x.data(), 4, v), std::span<const std::int64_t>(y),
                     vector_view<double>(lp.data(), 4), vector_view<double>(h.data(), 4),
                     vector_view<double>(lse.data(), 4));
      FAIL("no error");
    } catch (const ulorl::error& e) {
      CHECK(e.argument() == "logits");
      CHECK(e.index() == 2);
      CHECK(std::string(e.what()).find("row 0, column 2") != std::string::npos);
    }
    CHECK(lp == std::vector<double>(4, 9.0));  // nothing written
    x[0 * v + 2] = 0.0f;
    x[1 * v + v - 1] = 0.0f;
    CHECK_THROWS_WITH(logits_forward(matrix_view<const float>(x.data(), 4, v), std::span<const std::int64_t>(y),
                                     vector_view<double>(lp.data(), 4), vector_view<double>(h.data(), 4),
                                     vector_view<double>(lse.data(), 4), {.check_values = true}),
                      Catch::Matchers::Contains("row 2 has no finite logit"));
  }
}

TEST_CASE("logits_forward rejects bad input before writing") {
  std::vector<float> x(12, 1.0f);
  std::vector<double> lp(3, 5.0), h(3, 5.0), lse(3, 5.0);
  const auto call = [&](matrix_view<const float> m, std::vector<std::int64_t> y, logits_config cfg = {},
                        std::size_t nout = 3) {
    logits_forward(m, std::span<const std::int64_t>(y), vector_view<double>(lp.data(), nout),
                   vector_view<double>(h.data(), nout), vector_view<double>(lse.data(), nout), cfg);
  };
  const matrix_view<const float> m(x.data(), 3, 4);
  try {
    call(m, {0, 4, 1});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "logits_forward");
    CHECK(e.argument() == "labels");
    CHECK(e.index() == 1);
    CHECK(std::string(e.what()).find("row 1") != std::string::npos);
  }
  CHECK_THROWS_AS(call(m, {0, -1, 1}), ulorl::error);
  CHECK_THROWS_AS(call(m, {0, 1}), ulorl::error);                                   // labels size
  CHECK_THROWS_AS(call(m, {0, 1, 2}, {}, 2), ulorl::error);                         // output size
  CHECK_THROWS_AS(call(m, {0, 1, 2}, {.temperature = 0.0}), ulorl::error);
  CHECK_THROWS_AS(call(m, {0, 1, 2}, {.temperature = -1.0}), ulorl::error);
  CHECK_THROWS_AS(call(m, {0, 1, 2}, {.temperature = std::nan("")}), ulorl::error);
  CHECK_THROWS_WITH(call(matrix_view<const float>(x.data(), 3, 0), {0, 0, 0}), Catch::Matchers::Contains("V = 0"));
  CHECK_THROWS_WITH(call(matrix_view<const float>(nullptr, 3, 4), {0, 0, 0}), Catch::Matchers::Contains("null"));
  alignas(4) unsigned char raw[64] = {};
  const auto* misaligned = reinterpret_cast<const float*>(raw + 1);
  CHECK_THROWS_WITH(call(matrix_view<const float>(misaligned, 3, 4), {0, 0, 0}), Catch::Matchers::Contains("aligned"));
  CHECK(lp == std::vector<double>(3, 5.0));
  // Zero rows is valid and writes nothing.
  call(matrix_view<const float>(x.data(), 0, 4), {}, {}, 0);
}

TEST_CASE("logits_forward with executors gives the same bits") {
  std::mt19937_64 rng(seed + 6);
  const auto b = logits_data::make(rng, 37, 2048, 4.0, 0.0, 0.05);
  const auto ref = run(b.x, b.rows, b.cols, b.labels);
  for (unsigned threads : {1u, 2u, 5u, 64u}) {
    std::vector<double> lp(b.rows), h(b.rows), lse(b.rows);
    logits_forward(matrix_view<const float>(b.x.data(), b.rows, b.cols), std::span<const std::int64_t>(b.labels),
                   vector_view<double>(lp.data(), b.rows), vector_view<double>(h.data(), b.rows),
                   vector_view<double>(lse.data(), b.rows), {}, thread_executor{threads});
    CHECK(lp == ref.lp);
    CHECK(h == ref.h);
  }
  // A host pool plugs in as a lambda (here: reversed blocks of 4 rows).
  std::vector<double> lp(b.rows), h(b.rows), lse(b.rows);
  std::size_t calls = 0;
  auto pool = [&](std::size_t n, auto&& body) {
    for (std::size_t hi = n; hi > 0; hi = hi >= 4 ? hi - 4 : 0, ++calls) body(hi >= 4 ? hi - 4 : 0, hi);
  };
  logits_forward(matrix_view<const float>(b.x.data(), b.rows, b.cols), std::span<const std::int64_t>(b.labels),
                 vector_view<double>(lp.data(), b.rows), vector_view<double>(h.data(), b.rows),
                 vector_view<double>(lse.data(), b.rows), {}, pool);
  CHECK(calls == 10);
  CHECK(lp == ref.lp);
  CHECK(lse == ref.lse);
}

TEST_CASE("logits_forward: a temperature whose reciprocal overflows is rejected, tiny valid ones are exact") {
  std::vector<double> xd{1.0, 0.0, -3.0, 2.0};
  std::vector<float> xf(xd.begin(), xd.end());
  const std::vector<std::int64_t> y{0, 1};
  std::vector<double> lp(2, 5.0), h(2, 5.0), lse(2, 5.0);
  const auto call = [&](auto x, double tau, bool check = false) {
    logits_forward(x, std::span<const std::int64_t>(y), vector_view<double>(lp.data(), 2),
                   vector_view<double>(h.data(), 2), vector_view<double>(lse.data(), 2),
                   {.temperature = tau, .check_values = check});
  };
  const matrix_view<const double> md(xd.data(), 2, 2);
  const matrix_view<const float> mf(xf.data(), 2, 2);
  // 1e-320 is subnormal: 1 / 1e-320 = inf in double, so every scaled logit would be +-inf or NaN.
  for (bool check : {false, true}) {
    try {
      call(md, 1e-320, check);
      FAIL("no error");
    } catch (const ulorl::error& e) {
      CHECK(e.function() == "logits_forward");
      CHECK(e.argument() == "temperature");
      CHECK(std::string(e.what()).find("'temperature' = 9.99988") != std::string::npos);
      CHECK(std::string(e.what()).find("reciprocal") != std::string::npos);
    }
  }
  // Float (and bf16) logits are scaled in float: 1 / 1e-300 overflows float, 1 / 1e-30 does not.
  CHECK_THROWS_WITH(call(mf, 1e-300), Catch::Matchers::Contains("'temperature'") && Catch::Matchers::Contains("float"));
  CHECK_THROWS_WITH(call(mf, 1e-39), Catch::Matchers::Contains("'temperature'"));
  CHECK(lp == std::vector<double>(2, 5.0));
  // A tiny but valid temperature on logits of its own scale: z = x / tau = {1, 0}, {-3, 2}.
  std::vector<double> tiny{1e-300, 0.0, -3e-300, 2e-300};
  call(matrix_view<const double>(tiny.data(), 2, 2), 1e-300, true);
  // By hand: lse_0 = log(e + 1), lp_0 = 1 - lse_0; lse_1 = log(e^-3 + e^2), lp_1 = 2 - lse_1.
  const double l0 = std::log(std::exp(1.0) + 1.0), l1 = std::log(std::exp(-3.0) + std::exp(2.0));
  CHECK(lse[0] == Approx(l0).epsilon(1e-14));
  CHECK(lp[0] == Approx(1.0 - l0).epsilon(1e-14));
  CHECK(lse[1] == Approx(l1).epsilon(1e-14));
  CHECK(lp[1] == Approx(2.0 - l1).epsilon(1e-14).margin(1e-15));  // 2 - l1 cancels: absolute
  std::vector<float> tinyf{1e-30f, 0.0f, -3e-30f, 2e-30f};
  call(matrix_view<const float>(tinyf.data(), 2, 2), 1e-30, true);
  CHECK(lse[0] == Approx(l0).epsilon(1e-6));
  CHECK(lp[1] == Approx(2.0 - l1).epsilon(1e-6));
}

TEST_CASE("logits_forward's value scan: a row whose scaled logits overflow is an error, never inf") {
  // 1e10 / 1e-300 = 1e310 overflows double: without the check lse would be +inf and the log-prob 0.
  std::vector<double> x{1e10, 0.0, 1.0, 2.0};
  const std::vector<std::int64_t> y{0, 1};
  std::vector<double> lp(2, 5.0), h(2, 5.0), lse(2, 5.0);
  const auto call = [&](const std::vector<double>& v, double tau) {
    logits_forward(matrix_view<const double>(v.data(), 2, 2), std::span<const std::int64_t>(y),
                   vector_view<double>(lp.data(), 2), vector_view<double>(h.data(), 2),
                   vector_view<double>(lse.data(), 2), {.temperature = tau, .check_values = true});
  };
  try {
    call(x, 1e-300);
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.argument() == "logits");
    CHECK(e.index() == 0);
    CHECK(std::string(e.what()).find("row 0") != std::string::npos);
    CHECK(std::string(e.what()).find("temperature") != std::string::npos);
  }
  CHECK(lp == std::vector<double>(2, 5.0));
  // A very negative row maximum overflows too (lse = -inf).
  std::vector<double> neg{1.0, 2.0, -1e10, -2e10};
  CHECK_THROWS_WITH(call(neg, 1e-300), Catch::Matchers::Contains("row 1"));
  // -inf entries (masked vocabulary) do not count: the finite ones decide.
  std::vector<double> masked{1e-300, -inf, 0.0, 1.0};
  call(masked, 1e-300);
  CHECK(lp[0] == 0.0);
  CHECK(lse[0] == Approx(1.0).epsilon(1e-15));
  // Float statistics of double logits: 1e30 / 1e-10 = 1e40 overflows the float outputs.
  std::vector<double> big{1e30, 0.0, 1.0, 2.0};
  std::vector<float> lpf(2, 5.0f);
  CHECK_THROWS_WITH(logits_forward(matrix_view<const double>(big.data(), 2, 2), std::span<const std::int64_t>(y),
                                   vector_view<float>(lpf.data(), 2), vector_view<float>(), vector_view<float>(),
                                   {.temperature = 1e-10, .check_values = true}),
                    Catch::Matchers::Contains("row 0"));
  CHECK(lpf == std::vector<float>(2, 5.0f));
}

TEST_CASE("logits_forward: outputs whose strides make distinct rows alias are rejected") {
  std::vector<float> x(12, 1.0f);
  const std::vector<std::int64_t> y{0, 1, 2};
  std::vector<double> lp(3, 5.0), h(3, 5.0), lse(3, 5.0);
  const matrix_view<const float> m(x.data(), 3, 4);
  const auto call = [&](vector_view<double> a, vector_view<double> b, vector_view<double> c) {
    logits_forward(m, std::span<const std::int64_t>(y), a, b, c);
  };
  const vector_view<double> vlp(lp.data(), 3), vh(h.data(), 3), vlse(lse.data(), 3);
  try {
    call(vector_view<double>(lp.data(), 3, 0), vh, vlse);
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.argument() == "log_prob");
    CHECK(std::string(e.what()).find("stride 0") != std::string::npos);
  }
  CHECK_THROWS_WITH(call(vlp, vector_view<double>(h.data(), 3, 0), vlse), Catch::Matchers::Contains("'entropy'"));
  CHECK_THROWS_WITH(call(vlp, vh, vector_view<double>(lse.data(), 3, 0)), Catch::Matchers::Contains("'lse'"));
  // Two outputs on the same elements.
  CHECK_THROWS_WITH(call(vlp, vlp, vlse), Catch::Matchers::Contains("'entropy'") && Catch::Matchers::Contains("'log_prob'"));
  CHECK_THROWS_WITH(call(vlp, vh, vector_view<double>(lp.data() + 1, 3)), Catch::Matchers::Contains("'lse'"));
  CHECK(lp == std::vector<double>(3, 5.0));
  CHECK(h == std::vector<double>(3, 5.0));
  // Interleaved outputs share no element and are fine; so is a stride of 0 for one row.
  std::vector<double> inter(6, 5.0);
  call(vector_view<double>(inter.data(), 3, 2), vector_view<double>(inter.data() + 1, 3, 2), vector_view<double>());
  CHECK(inter[0] == Approx(-std::log(4.0)));
  CHECK(inter[1] == Approx(std::log(4.0)));
  std::vector<double> one(1);
  logits_forward(matrix_view<const float>(x.data(), 1, 4), std::span<const std::int64_t>(y.data(), 1),
                 vector_view<double>(one.data(), 1, 0), vector_view<double>(), vector_view<double>());
  CHECK(one[0] == Approx(-std::log(4.0)));
}

TEST_CASE("every entry point that takes a temperature applies the same rule") {
  // Fused loss from logits: 1 row, V = 2, padded [1, 1].
  std::vector<double> x{0.5, -0.5}, old{-0.7}, adv{1.0}, mask{1.0}, lp(1), ent(1), glp(1), gent(1), lse(1), g(2, 42.0);
  const std::vector<std::int64_t> y{0};
  const auto tv = [](std::vector<double>& v) { return token_view<double>::padded(matrix_view<double>(v.data(), 1, 1)); };
  const auto cv = [](const std::vector<double>& v) {
    return token_view<const double>::padded(matrix_view<const double>(v.data(), 1, 1));
  };
  const policy_loss_inputs<double> in{.log_prob = {}, .old_log_prob = cv(old), .advantages = cv(adv), .mask = cv(mask)};
  policy_loss_config cfg;
  cfg.normalizer = {.mode = agg_mode::token_mean, .denominator = 1.0};
  const logits_loss_buffers<double> buf{tv(lp), tv(ent), tv(glp), tv(gent), vector_view<double>(lse.data(), 1)};
  try {
    (void)policy_loss_from_logits(matrix_view<const double>(x.data(), 1, 2), std::span<const std::int64_t>(y), in, buf,
                                  matrix_view<double>(g.data(), 1, 2), cfg, {.temperature = 1e-320});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "policy_loss_from_logits");
    CHECK(e.argument() == "temperature");
  }
  CHECK(g == std::vector<double>(2, 42.0));

  // Linear head: float operands are scaled in float (1 / 1e-300 overflows), double ones in double.
  std::vector<float> hf{1.0f}, wf{1.0f, -1.0f};
  std::vector<double> hd{1e5}, wd{1e5, -1e5}, out(1, 5.0);
  const linear_head_inputs<float> headf{matrix_view<const float>(hf.data(), 1, 1), matrix_view<const float>(wf.data(), 2, 1)};
  const linear_head_inputs<double> headd{matrix_view<const double>(hd.data(), 1, 1),
                                         matrix_view<const double>(wd.data(), 2, 1)};
  CHECK_THROWS_WITH(linear_head_forward(headf, std::span<const std::int64_t>(y), vector_view<double>(out.data(), 1),
                                        vector_view<double>(), vector_view<double>(), {.temperature = 1e-300}),
                    Catch::Matchers::Contains("linear_head_forward") && Catch::Matchers::Contains("'temperature'"));
  CHECK_THROWS_WITH(linear_head_forward(headd, std::span<const std::int64_t>(y), vector_view<double>(out.data(), 1),
                                        vector_view<double>(), vector_view<double>(), {.temperature = 1e-320}),
                    Catch::Matchers::Contains("'temperature'"));
  // With value checks: logits up to H max|h| max|w| = 1e10, over tau = 1e-300 they overflow.
  CHECK_THROWS_WITH(linear_head_forward(headd, std::span<const std::int64_t>(y), vector_view<double>(out.data(), 1),
                                        vector_view<double>(), vector_view<double>(),
                                        {.temperature = 1e-300, .check_values = true}),
                    Catch::Matchers::Contains("temperature"));
  CHECK(out[0] == 5.0);
  // A tiny temperature the logits allow: z = 1e10 * {1, -1} / 1e-290 is finite.
  linear_head_forward(headd, std::span<const std::int64_t>(y), vector_view<double>(out.data(), 1),
                      vector_view<double>(), vector_view<double>(), {.temperature = 1e-290, .check_values = true});
  CHECK(out[0] == 0.0);
}

static double widen_for_test(float x) { return x; }
static double widen_for_test(double x) { return x; }
static double widen_for_test(bf16 x) { return x.to_float(); }

TEST_CASE("logits_forward sum_pi_squared matches the oracle's sum of squared probabilities, same pass") {
  std::mt19937_64 rng(seed + 31);
  double worst = 0;
  for (std::size_t v : {1u, 3u, 47u, 1023u, 1025u, 5000u})
    for (double scale : {0.5, 4.0, 40.0})
      for (double tau : {1.0, 0.6}) {
        auto b = logits_data::make(rng, 5, v, scale, 3.0, v > 3 ? 0.1 : 0.0);
        // Ascending maxima across chunks exercise the rescaling of the squared sum.
        if (v > 2048) b.x[4 * v + 4000] = static_cast<float>(scale * 6);
        std::vector<float> xf(b.x.begin(), b.x.end());
        std::vector<double> xd(b.x.begin(), b.x.end());
        std::vector<bf16> xb;
        for (double x : b.x) xb.push_back(bf16::from_float(static_cast<float>(x)));
        const auto check = [&](const auto& x, double tol) {
          using L = typename std::decay_t<decltype(x)>::value_type;
          std::vector<double> lp(5), lp2(5), q(5, -1.0);
          logits_forward(matrix_view<const L>(x.data(), 5, v), std::span<const std::int64_t>(b.labels),
                         logits_outputs<double>{.log_prob = vector_view<double>(lp.data(), 5),
                                                .sum_pi_squared = vector_view<double>(q.data(), 5)},
                         {.temperature = tau});
          logits_forward(matrix_view<const L>(x.data(), 5, v), std::span<const std::int64_t>(b.labels),
                         vector_view<double>(lp2.data(), 5), vector_view<double>(), vector_view<double>(),
                         {.temperature = tau});
          CHECK(lp == lp2);  // the squared sum changes nothing else
          for (std::size_t r = 0; r < 5; ++r) {
            std::vector<double> row(v);
            for (std::size_t c = 0; c < v; ++c) row[c] = static_cast<double>(widen_for_test(x[r * v + c]));
            const long double want = oracle::sum_pi_squared(row, tau);
            const double e = static_cast<double>(std::fabs(q[r] - want) / want);
            worst = std::max(worst, e);
            INFO("V " << v << " scale " << scale << " tau " << tau << " row " << r << " got " << q[r] << " want "
                      << static_cast<double>(want));
            CHECK(e < tol);
            CHECK(q[r] > 0.0);
            CHECK(q[r] <= 1.0 + 1e-6);
          }
        };
        check(xf, 2e-5);
        check(xd, 1e-12);
        check(xb, 2e-5);
      }
  std::printf("  sum_pi_squared: worst relative error %.3g\n", worst);
  // A one-hot row has sum 1; a uniform row 1 / V; NaN rows (value scan off) NaN; outputs checked.
  std::vector<float> x{0.0f, -std::numeric_limits<float>::infinity(), 0.0f, 0.0f,
                       1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f, 3.0f};
  std::vector<double> lp(2), q(2);
  const std::vector<std::int64_t> y{0, 0};
  logits_forward(matrix_view<const float>(x.data(), 2, 4), std::span<const std::int64_t>(y),
                 logits_outputs<double>{.log_prob = vector_view<double>(lp.data(), 2),
                                        .sum_pi_squared = vector_view<double>(q.data(), 2)},
                 {.check_values = false});
  CHECK(std::fabs(q[0] - 1.0 / 3.0) < 1e-7);
  CHECK(std::isnan(q[1]));
  CHECK_THROWS_AS(logits_forward(matrix_view<const float>(x.data(), 1, 4), std::span<const std::int64_t>(y.data(), 1),
                                 logits_outputs<double>{.log_prob = vector_view<double>(lp.data(), 1),
                                                        .sum_pi_squared = vector_view<double>(lp.data(), 1)}),
                  ulorl::error);  // aliases log_prob
}

// The value scan's vectorised pass over unit-stride rows, in every storage type: a NaN / +inf at
// any position class of a wide row (first, vector lanes, pair boundaries, tail) is named by row and
// column, -inf entries (masked vocabulary) with finite others pass, and a row whose largest
// magnitude sits in a vector lane and overflows the scaled range is rejected with its column.
template <class L>
void check_scan_positions(L (*make)(double)) {
  const std::size_t v = 301;
  const auto scan = [&](const std::vector<L>& x, std::size_t rows, double tau) {
    std::vector<std::int64_t> y(rows, 0);
    std::vector<float> lp(rows, 9.0f);
    logits_forward(matrix_view<const L>(x.data(), rows, v), std::span<const std::int64_t>(y),
                   vector_view<float>(lp.data(), rows), vector_view<float>(), vector_view<float>(),
                   {.temperature = tau, .check_values = true});
  };
  std::vector<L> base(2 * v, make(0.5));
  for (std::size_t c = 0; c < v; c += 7) base[v + c] = make(-1.0 * static_cast<double>(c));
  REQUIRE_NOTHROW(scan(base, 2, 1.0));
  for (std::size_t c : {std::size_t{0}, std::size_t{7}, std::size_t{8}, std::size_t{31}, std::size_t{32},
                        std::size_t{64}, std::size_t{255}, std::size_t{256}, v - 1})
    for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
      auto x = base;
      x[v + c] = make(bad);
      INFO("column " << c << " value " << bad);
      try {
        scan(x, 2, 1.0);
        FAIL("no error");
      } catch (const ulorl::error& e) {
        CHECK(e.argument() == "logits");
        CHECK(e.index() == static_cast<std::int64_t>(v + c));
        CHECK(std::string(e.what()).find("row 1, column " + std::to_string(c)) != std::string::npos);
      }
      x[v + c] = make(-std::numeric_limits<double>::infinity());  // masked entry: legal
      CHECK_NOTHROW(scan(x, 2, 1.0));
    }
  // Float statistics hold |x| / tau <= FLT_MAX / 2: a logit of 1e30 at tau 1e-9 overflows, at 1 not.
  auto x = base;
  x[v + 100] = make(-1e30);
  CHECK_NOTHROW(scan(x, 2, 1.0));
  try {
    scan(x, 2, 1e-9);
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.index() == static_cast<std::int64_t>(v + 100));
  }
}

TEST_CASE("logits_forward value scan over wide rows: float, double and bf16 storage, every position class") {
  check_scan_positions<float>([](double d) { return static_cast<float>(d); });
  check_scan_positions<double>([](double d) { return d; });
  check_scan_positions<bf16>([](double d) { return bf16::from_float(static_cast<float>(d)); });
}

// The forward's value scan runs inside its read of the logits: rows are computed before every row
// is known to pass, so this checks what that must not change. The first offending row in row order
// is named (whichever rows the executor's threads reach first), nothing is written (log_prob,
// entropy, lse, sum_pi_squared keep their sentinels), strided rows are scanned too, and with the
// scan on, a legal input gives the bits of the scan off (rows with masked -inf entries in a late
// chunk included: they take the element-wise check and pass).
TEST_CASE("logits_forward value scan inside the read: first bad row, nothing written, strides, threads, same bits") {
  const std::size_t n = 6, v = 3000;  // three chunks per row
  for (std::size_t cs : {std::size_t{1}, std::size_t{2}})
    for (unsigned threads : {0u, 1u, 3u}) {
      INFO("col_stride " << cs << " threads " << threads);
      std::mt19937_64 rng(seed + cs + threads);
      std::normal_distribution<float> nd(0.0f, 3.0f);
      std::vector<float> x(n * v * cs, 1e30f);  // between the strided columns: never read
      const auto at = [&](std::size_t r, std::size_t c) -> float& { return x[(r * v + c) * cs]; };
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t c = 0; c < v; ++c) at(r, c) = nd(rng);
      for (std::size_t c = 2100; c < 2900; c += 3) at(1, c) = -std::numeric_limits<float>::infinity();
      const matrix_view<const float> m(x.data(), n, v, static_cast<std::ptrdiff_t>(v * cs), static_cast<std::ptrdiff_t>(cs));
      const std::vector<std::int64_t> y{3, 2999, 1024, 0, 7, 2047};
      const auto call = [&](std::vector<double>& lp, std::vector<double>& h, std::vector<double>& lse,
                            std::vector<double>& q, bool check) {
        const logits_outputs<double> out{.log_prob = vector_view<double>(lp.data(), n),
                                         .entropy = vector_view<double>(h.data(), n),
                                         .lse = vector_view<double>(lse.data(), n),
                                         .sum_pi_squared = vector_view<double>(q.data(), n)};
        if (threads == 0)
          logits_forward(m, std::span<const std::int64_t>(y), out, {.check_values = check});
        else
          logits_forward(m, std::span<const std::int64_t>(y), out, {.check_values = check}, thread_executor{threads});
      };
      std::vector<double> lp0(n), h0(n), l0(n), q0(n), lp1(n), h1(n), l1(n), q1(n);
      call(lp0, h0, l0, q0, false);
      call(lp1, h1, l1, q1, true);
      CHECK(lp0 == lp1);
      CHECK(h0 == h1);
      CHECK(l0 == l1);
      CHECK(q0 == q1);
      CHECK(std::isfinite(lp1[1]));
      // Two offending rows, the second one's value in the first chunk, the first one's in the last.
      at(4, 2500) = std::numeric_limits<float>::quiet_NaN();
      at(5, 10) = std::numeric_limits<float>::infinity();
      std::vector<double> lp(n, 9.0), h(n, 9.0), lse(n, 9.0), q(n, 9.0);
      try {
        call(lp, h, lse, q, true);
        FAIL("no error");
      } catch (const ulorl::error& e) {
        CHECK(e.argument() == "logits");
        CHECK(e.index() == static_cast<std::int64_t>(4 * v + 2500));
        CHECK(std::string(e.what()).find("row 4, column 2500") != std::string::npos);
      }
      const std::vector<double> sentinel(n, 9.0);
      CHECK(lp == sentinel);
      CHECK(h == sentinel);
      CHECK(lse == sentinel);
      CHECK(q == sentinel);
      // Out of the scaled range in a late chunk of the last row only.
      at(4, 2500) = 0.0f;
      at(5, 10) = 0.0f;
      at(5, 2990) = -1e30f;
      try {
        lp.assign(n, 9.0);
        const logits_outputs<double> out{.log_prob = vector_view<double>(lp.data(), n)};
        logits_forward(m, std::span<const std::int64_t>(y), out, {.temperature = 1e-9, .check_values = true});
        FAIL("no error");
      } catch (const ulorl::error& e) {
        CHECK(e.index() == static_cast<std::int64_t>(5 * v + 2990));
      }
      CHECK(lp == sentinel);
    }
}
