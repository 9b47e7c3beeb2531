"""TRL's ``GRPOTrainer._compute_loss`` with TRL's names (GRPOConfig fields as keyword arguments)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from .. import _ulorl
from .._api import _check_nan_options, _fail, _with_gradient


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
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    off_policy_mask_threshold: Optional[float] = None,
    top_entropy_quantile: float = 1.0,
    entropy_coef: float = 0.0,
    entropies: Optional[torch.Tensor] = None,
    sampling_per_token_logps: Optional[torch.Tensor] = None,
    importance_sampling_ratio: Optional[torch.Tensor] = None,
    check_values: bool = True,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """TRL's GRPO loss of one micro-batch: ``ulorl::presets::trl::grpo_loss`` (CPU tensors, float32 or
    float64), with autograd to ``per_token_logps`` and ``entropies``.

    ``advantages`` is one value per completion ``[B]`` (as TRL). ``old_per_token_logps`` None means
    on-policy (TRL uses ``per_token_logps.detach()``). loss_type: ``grpo`` (mean of sequence means /
    gradient_accumulation_steps), ``bnpo``, ``dr_grpo`` (needs ``max_completion_length``), ``dapo``
    (divides by ``num_items_in_batch`` / num_processes; default: this micro-batch's tokens),
    ``cispo`` (ratio capped at epsilon_high, detached), ``sapo`` (sapo_temperature_pos / _neg),
    ``luspo`` (rows weighted by their length), ``vespo`` (vespo_k_* / vespo_lambda_*).
    importance_sampling_level ``token``, ``sequence`` (GSPO; cispo / sapo take the row's log-ratio)
    or ``sequence_token`` (GSPO-token). ``beta`` > 0 adds beta * k3 against ``ref_per_token_logps``
    (times the ratio with ``use_bias_correction_kl``); epsilon_high defaults to epsilon; ``delta``
    caps the ratio.

    Multipliers of the policy term: ``off_policy_mask_threshold`` (OPSM against
    ``sampling_per_token_logps``, default old_per_token_logps), ``top_entropy_quantile`` < 1 (keeps
    the tokens of the highest ``entropies``), ``importance_sampling_ratio`` ``[B, T]`` or ``[B, 1]``
    (the vLLM IS ratio, :func:`rollout_correction`). ``entropy_coef`` != 0 subtracts the entropy
    bonus of ``entropies``.

    Returns ``(loss, metrics)`` with TRL's ``clip_ratio/low_mean``, ``clip_ratio/high_mean``,
    ``clip_ratio/region_mean`` (cispo: ``cispo_clip_ratio``; vespo: ``vespo_phi_seq_mean``; sapo:
    none), ``kl`` (beta != 0) and ``entropy`` (given entropies) besides ulorl's metrics.
    """
    fn = "presets::trl::grpo_loss"
    if loss_type == "dr_grpo" and max_completion_length is None:
        raise _fail(fn, "max_completion_length", "required for loss_type 'dr_grpo'")
    if advantages.dim() != 1 or per_token_logps.dim() != 2 or advantages.shape[0] != per_token_logps.shape[0]:
        raise _fail(fn, "advantages",
                    f"has shape {tuple(advantages.shape)} but 'per_token_logps' has shape "
                    f"{tuple(per_token_logps.shape)} (one advantage per completion row, [B])")
    old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps.detach()

    def detached(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if t is None else t.detach()

    value, grad, grad_entropies, m = _ulorl._trl_grpo_loss(
        per_token_logps.detach(), old, advantages.detach(), completion_mask, detached(ref_per_token_logps),
        detached(sampling_per_token_logps), detached(entropies), detached(importance_sampling_ratio), loss_type,
        epsilon, epsilon_high, delta, beta, importance_sampling_level, use_bias_correction_kl,
        float(max_completion_length if max_completion_length is not None else 256),
        float(gradient_accumulation_steps), num_items_in_batch, float(num_processes), sapo_temperature_pos,
        sapo_temperature_neg, vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg,
        off_policy_mask_threshold, top_entropy_quantile, entropy_coef, check_values)
    loss = _with_gradient(per_token_logps, value, grad, "presets::trl::grpo_loss")
    if grad_entropies is not None:
        # The value is all in `loss`; this term carries d loss / d entropies.
        loss = loss + _with_gradient(entropies, 0.0, grad_entropies, "presets::trl::grpo_loss")
    m["loss"] = loss.item()
    return loss, m


def rollout_correction(
    old_per_token_logps: torch.Tensor,
    sampling_per_token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    vllm_importance_sampling_mode: str = "sequence_mask",
    vllm_importance_sampling_clip_min: Optional[float] = None,
    vllm_importance_sampling_clip_max: Optional[float] = 3.0,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """TRL's vLLM importance-sampling ratio (``vllm_importance_sampling_mode`` token_truncate /
    token_mask / sequence_truncate / sequence_mask, clip_min / clip_max; None: no bound) of the
    trainer's ``old_per_token_logps`` against vLLM's ``sampling_per_token_logps``. The ratio is
    unclamped (an overflow is +inf, then truncated or masked). Returns ``(importance_sampling_ratio,
    metrics)``, the ratio in the log-probs' shape (a sequence mode's row value on every position),
    metrics ``importance_sampling_ratio_min`` / ``_mean`` / ``_max`` and
    ``sampling_logp_difference_mean`` / ``_max``."""
    cfg = _ulorl._trl_rollout_correction_config(vllm_importance_sampling_mode, vllm_importance_sampling_clip_min,
                                                vllm_importance_sampling_clip_max)
    w, _, m = _ulorl._rollout_correction(old_per_token_logps, sampling_per_token_logps, completion_mask, cfg, None)
    d = m.as_dict()
    return w, {"importance_sampling_ratio_min": d["unit_weight_min"], "importance_sampling_ratio_mean": d["unit_weight_mean"],
               "importance_sampling_ratio_max": d["unit_weight_max"],
               "sampling_logp_difference_mean": d["abs_log_ratio_mean"],
               "sampling_logp_difference_max": d["abs_log_ratio_max"]}


def off_policy_mask(per_token_logps: torch.Tensor, sampling_per_token_logps: torch.Tensor, advantages: torch.Tensor,
                    completion_mask: torch.Tensor, off_policy_mask_threshold: float) -> torch.Tensor:
    """TRL's ``get_off_policy_mask``: 1 for every position of a row kept (A_b >= 0, or its mean
    sampling_per_token_logps - per_token_logps over the completion <= the threshold), else 0;
    ``advantages`` ``[B]``."""
    keep, _, _ = _ulorl._off_policy_mask(per_token_logps.detach(), sampling_per_token_logps, advantages,
                                         completion_mask, "trl", off_policy_mask_threshold, "factor")
    return keep


def adaptive_entropy_controller(entropy_coef: float = 0.0, entropy_target: float = 0.2,
                                entropy_coef_delta: float = 0.005, entropy_coef_min: float = 0.0,
                                entropy_coef_max: float = 1.0) -> _ulorl.EntropyController:
    """TRL's ``use_adaptive_entropy`` as an :class:`ulorl.EntropyController`: each optimizer step applies
    ``bonus()`` (the coefficient while the previous step's entropy was <= entropy_target, else 0),
    then ``update(H)`` moves it by entropy_coef_delta within [entropy_coef_min, entropy_coef_max]."""
    return _ulorl._trl_adaptive_entropy(entropy_coef, entropy_target, entropy_coef_delta, entropy_coef_min,
                                        entropy_coef_max)


_check_nan_options(globals(), "presets::trl::")
