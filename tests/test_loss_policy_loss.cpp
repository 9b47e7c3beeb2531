// Tests of ulorl/loss/policy_loss.hpp: values against the independent float64 oracle, gradients
// against central finite differences of the oracle for every objective x KL estimator x aggregation
// mode, TRL's loss types through the presets against TRL's own formulas, the partition property,
// layouts, float vs double, bad input, extreme input and properties.
#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/presets/nemo_rl.hpp>
#include <ulorl/presets/trl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iomanip>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "support/loss_combos.hpp"
#include "support/loss_compare.hpp"
#include "support/loss_oracle.hpp"
#include "support/loss_paths.hpp"
#include "support/rejection.hpp"

namespace {

constexpr std::uint64_t seed = 20261129;

struct problem {
  std::size_t B = 0, T = 0;
  std::vector<double> lp, old, adv, mask, ref, w, ent;
};

//! A [B, T] problem with every array but the weights allocated (zeros).
problem sized_problem(std::size_t B, std::size_t T) {
  problem p;
  p.B = B, p.T = T;
  for (auto* v : {&p.lp, &p.old, &p.adv, &p.mask, &p.ref, &p.ent}) v->assign(B * T, 0.0);
  return p;
}

//! Random problem. Log-ratios mostly in (-0.7, 0.7) (all clip regions), a few beyond +-20.
problem random_problem(std::mt19937_64& rng, std::size_t B, std::size_t T, bool weights) {
  std::uniform_real_distribution<double> u(0, 1);
  problem p = sized_problem(B, T);
  for (std::size_t b = 0; b < B; ++b) {
    const double len = std::floor(u(rng) * static_cast<double>(T + 1));  // 0..T valid tokens
    const double a_row = (u(rng) - 0.5) * 4;
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t i = b * T + t;
      p.old[i] = -5 * u(rng);
      double x = (u(rng) - 0.5) * 1.4;
      if (u(rng) < 0.05) x = u(rng) < 0.5 ? -25 - u(rng) : 25 + u(rng);
      p.lp[i] = p.old[i] + x;
      p.adv[i] = u(rng) < 0.7 ? a_row : (u(rng) - 0.5) * 4;
      p.mask[i] = static_cast<double>(t) < len ? 1.0 : 0.0;
      p.ref[i] = p.lp[i] + (u(rng) - 0.5) * 4;
      p.ent[i] = 3 * u(rng);
    }
  }
  if (weights) {
    p.w.resize(B * T);
    for (auto& v : p.w) v = 0.2 + 1.5 * u(rng);
  }
  return p;
}

template <class T>
ulorl::token_view<const T> cview(const std::vector<T>& v, std::size_t B, std::size_t Tn) {
  if (v.empty()) return {};
  return ulorl::token_view<const T>::padded(ulorl::matrix_view<const T>(v.data(), B, Tn));
}
template <class T>
ulorl::token_view<T> mview(std::vector<T>& v, std::size_t B, std::size_t Tn) {
  return ulorl::token_view<T>::padded(ulorl::matrix_view<T>(v.data(), B, Tn));
}

oracle::batch to_oracle(const problem& p, bool with_kl) {
  oracle::batch b;
  b.B = p.B, b.T = p.T, b.old = p.old, b.adv = p.adv, b.mask = p.mask, b.w = p.w, b.ent = p.ent;
  if (with_kl) b.ref = p.ref;
  return b;
}

struct run_out {
  ulorl::policy_loss_result res;
  std::vector<double> grad, gent;
};
run_out run(const problem& p, const ulorl::policy_loss_config& cfg) {
  run_out o;
  o.grad.assign(p.B * p.T, 0.0);
  o.gent.assign(p.B * p.T, 0.0);
  ulorl::policy_loss_inputs<double, double> in{cview(p.lp, p.B, p.T), cview(p.old, p.B, p.T), cview(p.adv, p.B, p.T),
                                               cview(p.mask, p.B, p.T)};
  in.ref_log_prob = cview(p.ref, p.B, p.T);
  in.weights = cview(p.w, p.B, p.T);
  in.entropy = cview(p.ent, p.B, p.T);
  o.res = ulorl::policy_loss(in, mview(o.grad, p.B, p.T), mview(o.gent, p.B, p.T), cfg);
  return o;
}

}  // namespace

namespace {

const char* const all_objectives[] = {"ppo",       "ppo_sym", "ppo_prorl", "ppo_dual", "ppo_delta", "gspo_own",
                                      "gspo_mean", "cispo",   "gmpo",      "sapo",     "pg"};
const char* const all_kls[] = {"none",      "k1",       "abs",       "k2",         "k3",          "k3_st",
                               "k3_iw",     "k1_st",    "abs_st",    "k2_st",      "k3_st_clamp", "k1_clamp",
                               "abs_clamp", "k2_clamp", "k1_iclamp", "abs_iclamp", "k2_iclamp"};
const char* const all_aggs[] = {"token_mean", "seq_sum", "seq_mean", "seq_sum_norm", "constant"};

//! Compares a gradient with the central differences fd (step h) and fd2 (step 10 h); where the two
//! disagree the point sits next to a kink (clamp bound, min/max switch): the derivative is
//! one-sided there and FD cannot judge it. Counts checked and skipped elements.
void require_grad_matches_fd(const std::vector<double>& grad, const std::vector<double>& fd,
                             const std::vector<double>& fd2, const problem& p, std::size_t& checked,
                             std::size_t& skipped) {
  REQUIRE(grad.size() == fd.size());
  for (std::size_t i = 0; i < fd.size(); ++i) {
    if (std::fabs(fd[i] - fd2[i]) > 1e-6 * (1 + std::fabs(fd[i]))) {
      ++skipped;
      continue;
    }
    INFO(std::setprecision(17) << "token " << i << " lp " << p.lp[i] << " old " << p.old[i] << " adv " << p.adv[i]
                               << " ref " << p.ref[i] << " mask " << p.mask[i] << " w " << (p.w.empty() ? 1.0 : p.w[i])
                               << " fd " << fd[i] << " fd2 " << fd2[i]);
    REQUIRE(grad[i] == Approx(fd[i]).epsilon(1e-6).margin(1e-8));
    ++checked;
  }
}

}  // namespace

TEST_CASE("policy_loss: value and gradient vs oracle + finite differences, every objective x KL x aggregation") {
  std::printf("test_loss_policy_loss seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::size_t checked = 0, skipped = 0, triples = 0;
  // Tokens where the KL clamps bind (valid tokens, KL variants with a finite clamp): each clamp
  // must bind somewhere, or the clamped variants would not test their clamps.
  struct binds {
    std::size_t in = 0, out = 0, neither = 0;
    bool has_in = false, has_out = false;
  };
  std::map<std::string, binds> clamp_binds;
  for (const char* obj : all_objectives)
    for (const char* kl : all_kls)
      for (const char* agg : all_aggs) {
        const std::size_t B = 1 + rng() % 5, T = 1 + rng() % 9;
        const problem p = random_problem(rng, B, T, rng() % 2 == 0);
        const double denom = std::string(obj) == "gmpo" ? static_cast<double>(B) : 7.0;
        const combo c = make_combo(obj, kl, agg, denom);
        INFO("objective " << obj << " kl " << kl << " agg " << agg << " B " << B << " T " << T);
        const auto out = run(p, c.cfg);
        const auto ob = to_oracle(p, std::string(kl) != "none");
        const double expect = oracle::loss(c.s, ob, p.lp, p.lp);
        REQUIRE(out.res.loss == Approx(expect).epsilon(1e-10).margin(1e-12));
        const auto fd = oracle::fd_gradient(c.s, ob, p.lp, 1e-6);
        const auto fd2 = oracle::fd_gradient(c.s, ob, p.lp, 1e-5);
        require_grad_matches_fd(out.grad, fd, fd2, p, checked, skipped);
        // d loss / d entropy: -coef times the token's aggregation weight (the oracle's row weight,
        // which knows every mode by name).
        for (std::size_t b = 0; b < B; ++b) {
          double n = 0;
          for (std::size_t t = 0; t < T; ++t) n += p.mask[b * T + t];
          const double w = oracle::row_weight(c.s, n);
          for (std::size_t t = 0; t < T; ++t)
            REQUIRE(out.gent[b * T + t] == Approx(p.mask[b * T + t] * -0.01 * w).margin(1e-15));
        }
        if (std::isfinite(c.s.kl_in) || std::isfinite(c.s.kl_out)) {
          auto& cb = clamp_binds[kl];
          cb.has_in = std::isfinite(c.s.kl_in), cb.has_out = std::isfinite(c.s.kl_out);
          oracle::spec unclamped = c.s;
          unclamped.kl_in = unclamped.kl_out = oracle::inf;
          for (std::size_t i = 0; i < B * T; ++i) {
            if (p.mask[i] == 0) continue;
            const double u = p.ref[i] - p.lp[i];
            const bool ib = std::fabs(u) > c.s.kl_in,
                       obd = std::fabs(oracle::kl_value(unclamped, p.lp[i], p.ref[i])) > c.s.kl_out;
            cb.in += ib, cb.out += obd, cb.neither += !ib && !obd;
          }
        }
        ++triples;
      }
  std::printf("  %zu objective x KL x aggregation triples; gradient elements checked %zu, skipped next to kinks %zu\n",
              triples, checked, skipped);
  REQUIRE(triples == std::size(all_objectives) * std::size(all_kls) * std::size(all_aggs));
  REQUIRE(skipped * 20 < checked);
  REQUIRE(clamp_binds.size() == 8);  // k3, k3_st_clamp, {k1, abs, k2} x {_clamp, _iclamp}
  for (const auto& [kl, cb] : clamp_binds) {
    std::printf("  %s: valid tokens where the input clamp binds %zu, the output clamp %zu, neither %zu\n", kl.c_str(),
                cb.in, cb.out, cb.neither);
    INFO(kl);
    if (cb.has_in) REQUIRE(cb.in >= 10);
    if (cb.has_out) REQUIRE(cb.out >= 10);
    REQUIRE(cb.neither >= 10);
  }
}

namespace {

//! A TRL-shaped problem: one advantage per sequence (TRL's advantages are [B]); log-ratios within
//! +-0.7 (every clip region) and a few at +-2.5 (TRL clamps no log-ratio: exp must stay finite, and
//! far from the float range), ref - lp within +-2.
problem trl_problem(std::mt19937_64& rng, std::size_t B, std::size_t T) {
  std::uniform_real_distribution<double> u(0, 1);
  problem p = sized_problem(B, T);
  for (std::size_t b = 0; b < B; ++b) {
    const double len = std::floor(u(rng) * static_cast<double>(T + 1));
    const double a_row = (u(rng) - 0.5) * 4;
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t i = b * T + t;
      p.old[i] = -5 * u(rng);
      double x = (u(rng) - 0.5) * 1.4;
      if (u(rng) < 0.05) x = u(rng) < 0.5 ? -2.5 : 2.5;
      p.lp[i] = p.old[i] + x;
      p.adv[i] = a_row;
      p.mask[i] = static_cast<double>(t) < len ? 1.0 : 0.0;
      p.ref[i] = p.lp[i] + (u(rng) - 0.5) * 4;
      p.ent[i] = 3 * u(rng);
    }
  }
  return p;
}

}  // namespace

TEST_CASE(
    "policy_loss: TRL presets (grpo, bnpo, dr_grpo, dapo x token, sequence x beta) vs TRL's formulas + finite "
    "differences") {
  std::mt19937_64 rng(seed + 41);
  std::printf("TRL presets seed %llu\n", static_cast<unsigned long long>(seed + 41));
  std::size_t checked = 0, skipped = 0, cases = 0;
  for (const char* loss_type : {"grpo", "bnpo", "dr_grpo", "dapo"})
    for (const char* level : {"token", "sequence"})
      for (int kl_variant = 0; kl_variant < 3; ++kl_variant)          // beta 0; beta 0.04; beta 0.04 + bias correction
        for (int clip_variant = 0; clip_variant < 2; ++clip_variant)  // epsilon 0.2; 0.2 / 0.28 + delta 1.5
          for (int rep = 0; rep < 3; ++rep) {
            const std::size_t B = 1 + rng() % 5, T = 1 + rng() % 9;
            const problem p = trl_problem(rng, B, T);
            oracle::trl_spec ts;
            ts.loss_type = loss_type, ts.level = level;
            ts.epsilon = 0.2;
            ts.epsilon_high = clip_variant == 0 ? 0.2 : 0.28;
            ts.delta = clip_variant == 0 ? 0.0 : 1.5;
            ts.beta = kl_variant == 0 ? 0.0 : 0.04;
            ts.bias_correction_kl = kl_variant == 2;
            ts.ga = 1 + static_cast<double>(rng() % 4);
            ts.max_completion_length = static_cast<double>(T + rng() % 5);
            ts.num_processes = 1 + static_cast<double>(rng() % 3);
            double n_local = 0;
            for (double m : p.mask) n_local += m;
            // num_items_in_batch counts the tokens of every micro-batch of the step on every process
            // (rep 2: zero items, where dapo's normaliser is max(items, 1) / P).
            ts.num_items_in_batch =
                rep == 2 ? 0.0 : n_local * ts.ga * ts.num_processes + static_cast<double>(rng() % 7);

            std::vector<double> mask = p.mask;
            const auto counts = ulorl::count_batch(cview(mask, B, T));
            ulorl::policy_loss_config cfg;
            namespace trl = ulorl::presets::trl;
            cfg.objective =
                trl::objective({.epsilon = 0.2,
                                .epsilon_high = clip_variant == 0 ? std::nullopt : std::optional<double>(0.28),
                                .delta = clip_variant == 0 ? std::nullopt : std::optional<double>(1.5),
                                .importance_sampling_level = trl::importance_sampling_level_from_name(level)});
            cfg.kl = trl::kl({.use_bias_correction_kl = ts.bias_correction_kl});
            cfg.kl_coef = ts.beta;
            cfg.normalizer = trl::normalizer({.loss_type = trl::loss_type_from_name(loss_type),
                                              .max_completion_length = ts.max_completion_length,
                                              .gradient_accumulation_steps = ts.ga,
                                              .num_items_in_batch = ts.num_items_in_batch,
                                              .num_processes = ts.num_processes},
                                             counts);
            INFO("loss_type " << loss_type << " level " << level << " beta " << ts.beta << " bias_correction "
                              << ts.bias_correction_kl << " eps_high " << ts.epsilon_high << " delta " << ts.delta
                              << " B " << B << " T " << T << " GA " << ts.ga << " max_len " << ts.max_completion_length
                              << " items " << ts.num_items_in_batch << " P " << ts.num_processes);
            problem q = p;
            if (ts.beta == 0) q.ref.assign(q.ref.size(), std::numeric_limits<double>::quiet_NaN());
            q.ent.clear();
            run_out out;
            out.grad.assign(B * T, -7.0);
            {
              ulorl::policy_loss_inputs<double, double> in{cview(q.lp, B, T), cview(q.old, B, T), cview(q.adv, B, T),
                                                           cview(q.mask, B, T)};
              in.ref_log_prob = cview(q.ref, B, T);  // beta 0: all NaN, never read
              out.res = ulorl::policy_loss(in, mview(out.grad, B, T), cfg);
            }
            const auto ob = to_oracle(p, true);
            const double expect = oracle::trl_loss(ts, ob, p.lp);
            REQUIRE(std::isfinite(expect));
            REQUIRE(out.res.loss == Approx(expect).epsilon(1e-10).margin(1e-12));
            const auto fd = oracle::trl_fd_gradient(ts, ob, p.lp, 1e-6);
            const auto fd2 = oracle::trl_fd_gradient(ts, ob, p.lp, 1e-5);
            require_grad_matches_fd(out.grad, fd, fd2, p, checked, skipped);
            for (std::size_t i = 0; i < B * T; ++i)
              if (p.mask[i] == 0) REQUIRE(out.grad[i] == 0.0);
            ++cases;
          }
  std::printf("  %zu TRL cases; gradient elements checked %zu, skipped next to kinks %zu\n", cases, checked, skipped);
  REQUIRE(skipped * 20 < checked);
}

TEST_CASE("policy_loss: partition-exact over random splits into micro-batches and ranks (float64, 1e-12)") {
  std::mt19937_64 rng(seed + 1);
  const char* objectives[] = {"ppo", "ppo_dual", "ppo_delta", "gspo_mean", "gspo_own", "cispo", "gmpo", "sapo", "pg"};
  const char* aggs[] = {"token_mean", "seq_sum", "seq_mean", "seq_sum_norm", "constant"};
  // The KL estimator cycles over the runs (7 does not divide 4 trials x 5 modes: every objective
  // sees several estimators, every mode every estimator).
  const char* kls[] = {"k1", "abs", "k2", "k3", "k3_st", "k3_iw", "none"};
  std::size_t run_index = 0, runs = 0;
  for (const char* obj : objectives)
    for (const char* agg : aggs)
      for (int trial = 0; trial < 4; ++trial) {
        const char* kl = kls[run_index++ % std::size(kls)];
        const std::size_t B = 2 + rng() % 30, T = 1 + rng() % 47;
        const problem p = random_problem(rng, B, T, trial % 2 == 0);
        // The global normaliser, from the counts of the whole batch.
        std::vector<double> mask = p.mask;
        const auto counts = ulorl::count_batch(cview(mask, B, T));
        ulorl::agg_mode mode = ulorl::agg_mode::token_mean;
        if (std::string(agg) == "seq_sum") mode = ulorl::agg_mode::seq_mean_token_sum;
        if (std::string(agg) == "seq_mean") mode = ulorl::agg_mode::seq_mean_token_mean;
        if (std::string(agg) == "seq_sum_norm") mode = ulorl::agg_mode::seq_mean_token_sum_norm;
        if (std::string(agg) == "constant") mode = ulorl::agg_mode::constant;
        auto norm = ulorl::global_normalizer(mode, counts, static_cast<double>(B * T), 1.0);
        if (std::string(obj) == "gmpo") norm.denominator = counts.rows;
        if (!(norm.denominator > 0)) continue;
        combo c = make_combo(obj, kl, agg, norm.denominator);
        REQUIRE(c.cfg.normalizer.mode == mode);
        c.cfg.normalizer = norm;
        const auto full = run(p, c.cfg);

        // Random split of the rows into parts (micro-batches of random ranks).
        std::vector<std::size_t> cuts{0, B};
        const std::size_t parts = 1 + rng() % std::min<std::size_t>(B, 6);
        while (cuts.size() < parts + 1)
          cuts.push_back(1 + rng() % (B - 1)), std::sort(cuts.begin(), cuts.end()),
              cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
        double loss = 0;
        ulorl::loss_metrics merged;
        ulorl::batch_counts part_counts;
        std::vector<double> grad;
        for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
          problem q;
          q.B = cuts[k + 1] - cuts[k], q.T = T;
          auto slice = [&](const std::vector<double>& v) {
            return v.empty() ? v : std::vector<double>(v.begin() + cuts[k] * T, v.begin() + cuts[k + 1] * T);
          };
          q.lp = slice(p.lp), q.old = slice(p.old), q.adv = slice(p.adv), q.mask = slice(p.mask), q.ref = slice(p.ref),
          q.w = slice(p.w), q.ent = slice(p.ent);
          part_counts += ulorl::count_batch(cview(q.mask, q.B, T));
          const auto o = run(q, c.cfg);
          loss += o.res.loss;
          merged.merge(o.res.metrics);
          grad.insert(grad.end(), o.grad.begin(), o.grad.end());
        }
        INFO(obj << " " << kl << " " << agg << " B " << B << " T " << T << " parts " << cuts.size() - 1);
        REQUIRE(part_counts.tokens == counts.tokens);
        REQUIRE(part_counts.sequences == counts.sequences);
        REQUIRE(loss == Approx(full.res.loss).epsilon(1e-12).margin(1e-14));
        for (std::size_t i = 0; i < grad.size(); ++i)
          REQUIRE(grad[i] == Approx(full.grad[i]).epsilon(1e-12).margin(1e-15));
        REQUIRE(merged.tokens == full.res.metrics.tokens);
        REQUIRE(merged.clipped == full.res.metrics.clipped);
        REQUIRE(merged.kl_sum == Approx(full.res.metrics.kl_sum).epsilon(1e-12).margin(1e-14));
        REQUIRE(merged.ratio_max == full.res.metrics.ratio_max);
        REQUIRE(merged.ratio_min == full.res.metrics.ratio_min);
        REQUIRE(merged.sequences == full.res.metrics.sequences);
        REQUIRE(merged.rows == full.res.metrics.rows);
        ++runs;
      }
  std::printf("partition: %zu runs\n", runs);
  REQUIRE(runs > 150);
}

TEST_CASE("policy_loss: packed layout, strided views and float agree with padded double") {
  std::mt19937_64 rng(seed + 2);
  for (const char* obj : {"ppo_dual", "gspo_mean", "gmpo", "cispo"}) {
    const std::size_t B = 5, T = 13;
    const problem p = random_problem(rng, B, T, true);
    combo c = make_combo(obj, "k3", "seq_mean", 4.0);
    const auto ref = run(p, c.cfg);
    INFO(obj);
    // Packed: keep every slot of each row (offsets b*T), mask as is.
    std::vector<std::int64_t> off(B + 1);
    for (std::size_t b = 0; b <= B; ++b) off[b] = static_cast<std::int64_t>(b * T);
    auto pk = [&](const std::vector<double>& v) {
      return ulorl::token_view<const double>::packed(ulorl::vector_view<const double>(v.data(), v.size()),
                                                     std::span<const std::int64_t>(off));
    };
    std::vector<double> g(B * T, -7), ge(B * T, -7);
    ulorl::policy_loss_inputs<double, double> in{pk(p.lp),  pk(p.old), pk(p.adv), pk(p.mask),
                                                 pk(p.ref), pk(p.w),   pk(p.ent)};
    const auto r =
        ulorl::policy_loss(in,
                           ulorl::token_view<double>::packed(ulorl::vector_view<double>(g.data(), g.size()),
                                                             std::span<const std::int64_t>(off)),
                           ulorl::token_view<double>::packed(ulorl::vector_view<double>(ge.data(), ge.size()),
                                                             std::span<const std::int64_t>(off)),
                           c.cfg);
    REQUIRE(r.loss == Approx(ref.res.loss).epsilon(1e-14));
    for (std::size_t i = 0; i < g.size(); ++i) REQUIRE(g[i] == Approx(ref.grad[i]).epsilon(1e-14).margin(1e-300));

    // Strided: every array interleaved with junk (column stride 2).
    auto strided = [&](const std::vector<double>& v) {
      std::vector<double> s(2 * v.size(), 1e300);
      for (std::size_t i = 0; i < v.size(); ++i) s[2 * i] = v[i];
      return s;
    };
    const auto slp = strided(p.lp), sold = strided(p.old), sadv = strided(p.adv), smask = strided(p.mask),
               sref = strided(p.ref), sw = strided(p.w), sent = strided(p.ent);
    auto sv = [&](const std::vector<double>& v) {
      return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(v.data(), B, T, 2 * T, 2));
    };
    std::vector<double> sg(2 * B * T, 5.0), sge(2 * B * T, 5.0);
    ulorl::policy_loss_inputs<double, double> sin{sv(slp), sv(sold), sv(sadv), sv(smask), sv(sref), sv(sw), sv(sent)};
    const auto sr = ulorl::policy_loss(
        sin, ulorl::token_view<double>::padded(ulorl::matrix_view<double>(sg.data(), B, T, 2 * T, 2)),
        ulorl::token_view<double>::padded(ulorl::matrix_view<double>(sge.data(), B, T, 2 * T, 2)), c.cfg);
    REQUIRE(sr.loss == Approx(ref.res.loss).epsilon(1e-14));
    for (std::size_t i = 0; i < B * T; ++i) {
      REQUIRE(sg[2 * i] == Approx(ref.grad[i]).epsilon(1e-14).margin(1e-300));
      REQUIRE(sg[2 * i + 1] == 5.0);  // the gaps are not written
    }

    // float with a uint8 mask.
    auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
    const auto flp = f(p.lp), fold = f(p.old), fadv = f(p.adv), fref = f(p.ref), fw = f(p.w), fent = f(p.ent);
    std::vector<std::uint8_t> fm(p.mask.begin(), p.mask.end());
    std::vector<float> fg(B * T), fge(B * T);
    ulorl::policy_loss_inputs<float, std::uint8_t> fin{cview(flp, B, T), cview(fold, B, T), cview(fadv, B, T),
                                                       cview(fm, B, T),  cview(fref, B, T), cview(fw, B, T),
                                                       cview(fent, B, T)};
    const auto fr = ulorl::policy_loss(fin, mview(fg, B, T), mview(fge, B, T), c.cfg);
    // Inputs were rounded to float: compare against double on the rounded inputs.
    problem pf = p;
    for (auto* v : {&pf.lp, &pf.old, &pf.adv, &pf.ref, &pf.w, &pf.ent})
      for (auto& x : *v) x = static_cast<double>(static_cast<float>(x));
    const auto rf = run(pf, c.cfg);
    REQUIRE(fr.loss == Approx(rf.res.loss).epsilon(1e-5).margin(1e-6));
    for (std::size_t i = 0; i < fg.size(); ++i) REQUIRE(fg[i] == Approx(rf.grad[i]).epsilon(1e-4).margin(1e-6));
  }
}

namespace {

//! The layout of one argument in the shape tests (support/rejection.hpp's padded or packed shape), or
//! absent.
using arg_shape = std::optional<shape>;

struct shape_outcome {
  bool threw = false;
  std::string argument, function;
  bool grads_untouched = false;
};

//! policy_loss (double, double mask) with every argument laid out as `good` except `which`, laid
//! out as `bad`. Every argument gets its own buffer and its own copy of the offsets (shapes are
//! compared by value). Valid values everywhere; the gradient buffers start at 42 / 43.
shape_outcome call_with_shapes(const std::string& which, const shape& good, const arg_shape& bad,
                               const ulorl::policy_loss_config& cfg) {
  enum { LP, OLD, ADV, MASK, REF, W, ENT, G, GE, NARGS };
  const char* const names[NARGS] = {"log_prob", "old_log_prob", "advantages",    "mask",        "ref_log_prob",
                                    "weights",  "entropy",      "grad_log_prob", "grad_entropy"};
  const double fill[NARGS] = {-1.0, -1.1, 0.5, 1.0, -1.3, 0.9, 1.0, 42.0, 43.0};
  std::vector<arg_shape> shapes;
  std::vector<std::vector<double>> buf;
  for (int a = 0; a < NARGS; ++a) {
    shapes.push_back(which == names[a] ? bad : good);
    buf.emplace_back(shapes.back() ? shapes.back()->size() : 0, fill[a]);
  }
  for (std::size_t i = 0; i < buf[LP].size(); ++i) buf[LP][i] -= 0.01 * static_cast<double>(i);
  const auto c = [&](int a) {
    return shapes[a] ? view_of<const double>(buf[a].data(), *shapes[a]) : ulorl::token_view<const double>{};
  };
  const auto m = [&](int a) {
    return shapes[a] ? view_of<double>(buf[a].data(), *shapes[a]) : ulorl::token_view<double>{};
  };
  ulorl::policy_loss_inputs<double, double> in{c(LP), c(OLD), c(ADV), c(MASK), c(REF), c(W), c(ENT)};
  shape_outcome o;
  try {
    (void)ulorl::policy_loss(in, m(G), m(GE), cfg);
  } catch (const ulorl::error& e) {
    o.threw = true, o.argument = e.argument(), o.function = e.function();
  }
  o.grads_untouched = std::all_of(buf[G].begin(), buf[G].end(), [](double x) { return x == 42.0; }) &&
                      std::all_of(buf[GE].begin(), buf[GE].end(), [](double x) { return x == 43.0; });
  return o;
}

}  // namespace

TEST_CASE("policy_loss: bad input throws ulorl::error and leaves the outputs untouched") {
  std::mt19937_64 rng(seed + 3);
  const std::size_t B = 3, T = 4;
  const problem p0 = random_problem(rng, B, T, true);
  const combo c0 = make_combo("ppo", "k3", "token_mean", 5.0);  // kl_coef 0.3, entropy_coef 0.01: every input is read
  REQUIRE(c0.cfg.kl_coef != 0);
  REQUIRE(c0.cfg.entropy_coef != 0);
  auto expect_rejected = [&](problem p, ulorl::policy_loss_config cfg, const char* argument, std::size_t advT = 4) {
    std::vector<double> g(B * T, 42.0), ge(B * T, 43.0);
    std::vector<double> adv = p.adv;
    adv.resize(B * advT, 0.5);
    ulorl::policy_loss_inputs<double, double> in{cview(p.lp, B, T),   cview(p.old, B, T), cview(adv, B, advT),
                                                 cview(p.mask, B, T), cview(p.ref, B, T), cview(p.w, B, T),
                                                 cview(p.ent, B, T)};
    INFO("argument " << argument);
    try {
      (void)ulorl::policy_loss(in, mview(g, B, T), mview(ge, B, T), cfg);
      FAIL("no error");
    } catch (const ulorl::error& e) {
      REQUIRE(e.argument() == argument);
      REQUIRE(e.function() == "policy_loss");
    }
    REQUIRE(std::all_of(g.begin(), g.end(), [](double x) { return x == 42.0; }));
    REQUIRE(std::all_of(ge.begin(), ge.end(), [](double x) { return x == 43.0; }));
  };
  expect_rejected(p0, c0.cfg, "advantages", T + 1);  // shape mismatch

  // Shape mismatches: every other argument against log_prob, a row count and a column count off
  // by one either way; packed offsets that differ; padded against packed with the same element
  // count. The argument named is the mismatching one; neither gradient is written.
  const char* const others[] = {"old_log_prob", "advantages", "mask",          "ref_log_prob",
                                "weights",      "entropy",    "grad_log_prob", "grad_entropy"};
  const shape padded{B, T, {}};
  const shape packed{0, 0, {0, 3, 7, 12}};
  {
    // Positive controls: the same layouts in separate buffers are accepted and written.
    const auto ok = call_with_shapes("", padded, padded, c0.cfg);
    REQUIRE(!ok.threw);
    REQUIRE(!ok.grads_untouched);
    const auto okp = call_with_shapes("", packed, packed, c0.cfg);
    INFO(okp.argument);
    REQUIRE(!okp.threw);
    REQUIRE(!okp.grads_untouched);
    // Weights are optional.
    const auto now = call_with_shapes("weights", padded, std::nullopt, c0.cfg);
    REQUIRE(!now.threw);
  }
  const std::pair<shape, shape> mismatches[] = {
      {padded, {B + 1, T, {}}},
      {padded, {B - 1, T, {}}},
      {padded, {B, T + 1, {}}},
      {padded, {B, T - 1, {}}},
      {padded, {0, 0, {0, 4, 8, 12}}},  // the same B x T elements, packed
      {packed, {0, 0, {0, 4, 7, 12}}},  // same B and token count, other offsets
      {packed, {0, 0, {0, 3, 7, 11}}},  // one token fewer in the last row
      {packed, {0, 0, {0, 7, 12}}},     // one row fewer, same token count
      {packed, {B, T, {}}},             // the same 12 elements, padded
  };
  std::size_t shape_cases = 0;
  for (const auto& [good, bad] : mismatches)
    for (const char* which : others) {
      const auto o = call_with_shapes(which, good, bad, c0.cfg);
      INFO("mismatching " << which << " (good " << (good.offsets.empty() ? "padded" : "packed") << ", bad size "
                          << bad.size() << ")");
      REQUIRE(o.threw);
      REQUIRE(o.argument == which);
      REQUIRE(o.function == "policy_loss");
      REQUIRE(o.grads_untouched);
      ++shape_cases;
    }
  REQUIRE(shape_cases == std::size(mismatches) * std::size(others));
  // Missing inputs the configuration needs.
  const std::pair<const char*, shape> missing[] = {{"ref_log_prob", padded}, {"entropy", padded},
                                                   {"grad_entropy", padded}, {"ref_log_prob", packed},
                                                   {"entropy", packed},      {"grad_entropy", packed}};
  for (const auto& [which, good] : missing) {
    const auto o = call_with_shapes(which, good, std::nullopt, c0.cfg);
    INFO("missing " << which);
    REQUIRE(o.threw);
    REQUIRE(o.argument == which);
    REQUIRE(o.grads_untouched);
  }
  // A given input is checked even where its coefficient is 0, and a zero-row view of no memory
  // ([0, T] over an empty buffer) is a given argument, not an absent one.
  {
    auto cfg = c0.cfg;
    cfg.kl_coef = 0, cfg.entropy_coef = 0;
    const shape zero_rows{0, T, {}};
    for (const char* which : {"ref_log_prob", "entropy", "mask", "weights"})
      for (const shape& bad : {zero_rows, shape{B, T + 1, {}}}) {
        const auto o = call_with_shapes(which, padded, bad, cfg);
        INFO("given " << which << " of " << bad.size() << " elements, its coefficient 0");
        REQUIRE(o.threw);
        REQUIRE(o.argument == which);
        REQUIRE(o.grads_untouched);
      }
    // A NaN option the objective does not read (sapo's temperatures, the dual clip of ppo) is an error.
    for (const char* which : {"tau_pos", "tau_neg", "square_penalty"}) {
      auto bad_cfg = cfg;
      (std::string(which) == "tau_pos"   ? bad_cfg.objective.sapo.tau_pos
       : std::string(which) == "tau_neg" ? bad_cfg.objective.sapo.tau_neg
                                         : bad_cfg.objective.penalized_pg.square_penalty) = std::nan("");
      const auto o = call_with_shapes("", padded, padded, bad_cfg);
      INFO("NaN " << which);
      REQUIRE(o.threw);
      REQUIRE(o.argument == which);
      REQUIRE(o.grads_untouched);
    }
  }
  // ... and not needed without the term: kl_coef 0 without ref_log_prob, entropy_coef 0 without
  // entropy / grad_entropy (the gradient of log_prob is then written).
  {
    auto cfg = c0.cfg;
    cfg.kl_coef = 0;
    REQUIRE(!call_with_shapes("ref_log_prob", padded, std::nullopt, cfg).threw);
    cfg = c0.cfg;
    cfg.entropy_coef = 0;
    REQUIRE(!call_with_shapes("entropy", padded, std::nullopt, cfg).threw);
    const auto o = call_with_shapes("grad_entropy", padded, std::nullopt, cfg);
    REQUIRE(!o.threw);
    REQUIRE(!o.grads_untouched);
  }

  // NaN / +Inf / -Inf at index 6 of every value input the configuration reads: named with the index.
  for (const char* which : {"log_prob", "old_log_prob", "advantages", "ref_log_prob", "weights", "entropy"}) {
    for (double bad : {std::nan(""), double(INFINITY), -double(INFINITY)}) {
      problem p = p0;
      const std::string w = which;
      auto& v = w == "log_prob"       ? p.lp
                : w == "old_log_prob" ? p.old
                : w == "advantages"   ? p.adv
                : w == "ref_log_prob" ? p.ref
                : w == "weights"      ? p.w
                                      : p.ent;
      v[6] = bad;
      std::vector<double> g(B * T, 42.0), ge(B * T, 43.0);
      ulorl::policy_loss_inputs<double, double> in{cview(p.lp, B, T),   cview(p.old, B, T), cview(p.adv, B, T),
                                                   cview(p.mask, B, T), cview(p.ref, B, T), cview(p.w, B, T),
                                                   cview(p.ent, B, T)};
      INFO(which << "[6] = " << bad);
      try {
        (void)ulorl::policy_loss(in, mview(g, B, T), mview(ge, B, T), c0.cfg);
        FAIL("no error");
      } catch (const ulorl::error& e) {
        REQUIRE(e.argument() == which);
        REQUIRE(e.index() == 6);
      }
      REQUIRE(std::all_of(g.begin(), g.end(), [](double x) { return x == 42.0; }));
      REQUIRE(std::all_of(ge.begin(), ge.end(), [](double x) { return x == 43.0; }));
    }
  }
  auto with = [&](auto f) {
    auto cfg = c0.cfg;
    f(cfg);
    return cfg;
  };
  expect_rejected(p0, with([](auto& c) { c.objective.eps_low = -0.1; }), "eps_low");
  expect_rejected(p0, with([](auto& c) { c.objective.eps_low = 1.0; }), "eps_low");
  expect_rejected(p0, with([](auto& c) { c.objective.eps_high = -0.1; }), "eps_high");
  expect_rejected(p0, with([](auto& c) { c.objective.dual_clip = 1.0; }), "dual_clip");
  expect_rejected(p0, with([](auto& c) { c.objective.dual_clip = 0.5; }), "dual_clip");
  expect_rejected(p0, with([](auto& c) { c.objective.delta = 0.9; }), "delta");
  expect_rejected(p0, with([](auto& c) { c.normalizer.denominator = 0; }), "normalizer.denominator");
  expect_rejected(p0, with([](auto& c) { c.kl.input_clamp = -1; }), "input_clamp");
  problem pm = p0;
  pm.mask[5] = 2;
  expect_rejected(pm, c0.cfg, "mask");
  // A zero-token batch gives a zero normaliser through global_normalizer.
  problem pz = p0;
  std::fill(pz.mask.begin(), pz.mask.end(), 0.0);
  const auto counts = ulorl::count_batch(cview(pz.mask, B, T));
  expect_rejected(pz,
                  with([&](auto& c) { c.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, counts); }),
                  "normalizer.denominator");
}

TEST_CASE("policy_loss: extreme valid inputs give finite loss and gradient") {
  std::mt19937_64 rng(seed + 4);
  std::size_t runs = 0;
  for (const char* obj : all_objectives)
    for (const char* kl : all_kls)
      for (const char* agg : all_aggs) {
        const std::size_t B = 3, T = 7;
        problem p = random_problem(rng, B, T, true);
        for (std::size_t i = 0; i < B * T; ++i) {
          p.lp[i] = -1e4 + (i % 3 == 0 ? 0.0 : -1.0);
          p.old[i] = p.lp[i] + (i % 2 ? 50.0 : -50.0);
          p.ref[i] = p.lp[i] + (i % 4 < 2 ? 50.0 : -50.0);
          p.mask[i] = 1;
        }
        combo c = make_combo(obj, kl, agg, 21);
        // The worst case: no log-ratio clamp at all (TRL). In float, exp(50) * k3 = e^100 overflows
        // float for the importance-weighted KL (as in torch), so that one keeps the default clamp.
        c.cfg.objective.log_ratio_clamp = ulorl::no_limit;
        c.cfg.objective.gspo.seq_log_ratio_max = ulorl::no_limit;
        c.s.bound = c.s.seq_max = oracle::inf;
        INFO(obj << " " << kl << " " << agg);
        for (int prec = 0; prec < 2; ++prec) {
          if (prec == 0) {
            const auto o = run(p, c.cfg);
            REQUIRE(std::isfinite(o.res.loss));
            for (double g : o.grad) REQUIRE(std::isfinite(g));
            // The value too (float64): against the oracle, with a margin for the cancellation of
            // terms of up to e^100 (the sum of the terms' magnitudes).
            const auto ob = to_oracle(p, std::string(kl) != "none");
            std::vector<double> parts;
            const double expect = oracle::loss(c.s, ob, p.lp, p.lp, -1, -1, &parts);
            double magnitude = 0;
            for (double v : parts) magnitude += std::fabs(v);
            REQUIRE(std::isfinite(expect));
            REQUIRE(o.res.loss == Approx(expect).epsilon(1e-10).margin(1e-13 * magnitude));
          } else {
            if (std::string(kl) == "k3_iw")
              c.cfg.objective.log_ratio_clamp = 20, c.cfg.objective.gspo.seq_log_ratio_max = 10;
            auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
            const auto flp = f(p.lp), fold = f(p.old), fadv = f(p.adv), fm = f(p.mask), fref = f(p.ref), fw = f(p.w),
                       fent = f(p.ent);
            std::vector<float> fg(B * T), fge(B * T);
            ulorl::policy_loss_inputs<float, float> in{cview(flp, B, T), cview(fold, B, T), cview(fadv, B, T),
                                                       cview(fm, B, T),  cview(fref, B, T), cview(fw, B, T),
                                                       cview(fent, B, T)};
            const auto r = ulorl::policy_loss(in, mview(fg, B, T), mview(fge, B, T), c.cfg);
            REQUIRE(std::isfinite(r.loss));
            for (float g : fg) REQUIRE(std::isfinite(g));
            for (float g : fge) REQUIRE(std::isfinite(g));
          }
          ++runs;
        }
      }
  REQUIRE(runs == 2 * std::size(all_objectives) * std::size(all_kls) * std::size(all_aggs));
}

TEST_CASE("policy_loss: properties - ratio 1 leaves clipping inactive, masked tokens contribute nothing") {
  std::mt19937_64 rng(seed + 5);
  const std::size_t B = 4, T = 11;
  problem p = random_problem(rng, B, T, false);
  p.old = p.lp;  // ratio exactly 1
  for (const char* obj : {"ppo", "ppo_dual", "gspo_own", "gspo_mean", "cispo", "gmpo"}) {
    const combo c = make_combo(obj, "none", "token_mean", 9);
    const auto o = run(p, c.cfg);
    INFO(obj);
    REQUIRE(o.res.metrics.clipped == 0);
    REQUIRE(o.res.metrics.clipped_low + o.res.metrics.clipped_high + o.res.metrics.dual_clipped == 0);
    REQUIRE(o.res.metrics.ratio_min == 1.0);
    REQUIRE(o.res.metrics.ratio_max == 1.0);
    if (std::string(obj) == "ppo" || std::string(obj) == "ppo_dual")  // unclipped: gradient is -A w
      for (std::size_t i = 0; i < B * T; ++i)
        REQUIRE(o.grad[i] == Approx(-p.adv[i] * p.mask[i] * 1.5 / 9).margin(1e-15));
  }
  // Changing masked tokens (values of any size) changes nothing.
  const problem q0 = random_problem(rng, B, T, true);
  for (const char* obj : {"ppo_dual", "gspo_mean", "gspo_own", "cispo", "gmpo", "sapo", "pg"}) {
    const combo c = make_combo(obj, "k3", "seq_mean", 3);
    const auto a = run(q0, c.cfg);
    problem q = q0;
    for (std::size_t i = 0; i < B * T; ++i)
      if (q.mask[i] == 0) q.lp[i] += 30, q.old[i] -= 7, q.adv[i] = 1e3, q.ref[i] = -1e3, q.w[i] = 9, q.ent[i] = 1e4;
    const auto b = run(q, c.cfg);
    INFO(obj);
    REQUIRE(a.res.loss == b.res.loss);
    REQUIRE(a.grad == b.grad);
    for (std::size_t i = 0; i < B * T; ++i)
      if (q.mask[i] == 0) REQUIRE(b.grad[i] == 0.0);
  }
}

TEST_CASE("policy_token_loss: the per-token API matches the batch function") {
  std::mt19937_64 rng(seed + 6);
  const std::size_t B = 2, T = 9;
  const problem p = random_problem(rng, B, T, true);
  combo c = make_combo("ppo_dual", "k3_iw", "token_mean", 1.0);
  c.cfg.normalizer.scale = 1.0;
  const auto o = run(p, c.cfg);
  const auto tp = ulorl::make_token_loss_params<double>(c.cfg);
  double total = 0;
  for (std::size_t i = 0; i < B * T; ++i) {
    const auto r = ulorl::policy_token_loss(p.lp[i], p.old[i], p.ref[i], p.adv[i], p.w[i], p.ent[i], tp);
    if (p.mask[i] != 0) {
      total += r.loss;
      REQUIRE(o.grad[i] == Approx(r.dlogp).epsilon(1e-15).margin(1e-300));
    }
  }
  REQUIRE(o.res.loss == Approx(total).epsilon(1e-13));
}

namespace {

//! Runs policy_loss on unit-stride rows (the vectorised fast path) and on the same data
//! interleaved with junk (column stride 2: the generic view loop) and compares everything.
template <class T, class M>
void fast_vs_generic(std::mt19937_64& rng, std::size_t B, std::size_t Tn, const ulorl::policy_loss_config& cfg,
                     bool weights, bool entropy, double tol) {
  const auto p = loss_paths::random_problem(rng, B, Tn);
  const auto r = loss_paths::run_both<T, M>(p, cfg, weights, entropy);
  REQUIRE(r.generic.gaps_untouched);
  loss_compare::require_same_paths(r.fast, r.generic, p, tol, entropy);
}

}  // namespace

TEST_CASE("policy_loss: the vectorised unit-stride path equals the generic strided path") {
  std::mt19937_64 rng(seed + 11);
  std::printf("fast vs generic seed %llu\n", static_cast<unsigned long long>(seed + 11));
  const std::size_t lengths[] = {1, 3, 47, 1023};
  int k = 0;
  for (const char* obj : {"ppo", "ppo_dual", "ppo_delta", "cispo", "sapo", "pg"})
    for (const char* kl : {"none", "k1", "abs", "k2", "k3", "k3_st", "k3_iw"})
      for (const char* agg : {"token", "seq_mean"}) {
        auto c = make_combo(obj, kl, agg, 37.0);
        const bool weights = (k & 1) != 0, entropy = (k & 2) != 0;
        if (!entropy) c.cfg.entropy_coef = 0;
        const std::size_t Tn = lengths[k % 4], B = Tn > 100 ? 2 : 5;
        ++k;
        INFO(obj << " " << kl << " " << agg << " T=" << Tn << " weights=" << weights << " entropy=" << entropy);
        fast_vs_generic<double, double>(rng, B, Tn, c.cfg, weights, entropy, 1e-12);
        fast_vs_generic<double, std::uint8_t>(rng, B, Tn, c.cfg, weights, entropy, 1e-12);
        fast_vs_generic<float, std::uint8_t>(rng, B, Tn, c.cfg, weights, entropy, 2e-5);
        fast_vs_generic<float, bool>(rng, B, Tn, c.cfg, weights, entropy, 2e-5);
        fast_vs_generic<float, float>(rng, B, Tn + 2, c.cfg, weights, entropy, 2e-5);
      }
}

TEST_CASE(
    "policy_loss: rows at every alignment (the kernel's peel) equal the strided path and write only their tokens") {
  // Under the sanitisers an access outside the arrays is an error as well.
  std::mt19937_64 rng(seed + 12);
  const int runs = loss_compare::require_every_alignment(
      rng, "default build", [](const loss_paths::problem& p, const ulorl::policy_loss_config& cfg, int t, bool full) {
        switch (t) {
          case 0:
            return loss_paths::run_both<double, double>(p, cfg, full, full);
          case 1:
            return loss_paths::run_both<double, std::uint8_t>(p, cfg, full, full);
          case 2:
            return loss_paths::run_both<float, std::uint8_t>(p, cfg, full, full);
          default:
            return loss_paths::run_both<float, float>(p, cfg, full, full);
        }
      });
  std::printf("rows at every alignment: %d runs\n", runs);
}

TEST_CASE(
    "policy_loss: metrics equal an independent float64 reference (clip fractions, approx KL, ratio, KL, entropy)") {
  // Reference written from the definitions in docs/losses.md §6 (not from the kernel): tokens are
  // drawn from the old policy, r = exp(clamp(logp - old)), so the k3 estimate of KL(old || new) is
  // (r - 1) - log r (Schulman's "approx KL", mean zero bias under the sampling distribution).
  std::mt19937_64 rng(seed + 23);
  std::printf("metrics reference seed %llu\n", static_cast<unsigned long long>(seed + 23));
  for (const std::size_t Tn : {std::size_t{1}, std::size_t{17}, std::size_t{300}}) {
    problem p = random_problem(rng, 7, Tn, false);
    std::fill(p.mask.begin() + 2 * static_cast<std::ptrdiff_t>(Tn),
              p.mask.begin() + 3 * static_cast<std::ptrdiff_t>(Tn), 0.0);  // an empty row
    auto c = make_combo("ppo_dual", "k3", "token", 50.0);
    const auto out = run(p, c.cfg);
    const auto& m = out.res.metrics;
    double n = 0, clip = 0, low = 0, high = 0, dual = 0, k1 = 0, k1c = 0, k3 = 0, rs = 0, kl = 0, ent = 0;
    double rmin = oracle::inf, rmax = -oracle::inf;
    for (std::size_t i = 0; i < p.B * Tn; ++i) {
      if (p.mask[i] == 0) continue;
      const double x = p.lp[i] - p.old[i], xc = std::clamp(x, -20.0, 20.0), r = std::exp(xc), a = p.adv[i];
      const double rc = std::clamp(r, 0.8, 1.28);
      const double l1 = -a * r, l2 = -a * rc, l3 = -a * 3.0;
      n += 1;
      clip += l2 > l1;
      low += r < 0.8 && a < 0;
      high += r > 1.28 && a > 0;
      dual += a < 0 && std::max(l1, l2) > l3;
      k1 += -x, k1c += -xc;
      k3 += (r - 1) - xc;
      rs += r, rmin = std::min(rmin, r), rmax = std::max(rmax, r);
      const double u = std::clamp(p.ref[i] - p.lp[i], -1.5, 1.5);
      kl += std::clamp(std::expm1(u) - u, -1.2, 1.2);
      ent += p.ent[i];
    }
    // Rows and sequences (rows with at least one valid token), counted from the mask.
    double seqs = 0;
    for (std::size_t b = 0; b < p.B; ++b)
      seqs += std::any_of(p.mask.begin() + static_cast<std::ptrdiff_t>(b * Tn),
                          p.mask.begin() + static_cast<std::ptrdiff_t>((b + 1) * Tn), [](double v) { return v != 0; });
    INFO("T = " << Tn << ", valid tokens " << n << ", sequences " << seqs);
    const auto near = [](double got, double want) {
      return std::fabs(got - want) <= 1e-12 * std::max(1.0, std::fabs(want));
    };
    REQUIRE(m.tokens == n);
    CHECK(m.rows == static_cast<double>(p.B));
    CHECK(m.sequences == seqs);
    CHECK(m.clipped == clip);
    CHECK(m.clipped_low == low);
    CHECK(m.clipped_high == high);
    CHECK(m.dual_clipped == dual);
    CHECK(near(m.neg_log_ratio, k1));
    CHECK(near(m.neg_log_ratio_clamped, k1c));
    CHECK(near(m.approx_kl_k3, k3));
    CHECK(near(m.ratio_sum, rs));
    if (n > 0) CHECK((m.ratio_min == rmin && m.ratio_max == rmax));
    CHECK(near(m.kl_sum, kl));
    CHECK(near(m.entropy_sum, ent));
  }
}

TEST_CASE("policy_loss: check_values = false skips the value scans, nothing else") {
  std::mt19937_64 rng(seed + 29);
  std::printf("check_values seed %llu\n", static_cast<unsigned long long>(seed + 29));
  const std::size_t B = 4, Tn = 37;
  const problem p = random_problem(rng, B, Tn, false);
  auto c = make_combo("ppo", "k3", "token", 60.0);
  c.cfg.entropy_coef = 0;
  const auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  std::vector<float> lp = f(p.lp), old = f(p.old), adv = f(p.adv), ref = f(p.ref);
  std::vector<std::uint8_t> mask(p.mask.begin(), p.mask.end());
  const auto run_f = [&](bool check, std::vector<float>& grad) {
    ulorl::policy_loss_inputs<float, std::uint8_t> in{cview(lp, B, Tn), cview(old, B, Tn), cview(adv, B, Tn),
                                                      cview(mask, B, Tn), cview(ref, B, Tn)};
    auto cfg = c.cfg;
    cfg.check_values = check;
    grad.assign(B * Tn, -7.0f);
    return ulorl::policy_loss(in, mview(grad, B, Tn), cfg);
  };
  std::vector<float> g1, g2;
  // Valid input: the same computation, bit for bit.
  const auto r1 = run_f(true, g1), r2 = run_f(false, g2);
  CHECK(r1.loss == r2.loss);
  CHECK(r1.metrics.approx_kl_k3 == r2.metrics.approx_kl_k3);
  CHECK(g1 == g2);
  // Shapes are still checked.
  {
    ulorl::policy_loss_inputs<float, std::uint8_t> in{cview(lp, B, Tn), cview(old, B, Tn - 1), cview(adv, B, Tn),
                                                      cview(mask, B, Tn), cview(ref, B, Tn)};
    auto cfg = c.cfg;
    cfg.check_values = false;
    std::vector<float> g(B * Tn);
    CHECK_THROWS_AS(ulorl::policy_loss(in, mview(g, B, Tn), cfg), ulorl::error);
  }
  // A NaN in a valid token: thrown with the check, propagated into the loss without it (the
  // gradient follows torch's clamp rule: a NaN argument is outside every clamp, so the clamped
  // terms pass no gradient and the token's derivative may be finite).
  std::size_t k = 0;
  while (mask[k] == 0) ++k;
  lp[k] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(run_f(true, g1), ulorl::error);
  const auto r3 = run_f(false, g2);
  CHECK(std::isnan(r3.loss));
  CHECK(std::isnan(r3.metrics.neg_log_ratio));
  lp[k] = static_cast<float>(p.lp[k]);
  // A mask value of 2 counts as a valid token without the check.
  mask[k] = 2;
  CHECK_THROWS_AS(run_f(true, g1), ulorl::error);
  const auto r4 = run_f(false, g2);
  CHECK(r4.loss == r1.loss);
  CHECK(r4.metrics.tokens == r1.metrics.tokens);
}

namespace {

//! Calls the body on single rows in reverse order: a row must not depend on which rows ran before.
struct reverse_executor {
  template <class Body>
  void operator()(std::size_t n, Body&& body) const {
    for (std::size_t i = n; i-- > 0;) body(i, i + 1);
  }
};

template <class T, class Exec>
run_out run_with(const problem& p, const ulorl::policy_loss_config& cfg, const Exec& exec) {
  auto cast = [](const std::vector<double>& v) { return std::vector<T>(v.begin(), v.end()); };
  const auto lp = cast(p.lp), old = cast(p.old), adv = cast(p.adv), ref = cast(p.ref), w = cast(p.w), ent = cast(p.ent);
  std::vector<std::uint8_t> mask(p.mask.begin(), p.mask.end());
  std::vector<T> grad(p.B * p.T, T(-7)), gent(p.B * p.T, T(-7));
  ulorl::policy_loss_inputs<T, std::uint8_t> in{cview(lp, p.B, p.T), cview(old, p.B, p.T), cview(adv, p.B, p.T),
                                                cview(mask, p.B, p.T)};
  in.ref_log_prob = cview(ref, p.B, p.T);
  in.weights = cview(w, p.B, p.T);
  in.entropy = cview(ent, p.B, p.T);
  run_out o;
  o.res = ulorl::policy_loss(in, mview(grad, p.B, p.T), mview(gent, p.B, p.T), cfg, exec);
  o.grad.assign(grad.begin(), grad.end());
  o.gent.assign(gent.begin(), gent.end());
  return o;
}

//! Bitwise equality (NaN-free inputs): memcmp of the doubles.
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void require_identical(const run_out& a, const run_out& b) {
  REQUIRE(same_bits(a.res.loss, b.res.loss));
  REQUIRE(same_bits(a.res.pg_loss, b.res.pg_loss));
  REQUIRE(same_bits(a.res.kl_loss, b.res.kl_loss));
  REQUIRE(same_bits(a.res.entropy_loss, b.res.entropy_loss));
  const auto &m = a.res.metrics, &n = b.res.metrics;
  for (auto f : {&ulorl::loss_metrics::tokens, &ulorl::loss_metrics::sequences, &ulorl::loss_metrics::rows,
                 &ulorl::loss_metrics::clipped, &ulorl::loss_metrics::clipped_low, &ulorl::loss_metrics::clipped_high,
                 &ulorl::loss_metrics::dual_clipped, &ulorl::loss_metrics::neg_log_ratio,
                 &ulorl::loss_metrics::neg_log_ratio_clamped, &ulorl::loss_metrics::approx_kl_k3,
                 &ulorl::loss_metrics::ratio_sum, &ulorl::loss_metrics::ratio_min, &ulorl::loss_metrics::ratio_max,
                 &ulorl::loss_metrics::kl_sum, &ulorl::loss_metrics::entropy_sum, &ulorl::loss_metrics::seq_clipped_low,
                 &ulorl::loss_metrics::seq_clipped_high, &ulorl::loss_metrics::seq_clipped_region})
    REQUIRE(same_bits(m.*f, n.*f));
  REQUIRE(a.grad.size() == b.grad.size());
  for (std::size_t i = 0; i < a.grad.size(); ++i) REQUIRE(same_bits(a.grad[i], b.grad[i]));
  for (std::size_t i = 0; i < a.gent.size(); ++i) REQUIRE(same_bits(a.gent[i], b.gent[i]));
}

}  // namespace

TEST_CASE("policy_loss: every executor and thread count gives the same bits as the calling thread") {
  std::mt19937_64 rng(seed + 23);
  std::printf("executors seed %llu\n", static_cast<unsigned long long>(seed + 23));
  int k = 0;
  for (const char* obj : {"ppo", "ppo_dual", "ppo_delta", "cispo", "sapo", "pg", "gspo_own", "gspo_mean", "gmpo"})
    for (const char* kl : {"none", "k3", "k3_iw"})
      for (const char* agg : {"token", "seq_mean"}) {
        const auto c = make_combo(obj, kl, agg, 301.0);
        const std::size_t B = 1 + static_cast<std::size_t>(k % 13), Tn = 1 + static_cast<std::size_t>((k * 37) % 91);
        const auto p = random_problem(rng, B, Tn, (k & 1) != 0);
        ++k;
        INFO(obj << " " << kl << " " << agg << " B=" << B << " T=" << Tn);
        const auto f0 = run_with<float>(p, c.cfg, ulorl::sequential_executor{});
        const auto d0 = run_with<double>(p, c.cfg, ulorl::sequential_executor{});
        REQUIRE(f0.res.metrics.rows == static_cast<double>(B));
        for (unsigned threads : {2u, 3u, 7u}) {
          require_identical(f0, run_with<float>(p, c.cfg, ulorl::thread_executor{threads}));
          require_identical(d0, run_with<double>(p, c.cfg, ulorl::thread_executor{threads}));
        }
        require_identical(f0, run_with<float>(p, c.cfg, reverse_executor{}));
        require_identical(d0, run_with<double>(p, c.cfg, reverse_executor{}));
      }
}

TEST_CASE("policy_loss: on an executor, the value scan still finds every bad value, names it and writes nothing") {
  // The scan of check_values runs on the executor (rows split like the loss's); a bad value in any
  // row, seen by whichever block, must stop the call before anything is written.
  std::mt19937_64 rng(seed + 31);
  const std::size_t B = 7, Tn = 37;
  const problem p0 = random_problem(rng, B, Tn, true);
  const auto c = make_combo("ppo", "k3", "token", 100.0);
  auto expect = [&](const problem& p, const char* argument, std::size_t index, auto exec) {
    std::vector<float> lp(p.lp.begin(), p.lp.end()), old(p.old.begin(), p.old.end()), adv(p.adv.begin(), p.adv.end());
    std::vector<float> ref(p.ref.begin(), p.ref.end()), w(p.w.begin(), p.w.end()), ent(p.ent.begin(), p.ent.end());
    std::vector<std::uint8_t> mask(p.mask.begin(), p.mask.end());
    std::vector<float> g(B * Tn, 42.0f), ge(B * Tn, 43.0f);
    ulorl::policy_loss_inputs<float, std::uint8_t> in{cview(lp, B, Tn),   cview(old, B, Tn), cview(adv, B, Tn),
                                                      cview(mask, B, Tn), cview(ref, B, Tn), cview(w, B, Tn),
                                                      cview(ent, B, Tn)};
    INFO(argument << "[" << index << "]");
    try {
      (void)ulorl::policy_loss(in, mview(g, B, Tn), mview(ge, B, Tn), c.cfg, exec);
      FAIL("no error");
    } catch (const ulorl::error& e) {
      REQUIRE(e.argument() == argument);
      REQUIRE(e.index() == static_cast<std::int64_t>(index));
    }
    REQUIRE(std::all_of(g.begin(), g.end(), [](float x) { return x == 42.0f; }));
    REQUIRE(std::all_of(ge.begin(), ge.end(), [](float x) { return x == 43.0f; }));
  };
  for (const std::size_t row : {std::size_t{0}, std::size_t{3}, B - 1})
    for (const std::size_t t : {std::size_t{0}, std::size_t{17}, Tn - 1}) {
      const std::size_t i = row * Tn + t;
      problem p = p0;
      p.ref[i] = std::nan("");
      expect(p, "ref_log_prob", i, ulorl::thread_executor{3});
      expect(p, "ref_log_prob", i, reverse_executor{});
      p = p0;
      p.w[i] = INFINITY;
      expect(p, "weights", i, ulorl::thread_executor{2});
      p = p0;
      p.mask[i] = 2;
      expect(p, "mask", i, ulorl::thread_executor{7});
      expect(p, "mask", i, reverse_executor{});
    }
}

TEST_CASE("policy_loss rejects an empty batch (B = 0), padded and packed") {
  const auto c = make_combo("ppo", "k3", "token", 1.0);
  std::vector<double> none;
  const auto empty_padded =
      ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(none.data(), 0, 5));
  const auto out_padded = ulorl::token_view<double>::padded(ulorl::matrix_view<double>(none.data(), 0, 5));
  ulorl::policy_loss_inputs<double, double> in{empty_padded, empty_padded, empty_padded, empty_padded,
                                               empty_padded, {},           empty_padded};
  try {
    (void)ulorl::policy_loss(in, out_padded, out_padded, c.cfg);
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "policy_loss");
    CHECK(e.argument() == "log_prob");
    CHECK(std::string(e.what()).find("empty batch") != std::string::npos);
  }
  const std::vector<std::int64_t> offsets{0};
  const auto empty_packed =
      ulorl::packed(ulorl::vector_view<const double>(none.data(), 0), std::span<const std::int64_t>(offsets));
  const auto out_packed =
      ulorl::packed(ulorl::vector_view<double>(none.data(), 0), std::span<const std::int64_t>(offsets));
  ulorl::policy_loss_inputs<double, double> pk{empty_packed, empty_packed, empty_packed, empty_packed,
                                               empty_packed, {},           empty_packed};
  CHECK_THROWS_WITH(ulorl::policy_loss(pk, out_packed, out_packed, c.cfg), Catch::Contains("empty batch"));
  // Rows without valid tokens are not an empty batch: B = 2, T = 0 is valid.
  const auto rows_no_tokens =
      ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(none.data(), 2, 0));
  const auto out_no_tokens = ulorl::token_view<double>::padded(ulorl::matrix_view<double>(none.data(), 2, 0));
  ulorl::policy_loss_inputs<double, double> nt{
      rows_no_tokens, rows_no_tokens, rows_no_tokens, rows_no_tokens, rows_no_tokens, {}, rows_no_tokens};
  CHECK(ulorl::policy_loss(nt, out_no_tokens, out_no_tokens, c.cfg).loss == 0.0);
}

TEST_CASE("policy_loss rejects gradient outputs whose strides alias distinct tokens") {
  std::mt19937_64 rng(seed + 41);
  const std::size_t B = 3, Tn = 4;
  const problem p = random_problem(rng, B, Tn, false);
  auto c = make_combo("ppo", "k3", "token", 10.0);
  c.cfg.entropy_coef = 0.01;
  ulorl::policy_loss_inputs<double, double> in{cview(p.lp, B, Tn),   cview(p.old, B, Tn), cview(p.adv, B, Tn),
                                               cview(p.mask, B, Tn), cview(p.ref, B, Tn), {},
                                               cview(p.ent, B, Tn)};
  std::vector<double> g(B * Tn, 42.0), ge(B * Tn, 43.0);
  const auto untouched = [&] {
    REQUIRE(std::all_of(g.begin(), g.end(), [](double x) { return x == 42.0; }));
    REQUIRE(std::all_of(ge.begin(), ge.end(), [](double x) { return x == 43.0; }));
  };
  const auto padded = [](std::vector<double>& v, std::ptrdiff_t rs, std::ptrdiff_t cs) {
    return ulorl::token_view<double>::padded(ulorl::matrix_view<double>(v.data(), 3, 4, rs, cs));
  };
  // Column stride 0: every token of a row is one element.
  try {
    (void)ulorl::policy_loss(in, padded(g, 4, 0), mview(ge, B, Tn), c.cfg);
    FAIL("no error");
  } catch (const ulorl::error& e) {
    CHECK(e.function() == "policy_loss");
    CHECK(e.argument() == "grad_log_prob");
    CHECK(std::string(e.what()).find("overlap") != std::string::npos);
  }
  untouched();
  CHECK_THROWS_WITH(ulorl::policy_loss(in, padded(g, 0, 1), mview(ge, B, Tn), c.cfg),
                    Catch::Contains("'grad_log_prob'"));  // every row is row 0
  CHECK_THROWS_WITH(ulorl::policy_loss(in, padded(g, 2, 1), mview(ge, B, Tn), c.cfg),
                    Catch::Contains("'grad_log_prob'"));  // rows overlap
  CHECK_THROWS_WITH(ulorl::policy_loss(in, mview(g, B, Tn), padded(ge, 4, 0), c.cfg),
                    Catch::Contains("'grad_entropy'"));
  // Both outputs on the same buffer.
  CHECK_THROWS_WITH(ulorl::policy_loss(in, mview(g, B, Tn), mview(g, B, Tn), c.cfg),
                    Catch::Contains("'grad_entropy'") && Catch::Contains("'grad_log_prob'"));
  // Packed with stride 0.
  const std::vector<std::int64_t> off{0, 4, 8, 12};
  const auto pk = [&](const std::vector<double>& v) {
    return ulorl::packed(ulorl::vector_view<const double>(v.data(), 12), std::span<const std::int64_t>(off));
  };
  ulorl::policy_loss_inputs<double, double> inp{pk(p.lp), pk(p.old), pk(p.adv), pk(p.mask), pk(p.ref), {}, pk(p.ent)};
  const auto gp = ulorl::packed(ulorl::vector_view<double>(ge.data(), 12), std::span<const std::int64_t>(off));
  CHECK_THROWS_WITH(
      ulorl::policy_loss(inp,
                         ulorl::packed(ulorl::vector_view<double>(g.data(), 12, 0), std::span<const std::int64_t>(off)),
                         gp, c.cfg),
      Catch::Contains("'grad_log_prob'"));
  untouched();
  // Column-major (transposed) outputs address distinct tokens and are fine.
  (void)ulorl::policy_loss(in, padded(g, 1, 3), padded(ge, 1, 3), c.cfg);
  CHECK(std::any_of(g.begin(), g.end(), [](double x) { return x != 42.0; }));
}

// ---- an absent mask: every token valid -----------------------------------------------------------

namespace {

bool same_bits(const void* a, const void* b, std::size_t n) { return std::memcmp(a, b, n) == 0; }

//! The problem's arrays as element type T in one layout: padded [B, T] or packed (row b's first
//! len[b] tokens), unit-stride or every array at stride 2.
template <class T, class M>
struct laid_out {
  std::size_t B = 0, Tn = 0, n = 0;
  std::ptrdiff_t s = 1;
  bool packed = false;
  std::vector<std::int64_t> off;
  std::vector<T> lp, old, adv, ref, w, ent;
  std::unique_ptr<M[]> ones;  // not std::vector: M may be bool
  laid_out(const problem& p, const std::vector<std::size_t>& len, bool packed_layout, bool strided)
      : B(p.B), Tn(p.T), s(strided ? 2 : 1), packed(packed_layout) {
    off.push_back(0);
    for (std::size_t b = 0; b < B; ++b) off.push_back(off.back() + static_cast<std::int64_t>(packed ? len[b] : Tn));
    n = static_cast<std::size_t>(off.back());
    const auto lay = [&](const std::vector<double>& v, std::vector<T>& out) {
      out.assign(n * static_cast<std::size_t>(s), T(-7));
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = 0; t < static_cast<std::size_t>(off[b + 1] - off[b]); ++t)
          out[(static_cast<std::size_t>(off[b]) + t) * static_cast<std::size_t>(s)] = static_cast<T>(v[b * Tn + t]);
    };
    lay(p.lp, lp), lay(p.old, old), lay(p.adv, adv), lay(p.ref, ref), lay(p.ent, ent);
    if (!p.w.empty()) lay(p.w, w);
    ones = std::make_unique<M[]>(n * static_cast<std::size_t>(s) + 1);
    std::fill_n(ones.get(), n * static_cast<std::size_t>(s), M(1));
  }
  template <class U>
  ulorl::token_view<U> view(U* data) const {
    if (packed)
      return ulorl::token_view<U>::packed(ulorl::vector_view<U>(data, n, s), std::span<const std::int64_t>(off));
    return ulorl::token_view<U>::padded(ulorl::matrix_view<U>(data, B, Tn, static_cast<std::ptrdiff_t>(Tn) * s, s));
  }
  template <class U>
  ulorl::token_view<const U> cv(const std::vector<U>& v) const {
    return v.empty() ? ulorl::token_view<const U>{} : view<const U>(v.data());
  }
  [[nodiscard]] ulorl::token_view<const M> all_ones() const { return view<const M>(ones.get()); }
  [[nodiscard]] ulorl::policy_loss_inputs<T, M> inputs(ulorl::token_view<const M> m) const {
    return {cv(lp), cv(old), cv(adv), m, cv(ref), cv(w), cv(ent)};
  }
};

struct loss_run {
  ulorl::policy_loss_result res;
  std::vector<double> grad, gent;  // as double, for the comparison
};

template <class T, class M, class Run>
loss_run run_layout(const laid_out<T, M>& d, Run&& run) {
  std::vector<T> g(d.n * static_cast<std::size_t>(d.s), T(42)), ge(d.n * static_cast<std::size_t>(d.s), T(43));
  loss_run r;
  r.res = run(d.template view<T>(g.data()), d.template view<T>(ge.data()));
  r.grad.assign(g.begin(), g.end());
  r.gent.assign(ge.begin(), ge.end());
  return r;
}

void require_same_bits(const loss_run& a, const loss_run& b) {
  REQUIRE(same_bits(&a.res.loss, &b.res.loss, sizeof(double)));
  REQUIRE(same_bits(&a.res.pg_loss, &b.res.pg_loss, sizeof(double)));
  REQUIRE(same_bits(&a.res.kl_loss, &b.res.kl_loss, sizeof(double)));
  REQUIRE(same_bits(&a.res.entropy_loss, &b.res.entropy_loss, sizeof(double)));
  REQUIRE(same_bits(&a.res.metrics, &b.res.metrics, sizeof(ulorl::loss_metrics)));
  REQUIRE(a.grad.size() == b.grad.size());
  REQUIRE(same_bits(a.grad.data(), b.grad.data(), a.grad.size() * sizeof(double)));
  REQUIRE(same_bits(a.gent.data(), b.gent.data(), a.gent.size() * sizeof(double)));
}

//! policy_loss with an absent mask against an explicit all-ones mask: the same bits (loss parts,
//! every metric, both gradients), in the layout `d`.
template <class T, class M>
void require_absent_is_all_ones(const laid_out<T, M>& d, const ulorl::policy_loss_config& cfg) {
  const auto grad_ent = [&](ulorl::token_view<T> ge) { return cfg.entropy_coef != 0.0 ? ge : ulorl::token_view<T>{}; };
  const auto ones = run_layout(d, [&](ulorl::token_view<T> g, ulorl::token_view<T> ge) {
    return ulorl::policy_loss(d.inputs(d.all_ones()), g, grad_ent(ge), cfg);
  });
  const auto absent = run_layout(d, [&](ulorl::token_view<T> g, ulorl::token_view<T> ge) {
    return ulorl::policy_loss(d.inputs({}), g, grad_ent(ge), cfg);
  });
  require_same_bits(absent, ones);
  REQUIRE(absent.res.metrics.tokens == static_cast<double>(d.n));
  // The executor folds rows in the same order: the same bits too.
  const auto threaded = run_layout(d, [&](ulorl::token_view<T> g, ulorl::token_view<T> ge) {
    return ulorl::policy_loss(d.inputs({}), g, grad_ent(ge), cfg, ulorl::thread_executor{3});
  });
  require_same_bits(threaded, ones);
}

template <class T, class M>
void absent_mask_cases(std::uint64_t s) {
  std::mt19937_64 rng(s);
  INFO("seed " << s);
  const std::size_t B = 5, Tn = 37;
  std::uniform_int_distribution<std::size_t> ul(0, Tn);
  for (const char* obj : {"ppo", "ppo_dual", "cispo", "sapo", "pg", "gspo_own", "gspo_mean", "gmpo"})
    for (const char* kl : {"none", "k3", "k2_st"})
      for (const char* agg : {"token", "seq_mean"})
        for (int form = 0; form < 3; ++form) {  // lean, weighted, general (entropy)
          const problem p = random_problem(rng, B, Tn, form == 1);
          std::vector<std::size_t> len(B);
          for (auto& l : len) l = ul(rng);
          len[1] = 0;  // an empty packed row
          auto c = make_combo(obj, kl, agg, 40.0);
          if (form != 2) c.cfg.entropy_coef = 0.0;
          for (const bool packed : {false, true})
            for (const bool strided : {false, true})
              for (const bool check : {true, false}) {
                INFO(obj << " " << kl << " " << agg << " form " << form << (packed ? " packed" : " padded")
                         << (strided ? " strided" : "") << (check ? "" : " unchecked"));
                c.cfg.check_values = check;
                require_absent_is_all_ones(laid_out<T, M>(p, len, packed, strided), c.cfg);
              }
        }
}

}  // namespace

TEST_CASE("policy_loss: an absent mask is an all-ones mask, bit for bit, in every path", "[mask]") {
  absent_mask_cases<double, double>(seed + 101);
  absent_mask_cases<double, std::uint8_t>(seed + 102);
  absent_mask_cases<float, std::uint8_t>(seed + 103);
  absent_mask_cases<float, bool>(seed + 104);
}

TEST_CASE("policy_loss: a broadcast mask (stride 0) is read as its values in the vectorised rows", "[mask]") {
  std::mt19937_64 rng(seed + 105);
  const std::size_t B = 6, Tn = 45;
  const problem p = random_problem(rng, B, Tn, false);
  const std::vector<float> row_valid{1, 0, 1, 1, 0, 1};
  std::vector<float> full(B * Tn);
  for (std::size_t b = 0; b < B; ++b) std::fill_n(full.begin() + static_cast<std::ptrdiff_t>(b * Tn), Tn, row_valid[b]);
  for (const char* obj : {"ppo", "gspo_mean"}) {
    auto c = make_combo(obj, "k3", "seq_mean", 20.0);
    const std::vector<std::size_t> len(B, Tn);
    const laid_out<float, float> d(p, len, false, false);
    const auto run_with = [&](ulorl::token_view<const float> m) {
      return run_layout(d, [&](ulorl::token_view<float> g, ulorl::token_view<float> ge) {
        return ulorl::policy_loss(d.inputs(m), g, ge, c.cfg);
      });
    };
    // Row b's mask is row_valid[b] at every token: column stride 0.
    const auto expanded =
        ulorl::token_view<const float>::padded(ulorl::matrix_view<const float>(row_valid.data(), B, Tn, 1, 0));
    require_same_bits(
        run_with(expanded),
        run_with(ulorl::token_view<const float>::padded(ulorl::matrix_view<const float>(full.data(), B, Tn))));
    // A broadcast value other than 0 / 1 is rejected by the value scan, naming the mask, as the same
    // value written out in full is; without the scan it reads as valid (mask != 0) in both forms.
    std::vector<float> row2 = row_valid, full2 = full;
    row2[3] = 2;
    std::fill_n(full2.begin() + static_cast<std::ptrdiff_t>(3 * Tn), Tn, 2.0f);
    const auto expanded2 =
        ulorl::token_view<const float>::padded(ulorl::matrix_view<const float>(row2.data(), B, Tn, 1, 0));
    const auto full2_view =
        ulorl::token_view<const float>::padded(ulorl::matrix_view<const float>(full2.data(), B, Tn));
    CHECK_THROWS_WITH(run_with(expanded2), Catch::Contains("'mask'"));
    CHECK_THROWS_WITH(run_with(full2_view), Catch::Contains("'mask'"));
    c.cfg.check_values = false;
    require_same_bits(run_with(expanded2), run_with(full2_view));
    require_same_bits(run_with(expanded2), run_with(expanded));
  }
}

TEST_CASE("policy_loss: an absent mask lifts the mask's shape requirement only", "[mask][errors]") {
  std::mt19937_64 rng(seed + 106);
  const std::size_t B = 3, Tn = 5;
  const problem p = random_problem(rng, B, Tn, false);
  const auto c = make_combo("ppo", "k3", "token", 10.0);
  std::vector<double> g(B * Tn, 42.0), ge(B * Tn, 43.0);
  ulorl::policy_loss_inputs<double, double> in{
      cview(p.lp, B, Tn), cview(p.old, B, Tn), cview(p.adv, B, Tn), {}, cview(p.ref, B, Tn), {}, cview(p.ent, B, Tn)};
  (void)ulorl::policy_loss(in, mview(g, B, Tn), mview(ge, B, Tn), c.cfg);
  // A given mask must still have log_prob's shape and 0/1 values.
  const std::vector<double> short_mask(B * (Tn - 1), 1.0), bad(B * Tn, 0.5);
  in.mask = cview(short_mask, B, Tn - 1);
  CHECK_THROWS_WITH(ulorl::policy_loss(in, mview(g, B, Tn), mview(ge, B, Tn), c.cfg), Catch::Contains("'mask'"));
  in.mask = cview(bad, B, Tn);
  CHECK_THROWS_WITH(ulorl::policy_loss(in, mview(g, B, Tn), mview(ge, B, Tn), c.cfg), Catch::Contains("'mask'"));
  // The other required inputs stay required.
  in.mask = {};
  in.ref_log_prob = {};
  CHECK_THROWS_WITH(ulorl::policy_loss(in, mview(g, B, Tn), mview(ge, B, Tn), c.cfg),
                    Catch::Contains("'ref_log_prob'"));
}

TEST_CASE("policy_loss rejects a coefficient that the value type rounds to 0 or to inf, and writes nothing",
          "[errors]") {
  // float: 1e-300 rounds to 0 (the term would vanish and grad_entropy stay unwritten), 1e300 to inf.
  const std::size_t B = 2, T = 3;
  std::vector<float> lp(B * T, -1.0f), old(B * T, -1.1f), adv(B * T, 0.5f), mask(B * T, 1.0f), ref(B * T, -1.2f),
      ent(B * T, 0.7f);
  const auto cv = [&](const std::vector<float>& v) {
    return ulorl::token_view<const float>::padded(ulorl::matrix_view<const float>(v.data(), B, T));
  };
  const ulorl::policy_loss_inputs<float, float> in{cv(lp), cv(old), cv(adv), cv(mask), cv(ref), {}, cv(ent)};
  for (const char* arg : {"kl_coef", "entropy_coef"})
    for (const double c : {1e-300, -1e-300, 1e300, -1e300}) {
      ulorl::policy_loss_config cfg;
      cfg.normalizer = {ulorl::agg_mode::token_mean, 6.0, 1.0};
      (std::string_view(arg) == "kl_coef" ? cfg.kl_coef : cfg.entropy_coef) = c;
      std::vector<float> g(B * T, 42.0f), ge(B * T, 43.0f);
      INFO(arg << " = " << c);
      try {
        (void)ulorl::policy_loss(in, ulorl::token_view<float>::padded(ulorl::matrix_view<float>(g.data(), B, T)),
                                 ulorl::token_view<float>::padded(ulorl::matrix_view<float>(ge.data(), B, T)), cfg);
        FAIL("no error");
      } catch (const ulorl::error& e) {
        CHECK(e.argument() == arg);
      }
      CHECK(std::all_of(g.begin(), g.end(), [](float x) { return x == 42.0f; }));
      CHECK(std::all_of(ge.begin(), ge.end(), [](float x) { return x == 43.0f; }));
    }
  // The same coefficients in double are ordinary values.
  std::vector<double> lpd(lp.begin(), lp.end()), oldd(old.begin(), old.end()), advd(adv.begin(), adv.end()),
      maskd(mask.begin(), mask.end()), refd(ref.begin(), ref.end()), entd(ent.begin(), ent.end()), g(B * T), ge(B * T);
  const auto dv = [&](const std::vector<double>& v) {
    return ulorl::token_view<const double>::padded(ulorl::matrix_view<const double>(v.data(), B, T));
  };
  ulorl::policy_loss_config cfg;
  cfg.normalizer = {ulorl::agg_mode::token_mean, 6.0, 1.0};
  cfg.kl_coef = 1e-300, cfg.entropy_coef = 1e-300;
  (void)ulorl::policy_loss(
      ulorl::policy_loss_inputs<double, double>{dv(lpd), dv(oldd), dv(advd), dv(maskd), dv(refd), {}, dv(entd)},
      ulorl::token_view<double>::padded(ulorl::matrix_view<double>(g.data(), B, T)),
      ulorl::token_view<double>::padded(ulorl::matrix_view<double>(ge.data(), B, T)), cfg);
  CHECK(ge[0] == -1e-300 / 6.0);
}

namespace {
//! A float or double [B, T] problem with every token valid and the given advantages / log-ratios.
template <class T>
struct overflow_problem {
  std::size_t B, Tn;
  std::vector<T> lp, old, adv, mask, ref, ent, g, ge;
  overflow_problem(std::size_t b, std::size_t t)
      : B(b),
        Tn(t),
        lp(b * t, T(-1)),
        old(b * t, T(-1)),
        adv(b * t, T(0.5)),
        mask(b * t, T(1)),
        ref(b * t, T(-1)),
        ent(b * t, T(0.5)),
        g(b * t, T(42)),
        ge(b * t, T(43)) {}
  ulorl::token_view<const T> cv(const std::vector<T>& v) const {
    return ulorl::token_view<const T>::padded(ulorl::matrix_view<const T>(v.data(), B, Tn));
  }
  ulorl::policy_loss_result run(const ulorl::policy_loss_config& cfg) {
    const ulorl::policy_loss_inputs<T, T> in{cv(lp), cv(old), cv(adv), cv(mask), cv(ref), {}, cv(ent)};
    return ulorl::policy_loss(in, ulorl::token_view<T>::padded(ulorl::matrix_view<T>(g.data(), B, Tn)),
                              cfg.entropy_coef != 0.0
                                  ? ulorl::token_view<T>::padded(ulorl::matrix_view<T>(ge.data(), B, Tn))
                                  : ulorl::token_view<T>{},
                              cfg);
  }
};
}  // namespace

TEST_CASE("policy_loss: a result beyond the value type's range is an error naming it, never inf",
          "[errors][overflow]") {
  SECTION("float: one advantage of 3e38 at ratio e^0.15 makes its objective and gradient overflow float") {
    overflow_problem<float> p(2, 37);
    p.adv[40] = 3e38f;
    p.lp[40] = -0.85f;  // ratio 1.16 < 1 + eps_high: the unclipped branch, -3e38 * 1.16 = -3.5e38
    ulorl::policy_loss_config cfg;
    cfg.normalizer = {ulorl::agg_mode::token_mean, 74.0, 1.0};
    cfg.objective.eps_high = 0.28;
    try {
      (void)p.run(cfg);
      FAIL("no error");
    } catch (const ulorl::error& e) {
      INFO(e.what());
      CHECK(e.argument() == "grad_log_prob");
      CHECK(e.index() == 40);
      CHECK(std::string(e.what()).find("overflows float32") != std::string::npos);
    }
    CHECK(std::all_of(p.g.begin(), p.g.end(), [](float x) { return x == 0.0f; }));  // cleared, never inf
  }
  SECTION("float: a normaliser scale whose row weight overflows float in the gradient") {
    overflow_problem<float> p(1, 5);
    ulorl::policy_loss_config cfg;
    cfg.normalizer = {ulorl::agg_mode::token_mean, 1.0, 1e39};
    CHECK_THROWS_AS(p.run(cfg), ulorl::error);
  }
  SECTION("double: entropies of 1e308 overflow the entropy loss and its metric sum") {
    overflow_problem<double> p(1, 3);
    std::fill(p.ent.begin(), p.ent.end(), 1e308);
    ulorl::policy_loss_config cfg;
    cfg.normalizer = {ulorl::agg_mode::token_mean, 3.0, 1.0};
    cfg.entropy_coef = 1.0;
    try {
      (void)p.run(cfg);
      FAIL("no error");
    } catch (const ulorl::error& e) {
      INFO(e.what());
      CHECK(e.argument() == "entropy_loss");
      CHECK(std::string(e.what()).find("overflows float64") != std::string::npos);
    }
    CHECK(std::all_of(p.ge.begin(), p.ge.end(), [](double x) { return x == 0.0; }));
  }
  SECTION("double: an entropy coefficient of 1e308 over a normaliser of 1e-10 overflows grad_entropy") {
    overflow_problem<double> p(1, 3);
    ulorl::policy_loss_config cfg;
    cfg.normalizer = {ulorl::agg_mode::token_mean, 1e-10, 1.0};
    cfg.entropy_coef = 1e308;
    try {
      (void)p.run(cfg);
      FAIL("no error");
    } catch (const ulorl::error& e) {
      CHECK(e.argument() == "grad_entropy");
    }
  }
  SECTION("double: log-ratios of -inf in the metrics (old - logp overflows double)") {
    overflow_problem<double> p(1, 2);
    p.lp = {-1e308, -1e308};
    p.old = {1e308, 1e308};
    ulorl::policy_loss_config cfg;
    cfg.normalizer = {ulorl::agg_mode::token_mean, 2.0, 1.0};
    CHECK_THROWS_AS(p.run(cfg), ulorl::error);
  }
}

TEST_CASE("policy_loss: float token terms whose per-lane float sums overflow give the exact double sum", "[overflow]") {
  // Tokens 32 and 96 share a lane and a block of the vector rows for every vector width and peel:
  // their objectives 2e38 + 2e38 overflow a float partial sum, not the row's double sum.
  overflow_problem<float> p(1, 256);
  p.lp = p.old;  // ratio 1
  p.adv[32] = p.adv[96] = -2e38f;
  ulorl::policy_loss_config cfg;
  cfg.normalizer = {ulorl::agg_mode::token_mean, 256.0, 1.0};
  const ulorl::policy_loss_result r = p.run(cfg);
  const double expected = (4e38 + 254 * -0.5) / 256;  // pg = -A: float(2e38) twice, -0.5 elsewhere
  CHECK(std::isfinite(r.loss));
  CHECK(r.pg_loss == Approx((2.0 * static_cast<double>(2e38f) - 254 * 0.5) / 256).epsilon(1e-12));
  CHECK(r.loss == Approx(expected).epsilon(1e-6));
  CHECK(std::all_of(p.g.begin(), p.g.end(), [](float x) { return std::isfinite(x); }));
}

TEST_CASE("policy_loss: check_values = false lets a result overflow (no range check)", "[overflow]") {
  overflow_problem<double> p(1, 2);
  std::fill(p.ent.begin(), p.ent.end(), 1e308);
  ulorl::policy_loss_config cfg;
  cfg.normalizer = {ulorl::agg_mode::token_mean, 2.0, 1.0};
  cfg.entropy_coef = 1.0;
  cfg.check_values = false;
  const ulorl::policy_loss_result r = p.run(cfg);
  CHECK(std::isinf(r.entropy_loss));
}

TEST_CASE(
    "policy_loss: a divisor without a finite reciprocal is rejected (SAPO tau, normaliser, NeMo-RL global counts)",
    "[errors][divisor]") {
  overflow_problem<double> p(1, 3);
  for (const auto& [arg, tp, tn] : {std::tuple<const char*, double, double>{"tau_neg", 1.0, 5e-324},
                                    std::tuple<const char*, double, double>{"tau_pos", 1e-310, 1.05}}) {
    ulorl::policy_loss_config cfg;
    cfg.objective.kind = ulorl::objective_kind::sapo;
    cfg.objective.sapo.tau_pos = tp, cfg.objective.sapo.tau_neg = tn;
    cfg.normalizer = {ulorl::agg_mode::token_mean, 3.0, 1.0};
    try {
      (void)p.run(cfg);
      FAIL("no error");
    } catch (const ulorl::error& e) {
      INFO(e.what());
      CHECK(e.argument() == arg);
      CHECK(std::string(e.what()).find("reciprocal") != std::string::npos);
    }
    CHECK(std::all_of(p.g.begin(), p.g.end(), [](double x) { return x == 42.0; }));
  }
  // float: tau 1e-39 is a double divisor but its reciprocal overflows float32.
  overflow_problem<float> f(1, 3);
  ulorl::policy_loss_config cfg;
  cfg.objective.kind = ulorl::objective_kind::sapo;
  cfg.objective.sapo.tau_pos = 1e-39;
  cfg.normalizer = {ulorl::agg_mode::token_mean, 3.0, 1.0};
  CHECK_THROWS_WITH(f.run(cfg), Catch::Contains("tau_pos") && Catch::Contains("float32"));
  cfg.objective.sapo.tau_pos = 1.0;
  cfg.normalizer = {ulorl::agg_mode::token_mean, 5e-324, 1e-300};  // scale / denominator is finite
  CHECK_THROWS_WITH(f.run(cfg), Catch::Contains("normalizer.denominator"));
  // NeMo-RL's global_valid_toks = 5e-324 as the normaliser and in the logged ratios.
  namespace nemo = ulorl::presets::nemo_rl;
  const nemo::global_counts g{.global_valid_toks = 5e-324};
  CHECK_THROWS_WITH(nemo::normalizer(nemo::clipped_pg_loss_options{}, g, ulorl::batch_counts{3, 1, 1}),
                    Catch::Contains("global_valid_toks"));
  CHECK_THROWS_WITH(nemo::logged_ratios(p.cv(p.lp), p.cv(p.old), p.cv(p.mask), nemo::clipped_pg_loss_options{}, g),
                    Catch::Contains("global_valid_toks"));
  CHECK_NOTHROW(
      nemo::normalizer(nemo::clipped_pg_loss_options{}, nemo::global_counts{.global_valid_toks = 0.0}, {3, 1, 1}));
}
