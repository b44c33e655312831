"""Two eviction settings side by side on the same prompt (compare mode): which prompt positions each
keeps (:func:`kept_set`, :func:`compare_kept` → :class:`KeptComparison`) and what each run gave
(:func:`compare_runs` → :class:`RunComparison`: answers, KV bytes, logit margins). Pure functions of
:class:`~workbench.rerun.eviction.result.GenerationResult` objects (a preview or a run): no model calls.

A position is **kept** by a setting when at least one of the chosen caches holds it: every compacted
(layer, KV group) cache by default, the caches of one ``layer`` and/or one ``group`` when given, the rule the
token view strikes evicted tokens through by (:func:`workbench.show.plots.removed_positions`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.checks import Interval
from workbench.constraints import index_into, register_all
from workbench.rerun.eviction.result import GenerationResult
from workbench.rerun.stability import logit_margin

__all__ = ["MEMBERSHIP", "KeptComparison", "RunSide", "RunComparison", "kept_set", "compare_kept", "compare_runs",
           "token_margin", "setting_labels"]

#: the membership of a prompt position under two settings, in the order the token view's key lists them
MEMBERSHIP = ("A only", "B only", "both", "neither")

_CHECKS = register_all("compare", {"T": Interval("int", 1), "index": Interval("int", 0)}, __name__)
"""A comparison's prompt length ``T`` and :func:`token_margin`'s generated-token ``index``."""


def _as_numpy(t) -> np.ndarray:
    return t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)


def kept_set(result: GenerationResult, layer: int | None = None, group: int | None = None) -> frozenset[int]:
    """The prompt positions ``result`` kept in at least one of its caches: the compacted layers (every layer of
    a full-cache run) or ``layer``, every KV group or ``group``. ``-1`` padding (a budget allocation) is skipped."""
    if not isinstance(result, GenerationResult):
        raise ValueError(f"result: must be a GenerationResult, got {type(result).__name__}")
    if result.error is not None:
        raise ValueError(f"result: the {result.policy} run failed ({result.error}); it kept nothing to compare")
    kp = _as_numpy(result.kept_prompt)
    L, G = kp.shape[0], kp.shape[1]
    if layer is not None:
        index_into(L).check("layer", layer)
    if group is not None:
        index_into(G).check("group", group)
    layers = [layer] if layer is not None else (list(result.compacted_layers) or list(range(L)))
    groups = [group] if group is not None else list(range(G))
    sel = kp[np.ix_(layers, groups)].ravel()
    return frozenset(int(p) for p in np.unique(sel[(sel >= 0) & (sel < result.T)]))


def setting_labels(a: GenerationResult, b: GenerationResult, *, name: Callable[[str], str] = str) -> tuple[str, str]:
    """Short names of two settings: ``policy, B = budget`` (``all`` for the full cache), with the parameters
    that tell them apart when policy and budget agree (DeferKV's ``λ`` …), each written as ``name(key)``
    (the panels pass the sliders' symbols)."""
    def base(r):
        return f"{r.policy}, B = {'all' if r.policy == 'full' else r.budget}"

    la, lb = base(a), base(b)
    if la == lb:
        diff = [k for k in sorted(set(a.params) | set(b.params)) if a.params.get(k) != b.params.get(k)]
        la += "".join(f", {name(k)} = {a.params.get(k)}" for k in diff)
        lb += "".join(f", {name(k)} = {b.params.get(k)}" for k in diff)
    return la, lb


@dataclass(frozen=True)
class KeptComparison:
    """The kept prompt positions of two settings ``A`` and ``B`` on one prompt of ``T`` positions, at the caches
    ``layer``/``group`` chose (``None``: every compacted one). :meth:`membership` classes every position as
    :data:`MEMBERSHIP`; :meth:`to_frame` has one row per position."""

    T: int
    label_a: str
    label_b: str
    kept_a: frozenset
    kept_b: frozenset
    layer: int | None = None
    group: int | None = None

    def __post_init__(self):
        _CHECKS["T"].check("T", self.T)
        for name in ("kept_a", "kept_b"):
            bad = sorted(p for p in getattr(self, name) if not (isinstance(p, int) and 0 <= p < self.T))
            if bad:
                raise ValueError(f"{name}: positions must be integers in [0, {self.T - 1}], got {bad[:5]}")

    @property
    def a_only(self) -> tuple[int, ...]:
        return tuple(sorted(self.kept_a - self.kept_b))

    @property
    def b_only(self) -> tuple[int, ...]:
        return tuple(sorted(self.kept_b - self.kept_a))

    @property
    def both(self) -> tuple[int, ...]:
        return tuple(sorted(self.kept_a & self.kept_b))

    @property
    def neither(self) -> tuple[int, ...]:
        return tuple(sorted(set(range(self.T)) - self.kept_a - self.kept_b))

    def membership(self) -> list[str]:
        """Per prompt position ``0 … T-1``: ``"A only"``, ``"B only"``, ``"both"`` or ``"neither"``."""
        a, b = self.kept_a, self.kept_b
        return [("both" if p in b else "A only") if p in a else ("B only" if p in b else "neither")
                for p in range(self.T)]

    def counts(self) -> dict[str, int]:
        """How many positions fall in each class of :data:`MEMBERSHIP` (they sum to ``T``)."""
        return {"A only": len(self.a_only), "B only": len(self.b_only), "both": len(self.both),
                "neither": len(self.neither)}

    @property
    def where(self) -> str:
        """Which caches the sets are read from, in words."""
        if self.layer is None and self.group is None:
            return "kept by any compacted cache"
        return (f"layer {'any' if self.layer is None else self.layer}, "
                f"KV group {'any' if self.group is None else self.group}")

    def to_frame(self) -> pd.DataFrame:
        """One row per prompt position: ``position, kept_a, kept_b, membership``."""
        return pd.DataFrame({"position": np.arange(self.T), "kept_a": [p in self.kept_a for p in range(self.T)],
                             "kept_b": [p in self.kept_b for p in range(self.T)], "membership": self.membership()})


def compare_kept(a: GenerationResult, b: GenerationResult, *, layer: int | None = None, group: int | None = None,
                 labels: tuple[str, str] | None = None) -> KeptComparison:
    """The :class:`KeptComparison` of two results (previews or runs) on the same prompt."""
    for name, r in (("a", a), ("b", b)):
        if not isinstance(r, GenerationResult):
            raise ValueError(f"{name}: must be a GenerationResult, got {type(r).__name__}")
    if a.T != b.T:
        raise ValueError(f"b: must be a result on the same prompt as a (T = {a.T}), got T = {b.T}")
    la, lb = labels if labels is not None else setting_labels(a, b)
    return KeptComparison(T=a.T, label_a=la, label_b=lb, kept_a=kept_set(a, layer, group),
                          kept_b=kept_set(b, layer, group), layer=layer, group=group)


def token_margin(result: GenerationResult, index: int) -> float:
    """The logit margin (top-1 minus top-2, :func:`~workbench.rerun.stability.logit_margin`) of generated
    token ``index`` (0-based); NaN when the run stopped before it (EOS). Needs the run's logits
    (``EvictionSession.prepare(..., keep_logits=True)``)."""
    if result.logits is None:
        raise ValueError(f"result: the {result.policy} run kept no logits; prepare the session with keep_logits=True")
    _CHECKS["index"].check("index", index)
    return logit_margin(result.logits[index]) if index < len(result.ids) else math.nan


@dataclass(frozen=True)
class RunSide:
    """One run of a comparison: its label, answer, KV bytes (just after eviction) and logit margins.

    ``first_margin`` is the margin of the first generated token, decided by the prefill before any eviction
    (the same for every setting); ``margin`` that of token ``margin_token`` (1-based), the first one decoded
    from the evicted cache (token ``evicted_at + 2``); ``full_margin`` the full cache's margin at that token.
    """

    label: str
    text: str | None
    ids: tuple[int, ...]
    kept: int
    kv_bytes: int
    kv_ratio: float
    evicted_at: int
    first_margin: float
    margin_token: int
    margin: float
    full_margin: float


@dataclass(frozen=True)
class RunComparison:
    """Two runs ``A`` and ``B`` and the full-cache run on the same prompt: :class:`RunSide` each and their
    :class:`KeptComparison` (from the runs' own kept sets)."""

    full: RunSide
    a: RunSide
    b: RunSide
    kept: KeptComparison

    def to_frame(self) -> pd.DataFrame:
        """One row per run (``full``, ``A``, ``B``): the :class:`RunSide` fields and the membership counts (of
        ``A``'s and ``B``'s kept sets; the full cache's row has none)."""
        c = self.kept.counts()
        rows = []
        for side, s in (("full", self.full), ("A", self.a), ("B", self.b)):
            d = {"side": side, **{k: getattr(s, k) for k in RunSide.__dataclass_fields__}}
            d["ids"] = list(s.ids)
            d.update({f"n_{k.replace(' ', '_')}": (math.nan if side == "full" else v) for k, v in c.items()})
            rows.append(d)
        return pd.DataFrame(rows)


def _side(r: GenerationResult, label: str, full: GenerationResult) -> RunSide:
    if r.error is not None:
        raise ValueError(f"{label}: the run failed ({r.error})")
    j = r.evicted_at + 1  # the first token decoded from the evicted cache (0-based)
    kp = _as_numpy(r.kept_prompt)
    return RunSide(label=label, text=r.text, ids=tuple(r.ids), kept=int((kp >= 0).sum(-1).max()) if kp.size else 0,
                   kv_bytes=int(r.kv_bytes_after),
                   kv_ratio=r.kv_bytes_after / full.kv_bytes_after if full.kv_bytes_after else math.nan,
                   evicted_at=int(r.evicted_at), first_margin=token_margin(r, 0), margin_token=j + 1,
                   margin=token_margin(r, j), full_margin=token_margin(full, j))


def compare_runs(full: GenerationResult, a: GenerationResult, b: GenerationResult, *, layer: int | None = None,
                 group: int | None = None, labels: tuple[str, str] | None = None) -> RunComparison:
    """The :class:`RunComparison` of runs ``a`` and ``b`` against the full-cache run ``full`` (same prompt,
    logits kept); ``labels`` as :func:`compare_kept`'s."""
    if full.T != a.T:
        raise ValueError(f"full: must be a run on the same prompt as a (T = {a.T}), got T = {full.T}")
    kept = compare_kept(a, b, layer=layer, group=group, labels=labels)
    return RunComparison(full=_side(full, "full cache", full), a=_side(a, kept.label_a, full),
                         b=_side(b, kept.label_b, full), kept=kept)
