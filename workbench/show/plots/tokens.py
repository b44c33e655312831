"""The prompt as text, shaded by attention (the bertviz / CircuitsVis idea, offline, in plotly).

One ``go.Bar`` trace (horizontal bars, one per token, laid out as lines of text): a bar's colour is the
attention the chosen query row gives that token, its text the token. Chunk boundaries are thin ticks,
the answer passage is outlined, removed or evicted tokens are struck through and greyed, the query row's
own token is boxed in black. Clicking a bar (in :class:`~workbench.show.widgets.TokenPanel`) makes that
token the query row. At long ``T`` the view shows one page of ``per_page`` tokens.
"""
from __future__ import annotations

import html
import math
import numbers

import numpy as np
import plotly.graph_objects as go

from workbench.checks import check_int
from workbench.show.figure_engine import _finish, _meta, _np
from workbench.show.plots._common import _answer_chunk, _cd, _removed_chunks
from workbench.show.theme import ANSWER, NEUTRAL

__all__ = ["token_attention", "token_values", "removed_positions"]

LOG_FLOOR = 1e-6  # log10 shading: values below are drawn at the floor
TOKEN_SCALE = [[0.0, "#ffffff"], [0.5, "#9ecae1"], [1.0, "#3182bd"]]  # white → blue: black text stays legible


def token_values(capture, layer: int, *, query="observers", head: int | None = None, group: int | None = None,
                 pooling=None) -> tuple[np.ndarray, str]:
    """The attention row a token view shades, ``[T]`` (float64), and its description.

    Args:
        query: ``"observers"`` (the mean of the proposal observers) or a row index into the capture's rows
            (``capture.attn``'s ``R`` axis: tail, audit, decode rows ...).
        head: one query head; ``group``: the mean over a KV group's query heads; ``pooling``: a
            :class:`~workbench.analyse.pooling.PoolingResult` whose pooled ``μ`` (observer measure) is shown
            instead (``query`` must then be ``"observers"``). Exactly one of them.
    """
    check_int("layer", layer, 0, capture.L - 1)
    given = [x is not None for x in (head, group, pooling)]
    if sum(given) != 1:
        raise ValueError("head, group, pooling: give exactly one of them")
    T = capture.T
    if pooling is not None:
        if query != "observers":
            raise ValueError(f"query: the pooled μ is an observer measure; must be 'observers', got {query!r}")
        return _np(pooling.mu[layer]).astype(np.float64)[:T], f"pooled μ, layer {layer}"
    if head is not None:
        check_int("head", head, 0, capture.H_Q - 1)
        heads, who = [head], f"head {head}"
    else:
        G = int(_np(capture.head_group).max()) + 1
        check_int("group", group, 0, G - 1)
        heads, who = np.flatnonzero(_np(capture.head_group) == group).tolist(), f"KV group {group}"
    if isinstance(query, str):
        if query != "observers":
            raise ValueError(f"query: must be 'observers' or a captured row index, got {query!r}")
        a = _np(capture.observer_attn()[layer][heads]).astype(np.float64).mean((0, 1))
        return a, f"mean of {capture.spans.W_p} observers, {who}, layer {layer}"
    check_int("query", query, 0, capture.attn.shape[2] - 1)
    a = _np(capture.attn[layer, heads, query, :T]).astype(np.float64).mean(0)
    pos = int(capture.row_pos[query])
    return a, f"{capture.row_kind[query]} row at position {pos}, {who}, layer {layer}"


def removed_positions(removed, spans, layer: int | None = None, group: int | None = None) -> list[int]:
    """Prompt positions struck through: positions (ints), removed chunks (a ``SelectionResult``, or a
    ``TraceResult``'s selection at ``layer``, default its ``l*``: nothing when it bypassed) or the positions a ``GenerationResult`` evicted (of ``layer`` and ``group``;
    default: evicted from every compacted cache)."""
    if removed is None:
        return []
    T = spans.T
    if hasattr(removed, "kept_prompt"):  # GenerationResult
        kp = _np(removed.kept_prompt)
        layers = [layer] if layer is not None else (list(removed.compacted_layers) or list(range(kp.shape[0])))
        groups = [group] if group is not None else list(range(kp.shape[1]))
        kept = np.zeros(T, dtype=bool)
        for l in layers:
            for g in groups:
                kept[kp[l, g]] = True
        return np.flatnonzero(~kept).tolist()
    if hasattr(removed, "selections") and hasattr(removed, "records"):  # a trace: its selection at l* by default
        layer = removed.l_star if layer is None else layer
        if layer is None:
            return []
    if hasattr(removed, "removed") or hasattr(removed, "selections"):
        ch = _removed_chunks(removed, 0 if layer is None else layer, spans.k)
        return np.flatnonzero(_np(spans.removal_mask(ch))).tolist()
    out = sorted({int(p) for p in removed})
    bad = [p for p in out if not 0 <= p < T]
    if bad:
        raise ValueError(f"removed: positions must be in [0, {T - 1}], got {bad[:5]}")
    return out


def _layout_tokens(labels: list[str], chars_per_line: int) -> tuple[list[float], list[int], list[float]]:
    """``(x start, line, width)`` of each token, in characters, wrapping at ``chars_per_line`` and at newlines."""
    xs, ys, ws = [], [], []
    x, line = 0.0, 0
    for t in labels:
        w = max(1.0, float(len(t)))
        if x > 0 and x + w > chars_per_line:
            x, line = 0.0, line + 1
        xs.append(x)
        ys.append(line)
        ws.append(w)
        x += w
        if t.endswith("⏎"):
            x, line = 0.0, line + 1
    return xs, ys, ws


def token_attention(capture, layer: int, *, query="observers", head: int | None = None, group: int | None = None,
                    pooling=None, removed=None, removed_layer: int | None = None, removed_group: int | None = None,
                    log: bool = False, exclude_sinks: bool = False, page: int = 0, per_page: int = 384,
                    chars_per_line: int = 96, params=None) -> go.Figure:
    """The prompt's tokens as text, each shaded by the attention of one query row (:func:`token_values`).

    Args:
        capture: the :class:`~workbench.capture.data.Capture`.
        layer, query, head, group, pooling: which row (see :func:`token_values`; default: head 0).
        removed: tokens to strike through (:func:`removed_positions`: positions, a selection, a trace, or a
            ``GenerationResult``'s evicted positions of ``removed_layer``/``removed_group``).
        log: shade by ``log10`` of the attention (floored at 1e-6), so a 0.7 sink does not flatten the rest.
        exclude_sinks: leave the sinks (first ``n_sink`` tokens) unshaded and out of the colour range.
        page, per_page: show tokens ``[page·per_page, (page+1)·per_page)`` (long prompts page through).
        chars_per_line: line width in characters.

    The bar colours (``marker.color``) are the row's values on the page (``log10`` with ``log``; excluded
    sinks at the lowest colour),
    ``customdata`` holds ``[position, token, attention, chunk]``; ``meta`` records the choices.
    """
    if head is None and group is None and pooling is None:
        head = 0
    vals, what = token_values(capture, layer, query=query, head=head, group=group, pooling=pooling)
    sp = capture.spans
    T = sp.T
    if isinstance(per_page, bool) or not isinstance(per_page, numbers.Integral) or per_page < 16:
        raise ValueError(f"per_page: must be an integer >= 16, got {per_page!r}")
    if isinstance(chars_per_line, bool) or not isinstance(chars_per_line, numbers.Integral) or chars_per_line < 20:
        raise ValueError(f"chars_per_line: must be an integer >= 20, got {chars_per_line!r}")
    n_pages = max(1, math.ceil(T / per_page))
    check_int("page", page, 0, n_pages - 1)
    lo, hi = page * per_page, min(T, (page + 1) * per_page)
    toks = list(sp.tokens[lo:hi]) if len(sp.tokens) >= hi else [f"#{j}" for j in range(lo, hi)]
    labels = [t.replace("\n", "⏎").replace("\t", "⇥") or "∅" for t in toks]
    xs, ys, ws = _layout_tokens(labels, int(chars_per_line))
    rem = set(removed_positions(removed, sp, removed_layer, removed_group))
    chunk_of = _np(sp.chunk_of()).tolist()
    ans = _answer_chunk(sp)
    v = vals[lo:hi].copy()
    shade = np.log10(np.maximum(v, LOG_FLOOR)) if log else v.copy()
    n_ex = max(0, sp.n_sink - lo) if exclude_sinks else 0
    keep = shade[n_ex:][np.isfinite(shade[n_ex:])]
    qpos = None if isinstance(query, str) else int(capture.row_pos[query])
    text = [("<s>" + html.escape(lb) + "</s>") if lo + i in rem else html.escape(lb) for i, lb in enumerate(labels)]
    line_w = [2.5 if lo + i == qpos else (1.2 if ans is not None and chunk_of[lo + i] == ans else 0)
              for i in range(hi - lo)]
    line_c = ["#000" if lo + i == qpos else ANSWER for i in range(hi - lo)]
    font_c = [NEUTRAL if lo + i in rem or i < n_ex else "#111" for i in range(hi - lo)]
    cmin, cmax = (float(keep.min()), float(keep.max())) if keep.size else (0.0, 1.0)
    if cmax <= cmin:
        cmax = cmin + 1e-12
    shade[:n_ex] = cmin  # excluded sinks: unshaded (the lowest colour), grey text, out of the colour range
    fig = go.Figure(go.Bar(
        x=np.asarray(ws), base=np.asarray(xs), y=np.asarray(ys), orientation="h", width=0.86, name="tokens",
        marker=dict(color=shade, colorscale=TOKEN_SCALE, cmin=cmin, cmax=cmax,
                    line=dict(color=line_c, width=line_w),
                    colorbar=dict(title=dict(text="log10 A" if log else "A"), thickness=10)),
        text=text, textposition="inside", insidetextanchor="middle", textangle=0, constraintext="none",
        textfont=dict(family="DejaVu Sans Mono, Liberation Mono, monospace", size=11, color=font_c),
        customdata=_cd(list(range(lo, hi)), [html.escape(t) for t in labels], v.tolist(), chunk_of[lo:hi]),
        meta={"customdata": ["position", "token", "attention", "chunk"], "chars_per_line": int(chars_per_line)},
        hovertemplate="%{customdata[0]}: %{customdata[1]}<br>A = %{customdata[2]:.4g} (chunk %{customdata[3]})"
                      "<extra></extra>"))
    # chunk boundaries: a thin tick at the start of every candidate chunk on the page
    starts = [s for s, _ in sp.chunks if lo <= s < hi]
    bx = [xs[s - lo] for s in starts]
    by = [ys[s - lo] for s in starts]
    fig.add_trace(go.Scatter(x=bx, y=by, mode="markers", name="chunk start", showlegend=False, hoverinfo="skip",
                             marker=dict(symbol="line-ns", size=16, line=dict(color="#000", width=1.5))))
    n_lines = (max(ys) + 1) if ys else 1
    bits = [f"tokens {lo}–{hi - 1} of {T}" + (f" (page {page + 1}/{n_pages})" if n_pages > 1 else "")]
    if rem:
        bits.append(f"{len(rem)} struck through")
    return _finish(fig, f"Attention over the prompt: {what}; " + ", ".join(bits),
                   _meta("token_attention", capture.model_id, params, layer=layer,
                         query=query, query_pos=qpos, head=head, group=group, pooled=pooling is not None,
                         log=bool(log), exclude_sinks=bool(exclude_sinks), page=page, per_page=per_page,
                         n_pages=n_pages, removed=sorted(rem)),
                   aspect={"single": (n_lines * 13 + 30) / 240, "double": (n_lines * 14 + 30) / 504},
                   height=max(160, 22 * n_lines + 90), bargap=0, showlegend=False,
                   xaxis=dict(visible=False, range=[-0.5, chars_per_line + 0.5]),
                   yaxis=dict(visible=False, autorange="reversed"),
                   margin=dict(l=10, r=10, t=50, b=10), clickmode="event")
