// Tests for ulorl/advantage/multi_reward.hpp against the float64 oracle (written from the golden
// README §4.1): the weighted sum, both aggregations, the three final normalisations with the
// frameworks' presets (verl GDPO, TRL multi-objective aggregation, NeMo-RL GDPO), padded and packed
// layouts, and every rejection rule with the outputs untouched.
#include <ulorl/advantage/multi_reward.hpp>
#include <ulorl/presets/nemo_rl.hpp>
#include <ulorl/presets/trl.hpp>
#include <ulorl/presets/verl.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "catch.hpp"
#include "support/advantage_oracle.hpp"
#include "support/random.hpp"
#include "support/rejection.hpp"

namespace {

using ulorl::final_normalization;
using ulorl::reward_aggregation;

struct batch {
  std::size_t B = 0, K = 0;
  std::vector<double> comp;  // [B, K]
  std::vector<std::vector<double>> comp_rows;
  std::vector<double> weights;
  std::vector<std::int64_t> ids;
  shape sh;
  std::vector<double> mask;
  std::vector<std::vector<int>> mask_rows;

  batch(testing_support::rng& r, std::size_t b, std::size_t k, bool packed, bool weighted, bool fixed_groups = false,
        std::size_t group = 1)
      : B(b), K(k) {
    for (std::size_t i = 0; i < B; ++i) {
      comp_rows.emplace_back();
      for (std::size_t j = 0; j < K; ++j) {
        // 0/1 correctness-like components and continuous ones, with ties
        const double v = j % 2 == 0 ? static_cast<double>(r.integer(0, 1)) : r.normal(0.0, 2.0);
        comp.push_back(v);
        comp_rows.back().push_back(v);
      }
    }
    if (weighted)
      for (std::size_t j = 0; j < K; ++j) weights.push_back(r.uniform(-1.0, 3.0));
    if (fixed_groups) {
      for (std::size_t i = 0; i < B; ++i) ids.push_back(static_cast<std::int64_t>(i / group));
    } else {
      ids = testing_support::random_group_ids(r, B);
    }
    if (packed) {
      sh = {0, 0, {0}};
      for (std::size_t i = 0; i < B; ++i) sh.offsets.push_back(sh.offsets.back() + r.integer(0, 9));
    } else {
      sh = {B, static_cast<std::size_t>(r.integer(1, 13)), {}};
    }
    mask.assign(sh.size(), 0.0);
    mask_rows.assign(B, {});
    for (std::size_t i = 0; i < B; ++i) {
      const auto len = static_cast<std::int64_t>(sh.row_size(i));
      const std::size_t valid = static_cast<std::size_t>(r.integer(0, len));
      for (std::size_t t = 0; t < sh.row_size(i); ++t) {
        mask[sh.row_begin(i) + t] = t < valid ? 1.0 : 0.0;
        mask_rows[i].push_back(t < valid);
      }
    }
  }
  [[nodiscard]] ulorl::matrix_view<const double> components() const { return {comp.data(), B, K}; }
  [[nodiscard]] ulorl::group_layout groups() const {
    return ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids));
  }
  [[nodiscard]] std::size_t valid_tokens() const {
    std::size_t n = 0;
    for (double m : mask) n += m != 0;
    return n;
  }
  std::vector<double> tokens(const ulorl::multi_reward_config& cfg) const {
    std::vector<double> out(sh.size(), 7.0);
    ulorl::multi_reward_advantages(components(), std::span<const double>(weights), groups(),
                                   view_of(mask.data(), sh), view_of(out.data(), sh), cfg);
    return out;
  }
  //! Per-response oracle values placed: masked (a·m) or every position.
  [[nodiscard]] oracle::rows place(const std::vector<double>& a, bool every) const {
    oracle::rows x(B);
    for (std::size_t i = 0; i < B; ++i)
      for (std::size_t t = 0; t < sh.row_size(i); ++t) x[i].push_back(every || mask_rows[i][t] ? a[i] : 0.0);
    return x;
  }
  void require_tokens(const std::vector<double>& got, const oracle::rows& want, double tol) const {
    for (std::size_t i = 0; i < B; ++i)
      for (std::size_t t = 0; t < sh.row_size(i); ++t) {
        INFO("row " << i << " token " << t);
        REQUIRE(got[sh.row_begin(i) + t] == Approx(want[i][t]).epsilon(tol).margin(tol));
      }
  }
};

std::vector<double> as_double(const std::vector<long double>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST_CASE("weighted_reward_sum", "[multi_reward]") {
  const std::vector<double> c{1, 2, 3, 4, 5, 6};  // [3, 2]
  const std::vector<double> w{0.5, -1};
  std::vector<double> out(3);
  ulorl::weighted_reward_sum(ulorl::matrix_view<const double>(c.data(), 3, 2), std::span<const double>(w),
                             std::span<double>(out));
  REQUIRE(out == std::vector<double>{-1.5, -2.5, -3.5});
  ulorl::weighted_reward_sum(ulorl::matrix_view<const double>(c.data(), 3, 2), std::span<const double>(),
                             std::span<double>(out));
  REQUIRE(out == std::vector<double>{3, 7, 11});
  // column-major storage of the same matrix
  const std::vector<double> cm{1, 3, 5, 2, 4, 6};
  ulorl::weighted_reward_sum(ulorl::matrix_view<const double>(cm.data(), 3, 2, 1, 3), std::span<const double>(w),
                             std::span<double>(out));
  REQUIRE(out == std::vector<double>{-1.5, -2.5, -3.5});
}

TEST_CASE("verl GDPO: per-component GRPO, weighted sum, masked whitening", "[multi_reward][presets]") {
  testing_support::rng r(5201);
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const auto B = static_cast<std::size_t>(r.integer(1, 23)), K = static_cast<std::size_t>(r.integer(1, 4));
    batch b(r, B, K, trial % 2 == 1, trial % 3 != 0);
    if (b.valid_tokens() < 2) continue;
    for (bool norm : {true, false}) {
      CAPTURE(trial, B, K, norm);
      const auto cfg = ulorl::presets::verl::gdpo_advantage({.epsilon = 1e-6, .norm_adv_by_std_in_grpo = norm});
      const auto a = oracle::weighted_component_sum(b.comp_rows, b.weights, [&](const std::vector<double>& s) {
        return oracle::grpo(s, b.ids, 1e-6, true, norm, true);
      });
      b.require_tokens(b.tokens(cfg), oracle::whiten(b.place(as_double(a), false), b.mask_rows, true, false, true), 1e-9);
      ++checked;
    }
  }
  REQUIRE(checked > 80);
}

TEST_CASE("TRL multi-objective aggregation: sum_then_normalize and normalize_then_sum", "[multi_reward][presets]") {
  using A = ulorl::presets::trl::multi_objective_aggregation;
  using S = ulorl::presets::trl::scale_rewards;
  testing_support::rng r(5202);
  for (int trial = 0; trial < 60; ++trial) {
    const auto G = static_cast<std::size_t>(r.integer(1, 6)), groups = static_cast<std::size_t>(r.integer(1, 5));
    const auto K = static_cast<std::size_t>(r.integer(1, 3));
    batch b(r, G * groups, K, trial % 2 == 1, trial % 3 != 0, true, G);
    const auto fixed = ulorl::group_layout::fixed(b.B, G);
    const auto run = [&](const ulorl::multi_reward_config& cfg) {
      std::vector<double> out(b.sh.size(), 7.0);
      ulorl::multi_reward_advantages(b.components(), std::span<const double>(b.weights), fixed,
                                     view_of<const double>(b.mask.data(), b.sh), view_of(out.data(), b.sh), cfg);
      return out;
    };
    CAPTURE(trial, G, groups, K);
    // sum_then_normalize: TRL's formula on the weighted sum
    std::vector<double> s(b.B, 0.0);
    for (std::size_t i = 0; i < b.B; ++i)
      for (std::size_t k = 0; k < K; ++k) s[i] += (b.weights.empty() ? 1.0 : b.weights[k]) * b.comp_rows[i][k];
    for (S scale : {S::group, S::batch, S::none}) {
      std::vector<double> a(b.B);
      for (std::size_t i = 0; i < b.B; ++i) {
        std::vector<long double> g, all;
        for (std::size_t j = 0; j < b.B; ++j) {
          if (b.ids[j] == b.ids[i]) g.push_back(s[j]);
          all.push_back(s[j]);
        }
        const long double sd = scale == S::group ? oracle::std_of(g, true) : oracle::std_of(all, true);
        const long double c = s[i] - oracle::mean_of(g);
        a[i] = static_cast<double>(scale == S::none ? c : c / (sd + 1e-4L));
      }
      b.require_tokens(run(ulorl::presets::trl::multi_reward_advantage({.scale_rewards = scale})), b.place(a, false), 1e-9);
    }
    // normalize_then_sum (GDPO): z per group and component, weighted sum, batch normalisation
    const auto z = oracle::weighted_component_sum(b.comp_rows, b.weights, [&](const std::vector<double>& c) {
      return oracle::grpo(c, b.ids, 1e-4, true, true, false);
    });
    const auto a = oracle::batch_normalize(z, 1e-4, false);
    for (S scale : {S::group, S::batch, S::none})  // scale_rewards is not used
      b.require_tokens(
          run(ulorl::presets::trl::multi_reward_advantage({.scale_rewards = scale, .multi_objective_aggregation = A::normalize_then_sum})),
          b.place(a, false), 1e-9);
  }
}

TEST_CASE("NeMo-RL GDPO: per-component leave-one-out, weighted sum, batch normalisation without eps",
          "[multi_reward][presets]") {
  testing_support::rng r(5203);
  for (int trial = 0; trial < 60; ++trial) {
    const auto B = static_cast<std::size_t>(r.integer(1, 23)), K = static_cast<std::size_t>(r.integer(2, 4));
    batch b(r, B, K, trial % 2 == 1, trial % 3 != 0);
    for (bool loo : {true, false})
      for (bool normalize : {true, false}) {
        CAPTURE(trial, B, K, loo, normalize);
        const auto z = oracle::weighted_component_sum(b.comp_rows, b.weights, [&](const std::vector<double>& c) {
          // NeMo-RL's GRPO: leave-one-out or whole-group pool, scaling skipped when its std is 0
          if (loo) return oracle::loo(c, b.ids, normalize, 1e-6);
          std::vector<double> out(c.size());
          for (std::size_t i = 0; i < c.size(); ++i) {
            std::vector<long double> g;
            for (std::size_t j = 0; j < c.size(); ++j)
              if (b.ids[j] == b.ids[i]) g.push_back(c[j]);
            if (g.size() == 1) continue;
            const long double sd = oracle::std_of(g, true), d = c[i] - oracle::mean_of(g);
            out[i] = static_cast<double>(normalize && sd > 0 ? d / (sd + 1e-6L) : d);
          }
          return out;
        });
        const auto a = oracle::batch_normalize(z, 0.0, true);
        const auto cfg = ulorl::presets::nemo_rl::gdpo_advantage({.use_leave_one_out_baseline = loo, .normalize_rewards = normalize});
        b.require_tokens(b.tokens(cfg), b.place(a, true), 1e-9);
        std::vector<double> per(B, 7.0);
        ulorl::multi_reward_advantages(b.components(), std::span<const double>(b.weights), b.groups(),
                                       std::span<double>(per), cfg);
        for (std::size_t i = 0; i < B; ++i) REQUIRE(per[i] == Approx(a[i]).epsilon(1e-9).margin(1e-9));
      }
  }
}

TEST_CASE("multi-reward: one component with sum_then_normalize is the single-reward advantage", "[multi_reward]") {
  testing_support::rng r(5204);
  batch b(r, 17, 1, false, false);
  std::vector<double> s(b.B), single(b.B), multi(b.B, 7.0);
  for (std::size_t i = 0; i < b.B; ++i) s[i] = b.comp[i];
  const auto p = ulorl::presets::verl::grpo_advantage();
  ulorl::group_advantages(std::span<const double>(s), b.groups(), std::span<double>(single), p.group);
  ulorl::multi_reward_advantages(b.components(), std::span<const double>(), b.groups(), std::span<double>(multi),
                                 {.aggregation = reward_aggregation::sum_then_normalize, .group = p.group});
  REQUIRE(multi == single);
  // and with normalize_then_sum too (one component, weight 1, no final step)
  ulorl::multi_reward_advantages(b.components(), std::span<const double>(), b.groups(), std::span<double>(multi),
                                 {.aggregation = reward_aggregation::normalize_then_sum, .group = p.group});
  REQUIRE(multi == single);
}

TEST_CASE("multi-reward rejects bad inputs, outputs untouched", "[multi_reward][errors]") {
  const std::string fn = "multi_reward_advantages";
  testing_support::rng r(5205);
  for (bool packed : {false, true}) {
    batch b(r, 6, 2, packed, true);
    std::fill(b.mask.begin(), b.mask.end(), 1.0);
    if (b.valid_tokens() < 2) {
      b.sh = {6, 3, {}};
      b.mask.assign(18, 1.0);
    }
    const auto gdpo = ulorl::presets::verl::gdpo_advantage();
    std::vector<double> out(b.sh.size(), 7.0), per(b.B, 7.0);
    const auto tokens = [&](ulorl::matrix_view<const double> c, std::span<const double> w, const ulorl::group_layout& g,
                            ulorl::token_view<const double> m, ulorl::token_view<double> o, const ulorl::multi_reward_config& cfg) {
      return outcome_of([&] { ulorl::multi_reward_advantages(c, w, g, m, o, cfg); });
    };
    const auto comp = b.components();
    const auto w = std::span<const double>(b.weights);
    const auto mask = view_of<const double>(b.mask.data(), b.sh);
    const auto o = view_of(out.data(), b.sh);
    const auto g = b.groups();
    const auto untouched = [&] { return all_equal(out, 7.0) && all_equal(per, 7.0); };

    // components: none, fewer than min_components, wrong rows, non-finite
    require_rejected(tokens({b.comp.data(), b.B, 0}, {}, g, mask, o, gdpo), fn, "components", -1);
    require_rejected(tokens({b.comp.data(), b.B, 1}, w.first(1), g, mask, o, ulorl::presets::nemo_rl::gdpo_advantage()), fn,
                     "components", -1);
    require_rejected(tokens({b.comp.data(), b.B - 1, 2}, w, g, mask, o, gdpo), fn, "groups", -1);
    require_rejected(tokens({b.comp.data(), 0, 2}, w, g, mask, o, gdpo), fn, "components", -1);
    for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
      std::vector<double> c = b.comp;
      c[5] = bad;
      require_rejected(tokens({c.data(), b.B, 2}, w, g, mask, o, gdpo), fn, "components", 5);
      std::vector<double> ww = b.weights;
      ww[1] = bad;
      require_rejected(tokens(comp, std::span<const double>(ww), g, mask, o, gdpo), fn, "weights", 1);
    }
    // weights of the wrong count
    const std::vector<double> three{1, 1, 1};
    require_rejected(tokens(comp, w.first(1), g, mask, o, gdpo), fn, "weights", -1);
    require_rejected(tokens(comp, std::span<const double>(three), g, mask, o, gdpo), fn, "weights", -1);
    // groups that do not cover the rows
    std::vector<std::int64_t> ids(b.B + 1, 0);
    require_rejected(tokens(comp, w, ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids)), mask, o, gdpo), fn,
                     "groups", -1);
    // masks and outputs
    for (const shape& ws : wrong_shapes(b.sh)) {
      std::vector<double> other(ws.size(), 1.0), other_out(ws.size(), 7.0);
      if (ws.rows() != b.B) {
        require_rejected(tokens(comp, w, g, view_of<const double>(other.data(), ws), view_of(other_out.data(), ws), gdpo), fn,
                         "mask", -1);
      }
      require_rejected(tokens(comp, w, g, mask, view_of(other_out.data(), ws), gdpo), fn, "out", -1);
      REQUIRE(all_equal(other_out, 7.0));
    }
    for (double bad : {2.0, 0.5, -1.0, std::nan("")}) {
      std::vector<double> m = b.mask;
      m[3] = bad;
      require_rejected(tokens(comp, w, g, view_of<const double>(m.data(), b.sh), o, gdpo), fn, "mask", 3);
    }
    // an empty mask row when not allowed; too few valid tokens to whiten
    {
      auto cfg = gdpo;
      cfg.broadcast.allow_empty_rows = false;
      std::vector<double> m = b.mask;
      for (std::size_t t = 0; t < b.sh.row_size(2); ++t) m[b.sh.row_begin(2) + t] = 0.0;
      if (b.sh.row_size(2) > 0)
        require_rejected(tokens(comp, w, g, view_of<const double>(m.data(), b.sh), o, cfg), fn, "mask", 2);
      std::vector<double> zeros(b.mask.size(), 0.0);
      zeros[0] = 1.0;
      require_rejected(tokens(comp, w, g, view_of<const double>(zeros.data(), b.sh), o, gdpo), fn, "mask", -1);
    }
    // configuration: unknown enums, a bad eps, tokens on the per-response overload
    {
      auto cfg = gdpo;
      cfg.aggregation = static_cast<reward_aggregation>(5);
      require_unknown_enum([&] { ulorl::multi_reward_advantages(comp, w, g, mask, o, cfg); }, fn, "config.aggregation", 5);
      cfg = gdpo;
      cfg.final_norm = static_cast<final_normalization>(-2);
      require_unknown_enum([&] { ulorl::multi_reward_advantages(comp, w, g, mask, o, cfg); }, fn, "config.final_norm", -2);
      cfg = gdpo;
      cfg.broadcast.placement = static_cast<ulorl::token_placement>(9);
      require_unknown_enum([&] { ulorl::multi_reward_advantages(comp, w, g, mask, o, cfg); }, fn,
                           "config.broadcast.placement", 9);
      cfg = gdpo;
      cfg.whiten.eps_at = static_cast<ulorl::whiten_eps>(4);
      require_unknown_enum([&] { ulorl::multi_reward_advantages(comp, w, g, mask, o, cfg); }, fn, "config.whiten.eps_at", 4);
      cfg = gdpo;
      cfg.group.scale = static_cast<ulorl::scale_kind>(8);
      require_unknown_enum([&] { ulorl::multi_reward_advantages(comp, w, g, mask, o, cfg); }, fn, "config.scale", 8);
      cfg = gdpo;
      cfg.whiten.eps = 0.0;
      require_rejected(tokens(comp, w, g, mask, o, cfg), fn, "config.whiten.eps", -1);
      cfg = gdpo;
      cfg.group.eps = 0.0;
      require_rejected(tokens(comp, w, g, mask, o, cfg), fn, "config.eps", -1);
      require_rejected(outcome_of([&] { ulorl::multi_reward_advantages(comp, w, g, std::span<double>(per), gdpo); }), fn,
                       "config.final_norm", -1);
      require_rejected(outcome_of([&] {
                         ulorl::multi_reward_advantages(comp, w, g, std::span<double>(per).first(b.B - 1),
                                                        ulorl::presets::nemo_rl::gdpo_advantage());
                       }),
                       fn, "out", -1);
    }
    // a rejection inside a component's group advantage (a singleton under singleton_rule::reject)
    {
      auto cfg = gdpo;
      cfg.group.singleton = ulorl::singleton_rule::reject;
      std::vector<std::int64_t> solo(b.B, 1);
      solo[4] = 2;
      const auto o2 = tokens(comp, w, ulorl::group_layout::from_ids(std::span<const std::int64_t>(solo)), mask, o, cfg);
      REQUIRE(o2.threw);
      REQUIRE(o2.argument == "groups");
    }
    REQUIRE(untouched());
  }
  // weighted_reward_sum
  const std::vector<double> c{1, 2, std::nan(""), 4};
  std::vector<double> out(2, 7.0);
  require_rejected(outcome_of([&] {
                     ulorl::weighted_reward_sum(ulorl::matrix_view<const double>(c.data(), 2, 2), std::span<const double>(),
                                                std::span<double>(out));
                   }),
                   "weighted_reward_sum", "components", 2);
  const std::vector<double> big{1e308, 1e308};
  require_rejected(outcome_of([&] {
                     ulorl::weighted_reward_sum(ulorl::matrix_view<const double>(big.data(), 1, 2), std::span<const double>(),
                                                std::span<double>(out).first(1));
                   }),
                   "weighted_reward_sum", "components", 0);
  require_rejected(outcome_of([&] {
                     ulorl::weighted_reward_sum(ulorl::matrix_view<const double>(c.data(), 1, 2), std::span<const double>(),
                                                std::span<double>(out));
                   }),
                   "weighted_reward_sum", "out", -1);
  REQUIRE(all_equal(out, 7.0));
}

TEST_CASE("TRL multi_reward_advantage: unknown enums are rejected; presets are constant expressions", "[multi_reward][presets][enum]") {
  using A = ulorl::presets::trl::multi_objective_aggregation;
  using S = ulorl::presets::trl::scale_rewards;
  static_assert(ulorl::presets::trl::multi_reward_advantage({.multi_objective_aggregation = A::normalize_then_sum}).final_norm ==
                final_normalization::responses);
  static_assert(ulorl::presets::verl::gdpo_advantage().final_norm == final_normalization::tokens);
  static_assert(ulorl::presets::nemo_rl::gdpo_advantage().min_components == 2);
  require_unknown_enum([] { (void)ulorl::presets::trl::multi_reward_advantage({.multi_objective_aggregation = static_cast<A>(3)}); },
                       "presets::trl::multi_reward_advantage", "multi_objective_aggregation", 3);
  require_unknown_enum([] { (void)ulorl::presets::trl::multi_reward_advantage({.scale_rewards = static_cast<S>(6)}); },
                       "presets::trl::advantage", "scale", 6);
}

TEST_CASE("multi-reward token advantages: an absent mask is an all-ones mask, bit for bit, in both layouts", "[multi_reward][mask]") {
  testing_support::rng r(5301);
  for (const bool packed : {false, true}) {
    batch b(r, 12, 3, packed, true);
    if (packed) b.sh.offsets = {0, 3, 5, 9, 10, 12, 17, 18, 22, 23, 27, 29, 30};  // no empty row
    std::fill(b.mask.begin(), b.mask.end(), 1.0);
    b.mask.resize(b.sh.size(), 1.0);
    for (const auto& cfg : {ulorl::presets::verl::gdpo_advantage(), ulorl::presets::nemo_rl::gdpo_advantage(),
                            ulorl::presets::trl::multi_reward_advantage()}) {
      const std::vector<double> ones = b.tokens(cfg);
      std::vector<double> absent(b.sh.size(), 7.0);
      ulorl::multi_reward_advantages(b.components(), std::span<const double>(b.weights), b.groups(),
                                     ulorl::token_view<const double>{}, view_of(absent.data(), b.sh), cfg);
      REQUIRE(std::memcmp(absent.data(), ones.data(), ones.size() * sizeof(double)) == 0);
    }
  }
}
