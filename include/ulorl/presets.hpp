// ulorl/presets.hpp — the framework presets, one header a framework (ulorl/presets/<framework>.hpp):
// verl, TRL, OpenRLHF, NeMo-RL, Open-Instruct, slime and Liger-Kernel, each under that framework's
// option names and defaults (namespace ulorl::presets::<framework>). The layer sits above the
// advantage, loss, logits, masking and control areas and chooses their parameters; none of those
// areas includes it. python/ulorl/presets/<framework>.py mirrors each header.
#pragma once

#include "ulorl/presets/liger.hpp"
#include "ulorl/presets/nemo_rl.hpp"
#include "ulorl/presets/open_instruct.hpp"
#include "ulorl/presets/openrlhf.hpp"
#include "ulorl/presets/slime.hpp"
#include "ulorl/presets/trl.hpp"
#include "ulorl/presets/verl.hpp"
