"""One eviction being decoded (internal to :class:`~workbench.rerun.eviction.session.EvictionSession`): the kept
sets, the compacted cache and what the decode loop accumulates."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from workbench.rerun.eviction.policies.base import EvictionPolicy

__all__ = ["RunState"]


@dataclass(eq=False)
class RunState:
    """One eviction being decoded (internal to :class:`EvictionSession`)."""

    policy: EvictionPolicy
    B: int
    defer: int
    kept: Tensor
    compacted: tuple
    before: int
    after: int
    timings: dict
    ids: list
    logits: list
    cache: object
    kept_layers: tuple = ()
    not_compacted: dict = field(default_factory=dict)
    layer_before: tuple = ()
    layer_after: tuple = ()
    row: int = 0
    steps: list = field(default_factory=list)
    done: bool = False
    drop: dict | None = None
    masked: int = 0
    offset: int = 0  # question tokens appended after the eviction (question-agnostic mode)
    shift: int = 0  # positions removed by re-rotation (decoding continues at the compacted length)
    state: int = 0  # bytes of the recurrent and convolution states (not evictable)
    forced: tuple | None = None  # teacher forcing: the tokens fed, in place of the greedy choice

    def force(self, forced, n: int) -> None:
        """Teacher forcing on ``forced`` (1 to ``n`` token ids): the tokens decided before the eviction must be
        its first ones (they are the full cache's own)."""
        f = tuple(int(i) for i in torch.as_tensor(forced).flatten().tolist())
        if not 1 <= len(f) <= n:
            raise ValueError(f"forced: must hold 1 to max_new_tokens = {n} token ids, got {len(f)}")
        if list(f[: len(self.ids)]) != self.ids[: len(f)]:
            raise ValueError(f"forced: must start with the tokens decided before the eviction {self.ids} "
                             f"(the full-cache answer of this prompt), got {list(f[: len(self.ids)])}")
        self.forced, self.ids, self.logits = f, self.ids[: len(f)], self.logits[: len(f)]

    def finished(self, n: int, eos) -> bool:
        """Forced: every forced token is in; else ``n`` tokens or a stop token."""
        if self.forced:
            return len(self.ids) >= len(self.forced)
        return len(self.ids) >= n or self.ids[-1] in eos
