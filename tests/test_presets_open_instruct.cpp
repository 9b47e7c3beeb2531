// Tests of ulorl/presets/open_instruct.hpp: Open-Instruct's advantage_normalization_type maps to
// group statistics (biased std, eps 1e-8, or the mean only) against the oracle; an unknown value is
// rejected.
#include <ulorl/presets/open_instruct.hpp>

#include <cmath>
#include <vector>

#include "catch.hpp"
#include "support/presets.hpp"
#include "support/rejection.hpp"

TEST_CASE("Open-Instruct: biased std, eps 1e-8", "[presets]") {
  namespace oi = ulorl::presets::open_instruct;
  const auto a = preset_advantages({1.0, 0.0, 0.0, 0.0}, {0, 0, 0, 0}, oi::advantage());
  REQUIRE(a[0] == Approx(0.75 / (std::sqrt(0.1875) + 1e-8)).epsilon(1e-14));
  REQUIRE(preset_advantages({1.0, 0.0}, {0, 0}, oi::advantage({.advantage_normalization_type = oi::advantage_normalization::centered}))[0] ==
          0.5);
  static_assert(oi::advantage().group.scale == ulorl::scale_kind::group_std);
  static_assert(oi::advantage({.advantage_normalization_type = oi::advantage_normalization::centered}).group.scale ==
                ulorl::scale_kind::none);
  require_unknown_enum([] { (void)oi::advantage({.advantage_normalization_type = static_cast<oi::advantage_normalization>(2)}); },
                       "presets::open_instruct::advantage", "advantage_normalization_type", 2);
}
