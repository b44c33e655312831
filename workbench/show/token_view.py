"""The token view as HTML, in the CircuitsVis manner: the prompt's tokens as spans in flowing text.

A :class:`TokenView` holds what one page of the view draws (the token strings, their positions, values,
chunks and marks) and writes it as HTML (:meth:`TokenView.html`): every token is one ``<span class="tk">``
whose text is the token string itself (spaces, tabs and newlines kept by ``white-space: pre-wrap``), its
background the palette's colour scale at the token's value, its ``title`` the token, position, value and
chunk. Removed or evicted tokens are struck through and greyed, the first token of every candidate chunk
has a black bar on its left, the answer passage is underlined in the answer colour, the query row's own
token is boxed; a key under the text gives the colour scale and the marks. A *categorical* view
(``category`` given, e.g. the compare mode's kept-by-A-only / B-only / both / neither) fills every token with
its category's colour instead and its key lists the categories with their counts. Nothing is clipped: the text
wraps at the container's width. The same HTML is shown by the panel's widget and printed by headless
Chromium for the paper files (:mod:`workbench.show.html_export`).
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pandas as pd

from workbench.show.theme import ANSWER, FONT

__all__ = ["TokenView", "TOKEN_SCALE", "shade_colour", "PRINT_FONT_PT"]

TOKEN_SCALE = [[0.0, "#ffffff"], [0.5, "#9ecae1"], [1.0, "#3182bd"]]  # white → blue: black text stays legible
STRUCK = "#6b6b6b"  # removed / evicted text (grey, but ≥ 4.5:1 on white)
#: text and key font sizes (pt) of the paper presets; the key is the smallest text, ≥ 7 pt
PRINT_FONT_PT = {"single": (8.0, 7.0), "double": (9.0, 7.5)}
SCREEN_FONT_PX = (13.0, 11.0)


def _hex(c: str) -> np.ndarray:
    c = c.lstrip("#")
    return np.array([int(c[i:i + 2], 16) for i in (0, 2, 4)], dtype=np.float64)


def shade_colour(t) -> list[str]:
    """Colours (``#rrggbb``) of positions ``t`` in [0, 1] on :data:`TOKEN_SCALE` (piecewise linear in RGB)."""
    t = np.clip(np.nan_to_num(np.asarray(t, dtype=np.float64), nan=0.0), 0.0, 1.0)
    stops = np.array([s for s, _ in TOKEN_SCALE])
    rgb = np.stack([_hex(c) for _, c in TOKEN_SCALE])
    out = np.stack([np.interp(t, stops, rgb[:, j]) for j in range(3)], axis=-1)
    return ["#%02x%02x%02x" % tuple(int(round(v)) for v in row) for row in out]


_CSS = """
.wb-tokens {{ font-family: {font}; color: #111; box-sizing: border-box; }}
.wb-tokens .wb-title {{ font-size: {title}; font-weight: bold; margin: 0 0 0.35em 0; }}
.wb-tokens .wb-text {{ font-size: {text}; line-height: 1.65; white-space: pre-wrap; overflow-wrap: anywhere;
  word-break: normal; margin: 0; }}
.wb-tokens .tk {{ border-radius: 0; padding: 0.08em 0; }}
.wb-tokens .tk.cs {{ border-left: 0.13em solid #000; }}
.wb-tokens .tk.ans {{ border-bottom: 0.14em solid {answer}; }}
.wb-tokens .tk.rm {{ text-decoration: line-through; text-decoration-thickness: 0.08em; color: {struck}; }}
.wb-tokens .tk.ex {{ color: {struck}; }}
.wb-tokens .tk.q {{ outline: 0.12em solid #000; outline-offset: -0.02em; }}
.wb-tokens .tk.nl::before {{ content: "\\21B5"; color: #888; }}
.wb-tokens .wb-key {{ font-size: {key}; line-height: 1.5; margin-top: 0.5em; white-space: normal; }}
.wb-tokens .wb-key .sw {{ display: inline-block; width: 1.1em; height: 0.9em; vertical-align: -0.1em; }}
.wb-tokens .wb-key .kx {{ margin-left: 0.9em; white-space: nowrap; }}
.wb-tokens .tk:hover {{ outline: 0.12em solid #D55E00; cursor: pointer; }}
"""


def _css(text: str, key: str, title: str) -> str:
    return _CSS.format(font=FONT, text=text, key=key, title=title, answer=ANSWER, struck=STRUCK)


@dataclass
class TokenView:
    """One page of the token view: the data of every token drawn and its marks (see the module docstring).

    ``tokens`` are the token strings; ``positions`` their prompt positions; ``values`` the attention shown in
    the hover; ``shade`` what colours them (``values`` or their ``log10``), mapped from ``[cmin, cmax]`` onto
    :data:`TOKEN_SCALE`; ``chunk`` the candidate chunk (−1: protected); ``removed``, ``chunk_start``,
    ``answer``, ``excluded`` (sinks left unshaded) are per token; ``query_pos`` the query row's position.
    ``meta`` is the figure's record (as a plotly figure's ``layout.meta``), ``title`` its title. ``scale`` names
    the colour scale (``linear``, ``log``, ``quantile``: :mod:`workbench.show.colour_scale`; default from
    ``log``), ``scale_ticks`` the values the key names at its quantiles (``(quantile, text)`` pairs).

    A categorical view gives ``category`` (one name per token) and ``categories`` (``(name, colour,
    description)`` in key order, every name used listed; a fourth element ``True``/``False`` says whether the key
    strikes the category through, by default when all its tokens are ``removed``): the fill is the category's colour, the hover and the
    key say the description, and ``to_frame`` has a ``category`` column. ``columns`` adds per-token columns to
    :meth:`to_frame` (the CSV sidecar).
    """

    tokens: list[str]
    positions: list[int]
    values: np.ndarray
    shade: np.ndarray
    chunk: list[int]
    removed: list[bool]
    chunk_start: list[bool]
    answer: list[bool]
    excluded: list[bool]
    query_pos: int | None
    cmin: float
    cmax: float
    log: bool
    title: str
    meta: dict = field(default_factory=dict)
    category: list[str] | None = None
    categories: tuple = ()
    columns: dict = field(default_factory=dict)
    scale: str = ""
    scale_ticks: tuple = ()

    def __post_init__(self):
        if not self.scale:
            self.scale = "log" if self.log else "linear"
        n = len(self.tokens)
        for name in ("positions", "values", "shade", "chunk", "removed", "chunk_start", "answer", "excluded"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name}: must have one entry per token ({n}), got {len(getattr(self, name))}")
        for name, col in self.columns.items():
            if len(col) != n:
                raise ValueError(f"columns: {name!r} must have one entry per token ({n}), got {len(col)}")
        if self.category is not None:
            if len(self.category) != n:
                raise ValueError(f"category: must have one entry per token ({n}), got {len(self.category)}")
            missing = sorted(set(self.category) - {c[0] for c in self.categories})
            if missing:
                raise ValueError(f"categories: must list every category used, missing {missing}")

    # plotly-figure look-alikes, so that code reading ``fig.layout.meta`` / its title reads a view too
    @property
    def layout(self) -> SimpleNamespace:
        return SimpleNamespace(meta=self.meta, title=SimpleNamespace(text=self.title))

    @property
    def colours(self) -> list[str]:
        """The background colour of every token (excluded sinks: white; a categorical view: its category's)."""
        if self.category is not None:
            fill = {c[0]: c[1] for c in self.categories}
            return [fill[c] for c in self.category]
        span = self.cmax - self.cmin
        t = (np.asarray(self.shade, dtype=np.float64) - self.cmin) / (span if span > 0 else 1.0)
        cols = shade_colour(t)
        return ["#ffffff" if ex else c for c, ex in zip(cols, self.excluded)]

    def label(self, i: int) -> str:
        """The hover text of token ``i``: the token, its position, value and chunk."""
        ch = self.chunk[i]
        what = (dict((c[0], c[2]) for c in self.categories)[self.category[i]] if self.category is not None
                else f"A = {float(self.values[i]):.4g}")
        return (f"{self.tokens[i]!r} · position {self.positions[i]} · {what} · "
                + (f"chunk {ch}" if ch >= 0 else "protected")
                + (" · removed" if self.removed[i] else "") + (" · query" if self.positions[i] == self.query_pos
                                                               else ""))

    # ----- HTML -----
    def spans_html(self) -> str:
        """The tokens as ``<span class="tk">`` elements (their text is exactly the token strings)."""
        out = []
        for i, (tok, col) in enumerate(zip(self.tokens, self.colours)):
            cls = ["tk"]
            if self.chunk_start[i]:
                cls.append("cs")
            if self.answer[i]:
                cls.append("ans")
            if self.removed[i]:
                cls.append("rm")
            if self.excluded[i]:
                cls.append("ex")
            if self.positions[i] == self.query_pos:
                cls.append("q")
            if tok.endswith("\n"):
                cls.append("nl")
            out.append(f'<span class="{" ".join(cls)}" data-i="{i}" data-pos="{self.positions[i]}" '
                       f'style="background-color:{col}" title="{html.escape(self.label(i), quote=True)}">'
                       f"{html.escape(tok, quote=False)}</span>")
        return "<wbr>".join(out)  # a line may break between any two tokens (a token breaks only when too long)

    def key_html(self) -> str:
        """The key: the colour scale from ``cmin`` to ``cmax`` and the marks."""
        if self.category is not None:
            bits = [self._category_key()]
        else:
            ticks = np.linspace(0.0, 1.0, 9)
            sw = "".join(f'<span class="sw" style="background-color:{c}"></span>' for c in shade_colour(ticks))
            what = {"log": "log₁₀ A (log scale)", "quantile": "A (quantile scale)"}.get(self.scale, "A (linear scale)")
            if self.scale == "quantile" and self.scale_ticks:
                ends = self.scale_ticks[0][1], self.scale_ticks[-1][1]
                # one unbroken piece per quantile: the key wraps between them (one piece for all ran a one-column
                # export off its right edge)
                bits = [f'<span class="kx" style="margin-left:0">{what}: {ends[0]} {sw} {ends[1]}</span>']
                bits += [f'<span class="kx">q{q:g} = {t}</span>' for q, t in self.scale_ticks[1:-1]]
            else:
                bits = [f'<span class="kx" style="margin-left:0">{what}: {self.cmin:.3g} {sw} {self.cmax:.3g}</span>']
        if any(self.chunk_start):
            bits.append('<span class="kx"><span class="tk cs">&nbsp;</span> chunk start</span>')
        if any(self.answer):
            bits.append('<span class="kx"><span class="tk ans">answer</span></span>')
        if self.query_pos is not None and self.query_pos in self.positions:
            bits.append('<span class="kx"><span class="tk q">query</span></span>')
        if any(self.removed) and self.category is None:
            bits.append('<span class="kx"><span class="tk rm">removed</span></span>')
        if any(self.excluded):
            bits.append('<span class="kx"><span class="tk ex">sink</span> unshaded</span>')
        return '<div class="wb-key">' + " ".join(bits) + "</div>"

    def _category_key(self) -> str:
        """The key of a categorical view: every category's mark (its fill; struck through where its tokens are),
        its description and how many tokens of this page it holds."""
        out = []
        for name, colour, desc, *mark in self.categories:
            idx = [i for i, c in enumerate(self.category) if c == name]
            struck = " rm" if (mark[0] if mark else idx and all(self.removed[i] for i in idx)) else ""
            first = ' style="margin-left:0"' if not out else ""
            out.append(f'<span class="kx" data-category="{html.escape(name, quote=True)}"{first}>'
                       f'<span class="tk{struck}" style="background-color:{colour}">{html.escape(name)}</span> '
                       f"{html.escape(desc)} ({len(idx)})</span>")
        return " ".join(out)

    def html(self, *, title: bool = True, preset: str | None = None, width: str | None = None,
             standalone: bool = False) -> str:
        """The view as HTML: a ``<div class="wb-tokens">`` with its own ``<style>`` (``standalone``: a whole
        page). ``preset`` ``"single"``/``"double"`` sets the paper font sizes (pt), else screen sizes (px);
        ``width`` a CSS width (default: the container's)."""
        if preset is not None:
            if preset not in PRINT_FONT_PT:
                raise ValueError(f"preset: must be one of {sorted(PRINT_FONT_PT)} or None, got {preset!r}")
            t, k = PRINT_FONT_PT[preset]
            css = _css(f"{t}pt", f"{k}pt", f"{t + 1}pt")
        else:
            t, k = SCREEN_FONT_PX
            css = _css(f"{t}px", f"{k}px", f"{t + 1}px")
        style = f' style="width:{width}"' if width else ""
        head = f'<div class="wb-title">{html.escape(self.title)}</div>' if title else ""
        body = (f'<div class="wb-tokens"{style}><style>{css}</style>{head}'
                f'<div class="wb-text">{self.spans_html()}</div>{self.key_html()}</div>')
        if not standalone:
            return body
        return ('<!DOCTYPE html><html><head><meta charset="utf-8"><title>' + html.escape(self.title)
                + "</title></head><body style=\"margin:12px\">" + body + "</body></html>")

    def _repr_html_(self) -> str:
        return self.html()

    # ----- data -----
    def to_frame(self) -> pd.DataFrame:
        """One row per token drawn: position, token, attention, shade, colour, chunk and the marks (the CSV
        sidecar of an export)."""
        return pd.DataFrame({
            "position": list(self.positions), "token": list(self.tokens),
            "attention": np.asarray(self.values, dtype=np.float64),
            "shade": np.asarray(self.shade, dtype=np.float64), "color": self.colours, "chunk": list(self.chunk),
            "removed": list(self.removed), "chunk_start": list(self.chunk_start), "answer": list(self.answer),
            "sink_excluded": list(self.excluded),
            "query": [p == self.query_pos for p in self.positions],
            **({"category": list(self.category)} if self.category is not None else {}),
            **{k: list(v) for k, v in self.columns.items()}})
