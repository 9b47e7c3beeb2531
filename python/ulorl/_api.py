"""The tensor functions of the ulorl package: keyword arguments in, the C++ kernels of ulorl::th out.

Nothing here computes a formula: each function builds a configuration and calls the extension.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import _ulorl
from ._ulorl import AdvantagePreset, Error, Normalizer, PolicyLossConfig, RolloutCorrectionConfig

ArrayLike = Union[torch.Tensor, np.ndarray, Sequence[float]]


def _fail(function: str, argument: str, what: str) -> Error:
    """An ulorl.Error with the C++ message format and fields."""
    e = Error(f"ulorl::{function}: argument '{argument}': {what}")
    e.function, e.argument, e.index = function, argument, -1
    return e


def _reject_nan(function: str, argument: str, value: Any, index: int = -1) -> None:
    """A float argument (or a float in a list / tuple argument: its index is named) that is NaN raises
    ulorl.Error, whether or not the call uses it."""
    if isinstance(value, float) and math.isnan(value):
        where = f"'{argument}'" if index < 0 else f"'{argument}'[{index}]"
        e = Error(f"ulorl::{function}: argument {where} = nan: must not be NaN (checked even where the call does "
                  "not use it)")
        e.function, e.argument, e.index = function, argument, index
        raise e
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _reject_nan(function, argument, v, i if index < 0 else index)


def _nan_checked(function: str, f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` whose every float argument (keyword options included) is checked by _reject_nan first.
    The arguments are matched to names by position and keyword, without binding the signature per
    call (inspect's bind costs more than a small loss call); an argument f does not take is left to
    f's own TypeError."""
    params = inspect.signature(f).parameters.values()
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    var_positional = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    checked = (float, list, tuple)

    @functools.wraps(f)
    def call(*args: Any, **kwargs: Any) -> Any:
        for name, value in zip(positional, args):
            if isinstance(value, checked):
                _reject_nan(function, name, value)
        if var_positional is not None and len(args) > len(positional):
            _reject_nan(function, var_positional, args[len(positional):])
        for name, value in kwargs.items():
            if isinstance(value, checked) and (any_keyword or name in keywords):
                _reject_nan(function, name, value)
        return f(*args, **kwargs)

    return call


def _check_nan_options(module_globals: Dict[str, Any], prefix: str = "") -> None:
    """Wraps every public function defined in a module with _nan_checked (errors name ``prefix`` +
    the function): a NaN option is an error whether or not the call uses it."""
    for name, f in list(module_globals.items()):
        if not name.startswith("_") and inspect.isfunction(f) and f.__module__ == module_globals["__name__"]:
            module_globals[name] = _nan_checked(prefix + name, f)


def _cpp_defaults(options_type: type, exclude: Sequence[str] = ()) -> Dict[str, Any]:
    """Every option of a bound C++ options type (its settable attributes but ``exclude``) with its
    default, read from a default-made object: the C++ struct's defaults, the one place they live."""
    default = options_type()
    names = [n for n, v in vars(options_type).items() if isinstance(v, property) and v.fset is not None]
    return {n: getattr(default, n) for n in names if n not in exclude}


def _op_defaults(name: str) -> Dict[str, Any]:
    """The argument defaults of the operator ``torch.ops.ulorl.<name>`` as its schema (C++) states them."""
    schema = getattr(torch.ops.ulorl, name).default._schema
    return {a.name: a.default_value for a in schema.arguments if a.has_default_value()}


def _cpp_options(options_type: type, values: Dict[str, Any]) -> Any:
    """A bound C++ options object: its defaults, then ``values`` (option name -> value) set on it."""
    o = options_type()
    for name, value in values.items():
        setattr(o, name, value)
    return o


_POLICY_LOSS_OPTIONS = _cpp_defaults(PolicyLossConfig, exclude=("normalizer",))


def policy_loss_config(*, eps_high: Optional[float] = None, normalizer: Optional[Normalizer] = None,
                       **options: Any) -> PolicyLossConfig:
    """A :class:`PolicyLossConfig` (ulorl::policy_loss_config) from keyword arguments, each one of its
    attributes; an option not given keeps the C++ default (the signature shows them).

    objective: ``ppo_clip`` (clip-higher when eps_high > eps_low, dual clip c > 1, TRL's delta cap),
    ``gspo``, ``cispo``, ``gmpo``, ``sapo``, ``policy_gradient``, ``penalized_pg`` (with
    ``surrogate``, ``abs_penalty`` and ``square_penalty``), ``sequence_cispo`` or ``sequence_sapo``
    (cispo and sapo on the sequence ratio); eps_high defaults to eps_low.
    kl_estimator: ``k1``, ``abs``, ``k2``, ``k3`` with optional input / output clamps. The values are
    checked by the loss call (ulorl.Error naming the field).
    """
    c = PolicyLossConfig()
    for name, value in options.items():
        if name not in _POLICY_LOSS_OPTIONS:
            raise TypeError(f"policy_loss_config() got an unexpected keyword argument '{name}'")
        setattr(c, name, value)
    c.eps_high = c.eps_low if eps_high is None else eps_high
    if normalizer is not None:
        c.normalizer = normalizer
    return c


policy_loss_config.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None if n == "eps_high" else d)
     for n, d in _POLICY_LOSS_OPTIONS.items()]
    + [inspect.Parameter("normalizer", inspect.Parameter.KEYWORD_ONLY, default=None)],
    return_annotation=PolicyLossConfig)


def _host(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``t`` as the extension's host-side functions read it: itself on the CPU, else a CPU copy (those
    functions take no device tensors; count_batch's counts are read on the host in any case)."""
    return t if t is None or t.device.type == "cpu" else t.cpu()


def _count_batch(mask: Optional[torch.Tensor], offsets: Optional[torch.Tensor] = None,
                 tokens: Optional[torch.Tensor] = None) -> _ulorl.BatchCounts:
    """count_batch (``tokens``: their layout, that of a None mask and the mask's shape) of tensors on
    any device: a device mask and offsets are read from host copies, device tokens as a CPU scalar of
    their dtype expanded to their shape (count_batch reads their layout, no value: nothing is copied)."""
    if tokens is not None and tokens.device.type != "cpu":
        tokens = torch.zeros((), dtype=tokens.dtype).expand(tokens.shape)
    return _ulorl.count_batch(_host(mask), _host(offsets), tokens=tokens)


def _config(fn: str, config: Optional[PolicyLossConfig], options: Dict[str, Any], normalizer: Optional[Normalizer],
            agg_mode: str, agg_constant: float, mask: Optional[torch.Tensor], offsets: Optional[torch.Tensor],
            tokens: torch.Tensor) -> PolicyLossConfig:
    if config is not None:
        if options:
            raise _fail(fn, next(iter(options)), "give either config= or loss options, not both")
        cfg = config
        if normalizer is not None:
            cfg = copy.copy(config)  # never modify the caller's config
            cfg.normalizer = normalizer
        return cfg
    try:
        cfg = policy_loss_config(**options)
    except TypeError as e:
        raise TypeError(f"{fn}: {e}") from None
    if normalizer is not None:
        cfg.normalizer = normalizer
    else:
        # No step normaliser given: this call is the whole batch (its own counts; without a mask,
        # every token of the layout of `tokens`).
        counts = _count_batch(mask, offsets, tokens if mask is None else None)
        cfg.normalizer = _ulorl.global_normalizer(agg_mode, counts, agg_constant)
    return cfg


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    *,
    ref_log_prob: Optional[torch.Tensor] = None,
    entropy: Optional[torch.Tensor] = None,
    weights: Optional[torch.Tensor] = None,
    offsets: Optional[torch.Tensor] = None,
    normalizer: Optional[Normalizer] = None,
    agg_mode: str = "token_mean",
    agg_constant: float = 0.0,
    config: Optional[PolicyLossConfig] = None,
    rollout_log_prob: Optional[torch.Tensor] = None,
    rollout_correction: Optional[RolloutCorrectionConfig] = None,
    rollout_batch_norm_factor: Optional[float] = None,
    **options: Any,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """The fused policy loss of one micro-batch as an autograd function.

    Token tensors are ``[B, T]`` (any strides) or, with ``offsets`` ``[B+1]``, packed ``[total]``;
    float32 or float64. ``mask`` is bool, uint8 or any integer or floating dtype (checked to be 0/1), or None:
    every token valid (padded: all ``B x T``; packed: every token inside the offsets), the same
    bits as an all-ones mask. Gradients flow to ``log_prob`` and (entropy_coef != 0) ``entropy``;
    ``old_log_prob``, ``advantages``, ``ref_log_prob`` (needed when kl_coef != 0) and ``weights``
    (rollout-correction weights) are constants.

    Aggregation: ``normalizer`` is the step's global normaliser (:func:`global_normalizer` of the
    all-reduced :func:`count_batch` counts): with it the micro-batch losses and gradients sum exactly
    to the full batch's. Without it, the call normalises by its own mask's counts with ``agg_mode``
    (``token_mean``, ``seq_mean_token_sum``, ``seq_mean_token_mean``, ``seq_mean_token_sum_norm``,
    ``constant``; the last two divide by ``agg_constant``).

    ``options`` are :func:`policy_loss_config`'s (objective, eps_low, eps_high, kl_coef, ...);
    ``config`` passes a ready :class:`PolicyLossConfig` instead (the presets do).

    Returns ``(loss, metrics)``: the 0-dim loss (token dtype) and a dict of floats: loss, pg_loss,
    kl_loss, entropy_loss, clip fractions (clip_fraction, clip_low_fraction, clip_high_fraction,
    clip_region_fraction, dual_clip_fraction), approx_kl_k1, approx_kl_k1_clamped, approx_kl_k3,
    ratio_mean / min / max, kl_mean, entropy_mean and the counts behind them.

    Rollout correction inside the loss pass: ``rollout_correction`` (a :class:`RolloutCorrectionConfig`)
    with the engine's ``rollout_log_prob`` computes the weights and keep-mask of
    :func:`rollout_correction` row block by row block inside the pass (the same bits as that call
    followed by the loss on its outputs; ``weights`` must then be None). With rejection sampling the
    normaliser must count the kept tokens; with batch normalisation pass the whole batch's divisor as
    ``rollout_batch_norm_factor``. The metrics then hold ``rollout``: the correction's
    :class:`RolloutCorrectionStatistics` (add them over micro-batches, then
    :func:`rollout_correction_finalize`).
    """
    cfg = _config("policy_loss", config, options, normalizer, agg_mode, agg_constant, mask, offsets, log_prob)
    if rollout_correction is not None or rollout_batch_norm_factor is not None:
        if cfg is config:
            cfg = copy.copy(config)
        cfg.rollout = rollout_correction
        cfg.rollout_batch_norm_factor = rollout_batch_norm_factor
    loss, result = _policy_loss_result(log_prob, old_log_prob, advantages, mask, cfg, ref_log_prob, weights, entropy,
                                       offsets, rollout_log_prob)
    metrics = result.as_dict()
    if cfg.rollout is not None:
        metrics["rollout"] = result.rollout
    return loss, metrics


def _policy_loss_result(log_prob, old_log_prob, advantages, mask, cfg, ref_log_prob=None, weights=None, entropy=None,
                        offsets=None, rollout_log_prob=None):
    """(loss, PolicyLossResult) from the operator ulorl::policy_loss (called from C++ by th::policy_loss: no
    argument boxing); the presets map the result onto their frameworks' metrics."""
    return _ulorl._policy_loss(log_prob, old_log_prob, advantages, mask, cfg, ref_log_prob, weights, entropy, offsets,
                               rollout_log_prob)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, *,
                         check_values: bool = True, fast_backward: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-row log-prob of ``labels`` and entropy of ``softmax(logits / temperature)``, one pass.

    logits ``[N, V]`` float32, float64, bfloat16 or float16 (any strides, no copy); labels ``[N]``
    int64 or int32 (contiguous). Returns ``(log_prob, entropy)`` ``[N]`` in the logits' dtype (as
    ``torch.log_softmax``; 16-bit results are the float32 accumulation rounded once). Differentiable in ``logits`` (backward from the saved O(N) statistics).
    ``check_values`` rejects NaN / +inf logits and all -inf rows.
    """
    return _ulorl._logits_statistics_op(logits, labels, temperature, check_values, fast_backward)


def logits_statistics(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, *,
                      check_values: bool = True) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row statistics of ``z = logits / temperature`` in float64, detached (no autograd): the
    log-prob of ``labels``, the entropy and the log-sum-exp ``lse = log sum_j exp(z_j)`` (what the
    backward of :func:`logprobs_from_logits` reads). Same inputs as :func:`logprobs_from_logits`."""
    lp, ent, lse = _ulorl._logits_statistics(logits.detach(), labels, temperature, check_values)
    return lp, ent, lse


def policy_loss_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    *,
    temperature: float = 1.0,
    in_place: bool = False,
    check_values: bool = True,
    fast_backward: bool = False,
    ref_log_prob: Optional[torch.Tensor] = None,
    weights: Optional[torch.Tensor] = None,
    offsets: Optional[torch.Tensor] = None,
    normalizer: Optional[Normalizer] = None,
    agg_mode: str = "token_mean",
    agg_constant: float = 0.0,
    config: Optional[PolicyLossConfig] = None,
    **options: Any,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """The policy loss straight from logits ``[N, V]`` (row i = token i of the token layout, padded:
    b * T + t). ``d loss / d logits`` is computed in the forward pass: into a new ``[N, V]`` tensor, or
    with ``in_place`` into the logits' own memory (their values are gone after the call).
    Token-level objectives only (not gspo, gmpo or the sequence_* ones). Arguments (``mask`` None:
    every token of ``old_log_prob``'s layout valid) and the returned metrics as :func:`policy_loss`, plus
    ``metrics['log_prob']`` and ``metrics['entropy']`` (detached tensors in the token layout;
    entropy only with an entropy term).
    """
    cfg = _config("policy_loss_from_logits", config, options, normalizer, agg_mode, agg_constant, mask, offsets,
                  old_log_prob)
    loss, result, lp, ent = _ulorl._policy_loss_from_logits(logits, labels, old_log_prob, advantages, mask, cfg,
                                                            ref_log_prob, weights, offsets, temperature, check_values,
                                                            fast_backward, in_place)
    metrics: Dict[str, Any] = result.as_dict()
    metrics["log_prob"], metrics["entropy"] = lp, ent
    return loss, metrics


# The fused linear head's keyword defaults: its operator's schema, written from linear_head_config.
_HEAD = _op_defaults("linear_head_policy_loss")


def linear_head_policy_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    labels: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    *,
    temperature: float = _HEAD["temperature"],
    chunk_rows: int = _HEAD["chunk_rows"],
    workspace_budget: int = _HEAD["workspace_budget"],
    check_values: bool = _HEAD["check_values"],
    fast_backward: bool = _HEAD["fast_backward"],
    ref_log_prob: Optional[torch.Tensor] = None,
    weights: Optional[torch.Tensor] = None,
    offsets: Optional[torch.Tensor] = None,
    normalizer: Optional[Normalizer] = None,
    agg_mode: str = "token_mean",
    agg_constant: float = 0.0,
    config: Optional[PolicyLossConfig] = None,
    **options: Any,
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """The policy loss straight from hidden states ``[N, H]``, the unembedding ``weight`` ``[V, H]``
    (nn.Linear's layout) and ``bias`` ``[V]`` or None, in chunks of ``chunk_rows`` rows (0: sized
    from ``workspace_budget`` bytes): never holds the ``[N, V]`` logits; the GEMMs run in torch's
    BLAS. Gradients for whichever of hidden, weight, bias require grad. Other arguments (``mask``
    None: every token valid) and the returned metrics as :func:`policy_loss_from_logits`.
    """
    cfg = _config("linear_head_policy_loss", config, options, normalizer, agg_mode, agg_constant, mask, offsets,
                  old_log_prob)
    if chunk_rows < 0:
        raise _fail("linear_head_policy_loss", "chunk_rows", f"= {chunk_rows}: must be >= 0")
    if workspace_budget < 1:
        raise _fail("linear_head_policy_loss", "workspace_budget", f"= {workspace_budget}: must be >= 1")
    loss, result, lp, ent = _ulorl._linear_head_policy_loss(hidden, weight, bias, labels, old_log_prob, advantages,
                                                            mask, cfg, ref_log_prob, weights, offsets, temperature,
                                                            chunk_rows, workspace_budget, check_values, fast_backward)
    metrics: Dict[str, Any] = result.as_dict()
    metrics["log_prob"], metrics["entropy"] = lp, ent
    return loss, metrics


# ---- advantages ------------------------------------------------------------------------------------

_DEFAULT_ESTIMATOR = {"verl": "grpo", "trl": "grpo", "openrlhf": "group_norm", "nemo_rl": "grpo",
                      "open_instruct": "standard"}


def advantage_preset(
    preset: str = "verl",
    *,
    estimator: Optional[str] = None,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
    scale_rewards: str = "group",
    use_leave_one_out_baseline: bool = True,
    normalize_rewards: bool = True,
    baseline: str = "group_mean",
    scale: str = "group_std",
    std: str = "unbiased",
    eps: float = 1e-6,
    eps_at: str = "add_to_std",
    singleton: str = "zero",
    zero_std: str = "divide",
    placement: str = "masked",
    allow_empty_rows: bool = False,
) -> AdvantagePreset:
    """A framework's advantage semantics (ulorl/presets/<framework>.hpp), by the framework's names:

    * ``verl``: estimator ``grpo`` (epsilon, norm_adv_by_std = False is Dr. GRPO) or ``rloo``;
    * ``trl``: scale_rewards ``group`` / ``batch`` / ``none``;
    * ``openrlhf``: estimator ``group_norm``, ``rloo`` or ``dr_grpo``;
    * ``nemo_rl``: use_leave_one_out_baseline, normalize_rewards;
    * ``open_instruct``: estimator ``standard`` or ``centered``;
    * ``custom``: every knob of ulorl::group_advantage_config and broadcast_config (baseline, scale,
      std, eps, eps_at, singleton, zero_std, placement, allow_empty_rows).
    """
    if preset == "custom":
        return _ulorl._custom_advantage(baseline, scale, std, eps, eps_at, singleton, zero_std, placement,
                                        allow_empty_rows)
    est = estimator if estimator is not None else _DEFAULT_ESTIMATOR.get(preset, "")
    return _ulorl._advantage_preset(preset, est, epsilon, norm_adv_by_std, scale_rewards, use_leave_one_out_baseline,
                                    normalize_rewards)


def _device_of(*xs: Any) -> Optional[torch.device]:
    """The device of the first tensor among ``xs`` (None if there is none): where a call puts its
    numpy arrays and sequences, so that every tensor of the operator call is on one device."""
    return next((x.device for x in xs if isinstance(x, torch.Tensor)), None)


def _as_tensor(x: ArrayLike, dtype: Optional[torch.dtype],
               device: Optional[torch.device] = None) -> Tuple[torch.Tensor, bool]:
    """A tensor as given, or a numpy array / sequence as a tensor on ``device`` (None: the CPU); and
    whether ``x`` was a numpy array."""
    if isinstance(x, torch.Tensor):
        return x, False
    if isinstance(x, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(x))
        return (t if device is None else t.to(device)), True
    return torch.as_tensor(x, dtype=dtype, device=device), False


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A result as the numpy array a numpy input gets back (from the device if a tensor argument put it there)."""
    return t.cpu().numpy()


def group_advantages(
    rewards: ArrayLike,
    group_ids: Optional[ArrayLike] = None,
    preset: Union[str, AdvantagePreset] = "verl",
    *,
    group_size: Optional[int] = None,
    **preset_options: Any,
) -> Union[torch.Tensor, np.ndarray]:
    """GRPO-family advantages ``[B]`` of per-response ``rewards`` ``[B]`` (float32 / float64).

    Groups: ``group_ids`` ``[B]`` (int64 / int32, any ids, any order) or ``group_size`` (contiguous
    groups: TRL num_generations, OpenRLHF n_samples_per_prompt). ``preset`` is a name with
    :func:`advantage_preset`'s options, or an :class:`AdvantagePreset`. Tensors or numpy arrays in;
    the same kind out (numpy in, numpy out).
    """
    p = preset if isinstance(preset, AdvantagePreset) else advantage_preset(preset, **preset_options)
    device = _device_of(rewards, group_ids)
    r, was_numpy = _as_tensor(rewards, torch.float64, device)
    ids = None
    if group_ids is not None:
        ids, _ = _as_tensor(group_ids, torch.int64, device)
    out = _ulorl._group_advantages(r, ids, group_size, p)
    return _numpy(out) if was_numpy else out


def broadcast_to_tokens(
    advantages: ArrayLike,
    mask: Optional[ArrayLike] = None,
    preset: Union[str, AdvantagePreset] = "verl",
    *,
    offsets: Optional[torch.Tensor] = None,
    **preset_options: Any,
) -> Union[torch.Tensor, np.ndarray]:
    """Per-token advantages in the mask's shape from per-response ``advantages`` ``[B]``, placed as the
    preset's framework does (masked; OpenRLHF through the last valid token; NeMo-RL every position).
    ``mask`` None needs ``offsets`` (packed): every token inside them valid, the result ``[total]``;
    the padded layout takes its ``[B, T]`` shape from the mask."""
    p = preset if isinstance(preset, AdvantagePreset) else advantage_preset(preset, **preset_options)
    device = _device_of(advantages, mask, offsets)
    a, was_numpy = _as_tensor(advantages, torch.float64, device)
    m = None if mask is None else _as_tensor(mask, None, device)[0]
    out = _ulorl._broadcast_to_tokens(a, m, p, offsets)
    return _numpy(out) if was_numpy else out


def dynamic_sampling_filter(
    metric: ArrayLike,
    group_ids: ArrayLike,
    *,
    drop_zero_variance: bool = True,
    min_accuracy: float = 0.0,
    max_accuracy: float = 1.0,
    use_window: bool = False,
) -> Tuple[Union[torch.Tensor, np.ndarray], Dict[str, int]]:
    """DAPO's dynamic sampling: keep ``[B]`` (bool) is True for responses of groups whose ``metric``
    values are not all equal (and, with ``use_window``, whose mean lies in [min_accuracy,
    max_accuracy]). Returns ``(keep, counts)``."""
    device = _device_of(metric, group_ids)
    m, was_numpy = _as_tensor(metric, torch.float64, device)
    ids, _ = _as_tensor(group_ids, torch.int64, device)
    keep, stats = _ulorl._dynamic_sampling_filter(m, ids, drop_zero_variance, min_accuracy, max_accuracy, use_window)
    return (_numpy(keep) if was_numpy else keep), stats


def overlong_penalty(
    lengths: ArrayLike,
    preset: str = "dapo",
    *,
    max_length: float,
    buffer_length: Optional[float] = None,
    penalty_factor: float = 1.0,
    cache_length: Optional[float] = None,
) -> Union[torch.Tensor, np.ndarray]:
    """Reward shaping of long responses, float64 penalties (<= 0) to add to the scores.

    * ``dapo`` (DAPO / verl): ``min(-(L - (max_length - buffer_length)) / buffer_length *
      penalty_factor, 0)``;
    * ``trl`` (TRL's soft overlong punishment): 0 up to max_length - cache_length, linear to -1
      at max_length, -1 beyond.

    Tensors in give a float64 tensor; numpy arrays or sequences give a numpy array.
    """
    is_tensor = isinstance(lengths, torch.Tensor)
    t = lengths.detach().cpu() if is_tensor else torch.as_tensor(np.asarray(lengths, dtype=np.float64))
    if t.dtype not in (torch.int64, torch.int32, torch.float32, torch.float64):
        t = t.double()
    t = t.contiguous()
    if preset == "dapo":
        if buffer_length is None:
            raise _fail("overlong_penalty", "buffer_length", "required for preset 'dapo'")
        out = _ulorl._dapo_overlong_penalties(t, max_length, buffer_length, penalty_factor)
    elif preset == "trl":
        if cache_length is None:
            raise _fail("overlong_penalty", "cache_length", "required for preset 'trl'")
        out = _ulorl._soft_overlong_penalties(t, max_length, cache_length)
    else:
        raise _fail("overlong_penalty", "preset", f"unknown name '{preset}' (expected 'dapo' or 'trl')")
    return out.to(lengths.device) if is_tensor else out.numpy()


def mpt_mask(
    entropy: torch.Tensor,
    response_score: torch.Tensor,
    *,
    log_prob: Optional[torch.Tensor] = None,
    old_log_prob: Optional[torch.Tensor] = None,
    mask: Optional[torch.Tensor] = None,
    offsets: Optional[torch.Tensor] = None,
    mode: str = "dynamic",
    tau: float = 0.99,
    sigma: float = 0.2,
    positive: str = "reward",
    positive_reward: float = 1.0,
    probability: str = "current",
    scope: str = "response",
) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """UloRL's mask of well-mastered positive tokens (MPT): keep = 0 for tokens of positive responses
    (reward >= positive_reward, or advantage > 0 with positive='advantage') whose probability is
    >= tau, in ``dynamic`` mode only while the mean entropy (per response, or of the batch) is below
    sigma. The probability is the current policy's (``log_prob``) or the rollout's (``old_log_prob``,
    probability='rollout'). Returns ``(keep, stats)``, keep in the mask's dtype (bool without a mask).
    """
    return _ulorl._mpt_mask(log_prob, old_log_prob, entropy, mask, response_score, offsets, mode, tau, sigma, positive,
                            positive_reward, probability, scope)


# ---- values computed with their gradient ------------------------------------------------------------

class _DifferentiatedTwice(torch.autograd.Function):
    """What differentiating a gradient of ulorl's functions reaches: raises ulorl.Error naming the
    function. The kernels compute their gradients without a graph, so a second derivative would
    otherwise be a silent zero (torch's once_differentiable rule: the error comes at the second
    differentiation, not at create_graph=True)."""

    @staticmethod
    def forward(ctx, grad, function):  # noqa: D401
        ctx.function = function
        return grad.view_as(grad)

    @staticmethod
    def backward(ctx, g):
        raise _fail(ctx.function, "grad",
                    "is differentiable once: the kernel computes this gradient without an autograd graph, so its "
                    "derivative (double backward: a gradient taken with create_graph=True, then differentiated) is "
                    "not available")


def _once_differentiable(function: str, grad: torch.Tensor) -> torch.Tensor:
    """A gradient returned by a backward: as it is, or under create_graph=True (grad mode on) an
    alias whose differentiation raises (_DifferentiatedTwice)."""
    if not torch.is_grad_enabled():
        return grad
    return _DifferentiatedTwice.apply(grad.detach().requires_grad_(True), function)


class _ValueWithGradient(torch.autograd.Function):
    """A value the C++ kernel returned together with its exact gradient with respect to ``x``:
    backward scales that gradient by the incoming one (a 0-dim value: any gradient shape; an
    element-wise value: the gradient of each element with respect to its own input). Differentiable
    once: differentiating that gradient raises ulorl.Error naming ``function``."""

    @staticmethod
    def forward(ctx, x, value, grad, function):  # noqa: D401
        ctx.save_for_backward(grad)
        ctx.function = function
        return value.clone()

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        with torch.no_grad():
            dx = g * grad
        return _once_differentiable(ctx.function, dx), None, None, None


def _with_gradient(x: torch.Tensor, value: Union[float, torch.Tensor], grad: torch.Tensor,
                   function: str) -> torch.Tensor:
    v = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=grad.dtype, device=grad.device)
    return _ValueWithGradient.apply(x, v, grad, function)


def _tensor(x: Optional[ArrayLike], dtype: Optional[torch.dtype],
            device: Optional[torch.device] = None) -> Optional[torch.Tensor]:
    return None if x is None else _as_tensor(x, dtype, device)[0]


# ---- rollout correction -------------------------------------------------------------------------------

def rollout_correction_config(
    *,
    level: str = "token",
    weighting: str = "truncate",
    lower: float = 0.0,
    upper: float = 2.0,
    log_ratio_clamp: float = 20.0,
    overflow: str = "infinity",
    masked: str = "zero",
    empty_rows: str = "drop",
    batch_normalize: bool = False,
    rejection: Sequence[Tuple[str, str, float, float]] = (),
    rejection_log_ratio_clamp: float = 20.0,
    diagnostic_log_ratio_clamp: float = 20.0,
    reject_empty_batch: bool = False,
    require_effective_sample_size: bool = False,
) -> RolloutCorrectionConfig:
    """A :class:`RolloutCorrectionConfig` (ulorl::rollout_correction::config) from its fields.

    Importance weights of ``x = old_log_prob - rollout_log_prob``: ``level`` ``none`` / ``token`` /
    ``sequence``; ``weighting`` ``truncate`` (``tis``), ``mask`` (``icepop``) or ``geometric_gate``
    (``seq-mask-tis``) with bounds ``lower`` / ``upper`` (``math.inf``: none); the log-ratio clamp,
    what an overflowing ratio becomes (``infinity``, ``zero``, ``nan_when_masked``), the value at
    masked positions (``zero``, ``neutral``, ``as_valid``), the gate of empty rows (``drop``,
    ``ratio_one``) and batch normalisation. ``rejection``: the rejection-sampling chain, tuples
    ``(statistic, estimator, lower, upper)`` with statistic ``token`` / ``seq_sum`` / ``seq_mean`` /
    ``seq_max`` and estimator ``k1`` / ``k2`` / ``k3``. Validated here (ulorl.Error naming the field).
    """
    return _ulorl._rollout_correction_config(level, weighting, lower, upper, log_ratio_clamp, overflow, masked,
                                             empty_rows, batch_normalize, list(rejection), rejection_log_ratio_clamp,
                                             diagnostic_log_ratio_clamp, reject_empty_batch,
                                             require_effective_sample_size)


def rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    mask: Optional[torch.Tensor] = None,
    *,
    config: Optional[RolloutCorrectionConfig] = None,
    offsets: Optional[torch.Tensor] = None,
    **options: Any,
) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, float]]:
    """The training-vs-rollout mismatch correction of a batch (ulorl/loss/rollout_correction.hpp).

    ``old_log_prob`` is the trainer's log-prob of each sampled token, ``rollout_log_prob`` the
    inference engine's; ``[B, T]`` or packed with ``offsets``; float32 / float64; ``mask`` bool,
    uint8 or the log-probs' dtype (None: every token valid). ``config`` is a
    :class:`RolloutCorrectionConfig` (a preset's, or :func:`rollout_correction_config`'s, whose
    keyword arguments ``options`` may be given instead).

    Returns ``(weights, keep, metrics)``: the detached importance weights at every position (1 at
    level ``none``; pass them as ``weights=`` of :func:`policy_loss`), the keep-mask ``mask * keep``
    of rejection sampling in the mask's dtype (pass it as the loss's mask), and the diagnostics
    (weight_mean, effective_sample_size, batch_norm_factor, unit_weight_min / mean / max,
    out-of-bounds and rejected fractions, kl, k3_kl, chi2_token, chi2_seq, perplexities, ...).
    """
    if config is not None and options:
        raise _fail("rollout_correction", next(iter(options)), "give either config= or configuration options, not both")
    if config is None:
        try:
            config = rollout_correction_config(**options)
        except TypeError as e:
            raise TypeError(f"rollout_correction: {e}") from None
    w, keep, m = _ulorl._rollout_correction(old_log_prob, rollout_log_prob, mask, config, offsets)
    return w, keep, m.as_dict()


# ---- advantage estimators beyond group statistics ----------------------------------------------------

def gpg_advantages(scores: ArrayLike, group_ids: Optional[ArrayLike] = None, *, group_size: Optional[int] = None,
                   f_norm: float = 1.0) -> torch.Tensor:
    """GPG advantages ``[B]`` (verl ``gpg``): ``alpha (s - mu_g) / f_norm`` with ``alpha = B / #{s != 0}``
    (group mean 0 for a singleton). Groups by ``group_ids`` or contiguous ``group_size``."""
    device = _device_of(scores, group_ids)
    return _ulorl._gpg_advantages(_tensor(scores, torch.float64, device), _tensor(group_ids, torch.int64, device),
                                  group_size, f_norm)


def opo_advantages(scores: ArrayLike, mask: torch.Tensor, group_ids: Optional[ArrayLike] = None, *,
                   group_size: Optional[int] = None, offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """OPO advantages ``[B]`` (verl ``opo``): ``s - b_g`` with the length-weighted group baseline, the
    lengths being each row's valid tokens in ``mask``."""
    device = _device_of(scores, mask, group_ids)
    return _ulorl._opo_advantages(_tensor(scores, torch.float64, device), mask, _tensor(group_ids, torch.int64, device),
                                  group_size, offsets)


def reinforce_plus_plus_advantages(token_level_rewards: torch.Tensor, mask: Optional[torch.Tensor] = None, *,
                            gamma: float = 1.0, offsets: Optional[torch.Tensor] = None,
                            scan: str = "reset_after_eos") -> Tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted returns, whitened over the batch's valid tokens. ``scan``:
    ``"reset_after_eos"`` (a masked position takes its reward and restarts the running return: verl
    b178a3cd) or ``"skip_masked"`` (a masked position gets 0 and carries the return through,
    verl 1dda039b's multi-turn scan; ``ulorl.presets.verl`` uses it). Returns ``(advantages,
    returns)`` in the rewards' shape."""
    adv, ret = _ulorl._reinforce_plus_plus_advantages(token_level_rewards, mask, gamma, offsets, scan)
    return adv, ret


def reinforce_plus_plus_baseline_advantages(scores: ArrayLike, mask: torch.Tensor, group_ids: Optional[ArrayLike] = None, *,
                                     group_size: Optional[int] = None, preset: str = "verl",
                                     minus_baseline: bool = True,
                                     offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """REINFORCE++ with a group baseline, whitened over the batch, in the mask's shape: preset
    ``verl`` (``reinforce_plus_plus_baseline``: unbiased variance + 1e-8, masked) or ``nemo_rl``
    (``ReinforcePlusPlusAdvantageEstimator``: ``minus_baseline``, biased variance floored at 1e-8,
    every position)."""
    device = _device_of(scores, mask, group_ids)
    return _ulorl._reinforce_plus_plus_baseline_advantages(_tensor(scores, torch.float64, device),
                                                           _tensor(group_ids, torch.int64, device), group_size, mask,
                                                           preset, minus_baseline, offsets)


def gae_advantages(token_level_rewards: torch.Tensor, values: torch.Tensor, mask: Optional[torch.Tensor] = None, *,
                   gamma: float = 1.0, lam: float = 1.0,
                   offsets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """GAE (verl ``gae``): ``delta = r_t + gamma V_next - V_t``, ``A_t = delta + gamma lam A_next`` scanned
    backwards over the valid tokens (a masked position, e.g. a tool observation, carries the value
    and the running advantage through); ``returns = A + values`` and the advantages whitened over the
    valid tokens (unbiased, eps 1e-8, every position written). Returns ``(advantages, returns)``."""
    adv, ret = _ulorl._gae_advantages(token_level_rewards, values, mask, gamma, lam, offsets)
    return adv, ret


def remax_advantages(token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor,
                     mask: Optional[torch.Tensor] = None, *,
                     offsets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """ReMax (verl ``remax``): ``returns`` the reverse cumulative sum of the masked rewards,
    ``advantages = returns - reward_baselines[:, None] * mask``. Returns ``(advantages, returns)``."""
    adv, ret = _ulorl._remax_advantages(token_level_rewards, reward_baselines, mask, offsets)
    return adv, ret


def pass_at_k_advantages(scores: ArrayLike, group_ids: Optional[ArrayLike] = None, *, group_size: Optional[int] = None,
                         epsilon: float = 1e-6, scale_by_std: bool = True) -> torch.Tensor:
    """Pass@k advantages ``[B]`` (verl ``grpo_passk``): each group's best response gets
    ``(s_max - s_second) / (std_g + epsilon)`` (unbiased std; the bare gap without ``scale_by_std``),
    every other response 0; a group of one is an error. Place them with ``broadcast_to_tokens``."""
    device = _device_of(scores, group_ids)
    return _ulorl._pass_at_k_advantages(_tensor(scores, torch.float64, device), _tensor(group_ids, torch.int64, device),
                                        group_size, epsilon, scale_by_std)


def multi_reward_advantages(
    reward_components: torch.Tensor,
    mask: torch.Tensor,
    group_ids: Optional[ArrayLike] = None,
    *,
    group_size: Optional[int] = None,
    preset: str = "verl",
    reward_weights: Optional[Sequence[float]] = None,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
    use_leave_one_out_baseline: bool = True,
    normalize_rewards: bool = True,
    scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
    offsets: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Advantages from several reward functions, ``reward_components`` ``[B, K]``, in the mask's shape:

    * ``verl`` GDPO: each component's GRPO advantage (epsilon, norm_adv_by_std), weighted sum, whitened
      over the valid tokens;
    * ``nemo_rl`` GDPO: each component's NeMo-RL GRPO advantage (use_leave_one_out_baseline,
      normalize_rewards), weighted sum normalised over the batch, at every position (K >= 2);
    * ``trl``: ``multi_objective_aggregation`` ``sum_then_normalize`` (TRL's advantage of the weighted
      sum, scale_rewards) or ``normalize_then_sum`` (GDPO).

    ``reward_weights``: K numbers (None: all 1). Groups by ``group_ids`` or contiguous ``group_size``.
    """
    ids = _tensor(group_ids, torch.int64, _device_of(reward_components, mask))
    return _ulorl._multi_reward_advantages(reward_components, list(reward_weights or []), ids, group_size, mask, preset,
                                           epsilon, norm_adv_by_std, use_leave_one_out_baseline, normalize_rewards,
                                           scale_rewards, multi_objective_aggregation, offsets)


def optimal_token_baseline_advantages(
    token_level_rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: ArrayLike,
    *,
    old_log_prob: Optional[torch.Tensor],
    sum_pi_squared: Optional[torch.Tensor],
    rollout_is_weights: Optional[torch.Tensor] = None,
    estimator: str = "optimal_token_baseline",
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    offsets: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl's optimal token baseline (``optimal_token_baseline``: one baseline per position of a
    group; ``tir_optimal_token_baseline``: per j-th valid token). ``old_log_prob`` and
    ``sum_pi_squared`` (sum over the vocabulary of pi_old^2) are required; ``rollout_is_weights``
    optional. Returns ``(advantages, returns)``."""
    ids = _tensor(group_ids, torch.int64, _device_of(token_level_rewards, mask))
    adv, ret = _ulorl._optimal_token_baseline_advantages(token_level_rewards, mask, ids,
                                                         old_log_prob, sum_pi_squared, rollout_is_weights,
                                                         handle_zero_tail, epsilon, estimator, offsets)
    return adv, ret


# ---- aggregation, KL penalty, off-policy mask ---------------------------------------------------------

def agg_loss(loss_mat: torch.Tensor, mask: Optional[torch.Tensor] = None, *, normalizer: Optional[Normalizer] = None,
             agg_mode: str = "token_mean", agg_constant: float = 0.0,
             offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``scale * sum_b sum_t L m / D_b`` of a per-token loss (ulorl::agg_loss) as a 0-dim tensor with
    autograd to ``loss_mat``. ``mask`` None: every token valid. ``normalizer``: the step's
    (:func:`global_normalizer`); without it this call's counts (of the mask, or of every token of
    ``loss_mat``'s layout) with ``agg_mode``."""
    if normalizer is None:
        normalizer = _ulorl.global_normalizer(agg_mode, _count_batch(mask, offsets, loss_mat.detach()), agg_constant)
    return _agg_loss(loss_mat, mask, normalizer, offsets)


def _agg_loss(loss_mat: torch.Tensor, mask: Optional[torch.Tensor], normalizer: Normalizer,
              offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The ``ulorl::agg_loss`` operator with ``normalizer`` (differentiable in ``loss_mat``, once),
    called through th::agg_loss so that its errors are ulorl.Error with every torch build."""
    return _ulorl._agg_loss(loss_mat, mask, normalizer, offsets)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str, *, preset: str = "verl",
               input_clamp: Optional[float] = None, output_clamp: Optional[float] = None,
               offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The element-wise KL estimate of ``log_prob`` against ``ref_log_prob`` (ulorl::kl_penalty), with
    autograd to ``log_prob`` and ``ref_log_prob`` (minus the former's: every estimator is a function of
    ``ref_log_prob - log_prob``). ``estimator`` in the preset's names: ``verl`` (kl / k1, abs, mse / k2,
    low_var_kl / k3, with "+" for the straight-through k2 gradient), ``openrlhf`` (k1, k2, k3, output
    clamped to +-10), ``nemo_rl`` (k1, k2, k3 with ``input_clamp`` / ``output_clamp``)."""
    return _kl_penalty(log_prob, ref_log_prob, preset, estimator, input_clamp, output_clamp, offsets)


def _kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, preset: str, name: str,
                input_clamp: Optional[float] = None, output_clamp: Optional[float] = None,
                offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The ``ulorl::kl_penalty`` operator with a preset's estimator (differentiable once, in ``log_prob``
    and ``ref_log_prob``), called through th::kl_penalty (errors: ulorl.Error)."""
    return _ulorl._kl_penalty(log_prob, ref_log_prob, preset, name, input_clamp, output_clamp, offsets)


def off_policy_mask(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                    mask: Optional[torch.Tensor] = None, *, delta: float, preset: str = "trl", form: str = "factor",
                    offsets: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, Any]]:
    """DeepSeek-V3.2 off-policy sequence masking (ulorl/masking/off_policy.hpp): a row whose mean
    ``old_log_prob - log_prob`` exceeds ``delta`` drops its negative-advantage tokens. ``trl``
    (``off_policy_mask_threshold``): ``advantages`` ``[B]``, whole rows; ``slime`` (``--use-opsm``):
    per-token ``advantages``. ``form`` ``factor`` (1 - drop at every position) or ``loss_mask``
    (``mask * (1 - drop)``). Returns ``(keep, seq_kl [B] float64, stats)`` with slime's
    ``opsm_clipfrac`` among the stats."""
    keep, seq_kl, stats = _ulorl._off_policy_mask(log_prob.detach(), old_log_prob, advantages, mask, preset, delta,
                                                  form, offsets)
    return keep, seq_kl, stats


_check_nan_options(globals())
