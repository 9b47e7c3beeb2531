// ulorl/kernels/policy_loss_config.hpp — the configuration checks of the device policy loss, in a
// header the host compiler reads too (C++17, no CUDA headers): policy_loss.cuh's launchers and the
// torch operators' CUDA kernels (ulorl/adapters/torch/ops_cuda.hpp) run the same checks.
#pragma once

#include <string_view>

#include "ulorl/core/config.hpp"
#include "ulorl/loss/kl.hpp"
#include "ulorl/loss/objectives.hpp"
#include "ulorl/loss/policy_loss_types.hpp"

ULORL_NAMESPACE_BEGIN
namespace cuda {

//! The CPU's validators, the coefficients in float (the kernels compute in float): ulorl::error
//! naming `fn` and the field. The device path also refuses the in-pass rollout correction
//! (cudaErrorNotSupported from the launchers).
inline void validate_policy_loss_config(std::string_view fn, const policy_loss_config& cfg) {
  validate_objective(fn, cfg.objective);
  validate_kl(fn, cfg.kl);
  ulorl::detail::validate_loss_scalars<float>(fn, cfg);
}

}  // namespace cuda
ULORL_NAMESPACE_END
