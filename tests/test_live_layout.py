"""The live figures of the panels follow the same layout rules as the paper files (``Panel`` applies
``paper_layout`` at the live width on every update): rendered at their own size, no two text boxes overlap,
none leaves the figure, and no title, legend or axis title sits on a plot area, at the start and after the
sliders that change the content (more groups, a longer axis, more pages) moved to their ends; at the full live
width (``FIGURE_WIDTH``, 660 px: a wide window) and at the room of a 1000 px JupyterLab window with its file
browser open (568 px, reported by the figures' views: ``FigureWidget._view_width``); and the pages figure of a
T = 33k capture at every live width from ``MIN_FIGURE_WIDTH`` (also the width under plotly's stock widget) to
``FIGURE_WIDTH``, 40 px apart.

The figures are read as the widgets hold them and rendered to SVG by kaleido's Chromium; the boxes are read
in headless chromium (Playwright), as in ``tests/test_figure_layout.py``; the rule is ``tests/_layout_rules.py``.

The same rule is checked in JupyterLab itself by ``tests/test_browser.py`` (``_layout_sweep``): every notebook
00–11 after Run All and at both ends of every slider, and a synthetic T = 32k capture in its heads, pages and
token panels (``test_long_capture_layout_in_browser``), in a 1400 px and a 1000 px window, the figures' cuts by
the page (output area, widget boxes, notebook) included."""
from __future__ import annotations

import plotly.graph_objects as go
import pytest
from _all_figures import synthetic_inputs
from _layout_rules import layout_problems, whole_axes
from test_figure_layout import boxes
from test_figure_layout import page as page  # noqa: F401 - the chromium page fixture

from workbench.capture.data import Capture
from workbench.run.spans import PromptSpans
from workbench.show import export as ex
from workbench.show import widgets as Wd
from workbench.show.kaleido_server import render_all
from workbench.show.widgets.base import FIGURE_WIDTH, MIN_FIGURE_WIDTH

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ex.browser_path() is None, reason="no chromium")]

#: (panel, the moves that change the content: control → the values to visit)
CASES = {
    # d_max at its top: every layer stable, the streak grows with the layers (its axis stacked 30 labels)
    "audit": (lambda c, p: Wd.AuditPanel(c, p, certify=True), {"target": ("hi", "lo"), "streak": ("hi",),
                                                               "d_max": ("hi",)}),
    "shift": (lambda c, p: Wd.ShiftPanel(c, k=8), {"k": ("hi",), "W": ("lo",), "level": ("head",)}),
    "pages": (lambda c, p: Wd.PagesPanel(c, p, s=8), {"page": ("lo", "hi"), "K": ("hi",), "layer": ("lo",)}),
    "priority": (lambda c, p: Wd.PriorityPanel(c, p), {"target": ("hi",), "layer": ("lo", "hi")}),
    "heads": (lambda c, p: Wd.HeadsPanel(c), {"quantity": ("H",), "layer": ("hi",)}),
    "counterexample": (lambda c, p: Wd.CounterexamplePanel(), {"eps": (1e-9, 10 ** -0.5), "gamma": ("lo", "hi")}),
}


@pytest.fixture(scope="module")
def syn():
    return synthetic_inputs(L=30, H_Q=9, G=3)   # the default model's shape: 30 layers, 9 heads in 3 groups


def _problems(panel, pg, tmp_path, tag) -> dict:
    out = {}
    for name, fw in panel.figures.items():
        if isinstance(fw, Wd.TokenWidget):
            continue
        d = go.Figure(fw).to_dict()
        lay = d["layout"]
        assert lay["width"] == panel.live_width and lay.get("autosize") is False
        size = ex.resolve_size(None, lay["width"], height=lay["height"], scale=1.0)
        svg = tmp_path / f"{tag}-{name}.svg"
        svg.write_bytes(render_all(d, ("svg",), size)["svg"])
        bad = layout_problems({**boxes(pg, svg), "whole": whole_axes(d)})
        if bad:
            out[f"{tag}/{name}"] = bad
    return out


#: the room a 1000 px JupyterLab window gives a panel's figures with the file browser open (px)
NARROW_ROOM = 568


@pytest.mark.parametrize("room", [0, NARROW_ROOM], ids=["full", "narrow"])
@pytest.mark.parametrize("case", list(CASES))
def test_live_figures_do_not_overprint(syn, page, tmp_path, case, room):  # noqa: F811
    sp, cap, params, tr = syn
    make, moves = CASES[case]
    panel = make(cap, params)
    if room:      # what a figure's view reports in a narrow window: the panel lays its figures out there
        next(fw for fw in panel.figures.values() if isinstance(fw, Wd.base.FigureWidget))._view_width = room
        assert panel.live_width == room
    problems = _sweep(panel, moves, page, tmp_path)
    assert not problems, "\n".join(f"{case} {k}: " + "; ".join(b[:5]) for k, b in problems.items())


def _sweep(panel, moves: dict, pg, tmp_path) -> dict:
    """The layout problems of ``panel``'s figures at the start and after each move (control → the values to visit:
    ``"hi"``, ``"lo"`` or a value; the control is set back after its values), by state and figure."""
    problems = _problems(panel, pg, tmp_path, "start")
    for name, values in moves.items():
        w = panel.controls[name]
        start = w.value
        for v in values:
            v = {"hi": getattr(w, "max", None), "lo": getattr(w, "min", None)}.get(v, v)
            panel.set(**{name: v})
            assert panel.error is None, panel.error
            problems.update(_problems(panel, pg, tmp_path, f"{name}={v}"))
        panel.set(**{name: start})
    return problems


@pytest.fixture(scope="module")
def long_capture():
    """The T = 33k synthetic capture of the browser test's long notebook (``test_browser.LONG_CELLS``)."""
    spans = PromptSpans.synthetic([64] * 510, query_len=16, answer_doc=100)
    return Capture.synthetic(spans, L=4, H_Q=6, G=2, seed=0, concentration=2.0)


#: the live widths a panel can lay its figures out at (``widgets.base.live_width``: the room the page gives, within
#: MIN_FIGURE_WIDTH and FIGURE_WIDTH; MIN_FIGURE_WIDTH also under plotly's stock widget, the public fallback), 40 px
#: apart: the fixed-px labels (title, legend, tick labels, axis titles) take the most of the narrowest
LIVE_WIDTHS = sorted({*range(MIN_FIGURE_WIDTH, FIGURE_WIDTH, 40), FIGURE_WIDTH})


@pytest.mark.parametrize("width", LIVE_WIDTHS)
def test_long_capture_pages_at_every_live_width(long_capture, page, tmp_path, width):  # noqa: F811
    """The pages figure of a T = 33k capture (pages and positions binned: the binning notes in the axis titles,
    ×10⁴ tick labels) at every live width, at the start and at the ends of the sliders that change its labels:
    no text overprints. At 420 px its binning note wrapped the short y axis' title to seven lines, the plots moved
    right, the x tick labels turned and ran onto the panels below."""
    panel = Wd.PagesPanel(long_capture, layer=1)
    next(fw for fw in panel.figures.values() if isinstance(fw, Wd.base.FigureWidget))._view_width = width
    assert panel.live_width == width
    problems = _sweep(panel, {"page": ("lo", "hi"), "layer": ("hi",), "tau": (1e-3,)}, page, tmp_path)
    assert not problems, "\n".join(f"{width} px {k}: " + "; ".join(b[:5]) for k, b in problems.items())
