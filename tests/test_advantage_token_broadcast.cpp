// Tests for ulorl/advantage/token_broadcast.hpp and ulorl/advantage/scores.hpp in both layouts.
#include <ulorl/advantage/scores.hpp>
#include <ulorl/advantage/token_broadcast.hpp>

#include <vector>

#include "catch.hpp"
#include "support/absent_mask.hpp"
#include "support/rejection.hpp"

using ulorl::token_placement;

TEST_CASE("masked, through-last and every-position placement (padded)", "[broadcast]") {
  const std::vector<double> adv{2.0, -1.0, 5.0};
  // row 1 has a hole before its last valid token; row 2 has no valid token
  const std::vector<int> mask{1, 1, 0, 0,  //
                              1, 0, 1, 0,  //
                              0, 0, 0, 0};
  std::vector<double> out(12, 9.0);
  const auto m = ulorl::padded(ulorl::matrix_view<const int>(mask.data(), 3, 4));
  const auto o = ulorl::padded(ulorl::matrix_view<double>(out.data(), 3, 4));
  const std::span<const double> a(adv);
  ulorl::broadcast_to_tokens(a, m, o, {.placement = token_placement::masked, .allow_empty_rows = true});
  REQUIRE(out == std::vector<double>{2, 2, 0, 0, -1, 0, -1, 0, 0, 0, 0, 0});
  ulorl::broadcast_to_tokens(a, m, o, {.placement = token_placement::through_last, .allow_empty_rows = true});
  REQUIRE(out == std::vector<double>{2, 2, 0, 0, -1, -1, -1, 0, 0, 0, 0, 0});
  ulorl::broadcast_to_tokens(a, m, o, {.placement = token_placement::every_position, .allow_empty_rows = true});
  REQUIRE(out == std::vector<double>{2, 2, 2, 2, -1, -1, -1, -1, 5, 5, 5, 5});
  // by default a mask row of zeros is an error naming the row, and nothing is written
  std::fill(out.begin(), out.end(), 9.0);
  REQUIRE_THROWS_WITH(ulorl::broadcast_to_tokens(a, m, o), Catch::Contains("'mask'[2]") && Catch::Contains("no valid token"));
  for (double x : out) REQUIRE(x == 9.0);
}

TEST_CASE("packed layout with int32 offsets and strided padded views", "[broadcast]") {
  const std::vector<float> adv{1.5f, -0.5f};
  const std::vector<std::int32_t> offsets{0, 3, 5};
  const std::vector<std::uint8_t> mask{1, 1, 0, 1, 1};
  std::vector<float> out(5, 9.0f);
  ulorl::broadcast_to_tokens(std::span<const float>(adv),
                             ulorl::packed(std::span<const std::uint8_t>(mask), std::span<const std::int32_t>(offsets)),
                             ulorl::packed(std::span<float>(out), std::span<const std::int32_t>(offsets)));
  REQUIRE(out == std::vector<float>{1.5f, 1.5f, 0.0f, -0.5f, -0.5f});
  // A column-major [2, 3] view (row stride 1, column stride 2).
  const std::vector<double> cm_mask{1, 1, 0, 1, 1, 0};  // rows: {1,0,1}, {1,1,0}
  std::vector<double> cm_out(6);
  ulorl::broadcast_to_tokens(std::span<const double>(std::vector<double>{3.0, 4.0}),
                             ulorl::padded(ulorl::matrix_view<const double>(cm_mask.data(), 2, 3, 1, 2)),
                             ulorl::padded(ulorl::matrix_view<double>(cm_out.data(), 2, 3, 1, 2)));
  REQUIRE(cm_out == std::vector<double>{3, 4, 0, 4, 3, 0});
}

TEST_CASE("bad layouts and masks are rejected", "[broadcast][errors]") {
  const std::vector<double> adv{1.0, 2.0};
  std::vector<double> out(5, 9.0);
  const std::vector<double> mask{1, 1, 1, 1, 1};
  const auto call = [&](std::vector<std::int64_t> off, std::vector<double> m = {1, 1, 1, 1, 1}) {
    ulorl::broadcast_to_tokens(std::span<const double>(adv),
                               ulorl::packed(std::span<const double>(m), std::span<const std::int64_t>(off)),
                               ulorl::packed(std::span<double>(out), std::span<const std::int64_t>(off)));
  };
  REQUIRE_THROWS_WITH(call({0, 4, 3}), Catch::Contains("'mask'[2] = 3") && Catch::Contains("not decrease"));
  REQUIRE_THROWS_WITH(call({0, 2, 4}), Catch::Contains("token count 5"));
  REQUIRE_THROWS_WITH(call({1, 2, 5}), Catch::Contains("start at 0"));
  REQUIRE_THROWS_WITH(call({0, 2, 5}, {1, 0.5, 1, 1, 1}), Catch::Contains("'mask'[1] = 0.5"));
  REQUIRE_THROWS_WITH(call({0, 5}), Catch::Contains("'advantages'"));
  const std::vector<double> nan_adv{1.0, std::nan("")};
  const std::vector<std::int64_t> off{0, 2, 5};
  REQUIRE_THROWS_WITH(ulorl::broadcast_to_tokens(std::span<const double>(nan_adv),
                                                 ulorl::packed(std::span<const double>(mask), std::span<const std::int64_t>(off)),
                                                 ulorl::packed(std::span<double>(out), std::span<const std::int64_t>(off))),
                      Catch::Contains("'advantages'[1]"));
  std::vector<double> small(4);
  const std::vector<std::int64_t> off4{0, 2, 4};
  REQUIRE_THROWS_WITH(ulorl::broadcast_to_tokens(std::span<const double>(adv),
                                                 ulorl::packed(std::span<const double>(mask), std::span<const std::int64_t>(off)),
                                                 ulorl::packed(std::span<double>(small), std::span<const std::int64_t>(off4))),
                      Catch::Contains("'out'") && Catch::Contains("shape differs"));
  for (double x : out) REQUIRE(x == 9.0);
}

TEST_CASE("an unknown placement is rejected naming config.placement, and nothing is written",
          "[broadcast][errors][enum]") {
  const std::vector<double> adv{2.0, -1.0};
  const std::vector<std::uint8_t> mask{1, 1, 0, 1, 0, 0};
  std::vector<double> out(6, 9.0);
  const auto m = ulorl::padded(ulorl::matrix_view<const std::uint8_t>(mask.data(), 2, 3));
  const auto o = ulorl::padded(ulorl::matrix_view<double>(out.data(), 2, 3));
  const auto call = [&](token_placement p) {
    return [&, p] { ulorl::broadcast_to_tokens(std::span<const double>(adv), m, o, {.placement = p}); };
  };
  REQUIRE_THROWS_WITH(call(static_cast<token_placement>(3))(),
                      Catch::Equals("ulorl::broadcast_to_tokens: argument 'config.placement' = 3: unknown enum value "
                                    "(known: 0, 1, 2)"));
  require_unknown_enum(call(static_cast<token_placement>(42)), "broadcast_to_tokens", "config.placement", 42);
  require_unknown_enum(call(static_cast<token_placement>(-1)), "broadcast_to_tokens", "config.placement", -1);
  REQUIRE(all_equal(out, 9.0));
}

TEST_CASE("response scores sum every position of a row (mask not applied)", "[scores]") {
  const std::vector<double> r{0, 0, 1, 0.5, 0.25, 0, 0, 0, 0};
  std::vector<double> s(3);
  ulorl::response_scores(ulorl::padded(ulorl::matrix_view<const double>(r.data(), 3, 3)), std::span<double>(s));
  REQUIRE(s == std::vector<double>{1, 0.75, 0});
  const std::vector<std::int64_t> off{0, 4, 4, 9};
  std::vector<float> sf(3);
  ulorl::response_scores(ulorl::packed(std::span<const double>(r), std::span<const std::int64_t>(off)), std::span<float>(sf));
  REQUIRE(sf == std::vector<float>{1.5f, 0.0f, 0.25f});
  std::vector<double> bad{0, std::numeric_limits<double>::infinity(), 0};
  REQUIRE_THROWS_WITH(ulorl::response_scores(ulorl::padded(ulorl::matrix_view<const double>(bad.data(), 1, 3)),
                                             std::span<double>(s.data(), 1)),
                      Catch::Contains("'token_rewards'[1]") && Catch::Contains("row 0, token 1"));
  REQUIRE_THROWS_WITH(ulorl::response_scores(ulorl::padded(ulorl::matrix_view<const double>(r.data(), 3, 3)),
                                             std::span<double>(s.data(), 2)),
                      Catch::Contains("'out'"));
}

TEST_CASE("broadcast_to_tokens: an absent mask is an all-ones mask in both layouts", "[mask]") {
  std::mt19937_64 rng(5);
  for (const auto& lay : absent_mask::layouts(rng, 4, 6)) {
    INFO((lay.packed ? "packed" : "padded"));
    const auto a = absent_mask::uniform(rng, lay.B, -1, 1);
    const std::vector<std::uint8_t> ones(lay.size(), 1);
    for (auto place : {ulorl::token_placement::masked, ulorl::token_placement::through_last, ulorl::token_placement::every_position}) {
      const ulorl::broadcast_config cfg{.placement = place, .allow_empty_rows = true};
      std::vector<double> o(lay.size(), 7.0), oa(lay.size(), 7.0);
      ulorl::broadcast_to_tokens(std::span<const double>(a), lay.cview(ones), lay.mview(o), cfg);
      ulorl::broadcast_to_tokens(std::span<const double>(a), ulorl::token_view<const std::uint8_t>{}, lay.mview(oa), cfg);
      REQUIRE(absent_mask::same_bits(oa, o));
    }
  }
  // The absent mask's rows are out's rows: an empty packed row is still an empty row.
  std::mt19937_64 r2(6);
  const auto lay = absent_mask::layouts(r2, 3, 4)[1];
  const std::vector<double> a{1, 2, 3};
  std::vector<double> o(lay.size());
  REQUIRE_THROWS_WITH(ulorl::broadcast_to_tokens(std::span<const double>(a), ulorl::token_view<const double>{}, lay.mview(o)),
                      Catch::Contains("'mask'") && Catch::Contains("no valid token"));
}
