"""The evidence every eviction policy scores with (SPEC §9, deferkv-guide.md).

A policy (``workbench.rerun.eviction.policies``, base classes in :mod:`.policies.base`) declares the
attention evidence it needs (:class:`Needs`) and scores every prompt position from that :class:`Evidence`
(``[L, G, T]``); :mod:`.select` applies the one budget rule. The helpers here turn evidence rows into
scores: :func:`group_mean`, :func:`row_sum`, :func:`pool`, :func:`renorm_rows`.

Group scores: a KV group's score is the mean over its query heads (``g(h) = h // r``) of the heads'
scores — the same convention as the shift analysis (probabilities averaged over the group's heads).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from workbench.analyse.shift import group_rows
from workbench.choices import Pooling

if TYPE_CHECKING:
    from workbench.capture.data import Capture

__all__ = ["Needs", "Evidence", "MissingEvidence", "PROVIDES", "group_mean", "row_sum", "maxpool", "pool", "renorm_rows"]

PROVIDES = {"tail": ("tail",), "observers": ("observers",), "colsum": ("colsum",), "decode1": ("decode",),
            "answer": ("decode",), "keys": ("keys", "values"), "wov": ("wov",),
            "qstats": ("q_sum", "q_outer", "q_first", "rope_cos", "rope_sin", "rope_pair"),
            "attn_inputs": ("attn_inputs",)}
"""Each :class:`Needs` field and the :class:`Evidence` fields it provides."""

_DECLARE = {f: n for n, fs in reversed(PROVIDES.items()) for f in fs}  # the first Needs field providing each
_OPTIONAL = frozenset(_DECLARE)


class MissingEvidence(ValueError, AttributeError):
    """A policy read evidence that was not captured (it did not declare it in ``needs()``, or the session did not
    capture it). A ``ValueError`` (a refused run) and an ``AttributeError`` (``hasattr(ev, "keys")`` is False)."""


@dataclass(frozen=True)
class Needs:
    """The attention evidence a policy scores with.

    Attributes:
        tail: prompt-tail rows ``r = -tail+1 … 0`` (query positions ``T-tail … T-1``).
        observers: proposal observers (the prompt's ``𝒬_p``; the last ``observers`` prompt tokens when
            the prompt has no spans); ``0`` = none.
        colsum: H2O column sums ``Σ_{u<T} A_{u,j}`` over every prompt query.
        decode1: the first decode row ``r = 1`` (the query of the first generated token, full cache).
        answer: the decode rows ``1 … n`` of the full-cache answer (``n`` = ``max_new_tokens``).
        keys: the prompt's keys and values as stored in the cache after prefill (post-RoPE keys), for the
            attention-free policies (KNorm, KeyDiff) and the value norms.
        wov: the value-output norms ``‖W_O^h v_j‖_1`` per query head (CriticalKV).
        qstats: statistics of the prompt's pre-RoPE queries and the RoPE of the next ``qstats`` positions
            ``T … T+qstats-1`` (ExpectedAttention); ``0`` = none.
        attn_inputs: every layer's attention module with its prefill inputs (hidden states, RoPE), for a
            wrapped kvpress press (``workbench.interop.kvpress``), which scores from what kvpress gives it.
    """

    tail: int = 0
    observers: int = 0
    colsum: bool = False
    decode1: bool = False
    answer: bool = False
    keys: bool = False
    wov: bool = False
    qstats: int = 0
    attn_inputs: bool = False

    def merge(self, other: "Needs") -> "Needs":
        return Needs(tail=max(self.tail, other.tail), observers=max(self.observers, other.observers),
                     colsum=self.colsum or other.colsum, decode1=self.decode1 or other.decode1,
                     answer=self.answer or other.answer, keys=self.keys or other.keys, wov=self.wov or other.wov,
                     qstats=max(self.qstats, other.qstats), attn_inputs=self.attn_inputs or other.attn_inputs)

    @classmethod
    def of(cls, policies, base: "Needs | None" = None) -> "Needs":
        """What ``policies`` need together (with ``base``): one prefill serves all of them."""
        out = cls() if base is None else base
        for p in policies:
            out = out.merge(p.needs())
        return out


@dataclass(repr=False, eq=False)
class Evidence:
    """Attention rows a policy scores with, over the prompt keys ``[0, T)``.

    Attributes:
        T: prompt length.
        L: decoder layers.
        head_group: int64 ``[H_Q]``, ``g(h)``.
        n_sink: the prompt's sink count (informational; policies use their own ``n_sink``).
        tail: float ``[L, H_Q, W, T]`` prompt-tail rows ``r = -W+1 … 0`` (each sums to 1).
        decode: float ``[L, H_Q, n, T]`` decode rows ``r = 1 … n`` restricted to the prompt keys and
            renormalised (row 1 is DeferKV's ``q_dec,1``; rows ``1 … n`` are the full-cache answer).
        observers: float ``[L, H_Q, W_p, T]`` observer rows.
        colsum: float64 ``[L, H_Q, T]`` H2O accumulated attention ``Σ_{u<T} A^{l,h}_{u,j}``.
        keys, values: float ``[L, G, T, d]`` the prompt's cache entries after prefill (keys post-RoPE).
        wov: float64 ``[L, H_Q, T]`` ``‖W_O^h v_{g(h),j}‖_1`` (the value's contribution to the layer output).
        q_sum, q_outer: float64 ``[L, H_Q, d]`` and ``[L, H_Q, d, d]``, ``Σ_i q_i`` and ``Σ_i q_i q_iᵀ`` over
            the prompt's pre-RoPE queries; q_first: float64 ``[L, H_Q, Q0, d]`` the first ``Q0 ≤ 16`` queries
            (to leave the sinks out); rope_cos, rope_sin: float64 ``[L, F, d]`` and rope_pair: int64 ``[L, d]``,
            each layer's rotary map at ``T … T+F-1`` (:class:`~workbench.run.rotary.RotaryMaps`:
            ``R(p) x = cos ⊙ x + sin ⊙ x[pair]``; a NoPE layer is the identity).
        attn_inputs: per layer ``(attention module, hidden states [1, T, D], position_embeddings)`` of the
            prefill (the inputs kvpress's hooks see).
        ties: int64 ``[L, G]`` or ``None``: cells with one id attend one stored row, so one kept set serves them
            all (:func:`~workbench.run.adapter.kv_ties`: a layer with fewer KV heads than groups, Gemma-4's
            ``num_global_key_value_heads``; layers sharing one cache, Gemma-3n and Gemma-4's
            ``num_kv_shared_layers``). The selection reads a policy's scores and tie-break through
            :meth:`pooled`: each cell gets the mean over its tie, so the kept set of a sharing group is chosen
            once, from its layers' scores pooled, and applies to every layer reading it.
    """

    T: int
    L: int
    head_group: Tensor
    n_sink: int = 4
    tail: Tensor | None = None
    decode: Tensor | None = None
    observers: Tensor | None = None
    colsum: Tensor | None = None
    keys: Tensor | None = None
    values: Tensor | None = None
    wov: Tensor | None = None
    q_sum: Tensor | None = None
    q_outer: Tensor | None = None
    q_first: Tensor | None = None
    rope_cos: Tensor | None = None
    rope_sin: Tensor | None = None
    rope_pair: Tensor | None = None
    attn_inputs: list | None = None
    ties: Tensor | None = None
    _scores: dict = field(default_factory=dict, repr=False, compare=False)

    def __getattribute__(self, name: str):
        # evidence that was not captured is refused by name where it is read (``ev.keys`` as a policy writes it),
        # not handed out as None to fail later as "'NoneType' object has no attribute ..."
        v = object.__getattribute__(self, name)
        if v is None and name in _OPTIONAL:
            raise MissingEvidence(f"evidence: {name!r} was not captured: a policy that reads it declares "
                                  f"Needs({_DECLARE[name]}=...) in needs()")
        return v

    def __repr__(self) -> str:
        have = [f.name for f in fields(self) if f.name in _OPTIONAL and self.get(f.name) is not None]
        return f"Evidence(T={self.T}, L={self.L}, G={self.G}, captured={have})"

    @property
    def G(self) -> int:
        return int(self.head_group.max()) + 1

    def get(self, name: str):
        """The evidence ``name``, or ``None`` when it was not captured (reading ``ev.<name>`` raises then)."""
        return object.__getattribute__(self, name)

    def replaced(self, **changes) -> "Evidence":
        """A copy with ``changes`` (``None`` withholds a piece of evidence) and no memoised scores."""
        kw = {f.name: self.get(f.name) for f in fields(self) if f.init and f.name != "_scores"}
        return type(self)(**{**kw, **changes})

    def require(self, name: str, what: str):
        t = self.get(name)
        if t is None:
            raise MissingEvidence(f"evidence: {what} needs {name!r} rows, which were not captured (declare "
                                  f"Needs({_DECLARE.get(name, name)}=...) in needs())")
        return t

    def scores_of(self, policy) -> Tensor:
        """``policy.scores(self)`` (``policy``: an :class:`~workbench.rerun.eviction.policies.base.EvictionPolicy`),
        memoised per policy (a frozen dataclass) for the last 8 policies, so that a budget move re-selects from
        the same scores."""
        if policy not in self._scores:
            self._scores[policy] = policy.scores(self)
            while len(self._scores) > 8:
                self._scores.pop(next(iter(self._scores)))
        return self._scores[policy]

    def forget_scores(self) -> None:
        """Drop the memoised scores of :meth:`scores_of` (the next call computes them again: what a timing of
        one policy's own scoring needs)."""
        self._scores.clear()

    def pooled(self, x: Tensor | None) -> Tensor | None:
        """``x [L, G, …]`` (a policy's scores or tie-break) with every cell replaced by the mean over its tie
        (:attr:`ties`; cells of one tie then keep one set); ``x`` itself when nothing is tied."""
        if x is None or self.ties is None:
            return x
        L, G = self.ties.shape
        if tuple(x.shape[:2]) != (L, G):
            raise ValueError(f"scores: must have shape [L={L}, G={G}, ...], got {list(x.shape)}")
        ids = torch.unique(self.ties, return_inverse=True)[1].reshape(-1)  # [L·G] dense tie ids
        flat = x.reshape(L * G, -1).to(torch.float64)
        n = int(ids.max()) + 1
        sums = torch.zeros(n, flat.shape[1], dtype=torch.float64).index_add_(0, ids, flat)
        mean = sums / torch.bincount(ids, minlength=n).to(torch.float64)[:, None]
        return mean[ids].reshape(x.shape)

    @classmethod
    def from_capture(cls, capture: Capture) -> "Evidence":
        """Evidence from a saved :class:`~workbench.capture.data.Capture` (tail, decode and observer rows;
        no H2O column sums), one row per layer with attention rows (``Capture.softmax_layers``: a hybrid's
        softmax layers, the ones an eviction compacts, as :class:`~workbench.rerun.eviction.session.EvictionSession`
        scores them)."""
        T = capture.T
        tail = capture.rows_of("tail")
        dec = capture.rows_of("decode")
        soft = capture.softmax_layers
        A = capture.attn if len(soft) == capture.L else capture.attn[soft]
        obs = None
        if all(p in set(capture.row_pos.tolist()) for p in capture.spans.observers) and capture.spans.observers:
            obs = capture.observer_attn()
            obs = obs if len(soft) == capture.L else obs[soft]
        d = None
        if dec.numel():
            d = A[:, :, dec, :T]
            d = renorm_rows(d)
        return cls(T=T, L=len(soft), head_group=capture.head_group.clone(), n_sink=capture.spans.n_sink,
                   tail=A[:, :, tail, :T] if tail.numel() else None, decode=d, observers=obs)


def renorm_rows(d: Tensor) -> Tensor:
    """Renormalise rows over their last axis; a row without mass there (a sliding-window layer's decode
    row past the prompt) stays zero."""
    s = d.sum(-1, keepdim=True)
    return torch.where(s > 0, d / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(d))


def group_mean(x: Tensor, ev: Evidence) -> Tensor:
    """Per-head scores ``x [L, H_Q, T]`` → per KV group ``[L, G, T]``: the mean over the group's heads."""
    return group_rows(x, ev.head_group)


def row_sum(parts, weights) -> Tensor:
    """``Σ_r weights[r] · rows[r]`` in float64 over rows given as float tensors ``[L, H_Q, R_i, T]`` (concatenated
    along ``R``), accumulated one row at a time: no float64 copy of the whole ``[L, H_Q, R, T]`` block (at
    T = 2k that copy made DeferKV's scoring 0.45 s; this takes 0.05 s). Returns float64 ``[L, H_Q, T]``."""
    rows = [p[:, :, i] for p in parts for i in range(p.shape[2])]
    w = [float(x) for x in weights]
    if len(w) != len(rows):
        raise ValueError(f"weights: {len(w)} given for {len(rows)} rows")
    out = torch.zeros(rows[0].shape, dtype=torch.float64)
    for a, x in zip(w, rows):
        out.add_(x, alpha=a)
    return out


def maxpool(x: Tensor, kernel: int) -> Tensor:
    """Max-pool over the key axis (stride 1, same length) of ``x [L, G, T]``."""
    if kernel == 1:
        return x
    L, G, T = x.shape
    y = F.max_pool1d(x.reshape(L * G, 1, T), kernel_size=kernel, stride=1, padding=kernel // 2)
    return y.reshape(L, G, T)


def pool(x: Tensor, kernel: int, mode: Pooling = "max") -> Tensor:
    """Pool ``x [L, G, T]`` over the key axis (stride 1, same length): ``"max"``, or ``"avg"`` (zero
    padding counted, as ``F.avg_pool1d`` and kvpress's SnapKV do)."""
    if mode not in ("max", "avg"):
        raise ValueError(f"pooling: must be 'max' or 'avg', got {mode!r}")
    if mode == "max" or kernel == 1:
        return maxpool(x, kernel)
    L, G, T = x.shape
    y = F.avg_pool1d(x.reshape(L * G, 1, T), kernel_size=kernel, stride=1, padding=kernel // 2)
    return y.reshape(L, G, T)
