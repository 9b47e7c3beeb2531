// Tests of ulorl/presets/verl.hpp: verl's option names map to the documented parameters of the
// advantage and loss areas; unknown names and enum values are rejected. (The presets' numbers are
// checked end to end by the golden conformance cases; the token selections' mappings in
// test_loss_policy_modes.cpp, the rollout correction's in test_loss_rollout_correction.cpp.)
#include <ulorl/presets/verl.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/advantage_oracle.hpp"
#include "support/presets.hpp"
#include "support/random.hpp"

namespace P = ulorl::presets;

TEST_CASE("verl presets") {
  using P::verl::loss_mode_kind;
  const auto v = P::verl::objective({.loss_mode = loss_mode_kind::vanilla, .clip_ratio_high = 0.28});
  REQUIRE(v.kind == ulorl::objective_kind::ppo_clip);
  REQUIRE(v.eps_low == 0.2);
  REQUIRE(v.eps_high == 0.28);
  REQUIRE(v.dual_clip == 3.0);
  REQUIRE(v.log_ratio_clamp == 20.0);
  REQUIRE(P::verl::objective({.loss_mode = loss_mode_kind::gspo}).gspo.seq_gradient ==
          ulorl::sequence_gradient::own_token);
  REQUIRE(P::verl::objective({.loss_mode = P::verl::loss_mode_from_name("geo_mean")}).kind ==
          ulorl::objective_kind::gmpo);
  const auto s = P::verl::objective({.loss_mode = loss_mode_kind::sapo, .tau_pos = 0.5, .tau_neg = 2.0});
  REQUIRE(s.sapo.tau_pos == 0.5);
  REQUIRE(s.sapo.tau_neg == 2.0);
  REQUIRE_THROWS_AS(P::verl::objective({.clip_ratio_c = 1.0}), ulorl::error);
  // An unknown name lists the known ones; an unknown enum value is rejected as such.
  REQUIRE_THROWS_WITH(P::verl::loss_mode_from_name("nope"), Catch::Matchers::Contains("'loss_mode'") &&
                                                                Catch::Matchers::Contains("'nope'") &&
                                                                Catch::Matchers::Contains("known: vanilla, gspo"));
  REQUIRE_THROWS_AS(P::verl::objective({.loss_mode = static_cast<loss_mode_kind>(42)}), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::metrics(static_cast<loss_mode_kind>(42), {}), ulorl::error);

  const auto k = P::verl::kl(P::verl::kl_penalty_from_name("low_var_kl+"));
  REQUIRE(k.estimator == ulorl::kl_estimator::k3);
  REQUIRE(k.straight_through);
  REQUIRE(k.input_clamp == 20.0);
  REQUIRE(k.output_clamp == 10.0);
  REQUIRE(P::verl::kl_penalty_from_name("mse").kl_penalty == ulorl::kl_estimator::k2);
  REQUIRE(P::verl::kl_penalty_from_name("kl").kl_penalty == ulorl::kl_estimator::k1);
  REQUIRE_FALSE(P::verl::kl({.kl_penalty = ulorl::kl_estimator::abs}).straight_through);
  REQUIRE_THROWS_AS(P::verl::kl_penalty_from_name("k5"), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::kl_penalty_from_name("full"), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::kl_penalty_from_name("+"), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::kl({.kl_penalty = static_cast<ulorl::kl_estimator>(9)}), ulorl::error);

  const ulorl::batch_counts c{.tokens = 10, .sequences = 3, .rows = 4};
  auto n = P::verl::normalizer({.dp_size = 2.0, .padded_length = 8}, c);
  REQUIRE(n.denominator == 10);
  REQUIRE(n.scale == 2.0);
  n = P::verl::normalizer(
      {.loss_agg_mode = ulorl::agg_mode::seq_mean_token_sum_norm, .dp_size = 2.0, .padded_length = 8}, c);
  REQUIRE(n.denominator == 24);  // 1dda039b: sequences x horizon, times dp_size
  REQUIRE(n.scale == 2.0);
  n = P::verl::normalizer({.loss_agg_mode = ulorl::agg_mode::seq_mean_token_sum_norm,
                           .dp_size = 2.0,
                           .global_batch_size = 5.0,
                           .loss_scale_factor = 7.0,
                           .padded_length = 8},
                          c);
  REQUIRE(n.denominator == 35);
  n = P::verl::normalizer({.loss_agg_mode = ulorl::agg_mode::seq_mean_token_sum_norm,
                           .dp_size = 2.0,
                           .padded_length = 8,
                           .sum_norm_per_sequence = false},
                          c);
  REQUIRE(n.denominator == 8);  // b178a3cd: the horizon alone
  REQUIRE(n.scale == 1.0);
  n = P::verl::normalizer(
      {.loss_agg_mode = P::verl::loss_agg_mode_from_name("token-sum"), .dp_size = 4.0, .padded_length = 8}, c);
  REQUIRE(n.mode == ulorl::agg_mode::constant);
  REQUIRE(n.denominator == 1.0);
  REQUIRE(n.scale == 4.0);
  const P::verl::normalizer_options given{.batch_num_tokens = 150.0, .global_batch_size = 16.0, .padded_length = 8};
  n = P::verl::policy_normalizer(loss_mode_kind::gspo, given, c);
  REQUIRE(n.mode == ulorl::agg_mode::seq_mean_token_mean);
  REQUIRE(n.denominator == 16);
  REQUIRE(P::verl::policy_normalizer(loss_mode_kind::vanilla, given, c).denominator == 150);
  REQUIRE(P::verl::policy_normalizer(loss_mode_kind::geo_mean, given, c).denominator == 4);
  REQUIRE(P::verl::loss_agg_mode_from_name("seq-mean-token-sum-norm") == ulorl::agg_mode::seq_mean_token_sum_norm);
  REQUIRE_THROWS_AS(P::verl::loss_agg_mode_from_name("token_mean"), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::normalizer({.loss_agg_mode = static_cast<ulorl::agg_mode>(7)}, c), ulorl::error);
}

TEST_CASE("verl: a NaN option is rejected even where the preset does not use it", "[presets][nan]") {
  const double nan = std::nan("");
  const ulorl::batch_counts local{10.0, 2.0, 2.0};
  // tau_pos is sapo's; vanilla does not use it.
  require_nan_rejected([&] { return P::verl::objective({.tau_pos = nan}); }, "tau_pos");
  require_nan_rejected([&] { return P::verl::normalizer({.loss_scale_factor = nan}, local); }, "loss_scale_factor");
}

TEST_CASE("verl metrics take the token selections' counts for dppo_*, kl_cov and clip_cov", "[presets]") {
  using K = P::verl::loss_mode_kind;
  const ulorl::token_selection_stats st{.dropped_fraction = 0.25, .capped_fraction = 0.125, .mean_abs_log_ratio = 0.5};
  const ulorl::loss_metrics m{};
  const auto d = P::verl::metrics(K::dppo_kl, m, st);
  REQUIRE((d.pg_clipfrac == 0.25 && d.pg_clipfrac_lower == 0.125));
  REQUIRE(P::verl::metrics(K::kl_cov, m, st).ppo_kl == 0.5);
  const auto c = P::verl::metrics(K::clip_cov, m, st);
  REQUIRE((c.pg_clipfrac == 0.25 && c.pg_clipfrac_lower == 0.0));
}

// ---- advantages -----------------------------------------------------------------------------------

TEST_CASE("verl GRPO: unbiased std, eps 1e-6, singleton s/(1+eps)", "[presets]") {
  testing_support::rng r(17);
  std::vector<double> s(40);
  for (auto& x : s) x = static_cast<double>(r.integer(0, 1));
  const auto ids = testing_support::random_group_ids(r, s.size());
  const auto a = preset_advantages(s, ids, ulorl::presets::verl::grpo_advantage());
  const auto o = oracle::grpo(s, ids, 1e-6, true, true, true);
  for (std::size_t i = 0; i < s.size(); ++i) REQUIRE(a[i] == Approx(o[i]).epsilon(1e-12).margin(1e-15));
  REQUIRE(preset_advantages({3.0}, {4}, ulorl::presets::verl::grpo_advantage())[0] ==
          Approx(3.0 / (1 + 1e-6)).epsilon(1e-15));
  REQUIRE(preset_advantages({3.0}, {4}, ulorl::presets::verl::grpo_advantage({.norm_adv_by_std_in_grpo = false}))[0] ==
          3.0);
  REQUIRE(preset_advantages({3.0}, {4}, ulorl::presets::verl::rloo_advantage())[0] == 3.0);
}

TEST_CASE("verl presets of the added estimators map verl's option names", "[presets]") {
  namespace verl = ulorl::presets::verl;
  static_assert(verl::optimal_token_baseline_advantage().align == ulorl::token_alignment::position);
  static_assert(verl::optimal_token_baseline_advantage().handle_zero_tail);
  static_assert(verl::optimal_token_baseline_advantage().eps == 1e-8);
  constexpr auto tir = verl::tir_optimal_token_baseline_advantage({.handle_zero_tail = false, .epsilon = 1e-6});
  static_assert(tir.align == ulorl::token_alignment::valid_token && !tir.handle_zero_tail && tir.eps == 1e-6);
  constexpr auto gdpo = verl::gdpo_advantage({.norm_adv_by_std_in_grpo = false});
  static_assert(gdpo.group.scale == ulorl::scale_kind::none && gdpo.group.singleton == ulorl::singleton_rule::identity);
  static_assert(gdpo.whiten.unbiased && gdpo.whiten.eps == 1e-8 && gdpo.whiten.mask_output);
  static_assert(verl::grpo_advantage().group.scale == ulorl::scale_kind::group_std &&
                verl::grpo_advantage().group.eps == 1e-6);
  constexpr auto dr = verl::grpo_advantage({.epsilon = 1e-3, .norm_adv_by_std_in_grpo = false});
  static_assert(dr.group.scale == ulorl::scale_kind::none && dr.group.eps == 1e-3);
  // GDPO builds on GRPO's options.
  REQUIRE(verl::gdpo_advantage({.epsilon = 1e-3}).group.eps == verl::grpo_advantage({.epsilon = 1e-3}).group.eps);
}
