// Tests of ulorl/loss/presets.hpp: the frameworks' names map to the documented parameters; unknown
// names are rejected. (The presets' numbers are checked end to end by the golden conformance cases.)
#include <ulorl/loss/presets.hpp>

#include "catch.hpp"

namespace P = ulorl::presets;

TEST_CASE("verl presets") {
  const auto v = P::verl::objective("vanilla", 0.2, 0.28, 3.0);
  REQUIRE(v.kind == ulorl::objective_kind::ppo_clip);
  REQUIRE(v.dual_clip == 3.0);
  REQUIRE(v.log_ratio_clamp == 20.0);
  REQUIRE(P::verl::objective("gspo", 0.2, 0.28).seq_gradient == ulorl::sequence_gradient::own_token);
  REQUIRE(P::verl::objective("geo_mean", 0.4, 0.4).kind == ulorl::objective_kind::gmpo);
  REQUIRE_THROWS_AS(P::verl::objective("vanilla", 0.2, 0.28, 1.0), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::objective("nope", 0.2, 0.28), ulorl::error);
  const auto k = P::verl::kl("low_var_kl+");
  REQUIRE(k.estimator == ulorl::kl_estimator::k3);
  REQUIRE(k.straight_through);
  REQUIRE(k.input_clamp == 20.0);
  REQUIRE(k.output_clamp == 10.0);
  REQUIRE(P::verl::kl("mse").estimator == ulorl::kl_estimator::k2);
  REQUIRE_THROWS_AS(P::verl::kl("k5"), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::kl("full"), ulorl::error);
  const ulorl::batch_counts c{.tokens = 10, .sequences = 3, .rows = 4};
  auto n = P::verl::normalizer(ulorl::agg_mode::token_mean, c, 2.0, std::nullopt, std::nullopt, std::nullopt, 8);
  REQUIRE(n.denominator == 10);
  REQUIRE(n.scale == 2.0);
  n = P::verl::normalizer(ulorl::agg_mode::seq_mean_token_sum_norm, c, 2.0, std::nullopt, std::nullopt, std::nullopt, 8);
  REQUIRE(n.denominator == 8);
  REQUIRE(n.scale == 1.0);
  n = P::verl::policy_normalizer("gspo", ulorl::agg_mode::token_mean, c, 1.0, 150.0, 16.0, std::nullopt, 8);
  REQUIRE(n.mode == ulorl::agg_mode::seq_mean_token_mean);
  REQUIRE(n.denominator == 16);
  REQUIRE(P::verl::policy_normalizer("geo_mean", ulorl::agg_mode::token_mean, c, 1.0, 150.0, 16.0, std::nullopt, 8).denominator == 4);
  REQUIRE_THROWS_AS(P::verl::agg_mode_from_name("token_mean"), ulorl::error);
}

TEST_CASE("openrlhf, nemo_rl and trl presets") {
  const auto o = P::openrlhf::objective("gspo", 0.2, 0.28, 3.0);
  REQUIRE(o.seq_gradient == ulorl::sequence_gradient::through_mean);
  REQUIRE(o.dual_clip == 3.0);
  REQUIRE_THROWS_AS(P::openrlhf::objective("ppo", 0.2, 0.2, 0.5), ulorl::error);
  REQUIRE(P::openrlhf::kl("k2").output_clamp == 10.0);
  REQUIRE_THROWS_AS(P::openrlhf::kl("k4"), ulorl::error);
  const ulorl::batch_counts c{.tokens = 10, .sequences = 3, .rows = 4};
  REQUIRE(P::openrlhf::normalizer(false, c, 2.0, std::nullopt, 8.0).denominator == 8.0);
  REQUIRE(P::openrlhf::normalizer(false, c, 2.0, std::nullopt, std::nullopt).denominator == 3.0);
  // policy_normalizer: gspo is always sequence-level; ppo keeps the caller's choice.
  const auto ng = P::openrlhf::policy_normalizer("gspo", true, c, 2.0, 10.0, std::nullopt);
  REQUIRE(ng.mode == ulorl::agg_mode::seq_mean_token_mean);
  REQUIRE(ng.denominator == 3.0);
  REQUIRE(ng.scale == 1.0);
  const auto np = P::openrlhf::policy_normalizer("ppo", true, c, 2.0, 10.0, std::nullopt);
  REQUIRE(np.mode == ulorl::agg_mode::token_mean);
  REQUIRE(np.denominator == 10.0);
  REQUIRE(np.scale == 2.0);
  REQUIRE_THROWS_AS(P::openrlhf::policy_normalizer("cispo", true, c, 1.0, std::nullopt, std::nullopt), ulorl::error);
  const auto nk = P::nemo_rl::kl("k3", 20.0, std::nullopt);
  REQUIRE(nk.input_clamp == 20.0);
  REQUIRE(nk.output_clamp == ulorl::no_limit);
  REQUIRE(P::nemo_rl::objective(0.2, 0.28, 3.0).dual_clip == 3.0);
  const auto t = P::trl::objective(0.2, std::nullopt, 1.5, "sequence");
  REQUIRE(t.eps_high == 0.2);
  REQUIRE(t.delta == 1.5);
  REQUIRE(t.kind == ulorl::objective_kind::gspo);
  REQUIRE_THROWS_AS(P::trl::objective(0.2, 0.28, std::nullopt, "tokens"), ulorl::error);
  REQUIRE(P::trl::kl(true).importance_weighted);
  REQUIRE(P::trl::normalizer("grpo", c, 16, 4, std::nullopt, 1).denominator == 4);
  REQUIRE(P::trl::normalizer("grpo", c, 16, 4, std::nullopt, 1).scale == 0.25);
  REQUIRE(P::trl::normalizer("dr_grpo", c, 16, 1, std::nullopt, 1).denominator == 64);
  REQUIRE(P::trl::normalizer("dapo", c, 16, 1, 1000.0, 4).denominator == 250);
  REQUIRE_THROWS_AS(P::trl::normalizer("sum", c, 16, 1, std::nullopt, 1), ulorl::error);
}
