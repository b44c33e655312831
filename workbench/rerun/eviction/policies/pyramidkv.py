"""PyramidKV: Cai et al., *PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling* (arXiv:2406.02069)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.checks import Interval
from workbench.constraints import checked
from workbench.rerun.eviction.evidence import Evidence
from workbench.rerun.eviction.policies.base import EvictionPolicy, OnBasePolicy, split_budget
from workbench.rerun.eviction.policies.snapkv import SnapKV


@checked()
@dataclass(frozen=True)
class PyramidKV(OnBasePolicy):
    """Per-layer budgets falling linearly with depth (a pyramid), any base policy's scores within a layer.

    With ``B`` the average per layer, ``p`` the base's protected count and ``L`` layers: the first layer
    gets ``B_max = 2B − B_min`` and the last ``B_min = B / β``, linearly in between (KVCache-Factory's
    formula, as kvpress's ``PyramidKVPress``), rounded by largest remainders so that ``Σ_l B_l = L·B``.
    **[decided]** Where ``B_max > T`` it is clipped to ``T``; where ``B_min < p`` the pyramid is flattened
    to ``B_min = p``. (kvpress clips ``B_max`` at ``T − W`` and falls back to SnapKV's uniform budget where
    ``B_min`` is still below its window ``W``; on the needle prompt at ratio 0.5 both give the same line,
    within one slot per layer of rounding: tests/peers/.) Each layer's
    cache really holds ``B_l`` entries per KV head: the bytes are saved.

    Attributes:
        base: the policy scoring within a layer (not the full cache).
        beta: ``β ≥ 1``, the ratio of the average to the last layer's budget.
    """

    base: EvictionPolicy = SnapKV()
    beta: float = 20.0
    _parameter_constraints = {"beta": Interval("real", 1.0, 1e6)}
    name: ClassVar[str] = "pyramidkv"

    def layer_budgets(self, L: int, T: int, budget: int) -> Tensor:
        """``B_l`` for every layer; int64 ``[L]`` summing to ``L·B``."""
        p = int(self.protected(T).sum())
        lo = budget / self.beta
        hi = 2 * budget - lo
        if hi > T:
            hi, lo = T, 2 * budget - T
        if lo < p:
            lo, hi = p, 2 * budget - p
        raw = torch.linspace(hi, lo, L, dtype=torch.float64) if L > 1 else torch.tensor([float(budget)])
        return split_budget(L * budget, raw - p, p, T)

    def allocate(self, ev: Evidence, budget: int) -> Tensor:
        return self.layer_budgets(ev.L, ev.T, budget)[:, None].expand(ev.L, ev.G).clone()
