"""OracleKV: An upper reference that knows the future: scores with the full-cache answer's own attention (SPEC §9)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.constraints import checked
from workbench.rerun.eviction.evidence import Evidence, Needs, group_mean
from workbench.rerun.eviction.policies.base import EvictionPolicy


@checked()
@dataclass(frozen=True)
class OracleKV(EvictionPolicy):
    """Oracle (evicts at ``t = 0``, knows the future): mean attention of the full-cache answer's decode
    rows ``1 … n`` over the prompt keys (renormalised), averaged over the group's heads."""

    n_sink: int = 4
    recent: int = 32
    name: ClassVar[str] = "oracle"

    def needs(self) -> Needs:
        return Needs(answer=True)

    def scores(self, ev: Evidence) -> Tensor:
        dec = ev.require("decode", "the oracle")
        return group_mean(dec.to(torch.float64).mean(2), ev)
