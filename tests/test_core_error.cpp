// Tests for ulorl/core/error.hpp: message format and the accessors hosts use.
#include <ulorl/advantage/group_advantage.hpp>
#include <ulorl/advantage/token_broadcast.hpp>
#include <ulorl/control/kl_controller.hpp>
#include <ulorl/core/error.hpp>
#include <ulorl/loss/kl.hpp>
#include <ulorl/loss/objectives.hpp>

#include <cstdint>
#include <limits>
#include <vector>

#include "catch.hpp"
#include "support/rejection.hpp"

TEST_CASE("error messages name function, argument, index and value", "[error]") {
  try {
    ulorl::detail::fail_at("policy_loss", "log_prob", 17, std::numeric_limits<double>::quiet_NaN(), "must be finite");
    FAIL("no throw");
  } catch (const ulorl::error& e) {
    REQUIRE(std::string(e.what()) == "ulorl::policy_loss: argument 'log_prob'[17] = nan: must be finite");
    REQUIRE(e.function() == "policy_loss");
    REQUIRE(e.argument() == "log_prob");
    REQUIRE(e.index() == 17);
  }
  REQUIRE_THROWS_WITH(ulorl::detail::fail_value("f", "eps", -0.5, "must be > 0"),
                      Catch::Equals("ulorl::f: argument 'eps' = -0.5: must be > 0"));
  REQUIRE_THROWS_WITH(ulorl::detail::fail("f", "x", "empty"), Catch::Equals("ulorl::f: argument 'x': empty"));
  REQUIRE_THROWS_WITH(ulorl::require_positive("f", "eps", 0.0), Catch::Contains("'eps' = 0"));
  REQUIRE_THROWS_WITH(ulorl::require_non_negative("f", "c", -1), Catch::Contains("'c' = -1"));
  REQUIRE_THROWS_WITH(ulorl::require_finite("f", "beta", std::numeric_limits<float>::infinity()),
                      Catch::Contains("'beta' = inf"));
  REQUIRE_THROWS_WITH(ulorl::require_same_size("f", "b", 3, "a", 4),
                      Catch::Contains("'b': has 3 elements but 'a' has 4"));
  REQUIRE_NOTHROW(ulorl::require_positive("f", "eps", 1e-300));
  // ulorl::error is a std::invalid_argument, so generic handlers catch it.
  REQUIRE_THROWS_AS(ulorl::detail::fail("f", "x", "y"), std::invalid_argument);
}

TEST_CASE("require_known and require_known_at name the value and the known values", "[error][enum]") {
  enum class small : std::uint8_t { a = 0, b = 3, c = 7 };
  enum class wide { neg = -2, pos = 1 };
  REQUIRE_NOTHROW(ulorl::require_known("f", "k", small::b, small::a, small::b, small::c));
  REQUIRE_THROWS_WITH(ulorl::require_known("f", "k", static_cast<small>(200), small::a, small::b, small::c),
                      Catch::Equals("ulorl::f: argument 'k' = 200: unknown enum value (known: 0, 3, 7)"));
  REQUIRE_THROWS_WITH(ulorl::require_known("f", "k", static_cast<wide>(0), wide::neg, wide::pos),
                      Catch::Equals("ulorl::f: argument 'k' = 0: unknown enum value (known: -2, 1)"));
  REQUIRE_THROWS_WITH(ulorl::require_known_at("f", "rows.kind", 5, static_cast<small>(1), small::a, small::c),
                      Catch::Equals("ulorl::f: argument 'rows.kind'[5] = 1: unknown enum value (known: 0, 7)"));
  const auto o = outcome_of([] { ulorl::require_known_at("f", "rows.kind", 5, static_cast<small>(1), small::a); });
  CHECK(o.index == 5);
  CHECK(o.argument == "rows.kind");
  // Usable in constant expressions (the advantage presets validate their options there).
  static_assert([] {
    ulorl::require_known("f", "k", small::c, small::a, small::c);
    return true;
  }());
}

// An out-of-range enum value (an integer cast, a corrupted config) must be rejected at validation,
// naming the argument, instead of running some branch (PPO, k3, "no baseline", a division by eps).
TEST_CASE("unknown enum values are rejected at validation in every area", "[error][enum]") {
  using namespace ulorl;
  REQUIRE(arg_of([] { validate_objective("f", {.kind = static_cast<objective_kind>(42)}); }) == "kind");
  REQUIRE(arg_of([] { validate_objective("f", {.gspo = {.seq_gradient = static_cast<sequence_gradient>(2)}}); }) ==
          "seq_gradient");
  REQUIRE(arg_of([] { validate_kl("f", {.estimator = static_cast<kl_estimator>(9)}); }) == "estimator");
  REQUIRE(arg_of([] { validate_objective("f", {}); }) == "<no error>");
  REQUIRE(arg_of([] { validate_kl("f", {}); }) == "<no error>");

  const std::vector<double> scores{1.0, 0.0, 1.0, 1.0};
  const std::vector<std::int64_t> ids{0, 0, 1, 1};
  std::vector<double> out(4, -7.0);
  auto advantages = [&](group_advantage_config c) {
    return arg_of([&] {
      group_advantages(std::span<const double>(scores), std::span<const std::int64_t>(ids), std::span<double>(out), c);
    });
  };
  CHECK(advantages({.scale = static_cast<scale_kind>(7)}) == "config.scale");
  CHECK(advantages({.baseline = static_cast<baseline_kind>(9)}) == "config.baseline");
  CHECK(advantages({.std = static_cast<std_estimator>(2)}) == "config.std");
  CHECK(advantages({.eps_at = static_cast<eps_placement>(2)}) == "config.eps_at");
  CHECK(advantages({.singleton = static_cast<singleton_rule>(3)}) == "config.singleton");
  CHECK(advantages({.zero_std = static_cast<zero_std_rule>(2)}) == "config.zero_std");
  CHECK(out == std::vector<double>(4, -7.0));  // nothing written
  CHECK(advantages({}) == "<no error>");

  const std::vector<double> adv{0.5, -0.5};
  const std::vector<std::uint8_t> mask{1, 1, 0, 1, 0, 0};
  std::vector<double> tok(6, -7.0);
  const auto m = token_view<const std::uint8_t>::padded(matrix_view<const std::uint8_t>(mask.data(), 2, 3));
  const auto o = token_view<double>::padded(matrix_view<double>(tok.data(), 2, 3));
  CHECK(arg_of([&] {
          broadcast_to_tokens(std::span<const double>(adv), m, o, {.placement = static_cast<token_placement>(3)});
        }) == "config.placement");
  CHECK(tok == std::vector<double>(6, -7.0));

  CHECK(arg_of([] { kl_controller k({.type = static_cast<kl_control_type>(2)}); }) == "type");
}
