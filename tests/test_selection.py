"""Tests of workbench.analyse.selection (SPEC §5): mass table, greedy proposer, dual certificate."""
from __future__ import annotations

import functools
import subprocess
import sys

import highspy
import numpy as np
import pytest
import torch
from _examples import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from workbench.analyse.selection import (
    VERDICT_INFEASIBLE,
    GreedySelection,
    certificate,
    lp_certificate,
    mass_table,
    scan_order,
    target_tokens,
)
from workbench.capture.data import Capture
from workbench.run.spans import PromptSpans

PROPS = settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- helpers
@functools.lru_cache(maxsize=None)
def _subsets(k):
    """All 2^k indicator vectors (row b has bit i of b at column i), float64 [2^k, k]."""
    return ((np.arange(2**k)[:, None] >> np.arange(k)[None, :]) & 1).astype(np.float64)


def brute_force(n, m, eps, m0):
    """D* of problem (14) by enumerating all 2^k subsets (vectorised with bit tricks)."""
    k = len(n)
    X = _subsets(k)  # [2^k, k]
    ok = np.all(X @ m.T <= eps[None, :], axis=1) & (X.sum(1) <= k - m0)
    return float((X @ n)[ok].max())  # x = 0 is always feasible


_DENOM = st.sampled_from([4, 16, 2**16])
_SEED = st.integers(0, 2**32 - 1)
_ZERO_FRAC = st.sampled_from([0.0, 0.3, 0.8])
_EPS_HI = st.sampled_from([0.25, 1.0, 3.0])
_N_HI = st.sampled_from([2, 5, 30])


@st.composite
def problems(draw, k_max=14, A_max=6):
    """Instances of (14) with dyadic masses and tolerances, so every sum is exact in float64.

    A coarse denominator (4 or 16) produces many exact ties between loads and tolerances.
    Returns ``(n [k], m [A, k], eps [A], m0, S [k])`` as numpy arrays."""
    k = draw(st.integers(1, k_max))
    A = draw(st.integers(1, A_max))
    denom, seed, zero_frac, eps_hi, n_hi = draw(st.tuples(_DENOM, _SEED, _ZERO_FRAC, _EPS_HI, _N_HI))
    m0 = draw(st.integers(0, k))
    rng = np.random.default_rng(seed)
    n = rng.integers(1, n_hi, size=k).astype(np.float64)
    m = rng.integers(0, denom + 1, size=(A, k)) / denom
    m[rng.random((A, k)) < zero_frac] = 0.0
    eps = np.floor(rng.random(A) * eps_hi * denom) / denom
    S = rng.integers(0, 3, size=k) / 2.0 if rng.random() < 0.5 else rng.random(k)
    return n, m, eps, m0, S


def lp_value(n, m, eps, m0):
    """LP relaxation value solved independently (interior point, not the dual simplex)."""
    k = len(n)
    A_ub = np.vstack([m, np.ones((1, k))])
    b_ub = np.concatenate([eps, [k - m0]])
    res = linprog(-n, A_ub=A_ub, b_ub=b_ub, bounds=[(0, 1)] * k, method="highs-ipm")
    assert res.status == 0
    return -res.fun


def is_feasible(x_set, m, eps, m0, k, tol=1e-12):
    x = np.zeros(k)
    x[list(x_set)] = 1
    return bool(np.all(m @ x <= eps + tol)) and x.sum() <= k - m0


# ----------------------------------------------------------------------------- mass table
def test_mass_table_matches_loops():
    spans = PromptSpans.synthetic([3, 1, 5, 2])
    cap = Capture.synthetic(spans, L=2, H_Q=4, G=2, seed=3)
    A = cap.observer_attn()  # [L, H, W, T]
    m = mass_table(A[1], spans)
    H, W = A.shape[1], A.shape[2]
    assert m.shape == (H * W, spans.k) and m.dtype == torch.float64
    for h in range(H):
        for u in range(W):
            for i, (s, e) in enumerate(spans.chunks):
                expect = sum(float(A[1, h, u, j]) for j in range(s, e))
                assert m[h * W + u, i].item() == pytest.approx(expect, rel=1e-6, abs=1e-9)


def test_mass_table_batched_equals_per_layer():
    spans = PromptSpans.synthetic([4, 4, 2])
    cap = Capture.synthetic(spans, L=3, H_Q=6, G=3, seed=1)
    A = cap.observer_attn()
    mb = mass_table(A, spans)
    assert mb.shape == (3, 6 * spans.W_p, 3)
    for l in range(3):
        assert torch.equal(mb[l], mass_table(A[l], spans))


def test_mass_table_rejects_wrong_T():
    spans = PromptSpans.synthetic([2, 2])
    with pytest.raises(ValueError, match="A_rows"):
        mass_table(torch.zeros(2, 3, spans.T + 1), spans)


# ----------------------------------------------------------------------------- certificate properties
@PROPS
@given(problems(), st.integers(0, 2**32 - 1))
def test_certificate_random_prices_bounds_optimum(prob, seed):
    n, m, eps, m0, _ = prob
    rng = np.random.default_rng(seed)
    A = m.shape[0]
    scale = rng.choice([0.1, 1.0, 10.0, 100.0])
    y = rng.random(A) * scale * (rng.random(A) < 0.7)
    t = float(rng.random() * rng.choice([0.0, 1.0, 10.0]))
    D_star = brute_force(n, m, eps, m0)
    U = certificate(n, m, eps, m0, y, t)
    assert U >= D_star - 1e-9 * (1 + y.sum() + t)


@settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.integers(0, 2**32 - 1))
def test_lp_certificate_is_valid_and_tightest(prob, seed):
    n, m, eps, m0, _ = prob
    U, y, t = lp_certificate(n, m, eps, m0)
    y = y.numpy()
    assert np.all(y >= 0) and t >= 0
    # U is exactly the certificate formula at the returned prices
    assert U == pytest.approx(certificate(n, m, eps, m0, y, t), abs=1e-9)
    D_star = brute_force(n, m, eps, m0)
    tol = 1e-6 * (1 + n.sum())
    assert U >= D_star - 1e-9 * (1 + y.sum() + t)
    # tightest bound of this form: U(y*, t*) <= U(y, t) for any y, t >= 0
    rng = np.random.default_rng(seed)
    for _ in range(5):
        y2 = rng.random(len(eps)) * rng.choice([0.1, 1.0, 30.0]) * (rng.random(len(eps)) < 0.6)
        t2 = float(rng.random() * rng.choice([0.0, 2.0, 20.0]))
        assert U <= certificate(n, m, eps, m0, y2, t2) + tol
    # perturbing the LP prices never improves the bound either
    y3 = np.maximum(y + rng.normal(0, 0.1, size=y.shape), 0)
    assert U <= certificate(n, m, eps, m0, y3, max(t + rng.normal(0, 0.1), 0.0)) + tol


@settings(max_examples=examples(75), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_lp_certificate_equals_lp_value(prob):
    # in exact arithmetic U(y*, t*) is the LP value (weak duality gives >=, optimality gives <=);
    # the LP is solved again here with a different HiGHS method (interior point)
    n, m, eps, m0, _ = prob
    U, _, _ = lp_certificate(n, m, eps, m0)
    assert U == pytest.approx(lp_value(n, m, eps, m0), abs=1e-6 * (1 + n.sum()))


def _random_target(n, seed):
    rng = np.random.default_rng(seed)
    if rng.random() < 0.5:
        return dict(target_tokens=int(rng.integers(0, int(n.sum()) + 5)))
    return dict(target=float(rng.uniform(0.01, 1.0)))


@PROPS
@given(problems(), _SEED)
def test_greedy_feasible_below_optimum_and_stops_correctly(prob, seed):
    n, m, eps, m0, S = prob
    k = len(n)
    target = _random_target(n, seed)
    res = GreedySelection(**target, eps_row=1.0, m0=m0).select(S, n.astype(np.int64), m, eps, certify=False)
    E = res.removed
    assert len(set(E)) == len(E) and all(0 <= i < k for i in E)
    assert is_feasible(E, m, eps, m0, k)
    assert res.D == int(sum(n[i] for i in E))
    assert res.D <= brute_force(n, m, eps, m0)
    assert res.reached == (res.D >= res.target_tokens)
    if not res.reached:
        # scan ran to the end: no remaining chunk fits (loads only grow during the scan)
        for i in set(range(k)) - set(E):
            assert not is_feasible(list(E) + [i], m, eps, m0, k, tol=0.0)
    elif E:
        # stopped as soon as the target was reached: before the last addition it was not
        pos = {c: r for r, c in enumerate(res.scan_order)}
        last = max(E, key=lambda i: pos[i])
        assert res.D - n[last] < res.target_tokens


@settings(max_examples=examples(125), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), _SEED)
def test_verdict_proves_infeasibility_only_when_true(prob, seed):
    n, m, eps, m0, S = prob
    res = GreedySelection(**_random_target(n, seed), eps_row=1.0, m0=m0).select(S, n.astype(np.int64), m, eps)
    D_star = brute_force(n, m, eps, m0)
    assert res.U >= D_star - 1e-6
    assert res.gap == pytest.approx(res.U - res.D)
    if res.verdict.startswith(VERDICT_INFEASIBLE):
        assert res.U < res.target_tokens
        assert D_star < res.target_tokens
    elif not res.reached:
        assert res.U >= res.target_tokens - 1e-9
        assert "proves nothing" in res.verdict
    else:
        assert "target reached" in res.verdict


@PROPS
@given(st.integers(1, 12), st.integers(0, 2**32 - 1), st.integers(0, 12))
def test_greedy_tie_breaking_order(k, seed, j):
    # few distinct priorities and sizes: many ties on S and on (S, n)
    rng = np.random.default_rng(seed)
    S = rng.integers(0, 3, size=k) / 2.0
    n = rng.integers(1, 4, size=k).astype(np.int64)
    expect = sorted(range(k), key=lambda i: (S[i], -n[i], i))
    assert scan_order(S, n) == expect
    # unconstrained rows: the removal is the shortest prefix of the order that reaches the target
    j = min(j, k)
    tgt = int(sum(n[i] for i in expect[:j]))
    res = GreedySelection(target_tokens=tgt, eps_row=1.0, m0=0).select(S, n, np.zeros((2, k)), certify=False)
    assert res.scan_order == expect
    prefix, D = [], 0
    for i in expect:
        if D >= tgt:
            break
        prefix.append(i)
        D += n[i]
    assert res.removed == sorted(prefix)


def test_tie_breaking_hand_example():
    S = [0.5, 0.1, 0.1, 0.1, 0.1]
    n = [3, 2, 5, 2, 5]
    assert scan_order(S, n) == [2, 4, 1, 3, 0]


def test_blocked_chunk_is_skipped_and_scan_continues():
    # one row; chunk 1 (lowest S) is too heavy, the scan must skip it and take 0 then 2
    n = np.array([4, 9, 4])
    m = np.array([[0.02, 0.2, 0.03]])
    res = GreedySelection(target_tokens=8, eps_row=0.05, m0=0).select([1.0, 0.0, 2.0], n, m)
    assert res.removed == [0, 2] and res.D == 8 and res.reached


def test_count_constraint_keeps_m0_chunks():
    n = np.array([2, 2, 2, 2])
    res = GreedySelection(target=1.0, eps_row=1.0, m0=3).select(np.zeros(4), n, np.zeros((1, 4)))
    assert res.removed == [0] and res.D == 2 and not res.reached
    # LP is integral here: U = largest (k - m0) sizes = 2 < 8, proved
    assert res.U == pytest.approx(2.0, abs=1e-7)
    assert res.verdict.startswith(VERDICT_INFEASIBLE)


@settings(max_examples=examples(75), deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=14), st.integers(0, 14))
def test_lp_only_count_constraint_equals_top_sizes(sizes, m0):
    n = np.array(sizes, dtype=np.float64)
    m0 = min(m0, len(sizes))
    U, y, t = lp_certificate(n, np.zeros((3, len(sizes))), 0.5, m0)
    assert U == pytest.approx(sum(sorted(sizes, reverse=True)[: len(sizes) - m0]), abs=1e-6)


def test_greedy_miss_proves_nothing_and_lp_value_by_hand():
    # knapsack where greedy order is bad: D = 5 but D* = 8 (chunks 1 and 2)
    n = np.array([5, 4, 4])
    m = np.array([[0.6, 0.5, 0.5]])
    g = GreedySelection(target_tokens=8, eps_row=1.0, m0=0)
    res = g.select([0.0, 1.0, 2.0], n, m)
    assert res.removed == [0] and res.D == 5 and not res.reached
    assert not res.verdict.startswith(VERDICT_INFEASIBLE)
    assert "proves nothing" in res.verdict
    # LP by hand: x0 = 1, then 0.4 / 0.5 = 0.8 of a 4-token chunk: 5 + 3.2 = 8.2
    assert res.U == pytest.approx(8.2, abs=1e-7)
    assert res.gap == pytest.approx(3.2, abs=1e-7)
    # target 9 > 8.2 >= D*: proved infeasible
    res9 = GreedySelection(target_tokens=9, eps_row=1.0, m0=0).select([0.0, 1.0, 2.0], n, m)
    assert res9.verdict.startswith(VERDICT_INFEASIBLE)


def test_per_row_tolerances():
    n = np.array([3, 3])
    m = np.array([[0.1, 0.0], [0.0, 0.1]])
    res = GreedySelection(target_tokens=6, m0=0).select([0.0, 1.0], n, m, eps=torch.tensor([0.05, 0.2]))
    assert res.removed == [1]
    res = GreedySelection(target_tokens=6, m0=0).select([0.0, 1.0], n, m, eps=torch.tensor([0.2, 0.2]))
    assert res.removed == [0, 1]
    with pytest.raises(ValueError, match="eps"):
        GreedySelection(target_tokens=6, m0=0).select([0.0, 1.0], n, m, eps=torch.tensor([0.1, 0.1, 0.1]))
    with pytest.raises(ValueError, match="eps"):
        GreedySelection(target_tokens=6, m0=0).select([0.0, 1.0], n, m, eps=torch.tensor([0.1, -0.1]))


def test_k_zero_is_ordinary_inference():
    spans = PromptSpans.synthetic([])
    assert spans.k == 0
    res = GreedySelection(target=0.3, m0=1).select(torch.zeros(0), spans.n, torch.zeros(16, 0))
    assert res.removed == [] and res.D == 0 and not res.reached
    assert "no candidate" in res.verdict and "ordinary inference" in res.verdict


def test_target_tokens_conversion():
    assert target_tokens(0.3, 40) == 12  # 0.3 * 40 is 12.000000000000002 in floating point
    assert target_tokens(0.31, 40) == 13
    assert target_tokens(1.0, 37) == 37
    assert target_tokens(None, 3, 5) == 5
    with pytest.raises(ValueError, match="target_tokens=5"):
        target_tokens(5, 3)
    res = GreedySelection(target_tokens=50, eps_row=1.0, m0=0).select(np.zeros(2), np.array([3, 4]), np.zeros((1, 2)))
    assert res.D == 7 and res.verdict.startswith(VERDICT_INFEASIBLE)  # U <= N = 7 < 50
    assert "exceeds the N = 7 candidate tokens" in res.verdict


@pytest.mark.parametrize(
    "field,kwargs",
    [
        ("target", dict(target=-1)),
        ("target", dict(target=1)),
        ("target", dict(target=0.5, target_tokens=3)),
        ("target_tokens", dict(target_tokens=-1)),
        ("target_tokens", dict(target_tokens=0.5)),
        ("target", dict(target=0.0)),
        ("target", dict(target=1.5)),
        ("target", dict(target=True)),
        ("target", dict(target=float("nan"))),
        ("eps_row", dict(eps_row=0.0)),
        ("eps_row", dict(eps_row=1.01)),
        ("m0", dict(m0=-1)),
        ("m0", dict(m0=1.0)),
    ],
)
def test_greedy_selection_validation(field, kwargs):
    with pytest.raises(ValueError, match=f"^{field}:"):
        GreedySelection(**kwargs)


def test_select_rejects_m0_above_k_and_bad_shapes():
    with pytest.raises(ValueError, match="^m0:"):
        GreedySelection(m0=3).select(np.zeros(2), np.array([1, 1]), np.zeros((1, 2)))
    with pytest.raises(ValueError, match="^m:"):
        GreedySelection().select(np.zeros(2), np.array([1, 1]), np.zeros((1, 3)))
    with pytest.raises(ValueError, match="^S:"):
        GreedySelection().select(np.zeros(3), np.array([1, 1]), np.zeros((1, 2)))


def test_certificate_rejects_negative_prices():
    n, m = np.array([1.0, 2.0]), np.zeros((2, 2))
    with pytest.raises(ValueError, match="^y:"):
        certificate(n, m, 0.1, 0, np.array([-1.0, 0.0]), 0.0)
    with pytest.raises(ValueError, match="^t:"):
        certificate(n, m, 0.1, 0, np.zeros(2), -0.5)


def test_selection_on_synthetic_capture_and_frame():
    spans = PromptSpans.synthetic([5, 3, 7, 4, 6])
    cap = Capture.synthetic(spans, L=2, H_Q=6, G=2, seed=7, concentration=2.0)
    m = mass_table(cap.observer_attn()[1], spans)
    S = torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5])
    res = GreedySelection(target=0.4, eps_row=0.1, m0=1).select(S, spans.n, m)
    assert torch.all(res.row_load <= 0.1)
    x = torch.zeros(spans.k, dtype=torch.float64)
    x[res.removed] = 1
    assert torch.allclose(m @ x, res.row_load)
    df = res.to_frame()
    assert list(df["chunk"]) == list(range(5))
    assert df["removed"].sum() == len(res.removed)
    assert df.loc[df["removed"], "n"].sum() == res.D
    assert df.attrs["U"] == res.U


def test_lp_certificate_memo_is_exact_and_not_shared():
    """The memoised certificate equals a fresh solve, and its prices are a copy (editing them does not
    change what the next call returns)."""
    from workbench.analyse import selection as Sel

    rng = np.random.default_rng(4)
    n = rng.integers(1, 20, 12)
    m = rng.dirichlet(np.ones(12), size=9) * 0.5
    Sel._LP_MEMO.clear()
    U1, y1, t1 = Sel.lp_certificate(n, m, 0.1, 2)
    U0, y0, t0, _ = Sel._lp_solve(n.astype(np.float64), m, np.full(9, 0.1), 2)
    assert (U1, t1) == (U0, t0) and np.array_equal(y1.numpy(), y0)
    y1 += 5.0
    U2, y2, t2 = Sel.lp_certificate(n, m, 0.1, 2)
    assert U2 == U1 and np.array_equal(y2.numpy(), y0) and len(Sel._LP_MEMO) == 1
    U3, _, _ = Sel.lp_certificate(n, m, 0.2, 2)  # another tolerance: another LP
    assert len(Sel._LP_MEMO) == 2 and U3 >= U1 - 1e-9   # a looser row constraint cannot lower the bound


@pytest.mark.parametrize("sizes", [[3, 7, 5, 7, 2], [5, 3, 7, 4, 6], [7, 11, 13, 5, 9, 6]])
@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_uniform_null_tie_gives_the_spec_order(sizes, lam):
    """SPEC §5 [decided]: under the uniform null every S_i is 0 in exact arithmetic; the float values are
    ±2e-16 apart and must not order the scan: decreasing n_i, then index."""
    from workbench.analyse.priorities import ChunkPriorities

    sp = PromptSpans.synthetic(sizes)
    mu = torch.zeros(1, sp.T, dtype=torch.float64)
    mu[0, sp.document_mask()] = 1.0
    S = ChunkPriorities(lam=lam).score(mu / mu.sum(), sp).S[0]
    expect = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    assert float(S.abs().max()) < 1e-12
    assert scan_order(S, sp.n) == expect
    res = GreedySelection(target=0.3, eps_row=1.0, m0=0).select(S, sp.n, np.zeros((1, sp.k)), certify=False)
    assert res.scan_order == expect


@PROPS
@given(st.integers(1, 10), st.integers(0, 2**32 - 1))
def test_tie_tolerance_ignores_float_noise(k, seed):
    """Priorities equal up to relative noise 1e-12 scan exactly like the exact values; values further
    apart than the tolerance keep their S order."""
    rng = np.random.default_rng(seed)
    S = rng.integers(-2, 3, size=k) * rng.choice([1.0, 1e3, 1e-3])
    n = rng.integers(1, 4, size=k).astype(np.int64)
    noisy = S + rng.uniform(-1e-12, 1e-12, size=k) * np.maximum(1.0, np.abs(S))
    assert scan_order(noisy, n) == scan_order(S, n) == sorted(range(k), key=lambda i: (S[i], -n[i], i))
    apart = np.array([0.0, 1e-8])  # 1e-8 > 1e-9 · max(1, ...): not tied, the smaller S first
    assert scan_order(apart, np.array([1, 5])) == [0, 1]
    assert scan_order(np.array([0.0, 1e-10]), np.array([1, 5])) == [1, 0]  # tied: the larger chunk first


def test_lp_failure_is_reported_not_silent(monkeypatch):
    """A failed LP falls back to U = N and says so in lp_status and the verdict."""
    from workbench.analyse import selection as Sel

    Sel._LP_MEMO.clear()
    from workbench.analyse import lp as LP

    class Stuck(highspy.Highs):          # the solver gives up (a status HiGHS can return), not optimal
        def getModelStatus(self):
            return highspy.HighsModelStatus.kIterationLimit

    stuck = Stuck()
    stuck.setOptionValue("output_flag", False)
    monkeypatch.setattr(LP, "_solver", lambda: stuck)
    n, m = np.array([4, 6]), np.array([[0.3, 0.4]])
    res = GreedySelection(target_tokens=3, eps_row=0.5, m0=0).select([0.0, 1.0], n, m)
    assert res.U == 10.0 and res.lp_status.startswith("failed: HiGHS status Iteration limit reached")
    assert "LP certificate failed" in res.verdict and res.to_frame().attrs["lp_status"] == res.lp_status
    Sel._LP_MEMO.clear()
    monkeypatch.undo()
    ok = GreedySelection(target_tokens=3, eps_row=0.5, m0=0).select([0.0, 1.0], n, m)
    assert ok.lp_status == "optimal" and "LP certificate" not in ok.verdict


@settings(max_examples=examples(75), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_highs_row_duals_equal_linprogs(problem):
    """:func:`workbench.analyse.lp.highs_row_duals` (HiGHS called directly through ``highspy``) solves the LP of
    :func:`_lp_solve` as ``linprog(method="highs")`` does: the same status, and duals that are optimal for the
    same LP (the certificate they price equals linprog's value; on a degenerate LP the two may pick different
    optimal duals, so the prices themselves are compared only through the certificate)."""
    from workbench.analyse.lp import highs_row_duals

    n, m, eps, m0, _ = problem
    k = len(n)
    A_ub, b_ub = np.vstack([m, np.ones((1, k))]), np.concatenate([eps, [k - m0]])
    res = linprog(-n, A_ub=A_ub, b_ub=b_ub, bounds=[(0, 1)] * k, method="highs")
    duals, status = highs_row_duals(-n, A_ub, b_ub)
    assert (status == "optimal") == (res.status == 0)
    prices = np.maximum(-duals, 0.0)
    assert duals.shape == (len(b_ub),) and np.all(duals <= 1e-12)
    U = certificate(n, m, eps, m0, prices[:-1], float(prices[-1]))
    assert U == pytest.approx(-res.fun, rel=1e-9, abs=1e-9)


def test_highs_row_duals_say_when_there_is_no_optimum():
    """An infeasible LP (and so any status but optimal) gives no duals and a status naming HiGHS's."""
    from workbench.analyse.lp import highs_row_duals

    duals, status = highs_row_duals(np.array([-1.0, -2.0]), np.array([[1.0, 1.0]]), np.array([-1.0]))
    assert duals is None and status == "failed: HiGHS status Infeasible; trivial bound U = N used"


def test_highs_row_duals_print_nothing():
    """HiGHS prints a licence banner on the C stdout when a process builds its first solver; a slider's first
    LP must not put it in the user's terminal."""
    code = ("import numpy as np; from workbench.analyse.lp import highs_row_duals; "
            "print(highs_row_duals(np.array([-1.0, -2.0]), np.array([[1.0, 1.0]]), np.array([1.0]))[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout == "optimal\n"
