// Tests of ulorl/presets/openrlhf.hpp: OpenRLHF's option names map to the documented parameters of
// the advantage and loss areas; unknown names and enum values are rejected. (The rollout
// correction's mapping: test_loss_rollout_correction.cpp; the vLLM IS plan: test_loss_policy_modes.cpp.)
#include <ulorl/presets/openrlhf.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/presets.hpp"
#include "support/rejection.hpp"

namespace P = ulorl::presets;

TEST_CASE("openrlhf presets") {
  namespace O = P::openrlhf;
  const auto o = O::objective({.policy_loss_type = O::policy_loss_kind::gspo, .clip_eps_high = 0.28, .dual_clip = 3.0});
  REQUIRE(o.gspo.seq_gradient == ulorl::sequence_gradient::through_mean);
  REQUIRE(o.dual_clip == 3.0);
  REQUIRE(O::objective({}).dual_clip == 0.0);
  REQUIRE_THROWS_AS(O::objective({.dual_clip = 0.5}), ulorl::error);
  REQUIRE_THROWS_AS(O::policy_loss_type_from_name("cispo"), ulorl::error);
  REQUIRE(O::kl({.kl_estimator = O::kl_estimator_from_name("k2")}).output_clamp == 10.0);
  REQUIRE_THROWS_AS(O::kl_estimator_from_name("k4"), ulorl::error);
  REQUIRE_THROWS_AS(O::kl({.kl_estimator = ulorl::kl_estimator::abs}), ulorl::error);
  const ulorl::batch_counts c{.tokens = 10, .sequences = 3, .rows = 4};
  REQUIRE(O::normalizer({.token_level_loss = false, .dp_size = 2.0, .global_batch_size = 8.0}, c).denominator == 8.0);
  REQUIRE(O::normalizer({.token_level_loss = false, .dp_size = 2.0}, c).denominator == 3.0);
  // policy_normalizer: gspo is always sequence-level; ppo keeps the caller's choice.
  const O::normalizer_options tok{.token_level_loss = true, .dp_size = 2.0, .batch_num_tokens = 10.0};
  const auto ng = O::policy_normalizer(O::policy_loss_kind::gspo, tok, c);
  REQUIRE(ng.mode == ulorl::agg_mode::seq_mean_token_mean);
  REQUIRE(ng.denominator == 3.0);
  REQUIRE(ng.scale == 1.0);
  const auto np = O::policy_normalizer(O::policy_loss_kind::ppo, tok, c);
  REQUIRE(np.mode == ulorl::agg_mode::token_mean);
  REQUIRE(np.denominator == 10.0);
  REQUIRE(np.scale == 2.0);
  REQUIRE_THROWS_AS(O::policy_normalizer(static_cast<O::policy_loss_kind>(5), tok, c), ulorl::error);
}

TEST_CASE("openrlhf: a NaN option is rejected even where the preset does not use it", "[presets][nan]") {
  const double nan = std::nan("");
  const ulorl::batch_counts local{10.0, 2.0, 2.0};
  // dp_size is unused without batch_num_tokens.
  require_nan_rejected([&] { return P::openrlhf::normalizer({.dp_size = nan}, local); }, "dp_size");
  require_nan_rejected(
      [&] {
        return P::openrlhf::policy_normalizer(P::openrlhf::policy_loss_kind::ppo, {.global_batch_size = nan}, local);
      },
      "global_batch_size");
  require_nan_rejected([&] { return P::openrlhf::objective({.clip_eps_high = nan}); }, "clip_eps_high");
  REQUIRE(P::openrlhf::normalizer({}, local).denominator == 10.0);
}

// ---- advantages -----------------------------------------------------------------------------------

TEST_CASE("OpenRLHF: singletons rejected, eps 1e-9", "[presets]") {
  using E = ulorl::presets::openrlhf::advantage_estimator;
  REQUIRE_THROWS_AS(preset_advantages({1.0, 0.0}, {0, 1}, ulorl::presets::openrlhf::advantage(E::group_norm)),
                    ulorl::error);
  REQUIRE_THROWS_AS(preset_advantages({1.0, 0.0}, {0, 1}, ulorl::presets::openrlhf::advantage(E::rloo)), ulorl::error);
  REQUIRE(preset_advantages({1.0, 0.0}, {0, 1}, ulorl::presets::openrlhf::advantage(E::dr_grpo))[0] == 0.0);
  REQUIRE(preset_advantages({1.0, 0.0}, {0, 0}, ulorl::presets::openrlhf::advantage(E::group_norm))[0] ==
          Approx(0.5 / (std::sqrt(0.5) + 1e-9)).epsilon(1e-14));
  REQUIRE(ulorl::presets::openrlhf::advantage(E::group_norm).broadcast.placement ==
          ulorl::token_placement::through_last);
}

// The preset maps OpenRLHF's option to a configuration: an option value that names none of them is
// rejected (it used to fall through to group_norm), and a known one works in a constant expression.
TEST_CASE("OpenRLHF estimator: unknown values are rejected", "[presets][errors][enum]") {
  using E = ulorl::presets::openrlhf::advantage_estimator;
  static_assert(ulorl::presets::openrlhf::advantage(E::rloo).group.baseline == ulorl::baseline_kind::leave_one_out);
  require_unknown_enum([] { (void)ulorl::presets::openrlhf::advantage(static_cast<E>(3)); },
                       "presets::openrlhf::advantage", "estimator", 3);
  require_unknown_enum([] { (void)ulorl::presets::openrlhf::advantage(static_cast<E>(-7)); },
                       "presets::openrlhf::advantage", "estimator", -7);
}
