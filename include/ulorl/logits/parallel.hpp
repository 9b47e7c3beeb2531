// ulorl/logits/parallel.hpp — the executors moved to ulorl/core/parallel.hpp (the policy loss uses
// them too); this header keeps the old include path working.
#pragma once

#include "ulorl/core/parallel.hpp"
