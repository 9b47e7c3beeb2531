// Tests for ulorl/advantage/group_advantage.hpp against the independent oracle.
#include <ulorl/advantage/group_advantage.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/advantage_oracle.hpp"
#include "support/random.hpp"
#include "support/rejection.hpp"

using ulorl::baseline_kind;
using ulorl::group_advantage_config;
using ulorl::scale_kind;
using ulorl::singleton_rule;

namespace {

template <class T>
std::vector<T> run(const std::vector<T>& s, const std::vector<std::int64_t>& ids, const group_advantage_config& cfg) {
  std::vector<T> out(s.size());
  ulorl::group_advantages(std::span<const T>(s), std::span<const std::int64_t>(ids), std::span<T>(out), cfg);
  return out;
}

void require_close(const std::vector<double>& a, const std::vector<double>& b, double rtol, double atol) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("i = " << i << " got " << a[i] << " expected " << b[i]);
    REQUIRE(std::fabs(a[i] - b[i]) <= atol + rtol * std::fabs(b[i]));
  }
}

}  // namespace

TEST_CASE("GRPO matches the oracle on unsorted, unequal groups with singletons", "[advantage]") {
  testing_support::rng r(testing_support::default_seed);
  CAPTURE(testing_support::default_seed);
  for (std::size_t n : {1u, 2u, 3u, 7u, 47u, 1023u}) {
    CAPTURE(n);
    std::vector<double> s(n);
    for (auto& x : s) x = r.coin(0.3) ? r.normal() : static_cast<double>(r.integer(0, 1));
    const auto ids = testing_support::random_group_ids(r, n);
    for (bool unbiased : {true, false})
      for (bool identity : {true, false}) {
        group_advantage_config cfg{.std = unbiased ? ulorl::std_estimator::unbiased : ulorl::std_estimator::biased,
                                   .eps = 1e-6,
                                   .singleton = identity ? singleton_rule::identity : singleton_rule::zero};
        require_close(run(s, ids, cfg), oracle::grpo(s, ids, 1e-6, unbiased, true, identity), 1e-12, 1e-12);
        cfg.scale = scale_kind::none;  // Dr. GRPO
        require_close(run(s, ids, cfg), oracle::grpo(s, ids, 1e-6, unbiased, false, identity), 1e-12, 1e-12);
      }
  }
}

TEST_CASE("leave-one-out baseline with and without pool std matches the oracle", "[advantage]") {
  testing_support::rng r(7);
  for (std::size_t n : {2u, 3u, 9u, 64u, 200u}) {
    std::vector<double> s(n);
    for (auto& x : s) x = r.coin(0.5) ? r.normal(3, 2) : static_cast<double>(r.integer(0, 1));
    const auto ids = testing_support::random_group_ids(r, n);
    group_advantage_config cfg{.baseline = baseline_kind::leave_one_out,
                               .scale = scale_kind::leave_one_out_std,
                               .eps = 1e-6,
                               .zero_std = ulorl::zero_std_rule::skip};
    require_close(run(s, ids, cfg), oracle::loo(s, ids, true, 1e-6), 1e-10, 1e-12);
    cfg.scale = scale_kind::none;
    require_close(run(s, ids, cfg), oracle::loo(s, ids, false, 1e-6), 1e-12, 1e-12);
  }
}

TEST_CASE("advantages of a centred group sum to zero; all-equal rewards give zero", "[advantage][property]") {
  testing_support::rng r(11);
  for (int trial = 0; trial < 50; ++trial) {
    const std::size_t g = static_cast<std::size_t>(r.integer(2, 33));
    std::vector<double> s(g);
    for (auto& x : s) x = r.normal(0, 5);
    const std::vector<std::int64_t> ids(g, 3);
    for (auto scale : {scale_kind::none, scale_kind::group_std}) {
      const auto a = run(s, ids, {.scale = scale});
      double sum = 0, mag = 0;
      for (double x : a) sum += x, mag += std::fabs(x);
      REQUIRE(std::fabs(sum) <= 1e-12 * (1 + mag));
    }
    const std::vector<double> same(g, 0.75);
    for (double x : run(same, ids, {})) REQUIRE(x == 0.0);
  }
}

TEST_CASE("no advantage spikes for rewards 1e6 + {0, 1e-3} (float64 and float32)", "[advantage][numerics]") {
  // A one-pass E[x^2]-E[x]^2 loses all digits here; ours must match the long-double oracle.
  std::vector<double> s{1e6, 1e6 + 1e-3, 1e6, 1e6 + 1e-3, 1e6 + 1e-3, 1e6};
  const std::vector<std::int64_t> ids{0, 0, 0, 0, 0, 0};
  // Conditioning limits any float64 algorithm to ~1e-7 relative here (golden README §2).
  require_close(run(s, ids, {.eps = 1e-6}), oracle::grpo(s, ids, 1e-6, true, true, false), 1e-6, 1e-9);
  const group_advantage_config loo{.baseline = baseline_kind::leave_one_out,
                                   .scale = scale_kind::leave_one_out_std,
                                   .eps = 1e-6,
                                   .zero_std = ulorl::zero_std_rule::skip};
  const auto a = run(s, ids, loo);
  require_close(a, oracle::loo(s, ids, true, 1e-6), 1e-6, 1e-9);
  for (double x : a) REQUIRE(std::fabs(x) < 3.0);

  // float32 storage: inputs are rounded to float, statistics stay exact in double.
  std::vector<float> f{1000.0f, 1000.001f, 1000.0f, 1000.001f, 1000.0f, 1000.002f};
  std::vector<double> fd(f.begin(), f.end());
  const auto af = run(f, ids, loo);
  const auto ref = oracle::loo(fd, ids, true, 1e-6);
  for (std::size_t i = 0; i < af.size(); ++i) {
    REQUIRE(std::fabs(af[i] - ref[i]) <= 1e-5 * std::fabs(ref[i]) + 1e-6);
    REQUIRE(std::fabs(af[i]) < 10.0f);
  }
  // A group where one member carries all the spread: removing it leaves a constant pool.
  std::vector<double> spike{1e6, 1e6, 1e6, 1e6 + 1.0};
  const std::vector<std::int64_t> g4{0, 0, 0, 0};
  require_close(run(spike, g4, loo), oracle::loo(spike, g4, true, 1e-6), 1e-9, 1e-9);
}

TEST_CASE("batch std scaling keeps group means (TRL scale_rewards=batch)", "[advantage]") {
  const std::vector<double> s{1, 0, 0, 0, 1, 1};
  const std::vector<std::int64_t> ids{0, 0, 0, 1, 1, 1};
  const auto a = run(s, ids, {.scale = scale_kind::batch_std, .eps = 1e-4});
  std::vector<long double> all(s.begin(), s.end());
  const long double sd = oracle::std_of(all, true);
  REQUIRE(a[0] == Approx(static_cast<double>((1 - 1.0L / 3) / (sd + 1e-4L))).epsilon(1e-12));
  REQUIRE(a[3] == Approx(static_cast<double>((0 - 2.0L / 3) / (sd + 1e-4L))).epsilon(1e-12));
}

TEST_CASE("eps placement inside the square root", "[advantage]") {
  const std::vector<double> s{2, 4};
  const std::vector<std::int64_t> ids{5, 5};
  const auto a = run(s, ids, {.eps = 0.5, .eps_at = ulorl::eps_placement::add_to_variance});
  REQUIRE(a[1] == Approx(1.0 / std::sqrt(2.0 + 0.5)).epsilon(1e-14));
}

TEST_CASE("bad input is rejected before any output is written", "[advantage][errors]") {
  const std::vector<double> s{1, 0, 1};
  std::vector<double> out{7, 7, 7};
  const auto untouched = [&] { for (double x : out) REQUIRE(x == 7); };
  const auto call = [&](std::vector<double> sc, std::vector<std::int64_t> ids, group_advantage_config cfg = {}) {
    ulorl::group_advantages(std::span<const double>(sc), std::span<const std::int64_t>(ids), std::span<double>(out), cfg);
  };
  REQUIRE_THROWS_WITH(call({1, 0}, {0, 0, 0}), Catch::Contains("'group_ids'") && Catch::Contains("has 3 elements"));
  REQUIRE_THROWS_WITH(call({1, std::nan(""), 1}, {0, 0, 0}),
                      Catch::Contains("'scores'[1]") && Catch::Contains("finite"));
  REQUIRE_THROWS_WITH(call({1, 0, std::numeric_limits<double>::infinity()}, {0, 0, 0}), Catch::Contains("'scores'[2]"));
  REQUIRE_THROWS_WITH(call(s, {0, -4, 0}), Catch::Contains("'group_ids'[1] = -4"));
  REQUIRE_THROWS_WITH(call({}, {}), Catch::Contains("empty batch"));
  REQUIRE_THROWS_WITH(call(s, {0, 0, 0}, {.eps = 0.0}), Catch::Contains("config.eps"));
  REQUIRE_THROWS_WITH(call(s, {0, 0, 0}, {.eps = -1e-6}), Catch::Contains("config.eps"));
  REQUIRE_THROWS_WITH(call(s, {0, 0, 9}, {.singleton = singleton_rule::reject}),
                      Catch::Contains("'groups'[2]") && Catch::Contains("alone"));
  REQUIRE_THROWS_AS(call(s, {0, 0, 9}, {.singleton = singleton_rule::reject}), ulorl::error);
  std::vector<double> short_out(2);
  REQUIRE_THROWS_WITH(ulorl::group_advantages(std::span<const double>(s), 3, std::span<double>(short_out)),
                      Catch::Contains("'out'"));
  REQUIRE_THROWS_WITH(ulorl::group_advantages(std::span<const double>(s), 2, std::span<double>(out)),
                      Catch::Contains("'group_size' = 2") && Catch::Contains("divide"));
  untouched();
  // eps may be 0 when a zero std skips scaling (nothing divides by eps alone).
  call(s, {0, 0, 0}, {.eps = 0.0, .zero_std = ulorl::zero_std_rule::skip});
  REQUIRE(out[0] != 7);
}

// Each enum of the configuration, cast from an integer no enumerator has, is rejected at
// validation naming config.<field> and the value; the output keeps its sentinel.
TEST_CASE("an unknown enum value in the config is rejected naming it, and nothing is written",
          "[advantage][errors][enum]") {
  const std::vector<double> s{1, 0, 1, 1};
  const std::vector<std::int64_t> ids{0, 0, 1, 1};
  std::vector<double> out(4, 7.0);
  const auto by_ids = [&](group_advantage_config cfg) {
    return [&, cfg] {
      ulorl::group_advantages(std::span<const double>(s), std::span<const std::int64_t>(ids), std::span<double>(out), cfg);
    };
  };
  REQUIRE_THROWS_WITH(by_ids({.baseline = static_cast<baseline_kind>(9)})(),
                      Catch::Equals("ulorl::group_advantages: argument 'config.baseline' = 9: unknown enum value "
                                    "(known: 0, 1, 2)"));
  require_unknown_enum(by_ids({.baseline = static_cast<baseline_kind>(9)}), "group_advantages", "config.baseline", 9);
  require_unknown_enum(by_ids({.scale = static_cast<scale_kind>(7)}), "group_advantages", "config.scale", 7);
  require_unknown_enum(by_ids({.std = static_cast<ulorl::std_estimator>(2)}), "group_advantages", "config.std", 2);
  require_unknown_enum(by_ids({.eps_at = static_cast<ulorl::eps_placement>(2)}), "group_advantages", "config.eps_at", 2);
  require_unknown_enum(by_ids({.singleton = static_cast<singleton_rule>(3)}), "group_advantages", "config.singleton", 3);
  require_unknown_enum(by_ids({.zero_std = static_cast<ulorl::zero_std_rule>(2)}), "group_advantages", "config.zero_std",
                       2);
  // Also where nothing else would read the field (no scaling: std, eps_at and zero_std unused).
  require_unknown_enum(by_ids({.scale = scale_kind::none, .std = static_cast<ulorl::std_estimator>(-1)}),
                       "group_advantages", "config.std", -1);
  // The fixed-size overload validates the same way.
  require_unknown_enum([&] {
    ulorl::group_advantages(std::span<const double>(s), 2, std::span<double>(out),
                            {.singleton = static_cast<singleton_rule>(42)});
  }, "group_advantages", "config.singleton", 42);
  REQUIRE(all_equal(out, 7.0));
}

TEST_CASE("output may alias the scores", "[advantage]") {
  std::vector<double> s{1, 0, 0, 1, 1, 0};
  const auto expected = oracle::grpo(s, {0, 0, 0, 0, 0, 0}, 1e-6, true, true, false);
  ulorl::group_advantages(std::span<const double>(s), 6, std::span<double>(s));
  require_close(s, expected, 1e-14, 0);
}

namespace {

// Long-double textbook advantages for any configuration, written from the formula at the top of
// group_advantage.hpp: groups by linear search, leave-one-out pools built explicitly. The exponent
// range of long double (x87: to 1e4932) holds the squares of any double score, so nothing here
// overflows for finite double inputs.
long double ld_mean(const std::vector<long double>& v) {
  long double s = 0;
  for (auto x : v) s += x;
  return s / static_cast<long double>(v.size());
}
long double ld_std(const std::vector<long double>& v, bool unbiased) {
  if (v.size() < (unbiased ? 2u : 1u)) return 0;
  const long double mu = ld_mean(v);
  long double ss = 0;
  for (auto x : v) ss += (x - mu) * (x - mu);
  return std::sqrt(ss / static_cast<long double>(unbiased ? v.size() - 1 : v.size()));
}

struct exact_advantage {
  long double value;
  long double magnitude;  // size of the terms: max |s| of the group (and |b|) over the divisor
};

template <class T>
std::vector<exact_advantage> oracle_any(const std::vector<T>& s, const std::vector<std::int64_t>& ids,
                                        const group_advantage_config& cfg) {
  const bool unbiased = cfg.std == ulorl::std_estimator::unbiased;
  const long double eps = cfg.eps;
  const auto denom = [&](long double sigma) {
    return cfg.eps_at == ulorl::eps_placement::add_to_std ? sigma + eps : std::sqrt(sigma * sigma + eps);
  };
  std::vector<long double> all(s.begin(), s.end());
  std::vector<exact_advantage> out(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto mem = oracle::group_members(ids, i);
    const long double si = s[i];
    if (mem.size() == 1) {
      long double a = 0;
      if (cfg.singleton == singleton_rule::identity) a = cfg.scale == scale_kind::none ? si : si / denom(1);
      out[i] = {a, std::fabs(a)};
      continue;
    }
    std::vector<long double> group, pool;
    long double biggest = 0;
    for (auto j : mem) {
      group.push_back(s[j]);
      if (j != i) pool.push_back(s[j]);
      biggest = std::max(biggest, std::fabs(static_cast<long double>(s[j])));
    }
    long double b = 0;
    if (cfg.baseline == baseline_kind::group_mean) b = ld_mean(group);
    if (cfg.baseline == baseline_kind::leave_one_out) b = ld_mean(pool);
    long double sigma = 0;
    if (cfg.scale == scale_kind::group_std) sigma = ld_std(group, unbiased);
    if (cfg.scale == scale_kind::leave_one_out_std) sigma = ld_std(pool, unbiased);
    if (cfg.scale == scale_kind::batch_std) sigma = ld_std(all, unbiased);
    const long double centered = si - b;
    if (cfg.scale == scale_kind::none || (sigma == 0 && cfg.zero_std == ulorl::zero_std_rule::skip)) {
      out[i] = {centered, biggest};
      continue;
    }
    const long double d = denom(sigma);
    out[i] = {centered / d, biggest / d};
  }
  return out;
}

template <class T>
void require_matches_oracle(const std::vector<T>& s, const std::vector<std::int64_t>& ids, const group_advantage_config& cfg,
                            double rtol, double atol) {
  const auto ref = oracle_any(s, ids, cfg);
  // An exact advantage beyond the range of T must be an error (e.g. a zero pool std divided by eps).
  const long double top = std::numeric_limits<T>::max();
  long double biggest = 0;
  for (const auto& r : ref) biggest = std::max(biggest, std::fabs(r.value));
  if (biggest > top * (1 + 1e-5L)) {
    REQUIRE_THROWS_WITH(run(s, ids, cfg), Catch::Contains("not representable"));
    return;
  }
  if (biggest > top * (1 - 1e-5L)) return;  // at the edge of the range: either outcome is right
  const auto a = run(s, ids, cfg);
  for (std::size_t i = 0; i < s.size(); ++i) {
    INFO("i = " << i << " score " << s[i] << " got " << a[i] << " expected " << static_cast<double>(ref[i].value));
    REQUIRE(std::isfinite(static_cast<double>(a[i])));
    REQUIRE(std::fabs(static_cast<long double>(a[i]) - ref[i].value) <= atol + rtol * ref[i].magnitude);
  }
}

}  // namespace

TEST_CASE("group statistics are exact for finite scores of any magnitude (1e-300..1e300, float and double)",
          "[advantage][numerics]") {
  const double dmax = std::numeric_limits<double>::max();
  const double r2 = 0.70710678118654752440;  // 1/sqrt(2)
  // {1e200, 0}: mean 5e199, deviations +-5e199, unbiased std 1e200/sqrt(2): +-1/sqrt(2) (eps is negligible).
  const auto a = run(std::vector<double>{1e200, 0.0}, {0, 0}, {});
  CHECK(a[0] == Approx(r2).epsilon(1e-15));
  CHECK(a[1] == Approx(-r2).epsilon(1e-15));
  const auto biased = run(std::vector<double>{1e200, 0.0}, {0, 0}, {.std = ulorl::std_estimator::biased});
  CHECK(biased[0] == Approx(1.0).epsilon(1e-15));
  // Equal scores at the top of the range: zero deviations, zero advantages (not NaN).
  for (double x : run(std::vector<double>{dmax, dmax}, {0, 0}, {})) CHECK(x == 0.0);
  for (double x : run(std::vector<double>{-dmax, -dmax, -dmax}, {0, 0, 0}, {.baseline = baseline_kind::leave_one_out}))
    CHECK(x == 0.0);
  // {max, -max}: the std (sqrt(2) max) is not representable, the advantages +-1/sqrt(2) are.
  const auto pm = run(std::vector<double>{dmax, -dmax}, {0, 0}, {});
  CHECK(pm[0] == Approx(r2).epsilon(1e-15));
  CHECK(pm[1] == Approx(-r2).epsilon(1e-15));
  const auto pmf = run(std::vector<float>{std::numeric_limits<float>::max(), 0.0f}, {0, 0}, {});
  CHECK(pmf[0] == Approx(r2).epsilon(1e-7));
  // Subnormal scores scale up exactly: {4e-320, 0} is {1, 0} times 4e-320 (no eps: a zero std skips).
  const auto sub = run(std::vector<double>{4e-320, 0.0}, {0, 0}, {.eps = 0.0, .zero_std = ulorl::zero_std_rule::skip});
  CHECK(sub[0] == Approx(r2).epsilon(1e-12));

  testing_support::rng r(testing_support::default_seed + 13);
  CAPTURE(testing_support::default_seed + 13);
  const auto log_uniform = [&](double lo, double hi) {
    const double x = std::pow(10.0, r.uniform(lo, hi));
    return r.coin() ? x : -x;
  };
  const baseline_kind baselines[] = {baseline_kind::group_mean, baseline_kind::leave_one_out, baseline_kind::none};
  const scale_kind scales[] = {scale_kind::none, scale_kind::group_std, scale_kind::leave_one_out_std,
                               scale_kind::batch_std};
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t n = static_cast<std::size_t>(r.integer(1, 40));
    const auto ids = testing_support::random_group_ids(r, n);
    std::vector<double> s(n);
    for (auto& x : s) x = log_uniform(-300, 300);
    if (trial % 4 == 0) s[0] = 0.0;
    std::vector<float> f(n);
    for (auto& x : f) x = static_cast<float>(log_uniform(-37, 37));
    for (auto base : baselines)
      for (auto scale : scales)
        for (bool unbiased : {true, false})
          for (auto at : {ulorl::eps_placement::add_to_std, ulorl::eps_placement::add_to_variance})
            for (auto zs : {ulorl::zero_std_rule::divide, ulorl::zero_std_rule::skip}) {
              const group_advantage_config cfg{.baseline = base,
                                               .scale = scale,
                                               .std = unbiased ? ulorl::std_estimator::unbiased : ulorl::std_estimator::biased,
                                               .eps = 1e-6,
                                               .eps_at = at,
                                               .singleton = trial % 2 ? singleton_rule::identity : singleton_rule::zero,
                                               .zero_std = zs};
              INFO("trial " << trial << " baseline " << static_cast<int>(base) << " scale " << static_cast<int>(scale)
                            << " unbiased " << unbiased << " eps_at " << static_cast<int>(at));
              require_matches_oracle(s, ids, cfg, 1e-10, 1e-300);
              require_matches_oracle(f, ids, cfg, 2e-6, 1e-44);
            }
  }
}

TEST_CASE("an advantage that is not representable is an error, and nothing is written", "[advantage][errors]") {
  const double dmax = std::numeric_limits<double>::max();
  const float fmax = std::numeric_limits<float>::max();
  // Dr. GRPO (no scaling): s - mean = max + max/3 overflows double.
  std::vector<double> s{dmax, -dmax, -dmax}, out(3, 7.0);
  const std::vector<std::int64_t> ids{0, 0, 0};
  try {
    ulorl::group_advantages(std::span<const double>(s), std::span<const std::int64_t>(ids), std::span<double>(out),
                            {.scale = scale_kind::none});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "group_advantages");
    CHECK(e.argument() == "scores");
    CHECK(e.index() == 0);
    CHECK(std::string(e.what()).find("not representable") != std::string::npos);
  }
  CHECK(out == std::vector<double>(3, 7.0));
  // The same in float: 4/3 max overflows float although it fits in double.
  std::vector<float> f{fmax, -fmax, -fmax}, fout(3, 7.0f);
  CHECK_THROWS_WITH(ulorl::group_advantages(std::span<const float>(f), std::span<const std::int64_t>(ids),
                                            std::span<float>(fout), {.scale = scale_kind::none}),
                    Catch::Contains("'scores'[0]") && Catch::Contains("float"));
  CHECK(fout == std::vector<float>(3, 7.0f));
  // A later group's overflow leaves the earlier groups unwritten too.
  std::vector<double> two{1.0, 2.0, dmax, -dmax, -dmax}, out2(5, 7.0);
  CHECK_THROWS_WITH(ulorl::group_advantages(std::span<const double>(two), std::span<const std::int64_t>(std::vector<std::int64_t>{0, 0, 1, 1, 1}),
                                            std::span<double>(out2), {.scale = scale_kind::none}),
                    Catch::Contains("'scores'[2]"));
  CHECK(out2 == std::vector<double>(5, 7.0));
  // Leave-one-out std of a tiny pool: (1e300 - 1.5e-300) / 7.07e-301 ~ 1.4e600 (eps 0, zero std skipped).
  std::vector<double> loo{1e300, 1e-300, 2e-300}, out3(3, 7.0);
  CHECK_THROWS_WITH(ulorl::group_advantages(std::span<const double>(loo), std::span<const std::int64_t>(ids),
                                            std::span<double>(out3),
                                            {.baseline = baseline_kind::leave_one_out,
                                             .scale = scale_kind::leave_one_out_std,
                                             .eps = 0.0,
                                             .zero_std = ulorl::zero_std_rule::skip}),
                    Catch::Contains("'scores'[0]") && Catch::Contains("not representable"));
  CHECK(out3 == std::vector<double>(3, 7.0));
}

TEST_CASE("leave-one-out std stays accurate when one member carries nearly all of a group's spread",
          "[advantage][numerics]") {
  // Pools whose std is 1e-3..1e-8 of the group's: subtracting the outlier's share from the group's
  // M2 would leave the rounding error of M2 amplified by up to 1e6 (an advantage off by 2e-6
  // relative here); the pool's deviations recomputed keep it within a few ulps of max |s| / D.
  const std::vector<double> tied{-78.039215686274503, -78.03921568627446, -78.039205074310303, -78.039215686274503,
                                 -78.039215648277604, -78.039215686274503};
  const std::vector<double> outlier{-99.219298160335399, -100.0, -100.0, -99.998302420192161};
  testing_support::rng r(testing_support::default_seed + 17);
  CAPTURE(testing_support::default_seed + 17);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<double> s;
    std::vector<std::int64_t> ids;
    if (trial == 0) s = tied;
    else if (trial == 1) s = outlier;
    else {
      const double base = r.uniform(-100.0, 100.0), spread = std::pow(10.0, r.uniform(-9, -3));
      const std::size_t n = static_cast<std::size_t>(r.integer(3, 12));
      for (std::size_t i = 0; i < n; ++i) s.push_back(base + spread * r.uniform(-1.0, 1.0));
      s[static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(n) - 1))] += r.uniform(1e-5, 1.0);
    }
    ids.assign(s.size(), 0);
    for (bool unbiased : {true, false})
      for (auto base : {baseline_kind::leave_one_out, baseline_kind::group_mean}) {
        const group_advantage_config cfg{.baseline = base,
                                         .scale = scale_kind::leave_one_out_std,
                                         .std = unbiased ? ulorl::std_estimator::unbiased : ulorl::std_estimator::biased,
                                         .eps = 1e-6};
        INFO("trial " << trial << " unbiased " << unbiased << " baseline " << static_cast<int>(base));
        require_matches_oracle(s, ids, cfg, 1e-13, 1e-300);
      }
  }
}
