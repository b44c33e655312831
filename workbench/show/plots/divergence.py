"""What a compressed cache changed in the answer (:mod:`workbench.analyse.divergence`), over the full-cache answer's
tokens: per token the KL divergence as bars (darker once the greedy answers have parted), the change of the chosen
token's log-probability and margin as lines, and a marker at the first token where the answers part; two settings
``A`` and ``B`` side by side in compare mode."""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from workbench.show.figure_engine import Draft, add_span, figure_function, figure_meta, finish, plot_array
from workbench.show.plots.common import customdata
from workbench.show.theme import PALETTE, token_label

KL_COLOUR, PARTED_COLOUR = PALETTE[0], PALETTE[1]


def _check(name: str, d):
    if not all(hasattr(d, a) for a in ("kl", "dlogp", "dmargin", "ids", "tokens", "first_divergence", "label")):
        raise ValueError(f"{name}: must be an AnswerDivergence (workbench.answer_divergence), got {type(d).__name__}")
    if len(d.ids) == 0:
        raise ValueError(f"{name}: has no answer tokens")
    return d


@figure_function
def answer_divergence(a, b=None, *, model_id: str | None = None, params=None) -> go.Figure:
    """Per answer token of the full-cache answer: ``KL(p_full ‖ p_compressed)`` (bars, top; from the first parting
    token on in a second colour), ``Δ log p`` of the chosen token and ``Δ margin`` (lines, bottom), the first parting
    token marked (▼ and a dotted line). The tokens are in the hover and the CSV (as tick labels they overprint at
    one column).

    Args:
        a: an :class:`~workbench.analyse.divergence.AnswerDivergence`.
        b: a second one on the same answer (compare mode: ``A`` left, ``B`` right), or ``None``.
    """
    runs = [_check("a", a)] + ([_check("b", b)] if b is not None else [])
    if b is not None and tuple(b.ids) != tuple(a.ids):
        raise ValueError("b: must be the divergence on the same full-cache answer as a (its token ids differ)")
    cols = len(runs)
    names = [f"{s}: {d.label}" if cols > 1 else d.label for s, d in zip("AB", runs)]
    fig = Draft.subplots(rows=2, cols=cols, shared_xaxes=True, vertical_spacing=0.08, horizontal_spacing=0.1,
                         row_heights=[0.5, 0.5])
    for c, d in enumerate(runs, start=1):
        n = len(d.ids)
        x = np.arange(n)
        toks = [token_label(t) if t else f"#{i}" for i, t in zip(d.ids, d.tokens)]
        parted = np.arange(n) >= (n if d.first_divergence is None else d.first_divergence)
        cd = customdata(toks, [names[c - 1]] * n, parted.tolist())
        meta = {"customdata": ["token", "setting", "parted"]}
        show = c == 1
        for part, label, colour in ((False, "KL(full ‖ compressed)", KL_COLOUR),
                                    (True, "KL once the answers part", PARTED_COLOUR)):
            m = parted == part
            fig.add_trace(go.Bar(x=x[m], y=plot_array(d.kl[m]), name=label, legendgroup=label, showlegend=show,
                                 marker_color=colour, customdata=cd[m], meta=meta,
                                 hovertemplate="%{customdata[0]} (token %{x}): KL %{y:.3g}<extra>%{customdata[1]}"
                                               "</extra>"), row=1, col=c)
        for key, label, colour, dash in (("dlogp", "Δ log p(chosen)", PALETTE[2], "solid"),
                                         ("dmargin", "Δ margin", PALETTE[3], "dash")):
            fig.add_trace(go.Scatter(x=x, y=plot_array(getattr(d, key)), mode="lines+markers", name=label,
                                     legendgroup=key, showlegend=show, line=dict(color=colour, dash=dash),
                                     marker=dict(size=4), customdata=cd, meta=meta,
                                     hovertemplate="%{customdata[0]} (token %{x}): " + label +
                                                   " %{y:.3g}<extra>%{customdata[1]}</extra>"), row=2, col=c)
        j = d.first_divergence
        fig.add_trace(go.Scatter(x=[] if j is None else [j], y=[] if j is None else [float(d.kl[j])], mode="markers",
                                 name="first parting token", legendgroup="part", showlegend=show,
                                 marker=dict(symbol="triangle-down", size=9, color="#000000"),
                                 customdata=customdata([] if j is None else [toks[j]], [] if j is None else [names[c - 1]]),
                                 meta={"customdata": ["token", "setting"]},
                                 hovertemplate="answers part at %{customdata[0]} (token %{x})<extra>%{customdata[1]}"
                                               "</extra>"), row=1, col=c)
        if j is not None:
            add_span(fig, "vline", j, row=2, col=c, line=dict(color="#000000", width=1, dash="dot"))
        fig.update_xaxes(title_text=f"answer token ({'A' if c == 1 else 'B'})" if cols > 1 else "answer token",
                         row=2, col=c)
    fig.update_yaxes(title_text="KL (nats)", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="Δ (nats)", row=2, col=1)
    parts = [f"{'A' if i == 0 else 'B'} parts at {d.first_divergence}" if d.first_divergence is not None
             else f"{'A' if i == 0 else 'B'} agrees" for i, d in enumerate(runs)]
    title = "What eviction changed in the answer" + (f": {'; '.join(parts)}" if cols > 1 else
                                                     f" ({names[0]}; {parts[0][2:]})")
    return finish(fig, title,
                  figure_meta("answer_divergence", model_id, params, settings=names,
                              first_divergence=[d.first_divergence for d in runs],
                              mean_kl=[round(float(np.mean(d.kl)), 6) for d in runs], n_answer=len(a.ids)),
                  aspect={"single": 0.95 if cols == 1 else 1.2, "double": 0.55},
                  legend=dict(orientation="h", y=1.02, x=0, xanchor="left", yanchor="bottom"))
