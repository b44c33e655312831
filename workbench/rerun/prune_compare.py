"""Two pruned-prefill settings side by side on the same prompt (the prune panel's compare mode).

The retained prompt positions of a setting (:func:`retained_set`) come from its trace (predicted: the positions
outside the chunks removed at ``l*``, or at a fixed layer; all of them on a bypass) or from its run
(:attr:`~workbench.rerun.prune.PruneResult.retained`); two of them give a
:class:`~workbench.rerun.eviction.compare.KeptComparison`. :func:`compare_pruned` puts two runs beside the full
prefill (:class:`PruneComparison`): answers, ``T'``, KV bytes after the prefill and the first-token margin
(top-1 − top-2 logit, :func:`~workbench.rerun.stability.logit_margin`), which pruning changes (the first token is
decided by the pruned prefill).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from workbench.analyse.procedure import TraceResult
from workbench.rerun.eviction.compare import KeptComparison
from workbench.rerun.prune import PruneResult
from workbench.rerun.stability import logit_margin

__all__ = ["retained_set", "compare_retained", "PruneSide", "PruneComparison", "compare_pruned"]


def retained_set(source, spans=None, layer: int | None = None) -> frozenset[int]:
    """The prompt positions a pruned prefill keeps: a :class:`PruneResult`'s ``retained``; or, from a
    :class:`TraceResult` and the prompt's ``spans``, the positions outside the chunks removed at ``layer``
    (default: the trace's ``l*``; every position on a bypass)."""
    if isinstance(source, PruneResult):
        return frozenset(int(p) for p in source.retained.tolist())
    if not isinstance(source, TraceResult):
        raise ValueError(f"source: must be a PruneResult or a TraceResult, got {type(source).__name__}")
    if spans is None:
        raise ValueError("spans: a trace's retained set needs the prompt's spans")
    if layer is None:
        chunks = list(source.removed) if source.l_star is not None else []
    else:
        sel = source.selections.get(layer)
        if sel is None:
            raise ValueError(f"layer: no selection at layer {layer}; the trace selected at {sorted(source.selections)}")
        chunks = list(sel.removed)
    mask = spans.removal_mask(chunks).tolist()
    return frozenset(p for p in range(spans.T) if not mask[p])


def compare_retained(a: frozenset, b: frozenset, T: int, labels: tuple[str, str]) -> KeptComparison:
    """The :class:`KeptComparison` of two retained sets on a prompt of ``T`` positions."""
    return KeptComparison(T=T, label_a=labels[0], label_b=labels[1], kept_a=frozenset(a), kept_b=frozenset(b))


@dataclass(frozen=True)
class PruneSide:
    """One prefill of a comparison: label, answer, where it pruned (``l_star``, ``None``: bypass or the full
    prefill), retained length ``T_prime``, KV bytes after the prefill and the first-token margin."""

    label: str
    text: str
    ids: tuple[int, ...]
    l_star: int | None
    T_prime: int
    kv_bytes: int
    kv_ratio: float
    first_token: int
    first_margin: float


@dataclass(frozen=True)
class PruneComparison:
    """Two pruned prefills ``A`` and ``B`` beside the full prefill, and the comparison of their retained sets."""

    full: PruneSide
    a: PruneSide
    b: PruneSide
    kept: KeptComparison

    def to_frame(self) -> pd.DataFrame:
        """One row per prefill (``full``, ``A``, ``B``): the :class:`PruneSide` fields and the membership counts
        (the full prefill's row has none)."""
        c = self.kept.counts()
        rows = []
        for side, s in (("full", self.full), ("A", self.a), ("B", self.b)):
            d = {"side": side, **{k: getattr(s, k) for k in PruneSide.__dataclass_fields__}, "ids": list(s.ids)}
            d.update({f"n_{k.replace(' ', '_')}": (math.nan if side == "full" else v) for k, v in c.items()})
            rows.append(d)
        return pd.DataFrame(rows)


def _side(r, label: str, full) -> PruneSide:
    return PruneSide(label=label, text=r.text, ids=tuple(r.generated_ids), l_star=getattr(r, "l_star", None),
                     T_prime=int(getattr(r, "T_prime", r.T)), kv_bytes=int(r.kv_bytes),
                     kv_ratio=r.kv_bytes / full.kv_bytes if full.kv_bytes else math.nan,
                     first_token=int(r.first_logits.argmax()), first_margin=logit_margin(r.first_logits))


def compare_pruned(full, a: PruneResult, b: PruneResult, labels: tuple[str, str]) -> PruneComparison:
    """The :class:`PruneComparison` of pruned runs ``a`` and ``b`` against ``full``
    (:func:`~workbench.rerun.prune.run_full`), all on the same prompt."""
    for name, r in (("a", a), ("b", b)):
        if not isinstance(r, PruneResult):
            raise ValueError(f"{name}: must be a PruneResult, got {type(r).__name__}")
        if r.T != full.T:
            raise ValueError(f"{name}: must be a run on the same prompt as full (T = {full.T}), got T = {r.T}")
    kept = compare_retained(retained_set(a), retained_set(b), full.T, labels)
    return PruneComparison(full=_side(full, "full prefill", full), a=_side(a, labels[0], full),
                           b=_side(b, labels[1], full), kept=kept)
