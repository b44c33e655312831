"""Tests of sink-isolated Rényi head pooling (SPEC §2)."""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest
import torch
from _examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.analyse.pooling import HeadPooling, PoolingResult, dominant_head_bound
from workbench.capture.data import Capture
from workbench.run.spans import PromptSpans

# Each example draws only a seed (and at most two shape parameters) from hypothesis and builds the
# rest with numpy: hypothesis' per-draw overhead, not the code under test, dominates otherwise.
# Case counts: reference test 1000 examples × 1–36 heads; bound (6) and sink-head tests 500 examples
# × 4 independent layers; collision tests 1000 examples × 1–6 heads; the tied-siblings sharpness 1000.
PROP_1000 = settings(max_examples=examples(250), deadline=None, database=None)
PROP_BATCH = settings(max_examples=examples(125), deadline=None, database=None)  # 4 independent cases per example

seeds = st.integers(0, 2**32 - 1)


from _numeric import _single_thread_torch, assert_close  # noqa: E402,F401  (autouse fixture)


def draw_zeta_tau(rng):
    """ζ: 1 (uniform weights) in 10% of cases, else log-uniform in [1e-6, 1); τ log-uniform in [1e-4, 1e2]."""
    zeta = 1.0 if rng.random() < 0.1 else float(10 ** rng.uniform(-6, 0)) * (1 - 1e-12)
    tau = float(10 ** rng.uniform(-4, 2))
    return zeta, tau


# ----------------------------------------------------------------------------- helpers
def random_rows(rng, L, H, W, T, n_sink, scale, mask_p, sink_bias):
    """Causal-free random attention rows [L,H,W,T] (float64, rows sum to 1)."""
    z = rng.standard_normal((L, H, W, T)) * scale
    z[..., :n_sink] += sink_bias
    drop = rng.random((L, H, W, T)) < mask_p
    keep = rng.integers(0, T, size=(L, H, W))  # every row keeps at least one key
    np.put_along_axis(drop, keep[..., None], False, axis=-1)
    z[drop] = -np.inf
    z -= z.max(-1, keepdims=True)
    A = np.exp(z)
    A /= A.sum(-1, keepdims=True)
    return A


def reference(A, head_group, n_sink, zeta, tau, rho_min):
    """Literal numpy transcription of SPEC §2 with loops over layers and groups."""
    L, H, W, T = A.shape
    G = int(head_group.max()) + 1
    a = A.mean(axis=2)
    z = a[..., n_sink:].sum(-1)
    valid = z > rho_min
    C = np.zeros((L, H))
    Hn = np.full((L, H), np.inf)
    v = np.zeros((L, H))
    w = np.zeros((L, H))
    for l in range(L):
        for h in range(H):
            if valid[l, h]:
                at = a[l, h, n_sink:] / z[l, h]
                C[l, h] = np.sum(at**2)
                Hn[l, h] = -np.log(C[l, h])
        for g in range(G):
            members = np.nonzero(head_group == g)[0]
            r = len(members)
            ok = [h for h in members if valid[l, h]]
            if not ok:
                v[l, members] = 1.0 / r
            else:
                x = np.array([-Hn[l, h] / tau for h in ok])
                x = x - x.max()
                e = np.exp(x)
                v[l, ok] = e / e.sum()
            w[l, members] = zeta / r + (1 - zeta) * v[l, members]
    mu = np.zeros((L, T))
    for l in range(L):
        for h in range(H):
            mu[l] += w[l, h] * a[l, h] / G
    return dict(a=a, z=z, valid=valid, C=C, H=Hn, v=v, w=w, mu=mu)


def pooling_case(rng, G, r):
    L = int(rng.integers(1, 4))
    W = int(rng.integers(1, 5))
    n_sink = int(rng.integers(0, 5))
    T = n_sink + int(rng.integers(1, 31))
    scale = float(10 ** rng.uniform(-2, 1.5))
    mask_p = float(rng.choice([0.0, 0.0, 0.3, 0.8, 0.97]))
    sink_bias = float(rng.choice([0.0, 0.0, 3.0, 40.0]))
    A = random_rows(rng, L, G * r, W, T, n_sink, scale, mask_p, sink_bias)
    head_group = np.repeat(np.arange(G), r)
    return A, head_group, n_sink


# ----------------------------------------------------------------------------- parameter validation
@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(zeta=0), "zeta: must be in (0, 1], got 0"),
        (dict(zeta=1.5), "zeta: must be in (0, 1]"),
        (dict(zeta=-0.1), "zeta: must be in (0, 1]"),
        (dict(zeta=float("nan")), "zeta: must be a finite real number in (0, 1]"),
        (dict(zeta="0.5"), "zeta: must be a finite real number"),
        (dict(zeta=True), "zeta: must be a finite real number"),
        (dict(tau=0), "tau: must be > 0, got 0"),
        (dict(tau=-1.0), "tau: must be > 0"),
        (dict(tau=float("inf")), "tau: must be a finite real number > 0"),
        (dict(rho_min=0.0), "rho_min: must be in (0, 1)"),
        (dict(rho_min=-1e-9), "rho_min: must be in (0, 1)"),
        (dict(rho_min=2), "rho_min: must be in (0, 1), got 2"),
    ],
)
def test_parameter_validation(kwargs, msg):
    with pytest.raises(ValueError) as e:
        HeadPooling(**kwargs)
    assert msg in str(e.value)


def test_defaults_and_frozen():
    p = HeadPooling()
    assert (p.zeta, p.tau, p.rho_min) == (0.5, 1.0, 1e-6)
    HeadPooling(zeta=1.0)  # upper end allowed
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.zeta = 0.3  # type: ignore[misc]


def test_input_validation():
    A = torch.full((1, 2, 1, 5), 0.2)
    p = HeadPooling()
    with pytest.raises(ValueError, match="A_obs: must have shape"):
        p.pool(A[0], torch.tensor([0, 0]), 1)
    with pytest.raises(ValueError, match=r"n_sink: must be an integer in \[0, 5\], got 6"):
        p.pool(A, torch.tensor([0, 0]), 6)
    with pytest.raises(ValueError, match="n_sink"):
        p.pool(A, torch.tensor([0, 0]), -1)
    with pytest.raises(ValueError, match="head_group: must have shape"):
        p.pool(A, torch.tensor([0, 0, 1]), 1)
    with pytest.raises(ValueError, match="head_group: every group"):
        p.pool(A, torch.tensor([0, 2]), 1)
    with pytest.raises(ValueError, match="head_group: must be an integer"):
        p.pool(A, torch.tensor([0.0, 0.0]), 1)


# ----------------------------------------------------------------------------- properties against a literal reference
@PROP_1000
@given(G=st.integers(1, 3), r=st.integers(1, 4), seed=seeds)
def test_pooling_matches_reference_and_invariants(G, r, seed):
    rng = np.random.default_rng(seed)
    A, head_group, n_sink = pooling_case(rng, G, r)
    zeta, tau = draw_zeta_tau(rng)
    rho_min = float(rng.choice([1e-6, 1e-3, 0.2]))
    L, H, W, T = A.shape
    G = int(head_group.max()) + 1
    r = H // G
    res = HeadPooling(zeta=zeta, tau=tau, rho_min=rho_min).pool(torch.from_numpy(A), torch.from_numpy(head_group), n_sink)
    ref = reference(A, head_group, n_sink, zeta, tau, rho_min)

    # shapes and dtypes
    assert res.a.shape == (L, H, T) and res.mu.shape == (L, T)
    for name in ("z", "C", "H", "v", "w", "omega"):
        assert getattr(res, name).shape == (L, H), name
        assert getattr(res, name).dtype == torch.float64
    assert res.valid_head.dtype == torch.bool and res.valid.shape == (L,)

    assert_close(res.z.numpy(), ref["z"], rtol=1e-12, atol=1e-15)
    assert np.array_equal(res.valid_head.numpy(), ref["valid"])
    assert np.array_equal(res.valid.numpy(), ref["valid"].all(axis=1))
    assert_close(res.C.numpy(), ref["C"], rtol=1e-10, atol=0)
    assert np.array_equal(np.isinf(res.H.numpy()), ~ref["valid"])
    fin = ref["valid"]
    assert_close(res.H.numpy()[fin], ref["H"][fin], rtol=0, atol=1e-10)
    assert_close(res.v.numpy(), ref["v"], rtol=0, atol=1e-9)
    assert_close(res.w.numpy(), ref["w"], rtol=0, atol=1e-9)
    assert_close(res.mu.numpy(), ref["mu"], rtol=1e-9, atol=1e-15)

    # no NaN anywhere, even for tau = 1e-4 or invalid heads
    for name in ("z", "C", "v", "w", "mu", "omega"):
        assert torch.isfinite(getattr(res, name)).all(), name
    # H in [0, ln(T - |S|)] for valid heads (no clipping in the implementation)
    Hv = res.H[res.valid_head]
    assert (Hv >= -1e-12).all() and (Hv <= math.log(T - n_sink) + 1e-12).all()
    # C in [1/(T-|S|), 1] for valid heads
    Cv = res.C[res.valid_head]
    assert (Cv <= 1 + 1e-12).all() and (Cv >= 1 / (T - n_sink) - 1e-12).all()
    # weights: sum to 1 per group, floor ζ/r, ceiling ζ/r + (1 - ζ)
    wg = res.w.reshape(L, G, r).sum(-1)
    assert_close(wg.numpy(), 1.0, rtol=0, atol=1e-12)
    vg = res.v.reshape(L, G, r).sum(-1)
    assert_close(vg.numpy(), 1.0, rtol=0, atol=1e-12)
    assert (res.w >= zeta / r - 1e-15).all() and (res.w <= zeta / r + (1 - zeta) + 1e-12).all()
    # invalid heads: v = 0 unless the whole group is invalid (then uniform)
    vh = res.v.reshape(L, G, r)
    okg = res.valid_head.reshape(L, G, r)
    any_ok = okg.any(-1, keepdim=True).expand_as(okg)
    assert (vh[~okg & any_ok] == 0).all()
    assert_close(vh[~any_ok].numpy(), 1.0 / r, rtol=0, atol=1e-15)
    # μ sums to 1 per layer and equals Σ_h Σ_u ω_{h,u} A_{u,j} (computed from the raw rows)
    assert_close(res.mu.sum(-1).numpy(), 1.0, rtol=0, atol=1e-12)
    mu_rows = np.einsum("lh,lhwt->lt", res.omega.numpy(), A)
    assert_close(res.mu.numpy(), mu_rows, rtol=1e-10, atol=1e-15)
    assert_close(res.omega.numpy(), res.w.numpy() / (G * W), rtol=1e-15)
    assert_close(res.omega.sum(-1).numpy() * W, 1.0, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- property (6)
def test_dominant_head_bound_values_and_bad_input():
    """(6) at points where it has a closed value, its limits, and its refusals (naming the parameter)."""
    for zeta in (0.05, 0.5, 1.0):
        for r in (2, 3, 9):
            assert dominant_head_bound(zeta, 0.7, r, 0.0) == pytest.approx(1 / r, rel=1e-12)  # Δ = 0: uniform share
            assert dominant_head_bound(zeta, 0.7, r, math.inf) == pytest.approx(zeta / r + 1 - zeta, rel=1e-12)
            assert dominant_head_bound(zeta, 0.7, r, -math.inf) == pytest.approx(zeta / r, rel=1e-12)
    # r = 2, Δ = τ ln 3: 1 + e^{-Δ/τ} = 4/3
    assert dominant_head_bound(0.25, 2.0, 2, 2.0 * math.log(3)) == pytest.approx(0.125 + 0.75 * 0.75, rel=1e-12)
    assert dominant_head_bound(0.5, 1.0, 1, -3.0) == 1.0  # no sibling
    assert dominant_head_bound(0.5, 1e-4, 4, 1.0) == pytest.approx(0.5 / 4 + 0.5, rel=1e-12)  # no overflow at tiny τ
    assert dominant_head_bound(0.5, 1e-4, 4, -1.0) == pytest.approx(0.5 / 4, rel=1e-12)
    for args, msg in (((0.0, 1.0, 3, 0.0), r"^zeta: must be in \(0, 1\], got 0"),
                      ((0.5, 0.0, 3, 0.0), r"^tau: must be > 0, got 0"),
                      ((0.5, 1.0, 0, 0.0), r"^r: must be an integer >= 1, got 0"),
                      ((0.5, 1.0, 2.5, 0.0), r"^r: must be an integer >= 1, got 2.5"),
                      ((0.5, 1.0, 3, math.nan), r"^gap: must be a real number"),
                      ((0.5, 1.0, 3, "1"), r"^gap: must be a real number")):
        with pytest.raises(ValueError, match=msg):
            dominant_head_bound(*args)


@PROP_BATCH
@given(r=st.integers(2, 6), star_kind=st.sampled_from(["point", "sharp"]), seed=seeds)
def test_bound_6_dominant_head(r, star_kind, seed):
    """h* has entropy lower than each sibling by at least Δ ⇒ w_{h*} ≥ ζ/r + (1-ζ)/(1+(r-1)e^{-Δ/τ}).

    Δ is the exact minimal gap (negative allowed for "sharp": the bound must hold for every Δ the premise
    allows, and it is an equality when the siblings tie).     Four independent cases per example (one per layer)."""
    rng = np.random.default_rng(seed)
    star = int(rng.integers(0, r))
    T_res = int(rng.integers(2, 61))
    n_sink = int(rng.integers(0, 4))
    W = int(rng.integers(1, 4))
    zeta, tau = draw_zeta_tau(rng)
    sib_scale = float(rng.uniform(0, 5))
    T = n_sink + T_res
    L = 4
    A = np.zeros((L, r, W, T))
    for l in range(L):
        for h in range(r):
            for u in range(W):
                sink = rng.random() * 0.9 if n_sink else 0.0
                if n_sink:
                    A[l, h, u, :n_sink] = sink * rng.dirichlet(np.ones(n_sink))
                if h == star and star_kind == "point":
                    A[l, h, u, n_sink] = 1 - sink  # one key: H = 0
                elif h == star:
                    x = np.exp(rng.standard_normal(T_res) * 8.0)
                    A[l, h, u, n_sink:] = (1 - sink) * x / x.sum()
                else:
                    x = np.exp(rng.standard_normal(T_res) * sib_scale * (l + 1) / L)
                    A[l, h, u, n_sink:] = (1 - sink) * x / x.sum()
    hg = np.zeros(r, dtype=np.int64)
    ref = reference(A, hg, n_sink, zeta, tau, 1e-9)
    res = HeadPooling(zeta=zeta, tau=tau, rho_min=1e-9).pool(torch.from_numpy(A), torch.from_numpy(hg), n_sink)
    for l in range(L):
        Hs = ref["H"][l]
        Delta = float(np.min(np.delete(Hs, star) - Hs[star]))  # largest Δ the premise allows (< 0 possible)
        w_star = float(res.w[l, star])
        lower = dominant_head_bound(zeta, tau, r, Delta)
        assert w_star >= lower - 1e-12 * max(1.0, lower)
        assert w_star <= zeta / r + (1 - zeta) + 1e-12
        if star_kind == "point":
            assert Delta >= 0.0
            assert w_star >= zeta / r + (1 - zeta) / r - 1e-12  # lowest entropy ⇒ at least the uniform share


@PROP_1000
@given(Delta=st.floats(0.0, 5.0), seed=seeds)
def test_bound_6_equality_when_siblings_tied(Delta, seed):
    """All siblings at exactly H* + Δ: (6) holds with equality (the bound is sharp)."""
    rng = np.random.default_rng(seed)
    r = int(rng.integers(2, 7))
    zeta, tau = draw_zeta_tau(rng)
    T = 40 + int(rng.integers(0, 6))
    m1 = 2
    C_star = 1.0 / m1  # h*: uniform over 2 keys
    C_sib = C_star * math.exp(-Delta)  # H_sib = H* + Δ
    if C_sib < 1.0 / T:
        C_sib = 1.0 / T
        Delta = math.log(C_star / C_sib)
    # sibling p = (1-t)·uniform_T + t·δ_0 has collision 1/T + t²(1 - 1/T)
    t = math.sqrt(max(C_sib - 1.0 / T, 0.0) / (1 - 1.0 / T))
    sib = np.full(T, (1 - t) / T)
    sib[0] += t
    star_row = np.zeros(T)
    star_row[:m1] = 1.0 / m1
    A = np.stack([star_row] + [sib] * (r - 1))[None, :, None, :]
    res = HeadPooling(zeta=zeta, tau=tau).pool(torch.from_numpy(A), torch.zeros(r, dtype=torch.int64), 0)
    assert_close(float(res.C[0, 1]), C_sib, rtol=1e-12)
    Delta_eff = math.log(float(res.C[0, 0]) / float(res.C[0, 1]))
    assert_close(Delta_eff, Delta, atol=1e-9)
    assert_close(float(res.w[0, 0]), dominant_head_bound(zeta, tau, r, Delta_eff), rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- sink heads
@PROP_1000
@given(n_heads=st.integers(1, 6), seed=seeds)
def test_uniform_residual_has_collision_one_over_n(n_heads, seed):
    """Head h has residual uniform over ns[h] positions (random sink mass per row) ⇒ C_h = 1/ns[h]."""
    rng = np.random.default_rng(seed)
    ns = [int(x) for x in rng.integers(1, 401, size=n_heads)]
    n_sink = int(rng.integers(0, 5))
    W = int(rng.integers(1, 4))
    T = n_sink + max(ns) + int(rng.integers(0, 21))
    Hn = len(ns)
    A = np.zeros((1, Hn, W, T))
    for h, n in enumerate(ns):
        support = rng.choice(np.arange(n_sink, T), size=n, replace=False)
        for u in range(W):  # each row: its own sink mass, uniform over the head's n positions
            s = rng.random() * 0.99 if n_sink else 0.0
            if n_sink:
                A[0, h, u, :n_sink] = s * rng.dirichlet(np.ones(n_sink))
            A[0, h, u, support] = (1 - s) / n
    res = HeadPooling().pool(torch.from_numpy(A), torch.arange(Hn), n_sink)
    assert_close(res.C[0].numpy(), 1.0 / np.array(ns), rtol=1e-12)
    assert_close(res.H[0].numpy(), np.log(ns), rtol=0, atol=1e-12)


@PROP_BATCH
@given(r=st.integers(2, 5), seed=seeds)
def test_sink_head_weight_closed_form(r, seed):
    """Sink head (mass on sinks, residual uniform over n keys) vs sharp siblings with collision c_h:
    v_sink = n^{-1/τ} / (n^{-1/τ} + Σ_h c_h^{1/τ}); w_sink - ζ/r ≤ (1-ζ)(n max c_h)^{-1/τ} → 0.

    Four cases per example, one per layer, with n = ns[l] log-uniform in [3, 2000]."""
    rng = np.random.default_rng(seed)
    L = 4
    ns = [int(x) for x in np.round(10 ** rng.uniform(np.log10(3), np.log10(2000), size=L))]
    zeta, _ = draw_zeta_tau(rng)
    tau = float(10 ** rng.uniform(np.log10(0.05), np.log10(20)))
    sib_keys = int(rng.integers(1, 4))
    n_sink = 4
    T = n_sink + max(ns)
    A = np.zeros((L, r, 1, T))
    logc = np.zeros((L, r - 1))
    for l, n in enumerate(ns):
        A[l, 0, 0, :n_sink] = 0.95 / n_sink
        A[l, 0, 0, n_sink : n_sink + n] = 0.05 / n
        for h in range(1, r):
            x = rng.dirichlet(np.ones(sib_keys) * 0.5)
            A[l, h, 0, n_sink : n_sink + sib_keys] = x
            logc[l, h - 1] = math.log(np.sum(x**2))
    res = HeadPooling(zeta=zeta, tau=tau).pool(torch.from_numpy(A), torch.zeros(r, dtype=torch.int64), n_sink)
    for l, n in enumerate(ns):
        log_num = -math.log(n) / tau
        log_den = np.logaddexp.reduce(np.concatenate([[log_num], logc[l] / tau]))
        v_sink = math.exp(log_num - log_den)
        assert_close(float(res.v[l, 0]), v_sink, rtol=1e-9, atol=1e-300)
        assert_close(float(res.w[l, 0]), zeta / r + (1 - zeta) * v_sink, rtol=1e-12)
        excess = float(res.w[l, 0]) - zeta / r
        assert excess >= -1e-15
        assert excess <= (1 - zeta) * math.exp(-(math.log(n) + logc[l].max()) / tau) * (1 + 1e-9) + 1e-15


def test_sink_head_weight_tends_to_floor():
    zeta, tau, r = 0.3, 0.5, 3
    prev = None
    for n in (4, 16, 64, 256, 1024, 4096):
        T = 4 + n
        A = np.zeros((1, r, 1, T))
        A[0, 0, 0, :4] = 0.9 / 4
        A[0, 0, 0, 4:] = 0.1 / n
        A[0, 1, 0, 4:6] = [0.7, 0.3]
        A[0, 2, 0, 4:7] = [0.5, 0.25, 0.25]
        w = float(HeadPooling(zeta=zeta, tau=tau).pool(torch.from_numpy(A), torch.zeros(r, dtype=torch.int64), 4).w[0, 0])
        assert w > zeta / r
        if prev is not None:
            assert w < prev  # strictly decreasing in n
        prev = w
    assert prev - zeta / r < 1e-6  # n = 4096, τ = 0.5: (1-ζ)·n^{-2}/0.58² ≈ 1.2e-7


# ----------------------------------------------------------------------------- edge cases
def test_zeta_one_gives_uniform_weights():
    rng = np.random.default_rng(0)
    A = random_rows(rng, 2, 6, 3, 20, 4, 10.0, 0.5, 0.0)
    res = HeadPooling(zeta=1.0, tau=1e-4).pool(torch.from_numpy(A), torch.arange(6) // 3, 4)
    assert torch.equal(res.w, torch.full((2, 6), 1.0 / 3, dtype=torch.float64))
    assert_close(res.mu.numpy(), A.mean(axis=(1, 2)), rtol=1e-12)


def test_ties_give_equal_weights():
    row = np.array([0.1, 0.1, 0.4, 0.3, 0.1])
    A = np.tile(row, (1, 4, 2, 1))
    A[0, 2:, :, :] = np.roll(row, 1)  # group 1: a permuted copy (same entropy, different keys)
    res = HeadPooling(zeta=0.2, tau=1e-4).pool(torch.from_numpy(A), torch.tensor([0, 0, 1, 1]), 1)
    assert_close(res.v.numpy(), 0.5, rtol=0, atol=1e-15)
    assert_close(res.w.numpy(), 0.5, rtol=0, atol=1e-15)


def test_small_tau_selects_lowest_entropy_without_overflow():
    A = np.zeros((1, 3, 1, 30))
    A[0, 0, 0, 1:] = 1 / 29  # diffuse
    A[0, 1, 0, 1:3] = 0.5  # H = ln 2
    A[0, 2, 0, 1:5] = 0.25  # H = ln 4
    for tau in (1e-4, 1e-8, 1e-300, 5e-324):  # 5e-324: -H/τ itself overflows to -inf
        res = HeadPooling(zeta=0.1, tau=tau).pool(torch.from_numpy(A), torch.zeros(3, dtype=torch.int64), 1)
        assert torch.isfinite(res.v).all() and torch.isfinite(res.w).all()
        assert_close(res.v[0].numpy(), [0.0, 1.0, 0.0], atol=1e-300)
        assert_close(res.w[0].numpy(), [0.1 / 3, 0.1 / 3 + 0.9, 0.1 / 3], rtol=1e-15)
    res = HeadPooling(zeta=0.1, tau=1e6).pool(torch.from_numpy(A), torch.zeros(3, dtype=torch.int64), 1)
    assert_close(res.v[0].numpy(), 1 / 3, atol=1e-5)  # huge τ: nearly uniform


def test_sink_only_head_is_invalid():
    A = np.zeros((2, 4, 2, 10))
    A[..., 4:] = 1 / 6
    A[0, 1, :, :] = 0.0
    A[0, 1, :, :4] = 0.25  # layer 0, head 1: attends to sinks only (z = 0)
    A[1, 2:, :, :] = 0.0
    A[1, 2:, :, 0] = 1.0  # layer 1: the whole group 1 attends to sink 0
    res = HeadPooling(zeta=0.4).pool(torch.from_numpy(A), torch.tensor([0, 0, 1, 1]), 4)
    assert res.valid_head.tolist() == [[True, False, True, True], [True, True, False, False]]
    assert res.valid.tolist() == [False, False]
    assert res.H[0, 1] == math.inf and res.v[0, 1] == 0.0 and res.C[0, 1] == 0.0
    assert float(res.v[0, 0]) == 1.0
    assert_close(res.w[0, :2].numpy(), [0.2 + 0.6, 0.2])
    assert_close(res.v[1, 2:].numpy(), [0.5, 0.5])  # whole group invalid: uniform
    assert_close(res.w[1, 2:].numpy(), [0.5, 0.5])
    assert_close(res.mu.sum(-1).numpy(), 1.0, atol=1e-15)
    # sink mass of the pooled measure: group 1 of layer 1 puts all its 1/G = 1/2 on sink 0
    assert_close(float(res.mu[1, 0]), 0.5, atol=1e-15)


def test_residual_below_threshold_is_invalid():
    A = np.zeros((1, 2, 1, 6))
    A[0, 0, 0, :] = [0.999, 0, 0, 0, 0.0005, 0.0005]  # z = 1e-3
    A[0, 1, 0, :] = [0.5, 0, 0, 0.25, 0.25, 0.0]
    hg = torch.zeros(2, dtype=torch.int64)
    assert HeadPooling(rho_min=1e-3).pool(torch.from_numpy(A), hg, 1).valid_head.tolist() == [[False, True]]
    assert HeadPooling(rho_min=9.99e-4).pool(torch.from_numpy(A), hg, 1).valid_head.tolist() == [[True, True]]


def test_no_sinks_and_single_key():
    A = np.zeros((1, 2, 1, 1))
    A[..., 0] = 1.0
    res = HeadPooling().pool(torch.from_numpy(A), torch.zeros(2, dtype=torch.int64), 0)
    assert res.H.tolist() == [[0.0, 0.0]] and res.valid.tolist() == [True]
    res = HeadPooling().pool(torch.from_numpy(A), torch.zeros(2, dtype=torch.int64), 1)  # n_sink = T
    assert res.valid_head.tolist() == [[False, False]]
    assert_close(res.w.numpy(), 0.5)


def test_capture_call_and_frames():
    spans = PromptSpans.synthetic([5, 3, 7])
    cap = Capture.synthetic(spans, L=3, H_Q=6, G=2, seed=3, concentration=2.0)
    p = HeadPooling(zeta=0.25, tau=0.5)
    res = p(cap)
    direct = p.pool(cap.observer_attn(), cap.head_group, spans.n_sink)
    assert isinstance(res, PoolingResult) and res.W_p == spans.W_p and res.n_sink == spans.n_sink
    # the capture path sums μ as ζ Σ a_h/r + (1-ζ) Σ v_h a_h (memoised per τ): equal up to float64 rounding
    assert torch.allclose(res.mu, direct.mu, rtol=1e-12, atol=1e-15) and torch.equal(res.w, direct.w)
    assert res.mu.shape == (3, spans.T)
    assert_close(res.mu.sum(-1).numpy(), 1.0, atol=1e-6)  # float32 rows
    df = res.to_frame()
    assert len(df) == 3 * 6
    assert list(df.columns) == ["layer", "head", "group", "z", "valid_head", "valid_layer", "C", "H", "v", "w", "omega"]
    row = df[(df["layer"] == 2) & (df["head"] == 4)].iloc[0]
    assert row.group == 1 and row.w == float(res.w[2, 4]) and row.H == float(res.H[2, 4])
    mf = res.mu_frame()
    assert len(mf) == 3 * spans.T and mf.sink.sum() == 3 * spans.n_sink
    assert float(mf[(mf.layer == 1) & (mf.pos == 9)].mu.iloc[0]) == float(res.mu[1, 9])


def test_speed_L30_H9_W8_T2048():
    g = torch.Generator().manual_seed(0)
    A = torch.softmax(torch.randn(30, 9, 8, 2048, generator=g) * 3, dim=-1)
    hg = torch.arange(9) // 3
    p = HeadPooling(tau=1e-4)
    p.pool(A, hg, 4)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        res = p.pool(A, hg, 4)
        times.append(time.perf_counter() - t0)
    assert torch.isfinite(res.mu).all()
    assert min(times) < 0.1, times  # measured ≈ 5 ms on 2 CPU cores
