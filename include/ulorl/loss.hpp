// ulorl/loss.hpp — umbrella of the policy-loss area: importance ratio and rollout correction,
// objectives (PPO clip / clip-higher / dual clip / delta, GSPO, CISPO, GMPO, SAPO, policy gradient),
// KL estimators, entropy bonus, partition-exact aggregation, metrics, the fused policy loss and the
// framework presets (verl, OpenRLHF, NeMo-RL, TRL) and TRL's GRPO loss composed in one call.
#pragma once

#include "ulorl/loss/aggregation.hpp"
#include "ulorl/loss/entropy.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/metrics.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/policy_loss.hpp"
#include "ulorl/loss/presets.hpp"
#include "ulorl/loss/ratio.hpp"
#include "ulorl/loss/rollout_correction.hpp"
#include "ulorl/loss/trl_grpo_loss.hpp"
#include "ulorl/loss/vespo.hpp"
