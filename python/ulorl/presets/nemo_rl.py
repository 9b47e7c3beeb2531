"""NeMo-RL's ``ClippedPGLossFn`` (PPO clip, optional dual clip, importance-sampling correction against
the generation log-probs, reference KL with clamps, token- or sequence-level mean over the global
batch), ``calculate_kl`` and the truncated importance-sampling weights, with NeMo-RL's config names.

Drop-ins with NeMo-RL's names and call forms (nemo_rl.algorithms.loss, nemo_rl.algorithms.utils):
:class:`ClippedPGLossFn` (``ClippedPGLossFn(cfg)(next_token_logprobs, data, global_valid_seqs,
global_valid_toks)``), :class:`ClippedPGLossConfig` and :func:`calculate_kl`. The keyword form
:func:`clipped_pg_loss` covers the options of the C++ preset (ulorl/presets/nemo_rl.hpp) and returns
ulorl's metrics besides NeMo-RL's."""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from .. import _ulorl
from .._api import (_POLICY_LOSS_OPTIONS, _agg_loss, _check_nan_options, _cpp_defaults, _cpp_options, _fail, _kl_penalty,
                    _policy_loss_result, _with_gradient)
from .._ulorl import Error
from . import _common

# ClippedPGLossConfig's defaults, as the C++ preset holds them (presets::nemo_rl::clipped_pg_loss_options):
# the keyword and field defaults below read them.
_NEMO = _cpp_defaults(_ulorl.NemoRLClippedPGLossOptions)


def clipped_pg_loss(
    next_token_logprobs: torch.Tensor,
    prev_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    *,
    generation_logprobs: Optional[torch.Tensor] = None,
    reference_policy_logprobs: Optional[torch.Tensor] = None,
    rewards: Optional[torch.Tensor] = None,
    ratio_clip_min: float = _NEMO["ratio_clip_min"],
    ratio_clip_max: float = _NEMO["ratio_clip_max"],
    ratio_clip_c: Optional[float] = _NEMO["ratio_clip_c"],
    token_level_loss: bool = _NEMO["token_level_loss"],
    force_on_policy_ratio: bool = _NEMO["force_on_policy_ratio"],
    disable_ppo_ratio: bool = _NEMO["disable_ppo_ratio"],
    use_cispo: bool = _NEMO["use_cispo"],
    sequence_level_importance_ratios: bool = _NEMO["sequence_level_importance_ratios"],
    use_importance_sampling_correction: bool = _NEMO["use_importance_sampling_correction"],
    truncated_importance_sampling_type: Optional[str] = _NEMO["truncated_importance_sampling_type"],
    truncated_importance_sampling_ratio: Optional[float] = _NEMO["truncated_importance_sampling_ratio"],
    truncated_importance_sampling_ratio_min: Optional[float] = _NEMO["truncated_importance_sampling_ratio_min"],
    reference_policy_kl_penalty: float = _NEMO["reference_policy_kl_penalty"],
    reference_policy_kl_type: str = _NEMO["reference_policy_kl_type"],
    kl_input_clamp_value: Optional[float] = _NEMO["kl_input_clamp_value"],
    kl_output_clamp_value: Optional[float] = _NEMO["kl_output_clamp_value"],
    use_on_policy_kl_approximation: bool = _NEMO["use_on_policy_kl_approximation"],
    positive_example_nll_weight: float = _NEMO["positive_example_nll_weight"],
    global_valid_toks: Optional[float] = None,
    global_valid_seqs: Optional[float] = None,
    check_values: bool = _POLICY_LOSS_OPTIONS["check_values"],
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """NeMo-RL's clipped policy-gradient loss of one micro-batch, as keywords: the loss of
    :class:`ClippedPGLossFn` (the same code) on aligned ``[B, S]`` tensors, without NeMo-RL's
    leading column and ``sample_mask``.

    Actor loss: PPO clip (``ratio_clip_min`` / ``ratio_clip_max``, unclamped ratio, dual clip
    ``ratio_clip_c`` > 1), or ratio 1 with derivative 1 (``force_on_policy_ratio``), or -A logp
    (``disable_ppo_ratio``), or cispo (``use_cispo``), or GSPO's sequence ratio
    (``sequence_level_importance_ratios``); token-mean over ``global_valid_toks``
    (``token_level_loss``) or the mean of row means over ``global_valid_seqs`` (defaults: this
    micro-batch's tokens / rows), natively partition-exact. ``use_importance_sampling_correction``
    multiplies it by the weights of (prev_logprobs, ``generation_logprobs``) (:func:`rollout_correction`'s,
    with ``truncated_importance_sampling_type`` tis / icepop / seq-mask-tis). Reference KL
    (``reference_policy_kl_penalty`` != 0): k1 / k2 / k3 of ``reference_policy_logprobs`` with
    optional clamps, weighted by exp(logp - sg(logp)) (whose derivative enters the gradient) or, with
    ``use_on_policy_kl_approximation``, exp(logp - generation_logprobs). ``positive_example_nll_weight``
    adds the NLL of the tokens of the rows whose ``rewards`` ``[B]`` are > 0. The option defaults are
    NeMo-RL's ClippedPGLossConfig's (the C++ preset's): the KL term is on (0.01, clamps 20 / 10), so
    ``reference_policy_logprobs`` is required unless ``reference_policy_kl_penalty=0``.

    Returns ``(loss, metrics)``: ulorl's metrics plus NeMo-RL's ``probs_ratio``,
    ``probs_ratio_clamped`` and their extrema, ``sampling_importance_ratio`` and the
    training-vs-generation diagnostics (given generation_logprobs), ``is_oob_ratio`` (with a
    truncation type), ``kl_penalty`` (the unscaled KL, when on) and ``positive_nll_loss`` (given rewards).
    """
    loss_fn = ClippedPGLossFn({k: v for k, v in locals().items() if k in _FIELDS},
                              _function="presets::nemo_rl::clipped_pg_loss")
    lp = next_token_logprobs
    loss, result, nemo = loss_fn._compute(lp, token_mask.to(lp.dtype), advantages, prev_logprobs,
                                          generation_logprobs, reference_policy_logprobs, lp, rewards,
                                          _common.number(global_valid_toks), _common.number(global_valid_seqs),
                                          check_values)
    if reference_policy_kl_penalty == 0.0:
        del nemo["kl_penalty"]
    if rewards is None:
        del nemo["positive_nll_loss"]
    return loss, _common.metrics_of(result, nemo)


def calculate_kl(logprobs: torch.Tensor, logprobs_reference: torch.Tensor,
                 kl_type: str = _NEMO["reference_policy_kl_type"],
                 input_clamp_value: Optional[float] = _NEMO["kl_input_clamp_value"],
                 output_clamp_value: Optional[float] = _NEMO["kl_output_clamp_value"],
                 importance_sampling_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
    """NeMo-RL's ``calculate_kl`` (nemo_rl.algorithms.utils), same arguments and positions: k1 / k2 /
    k3 of ``u = logprobs_reference - logprobs`` clamped to +-input_clamp_value, optionally times
    ``importance_sampling_weights``, the value clamped to +-output_clamp_value (None: no clamp);
    element-wise, with autograd to ``logprobs`` (0 where a clamp is active) and ``logprobs_reference``
    (minus the log-probs': k1 / k2 / k3 are functions of u). The weights may carry
    their own graph (NeMo-RL passes exp(logp - sg(logp))): they receive the gradient ``kl`` except
    where either clamp is active, as NeMo-RL detaches them under the input clamp."""
    if importance_sampling_weights is None:
        return _kl_penalty(logprobs, logprobs_reference, "nemo_rl", kl_type, input_clamp_value, output_clamp_value)
    kl, grad = torch.ops.ulorl._kl_penalty_forward(
        logprobs.detach(), logprobs_reference.detach(), None,
        _ulorl._kl_config("nemo_rl", kl_type, input_clamp_value, None))
    if input_clamp_value is None:
        free = torch.ones_like(kl, dtype=torch.bool)
    else:
        free = (logprobs_reference - logprobs.detach()).abs() <= input_clamp_value
    return _WeightedKL.apply(logprobs, logprobs_reference, importance_sampling_weights, kl, grad, free,
                             output_clamp_value)


class _WeightedKL(torch.autograd.Function):
    """w * kl clamped to +-out, from the kernel's kl and d kl / d logprobs: d / d logprobs = w * d kl,
    d / d reference = -w * d kl, d / d w = kl where the input clamp is off (``free``); all 0 where the
    output clamp is active."""

    @staticmethod
    def forward(ctx, logprobs, reference, weights, kl, grad, free, out):  # noqa: D401
        raw = weights.detach() * kl
        inside = torch.ones_like(free) if out is None else (raw >= -out) & (raw <= out)
        ctx.save_for_backward(weights.detach(), kl, grad, free, inside)
        return raw if out is None else raw.clamp(-out, out)

    @staticmethod
    def backward(ctx, g):
        w, kl, grad, free, inside = ctx.saved_tensors
        with torch.no_grad():
            d_lp = g * w * grad * inside
            d_w = g * kl * (inside & free)
        return d_lp, (-d_lp if ctx.needs_input_grad[1] else None), d_w, None, None, None, None


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


# ---- ClippedPGLossFn ---------------------------------------------------------------------------------

class LossType(enum.Enum):
    """NeMo-RL's LossType (nemo_rl.algorithms.loss.interfaces); NeMo-RL's own when it is installed."""

    TOKEN_LEVEL = "token_level"
    SEQUENCE_LEVEL = "sequence_level"


class LossInputType(enum.Enum):
    """NeMo-RL's LossInputType; NeMo-RL's own when it is installed."""

    LOGIT = "logit"
    LOGPROB = "logprob"
    DISTILLATION = "distillation"
    DISTILLATION_CROSS_TOKENIZER = "distillation_cross_tokenizer"
    DRAFT = "draft"


class MetricNormalizer(enum.Enum):
    """NeMo-RL's MetricNormalizer (the global count a logged metric is divided by); NeMo-RL's own
    when it is installed."""

    TOKENS = "tokens"
    SEQUENCES = "sequences"
    NONE = "none"


def _enums() -> Tuple[Any, Any, Any]:
    """(LossInputType, LossType, MetricNormalizer): NeMo-RL's when importable, so that its trainer's
    comparisons (``loss_fn.input_type == LossInputType.LOGPROB``, ``is MetricNormalizer.TOKENS``)
    hold; else this module's, with the same members and values."""
    try:
        from nemo_rl.algorithms.loss.interfaces import LossInputType as I, LossType as L, MetricNormalizer as M
    except ImportError:
        return LossInputType, LossType, MetricNormalizer
    return I, L, M


@dataclasses.dataclass
class ClippedPGLossConfig:
    """NeMo-RL's ``ClippedPGLossConfig``: its fields and defaults. :class:`ClippedPGLossFn` also takes
    NeMo-RL's own config object or a mapping with these keys (a missing key: the default here)."""

    disable_ppo_ratio: bool = _NEMO["disable_ppo_ratio"]
    token_level_loss: bool = _NEMO["token_level_loss"]
    sequence_level_importance_ratios: bool = _NEMO["sequence_level_importance_ratios"]
    ratio_clip_min: float = _NEMO["ratio_clip_min"]
    ratio_clip_max: float = _NEMO["ratio_clip_max"]
    ratio_clip_c: Optional[float] = _NEMO["ratio_clip_c"]
    reference_policy_kl_penalty: float = _NEMO["reference_policy_kl_penalty"]
    reference_policy_kl_type: str = _NEMO["reference_policy_kl_type"]
    kl_input_clamp_value: Optional[float] = _NEMO["kl_input_clamp_value"]
    kl_output_clamp_value: Optional[float] = _NEMO["kl_output_clamp_value"]
    use_kl_in_reward: bool = False  # the caller's: ClippedPGLossFn then sets reference_policy_kl_penalty to 0
    use_importance_sampling_correction: bool = _NEMO["use_importance_sampling_correction"]
    truncated_importance_sampling_type: Optional[str] = _NEMO["truncated_importance_sampling_type"]
    truncated_importance_sampling_ratio: Optional[float] = _NEMO["truncated_importance_sampling_ratio"]
    truncated_importance_sampling_ratio_min: Optional[float] = _NEMO["truncated_importance_sampling_ratio_min"]
    use_on_policy_kl_approximation: bool = _NEMO["use_on_policy_kl_approximation"]
    force_on_policy_ratio: bool = _NEMO["force_on_policy_ratio"]
    use_cispo: bool = _NEMO["use_cispo"]
    positive_example_nll_weight: float = _NEMO["positive_example_nll_weight"]


_FIELDS = [f.name for f in dataclasses.fields(ClippedPGLossConfig)]
_FN = "presets::nemo_rl::ClippedPGLossFn"


class ConfigError(Error, AssertionError):
    """An invalid ClippedPGLossFn configuration: an ulorl.Error that is also the AssertionError
    NeMo-RL raises for it."""


def _config_error(function: str, argument: str, what: str, value: Any = None) -> ConfigError:
    shown = "" if value is None else f" = {value}"
    e = ConfigError(f"ulorl::{function}: argument '{argument}'{shown}: {what}")
    e.function, e.argument, e.index = function, argument, -1
    return e


def _field(cfg: Any, name: str) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(name, getattr(ClippedPGLossConfig, name))
    return getattr(cfg, name, getattr(ClippedPGLossConfig, name))


def _masked_total(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum().item())


def _per(total: float, count: float) -> float:
    """A sum over a micro-batch divided by a global count; 0 for a count of 0 (an empty sum)."""
    return total / count if count != 0 else 0.0


class ClippedPGLossFn:
    """NeMo-RL's ``ClippedPGLossFn`` on ulorl's kernels: ``ClippedPGLossFn(cfg)(next_token_logprobs,
    data, global_valid_seqs, global_valid_toks)`` returns ``(loss, metrics)`` with NeMo-RL's metric
    names, and the attributes NeMo-RL's trainer reads (``input_type``, ``loss_type``,
    ``metric_normalizations``, ``reference_policy_kl_penalty``, the config fields).

    ``data`` holds NeMo-RL's ``[B, S]`` tensors (their first column is dropped, as NeMo-RL does):
    ``token_mask``, ``advantages``, ``prev_logprobs``, ``generation_logprobs``,
    ``reference_policy_logprobs`` (with a KL term), ``sample_mask`` ``[B]``, optionally
    ``curr_logprobs_unfiltered`` (the KL term's log-probs, receiving its gradient) and ``rewards``
    ``[B]`` (positive_example_nll_weight). Masks of any dtype holding 0 / 1 (NeMo-RL's are int64).

    Objectives (ulorl's kernels): PPO clip with the unclamped ratio and the dual clip
    ``ratio_clip_c``; ``force_on_policy_ratio``: ratio exp(logp - sg(logp)); ``disable_ppo_ratio``:
    -A logp; ``use_cispo``: -sg(clip(r)) A logp; ``sequence_level_importance_ratios`` (GSPO): the
    sequence ratio exp(mean_t log r) with the gradient through the mean. The importance weights of
    (prev_logprobs, generation_logprobs), token or sequence level, with the truncations tis / icepop
    / seq-mask-tis, multiply the objective under use_importance_sampling_correction; a -inf
    generation log-prob gives the weight 0 (NeMo-RL's nan_to_num), and in seq-mask-tis's geometric
    mean the log-ratio 0. The reference KL (k1 / k2 / k3 with clamps) is weighted by exp(logp -
    sg(logp)) or, with use_on_policy_kl_approximation, exp(logp - generation_logprobs);
    positive_example_nll_weight adds the NLL of the tokens of rows with reward > 0 over their count.
    Token-level loss: sum / global_valid_toks; sequence-level: sum of row means / global_valid_seqs.
    A micro-batch without valid tokens has loss 0.

    Invalid configurations raise :class:`ConfigError` (an ulorl.Error and an AssertionError, as
    NeMo-RL asserts) at construction.
    """

    def __init__(self, cfg: Any = None, use_fused_linear_logprobs: bool = False, *, _function: str = _FN) -> None:
        self._function = _function  # the name errors give: clipped_pg_loss's when it builds one
        cfg = ClippedPGLossConfig() if cfg is None else cfg
        for name in _FIELDS:
            setattr(self, name, _field(cfg, name))
        self.use_fused_linear_logprobs = use_fused_linear_logprobs
        if self.use_kl_in_reward:
            self.reference_policy_kl_penalty = 0
        input_type, loss_type, metric = _enums()
        self.input_type = input_type.LOGPROB
        self.loss_type = loss_type.TOKEN_LEVEL if self.token_level_loss else loss_type.SEQUENCE_LEVEL
        self._validate()
        kl_on = self.reference_policy_kl_penalty != 0
        options = {name: getattr(self, name) for name in _NEMO}
        options["ratio_clip_c"] = self._modelled_dual_clip()
        if not kl_on:
            options["kl_input_clamp_value"] = options["kl_output_clamp_value"] = None
        try:
            self._options = _cpp_options(_ulorl.NemoRLClippedPGLossOptions, options)
            _ulorl._nemo_rl_validate(self._options)
            self._importance = _ulorl._nemo_rl_importance_config(self._options)
        except Error as e:
            err = ConfigError(str(e))
            err.function, err.argument, err.index = e.function, e.argument, e.index
            raise err from None
        per_loss = metric.TOKENS if self.token_level_loss else metric.SEQUENCES
        self.metric_normalizations = {
            "loss": per_loss, "kl_penalty": per_loss,
            **{k: metric.TOKENS for k in ("probs_ratio", "probs_ratio_clamped", "token_mult_prob_error", "gen_kl_error",
                                          "policy_kl_error", "js_divergence_error", "approx_entropy")},
            "sampling_importance_ratio": metric.SEQUENCES if self.sequence_level_importance_ratios else metric.TOKENS,
            **{k: metric.NONE for k in ("num_valid_samples", "positive_nll_loss", "probs_ratio_min", "probs_ratio_max",
                                        "probs_ratio_clamped_min", "probs_ratio_clamped_max")},
        }
        if self.truncated_importance_sampling_type is not None:
            self.metric_normalizations["is_oob_ratio"] = (
                metric.SEQUENCES if self.truncated_importance_sampling_type == "seq-mask-tis" else metric.TOKENS)

    def _validate(self) -> None:
        """What NeMo-RL asserts on the configuration before the C++ options see it: the dual clip of
        the configuration itself (disable_ppo_ratio hands the options none) and the truncation bounds
        (presets::nemo_rl::validate checks the rest, use_cispo's and GSPO's combinations included)."""
        if self.ratio_clip_c is not None and not self.ratio_clip_c > 1:
            raise _config_error(self._function, "ratio_clip_c", "must exceed 1 (dual clip)", self.ratio_clip_c)
        hi, lo = self.truncated_importance_sampling_ratio, self.truncated_importance_sampling_ratio_min
        if self.truncated_importance_sampling_type is not None and hi is not None and lo is not None and lo > hi:
            raise _config_error(self._function, "truncated_importance_sampling_ratio_min",
                                "truncated_importance_sampling_ratio_min must be <= "
                                f"truncated_importance_sampling_ratio ({hi})", lo)

    def _modelled_dual_clip(self) -> Optional[float]:
        # Under disable_ppo_ratio NeMo-RL's dual clip min(-A logp, -A c) is -A logp for every
        # logp < c (checked at the call): the objective is the policy gradient.
        return None if self.disable_ppo_ratio and not self.force_on_policy_ratio else self.ratio_clip_c

    def __call__(self, next_token_logprobs: torch.Tensor, data: Mapping[str, Any], global_valid_seqs: Any,
                 global_valid_toks: Any) -> Tuple[torch.Tensor, Dict[str, Any]]:
        lp = next_token_logprobs
        sample_mask = data["sample_mask"]
        mask = (data["token_mask"][:, 1:] * sample_mask.unsqueeze(-1)).to(lp.dtype)
        ref = data.get("reference_policy_logprobs")
        samples = sample_mask.sum().item()
        loss, _, metrics = self._compute(lp, mask, data["advantages"][:, 1:], data["prev_logprobs"][:, 1:],
                                         data["generation_logprobs"][:, 1:], None if ref is None else ref[:, 1:],
                                         data.get("curr_logprobs_unfiltered", lp), data.get("rewards"),
                                         _common.number(global_valid_toks), _common.number(global_valid_seqs),
                                         num_valid_samples=float(samples))
        metrics["num_valid_samples"] = samples
        return loss, metrics

    def _compute(self, lp: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, prev_logprobs: torch.Tensor,
                 gen: Optional[torch.Tensor], ref: Optional[torch.Tensor], lp_kl: torch.Tensor,
                 rewards: Optional[torch.Tensor], gt: Optional[float], gs: Optional[float],
                 check_values: bool = _POLICY_LOSS_OPTIONS["check_values"], num_valid_samples: Optional[float] = None
                 ) -> Tuple[torch.Tensor, _ulorl.PolicyLossResult, Dict[str, Any]]:
        """The loss of aligned ``[B, S]`` tensors (``mask`` in lp's dtype), its ulorl result and NeMo-RL's
        metrics (``sampling_importance_ratio``, ``is_oob_ratio`` and the diagnostics only given ``gen``).
        ``num_valid_samples``: the sum of NeMo-RL's sample mask (absent: every row is a sample)."""
        lpd = lp.detach()
        if gen is None and (self.use_importance_sampling_correction or self.use_on_policy_kl_approximation):
            raise _fail(self._function, "generation_logprobs",
                        "required by use_importance_sampling_correction and use_on_policy_kl_approximation")
        if self.reference_policy_kl_penalty != 0 and ref is None:
            raise _fail(self._function, "reference_policy_logprobs", "required when reference_policy_kl_penalty != 0")
        prev = lpd if self.force_on_policy_ratio else prev_logprobs
        counts = _common.counts(mask)
        empty = counts.tokens == 0  # the sums are empty: any divisor gives 0
        # The objective (PPO clip, dual clip, policy gradient, cispo or GSPO) is the C++ preset's choice.
        cfg = _ulorl._nemo_rl_loss_config(self._options, counts, 1.0 if empty else gt, 1.0 if empty else gs)
        cfg.check_values = check_values
        if self.disable_ppo_ratio and not self.force_on_policy_ratio and self.ratio_clip_c is not None:
            if bool(((lpd >= self.ratio_clip_c) & (advantages < 0) & (mask != 0)).any()):
                raise _fail(self._function, "next_token_logprobs",
                            f"a log-prob >= ratio_clip_c = {self.ratio_clip_c} with a negative advantage: NeMo-RL's "
                            "dual clip under disable_ppo_ratio is not modelled there")

        # Importance weights of (prev, gen). A -inf generation log-prob: the kernel reads the
        # log-ratio 0 there (seq-mask-tis's gate as NeMo-RL's nan_to_num), then the weight is NeMo-RL's
        # nan_to_num(inf) = 0 after its truncation, and the logged ratios follow.
        weights, logged, neg = None, None, None
        if gen is not None:
            neg = torch.isneginf(gen)
            has_neg = bool(neg.any())
            if has_neg and self.sequence_level_importance_ratios and bool((neg & (mask != 0)).any()):
                raise _fail(self._function, "generation_logprobs", "-inf at a valid token with "
                            "sequence_level_importance_ratios is not modelled (NeMo-RL's row weight 0)")
            gen_w = torch.where(neg, prev.detach(), gen) if has_neg else gen
            weights, _, rc = _ulorl._rollout_correction(prev, gen_w, mask, self._importance, None)
            logged = _ulorl._nemo_rl_rollout_correction_logged(rc, self.truncated_importance_sampling_type,
                                                               self.sequence_level_importance_ratios, gt, gs,
                                                               num_valid_samples)
            if has_neg:
                weights, logged = self._neg_inf_weights(weights, neg, mask, logged,
                                                        gt if gt is not None else counts.tokens)

        loss, result = _policy_loss_result(lp, prev, advantages, mask, cfg, None,
                                           weights if self.use_importance_sampling_correction else None, None, None)

        kl_unscaled: Any = 0
        if self.reference_policy_kl_penalty != 0:
            gen_kl = None
            if self.use_on_policy_kl_approximation:
                # exp(logp - (-inf)) is NeMo-RL's weight 0 (nan_to_num): exp(logp - 1e30) is 0 too.
                gen_kl = torch.where(neg, torch.full_like(gen, 1e30), gen) if has_neg else gen
            kl, kl_unscaled, kl_grad = _ulorl._nemo_rl_reference_policy_kl(self._options, lp_kl.detach(), ref, gen_kl,
                                                                           mask, cfg.normalizer)
            loss = loss + _with_gradient(lp_kl, kl, kl_grad, self._function)

        nll = 0.0
        if rewards is not None:
            correct = mask * (rewards > 0).to(mask.dtype).unsqueeze(-1)
            norm = _ulorl._nemo_rl_positive_example_nll(self._options, float(correct.sum().item()))
            if norm is not None:  # the term's weight, and whether there is one, are the C++ preset's
                term = _agg_loss(lp, correct, norm)
                loss = loss + term
                nll = term.item() / float(self.positive_example_nll_weight)

        metrics: Dict[str, Any] = {"loss": loss.item()}
        metrics.update(self._ratio_metrics(lpd, prev, mask, result, gt))
        metrics["kl_penalty"] = kl_unscaled
        if gen is not None:
            metrics.update(self._diagnostics(lpd, prev.detach(), torch.where(neg, prev.detach(), gen), mask, gt))
            metrics["sampling_importance_ratio"] = logged["sampling_importance_ratio"]
            if self.truncated_importance_sampling_type is not None:
                metrics["is_oob_ratio"] = logged["is_oob_ratio"]
        metrics["positive_nll_loss"] = nll
        return loss, result, metrics

    def _neg_inf_weights(self, weights: torch.Tensor, neg: torch.Tensor, mask: torch.Tensor, logged: Dict[str, float],
                         gt: float) -> Tuple[torch.Tensor, Dict[str, float]]:
        """The weights where the generation log-prob is -inf (computed at the log-ratio 0): NeMo-RL's
        weight 0 after its truncation (tis: the lower bound, else 0), and the logged sampling ratio and
        token out-of-bounds fraction corrected for them."""
        t = self.truncated_importance_sampling_type
        lo = (self.truncated_importance_sampling_ratio_min or 0.0) if t == "tis" else 0.0
        fixed = weights.masked_fill(neg, lo)
        valid_neg = neg & (mask != 0)
        logged = dict(logged)
        logged["sampling_importance_ratio"] += _per(float(((fixed - weights) * valid_neg).sum().item()), gt)
        if t in ("tis", "icepop"):
            lo_t = self.truncated_importance_sampling_ratio_min or 0.0
            hi_t = self.truncated_importance_sampling_ratio
            oob_at_one = 1.0 > hi_t or 1.0 < lo_t
            oob_at_zero = lo_t > 0.0
            logged["is_oob_ratio"] += _per((float(oob_at_zero) - float(oob_at_one)) * float(valid_neg.sum().item()), gt)
        return fixed, logged

    def _ratio_metrics(self, lp: torch.Tensor, prev: torch.Tensor, mask: torch.Tensor,
                       result: _ulorl.PolicyLossResult, gt: Optional[float]) -> Dict[str, float]:
        """probs_ratio, probs_ratio_clamped (over global_valid_toks) and their extrema over the valid
        tokens, of NeMo-RL's `ratios`: exp(logp - prev), the sequence ratio (GSPO), 1
        (force_on_policy_ratio) or logp (disable_ppo_ratio), and their clamps."""
        valid = mask != 0
        if not bool(valid.any()):
            means = self._logged_ratios(lp, prev, mask, gt)
            return {**means, "probs_ratio_min": math.inf, "probs_ratio_max": -math.inf,
                    "probs_ratio_clamped_min": math.inf, "probs_ratio_clamped_max": -math.inf}
        lo, hi = 1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max
        d = result.as_dict()
        if self.force_on_policy_ratio or not (self.disable_ppo_ratio or self.sequence_level_importance_ratios):
            means = self._logged_ratios(lp, prev, mask, gt)
            rmin, rmax = d["ratio_min"], d["ratio_max"]
            if self.force_on_policy_ratio:
                return {**means, "probs_ratio_min": rmin, "probs_ratio_max": rmax, "probs_ratio_clamped_min": rmin,
                        "probs_ratio_clamped_max": rmax}
            return {**means, "probs_ratio_min": rmin, "probs_ratio_max": rmax,
                    "probs_ratio_clamped_min": min(max(rmin, lo), hi), "probs_ratio_clamped_max": min(max(rmax, lo), hi)}
        if self.disable_ppo_ratio:
            means = self._logged_ratios(lp, prev, mask, gt)
            x = lp[valid]
            rmin, rmax = float(x.min().item()), float(x.max().item())
            return {**means, "probs_ratio_min": rmin, "probs_ratio_max": rmax, "probs_ratio_clamped_min": rmin,
                    "probs_ratio_clamped_max": rmax}
        # GSPO: each valid token carries its row's ratio (the kernel's ratio_min / ratio_max).
        n = mask.sum(-1)
        seq = torch.exp(((lp - prev) * mask).sum(-1) / n.clamp(min=1))
        count = float(n.sum().item()) if gt is None else gt
        return {"probs_ratio": _per(float((seq * n).sum().item()), count),
                "probs_ratio_clamped": _per(float((seq.clamp(lo, hi) * n).sum().item()), count),
                "probs_ratio_min": d["ratio_min"], "probs_ratio_max": d["ratio_max"],
                "probs_ratio_clamped_min": min(max(d["ratio_min"], lo), hi),
                "probs_ratio_clamped_max": min(max(d["ratio_max"], lo), hi)}

    def _logged_ratios(self, lp: torch.Tensor, prev: torch.Tensor, mask: torch.Tensor,
                       gt: Optional[float]) -> Dict[str, float]:
        """probs_ratio and probs_ratio_clamped (presets::nemo_rl::logged_ratios, a host-side function:
        device tensors are read from host copies)."""
        return _ulorl._nemo_rl_logged_ratios(self._options, _common.host(lp), _common.host(prev), _common.host(mask),
                                             gt)

    def _diagnostics(self, lp: torch.Tensor, prev: torch.Tensor, gen: torch.Tensor, mask: torch.Tensor,
                     gt: Optional[float]) -> Dict[str, float]:
        """NeMo-RL's training-vs-generation diagnostics over global_valid_toks: token_mult_prob_error,
        gen_kl_error and policy_kl_error (reference_policy_kl_type, no clamps), js_divergence_error,
        approx_entropy. ``gen`` has the -inf generation log-probs replaced by ``prev``."""
        count = float(mask.sum().item()) if gt is None else gt
        gen_kl = _kl_penalty(gen.detach(), prev, "nemo_rl", self.reference_policy_kl_type)
        policy_kl = _kl_penalty(prev.detach(), gen, "nemo_rl", self.reference_policy_kl_type)
        log_mix = torch.log(0.5 * torch.exp(prev) + 0.5 * torch.exp(gen))
        js = 0.5 * (torch.exp(prev - log_mix) - (prev - log_mix) - 1) + 0.5 * (
            torch.exp(gen - log_mix) - (gen - log_mix) - 1)
        return {"token_mult_prob_error": _per(_masked_total(torch.exp((gen - prev).abs() * mask), mask), count),
                "gen_kl_error": _per(_masked_total(gen_kl, mask), count),
                "policy_kl_error": _per(_masked_total(policy_kl, mask), count),
                "js_divergence_error": _per(_masked_total(js, mask), count),
                "approx_entropy": -_per(_masked_total(torch.exp(lp - gen) * lp, mask), count)}


_check_nan_options(globals(), "presets::nemo_rl::")
