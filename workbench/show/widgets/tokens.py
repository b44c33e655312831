"""The token-text attention panel: the prompt as text shaded by one query row's attention (no model calls)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import ipywidgets as W
import numpy as np

from workbench.analyse.params import EntroPrefillParams
from workbench.show import plots
from workbench.show.widgets.base import SLIDERS, Panel, html_escape
from workbench.show.widgets.sliders import scale_dropdown, scale_value

if TYPE_CHECKING:
    from workbench.capture.data import Capture
    from workbench.show.widgets.state import CaptureState

__all__ = ["TokenPanel"]


class TokenPanel(Panel):
    """The prompt's tokens shaded by attention (:func:`workbench.show.plots.token_attention`).

    Controls: the layer; the source (one query head, a KV group's mean, or the pooled ``μ``); the query row
    (the observers' mean or any captured row: tail, audit, decode steps); the colour scale (auto: linear below
    2,048 tokens, quantile from there on; or linear, log, quantile); exclude the sinks;
    the page (long prompts). **Clicking a token** makes the captured row nearest to it the query row
    (:meth:`click`). ``removed`` strikes tokens through: positions, a selection or trace (removed chunks at
    ``removed_layer``), or an eviction ``GenerationResult`` (evicted positions of ``removed_layer`` /
    ``removed_group``). No model calls.
    """

    title = "Attention over the prompt text"
    TOOLTIP_KEYS = {"page": "page_view"}
    KEEP_NOT = ("query", "page")  # a row index and a page of another prompt mean other tokens

    def __init__(self, capture: Capture | CaptureState, *, layer: int | None = None, removed=None, removed_layer: int | None = None,
                 removed_group: int | None = None, params: EntroPrefillParams | None = None, per_page: int = 384):
        super().__init__()
        self.removed, self.removed_layer, self.removed_group = removed, removed_layer, removed_group
        self.base = params or EntroPrefillParams()
        self.per_page = int(per_page)
        self._layer = layer
        self._setup(self._source(capture))

    follows_capture = True

    def _setup(self, capture: Capture) -> None:
        """Controls for ``capture``; a new capture (:meth:`set_capture`) drops ``removed`` (positions of another
        prompt)."""
        if self._kept is not None:
            self.removed = self.removed_layer = self.removed_group = None
        self.capture = capture
        L = capture.L
        hg = np.asarray(capture.head_group).tolist()
        G = max(hg) + 1
        sources = [(f"head h{h} (g{g})", ("head", h)) for h, g in enumerate(hg)]
        sources += [(f"KV group g{g} (mean)", ("group", g)) for g in range(G)] + [("pooled μ", ("pooled", 0))]
        rows = sorted(range(capture.attn.shape[2]), key=lambda r: (int(capture.row_pos[r]), r))
        self.row_options = [("observers (mean)", "observers")] + [
            (f"{capture.row_kind[r]} @ {int(capture.row_pos[r])}", r) for r in rows]
        n_pages = max(1, math.ceil(capture.T / self.per_page))
        self.controls = {
            "layer": SLIDERS["layer"].make(self._start_layer(L, self._layer), lo=0, hi=L - 1),
            "source": W.Dropdown(options=sources, value=("head", 0), description="source"),
            "query": W.Dropdown(options=self.row_options, value="observers", description="query row"),
            "scale": scale_dropdown(),
            "exclude_sinks": W.Checkbox(value=False, description="exclude sinks"),
            "page": W.IntSlider(value=0, min=0, max=n_pages - 1, description="page",
                                layout=W.Layout(width="320px", display=None if n_pages > 1 else "none")),
        }
        self._finish()
        self._hook()

    def _hook(self) -> None:
        self.figures["tokens"].on_token_click(self.click)

    def click(self, position: int) -> int:
        """Make the captured row nearest to prompt ``position`` the query row (what clicking a token does);
        returns its row index."""
        pos = np.asarray(self.capture.row_pos)
        r = int(np.argmin(np.abs(pos - int(position)) * 2 + (pos > int(position))))  # ties: the earlier row
        self.controls["query"].value = r
        return r

    def analysis(self):
        c = self.controls
        kind, i = c["source"].value
        pooling = None
        if kind == "pooled":
            pooling = self.pooling_cache(self.base.pooling())
        return dict(layer=int(c["layer"].value), query=c["query"].value, head=i if kind == "head" else None,
                    group=i if kind == "group" else None, pooling=pooling)

    def compute(self):
        a = self._analyse()
        c = self.controls
        fig = plots.token_attention.draft(self.capture, **a, removed=self.removed, removed_layer=self.removed_layer,
                                    removed_group=self.removed_group, scale=scale_value(c["scale"]),
                                    exclude_sinks=bool(c["exclude_sinks"].value), page=int(c["page"].value),
                                    per_page=self.per_page)
        m = fig.meta
        st = (f"query: {html_escape(c['query'].label)}; click a token to make the nearest captured row the query"
              + (f"; {len(m['removed'])} tokens struck through" if m["removed"] else ""))
        return {"tokens": fig}, st

