"""KeyDiff: Park et al., *KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in Resource-Constrained Environments* (arXiv:2504.15364)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch.nn.functional as F
from torch import Tensor

from workbench.constraints import checked
from workbench.rerun.eviction.evidence import Evidence, Needs
from workbench.rerun.eviction.policies.base import EvictionPolicy


@checked()
@dataclass(frozen=True)
class KeyDiff(EvictionPolicy):
    """KeyDiff (attention-free, evict at ``t = 0``): score ``−cos(k_j, k̄)`` per KV head, with the anchor
    ``k̄`` the mean of the unit-normalised prompt keys: keys unlike the average are kept. One-shot over
    the whole prompt (the paper's block-wise streaming variant is not modelled); ``KeyDiff(n_sink=0,
    recent=0)`` is kvpress's ``KeyDiffPress`` (tests/peers/).

    Attributes:
        n_sink, recent: protected sinks and recent window.
    """

    n_sink: int = 4
    recent: int = 32
    name: ClassVar[str] = "keydiff"

    def needs(self) -> Needs:
        return Needs(keys=True)

    def scores(self, ev: Evidence) -> Tensor:
        k = ev.require("keys", "KeyDiff").float()  # [L, G, T, d], as stored (float32: kvpress's rounding)
        anchor = F.normalize(k, p=2, dim=-1).mean(dim=2, keepdim=True)  # [L, G, 1, d]
        return -F.cosine_similarity(k, anchor, dim=-1).double()
