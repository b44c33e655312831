"""A user's own policy, defined outside the workbench (tests/test_policy_registry.py registers it at run time,
and the report CLI imports it as ``_my_policy:MeanKey``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from workbench.rerun.eviction import EvictionPolicy, Needs


@dataclass(frozen=True)
class MeanKey(EvictionPolicy):
    """Keep the keys closest to their KV head's mean key (cosine similarity; attention-free)."""

    n_sink: int = 4
    recent: int = 16
    name: ClassVar[str] = "mean-key"

    def needs(self) -> Needs:
        return Needs(keys=True)

    def scores(self, ev) -> torch.Tensor:
        k = ev.require("keys", "MeanKey").double()  # [L, G, T, d]
        return torch.nn.functional.cosine_similarity(k, k.mean(2, keepdim=True), dim=-1)
