// ulorl/masking.hpp — the masking area: UloRL's masks of well-mastered positive tokens (MPTs),
// static and dynamic (DMMPT), over padded or packed batches.
#pragma once

#include "ulorl/masking/mpt.hpp"
