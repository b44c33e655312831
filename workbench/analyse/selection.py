"""Constrained chunk selection and its dual certificate (paper §4.2, SPEC §5).

Problem (14), for one layer ``l``::

    D*_l = max Σ_i n_i x_i   over x ∈ {0,1}^k
           s.t.  Σ_i m_ai x_i <= ε_a   for every row a = (h, u)   (a = h*W + u)
                 Σ_i x_i      <= k − m0

with the row–chunk mass table ``m_ai = A^{l,h}_u(c_i)``. The greedy proposer is a feasible
heuristic; the certificate

    U_l(y, t) = Σ_a y_a ε_a + t (k − m0) + Σ_i [n_i − Σ_a y_a m_ai − t]_+   (y, t >= 0)

is an upper bound on ``D*_l`` for any nonnegative prices. Prices from the LP relaxation
(``0 <= x <= 1``, scipy's HiGHS: :mod:`workbench.analyse.lp`) minimise ``U`` over all nonnegative
prices, and then ``U`` equals the LP value. ``U < target`` proves the target infeasible; a greedy miss alone proves nothing. The
solver's status is reported in every result (``lp_status``); a failed LP falls back to the trivial
bound ``U = N`` and the verdict says so.

The saving target is given either as a fraction of ``N`` (``target``, a float in ``(0, 1]``) or in
tokens (``target_tokens``, an int ``>= 0``), exactly one of them; an ``int`` passed as ``target`` is
refused (``1`` would read as one token or as all of ``N``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from workbench.analyse.lp import highs_row_duals
from workbench.analyse.priorities import chunk_sums_idx, take_last
from workbench.analyse.rows import check_rows
from workbench.checks import Interval, check_fields, check_target, check_target_tokens
from workbench.constraints import checked, register_all, shared, zero_upto
from workbench.shapes import shaped

VERDICT_INFEASIBLE = "target infeasible (proved: U < target)"
VERDICT_NO_CANDIDATES = "no candidate chunks (k = 0): ordinary inference, nothing removed"
_CHECKS = register_all("certificate", {"t": Interval("real", 0.0, None, what="a finite price")}, __name__)


def _np(x, dtype=np.float64) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


@shaped
def mass_table(A_rows: Float[torch.Tensor, "... H W T"], spans) -> torch.Tensor:
    """Row–chunk mass table ``m_ai = A^{l,h}_u(c_i)``.

    Args:
        A_rows: attention rows over the prompt keys, ``[..., H, W, T]`` (e.g. ``[H_Q, W, T]`` for one
            layer or ``[L, H_Q, W, T]`` for all layers). Keys beyond ``T`` must already be dropped.
        spans: ``PromptSpans`` (its ``chunks`` define ``c_1 … c_k``).

    Returns:
        float64 ``[..., H*W, k]`` with row ``a = h*W + u``.
    """
    if A_rows.dim() < 3:
        raise ValueError(f"A_rows: must have shape [..., H, W, T], got {tuple(A_rows.shape)}")
    *batch, H, W, T = A_rows.shape
    if T != spans.T:
        raise ValueError(f"A_rows: last dim must be the prompt length T = {spans.T}, got {T}")
    check_rows(A_rows, "A_rows")
    k = spans.k
    if A_rows.dim() > 3 and A_rows.shape[0] > 1:  # one leading slice (layer) at a time: no float64 copy of all layers
        return torch.stack([mass_table(A_rows[i], spans) for i in range(A_rows.shape[0])])
    cof = spans.chunk_of()
    pos = torch.nonzero(cof >= 0).flatten()
    A = take_last(A_rows.reshape(*batch, H * W, T), pos)
    return chunk_sums_idx(A, cof[pos], k).contiguous()


def target_tokens(target: float | None, N: int, tokens: int | None = None) -> int:
    """Saving target in tokens: ``tokens`` as is when given, else the fraction ``target`` of ``N`` as
    ``ceil(target N)`` (to 1e-9)."""
    if tokens is not None:
        return check_target_tokens(tokens)
    return int(math.ceil(round(check_target(target) * N, 9)))


def resolve_target(obj, target, tokens) -> None:
    """Validate the pair ``(target, target_tokens)`` of a frozen dataclass ``obj``: exactly one is set;
    when both are ``None`` the fraction defaults to ``DEFAULT_TARGET``."""
    if target is not None and tokens is not None:
        raise ValueError(f"target: give either target (a fraction of N) or target_tokens (tokens), not both; "
                         f"got target={target!r}, target_tokens={tokens!r}")
    if tokens is not None:
        check_target_tokens(tokens)
        object.__setattr__(obj, "target_tokens", int(tokens))
    else:
        object.__setattr__(obj, "target", check_target(DEFAULT_TARGET if target is None else target))


DEFAULT_TARGET = 0.3


def _eps_vector(eps, A: int, default: float | None = None) -> np.ndarray:
    if eps is None:
        eps = default
    if isinstance(eps, torch.Tensor) or isinstance(eps, np.ndarray) or isinstance(eps, (list, tuple)):
        e = _np(eps).reshape(-1)
        if e.shape == (1,):
            e = np.full(A, float(e[0]))
        if e.shape != (A,):
            raise ValueError(f"eps: must be a scalar or have shape [A] = [{A}], got {tuple(e.shape)}")
    else:
        e = np.full(A, float(eps))
    if not np.all(np.isfinite(e)) or np.any(e < 0):
        raise ValueError("eps: every row tolerance must be finite and >= 0")
    return e


def _check_problem(n, m, m0):
    n = _np(n)
    m = _np(m)
    if n.ndim != 1:
        raise ValueError(f"n: must have shape [k], got {tuple(n.shape)}")
    k = n.shape[0]
    if m.ndim != 2 or m.shape[1] != k:
        raise ValueError(f"m: must have shape [A, k] = [A, {k}], got {tuple(m.shape)}")
    if np.any(m < 0) or not np.all(np.isfinite(m)):
        raise ValueError("m: masses must be finite and >= 0")
    return n, m, _m0(m0, k)


def _m0(m0, k: int) -> int:
    """``m0``: the fewest chunks kept, of the ``k`` candidates."""
    return zero_upto(k, note=f"k = {k} candidate chunks").check("m0", m0)


def certificate(n, m, eps, m0: int, y, t: float) -> float:
    """Dual certificate ``U_l(y, t)`` (SPEC §5); an upper bound on ``D*_l`` for any ``y, t >= 0``.

    Args:
        n: chunk sizes ``[k]``.
        m: row–chunk masses ``[A, k]``.
        eps: row tolerances, scalar or ``[A]``.
        m0: minimum number of kept chunks.
        y: row prices ``[A]``, ``>= 0``.
        t: count price, ``>= 0``.

    Returns:
        ``Σ_a y_a ε_a + t (k − m0) + Σ_i [n_i − Σ_a y_a m_ai − t]_+`` as a float.
    """
    n, m, m0 = _check_problem(n, m, m0)
    A, k = m.shape
    e = _eps_vector(eps, A)
    y = _np(y).reshape(-1)
    if y.shape != (A,):
        raise ValueError(f"y: must have shape [A] = [{A}], got {tuple(y.shape)}")
    if np.any(y < 0) or not np.all(np.isfinite(y)):
        raise ValueError("y: prices must be finite and >= 0")
    t = _CHECKS["t"].check("t", t)
    reduced = n - y @ m - t
    return float(y @ e + t * (k - m0) + np.maximum(reduced, 0.0).sum())


def lp_certificate(n, m, eps, m0: int) -> tuple[float, torch.Tensor, float]:
    """:func:`lp_certificate_status` without the solver status: ``(U, y, t)``."""
    U, y, t, _ = lp_certificate_status(n, m, eps, m0)
    return U, y, t


def lp_certificate_status(n, m, eps, m0: int) -> tuple[float, torch.Tensor, float, str]:
    """Certificate with prices from the LP relaxation of (14) (``0 <= x <= 1``, HiGHS:
    :func:`workbench.analyse.lp.highs_row_duals`).

    The row prices ``y`` and count price ``t`` are the duals of the row and count constraints (tiny
    negative values clipped to 0); ``U`` is then evaluated with ``certificate`` so it is a valid bound
    whatever the solver's accuracy, and in exact arithmetic it equals the LP value, the smallest
    ``U_l(y, t)`` over all ``y, t >= 0``. Rows that can never bind (``Σ_i m_ai <= ε_a``) get price 0
    and are left out of the LP. If the solver fails, the trivial prices ``y = 0, t = 0``
    (``U = N``) are returned and the status says why (never silently).

    Args:
        n: ``[k]``; m: ``[A, k]``; eps: scalar or ``[A]``; m0: int in ``[0, k]``.

    Returns:
        ``(U, y [A] float64 tensor, t, status)``; ``status`` is ``"optimal"`` (``"no candidates"`` when
        ``k = 0``), else ``"failed: ..."`` with the solver's code and message. Solutions are memoised by
        the inputs' bytes (last 512).
    """
    n, m, m0 = _check_problem(n, m, m0)
    A, k = m.shape
    e = _eps_vector(eps, A)
    if k == 0:
        return 0.0, torch.zeros(A, dtype=torch.float64), 0.0, "no candidates"
    # The LP depends on (n, m, ε, m0) only, not on the priorities: a ζ/τ/λ/target slider re-uses it.
    key = (m.shape, np.ascontiguousarray(n, dtype=np.float64).tobytes(), np.ascontiguousarray(m).tobytes(),
           np.ascontiguousarray(e).tobytes(), int(m0))
    hit = _LP_MEMO.get(key)
    if hit is None:
        hit = _lp_solve(n, m, e, m0)
        _LP_MEMO[key] = hit
        while len(_LP_MEMO) > _LP_MEMO_SIZE:
            _LP_MEMO.pop(next(iter(_LP_MEMO)))
    U, y, t, status = hit
    return U, torch.from_numpy(y.copy()), t, status


_LP_MEMO: dict = {}
_LP_MEMO_SIZE = 512


def _lp_solve(n: np.ndarray, m: np.ndarray, e: np.ndarray, m0: int) -> tuple[float, np.ndarray, float, str]:
    """The LP of :func:`lp_certificate_status` (uncached): ``(U, y [A], t, status)``."""

    A, k = m.shape
    y = np.zeros(A)
    t = 0.0
    active = m.sum(axis=1) > e
    A_ub = np.vstack([m[active], np.ones((1, k))])
    b_ub = np.concatenate([e[active], [float(k - m0)]])
    try:
        duals, status = highs_row_duals(-n, A_ub, b_ub)
    except (ValueError, RuntimeError) as exc:  # a solver crash is reported like a solver failure
        duals, status = None, f"failed: {type(exc).__name__}: {exc}; trivial bound U = N used"
    if duals is not None:
        duals = np.maximum(-duals, 0.0)
        y[active] = duals[:-1]
        t = float(duals[-1])
    U = certificate(n, m, e, m0, y, t)
    U0 = float(n.sum())  # U(0, 0): never worse than the trivial bound
    if U0 < U:
        y, t, U = np.zeros(A), 0.0, U0
    return U, y, t, status


@dataclass
class SelectionResult:
    """Greedy proposal and certificate for one layer (SPEC §5).

    Attributes:
        removed: removed chunk indices ``E`` (ascending).
        D: removed tokens ``D_l = Σ_{i∈E} n_i``.
        target_tokens: the saving target in tokens.
        reached: ``D >= target_tokens`` (False when ``k = 0``).
        row_load: float64 ``[A]``, ``Σ_i m_ai x_i`` of the proposal.
        U: certificate ``U_l(y, t)`` (None when not computed).
        y: float64 ``[A]`` row prices (None when not computed); t: count price.
        gap: ``U − D`` (None when not computed).
        verdict: plain-language outcome; starts with ``VERDICT_INFEASIBLE`` only when ``U < target``.
        scan_order: all chunk indices in greedy scan order (increasing S, decreasing n, index).
        n: int64 ``[k]``; S: float64 ``[k]``; eps: float64 ``[A]``; chunk_max_mass: float64 ``[k]``
            (``max_a m_ai``); reduced_cost: float64 ``[k]`` (``n_i − Σ_a y_a m_ai − t``, or None).
        k, N, m0: problem sizes.
        lp_status: the LP solver's status (``"optimal"``; ``"failed: ..."`` when the trivial bound
            ``U = N`` was used instead, which the verdict then says); None when not certified.
    """

    removed: list[int]
    D: int
    target_tokens: int
    reached: bool
    row_load: torch.Tensor
    U: float | None
    y: torch.Tensor | None
    t: float | None
    gap: float | None
    verdict: str
    scan_order: list[int] = field(default_factory=list)
    n: torch.Tensor | None = None
    S: torch.Tensor | None = None
    eps: torch.Tensor | None = None
    chunk_max_mass: torch.Tensor | None = None
    reduced_cost: torch.Tensor | None = None
    k: int = 0
    N: int = 0
    m0: int = 0
    lp_status: str | None = None

    @property
    def infeasible_proved(self) -> bool:
        return self.verdict.startswith(VERDICT_INFEASIBLE)

    def to_frame(self) -> pd.DataFrame:
        """One row per chunk: chunk, n, S, scan rank, removed, max row mass, reduced cost.

        Summary numbers (D, U, gap, target_tokens, reached, verdict, lp_status) are in ``frame.attrs``.
        """
        rank = {c: r for r, c in enumerate(self.scan_order)}
        rem = set(self.removed)
        rows = []
        for i in range(self.k):
            rows.append(
                {
                    "chunk": i,
                    "n": int(self.n[i]),
                    "S": float(self.S[i]),
                    "scan_rank": rank.get(i, -1),
                    "removed": i in rem,
                    "max_row_mass": float(self.chunk_max_mass[i]),
                    "reduced_cost": None if self.reduced_cost is None else float(self.reduced_cost[i]),
                }
            )
        df = pd.DataFrame(rows, columns=["chunk", "n", "S", "scan_rank", "removed", "max_row_mass", "reduced_cost"])
        df.attrs.update(
            D=self.D, U=self.U, gap=self.gap, target_tokens=self.target_tokens, reached=self.reached,
            verdict=self.verdict, k=self.k, N=self.N, m0=self.m0, lp_status=self.lp_status,
        )
        return df


TIE_RTOL = 1e-9
"""**[decided]** (SPEC §5) two priorities are tied when ``|S_i - S_j| <= 1e-9 · max(1, |S_i|, |S_j|)``."""


def scan_order(S, n) -> list[int]:
    """Greedy scan order: increasing ``S_i``, ties by decreasing ``n_i``, then original index.

    **[decided]** (SPEC §5) priorities within ``TIE_RTOL · max(1, |S_i|, |S_j|)`` of each other are
    tied, so float noise never orders values that are equal in exact arithmetic (the uniform null's
    ``S = 0`` computed as ``±2e-16``). Sorted priorities are grouped greedily: a value joins the current
    tie group while it is tied with the group's first (smallest) value; each group is then ordered by
    decreasing ``n_i``, then index.
    """
    S = _np(S).reshape(-1)
    n = _np(n).reshape(-1)
    by_s = [int(i) for i in np.lexsort((np.arange(len(S)), -n, S))]
    out: list[int] = []
    group: list[int] = []
    for i in by_s:
        if group:
            s0, si = S[group[0]], S[i]
            tied = s0 == si or (math.isfinite(s0) and math.isfinite(si)
                                and abs(si - s0) <= TIE_RTOL * max(1.0, abs(s0), abs(si)))
            if not tied:
                out += sorted(group, key=lambda j: (-n[j], j))
                group = []
        group.append(i)
    return out + sorted(group, key=lambda j: (-n[j], j))


@checked()
@dataclass(frozen=True)
class GreedySelection:
    """Greedy proposer for (14) (SPEC §5).

    Attributes:
        target: saving target as a fraction of ``N``, a float in (0, 1] (default 0.3 when
            ``target_tokens`` is not given either); an int is refused.
        eps_row: default row tolerance ε_a, in (0, 1]; a per-row tensor ``[A]`` may be passed to
            ``select`` instead.
        m0: keep at least ``m0`` chunks (int >= 0; ``m0 <= k`` is checked in ``select``).
        target_tokens: saving target in tokens, an int >= 0 (instead of ``target``).
    """

    target: float | None = None
    eps_row: float = 0.05
    m0: int = 1
    target_tokens: int | None = None
    _parameter_constraints: ClassVar = shared("target", "eps_row", "m0", "target_tokens")

    def __post_init__(self):
        check_fields(self)
        resolve_target(self, self.target, self.target_tokens)

    def select(self, S, n, m, eps=None, *, certify: bool = True) -> SelectionResult:
        """Run the greedy scan and (optionally) the LP certificate.

        Args:
            S: priorities ``[k]`` (lower = removed first).
            n: chunk sizes ``[k]`` (ints >= 1).
            m: row–chunk mass table ``[A, k]`` (``A = H*W``), e.g. from ``mass_table``.
            eps: row tolerances, None (use ``eps_row``), scalar, or ``[A]`` (each ``>= 0``).
            certify: compute ``U``, prices and gap with ``lp_certificate``.

        Returns:
            ``SelectionResult``. With ``k = 0`` the removal is empty and the verdict says so.
        """
        S_np = _np(S).reshape(-1)
        n_raw = _np(n).reshape(-1)
        if not np.all(np.isfinite(n_raw)) or np.any(n_raw != np.round(n_raw)) or isinstance(n, bool):
            raise ValueError(f"n: chunk sizes must be integers >= 1 (never truncated), got {n_raw[:8].tolist()}")
        n_np = n_raw.astype(np.int64)
        m_np = _np(m)
        k = n_np.shape[0]
        if S_np.shape != (k,):
            raise ValueError(f"S: must have shape [k] = [{k}], got {tuple(S_np.shape)}")
        if m_np.ndim != 2 or m_np.shape[1] != k:
            raise ValueError(f"m: must have shape [A, k] = [A, {k}], got {tuple(m_np.shape)}")
        if np.any(np.isnan(S_np)):
            raise ValueError("S: priorities must not be NaN")
        A = m_np.shape[0]
        e = _eps_vector(eps, A, default=self.eps_row)
        N = int(n_np.sum())
        tt = target_tokens(self.target, N, self.target_tokens)
        common = dict(
            n=torch.from_numpy(n_np.copy()), S=torch.from_numpy(S_np.copy()), eps=torch.from_numpy(e.copy()),
            chunk_max_mass=torch.from_numpy(m_np.max(axis=0) if A else np.zeros(k)), k=k, N=N, m0=int(self.m0),
        )
        if k == 0:
            return SelectionResult(
                removed=[], D=0, target_tokens=tt, reached=False, row_load=torch.zeros(A, dtype=torch.float64),
                U=0.0 if certify else None, y=torch.zeros(A, dtype=torch.float64) if certify else None,
                t=0.0 if certify else None, gap=0.0 if certify else None, verdict=VERDICT_NO_CANDIDATES,
                scan_order=[], **common,
            )
        _m0(self.m0, k)
        if np.any(n_np < 1):
            raise ValueError("n: chunk sizes must be >= 1")
        _check_problem(n_np, m_np, self.m0)
        order = scan_order(S_np, n_np)
        load = np.zeros(A)
        cap = k - self.m0
        removed: list[int] = []
        D = 0
        mT = np.ascontiguousarray(m_np.T)  # one chunk's column contiguous: the scan reads [A] per step
        for i in order:
            if D >= tt or len(removed) >= cap:
                break
            new = load + mT[i]
            if (new <= e).all():  # ndarray method: no np.all dispatch per scanned chunk
                load = new
                removed.append(i)
                D += int(n_np[i])
        reached = D >= tt
        U = y = t = gap = status = None
        reduced = None
        if certify:
            U, y, t, status = lp_certificate_status(n_np, m_np, e, self.m0)
            gap = U - D
            reduced = torch.from_numpy(n_np - y.numpy() @ m_np - t)
        verdict = _verdict(D, tt, reached, U, N)
        if status is not None and status != "optimal":
            verdict += f"; LP certificate {status}"
        return SelectionResult(
            removed=sorted(removed), D=D, target_tokens=tt, reached=reached, row_load=torch.from_numpy(load),
            U=U, y=y, t=t, gap=gap, verdict=verdict, scan_order=order, reduced_cost=reduced, lp_status=status,
            **common,
        )


def _verdict(D: int, tt: int, reached: bool, U: float | None, N: int) -> str:
    if tt > N:
        return (f"{VERDICT_INFEASIBLE}: the target {tt} tokens exceeds the N = {N} candidate tokens "
                f"(greedy D = {D})")
    if reached:
        s = f"target reached: removed D = {D} of N = {N} tokens (target {tt})"
        if U is not None:
            s += f"; U = {U:.4g}, gap U - D = {U - D:.4g} tokens"
        return s
    if U is not None and U < tt - 1e-9 * max(1.0, tt):
        return f"{VERDICT_INFEASIBLE}: U = {U:.4g} < target = {tt} tokens (greedy D = {D})"
    if U is None:
        return (
            f"target missed by the greedy proposal (D = {D} < target = {tt}); no certificate computed: "
            "a greedy miss alone proves nothing"
        )
    return (
        f"target missed by the greedy proposal (D = {D} < target = {tt}); U = {U:.4g} >= target, "
        "so the target is not proved infeasible: a greedy miss alone proves nothing"
    )
