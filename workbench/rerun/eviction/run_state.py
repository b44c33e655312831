"""One eviction being decoded (internal to :class:`~workbench.rerun.eviction.session.EvictionSession`): the kept
sets, the compacted cache and what the decode loop accumulates."""
from __future__ import annotations

from dataclasses import dataclass, field

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
