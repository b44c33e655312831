"""The ``"workbench"`` plotly renderer (``workbench.show.outputs``) without a browser: registered through
plotly's public renderer registry, a workbench figure laid out at the output width, any other figure unchanged."""
from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

from workbench.show.outputs import OUTPUT_WIDTH, LaidOutRenderer, use_laid_out_outputs

MIME = "application/vnd.plotly.v1+json"


def test_registered_as_the_default_and_restorable():
    before = pio.renderers.default
    try:
        assert use_laid_out_outputs() == before
        assert pio.renderers.default == "workbench" and isinstance(pio.renderers["workbench"], LaidOutRenderer)
    finally:
        pio.renderers.default = before


def test_workbench_figures_are_laid_out_and_others_pass():
    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[1, 3, 2], name="a"),
                    layout=dict(title="t", meta={"figure": "test"}))
    d = LaidOutRenderer().to_mimebundle(fig.to_dict())[MIME]
    assert d["layout"]["width"] == OUTPUT_WIDTH and d["layout"]["autosize"] is False
    assert list(d["data"][0]["y"]) == [1, 3, 2]
    plain = go.Figure(go.Bar(x=[1, 2], y=[3, 4])).to_dict()
    out = LaidOutRenderer().to_mimebundle(plain)[MIME]
    assert "width" not in out["layout"] and list(out["data"][0]["y"]) == [3, 4]
