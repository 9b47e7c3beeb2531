"""Shared pieces of the presets."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from .. import _ulorl


def counts(mask: Optional[torch.Tensor], offsets: Optional[torch.Tensor] = None,
           tokens: Optional[torch.Tensor] = None) -> _ulorl.BatchCounts:
    """count_batch of the mask; a None mask counts every token of ``tokens``' layout."""
    return _ulorl.count_batch(mask, offsets, tokens=tokens if mask is None else None)


def padded_length(t: torch.Tensor) -> int:
    return int(t.shape[-1]) if t.dim() == 2 else 0


def metrics_of(result: _ulorl.PolicyLossResult, extra: Dict[str, Any]) -> Dict[str, Any]:
    d: Dict[str, Any] = result.as_dict()
    d.update(extra)
    return d
