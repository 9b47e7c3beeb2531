// Tests of ulorl/presets/nemo_rl.hpp: NeMo-RL's config keys map to the documented parameters of
// the advantage and loss areas, the KL defaults are one set shared by kl_options and
// clipped_pg_loss_options, and unknown names are rejected. (ClippedPGLossFn's pieces against an
// oracle: test_loss_policy_modes.cpp; the rollout correction: test_loss_rollout_correction.cpp.)
#include <ulorl/presets/nemo_rl.hpp>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "catch.hpp"
#include "support/advantage_oracle.hpp"
#include "support/presets.hpp"
#include "support/random.hpp"

namespace P = ulorl::presets;

TEST_CASE("nemo_rl presets") {
  const auto nk = P::nemo_rl::kl({.kl_input_clamp_value = 20.0, .kl_output_clamp_value = std::nullopt});
  REQUIRE(nk.estimator == ulorl::kl_estimator::k3);
  REQUIRE(nk.input_clamp == 20.0);
  REQUIRE(nk.output_clamp == ulorl::no_limit);
  REQUIRE(P::nemo_rl::objective({.ratio_clip_max = 0.28, .ratio_clip_c = 3.0}).dual_clip == 3.0);
  REQUIRE_THROWS_AS(P::nemo_rl::kl_type_from_name("abs"), ulorl::error);
  // The reference KL's configuration: NeMo-RL's keys, the weight of use_on_policy_kl_approximation.
  P::nemo_rl::clipped_pg_loss_options o{.reference_policy_kl_penalty = 0.3,
                                        .reference_policy_kl_type = ulorl::kl_estimator::k2,
                                        .kl_output_clamp_value = std::nullopt};
  auto r = P::nemo_rl::reference_policy_kl(o);
  REQUIRE((r.coef == 0.3 && r.estimator == ulorl::kl_estimator::k2 && r.input_clamp == 20.0 &&
           r.output_clamp == ulorl::no_limit));
  REQUIRE(r.weight == ulorl::kl_importance_weight::current_policy);
  o.use_on_policy_kl_approximation = true;
  REQUIRE(P::nemo_rl::reference_policy_kl(o).weight == ulorl::kl_importance_weight::rollout_policy);
  REQUIRE_THROWS_AS(P::nemo_rl::reference_policy_kl({.reference_policy_kl_type = ulorl::kl_estimator::abs}),
                    ulorl::error);
}

TEST_CASE("nemo_rl: the KL defaults are one set (calculate_kl's and ClippedPGLossConfig's)", "[presets][defaults]") {
  namespace D = P::nemo_rl::defaults;
  const P::nemo_rl::kl_options k;
  const P::nemo_rl::clipped_pg_loss_options c;
  REQUIRE((k.reference_policy_kl_type == D::reference_policy_kl_type &&
           c.reference_policy_kl_type == D::reference_policy_kl_type));
  REQUIRE((*k.kl_input_clamp_value == D::kl_input_clamp_value && *c.kl_input_clamp_value == D::kl_input_clamp_value));
  REQUIRE(
      (*k.kl_output_clamp_value == D::kl_output_clamp_value && *c.kl_output_clamp_value == D::kl_output_clamp_value));
  const auto kc = P::nemo_rl::kl({});
  REQUIRE((kc.estimator == ulorl::kl_estimator::k3 && kc.input_clamp == 20.0 && kc.output_clamp == 10.0));
}

TEST_CASE("nemo_rl: use_cispo and sequence_level_importance_ratios choose the objective", "[presets]") {
  using ulorl::objective_kind;
  const auto cispo = P::nemo_rl::objective({.ratio_clip_max = 0.28, .use_cispo = true});
  REQUIRE((cispo.kind == objective_kind::cispo && cispo.eps_low == 0.2 && cispo.eps_high == 0.28 &&
           cispo.dual_clip == 0.0));
  const auto gspo = P::nemo_rl::objective({.token_level_loss = false, .sequence_level_importance_ratios = true});
  REQUIRE((gspo.kind == objective_kind::gspo && gspo.gspo.seq_gradient == ulorl::sequence_gradient::through_mean &&
           gspo.gspo.seq_log_ratio_max == ulorl::no_limit && gspo.log_ratio_clamp == ulorl::no_limit));
  // NeMo-RL's ratio under force_on_policy_ratio / disable_ppo_ratio is theirs, not the row's.
  REQUIRE(P::nemo_rl::objective(
              {.token_level_loss = false, .force_on_policy_ratio = true, .sequence_level_importance_ratios = true})
              .kind == objective_kind::ppo_clip);
  REQUIRE(P::nemo_rl::objective(
              {.token_level_loss = false, .disable_ppo_ratio = true, .sequence_level_importance_ratios = true})
              .kind == objective_kind::policy_gradient);
  REQUIRE(P::nemo_rl::rollout_correction(
              P::nemo_rl::clipped_pg_loss_options{.token_level_loss = false, .sequence_level_importance_ratios = true})
              .importance.level == ulorl::rollout_correction::is_level::sequence);
  // NeMo-RL's assertions.
  REQUIRE_THROWS_AS(P::nemo_rl::validate({.sequence_level_importance_ratios = true}), ulorl::error);
  REQUIRE_THROWS_AS(P::nemo_rl::validate({.ratio_clip_c = 3.0, .use_cispo = true}), ulorl::error);
  REQUIRE_THROWS_AS(P::nemo_rl::validate({.token_level_loss = false, .use_cispo = true}), ulorl::error);
  REQUIRE_THROWS_AS(P::nemo_rl::validate({.force_on_policy_ratio = true, .use_cispo = true}), ulorl::error);
  REQUIRE_THROWS_AS(P::nemo_rl::validate({.disable_ppo_ratio = true, .use_cispo = true}), ulorl::error);
}

TEST_CASE("nemo_rl: the positive-example NLL term", "[presets]") {
  REQUIRE_FALSE(P::nemo_rl::positive_example_nll({}, 5.0));
  REQUIRE_FALSE(P::nemo_rl::positive_example_nll({.positive_example_nll_weight = 0.5}, 0.0));
  const auto n = P::nemo_rl::positive_example_nll({.positive_example_nll_weight = 0.5}, 5.0);
  REQUIRE((n && n->mode == ulorl::agg_mode::token_mean && n->denominator == 5.0 && n->scale == -0.5));
  REQUIRE_THROWS_AS(P::nemo_rl::positive_example_nll({.positive_example_nll_weight = 0.5}, -1.0), ulorl::error);
}

TEST_CASE("nemo_rl: a NaN option is rejected even where the preset does not use it", "[presets][nan]") {
  require_nan_rejected([&] { return P::nemo_rl::objective({.truncated_importance_sampling_ratio_min = std::nan("")}); },
                       "truncated_importance_sampling_ratio_min");
}

// ---- advantages -----------------------------------------------------------------------------------

TEST_CASE("NeMo-RL: leave-one-out, groups of two never normalised", "[presets]") {
  const auto a = preset_advantages({1.0, 0.0}, {0, 0}, ulorl::presets::nemo_rl::advantage());
  REQUIRE(a[0] == 1.0);
  REQUIRE(a[1] == -1.0);
  testing_support::rng r(23);
  std::vector<double> s(30);
  for (auto& x : s) x = r.normal();
  const auto ids = testing_support::random_group_ids(r, s.size());
  const auto b = preset_advantages(s, ids, ulorl::presets::nemo_rl::advantage());
  const auto o = oracle::loo(s, ids, true, 1e-6);
  for (std::size_t i = 0; i < s.size(); ++i) REQUIRE(b[i] == Approx(o[i]).epsilon(1e-10).margin(1e-14));
  REQUIRE(ulorl::presets::nemo_rl::advantage().broadcast.placement == ulorl::token_placement::every_position);
}

TEST_CASE("NeMo-RL advantage presets take NeMo-RL's option names", "[presets]") {
  namespace nemo = ulorl::presets::nemo_rl;
  static_assert(nemo::advantage().group.scale == ulorl::scale_kind::leave_one_out_std);
  constexpr auto pool = nemo::advantage({.use_leave_one_out_baseline = false});
  static_assert(pool.group.baseline == ulorl::baseline_kind::group_mean &&
                pool.group.scale == ulorl::scale_kind::group_std);
  static_assert(nemo::advantage({.normalize_rewards = false}).group.scale == ulorl::scale_kind::none);
  constexpr auto gdpo = nemo::gdpo_advantage({.use_leave_one_out_baseline = false});
  static_assert(gdpo.group.baseline == ulorl::baseline_kind::group_mean && gdpo.batch.eps == 0.0 &&
                gdpo.batch.zero_std == ulorl::zero_std_rule::skip &&
                gdpo.broadcast.placement == ulorl::token_placement::every_position);
  REQUIRE(nemo::gdpo_advantage({.normalize_rewards = false}).group.scale ==
          nemo::advantage({.normalize_rewards = false}).group.scale);
  constexpr auto rpp = nemo::reinforce_plus_plus_advantage({.minus_baseline = false});
  static_assert(rpp.group.baseline == ulorl::baseline_kind::none && !rpp.whiten.unbiased && !rpp.whiten.mask_output &&
                rpp.whiten.eps_at == ulorl::whiten_eps::floor_variance);
  // minus_baseline = false keeps a singleton's score; true gives it 0
  REQUIRE(preset_advantages({3.0, 1.0}, {4, 5}, ulorl::advantage_preset{rpp.group, {}})[0] == 3.0);
  REQUIRE(preset_advantages({3.0, 1.0}, {4, 5},
                            ulorl::advantage_preset{nemo::reinforce_plus_plus_advantage().group, {}})[0] == 0.0);
}

TEST_CASE("nemo_rl: the options encode whole, the optional truncation type included", "[presets][fields]") {
  namespace N = ulorl::presets::nemo_rl;
  const auto names = ulorl::field_names<N::clipped_pg_loss_options>();
  REQUIRE(names.size() == ulorl::encoded_size_of<N::clipped_pg_loss_options>);
  const auto at = [&](std::string_view name) {
    const auto it = std::find(names.begin(), names.end(), name);
    REQUIRE(it != names.end());
    return static_cast<std::size_t>(it - names.begin());
  };
  const std::size_t type = at("truncated_importance_sampling_type");
  REQUIRE(at("truncated_importance_sampling_type.value") == type + 1);
  for (const N::clipped_pg_loss_options& o : {N::clipped_pg_loss_options{}, N::prorl_v2(), N::prorl_v2_1()}) {
    const auto enc = ulorl::encode_fields(o);
    const auto back = ulorl::decode_fields<N::clipped_pg_loss_options>("f", "options", enc);
    REQUIRE(back.truncated_importance_sampling_type == o.truncated_importance_sampling_type);
    REQUIRE(back.truncated_importance_sampling_ratio == o.truncated_importance_sampling_ratio);
    REQUIRE(back.force_on_policy_ratio == o.force_on_policy_ratio);
    REQUIRE(back.kl_input_clamp_value == o.kl_input_clamp_value);
    REQUIRE(ulorl::encode_fields(back) == enc);
  }
  // prorl_v2_1: seq-mask-tis, present, with its enumerator's value.
  auto enc = ulorl::encode_fields(N::prorl_v2_1());
  REQUIRE(enc[type] == 1.0);
  REQUIRE(enc[type + 1] ==
          static_cast<double>(static_cast<int>(ulorl::rollout_correction::is_weighting::geometric_gate)));
  // A non-integral type is a decoding error naming the value's field; an unnamed one, validate's.
  enc[type + 1] = 0.5;
  REQUIRE_THROWS_WITH(ulorl::decode_fields<N::clipped_pg_loss_options>("f", "options", enc),
                      Catch::Contains("field 'truncated_importance_sampling_type.value'"));
  enc[type + 1] = 7.0;
  const auto unnamed = ulorl::decode_fields<N::clipped_pg_loss_options>("f", "options", enc);
  REQUIRE_THROWS_WITH(N::validate(unnamed), Catch::Contains("'truncated_importance_sampling_type'") &&
                                                Catch::Contains("is no type NeMo-RL names"));
}
