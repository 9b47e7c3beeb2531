// ulorl/ulorl.hpp — the umbrella header: every host header of ulorl (never CUDA).
// Areas: core (views, ragged layouts, errors, numerics), advantage (GRPO family, dynamic
// sampling, overlong shaping), loss (ratios, objectives, KL, aggregation), logits (fused CPU
// kernels), masking (UloRL MPT), control (KL/entropy controllers, ProRL resets), rollout (UloRL
// segment scheduler), and above them the framework presets (verl, TRL, OpenRLHF, NeMo-RL,
// Open-Instruct, slime, Liger).
#pragma once

#include "ulorl/core.hpp"
#include "ulorl/advantage.hpp"
#include "ulorl/control.hpp"
#include "ulorl/logits.hpp"
#include "ulorl/loss.hpp"
#include "ulorl/masking.hpp"
#include "ulorl/presets.hpp"
#include "ulorl/rollout.hpp"
