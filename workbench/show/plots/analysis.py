"""Figures of captures and analyses (SPEC §1–§6): capture views, pooling, priorities, selection and trace."""
from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.checks import Choice, Interval
from workbench.choices import ColourScale, HeadQuantity, RowKind
from workbench.constraints import index_into, register_all
from workbench.show.colour_scale import resolve_scale, scale_title, scaled
from workbench.show.decimate import attach_full, token_bins
from workbench.show.figure_engine import (
    Draft,
    add_span,
    as_numpy,
    figure_function,
    figure_meta,
    finish,
    plot_array,
)
from workbench.show.plots.common import (
    answer_chunk,
    customdata,
    head_labels,
    hover_tokens,
    model_id_of,
    removed_chunks,
    repeat_rows,
    spans_of,
)
from workbench.show.theme import (
    ANSWER,
    KEPT,
    NEUTRAL,
    PALETTE,
    REMOVED,
    text_preview,
)

if TYPE_CHECKING:
    from workbench.capture.data import Capture


# ============================================================================= capture views
def sink_mass_heatmap(capture: Capture, kind: RowKind = "observer", *, params=None) -> go.Figure:
    """Layer × head heatmap of the attention mass the ``kind`` rows put on the sinks (``capture.sink_mass``)."""
    m = capture.sink_mass(kind).numpy()
    fig = Draft(go.Heatmap(z=plot_array(m), x=head_labels(capture.head_group), y=list(range(capture.L)),
                               coloraxis="coloraxis", name="sink mass",
                               hovertemplate="layer %{y}, %{x}<br>sink mass %{z:.3f}<extra></extra>"))
    return finish(fig, f"Sink mass (first {capture.spans.n_sink} tokens), {kind} rows",
                   figure_meta("sink_mass_heatmap", capture.model_id, params, kind=kind, n_sink=capture.spans.n_sink),
                   xaxis_title="query head (KV group)", yaxis_title="layer", coloraxis=dict(cmin=0, cmax=1))


def attention_strip(capture: Capture, layer: int, head: int, row: int | None = None, *, log: bool = False,
                    exclude_sinks: bool = False, max_tick_tokens: int = 80, params=None) -> go.Figure:
    """Attention of one row (default: the mean of the observers) over the prompt tokens, for one head.

    Bars coloured by span: grey protected, orange candidate chunk, green the answer chunk. ``log``: a log
    y axis (a 0.7 sink no longer flattens the rest); ``exclude_sinks``: the sinks' bars are left out (gaps)
    and the axis fits the other tokens. Up to ``max_tick_tokens`` tokens the x ticks are the tokens'
    text; hover works anywhere in a token's column (``hovermode="x"``), also over short bars.
    """
    spans = capture.spans
    index_into(capture.L).check("layer", layer)
    index_into(capture.H_Q).check("head", head)
    if row is None:
        a = capture.observer_attn()[layer, head].mean(0)
        label = f"mean of {spans.W_p} observers"
    else:
        index_into(capture.attn.shape[2]).check("row", row)
        a = capture.attn[layer, head, row, : spans.T]
        label = f"row at position {int(capture.row_pos[row])}"
    y_full = plot_array(a)
    if exclude_sinks:
        y_full[: spans.n_sink] = np.nan
    fig, xaxis, bins = _span_bars(spans, y_full, "attention", "A", max_tick_tokens)
    what = ("; log scale" if log else "") + ("; sinks excluded" if exclude_sinks else "") \
        + (f"; {bins.describe()}" if not bins.exact else "")
    fig = finish(fig, f"Attention, layer {layer}, head {head} ({label}{what})",
                  figure_meta("attention_strip", capture.model_id, params, layer=layer, head=head, row=row, log=bool(log),
                        exclude_sinks=bool(exclude_sinks)),
                  bargap=0, hovermode="x",
                  yaxis=dict(type="log" if log else "linear", title=dict(text="attention" + (" (log)" if log else ""))),
                  xaxis=dict(title=dict(text=_SPAN_KEY), **xaxis))
    _attach_span_bars(fig, spans, bins, y_full, "attention")
    return fig


_SPAN_KEY = "prompt position (grey: protected, orange: chunks, green: answer)"


def _span_bars(spans, y_full: np.ndarray, name: str, symbol: str, max_tick_tokens: int):
    """One bar per prompt position (per bin of positions past the figure's width: the max of the bin; NaN
    counts as 0 there) coloured by span: grey protected, orange candidate chunk, green the answer chunk.
    Returns the draft, the x-axis ticks (the tokens' text up to ``max_tick_tokens`` tokens) and the bins."""
    chunk_of = spans.chunk_of().tolist()
    toks = hover_tokens(spans, spans.T)
    bins = token_bins(spans.T)  # scale: ≤ DEFAULT_WIDTH_PX bars (max per bin of tokens)
    if not bins.exact:
        cof = np.asarray(chunk_of)
        ans = np.isin(cof, [i for i, d in enumerate(spans.chunk_doc) if d == spans.answer_doc])
        chunk_of = bins.reduce(cof, "max").tolist()
        colors = np.where(bins.any(ans), ANSWER, np.where(bins.any(cof >= 0), PALETTE[1], NEUTRAL)).tolist()
        toks = bins.labels()
        y = bins.reduce(np.nan_to_num(y_full, nan=0.0), "max")  # excluded sinks count as 0 in their bin
    else:
        colors = [NEUTRAL if c < 0 else (ANSWER if spans.chunk_doc[c] == spans.answer_doc else PALETTE[1])
                  for c in chunk_of]
        y = y_full
    fig = Draft(go.Bar(x=bins.lo, y=y, marker_color=colors, name=name,
                           customdata=customdata(toks, chunk_of), meta={"customdata": ["token", "chunk"]},
                           hovertemplate="%{x}: %{customdata[0]} (chunk %{customdata[1]})<br>" + symbol
                           + "=%{y:.4g}<extra></extra>"))
    xaxis = dict(tickmode="array", tickvals=list(range(spans.T)), ticktext=toks, tickangle=-90,
                 tickfont=dict(family="DejaVu Sans Mono, monospace", size=8)) \
        if bins.exact and spans.T <= max_tick_tokens else {}
    return fig, xaxis, bins


def _attach_span_bars(fig, spans, bins, y_full: np.ndarray, column: str) -> None:
    if not bins.exact:  # every token in the export's CSV
        attach_full(fig, lambda: pd.DataFrame({"x": np.arange(spans.T), "token": hover_tokens(spans, spans.T),
                                               "chunk": spans.chunk_of().numpy(), column: y_full}))


# ============================================================================= pooling (SPEC §2)
_HEAD_QUANTITIES = {
    "w": ("w", "head weight w_h = ζ/r + (1−ζ) v_h"),
    "H": ("H", "non-sink Rényi-2 entropy H_h (nats)"),
    "sink": ("sink_mass", "sink mass Σ<sub>j∈𝒮</sub> a<sub>j</sub>"),
    "z": ("z", "residual mass z_h"),
    "v": ("v", "within-group softmax v_h"),
    "C": ("C", "non-sink collision C_h"),
    "omega": ("omega", "row weight ω_h"),
}
_CHECKS = register_all("plots", {"quantity": Choice(_HEAD_QUANTITIES), "x": Choice(("chunk", "position")),
                                 "budget": Interval("real", 0, what="a number of tokens")}, __name__)


@figure_function
def head_heatmap(pooling, quantity: HeadQuantity = "w", *, model_id: str | None = None, params=None) -> go.Figure:
    """Layer × head heatmap of one head statistic of a :class:`~workbench.analyse.pooling.PoolingResult`.

    Args:
        pooling: the pooling result (``[L, H_Q]`` statistics).
        quantity: ``"w"`` (floored weights), ``"H"`` (entropy; invalid heads blank), ``"sink"`` (observer
            mass on the sinks), ``"z"``, ``"v"``, ``"C"`` or ``"omega"``.
        model_id: recorded in ``layout.meta``; params: extra parameters to record (e.g. ``EntroPrefillParams``).
    """
    _CHECKS["quantity"].check("quantity", quantity)
    attr, label = _HEAD_QUANTITIES[quantity]
    m = getattr(pooling, attr)
    L, H = pooling.L, pooling.n_heads
    hg = pooling.head_group if pooling.head_group is not None else np.zeros(H, dtype=np.int64)
    valid = as_numpy(pooling.valid_head)
    text = [["" if valid[l, h] else "invalid" for h in range(H)] for l in range(L)]
    fig = Draft(go.Heatmap(z=plot_array(m), x=head_labels(hg), y=list(range(L)), coloraxis="coloraxis",
                               name=quantity, text=text,
                               hovertemplate="layer %{y}, %{x}<br>" + quantity + " = %{z:.4g} %{text}<extra></extra>"))
    cax = dict(cmin=0, cmax=1) if quantity in ("w", "v", "sink", "z") else {}
    return finish(fig, f"{label}, per layer and head",
                   figure_meta("head_heatmap", model_id_of(model_id, pooling), params, quantity=quantity,
                         zeta=getattr(pooling, "zeta", None), tau=getattr(pooling, "tau", None),
                         rho_min=getattr(pooling, "rho_min", None), n_sink=pooling.n_sink, W_p=pooling.W_p),
                   xaxis_title="query head (KV group)", yaxis_title="layer",
                   coloraxis=dict(colorbar=dict(title=dict(text=quantity)), **cax))


@figure_function
def residual_distribution(pooling, layer: int, spans=None, *, log: bool = False, scale: ColourScale | None = None,
                          model_id: str | None = None, params=None) -> go.Figure:
    """Per-head residual distribution ``a^h_j / z_h`` over the non-sink keys of one layer (head × position).

    Each row is the distribution whose Rényi-2 entropy is ``H_h`` (shown in the row label with ``w_h``).

    Args:
        pooling: :class:`~workbench.analyse.pooling.PoolingResult`.
        layer: ``0 … L-1``.
        spans: ``PromptSpans`` (or a Capture / Prompt) for the token labels; positions only when None.
        scale: the colour scale (:mod:`workbench.show.colour_scale`): ``"linear"``, ``"log"`` (``log10(a/z)``,
            floored at 1e-6) or ``"quantile"`` (by rank); default linear below 2,048 tokens, quantile from there on.
            The colour bar's title names it; the hover always shows ``a/z``. The sinks are always excluded here
            (the residual is the non-sink distribution).
        log: the log scale (the same as ``scale="log"``).
    """
    index_into(pooling.L).check("layer", layer)
    sp = spans_of(spans)
    res = as_numpy(pooling.residual(layer))  # [H_Q, T - n_sink]
    H, Tn = res.shape
    ns = pooling.n_sink
    T = ns + Tn
    sc = resolve_scale(scale, log, T)
    bins = token_bins(Tn, offset=ns)  # scale: ≤ DEFAULT_WIDTH_PX columns whatever T (max per bin of keys)
    toks = hover_tokens(sp, T)[ns:] if bins.exact else None  # labels of every key only when shown
    hg = pooling.head_group if pooling.head_group is not None else np.zeros(H, dtype=np.int64)
    Hh, w = as_numpy(pooling.H[layer]), as_numpy(pooling.w[layer])
    ylab = [f"{lab} H={Hh[h]:.2f} w={w[h]:.2f}" if np.isfinite(Hh[h]) else f"{lab} invalid"  # one space: at one
            for h, lab in enumerate(head_labels(hg))]  # column plotly's least plot width left the labels no more room
    colour = scale_title("a/z", sc)
    if bins.exact:
        shown = plot_array(res)
        z, ticks = scaled(shown, sc)
        cd = np.empty((H, Tn, 2), dtype=object)
        cd[..., 0] = np.asarray(toks, dtype=object)[None, :]
        cd[..., 1] = shown
        lin = sc == "linear"
        fig = Draft(go.Heatmap(z=z, x=np.arange(ns, T), y=ylab, coloraxis="coloraxis", name="residual",
                                customdata=repeat_rows(toks, H) if lin else cd,
                                hovertemplate="%{y}<br>key %{x}: " + ("%{customdata}<br>a/z = %{z:.4g}" if lin
                                                                      else "%{customdata[0]}<br>a/z = %{customdata[1]:.4g}")
                                + "<extra></extra>"))
    else:
        zb = plot_array(bins.reduce(res, "max"))
        z, ticks = scaled(zb, sc)
        fig = Draft(go.Heatmap(z=z, x=bins.lo, y=ylab, coloraxis="coloraxis", name="residual",
                                **({} if sc == "linear" else dict(customdata=zb)),
                                hovertemplate="%{y}<br>keys from %{x} (bin of ≤ " + str(bins.width)
                                + " tokens)<br>max a/z = " + ("%{z:.4g}" if sc == "linear" else "%{customdata:.4g}")
                                + "<extra></extra>"))
    fig = finish(fig, f"Residual distributions a_j/z_h (non-sink keys), layer {layer}"
                  + (f" ({bins.describe()})" if not bins.exact else ""),
                  figure_meta("residual_distribution", model_id_of(model_id, pooling, spans), params, layer=layer,
                        n_sink=ns, zeta=getattr(pooling, "zeta", None), tau=getattr(pooling, "tau", None),
                        log=sc == "log", scale=sc),
                  xaxis_title="key position",  # row labels name the head and group
                  coloraxis=dict(colorbar=dict(title=dict(text=colour), **ticks)),
                  yaxis=dict(autorange="reversed"))
    if not bins.exact:  # every key in the export's CSV
        attach_full(fig, lambda: pd.DataFrame({"head": np.repeat(ylab, Tn), "key": np.tile(np.arange(ns, T), H),
                                               "token": np.tile(np.asarray(hover_tokens(sp, T)[ns:], dtype=object), H),
                                               "a_over_z": res.reshape(-1)}))
    return fig


def pooled_measure(pooling, layer: int, spans, *, log: bool = True, max_tick_tokens: int = 80,
                   model_id: str | None = None, params=None) -> go.Figure:
    """The pooled measure ``μ^l_j`` of one layer over the prompt (``pooling.mu[layer]``), one bar per token
    coloured by span as in :func:`attention_strip` (grey protected, orange chunks, green the answer chunk).

    Args:
        pooling: :class:`~workbench.analyse.pooling.PoolingResult`.
        layer: ``0 … L-1``.
        spans: ``PromptSpans`` of the prompt (or a Capture / Prompt) for the colours and the tokens.
        log: a log y axis (default: the sinks' mass would flatten the rest).
    """
    index_into(pooling.L).check("layer", layer)
    sp = spans_of(spans)
    if sp is None:
        raise ValueError("spans: must be PromptSpans, a Prompt or a Capture, got None")
    y_full = plot_array(pooling.mu[layer])
    if sp.T != len(y_full):
        raise ValueError(f"spans: has T = {sp.T} tokens, the pooling {len(y_full)}")
    fig, xaxis, bins = _span_bars(sp, y_full, "μ", "μ", max_tick_tokens)
    fig = finish(fig, f"Pooled measure μ at layer {layer}" + (f" ({bins.describe()})" if not bins.exact else ""),
                  figure_meta("pooled_measure", model_id_of(model_id, pooling, spans), params, layer=layer, log=bool(log),
                              zeta=getattr(pooling, "zeta", None), tau=getattr(pooling, "tau", None),
                              n_sink=pooling.n_sink, W_p=pooling.W_p),
                  bargap=0, hovermode="x", yaxis=dict(title=dict(text="μ_j"),  # log: one tick a decade
                                                      **(dict(type="log", dtick=1) if log else dict(type="linear"))),
                  xaxis=dict(title=dict(text=_SPAN_KEY), **xaxis))
    _attach_span_bars(fig, sp, bins, y_full, "mu")
    return fig


# ============================================================================= priorities (SPEC §3)
@figure_function
def chunk_priorities(priorities, spans, layer: int, removed=None, *, x: str = "chunk",
                     model_id: str | None = None, params=None) -> go.Figure:
    """Chunk priorities of one layer: three stacked bar panels ``S_i``, ``ℓ_i`` (null line at 1), ``κ_i``.

    Bars are coloured kept (blue) / removed (vermillion) when ``removed`` is given (grey otherwise); the
    answer chunk has a thick black outline and an "answer" label; hover shows the chunk's text.
    Each panel has two traces, ``kept`` and ``removed`` (the structure does not change with the selection).

    Args:
        priorities: :class:`~workbench.analyse.priorities.PriorityResult`.
        spans: ``PromptSpans`` of the prompt (or a Capture / Prompt / TraceResult).
        layer: ``0 … L-1``.
        removed: removed chunk indices, a ``SelectionResult``, or a ``TraceResult`` (its selection at ``layer``).
        x: ``"chunk"`` (one slot per chunk) or ``"position"`` (bars over the chunk's token span of the prompt).
    """
    sp = spans_of(spans)
    index_into(priorities.L).check("layer", layer)
    _CHECKS["x"].check("x", x)
    k = priorities.k
    if sp.k != k:
        raise ValueError(f"spans: has {sp.k} chunks, the priorities {k}")
    rem = removed_chunks(removed, layer, k)
    rset = set(rem or [])
    ans = answer_chunk(sp)
    S, ell, kap = (as_numpy(t[layer]) for t in (priorities.S, priorities.ell, priorities.kappa))
    n = as_numpy(priorities.n)
    preview = [text_preview(sp.tokens[s:e]) for s, e in sp.chunks]
    if x == "chunk":
        xs = list(range(k))
        widths = [0.8] * k
    else:
        xs = [(s + e) / 2 for s, e in sp.chunks]
        widths = n.tolist()
    fig = Draft.subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06)
    groups = (("kept", [i for i in range(k) if i not in rset]), ("removed", sorted(rset)))
    for row, (vals, name) in enumerate(((S, "S"), (ell, "ℓ"), (kap, "κ")), start=1):
        for label, idx in groups:
            color = (KEPT if label == "kept" else REMOVED) if rem is not None else NEUTRAL
            fig.add_trace(go.Bar(
                x=[xs[i] for i in idx], y=[None if not np.isfinite(vals[i]) else float(vals[i]) for i in idx],
                width=None if widths is None else [widths[i] for i in idx],
                name=label if rem is not None else "chunks", legendgroup=label, showlegend=row == 1 and (
                    rem is not None or label == "kept"),
                marker=dict(color=color, line=dict(color="#000", width=[3 if i == ans else 0 for i in idx])),
                customdata=customdata(idx, n[idx].tolist(), [preview[i] for i in idx], [i == ans for i in idx]),
                meta={"customdata": ["chunk", "n", "text", "answer"], "quantity": name},
                hovertemplate="chunk %{customdata[0]} (n=%{customdata[1]})<br>" + name
                + " = %{y:.4g}<br>%{customdata[2]}<extra>" + label + "</extra>"),
                row=row, col=1)
    add_span(fig, "hline", 1.0, line=dict(color=NEUTRAL, dash="dash", width=1), row=2, col=1)
    if ans is not None:
        top = S[ans] if np.isfinite(S[ans]) else 0.0
        fig.add_annotation(x=xs[ans], y=float(top), text="answer", showarrow=True, arrowhead=2, ay=-25,
                           font=dict(size=10), row=1, col=1)
    valid = bool(as_numpy(priorities.valid)[layer])
    title = f"Chunk priorities, layer {layer}" + ("" if valid else " (invalid layer: document mass ≤ ρ_min)")
    if rem is not None:
        title += f": {len(rem)} of {k} chunks removed"
    fig.update_yaxes(title_text="S = ln ℓ + λκ", row=1, col=1)
    fig.update_yaxes(title_text="lift ℓ", row=2, col=1)
    fig.update_yaxes(title_text="κ", range=[0, 1.05], row=3, col=1)
    if x == "chunk":
        fig.update_xaxes(tickmode="array", tickvals=xs,
                         ticktext=[f"c{i}" + ("★" if i == ans else "") for i in range(k)], row=3, col=1)
        fig.update_xaxes(title_text="candidate chunk" + (" (★ answer)" if ans is not None else ""), row=3, col=1)
    else:
        fig.update_xaxes(title_text="prompt position", range=[0, sp.T], row=3, col=1)
    return finish(fig, title,
                   figure_meta("chunk_priorities", model_id_of(model_id, spans), params, layer=layer, x=x,
                         removed=rem, answer_chunk=ans, eps_s=priorities.eps_s, lam=priorities.lam),
                   barmode="overlay", legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"),
                   aspect={"single": 1.25, "double": 0.65})


# ============================================================================= selection and trace (SPEC §5–§6)
def _selections(source) -> tuple[dict, object]:
    """``({layer: SelectionResult}, trace or None)`` from a trace, a dict or a sequence of selections."""
    if hasattr(source, "selections") and hasattr(source, "records"):
        return dict(source.selections), source
    if isinstance(source, Mapping):
        return {int(k): v for k, v in source.items()}, None
    if isinstance(source, Sequence) and not isinstance(source, str):
        return dict(enumerate(source)), None
    raise ValueError(f"source: must be a TraceResult, a dict {{layer: SelectionResult}} or a list, "
                     f"got {type(source).__name__}")


@figure_function
def certificate(source, budget: int | None = None, *, model_id: str | None = None, params=None) -> go.Figure:
    """Greedy removal ``D_l`` against the certificate ``U_l`` and the gap ``U_l − D_l``, per layer.

    ``U_l`` bounds the best removal under the row tolerances; ``U_l`` below the target proves the target
    infeasible at that layer (marked ✕). Layers without a certificate are left out of ``U``/gap.

    Args:
        source: a ``TraceResult``, ``{layer: SelectionResult}`` or a list of ``SelectionResult`` (one per layer).
        budget: the saving target in tokens drawn as a line (default: the selections' ``target_tokens``).
    """
    sels, tr = _selections(source)
    if not sels:
        raise ValueError("source: has no selections (every monitored layer invalid?)")
    layers = sorted(sels)
    D = [sels[l].D for l in layers]
    U = [sels[l].U for l in layers]
    gap = [sels[l].gap for l in layers]
    infeasible = [bool(sels[l].infeasible_proved) for l in layers]
    tt = sels[layers[0]].target_tokens
    budget = tt if budget is None else budget
    _CHECKS["budget"].check("budget", budget)
    N = sels[layers[0]].N
    verdict = [html.escape(sels[l].verdict) for l in layers]
    fig = Draft.subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.06)
    fig.add_trace(go.Scatter(x=layers, y=plot_array([np.nan if u is None else u for u in U]), name="U_l (certificate)",
                             mode="lines+markers", line=dict(color=PALETTE[1]),
                             marker=dict(symbol=["x" if f else "circle" for f in infeasible], size=8),
                             customdata=customdata(verdict), meta={"customdata": ["verdict"]},
                             hovertemplate="layer %{x}: U = %{y:.4g}<br>%{customdata[0]}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=layers, y=D, name="D_l (greedy)", mode="lines+markers", line=dict(color=KEPT),
                             hovertemplate="layer %{x}: D = %{y} tokens<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=[layers[0] - 0.5, layers[-1] + 0.5], y=[budget, budget], name="target", mode="lines",
                             line=dict(color=REMOVED, dash="dash"),
                             hovertemplate="target %{y} tokens<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=layers, y=plot_array([np.nan if g is None else g for g in gap]), name="gap U − D",
                         marker_color=NEUTRAL, hovertemplate="layer %{x}: gap %{y:.4g}<extra></extra>"), row=2, col=1)
    if tr is not None and tr.l_star is not None:
        add_span(fig, "vline", tr.l_star, line=dict(color="#000", dash="dot", width=1))
        fig.add_annotation(x=tr.l_star, y=1, yref="paper", text="l*", showarrow=False, yanchor="bottom")
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_yaxes(title_text="gap", row=2, col=1)
    fig.update_xaxes(title_text="layer", row=2, col=1)
    # whole-layer ticks: the target line's ends at ±0.5 would let plotly tick at halves, or (one layer, as in
    # the priority panel) leave the only layer without a tick
    span = layers[-1] - layers[0]
    step = next((s for s in (1, 2, 5, 10, 20, 50) if span / s <= 10), 100)
    fig.update_xaxes(tickmode="linear", tick0=layers[0], dtick=step, range=[layers[0] - 0.5, layers[-1] + 0.5])
    p = params if params is not None else getattr(tr, "params", None)
    return finish(fig, f"Greedy D_l vs certificate U_l (N = {N} candidate tokens)",
                   figure_meta("certificate", model_id_of(model_id, tr), p, budget=budget, target_tokens=tt, N=N,
                         layers=layers, l_star=getattr(tr, "l_star", None)),
                   legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"),
                   aspect={"single": 1.05, "double": 0.55})


STATUS_COLOR = {"accept": PALETTE[2], "audit_fail": REMOVED, "below_target": PALETTE[1], "short_streak": PALETTE[5],
                 "no_audit": PALETTE[4], "invalid": NEUTRAL, "no_candidates": NEUTRAL}


@figure_function
def trace_layers(trace, *, fixed_layer: int | None = None, model_id: str | None = None, params=None) -> go.Figure:
    """The per-layer trace of the 7-step procedure (``procedure.trace``): three panels over the monitored layers.

    1. removed tokens ``D_l`` and certificate ``U_l`` against the target; 2. candidate stability ``d_l``
    against ``d_max`` and the streak (bars); 3. the largest audit bound against ``ε_audit`` (and ``b``).
    The layer markers at the bottom are coloured by status (accept, audit fail, below target, ...);
    hover shows the decision sentence. ``l*`` is a dotted vertical line; ``fixed_layer`` (a run that prunes after
    a fixed layer instead of the adaptive ``l*``) a dashed vermillion one labelled "fixed".
    """
    df = trace.to_frame()
    if df.empty:
        raise ValueError("trace: has no monitored layers")
    P = trace.params
    layers = df["layer"].tolist()
    fig = Draft.subplots(rows=4, cols=1, shared_xaxes=True, row_heights=[0.38, 0.25, 0.25, 0.12],
                        vertical_spacing=0.04, specs=[[{}], [{"secondary_y": True}], [{}], [{}]])
    f = lambda c: plot_array(pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float))  # noqa: E731
    tt = [np.nan if v is None else v for v in df["target_tokens"]]
    fig.add_trace(go.Scatter(x=layers, y=f("D"), name="D_l", mode="lines+markers", line=dict(color=KEPT)), 1, 1)
    fig.add_trace(go.Scatter(x=layers, y=f("U"), name="U_l", mode="lines+markers", line=dict(color=PALETTE[1])), 1, 1)
    fig.add_trace(go.Scatter(x=layers, y=plot_array(tt), name="target", mode="lines", line=dict(color=REMOVED, dash="dash")),
                  1, 1)
    fig.add_trace(go.Bar(x=layers, y=f("streak"), name="streak", marker_color=PALETTE[5], opacity=0.45),
                  2, 1, secondary_y=True)
    fig.add_trace(go.Scatter(x=layers, y=f("d"), name="d_l", mode="lines+markers", line=dict(color=PALETTE[4])),
                  2, 1, secondary_y=False)
    fig.add_trace(go.Scatter(x=layers, y=f("max_audit_bound"), name="max audit bound", mode="markers",
                             marker=dict(color=PALETTE[3], size=8, symbol="diamond")), 3, 1)
    status = df["status"].tolist()
    fig.add_trace(go.Scatter(x=layers, y=[0] * len(layers), name="status", mode="markers", showlegend=False,
                             marker=dict(color=[STATUS_COLOR.get(s, "#000") for s in status], size=11, symbol="square"),
                             customdata=customdata(status, [html.escape(d) for d in df["decision"]]),
                             meta={"customdata": ["status", "decision"]},
                             hovertemplate="layer %{x}: %{customdata[0]}<br>%{customdata[1]}<extra></extra>"), 4, 1)
    ref = dict(color=NEUTRAL, dash="dash", width=1)
    small = dict(size=10)
    if P is not None:
        add_span(fig, "hline", P.d_max, line=ref, annotation_text="d_max", annotation_font=small, row=2, col=1,
                      secondary_y=False)
        add_span(fig, "hline", P.eps_audit, line=ref, annotation_text="ε_audit", annotation_font=small, row=3, col=1)
    if trace.b > 0:
        add_span(fig, "hline", trace.b, line=dict(color=PALETTE[1], dash="dot", width=1), annotation_text="b",
                      annotation_font=small, annotation_position="bottom right", row=3, col=1)
    if trace.l_star is not None:
        add_span(fig, "vline", trace.l_star, line=dict(color="#000", dash="dot", width=1))
        fig.add_annotation(x=trace.l_star, y=1, yref="paper", text="l*", showarrow=False, yanchor="top",
                           xanchor="left", xshift=2)  # inside the top edge: the legend sits above the plot
    if fixed_layer is not None:
        add_span(fig, "vline", fixed_layer, line=dict(color=REMOVED, dash="dash", width=1.5))
        fig.add_annotation(x=fixed_layer, y=0.93, yref="paper", text="fixed", showarrow=False, yanchor="top",
                           xanchor="left", xshift=2, font=dict(color=REMOVED))
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_yaxes(title_text="d_l", range=[0, 1.05], row=2, col=1, secondary_y=False)
    # whole numbers, at most three ticks in this short row (dtick = 1 stacked 30 labels when every layer is stable)
    top = np.nanmax(f("streak"), initial=0.0)
    fig.update_yaxes(title_text="streak", rangemode="tozero", showgrid=False,
                     dtick=max(1, math.ceil(top / 2)) if np.isfinite(top) else 1, row=2, col=1, secondary_y=True)
    fig.update_yaxes(title_text="audit bound", row=3, col=1)
    fig.update_yaxes(showticklabels=False, showline=False, ticks="", showgrid=False, row=4, col=1)
    fig.update_xaxes(title_text="monitored layer", row=4, col=1)
    fig.update_xaxes(dtick=max(1, math.ceil(len(layers) / 16)))
    key = "  ".join(f'<span style="color:{c}">■</span> {k.replace("_", " ")}' for k, c in STATUS_COLOR.items()
                    if k in status)
    fig.add_annotation(x=0, y=0, xref="x domain",
                       yref=fig.refs(4, 1)[1] + " domain", xanchor="left", yanchor="bottom", text=key,
                       showarrow=False, font=dict(size=9), yshift=-2)
    dec = trace.decision
    if len(dec) >= 90 and trace.l_star is not None:  # a long chunk list: its count in the title, the list in meta
        sel = trace.selections[trace.l_star]
        T = getattr(trace.spans, "T", None)
        dec = (f"accept at l* = {trace.l_star}: remove {len(trace.removed)} chunks ({sel.D} of {sel.N} candidate "
               f"tokens" + ("" if T is None else f"; T' = {T - sel.D}") + ")")
    return finish(fig, f"Layer trace: {html.escape(dec)}",
                   figure_meta("trace_layers", model_id_of(model_id, trace), params if params is not None else P,
                         l_star=trace.l_star, removed=trace.removed, decision=trace.decision, b=trace.b, J=trace.J,
                         fixed_layer=fixed_layer),
                   barmode="overlay", margin=dict(r=60, t=80),
                   legend=dict(orientation="h", y=1.02, x=0, xanchor="left", yanchor="bottom"), aspect={"single": 1.5, "double": 0.8})
