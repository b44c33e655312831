"""Plotly figures (the *show* layer): one paper-ready template, no science computed here.

Each figure function takes analysis results (or a capture) and returns a ``plotly.graph_objects.Figure``
whose ``layout.meta`` carries the parameters that made it (written beside exports).
"""
from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

# Okabe–Ito colour-blind-safe palette
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
SEQUENTIAL = "Cividis"
FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif"

pio.templates["workbench"] = go.layout.Template(
    layout=go.Layout(
        font=dict(family=FONT, size=12, color="#222"),
        title=dict(font=dict(size=14), x=0.02, xanchor="left"),
        colorway=PALETTE,
        paper_bgcolor="white",
        plot_bgcolor="white",
        margin=dict(l=60, r=20, t=50, b=50),
        xaxis=dict(showline=True, linecolor="#444", ticks="outside", gridcolor="#eee", zeroline=False),
        yaxis=dict(showline=True, linecolor="#444", ticks="outside", gridcolor="#eee", zeroline=False),
        coloraxis=dict(colorscale=SEQUENTIAL),
    )
)
TEMPLATE = "workbench"


def _token_label(tok: str) -> str:
    return tok.replace("\n", "⏎").replace(" ", "·") or "∅"


def sink_mass_heatmap(capture, kind: str = "observer") -> go.Figure:
    """Layer × head heatmap of the attention mass the ``kind`` rows put on the sinks."""
    m = capture.sink_mass(kind).numpy()
    fig = go.Figure(go.Heatmap(z=m, x=[f"h{h} (g{g})" for h, g in enumerate(capture.head_group.tolist())],
                               y=list(range(capture.L)), coloraxis="coloraxis",
                               hovertemplate="layer %{y}, %{x}<br>sink mass %{z:.3f}<extra></extra>"))
    fig.update_layout(template=TEMPLATE, title=f"Sink mass (first {capture.spans.n_sink} tokens), {kind} rows",
                      xaxis_title="query head (KV group)", yaxis_title="layer", coloraxis=dict(cmin=0, cmax=1),
                      meta={"figure": "sink_mass_heatmap", "kind": kind, "n_sink": capture.spans.n_sink,
                            "model_id": capture.model_id})
    return fig


def attention_strip(capture, layer: int, head: int, row: int | None = None) -> go.Figure:
    """Attention of one row (default: the mean of the observers) over the prompt tokens, for one head."""
    spans = capture.spans
    if not 0 <= layer < capture.L:
        raise ValueError(f"layer: must be in [0, {capture.L - 1}], got {layer}")
    if not 0 <= head < capture.H_Q:
        raise ValueError(f"head: must be in [0, {capture.H_Q - 1}], got {head}")
    if row is None:
        a = capture.observer_attn()[layer, head].mean(0)
        label = f"mean of {spans.W_p} observers"
    else:
        a = capture.attn[layer, head, row, : spans.T]
        label = f"row at position {int(capture.row_pos[row])}"
    chunk_of = spans.chunk_of().tolist()
    colors = [PALETTE[0] if c < 0 else PALETTE[1 + (spans.chunk_doc[c] == spans.answer_doc)] for c in chunk_of]
    toks = [_token_label(t) for t in spans.tokens]
    fig = go.Figure(go.Bar(x=list(range(spans.T)), y=a.numpy(), marker_color=colors,
                           customdata=toks, hovertemplate="%{x}: %{customdata}<br>A=%{y:.4f}<extra></extra>"))
    fig.update_layout(template=TEMPLATE, title=f"Attention, layer {layer}, head {head} ({label})",
                      xaxis_title="prompt position (blue: protected, orange: chunks, green: answer chunk)",
                      yaxis_title="attention probability", bargap=0,
                      meta={"figure": "attention_strip", "layer": layer, "head": head, "row": row,
                            "model_id": capture.model_id})
    return fig
