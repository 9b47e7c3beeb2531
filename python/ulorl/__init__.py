"""ulorl: RLVR algorithms for training reasoning LLMs, over torch tensors.

The fused policy loss (every objective, KL estimator, entropy term and partition-exact aggregation
of ulorl/loss/), the fused logits and linear-head paths, GRPO-family advantages with the
frameworks' presets, DAPO's dynamic-sampling filter and overlong shaping, UloRL's MPT mask and
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
    SegmentScheduler,
    count_batch,
    global_normalizer,
    kl_share,
    old_log_prob_plan,
    old_log_prob_versions,
    recompute_token_count,
)
from ._api import (  # noqa: E402,F401
    advantage_preset,
    broadcast_to_tokens,
    dynamic_sampling_filter,
    group_advantages,
    linear_head_policy_loss,
    logprobs_from_logits,
    mpt_mask,
    overlong_penalty,
    policy_loss,
    policy_loss_config,
    policy_loss_from_logits,
)
from . import presets  # noqa: E402,F401

__version__ = "0.1.0"

__all__ = [
    "AdvantagePreset", "BatchCounts", "EntropyController", "Error", "KLController", "Normalizer", "PlanItem",
    "PolicyLossConfig", "PolicyLossResult", "ReferenceResetPolicy", "SegmentScheduler", "advantage_preset",
    "broadcast_to_tokens", "count_batch", "dynamic_sampling_filter", "global_normalizer", "group_advantages",
    "kl_share", "linear_head_policy_loss", "logprobs_from_logits", "mpt_mask", "old_log_prob_plan",
    "old_log_prob_versions", "overlong_penalty", "policy_loss", "policy_loss_config", "policy_loss_from_logits",
    "presets", "recompute_token_count",
]
