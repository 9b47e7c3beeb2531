// ulorl/rollout.hpp — the rollout area: UloRL segment rollout (scheduler state machine, provenance
// and importance-sampling plans, checkpoint format, and the discrete-event rollout simulator).
#pragma once

#include "ulorl/rollout/checkpoint.hpp"
#include "ulorl/rollout/provenance.hpp"
#include "ulorl/rollout/segment_scheduler.hpp"
#include "ulorl/rollout/simulator.hpp"
