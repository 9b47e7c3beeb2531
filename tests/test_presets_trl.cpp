// Tests of ulorl/presets/trl.hpp: TRL's option names map to the documented parameters of the
// advantage and loss areas, GRPOConfig's defaults are one set shared by every options struct, and
// unknown names and enum values are rejected. (grpo_loss: test_presets_trl_grpo_loss.cpp; the loss
// types against an oracle: test_loss_trl_loss_types.cpp; the masks and the adaptive entropy bonus:
// test_masking_off_policy.cpp, test_control_entropy_controller.cpp.)
#include <ulorl/presets/trl.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/presets.hpp"
#include "support/rejection.hpp"

namespace P = ulorl::presets;

TEST_CASE("trl presets") {
  namespace T = P::trl;
  const ulorl::batch_counts c{.tokens = 10, .sequences = 3, .rows = 4};
  const auto t = T::objective({.delta = 1.5, .importance_sampling_level = T::importance_sampling_kind::sequence});
  REQUIRE(t.eps_high == 0.2);
  REQUIRE(t.delta == 1.5);
  REQUIRE(t.kind == ulorl::objective_kind::gspo);
  REQUIRE_THROWS_AS(T::importance_sampling_level_from_name("tokens"), ulorl::error);
  REQUIRE_THROWS_AS(T::objective({.importance_sampling_level = static_cast<T::importance_sampling_kind>(3)}),
                    ulorl::error);
  REQUIRE(T::importance_sampling_level_from_name("sequence_token") == T::importance_sampling_kind::sequence_token);
  REQUIRE(T::objective({.importance_sampling_level = T::importance_sampling_kind::sequence_token}).gspo.seq_gradient ==
          ulorl::sequence_gradient::own_token);
  REQUIRE(T::loss_type_from_name("luspo") == T::loss_type_kind::luspo);
  const auto ci = T::objective({.epsilon_high = 5.0, .loss_type = T::loss_type_kind::cispo});
  REQUIRE(ci.kind == ulorl::objective_kind::cispo);
  REQUIRE(ci.eps_low == 1.0);
  REQUIRE(ci.eps_high == 4.0);
  REQUIRE(T::objective({.loss_type = T::loss_type_kind::vespo}).kind == ulorl::objective_kind::policy_gradient);
  REQUIRE(T::objective({.loss_type = T::loss_type_kind::sapo, .sapo_temperature_neg = 2.0}).sapo.tau_neg == 2.0);
  REQUIRE_THROWS_AS(T::objective({.importance_sampling_level = T::importance_sampling_kind::sequence_token,
                                  .loss_type = T::loss_type_kind::cispo}),
                    ulorl::error);
  REQUIRE_THROWS_AS(T::objective({.loss_type = static_cast<T::loss_type_kind>(8)}), ulorl::error);
  REQUIRE(T::kl({.use_bias_correction_kl = true}).importance_weighted);
  const auto grpo = T::normalizer(
      {.loss_type = T::loss_type_kind::grpo, .max_completion_length = 16, .gradient_accumulation_steps = 4}, c);
  REQUIRE(grpo.denominator == 4);
  REQUIRE(grpo.scale == 0.25);
  REQUIRE(T::normalizer({.loss_type = T::loss_type_kind::dr_grpo, .max_completion_length = 16}, c).denominator == 64);
  REQUIRE(T::normalizer({.loss_type = T::loss_type_kind::dapo, .num_items_in_batch = 1000.0, .num_processes = 4}, c)
              .denominator == 250);
  REQUIRE(T::normalizer({}, c).denominator == 10);
  REQUIRE_THROWS_AS(T::loss_type_from_name("sum"), ulorl::error);
  REQUIRE_THROWS_AS(T::normalizer({.loss_type = static_cast<T::loss_type_kind>(9)}, c), ulorl::error);
  REQUIRE(T::normalizer({.loss_type = T::loss_type_kind::cispo, .num_items_in_batch = 1000.0, .num_processes = 4}, c)
              .denominator == 250);
  REQUIRE(T::normalizer({.loss_type = T::loss_type_kind::sapo}, c).mode == ulorl::agg_mode::seq_mean_token_mean);
  const auto lu =
      T::normalizer({.loss_type = T::loss_type_kind::luspo, .padded_length = 7, .gradient_accumulation_steps = 2}, c);
  REQUIRE(lu.mode == ulorl::agg_mode::constant);
  REQUIRE(lu.denominator == 7 * c.rows);
  REQUIRE(lu.scale == 0.5);
  REQUIRE(T::normalizer({.loss_type = T::loss_type_kind::luspo,
                         .importance_sampling_level = T::importance_sampling_kind::sequence},
                        c)
              .denominator == c.rows);
  REQUIRE(T::entropy_normalizer({.loss_type = T::loss_type_kind::grpo, .gradient_accumulation_steps = 2}, c, 3.0)
              .denominator == 3.0);
  REQUIRE(T::entropy_normalizer({.loss_type = T::loss_type_kind::dapo}, c, 3.0).denominator == c.tokens);
}

TEST_CASE("trl: GRPOConfig's defaults are one set, shared by every options struct", "[presets][defaults]") {
  namespace T = P::trl;
  namespace D = P::trl::defaults;
  static_assert(D::loss_type == T::loss_type_kind::dapo);  // TRL f2cd5771's GRPOConfig
  const T::objective_options ob;
  const T::normalizer_options no;
  const T::grpo_loss_options gl;
  REQUIRE((ob.loss_type == D::loss_type && no.loss_type == D::loss_type && gl.loss_type == D::loss_type));
  REQUIRE((ob.epsilon == D::epsilon && gl.epsilon == D::epsilon));
  REQUIRE((ob.importance_sampling_level == D::importance_sampling_level &&
           no.importance_sampling_level == D::importance_sampling_level &&
           gl.importance_sampling_level == D::importance_sampling_level));
  REQUIRE((ob.sapo_temperature_pos == D::sapo_temperature_pos && gl.sapo_temperature_pos == D::sapo_temperature_pos));
  REQUIRE((ob.sapo_temperature_neg == D::sapo_temperature_neg && gl.sapo_temperature_neg == D::sapo_temperature_neg));
  REQUIRE(
      (no.max_completion_length == D::max_completion_length && gl.max_completion_length == D::max_completion_length));
  REQUIRE((no.gradient_accumulation_steps == D::gradient_accumulation_steps &&
           gl.gradient_accumulation_steps == D::gradient_accumulation_steps));
  REQUIRE((no.num_processes == D::num_processes && gl.num_processes == D::num_processes));
  REQUIRE((T::kl_options{}.use_bias_correction_kl == D::use_bias_correction_kl &&
           gl.use_bias_correction_kl == D::use_bias_correction_kl));
  REQUIRE((T::adaptive_entropy_params{}.entropy_coef == D::entropy_coef && gl.entropy_coef == D::entropy_coef));
  REQUIRE(T::multi_reward_options{}.scale_rewards == D::scale_rewards);
  REQUIRE(T::advantage().group.scale == T::advantage(D::scale_rewards).group.scale);
}

TEST_CASE("trl: a NaN option is rejected even where the preset does not use it", "[presets][nan]") {
  const double nan = std::nan("");
  const ulorl::batch_counts local{10.0, 2.0, 2.0};
  require_nan_rejected([&] { return P::trl::normalizer({.max_completion_length = nan}, local); },
                       "max_completion_length");
  require_nan_rejected([&] { return P::trl::objective({.sapo_temperature_neg = nan}); }, "sapo_temperature_neg");
}

// ---- advantages -----------------------------------------------------------------------------------

TEST_CASE("TRL: eps 1e-4, a group of one gives 0", "[presets]") {
  REQUIRE(preset_advantages({1.0, 0.0, 1.0}, {0, 1, 2}, ulorl::presets::trl::advantage())[0] == 0.0);
  const auto a = preset_advantages({1.0, 0.0}, {0, 0}, ulorl::presets::trl::advantage());
  REQUIRE(a[0] == Approx(0.5 / (std::sqrt(0.5) + 1e-4)).epsilon(1e-14));
}

// The preset maps TRL's option to a configuration: an option value that names none of them is
// rejected (it used to fall through to "no scaling"), and a known one works in a constant expression.
TEST_CASE("TRL scale_rewards: unknown values are rejected", "[presets][errors][enum]") {
  using S = ulorl::presets::trl::scale_rewards;
  static_assert(ulorl::presets::trl::advantage(S::batch).group.scale == ulorl::scale_kind::batch_std);
  REQUIRE(ulorl::presets::trl::advantage(S::none).group.scale == ulorl::scale_kind::none);
  REQUIRE(ulorl::presets::trl::advantage(S::group).group.scale == ulorl::scale_kind::group_std);
  REQUIRE_THROWS_WITH(ulorl::presets::trl::advantage(static_cast<S>(3)),
                      Catch::Equals("ulorl::presets::trl::advantage: argument 'scale' = 3: unknown enum value "
                                    "(known: 0, 1, 2)"));
  require_unknown_enum([] { (void)ulorl::presets::trl::advantage(static_cast<S>(42)); }, "presets::trl::advantage",
                       "scale", 42);
}
