"""A workbench figure shown as a cell's plain output: laid out by the same rules as the panels and the paper files.

A figure left as the last expression of a cell (or passed to ``fig.show()``) is drawn by plotly's renderer, which
sizes it to the output area (``autosize``) after its layout was decided: the title, the legend and the axis titles
are placed for no particular width, and a legend that needs two rows at the output's width ran over the title
(notebook 02's head weights). The ``"workbench"`` renderer registered here lays a workbench figure (one
with ``meta.figure``) out first with :func:`workbench.show.widgets.base.live_layout` at :data:`OUTPUT_WIDTH` px (or
at the figure's own ``width`` when it has one), ``autosize`` off, then hands it to plotly's mimetype renderer
(``application/vnd.plotly.v1+json``, what JupyterLab draws). Other figures pass unchanged.

:func:`use_laid_out_outputs` makes it plotly's default renderer (the notebooks' ``lab_setup`` calls it). Nothing
is changed at import.
"""
from __future__ import annotations

import copy

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.base_renderers import PlotlyRenderer

from workbench.show.widgets.base import live_layout

__all__ = ["OUTPUT_WIDTH", "LaidOutRenderer", "use_laid_out_outputs"]

#: the width (px) a plain figure output is laid out at: it fits the room of a 1000 px JupyterLab window with the
#: file browser open (568 px), so the same figure is neither cut nor re-flowed in a wider one
OUTPUT_WIDTH = 560


class LaidOutRenderer(PlotlyRenderer):
    """plotly's mimetype renderer, with a workbench figure laid out for the screen first (module docstring)."""

    def to_mimebundle(self, fig_dict):
        lay = fig_dict.get("layout") or {}
        meta = lay.get("meta")
        if isinstance(meta, dict) and meta.get("figure"):
            width = lay.get("width") if isinstance(lay.get("width"), (int, float)) and lay["width"] > 0 else OUTPUT_WIDTH
            d = live_layout(go.Figure(copy.deepcopy(fig_dict), skip_invalid=False), width=int(width))
            fig_dict = {**fig_dict, "data": d.traces, "layout": d.layout}
        return super().to_mimebundle(fig_dict)


def use_laid_out_outputs() -> str:
    """Register the ``"workbench"`` renderer and make it plotly's default; returns the previous default."""
    before = pio.renderers.default
    pio.renderers["workbench"] = LaidOutRenderer()
    pio.renderers.default = "workbench"
    return before
