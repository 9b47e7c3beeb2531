// ulorl/loss/rollout_correction.hpp — rollout correction for the training-vs-rollout log-prob
// mismatch: importance-sampling weights (token / sequence level; truncated "TIS", masked "IcePop",
// sequence-gated "seq-mask-tis"; optional batch normalisation), rejection-sampling keep-masks
// (token / sequence sum / mean / max of the k1, k2, k3 divergences, chained) and the mismatch
// diagnostics. The frameworks' settings are in ulorl/presets/<framework>.hpp.
//
//   x = old_log_prob - rollout_log_prob,  rho = exp(clamp(x or sum_t x m)),  w = weighting(rho)
//
// (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL"; verl
// rollout_corr_helper.) The weights are detached and feed policy_loss_inputs::weights; the
// keep-mask feeds policy_loss_inputs::mask. docs/rollout_correction.md has every formula.
//   config.hpp   enums, their *_from_name parsers, the typed configuration and its validation
//   compute.hpp  apply() and the partition-exact accumulate() / finalize() / normalize_weights()
#pragma once

#include "ulorl/loss/rollout_correction/compute.hpp"
#include "ulorl/loss/rollout_correction/config.hpp"
