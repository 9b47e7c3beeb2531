// Tests of ulorl/control/reference_reset.hpp (ProRL reference resets): every trigger by hand, random
// call sequences against the history-replaying oracle, save/restore at every point of a run,
// rejected configuration and input.
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <ulorl/control/reference_reset.hpp>

#include "catch.hpp"
#include "support/rejection.hpp"
#include "support/dynamics_oracle.hpp"
#include "support/forged_checkpoint.hpp"

namespace {
constexpr std::uint64_t kSeed = 99173;
using ulorl::reset_trigger;

int code(const ulorl::reset_action& a) {
  if (a.trigger == reset_trigger::none) return 0;
  return static_cast<int>(a.trigger) * 10 + (a.reset_reference ? 1 : 2);
}

ulorl::reference_reset_config to_config(const dynamics_oracle::reset_params& p) {
  return {.every_n_steps = p.every, .on_plateau = p.plateau, .patience = p.patience, .min_delta = p.min_delta,
          .higher_is_better = p.higher, .on_drop = p.drop, .max_drop = p.max_drop, .on_kl_share = p.kl,
          .max_kl_share = p.max_share, .kl_share_patience = p.kl_patience, .cooldown_steps = p.cooldown,
          .manual_ignores_cooldown = p.manual_ignores};
}

ulorl::reset_action apply(ulorl::reference_reset_policy& pol, const dynamics_oracle::call& c) {
  switch (c.kind) {
    case 's': return pol.observe_step(c.step, c.a, c.b);
    case 'v': return pol.observe_validation(c.step, c.a);
    case 'm': return pol.request_manual(c.step);
  }
  throw std::logic_error(std::string("unknown call kind ") + c.kind);
}

std::vector<dynamics_oracle::call> random_calls(std::mt19937_64& rng, std::size_t n) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<dynamics_oracle::call> calls;
  long step = 0;
  double level = 0.5;
  for (std::size_t i = 0; i < n; ++i) {
    const double k = u(rng);
    if (k < 0.7) {
      step += 1;
      // KL term sometimes dominating the (noisy, signed) policy term.
      const double kl = u(rng) < 0.3 ? 0.5 + u(rng) : 0.05 * u(rng);
      calls.push_back({'s', step, kl, (u(rng) - 0.5) * 0.8});
    } else if (k < 0.97) {
      // Validation: a slow random walk with occasional plateaus (quantised) and drops.
      level += u(rng) < 0.1 ? -0.2 : 0.02 * (u(rng) - 0.4);
      const double metric = std::round(level * 50.0) / 50.0;
      calls.push_back({'v', step, metric, 0.0});
    } else {
      calls.push_back({'m', step, 0.0, 0.0});
    }
  }
  return calls;
}
}  // namespace

TEST_CASE("reference reset: periodic trigger and cooldown", "[control][reset]") {
  ulorl::reference_reset_policy p({.every_n_steps = 10, .on_plateau = false});
  std::vector<long> resets;
  for (long s = 1; s <= 35; ++s) {
    const auto a = p.observe_step(s, 0.0, 1.0);
    if (a.reset_reference) {
      resets.push_back(s);
      CHECK(a.trigger == reset_trigger::periodic);
      CHECK(a.reset_optimizer);
      CHECK(a.event.step == s);
      CHECK(a.event.value == 10.0);
      CHECK(a.event.index == resets.size());
    }
  }
  CHECK(resets == std::vector<long>{10, 20, 30});
  CHECK(p.state().resets == 3);
  // A manual reset moves the periodic anchor.
  CHECK(p.request_manual(36).reset_reference);
  CHECK_FALSE(p.observe_step(45, 0, 1).reset_reference);
  CHECK(p.observe_step(46, 0, 1).reset_reference);

  // Cooldown: manual requests inside it are suppressed and not remembered.
  ulorl::reference_reset_policy q({.on_plateau = false, .cooldown_steps = 5, .reset_optimizer = false});
  auto a = q.request_manual(0);
  CHECK(a.reset_reference);
  CHECK_FALSE(a.reset_optimizer);
  a = q.request_manual(4);
  CHECK_FALSE(a.reset_reference);
  CHECK(a.suppressed_by_cooldown);
  CHECK(a.trigger == reset_trigger::manual);
  CHECK(q.cooldown_remaining() == 1);
  CHECK(q.request_manual(5).reset_reference);
  CHECK(q.state().last_event.step == 5);
  ulorl::reference_reset_policy r({.on_plateau = false, .cooldown_steps = 100, .manual_ignores_cooldown = true});
  CHECK(r.request_manual(1).reset_reference);
  CHECK(r.request_manual(2).reset_reference);
}

TEST_CASE("reference reset: plateau, drop and KL-share triggers", "[control][reset]") {
  SECTION("plateau after `patience` evaluations without an improvement above min_delta") {
    ulorl::reference_reset_policy p({.patience = 3, .min_delta = 0.01});
    CHECK(code(p.observe_validation(0, 0.50)) == 0);   // first: sets the best
    CHECK(code(p.observe_validation(10, 0.505)) == 0); // +0.005 <= min_delta: 1 stale
    CHECK(code(p.observe_validation(20, 0.52)) == 0);  // +0.02: improvement, best 0.52
    CHECK(code(p.observe_validation(30, 0.52)) == 0);  // 1
    CHECK(code(p.observe_validation(40, 0.529)) == 0); // 2
    const auto a = p.observe_validation(50, 0.3);      // 3: plateau
    CHECK(a.reset_reference);
    CHECK(a.trigger == reset_trigger::plateau);
    CHECK(a.event.value == 0.3);
    CHECK(p.state().best == 0.52);                     // kept across the reset
    CHECK(p.state().evals_without_improvement == 0);
  }
  SECTION("lower is better") {
    ulorl::reference_reset_policy p({.patience = 2, .higher_is_better = false, .on_drop = true, .max_drop = 0.1});
    p.observe_validation(0, 1.0);
    CHECK(code(p.observe_validation(1, 0.8)) == 0);    // improvement
    CHECK(code(p.observe_validation(2, 0.85)) == 0);   // worse by 0.05 <= max_drop
    CHECK(code(p.observe_validation(3, 0.95)) == 31);  // worse by 0.15: drop
    CHECK(p.state().best == 0.8);
  }
  SECTION("drop beats plateau when both fire") {
    ulorl::reference_reset_policy p({.patience = 1, .on_drop = true, .max_drop = 0.05});
    p.observe_validation(0, 0.9);
    CHECK(code(p.observe_validation(1, 0.7)) == 31);
  }
  SECTION("KL share above the threshold for kl_share_patience consecutive steps") {
    ulorl::reference_reset_policy p({.on_plateau = false, .on_kl_share = true, .max_kl_share = 0.5, .kl_share_patience = 3});
    CHECK(code(p.observe_step(1, 0.6, 0.4)) == 0);
    CHECK(code(p.observe_step(2, -0.9, 0.1)) == 0);    // |kl| counts
    CHECK(code(p.observe_step(3, 0.5, 0.5)) == 0);     // exactly 0.5 is not above: run restarts
    CHECK(code(p.observe_step(4, 1.0, 0.0)) == 0);
    CHECK(code(p.observe_step(5, 1.0, -0.1)) == 0);
    const auto a = p.observe_step(6, 3.0, 1.0);
    CHECK(a.trigger == reset_trigger::kl_share);
    CHECK(a.reset_reference);
    CHECK(a.event.value == 0.75);
    CHECK(ulorl::kl_share(0.0, 0.0) == 0.0);
  }
  SECTION("a suppressed trigger keeps counting and fires once the cooldown is over") {
    ulorl::reference_reset_policy p({.patience = 1, .cooldown_steps = 10});
    CHECK(p.request_manual(0).reset_reference);
    p.observe_validation(1, 0.5);
    auto a = p.observe_validation(2, 0.5);
    CHECK(a.suppressed_by_cooldown);
    CHECK(a.trigger == reset_trigger::plateau);
    CHECK(p.state().evals_without_improvement == 1);
    a = p.observe_validation(10, 0.4);
    CHECK(a.reset_reference);
    CHECK(a.trigger == reset_trigger::plateau);
    CHECK(to_string(a.trigger) == "plateau");
  }
}

TEST_CASE("reference reset matches the history-replaying oracle on random runs", "[control][reset][property]") {
  std::printf("test_control_reference_reset seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int total_resets = 0, total_suppressed = 0;
  for (int trial = 0; trial < 300; ++trial) {
    dynamics_oracle::reset_params p;
    p.every = u(rng) < 0.5 ? 0 : 1 + static_cast<long>(u(rng) * 40);
    p.plateau = u(rng) < 0.7;
    p.patience = 1 + static_cast<long>(u(rng) * 6);
    p.min_delta = u(rng) < 0.5 ? 0.0 : 0.03 * u(rng);
    p.higher = u(rng) < 0.7;
    p.drop = u(rng) < 0.5;
    p.max_drop = 0.2 * u(rng);
    p.kl = u(rng) < 0.5;
    p.max_share = 0.3 + 0.6 * u(rng);
    p.kl_patience = 1 + static_cast<long>(u(rng) * 4);
    p.cooldown = u(rng) < 0.3 ? 0 : static_cast<long>(u(rng) * 30);
    p.manual_ignores = u(rng) < 0.3;
    const auto calls = random_calls(rng, 1 + static_cast<std::size_t>(u(rng) * 400));
    const auto want = dynamics_oracle::reset_run(p, calls);
    ulorl::reference_reset_policy pol(to_config(p));
    // Save at a random point, finish both runs, compare every later action.
    const std::size_t cut = static_cast<std::size_t>(u(rng) * static_cast<double>(calls.size()));
    std::vector<std::byte> saved;
    for (std::size_t i = 0; i < calls.size(); ++i) {
      if (i == cut) saved = pol.save();
      const int got = code(apply(pol, calls[i]));
      INFO("trial " << trial << " call " << i << " kind " << calls[i].kind << " step " << calls[i].step);
      REQUIRE(got == want[i]);
      total_resets += got % 10 == 1;
      total_suppressed += got % 10 == 2;
    }
    if (!saved.empty()) {
      auto restored = ulorl::reference_reset_policy::restore(saved);
      for (std::size_t i = cut; i < calls.size(); ++i) REQUIRE(code(apply(restored, calls[i])) == want[i]);
      CHECK(restored.save() == pol.save());
    }
  }
  // The random runs exercise resets and suppressions, not only quiet paths.
  CHECK(total_resets > 300);
  CHECK(total_suppressed > 50);
}

TEST_CASE("reference reset save/restore mid-run keeps every counter", "[control][reset][checkpoint]") {
  ulorl::reference_reset_policy a({.every_n_steps = 7, .patience = 2, .on_drop = true, .max_drop = 0.1,
                                   .on_kl_share = true, .kl_share_patience = 2, .cooldown_steps = 3});
  a.observe_step(1, 0.9, 0.1);
  a.observe_validation(1, 0.4);
  a.observe_validation(2, 0.4);
  const auto b = ulorl::reference_reset_policy::restore(a.save());
  CHECK(b.state().kl_over_steps == 1);
  CHECK(b.state().evals_without_improvement == 1);
  CHECK(b.state().best == 0.4);
  CHECK(b.state().last_step == 2);
  CHECK(b.config().every_n_steps == 7);
  CHECK(b.config().cooldown_steps == 3);
  auto c = b;
  CHECK(code(c.observe_step(3, 0.9, 0.1)) == code(a.observe_step(3, 0.9, 0.1)));
  CHECK(c.state().last_event.trigger == reset_trigger::kl_share);
  // The restored copy still rejects time going backwards.
  CHECK_THROWS_AS(c.observe_step(2, 0, 0), ulorl::error);
}

TEST_CASE("reference reset rejects bad configuration, input and checkpoints", "[control][reset][error]") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  using cfg = ulorl::reference_reset_config;
  CHECK(arg_of([&] { ulorl::reference_reset_policy p(cfg{.patience = 0}); }) == "patience");
  CHECK(arg_of([&] { ulorl::reference_reset_policy p(cfg{.patience = -3}); }) == "patience");
  CHECK(arg_of([&] { ulorl::reference_reset_policy p(cfg{.cooldown_steps = -1}); }) == "cooldown_steps");
  CHECK(arg_of([&] { ulorl::reference_reset_policy p(cfg{.every_n_steps = -1}); }) == "every_n_steps");
  CHECK(arg_of([&] { ulorl::reference_reset_policy p(cfg{.min_delta = -0.1}); }) == "min_delta");
  CHECK(arg_of([&] { ulorl::reference_reset_policy p(cfg{.min_delta = nan}); }) == "min_delta");
  CHECK(arg_of([&] { ulorl::reference_reset_policy p(cfg{.max_drop = inf}); }) == "max_drop");
  CHECK(arg_of([&] { ulorl::reference_reset_policy p(cfg{.max_kl_share = 1.0}); }) == "max_kl_share");
  CHECK(arg_of([&] { ulorl::reference_reset_policy p(cfg{.max_kl_share = -0.1}); }) == "max_kl_share");
  CHECK(arg_of([&] { ulorl::reference_reset_policy p(cfg{.kl_share_patience = 0}); }) == "kl_share_patience");

  ulorl::reference_reset_policy p({.on_kl_share = true});
  p.observe_step(5, 0.1, 0.1);
  const auto before = p.save();
  CHECK(arg_of([&] { p.observe_step(6, nan, 0.1); }) == "kl_term");
  CHECK(arg_of([&] { p.observe_step(6, 0.1, inf); }) == "policy_term");
  CHECK(arg_of([&] { p.observe_validation(6, nan); }) == "metric");
  CHECK(arg_of([&] { p.observe_step(4, 0.1, 0.1); }) == "step");
  CHECK(arg_of([&] { p.observe_validation(4, 0.5); }) == "step");
  CHECK(arg_of([&] { p.request_manual(-1); }) == "step");
  CHECK(p.save() == before);  // rejected calls change nothing

  auto bad = before;
  bad.resize(bad.size() - 3);
  CHECK_THROWS_AS(ulorl::reference_reset_policy::restore(bad), ulorl::error);
  // Every bit flip and truncation, wrong kinds and versions, and each field out of range:
  // tests/test_control_checkpoint.cpp.
}

// The trigger is state, never configuration: it reaches the policy only through a checkpoint.
TEST_CASE("reference reset rejects an unknown trigger in a checkpoint, before and after a reset",
          "[control][reset][error][checkpoint][enum]") {
  ulorl::reference_reset_policy fresh({.on_kl_share = true});
  ulorl::reference_reset_policy reset = fresh;
  reset.observe_step(1, 0.9, 0.1);  // kl_share reset
  REQUIRE(reset.state().last_event.trigger == reset_trigger::kl_share);
  for (const auto* p : {&fresh, &reset}) {
    // last_event.trigger is the payload's byte before its last 16 (value f64, index u64), and the
    // checksum (u64) follows the payload.
    const auto saved = p->save();
    for (const std::uint8_t trigger : {std::uint8_t{6}, std::uint8_t{255}}) {
      INFO("has_reset " << p->state().has_reset << ", trigger " << int{trigger});
      const auto bytes = with_byte(saved, saved.size() - 8 - 17, trigger);
      auto restored = *p;
      require_unknown_enum([&] { restored = ulorl::reference_reset_policy::restore(bytes); },
                           "reference_reset_policy::restore", "state.last_event.trigger", trigger);
      CHECK(restored.save() == p->save());
    }
  }
  CHECK(ulorl::to_string(static_cast<reset_trigger>(6)) == "unknown");  // the log name of a value never accepted
}

TEST_CASE("reference reset: the KL share of huge loss terms does not overflow", "[control][reset][limits]") {
  // |kl| + |pg| overflows to inf for terms near DBL_MAX; the share of two equal terms is 1/2 and of
  // a 3:1 split 3/4 whatever their magnitude (halving both terms is exact and leaves the ratio).
  CHECK(ulorl::kl_share(1e308, 1e308) == 0.5);
  CHECK(ulorl::kl_share(-1.5e308, 0.5e308) == 0.75);
  CHECK(ulorl::kl_share(std::numeric_limits<double>::max(), 0.0) == 1.0);
  CHECK(ulorl::kl_share(0.0, std::numeric_limits<double>::max()) == 0.0);
  ulorl::reference_reset_policy p({.on_plateau = false, .on_kl_share = true, .max_kl_share = 0.4});
  const auto a = p.observe_step(1, 1e308, 1e308);
  CHECK(a.reset_reference);
  CHECK(a.event.value == 0.5);
}
