// Tests of policy_loss_config::rollout (ulorl/loss/policy_loss.hpp): the rollout correction
// computed inside the loss pass is, bit for bit, rollout_correction::apply followed by the loss on
// its weights and keep-mask (loss, every metric, the gradients and the correction's statistics),
// for token / sequence importance sampling, masking and gating, rejection chains, both layouts,
// float and double, token- and sequence-level objectives, the sequential executor and threads,
// and batches of several blocks (one row longer than a block, empty rows); batch normalisation
// through the two-phase statistics; every rejection rule (ulorl::error naming the argument,
// outputs untouched).
#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/loss/rollout_correction.hpp>
#include <ulorl/presets/openrlhf.hpp>
#include <ulorl/presets/trl.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/absent_mask.hpp"
#include "support/rejection.hpp"

namespace {
namespace rc = ulorl::rollout_correction;
using absent_mask::layout;
using absent_mask::same_bits;
constexpr std::uint64_t seed = 7717;

//! One batch in one layout: log-probs near the old ones, a rollout log-prob off by `spread`.
template <class T>
struct batch {
  layout lay;
  std::vector<T> lp, old, ref, ro, adv, ent;
  std::vector<std::uint8_t> mask;
  batch(const layout& l, std::mt19937_64& rng, double spread) : lay(l) {
    const std::size_t n = l.size();
    std::normal_distribution<double> nd(0.0, 1.0);
    lp.resize(n), old.resize(n), ref.resize(n), ro.resize(n), adv.resize(n), ent.resize(n), mask.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      // Rows (padded) or runs of tokens (packed) alternate between three spreads.
      const double f = 0.5 + 0.5 * static_cast<double>((l.packed ? i / 97 : i / std::max<std::size_t>(l.T, 1)) % 3);
      const double o = -std::fabs(nd(rng)) - 0.01;
      old[i] = static_cast<T>(o);
      lp[i] = static_cast<T>(o + 0.15 * nd(rng));
      ref[i] = static_cast<T>(o + 0.1 * nd(rng));
      ro[i] = static_cast<T>(o + f * spread * nd(rng));
      adv[i] = static_cast<T>(nd(rng));
      ent[i] = static_cast<T>(std::fabs(nd(rng)));
      mask[i] = rng() % 7 != 0;
    }
  }
  [[nodiscard]] rc::inputs<T, std::uint8_t> rc_inputs() const { return {lay.cview(old), lay.cview(ro), lay.cview(mask)}; }
};

ulorl::policy_loss_config loss_config(ulorl::objective_kind kind, double tokens) {
  ulorl::policy_loss_config cfg;
  cfg.objective.kind = kind;
  cfg.objective.eps_high = 0.28;
  cfg.kl_coef = 0.02;
  cfg.kl.estimator = ulorl::kl_estimator::k3;
  cfg.entropy_coef = 0.003;
  cfg.normalizer = {ulorl::agg_mode::token_mean, tokens, 1.0};
  return cfg;
}

//! The correction configurations under test (each bounded, so the loss can run it inline).
std::vector<std::pair<std::string, rc::config>> configs() {
  std::vector<std::pair<std::string, rc::config>> out;
  rc::config tis;  // token TIS, upper 2
  out.emplace_back("token truncate", tis);
  rc::config icepop;
  icepop.importance.weighting = rc::is_weighting::mask, icepop.importance.lower = 0.5, icepop.importance.upper = 2.0;
  out.emplace_back("token mask (IcePop)", icepop);
  rc::config seq;
  seq.importance.level = rc::is_level::sequence, seq.importance.upper = 3.0, seq.importance.masked = rc::masked_positions::neutral;
  out.emplace_back("sequence truncate", seq);
  rc::config gate;
  gate.importance.weighting = rc::is_weighting::geometric_gate, gate.importance.lower = 0.995, gate.importance.upper = 1.005;
  out.emplace_back("geometric gate (seq-mask-tis)", gate);
  rc::config rs;  // token TIS with a rejection chain: token k2, sequence-mean k3
  rs.rejection.chain.push_back({rc::rs_statistic::token, rc::rs_estimator::k2, 0.0, 0.05});
  rs.rejection.chain.push_back({rc::rs_statistic::sequence_mean, rc::rs_estimator::k3, 0.0, 0.05});
  out.emplace_back("truncate + rejection chain", rs);
  rc::config rs_only;
  rs_only.importance.level = rc::is_level::none;
  rs_only.rejection.chain.push_back({rc::rs_statistic::sequence_max, rc::rs_estimator::k2, 0.0, 0.3});
  out.emplace_back("rejection only", rs_only);
  out.emplace_back("trl sequence_mask", ulorl::presets::trl::rollout_correction({}));
  return out;
}

template <class T>
struct loss_out {
  ulorl::policy_loss_result res;
  std::vector<T> g, ge;
};

//! apply(), then the loss on its outputs.
template <class T, class Exec>
loss_out<T> composed(const batch<T>& d, const rc::config& c, ulorl::policy_loss_config cfg, const Exec& exec, rc::statistics& st) {
  const layout& l = d.lay;
  std::vector<T> w(l.size());
  std::vector<std::uint8_t> keep(l.size());
  const rc::metrics m = rc::apply(d.rc_inputs(), rc::outputs<T, std::uint8_t>{l.mview(w), l.mview(keep)}, c);
  st = m.totals;
  loss_out<T> o{{}, std::vector<T>(l.size(), T(7)), std::vector<T>(l.size(), T(7))};
  const ulorl::policy_loss_inputs<T, std::uint8_t> in{l.cview(d.lp), l.cview(d.old), l.cview(d.adv), l.cview(keep),
                                                      l.cview(d.ref), l.cview(w),     l.cview(d.ent)};
  o.res = ulorl::policy_loss(in, l.mview(o.g), l.mview(o.ge), cfg, exec);
  return o;
}

//! The loss with cfg.rollout = c.
template <class T, class Exec>
loss_out<T> fused(const batch<T>& d, const rc::config& c, ulorl::policy_loss_config cfg, const Exec& exec,
                  std::optional<double> factor = std::nullopt) {
  const layout& l = d.lay;
  cfg.rollout = c;
  cfg.rollout_batch_norm_factor = factor;
  loss_out<T> o{{}, std::vector<T>(l.size(), T(7)), std::vector<T>(l.size(), T(7))};
  ulorl::policy_loss_inputs<T, std::uint8_t> in{l.cview(d.lp), l.cview(d.old), l.cview(d.adv), l.cview(d.mask),
                                                l.cview(d.ref), {},            l.cview(d.ent)};
  in.rollout_log_prob = l.cview(d.ro);
  o.res = ulorl::policy_loss(in, l.mview(o.g), l.mview(o.ge), cfg, exec);
  return o;
}

template <class T>
void require_same(const loss_out<T>& a, const loss_out<T>& b) {
  CHECK(same_bits(a.res.loss, b.res.loss));
  CHECK(same_bits(a.res.pg_loss, b.res.pg_loss));
  CHECK(same_bits(a.res.kl_loss, b.res.kl_loss));
  CHECK(same_bits(a.res.entropy_loss, b.res.entropy_loss));
  CHECK(same_bits(a.res.metrics, b.res.metrics));
  CHECK(same_bits(a.g, b.g));
  CHECK(same_bits(a.ge, b.ge));
}

//! Padded [B, T] and packed rows of the given lengths.
std::vector<layout> layouts_of(std::size_t B, std::size_t T, const std::vector<std::int64_t>& lengths) {
  layout pad{false, B, T, {}}, pk{true, lengths.size(), 0, {0}};
  for (const auto n : lengths) pk.off.push_back(pk.off.back() + n);
  return {pad, pk};
}

template <class T>
void check_equals_composition(const char* what, const std::vector<layout>& lays, std::mt19937_64& rng,
                              std::vector<ulorl::objective_kind> kinds) {
  for (const auto& lay : lays) {
    const batch<T> d(lay, rng, 0.3);
    for (const auto& [name, c] : configs()) {
      for (const auto kind : kinds) {
        rc::statistics st;
        // The normaliser counts the kept tokens: from the statistics pass (accumulate, no outputs).
        const rc::statistics pre = rc::accumulate(d.rc_inputs(), rc::outputs<T, std::uint8_t>{}, c);
        const double kept = pre.tokens - pre.rejected_tokens;
        // Every configuration changes something, and keeps something.
        INFO(what << ", " << (lay.packed ? "packed" : "padded") << ", " << name);
        CHECK(pre.out_of_bounds_tokens + pre.rejected_tokens > 0);
        CHECK(kept > 0);
        const auto cfg = loss_config(kind, kept);
        for (const bool threads : {false, true}) {
          INFO(what << ", " << (lay.packed ? "packed" : "padded") << ", " << name << ", objective "
                    << static_cast<int>(kind) << (threads ? ", 3 threads" : ", sequential"));
          const auto a = threads ? composed(d, c, cfg, ulorl::thread_executor{3}, st)
                                 : composed(d, c, cfg, ulorl::sequential_executor{}, st);
          const auto b = threads ? fused(d, c, cfg, ulorl::thread_executor{3}) : fused(d, c, cfg, ulorl::sequential_executor{});
          require_same(a, b);
          CHECK(same_bits(b.res.rollout, st));
          CHECK(same_bits(pre, st));
          CHECK(b.res.metrics.tokens == kept);
        }
      }
    }
  }
}
}  // namespace

TEST_CASE("the loss with cfg.rollout is rollout_correction::apply, then the loss on its outputs, bit for bit", "[rollout]") {
  std::mt19937_64 rng(seed);
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  // One block: small rows (packed row 1 empty).
  const std::vector<ulorl::objective_kind> all{ulorl::objective_kind::ppo_clip, ulorl::objective_kind::gspo,
                                               ulorl::objective_kind::gmpo, ulorl::objective_kind::cispo};
  check_equals_composition<float>("float, one block", absent_mask::layouts(rng, 9, 200), rng, all);
  check_equals_composition<double>("double, one block", absent_mask::layouts(rng, 9, 200), rng, all);
  // Several blocks: padded 24 x 7000 (168,000 tokens); packed rows of 70,000 (longer than a
  // block), 0, 12, 40,000, 30,000 and 1 tokens.
  const auto big = layouts_of(24, 7000, {70000, 0, 12, 40000, 30000, 1});
  check_equals_composition<float>("float, several blocks", big, rng, {ulorl::objective_kind::ppo_clip});
}

TEST_CASE("batch normalisation in the loss takes the divisor of the whole batch's statistics", "[rollout]") {
  std::mt19937_64 rng(seed + 1);
  for (const auto& lay : absent_mask::layouts(rng, 11, 300)) {
    const batch<double> d(lay, rng, 0.4);
    rc::config c;
    c.importance.batch_normalize = true;
    for (const auto level : {rc::is_level::token, rc::is_level::sequence}) {
      c.importance.level = level;
      INFO((lay.packed ? "packed" : "padded") << (level == rc::is_level::token ? ", token" : ", sequence"));
      // The statistics pass (no outputs), finalised: the factor.
      const rc::statistics total = rc::accumulate(d.rc_inputs(), rc::outputs<double, std::uint8_t>{}, c);
      const rc::metrics m = rc::finalize(total, c);
      REQUIRE(m.batch_norm_factor != 1.0);
      const auto cfg = loss_config(ulorl::objective_kind::ppo_clip, total.tokens);
      rc::statistics st;
      const auto a = composed(d, c, cfg, ulorl::sequential_executor{}, st);
      const auto b = fused(d, c, cfg, ulorl::sequential_executor{}, m.batch_norm_factor);
      require_same(a, b);
      CHECK(same_bits(b.res.rollout, st));
    }
  }
}

TEST_CASE("the loss with cfg.rollout rejects bad input and writes nothing", "[rollout][rejection]") {
  std::mt19937_64 rng(seed + 2);
  const layout lay = absent_mask::layouts(rng, 4, 50)[0];
  batch<float> d(lay, rng, 0.2);
  std::vector<float> w(lay.size(), 1.0f), g(lay.size(), 7.0f), ge(lay.size(), 7.0f);
  const std::vector<float> g0 = g;
  auto run = [&](ulorl::policy_loss_config cfg, ulorl::policy_loss_inputs<float, std::uint8_t> in) {
    return arg_of([&] { (void)ulorl::policy_loss(in, lay.mview(g), lay.mview(ge), cfg); });
  };
  const auto cfg0 = loss_config(ulorl::objective_kind::ppo_clip, 100);
  auto with_rc = [&](rc::config c) {
    auto cfg = cfg0;
    cfg.rollout = c;
    return cfg;
  };
  ulorl::policy_loss_inputs<float, std::uint8_t> in{lay.cview(d.lp), lay.cview(d.old), lay.cview(d.adv), lay.cview(d.mask),
                                                    lay.cview(d.ref), {},              lay.cview(d.ent)};
  auto in_ro = in;
  in_ro.rollout_log_prob = lay.cview(d.ro);

  CHECK(run(cfg0, in_ro) == "rollout_log_prob");  // given without cfg.rollout
  CHECK(run(with_rc({}), in) == "rollout_log_prob");  // cfg.rollout without it
  {
    auto cfg = cfg0;
    cfg.rollout_batch_norm_factor = 2.0;
    CHECK(run(cfg, in) == "rollout_batch_norm_factor");  // factor without cfg.rollout
  }
  {
    auto bad = in;
    const layout other{false, lay.B, lay.T - 1, {}};
    bad.rollout_log_prob = other.cview(d.ro);
    CHECK(run(with_rc({}), bad) == "rollout_log_prob");  // shape
  }
  {
    auto both = in_ro;
    both.weights = lay.cview(w);
    CHECK(run(with_rc({}), both) == "weights");
  }
  {
    rc::config c;
    c.importance.batch_normalize = true;
    CHECK(run(with_rc(c), in_ro) == "rollout_batch_norm_factor");  // required
    auto cfg = with_rc(c);
    for (const double f : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
      cfg.rollout_batch_norm_factor = f;
      CHECK(run(cfg, in_ro) == "rollout_batch_norm_factor");
    }
    cfg = with_rc({});
    cfg.rollout_batch_norm_factor = 1.5;
    CHECK(run(cfg, in_ro) == "rollout_batch_norm_factor");  // without batch_normalize
  }
  {
    rc::config c;  // unbounded weights: no upper bound, no clamp
    c.importance.upper = rc::unbounded, c.importance.log_ratio_clamp = rc::unbounded;
    CHECK(run(with_rc(c), in_ro) == "rollout");
    // OpenRLHF's IcePop: an overflowed ratio masked out is NaN.
    CHECK(run(with_rc(ulorl::presets::openrlhf::rollout_correction({.vllm_is_correction_type = rc::is_weighting::mask})), in_ro) ==
          "rollout");
    // A clamp whose exp overflows float: fine in double, rejected in float.
    c.importance.weighting = rc::is_weighting::geometric_gate, c.importance.upper = 2.0, c.importance.log_ratio_clamp = 100.0;
    CHECK(run(with_rc(c), in_ro) == "rollout");
  }
  {
    rc::config c;
    c.importance.upper = -1.0;  // the correction's own validation
    CHECK(run(with_rc(c), in_ro) == "importance.upper");
  }
  {
    auto nan = d;
    nan.ro[17] = std::numeric_limits<float>::quiet_NaN();
    auto bad = in;
    bad.rollout_log_prob = lay.cview(nan.ro);
    CHECK(run(with_rc({}), bad) == "rollout_log_prob");
  }
  CHECK(same_bits(g, g0));
  CHECK(same_bits(ge, g0));
}
