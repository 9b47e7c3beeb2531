"""OpenRLHF's ``PolicyLoss`` (ppo / gspo, dual clip, token- or sequence-level loss) with its names."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from .. import _ulorl
from . import _common


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    policy_loss_type: str = "ppo",
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip: Optional[float] = None,
    token_level_loss: bool = True,
    dp_size: float = 1.0,
    batch_num_tokens: Optional[float] = None,
    global_batch_size: Optional[float] = None,
    base_action_log_probs: Optional[torch.Tensor] = None,
    kl_estimator: Optional[str] = None,
    kl_coef: float = 0.0,
    check_values: bool = True,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """OpenRLHF's policy loss of one micro-batch (argument order as ``PolicyLoss.forward``).

    policy_loss_type ``ppo`` (log-ratio clamped to +-20) or ``gspo`` (sequence-level loss always);
    dual_clip c > 1 for negative advantages. token_level_loss: sum / tokens (``batch_num_tokens`` *
    dp_size when given, else this micro-batch's tokens), else the mean of row means (over
    ``global_batch_size`` * dp_size when given). ``kl_estimator`` k1 / k2 / k3 (clamped to +-10) with
    ``kl_coef`` adds the KL loss against ``base_action_log_probs`` in the same pass.

    Returns ``(loss, metrics)`` with OpenRLHF's ``clip_ratio`` and ``ppo_kl`` besides ulorl's metrics.
    """
    cfg = _ulorl._openrlhf_config(policy_loss_type, clip_eps_low, clip_eps_high, dual_clip, token_level_loss,
                                  _common.counts(action_mask), dp_size, batch_num_tokens, global_batch_size,
                                  kl_estimator, kl_coef)
    cfg.check_values = check_values
    loss, result = _ulorl._policy_loss(log_probs, old_log_probs, advantages, action_mask, cfg,
                                       base_action_log_probs if kl_estimator else None, None, None, None)
    d = result.as_dict()
    return loss, _common.metrics_of(result, {"clip_ratio": d["clip_fraction"], "ppo_kl": d["approx_kl_k1"]})
