// ulorl/presets/slime.hpp — slime's semantics under slime's flag names (THUDM/slime): off-policy
// sequence masking, `--use-opsm --opsm-delta` (`compute_opsm_mask`, masking/off_policy.hpp), whose
// advantage is the token's, so that a drifted row drops its negative-advantage tokens.
#pragma once

#include "ulorl/core/config.hpp"
#include "ulorl/masking/off_policy.hpp"

ULORL_NAMESPACE_BEGIN
namespace presets::slime {

//! slime `--use-opsm --opsm-delta` (`compute_opsm_mask`): per-token advantages, default delta 1e-4.
[[nodiscard]] constexpr off_policy_mask_config off_policy_mask(double opsm_delta = 1e-4) noexcept {
  return {.delta = opsm_delta, .advantage = off_policy_advantage_level::token};
}

}  // namespace presets::slime
ULORL_NAMESPACE_END
