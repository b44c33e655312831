"""The paper template of every figure: the Okabe–Ito palette, fonts, axis style (registered with plotly as
``"workbench"``), and how tokens are written in labels and hover text."""

import html
from collections.abc import Sequence

import plotly.graph_objects as go
import plotly.io as pio

__all__ = ["PALETTE", "SEQUENTIAL", "FONT", "TEMPLATE", "KEPT", "REMOVED", "NEUTRAL", "ANSWER"]

PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
SEQUENTIAL = "Cividis"
FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif"
KEPT = PALETTE[0]      # blue: kept / retained
REMOVED = PALETTE[3]   # vermillion: removed / evicted
ANSWER = PALETTE[2]    # bluish green: the answer passage / needle
NEUTRAL = "#999999"    # grey: protected tokens, reference lines

_AXIS = dict(showline=True, linecolor="#444", ticks="outside", gridcolor="#eee", zeroline=False, automargin=True,
             title=dict(font=dict(size=12)), tickfont=dict(size=10))
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
        coloraxis=dict(colorscale=SEQUENTIAL, colorbar=dict(thickness=12, outlinewidth=0, tickfont=dict(size=10))),
        legend=dict(font=dict(size=10), bgcolor="rgba(255,255,255,0.7)", borderwidth=0),
        hoverlabel=dict(font=dict(family=FONT, size=11)),
        bargap=0.15,
    ),
    data=dict(heatmap=[go.Heatmap(colorbar=dict(thickness=12, outlinewidth=0))]),
)
TEMPLATE = "workbench"


def _token_label(tok: str) -> str:
    """A token as shown in hover and tick labels: spaces as ``·``, newline ``⏎``, HTML-escaped."""
    t = tok.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "·") or "∅"
    return html.escape(t, quote=False)


def _text_preview(tokens: Sequence[str], limit: int = 120) -> str:
    """The text of a run of tokens, shortened to ``limit`` characters, HTML-escaped, one line."""
    s = "".join(tokens).replace("\n", " ⏎ ").strip()
    if len(s) > limit:
        s = s[: limit - 1] + "…"
    return html.escape(s, quote=False)


