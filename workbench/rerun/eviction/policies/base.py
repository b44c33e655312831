"""What every eviction policy builds on: :class:`EvictionPolicy` (the dataclass interface: ``needs``,
``scores``, ``protected``, ``tiebreak``, ``allocate``), :class:`OnBasePolicy` (a policy on another one's
scores), the protected set :func:`protected_mask` and the budget allocation :func:`split_budget`.
"""
from __future__ import annotations

import abc
from dataclasses import fields
from typing import ClassVar

import torch
from torch import Tensor

from workbench.checks import InstanceOf, check_fields
from workbench.constraints import register, shared
from workbench.rerun.eviction.evidence import Evidence, Needs

__all__ = ["EvictionPolicy", "OnBasePolicy", "protected_mask", "split_budget"]


def protected_mask(T: int, n_sink: int, recent: int) -> Tensor:
    """Sinks ``0 … n_sink-1`` and the last ``recent`` prompt positions; bool ``[T]``."""
    m = torch.zeros(T, dtype=torch.bool)
    m[: min(n_sink, T)] = True
    if recent > 0:
        m[max(0, T - recent):] = True
    return m


class EvictionPolicy(abc.ABC):
    """Shared behaviour of the policy dataclasses (see :mod:`workbench.rerun.eviction.policies`)."""

    name: ClassVar[str] = "policy"
    _parameter_constraints: ClassVar = shared("n_sink", "recent")  # a subclass's own fields: its own declaration
    defer: ClassVar[int] = 0
    keeps_all: ClassVar[bool] = False

    def needs(self) -> Needs:
        return Needs()

    @abc.abstractmethod
    def scores(self, ev: Evidence) -> Tensor:
        """Importance of every prompt position, float ``[layers, kv_heads, prompt_len]``.

        Cells that attend one stored row (``ev.ties``: a layer with fewer KV heads than ``G``, layers sharing one
        cache in Gemma-3n/4) keep one set: the selection takes the mean of their scores (and tie-breaks) over the
        tie (:meth:`~workbench.rerun.eviction.evidence.Evidence.pooled`), so a sharing group's kept set is chosen
        once from its layers' scores pooled; a budget allocation must give the cells of a tie one count."""

    def tiebreak(self, ev: Evidence) -> Tensor | None:
        return None

    def allocate(self, ev: Evidence, budget: int) -> Tensor | None:
        """Per layer and KV group counts int64 ``[L, G]`` (a budget allocation, see :func:`select_keep`), or
        ``None``: ``B`` everywhere."""
        return None

    def protected(self, T: int) -> Tensor:
        return protected_mask(T, getattr(self, "n_sink", 0), getattr(self, "recent", 0))

    def params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __post_init__(self):
        check_fields(self)  # every field against the constraint its class (or a base) declares


class OnBasePolicy(EvictionPolicy):
    """A policy built on another one's scores (``self.base``, an evicting policy): a rescaling or a budget
    allocation. The base's decode step, evidence, scores, protected set and tie-break are kept unless the
    subclass overrides them."""

    base: EvictionPolicy
    _parameter_constraints: ClassVar = {"base": InstanceOf(
        lambda x: isinstance(x, EvictionPolicy) and not x.keeps_all, "an evicting EvictionPolicy (not the full cache)")}

    @property
    def defer(self) -> int:
        return self.base.defer

    def needs(self) -> Needs:
        return self.base.needs()

    def scores(self, ev: Evidence) -> Tensor:
        return ev.scores_of(self.base)

    def protected(self, T: int) -> Tensor:
        return self.base.protected(T)

    def tiebreak(self, ev: Evidence) -> Tensor | None:
        return self.base.tiebreak(ev)


register("base", OnBasePolicy._parameter_constraints["base"], __name__)  # one constraint for every subclass's base


def split_budget(total: int, weights: Tensor, floor: int, cap: int) -> Tensor:
    """Integer counts ``[n]`` in ``[floor, cap]`` summing to ``total``: ``floor`` plus the rest in proportion to
    ``weights ≥ 0`` (water-filling: a share over ``cap`` is fixed at ``cap`` and the others re-shared; then
    one rounding by largest remainders, so equal weights get counts at most 1 apart)."""
    n = weights.numel()
    if not n * floor <= total <= n * cap:
        raise ValueError(f"budget: {total} cannot be split into {n} counts in [{floor}, {cap}]")
    w = weights.to(torch.float64).clamp_min(0).flatten()
    w = w if float(w.sum()) > 0 else torch.ones_like(w)
    capped = torch.zeros(n, dtype=torch.bool)
    while True:
        free = ~capped
        rest = total - cap * int(capped.sum()) - floor * int(free.sum())
        ww = torch.where(free, w, torch.zeros_like(w))
        ww = ww if float(ww.sum()) > 0 else free.to(torch.float64)
        x = torch.where(free, floor + rest * ww / ww.sum(), torch.full_like(w, float(cap)))
        over = free & (x > cap)
        if not bool(over.any()):
            break
        capped |= over
    out = x.floor().to(torch.int64)
    left = total - int(out.sum())
    if left:
        out[torch.argsort(x - out, descending=True, stable=True)[:left]] += 1
    return out
