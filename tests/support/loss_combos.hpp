// tests/support/loss_combos.hpp — named policy-loss configurations, each with the matching spec of
// the float64 oracle (support/loss_oracle.hpp):
//   objective    "ppo" (clip-higher 0.2 / 0.28), "ppo_sym" (0.2 / 0.2), "ppo_prorl" (ProRL 0.2 / 0.4),
//                "ppo_dual" (c = 3), "ppo_delta" (delta 1.5, no log-ratio clamp), "gspo_own",
//                "gspo_mean", "cispo", "gmpo", "sapo", "pg"
//   KL           "none", "k1", "abs", "k2", "k3" (input clamp 1.5, output clamp 1.2), "k3_st", "k3_iw",
//                "k1_st", "abs_st", "k2_st" (straight-through: value of the estimator, k2 gradient),
//                "k3_st_clamp" (straight-through with k3's clamps: they clamp the value only),
//                "k1_clamp", "abs_clamp", "k2_clamp" (output clamp tighter than the input clamp;
//                both bind for some tokens of random_problem, where ref - lp is in (-2, 2)),
//                "k1_iclamp", "abs_iclamp", "k2_iclamp" (input clamp only: for these estimators
//                |value| grows with |ref - lp|, so a tighter output clamp hides the input clamp)
//   aggregation  "token_mean" (alias "token"), "seq_sum", "seq_mean", "seq_sum_norm", "constant"
// An unknown name throws std::invalid_argument (a typo must not silently test the default).
#pragma once

#include <ulorl/loss/policy_loss.hpp>

#include <stdexcept>
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
  o.gspo.seq_log_ratio_max = s.seq_max = 10;
  if (objective == "ppo")
    o.kind = ulorl::objective_kind::ppo_clip;
  else if (objective == "ppo_sym")
    s.objective = "ppo", o.kind = ulorl::objective_kind::ppo_clip, o.eps_high = s.eps_high = 0.2;
  else if (objective == "ppo_prorl")
    s.objective = "ppo", o.kind = ulorl::objective_kind::ppo_clip, o.eps_high = s.eps_high = 0.4;
  else if (objective == "ppo_dual")
    s.objective = "ppo", o.kind = ulorl::objective_kind::ppo_clip, o.dual_clip = s.dual_c = 3;
  else if (objective == "ppo_delta")
    s.objective = "ppo", o.kind = ulorl::objective_kind::ppo_clip, o.delta = s.delta = 1.5,
    o.log_ratio_clamp = s.bound = oracle::inf;
  else if (objective == "gspo_own")
    o.kind = ulorl::objective_kind::gspo, o.gspo.seq_gradient = ulorl::sequence_gradient::own_token;
  else if (objective == "gspo_mean")
    o.kind = ulorl::objective_kind::gspo, o.gspo.seq_gradient = ulorl::sequence_gradient::through_mean;
  else if (objective == "cispo")
    o.kind = ulorl::objective_kind::cispo;
  else if (objective == "gmpo")
    o.kind = ulorl::objective_kind::gmpo;
  else if (objective == "sapo")
    o.kind = ulorl::objective_kind::sapo;
  else if (objective == "pg")
    o.kind = ulorl::objective_kind::policy_gradient;
  else
    throw std::invalid_argument("make_combo: unknown objective '" + objective + "'");

  auto& k = c.cfg.kl;
  if (kl != "none") c.cfg.kl_coef = s.beta = 0.3;
  // "<estimator>[_st|_iw|_clamp|_iclamp|_st_clamp]"
  const auto us = kl.find('_');
  const std::string est = kl.substr(0, us), var = us == std::string::npos ? "" : kl.substr(us + 1);
  s.kl = est;
  if (est == "none") {
    if (!var.empty()) throw std::invalid_argument("make_combo: unknown KL '" + kl + "'");
  } else if (est == "k1")
    k.estimator = ulorl::kl_estimator::k1;
  else if (est == "abs")
    k.estimator = ulorl::kl_estimator::abs;
  else if (est == "k2")
    k.estimator = ulorl::kl_estimator::k2;
  else if (est == "k3")
    k.estimator = ulorl::kl_estimator::k3;
  else
    throw std::invalid_argument("make_combo: unknown KL '" + kl + "'");
  if (kl == "k3")
    k.input_clamp = s.kl_in = 1.5, k.output_clamp = s.kl_out = 1.2;
  else if (var == "" || est == "none") {
  } else if (var == "st")
    k.straight_through = s.kl_straight_through = true;
  else if (var == "iw" && est == "k3")
    k.importance_weighted = s.kl_importance_weighted = true;
  else if (var == "st_clamp" && est == "k3")
    k.straight_through = s.kl_straight_through = true, k.input_clamp = s.kl_in = 1.5, k.output_clamp = s.kl_out = 1.2;
  else if (var == "clamp" && (est == "k1" || est == "abs"))
    k.input_clamp = s.kl_in = 1.6, k.output_clamp = s.kl_out = 0.8;
  else if (var == "clamp" && est == "k2")
    k.input_clamp = s.kl_in = 1.7, k.output_clamp = s.kl_out = 0.5;
  else if (var == "iclamp" && est != "k3")
    k.input_clamp = s.kl_in = 0.9;
  else
    throw std::invalid_argument("make_combo: unknown KL '" + kl + "'");
  c.cfg.entropy_coef = s.ent_coef = 0.01;

  s.agg = agg == "token" ? "token_mean" : agg;
  s.denom = denom;
  s.scale = 1.5;
  ulorl::agg_mode m = ulorl::agg_mode::token_mean;
  if (agg == "token" || agg == "token_mean")
    m = ulorl::agg_mode::token_mean;
  else if (agg == "seq_sum")
    m = ulorl::agg_mode::seq_mean_token_sum;
  else if (agg == "seq_mean")
    m = ulorl::agg_mode::seq_mean_token_mean;
  else if (agg == "seq_sum_norm")
    m = ulorl::agg_mode::seq_mean_token_sum_norm;
  else if (agg == "constant")
    m = ulorl::agg_mode::constant;
  else
    throw std::invalid_argument("make_combo: unknown aggregation '" + agg + "'");
  c.cfg.normalizer = {m, denom, 1.5};
  return c;
}
