"""The token-text attention panel: the prompt as text shaded by one query row's attention (no model calls)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import ipywidgets as W
import numpy as np

from workbench.analyse.params import EntroPrefillParams
from workbench.capture import RowSet, run_capture
from workbench.capture.hooks import model_identity
from workbench.run.models import unwrap_model
from workbench.show import plots
from workbench.show.widgets.base import SLIDERS, Panel, html_escape

if TYPE_CHECKING:
    from workbench.capture.data import Capture
    from workbench.show.widgets.state import CaptureState

__all__ = ["TokenPanel"]


class TokenPanel(Panel):
    """The prompt's tokens shaded by attention (:func:`workbench.show.plots.token_attention`).

    Controls: the layer; the source (one query head, a KV group's mean, or the pooled ``μ``); the query row
    (the observers' mean or any captured row: tail, audit, decode steps); log shading; exclude the sinks;
    the page (long prompts). **Clicking a token** makes that token's own row the query row (:meth:`click`):
    captured on demand (one prefill with that row alone) with ``model`` (or the state's model) when the capture
    does not hold it; without the model that made the capture, the nearest captured row, and the status says so.
    ``removed`` strikes tokens through: positions, a selection or trace (removed chunks at ``removed_layer``), or
    an eviction ``GenerationResult`` (evicted positions of ``removed_layer`` / ``removed_group``). No model calls
    but a click's.
    """

    title = "Attention over the prompt text"
    TOOLTIP_KEYS = {"page": "page_view"}
    KEEP_NOT = ("query", "page")  # a row index and a page of another prompt mean other tokens

    def __init__(self, capture: Capture | CaptureState, *, layer: int | None = None, removed=None, removed_layer: int | None = None,
                 removed_group: int | None = None, params: EntroPrefillParams | None = None, per_page: int = 384,
                 model=None):
        super().__init__()
        self.model = model
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
        self.on_demand: dict = {}  # position → the capture of that token's row alone (a click's)
        self.click_note = ""
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
            "log": W.Checkbox(value=False, description="log scale"),
            "exclude_sinks": W.Checkbox(value=False, description="exclude sinks"),
            "page": W.IntSlider(value=0, min=0, max=n_pages - 1, description="page",
                                layout=W.Layout(width="320px", display=None if n_pages > 1 else "none")),
        }
        self._finish()
        self._hook()

    def _hook(self) -> None:
        self.figures["tokens"].on_token_click(self.click)

    def row_model(self):
        """The model that made the capture (the panel's, else its state's), or ``None`` with the reason in
        :attr:`click_note`: a row captured by another model would be another model's attention."""
        model = self.model if self.model is not None else getattr(self.state, "model", None)
        if model is None:
            self.click_note = "no model in this panel to capture a token's own row"
            return None
        net, _, mid = unwrap_model(model)
        if model_identity(net, mid) != self.capture.model_id:
            self.click_note = (f"the panel's model ({model_identity(net, mid)}) did not make this capture "
                               f"({self.capture.model_id}): its rows are not captured on demand")
            return None
        return model

    def click(self, position: int):
        """Make prompt ``position``'s own row the query row (what clicking a token does): its captured row, or
        the row captured on demand (one prefill, cached per position), or, with no model that made the capture,
        the nearest captured row (the status says so). Returns the query value set."""
        T = self.capture.T
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or not 0 <= position < T:
            raise ValueError(f"position: must be a prompt position in [0, {T - 1}], got {position!r}")
        p = int(position)
        pos = np.asarray(self.capture.row_pos)
        self.click_note = ""
        own = np.flatnonzero(pos == p)
        if own.size:
            value = int(own[0])
        elif (model := self.row_model()) is None:
            value = int(np.argmin(np.abs(pos - p) * 2 + (pos > p)))  # ties: the earlier row
            self.click_note = f"token {p} has no captured row ({self.click_note}): the nearest captured row is shown"
        else:
            value = ("token", p)
            if p not in self.on_demand:
                rows = RowSet(observers=False, audit=None, tail=0, custom=(p,), n_decode=0)
                self.on_demand[p] = run_capture(model, self.capture.spans, rows, progress=False)
                q = self.controls["query"]
                q.options = [*q.options, (f"token @ {p} (captured on demand)", value)]
        if self.controls["query"].value == value:
            self.update()  # the note changed
        else:
            self.controls["query"].value = value
        return value

    def analysis(self):
        c = self.controls
        kind, i = c["source"].value
        query, cap = c["query"].value, self.capture
        if isinstance(query, tuple):  # a token's own row, captured on demand: row 0 of its capture
            query, cap = 0, self.on_demand[query[1]]
        pooling = None
        if kind == "pooled":
            pooling = self.pooling_cache(self.base.pooling()) if cap is self.capture else self.base.pooling()(cap)
        return dict(capture=cap, layer=int(c["layer"].value), query=query, head=i if kind == "head" else None,
                    group=i if kind == "group" else None, pooling=pooling)

    def compute(self):
        a = self._analyse()
        c = self.controls
        fig = plots.token_attention.draft(**a, removed=self.removed, removed_layer=self.removed_layer,
                                    removed_group=self.removed_group, log=bool(c["log"].value),
                                    exclude_sinks=bool(c["exclude_sinks"].value), page=int(c["page"].value),
                                    per_page=self.per_page)
        m = fig.meta
        st = (f"query: {html_escape(c['query'].label)}; click a token to make its own row the query"
              + (f"; {html_escape(self.click_note)}" if self.click_note else "")
              + (f"; {len(m['removed'])} tokens struck through" if m["removed"] else ""))
        return {"tokens": fig}, st

