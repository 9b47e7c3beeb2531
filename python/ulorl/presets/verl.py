"""verl's actor loss (``compute_policy_loss_*``, ``kl_penalty``, ``agg_loss``) with verl's names.

``policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_mode=..., clip_ratio_low=...,
clip_ratio_high=..., loss_agg_mode=...)`` is verl's ``get_policy_loss_fn(loss_mode)(...)`` plus,
optionally, the actor's entropy bonus (``entropy_coeff``) and KL loss (``use_kl_loss``:
``kl_loss_type``, ``kl_loss_coef``) in the same fused pass. Argument order is verl's (old first).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from .. import _ulorl
from . import _common


def policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    loss_mode: str = "vanilla",
    clip_ratio: float = 0.2,
    clip_ratio_low: Optional[float] = None,
    clip_ratio_high: Optional[float] = None,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: Optional[torch.Tensor] = None,
    dp_size: float = 1.0,
    batch_num_tokens: Optional[float] = None,
    global_batch_size: Optional[float] = None,
    loss_scale_factor: Optional[float] = None,
    entropy: Optional[torch.Tensor] = None,
    entropy_coeff: float = 0.0,
    ref_log_prob: Optional[torch.Tensor] = None,
    kl_loss_type: Optional[str] = None,
    kl_loss_coef: float = 0.0,
    check_values: bool = True,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """verl's policy loss of one micro-batch.

    loss_mode: ``vanilla`` (PPO clip-higher + dual clip ``clip_ratio_c``), ``gspo``, ``cispo``,
    ``geo_mean``, ``sapo``, ``gpg``. clip_ratio_low / high default to ``clip_ratio`` (as verl).
    loss_agg_mode: ``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``,
    ``seq-mean-token-sum-norm``; gspo and sapo use seq-mean-token-mean, geo_mean its own mean, as
    in verl. Normaliser: token-mean divides by ``batch_num_tokens`` (default: this micro-batch's
    valid tokens) times dp_size, the seq modes by ``global_batch_size`` (default: this micro-batch's
    non-empty rows), seq-mean-token-sum-norm by ``loss_scale_factor`` (default: the padded length).
    kl_loss_type: verl's ``kl_penalty`` names (kl/k1, abs, mse/k2, low_var_kl/k3, with "+" for the
    straight-through gradient). The entropy and KL terms share the policy term's normaliser.

    Returns ``(loss, metrics)``: the loss (pg_loss + kl_loss_coef * kl - entropy_coeff * entropy,
    aggregated) with autograd to ``log_prob`` (and ``entropy``), and a dict with verl's
    ``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower`` besides ulorl's metrics.
    """
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    cfg = _ulorl._verl_config(loss_mode, low, high, clip_ratio_c, tau_pos, tau_neg, loss_agg_mode,
                              _common.counts(response_mask), dp_size, batch_num_tokens, global_batch_size,
                              loss_scale_factor, _common.padded_length(log_prob), kl_loss_type, kl_loss_coef,
                              entropy_coeff)
    cfg.check_values = check_values
    loss, result = _ulorl._policy_loss(log_prob, old_log_prob, advantages, response_mask, cfg, ref_log_prob,
                                       rollout_is_weights, entropy if entropy_coeff != 0.0 else None, None)
    return loss, _common.metrics_of(result, _ulorl._verl_metrics(loss_mode, result))


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl's ``compute_grpo_outcome_advantage``: scores = token_level_rewards summed over each row,
    advantages by prompt ``index`` (unbiased std + epsilon; Dr. GRPO without the std), broadcast
    onto the mask. Returns ``(advantages, returns)`` as verl does (the two are equal)."""
    from .._api import advantage_preset

    p = advantage_preset("verl", estimator="grpo", epsilon=epsilon, norm_adv_by_std=norm_adv_by_std_in_grpo)
    ids = index if isinstance(index, torch.Tensor) else torch.as_tensor(index, dtype=torch.int64)
    scores = token_level_rewards.sum(dim=-1)
    adv = _ulorl._broadcast_to_tokens(_ulorl._group_advantages(scores.contiguous(), ids, None, p), response_mask, p,
                                      None)
    return adv, adv
