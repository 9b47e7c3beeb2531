// Tests for ulorl/advantage/presets.hpp: each preset's documented behaviour against the oracle.
#include <ulorl/advantage/presets.hpp>

#include <cmath>
#include <vector>

#include "catch.hpp"
#include "support/advantage_oracle.hpp"
#include "support/random.hpp"
#include "support/rejection.hpp"

namespace {
std::vector<double> run(const std::vector<double>& s, const std::vector<std::int64_t>& ids, const ulorl::advantage_preset& p) {
  std::vector<double> out(s.size());
  ulorl::group_advantages(std::span<const double>(s), std::span<const std::int64_t>(ids), std::span<double>(out), p.group);
  return out;
}
}  // namespace

TEST_CASE("verl GRPO: unbiased std, eps 1e-6, singleton s/(1+eps)", "[presets]") {
  testing_support::rng r(17);
  std::vector<double> s(40);
  for (auto& x : s) x = static_cast<double>(r.integer(0, 1));
  const auto ids = testing_support::random_group_ids(r, s.size());
  const auto a = run(s, ids, ulorl::presets::verl::grpo_advantage());
  const auto o = oracle::grpo(s, ids, 1e-6, true, true, true);
  for (std::size_t i = 0; i < s.size(); ++i) REQUIRE(a[i] == Approx(o[i]).epsilon(1e-12).margin(1e-15));
  REQUIRE(run({3.0}, {4}, ulorl::presets::verl::grpo_advantage())[0] == Approx(3.0 / (1 + 1e-6)).epsilon(1e-15));
  REQUIRE(run({3.0}, {4}, ulorl::presets::verl::grpo_advantage({.norm_adv_by_std_in_grpo = false}))[0] == 3.0);
  REQUIRE(run({3.0}, {4}, ulorl::presets::verl::rloo_advantage())[0] == 3.0);
}

TEST_CASE("TRL: eps 1e-4, a group of one gives 0", "[presets]") {
  REQUIRE(run({1.0, 0.0, 1.0}, {0, 1, 2}, ulorl::presets::trl::advantage())[0] == 0.0);
  const auto a = run({1.0, 0.0}, {0, 0}, ulorl::presets::trl::advantage());
  REQUIRE(a[0] == Approx(0.5 / (std::sqrt(0.5) + 1e-4)).epsilon(1e-14));
}

TEST_CASE("OpenRLHF: singletons rejected, eps 1e-9", "[presets]") {
  using E = ulorl::presets::openrlhf::advantage_estimator;
  REQUIRE_THROWS_AS(run({1.0, 0.0}, {0, 1}, ulorl::presets::openrlhf::advantage(E::group_norm)), ulorl::error);
  REQUIRE_THROWS_AS(run({1.0, 0.0}, {0, 1}, ulorl::presets::openrlhf::advantage(E::rloo)), ulorl::error);
  REQUIRE(run({1.0, 0.0}, {0, 1}, ulorl::presets::openrlhf::advantage(E::dr_grpo))[0] == 0.0);
  REQUIRE(run({1.0, 0.0}, {0, 0}, ulorl::presets::openrlhf::advantage(E::group_norm))[0] ==
          Approx(0.5 / (std::sqrt(0.5) + 1e-9)).epsilon(1e-14));
  REQUIRE(ulorl::presets::openrlhf::advantage(E::group_norm).broadcast.placement == ulorl::token_placement::through_last);
}

TEST_CASE("NeMo-RL: leave-one-out, groups of two never normalised", "[presets]") {
  const auto a = run({1.0, 0.0}, {0, 0}, ulorl::presets::nemo_rl::advantage());
  REQUIRE(a[0] == 1.0);
  REQUIRE(a[1] == -1.0);
  testing_support::rng r(23);
  std::vector<double> s(30);
  for (auto& x : s) x = r.normal();
  const auto ids = testing_support::random_group_ids(r, s.size());
  const auto b = run(s, ids, ulorl::presets::nemo_rl::advantage());
  const auto o = oracle::loo(s, ids, true, 1e-6);
  for (std::size_t i = 0; i < s.size(); ++i) REQUIRE(b[i] == Approx(o[i]).epsilon(1e-10).margin(1e-14));
  REQUIRE(ulorl::presets::nemo_rl::advantage().broadcast.placement == ulorl::token_placement::every_position);
}

TEST_CASE("Open-Instruct: biased std, eps 1e-8", "[presets]") {
  const auto a = run({1.0, 0.0, 0.0, 0.0}, {0, 0, 0, 0}, ulorl::presets::open_instruct::advantage());
  REQUIRE(a[0] == Approx(0.75 / (std::sqrt(0.1875) + 1e-8)).epsilon(1e-14));
  REQUIRE(run({1.0, 0.0}, {0, 0}, ulorl::presets::open_instruct::advantage(
                                   {.advantage_normalization_type = ulorl::presets::open_instruct::advantage_normalization::centered}))[0] ==
          0.5);
}

// The presets map their framework's option to a configuration: an option value that names none
// of them is rejected (it used to fall through to "no scaling" / group_norm), and a known one still
// works in a constant expression.
TEST_CASE("TRL scale_rewards and OpenRLHF estimator: unknown values are rejected", "[presets][errors][enum]") {
  using S = ulorl::presets::trl::scale_rewards;
  using E = ulorl::presets::openrlhf::advantage_estimator;
  static_assert(ulorl::presets::trl::advantage(S::batch).group.scale == ulorl::scale_kind::batch_std);
  static_assert(ulorl::presets::openrlhf::advantage(E::rloo).group.baseline == ulorl::baseline_kind::leave_one_out);
  REQUIRE(ulorl::presets::trl::advantage(S::none).group.scale == ulorl::scale_kind::none);
  REQUIRE(ulorl::presets::trl::advantage(S::group).group.scale == ulorl::scale_kind::group_std);
  REQUIRE_THROWS_WITH(ulorl::presets::trl::advantage(static_cast<S>(3)),
                      Catch::Equals("ulorl::presets::trl::advantage: argument 'scale' = 3: unknown enum value "
                                    "(known: 0, 1, 2)"));
  require_unknown_enum([] { (void)ulorl::presets::trl::advantage(static_cast<S>(42)); }, "presets::trl::advantage",
                       "scale", 42);
  require_unknown_enum([] { (void)ulorl::presets::openrlhf::advantage(static_cast<E>(3)); },
                       "presets::openrlhf::advantage", "estimator", 3);
  require_unknown_enum([] { (void)ulorl::presets::openrlhf::advantage(static_cast<E>(-7)); },
                       "presets::openrlhf::advantage", "estimator", -7);
}

TEST_CASE("presets of the added estimators map the frameworks' option names", "[presets]") {
  namespace verl = ulorl::presets::verl;
  static_assert(verl::optimal_token_baseline_advantage().align == ulorl::token_alignment::position);
  static_assert(verl::optimal_token_baseline_advantage().handle_zero_tail);
  static_assert(verl::optimal_token_baseline_advantage().eps == 1e-8);
  constexpr auto tir = verl::tir_optimal_token_baseline_advantage({.handle_zero_tail = false, .epsilon = 1e-6});
  static_assert(tir.align == ulorl::token_alignment::valid_token && !tir.handle_zero_tail && tir.eps == 1e-6);
  constexpr auto gdpo = verl::gdpo_advantage({.norm_adv_by_std_in_grpo = false});
  static_assert(gdpo.group.scale == ulorl::scale_kind::none && gdpo.group.singleton == ulorl::singleton_rule::identity);
  static_assert(gdpo.whiten.unbiased && gdpo.whiten.eps == 1e-8 && gdpo.whiten.mask_output);
  constexpr auto nemo = ulorl::presets::nemo_rl::gdpo_advantage({.use_leave_one_out_baseline = false});
  static_assert(nemo.group.baseline == ulorl::baseline_kind::group_mean && nemo.batch.eps == 0.0 &&
                nemo.batch.zero_std == ulorl::zero_std_rule::skip &&
                nemo.broadcast.placement == ulorl::token_placement::every_position);
  constexpr auto rpp = ulorl::presets::nemo_rl::reinforce_plus_plus_advantage({.minus_baseline = false});
  static_assert(rpp.group.baseline == ulorl::baseline_kind::none && !rpp.whiten.unbiased && !rpp.whiten.mask_output &&
                rpp.whiten.eps_at == ulorl::whiten_eps::floor_variance);
  // minus_baseline = false keeps a singleton's score; true gives it 0
  REQUIRE(run({3.0, 1.0}, {4, 5}, ulorl::advantage_preset{rpp.group, {}})[0] == 3.0);
  REQUIRE(run({3.0, 1.0}, {4, 5}, ulorl::advantage_preset{ulorl::presets::nemo_rl::reinforce_plus_plus_advantage().group, {}})[0] ==
          0.0);
}

TEST_CASE("GRPO presets take options named as their frameworks name them", "[presets]") {
  namespace verl = ulorl::presets::verl;
  namespace nemo = ulorl::presets::nemo_rl;
  namespace oi = ulorl::presets::open_instruct;
  static_assert(verl::grpo_advantage().group.scale == ulorl::scale_kind::group_std && verl::grpo_advantage().group.eps == 1e-6);
  constexpr auto dr = verl::grpo_advantage({.epsilon = 1e-3, .norm_adv_by_std_in_grpo = false});
  static_assert(dr.group.scale == ulorl::scale_kind::none && dr.group.eps == 1e-3);
  static_assert(nemo::advantage().group.scale == ulorl::scale_kind::leave_one_out_std);
  constexpr auto pool = nemo::advantage({.use_leave_one_out_baseline = false});
  static_assert(pool.group.baseline == ulorl::baseline_kind::group_mean && pool.group.scale == ulorl::scale_kind::group_std);
  static_assert(nemo::advantage({.normalize_rewards = false}).group.scale == ulorl::scale_kind::none);
  static_assert(oi::advantage().group.scale == ulorl::scale_kind::group_std);
  static_assert(oi::advantage({.advantage_normalization_type = oi::advantage_normalization::centered}).group.scale ==
                ulorl::scale_kind::none);
  // The GDPO presets build on the same options.
  REQUIRE(verl::gdpo_advantage({.epsilon = 1e-3}).group.eps == verl::grpo_advantage({.epsilon = 1e-3}).group.eps);
  REQUIRE(nemo::gdpo_advantage({.normalize_rewards = false}).group.scale == nemo::advantage({.normalize_rewards = false}).group.scale);
  require_unknown_enum([] { (void)oi::advantage({.advantage_normalization_type = static_cast<oi::advantage_normalization>(2)}); },
                       "presets::open_instruct::advantage", "advantage_normalization_type", 2);
}
