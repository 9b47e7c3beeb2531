// Conformance op `policy_loss` (golden README §4.3): presets verl (vanilla, gspo, cispo, geo_mean,
// sapo, gpg; dppo_tv, dppo_kl, dro, kl_cov, clip_cov), openrlhf (ppo, gspo, dual clip, vLLM IS
// correction) and nemo_rl (ClippedPGLossFn) — JSON to ulorl::policy_loss with the presets, composed
// as docs/presets/{verl,openrlhf,nemo_rl}.md describe.
#include <optional>
#include <string>
#include <utility>

#include <ulorl/loss/policy_loss.hpp>
#include <ulorl/loss/rollout_correction.hpp>
#include <ulorl/loss/token_selection.hpp>
#include <ulorl/loss/weighted_kl.hpp>
#include <ulorl/presets/nemo_rl.hpp>
#include <ulorl/presets/openrlhf.hpp>
#include <ulorl/presets/verl.hpp>

#include "conformance/registry.hpp"

namespace {
using conformance::json;
namespace P = ulorl::presets;
namespace RC = ulorl::rollout_correction;
using view = ulorl::token_view<const double>;
using inputs_t = ulorl::policy_loss_inputs<double, double>;

view view_of(const std::optional<conformance::matrix>& m) { return m ? conformance::padded_view(*m) : view{}; }

//! The gradient buffer (shaped like log_prob) and its view.
struct gradient {
  conformance::matrix m;
  explicit gradient(const conformance::matrix& like) : m(like) {}
  ulorl::token_view<double> v() { return conformance::padded_view(m); }
};

// ---- verl ------------------------------------------------------------------------------------------
json run_verl(const json& params, const inputs_t& base, const std::optional<conformance::matrix>& weights,
              const std::optional<conformance::matrix>& selection, const conformance::matrix& lp) {
  inputs_t in = base;
  in.weights = view_of(weights);
  const auto mode = P::verl::loss_mode_from_name(conformance::param_string(params, "loss_mode", "vanilla"));
  using K = P::verl::loss_mode_kind;
  const P::verl::objective_options oo{.loss_mode = mode,
                                      .clip_ratio_low = conformance::param_double(params, "clip_ratio_low", 0.2),
                                      .clip_ratio_high = conformance::param_double(params, "clip_ratio_high", 0.2),
                                      .clip_ratio_c = conformance::param_double(params, "clip_ratio_c", 3.0),
                                      .tau_pos = conformance::param_double(params, "tau_pos", 1.0),
                                      .tau_neg = conformance::param_double(params, "tau_neg", 1.05),
                                      .dro_beta = conformance::param_optional(params, "dro_beta"),
                                      .kl_cov_ratio = conformance::param_double(params, "kl_cov_ratio", 0.0002),
                                      .ppo_kl_coef = conformance::param_double(params, "ppo_kl_coef", 0.1),
                                      .clip_cov_ratio = conformance::param_double(params, "clip_cov_ratio", 0.0002),
                                      .clip_cov_lb = conformance::param_double(params, "clip_cov_lb", 1.0),
                                      .clip_cov_ub = conformance::param_double(params, "clip_cov_ub", 5.0)};
  ulorl::policy_loss_config cfg;
  cfg.objective = P::verl::objective(oo);
  cfg.normalizer = P::verl::policy_normalizer(
      mode,
      {.loss_agg_mode =
           P::verl::loss_agg_mode_from_name(conformance::param_string(params, "loss_agg_mode", "token-mean")),
       .dp_size = conformance::param_double(params, "dp_size", 1.0),
       .batch_num_tokens = conformance::param_optional(params, "batch_num_tokens"),
       .global_batch_size = conformance::param_optional(params, "global_batch_size"),
       .loss_scale_factor = conformance::param_optional(params, "loss_scale_factor"),
       .padded_length = lp.cols,
       .sum_norm_per_sequence = false},  // the verl cases' agg_loss is b178a3cd's (README)
      ulorl::count_batch(in.mask));
  if (selection && mode != K::clip_cov)
    throw conformance::reject("policy_loss: clip_cov_selection is a clip_cov input");

  gradient grad(lp);
  ulorl::token_selection_stats stats;
  ulorl::policy_loss_result res;
  conformance::matrix w = lp;  // the weights the batch passes write
  if (mode == K::dppo_tv || mode == K::dppo_kl) {
    stats = ulorl::dppo_weights(in.old_log_prob, in.log_prob, in.advantages, in.mask, in.weights,
                                conformance::padded_view(w), P::verl::dppo(oo));
    in.weights = conformance::padded_view(std::as_const(w));
    res = ulorl::policy_loss(in, grad.v(), cfg);
  } else if (mode == K::clip_cov) {
    if (!selection) throw conformance::reject("policy_loss: clip_cov needs the input clip_cov_selection");
    stats = ulorl::clip_cov_weights(in.old_log_prob, in.log_prob, in.advantages, in.mask, view_of(selection),
                                    in.weights, conformance::padded_view(w), P::verl::clip_cov(oo));
    in.weights = conformance::padded_view(std::as_const(w));
    res = ulorl::policy_loss(in, grad.v(), cfg);
  } else if (mode == K::kl_cov) {
    // Selected tokens: objective with the |x| penalty, weights w sel; the others: without it,
    // weights w (1 - sel); one normaliser, the sums add.
    conformance::matrix sel = lp;
    stats = ulorl::kl_cov_selection(in.old_log_prob, in.log_prob, in.advantages, in.mask, conformance::padded_view(sel),
                                    P::verl::kl_cov(oo));
    conformance::matrix w_sel = lp, w_rest = lp;
    for (std::size_t i = 0; i < sel.data.size(); ++i) {
      const double wi = weights ? weights->data[i] : 1.0;
      w_sel.data[i] = wi * sel.data[i], w_rest.data[i] = wi * (1.0 - sel.data[i]);
    }
    inputs_t a = in, b = in;
    a.weights = conformance::padded_view(std::as_const(w_sel));
    b.weights = conformance::padded_view(std::as_const(w_rest));
    ulorl::policy_loss_config cfg_rest = cfg;
    cfg_rest.objective.penalized_pg.abs_penalty = 0.0;
    gradient grad_rest(lp);
    res = ulorl::policy_loss(a, grad.v(), cfg);
    const auto rest = ulorl::policy_loss(b, grad_rest.v(), cfg_rest);
    res.pg_loss += rest.pg_loss;
    for (std::size_t i = 0; i < grad.m.data.size(); ++i) grad.m.data[i] += grad_rest.m.data[i];
  } else {
    res = ulorl::policy_loss(in, grad.v(), cfg);
  }
  json out{{"pg_loss", res.pg_loss}, {"grad_log_prob", conformance::from_matrix(grad.m)}};
  const auto m = P::verl::metrics(mode, res.metrics, stats);
  out["pg_clipfrac"] = m.pg_clipfrac;
  out["ppo_kl"] = m.ppo_kl;
  out["pg_clipfrac_lower"] = m.pg_clipfrac_lower;
  return out;
}

// ---- OpenRLHF --------------------------------------------------------------------------------------
json run_openrlhf(const json& params, const inputs_t& base, const std::optional<conformance::matrix>& rollout,
                  const conformance::matrix& lp) {
  inputs_t in = base;
  const auto mode =
      P::openrlhf::policy_loss_type_from_name(conformance::param_string(params, "policy_loss_type", "ppo"));
  const P::openrlhf::objective_options oo{
      .policy_loss_type = mode,
      .clip_eps_low = conformance::param_double(params, "clip_eps_low", 0.2),
      .clip_eps_high = conformance::param_double(params, "clip_eps_high", 0.2),
      .dual_clip = conformance::param_optional(params, "dual_clip"),
      .enable_vllm_is_correction = conformance::param_bool(params, "enable_vllm_is_correction", false)};
  ulorl::policy_loss_config cfg;
  cfg.objective = P::openrlhf::objective(oo);
  const auto counts = ulorl::count_batch(in.mask);
  if (counts.tokens == 0) throw conformance::reject("policy_loss: openrlhf metrics divide by N = 0 valid tokens");
  cfg.normalizer =
      P::openrlhf::policy_normalizer(mode,
                                     {.token_level_loss = conformance::param_bool(params, "token_level_loss", true),
                                      .dp_size = conformance::param_double(params, "dp_size", 1.0),
                                      .batch_num_tokens = conformance::param_optional(params, "batch_num_tokens"),
                                      .global_batch_size = conformance::param_optional(params, "global_batch_size")},
                                     counts);
  const auto plan = P::openrlhf::vllm_is_correction(oo);
  if ((plan.weights || plan.ratio_against_rollout) && !rollout)
    throw conformance::reject("policy_loss: enable_vllm_is_correction needs the input rollout_log_prob");
  conformance::matrix w = lp;
  std::optional<double> vllm_kl;
  if (plan.weights) {
    P::openrlhf::rollout_correction_options ro;
    ro.vllm_is_correction_type = RC::is_weighting_from_name(
        conformance::param_string(params, "vllm_is_correction_type", "tis"), "vllm_is_correction_type");
    if (conformance::has_param(params, "vllm_is_truncated_threshold")) {
      const auto th = conformance::to_vector(params.at("vllm_is_truncated_threshold"), "vllm_is_truncated_threshold");
      if (th.size() != 2) throw conformance::reject("policy_loss: vllm_is_truncated_threshold must be [lo, hi]");
      ro.vllm_is_truncated_threshold = {th[0], th[1]};
    }
    const auto rm = RC::apply(RC::inputs<double, double>{in.old_log_prob, view_of(rollout), in.mask},
                              RC::outputs<double, double>{.weights = conformance::padded_view(w)},
                              P::openrlhf::rollout_correction(ro));
    in.weights = conformance::padded_view(std::as_const(w));
    vllm_kl = rm.kl;
  }
  if (plan.ratio_against_rollout) in.old_log_prob = view_of(rollout);
  gradient grad(lp);
  const auto res = ulorl::policy_loss(in, grad.v(), cfg);
  // ppo_kl is against the old policy whatever the ratio's baseline.
  double nlr = 0;
  for (std::size_t b = 0; b < base.log_prob.rows(); ++b)
    for (std::size_t t = 0; t < base.log_prob.row_size(b); ++t)
      if (base.mask(b, t) != 0.0) nlr += base.old_log_prob(b, t) - base.log_prob(b, t);
  json out{{"pg_loss", res.pg_loss},
           {"grad_log_prob", conformance::from_matrix(grad.m)},
           {"clip_ratio", res.metrics.clip_fraction()},
           {"ppo_kl", plan.ratio_against_rollout ? nlr / counts.tokens : res.metrics.approx_kl_k1()}};
  if (vllm_kl) out["vllm_kl"] = *vllm_kl;
  return out;
}

// ---- NeMo-RL ---------------------------------------------------------------------------------------
json run_nemo_rl(const json& params, const inputs_t& base, const std::optional<conformance::matrix>& rollout,
                 const std::optional<conformance::matrix>& ref, const conformance::matrix& lp) {
  P::nemo_rl::clipped_pg_loss_options o{
      .ratio_clip_min = conformance::param_double(params, "ratio_clip_min", 0.2),
      .ratio_clip_max = conformance::param_double(params, "ratio_clip_max", 0.2),
      .ratio_clip_c = conformance::param_optional(params, "ratio_clip_c"),
      .token_level_loss = conformance::param_bool(params, "token_level_loss", true),
      .force_on_policy_ratio = conformance::param_bool(params, "force_on_policy_ratio", false),
      .disable_ppo_ratio = conformance::param_bool(params, "disable_ppo_ratio", false),
      .use_importance_sampling_correction =
          conformance::param_bool(params, "use_importance_sampling_correction", false),
      .truncated_importance_sampling_ratio = conformance::param_optional(params, "truncated_importance_sampling_ratio"),
      .truncated_importance_sampling_ratio_min =
          conformance::param_optional(params, "truncated_importance_sampling_ratio_min"),
      .reference_policy_kl_penalty = conformance::param_double(params, "reference_policy_kl_penalty", 0.01),
      .reference_policy_kl_type =
          P::nemo_rl::kl_type_from_name(conformance::param_string(params, "reference_policy_kl_type", "k3")),
      .kl_input_clamp_value = conformance::param_optional(params, "kl_input_clamp_value"),
      .kl_output_clamp_value = conformance::param_optional(params, "kl_output_clamp_value")};
  o.use_on_policy_kl_approximation = conformance::param_bool(params, "use_on_policy_kl_approximation", false);
  if (conformance::has_param(params, "truncated_importance_sampling_type"))
    o.truncated_importance_sampling_type =
        RC::is_weighting_from_name(conformance::param_string(params, "truncated_importance_sampling_type", ""),
                                   "truncated_importance_sampling_type");
  const auto gt = conformance::param_optional(params, "global_valid_toks");
  const auto gs = conformance::param_optional(params, "global_valid_seqs");
  if (!rollout) throw conformance::reject("policy_loss: nemo_rl needs the input rollout_log_prob");
  const bool with_kl = o.reference_policy_kl_penalty != 0.0;
  if (with_kl && !ref)
    throw conformance::reject("policy_loss: nemo_rl with reference_policy_kl_penalty != 0 needs ref_log_prob");

  ulorl::policy_loss_config cfg;
  cfg.objective = P::nemo_rl::objective(o);
  const auto rc_cfg = P::nemo_rl::rollout_correction(o);
  const auto counts = ulorl::count_batch(base.mask);
  const P::nemo_rl::global_counts global{.global_valid_toks = gt, .global_valid_seqs = gs};
  cfg.normalizer = P::nemo_rl::normalizer(o, global, counts);

  inputs_t in = base;
  if (o.force_on_policy_ratio) in.old_log_prob = base.log_prob;
  conformance::matrix w = lp;
  const auto rm = RC::apply(RC::inputs<double, double>{in.old_log_prob, view_of(rollout), in.mask},
                            RC::outputs<double, double>{.weights = conformance::padded_view(w)}, rc_cfg);
  if (o.use_importance_sampling_correction) in.weights = conformance::padded_view(std::as_const(w));
  gradient grad(lp);
  // Validate the KL's inputs before anything is written (weighted_kl_loss validates again).
  if (with_kl) {
    ulorl::require_same_shape("policy_loss", "ref_log_prob", view_of(ref), "log_prob", base.log_prob);
    ulorl::require_all_finite("policy_loss", "ref_log_prob", view_of(ref));
  }
  if (o.use_on_policy_kl_approximation && with_kl) {
    conformance::matrix probe = lp;  // weighted_kl_loss's checks on a scratch gradient
    (void)ulorl::weighted_kl_loss(base.log_prob, view_of(ref), view_of(rollout), base.mask,
                                  conformance::padded_view(probe), P::nemo_rl::reference_policy_kl(o), cfg.normalizer);
  }
  const auto res = ulorl::policy_loss(in, grad.v(), cfg);
  double kl = 0;
  if (with_kl)
    kl = ulorl::weighted_kl_loss(base.log_prob, view_of(ref), view_of(rollout), base.mask, grad.v(),
                                 P::nemo_rl::reference_policy_kl(o), cfg.normalizer);
  const auto logged = P::nemo_rl::rollout_correction_logged(
      rm, {.truncated_importance_sampling_type = o.truncated_importance_sampling_type}, global);
  const auto ratios = P::nemo_rl::logged_ratios(base.log_prob, base.old_log_prob, base.mask, o, global);
  json out{{"pg_loss", res.pg_loss + kl},
           {"grad_log_prob", conformance::from_matrix(grad.m)},
           {"probs_ratio", ratios.probs_ratio},
           {"probs_ratio_clamped", ratios.probs_ratio_clamped},
           {"sampling_importance_ratio", logged.sampling_importance_ratio}};
  if (o.truncated_importance_sampling_type) out["is_oob_ratio"] = logged.is_oob_ratio;
  if (with_kl) out["kl_penalty"] = kl == 0.0 ? 0.0 : kl / o.reference_policy_kl_penalty;
  return out;
}

const conformance::registrar reg(
    "policy_loss", [](const std::string& preset, const json& params, const json& inputs) -> json {
      const auto old = conformance::to_matrix(inputs.at("old_log_prob"), "old_log_prob");
      const auto lp = conformance::to_matrix(inputs.at("log_prob"), "log_prob");
      const auto adv = conformance::to_matrix(inputs.at("advantages"), "advantages");
      const auto mask = conformance::to_matrix(inputs.at("response_mask"), "response_mask");
      const auto weights = conformance::optional_matrix(inputs, "rollout_is_weights");
      const auto selection = conformance::optional_matrix(inputs, "clip_cov_selection");
      const auto rollout = conformance::optional_matrix(inputs, "rollout_log_prob");
      const auto ref = conformance::optional_matrix(inputs, "ref_log_prob");

      const inputs_t in{conformance::padded_view(lp), conformance::padded_view(old), conformance::padded_view(adv),
                        conformance::padded_view(mask)};
      ulorl::require_same_shape("policy_loss", "response_mask", in.mask, "log_prob", in.log_prob);
      if (rollout)
        ulorl::require_same_shape("policy_loss", "rollout_log_prob", view_of(rollout), "log_prob", in.log_prob);
      if (preset != "verl" && (weights || selection))
        throw conformance::reject("policy_loss: rollout_is_weights and clip_cov_selection are verl inputs");
      if (preset == "verl") return run_verl(params, in, weights, selection, lp);
      if (preset == "openrlhf") return run_openrlhf(params, in, rollout, lp);
      if (preset == "nemo_rl") return run_nemo_rl(params, in, rollout, ref, lp);
      throw conformance::reject("policy_loss: unknown preset '" + preset + "'");
    });
}  // namespace
