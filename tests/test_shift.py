"""Prefill-vs-first-decode shift (SPEC §9): JSD, top-k recall, boundary leap."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import jensenshannon

from workbench.analyse.shift import ShiftAnalysis, group_rows, jsd, shift_rows, topk_recall
from workbench.capture.data import Capture
from workbench.run.spans import PromptSpans


@settings(max_examples=examples(20), deadline=None)
@given(seed=st.integers(0, 10_000), T=st.integers(1, 30), conc=st.sampled_from([0.1, 1.0, 10.0, 60.0]))
def test_jsd_bounds_symmetry(seed, T, conc):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(3, T, generator=g, dtype=torch.float64) * conc, -1)
    q = torch.softmax(torch.randn(3, T, generator=g, dtype=torch.float64) * conc, -1)
    d = jsd(p, q)
    assert ((d >= 0) & (d <= math.log(2) + 1e-12)).all()
    assert torch.allclose(d, jsd(q, p))
    assert torch.allclose(jsd(p, p), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    ref = torch.tensor([jensenshannon(p[i].numpy(), q[i].numpy()) ** 2 for i in range(3)], dtype=torch.float64)
    assert torch.allclose(d, ref, atol=1e-9)


def test_jsd_disjoint_supports_is_ln2():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 0.0, 0.3, 0.7], dtype=torch.float64)
    assert math.isclose(float(jsd(p, q)), math.log(2), rel_tol=1e-12)


def test_topk_recall_by_hand():
    ref = torch.tensor([0.4, 0.3, 0.2, 0.05, 0.05], dtype=torch.float64)
    rows = torch.tensor([[0.4, 0.3, 0.2, 0.05, 0.05],   # same top-2 {0, 1}
                         [0.1, 0.5, 0.0, 0.4, 0.0],     # top-2 {1, 3}: one hit
                         [0.0, 0.0, 0.1, 0.5, 0.4]], dtype=torch.float64)  # {3, 4}: none
    assert topk_recall(rows, ref, 2).tolist() == [1.0, 0.5, 0.0]
    assert topk_recall(rows, ref, 5).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="k: must be an integer in"):
        topk_recall(rows, ref, 6)


def _synthetic_capture(n_decode=4, W=6, seed=3):
    spans = PromptSpans.synthetic([6, 5, 7], query_len=5)
    T = spans.T
    return Capture.synthetic(spans, L=2, H_Q=4, G=2, seed=seed, concentration=2.0,
                             extra_rows={"tail": list(range(T - W, T)), "decode": list(range(T, T + n_decode))})


def test_rows_restricted_and_renormalised():
    cap = _synthetic_capture()
    r, P = shift_rows(cap)
    assert r.tolist() == [-5, -4, -3, -2, -1, 0, 1, 2, 3, 4]
    assert torch.allclose(P.sum(-1), torch.ones(P.shape[:3], dtype=torch.float64))
    T = cap.T
    dec = cap.rows_of("decode")
    raw = cap.attn[:, :, dec[2], :T].double()
    assert torch.allclose(P[:, :, 8], raw / raw.sum(-1, keepdim=True))  # r = 3
    Pg = group_rows(P, cap.head_group)
    assert torch.allclose(Pg[:, 1], P[:, 2:4].mean(1))  # group 1 = heads 2, 3


def test_shift_on_default_model_against_scipy(smollm_capture):
    cap = smollm_capture  # 32 tail rows, 3 decode steps
    res = ShiftAnalysis(k=16, ref_start=1)(cap)
    L, H, T = cap.L, cap.H_Q, cap.T
    assert res.r.tolist() == list(range(-31, 4))
    assert res.recall_head.shape == (L, H, 35) and res.jsd_group.shape == (L, cap.G, 34)
    # independent recomputation for a few (layer, head) pairs in numpy / scipy
    A = cap.attn.double().numpy()
    tail = [i for i, k in enumerate(cap.row_kind) if k == "tail"]
    tail.sort(key=lambda i: int(cap.row_pos[i]))
    dec = [i for i, k in enumerate(cap.row_kind) if k == "decode"]
    order = tail + dec
    for l, h in ((0, 0), (7, 4), (29, 8)):
        rows = A[l, h][order][:, :T]
        rows = rows / rows.sum(-1, keepdims=True)
        ref = rows[-3:].mean(0)
        top_ref = set(np.argsort(-ref, kind="stable")[:16].tolist())
        for i in (30, 31, 32, 33, 34):  # r = -1, 0, 1, 2, 3
            top = set(np.argsort(-rows[i], kind="stable")[:16].tolist())
            assert math.isclose(float(res.recall_head[l, h, i]), len(top & top_ref) / 16)
        for i in (31, 32):
            assert math.isclose(float(res.jsd_head[l, h, i]), jensenshannon(rows[i], rows[i + 1]) ** 2, abs_tol=1e-9)
    lf = res.leap_frame()
    fr = res.to_frame()
    one = fr[(fr.level == "group") & (fr.layer == 5) & (fr.unit == 1)].set_index("r")["recall"]
    row = lf[(lf.level == "group") & (lf.layer == 5) & (lf.unit == 1)].iloc[0]
    assert math.isclose(row.gain_01, one[1] - one[0]) and math.isclose(row.gain_23, one[3] - one[2])
    assert math.isclose(row.gain_m10, one[0] - one[-1])
    jn = fr[(fr.level == "group") & (fr.layer == 5) & (fr.unit == 1)].set_index("r")["jsd_next"]
    assert math.isclose(row.jsd_m10, jn[-1]) and math.isclose(row.jsd_12, jn[1])
    assert row.leap == (row.gain_01 > max(row.gain_12, row.gain_23))
    summ = res.summary()
    assert list(summ.level) == ["head", "group"]
    assert 0.0 <= summ.leap_fraction.min() <= summ.leap_fraction.max() <= 1.0
    # the reference as an explicit tensor, or as a capture, gives the same result
    P = shift_rows(cap)[1]
    res2 = ShiftAnalysis(k=16)(cap, reference=P[:, :, -3:].mean(2))
    assert torch.equal(res2.recall_group, res.recall_group)
    assert torch.equal(ShiftAnalysis(k=16, ref_start=1)(cap, reference=cap).recall_head, res.recall_head)
    # held-out reference: decode step 3 only
    res3 = ShiftAnalysis(k=16, ref_start=3)(cap)
    assert torch.allclose(res3.recall_head[..., -1], torch.ones(L, H, dtype=torch.float64))


def test_errors():
    with pytest.raises(ValueError, match="k: must be an integer >= 1"):
        ShiftAnalysis(k=0)
    with pytest.raises(ValueError, match="ref_start"):
        ShiftAnalysis(ref_start=0)
    cap = _synthetic_capture(n_decode=2)
    with pytest.raises(ValueError, match="ref_start: must be in"):
        ShiftAnalysis(ref_start=3)(cap)
    spans = PromptSpans.synthetic([4, 4], query_len=4)
    no_dec = Capture.synthetic(spans, extra_rows={"tail": [spans.T - 1]})
    with pytest.raises(ValueError, match="no decode rows"):
        ShiftAnalysis()(no_dec)
    with pytest.raises(ValueError, match="W: must be an integer in"):
        shift_rows(cap, W=9)


@settings(max_examples=examples(10), deadline=None)
@given(seed=st.integers(0, 10_000), T=st.integers(2, 40), k=st.integers(1, 40), levels=st.integers(1, 4))
def test_topk_recall_equals_stable_sort_reference(seed, T, k, levels):
    """With many ties (values from a few levels), the recall equals a stable-sort reference."""
    k = min(k, T)
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, levels, (3, 5, T), generator=g).to(torch.float64)
    ref = torch.randint(0, levels, (3, T), generator=g).to(torch.float64)
    top_r = torch.sort(rows, dim=-1, descending=True, stable=True).indices[..., :k]
    top_f = torch.sort(ref, dim=-1, descending=True, stable=True).indices[..., :k]
    want = torch.tensor([[len(set(top_r[a, b].tolist()) & set(top_f[a].tolist())) / k for b in range(5)]
                         for a in range(3)], dtype=torch.float64)
    assert torch.equal(topk_recall(rows, ref, k), want)
    # the shared membership rule itself (also SPEC §8's keep sets): exactly the stable sort's first k
    from workbench.analyse.pages import keep_sets
    from workbench.analyse.ranking import topk_mask

    first_k = torch.zeros(rows.shape, dtype=torch.bool).scatter_(-1, top_r, True)
    assert torch.equal(topk_mask(rows, k), first_k) and torch.equal(keep_sets(rows, k), first_k)


def test_adjacent_jsd_equals_pairwise():
    from workbench.analyse.shift import adjacent_jsd

    g = torch.Generator().manual_seed(1)
    P = torch.rand(2, 3, 6, 50, generator=g, dtype=torch.float64) ** 4
    P[..., :7] = 0  # zeros in the support
    P = P / P.sum(-1, keepdim=True)
    assert torch.allclose(adjacent_jsd(P), jsd(P[..., :-1, :], P[..., 1:, :]), atol=1e-13)


@settings(max_examples=examples(6), deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 40), levels=st.integers(1, 5), W=st.integers(1, 6),
       ref_start=st.integers(1, 4))
def test_memoised_analysis_equals_direct(seed, k, levels, W, ref_start):
    """ShiftAnalysis reuses per-capture ranks and JSD across k, W and the reference (what its sliders move);
    the result equals the direct computation from ``shift_rows(W)``, ``adjacent_jsd`` and ``topk_recall``,
    also with many ties (attention quantised to a few levels) and a capture reused across calls."""
    from workbench.analyse.shift import adjacent_jsd

    cap = _synthetic_capture(seed=seed)
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(1, levels + 1, cap.attn.shape, generator=g).to(cap.attn.dtype)
    cap.attn = q * (cap.attn > 0)   # ties everywhere, zeros (masked keys) kept
    cap.attn = cap.attn / cap.attn.sum(-1, keepdim=True)  # attention rows (sum 1); ties within a row stay ties
    cap.clear_cache()
    for kk, ww, rs in ((k, W, ref_start), (max(1, k // 2), 6, 1), (k, W, ref_start)):
        kk = min(kk, cap.T)
        res = ShiftAnalysis(k=kk, W=ww, ref_start=rs)(cap)
        r, P = shift_rows(cap, ww)
        ref = P[:, :, ww + rs - 1:].mean(2)
        Pg, refg = group_rows(P, cap.head_group), group_rows(ref, cap.head_group)
        assert torch.equal(res.r, r)
        assert torch.allclose(res.jsd_head, adjacent_jsd(P), atol=1e-12)
        assert torch.allclose(res.jsd_group, adjacent_jsd(Pg), atol=1e-12)
        assert torch.equal(res.recall_head, topk_recall(P, ref, kk))
        assert torch.equal(res.recall_group, topk_recall(Pg, refg, kk))


@settings(max_examples=examples(10), deadline=None)
@given(seed=st.integers(0, 10_000), T=st.integers(1, 30), levels=st.integers(1, 4))
def test_hits_every_k_equals_topk_recall(seed, T, levels):
    """The all-k intersection counts equal ``k · topk_recall`` at every k (many ties)."""
    from workbench.analyse.shift import _hits_every_k, _order, _ranks

    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, levels, (2, 3, 4, T), generator=g).to(torch.float64)
    ref = torch.randint(0, levels, (2, 3, T), generator=g).to(torch.float64)
    c = _hits_every_k(_ranks(rows), _order(ref))
    assert c.shape == (2, 3, 4, T + 1) and int(c[..., 0].abs().sum()) == 0
    for k in range(1, T + 1):
        assert torch.equal(c[..., k].to(torch.float64) / k, topk_recall(rows, ref, k)), k
