"""Shared pieces of the presets."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from .. import _ulorl
from .._api import _count_batch, _host


def counts(mask: Optional[torch.Tensor], offsets: Optional[torch.Tensor] = None,
           tokens: Optional[torch.Tensor] = None) -> _ulorl.BatchCounts:
    """count_batch of the mask (on any device, of any integer or floating dtype); a None mask counts every
    token of ``tokens``' layout."""
    return _count_batch(mask, offsets, tokens if mask is None else None)


def host(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``t`` for the extension's host-side functions (not operators): itself on the CPU, else a CPU copy."""
    return _host(t)


def padded_length(t: torch.Tensor) -> int:
    return int(t.shape[-1]) if t.dim() == 2 else 0


def metrics_of(result: _ulorl.PolicyLossResult, extra: Dict[str, Any]) -> Dict[str, Any]:
    d: Dict[str, Any] = result.as_dict()
    d.update(extra)
    return d


def number(x: Any) -> Optional[float]:
    """A count as the frameworks pass it (a Python number or a 0-dim tensor) as a float; None stays None."""
    if x is None:
        return None
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)
