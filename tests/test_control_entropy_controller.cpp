// Tests of ulorl/control/entropy_controller.hpp: both rules against the oracle, closed-loop
// steering of a toy entropy model, bounds, checkpoint save/restore mid-run, rejected input.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <ulorl/control/entropy_controller.hpp>
#include <ulorl/presets/trl.hpp>

#include "catch.hpp"
#include "support/rejection.hpp"
#include "support/dynamics_oracle.hpp"
#include "support/forged_checkpoint.hpp"

namespace {
constexpr std::uint64_t kSeed = 4242;

ulorl::entropy_controller_config to_config(const dynamics_oracle::entropy_params& p) {
  return {.rule = p.proportional ? ulorl::entropy_control_rule::proportional : ulorl::entropy_control_rule::step,
          .target_entropy = p.target, .init_coef = p.c0, .step_up = p.up, .step_down = p.down, .gain = p.gain,
          .tolerance = p.tol, .min_coef = p.lo, .max_coef = p.hi, .gate_above_target = p.gate};
}
}  // namespace

TEST_CASE("entropy controller matches the oracle for both rules", "[control][entropy]") {
  std::printf("test_control_entropy_controller seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 60; ++trial) {
    dynamics_oracle::entropy_params p;
    p.proportional = trial % 2 == 1;
    p.target = 0.05 + 0.5 * u(rng);
    p.up = 0.01 * u(rng);
    p.down = 0.01 * u(rng);
    p.gain = 0.2 * u(rng);
    p.tol = trial % 3 == 0 ? 0.0 : 0.05 * u(rng);
    p.lo = trial % 4 == 0 ? 0.0 : 0.001 * u(rng);
    p.hi = p.lo + 0.05 * u(rng);
    p.c0 = p.lo + (p.hi - p.lo) * u(rng);
    p.gate = trial % 5 != 0;
    std::vector<double> h(1 + static_cast<std::size_t>(u(rng) * 200));
    for (auto& x : h) x = u(rng) < 0.1 ? p.target : 1.2 * u(rng);  // some exactly at target
    const auto want = dynamics_oracle::entropy_run(p, h);
    ulorl::entropy_controller c(to_config(p));
    for (std::size_t i = 0; i < h.size(); ++i) {
      INFO("trial " << trial << " step " << i);
      REQUIRE(c.bonus(h[i]) == want[i].first);
      REQUIRE(c.update(h[i]) == Approx(want[i].second).epsilon(1e-14).margin(1e-300));
      CHECK(c.value() >= p.lo);
      CHECK(c.value() <= p.hi);
    }
    CHECK(c.state().updates == h.size());
  }
}

TEST_CASE("entropy controller steers a toy policy's entropy to the target", "[control][entropy][property]") {
  // Toy closed loop: without a bonus the policy sharpens (entropy decays by 3% a step); the bonus
  // pushes it back up in proportion to alpha. The step rule settles into a small limit cycle around
  // the target, the proportional (integral) rule converges onto it.
  for (auto rule : {ulorl::entropy_control_rule::step, ulorl::entropy_control_rule::proportional}) {
    ulorl::entropy_controller c({.rule = rule, .target_entropy = 0.3, .step_up = 0.002, .step_down = 0.002,
                                 .gain = 0.005, .max_coef = 0.2, .gate_above_target = false});
    double h = 1.0, no_control = 1.0, tail_sum = 0.0, tail_dev = 0.0;
    for (int k = 0; k < 3000; ++k) {
      const double alpha = c.bonus(h);
      c.update(h);
      h = h * 0.97 + 2.0 * alpha;
      no_control *= 0.97;
      if (k >= 2500) {
        tail_sum += h;
        tail_dev = std::max(tail_dev, std::fabs(h - 0.3));
      }
    }
    INFO("rule " << static_cast<int>(rule) << " final entropy " << h << " max deviation " << tail_dev);
    CHECK(no_control < 1e-10);
    CHECK(std::fabs(tail_sum / 500.0 - 0.3) < 0.02);
    CHECK(tail_dev < (rule == ulorl::entropy_control_rule::step ? 0.05 : 1e-6));
  }
}

TEST_CASE("entropy controller step details", "[control][entropy]") {
  ulorl::entropy_controller c({.target_entropy = 0.2, .init_coef = 0.01, .step_up = 0.005, .step_down = 0.003,
                               .tolerance = 0.01, .max_coef = 0.012});
  CHECK(c.update(0.195) == 0.01);              // inside the dead band
  CHECK(c.update(0.1) == Approx(0.012));       // +0.005, clamped at max 0.012
  CHECK(c.update(0.5) == Approx(0.009));       // -0.003
  CHECK(c.bonus(0.5) == 0.0);                  // gated above target
  CHECK(c.bonus(0.2) == Approx(0.009));        // at target: applied
  for (int i = 0; i < 10; ++i) c.update(0.9);
  CHECK(c.value() == 0.0);                     // clamped at min 0
  CHECK(c.state().last_entropy == 0.9);
}

TEST_CASE("entropy controller save/restore mid-run behaves identically", "[control][entropy][checkpoint]") {
  std::mt19937_64 rng(kSeed + 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (auto rule : {ulorl::entropy_control_rule::step, ulorl::entropy_control_rule::proportional}) {
    ulorl::entropy_controller a({.rule = rule, .target_entropy = 0.25, .init_coef = 0.003, .tolerance = 0.01,
                                 .min_coef = 0.001, .max_coef = 0.05, .gate_above_target = false});
    std::vector<double> h(300);
    for (auto& x : h) x = 0.5 * u(rng);
    for (std::size_t i = 0; i < 123; ++i) a.update(h[i]);
    auto b = ulorl::entropy_controller::restore(a.save());
    CHECK_FALSE(b.config().gate_above_target);
    for (std::size_t i = 123; i < h.size(); ++i) {
      REQUIRE(a.bonus(h[i]) == b.bonus(h[i]));
      REQUIRE(a.update(h[i]) == b.update(h[i]));
    }
    CHECK(a.save() == b.save());
  }
}

TEST_CASE("entropy controller rejects bad configuration, input and checkpoints", "[control][entropy][error]") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  using cfg = ulorl::entropy_controller_config;
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.target_entropy = -0.1}); }) == "target_entropy");
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.target_entropy = nan}); }) == "target_entropy");
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.step_up = -1}); }) == "step_up");
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.step_down = inf}); }) == "step_down");
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.gain = -1}); }) == "gain");
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.tolerance = -1}); }) == "tolerance");
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.min_coef = -1}); }) == "min_coef");
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.max_coef = inf}); }) == "max_coef");
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.min_coef = 0.2, .max_coef = 0.1}); }) == "max_coef");
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.init_coef = 2e6}); }) == "init_coef");
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.init_coef = nan}); }) == "init_coef");
  CHECK(arg_of([&] { ulorl::entropy_controller c(cfg{.rule = static_cast<ulorl::entropy_control_rule>(7)}); }) == "rule");
  ulorl::entropy_controller c;
  CHECK(arg_of([&] { c.update(nan); }) == "entropy");
  CHECK(arg_of([&] { (void)c.bonus(inf); }) == "entropy");
  CHECK(c.state().updates == 0);
  // Documented limits: every value's magnitude <= 1e6.
  CHECK(arg_of([&] { ulorl::entropy_controller e(cfg{.target_entropy = 1.5e6}); }) == "target_entropy");
  CHECK(arg_of([&] { ulorl::entropy_controller e(cfg{.gain = 2e6}); }) == "gain");
  CHECK(arg_of([&] { ulorl::entropy_controller e(cfg{.max_coef = 2e6}); }) == "max_coef");
  CHECK(arg_of([&] { ulorl::entropy_controller e(cfg{.tolerance = 2e6}); }) == "tolerance");
  CHECK_NOTHROW(ulorl::entropy_controller(cfg{.target_entropy = 1e6, .init_coef = 1e6, .step_up = 1e6, .step_down = 1e6,
                                              .gain = 1e6, .tolerance = 1e6, .min_coef = 1e6, .max_coef = 1e6}));
  auto bytes = c.save();
  bytes.pop_back();
  CHECK_THROWS_AS(ulorl::entropy_controller::restore(bytes), ulorl::error);
  // Every bit flip and truncation, wrong kinds and versions, and each field out of range:
  // tests/test_control_checkpoint.cpp.
}

TEST_CASE("entropy controller rejects an unknown rule in its config and its checkpoint",
          "[control][entropy][error][enum]") {
  using ulorl::entropy_control_rule;
  const ulorl::entropy_controller_config bad{.rule = static_cast<entropy_control_rule>(7)};
  REQUIRE_THROWS_WITH(ulorl::entropy_controller(bad),
                      Catch::Equals("ulorl::entropy_controller: argument 'rule' = 7: unknown enum value (known: 0, 1)"));
  require_unknown_enum([&] { (void)ulorl::initial_state(bad); }, "entropy_controller", "rule", 7);
  // The transition and the bonus reject it before computing anything: the caller's state is unchanged.
  ulorl::entropy_controller c({.rule = entropy_control_rule::proportional, .init_coef = 0.01});
  c.update(0.1);
  ulorl::entropy_controller_state s = c.state();
  const ulorl::entropy_controller_config bad2{.rule = static_cast<entropy_control_rule>(2), .init_coef = 0.01};
  require_unknown_enum([&] { s = ulorl::entropy_update(bad2, s, 0.1); }, "entropy_controller::update", "rule", 2);
  require_unknown_enum([&] { (void)ulorl::entropy_bonus(bad2, s, 0.1); }, "entropy_controller::bonus", "rule", 2);
  CHECK(s.coef == c.state().coef);
  CHECK(s.updates == 1);
  CHECK(s.last_entropy == 0.1);
  // A checkpoint whose rule byte (the payload's first) is unknown, with a valid checksum.
  const auto forged = with_byte(c.save(), payload_start, 2);
  auto restored = c;
  require_unknown_enum([&] { restored = ulorl::entropy_controller::restore(forged); }, "entropy_controller::restore", "rule",
                       2);
  CHECK(restored.save() == c.save());
}

TEST_CASE("entropy coefficient stays finite: degenerate magnitudes are rejected", "[control][entropy][limits]") {
  // target 1e308 and entropy -1e308 make the error target - H overflow to inf, and gain 0 times inf
  // is NaN, and a NaN coefficient stays NaN. Both magnitudes are out of range.
  CHECK(arg_of([&] {
          ulorl::entropy_controller c({.rule = ulorl::entropy_control_rule::proportional, .target_entropy = 1e308,
                                       .gain = 0.0});
          const double v = c.update(-1e308);
          INFO("coefficient after the update: " << v);
        }) == "target_entropy");
  ulorl::entropy_controller d({.rule = ulorl::entropy_control_rule::proportional});
  CHECK(arg_of([&] { d.update(-1e308); }) == "entropy");
  CHECK(arg_of([&] { (void)d.bonus(2e6); }) == "entropy");
  CHECK(d.state().updates == 0);
  // At the documented limits (1e6 for magnitudes, gains and coefficients) every result is finite
  // and clamped: gain 1e6 times an error of 2e6 is 2e12, far from overflow.
  ulorl::entropy_controller e({.rule = ulorl::entropy_control_rule::proportional, .target_entropy = 1e6,
                               .gain = 1e6, .min_coef = 0.0, .max_coef = 1e6});
  CHECK(e.update(-1e6) == 1e6);
  CHECK(e.update(1e6) == 1e6);  // at the target: no change
  ulorl::entropy_controller g({.rule = ulorl::entropy_control_rule::proportional, .target_entropy = 0.0,
                               .gain = 1e6, .min_coef = 0.0, .max_coef = 1e6});
  CHECK(g.update(1e6) == 0.0);
  CHECK_NOTHROW(ulorl::entropy_controller::restore(e.save()));
}

// ---- TRL's adaptive entropy coefficient (presets::trl::adaptive_entropy) ------------------------

namespace {
//! Golden README §4.11, as written there: (applied, value after the step) for each step's entropy.
std::vector<std::pair<double, double>> trl_adaptive_oracle(double c, double target, double delta, double lo, double hi,
                                                           const std::vector<double>& h) {
  std::vector<std::pair<double, double>> out;
  double h_prev = std::numeric_limits<double>::infinity();
  for (double e : h) {
    const double applied = h_prev <= target ? c : 0.0;
    c = e <= target ? std::min(c + delta, hi) : std::max(c - delta, lo);
    h_prev = e;
    out.emplace_back(applied, c);
  }
  return out;
}
}  // namespace

TEST_CASE("TRL adaptive entropy preset matches the oracle", "[control][entropy][trl]") {
  using ulorl::presets::trl::adaptive_entropy;
  constexpr auto d = adaptive_entropy();
  static_assert(d.init_coef == 0.0 && d.target_entropy == 0.2 && d.step_up == 0.005 && d.step_down == 0.005 &&
                d.min_coef == 0.0 && d.max_coef == 1.0 && d.tolerance == 0.0 && d.gate_above_target &&
                d.gate_source == ulorl::entropy_gate_source::last_update && d.raise_at_target &&
                d.rule == ulorl::entropy_control_rule::step);
  std::mt19937_64 rng(kSeed + 7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 80; ++trial) {
    const double target = trial % 4 == 0 ? 0.2 : 1.5 * u(rng), delta = trial % 3 == 0 ? 0.005 : 0.1 * u(rng);
    const double lo = trial % 2 == 0 ? 0.0 : 0.01 * u(rng), hi = lo + (trial % 5 == 0 ? 1.0 : 0.2 * u(rng));
    // A fifth of the trials start outside [lo, hi] (TRL accepts it: each update bounds one side).
    const double c0 = trial % 5 == 1 ? hi + 0.3 * u(rng) : trial % 5 == 2 ? lo - 0.05 * u(rng) : lo + (hi - lo) * u(rng);
    std::vector<double> h(1 + static_cast<std::size_t>(u(rng) * 150));
    for (auto& x : h) x = u(rng) < 0.15 ? target : 2.0 * target * u(rng) + (u(rng) < 0.05 ? 1.0 : 0.0);
    const auto want = trl_adaptive_oracle(c0, target, delta, lo, hi, h);
    ulorl::entropy_controller c(adaptive_entropy({.entropy_coef = c0, .entropy_target = target, .entropy_coef_delta = delta,
                                                  .entropy_coef_min = lo, .entropy_coef_max = hi}));
    for (std::size_t i = 0; i < h.size(); ++i) {
      INFO("trial " << trial << " step " << i << " H " << h[i] << " target " << target);
      REQUIRE(c.bonus() == want[i].first);
      REQUIRE(c.update(h[i]) == Approx(want[i].second).epsilon(1e-14).margin(1e-300));
    }
  }
}

TEST_CASE("TRL adaptive entropy: first step ungated-closed, tie at the target, gate on the last update",
          "[control][entropy][trl]") {
  ulorl::entropy_controller c(ulorl::presets::trl::adaptive_entropy({.entropy_coef = 0.1}));
  CHECK(c.bonus() == 0.0);               // H_prev = +inf before the first step
  CHECK(c.update(0.2) == Approx(0.105)); // H == target raises c
  CHECK(c.bonus() == Approx(0.105));     // last H 0.2 <= target: applied
  CHECK(c.update(0.3) == Approx(0.1));
  CHECK(c.bonus() == 0.0);               // last H 0.3 > target: gated
  CHECK(c.value() == Approx(0.1));
  // The step rule without raise_at_target holds c at the target (Skywork-OR1).
  ulorl::entropy_controller s({.target_entropy = 0.2, .init_coef = 0.1, .max_coef = 1.0});
  CHECK(s.update(0.2) == 0.1);
  // With a dead band, raise_at_target moves c at its lower edge H == target - tolerance only.
  ulorl::entropy_controller b({.target_entropy = 0.5, .init_coef = 0.1, .tolerance = 0.25, .max_coef = 1.0,
                               .raise_at_target = true});
  CHECK(b.update(0.25) == Approx(0.105));
  CHECK(b.update(0.26) == Approx(0.105));
  CHECK(b.update(0.75) == Approx(0.105));  // upper edge: inside the band
  CHECK(b.update(0.76) == Approx(0.1));
  // Without a gate both bonus overloads give c, whatever the gate source.
  for (auto src : {ulorl::entropy_gate_source::current_batch, ulorl::entropy_gate_source::last_update}) {
    ulorl::entropy_controller g({.init_coef = 0.05, .gate_above_target = false, .gate_source = src});
    CHECK(g.bonus() == 0.05);
    CHECK(g.bonus(0.9) == 0.05);
  }
  // Each gate source refuses the overload that does not read its entropy, leaving the state alone.
  CHECK(arg_of([&] { (void)c.bonus(0.1); }) == "gate_source");
  ulorl::entropy_controller k({.init_coef = 0.05});
  CHECK(arg_of([&] { (void)k.bonus(); }) == "gate_source");
  CHECK(k.state().updates == 0);
  CHECK(c.state().updates == 2);
}

TEST_CASE("TRL adaptive entropy: save/restore mid-run, version 1 payloads, rejected options",
          "[control][entropy][trl][checkpoint]") {
  std::mt19937_64 rng(kSeed + 8);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  ulorl::entropy_controller a(ulorl::presets::trl::adaptive_entropy({.entropy_coef = 0.02, .entropy_coef_max = 0.1}));
  std::vector<double> h(200);
  for (auto& x : h) x = u(rng) < 0.1 ? 0.2 : 0.4 * u(rng);
  for (std::size_t i = 0; i < 77; ++i) a.update(h[i]);
  auto b = ulorl::entropy_controller::restore(a.save());
  CHECK(b.config().gate_source == ulorl::entropy_gate_source::last_update);
  CHECK(b.config().raise_at_target);
  for (std::size_t i = 77; i < h.size(); ++i) {
    REQUIRE(a.bonus() == b.bonus());
    REQUIRE(a.update(h[i]) == b.update(h[i]));
  }
  CHECK(a.save() == b.save());

  // Payload version 1 (no gate_source / raise_at_target bytes) restores as the Skywork-OR1 defaults.
  ulorl::entropy_controller v({.target_entropy = 0.3, .init_coef = 0.01, .max_coef = 0.05});
  v.update(0.1);
  std::vector<std::byte> v1;
  const auto at = ulorl::detail::begin_checkpoint(v1, ulorl::checkpoint_kind::entropy_controller, 1);
  {
    ulorl::detail::byte_writer w(v1);
    const auto& c = v.config();
    w.u8(0);
    for (double x : {c.target_entropy, c.init_coef, c.step_up, c.step_down, c.gain, c.tolerance, c.min_coef, c.max_coef})
      w.f64(x);
    w.boolean(c.gate_above_target);
    w.f64(v.state().coef);
    w.u64(v.state().updates);
    w.f64(v.state().last_entropy);
  }
  ulorl::detail::finish_checkpoint(v1, at);
  const auto r1 = ulorl::entropy_controller::restore(v1);
  CHECK(r1.config().gate_source == ulorl::entropy_gate_source::current_batch);
  CHECK_FALSE(r1.config().raise_at_target);
  CHECK(r1.save() == v.save());  // written back as version 2

  // An unknown gate source in the configuration and in a checkpoint (payload byte 66).
  const ulorl::entropy_controller_config bad{.gate_source = static_cast<ulorl::entropy_gate_source>(5)};
  require_unknown_enum([&] { ulorl::entropy_controller e(bad); }, "entropy_controller", "gate_source", 5);
  const auto forged = with_byte(a.save(), payload_start + 66, 2);
  require_unknown_enum([&] { (void)ulorl::entropy_controller::restore(forged); }, "entropy_controller::restore",
                       "gate_source", 2);
  CHECK_THROWS_AS(ulorl::entropy_controller::restore(with_byte(a.save(), payload_start + 67, 2)), ulorl::error);
  // An unsupported payload version (3) is refused.
  CHECK(arg_of([&] { (void)ulorl::entropy_controller::restore(with_byte(a.save(), 12, 3)); }) == "bytes");
  // The preset's options go through the controller's checks.
  CHECK(arg_of([&] {
          ulorl::entropy_controller e(ulorl::presets::trl::adaptive_entropy({.entropy_coef = 2e6}));
        }) == "init_coef");
  CHECK(arg_of([&] {
          ulorl::entropy_controller e(ulorl::presets::trl::adaptive_entropy({.entropy_coef_delta = -0.1}));
        }) == "step_up");
  CHECK(arg_of([&] {
          ulorl::entropy_controller e(ulorl::presets::trl::adaptive_entropy({.entropy_target = std::nan("")}));
        }) == "target_entropy");
  CHECK(arg_of([&] {
          ulorl::entropy_controller e(
              ulorl::presets::trl::adaptive_entropy({.entropy_coef_min = 0.5, .entropy_coef_max = 0.4}));
        }) == "max_coef");
  ulorl::entropy_controller t(ulorl::presets::trl::adaptive_entropy());
  CHECK(arg_of([&] { t.update(std::nan("")); }) == "entropy");
  CHECK(t.state().updates == 0);
}

TEST_CASE("entropy controller: a start outside [min_coef, max_coef] moves one bounded step per update and checkpoints",
          "[control][entropy][trl][checkpoint]") {
  // TRL: raise -> min(c + delta, max), lower -> max(c - delta, min); only the side moved towards is bounded.
  ulorl::entropy_controller a(ulorl::presets::trl::adaptive_entropy(
      {.entropy_coef = 0.5, .entropy_target = 0.2, .entropy_coef_delta = 0.125, .entropy_coef_min = 0.0, .entropy_coef_max = 0.25}));
  CHECK(a.update(0.3) == 0.375);  // lowering from above max_coef: max(0.5 - 0.125, 0) = 0.375 > max_coef
  const auto mid = ulorl::entropy_controller::restore(a.save());
  CHECK(mid.value() == 0.375);
  CHECK(a.update(0.1) == 0.25);  // a raise is bounded by max_coef: min(0.5, 0.25)
  CHECK(a.update(0.3) == 0.125);
  ulorl::entropy_controller below({.target_entropy = 0.2, .init_coef = -0.25, .step_up = 0.125, .step_down = 0.125,
                                   .min_coef = 0.0, .max_coef = 1.0});
  CHECK(below.update(0.3) == 0.0);    // lowering from below min_coef is bounded by min_coef
  ulorl::entropy_controller below2({.target_entropy = 0.2, .init_coef = -0.25, .step_up = 0.125, .step_down = 0.125,
                                    .min_coef = 0.0, .max_coef = 1.0});
  CHECK(below2.update(0.1) == -0.125);  // a raise from below min_coef stays below it
  CHECK(ulorl::entropy_controller::restore(below2.save()).value() == -0.125);
  // A checkpoint's coefficient outside [min(init, min), max(init, max)] is refused.
  ulorl::entropy_controller_state s = a.state();
  s.coef = 0.75;
  CHECK(arg_of([&] { ulorl::validate(a.config(), s, "entropy_controller::restore"); }) == "state.coef");
  s.coef = -0.01;
  CHECK(arg_of([&] { ulorl::validate(a.config(), s, "entropy_controller::restore"); }) == "state.coef");
}
