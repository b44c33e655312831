"""Layout rules of the paper template (``workbench.show.paper_layout``), checked on the exported SVG of every
figure function of :mod:`workbench.show.plots` at single and double column width.

The SVG is opened in headless Debian chromium (Playwright) and every non-empty ``<text>`` element's box is
read (``getBoundingClientRect``, transforms included, in the SVG's viewBox units), with the plot areas
(every subplot's clip rectangle). Checked: no two text boxes overlap (by more than ``TOL`` px in both
directions), none falls outside the canvas, and no title, legend entry or axis title overlaps a plot
area (the rule and the SVG reader: ``tests/_layout_rules.py``, shared with the browser tests). The title is
dropped by default; kept, it obeys the same rules. Needs kaleido's Chromium too.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from _all_figures import FIGURE_FUNCTIONS, all_figures
from _layout_rules import BOXES_JS, layout_problems, whole_axes
from _layout_rules import kind as _kind

from workbench.analyse.pages import PageSelection
from workbench.analyse.pooling import HeadPooling
from workbench.capture.data import Capture
from workbench.run.spans import PromptSpans
from workbench.show import export as ex
from workbench.show import plots
from workbench.show.paper_layout import LEGEND_SHARE, MIN_PT, PLOT_SHARE

_sync_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists() or ex.browser_path() is None,
                                reason=f"no Debian chromium at {CHROMIUM}")


@pytest.fixture(scope="module")
def figures():
    return all_figures()


@pytest.fixture(scope="module")
def page():
    ex.ensure_server()
    with _sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"], headless=True)
        try:
            yield browser.new_page()
        finally:
            browser.close()


def boxes(page, svg_path: Path) -> dict:
    page.set_content(f"<html><body style='margin:0'>{svg_path.read_text()}</body></html>")
    return page.evaluate(BOXES_JS)


def test_every_figure_function_is_covered(figures):
    public = {n for n in plots.__all__ if callable(getattr(plots, n)) and not n.startswith("_")} - {
        "figure_frame", "update_figure", "figure_function", "as_figure", "categorical", "categorical_px", "token_values",
        "removed_positions"}
    assert public == set(FIGURE_FUNCTIONS)
    assert set(FIGURE_FUNCTIONS) <= {k.split("-")[0] for k in figures}


# The paper rules for an exported figure: the plot areas span at least 55 % of its height, the legend at most
# 25 %, and no text is under 7 pt (the SVG's user unit is the point: 3.33 in = 240 units). ``paper_layout`` grows the
# canvas, floors the fonts and splits too-wide tables to meet them: every export of every figure function must.
FONTS_JS = """() => Array.from(document.querySelectorAll('svg text')).filter(t => t.textContent.trim())
  .map(t => parseFloat(getComputedStyle(t).fontSize))"""


def paper_rule_misses(d: dict, fonts: list[float]) -> tuple[str, ...]:
    """Which of the paper rules the exported figure ``d`` (from :data:`BOXES_JS`) misses: ``plot`` (the plot areas
    span < 55 % of the height), ``legend`` (> 25 %), ``font`` (a text under 7 pt)."""
    out = []
    if d["plots"] and (max(p["y1"] for p in d["plots"]) - min(p["y0"] for p in d["plots"])) / d["h"] < PLOT_SHARE:
        out.append("plot")
    legend = [t for t in d["texts"] if _kind(t["cls"]) == "legend"]
    if legend and (max(t["y1"] for t in legend) - min(t["y0"] for t in legend)) / d["h"] > LEGEND_SHARE:
        out.append("legend")
    if fonts and min(fonts) < MIN_PT:
        out.append("font")
    return tuple(out)


def export_problems(page, svg_path: Path, whole=()) -> list[str]:
    """Everything wrong with one exported SVG file: the layout rule (:func:`_layout_rules.layout_problems`; ``whole``:
    the figure's index axes, :func:`_layout_rules.whole_axes`) and the paper rules (:func:`paper_rule_misses`, each
    as ``paper rule: <rule>``), read in the chromium ``page``."""
    d = {**boxes(page, svg_path), "whole": set(whole)}
    return list(layout_problems(d)) + [f"paper rule: {m}" for m in paper_rule_misses(d, page.evaluate(FONTS_JS))]


def test_layout_rule_sees_an_overprint():
    """The layout rule on hand-made boxes: a title on a legend entry and on the plot area, an axis title out of the
    canvas and a clipped figure are each reported; two abutting tick labels are not."""
    plot = {"x0": 40, "y0": 40, "x1": 200, "y1": 150}
    box = lambda cls, text, x0, y0, x1, y1: {"cls": cls, "text": text, "x0": x0, "y0": y0, "x1": x1, "y1": y1}  # noqa: E731
    d = {"w": 240.0, "h": 180.0, "plots": [plot], "texts": [
        box("xtick", "10", 50, 152, 60, 160), box("xtick", "20", 60, 152, 70, 160)]}
    assert layout_problems(d) == []
    d["texts"] += [box("gtitle", "Title", 60, 30, 120, 45), box("legendtext", "kept", 100, 32, 130, 40),
                   box("g-ytitle ytitle", "weight", -8, 60, 4, 120)]
    d["clipped"] = ["widget-box 300x400 px cuts the 660x400 px figure by 360 px"]
    bad = layout_problems(d)
    assert any(b.startswith("overlap: title 'Title' and legend 'kept'") for b in bad), bad
    assert "title 'Title' overlaps a plot area" in bad and any(b.startswith("outside the 240x180 canvas: axis title")
                                                                 for b in bad), bad
    assert any(b.startswith("clipped by the page: widget-box") for b in bad), bad


def test_paper_rules_see_a_miss():
    """The rule check on hand-made boxes: a low plot area, a tall legend and a 6 pt text are each seen."""
    d = {"h": 100.0, "plots": [{"x0": 0, "y0": 10, "x1": 50, "y1": 50}],
         "texts": [{"cls": "legendtext", "y0": 55, "y1": 60}, {"cls": "legendtext", "y0": 60, "y1": 90}]}
    assert paper_rule_misses(d, [6.0, 9.0]) == ("plot", "legend", "font")
    d = {"h": 100.0, "plots": [{"x0": 0, "y0": 10, "x1": 50, "y1": 80}], "texts": [{"cls": "legendtext", "y0": 82, "y1": 95}]}
    assert paper_rule_misses(d, [7.0, 9.0]) == ()


@pytest.mark.slow
@pytest.mark.parametrize("width", ["single", "double"])
def test_no_text_overlaps_at_export_width(figures, page, tmp_path, width):
    """No overlap or overflow in any figure, and every paper rule (:func:`paper_rule_misses`) holds."""
    problems, misses = {}, {}
    for name, fig in figures.items():
        ex.export(fig, tmp_path / f"{name}-{width}", width=width, formats=("svg",), csv=False, sidecar=False)
        d = boxes(page, tmp_path / f"{name}-{width}.svg")
        d["whole"] = whole_axes(fig.to_dict()) if hasattr(fig, "to_dict") else set()
        assert len(d["texts"]) >= 3, f"{name}: no text read from the SVG"
        # the table and the HTML token views (every token_attention* and kept_compare* figure) have no plotly plot area
        assert d["plots"] or name == "kv_bytes_table" or name.startswith(("token_attention", "kept_compare")), (
            f"{name}: no plot area read")
        bad = layout_problems(d)
        if bad:
            problems[name] = bad
        miss = paper_rule_misses(d, page.evaluate(FONTS_JS))
        if miss:
            misses[name] = miss
    assert not problems, "\n".join(f"{n} ({width}): " + "; ".join(b[:6]) for n, b in problems.items())
    assert not misses, misses


@pytest.mark.slow
@pytest.mark.parametrize("width", ["single", "double"])
def test_long_capture_pages_at_export_width(page, tmp_path, width):
    """The pages figure of a T = 33k capture (pages and positions binned: long axis titles, ×10⁴ tick labels, a colour
    bar in steps of 0.0005) at a column's width: no overlap or overflow, every paper rule. Its UOR labels, between the
    bottom panels, lay on the left one at one column (the colour bar took more room than estimated)."""
    spans = PromptSpans.synthetic([64] * 510, query_len=16, answer_doc=100)
    cap = Capture.synthetic(spans, L=4, H_Q=6, G=2, seed=0, concentration=2.0)
    pool = HeadPooling()(cap)
    fig = plots.pages(PageSelection(b=16, K=8, s=64).select(pool.a, pool.w, cap.head_group, 64), 1, spans)
    ex.export(fig, tmp_path / "pages", width=width, formats=("svg",), csv=False, sidecar=False)
    bad = export_problems(page, tmp_path / "pages.svg", whole_axes(fig.to_dict()))
    assert not bad, bad


@pytest.mark.slow
def test_kept_title_obeys_the_rules(figures, page, tmp_path):
    """With ``title=True`` the title is drawn (wrapped), above the legend and the plot, inside the canvas."""
    problems = {}
    for name in ("envelope_rows", "shift_steps", "trace_layers", "chunk_priorities"):
        fig = figures[name]
        for width in ("single", "double"):
            ex.export(fig, tmp_path / f"{name}-{width}", width=width, formats=("svg",), csv=False, sidecar=False,
                      title=True)
            d = boxes(page, tmp_path / f"{name}-{width}.svg")
            titles = [b for b in d["texts"] if _kind(b["cls"]) == "title"]
            assert titles, f"{name} ({width}): the kept title is not drawn"
            words = fig.layout.title.text.replace("<br>", " ").split()[:2]
            assert all(w in " ".join(t["text"] for t in titles) for w in words)
            bad = layout_problems(d)
            if bad:
                problems[f"{name} ({width})"] = bad
    assert not problems, "\n".join(f"{n}: " + "; ".join(b[:6]) for n, b in problems.items())


def test_wrap_text_and_drop_title():
    from workbench.show.paper_layout import paper_layout, wrap_text

    w = wrap_text("constraint row a = h·W + u (grouped by head)", 100, 9)
    assert "<br>" in w and all(len(line) * 0.62 * 9 <= 100 or " " not in line for line in w.split("<br>"))
    assert wrap_text("short", 100, 9) == "short"
    d = {"layout": {"title": {"text": "A long title"}, "font": {"size": 9}, "legend": {"orientation": "h", "y": -0.2}}}
    paper_layout(d, 240, 180, preset="single", title=False)
    assert d["layout"]["title"] == {"text": ""}
    assert d["layout"]["margin"]["t"] < 12


@pytest.mark.slow
def test_plain_outputs_are_laid_out(figures, page, tmp_path):
    """A figure shown as a cell's plain output (``workbench.show.outputs``: the notebooks' renderer) is laid out by
    the panels' rules at :data:`OUTPUT_WIDTH`: fixed size, and no overlap, overflow or text on a plot area, for
    every figure function. The control: notebook 02's head weights as plotly draws them without it (its own
    layout at that width), the legend over the title."""
    import plotly.graph_objects as go

    from workbench.show.kaleido_server import render_all
    from workbench.show.outputs import OUTPUT_WIDTH, LaidOutRenderer

    def problems_of(d, tag):
        size = ex.resolve_size(None, d["layout"]["width"], height=d["layout"].get("height") or 450, scale=1.0)
        svg = tmp_path / f"{tag}.svg"
        svg.write_bytes(render_all(d, ("svg",), size)["svg"])
        return layout_problems(boxes(page, svg))

    problems, n = {}, 0
    for name, fig in figures.items():
        if not isinstance(fig, go.Figure):
            continue                                     # the HTML token views are no plotly output
        d = LaidOutRenderer().to_mimebundle(fig.to_dict())["application/vnd.plotly.v1+json"]
        assert d["layout"]["width"] == OUTPUT_WIDTH and d["layout"]["autosize"] is False, name
        assert d["layout"]["meta"]["figure"] == fig.layout.meta["figure"], name
        bad = problems_of(d, name)
        n += 1
        if bad:
            problems[name] = bad
    assert n >= 25 and not problems, "\n".join(f"{k}: " + "; ".join(b[:6]) for k, b in problems.items())
    raw = figures["head_weights"].to_dict()
    raw["layout"].update(width=OUTPUT_WIDTH, autosize=False)
    assert problems_of(raw, "control"), "the control: plotly's own layout of head_weights at this width overprints"


@pytest.mark.slow
def test_index_axes_of_few_layers_get_whole_ticks(page, tmp_path, monkeypatch):
    """The layer and position axes of the heatmaps (``head_heatmap``, ``sink_mass_heatmap``) and the heads panel's
    live figures at L = 2, 3, 4, 5, 8 layers: no tick label between whole numbers, exported at both column widths
    and laid out live at 660 and 420 px (the layout rule's ``whole`` check). The control: without
    ``paper_layout._whole_ticks`` plotly labels the 4-layer axis 0.5, 1.5 … and the rule says so."""
    import plotly.graph_objects as go
    from _all_figures import synthetic_inputs

    from workbench.show import paper_layout as pl
    from workbench.show import widgets as Wd
    from workbench.show.kaleido_server import render_all

    def problems(L: int, tag: str) -> dict:
        sp, cap, params, tr = synthetic_inputs(L=L, H_Q=6, G=2)
        figs = {"head_heatmap": plots.head_heatmap(tr.pooling, "w", model_id=cap.model_id, params=params),
                "sink_mass_heatmap": plots.sink_mass_heatmap(cap)}
        out = {}
        for name, fig in figs.items():
            assert whole_axes(fig.to_dict()) >= {"y"}, (name, whole_axes(fig.to_dict()))  # the layer axis
            for width in ("single", "double"):
                ex.export(fig, tmp_path / f"{tag}{L}-{name}-{width}", width=width, formats=("svg",), csv=False,
                          sidecar=False)
                d = {**boxes(page, tmp_path / f"{tag}{L}-{name}-{width}.svg"), "whole": whole_axes(fig.to_dict())}
                out.update({f"L={L} {name} ({width})": b for b in [layout_problems(d)] if b})
        for room in (0, 420):
            panel = Wd.HeadsPanel(cap)
            if room:
                next(fw for fw in panel.figures.values() if isinstance(fw, Wd.base.FigureWidget))._view_width = room
            for name, fw in panel.figures.items():
                if not isinstance(fw, Wd.base.FigureWidget):
                    continue
                d = go.Figure(fw).to_dict()
                svg = tmp_path / f"{tag}{L}-live{room}-{name}.svg"
                svg.write_bytes(render_all(d, ("svg",), ex.resolve_size(None, d["layout"]["width"],
                                                                     height=d["layout"]["height"], scale=1.0))["svg"])
                bad = layout_problems({**boxes(page, svg), "whole": whole_axes(d)})
                out.update({f"L={L} heads panel {name} @ {room or 660} px": bad} if bad else {})
        return out

    found = {}
    for L in (2, 3, 4, 5, 8):
        found.update(problems(L, "fix"))
    assert not found, "\n".join(f"{k}: " + "; ".join(b[:4]) for k, b in found.items())
    monkeypatch.setattr(pl, "_whole_ticks", lambda *a: None)
    control = problems(4, "control")
    assert any("between whole numbers" in b for bs in control.values() for b in bs), control
