// Conformance op `trl_grpo_loss` (golden README §4.5, TRL GRPOTrainer._compute_loss) — JSON to
// ulorl::policy_loss with the TRL preset. TRL's advantages are one per sequence: broadcast here.
// The per-token multipliers (off-policy mask, top-entropy mask, vLLM IS ratio, VESPO's phi) go
// into policy_loss's `weights`; the entropy bonus is entropy_loss with TRL's own normaliser;
// docs/losses.md §13 describes each composition.
#include <cmath>
#include <optional>
#include <vector>

#include <ulorl/loss/entropy.hpp>
#include <ulorl/loss/kl.hpp>
#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/loss/presets.hpp>
#include <ulorl/loss/vespo.hpp>
#include <ulorl/masking/entropy_quantile.hpp>
#include <ulorl/masking/off_policy.hpp>

#include "conformance/registry.hpp"

namespace {
using conformance::json;
using conformance::matrix;
namespace P = ulorl::presets;
constexpr const char* fn = "trl_grpo_loss";

using conformance::optional_matrix;
matrix filled(const matrix& like, double v) {
  matrix m = like;
  for (auto& x : m.data) x = v;
  return m;
}
ulorl::token_view<double> grad_view(matrix& m) {
  return ulorl::token_view<double>::padded(ulorl::matrix_view<double>(m.data.data(), m.rows, m.cols));
}

const conformance::registrar reg("trl_grpo_loss", [](const std::string& preset, const json& params, const json& inputs) -> json {
  if (preset != "trl") throw conformance::reject("trl_grpo_loss: unknown preset '" + preset + "'");
  const auto lp = conformance::to_matrix(inputs.at("per_token_logps"), "per_token_logps");
  const auto old = conformance::to_matrix(inputs.at("old_per_token_logps"), "old_per_token_logps");
  const auto mask = conformance::to_matrix(inputs.at("completion_mask"), "completion_mask");
  const auto adv_b = conformance::to_vector(inputs.at("advantages"), "advantages");
  const auto ref = optional_matrix(inputs, "ref_per_token_logps");
  const auto sampling = optional_matrix(inputs, "sampling_per_token_logps");
  const auto entropies = optional_matrix(inputs, "entropies");
  const auto is_ratio = optional_matrix(inputs, "importance_sampling_ratio");

  const double beta = conformance::param_double(params, "beta", 0.0);
  const auto level = P::trl::importance_sampling_level_from_name(conformance::param_string(params, "importance_sampling_level", "token"));
  const auto loss_type = P::trl::loss_type_from_name(conformance::param_string(params, "loss_type", "dapo"));
  const bool bias_kl = conformance::param_bool(params, "use_bias_correction_kl", false);
  const auto delta = conformance::param_optional(params, "delta");
  const auto opsm_delta = conformance::param_optional(params, "off_policy_mask_threshold");
  const double rho = conformance::param_double(params, "top_entropy_quantile", 1.0);
  const double entropy_coef = conformance::param_double(params, "entropy_coef", 0.0);
  using LT = P::trl::loss_type_kind;
  using IS = P::trl::importance_sampling_kind;
  const bool seq = level == IS::sequence;

  const auto objective = P::trl::objective({.epsilon = conformance::param_double(params, "epsilon", 0.2),
                                            .epsilon_high = conformance::param_optional(params, "epsilon_high"),
                                            .delta = delta,
                                            .importance_sampling_level = level,
                                            .loss_type = loss_type,
                                            .sapo_temperature_pos = conformance::param_double(params, "sapo_temperature_pos", 1.0),
                                            .sapo_temperature_neg = conformance::param_double(params, "sapo_temperature_neg", 1.05)});

  // ---- shapes and TRL's rejections, before anything is computed ----
  const std::size_t B = lp.rows, T = lp.cols;
  ulorl::require_same_size(fn, "advantages", adv_b.size(), "per_token_logps rows", B);
  const auto lpv = conformance::padded_view(lp), oldv = conformance::padded_view(old), mv = conformance::padded_view(mask);
  ulorl::require_same_shape(fn, "old_per_token_logps", oldv, "per_token_logps", lpv);
  ulorl::require_same_shape(fn, "completion_mask", mv, "per_token_logps", lpv);
  if (level == IS::sequence_token) {
    if (bias_kl) ulorl::detail::fail(fn, "use_bias_correction_kl", "sequence_token (GSPO-token) has no bias-corrected KL");
    if (entropy_coef != 0.0) ulorl::detail::fail(fn, "entropy_coef", "sequence_token (GSPO-token) has no entropy bonus");
  }
  if (!(rho >= 0.0 && rho <= 1.0)) ulorl::detail::fail_value(fn, "top_entropy_quantile", rho, "must be in [0, 1]");
  if ((rho < 1.0 || entropy_coef != 0.0) && !entropies)
    ulorl::detail::fail(fn, "entropies", "required when top_entropy_quantile < 1 or entropy_coef != 0");
  if (entropies) {
    ulorl::require_same_shape(fn, "entropies", conformance::padded_view(*entropies), "per_token_logps", lpv);
    ulorl::require_all_finite(fn, "entropies", conformance::padded_view(*entropies));
    for (std::size_t i = 0; i < entropies->data.size(); ++i)
      if (entropies->data[i] < 0.0) ulorl::detail::fail_at(fn, "entropies", static_cast<std::int64_t>(i), entropies->data[i], "must be >= 0");
  }
  if (sampling) ulorl::require_same_shape(fn, "sampling_per_token_logps", conformance::padded_view(*sampling), "per_token_logps", lpv);
  if (is_ratio) {
    ulorl::require_same_size(fn, "importance_sampling_ratio rows", is_ratio->rows, "per_token_logps rows", B);
    if (is_ratio->cols != T && is_ratio->cols != 1)
      ulorl::detail::fail_value(fn, "importance_sampling_ratio", static_cast<double>(is_ratio->cols), "must have T columns or 1");
    if (loss_type == LT::vespo && is_ratio->cols != T)
      ulorl::detail::fail(fn, "importance_sampling_ratio", "vespo needs a token-level ratio [B][T]");
    for (std::size_t i = 0; i < is_ratio->data.size(); ++i)
      if (!(is_ratio->data[i] >= 0.0) || std::isinf(is_ratio->data[i]))
        ulorl::detail::fail_at(fn, "importance_sampling_ratio", static_cast<std::int64_t>(i), is_ratio->data[i], "must be finite and >= 0");
  }
  const bool derived_seq = seq && (loss_type == LT::cispo || loss_type == LT::sapo);
  if (bias_kl && beta != 0.0 && (derived_seq || loss_type == LT::luspo))
    ulorl::detail::fail(fn, "use_bias_correction_kl", "not supported with sequence-level cispo / sapo or with luspo");

  // ---- multipliers of the policy term: keep (OPSM) * E (top entropy) * q (not vespo) ----
  matrix w = filled(lp, 1.0);
  if (opsm_delta) {
    matrix keep = filled(lp, 0.0);
    ulorl::off_policy_mask_inputs<double, double, double> oin{lpv, sampling ? conformance::padded_view(*sampling) : oldv, mv, {}, adv_b};
    (void)ulorl::off_policy_mask(oin, grad_view(keep), ulorl::off_policy_mask_config{.delta = *opsm_delta});
    for (std::size_t i = 0; i < w.data.size(); ++i) w.data[i] *= keep.data[i];
  }
  matrix ent_mask = mask;  // m_e
  if (rho < 1.0) {
    std::vector<double> scratch(ulorl::entropy_quantile_workspace(mv));
    (void)ulorl::top_entropy_mask(conformance::padded_view(*entropies), mv, ulorl::entropy_quantile_config{.quantile = rho},
                                  grad_view(ent_mask), scratch);
    for (std::size_t i = 0; i < w.data.size(); ++i) w.data[i] *= ent_mask.data[i];
  }
  std::vector<double> phi;
  if (loss_type == LT::vespo) {
    phi.assign(B, 0.0);
    ulorl::vespo_inputs<double, double> vin{lpv, oldv, mv, adv_b, is_ratio ? conformance::padded_view(*is_ratio) : ulorl::token_view<const double>{}};
    ulorl::vespo_weights(vin,
                         {.k_pos = conformance::param_double(params, "vespo_k_pos", 2.0),
                          .lambda_pos = conformance::param_double(params, "vespo_lambda_pos", 3.0),
                          .k_neg = conformance::param_double(params, "vespo_k_neg", 3.0),
                          .lambda_neg = conformance::param_double(params, "vespo_lambda_neg", 2.0)},
                         phi);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < T; ++t) w(b, t) *= phi[b];
  } else if (is_ratio) {
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < T; ++t) w(b, t) *= (*is_ratio)(b, is_ratio->cols == 1 ? 0 : t);
  }

  // ---- the sequence log-ratio (sequence level) and the row counts ----
  std::vector<double> omega(B, 0.0), nrow(B, 0.0);
  for (std::size_t b = 0; b < B; ++b) {
    double s = 0;
    for (std::size_t t = 0; t < T; ++t)
      if (mask(b, t) != 0.0) s += lp(b, t) - old(b, t), nrow[b] += 1;
    omega[b] = s / (nrow[b] > 0 ? nrow[b] : 1.0);
  }

  matrix adv = lp;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = 0; t < T; ++t) adv(b, t) = adv_b[b];
  // cispo / sapo at the sequence level: each token's log-ratio is the row's (old' = lp - omega_b).
  matrix old_used = old;
  if (derived_seq)
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < T; ++t) old_used(b, t) = lp(b, t) - omega[b];

  const bool luspo = loss_type == LT::luspo;
  const matrix ones = filled(lp, 1.0);
  // luspo: row weight n_b; at the token level over every position (all-ones mask), at the sequence
  // level over the valid tokens with the row's mean multiplier (the row's loss is one value).
  matrix w_used = w;
  if (luspo) {
    for (std::size_t b = 0; b < B; ++b) {
      double mean_w = 0;
      for (std::size_t t = 0; t < T; ++t) mean_w += w(b, t);
      mean_w /= static_cast<double>(T);
      for (std::size_t t = 0; t < T; ++t) w_used(b, t) = seq ? mean_w : nrow[b] * w(b, t);
    }
  }
  const matrix& mask_used = (luspo && !seq) ? ones : mask;

  ulorl::policy_loss_inputs<double, double> in{lpv, conformance::padded_view(old_used), conformance::padded_view(adv), conformance::padded_view(mask_used)};
  if (ref) in.ref_log_prob = conformance::padded_view(*ref);
  in.weights = conformance::padded_view(w_used);
  const auto counts = ulorl::count_batch(mv);
  const P::trl::normalizer_options nopt{
      .loss_type = loss_type,
      .importance_sampling_level = level,
      .padded_length = T,
      .max_completion_length = conformance::param_double(params, "max_completion_length", 0.0),
      .gradient_accumulation_steps = conformance::param_double(params, "gradient_accumulation_steps", 1.0),
      .num_items_in_batch = conformance::param_optional(params, "num_items_in_batch"),
      .num_processes = conformance::param_double(params, "num_processes", 1.0)};

  ulorl::policy_loss_config cfg;
  cfg.objective = objective;
  cfg.kl = P::trl::kl({.use_bias_correction_kl = bias_kl});
  // luspo's and sequence-level sapo's KL term is added below (its weights differ from the objective's).
  const bool separate_kl = luspo || (derived_seq && loss_type == LT::sapo);
  cfg.kl_coef = separate_kl ? 0.0 : beta;
  cfg.normalizer = P::trl::normalizer(nopt, counts);

  matrix grad = filled(lp, 0.0);
  auto res = ulorl::policy_loss(in, cfg, grad_view(grad));
  double loss = res.loss;
  double kl_mean = res.metrics.kl_mean();

  if (derived_seq && loss_type == LT::sapo) {
    // The sequence ratio's gradient reaches every valid token through the mean.
    for (std::size_t b = 0; b < B; ++b) {
      if (nrow[b] == 0) continue;
      double s = 0;
      for (std::size_t t = 0; t < T; ++t) s += mask(b, t) != 0.0 ? grad(b, t) : 0.0;
      for (std::size_t t = 0; t < T; ++t)
        if (mask(b, t) != 0.0) grad(b, t) = s / nrow[b];
    }
  }
  if (separate_kl && beta != 0.0) {
    // k3 per token; luspo: over every position with weight n_b / (B T GA); sapo: as the objective.
    matrix kl = filled(lp, 0.0), dkl = filled(lp, 0.0);
    ulorl::kl_penalty<double>(lpv, conformance::padded_view(*ref), cfg.kl, grad_view(kl), grad_view(dkl));
    const auto row_w = [&](std::size_t b) {
      return luspo ? nrow[b] / (static_cast<double>(B * T) * nopt.gradient_accumulation_steps)
                   : ulorl::row_weight(cfg.normalizer, static_cast<std::size_t>(nrow[b]));
    };
    double ksum = 0;
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < T; ++t) {
        const bool counted = luspo || mask(b, t) != 0.0;
        if (!counted) continue;
        loss += row_w(b) * beta * kl(b, t);
        grad(b, t) += row_w(b) * beta * dkl(b, t);
        ksum += mask(b, t) != 0.0 ? kl(b, t) : 0.0;
      }
    kl_mean = counts.tokens > 0 ? ksum / counts.tokens : 0.0;
  }
  // luspo at the token level ran over every position: its clip metrics are those of the valid tokens.
  ulorl::loss_metrics metrics = res.metrics;
  if (luspo && !seq) {
    ulorl::policy_loss_inputs<double, double> min = in;
    min.mask = mv;
    min.weights = conformance::padded_view(w);
    ulorl::policy_loss_config mcfg = cfg;
    mcfg.kl_coef = 0.0;
    matrix g2 = filled(lp, 0.0);
    metrics = ulorl::policy_loss(min, mcfg, grad_view(g2)).metrics;
  }

  json out{{"loss", loss}};
  if (entropy_coef != 0.0) {
    const auto ev = conformance::padded_view(*entropies);
    const matrix& ent_mask_c = ent_mask;
    const auto mev = conformance::padded_view(ent_mask_c);
    const double me_tokens = ulorl::count_batch(mev).tokens;
    matrix gent = filled(lp, 0.0);
    const double eloss = ulorl::entropy_loss(ev, mev, entropy_coef, P::trl::entropy_normalizer(nopt, counts, me_tokens), grad_view(gent));
    out["loss"] = loss + eloss;
    out["grad_entropies"] = conformance::from_matrix(gent);
  }
  out["grad_per_token_logps"] = conformance::from_matrix(grad);

  switch (loss_type) {
    case LT::grpo:
    case LT::bnpo:
    case LT::dr_grpo:
    case LT::dapo:
    case LT::luspo: {
      const auto clip = P::trl::clip_ratios(metrics, level);
      out["clip_ratio_low_mean"] = clip.low_mean;
      out["clip_ratio_high_mean"] = clip.high_mean;
      out["clip_ratio_region_mean"] = clip.region_mean;
      break;
    }
    case LT::cispo:
      if (seq) {
        // One value per row (single column): a mean over all B rows.
        double n = 0;
        const double cap = 1.0 + objective.eps_high;
        for (std::size_t b = 0; b < B; ++b) n += (std::exp(omega[b]) > cap && adv_b[b] > 0.0) ? 1.0 : 0.0;
        out["cispo_clip_ratio"] = n / static_cast<double>(B);
      } else {
        out["cispo_clip_ratio"] = metrics.clip_high_fraction();
      }
      break;
    case LT::vespo: {
      double s = 0;
      for (double v : phi) s += v;
      out["vespo_phi_seq_mean"] = s / static_cast<double>(B);
      break;
    }
    case LT::sapo: break;
  }
  if (entropies) {
    double s = 0;
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t t = 0; t < T; ++t) s += (T == 1 || mask(b, t) != 0.0) ? (*entropies)(b, t) : 0.0;
    out["entropy_mean"] = T == 1 ? s / static_cast<double>(B) : (counts.tokens > 0 ? s / counts.tokens : 0.0);
  }
  if (beta != 0.0) out["kl_mean"] = kl_mean;
  return out;
});
}  // namespace
