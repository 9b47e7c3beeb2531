// Tests of ulorl/control/kl_controller.hpp: the verl rule against the oracle, bounds, checkpoint
// save/restore mid-run, rejected input.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <ulorl/control/kl_controller.hpp>

#include "catch.hpp"
#include "support/rejection.hpp"
#include "support/dynamics_oracle.hpp"
#include "support/forged_checkpoint.hpp"

namespace {
constexpr std::uint64_t kSeed = 777001;
}

TEST_CASE("adaptive KL controller follows verl's rule", "[control][kl]") {
  std::printf("test_control_kl_controller seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 50; ++trial) {
    const double beta0 = 0.2 * u(rng), target = 0.01 + 0.2 * u(rng), horizon = 100.0 + 20000.0 * u(rng);
    const std::size_t n = 1 + static_cast<std::size_t>(u(rng) * 300);
    std::vector<double> kl(n);
    std::vector<long> steps(n);
    for (std::size_t i = 0; i < n; ++i) {
      kl[i] = trial % 5 == 0 ? -0.05 * u(rng) : 0.5 * target * u(rng) * 4.0;  // includes negative k1 estimates
      steps[i] = static_cast<long>(u(rng) * 1024);
    }
    const auto want = dynamics_oracle::kl_adaptive(beta0, target, horizon, kl, steps);
    ulorl::kl_controller ctl({.type = ulorl::kl_control_type::adaptive, .init_coef = beta0, .target_kl = target, .horizon = horizon});
    for (std::size_t i = 0; i < n; ++i) {
      const double v = ctl.update(kl[i], steps[i]);
      REQUIRE(v == Approx(want[i]).epsilon(1e-13));
      CHECK(v == ctl.value());
      const double e = std::clamp(kl[i] / target - 1.0, -0.2, 0.2);
      CHECK(ctl.state().last_error == Approx(e).epsilon(1e-15).margin(1e-300));
    }
    CHECK(ctl.state().updates == n);
  }
}

TEST_CASE("KL controller properties", "[control][kl][property]") {
  ulorl::kl_controller_config c{.type = ulorl::kl_control_type::adaptive, .init_coef = 0.05, .target_kl = 0.1, .horizon = 1000};
  SECTION("KL above target raises beta, below lowers it, at target keeps it") {
    ulorl::kl_controller a(c), b(c), d(c);
    CHECK(a.update(0.3, 64) > 0.05);
    CHECK(b.update(0.01, 64) < 0.05);
    CHECK(d.update(0.1, 64) == 0.05);
  }
  SECTION("the error is clipped at +-0.2: beyond 1.2 x target the step is the same") {
    ulorl::kl_controller a(c), b(c);
    CHECK(a.update(0.2, 100) == b.update(50.0, 100));
    CHECK(a.value() == Approx(0.05 * (1.0 + 0.2 * 100 / 1000.0)));
  }
  SECTION("n_steps = 0 leaves beta unchanged") {
    ulorl::kl_controller a(c);
    CHECK(a.update(7.0, 0) == 0.05);
  }
  SECTION("fixed never changes") {
    ulorl::kl_controller f({.type = ulorl::kl_control_type::fixed, .init_coef = 0.001});
    for (int i = 0; i < 100; ++i) CHECK(f.update(0.01 * i, 512) == 0.001);
  }
  SECTION("bounds clamp beta, including verl's negative case n_steps > horizon / 0.2") {
    auto cb = c;
    cb.min_coef = 0.04;
    cb.max_coef = 0.06;
    ulorl::kl_controller a(cb);
    for (int i = 0; i < 50; ++i) CHECK(a.update(10.0, 512) <= 0.06);
    CHECK(a.value() == 0.06);
    for (int i = 0; i < 50; ++i) CHECK(a.update(0.0, 512) >= 0.04);
    CHECK(a.value() == 0.04);
    ulorl::kl_controller z(c);
    CHECK(z.update(0.0, 6000) == 0.0);  // 1 - 0.2 * 6 < 0: clamped at min_coef = 0
    const auto want = dynamics_oracle::kl_adaptive(0.05, 0.1, 1000, {0.0}, {6000});
    CHECK(want[0] == 0.0);
  }
}

TEST_CASE("KL controller save/restore mid-run behaves identically", "[control][kl][checkpoint]") {
  std::mt19937_64 rng(kSeed + 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  ulorl::kl_controller a({.type = ulorl::kl_control_type::adaptive, .init_coef = 0.123, .target_kl = 0.07, .horizon = 3333, .min_coef = 1e-4, .max_coef = 1.0});
  std::vector<double> kl(200);
  std::vector<long> n(200);
  for (std::size_t i = 0; i < 200; ++i) {
    kl[i] = 0.3 * u(rng);
    n[i] = static_cast<long>(u(rng) * 900);
  }
  for (std::size_t i = 0; i < 77; ++i) a.update(kl[i], n[i]);
  const auto bytes = a.save();
  auto b = ulorl::kl_controller::restore(bytes);
  CHECK(b.state().coef == a.state().coef);
  CHECK(b.state().updates == 77);
  CHECK(b.config().max_coef == 1.0);
  for (std::size_t i = 77; i < 200; ++i) REQUIRE(a.update(kl[i], n[i]) == b.update(kl[i], n[i]));  // bit-identical
  CHECK(a.save() == b.save());

  // The default max_coef (kl_coef_limit) and -0.0 round-trip too.
  ulorl::kl_controller f({.type = ulorl::kl_control_type::fixed, .init_coef = 0.0});
  f.update(-0.0, 0);
  const auto fb = ulorl::kl_controller::restore(f.save());
  CHECK(fb.config().max_coef == 1e6);
  CHECK(std::signbit(fb.state().last_kl));
}

TEST_CASE("KL controller rejects bad configuration, input and checkpoints", "[control][kl][error]") {
  using ulorl::kl_control_type;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  CHECK(arg_of([&] { ulorl::kl_controller k({.type = kl_control_type::adaptive, .horizon = 0}); }) == "horizon");
  CHECK(arg_of([&] { ulorl::kl_controller k({.type = kl_control_type::adaptive, .horizon = -5}); }) == "horizon");
  CHECK(arg_of([&] { ulorl::kl_controller k({.type = kl_control_type::adaptive, .target_kl = 0}); }) == "target_kl");
  CHECK(arg_of([&] { ulorl::kl_controller k({.type = kl_control_type::adaptive, .target_kl = nan}); }) == "target_kl");
  CHECK(arg_of([&] { ulorl::kl_controller k({.type = kl_control_type::adaptive, .max_error = 0}); }) == "max_error");
  CHECK(arg_of([&] { ulorl::kl_controller k({.init_coef = -1}); }) == "init_coef");
  CHECK(arg_of([&] { ulorl::kl_controller k({.init_coef = inf}); }) == "init_coef");
  CHECK(arg_of([&] { ulorl::kl_controller k({.init_coef = 0.5, .max_coef = 0.1}); }) == "init_coef");
  CHECK(arg_of([&] { ulorl::kl_controller k({.min_coef = 0.2, .max_coef = 0.1}); }) == "max_coef");
  CHECK(arg_of([&] { ulorl::kl_controller k({.type = static_cast<kl_control_type>(9)}); }) == "type");
  // Documented limits: max_coef finite and <= 1e6, horizon >= 1e-6, max_error in (0, 1].
  CHECK(arg_of([&] { ulorl::kl_controller k({.max_coef = inf}); }) == "max_coef");
  CHECK(arg_of([&] { ulorl::kl_controller k({.max_coef = 1.0000001e6}); }) == "max_coef");
  CHECK_NOTHROW(ulorl::kl_controller({.init_coef = 1e6, .min_coef = 1e6, .max_coef = 1e6}));
  CHECK(arg_of([&] { ulorl::kl_controller k({.type = kl_control_type::adaptive, .horizon = 0.99e-6}); }) == "horizon");
  CHECK(arg_of([&] { ulorl::kl_controller k({.type = kl_control_type::adaptive, .horizon = inf}); }) == "horizon");
  CHECK_NOTHROW(ulorl::kl_controller({.type = kl_control_type::adaptive, .horizon = 1e-6}));
  CHECK(arg_of([&] { ulorl::kl_controller k({.type = kl_control_type::adaptive, .max_error = 1.5}); }) == "max_error");
  CHECK_NOTHROW(ulorl::kl_controller({.type = kl_control_type::adaptive, .max_error = 1.0}));
  // Fixed ignores the adaptive-only fields (the golden fixed case passes null for them).
  CHECK_NOTHROW(ulorl::kl_controller({.type = kl_control_type::fixed, .target_kl = nan, .horizon = 0}));

  ulorl::kl_controller k({.type = kl_control_type::adaptive, .init_coef = 0.1});
  CHECK(arg_of([&] { k.update(nan, 1); }) == "current_kl");
  CHECK(arg_of([&] { k.update(inf, 1); }) == "current_kl");
  CHECK(arg_of([&] { k.update(0.1, -1); }) == "n_steps");
  CHECK(k.state().updates == 0);  // rejected updates change nothing
  CHECK(k.value() == 0.1);

  auto bytes = k.save();
  auto bad = bytes;
  bad[0] = std::byte{'X'};
  CHECK_THROWS_AS(ulorl::kl_controller::restore(bad), ulorl::error);
  bad = bytes;
  bad.pop_back();
  CHECK_THROWS_AS(ulorl::kl_controller::restore(bad), ulorl::error);
  bad = bytes;
  bad.push_back(std::byte{0});
  CHECK_THROWS_AS(ulorl::kl_controller::restore(bad), ulorl::error);
  CHECK_THROWS_AS(ulorl::kl_controller::restore({}), ulorl::error);
  // Every bit flip and truncation, wrong kinds and versions, and each field out of range:
  // tests/test_control_checkpoint.cpp.
}

TEST_CASE("KL controller rejects an unknown controller type in its config and its checkpoint", "[control][kl][error][enum]") {
  using ulorl::kl_control_type;
  const ulorl::kl_controller_config bad{.type = static_cast<kl_control_type>(9)};
  REQUIRE_THROWS_WITH(ulorl::kl_controller(bad),
                      Catch::Equals("ulorl::kl_controller: argument 'type' = 9: unknown enum value (known: 0, 1)"));
  require_unknown_enum([&] { (void)ulorl::initial_state(bad); }, "kl_controller", "type", 9);
  // The transition rejects it before computing anything: the caller's state is unchanged.
  ulorl::kl_controller k({.type = kl_control_type::adaptive, .init_coef = 0.1});
  k.update(0.3, 64);
  ulorl::kl_controller_state s = k.state();
  require_unknown_enum([&] { s = ulorl::kl_update({.type = static_cast<kl_control_type>(2), .init_coef = 0.1}, s, 0.3, 64); },
                       "kl_controller::update", "type", 2);
  CHECK(s.coef == k.state().coef);
  CHECK(s.updates == 1);
  CHECK(s.last_kl == 0.3);
  // A checkpoint whose type byte (the payload's first) is unknown, with a valid checksum.
  const auto forged = with_byte(k.save(), payload_start, 200);
  auto restored = k;
  require_unknown_enum([&] { restored = ulorl::kl_controller::restore(forged); }, "kl_controller::restore", "type", 200);
  CHECK(restored.save() == k.save());
}

TEST_CASE("KL coefficient stays finite and bounded under extreme updates", "[control][kl][limits]") {
  // The largest batch count the API takes: with verl's defaults (target 0.1, horizon 1e4, clip 0.2)
  // one update multiplies beta by 1 + 0.2 * 9.22e18 / 1e4 ~ 1.8e14, so 0.001 reaches the documented
  // default max_coef 1e6 at once and stays there; a KL below target then drives the multiplier
  // negative and beta to min_coef 0. Unbounded, 22 such updates make beta inf, then NaN.
  constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
  ulorl::kl_controller k({.type = ulorl::kl_control_type::adaptive, .init_coef = 0.001});
  for (int i = 0; i < 22; ++i) {
    const double v = k.update(10.0, big);
    REQUIRE(std::isfinite(v));
    REQUIRE(v == 1e6);
  }
  CHECK_NOTHROW(ulorl::kl_controller::restore(k.save()));
  for (int i = 0; i < 22; ++i) REQUIRE(k.update(0.0, big) == 0.0);
  CHECK_NOTHROW(ulorl::kl_controller::restore(k.save()));
  // A horizon so small that n_steps / horizon overflows is rejected, naming the argument (with
  // init_coef 0 it would give 0 * inf = NaN on the first update).
  try {
    ulorl::kl_controller z({.type = ulorl::kl_control_type::adaptive, .init_coef = 0.0, .horizon = 1e-310});
    const double v = z.update(0.2, 64);
    FAIL("horizon 1e-310 accepted; first update gave beta = " << v);
  } catch (const ulorl::error& e) {
    CHECK(e.argument() == "horizon");
  }
}
