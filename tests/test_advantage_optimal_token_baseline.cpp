// Tests for ulorl/advantage/optimal_token_baseline.hpp against the float64 oracle (written from the
// golden README §4.1): both alignments, the zero tail, importance weights, padded and packed
// layouts, float storage, properties, and every rejection rule with the outputs untouched.
#include <ulorl/advantage/optimal_token_baseline.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "catch.hpp"
#include "support/advantage_oracle.hpp"
#include "support/random.hpp"
#include "support/rejection.hpp"

namespace {

using ulorl::token_alignment;

//! One batch in either layout (flat storage addressed through `sh`) and its outputs.
template <class T = double>
struct otb_case {
  shape sh;
  std::vector<T> R, lp, spp, rho, mask;
  std::vector<std::int64_t> ids;
  std::vector<T> ret, adv;

  otb_case(const shape& s, testing_support::rng& r, bool weighted, bool holes, double empty_row_p = 0.15) : sh(s) {
    const std::size_t n = sh.size();
    R.assign(n, T(0));
    lp.assign(n, T(0));
    spp.assign(n, T(0));
    mask.assign(n, T(0));
    if (weighted) rho.assign(n, T(0));
    const T nan = std::numeric_limits<T>::quiet_NaN();
    for (std::size_t b = 0; b < sh.rows(); ++b) {
      const std::size_t len = sh.row_size(b);
      const std::size_t valid = r.coin(empty_row_p) ? 0 : static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(len)));
      for (std::size_t t = 0; t < len; ++t) {
        const std::size_t k = sh.row_begin(b) + t;
        const bool on = t < valid && !(holes && t > 0 && r.coin(0.2));
        mask[k] = on ? T(1) : T(0);
        // Masked positions hold values the function must not read: NaN for the policy statistics,
        // a large finite reward (a masked reward never enters G).
        if (!on) {
          R[k] = T(1e3);
          lp[k] = spp[k] = nan;
          if (weighted) rho[k] = nan;
          continue;
        }
        R[k] = static_cast<T>(r.coin(0.3) ? r.normal() : 0.0);
        const double p = r.uniform(0.01, 1.0);
        lp[k] = static_cast<T>(std::log(p));
        // Σπ² of a distribution whose chosen token has probability p: in [p², p² + (1 - p)²].
        spp[k] = static_cast<T>(p * p + (1 - p) * (1 - p) * r.uniform(0.01, 1.0));
        if (weighted) rho[k] = static_cast<T>(r.uniform(0.3, 2.0));
      }
      if (valid > 0 && r.coin(0.8)) R[sh.row_begin(b) + valid - 1] += T(1);  // an outcome reward at the end
    }
    ids = testing_support::random_group_ids(r, sh.rows());
    ret.assign(n, T(7));
    adv.assign(n, T(7));
  }

  [[nodiscard]] ulorl::optimal_token_baseline_inputs<T> inputs() const {
    return {.token_rewards = view_of(R.data(), sh),
            .mask = view_of(mask.data(), sh),
            .old_log_prob = view_of(lp.data(), sh),
            .sum_pi_squared = view_of(spp.data(), sh),
            .rollout_is_weights = rho.empty() ? ulorl::token_view<const T>{} : view_of(rho.data(), sh)};
  }
  void run(const ulorl::optimal_token_baseline_config& cfg) {
    ulorl::optimal_token_baseline_advantages(inputs(), ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids)),
                                             view_of(ret.data(), sh), view_of(adv.data(), sh), cfg);
  }
  [[nodiscard]] oracle::rows rows_of(const std::vector<T>& v) const {
    oracle::rows out(sh.rows());
    for (std::size_t b = 0; b < sh.rows(); ++b)
      for (std::size_t t = 0; t < sh.row_size(b); ++t) out[b].push_back(static_cast<double>(v[sh.row_begin(b) + t]));
    return out;
  }
  void expect(const ulorl::optimal_token_baseline_config& cfg, double rtol) const {
    std::vector<std::vector<int>> m(sh.rows());
    for (std::size_t b = 0; b < sh.rows(); ++b)
      for (std::size_t t = 0; t < sh.row_size(b); ++t) m[b].push_back(mask[sh.row_begin(b) + t] != T(0));
    oracle::rows ro, ao;
    oracle::optimal_token_baseline(rows_of(R), m, rows_of(lp), rows_of(spp), rho.empty() ? oracle::rows{} : rows_of(rho),
                                   ids, cfg.handle_zero_tail, cfg.eps, cfg.align == token_alignment::valid_token, ro, ao);
    double scale = 1.0;
    for (const auto& row : ro)
      for (double g : row) scale = std::max(scale, std::fabs(g));
    for (std::size_t b = 0; b < sh.rows(); ++b)
      for (std::size_t t = 0; t < sh.row_size(b); ++t) {
        const std::size_t k = sh.row_begin(b) + t;
        INFO("row " << b << " token " << t);
        REQUIRE(static_cast<double>(ret[k]) == Approx(ro[b][t]).epsilon(rtol).margin(rtol * scale));
        REQUIRE(static_cast<double>(adv[k]) == Approx(ao[b][t]).epsilon(rtol).margin(rtol * scale));
        if (mask[k] == T(0)) REQUIRE(adv[k] == T(0));
      }
  }
};

shape random_shape(testing_support::rng& r, bool packed) {
  const std::size_t B = static_cast<std::size_t>(r.integer(1, 17));
  if (!packed) return {B, static_cast<std::size_t>(r.integer(1, 47)), {}};
  shape s{0, 0, {0}};
  for (std::size_t b = 0; b < B; ++b) s.offsets.push_back(s.offsets.back() + r.integer(0, 40));
  return s;
}

}  // namespace

TEST_CASE("optimal token baseline matches the oracle: both alignments, zero tail, IS weights, both layouts",
          "[optimal_token_baseline]") {
  const std::uint64_t seed = 4101;
  INFO("seed " << seed);
  testing_support::rng r(seed);
  int checked = 0;
  for (int trial = 0; trial < 160; ++trial) {
    const bool packed = trial % 2 == 1, weighted = trial % 3 == 0, holes = trial % 4 >= 2;
    otb_case<double> c(random_shape(r, packed), r, weighted, holes);
    for (auto align : {token_alignment::position, token_alignment::valid_token})
      for (bool tail : {true, false})
        for (double eps : {1e-8, 1e-6}) {
          const ulorl::optimal_token_baseline_config cfg{.align = align, .handle_zero_tail = tail, .eps = eps};
          CAPTURE(trial, packed, weighted, holes, tail, eps, static_cast<int>(align));
          c.run(cfg);
          c.expect(cfg, 1e-10);
          ++checked;
        }
  }
  REQUIRE(checked == 160 * 8);
}

TEST_CASE("optimal token baseline in float storage", "[optimal_token_baseline]") {
  testing_support::rng r(4102);
  for (int trial = 0; trial < 20; ++trial) {
    otb_case<float> c(random_shape(r, trial % 2 == 1), r, trial % 3 == 0, trial % 4 >= 2);
    const ulorl::optimal_token_baseline_config cfg{.align = trial % 2 ? token_alignment::valid_token : token_alignment::position};
    c.run(cfg);
    c.expect(cfg, 2e-5);
  }
}

TEST_CASE("optimal token baseline: the zero tail, singletons and the golden README example", "[optimal_token_baseline]") {
  // Group 7: rows of 5, 2 and 3 valid tokens, reward 1 at the end of rows 0 and 2; row 3 alone.
  const shape sh{4, 5, {}};
  const std::vector<double> R{0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0.5, 0};
  const std::vector<double> m{1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0};
  std::vector<double> lp(20, std::log(0.5)), spp(20, 0.5);  // w = 1 - 1 + 0.5 = 0.5 per token
  const std::vector<std::int64_t> ids{7, 7, 7, 9};
  for (bool tail : {true, false})
    for (auto align : {token_alignment::position, token_alignment::valid_token}) {
      std::vector<double> ret(20), adv(20);
      ulorl::optimal_token_baseline_advantages(
          ulorl::optimal_token_baseline_inputs<double>{view_of(R.data(), sh), view_of(m.data(), sh),
                                                       view_of(lp.data(), sh), view_of(spp.data(), sh)},
          ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids)), view_of(ret.data(), sh),
          view_of(adv.data(), sh), {.align = align, .handle_zero_tail = tail, .eps = 0.0});
      // t = 0: G = (1, 0, 1), W = 0.5 each: B = 2/3.
      REQUIRE(adv[0] == Approx(1.0 / 3.0).epsilon(1e-15));
      REQUIRE(adv[5] == Approx(-2.0 / 3.0).epsilon(1e-15));
      // t = 2: rows 0 and 2, G = 1: B = 1, advantage 0.
      REQUIRE(adv[2] == Approx(0.0).margin(1e-15));
      // t = 3, 4: only row 0, past the second longest length 3: baseline 0 with the zero tail,
      // G W / W = G without it.
      REQUIRE(adv[3] == Approx(tail ? 1.0 : 0.0).margin(1e-15));
      REQUIRE(adv[4] == Approx(tail ? 1.0 : 0.0).margin(1e-15));
      // The singleton keeps its reward-to-go.
      for (std::size_t t = 0; t < 4; ++t) REQUIRE(adv[15 + t] == 0.5);
      REQUIRE(adv[19] == 0.0);
      // returns are G at every position (masked ones too), advantages 0 where masked.
      REQUIRE(ret[7] == 0.0);
      REQUIRE(ret[13] == 0.0);
      for (std::size_t k = 0; k < 20; ++k)
        if (m[k] == 0) REQUIRE(adv[k] == 0.0);
    }
}

TEST_CASE("optimal token baseline properties", "[optimal_token_baseline]") {
  testing_support::rng r(4103);
  SECTION("identical responses in a group have advantages of about 0") {
    otb_case<double> c(shape{1, 23, {}}, r, true, true, 0.0);
    c.ids.assign(1, 5);
    // Duplicate row 0 three times.
    otb_case<double> d(shape{4, 23, {}}, r, true, true, 0.0);
    for (std::size_t b = 0; b < 4; ++b)
      for (std::size_t t = 0; t < 23; ++t) {
        d.R[b * 23 + t] = c.R[t];
        d.lp[b * 23 + t] = c.lp[t];
        d.spp[b * 23 + t] = c.spp[t];
        d.rho[b * 23 + t] = c.rho[t];
        d.mask[b * 23 + t] = c.mask[t];
      }
    d.ids.assign(4, 5);
    // adv = G eps / (4 W + eps), W >= (1 - p)^2 > 1e-4 at the first valid token
    d.run({.handle_zero_tail = true, .eps = 1e-14});
    for (std::size_t k = 0; k < d.adv.size(); ++k) REQUIRE(std::fabs(d.adv[k]) < 1e-6);
  }
  SECTION("without holes or empty rows, both alignments agree") {
    for (int trial = 0; trial < 20; ++trial) {
      otb_case<double> c(random_shape(r, trial % 2 == 1), r, trial % 3 == 0, false, 0.0);
      bool empty_row = false;
      for (std::size_t b = 0; b < c.sh.rows(); ++b) {
        double n = 0;
        for (std::size_t t = 0; t < c.sh.row_size(b); ++t) n += c.mask[c.sh.row_begin(b) + t];
        empty_row = empty_row || n == 0;
      }
      if (empty_row) continue;
      c.run({.align = token_alignment::position});
      const auto by_position = c.adv;
      c.run({.align = token_alignment::valid_token});
      for (std::size_t k = 0; k < c.adv.size(); ++k) REQUIRE(c.adv[k] == by_position[k]);
    }
  }
  SECTION("a group of one: the advantage is the reward-to-go") {
    otb_case<double> c(shape{3, 11, {}}, r, false, true, 0.0);
    c.ids = {1, 2, 3};
    c.run({});
    for (std::size_t k = 0; k < c.adv.size(); ++k) REQUIRE(c.adv[k] == (c.mask[k] != 0 ? c.ret[k] : 0.0));
  }
}

TEST_CASE("optimal token baseline rejects bad inputs, outputs untouched", "[optimal_token_baseline][errors]") {
  const std::string fn = "optimal_token_baseline_advantages";
  testing_support::rng r(4104);
  for (const shape& base : {padded_shape, packed_shape}) {
    otb_case<double> good(base, r, true, false, 0.0);
    // Every valid position is a valid token here, so that a planted bad value is always read.
    std::fill(good.mask.begin(), good.mask.end(), 1.0);
    for (std::size_t k = 0; k < good.lp.size(); ++k) {
      good.lp[k] = std::log(0.5);
      good.spp[k] = 0.5;
      good.rho[k] = 1.0;
      good.R[k] = 0.25;
    }
    const auto untouched = [](const otb_case<double>& c) { return all_equal(c.ret, 7.0) && all_equal(c.adv, 7.0); };
    const auto expect = [&](otb_case<double>& c, const ulorl::optimal_token_baseline_inputs<double>& in,
                            const std::string& arg, std::int64_t index, const ulorl::optimal_token_baseline_config& cfg = {},
                            std::size_t groups = 0) {
      const std::size_t rows = groups ? groups : c.sh.rows();
      std::vector<std::int64_t> ids(rows, 3);
      require_rejected(outcome_of([&] {
                         ulorl::optimal_token_baseline_advantages(
                             in, ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids)),
                             view_of(c.ret.data(), c.sh), view_of(c.adv.data(), c.sh), cfg);
                       }),
                       fn, arg, index);
      REQUIRE(untouched(c));
    };
    {  // the valid case runs
      otb_case<double> c = good;
      c.run({});
      REQUIRE_FALSE(untouched(c));
    }
    otb_case<double> c = good;
    auto in = c.inputs();
    // required inputs
    {
      auto x = in;
      x.old_log_prob = {};
      expect(c, x, "old_log_prob", -1);
      x = in;
      x.sum_pi_squared = {};
      expect(c, x, "sum_pi_squared", -1);
    }
    // shapes of every input and output
    for (const shape& w : wrong_shapes(base)) {
      std::vector<double> other(w.size(), 1.0);
      const auto v = view_of<const double>(other.data(), w);
      auto x = in;
      x.mask = v;
      expect(c, x, "mask", -1);
      x = in;
      x.old_log_prob = v;
      expect(c, x, "old_log_prob", -1);
      x = in;
      x.sum_pi_squared = v;
      expect(c, x, "sum_pi_squared", -1);
      x = in;
      x.rollout_is_weights = v;
      expect(c, x, "rollout_is_weights", -1);
      std::vector<double> out(w.size(), 7.0);
      std::vector<std::int64_t> ids(c.sh.rows(), 3);
      const auto groups = ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids));
      require_rejected(outcome_of([&] {
                         ulorl::optimal_token_baseline_advantages(in, groups, view_of(out.data(), w),
                                                                  view_of(c.adv.data(), c.sh));
                       }),
                       fn, "returns", -1);
      require_rejected(outcome_of([&] {
                         ulorl::optimal_token_baseline_advantages(in, groups, view_of(c.ret.data(), c.sh),
                                                                  view_of(out.data(), w));
                       }),
                       fn, "advantages", -1);
      REQUIRE(untouched(c));
      REQUIRE(all_equal(out, 7.0));
    }
    // values at a valid token (the last one)
    const std::size_t last = c.sh.size() - 1;
    const auto with = [&](std::vector<double> otb_case<double>::*field, double value) {
      otb_case<double> d = good;
      (d.*field)[last] = value;
      return d;
    };
    const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
    for (auto [field, arg, value] : {std::tuple{&otb_case<double>::R, "token_rewards", nan},
                                     std::tuple{&otb_case<double>::R, "token_rewards", inf},
                                     std::tuple{&otb_case<double>::lp, "old_log_prob", nan},
                                     std::tuple{&otb_case<double>::lp, "old_log_prob", -inf},
                                     std::tuple{&otb_case<double>::spp, "sum_pi_squared", nan},
                                     std::tuple{&otb_case<double>::spp, "sum_pi_squared", -0.25},
                                     std::tuple{&otb_case<double>::rho, "rollout_is_weights", inf},
                                     std::tuple{&otb_case<double>::rho, "rollout_is_weights", -1.0},
                                     std::tuple{&otb_case<double>::mask, "mask", 2.0},
                                     std::tuple{&otb_case<double>::mask, "mask", 0.5}}) {
      otb_case<double> d = with(field, value);
      INFO(arg << " = " << value);
      expect(d, d.inputs(), arg, static_cast<std::int64_t>(last));
    }
    // groups that do not cover the rows
    expect(c, in, "groups", -1, {}, c.sh.rows() + 1);
    // configuration
    expect(c, in, "config.eps", -1, {.eps = -1e-8});
    expect(c, in, "config.eps", -1, {.eps = nan});
    require_unknown_enum(
        [&] {
          std::vector<std::int64_t> ids(c.sh.rows(), 3);
          ulorl::optimal_token_baseline_advantages(in, ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids)),
                                                   view_of(c.ret.data(), c.sh), view_of(c.adv.data(), c.sh),
                                                   {.align = static_cast<token_alignment>(7)});
        },
        fn, "config.align", 7);
    REQUIRE(untouched(c));
    // eps = 0 with zero weights everywhere (p = 1, Σπ² = 1): 0/0 is rejected, not written
    {
      otb_case<double> d = good;
      std::fill(d.lp.begin(), d.lp.end(), 0.0);
      std::fill(d.spp.begin(), d.spp.end(), 1.0);
      const auto o = outcome_of([&] { d.run({.eps = 0.0}); });
      REQUIRE(o.threw);
      REQUIRE(o.argument == "sum_pi_squared");
      REQUIRE(untouched(d));
    }
  }
  // a packed view with bad offsets
  {
    const std::vector<std::int64_t> off{0, 3, 2};
    std::vector<double> v(3, 0.5), out(3, 7.0);
    const auto bad = ulorl::token_view<const double>::packed(ulorl::vector_view<const double>(v.data(), 3),
                                                             std::span<const std::int64_t>(off));
    std::vector<std::int64_t> ids{0, 0};
    const auto o = outcome_of([&] {
      ulorl::optimal_token_baseline_advantages(
          ulorl::optimal_token_baseline_inputs<double>{bad, bad, bad, bad},
          ulorl::group_layout::from_ids(std::span<const std::int64_t>(ids)),
          ulorl::token_view<double>::packed(ulorl::vector_view<double>(out.data(), 3), std::span<const std::int64_t>(off)),
          ulorl::token_view<double>::packed(ulorl::vector_view<double>(out.data(), 3), std::span<const std::int64_t>(off)));
    });
    REQUIRE(o.threw);
    REQUIRE(o.argument == "token_rewards");
    REQUIRE(all_equal(out, 7.0));
  }
}

TEST_CASE("optimal token baseline reads only valid tokens", "[optimal_token_baseline]") {
  // Masked positions hold NaN statistics and large rewards in every random case above; here a
  // padded batch whose padding is NaN everywhere gives the same result as one padded with zeros.
  testing_support::rng r(4105);
  otb_case<double> c(shape{6, 19, {}}, r, true, true, 0.0);
  c.ids = {1, 1, 1, 2, 2, 2};
  c.run({});
  const auto adv = c.adv, ret = c.ret;
  for (std::size_t k = 0; k < c.mask.size(); ++k)
    if (c.mask[k] == 0) c.lp[k] = c.spp[k] = c.rho[k] = 0.0;
  c.run({});
  REQUIRE(c.adv == adv);
  REQUIRE(c.ret == ret);
}

TEST_CASE("optimal token baseline: an absent mask is an all-ones mask, bit for bit, in both layouts", "[mask]") {
  testing_support::rng r(9113);
  for (const bool packed : {false, true})
    for (const auto align : {token_alignment::position, token_alignment::valid_token}) {
      otb_case<double> c(random_shape(r, packed), r, true, false, 0.0);
      for (std::size_t k = 0; k < c.mask.size(); ++k)
        if (c.mask[k] == 0.0) c.R[k] = 0.25, c.lp[k] = std::log(0.5), c.spp[k] = 0.5, c.rho[k] = 1.0, c.mask[k] = 1.0;
      otb_case<double> d = c;
      c.run({.align = align});
      auto in = d.inputs();
      in.mask = {};
      ulorl::optimal_token_baseline_advantages(in, ulorl::group_layout::from_ids(std::span<const std::int64_t>(d.ids)),
                                               view_of(d.ret.data(), d.sh), view_of(d.adv.data(), d.sh),
                                               {.align = align});
      REQUIRE(std::memcmp(c.ret.data(), d.ret.data(), c.ret.size() * sizeof(double)) == 0);
      REQUIRE(std::memcmp(c.adv.data(), d.adv.data(), c.adv.size() * sizeof(double)) == 0);
    }
}
