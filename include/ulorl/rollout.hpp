// ulorl/rollout.hpp — the rollout area: UloRL segment rollout (scheduler state machine, provenance
// and importance-sampling plans, checkpoint format, the discrete-event rollout simulator, and the
// adaptive segment count that simulates candidates on observed lengths and costs).
#pragma once

#include "ulorl/rollout/checkpoint.hpp"
#include "ulorl/rollout/provenance.hpp"
#include "ulorl/rollout/segment_autotune.hpp"
#include "ulorl/rollout/segment_scheduler.hpp"
#include "ulorl/rollout/simulator.hpp"
