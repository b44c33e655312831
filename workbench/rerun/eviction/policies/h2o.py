"""H2O: Zhang et al., *H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models*, NeurIPS 2023 (arXiv:2306.14048)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.choices import H2ONormalise
from workbench.constraints import checked, shared
from workbench.rerun.eviction.evidence import Evidence, Needs, group_mean
from workbench.rerun.eviction.policies.base import EvictionPolicy


@checked()
@dataclass(frozen=True)
class H2O(EvictionPolicy):
    """H2O (one-shot after prefill): accumulated attention ``Σ_{u<T} A_{u,j}`` of every prompt query,
    averaged over the group's heads, plus the protected sinks and recent window.

    The column sums are accumulated inside the attention call over query tiles (never ``T × T``).

    ``normalise="sum"`` (default) is the H2O paper's accumulated attention. ``normalise="mean"``, named
    "mean observed attention" in plots and docs, divides key ``j``'s column sum by the number of prompt
    queries that see it, ``T − j``, per query head before the group mean: kvpress's
    ``ObservedAttentionPress`` (tests/peers/). It favours recent keys (fewer queries see them).

    Attributes:
        n_sink, recent: protected sinks and recent window.
        normalise: ``"sum"`` or ``"mean"``.
    """

    n_sink: int = 4
    recent: int = 32
    normalise: H2ONormalise = "sum"
    _parameter_constraints = shared("normalise")
    name: ClassVar[str] = "h2o"

    def needs(self) -> Needs:
        return Needs(colsum=True)

    def scores(self, ev: Evidence) -> Tensor:
        c = ev.require("colsum", "H2O")
        if self.normalise == "mean":
            c = c / torch.arange(ev.T, 0, -1, dtype=c.dtype)  # T - j queries see key j
        return group_mean(c, ev)
