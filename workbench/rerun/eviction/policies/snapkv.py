"""SnapKV: Li et al., *SnapKV: LLM Knows What You are Looking for Before Generation*, NeurIPS 2024 (arXiv:2404.14469)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from workbench.checks import check_int, check_kernel
from workbench.rerun.eviction.evidence import EvictionPolicy, Evidence, Needs, group_mean, maxpool, row_sum


@dataclass(frozen=True)
class SnapKV(EvictionPolicy):
    """SnapKV (evict at ``t = 0``): attention of the last ``window`` prompt queries summed over the
    window, averaged over the group's heads, max-pooled over keys with ``kernel``.

    Attributes:
        n_sink, recent: protected sinks and recent window.
        window: observation window ``W ≥ 1`` (prompt-tail rows ``r = -W+1 … 0``).
        kernel: max-pool kernel, odd ``≥ 1`` (1 = no pooling).
    """

    n_sink: int = 4
    recent: int = 32
    window: int = 32
    kernel: int = 7
    name: ClassVar[str] = "snapkv"

    def __post_init__(self):
        self._check_common()
        check_int("window", self.window, 1)
        check_kernel(self.kernel)

    def needs(self) -> Needs:
        return Needs(tail=self.window)

    def scores(self, ev: Evidence) -> Tensor:
        tail = ev.require("tail", "SnapKV")
        if tail.shape[2] < self.window:
            raise ValueError(f"window: {self.window} rows needed, the evidence has {tail.shape[2]}")
        s = row_sum([tail[:, :, -self.window:]], [1.0] * self.window)  # [L, H_Q, T]
        return maxpool(group_mean(s, ev), self.kernel)
