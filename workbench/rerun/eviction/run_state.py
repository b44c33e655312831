"""One eviction and the answer decoded from it: what :meth:`EvictionSession.evict
<workbench.rerun.eviction.session.EvictionSession.evict>` returns and
:meth:`~workbench.rerun.eviction.session.EvictionSession.continue_with` decodes from (the kept sets, the compacted
cache and what decoding accumulates)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from workbench.rerun.eviction.policies.base import EvictionPolicy
from workbench.rerun.eviction.result import GenerationResult

__all__ = ["RunState", "forced_ids"]


@dataclass(eq=False)
class RunState:
    """One eviction and the answer decoded from it. Made by :meth:`EvictionSession.evict`, moved on by
    :meth:`EvictionSession.continue_with`; the fields are the session's bookkeeping (read ``ids``, the answer so
    far, and ``context_entries``; the others are for the session).

    ``ids`` holds the answer's tokens; the cache holds every position before the last of them (a generated token
    is fed back only to decode the next). Decoding step ``m`` (``m = len(ids)``) feeds ``ids[-1]`` at position
    ``T - shift + offset + m - 1``.
    """

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
    offset: int = 0  # positions appended after the prompt before this answer (earlier turns, a question)
    shift: int = 0  # positions removed by re-rotation (decoding continues at the compacted length)
    state: int = 0  # bytes of the recurrent and convolution states (not evictable)
    forced: tuple | None = None  # teacher forcing: the tokens fed, in place of the greedy choice
    context_entries: int = 0  # entries the cache held when this answer's decoding began (its first layer)

    def force(self, forced: tuple[int, ...]) -> None:
        """Teacher forcing on ``forced`` (checked by :func:`forced_ids`): from the state's first undecided token on,
        each forced token replaces the greedy choice."""
        self.forced, self.ids, self.logits = forced, list(forced[: len(self.ids)]), self.logits[: len(forced)]

    def finished(self, n: int, eos) -> bool:
        """Forced: every forced token is in; else ``n`` tokens or a stop token."""
        if self.forced:
            return len(self.ids) >= len(self.forced)
        return len(self.ids) >= n or self.ids[-1] in eos

    def result(self, T: int, n: int, tokenizer, layers) -> GenerationResult:
        """The answer so far (at most ``n`` tokens) as a :class:`GenerationResult` of a prompt of ``T`` tokens
        whose evictable layers are ``layers``."""
        ids = self.ids[:n]
        return GenerationResult(
            policy=self.policy.name, params=self.policy.params(), budget=self.B, T=T, ids=ids,
            text=tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else None,
            kept=self.kept, evicted_at=self.defer, compacted_layers=self.compacted, kv_bytes_before=self.before,
            kv_bytes_after=self.after, timings=self.timings, step_s=self.steps, kv_bytes_masked=self.masked,
            rerotated=bool(self.shift), logits=torch.stack(self.logits[: len(ids)]) if self.logits else None,
            kept_layers=self.kept_layers, not_compacted=self.not_compacted, kv_layer_bytes_before=self.layer_before,
            kv_layer_bytes_after=self.layer_after, kv_bytes_state=self.state, layers=tuple(layers))


def forced_ids(forced, n: int, decided: list[int]) -> tuple[int, ...]:
    """``forced`` as a tuple of 1 to ``n`` token ids that starts with the tokens ``decided`` before the eviction
    (they are the full cache's own); a ``ValueError`` naming ``forced`` otherwise."""
    f = tuple(int(i) for i in torch.as_tensor(forced).flatten().tolist())
    if not 1 <= len(f) <= n:
        raise ValueError(f"forced: must hold 1 to max_new_tokens = {n} token ids, got {len(f)}")
    if list(f[: len(decided)]) != decided[: len(f)]:
        raise ValueError(f"forced: must start with the tokens decided before the eviction {decided} "
                         f"(the full-cache answer of this prompt), got {list(f[: len(decided)])}")
    return f
