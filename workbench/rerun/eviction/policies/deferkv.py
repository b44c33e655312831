"""DeferKV: DeferKV (``../shared/reference/deferkv-guide.md``; SPEC §9): eviction deferred to the first decode step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.checks import Interval
from workbench.choices import Pooling
from workbench.constraints import checked, shared
from workbench.rerun.eviction.evidence import Evidence, Needs, group_mean, pool, row_sum
from workbench.rerun.eviction.policies.base import EvictionPolicy


def deferkv_alpha(W: int, lam: float, decode_weight: float | None = None) -> Tensor:
    """DeferKV's temporal weights over ``r = -W+1 … 0, 1``; float64 ``[W+1]`` summing to 1.

    ``α_r = exp(λ r) / Σ_{r'} exp(λ r')`` (SPEC §9). With ``decode_weight = w`` the decode row gets ``w``
    and the tail rows share ``1 - w`` in proportion to ``exp(λ r)`` (``w = 0``: prompt tail only).
    """
    r = torch.arange(-W + 1, 2, dtype=torch.float64)
    if decode_weight is None:
        return torch.softmax(lam * r, dim=0)
    a = torch.softmax(lam * r[:-1], dim=0) * (1.0 - decode_weight)
    return torch.cat([a, torch.tensor([float(decode_weight)], dtype=torch.float64)])


@checked()
@dataclass(frozen=True)
class DeferKV(EvictionPolicy):
    """DeferKV (evict after decode step ``t = 1``): ``S_i = Σ_r α_r A_{r,i}`` over ``r = -W+1 … 1``,
    ``α_r = exp(λ r)`` normalised (SPEC §9), averaged over the group's heads, pooled over every prompt key with ``kernel`` (``pooling``: ``"max"``,
    or ``"avg"``, zero padded as kvpress's SnapKV).
    The first generated token is protected.

    Attributes:
        n_sink, recent: protected sinks and recent prompt window.
        window: prompt-tail rows ``W ≥ 1``.
        lam: ``λ`` (real; ``λ > 0`` favours later rows, ``0`` = uniform).
        kernel: pool kernel, odd ``≥ 1``.
        pooling: ``"max"`` (default) or ``"avg"``.
        decode_weight: ``None`` for SPEC's ``α``; a number in ``[0, 1]`` fixes ``α_1`` and spreads the
            rest over the tail by ``exp(λ r)`` (``0`` with ``λ = 0`` reproduces SnapKV's selection).
    """

    n_sink: int = 4
    recent: int = 32
    window: int = 32
    lam: float = 0.1
    kernel: int = 7
    decode_weight: float | None = None
    pooling: Pooling = "max"
    _parameter_constraints = {**shared("window", "kernel", "decode_weight", "pooling"), "lam": Interval("real", -50.0, 50.0)}
    name: ClassVar[str] = "deferkv"
    defer: ClassVar[int] = 1

    def needs(self) -> Needs:
        return Needs(tail=self.window, decode1=True)

    def alpha(self) -> Tensor:
        """``α`` over ``r = -W+1 … 1``; float64 ``[W+1]``."""
        return deferkv_alpha(self.window, self.lam, self.decode_weight)

    def scores(self, ev: Evidence) -> Tensor:
        tail = ev.require("tail", "DeferKV")
        dec = ev.require("decode", "DeferKV")
        if tail.shape[2] < self.window:
            raise ValueError(f"window: {self.window} rows needed, the evidence has {tail.shape[2]}")
        s = row_sum([tail[:, :, -self.window:], dec[:, :, :1]], self.alpha())  # Σ_r α_r A_r over W+1 rows: [L, H_Q, T]
        return pool(group_mean(s, ev), self.kernel, self.pooling)
