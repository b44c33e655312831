"""RandomKV: A control: uniform random scores."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.constraints import checked, shared
from workbench.rerun.eviction.evidence import Evidence
from workbench.rerun.eviction.policies.base import EvictionPolicy


@checked()
@dataclass(frozen=True)
class RandomKV(EvictionPolicy):
    """Random control: uniform random scores (seeded, independent per layer and group)."""

    n_sink: int = 4
    recent: int = 32
    seed: int = 0
    _parameter_constraints = shared("seed")
    name: ClassVar[str] = "random"

    def scores(self, ev: Evidence) -> Tensor:
        g = torch.Generator().manual_seed(self.seed)
        return torch.rand(ev.L, ev.G, ev.T, generator=g, dtype=torch.float64)
