// Tests of ulorl/logits/fused_loss.hpp: the fused loss equals policy_loss applied to the logits'
// log-probs and entropies (the oracle's), and d loss / d logits agrees with central finite
// differences of the whole fused loss (token-level PPO clip-higher + k3 KL + entropy bonus, and
// sequence-level GSPO), in the padded and packed layouts; bad input is rejected.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include <ulorl/logits/fused_loss.hpp>

#include "catch.hpp"
#include "support/logits_oracle.hpp"

using namespace ulorl;

namespace {

constexpr std::uint64_t seed = 8080;

struct problem {
  std::size_t b = 3, t = 5, v = 11;
  std::vector<double> x, old, ref, adv, mask;
  std::vector<std::int64_t> labels;
  std::vector<std::int64_t> offsets;  // packed layout: the valid tokens only
};

problem make(std::mt19937_64& rng) {
  problem p;
  std::normal_distribution<double> nd;
  const std::size_t n = p.b * p.t;
  for (std::size_t i = 0; i < n * p.v; ++i) p.x.push_back(2 * nd(rng));
  for (std::size_t i = 0; i < n; ++i) {
    p.labels.push_back(static_cast<std::int64_t>(rng() % p.v));
    p.old.push_back(-1.5 + 0.3 * nd(rng));
    p.ref.push_back(-1.5 + 0.3 * nd(rng));
    p.adv.push_back(nd(rng));
    p.mask.push_back((i % p.t) < p.t - (i / p.t) ? 1.0 : 0.0);  // row b has T - b valid tokens
  }
  return p;
}

// The fused loss in the padded layout; returns the loss and fills grad (if non-null).
double fused_padded(const problem& p, const std::vector<double>& x, const policy_loss_config& cfg, double tau,
                    std::vector<double>* grad, std::vector<double>* logp = nullptr, bool check_values = true,
                    const std::vector<double>* rollout_log_prob = nullptr) {
  const std::size_t n = p.b * p.t;
  const auto tv = [&](const std::vector<double>& v) {
    return token_view<const double>::padded(matrix_view<const double>(v.data(), p.b, p.t));
  };
  policy_loss_inputs<double> in{.log_prob = {},
                                .old_log_prob = tv(p.old),
                                .advantages = tv(p.adv),
                                .mask = tv(p.mask),
                                .ref_log_prob = tv(p.ref)};
  if (rollout_log_prob) in.rollout_log_prob = tv(*rollout_log_prob);
  std::vector<double> lp(n), ent(n), glp(n), gent(n), lse(n), g(n * p.v);
  const auto out = [&](std::vector<double>& v) {
    return token_view<double>::padded(matrix_view<double>(v.data(), p.b, p.t));
  };
  const logits_loss_buffers<double> buf{out(lp), out(ent), out(glp), out(gent), vector_view<double>(lse.data(), n)};
  const auto res = policy_loss_from_logits(
      matrix_view<const double>(x.data(), n, p.v), std::span<const std::int64_t>(p.labels), in, buf,
      matrix_view<double>(g.data(), n, p.v), cfg, {.temperature = tau, .check_values = check_values});
  if (grad) *grad = g;
  if (logp) *logp = lp;
  return res.loss;
}

policy_loss_config ppo_config(const problem& p) {
  double tokens = 0;
  for (double m : p.mask) tokens += m;
  policy_loss_config cfg;
  cfg.objective.eps_low = 0.2;
  cfg.objective.eps_high = 0.28;
  cfg.kl.estimator = kl_estimator::k3;
  cfg.kl_coef = 0.1;
  cfg.entropy_coef = 0.01;
  cfg.normalizer = agg_normalizer{agg_mode::token_mean, tokens, 1.0};
  return cfg;
}

}  // namespace

TEST_CASE("policy_loss_from_logits: value equals policy_loss on the oracle's log-probs") {
  std::printf("test_logits_fused_loss seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const auto p = make(rng);
  const auto cfg = ppo_config(p);
  std::vector<double> g, lp;
  const double loss = fused_padded(p, p.x, cfg, 0.8, &g, &lp);
  // Reference: oracle log-probs and entropies, then the loss area's policy_loss directly.
  const std::size_t n = p.b * p.t;
  std::vector<double> olp(n), oent(n), glp(n), gent(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<double> row(p.x.begin() + static_cast<std::ptrdiff_t>(i * p.v),
                                  p.x.begin() + static_cast<std::ptrdiff_t>((i + 1) * p.v));
    const auto o = oracle::logits_row(row, static_cast<std::size_t>(p.labels[i]), 0.8);
    olp[i] = static_cast<double>(o.log_prob);
    oent[i] = static_cast<double>(o.entropy);
    CHECK(std::fabs(lp[i] - olp[i]) < 1e-13);
  }
  const auto tv = [&](const std::vector<double>& v) {
    return token_view<const double>::padded(matrix_view<const double>(v.data(), p.b, p.t));
  };
  const auto out = [&](std::vector<double>& v) {
    return token_view<double>::padded(matrix_view<double>(v.data(), p.b, p.t));
  };
  const auto res =
      policy_loss(policy_loss_inputs<double>{tv(olp), tv(p.old), tv(p.adv), tv(p.mask), tv(p.ref), {}, tv(oent)},
                  out(glp), out(gent), cfg);
  CHECK(std::fabs(loss - res.loss) < 1e-12);
  // Masked tokens' logits get no gradient.
  for (std::size_t i = 0; i < n; ++i)
    if (p.mask[i] == 0.0)
      for (std::size_t j = 0; j < p.v; ++j) CHECK(g[i * p.v + j] == 0.0);
}

TEST_CASE("policy_loss_from_logits: gradient agrees with central finite differences") {
  std::mt19937_64 rng(seed + 1);
  const auto p = make(rng);
  auto ppo = ppo_config(p);
  auto gspo = ppo;
  gspo.objective.kind = objective_kind::gspo;
  gspo.objective.eps_low = 3e-4;
  gspo.objective.eps_high = 4e-4;
  gspo.normalizer = agg_normalizer{agg_mode::seq_mean_token_mean, 3.0, 1.0};
  // verl's own_token gradient is not the derivative of the value (the mean is detached); the
  // through_mean one (OpenRLHF / TRL) is, so finite differences can check it.
  gspo.objective.gspo.seq_gradient = sequence_gradient::through_mean;
  for (const auto& cfg : {ppo, gspo}) {
    std::vector<double> g;
    fused_padded(p, p.x, cfg, 0.8, &g);
    double worst = 0;
    for (std::size_t k = 0; k < p.x.size(); k += 3) {
      auto xp = p.x, xm = p.x;
      const double h = 1e-6;
      xp[k] += h;
      xm[k] -= h;
      const double fd = (fused_padded(p, xp, cfg, 0.8, nullptr) - fused_padded(p, xm, cfg, 0.8, nullptr)) / (2 * h);
      INFO("logit " << k << " objective " << static_cast<int>(cfg.objective.kind));
      CHECK(std::fabs(g[k] - fd) <= 1e-8 + 1e-5 * std::fabs(fd));
      worst = std::max(worst, std::fabs(g[k] - fd));
    }
    std::printf("  objective %d: max |grad - finite difference| %.2g\n", static_cast<int>(cfg.objective.kind), worst);
  }
}

TEST_CASE(
    "policy_loss_from_logits with the rollout correction in the loss pass: policy_loss on the oracle's log-probs, "
    "and d loss / d logits agrees with finite differences") {
  std::mt19937_64 rng(seed + 7);
  const auto p = make(rng);
  const std::size_t n = p.b * p.t;
  // Rollout log-probs around the old ones: ratios exp(old - rollout) in about [0.3, 3], so that the
  // bounds below both cut and keep.
  std::normal_distribution<double> nd;
  std::vector<double> ro(n);
  for (std::size_t i = 0; i < n; ++i) ro[i] = p.old[i] + 0.6 * nd(rng);
  rollout_correction::config tis;  // token TIS, upper 2
  tis.importance.upper = 2.0;
  rollout_correction::config icepop;  // token IcePop: ratios outside [0.5, 2] weigh 0
  icepop.importance.weighting = rollout_correction::is_weighting::mask;
  icepop.importance.lower = 0.5, icepop.importance.upper = 2.0;
  rollout_correction::config seq;  // sequence-level TIS
  seq.importance.level = rollout_correction::is_level::sequence, seq.importance.upper = 3.0;
  const auto tv = [&](const std::vector<double>& v) {
    return token_view<const double>::padded(matrix_view<const double>(v.data(), p.b, p.t));
  };
  const auto out = [&](std::vector<double>& v) {
    return token_view<double>::padded(matrix_view<double>(v.data(), p.b, p.t));
  };
  for (const auto& rc : {tis, icepop, seq}) {
    auto cfg = ppo_config(p);
    cfg.rollout = rc;
    std::vector<double> g, lp;
    const double loss = fused_padded(p, p.x, cfg, 0.8, &g, &lp, true, &ro);
    // Reference: the oracle's log-probs and entropies through policy_loss with the same correction.
    std::vector<double> olp(n), oent(n), glp(n), gent(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::vector<double> row(p.x.begin() + static_cast<std::ptrdiff_t>(i * p.v),
                                    p.x.begin() + static_cast<std::ptrdiff_t>((i + 1) * p.v));
      const auto o = oracle::logits_row(row, static_cast<std::size_t>(p.labels[i]), 0.8);
      olp[i] = static_cast<double>(o.log_prob), oent[i] = static_cast<double>(o.entropy);
    }
    policy_loss_inputs<double> in{tv(olp), tv(p.old), tv(p.adv), tv(p.mask), tv(p.ref), {}, tv(oent)};
    in.rollout_log_prob = tv(ro);
    const auto res = policy_loss(in, out(glp), out(gent), cfg);
    CHECK(std::fabs(loss - res.loss) < 1e-12);
    // The correction changed the loss: without it the value differs.
    auto plain = cfg;
    plain.rollout.reset();
    CHECK(std::fabs(fused_padded(p, p.x, plain, 0.8, nullptr) - loss) > 1e-6);
    double worst = 0;
    for (std::size_t k = 0; k < p.x.size(); k += 2) {
      auto xp = p.x, xm = p.x;
      const double h = 1e-5;
      xp[k] += h;
      xm[k] -= h;
      const double fd = (fused_padded(p, xp, cfg, 0.8, nullptr, nullptr, true, &ro) -
                         fused_padded(p, xm, cfg, 0.8, nullptr, nullptr, true, &ro)) /
                        (2 * h);
      INFO("logit " << k << " weighting " << static_cast<int>(rc.importance.weighting) << " level "
                    << static_cast<int>(rc.importance.level));
      CHECK(std::fabs(g[k] - fd) <= 1e-8 + 1e-5 * std::fabs(fd));
      worst = std::max(worst, std::fabs(g[k] - fd));
    }
    double gmax = 0;
    for (double v : g) gmax = std::max(gmax, std::fabs(v));
    std::printf(
        "  rollout correction (weighting %d, level %d): max |grad - finite difference| %.2g (max |grad| %.2g)\n",
        static_cast<int>(rc.importance.weighting), static_cast<int>(rc.importance.level), worst, gmax);
  }
}

TEST_CASE("policy_loss_from_logits: packed layout with float logits matches the padded double result") {
  std::mt19937_64 rng(seed + 2);
  auto p = make(rng);
  for (auto& x : p.x) x = static_cast<float>(x);  // the same values in both runs
  const auto cfg = ppo_config(p);
  std::vector<double> gpad;
  const double lpad = fused_padded(p, p.x, cfg, 1.0, &gpad);
  // Packed: only the valid tokens; offsets of the rows.
  std::vector<float> xf;
  std::vector<double> old, ref, adv, mask;
  std::vector<std::int64_t> labels, offsets{0}, flat;
  for (std::size_t b = 0; b < p.b; ++b) {
    for (std::size_t t = 0; t < p.t; ++t) {
      const std::size_t i = b * p.t + t;
      if (p.mask[i] == 0.0) continue;
      flat.push_back(static_cast<std::int64_t>(i));
      for (std::size_t j = 0; j < p.v; ++j) xf.push_back(static_cast<float>(p.x[i * p.v + j]));
      old.push_back(p.old[i]);
      ref.push_back(p.ref[i]);
      adv.push_back(p.adv[i]);
      mask.push_back(1.0);
      labels.push_back(p.labels[i]);
    }
    offsets.push_back(static_cast<std::int64_t>(old.size()));
  }
  const std::size_t n = old.size();
  const std::span<const std::int64_t> off(offsets);
  const auto tv = [&](const std::vector<double>& v) {
    return token_view<const double>::packed(vector_view<const double>(v.data(), n), off);
  };
  const auto out = [&](std::vector<double>& v) {
    return token_view<double>::packed(vector_view<double>(v.data(), n), off);
  };
  std::vector<double> lp(n), ent(n), glp(n), gent(n), lse(n);
  std::vector<float> g(n * p.v);
  const auto res = policy_loss_from_logits(
      matrix_view<const float>(xf.data(), n, p.v), std::span<const std::int64_t>(labels),
      policy_loss_inputs<double>{{}, tv(old), tv(adv), tv(mask), tv(ref)},
      logits_loss_buffers<double>{out(lp), out(ent), out(glp), out(gent), vector_view<double>(lse.data(), n)},
      matrix_view<float>(g.data(), n, p.v), cfg);
  CHECK(std::fabs(res.loss - lpad) < 1e-6 * std::max(1.0, std::fabs(lpad)));
  for (std::size_t k = 0; k < n; ++k)
    for (std::size_t j = 0; j < p.v; ++j)
      CHECK(std::fabs(g[k * p.v + j] - gpad[static_cast<std::size_t>(flat[k]) * p.v + j]) < 1e-7);
}

TEST_CASE("policy_loss_from_logits rejects bad input before writing the gradient") {
  std::mt19937_64 rng(seed + 3);
  auto p = make(rng);
  const auto cfg = ppo_config(p);
  std::vector<double> g;
  p.labels[4] = 11;
  CHECK_THROWS_WITH(fused_padded(p, p.x, cfg, 1.0, &g), Catch::Matchers::Contains("row 4"));
  p.labels[4] = 0;
  p.adv[2] = std::nan("");
  CHECK_THROWS_WITH(fused_padded(p, p.x, cfg, 1.0, &g), Catch::Matchers::Contains("advantages"));
  p.adv[2] = 0.5;
  auto x = p.x;
  x[3 * p.v + 1] = std::nan("");  // the logits' value scan names the entry
  CHECK_THROWS_WITH(fused_padded(p, x, cfg, 1.0, &g),
                    Catch::Matchers::Contains("'logits'[34] = nan") && Catch::Matchers::Contains("row 3, column 1"));
  // Without the logits' scan, token 3's log-prob becomes NaN and the policy loss names it.
  CHECK_THROWS_WITH(fused_padded(p, x, cfg, 1.0, &g, nullptr, false), Catch::Matchers::Contains("log_prob"));
  // Giving log_prob yourself is an error: it comes from the logits.
  const std::size_t n = p.b * p.t;
  std::vector<double> lp(n), ent(n), glp(n), gent(n), lse(n), gl(n * p.v, 7.0);
  const auto tv = [&](const std::vector<double>& v) {
    return token_view<const double>::padded(matrix_view<const double>(v.data(), p.b, p.t));
  };
  const auto out = [&](std::vector<double>& v) {
    return token_view<double>::padded(matrix_view<double>(v.data(), p.b, p.t));
  };
  CHECK_THROWS_WITH(
      policy_loss_from_logits(
          matrix_view<const double>(p.x.data(), n, p.v), std::span<const std::int64_t>(p.labels),
          policy_loss_inputs<double>{tv(p.old), tv(p.old), tv(p.adv), tv(p.mask), tv(p.ref)},
          logits_loss_buffers<double>{out(lp), out(ent), out(glp), out(gent), vector_view<double>(lse.data(), n)},
          matrix_view<double>(gl.data(), n, p.v), cfg),
      Catch::Matchers::Contains("computed from the logits"));
  CHECK_THROWS_WITH(
      policy_loss_from_logits(
          matrix_view<const double>(p.x.data(), n - 1, p.v), std::span<const std::int64_t>(p.labels.data(), n - 1),
          policy_loss_inputs<double>{{}, tv(p.old), tv(p.adv), tv(p.mask), tv(p.ref)},
          logits_loss_buffers<double>{out(lp), out(ent), out(glp), out(gent), vector_view<double>(lse.data(), n)},
          matrix_view<double>(gl.data(), n - 1, p.v), cfg),
      Catch::Matchers::Contains("rows"));
  CHECK(gl == std::vector<double>(n * p.v, 7.0));
}

TEST_CASE(
    "policy_loss_from_logits: the statistics hook sees every token's statistics and sets the mask the loss uses") {
  // The hook masks the valid tokens whose entropy is above the batch's mean (an entropy-based token
  // selection, computed from what the hook is given); the fused result must equal the fused call
  // with that mask given up front (no hook), and the statistics the hook saw the oracle's.
  std::mt19937_64 rng(seed + 3);
  const auto p = make(rng);
  auto cfg = ppo_config(p);
  cfg.entropy_coef = 0.0;  // the entropies are computed for the hook anyway (buf.entropy is given)
  const std::size_t n = p.b * p.t;
  const auto tv = [&](const std::vector<double>& v) {
    return token_view<const double>::padded(matrix_view<const double>(v.data(), p.b, p.t));
  };
  const auto out = [&](std::vector<double>& v) {
    return token_view<double>::padded(matrix_view<double>(v.data(), p.b, p.t));
  };
  std::vector<double> mask = p.mask;  // the caller's mask memory, written by the hook
  std::vector<double> lp(n), ent(n, -1.0), glp(n), lse(n), g(n * p.v), seen_lse(n), sq(n, -1.0), seen_sq(n);
  int calls = 0;
  const auto hook = [&](const token_statistics<double>& st) {
    ++calls;
    REQUIRE(st.entropy.size() == n);
    REQUIRE(st.sum_pi_squared.size() == n);
    for (std::size_t b = 0; b < p.b; ++b)
      for (std::size_t t = 0; t < p.t; ++t) seen_sq[b * p.t + t] = st.sum_pi_squared(b, t);
    double sum = 0, cnt = 0;
    for (std::size_t b = 0; b < p.b; ++b)
      for (std::size_t t = 0; t < p.t; ++t)
        if (p.mask[b * p.t + t] != 0) sum += st.entropy(b, t), cnt += 1;
    for (std::size_t b = 0; b < p.b; ++b)
      for (std::size_t t = 0; t < p.t; ++t)
        mask[b * p.t + t] = p.mask[b * p.t + t] != 0 && st.entropy(b, t) <= sum / cnt ? 1.0 : 0.0;
    for (std::size_t i = 0; i < n; ++i) seen_lse[i] = st.lse[i];
  };
  const policy_loss_inputs<double> in{
      .log_prob = {}, .old_log_prob = tv(p.old), .advantages = tv(p.adv), .mask = tv(mask), .ref_log_prob = tv(p.ref)};
  const logits_loss_buffers<double> buf{out(lp), out(ent), out(glp), {}, vector_view<double>(lse.data(), n), out(sq)};
  const auto res = policy_loss_from_logits(
      matrix_view<const double>(p.x.data(), n, p.v), std::span<const std::int64_t>(p.labels), in, buf,
      matrix_view<double>(g.data(), n, p.v), cfg, {.temperature = 0.8}, sequential_executor{}, hook);
  REQUIRE(calls == 1);
  double kept = 0, valid = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::vector<double> row(p.x.begin() + static_cast<std::ptrdiff_t>(i * p.v),
                                  p.x.begin() + static_cast<std::ptrdiff_t>((i + 1) * p.v));
    const auto o = oracle::logits_row(row, static_cast<std::size_t>(p.labels[i]), 0.8);
    CHECK(std::fabs(ent[i] - static_cast<double>(o.entropy)) < 1e-12);
    CHECK(std::fabs(seen_lse[i] - lse[i]) == 0.0);
    CHECK(std::fabs(sq[i] - static_cast<double>(oracle::sum_pi_squared(row, 0.8))) < 1e-12);
    CHECK(seen_sq[i] == sq[i]);
    kept += mask[i], valid += p.mask[i];
  }
  REQUIRE(kept > 0);
  REQUIRE(kept < valid);  // the hook's mask is not trivial
  REQUIRE(res.metrics.tokens == kept);
  // The same call with the hook's mask given up front.
  std::vector<double> lp2(n), glp2(n), lse2(n), g2(n * p.v);
  const policy_loss_inputs<double> in2{
      .log_prob = {}, .old_log_prob = tv(p.old), .advantages = tv(p.adv), .mask = tv(mask), .ref_log_prob = tv(p.ref)};
  const logits_loss_buffers<double> buf2{out(lp2), {}, out(glp2), {}, vector_view<double>(lse2.data(), n)};
  const auto res2 =
      policy_loss_from_logits(matrix_view<const double>(p.x.data(), n, p.v), std::span<const std::int64_t>(p.labels),
                              in2, buf2, matrix_view<double>(g2.data(), n, p.v), cfg, {.temperature = 0.8});
  REQUIRE(res.loss == res2.loss);
  REQUIRE(g == g2);
}

TEST_CASE("policy_loss_from_logits in float32 at tiny temperatures: d loss / d logits matches the oracle") {
  // float32 buffers hold lse ~ 1e6 (T = 1e-6) to +-0.06 and 1e30 (T = 1e-30) not at all: the
  // backward then anchors log p at the row's own maximum and sum (was 14% off, then inf).
  std::mt19937_64 rng(seed + 41);
  std::normal_distribution<double> nd;
  const std::size_t b = 2, t = 3, v = 7, n = b * t;
  for (double tau : {1e-6, 1e-12, 1e-20, 1e-30}) {
    std::vector<float> x(n * v), old(n), ref(n), adv(n), mask(n, 1.0f);
    for (std::size_t i = 0; i < n * v; ++i)  // scaled logits of order 1 on an offset of 1
      x[i] = static_cast<float>(1.0 + tau * 2 * nd(rng));
    for (std::size_t i = 0; i < n; ++i) x[i * v + i % v] = 1.0f;  // the maxima tie with x = 1
    std::vector<std::int64_t> labels(n);
    for (std::size_t i = 0; i < n; ++i) {
      labels[i] = static_cast<std::int64_t>(rng() % v);
      old[i] = static_cast<float>(-1.5 + 0.3 * nd(rng));
      ref[i] = static_cast<float>(-1.5 + 0.3 * nd(rng));
      adv[i] = static_cast<float>(nd(rng));
    }
    const auto tv = [&](const std::vector<float>& s) {
      return token_view<const float>::padded(matrix_view<const float>(s.data(), b, t));
    };
    std::vector<float> lp(n), ent(n), glp(n), gent(n), lse(n), g(n * v);
    const auto out = [&](std::vector<float>& s) {
      return token_view<float>::padded(matrix_view<float>(s.data(), b, t));
    };
    policy_loss_config cfg;
    cfg.kl.estimator = kl_estimator::k3;
    cfg.kl_coef = 0.1;
    cfg.entropy_coef = 0.01;
    cfg.normalizer = agg_normalizer{agg_mode::token_mean, static_cast<double>(n), 1.0};
    (void)policy_loss_from_logits(
        matrix_view<const float>(x.data(), n, v), std::span<const std::int64_t>(labels),
        policy_loss_inputs<float>{
            .log_prob = {}, .old_log_prob = tv(old), .advantages = tv(adv), .mask = tv(mask), .ref_log_prob = tv(ref)},
        logits_loss_buffers<float>{out(lp), out(ent), out(glp), out(gent), vector_view<float>(lse.data(), n)},
        matrix_view<float>(g.data(), n, v), cfg, {.temperature = tau});
    for (std::size_t i = 0; i < n; ++i) {
      const std::vector<double> row(x.begin() + static_cast<std::ptrdiff_t>(i * v),
                                    x.begin() + static_cast<std::ptrdiff_t>((i + 1) * v));
      const auto y = static_cast<std::size_t>(labels[i]);
      const auto ex = oracle::logits_row_grad(row, y, tau, glp[i], gent[i]);
      const auto sc = oracle::logits_row_grad_scale(row, y, tau, glp[i], gent[i]);
      const long double smax = *std::max_element(sc.begin(), sc.end());
      for (std::size_t j = 0; j < v; ++j) {
        INFO("tau " << tau << " token " << i << " column " << j << " got " << g[i * v + j] << " want "
                    << static_cast<double>(ex[j]));
        CHECK(std::fabs(g[i * v + j] - ex[j]) <= 1e-5L * smax);
      }
    }
  }
}
