"""OpenRLHF's ``PolicyLoss`` (ppo / gspo, dual clip, token- or sequence-level loss, vLLM IS correction),
its loss reduction, ``compute_approx_kl`` and the vLLM importance-sampling weights, with its names."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import torch

from .. import _ulorl
from .._api import _check_nan_options, _fail, _policy_loss_result, _with_gradient
from . import _common


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: Optional[torch.Tensor] = None,
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
    rollout_log_probs: Optional[torch.Tensor] = None,
    enable_vllm_is_correction: bool = False,
    vllm_is_correction_type: str = "tis",
    vllm_is_truncated_threshold: Sequence[float] = (0.5, 5.0),
    check_values: bool = True,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """OpenRLHF's policy loss of one micro-batch (argument order as ``PolicyLoss.forward``; an
    ``action_mask`` of None, as there, means every token valid).

    policy_loss_type ``ppo`` (log-ratio clamped to +-20) or ``gspo`` (sequence-level loss always);
    dual_clip c > 1 for negative advantages. token_level_loss: sum / tokens (``batch_num_tokens`` *
    dp_size when given, else this micro-batch's tokens), else the mean of row means (over
    ``global_batch_size`` * dp_size when given). ``kl_estimator`` k1 / k2 / k3 (clamped to +-10) with
    ``kl_coef`` adds the KL loss against ``base_action_log_probs`` in the same pass.

    ``enable_vllm_is_correction`` with ``rollout_log_probs`` (the inference engine's): ``ppo`` multiplies
    the loss by the :func:`rollout_correction` weights of (old_log_probs, rollout_log_probs)
    (``vllm_is_correction_type`` tis / icepop / seq-mask-tis, ``vllm_is_truncated_threshold``
    [lo, hi]) and logs ``vllm_kl``; ``gspo`` takes its sequence ratio against the rollout policy.

    Returns ``(loss, metrics)`` with OpenRLHF's ``clip_ratio`` and ``ppo_kl`` besides ulorl's metrics.
    """
    cfg = _ulorl._openrlhf_config(policy_loss_type, clip_eps_low, clip_eps_high, dual_clip, token_level_loss,
                                  _common.counts(action_mask, tokens=log_probs), dp_size, batch_num_tokens,
                                  global_batch_size, kl_estimator, kl_coef)
    cfg.check_values = check_values
    plan = _ulorl._openrlhf_vllm_is_plan(policy_loss_type, enable_vllm_is_correction)
    if (plan["weights"] or plan["ratio_against_rollout"]) and rollout_log_probs is None:
        raise _fail("presets::openrlhf::policy_loss", "rollout_log_probs", "required by enable_vllm_is_correction")
    weights, extra = None, {}
    if plan["weights"]:
        rc = _ulorl._openrlhf_rollout_correction_config(vllm_is_correction_type, list(vllm_is_truncated_threshold))
        weights, _, rm = _ulorl._rollout_correction(old_log_probs, rollout_log_probs, action_mask, rc, None)
        extra["vllm_kl"] = rm.as_dict()["kl"]
    baseline = rollout_log_probs if plan["ratio_against_rollout"] else old_log_probs
    loss, result = _policy_loss_result(log_probs, baseline, advantages, action_mask, cfg,
                                       base_action_log_probs if kl_estimator else None, weights, None, None)
    d = result.as_dict()
    ppo_kl = d["approx_kl_k1"]
    if plan["ratio_against_rollout"]:
        # ppo_kl stays against the old policy: the mean of old_log_probs - log_probs over the valid
        # tokens, the rollout-correction diagnostic `kl` of (log_probs, old_log_probs).
        _, _, km = _ulorl._rollout_correction(log_probs.detach(), old_log_probs, action_mask, _NO_WEIGHTS, None)
        ppo_kl = km.as_dict()["kl"]
    extra.update({"clip_ratio": d["clip_fraction"], "ppo_kl": ppo_kl})
    return loss, _common.metrics_of(result, extra)


_NO_WEIGHTS = _ulorl._rollout_correction_config("none", "truncate", 0.0, 2.0, 20.0, "infinity", "zero", "drop", False,
                                                [], 20.0, 20.0, False, False)


def agg_loss(
    loss: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    token_level_loss: bool = True,
    dp_size: float = 1.0,
    batch_num_tokens: Optional[float] = None,
    global_batch_size: Optional[float] = None,
) -> torch.Tensor:
    """OpenRLHF's loss reduction: token-level ``sum / tokens`` (``batch_num_tokens`` * dp_size when
    given, else this batch's tokens), else the mean of row means (over ``global_batch_size`` * dp_size
    when given, else the non-empty rows). A 0-dim tensor with autograd to ``loss``."""
    norm = _ulorl._openrlhf_normalizer(token_level_loss, _common.counts(action_mask), dp_size, batch_num_tokens,
                                       global_batch_size)
    value, grad = _ulorl._agg_loss(loss.detach(), action_mask, norm)
    return _with_gradient(loss, value, grad, "presets::openrlhf::agg_loss")


def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_estimator: str = "k1") -> torch.Tensor:
    """OpenRLHF's ``compute_approx_kl``: k1, k2 or k3 of log_probs - log_probs_base, clamped to +-10;
    element-wise, with autograd to ``log_probs``."""
    kl, grad = _ulorl._kl_penalty(log_probs.detach(), log_probs_base, "openrlhf", kl_estimator, None, None)
    return _with_gradient(log_probs, kl, grad, "presets::openrlhf::compute_approx_kl")


def rollout_correction(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    vllm_is_correction_type: str = "tis",
    vllm_is_truncated_threshold: Sequence[float] = (0.5, 5.0),
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """OpenRLHF's vLLM importance-sampling weights (``--algo.advantage.is_correction_type`` tis /
    icepop / seq-mask-tis, ``vllm_is_truncated_threshold`` [lo, hi]): returns ``(weights, metrics)``
    with ``vllm_kl``."""
    rc = _ulorl._openrlhf_rollout_correction_config(vllm_is_correction_type, list(vllm_is_truncated_threshold))
    w, _, m = _ulorl._rollout_correction(old_log_probs, rollout_log_probs, action_mask, rc, None)
    return w, {"vllm_kl": m.as_dict()["kl"]}


_check_nan_options(globals(), "presets::openrlhf::")
