"""The one budget rule of every eviction policy (SPEC §9): :func:`preview` for every caller (the eviction
session, the eviction panel, the sweep method): a policy that keeps everything, or a budget ``B ≥ T``, keeps
every position; otherwise :func:`select_keep` keeps the protected positions, then the highest scores.
:func:`preview_window` is the same rule on a sliding-window layer; :func:`resolve_budget` is the only place a
budget or a fraction of the prompt becomes ``B``.

Budget convention (the spec is silent; chosen so that all policies hold the same number of entries at
every later decode step): ``B`` counts **prompt** positions. Tokens generated before the eviction (one,
for DeferKV) are protected and kept in addition, so after eviction every policy's cache holds ``B`` prompt
entries plus the tokens generated so far.
"""
from __future__ import annotations

import math

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from workbench.checks import Interval
from workbench.constraints import BUDGET, BUDGET_FRAC, register_all
from workbench.rerun.eviction.evidence import Evidence
from workbench.rerun.eviction.outputs import (
    checked_allocation,
    checked_protected,
    checked_scores,
    checked_tiebreak,
)
from workbench.rerun.eviction.policies.base import EvictionPolicy
from workbench.shapes import shaped

__all__ = ["select_keep", "preview", "preview_window", "resolve_budget"]

_CHECKS = register_all("resolve_budget", {"T": Interval("int", 1)}, __name__)
"""The prompt length a budget fraction is taken of."""


@shaped
def select_keep(scores: Float[Tensor, "L G T"], budget: int, protected: Bool[Tensor, " T"],
                tiebreak: Float[Tensor, "L G T"] | None = None, budgets: Int[Tensor, "L G"] | None = None) -> Tensor:
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


def preview(policy: EvictionPolicy, evidence: Evidence, budget: int) -> Tensor:
    """The kept prompt positions of ``policy`` at budget ``B``: the single rule every caller uses.

    A policy that keeps everything (the full cache) or ``B ≥ T`` keeps every position ``0 … T-1``;
    otherwise :func:`select_keep` over the policy's scores, protected set, tie-break and allocation, each
    checked against the policy contract on every call (:mod:`.outputs`: finite scores ``[L, G, T]``, a bool
    protected mask ``[T]``, integer counts summing to ``L·G·B``; a breach raises
    :class:`~workbench.rerun.eviction.outputs.PolicyContractError` naming the policy and the rule).

    A policy with a budget allocation (:meth:`EvictionPolicy.allocate`) keeps ``B_{l,g}`` positions per
    layer and group (``L·G·B`` in all): rows are ``-1``-padded to the largest count.

    Cells that attend one stored row (:attr:`Evidence.ties`: a layer with fewer KV heads than groups, layers
    sharing one cache) are selected from their scores and tie-breaks pooled (the mean over the tie), so they keep
    one set; an allocation must give them one count.

    Returns:
        int64 ``[L, G, min(B, T)]`` (``[L, G, T]`` when everything is kept), sorted in every row.
    """
    if not isinstance(policy, EvictionPolicy):
        raise ValueError(f"policy: must be an EvictionPolicy, got {type(policy).__name__}")
    B = BUDGET.check("budget", budget)
    T, L, G = evidence.T, evidence.L, evidence.G
    if policy.keeps_all or B >= T:
        return torch.arange(T).expand(L, G, T).clone()
    scores = checked_scores(policy, evidence.scores_of(policy), L, G, T)
    protected = checked_protected(policy, policy.protected(T), T)
    tiebreak = checked_tiebreak(policy, policy.tiebreak(evidence), L, G, T)
    budgets = checked_allocation(policy, policy.allocate(evidence, B), L, G, B)
    # cells that read one stored row (a layer with fewer KV heads, KV-shared layers) keep one set: their scores pooled
    return select_keep(evidence.pooled(scores), B, protected, evidence.pooled(tiebreak),
                       _tied_budgets(policy, evidence, budgets))


def _tied_budgets(policy: EvictionPolicy, evidence: Evidence, budgets: Tensor | None) -> Tensor | None:
    """A budget allocation, checked to give the cells of one tie (:attr:`Evidence.ties`: one stored row) one
    count; ``ValueError`` naming the policy otherwise (one row cannot keep two counts)."""
    if budgets is None or evidence.ties is None:
        return budgets
    b = torch.as_tensor(budgets, dtype=torch.int64)
    for t in torch.unique(evidence.ties):
        cells = b[evidence.ties == t]
        if int(cells.min()) != int(cells.max()):
            raise ValueError(f"policy: {policy.name} allocates different budgets {sorted(set(cells.tolist()))} to "
                             f"layers or KV groups that attend one stored row (a layer with fewer KV heads, or "
                             f"layers sharing one cache), which one kept set must serve")
    return b


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
    tb = evidence.pooled(policy.tiebreak(evidence))
    sc = evidence.pooled(evidence.scores_of(policy))[layer: layer + 1][..., P]
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
    _CHECKS["T"].check("T", T)
    return max(1, math.ceil(BUDGET_FRAC.check("budget_frac", budget_frac) * T))
