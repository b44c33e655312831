"""KNorm: Devoto et al., *A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression*, EMNLP 2024 (arXiv:2406.11430)."""
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
class KNorm(EvictionPolicy):
    """KNorm (attention-free, evict at ``t = 0``): score ``−‖k_j‖_2`` per KV head, the cache's post-RoPE
    keys after prefill (low key norm goes with high attention). ``KNorm(n_sink=0, recent=0)`` is
    kvpress's ``KnormPress`` (tests/peers/).

    Attributes:
        n_sink, recent: protected sinks and recent window.
    """

    n_sink: int = 4
    recent: int = 32
    name: ClassVar[str] = "knorm"

    def needs(self) -> Needs:
        return Needs(keys=True)

    def scores(self, ev: Evidence) -> Tensor:
        k = ev.require("keys", "KNorm")  # [L, G, T, d]
        # in at least float32 from the keys as stored (kvpress does the same): a float64 norm of float32 keys
        # orders near-ties differently (seen once in 90 cells on the needle prompt)
        return -torch.linalg.vector_norm(k, dim=-1, dtype=torch.promote_types(k.dtype, torch.float32)).double()
