"""StreamingLLM: Xiao et al., *Efficient Streaming Language Models with Attention Sinks*, ICLR 2024 (arXiv:2309.17453)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from workbench.constraints import checked
from workbench.rerun.eviction.evidence import Evidence
from workbench.rerun.eviction.policies.base import EvictionPolicy


@checked()
@dataclass(frozen=True)
class StreamingLLM(EvictionPolicy):
    """StreamingLLM: the sinks and the most recent positions (score = position).

    Attributes:
        n_sink: attention sinks kept, ``≥ 0``.
        recent: recent prompt positions always kept, ``≥ 0`` (the rest of the budget also goes to the
            most recent positions, so the result is sinks + the last ``B - n_sink``).
    """

    n_sink: int = 4
    recent: int = 32
    name: ClassVar[str] = "streaming"

    def scores(self, ev: Evidence) -> Tensor:
        return (torch.arange(ev.T, dtype=torch.float64) / ev.T).expand(ev.L, ev.G, ev.T).clone()
