"""verl's algorithm functions under verl's names, computed by ulorl (verl-project/verl 1dda039b).

A drop-in for ``verl.trainer.ppo.core_algos`` and ``verl.trainer.ppo.rollout_corr_helper``: every
function takes verl's arguments (names, order, defaults) and returns verl's structure (tuple order,
dtypes, metric keys with their ``actor/`` / ``rollout_corr/`` prefixes). ``install()`` puts them into
an imported verl (its policy-loss and advantage-estimator registries and the module attributes)::

    import ulorl.presets.verl as v; v.install()

The policy losses read verl's actor config by attribute or key (``ActorConfig``, ``DictConfig``, a
dict): clip_ratio / clip_ratio_low / clip_ratio_high / clip_ratio_c / tau_pos / tau_neg,
``policy_loss`` (loss_mode options, ``rollout_correction``) and ``global_batch_info`` (dp_size,
batch_num_tokens, global_batch_size, loss_scale_factor: agg_loss's keywords). Losses, gradients,
advantages, importance weights and rejection masks come from ulorl's kernels; what is left here is
verl's bookkeeping: reading the config, naming the metrics, the diagnostics verl reports about
weights and divergence statistics, and the random draw of ``clip_cov``.

Inputs as verl passes them: group ``index`` of any hashable ids (numpy object arrays of uid
strings), masks of any dtype, float tensors of mixed dtypes (computed in torch's promoted dtype;
bfloat16 / float16 in float32, the results returned in the promoted dtype).

``policy_loss`` (all loss modes plus the actor's entropy bonus and KL loss in one fused pass) and
``rollout_correction`` (un-prefixed metrics, a plain weights tensor) are ulorl's own shapes of the
same computations.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from enum import Enum
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from .. import _ulorl
from .._api import _agg_loss, _check_nan_options, _fail, _kl_penalty, _policy_loss_result
from . import _common

SNAPSHOT = "verl-project/verl 1dda039b"

# ---- inputs -----------------------------------------------------------------------------------------------


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    """A field of a verl config: a mapping's key or an object's attribute (absent or None: default)."""
    if cfg is None:
        return default
    value = cfg.get(name, default) if isinstance(cfg, Mapping) or hasattr(cfg, "get") and not hasattr(cfg, name) \
        else getattr(cfg, name, default)
    return default if value is None else value


def _compute_dtype(*tensors: Optional[torch.Tensor]) -> Tuple[torch.dtype, torch.dtype]:
    """(dtype the kernels compute in, dtype verl's torch arithmetic returns) of float inputs."""
    out = None
    for t in tensors:
        if t is not None and t.is_floating_point():
            out = t.dtype if out is None else torch.promote_types(out, t.dtype)
    out = torch.float32 if out is None else out
    return (out if out in (torch.float32, torch.float64) else torch.float32), out


def _as(t: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _group_ids(index: Any, device: torch.device) -> torch.Tensor:
    """verl's ``index`` (uids: strings, ints, any hashable; numpy, list or tensor) as int64 group ids,
    numbered by first appearance, on ``device`` (the rewards'): the uids are read on the host."""
    if isinstance(index, torch.Tensor) and not index.is_floating_point():
        return index.reshape(-1).to(device=device, dtype=torch.int64)
    if isinstance(index, np.ndarray) and index.dtype.kind in "iub":
        return torch.from_numpy(index.reshape(-1).astype(np.int64)).to(device)
    codes: Dict[Any, int] = {}
    items = index.reshape(-1).tolist() if isinstance(index, (torch.Tensor, np.ndarray)) else list(index)
    return torch.tensor([codes.setdefault(x, len(codes)) for x in items], dtype=torch.int64, device=device)


def _require_config(fn: str, config: Any) -> None:
    if config is None:
        raise _fail(f"presets::verl::{fn}", "config", "is required (verl's actor config)")


# ---- agg_loss, kl_penalty -----------------------------------------------------------------------------------


def _normalizer(loss_agg_mode: str, loss_mask: torch.Tensor, padded_length: int, dp_size: Any, batch_num_tokens: Any,
                global_batch_size: Any, loss_scale_factor: Any, sum_norm_per_sequence: bool) -> _ulorl.Normalizer:
    dp = _common.number(dp_size)
    if dp is not None and dp > 1:  # verl: the local counts are meaningless across ranks
        if loss_agg_mode == "token-mean" and batch_num_tokens is None:
            raise ValueError("(global) batch_num_tokens is required when dp_size > 1")
        if loss_agg_mode.startswith("seq-mean") and global_batch_size is None:
            raise ValueError("global_batch_size is required when dp_size > 1")
    if not sum_norm_per_sequence and loss_agg_mode == "seq-mean-token-sum-norm":
        return _ulorl._verl_normalizer("seq-mean-token-sum-norm", _common.counts(loss_mask), 1.0, None, 1.0,
                                       _common.number(loss_scale_factor), padded_length)  # the horizon alone
    return _ulorl._verl_normalizer(loss_agg_mode, _common.counts(loss_mask), dp, _common.number(batch_num_tokens),
                                   _common.number(global_batch_size), _common.number(loss_scale_factor), padded_length)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: Optional[int] = None,
    global_batch_size: Optional[int] = None,
    loss_scale_factor: Optional[int] = None,
    *,
    sum_norm_per_sequence: bool = True,
) -> torch.Tensor:
    """verl's ``agg_loss``: token-mean (masked sum / batch_num_tokens x dp_size), token-sum (masked
    sum x dp_size), seq-mean-token-sum / seq-mean-token-mean (over global_batch_size non-empty rows,
    x dp_size), seq-mean-token-sum-norm (seq-mean-token-sum / loss_scale_factor, default the padded
    length). Absent counts are this micro-batch's (ValueError when dp_size > 1, as verl).
    ``sum_norm_per_sequence=False``: verl b178a3cd's seq-mean-token-sum-norm (masked sum /
    loss_scale_factor). A 0-dim tensor with autograd to ``loss_mat``."""
    dt, out = _compute_dtype(loss_mat)
    x = _as(loss_mat, dt)
    norm = _normalizer(loss_agg_mode, loss_mask, _common.padded_length(loss_mat), dp_size, batch_num_tokens,
                       global_batch_size, loss_scale_factor, sum_norm_per_sequence)
    return _as(_agg_loss(x, loss_mask, norm), out)


class _UnknownKLPenalty(_ulorl.Error, NotImplementedError):
    """An unknown kl_penalty name: ulorl.Error, and NotImplementedError as verl raises."""


class _ZeroImportanceWeights(_ulorl.Error, ZeroDivisionError):
    """Every importance weight 0 (its effective sample size 1 / 0): ulorl.Error, and ZeroDivisionError
    as verl's metrics raise."""


def _reraised(cls: type, e: _ulorl.Error) -> _ulorl.Error:
    """``e`` as an error of ``cls`` (an ulorl.Error that is also the framework's exception type)."""
    err = cls(str(e))
    err.function, err.argument, err.index = e.function, e.argument, e.index
    return err


def _rollout_correction(*args: Any) -> Any:
    """_ulorl._rollout_correction; all-zero importance weights raise _ZeroImportanceWeights."""
    try:
        return _ulorl._rollout_correction(*args)
    except _ulorl.Error as e:
        if e.argument == "weights" and "effective sample size" in str(e):
            raise _reraised(_ZeroImportanceWeights, e) from None
        raise


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """verl's ``kl_penalty(logprob, ref_logprob, kl_penalty)``: kl / k1, abs, mse / k2, low_var_kl / k3
    (|ref - logp| clamped to 20, the value to +-10), and the "+" names (the estimator's value, the
    straight-through k2 gradient). Element-wise, with autograd to ``logprob`` and ``ref_logprob``. An unknown name
    (verl's "full" included) raises an ulorl.Error that is also a NotImplementedError (verl's type)."""
    dt, out = _compute_dtype(logprob, ref_logprob)
    x = _as(logprob, dt)
    try:
        kl = _kl_penalty(x, _as(ref_logprob, dt), "verl", kl_penalty)
    except _ulorl.Error as e:
        if e.argument != "kl_penalty":
            raise
        raise _reraised(_UnknownKLPenalty, e) from None
    return _as(kl, out)


# ---- policy losses ------------------------------------------------------------------------------------------


def _options(loss_mode: str, config: Any) -> Dict[str, Any]:
    pl = _get(config, "policy_loss")
    clip = _get(config, "clip_ratio", 0.2)
    o = dict(low=_get(config, "clip_ratio_low", clip), high=_get(config, "clip_ratio_high", clip),
             clip_ratio_c=_get(config, "clip_ratio_c", 20.0 if loss_mode in ("dppo_tv", "dppo_kl") else 3.0),
             tau_pos=_get(config, "tau_pos", 1.0), tau_neg=_get(config, "tau_neg", 1.05),
             dro_beta=_get(pl, "dro_beta"), kl_cov_ratio=_get(pl, "kl_cov_ratio", 0.0002),
             ppo_kl_coef=_get(pl, "ppo_kl_coef", 1.0), clip_cov_ratio=_get(pl, "clip_cov_ratio", 0.0002),
             clip_cov_lb=_get(pl, "clip_cov_lb", 1.0), clip_cov_ub=_get(pl, "clip_cov_ub", 5.0))
    info = _get(config, "global_batch_info", {})
    o.update({k: _common.number(info.get(k)) for k in ("batch_num_tokens", "global_batch_size", "loss_scale_factor")})
    o["dp_size"] = _common.number(info.get("dp_size", 1))
    return o


def _config(loss_mode: str, o: Dict[str, Any], loss_agg_mode: str, mask: torch.Tensor, padded: int,
            sum_norm_per_sequence: bool = True, kl_type: Optional[str] = None, kl_coef: float = 0.0,
            entropy_coef: float = 0.0, require_global_counts: bool = True) -> _ulorl.PolicyLossConfig:
    if require_global_counts and loss_mode != "geo_mean":
        # verl's checks of the global counts; gspo and sapo aggregate as seq-mean-token-mean whatever the mode.
        checked_mode = "seq-mean-token-mean" if loss_mode in ("gspo", "sapo") else loss_agg_mode
        _normalizer(checked_mode, mask, padded, o["dp_size"], o["batch_num_tokens"], o["global_batch_size"],
                    o["loss_scale_factor"], True)
    scale = o["loss_scale_factor"]
    dp, gbs = o["dp_size"], o["global_batch_size"]
    if not sum_norm_per_sequence and loss_agg_mode == "seq-mean-token-sum-norm":
        dp, gbs = 1.0, 1.0  # b178a3cd: the horizon alone
    return _ulorl._verl_config(loss_mode, o["low"], o["high"], o["clip_ratio_c"], o["tau_pos"], o["tau_neg"],
                               loss_agg_mode, _common.counts(mask), dp, o["batch_num_tokens"], gbs, scale, padded,
                               kl_type, kl_coef, entropy_coef, o["dro_beta"], o["kl_cov_ratio"], o["ppo_kl_coef"],
                               o["clip_cov_ratio"], o["clip_cov_lb"], o["clip_cov_ub"])


_METRIC_KEYS = {"vanilla": ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"), "dppo_tv": None, "dppo_kl": None,
                "gspo": None, "sapo": None, "geo_mean": None, "cispo": None, "clip_cov": ("pg_clipfrac", "ppo_kl"),
                "kl_cov": ("ppo_kl",), "dro": ("ppo_kl",), "gpg": ()}


def _clip_cov_draw(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                   response_mask: torch.Tensor, o: Dict[str, Any]) -> torch.Tensor:
    """verl's random choice of clip_cov's tokens: torch.randperm over the candidates (valid, not
    clipped, clip_cov_lb < cov < clip_cov_ub) in row-major order, the first min(clip_num, #candidates)
    kept; the same draw as verl's from the same generator state. ulorl's clip_cov_weights checks it."""
    with torch.no_grad():
        m = response_mask > 0
        ratio = torch.exp(log_prob - old_log_prob)
        clipped = -advantages * torch.clamp(ratio, 1 - o["low"], 1 + o["high"]) > -advantages * ratio
        n = m.sum()
        cov = (advantages - (advantages * m).sum() / n) * (log_prob - (log_prob * m).sum() / n)
        cand = torch.nonzero(m & ~clipped & (cov > o["clip_cov_lb"]) & (cov < o["clip_cov_ub"]))
        sel = torch.zeros_like(log_prob)
        if len(cand) > 0:
            clip_num = max(int(o["clip_cov_ratio"] * response_mask.sum().item()), 1)
            # verl's draw: torch.randperm on the CPU generator, whatever the tensors' device.
            pick = cand[torch.randperm(len(cand))[: min(clip_num, len(cand))].to(cand.device)]
            sel[pick[:, 0], pick[:, 1]] = 1
        return sel


def _loss(loss_mode: str, old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
          response_mask: torch.Tensor, loss_agg_mode: str, config: Any,
          rollout_is_weights: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """One verl policy loss: (loss with autograd to log_prob, verl's ``actor/`` metrics)."""
    _require_config(f"compute_policy_loss_{loss_mode}", config)
    dt, out = _compute_dtype(old_log_prob, log_prob, advantages, rollout_is_weights)
    old, lp, adv, w = (_as(t, dt) for t in (old_log_prob, log_prob, advantages, rollout_is_weights))
    o = _options(loss_mode, config)
    padded = _common.padded_length(lp)
    cfg = _config(loss_mode, o, loss_agg_mode, response_mask, padded)
    lpd = lp.detach()
    stats: Dict[str, float] = {}
    if loss_mode in ("dppo_tv", "dppo_kl"):
        w, stats = _ulorl._verl_dppo_weights(loss_mode, o["low"], o["high"], o["clip_ratio_c"], old, lpd, adv,
                                             response_mask, w)
    elif loss_mode == "clip_cov":
        sel = _clip_cov_draw(old, lpd, adv, response_mask, o)
        w, stats = _ulorl._verl_clip_cov_weights(o["low"], o["high"], o["clip_cov_ratio"], o["clip_cov_lb"],
                                                 o["clip_cov_ub"], old, lpd, adv, response_mask, sel, w)
    if loss_mode == "kl_cov":
        # The selected tokens take the |x| penalty, the others not; one normaliser, the losses add.
        w_sel, w_rest, stats = _ulorl._verl_kl_cov_selection(o["kl_cov_ratio"], o["ppo_kl_coef"], old, lpd, adv,
                                                             response_mask, w)
        loss_sel, _ = _policy_loss_result(lp, old, adv, response_mask, cfg, None, w_sel, None, None)
        rest = _config(loss_mode, o, loss_agg_mode, response_mask, padded)
        rest.abs_penalty = 0.0
        loss_rest, result = _policy_loss_result(lp, old, adv, response_mask, rest, None, w_rest, None, None)
        loss = loss_sel + loss_rest
    else:
        loss, result = _policy_loss_result(lp, old, adv, response_mask, cfg, None, w, None, None)
    m = _ulorl._verl_metrics(loss_mode, result, **stats)
    keys = _METRIC_KEYS[loss_mode]
    keys = ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower") if keys is None else keys
    return _as(loss, out), {f"actor/{k}": m[k] for k in keys}


def _policy_loss_fn(loss_mode: str, default_agg: str) -> Callable[..., Tuple[torch.Tensor, Dict[str, Any]]]:
    def f(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
          loss_agg_mode: str = default_agg, config: Optional[Any] = None,
          rollout_is_weights: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Dict[str, Any]]:
        return _loss(loss_mode, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                     rollout_is_weights)

    f.__name__ = f.__qualname__ = f"compute_policy_loss_{loss_mode}"
    f.__module__ = __name__
    f.__doc__ = (f"verl's ``compute_policy_loss_{loss_mode}`` (registered as '{loss_mode}'): ``(pg_loss, metrics)`` "
                 "with autograd to ``log_prob`` and verl's ``actor/`` metrics of that mode.")
    return f


compute_policy_loss_vanilla = _policy_loss_fn("vanilla", "token-mean")
compute_policy_loss_dppo_tv = _policy_loss_fn("dppo_tv", "token-mean")
compute_policy_loss_dppo_kl = _policy_loss_fn("dppo_kl", "token-mean")
compute_policy_loss_gspo = _policy_loss_fn("gspo", "seq-mean-token-mean")
compute_policy_loss_sapo = _policy_loss_fn("sapo", "seq-mean-token-mean")
compute_policy_loss_gpg = _policy_loss_fn("gpg", "token-mean")
compute_policy_loss_clip_cov = _policy_loss_fn("clip_cov", "token-mean")
compute_policy_loss_kl_cov = _policy_loss_fn("kl_cov", "token-mean")
compute_policy_loss_geo_mean = _policy_loss_fn("geo_mean", "token-mean")
compute_policy_loss_dro = _policy_loss_fn("dro", "token-mean")
compute_policy_loss_cispo = _policy_loss_fn("cispo", "token-mean")


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """verl's ``compute_policy_loss_reinforce``: -A logp (times the detached ``rollout_is_weights``),
    aggregated; ``actor/ppo_kl`` = mean(rollout_log_prob - log_prob) over the valid tokens."""
    _require_config("compute_policy_loss_reinforce", config)
    dt, out = _compute_dtype(rollout_log_prob, log_prob, advantages, rollout_is_weights)
    ro, lp, adv, w = (_as(t, dt) for t in (rollout_log_prob, log_prob, advantages, rollout_is_weights))
    cfg = _config("gpg", _options("gpg", config), loss_agg_mode, response_mask, _common.padded_length(lp))
    loss, result = _policy_loss_result(lp, ro, adv, response_mask, cfg, None, w, None, None)
    return _as(loss, out), {"actor/ppo_kl": _ulorl._verl_metrics("dro", result)["ppo_kl"]}


def compute_policy_loss_bypass_mode(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Optional[Any] = None,
    rollout_is_weights: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """verl's ``bypass_mode`` loss (old_log_prob is the rollout's): the rollout correction of
    ``config.policy_loss.rollout_correction`` between log_prob and old_log_prob (its keep-mask
    masks the loss), then ``loss_type`` ``reinforce`` (with the IS weights) or ``ppo_clip`` (vanilla,
    without them); the metrics of both (``rollout_is_weights`` is ignored, as verl)."""
    _require_config("compute_policy_loss_bypass_mode", config)
    rc = _get(_get(config, "policy_loss"), "rollout_correction")
    if rc is None:
        raise ValueError("rollout_correction config not found in policy_loss. "
                         "When using loss_mode='bypass_mode', ensure rollout_correction config is passed.")
    loss_type = _get(rc, "loss_type", "ppo_clip")
    if loss_type not in ("reinforce", "ppo_clip"):
        raise ValueError(f"Invalid loss_type: {loss_type}. Must be 'reinforce' or 'ppo_clip'.")
    with torch.no_grad():
        proto, keep, rc_metrics = compute_rollout_correction_and_rejection_mask(
            log_prob.detach(), old_log_prob, response_mask, rollout_is=_get(rc, "rollout_is"),
            rollout_is_threshold=_get(rc, "rollout_is_threshold", 2.0),
            rollout_is_batch_normalize=_get(rc, "rollout_is_batch_normalize", False),
            rollout_rs=_get(rc, "rollout_rs"), rollout_rs_threshold=_get(rc, "rollout_rs_threshold"))
    if loss_type == "reinforce":
        weights = proto.batch["rollout_is_weights"] if proto is not None else None
        loss, metrics = compute_policy_loss_reinforce(old_log_prob, log_prob, advantages, keep, loss_agg_mode, config,
                                                      weights)
    else:
        loss, metrics = compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, keep, loss_agg_mode, config,
                                                    None)
    metrics.update(rc_metrics)
    return loss, metrics


POLICY_LOSS_REGISTRY: Dict[str, Callable[..., Tuple[torch.Tensor, Dict[str, Any]]]] = {
    "vanilla": compute_policy_loss_vanilla, "dppo_tv": compute_policy_loss_dppo_tv,
    "dppo_kl": compute_policy_loss_dppo_kl, "gspo": compute_policy_loss_gspo, "sapo": compute_policy_loss_sapo,
    "gpg": compute_policy_loss_gpg, "clip_cov": compute_policy_loss_clip_cov, "kl_cov": compute_policy_loss_kl_cov,
    "geo_mean": compute_policy_loss_geo_mean, "dro": compute_policy_loss_dro, "cispo": compute_policy_loss_cispo,
    "bypass_mode": compute_policy_loss_bypass_mode}


def get_policy_loss_fn(name: str) -> Callable[..., Tuple[torch.Tensor, Dict[str, Any]]]:
    """verl's ``get_policy_loss_fn``: the loss registered as ``name`` (ValueError if none)."""
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(f"Unsupported loss mode: {name}. Supported modes are: {list(POLICY_LOSS_REGISTRY.keys())}")
    return POLICY_LOSS_REGISTRY[name]


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
    sum_norm_per_sequence: bool = True,
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
    """verl's actor loss of one micro-batch in one fused pass: the policy loss of ``loss_mode`` (any
    registered name but bypass_mode) plus the entropy bonus (``entropy``, ``entropy_coeff``) and the
    KL loss (``ref_log_prob``, ``kl_loss_type``: kl_penalty's names, ``kl_loss_coef``) under the
    policy term's normaliser. Options by keyword, as the actor config's fields; agg_loss's counts as
    :func:`agg_loss` (absent ones are this micro-batch's, whatever dp_size). ``clip_cov_selection``: clip_cov's draw (0/1 in the mask's shape), required
    for clip_cov (:func:`compute_policy_loss_clip_cov` draws it itself, as verl).

    Returns ``(loss, metrics)``: loss = pg_loss + kl_loss_coef kl - entropy_coeff entropy with
    autograd to ``log_prob`` (and ``entropy``); metrics are verl's pg_clipfrac, ppo_kl,
    pg_clipfrac_lower (un-prefixed) besides ulorl's (loss, pg_loss, kl_loss, entropy_loss, ...).
    """
    o = dict(low=clip_ratio if clip_ratio_low is None else clip_ratio_low,
             high=clip_ratio if clip_ratio_high is None else clip_ratio_high, clip_ratio_c=clip_ratio_c,
             tau_pos=tau_pos, tau_neg=tau_neg, dro_beta=dro_beta, kl_cov_ratio=kl_cov_ratio, ppo_kl_coef=ppo_kl_coef,
             clip_cov_ratio=clip_cov_ratio, clip_cov_lb=clip_cov_lb, clip_cov_ub=clip_cov_ub, dp_size=dp_size,
             batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size,
             loss_scale_factor=loss_scale_factor)
    padded = _common.padded_length(log_prob)

    def config(kl_type: Optional[str], kl_coef: float, entropy_coef: float) -> _ulorl.PolicyLossConfig:
        c = _config(loss_mode, o, loss_agg_mode, response_mask, padded, sum_norm_per_sequence, kl_type, kl_coef,
                    entropy_coef, require_global_counts=False)
        c.check_values = check_values
        return c

    cfg = config(kl_loss_type, kl_loss_coef, entropy_coeff)
    if clip_cov_selection is not None and loss_mode != "clip_cov":
        raise _fail("presets::verl::policy_loss", "clip_cov_selection", f"is a clip_cov input (loss_mode '{loss_mode}')")
    ent = entropy if entropy_coeff != 0.0 else None
    lp = log_prob.detach()
    weights, stats = rollout_is_weights, {}
    if loss_mode in ("dppo_tv", "dppo_kl"):
        weights, stats = _ulorl._verl_dppo_weights(loss_mode, o["low"], o["high"], clip_ratio_c, old_log_prob, lp,
                                                   advantages, response_mask, rollout_is_weights)
    elif loss_mode == "clip_cov":
        if clip_cov_selection is None:
            raise _fail("presets::verl::policy_loss", "clip_cov_selection",
                        "required by loss_mode 'clip_cov' (verl's torch.randperm draw among the candidates)")
        weights, stats = _ulorl._verl_clip_cov_weights(o["low"], o["high"], clip_cov_ratio, clip_cov_lb, clip_cov_ub,
                                                       old_log_prob, lp, advantages, response_mask,
                                                       clip_cov_selection, rollout_is_weights)
    elif loss_mode == "kl_cov":
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


# ---- advantage estimators -------------------------------------------------------------------------------------


def _outcome(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
             per_response: Callable[[torch.Tensor], torch.Tensor], preset: Any = None) -> torch.Tensor:
    """verl's outcome estimators: scores = each row's reward sum, a per-response advantage, broadcast
    onto the mask (verl: ``scalar.unsqueeze(-1) * response_mask``)."""
    dt, out = _compute_dtype(token_level_rewards)
    scores = _as(token_level_rewards, dt).sum(dim=-1).contiguous()
    with torch.no_grad():
        if preset is None:  # verl's placement (on the mask) is that of its GRPO preset
            preset = _ulorl._advantage_preset("verl", "grpo", 1e-6, True, "group", True, True)
        adv = _ulorl._broadcast_to_tokens(per_response(scores), response_mask, preset, None)
    return _as(adv, torch.promote_types(out, response_mask.dtype) if response_mask.is_floating_point() else out)


def _grpo(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, epsilon: float,
          norm_adv_by_std_in_grpo: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    p = _ulorl._advantage_preset("verl", "grpo", epsilon, norm_adv_by_std_in_grpo, "group", True, True)
    ids = _group_ids(index, token_level_rewards.device)
    adv = _outcome(token_level_rewards, response_mask, lambda s: _ulorl._group_advantages(s, ids, None, p), p)
    return adv, adv


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Optional[Any] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``grpo``: (s - mean_g) / (std_g + epsilon) (unbiased std; a singleton keeps mean 0 and
    std 1; Dr. GRPO without the std), on the mask. Returns ``(advantages, returns)`` (equal)."""
    return _grpo(token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo)


def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``grpo_passk``: per group only the best response gets s_max - s_second (divided by the
    group's unbiased std + epsilon when ``config.norm_adv_by_std_in_grpo``, default True: as verl, the
    config's value and not the keyword decides), on the mask; a group of one is an error."""
    _require_config("compute_grpo_passk_outcome_advantage", config)
    scale = bool(_get(config, "norm_adv_by_std_in_grpo", True))
    ids = _group_ids(index, token_level_rewards.device)
    adv = _outcome(token_level_rewards, response_mask,
                   lambda s: _ulorl._pass_at_k_advantages(s, ids, None, float(epsilon), scale))
    return adv, adv


def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Optional[Any] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``grpo_vectorized``: the same advantages as :func:`compute_grpo_outcome_advantage`."""
    return _grpo(token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo)


def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``rloo``: s_i - mean of the group's other scores (a singleton: s_i), on the mask."""
    p = _ulorl._advantage_preset("verl", "rloo", epsilon, True, "group", True, True)
    ids = _group_ids(index, token_level_rewards.device)
    adv = _outcome(token_level_rewards, response_mask, lambda s: _ulorl._group_advantages(s, ids, None, p), p)
    return adv, adv


def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``rloo_vectorized``: the advantages of :func:`compute_rloo_outcome_advantage` except a
    singleton's, which is 0."""
    ids = _group_ids(index, token_level_rewards.device)
    p = _ulorl._custom_advantage("leave_one_out", "none", "unbiased", 0.0, "add_to_std", "zero", "divide", "masked",
                                 True)
    adv = _outcome(token_level_rewards, response_mask, lambda s: _ulorl._group_advantages(s, ids, None, p), p)
    return adv, adv


def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``gpg``: B / #{s != 0} (s - mean_g) / f_norm on the mask (``alpha`` is recomputed, as verl)."""
    ids = _group_ids(index, token_level_rewards.device)
    adv = _outcome(token_level_rewards, response_mask, lambda s: _ulorl._gpg_advantages(s, ids, None, f_norm))
    return adv, adv


def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``opo``: s - the length-weighted group mean of s, on the mask."""
    ids = _group_ids(index, token_level_rewards.device)
    adv = _outcome(token_level_rewards, response_mask,
                   lambda s: _ulorl._opo_advantages(s, response_mask, ids, None, None))
    return adv, adv


def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``reinforce_plus_plus_baseline``: s - mean_g on every valid token, whitened over the batch."""
    dt, out = _compute_dtype(token_level_rewards)
    scores = _as(token_level_rewards, dt).sum(dim=-1).contiguous()
    ids = _group_ids(index, token_level_rewards.device)
    with torch.no_grad():
        adv = _ulorl._reinforce_plus_plus_baseline_advantages(scores, ids, None, response_mask, "verl", True,
                                                              None)
    adv = _as(adv, out)
    return adv, adv


def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``reinforce_plus_plus`` (gamma = ``config.gamma``): returns scanned backwards over the
    valid tokens only (a masked position, e.g. a tool observation inside a multi-turn response,
    gets 0 and carries the running return through unchanged), whitened over the batch's valid
    tokens. Returns ``(advantages, returns)``. ulorl.reinforce_plus_plus_advantages keeps verl b178a3cd's
    scan (reset after a masked position)."""
    _require_config("compute_reinforce_plus_plus_outcome_advantage", config)
    dt, out = _compute_dtype(token_level_rewards)
    with torch.no_grad():
        adv, ret = _ulorl._reinforce_plus_plus_advantages(_as(token_level_rewards, dt), response_mask,
                                                   float(_get(config, "gamma")), None, "skip_masked")
    return _as(adv, out), _as(ret, out)


def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: Any,
    lam: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``gae``: GAE scanned backwards over the valid tokens (values and the running advantage carry
    over masked observation tokens), ``returns = advantages + values`` at every position, the
    advantages whitened over the valid tokens and not masked. Returns ``(advantages, returns)``."""
    dt, out = _compute_dtype(token_level_rewards, values, response_mask)
    with torch.no_grad():
        adv, ret = _ulorl._gae_advantages(_as(token_level_rewards, dt), _as(values, dt), response_mask,
                                          float(gamma), float(lam), None)
    return _as(adv, out), _as(ret, out)


def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Optional[Any] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``remax``: returns = the reverse cumulative sum of the masked rewards, advantages = returns -
    reward_baselines on the mask. Returns ``(advantages, returns)``."""
    _, ret_out = _compute_dtype(token_level_rewards, response_mask)
    dt, adv_out = _compute_dtype(token_level_rewards, response_mask, reward_baselines)
    with torch.no_grad():
        adv, ret = _ulorl._remax_advantages(_as(token_level_rewards, dt), _as(reward_baselines, dt).reshape(-1).contiguous(),
                                            response_mask, None)
    return _as(adv, adv_out), _as(ret, ret_out)


def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Optional[Any] = None,
    non_tensor_batch: Optional[dict] = None,
    batch: Optional[dict] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``gdpo``: each reward component's GRPO advantage, weighted sum (``gdpo_reward_weights``),
    whitened over the valid tokens. Components: ``non_tensor_batch[k]`` for k in
    ``config.gdpo_reward_keys`` when config, non_tensor_batch and batch are given, else the rows'
    reward sums."""
    dt, out = _compute_dtype(token_level_rewards)
    weights: List[float] = []
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = _get(config, "gdpo_reward_keys")
        assert keys, ("GDPO requires 'algorithm.gdpo_reward_keys' listing the individual reward "
                      "component keys returned by compute_score (e.g. ['format_reward', 'accuracy_reward']).")
        for k in keys:
            assert k in non_tensor_batch, f"GDPO reward key '{k}' not found in non_tensor_batch."
        comps = torch.stack([torch.as_tensor(np.asarray(non_tensor_batch[k], dtype=np.float32),
                                             device=token_level_rewards.device) for k in keys], -1)
        weights = [float(x) for x in (_get(config, "gdpo_reward_weights") or [])]
    else:
        comps = _as(token_level_rewards, dt).sum(dim=-1, keepdim=True)
    ids = _group_ids(index, token_level_rewards.device)
    with torch.no_grad():
        adv = _ulorl._multi_reward_advantages(comps.to(dt).contiguous(), weights, ids, None, response_mask,
                                              "verl", epsilon, norm_adv_by_std_in_grpo, True, True, "group",
                                              "sum_then_normalize", None)
    adv = _as(adv, out)
    return adv, adv


def _otb(estimator: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any,
         old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor, rollout_is_weights: Optional[torch.Tensor],
         handle_zero_tail: bool, epsilon: float) -> Tuple[torch.Tensor, torch.Tensor]:
    dt, out = _compute_dtype(token_level_rewards, old_log_probs, sum_pi_squared, rollout_is_weights)
    ids = _group_ids(index, token_level_rewards.device)
    with torch.no_grad():
        adv, ret = _ulorl._optimal_token_baseline_advantages(
            _as(token_level_rewards, dt), response_mask, ids, _as(old_log_probs, dt),
            _as(sum_pi_squared, dt), _as(rollout_is_weights, dt), handle_zero_tail, epsilon, estimator, None)
    return _as(adv, out), _as(ret, out)


def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: Optional[torch.Tensor] = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``optimal_token_baseline``: returns-to-go minus a per-position group baseline weighted by
    the cumulative path variance (1 - 2 pi + sum pi^2, times rollout_is_weights^2)."""
    return _otb("optimal_token_baseline", token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared,
                rollout_is_weights, handle_zero_tail, epsilon)


def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: Optional[torch.Tensor] = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl ``tir_optimal_token_baseline``: the optimal token baseline over the j-th valid tokens."""
    return _otb("tir_optimal_token_baseline", token_level_rewards, response_mask, index, old_log_probs,
                sum_pi_squared, rollout_is_weights, handle_zero_tail, epsilon)


ADV_ESTIMATOR_REGISTRY: Dict[str, Callable[..., Tuple[torch.Tensor, torch.Tensor]]] = {
    "grpo": compute_grpo_outcome_advantage, "grpo_vectorized": compute_grpo_vectorized_outcome_advantage,
    "gdpo": compute_gdpo_outcome_advantage, "gae": compute_gae_advantage_return,
    "remax": compute_remax_outcome_advantage, "grpo_passk": compute_grpo_passk_outcome_advantage,
    "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage,
    "rloo": compute_rloo_outcome_advantage, "opo": compute_opo_outcome_advantage,
    "reinforce_plus_plus": compute_reinforce_plus_plus_outcome_advantage, "gpg": compute_gpg_outcome_advantage,
    "rloo_vectorized": compute_rloo_vectorized_outcome_advantage,
    "optimal_token_baseline": compute_optimal_token_baseline_advantage,
    "tir_optimal_token_baseline": compute_multi_turn_optimal_token_baseline_advantage}


def get_adv_estimator_fn(name_or_enum: Union[str, Enum]) -> Callable[..., Tuple[torch.Tensor, torch.Tensor]]:
    """verl's ``get_adv_estimator_fn``: the estimator registered under a name or enum value."""
    name = name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(f"Unknown advantage estimator simply: {name}")
    return ADV_ESTIMATOR_REGISTRY[name]


# ---- rollout correction ---------------------------------------------------------------------------------------

SAFETY_BOUND = 20.0
SUPPORTED_ROLLOUT_RS_OPTIONS = {"token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                                "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"}
TOKEN_LEVEL_ROLLOUT_RS_OPTIONS = {"token_k1", "token_k2", "token_k3"}


class _WeightsProto:
    """What verl's DataProto offers of the IS weights (``.batch["rollout_is_weights"]``) when verl
    is not importable."""

    def __init__(self, weights: torch.Tensor) -> None:
        self.batch = {"rollout_is_weights": weights}
        self.non_tensor_batch: Dict[str, Any] = {}
        self.meta_info: Dict[str, Any] = {}


def _proto(weights: torch.Tensor) -> Any:
    mod = sys.modules.get("verl.protocol")
    if mod is not None:
        return mod.DataProto.from_dict(tensors={"rollout_is_weights": weights})
    return _WeightsProto(weights)


def _masked_mean(x: torch.Tensor, m: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    if axis is None:
        return (x * m).sum() / m.sum()
    return (x * m).sum(axis) / (m.sum(axis) + 1e-8)


def _is_threshold(spec: Any) -> Tuple[float, Optional[float]]:
    """(upper, lower) of rollout_is_threshold; the spec is validated by ulorl's preset first."""
    if isinstance(spec, str) and "_" in spec.strip():
        lo, hi = spec.strip().split("_", 1)
        return float(hi), float(lo)
    return float(spec), None


def compute_is_metrics(
    rollout_is_weights: torch.Tensor,
    raw_rollout_is_weights: torch.Tensor,
    log_ratio_for_metrics: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str,
    rollout_is_threshold: float,
    rollout_is_threshold_lower: Optional[float] = None,
) -> Dict[str, float]:
    """verl's diagnostics of importance weights (un-prefixed): rollout_is_mean / max / min / std /
    eff_sample_size, ratio_fraction_high / low (of the raw weights; sequence level: of the log-ratio
    sums), and the per-row rollout_is_seq_mean / std / max / min / max_deviation / fraction_high / low."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    w, raw, m = rollout_is_weights.detach(), raw_rollout_is_weights.detach(), response_mask
    upper = float(rollout_is_threshold)
    lower = 1.0 / upper if rollout_is_threshold_lower is None else float(rollout_is_threshold_lower)
    out: Dict[str, float] = {}
    if rollout_is == "sequence":
        lr = log_ratio_for_metrics
        out["rollout_is_max"] = math.exp(min(lr.max().item(), SAFETY_BOUND))
        out["rollout_is_min"] = math.exp(lr.min().item())
        out["rollout_is_mean"] = _masked_mean(w, m).item()
        out["rollout_is_ratio_fraction_high"] = (lr > math.log(upper)).float().mean().item()
        out["rollout_is_ratio_fraction_low"] = (lr < math.log(lower)).float().mean().item()
    else:
        out["rollout_is_mean"] = _masked_mean(w, m).item()
        out["rollout_is_ratio_fraction_high"] = _masked_mean((raw > upper).float(), m).item()
        out["rollout_is_ratio_fraction_low"] = _masked_mean((raw < lower).float(), m).item()
        out["rollout_is_max"] = w.masked_fill(~m.bool(), float("-inf")).max().item()
        out["rollout_is_min"] = w.masked_fill(~m.bool(), float("inf")).min().item()
    clamped = w.clamp(min=0.0, max=upper)
    mean = _masked_mean(clamped, m)
    if m.sum() > 1:
        out["rollout_is_std"] = torch.sqrt(torch.clamp(_masked_mean(clamped.square(), m) - mean.square(), min=0)).item()
    else:
        out["rollout_is_std"] = 0.0
    out["rollout_is_eff_sample_size"] = 1.0 / _masked_mean((clamped / (mean + 1e-8)).square(), m).item()
    if w.dim() > 1:
        seq = _masked_mean(w, m, -1)
        out["rollout_is_seq_mean"] = seq.mean().item()
        out["rollout_is_seq_std"] = seq.std().item() if seq.numel() > 1 else 0.0
        out["rollout_is_seq_max"] = seq.max().item()
        out["rollout_is_seq_min"] = seq.min().item()
        out["rollout_is_seq_max_deviation"] = (seq - 1.0).abs().max().item()
        raw_seq = _masked_mean(raw, m, -1)
        out["rollout_is_seq_fraction_high"] = (raw_seq > upper).float().mean().item()
        out["rollout_is_seq_fraction_low"] = (raw_seq < lower).float().mean().item()
    return out


def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: Union[str, float] = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """verl's ``compute_rollout_correction_weights`` of ``log_ratio`` = log(pi_train / pi_rollout):
    ulorl's token or sequence weights (TIS: clamped to the upper bound; "l_u": IcePop, zero outside
    [l, u]; batch normalisation to mean 1), detached, 0 on padding; and verl's metrics (un-prefixed)."""
    if rollout_is not in ("token", "sequence"):
        raise ValueError(f"Invalid rollout_is: {rollout_is}. Must be one of {{'token', 'sequence'}}.")
    return _is_weights(log_ratio, torch.zeros_like(log_ratio), response_mask, rollout_is, rollout_is_threshold,
                       rollout_is_batch_normalize)


def _is_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                rollout_is: str, rollout_is_threshold: Any, batch_normalize: bool
                ) -> Tuple[torch.Tensor, Dict[str, float]]:
    cfg = _ulorl._verl_rollout_correction_config(rollout_is, rollout_is_threshold, batch_normalize, None, None)
    w, _, rm = _rollout_correction(old_log_prob.detach(), rollout_log_prob.detach(),
                                   response_mask, cfg, None)
    d = rm.as_dict()
    upper, lower = _is_threshold(rollout_is_threshold)
    with torch.no_grad():
        lr = old_log_prob.detach() - rollout_log_prob.detach()
        if rollout_is == "token":
            lr_metrics = lr
            raw = torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        else:
            lr_metrics = (lr * response_mask).sum(-1, keepdim=True)
            raw = torch.exp(lr_metrics.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(lr)
        raw = raw * response_mask
        applied = w * d["batch_norm_factor"] if batch_normalize else w  # the weights before normalisation
        metrics = compute_is_metrics(applied, raw, lr_metrics, response_mask, rollout_is, upper, lower)
    metrics["rollout_is_mean"], metrics["rollout_is_eff_sample_size"] = d["weight_mean"], d["effective_sample_size"]
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = d["out_of_bounds_token_fraction"]
    if batch_normalize:
        metrics["rollout_is_batch_norm_factor"] = d["batch_norm_factor"]
    return w, metrics


def compute_rs_metrics(
    option_name: str,
    rs_statistic: torch.Tensor,
    response_mask: torch.Tensor,
    seq_valid_mask: torch.Tensor,
    *,
    level: str,
    per_sequence_values: Optional[torch.Tensor],
    rollout_rs_threshold: float,
    rollout_rs_threshold_lower: float,
    apply_lower_threshold: bool,
) -> Dict[str, float]:
    """verl's diagnostics of one rejection option's statistic (un-prefixed ``rollout_rs_<option>_*``):
    mean, max, min, fraction_high / low, std (clamped to the thresholds), seq_mean / std / max / min /
    max_deviation / fraction_high (/ fraction_low for k1 options)."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    p, m, mb = f"rollout_rs_{option_name}", response_mask, response_mask.bool()
    seq = per_sequence_values if per_sequence_values is not None else _masked_mean(rs_statistic, m, -1)
    seq = seq.squeeze(-1) if seq.dim() > 1 else seq
    sv = seq[seq_valid_mask]
    hi, lo = rollout_rs_threshold, rollout_rs_threshold_lower
    out = {f"{p}_mean": _masked_mean(rs_statistic, m).item()}
    by_seq = level == "sequence" and sv.numel() > 0
    out[f"{p}_max"] = sv.max().item() if by_seq else rs_statistic.masked_fill(~mb, float("-inf")).max().item()
    out[f"{p}_min"] = sv.min().item() if by_seq else rs_statistic.masked_fill(~mb, float("inf")).min().item()
    if by_seq:
        out[f"{p}_fraction_high"] = (sv > hi).float().mean().item()
        out[f"{p}_fraction_low"] = (sv < lo).float().mean().item() if apply_lower_threshold else 0.0
    else:
        out[f"{p}_fraction_high"] = _masked_mean((rs_statistic > hi).float(), m).item()
        out[f"{p}_fraction_low"] = _masked_mean((rs_statistic < lo).float(), m).item() if apply_lower_threshold else 0.0
    if m.sum() > 1:
        s = rs_statistic.clamp(min=lo if apply_lower_threshold else 0.0, max=hi)
        mean = _masked_mean(s, m)
        out[f"{p}_std"] = torch.sqrt(torch.clamp(_masked_mean(s.square(), m) - mean.square(), min=0.0)).item()
    else:
        out[f"{p}_std"] = 0.0
    if sv.numel() > 0:
        out.update({f"{p}_seq_mean": sv.mean().item(), f"{p}_seq_std": sv.std().item() if sv.numel() > 1 else 0.0,
                    f"{p}_seq_max": sv.max().item(), f"{p}_seq_min": sv.min().item(),
                    f"{p}_seq_max_deviation": sv.abs().max().item(),
                    f"{p}_seq_fraction_high": (sv > hi).float().mean().item()})
        if apply_lower_threshold:
            out[f"{p}_seq_fraction_low"] = (sv < lo).float().mean().item()
    else:
        out.update({f"{p}_{k}": 0.0 for k in ("seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation",
                                              "seq_fraction_high", "seq_fraction_low")})
    return out


def _rs_options(rollout_rs: Any) -> List[str]:
    if rollout_rs is None or not isinstance(rollout_rs, str):
        raise ValueError("rollout_rs must be a non-empty string (comma separated for multiple options).")
    out: List[str] = []
    for opt in (o.strip() for o in rollout_rs.split(",")):
        if opt and opt not in out:
            if opt not in SUPPORTED_ROLLOUT_RS_OPTIONS:
                raise ValueError(f"Invalid rollout_rs option: {opt}. Must be one of "
                                 f"{sorted(SUPPORTED_ROLLOUT_RS_OPTIONS)}.")
            out.append(opt)
    if not out:
        raise ValueError("rollout_rs must contain at least one valid option.")
    return out


def _rs_thresholds(options: List[str], spec: Any) -> List[str]:
    """Each option's threshold text (verl: one shared value or one per option)."""
    if spec is None:
        raise ValueError("rollout_rs_threshold must be provided for rejection sampling.")
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise TypeError("rollout_rs_threshold must be a string or numeric value specifying per-option thresholds.")
    parts = [str(spec)] if not isinstance(spec, str) else [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise ValueError("rollout_rs_threshold must contain at least one threshold value.")
    if len(parts) not in (1, len(options)):
        raise ValueError(f"rollout_rs_threshold expects either one threshold shared by all options or exactly "
                         f"{len(options)} thresholds to match the provided rollout_rs options.")
    return parts * len(options) if len(parts) == 1 else parts


def _rejection(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
               rollout_rs: Any, rollout_rs_threshold: Any) -> Tuple[torch.Tensor, Dict[str, float]]:
    options = _rs_options(rollout_rs)
    specs = _rs_thresholds(options, rollout_rs_threshold)
    joined = ",".join(specs)

    def run(rs: str, th: str) -> Tuple[torch.Tensor, Dict[str, float]]:
        cfg = _ulorl._verl_rollout_correction_config(None, None, False, rs, th)
        _, keep, rm = _rollout_correction(old_log_prob, rollout_log_prob,
                                          response_mask, cfg, None)
        return keep, rm.as_dict()

    keep, d = run(",".join(options), joined)
    metrics: Dict[str, float] = {}
    m = response_mask
    with torch.no_grad():
        lr = (old_log_prob - rollout_log_prob).clamp(-SAFETY_BOUND, SAFETY_BOUND)
        stats = {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}
        seq_valid = m.sum(-1) > 0
        for opt, spec in zip(options, specs):
            est = opt[-2:]
            if est == "k1":
                lo_s, hi_s = spec.split("_", 1) if "_" in spec else (str(1.0 / float(spec)), spec)
                lo, hi = math.log(float(lo_s)), math.log(float(hi_s))
            else:
                lo, hi = 0.0, float(spec)
            tok = stats[est]
            per_seq = None
            if opt.startswith("seq_sum"):
                per_seq = (tok * m).sum(-1)
            elif opt.startswith("seq_mean"):
                per_seq = _masked_mean(tok, m, -1)
            elif opt.startswith("seq_max"):
                mx = tok.masked_fill(~m.bool(), float("-inf")).max(-1).values
                per_seq = torch.where(mx == float("-inf"), torch.zeros_like(mx), mx)
            level = "token" if opt in TOKEN_LEVEL_ROLLOUT_RS_OPTIONS else "sequence"
            stat = tok if per_seq is None else per_seq.unsqueeze(-1).expand_as(m)
            metrics.update(compute_rs_metrics(opt, stat, m, seq_valid, level=level, per_sequence_values=per_seq,
                                              rollout_rs_threshold=hi, rollout_rs_threshold_lower=lo,
                                              apply_lower_threshold=est == "k1"))
            _, od = run(opt, spec)
            metrics[f"rollout_rs_{opt}_masked_fraction"] = od["rejected_token_fraction"]
            metrics[f"rollout_rs_{opt}_seq_masked_fraction"] = od["rejected_row_fraction"] * od["rows"] / max(
                float(seq_valid.sum()), 1.0) if seq_valid.any() else 0.0
    metrics["rollout_rs_masked_fraction"] = d["rejected_token_fraction"]
    metrics["rollout_rs_seq_masked_fraction"] = d["rejected_row_fraction"]
    return keep.to(response_mask.dtype), metrics


def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: Optional[Union[str, float]] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """verl's ``compute_rollout_rejection_mask``: ulorl's keep-mask of the chained options (every
    option must pass) applied to ``response_mask``, and verl's metrics (un-prefixed)."""
    if rollout_rs_threshold is None:
        raise ValueError("rollout_rs_threshold must be provided for rejection sampling.")
    if log_ratio.shape[0] == 0:
        return response_mask, {}
    return _rejection(log_ratio, torch.zeros_like(log_ratio), response_mask, rollout_rs, rollout_rs_threshold)


def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor,
    rollout_log_prob: Optional[torch.Tensor],
    response_mask: torch.Tensor,
) -> Dict[str, Any]:
    """verl's off-policy diagnostics (un-prefixed): training_ppl, training_log_ppl and, with
    ``rollout_log_prob``, kl, k3_kl, rollout_ppl, rollout_log_ppl, log_ppl_diff, log_ppl_abs_diff,
    log_ppl_diff_max / min, ppl_ratio, chi2_token, chi2_seq (ulorl's rollout-correction metrics)."""
    assert response_mask.any(), "Expected at least one valid token in response_mask"
    ro = old_log_prob if rollout_log_prob is None else rollout_log_prob
    cfg = _ulorl._verl_rollout_correction_config(None, None, False, None, None)
    _, _, rm = _rollout_correction(old_log_prob.detach(), ro.detach(), response_mask, cfg, None)
    d = rm.as_dict()
    keys = ["training_ppl", "training_log_ppl"]
    if rollout_log_prob is not None:
        keys += ["kl", "k3_kl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff", "log_ppl_abs_diff",
                 "log_ppl_diff_max", "log_ppl_diff_min", "ppl_ratio", "chi2_token", "chi2_seq"]
    return {k: d[k] for k in keys}


def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: Optional[str] = None,
    rollout_is_threshold: Optional[Union[str, float]] = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: Optional[str] = None,
    rollout_rs_threshold: Optional[Union[str, float]] = None,
) -> Tuple[Optional[Any], torch.Tensor, Dict[str, float]]:
    """verl's ``compute_rollout_correction_and_rejection_mask``: ``(weights_proto, modified_response_mask,
    metrics)``. weights_proto is a verl DataProto (a stand-in with ``.batch`` when verl is not
    imported) holding ``rollout_is_weights``, or None without importance sampling; the mask is
    ``response_mask`` times ulorl's rejection keep-mask, in its dtype; every metric (IS, rejection,
    off-policy) is ``rollout_corr/``-prefixed."""
    if not response_mask.any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    if old_log_prob.shape != rollout_log_prob.shape:
        raise ValueError(f"old_log_prob shape {old_log_prob.shape} does not match rollout_log_prob shape "
                         f"{rollout_log_prob.shape}.")
    if old_log_prob.shape != response_mask.shape:
        raise ValueError(f"log_prob shape {old_log_prob.shape} does not match response_mask shape "
                         f"{response_mask.shape}.")
    dt, out = _compute_dtype(old_log_prob, rollout_log_prob)
    old, ro = _as(old_log_prob.detach(), dt), _as(rollout_log_prob.detach(), dt)
    metrics: Dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        if isinstance(rollout_is_threshold, bool):
            raise TypeError("rollout_is_threshold must be specified as a float or a string threshold specification, "
                            "not a boolean.")
        if rollout_is not in ("token", "sequence"):
            raise ValueError(f"Invalid rollout_is: {rollout_is}. Must be one of {{'token', 'sequence'}}.")
        weights, is_metrics = _is_weights(old, ro, response_mask, rollout_is, rollout_is_threshold,
                                          rollout_is_batch_normalize)
        metrics.update(is_metrics)
    keep = response_mask.clone()
    if rollout_rs is not None:
        if rollout_rs_threshold is None:
            raise ValueError("rollout_rs_threshold must be explicitly provided when rollout_rs is enabled. "
                             "Set rollout_rs_threshold to the desired threshold value.")
        keep, rs_metrics = _rejection(old, ro, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old, ro, response_mask))
    prefixed = {f"rollout_corr/{k}": v for k, v in metrics.items()}
    return (None if weights is None else _proto(_as(weights, out))), keep, prefixed


def compute_rollout_corr_metrics_from_logprobs(
    log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
) -> Dict[str, float]:
    """verl's ``compute_rollout_corr_metrics_from_logprobs``: the off-policy diagnostics of the
    current policy against the rollout's, ``rollout_corr/``-prefixed."""
    return {f"rollout_corr/{k}": v for k, v in compute_offpolicy_metrics(log_prob, rollout_log_prob,
                                                                        response_mask).items()}


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
    """ulorl's shape of verl's rollout correction: ``(rollout_is_weights, modified_response_mask,
    metrics)`` with the weights a plain tensor (None without importance sampling) and the metrics
    ulorl computes under verl's names, un-prefixed: rollout_is_mean, rollout_is_eff_sample_size,
    rollout_is_batch_norm_factor (with batch normalisation), rollout_rs_masked_fraction,
    rollout_rs_seq_masked_fraction, kl, k3_kl, chi2_token, chi2_seq, training_ppl, training_log_ppl,
    rollout_ppl, rollout_log_ppl, log_ppl_diff, log_ppl_abs_diff, log_ppl_diff_max / min, ppl_ratio.
    Options as :func:`rollout_correction_config`; verl's full metric set:
    :func:`compute_rollout_correction_and_rejection_mask`."""
    cfg = rollout_correction_config(rollout_is=rollout_is, rollout_is_threshold=rollout_is_threshold,
                                    rollout_is_batch_normalize=rollout_is_batch_normalize, rollout_rs=rollout_rs,
                                    rollout_rs_threshold=rollout_rs_threshold)
    w, keep, m = _rollout_correction(old_log_prob, rollout_log_prob, response_mask, cfg, None)
    d = m.as_dict()
    out = {k: d[v] for k, v in _VERL_METRICS.items()}
    if not cfg.importance_weights:
        return None, keep, out
    out.update({k: d[v] for k, v in _VERL_IS_METRICS.items()})
    if cfg.batch_normalize:
        out["rollout_is_batch_norm_factor"] = d["batch_norm_factor"]
    return w, keep, out


# ---- install ---------------------------------------------------------------------------------------------------

#: The functions install() puts into verl, by module: verl's name -> this module's object.
_CORE_ALGOS = ["agg_loss", "kl_penalty", "compute_policy_loss_reinforce"] + \
    [f.__name__ for f in POLICY_LOSS_REGISTRY.values()] + [f.__name__ for f in ADV_ESTIMATOR_REGISTRY.values()]
_ROLLOUT_CORR = ["compute_rollout_correction_and_rejection_mask", "compute_rollout_correction_weights",
                 "compute_rollout_rejection_mask", "compute_is_metrics", "compute_rs_metrics",
                 "compute_offpolicy_metrics", "compute_rollout_corr_metrics_from_logprobs"]


def install() -> Dict[str, List[str]]:
    """Makes an importable verl compute with ulorl: registers this module's policy losses and
    advantage estimators in verl's ``POLICY_LOSS_REGISTRY`` / ``ADV_ESTIMATOR_REGISTRY`` under
    their names, and replaces verl's functions of the same names in ``core_algos``,
    ``rollout_corr_helper`` and in every loaded ``verl.*`` module that imported them. verl's other
    functions (the value loss, ...) stay verl's. Returns what was replaced,
    by module."""
    import importlib

    core = importlib.import_module("verl.trainer.ppo.core_algos")
    helper = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
    here = sys.modules[__name__]
    originals = {}
    for mod, names in ((core, _CORE_ALGOS), (helper, _ROLLOUT_CORR)):
        for name in names:
            if hasattr(mod, name):
                originals[id(getattr(mod, name))] = getattr(here, name)
    core.POLICY_LOSS_REGISTRY.update(POLICY_LOSS_REGISTRY)
    core.ADV_ESTIMATOR_REGISTRY.update(ADV_ESTIMATOR_REGISTRY)
    replaced: Dict[str, List[str]] = {}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == "verl" or mod_name.startswith("verl.")):
            continue
        for name, value in list(vars(mod).items()):
            if callable(value) and id(value) in originals and originals[id(value)].__name__ == name:
                setattr(mod, name, originals[id(value)])
                replaced.setdefault(mod_name, []).append(name)
    return replaced


_check_nan_options(globals(), "presets::verl::")
POLICY_LOSS_REGISTRY = {k: globals()[f.__name__] for k, f in POLICY_LOSS_REGISTRY.items()}
ADV_ESTIMATOR_REGISTRY = {k: globals()[f.__name__] for k, f in ADV_ESTIMATOR_REGISTRY.items()}
