"""Figures of a quantity against one setting, one line per another, from a tidy frame the caller computed on one
capture: the head weights over ζ × τ (SPEC §2), the answer chunk's rank per layer under each priority (SPEC §3),
the greedy removal and its certificate over target × ε_row (SPEC §5), the Hoeffding radius over m_a × δ (SPEC §6).
Each function reads its columns and draws them; the numbers come from the analysis the caller ran."""

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench.analyse.audit import AUDIT_CHECKS
from workbench.checks import Interval
from workbench.constraints import PARAMS, register_all
from workbench.show.figure_engine import (
    Draft,
    add_span,
    figure_meta,
    finish,
    plot_array,
)
from workbench.show.plots.common import check_frame
from workbench.show.theme import NEUTRAL, categorical

_CHECKS = register_all("sensitivity", {"answer_chunk": Interval("int", 0), "J": AUDIT_CHECKS["J"],
                                       "H_Q": AUDIT_CHECKS["H_Q"]}, __name__)
"""The figures' scalar arguments (``J``, ``H_Q``: those of :func:`~workbench.analyse.audit.hoeffding_b`)."""
_LEGEND_ABOVE = dict(orientation="h", y=1.02, x=0, xanchor="left", yanchor="bottom")


def _values(s: pd.Series) -> list:
    """The distinct values of a column in their first order."""
    return list(dict.fromkeys(s.tolist()))


def _num(s: pd.Series) -> np.ndarray:
    return plot_array(pd.to_numeric(s, errors="coerce").to_numpy(dtype=float))


def _style(st: dict) -> dict:
    return dict(line=dict(color=st["color"], dash=st["dash"]), marker=dict(symbol=st["symbol"]))


def _aspect(n_entries: int) -> dict:
    """Export height / width per column preset for one panel under a legend of ``n_entries`` (its rows are
    reserved above the plot: a single column holds about two entries a row)."""
    return {"single": round(0.7 + 0.07 * n_entries, 3), "double": round(0.5 + 0.02 * n_entries, 3)}


# ============================================================================= pooling (SPEC §2)
def head_weights(frame: pd.DataFrame, *, layer: int | None = None, model_id: str | None = None,
                 params=None) -> go.Figure:
    """Head weights ``w_h`` against the temperature ``τ`` (log axis), one panel per floor ``ζ`` (two panels a row),
    one line per head (colour, then dash and marker past 8 heads), from a frame with columns ``zeta, tau, head, w``
    (one row per setting and head, e.g. ``HeadPooling(zeta=…, tau=…)(capture).w[layer]``).

    Args:
        frame: the weights; panels and lines in the frame's order of ``zeta`` and ``head``, points sorted by ``tau``.
        layer: the layer the weights are of (title and ``meta``).
    """
    d = check_frame("frame", frame, ("zeta", "tau", "head", "w"))
    zetas, heads = _values(d["zeta"]), _values(d["head"])
    cols = min(len(zetas), 2)
    rows = math.ceil(len(zetas) / cols)
    fig = Draft.subplots(rows=rows, cols=cols, shared_yaxes=True, horizontal_spacing=0.08, vertical_spacing=0.12)
    styles = categorical(len(heads))
    for i, z in enumerate(zetas):
        r, c = i // cols + 1, i % cols + 1
        for head, st in zip(heads, styles):
            sub = d[(d["zeta"] == z) & (d["head"] == head)].sort_values("tau")
            fig.add_trace(go.Scatter(x=_num(sub["tau"]), y=_num(sub["w"]), name=str(head), mode="lines+markers",
                                     legendgroup=str(head), showlegend=i == 0, **_style(st),
                                     hovertemplate=f"{head}, ζ = {z:g}: τ = %{{x:g}}, w = %{{y:.4f}}<extra></extra>"),
                          r, c)
        fig.add_annotation(x=0.98, y=0.98, xref="x domain", yref="y domain", xanchor="right", yanchor="top",
                           text=f"ζ = {z:g}", showarrow=False, font=dict(size=11), row=r, col=c)
        if r == rows or i + cols >= len(zetas):
            fig.update_xaxes(title_text="τ", row=r, col=c)
        if c == 1:
            fig.update_yaxes(title_text="w_h", row=r, col=c)
    fig.update_xaxes(type="log")
    fig.update_yaxes(range=[0, 1.05])
    where = "" if layer is None else f"Layer {layer}: "
    return finish(fig, f"{where}head weight w_h against τ, one panel per ζ",
                  figure_meta("head_weights", model_id, params, layer=layer, zetas=zetas,
                              taus=sorted(_values(d["tau"])), heads=[str(h) for h in heads]),
                  legend=_LEGEND_ABOVE, aspect={"single": 0.45 + 0.5 * rows, "double": 0.25 + 0.28 * rows})


# ============================================================================= priorities (SPEC §3)
def answer_rank(frame: pd.DataFrame, *, answer_chunk: int | None = None, model_id: str | None = None,
                params=None) -> go.Figure:
    """The answer chunk's rank per layer (0 = the highest priority, removed last), one line per priority, from a
    frame with columns ``layer, method, rank`` (lines in the frame's order of ``method``).

    Args:
        answer_chunk: the answer chunk's index (title and ``meta``).
    """
    d = check_frame("frame", frame, ("layer", "method", "rank"))
    if answer_chunk is not None:
        _CHECKS["answer_chunk"].check("answer_chunk", answer_chunk)
    methods = _values(d["method"])
    fig = Draft()
    for m, st in zip(methods, categorical(len(methods))):
        sub = d[d["method"] == m].sort_values("layer")
        fig.add_trace(go.Scatter(x=_num(sub["layer"]), y=_num(sub["rank"]), name=str(m), mode="lines+markers",
                                 **_style(st), hovertemplate=f"{m}, layer %{{x}}: rank %{{y}}<extra></extra>"))
    which = "" if answer_chunk is None else f" c{answer_chunk}"
    return finish(fig, f"Rank of the answer chunk{which} (0 = kept longest)",
                  figure_meta("answer_rank", model_id, params, answer_chunk=answer_chunk, methods=[str(m) for m in methods],
                              layers=sorted(_values(d["layer"]))),
                  xaxis_title="layer", yaxis_title="answer chunk's rank", yaxis=dict(rangemode="tozero"),
                  legend=_LEGEND_ABOVE, aspect=_aspect(len(methods)))


# ============================================================================= selection (SPEC §5)
def removal_budget(frame: pd.DataFrame, *, layer: int | None = None, model_id: str | None = None,
                   params=None) -> go.Figure:
    """The greedy removal ``D_l`` (solid) and the LP bound ``U_l`` (dashed) against the saving target, one colour per
    row tolerance ``ε_row``, with the diagonal ``D = target`` (dotted), from a frame with columns
    ``eps_row, target, D, U`` (target in tokens; one row per setting, e.g. ``GreedySelection(...).select(...)``).
    Where ``U_l`` lies below the diagonal the target is provably infeasible at that ``ε_row``.

    Args:
        layer: the layer the selections are of (title and ``meta``).
    """
    d = check_frame("frame", frame, ("eps_row", "target", "D", "U"))
    eps = sorted(_values(d["eps_row"]))
    fig = Draft()
    for e, st in zip(eps, categorical(len(eps))):
        sub = d[d["eps_row"] == e].sort_values("target")
        for col, dash, mode in (("D", "solid", "lines+markers"), ("U", "dash", "lines")):  # one legend entry
            fig.add_trace(go.Scatter(x=_num(sub["target"]), y=_num(sub[col]), name=f"ε_row = {e:g}", mode=mode,
                                     legendgroup=f"ε_row = {e:g}", showlegend=col == "D",
                                     line=dict(color=st["color"], dash=dash), marker=dict(symbol=st["symbol"]),
                                     hovertemplate=f"ε_row = {e:g}, target %{{x}}: {col}_l = %{{y:.4g}} tokens"
                                     "<extra></extra>"))
    t = np.unique(_num(d["target"]))
    fig.add_trace(go.Scatter(x=t, y=t, name="D = target", mode="lines", line=dict(color=NEUTRAL, dash="dot"),
                             hoverinfo="skip"))
    where = "" if layer is None else f"Layer {layer}: "
    return finish(fig, f"{where}greedy removal D_l (solid) and LP bound U_l (dashed) against the target",
                  figure_meta("removal_budget", model_id, params, layer=layer, eps_rows=eps,
                              targets=t.tolist()),
                  xaxis_title="saving target (tokens)", yaxis_title="tokens (solid D_l, dashed U_l)",
                  legend=_LEGEND_ABOVE, aspect=_aspect(len(eps) + 1))


# ============================================================================= audit (SPEC §6)
def hoeffding_radius(frame: pd.DataFrame, *, eps_audit: float | None = None, J: int | None = None,
                     H_Q: int | None = None, model_id: str | None = None, params=None) -> go.Figure:
    """The Hoeffding radius ``b = √(ln(J H_Q/δ) / (2 m_a))`` against the sample size ``m_a`` (log axis), one line
    per failure probability ``δ``, from a frame with columns ``m_a, delta, b`` (e.g. ``audit.hoeffding_b``);
    ``eps_audit`` is drawn dashed: where ``b`` is above it no layer can pass the sampled audit.

    Args:
        eps_audit: the audit tolerance ``ε_audit`` to draw (None: no line).
        J, H_Q: the monitored layers and query heads the radii are for (title and ``meta``).
    """
    d = check_frame("frame", frame, ("m_a", "delta", "b"))
    if eps_audit is not None:
        eps_audit = PARAMS["eps_audit"].check("eps_audit", eps_audit)
    if J is not None:
        _CHECKS["J"].check("J", J)
    if H_Q is not None:
        _CHECKS["H_Q"].check("H_Q", H_Q)
    deltas = sorted(_values(d["delta"]))
    fig = Draft()
    for dl, st in zip(deltas, categorical(len(deltas))):
        sub = d[d["delta"] == dl].sort_values("m_a")
        fig.add_trace(go.Scatter(x=_num(sub["m_a"]), y=_num(sub["b"]), name=f"δ = {dl:g}", mode="lines+markers",
                                 **_style(st), hovertemplate=f"δ = {dl:g}, m_a = %{{x}}: b = %{{y:.4f}}<extra></extra>"))
    if eps_audit is not None:
        add_span(fig, "hline", eps_audit, line=dict(color=NEUTRAL, dash="dash", width=1), annotation_text="ε_audit",
                 annotation_font=dict(size=10))
    title = "Hoeffding radius b" + (f" (J = {J} layers, H_Q = {H_Q})" if J is not None and H_Q is not None else "")
    if eps_audit is not None:
        title += f"; dashed: ε_audit = {eps_audit:g}"
    return finish(fig, title,
                  figure_meta("hoeffding_radius", model_id, params, eps_audit=eps_audit, J=J, H_Q=H_Q,
                              deltas=deltas, m_a=sorted(_values(d["m_a"]))),
                  xaxis_title="audit sample size m_a", yaxis_title="radius b", xaxis=dict(type="log"),
                  yaxis=dict(rangemode="tozero"), legend=_LEGEND_ABOVE, aspect=_aspect(len(deltas)))
