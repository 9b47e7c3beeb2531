// Tests for ulorl/advantage/group_advantage.hpp against the independent oracle.
#include <ulorl/advantage/group_advantage.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "catch.hpp"
#include "support/advantage_oracle.hpp"
#include "support/random.hpp"

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

TEST_CASE("output may alias the scores", "[advantage]") {
  std::vector<double> s{1, 0, 0, 1, 1, 0};
  const auto expected = oracle::grpo(s, {0, 0, 0, 0, 0, 0}, 1e-6, true, true, false);
  ulorl::group_advantages(std::span<const double>(s), 6, std::span<double>(s));
  require_close(s, expected, 1e-14, 0);
}
