// Tests of the policy-loss modes of verl 1dda039b and NeMo-RL 7ea279ab: objectives.hpp's
// penalized_pg; token_selection.hpp's dppo_weights / kl_cov_selection / clip_cov_weights with
// verl's dppo_tv / dppo_kl / dro / kl_cov / clip_cov presets; weighted_kl.hpp's weighted_kl_loss
// with NeMo-RL's reference KL; OpenRLHF's vLLM IS plan, NeMo-RL's ClippedPGLossFn pieces and the
// ProRL v2 / v2.1 presets. Each against a float64 oracle written here from the formulas of
// docs/presets/{verl,openrlhf,nemo_rl}.md, central finite differences of the loss for every new objective x KL estimator
// x aggregation mode, the partition property (two micro-batches with the global normaliser give the
// whole batch), and each rejection rule with outputs untouched.
#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/loss/rollout_correction.hpp>
#include <ulorl/loss/token_selection.hpp>
#include <ulorl/loss/weighted_kl.hpp>
#include <ulorl/presets/nemo_rl.hpp>
#include <ulorl/presets/openrlhf.hpp>
#include <ulorl/presets/verl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "support/absent_mask.hpp"

namespace {

namespace P = ulorl::presets;
using ulorl::agg_mode;
using ulorl::kl_estimator;

// ---- a random padded problem ------------------------------------------------------------------------

struct problem {
  std::size_t B, T;
  std::vector<double> lp, old, ref, adv, w, rollout;
  std::vector<double> mask;
};

problem random_problem(std::mt19937_64& rng, std::size_t B, std::size_t T, double spread = 1.2) {
  std::uniform_real_distribution<double> u(0, 1);
  problem p{B, T, {}, {}, {}, {}, {}, {}, {}};
  for (std::size_t i = 0; i < B * T; ++i) {
    p.old.push_back(-3 * u(rng) - 0.05);
    double x = (u(rng) - 0.5) * spread;
    if (std::fabs(x) < 1e-3) x = 2e-3;  // keep |x| and the penalties away from their kink at 0
    p.lp.push_back(p.old.back() + x);
    p.ref.push_back(p.lp.back() + (u(rng) - 0.5) * 0.8);
    p.adv.push_back((u(rng) - 0.5) * 3);
    p.w.push_back(0.5 + u(rng));
    p.rollout.push_back(p.old.back() + (u(rng) - 0.5) * 0.4);
    p.mask.push_back(u(rng) < 0.8 ? 1.0 : 0.0);
  }
  return p;
}

ulorl::token_view<const double> cview(const std::vector<double>& v, std::size_t B, std::size_t T,
                                      std::size_t row0 = 0) {
  return ulorl::padded(ulorl::matrix_view<const double>(v.data() + row0 * T, B, T));
}
ulorl::token_view<double> view(std::vector<double>& v, std::size_t B, std::size_t T, std::size_t row0 = 0) {
  return ulorl::padded(ulorl::matrix_view<double>(v.data() + row0 * T, B, T));
}

struct counts {
  double N = 0, S = 0;
  std::vector<double> n;
};
counts count(const problem& p) {
  counts c;
  for (std::size_t b = 0; b < p.B; ++b) {
    double nb = 0;
    for (std::size_t t = 0; t < p.T; ++t) nb += p.mask[b * p.T + t];
    c.n.push_back(nb), c.N += nb, c.S += nb > 0 ? 1 : 0;
  }
  return c;
}

//! The oracle's aggregation weight of row b (loss = Σ_b ω_b Σ_t L m).
double oracle_row_weight(agg_mode mode, const counts& c, std::size_t b, double constant) {
  switch (mode) {
    case agg_mode::token_mean:
      return 1.0 / c.N;
    case agg_mode::seq_mean_token_sum:
      return 1.0 / c.S;
    case agg_mode::seq_mean_token_mean:
      return c.n[b] > 0 ? 1.0 / (c.S * c.n[b]) : 0.0;
    case agg_mode::seq_mean_token_sum_norm:
    case agg_mode::constant:
      return 1.0 / constant;
  }
  return std::numeric_limits<double>::quiet_NaN();
}
ulorl::agg_normalizer normalizer_of(agg_mode mode, const counts& c, double constant) {
  ulorl::batch_counts g;
  g.tokens = c.N, g.sequences = c.S, g.rows = static_cast<double>(c.n.size());
  return ulorl::global_normalizer(mode, g, constant, 1.0);
}

//! The KL estimate of the reference, unclamped (kl.hpp's definitions, written again).
double oracle_kl(kl_estimator e, double lp, double ref) {
  const double u = ref - lp;
  switch (e) {
    case kl_estimator::k1:
      return -u;
    case kl_estimator::abs:
      return std::fabs(u);
    case kl_estimator::k2:
      return 0.5 * u * u;
    case kl_estimator::k3:
      return std::expm1(u) - u;
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// ---- penalized_pg (verl dro, kl_cov) ------------------------------------------------------------------

struct penalty_case {
  ulorl::pg_surrogate surrogate;
  double abs_penalty, square_penalty;
};

double oracle_penalized(const problem& p, const std::vector<double>& lp, const penalty_case& pc,
                        std::optional<kl_estimator> kl, double beta, bool weighted, agg_mode mode, double constant) {
  const counts c = count(p);
  double loss = 0;
  for (std::size_t b = 0; b < p.B; ++b)
    for (std::size_t t = 0; t < p.T; ++t) {
      const std::size_t i = b * p.T + t;
      if (p.mask[i] == 0) continue;
      const double x = lp[i] - p.old[i];
      const double g = pc.surrogate == ulorl::pg_surrogate::ratio ? std::exp(x) : lp[i];
      const double obj = -p.adv[i] * g + pc.abs_penalty * std::fabs(x) + pc.square_penalty * x * x / 2;
      double term = (weighted ? p.w[i] : 1.0) * obj;
      if (kl) term += beta * oracle_kl(*kl, lp[i], p.ref[i]);
      loss += oracle_row_weight(mode, c, b, constant) * term;
    }
  return loss;
}

struct lib_out {
  ulorl::policy_loss_result res;
  std::vector<double> grad;
};
lib_out run_lib(const problem& p, const std::vector<double>& lp, const ulorl::policy_loss_config& cfg, bool weighted,
                const std::vector<double>* weights = nullptr) {
  lib_out o;
  o.grad.assign(p.B * p.T, -99.0);
  ulorl::policy_loss_inputs<double, double> in{cview(lp, p.B, p.T), cview(p.old, p.B, p.T), cview(p.adv, p.B, p.T),
                                               cview(p.mask, p.B, p.T), cview(p.ref, p.B, p.T)};
  if (weighted) in.weights = cview(weights ? *weights : p.w, p.B, p.T);
  o.res = ulorl::policy_loss(in, view(o.grad, p.B, p.T), cfg);
  return o;
}

const agg_mode modes[] = {agg_mode::token_mean, agg_mode::seq_mean_token_sum, agg_mode::seq_mean_token_mean,
                          agg_mode::seq_mean_token_sum_norm};

TEST_CASE("penalized_pg (dro, kl_cov forms): float64 oracle and finite differences x KL estimator x aggregation") {
  const std::uint64_t seed = 20250901;
  std::printf("test_loss_policy_modes penalized_pg seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const penalty_case cases[] = {{ulorl::pg_surrogate::log_prob, 0.0, 0.3},  // dro, beta 0.3
                                {ulorl::pg_surrogate::ratio, 0.1, 0.0},     // kl_cov, selected tokens
                                {ulorl::pg_surrogate::ratio, 0.0, 0.0}};    // kl_cov, the other tokens
  const std::optional<kl_estimator> estimators[] = {std::nullopt, kl_estimator::k1, kl_estimator::abs, kl_estimator::k2,
                                                    kl_estimator::k3};
  int checked = 0;
  for (const auto& pc : cases)
    for (const auto& est : estimators)
      for (const agg_mode mode : modes)
        for (int trial = 0; trial < 2; ++trial) {
          const problem p =
              random_problem(rng, 3 + static_cast<std::size_t>(trial), 7 + 2 * static_cast<std::size_t>(trial));
          const counts c = count(p);
          if (c.N == 0) continue;
          const bool weighted = trial == 1;
          const double constant = static_cast<double>(p.T) * 1.5, beta = 0.05;
          ulorl::policy_loss_config cfg;
          cfg.objective = {.kind = ulorl::objective_kind::penalized_pg, .log_ratio_clamp = ulorl::no_limit};
          cfg.objective.penalized_pg.surrogate = pc.surrogate, cfg.objective.penalized_pg.abs_penalty = pc.abs_penalty;
          cfg.objective.penalized_pg.square_penalty = pc.square_penalty;
          if (est) {
            cfg.kl = {.estimator = *est};
            cfg.kl_coef = beta;
          }
          cfg.normalizer = normalizer_of(mode, c, constant);
          const auto out = run_lib(p, p.lp, cfg, weighted);
          const double want = oracle_penalized(p, p.lp, pc, est, beta, weighted, mode, constant);
          REQUIRE(out.res.loss == Approx(want).epsilon(1e-12).margin(1e-14));
          for (std::size_t i = 0; i < p.lp.size(); ++i) {
            if (p.mask[i] == 0) {
              REQUIRE(out.grad[i] == 0.0);
              continue;
            }
            std::vector<double> hi = p.lp, lo = p.lp;
            const double h = 1e-6;
            hi[i] += h, lo[i] -= h;
            const double fd = (oracle_penalized(p, hi, pc, est, beta, weighted, mode, constant) -
                               oracle_penalized(p, lo, pc, est, beta, weighted, mode, constant)) /
                              (2 * h);
            REQUIRE(out.grad[i] == Approx(fd).epsilon(1e-6).margin(1e-8));
            // The library's own loss, differenced, agrees too.
            const double fl =
                (run_lib(p, hi, cfg, weighted).res.loss - run_lib(p, lo, cfg, weighted).res.loss) / (2 * h);
            REQUIRE(out.grad[i] == Approx(fl).epsilon(1e-5).margin(1e-8));
            ++checked;
          }
        }
  REQUIRE(checked > 500);
}

TEST_CASE("verl dro: two micro-batches with the global normaliser give the whole batch") {
  std::mt19937_64 rng(777);
  using K = P::verl::loss_mode_kind;
  for (const agg_mode mode : modes)
    for (int trial = 0; trial < 3; ++trial) {
      const problem p = random_problem(rng, 5, 6 + static_cast<std::size_t>(trial));
      const counts c = count(p);
      ulorl::policy_loss_config cfg;
      cfg.objective = P::verl::objective({.loss_mode = K::dro, .dro_beta = 0.4});
      cfg.normalizer = normalizer_of(mode, c, 9.0);
      const bool weighted = trial != 0;
      const auto whole = run_lib(p, p.lp, cfg, weighted);
      double parts = 0;
      std::vector<double> g(p.lp.size(), 0.0);
      for (const std::size_t r0 : {std::size_t{0}, std::size_t{2}}) {
        const std::size_t rows = r0 == 0 ? 2 : p.B - 2;
        ulorl::policy_loss_inputs<double, double> in{cview(p.lp, rows, p.T, r0), cview(p.old, rows, p.T, r0),
                                                     cview(p.adv, rows, p.T, r0), cview(p.mask, rows, p.T, r0)};
        if (weighted) in.weights = cview(p.w, rows, p.T, r0);
        parts += ulorl::policy_loss(in, view(g, rows, p.T, r0), cfg).pg_loss;
      }
      REQUIRE(parts == Approx(whole.res.pg_loss).epsilon(1e-12).margin(1e-15));
      for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(g[i] == Approx(whole.grad[i]).epsilon(1e-13).margin(1e-16));
      const auto m = P::verl::metrics(K::dro, whole.res.metrics);
      double nlr = 0;
      for (std::size_t i = 0; i < p.lp.size(); ++i) nlr += p.mask[i] * (p.old[i] - p.lp[i]);
      REQUIRE(m.ppo_kl == Approx(nlr / c.N).epsilon(1e-12));
    }
}

TEST_CASE("penalized_pg: per-token form, float, metrics and the registry") {
  ulorl::policy_loss_config cfg;
  cfg.objective = {.kind = ulorl::objective_kind::penalized_pg, .log_ratio_clamp = ulorl::no_limit};
  cfg.objective.penalized_pg.surrogate = ulorl::pg_surrogate::log_prob, cfg.objective.penalized_pg.square_penalty = 0.5;
  const auto t = ulorl::policy_token_loss(-1.0, -1.2, 0.0, 0.7, 1.0, 0.0, ulorl::make_token_loss_params<double>(cfg));
  const double x = 0.2;
  REQUIRE(t.pg == Approx(-(-1.0 * 0.7 - 0.5 * x * x / 2)).epsilon(1e-14));
  REQUIRE(t.dlogp == Approx(-(0.7 - 0.5 * x)).epsilon(1e-14));
  // float agrees with double.
  const auto tf =
      ulorl::policy_token_loss(-1.0f, -1.2f, 0.0f, 0.7f, 1.0f, 0.0f, ulorl::make_token_loss_params<float>(cfg));
  REQUIRE(static_cast<double>(tf.pg) == Approx(t.pg).epsilon(1e-6));
  REQUIRE(static_cast<double>(tf.dlogp) == Approx(t.dlogp).epsilon(1e-6));
  // sign(0) = 0: at x = 0 the |x| penalty passes no gradient.
  cfg.objective.penalized_pg.surrogate = ulorl::pg_surrogate::ratio, cfg.objective.penalized_pg.square_penalty = 0,
  cfg.objective.penalized_pg.abs_penalty = 0.3;
  const auto z = ulorl::policy_token_loss(-1.0, -1.0, 0.0, 0.5, 1.0, 0.0, ulorl::make_token_loss_params<double>(cfg));
  REQUIRE(z.pg == Approx(-0.5));
  REQUIRE(z.dlogp == Approx(-0.5));
}

// ---- verl presets: dro, kl_cov -------------------------------------------------------------------------

TEST_CASE("verl dro and kl_cov presets map to penalized_pg") {
  using K = P::verl::loss_mode_kind;
  REQUIRE(P::verl::loss_mode_from_name("dro") == K::dro);
  REQUIRE(P::verl::loss_mode_from_name("dppo_tv") == K::dppo_tv);
  REQUIRE(P::verl::loss_mode_from_name("dppo_kl") == K::dppo_kl);
  REQUIRE(P::verl::loss_mode_from_name("kl_cov") == K::kl_cov);
  REQUIRE(P::verl::loss_mode_from_name("clip_cov") == K::clip_cov);
  REQUIRE_THROWS_AS(P::verl::loss_mode_from_name("klcov"), ulorl::error);
  const auto dro = P::verl::objective({.loss_mode = K::dro, .dro_beta = 0.1});
  REQUIRE(dro.kind == ulorl::objective_kind::penalized_pg);
  REQUIRE(dro.penalized_pg.surrogate == ulorl::pg_surrogate::log_prob);
  REQUIRE(dro.penalized_pg.square_penalty == 0.1);
  REQUIRE(dro.log_ratio_clamp == ulorl::no_limit);
  const auto klc = P::verl::objective({.loss_mode = K::kl_cov, .ppo_kl_coef = 0.25});
  REQUIRE(klc.kind == ulorl::objective_kind::penalized_pg);
  REQUIRE(klc.penalized_pg.surrogate == ulorl::pg_surrogate::ratio);
  REQUIRE(klc.penalized_pg.abs_penalty == 0.25);
  const auto cc = P::verl::objective({.loss_mode = K::clip_cov});
  REQUIRE(cc.kind == ulorl::objective_kind::ppo_clip);
  REQUIRE(cc.dual_clip == 0.0);
  REQUIRE(P::verl::objective({.loss_mode = K::dppo_tv}).kind == ulorl::objective_kind::policy_gradient);
  // Rejections.
  REQUIRE_THROWS_AS(P::verl::objective({.loss_mode = K::dro}), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::objective({.loss_mode = K::dro, .dro_beta = 0.0}), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::objective({.loss_mode = K::dro, .dro_beta = -1.0}), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::objective({.loss_mode = K::dro, .dro_beta = std::nan("")}), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::objective({.loss_mode = K::kl_cov, .kl_cov_ratio = 0.0}), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::objective({.loss_mode = K::kl_cov, .ppo_kl_coef = -0.1}), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::objective({.loss_mode = K::clip_cov, .clip_cov_ratio = -1.0}), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::objective({.loss_mode = K::dppo_kl, .clip_ratio_c = 0.0}), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::objective({.loss_mode = static_cast<K>(99)}), ulorl::error);
  REQUIRE_THROWS_AS(P::verl::metrics(static_cast<K>(99), ulorl::loss_metrics{}), ulorl::error);
}

TEST_CASE("penalized_pg: bad parameters are rejected before anything is written") {
  std::mt19937_64 rng(7);
  const problem p = random_problem(rng, 2, 5);
  const counts c = count(p);
  for (int which = 0; which < 5; ++which) {
    ulorl::policy_loss_config cfg;
    cfg.objective = {.kind = ulorl::objective_kind::penalized_pg, .log_ratio_clamp = ulorl::no_limit};
    if (which == 0) cfg.objective.penalized_pg.abs_penalty = -0.1;
    if (which == 1) cfg.objective.penalized_pg.square_penalty = std::numeric_limits<double>::infinity();
    if (which == 2) cfg.objective.penalized_pg.surrogate = static_cast<ulorl::pg_surrogate>(5);
    if (which == 3) cfg.objective.penalized_pg.square_penalty = std::nan("");
    if (which == 4) cfg.objective.eps_low = 1.5;
    cfg.normalizer = normalizer_of(agg_mode::token_mean, c, 0);
    std::vector<double> g(p.B * p.T, -42.0);
    ulorl::policy_loss_inputs<double, double> in{cview(p.lp, p.B, p.T), cview(p.old, p.B, p.T), cview(p.adv, p.B, p.T),
                                                 cview(p.mask, p.B, p.T)};
    REQUIRE_THROWS_AS(ulorl::policy_loss(in, view(g, p.B, p.T), cfg), ulorl::error);
    REQUIRE(std::all_of(g.begin(), g.end(), [](double v) { return v == -42.0; }));
  }
}

// ---- kl_cov selection -------------------------------------------------------------------------------

std::vector<double> oracle_kl_cov_selection(const problem& p, double ratio) {
  std::vector<std::size_t> valid;
  double sa = 0, sl = 0;
  for (std::size_t i = 0; i < p.lp.size(); ++i)
    if (p.mask[i] != 0) valid.push_back(i), sa += p.adv[i], sl += p.lp[i];
  std::vector<double> sel(p.lp.size(), 0.0);
  if (valid.empty()) return sel;
  const double n = static_cast<double>(valid.size());
  std::vector<std::pair<double, std::size_t>> cov;
  for (const auto i : valid) cov.push_back({-(p.adv[i] - sa / n) * (p.lp[i] - sl / n), i});
  std::sort(cov.begin(), cov.end());
  const std::size_t k =
      std::min(valid.size(), std::max<std::size_t>(1, static_cast<std::size_t>(std::floor(n * ratio))));
  for (std::size_t j = 0; j < k; ++j) sel[cov[j].second] = 1.0;
  return sel;
}

TEST_CASE("verl kl_cov: the selection, the two-part loss and its partition property") {
  std::mt19937_64 rng(99);
  using K = P::verl::loss_mode_kind;
  for (int trial = 0; trial < 6; ++trial) {
    const problem p = random_problem(rng, 4, 9);
    const counts c = count(p);
    const double ratio = 0.05 + 0.1 * trial;
    const P::verl::objective_options oo{.loss_mode = K::kl_cov, .kl_cov_ratio = ratio, .ppo_kl_coef = 0.2};
    std::vector<double> sel(p.lp.size(), -1.0);
    const auto st = ulorl::kl_cov_selection(cview(p.old, p.B, p.T), cview(p.lp, p.B, p.T), cview(p.adv, p.B, p.T),
                                            cview(p.mask, p.B, p.T), view(sel, p.B, p.T), P::verl::kl_cov(oo));
    REQUIRE(sel == oracle_kl_cov_selection(p, ratio));
    double sx = 0;
    for (std::size_t i = 0; i < p.lp.size(); ++i) sx += p.mask[i] * std::fabs(p.lp[i] - p.old[i]);
    REQUIRE(st.mean_abs_log_ratio == Approx(sx / c.N).epsilon(1e-13));
    // Loss of the two calls == the oracle ℓ = (-A r + sel κ |x|) w.
    for (const agg_mode mode : modes) {
      ulorl::policy_loss_config cfg;
      cfg.objective = P::verl::objective(oo);
      cfg.normalizer = normalizer_of(mode, c, 11.0);
      ulorl::policy_loss_config rest = cfg;
      rest.objective.penalized_pg.abs_penalty = 0;
      std::vector<double> ws(p.lp.size()), wr(p.lp.size());
      for (std::size_t i = 0; i < p.lp.size(); ++i) ws[i] = p.w[i] * sel[i], wr[i] = p.w[i] * (1 - sel[i]);
      const auto a = run_lib(p, p.lp, cfg, true, &ws), b = run_lib(p, p.lp, rest, true, &wr);
      double want = 0;
      for (std::size_t bb = 0; bb < p.B; ++bb)
        for (std::size_t t = 0; t < p.T; ++t) {
          const std::size_t i = bb * p.T + t;
          if (p.mask[i] == 0) continue;
          const double x = p.lp[i] - p.old[i];
          want +=
              oracle_row_weight(mode, c, bb, 11.0) * (-p.adv[i] * std::exp(x) + sel[i] * 0.2 * std::fabs(x)) * p.w[i];
        }
      REQUIRE(a.res.pg_loss + b.res.pg_loss == Approx(want).epsilon(1e-12));
      // Partition: rows [0, 2) and [2, 4) with the global normaliser.
      double parts = 0;
      std::vector<double> g_parts;
      for (std::size_t r0 : {std::size_t{0}, std::size_t{2}}) {
        for (const auto* cw : {&cfg, &rest}) {
          const auto& wv = cw == &cfg ? ws : wr;
          std::vector<double> g(2 * p.T, 0.0);
          ulorl::policy_loss_inputs<double, double> in{cview(p.lp, 2, p.T, r0), cview(p.old, 2, p.T, r0),
                                                       cview(p.adv, 2, p.T, r0), cview(p.mask, 2, p.T, r0)};
          in.weights = cview(wv, 2, p.T, r0);
          parts += ulorl::policy_loss(in, view(g, 2, p.T), *cw).pg_loss;
        }
      }
      REQUIRE(parts == Approx(want).epsilon(1e-12));
    }
  }
}

// ---- DPPO ---------------------------------------------------------------------------------------------

TEST_CASE("verl dppo_tv / dppo_kl: weights, loss, metrics against the oracle; partition; rejections") {
  std::mt19937_64 rng(2026);
  using K = P::verl::loss_mode_kind;
  for (const K mode : {K::dppo_tv, K::dppo_kl})
    for (int trial = 0; trial < 4; ++trial) {
      const problem p = random_problem(rng, 4, 8, 2.0);
      const counts c = count(p);
      const double dl = 0.03 + 0.02 * trial, dh = 0.05, cap = trial == 0 ? 1.3 : 3.0;
      const P::verl::objective_options oo{
          .loss_mode = mode, .clip_ratio_low = dl, .clip_ratio_high = dh, .clip_ratio_c = cap};
      std::vector<double> w(p.lp.size(), -5.0);
      const bool with_rollout_w = trial % 2 == 1;
      const auto st = ulorl::dppo_weights(cview(p.old, p.B, p.T), cview(p.lp, p.B, p.T), cview(p.adv, p.B, p.T),
                                          cview(p.mask, p.B, p.T),
                                          with_rollout_w ? cview(p.w, p.B, p.T) : ulorl::token_view<const double>{},
                                          view(w, p.B, p.T), P::verl::dppo(oo));
      double outside = 0, capped = 0, want = 0;
      std::vector<double> want_grad(p.lp.size(), 0.0);
      for (std::size_t b = 0; b < p.B; ++b)
        for (std::size_t t = 0; t < p.T; ++t) {
          const std::size_t i = b * p.T + t;
          const double lp = p.lp[i], old = p.old[i], A = p.adv[i];
          const double r = std::exp(std::min(20.0, std::max(-20.0, lp - old)));
          const double pr = std::exp(lp), p0 = std::exp(old);
          bool v;
          if (mode == K::dppo_tv) {
            v = A > 0 ? (pr - p0 <= dh) : (pr - p0 >= -dl);
          } else {
            const double D = p0 * (old - lp) + (1 - p0) * std::log((1 - p0 + 1e-8) / (1 - pr + 1e-8));
            v = A > 0 ? (D <= dh || pr <= p0) : (D <= dl || pr >= p0);
          }
          const double wi = (with_rollout_w ? p.w[i] : 1.0) * std::min(r, cap) * (v ? 1.0 : 0.0);
          REQUIRE(w[i] == Approx(wi).epsilon(1e-13).margin(1e-300));
          if (p.mask[i] == 0) continue;
          outside += v ? 0 : 1, capped += (r > cap && v) ? 1 : 0;
          want += -A * wi * lp / c.N;
          want_grad[i] = -A * wi / c.N;
        }
      REQUIRE(st.dropped_fraction == Approx(outside / c.N));
      REQUIRE(st.capped_fraction == Approx(capped / c.N));
      ulorl::policy_loss_config cfg;
      cfg.objective = P::verl::objective(oo);
      cfg.normalizer = normalizer_of(agg_mode::token_mean, c, 0);
      const auto out = run_lib(p, p.lp, cfg, true, &w);
      REQUIRE(out.res.pg_loss == Approx(want).epsilon(1e-12).margin(1e-15));
      for (std::size_t i = 0; i < p.lp.size(); ++i)
        REQUIRE(out.grad[i] == Approx(want_grad[i]).epsilon(1e-12).margin(1e-15));
      const auto m = P::verl::metrics(mode, out.res.metrics, st);
      REQUIRE(m.pg_clipfrac == st.dropped_fraction);
      REQUIRE(m.pg_clipfrac_lower == st.capped_fraction);
      // Partition over rows with the global normaliser.
      double parts = 0;
      for (std::size_t r0 : {std::size_t{0}, std::size_t{1}}) {
        const std::size_t rows = r0 == 0 ? 1 : p.B - 1;
        std::vector<double> g(rows * p.T);
        ulorl::policy_loss_inputs<double, double> in{cview(p.lp, rows, p.T, r0), cview(p.old, rows, p.T, r0),
                                                     cview(p.adv, rows, p.T, r0), cview(p.mask, rows, p.T, r0)};
        in.weights = cview(w, rows, p.T, r0);
        parts += ulorl::policy_loss(in, view(g, rows, p.T), cfg).pg_loss;
      }
      REQUIRE(parts == Approx(out.res.pg_loss).epsilon(1e-12).margin(1e-15));
    }
  // Rejections, weights untouched.
  std::mt19937_64 r2(5);
  problem p = random_problem(r2, 2, 4);
  std::vector<double> w(p.lp.size(), -7.0);
  auto call = [&](const ulorl::dppo_config& c) {
    return ulorl::dppo_weights(cview(p.old, p.B, p.T), cview(p.lp, p.B, p.T), cview(p.adv, p.B, p.T),
                               cview(p.mask, p.B, p.T), ulorl::token_view<const double>{}, view(w, p.B, p.T), c);
  };
  // verl's options are checked under verl's names by the mapping, the configuration by dppo_weights.
  const auto verl_arg = [](const P::verl::objective_options& oo) {
    try {
      (void)P::verl::dppo(oo);
    } catch (const ulorl::error& e) {
      return std::string(e.argument());
    }
    return std::string();
  };
  CHECK(verl_arg({.loss_mode = K::dppo_tv, .clip_ratio_low = -0.1}) == "clip_ratio_low");
  CHECK(verl_arg({.loss_mode = K::dppo_kl, .clip_ratio_high = std::nan("")}) == "clip_ratio_high");
  CHECK(verl_arg({.loss_mode = K::vanilla}) == "loss_mode");
  CHECK(verl_arg({.loss_mode = K::dppo_tv, .clip_ratio_c = -1.0}) == "clip_ratio_c");
  const ulorl::dppo_config ok = P::verl::dppo({.loss_mode = K::dppo_tv});
  REQUIRE(ok.divergence == ulorl::dppo_divergence::total_variation);
  REQUIRE((ok.delta_low == 0.2 && ok.delta_high == 0.2 && ok.ratio_cap == 3.0));
  REQUIRE(P::verl::dppo({.loss_mode = K::dppo_kl}).divergence == ulorl::dppo_divergence::binary_kl);
  REQUIRE_THROWS_AS(call({.delta_low = -0.1, .delta_high = 0.2}), ulorl::error);
  REQUIRE_THROWS_AS(call({.divergence = ulorl::dppo_divergence::binary_kl, .delta_high = std::nan("")}), ulorl::error);
  REQUIRE_THROWS_AS(call({.divergence = static_cast<ulorl::dppo_divergence>(7)}), ulorl::error);
  REQUIRE_THROWS_AS(call({.ratio_cap = -1.0}), ulorl::error);
  try {
    (void)call({.ratio_cap = 0.0});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "dppo_weights");
    CHECK(e.argument() == "ratio_cap");
  }
  p.mask[1] = 2.0;
  REQUIRE_THROWS_AS(call(ok), ulorl::error);
  p.mask[1] = 1.0, p.lp[2] = std::numeric_limits<double>::infinity();
  REQUIRE_THROWS_AS(call(ok), ulorl::error);
  REQUIRE(std::all_of(w.begin(), w.end(), [](double v) { return v == -7.0; }));
}

// ---- clip_cov ---------------------------------------------------------------------------------------

TEST_CASE("verl clip_cov: candidate check, weights, loss against the oracle; partition; rejections") {
  std::mt19937_64 rng(31337);
  using K = P::verl::loss_mode_kind;
  int runs = 0;
  for (int trial = 0; trial < 12 && runs < 5; ++trial) {
    const problem p = random_problem(rng, 4, 10);
    const counts c = count(p);
    const P::verl::objective_options oo{.loss_mode = K::clip_cov,
                                        .clip_ratio_low = 0.2,
                                        .clip_ratio_high = 0.28,
                                        .clip_cov_ratio = 0.1,
                                        .clip_cov_lb = 0.0,
                                        .clip_cov_ub = 5.0};
    // The oracle's candidates.
    double sa = 0, sl = 0;
    for (std::size_t i = 0; i < p.lp.size(); ++i) sa += p.mask[i] * p.adv[i], sl += p.mask[i] * p.lp[i];
    std::vector<std::size_t> cand;
    for (std::size_t i = 0; i < p.lp.size(); ++i) {
      const double r = std::exp(p.lp[i] - p.old[i]), A = p.adv[i];
      const double cov = (A - sa / c.N) * (p.lp[i] - sl / c.N);
      const bool clipped = -A * std::clamp(r, 0.8, 1.28) > -A * r;
      if (p.mask[i] != 0 && !clipped && 0.0 < cov && cov < 5.0) cand.push_back(i);
    }
    const std::size_t want_n =
        std::min<std::size_t>(cand.size(), std::max<std::size_t>(1, static_cast<std::size_t>(std::floor(0.1 * c.N))));
    if (cand.size() < want_n + 1) continue;
    ++runs;
    std::shuffle(cand.begin(), cand.end(), rng);
    std::vector<double> sel(p.lp.size(), 0.0);
    for (std::size_t j = 0; j < want_n; ++j) sel[cand[j]] = 1.0;
    std::vector<double> w(p.lp.size(), -3.0);
    const auto st = ulorl::clip_cov_weights(cview(p.old, p.B, p.T), cview(p.lp, p.B, p.T), cview(p.adv, p.B, p.T),
                                            cview(p.mask, p.B, p.T), cview(sel, p.B, p.T), cview(p.w, p.B, p.T),
                                            view(w, p.B, p.T), P::verl::clip_cov(oo));
    REQUIRE(st.dropped_fraction == Approx(static_cast<double>(want_n) / c.N));
    for (const agg_mode mode : modes) {
      ulorl::policy_loss_config cfg;
      cfg.objective = P::verl::objective(oo);
      cfg.normalizer = normalizer_of(mode, c, 13.0);
      const auto out = run_lib(p, p.lp, cfg, true, &w);
      double want = 0;
      for (std::size_t b = 0; b < p.B; ++b)
        for (std::size_t t = 0; t < p.T; ++t) {
          const std::size_t i = b * p.T + t;
          if (p.mask[i] == 0) continue;
          const double r = std::exp(p.lp[i] - p.old[i]), A = p.adv[i];
          const double l1 = -A * r, l2 = -A * std::clamp(r, 0.8, 1.28);
          want += oracle_row_weight(mode, c, b, 13.0) * std::max(l1, l2) * (1 - sel[i]) * p.w[i];
          const double d = l1 >= l2 ? -A * r : 0.0;  // unclipped branch (ties: both branches equal here)
          REQUIRE(out.grad[i] ==
                  Approx(oracle_row_weight(mode, c, b, 13.0) * d * (1 - sel[i]) * p.w[i]).epsilon(1e-12).margin(1e-15));
        }
      REQUIRE(out.res.pg_loss == Approx(want).epsilon(1e-12));
      double parts = 0;
      for (std::size_t r0 : {std::size_t{0}, std::size_t{3}}) {
        const std::size_t rows = r0 == 0 ? 3 : 1;
        std::vector<double> g(rows * p.T);
        ulorl::policy_loss_inputs<double, double> in{cview(p.lp, rows, p.T, r0), cview(p.old, rows, p.T, r0),
                                                     cview(p.adv, rows, p.T, r0), cview(p.mask, rows, p.T, r0)};
        in.weights = cview(w, rows, p.T, r0);
        parts += ulorl::policy_loss(in, view(g, rows, p.T), cfg).pg_loss;
      }
      REQUIRE(parts == Approx(want).epsilon(1e-12));
    }
    // Rejections: one too few, a non-candidate, a value 2, a wrong shape; weights untouched.
    std::vector<double> w2(p.lp.size(), -3.0);
    auto call = [&](const std::vector<double>& s, std::size_t rows) {
      return ulorl::clip_cov_weights(cview(p.old, p.B, p.T), cview(p.lp, p.B, p.T), cview(p.adv, p.B, p.T),
                                     cview(p.mask, p.B, p.T), cview(s, rows, p.T), ulorl::token_view<const double>{},
                                     view(w2, p.B, p.T), P::verl::clip_cov(oo));
    };
    std::vector<double> bad = sel;
    bad[cand[0]] = 0.0;
    REQUIRE_THROWS_AS(call(bad, p.B), ulorl::error);
    bad = sel;
    for (std::size_t i = 0; i < p.lp.size(); ++i)
      if (std::find(cand.begin(), cand.end(), i) == cand.end()) {
        bad[cand[0]] = 0.0, bad[i] = 1.0;
        break;
      }
    REQUIRE_THROWS_AS(call(bad, p.B), ulorl::error);
    bad = sel, bad[cand[0]] = 2.0;
    REQUIRE_THROWS_AS(call(bad, p.B), ulorl::error);
    REQUIRE_THROWS_AS(call(sel, p.B - 1), ulorl::error);
    REQUIRE(std::all_of(w2.begin(), w2.end(), [](double v) { return v == -3.0; }));
  }
  REQUIRE(runs >= 3);
}

// ---- OpenRLHF vLLM IS ------------------------------------------------------------------------------

TEST_CASE("openrlhf vllm_is_correction plan") {
  using PK = P::openrlhf::policy_loss_kind;
  const auto off = P::openrlhf::vllm_is_correction({.policy_loss_type = PK::ppo});
  REQUIRE(!off.weights);
  REQUIRE(!off.ratio_against_rollout);
  const auto ppo = P::openrlhf::vllm_is_correction({.policy_loss_type = PK::ppo, .enable_vllm_is_correction = true});
  REQUIRE(ppo.weights);
  REQUIRE(!ppo.ratio_against_rollout);
  const auto gspo = P::openrlhf::vllm_is_correction({.policy_loss_type = PK::gspo, .enable_vllm_is_correction = true});
  REQUIRE(!gspo.weights);
  REQUIRE(gspo.ratio_against_rollout);
  REQUIRE_THROWS_AS(P::openrlhf::vllm_is_correction({.policy_loss_type = static_cast<PK>(9)}), ulorl::error);
}

// ---- NeMo-RL ------------------------------------------------------------------------------------------

//! NeMo-RL's K of one token (value) from its definition; the gradient by finite differences.
double oracle_nemo_k(kl_estimator e, double lp, double ref, double rollout, bool on_policy, double in, double out) {
  const double lam = std::clamp(ref - lp, -in, in);
  double kappa = 0;
  if (e == kl_estimator::k1)
    kappa = -lam;
  else if (e == kl_estimator::k2)
    kappa = lam * lam / 2;
  else
    kappa = std::exp(lam) - 1 - lam;
  const double omega = on_policy ? std::exp(lp - rollout) : 1.0;
  return std::clamp(omega * kappa, -out, out);
}

TEST_CASE(
    "weighted_kl_loss with nemo_rl's reference KL: value and gradient (incl. the weight's derivative) against the "
    "oracle") {
  std::mt19937_64 rng(4242);
  int fd_checked = 0;
  for (const kl_estimator e : {kl_estimator::k1, kl_estimator::k2, kl_estimator::k3})
    for (const bool on_policy : {false, true})
      for (const bool token_level : {true, false})
        for (int clamps = 0; clamps < 2; ++clamps) {
          problem p = random_problem(rng, 3, 6);
          const counts c = count(p);
          const double in = clamps ? 0.25 : 20.0, out = clamps ? 0.03 : 10.0;
          P::nemo_rl::clipped_pg_loss_options o{.token_level_loss = token_level,
                                                .reference_policy_kl_penalty = 0.3,
                                                .reference_policy_kl_type = e,
                                                .kl_input_clamp_value = in,
                                                .kl_output_clamp_value = out};
          o.use_on_policy_kl_approximation = on_policy;
          const auto norm = P::nemo_rl::normalizer(o, {}, ulorl::count_batch(cview(p.mask, p.B, p.T)));
          auto value = [&](const std::vector<double>& lp) {
            double s = 0;
            for (std::size_t b = 0; b < p.B; ++b)
              for (std::size_t t = 0; t < p.T; ++t) {
                const std::size_t i = b * p.T + t;
                if (p.mask[i] == 0) continue;
                const double wb = token_level ? 1.0 / c.N : 1.0 / (static_cast<double>(p.B) * c.n[b]);
                s += wb * oracle_nemo_k(e, lp[i], p.ref[i], p.rollout[i], on_policy, in, out);
              }
            return 0.3 * s;
          };
          std::vector<double> g(p.lp.size(), 0.5);
          const double kl = ulorl::weighted_kl_loss(cview(p.lp, p.B, p.T), cview(p.ref, p.B, p.T),
                                                    cview(p.rollout, p.B, p.T), cview(p.mask, p.B, p.T),
                                                    view(g, p.B, p.T), P::nemo_rl::reference_policy_kl(o), norm);
          REQUIRE(kl == Approx(value(p.lp)).epsilon(1e-12).margin(1e-15));
          for (std::size_t i = 0; i < p.lp.size(); ++i) {
            if (p.mask[i] == 0) {
              REQUIRE(g[i] == 0.5);
              continue;
            }
            // Skip tokens within 1e-4 of a clamp's edge (the derivative jumps there).
            const double u = p.ref[i] - p.lp[i];
            const double omega = on_policy ? std::exp(p.lp[i] - p.rollout[i]) : 1.0;
            const double raw =
                omega * (e == kl_estimator::k1   ? -std::clamp(u, -in, in)
                         : e == kl_estimator::k2 ? std::pow(std::clamp(u, -in, in), 2) / 2
                                                 : std::exp(std::clamp(u, -in, in)) - 1 - std::clamp(u, -in, in));
            if (std::fabs(std::fabs(u) - in) < 1e-4 || std::fabs(std::fabs(raw) - out) < 1e-4) continue;
            std::vector<double> hi = p.lp, lo = p.lp;
            hi[i] += 1e-7, lo[i] -= 1e-7;
            double fd = (value(hi) - value(lo)) / 2e-7;
            // The default weight exp(logp - sg(logp)) has value 1 and derivative 1: the oracle's value
            // misses its derivative ω' κ, which NeMo's autograd adds (outside the clamps).
            if (!on_policy && std::fabs(u) <= in && std::fabs(raw) <= out) {
              const double lam = std::clamp(u, -in, in);
              fd += 0.3 * (token_level ? 1.0 / c.N : 1.0 / (static_cast<double>(p.B) * c.n[i / p.T])) *
                    (e == kl_estimator::k1   ? -lam
                     : e == kl_estimator::k2 ? lam * lam / 2
                                             : std::exp(lam) - 1 - lam);
            }
            // Where a clamp is active NeMo's K carries no derivative at all (ω included).
            if (std::fabs(u) > in || std::fabs(raw) > out) fd = 0.0;
            REQUIRE(g[i] - 0.5 == Approx(fd).epsilon(1e-5).margin(1e-8));
            ++fd_checked;
          }
        }
  REQUIRE(fd_checked > 100);
}

TEST_CASE("nemo_rl ClippedPGLossFn options: objective, normaliser, rejections, ProRL v2 / v2.1") {
  using W = ulorl::rollout_correction::is_weighting;
  P::nemo_rl::clipped_pg_loss_options o;
  const auto ob = P::nemo_rl::objective(o);
  REQUIRE(ob.kind == ulorl::objective_kind::ppo_clip);
  REQUIRE(ob.log_ratio_clamp == ulorl::no_limit);
  o.disable_ppo_ratio = true;
  REQUIRE(P::nemo_rl::objective(o).kind == ulorl::objective_kind::policy_gradient);
  o.force_on_policy_ratio = true;  // force wins
  REQUIRE(P::nemo_rl::objective(o).kind == ulorl::objective_kind::ppo_clip);
  ulorl::batch_counts local;
  local.tokens = 7, local.rows = 3, local.sequences = 3;
  const P::nemo_rl::global_counts global{.global_valid_toks = 500.0, .global_valid_seqs = 40.0};
  REQUIRE(P::nemo_rl::normalizer({}, {}, local).denominator == 7);
  REQUIRE(P::nemo_rl::normalizer({}, global, local).denominator == 500);
  REQUIRE(P::nemo_rl::normalizer({}, {.global_valid_seqs = 40.0}, local).denominator == 7);
  REQUIRE(P::nemo_rl::normalizer({.token_level_loss = false}, global, local).mode == agg_mode::seq_mean_token_mean);
  REQUIRE(P::nemo_rl::normalizer({.token_level_loss = false}, global, local).denominator == 40);
  REQUIRE(P::nemo_rl::normalizer({.token_level_loss = false}, {.global_valid_toks = 500.0}, local).denominator == 3);
  // Rejections (NeMo asserts).
  REQUIRE_THROWS_AS(P::nemo_rl::validate({.ratio_clip_c = 1.0}), ulorl::error);
  REQUIRE_THROWS_AS(P::nemo_rl::validate({.truncated_importance_sampling_type = W::truncate,
                                          .truncated_importance_sampling_ratio = 2.0}),
                    ulorl::error);
  REQUIRE_THROWS_AS(P::nemo_rl::validate({.kl_input_clamp_value = 0.0}), ulorl::error);
  REQUIRE_THROWS_AS(P::nemo_rl::validate({.reference_policy_kl_type = kl_estimator::abs}), ulorl::error);
  REQUIRE_THROWS_AS(
      P::nemo_rl::rollout_correction(P::nemo_rl::clipped_pg_loss_options{.use_importance_sampling_correction = true,
                                                                         .truncated_importance_sampling_type = W::mask,
                                                                         .truncated_importance_sampling_ratio = 5.0}),
      ulorl::error);  // icepop without ratio_min
  // ProRL v2 / v2.1: exactly the documented settings.
  const auto v2 = P::nemo_rl::prorl_v2();
  REQUIRE(v2.ratio_clip_min == 0.2);
  REQUIRE(v2.ratio_clip_max == 0.27);
  REQUIRE(!v2.ratio_clip_c);
  REQUIRE(v2.token_level_loss);
  REQUIRE(v2.use_importance_sampling_correction);
  REQUIRE(v2.truncated_importance_sampling_type == W::mask);
  REQUIRE(*v2.truncated_importance_sampling_ratio == 5.0);
  REQUIRE(*v2.truncated_importance_sampling_ratio_min == 0.5);
  REQUIRE(v2.reference_policy_kl_penalty == 1e-4);
  REQUIRE(v2.reference_policy_kl_type == kl_estimator::k2);
  REQUIRE(*v2.kl_input_clamp_value == 20.0);
  REQUIRE(*v2.kl_output_clamp_value == 10.0);
  REQUIRE(!v2.force_on_policy_ratio);
  const auto v21 = P::nemo_rl::prorl_v2_1();
  REQUIRE(v21.force_on_policy_ratio);
  REQUIRE(v21.truncated_importance_sampling_type == W::geometric_gate);
  REQUIRE(*v21.truncated_importance_sampling_ratio == 1.002);
  REQUIRE(*v21.truncated_importance_sampling_ratio_min == 0.999);
  REQUIRE(v21.ratio_clip_max == 0.27);
  P::nemo_rl::validate(v2);
  P::nemo_rl::validate(v21);
  (void)P::nemo_rl::rollout_correction(v2);
  (void)P::nemo_rl::rollout_correction(v21);
}

TEST_CASE("weighted_kl_loss with nemo_rl's reference KL: rejections leave the gradient untouched") {
  std::mt19937_64 rng(8);
  problem p = random_problem(rng, 2, 3);
  const auto norm = ulorl::agg_normalizer{agg_mode::token_mean, 4.0, 1.0};
  std::vector<double> g(p.lp.size(), 1.25);
  auto call = [&](const P::nemo_rl::clipped_pg_loss_options& o) {
    return ulorl::weighted_kl_loss(cview(p.lp, p.B, p.T), cview(p.ref, p.B, p.T), cview(p.rollout, p.B, p.T),
                                   cview(p.mask, p.B, p.T), view(g, p.B, p.T), P::nemo_rl::reference_policy_kl(o),
                                   norm);
  };
  P::nemo_rl::clipped_pg_loss_options on{.reference_policy_kl_penalty = 0.1};
  on.use_on_policy_kl_approximation = true;
  p.lp[1] = 0.0, p.rollout[1] = -800.0;  // exp(800) overflows
  REQUIRE_THROWS_AS(call(on), ulorl::error);
  p.rollout[1] = -1.0, p.ref[2] = std::nan("");
  REQUIRE_THROWS_AS(call(on), ulorl::error);
  p.ref[2] = -1.0, p.mask[0] = 0.5;
  REQUIRE_THROWS_AS(call(on), ulorl::error);
  p.mask[0] = 1.0;
  REQUIRE_THROWS_AS(call({.reference_policy_kl_penalty = std::numeric_limits<double>::infinity()}), ulorl::error);
  REQUIRE(std::all_of(g.begin(), g.end(), [](double v) { return v == 1.25; }));
  // A penalty or a gradient beyond double's range (beta = 1e308 times KL values and slopes above 1)
  // is an error naming it, the gradient untouched.
  for (std::size_t i = 0; i < p.lp.size(); ++i) p.lp[i] = -1.0, p.ref[i] = -10.0, p.mask[i] = 1.0;
  try {
    (void)call({.reference_policy_kl_penalty = 1e308});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "weighted_kl_loss");
    CHECK((e.argument() == "grad_log_prob" || e.argument() == "kl_penalty"));
    CHECK(std::string(e.what()).find("overflows float64") != std::string::npos);
  }
  REQUIRE(std::all_of(g.begin(), g.end(), [](double v) { return v == 1.25; }));
}

}  // namespace

TEST_CASE("token selections and the weighted KL term: an absent mask is an all-ones mask, bit for bit, in both layouts",
          "[mask]") {
  using K = P::verl::loss_mode_kind;
  std::mt19937_64 rng(777);
  for (const auto& lay : absent_mask::layouts(rng, 5, 9)) {
    INFO((lay.packed ? "packed" : "padded"));
    const auto old = absent_mask::uniform(rng, lay.size(), -3, -0.1);
    auto lp = old;
    for (auto& x : lp) x = std::min(-0.01, x + (absent_mask::uniform(rng, 1, -0.6, 0.6)[0]));
    const auto adv = absent_mask::uniform(rng, lay.size(), -1, 1),
               ref = absent_mask::uniform(rng, lay.size(), -3, -0.1);
    const auto rollout = absent_mask::uniform(rng, lay.size(), -3, -0.1),
               isw = absent_mask::uniform(rng, lay.size(), 0.5, 1.5);
    const std::vector<std::uint8_t> ones(lay.size(), 1);
    const ulorl::token_view<const std::uint8_t> absent{};
    for (const K mode : {K::dppo_tv, K::dppo_kl}) {
      const P::verl::objective_options o{.loss_mode = mode, .clip_ratio_low = 0.2, .clip_ratio_high = 0.3};
      std::vector<double> w(lay.size(), 9.0), wa(lay.size(), 9.0);
      const ulorl::dppo_config c = P::verl::dppo(o);
      const auto st = ulorl::dppo_weights(lay.cview(old), lay.cview(lp), lay.cview(adv), lay.cview(ones),
                                          lay.cview(isw), lay.mview(w), c);
      const auto sa =
          ulorl::dppo_weights(lay.cview(old), lay.cview(lp), lay.cview(adv), absent, lay.cview(isw), lay.mview(wa), c);
      REQUIRE(absent_mask::same_bits(wa, w));
      REQUIRE((absent_mask::same_bits(sa.dropped_fraction, st.dropped_fraction) &&
               absent_mask::same_bits(sa.capped_fraction, st.capped_fraction)));
    }
    {
      const P::verl::objective_options o{.loss_mode = K::kl_cov};
      std::vector<double> sel(lay.size(), 9.0), sela(lay.size(), 9.0);
      const auto st = ulorl::kl_cov_selection(lay.cview(old), lay.cview(lp), lay.cview(adv), lay.cview(ones),
                                              lay.mview(sel), P::verl::kl_cov(o));
      const auto sa = ulorl::kl_cov_selection(lay.cview(old), lay.cview(lp), lay.cview(adv), absent, lay.mview(sela),
                                              P::verl::kl_cov(o));
      REQUIRE(absent_mask::same_bits(sela, sel));
      REQUIRE(absent_mask::same_bits(sa.mean_abs_log_ratio, st.mean_abs_log_ratio));
    }
    for (const bool token_level : {true, false}) {
      P::nemo_rl::clipped_pg_loss_options o{.token_level_loss = token_level, .reference_policy_kl_penalty = 0.3};
      o.use_on_policy_kl_approximation = !token_level;
      const auto norm = P::nemo_rl::normalizer(o, {}, ulorl::count_batch(absent, lay.cview(lp)));
      std::vector<double> g(lay.size(), 0.5), ga(lay.size(), 0.5);
      const ulorl::weighted_kl_config kc = P::nemo_rl::reference_policy_kl(o);
      const double kl = ulorl::weighted_kl_loss(lay.cview(lp), lay.cview(ref), lay.cview(rollout), lay.cview(ones),
                                                lay.mview(g), kc, norm);
      const double ka =
          ulorl::weighted_kl_loss(lay.cview(lp), lay.cview(ref), lay.cview(rollout), absent, lay.mview(ga), kc, norm);
      REQUIRE(absent_mask::same_bits(ka, kl));
      REQUIRE(absent_mask::same_bits(ga, g));
      const auto r1 =
          P::nemo_rl::logged_ratios(lay.cview(lp), lay.cview(old), lay.cview(ones), o, {.global_valid_toks = 40.0});
      const auto ra = P::nemo_rl::logged_ratios(lay.cview(lp), lay.cview(old), absent, o, {.global_valid_toks = 40.0});
      REQUIRE((absent_mask::same_bits(ra.probs_ratio, r1.probs_ratio) &&
               absent_mask::same_bits(ra.probs_ratio_clamped, r1.probs_ratio_clamped)));
    }
  }
}

TEST_CASE("token selections: a bad configuration is an error naming the function and the field, nothing written") {
  std::mt19937_64 rng(99);
  const problem p = random_problem(rng, 2, 5);
  std::vector<double> out(p.lp.size(), -2.0), sel(p.lp.size(), 0.0);
  const auto error_of = [](auto&& f) -> std::pair<std::string, std::string> {
    try {
      (void)f();
    } catch (const ulorl::error& e) {
      return {std::string(e.function()), std::string(e.argument())};
    }
    return {};
  };
  const auto kl_cov = [&](const ulorl::kl_cov_config& c) {
    return ulorl::kl_cov_selection(cview(p.old, p.B, p.T), cview(p.lp, p.B, p.T), cview(p.adv, p.B, p.T),
                                   cview(p.mask, p.B, p.T), view(out, p.B, p.T), c);
  };
  const auto clip_cov = [&](const ulorl::clip_cov_config& c) {
    return ulorl::clip_cov_weights(cview(p.old, p.B, p.T), cview(p.lp, p.B, p.T), cview(p.adv, p.B, p.T),
                                   cview(p.mask, p.B, p.T), cview(sel, p.B, p.T), ulorl::token_view<const double>{},
                                   view(out, p.B, p.T), c);
  };
  using E = std::pair<std::string, std::string>;
  CHECK(error_of([&] { return kl_cov({.fraction = 0.0}); }) == E{"kl_cov_selection", "fraction"});
  CHECK(error_of([&] { return kl_cov({.fraction = std::numeric_limits<double>::infinity()}); }) ==
        E{"kl_cov_selection", "fraction"});
  CHECK(error_of([&] { return clip_cov({.fraction = -1.0}); }) == E{"clip_cov_weights", "fraction"});
  CHECK(error_of([&] { return clip_cov({.cov_lower = std::nan("")}); }) == E{"clip_cov_weights", "cov_lower"});
  CHECK(error_of([&] { return clip_cov({.cov_upper = std::numeric_limits<double>::infinity()}); }) ==
        E{"clip_cov_weights", "cov_upper"});
  CHECK(error_of([&] { return clip_cov({.eps_low = 1.0}); }) == E{"clip_cov_weights", "eps_low"});
  CHECK(error_of([&] { return clip_cov({.eps_high = -0.5}); }) == E{"clip_cov_weights", "eps_high"});
  REQUIRE(std::all_of(out.begin(), out.end(), [](double v) { return v == -2.0; }));
  // verl's options map one to one (clip_cov's band is verl's clip ratios).
  using K = P::verl::loss_mode_kind;
  REQUIRE(P::verl::kl_cov({.loss_mode = K::kl_cov, .kl_cov_ratio = 0.01}).fraction == 0.01);
  const ulorl::clip_cov_config cc = P::verl::clip_cov({.loss_mode = K::clip_cov,
                                                       .clip_ratio_low = 0.1,
                                                       .clip_ratio_high = 0.3,
                                                       .clip_cov_ratio = 0.02,
                                                       .clip_cov_lb = -1.0,
                                                       .clip_cov_ub = 2.0});
  REQUIRE(
      (cc.eps_low == 0.1 && cc.eps_high == 0.3 && cc.fraction == 0.02 && cc.cov_lower == -1.0 && cc.cov_upper == 2.0));
  CHECK(error_of([&] { return P::verl::kl_cov({.loss_mode = K::clip_cov}); }) ==
        E{"presets::verl::kl_cov", "loss_mode"});
  CHECK(error_of([&] { return P::verl::clip_cov({.loss_mode = K::kl_cov}); }) ==
        E{"presets::verl::clip_cov", "loss_mode"});
  CHECK(error_of([&] { return P::verl::kl_cov({.loss_mode = K::kl_cov, .kl_cov_ratio = 0.0}); }) ==
        E{"presets::verl::objective", "kl_cov_ratio"});
}
