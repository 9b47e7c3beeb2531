"""ulorl: RLVR algorithms for training reasoning LLMs, over torch tensors.

The fused policy loss (every objective, KL estimator, entropy term and partition-exact aggregation
of ulorl/loss/), the fused logits and linear-head paths, GRPO-family advantages with the
frameworks' presets (and GPG, OPO, REINFORCE++, multi-reward / GDPO and the optimal token baseline),
the rollout correction (importance weights, rejection sampling), DAPO's dynamic-sampling filter and overlong shaping, UloRL's MPT mask and
segment scheduler, and the KL / entropy / reference-reset controllers. Gradients are exact (the
C++ kernels' own); every rejected input raises :class:`ulorl.Error` (a ``ValueError``) whose
message names the function, the argument and the offending index.

``ulorl.presets.verl``, ``.trl``, ``.openrlhf`` and ``.nemo_rl`` take the frameworks' own option
names, so that a trainer swaps one call. See docs/python.md.
"""

import pkgutil as _pkgutil

# The compiled module may sit in another directory of sys.path (a build tree): extend the package.
__path__ = _pkgutil.extend_path(__path__, __name__)

import torch as _torch  # noqa: E402,F401  (loads libtorch before the extension needs it)

from . import _ulorl  # noqa: E402
from ._ulorl import (  # noqa: E402,F401
    AdvantagePreset,
    BatchCounts,
    EntropyController,
    Error,
    KLController,
    Normalizer,
    PlanItem,
    PolicyLossConfig,
    PolicyLossResult,
    ReferenceResetPolicy,
    RolloutCorrectionConfig,
    RolloutCorrectionMetrics,
    RolloutCorrectionStatistics,
    SegmentScheduler,
    count_batch,
    global_normalizer,
    host_fallback,
    kl_share,
    old_log_prob_plan,
    old_log_prob_versions,
    recompute_token_count,
    rollout_correction_finalize,
    set_host_fallback,
)
from ._api import (  # noqa: E402,F401
    advantage_preset,
    agg_loss,
    broadcast_to_tokens,
    dynamic_sampling_filter,
    gae_advantages,
    gpg_advantages,
    group_advantages,
    kl_penalty,
    linear_head_policy_loss,
    logits_statistics,
    logprobs_from_logits,
    mpt_mask,
    multi_reward_advantages,
    off_policy_mask,
    opo_advantages,
    optimal_token_baseline_advantages,
    overlong_penalty,
    pass_at_k_advantages,
    policy_loss,
    policy_loss_config,
    policy_loss_from_logits,
    reinforce_plus_plus_advantages,
    reinforce_plus_plus_baseline_advantages,
    remax_advantages,
    rollout_correction,
    rollout_correction_config,
)
from . import presets  # noqa: E402,F401

__version__ = "0.1.0"

__all__ = [
    "AdvantagePreset", "BatchCounts", "EntropyController", "Error", "KLController", "Normalizer", "PlanItem",
    "PolicyLossConfig", "PolicyLossResult", "ReferenceResetPolicy", "RolloutCorrectionConfig",
    "RolloutCorrectionMetrics", "RolloutCorrectionStatistics", "SegmentScheduler", "advantage_preset", "agg_loss", "broadcast_to_tokens",
    "count_batch", "dynamic_sampling_filter", "gae_advantages", "global_normalizer", "gpg_advantages", "group_advantages",
    "host_fallback", "kl_penalty", "kl_share", "linear_head_policy_loss", "logits_statistics", "logprobs_from_logits", "mpt_mask",
    "multi_reward_advantages", "off_policy_mask", "old_log_prob_plan", "old_log_prob_versions", "opo_advantages",
    "optimal_token_baseline_advantages", "overlong_penalty", "pass_at_k_advantages", "policy_loss", "policy_loss_config",
    "policy_loss_from_logits", "presets", "recompute_token_count", "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages", "remax_advantages", "rollout_correction", "rollout_correction_config",
    "rollout_correction_finalize", "set_host_fallback",
]
