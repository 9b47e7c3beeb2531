// Tests for ulorl/core/ragged.hpp: addressing in both layouts, validation messages.
#include <ulorl/core/ragged.hpp>
#include <ulorl/core/views.hpp>

#include <vector>

#include "catch.hpp"

TEST_CASE("token_view: padded and packed address the same tokens", "[ragged]") {
  std::vector<double> padded_data{1, 2, 3, 0, 4, 5, 0, 0};
  std::vector<double> packed_data{1, 2, 3, 4, 5};
  const std::vector<std::int64_t> off{0, 3, 5};
  const auto p = ulorl::padded(ulorl::matrix_view<double>(padded_data.data(), 2, 4));
  const auto k = ulorl::packed(std::span<double>(packed_data), std::span<const std::int64_t>(off));
  REQUIRE(p.rows() == 2);
  REQUIRE(k.rows() == 2);
  REQUIRE(k.row_size(0) == 3);
  REQUIRE(k.row_size(1) == 2);
  REQUIRE(p.row_size(1) == 4);
  REQUIRE(k(1, 1) == 5);
  REQUIRE(p(1, 1) == 5);
  REQUIRE(k.flat_index(1, 1) == 4);
  REQUIRE(p.flat_index(1, 1) == 5);
  REQUIRE(k.row(1)[0] == 4);
  REQUIRE_FALSE(p.same_shape(k));
  const std::vector<std::int32_t> off32{0, 3, 5};
  const auto k32 = ulorl::packed(std::span<double>(packed_data), std::span<const std::int32_t>(off32));
  REQUIRE(k32.same_shape(k));
  ulorl::token_view<const double> c = k;  // const conversion
  REQUIRE(c(0, 2) == 3);
}

TEST_CASE("validation names the argument and index", "[ragged][errors]") {
  std::vector<double> v{1, 2, 3};
  const std::vector<std::int64_t> bad{0, 2, 1, 3};
  REQUIRE_THROWS_WITH(ulorl::validate_layout("f", "x", ulorl::packed(std::span<double>(v), std::span<const std::int64_t>(bad))),
                      Catch::Equals("ulorl::f: argument 'x'[2] = 1: offsets must not decrease"));
  REQUIRE_THROWS_AS(ulorl::validate_layout("f", "x", ulorl::token_view<double>::packed(ulorl::vector_view<double>(v.data(), 3),
                                                                                         std::span<const std::int64_t>())),
                    ulorl::error);
  try {
    const std::vector<double> nan_in{0, 1, std::nan("")};
    ulorl::require_all_finite("g", "logp", ulorl::padded(ulorl::matrix_view<const double>(nan_in.data(), 1, 3)));
    FAIL("no throw");
  } catch (const ulorl::error& e) {
    REQUIRE(e.function() == "g");
    REQUIRE(e.argument() == "logp");
    REQUIRE(e.index() == 2);
    REQUIRE(std::string(e.what()).find("row 0, token 2") != std::string::npos);
  }
  const std::vector<int> mask{0, 1, 2};
  REQUIRE_THROWS_WITH(ulorl::require_binary_mask("h", "mask", ulorl::padded(ulorl::matrix_view<const int>(mask.data(), 1, 3))),
                      Catch::Contains("'mask'[2] = 2"));
}

TEST_CASE("token_view: only the default view is absent; a zero-element view with a shape is present",
          "[ragged][absent]") {
  REQUIRE(ulorl::token_view<const std::uint8_t>{}.empty());
  REQUIRE(ulorl::padded(ulorl::matrix_view<const std::uint8_t>{}).empty());
  // [0, T] over no memory (an empty std::vector's null data, a zero-size tensor's): present.
  const auto zero_rows = ulorl::padded(ulorl::matrix_view<const std::uint8_t>(nullptr, 0, 4));
  REQUIRE_FALSE(zero_rows.empty());
  REQUIRE(zero_rows.size() == 0);
  // Packed with offsets {0}: present (B = 0).
  const std::vector<std::int64_t> off{0};
  const auto no_tokens = ulorl::packed(ulorl::vector_view<const std::uint8_t>(nullptr, 0), std::span<const std::int64_t>(off));
  REQUIRE_FALSE(no_tokens.empty());
  // A present mask of another shape is not replaced by the all-valid mask.
  std::vector<double> lp(8, -1.0);
  const auto ref = ulorl::padded(ulorl::matrix_view<const double>(lp.data(), 2, 4));
  REQUIRE(ulorl::mask_or_all_valid(zero_rows, ref).rows() == 0);
  REQUIRE_THROWS_AS(ulorl::require_same_shape("f", "mask", ulorl::mask_or_all_valid(zero_rows, ref), "log_prob", ref),
                    ulorl::error);
  REQUIRE(ulorl::mask_or_all_valid(ulorl::token_view<const std::uint8_t>{}, ref).same_shape(ref));
}
