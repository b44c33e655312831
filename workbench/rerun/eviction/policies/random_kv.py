"""RandomKV: A control: uniform random scores."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.checks import check_int
from workbench.rerun.eviction.evidence import EvictionPolicy, Evidence


@dataclass(frozen=True)
class RandomKV(EvictionPolicy):
    """Random control: uniform random scores (seeded, independent per layer and group)."""

    n_sink: int = 4
    recent: int = 32
    seed: int = 0
    name: ClassVar[str] = "random"

    def __post_init__(self):
        self._check_common()
        check_int("seed", self.seed, 0)

    def scores(self, ev: Evidence) -> Tensor:
        g = torch.Generator().manual_seed(self.seed)
        return torch.rand(ev.L, ev.G, ev.T, generator=g, dtype=torch.float64)
