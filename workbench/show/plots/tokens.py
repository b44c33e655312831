"""The prompt as text, shaded by attention (the CircuitsVis idea, offline, as HTML).

:func:`token_attention` gives a :class:`~workbench.show.token_view.TokenView`: the tokens as spans in flowing
text (whitespace and newlines kept, nothing clipped), each shaded by the attention the chosen query row gives
it. Chunk starts have a bar on their left, the answer passage is underlined, removed or evicted tokens are
struck through and greyed, the query row's own token is boxed. Clicking a token (in
:class:`~workbench.show.widgets.TokenPanel`) makes the nearest captured row the query row. At long ``T`` the
view shows one page of ``per_page`` tokens.

:func:`kept_compare` draws two eviction settings' kept sets in one token view (the compare mode): every token
filled by whether setting A only, B only, both or neither kept it (:class:`~workbench.rerun.eviction.compare.KeptComparison`).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from workbench.checks import Interval
from workbench.choices import ColourScale
from workbench.constraints import index_into, register_all
from workbench.rerun.eviction.compare import MEMBERSHIP, KeptComparison, kept_set
from workbench.show.colour_scale import QUANTILE_TICKS, resolve_scale, scaled
from workbench.show.figure_engine import as_numpy, figure_function, figure_meta
from workbench.show.plots.common import answer_chunk, removed_chunks, spans_of
from workbench.show.token_view import TOKEN_SCALE, TokenView

if TYPE_CHECKING:
    from workbench.capture.data import Capture

__all__ = ["token_attention", "token_values", "removed_positions", "kept_compare", "COMPARE_FILL", "TOKEN_SCALE",
           "TokenView"]

_CHECKS = register_all("token_view", {"per_page": Interval("int", 16)}, __name__)
"""The tokens one page of the token views shows."""


def token_values(capture: Capture, layer: int, *, query="observers", head: int | None = None, group: int | None = None,
                 pooling=None) -> tuple[np.ndarray, str]:
    """The attention row a token view shades, ``[T]`` (float64), and its description.

    Args:
        query: ``"observers"`` (the mean of the proposal observers) or a row index into the capture's rows
            (``capture.attn``'s ``R`` axis: tail, audit, decode rows ...).
        head: one query head; ``group``: the mean over a KV group's query heads; ``pooling``: a
            :class:`~workbench.analyse.pooling.PoolingResult` whose pooled ``μ`` (observer measure) is shown
            instead (``query`` must then be ``"observers"``). Exactly one of them.
    """
    index_into(capture.L).check("layer", layer)
    given = [x is not None for x in (head, group, pooling)]
    if sum(given) != 1:
        raise ValueError("head, group, pooling: give exactly one of them")
    T = capture.T
    if pooling is not None:
        if query != "observers":
            raise ValueError(f"query: the pooled μ is an observer measure; must be 'observers', got {query!r}")
        return as_numpy(pooling.mu[layer]).astype(np.float64)[:T], f"pooled μ, layer {layer}"
    if head is not None:
        index_into(capture.H_Q).check("head", head)
        heads, who = [head], f"head {head}"
    else:
        G = int(as_numpy(capture.head_group).max()) + 1
        index_into(G).check("group", group)
        heads, who = np.flatnonzero(as_numpy(capture.head_group) == group).tolist(), f"KV group {group}"
    if isinstance(query, str):
        if query != "observers":
            raise ValueError(f"query: must be 'observers' or a captured row index, got {query!r}")
        a = as_numpy(capture.observer_attn()[layer][heads]).astype(np.float64).mean((0, 1))
        return a, f"mean of {capture.spans.W_p} observers, {who}, layer {layer}"
    index_into(capture.attn.shape[2]).check("query", query)
    a = as_numpy(capture.attn[layer, heads, query, :T]).astype(np.float64).mean(0)
    pos = int(capture.row_pos[query])
    return a, f"{capture.row_kind[query]} row at position {pos}, {who}, layer {layer}"


def removed_positions(removed, spans, layer: int | None = None, group: int | None = None) -> list[int]:
    """Prompt positions struck through: positions (ints), removed chunks (a ``SelectionResult``, or a
    ``TraceResult``'s selection at ``layer``, default its ``l*``: nothing when it bypassed) or the positions a ``GenerationResult`` evicted (of ``layer`` and ``group``;
    default: evicted from every compacted cache)."""
    if removed is None:
        return []
    T = spans.T
    if hasattr(removed, "kept_prompt"):  # GenerationResult: the complement of its kept set (the one rule)
        kept = kept_set(removed, layer, group)
        return [p for p in range(T) if p not in kept]
    if hasattr(removed, "selections") and hasattr(removed, "records"):  # a trace: its selection at l* by default
        layer = removed.l_star if layer is None else layer
        if layer is None:
            return []
    if hasattr(removed, "removed") or hasattr(removed, "selections"):
        ch = removed_chunks(removed, 0 if layer is None else layer, spans.k)
        return np.flatnonzero(as_numpy(spans.removal_mask(ch))).tolist()
    out = sorted({int(p) for p in removed})
    bad = [p for p in out if not 0 <= p < T]
    if bad:
        raise ValueError(f"removed: positions must be in [0, {T - 1}], got {bad[:5]}")
    return out


@figure_function
def token_attention(capture: Capture, layer: int, *, query="observers", head: int | None = None, group: int | None = None,
                    pooling=None, removed=None, removed_layer: int | None = None, removed_group: int | None = None,
                    log: bool = False, scale: ColourScale | None = None, exclude_sinks: bool = False, page: int = 0,
                    per_page: int = 384, params=None) -> TokenView:
    """The prompt's tokens as text, each shaded by the attention of one query row (:func:`token_values`).

    Args:
        capture: the :class:`~workbench.capture.data.Capture`.
        layer, query, head, group, pooling: which row (see :func:`token_values`; default: head 0).
        removed: tokens to strike through (:func:`removed_positions`: positions, a selection, a trace, or a
            ``GenerationResult``'s evicted positions of ``removed_layer``/``removed_group``).
        scale: the colour scale (:mod:`workbench.show.colour_scale`): ``"linear"``, ``"log"`` (``log10`` of the
            attention, floored at 1e-6, so a 0.7 sink does not flatten the rest) or ``"quantile"`` (by rank on the
            page); default linear below 2,048 prompt tokens, quantile from there on. The key names it.
        log: the log scale (the same as ``scale="log"``).
        exclude_sinks: leave the sinks (first ``n_sink`` tokens) unshaded and out of the colour range.
        page, per_page: show tokens ``[page·per_page, (page+1)·per_page)`` (long prompts page through).

    Returns a :class:`~workbench.show.token_view.TokenView` (HTML: tokens as spans in flowing text, exported
    as PDF/SVG/PNG/HTML by :func:`workbench.show.export.export`): ``values`` the row on the page, ``shade``
    what colours it (``log10`` with ``log``; excluded sinks at the lowest colour); ``meta`` records the choices.
    """
    if head is None and group is None and pooling is None:
        head = 0
    vals, what = token_values(capture, layer, query=query, head=head, group=group, pooling=pooling)
    sp = capture.spans
    T = sp.T
    _CHECKS["per_page"].check("per_page", per_page)
    n_pages = max(1, math.ceil(T / per_page))
    index_into(n_pages).check("page", page)
    lo, hi = page * per_page, min(T, (page + 1) * per_page)
    toks = list(sp.tokens[lo:hi]) if len(sp.tokens) >= hi else [f"#{j}" for j in range(lo, hi)]
    rem = set(removed_positions(removed, sp, removed_layer, removed_group))
    chunk_of = as_numpy(sp.chunk_of()).tolist()
    ans = answer_chunk(sp)
    sc = resolve_scale(scale, log, T)
    v = vals[lo:hi].copy()
    n_ex = max(0, sp.n_sink - lo) if exclude_sinks else 0
    shade = np.full(len(v), np.nan)
    shade[n_ex:], _ = scaled(v[n_ex:], sc)  # quantile: ranks among the page's shaded tokens
    keep = shade[n_ex:][np.isfinite(shade[n_ex:])]
    fin = v[n_ex:][np.isfinite(v[n_ex:])]
    qt = (tuple((q, f"{x:.3g}") for q, x in zip(QUANTILE_TICKS, np.quantile(fin, QUANTILE_TICKS)))
          if sc == "quantile" and fin.size else ())
    qpos = None if isinstance(query, str) else int(capture.row_pos[query])
    cmin, cmax = (float(keep.min()), float(keep.max())) if keep.size else (0.0, 1.0)
    if cmax <= cmin:
        cmax = cmin + 1e-12
    shade[:n_ex] = cmin  # excluded sinks: unshaded (the lowest colour), grey text, out of the colour range
    starts = {s for s, _ in sp.chunks}
    bits = [f"tokens {lo}–{hi - 1} of {T}" + (f" (page {page + 1}/{n_pages})" if n_pages > 1 else "")]
    if rem:
        bits.append(f"{len(rem)} struck through")
    meta = figure_meta("token_attention", capture.model_id, params, layer=layer, query=query, query_pos=qpos, head=head,
                 group=group, pooled=pooling is not None, log=sc == "log", scale=sc, exclude_sinks=bool(exclude_sinks),
                 page=page, per_page=per_page, n_pages=n_pages, removed=sorted(rem))
    return TokenView(
        tokens=toks, positions=list(range(lo, hi)), values=v, shade=shade,
        chunk=[int(c) for c in chunk_of[lo:hi]], removed=[p in rem for p in range(lo, hi)],
        chunk_start=[p in starts for p in range(lo, hi)],
        answer=[ans is not None and chunk_of[p] == ans for p in range(lo, hi)],
        excluded=[i < n_ex for i in range(hi - lo)], query_pos=qpos, cmin=cmin, cmax=cmax, log=sc == "log",
        scale=sc, scale_ticks=qt, title=f"Attention over the prompt: {what}; " + ", ".join(bits), meta=meta)


#: the fill of every membership class of the compare view (Okabe–Ito orange and sky blue, lightened so that black
#: text stays legible; kept by both: unfilled; kept by neither: unfilled and struck through)
COMPARE_FILL = {"A only": "#f0c566", "B only": "#89caf0", "both": "#ffffff", "neither": "#ffffff"}


def _paged(sp, T: int, page: int, per_page: int) -> tuple[int, int, int]:
    _CHECKS["per_page"].check("per_page", per_page)
    n_pages = max(1, math.ceil(T / per_page))
    index_into(n_pages).check("page", page)
    return page * per_page, min(T, (page + 1) * per_page), n_pages


@figure_function
def kept_compare(comparison: KeptComparison | None, prompt, *, page: int = 0, per_page: int = 384,
                 placeholder: str | None = None, model_id: str | None = None, params=None) -> TokenView:
    """Two settings' kept prompt positions in one token view, the difference marked.

    Every token is filled by its class in ``comparison`` (:meth:`KeptComparison.membership`): kept by setting
    A only (orange), by B only (sky blue), by both (unfilled), by neither (unfilled, struck through and greyed,
    as an evicted token in :func:`token_attention`). Chunk starts and the answer passage are marked as there.
    The key lists the classes with the settings' names and their counts on the page; the hover and the CSV
    sidecar (``to_frame``: ``category``, ``kept_a``, ``kept_b``) give every token's membership.

    Args:
        comparison: the :class:`~workbench.rerun.eviction.compare.KeptComparison` (previews or runs), or ``None``
            with ``placeholder``: the plain tokens with the reason there is nothing to compare in the title and
            ``meta["placeholder"]`` (a side without a preview).
        prompt: the ``Prompt`` (or ``PromptSpans`` / ``Capture``) the settings ran on, for the tokens and chunks.
        page, per_page: show tokens ``[page·per_page, (page+1)·per_page)``.
    """
    if (comparison is None) == (placeholder is None):
        raise ValueError("comparison, placeholder: give exactly one of them")
    sp = spans_of(prompt)
    if sp is None:
        raise ValueError("prompt: needs the prompt's spans (a Prompt, PromptSpans or Capture)")
    if comparison is not None and not isinstance(comparison, KeptComparison):
        raise ValueError(f"comparison: must be a KeptComparison, got {type(comparison).__name__}")
    T = sp.T
    if comparison is not None and comparison.T != T:
        raise ValueError(f"prompt: has T = {T} tokens, the comparison T = {comparison.T}")
    lo, hi, n_pages = _paged(sp, T, page, per_page)
    toks = list(sp.tokens[lo:hi]) if len(sp.tokens) >= hi else [f"#{j}" for j in range(lo, hi)]
    chunk_of = as_numpy(sp.chunk_of()).tolist()
    ans = answer_chunk(sp)
    starts = {s for s, _ in sp.chunks}
    pos = list(range(lo, hi))
    where = f"tokens {lo}–{hi - 1} of {T}" + (f" (page {page + 1}/{n_pages})" if n_pages > 1 else "")
    kw = dict(page=page, per_page=per_page, n_pages=n_pages)
    if comparison is None:
        meta = figure_meta("kept_compare", model_id, params, placeholder=placeholder, **kw)
        cat, cols, removed = ["not compared"] * len(pos), {}, [False] * len(pos)
        cats = (("not compared", "#ffffff", placeholder),)
        title = f"Kept prompt positions, no comparison: {placeholder}; {where}"
    else:
        member = comparison.membership()[lo:hi]
        c = comparison
        desc = {"A only": f"kept by A only (A: {c.label_a})", "B only": f"kept by B only (B: {c.label_b})",
                "both": "kept by both", "neither": "kept by neither"}
        cats = tuple((m, COMPARE_FILL[m], desc[m], m == "neither") for m in MEMBERSHIP)
        cat, removed = member, [m == "neither" for m in member]
        cols = {"kept_a": [p in c.kept_a for p in pos], "kept_b": [p in c.kept_b for p in pos]}
        counts = c.counts()
        meta = figure_meta("kept_compare", model_id, params, label_a=c.label_a, label_b=c.label_b, layer=c.layer,
                           group=c.group, counts=counts, a_only=list(c.a_only), b_only=list(c.b_only),
                           both=list(c.both), neither=list(c.neither), **kw)
        title = (f"Kept prompt positions, A: {c.label_a} vs B: {c.label_b} ({c.where}): "
                 f"{counts['A only']} A only, {counts['B only']} B only, {counts['both']} both; {where}")
    n = len(pos)
    return TokenView(
        tokens=toks, positions=pos, values=np.full(n, np.nan), shade=np.zeros(n), chunk=[int(chunk_of[p]) for p in pos],
        removed=removed, chunk_start=[p in starts for p in pos],
        answer=[ans is not None and chunk_of[p] == ans for p in pos], excluded=[False] * n, query_pos=None,
        cmin=0.0, cmax=1.0, log=False, title=title, meta=meta, category=cat, categories=cats, columns=cols)
