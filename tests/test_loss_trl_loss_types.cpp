// Tests of TRL's GRPOTrainer loss types beyond PPO clip (golden README §4.5 *(added)*): the
// top-entropy-quantile mask (ulorl/masking/entropy_quantile.hpp), VESPO's sequence weight
// (ulorl/loss/vespo.hpp), and the presets::trl compositions run through ulorl::policy_loss:
// cispo (ratio cap), sapo, vespo (policy gradient weighted by phi), luspo (row weight n_b over
// every position), the top-entropy mask and the vLLM IS ratio as weights, the entropy bonus with
// TRL's normaliser. Each is checked against a float64 oracle written here from TRL's formulas,
// its gradient against central finite differences of that oracle (every KL setting TRL allows:
// none, k3, bias-corrected k3), the token-level modes for partition exactness under the global
// normaliser, and bad inputs for ulorl::error with outputs untouched.
#include <ulorl/loss/entropy.hpp>
#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/loss/vespo.hpp>
#include <ulorl/masking/entropy_quantile.hpp>
#include <ulorl/presets/trl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "catch.hpp"
#include "support/absent_mask.hpp"

namespace {
namespace P = ulorl::presets;
using LT = P::trl::loss_type_kind;

struct problem {
  std::size_t B = 0, T = 0;
  std::vector<double> lp, old, ref, mask, ent, q, adv_tok;
  std::vector<double> adv;  // [B]
  double operator()(const std::vector<double>& v, std::size_t b, std::size_t t) const { return v[b * T + t]; }
};

problem random_problem(std::mt19937_64& rng, std::size_t B, std::size_t T) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<double> n(0.0, 0.25);
  problem p;
  p.B = B, p.T = T;
  const std::size_t N = B * T;
  p.lp.resize(N), p.old.resize(N), p.ref.resize(N), p.mask.resize(N), p.ent.resize(N), p.q.resize(N),
      p.adv_tok.resize(N);
  p.adv.resize(B);
  for (std::size_t b = 0; b < B; ++b) {
    p.adv[b] = (u(rng) < 0.5 ? -1.0 : 1.0) * (0.1 + u(rng));
    const std::size_t len = b == 1 ? 0 : 1 + static_cast<std::size_t>(u(rng) * static_cast<double>(T));  // row 1 empty
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t i = b * T + t;
      p.lp[i] = -0.05 - 2.5 * u(rng);
      p.old[i] = p.lp[i] + n(rng);
      p.ref[i] = p.lp[i] + n(rng);
      p.mask[i] = t < std::min(len, T) ? 1.0 : 0.0;
      p.ent[i] = 0.01 + 3.0 * u(rng);
      p.q[i] = 0.5 + u(rng);
      p.adv_tok[i] = p.adv[b];
    }
  }
  return p;
}

// ---- the float64 oracle: TRL's _compute_loss, written from the golden README's formulas --------

struct mode {
  LT loss_type = LT::dapo;
  double eps = 0.2, eps_high = 0.28;
  double beta = 0.0;
  bool bias_kl = false;
  double tau_pos = 1.0, tau_neg = 1.05;
  double rho = 1.0;           // top-entropy quantile
  bool use_q = false;         // vLLM IS ratio
  double entropy_coef = 0.0;  // bonus
  double items = 0.0;         // num_items_in_batch (0: local N)
  double ga = 1.0;
};

double oracle_theta(const problem& p, double rho) {
  std::vector<double> v;
  for (std::size_t i = 0; i < p.lp.size(); ++i)
    if (p.mask[i] != 0.0) v.push_back(p.ent[i]);
  if (v.empty()) return std::numeric_limits<double>::infinity();
  std::sort(v.begin(), v.end());
  const double pos = (1.0 - rho) * static_cast<double>(v.size() - 1);
  const double fl = std::floor(pos), ce = std::ceil(pos);
  return v[static_cast<std::size_t>(fl)] +
         (pos - fl) * (v[static_cast<std::size_t>(ce)] - v[static_cast<std::size_t>(fl)]);
}

double oracle_phi(const problem& p, const std::vector<double>& lpd, std::size_t b, bool use_q) {
  const double lc = std::log(1e-8);
  double s = 0;
  for (std::size_t t = 0; t < p.T; ++t) {
    const std::size_t i = b * p.T + t;
    s += p.mask[i] * std::min(20.0, std::max(-20.0, lpd[i] - p.old[i]));
    if (use_q) s += p.q[i] > 0 ? std::min(20.0, std::max(lc, std::log(p.q[i]))) : lc;
  }
  const double lw = std::min(20.0, std::max(lc, s));
  const double k = p.adv[b] >= 0 ? 2.0 : 3.0;
  const double lam = std::max(p.adv[b] >= 0 ? 3.0 : 2.0, 1e-4);
  const double phi = std::exp(lam + k * lw - lam * std::exp(lw));
  return std::isfinite(phi) ? phi : 0.0;
}

// The loss as a function of lp; `lpd` holds the values the detached quantities are taken at.
double oracle_loss(const problem& p, const mode& md, const std::vector<double>& lp, const std::vector<double>& lpd,
                   const std::vector<double>& ent) {
  const std::size_t B = p.B, T = p.T;
  double N = 0;
  std::vector<double> nb(B, 0.0);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) nb[b] += p.mask[b * T + t];
  for (double v : nb) N += v;
  const double theta = md.rho < 1.0 ? oracle_theta(p, md.rho) : -1.0;
  double total = 0, me_sum = 0, ent_sum = 0;
  std::vector<double> row(B, 0.0);
  for (std::size_t b = 0; b < B; ++b) {
    const double phi = md.loss_type == LT::vespo ? oracle_phi(p, lpd, b, md.use_q) : 1.0;
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t i = b * T + t;
      const double A = p.adv[b], r = std::exp(lp[i] - p.old[i]), rd = std::exp(lpd[i] - p.old[i]);
      double pt = 0;
      switch (md.loss_type) {
        case LT::cispo:
          pt = -std::min(rd, md.eps_high) * A * lp[i];
          break;
        case LT::sapo: {
          const double tau = A > 0 ? md.tau_pos : md.tau_neg;
          pt = -(1.0 / (1.0 + std::exp(-tau * (r - 1.0)))) * 4.0 / tau * A;
          break;
        }
        case LT::vespo:
          pt = -phi * A * lp[i];
          break;
        default: {  // grpo, bnpo, dr_grpo, dapo, luspo: PPO clip
          const double rc = std::min(1.0 + md.eps_high, std::max(1.0 - md.eps, r));
          pt = -std::min(r * A, rc * A);
        }
      }
      const double E = md.rho < 1.0 ? ((p.mask[i] != 0.0 && p.ent[i] >= theta) ? 1.0 : 0.0) : 1.0;
      const double q = (md.use_q && md.loss_type != LT::vespo) ? p.q[i] : 1.0;
      pt *= E * q;
      if (md.beta != 0.0) {
        const double d = p.ref[i] - lp[i];
        double k = std::exp(d) - d - 1.0;
        if (md.bias_kl) k *= r;
        pt += md.beta * k;
      }
      if (md.loss_type == LT::luspo)
        total += pt * nb[b];  // every position
      else
        row[b] += pt * p.mask[i];
      const double me = p.mask[i] * E;
      me_sum += me, ent_sum += ent[i] * me;
    }
  }
  const double items = md.items > 0 ? md.items : N;
  double loss = 0;
  switch (md.loss_type) {
    case LT::grpo:
    case LT::sapo:
      for (std::size_t b = 0; b < B; ++b) loss += row[b] / std::max(nb[b], 1.0);
      loss /= static_cast<double>(B) * md.ga;
      break;
    case LT::bnpo:
      for (double v : row) loss += v;
      loss /= std::max(N, 1.0) * md.ga;
      break;
    case LT::luspo:
      loss = total / (static_cast<double>(B * T) * md.ga);
      break;
    default:  // dapo, cispo, vespo
      for (double v : row) loss += v;
      loss /= std::max(items, 1.0);
  }
  if (md.entropy_coef != 0.0) {
    const bool dapo_like = md.loss_type == LT::dapo || md.loss_type == LT::cispo || md.loss_type == LT::vespo;
    loss -= md.entropy_coef * ent_sum / (dapo_like ? std::max(items, 1.0) : std::max(me_sum, 1.0) * md.ga);
  }
  return loss;
}

// ---- the library path: presets::trl + masks as weights + policy_loss ---------------------------

struct run_result {
  double loss;
  std::vector<double> grad, grad_ent;
};

ulorl::token_view<const double> view(const std::vector<double>& v, std::size_t B, std::size_t T) {
  return ulorl::padded(ulorl::matrix_view<const double>(v.data(), B, T));
}
ulorl::token_view<double> mview(std::vector<double>& v, std::size_t B, std::size_t T) {
  return ulorl::padded(ulorl::matrix_view<double>(v.data(), B, T));
}

run_result library_loss(const problem& p, const mode& md) {
  const std::size_t B = p.B, T = p.T;
  std::vector<double> w(B * T, 1.0), me = p.mask;
  if (md.rho < 1.0) {
    std::vector<double> scratch(ulorl::entropy_quantile_workspace(view(p.mask, B, T)));
    (void)ulorl::top_entropy_mask(view(p.ent, B, T), view(p.mask, B, T), mview(me, B, T),
                                  ulorl::entropy_quantile_config{.quantile = md.rho}, scratch);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] *= me[i];
  }
  if (md.loss_type == LT::vespo) {
    std::vector<double> phi(B);
    ulorl::vespo_weights(ulorl::vespo_inputs<double>{view(p.lp, B, T), view(p.old, B, T), view(p.mask, B, T), p.adv,
                                                     md.use_q ? view(p.q, B, T) : ulorl::token_view<const double>{}},
                         phi, {});
    for (std::size_t i = 0; i < w.size(); ++i) w[i] *= phi[i / T];
  } else if (md.use_q) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] *= p.q[i];
  }
  std::vector<double> mask = p.mask;
  if (md.loss_type == LT::luspo) {  // every position, row weight n_b
    for (std::size_t b = 0; b < B; ++b) {
      double nb = 0;
      for (std::size_t t = 0; t < T; ++t) nb += p.mask[b * T + t];
      for (std::size_t t = 0; t < T; ++t) w[b * T + t] *= nb;
    }
    std::fill(mask.begin(), mask.end(), 1.0);
  }
  ulorl::policy_loss_inputs<double, double> in{view(p.lp, B, T), view(p.old, B, T), view(p.adv_tok, B, T),
                                               view(mask, B, T)};
  in.ref_log_prob = view(p.ref, B, T);
  in.weights = view(w, B, T);
  const auto counts = ulorl::count_batch(view(p.mask, B, T));
  const P::trl::normalizer_options no{.loss_type = md.loss_type,
                                      .padded_length = T,
                                      .max_completion_length = 0,
                                      .gradient_accumulation_steps = md.ga,
                                      .num_items_in_batch = md.items > 0 ? md.items : counts.tokens};
  ulorl::policy_loss_config cfg;
  cfg.objective = P::trl::objective({.epsilon = md.eps,
                                     .epsilon_high = md.eps_high,
                                     .loss_type = md.loss_type,
                                     .sapo_temperature_pos = md.tau_pos,
                                     .sapo_temperature_neg = md.tau_neg});
  cfg.kl = P::trl::kl({.use_bias_correction_kl = md.bias_kl});
  cfg.kl_coef = md.loss_type == LT::luspo ? 0.0 : md.beta;
  cfg.normalizer = P::trl::normalizer(no, counts);
  run_result r{0.0, std::vector<double>(B * T, 0.0), std::vector<double>(B * T, 0.0)};
  r.loss = ulorl::policy_loss(in, mview(r.grad, B, T), cfg).loss;
  if (md.loss_type == LT::luspo && md.beta != 0.0) {
    // luspo's KL term: every position, weight n_b / (B T GA) (kl_penalty gives it per element).
    std::vector<double> kl(B * T), dkl(B * T);
    ulorl::kl_penalty<double>(view(p.lp, B, T), view(p.ref, B, T), mview(kl, B, T), mview(dkl, B, T), cfg.kl);
    for (std::size_t b = 0; b < B; ++b) {
      double nb = 0;
      for (std::size_t t = 0; t < T; ++t) nb += p.mask[b * T + t];
      const double wr = nb / (static_cast<double>(B * T) * md.ga);
      for (std::size_t t = 0; t < T; ++t)
        r.loss += wr * md.beta * kl[b * T + t], r.grad[b * T + t] += wr * md.beta * dkl[b * T + t];
    }
  }
  if (md.entropy_coef != 0.0) {
    const double me_tokens = ulorl::count_batch(view(me, B, T)).tokens;
    r.loss += ulorl::entropy_loss(view(p.ent, B, T), view(me, B, T), mview(r.grad_ent, B, T), md.entropy_coef,
                                  P::trl::entropy_normalizer(no, counts, me_tokens));
  }
  return r;
}

void check_against_oracle(const problem& p, const mode& md) {
  const auto lib = library_loss(p, md);
  const double ref = oracle_loss(p, md, p.lp, p.lp, p.ent);
  REQUIRE(lib.loss == Approx(ref).epsilon(1e-10).margin(1e-13));
  const double h = 1e-6;
  for (std::size_t i = 0; i < p.lp.size(); ++i) {
    auto up = p.lp, dn = p.lp;
    up[i] += h, dn[i] -= h;
    const double fd = (oracle_loss(p, md, up, p.lp, p.ent) - oracle_loss(p, md, dn, p.lp, p.ent)) / (2 * h);
    INFO("token " << i);
    REQUIRE(lib.grad[i] == Approx(fd).epsilon(1e-5).margin(1e-8));
  }
  if (md.entropy_coef != 0.0)
    for (std::size_t i = 0; i < p.ent.size(); ++i) {
      auto up = p.ent, dn = p.ent;
      up[i] += h, dn[i] -= h;
      const double fd = (oracle_loss(p, md, p.lp, p.lp, up) - oracle_loss(p, md, p.lp, p.lp, dn)) / (2 * h);
      REQUIRE(lib.grad_ent[i] == Approx(fd).epsilon(1e-5).margin(1e-8));
    }
}

struct kl_setting {
  double beta;
  bool bias;
};
constexpr kl_setting kl_settings[] = {{0.0, false}, {0.04, false}, {0.1, true}};

}  // namespace

TEST_CASE("trl loss types match the float64 oracle and finite differences") {
  const std::uint64_t seed = 20250;
  std::printf("test_loss_trl_loss_types seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const std::size_t shapes[][2] = {{1, 5}, {3, 4}, {5, 9}};
  for (auto lt : {LT::cispo, LT::sapo, LT::vespo, LT::luspo, LT::grpo, LT::bnpo, LT::dapo}) {
    for (const auto& ks : kl_settings) {
      if (lt == LT::luspo && ks.bias) continue;  // luspo's KL term runs through kl_penalty (no ratio)
      for (const auto& s : shapes) {
        const problem p = random_problem(rng, s[0], s[1]);
        mode md;
        md.loss_type = lt;
        md.beta = ks.beta, md.bias_kl = ks.bias;
        if (lt == LT::cispo) md.eps_high = 1.15;  // a cap the random ratios cross
        md.ga = lt == LT::luspo ? 2.0 : 1.0;
        INFO("loss_type " << static_cast<int>(lt) << " beta " << ks.beta << " bias " << ks.bias << " B " << s[0]);
        check_against_oracle(p, md);
        md.use_q = true;  // the vLLM IS ratio (vespo: in phi)
        check_against_oracle(p, md);
        if (p.B > 1) {
          md.use_q = false, md.rho = 0.4;  // the top-entropy mask
          check_against_oracle(p, md);
          md.entropy_coef = 0.01;  // the bonus over m E
          check_against_oracle(p, md);
        }
      }
    }
  }
}

TEST_CASE("top_entropy_mask: the linear quantile of the valid entropies, both layouts") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const problem p =
        random_problem(rng, 1 + static_cast<std::size_t>(trial % 5), 1 + static_cast<std::size_t>(trial % 7));
    const std::size_t B = p.B, T = p.T;
    for (double rho : {0.0, 0.2, 0.5, 1.0}) {
      std::vector<double> keep(B * T, -1.0), scratch(B * T);
      const double theta =
          ulorl::top_entropy_mask(view(p.ent, B, T), view(p.mask, B, T), mview(keep, B, T), {.quantile = rho}, scratch);
      const double ref = oracle_theta(p, rho);
      REQUIRE(theta == Approx(ref).epsilon(1e-15));
      for (std::size_t i = 0; i < keep.size(); ++i)
        REQUIRE(keep[i] == ((p.mask[i] != 0.0 && p.ent[i] >= ref) ? 1.0 : 0.0));
      if (rho == 1.0)
        for (std::size_t i = 0; i < keep.size(); ++i) REQUIRE(keep[i] == p.mask[i]);
      // Packed: the valid prefix of each row, offsets[B+1].
      std::vector<double> pe, pm;
      std::vector<std::int64_t> off{0};
      for (std::size_t b = 0; b < B; ++b) {
        for (std::size_t t = 0; t < T; ++t) pe.push_back(p.ent[b * T + t]), pm.push_back(p.mask[b * T + t]);
        off.push_back(static_cast<std::int64_t>(pe.size()));
      }
      std::vector<double> pk(pe.size(), -1.0);
      const auto pev =
          ulorl::token_view<const double>::packed(ulorl::vector_view<const double>(pe.data(), pe.size()), off);
      const auto pmv =
          ulorl::token_view<const double>::packed(ulorl::vector_view<const double>(pm.data(), pm.size()), off);
      const auto pkv = ulorl::token_view<double>::packed(ulorl::vector_view<double>(pk.data(), pk.size()), off);
      REQUIRE(ulorl::entropy_quantile_threshold(pev, pmv, {.quantile = rho}, scratch) == theta);
      (void)ulorl::top_entropy_mask(pev, pmv, pkv, {.quantile = rho}, scratch);
      REQUIRE(pk == keep);
    }
  }
  // No valid token: nothing kept.
  const std::vector<double> e{1.0, 2.0}, m0{0.0, 0.0};
  std::vector<double> k{5.0, 5.0}, scratch;
  (void)ulorl::top_entropy_mask(view(e, 1, 2), view(m0, 1, 2), mview(k, 1, 2), {.quantile = 0.5}, scratch);
  REQUIRE(k == std::vector<double>{0.0, 0.0});
}

TEST_CASE("top_entropy_mask and vespo_weights reject bad input and write nothing") {
  const std::vector<double> e{0.5, 1.0, 2.0}, m{1.0, 1.0, 1.0}, neg{0.5, -1.0, 2.0}, bad_m{1.0, 2.0, 1.0};
  const std::vector<double> nan_e{0.5, std::numeric_limits<double>::quiet_NaN(), 1.0};
  std::vector<double> keep{7.0, 7.0, 7.0}, scratch(3), small(1);
  const auto untouched = [&] { REQUIRE(keep == std::vector<double>{7.0, 7.0, 7.0}); };
  REQUIRE_THROWS_AS(
      ulorl::top_entropy_mask(view(e, 1, 3), view(m, 1, 3), mview(keep, 1, 3), {.quantile = 1.5}, scratch),
      ulorl::error);
  untouched();
  REQUIRE_THROWS_AS(
      ulorl::top_entropy_mask(view(e, 1, 3), view(m, 1, 3), mview(keep, 1, 3), {.quantile = -0.1}, scratch),
      ulorl::error);
  REQUIRE_THROWS_AS(
      ulorl::top_entropy_mask(view(neg, 1, 3), view(m, 1, 3), mview(keep, 1, 3), {.quantile = 0.5}, scratch),
      ulorl::error);
  untouched();
  REQUIRE_THROWS_AS(
      ulorl::top_entropy_mask(view(nan_e, 1, 3), view(m, 1, 3), mview(keep, 1, 3), {.quantile = 0.5}, scratch),
      ulorl::error);
  REQUIRE_THROWS_AS(
      ulorl::top_entropy_mask(view(e, 1, 3), view(bad_m, 1, 3), mview(keep, 1, 3), {.quantile = 0.5}, scratch),
      ulorl::error);
  REQUIRE_THROWS_AS(ulorl::top_entropy_mask(view(e, 1, 3), view(m, 1, 3), mview(keep, 1, 3), {.quantile = 0.5}, small),
                    ulorl::error);
  REQUIRE_THROWS_AS(
      ulorl::top_entropy_mask(view(e, 1, 3), view(m, 3, 1), mview(keep, 1, 3), {.quantile = 0.5}, scratch),
      ulorl::error);
  REQUIRE_THROWS_AS(
      ulorl::top_entropy_mask(view(e, 1, 3), view(m, 1, 3), mview(keep, 3, 1), {.quantile = 0.5}, scratch),
      ulorl::error);
  untouched();

  const std::vector<double> lp{-1.0, -0.5, -2.0}, old{-1.1, -0.4, -2.0}, q_neg{1.0, -0.5, 1.0};
  const std::vector<double> adv{1.0}, adv2{1.0, 2.0};
  std::vector<double> phi{9.0};
  REQUIRE_THROWS_AS(
      ulorl::vespo_weights(
          ulorl::vespo_inputs<double>{view(lp, 1, 3), view(old, 1, 3), view(m, 1, 3), adv, view(q_neg, 1, 3)}, phi, {}),
      ulorl::error);
  REQUIRE_THROWS_AS(
      ulorl::vespo_weights(ulorl::vespo_inputs<double>{view(lp, 1, 3), view(old, 1, 3), view(m, 1, 3), adv2}, phi, {}),
      ulorl::error);
  REQUIRE_THROWS_AS(ulorl::vespo_weights(
                        ulorl::vespo_inputs<double>{view(nan_e, 1, 3), view(old, 1, 3), view(m, 1, 3), adv}, phi, {}),
                    ulorl::error);
  REQUIRE_THROWS_AS(ulorl::vespo_weights(
                        ulorl::vespo_inputs<double>{view(lp, 1, 3), view(old, 1, 3), view(bad_m, 1, 3), adv}, phi, {}),
                    ulorl::error);
  REQUIRE_THROWS_AS(
      ulorl::vespo_weights(ulorl::vespo_inputs<double>{view(lp, 1, 3), view(old, 1, 3), view(m, 1, 3), adv}, phi,
                           {.k_pos = std::numeric_limits<double>::infinity()}),
      ulorl::error);
  REQUIRE(phi == std::vector<double>{9.0});
  // A zero ratio gives log(1e-8) (no -inf), and phi is 0 rather than non-finite for huge weights.
  const std::vector<double> q0{0.0, 1.0, 1.0};
  ulorl::vespo_weights(ulorl::vespo_inputs<double>{view(lp, 1, 3), view(old, 1, 3), view(m, 1, 3), adv, view(q0, 1, 3)},
                       phi, {});
  REQUIRE(std::isfinite(phi[0]));
  REQUIRE(ulorl::vespo_phi(1e300, 1.0, {}) == 0.0);
}

TEST_CASE("trl loss types: cispo / sapo configurations are validated; policy_loss writes nothing on error") {
  using T = P::trl::importance_sampling_kind;
  REQUIRE_THROWS_AS(P::trl::objective({.epsilon_high = -0.5, .loss_type = LT::cispo}), ulorl::error);
  // A ratio cap below 1 is TRL's too: min(r, 0.5), lo = 0.
  const auto capped = P::trl::objective({.epsilon_high = 0.5, .loss_type = LT::cispo});
  REQUIRE(1.0 + capped.eps_high == 0.5);
  REQUIRE(capped.eps_low == 1.0);
  REQUIRE_THROWS_AS(P::trl::objective({.importance_sampling_level = T::sequence_token, .loss_type = LT::vespo}),
                    ulorl::error);
  std::mt19937_64 rng(3);
  const problem p = random_problem(rng, 3, 4);
  auto nanlp = p.lp;
  nanlp[5] = std::numeric_limits<double>::quiet_NaN();
  ulorl::policy_loss_inputs<double, double> in{view(nanlp, 3, 4), view(p.old, 3, 4), view(p.adv_tok, 3, 4),
                                               view(p.mask, 3, 4)};
  ulorl::policy_loss_config cfg;
  cfg.objective = P::trl::objective({.epsilon_high = 5.0, .loss_type = LT::cispo});
  cfg.normalizer = P::trl::normalizer({.loss_type = LT::cispo}, ulorl::count_batch(view(p.mask, 3, 4)));
  std::vector<double> g(12, 4.0);
  REQUIRE_THROWS_AS(ulorl::policy_loss(in, mview(g, 3, 4), cfg), ulorl::error);
  cfg.objective.eps_low = 1.01;
  in.log_prob = view(p.lp, 3, 4);
  REQUIRE_THROWS_AS(ulorl::policy_loss(in, mview(g, 3, 4), cfg), ulorl::error);
  cfg.objective = P::trl::objective({.loss_type = LT::sapo});
  cfg.objective.sapo.tau_neg = -1.0;
  REQUIRE_THROWS_AS(ulorl::policy_loss(in, mview(g, 3, 4), cfg), ulorl::error);
  std::vector<double> short_w(11, 1.0);
  cfg.objective = P::trl::objective({.loss_type = LT::vespo});
  in.weights = view(short_w, 1, 11);
  REQUIRE_THROWS_AS(ulorl::policy_loss(in, mview(g, 3, 4), cfg), ulorl::error);
  REQUIRE(std::all_of(g.begin(), g.end(), [](double v) { return v == 4.0; }));
}

TEST_CASE("trl loss types: token-level modes are partition-exact with the global normaliser") {
  std::mt19937_64 rng(11);
  for (auto lt : {LT::cispo, LT::sapo, LT::vespo}) {
    const problem p = random_problem(rng, 6, 7);
    const std::size_t T = p.T;
    const auto counts = ulorl::count_batch(view(p.mask, p.B, T));
    ulorl::policy_loss_config cfg;
    cfg.objective = P::trl::objective({.epsilon_high = 1.2, .loss_type = lt});
    cfg.kl = P::trl::kl({.use_bias_correction_kl = true});
    cfg.kl_coef = 0.05;
    cfg.normalizer = ulorl::global_normalizer(ulorl::agg_mode::token_mean, counts);
    // Weights of the whole batch (phi per row; a top-entropy mask of the batch), then split rows.
    std::vector<double> w(p.B * T, 1.0), phi(p.B), keep(p.B * T), scratch(p.B * T);
    ulorl::vespo_weights(
        ulorl::vespo_inputs<double>{view(p.lp, p.B, T), view(p.old, p.B, T), view(p.mask, p.B, T), p.adv}, phi, {});
    (void)ulorl::top_entropy_mask(view(p.ent, p.B, T), view(p.mask, p.B, T), mview(keep, p.B, T), {.quantile = 0.6},
                                  scratch);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = keep[i] * (lt == LT::vespo ? phi[i / T] : p.q[i]);
    const auto run = [&](std::size_t b0, std::size_t b1, std::vector<double>& g) {
      const std::size_t n = b1 - b0, o = b0 * T;
      const auto v = [&](const std::vector<double>& x) {
        return ulorl::padded(ulorl::matrix_view<const double>(x.data() + o, n, T));
      };
      ulorl::policy_loss_inputs<double, double> in{v(p.lp), v(p.old), v(p.adv_tok), v(p.mask)};
      in.ref_log_prob = v(p.ref);
      in.weights = v(w);
      return ulorl::policy_loss(in, ulorl::padded(ulorl::matrix_view<double>(g.data() + o, n, T)), cfg).loss;
    };
    std::vector<double> g_full(p.B * T), g_split(p.B * T);
    const double full = run(0, p.B, g_full);
    const double split = run(0, 2, g_split) + run(2, 5, g_split) + run(5, 6, g_split);
    REQUIRE(split == Approx(full).epsilon(1e-12));
    for (std::size_t i = 0; i < g_full.size(); ++i)
      REQUIRE(g_split[i] == Approx(g_full[i]).epsilon(1e-12).margin(1e-300));
  }
}

TEST_CASE("top_entropy_mask and vespo_weights: an absent mask is an all-ones mask, bit for bit, in both layouts",
          "[mask]") {
  std::mt19937_64 rng(4242);
  for (const auto& lay : absent_mask::layouts(rng, 5, 8)) {
    INFO((lay.packed ? "packed" : "padded"));
    const auto H = absent_mask::uniform(rng, lay.size(), 0, 3);
    const auto lp = absent_mask::uniform(rng, lay.size(), -3, 0), old = absent_mask::uniform(rng, lay.size(), -3, 0);
    const auto q = absent_mask::uniform(rng, lay.size(), 0.5, 1.5);
    const auto adv = absent_mask::uniform(rng, lay.B, -1, 1);
    const std::vector<double> ones(lay.size(), 1.0);
    const ulorl::token_view<const double> absent{};
    REQUIRE(ulorl::entropy_quantile_workspace(absent, lay.cview(H)) == lay.size());
    REQUIRE(ulorl::entropy_quantile_workspace(lay.cview(ones), lay.cview(H)) == lay.size());
    std::vector<double> scratch(lay.size()), keep(lay.size()), keepa(lay.size());
    const ulorl::entropy_quantile_config cfg{.quantile = 0.4};
    const double theta = ulorl::top_entropy_mask(lay.cview(H), lay.cview(ones), lay.mview(keep), cfg, scratch);
    const double ta = ulorl::top_entropy_mask(lay.cview(H), absent, lay.mview(keepa), cfg, scratch);
    REQUIRE(absent_mask::same_bits(ta, theta));
    REQUIRE(absent_mask::same_bits(keepa, keep));
    REQUIRE(absent_mask::same_bits(ulorl::entropy_quantile_threshold(lay.cview(H), absent, cfg, scratch), theta));
    for (const bool with_q : {false, true}) {
      std::vector<double> phi(lay.B), phia(lay.B);
      const auto qv = with_q ? lay.cview(q) : absent;
      ulorl::vespo_weights(ulorl::vespo_inputs<double>{lay.cview(lp), lay.cview(old), lay.cview(ones), adv, qv}, phi,
                           {});
      ulorl::vespo_weights(ulorl::vespo_inputs<double>{lay.cview(lp), lay.cview(old), absent, adv, qv}, phia, {});
      REQUIRE(absent_mask::same_bits(phia, phi));
    }
  }
}
