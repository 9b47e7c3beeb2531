"""verl's actor loss (``compute_policy_loss_*``, ``kl_penalty``, ``agg_loss``) with verl's names.

``policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_mode=..., clip_ratio_low=...,
clip_ratio_high=..., loss_agg_mode=...)`` is verl's ``get_policy_loss_fn(loss_mode)(...)`` plus,
optionally, the actor's entropy bonus (``entropy_coeff``) and KL loss (``use_kl_loss``:
``kl_loss_type``, ``kl_loss_coef``) in the same fused pass. Argument order is verl's (old first).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

import torch

from .. import _ulorl
from .._api import _check_nan_options, _fail, _policy_loss_result, _with_gradient
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
    dro_beta: Optional[float] = None,
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    clip_cov_selection: Optional[torch.Tensor] = None,
    check_values: bool = True,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """verl's policy loss of one micro-batch.

    loss_mode: ``vanilla`` (PPO clip-higher + dual clip ``clip_ratio_c``), ``gspo``, ``cispo``,
    ``geo_mean``, ``sapo``, ``gpg``, and the modes with a batch pass before the loss: ``dppo_tv`` /
    ``dppo_kl`` (clip_ratio_low / high are divergence thresholds, clip_ratio_c caps the detached
    ratio), ``kl_cov`` (kl_cov_ratio, ppo_kl_coef), ``clip_cov`` (clip_cov_ratio, clip_cov_lb,
    clip_cov_ub and ``clip_cov_selection``: verl's torch.randperm draw among the candidates, 0/1 in
    the mask's shape); ``dro`` needs ``dro_beta``. clip_ratio_low / high default to ``clip_ratio`` (as verl).
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
    def config(kl_type: Optional[str], kl_coef: float, entropy_coef: float) -> _ulorl.PolicyLossConfig:
        c = _ulorl._verl_config(loss_mode, low, high, clip_ratio_c, tau_pos, tau_neg, loss_agg_mode,
                                _common.counts(response_mask), dp_size, batch_num_tokens, global_batch_size,
                                loss_scale_factor, _common.padded_length(log_prob), kl_type, kl_coef, entropy_coef,
                                dro_beta, kl_cov_ratio, ppo_kl_coef, clip_cov_ratio, clip_cov_lb, clip_cov_ub)
        c.check_values = check_values
        return c

    cfg = config(kl_loss_type, kl_loss_coef, entropy_coeff)
    if clip_cov_selection is not None and loss_mode != "clip_cov":
        raise _fail("presets::verl::policy_loss", "clip_cov_selection", f"is a clip_cov input (loss_mode '{loss_mode}')")
    ent = entropy if entropy_coeff != 0.0 else None
    lp = log_prob.detach()
    weights, stats = rollout_is_weights, {}
    if loss_mode in ("dppo_tv", "dppo_kl"):
        weights, stats = _ulorl._verl_dppo_weights(loss_mode, low, high, clip_ratio_c, old_log_prob, lp, advantages,
                                                   response_mask, rollout_is_weights)
    elif loss_mode == "clip_cov":
        if clip_cov_selection is None:
            raise _fail("presets::verl::policy_loss", "clip_cov_selection",
                        "required by loss_mode 'clip_cov' (verl's torch.randperm draw among the candidates)")
        weights, stats = _ulorl._verl_clip_cov_weights(low, high, clip_cov_ratio, clip_cov_lb, clip_cov_ub,
                                                       old_log_prob, lp, advantages, response_mask,
                                                       clip_cov_selection, rollout_is_weights)
    elif loss_mode == "kl_cov":
        # The selected tokens take the |x| penalty, the others not; one normaliser, the losses add.
        w_sel, w_rest, stats = _ulorl._verl_kl_cov_selection(kl_cov_ratio, ppo_kl_coef, old_log_prob, lp, advantages,
                                                             response_mask, rollout_is_weights)
        loss_sel, res_sel = _policy_loss_result(log_prob, old_log_prob, advantages, response_mask,
                                                config(None, 0.0, 0.0), None, w_sel, None, None)
        cfg.abs_penalty = 0.0
        loss_rest, result = _policy_loss_result(log_prob, old_log_prob, advantages, response_mask, cfg, ref_log_prob,
                                                w_rest, ent, None)
        loss = loss_sel + loss_rest
        m = _common.metrics_of(result, _ulorl._verl_metrics(loss_mode, result, **stats))
        m["loss"], m["pg_loss"] = loss.item(), res_sel.pg_loss + result.pg_loss
        return loss, m
    loss, result = _policy_loss_result(log_prob, old_log_prob, advantages, response_mask, cfg, ref_log_prob,
                                       weights, ent, None)
    return loss, _common.metrics_of(result, _ulorl._verl_metrics(loss_mode, result, **stats))


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


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    dp_size: float = 1.0,
    batch_num_tokens: Optional[float] = None,
    global_batch_size: Optional[float] = None,
    loss_scale_factor: Optional[float] = None,
) -> torch.Tensor:
    """verl's ``agg_loss``: token-mean over ``batch_num_tokens`` (default: the mask's tokens) times
    dp_size, seq-mean-token-sum / seq-mean-token-mean over ``global_batch_size`` (default: the
    non-empty rows) times dp_size, seq-mean-token-sum-norm over ``loss_scale_factor`` (default: the
    padded length). A 0-dim tensor with autograd to ``loss_mat``."""
    norm = _ulorl._verl_normalizer(loss_agg_mode, _common.counts(loss_mask), dp_size, batch_num_tokens,
                                   global_batch_size, loss_scale_factor, _common.padded_length(loss_mat))
    value, grad = _ulorl._agg_loss(loss_mat.detach(), loss_mask, norm)
    return _with_gradient(loss_mat, value, grad, "presets::verl::agg_loss")


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str = "kl") -> torch.Tensor:
    """verl's ``kl_penalty(logprob, ref_logprob, kl_penalty)``: kl / k1, abs, mse / k2, low_var_kl / k3
    (|ref - logp| clamped to 20, the value to +-10), and the "+" names (value of the estimator,
    straight-through k2 gradient). Element-wise, with autograd to ``logprob``."""
    kl, grad = _ulorl._kl_penalty(logprob.detach(), ref_logprob, "verl", kl_penalty, None, None)
    return _with_gradient(logprob, kl, grad, "presets::verl::kl_penalty")


def rollout_correction_config(
    *,
    rollout_is: Optional[str] = None,
    rollout_is_threshold: Union[float, str, None] = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: Optional[str] = None,
    rollout_rs_threshold: Union[float, str, None] = None,
) -> _ulorl.RolloutCorrectionConfig:
    """verl's ``algorithm.rollout_correction`` options as a :class:`ulorl.RolloutCorrectionConfig`:
    ``rollout_is`` None / ``token`` / ``sequence`` with ``rollout_is_threshold`` ``u`` (TIS, no lower
    bound) or ``"l_u"`` (IcePop; None turns the weights off), ``rollout_is_batch_normalize``;
    ``rollout_rs`` the rejection options (``"token_k1, seq_mean_k3"``: token_k1|k2|k3,
    seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3) with ``rollout_rs_threshold`` (one value or
    one per option; k1 options take ``"l_u"`` or ``u`` meaning ``1/u .. u``)."""
    return _ulorl._verl_rollout_correction_config(rollout_is, rollout_is_threshold, rollout_is_batch_normalize,
                                                  rollout_rs, rollout_rs_threshold)


_VERL_IS_METRICS = {"rollout_is_mean": "weight_mean", "rollout_is_eff_sample_size": "effective_sample_size"}
_VERL_METRICS = {"rollout_rs_masked_fraction": "rejected_token_fraction",
                 "rollout_rs_seq_masked_fraction": "rejected_row_fraction", "kl": "kl", "k3_kl": "k3_kl",
                 "chi2_token": "chi2_token", "chi2_seq": "chi2_seq", "training_ppl": "training_ppl",
                 "training_log_ppl": "training_log_ppl", "rollout_ppl": "rollout_ppl",
                 "rollout_log_ppl": "rollout_log_ppl", "log_ppl_diff": "log_ppl_diff",
                 "log_ppl_abs_diff": "log_ppl_abs_diff", "log_ppl_diff_max": "log_ppl_diff_max",
                 "log_ppl_diff_min": "log_ppl_diff_min", "ppl_ratio": "ppl_ratio"}


def rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is: Optional[str] = None,
    rollout_is_threshold: Union[float, str, None] = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: Optional[str] = None,
    rollout_rs_threshold: Union[float, str, None] = None,
) -> Tuple[Optional[torch.Tensor], torch.Tensor, Dict[str, float]]:
    """verl's ``compute_rollout_correction_and_rejection_mask``: returns ``(rollout_is_weights,
    modified_response_mask, metrics)``; the weights are None without importance sampling. Metrics by
    verl's names (without the ``rollout_corr/`` prefix): rollout_is_mean, rollout_is_eff_sample_size,
    rollout_is_batch_norm_factor (with batch normalisation), rollout_rs_masked_fraction,
    rollout_rs_seq_masked_fraction, kl, k3_kl, chi2_token, chi2_seq, training_ppl, training_log_ppl,
    rollout_ppl, rollout_log_ppl, log_ppl_diff, log_ppl_abs_diff, log_ppl_diff_max / min, ppl_ratio.
    Options as :func:`rollout_correction_config`."""
    cfg = rollout_correction_config(rollout_is=rollout_is, rollout_is_threshold=rollout_is_threshold,
                                    rollout_is_batch_normalize=rollout_is_batch_normalize, rollout_rs=rollout_rs,
                                    rollout_rs_threshold=rollout_rs_threshold)
    w, keep, m = _ulorl._rollout_correction(old_log_prob, rollout_log_prob, response_mask, cfg, None)
    d = m.as_dict()
    out = {k: d[v] for k, v in _VERL_METRICS.items()}
    if not cfg.importance_weights:
        return None, keep, out
    out.update({k: d[v] for k, v in _VERL_IS_METRICS.items()})
    if cfg.batch_normalize:
        out["rollout_is_batch_norm_factor"] = d["batch_norm_factor"]
    return w, keep, out


_check_nan_options(globals(), "presets::verl::")
