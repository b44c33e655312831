"""The paper rules of ``workbench.show.paper_layout`` on figure dicts, without a browser: the canvas grows to give
the plot areas their share, no font is left under 7 pt at a column, too-wide tables split with their key columns
repeated, log axes get full-size tick labels. (``test_figure_layout`` measures the rendered SVGs.)"""
from __future__ import annotations

import copy

import numpy as np
import plotly.graph_objects as go
import pytest
from _all_figures import all_figures, sweep_frame

from workbench.show import export as ex
from workbench.show import plots
from workbench.show.paper_layout import LEGEND_SHARE, MIN_PT, PLOT_SHARE, _floor_fonts, paper_layout


def _laid(fig, width="single", **kw):
    size = ex.resolve_size(fig, width)
    d = fig.to_dict()
    d["layout"].pop("meta", None)
    ex._paper_fonts(d, size, "auto")
    h = paper_layout(d, size.width, size.height, preset=size.preset, title=False, **kw)
    return d, size, h


def _fonts(node, out=None):
    out = [] if out is None else out
    if isinstance(node, dict):
        for k, v in node.items():
            if k.endswith("font") and isinstance(v, dict) and isinstance(v.get("size"), (int, float)):
                out.append(v["size"])
            _fonts(v, out)
    elif isinstance(node, list):
        for v in node:
            _fonts(v, out)
    return out


@pytest.fixture(scope="module")
def figures():
    return all_figures()


def test_a_tall_legend_grows_the_canvas(figures):
    """accuracy_vs_budget at single column: its legend rows would take > 25 % of the preset's height; the returned
    height gives the plot (height − top − bottom margins) at least PLOT_SHARE, the legend at most LEGEND_SHARE."""
    d, size, h = _laid(figures["accuracy_vs_budget"])
    assert h > size.height
    m = d["layout"]["margin"]
    assert (h - m["t"] - m["b"]) / h >= PLOT_SHARE
    assert (m["t"] - 0.9 * 9) / h <= LEGEND_SHARE  # the top margin holds the legend (and the top tick's room)
    d2, _, h2 = _laid(figures["accuracy_vs_budget"], grow=False)
    assert h2 == size.height  # a fixed size stays fixed


def test_export_records_the_grown_height(figures, tmp_path):
    """The sidecar's size is the height drawn; a caller's aspect is kept as given."""
    import json
    ex.export(figures["accuracy_vs_budget"], tmp_path / "a", formats=("svg",), csv=False)
    side = json.loads((tmp_path / "a.json").read_text())
    svg = (tmp_path / "a.svg").read_text()
    h = side["sizes"][0]["height_px"]
    assert h > ex.resolve_size(figures["accuracy_vs_budget"], "single").height
    assert f'viewBox="0 0 240 {h}"' in svg
    ex.export(figures["accuracy_vs_budget"], tmp_path / "b", formats=("svg",), csv=False, aspect=0.5)
    assert json.loads((tmp_path / "b.json").read_text())["sizes"][0]["height_px"] == 120


def test_no_font_under_the_floor_at_a_column(figures):
    for name in ("trace_layers", "envelope_rows", "hoeffding_radius", "kv_bytes_table"):
        for width in ("single", "double"):
            d, _, _ = _laid(figures[name], width)
            assert min(_fonts(d)) >= MIN_PT, (name, width)
    node = {"layout": {"font": {"size": 5}, "annotations": [{"font": {"size": [3, 9]}}]}}
    _floor_fonts(node, 7.0)
    assert node == {"layout": {"font": {"size": 7.0}, "annotations": [{"font": {"size": [7.0, 9]}}]}}


def test_a_wide_table_splits_with_its_keys_repeated():
    """kv_bytes_table's 8 columns do not fit 3.33 in at 7 pt: stacked tables, each starting with the ``by`` columns,
    together holding every other column once and every row, in order, none overlapping."""
    fig = plots.kv_bytes_table(sweep_frame())
    t0 = fig.to_dict()["data"][0]
    heads = [h for h in t0["header"]["values"]]
    d, size, h = _laid(fig)
    parts = [t for t in d["data"] if t.get("type") == "table"]
    assert len(parts) >= 2
    keys = heads[:2]  # method, p_budget
    rest = []
    for p in parts:
        assert p["header"]["values"][:2] == keys
        rest += p["header"]["values"][2:]
        assert [list(v) for v in p["cells"]["values"][:2]] == [list(v) for v in t0["cells"]["values"][:2]]
        assert len(p["columnwidth"]) == len(p["header"]["values"]) == len(p["cells"]["values"])
        assert p["cells"]["font"]["size"] >= MIN_PT
    assert rest == heads[2:]
    doms = [p["domain"]["y"] for p in parts]
    assert all(a[0] >= b[1] - 1e-9 for a, b in zip(doms, doms[1:]))  # top to bottom, no overlap
    assert h > size.height
    # at double column the table fits at its own font: one table
    d2, _, _ = _laid(fig, "double")
    assert sum(t.get("type") == "table" for t in d2["data"]) == 1


def test_log_axes_get_full_size_ticks():
    """Over 3.5 decades on a 3.33 in axis: decade ticks; over one: 1-2-5 steps written out (not plotly's small digits)."""
    wide = go.Figure(go.Scatter(x=np.array([1.0, 3e3]), y=[1, 2]), layout=dict(xaxis=dict(type="log")))
    d, _, _ = _laid(wide)
    assert d["layout"]["xaxis"]["dtick"] == 1
    narrow = go.Figure(go.Scatter(x=[3.0, 40.0], y=[1, 2]), layout=dict(xaxis=dict(type="log")))
    d, _, _ = _laid(narrow)
    assert d["layout"]["xaxis"]["tickvals"] == [5.0, 10.0, 20.0]
    assert d["layout"]["xaxis"]["ticktext"] == ["5", "10", "20"]
    fixed = copy.deepcopy(narrow)
    fixed.update_xaxes(dtick="D2")
    d, _, _ = _laid(fixed)
    assert d["layout"]["xaxis"]["dtick"] == "D2" and "tickvals" not in d["layout"]["xaxis"]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 12, 30])
def test_whole_index_axes_get_fewer_ticks_than_twice_their_span(n):
    """A heatmap over ``n`` layers (its y from 0, its cells one step wide: span n) and a line over x = 0 … n−1 (span
    n − 1): ``nticks`` stays under twice the span, so that plotly's rough step exceeds 0.5 (it rounds to 1, 2, 5 …:
    the rendered labels are checked in ``test_figure_layout``); a value axis (the line's y) and an explicit tick
    array keep their ticks."""
    heat = {"data": [{"type": "heatmap", "z": np.random.default_rng(0).random((n, 6)).tolist()}], "layout": {}}
    paper_layout(heat, 660, 400, preset=None, title=True)
    y = heat["layout"].get("yaxis", {})
    assert y.get("nticks", 10) < 2 * n or (n >= 5 and "nticks" not in y), y      # plotly's own default: 5-10
    line = {"data": [{"type": "scatter", "x": list(range(n)), "y": [0.5 * i for i in range(n)]}], "layout": {}}
    paper_layout(line, 660, 400, preset=None, title=True)
    x = line["layout"].get("xaxis", {})
    assert 1 <= x.get("nticks", 10) < max(2 * (n - 1), 2) or (n >= 6 and "nticks" not in x), x
    assert "nticks" not in line["layout"].get("yaxis", {})
    fixed = {"data": heat["data"], "layout": {"yaxis": {"tickmode": "array", "tickvals": [0]}}}
    paper_layout(fixed, 660, 400, preset=None, title=True)
    assert "nticks" not in fixed["layout"]["yaxis"]


def _legend_rows(lay: dict) -> int:
    """The legend rows ``paper_layout`` reserved (its box: ~19 px a row at 9 pt, and 14 px of padding)."""
    return round((lay["margin"]["t"] - 0.9 * lay["font"]["size"] - 14) / (max(lay["font"]["size"] * 1.3, 10) + 7.5))


def test_colour_bars_narrow_the_legend_room():
    """A horizontal legend wraps to the plot's width, which the colour bar at its right narrows (plotly's automargin
    pushes the right margin past it): at one column, four bar entries beside a heatmap's bar get more rows than
    without the bar. (Left out, 07's shift figure reserved 2 rows and plotly drew 4: its legend took 35 %.)"""
    def laid(scale: bool) -> dict:
        fig = go.Figure([go.Bar(x=[0, 1], y=[1, 2], name=f"gain {i}→{i + 1}", yaxis="y2") for i in range(4)]
                        + [go.Heatmap(z=[[0, 1], [1, 0]], showscale=scale, colorbar=dict(title=dict(text="recall")))],
                        layout=dict(template="workbench", yaxis=dict(domain=[0, 0.45]),
                                    yaxis2=dict(domain=[0.55, 1])))
        return _laid(fig)[0]["layout"]

    assert _legend_rows(laid(True)) > _legend_rows(laid(False)) >= 1


def test_stacked_rows_leave_room_for_a_wrapped_x_title():
    """The gap under a stacked panel holds its x tick labels and its wrapped title with the title's own standoff
    (a wrapped title stands further off): 07's step axis title lay on the panel below at one column."""
    title = "step r (≤ 0 prompt tail, ≥ 1 decode) " * 2
    fig = go.Figure([go.Scatter(x=[0, 1], y=[0, 1]), go.Scatter(x=[0, 1], y=[1, 0], xaxis="x2", yaxis="y2")],
                    layout=dict(template="workbench", xaxis=dict(title=dict(text=title), anchor="y"),
                                yaxis=dict(domain=[0.55, 1]), xaxis2=dict(anchor="y2"), yaxis2=dict(domain=[0, 0.45])))
    d, size, h = _laid(fig)
    lay = d["layout"]
    t = lay["xaxis"]["title"]
    assert "<br>" in t["text"]
    plot_h = h - lay["margin"]["t"] - max(lay["margin"]["b"], lay["font"]["size"] * 3.2)
    gap = (lay["yaxis"]["domain"][0] - lay["yaxis2"]["domain"][1]) * plot_h
    tf = t["font"]["size"]
    assert gap >= lay["font"]["size"] * 0.85 * 1.4 + 8 + tf * 1.3 * (t["text"].count("<br>") + 1) + t["standoff"]


def test_a_panel_beside_another_gets_room_for_its_y_labels():
    """Two panels side by side under a full-width one (09's pages figure): the gap left of the right panel holds its
    y tick labels and title, taken from the left panel (up to half of it); where that is not enough the right panel's
    y axis moves to its right side, at the canvas edge. (Its wrapped 'UOR (s = 16)' lay on the left panel.)"""
    def fig(title: str) -> go.Figure:
        return go.Figure([go.Scatter(x=[0, 1], y=[0, 1]), go.Bar(x=[0, 1], y=[1, 2], xaxis="x2", yaxis="y2"),
                          go.Scatter(x=[0, 1], y=[2.5, 2.6], xaxis="x3", yaxis="y3")],
                         layout=dict(template="workbench", yaxis=dict(domain=[0.55, 1]),
                                     xaxis2=dict(domain=[0, 0.45], anchor="y2"), yaxis2=dict(domain=[0, 0.45]),
                                     xaxis3=dict(domain=[0.55, 1], anchor="y3"),
                                     yaxis3=dict(domain=[0, 0.45], anchor="x3", title=dict(text=title))))
    wide = go.Figure(fig("UOR"))
    wide.update_layout(xaxis2_domain=[0, 0.3], xaxis3_domain=[0.7, 1])
    d, _, _ = _laid(wide)                            # room enough: nothing moves
    assert d["layout"]["xaxis2"]["domain"] == [0, 0.3] and "side" not in d["layout"]["yaxis3"]
    d, size, _ = _laid(fig("UOR"))                   # a narrow gap: the left panel gives up some px
    lay = d["layout"]
    assert 0.225 <= lay["xaxis2"]["domain"][1] < 0.45 and "side" not in lay["yaxis3"]
    d, _, _ = _laid(fig("union of the kept pages over the rows (s = 16)"))   # a wrapped long title: to the right
    assert d["layout"]["yaxis3"]["side"] == "right" and d["layout"]["xaxis2"]["domain"] == [0, 0.45]


def test_a_panel_with_its_y_axis_on_the_right_takes_no_gap():
    """A right panel whose figure puts its y axis on the right side (the pages figure's UOR) has no labels in the gap
    between the panels: the left panel keeps its width, where it gave up px for labels drawn at the canvas edge."""
    fig = go.Figure([go.Scatter(x=[0, 1], y=[0, 1]), go.Bar(x=[0, 1], y=[1, 2], xaxis="x2", yaxis="y2"),
                     go.Scatter(x=[0, 1], y=[2.5, 2.6], xaxis="x3", yaxis="y3")],
                    layout=dict(template="workbench", yaxis=dict(domain=[0.55, 1]),
                                xaxis2=dict(domain=[0, 0.45], anchor="y2"), yaxis2=dict(domain=[0, 0.45]),
                                xaxis3=dict(domain=[0.55, 1], anchor="y3"),
                                yaxis3=dict(domain=[0, 0.45], anchor="x3", side="right", title=dict(text="UOR"))))
    d, _, _ = _laid(fig)
    assert d["layout"]["xaxis2"]["domain"] == [0, 0.45] and d["layout"]["yaxis3"]["side"] == "right"


def test_stacked_panels_without_x_labels_keep_their_facing_y_ticks_apart():
    """Panels stacked on a shared x axis (03's priorities: S, lift, κ) have no x labels between them, but the lower
    panel's top y tick label and the upper one's bottom label each stand half a line past their panel: the gap holds
    both (their '1' and '0' overlapped at one column)."""
    fig = go.Figure([go.Bar(x=[0, 1], y=[0, 1], xaxis=f"x{i or ''}", yaxis=f"y{i or ''}") for i in (0, 2, 3)],
                    layout=dict(template="workbench", yaxis=dict(domain=[0.7, 1]), yaxis2=dict(domain=[0.35, 0.65]),
                                yaxis3=dict(domain=[0, 0.3]), xaxis=dict(showticklabels=False, anchor="y"),
                                xaxis2=dict(showticklabels=False, anchor="y2"), xaxis3=dict(anchor="y3")))
    d, size, h = _laid(fig)
    lay = d["layout"]
    plot_h = h - lay["margin"]["t"] - max(lay["margin"]["b"], lay["font"]["size"] * 3.2)
    for upper, lower in (("yaxis", "yaxis2"), ("yaxis2", "yaxis3")):
        gap = (lay[upper]["domain"][0] - lay[lower]["domain"][1]) * plot_h
        assert gap >= lay["font"]["size"] * 0.85 * 1.2, (upper, gap)
