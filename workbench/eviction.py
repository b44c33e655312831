"""One-shot KV-cache eviction policies on one footing (SPEC §9, deferkv-guide.md).

Every policy is a frozen dataclass whose fields are its parameters, with

- ``needs()`` — the attention evidence it scores with (:class:`Needs`);
- ``scores(ev) -> [L, G, T]`` — a pure function of that evidence (:class:`Evidence`): one score per
  layer, KV group and prompt key ``0 … T-1``;
- ``protected(T)`` — the positions it always keeps (sinks ``0 … n_sink-1`` and the last ``recent``
  prompt tokens);
- ``defer`` — the decode step after which it evicts (``0``: right after prefill; ``1``: DeferKV, after
  one decode step on the full cache).

One shared step, :func:`select_keep`, applies the budget ``B`` per layer and KV group: the protected
positions first, then the highest scores (ties: the policy's tie-break, then the lower position),
returned sorted by position; :func:`generate_with_policy` compacts the model's own KV cache in place
with it and keeps decoding at the original positions (RoPE position ``T + t - 1`` for the ``t``-th
generated token, not the compacted length).

Budget convention (the spec is silent; chosen so that all policies hold the same number of entries at
every later decode step): ``B`` counts **prompt** positions. Tokens generated before the eviction (one,
for DeferKV) are protected and kept in addition, so after eviction every policy's cache holds ``B`` prompt
entries plus the tokens generated so far. ``B ≥ T`` keeps every prompt position (no eviction).

Group scores: a KV group's score is the mean over its query heads (``g(h) = h // r``) of the heads'
scores — the same convention as the shift analysis (probabilities averaged over the group's heads).

Sliding-window layers (Gemma-style) are not compacted: they already hold only their window, and their
masks depend on the absolute token count; :attr:`GenerationResult.compacted_layers` says which layers
were. The budget applies to the full-attention layers.
"""
from __future__ import annotations

import abc
import contextlib
import math
import numbers
import time
from dataclasses import dataclass, field, fields
from typing import ClassVar

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from . import adapter
from .capture import capture_attention
from .pages import page_importance, group_scores
from .pooling import HeadPooling
from .shift import group_rows

__all__ = [
    "Needs", "Evidence", "EvictionPolicy", "FullCache", "StreamingLLM", "H2O", "SnapKV", "DeferKV",
    "PageEntroKV", "RandomKV", "OracleKV", "ALL_POLICIES", "default_policies", "select_keep",
    "protected_mask", "deferkv_alpha", "GenerationResult", "EvictionSession", "generate_with_policy",
    "run_policies", "token_positions", "survival_table",
]


# ----------------------------------------------------------------------------- validation helpers
def _check_int(name: str, value, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo or (hi is not None and value > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name}: must be an integer {rng}, got {value!r}")
    return int(value)


def _check_real(name: str, value, lo: float | None = None, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name}: must be a finite real number, got {value!r}")
    x = float(value)
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        rng = f"in [{lo}, {hi}]" if lo is not None and hi is not None else (f">= {lo}" if lo is not None else f"<= {hi}")
        raise ValueError(f"{name}: must be {rng}, got {value!r}")
    return x


def _check_kernel(value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1 or value % 2 == 0:
        raise ValueError(f"kernel: must be an odd integer >= 1 (1 = no pooling), got {value!r}")


# ----------------------------------------------------------------------------- evidence
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
    """

    tail: int = 0
    observers: int = 0
    colsum: bool = False
    decode1: bool = False
    answer: bool = False

    def merge(self, other: "Needs") -> "Needs":
        return Needs(tail=max(self.tail, other.tail), observers=max(self.observers, other.observers),
                     colsum=self.colsum or other.colsum, decode1=self.decode1 or other.decode1,
                     answer=self.answer or other.answer)


@dataclass
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
    """

    T: int
    L: int
    head_group: Tensor
    n_sink: int = 4
    tail: Tensor | None = None
    decode: Tensor | None = None
    observers: Tensor | None = None
    colsum: Tensor | None = None

    @property
    def G(self) -> int:
        return int(self.head_group.max()) + 1

    def require(self, name: str, what: str):
        t = getattr(self, name)
        if t is None:
            raise ValueError(f"evidence: {what} needs {name!r} rows, which were not captured")
        return t

    @classmethod
    def from_capture(cls, capture) -> "Evidence":
        """Evidence from a saved :class:`~workbench.capture_data.Capture` (tail, decode and observer rows;
        no H2O column sums)."""
        T = capture.T
        tail = capture.rows_of("tail")
        dec = capture.rows_of("decode")
        obs = None
        if all(p in set(capture.row_pos.tolist()) for p in capture.spans.observers) and capture.spans.observers:
            obs = capture.observer_attn()
        d = None
        if dec.numel():
            d = capture.attn[:, :, dec, :T]
            d = _renorm_rows(d)
        return cls(T=T, L=capture.L, head_group=capture.head_group.clone(), n_sink=capture.spans.n_sink,
                   tail=capture.attn[:, :, tail, :T] if tail.numel() else None, decode=d, observers=obs)


# ----------------------------------------------------------------------------- selection
def _renorm_rows(d: Tensor) -> Tensor:
    """Renormalise rows over their last axis; a row without mass there (a sliding-window layer's decode
    row past the prompt) stays zero."""
    s = d.sum(-1, keepdim=True)
    return torch.where(s > 0, d / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(d))


def protected_mask(T: int, n_sink: int, recent: int) -> Tensor:
    """Sinks ``0 … n_sink-1`` and the last ``recent`` prompt positions; bool ``[T]``."""
    m = torch.zeros(T, dtype=torch.bool)
    m[: min(n_sink, T)] = True
    if recent > 0:
        m[max(0, T - recent):] = True
    return m


def select_keep(scores: Tensor, budget: int, protected: Tensor, tiebreak: Tensor | None = None) -> Tensor:
    """The shared selection step: ``B`` prompt positions per layer and KV group.

    Protected positions always; then the highest ``scores`` (ties: higher ``tiebreak``, then lower
    position). ``B ≥ T`` keeps every position.

    Args:
        scores: float ``[L, G, T]``.
        budget: ``B``, an integer ``≥ |protected|`` (or ``≥ T``).
        protected: bool ``[T]``.
        tiebreak: optional float ``[L, G, T]`` secondary key.

    Returns:
        int64 ``[L, G, min(B, T)]`` kept positions, sorted increasingly in every row.
    """
    if scores.dim() != 3:
        raise ValueError(f"scores: must have shape [L, G, T], got {list(scores.shape)}")
    L, G, T = scores.shape
    if protected.shape != (T,):
        raise ValueError(f"protected: must have shape [{T}], got {list(protected.shape)}")
    B = _check_int("budget", budget, 1)
    n_prot = int(protected.sum())
    if B >= T:
        return torch.arange(T).expand(L, G, T).clone()
    if B < n_prot:
        raise ValueError(f"budget: must be >= {n_prot} (the protected sinks and recent window) or >= T={T}, got {B}")
    s = scores.detach().to(torch.float64).cpu()
    if torch.isnan(s).any():
        raise ValueError("scores: contain NaN")
    key = s.masked_fill(protected[None, None, :], float("inf"))
    order = torch.arange(T).expand(L, G, T)
    if tiebreak is not None:
        tb = tiebreak.detach().to(torch.float64).cpu()
        o = torch.sort(tb, dim=-1, descending=True, stable=True).indices
        order = o
        key = torch.gather(key, -1, o)
    o2 = torch.sort(key, dim=-1, descending=True, stable=True).indices
    order = torch.gather(order, -1, o2)
    return torch.sort(order[..., :B], dim=-1).values


def _row_sum(parts, weights) -> Tensor:
    """``Σ_r weights[r] · rows[r]`` in float64 over rows given as float tensors ``[L, H, R_i, T]`` (concatenated
    along ``R``), accumulated one row at a time: no float64 copy of the whole ``[L, H, R, T]`` block (at
    T = 2k that copy made DeferKV's scoring 0.45 s; this takes 0.05 s). Returns float64 ``[L, H, T]``."""
    rows = [p[:, :, i] for p in parts for i in range(p.shape[2])]
    w = [float(x) for x in weights]
    if len(w) != len(rows):
        raise ValueError(f"weights: {len(w)} given for {len(rows)} rows")
    out = torch.zeros(rows[0].shape, dtype=torch.float64)
    for a, x in zip(w, rows):
        out.add_(x, alpha=a)
    return out


def _maxpool(x: Tensor, kernel: int) -> Tensor:
    """Max-pool over the key axis (stride 1, same length) of ``x [L, G, T]``."""
    if kernel == 1:
        return x
    L, G, T = x.shape
    y = F.max_pool1d(x.reshape(L * G, 1, T), kernel_size=kernel, stride=1, padding=kernel // 2)
    return y.reshape(L, G, T)


def deferkv_alpha(W: int, lam: float, decode_weight: float | None = None) -> Tensor:
    """DeferKV's temporal weights over ``r = -W+1 … 0, 1``; float64 ``[W+1]`` summing to 1.

    ``α_r = exp(λ r) / Σ_{r'} exp(λ r')`` (SPEC §9). With ``decode_weight = w`` the decode row gets ``w``
    and the tail rows share ``1 - w`` in proportion to ``exp(λ r)`` (``w = 0``: prompt tail only).
    """
    r = torch.arange(-W + 1, 2, dtype=torch.float64)
    if decode_weight is None:
        return torch.softmax(lam * r, dim=0)
    a = torch.softmax(lam * r[:-1], dim=0) * (1.0 - decode_weight)
    return torch.cat([a, torch.tensor([float(decode_weight)], dtype=torch.float64)])


# ----------------------------------------------------------------------------- policies
class EvictionPolicy(abc.ABC):
    """Shared behaviour of the policy dataclasses (see the module docstring)."""

    name: ClassVar[str] = "policy"
    defer: ClassVar[int] = 0
    keeps_all: ClassVar[bool] = False

    def needs(self) -> Needs:
        return Needs()

    @abc.abstractmethod
    def scores(self, ev: Evidence) -> Tensor:
        """Importance of every prompt position, float ``[layers, kv_heads, prompt_len]``."""

    def tiebreak(self, ev: Evidence) -> Tensor | None:
        return None

    def protected(self, T: int) -> Tensor:
        return protected_mask(T, getattr(self, "n_sink", 0), getattr(self, "recent", 0))

    def params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def _check_common(self):
        _check_int("n_sink", self.n_sink, 0)
        _check_int("recent", self.recent, 0)


def _group(x: Tensor, ev: Evidence) -> Tensor:
    return group_rows(x, ev.head_group)


@dataclass(frozen=True)
class FullCache(EvictionPolicy):
    """Keep everything (the reference; the budget is ignored)."""

    name: ClassVar[str] = "full"
    keeps_all: ClassVar[bool] = True

    def scores(self, ev: Evidence) -> Tensor:
        return torch.ones(ev.L, ev.G, ev.T, dtype=torch.float64)

    def protected(self, T: int) -> Tensor:
        return torch.ones(T, dtype=torch.bool)


@dataclass(frozen=True)
class StreamingLLM(EvictionPolicy):
    """StreamingLLM: the sinks and the most recent positions (score = position).

    Attributes:
        n_sink: attention sinks kept, ``≥ 0``.
        recent: recent prompt positions always kept, ``≥ 0`` (the rest of the budget also goes to the
            most recent positions, so the result is sinks + the last ``B - n_sink``).
    """

    n_sink: int = 4
    recent: int = 32
    name: ClassVar[str] = "streaming"

    def __post_init__(self):
        self._check_common()

    def scores(self, ev: Evidence) -> Tensor:
        return (torch.arange(ev.T, dtype=torch.float64) / ev.T).expand(ev.L, ev.G, ev.T).clone()


@dataclass(frozen=True)
class H2O(EvictionPolicy):
    """H2O (one-shot after prefill): accumulated attention ``Σ_{u<T} A_{u,j}`` of every prompt query,
    averaged over the group's heads, plus the protected sinks and recent window.

    The column sums are accumulated inside the attention call over query tiles (never ``T × T``).
    """

    n_sink: int = 4
    recent: int = 32
    name: ClassVar[str] = "h2o"

    def __post_init__(self):
        self._check_common()

    def needs(self) -> Needs:
        return Needs(colsum=True)

    def scores(self, ev: Evidence) -> Tensor:
        return _group(ev.require("colsum", "H2O"), ev)


@dataclass(frozen=True)
class SnapKV(EvictionPolicy):
    """SnapKV (evict at ``t = 0``): attention of the last ``window`` prompt queries summed over the
    window, averaged over the group's heads, max-pooled over keys with ``kernel``.

    Attributes:
        n_sink, recent: protected sinks and recent window.
        window: observation window ``W ≥ 1`` (prompt-tail rows ``r = -W+1 … 0``).
        kernel: max-pool kernel, odd ``≥ 1`` (1 = no pooling).
    """

    n_sink: int = 4
    recent: int = 32
    window: int = 32
    kernel: int = 7
    name: ClassVar[str] = "snapkv"

    def __post_init__(self):
        self._check_common()
        _check_int("window", self.window, 1)
        _check_kernel(self.kernel)

    def needs(self) -> Needs:
        return Needs(tail=self.window)

    def scores(self, ev: Evidence) -> Tensor:
        tail = ev.require("tail", "SnapKV")
        if tail.shape[2] < self.window:
            raise ValueError(f"window: {self.window} rows needed, the evidence has {tail.shape[2]}")
        s = _row_sum([tail[:, :, -self.window:]], [1.0] * self.window)  # [L, H, T]
        return _maxpool(_group(s, ev), self.kernel)


@dataclass(frozen=True)
class DeferKV(EvictionPolicy):
    """DeferKV (evict after decode step ``t = 1``): ``S_i = Σ_r α_r A_{r,i}`` over ``r = -W+1 … 1``,
    ``α_r = exp(λ r)`` normalised (SPEC §9), averaged over the group's heads, max-pooled with ``kernel``.
    The first generated token is protected.

    Attributes:
        n_sink, recent: protected sinks and recent prompt window.
        window: prompt-tail rows ``W ≥ 1``.
        lam: ``λ`` (real; ``λ > 0`` favours later rows, ``0`` = uniform).
        kernel: max-pool kernel, odd ``≥ 1``.
        decode_weight: ``None`` for SPEC's ``α``; a number in ``[0, 1]`` fixes ``α_1`` and spreads the
            rest over the tail by ``exp(λ r)`` (``0`` with ``λ = 0`` reproduces SnapKV's selection).
    """

    n_sink: int = 4
    recent: int = 32
    window: int = 32
    lam: float = 0.1
    kernel: int = 7
    decode_weight: float | None = None
    name: ClassVar[str] = "deferkv"
    defer: ClassVar[int] = 1

    def __post_init__(self):
        self._check_common()
        _check_int("window", self.window, 1)
        _check_real("lam", self.lam, -50.0, 50.0)
        _check_kernel(self.kernel)
        if self.decode_weight is not None:
            _check_real("decode_weight", self.decode_weight, 0.0, 1.0)

    def needs(self) -> Needs:
        return Needs(tail=self.window, decode1=True)

    def alpha(self) -> Tensor:
        """``α`` over ``r = -W+1 … 1``; float64 ``[W+1]``."""
        return deferkv_alpha(self.window, self.lam, self.decode_weight)

    def scores(self, ev: Evidence) -> Tensor:
        tail = ev.require("tail", "DeferKV")
        dec = ev.require("decode", "DeferKV")
        if tail.shape[2] < self.window:
            raise ValueError(f"window: {self.window} rows needed, the evidence has {tail.shape[2]}")
        s = _row_sum([tail[:, :, -self.window:], dec[:, :, :1]], self.alpha())  # Σ_r α_r A_r over W+1 rows: [L, H, T]
        return _maxpool(_group(s, ev), self.kernel)


@dataclass(frozen=True)
class PageEntroKV(EvictionPolicy):
    """Page-EntroKV: SPEC §2 group weights on the proposal observers, SPEC §8 pages.

    Group score ``p_{l,g}(j) = Σ_{h∈ℋ_g} w_h a^h_j`` (``a`` = observer mean, ``w`` from
    :class:`~workbench.pooling.HeadPooling` with sink isolation over ``n_sink``); every token scores its
    page's importance ``I(P) = max_{j∈P} p(j)`` (pages of ``page`` tokens from position 0), so whole
    pages are taken in order of importance; within the last, partly kept page the higher ``p(j)`` wins.

    Attributes:
        n_sink, recent: protected sinks and recent window.
        page: page size ``b ≥ 1``.
        zeta, tau, rho_min: :class:`HeadPooling` parameters.
        W_p: observers when the prompt has no spans (its last ``W_p`` tokens), ``≥ 1``.
    """

    n_sink: int = 4
    recent: int = 32
    page: int = 16
    zeta: float = 0.5
    tau: float = 1.0
    rho_min: float = 1e-6
    W_p: int = 8
    name: ClassVar[str] = "page-entrokv"

    def __post_init__(self):
        self._check_common()
        _check_int("page", self.page, 1)
        _check_int("W_p", self.W_p, 1)
        HeadPooling(zeta=self.zeta, tau=self.tau, rho_min=self.rho_min)  # validates

    def needs(self) -> Needs:
        return Needs(observers=self.W_p)

    def group_score(self, ev: Evidence) -> Tensor:
        """``p_{l,g}(j)``; float64 ``[L, G, T]``."""
        obs = ev.require("observers", "Page-EntroKV")
        pool = HeadPooling(zeta=self.zeta, tau=self.tau, rho_min=self.rho_min).pool(
            obs, ev.head_group, min(self.n_sink, ev.T))
        return group_scores(pool.a, pool.w, ev.head_group)

    def scores(self, ev: Evidence) -> Tensor:
        p = self.group_score(ev)
        I = page_importance(p, self.page)  # [L, G, N_P]
        return I.repeat_interleave(self.page, dim=-1)[..., : ev.T]

    def tiebreak(self, ev: Evidence) -> Tensor:
        return self.group_score(ev)


@dataclass(frozen=True)
class RandomKV(EvictionPolicy):
    """Random control: uniform random scores (seeded, independent per layer and group)."""

    n_sink: int = 4
    recent: int = 32
    seed: int = 0
    name: ClassVar[str] = "random"

    def __post_init__(self):
        self._check_common()
        _check_int("seed", self.seed, 0)

    def scores(self, ev: Evidence) -> Tensor:
        g = torch.Generator().manual_seed(self.seed)
        return torch.rand(ev.L, ev.G, ev.T, generator=g, dtype=torch.float64)


@dataclass(frozen=True)
class OracleKV(EvictionPolicy):
    """Oracle (evicts at ``t = 0``, knows the future): mean attention of the full-cache answer's decode
    rows ``1 … n`` over the prompt keys (renormalised), averaged over the group's heads."""

    n_sink: int = 4
    recent: int = 32
    name: ClassVar[str] = "oracle"

    def __post_init__(self):
        self._check_common()

    def needs(self) -> Needs:
        return Needs(answer=True)

    def scores(self, ev: Evidence) -> Tensor:
        dec = ev.require("decode", "the oracle")
        return _group(dec.to(torch.float64).mean(2), ev)


ALL_POLICIES = (FullCache, StreamingLLM, H2O, SnapKV, DeferKV, PageEntroKV, RandomKV, OracleKV)


def default_policies(**common) -> list[EvictionPolicy]:
    """One instance of every policy with default parameters (``common`` e.g. ``n_sink=4, recent=32``
    is passed to every policy that has the field)."""
    out = []
    for cls in ALL_POLICIES:
        names = {f.name for f in fields(cls)}
        out.append(cls(**{k: v for k, v in common.items() if k in names}))
    return out


# ----------------------------------------------------------------------------- results
@dataclass
class GenerationResult:
    """One generation under a policy and budget.

    Attributes:
        policy: policy name; params: its parameters; budget: ``B`` (prompt positions per layer and group).
        T: prompt length.
        ids: generated token ids; text: their decoded text (``None`` without a tokenizer).
        kept: int64 ``[L, G, S']`` positions kept at eviction (the ``min(B, T)`` prompt positions, then
            the generated tokens held at that moment), sorted; for the full cache every position.
        evicted_at: decode step after which the eviction ran (0 or 1).
        compacted_layers: layers whose cache was compacted (sliding-window layers keep their window).
        kv_bytes_before / kv_bytes_after: cache bytes just before and just after eviction.
        timings: seconds: ``prefill`` (with capture when needed), ``defer`` (decode step 1 on the full
            cache), ``answer`` (full-cache answer for the oracle), ``score`` (scores + selection),
            ``evict`` (cache compaction).
        step_s: seconds of every decode forward after eviction (one per generated token after the
            eviction, the last generated token needs none).
        logits: optional float32 ``[n, V]`` logits of every generated token.
    """

    policy: str
    params: dict
    budget: int
    T: int
    ids: list[int]
    text: str | None
    kept: Tensor
    evicted_at: int
    compacted_layers: tuple[int, ...]
    kv_bytes_before: int
    kv_bytes_after: int
    timings: dict
    step_s: list[float] = field(default_factory=list)
    logits: Tensor | None = None

    @property
    def kept_prompt(self) -> Tensor:
        """Kept prompt positions; int64 ``[L, G, min(B, T)]``."""
        return self.kept[..., : min(self.budget, self.T)] if self.policy != "full" else self.kept[..., : self.T]

    def survival(self, positions) -> Tensor:
        """Fraction of ``positions`` kept, per layer and group (NaN for layers not compacted); float64 ``[L, G]``."""
        pos = torch.as_tensor(list(positions), dtype=torch.int64)
        if pos.numel() == 0:
            raise ValueError("positions: must not be empty")
        hit = (self.kept_prompt[..., None] == pos).any(-2).to(torch.float64).mean(-1)
        if self.policy != "full":
            mask = torch.ones(hit.shape[0], dtype=torch.bool)
            mask[list(self.compacted_layers)] = False
            hit[mask] = float("nan")
        return hit

    def to_frame(self) -> pd.DataFrame:
        """One row: ``policy, budget, T, n_new, text, kv_bytes_before, kv_bytes_after, kv_ratio,
        prefill_s, score_s, evict_s, step_s_median`` and the parameters (``param_*``)."""
        steps = sorted(self.step_s)
        d = {
            "policy": self.policy, "budget": self.budget, "T": self.T, "n_new": len(self.ids), "text": self.text,
            "evicted_at": self.evicted_at, "kv_bytes_before": self.kv_bytes_before,
            "kv_bytes_after": self.kv_bytes_after,
            "kv_ratio": self.kv_bytes_after / self.kv_bytes_before if self.kv_bytes_before else float("nan"),
            **{f"{k}_s": v for k, v in self.timings.items()},
            "step_s_median": steps[len(steps) // 2] if steps else float("nan"),
        }
        d.update({f"param_{k}": v for k, v in self.params.items()})
        return pd.DataFrame([d])

    def steps_frame(self) -> pd.DataFrame:
        """One row per decode forward after eviction: ``step, seconds``."""
        start = self.evicted_at + 1
        return pd.DataFrame({"step": range(start, start + len(self.step_s)), "seconds": self.step_s})


# ----------------------------------------------------------------------------- running
def _unwrap(model):
    if hasattr(model, "tokenizer") and hasattr(model, "model"):
        return model.model, model.tokenizer
    return model, None


def _prompt_ids(prompt, tokenizer) -> tuple[list[int], object]:
    """``(ids, spans or None)`` from a Prompt, PromptSpans, a string, a list or a tensor of ids."""
    spans = getattr(prompt, "spans", None)
    if spans is None and hasattr(prompt, "input_ids") and hasattr(prompt, "observers"):
        spans = prompt
    if spans is not None:
        return list(spans.input_ids), spans
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("prompt: a string needs a model with a tokenizer (a LoadedModel)")
        return list(tokenizer(prompt)["input_ids"]), None
    ids = torch.as_tensor(prompt).flatten().tolist()
    if not ids:
        raise ValueError("prompt: is empty")
    return [int(i) for i in ids], None


def _eos_ids(model) -> set[int]:
    gc = getattr(model, "generation_config", None)
    e = getattr(gc, "eos_token_id", None) if gc is not None else None
    if e is None:
        return set()
    return {int(x) for x in (e if isinstance(e, (list, tuple)) else [e])}


def token_positions(prompt, tokenizer, text: str) -> list[int]:
    """Prompt positions of the tokens lying inside the first occurrence of ``text`` in the prompt's text
    (e.g. a needle); from the tokenizer's character offsets on the rendered text."""
    full = prompt.text
    at = full.find(text)
    if at < 0:
        raise ValueError("text: does not occur in the prompt")
    chat = bool(getattr(tokenizer, "chat_template", None))
    enc = tokenizer(full, return_offsets_mapping=True, add_special_tokens=not chat)
    if list(enc["input_ids"]) != list(prompt.spans.input_ids):
        raise ValueError("tokenizer: does not reproduce the prompt's token ids")
    return [t for t, (a, b) in enumerate(enc["offset_mapping"]) if b > a and a < at + len(text) and b > at]


class EvictionSession:
    """One prefill (capturing the evidence the given needs ask for), optionally the first decode step
    and the full-cache answer; then any number of evictions with :meth:`run`, each on a copy of the cache.

    Use :meth:`prepare`; :func:`generate_with_policy` is one session and one run.
    """

    def __init__(self):
        raise TypeError("use EvictionSession.prepare(...)")

    @classmethod
    @torch.no_grad()
    def prepare(cls, model, prompt, needs: Needs, max_new_tokens: int, *, reusable: bool = True,
                keep_logits: bool = False, progress: bool = True) -> "EvictionSession":
        """Prefill ``prompt`` with the capture ``needs`` asks for.

        Args:
            model: an HF causal LM or a :class:`~workbench.models.LoadedModel`.
            prompt: a :class:`~workbench.prompt.Prompt`, :class:`~workbench.spans.PromptSpans`, a string
                (with a LoadedModel) or token ids.
            needs: evidence to capture (merge the policies' :meth:`needs`).
            max_new_tokens: tokens to generate, ``≥ 1``.
            reusable: keep pristine caches so that :meth:`run` can be called more than once.
        """
        self = object.__new__(cls)
        self.model, self.tokenizer = _unwrap(model)
        n = _check_int("max_new_tokens", max_new_tokens, 1)
        ids, spans = _prompt_ids(prompt, self.tokenizer)
        T = len(ids)
        shape = adapter.model_shape(self.model)
        if shape.max_context and T + n + 1 > shape.max_context:
            raise ValueError(f"max_new_tokens: T + max_new_tokens = {T + n} exceeds the model's context {shape.max_context}")
        self.T, self.ids, self.spans, self.n, self.needs = T, ids, spans, n, needs
        self.keep_logits, self.reusable, self.progress = keep_logits, reusable, progress
        self.eos = _eos_ids(self.model)
        self.device = next(self.model.parameters()).device
        W = min(needs.tail, T)
        tail_pos = list(range(T - W, T))
        if needs.observers:
            obs_pos = list(spans.observers) if spans is not None and spans.observers else list(range(max(0, T - needs.observers), T))
        else:
            obs_pos = []
        n_dec = n if needs.answer else (1 if needs.decode1 else 0)
        dec_pos = list(range(T, T + n_dec))
        rows = tail_pos + obs_pos + dec_pos
        capture = bool(rows) or needs.colsum
        self.timings = {"prefill": 0.0, "defer": 0.0, "answer": 0.0}
        x = torch.tensor([ids], dtype=torch.int64, device=self.device)
        bar = tqdm(total=1 + n_dec, desc="prefill+capture", disable=not progress, leave=False)
        with contextlib.ExitStack() as stack:
            stack.callback(bar.close)
            rec = stack.enter_context(capture_attention(self.model, rows, K=T + n_dec, T=T, colsum=needs.colsum)) \
                if capture else None
            cache = adapter.new_cache(self.model)
            if rec is not None:
                rec.positions = torch.arange(T)
            t0 = time.perf_counter()
            out = adapter.forward(self.model, x, cache=cache, logits_to_keep=1)
            self.timings["prefill"] = time.perf_counter() - t0
            bar.update(1)
            cache = adapter.output_cache(out) or cache
            logit = out.logits[0, -1].float()
            self.first_logits = [logit.cpu()] if keep_logits else []
            y = [int(logit.argmax())]
            self.cache0 = adapter.clone_cache(cache) if n_dec else cache  # decode steps below extend `cache`
            self.cache1 = None
            self.answer_ids = None
            t_ans = time.perf_counter()
            for t in range(1, n_dec + 1):
                if needs.answer and y[-1] in self.eos:
                    break
                pos = T + t - 1
                if rec is not None:
                    rec.positions = torch.tensor([pos])
                t0 = time.perf_counter()
                out = adapter.forward(self.model, torch.tensor([[y[-1]]], device=self.device), cache=cache,
                                      position_ids=torch.tensor([[pos]], device=self.device), logits_to_keep=1)
                dt = time.perf_counter() - t0
                cache = adapter.output_cache(out) or cache
                logit = out.logits[0, -1].float()
                if t == 1:
                    self.timings["defer"] = dt
                    self.cache1 = adapter.clone_cache(cache) if n_dec > 1 else cache
                    self.y2 = int(logit.argmax())
                    if keep_logits:
                        self.first_logits.append(logit.cpu())
                y.append(int(logit.argmax()))
                bar.update(1)
            if needs.answer:
                self.timings["answer"] = time.perf_counter() - t_ans
                self.answer_ids = y[:n]
            self.y1 = y[0]
        # evidence (prompt keys only; decode rows renormalised over them)
        ev = Evidence(T=T, L=shape.L, head_group=shape.head_group(), n_sink=spans.n_sink if spans is not None else 4)
        if rec is not None:
            A = rec.attn
            o = 0
            if tail_pos:
                ev.tail = A[:, :, o:o + len(tail_pos), :T].cpu()
            o += len(tail_pos)
            if obs_pos:
                ev.observers = A[:, :, o:o + len(obs_pos), :T].cpu()
            o += len(obs_pos)
            done = len(y) - 1  # decode forwards that ran (rows captured)
            if dec_pos and done > 0:
                d = A[:, :, o:o + done, :T].cpu()
                ev.decode = _renorm_rows(d)
            if needs.colsum:
                ev.colsum = rec.colsum.cpu()
        self.evidence = ev
        self._used = False
        return self

    @torch.no_grad()
    def run(self, policy: EvictionPolicy, budget: int) -> GenerationResult:
        """Evict with ``policy`` at budget ``B`` and decode ``max_new_tokens`` tokens (stops at EOS)."""
        return self._decode([self._evict(policy, budget)])[0]

    @torch.no_grad()
    def run_batch(self, jobs) -> list[GenerationResult]:
        """Several ``(policy, budget)`` evictions decoded together: runs whose caches have the same length
        at the same step share one batched forward (rows of a batch are independent; the results equal
        :meth:`run`'s up to float rounding of the batched matrix products). Per-step times are the
        batch's; ``timings["batch"]`` is the largest batch a run was part of."""
        states = [self._evict(p, b) for p, b in jobs]
        return self._decode(states)

    def _evict(self, policy: EvictionPolicy, budget: int) -> "_RunState":
        if not isinstance(policy, EvictionPolicy):
            raise ValueError(f"policy: must be an EvictionPolicy, got {type(policy).__name__}")
        B = _check_int("budget", budget, 1)
        need = policy.needs()
        have = self.needs
        if need.merge(have) != have:
            raise ValueError(f"policy: {policy.name} needs {need}, the session captured {have}")
        if self._used and not self.reusable:
            raise ValueError("reusable: this session was prepared with reusable=False and has been run once")
        self._used = True
        T, n = self.T, self.n
        defer = policy.defer
        if defer == 1 and self.cache1 is None:
            if self.y1 in self.eos or n == 1:
                defer = 0  # nothing is generated after step 0: evict right away
            else:
                raise ValueError("policy: DeferKV needs the first decode step (Needs(decode1=True))")
        src = self.cache1 if defer == 1 else self.cache0
        cache = adapter.clone_cache(src) if self.reusable else src
        ids = [self.y1] + ([self.y2] if defer == 1 else [])
        logits = list(self.first_logits[: len(ids)]) if self.keep_logits else []
        timings = dict(self.timings)
        if defer == 0:
            timings["defer"] = 0.0
        shape = adapter.model_shape(self.model)
        L, G = shape.L, shape.G
        before = adapter.cache_bytes(cache)
        gen = torch.arange(T, T + defer)
        if policy.keeps_all:
            kept = torch.arange(T + defer).expand(L, G, T + defer).clone()
            compacted = tuple(l for l in range(L) if not adapter.cache_layer_is_sliding(cache, l))
            timings["score"] = timings["evict"] = 0.0
        else:
            t0 = time.perf_counter()
            scores = policy.scores(self.evidence)
            keep = select_keep(scores, B, policy.protected(T), policy.tiebreak(self.evidence))
            timings["score"] = time.perf_counter() - t0
            kept = torch.cat([keep, gen.expand(L, G, defer)], dim=-1)
            t0 = time.perf_counter()
            if B < T:
                compacted = tuple(adapter.compact_cache_positions(cache, kept))
            else:
                compacted = tuple(l for l in range(L) if not adapter.cache_layer_is_sliding(cache, l))
            timings["evict"] = time.perf_counter() - t0
        timings["batch"] = 1
        after = adapter.cache_bytes(cache)
        return _RunState(policy=policy, B=B, defer=defer, kept=kept, compacted=compacted, before=before,
                         after=after, timings=timings, ids=ids, logits=logits, cache=cache)

    def _decode(self, states: list["_RunState"]) -> list[GenerationResult]:
        """Greedy decoding of every state to ``max_new_tokens`` (or EOS), batching states whose caches have
        the same length at the same step; a lone state runs exactly as an unbatched generation."""
        T, n = self.T, self.n
        for st in states:
            st.done = len(st.ids) >= n or st.ids[-1] in self.eos
        bar = tqdm(total=sum(n - len(st.ids) for st in states if not st.done), desc="decode",
                   disable=not self.progress, leave=False)
        while True:
            live = [st for st in states if not st.done]
            if not live:
                break
            m = min(len(st.ids) for st in live)
            first = [st for st in live if len(st.ids) == m]
            length = first[0].kept.shape[-1] + len(first[0].steps)  # stored entries of a compacted layer
            grp = [st for st in first if st.kept.shape[-1] + len(st.steps) == length]
            same = len({id(st.cache) for st in grp}) == 1 and [st.row for st in grp] == list(range(len(grp))) \
                and adapter.cache_batch_size(grp[0].cache) == len(grp)
            if not same:
                cache = adapter.stack_cache_rows([(st.cache, st.row) for st in grp])
                for i, st in enumerate(grp):
                    st.cache, st.row = cache, i
            cache = grp[0].cache
            x = torch.tensor([[st.ids[-1]] for st in grp], device=self.device)
            pos = torch.full((len(grp), 1), T + m - 1, device=self.device)
            t0 = time.perf_counter()
            fwd = adapter.forward(self.model, x, cache=cache, position_ids=pos, logits_to_keep=1)
            dt = time.perf_counter() - t0
            new = adapter.output_cache(fwd)
            logit = fwd.logits[:, -1].float()
            for i, st in enumerate(grp):
                if new is not None:
                    st.cache = new
                st.steps.append(dt)
                st.timings["batch"] = max(st.timings["batch"], len(grp))
                if self.keep_logits:
                    st.logits.append(logit[i].cpu())
                st.ids.append(int(logit[i].argmax()))
                st.done = len(st.ids) >= n or st.ids[-1] in self.eos
            bar.update(len(grp))
        bar.close()
        out = []
        for st in states:
            ids = st.ids[:n]
            text = self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else None
            out.append(GenerationResult(
                policy=st.policy.name, params=st.policy.params(), budget=st.B, T=T, ids=ids, text=text,
                kept=st.kept, evicted_at=st.defer, compacted_layers=st.compacted, kv_bytes_before=st.before,
                kv_bytes_after=st.after, timings=st.timings, step_s=st.steps,
                logits=torch.stack(st.logits[: len(ids)]) if st.logits else None,
            ))
            st.cache = None
        return out


@dataclass(eq=False)
class _RunState:
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
    row: int = 0
    steps: list = field(default_factory=list)
    done: bool = False


def generate_with_policy(model, prompt, policy: EvictionPolicy, budget: int, max_new_tokens: int, *,
                         keep_logits: bool = False, progress: bool = True) -> GenerationResult:
    """Greedy generation with one-shot eviction under ``policy`` at budget ``B``.

    Prefill (capturing only what the policy scores with), for DeferKV one decode step on the full cache,
    then score, select (:func:`select_keep`) and compact the model's own dynamic cache in place, and
    keep decoding with position ids continuing at the original positions (``T + t - 1``).

    Args:
        model: an HF causal LM or a :class:`~workbench.models.LoadedModel` (for ``text``).
        prompt: a Prompt, PromptSpans, string or token ids (batch size 1).
        policy: one of the policy dataclasses.
        budget: ``B``, prompt positions kept per layer and KV group (``≥`` the protected count, or ``≥ T``).
        max_new_tokens: ``≥ 1``; generation also stops at the model's EOS token.
        keep_logits: also return the logits of every generated token.

    Returns:
        :class:`GenerationResult` (text, ids, kept positions ``[L, G, S']``, KV bytes before/after, timings).
    """
    sess = EvictionSession.prepare(model, prompt, policy.needs(), max_new_tokens, reusable=False,
                                   keep_logits=keep_logits, progress=progress)
    return sess.run(policy, budget)


def run_policies(model, prompt, policies, budgets, max_new_tokens: int, *, progress: bool = True,
                 keep_logits: bool = False, batch: bool = False) -> list[GenerationResult]:
    """Every policy at every budget from one shared prefill (and one full-cache answer when needed).

    Returns the results in ``policies × budgets`` order (the full cache once, with the first budget).
    Timings of the shared steps (prefill with the union of all captures) are the same for every result.
    ``batch=True`` decodes runs with equal cache lengths together (:meth:`EvictionSession.run_batch`):
    faster, equal to the unbatched runs up to float rounding.
    """
    policies = list(policies)
    budgets = [_check_int("budgets", b, 1) for b in budgets]
    if not budgets:
        raise ValueError("budgets: must not be empty")
    needs = Needs()
    for p in policies:
        needs = needs.merge(p.needs())
    sess = EvictionSession.prepare(model, prompt, needs, max_new_tokens, reusable=True,
                                   keep_logits=keep_logits, progress=progress)
    jobs = [(p, b) for p in policies for b in (budgets[:1] if p.keeps_all else budgets)]
    if batch:
        return sess.run_batch(jobs)
    out = []
    for p, b in tqdm(jobs, desc="policies", disable=not progress, leave=False):
        out.append(sess.run(p, b))
    return out


def survival_table(results, positions, answer: str | None = None) -> pd.DataFrame:
    """One row per result: ``policy, budget, answer`` (the text), ``correct`` (``answer`` occurs in it,
    case-insensitive), and how many of ``positions`` (e.g. the needle's tokens) the cache kept:
    ``kept_mean`` (over compacted layers and groups), ``kept_min_layer`` (the worst layer's mean over
    its groups) and ``layers_all_kept`` (layers where every group kept every position)."""
    rows = []
    for r in results:
        surv = r.survival(positions)
        per_layer = surv.nanmean(-1)
        rows.append({
            "policy": r.policy,
            "budget": "all" if r.policy == "full" else r.budget,
            "answer": (r.text or "").strip().replace("\n", " "),
            "correct": bool(answer is not None and r.text is not None and answer.lower() in r.text.lower()),
            "kept_mean": round(float(surv.nanmean()), 3),
            "kept_min_layer": round(float(per_layer[~per_layer.isnan()].min()), 3) if (~per_layer.isnan()).any()
            else float("nan"),
            "layers_all_kept": int((surv == 1.0).all(-1).sum()),
        })
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- sweep method
POLICY_BY_NAME = {cls.name: cls for cls in ALL_POLICIES}


def policy_from_params(name: str, **params) -> EvictionPolicy:
    """The policy dataclass called ``name`` (``full``, ``streaming``, ``h2o``, ``snapkv``, ``deferkv``,
    ``page-entrokv``, ``random``, ``oracle``) with those of ``params`` that are its fields."""
    if name not in POLICY_BY_NAME:
        raise ValueError(f"policy: must be one of {sorted(POLICY_BY_NAME)}, got {name!r}")
    cls = POLICY_BY_NAME[name]
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in params.items() if k in names and v is not None})


def resolve_budget(T: int, budget=None, budget_frac=None) -> int:
    """The budget in prompt positions: ``budget`` (an int ``≥ 1``) or ``budget_frac`` (a fraction in
    ``(0, 1]`` of the prompt length: ``⌈budget_frac · T⌉``), exactly one of them."""
    if (budget is None) == (budget_frac is None):
        raise ValueError("budget: give exactly one of budget (positions, >= 1) and budget_frac (in (0, 1])")
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 1:
            raise ValueError(f"budget: must be an int >= 1, got {budget!r}")
        return int(budget)
    if isinstance(budget_frac, bool) or not isinstance(budget_frac, numbers.Real) or not 0 < budget_frac <= 1:
        raise ValueError(f"budget_frac: must lie in (0, 1], got {budget_frac!r}")
    return max(1, math.ceil(float(budget_frac) * T))


_SHARED: dict = {}


def _shared_session(lm, item, prompt, need: Needs, max_new_tokens: int) -> "EvictionSession":
    """One reusable session per (model, item, decode length), holding the evidence every default policy
    needs (and ``need``), so that consecutive sweep cells on one prompt share one prefill. Each run
    evicts a copy of the pristine cache, so a result equals :func:`generate_with_policy`'s."""
    key = (id(lm.model), item.task, item.item_id, max_new_tokens, tuple(prompt.spans.input_ids))
    union = need
    for p in default_policies():
        union = union.merge(p.needs())
    if _SHARED.get("key") == key and _SHARED["sess"].needs.merge(need) == _SHARED["sess"].needs:
        return _SHARED["sess"]
    _SHARED.clear()  # one session at a time: its caches are the size of the prompt's KV cache
    sess = EvictionSession.prepare(lm, prompt, union, max_new_tokens, reusable=True, progress=False)
    _SHARED.update(key=key, sess=sess)
    return sess


def _register_sweep_method() -> None:
    from .sweep import register_method, stop_token_ids

    policy_fields = sorted({f.name for cls in ALL_POLICIES for f in fields(cls)} - {"seed"})

    @register_method("evict", replace=True, params=("policy", "budget", "budget_frac", *policy_fields),
                     description="one-shot KV eviction after prefill (DeferKV: after decode step 1), then greedy decoding")
    def evict(lm, item, params: dict) -> dict:
        """KV eviction under ``policy`` at ``budget`` positions or ``budget_frac`` of the prompt (the full
        cache needs neither); the random policy takes the sweep's seed."""
        prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
        extra = {k: v for k, v in params.items() if k in policy_fields}
        policy = policy_from_params(params.get("policy", "full"), seed=int(params["seed"]), **extra)
        if policy.keeps_all and params.get("budget") is None and params.get("budget_frac") is None:
            B = prompt.T
        else:
            B = resolve_budget(prompt.T, params.get("budget"), params.get("budget_frac"))
        n = int(params["max_new_tokens"])
        sess = _shared_session(lm, item, prompt, policy.needs(), n)
        r = sess.run(policy, prompt.T if policy.keeps_all else min(B, prompt.T))
        ids = list(r.ids)
        stops = stop_token_ids(lm)
        for j, t in enumerate(ids):  # the sweep's convention: stop after the first stop token (kept)
            if t in stops:
                ids = ids[: j + 1]
                break
        kept = r.T if policy.keeps_all else min(B, r.T)
        return {"generated_ids": ids, "prompt_tokens": r.T, "prefill_tokens": r.T, "retained_tokens": kept,
                "kv_bytes": r.kv_bytes_after, "kv_bytes_full": r.kv_bytes_before, "budget_positions": kept,
                "evicted_at": r.evicted_at, "shared_prefill": True, "prefill_s": r.timings.get("prefill", math.nan),
                "score_s": r.timings.get("score", math.nan)}


_register_sweep_method()
