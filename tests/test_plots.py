"""Tests of workbench.show.plots: figure contents equal the analysis results, meta, tidy frames, in-place updates."""
from __future__ import annotations

import dataclasses
import html
import json
import math

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from workbench.analyse.cost import CostModel
from workbench.analyse.envelope import envelope, envelope_all_layers
from workbench.analyse.pages import PageSelection
from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.pooling import HeadPooling
from workbench.analyse.procedure import trace
from workbench.analyse.shift import ShiftAnalysis
from workbench.capture.data import Capture
from workbench.rerun.eviction import GenerationResult
from workbench.rerun.stability import StabilityResult
from workbench.run.adapter import ModelShape
from workbench.run.spans import PromptSpans
from workbench.show import plots
from workbench.show.figure_engine import KEEP_LAYOUT, Draft, add_span
from workbench.show.plots.analysis import STATUS_COLOR
from workbench.show.plots.common import answer_chunk


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
            assert len(sub) == max(len(tr.x) if tr.x is not None else 0, len(tr.y) if tr.y is not None else 0)
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


def test_titles_and_ticks_read_as_text(syn):
    """No raw TeX (``Σ_{j∈𝒮}``) in a title, and tick exponents as powers of ten (plotly's default SI letters
    read "100µ" on a unitless axis), on every axis and colour bar of the template."""
    _, _, tr = syn
    fig = plots.head_heatmap(tr.pooling, "sink")
    assert "_{" not in fig.layout.title.text and "Σ<sub>j∈𝒮</sub> a<sub>j</sub>" in fig.layout.title.text
    tpl = fig.layout.template
    assert tpl.layout.xaxis.exponentformat == tpl.layout.yaxis.exponentformat == "power"
    assert tpl.layout.coloraxis.colorbar.exponentformat == tpl.data.heatmap[0].colorbar.exponentformat == "power"


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


def test_pooled_measure_bars_are_mu_coloured_by_span(syn):
    cap, _, tr = syn
    pool, sp = tr.pooling, cap.spans
    fig = plots.pooled_measure(pool, 2, cap)
    bar = fig.data[0]
    assert len(fig.data) == 1 and bar.type == "bar"
    assert list(bar.x) == list(range(sp.T)) and np.allclose(bar.y, pool.mu[2].numpy(), rtol=0, atol=0)
    assert abs(float(np.sum(bar.y)) - 1) < 1e-6  # μ^l sums to 1 (float32 rows): the bars are all of it
    cof = sp.chunk_of().tolist()
    want = [plots.NEUTRAL if c < 0 else plots.ANSWER if sp.chunk_doc[c] == sp.answer_doc else plots.PALETTE[1]
            for c in cof]
    assert list(bar.marker.color) == want and want.count(plots.ANSWER) == sp.n[sp.chunk_doc.index(sp.answer_doc)]
    assert [c[1] for c in bar.customdata] == cof and bar.customdata[5][0] == sp.tokens[5]
    assert fig.layout.yaxis.type == "log" and plots.pooled_measure(pool, 2, cap, log=False).layout.yaxis.type == "linear"
    _meta_ok(fig, "pooled_measure", layer=2, model_id="synthetic", zeta=pool.zeta, tau=pool.tau, n_sink=pool.n_sink,
             log=True)
    _frame_matches(fig)
    with pytest.raises(ValueError, match=r"^layer: must be an integer in \[0, 3\]"):
        plots.pooled_measure(pool, 4, cap)
    with pytest.raises(ValueError, match="^spans: must be PromptSpans"):
        plots.pooled_measure(pool, 1, None)
    other = PromptSpans.synthetic([6, 5], query_len=10, answer_doc=1)
    with pytest.raises(ValueError, match=f"^spans: has T = {other.T} tokens, the pooling {sp.T}"):
        plots.pooled_measure(pool, 1, other)


def test_pooled_measure_at_scale_keeps_every_token_for_the_csv():
    from workbench.show.decimate import DEFAULT_WIDTH_PX, full_frame

    sp = PromptSpans.synthetic([400, 500, 450], query_len=12, answer_doc=1)
    cap = Capture.synthetic(sp, L=2, H_Q=4, G=2, seed=3)
    pool = HeadPooling()(cap)
    fig = plots.pooled_measure(pool, 1, cap)
    assert len(fig.data[0].x) == DEFAULT_WIDTH_PX < sp.T
    full = full_frame(fig)
    assert list(full.columns) == ["x", "token", "chunk", "mu"] and len(full) == sp.T
    assert np.allclose(full["mu"], pool.mu[1].numpy(), rtol=0, atol=0)
    assert np.isclose(np.max(fig.data[0].y), float(pool.mu[1].max()))  # the bins hold their max


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
    assert all(w == 0.8 for t in fig.data for w in t.width)  # equal slots, whatever the kept/removed split
    meta = _meta_ok(fig, "chunk_priorities", layer=l, removed=removed, answer_chunk=2, lam=params.lam)
    df = _frame_matches(fig)
    assert df.loc[df.name == "removed", "chunk"].tolist() == removed * 3
    assert meta["eps_s"] == params.eps_s
    # position layout: bars over the token spans
    fig2 = plots.chunk_priorities(prio, sp, l, removed=removed, x="position")
    t = fig2.data[0]
    chunks = [r[0] for r in t.customdata]
    assert list(t.width) == [sp.chunks[c][1] - sp.chunks[c][0] for c in chunks]
    assert list(t.x) == [(sp.chunks[c][0] + sp.chunks[c][1]) / 2 for c in chunks]
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
def _linear_ticks(ax) -> list[float]:
    lo, hi = sorted(ax.range)
    n = math.floor((hi - ax.tick0) / ax.dtick)
    return [ax.tick0 + i * ax.dtick for i in range(-n - 1, n + 1) if lo <= ax.tick0 + i * ax.dtick <= hi]


def test_certificate_ticks_every_shown_layer_whole(syn):
    """One layer (the priority panel's certificate) gets its tick; several get whole-layer ticks only."""
    _, _, tr = syn
    layers = sorted(tr.selections)
    one = plots.certificate({layers[-1]: tr.selections[layers[-1]]})
    for ax in (one.layout.xaxis, one.layout.xaxis2):
        assert ax.tickmode == "linear" and _linear_ticks(ax) == [layers[-1]]
    ax = plots.certificate(tr).layout.xaxis2
    ticks = _linear_ticks(ax)
    assert all(t == int(t) for t in ticks) and set(layers) <= set(ticks)


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
    assert status.marker.color[df["layer"].tolist().index(tr.l_star)] == STATUS_COLOR["accept"]
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


# ----------------------------------------------------------------------------- envelope, drift, cost
def test_envelope_rows(syn):
    cap, _, tr = syn
    envs = envelope_all_layers(cap, tr.pooling, {1: tr.removed, 2: tr.removed})
    env = envs[1]
    fig = plots.envelope_rows(envs, layer=2)
    byname = {t.name: t for t in fig.data}
    assert np.allclose(byname["actual η"].y, env.eta.numpy())
    assert np.allclose(byname["envelope"].y, env.bound.numpy())
    assert set(byname["q = μ(E)"].y) == {env.q}
    cd = np.array(byname["envelope"].customdata, dtype=float)
    assert np.allclose(cd[:, 0], np.arange(len(env.eta)) // env.W)  # head of each row
    assert np.allclose(cd[:, 5], env.term_ratio.numpy()) and np.allclose(cd[:, 6], env.term_chi2.numpy())
    colors = byname["actual η"].marker.color
    assert [c == plots.KEPT for c in colors] == env.holds.tolist()
    _meta_ok(fig, "envelope_rows", layer=2, q=env.q, W=env.W)
    _frame_matches(fig)
    # a violated row is drawn in the removed colour
    env.holds[3] = False
    fig = plots.envelope_rows(env)
    assert fig.data[1].marker.color[3] == plots.REMOVED and "1 rows above" in fig.layout.title.text
    with pytest.raises(ValueError, match="^layer: must be one of the envelope layers"):
        plots.envelope_rows(envs, layer=3)


def test_trace_title_states_a_long_decision_without_cutting_it(syn):
    """A decision with a long chunk list: the title gives the count (no "…"), the full decision stays in meta."""
    tr = syn[2]
    long = dataclasses.replace(tr, decision=tr.decision.split(":")[0] + ": remove chunks " + str(list(range(40))))
    title = plots.trace_layers(long).layout.title.text
    assert "…" not in title and f"remove {len(tr.removed)} chunks" in title
    assert plots.trace_layers(long).layout.meta["decision"] == long.decision


def test_envelope_rows_with_nothing_removed_says_so(syn):
    """No removal (the greedy's D = 0, as on a short pasted prompt): every curve is the zero line; the figure says
    why instead of drawing a blank."""
    cap, _, tr = syn
    l, pool = 2, tr.pooling
    env = envelope(cap.observer_attn()[l], pool.mu[l], pool.omega[l], cap.spans.removal_mask([]), layer=l)
    fig = plots.envelope_rows(env)
    assert env.q == 0 and not np.any(np.asarray(fig.data[1].y, dtype=float))
    assert fig.layout.meta["placeholder"].startswith("nothing removed at this layer (q = 0)")
    assert any(a.text.replace("<br>", " ").startswith("nothing removed at this layer") for a in fig.layout.annotations)
    some = envelope(cap.observer_attn()[l], pool.mu[l], pool.omega[l], cap.spans.removal_mask([1]), layer=l)
    assert "placeholder" not in plots.envelope_rows(some).layout.meta


def test_chunk_priorities_without_an_answer_has_no_star(syn):
    """A pasted prompt has no answer span: no ★ in the ticks, none promised in the axis title."""
    cap, _, tr = syn
    sp = PromptSpans.synthetic([6, 5, 7, 4], query_len=10, answer_doc=None)
    fig = plots.chunk_priorities(tr.priorities, sp, tr.l_star, removed=tr)
    assert fig.layout.xaxis3.title.text == "candidate chunk"
    assert not any("★" in t for t in fig.layout.xaxis3.ticktext)
    assert not any(a.text == "answer" for a in fig.layout.annotations)
    with_answer = plots.chunk_priorities(tr.priorities, cap.spans, tr.l_star, removed=tr)
    assert with_answer.layout.xaxis3.title.text == "candidate chunk (★ answer)" and "c2★" in with_answer.layout.xaxis3.ticktext


def test_envelope_scatter_points_are_every_row_of_every_removal(syn):
    cap, _, tr = syn
    pool, sp, l = tr.pooling, cap.spans, 2
    Es = [(0,), (1, 2), (0, 1, 3)]
    envs = [envelope(cap.observer_attn()[l], pool.mu[l], pool.omega[l], sp.removal_mask(E), layer=l) for E in Es]
    fig = plots.envelope_scatter(envs, removals=Es)
    pts, diag = fig.data
    assert pts.type == "scattergl" and diag.name == "η = envelope" and list(diag.x) == [0, 1] == list(diag.y)
    assert np.array_equal(pts.x, np.concatenate([e.bound.numpy() for e in envs]))
    assert np.array_equal(pts.y, np.concatenate([e.eta.numpy() for e in envs]))
    A = len(envs[0].eta)
    assert [c[0] for c in pts.customdata] == list(range(A)) * 3
    assert [c[1] for c in pts.customdata] == ["[0]"] * A + ["[1, 2]"] * A + ["[0, 1, 3]"] * A
    assert (np.asarray(pts.y) <= np.asarray(pts.x) + 1e-6).all()  # SPEC §4, on the plotted numbers
    _meta_ok(fig, "envelope_scatter", layer=l, n_removals=3, n_points=3 * A, all_hold=True)
    _frame_matches(fig)
    assert "above the envelope" not in fig.layout.title.text
    envs[1].holds[0] = False
    assert "1 above the envelope" in plots.envelope_scatter(envs).layout.title.text
    with pytest.raises(ValueError, match="^envs: must not be empty"):
        plots.envelope_scatter([])
    with pytest.raises(ValueError, match=r"^envs: must all be of one layer, got layers \[1, 2\]"):
        plots.envelope_scatter([envs[0], envelope(cap.observer_attn()[1], pool.mu[1], pool.omega[1],
                                                  sp.removal_mask([0]), layer=1)])
    with pytest.raises(ValueError, match=r"^removals: must have one entry per envelope \(3\), got 2"):
        plots.envelope_scatter(envs, removals=Es[:2])


def _stability(certified=True):
    return StabilityResult(l_star=1, drift={2: 0.1, 3: 0.3, 4: 0.5}, Delta_L=0.5, margin=2.0, Lambda=3.0, c_final=1.0,
                           certified=certified, agree_first_token=True, full_first_token=5, pruned_first_token=5,
                           defects={2: 0.05, 3: 0.1, 4: 0.2}, K={2: 3.0, 3: 4.0, 4: 5.0}, composed_bound=10.0)


def test_drift_and_break_even():
    st = _stability()
    fig = plots.drift(st, model_id="m")
    byname = {t.name: t for t in fig.data}
    assert list(byname["drift"].x) == [2, 3, 4] and list(byname["drift"].y) == [0.1, 0.3, 0.5]
    assert list(byname["defect e_l"].y) == [0.05, 0.1, 0.2]
    assert list(byname["Δ_L"].y) == [0.5]
    assert np.allclose(byname["m/(2Λ)"].y, [2.0 / 6.0] * 2)
    assert "certified" in fig.layout.title.text and "not certified" not in fig.layout.title.text
    _meta_ok(fig, "drift", model_id="m", Delta_L=0.5, margin=2.0, Lambda=3.0, certified=True)
    _frame_matches(fig)
    assert "not certified" in plots.drift(_stability(False)).layout.title.text

    shape = ModelShape(L=30, H_Q=9, G=3, d=64, hidden=576, intermediate=1536, vocab=49152, max_context=8192,
                       model_type="llama")
    grid = CostModel(shape).grid(1000, [0, 10, 20], [0.25, 0.5, 0.75, 1.0], rows=40)
    fig = plots.break_even(grid, model_id="m")
    df = grid.to_frame()
    for i, l in enumerate([0, 10, 20]):
        sub = df[df.l_star == l]
        assert fig.data[i].name == f"l* = {l}"
        assert np.allclose(fig.data[i].y, sub["ratio"]) and np.allclose(fig.data[i].x, sub["keep_fraction"])
    be = fig.data[3]
    assert list(be.x) == [0, 10, 20]
    assert np.allclose(be.y, [CostModel(shape).break_even_keep_fraction(1000, l, 40, l + 1) for l in (0, 10, 20)])
    _meta_ok(fig, "break_even", T=1000, l_stars=[0, 10, 20])
    _frame_matches(fig)
    with pytest.raises(ValueError, match="^cost_grid: needs columns"):
        plots.break_even(df.drop(columns=["ratio"]))


# ----------------------------------------------------------------------------- pages and shift
def test_pages(syn):
    cap, _, tr = syn
    pr = PageSelection(b=4, K=3, s=8).select(tr.pooling.a, tr.pooling.w, cap.head_group, d=64)
    fig = plots.pages(pr, 1, cap)
    heat = fig.data[0]
    assert np.allclose(np.array(heat.z, dtype=float), pr.importance[1].numpy())
    kept = fig.data[1]
    g, P = np.nonzero(pr.selected[1].numpy())
    assert list(kept.x) == P.tolist() and list(kept.y) == [f"g{x}" for x in g]
    assert heat.customdata[0][1].startswith("4–7: t4t5t6t7")  # page token range and text
    p0 = fig.data[2]
    assert np.allclose(p0.y, pr.p[1, 0].numpy())
    assert [c[0] for c in p0.customdata] == list(cap.spans.tokens)
    assert np.array_equal(np.asarray(p0.marker.color) == 1, pr.token_mask[1, 0].numpy())  # kept: filled
    U = [t for t in fig.data if t.name == "U_l"][0]
    assert list(U.y) == pr.U.tolist()
    uor = [t for t in fig.data if t.name == "UOR g1"][0]
    assert np.allclose(uor.y, pr.uor[:, 1].numpy())
    _meta_ok(fig, "pages", layer=1, b=4, K=3, s=8, model_id="synthetic")
    _frame_matches(fig)
    with pytest.raises(ValueError, match=r"^layer: must be an integer in \[0, 3\]"):
        plots.pages(pr, 4, cap)


def test_shift_steps(syn):
    cap, _, _ = syn
    sh = ShiftAnalysis(k=8)(cap)
    fig = plots.shift_steps(sh)
    rec, js = fig.data[0], fig.data[1]
    assert list(rec.x) == sh.r.tolist()
    assert np.allclose(np.array(rec.z, dtype=float), sh.recall_group.mean(1).numpy())
    assert np.allclose(np.array(js.z, dtype=float), sh.jsd_group.mean(1).numpy())
    assert list(js.x) == [r + 0.5 for r in sh.r.tolist()[:-1]]
    lf = sh.leap_frame()
    lf = lf[lf.level == "group"].groupby("layer")["gain_01"].mean()
    gain01 = [t for t in fig.data if t.name == "gain 0→1"][0]
    assert np.allclose(gain01.y, lf.to_numpy())
    _meta_ok(fig, "shift_steps", level="group", layer=None, k=8)
    _frame_matches(fig)
    fig = plots.shift_steps(sh, level="head", layer=2)
    assert len([t for t in fig.data if t.type == "scatter"]) == 2 * cap.H_Q
    assert np.allclose(fig.data[2].y, sh.recall_head[2, 1].numpy())  # h1 recall
    assert np.allclose(fig.data[3].y, sh.jsd_head[2, 1].numpy())
    _frame_matches(fig)
    with pytest.raises(ValueError, match="^level: must be one of"):
        plots.shift_steps(sh, level="layer")
    with pytest.raises(ValueError, match="^layer: must be an integer in"):
        plots.shift_steps(sh, layer=9)


def test_shift_gains_equal_the_recall_differences(syn):
    cap, _, _ = syn
    sh, held = ShiftAnalysis(k=8, ref_start=1)(cap), ShiftAnalysis(k=8, ref_start=3)(cap)
    fig = plots.shift_gains(sh, held_out=held)
    r = sh.r.tolist()

    def gain(res, a, b, level="group"):  # by hand: recall at r = b minus at r = a, mean over the layer's units
        rec = (res.recall_group if level == "group" else res.recall_head).numpy()
        return (rec[..., r.index(b)] - rec[..., r.index(a)]).mean(1)

    by_name = {t.name: t for t in fig.data}
    for name, (a, b) in (("−1 → 0 (in the prompt)", (-1, 0)), ("0 → 1 (boundary)", (0, 1)), ("1 → 2", (1, 2)),
                         ("2 → 3", (2, 3))):
        assert list(by_name[name].x) == list(range(cap.L))
        assert np.allclose(by_name[name].y, gain(sh, a, b), atol=1e-12), name
    dashed = by_name["0 → 1, held out (decode 3…4)"]
    assert dashed.line.dash == "dash" and np.allclose(dashed.y, gain(held, 0, 1), atol=1e-12)
    assert not np.allclose(dashed.y, gain(sh, 0, 1))  # another reference: other numbers
    _meta_ok(fig, "shift_gains", level="group", k=8, ref_start=1, ref_end=4, held_out_ref=[3, 4])
    _frame_matches(fig)
    head = plots.shift_gains(sh, level="head")
    assert len(head.data) == 4 and np.allclose(head.data[1].y, gain(sh, 0, 1, "head"), atol=1e-12)
    assert np.allclose(sh.layer_gains("head")["gain_12"].to_numpy(), gain(sh, 1, 2, "head"), atol=1e-12)
    with pytest.raises(ValueError, match="^held_out: must be a ShiftResult of the same capture and k = 8"):
        plots.shift_gains(sh, held_out=ShiftAnalysis(k=4)(cap))
    with pytest.raises(ValueError, match="^level: must be one of"):
        sh.layer_gains("layer")


def test_page_union_bounds_equal_the_selections(syn):
    cap, _, tr = syn
    pool = tr.pooling
    ps = PageSelection(b=4, K=2, s=8)
    u = ps.union_by_K([1, 3, 2, 20], pool.a, pool.w, cap.head_group, d=64)
    G, N_P = cap.G, -(-cap.T // 4)
    assert u.K.tolist() == [1, 3, 2, 20] and u.attrs == {"b": 4, "s": 8, "e": 2}
    for row in u.itertuples():   # each row: the selection with that K, its U_l averaged over the layers
        sel = PageSelection(b=4, K=row.K, s=8).select(pool.a, pool.w, cap.head_group, d=64)
        U_hand = sel.selected.any(1).sum(-1).double().mean()          # pages kept by some group, per layer
        assert row.union == pytest.approx(float(U_hand), abs=1e-12)
        assert (row.lower, row.upper) == (min(row.K, N_P), min(G * row.K, N_P))
        assert row.lower <= row.union <= row.upper
    fig = plots.page_union_bounds(u)
    by = {t.name: t for t in fig.data}
    order = np.argsort(u.K.to_numpy())
    assert list(by["union U_l (mean over layers)"].x) == [1, 2, 3, 20]
    assert np.allclose(by["union U_l (mean over layers)"].y, u.union.to_numpy()[order])
    assert list(by["lower bound K"].y) == [1, 2, 3, N_P] and list(by["upper bound min{GK, N_P}"].y) == [
        min(G * k, N_P) for k in (1, 2, 3, 20)]
    _meta_ok(fig, "page_union_bounds", Ks=[1, 2, 3, 20], b=4, s=8, e=2)
    _frame_matches(fig)
    with pytest.raises(ValueError, match="^union: must be a frame with columns"):
        plots.page_union_bounds(u.drop(columns="upper"))
    with pytest.raises(ValueError, match="^K: must be an integer >= 1, got 0"):
        ps.union_by_K([2, 0], pool.a, pool.w, cap.head_group, d=64)
    with pytest.raises(ValueError, match="^Ks: must hold at least one K"):
        ps.union_by_K([], pool.a, pool.w, cap.head_group, d=64)


def test_deferkv_weights_are_the_policy_weights():
    from workbench.rerun.eviction import DeferKV, SnapKV

    pols = [DeferKV(window=6, lam=lam) for lam in (0.0, 0.5)] + [DeferKV(window=6, lam=0.1, decode_weight=0.4)]
    fig = plots.deferkv_weights(pols)
    r = np.arange(-5, 2)
    assert [t.name for t in fig.data] == ["λ = 0", "λ = 0.5", "λ = 0.1, decode weight 0.4"]
    for t in fig.data:
        assert list(t.x) == r.tolist()
    assert np.allclose(fig.data[0].y, np.full(7, 1 / 7), atol=1e-15)                  # λ = 0: uniform
    e = np.exp(0.5 * r)
    assert np.allclose(fig.data[1].y, e / e.sum(), atol=1e-15)                          # α_r ∝ exp(λr)
    e = np.exp(0.1 * r[:-1])
    assert np.allclose(fig.data[2].y, np.append(0.6 * e / e.sum(), 0.4), atol=1e-15)   # the decode row: w
    assert all(abs(sum(t.y) - 1) < 1e-12 for t in fig.data)
    meta = _meta_ok(fig, "deferkv_weights")
    assert meta["policies"][2] == {"lam": 0.1, "window": 6, "decode_weight": 0.4}
    assert fig.layout.title.text == "DeferKV weights α_r (W = 6)"
    _frame_matches(fig)
    with pytest.raises(ValueError, match=r"^policies: must be DeferKV policies \(with alpha\(\) and window\), got \['SnapKV'\]"):
        plots.deferkv_weights([SnapKV()])
    with pytest.raises(ValueError, match="^policies: must hold at least one"):
        plots.deferkv_weights([])


# ----------------------------------------------------------------------------- eviction and sweeps
def _gen(policy, B, T, seed, L=3, G=2, compacted=(0, 1, 2)):
    g = torch.Generator().manual_seed(seed)
    kept = torch.stack([torch.stack([torch.sort(torch.randperm(T, generator=g)[:B]).values for _ in range(G)])
                        for _ in range(L)])
    return GenerationResult(policy=policy, params={"n_sink": 4, "recent": 8}, budget=B, T=T, ids=[1, 2], text="x",
                            kept=kept, evicted_at=0, compacted_layers=compacted, kv_bytes_before=1000,
                            kv_bytes_after=500, timings={})


def test_kept_positions_outlines_the_answer_passage(syn):
    """The answer passage is an outline over the kept cells, not a filled block (the eviction panel highlights the
    whole answer document: a band per position made one solid block over the data); a highlighted position outside
    the passage keeps its band. No y title: the row labels name policy and budget (at one column the title lay on
    them)."""
    cap, _, _ = syn
    sp = cap.spans
    s, e = sp.chunks[answer_chunk(sp)]
    res = [_gen("deferkv", 25, sp.T, 1)]
    outside = next(p for p in range(sp.n_sink, sp.T) if not s <= p < e)
    fig = plots.kept_positions(res, sp, highlight=[*range(s, e), outside])
    filled = [(sh.x0, sh.x1) for sh in fig.layout.shapes if sh.fillcolor not in (None, "rgba(0,0,0,0)")]
    assert filled == [(outside - 0.5, outside + 0.5)]
    outline = [sh for sh in fig.layout.shapes if sh.fillcolor == "rgba(0,0,0,0)"]
    assert [(sh.x0, sh.x1) for sh in outline] == [(s - 0.5, e - 0.5)] and outline[0].line.width > 0
    assert not fig.layout.yaxis2.title.text


def test_kept_positions(syn):
    cap, _, _ = syn
    sp = cap.spans
    res = [_gen("streaming", 20, sp.T, 0), _gen("deferkv", 25, sp.T, 1, compacted=(0, 2))]
    fig = plots.kept_positions(res, sp, highlight=[20, 21])
    heat = [t for t in fig.data if t.type == "heatmap"][0]
    z = np.array(heat.z, dtype=float)
    for i, r in enumerate(res):
        want = np.zeros(sp.T)
        layers = list(r.compacted_layers)
        for l in layers:
            for g in range(2):
                want[r.kept[l, g].numpy()] += 1
        assert np.allclose(z[i], want / (2 * len(layers)))
        surv = float(np.nanmean(r.survival([20, 21]).numpy()))
        assert heat.y[i].startswith(f"{r.policy} B={r.budget}") and heat.y[i].endswith(f"({surv:.0%})")
    assert heat.customdata[0][20] == "t20"  # hover tokens
    hl = [t for t in fig.data if t.name == "highlight"][0]
    assert list(hl.x) == [20, 21] and list(hl.customdata) == ["t20", "t21"]
    _meta_ok(fig, "kept_positions", highlight=[20, 21], layer=None, group=None)
    assert fig.layout.meta["runs"][1] == {"policy": "deferkv", "budget": 25, "n_sink": 4, "recent": 8}
    _frame_matches(fig)
    one = plots.kept_positions(res, sp, layer=1, group=0)
    z1 = np.array([t for t in one.data if t.type == "heatmap"][0].z, dtype=float)
    assert np.array_equal(np.flatnonzero(z1[0] == 1), res[0].kept[1, 0].numpy())
    # highlight given as text: matched on the token strings; the x title says whose share the labels give
    by_text = plots.kept_positions(res, sp, highlight="t21t22")
    assert by_text.layout.meta["highlight"] == [21, 22]
    assert all(y.endswith("%)") for y in by_text.data[1].y)
    assert by_text.layout.xaxis2.title.text.endswith("(%): share of highlighted text kept")
    named = plots.kept_positions(res, sp, highlight=[20, 21], highlight_name="answer doc")
    assert named.layout.xaxis2.title.text.endswith("(%): share of answer doc kept") and named.layout.meta["highlight_name"] == "answer doc"
    with pytest.raises(ValueError, match="^highlight_name: must be a non-empty text"):
        plots.kept_positions(res, sp, highlight=[20], highlight_name=" ")
    with pytest.raises(ValueError, match="^highlight: the text does not occur"):
        plots.kept_positions(res, sp, highlight="needle")
    with pytest.raises(ValueError, match="^highlight: positions must be in"):
        plots.kept_positions(res, sp, highlight=[sp.T])
    with pytest.raises(ValueError, match=r"^layer: must be an integer in \[0, 2\]"):
        plots.kept_positions(res, sp, layer=3)
    with pytest.raises(ValueError, match="^results: must not be empty"):
        plots.kept_positions([], sp)


def _sweep_frame():
    import pandas as pd

    return pd.DataFrame({
        "model": "m", "task": "squad", "item_id": [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0],
        "method": ["full"] * 2 + ["deferkv"] * 4 + ["h2o"] * 5,
        "p_budget": [None, None, 32, 32, 64, 64, 32, 32, 64, 64, 64],
        "f1": [1, 0.8, 0.5, 0.6, 0.9, 0.7, 0.2, 0.4, 0.6, 0.5, 0.0],
        "em": [1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0],
        "kv_bytes": [2**20] * 2 + [2**18] * 4 + [2**19] * 5, "retained_tokens": [100] * 11, "prompt_tokens": [200] * 11,
        "error": [None] * 10 + ["boom"]})


def test_accuracy_vs_budget_and_table():
    df = _sweep_frame()
    fig = plots.accuracy_vs_budget(df, metric="f1")
    byname = {t.name: t for t in fig.data}
    d = byname["deferkv"]
    assert list(d.x) == [32, 64] and np.allclose(d.y, [0.55, 0.8])
    assert np.allclose(d.error_y.array, [0.05, 0.1])  # standard error of two items
    h = byname["h2o"]
    assert np.allclose(h.y, [0.3, 0.55])  # the error row is left out
    assert np.allclose(byname["full"].y, [0.9, 0.9])
    _meta_ok(fig, "accuracy_vs_budget", metric="f1", x="p_budget", model_id="m", n_rows=10)
    _frame_matches(fig)
    fig = plots.accuracy_vs_budget(df.drop(columns=["p_budget"]), metric="em")
    assert fig.layout.meta["x"] == "retained_fraction" and list(fig.data[0].x) == [0.5]
    with pytest.raises(ValueError, match="^metric: must be a numeric column"):
        plots.accuracy_vs_budget(df, metric="accuracy")
    with pytest.raises(ValueError, match="^by: columns"):
        plots.accuracy_vs_budget(df, by="policy")

    fig = plots.kv_bytes_table(df)
    t = fig.data[0]
    frame = plots.figure_frame(fig)
    assert list(frame.columns[3:]) == ["method", "p_budget", "n", "em", "f1", "KV MiB", "retained tokens", "retained/T"]
    row = frame[(frame.method == "h2o") & (frame.p_budget == 64)].iloc[0]
    assert row["n"] == 2 and row["f1"] == pytest.approx(0.55) and row["KV MiB"] == pytest.approx(0.5)
    assert frame[frame.method == "full"]["KV MiB"].item() == pytest.approx(1.0)
    assert len(frame) == len(t.cells.values[0]) == 5
    _meta_ok(fig, "kv_bytes_table", by=["method", "p_budget"], bytes_column="kv_bytes")
    # GenerationResult frames (policy, budget, kv_bytes_after)
    import pandas as pd

    gf = pd.concat([_gen("h2o", 20, 40, 0).to_frame(), _gen("h2o", 30, 40, 1).to_frame()], ignore_index=True)
    fr = plots.figure_frame(plots.kv_bytes_table(gf))
    assert fr["budget"].tolist() == [20, 30] and fr["KV MiB"].tolist() == pytest.approx([500 / 2**20] * 2)
    with pytest.raises(ValueError, match="^metrics: columns"):
        plots.kv_bytes_table(df, metrics=["acc"])


# ----------------------------------------------------------------------------- real capture
def test_real_capture_figures(smollm_capture):
    cap = smollm_capture
    sp = cap.spans
    params = EntroPrefillParams(target=0.2, eps_row=0.3, eps_audit=0.5, streak=0)
    tr = trace(cap, params)
    fig = plots.head_heatmap(tr.pooling, "sink", model_id=cap.model_id, params=params)
    assert np.allclose(np.array(fig.data[0].z, dtype=float), cap.sink_mass("observer").numpy(), atol=1e-5)
    assert fig.layout.meta["model_id"] == cap.model_id and fig.layout.meta["eps_row"] == 0.3
    layer = tr.l_star if tr.l_star is not None else 10
    fig = plots.chunk_priorities(tr.priorities, cap, layer, removed=tr)
    ans = sp.chunk_doc.index(sp.answer_doc)
    texts = {row[0]: row[2] for t in fig.data[:2] for row in t.customdata}
    s, e = sp.chunks[ans]
    assert html.unescape(texts[ans]).startswith("".join(sp.tokens[s:e]).replace("\n", " ⏎ ").strip()[:60])
    assert fig.layout.meta["model_id"] == cap.model_id
    strip = plots.attention_strip(cap, 3, 2)
    toks = [c[0] for c in strip.data[0].customdata]
    assert toks[:2] == [html.escape("<|im_start|>"), "system"]  # tokens on hover, escaped for plotly
    assert plots.figure_frame(strip)["token"].iloc[0] == "<|im_start|>"
    fig = plots.trace_layers(tr)
    assert len(fig.data[0].x) == cap.L - 1
    json.dumps(fig.layout.meta)


def test_figure_frame_accepts_numpy_arrays():
    """Traces built from numpy arrays (z, x, y) flatten like lists."""
    import numpy as np
    import plotly.graph_objects as go

    from workbench.show.plots import figure_frame

    z = np.arange(6, dtype=float).reshape(2, 3)
    fig = go.Figure([go.Heatmap(z=z, x=np.array([10, 20, 30]), y=np.array([1, 2])),
                     go.Scatter(x=np.arange(4), y=np.arange(4) ** 2)])
    df = figure_frame(fig)
    hm = df[df.trace == 0]
    assert len(hm) == 6 and hm.z.tolist() == [0, 1, 2, 3, 4, 5] and hm.x.tolist() == [10, 20, 30] * 2
    sc = df[df.trace == 1]
    assert sc.y.tolist() == [0, 1, 4, 9]


# ----------------------------------------------------------------------------- fast spanning shapes
@pytest.mark.parametrize("kind,args,kw", [
    ("vline", (3.0,), dict(line=dict(color="#000", dash="dot", width=1))),
    ("vline", (0.5,), dict(line=dict(color="#000", width=1), row=2, col=1)),
    ("hline", (1.0,), dict(line=dict(color="#999", dash="dash", width=1), row=2, col=1, secondary_y=False,
                           annotation_text="d_max", annotation_font=dict(size=10))),
    ("hline", (4.0,), dict(line=dict(color="#999", width=1), row=2, col=1, secondary_y=True)),
    # (plotly anchors a secondary-y line's annotation on the primary y axis; add_span keeps it on the line's axis)
    ("hline", (0.2,), dict(line=dict(width=1), annotation_text="b", annotation_position="bottom right", row=3, col=1)),
    ("vrect", (1.5, 4.5), dict(fillcolor="#0a0", opacity=0.2, line_width=0, row=3, col=1)),
    ("vrect", (2.5, 6.5), dict(line=dict(color="#0a0", width=1.5), fillcolor="rgba(0,0,0,0)", row=2, col=1,
                               annotation_text="answer passage", annotation_position="top left",
                               annotation_font=dict(size=10, color="#fff"))),
])
def test_span_matches_plotly(kind, args, kw):
    """``add_span`` on a draft draws the same shape and annotation as plotly's ``add_vline/add_hline/add_vrect``."""
    from plotly.subplots import make_subplots

    grid_kw = dict(rows=3, cols=1, specs=[[{}], [{"secondary_y": True}], [{}]])

    def fill(f):
        for r in (1, 2, 3):
            f.add_trace(go.Scatter(x=[0, 9], y=[0, 1]), row=r, col=1)
        f.add_trace(go.Scatter(x=[0, 9], y=[5, 3]), row=2, col=1, secondary_y=True)
        return f

    ours, theirs = fill(Draft.subplots(**grid_kw)), fill(make_subplots(**grid_kw))
    add_span(ours, kind, *args, **kw)
    ours = ours.figure()
    pkw = dict(kw)
    if kind == "vrect":
        pkw.update(x0=args[0], x1=args[1])
    else:
        pkw["x" if kind == "vline" else "y"] = args[0]
    getattr(theirs, f"add_{kind}")(**pkw)
    assert ours.layout.shapes and ours.layout.to_plotly_json()["shapes"] == theirs.layout.to_plotly_json()["shapes"]
    assert ours.layout.to_plotly_json().get("annotations") == theirs.layout.to_plotly_json().get("annotations")
    assert ours.to_plotly_json() == theirs.to_plotly_json()


@pytest.mark.parametrize("kw", [
    dict(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06),
    dict(rows=2, cols=2, column_widths=[0.7, 0.3], horizontal_spacing=0.1, vertical_spacing=0.14),
    dict(rows=4, cols=1, shared_xaxes=True, row_heights=[0.38, 0.25, 0.25, 0.12], vertical_spacing=0.05,
         specs=[[{}], [{"secondary_y": True}], [{}], [{}]]),
])
def test_draft_equals_plotly_figure(kw):
    """A :class:`Draft` (dicts, validated once) builds the figure plotly's incremental API builds,
    and still rejects a wrong property."""
    from plotly.subplots import make_subplots

    for _ in range(2):  # the first call fills the grid cache, the second copies it
        ours, ref = Draft.subplots(**kw), make_subplots(**kw)
        for f in (ours, ref):
            for r in range(1, kw["rows"] + 1):
                for c in range(1, kw["cols"] + 1):
                    for sec in ((False, True) if "specs" in kw and r == 2 else (False,)):
                        f.add_trace(go.Scatter(x=[r, c], y=[c, r], marker_color="red"), row=r, col=c, secondary_y=sec)
            f.update_yaxes(title_text="first", range=[0, 1], row=1, col=1)
            f.update_xaxes(title_text="last", row=kw["rows"], col=1)
            f.update_xaxes(dtick=2)
            f.add_annotation(x=1, y=0, xref="x domain", yref="y domain", text="note", showarrow=False)
            f.add_annotation(x=1, y=1, text="in the last row", row=kw["rows"], col=1)
            f.add_annotation(x=0.5, y=0.5, xref="x domain", yref="y domain", text="domain", row=kw["rows"], col=1)
            f.update_layout(xaxis_title_font_size=9, legend=dict(orientation="h"))
        ours = ours.figure()
        assert ours.to_plotly_json() == ref.to_plotly_json()
    d = Draft.subplots(**kw)
    with pytest.raises(ValueError):
        d.update_layout(not_a_property=1)
    with pytest.raises(ValueError):
        d.update_xaxes(not_a_property=1, row=1, col=1)
    with pytest.raises(ValueError, match="row, col"):
        d.add_trace(go.Scatter(), row=kw["rows"], col=1, secondary_y=True)


@pytest.mark.parametrize("figure", ["certificate", "trace_layers", "pages"])
def test_update_figure_one_message_equals_new(syn, figure):
    """Mixed trace types on subplots: the widget is brought to the new figure by ONE plotly_update (one
    front-end message), and afterwards holds exactly the new figure's traces and layout."""
    cap, params, tr = syn
    tr2 = trace(cap, params.replace(zeta=1.0, eps_audit=0.4))
    if figure == "pages":
        make = lambda t: plots.pages(PageSelection(b=4, K=2 if t is tr else 3, s=8).select(
            t.pooling.a, t.pooling.w, cap.head_group, d=64), 1 if t is tr else 2, cap)
    else:
        make = lambda t: getattr(plots, figure)(t)
    old, new = make(tr), make(tr2)
    target = go.FigureWidget(old)
    target.update_layout(height=333)
    sent = []
    orig = target._send_update_msg
    target._send_update_msg = lambda *a, **k: (sent.append(k), orig(*a, **k))
    assert plots.update_figure(target, new) is True
    assert len(sent) == 1
    strip = lambda d: {k: v for k, v in d.items() if k != "uid"}
    got = json.loads(go.Figure(target).to_json())
    want = json.loads(new.to_json())
    assert [strip(t) for t in got["data"]] == [strip(t) for t in want["data"]]
    keep = set(KEEP_LAYOUT)
    assert {k: v for k, v in got["layout"].items() if k not in keep} == \
        {k: v for k, v in want["layout"].items() if k not in keep}
    assert target.layout.height == 333
    # the target shares nothing mutable with ``new``: editing ``new`` afterwards leaves the widget alone
    before = go.Figure(target).to_json()
    new.data[0].name = "edited"
    new.data[-1].update(hoverlabel=dict(bgcolor="red"))
    new.update_layout(title_text="edited", xaxis=dict(title=dict(text="edited")))
    assert go.Figure(target).to_json() == before
