"""GQA unions and pages (SPEC §8): bounds, the 1/(K+1) lemma, payload bytes."""
from __future__ import annotations

import math

import pytest
import torch
from _examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.analyse.pages import (
    PageSelection,
    group_scores,
    keep_sets,
    page_importance,
    page_union,
    payload_bytes,
    top_pages,
    union_over_retained,
)
from workbench.analyse.pooling import HeadPooling, PoolingResult

SETTINGS = settings(max_examples=examples(15), deadline=None)


def _rows(seed: int, L: int, H: int, T: int, conc: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(L, H, T, generator=g, dtype=torch.float64) * conc, dim=-1)


def _weights(seed: int, L: int, G: int, r: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    w = torch.rand(L, G, r, generator=g, dtype=torch.float64) + 1e-3
    return (w / w.sum(-1, keepdim=True)).reshape(L, G * r)


@SETTINGS
@given(seed=st.integers(0, 10_000), G=st.integers(1, 3), r=st.integers(1, 4), T=st.integers(1, 40),
       s_frac=st.floats(0.01, 1.0), conc=st.sampled_from([0.1, 1.0, 5.0, 30.0]))
def test_uor_bounds(seed, G, r, T, s_frac, conc):
    s = max(1, min(T, int(round(s_frac * T))))
    a = _rows(seed, 2, G * r, T, conc)
    hg = torch.arange(G * r) // r
    uor = union_over_retained(a, hg, s)
    assert uor.shape == (2, G)
    assert (uor >= 1.0 - 1e-12).all()
    assert (uor <= min(r, T / s) + 1e-12).all()
    # direct count for every group of layer 0: union of per-head top-s sets (ties: lower position)
    K = keep_sets(a, s)
    assert (K.sum(-1) == s).all()
    for g in range(G):
        union = set()
        for h in range(g * r, (g + 1) * r):
            row = a[0, h].tolist()
            union |= set(sorted(range(T), key=lambda j: (-row[j], j))[:s])
        assert math.isclose(float(uor[0, g]), len(union) / s)


def test_uor_extremes():
    T, s = 12, 3
    hg = torch.tensor([0, 0, 0])
    same = torch.zeros(1, 3, T, dtype=torch.float64)
    same[..., :s] = 1.0  # identical keep sets: UOR = 1
    assert float(union_over_retained(same, hg, s)[0, 0]) == 1.0
    disjoint = torch.zeros(1, 3, T, dtype=torch.float64)
    for h in range(3):
        disjoint[0, h, h * s:(h + 1) * s] = 1.0  # disjoint keep sets: UOR = r
    assert float(union_over_retained(disjoint, hg, s)[0, 0]) == 3.0


@SETTINGS
@given(seed=st.integers(0, 10_000), G=st.integers(1, 4), r=st.integers(1, 3), T=st.integers(1, 64),
       b=st.integers(1, 9), K=st.integers(1, 12), conc=st.sampled_from([0.1, 1.0, 8.0, 40.0]))
def test_union_bounds_and_lemma(seed, G, r, T, b, K, conc):
    L = 2
    a = _rows(seed, L, G * r, T, conc)
    w = _weights(seed, L, G, r)
    hg = torch.arange(G * r) // r
    p = group_scores(a, w, hg)
    assert torch.allclose(p.sum(-1), torch.ones(L, G, dtype=torch.float64))
    I = page_importance(p, b)
    N_P = math.ceil(T / b)
    assert I.shape == (L, G, N_P)
    sel = top_pages(I, K)
    assert (sel.sum(-1) == min(K, N_P)).all()
    U = page_union(sel)
    Ke = min(K, N_P)
    assert ((U >= Ke) & (U <= min(G * Ke, N_P))).all()
    # lemma: a token with p > 1/(K+1) always has its page kept
    page_of = torch.arange(T) // b
    heavy = p > 1.0 / (K + 1)
    for l, g, j in torch.nonzero(heavy).tolist():
        assert sel[l, g, page_of[j]], (l, g, j, float(p[l, g, j]))
    # the selected pages' importances dominate the dropped ones
    if Ke < N_P:
        kept_min = I.masked_fill(~sel, float("inf")).amin(-1)
        drop_max = I.masked_fill(sel, float("-inf")).amax(-1)
        assert (kept_min >= drop_max).all()


def test_lemma_threshold_is_tight():
    """At exactly 1/(K+1) the page can be dropped (K+1 equal pages; ties go to the lower index)."""
    K, b = 3, 2
    p = torch.zeros(1, 1, 2 * (K + 1), dtype=torch.float64)
    p[0, 0, ::2] = 1.0 / (K + 1)  # one token per page, K+1 pages, unit mass
    sel = top_pages(page_importance(p, b), K)
    assert sel[0, 0].tolist() == [True, True, True, False]
    # just above the threshold (the others just below, still unit mass): always kept
    p[0, 0, 6] = 1.0 / (K + 1) + 3e-3
    p[0, 0, 0:6:2] = 1.0 / (K + 1) - 1e-3
    sel = top_pages(page_importance(p, b), K)
    assert bool(sel[0, 0, 3])


def test_page_importance_partial_last_page():
    p = torch.tensor([[[0.1, 0.3, 0.05, 0.2, 0.35]]], dtype=torch.float64)
    I = page_importance(p, 2)
    assert I[0, 0].tolist() == [0.3, 0.2, 0.35]
    assert top_pages(I, 2)[0, 0].tolist() == [True, False, True]
    assert top_pages(I, 9)[0, 0].tolist() == [True, True, True]


def test_payload_bytes_by_hand():
    K_lg = torch.tensor([[2, 2], [2, 1]])
    U = torch.tensor([3, 2])
    by = payload_bytes(e=2, d=4, b=3, K_lg=K_lg, U_l=U, G=2, L=2, T_retained=7)
    assert by["per_group_pages"] == 2 * 2 * 4 * 3 * 7  # Σ K = 7
    assert by["union"] == 2 * 2 * 4 * 3 * 2 * 5  # G Σ U = 2 * 5
    assert by["dense"] == 2 * 2 * 2 * 2 * 4 * 7


def test_page_selection_result_and_frame():
    L, G, r, T = 3, 2, 2, 37
    a = _rows(7, L, G * r, T, 3.0)
    hg = torch.arange(G * r) // r
    pool = HeadPooling(zeta=0.5, tau=1.0).pool(a[:, :, None, :].float(), hg, n_sink=2)
    res = PageSelection(b=4, K=3, s=5, e=2).select(pool.a, pool.w, hg, d=8)
    assert res.importance.shape == (L, G, 10)
    assert (res.K_lg == 3).all()
    assert (res.token_mask.sum(-1) <= 12).all() and (res.token_mask.sum(-1) >= 9).all()  # last page has 1 token
    # per-group bytes: 2 e d b Σ K = 2*2*8*4*(3*2*3)
    assert res.bytes["per_group_pages"] == 2 * 2 * 8 * 4 * 18
    assert res.bytes["union"] == 2 * 2 * 8 * 4 * G * int(res.U.sum())
    df = res.to_frame()
    assert len(df) == L * G and set(df.columns) >= {"layer", "group", "K", "U_layer", "uor", "max_I_dropped"}
    assert (df["max_I_dropped"] <= df["max_p"] + 1e-12).all()


def test_validation_errors():
    with pytest.raises(ValueError, match="b: must be an integer >= 1"):
        PageSelection(b=0)
    with pytest.raises(ValueError, match="K: must be an integer >= 1"):
        PageSelection(K=-1)
    with pytest.raises(ValueError, match="s: must be an integer in"):
        keep_sets(torch.rand(2, 5), 6)
    with pytest.raises(ValueError, match="a, w"):
        group_scores(torch.rand(1, 2, 5), torch.rand(1, 3), torch.tensor([0, 1]))


def _pooled(a, v, w, zeta) -> PoolingResult:
    """A pooling result holding what the slider path reads (a, v, w, ζ); the rest is not read."""
    return PoolingResult(a=a, z=None, valid_head=None, valid=None, C=None, H=None, v=v, w=w, mu=None, omega=None,
                         zeta=zeta)


@SETTINGS
@given(seed=st.integers(0, 10_000), G=st.integers(1, 3), r=st.integers(1, 4), T=st.integers(1, 60),
       zeta=st.floats(0.01, 1.0), b=st.integers(1, 9), K=st.integers(1, 8), conc=st.sampled_from([0.1, 1.0, 5.0]))
def test_slider_memo_equals_direct(seed, G, r, T, zeta, b, K, conc):
    """The slider path (PageScoreMemo: p = ζ S + (1-ζ) V, UOR per s) gives the direct computation's group scores
    to float64 rounding and the same selection, union, bytes and token mask; the top-K without a sort keeps the
    stable sort's set (ties: lower page first)."""
    from workbench.analyse.pages import PageScoreMemo

    L = 2
    a = _rows(seed, L, G * r, T, conc)
    g = torch.Generator().manual_seed(seed + 2)
    v = torch.rand(L, G, r, generator=g, dtype=torch.float64)
    v = (v / v.sum(-1, keepdim=True)).reshape(L, G * r)
    hg = torch.arange(G * r) // r
    w = zeta / r + (1 - zeta) * v
    memo = PageScoreMemo(a, hg)
    ps = PageSelection(b=b, K=K, s=5)
    direct = ps.select(a, w, hg, 64)
    fast = ps.select(a, w, hg, 64, memo=memo, pooling=_pooled(a, v, w, zeta))
    torch.testing.assert_close(fast.p, direct.p, rtol=1e-13, atol=1e-15)
    srt = torch.sort(direct.importance, dim=-1, descending=True).values
    near_tie = K < srt.shape[-1] and bool(((srt[..., K - 1] - srt[..., K]) <= 1e-12).any())
    if not near_tie:  # rounding can only reorder (near-)ties at the K-th page
        assert torch.equal(fast.selected, direct.selected) and torch.equal(fast.U, direct.U)
        assert fast.bytes == direct.bytes and torch.equal(fast.token_mask, direct.token_mask)
    assert torch.equal(fast.uor, direct.uor)
    # the sort-free top-K is the stable sort's set, with ties (quantised importance makes many)
    Iq = (direct.importance * 4).round()
    order = torch.sort(Iq, dim=-1, descending=True, stable=True).indices
    ref = torch.zeros(Iq.shape, dtype=torch.bool).scatter_(-1, order[..., :min(K, Iq.shape[-1])], True)
    assert torch.equal(top_pages(Iq, K), ref)
    frame = fast.to_frame()
    assert (frame.kept_tokens.to_numpy() == fast.token_mask.sum(-1).reshape(-1).numpy()).all()


def test_slider_memo_rejects_another_a():
    from workbench.analyse.pages import PageScoreMemo

    a = _rows(0, 2, 4, 10, 1.0)
    memo = PageScoreMemo(a, torch.arange(4) // 2)
    w = torch.full((2, 4), 0.5, dtype=torch.float64)
    with pytest.raises(ValueError, match="memo"):
        b = a.clone()
        PageSelection().select(b, w, torch.arange(4) // 2, 64, memo=memo, pooling=_pooled(b, w, w, 0.5))


def test_slider_memo_reads_zeta_from_the_pooling_that_made_w():
    """ζ comes with the weights it made: a pooling of ζ = 0.7 gives the direct scores of its own ``w``, and a
    pooling that does not know its ζ, or another ``w``, is refused (no group scores of one ζ with weights of another)."""
    from workbench.analyse.pages import PageScoreMemo

    a = _rows(1, 2, 4, 10, 1.0)
    hg = torch.arange(4) // 2
    pool = HeadPooling(zeta=0.7, tau=0.5, rho_min=1e-6).pool(a[:, :, None, :], hg, n_sink=0)
    direct = PageSelection(b=2, K=2).select(pool.a, pool.w, hg, 64)
    fast = PageSelection(b=2, K=2).select(pool.a, pool.w, hg, 64, memo=PageScoreMemo(pool.a, hg), pooling=pool)
    torch.testing.assert_close(fast.p, direct.p, rtol=1e-13, atol=1e-15)
    with pytest.raises(ValueError, match="^pooling: must know the zeta"):
        PageSelection().select(pool.a, pool.w, hg, 64, memo=PageScoreMemo(pool.a, hg),
                               pooling=_pooled(pool.a, pool.v, pool.w, math.nan))
    with pytest.raises(ValueError, match="memo"):
        PageSelection().select(pool.a, pool.w.clone(), hg, 64, memo=PageScoreMemo(pool.a, hg), pooling=pool)


def test_slider_memo_never_returns_a_stale_sum():
    """The per-τ sum is keyed by the values of ``v`` itself: another ``v`` (a new τ, or a new ρ_min that changes
    which heads are valid) recomputes, the same ``v`` re-uses."""
    from workbench.analyse.pages import PageScoreMemo

    a = _rows(3, 2, 4, 12, 1.0)
    hg = torch.arange(4) // 2
    memo = PageScoreMemo(a, hg, keep=1)
    for seed in (0, 1, 0):
        v = _weights(seed, 2, 2, 2)
        for zeta in (0.2, 0.9):
            torch.testing.assert_close(memo.scores(v, zeta), group_scores(a, zeta / 2 + (1 - zeta) * v, hg),
                                       rtol=1e-13, atol=1e-15)
