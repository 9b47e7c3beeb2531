"""OpenRLHF's ``PolicyLoss`` (ppo / gspo, dual clip, token- or sequence-level loss, vLLM IS correction),
its loss reduction, ``compute_approx_kl`` and the vLLM importance-sampling weights, with its names.

Drop-ins with OpenRLHF's names and call forms (openrlhf.models): :class:`PolicyLoss` (its constructor,
positional ``forward`` and 4-tuple), :func:`aggregate_loss` and :func:`compute_approx_kl`. The
keyword-only :func:`policy_loss` / :func:`agg_loss` are the same computations returning ulorl's
metrics."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch

from .. import _ulorl
from .._api import _agg_loss, _check_nan_options, _fail, _kl_penalty, _policy_loss_result
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
    """OpenRLHF's loss reduction (:func:`aggregate_loss`) with keyword-only options."""
    return _aggregate("presets::openrlhf::agg_loss", loss, action_mask, token_level_loss, dp_size, batch_num_tokens,
                      global_batch_size)


def aggregate_loss(
    loss: torch.Tensor,
    loss_mask: Optional[torch.Tensor],
    token_level_loss: bool = True,
    dp_size: int = 1,
    batch_num_tokens: Union[float, torch.Tensor, None] = None,
    global_batch_size: Union[float, torch.Tensor, None] = None,
) -> torch.Tensor:
    """OpenRLHF's ``aggregate_loss`` (openrlhf.models.loss), same arguments and positions:
    token-level ``sum / tokens`` (``batch_num_tokens`` * dp_size when given, else this batch's
    tokens), else the mean of row means over the non-empty rows (``global_batch_size`` * dp_size
    when given). The counts may be 0-dim tensors, as OpenRLHF's ``get_loss_batch_info`` returns
    them. A 0-dim tensor with autograd to ``loss``; ``loss_mask`` None: every token valid."""
    return _aggregate("presets::openrlhf::aggregate_loss", loss, loss_mask, token_level_loss, dp_size,
                      batch_num_tokens, global_batch_size)


def _aggregate(fn: str, loss: torch.Tensor, mask: Optional[torch.Tensor], token_level_loss: bool, dp_size: Any,
               batch_num_tokens: Any, global_batch_size: Any) -> torch.Tensor:
    norm = _ulorl._openrlhf_normalizer(token_level_loss, _common.counts(mask, tokens=loss.detach()),
                                       _common.number(dp_size), _common.number(batch_num_tokens),
                                       _common.number(global_batch_size))
    return _agg_loss(loss, mask, norm)


def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_estimator: str = "k1") -> torch.Tensor:
    """OpenRLHF's ``compute_approx_kl`` (openrlhf.models.utils): k1, k2 or k3 of log_probs -
    log_probs_base, clamped to +-10; element-wise, with autograd to ``log_probs``. float32 and
    float64 are computed in their own dtype; other dtypes (bfloat16, float16) in float32, as OpenRLHF
    computes every dtype."""
    dtype = log_probs.dtype if log_probs.dtype in (torch.float32, torch.float64) else torch.float32
    x = log_probs.to(dtype)
    return _kl_penalty(x, log_probs_base.to(dtype), "openrlhf", kl_estimator)


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


class PolicyLoss(torch.nn.Module):
    """OpenRLHF's ``PolicyLoss`` (openrlhf.models.loss) on ulorl's kernels: the same constructor
    and ``forward(log_probs, old_log_probs, advantages, action_mask=None, rollout_log_probs=None,
    dp_size=1, batch_num_tokens=None, global_batch_size=None)`` returning ``(loss, clip_ratio,
    ppo_kl, vllm_kl)``: 0-dim tensors in the log-probs' dtype, ``vllm_kl`` None unless the ppo loss
    applies the vLLM correction. The computation is :func:`policy_loss`'s; the options are read from
    the attributes at each call, as OpenRLHF does. Invalid options raise ulorl.Error (a ValueError)
    at construction: policy_loss_type, dual_clip <= 1, and with enable_vllm_is_correction the
    correction type and the thresholds (required then)."""

    def __init__(
        self,
        clip_eps_low: float = 0.2,
        clip_eps_high: float = 0.2,
        dual_clip: Optional[float] = None,
        token_level_loss: bool = True,
        policy_loss_type: str = "ppo",
        enable_vllm_is_correction: bool = False,
        vllm_is_truncated_threshold: Optional[Sequence[float]] = None,
        vllm_is_correction_type: str = "tis",
    ) -> None:
        super().__init__()
        self.clip_eps_low = clip_eps_low
        self.clip_eps_high = clip_eps_high
        self.dual_clip = dual_clip
        self.policy_loss_type = policy_loss_type
        self.enable_vllm_is_correction = enable_vllm_is_correction
        self.vllm_is_truncated_threshold = vllm_is_truncated_threshold
        self.vllm_is_correction_type = vllm_is_correction_type
        # The configuration of an empty batch validates the options; its normaliser says whether
        # the loss is token-level (gspo never is).
        cfg = _ulorl._openrlhf_config(policy_loss_type, clip_eps_low, clip_eps_high, dual_clip, token_level_loss,
                                      _ulorl.BatchCounts(), 1.0, None, None, None, 0.0)
        self.token_level_loss = cfg.normalizer.mode == "token_mean"
        if _ulorl._openrlhf_vllm_is_plan(policy_loss_type, enable_vllm_is_correction)["weights"]:
            _ulorl._openrlhf_rollout_correction_config(vllm_is_correction_type,
                                                       list(self._threshold("PolicyLoss")))

    def _threshold(self, fn: str) -> Sequence[float]:
        if self.vllm_is_truncated_threshold is None:
            raise _fail(f"presets::openrlhf::{fn}", "vllm_is_truncated_threshold",
                        "required by enable_vllm_is_correction with policy_loss_type 'ppo'")
        return self.vllm_is_truncated_threshold

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: Optional[torch.Tensor] = None,
        rollout_log_probs: Optional[torch.Tensor] = None,
        dp_size: int = 1,
        batch_num_tokens: Union[float, torch.Tensor, None] = None,
        global_batch_size: Union[float, torch.Tensor, None] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        plan = _ulorl._openrlhf_vllm_is_plan(self.policy_loss_type, self.enable_vllm_is_correction)
        extra = {"vllm_is_truncated_threshold": self._threshold("PolicyLoss.forward")} if plan["weights"] else {}
        loss, m = policy_loss(log_probs, old_log_probs, advantages, action_mask,
                              policy_loss_type=self.policy_loss_type, clip_eps_low=self.clip_eps_low,
                              clip_eps_high=self.clip_eps_high, dual_clip=self.dual_clip,
                              token_level_loss=self.token_level_loss, dp_size=_common.number(dp_size),
                              batch_num_tokens=_common.number(batch_num_tokens),
                              global_batch_size=_common.number(global_batch_size), rollout_log_probs=rollout_log_probs,
                              enable_vllm_is_correction=self.enable_vllm_is_correction,
                              vllm_is_correction_type=self.vllm_is_correction_type, **extra)

        def scalar(v: float) -> torch.Tensor:
            return torch.tensor(v, dtype=log_probs.dtype, device=log_probs.device)

        vllm_kl = scalar(m["vllm_kl"]) if "vllm_kl" in m else None
        return loss, scalar(m["clip_ratio"]), scalar(m["ppo_kl"]), vllm_kl


_check_nan_options(globals(), "presets::openrlhf::")
