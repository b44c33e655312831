"""Prefill-vs-first-decode attention shift (SPEC §9, deferkv-guide.md).

From a capture with prompt-tail rows ``r = -W+1 … 0`` (query positions ``T-W … T-1``) and decode
rows ``r = 1 … n`` (the query of the ``r``-th generated token, position ``T+r-1``):

- every row is restricted to the prompt keys ``[0, T)`` and renormalised, per layer and query head;
  the KV-group row is the average of the renormalised probabilities over the group's heads;
- Jensen–Shannon divergence between adjacent rows ``r → r+1`` (natural log, in ``[0, ln 2]``);
- top-``k`` recall of each row against the future reference ``F`` (the mean of the decode rows
  ``ref_start … ref_end`` of this capture, or of a longer capture of the whole answer):
  ``recall_r = |top_k(A_r) ∩ top_k(F)| / k``;
- boundary leap: the recall gain across the prefill/decode boundary ``0 → 1`` against the gains
  ``1 → 2`` and ``2 → 3`` (the guide's claim is ``Δ(0→1) ≫ Δ(1→2) ≈ Δ(2→3)``).

**[decided]** The default reference is **held out behind a gap**: decode rows ``6 … n``, after the compared rows
``1 … 3`` and :data:`HELD_OUT_GAP` = 2 rows (``ref_start=None``). A step into a row that abuts the reference gains
recall by construction (with the reference from row 4 the largest step was 3→4), so steps that touch the gap or the
reference are ``clear = False`` in :meth:`ShiftResult.step_frame` and left out of :func:`step_gains`. Too few decode
rows: the mean of all of them, with a :class:`ShiftWarning`. ``ref_start = 1`` is SPEC's definition.

Leap specificity: :meth:`ShiftResult.step_frame` gives every adjacent step's recall gain, :func:`step_gains` its
mean with a bootstrap CI across prompts, and :func:`leap_specificity` the paired comparison of ``0→1`` against the
last step inside the prompt ``−1→0`` (a boundary effect beats it, a tail effect does not). Arithmetic is float64.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from workbench.analyse.pooling import group_onehot
from workbench.analyse.ranking import topk_mask
from workbench.analyse.rows import check_capture_rows
from workbench.analyse.stats import bootstrap_ci, paired
from workbench.checks import Choice, Interval, check_fields, optional
from workbench.choices import SHIFT_LEVELS, ShiftLevel
from workbench.constraints import PARAMS, checked, count_upto, register_all, shared

if TYPE_CHECKING:
    from workbench.capture.data import Capture

__all__ = ["shift_rows", "group_rows", "jsd", "topk_recall", "ShiftAnalysis", "ShiftResult", "ShiftWarning",
           "step_gains", "leap_specificity", "HELD_OUT_AFTER", "HELD_OUT_GAP"]

HELD_OUT_AFTER = 3  # the leap compares decode rows 1 … 3; the held-out reference starts after them
HELD_OUT_GAP = 2  # decode rows between the compared rows and the reference: no measured step touches them
SHIFT_CHECKS = register_all("shift", {"level": Choice(SHIFT_LEVELS)}, __name__)
"""The shift analysis' static arguments (``level``: KV groups or query heads)."""


class ShiftWarning(UserWarning):
    """The default held-out reference is not available (too few decode rows)."""


def _renorm(rows: Tensor) -> Tensor:
    s = rows.sum(-1, keepdim=True)
    if (s <= 0).any():
        raise ValueError("rows: a row has no mass on the prompt keys; cannot renormalise")
    return rows / s


def shift_rows(capture: Capture, W: int | None = None) -> tuple[Tensor, Tensor]:
    """Prompt-tail and decode rows of a capture, restricted to the prompt keys and renormalised.

    Args:
        capture: a :class:`~workbench.capture.data.Capture` with rows of kind ``"tail"`` and
            ``"decode"``.
        W: use only the last ``W`` tail rows (default: every tail row captured).

    Returns:
        ``r`` int64 ``[R]`` (``-W+1 … 0, 1 … n``) and ``P`` float64 ``[L, H_Q, R, T]``.
    """
    check_capture_rows(capture)  # finite, >= 0, summing to <= 1 (cached on the capture)
    T = capture.T
    tail, dec = capture.rows_of("tail"), capture.rows_of("decode")
    if dec.numel() == 0:
        raise ValueError("capture: has no decode rows (capture with RowSet(n_decode >= 1))")
    if tail.numel() == 0:
        raise ValueError("capture: has no prompt-tail rows (capture with RowSet(tail >= 1))")
    if W is not None:
        count_upto(tail.numel()).check("W", W)
        tail = tail[-W:]
    idx = torch.cat([tail, dec])
    r = capture.row_pos[idx] - T + 1
    expect = torch.cat([torch.arange(-tail.numel() + 1, 1), torch.arange(1, dec.numel() + 1)])
    if not torch.equal(r, expect):
        raise ValueError(f"capture: tail and decode rows must be contiguous (r = {r.tolist()})")
    P = _renorm(capture.attn[:, :, idx, :T].to(torch.float64))
    return r, P


def group_rows(P: Tensor, head_group: Tensor) -> Tensor:
    """KV-group rows: the average of the heads' probabilities over each group.

    Args:
        P: float ``[L, H_Q, R, T]`` (or ``[L, H_Q, T]``).
        head_group: int ``[H_Q]``.

    Returns:
        float64 ``[L, G, R, T]`` (or ``[L, G, T]``).
    """
    onehot = group_onehot(head_group, P.shape[1])
    onehot = onehot / onehot.sum(0, keepdim=True)
    return torch.einsum("lh...,hg->lg...", P.to(torch.float64), onehot)


def _neg_entropy(p: Tensor) -> Tensor:
    """``Σ_j p_j ln p_j`` over the last axis (``0 ln 0 = 0``), float64."""
    return torch.special.xlogy(p, p).sum(-1)


def jsd(p: Tensor, q: Tensor) -> Tensor:
    """Jensen–Shannon divergence over the last axis (natural log): ``½KL(p‖m) + ½KL(q‖m)``, ``m = (p+q)/2``.

    In ``[0, ln 2]``; ``0`` iff ``p = q``. Inputs are probability vectors; result float64 ``[...]``.
    Computed as ``½(Σ p ln p + Σ q ln q) − Σ m ln m`` (the same identity; three ``xlogy`` passes).
    """
    p, q = p.to(torch.float64), q.to(torch.float64)
    return _jsd_from(p, q, _neg_entropy(p), _neg_entropy(q))


def _jsd_from(p: Tensor, q: Tensor, Ep: Tensor, Eq: Tensor) -> Tensor:
    m = 0.5 * (p + q)
    return (0.5 * (Ep + Eq) - _neg_entropy(m)).clamp(0.0, math.log(2.0))


def adjacent_jsd(P: Tensor) -> Tensor:
    """JSD between adjacent rows ``P[..., r, :]`` and ``P[..., r+1, :]``: float64 ``[..., R-1]``.
    Each row's ``Σ p ln p`` is computed once and shared by its two pairs."""
    P = P.to(torch.float64)
    E = _neg_entropy(P)
    return _jsd_from(P[..., :-1, :], P[..., 1:, :], E[..., :-1], E[..., 1:])


def topk_recall(rows: Tensor, ref: Tensor, k: int) -> Tensor:
    """``|top_k(row) ∩ top_k(ref)| / k`` for every row (ties in a top-``k``: lower position first).

    Args:
        rows: float ``[..., R, T]``.
        ref: float ``[..., T]``.
        k: ``1 ≤ k ≤ T``.

    Returns:
        float64 ``[..., R]`` in ``[0, 1]``.
    """
    T = rows.shape[-1]
    count_upto(T).check("k", k)
    # ties: the lower position first (as a stable sort would), so the result does not depend on the kernel
    in_rows = topk_mask(rows.to(torch.float64), k)
    in_ref = topk_mask(ref.to(torch.float64), k)
    hit = in_rows & in_ref.unsqueeze(-2)
    return hit.sum(-1).to(torch.float64) / k


def _ranks(x: Tensor) -> Tensor:
    """Descending rank of every entry over the last axis (0 = largest; ties: the lower position first, as a
    stable sort). ``j`` is in ``top_k`` iff ``rank_j < k``, the set :func:`topk_recall` uses. int16 when it
    fits (``T ≤ 32767``), else int32; same shape as ``x``."""
    T = x.shape[-1]
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices
    dtype = torch.int16 if T <= torch.iinfo(torch.int16).max else torch.int32
    rank = torch.empty(x.shape, dtype=dtype)
    rank.scatter_(-1, order, torch.arange(T, dtype=dtype).expand(x.shape).contiguous())
    return rank


def _order(ref: Tensor) -> Tensor:
    """Positions of ``ref`` by descending value over the last axis (ties: the lower position first)."""
    return torch.sort(ref.to(torch.float64), dim=-1, descending=True, stable=True).indices


def _hits_every_k(rank_rows: Tensor, ref_order: Tensor) -> Tensor:
    """``|top_k(row) ∩ top_k(ref)|`` for EVERY ``k`` at once (what a k slider reads), from the rows' ranks.

    With ``s_i`` the row's rank of the reference's ``i``-th position, position ``i`` is in both top-``k`` sets
    iff ``max(i, s_i) < k``; so the count at ``k`` is the number of ``m_i = max(i, s_i)`` below ``k``, a
    histogram's cumulative sum. ``O(T)`` per row for all ``k``; ties as :func:`topk_recall`.

    Args:
        rank_rows: ``[..., R, T]`` from :func:`_ranks`.
        ref_order: ``[..., T]`` from :func:`_order`.

    Returns:
        ``c`` int32 ``[..., R, T + 1]`` with ``c[..., k]`` the intersection size (``c[..., 0] = 0``).
    """
    T = rank_rows.shape[-1]
    s = rank_rows.gather(-1, ref_order.unsqueeze(-2).expand_as(rank_rows))
    m = torch.maximum(s, torch.arange(T, dtype=s.dtype))
    c = torch.zeros(*m.shape[:-1], T + 1, dtype=torch.int32)
    c.scatter_add_(-1, m.to(torch.int64) + 1, torch.ones(m.shape, dtype=torch.int32))
    return c.cumsum(-1, dtype=torch.int32)


def _prepared(capture: Capture) -> dict:
    """The parameter-free part of the shift analysis, memoised on the capture (what the sliders reuse):
    ``r`` over every tail row, the adjacent JSD (head and group level) and the rows' key ranks.
    ``k``, the reference and ``W`` then cost a gather and a slice instead of seconds at T = 2k."""
    def build():
        r, P = shift_rows(capture)
        Pg = group_rows(P, capture.head_group)
        return {"r": r, "jsd_head": adjacent_jsd(P), "jsd_group": adjacent_jsd(Pg),
                "rank_head": _ranks(P), "rank_group": _ranks(Pg), "hits": {}}

    return capture.cached("shift_prepared", build)


@dataclass
class ShiftResult:
    """Shift metrics of one capture (SPEC §9).

    Attributes:
        r: int64 ``[R]`` row indices ``-W+1 … n``.
        jsd_head: float64 ``[L, H_Q, R-1]``, ``JSD(A_r, A_{r+1})`` per query head.
        jsd_group: float64 ``[L, G, R-1]``, the same per KV group.
        recall_head: float64 ``[L, H_Q, R]`` top-``k`` recall against the reference.
        recall_group: float64 ``[L, G, R]``.
        k: top-``k``; ref_start, ref_end: the reference is the mean of decode rows ``ref_start … ref_end``.
    """

    r: Tensor
    jsd_head: Tensor
    jsd_group: Tensor
    recall_head: Tensor
    recall_group: Tensor
    k: int
    ref_start: int
    ref_end: int
    _leap: pd.DataFrame | None = field(default=None, init=False, repr=False, compare=False)

    def _levels(self):
        return (("head", self.recall_head, self.jsd_head), ("group", self.recall_group, self.jsd_group))

    def to_frame(self) -> pd.DataFrame:
        """Long table: ``level, layer, unit, r, recall, jsd_next`` (``jsd_next`` = JSD to row ``r+1``; NaN for the last)."""
        parts = []
        R = self.r.numel()
        for level, rec, js in self._levels():
            L, U, _ = rec.shape
            jn = torch.cat([js, torch.full((L, U, 1), float("nan"), dtype=torch.float64)], dim=-1)
            parts.append(pd.DataFrame({
                "level": level,
                "layer": np.repeat(np.arange(L), U * R),
                "unit": np.tile(np.repeat(np.arange(U), R), L),
                "r": np.tile(self.r.numpy(), L * U),
                "recall": rec.reshape(-1).numpy(),
                "jsd_next": jn.reshape(-1).numpy(),
            }))
        return pd.concat(parts, ignore_index=True)

    def _at(self, t: Tensor, r: int) -> Tensor:
        hit = (self.r == r).nonzero().flatten()
        if hit.numel() == 0:
            return torch.full(t.shape[:2], float("nan"), dtype=torch.float64)
        return t[..., int(hit[0])]

    def leap_frame(self) -> pd.DataFrame:
        """Boundary leap per level, layer and unit.

        Columns: ``gain_m10, gain_01, gain_12, gain_23`` (recall gains ``-1→0`` (the last step inside the
        prompt, for comparison), ``0→1, 1→2, 2→3``), ``jsd_m10, jsd_01, jsd_12, jsd_23`` and ``leap``
        (``gain_01 > max(gain_12, gain_23)``). Missing rows give NaN. Built once per result (the figure and
        :meth:`summary` both read it on every slider move); each call returns a copy.
        """
        if self._leap is None:
            self._leap = self._leap_frame()
        return self._leap.copy()

    def _leap_frame(self) -> pd.DataFrame:
        parts = []
        for level, rec, js in self._levels():
            L, U, _ = rec.shape
            g = {"gain_m10": self._at(rec, 0) - self._at(rec, -1)}
            g.update({f"gain_{a}{b}": (self._at(rec, b) - self._at(rec, a)) for a, b in ((0, 1), (1, 2), (2, 3))})
            jr = self.r[:-1]
            j = {}
            for a in (-1, 0, 1, 2):
                hit = (jr == a).nonzero().flatten()
                name = "jsd_m10" if a == -1 else f"jsd_{a}{a + 1}"
                j[name] = js[..., int(hit[0])] if hit.numel() else torch.full((L, U), float("nan"), dtype=torch.float64)
            df = pd.DataFrame({"level": level, "layer": np.repeat(np.arange(L), U), "unit": np.tile(np.arange(U), L)})
            for name, v in {**g, **j}.items():
                df[name] = v.reshape(-1).numpy()
            later = df[["gain_12", "gain_23"]].max(axis=1, skipna=True)
            df["leap"] = df["gain_01"] > later
            parts.append(df)
        return pd.concat(parts, ignore_index=True)

    def layer_gains(self, level: ShiftLevel = "group") -> pd.DataFrame:
        """The recall gains ``gain_m10, gain_01, gain_12, gain_23`` of :meth:`leap_frame` averaged over the
        units (heads or KV groups) of each layer; index ``layer``."""
        SHIFT_CHECKS["level"].check("level", level)
        lf = self.leap_frame()
        return lf[lf.level == level].groupby("layer")[["gain_m10", "gain_01", "gain_12", "gain_23"]].mean()

    def step_frame(self) -> pd.DataFrame:
        """The recall gain of every adjacent step, per level, layer and unit.

        Columns: ``level, layer, unit, r_from, r_to, step`` (``"-1→0"``), ``gain`` (recall at ``r_to`` minus
        recall at ``r_from``), ``jsd`` (JSD between the two rows), ``boundary`` (``r_from == 0``), ``clear`` (the
        step ends more than :data:`HELD_OUT_GAP` rows before the reference's first row, so the reference cannot
        favour it; every step against an external reference)."""
        parts = []
        rr = self.r.numpy()
        for level, rec, js in self._levels():
            L, U, R = rec.shape
            if R < 2:
                continue
            gain = (rec[..., 1:] - rec[..., :-1]).reshape(-1).numpy()
            parts.append(pd.DataFrame({
                "level": level,
                "layer": np.repeat(np.arange(L), U * (R - 1)),
                "unit": np.tile(np.repeat(np.arange(U), R - 1), L),
                "r_from": np.tile(rr[:-1], L * U),
                "r_to": np.tile(rr[1:], L * U),
                "gain": gain,
                "jsd": js.reshape(-1).numpy(),
            }))
        df = pd.concat(parts, ignore_index=True)
        df["step"] = [f"{a}→{b}" for a, b in zip(df["r_from"], df["r_to"])]
        df["boundary"] = df["r_from"] == 0
        df["clear"] = (df["r_to"] < self.ref_start - HELD_OUT_GAP) if self.ref_end >= 0 else True
        return df[["level", "layer", "unit", "r_from", "r_to", "step", "gain", "jsd", "boundary", "clear"]]

    def summary(self) -> pd.DataFrame:
        """Per level: mean recall at ``r = -1, 0, 1, 2, 3``, mean gains and JSDs (``-1→0`` … ``2→3``) and
        the fraction of (layer, unit) pairs with a boundary leap."""
        lf = self.leap_frame()
        rows = []
        for level, rec, _ in self._levels():
            d = {"level": level, "k": self.k, "ref": f"decode {self.ref_start}..{self.ref_end}"}
            for r in (-1, 0, 1, 2, 3):
                d[f"recall_{r}"] = float(self._at(rec, r).mean())
            sub = lf[lf.level == level]
            for c in ("gain_m10", "gain_01", "gain_12", "gain_23", "jsd_m10", "jsd_01", "jsd_12", "jsd_23"):
                d[c] = float(sub[c].mean())
            d["leap_fraction"] = float(sub["leap"].mean())
            rows.append(d)
        return pd.DataFrame(rows)


@checked("shift")
@dataclass(frozen=True)
class ShiftAnalysis:
    """Parameters of the shift analysis (SPEC §9).

    Attributes:
        k: top-``k`` of the recall, ``≥ 1`` (capped at ``T``).
        ref_start: the reference is the mean of decode rows ``ref_start … ref_end``, ``≥ 1``; ``None``
            (default): held out, ``HELD_OUT_AFTER + HELD_OUT_GAP + 1 = 6`` (after the compared rows ``1 … 3``
            and the gap), or ``1`` with a :class:`ShiftWarning` when the reference has no row after them; ``1`` =
            SPEC's mean of all decode steps.
        ref_end: last decode row of the reference (default ``n``; e.g. the last answer token before EOS).
        W: tail rows used (default every captured tail row), ``≥ 1``.
    """

    k: int = 32
    ref_start: int | None = None
    ref_end: int | None = None
    W: int | None = None
    _parameter_constraints: ClassVar = {**shared("k"), "ref_start": optional(PARAMS["ref_start"]),
                                        "ref_end": optional(Interval("int", 1)), "W": optional(PARAMS["W"])}

    def __post_init__(self):
        check_fields(self)
        if self.ref_end is not None:  # the reference's rows run from ref_start to ref_end
            optional(Interval("int", self.ref_start or 1)).check("ref_end", self.ref_end)

    def __call__(self, capture: Capture, reference=None) -> ShiftResult:
        """Shift metrics of ``capture``.

        Args:
            capture: a capture with tail and decode rows.
            reference: ``None`` (decode rows ``ref_start … n`` of ``capture``), another capture of the
                same prompt with more decode rows (the whole answer), or a float tensor ``[L, H_Q, T]``
                of per-head reference attention over the prompt keys.
        """
        prep = _prepared(capture)
        n_tail = int((prep["r"] <= 0).sum())
        W = n_tail if self.W is None else self.W
        count_upto(n_tail).check("W", W)
        off = n_tail - W  # the last W tail rows: a slice of the rows (and adjacent pairs) over every tail row
        r = prep["r"][off:]
        T = capture.T
        hg = capture.head_group
        L, H = capture.L, capture.H_Q
        if reference is None or hasattr(reference, "rows_of"):
            src = capture if reference is None else reference
            if src.T != T or tuple(src.spans.input_ids) != tuple(capture.spans.input_ids):
                raise ValueError("reference: must be a capture of the same prompt")
            dec = src.rows_of("decode")
            n = dec.numel()
            rs = self.ref_start
            if rs is None:
                last = n if self.ref_end is None else self.ref_end
                rs = rs_held = HELD_OUT_AFTER + HELD_OUT_GAP + 1
                if last < rs:
                    rs = 1
                    if n:
                        warnings.warn(f"ref_start: no held-out reference (decode rows after {rs_held - 1} needed, "
                                      f"the reference has {last}); using decode rows 1..{last}, which contain the "
                                      "rows compared with it (capture more decode steps)", ShiftWarning, stacklevel=2)
            if not 1 <= rs <= n:
                raise ValueError(f"ref_start: must be in [1, {n}] (decode rows of the reference), got {rs}")
            ref_end = n if self.ref_end is None else self.ref_end
            Interval("int", rs, n, note="decode rows of the reference").check("ref_end", ref_end)
            ref = lambda: _renorm(src.attn[:, :, dec[rs - 1: ref_end], :T].to(torch.float64)).mean(2)
        else:
            rs = self.ref_start or 1
            fixed = torch.as_tensor(reference).to(torch.float64)
            if fixed.shape != (L, H, T):
                raise ValueError(f"reference: must have shape {[L, H, T]}, got {list(fixed.shape)}")
            ref, ref_end = (lambda: fixed), -1

        def every_k():  # intersections for every k over every tail row: k and W then only index
            F = ref()  # [L, H_Q, T]
            return (_hits_every_k(prep["rank_head"], _order(F)),
                    _hits_every_k(prep["rank_group"], _order(group_rows(F, hg))))

        # kept per reference from this capture's own decode rows; another reference is computed each call
        key = (rs, ref_end)
        if reference is not None:
            hits = every_k()
        elif key in prep["hits"]:
            hits = prep["hits"][key]
        else:
            hits = prep["hits"][key] = every_k()
        k = min(self.k, T)
        return ShiftResult(
            r=r,
            jsd_head=prep["jsd_head"][..., off:].clone(),
            jsd_group=prep["jsd_group"][..., off:].clone(),
            recall_head=hits[0][..., off:, k].to(torch.float64) / k,
            recall_group=hits[1][..., off:, k].to(torch.float64) / k,
            k=k,
            ref_start=rs,
            ref_end=ref_end,
        )


def step_gains(results: Sequence[ShiftResult], level: ShiftLevel = "group", *, conf: float = 0.95) -> pd.DataFrame:
    """Leap specificity across prompts: the recall gain of every adjacent step the reference cannot favour (``clear``
    in :meth:`ShiftResult.step_frame`) with a bootstrap CI.

    Args:
        results: one :class:`ShiftResult` per prompt (same ``k`` and reference rule).
        level: ``"group"`` (KV groups) or ``"head"``.
    Returns:
        one row per step present in every result: ``step, r_from, r_to, n`` (prompts), ``mean`` (mean over
        prompts of the per-prompt mean gain over layers and units), ``lo, hi`` (bootstrap CI), ``median``,
        ``larger_than_boundary`` (prompts where this step gains more than ``0→1``).
    """
    if level not in ("group", "head"):
        raise ValueError(f"level: must be 'group' or 'head', got {level!r}")
    results = list(results)
    if not results:
        raise ValueError("results: must hold at least one ShiftResult")
    per = []
    for res in results:
        sf = res.step_frame()
        per.append(sf[(sf.level == level) & sf.clear].groupby(["r_from", "r_to"])["gain"].mean())
    common = sorted(set.intersection(*(set(p.index) for p in per)))
    rows = []
    bnd = [p.get((0, 1), math.nan) for p in per]
    for a, b in common:
        x = np.array([p[(a, b)] for p in per], dtype=np.float64)
        lo, hi = bootstrap_ci(x, conf)
        rows.append(dict(step=f"{a}→{b}", r_from=a, r_to=b, n=len(x), mean=float(x.mean()), lo=lo, hi=hi,
                         median=float(np.median(x)),
                         larger_than_boundary=int(sum(v > g for v, g in zip(x, bnd) if not math.isnan(g)))))
    return pd.DataFrame(rows)


def leap_specificity(results: Sequence[ShiftResult], level: ShiftLevel = "group", *, conf: float = 0.95):
    """Paired comparison, across prompts, of the boundary step ``0→1`` against the last step inside the prompt
    ``−1→0`` (per prompt: mean gain over layers and units): a :class:`workbench.analyse.stats.Paired`
    (wins = prompts where the boundary step gains more); ``.finding("0→1", "−1→0", "recall gain")`` says it."""
    st = {}
    for res in results:
        sf = res.step_frame()
        g = sf[sf.level == level].groupby(["r_from", "r_to"])["gain"].mean()
        if (0, 1) not in g.index or (-1, 0) not in g.index:
            raise ValueError("results: every result needs rows r = -1, 0 and 1 (a tail and a decode step)")
        st.setdefault("b", []).append(float(g[(0, 1)]))
        st.setdefault("i", []).append(float(g[(-1, 0)]))
    if not st:
        raise ValueError("results: must hold at least one ShiftResult")
    return paired(st["b"], st["i"], conf)
