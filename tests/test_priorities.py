"""Tests of null-calibrated chunk priorities and the comparison priorities (SPEC §3)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from _examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.analyse.priorities import (
    ChunkPriorities,
    PriorityResult,
    mass_only_priorities,
    per_head_max_priorities,
    uniform_priorities,
)
from workbench.run.spans import PromptSpans

PROP = settings(max_examples=examples(500), deadline=None, database=None)
# Each example draws a layout (k, seed) and a seed from hypothesis and builds the rest with numpy
# (hypothesis' per-draw overhead otherwise dominates). Secondary properties check every chunk of
# 1–3 layers per example, so 600–1000 examples are still thousands of chunk-level cases.
PROP_1000 = settings(max_examples=examples(250), deadline=None, database=None)
PROP_600 = settings(max_examples=examples(150), deadline=None, database=None)
seeds = st.integers(0, 2**32 - 1)


from _numeric import _single_thread_torch, assert_close  # noqa: E402,F401  (autouse fixture)


# ----------------------------------------------------------------------------- helpers
def reference(mu, spans, eps, lam, rho_min=1e-6):
    """Literal numpy transcription of SPEC §3, one layer and one chunk at a time."""
    L, T = mu.shape
    k = spans.k
    n = np.array([e - s for s, e in spans.chunks])
    N = n.sum()
    D = np.zeros(T, dtype=bool)
    for s, e in spans.chunks:
        D[s:e] = True
    out = {key: np.full((L, k), np.nan) for key in ("M", "ell", "kappa", "S")}
    out["pi"] = n / N if k else np.zeros(0)
    out["doc_mass"] = mu[:, D].sum(-1)
    out["valid"] = out["doc_mass"] > rho_min
    out["phat_sums"] = np.full((L, k), np.nan)
    for l in range(L):
        if not out["valid"][l]:
            continue
        p = np.where(D, mu[l] / out["doc_mass"][l], 0.0)
        for i, (s, e) in enumerate(spans.chunks):
            ni, pi = n[i], n[i] / N
            M = p[s:e].sum()
            phat = (p[s:e] + eps * pi / ni) / (M + eps * pi)
            ell = (M + eps * pi) / ((1 + eps) * pi)
            kappa = math.log(ni * np.sum(phat**2)) / math.log(ni) if ni >= 2 else 0.0
            out["M"][l, i], out["ell"][l, i], out["kappa"][l, i] = M, ell, kappa
            out["S"][l, i] = math.log(ell) + lam * kappa
            out["phat_sums"][l, i] = phat.sum()
    return out


def make_layout(k, seed, max_n=9):
    """A random PromptSpans with k candidate chunks of sizes 1..max_n (sinks, gaps, query, suffix random)."""
    rng = np.random.default_rng(seed)
    sizes = [int(x) for x in rng.integers(1, max_n + 1, size=k)]
    n_sink = int(rng.integers(0, 5))
    return PromptSpans.synthetic(sizes, prefix=n_sink + int(rng.integers(0, 4)), n_sink=n_sink,
                                 gap=int(rng.integers(0, 3)), query_len=int(rng.integers(1, 7)),
                                 suffix=int(rng.integers(0, 4)))


def layouts(min_k=0, max_k=6):
    return st.builds(make_layout, k=st.integers(min_k, max_k), seed=seeds)


def draw_eps_lam(rng):
    """ε_s log-uniform in [1e-6, 10]; λ = 0 in 10% of cases, else uniform in [0, 5]."""
    eps = float(10 ** rng.uniform(-6, 1))
    lam = 0.0 if rng.random() < 0.1 else float(rng.uniform(0, 5))
    return eps, lam


def random_mu(rng, L, T, spans, kind):
    if kind == "dirichlet_sharp":
        mu = rng.dirichlet(np.full(T, 0.05), size=L)
    elif kind == "dirichlet_flat":
        mu = rng.dirichlet(np.full(T, 5.0), size=L)
    elif kind == "sparse":
        mu = rng.random((L, T)) * (rng.random((L, T)) < 0.3)
        mu[:, 0] += 1e-3
        mu /= mu.sum(-1, keepdims=True)
    else:  # "tiny_docs": almost everything on the sinks/protected tokens
        mu = rng.dirichlet(np.ones(T), size=L)
        D = spans.document_mask().numpy()
        mu[:, D] *= 10.0 ** rng.uniform(-9, -3, size=(L, 1))
        mu /= mu.sum(-1, keepdims=True)
    return mu


# ----------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(eps_s=0), "eps_s: must be > 0, got 0"),
        (dict(eps_s=-0.1), "eps_s: must be > 0"),
        (dict(eps_s=float("nan")), "eps_s: must be a finite real number > 0"),
        (dict(eps_s=float("inf")), "eps_s: must be a finite real number > 0"),
        (dict(lam=-0.5), "lam: must be >= 0, got -0.5"),
        (dict(lam=float("inf")), "lam: must be a finite real number >= 0"),
        (dict(lam="1"), "lam: must be a finite real number"),
        (dict(rho_min=0), "rho_min: must be in (0, 1)"),
        (dict(rho_min=2), "rho_min: must be in (0, 1), got 2"),
    ],
)
def test_parameter_validation(kwargs, msg):
    with pytest.raises(ValueError) as e:
        ChunkPriorities(**kwargs)
    assert msg in str(e.value)


def test_defaults_frozen_and_input_validation():
    cp = ChunkPriorities()
    assert (cp.eps_s, cp.lam, cp.rho_min) == (0.1, 0.5, 1e-6)
    ChunkPriorities(lam=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cp.lam = 1.0  # type: ignore[misc]
    spans = PromptSpans.synthetic([3, 2])
    with pytest.raises(ValueError, match="mu: must have shape"):
        cp.score(torch.ones(2, spans.T + 1), spans)
    with pytest.raises(ValueError, match="mu: must be finite and non-negative"):
        cp.score(-torch.ones(spans.T), spans)
    with pytest.raises(ValueError, match="mu: must be finite and non-negative"):
        cp.score(torch.full((spans.T,), math.nan), spans)
    with pytest.raises(ValueError, match="order: must be one of"):
        uniform_priorities(spans, 2, order="size")
    with pytest.raises(ValueError, match="L: must be an integer >= 0"):
        uniform_priorities(spans, -1)
    with pytest.raises(ValueError, match="a: must have shape"):
        per_head_max_priorities(torch.ones(2, spans.T), spans)


# ----------------------------------------------------------------------------- properties
@PROP
@given(spans=layouts(), seed=seeds)
def test_priorities_match_reference_and_inequality_10(spans, seed):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, 4))
    kind = rng.choice(["dirichlet_sharp", "dirichlet_flat", "sparse", "tiny_docs"])
    eps, lam = draw_eps_lam(rng)
    mu = random_mu(rng, L, spans.T, spans, kind)
    res = ChunkPriorities(eps_s=eps, lam=lam).score(torch.from_numpy(mu), spans)
    ref = reference(mu, spans, eps, lam)
    k = spans.k
    assert res.M.shape == res.ell.shape == res.kappa.shape == res.S.shape == (L, k)
    assert res.pi.shape == (k,) and res.p.shape == (L, spans.T)
    assert np.array_equal(res.valid.numpy(), ref["valid"])
    assert_close(res.doc_mass.numpy(), ref["doc_mass"], rtol=1e-12, atol=0)
    assert_close(res.pi.numpy(), ref["pi"], rtol=1e-15)
    assert_close(res.M.numpy(), ref["M"], rtol=1e-10, atol=1e-15)
    assert_close(res.ell.numpy(), ref["ell"], rtol=1e-10)
    assert_close(res.kappa.numpy(), ref["kappa"], rtol=0, atol=1e-9)
    assert_close(res.S.numpy(), ref["S"], rtol=0, atol=1e-9)
    v = res.valid.numpy()
    if k == 0:
        assert not v.any()
        return
    # κ ∈ [0, 1]; the smoothed chunk distributions sum to 1 (reference)
    kap = res.kappa.numpy()[v]
    assert (kap >= 0).all() and (kap <= 1).all()
    assert_close(ref["phat_sums"][v], 1.0, rtol=1e-12)
    # p is a distribution on 𝒟 (0 outside); chunk masses and the prior sum to 1
    D = spans.document_mask().numpy()
    p = res.p.numpy()[v]
    assert (p[:, ~D] == 0).all()
    assert_close(p.sum(-1), 1.0, rtol=1e-12)
    assert_close(res.M.numpy()[v].sum(-1), 1.0, rtol=1e-12)
    assert_close(res.pi.sum().item(), 1.0, rtol=1e-14)
    # Σ_i π_i ℓ_i = 1 (ℓ is a likelihood ratio against the null prior)
    assert_close((res.ell.numpy()[v] * res.pi.numpy()).sum(-1), 1.0, rtol=1e-12)
    # ℓ_i ≥ ε/(1+ε) (attained by a chunk with no mass)
    assert (res.ell.numpy()[v] >= eps / (1 + eps) * (1 - 1e-12)).all()
    # property (10): S_i - S_j ≥ ln(ℓ_i/ℓ_j) - λ for every pair
    S = res.S.numpy()[v]
    lell = np.log(res.ell.numpy()[v])
    lhs = S[:, :, None] - S[:, None, :]
    rhs = lell[:, :, None] - lell[:, None, :] - lam
    assert (lhs >= rhs - 1e-12).all()
    # invalid layers: no priority defined
    assert np.isnan(res.S.numpy()[~v]).all()


@PROP_1000
@given(spans=layouts(min_k=1), seed=seeds)
def test_uniform_null(spans, seed):
    """μ constant on 𝒟 (anything elsewhere) ⇒ M_i = π_i, p̂ = 1/n_i, ℓ_i = 1, κ_i = 0, S_i = 0."""
    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, 4))
    eps, lam = draw_eps_lam(rng)
    c = float(10 ** rng.uniform(-5, 3))
    D = spans.document_mask().numpy()
    mu = rng.random((L, spans.T)) * 5
    mu[:, D] = c
    res = ChunkPriorities(eps_s=eps, lam=lam).score(torch.from_numpy(mu), spans)
    assert res.valid.all()
    n = spans.n.numpy()
    assert_close(res.M.numpy(), np.broadcast_to(n / n.sum(), (L, spans.k)), rtol=1e-12)
    assert_close(res.ell.numpy(), 1.0, rtol=0, atol=1e-12)
    assert_close(res.kappa.numpy(), 0.0, rtol=0, atol=1e-12)
    assert_close(res.S.numpy(), 0.0, rtol=0, atol=1e-12)


@PROP_600
@given(spans=layouts(min_k=1), seed=seeds)
def test_chunk_constant_measure_has_zero_concentration(spans, seed):
    """μ constant inside each chunk (different across chunks) ⇒ κ = 0 and S = ln ℓ exactly."""
    rng = np.random.default_rng(seed)
    eps, lam = draw_eps_lam(rng)
    mu = rng.random(spans.T)
    for s, e in spans.chunks:
        mu[s:e] = rng.random() + 1e-3
    res = ChunkPriorities(eps_s=eps, lam=lam).score(torch.from_numpy(mu), spans)
    assert_close(res.kappa.numpy(), 0.0, atol=1e-12)
    assert_close(res.S.numpy(), np.log(res.ell.numpy()), atol=1e-12)


@PROP_600
@given(spans=layouts(min_k=1), seed=seeds)
def test_scale_invariance(spans, seed):
    """Priorities depend on μ only through p = μ/μ(𝒟)."""
    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, 3))
    eps, lam = draw_eps_lam(rng)
    scale = float(10 ** rng.uniform(-2, 6))
    mu = rng.dirichlet(np.full(spans.T, 0.3), size=L)
    mu[:, spans.document_mask().numpy()] += 1e-3  # document mass stays above ρ_min after scaling
    cp = ChunkPriorities(eps_s=eps, lam=lam)
    a = cp.score(torch.from_numpy(mu), spans)
    b = cp.score(torch.from_numpy(mu * scale), spans)
    assert_close(a.S.numpy(), b.S.numpy(), rtol=0, atol=1e-10)


@PROP_1000
@given(n=st.integers(2, 50), eps=st.floats(1e-8, 10.0), seed=seeds)
def test_point_mass_closed_form(n, eps, seed):
    """All mass on one token of chunk 0: closed forms of ℓ, κ for it and for the empty chunks."""
    rng = np.random.default_rng(seed)
    others = [int(x) for x in rng.integers(1, 10, size=rng.integers(0, 5))]
    pos = int(rng.integers(0, n))
    lam = float(rng.uniform(0, 5))
    spans = PromptSpans.synthetic([n] + others)
    mu = np.zeros(spans.T)
    mu[spans.chunks[0][0] + pos % n] = 1.0
    mu[0] = 0.7  # sink mass is ignored
    res = ChunkPriorities(eps_s=eps, lam=lam).score(torch.from_numpy(mu), spans)
    N = n + sum(others)
    pi0 = n / N
    hi = (1 + eps * pi0 / n) / (1 + eps * pi0)
    lo = (eps * pi0 / n) / (1 + eps * pi0)
    kappa0 = math.log(n * (hi**2 + (n - 1) * lo**2)) / math.log(n)
    assert_close(float(res.ell[0, 0]), (1 + eps * pi0) / ((1 + eps) * pi0), rtol=1e-12)
    assert_close(float(res.kappa[0, 0]), kappa0, rtol=1e-9, atol=1e-12)
    if eps < 1e-6:
        assert float(res.kappa[0, 0]) > 1 - 1e-5  # an unsmoothed point mass has κ → 1
    for i in range(1, 1 + len(others)):  # empty chunks: p̂ uniform, ℓ = ε/(1+ε)
        assert_close(float(res.ell[0, i]), eps / (1 + eps), rtol=1e-12)
        assert float(res.kappa[0, i]) == pytest.approx(0.0, abs=1e-12)
        assert_close(float(res.S[0, i]), math.log(eps / (1 + eps)), rtol=1e-12)


# ----------------------------------------------------------------------------- semantics and edge cases
def test_concentration_raises_priority_only_with_lambda():
    spans = PromptSpans.synthetic([4, 4])
    mu = np.zeros(spans.T)
    (s0, e0), (s1, e1) = spans.chunks
    mu[s0] = 0.5  # chunk 0: same mass, concentrated on one token
    mu[s1:e1] = 0.5 / 4  # chunk 1: diffuse
    with_lam = ChunkPriorities(lam=1.0).score(torch.from_numpy(mu), spans)
    without = ChunkPriorities(lam=0.0).score(torch.from_numpy(mu), spans)
    assert float(with_lam.ell[0, 0]) == pytest.approx(float(with_lam.ell[0, 1]), rel=1e-14)
    assert float(with_lam.S[0, 0]) > float(with_lam.S[0, 1]) + 0.5  # κ_0 ≈ 0.85, κ_1 = 0
    assert float(without.S[0, 0]) == pytest.approx(float(without.S[0, 1]), abs=1e-14)


def test_single_chunk_and_unit_chunks():
    spans = PromptSpans.synthetic([5])
    mu = torch.rand(2, spans.T, dtype=torch.float64)
    res = ChunkPriorities(lam=0.7).score(mu, spans)
    assert_close(res.M.numpy(), 1.0)
    assert_close(res.ell.numpy(), 1.0, atol=1e-15)  # (1 + ε)/((1 + ε)·1)
    assert_close(res.S.numpy(), 0.7 * res.kappa.numpy(), atol=1e-15)
    spans = PromptSpans.synthetic([1, 1, 1])
    mu = torch.rand(3, spans.T, dtype=torch.float64)
    res = ChunkPriorities(lam=3.0).score(mu, spans)
    assert torch.equal(res.kappa, torch.zeros(3, 3, dtype=torch.float64))
    assert_close(res.S.numpy(), np.log(res.ell.numpy()), atol=1e-15)


def test_no_candidates_k0():
    spans = PromptSpans.synthetic([])
    mu = torch.rand(3, spans.T, dtype=torch.float64)
    res = ChunkPriorities().score(mu, spans)
    assert res.M.shape == res.S.shape == res.kappa.shape == res.ell.shape == (3, 0)
    assert res.pi.shape == (0,)
    assert res.valid.tolist() == [False, False, False] and res.doc_mass.tolist() == [0.0, 0.0, 0.0]
    assert torch.equal(res.p, torch.zeros(3, spans.T, dtype=torch.float64))
    df = res.to_frame()
    assert len(df) == 0 and "S" in df.columns
    assert per_head_max_priorities(torch.rand(3, 2, spans.T), spans).shape == (3, 0)
    assert uniform_priorities(spans, 3, order="random").shape == (3, 0)
    assert mass_only_priorities(mu, spans).S.shape == (3, 0)


def test_invalid_layer_and_threshold():
    spans = PromptSpans.synthetic([3, 2])
    D = spans.document_mask()
    mu = torch.rand(3, spans.T, dtype=torch.float64)
    mu[1, D] = 0.0  # no document mass
    mu[2, D] = 0.0
    mu[2, spans.chunks[0][0]] = 1e-3  # document mass exactly 1e-3
    res = ChunkPriorities(rho_min=1e-3).score(mu, spans)
    assert res.valid.tolist() == [True, False, False]
    assert torch.isfinite(res.S[0]).all()
    assert torch.isnan(res.S[1:]).all() and torch.isnan(res.kappa[1:]).all() and torch.isnan(res.M[1:]).all()
    assert torch.isnan(res.p[1, D]).all() and (res.p[1, ~D] == 0).all()
    assert ChunkPriorities(rho_min=9.9e-4).score(mu, spans).valid.tolist() == [True, False, True]


def test_one_dimensional_mu_and_frame():
    spans = PromptSpans.synthetic([3, 1, 4])
    mu = torch.rand(spans.T, dtype=torch.float64)
    res = ChunkPriorities(eps_s=0.2, lam=0.3).score(mu, spans)
    assert res.S.shape == (1, 3)
    df = res.to_frame()
    assert list(df.columns) == ["layer", "chunk", "start", "end", "n", "M", "pi", "ell", "kappa", "S", "doc_mass", "valid"]
    assert len(df) == 3
    assert df["n"].tolist() == [3, 1, 4]
    assert df["start"].tolist() == [s for s, _ in spans.chunks]
    assert df["S"].tolist() == res.S[0].tolist()
    assert isinstance(res, PriorityResult)


# ----------------------------------------------------------------------------- comparison priorities
@PROP_600
@given(spans=layouts(min_k=1), seed=seeds)
def test_mass_only_orders_by_mass_per_token(spans, seed):
    rng = np.random.default_rng(seed)
    eps, _ = draw_eps_lam(rng)
    mu = rng.dirichlet(np.full(spans.T, 0.2), size=2)
    mu[:, spans.document_mask().numpy()] += 1e-4  # valid layers
    res = mass_only_priorities(torch.from_numpy(mu), spans, eps_s=eps)
    ref = ChunkPriorities(eps_s=eps, lam=0.0).score(torch.from_numpy(mu), spans)
    assert torch.equal(res.S, ref.S)
    assert_close(res.S.numpy(), np.log(res.ell.numpy()), atol=1e-15)
    density = res.M.numpy() / spans.n.numpy()
    dS = res.S.numpy()[:, :, None] - res.S.numpy()[:, None, :]
    dd = density[:, :, None] - density[:, None, :]
    big = np.abs(dd) > 1e-9
    assert (np.sign(dS[big]) == np.sign(dd[big])).all()


def test_uniform_priorities():
    spans = PromptSpans.synthetic([2, 3, 4, 5, 6, 7])
    idx = uniform_priorities(spans, 3)
    assert idx.shape == (3, 6) and idx.dtype == torch.float64
    assert idx.tolist() == [[0, 1, 2, 3, 4, 5]] * 3  # earlier chunks removed first
    r0 = uniform_priorities(spans, 2, order="random", seed=0)
    assert sorted(r0[0].tolist()) == [0, 1, 2, 3, 4, 5]  # a permutation of ranks
    assert torch.equal(r0[0], r0[1])  # same ranking at every layer
    assert torch.equal(r0, uniform_priorities(spans, 2, order="random", seed=0))  # reproducible
    perms = {tuple(uniform_priorities(spans, 1, order="random", seed=s)[0].tolist()) for s in range(10)}
    assert len(perms) > 1  # the seed matters


@PROP_600
@given(spans=layouts(min_k=1), seed=seeds)
def test_per_head_max_matches_loop(spans, seed):
    rng = np.random.default_rng(seed)
    L, H = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    a = rng.dirichlet(np.full(spans.T, 0.3), size=(L, H))
    out = per_head_max_priorities(torch.from_numpy(a), spans)
    assert out.shape == (L, spans.k)
    for l in range(L):
        for i, (s, e) in enumerate(spans.chunks):
            assert float(out[l, i]) == pytest.approx(max(a[l, h, s:e].sum() for h in range(H)), rel=1e-12)


def test_per_head_max_prefers_a_single_strong_head():
    spans = PromptSpans.synthetic([2, 2])
    (s0, _), (s1, _) = spans.chunks
    a = torch.zeros(1, 4, spans.T, dtype=torch.float64)
    a[0, 0, s0] = 0.6  # one head puts 0.6 on chunk 0 (mean over heads 0.15)
    a[0, :, s1] = 0.3  # every head puts 0.3 on chunk 1 (mean 0.3)
    out = per_head_max_priorities(a, spans)
    assert out[0].tolist() == pytest.approx([0.6, 0.3])
    # the pooled-mass ranking is the opposite: chunk 0 has less mean mass
    res = mass_only_priorities(a.mean(1), spans)
    assert float(res.S[0, 0]) < float(res.S[0, 1])
