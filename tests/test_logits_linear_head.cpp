// Tests of ulorl/logits/linear_head.hpp against the long-double oracle of tests/support
// (linear_head_oracle.hpp), central finite differences in double, and the fused policy loss.
// Metrics: statistics |got - exact| / max(|exact|, 1) (as test_logits_forward); gradients normwise:
// max |got - exact| over the matrix / max of the sum of the magnitudes of each element's terms.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <ulorl/logits/linear_head.hpp>

#include "catch.hpp"
#include "support/linear_head_oracle.hpp"

using namespace ulorl;

namespace {

constexpr std::uint64_t seed = 61616;
const double nan_v = std::numeric_limits<double>::quiet_NaN();

template <class T>
struct problem {
  oracle::head_problem q;  // the exact values (T rounded to double)
  std::vector<T> hidden, weight, bias;

  linear_head_inputs<T> inputs() const {
    return {matrix_view<const T>(hidden.data(), q.n, q.h), matrix_view<const T>(weight.data(), q.v, q.h),
            bias.empty() ? vector_view<const T>() : vector_view<const T>(bias.data(), q.v)};
  }
};

template <class T>
problem<T> make(std::mt19937_64& rng, std::size_t n, std::size_t h, std::size_t v, double tau, bool with_bias,
                double wscale = 1.0) {
  problem<T> p;
  std::normal_distribution<double> nd;
  p.q.n = n;
  p.q.h = h;
  p.q.v = v;
  p.q.tau = tau;
  // Logits of order 1-3: weight ~ N(0, 1/H) times wscale.
  const double ws = wscale / std::sqrt(static_cast<double>(h));
  for (std::size_t i = 0; i < n * h; ++i) p.hidden.push_back(static_cast<T>(nd(rng)));
  for (std::size_t i = 0; i < v * h; ++i) p.weight.push_back(static_cast<T>(nd(rng) * ws * 2));
  if (with_bias)
    for (std::size_t j = 0; j < v; ++j) p.bias.push_back(static_cast<T>(0.5 * nd(rng)));
  for (std::size_t i = 0; i < n; ++i) {
    p.q.labels.push_back(static_cast<std::int64_t>(rng() % v));
    p.q.g_lp.push_back(nd(rng));
    p.q.g_ent.push_back(nd(rng));
  }
  p.q.hidden.assign(p.hidden.begin(), p.hidden.end());
  p.q.weight.assign(p.weight.begin(), p.weight.end());
  p.q.bias.assign(p.bias.begin(), p.bias.end());
  return p;
}

template <class T>
struct outputs {
  std::vector<double> lp, ent, lse;
  std::vector<T> gh, gw, gb;
};

// Forward + backward through the functor API (statistics written too).
template <class T, class Exec = sequential_executor>
outputs<T> run_all(const problem<T>& p, linear_head_config cfg, Exec exec = {}) {
  const auto& q = p.q;
  outputs<T> o;
  o.lp.assign(q.n, nan_v);
  o.ent.assign(q.n, nan_v);
  o.lse.assign(q.n, nan_v);
  o.gh.assign(q.n * q.h, T(0));
  o.gw.assign(q.v * q.h, T(0));
  o.gb.assign(q.v, T(0));
  const linear_head_grads<T> g{matrix_view<T>(o.gh.data(), q.n, q.h), matrix_view<T>(o.gw.data(), q.v, q.h),
                               p.bias.empty() ? vector_view<T>() : vector_view<T>(o.gb.data(), q.v)};
  auto fn = [&](std::size_t r0, std::span<const double> lp, std::span<const double>, std::span<double> glp,
                std::span<double> gent) {
    for (std::size_t i = 0; i < lp.size(); ++i) {
      glp[i] = q.g_lp[r0 + i];
      gent[i] = q.g_ent[r0 + i];
    }
  };
  linear_head_forward_backward(p.inputs(), std::span<const std::int64_t>(q.labels), fn, g,
                               vector_view<double>(o.lp.data(), q.n), vector_view<double>(o.ent.data(), q.n),
                               vector_view<double>(o.lse.data(), q.n), cfg, {}, exec);
  return o;
}

double unit_err(double got, long double exact) {
  return static_cast<double>(std::fabs(got - exact) / std::max(std::fabs(exact), 1.0L));
}

struct errors {
  double stats = 0, gh = 0, gw = 0, gb = 0;
};

template <class T>
errors compare(const problem<T>& p, const outputs<T>& o, const oracle::head_result& r) {
  errors e;
  for (std::size_t i = 0; i < p.q.n; ++i)
    e.stats = std::max({e.stats, unit_err(o.lp[i], r.log_prob[i]), unit_err(o.ent[i], r.entropy[i]),
                        unit_err(o.lse[i], r.lse[i])});
  e.gh = oracle::normwise_error(o.gh, r.grad_hidden, r.scale_hidden);
  e.gw = oracle::normwise_error(o.gw, r.grad_weight, r.scale_weight);
  if (!p.bias.empty()) e.gb = oracle::normwise_error(o.gb, r.grad_bias, r.scale_bias);
  return e;
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
template <class T>
bool same_outputs(const outputs<T>& a, const outputs<T>& b) {
  return bitwise_equal(a.lp, b.lp) && bitwise_equal(a.ent, b.ent) && bitwise_equal(a.lse, b.lse) &&
         bitwise_equal(a.gh, b.gh) && bitwise_equal(a.gw, b.gw) && bitwise_equal(a.gb, b.gb);
}

}  // namespace

TEST_CASE("linear head float32 matches the long-double oracle for odd sizes, any chunk size, tau != 1") {
  std::printf("test_logits_linear_head seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  errors worst;
  int not_bitwise = 0;
  for (std::size_t n : {1u, 3u, 17u})
    for (std::size_t h : {1u, 5u, 33u})
      for (std::size_t v : {1u, 7u, 300u})
        for (double tau : {1.0, 0.7}) {
          const bool with_bias = (n + h + v) % 2 == 1;
          const auto p = make<float>(rng, n, h, v, tau, with_bias);
          const auto r = oracle::linear_head(p.q);
          const outputs<float> first = run_all(p, {.temperature = tau, .chunk_rows = 1});
          for (std::size_t c : {std::size_t{1}, std::size_t{2}, n, n + 5, std::size_t{0}}) {
            const auto o = c == 1 ? first : run_all(p, {.temperature = tau, .chunk_rows = c});
            const errors e = compare(p, o, r);
            INFO("N=" << n << " H=" << h << " V=" << v << " tau=" << tau << " chunk=" << c << " bias=" << with_bias
                      << " stats=" << e.stats << " gh=" << e.gh << " gw=" << e.gw << " gb=" << e.gb);
            CHECK(e.stats < 1e-5);
            CHECK(e.gh < 1e-5);
            CHECK(e.gw < 1e-5);
            CHECK(e.gb < 1e-5);
            worst.stats = std::max(worst.stats, e.stats);
            worst.gh = std::max(worst.gh, e.gh);
            worst.gw = std::max(worst.gw, e.gw);
            worst.gb = std::max(worst.gb, e.gb);
            if (!same_outputs(o, first)) ++not_bitwise;
            CHECK(same_outputs(o, first));
          }
        }
  std::printf("  float32 vs oracle: stats %.3g, grad_hidden %.3g, grad_weight %.3g, grad_bias %.3g (bound 1e-5); "
              "chunkings not bitwise equal to chunk_rows=1: %d\n",
              worst.stats, worst.gh, worst.gw, worst.gb, not_bitwise);
}

TEST_CASE("linear head: vector tiles and tails, threads and chunkings are bitwise identical") {
  std::mt19937_64 rng(seed + 1);
  for (std::size_t h : {67u, 256u}) {
    const auto p = make<float>(rng, 23, h, 301, 0.9, true);
    const auto r = oracle::linear_head(p.q);
    const auto ref = run_all(p, {.temperature = 0.9, .chunk_rows = 1});
    const errors e = compare(p, ref, r);
    std::printf("  N=23 H=%zu V=301: stats %.3g, grad_hidden %.3g, grad_weight %.3g, grad_bias %.3g\n", h, e.stats,
                e.gh, e.gw, e.gb);
    CHECK(e.stats < 1e-5);
    CHECK(e.gh < 1e-5);
    CHECK(e.gw < 1e-5);
    CHECK(e.gb < 1e-5);
    for (std::size_t c : {2u, 5u, 8u, 23u, 100u}) CHECK(same_outputs(run_all(p, {.temperature = 0.9, .chunk_rows = c}), ref));
    CHECK(same_outputs(run_all(p, {.temperature = 0.9, .chunk_rows = 7}, thread_executor{2}), ref));
    CHECK(same_outputs(run_all(p, {.temperature = 0.9, .chunk_rows = 23}, thread_executor{3}), ref));
  }
}

TEST_CASE("linear head double: strided operands, forward-only and backward-only entry points agree with the oracle") {
  std::mt19937_64 rng(seed + 2);
  const auto p = make<double>(rng, 9, 13, 40, 1.3, true);
  const auto r = oracle::linear_head(p.q);
  const auto o = run_all(p, {.temperature = 1.3, .chunk_rows = 4});
  const errors e = compare(p, o, r);
  std::printf("  float64 vs oracle: stats %.3g, grad_hidden %.3g, grad_weight %.3g, grad_bias %.3g\n", e.stats, e.gh,
              e.gw, e.gb);
  CHECK(e.stats < 1e-13);
  CHECK(e.gh < 1e-13);
  CHECK(e.gw < 1e-13);
  CHECK(e.gb < 1e-13);

  // Column-major copies of hidden and weight (inner stride != 1: the plain loop nest) and transposed
  // gradient outputs.
  const std::size_t n = p.q.n, h = p.q.h, v = p.q.v;
  std::vector<double> hcm(n * h), wcm(v * h);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < h; ++k) hcm[k * n + i] = p.hidden[i * h + k];
  for (std::size_t j = 0; j < v; ++j)
    for (std::size_t k = 0; k < h; ++k) wcm[k * v + j] = p.weight[j * h + k];
  const linear_head_inputs<double> in{matrix_view<const double>(hcm.data(), n, h, 1, static_cast<std::ptrdiff_t>(n)),
                                      matrix_view<const double>(wcm.data(), v, h, 1, static_cast<std::ptrdiff_t>(v)),
                                      vector_view<const double>(p.bias.data(), v)};
  std::vector<double> lp(n), ent(2 * n), lse(n);
  linear_head_forward(in, std::span<const std::int64_t>(p.q.labels), vector_view<double>(lp.data(), n),
                      vector_view<double>(ent.data(), n, 2), vector_view<double>(lse.data(), n),
                      {.temperature = 1.3, .chunk_rows = 2});
  double es = 0;
  for (std::size_t i = 0; i < n; ++i)
    es = std::max({es, unit_err(lp[i], r.log_prob[i]), unit_err(ent[2 * i], r.entropy[i]), unit_err(lse[i], r.lse[i])});
  std::vector<double> ghT(h * n), gwT(h * v), gb(v);
  linear_head_backward(in, std::span<const std::int64_t>(p.q.labels), vector_view<const double>(p.q.g_lp.data(), n),
                       vector_view<const double>(p.q.g_ent.data(), n),
                       linear_head_grads<double>{matrix_view<double>(ghT.data(), n, h, 1, static_cast<std::ptrdiff_t>(n)),
                                                 matrix_view<double>(gwT.data(), v, h, 1, static_cast<std::ptrdiff_t>(v)),
                                                 vector_view<double>(gb.data(), v)},
                       {.temperature = 1.3, .chunk_rows = 3, .grad_weight = grad_mode::overwrite});
  std::vector<double> gh(n * h), gw(v * h);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < h; ++k) gh[i * h + k] = ghT[k * n + i];
  for (std::size_t j = 0; j < v; ++j)
    for (std::size_t k = 0; k < h; ++k) gw[j * h + k] = gwT[k * v + j];
  const double e1 = oracle::normwise_error(gh, r.grad_hidden, r.scale_hidden);
  const double e2 = oracle::normwise_error(gw, r.grad_weight, r.scale_weight);
  const double e3 = oracle::normwise_error(gb, r.grad_bias, r.scale_bias);
  std::printf("  float64 strided: stats %.3g, grad_hidden %.3g, grad_weight %.3g, grad_bias %.3g\n", es, e1, e2, e3);
  CHECK(es < 1e-13);
  CHECK(e1 < 1e-13);
  CHECK(e2 < 1e-13);
  CHECK(e3 < 1e-13);
}

TEST_CASE("linear head gradients agree with central finite differences (oracle loss and production double)") {
  std::mt19937_64 rng(seed + 3);
  auto p = make<double>(rng, 3, 4, 5, 0.8, true, 2.0);
  const auto r = oracle::linear_head(p.q);
  const auto o = run_all(p, {.temperature = 0.8, .chunk_rows = 2});
  const double eps = 1e-5;
  // Production forward in double as the loss: L = sum g_lp log_prob + g_ent entropy.
  const auto prod_loss = [&](const problem<double>& pp) {
    std::vector<double> lp(pp.q.n), ent(pp.q.n);
    linear_head_forward(pp.inputs(), std::span<const std::int64_t>(pp.q.labels), vector_view<double>(lp.data(), pp.q.n),
                        vector_view<double>(ent.data(), pp.q.n), vector_view<double>(), {.temperature = 0.8});
    double l = 0;
    for (std::size_t i = 0; i < pp.q.n; ++i) l += pp.q.g_lp[i] * lp[i] + pp.q.g_ent[i] * ent[i];
    return l;
  };
  double worst_prod = 0, worst_oracle = 0;
  const auto check_fd = [&](std::vector<double>& values, std::vector<double>& exact_values, const std::vector<double>& grad,
                            const std::vector<long double>& oracle_grad, const char* name) {
    for (std::size_t e = 0; e < values.size(); ++e) {
      const double x0 = values[e];
      values[e] = x0 + eps;
      exact_values[e] = values[e];
      const double lp_plus = prod_loss(p);
      const long double lo_plus = oracle::linear_head(p.q).loss;
      values[e] = x0 - eps;
      exact_values[e] = values[e];
      const double lp_minus = prod_loss(p);
      const long double lo_minus = oracle::linear_head(p.q).loss;
      values[e] = x0;
      exact_values[e] = x0;
      const double fd_prod = (lp_plus - lp_minus) / (2 * eps);
      const double fd_oracle = static_cast<double>((lo_plus - lo_minus) / (2 * eps));
      const double ep = std::fabs(fd_prod - grad[e]) / std::max(1.0, std::fabs(grad[e]));
      const double eo = std::fabs(fd_oracle - static_cast<double>(oracle_grad[e])) /
                        std::max(1.0, std::fabs(static_cast<double>(oracle_grad[e])));
      INFO(name << "[" << e << "] fd=" << fd_prod << " analytic=" << grad[e] << " oracle fd=" << fd_oracle
                << " oracle=" << static_cast<double>(oracle_grad[e]));
      CHECK(ep < 1e-7);
      CHECK(eo < 1e-7);
      worst_prod = std::max(worst_prod, ep);
      worst_oracle = std::max(worst_oracle, eo);
    }
  };
  check_fd(p.hidden, p.q.hidden, o.gh, r.grad_hidden, "grad_hidden");
  check_fd(p.weight, p.q.weight, o.gw, r.grad_weight, "grad_weight");
  check_fd(p.bias, p.q.bias, o.gb, r.grad_bias, "grad_bias");
  std::printf("  finite differences (eps %.0e): production double %.3g, oracle %.3g\n", eps, worst_prod, worst_oracle);
}

TEST_CASE("linear head: overwrite ignores old contents, accumulate adds to them") {
  std::mt19937_64 rng(seed + 4);
  const auto p = make<float>(rng, 5, 9, 31, 1.0, true);
  const auto& q = p.q;
  const auto zero_start = run_all(p, {.chunk_rows = 2, .grad_weight = grad_mode::overwrite});
  std::vector<float> gh(q.n * q.h), gw(q.v * q.h), gb(q.v);
  const auto call = [&](linear_head_config cfg) {
    linear_head_backward(p.inputs(), std::span<const std::int64_t>(q.labels), vector_view<const double>(q.g_lp.data(), q.n),
                         vector_view<const double>(q.g_ent.data(), q.n),
                         linear_head_grads<float>{matrix_view<float>(gh.data(), q.n, q.h),
                                                  matrix_view<float>(gw.data(), q.v, q.h), vector_view<float>(gb.data(), q.v)},
                         cfg);
  };
  // Overwrite: NaN garbage in the outputs does not leak.
  std::fill(gh.begin(), gh.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(gw.begin(), gw.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(gb.begin(), gb.end(), std::numeric_limits<float>::quiet_NaN());
  call({.chunk_rows = 3, .grad_hidden = grad_mode::overwrite, .grad_weight = grad_mode::overwrite});
  CHECK(bitwise_equal(gh, zero_start.gh));
  CHECK(bitwise_equal(gw, zero_start.gw));
  CHECK(bitwise_equal(gb, zero_start.gb));
  // Accumulate (the default for weight and bias): the terms are added one by one onto the old values,
  // so twice the gradient up to float rounding (normwise, relative to the largest element).
  const auto near = [](const std::vector<float>& got, const std::vector<float>& g, float k) {
    float err = 0, den = 0;
    for (std::size_t e = 0; e < g.size(); ++e) {
      err = std::max(err, std::fabs(got[e] - k * g[e]));
      den = std::max(den, std::fabs(k * g[e]));
    }
    return err <= 1e-6f * den;
  };
  call({.chunk_rows = 3, .grad_hidden = grad_mode::accumulate});
  CHECK(near(gh, zero_start.gh, 2));
  CHECK(near(gw, zero_start.gw, 2));
  CHECK(near(gb, zero_start.gb, 2));
  // Default config: grad_hidden overwritten, weight and bias accumulated (third time).
  call({.chunk_rows = 3});
  CHECK(bitwise_equal(gh, zero_start.gh));
  CHECK(near(gw, zero_start.gw, 3));
  CHECK(near(gb, zero_start.gb, 3));
  // Empty gradient views are skipped; N = 0 with overwrite zeroes grad_weight.
  std::vector<float> gw2(q.v * q.h, 7.0f);
  linear_head_backward(linear_head_inputs<float>{matrix_view<const float>(p.hidden.data(), 0, q.h),
                                                 matrix_view<const float>(p.weight.data(), q.v, q.h)},
                       std::span<const std::int64_t>(), vector_view<const double>(), vector_view<const double>(),
                       linear_head_grads<float>{{}, matrix_view<float>(gw2.data(), q.v, q.h)},
                       {.grad_weight = grad_mode::overwrite});
  for (float x : gw2) CHECK(x == 0.0f);
}

TEST_CASE("linear head: workspace size query, caller workspace, automatic chunk") {
  std::mt19937_64 rng(seed + 5);
  const auto p = make<float>(rng, 11, 6, 50, 1.0, false);
  const std::size_t row = 50 * sizeof(float) + 5 * sizeof(double);
  CHECK(linear_head_chunk_rows<float>(11, 50, {.chunk_rows = 4}) == 4);
  CHECK(linear_head_chunk_rows<float>(11, 50, {.chunk_rows = 40}) == 11);
  CHECK(linear_head_chunk_rows<float>(11, 50, {.workspace_budget = 3 * row + 128}) == 3);
  CHECK(linear_head_chunk_rows<float>(11, 50, {.workspace_budget = 10}) == 1);
  CHECK(linear_head_chunk_rows<float>(11, 50) == 11);
  CHECK(linear_head_chunk_rows<float>(100000, 151936) == (std::size_t{256} << 20) / (151936 * 4 + 40) - 0);
  CHECK(linear_head_workspace_bytes<float>(11, 50, {.chunk_rows = 4}) == 4 * row + 128);
  CHECK(linear_head_workspace_bytes<double>(0, 50) == 0);
  const auto ref = run_all(p, {.chunk_rows = 1});
  const linear_head_config cfg{.workspace_budget = 3 * row + 128};
  const std::size_t bytes = linear_head_workspace_bytes<float>(11, 50, cfg);
  std::vector<std::byte> ws(bytes + 1);
  std::vector<double> lp(11), ent(11), lse(11);
  // A misaligned start (offset 1) still fits: the query includes the alignment slack.
  linear_head_forward(p.inputs(), std::span<const std::int64_t>(p.q.labels), vector_view<double>(lp.data(), 11),
                      vector_view<double>(ent.data(), 11), vector_view<double>(lse.data(), 11), cfg,
                      std::span<std::byte>(ws.data() + 1, bytes));
  CHECK(bitwise_equal(lp, ref.lp));
  CHECK(bitwise_equal(ent, ref.ent));
  CHECK(bitwise_equal(lse, ref.lse));
  CHECK_THROWS_AS(linear_head_forward(p.inputs(), std::span<const std::int64_t>(p.q.labels),
                                      vector_view<double>(lp.data(), 11), vector_view<double>(), vector_view<double>(),
                                      cfg, std::span<std::byte>(ws.data(), bytes - 1)),
                  ulorl::error);
}

TEST_CASE("linear head: NaN / inf in hidden or weight are rejected by the value scan, or follow logits_forward (NaN rows) without it") {
  std::mt19937_64 rng(seed + 6);
  auto p = make<float>(rng, 4, 8, 20, 1.0, false);
  const auto labels = std::span<const std::int64_t>(p.q.labels);
  const auto fwd = [&](const problem<float>& pp, linear_head_config cfg) {
    std::vector<double> lp(4), ent(4), lse(4);
    linear_head_forward(pp.inputs(), labels, vector_view<double>(lp.data(), 4), vector_view<double>(ent.data(), 4),
                        vector_view<double>(lse.data(), 4), cfg);
    return std::vector<std::vector<double>>{lp, ent, lse};
  };
  const auto clean = fwd(p, {.chunk_rows = 3});
  auto bad = p;
  bad.hidden[2 * 8 + 5] = std::numeric_limits<float>::quiet_NaN();  // row 2
  const auto got = fwd(bad, {.chunk_rows = 3, .check_values = false});
  for (std::size_t s = 0; s < 3; ++s)
    for (std::size_t i = 0; i < 4; ++i) {
      if (i == 2)
        CHECK(std::isnan(got[s][i]));
      else
        CHECK(got[s][i] == clean[s][i]);
    }
  auto badw = p;
  badw.weight[7 * 8 + 1] = std::numeric_limits<float>::quiet_NaN();  // NaN in column 7 of every row
  const auto gotw = fwd(badw, {.check_values = false});
  for (std::size_t s = 0; s < 3; ++s)
    for (std::size_t i = 0; i < 4; ++i) CHECK(std::isnan(gotw[s][i]));
  // +inf in a weight makes logit 7 of row i +inf (a NaN row) or -inf (a masked entry: the row stays
  // finite), by the sign of hidden[i, 1], as logits_forward documents for infinite logits.
  auto infw = p;
  infw.weight[7 * 8 + 1] = std::numeric_limits<float>::infinity();
  const auto goti = fwd(infw, {.check_values = false});
  for (std::size_t i = 0; i < 4; ++i) {
    INFO("row " << i << " hidden[i,1] = " << p.hidden[i * 8 + 1]);
    if (p.hidden[i * 8 + 1] > 0)
      CHECK(std::isnan(goti[0][i]));
    else if (p.hidden[i * 8 + 1] < 0 && p.q.labels[i] != 7)
      CHECK(std::isfinite(goti[0][i]));
  }
  // The value scan rejects up front, naming argument and flat index.
  try {
    (void)fwd(bad, {});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.argument() == "hidden");
    CHECK(e.index() == 2 * 8 + 5);
    CHECK(std::string(e.what()).find("row 2, column 5") != std::string::npos);
  }
  // The backward always rejects, before writing anything.
  std::vector<float> gh(4 * 8, 5.0f), gw(20 * 8, 5.0f);
  try {
    linear_head_backward(badw.inputs(), labels, vector_view<const double>(p.q.g_lp.data(), 4), vector_view<const double>(),
                         linear_head_grads<float>{matrix_view<float>(gh.data(), 4, 8), matrix_view<float>(gw.data(), 20, 8)});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "linear_head_backward");
    CHECK(e.argument() == "weight");
    CHECK(e.index() == 7 * 8 + 1);
  }
  for (float x : gh) CHECK(x == 5.0f);
  for (float x : gw) CHECK(x == 5.0f);
  // Magnitudes whose logits could overflow float are rejected too.
  auto huge = p;
  huge.hidden[0] = 1e30f;
  huge.weight[0] = 1e30f;
  CHECK_THROWS_AS(linear_head_backward(huge.inputs(), labels, vector_view<const double>(p.q.g_lp.data(), 4),
                                       vector_view<const double>(),
                                       linear_head_grads<float>{matrix_view<float>(gh.data(), 4, 8)}),
                  ulorl::error);
  // A non-finite gradient from the functor names its row.
  try {
    linear_head_forward_backward(
        p.inputs(), labels,
        [](std::size_t r0, std::span<const double>, std::span<const double>, std::span<double> g, std::span<double>) {
          for (std::size_t i = 0; i < g.size(); ++i) g[i] = r0 + i == 3 ? nan_v : 1.0;
        },
        linear_head_grads<float>{matrix_view<float>(gh.data(), 4, 8)}, vector_view<double>(), vector_view<double>(),
        vector_view<double>(), {.chunk_rows = 2});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.argument() == "grad_log_prob");
    CHECK(e.index() == 3);
  }
}

TEST_CASE("linear head rejects bad input before writing, naming argument and index") {
  std::mt19937_64 rng(seed + 7);
  const auto p = make<float>(rng, 3, 4, 6, 1.0, false);
  std::vector<float> hid = p.hidden, w = p.weight;
  std::vector<std::int64_t> y = p.q.labels;
  std::vector<double> lp(3, 9.0), ent(3, 9.0), glp(3, 1.0);
  std::vector<float> gh(12, 9.0f), gw(24, 9.0f), gb(6, 9.0f);
  struct call {
    std::string arg;
    std::int64_t index;
    std::function<void()> f;
  };
  const auto in = [&](std::size_t n, std::size_t h, std::size_t v, std::size_t wh) {
    return linear_head_inputs<float>{matrix_view<const float>(hid.data(), n, h), matrix_view<const float>(w.data(), v, wh)};
  };
  const auto fwd = [&](linear_head_inputs<float> i, std::span<const std::int64_t> labels, std::size_t nout,
                       linear_head_config cfg = {}) {
    linear_head_forward(i, labels, vector_view<double>(lp.data(), nout), vector_view<double>(ent.data(), nout),
                        vector_view<double>(), cfg);
  };
  const auto ys = std::span<const std::int64_t>(y);
  std::vector<std::int64_t> y_bad = y;
  y_bad[1] = 6;
  std::vector<std::int64_t> y_neg = y;
  y_neg[2] = -1;
  const float fb[6] = {0, 0, 0, 0, 0, 0};
  const std::vector<call> calls = {
      {"weight", -1, [&] { fwd(in(3, 4, 6, 3), ys, 3); }},                                // H mismatch
      {"weight", -1, [&] { fwd(in(3, 4, 0, 4), ys, 3); }},                                // V = 0
      {"hidden", -1, [&] { fwd(in(3, 0, 6, 0), ys, 3); }},                                // H = 0
      {"labels", -1, [&] { fwd(in(3, 4, 6, 4), ys.subspan(0, 2), 3); }},                  // labels size
      {"labels", 1, [&] { fwd(in(3, 4, 6, 4), std::span<const std::int64_t>(y_bad), 3); }},  // label = V
      {"labels", 2, [&] { fwd(in(3, 4, 6, 4), std::span<const std::int64_t>(y_neg), 3); }},  // label < 0
      {"log_prob", -1, [&] { fwd(in(3, 4, 6, 4), ys, 2); }},                              // output size
      {"temperature", -1, [&] { fwd(in(3, 4, 6, 4), ys, 3, {.temperature = 0.0}); }},
      {"temperature", -1, [&] { fwd(in(3, 4, 6, 4), ys, 3, {.temperature = nan_v}); }},
      {"bias", -1,
       [&] {
         linear_head_forward(linear_head_inputs<float>{matrix_view<const float>(hid.data(), 3, 4),
                                                       matrix_view<const float>(w.data(), 6, 4), vector_view<const float>(fb, 5)},
                             ys, vector_view<double>(lp.data(), 3), vector_view<double>(), vector_view<double>());
       }},
      {"grad_log_prob", -1,
       [&] {
         linear_head_backward(in(3, 4, 6, 4), ys, vector_view<const double>(glp.data(), 2), vector_view<const double>(),
                              linear_head_grads<float>{matrix_view<float>(gh.data(), 3, 4)});
       }},
      {"grad_log_prob", 1,
       [&] {
         std::vector<double> g = glp;
         g[1] = nan_v;
         linear_head_backward(in(3, 4, 6, 4), ys, vector_view<const double>(g.data(), 3), vector_view<const double>(),
                              linear_head_grads<float>{matrix_view<float>(gh.data(), 3, 4)});
       }},
      {"grad_hidden", -1,
       [&] {
         linear_head_backward(in(3, 4, 6, 4), ys, vector_view<const double>(glp.data(), 3), vector_view<const double>(),
                              linear_head_grads<float>{matrix_view<float>(gh.data(), 4, 3)});
       }},
      {"grad_weight", -1,
       [&] {
         linear_head_backward(in(3, 4, 6, 4), ys, vector_view<const double>(glp.data(), 3), vector_view<const double>(),
                              linear_head_grads<float>{{}, matrix_view<float>(gw.data(), 6, 3)});
       }},
      {"grad_weight", -1,  // overlapping rows
       [&] {
         linear_head_backward(in(3, 4, 6, 4), ys, vector_view<const double>(glp.data(), 3), vector_view<const double>(),
                              linear_head_grads<float>{{}, matrix_view<float>(gw.data(), 6, 4, 2, 1)});
       }},
      {"grad_bias", -1,
       [&] {
         linear_head_backward(in(3, 4, 6, 4), ys, vector_view<const double>(glp.data(), 3), vector_view<const double>(),
                              linear_head_grads<float>{{}, {}, vector_view<float>(gb.data(), 5)});
       }},
      {"hidden", -1,
       [&] {
         linear_head_forward(linear_head_inputs<float>{matrix_view<const float>(nullptr, 3, 4),
                                                       matrix_view<const float>(w.data(), 6, 4)},
                             ys, vector_view<double>(lp.data(), 3), vector_view<double>(), vector_view<double>());
       }},
  };
  for (const auto& c : calls) {
    INFO("expected argument " << c.arg);
    try {
      c.f();
      FAIL("no error");
    } catch (const ulorl::error& e) {
      INFO(e.what());
      CHECK(e.argument() == c.arg);
      CHECK(e.index() == c.index);
      CHECK(std::string(e.what()).find("ulorl::linear_head_") == 0);
    }
  }
  for (double x : lp) CHECK(x == 9.0);
  for (double x : ent) CHECK(x == 9.0);
  for (float x : gh) CHECK(x == 9.0f);
  for (float x : gw) CHECK(x == 9.0f);
  for (float x : gb) CHECK(x == 9.0f);
}

namespace {

// A small padded batch for the policy loss: B = 2 responses of T = 3 tokens, the last token of row 1 masked.
struct pl_problem {
  std::size_t b = 2, t = 3;
  std::vector<double> old, ref, adv, mask;
};

double policy_from_hidden(const problem<double>& p, const pl_problem& pl, const policy_loss_config& cfg, double tau,
                          std::vector<double>* gh, std::vector<double>* gw, std::vector<double>* lp_out = nullptr) {
  const std::size_t n = pl.b * pl.t;
  const auto tv = [&](const std::vector<double>& v) {
    return token_view<const double>::padded(matrix_view<const double>(v.data(), pl.b, pl.t));
  };
  const policy_loss_inputs<double> in{.log_prob = {}, .old_log_prob = tv(pl.old), .advantages = tv(pl.adv),
                                      .mask = tv(pl.mask), .ref_log_prob = tv(pl.ref)};
  std::vector<double> lp(n), ent(n), glp(n), gent(n), lse(n), ghv(n * p.q.h), gwv(p.q.v * p.q.h);
  const auto out = [&](std::vector<double>& v) { return token_view<double>::padded(matrix_view<double>(v.data(), pl.b, pl.t)); };
  const logits_loss_buffers<double> buf{out(lp), out(ent), out(glp), out(gent), vector_view<double>(lse.data(), n)};
  const auto res = policy_loss_from_hidden(
      p.inputs(), std::span<const std::int64_t>(p.q.labels), in, buf,
      linear_head_grads<double>{matrix_view<double>(ghv.data(), n, p.q.h), matrix_view<double>(gwv.data(), p.q.v, p.q.h)}, cfg,
      {.temperature = tau, .chunk_rows = 4});
  if (gh) *gh = ghv;
  if (gw) *gw = gwv;
  if (lp_out) *lp_out = lp;
  return res.loss;
}

}  // namespace

TEST_CASE("policy_loss_from_hidden: log-probs match the oracle, gradients match finite differences of the loss") {
  std::mt19937_64 rng(seed + 8);
  auto p = make<double>(rng, 6, 5, 9, 0.9, false, 2.0);
  std::normal_distribution<double> nd;
  pl_problem pl;
  const auto r0 = oracle::linear_head(p.q);
  for (std::size_t i = 0; i < 6; ++i) {  // old / ref log-probs near the current ones: ratios near 1
    pl.old.push_back(static_cast<double>(r0.log_prob[i]) + 0.2 * nd(rng));
    pl.ref.push_back(static_cast<double>(r0.log_prob[i]) + 0.3 * nd(rng));
    pl.adv.push_back(nd(rng));
    pl.mask.push_back(i == 5 ? 0.0 : 1.0);
  }
  policy_loss_config cfg;
  cfg.objective.eps_low = 0.2;
  cfg.objective.eps_high = 0.28;
  cfg.kl_coef = 0.05;
  cfg.entropy_coef = 0.01;
  cfg.normalizer = agg_normalizer{agg_mode::token_mean, 5.0, 1.0};
  std::vector<double> gh, gw, lp;
  (void)policy_from_hidden(p, pl, cfg, 0.9, &gh, &gw, &lp);
  const auto r = oracle::linear_head(p.q);
  double elp = 0;
  for (std::size_t i = 0; i < 6; ++i) elp = std::max(elp, unit_err(lp[i], r.log_prob[i]));
  CHECK(elp < 1e-13);
  const double eps = 1e-6;
  double worst = 0;
  const auto fd = [&](std::vector<double>& values, const std::vector<double>& grad) {
    for (std::size_t e = 0; e < values.size(); ++e) {
      const double x0 = values[e];
      values[e] = x0 + eps;
      const double lplus = policy_from_hidden(p, pl, cfg, 0.9, nullptr, nullptr);
      values[e] = x0 - eps;
      const double lminus = policy_from_hidden(p, pl, cfg, 0.9, nullptr, nullptr);
      values[e] = x0;
      const double fdv = (lplus - lminus) / (2 * eps);
      const double err = std::fabs(fdv - grad[e]);
      INFO("element " << e << " analytic " << grad[e] << " fd " << fdv);
      CHECK(err <= 1e-8 + 1e-5 * std::fabs(fdv));  // test_logits_fused_loss's bound for the same loss
      worst = std::max(worst, err);
    }
  };
  fd(p.hidden, gh);
  fd(p.weight, gw);
  std::printf("  policy_loss_from_hidden: log_prob vs oracle %.3g, max |grad - finite difference| %.3g\n", elp, worst);
}

namespace {

//! A caller-provided GEMM: the textbook triple loop over strided views (c = a b or c += a b),
//! counting its calls, as a BLAS wrapper would be called.
struct loop_gemm {
  int* calls;
  void operator()(matrix_view<const double> a, matrix_view<const double> b, matrix_view<double> c, bool acc) const {
    ++*calls;
    REQUIRE(a.cols() == b.rows());
    REQUIRE(c.rows() == a.rows());
    REQUIRE(c.cols() == b.cols());
    for (std::size_t i = 0; i < c.rows(); ++i)
      for (std::size_t j = 0; j < c.cols(); ++j) {
        double s = 0;
        for (std::size_t k = 0; k < a.cols(); ++k) s += a(i, k) * b(k, j);
        c(i, j) = acc ? c(i, j) + s : s;
      }
  }
};

}  // namespace

TEST_CASE("linear head: a caller-provided GEMM functor gives the built-in GEMM's results, 3 calls per chunk") {
  const std::size_t n = 7, h = 5, v = 23, chunk = 3;
  std::mt19937_64 rng(4242);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> hid(n * h), w(v * h), bias(v);
  for (auto& x : hid) x = u(rng);
  for (auto& x : w) x = u(rng);
  for (auto& x : bias) x = 0.1 * u(rng);
  std::vector<std::int64_t> labels(n);
  for (std::size_t i = 0; i < n; ++i) labels[i] = static_cast<std::int64_t>((i * 7 + 3) % v);
  linear_head_inputs<double> in{{hid.data(), n, h}, {w.data(), v, h}, {bias.data(), v}};
  linear_head_config cfg;
  cfg.chunk_rows = chunk;
  cfg.temperature = 0.8;
  const auto grad_fn = [](std::size_t r0, std::span<const double> lp, std::span<const double> ent,
                          std::span<double> glp, std::span<double> gent) {
    for (std::size_t i = 0; i < lp.size(); ++i) {
      glp[i] = 0.3 + 0.1 * static_cast<double>(r0 + i);
      gent[i] = -0.2 * ent[i];
    }
  };
  struct out_t {
    std::vector<double> lp, gh, gw, gb;
  };
  const auto run = [&](auto&& gemm) {
    out_t o{std::vector<double>(n), std::vector<double>(n * h), std::vector<double>(v * h), std::vector<double>(v)};
    linear_head_forward_backward(in, std::span<const std::int64_t>(labels), grad_fn,
                                 linear_head_grads<double>{{o.gh.data(), n, h}, {o.gw.data(), v, h}, {o.gb.data(), v}},
                                 vector_view<double>(o.lp.data(), n), {}, {}, cfg, {}, sequential_executor{}, gemm);
    return o;
  };
  int calls = 0;
  const out_t builtin = run(builtin_gemm{});
  const out_t custom = run(loop_gemm{&calls});
  CHECK(calls == 3 * 3);  // ceil(7 / 3) chunks x (logits, grad hidden, grad weight)
  const auto near = [](const std::vector<double>& a, const std::vector<double>& b) {
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::fabs(a[i] - b[i]) > 1e-12 * (1 + std::fabs(b[i]))) return false;
    return true;
  };
  CHECK(near(custom.lp, builtin.lp));
  CHECK(near(custom.gh, builtin.gh));
  CHECK(near(custom.gw, builtin.gw));
  CHECK(near(custom.gb, builtin.gb));
  // Overwrite mode with stale values (NaN) in every gradient: the caller's GEMM overwrites (each
  // chunk's grad_hidden rows, grad_weight in the first chunk, no zeroing pass) and gives the
  // builtin GEMM's results; with no rows at all it zeroes grad_weight and grad_bias as the builtin does.
  linear_head_config over = cfg;
  over.grad_weight = grad_mode::overwrite;
  const auto run_over = [&](auto&& gemm, std::size_t rows) {
    const double stale = std::numeric_limits<double>::quiet_NaN();
    out_t o{std::vector<double>(rows), std::vector<double>(rows * h, stale), std::vector<double>(v * h, stale),
            std::vector<double>(v, stale)};
    const linear_head_inputs<double> part{{hid.data(), rows, h}, {w.data(), v, h}, {bias.data(), v}};
    linear_head_forward_backward(part, std::span<const std::int64_t>(labels.data(), rows), grad_fn,
                                 linear_head_grads<double>{{o.gh.data(), rows, h}, {o.gw.data(), v, h}, {o.gb.data(), v}},
                                 vector_view<double>(o.lp.data(), rows), {}, {}, over, {}, sequential_executor{}, gemm);
    return o;
  };
  const out_t over_builtin = run_over(builtin_gemm{}, n);
  const out_t over_custom = run_over(loop_gemm{&calls}, n);
  CHECK(near(over_custom.gh, over_builtin.gh));
  CHECK(near(over_custom.gw, over_builtin.gw));
  CHECK(near(over_custom.gb, over_builtin.gb));
  CHECK(near(over_builtin.gw, builtin.gw));
  for (const out_t& o : {run_over(builtin_gemm{}, 0), run_over(loop_gemm{&calls}, 0)}) {
    for (double x : o.gw) CHECK(x == 0.0);
    for (double x : o.gb) CHECK(x == 0.0);
  }
  // Forward only: one call per chunk.
  calls = 0;
  std::vector<double> lp(n);
  linear_head_forward(in, std::span<const std::int64_t>(labels), vector_view<double>(lp.data(), n), {}, {}, cfg, {},
                      sequential_executor{}, loop_gemm{&calls});
  CHECK(calls == 3);
  CHECK(near(lp, builtin.lp));
}

TEST_CASE("policy_loss_from_hidden: one pass (3 GEMMs per chunk) gives the two-pass results (4 GEMMs)") {
  // A token-level objective without a hook takes each token's gradient from its own chunk; the same
  // call with a (no-op) hook runs the two passes. Same statistics, loss, metrics and token gradients
  // bit for bit; the head's gradients to rounding (the loss's row kernels may contract to FMA).
  std::mt19937_64 rng(seed + 9);
  const std::size_t n = 15, h = 6, v = 17;
  const auto p = make<double>(rng, n, h, v, 0.8, true, 2.0);
  std::normal_distribution<double> nd;
  const auto r0 = oracle::linear_head(p.q);
  std::vector<double> old(n), ref(n), adv(n), mask(n), wts(n);
  for (std::size_t i = 0; i < n; ++i) {
    old[i] = static_cast<double>(r0.log_prob[i]) + 0.3 * nd(rng);  // some ratios clipped
    ref[i] = static_cast<double>(r0.log_prob[i]) + 0.3 * nd(rng);
    adv[i] = nd(rng);
    mask[i] = (i % 4 == 3 || i >= 12) ? 0.0 : 1.0;  // holes; padded row 2's last 3 tokens masked
    wts[i] = 0.5 + std::fabs(nd(rng));
  }
  const std::vector<std::int64_t> offsets{0, 6, 6, 15};  // packed: rows of 6, 0 and 9 tokens
  const auto labels = std::span<const std::int64_t>(p.q.labels);
  struct outputs {
    std::vector<double> lp, ent, glp, gent, lse, gh, gw, gb;
    policy_loss_result res;
  };
  const auto tokens = [&](bool packed, auto* data) {
    using E = std::remove_pointer_t<decltype(data)>;
    return packed ? token_view<E>::packed(vector_view<E>(data, n), std::span<const std::int64_t>(offsets))
                  : token_view<E>::padded(matrix_view<E>(data, 3, 5));
  };
  bool absent_mask = false;
  const auto run = [&](bool packed, const policy_loss_config& cfg, const linear_head_config& hcfg, bool hook, bool weights,
                       int* calls) {
    outputs o{std::vector<double>(n, 7.0), std::vector<double>(n, 7.0), std::vector<double>(n, 7.0),
              std::vector<double>(n, 7.0), std::vector<double>(n, 7.0), std::vector<double>(n * h, 7.0),
              std::vector<double>(v * h, 7.0), std::vector<double>(v, 7.0), {}};
    policy_loss_inputs<double> in{.log_prob = {}, .old_log_prob = tokens(packed, old.data()),
                                  .advantages = tokens(packed, adv.data()), .mask = tokens(packed, mask.data())};
    if (cfg.kl_coef != 0.0) in.ref_log_prob = tokens(packed, ref.data());
    if (weights) in.weights = tokens(packed, wts.data());
    if (absent_mask) in.mask = {};
    const logits_loss_buffers<double> buf{tokens(packed, o.lp.data()), tokens(packed, o.ent.data()),
                                          tokens(packed, o.glp.data()), tokens(packed, o.gent.data()),
                                          vector_view<double>(o.lse.data(), n)};
    const linear_head_grads<double> g{{o.gh.data(), n, h}, {o.gw.data(), v, h}, {o.gb.data(), v}};
    if (hook)
      o.res = policy_loss_from_hidden(p.inputs(), labels, in, buf, g, cfg, hcfg, {}, sequential_executor{}, loop_gemm{calls},
                                      [](const token_statistics<double>&) {});
    else
      o.res = policy_loss_from_hidden(p.inputs(), labels, in, buf, g, cfg, hcfg, {}, sequential_executor{}, loop_gemm{calls});
    return o;
  };
  const auto close = [](const std::vector<double>& a, const std::vector<double>& b) {
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / (1e-300 + std::fabs(b[i]) + 1e-3));
    return worst;
  };
  linear_head_config hcfg;
  hcfg.chunk_rows = 4;  // 4 chunks
  hcfg.temperature = 0.8;
  int cases = 0;
  double worst = 0;
  for (bool no_mask : {false, true})
  for (bool packed : {false, true})
    for (objective_kind kind : {objective_kind::ppo_clip, objective_kind::cispo, objective_kind::sapo,
                                objective_kind::policy_gradient})
      for (int kl : {-1, 0, 1, 2, 3, 4})  // none, k1, abs, k2, k3, importance-weighted k3
        for (agg_mode mode : {agg_mode::token_mean, agg_mode::seq_mean_token_mean, agg_mode::seq_mean_token_sum})
          for (bool weights : {false, true})
            for (double ent_coef : {0.0, 0.01}) {
              CAPTURE(no_mask, packed, static_cast<int>(kind), kl, static_cast<int>(mode), weights, ent_coef);
              absent_mask = no_mask;
              policy_loss_config cfg;
              cfg.objective.kind = kind;
              cfg.objective.eps_low = 0.2;
              cfg.objective.eps_high = kind == objective_kind::cispo ? 4.0 : 0.28;
              if (kind == objective_kind::ppo_clip && weights) cfg.objective.dual_clip = 3.0;  // the non-plain form too
              if (kl >= 0) {
                cfg.kl_coef = 0.05;
                cfg.kl.estimator = kl == 4 ? kl_estimator::k3 : static_cast<kl_estimator>(kl);
                cfg.kl.importance_weighted = kl == 4;
              }
              cfg.entropy_coef = ent_coef;
              cfg.normalizer = agg_normalizer{mode, mode == agg_mode::token_mean ? 10.0 : 3.0, 1.0};
              int one = 0, two = 0;
              const outputs a = run(packed, cfg, hcfg, false, weights, &one);
              const outputs b = run(packed, cfg, hcfg, true, weights, &two);
              CHECK(one == 3 * 4);
              CHECK(two == 4 * 4);
              CHECK(a.res.loss == b.res.loss);
              CHECK(a.res.pg_loss == b.res.pg_loss);
              CHECK(a.res.kl_loss == b.res.kl_loss);
              CHECK(a.res.entropy_loss == b.res.entropy_loss);
              CHECK(a.res.metrics.clipped == b.res.metrics.clipped);
              CHECK(a.res.metrics.kl_sum == b.res.metrics.kl_sum);
              CHECK(a.lp == b.lp);
              CHECK(a.lse == b.lse);
              CHECK(a.glp == b.glp);
              CHECK(a.gent == b.gent);
              const double e = std::max({close(a.gh, b.gh), close(a.gw, b.gw), close(a.gb, b.gb)});
              CHECK(e < 1e-13);
              worst = std::max(worst, e);
              ++cases;
            }
  std::printf("  policy_loss_from_hidden one pass vs two: %d configurations, head gradients within %.3g\n", cases, worst);
  absent_mask = false;
  {  // An absent mask is an all-ones mask in the one pass (the head's gradients are not zero).
    policy_loss_config c1;
    c1.normalizer = agg_normalizer{agg_mode::token_mean, 15.0, 1.0};
    const std::vector<double> keep = mask;
    std::fill(mask.begin(), mask.end(), 1.0);
    int calls = 0;
    const outputs ones = run(false, c1, hcfg, false, false, &calls);
    absent_mask = true;
    const outputs none = run(false, c1, hcfg, false, false, &calls);
    absent_mask = false;
    mask = keep;
    CHECK(none.res.loss == ones.res.loss);
    CHECK(none.gh == ones.gh);
    CHECK(none.gw == ones.gw);
    CHECK(std::any_of(none.gh.begin(), none.gh.end(), [](double x) { return x != 0.0; }));
  }

  policy_loss_config cfg;
  cfg.objective.eps_low = 0.2;
  cfg.objective.eps_high = 0.28;
  cfg.normalizer = agg_normalizer{agg_mode::token_mean, 10.0, 1.0};
  {  // Sequence-level objectives need every row first: two passes.
    policy_loss_config seq = cfg;
    for (objective_kind kind : {objective_kind::gspo, objective_kind::gmpo}) {
      seq.objective.kind = kind;
      int calls = 0;
      (void)run(false, seq, hcfg, false, false, &calls);
      CHECK(calls == 4 * 4);
    }
  }
  {  // The loss's value scan must see the log-probs before the head writes: two passes when the head's is off.
    linear_head_config unchecked = hcfg;
    unchecked.check_values = false;
    int calls = 0;
    (void)run(false, cfg, unchecked, false, false, &calls);
    CHECK(calls == 4 * 4);
    policy_loss_config loose = cfg;
    loose.check_values = false;
    calls = 0;
    (void)run(false, loose, unchecked, false, false, &calls);
    CHECK(calls == 3 * 4);
  }
  {  // Bad token inputs are rejected before the one pass writes anything.
    for (int what = 0; what < 3; ++what) {
      const std::vector<double> keep_adv = adv, keep_mask = mask, keep_old = old;
      if (what == 0) adv[5] = std::numeric_limits<double>::quiet_NaN();
      if (what == 1) mask[7] = 2.0;
      if (what == 2) old[9] = std::numeric_limits<double>::infinity();
      int calls = 0;
      outputs o;
      bool threw = false;
      try {
        o = run(false, cfg, hcfg, false, false, &calls);
      } catch (const ulorl::error& err) {
        threw = true;
        CHECK(err.argument() == std::string(what == 0 ? "advantages" : what == 1 ? "mask" : "old_log_prob"));
      }
      CHECK(threw);
      CHECK(calls == 0);  // no GEMM ran: nothing was written
      adv = keep_adv, mask = keep_mask, old = keep_old;
    }
  }
}

TEST_CASE("linear head value scan over rows as wide as several vectors: every non-finite position named, the overflow bound from the true maxima") {
  std::mt19937_64 rng(seed + 13);
  const std::size_t n = 3, h = 77, v = 5;  // 77: pair-of-vector bodies and a scalar tail at every width
  auto p = make<float>(rng, n, h, v, 1.0, false);
  const auto labels = std::span<const std::int64_t>(p.q.labels);
  std::vector<double> lp(n);
  const auto fwd = [&](const problem<float>& pp) {
    linear_head_forward(pp.inputs(), labels, vector_view<double>(lp.data(), n), vector_view<double>(),
                        vector_view<double>(), linear_head_config{});
  };
  REQUIRE_NOTHROW(fwd(p));
  for (const bool in_weight : {false, true})
    for (std::size_t r : {std::size_t{0}, n - 1})
      for (std::size_t c : {std::size_t{0}, std::size_t{15}, std::size_t{16}, std::size_t{40}, std::size_t{63},
                            std::size_t{64}, h - 1})
        for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
          auto q = p;
          (in_weight ? q.weight : q.hidden)[r * h + c] = bad;
          INFO((in_weight ? "weight" : "hidden") << " row " << r << " column " << c);
          try {
            fwd(q);
            FAIL("no error");
          } catch (const ulorl::error& e) {
            CHECK(e.argument() == (in_weight ? "weight" : "hidden"));
            CHECK(e.index() == static_cast<std::int64_t>(r * h + c));
          }
        }
  // The overflow rule reads the largest magnitudes wherever they sit in a row (H max|h| max|w| must
  // stay below max/4 of float): a large pair in vector lanes is rejected, a pair just below passes.
  const float big = std::sqrt(std::numeric_limits<float>::max() / 4 / static_cast<float>(h));
  auto over = p;
  over.hidden[1 * h + 40] = -big * 1.01f;
  over.weight[2 * h + 33] = big * 1.01f;
  CHECK_THROWS_AS(fwd(over), ulorl::error);
  auto under = p;
  under.hidden[1 * h + 40] = -big * 0.5f;
  under.weight[2 * h + 33] = big * 0.5f;
  CHECK_NOTHROW(fwd(under));
}
