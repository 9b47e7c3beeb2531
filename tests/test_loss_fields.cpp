// Tests of ulorl/core/fields.hpp over ulorl/loss/fields.hpp's tables: the field tables cover the structs (every field distinct survives
// the round trip), the result's table is its memory order, and malformed encodings are errors that
// name the field and its index.
#include <ulorl/loss/fields.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "catch.hpp"

namespace {

//! Sets every field of a configuration to a value of its own: doubles i + 0.25, bools true, enums
//! 1, counts 2, optionals present (with their fields set likewise).
struct distinct_values {
  double next = 0.25;
  template <class X>
  void operator()(std::string_view, X& x) {
    if constexpr (std::is_same_v<X, double>) {
      x = next, next += 1.0;
    } else if constexpr (std::is_same_v<X, bool>) {
      x = true;
    } else if constexpr (std::is_enum_v<X>) {
      x = static_cast<X>(1);
    } else if constexpr (std::is_same_v<X, std::size_t>) {
      x = 2;
    } else if constexpr (requires { x.value = 2; }) {  // a bounded count
      x.value = 2;
    } else if constexpr (std::is_same_v<X, std::optional<double>>) {
      x = next, next += 1.0;
    } else if constexpr (requires { x.emplace(); }) {
      x.emplace();
      visit_fields(*x, *this);  // found by argument-dependent lookup
    } else {
      visit_fields(x, *this);
    }
  }
};

}  // namespace

TEST_CASE("fields: every field of the configuration survives encode / decode with its own value") {
  ulorl::policy_loss_config cfg;
  distinct_values set;
  ulorl::visit_fields(cfg, set);
  const std::vector<double> enc = ulorl::encode_fields(cfg);
  REQUIRE(enc.size() == ulorl::encoded_config_size);
  const ulorl::policy_loss_config back = ulorl::decode_fields<ulorl::policy_loss_config>("f", "config", enc);
  REQUIRE(ulorl::encode_fields(back) == enc);
  REQUIRE(back.objective.penalized_pg.square_penalty == cfg.objective.penalized_pg.square_penalty);
  REQUIRE(back.objective.penalized_pg.surrogate == ulorl::pg_surrogate::log_prob);
  REQUIRE(back.rollout.has_value());
  REQUIRE(back.rollout->rejection.chain.size == 2);
  REQUIRE(back.rollout->rejection.chain.criteria[11].upper == cfg.rollout->rejection.chain.criteria[11].upper);
  REQUIRE(back.rollout_batch_norm_factor == cfg.rollout_batch_norm_factor);
  // Each double of the encoding is distinct where the table visits a double: no field is read twice.
  std::vector<double> doubles;
  for (double x : enc)
    if (x != 0.0 && x != 1.0 && x != 2.0) doubles.push_back(x);
  std::sort(doubles.begin(), doubles.end());
  REQUIRE(std::adjacent_find(doubles.begin(), doubles.end()) == doubles.end());
  // Absent optionals decode as absent.
  const ulorl::policy_loss_config plain;
  const ulorl::policy_loss_config plain_back =
      ulorl::decode_fields<ulorl::policy_loss_config>("f", "config", ulorl::encode_fields(plain));
  REQUIRE_FALSE(plain_back.rollout.has_value());
  REQUIRE_FALSE(plain_back.rollout_batch_norm_factor.has_value());
  REQUIRE(ulorl::field_names<ulorl::policy_loss_config>().front() == "objective");
}

TEST_CASE("fields: the result's table is its memory order, and encode / decode round-trip") {
  ulorl::policy_loss_result r;
  const double* base = reinterpret_cast<const double*>(&r);
  std::size_t i = 0;
  const auto number = [&](double& x) {
    REQUIRE(&x == base + i);
    x = static_cast<double>(i) + 0.5;
    ++i;
  };
  ulorl::visit_fields(r, [&](std::string_view, auto& x) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(x)>, double>)
      number(x);
    else
      visit_fields(x, [&](std::string_view, double& y) { number(y); });
  });
  REQUIRE(i == ulorl::encoded_result_size);
  REQUIRE(sizeof(r) == i * sizeof(double));
  std::vector<double> enc(ulorl::encoded_result_size);
  ulorl::encode_result(r, enc);
  for (std::size_t k = 0; k < enc.size(); ++k) REQUIRE(enc[k] == static_cast<double>(k) + 0.5);
  const ulorl::policy_loss_result back = ulorl::decode_result(enc);
  REQUIRE(back.metrics.seq_clipped_region == r.metrics.seq_clipped_region);
  REQUIRE(back.rollout.log_ppl_diff_min == r.rollout.log_ppl_diff_min);
  REQUIRE(back.nonfinite_grad_rows == r.nonfinite_grad_rows);
}

TEST_CASE("fields: a malformed encoding is an error naming the field and its index") {
  const std::vector<double> good = ulorl::encode_fields(ulorl::policy_loss_config{});
  const auto names = ulorl::field_names<ulorl::policy_loss_config>();
  const auto index_of = [&](std::string_view name) {
    return static_cast<std::size_t>(std::find(names.begin(), names.end(), name) - names.begin());
  };
  auto short_one = good;
  short_one.pop_back();
  REQUIRE_THROWS_WITH(ulorl::decode_fields<ulorl::policy_loss_config>("f", "config", short_one),
                      Catch::Contains("an encoded policy_loss_config has"));
  auto bad_bool = good;
  bad_bool[index_of("check_values")] = 2.0;  // fields before check_values take one double each
  REQUIRE_THROWS_WITH(ulorl::decode_fields<ulorl::policy_loss_config>("f", "config", bad_bool),
                      Catch::Contains("field 'check_values'"));
  for (const double v : {0.5, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    auto bad_enum = good;
    bad_enum[0] = v;
    REQUIRE_THROWS_WITH(ulorl::decode_fields<ulorl::policy_loss_config>("f", "config", bad_enum),
                        Catch::Contains("field 'objective' (index 0)"));
  }
  // The rejection chain's size is bounded by its capacity (it indexes the criteria).
  ulorl::policy_loss_config with_rollout;
  with_rollout.rollout.emplace();
  auto enc = ulorl::encode_fields(with_rollout);
  const std::size_t size_at = index_of("rollout") + 1 + 9;  // present flag, then importance's 9 fields
  REQUIRE(enc[size_at] == 0.0);
  enc[size_at] = 13.0;
  REQUIRE_THROWS_WITH(ulorl::decode_fields<ulorl::policy_loss_config>("f", "config", enc),
                      Catch::Contains("field 'rollout.rejection.chain.size'"));
  enc[size_at] = 12.0;
  REQUIRE(ulorl::decode_fields<ulorl::policy_loss_config>("f", "config", enc).rollout->rejection.chain.size == 12);
}

TEST_CASE("fields: kl_config and agg_normalizer round-trip and take policy_loss_config's names") {
  const ulorl::kl_config kl{.estimator = ulorl::kl_estimator::k2,
                            .straight_through = true,
                            .input_clamp = 20.0,
                            .output_clamp = 10.0,
                            .importance_weighted = false};
  const auto k = ulorl::decode_fields<ulorl::kl_config>("f", "config", ulorl::encode_fields(kl));
  REQUIRE((k.estimator == kl.estimator && k.straight_through && k.input_clamp == 20.0 && k.output_clamp == 10.0 &&
           !k.importance_weighted));
  const ulorl::agg_normalizer n{.mode = ulorl::agg_mode::seq_mean_token_mean, .denominator = 7.0, .scale = -2.5};
  const auto m = ulorl::decode_fields<ulorl::agg_normalizer>("f", "normalizer", ulorl::encode_fields(n));
  REQUIRE((m.mode == n.mode && m.denominator == 7.0 && m.scale == -2.5));
  // The policy loss's table is made of these two and its own fields: their names appear in it in order.
  const auto all = ulorl::field_names<ulorl::policy_loss_config>();
  for (const auto& part : {ulorl::field_names<ulorl::kl_config>(), ulorl::field_names<ulorl::agg_normalizer>()}) {
    const auto at = std::search(all.begin(), all.end(), part.begin(), part.end());
    REQUIRE(at != all.end());
  }
  std::vector<double> short_one = ulorl::encode_fields(n);
  short_one.pop_back();
  REQUIRE_THROWS_WITH(ulorl::decode_fields<ulorl::agg_normalizer>("f", "normalizer", short_one),
                      Catch::Contains("an encoded agg_normalizer has"));
}
