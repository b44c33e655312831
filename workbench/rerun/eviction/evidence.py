"""Evidence and the shared selection rule of every eviction policy (SPEC §9, deferkv-guide.md).

A policy (``workbench.rerun.eviction.policies``) declares the attention evidence it needs
(:class:`Needs`), scores every prompt position from that :class:`Evidence` (``[L, G, T]``), and
:func:`preview` applies the one budget rule for every caller (the eviction session, the eviction panel,
the sweep method): a policy that keeps everything, or a budget ``B ≥ T``, keeps every position; otherwise
:func:`select_keep` keeps the protected positions, then the highest scores.

Budget convention (the spec is silent; chosen so that all policies hold the same number of entries at
every later decode step): ``B`` counts **prompt** positions. Tokens generated before the eviction (one,
for DeferKV) are protected and kept in addition, so after eviction every policy's cache holds ``B`` prompt
entries plus the tokens generated so far.

Group scores: a KV group's score is the mean over its query heads (``g(h) = h // r``) of the heads'
scores — the same convention as the shift analysis (probabilities averaged over the group's heads).
"""
from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from workbench.analyse.shift import group_rows
from workbench.checks import check_fields, check_int
from workbench.constraints import BUDGET, BUDGET_FRAC

__all__ = ["Needs", "Evidence", "EvictionPolicy", "OnBasePolicy", "select_keep", "preview", "preview_window", "protected_mask",
           "deferkv_alpha", "resolve_budget", "split_budget", "group_mean", "row_sum", "maxpool", "pool", "renorm_rows"]


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
        keys, values: float ``[L, G, T, d]`` the prompt's cache entries after prefill (keys post-RoPE).
        wov: float64 ``[L, H_Q, T]`` ``‖W_O^h v_{g(h),j}‖_1`` (the value's contribution to the layer output).
        q_sum, q_outer: float64 ``[L, H_Q, d]`` and ``[L, H_Q, d, d]``, ``Σ_i q_i`` and ``Σ_i q_i q_iᵀ`` over
            the prompt's pre-RoPE queries; q_first: float64 ``[L, H_Q, Q0, d]`` the first ``Q0 ≤ 16`` queries
            (to leave the sinks out); rope_cos, rope_sin: float64 ``[L, F, d]`` and rope_pair: int64 ``[L, d]``,
            each layer's rotary map at ``T … T+F-1`` (:class:`~workbench.run.rotary.RotaryMaps`:
            ``R(p) x = cos ⊙ x + sin ⊙ x[pair]``; a NoPE layer is the identity).
        attn_inputs: per layer ``(attention module, hidden states [1, T, D], position_embeddings)`` of the
            prefill (the inputs kvpress's hooks see).
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
    _scores: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def G(self) -> int:
        return int(self.head_group.max()) + 1

    def require(self, name: str, what: str):
        t = getattr(self, name)
        if t is None:
            raise ValueError(f"evidence: {what} needs {name!r} rows, which were not captured")
        return t

    def scores_of(self, policy: "EvictionPolicy") -> Tensor:
        """``policy.scores(self)``, memoised per policy (a frozen dataclass) for the last 8 policies, so
        that a budget move re-selects from the same scores."""
        if policy not in self._scores:
            self._scores[policy] = policy.scores(self)
            while len(self._scores) > 8:
                self._scores.pop(next(iter(self._scores)))
        return self._scores[policy]

    @classmethod
    def from_capture(cls, capture) -> "Evidence":
        """Evidence from a saved :class:`~workbench.capture.data.Capture` (tail, decode and observer rows;
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
            d = renorm_rows(d)
        return cls(T=T, L=capture.L, head_group=capture.head_group.clone(), n_sink=capture.spans.n_sink,
                   tail=capture.attn[:, :, tail, :T] if tail.numel() else None, decode=d, observers=obs)



# ----------------------------------------------------------------------------- selection
def renorm_rows(d: Tensor) -> Tensor:
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


def select_keep(scores: Tensor, budget: int, protected: Tensor, tiebreak: Tensor | None = None,
                budgets: Tensor | None = None) -> Tensor:
    """The shared selection step: ``B`` prompt positions per layer and KV group.

    Protected positions always; then the highest ``scores`` (ties: higher ``tiebreak``, then lower
    position). ``B ≥ T`` keeps every position.

    Budget allocations (PyramidKV, AdaKV, EntroPrefill weights): ``budgets`` int ``[L, G]`` gives each
    layer and KV group its own count ``B_{l,g}`` (each ``≥ |protected|``, at most ``T``); the rows are then
    padded with ``-1`` after their sorted kept positions to the largest count.

    Args:
        scores: float ``[L, G, T]``.
        budget: ``B``, an integer ``≥ |protected|`` (or ``≥ T``).
        protected: bool ``[T]``.
        tiebreak: optional float ``[L, G, T]`` secondary key.
        budgets: optional int64 ``[L, G]`` per-cell counts (an allocation of ``B``).

    Returns:
        int64 ``[L, G, min(B, T)]`` kept positions, sorted increasingly in every row (with ``budgets``:
        ``[L, G, max B_{l,g}]``, ``-1``-padded).
    """
    if scores.dim() != 3:
        raise ValueError(f"scores: must have shape [L, G, T], got {list(scores.shape)}")
    L, G, T = scores.shape
    if protected.shape != (T,):
        raise ValueError(f"protected: must have shape [{T}], got {list(protected.shape)}")
    B = BUDGET.check("budget", budget)
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
    if budgets is None:
        return torch.sort(order[..., :B], dim=-1).values
    budgets = torch.as_tensor(budgets, dtype=torch.int64)
    if budgets.shape != (L, G) or int(budgets.min()) < n_prot or int(budgets.max()) > T:
        raise ValueError(f"budgets: must be [L={L}, G={G}] counts in [{n_prot}, {T}], got {budgets.tolist()}")
    M = int(budgets.max())
    rank = torch.arange(M).expand(L, G, M)
    sel = order[..., :M].masked_fill(rank >= budgets[..., None], T)  # T sorts after every position
    return torch.sort(sel, dim=-1).values.masked_fill(rank >= budgets[..., None], -1)


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


def pool(x: Tensor, kernel: int, mode: str = "max") -> Tensor:
    """Pool ``x [L, G, T]`` over the key axis (stride 1, same length): ``"max"``, or ``"avg"`` (zero
    padding counted, as ``F.avg_pool1d`` and kvpress's SnapKV do)."""
    if mode not in ("max", "avg"):
        raise ValueError(f"pooling: must be 'max' or 'avg', got {mode!r}")
    if mode == "max" or kernel == 1:
        return maxpool(x, kernel)
    L, G, T = x.shape
    y = F.avg_pool1d(x.reshape(L * G, 1, T), kernel_size=kernel, stride=1, padding=kernel // 2)
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

    def allocate(self, ev: Evidence, budget: int) -> Tensor | None:
        """Per layer and KV group counts int64 ``[L, G]`` (a budget allocation, see :func:`select_keep`), or
        ``None``: ``B`` everywhere."""
        return None

    def protected(self, T: int) -> Tensor:
        return protected_mask(T, getattr(self, "n_sink", 0), getattr(self, "recent", 0))

    def params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __post_init__(self):
        check_fields(self)  # every field against its constraint (``CHECKS``, set by ``constraints.checked``)


class OnBasePolicy(EvictionPolicy):
    """A policy built on another one's scores (``self.base``, an evicting policy): a rescaling or a budget
    allocation. The base's decode step, evidence, scores, protected set and tie-break are kept unless the
    subclass overrides them (``base`` is checked by its constraint, ``constraints.PARAMS["base"]``)."""

    base: EvictionPolicy

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


def group_mean(x: Tensor, ev: Evidence) -> Tensor:
    return group_rows(x, ev.head_group)




def preview(policy: EvictionPolicy, evidence: Evidence, budget: int) -> Tensor:
    """The kept prompt positions of ``policy`` at budget ``B``: the single rule every caller uses.

    A policy that keeps everything (the full cache) or ``B ≥ T`` keeps every position ``0 … T-1``;
    otherwise :func:`select_keep` over the policy's scores, protected set and tie-break.

    A policy with a budget allocation (:meth:`EvictionPolicy.allocate`) keeps ``B_{l,g}`` positions per
    layer and group (``L·G·B`` in all): rows are ``-1``-padded to the largest count.

    Returns:
        int64 ``[L, G, min(B, T)]`` (``[L, G, T]`` when everything is kept), sorted in every row.
    """
    if not isinstance(policy, EvictionPolicy):
        raise ValueError(f"policy: must be an EvictionPolicy, got {type(policy).__name__}")
    B = BUDGET.check("budget", budget)
    T, L, G = evidence.T, evidence.L, evidence.G
    if policy.keeps_all or B >= T:
        return torch.arange(T).expand(L, G, T).clone()
    return select_keep(evidence.scores_of(policy), B, policy.protected(T), policy.tiebreak(evidence),
                       policy.allocate(evidence, B))


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


def preview_window(policy: EvictionPolicy, evidence: Evidence, budget: int, layer: int, held: Tensor) -> Tensor:
    """The kept prompt positions of a sliding-window layer (SPEC §7 **[decided]**): the policy's choice among
    the positions the window can still see.

    ``held`` (int64 ``[S]``, sorted) are the positions layer ``layer`` stores; its prompt part ``P`` is what
    the window still sees. The rule is :func:`preview`'s on ``P`` alone: every position of ``P`` when the
    policy keeps everything or ``B ≥ |P|``, else :func:`select_keep` over the policy's scores, protected set
    and tie-break restricted to ``P``, at budget ``B``. Returns int64 ``[G, min(B, |P|)]``, sorted.
    """
    B = BUDGET.check("budget", budget)
    T, G = evidence.T, evidence.G
    P = held[held < T]
    if policy.keeps_all or B >= P.numel():
        return P.expand(G, -1).clone()
    tb = policy.tiebreak(evidence)
    sc = evidence.scores_of(policy)[layer: layer + 1][..., P]
    keep = select_keep(sc, B, policy.protected(T)[P], tb[layer: layer + 1][..., P] if tb is not None else None)
    return P[keep[0]]


def resolve_budget(T: int, budget=None, budget_frac=None) -> int:
    """The budget in prompt positions: ``budget`` (:data:`~workbench.constraints.BUDGET`, an integer ``≥ 1``)
    or ``budget_frac`` (:data:`~workbench.constraints.BUDGET_FRAC`, a fraction in ``(0, 1]`` of the prompt
    length: ``⌈budget_frac · T⌉``), exactly one of them. The one place a fraction becomes ``B``."""
    if (budget is None) == (budget_frac is None):
        raise ValueError(f"budget: give exactly one of budget ({BUDGET.describe()}) and budget_frac "
                         f"({BUDGET_FRAC.describe()})")
    if budget is not None:
        return BUDGET.check("budget", budget)
    check_int("T", T, 1)
    return max(1, math.ceil(BUDGET_FRAC.check("budget_frac", budget_frac) * T))
