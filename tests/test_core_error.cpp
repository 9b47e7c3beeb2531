// Tests for ulorl/core/error.hpp: message format and the accessors hosts use.
#include <ulorl/core/error.hpp>

#include <limits>

#include "catch.hpp"

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
  REQUIRE_THROWS_WITH(ulorl::require_finite("f", "beta", std::numeric_limits<float>::infinity()), Catch::Contains("'beta' = inf"));
  REQUIRE_THROWS_WITH(ulorl::require_same_size("f", "b", 3, "a", 4), Catch::Contains("'b': has 3 elements but 'a' has 4"));
  REQUIRE_NOTHROW(ulorl::require_positive("f", "eps", 1e-300));
  // ulorl::error is a std::invalid_argument, so generic handlers catch it.
  REQUIRE_THROWS_AS(ulorl::detail::fail("f", "x", "y"), std::invalid_argument);
}
