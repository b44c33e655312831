"""Figures of the shallow-certificate counterexample (paper §6.1, :mod:`workbench.analyse.counterexample`):
the last query's shallow and deep attention rows, the first-token logits with and without ``j*``, and the
deletion error against the shallow mass ``ε``."""

import numpy as np
import plotly.graph_objects as go

from workbench.show.figure_engine import Draft, figure_function, figure_meta, finish, plot_array
from workbench.show.theme import KEPT, PALETTE, categorical


def _construction_meta(result) -> dict:
    c = result.construction
    return {"eps": c.eps, "gamma": c.gamma, "V": c.V, "beta": c.beta, "eps_audit": c.eps_audit, "T": c.T,
            "j_star": c.j_star}


def _check_result(result) -> None:
    if not all(hasattr(result, a) for a in ("construction", "logits", "shallow", "deep")):
        raise ValueError(f"result: must be a CounterexampleResult (ShallowCounterexample(...)()), "
                         f"got {type(result).__name__}")


@figure_function
def counterexample_rows(result, *, model_id: str | None = None, params=None) -> go.Figure:
    """Prompt A's last query: its shallow attention row (mass ``ε`` on ``j*``) beside the deep head's row (mass
    ``1 − γ`` on ``j*``), over the key positions, on a log scale.

    Args:
        result: a :class:`~workbench.analyse.counterexample.CounterexampleResult`.
    """
    _check_result(result)
    c = result.construction
    x = np.arange(c.T)
    fig = Draft()
    fig.add_trace(go.Bar(x=x, y=plot_array(result.shallow), name="shallow layer", marker_color="#000000",
                         hovertemplate="key %{x}: shallow attention %{y:.3g}<extra></extra>"))
    fig.add_trace(go.Bar(x=x, y=plot_array(result.deep), name="deep head", marker_color=PALETTE[2],
                         hovertemplate="key %{x}: deep attention %{y:.3g}<extra></extra>"))
    return finish(fig, f"Prompt A, last query: shallow vs deep row (j* = {c.j_star})",
                  figure_meta("counterexample_rows", model_id, params, **_construction_meta(result)),
                  barmode="group", xaxis_title="key position j", yaxis_title="attention", yaxis=dict(type="log", dtick=1),
                  xaxis=dict(dtick=1), legend=dict(orientation="h", y=1.02, x=0, xanchor="left", yanchor="bottom"))


@figure_function
def counterexample_logits(result, *, model_id: str | None = None, params=None) -> go.Figure:
    """The two first-token logits ``z = (o, −o + β)`` of prompts A and B, full and with ``E = {j*}`` removed
    after the shallow layer (grouped bars).

    Args:
        result: a :class:`~workbench.analyse.counterexample.CounterexampleResult`.
    """
    _check_result(result)
    keys = list(result.logits)
    labels = [f"{p} · {run}" for p, run in keys]
    z = np.array([[float(v) for v in result.logits[k]] for k in keys])  # [4, 2]
    fig = Draft()
    for tok, colour in ((0, KEPT), (1, PALETTE[1])):
        fig.add_trace(go.Bar(x=labels, y=plot_array(z[:, tok]), name=f"logit of token {tok}", marker_color=colour,
                             hovertemplate="%{x}: z" + str(tok) + " = %{y:.4f}<extra></extra>"))
    first = result.first_tokens()
    return finish(fig, "First-token logits: full vs reduced (E = {j*})",
                  figure_meta("counterexample_logits", model_id, params, **_construction_meta(result),
                              errors=list(result.errors),
                              first_tokens={f"{p} {run}": t for (p, run), t in first.items()}),
                  barmode="group", yaxis_title="logit", xaxis_title="prompt · run (A: c = +V, B: c = −V)",
                  legend=dict(orientation="h", y=1.02, x=0, xanchor="left", yanchor="bottom"))


def counterexample_errors(sweep, *, model_id: str | None = None, params=None) -> go.Figure:
    """The deletion error ``|o_A − o_A,R|`` against the shallow mass ``ε`` (log–log), one line per ``γ``, with the
    shallow mass on ``j*`` itself (dashed) and ``V`` (dotted, from ``sweep.attrs``).

    Args:
        sweep: the frame of :func:`~workbench.analyse.counterexample.deletion_sweep`
            (columns ``eps, gamma, shallow_mass, error, bound``).
    """
    need = {"eps", "gamma", "shallow_mass", "error", "bound"}
    if not hasattr(sweep, "columns") or not need <= set(sweep.columns):
        raise ValueError(f"sweep: must be a frame with columns {sorted(need)} (deletion_sweep), "
                         f"got {type(sweep).__name__}")
    if sweep.empty:
        raise ValueError("sweep: is empty")
    gammas = list(dict.fromkeys(sweep["gamma"].tolist()))
    fig = Draft()
    for g, st in zip(gammas, categorical(len(gammas))):
        sub = sweep[sweep["gamma"] == g].sort_values("eps")
        fig.add_trace(go.Scatter(x=sub["eps"].to_numpy(), y=plot_array(sub["error"].to_numpy()), mode="lines+markers",
                                 name=f"deletion error, γ = {g:g}", line=dict(color=st["color"], dash=st["dash"]),
                                 marker=dict(symbol=st["symbol"]),
                                 hovertemplate="ε = %{x:.1e}: error %{y:.4g}<extra>γ = " + f"{g:g}" + "</extra>"))
    mass = sweep.sort_values("eps").groupby("eps", sort=True)["shallow_mass"].first()
    fig.add_trace(go.Scatter(x=mass.index.to_numpy(), y=plot_array(mass.to_numpy()), mode="lines",
                             name="shallow mass on j*", line=dict(color="#000000", dash="dash"),
                             hovertemplate="ε = %{x:.1e}: shallow mass %{y:.3g}<extra></extra>"))
    V = sweep.attrs.get("V")
    if V is not None:  # a line trace, not a shape: shape annotations sit at log10 positions on a log axis
        ends = mass.index.to_numpy()[[0, -1]]
        fig.add_trace(go.Scatter(x=ends, y=plot_array([float(V)] * 2), mode="lines", name=f"V = {float(V):g}",
                                 line=dict(color=PALETTE[7], dash="dot", width=1),
                                 hovertemplate="V = %{y:.4g}<extra></extra>"))
    return finish(fig, "Shallow mass → 0, deletion error stays ≥ (1−γ)V",
                  figure_meta("counterexample_errors", model_id, params, gammas=gammas,
                              eps=sorted(set(sweep["eps"].tolist())), **dict(sweep.attrs)),
                  xaxis_title="ε", yaxis_title="mass / error", xaxis=dict(type="log", dtick=2),
                  yaxis=dict(type="log", dtick=3), aspect={"single": 1.05, "double": 0.62},
                  legend=dict(orientation="h", y=1.02, x=0, xanchor="left", yanchor="bottom"))
