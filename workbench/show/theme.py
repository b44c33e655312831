"""The paper template of every figure: the Okabe–Ito palette, fonts, axis style (registered with plotly as
``"workbench"``), and how tokens are written in labels and hover text."""

import html
from collections.abc import Sequence

import plotly.graph_objects as go
import plotly.io as pio

from workbench.checks import Interval
from workbench.constraints import register_all

__all__ = ["PALETTE", "SEQUENTIAL", "FONT", "TEMPLATE", "KEPT", "REMOVED", "NEUTRAL", "ANSWER", "DASHES", "SYMBOLS",
           "categorical", "categorical_px"]

PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
SEQUENTIAL = "Cividis"
FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif"
KEPT = PALETTE[0]      # blue: kept / retained
REMOVED = PALETTE[3]   # vermillion: removed / evicted
ANSWER = PALETTE[2]    # bluish green: the answer passage / needle
NEUTRAL = "#999999"    # grey: protected tokens, reference lines

# exponents as powers of ten (10⁻⁴, 2×10⁻⁶): plotly's default SI letters read "100µ" on a unitless axis
_AXIS = dict(showline=True, linecolor="#444", ticks="outside", gridcolor="#eee", zeroline=False, automargin=True,
             title=dict(font=dict(size=12)), tickfont=dict(size=10), exponentformat="power")
_COLORBAR = dict(thickness=12, outlinewidth=0, exponentformat="power")
pio.templates["workbench"] = go.layout.Template(
    layout=go.Layout(
        font=dict(family=FONT, size=12, color="#222"),
        title=dict(font=dict(size=14), x=0.02, xanchor="left"),
        colorway=PALETTE,
        paper_bgcolor="white",
        plot_bgcolor="white",
        margin=dict(l=60, r=20, t=50, b=50),
        xaxis=_AXIS,
        yaxis=_AXIS,
        coloraxis=dict(colorscale=SEQUENTIAL, colorbar=dict(tickfont=dict(size=10), **_COLORBAR)),
        legend=dict(font=dict(size=10), bgcolor="rgba(255,255,255,0.7)", borderwidth=0),
        hoverlabel=dict(font=dict(family=FONT, size=11)),
        bargap=0.15,
    ),
    data=dict(heatmap=[go.Heatmap(colorbar=_COLORBAR)]),
)
TEMPLATE = "workbench"


DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star")
_CHECKS = register_all("categorical", {"n": Interval("int", 0, len(PALETTE) * len(DASHES))}, __name__)
"""The distinct styles :func:`categorical` can give."""


def categorical(n: int) -> list[dict]:
    """``n`` distinct line/marker styles for unordered categories (heads, KV groups, methods):
    ``[{"color", "dash", "symbol"}]``. The eight Okabe–Ito colours first (solid, circles); past 8 the colours
    repeat with the next dash and marker (``h8`` is blue *dashed with squares*, not a second plain blue), so two
    styles share a colour only when their dash and marker differ. Up to 48 distinct styles; more raise.
    ``tests/test_figure_layout.py`` checks the colours' pairwise CIELAB ΔE, also under a deuteranopia
    simulation."""
    _CHECKS["n"].check("n", n)
    return [{"color": PALETTE[i % len(PALETTE)], "dash": DASHES[i // len(PALETTE)],
             "symbol": SYMBOLS[i // len(PALETTE)]} for i in range(n)]


def categorical_px(values: Sequence, column: str) -> dict:
    """Keyword arguments for ``plotly.express`` (``px.line``/``px.scatter``) styling ``column`` with
    :func:`categorical`: colour, dash and marker maps over the distinct ``values`` (in order)."""
    vals = list(dict.fromkeys(values))
    st = categorical(len(vals))
    return dict(color=column, line_dash=column, symbol=column,
                color_discrete_map={v: s["color"] for v, s in zip(vals, st)},
                line_dash_map={v: s["dash"] for v, s in zip(vals, st)},
                symbol_map={v: s["symbol"] for v, s in zip(vals, st)},
                category_orders={column: vals})


def token_label(tok: str) -> str:
    """A token as shown in hover and tick labels: spaces as ``·``, newline ``⏎``, HTML-escaped."""
    t = tok.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "·") or "∅"
    return html.escape(t, quote=False)


def text_preview(tokens: Sequence[str], limit: int = 120) -> str:
    """The text of a run of tokens, shortened to ``limit`` characters, HTML-escaped, one line."""
    s = "".join(tokens).replace("\n", " ⏎ ").strip()
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return html.escape(s, quote=False)


