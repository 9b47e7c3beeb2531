"""NeMo-RL's ``ClippedPGLossFn`` (PPO clip, optional dual clip, reference KL with clamps, token-mean
over the global batch's valid tokens) with NeMo-RL's config names."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from .. import _ulorl
from . import _common


def clipped_pg_loss(
    next_token_logprobs: torch.Tensor,
    prev_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    *,
    ratio_clip_min: float = 0.2,
    ratio_clip_max: float = 0.2,
    ratio_clip_c: Optional[float] = None,
    reference_policy_logprobs: Optional[torch.Tensor] = None,
    reference_policy_kl_penalty: float = 0.0,
    reference_policy_kl_type: str = "k3",
    kl_input_clamp_value: Optional[float] = None,
    kl_output_clamp_value: Optional[float] = None,
    global_valid_toks: Optional[float] = None,
    check_values: bool = True,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """NeMo-RL's clipped policy-gradient loss of one micro-batch: token-mean over
    ``global_valid_toks`` (the global batch's valid tokens; default: this micro-batch's), natively
    partition-exact. KL: ``reference_policy_kl_penalty`` * k1 / k2 / k3 with optional clamps.
    Returns ``(loss, metrics)``."""
    c = _common.counts(token_mask)
    if global_valid_toks is not None:
        c = _ulorl.BatchCounts(float(global_valid_toks), c.sequences, c.rows)
    cfg = _ulorl._nemo_rl_config(ratio_clip_min, ratio_clip_max, ratio_clip_c, reference_policy_kl_type,
                                 kl_input_clamp_value, kl_output_clamp_value, reference_policy_kl_penalty, c)
    cfg.check_values = check_values
    loss, result = _ulorl._policy_loss(next_token_logprobs, prev_logprobs, advantages, token_mask, cfg,
                                       reference_policy_logprobs if reference_policy_kl_penalty != 0.0 else None,
                                       None, None, None)
    return loss, _common.metrics_of(result, {})
