"""Figures of runs and studies: kept positions under eviction, accuracy against budget, KV-byte tables."""

import html
import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

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
    answer_chunk,
    customdata,
    hover_tokens,
    model_id_of,
    repeat_rows,
    spans_of,
)
from workbench.show.theme import (
    ANSWER,
    NEUTRAL,
    PALETTE,
    categorical,
)
from workbench.util import jsonable


# ============================================================================= eviction (DeferKV and peers)
def _highlight_positions(highlight, sp, T: int) -> list[int]:
    """Positions from a list of ints or a text occurring in the prompt (matched on the token strings)."""
    if highlight is None:
        return []
    if isinstance(highlight, str):
        if sp is None:
            raise ValueError("highlight: a text needs the prompt's tokens (pass a Prompt or PromptSpans)")
        starts, pos = [], 0
        for t in sp.tokens:
            starts.append(pos)
            pos += len(t)
        text = "".join(sp.tokens)
        at = text.find(highlight)
        if at < 0:
            raise ValueError("highlight: the text does not occur in the prompt's tokens")
        end = at + len(highlight)
        return [j for j, (s, t) in enumerate(zip(starts, sp.tokens)) if s < end and s + len(t) > at]
    out = sorted({int(p) for p in highlight})
    bad = [p for p in out if not 0 <= p < T]
    if bad:
        raise ValueError(f"highlight: positions must be in [0, {T - 1}], got {bad[:5]}")
    return out


@figure_function
def kept_positions(results, prompt, highlight=None, *, layer: int | None = None, group: int | None = None,
                   highlight_name: str | None = None, model_id: str | None = None, params=None) -> go.Figure:
    """Prompt positions each eviction run kept: one heatmap row per (policy, budget), one column per token.

    The cell is the fraction of (compacted layer, KV group) caches that kept the position (or 0/1 for one
    ``layer`` and ``group``). Highlighted positions (the needle) are marked with green ticks on top and, outside the
    answer passage, a shaded band; the answer passage (when the prompt knows it) is outlined, not filled. Row labels
    give the share of the highlighted positions kept (``GenerationResult.survival``); the x title names what it is
    a share of.

    Args:
        results: ``GenerationResult`` list (e.g. ``run_policies``), all on the same prompt.
        prompt: the ``Prompt`` (or ``PromptSpans`` / ``Capture``) for the tokens.
        highlight: positions to mark, or a text occurring in the prompt (e.g. the needle).
        layer, group: one cache to show instead of the fraction over all compacted caches.
        highlight_name: what the highlighted positions are, for the x title ("(%): share of answer doc kept");
            default "highlighted text" for a text, "highlighted tokens" for positions.
    """
    results = list(results)
    if not results:
        raise ValueError("results: must not be empty")
    sp = spans_of(prompt)
    T = results[0].T
    if any(r.T != T for r in results):
        raise ValueError("results: must all be runs on the same prompt (equal T)")
    if sp is not None and sp.T != T:
        raise ValueError(f"prompt: has T = {sp.T} tokens, the results T = {T}")
    Lr, G = results[0].kept.shape[:2]
    if layer is not None:
        index_into(Lr).check("layer", layer)
    if group is not None:
        index_into(G).check("group", group)
    hi = _highlight_positions(highlight, sp, T)
    if highlight_name is None:
        highlight_name = "highlighted text" if isinstance(highlight, str) else "highlighted tokens"
    elif not isinstance(highlight_name, str) or not highlight_name.strip():
        raise ValueError(f"highlight_name: must be a non-empty text, got {highlight_name!r}")
    z, labels = [], []
    for r in results:
        kp = as_numpy(r.kept_prompt)
        m = np.zeros((kp.shape[0], kp.shape[1], T), dtype=bool)
        li, gi, _ = np.indices(kp.shape)
        m[li, gi, kp] = True
        layers = list(range(kp.shape[0])) if r.policy == "full" else list(r.compacted_layers)
        if layer is not None:
            layers = [layer]
        groups = list(range(kp.shape[1])) if group is None else [group]
        z.append(m[np.ix_(layers, groups)].reshape(-1, T).mean(0).tolist() if layers else [math.nan] * T)
        lab = f"{r.policy} B={'all' if r.policy == 'full' else r.budget}"
        if hi:
            surv = as_numpy(r.survival(hi))
            sub = surv[np.ix_(layers, groups)] if layers else np.array([math.nan])
            # the share only: its long name ran the labels off a one-column canvas; the x title names it
            lab += f" ({np.nanmean(sub):.0%})" if np.isfinite(sub).any() else ""
        labels.append(lab)
    toks = hover_tokens(sp, T)
    bins = token_bins(T)  # scale: ≤ DEFAULT_WIDTH_PX cells per row (mean kept fraction per bin of tokens)
    z_full = np.asarray(z, dtype=float)
    cells = plot_array(bins.reduce(z_full, "mean")) if not bins.exact else plot_array(z)
    cell_toks = bins.labels(toks)
    fig = Draft.subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.07, 0.93], vertical_spacing=0.01)
    hover_share = f"<br>(%): share of {highlight_name} kept" if hi else ""
    fig.add_trace(go.Scatter(x=hi, y=[0] * len(hi), name="highlight", mode="markers", showlegend=False,
                             marker=dict(symbol="triangle-down", color=ANSWER, size=9),
                             customdata=np.array([toks[p] for p in hi], dtype=object), meta={"customdata": ["token"]},
                             hovertemplate="%{x}: %{customdata}<extra>highlight</extra>"), 1, 1)
    fig.add_trace(go.Heatmap(z=cells, x=bins.lo, y=labels, coloraxis="coloraxis", name="kept",
                             customdata=repeat_rows(cell_toks, len(results)), meta={"customdata": ["token"]},
                             hovertemplate="%{y}<br>%{x}: %{customdata}<br>kept %{z:.2f}" + hover_share + "<extra></extra>"), 2, 1)
    ans = answer_chunk(sp)
    inside = range(*sp.chunks[ans]) if ans is not None else range(0)
    for p in hi:
        if p not in inside:  # the outline marks those: a band over the whole passage hid its cells
            add_span(fig, "vrect", p - 0.5, p + 0.5, fillcolor=ANSWER, opacity=0.2, line_width=0, row=2, col=1)
    if ans is not None:
        s, e = sp.chunks[ans]
        # the label runs from the passage's edge into the side with more room: from its left edge, a passage near the
        # end of the prompt put the label over the colour bar at one column
        add_span(fig, "vrect", s - 0.5, e - 0.5, line=dict(color=ANSWER, width=1.5), fillcolor="rgba(0,0,0,0)",
                      annotation_text="answer passage", annotation_position="top left" if T - s >= e else "top right",
                      annotation_font=dict(size=10, color="#fff"), row=2, col=1)
    fig.update_yaxes(visible=False, range=[-1, 1], row=1, col=1)
    fig.update_xaxes(showline=False, ticks="", showgrid=False, row=1, col=1)
    # no y title: the row labels name the policy and the budget, and at one column they fill the left margin
    fig.update_yaxes(autorange="reversed", row=2, col=1)
    fig.update_xaxes(title_text="prompt position" + hover_share.replace("<br>", "; "), range=[-0.5, T - 0.5], row=2, col=1)
    where = "fraction of compacted caches" if layer is None and group is None else \
        f"layer {'all' if layer is None else layer}, group {'all' if group is None else group}"
    if not bins.exact:
        where += f"; {bins.describe('mean')}"
    fig = finish(fig, f"Kept prompt positions per policy ({where})",
                   figure_meta("kept_positions", model_id_of(model_id, prompt), params, highlight=hi, layer=layer, group=group,
                         highlight_name=highlight_name if hi else None, runs=[{"policy": r.policy, "budget": r.budget, **jsonable(r.params)} for r in results]),
                   coloraxis=dict(cmin=0, cmax=1, colorbar=dict(title=dict(text="kept"))), margin=dict(l=160))
    if not bins.exact:  # every token of every run in the export's CSV
        attach_full(fig, lambda: pd.DataFrame({"run": np.repeat(labels, T), "x": np.tile(np.arange(T), len(labels)),
                                               "token": np.tile(np.asarray(toks, dtype=object), len(labels)),
                                               "kept": z_full.reshape(-1)}))
    return fig


def deferkv_weights(policies, *, model_id: str | None = None, params=None) -> go.Figure:
    """DeferKV's row weights ``α_r`` over ``r = −W+1 … 0, 1`` (``DeferKV.alpha()``: ``α_r ∝ exp(λr)``, or the
    decode row's fixed ``decode_weight``), one line per policy; the dotted line is the prefill/decode boundary.

    Args:
        policies: ``DeferKV`` policies (anything with ``alpha()``, ``window``, ``lam``, ``decode_weight``).
    """
    policies = list(policies)
    if not policies:
        raise ValueError("policies: must hold at least one DeferKV policy, got none")
    bad = [type(p).__name__ for p in policies if not (callable(getattr(p, "alpha", None)) and hasattr(p, "window"))]
    if bad:
        raise ValueError(f"policies: must be DeferKV policies (with alpha() and window), got {bad}")
    fig = Draft()
    for p, st in zip(policies, categorical(len(policies))):
        a = plot_array(p.alpha())
        W = int(p.window)
        if a.shape != (W + 1,):
            raise ValueError(f"policies: alpha() must give W + 1 = {W + 1} weights, got shape {list(a.shape)}")
        name = f"λ = {p.lam:g}" + ("" if p.decode_weight is None else f", decode weight {p.decode_weight:g}")
        fig.add_trace(go.Scatter(x=np.arange(-W + 1, 2), y=a, name=name, mode="lines+markers",
                                 line=dict(color=st["color"], dash=st["dash"]), marker=dict(symbol=st["symbol"], size=5),
                                 hovertemplate="r = %{x}: α = %{y:.4g}<extra>" + html.escape(name) + "</extra>"))
    add_span(fig, "vline", 0.5, line=dict(color="#000", dash="dot", width=1))
    windows = sorted({int(p.window) for p in policies})
    return finish(fig, "DeferKV weights α_r" + (f" (W = {windows[0]})" if len(windows) == 1 else ""),
                  figure_meta("deferkv_weights", model_id, params, policies=[
                      {"lam": float(p.lam), "window": int(p.window),
                       "decode_weight": None if p.decode_weight is None else float(p.decode_weight)} for p in policies]),
                  xaxis_title="row r (≤ 0 prompt tail, 1 first decode row)", yaxis_title="α_r",
                  yaxis=dict(rangemode="tozero"),
                  legend=dict(orientation="h", y=1.02, x=0, xanchor="left", yanchor="bottom"))


# ============================================================================= sweep tables
_METRICS = ("em", "f1", "contains", "correct", "first_token_agree", "kept_mean")
_XLABEL = {"p_budget": "KV budget B (tokens per layer and group)", "budget": "KV budget B (tokens per layer and group)",
           "retained_fraction": "retained fraction T'/T", "p_target": "saving target", "retained_tokens": "retained tokens"}


def _ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    if "error" in df.columns:
        df = df[df["error"].isna() | (df["error"].astype(str) == "")]
    return df


def _default_x(df: pd.DataFrame) -> str:
    for c in ("p_budget", "budget"):
        if c in df.columns and pd.to_numeric(df[c], errors="coerce").notna().any():
            return c
    if {"retained_tokens", "prompt_tokens"} <= set(df.columns):
        return "retained_fraction"
    raise ValueError("x: the frame has no budget column (p_budget, budget) nor retained_tokens/prompt_tokens; "
                     "name one with x=")


def accuracy_vs_budget(df: pd.DataFrame, *, metric: str = "f1", x: str | None = None, by: str | Sequence[str] = "method",
                       model_id: str | None = None, params=None) -> go.Figure:
    """Accuracy against budget per method, from a sweep frame (``workbench.study.sweep``): one line per ``by``
    group with the mean ``metric`` over items and ± its standard error; groups without a budget
    (e.g. ``full``) are a horizontal dashed reference line.

    Args:
        df: sweep frame (rows with an ``error`` are left out).
        metric: a numeric column, e.g. ``"f1"``, ``"em"``, ``"contains"``.
        x: budget column (default ``p_budget``, else ``retained_fraction`` = ``retained_tokens/prompt_tokens``).
        by: column(s) defining the lines (default ``"method"``).
    """
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df: must be a pandas DataFrame, got {type(df).__name__}")
    if metric not in df.columns or not pd.api.types.is_numeric_dtype(pd.to_numeric(df[metric], errors="coerce")):
        raise ValueError(f"metric: must be a numeric column of df, e.g. {[c for c in _METRICS if c in df.columns]}, "
                         f"got {metric!r}")
    by = [by] if isinstance(by, str) else list(by)
    missing = [c for c in by if c not in df.columns]
    if missing:
        raise ValueError(f"by: columns {missing} not in df")
    d = _ok_rows(df).copy()
    x = x or _default_x(d)
    if x == "retained_fraction" and x not in d.columns:
        d[x] = pd.to_numeric(d["retained_tokens"], errors="coerce") / pd.to_numeric(d["prompt_tokens"], errors="coerce")
    if x not in d.columns:
        raise ValueError(f"x: column {x!r} not in df")
    d[metric] = pd.to_numeric(d[metric], errors="coerce").astype(float)
    d[x] = pd.to_numeric(d[x], errors="coerce")
    d = d[d[metric].notna()]
    fig = Draft()
    i = 0
    refs = []
    for key, sub in d.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        name = " ".join(str(k) for k in key)
        agg = sub.groupby(x, dropna=True)[metric].agg(["mean", "std", "count"]).reset_index()
        agg["sem"] = (agg["std"] / np.sqrt(agg["count"])).fillna(0.0)
        if agg.empty:  # no budget: a reference line across the budgets
            refs.append((name, float(sub[metric].mean()), int(sub[metric].count())))
            continue
        st = categorical(i + 1)[i]  # colour, then dash and marker past 8 methods
        fig.add_trace(go.Scatter(x=agg[x].tolist(), y=agg["mean"].tolist(), name=name, mode="lines+markers",
                                 line=dict(color=st["color"], dash=st["dash"]), marker=dict(symbol=st["symbol"]),
                                 error_y=dict(type="data", array=agg["sem"].tolist(), thickness=1, width=3),
                                 customdata=customdata(agg["count"].tolist(), agg["sem"].tolist()),
                                 meta={"customdata": ["n", "sem"]},
                                 hovertemplate=name + ", " + x + " = %{x}: " + metric
                                 + " = %{y:.3f} ± %{customdata[1]:.3f} (n = %{customdata[0]})<extra></extra>"))
        i += 1
    xs = d[x].dropna()
    lo, hi = (float(xs.min()), float(xs.max())) if len(xs) else (0.0, 1.0)
    for j, (name, m, n) in enumerate(refs):
        fig.add_trace(go.Scatter(x=[lo, hi], y=[m, m], name=name, mode="lines",  # dashed: no budget
                                 line=dict(color=[NEUTRAL, "#000", PALETTE[6]][j % 3], dash="dash"),
                                 hovertemplate=f"{html.escape(name)} (reference, no budget): {metric} = {m:.3f} (n = {n})"
                                               "<extra></extra>"))
    models = sorted(str(m) for m in d["model"].unique()) if "model" in d.columns else []
    return finish(fig, f"{metric} vs {_XLABEL.get(x, x)}",
                   figure_meta("accuracy_vs_budget", model_id or (", ".join(models) or None), params, metric=metric, x=x,
                         by=by, n_rows=int(len(d)), tasks=sorted(str(t) for t in d["task"].unique())
                         if "task" in d.columns else None),
                   xaxis_title=_XLABEL.get(x, x), yaxis_title=f"{metric} (mean ± s.e.)", yaxis=dict(rangemode="tozero"))


def kv_bytes_table(df: pd.DataFrame, *, by: Sequence[str] | None = None, metrics: Sequence[str] | None = None,
                   model_id: str | None = None, params=None) -> go.Figure:
    """Accuracy and KV-cache size per method and budget as a ``go.Table`` (means over the rows of each group).

    Works on a sweep frame (``kv_bytes``), on ``GenerationResult.to_frame()`` rows (``kv_bytes_after``) and on
    ``survival_table`` frames. Columns: the ``by`` keys, ``n``, the mean of each metric, mean KV MiB,
    mean retained tokens and the mean ``retained/prompt`` fraction when those columns exist.

    Args:
        by: grouping columns (default ``method`` + the budget column, or ``policy, budget``; ``task`` first when
            the frame holds several tasks, so tasks are never pooled silently). A ``by`` without ``task`` on
            several tasks pools them, and the title says so.
        metrics: metric columns (default: those of ``em, f1, contains, correct, first_token_agree, kept_mean``
            present).
    """
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df: must be a pandas DataFrame, got {type(df).__name__}")
    d = _ok_rows(df).copy()
    if by is None:
        if "method" in d.columns:
            by = ["method"] + [c for c in ("p_budget", "p_target", "p_layer") if c in d.columns]
            if "task" in d.columns and d["task"].nunique() > 1:  # never pool tasks silently
                by = ["task"] + by
        elif "policy" in d.columns:
            by = ["policy"] + (["budget"] if "budget" in d.columns else [])
        else:
            raise ValueError("by: the frame has no method or policy column; name the grouping columns")
    by = list(by)
    missing = [c for c in by if c not in d.columns]
    if missing:
        raise ValueError(f"by: columns {missing} not in df")
    if metrics is None:
        metrics = [c for c in _METRICS if c in d.columns]
    bad = [m for m in metrics if m not in d.columns]
    if bad:
        raise ValueError(f"metrics: columns {bad} not in df")
    bcol = next((c for c in ("kv_bytes", "kv_bytes_after") if c in d.columns), None)
    for c in list(metrics) + [c for c in (bcol, "retained_tokens", "prompt_tokens") if c and c in d.columns]:
        d[c] = pd.to_numeric(d[c], errors="coerce").astype(float)
    for c in by:
        d[c] = d[c].astype(object).where(d[c].notna(), "–")
    g = d.groupby(by, sort=True, dropna=False)
    out = g.size().rename("n").reset_index()
    for m in metrics:
        out[m] = g[m].mean().to_numpy()
    if bcol:
        out["KV MiB"] = (g[bcol].mean() / 2**20).to_numpy()
    if "retained_tokens" in d.columns:
        out["retained tokens"] = g["retained_tokens"].mean().to_numpy()
        if "prompt_tokens" in d.columns:
            out["retained/T"] = (g["retained_tokens"].mean() / g["prompt_tokens"].mean()).to_numpy()
    fmt = [None] * len(by) + ["d"] + [".3f"] * len(metrics) + [",.2f"] * (1 if bcol else 0) + \
          [",.0f", ".3f"][: sum(c in out.columns for c in ("retained tokens", "retained/T"))]
    cols = list(out.columns)
    # column widths from the longest entry (headers break at spaces); the height holds every row
    width = [max([len(w) for w in str(c).split()] + [len(f"{v:{f}}" if f and isinstance(v, (int, float)) else str(v))
                                                      for v in out[c].tolist()]) + 2 for c, f in zip(cols, fmt)]
    lines = max(len(str(c).split()) for c in cols)
    fig = go.Figure(go.Table(
        columnwidth=width,
        header=dict(values=[f"<b>{'<br>'.join(html.escape(w) for w in str(c).split())}</b>" for c in cols],
                    align="left", fill_color="#eee", font=dict(size=11), height=14 * lines + 8),
        cells=dict(values=[out[c].tolist() for c in cols], align=["left"] * len(by) + ["right"] * (len(cols) - len(by)),
                   format=fmt, font=dict(size=11), fill_color="white", line_color="#ddd"),
        name="table", meta={"keys": len(by)}))  # the key columns repeat when a narrow export splits the table
    models = sorted(str(m) for m in d["model"].unique()) if "model" in d.columns else []
    pooled = "task" in d.columns and "task" not in by and d["task"].nunique() > 1
    title = "Accuracy and KV cache per method and budget" + (
        f" (pooled over {d['task'].nunique()} tasks)" if pooled else "")
    return finish(fig, title,
                   figure_meta("kv_bytes_table", model_id or (", ".join(models) or None), params, by=by,
                         metrics=list(metrics), bytes_column=bcol, n_rows=int(len(d))),
                   margin=dict(l=10, r=10, t=40, b=10),
                   aspect={k: (14 * lines + 8 + 20 * len(out) + 30) / w for k, w in (("single", 240), ("double", 504))})


