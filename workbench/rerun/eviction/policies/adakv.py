"""AdaKV: Feng et al., *Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for Efficient LLM Inference* (arXiv:2407.11550)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.checks import Interval
from workbench.constraints import checked
from workbench.rerun.eviction.evidence import Evidence
from workbench.rerun.eviction.policies.base import EvictionPolicy, OnBasePolicy
from workbench.rerun.eviction.policies.snapkv import SnapKV


@checked()
@dataclass(frozen=True)
class AdaKV(OnBasePolicy):
    """Per-head budgets inside a layer: the layer's ``G·B`` slots go to the highest base scores across its
    KV heads, after each head's protected positions and its own top ``max(1, ⌊α_safe·B⌋)`` scores (the
    safeguard), as kvpress's ``AdaKVPress``. Scores must be comparable across heads (attention-based bases are).

    The safeguard counts from the top of each head's scores, where its protected positions (scored ``+inf``)
    come first, as in kvpress (whose SnapKV scores its window ``max + 1``): a safeguard no larger than the
    protected window adds nothing. Kept sets equal ``AdaKVPress(SnapKVPress())``'s in every layer and KV head
    (``tests/peers``).

    The dense cache of a layer keeps its largest head count; the shorter heads' extra slots are masked
    out of attention, so the bytes saved are those of the largest head, not of ``B`` (reported as such).

    Attributes:
        base: the policy scoring within a layer (not the full cache).
        alpha_safeguard: ``α_safe ∈ [0, 1]``.
    """

    base: EvictionPolicy = SnapKV()
    alpha_safeguard: float = 0.2
    _parameter_constraints = {"alpha_safeguard": Interval("real", 0.0, 1.0)}
    name: ClassVar[str] = "adakv"

    def allocate(self, ev: Evidence, budget: int) -> Tensor:
        s = self.scores(ev).detach().to(torch.float64).clone()  # [L, G, T]
        L, G, T = s.shape
        n_safe = max(1, int(budget * self.alpha_safeguard)) if self.alpha_safeguard > 0 else 0
        s[:, :, self.protected(T)] = float("inf")
        if n_safe:
            s.scatter_(-1, s.topk(min(n_safe, T), dim=-1).indices, float("inf"))
        top = s.reshape(L, G * T).topk(G * min(budget, T), dim=-1).indices  # [L, G·B] flat (head, position)
        return torch.nn.functional.one_hot(top // T, G).sum(1)
