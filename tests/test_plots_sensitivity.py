"""Tests of workbench.show.plots.sensitivity (the line figures of notebooks 02, 03 and 05) and of the export of
every figure those notebooks and notebook 04 draw: each trace's numbers are the frame's columns (in the frame's
order of lines, sorted along x), ``meta`` names the figure and its settings, bad frames are refused by name."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from _all_figures import every_removal, sensitivity_frames, synthetic_inputs

import workbench as wb
from workbench.analyse.audit import hoeffding_b
from workbench.analyse.pooling import HeadPooling
from workbench.show import plots
from workbench.show.export import browser_path


@pytest.fixture(scope="module")
def syn():
    sp, cap, params, tr = synthetic_inputs()
    return cap, tr, sensitivity_frames(cap, tr, tr.l_star)


def _meta(fig, name, **expect):
    meta = fig.layout.meta
    json.dumps(meta, allow_nan=False)
    assert meta["figure"] == name and "model_id" in meta
    for k, v in expect.items():
        assert meta[k] == v, (k, meta[k], v)
    assert fig.layout.template.layout.font.family == plots.FONT
    return meta


def _refuses_bad_frames(fn, need):
    with pytest.raises(ValueError, match="^frame: must be a pandas DataFrame, got dict"):
        fn({c: [1] for c in need})
    with pytest.raises(ValueError, match=r"^frame: needs columns \[" + ", ".join(repr(c) for c in sorted(need))):
        fn(pd.DataFrame({c: [1] for c in need[1:]}))
    with pytest.raises(ValueError, match="^frame: is empty"):
        fn(pd.DataFrame(columns=need))


def test_head_weights_traces_are_the_frame_and_the_pooling(syn):
    cap, tr, fr = syn
    l = tr.l_star
    df = fr["head_weights"]
    fig = plots.head_weights(df, layer=l, model_id="m")
    zetas, heads = [1.0, 0.5, 0.2, 0.05], [f"h{h} (g{g})" for h, g in enumerate(cap.head_group.tolist())]
    assert len(fig.data) == len(zetas) * len(heads)
    for i, z in enumerate(zetas):
        for j, head in enumerate(heads):
            t = fig.data[i * len(heads) + j]
            sub = df[(df.zeta == z) & (df["head"] == head)].sort_values("tau")
            assert t.name == head and t.showlegend == (i == 0) and t.legendgroup == head
            assert np.array_equal(t.x, sub["tau"].to_numpy()) and np.array_equal(t.y, sub["w"].to_numpy())
            # the weights drawn are the pooling's own, at each τ
            want = [float(HeadPooling(zeta=z, tau=tau)(cap).w[l, j]) for tau in sub["tau"]]
            assert np.allclose(t.y, want, rtol=0, atol=1e-15)
            assert t.xaxis == fig.data[i * len(heads)].xaxis  # one panel per ζ
    assert len({t.xaxis for t in fig.data}) == 4
    assert [a.text for a in fig.layout.annotations] == [f"ζ = {z:g}" for z in zetas]
    assert all(fig.layout[k].type == "log" for k in fig.layout if k.startswith("xaxis"))
    # ζ = 1: every head at 1/r; the styles past 8 heads change dash and marker
    assert all(np.allclose(t.y, 1 / cap.r) for t in fig.data[:len(heads)])
    assert fig.data[8].line.dash == "dash" and fig.data[8].line.color == fig.data[0].line.color
    _meta(fig, "head_weights", model_id="m", layer=l, zetas=zetas, taus=[0.1, 0.3, 1.0, 3.0], heads=heads)
    assert len(plots.figure_frame(fig)) == len(df)
    _refuses_bad_frames(plots.head_weights, ["zeta", "tau", "head", "w"])


def test_answer_rank_traces_are_the_frame(syn):
    cap, tr, fr = syn
    df = fr["answer_rank"]
    fig = plots.answer_rank(df, answer_chunk=2)
    assert [t.name for t in fig.data] == ["Rényi", "mass only", "per-head max"]
    S = tr.priorities.S  # the Rényi line, recomputed from the trace's priorities (answer chunk 2)
    assert list(fig.data[0].y) == [int((S[l] > S[l, 2]).sum()) for l in range(cap.L)]
    for t in fig.data:
        sub = df[df.method == t.name].sort_values("layer")
        assert list(t.x) == sub["layer"].tolist() == list(range(cap.L)) and list(t.y) == sub["rank"].tolist()
    assert "c2" in fig.layout.title.text
    _meta(fig, "answer_rank", answer_chunk=2, methods=["Rényi", "mass only", "per-head max"], layers=list(range(cap.L)))
    # lines follow the frame's order of methods, points sorted by layer
    rev = plots.answer_rank(df.iloc[::-1])
    assert [t.name for t in rev.data] == ["per-head max", "mass only", "Rényi"]
    assert list(rev.data[2].y) == list(fig.data[0].y)
    with pytest.raises(ValueError, match="^answer_chunk: must be an integer >= 0, got -1"):
        plots.answer_rank(df, answer_chunk=-1)
    _refuses_bad_frames(plots.answer_rank, ["layer", "method", "rank"])


def test_removal_budget_traces_are_the_frame(syn):
    cap, tr, fr = syn
    df = fr["removal_budget"]
    fig = plots.removal_budget(df, layer=tr.l_star)
    eps = [0.05, 0.2, 0.4]
    assert len(fig.data) == 2 * len(eps) + 1
    for i, e in enumerate(eps):
        D, U = fig.data[2 * i], fig.data[2 * i + 1]
        sub = df[df.eps_row == e].sort_values("target")
        assert D.name == U.name == f"ε_row = {e:g}" and D.showlegend and not U.showlegend
        assert D.line.dash == "solid" and U.line.dash == "dash" and D.line.color == U.line.color
        assert np.array_equal(D.x, sub["target"].to_numpy()) and np.array_equal(U.x, sub["target"].to_numpy())
        assert np.array_equal(D.y, sub["D"].to_numpy(dtype=float)) and np.allclose(U.y, sub["U"].to_numpy(dtype=float))
        assert (np.asarray(D.y) <= np.asarray(U.y) + 1e-6).all()  # the certificate bounds the greedy removal
    diag = fig.data[-1]
    assert diag.name == "D = target" and list(diag.x) == list(diag.y) == sorted(set(df["target"].tolist()))
    _meta(fig, "removal_budget", layer=tr.l_star, eps_rows=eps, targets=sorted(set(df["target"].tolist())))
    # a missing certificate (certify=False: U is None) is a gap, not an error
    gap = df.assign(U=[None] * len(df))
    assert all(np.isnan(t.y).all() for t in plots.removal_budget(gap).data[1:-1:2])
    _refuses_bad_frames(plots.removal_budget, ["eps_row", "target", "D", "U"])


def test_hoeffding_radius_traces_are_the_frame(syn):
    cap, _, fr = syn
    df = fr["hoeffding_radius"]
    fig = plots.hoeffding_radius(df, eps_audit=0.2, J=11, H_Q=cap.H_Q)
    assert [t.name for t in fig.data] == ["δ = 0.01", "δ = 0.2"]
    for t, d in zip(fig.data, (0.01, 0.2)):
        assert list(t.x) == [8, 32, 128, 512]
        assert np.allclose(t.y, [math.sqrt(math.log(11 * cap.H_Q / d) / (2 * m)) for m in t.x], rtol=1e-12)
        assert np.allclose(t.y, [hoeffding_b(int(m), d, 11, cap.H_Q) for m in t.x], rtol=0, atol=0)
    (line,) = fig.layout.shapes
    assert line.y0 == line.y1 == 0.2 and line.line.dash == "dash"
    assert fig.layout.xaxis.type == "log" and "ε_audit = 0.2" in fig.layout.title.text
    _meta(fig, "hoeffding_radius", eps_audit=0.2, J=11, H_Q=cap.H_Q, deltas=[0.01, 0.2], m_a=[8, 32, 128, 512])
    bare = plots.hoeffding_radius(df)
    assert not bare.layout.shapes and bare.layout.meta["eps_audit"] is None
    for kw, msg in (({"eps_audit": 0}, r"^eps_audit: must be in \(0, 1\], got 0"),
                    ({"J": 0}, "^J: must be an integer >= 1, got 0"), ({"H_Q": 1.5}, "^H_Q: must be an integer >= 1")):
        with pytest.raises(ValueError, match=msg):
            plots.hoeffding_radius(df, **kw)
    _refuses_bad_frames(plots.hoeffding_radius, ["m_a", "delta", "b"])


@pytest.mark.slow
@pytest.mark.skipif(browser_path() is None, reason="no Chromium for the export")
def test_notebook_figures_export_with_sidecar(syn, tmp_path):
    """Every figure of notebooks 02–05 through ``wb.export``: PDF, SVG and PNG, the sidecar carries its ``meta``,
    the CSV its plotted points."""
    cap, tr, fr = syn
    l = tr.l_star
    Es, envs = every_removal(cap, tr.pooling, l)
    figs = {"pooled_measure": plots.pooled_measure(tr.pooling, l, cap),
            "head_weights": plots.head_weights(fr["head_weights"], layer=l),
            "answer_rank": plots.answer_rank(fr["answer_rank"], answer_chunk=2),
            "removal_budget": plots.removal_budget(fr["removal_budget"], layer=l),
            "envelope_scatter": plots.envelope_scatter(envs, removals=Es),
            "hoeffding_radius": plots.hoeffding_radius(fr["hoeffding_radius"], eps_audit=0.2)}
    for name, fig in figs.items():
        paths = wb.export(fig, tmp_path / name, width="single")
        assert sorted(p.suffix for p in paths) == [".csv", ".json", ".pdf", ".png", ".svg"], name
        assert all(p.stat().st_size > 0 for p in paths)
        side = json.loads((tmp_path / f"{name}.json").read_text())
        assert side["meta"]["figure"] == name and {k: side["meta"][k] for k in fig.layout.meta} == \
            json.loads(json.dumps(fig.layout.meta)), name
        assert len(pd.read_csv(tmp_path / f"{name}.csv")) == len(plots.figure_frame(fig)), name
