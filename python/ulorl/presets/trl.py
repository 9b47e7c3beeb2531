"""TRL's loss pieces under TRL's names, argument order, shapes and dtypes.

Drop-ins for ``trl.trainer.utils`` (:func:`selective_log_softmax`, :func:`entropy_from_logits`) and
for ``GRPOTrainer`` (:func:`get_off_policy_mask`, :func:`get_high_entropy_mask` and the whole
``_compute_loss`` as :class:`GRPOLossMixin`), plus :func:`grpo_loss`, TRL's GRPO loss of one
micro-batch with GRPOConfig's fields as keyword arguments.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

import torch

from .. import _ulorl
from .._api import _check_nan_options, _cpp_defaults, _cpp_options, _fail, logprobs_from_logits
from . import _common

# GRPOConfig's defaults, as the C++ preset holds them (presets::trl::grpo_loss_options,
# adaptive_entropy_params): the keyword defaults below read them.
_GRPO = _cpp_defaults(_ulorl.TRLGRPOLossOptions)
_ENTROPY = _cpp_defaults(_ulorl.TRLAdaptiveEntropyParams)

# ---- trl.trainer.utils ------------------------------------------------------------------------------

def _rows_of(logits: torch.Tensor, fn: str) -> torch.Tensor:
    """logits [..., V] as the [N, V] rows the logits kernels read."""
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise _fail(fn, "logits", f"has shape {tuple(logits.shape)}: must be [..., num_classes] with num_classes >= 1")
    return logits.reshape(-1, logits.shape[-1])


class _RoundedValues(torch.autograd.Function):
    """The values of ``rounded`` with the gradient of ``exact`` (the same function, rounded otherwise)."""

    @staticmethod
    def forward(ctx, exact, rounded):  # noqa: D102
        return rounded.clone()

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        return grad, None


def _torch_rounded(rows: torch.Tensor, cols: torch.Tensor) -> bool:
    """Whether TRL's values on these rows are torch's 16-bit CPU arithmetic (logits/torch_rounding.hpp)."""
    return rows.dtype in (torch.bfloat16, torch.float16) and rows.device.type == "cpu"


def _with_exact_gradient(rows: torch.Tensor, rounded: torch.Tensor, exact) -> torch.Tensor:
    """``rounded``, differentiable in ``rows`` through ``exact()`` when a gradient is wanted."""
    if not (torch.is_grad_enabled() and rows.requires_grad):
        return rounded
    return _RoundedValues.apply(exact(), rounded)


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """TRL's ``selective_log_softmax``: ``log_softmax(logits)`` gathered at ``index`` along the last
    axis, by ulorl's logits kernels (:func:`ulorl.logprobs_from_logits`, one pass over each row,
    accumulated in float32 / float64). ``index`` is ``[...]`` (one class per row) or ``[..., K]`` (K
    classes per row). The result has ``index``'s shape and the logits' dtype. TRL computes 16-bit
    logits with torch's 16-bit ``log_softmax``; on the CPU these values are torch's rounding steps
    (``logits_statistics_torch_rounding``: the row's sum and its logarithm rounded first), which differ from
    the correctly rounded value in about one entry in five. Differentiable in ``logits`` (the exact
    gradient of log-softmax)."""
    fn = "presets::trl::selective_log_softmax"
    rows = _rows_of(logits, fn)
    squeeze = index.dim() == logits.dim() - 1
    if not squeeze and (index.dim() != logits.dim() or index.shape[:-1] != logits.shape[:-1]):
        raise _fail(fn, "index", f"has shape {tuple(index.shape)} but 'logits' has shape {tuple(logits.shape)} "
                                 "(index must be [...] or [..., K] with the logits' leading shape)")
    cols = index.reshape(rows.shape[0], 1) if squeeze else index.reshape(rows.shape[0], -1)

    def exact() -> torch.Tensor:
        out = [logprobs_from_logits(rows, cols[:, k].contiguous())[0] for k in range(cols.shape[1])]
        return out[0].unsqueeze(-1) if len(out) == 1 else torch.stack(out, dim=-1)

    if _torch_rounded(rows, cols):
        lp = _with_exact_gradient(rows, _ulorl._logits_statistics_torch_rounding(rows.detach(), cols)[0], exact)
    else:
        lp = exact()
    return lp.reshape(index.shape)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 128) -> torch.Tensor:
    """TRL's ``entropy_from_logits``: the entropy (nats) of ``softmax(logits)`` over the last axis,
    shape ``logits.shape[:-1]``, in the logits' dtype, by ulorl's logits kernels (one streaming pass
    per row, so ``chunk_size``, which must be >= 1, sets no memory bound here). 16-bit logits on the
    CPU give TRL's ``-(exp(logps) * logps).sum(-1)`` with torch's rounding steps
    (``logits_statistics_torch_rounding``). Differentiable in ``logits`` (the exact gradient)."""
    fn = "presets::trl::entropy_from_logits"
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise _fail(fn, "chunk_size", f"= {chunk_size!r}: must be an integer >= 1")
    rows = _rows_of(logits, fn)
    labels = torch.zeros(rows.shape[0], dtype=torch.int64, device=rows.device)

    def exact() -> torch.Tensor:
        return logprobs_from_logits(rows, labels)[1]

    if _torch_rounded(rows, labels):
        none = torch.empty(rows.shape[0], 0, dtype=torch.int64, device=rows.device)
        ent = _with_exact_gradient(rows, _ulorl._logits_statistics_torch_rounding(rows.detach(), none)[1], exact)
    else:
        ent = exact()
    return ent.reshape(logits.shape[:-1])


# ---- GRPOTrainer's masks ----------------------------------------------------------------------------

def get_off_policy_mask(advantages: torch.Tensor, per_token_logps: torch.Tensor,
                        sampling_per_token_logps: torch.Tensor, mask: torch.Tensor,
                        off_policy_threshold: float) -> torch.Tensor:
    """TRL's ``GRPOTrainer.get_off_policy_mask`` (DeepSeek-V3.2 off-policy sequence masking) by
    ulorl's off-policy mask (``preset="trl"``): ``[B, 1]`` in the mask's dtype, 1 where the row is
    kept (``advantages >= 0``, or its mean ``sampling_per_token_logps - per_token_logps`` over the
    mask <= ``off_policy_threshold``), else 0. ``advantages`` ``[B, 1]`` or ``[B]``."""
    fn = "presets::trl::get_off_policy_mask"
    B = per_token_logps.shape[0] if per_token_logps.dim() == 2 else -1
    if B < 0 or advantages.numel() != B or (advantages.dim() == 2 and advantages.shape[1] != 1) or advantages.dim() > 2:
        raise _fail(fn, "advantages", f"has shape {tuple(advantages.shape)} but 'per_token_logps' has shape "
                                      f"{tuple(per_token_logps.shape)} (one advantage per row: [B, 1] or [B])")
    lp = per_token_logps.detach()
    keep, _, _ = _ulorl._off_policy_mask(lp, sampling_per_token_logps.detach().to(lp.dtype),
                                         advantages.detach().reshape(B).to(lp.dtype), mask, "trl",
                                         float(off_policy_threshold), "factor")
    if keep.shape[1] == 0:  # no position: the row is kept exactly when no token says otherwise
        keep = torch.ones(B, 1, dtype=lp.dtype, device=lp.device)
    return keep[:, :1].to(mask.dtype)


def get_high_entropy_mask(self: Any, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """TRL's ``GRPOTrainer.get_high_entropy_mask`` (a method: ``self`` is the trainer, whose
    ``accelerator`` gathers the valid entropies of every process; ``self`` None: this process only):
    bool ``[B, T]``, True at the valid tokens whose entropy is >= the ``threshold``-quantile (linear
    interpolation) of all valid entropies; all False when there is none."""
    fn = "presets::trl::get_high_entropy_mask"
    if not 0.0 <= float(threshold) <= 1.0:
        raise _fail(fn, "threshold", f"= {threshold!r}: must be in [0, 1]")
    valid = mask.bool()
    local = entropies[valid].float()
    acc = getattr(self, "accelerator", None)
    if acc is not None and getattr(acc, "num_processes", 1) != 1:
        pad = -1e9  # entropies are >= 0: the padding of shorter processes is dropped after the gather
        gathered = acc.gather(acc.pad_across_processes(local, dim=0, pad_index=pad))
        local = gathered[gathered != pad]
    if local.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    cut = torch.quantile(local, float(threshold))
    return (entropies * mask.float() >= cut) & valid


def grpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: Optional[torch.Tensor],
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    ref_per_token_logps: Optional[torch.Tensor] = None,
    loss_type: str = _GRPO["loss_type"],
    epsilon: float = _GRPO["epsilon"],
    epsilon_high: Optional[float] = _GRPO["epsilon_high"],
    delta: Optional[float] = _GRPO["delta"],
    beta: float = _GRPO["beta"],
    importance_sampling_level: str = _GRPO["importance_sampling_level"],
    use_bias_correction_kl: bool = _GRPO["use_bias_correction_kl"],
    max_completion_length: Optional[float] = None,
    gradient_accumulation_steps: float = _GRPO["gradient_accumulation_steps"],
    num_items_in_batch: Optional[float] = _GRPO["num_items_in_batch"],
    num_processes: float = _GRPO["num_processes"],
    sapo_temperature_pos: float = _GRPO["sapo_temperature_pos"],
    sapo_temperature_neg: float = _GRPO["sapo_temperature_neg"],
    vespo_k_pos: float = _GRPO["vespo_k_pos"],
    vespo_lambda_pos: float = _GRPO["vespo_lambda_pos"],
    vespo_k_neg: float = _GRPO["vespo_k_neg"],
    vespo_lambda_neg: float = _GRPO["vespo_lambda_neg"],
    off_policy_mask_threshold: Optional[float] = _GRPO["off_policy_mask_threshold"],
    top_entropy_quantile: float = _GRPO["top_entropy_quantile"],
    entropy_coef: float = _GRPO["entropy_coef"],
    entropies: Optional[torch.Tensor] = None,
    sampling_per_token_logps: Optional[torch.Tensor] = None,
    importance_sampling_ratio: Optional[torch.Tensor] = None,
    check_values: bool = _GRPO["check_values"],
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """TRL's GRPO loss of one micro-batch: ``ulorl::presets::trl::grpo_loss`` (CPU tensors, float32 or
    float64), with autograd to ``per_token_logps`` and ``entropies``.

    ``advantages`` is one value per completion ``[B]`` (as TRL). ``old_per_token_logps`` None means
    on-policy (TRL uses ``per_token_logps.detach()``). loss_type: ``grpo`` (mean of sequence means /
    gradient_accumulation_steps), ``bnpo``, ``dr_grpo`` (needs ``max_completion_length``), ``dapo``
    (divides by ``num_items_in_batch`` / num_processes; default: this micro-batch's tokens),
    ``cispo`` (ratio capped at epsilon_high, detached), ``sapo`` (sapo_temperature_pos / _neg),
    ``luspo`` (rows weighted by their length), ``vespo`` (vespo_k_* / vespo_lambda_*).
    The option defaults are GRPOConfig's, held by the C++ preset (presets::trl::grpo_loss_options) but
    ``max_completion_length``: None is an error for dr_grpo (GRPOConfig's default is not assumed).
    importance_sampling_level ``token``, ``sequence`` (GSPO; cispo / sapo take the row's log-ratio)
    or ``sequence_token`` (GSPO-token). ``beta`` > 0 adds beta * k3 against ``ref_per_token_logps``
    (times TRL's undetached ratio with ``use_bias_correction_kl``: the token's, or the row's at the
    sequence level); epsilon_high defaults to epsilon (cispo: the ratio cap itself, >= 0); ``delta``
    caps the ratio (sequence_token: the row's ratio).

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
    options = {name: value for name, value in locals().items() if name in _GRPO}
    if max_completion_length is None:
        del options["max_completion_length"]  # unused: the C++ default stands
    o = _cpp_options(_ulorl.TRLGRPOLossOptions, options)
    return _grpo_loss(per_token_logps, old_per_token_logps, advantages, completion_mask, o,
                      ref_per_token_logps=ref_per_token_logps, entropies=entropies,
                      sampling_per_token_logps=sampling_per_token_logps,
                      importance_sampling_ratio=importance_sampling_ratio)


def _grpo_loss(per_token_logps: torch.Tensor, old_per_token_logps: Optional[torch.Tensor], advantages: torch.Tensor,
               completion_mask: torch.Tensor, options: Any, *, ref_per_token_logps: Optional[torch.Tensor] = None,
               entropies: Optional[torch.Tensor] = None, sampling_per_token_logps: Optional[torch.Tensor] = None,
               importance_sampling_ratio: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """:func:`grpo_loss` with its options as a C++ ``TRLGRPOLossOptions`` (presets::trl::grpo_loss_options)."""
    fn = "presets::trl::grpo_loss"
    if advantages.dim() != 1 or per_token_logps.dim() != 2 or advantages.shape[0] != per_token_logps.shape[0]:
        raise _fail(fn, "advantages",
                    f"has shape {tuple(advantages.shape)} but 'per_token_logps' has shape "
                    f"{tuple(per_token_logps.shape)} (one advantage per completion row, [B])")
    old = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
    mask = completion_mask
    # torch.ops.ulorl.trl_grpo_loss: differentiable in per_token_logps and, with an entropy bonus, in
    # entropies; every other tensor is a constant of the loss.
    loss, m = _ulorl._trl_grpo_loss(per_token_logps, old, advantages, mask, ref_per_token_logps,
                                    sampling_per_token_logps, entropies, importance_sampling_ratio, options)
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


def adaptive_entropy_controller(entropy_coef: float = _ENTROPY["entropy_coef"],
                                entropy_target: float = _ENTROPY["entropy_target"],
                                entropy_coef_delta: float = _ENTROPY["entropy_coef_delta"],
                                entropy_coef_min: float = _ENTROPY["entropy_coef_min"],
                                entropy_coef_max: float = _ENTROPY["entropy_coef_max"]) -> _ulorl.EntropyController:
    """TRL's ``use_adaptive_entropy`` as an :class:`ulorl.EntropyController`: each optimizer step applies
    ``bonus()`` (the coefficient while the previous step's entropy was <= entropy_target, else 0),
    then ``update(H)`` moves it by entropy_coef_delta: up to at most entropy_coef_max, down to at least
    entropy_coef_min (a starting coefficient outside that range is accepted, as TRL does)."""
    return _ulorl._trl_adaptive_entropy(_cpp_options(_ulorl.TRLAdaptiveEntropyParams, {
        "entropy_coef": entropy_coef, "entropy_target": entropy_target, "entropy_coef_delta": entropy_coef_delta,
        "entropy_coef_min": entropy_coef_min, "entropy_coef_max": entropy_coef_max}))


# ---- GRPOTrainer._compute_loss ----------------------------------------------------------------------

# The model inputs GRPOTrainer._compute_loss forwards to _get_per_token_logps_and_entropies.
_MODEL_INPUTS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
                 "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")
# The loss types whose policy term divides by a global token count (not by the accumulation steps).
_TOKEN_COUNT_LOSSES = ("cispo", "dapo", "vespo")


def _nan_extreme(x: torch.Tensor, largest: bool) -> float:
    kept = x[~torch.isnan(x)]
    if kept.numel() == 0:
        return math.nan
    return float(kept.max() if largest else kept.min())


class GRPOLossMixin:
    """``GRPOTrainer._compute_loss`` computed by :func:`grpo_loss` (and the two masks by
    :func:`get_off_policy_mask` / :func:`get_high_entropy_mask`). Put it before TRL's trainer::

        class Trainer(ulorl.presets.trl.GRPOLossMixin, trl.GRPOTrainer): ...

    (or ``trl.experimental.gspo_token.GRPOTrainer`` for ``importance_sampling_level="sequence_token"``).
    Everything else stays TRL's: the forward (``_get_per_token_logps_and_entropies``), the trainer's
    fields (``loss_type``, ``beta``, ``epsilon_low`` / ``epsilon_high``, ``importance_sampling_level``,
    ``off_policy_mask_threshold``, ``top_entropy_quantile``, ``args.delta`` / ``use_bias_correction_kl``
    / ``sapo_*`` / ``vespo_*`` / ``entropy_*``, ``use_vllm`` with ``vllm_importance_sampling_correction``),
    the adaptive entropy state (``entropy_coef``, ``_last_world_entropy``, ``_entropy_window_stats``:
    TRL's checkpoints keep working) and ``_metrics`` under TRL's names (``kl``, ``entropy``,
    ``clip_ratio/low_mean`` / ``high_mean`` / ``region_mean`` / ``low_min`` / ``high_max``,
    ``cispo_clip_ratio``, ``vespo/phi_seq_mean``, ``policy_loss``, ``entropy_coef``, ``aux_loss``),
    reduced over the accelerator's processes as TRL reduces them.

    Where it differs: the top-entropy quantile of the loss is this process's (TRL's is over every
    process); ``sequence_token`` ignores ``off_policy_mask_threshold`` and the entropy bonus, as TRL's
    GSPO-token trainer does.
    """

    def _compute_loss(self, model: Any, inputs: Dict[str, Any]) -> torch.Tensor:
        args, acc = self.args, self.accelerator
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        aux_enabled = getattr(self, "aux_loss_enabled", False)
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True,
            compute_aux_loss=aux_enabled, **{k: inputs.get(k) for k in _MODEL_INPUTS})

        mode = "train" if self.model.training else "eval"
        loss_type, level = self.loss_type, self.importance_sampling_level
        gspo_token = level == "sequence_token"
        steps = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        advantages = inputs["advantages"]
        if advantages.dim() == 2 and advantages.shape[1] == 1:
            advantages = advantages.squeeze(1)
        old = inputs.get("old_per_token_logps")
        if loss_type == "vespo":
            ratio = inputs.get("importance_sampling_ratio")
        elif self.use_vllm and self.vllm_importance_sampling_correction:
            ratio = inputs["importance_sampling_ratio"]
        else:
            ratio = None

        bonus_on = self._entropy_bonus_enabled and not gspo_token
        coef = 0.0
        if bonus_on:
            coef = self.entropy_coef
            if self.use_adaptive_entropy:
                last = self._last_world_entropy
                coef = 0.0 if math.isinf(last) else _ulorl.EntropyController(
                    target_entropy=args.entropy_target, init_coef=self.entropy_coef, min_coef=args.entropy_coef_min,
                    max_coef=args.entropy_coef_max).bonus(last)
        num_items = inputs.get("num_items_in_batch") if loss_type in _TOKEN_COUNT_LOSSES else None
        loss, m = grpo_loss(
            per_token_logps, old, advantages, mask,
            ref_per_token_logps=inputs["ref_per_token_logps"] if self.beta != 0.0 else None,
            loss_type=loss_type, epsilon=self.epsilon_low, epsilon_high=self.epsilon_high, delta=args.delta,
            beta=self.beta, importance_sampling_level=level,
            use_bias_correction_kl=bool(getattr(args, "use_bias_correction_kl", False)) and not gspo_token,
            max_completion_length=self.max_completion_length, gradient_accumulation_steps=steps,
            num_items_in_batch=None if num_items is None else max(float(num_items), 1.0),
            num_processes=acc.num_processes, sapo_temperature_pos=args.sapo_temperature_pos,
            sapo_temperature_neg=args.sapo_temperature_neg, vespo_k_pos=args.vespo_k_pos,
            vespo_lambda_pos=args.vespo_lambda_pos, vespo_k_neg=args.vespo_k_neg,
            vespo_lambda_neg=args.vespo_lambda_neg,
            off_policy_mask_threshold=None if gspo_token else self.off_policy_mask_threshold,
            top_entropy_quantile=self.top_entropy_quantile, entropy_coef=coef, entropies=entropies,
            sampling_per_token_logps=inputs.get("sampling_per_token_logps"), importance_sampling_ratio=ratio)
        metrics = self._metrics[mode]

        if bonus_on:
            policy = m["pg_loss"] + m["kl_loss"]
            if loss_type not in _TOKEN_COUNT_LOSSES:
                policy *= steps
            policy_t = torch.tensor(policy, dtype=per_token_logps.dtype, device=per_token_logps.device)
            metrics["policy_loss"].append(acc.gather(policy_t).nanmean().item())
            if self.use_adaptive_entropy and mode == "train":
                effective = mask
                if self.top_entropy_quantile < 1.0:
                    effective = mask * self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
                stats = torch.stack([(entropies.detach() * effective).sum(), effective.sum()]).detach()
                window = self._entropy_window_stats
                self._entropy_window_stats = stats if window is None else window + stats
                if acc.sync_gradients:
                    totals = acc.reduce(self._entropy_window_stats, reduction="sum")
                    world = (totals[0] / totals[1].clamp(min=1.0)).item()
                    self.entropy_coef = adaptive_entropy_controller(
                        self.entropy_coef, args.entropy_target, args.entropy_coef_delta, args.entropy_coef_min,
                        args.entropy_coef_max).update(world)
                    self._last_world_entropy = world
                    self._entropy_window_stats = None
            if mode == "train" and acc.sync_gradients:
                metrics["entropy_coef"].append(self.entropy_coef)

        if aux_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / steps
            metrics["aux_loss"].append(acc.gather_for_metrics(aux_loss).mean().item())

        # TRL's global means: a [B, 1] quantity (sequence level, or T = 1) over the rows, else over the mask.
        B, T = per_token_logps.shape
        tokens = float(mask.sum())

        def global_mean(local_mean: float, per_row: bool) -> float:
            count = float(B) if per_row else tokens
            totals = acc.reduce(torch.tensor([local_mean * count, count], dtype=torch.float64,
                                             device=per_token_logps.device), reduction="sum")
            return (totals[0] / totals[1].clamp(min=1.0)).item()

        seq_rows = level == "sequence" or T == 1
        if self.beta != 0.0:
            metrics["kl"].append(global_mean(m["kl"], T == 1))
        metrics["entropy"].append(global_mean(m["entropy"], T == 1))
        if "clip_ratio/low_mean" in m:
            for name in ("low_mean", "high_mean", "region_mean"):
                metrics["clip_ratio/" + name].append(global_mean(m["clip_ratio/" + name], seq_rows))
            low, high = self._row_clip_fractions(per_token_logps, old, advantages, mask)
            metrics["clip_ratio/low_min"].append(_nan_extreme(acc.gather(low), largest=False))
            metrics["clip_ratio/high_max"].append(_nan_extreme(acc.gather(high), largest=True))
        elif "cispo_clip_ratio" in m:
            metrics["cispo_clip_ratio"].append(global_mean(m["cispo_clip_ratio"], seq_rows))
        elif "vespo_phi_seq_mean" in m:
            metrics["vespo/phi_seq_mean"].append(global_mean(m["vespo_phi_seq_mean"], True))
        return loss

    def _row_clip_fractions(self, per_token_logps: torch.Tensor, old: Optional[torch.Tensor],
                            advantages: torch.Tensor, mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Each row's fraction of low- and high-clipped tokens (TRL's ``clip_ratio/low_min`` and
        ``high_max`` take the min / max over the gathered rows; a row without valid tokens is NaN at
        the token levels). The ratio is TRL's: per token, or the row's exp of the mean log-ratio,
        capped at ``args.delta``."""
        with torch.no_grad():
            lp = per_token_logps.detach()
            log_ratio = lp - (lp if old is None else old.detach())
            m = mask.to(lp.dtype)
            if self.importance_sampling_level == "token":
                ratio = log_ratio.exp()
            else:
                ratio = ((log_ratio * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)).exp()
                if self.importance_sampling_level == "sequence_token":
                    ratio = ratio.expand_as(lp)
            if self.args.delta is not None:
                ratio = ratio.clamp(max=self.args.delta)
            adv = advantages.reshape(-1, 1)
            flags = (((ratio < 1 - self.epsilon_low) & (adv < 0)).to(lp.dtype),
                     ((ratio > 1 + self.epsilon_high) & (adv > 0)).to(lp.dtype))
            if ratio.shape[1] == 1:
                return flags[0].squeeze(1), flags[1].squeeze(1)
            return flags[0].mul(m).sum(-1) / m.sum(-1), flags[1].mul(m).sum(-1) / m.sum(-1)


_check_nan_options(globals(), "presets::trl::")
# The mixin's masks are the checked module functions.
GRPOLossMixin.get_off_policy_mask = staticmethod(get_off_policy_mask)  # type: ignore[assignment]
GRPOLossMixin.get_high_entropy_mask = get_high_entropy_mask  # type: ignore[assignment]
