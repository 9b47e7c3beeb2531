// Tests of ulorl/masking/off_policy.hpp (off-policy sequence masking, TRL and slime) against an
// independent float64 oracle written here: random sizes with fixed seeds, both layouts, float and
// double, both advantage levels and both output forms, the metrics' additivity over partitions,
// the presets, and every rejected input (ulorl::error naming the argument, outputs untouched).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <ulorl/masking.hpp>
#include <ulorl/presets/slime.hpp>
#include <ulorl/presets/trl.hpp>

#include "catch.hpp"
#include "support/rejection.hpp"

namespace {

constexpr std::uint64_t kSeed = 20261201;

// ---- oracle: the golden README §4.10 formulas over rows of doubles -----------------------------
struct oracle_rows {
  std::vector<std::vector<double>> lp, old, adv;  // adv: per token (the token level)
  std::vector<std::vector<int>> m;
  std::vector<double> seq_adv;  // the sequence level
};
struct oracle_result {
  std::vector<std::vector<int>> drop;
  std::vector<double> kl;
  double clipfrac = 0.0;
  long tokens = 0, off_rows = 0, dropped_rows = 0, dropped_tokens = 0;
};
oracle_result oracle(const oracle_rows& r, double delta, bool per_token) {
  oracle_result o;
  for (std::size_t b = 0; b < r.lp.size(); ++b) {
    // The valid differences first, then their sum (another order than a fused loop).
    std::vector<double> diffs;
    for (std::size_t t = 0; t < r.lp[b].size(); ++t)
      if (r.m[b][t] == 1) diffs.push_back(r.old[b][t] - r.lp[b][t]);
    const double n = std::max<double>(static_cast<double>(diffs.size()), 1.0);
    const double kl = std::accumulate(diffs.begin(), diffs.end(), 0.0) / n;
    o.kl.push_back(kl);
    o.tokens += static_cast<long>(diffs.size());
    o.off_rows += kl > delta;
    std::vector<int> d(r.lp[b].size());
    double row_drops = 0.0;
    for (std::size_t t = 0; t < d.size(); ++t) {
      const double a = per_token ? r.adv[b][t] : r.seq_adv[b];
      d[t] = (a < 0.0 && kl > delta) ? 1 : 0;
      row_drops += d[t];
      o.dropped_tokens += d[t] == 1 && r.m[b][t] == 1;
    }
    o.dropped_rows += row_drops > 0;
    o.clipfrac += row_drops / n;
    o.drop.push_back(d);
  }
  return o;
}

// ---- random batches -------------------------------------------------------------------------------
//! B rows of T positions; the valid tokens of a row are a prefix with holes (some rows empty).
oracle_rows make_rows(std::mt19937_64& rng, std::size_t B, std::size_t T) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  oracle_rows r;
  for (std::size_t b = 0; b < B; ++b) {
    const double drift = u(rng) < 0.5 ? 0.0 : 0.6 * u(rng);  // on-policy rows and drifted ones
    const std::size_t len = u(rng) < 0.1 ? 0 : static_cast<std::size_t>(u(rng) * static_cast<double>(T + 1));
    std::vector<double> lp(T), old(T), adv(T);
    std::vector<int> m(T);
    for (std::size_t t = 0; t < T; ++t) {
      old[t] = -4.0 * u(rng);
      lp[t] = old[t] - drift * 2.0 * u(rng) + 0.05 * (u(rng) - 0.5);
      const double k = u(rng);
      adv[t] = k < 0.15 ? 0.0 : (k < 0.6 ? -u(rng) : u(rng));
      m[t] = t < std::min(len, T) && u(rng) > 0.1 ? 1 : 0;
    }
    r.lp.push_back(lp);
    r.old.push_back(old);
    r.adv.push_back(adv);
    r.m.push_back(m);
    const double k = u(rng);
    r.seq_adv.push_back(k < 0.15 ? 0.0 : (k < 0.6 ? -u(rng) : u(rng)));
  }
  return r;
}

//! The rows as flat arrays of one layout: padded [B, T], or packed (rows cut to `keep_len[b]`).
template <class T, class M>
struct flat_batch {
  shape s;
  std::vector<T> lp, old, adv;
  std::vector<M> m;
  flat_batch(const oracle_rows& r, const std::vector<std::size_t>* packed_len) {
    const std::size_t B = r.lp.size(), Tn = B ? r.lp[0].size() : 0;
    if (packed_len) {
      s.offsets.push_back(0);
      for (std::size_t b = 0; b < B; ++b) s.offsets.push_back(s.offsets.back() + static_cast<std::int64_t>((*packed_len)[b]));
    } else {
      s.B = B;
      s.T = Tn;
    }
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < (packed_len ? (*packed_len)[b] : Tn); ++t) {
        lp.push_back(static_cast<T>(r.lp[b][t]));
        old.push_back(static_cast<T>(r.old[b][t]));
        adv.push_back(static_cast<T>(r.adv[b][t]));
        m.push_back(static_cast<M>(r.m[b][t]));
      }
  }
};

//! The rows as the element type T sees them (what the oracle must be given to agree exactly).
template <class T>
oracle_rows rounded(oracle_rows r) {
  for (auto* rows : {&r.lp, &r.old, &r.adv})
    for (auto& row : *rows)
      for (auto& x : row) x = static_cast<double>(static_cast<T>(x));
  for (auto& x : r.seq_adv) x = static_cast<double>(static_cast<T>(x));
  return r;
}

//! Runs the library on one layout and checks it against the oracle (rows cut to packed_len).
template <class T, class O>
ulorl::off_policy_mask_stats run_and_check(const oracle_rows& full, const ulorl::off_policy_mask_config& cfg,
                                           const std::vector<std::size_t>* packed_len) {
  const bool per_token = cfg.advantage == ulorl::off_policy_advantage_level::token;
  oracle_rows rows = rounded<T>(full);
  if (packed_len)
    for (std::size_t b = 0; b < rows.lp.size(); ++b)
      for (auto* v : {&rows.lp[b], &rows.old[b], &rows.adv[b]}) v->resize((*packed_len)[b]);
  if (packed_len)
    for (std::size_t b = 0; b < rows.m.size(); ++b) rows.m[b].resize((*packed_len)[b]);
  const auto want = oracle(rows, cfg.delta, per_token);

  flat_batch<T, std::uint8_t> f(full, packed_len);
  std::vector<T> seq_adv(full.seq_adv.begin(), full.seq_adv.end());
  ulorl::off_policy_mask_inputs<T, std::uint8_t, T> in{.log_prob = view_of<const T>(f.lp.data(), f.s),
                                                        .old_log_prob = view_of<const T>(f.old.data(), f.s),
                                                        .mask = view_of<const std::uint8_t>(f.m.data(), f.s)};
  if (per_token)
    in.advantages = view_of<const T>(f.adv.data(), f.s);
  else
    in.sequence_advantages = seq_adv;
  std::vector<O> keep(f.s.size(), O(7));
  std::vector<double> kl(full.lp.size(), 42.0);
  const auto st = ulorl::off_policy_mask(in, view_of<O>(keep.data(), f.s), std::span<double>(kl), cfg);

  CHECK(st.rows == full.lp.size());
  CHECK(static_cast<long>(st.tokens) == want.tokens);
  CHECK(static_cast<long>(st.off_policy_rows) == want.off_rows);
  CHECK(static_cast<long>(st.dropped_rows) == want.dropped_rows);
  CHECK(static_cast<long>(st.dropped_tokens) == want.dropped_tokens);
  CHECK(st.clipfrac == Approx(want.clipfrac).epsilon(1e-12).margin(1e-300));
  for (std::size_t b = 0; b < rows.lp.size(); ++b) {
    REQUIRE(kl[b] == Approx(want.kl[b]).epsilon(1e-12).margin(1e-14));
    for (std::size_t t = 0; t < rows.lp[b].size(); ++t) {
      const int expect = cfg.form == ulorl::off_policy_mask_form::factor ? 1 - want.drop[b][t]
                                                                          : rows.m[b][t] * (1 - want.drop[b][t]);
      INFO("row " << b << " token " << t << " kl " << want.kl[b]);
      REQUIRE(keep[f.s.row_begin(b) + t] == O(expect));
    }
  }
  return st;
}

}  // namespace

TEST_CASE("off-policy mask matches the oracle in both layouts, levels and forms", "[masking][off_policy]") {
  std::printf("test_masking_off_policy seed %llu\n", static_cast<unsigned long long>(kSeed));
  std::mt19937_64 rng(kSeed);
  const std::size_t sizes[][2] = {{1, 1}, {1, 47}, {3, 5}, {47, 3}, {8, 33}, {17, 64}, {2, 1023}};
  const double deltas[] = {-0.05, 0.0, 1e-4, 0.05, 0.3, 10.0};
  int trial = 0;
  for (const auto& sz : sizes)
    for (double delta : deltas)
      for (auto level : {ulorl::off_policy_advantage_level::sequence, ulorl::off_policy_advantage_level::token})
        for (auto form : {ulorl::off_policy_mask_form::factor, ulorl::off_policy_mask_form::loss_mask}) {
          INFO("trial " << trial++ << " B " << sz[0] << " T " << sz[1] << " delta " << delta);
          const auto rows = make_rows(rng, sz[0], sz[1]);
          const ulorl::off_policy_mask_config cfg{.delta = delta, .advantage = level, .form = form};
          // Padded, and packed with every position of each row: identical results.
          const auto padded = run_and_check<double, std::uint8_t>(rows, cfg, nullptr);
          std::vector<std::size_t> all(sz[0], sz[1]);
          const auto packed_all = run_and_check<double, float>(rows, cfg, &all);
          CHECK(packed_all.clipfrac == padded.clipfrac);
          CHECK(packed_all.dropped_tokens == padded.dropped_tokens);
          // Packed rows cut at a random length >= the last valid token: same mask on the common
          // positions and the same counts (clipfrac counts the row's own positions).
          std::vector<std::size_t> cut(sz[0]);
          for (std::size_t b = 0; b < sz[0]; ++b) {
            std::size_t last = 0;
            for (std::size_t t = 0; t < sz[1]; ++t)
              if (rows.m[b][t]) last = t + 1;
            cut[b] = last + static_cast<std::size_t>(rng() % (sz[1] - last + 1));
          }
          const auto packed_cut = run_and_check<double, double>(rows, cfg, &cut);
          CHECK(packed_cut.tokens == padded.tokens);
          CHECK(packed_cut.dropped_tokens == padded.dropped_tokens);
          CHECK(packed_cut.off_policy_rows == padded.off_policy_rows);
          // float inputs (the oracle sees the float values).
          (void)run_and_check<float, std::uint8_t>(rows, cfg, nullptr);
          (void)run_and_check<float, float>(rows, cfg, &cut);
        }
}

TEST_CASE("off-policy mask: hand-worked rows, ties at delta, empty rows", "[masking][off_policy]") {
  // Row 0: KL (0.5 + 0.5) / 2 = 0.5; row 1: (0 - 0.5) / 2 = -0.25; row 2 has no valid token (KL 0).
  const std::vector<double> lp{-1.5, -1.5, -2.0, -1.0, -0.5, -3.0, -1.0, -1.0, -1.0};
  const std::vector<double> old(9, -1.0);
  const std::vector<std::uint8_t> m{1, 1, 0, 1, 1, 0, 0, 0, 0};
  const shape s{3, 3, {}};
  ulorl::off_policy_mask_inputs<double> in{.log_prob = view_of<const double>(lp.data(), s),
                                           .old_log_prob = view_of<const double>(old.data(), s),
                                           .mask = view_of<const std::uint8_t>(m.data(), s)};
  std::vector<double> keep(9, 7.0), kl(3);
  SECTION("sequence level (TRL): KL exactly delta is kept, KL above it with A < 0 drops the row") {
    const std::vector<double> adv{-1.0, -1.0, -2.0};
    in.sequence_advantages = adv;
    auto st = ulorl::off_policy_mask(in, view_of<double>(keep.data(), s), std::span<double>(kl),
                                     ulorl::presets::trl::off_policy_mask(0.5));
    CHECK(kl == std::vector<double>{0.5, -0.25, 0.0});
    CHECK(all_equal(keep, 1.0));
    CHECK(st.dropped_rows == 0);
    st = ulorl::off_policy_mask(in, view_of<double>(keep.data(), s), ulorl::presets::trl::off_policy_mask(0.4999));
    CHECK(keep == std::vector<double>{0, 0, 0, 1, 1, 1, 1, 1, 1});  // padding of row 0 too
    CHECK(st.dropped_rows == 1);
    CHECK(st.dropped_tokens == 2);
    CHECK(st.clipfrac == 1.5);  // 3 positions / 2 valid tokens
    CHECK(st.tokens == 4);
    // A >= 0 keeps a row whatever its KL (A == 0 included).
    const std::vector<double> adv0{0.0, -1.0, -2.0};
    in.sequence_advantages = adv0;
    st = ulorl::off_policy_mask(in, view_of<double>(keep.data(), s),
                                {.delta = -1.0, .advantage = ulorl::off_policy_advantage_level::sequence,
                                 .form = ulorl::off_policy_mask_form::loss_mask});
    // delta -1: every row is off-policy (KL 0 > -1 too); rows 1, 2 have A < 0.
    CHECK(keep == std::vector<double>{1, 1, 0, 0, 0, 0, 0, 0, 0});
    CHECK(st.off_policy_rows == 3);
    CHECK(st.dropped_rows == 2);
    CHECK(st.dropped_tokens == 2);
    CHECK(st.clipfrac == 1.5 + 3.0);  // row 1: 3 positions / 2 tokens; row 2: 3 / max(0, 1)
  }
  SECTION("token level (slime): only the negative-advantage positions of an off-policy row") {
    const std::vector<double> adv{-1.0, 0.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0};
    in.advantages = view_of<const double>(adv.data(), s);
    const auto st = ulorl::off_policy_mask(in, view_of<double>(keep.data(), s), ulorl::presets::slime::off_policy_mask(0.25));
    CHECK(keep == std::vector<double>{0, 1, 0, 1, 1, 1, 1, 1, 1});
    CHECK(st.clipfrac == 1.0);  // 2 dropped positions (one of them padding) / 2 tokens
    CHECK(st.dropped_tokens == 1);
  }
  SECTION("no mask: every token valid") {
    const std::vector<double> adv{-1.0, -1.0, -1.0};
    in.mask = {};
    in.sequence_advantages = adv;
    (void)ulorl::off_policy_mask(in, view_of<double>(keep.data(), s), std::span<double>(kl),
                                 ulorl::presets::trl::off_policy_mask(0.0));
    CHECK(kl[0] == Approx(2.0 / 3.0));
    CHECK(kl[2] == 0.0);
    CHECK(keep == std::vector<double>{0, 0, 0, 0, 0, 0, 1, 1, 1});  // row 1: (0 - 0.5 + 2) / 3 = 0.5 > 0
  }
}

TEST_CASE("off-policy mask: metrics add over row partitions; properties", "[masking][off_policy][property]") {
  std::mt19937_64 rng(kSeed + 1);
  for (int trial = 0; trial < 20; ++trial) {
    const std::size_t B = 2 + rng() % 30, T = 1 + rng() % 40;
    const auto rows = make_rows(rng, B, T);
    for (auto level : {ulorl::off_policy_advantage_level::sequence, ulorl::off_policy_advantage_level::token}) {
      const ulorl::off_policy_mask_config cfg{.delta = 0.05, .advantage = level};
      const auto whole = run_and_check<double, std::uint8_t>(rows, cfg, nullptr);
      const std::size_t split = 1 + rng() % (B - 1);
      oracle_rows a, b;
      for (std::size_t r = 0; r < B; ++r) {
        oracle_rows& dst = r < split ? a : b;
        dst.lp.push_back(rows.lp[r]);
        dst.old.push_back(rows.old[r]);
        dst.adv.push_back(rows.adv[r]);
        dst.m.push_back(rows.m[r]);
        dst.seq_adv.push_back(rows.seq_adv[r]);
      }
      auto sum = run_and_check<double, std::uint8_t>(a, cfg, nullptr);
      sum += run_and_check<double, std::uint8_t>(b, cfg, nullptr);
      CHECK(sum.rows == whole.rows);
      CHECK(sum.tokens == whole.tokens);
      CHECK(sum.off_policy_rows == whole.off_policy_rows);
      CHECK(sum.dropped_rows == whole.dropped_rows);
      CHECK(sum.dropped_tokens == whole.dropped_tokens);
      CHECK(sum.clipfrac == Approx(whole.clipfrac).epsilon(1e-14));
      // A threshold above every row's KL drops nothing; non-negative advantages drop nothing.
      auto big = run_and_check<double, std::uint8_t>(rows, {.delta = 1e6, .advantage = level}, nullptr);
      CHECK(big.dropped_tokens == 0);
      CHECK(big.clipfrac == 0.0);
      oracle_rows pos = rows;
      for (auto& r : pos.adv)
        for (auto& x : r) x = std::fabs(x);
      for (auto& x : pos.seq_adv) x = std::fabs(x);
      auto p = run_and_check<double, std::uint8_t>(pos, {.delta = -1e6, .advantage = level}, nullptr);
      CHECK(p.dropped_rows == 0);
      CHECK(p.off_policy_rows == B);
    }
  }
}

TEST_CASE("off-policy mask presets", "[masking][off_policy][presets]") {
  constexpr auto t = ulorl::presets::trl::off_policy_mask(0.3);
  static_assert(t.delta == 0.3 && t.advantage == ulorl::off_policy_advantage_level::sequence);
  constexpr auto s = ulorl::presets::slime::off_policy_mask();
  static_assert(s.delta == 1e-4 && s.advantage == ulorl::off_policy_advantage_level::token);
  static_assert(s.form == ulorl::off_policy_mask_form::factor && t.form == ulorl::off_policy_mask_form::factor);
  constexpr ulorl::off_policy_mask_config d{};
  static_assert(d.delta == 1e-4 && d.advantage == ulorl::off_policy_advantage_level::sequence);
}

namespace {
//! One valid call over `base` (padded [3, 4] or packed {0, 3, 3, 7, 12}), each part replaceable.
template <class M>
struct opsm_case {
  shape s, old_s, mask_s, adv_s, keep_s;
  std::vector<double> lp, old, adv, seq_adv, keep, kl;
  std::vector<M> mask;
  ulorl::off_policy_mask_config cfg{.delta = 0.1, .advantage = ulorl::off_policy_advantage_level::token};
  bool give_adv = true, give_seq = false;
  explicit opsm_case(const shape& base)
      : s(base), old_s(base), mask_s(base), adv_s(base), keep_s(base), lp(base.size(), -1.0), old(base.size(), -0.5),
        adv(base.size(), -1.0), seq_adv(base.rows(), -1.0), keep(base.size(), 7.0), kl(base.rows(), 42.0),
        mask(base.size(), M(1)) {}
  void resize() {
    old.resize(old_s.size(), -0.5);
    adv.resize(adv_s.size(), -1.0);
    mask.resize(mask_s.size(), M(1));
    keep.assign(keep_s.size(), 7.0);
  }
  ulorl::off_policy_mask_stats run() {
    ulorl::off_policy_mask_inputs<double, M, double> in{.log_prob = view_of<const double>(lp.data(), s),
                                                        .old_log_prob = view_of<const double>(old.data(), old_s),
                                                        .mask = view_of<const M>(mask.data(), mask_s)};
    if (give_adv) in.advantages = view_of<const double>(adv.data(), adv_s);
    if (give_seq) in.sequence_advantages = seq_adv;
    return ulorl::off_policy_mask(in, view_of<double>(keep.data(), keep_s), std::span<double>(kl), cfg);
  }
};
template <class M>
struct opsm_mask_case : opsm_case<M> {
  using opsm_case<M>::opsm_case;
};
}  // namespace

TEST_CASE("off-policy mask rejects each bad input, naming the argument, outputs untouched",
          "[masking][off_policy][error]") {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  constexpr const char* fn = "off_policy_mask";
  for (const shape& base : {padded_shape, packed_shape}) {
    INFO((base.offsets.empty() ? "padded" : "packed"));
    auto untouched = [](const opsm_case<std::uint8_t>& c) {
      REQUIRE(all_equal(c.keep, 7.0));
      REQUIRE(all_equal(c.kl, 42.0));
    };
    auto rejected = [&](auto&& mutate, const std::string& arg, std::int64_t index = -1) {
      opsm_case<std::uint8_t> c(base);
      mutate(c);
      c.resize();
      require_rejected(outcome_of([&] { (void)c.run(); }), fn, arg, index);
      untouched(c);
    };
    {
      opsm_case<std::uint8_t> ok(base);
      CHECK_NOTHROW(ok.run());
      CHECK(all_equal(ok.keep, 0.0));  // KL 0.5 > 0.1 and every advantage negative
    }
    rejected([&](auto& c) { c.cfg.delta = nan; }, "delta");
    rejected([&](auto& c) { c.cfg.delta = inf; }, "delta");
    require_unknown_enum(
        [&] {
          opsm_case<std::uint8_t> c(base);
          c.cfg.advantage = static_cast<ulorl::off_policy_advantage_level>(2);
          (void)c.run();
        },
        fn, "advantage", 2);
    require_unknown_enum(
        [&] {
          opsm_case<std::uint8_t> c(base);
          c.cfg.form = static_cast<ulorl::off_policy_mask_form>(9);
          (void)c.run();
        },
        fn, "form", 9);
    for (const shape& w : wrong_shapes(base)) {
      rejected([&](auto& c) { c.old_s = w; }, "old_log_prob");
      rejected([&](auto& c) { c.mask_s = w; }, "mask");
      rejected([&](auto& c) { c.adv_s = w; }, "advantages");
      rejected([&](auto& c) { c.keep_s = w; }, "keep");
    }
    // The advantages of the configured level are required, those of the other level refused.
    rejected([&](auto& c) { c.give_adv = false; }, "advantages");
    rejected([&](auto& c) { c.give_seq = true; }, "sequence_advantages");
    rejected([&](auto& c) { c.cfg.advantage = ulorl::off_policy_advantage_level::sequence; }, "advantages");
    rejected(
        [&](auto& c) {
          c.cfg.advantage = ulorl::off_policy_advantage_level::sequence;
          c.give_adv = false;
          c.give_seq = true;
          c.seq_adv.pop_back();
        },
        "sequence_advantages");
    rejected([&](auto& c) { c.kl.push_back(42.0); }, "seq_kl");
    // Non-finite values anywhere, masked positions included.
    const std::size_t last = base.size() - 1;
    rejected(
        [&](auto& c) {
          c.lp[last] = nan;
          c.mask[last] = 0;
        },
        "log_prob", static_cast<std::int64_t>(last));
    rejected([&](auto& c) { c.old[2] = -inf; }, "old_log_prob", 2);
    rejected([&](auto& c) { c.adv[last] = inf; }, "advantages", static_cast<std::int64_t>(last));
    rejected(
        [&](auto& c) {
          c.cfg.advantage = ulorl::off_policy_advantage_level::sequence;
          c.give_adv = false;
          c.give_seq = true;
          c.seq_adv[1] = nan;
        },
        "sequence_advantages", 1);
    CHECK(require_bad_masks_rejected<opsm_mask_case>(base, fn, [](const auto& c) { return c.keep; }, 7.0) == 18);
  }
  // A packed view's offsets are checked (log_prob's first).
  {
    opsm_case<std::uint8_t> c(packed_shape);
    c.s.offsets = {0, 3, 2, 7, 12};
    c.old_s = c.mask_s = c.adv_s = c.keep_s = c.s;
    require_rejected(outcome_of([&] { (void)c.run(); }), fn, "log_prob", 2);
    REQUIRE(all_equal(c.keep, 7.0));
  }
}

TEST_CASE("off-policy mask: a row KL whose sum overflows is exact; one beyond the double range is an error",
          "[masking][off_policy][overflow]") {
  // Row 0: old - logp = 1e308 twice (the sum overflows; the mean is 1e308). Row 1: 2e308, beyond.
  const std::vector<double> lp{-0.5e308, -0.5e308, -1e308, -1e308};
  const std::vector<double> old{0.5e308, 0.5e308, 1e308, 1e308};
  const shape s{2, 2, {}};
  ulorl::off_policy_mask_inputs<double> in{.log_prob = view_of<const double>(lp.data(), s),
                                           .old_log_prob = view_of<const double>(old.data(), s)};
  const std::vector<double> adv{-1.0, -1.0};
  in.sequence_advantages = adv;
  std::vector<double> keep(4, 7.0), kl(2, 3.0);
  CHECK_THROWS_WITH(ulorl::off_policy_mask(in, view_of<double>(keep.data(), s), std::span<double>(kl),
                                           ulorl::presets::trl::off_policy_mask(0.5)),
                    Catch::Contains("'seq_kl'[1]") && Catch::Contains("overflows float64"));
  CHECK(all_equal(keep, 7.0));
  CHECK(kl == std::vector<double>{3.0, 3.0});
  const shape s1{1, 2, {}};
  in.log_prob = view_of<const double>(lp.data(), s1);
  in.old_log_prob = view_of<const double>(old.data(), s1);
  in.sequence_advantages = std::span<const double>(adv.data(), 1);
  (void)ulorl::off_policy_mask(in, view_of<double>(keep.data(), s1), std::span<double>(kl.data(), 1),
                               ulorl::presets::trl::off_policy_mask(0.5));
  CHECK(kl[0] == 1e308);
  CHECK(keep[0] == 0.0);
}
