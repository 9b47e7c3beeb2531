// ulorl/core.hpp — the core layer: configuration macros, errors, views, ragged layouts, numerics,
// the integer hash map behind id lookups, the executors of the row-parallel kernels.
#pragma once

#include "ulorl/core/config.hpp"
#include "ulorl/core/error.hpp"
#include "ulorl/core/flat_map.hpp"
#include "ulorl/core/numerics.hpp"
#include "ulorl/core/parallel.hpp"
#include "ulorl/core/ragged.hpp"
#include "ulorl/core/serialize.hpp"
#include "ulorl/core/views.hpp"
