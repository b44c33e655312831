"""GQA unions and pages (SPEC §8, paper §7).

Pure functions of per-head key scores ``a^{l,h}_j`` (for example the observer means of SPEC §0) and
group weights ``w_h`` (SPEC §2, :class:`~workbench.analyse.pooling.HeadPooling`):

- per-head keep sets ``𝒦_h`` = top-``s`` keys of head ``h``; union-over-retained ratio
  ``UOR_g = |∪_{h∈ℋ_g} 𝒦_h| / s`` with ``1 ≤ UOR_g ≤ min{r, T/s}``;
- pages of ``b`` consecutive tokens (``N_P = ⌈T/b⌉``; the last page may be shorter);
  group score ``p_{l,g}(j) = Σ_{h∈ℋ_g} w_h a^h_j``; page importance
  ``I_{l,g}(P) = max_{j∈P} p_{l,g}(j)``; top-``K`` pages per group ``𝒦_{l,g}`` (ties: lower page
  index first); union ``U_l = |∪_g 𝒦_{l,g}|`` with ``K ≤ U_l ≤ min{GK, N_P}``;
- lemma: a token with ``p_{l,g}(j) > 1/(K+1)`` always has its page kept (when ``Σ_j p_{l,g}(j) ≤ 1``:
  ``K+1`` pages with importance above ``1/(K+1)`` would need more than unit mass);
- KV payload in bytes (``e`` bytes per element, head dim ``d``): per-group pages
  ``2 e d b Σ_{l,g} K_{l,g}``; union materialisation ``2 e d b G Σ_l U_l``; dense retained cache
  ``2 e L G d T'``.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from workbench.analyse.pooling import PoolingResult, group_onehot
from workbench.analyse.ranking import topk_mask
from workbench.checks import Interval, check_fields
from workbench.constraints import PARAMS, checked, count_upto, register_all, shared

__all__ = [
    "keep_sets",
    "union_over_retained",
    "group_scores",
    "page_importance",
    "top_pages",
    "page_union",
    "page_token_mask",
    "payload_bytes",
    "PageSelection",
    "PageResult",
    "PageScoreMemo",
]

_CHECKS = register_all("pages", {"b": PARAMS["page"], "K": PARAMS["K"], "s": Interval("int", 1),
                                 "d": Interval("int", 1)}, __name__)
"""The page functions' scalar arguments: the page size ``b``, pages kept ``K``, keys per head ``s``, head dim ``d``."""


# ----------------------------------------------------------------------------- per-head keep sets
def keep_sets(scores: Tensor, s: int) -> Tensor:
    """Per-head keep sets ``𝒦_h``: the top-``s`` keys of each head's score (ties: lower position first).

    Args:
        scores: float ``[..., H, T]`` per-head key scores.
        s: keys kept per head, ``1 ≤ s ≤ T``.

    Returns:
        bool ``[..., H, T]`` membership of ``𝒦_h``; exactly ``s`` per head.
    """
    T = scores.shape[-1]
    s = count_upto(T).check("s", s)
    return topk_mask(scores.to(torch.float64).cpu(), s)


def union_over_retained(scores: Tensor, head_group: Tensor, s: int) -> Tensor:
    """``UOR_g = |∪_{h∈ℋ_g} 𝒦_h| / s`` (SPEC §8).

    Args:
        scores: float ``[L, H_Q, T]`` per-head key scores.
        head_group: int ``[H_Q]``, ``g(h)``.
        s: keys kept per head, ``1 ≤ s ≤ T``.

    Returns:
        float64 ``[L, G]`` with ``1 ≤ UOR_g ≤ min{r, T/s}``.
    """
    if scores.dim() != 3:
        raise ValueError(f"scores: must have shape [L, H, T], got {list(scores.shape)}")
    onehot = group_onehot(head_group, scores.shape[1])  # [H_Q, G]
    K = keep_sets(scores, s).to(torch.float64)  # [L, H_Q, T]
    union = torch.einsum("lht,hg->lgt", K, onehot) > 0
    return union.sum(-1).to(torch.float64) / s


# ----------------------------------------------------------------------------- pages
def group_scores(a: Tensor, w: Tensor, head_group: Tensor) -> Tensor:
    """Group score ``p_{l,g}(j) = Σ_{h∈ℋ_g} w_h a^h_j``.

    Args:
        a: float ``[L, H_Q, T]`` per-head key scores (observer means).
        w: float ``[L, H_Q]`` head weights (sum to 1 within each group for SPEC §2 weights).
        head_group: int ``[H_Q]``.

    Returns:
        float64 ``[L, G, T]``.
    """
    if a.dim() != 3 or w.shape != a.shape[:2]:
        raise ValueError(f"a, w: must have shapes [L, H, T] and [L, H], got {list(a.shape)} and {list(w.shape)}")
    onehot = group_onehot(head_group, a.shape[1])
    return torch.einsum("lh,lht,hg->lgt", w.to(torch.float64), a.to(torch.float64), onehot)


def page_importance(p: Tensor, b: int) -> Tensor:
    """``I(P) = max_{j∈P} p(j)`` over pages of ``b`` tokens; the last page may be shorter.

    Args:
        p: float ``[..., T]``.
        b: page size in tokens, ``≥ 1``.

    Returns:
        ``[..., N_P]`` with ``N_P = ⌈T/b⌉`` (same dtype as ``p``).
    """
    b = _CHECKS["b"].check("b", b)
    T = p.shape[-1]
    N_P = -(-T // b)
    pad = N_P * b - T
    if pad:
        fill = torch.full(p.shape[:-1] + (pad,), float("-inf"), dtype=p.dtype, device=p.device)
        p = torch.cat([p, fill], dim=-1)
    return p.reshape(p.shape[:-1] + (N_P, b)).amax(dim=-1)


def top_pages(I: Tensor, K: int) -> Tensor:
    """Top-``K`` pages per row of ``I [..., N_P]`` (ties: lower page index first); bool ``[..., N_P]``.

    ``K`` larger than ``N_P`` keeps every page.
    """
    K = _CHECKS["K"].check("K", K)
    N_P = I.shape[-1]
    if K >= N_P:
        return torch.ones(I.shape, dtype=torch.bool, device=I.device)
    return topk_mask(I, K)  # the set a stable descending sort gives, without the sort (slider path)


def page_union(selected: Tensor) -> Tensor:
    """``U_l = |∪_g 𝒦_{l,g}|`` from the per-group page selection ``selected`` bool ``[L, G, N_P]``; int64 ``[L]``."""
    return selected.any(dim=1).sum(-1)


def page_token_mask(selected: Tensor, b: int, T: int) -> Tensor:
    """Token mask of the selected pages: bool ``[..., T]`` from ``selected [..., N_P]``."""
    # numpy's repeat: torch's repeat_interleave of a bool [G, N_P] took 15–40 ms at T = 33k (a slider move's share)
    out = np.repeat(selected.cpu().numpy(), b, axis=-1)[..., :T]
    return torch.from_numpy(np.ascontiguousarray(out)).to(selected.device)


def _page_lengths(N_P: int, b: int, T: int) -> Tensor:
    """int64 ``[N_P]``: tokens in each page (``b``; the last page may be shorter)."""
    n = torch.full((N_P,), b, dtype=torch.int64)
    if N_P:
        n[-1] = T - (N_P - 1) * b
    return n


def payload_bytes(*, e: int, d: int, b: int, K_lg: Tensor, U_l: Tensor, G: int, L: int, T_retained: int) -> dict:
    """KV payload in bytes (SPEC §8).

    Args:
        e: bytes per element; d: head dim; b: page size; K_lg: int ``[L, G]`` pages kept per group;
        U_l: int ``[L]`` page union per layer; G: KV heads; L: layers; T_retained: ``T'`` tokens of a
        dense retained cache.

    Returns:
        ``{"per_group_pages": 2 e d b Σ K_{l,g}, "union": 2 e d b G Σ_l U_l, "dense": 2 e L G d T'}``.
    """
    return {
        "per_group_pages": int(2 * e * d * b * int(K_lg.sum())),
        "union": int(2 * e * d * b * G * int(U_l.sum())),
        "dense": int(2 * e * L * G * d * T_retained),
    }


# ----------------------------------------------------------------------------- the slider path
class PageScoreMemo:
    """Per-capture memo of the page selection's inputs, for sliders (a move stays ``O(L·G·T)``).

    With the group floor ``w_h = ζ/r + (1-ζ) v_h`` (SPEC §2) the group score splits as
    ``p_{l,g}(j) = ζ S_{l,g}(j) + (1-ζ) V_{l,g}(j)`` with ``S = Σ_{h∈ℋ_g} a^h_j / r`` (fixed per capture) and
    ``V = Σ_{h∈ℋ_g} v_h a^h_j`` (one per ``v``, the softmax of ``-H/τ``: keyed by its values, so a stale entry
    cannot be returned). So a ζ move costs
    ``O(L·G·T)``, a τ move one ``O(L·H·T)`` pass, and ``UOR`` (which depends on ``a`` and ``s`` only) is
    computed once per ``s``. ``p`` equals :func:`group_scores` up to float64 rounding (a few ulps).

    Args:
        a: float ``[L, H_Q, T]`` per-head key scores (the pooling's observer means; the memo is bound to it).
        head_group: int ``[H_Q]``, ``g(h)``.
        keep: how many ``V`` entries to hold.
    """

    def __init__(self, a: Tensor, head_group: Tensor, *, keep: int = 4):
        self.a = torch.as_tensor(a)
        if self.a.dim() != 3:
            raise ValueError(f"a: must have shape [L, H, T], got {list(self.a.shape)}")
        self.head_group = torch.as_tensor(head_group)
        self.onehot = group_onehot(self.head_group, self.a.shape[1])  # [H_Q, G]
        self.keep = int(keep)
        self._S: Tensor | None = None
        self._V: dict = {}
        self._uor: dict = {}
        self._last: tuple | None = None  # ((v key, ζ), p) of the last scores
        self._importance: dict = {}  # b → page importance of that p

    def _group_sum(self, weights: Tensor) -> Tensor:
        """``Σ_{h∈ℋ_g} weights_{l,h} a^h_j`` as float64 ``[L, G, T]`` (one layer at a time: no ``[L, H, T]`` copy)."""
        a, oh = self.a, self.onehot
        out = torch.empty(a.shape[0], oh.shape[1], a.shape[2], dtype=torch.float64)
        for l in range(a.shape[0]):
            out[l] = (oh * weights[l, :, None]).T @ a[l].to(torch.float64)
        return out

    def scores(self, v: Tensor, zeta: float) -> Tensor:
        """``p [L, G, T]`` for the within-group softmax ``v [L, H_Q]`` and ``ζ``."""
        v = torch.as_tensor(v, dtype=torch.float64)
        key = v.numpy().tobytes()  # [L, H_Q]: a few KB
        if self._S is None:
            r_h = self.onehot.sum(0) @ self.onehot.T  # [H_Q]
            self._S = self._group_sum((1.0 / r_h).expand(self.a.shape[0], -1))
        if self._last is not None and self._last[0] == (key, zeta):  # a K or page-size move: the same p
            return self._last[1]
        if key not in self._V:
            self._V[key] = self._group_sum(v)
            while len(self._V) > self.keep:
                self._V.pop(next(iter(self._V)))
        p = torch.mul(self._S, zeta).add_(self._V[key], alpha=1.0 - zeta)  # one pass, one allocation
        self._last, self._importance = ((key, zeta), p), {}
        return p

    def importance(self, p: Tensor, b: int) -> Tensor:
        """:func:`page_importance` of the last :meth:`scores` ``p`` (memoised per page size ``b``: a K move
        re-ranks the pages without re-reading ``p``)."""
        if self._last is None or p is not self._last[1]:
            return page_importance(p, b)
        if b not in self._importance:
            self._importance[b] = page_importance(p, b)
        return self._importance[b]

    def uor(self, s: int) -> Tensor:
        """``UOR_g`` float64 ``[L, G]`` of :func:`union_over_retained` (memoised per ``s``)."""
        s = min(_CHECKS["s"].check("s", s), self.a.shape[-1])
        if s not in self._uor:
            self._uor[s] = union_over_retained(self.a, self.head_group, s)
        return self._uor[s]


# ----------------------------------------------------------------------------- parameters and result
@dataclass
class PageResult:
    """Output of :meth:`PageSelection.select` (SPEC §8).

    Attributes:
        p: float64 ``[L, G, T]`` group scores ``p_{l,g}(j)``.
        importance: float64 ``[L, G, N_P]`` page importance ``I_{l,g}(P)``.
        selected: bool ``[L, G, N_P]`` the top-``K`` pages ``𝒦_{l,g}``.
        K_lg: int64 ``[L, G]`` pages kept per group (``min(K, N_P)``).
        U: int64 ``[L]`` page union ``U_l``.
        uor: float64 ``[L, G]`` ``UOR_g`` of the per-head top-``s`` keep sets.
        token_mask: bool ``[L, G, T]`` tokens of the selected pages (a property: built when read).
        b, K, s, e, d: parameters; ``bytes``: the three payloads of :func:`payload_bytes`
            (``T'`` = tokens of the largest per-layer page union: the length of a dense
            rectangular cache that would hold every layer's union).
    """

    p: Tensor
    importance: Tensor
    selected: Tensor
    K_lg: Tensor
    U: Tensor
    uor: Tensor
    b: int
    K: int
    s: int
    e: int
    d: int
    bytes: dict

    @property
    def L(self) -> int:
        return int(self.p.shape[0])

    @property
    def token_mask(self) -> Tensor:
        """bool ``[L, G, T]``: tokens of the selected pages (``O(L·G·T)``, so built only when read)."""
        return page_token_mask(self.selected, self.b, int(self.p.shape[-1]))

    def token_mask_of(self, layer: int) -> Tensor:
        """bool ``[G, T]``: ``token_mask[layer]`` without building the other layers' (``O(G·T)``: a figure's move)."""
        return page_token_mask(self.selected[layer], self.b, int(self.p.shape[-1]))

    @property
    def G(self) -> int:
        return int(self.p.shape[1])

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, group): ``layer, group, K, U_layer, N_P, uor, kept_tokens, max_p, max_I_dropped``."""
        L, G, N_P = self.importance.shape
        dropped = self.importance.masked_fill(self.selected, float("-inf")).amax(-1)
        return pd.DataFrame(
            {
                "layer": torch.arange(L).repeat_interleave(G).numpy(),
                "group": torch.arange(G).repeat(L).numpy(),
                "K": self.K_lg.reshape(-1).numpy(),
                "U_layer": self.U.repeat_interleave(G).numpy(),
                "N_P": N_P,
                "uor": self.uor.reshape(-1).numpy(),
                "kept_tokens": (self.selected.to(torch.int64) @ _page_lengths(N_P, self.b, int(self.p.shape[-1])))
                .reshape(-1).numpy(),
                "max_p": self.p.amax(-1).reshape(-1).numpy(),
                "max_I_dropped": dropped.reshape(-1).numpy(),
            }
        )


@checked("pages")
@dataclass(frozen=True)
class PageSelection:
    """Parameters of page selection (SPEC §8).

    Attributes:
        b: page size in tokens, ``≥ 1``.
        K: pages kept per layer and KV group, ``≥ 1`` (capped at ``N_P``).
        s: keys per head for the ``UOR`` diagnostic, ``≥ 1`` (capped at ``T``).
        e: bytes per KV element (2 for bf16/fp16, 4 for fp32), ``≥ 1``.
    """

    b: int = 16
    K: int = 8
    s: int = 64
    e: int = 2
    _parameter_constraints: ClassVar = {**shared("K"), "b": PARAMS["page"], "s": _CHECKS["s"],
                                        "e": Interval("int", 1)}

    def __post_init__(self):
        check_fields(self)

    def select(self, a: Tensor, w: Tensor, head_group: Tensor, d: int, *, memo: PageScoreMemo | None = None,
               pooling: PoolingResult | None = None) -> PageResult:
        """Select the top-``K`` pages of every layer and KV group.

        Args:
            a: float ``[L, H_Q, T]`` per-head key scores ``a^h_j`` (e.g. observer means).
            w: float ``[L, H_Q]`` head weights ``w_h`` (SPEC §2; sum to 1 within each group).
            head_group: int ``[H_Q]``, ``g(h)``.
            d: head dim (for the byte counts).
            memo: a :class:`PageScoreMemo` of ``a`` (the slider path): with ``pooling``, the
                :class:`~workbench.analyse.pooling.PoolingResult` that made ``a`` and ``w`` (its within-group
                softmax ``v`` and its ``ζ``), the group scores and ``UOR`` come from it (equal to the direct
                computation up to float64 rounding). ``ζ`` is read from the pooling, so it cannot disagree
                with the ``w`` it made.
        """
        a = torch.as_tensor(a)
        w = torch.as_tensor(w)
        if a.dim() != 3:
            raise ValueError(f"a: must have shape [L, H, T], got {list(a.shape)}")
        L, H, T = a.shape
        if memo is not None:
            if memo.a is not a or pooling is None or pooling.a is not a or pooling.w is not w:
                raise ValueError("memo: must be a PageScoreMemo of this `a`, given with the pooling "
                                 "(PoolingResult) that made `a` and `w`")
            if not math.isfinite(pooling.zeta):
                raise ValueError(f"pooling: must know the zeta that made it (HeadPooling.pool), got zeta = "
                                 f"{pooling.zeta}")
            p = memo.scores(pooling.v, pooling.zeta)
        else:
            p = group_scores(a, w, head_group)
        G = p.shape[1]
        I = memo.importance(p, self.b) if memo is not None else page_importance(p, self.b)
        sel = top_pages(I, self.K)
        K_lg = sel.sum(-1)
        U = page_union(sel)
        uor = memo.uor(self.s) if memo is not None else union_over_retained(a, head_group, min(self.s, T))
        T_ret = int((sel.any(dim=1).to(torch.int64) @ _page_lengths(sel.shape[-1], self.b, T)).max()) if L else 0
        d = _CHECKS["d"].check("d", d)
        by = payload_bytes(e=self.e, d=d, b=self.b, K_lg=K_lg, U_l=U, G=G, L=L, T_retained=T_ret)
        return PageResult(p=p, importance=I, selected=sel, K_lg=K_lg, U=U, uor=uor,
                          b=self.b, K=self.K, s=min(self.s, T), e=self.e, d=d, bytes=by)

    def union_by_K(self, Ks, a: Tensor, w: Tensor, head_group: Tensor, d: int) -> pd.DataFrame:
        """The page union against the pages kept: one row per ``K`` in ``Ks`` (this selection with that ``K``),
        columns ``K``, ``union`` (``U_l`` averaged over the layers), ``lower`` = ``min{K, N_P}`` and ``upper`` =
        ``min{GK, N_P}`` (the bounds ``K ≤ U_l ≤ min{GK, N_P}``). Arguments as :meth:`select`."""
        Ks = [_CHECKS["K"].check("K", K) for K in Ks]
        if not Ks:
            raise ValueError("Ks: must hold at least one K, got none")
        rows = []
        for K in Ks:
            pr = dataclasses.replace(self, K=K).select(a, w, head_group, d)
            G, N_P = pr.importance.shape[1:]
            rows.append({"K": K, "union": float(pr.U.double().mean()), "lower": min(K, N_P), "upper": min(G * K, N_P)})
        out = pd.DataFrame(rows)
        out.attrs.update(b=self.b, s=self.s, e=self.e)
        return out
