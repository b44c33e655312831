"""Tests of the deletion envelope and the output bound (SPEC §4)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _examples import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.analyse.envelope import (
    EnvelopeResult,
    chi2_divergence,
    envelope,
    envelope_all_layers,
    output_bound,
    output_shift,
)
from workbench.analyse.pooling import HeadPooling
from workbench.capture.data import Capture
from workbench.run.spans import PromptSpans

PROP = settings(max_examples=examples(500), deadline=None, database=None)
PROP_CAPTURE = settings(max_examples=examples(150), deadline=None, database=None,
                        suppress_health_check=[HealthCheck.too_slow])  # 3 removal sets × 1–2 layers each
PROP_1000 = settings(max_examples=examples(250), deadline=None, database=None)
# Each example draws a seed (plus at most two categorical choices) and builds the rest with numpy.
seeds = st.integers(0, 2**32 - 1)


from _numeric import _single_thread_torch, assert_close  # noqa: E402,F401  (autouse fixture)


# ----------------------------------------------------------------------------- helpers
def np_envelope(A, mu, omega, E):
    """Reference η, q, D_χ², bound for rows A [R, T] (numpy, literal SPEC §4)."""
    eta = A[:, E].sum(-1)
    q = mu[E].sum()
    pos = mu > 0
    D = ((A[:, pos] - mu[pos]) ** 2 / mu[pos]).sum(-1)
    bound = np.minimum(np.minimum(1.0, q / omega), q + np.sqrt(D * max(q * (1 - q), 0.0)))
    return eta, q, D, bound


def check_against_reference(res, A_rows, mu, omega_rows, E, tol):
    H, W, T = A_rows.shape
    A = A_rows.reshape(H * W, T)
    eta, q, D, bound = np_envelope(A, mu, omega_rows.reshape(-1), E)
    # the inequalities themselves, on independently computed numbers
    assert (eta <= bound + tol).all(), (eta - bound).max()
    assert (D <= 1 / omega_rows.reshape(-1) - 1 + tol * (1 / omega_rows.reshape(-1))).all()
    # the implementation reports the same numbers
    assert_close(res.eta.numpy(), eta, rtol=1e-12, atol=1e-15)
    assert res.q == pytest.approx(q, rel=1e-12, abs=1e-15)
    assert_close(res.dchi2.numpy(), D, rtol=1e-10, atol=1e-13)
    assert_close(res.bound.numpy(), bound, rtol=1e-10, atol=1e-13)
    assert_close(res.dchi2_cap.numpy(), 1 / omega_rows.reshape(-1) - 1, rtol=1e-14)
    assert res.holds.all()


def make_capture(seed):
    """Capture.synthetic on a random layout: 1–5 chunks, 1–2 layers, G ∈ {1,2}, r ∈ {1,2,3},
    concentration ∈ {0.1, 1, 3, 10, 30} (diffuse to nearly one-hot rows)."""
    rng = np.random.default_rng(seed)
    sizes = [int(x) for x in rng.integers(1, 9, size=rng.integers(1, 6))]
    G, r = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    spans = PromptSpans.synthetic(sizes, query_len=int(rng.integers(1, 9)), gap=int(rng.integers(0, 3)))
    conc = float(rng.choice([0.1, 1.0, 3.0, 10.0, 30.0]))
    return Capture.synthetic(spans, L=int(rng.integers(1, 3)), H_Q=G * r, G=G, seed=int(rng.integers(0, 2**31)),
                             concentration=conc)


# ----------------------------------------------------------------------------- envelope from real pooling
@PROP_CAPTURE
@given(seed=seeds)
def test_envelope_holds_on_pooled_captures(seed):
    """μ from HeadPooling on Capture.synthetic rows; random unions of chunks E; every row, every layer."""
    rng = np.random.default_rng(seed)
    cap = make_capture(int(rng.integers(0, 2**32)))
    zeta = 1.0 if rng.random() < 0.1 else float(10 ** rng.uniform(-3, 0))
    tau = float(10 ** rng.uniform(-4, 1))
    spans = cap.spans
    A32 = cap.observer_attn()  # float32 rows as captured
    A64 = A32.double() / A32.double().sum(-1, keepdim=True)  # exactly normalised float64 rows
    hp = HeadPooling(zeta=zeta, tau=tau)
    pooled32 = hp.pool(A32, cap.head_group, spans.n_sink)
    pooled64 = hp.pool(A64, cap.head_group, spans.n_sink)
    for _ in range(3):
        removed = [i for i in range(spans.k) if rng.random() < 0.5]
        E = spans.removal_mask(removed)
        for l in range(cap.L):
            W = A32.shape[2]
            om = pooled64.omega[l].numpy()[:, None].repeat(W, axis=1)
            res = envelope(A64[l], pooled64.mu[l], pooled64.omega[l], E, atol=1e-12, layer=l)
            check_against_reference(res, A64[l].numpy(), pooled64.mu[l].numpy(), om, E.numpy(), 1e-12)
            # float32 rows (sums 1 ± 1e-7): the bound holds to the documented tolerance
            res32 = envelope(A32[l], pooled32.mu[l], pooled32.omega[l], E, layer=l)
            assert res32.holds.all()
            assert (res32.dchi2 <= res32.dchi2_cap + 1e-6 / res32.omega).all()
            # the ratio term never needs a tolerance: μ_j ≥ ω A_j entrywise
            assert (res32.eta <= res32.term_ratio * (1 + 1e-12)).all()


# ----------------------------------------------------------------------------- adversarial constructions
@PROP
@given(
    rows_kind=st.sampled_from(["dirichlet", "points", "disjoint"]),
    E_kind=st.sampled_from(["random", "ratio_prefix", "support", "complement", "all"]),
    seed=seeds,
)
def test_envelope_holds_adversarial(rows_kind, E_kind, seed):
    """μ = Σ_a ω_a A_a for arbitrary rows and weights; E any set, including the worst-ratio prefixes."""
    rng = np.random.default_rng(seed)
    R, T = int(rng.integers(1, 9)), int(rng.integers(1, 41))
    alpha = float(rng.choice([0.003, 0.03, 0.3, 3.0]))
    omega_alpha = float(rng.choice([0.05, 1.0, 20.0]))
    if rows_kind == "dirichlet":
        A = rng.dirichlet(np.full(T, alpha), size=R)
    elif rows_kind == "points":
        A = np.zeros((R, T))
        A[np.arange(R), rng.integers(0, T, size=R)] = 1.0
    else:  # disjoint supports where possible
        A = np.zeros((R, T))
        blocks = np.array_split(rng.permutation(T), R)
        for a, b in enumerate(blocks):
            if len(b) == 0:
                b = rng.integers(0, T, size=1)
            A[a, b] = rng.dirichlet(np.full(len(b), alpha))
    omega = rng.dirichlet(np.full(R, omega_alpha))
    omega = np.maximum(omega, 1e-12)
    omega /= omega.sum()
    mu = omega @ A
    a0 = rng.integers(0, R)
    if E_kind == "random":
        E = rng.random(T) < rng.random()
    elif E_kind == "ratio_prefix":  # the positions where row a0 is most over-represented in μ
        ratio = np.where(mu > 0, A[a0] / np.where(mu > 0, mu, 1), 0)
        E = np.zeros(T, dtype=bool)
        E[np.argsort(-ratio)[: rng.integers(0, T + 1)]] = True
    elif E_kind == "support":
        E = A[a0] > 0
    elif E_kind == "complement":
        E = A[a0] == 0
    else:
        E = np.ones(T, dtype=bool)
    A_rows = A[:, None, :]  # H = R heads, W = 1
    res = envelope(torch.from_numpy(A_rows), torch.from_numpy(mu), torch.from_numpy(omega), torch.from_numpy(E),
                   atol=1e-12)
    check_against_reference(res, A_rows, mu, omega[:, None], E, 1e-12)
    if E_kind == "all":
        assert res.q == pytest.approx(1.0, abs=1e-12)
        assert_close(res.eta.numpy(), 1.0, atol=1e-12)
        assert_close(res.bound.numpy(), 1.0, atol=1e-12)
    if rows_kind == "disjoint" and R <= T:  # disjoint supports attain the cap D_χ² = 1/ω - 1
        assert_close(res.dchi2.numpy(), 1 / omega - 1, rtol=1e-9, atol=1e-9)


@PROP
@given(omega=st.floats(1e-6, 1 - 1e-6), seed=seeds)
def test_sharpness_example(omega, seed):
    """a = δ_point, b supported elsewhere, μ = ωa + (1-ω)b, E = supp a ⇒ q = ω, η = 1, both terms = 1."""
    rng = np.random.default_rng(seed)
    T = int(rng.integers(2, 61))
    point = int(rng.integers(0, T))
    beta = float(rng.choice([0.05, 1.0, 10.0]))
    a = np.zeros(T)
    a[point] = 1.0
    b = rng.dirichlet(np.full(T - 1, beta))
    b = np.insert(b, point, 0.0)
    mu = omega * a + (1 - omega) * b
    E = np.zeros(T, dtype=bool)
    E[point] = True
    rows = np.stack([a, b])[:, None, :]
    res = envelope(torch.from_numpy(rows), torch.from_numpy(mu), torch.tensor([omega, 1 - omega], dtype=torch.float64),
                   torch.from_numpy(E), atol=0.0)
    assert res.q == pytest.approx(omega, rel=1e-12)
    assert float(res.eta[0]) == 1.0 and float(res.eta[1]) == 0.0
    assert float(res.term_ratio[0]) == pytest.approx(1.0, abs=1e-9)
    assert float(res.term_chi2[0]) == pytest.approx(1.0, abs=1e-9)
    assert float(res.dchi2[0]) == pytest.approx(1 / omega - 1, rel=1e-9)
    assert float(res.bound[0]) == pytest.approx(1.0, abs=1e-9)
    assert float(res.bound[0]) <= 1.0  # the min with 1 is part of the envelope


# ----------------------------------------------------------------------------- output bound
@PROP
@given(seed=seeds)
def test_output_bound_and_attainability(seed):
    rng = np.random.default_rng(seed)
    T, d = int(rng.integers(2, 41)), int(rng.integers(1, 9))
    alpha = float(rng.choice([0.05, 0.5, 5.0]))
    p_remove = float(rng.random())
    a = rng.dirichlet(np.full(T, alpha)) + 1e-3
    a /= a.sum()  # every key has some mass, so 0 < η < 1
    E = rng.random(T) < p_remove
    E[0], E[1] = True, False  # E and its complement both non-empty
    eta = a[E].sum()
    # random values: ‖o - o_R‖ ≤ 2Vη
    vals = rng.standard_normal((T, d)) * rng.uniform(0.1, 10, size=(T, 1))
    V = np.linalg.norm(vals, axis=1).max()
    o, o_R, shift, eta_out = output_shift(torch.from_numpy(a), torch.from_numpy(vals), torch.from_numpy(E))
    assert eta_out == pytest.approx(eta, rel=1e-12)
    assert_close(o.numpy(), a @ vals, rtol=1e-10, atol=1e-12)
    keep = ~E
    assert_close(o_R.numpy(), (a[keep] @ vals[keep]) / a[keep].sum(), rtol=1e-10, atol=1e-12)
    assert 0 < eta < 1
    assert shift <= output_bound(eta, V) * (1 + 1e-9) + 1e-12
    # attainability: discarded values V e, retained values -V e ⇒ ‖o - o_R‖ = 2Vη
    e = rng.standard_normal(d)
    e /= np.linalg.norm(e)
    vals2 = np.where(E[:, None], V * e, -V * e)
    *_, shift2, _ = output_shift(torch.from_numpy(a), torch.from_numpy(vals2), torch.from_numpy(E))
    assert shift2 == pytest.approx(output_bound(eta, V), rel=1e-9, abs=1e-12)


def test_output_bound_edge_cases():
    assert output_bound(0.25, 3.0) == 1.5
    t = output_bound(torch.tensor([0.0, 0.5]), torch.tensor([2.0, 2.0]))
    assert t.tolist() == [0.0, 2.0]
    with pytest.raises(ValueError, match="V: must be >= 0"):
        output_bound(0.1, -1.0)
    a = torch.tensor([0.5, 0.5], dtype=torch.float64)
    vals = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    o, o_R, shift, eta = output_shift(a, vals, torch.tensor([False, False]))  # η = 0: no change
    assert eta == 0.0 and shift == 0.0 and torch.equal(o, o_R)
    o, o_R, shift, eta = output_shift(a, vals, torch.tensor([True, True]))  # η = 1: nothing retained
    assert eta == 1.0 and math.isnan(shift) and torch.isnan(o_R).all()


# ----------------------------------------------------------------------------- validation and plumbing
def test_input_validation():
    A = torch.full((2, 1, 4), 0.25, dtype=torch.float64)
    mu = torch.full((4,), 0.25, dtype=torch.float64)
    E = torch.tensor([True, False, False, False])
    om = torch.tensor([0.5, 0.5])
    with pytest.raises(ValueError, match="A_rows: must have shape"):
        envelope(A[0], mu, om, E)
    with pytest.raises(ValueError, match="mu: must have shape"):
        envelope(A, mu[:3], om, E)
    with pytest.raises(ValueError, match="removed: must be a bool mask"):
        envelope(A, mu, om, E.long())
    with pytest.raises(ValueError, match="omega: must have shape"):
        envelope(A, mu, torch.ones(3), E)
    with pytest.raises(ValueError, match="omega: every entry must be a finite number > 0"):
        envelope(A, mu, torch.tensor([0.5, 0.0]), E)
    with pytest.raises(ValueError, match="atol: must be a finite number >= 0"):
        envelope(A, mu, om, E, atol=-1.0)
    with pytest.raises(ValueError, match="mu: must be finite and non-negative"):
        envelope(A, -mu, om, E)


def test_empty_removal_and_frame():
    spans = PromptSpans.synthetic([3, 4])
    cap = Capture.synthetic(spans, L=2, H_Q=4, G=2, seed=1)
    pooled = HeadPooling()(cap)
    res = envelope(cap.observer_attn()[0], pooled.mu[0], pooled.omega[0], spans.removal_mask([]))
    assert res.q == 0.0 and (res.eta == 0).all() and (res.bound == 0).all() and res.holds.all()
    W = spans.W_p
    df = res.to_frame()
    assert len(df) == 4 * W
    assert list(df.columns) == ["layer", "a", "head", "u", "eta", "q", "omega", "dchi2", "dchi2_cap",
                                "term_ratio", "term_chi2", "bound", "holds"]
    res = envelope(cap.observer_attn()[1], pooled.mu[1], pooled.omega[1], spans.removal_mask([1]), layer=1)
    df = res.to_frame()
    row = df.iloc[2 * W + 3]
    assert (row["head"], row["u"], row["layer"]) == (2, 3, 1)
    assert row["eta"] == pytest.approx(float(cap.observer_attn()[1, 2, 3][spans.removal_mask([1])].double().sum()))
    assert isinstance(res, EnvelopeResult)


def test_envelope_all_layers_forms_and_k0():
    spans = PromptSpans.synthetic([3, 4, 2])
    cap = Capture.synthetic(spans, L=3, H_Q=4, G=2, seed=2, concentration=4.0)
    pooled = HeadPooling(zeta=0.3)(cap)
    as_lists = envelope_all_layers(cap, pooled, [[0], [1, 2], []])
    as_masks = envelope_all_layers(cap, pooled, [spans.removal_mask(x) for x in ([0], [1, 2], [])])
    as_dict = envelope_all_layers(cap, pooled, {2: [], 0: [0]})
    assert [r.layer for r in as_lists] == [0, 1, 2] and [r.layer for r in as_dict] == [0, 2]
    for x, y in zip(as_lists, as_masks):
        assert torch.equal(x.bound, y.bound) and x.q == y.q
    assert torch.equal(as_dict[0].eta, as_lists[0].eta) and torch.equal(as_dict[1].eta, as_lists[2].eta)
    assert all(r.holds.all() for r in as_lists)
    assert as_lists[1].q == pytest.approx(float(pooled.mu[1][spans.removal_mask([1, 2])].sum()))
    with pytest.raises(ValueError, match="removed_by_layer: needs one entry per layer"):
        envelope_all_layers(cap, pooled, [[0]])
    with pytest.raises(ValueError, match="removed_by_layer: layer 5 out of range"):
        envelope_all_layers(cap, pooled, {5: [0]})
    # k = 0: ordinary inference, the only removal is the empty one
    spans0 = PromptSpans.synthetic([])
    cap0 = Capture.synthetic(spans0, L=2, seed=0)
    out = envelope_all_layers(cap0, HeadPooling()(cap0), [[], []])
    assert all(r.q == 0.0 and (r.eta == 0).all() and r.holds.all() for r in out)


def test_chi2_ignores_zero_mu_keys():
    A = torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64)
    mu = torch.tensor([0.25, 0.75, 0.0], dtype=torch.float64)
    # (0.25²/0.25) + (0.25²/0.75) = 0.25 + 1/12
    assert float(chi2_divergence(A, mu)[0]) == pytest.approx(0.25 + 1 / 12, rel=1e-14)
