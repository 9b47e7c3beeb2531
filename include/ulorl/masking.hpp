// ulorl/masking.hpp — the masking area: UloRL's masks of well-mastered positive tokens (MPTs),
// static and dynamic (DMMPT), and off-policy sequence masking (DeepSeek-V3.2 OPSM), over padded or
// packed batches.
#pragma once

#include "ulorl/masking/entropy_quantile.hpp"
#include "ulorl/masking/mpt.hpp"
#include "ulorl/masking/off_policy.hpp"
