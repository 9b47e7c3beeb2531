"""TRL's ``GRPOTrainer._compute_loss`` with TRL's names (GRPOConfig fields as keyword arguments)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from .. import _ulorl
from .._api import _fail
from . import _common


def grpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: Optional[torch.Tensor],
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    ref_per_token_logps: Optional[torch.Tensor] = None,
    loss_type: str = "dapo",
    epsilon: float = 0.2,
    epsilon_high: Optional[float] = None,
    delta: Optional[float] = None,
    beta: float = 0.0,
    importance_sampling_level: str = "token",
    use_bias_correction_kl: bool = False,
    max_completion_length: Optional[int] = None,
    gradient_accumulation_steps: int = 1,
    num_items_in_batch: Optional[float] = None,
    num_processes: int = 1,
    check_values: bool = True,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """TRL's GRPO loss of one micro-batch.

    ``advantages`` is one value per completion ``[B]`` (as TRL) or per token ``[B, T]``.
    ``old_per_token_logps`` None means on-policy (TRL uses ``per_token_logps.detach()``).
    loss_type: ``grpo`` (mean of sequence means / gradient_accumulation_steps), ``bnpo``,
    ``dr_grpo`` (needs ``max_completion_length``), ``dapo`` (divides by ``num_items_in_batch`` /
    num_processes; default: this micro-batch's tokens). ``beta`` > 0 adds beta * k3 against
    ``ref_per_token_logps`` (times the ratio with ``use_bias_correction_kl``); epsilon_high defaults
    to epsilon; ``delta`` caps the ratio (two-sided clip); importance_sampling_level ``token`` or
    ``sequence`` (GSPO).

    Returns ``(loss, metrics)`` with TRL's ``clip_ratio/low_mean``, ``clip_ratio/high_mean``,
    ``clip_ratio/region_mean`` and (beta != 0) ``kl`` besides ulorl's metrics.
    """
    if loss_type == "dr_grpo" and max_completion_length is None:
        raise _fail("presets::trl::grpo_loss", "max_completion_length", "required for loss_type 'dr_grpo'")
    old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
    if advantages.dim() == 1:
        if per_token_logps.dim() != 2 or advantages.shape[0] != per_token_logps.shape[0]:
            raise _fail("presets::trl::grpo_loss", "advantages",
                        f"has {advantages.shape[0]} elements but 'per_token_logps' has shape "
                        f"{tuple(per_token_logps.shape)} (one advantage per completion row)")
        adv = advantages.unsqueeze(-1).expand_as(per_token_logps)  # a stride-0 view, no copy
    else:
        adv = advantages
    cfg = _ulorl._trl_config(loss_type, epsilon, epsilon_high, delta, importance_sampling_level, beta,
                             use_bias_correction_kl, _common.counts(completion_mask),
                             float(max_completion_length or 0), float(gradient_accumulation_steps),
                             num_items_in_batch, float(num_processes))
    cfg.check_values = check_values
    loss, result = _ulorl._policy_loss(per_token_logps, old, adv, completion_mask, cfg,
                                       ref_per_token_logps if beta != 0.0 else None, None, None, None)
    clip = _ulorl._trl_clip_ratios(result, importance_sampling_level)
    extra: Dict[str, Any] = {"clip_ratio/low_mean": clip["low_mean"], "clip_ratio/high_mean": clip["high_mean"],
                             "clip_ratio/region_mean": clip["region_mean"]}
    if beta != 0.0:
        extra["kl"] = result.as_dict()["kl_mean"]
    return loss, _common.metrics_of(result, extra)
