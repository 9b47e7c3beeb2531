// Tests of ulorl::presets::trl::grpo_loss (ulorl/presets/trl.hpp), TRL's
// GRPOTrainer._compute_loss in one call. The oracle below is TRL's loss written here in float64
// from the golden README's §4.5 (not from the library): every loss type and importance-sampling
// level, the off-policy mask, the top-entropy mask, the vLLM IS ratio, VESPO's phi, the KL term
// (bias-corrected or not), the entropy bonus and TRL's logged metrics. Checked: loss and metrics
// against the oracle, the gradients against central finite differences of the oracle (detached
// quantities held at the point), float against double, thread counts, and hostile inputs
// (ulorl::error naming function, argument and index; nothing written).
#include <ulorl/presets/trl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "catch.hpp"
#include "support/random.hpp"
#include "support/rejection.hpp"

namespace {
namespace P = ulorl::presets;
using LT = P::trl::loss_type_kind;
using IS = P::trl::importance_sampling_kind;
using options = P::trl::grpo_loss_options;
constexpr const char* fn = "presets::trl::grpo_loss";

// ---- one batch, float64 values that float represents exactly ---------------------------------------

struct batch {
  std::size_t B = 0, T = 0, qcols = 0;  // qcols: 0 (no IS ratio), 1 or T
  std::vector<double> lp, old, mask, ref, sampling, ent, q, adv;
  [[nodiscard]] std::size_t at(std::size_t b, std::size_t t) const { return b * T + t; }
  [[nodiscard]] double qv(std::size_t b, std::size_t t) const { return q[b * qcols + (qcols == 1 ? 0 : t)]; }
};

double f32(double v) { return static_cast<double>(static_cast<float>(v)); }

batch random_batch(testing_support::rng& r, std::size_t B, std::size_t T, std::size_t qcols) {
  batch x;
  x.B = B, x.T = T, x.qcols = qcols;
  const std::size_t N = B * T;
  x.lp.resize(N), x.old.resize(N), x.mask.resize(N), x.ref.resize(N), x.sampling.resize(N), x.ent.resize(N);
  x.adv.resize(B);
  for (std::size_t b = 0; b < B; ++b) {
    x.adv[b] = f32((r.coin() ? 1.0 : -1.0) * r.uniform(0.1, 1.5));
    const std::size_t len = b == 1 ? 0 : static_cast<std::size_t>(r.integer(1, static_cast<std::int64_t>(T)));  // row 1 empty
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t i = x.at(b, t);
      x.lp[i] = f32(r.uniform(-3.0, -0.05));
      x.old[i] = f32(x.lp[i] + r.normal(0.0, 0.25));
      x.ref[i] = f32(x.lp[i] + r.normal(0.0, 0.3));
      x.sampling[i] = f32(x.old[i] + r.normal(0.0, 0.3));
      x.ent[i] = f32(r.uniform(0.01, 3.0));
      x.mask[i] = t < len ? 1.0 : 0.0;
    }
  }
  x.q.resize(B * qcols);
  for (auto& v : x.q) v = f32(r.uniform(0.4, 1.6));
  return x;
}

// ---- the oracle: TRL's _compute_loss from the golden README (§4.5) ----------------------------------

struct oracle_out {
  double loss = 0;
  std::optional<double> low, high, region, cispo, phi_mean, entropy_mean, kl_mean;
};

double clamp(double x, double lo, double hi) { return std::min(hi, std::max(lo, x)); }

// The loss as a function of `lp` and `H`; the detached quantities (the off-policy mask, the
// entropy mask, VESPO's phi, cispo's capped ratio, GSPO-token's sg(ω)) are taken at x.lp / x.ent.
oracle_out oracle(const batch& x, const options& o, const std::vector<double>& lp, const std::vector<double>& H,
                  bool use_sampling) {
  const std::size_t B = x.B, T = x.T;
  const double el = o.epsilon, eh = o.epsilon_high.value_or(o.epsilon);
  const bool tok = o.importance_sampling_level == IS::token, seq = o.importance_sampling_level == IS::sequence;
  const LT lt = o.loss_type;
  const bool clip_family = lt == LT::grpo || lt == LT::bnpo || lt == LT::dr_grpo || lt == LT::dapo || lt == LT::luspo;
  std::vector<double> n(B, 0.0), w(B, 0.0), wd(B, 0.0);
  double N = 0;
  for (std::size_t b = 0; b < B; ++b) {
    double s = 0, sd = 0;
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t i = x.at(b, t);
      n[b] += x.mask[i];
      s += (lp[i] - x.old[i]) * x.mask[i];
      sd += (x.lp[i] - x.old[i]) * x.mask[i];
    }
    w[b] = s / std::max(n[b], 1.0), wd[b] = sd / std::max(n[b], 1.0);
    N += n[b];
  }
  // Off-policy mask keep_b (detached).
  std::vector<double> keep(B, 1.0);
  if (o.off_policy_mask_threshold)
    for (std::size_t b = 0; b < B; ++b) {
      double s = 0;
      for (std::size_t t = 0; t < T; ++t) {
        const std::size_t i = x.at(b, t);
        s += ((use_sampling ? x.sampling[i] : x.old[i]) - x.lp[i]) * x.mask[i];
      }
      keep[b] = (x.adv[b] >= 0.0 || s / std::max(n[b], 1.0) <= *o.off_policy_mask_threshold) ? 1.0 : 0.0;
    }
  // Top-entropy mask E (detached): torch.quantile's linear interpolation over the valid entropies.
  std::vector<double> E(B * T, 1.0);
  if (o.top_entropy_quantile < 1.0) {
    std::vector<double> v;
    for (std::size_t i = 0; i < B * T; ++i)
      if (x.mask[i] != 0.0) v.push_back(x.ent[i]);
    std::sort(v.begin(), v.end());
    double theta = std::numeric_limits<double>::infinity();
    if (!v.empty()) {
      const double pos = (1.0 - o.top_entropy_quantile) * static_cast<double>(v.size() - 1);
      const auto lo = static_cast<std::size_t>(std::floor(pos)), hi = static_cast<std::size_t>(std::ceil(pos));
      theta = v[lo] + (pos - std::floor(pos)) * (v[hi] - v[lo]);
    }
    for (std::size_t i = 0; i < B * T; ++i) E[i] = (x.mask[i] != 0.0 && x.ent[i] >= theta) ? 1.0 : 0.0;
  }
  // VESPO's phi_b (detached).
  std::vector<double> phi(B, 1.0);
  if (lt == LT::vespo)
    for (std::size_t b = 0; b < B; ++b) {
      const double lc = std::log(1e-8);
      double s = 0;
      for (std::size_t t = 0; t < T; ++t) {
        const std::size_t i = x.at(b, t);
        s += clamp(x.lp[i] - x.old[i], -20.0, 20.0) * x.mask[i];
        if (x.qcols) s += x.qv(b, t) > 0.0 ? clamp(std::log(x.qv(b, t)), lc, 20.0) : lc;
      }
      const double lw = clamp(s, lc, 20.0);
      const bool pos = x.adv[b] >= 0.0;
      const double k = pos ? o.vespo_k_pos : o.vespo_k_neg;
      const double lam = std::max(pos ? o.vespo_lambda_pos : o.vespo_lambda_neg, 1e-4);
      const double f = std::exp(lam + k * lw - lam * std::exp(lw));
      phi[b] = std::isfinite(f) ? f : 0.0;
    }

  std::vector<double> ell(B * T, 0.0);
  double low = 0, high = 0, reg = 0, cis = 0, kl_sum = 0;  // masked sums (token) or row sums (sequence)
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t i = x.at(b, t);
      const double A = x.adv[b];
      const double c1 = tok ? std::exp(lp[i] - x.old[i]) : seq ? std::exp(w[b]) : std::exp(wd[b] + lp[i] - x.lp[i]);
      const double c1d = tok ? std::exp(x.lp[i] - x.old[i]) : std::exp(wd[b]);
      double p = 0;
      double c1p = c1;
      switch (lt) {
        case LT::grpo:
        case LT::bnpo:
        case LT::dr_grpo:
        case LT::dapo:
        case LT::luspo: {
          if (o.delta) c1p = std::min(c1, *o.delta);
          const double c2 = clamp(c1, 1.0 - el, 1.0 + eh);
          p = -std::min(c1p * A, c2 * A);
          break;
        }
        case LT::cispo: p = -std::min(c1d, eh) * A * lp[i]; break;
        case LT::sapo: {
          const double tau = A > 0 ? o.sapo_temperature_pos : o.sapo_temperature_neg;
          p = -(1.0 / (1.0 + std::exp(-tau * (c1 - 1.0)))) * 4.0 / tau * A;
          break;
        }
        case LT::vespo: p = -phi[b] * A * lp[i]; break;
      }
      const double q = (x.qcols && lt != LT::vespo) ? x.qv(b, t) : 1.0;
      double l = p * keep[b] * E[i] * q;
      double kappa = 0;
      if (o.beta != 0.0) {
        const double d = x.ref[i] - lp[i];
        kappa = std::exp(d) - d - 1.0;
        if (o.use_bias_correction_kl) kappa *= c1;
        l += o.beta * kappa;
      }
      ell[i] = l;
      // Metrics at the point: a single-column quantity (sequence level, or T = 1) is counted once per
      // row over all rows, masked or not.
      const double mm = (seq || T == 1) ? (t == 0 ? 1.0 : 0.0) : x.mask[i];
      const double lo_f = (c1p < 1.0 - el && A < 0) ? 1.0 : 0.0, hi_f = (c1p > 1.0 + eh && A > 0) ? 1.0 : 0.0;
      low += lo_f * mm, high += hi_f * mm, reg += std::max(lo_f, hi_f) * mm;
      cis += ((c1 > eh && A > 0) ? 1.0 : 0.0) * mm;
      kl_sum += kappa * (T == 1 ? 1.0 : x.mask[i]);
    }

  oracle_out r;
  double loss = 0;
  const double ga = o.gradient_accumulation_steps;
  const double items = o.num_items_in_batch.value_or(N);
  switch (lt) {
    case LT::grpo:
    case LT::sapo:
      for (std::size_t b = 0; b < B; ++b) {
        double s = 0;
        for (std::size_t t = 0; t < T; ++t) s += ell[x.at(b, t)] * x.mask[x.at(b, t)];
        loss += s / std::max(n[b], 1.0);
      }
      loss /= static_cast<double>(B) * ga;
      break;
    case LT::bnpo:
    case LT::dr_grpo:
    case LT::dapo:
    case LT::cispo:
    case LT::vespo: {
      double s = 0;
      for (std::size_t i = 0; i < B * T; ++i) s += ell[i] * x.mask[i];
      const double den = lt == LT::bnpo      ? std::max(N, 1.0) * ga
                         : lt == LT::dr_grpo ? static_cast<double>(B) * o.max_completion_length * ga
                                             : std::max(items, 1.0) / o.num_processes;
      loss = s / den;
      break;
    }
    case LT::luspo:  // every position, padding included, row weight n_b
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t t = 0; t < T; ++t) loss += ell[x.at(b, t)] * n[b];
      loss /= static_cast<double>(B * T) * ga;
      break;
  }
  if (o.entropy_coef != 0.0) {
    double s = 0, me = 0;
    for (std::size_t i = 0; i < B * T; ++i) s += H[i] * x.mask[i] * E[i], me += x.mask[i] * E[i];
    const bool by_items = lt == LT::dapo || lt == LT::cispo || lt == LT::vespo;
    loss -= o.entropy_coef * s / (by_items ? std::max(items, 1.0) / o.num_processes : std::max(me, 1.0) * ga);
  }
  r.loss = loss;
  const double den = (seq || T == 1) ? static_cast<double>(B) : std::max(N, 1.0);
  const double den_tok = T == 1 ? static_cast<double>(B) : std::max(N, 1.0);  // [B, T] tensors: KL, entropy
  if (clip_family) r.low = low / den, r.high = high / den, r.region = reg / den;
  if (lt == LT::cispo) r.cispo = cis / den;
  if (lt == LT::vespo) {
    double s = 0;
    for (double v : phi) s += v;
    r.phi_mean = s / static_cast<double>(B);
  }
  double es = 0;
  for (std::size_t i = 0; i < B * T; ++i) es += H[i] * (T == 1 ? 1.0 : x.mask[i]);
  r.entropy_mean = es / den_tok;
  if (o.beta != 0.0) r.kl_mean = kl_sum / den_tok;
  return r;
}

// ---- the library call in element type T (mask type M) ----------------------------------------------

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}
template <class T>
ulorl::token_view<const T> cview(const std::vector<T>& v, std::size_t B, std::size_t T_) {
  return ulorl::padded(ulorl::matrix_view<const T>(v.data(), B, T_));
}
template <class T>
ulorl::token_view<T> mview(std::vector<T>& v, std::size_t B, std::size_t T_) {
  return ulorl::padded(ulorl::matrix_view<T>(v.data(), B, T_));
}

struct features {
  bool ref = true, sampling = false, entropies = true;
};

template <class T, class M = T>
struct library_case {
  std::vector<T> lp, old, ref, sampling, ent, q, adv;
  std::vector<M> mask;
  std::vector<T> grad, grad_ent;
  P::trl::grpo_loss_inputs<T, M> in;
  P::trl::grpo_loss_outputs<T> out;
  library_case(const batch& x, const features& f, double sentinel = 0.0)
      : lp(cast<T>(x.lp)), old(cast<T>(x.old)), ref(cast<T>(x.ref)), sampling(cast<T>(x.sampling)), ent(cast<T>(x.ent)),
        q(cast<T>(x.q)), adv(cast<T>(x.adv)), mask(x.mask.begin(), x.mask.end()), grad(x.B * x.T, static_cast<T>(sentinel)),
        grad_ent(x.B * x.T, static_cast<T>(sentinel)) {
    const std::size_t B = x.B, Tn = x.T;
    in.per_token_logps = cview(lp, B, Tn);
    in.old_per_token_logps = cview(old, B, Tn);
    in.completion_mask = cview(mask, B, Tn);
    in.advantages = adv;
    if (f.ref) in.ref_per_token_logps = cview(ref, B, Tn);
    if (f.sampling) in.sampling_per_token_logps = cview(sampling, B, Tn);
    if (f.entropies) in.entropies = cview(ent, B, Tn);
    if (x.qcols) in.importance_sampling_ratio = cview(q, B, x.qcols);
    out.grad_per_token_logps = mview(grad, B, Tn);
    out.grad_entropies = mview(grad_ent, B, Tn);
  }
};

struct mode {
  std::string name;
  options o;
  std::size_t qcols = 0;  // 0, 1 or T
  bool sampling = false;
};

std::vector<mode> modes(std::size_t T) {
  std::vector<mode> m;
  const auto add = [&](std::string name, options o, std::size_t qcols = 0, bool sampling = false) {
    m.push_back({std::move(name), o, qcols, sampling});
  };
  add("grpo token beta", {.loss_type = LT::grpo, .epsilon_high = 0.28, .beta = 0.04});
  add("bnpo token delta", {.loss_type = LT::bnpo, .delta = 1.25, .gradient_accumulation_steps = 2});
  add("dr_grpo token", {.loss_type = LT::dr_grpo, .beta = 0.02, .max_completion_length = 9, .gradient_accumulation_steps = 2});
  add("dapo token bias-kl items", {.loss_type = LT::dapo, .epsilon_high = 0.28, .beta = 0.05, .use_bias_correction_kl = true,
                                   .num_items_in_batch = 40.0, .num_processes = 2});
  add("grpo sequence beta", {.loss_type = LT::grpo, .beta = 0.03, .importance_sampling_level = IS::sequence});
  add("grpo sequence bias-kl", {.loss_type = LT::grpo, .beta = 0.05, .importance_sampling_level = IS::sequence,
                                .use_bias_correction_kl = true});
  add("dapo sequence delta", {.loss_type = LT::dapo, .delta = 1.1, .importance_sampling_level = IS::sequence});
  add("bnpo sequence_token beta", {.loss_type = LT::bnpo, .epsilon_high = 0.28, .beta = 0.04,
                                   .importance_sampling_level = IS::sequence_token});
  add("cispo token beta", {.loss_type = LT::cispo, .epsilon_high = 1.15, .beta = 0.03});
  add("cispo sequence opsm beta", {.loss_type = LT::cispo, .epsilon_high = 1.05, .beta = 0.02,
                                   .importance_sampling_level = IS::sequence, .off_policy_mask_threshold = 0.02},
      0, true);
  add("sapo token top-entropy bonus", {.loss_type = LT::sapo, .top_entropy_quantile = 0.6, .entropy_coef = 0.01});
  add("sapo sequence beta is[B,T]", {.loss_type = LT::sapo, .beta = 0.05, .importance_sampling_level = IS::sequence}, T);
  add("sapo sequence top-entropy bonus", {.loss_type = LT::sapo, .importance_sampling_level = IS::sequence,
                                          .top_entropy_quantile = 0.5, .entropy_coef = 0.02});
  add("luspo token beta is[B,1]", {.loss_type = LT::luspo, .epsilon_high = 0.28, .beta = 0.03}, 1);
  add("luspo sequence", {.loss_type = LT::luspo, .importance_sampling_level = IS::sequence});
  add("luspo sequence beta top-entropy", {.loss_type = LT::luspo, .beta = 0.02, .importance_sampling_level = IS::sequence,
                                          .top_entropy_quantile = 0.7});
  add("luspo token opsm bonus", {.loss_type = LT::luspo, .off_policy_mask_threshold = 0.0, .entropy_coef = 0.03}, 0, true);
  add("vespo token is bonus", {.loss_type = LT::vespo, .beta = 0.01, .entropy_coef = 0.02}, T);
  add("vespo sequence", {.loss_type = LT::vespo, .importance_sampling_level = IS::sequence});
  add("vespo token bias-kl", {.loss_type = LT::vespo, .beta = 0.05, .use_bias_correction_kl = true});
  add("grpo token opsm top-entropy bonus is[B,T]",
      {.loss_type = LT::grpo, .epsilon_high = 0.28, .beta = 0.02, .off_policy_mask_threshold = 0.01,
       .top_entropy_quantile = 0.5, .entropy_coef = 0.05},
      T, true);
  add("dapo token bias-kl bonus", {.loss_type = LT::dapo, .beta = 0.04, .use_bias_correction_kl = true, .entropy_coef = 0.1});
  // The bias-corrected KL where the KL term runs outside policy_loss: TRL's undetached ratio,
  // exp(logp - old) (luspo token) or exp(w_b) with its gradient through the row mean.
  add("luspo token bias-kl", {.loss_type = LT::luspo, .beta = 0.06, .use_bias_correction_kl = true});
  add("luspo sequence bias-kl top-entropy", {.loss_type = LT::luspo, .beta = 0.05, .importance_sampling_level = IS::sequence,
                                             .use_bias_correction_kl = true, .top_entropy_quantile = 0.7});
  add("sapo sequence bias-kl", {.loss_type = LT::sapo, .beta = 0.07, .importance_sampling_level = IS::sequence,
                                .use_bias_correction_kl = true});
  add("cispo sequence bias-kl cap below 1", {.loss_type = LT::cispo, .epsilon_high = 0.95, .beta = 0.05,
                                             .importance_sampling_level = IS::sequence, .use_bias_correction_kl = true});
  add("vespo sequence bias-kl", {.loss_type = LT::vespo, .beta = 0.05, .importance_sampling_level = IS::sequence,
                                 .use_bias_correction_kl = true});
  add("cispo token cap below 1 bias-kl", {.loss_type = LT::cispo, .epsilon_high = 0.9, .beta = 0.02,
                                          .use_bias_correction_kl = true});
  // GSPO-token's delta caps the row's ratio (value, own-token gradient and clip flags).
  add("dapo sequence_token delta beta", {.loss_type = LT::dapo, .delta = 1.02, .beta = 0.03,
                                         .importance_sampling_level = IS::sequence_token});
  add("grpo sequence_token delta is[B,1]", {.loss_type = LT::grpo, .epsilon_high = 0.01, .delta = 1.005,
                                            .importance_sampling_level = IS::sequence_token}, 1);
  return m;
}

void require_close(double got, double want, double rtol, double atol) {
  INFO("got " << got << ", want " << want);
  REQUIRE(std::isfinite(got));
  REQUIRE(std::fabs(got - want) <= atol + rtol * std::fabs(want));
}
void require_metric(const std::optional<double>& got, const std::optional<double>& want, const char* name) {
  INFO(name);
  REQUIRE(got.has_value() == want.has_value());
  if (want) require_close(*got, *want, 1e-12, 1e-14);
}

}  // namespace

TEST_CASE("trl grpo_loss: loss, metrics and gradients against TRL's formulas (float64 oracle, finite differences)") {
  const std::uint64_t seed = testing_support::default_seed + 71;
  CAPTURE(seed);
  testing_support::rng rng(seed);
  // [5, 7] with an empty row; [12, 1] with a third of the rows masked, where TRL's single-column
  // rule counts the masked rows' flags and KL in its logged means.
  struct shape {
    std::size_t B, T;
  };
  int single_column_differs = 0;
  for (const shape sh : {shape{5, 7}, shape{12, 1}})
  for (const mode& md : modes(sh.T)) {
    const std::size_t B = sh.B, T = sh.T;
    CAPTURE(B, T, md.name);
    batch x = random_batch(rng, B, T, md.qcols);
    if (T == 1)
      for (std::size_t b = 0; b < B; b += 3) x.mask[b] = 0.0;
    const features f{.ref = true, .sampling = md.sampling, .entropies = true};
    library_case<double> c(x, f);
    const auto r = P::trl::grpo_loss(c.in, c.out, md.o);
    const oracle_out want = oracle(x, md.o, x.lp, x.ent, md.sampling);
    require_close(r.loss, want.loss, 1e-12, 1e-14);
    require_close(r.pg_loss + r.kl_loss + r.entropy_loss, r.loss, 1e-15, 1e-15);
    require_metric(r.clip_ratio_low_mean, want.low, "clip_ratio_low_mean");
    require_metric(r.clip_ratio_high_mean, want.high, "clip_ratio_high_mean");
    require_metric(r.clip_ratio_region_mean, want.region, "clip_ratio_region_mean");
    require_metric(r.cispo_clip_ratio, want.cispo, "cispo_clip_ratio");
    require_metric(r.vespo_phi_seq_mean, want.phi_mean, "vespo_phi_seq_mean");
    require_metric(r.entropy_mean, want.entropy_mean, "entropy_mean");
    require_metric(r.kl_mean, want.kl_mean, "kl_mean");
    if (md.o.beta != 0.0 && T > 1) require_close(r.metrics.kl_mean(), *want.kl_mean, 1e-12, 1e-14);
    if (T == 1 && md.o.importance_sampling_level != IS::sequence) {
      // The rule changes what is logged: the valid tokens' means differ for some mode.
      const bool differs = (r.clip_ratio_region_mean && *r.clip_ratio_region_mean != r.metrics.clip_region_fraction()) ||
                           (r.kl_mean && *r.kl_mean != r.metrics.kl_mean());
      single_column_differs += differs ? 1 : 0;
    }

    // Central differences of the oracle in every per_token_logps and entropies element.
    const double h = 1e-6;
    std::vector<double> lp = x.lp, H = x.ent;
    for (std::size_t i = 0; i < B * T; ++i) {
      CAPTURE(i);
      lp[i] = x.lp[i] + h;
      const double up = oracle(x, md.o, lp, H, md.sampling).loss;
      lp[i] = x.lp[i] - h;
      const double dn = oracle(x, md.o, lp, H, md.sampling).loss;
      lp[i] = x.lp[i];
      require_close(c.grad[i], (up - dn) / (2 * h), 1e-6, 1e-8);
      H[i] = x.ent[i] + h;
      const double hu = oracle(x, md.o, lp, H, md.sampling).loss;
      H[i] = x.ent[i] - h;
      const double hd = oracle(x, md.o, lp, H, md.sampling).loss;
      H[i] = x.ent[i];
      require_close(c.grad_ent[i], (hu - hd) / (2 * h), 1e-6, 1e-8);
      if (md.o.loss_type != LT::luspo && x.mask[i] == 0.0) REQUIRE(c.grad[i] == 0.0);
    }
  }
  REQUIRE(single_column_differs >= 3);
}

TEST_CASE("trl grpo_loss: float agrees with double; a uint8 mask and threads give the same result") {
  const std::uint64_t seed = testing_support::default_seed + 72;
  CAPTURE(seed);
  testing_support::rng rng(seed);
  const std::size_t B = 6, T = 9;
  for (const mode& md : modes(T)) {
    CAPTURE(md.name);
    const batch x = random_batch(rng, B, T, md.qcols);
    const features f{.ref = true, .sampling = md.sampling, .entropies = true};
    library_case<double> d(x, f);
    library_case<float> s(x, f);
    library_case<float, std::uint8_t> s8(x, f);
    const auto rd = P::trl::grpo_loss(d.in, d.out, md.o);
    const auto rs = P::trl::grpo_loss(s.in, s.out, md.o);
    const auto r8 = P::trl::grpo_loss(s8.in, s8.out, md.o, ulorl::thread_executor{3});
    require_close(rs.loss, rd.loss, 1e-5, 1e-6);
    REQUIRE(r8.loss == rs.loss);
    for (std::size_t i = 0; i < B * T; ++i) {
      CAPTURE(i);
      require_close(static_cast<double>(s.grad[i]), d.grad[i], 1e-4, 1e-6);
      require_close(static_cast<double>(s.grad_ent[i]), d.grad_ent[i], 1e-5, 1e-7);
      REQUIRE(s8.grad[i] == s.grad[i]);
      REQUIRE(s8.grad_ent[i] == s.grad_ent[i]);
    }
    if (rd.clip_ratio_region_mean) require_close(*rs.clip_ratio_region_mean, *rd.clip_ratio_region_mean, 0.0, 1e-12);
    if (rd.kl_mean) require_close(*rs.kl_mean, *rd.kl_mean, 1e-5, 1e-7);
  }
}

TEST_CASE("trl grpo_loss: without multipliers, luspo puts gradient on padding; an entropy gradient given with coef 0 is zero") {
  testing_support::rng rng(testing_support::default_seed + 73);
  const batch x = random_batch(rng, 4, 6, 0);
  library_case<double> c(x, {}, 7.0);
  (void)P::trl::grpo_loss(c.in, c.out, {.loss_type = LT::luspo, .beta = 0.1});
  bool padding_gradient = false;
  for (std::size_t i = 0; i < x.mask.size(); ++i) padding_gradient = padding_gradient || (x.mask[i] == 0.0 && c.grad[i] != 0.0);
  REQUIRE(padding_gradient);
  REQUIRE(all_equal(c.grad_ent, 0.0));
}

TEST_CASE("trl grpo_loss: hostile inputs raise ulorl::error naming the argument and index; nothing is written") {
  testing_support::rng rng(testing_support::default_seed + 74);
  const std::size_t B = 3, T = 4;
  const batch x = random_batch(rng, B, T, T);
  const double sentinel = -123.0;
  const options base{.loss_type = LT::grpo, .beta = 0.04, .top_entropy_quantile = 0.5, .entropy_coef = 0.01};
  const auto expect = [&](const std::string& what, auto&& mutate, const options& o, const std::string& arg, std::int64_t index) {
    INFO(what);
    library_case<double> c(x, {.ref = true, .sampling = true, .entropies = true}, sentinel);
    mutate(c);
    require_rejected(outcome_of([&] { (void)P::trl::grpo_loss(c.in, c.out, o); }), fn, arg, index);
    REQUIRE(all_equal(c.grad, sentinel));
    REQUIRE(all_equal(c.grad_ent, sentinel));
  };
  const auto none = [](library_case<double>&) {};
  std::vector<double> wrong(B * (T + 1), -1.0), wrong_q(B * 2, 1.0);

  // Shapes and layout.
  expect("old_per_token_logps of another shape", [&](auto& c) { c.in.old_per_token_logps = cview(wrong, B, T + 1); }, base,
         "old_per_token_logps", -1);
  expect("entropies of another shape", [&](auto& c) { c.in.entropies = cview(wrong, B, T + 1); }, base, "entropies", -1);
  expect("ref of another shape", [&](auto& c) { c.in.ref_per_token_logps = cview(wrong, B + 1, T - 1); }, base,
         "ref_per_token_logps", -1);
  expect("grad of another shape", [&](auto& c) { c.out.grad_per_token_logps = mview(wrong, B, T + 1); }, base,
         "grad_per_token_logps", -1);
  expect("importance_sampling_ratio with 2 columns", [&](auto& c) { c.in.importance_sampling_ratio = cview(wrong_q, B, 2); },
         base, "importance_sampling_ratio", -1);
  expect("advantages of B + 1", [&](auto& c) { c.in.advantages = std::span<const double>(wrong.data(), B + 1); }, base,
         "advantages", -1);
  const std::vector<std::int64_t> offsets{0, 4, 8, 12};
  expect("packed per_token_logps",
         [&](auto& c) {
           c.in.per_token_logps = ulorl::token_view<const double>::packed(ulorl::vector_view<const double>(c.lp.data(), 12),
                                                                          std::span<const std::int64_t>(offsets));
         },
         base, "per_token_logps", -1);
  expect("vespo with a [B, 1] ratio", [&](auto& c) { c.in.importance_sampling_ratio = cview(wrong_q, B, 1); },
         options{.loss_type = LT::vespo}, "importance_sampling_ratio", -1);

  // Values.
  expect("NaN per_token_logps", [&](auto& c) { c.lp[5] = std::nan(""); }, base, "per_token_logps", 5);
  expect("inf old_per_token_logps", [&](auto& c) { c.old[7] = std::numeric_limits<double>::infinity(); }, base,
         "old_per_token_logps", 7);
  expect("NaN advantage", [&](auto& c) { c.adv[2] = std::nan(""); }, base, "advantages", 2);
  expect("NaN ref", [&](auto& c) { c.ref[3] = std::nan(""); }, base, "ref_per_token_logps", 3);
  expect("mask value 2", [&](auto& c) { c.mask[6] = 2.0; }, base, "completion_mask", 6);
  expect("negative entropy", [&](auto& c) { c.ent[B * T - 1] = -0.5; }, base, "entropies",
         static_cast<std::int64_t>(B * T - 1));
  expect("NaN entropy", [&](auto& c) { c.ent[1] = std::nan(""); }, base, "entropies", 1);
  expect("negative IS ratio", [&](auto& c) { c.q[4] = -0.1; }, base, "importance_sampling_ratio", 4);

  // Options and required inputs / outputs.
  for (double rho : {1.5, -0.1, std::nan("")}) {
    options o = base;
    o.top_entropy_quantile = rho;
    expect("top_entropy_quantile " + std::to_string(rho), none, o, "top_entropy_quantile", -1);
  }
  expect("missing entropies (top_entropy_quantile < 1)", [&](auto& c) { c.in.entropies = {}; },
         options{.top_entropy_quantile = 0.5}, "entropies", -1);
  expect("missing entropies (entropy_coef != 0)", [&](auto& c) { c.in.entropies = {}; }, options{.entropy_coef = 0.1},
         "entropies", -1);
  expect("missing grad_entropies", [&](auto& c) { c.out.grad_entropies = {}; }, base, "grad_entropies", -1);
  expect("missing ref with beta", [&](auto& c) { c.in.ref_per_token_logps = {}; }, base, "ref_per_token_logps", -1);
  expect("grad_entropies overlapping grad", [&](auto& c) { c.out.grad_entropies = c.out.grad_per_token_logps; }, base,
         "grad_entropies", -1);
  expect("sequence_token with bias-corrected KL", none,
         options{.beta = 0.1, .importance_sampling_level = IS::sequence_token, .use_bias_correction_kl = true},
         "use_bias_correction_kl", -1);
  expect("sequence_token with an entropy bonus", none,
         options{.importance_sampling_level = IS::sequence_token, .entropy_coef = 0.1},
         "entropy_coef", -1);
  {
    INFO("cispo with a negative ratio cap (the objective's check)");
    library_case<double> c(x, {.ref = true, .sampling = true, .entropies = true}, sentinel);
    require_rejected(outcome_of([&] {
                       (void)P::trl::grpo_loss(c.in, c.out, options{.loss_type = LT::cispo, .epsilon_high = -0.5});
                     }),
                     "presets::trl::objective", "epsilon_high", -1);
    REQUIRE(all_equal(c.grad, sentinel));
  }
  expect("gradient_accumulation_steps 0", none, options{.gradient_accumulation_steps = 0}, "gradient_accumulation_steps", -1);
  expect("num_processes -1", none, options{.num_processes = -1}, "num_processes", -1);
  expect("dr_grpo without a length", none, options{.loss_type = LT::dr_grpo, .max_completion_length = 0},
         "max_completion_length", -1);
  expect("unknown loss_type", none, options{.loss_type = static_cast<LT>(99)}, "loss_type", -1);
  expect("unknown level", none, options{.importance_sampling_level = static_cast<IS>(7)}, "importance_sampling_level", -1);

  // An empty batch.
  library_case<double> c(x, {}, sentinel);
  c.in.per_token_logps = cview(c.lp, 0, T);
  require_rejected(outcome_of([&] { (void)P::trl::grpo_loss(c.in, c.out, options{}); }), fn, "per_token_logps", -1);
}

TEST_CASE("trl grpo_loss: a gradient or loss beyond the range after policy_loss is an error; the gradients are set to 0",
          "[overflow]") {
  testing_support::rng rng(testing_support::default_seed + 75);
  const std::size_t B = 3, T = 4;
  const batch x = random_batch(rng, B, T, T);
  library_case<double> c(x, {.ref = true, .sampling = true, .entropies = true}, -123.0);
  for (std::size_t i = 0; i < B * T; ++i) c.ref[i] = c.lp[i] + 5.0;  // k3's gradient 1 - e^5
  // luspo's separate KL term: beta 1.7e308 times a gradient of -147 overflows double.
  try {
    (void)P::trl::grpo_loss(c.in, c.out, options{.loss_type = LT::luspo, .beta = 1.7e308});
    FAIL("no error");
  } catch (const ulorl::error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("overflows float64") != std::string::npos);
  }
  CHECK(all_equal(c.grad, 0.0));
}
