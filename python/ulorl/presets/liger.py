"""Liger-Kernel's fused linear GRPO loss (``liger_kernel.chunked_loss``) with Liger's names and call forms.

:class:`LigerFusedLinearGRPOLoss` (Liger's constructor arguments and defaults, its positional
``forward``), :class:`LigerFusedLinearGRPOFunction` (its ``apply`` with the positional order of
Liger's autograd function) and :func:`liger_fused_linear_grpo` (Liger's functional alias). Each call
returns ``(loss, metrics)``: the 0-dim float32 loss with autograd to ``_input``, ``weight`` and
``bias``, and the tuple of 0-dim float32 metrics ``(kl, clip_ratio)`` (``kl`` only when beta != 0).

The hidden states ``_input [B, T, H]`` go through ulorl's chunked fused linear head
(:func:`ulorl.linear_head_policy_loss`): the ``[B*T, V]`` logits are never held and the loss and its
gradients come from one pass. Loss types ``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``cispo`` and
``sapo`` (token level; the first four also at sequence level, GSPO) are one fused call. ``luspo`` and
``vespo`` are TRL's loss types (:func:`ulorl.presets.trl.grpo_loss`) applied to log-probs that the fused
head computes and differentiates (its forward pass, then its backward pass with the incoming
gradient). The mapping of Liger's arguments to the loss (objective, KL, normaliser, the cispo cap's
adjustments) and Liger's checks are the C++ preset's (ulorl/presets/liger.hpp).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from .. import _ulorl
from .._api import _check_nan_options, _cpp_defaults, _cpp_options, _fail, linear_head_policy_loss
from . import _common
from . import trl as _trl

_FN = "presets::liger::LigerFusedLinearGRPOFunction"
# Liger's defaults (TRL's where Liger takes them), as the C++ preset holds them
# (presets::liger::fused_linear_grpo_options): the keyword defaults below read them.
_LIGER = _cpp_defaults(_ulorl.LigerFusedLinearGRPOOptions)
_HEAD_DTYPES = (torch.float32, torch.float64)


def _head_operands(hidden: torch.Tensor, weight: torch.Tensor,
                   bias: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Hidden ``[N, H]``, weight and bias in the head's dtype: float32 / float64 as given, bfloat16 and
    float16 computed in float32 (autograd returns the gradients in the callers' dtypes)."""
    dtype = hidden.dtype if hidden.dtype in _HEAD_DTYPES else torch.float32
    h = hidden.reshape(-1, hidden.shape[-1]).to(dtype)
    return h, weight.to(dtype), None if bias is None else bias.to(dtype)


def _head_log_prob(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], labels: torch.Tensor,
                   temperature: float) -> torch.Tensor:
    """The detached log-prob ``[N]`` of ``labels`` under ``softmax((hidden W^T + bias) / temperature)``
    (the fused head's forward pass: no gradient is formed)."""
    h, w, b = _head_operands(hidden.detach(), weight.detach(), None if bias is None else bias.detach())
    zeros = torch.zeros(labels.shape[0], 1, dtype=torch.float32, device=labels.device)
    _, m = linear_head_policy_loss(h, w, b, labels, zeros, zeros, None, temperature=temperature,
                                   objective="policy_gradient", normalizer=_ulorl.Normalizer("constant", 1.0))
    return m["log_prob"].reshape(-1)


class _HeadLogProb(torch.autograd.Function):
    """Differentiable log-probs from the fused head: forward is the head's forward pass; backward
    runs the head's fused backward with the incoming gradient ``g`` (the loss ``sum g * logp`` of the
    ``policy_gradient`` objective with advantages ``-g``), never holding the logits."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature):  # noqa: D401
        ctx.save_for_backward(hidden, weight, bias, labels)
        ctx.temperature = temperature
        return _head_log_prob(hidden, weight, bias, labels, temperature)

    @staticmethod
    def backward(ctx, g):
        hidden, weight, bias, labels = ctx.saved_tensors
        wanted = [t is not None and need for t, need in zip((hidden, weight, bias), ctx.needs_input_grad[:3])]
        with torch.enable_grad():
            h, w, b = (None if t is None else t.detach().requires_grad_(need)
                       for t, need in zip((hidden, weight, bias), wanted))
            g1 = g.detach().reshape(-1, 1).to(torch.float32)
            loss, _ = linear_head_policy_loss(h, w, b, labels, torch.zeros_like(g1), -g1, None,
                                              temperature=ctx.temperature, objective="policy_gradient",
                                              normalizer=_ulorl.Normalizer("constant", 1.0))
            targets = [t for t, need in zip((h, w, b), wanted) if need]
            grads = iter(torch.autograd.grad(loss, targets) if targets else [])
        return tuple(next(grads) if need else None for need in wanted) + (None, None)


def _num_items(tokens: float, num_items_in_batch: Any, device: torch.device) -> Tuple[float, int]:
    """The count Liger's dapo / cispo / vespo divide by the world size, and the world size:
    ``num_items_in_batch``, else this batch's valid tokens summed over the process group."""
    world = 1
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
    if num_items_in_batch is not None:
        return float(num_items_in_batch), world
    n = tokens
    if world > 1:
        t = torch.tensor(n, dtype=torch.float32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        n = float(t)
    return n, world


def liger_fused_linear_grpo(
    _input: torch.Tensor,
    weight: torch.Tensor,
    selected_token_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    advantages: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    ref_per_token_logps: Optional[torch.Tensor] = None,
    old_per_token_logps: Optional[torch.Tensor] = None,
    ref_input: Optional[torch.Tensor] = None,
    ref_weight: Optional[torch.Tensor] = None,
    ref_bias: Optional[torch.Tensor] = None,
    beta: float = _LIGER["beta"],
    epsilon_low: float = _LIGER["epsilon_low"],
    epsilon_high: float = _LIGER["epsilon_high"],
    loss_type: str = _LIGER["loss_type"],
    max_completion_length: Optional[float] = _LIGER["max_completion_length"],
    importance_sampling_level: str = _LIGER["importance_sampling_level"],
    sapo_temperature_pos: float = _LIGER["sapo_temperature_pos"],
    sapo_temperature_neg: float = _LIGER["sapo_temperature_neg"],
    temperature: float = _LIGER["temperature"],
    compiled: bool = True,
    use_ref_model: bool = _LIGER["use_ref_model"],
    chunk_size: int = 1,
    vllm_is_ratio: Optional[torch.Tensor] = None,
    delta: Optional[float] = _LIGER["delta"],
    use_bias_correction_kl: bool = _LIGER["use_bias_correction_kl"],
    vespo_k_pos: float = _LIGER["vespo_k_pos"],
    vespo_lambda_pos: float = _LIGER["vespo_lambda_pos"],
    vespo_k_neg: float = _LIGER["vespo_k_neg"],
    vespo_lambda_neg: float = _LIGER["vespo_lambda_neg"],
    num_items_in_batch: Any = None,
) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """Liger's ``LigerFusedLinearGRPOFunction.apply`` (same positional order and defaults).

    ``_input`` ``[B, T, H]``, ``weight`` ``[V, H]``, ``bias`` ``[V]`` or None (float32, float64,
    bfloat16 or float16; the low-precision ones are computed in float32), ``selected_token_ids``
    ``[B, T]``, ``attention_mask`` ``[B, T]`` (0/1), ``advantages`` ``[B]``.
    ``old_per_token_logps`` None is on-policy (ratio 1). With beta != 0 and ``use_ref_model`` the
    reference log-probs are ``ref_per_token_logps``, else the head ``ref_input`` / ``ref_weight`` /
    ``ref_bias`` at the same temperature; without ``use_ref_model`` the KL term is 0 (Liger compares
    the policy with itself). ``vllm_is_ratio`` ``[B, T]``, ``[B, 1]`` or ``[B]`` multiplies the policy
    term (vespo: enters its weight). ``compiled`` and ``chunk_size`` are accepted; the head sizes its
    own chunks.

    Returns ``(loss, (kl, clip_ratio))`` (``kl`` present when beta != 0): ``kl`` is the mean reference
    KL (times the ratio with ``use_bias_correction_kl``) and ``clip_ratio`` the fraction of valid
    tokens whose ratio is clipped against the advantage's sign (cispo: above ``epsilon_high``; sapo
    and vespo: 0), both over the valid tokens.
    """
    # The options, checked as Liger checks them (ulorl/presets/liger.hpp).
    o = _cpp_options(_ulorl.LigerFusedLinearGRPOOptions,
                     {name: value for name, value in locals().items() if name in _LIGER})
    _ulorl._liger_validate(o)
    if _input.dim() != 3:
        raise _fail(_FN, "_input", f"has shape {tuple(_input.shape)}: must be [B, T, H]")
    B, T = int(_input.shape[0]), int(_input.shape[1])
    for name, t in (("selected_token_ids", selected_token_ids), ("attention_mask", attention_mask)):
        if tuple(t.shape) != (B, T):
            raise _fail(_FN, name, f"has shape {tuple(t.shape)} but '_input' is [{B}, {T}, H]")
    if tuple(advantages.shape) != (B,):
        raise _fail(_FN, "advantages", f"has shape {tuple(advantages.shape)}: must be [{B}]")
    if use_ref_model and ref_per_token_logps is None and ref_input is None:
        raise _fail(_FN, "ref_per_token_logps", "use_ref_model needs ref_per_token_logps or ref_input")

    f32 = torch.float32
    labels = selected_token_ids.reshape(-1).to(torch.int64).contiguous()
    temperature = float(temperature)
    mask = attention_mask
    counts = _common.counts(mask)
    adv = advantages.detach().to(f32)
    kl_on = beta != 0.0 and use_ref_model
    ref = None
    if kl_on:
        if ref_per_token_logps is not None:
            ref = ref_per_token_logps.detach().to(f32)
        else:
            if ref_weight is None:
                raise _fail(_FN, "ref_weight", "required with ref_input")
            with torch.no_grad():
                ref = _head_log_prob(ref_input, ref_weight, ref_bias, labels, temperature).reshape(B, T).to(f32)
    ratio = None
    if vllm_is_ratio is not None:
        q = vllm_is_ratio.detach().to(f32)
        if q.dim() == 1:
            q = q.unsqueeze(-1)
        if q.dim() != 2 or q.shape[0] != B or q.shape[1] not in (1, T):
            raise _fail(_FN, "vllm_is_ratio", f"has shape {tuple(vllm_is_ratio.shape)}: must be [{B}], [{B}, 1] "
                        f"or [{B}, {T}]")
        ratio = q
    h, w, b = _head_operands(_input, weight, bias)
    device = _input.device
    items, world = _num_items(counts.tokens, num_items_in_batch, device) if o.uses_num_items else (None, 1)
    plan = _ulorl._liger_fused_linear_grpo(o, counts, items, float(world))

    if not plan["fused"]:
        logp = _HeadLogProb.apply(h, w, b, labels, temperature).reshape(B, T)
        if ratio is not None and ratio.shape[1] == 1 and T > 1:
            # A [B, 1] ratio: the policy term's factor on every position (luspo); vespo sums log q over
            # its one column, which [q, 1, ..., 1] reproduces.
            ratio = ratio.expand(B, T) if loss_type == "luspo" else torch.cat(
                [ratio, torch.ones(B, T - 1, dtype=f32, device=ratio.device)], dim=1)
        # TRL's loss with the plan's options (presets::liger::fused_linear_grpo maps Liger's to TRL's).
        loss, m = _trl._grpo_loss(
            logp, None if old_per_token_logps is None else old_per_token_logps.detach().to(f32), adv, mask,
            plan["trl_options"], ref_per_token_logps=ref, importance_sampling_ratio=ratio)
        kl = m["kl"] if kl_on else 0.0
        clip = 0.0 if loss_type == "vespo" else m["clip_region_fraction"]
    else:
        if old_per_token_logps is not None:
            old = old_per_token_logps.detach().to(f32)
        else:
            with torch.no_grad():
                old = _head_log_prob(h, w, b, labels, temperature).reshape(B, T).to(f32)
        # The configuration and, for a cispo cap below 1, the adjusted inputs: the plan's.
        weights = None if ratio is None else ratio.expand(B, T)
        if plan["old_log_prob_shift"] != 0.0:
            old = old + plan["old_log_prob_shift"]
        if plan["weight_scale"] != 1.0:
            scale = plan["weight_scale"]
            weights = torch.full((B, T), scale, dtype=f32, device=device) if weights is None else weights * scale
        loss, m = linear_head_policy_loss(h, w, b, labels, old, adv.unsqueeze(1).expand(B, T), mask,
                                          temperature=temperature, ref_log_prob=ref, weights=weights,
                                          config=plan["config"])
        kl = m["kl_mean"] * plan["kl_mean_scale"] if kl_on else 0.0
        clip = 0.0 if loss_type == "sapo" else m["clip_region_fraction"]

    metrics = [torch.tensor(clip, dtype=f32, device=device)]
    if beta != 0.0:
        metrics.insert(0, torch.tensor(kl, dtype=f32, device=device))
    return loss.to(f32), tuple(metrics)


class LigerFusedLinearGRPOFunction:
    """Liger's ``LigerFusedLinearGRPOFunction``: ``apply`` takes its positional arguments (see
    :func:`liger_fused_linear_grpo`) and returns ``(loss, metrics)`` with autograd to the head."""

    @staticmethod
    def apply(*args: Any, **kwargs: Any) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
        return liger_fused_linear_grpo(*args, **kwargs)


class LigerFusedLinearGRPOLoss(torch.nn.Module):
    """Liger's ``LigerFusedLinearGRPOLoss``: the constructor takes Liger's options and defaults,
    ``forward(_input, lin_weight, selected_token_ids, attention_mask, advantages, bias=None,
    ref_per_token_logps=None, old_per_token_logps=None, ref_input=None, ref_weight=None, ref_bias=None,
    vllm_is_ratio=None, num_items_in_batch=None)`` returns ``(loss, metrics)``."""

    def __init__(
        self,
        beta: float = _LIGER["beta"],
        compiled: bool = True,
        use_ref_model: bool = _LIGER["use_ref_model"],
        chunk_size: int = 1,
        epsilon_low: float = _LIGER["epsilon_low"],
        epsilon_high: float = _LIGER["epsilon_high"],
        loss_type: str = _LIGER["loss_type"],
        max_completion_length: Optional[float] = _LIGER["max_completion_length"],
        importance_sampling_level: str = _LIGER["importance_sampling_level"],
        sapo_temperature_pos: float = _LIGER["sapo_temperature_pos"],
        sapo_temperature_neg: float = _LIGER["sapo_temperature_neg"],
        temperature: float = _LIGER["temperature"],
        delta: Optional[float] = _LIGER["delta"],
        use_bias_correction_kl: bool = _LIGER["use_bias_correction_kl"],
        vespo_k_pos: float = _LIGER["vespo_k_pos"],
        vespo_lambda_pos: float = _LIGER["vespo_lambda_pos"],
        vespo_k_neg: float = _LIGER["vespo_k_neg"],
        vespo_lambda_neg: float = _LIGER["vespo_lambda_neg"],
    ):
        super().__init__()
        fn = "presets::liger::LigerFusedLinearGRPOLoss"
        for name, value in (("sapo_temperature_pos", sapo_temperature_pos),
                            ("sapo_temperature_neg", sapo_temperature_neg)):
            if not value > 0:
                raise _fail(fn, name, f"= {value}: must be positive")
        if delta is not None and not delta > 0:
            raise _fail(fn, "delta", f"= {delta}: must be positive")
        self.beta = beta
        self.compiled = compiled
        self.use_ref_model = use_ref_model
        self.chunk_size = chunk_size
        self.epsilon_low = epsilon_low
        self.epsilon_high = epsilon_high
        self.loss_type = loss_type
        self.max_completion_length = max_completion_length
        self.importance_sampling_level = importance_sampling_level
        self.sapo_temperature_pos = sapo_temperature_pos
        self.sapo_temperature_neg = sapo_temperature_neg
        self.temperature = temperature
        self.delta = delta
        self.use_bias_correction_kl = use_bias_correction_kl
        self.vespo_k_pos = vespo_k_pos
        self.vespo_lambda_pos = vespo_lambda_pos
        self.vespo_k_neg = vespo_k_neg
        self.vespo_lambda_neg = vespo_lambda_neg

    def forward(self, _input, lin_weight, selected_token_ids, attention_mask, advantages, bias=None,
                ref_per_token_logps=None, old_per_token_logps=None, ref_input=None, ref_weight=None, ref_bias=None,
                vllm_is_ratio=None, num_items_in_batch=None):
        return liger_fused_linear_grpo(
            _input, lin_weight, selected_token_ids, attention_mask, advantages, bias, ref_per_token_logps,
            old_per_token_logps, ref_input, ref_weight, ref_bias, self.beta, self.epsilon_low, self.epsilon_high,
            self.loss_type, self.max_completion_length, self.importance_sampling_level, self.sapo_temperature_pos,
            self.sapo_temperature_neg, self.temperature, self.compiled, self.use_ref_model, self.chunk_size,
            vllm_is_ratio, self.delta, self.use_bias_correction_kl, self.vespo_k_pos, self.vespo_lambda_pos,
            self.vespo_k_neg, self.vespo_lambda_neg, num_items_in_batch)


_check_nan_options(globals(), "presets::liger::")
