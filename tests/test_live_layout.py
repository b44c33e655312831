"""The live figures of the panels follow the same layout rules as the paper files (``Panel`` applies
``paper_layout`` at the live width on every update): rendered at their own size, no two text boxes overlap,
none leaves the figure, and no title, legend or axis title sits on a plot area, at the start and after the
sliders that change the content (more groups, a longer axis, more pages) moved to their ends.

The figures are read as the widgets hold them and rendered to SVG by kaleido's Chromium; the boxes are read
in headless chromium (Playwright), as in ``tests/test_figure_layout.py``."""
from __future__ import annotations

import plotly.graph_objects as go
import pytest
from _all_figures import synthetic_inputs
from test_figure_layout import boxes, layout_problems
from test_figure_layout import page as page  # noqa: F401 - the chromium page fixture

from workbench.show import export as ex
from workbench.show import widgets as Wd
from workbench.show.kaleido_server import render_all

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ex.browser_path() is None, reason="no chromium")]

#: (panel, the moves that change the content: control → the values to visit)
CASES = {
    "audit": (lambda c, p: Wd.AuditPanel(c, p, certify=True), {"target": ("hi", "lo"), "streak": ("hi",)}),
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
        assert lay["width"] == Wd.base.FIGURE_WIDTH and lay.get("autosize") is False
        size = ex.resolve_size(None, lay["width"], height=lay["height"], scale=1.0)
        svg = tmp_path / f"{tag}-{name}.svg"
        svg.write_bytes(render_all(d, ("svg",), size)["svg"])
        bad = layout_problems(boxes(pg, svg))
        if bad:
            out[f"{tag}/{name}"] = bad
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_live_figures_do_not_overprint(syn, page, tmp_path, case):  # noqa: F811
    sp, cap, params, tr = syn
    make, moves = CASES[case]
    panel = make(cap, params)
    problems = _problems(panel, page, tmp_path, "start")
    for name, values in moves.items():
        w = panel.controls[name]
        start = w.value
        for v in values:
            v = {"hi": getattr(w, "max", None), "lo": getattr(w, "min", None)}.get(v, v)
            panel.set(**{name: v})
            assert panel.error is None, panel.error
            problems.update(_problems(panel, page, tmp_path, f"{name}={v}"))
        panel.set(**{name: start})
    assert not problems, "\n".join(f"{case} {k}: " + "; ".join(b[:5]) for k, b in problems.items())
