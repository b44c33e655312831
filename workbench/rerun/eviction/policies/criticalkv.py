"""CriticalKV: Feng et al., *Identify Critical KV Cache in LLM Inference from an Output Perturbation Perspective* (arXiv:2502.03805)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.checks import Interval
from workbench.constraints import checked
from workbench.rerun.eviction.evidence import Evidence, Needs, group_mean
from workbench.rerun.eviction.policies.base import EvictionPolicy, OnBasePolicy
from workbench.rerun.eviction.policies.snapkv import SnapKV


@checked()
@dataclass(frozen=True)
class CriticalKV(OnBasePolicy):
    """Value-aware rescaling of any policy's score: ``S'_j = (S_j + ε) · ‖W_O v_j‖_1``, the L1 norm of
    key ``j``'s value after the output projection of each query head, averaged over the group's heads
    (a value that moves the layer output little is cheap to drop).

    The base policy's protected set, decode step and tie-break are kept. kvpress's ``CriticalKVPress``
    also reserves a first-stage share of the budget for the base's top scores (``first_stage_ratio``,
    0.5 by default); ``first_stage_ratio=0`` is this rescaling alone (tests/peers/ checks both: the
    identity at 0, and that the first stage is the one difference).

    Attributes:
        base: the policy whose score is rescaled (not the full cache).
        epsilon: ``ε ≥ 0``.
    """

    base: EvictionPolicy = SnapKV()
    epsilon: float = 1e-4
    _parameter_constraints = {"epsilon": Interval("real", 0.0, 1.0)}
    name: ClassVar[str] = "criticalkv"

    def needs(self) -> Needs:
        return self.base.needs().merge(Needs(wov=True))

    def scores(self, ev: Evidence) -> Tensor:
        wov = ev.require("wov", "CriticalKV")  # [L, H_Q, T]
        return (ev.scores_of(self.base).to(torch.float64) + self.epsilon) * group_mean(wov.to(torch.float64), ev)
