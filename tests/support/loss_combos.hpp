// tests/support/loss_combos.hpp — named policy-loss configurations ("ppo", "ppo_dual", "ppo_delta",
// "gspo_own", "gspo_mean", "cispo", "gmpo", "sapo", "pg" x KL "none", "k1", "abs", "k2", "k3",
// "k3_st", "k3_iw" x aggregation "token", "seq_sum", "seq_mean", "constant"), each with the
// matching spec of the float64 oracle (support/loss_oracle.hpp).
#pragma once

#include <ulorl/loss/policy_loss.hpp>

#include <string>

#include "support/loss_oracle.hpp"

struct combo {
  oracle::spec s;
  ulorl::policy_loss_config cfg;
};

inline combo make_combo(const std::string& objective, const std::string& kl, const std::string& agg, double denom) {
  combo c;
  auto& s = c.s;
  auto& o = c.cfg.objective;
  s.objective = objective;
  o.eps_low = s.eps_low = 0.2;
  o.eps_high = s.eps_high = 0.28;
  o.log_ratio_clamp = s.bound = 20;
  o.seq_log_ratio_max = s.seq_max = 10;
  if (objective == "ppo") o.kind = ulorl::objective_kind::ppo_clip;
  if (objective == "ppo_dual") s.objective = "ppo", o.kind = ulorl::objective_kind::ppo_clip, o.dual_clip = s.dual_c = 3;
  if (objective == "ppo_delta")
    s.objective = "ppo", o.kind = ulorl::objective_kind::ppo_clip, o.delta = s.delta = 1.5, o.log_ratio_clamp = s.bound = oracle::inf;
  if (objective == "gspo_own") o.kind = ulorl::objective_kind::gspo, o.seq_gradient = ulorl::sequence_gradient::own_token;
  if (objective == "gspo_mean") o.kind = ulorl::objective_kind::gspo, o.seq_gradient = ulorl::sequence_gradient::through_mean;
  if (objective == "cispo") o.kind = ulorl::objective_kind::cispo;
  if (objective == "gmpo") o.kind = ulorl::objective_kind::gmpo;
  if (objective == "sapo") o.kind = ulorl::objective_kind::sapo;
  if (objective == "pg") o.kind = ulorl::objective_kind::policy_gradient;

  auto& k = c.cfg.kl;
  if (kl != "none") c.cfg.kl_coef = s.beta = 0.3;
  s.kl = kl;
  if (kl == "k1") k.estimator = ulorl::kl_estimator::k1;
  if (kl == "abs") k.estimator = ulorl::kl_estimator::abs;
  if (kl == "k2") k.estimator = ulorl::kl_estimator::k2;
  if (kl == "k3") k.estimator = ulorl::kl_estimator::k3, k.input_clamp = s.kl_in = 1.5, k.output_clamp = s.kl_out = 1.2;
  if (kl == "k3_st") s.kl = "k3", k.estimator = ulorl::kl_estimator::k3, k.straight_through = s.kl_straight_through = true;
  if (kl == "k3_iw") s.kl = "k3", k.estimator = ulorl::kl_estimator::k3, k.importance_weighted = s.kl_importance_weighted = true;
  c.cfg.entropy_coef = s.ent_coef = 0.01;

  s.agg = agg;
  s.denom = denom;
  s.scale = 1.5;
  ulorl::agg_mode m = ulorl::agg_mode::token_mean;
  if (agg == "seq_sum") m = ulorl::agg_mode::seq_mean_token_sum;
  if (agg == "seq_mean") m = ulorl::agg_mode::seq_mean_token_mean;
  if (agg == "constant") m = ulorl::agg_mode::constant;
  c.cfg.normalizer = {m, denom, 1.5};
  return c;
}
