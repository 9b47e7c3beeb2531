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
    e = std::max({e, unit_err(s.lp[r], o.logprob), unit_err(s.h[r], o.entropy), unit_err(s.lse[r], o.lse)});
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
  // Uniform row: entropy log V, logprob -log V.
  std::vector<float> uni(777, 0.5f);
  const auto un = run(uni, 1, 777, {0}, {.temperature = 2.0});
  CHECK(std::fabs(un.h[0] - std::log(777.0)) < 1e-7);
  CHECK(std::fabs(un.lp[0] + std::log(777.0)) < 1e-7);
}

TEST_CASE("logits_forward non-finite logits: propagation per row, or rejection with check_logits") {
  const float fi = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t v : {5u, 3000u}) {
    std::vector<float> x(4 * v, 0.25f);
    x[0 * v + 2] = nan;               // row 0: NaN
    x[1 * v + v - 1] = fi;            // row 1: +inf
    for (std::size_t c = 0; c < v; ++c) x[2 * v + c] = -fi;  // row 2: all masked
    const std::vector<std::int64_t> y{0, 0, 0, 1};
    const auto s = run(x, 4, v, y);
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
    CHECK(std::isnan(run(z, 1, 2500, {5}).lp[0]));
    std::vector<double> lp(4, 9.0), h(4, 9.0), lse(4, 9.0);
    try {
      logits_forward(matrix_view<const float>(x.data(), 4, v), std::span<const std::int64_t>(y),
                     vector_view<double>(lp.data(), 4), vector_view<double>(h.data(), 4),
                     vector_view<double>(lse.data(), 4), {.check_logits = true});
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
                                     vector_view<double>(lse.data(), 4), {.check_logits = true}),
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
