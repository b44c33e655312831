"""H2O: Zhang et al., *H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models*, NeurIPS 2023 (arXiv:2306.14048)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from workbench.rerun.eviction.evidence import EvictionPolicy, Evidence, Needs, group_mean


@dataclass(frozen=True)
class H2O(EvictionPolicy):
    """H2O (one-shot after prefill): accumulated attention ``Σ_{u<T} A_{u,j}`` of every prompt query,
    averaged over the group's heads, plus the protected sinks and recent window.

    The column sums are accumulated inside the attention call over query tiles (never ``T × T``).
    """

    n_sink: int = 4
    recent: int = 32
    name: ClassVar[str] = "h2o"

    def __post_init__(self):
        self._check_common()

    def needs(self) -> Needs:
        return Needs(colsum=True)

    def scores(self, ev: Evidence) -> Tensor:
        return group_mean(ev.require("colsum", "H2O"), ev)
