// Tests of ulorl/presets/liger.hpp: LigerFusedLinearGRPOLoss's arguments map to the fused pass's
// policy-loss configuration (objective, KL, Liger's normalisers), the cispo cap below 1 to its input
// adjustments, luspo / vespo to TRL's grpo_loss options; Liger's checks name the argument. For the
// loss types Liger and TRL share, the fused pass on log-probs gives TRL's loss and gradient bit for
// bit (presets::trl::grpo_loss, tested against its own oracle in test_presets_trl_grpo_loss.cpp).
#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/presets/liger.hpp>
#include <ulorl/presets/trl.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"

namespace {

namespace L = ulorl::presets::liger;
namespace T = ulorl::presets::trl;
using LT = L::loss_type_kind;
using IS = L::importance_sampling_kind;

const ulorl::batch_counts counts{.tokens = 9.0, .sequences = 3.0, .rows = 4.0};

std::string argument_of(const L::fused_linear_grpo_options& o) {
  try {
    L::validate(o);
  } catch (const ulorl::error& e) {
    return std::string(e.argument()) + ": " + e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("liger: the constructor's names and defaults") {
  const L::fused_linear_grpo_options o;
  REQUIRE((o.beta == 0.04 && o.use_ref_model && o.epsilon_low == 0.2 && o.epsilon_high == 0.2));
  REQUIRE((o.loss_type == LT::dapo && !o.max_completion_length && o.importance_sampling_level == IS::token));
  REQUIRE((o.sapo_temperature_pos == 1.0 && o.sapo_temperature_neg == 1.05 && o.temperature == 1.0 && !o.delta));
  REQUIRE((!o.use_bias_correction_kl && o.vespo_k_pos == 2.0 && o.vespo_lambda_pos == 3.0 && o.vespo_k_neg == 3.0 &&
           o.vespo_lambda_neg == 2.0));
  REQUIRE(L::loss_type_from_name("dr_grpo") == LT::dr_grpo);
  REQUIRE(L::importance_sampling_level_from_name("sequence") == IS::sequence);
  REQUIRE_THROWS_WITH(L::loss_type_from_name("ppo"),
                      Catch::Matchers::Contains("'loss_type'") && Catch::Matchers::Contains("'ppo'"));
  // Liger has no GSPO-token level.
  REQUIRE_THROWS_WITH(L::importance_sampling_level_from_name("sequence_token"),
                      Catch::Matchers::Contains("'importance_sampling_level'"));
}

TEST_CASE("liger: Liger's checks") {
  for (const LT t : {LT::cispo, LT::sapo, LT::vespo}) {
    const std::string e = argument_of({.loss_type = t, .importance_sampling_level = IS::sequence});
    CHECK(e.rfind("importance_sampling_level: ", 0) == 0);
    CHECK(e.find("Sequence-level importance sampling is not supported for loss_type='") != std::string::npos);
  }
  CHECK(argument_of({.loss_type = LT::dr_grpo}).rfind("max_completion_length: ", 0) == 0);
  CHECK(argument_of({.epsilon_high = 0.0, .loss_type = LT::cispo}).rfind("epsilon_high: ", 0) == 0);
  CHECK(argument_of({.loss_type = static_cast<LT>(11)}).rfind("loss_type: ", 0) == 0);
  CHECK(argument_of({.importance_sampling_level = IS::sequence_token}).rfind("importance_sampling_level: ", 0) == 0);
  CHECK(argument_of({.loss_type = LT::dr_grpo, .max_completion_length = 64.0}).empty());
  CHECK(argument_of({.loss_type = LT::grpo, .importance_sampling_level = IS::sequence}).empty());
  REQUIRE_THROWS_AS(L::fused_linear_grpo({}, counts, std::nullopt, 0.0), ulorl::error);  // world_size
  REQUIRE_THROWS_AS(L::fused_linear_grpo({.loss_type = LT::dr_grpo}, counts), ulorl::error);
}

TEST_CASE("liger: the fused pass's configuration of each loss type") {
  // grpo / sapo: mean of row means over B; bnpo: the valid tokens; dr_grpo: B * max_completion_length;
  // dapo / cispo: max(num_items_in_batch / world, 1).
  const auto norm = [](const L::fused_linear_grpo_options& o, std::optional<double> items = std::nullopt,
                       double world = 1.0) { return L::fused_linear_grpo(o, counts, items, world).config.normalizer; };
  REQUIRE(norm({.loss_type = LT::grpo}).mode == ulorl::agg_mode::seq_mean_token_mean);
  REQUIRE(norm({.loss_type = LT::grpo}).denominator == 4.0);
  REQUIRE(norm({.loss_type = LT::sapo}).denominator == 4.0);
  REQUIRE(norm({.loss_type = LT::bnpo}).denominator == 9.0);
  REQUIRE(L::fused_linear_grpo({.loss_type = LT::bnpo}, {.tokens = 0.0, .sequences = 0.0, .rows = 2.0})
              .config.normalizer.denominator == 1.0);
  REQUIRE(norm({.loss_type = LT::dr_grpo, .max_completion_length = 16.0}).mode == ulorl::agg_mode::constant);
  REQUIRE(norm({.loss_type = LT::dr_grpo, .max_completion_length = 16.0}).denominator == 64.0);
  REQUIRE(norm({}).denominator == 9.0);
  REQUIRE(norm({}, 100.0, 4.0).denominator == 25.0);
  REQUIRE(norm({.loss_type = LT::cispo}, 2.0, 4.0).denominator == 1.0);
  REQUIRE(L::dapo_denominator(100.0, 8.0) == 12.5);

  const auto plan = [](const L::fused_linear_grpo_options& o) { return L::fused_linear_grpo(o, counts); };
  const auto ppo =
      plan({.beta = 0.1, .epsilon_low = 0.1, .epsilon_high = 0.3, .delta = 2.0, .use_bias_correction_kl = true});
  REQUIRE(ppo.fused);
  REQUIRE((ppo.config.objective.kind == ulorl::objective_kind::ppo_clip && ppo.config.objective.eps_low == 0.1 &&
           ppo.config.objective.eps_high == 0.3 && ppo.config.objective.delta == 2.0));
  REQUIRE(ppo.config.objective.log_ratio_clamp == ulorl::no_limit);
  REQUIRE((ppo.config.kl.estimator == ulorl::kl_estimator::k3 && ppo.config.kl.importance_weighted &&
           ppo.config.kl_coef == 0.1));
  REQUIRE(ppo.config.kl.input_clamp == ulorl::no_limit);
  REQUIRE(plan({.use_ref_model = false}).config.kl_coef == 0.0);  // no KL term without the reference model
  const auto gspo = plan({.importance_sampling_level = IS::sequence}).config.objective;
  REQUIRE((gspo.kind == ulorl::objective_kind::gspo &&
           gspo.gspo.seq_gradient == ulorl::sequence_gradient::through_mean &&
           gspo.gspo.seq_log_ratio_max == ulorl::no_limit));
  const auto sapo =
      plan({.loss_type = LT::sapo, .sapo_temperature_pos = 0.5, .sapo_temperature_neg = 2.0}).config.objective;
  REQUIRE((sapo.kind == ulorl::objective_kind::sapo && sapo.sapo.tau_pos == 0.5 && sapo.sapo.tau_neg == 2.0));

  // cispo: min(r, c) is cispo with eps_low = 1, eps_high = c - 1; a cap c < 1 moves old by log c,
  // scales the term by c and, with the importance-weighted KL, its coefficient and logged mean by c.
  const auto ci = plan({.beta = 0.2, .epsilon_high = 4.0, .loss_type = LT::cispo});
  REQUIRE((ci.config.objective.kind == ulorl::objective_kind::cispo && ci.config.objective.eps_low == 1.0 &&
           ci.config.objective.eps_high == 3.0));
  REQUIRE(
      (ci.old_log_prob_shift == 0.0 && ci.weight_scale == 1.0 && ci.kl_mean_scale == 1.0 && ci.config.kl_coef == 0.2));
  const auto low = plan({.beta = 0.2, .epsilon_high = 0.5, .loss_type = LT::cispo, .use_bias_correction_kl = true});
  REQUIRE(low.config.objective.eps_high == 0.0);
  REQUIRE((low.old_log_prob_shift == std::log(0.5) && low.weight_scale == 0.5 && low.kl_mean_scale == 0.5 &&
           low.config.kl_coef == 0.1));
  const auto low_plain = plan({.beta = 0.2, .epsilon_high = 0.5, .loss_type = LT::cispo});
  REQUIRE((low_plain.weight_scale == 0.5 && low_plain.kl_mean_scale == 1.0 && low_plain.config.kl_coef == 0.2));
}

TEST_CASE("liger: luspo and vespo run TRL's loss with the mapped options") {
  const auto p = L::fused_linear_grpo({.beta = 0.3,
                                       .epsilon_low = 0.15,
                                       .epsilon_high = 0.25,
                                       .loss_type = LT::vespo,
                                       .use_bias_correction_kl = true,
                                       .vespo_k_pos = 1.5,
                                       .vespo_lambda_neg = 4.0},
                                      counts, 100.0, 4.0);
  REQUIRE_FALSE(p.fused);
  const T::grpo_loss_options& t = p.trl_options;
  REQUIRE((t.loss_type == T::loss_type_kind::vespo && t.epsilon == 0.15 && *t.epsilon_high == 0.25 && !t.delta &&
           t.beta == 0.3));
  REQUIRE((t.use_bias_correction_kl && t.importance_sampling_level == T::importance_sampling_kind::token));
  REQUIRE((*t.num_items_in_batch == 25.0 && t.num_processes == 1.0 &&
           t.max_completion_length == T::defaults::max_completion_length));
  REQUIRE((t.vespo_k_pos == 1.5 && t.vespo_lambda_pos == 3.0 && t.vespo_k_neg == 3.0 && t.vespo_lambda_neg == 4.0));
  const auto lu = L::fused_linear_grpo(
      {.use_ref_model = false, .loss_type = LT::luspo, .importance_sampling_level = IS::sequence}, counts);
  REQUIRE((!lu.fused && lu.trl_options.beta == 0.0 && *lu.trl_options.num_items_in_batch == 9.0));
  REQUIRE(lu.trl_options.importance_sampling_level == T::importance_sampling_kind::sequence);
  REQUIRE((L::uses_num_items({.loss_type = LT::luspo}) && L::uses_num_items({}) &&
           !L::uses_num_items({.loss_type = LT::bnpo})));
}

TEST_CASE("liger: the fused pass is TRL's loss for the loss types both have, bit for bit") {
  std::mt19937_64 rng(20260117);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const std::size_t B = 4, Tn = 6;
  std::vector<double> lp(B * Tn), old(B * Tn), ref(B * Tn), mask(B * Tn), adv(B), adv_tok(B * Tn);
  for (std::size_t i = 0; i < B * Tn; ++i) {
    old[i] = -3.0 * u(rng) - 0.05;
    lp[i] = old[i] + (u(rng) - 0.5) * 0.8;
    ref[i] = lp[i] + (u(rng) - 0.5) * 0.5;
    mask[i] = (i % Tn) < Tn - (i / Tn) % 3 ? 1.0 : 0.0;  // rows of 6, 5, 4, 6 valid tokens
  }
  for (std::size_t b = 0; b < B; ++b) adv[b] = u(rng) - 0.5;
  for (std::size_t i = 0; i < B * Tn; ++i) adv_tok[i] = adv[i / Tn];
  const auto cv = [&](const std::vector<double>& v) {
    return ulorl::padded(ulorl::matrix_view<const double>(v.data(), B, Tn));
  };
  const auto mv = [&](std::vector<double>& v) { return ulorl::padded(ulorl::matrix_view<double>(v.data(), B, Tn)); };
  const ulorl::batch_counts local = ulorl::count_batch(cv(mask));

  struct pair_case {
    L::fused_linear_grpo_options liger;
    T::grpo_loss_options trl;
  };
  const std::vector<pair_case> cases = {
      {{.beta = 0.05, .epsilon_low = 0.1, .epsilon_high = 0.3, .loss_type = LT::grpo},
       {.loss_type = T::loss_type_kind::grpo, .epsilon = 0.1, .epsilon_high = 0.3, .beta = 0.05}},
      {{.beta = 0.05, .loss_type = LT::bnpo, .use_bias_correction_kl = true},
       {.loss_type = T::loss_type_kind::bnpo, .beta = 0.05, .use_bias_correction_kl = true}},
      {{.beta = 0.0, .loss_type = LT::dr_grpo, .max_completion_length = 32.0},
       {.loss_type = T::loss_type_kind::dr_grpo, .max_completion_length = 32.0}},
      {{.beta = 0.05, .loss_type = LT::dapo, .delta = 1.5},
       {.loss_type = T::loss_type_kind::dapo, .delta = 1.5, .beta = 0.05}},
      {{.beta = 0.05, .loss_type = LT::dapo, .importance_sampling_level = IS::sequence},
       {.loss_type = T::loss_type_kind::dapo,
        .beta = 0.05,
        .importance_sampling_level = T::importance_sampling_kind::sequence}},
      {{.beta = 0.05, .epsilon_high = 3.0, .loss_type = LT::cispo},
       {.loss_type = T::loss_type_kind::cispo, .epsilon_high = 3.0, .beta = 0.05}},
      {{.beta = 0.05, .loss_type = LT::sapo, .sapo_temperature_neg = 1.3},
       {.loss_type = T::loss_type_kind::sapo, .beta = 0.05, .sapo_temperature_neg = 1.3}},
  };
  for (const pair_case& c : cases) {
    INFO("loss_type " << static_cast<int>(c.liger.loss_type) << ", level "
                      << static_cast<int>(c.liger.importance_sampling_level));
    const L::fused_linear_grpo_plan p = L::fused_linear_grpo(c.liger, local);
    REQUIRE(p.fused);
    std::vector<double> g_liger(B * Tn, 0.0), g_trl(B * Tn, 0.0);
    ulorl::policy_loss_inputs<double, double> in{cv(lp), cv(old), cv(adv_tok), cv(mask)};
    in.ref_log_prob = cv(ref);
    const double liger_loss = ulorl::policy_loss(in, mv(g_liger), p.config).loss;
    T::grpo_loss_inputs<double, double> tin{cv(lp), cv(old), cv(mask), adv};
    tin.ref_per_token_logps = cv(ref);
    const double trl_loss = T::grpo_loss(tin, {.grad_per_token_logps = mv(g_trl)}, c.trl).loss;
    REQUIRE(liger_loss == trl_loss);
    REQUIRE(g_liger == g_trl);
  }
}
