"""The token-text attention panel: the prompt as text shaded by one query row's attention (no model calls)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import ipywidgets as W
import numpy as np

from workbench.analyse.params import EntroPrefillParams
from workbench.capture import RowSet, run_capture
from workbench.capture.hooks import model_identity
from workbench.checks import check_str
from workbench.constraints import index_into
from workbench.run.models import unwrap_model
from workbench.show import plots
from workbench.show.plots.common import answer_chunk
from workbench.show.widgets.base import SLIDERS, Panel, html_escape
from workbench.show.widgets.sliders import scale_dropdown, scale_value

if TYPE_CHECKING:
    from workbench.capture.data import Capture
    from workbench.show.widgets.state import CaptureState

__all__ = ["TokenPanel"]


class TokenPanel(Panel):
    """The prompt's tokens shaded by attention (:func:`workbench.show.plots.token_attention`).

    Controls: the layer; the source (one query head, a KV group's mean, or the pooled ``μ``); the query row
    (the observers' mean or any captured row: tail, audit, decode steps); the colour scale (linear, log or
    quantile; it starts at linear below 2,048 tokens, quantile from there on); exclude the sinks; the page (long
    prompts). **Clicking a token** makes that token's own row the query row (:meth:`click`): captured on demand
    (one prefill with that row alone) with ``model`` (or the state's model) when the capture does not hold it;
    without the model that made the capture, the nearest captured row, and the status says so. Long prompts: the
    navigation row jumps to the page of the answer passage, of a chunk or of the next search hit
    (:meth:`jump_to_answer`, :meth:`jump_to_chunk`, :meth:`jump_to_text`). ``removed`` strikes tokens through:
    positions, a selection or trace (removed chunks at ``removed_layer``), or an eviction ``GenerationResult``
    (evicted positions of ``removed_layer`` / ``removed_group``). No model calls but a click's.
    """

    title = "Attention over the prompt text"
    TOOLTIP_KEYS = {"page": "page_view"}
    # a row index and a page of another prompt mean other tokens; the colour scale starts at the new length's default
    KEEP_NOT = ("query", "page", "scale")

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
        self._last_text, self._last_hit = None, -1  # the search hit last jumped to (positions of this capture)
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
            "scale": scale_dropdown(capture.T),
            "exclude_sinks": W.Checkbox(value=False, description="exclude sinks"),
            "page": W.IntSlider(value=0, min=0, max=n_pages - 1, description="page",
                                layout=W.Layout(width="320px", display=None if n_pages > 1 else "none")),
        }
        self._finish()
        self._hook()

    def _hook(self) -> None:
        self.figures["tokens"].on_token_click(self.click)

    # ----- navigation: long prompts have dozens of pages -----
    def control_rows(self) -> list[W.Widget]:
        """The controls, then the navigation row: jump to the answer, to a chunk, to a search hit."""
        k = self.capture.spans.k
        self.nav = {
            "answer": W.Button(description="→ answer", tooltip="show the page holding the answer passage's first token",
                               disabled=answer_chunk(self.capture.spans) is None, layout=W.Layout(width="auto")),
            "chunk": W.BoundedIntText(value=0, min=0, max=max(0, k - 1), description="chunk",
                                      disabled=k == 0, layout=W.Layout(width="150px")),
            "to_chunk": W.Button(description="→ chunk", tooltip="show the page where this candidate chunk starts",
                                 disabled=k == 0, layout=W.Layout(width="auto")),
            "text": W.Text(value="", placeholder="search the prompt text", description="find",
                           layout=W.Layout(width="260px")),
            "find": W.Button(description="→ next hit", tooltip="show the page of the next token where the text "
                             "occurs (case-insensitive; wraps around)", layout=W.Layout(width="auto")),
            "note": W.HTML(""),
        }
        n = self.nav
        n["answer"].on_click(lambda _: self._nav(self.jump_to_answer))
        n["to_chunk"].on_click(lambda _: self._nav(lambda: self.jump_to_chunk(int(n["chunk"].value))))
        n["find"].on_click(lambda _: self._nav(lambda: self.jump_to_text(n["text"].value)))
        row = W.HBox([n["answer"], n["chunk"], n["to_chunk"], n["text"], n["find"], n["note"]],
                     layout=W.Layout(flex_flow="row wrap"))
        return [*super().control_rows(), row]

    def _nav(self, jump) -> None:
        """Run a jump from a button: the note says where it went, or why it could not."""
        try:
            pos = jump()
        except ValueError as e:
            self.nav["note"].value = f"<span style='color:#D55E00'>{html_escape(str(e))}</span>"
            return
        self.nav["note"].value = f"position {pos}, page {self.page_of(pos) + 1}"

    def page_of(self, position: int) -> int:
        """The page (0-based) that shows prompt ``position``."""
        index_into(self.capture.T).check("position", position)
        return int(position) // self.per_page

    def jump_to(self, position: int) -> int:
        """Show the page holding prompt ``position``; returns the position."""
        self.controls["page"].value = self.page_of(position)
        return int(position)

    def jump_to_answer(self) -> int:
        """Show the page where the answer passage starts; returns its first position. A prompt without a marked
        answer passage is refused."""
        sp = self.capture.spans
        a = answer_chunk(sp)
        if a is None:
            raise ValueError("answer: this prompt has no marked answer passage")
        return self.jump_to(int(sp.chunks[a][0]))

    def jump_to_chunk(self, chunk: int) -> int:
        """Show the page where candidate chunk ``chunk`` starts; returns its first position."""
        sp = self.capture.spans
        if sp.k == 0:
            raise ValueError("chunk: this prompt has no candidate chunks")
        index_into(sp.k).check("chunk", chunk)
        return self.jump_to(int(sp.chunks[chunk][0]))

    def search(self, text: str) -> list[int]:
        """Every prompt position whose token starts an occurrence of ``text`` in the prompt's text (the tokens
        joined; case-insensitive; a hit may span several tokens)."""
        check_str("text", text)
        toks = list(self.capture.spans.tokens)
        if len(toks) < self.capture.T:
            raise ValueError("text: this capture has no token strings to search")
        toks = toks[:self.capture.T]
        starts = np.cumsum([0] + [len(t) for t in toks])
        full, needle = "".join(toks).lower(), text.lower()
        hits, i = [], full.find(needle)
        while i >= 0:
            hits.append(int(np.searchsorted(starts, i, side="right") - 1))
            i = full.find(needle, i + 1)
        return sorted(set(hits))

    def jump_to_text(self, text: str) -> int:
        """Show the page of the next hit of ``text`` (:meth:`search`) after the last one jumped to for the same text
        (the first hit at first; wraps around); returns its position. No hit is refused."""
        hits = self.search(text)
        if not hits:
            raise ValueError(f"text: {text!r} does not occur in the prompt")
        last = self._last_hit if self._last_text == text else -1
        pos = next((h for h in hits if h > last), hits[0])
        self._last_text, self._last_hit = text, pos
        return self.jump_to(pos)

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
                                    removed_group=self.removed_group, scale=scale_value(c["scale"]),
                                    exclude_sinks=bool(c["exclude_sinks"].value), page=int(c["page"].value),
                                    per_page=self.per_page)
        m = fig.meta
        st = (f"query: {html_escape(c['query'].label)}; click a token to make its own row the query"
              + (f"; {html_escape(self.click_note)}" if self.click_note else "")
              + (f"; {len(m['removed'])} tokens struck through" if m["removed"] else ""))
        return {"tokens": fig}, st

