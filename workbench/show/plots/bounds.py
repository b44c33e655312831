"""Figures of bounds and diagnostics (SPEC §4, §7–§9): the envelope, drift and break-even, pages, the prefill-decode shift."""

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from workbench.analyse.shift import SHIFT_CHECKS
from workbench.choices import ShiftLevel
from workbench.constraints import index_into
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
    check_frame,
    customdata,
    hover_tokens,
    model_id_of,
    note_lines,
    repeat_rows,
    spans_of,
)
from workbench.show.theme import (
    KEPT,
    NEUTRAL,
    PALETTE,
    REMOVED,
    SEQUENTIAL,
    categorical,
    text_preview,
)


# ============================================================================= envelope (SPEC §4)
@figure_function
def envelope_rows(env, *, layer: int | None = None, model_id: str | None = None, params=None) -> go.Figure:
    """Deletion envelope against the actual discarded mass, per constraint row ``a = (h, u)`` of one layer.

    Markers: the actual ``η = A_u(E)`` (blue where ``η ≤ bound``, vermillion where the bound is violated);
    line: the envelope ``min{1, q/ω, q + √(D_χ² q(1−q))}``; dashed: the pooled discarded mass ``q``.
    Hover shows both terms, ``ω`` and ``D_χ²`` (with its cap ``1/ω − 1``).

    Args:
        env: an :class:`~workbench.analyse.envelope.EnvelopeResult`, or a list of them (``envelope_all_layers``)
            with ``layer`` choosing one.
        layer: the layer to show when ``env`` is a list.
    """
    if isinstance(env, Sequence):
        by = {e.layer: e for e in env}
        if layer not in by:
            raise ValueError(f"layer: must be one of the envelope layers {sorted(k for k in by if k is not None)}, "
                             f"got {layer!r}")
        env = by[layer]
    elif layer is not None and env.layer is not None and layer != env.layer:
        raise ValueError(f"layer: this envelope is of layer {env.layer}, got {layer}")
    A = int(env.eta.shape[0])
    a = list(range(A))
    heads, us = [i // env.W for i in a], [i % env.W for i in a]
    holds = as_numpy(env.holds).tolist()
    cd = customdata(heads, us, plot_array(env.omega), plot_array(env.dchi2), plot_array(env.dchi2_cap), plot_array(env.term_ratio), plot_array(env.term_chi2))
    names = ["head", "u", "omega", "dchi2", "dchi2_cap", "term_ratio", "term_chi2"]
    hover = ("row %{x} (h%{customdata[0]}, u%{customdata[1]}): %{y:.4g}<br>ω = %{customdata[2]:.3g}, "
             "D_χ² = %{customdata[3]:.3g} (cap %{customdata[4]:.3g})<br>q/ω = %{customdata[5]:.3g}, "
             "q + √(D_χ² q(1−q)) = %{customdata[6]:.3g}")
    fig = Draft()
    fig.add_trace(go.Scatter(x=a, y=plot_array(env.bound), name="envelope", mode="lines", line=dict(color=PALETTE[1], shape="hvh"),
                             customdata=cd, meta={"customdata": names},
                             hovertemplate=hover + "<extra>envelope</extra>"))
    fig.add_trace(go.Scatter(x=a, y=plot_array(env.eta), name="actual η", mode="markers",
                             marker=dict(color=[KEPT if h else REMOVED for h in holds], size=6,
                                         symbol=["circle" if h else "x" for h in holds]),
                             customdata=customdata(heads, us, holds), meta={"customdata": ["head", "u", "holds"]},
                             hovertemplate="row %{x} (h%{customdata[0]}, u%{customdata[1]}): η = %{y:.4g}"
                             "<extra>actual</extra>"))
    fig.add_trace(go.Scatter(x=[0, max(A - 1, 0)], y=[env.q, env.q], name="q = μ(E)", mode="lines",
                             line=dict(color=NEUTRAL, dash="dash", width=1), hovertemplate="q = %{y:.4g}<extra></extra>"))
    for h in range(1, A // max(env.W, 1)):
        add_span(fig, "vline", h * env.W - 0.5, line=dict(color="#ddd", width=1))
    n_bad = A - sum(holds)
    where = "" if env.layer is None else f", layer {env.layer}"
    empty = {}
    if env.q == 0 and not np.any(as_numpy(env.eta)):  # nothing removed: every curve is the zero line
        empty["placeholder"] = ("nothing removed at this layer (q = 0): the envelope and η are 0 for every row; "
                                "lower the saving target or choose another layer to see the envelope")
        # short lines: at one column a line of the whole clause ran past the plot onto the y title and the canvas
        fig.add_annotation(text=note_lines(empty["placeholder"]), x=0.5, y=0.5, xref="paper",
                           yref="paper", showarrow=False, bgcolor="rgba(255,255,255,0.85)")
    return finish(fig, f"Deletion envelope vs actual η per row{where}"
                   + ("" if n_bad == 0 else f" ({n_bad} rows above the envelope)"),
                   figure_meta("envelope_rows", model_id, params, layer=env.layer, q=env.q, W=env.W, atol=env.atol,
                         all_hold=env.all_hold, **empty),
                   xaxis_title="constraint row a = h·W + u (grouped by head)", yaxis_title="discarded mass",
                   yaxis=dict(rangemode="tozero"),
                   legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))


def envelope_scatter(envs, *, removals=None, model_id: str | None = None, params=None) -> go.Figure:
    """Actual discarded mass ``η = A_a(E)`` against the envelope ``min{1, q/ω, q + √(D_χ² q(1−q))}`` of every
    constraint row ``a`` under many removal sets ``E`` of one layer: one point per ``(a, E)``. No point may lie
    above the diagonal ``η = envelope`` (drawn); the closer to it, the tighter the envelope.

    Args:
        envs: :class:`~workbench.analyse.envelope.EnvelopeResult` list, one per removal set, all of one layer.
        removals: the removal sets (e.g. tuples of chunk indices), one per envelope, named in the hover.
    """
    envs = list(envs)
    if not envs:
        raise ValueError("envs: must not be empty")
    layers = sorted({e.layer for e in envs}, key=lambda v: (v is None, v))
    if len(layers) > 1:
        raise ValueError(f"envs: must all be of one layer, got layers {layers}")
    if removals is not None:
        removals = [str(list(E)) if isinstance(E, (tuple, list, range)) else str(E) for E in removals]
        if len(removals) != len(envs):
            raise ValueError(f"removals: must have one entry per envelope ({len(envs)}), got {len(removals)}")
    n = [int(e.eta.shape[0]) for e in envs]
    x = np.concatenate([plot_array(e.bound) for e in envs])
    y = np.concatenate([plot_array(e.eta) for e in envs])
    rows = np.concatenate([np.arange(k) for k in n])
    which = np.repeat(removals if removals is not None else [f"#{i}" for i in range(len(envs))], n)
    holds = np.concatenate([as_numpy(e.holds) for e in envs])
    fig = Draft()
    fig.add_trace(go.Scattergl(x=x, y=y, name="(row, E)", mode="markers", marker=dict(size=3, opacity=0.3, color=KEPT),
                               customdata=customdata(rows, which), meta={"customdata": ["row", "removal"]},
                               hovertemplate="row %{customdata[0]}, E = %{customdata[1]}<br>envelope %{x:.4g}, "
                               "η = %{y:.4g}<extra></extra>"))
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], name="η = envelope", mode="lines", line=dict(color=REMOVED),
                             hoverinfo="skip"))
    layer = layers[0]
    n_bad = int((~holds).sum())
    return finish(fig, ("" if layer is None else f"Layer {layer}: ") + f"every removal set, every observer row "
                  f"({len(envs)} removals × {max(n)} rows" + (f"; {n_bad} above the envelope)" if n_bad else ")"),
                  figure_meta("envelope_scatter", model_id, params, layer=layer, n_removals=len(envs), n_points=int(len(x)),
                              all_hold=n_bad == 0),
                  xaxis_title="envelope min{1, q/ω, q + √(D_χ² q(1−q))}", yaxis_title="actual η = A_a(E)",
                  legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))


# ============================================================================= stability and cost (SPEC §7)
@figure_function
def drift(stability, *, model_id: str | None = None, params=None) -> go.Figure:
    """Drift ``‖X^l|_R − Y^l‖_{max,2}`` per layer after ``l*`` (log scale), the block defects ``e_l``, and the
    first-token certificate ``m > 2ΛΔ_L``: the dashed line is ``m/(2Λ)``, the largest ``Δ_L`` it certifies.
    """
    layers = sorted(stability.drift)
    if not layers:
        raise ValueError("stability: has no drift values (no layer after l*)")
    d = [stability.drift[l] for l in layers]
    fig = Draft()
    fig.add_trace(go.Scatter(x=layers, y=plot_array(d), name="drift", mode="lines+markers", line=dict(color=KEPT),
                             hovertemplate="X^%{x}: drift %{y:.4g}<extra></extra>"))
    dl = sorted(stability.defects)
    fig.add_trace(go.Scatter(x=dl, y=plot_array([stability.defects[l] for l in dl]), name="defect e_l", mode="markers",
                             marker=dict(color=PALETTE[1], symbol="diamond", size=7),
                             hovertemplate="X^%{x}: e = %{y:.4g}<extra></extra>"))
    Ll = layers[-1]
    fig.add_trace(go.Scatter(x=[Ll], y=plot_array([stability.Delta_L]), name="Δ_L", mode="markers",
                             marker=dict(color=REMOVED, size=12, symbol="star"),
                             hovertemplate="Δ_L = %{y:.4g}<extra></extra>"))
    thr = stability.margin / (2 * stability.Lambda) if stability.Lambda > 0 else math.inf
    fig.add_trace(go.Scatter(x=[layers[0], Ll], y=plot_array([thr, thr]), name="m/(2Λ)", mode="lines",
                             line=dict(color=NEUTRAL, dash="dash"),
                             hovertemplate="certificate threshold m/(2Λ) = %{y:.4g}<extra></extra>"))
    s = stability.summary()
    verdict = "certified" if stability.certified else "not certified"
    agree = "same first token" if stability.agree_first_token else "first token differs"
    fig.add_annotation(x=0.99, y=0.02, xref="paper", yref="paper", xanchor="right", yanchor="bottom", showarrow=False,
                       align="right", font=dict(size=10),
                       text=f"m = {stability.margin:.3g}, Λ = {stability.Lambda:.3g}<br>2ΛΔ_L = {s['two_Lambda_Delta']:.3g}"
                            f" → {verdict}; {agree}<br>composed bound {stability.composed_bound:.3g}")
    return finish(fig, f"Drift after l* = {stability.l_star}: {verdict}",
                   figure_meta("drift", model_id, params, **s),
                   # no fixed step: one label a layer stacked at one column over a 30-layer model's drift; the paper
                   # layout's whole-number ticks keep the labels on layers
                   xaxis_title="layer (block input X^l)", yaxis_title="‖X|_R − Y‖_max,2", yaxis=dict(type="log"),
                   legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))


def break_even(cost_grid, *, model_id: str | None = None, params=None) -> go.Figure:
    """Cost of pruned prefill from a :class:`~workbench.analyse.cost.CostGrid`: left, ``F_EP/F_full`` against the
    kept fraction ``T'/T`` for every ``l*`` (1 = break even); right, the break-even ``T'/T`` against ``l*``."""
    df = check_frame("cost_grid", cost_grid.to_frame() if hasattr(cost_grid, "to_frame") else cost_grid,
                     ("l_star", "keep_fraction", "ratio", "T"))
    ls = sorted(df["l_star"].unique().tolist())
    fig = Draft.subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.22)
    cols = PALETTE if len(ls) <= len(PALETTE) else [
        c for c in _sample_scale(len(ls))]
    for i, l in enumerate(ls):
        sub = df[df["l_star"] == l].sort_values("keep_fraction")
        fig.add_trace(go.Scatter(x=sub["keep_fraction"].tolist(), y=sub["ratio"].tolist(), name=f"l* = {l}",
                                 mode="lines", line=dict(color=cols[i % len(cols)]),
                                 hovertemplate="l* = " + str(l) + ", T'/T = %{x:.3f}: F_EP/F_full = %{y:.4f}"
                                 "<extra></extra>"), 1, 1)
    add_span(fig, "hline", 1.0, line=dict(color=NEUTRAL, dash="dash", width=1), row=1, col=1)
    be = df.groupby("l_star")["break_even_keep_fraction"].max() if "break_even_keep_fraction" in df else None
    if be is not None:
        fig.add_trace(go.Scatter(x=be.index.tolist(), y=plot_array(be.to_numpy()), name="break-even T'/T",
                                 mode="lines+markers", line=dict(color="#000"), showlegend=False,
                                 hovertemplate="l* = %{x}: break even at T'/T = %{y:.4f}<extra></extra>"), 1, 2)
    fig.update_xaxes(title_text="kept fraction T'/T", row=1, col=1)
    fig.update_yaxes(title_text="F_EP / F_full", row=1, col=1)
    fig.update_xaxes(title_text="l* (gather after layer)", row=1, col=2)
    fig.update_yaxes(title_text="break-even T'/T", range=[0, 1.02], row=1, col=2)
    T = int(df["T"].iloc[0])
    return finish(fig, f"Pruned-prefill cost, T = {T}",
                   figure_meta("break_even", model_id, params, T=T, l_stars=ls,
                         keep_fractions=sorted(df["keep_fraction"].unique().tolist())),
                   aspect={"single": 0.95, "double": 0.5})


def _sample_scale(n: int) -> list[str]:

    return sample_colorscale(SEQUENTIAL, [i / max(n - 1, 1) for i in range(n)])


# ============================================================================= pages (SPEC §8)
PREVIEW_PAGES = 256
"""Pages up to which the pages figure's heatmap previews each page's text on hover (G × pages strings per move)."""


MARKER_COLUMNS = 60
"""Most kept-page marks per group on the pages figure: past this many pages the boxes (one per page) would touch
and merge into a bar over the heatmap, so the pages are binned and each bin with a kept page gets one thin tick."""


def _kept_page_marks(sel: np.ndarray, G: int) -> go.Scatter:
    """The kept pages of every group (``sel`` bool ``[G, N_P]``) as marks over the importance heatmap: an open box
    per page up to :data:`MARKER_COLUMNS` pages; past that, a thin tick at the centre of every bin of pages
    holding a kept one (at most :data:`MARKER_COLUMNS` a group, a bin's width apart at any ``T``), its hover naming
    how many pages of the bin are kept."""
    N_P = sel.shape[1]
    gs, ps = np.nonzero(sel)
    if N_P <= MARKER_COLUMNS:
        return go.Scatter(x=ps.tolist(), y=[f"g{g}" for g in gs.tolist()], name="kept page", mode="markers",
                          marker=dict(symbol="square-open", size=14, color=REMOVED, line=dict(width=2)),
                          hovertemplate="kept: g%{y} page %{x}<extra></extra>")
    mb = token_bins(N_P, MARKER_COLUMNS)
    b = np.searchsorted(mb.edges, ps, side="right") - 1
    key = gs * mb.n + b
    count = np.bincount(key, minlength=G * mb.n).reshape(G, mb.n)
    mg, mbin = np.nonzero(count)
    text = [f"{int(count[g, i])} of pages {int(mb.lo[i])}–{int(mb.hi[i])} kept" for g, i in zip(mg, mbin)]
    return go.Scatter(x=((mb.lo[mbin] + mb.hi[mbin]) / 2).tolist(), y=[f"g{g}" for g in mg.tolist()], name="kept page(s)",
                      mode="markers", marker=dict(symbol="line-ns-open", size=12, color=REMOVED, line=dict(width=1.5)),
                      customdata=customdata(text), meta={"customdata": ["kept"]},
                      hovertemplate="g%{y}: %{customdata[0]}<extra></extra>")


@figure_function
def pages(page_result, layer: int, spans=None, *, model_id: str | None = None, params=None) -> go.Figure:
    """Pages and GQA unions of a :class:`~workbench.analyse.pages.PageResult`.

    Top: page importance ``I_{l,g}(P)`` (group × page) at ``layer`` with the kept pages boxed (past
    :data:`MARKER_COLUMNS` pages: a thin tick per bin of pages with a kept one, so the marks stay apart);
    middle: the group scores ``p_{l,g}(j)`` over the prompt tokens (kept tokens filled, dropped ones open);
    bottom left: the page union ``U_l`` per layer with ``K`` and ``min{GK, N_P}``; bottom right: ``UOR_g``.
    """
    pr = page_result
    index_into(pr.L).check("layer", layer)
    sp = spans_of(spans)
    G, N_P = pr.importance.shape[1], pr.importance.shape[2]
    T = pr.p.shape[2]
    I = as_numpy(pr.importance[layer])
    sel = as_numpy(pr.selected[layer])
    pbins = token_bins(N_P)  # scale: ≤ DEFAULT_WIDTH_PX page columns (max importance per bin of pages)
    x_pages = pbins.lo
    if pbins.exact and N_P <= PREVIEW_PAGES:  # few pages: each cell's hover previews its tokens' text
        raw = list(sp.tokens) if sp is not None else None
        prev = [f"{P * pr.b}–{min((P + 1) * pr.b, T) - 1}: "
                + (text_preview(raw[P * pr.b:(P + 1) * pr.b], 60) if raw else "") for P in range(N_P)]
        hover, custom = "g%{y} page %{x} (tokens %{customdata})", dict(customdata=repeat_rows(prev, G),
                                                                       meta={"customdata": ["page"]})
    elif pbins.exact:  # the message stays bounded: the hover names the page; tokens = page × b
        hover, custom = f"g%{{y}} page %{{x}} (tokens from %{{x}}×{pr.b})", {}
    else:
        I = pbins.reduce(I, "max")
        hover, custom = f"g%{{y}} pages from %{{x}} ({pbins.describe()} pages of {pr.b} tokens)", {}
    fig = Draft.subplots(rows=3, cols=2, specs=[[{"colspan": 2}, None], [{"colspan": 2}, None], [{}, {}]],
                          row_heights=[0.34, 0.36, 0.3], horizontal_spacing=0.1, vertical_spacing=0.13)
    fig.add_trace(go.Heatmap(z=plot_array(I), x=x_pages, y=[f"g{g}" for g in range(G)], coloraxis="coloraxis",
                             name="importance", hovertemplate=hover + "<br>I = %{z:.4g}<extra></extra>", **custom), 1, 1)
    fig.add_trace(_kept_page_marks(sel, G), 1, 1)
    tm = as_numpy(pr.token_mask_of(layer))
    bins = token_bins(T)  # scale: ≤ DEFAULT_WIDTH_PX points per group (max per bin; kept = some token kept)
    if bins.exact:
        toks = hover_tokens(sp, T)
    else:  # the tokens' own labels are not built (O(T) per move); the CSV has every token
        toks, tm = bins.labels(), bins.any(tm)
    gst = categorical(G)
    for g in range(G):
        fig.add_trace(go.Scatter(x=bins.lo, y=bins.reduce(plot_array(pr.p[layer, g]), "max"), name=f"p g{g}", mode="lines+markers",
                                 line=dict(color=gst[g]["color"], dash=gst[g]["dash"], width=1),
                                 # kept: filled; dropped: white with the group's outline (a numeric colour array:
                                 # a per-point symbol list costs plotly ~50 ms of validation per 2k points)
                                 marker=dict(size=5, color=tm[g].astype(np.float32), cmin=0, cmax=1,
                                             colorscale=[[0, "white"], [1, gst[g]["color"]]], symbol=gst[g]["symbol"],
                                             line=dict(color=gst[g]["color"], width=1)),
                                 # the tokens alone (the same on every slider move: not re-sent); kept = colour
                                 customdata=customdata(toks), meta={"customdata": ["token"]},
                                 hovertemplate="g" + str(g) + " %{x}: %{customdata[0]}<br>p = %{y:.4g}"
                                 "<br>kept: %{marker.color}<extra></extra>"), 2, 1)
    L = pr.L
    fig.add_trace(go.Bar(x=np.arange(L), y=as_numpy(pr.U).tolist(), name="U_l", marker_color=KEPT, showlegend=False,
                         hovertemplate="layer %{x}: U = %{y} pages<extra></extra>"), 3, 1)
    add_span(fig, "hline", min(pr.K, N_P), line=dict(color=NEUTRAL, dash="dash", width=1), row=3, col=1)
    add_span(fig, "hline", min(G * pr.K, N_P), line=dict(color=NEUTRAL, dash="dot", width=1), row=3, col=1)
    for g in range(G):
        fig.add_trace(go.Scatter(x=np.arange(L), y=plot_array(pr.uor[:, g]), name=f"UOR g{g}", mode="lines",
                                 line=dict(color=gst[g]["color"], dash=gst[g]["dash"]), showlegend=False,
                                 hovertemplate="layer %{x}: UOR g" + str(g) + " = %{y:.3f}<extra></extra>"), 3, 2)
    add_span(fig, "vline", layer, line=dict(color="#000", dash="dot", width=1), row=3, col=1)
    add_span(fig, "vline", layer, line=dict(color="#000", dash="dot", width=1), row=3, col=2)
    fig.update_xaxes(title_text=f"page (b = {pr.b} tokens)" + ("" if pbins.exact else f"; bins of ≤ {pbins.width} pages"),
                     row=1, col=1)
    # the binning note on the x axis (the axis binned, as wide as the figure): on the y axis, a third of a narrow
    # figure's height, it would wrap to a column of lines that pushes the plots right and their x tick labels onto
    # the panels below
    fig.update_xaxes(title_text="prompt position" + (f"; {bins.describe()}" if not bins.exact else ""), row=2, col=1)
    fig.update_yaxes(title_text="group score p", row=2, col=1)
    fig.update_xaxes(title_text="layer", row=3, col=1)
    fig.update_yaxes(title_text="union U_l", row=3, col=1)
    fig.update_xaxes(title_text="layer", row=3, col=2)
    # UOR's labels at the right edge, under the colour bar's labels (the margin is there for them anyway): between the
    # panels they would need a gap sized from an estimate of the colour bar's room, short at a column's width
    fig.update_yaxes(title_text=f"UOR (s\u00a0=\u00a0{pr.s})", side="right", row=3, col=2)
    fig = finish(fig, f"Pages, layer {layer}: top-{pr.K} of {N_P} pages per group, U = {int(pr.U[layer])}",
                  figure_meta("pages", model_id_of(model_id, spans), params, layer=layer, b=pr.b, K=pr.K, s=pr.s, e=pr.e,
                        d=pr.d, bytes=pr.bytes),
                  coloraxis=dict(colorbar=dict(title=dict(text="I"), len=0.34, y=0.83)),
                  legend=dict(orientation="h", y=1.02, x=0, xanchor="left", yanchor="bottom"),
                  aspect={"single": 1.45, "double": 0.8})
    if not bins.exact:  # every token's group scores in the export's CSV
        p_l, m_l = as_numpy(pr.p[layer]), as_numpy(pr.token_mask_of(layer))
        attach_full(fig, lambda: pd.DataFrame({"group": np.repeat(np.arange(G), T), "x": np.tile(np.arange(T), G),
                                               "token": np.tile(np.asarray(hover_tokens(sp, T), dtype=object), G),
                                               "p": p_l.reshape(-1), "kept": m_l.reshape(-1)}))
    return fig


# ============================================================================= shift (SPEC §9)
@figure_function
def shift_steps(shift, *, level: ShiftLevel = "group", layer: int | None = None, model_id: str | None = None,
                params=None) -> go.Figure:
    """Prefill-vs-decode attention shift of a :class:`~workbench.analyse.shift.ShiftResult`.

    With ``layer=None``: heatmaps (layer × step) of the top-``k`` recall against the reference and of the
    JSD between adjacent rows, averaged over the heads or groups, and the mean recall gains per layer
    (``−1→0``, ``0→1`` (the boundary), ``1→2``, ``2→3``). With a ``layer``: one line per head/group instead.
    The dotted line marks the prefill/decode boundary (between ``r = 0`` and ``r = 1``).

    Args:
        level: ``"group"`` (KV groups) or ``"head"`` (query heads).
        layer: one layer to show per unit, or None for all layers.
    """
    SHIFT_CHECKS["level"].check("level", level)
    rec = as_numpy(shift.recall_group if level == "group" else shift.recall_head)  # [L, U, R]
    js = as_numpy(shift.jsd_group if level == "group" else shift.jsd_head)  # [L, U, R-1]
    L, U, R = rec.shape
    r = as_numpy(shift.r).tolist()
    rj = [x + 0.5 for x in r[:-1]]  # JSD between r and r+1 sits between them
    lf = shift.leap_frame()
    lf = lf[lf.level == level]
    gains = ["gain_m10", "gain_01", "gain_12", "gain_23"]
    glabel = {"gain_m10": "−1→0", "gain_01": "0→1", "gain_12": "1→2", "gain_23": "2→3"}
    unit = "g" if level == "group" else "h"
    if layer is None:
        fig = Draft.subplots(rows=3, cols=1, vertical_spacing=0.12, row_heights=[0.36, 0.36, 0.28])
        fig.add_trace(go.Heatmap(z=plot_array(rec.mean(1)), x=r, y=list(range(L)), coloraxis="coloraxis", name="recall",
                                 hovertemplate="layer %{y}, r = %{x}: recall %{z:.3f}<extra></extra>"), 1, 1)
        fig.add_trace(go.Heatmap(z=plot_array(js.mean(1)), x=rj, y=list(range(L)), coloraxis="coloraxis2", name="JSD",
                                 hovertemplate="layer %{y}, r→r+1 at %{x}: JSD %{z:.4f}<extra></extra>"), 2, 1)
        mean = shift.layer_gains(level)
        for i, g in enumerate(gains):
            fig.add_trace(go.Bar(x=mean.index.tolist(), y=plot_array(mean[g].to_numpy()), name=f"gain {glabel[g]}",
                                 marker_color=[NEUTRAL, REMOVED, KEPT, PALETTE[5]][i],
                                 hovertemplate="layer %{x}: recall gain " + glabel[g] + " = %{y:.3f}<extra></extra>"),
                          3, 1)
        fig.update_yaxes(title_text="layer", row=1, col=1)
        fig.update_yaxes(title_text="layer", row=2, col=1)
        fig.update_xaxes(title_text="layer", row=3, col=1)
        fig.update_layout(coloraxis=dict(colorscale=SEQUENTIAL, cmin=0, cmax=1,
                                         colorbar=dict(title=dict(text="recall"), len=0.3, y=0.85)),
                          coloraxis2=dict(colorscale=SEQUENTIAL, colorbar=dict(title=dict(text="JSD"), len=0.3, y=0.5)))
        where = f"mean over {level}s"
    else:
        index_into(L).check("layer", layer)
        fig = Draft.subplots(rows=3, cols=1, vertical_spacing=0.12, row_heights=[0.36, 0.36, 0.28])
        for u, st in enumerate(categorical(U)):  # colour, then dash and marker past 8
            style = dict(line=dict(color=st["color"], dash=st["dash"]), marker=dict(symbol=st["symbol"]))
            fig.add_trace(go.Scatter(x=r, y=plot_array(rec[layer, u]), name=f"{unit}{u}", mode="lines+markers", **style,
                                     legendgroup=f"{unit}{u}", hovertemplate=f"{unit}{u}" + ", r = %{x}: recall %{y:.3f}<extra></extra>"), 1, 1)
            fig.add_trace(go.Scatter(x=rj, y=plot_array(js[layer, u]), name=f"{unit}{u}", mode="lines+markers", **style,
                                     legendgroup=f"{unit}{u}", showlegend=False,
                                     hovertemplate=f"{unit}{u}" + ", r→r+1 at %{x}: JSD %{y:.4f}<extra></extra>"), 2, 1)
        sub = lf[lf.layer == layer].sort_values("unit")
        for i, g in enumerate(gains):
            fig.add_trace(go.Bar(x=[f"{unit}{u}" for u in sub["unit"]], y=plot_array(sub[g].to_numpy()), name=f"gain {glabel[g]}",
                                 marker_color=[NEUTRAL, REMOVED, KEPT, PALETTE[5]][i],
                                 hovertemplate="%{x}: recall gain " + glabel[g] + " = %{y:.3f}<extra></extra>"), 3, 1)
        fig.update_yaxes(title_text="recall", range=[0, 1.02], row=1, col=1)
        fig.update_yaxes(title_text="JSD", rangemode="tozero", row=2, col=1)
        fig.update_xaxes(title_text=level, row=3, col=1)
        where = f"layer {layer}, per {level}"
    for row in (1, 2):
        add_span(fig, "vline", 0.5, line=dict(color="#000", dash="dot", width=1), row=row, col=1)
    fig.update_xaxes(matches="x2", row=1, col=1)  # one step axis, titled once (below the second panel)
    fig.update_xaxes(title_text="step r (≤ 0 prompt tail, ≥ 1 decode)", row=2, col=1)
    fig.update_yaxes(title_text="recall gain", row=3, col=1)
    ref = f"decode {shift.ref_start}…{shift.ref_end}" if shift.ref_end >= 0 else "external reference"
    return finish(fig, f"Prefill→decode shift ({where}; top-{shift.k} recall vs {ref})",
                   figure_meta("shift_steps", model_id, params, level=level, layer=layer, k=shift.k, ref_start=shift.ref_start,
                         ref_end=shift.ref_end, r=r),
                   barmode="group", legend=dict(orientation="h", y=1.02, x=0, xanchor="left", yanchor="bottom"),
                   aspect={"single": 1.6, "double": 0.85})




_GAIN_NAMES = {"gain_m10": "−1 → 0 (in the prompt)", "gain_01": "0 → 1 (boundary)", "gain_12": "1 → 2",
               "gain_23": "2 → 3"}


def shift_gains(shift, *, held_out=None, level: ShiftLevel = "group", model_id: str | None = None,
                params=None) -> go.Figure:
    """The top-``k`` recall gain of each step per layer, averaged over the layer's KV groups (or heads):
    ``−1→0`` (the last step inside the prompt), ``0→1`` (the prefill/decode boundary), ``1→2``, ``2→3``
    (:meth:`~workbench.analyse.shift.ShiftResult.layer_gains`).

    Args:
        shift: a :class:`~workbench.analyse.shift.ShiftResult`.
        held_out: another ``ShiftResult`` of the same capture and ``k`` against another reference (e.g. the
            held-out decode rows): its boundary gain ``0→1`` is drawn dashed.
        level: ``"group"`` or ``"head"``.
    """
    g = shift.layer_gains(level)
    fig = Draft()
    for c, colour in zip(_GAIN_NAMES, (NEUTRAL, REMOVED, KEPT, PALETTE[5])):
        fig.add_trace(go.Scatter(x=g.index.to_numpy(), y=plot_array(g[c].to_numpy()), name=_GAIN_NAMES[c],
                                 mode="lines+markers", line=dict(color=colour),
                                 hovertemplate="layer %{x}: gain " + _GAIN_NAMES[c] + " = %{y:.3f}<extra></extra>"))
    held = None
    if held_out is not None:
        if held_out.k != shift.k or held_out.recall_group.shape[0] != shift.recall_group.shape[0]:
            raise ValueError(f"held_out: must be a ShiftResult of the same capture and k = {shift.k}, "
                             f"got k = {held_out.k}")
        gh = held_out.layer_gains(level)
        held = [held_out.ref_start, held_out.ref_end]
        fig.add_trace(go.Scatter(x=gh.index.to_numpy(), y=plot_array(gh["gain_01"].to_numpy()), mode="lines",
                                 name=f"0 → 1, held out (decode {held[0]}…{held[1]})",
                                 line=dict(color=REMOVED, dash="dash"),
                                 hovertemplate="layer %{x}: gain 0 → 1 (held out) = %{y:.3f}<extra></extra>"))
    add_span(fig, "hline", 0.0, line=dict(color="#000", width=1, dash="dot"))
    return finish(fig, f"Top-{shift.k} recall gain per step, mean over {level}s",
                  figure_meta("shift_gains", model_id, params, level=level, k=shift.k, ref_start=shift.ref_start,
                              ref_end=shift.ref_end, held_out_ref=held),
                  xaxis_title="layer", yaxis_title="recall gain", aspect={"single": 1.15, "double": 0.62},
                  legend=dict(orientation="h", y=1.02, x=0, xanchor="left", yanchor="bottom"))


def page_union_bounds(union, *, model_id: str | None = None, params=None) -> go.Figure:
    """The page union ``U_l`` (mean over layers) against the pages kept per group ``K``, between its bounds
    ``K`` (every group keeps the same pages) and ``min{GK, N_P}`` (all disjoint), from
    :meth:`~workbench.analyse.pages.PageSelection.union_by_K` (its ``attrs`` ``b``, ``s``, ``e`` go to the meta)."""
    need = {"K", "union", "lower", "upper"}
    if not hasattr(union, "columns") or not need <= set(union.columns):
        raise ValueError(f"union: must be a frame with columns {sorted(need)} (PageSelection.union_by_K), "
                         f"got {type(union).__name__}")
    if union.empty:
        raise ValueError("union: is empty")
    df = union.sort_values("K")
    K = df["K"].to_numpy()
    fig = Draft()
    for col, name, line in (("upper", "upper bound min{GK, N_P}", dict(color=NEUTRAL, dash="dot")),
                            ("union", "union U_l (mean over layers)", dict(color=KEPT)),
                            ("lower", "lower bound K", dict(color=NEUTRAL, dash="dash"))):
        fig.add_trace(go.Scatter(x=K, y=plot_array(df[col].to_numpy()), name=name, mode="lines+markers", line=line,
                                 hovertemplate="K = %{x}: " + name + " = %{y:.3g}<extra></extra>"))
    return finish(fig, "Page union U_l (mean over layers) against its bounds",
                  figure_meta("page_union_bounds", model_id, params, Ks=K.tolist(), **dict(union.attrs)),
                  xaxis_title="pages kept per group K", yaxis_title="pages", yaxis=dict(rangemode="tozero"),
                  xaxis=dict(tickmode="array", tickvals=K.tolist()),
                  legend=dict(orientation="h", y=1.02, x=0, xanchor="left", yanchor="bottom"))
