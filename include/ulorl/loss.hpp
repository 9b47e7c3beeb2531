// ulorl/loss.hpp — umbrella of the policy-loss area: importance ratio and rollout correction,
// objectives (PPO clip / clip-higher / dual clip / delta, GSPO, CISPO, GMPO, SAPO, policy gradient),
// KL estimators and the weighted KL term, entropy bonus, partition-exact aggregation, metrics, the
// token selections (DPPO, KL-Cov, Clip-Cov), VESPO's weights and the fused policy loss. The
// frameworks' presets are ulorl/presets.hpp.
#pragma once

#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/entropy.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/metrics.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/policy_loss.hpp"
#include "ulorl/loss/ratio.hpp"
#include "ulorl/loss/rollout_correction.hpp"
#include "ulorl/loss/token_selection.hpp"
#include "ulorl/loss/vespo.hpp"
#include "ulorl/loss/weighted_kl.hpp"
