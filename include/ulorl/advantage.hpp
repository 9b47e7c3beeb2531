// ulorl/advantage.hpp — the advantage area: scores, groups, GRPO-family estimators,
// REINFORCE++, GAE, ReMax, Pass@k, GPG/OPO baselines, multi-reward (GDPO) aggregation, the optimal
// token baseline, token broadcast, DAPO dynamic sampling, overlong shaping.
#pragma once

#include "ulorl/advantage/baselines.hpp"
#include "ulorl/advantage/dynamic_sampling.hpp"
#include "ulorl/advantage/gae.hpp"
#include "ulorl/advantage/group_advantage.hpp"
#include "ulorl/advantage/groups.hpp"
#include "ulorl/advantage/multi_reward.hpp"
#include "ulorl/advantage/optimal_token_baseline.hpp"
#include "ulorl/advantage/overlong.hpp"
#include "ulorl/advantage/pass_at_k.hpp"
#include "ulorl/advantage/reinforce_plus_plus.hpp"
#include "ulorl/advantage/remax.hpp"
#include "ulorl/advantage/scores.hpp"
#include "ulorl/advantage/token_broadcast.hpp"
