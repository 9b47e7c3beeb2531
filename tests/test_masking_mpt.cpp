// Tests of ulorl/masking/mpt.hpp against the independent oracle of tests/support/dynamics_oracle.hpp,
// in both layouts, float and double, with property tests and every rejected input.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include <ulorl/masking.hpp>

#include "catch.hpp"
#include "support/dynamics_oracle.hpp"
#include "support/rejection.hpp"

namespace {

constexpr std::uint64_t kSeed = 20260529;

//! A random ragged batch held as rows (what the oracle reads), plus score per row.
struct batch_rows {
  std::vector<std::vector<double>> logp, old_logp, ent;
  std::vector<std::vector<int>> valid;  // padded validity; packed rows are their valid prefix
  std::vector<double> score;
  std::size_t cols = 0;
};

batch_rows make_batch(std::mt19937_64& rng, std::size_t rows, std::size_t max_len, bool allow_holes) {
  batch_rows b;
  b.cols = max_len;
  std::uniform_int_distribution<std::size_t> len(0, max_len);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t n = rows == 1 ? max_len : len(rng);
    // Per-row entropy scale: some rows collapse (mean far below 0.2), some explore.
    const double scale = u(rng) < 0.5 ? 0.05 + 0.2 * u(rng) : 0.3 + u(rng);
    std::vector<double> lp(max_len), olp(max_len), en(max_len);
    std::vector<int> v(max_len, 0);
    for (std::size_t t = 0; t < max_len; ++t) {
      const double k = u(rng);
      // A third near-certain tokens (p in [0.98, 1]), some exactly at tau, the rest anywhere.
      if (k < 0.33) lp[t] = std::log(0.98 + 0.02 * u(rng));
      else if (k < 0.38) lp[t] = std::log(0.99);
      else if (k < 0.40) lp[t] = 0.0;
      else lp[t] = -8.0 * u(rng);
      olp[t] = u(rng) < 0.5 ? lp[t] : std::log(0.95 + 0.05 * u(rng));
      en[t] = scale * 2.0 * u(rng);
      v[t] = t < n && !(allow_holes && u(rng) < 0.1) ? 1 : 0;
      if (!v[t]) {  // garbage at invalid positions must be ignored
        lp[t] = std::numeric_limits<double>::quiet_NaN();
        en[t] = std::numeric_limits<double>::infinity();
      }
    }
    b.logp.push_back(lp);
    b.old_logp.push_back(olp);
    b.ent.push_back(en);
    b.valid.push_back(v);
    const double s = u(rng);
    b.score.push_back(s < 0.5 ? 1.0 : (s < 0.75 ? 0.0 : 2.0 * u(rng) - 1.0));
  }
  return b;
}

ulorl::mpt_config to_config(const dynamics_oracle::mpt_params& p) {
  ulorl::mpt_config c;
  c.mode = p.mode == 0 ? ulorl::mpt_mode::off : (p.mode == 1 ? ulorl::mpt_mode::static_mask : ulorl::mpt_mode::dynamic_mask);
  c.tau = p.tau;
  c.sigma = p.sigma;
  c.positive = p.positive_by_advantage ? ulorl::mpt_positive::advantage : ulorl::mpt_positive::reward;
  c.positive_reward = p.positive_reward;
  c.scope = p.batch_scope ? ulorl::mpt_entropy_scope::batch : ulorl::mpt_entropy_scope::response;
  return c;
}

void check_stats(const ulorl::mpt_stats& s, const dynamics_oracle::mpt_result& o, std::size_t rows) {
  CHECK(s.responses == rows);
  CHECK(static_cast<long>(s.tokens) == o.tokens);
  CHECK(static_cast<long>(s.positive_responses) == o.positive);
  CHECK(static_cast<long>(s.mpt_tokens) == o.mpt);
  CHECK(static_cast<long>(s.masked_tokens) == o.masked);
  CHECK(static_cast<long>(s.responses_below_target) == o.below);
  CHECK(s.batch_below_target == o.batch_below);
  CHECK(s.mean_entropy == Approx(o.mean_entropy).epsilon(1e-12).margin(1e-15));
  if (o.tokens) {
    CHECK(s.mpt_fraction() == Approx(static_cast<double>(o.mpt) / static_cast<double>(o.tokens)));
    CHECK(s.masked_fraction() == Approx(static_cast<double>(o.masked) / static_cast<double>(o.tokens)));
  }
}

//! Runs the padded layout with element type T, returns keep rows.
template <class T>
std::vector<std::vector<double>> run_padded(const batch_rows& b, const ulorl::mpt_config& cfg, ulorl::mpt_stats& st,
                                            bool use_rollout = false) {
  const std::size_t B = b.logp.size(), T_ = b.cols;
  std::vector<T> lp(B * T_), olp(B * T_), en(B * T_);
  std::vector<std::uint8_t> m(B * T_);
  std::vector<float> keep(B * T_, -7.0f);
  for (std::size_t r = 0; r < B; ++r)
    for (std::size_t t = 0; t < T_; ++t) {
      lp[r * T_ + t] = static_cast<T>(b.logp[r][t]);
      olp[r * T_ + t] = static_cast<T>(b.old_logp[r][t]);
      en[r * T_ + t] = static_cast<T>(b.ent[r][t]);
      m[r * T_ + t] = static_cast<std::uint8_t>(b.valid[r][t]);
    }
  ulorl::mpt_batch<T, std::uint8_t, double> in{
      .log_prob = ulorl::padded(ulorl::matrix_view<const T>(lp.data(), B, T_)),
      .old_log_prob = ulorl::padded(ulorl::matrix_view<const T>(olp.data(), B, T_)),
      .entropy = ulorl::padded(ulorl::matrix_view<const T>(en.data(), B, T_)),
      .mask = ulorl::padded(ulorl::matrix_view<const std::uint8_t>(m.data(), B, T_)),
      .response_score = std::span<const double>(b.score)};
  auto c = cfg;
  c.probability = use_rollout ? ulorl::mpt_probability::rollout : ulorl::mpt_probability::current;
  st = ulorl::mpt_mask(in, ulorl::padded(ulorl::matrix_view<float>(keep.data(), B, T_)), c);
  std::vector<std::vector<double>> out(B, std::vector<double>(T_));
  for (std::size_t r = 0; r < B; ++r)
    for (std::size_t t = 0; t < T_; ++t) out[r][t] = keep[r * T_ + t];
  return out;
}

//! Packed layout (no mask: the valid tokens are the packed ones), keep as double.
template <class T, class Off>
std::vector<std::vector<double>> run_packed(const batch_rows& b, const ulorl::mpt_config& cfg, ulorl::mpt_stats& st) {
  std::vector<T> lp, en;
  std::vector<Off> off{0};
  for (std::size_t r = 0; r < b.logp.size(); ++r) {
    for (std::size_t t = 0; t < b.cols; ++t)
      if (b.valid[r][t]) {
        lp.push_back(static_cast<T>(b.logp[r][t]));
        en.push_back(static_cast<T>(b.ent[r][t]));
      }
    off.push_back(static_cast<Off>(lp.size()));
  }
  std::vector<double> keep(lp.size(), -7.0);
  const std::span<const Off> offs(off);
  ulorl::mpt_batch<T, std::uint8_t, double> in{
      .log_prob = ulorl::token_view<const T>::packed(ulorl::vector_view<const T>(lp.data(), lp.size()), offs),
      .entropy = ulorl::token_view<const T>::packed(ulorl::vector_view<const T>(en.data(), en.size()), offs),
      .response_score = std::span<const double>(b.score)};
  st = ulorl::mpt_mask(in, ulorl::token_view<double>::packed(ulorl::vector_view<double>(keep.data(), keep.size()), offs), cfg);
  std::vector<std::vector<double>> out;
  for (std::size_t r = 0; r + 1 < off.size(); ++r)
    out.emplace_back(keep.begin() + static_cast<std::ptrdiff_t>(off[r]), keep.begin() + static_cast<std::ptrdiff_t>(off[r + 1]));
  return out;
}

//! The oracle's keep rows compacted to valid tokens (the packed view of the same batch).
std::vector<std::vector<double>> compact(const std::vector<std::vector<double>>& keep, const batch_rows& b) {
  std::vector<std::vector<double>> out;
  for (std::size_t r = 0; r < keep.size(); ++r) {
    std::vector<double> row;
    for (std::size_t t = 0; t < keep[r].size(); ++t)
      if (b.valid[r][t]) row.push_back(keep[r][t]);
    out.push_back(row);
  }
  return out;
}

}  // namespace

TEST_CASE("mpt_mask matches the oracle in both layouts, every mode, float and double", "[masking][mpt]") {
  std::printf("test_masking_mpt seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  const std::size_t shapes[][2] = {{1, 1}, {1, 47}, {3, 5}, {47, 13}, {3, 1023}, {1023, 3}, {8, 64}};
  for (const auto& sh : shapes) {
    for (int trial = 0; trial < 3; ++trial) {
      const auto b = make_batch(rng, sh[0], sh[1], trial == 2);
      for (int mode = 0; mode < 3; ++mode)
        for (int pos = 0; pos < 2; ++pos)
          for (int scope = 0; scope < 2; ++scope) {
            dynamics_oracle::mpt_params p;
            p.mode = mode;
            p.positive_by_advantage = pos == 1;
            p.batch_scope = scope == 1;
            p.sigma = trial == 1 ? 0.5 : 0.2;
            p.tau = trial == 1 ? 0.999 : 0.99;
            INFO("B=" << sh[0] << " T=" << sh[1] << " trial=" << trial << " mode=" << mode << " pos=" << pos
                      << " scope=" << scope);
            const auto want = dynamics_oracle::mpt(b.logp, b.ent, b.valid, b.score, p);
            const auto cfg = to_config(p);
            ulorl::mpt_stats st;
            CHECK(run_padded<double>(b, cfg, st) == want.keep);
            check_stats(st, want, sh[0]);
            CHECK(run_packed<double, std::int64_t>(b, cfg, st) == compact(want.keep, b));
            check_stats(st, want, sh[0]);

            // float inputs: the oracle sees the same float values widened to double.
            batch_rows bf = b;
            for (auto* rows : {&bf.logp, &bf.ent})
              for (auto& row : *rows)
                for (auto& x : row) x = static_cast<double>(static_cast<float>(x));
            const auto want_f = dynamics_oracle::mpt(bf.logp, bf.ent, bf.valid, bf.score, p);
            CHECK(run_padded<float>(b, cfg, st) == want_f.keep);
            check_stats(st, want_f, sh[0]);
            CHECK(run_packed<float, std::int32_t>(b, cfg, st) == compact(want_f.keep, bf));
          }
    }
  }
}

TEST_CASE("mpt_mask uses the rollout policy's probabilities when asked", "[masking][mpt]") {
  std::mt19937_64 rng(kSeed + 1);
  const auto b = make_batch(rng, 31, 40, true);
  dynamics_oracle::mpt_params p;
  p.mode = 1;
  auto want = dynamics_oracle::mpt(b.old_logp, b.ent, b.valid, b.score, p);
  ulorl::mpt_stats st;
  CHECK(run_padded<double>(b, to_config(p), st, /*use_rollout=*/true) == want.keep);
  check_stats(st, want, 31);
  // And the current policy's otherwise, which differ on this batch.
  const auto cur = dynamics_oracle::mpt(b.logp, b.ent, b.valid, b.score, p);
  REQUIRE(cur.mpt != want.mpt);
}

TEST_CASE("mpt_mask properties", "[masking][mpt][property]") {
  std::mt19937_64 rng(kSeed + 2);
  for (int trial = 0; trial < 20; ++trial) {
    const auto b = make_batch(rng, 1 + trial * 3, 1 + trial * 7, trial % 2 == 0);
    ulorl::mpt_stats s_off, s_static, s_dyn, s_dyn0, s_dynbig;
    const auto off = run_padded<double>(b, {.mode = ulorl::mpt_mode::off}, s_off);
    const auto stat = run_padded<double>(b, {.mode = ulorl::mpt_mode::static_mask}, s_static);
    const auto dyn = run_padded<double>(b, {.mode = ulorl::mpt_mode::dynamic_mask}, s_dyn);
    const auto dyn0 = run_padded<double>(b, {.mode = ulorl::mpt_mode::dynamic_mask, .sigma = 0.0}, s_dyn0);
    const auto dynbig = run_padded<double>(b, {.mode = ulorl::mpt_mode::dynamic_mask, .sigma = 1e9}, s_dynbig);
    for (std::size_t r = 0; r < b.valid.size(); ++r)
      for (std::size_t t = 0; t < b.cols; ++t) {
        // off keeps exactly the valid tokens; masking only ever removes tokens.
        CHECK(off[r][t] == static_cast<double>(b.valid[r][t]));
        CHECK(stat[r][t] <= dyn[r][t]);
        CHECK(dyn[r][t] <= off[r][t]);
        // A masked token is a valid, mastered token of a positive response.
        if (off[r][t] == 1.0 && stat[r][t] == 0.0) {
          CHECK(b.score[r] >= 1.0);
          CHECK(std::exp(b.logp[r][t]) >= 0.99);
        }
      }
    // sigma = 0: no response is below target, nothing masked; sigma huge: dynamic == static.
    CHECK(dyn0 == off);
    CHECK(dynbig == stat);
    CHECK(s_off.masked_tokens == 0);
    CHECK(s_off.mpt_tokens == s_static.mpt_tokens);
    CHECK(s_static.masked_tokens == s_static.mpt_tokens);
    CHECK(s_dyn.masked_tokens <= s_static.masked_tokens);
  }
}

TEST_CASE("mpt_mask thresholds are inclusive for p and strict for entropy", "[masking][mpt]") {
  // One positive response whose mean entropy is exactly sigma (0.25, exact in binary): not below target.
  const std::vector<double> lp{0.0, std::log(0.5), 0.0}, en{0.125, 0.375, 0.25};
  const std::vector<double> score{1.0};
  std::vector<double> keep(3);
  auto view = [](const std::vector<double>& v) { return ulorl::padded(ulorl::matrix_view<const double>(v.data(), 1, v.size())); };
  ulorl::mpt_batch<double> in{.log_prob = view(lp), .entropy = view(en), .response_score = score};
  auto out = ulorl::padded(ulorl::matrix_view<double>(keep.data(), 1, 3));
  auto st = ulorl::mpt_mask(in, out, {.sigma = 0.25});
  CHECK(keep == std::vector<double>{1, 1, 1});
  CHECK(st.responses_below_target == 0);
  CHECK(st.mpt_tokens == 2);  // p = 1 >= tau
  st = ulorl::mpt_mask(in, out, {.sigma = 0.25 + 1e-12});
  CHECK(keep == std::vector<double>{0, 1, 0});
  CHECK(st.masked_tokens == 2);
  // tau = 1 masks only p == 1 exactly.
  st = ulorl::mpt_mask(in, out, {.mode = ulorl::mpt_mode::static_mask, .tau = 1.0});
  CHECK(keep == std::vector<double>{0, 1, 0});
  // A reward of 0.999 is not positive; advantage > 0 is.
  const std::vector<double> score2{0.999};
  in.response_score = score2;
  st = ulorl::mpt_mask(in, out, {.mode = ulorl::mpt_mode::static_mask});
  CHECK(st.positive_responses == 0);
  CHECK(keep == std::vector<double>{1, 1, 1});
  st = ulorl::mpt_mask(in, out, {.mode = ulorl::mpt_mode::static_mask, .positive = ulorl::mpt_positive::advantage});
  CHECK(st.positive_responses == 1);
  CHECK(keep == std::vector<double>{0, 1, 0});
}

TEST_CASE("mpt_mask on strided views and an empty batch", "[masking][mpt]") {
  // Column-major [2, 3]: element (r, c) at r + 2c.
  const std::vector<double> lp{0.0, -5.0, 0.0, 0.0, -0.001, 0.0};
  const std::vector<double> en(6, 0.01);
  const std::vector<double> score{1.0, 0.0};
  std::vector<double> keep(6, 9.0);
  ulorl::mpt_batch<double> in{.log_prob = ulorl::padded(ulorl::matrix_view<const double>(lp.data(), 2, 3, 1, 2)),
                              .entropy = ulorl::padded(ulorl::matrix_view<const double>(en.data(), 2, 3, 1, 2)),
                              .response_score = score};
  const auto st = ulorl::mpt_mask(in, ulorl::padded(ulorl::matrix_view<double>(keep.data(), 2, 3, 1, 2)), {});
  // Row 0 = lp[0], lp[2], lp[4] = {0, 0, -0.001}: all mastered (exp(-0.001) > 0.99) and masked.
  CHECK(keep == std::vector<double>{0, 1, 0, 1, 0, 1});
  CHECK(st.masked_tokens == 3);
  CHECK(st.responses_below_target == 2);

  ulorl::mpt_batch<double> none{};
  const auto s0 = ulorl::mpt_mask(none, ulorl::token_view<double>{}, {});
  CHECK(s0.tokens == 0);
  CHECK(s0.masked_fraction() == 0.0);
  CHECK(s0.mpt_fraction() == 0.0);
}

TEST_CASE("mpt_mask rejects bad input before writing", "[masking][mpt][error]") {
  std::vector<double> lp{0.0, -1.0, 0.0, -2.0}, en{0.1, 0.1, 0.1, 0.1}, score{1.0, 0.0};
  std::vector<std::uint8_t> m{1, 1, 1, 0};
  std::vector<double> keep(4, 5.0);
  auto mv = [](const std::vector<double>& v) { return ulorl::padded(ulorl::matrix_view<const double>(v.data(), 2, 2)); };
  auto out = ulorl::padded(ulorl::matrix_view<double>(keep.data(), 2, 2));
  auto make = [&] {
    return ulorl::mpt_batch<double>{.log_prob = mv(lp), .entropy = mv(en),
                                    .mask = ulorl::padded(ulorl::matrix_view<const std::uint8_t>(m.data(), 2, 2)),
                                    .response_score = score};
  };
  auto expect_error = [&](const ulorl::mpt_batch<double>& in, const ulorl::mpt_config& cfg, const char* arg) {
    std::fill(keep.begin(), keep.end(), 5.0);
    try {
      (void)ulorl::mpt_mask(in, out, cfg);
      FAIL("no error for " << arg);
    } catch (const ulorl::error& e) {
      CHECK(e.argument() == arg);
      CHECK(e.function() == "mpt_mask");
    }
    CHECK(std::all_of(keep.begin(), keep.end(), [](double x) { return x == 5.0; }));
  };
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double tau : {0.0, -0.5, 1.0 + 1e-12, 2.0, nan}) expect_error(make(), {.tau = tau}, "tau");
  for (double sigma : {-1e-9, -1.0, nan, inf}) expect_error(make(), {.sigma = sigma}, "sigma");
  expect_error(make(), {.positive_reward = nan}, "positive_reward");
  // Non-finite values at valid tokens, with the flat index in the error.
  lp[2] = nan;
  try {
    (void)ulorl::mpt_mask(make(), out, {});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.argument() == "log_prob");
    CHECK(e.index() == 2);
  }
  lp[2] = 0.0;
  lp[3] = nan;  // masked position: ignored
  CHECK_NOTHROW((void)ulorl::mpt_mask(make(), out, {}));
  lp[3] = -2.0;
  en[1] = inf;
  expect_error(make(), {}, "entropy");
  en[1] = -inf;
  expect_error(make(), {}, "entropy");
  en[1] = 0.1;
  score[1] = nan;
  expect_error(make(), {}, "response_score");
  score[1] = 0.0;
  m[0] = 2;
  expect_error(make(), {}, "mask");
  m[0] = 1;
  // Shape mismatches and missing inputs.
  {
    auto in = make();
    in.entropy = ulorl::padded(ulorl::matrix_view<const double>(en.data(), 1, 4));
    expect_error(in, {}, "entropy");
  }
  {
    auto in = make();
    const std::vector<double> s3{1, 1, 1};
    in.response_score = s3;
    expect_error(in, {}, "response_score");
  }
  {
    auto in = make();
    expect_error(in, {.probability = ulorl::mpt_probability::rollout}, "old_log_prob");
  }
  {
    std::vector<double> k3(3, 5.0);
    auto in = make();
    try {
      (void)ulorl::mpt_mask(in, ulorl::padded(ulorl::matrix_view<double>(k3.data(), 1, 3)), {});
      FAIL("no error");
    } catch (const ulorl::error& e) {
      CHECK(e.argument() == "keep");
    }
  }
  {
    // Packed offsets that do not end at the token count.
    const std::vector<std::int64_t> bad{0, 1, 3};
    std::vector<double> kp(4, 5.0);
    ulorl::mpt_batch<double> in{
        .log_prob = ulorl::token_view<const double>::packed(ulorl::vector_view<const double>(lp.data(), 4), bad),
        .entropy = ulorl::token_view<const double>::packed(ulorl::vector_view<const double>(en.data(), 4), bad),
        .response_score = score};
    CHECK_THROWS_AS((void)ulorl::mpt_mask(in, ulorl::token_view<double>::packed(ulorl::vector_view<double>(kp.data(), 4), bad), {}),
                    ulorl::error);
    CHECK(kp == std::vector<double>(4, 5.0));
  }
}

TEST_CASE("mpt_mask rejects an unknown enum value of its config before writing", "[masking][mpt][error][enum]") {
  const std::vector<double> lp{0.0, -1.0, 0.0, -2.0}, en{0.1, 0.1, 0.1, 0.1}, score{1.0, 0.0};
  std::vector<double> keep(4, 5.0);
  const auto mv = [](const std::vector<double>& v) { return ulorl::padded(ulorl::matrix_view<const double>(v.data(), 2, 2)); };
  const ulorl::mpt_batch<double> in{.log_prob = mv(lp), .old_log_prob = mv(lp), .entropy = mv(en), .response_score = score};
  const auto out = ulorl::padded(ulorl::matrix_view<double>(keep.data(), 2, 2));
  const auto call = [&](ulorl::mpt_config cfg) { return [&, cfg] { (void)ulorl::mpt_mask(in, out, cfg); }; };
  REQUIRE_THROWS_WITH(call({.mode = static_cast<ulorl::mpt_mode>(42)})(),
                      Catch::Equals("ulorl::mpt_mask: argument 'mode' = 42: unknown enum value (known: 0, 1, 2)"));
  require_unknown_enum(call({.mode = static_cast<ulorl::mpt_mode>(3)}), "mpt_mask", "mode", 3);
  require_unknown_enum(call({.mode = static_cast<ulorl::mpt_mode>(255)}), "mpt_mask", "mode", 255);
  require_unknown_enum(call({.positive = static_cast<ulorl::mpt_positive>(2)}), "mpt_mask", "positive", 2);
  require_unknown_enum(call({.probability = static_cast<ulorl::mpt_probability>(2)}), "mpt_mask", "probability", 2);
  require_unknown_enum(call({.scope = static_cast<ulorl::mpt_entropy_scope>(9)}), "mpt_mask", "scope", 9);
  // Also where the field would not be read (the scope of a static mask, every field when off).
  require_unknown_enum(call({.mode = ulorl::mpt_mode::static_mask, .scope = static_cast<ulorl::mpt_entropy_scope>(2)}),
                       "mpt_mask", "scope", 2);
  require_unknown_enum(call({.mode = ulorl::mpt_mode::off, .positive = static_cast<ulorl::mpt_positive>(7)}), "mpt_mask",
                       "positive", 7);
  REQUIRE(all_equal(keep, 5.0));
  CHECK_NOTHROW(call({})());
  CHECK_FALSE(all_equal(keep, 5.0));
}
