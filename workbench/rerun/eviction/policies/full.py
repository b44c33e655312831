"""FullCache: The reference: the full KV cache, nothing evicted."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.constraints import checked
from workbench.rerun.eviction.evidence import Evidence
from workbench.rerun.eviction.policies.base import EvictionPolicy


@checked()
@dataclass(frozen=True)
class FullCache(EvictionPolicy):
    """Keep everything (the reference; the budget is ignored)."""

    name: ClassVar[str] = "full"
    keeps_all: ClassVar[bool] = True

    def scores(self, ev: Evidence) -> Tensor:
        return torch.ones(ev.L, ev.G, ev.T, dtype=torch.float64)

    def protected(self, T: int) -> Tensor:
        return torch.ones(T, dtype=torch.bool)
