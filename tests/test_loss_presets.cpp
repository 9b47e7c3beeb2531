// Tests of ulorl/loss/presets.hpp: the frameworks' option names map to the documented parameters;
// unknown names and enum values are rejected. (The presets' numbers are checked end to end by the
// golden conformance cases.)
#include <ulorl/loss/presets.hpp>
#include <ulorl/loss/trl_grpo_loss.hpp>

#include <cmath>
#include <string>

#include "catch.hpp"

namespace P = ulorl::presets;

TEST_CASE("verl presets") {
  using P::verl::loss_mode_kind;
  const auto v = P::verl::objective({.loss_mode = loss_mode_kind::vanilla, .clip_ratio_high = 0.28});
  REQUIRE(v.kind == ulorl::objective_kind::ppo_clip);
  REQUIRE(v.eps_low == 0.2);
  REQUIRE(v.eps_high == 0.28);
  REQUIRE(v.dual_clip == 3.0);
  REQUIRE(v.log_ratio_clamp == 20.0);
  REQUIRE(P::verl::objective({.loss_mode = loss_mode_kind::gspo}).seq_gradient == ulorl::sequence_gradient::own_token);
  REQUIRE(P::verl::objective({.loss_mode = P::verl::loss_mode_from_name("geo_mean")}).kind == ulorl::objective_kind::gmpo);
  const auto s = P::verl::objective({.loss_mode = loss_mode_kind::sapo, .tau_pos = 0.5, .tau_neg = 2.0});
  REQUIRE(s.tau_pos == 0.5);
  REQUIRE(s.tau_neg == 2.0);
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
  n = P::verl::normalizer({.loss_agg_mode = ulorl::agg_mode::seq_mean_token_sum_norm, .dp_size = 2.0, .padded_length = 8}, c);
  REQUIRE(n.denominator == 24);  // 1dda039b: sequences x horizon, times dp_size
  REQUIRE(n.scale == 2.0);
  n = P::verl::normalizer({.loss_agg_mode = ulorl::agg_mode::seq_mean_token_sum_norm, .dp_size = 2.0, .global_batch_size = 5.0,
                           .loss_scale_factor = 7.0, .padded_length = 8}, c);
  REQUIRE(n.denominator == 35);
  n = P::verl::normalizer({.loss_agg_mode = ulorl::agg_mode::seq_mean_token_sum_norm, .dp_size = 2.0, .padded_length = 8,
                           .sum_norm_per_sequence = false}, c);
  REQUIRE(n.denominator == 8);  // b178a3cd: the horizon alone
  REQUIRE(n.scale == 1.0);
  n = P::verl::normalizer({.loss_agg_mode = P::verl::loss_agg_mode_from_name("token-sum"), .dp_size = 4.0, .padded_length = 8}, c);
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

TEST_CASE("openrlhf, nemo_rl and trl presets") {
  namespace O = P::openrlhf;
  const auto o = O::objective({.policy_loss_type = O::policy_loss_kind::gspo, .clip_eps_high = 0.28, .dual_clip = 3.0});
  REQUIRE(o.seq_gradient == ulorl::sequence_gradient::through_mean);
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

  const auto nk = P::nemo_rl::kl({.kl_input_clamp_value = 20.0});
  REQUIRE(nk.estimator == ulorl::kl_estimator::k3);
  REQUIRE(nk.input_clamp == 20.0);
  REQUIRE(nk.output_clamp == ulorl::no_limit);
  REQUIRE(P::nemo_rl::objective({.ratio_clip_max = 0.28, .ratio_clip_c = 3.0}).dual_clip == 3.0);
  REQUIRE_THROWS_AS(P::nemo_rl::kl_type_from_name("abs"), ulorl::error);

  namespace T = P::trl;
  const auto t = T::objective({.delta = 1.5, .importance_sampling_level = T::importance_sampling_kind::sequence});
  REQUIRE(t.eps_high == 0.2);
  REQUIRE(t.delta == 1.5);
  REQUIRE(t.kind == ulorl::objective_kind::gspo);
  REQUIRE_THROWS_AS(T::importance_sampling_level_from_name("tokens"), ulorl::error);
  REQUIRE_THROWS_AS(T::objective({.importance_sampling_level = static_cast<T::importance_sampling_kind>(3)}), ulorl::error);
  REQUIRE(T::importance_sampling_level_from_name("sequence_token") == T::importance_sampling_kind::sequence_token);
  REQUIRE(T::objective({.importance_sampling_level = T::importance_sampling_kind::sequence_token}).seq_gradient ==
          ulorl::sequence_gradient::own_token);
  REQUIRE(T::loss_type_from_name("luspo") == T::loss_type_kind::luspo);
  const auto ci = T::objective({.epsilon_high = 5.0, .loss_type = T::loss_type_kind::cispo});
  REQUIRE(ci.kind == ulorl::objective_kind::cispo);
  REQUIRE(ci.eps_low == 1.0);
  REQUIRE(ci.eps_high == 4.0);
  REQUIRE(T::objective({.loss_type = T::loss_type_kind::vespo}).kind == ulorl::objective_kind::policy_gradient);
  REQUIRE(T::objective({.loss_type = T::loss_type_kind::sapo, .sapo_temperature_neg = 2.0}).tau_neg == 2.0);
  REQUIRE_THROWS_AS(T::objective({.importance_sampling_level = T::importance_sampling_kind::sequence_token,
                                  .loss_type = T::loss_type_kind::cispo}),
                    ulorl::error);
  REQUIRE_THROWS_AS(T::objective({.loss_type = static_cast<T::loss_type_kind>(8)}), ulorl::error);
  REQUIRE(T::kl({.use_bias_correction_kl = true}).importance_weighted);
  const auto grpo = T::normalizer({.loss_type = T::loss_type_kind::grpo, .max_completion_length = 16, .gradient_accumulation_steps = 4}, c);
  REQUIRE(grpo.denominator == 4);
  REQUIRE(grpo.scale == 0.25);
  REQUIRE(T::normalizer({.loss_type = T::loss_type_kind::dr_grpo, .max_completion_length = 16}, c).denominator == 64);
  REQUIRE(T::normalizer({.loss_type = T::loss_type_kind::dapo, .num_items_in_batch = 1000.0, .num_processes = 4}, c).denominator == 250);
  REQUIRE(T::normalizer({}, c).denominator == 10);
  REQUIRE_THROWS_AS(T::loss_type_from_name("sum"), ulorl::error);
  REQUIRE_THROWS_AS(T::normalizer({.loss_type = static_cast<T::loss_type_kind>(9)}, c), ulorl::error);
  REQUIRE(T::normalizer({.loss_type = T::loss_type_kind::cispo, .num_items_in_batch = 1000.0, .num_processes = 4}, c).denominator == 250);
  REQUIRE(T::normalizer({.loss_type = T::loss_type_kind::sapo}, c).mode == ulorl::agg_mode::seq_mean_token_mean);
  const auto lu = T::normalizer({.loss_type = T::loss_type_kind::luspo, .padded_length = 7, .gradient_accumulation_steps = 2}, c);
  REQUIRE(lu.mode == ulorl::agg_mode::constant);
  REQUIRE(lu.denominator == 7 * c.rows);
  REQUIRE(lu.scale == 0.5);
  REQUIRE(T::normalizer({.loss_type = T::loss_type_kind::luspo,
                         .importance_sampling_level = T::importance_sampling_kind::sequence}, c).denominator == c.rows);
  REQUIRE(T::entropy_normalizer({.loss_type = T::loss_type_kind::grpo, .gradient_accumulation_steps = 2}, c, 3.0).denominator == 3.0);
  REQUIRE(T::entropy_normalizer({.loss_type = T::loss_type_kind::dapo}, c, 3.0).denominator == c.tokens);
  // One default loss_type, TRL's GRPOConfig's (dapo), for the objective, the normaliser and grpo_loss.
  REQUIRE(T::objective_options{}.loss_type == T::loss_type_kind::dapo);
  REQUIRE(T::normalizer_options{}.loss_type == T::loss_type_kind::dapo);
  REQUIRE(T::grpo_loss_options{}.loss_type == T::loss_type_kind::dapo);
}

TEST_CASE("presets: a NaN option is rejected even where the preset does not use it", "[presets][nan]") {
  const double nan = std::nan("");
  const ulorl::batch_counts local{10.0, 2.0, 2.0};
  const auto expect_nan = [](auto&& f, const char* arg) {
    try {
      (void)f();
      FAIL("no error for " << arg);
    } catch (const ulorl::error& e) {
      CHECK(e.argument() == arg);
      CHECK(std::string(e.what()).find("NaN") != std::string::npos);
    }
  };
  // dp_size is unused without batch_num_tokens.
  expect_nan([&] { return P::openrlhf::normalizer({.dp_size = nan}, local); }, "dp_size");
  expect_nan([&] { return P::openrlhf::policy_normalizer(P::openrlhf::policy_loss_kind::ppo, {.global_batch_size = nan}, local); },
             "global_batch_size");
  expect_nan([&] { return P::openrlhf::objective({.clip_eps_high = nan}); }, "clip_eps_high");
  // verl: tau_pos is sapo's; vanilla does not use it.
  expect_nan([&] { return P::verl::objective({.tau_pos = nan}); }, "tau_pos");
  expect_nan([&] { return P::verl::normalizer({.loss_scale_factor = nan}, local); }, "loss_scale_factor");
  expect_nan([&] { return P::trl::normalizer({.max_completion_length = nan}, local); }, "max_completion_length");
  expect_nan([&] { return P::trl::objective({.sapo_temperature_neg = nan}); }, "sapo_temperature_neg");
  expect_nan([&] { return P::nemo_rl::objective({.truncated_importance_sampling_ratio_min = nan}); },
             "truncated_importance_sampling_ratio_min");
  REQUIRE(P::openrlhf::normalizer({}, local).denominator == 10.0);
}
