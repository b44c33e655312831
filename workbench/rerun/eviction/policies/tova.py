"""TOVA: Oren et al., *Transformers are Multi-State RNNs* (Token Omission Via Attention), EMNLP 2024 (arXiv:2401.06104)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.constraints import checked
from workbench.rerun.eviction.evidence import Evidence, Needs
from workbench.rerun.eviction.policies.base import EvictionPolicy


@checked()
@dataclass(frozen=True)
class TOVA(EvictionPolicy):
    """TOVA (evict at ``t = 0``): the last prompt token's attention ``A_{0,j}`` averaged over **all**
    query heads of the layer, the same score for every KV group.

    kvpress's ``TOVAPress`` keeps the last prompt token whatever its score; ``TOVA(n_sink=0, recent=1)``
    keeps what it keeps (tests/peers/).

    Attributes:
        n_sink, recent: protected sinks and recent window.
    """

    n_sink: int = 4
    recent: int = 32
    name: ClassVar[str] = "tova"

    def needs(self) -> Needs:
        return Needs(tail=1)

    def scores(self, ev: Evidence) -> Tensor:
        last = ev.require("tail", "TOVA")[:, :, -1].to(torch.float64)  # [L, H_Q, T]
        return last.mean(1, keepdim=True).expand(ev.L, ev.G, ev.T).clone()
