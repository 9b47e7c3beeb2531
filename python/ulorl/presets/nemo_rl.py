"""NeMo-RL's ``ClippedPGLossFn`` (PPO clip, optional dual clip, importance-sampling correction against
the generation log-probs, reference KL with clamps, token- or sequence-level mean over the global
batch), ``calculate_kl`` and the truncated importance-sampling weights, with NeMo-RL's config names."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from .. import _ulorl
from .._api import _check_nan_options, _fail, _policy_loss_result, _with_gradient
from . import _common


def clipped_pg_loss(
    next_token_logprobs: torch.Tensor,
    prev_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    *,
    generation_logprobs: Optional[torch.Tensor] = None,
    ratio_clip_min: float = 0.2,
    ratio_clip_max: float = 0.2,
    ratio_clip_c: Optional[float] = None,
    token_level_loss: bool = True,
    force_on_policy_ratio: bool = False,
    disable_ppo_ratio: bool = False,
    use_importance_sampling_correction: bool = False,
    truncated_importance_sampling_type: Optional[str] = None,
    truncated_importance_sampling_ratio: Optional[float] = None,
    truncated_importance_sampling_ratio_min: Optional[float] = None,
    reference_policy_logprobs: Optional[torch.Tensor] = None,
    reference_policy_kl_penalty: float = 0.0,
    reference_policy_kl_type: str = "k3",
    kl_input_clamp_value: Optional[float] = None,
    kl_output_clamp_value: Optional[float] = None,
    use_on_policy_kl_approximation: bool = False,
    global_valid_toks: Optional[float] = None,
    global_valid_seqs: Optional[float] = None,
    check_values: bool = True,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """NeMo-RL's clipped policy-gradient loss of one micro-batch.

    Actor loss: PPO clip (``ratio_clip_min`` / ``ratio_clip_max``, unclamped ratio, dual clip
    ``ratio_clip_c`` > 1), or ratio 1 with derivative 1 (``force_on_policy_ratio``), or -A logp
    (``disable_ppo_ratio``); token-mean over ``global_valid_toks`` (``token_level_loss``) or the mean
    of row means over ``global_valid_seqs`` (defaults: this micro-batch's tokens / rows), natively
    partition-exact. ``use_importance_sampling_correction`` multiplies it by the weights of
    (prev_logprobs, ``generation_logprobs``) (:func:`rollout_correction`'s, with
    ``truncated_importance_sampling_type`` tis / icepop / seq-mask-tis). Reference KL
    (``reference_policy_kl_penalty`` != 0): k1 / k2 / k3 of ``reference_policy_logprobs`` with
    optional clamps, weighted by exp(logp - sg(logp)) (whose derivative enters the gradient) or, with
    ``use_on_policy_kl_approximation``, exp(logp - generation_logprobs).

    Returns ``(loss, metrics)``: ulorl's metrics plus NeMo-RL's ``probs_ratio``,
    ``probs_ratio_clamped``, ``sampling_importance_ratio`` (given generation_logprobs),
    ``is_oob_ratio`` (with a truncation type) and ``kl_penalty`` (the unscaled KL, when on).
    """
    fn = "presets::nemo_rl::clipped_pg_loss"
    o = _ulorl._nemo_rl_clipped_pg_loss_options(
        ratio_clip_min, ratio_clip_max, ratio_clip_c, token_level_loss, force_on_policy_ratio, disable_ppo_ratio,
        use_importance_sampling_correction, truncated_importance_sampling_type, truncated_importance_sampling_ratio,
        truncated_importance_sampling_ratio_min, reference_policy_kl_penalty, reference_policy_kl_type,
        kl_input_clamp_value, kl_output_clamp_value, use_on_policy_kl_approximation)
    if generation_logprobs is None and (use_importance_sampling_correction or use_on_policy_kl_approximation):
        raise _fail(fn, "generation_logprobs",
                    "required by use_importance_sampling_correction and use_on_policy_kl_approximation")
    with_kl = reference_policy_kl_penalty != 0.0
    if with_kl and reference_policy_logprobs is None:
        raise _fail(fn, "reference_policy_logprobs", "required when reference_policy_kl_penalty != 0")
    cfg = _ulorl._nemo_rl_loss_config(o, _common.counts(token_mask), global_valid_toks, global_valid_seqs)
    cfg.check_values = check_values
    lp = next_token_logprobs.detach()
    prev = lp if force_on_policy_ratio else prev_logprobs
    extra: Dict[str, Any] = {}
    weights = None
    if generation_logprobs is not None:
        w, _, rm = _ulorl._rollout_correction(prev, generation_logprobs, token_mask,
                                              _ulorl._nemo_rl_importance_config(o), None)
        if use_importance_sampling_correction:
            weights = w
        logged = _ulorl._nemo_rl_rollout_correction_logged(rm, truncated_importance_sampling_type, False,
                                                           global_valid_toks, global_valid_seqs)
        extra["sampling_importance_ratio"] = logged["sampling_importance_ratio"]
        if truncated_importance_sampling_type is not None:
            extra["is_oob_ratio"] = logged["is_oob_ratio"]
    kl_term = None
    if with_kl:
        kl, kl_unscaled, kl_grad = _ulorl._nemo_rl_kl_penalty_term(o, lp, reference_policy_logprobs,
                                                                   generation_logprobs, token_mask, cfg.normalizer)
        kl_term = _with_gradient(next_token_logprobs, kl, kl_grad, "presets::nemo_rl::clipped_pg_loss")
        extra["kl_penalty"] = kl_unscaled
    extra.update(_ulorl._nemo_rl_logged_ratios(o, lp, prev_logprobs, token_mask, global_valid_toks))
    loss, result = _policy_loss_result(next_token_logprobs, prev, advantages, token_mask, cfg, None, weights, None,
                                       None)
    if kl_term is not None:
        loss = loss + kl_term
    m = _common.metrics_of(result, extra)
    m["loss"] = loss.item()
    return loss, m


def calculate_kl(logprobs: torch.Tensor, logprobs_reference: torch.Tensor, kl_type: str = "k3",
                 input_clamp_value: Optional[float] = 20.0,
                 output_clamp_value: Optional[float] = 10.0) -> torch.Tensor:
    """NeMo-RL's ``calculate_kl``: k1 / k2 / k3 of ``u = logprobs_reference - logprobs`` clamped to
    +-input_clamp_value, the value clamped to +-output_clamp_value (None: no clamp); element-wise,
    with autograd to ``logprobs`` (0 where a clamp is active)."""
    kl, grad = _ulorl._kl_penalty(logprobs.detach(), logprobs_reference, "nemo_rl", kl_type, input_clamp_value,
                                  output_clamp_value)
    return _with_gradient(logprobs, kl, grad, "presets::nemo_rl::calculate_kl")


def rollout_correction(
    prev_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    *,
    truncated_importance_sampling_type: Optional[str] = None,
    truncated_importance_sampling_ratio: Optional[float] = None,
    truncated_importance_sampling_ratio_min: Optional[float] = None,
    sequence_level_importance_ratios: bool = False,
    global_valid_toks: Optional[float] = None,
    global_valid_seqs: Optional[float] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """NeMo-RL's importance weights of (prev_logprobs, generation_logprobs): ``exp(x)`` per token or
    ``exp(sum_t x m)`` per row (``sequence_level_importance_ratios``), an overflow mapped to 0, then
    ``truncated_importance_sampling_type`` tis (clamp to [ratio_min or 0, ratio]), icepop (0 outside
    [ratio_min, ratio]) or seq-mask-tis (rows whose geometric-mean ratio is outside). Returns
    ``(weights, metrics)`` with ``sampling_importance_ratio`` and (with a type) ``is_oob_ratio`` over
    the global normalisers."""
    cfg = _ulorl._nemo_rl_rollout_correction_config(truncated_importance_sampling_type,
                                                    truncated_importance_sampling_ratio,
                                                    truncated_importance_sampling_ratio_min,
                                                    sequence_level_importance_ratios)
    w, _, m = _ulorl._rollout_correction(prev_logprobs, generation_logprobs, token_mask, cfg, None)
    logged = _ulorl._nemo_rl_rollout_correction_logged(m, truncated_importance_sampling_type,
                                                       sequence_level_importance_ratios, global_valid_toks,
                                                       global_valid_seqs)
    if truncated_importance_sampling_type is None:
        del logged["is_oob_ratio"]
    return w, logged


_check_nan_options(globals(), "presets::nemo_rl::")
