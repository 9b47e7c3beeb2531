// ulorl/control.hpp — the control area: small state machines the host drives once per step —
// KL coefficient controllers (fixed, adaptive), the adaptive entropy-bonus controller, and ProRL's
// reference-reset policy — and the byte format in which they checkpoint.
#pragma once

#include "ulorl/control/checkpoint.hpp"
#include "ulorl/control/entropy_controller.hpp"
#include "ulorl/control/kl_controller.hpp"
#include "ulorl/control/reference_reset.hpp"
