"""Tests of workbench.plots: figure contents equal the analysis results, meta, tidy frames, in-place updates."""
from __future__ import annotations

import html
import json
import math

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from workbench import plots
from workbench.audit import trace
from workbench.capture_data import Capture
from workbench.params import EntroPrefillParams
from workbench.spans import PromptSpans


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def syn():
    """Synthetic capture (4 layers, 6 heads in 2 groups, 4 chunks, answer in document 2) with audit,
    tail and decode rows, and an accepted trace."""
    sp = PromptSpans.synthetic([6, 5, 7, 4], query_len=10, answer_doc=2)
    T = sp.T
    cap = Capture.synthetic(sp, L=4, H_Q=6, G=2, seed=1, concentration=2.0,
                            extra_rows={"audit": list(range(sp.query[0], sp.query[1])),
                                        "tail": list(range(T - 6, T)), "decode": list(range(T, T + 4))})
    params = EntroPrefillParams(target=0.2, eps_row=0.5, eps_audit=0.9, streak=0)
    tr = trace(cap, params)
    assert tr.l_star is not None and tr.removed  # the figures below show an accepted decision
    return cap, params, tr


def _meta_ok(fig, name, **expect):
    meta = fig.layout.meta
    assert meta["figure"] == name
    assert "model_id" in meta
    json.dumps(meta, allow_nan=False)  # JSON-serialisable, no NaN
    for k, v in expect.items():
        assert meta[k] == v, (k, meta[k], v)
    assert fig.layout.template.layout.font.family == plots.FONT  # the workbench template
    return meta


def _frame_matches(fig):
    """figure_frame has one row per plotted point of every trace."""
    df = plots.figure_frame(fig)
    for i, tr in enumerate(fig.data):
        sub = df[df.trace == i]
        if tr.type == "heatmap":
            assert len(sub) == np.asarray(tr.z, dtype=object).size
        elif tr.type == "table":
            assert len(sub) == len(tr.cells.values[0])
        else:
            assert len(sub) == max(len(tr.x or ()), len(tr.y or ()))
    return df


def _nan_eq(a, b):
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    b = np.where(np.isfinite(b), b, np.nan)
    return np.array_equal(a, b, equal_nan=True)


# ----------------------------------------------------------------------------- pooling
@pytest.mark.parametrize("quantity,attr", [("w", "w"), ("H", "H"), ("sink", "sink_mass"), ("z", "z")])
def test_head_heatmap_equals_result(syn, quantity, attr):
    cap, params, tr = syn
    pool = tr.pooling
    fig = plots.head_heatmap(pool, quantity, model_id=cap.model_id, params=params)
    z = np.array([[np.nan if v is None else v for v in row] for row in fig.data[0].z], dtype=float)
    assert _nan_eq(z, getattr(pool, attr).numpy())
    assert list(fig.data[0].y) == list(range(cap.L))
    assert fig.data[0].x[4] == "h4 (g1)"
    meta = _meta_ok(fig, "head_heatmap", quantity=quantity, model_id="synthetic", zeta=params.zeta, tau=params.tau)
    assert meta["target"] == params.target  # params merged in
    df = _frame_matches(fig)
    assert len(df) == cap.L * cap.H_Q


def test_sink_mass_is_observer_mass_on_sinks(syn):
    cap, _, tr = syn
    assert torch.allclose(tr.pooling.sink_mass, cap.sink_mass("observer").double(), atol=1e-6)
    assert torch.allclose(tr.pooling.sink_mass + tr.pooling.z, torch.ones_like(tr.pooling.z), atol=1e-6)


def test_head_heatmap_invalid_head_blank_and_bad_quantity(syn):
    _, _, tr = syn
    pool = tr.pooling
    pool2 = type(pool)(**{**pool.__dict__})
    pool2.H = pool.H.clone()
    pool2.H[1, 2] = math.inf
    pool2.valid_head = pool.valid_head.clone()
    pool2.valid_head[1, 2] = False
    fig = plots.head_heatmap(pool2, "H")
    assert fig.data[0].z[1][2] is None or math.isnan(fig.data[0].z[1][2])
    assert fig.data[0].text[1][2] == "invalid"
    json.dumps(fig.to_plotly_json()["data"][0]["z"])  # no inf in JSON
    with pytest.raises(ValueError, match="^quantity: must be one of"):
        plots.head_heatmap(pool, "entropy")


def test_residual_distribution(syn):
    cap, _, tr = syn
    pool = tr.pooling
    fig = plots.residual_distribution(pool, 2, cap)
    res = pool.a[2, :, pool.n_sink:] / pool.z[2, :, None]
    z = np.array(fig.data[0].z, dtype=float)
    assert np.allclose(z, res.numpy())
    assert np.allclose(z.sum(1), 1.0)
    assert list(fig.data[0].x) == list(range(pool.n_sink, cap.T))
    assert fig.data[0].customdata[0][0] == cap.spans.tokens[pool.n_sink]  # hover tokens
    assert f"H={float(pool.H[2, 0]):.2f}" in fig.data[0].y[0]
    _meta_ok(fig, "residual_distribution", layer=2, model_id="synthetic")
    df = _frame_matches(fig)
    assert set(df["customdata"]) == set(cap.spans.tokens[pool.n_sink:])
    for bad in (-1, cap.L, 1.5):
        with pytest.raises(ValueError, match=r"^layer: must be an integer in \[0, 3\]"):
            plots.residual_distribution(pool, bad, cap)


# ----------------------------------------------------------------------------- priorities
def test_chunk_priorities_colouring_answer_and_hover(syn):
    cap, params, tr = syn
    prio, sp = tr.priorities, cap.spans
    l = tr.l_star
    fig = plots.chunk_priorities(prio, sp, l, removed=tr)
    removed = tr.selections[l].removed
    assert len(fig.data) == 6  # kept/removed × S, ℓ, κ
    names = [t.name for t in fig.data]
    assert names == ["kept", "removed"] * 3
    for i, (tname, quantity) in enumerate(zip(names, ["S", "S", "ℓ", "ℓ", "κ", "κ"])):
        t = fig.data[i]
        idx = list(t.x)
        assert idx == (removed if tname == "removed" else [c for c in range(sp.k) if c not in removed])
        assert t.marker.color == (plots.REMOVED if tname == "removed" else plots.KEPT)
        vals = {"S": prio.S, "ℓ": prio.ell, "κ": prio.kappa}[quantity][l]
        assert np.allclose(t.y, vals[idx].numpy())
        # answer chunk (document 2 = chunk 2) outlined
        widths = list(t.marker.line.width)
        assert [w > 0 for w in widths] == [c == 2 for c in idx]
        # hover: the chunk's text
        for c, row in zip(idx, t.customdata):
            s, e = sp.chunks[c]
            assert row[2] == "".join(sp.tokens[s:e])
    assert any(a.text == "answer" for a in fig.layout.annotations)
    meta = _meta_ok(fig, "chunk_priorities", layer=l, removed=removed, answer_chunk=2, lam=params.lam)
    df = _frame_matches(fig)
    assert df.loc[df.name == "removed", "chunk"].tolist() == removed * 3
    assert meta["eps_s"] == params.eps_s
    # position layout: bars over the token spans
    fig2 = plots.chunk_priorities(prio, sp, l, removed=removed, x="position")
    t = fig2.data[0]
    assert list(t.width) == [sp.chunks[c][1] - sp.chunks[c][0] for c in t.customdata and [r[0] for r in t.customdata]]
    # no selection: one neutral colour
    fig3 = plots.chunk_priorities(prio, sp, l)
    assert fig3.data[0].marker.color == plots.NEUTRAL and len(fig3.data[1].x) == 0
    with pytest.raises(ValueError, match="^layer: must be an integer in"):
        plots.chunk_priorities(prio, sp, 4)
    with pytest.raises(ValueError, match="^removed: chunk indices must be in"):
        plots.chunk_priorities(prio, sp, 1, removed=[7])
    with pytest.raises(ValueError, match="^x: must be one of"):
        plots.chunk_priorities(prio, sp, 1, x="tokens")


# ----------------------------------------------------------------------------- certificate and trace
def test_certificate_and_trace(syn):
    cap, params, tr = syn
    fig = plots.certificate(tr)
    layers = sorted(tr.selections)
    byname = {t.name: t for t in fig.data}
    assert list(byname["D_l (greedy)"].x) == layers
    assert list(byname["D_l (greedy)"].y) == [tr.selections[l].D for l in layers]
    assert np.allclose(byname["U_l (certificate)"].y, [tr.selections[l].U for l in layers])
    assert np.allclose(byname["gap U − D"].y, [tr.selections[l].gap for l in layers])
    assert set(byname["target"].y) == {tr.selections[layers[0]].target_tokens}
    _meta_ok(fig, "certificate", l_star=tr.l_star, model_id="synthetic", target=params.target)
    _frame_matches(fig)
    fig2 = plots.certificate({l: tr.selections[l] for l in layers}, budget=9)
    assert set(fig2.data[2].y) == {9}
    with pytest.raises(ValueError, match="^budget:"):
        plots.certificate(tr, budget=-1)
    with pytest.raises(ValueError, match="^source:"):
        plots.certificate(3)

    fig = plots.trace_layers(tr)
    df = tr.to_frame()
    byname = {t.name: t for t in fig.data}
    assert list(byname["D_l"].x) == df["layer"].tolist()
    assert _nan_eq(byname["d_l"].y, df["d"].astype(float))
    assert _nan_eq(byname["max audit bound"].y, df["max_audit_bound"].astype(float))
    status = byname["status"]
    assert [c[0] for c in status.customdata] == df["status"].tolist()
    assert [html.unescape(c[1]) for c in status.customdata] == df["decision"].tolist()  # HTML-escaped in hover
    assert status.marker.color[df["layer"].tolist().index(tr.l_star)] == plots._STATUS_COLOR["accept"]
    meta = _meta_ok(fig, "trace_layers", l_star=tr.l_star, removed=tr.removed, eps_audit=params.eps_audit)
    assert meta["decision"] == tr.decision
    fr = _frame_matches(fig)
    assert fr.loc[fr.name == "status", "decision"].tolist() == df["decision"].tolist()


# ----------------------------------------------------------------------------- update in place
@pytest.mark.parametrize("widget", [False, True])
def test_update_figure_in_place_and_replace(syn, widget):
    cap, params, tr = syn
    tr2 = trace(cap, params.replace(zeta=1.0, target=0.5))
    a = plots.head_heatmap(tr.pooling, "w")
    target = go.FigureWidget(a) if widget else go.Figure(a)
    target.update_layout(height=321)
    b = plots.head_heatmap(tr2.pooling, "w")
    assert plots.update_figure(target, b) is True
    assert np.allclose(np.array(target.data[0].z, dtype=float), tr2.pooling.w.numpy())
    assert target.layout.meta["zeta"] == 1.0 and target.layout.height == 321
    # chunk bars: same structure, the kept/removed split moves
    c1 = plots.chunk_priorities(tr.priorities, cap.spans, 2, removed=tr)
    c2 = plots.chunk_priorities(tr2.priorities, cap.spans, 2, removed=tr2)
    target = go.FigureWidget(c1) if widget else go.Figure(c1)
    assert plots.update_figure(target, c2) is True
    assert [list(t.x) for t in target.data] == [list(t.x) for t in c2.data]
    assert target.layout.title.text == c2.layout.title.text
    assert target.layout.meta == c2.layout.meta
    assert len(target.layout.annotations) == len(c2.layout.annotations)
    # different structure: traces replaced
    t = plots.trace_layers(tr)
    assert plots.update_figure(target, t) is False
    assert [x.name for x in target.data] == [x.name for x in t.data]
    assert target.layout.meta["figure"] == "trace_layers"
    # a property set only in the old trace is cleared
    target = go.Figure(a)
    target.data[0].zmax = 5
    plots.update_figure(target, b)
    assert target.data[0].zmax is None
