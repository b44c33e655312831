"""SnapKV: Li et al., *SnapKV: LLM Knows What You are Looking for Before Generation*, NeurIPS 2024 (arXiv:2404.14469)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from workbench.choices import Pooling
from workbench.constraints import checked, shared
from workbench.rerun.eviction.evidence import Evidence, Needs, group_mean, pool, row_sum
from workbench.rerun.eviction.policies.base import EvictionPolicy


@checked()
@dataclass(frozen=True)
class SnapKV(EvictionPolicy):
    """SnapKV (evict at ``t = 0``): attention of the last ``window`` prompt queries summed over the
    window, averaged over the group's heads, pooled over keys with ``kernel``.

    ``pooling="max"`` (default) max-pools over every prompt key. ``pooling="avg"`` is SnapKV's own code
    and kvpress's ``SnapKVPress``: a zero-padded average pool over the keys *before* the window
    ``[0, T-W)`` (the window's columns are left out of the pool and protected by ``recent ≥ W``);
    ``SnapKV(n_sink=0, recent=64, window=64, kernel=5, pooling="avg")`` keeps what ``SnapKVPress()``
    keeps (tests/peers/).

    Attributes:
        n_sink, recent: protected sinks and recent window.
        window: observation window ``W ≥ 1`` (prompt-tail rows ``r = -W+1 … 0``).
        kernel: pool kernel, odd ``≥ 1`` (1 = no pooling).
        pooling: ``"max"`` or ``"avg"`` (see above).
    """

    n_sink: int = 4
    recent: int = 32
    window: int = 32
    kernel: int = 7
    pooling: Pooling = "max"
    _parameter_constraints = shared("window", "kernel", "pooling")
    name: ClassVar[str] = "snapkv"

    def needs(self) -> Needs:
        return Needs(tail=self.window)

    def scores(self, ev: Evidence) -> Tensor:
        tail = ev.require("tail", "SnapKV")
        if tail.shape[2] < self.window:
            raise ValueError(f"window: {self.window} rows needed, the evidence has {tail.shape[2]}")
        s = row_sum([tail[:, :, -self.window:]], [1.0] * self.window)  # [L, H_Q, T]
        g = group_mean(s, ev)
        if self.pooling == "max":
            return pool(g, self.kernel, "max")
        cut = max(ev.T - self.window, 0)  # the keys before the window: pooled on their own, zero padded
        g = g.clone()
        if cut:
            g[..., :cut] = pool(g[..., :cut].contiguous(), self.kernel, "avg")
        return g
