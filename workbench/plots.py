"""Plotly figures (the *show* layer): one paper-ready template, no science computed here.

Every figure function takes analysis results (or a capture) and returns a ``plotly.graph_objects.Figure``
built with ``template=TEMPLATE`` whose ``layout.meta`` is a JSON-serialisable dict
``{"figure": <function name>, "model_id": ..., <every parameter that made it>}`` (written beside exports).
The functions only reshape what the analysis modules computed; they never compute a bound, a score or a
selection themselves.

Token-level views show the token strings (tick labels and/or hover). Labels use Unicode symbols
(ζ, τ, η, Λ, Δ), never LaTeX (no MathJax offline).

Updating figures in place (widgets)
-----------------------------------
Every figure function is pure: the same inputs give the same figure, and the trace structure (number,
order and type of traces) depends only on the shape of the inputs, not on parameter values. A widget
builds its ``go.FigureWidget`` once and, when a slider moves, builds a fresh figure with the same
function and copies it over::

    fw = go.FigureWidget(head_heatmap(pool, "w"))
    ...                                   # slider moved: recompute the analysis (cheap), then
    update_figure(fw, head_heatmap(new_pool, "w"))

:func:`update_figure` writes the new traces and layout (titles, annotations, shapes, meta) with one
``plotly_update`` when the trace structure matches (one message to the front end, holding only what
changed, nothing validated twice), and replaces the traces otherwise. :func:`figure_frame` turns any of
these figures into one tidy ``DataFrame`` (CSV export).

Speed: a slider move rebuilds its figures, so building must be cheap. Multi-panel figures are drafted as
plain dicts (:class:`_Draft`, the same calls as ``go.Figure``) and validated once at the end; numeric data
go in as numpy arrays (plotly validates lists element by element); per-point styles are numeric arrays,
not lists of strings. At T = 2048 a figure takes 10–35 ms (``benchmarks/widgets.py``).
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import html
import math
import numbers
import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

__all__ = [
    "PALETTE", "SEQUENTIAL", "FONT", "TEMPLATE", "KEPT", "REMOVED", "NEUTRAL", "ANSWER",
    "sink_mass_heatmap", "attention_strip", "head_heatmap", "residual_distribution", "chunk_priorities",
    "envelope_rows", "certificate", "trace_layers", "drift", "break_even", "pages", "shift_steps",
    "kept_positions", "accuracy_vs_budget", "kv_bytes_table", "figure_frame", "update_figure", "drafts", "as_figure",
]

# Okabe–Ito colour-blind-safe palette
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


# ============================================================================= helpers
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


def _jsonable(x):
    """``x`` as plain JSON types (dataclasses, tensors, numpy, tuples; NaN/inf → None)."""
    if x is None or isinstance(x, (str, bool)):
        return x
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        x = float(x)
        return x if math.isfinite(x) else None
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _jsonable(getattr(x, f.name)) for f in dataclasses.fields(x) if not f.name.startswith("_")}
    if hasattr(x, "tolist") and callable(x.tolist):  # torch / numpy
        return _jsonable(x.tolist())
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in x]
    return str(x)


def _meta(figure: str, model_id, params=None, **kw) -> dict:
    """The ``layout.meta`` dict: figure name, model id, keyword parameters, then the user's ``params``."""
    d = {"figure": figure, "model_id": model_id}
    d.update({k: _jsonable(v) for k, v in kw.items()})
    if params is not None:
        p = _jsonable(params)
        if not isinstance(p, dict):
            raise ValueError(f"params: must be a dict or a dataclass, got {type(params).__name__}")
        for k, v in p.items():
            d.setdefault(k, v)
    return d


def _merge(into: dict, patch: dict) -> dict:
    """Recursive dict update, as plotly's ``update``: nested dicts merge, everything else is replaced."""
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v
    return into


class _Draft:
    """A figure under construction as plain dicts, validated ONCE when :func:`_finish` makes the ``go.Figure``.

    It takes the subset of ``go.Figure``'s methods the figure functions use (``add_trace`` with
    ``row``/``col``/``secondary_y``, ``update_xaxes``/``update_yaxes``, ``add_annotation``, ``add_shape``,
    ``update_layout``) with the same meaning. Built incrementally, a plotly figure re-validates and deep-copies
    its parts on every call (and re-assigns its whole shape tuple per shape): a four-row trace figure took
    ~80 ms, most of a slider move; from dicts it takes ~15 ms. Every keyword still goes through plotly's
    validator of that object (``go.layout.XAxis(**kw)``, ...), so a wrong property raises as before.

    Shapes: ``traces`` a list of trace dicts, ``layout`` a layout dict.
    """

    def __init__(self, trace=None):
        self.traces: list[dict] = []
        self.layout: dict = {}
        self._grid_ref = None
        if trace is not None:
            self.add_trace(trace)

    _GRIDS: dict[str, tuple] = {}

    @classmethod
    def subplots(cls, **kw) -> "_Draft":
        """``make_subplots(**kw)``'s grid; plotly builds it once per argument set, later calls copy its layout."""
        key = repr(sorted(kw.items()))
        if key not in cls._GRIDS:
            ref = make_subplots(**kw)
            cls._GRIDS[key] = (ref.layout.to_plotly_json(), ref._grid_ref)
        layout, grid_ref = cls._GRIDS[key]
        d = cls()
        d.layout, d._grid_ref = copy.deepcopy(layout), grid_ref
        return d

    def _has_subplots(self) -> bool:
        return self._grid_ref is not None

    def refs(self, row: int | None, col: int | None, secondary_y: bool = False) -> tuple[str, str]:
        """Axis references (``"x2"``, ``"y3"``) of subplot ``(row, col)`` (``("x", "y")`` without a grid)."""
        if row is None or self._grid_ref is None:
            return "x", "y"
        cell = self._grid_ref[row - 1][col - 1]
        if cell is None or (secondary_y and len(cell) < 2):
            raise ValueError(f"row, col: subplot ({row}, {col}{', secondary y' if secondary_y else ''}) "
                             "is not in the grid")
        kw = cell[1 if secondary_y else 0].trace_kwargs
        return kw["xaxis"], kw["yaxis"]

    def cells(self):
        """``(row, col)`` of every subplot that holds a trace (plotly's ``exclude_empty_subplots``)."""
        used = {(t.get("xaxis", "x"), t.get("yaxis", "y")) for t in self.traces}
        for r, row in enumerate(self._grid_ref or (), start=1):
            for c, cell in enumerate(row, start=1):
                if cell is not None and tuple(cell[0].trace_kwargs.values()) in used:
                    yield r, c

    def add_trace(self, trace, row: int | None = None, col: int | None = None, secondary_y: bool = False):
        d = _share_arrays(trace._props) if hasattr(trace, "to_plotly_json") else dict(trace)
        if row is not None and self._grid_ref is not None:
            d["xaxis"], d["yaxis"] = self.refs(row, col, secondary_y)
        self.traces.append(d)
        return self

    def _axes(self, letter: str, row, col, secondary_y: bool, kw: dict) -> None:
        patch = (go.layout.XAxis if letter == "x" else go.layout.YAxis)(**kw).to_plotly_json()
        if row is not None:
            ref = self.refs(row, col, secondary_y)[0 if letter == "x" else 1]
            names = [ref.replace(letter, letter + "axis", 1)]
        else:
            names = [k for k in self.layout if re.fullmatch(letter + r"axis\d*", k)] or [letter + "axis"]
        for n in names:
            _merge(self.layout.setdefault(n, {}), copy.deepcopy(patch))

    def update_xaxes(self, row=None, col=None, **kw):
        self._axes("x", row, col, False, kw)
        return self

    def update_yaxes(self, row=None, col=None, secondary_y: bool = False, **kw):
        self._axes("y", row, col, secondary_y, kw)
        return self

    def _placed(self, kw: dict, row, col, secondary_y: bool) -> dict:
        if row is not None and self._grid_ref is not None:  # plotly: the subplot's axes replace x/y refs
            xr, yr = self.refs(row, col, secondary_y)
            kw["xref"] = xr + (" domain" if "domain" in str(kw.get("xref", "")) else "")
            kw["yref"] = yr + (" domain" if "domain" in str(kw.get("yref", "")) else "")
        return kw

    def add_annotation(self, arg=None, row=None, col=None, secondary_y: bool = False, **kw):
        a = go.layout.Annotation(arg, **kw).to_plotly_json()
        self.layout.setdefault("annotations", []).append(self._placed(a, row, col, secondary_y))
        return self

    def add_shape(self, row=None, col=None, secondary_y: bool = False, **kw):
        a = go.layout.Shape(**kw).to_plotly_json()
        self.layout.setdefault("shapes", []).append(self._placed(a, row, col, secondary_y))
        return self

    def update_layout(self, **kw):
        _merge(self.layout, go.Layout(**kw).to_plotly_json())
        return self

    def figure(self) -> go.Figure:
        """The validated ``go.Figure``."""
        return go.Figure({"data": self.traces, "layout": self.layout})


_AS_DRAFT = contextvars.ContextVar("workbench_plots_as_draft", default=False)


@contextlib.contextmanager
def drafts():
    """Inside this context, figure functions built on a :class:`_Draft` return the draft itself (plain dicts
    made of validated pieces) instead of a ``go.Figure``. :func:`update_figure` takes a draft and writes
    it into a widget without building, validating and deep-copying a whole ``go.Figure`` first (~15 ms per
    figure at T = 2048). The widget panels wrap their slider updates in it; tests build every figure
    outside it, validated as usual."""
    token = _AS_DRAFT.set(True)
    try:
        yield
    finally:
        _AS_DRAFT.reset(token)


def as_figure(fig) -> go.Figure:
    """``fig`` as a ``go.Figure`` (a draft from :func:`drafts` is validated here)."""
    return fig.figure() if isinstance(fig, _Draft) else fig


def _finish(fig, title: str, meta: dict, **layout) -> go.Figure:
    """Title, ``meta`` and the workbench template; a :class:`_Draft` becomes its ``go.Figure`` here (or
    stays a draft inside :func:`drafts`)."""
    if isinstance(fig, _Draft):
        fig.update_layout(title=dict(text=title), meta=meta, **layout)
        fig.layout["template"] = TEMPLATE
        return fig if _AS_DRAFT.get() else fig.figure()
    fig.update_layout(template=TEMPLATE, title=dict(text=title), meta=meta, **layout)
    return fig


def _span(fig: "_Draft", kind: str, a: float, b: float | None = None, *, row: int | None = None,
          col: int | None = None, secondary_y: bool = False, annotation_text: str | None = None,
          annotation_position: str | None = None, annotation_font: dict | None = None, **shape) -> None:
    """``fig.add_vline`` / ``add_hline`` / ``add_vrect`` (``kind`` = ``"vline"``, ``"hline"``, ``"vrect"``) on a
    :class:`_Draft`: the same shapes and annotations plotly draws (on every non-empty subplot when
    ``row``/``col`` are None, as plotly's ``row="all"``), without plotly re-assigning the whole shape tuple
    per call (nine head separators cost ~100 ms that way)."""
    from plotly import shapeannotation

    if row is None and fig._has_subplots():
        for r, c in list(fig.cells()):
            _span(fig, kind, a, b, row=r, col=c, annotation_text=annotation_text,
                  annotation_position=annotation_position, annotation_font=annotation_font, **shape)
        return
    xr, yr = fig.refs(row, col, secondary_y)
    if kind == "vline":
        args, refs = dict(type="line", x0=a, x1=a, y0=0, y1=1), dict(xref=xr, yref=yr + " domain")
    elif kind == "hline":
        args, refs = dict(type="line", x0=0, x1=1, y0=a, y1=a), dict(xref=xr + " domain", yref=yr)
    elif kind == "vrect":
        args, refs = dict(type="rect", x0=a, x1=b, y0=0, y1=1), dict(xref=xr, yref=yr + " domain")
    else:
        raise ValueError(f"kind: must be 'vline', 'hline' or 'vrect', got {kind!r}")
    fig.add_shape(**args, **refs, **shape)
    if annotation_text is not None:
        kw = {"annotation_text": annotation_text}
        if annotation_position is not None:
            kw["annotation_position"] = annotation_position
        if annotation_font is not None:
            kw["annotation_font"] = annotation_font
        fig.add_annotation(shapeannotation.axis_spanning_shape_annotation(None, kind, args, kw), **refs)


def _np(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _z(x) -> np.ndarray:
    """A float64 array for plotly with non-finite values as NaN (a gap). numpy arrays, not lists: plotly
    validates lists element by element (a 9 × 2048 heatmap: ~140 ms as lists, ~1 ms as an array)."""
    a = _np(x).astype(np.float64)
    return np.where(np.isfinite(a), a, np.nan)


def _check_int_range(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not lo <= int(value) <= hi:
        raise ValueError(f"{name}: must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def _check_choice(name: str, value, options) -> None:
    if value not in options:
        raise ValueError(f"{name}: must be one of {tuple(options)}, got {value!r}")


def _model_id(model_id, *sources):
    if model_id is not None:
        return model_id
    for s in sources:
        m = getattr(s, "model_id", None)
        if m is not None:
            return m
    return None


def _spans_of(source):
    """``PromptSpans`` of a capture, a prompt, a trace or spans themselves (None if none)."""
    if source is None:
        return None
    if hasattr(source, "chunk_of") and hasattr(source, "tokens"):
        return source
    s = getattr(source, "spans", None)
    if s is not None:
        return s
    raise ValueError(f"spans: must be PromptSpans, a Prompt, a Capture or a TraceResult, got {type(source).__name__}")


def _tokens(spans, T: int) -> list[str]:
    """Hover labels of ``T`` positions: the tokens when known, else ``#j``."""
    if spans is not None and len(spans.tokens) >= T:
        return [_token_label(t) for t in spans.tokens[:T]]
    return [f"#{j}" for j in range(T)]


def _answer_chunk(spans) -> int | None:
    if spans is None or spans.answer_doc is None or spans.answer_doc not in spans.chunk_doc:
        return None
    return list(spans.chunk_doc).index(spans.answer_doc)


def _head_labels(head_group) -> list[str]:
    return [f"h{h} (g{int(g)})" for h, g in enumerate(_np(head_group).tolist())]


def _removed_chunks(removed, layer: int, k: int) -> list[int] | None:
    """Chunk indices removed at ``layer`` from a list, a ``SelectionResult`` or a ``TraceResult``."""
    if removed is None:
        return None
    if hasattr(removed, "selections") and hasattr(removed, "records"):  # TraceResult
        sel = removed.selections.get(layer)
        out = list(sel.removed) if sel is not None else []
    elif hasattr(removed, "removed"):
        out = list(removed.removed)
    else:
        m = _np(removed)
        out = np.flatnonzero(m).tolist() if m.dtype == bool and m.shape == (k,) else [int(i) for i in m.reshape(-1)]
    bad = [i for i in out if not 0 <= i < k]
    if bad:
        raise ValueError(f"removed: chunk indices must be in [0, {k - 1}], got {bad}")
    return sorted(out)


def _cd(*cols) -> np.ndarray:
    """``customdata`` rows from columns, as an object array ``[n, len(cols)]`` (fast to validate)."""
    out = np.empty((len(cols[0]) if cols else 0, len(cols)), dtype=object)
    for j, c in enumerate(cols):
        out[:, j] = list(c)
    return out


def _rows(row, n: int) -> np.ndarray:
    """``n`` copies of one row as an object array ``[n, len(row)]`` (per-cell heatmap customdata)."""
    out = np.empty((n, len(row)), dtype=object)
    out[:] = list(row)
    return out


# ============================================================================= capture views
def sink_mass_heatmap(capture, kind: str = "observer", *, params=None) -> go.Figure:
    """Layer × head heatmap of the attention mass the ``kind`` rows put on the sinks (``capture.sink_mass``)."""
    m = capture.sink_mass(kind).numpy()
    fig = _Draft(go.Heatmap(z=_z(m), x=_head_labels(capture.head_group), y=list(range(capture.L)),
                               coloraxis="coloraxis", name="sink mass",
                               hovertemplate="layer %{y}, %{x}<br>sink mass %{z:.3f}<extra></extra>"))
    return _finish(fig, f"Sink mass (first {capture.spans.n_sink} tokens), {kind} rows",
                   _meta("sink_mass_heatmap", capture.model_id, params, kind=kind, n_sink=capture.spans.n_sink),
                   xaxis_title="query head (KV group)", yaxis_title="layer", coloraxis=dict(cmin=0, cmax=1))


def attention_strip(capture, layer: int, head: int, row: int | None = None, *, params=None) -> go.Figure:
    """Attention of one row (default: the mean of the observers) over the prompt tokens, for one head.

    Bars coloured by span: grey protected, orange candidate chunk, green the answer chunk.
    """
    spans = capture.spans
    _check_int_range("layer", layer, 0, capture.L - 1)
    _check_int_range("head", head, 0, capture.H_Q - 1)
    if row is None:
        a = capture.observer_attn()[layer, head].mean(0)
        label = f"mean of {spans.W_p} observers"
    else:
        _check_int_range("row", row, 0, capture.attn.shape[2] - 1)
        a = capture.attn[layer, head, row, : spans.T]
        label = f"row at position {int(capture.row_pos[row])}"
    chunk_of = spans.chunk_of().tolist()
    colors = [NEUTRAL if c < 0 else (ANSWER if spans.chunk_doc[c] == spans.answer_doc else PALETTE[1])
              for c in chunk_of]
    toks = _tokens(spans, spans.T)
    fig = _Draft(go.Bar(x=np.arange(spans.T), y=_z(a), marker_color=colors, name="attention",
                           customdata=_cd(toks, chunk_of), meta={"customdata": ["token", "chunk"]},
                           hovertemplate="%{x}: %{customdata[0]} (chunk %{customdata[1]})<br>A=%{y:.4f}<extra></extra>"))
    return _finish(fig, f"Attention, layer {layer}, head {head} ({label})",
                   _meta("attention_strip", capture.model_id, params, layer=layer, head=head, row=row),
                   xaxis_title="prompt position (grey: protected, orange: chunks, green: answer chunk)",
                   yaxis_title="attention probability", bargap=0)


# ============================================================================= pooling (SPEC §2)
_HEAD_QUANTITIES = {
    "w": ("w", "head weight w_h = ζ/r + (1−ζ) v_h"),
    "H": ("H", "non-sink Rényi-2 entropy H_h (nats)"),
    "sink": ("sink_mass", "sink mass Σ_{j∈𝒮} a_j"),
    "z": ("z", "residual mass z_h"),
    "v": ("v", "within-group softmax v_h"),
    "C": ("C", "non-sink collision C_h"),
    "omega": ("omega", "row weight ω_h"),
}


def head_heatmap(pooling, quantity: str = "w", *, model_id: str | None = None, params=None) -> go.Figure:
    """Layer × head heatmap of one head statistic of a :class:`~workbench.pooling.PoolingResult`.

    Args:
        pooling: the pooling result (``[L, H]`` statistics).
        quantity: ``"w"`` (floored weights), ``"H"`` (entropy; invalid heads blank), ``"sink"`` (observer
            mass on the sinks), ``"z"``, ``"v"``, ``"C"`` or ``"omega"``.
        model_id: recorded in ``layout.meta``; params: extra parameters to record (e.g. ``EntroPrefillParams``).
    """
    _check_choice("quantity", quantity, _HEAD_QUANTITIES)
    attr, label = _HEAD_QUANTITIES[quantity]
    m = getattr(pooling, attr)
    L, H = pooling.L, pooling.n_heads
    hg = pooling.head_group if pooling.head_group is not None else np.zeros(H, dtype=np.int64)
    valid = _np(pooling.valid_head)
    text = [["" if valid[l, h] else "invalid" for h in range(H)] for l in range(L)]
    fig = _Draft(go.Heatmap(z=_z(m), x=_head_labels(hg), y=list(range(L)), coloraxis="coloraxis",
                               name=quantity, text=text,
                               hovertemplate="layer %{y}, %{x}<br>" + quantity + " = %{z:.4g} %{text}<extra></extra>"))
    cax = dict(cmin=0, cmax=1) if quantity in ("w", "v", "sink", "z") else {}
    return _finish(fig, f"{label}, per layer and head",
                   _meta("head_heatmap", _model_id(model_id, pooling), params, quantity=quantity,
                         zeta=getattr(pooling, "zeta", None), tau=getattr(pooling, "tau", None),
                         rho_min=getattr(pooling, "rho_min", None), n_sink=pooling.n_sink, W_p=pooling.W_p),
                   xaxis_title="query head (KV group)", yaxis_title="layer",
                   coloraxis=dict(colorbar=dict(title=dict(text=quantity)), **cax))


def residual_distribution(pooling, layer: int, spans=None, *, model_id: str | None = None, params=None) -> go.Figure:
    """Per-head residual distribution ``a^h_j / z_h`` over the non-sink keys of one layer (head × position).

    Each row is the distribution whose Rényi-2 entropy is ``H_h`` (shown in the row label with ``w_h``).

    Args:
        pooling: :class:`~workbench.pooling.PoolingResult`.
        layer: ``0 … L-1``.
        spans: ``PromptSpans`` (or a Capture / Prompt) for the token labels; positions only when None.
    """
    _check_int_range("layer", layer, 0, pooling.L - 1)
    sp = _spans_of(spans)
    res = _np(pooling.residual()[layer])  # [H, T - n_sink]
    H, Tn = res.shape
    ns = pooling.n_sink
    T = ns + Tn
    toks = _tokens(sp, T)[ns:]
    hg = pooling.head_group if pooling.head_group is not None else np.zeros(H, dtype=np.int64)
    Hh, w = _np(pooling.H[layer]), _np(pooling.w[layer])
    ylab = [f"{lab}  H={Hh[h]:.2f} w={w[h]:.2f}" if np.isfinite(Hh[h]) else f"{lab}  invalid"
            for h, lab in enumerate(_head_labels(hg))]
    fig = _Draft(go.Heatmap(z=_z(res), x=np.arange(ns, T), y=ylab, coloraxis="coloraxis", name="residual",
                               customdata=_rows(toks, H),
                               hovertemplate="%{y}<br>key %{x}: %{customdata}<br>a/z = %{z:.4g}<extra></extra>"))
    return _finish(fig, f"Residual distributions a_j/z_h (non-sink keys), layer {layer}",
                   _meta("residual_distribution", _model_id(model_id, pooling, spans), params, layer=layer,
                         n_sink=ns, zeta=getattr(pooling, "zeta", None), tau=getattr(pooling, "tau", None)),
                   xaxis_title="key position", yaxis_title="query head (KV group)",
                   coloraxis=dict(colorbar=dict(title=dict(text="a/z"))), yaxis=dict(autorange="reversed"))


# ============================================================================= priorities (SPEC §3)
def chunk_priorities(priorities, spans, layer: int, removed=None, *, x: str = "chunk",
                     model_id: str | None = None, params=None) -> go.Figure:
    """Chunk priorities of one layer: three stacked bar panels ``S_i``, ``ℓ_i`` (null line at 1), ``κ_i``.

    Bars are coloured kept (blue) / removed (vermillion) when ``removed`` is given (grey otherwise); the
    answer chunk has a thick black outline and an "answer" label; hover shows the chunk's text.
    Each panel has two traces, ``kept`` and ``removed`` (the structure does not change with the selection).

    Args:
        priorities: :class:`~workbench.priorities.PriorityResult`.
        spans: ``PromptSpans`` of the prompt (or a Capture / Prompt / TraceResult).
        layer: ``0 … L-1``.
        removed: removed chunk indices, a ``SelectionResult``, or a ``TraceResult`` (its selection at ``layer``).
        x: ``"chunk"`` (one slot per chunk) or ``"position"`` (bars over the chunk's token span of the prompt).
    """
    sp = _spans_of(spans)
    _check_int_range("layer", layer, 0, priorities.L - 1)
    _check_choice("x", x, ("chunk", "position"))
    k = priorities.k
    if sp.k != k:
        raise ValueError(f"spans: has {sp.k} chunks, the priorities {k}")
    rem = _removed_chunks(removed, layer, k)
    rset = set(rem or [])
    ans = _answer_chunk(sp)
    S, ell, kap = (_np(t[layer]) for t in (priorities.S, priorities.ell, priorities.kappa))
    n = _np(priorities.n)
    preview = [_text_preview(sp.tokens[s:e]) for s, e in sp.chunks]
    if x == "chunk":
        xs = list(range(k))
        widths = [0.8] * k
    else:
        xs = [(s + e) / 2 for s, e in sp.chunks]
        widths = n.tolist()
    fig = _Draft.subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06)
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
                customdata=_cd(idx, n[idx].tolist(), [preview[i] for i in idx], [i == ans for i in idx]),
                meta={"customdata": ["chunk", "n", "text", "answer"], "quantity": name},
                hovertemplate="chunk %{customdata[0]} (n=%{customdata[1]})<br>" + name
                + " = %{y:.4g}<br>%{customdata[2]}<extra>" + label + "</extra>"),
                row=row, col=1)
    _span(fig, "hline", 1.0, line=dict(color=NEUTRAL, dash="dash", width=1), row=2, col=1)
    if ans is not None:
        top = S[ans] if np.isfinite(S[ans]) else 0.0
        fig.add_annotation(x=xs[ans], y=float(top), text="answer", showarrow=True, arrowhead=2, ay=-25,
                           font=dict(size=10), row=1, col=1)
    valid = bool(_np(priorities.valid)[layer])
    title = f"Chunk priorities, layer {layer}" + ("" if valid else " (invalid layer: document mass ≤ ρ_min)")
    if rem is not None:
        title += f": {len(rem)} of {k} chunks removed"
    fig.update_yaxes(title_text="S = ln ℓ + λκ", row=1, col=1)
    fig.update_yaxes(title_text="lift ℓ", row=2, col=1)
    fig.update_yaxes(title_text="κ", range=[0, 1.05], row=3, col=1)
    if x == "chunk":
        fig.update_xaxes(tickmode="array", tickvals=xs,
                         ticktext=[f"c{i}" + ("★" if i == ans else "") for i in range(k)], row=3, col=1)
        fig.update_xaxes(title_text="candidate chunk (★ answer)", row=3, col=1)
    else:
        fig.update_xaxes(title_text="prompt position", range=[0, sp.T], row=3, col=1)
    return _finish(fig, title,
                   _meta("chunk_priorities", _model_id(model_id, spans), params, layer=layer, x=x,
                         removed=rem, answer_chunk=ans, eps_s=priorities.eps_s, lam=priorities.lam),
                   barmode="overlay", legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))


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
    if budget is None:
        budget = tt
    elif isinstance(budget, bool) or not isinstance(budget, numbers.Real) or budget < 0:
        raise ValueError(f"budget: must be a number of tokens >= 0, got {budget!r}")
    N = sels[layers[0]].N
    verdict = [html.escape(sels[l].verdict) for l in layers]
    fig = _Draft.subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.7, 0.3], vertical_spacing=0.06)
    fig.add_trace(go.Scatter(x=layers, y=_z([np.nan if u is None else u for u in U]), name="U_l (certificate)",
                             mode="lines+markers", line=dict(color=PALETTE[1]),
                             marker=dict(symbol=["x" if f else "circle" for f in infeasible], size=8),
                             customdata=_cd(verdict), meta={"customdata": ["verdict"]},
                             hovertemplate="layer %{x}: U = %{y:.4g}<br>%{customdata[0]}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=layers, y=D, name="D_l (greedy)", mode="lines+markers", line=dict(color=KEPT),
                             hovertemplate="layer %{x}: D = %{y} tokens<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=[layers[0], layers[-1]], y=[budget, budget], name="target", mode="lines",
                             line=dict(color=REMOVED, dash="dash"),
                             hovertemplate="target %{y} tokens<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(x=layers, y=_z([np.nan if g is None else g for g in gap]), name="gap U − D",
                         marker_color=NEUTRAL, hovertemplate="layer %{x}: gap %{y:.4g}<extra></extra>"), row=2, col=1)
    if tr is not None and tr.l_star is not None:
        _span(fig, "vline", tr.l_star, line=dict(color="#000", dash="dot", width=1))
        fig.add_annotation(x=tr.l_star, y=1, yref="paper", text="l*", showarrow=False, yanchor="bottom")
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_yaxes(title_text="gap", row=2, col=1)
    fig.update_xaxes(title_text="layer", row=2, col=1)
    p = params if params is not None else getattr(tr, "params", None)
    return _finish(fig, f"Greedy D_l vs certificate U_l (N = {N} candidate tokens)",
                   _meta("certificate", _model_id(model_id, tr), p, budget=budget, target_tokens=tt, N=N,
                         layers=layers, l_star=getattr(tr, "l_star", None)),
                   legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))


_STATUS_COLOR = {"accept": PALETTE[2], "audit_fail": REMOVED, "below_target": PALETTE[1], "short_streak": PALETTE[5],
                 "no_audit": PALETTE[4], "invalid": NEUTRAL, "no_candidates": NEUTRAL}


def trace_layers(trace, *, model_id: str | None = None, params=None) -> go.Figure:
    """The per-layer trace of the 7-step procedure (``audit.trace``): three panels over the monitored layers.

    1. removed tokens ``D_l`` and certificate ``U_l`` against the target; 2. candidate stability ``d_l``
    against ``d_max`` and the streak (bars); 3. the largest audit bound against ``ε_audit`` (and ``b``).
    The layer markers at the bottom are coloured by status (accept, audit fail, below target, ...);
    hover shows the decision sentence. ``l*`` is a dotted vertical line.
    """
    df = trace.to_frame()
    if df.empty:
        raise ValueError("trace: has no monitored layers")
    P = trace.params
    layers = df["layer"].tolist()
    fig = _Draft.subplots(rows=4, cols=1, shared_xaxes=True, row_heights=[0.38, 0.25, 0.25, 0.12],
                        vertical_spacing=0.04, specs=[[{}], [{"secondary_y": True}], [{}], [{}]])
    f = lambda c: _z(pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=float))  # noqa: E731
    tt = [np.nan if v is None else v for v in df["target_tokens"]]
    fig.add_trace(go.Scatter(x=layers, y=f("D"), name="D_l", mode="lines+markers", line=dict(color=KEPT)), 1, 1)
    fig.add_trace(go.Scatter(x=layers, y=f("U"), name="U_l", mode="lines+markers", line=dict(color=PALETTE[1])), 1, 1)
    fig.add_trace(go.Scatter(x=layers, y=_z(tt), name="target", mode="lines", line=dict(color=REMOVED, dash="dash")),
                  1, 1)
    fig.add_trace(go.Bar(x=layers, y=f("streak"), name="streak", marker_color=PALETTE[5], opacity=0.45),
                  2, 1, secondary_y=True)
    fig.add_trace(go.Scatter(x=layers, y=f("d"), name="d_l", mode="lines+markers", line=dict(color=PALETTE[4])),
                  2, 1, secondary_y=False)
    fig.add_trace(go.Scatter(x=layers, y=f("max_audit_bound"), name="max audit bound", mode="markers",
                             marker=dict(color=PALETTE[3], size=8, symbol="diamond")), 3, 1)
    status = df["status"].tolist()
    fig.add_trace(go.Scatter(x=layers, y=[0] * len(layers), name="status", mode="markers", showlegend=False,
                             marker=dict(color=[_STATUS_COLOR.get(s, "#000") for s in status], size=11, symbol="square"),
                             customdata=_cd(status, [html.escape(d) for d in df["decision"]]),
                             meta={"customdata": ["status", "decision"]},
                             hovertemplate="layer %{x}: %{customdata[0]}<br>%{customdata[1]}<extra></extra>"), 4, 1)
    ref = dict(color=NEUTRAL, dash="dash", width=1)
    small = dict(size=10)
    if P is not None:
        _span(fig, "hline", P.d_max, line=ref, annotation_text="d_max", annotation_font=small, row=2, col=1,
                      secondary_y=False)
        _span(fig, "hline", P.eps_audit, line=ref, annotation_text="ε_audit", annotation_font=small, row=3, col=1)
    if trace.b > 0:
        _span(fig, "hline", trace.b, line=dict(color=PALETTE[1], dash="dot", width=1), annotation_text="b",
                      annotation_font=small, annotation_position="bottom right", row=3, col=1)
    if trace.l_star is not None:
        _span(fig, "vline", trace.l_star, line=dict(color="#000", dash="dot", width=1))
        fig.add_annotation(x=trace.l_star, y=1, yref="paper", text="l*", showarrow=False, yanchor="bottom")
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_yaxes(title_text="d_l", range=[0, 1.05], row=2, col=1, secondary_y=False)
    fig.update_yaxes(title_text="streak", rangemode="tozero", showgrid=False, dtick=1, row=2, col=1, secondary_y=True)
    fig.update_yaxes(title_text="audit bound", row=3, col=1)
    fig.update_yaxes(showticklabels=False, showline=False, ticks="", showgrid=False, row=4, col=1)
    fig.update_xaxes(title_text="monitored layer", row=4, col=1)
    fig.update_xaxes(dtick=max(1, math.ceil(len(layers) / 16)))
    key = "  ".join(f'<span style="color:{c}">■</span> {k.replace("_", " ")}' for k, c in _STATUS_COLOR.items()
                    if k in status)
    fig.add_annotation(x=0, y=0, xref="x domain",
                       yref=fig.refs(4, 1)[1] + " domain", xanchor="left", yanchor="bottom", text=key,
                       showarrow=False, font=dict(size=9), yshift=-2)
    dec = trace.decision if len(trace.decision) < 90 else trace.decision[:89] + "…"
    return _finish(fig, f"Layer trace: {html.escape(dec)}",
                   _meta("trace_layers", _model_id(model_id, trace), params if params is not None else P,
                         l_star=trace.l_star, removed=trace.removed, decision=trace.decision, b=trace.b, J=trace.J),
                   barmode="overlay", margin=dict(r=60, b=90),
                   legend=dict(orientation="h", y=-0.1, x=0, yanchor="top"))


# ============================================================================= envelope (SPEC §4)
def envelope_rows(env, *, layer: int | None = None, model_id: str | None = None, params=None) -> go.Figure:
    """Deletion envelope against the actual discarded mass, per constraint row ``a = (h, u)`` of one layer.

    Markers: the actual ``η = A_u(E)`` (blue where ``η ≤ bound``, vermillion where the bound is violated);
    line: the envelope ``min{1, q/ω, q + √(D_χ² q(1−q))}``; dashed: the pooled discarded mass ``q``.
    Hover shows both terms, ``ω`` and ``D_χ²`` (with its cap ``1/ω − 1``).

    Args:
        env: an :class:`~workbench.envelope.EnvelopeResult`, or a list of them (``envelope_all_layers``)
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
    holds = _np(env.holds).tolist()
    cd = _cd(heads, us, _z(env.omega), _z(env.dchi2), _z(env.dchi2_cap), _z(env.term_ratio), _z(env.term_chi2))
    names = ["head", "u", "omega", "dchi2", "dchi2_cap", "term_ratio", "term_chi2"]
    hover = ("row %{x} (h%{customdata[0]}, u%{customdata[1]}): %{y:.4g}<br>ω = %{customdata[2]:.3g}, "
             "D_χ² = %{customdata[3]:.3g} (cap %{customdata[4]:.3g})<br>q/ω = %{customdata[5]:.3g}, "
             "q + √(D_χ² q(1−q)) = %{customdata[6]:.3g}")
    fig = _Draft()
    fig.add_trace(go.Scatter(x=a, y=_z(env.bound), name="envelope", mode="lines", line=dict(color=PALETTE[1], shape="hvh"),
                             customdata=cd, meta={"customdata": names},
                             hovertemplate=hover + "<extra>envelope</extra>"))
    fig.add_trace(go.Scatter(x=a, y=_z(env.eta), name="actual η", mode="markers",
                             marker=dict(color=[KEPT if h else REMOVED for h in holds], size=6,
                                         symbol=["circle" if h else "x" for h in holds]),
                             customdata=_cd(heads, us, holds), meta={"customdata": ["head", "u", "holds"]},
                             hovertemplate="row %{x} (h%{customdata[0]}, u%{customdata[1]}): η = %{y:.4g}"
                             "<extra>actual</extra>"))
    fig.add_trace(go.Scatter(x=[0, max(A - 1, 0)], y=[env.q, env.q], name="q = μ(E)", mode="lines",
                             line=dict(color=NEUTRAL, dash="dash", width=1), hovertemplate="q = %{y:.4g}<extra></extra>"))
    for h in range(1, A // max(env.W, 1)):
        _span(fig, "vline", h * env.W - 0.5, line=dict(color="#ddd", width=1))
    n_bad = A - sum(holds)
    where = "" if env.layer is None else f", layer {env.layer}"
    return _finish(fig, f"Deletion envelope vs actual η per row{where}"
                   + ("" if n_bad == 0 else f" ({n_bad} rows above the envelope)"),
                   _meta("envelope_rows", model_id, params, layer=env.layer, q=env.q, W=env.W, atol=env.atol,
                         all_hold=env.all_hold),
                   xaxis_title="constraint row a = h·W + u (grouped by head)", yaxis_title="discarded mass",
                   yaxis=dict(rangemode="tozero"),
                   legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))


# ============================================================================= stability and cost (SPEC §7)
def drift(stability, *, model_id: str | None = None, params=None) -> go.Figure:
    """Drift ``‖X^l|_R − Y^l‖_{max,2}`` per layer after ``l*`` (log scale), the block defects ``e_l``, and the
    first-token certificate ``m > 2ΛΔ_L``: the dashed line is ``m/(2Λ)``, the largest ``Δ_L`` it certifies.
    """
    layers = sorted(stability.drift)
    if not layers:
        raise ValueError("stability: has no drift values (no layer after l*)")
    d = [stability.drift[l] for l in layers]
    fig = _Draft()
    fig.add_trace(go.Scatter(x=layers, y=_z(d), name="drift", mode="lines+markers", line=dict(color=KEPT),
                             hovertemplate="X^%{x}: drift %{y:.4g}<extra></extra>"))
    dl = sorted(stability.defects)
    fig.add_trace(go.Scatter(x=dl, y=_z([stability.defects[l] for l in dl]), name="defect e_l", mode="markers",
                             marker=dict(color=PALETTE[1], symbol="diamond", size=7),
                             hovertemplate="X^%{x}: e = %{y:.4g}<extra></extra>"))
    Ll = layers[-1]
    fig.add_trace(go.Scatter(x=[Ll], y=_z([stability.Delta_L]), name="Δ_L", mode="markers",
                             marker=dict(color=REMOVED, size=12, symbol="star"),
                             hovertemplate="Δ_L = %{y:.4g}<extra></extra>"))
    thr = stability.margin / (2 * stability.Lambda) if stability.Lambda > 0 else math.inf
    fig.add_trace(go.Scatter(x=[layers[0], Ll], y=_z([thr, thr]), name="m/(2Λ)", mode="lines",
                             line=dict(color=NEUTRAL, dash="dash"),
                             hovertemplate="certificate threshold m/(2Λ) = %{y:.4g}<extra></extra>"))
    s = stability.summary()
    verdict = "certified" if stability.certified else "not certified"
    agree = "same first token" if stability.agree_first_token else "first token differs"
    fig.add_annotation(x=0.99, y=0.02, xref="paper", yref="paper", xanchor="right", yanchor="bottom", showarrow=False,
                       align="right", font=dict(size=10),
                       text=f"m = {stability.margin:.3g}, Λ = {stability.Lambda:.3g}<br>2ΛΔ_L = {s['two_Lambda_Delta']:.3g}"
                            f" → {verdict}; {agree}<br>composed bound {stability.composed_bound:.3g}")
    return _finish(fig, f"Drift after l* = {stability.l_star}: {verdict}",
                   _meta("drift", model_id, params, **s),
                   xaxis_title="layer (block input X^l)", yaxis_title="‖X|_R − Y‖_max,2", yaxis=dict(type="log", dtick=1),
                   xaxis=dict(dtick=1),
                   legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))


def break_even(cost_grid, *, model_id: str | None = None, params=None) -> go.Figure:
    """Cost of pruned prefill from a :class:`~workbench.cost.CostGrid`: left, ``F_EP/F_full`` against the
    kept fraction ``T'/T`` for every ``l*`` (1 = break even); right, the break-even ``T'/T`` against ``l*``."""
    df = cost_grid.to_frame() if hasattr(cost_grid, "to_frame") else cost_grid
    need = {"l_star", "keep_fraction", "ratio", "T"}
    if not need <= set(df.columns):
        raise ValueError(f"cost_grid: needs columns {sorted(need)}, got {list(df.columns)}")
    if df.empty:
        raise ValueError("cost_grid: is empty")
    ls = sorted(df["l_star"].unique().tolist())
    fig = _Draft.subplots(rows=1, cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.12)
    cols = PALETTE if len(ls) <= len(PALETTE) else [
        c for c in _sample_scale(len(ls))]
    for i, l in enumerate(ls):
        sub = df[df["l_star"] == l].sort_values("keep_fraction")
        fig.add_trace(go.Scatter(x=sub["keep_fraction"].tolist(), y=sub["ratio"].tolist(), name=f"l* = {l}",
                                 mode="lines", line=dict(color=cols[i % len(cols)]), legendgroup="ratio",
                                 hovertemplate="l* = " + str(l) + ", T'/T = %{x:.3f}: F_EP/F_full = %{y:.4f}"
                                 "<extra></extra>"), 1, 1)
    _span(fig, "hline", 1.0, line=dict(color=NEUTRAL, dash="dash", width=1), row=1, col=1)
    be = df.groupby("l_star")["break_even_keep_fraction"].max() if "break_even_keep_fraction" in df else None
    if be is not None:
        fig.add_trace(go.Scatter(x=be.index.tolist(), y=_z(be.to_numpy()), name="break-even T'/T",
                                 mode="lines+markers", line=dict(color="#000"), showlegend=False,
                                 hovertemplate="l* = %{x}: break even at T'/T = %{y:.4f}<extra></extra>"), 1, 2)
    fig.update_xaxes(title_text="kept fraction T'/T", row=1, col=1)
    fig.update_yaxes(title_text="F_EP / F_full", row=1, col=1)
    fig.update_xaxes(title_text="l* (gather after layer)", row=1, col=2)
    fig.update_yaxes(title_text="break-even T'/T", range=[0, 1.02], row=1, col=2)
    T = int(df["T"].iloc[0])
    return _finish(fig, f"Pruned-prefill cost, T = {T}",
                   _meta("break_even", model_id, params, T=T, l_stars=ls,
                         keep_fractions=sorted(df["keep_fraction"].unique().tolist())))


def _sample_scale(n: int) -> list[str]:
    from plotly.colors import sample_colorscale

    return sample_colorscale(SEQUENTIAL, [i / max(n - 1, 1) for i in range(n)])


# ============================================================================= pages (SPEC §8)
def pages(page_result, layer: int, spans=None, *, model_id: str | None = None, params=None) -> go.Figure:
    """Pages and GQA unions of a :class:`~workbench.pages.PageResult`.

    Top left: page importance ``I_{l,g}(P)`` (group × page) at ``layer`` with the kept pages boxed;
    bottom left: the group scores ``p_{l,g}(j)`` over the prompt tokens (kept tokens filled, dropped ones open);
    top right: the page union ``U_l`` per layer with ``K`` and ``min{GK, N_P}``; bottom right: ``UOR_g``.
    """
    pr = page_result
    _check_int_range("layer", layer, 0, pr.L - 1)
    sp = _spans_of(spans)
    G, N_P = pr.importance.shape[1], pr.importance.shape[2]
    T = pr.p.shape[2]
    toks = _tokens(sp, T)
    raw = list(sp.tokens) if sp is not None else None
    ranges = [(P * pr.b, min((P + 1) * pr.b, T)) for P in range(N_P)]
    prev = [f"{s}–{e - 1}: " + (_text_preview(raw[s:e], 60) if raw else "") for s, e in ranges]
    fig = _Draft.subplots(rows=2, cols=2, column_widths=[0.7, 0.3], horizontal_spacing=0.1, vertical_spacing=0.14)
    I = _np(pr.importance[layer])
    sel = _np(pr.selected[layer])
    fig.add_trace(go.Heatmap(z=_z(I), x=np.arange(N_P), y=[f"g{g}" for g in range(G)], coloraxis="coloraxis",
                             name="importance", customdata=_rows(prev, G), meta={"customdata": ["page"]},
                             hovertemplate="g%{y} page %{x} (tokens %{customdata})<br>I = %{z:.4g}<extra></extra>"),
                  1, 1)
    gs, ps = np.nonzero(sel)
    fig.add_trace(go.Scatter(x=ps.tolist(), y=[f"g{g}" for g in gs.tolist()], name="kept page", mode="markers",
                             marker=dict(symbol="square-open", size=14, color=REMOVED, line=dict(width=2)),
                             hovertemplate="kept: g%{y} page %{x}<extra></extra>"), 1, 1)
    tm = _np(pr.token_mask[layer])
    for g in range(G):
        fig.add_trace(go.Scatter(x=np.arange(T), y=_z(pr.p[layer, g]), name=f"p g{g}", mode="lines+markers",
                                 line=dict(color=PALETTE[g % len(PALETTE)], width=1),
                                 # kept: filled; dropped: white with the group's outline (a numeric colour array:
                                 # a per-point symbol list costs plotly ~50 ms of validation per 2k points)
                                 marker=dict(size=5, color=tm[g].astype(np.float32), cmin=0, cmax=1,
                                             colorscale=[[0, "white"], [1, PALETTE[g % len(PALETTE)]]],
                                             line=dict(color=PALETTE[g % len(PALETTE)], width=1)),
                                 # the tokens alone (the same on every slider move: not re-sent); kept = colour
                                 customdata=_cd(toks), meta={"customdata": ["token"]},
                                 hovertemplate="g" + str(g) + " %{x}: %{customdata[0]}<br>p = %{y:.4g}"
                                 "<br>kept: %{marker.color}<extra></extra>"), 2, 1)
    L = pr.L
    fig.add_trace(go.Bar(x=np.arange(L), y=_np(pr.U).tolist(), name="U_l", marker_color=KEPT, showlegend=False,
                         hovertemplate="layer %{x}: U = %{y} pages<extra></extra>"), 1, 2)
    _span(fig, "hline", min(pr.K, N_P), line=dict(color=NEUTRAL, dash="dash", width=1), row=1, col=2)
    _span(fig, "hline", min(G * pr.K, N_P), line=dict(color=NEUTRAL, dash="dot", width=1), row=1, col=2)
    for g in range(G):
        fig.add_trace(go.Scatter(x=np.arange(L), y=_z(pr.uor[:, g]), name=f"UOR g{g}", mode="lines",
                                 line=dict(color=PALETTE[g % len(PALETTE)]), showlegend=False,
                                 hovertemplate="layer %{x}: UOR g" + str(g) + " = %{y:.3f}<extra></extra>"), 2, 2)
    _span(fig, "vline", layer, line=dict(color="#000", dash="dot", width=1), row=1, col=2)
    _span(fig, "vline", layer, line=dict(color="#000", dash="dot", width=1), row=2, col=2)
    fig.update_xaxes(title_text=f"page (b = {pr.b} tokens)", row=1, col=1)
    fig.update_xaxes(title_text="prompt position", row=2, col=1)
    fig.update_yaxes(title_text="group score p", row=2, col=1)
    fig.update_xaxes(title_text="layer", row=1, col=2)
    fig.update_yaxes(title_text="union U_l (pages)", row=1, col=2)
    fig.update_xaxes(title_text="layer", row=2, col=2)
    fig.update_yaxes(title_text=f"UOR (s = {pr.s})", row=2, col=2)
    return _finish(fig, f"Pages, layer {layer}: top-{pr.K} of {N_P} pages per group, U = {int(pr.U[layer])}",
                   _meta("pages", _model_id(model_id, spans), params, layer=layer, b=pr.b, K=pr.K, s=pr.s, e=pr.e,
                         d=pr.d, bytes=pr.bytes),
                   coloraxis=dict(colorbar=dict(title=dict(text="I"), len=0.45, y=0.78)),
                   legend=dict(orientation="h", y=-0.15, x=0, yanchor="top"))


# ============================================================================= shift (SPEC §9)
def shift_steps(shift, *, level: str = "group", layer: int | None = None, model_id: str | None = None,
                params=None) -> go.Figure:
    """Prefill-vs-decode attention shift of a :class:`~workbench.shift.ShiftResult`.

    With ``layer=None``: heatmaps (layer × step) of the top-``k`` recall against the reference and of the
    JSD between adjacent rows, averaged over the heads or groups, and the mean recall gains per layer
    (``−1→0``, ``0→1`` (the boundary), ``1→2``, ``2→3``). With a ``layer``: one line per head/group instead.
    The dotted line marks the prefill/decode boundary (between ``r = 0`` and ``r = 1``).

    Args:
        level: ``"group"`` (KV groups) or ``"head"`` (query heads).
        layer: one layer to show per unit, or None for all layers.
    """
    _check_choice("level", level, ("group", "head"))
    rec = _np(shift.recall_group if level == "group" else shift.recall_head)  # [L, U, R]
    js = _np(shift.jsd_group if level == "group" else shift.jsd_head)  # [L, U, R-1]
    L, U, R = rec.shape
    r = _np(shift.r).tolist()
    rj = [x + 0.5 for x in r[:-1]]  # JSD between r and r+1 sits between them
    lf = shift.leap_frame()
    lf = lf[lf.level == level]
    gains = ["gain_m10", "gain_01", "gain_12", "gain_23"]
    glabel = {"gain_m10": "−1→0", "gain_01": "0→1", "gain_12": "1→2", "gain_23": "2→3"}
    unit = "g" if level == "group" else "h"
    if layer is None:
        fig = _Draft.subplots(rows=3, cols=1, vertical_spacing=0.13, row_heights=[0.36, 0.36, 0.28])
        fig.add_trace(go.Heatmap(z=_z(rec.mean(1)), x=r, y=list(range(L)), coloraxis="coloraxis", name="recall",
                                 hovertemplate="layer %{y}, r = %{x}: recall %{z:.3f}<extra></extra>"), 1, 1)
        fig.add_trace(go.Heatmap(z=_z(js.mean(1)), x=rj, y=list(range(L)), coloraxis="coloraxis2", name="JSD",
                                 hovertemplate="layer %{y}, r→r+1 at %{x}: JSD %{z:.4f}<extra></extra>"), 2, 1)
        mean = lf.groupby("layer")[gains].mean()
        for i, g in enumerate(gains):
            fig.add_trace(go.Bar(x=mean.index.tolist(), y=_z(mean[g].to_numpy()), name=f"gain {glabel[g]}",
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
        _check_int_range("layer", layer, 0, L - 1)
        fig = _Draft.subplots(rows=3, cols=1, vertical_spacing=0.13, row_heights=[0.36, 0.36, 0.28])
        cols = PALETTE if U <= len(PALETTE) else _sample_scale(U)
        for u in range(U):
            c = cols[u % len(cols)]
            fig.add_trace(go.Scatter(x=r, y=_z(rec[layer, u]), name=f"{unit}{u}", mode="lines+markers",
                                     line=dict(color=c), legendgroup=f"{unit}{u}",
                                     hovertemplate=f"{unit}{u}" + ", r = %{x}: recall %{y:.3f}<extra></extra>"), 1, 1)
            fig.add_trace(go.Scatter(x=rj, y=_z(js[layer, u]), name=f"{unit}{u}", mode="lines+markers",
                                     line=dict(color=c), legendgroup=f"{unit}{u}", showlegend=False,
                                     hovertemplate=f"{unit}{u}" + ", r→r+1 at %{x}: JSD %{y:.4f}<extra></extra>"), 2, 1)
        sub = lf[lf.layer == layer].sort_values("unit")
        for i, g in enumerate(gains):
            fig.add_trace(go.Bar(x=[f"{unit}{u}" for u in sub["unit"]], y=_z(sub[g].to_numpy()), name=f"gain {glabel[g]}",
                                 marker_color=[NEUTRAL, REMOVED, KEPT, PALETTE[5]][i],
                                 hovertemplate="%{x}: recall gain " + glabel[g] + " = %{y:.3f}<extra></extra>"), 3, 1)
        fig.update_yaxes(title_text="recall", range=[0, 1.02], row=1, col=1)
        fig.update_yaxes(title_text="JSD", rangemode="tozero", row=2, col=1)
        fig.update_xaxes(title_text=level, row=3, col=1)
        where = f"layer {layer}, per {level}"
    for row in (1, 2):
        _span(fig, "vline", 0.5, line=dict(color="#000", dash="dot", width=1), row=row, col=1)
        fig.update_xaxes(title_text="step r (≤ 0: prompt tail, ≥ 1: decode)", row=row, col=1)
    fig.update_yaxes(title_text="recall gain", row=3, col=1)
    ref = f"decode {shift.ref_start}…{shift.ref_end}" if shift.ref_end >= 0 else "external reference"
    return _finish(fig, f"Prefill→decode shift ({where}; top-{shift.k} recall vs {ref})",
                   _meta("shift_steps", model_id, params, level=level, layer=layer, k=shift.k, ref_start=shift.ref_start,
                         ref_end=shift.ref_end, r=r),
                   barmode="group", legend=dict(orientation="h", y=-0.14, x=0, yanchor="top"))


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


def kept_positions(results, prompt, highlight=None, *, layer: int | None = None, group: int | None = None,
                   model_id: str | None = None, params=None) -> go.Figure:
    """Prompt positions each eviction run kept: one heatmap row per (policy, budget), one column per token.

    The cell is the fraction of (compacted layer, KV group) caches that kept the position (or 0/1 for one
    ``layer`` and ``group``). Highlighted positions (the needle) are marked with green ticks on top and a
    shaded band; the answer passage (when the prompt knows it) is outlined. Row labels give the
    fraction of the highlighted positions kept (``GenerationResult.survival``).

    Args:
        results: ``GenerationResult`` list (e.g. ``run_policies``), all on the same prompt.
        prompt: the ``Prompt`` (or ``PromptSpans`` / ``Capture``) for the tokens.
        highlight: positions to mark, or a text occurring in the prompt (e.g. the needle).
        layer, group: one cache to show instead of the fraction over all compacted caches.
    """
    results = list(results)
    if not results:
        raise ValueError("results: must not be empty")
    sp = _spans_of(prompt)
    T = results[0].T
    if any(r.T != T for r in results):
        raise ValueError("results: must all be runs on the same prompt (equal T)")
    if sp is not None and sp.T != T:
        raise ValueError(f"prompt: has T = {sp.T} tokens, the results T = {T}")
    Lr, G = results[0].kept.shape[:2]
    if layer is not None:
        _check_int_range("layer", layer, 0, Lr - 1)
    if group is not None:
        _check_int_range("group", group, 0, G - 1)
    hi = _highlight_positions(highlight, sp, T)
    z, labels = [], []
    for r in results:
        kp = _np(r.kept_prompt)
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
            surv = _np(r.survival(hi))
            sub = surv[np.ix_(layers, groups)] if layers else np.array([math.nan])
            lab += f" ({np.nanmean(sub):.0%} kept)" if np.isfinite(sub).any() else ""
        labels.append(lab)
    toks = _tokens(sp, T)
    fig = _Draft.subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.07, 0.93], vertical_spacing=0.01)
    fig.add_trace(go.Scatter(x=hi, y=[0] * len(hi), name="highlight", mode="markers", showlegend=False,
                             marker=dict(symbol="triangle-down", color=ANSWER, size=9),
                             customdata=np.array([toks[p] for p in hi], dtype=object), meta={"customdata": ["token"]},
                             hovertemplate="%{x}: %{customdata}<extra>highlight</extra>"), 1, 1)
    fig.add_trace(go.Heatmap(z=_z(z), x=np.arange(T), y=labels, coloraxis="coloraxis", name="kept",
                             customdata=_rows(toks, len(results)), meta={"customdata": ["token"]},
                             hovertemplate="%{y}<br>%{x}: %{customdata}<br>kept %{z:.2f}<extra></extra>"), 2, 1)
    for p in hi:
        _span(fig, "vrect", p - 0.5, p + 0.5, fillcolor=ANSWER, opacity=0.2, line_width=0, row=2, col=1)
    ans = _answer_chunk(sp)
    if ans is not None:
        s, e = sp.chunks[ans]
        _span(fig, "vrect", s - 0.5, e - 0.5, line=dict(color=ANSWER, width=1.5), fillcolor="rgba(0,0,0,0)",
                      annotation_text="answer passage", annotation_position="top left",
                      annotation_font=dict(size=10, color="#fff"), row=2, col=1)
    fig.update_yaxes(visible=False, range=[-1, 1], row=1, col=1)
    fig.update_xaxes(showline=False, ticks="", showgrid=False, row=1, col=1)
    fig.update_yaxes(title_text="policy, budget", autorange="reversed", row=2, col=1)
    fig.update_xaxes(title_text="prompt position", range=[-0.5, T - 0.5], row=2, col=1)
    where = "fraction of compacted caches" if layer is None and group is None else \
        f"layer {'all' if layer is None else layer}, group {'all' if group is None else group}"
    return _finish(fig, f"Kept prompt positions per policy ({where})",
                   _meta("kept_positions", _model_id(model_id, prompt), params, highlight=hi, layer=layer, group=group,
                         runs=[{"policy": r.policy, "budget": r.budget, **_jsonable(r.params)} for r in results]),
                   coloraxis=dict(cmin=0, cmax=1, colorbar=dict(title=dict(text="kept"))), margin=dict(l=160))


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
    """Accuracy against budget per method, from a sweep frame (``workbench.sweep``): one line per ``by``
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
    fig = _Draft()
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
        fig.add_trace(go.Scatter(x=agg[x].tolist(), y=agg["mean"].tolist(), name=name, mode="lines+markers",
                                 line=dict(color=PALETTE[i % len(PALETTE)]),
                                 error_y=dict(type="data", array=agg["sem"].tolist(), thickness=1, width=3),
                                 customdata=_cd(agg["count"].tolist(), agg["sem"].tolist()),
                                 meta={"customdata": ["n", "sem"]},
                                 hovertemplate=name + ", " + x + " = %{x}: " + metric
                                 + " = %{y:.3f} ± %{customdata[1]:.3f} (n = %{customdata[0]})<extra></extra>"))
        i += 1
    xs = d[x].dropna()
    lo, hi = (float(xs.min()), float(xs.max())) if len(xs) else (0.0, 1.0)
    for j, (name, m, n) in enumerate(refs):
        fig.add_trace(go.Scatter(x=[lo, hi], y=[m, m], name=f"{name} (reference)", mode="lines",
                                 line=dict(color=[NEUTRAL, "#000", PALETTE[6]][j % 3], dash="dash"),
                                 hovertemplate=f"{html.escape(name)}: {metric} = {m:.3f} (n = {n})<extra></extra>"))
    models = sorted(str(m) for m in d["model"].unique()) if "model" in d.columns else []
    return _finish(fig, f"{metric} vs {_XLABEL.get(x, x)}",
                   _meta("accuracy_vs_budget", model_id or (", ".join(models) or None), params, metric=metric, x=x,
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
        by: grouping columns (default ``method`` + the budget column, or ``policy, budget``).
        metrics: metric columns (default: those of ``em, f1, contains, correct, first_token_agree, kept_mean``
            present).
    """
    if not isinstance(df, pd.DataFrame):
        raise ValueError(f"df: must be a pandas DataFrame, got {type(df).__name__}")
    d = _ok_rows(df).copy()
    if by is None:
        if "method" in d.columns:
            by = ["method"] + [c for c in ("p_budget", "p_target", "p_layer") if c in d.columns]
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
    fig = go.Figure(go.Table(
        header=dict(values=[f"<b>{html.escape(str(c))}</b>" for c in cols], align="left", fill_color="#eee",
                    font=dict(size=11)),
        cells=dict(values=[out[c].tolist() for c in cols], align=["left"] * len(by) + ["right"] * (len(cols) - len(by)),
                   format=fmt, font=dict(size=11), fill_color="white", line_color="#ddd"),
        name="table"))
    models = sorted(str(m) for m in d["model"].unique()) if "model" in d.columns else []
    return _finish(fig, "Accuracy and KV cache per method and budget",
                   _meta("kv_bytes_table", model_id or (", ".join(models) or None), params, by=by,
                         metrics=list(metrics), bytes_column=bcol, n_rows=int(len(d))),
                   margin=dict(l=10, r=10, t=40, b=10))


# ============================================================================= tidy data and in-place updates
def _col(v, n: int):
    """A per-point column of length ``n`` from a plotly array property (scalars and None broadcast)."""
    if v is None:
        return None
    if isinstance(v, (str, numbers.Number)):
        return [v] * n
    a = list(v)
    return a if len(a) == n else None


def figure_frame(fig) -> pd.DataFrame:
    """Tidy data of every trace of ``fig``: one row per plotted point (heatmaps: per cell; tables: per row).

    Columns: ``trace`` (index), ``name``, ``type``, ``xaxis``, ``yaxis``, then ``x, y`` (``z`` for heatmaps),
    ``text``, ``customdata`` (split into named columns when the trace's ``meta["customdata"]`` names them,
    else ``customdata_0, …``), ``color`` (per-point marker colours) and ``width``. Table traces give their
    header names as columns. HTML entities in labels are unescaped. Row counts equal the trace lengths.
    """
    parts = []
    for i, tr in enumerate(fig.data):
        base = {"trace": i, "name": tr.name, "type": tr.type}
        names = (tr.meta or {}).get("customdata") if isinstance(getattr(tr, "meta", None), dict) else None
        if tr.type == "table":
            heads = [html.unescape(re.sub(r"<[^>]*>", "", str(h))) for h in (tr.header.values if tr.header.values is not None else [])]
            cols = list(tr.cells.values if tr.cells.values is not None else [])
            n = max((len(c) for c in cols), default=0)
            d = {h or f"col_{j}": list(c) for j, (h, c) in enumerate(zip(heads, cols))}
            df = pd.DataFrame(d)
            for key, v in reversed(list(base.items())):
                df.insert(0, key, v)
            parts.append(df)
            continue
        base.update(xaxis=getattr(tr, "xaxis", None), yaxis=getattr(tr, "yaxis", None))
        if tr.type in ("heatmap", "contour"):
            z = np.array([[np.nan if v is None else v for v in row] for row in (tr.z if tr.z is not None else [])], dtype=float)
            ny, nx = z.shape if z.ndim == 2 else (0, 0)
            xs = list(tr.x) if tr.x is not None else list(range(nx))
            ys = list(tr.y) if tr.y is not None else list(range(ny))
            d = {"x": [xs[c] for r in range(ny) for c in range(nx)], "y": [ys[r] for r in range(ny) for c in range(nx)],
                 "z": z.reshape(-1).tolist()}
            for key in ("text", "customdata"):
                v = getattr(tr, key)
                if v is not None and not isinstance(v, str) and len(v) == ny:
                    flat = [v[r][c] for r in range(ny) for c in range(nx)]
                    if flat and isinstance(flat[0], (list, tuple)):
                        for j in range(len(flat[0])):
                            nm = names[j] if key == "customdata" and names and j < len(names) else f"{key}_{j}"
                            d[nm] = [f[j] for f in flat]
                    else:
                        d[names[0] if key == "customdata" and names else key] = flat
            df = pd.DataFrame(d)
        else:
            xs = None if tr.x is None else list(tr.x)
            ys = None if tr.y is None else list(tr.y)
            n = max(len(xs or []), len(ys or []))
            d = {}
            if xs is not None:
                d["x"] = xs
            if ys is not None:
                d["y"] = ys
            t = _col(tr.text, n) if hasattr(tr, "text") else None
            if t is not None:
                d["text"] = t
            cd = tr.customdata
            if cd is not None and len(cd) == n:
                rows = [list(r) if isinstance(r, (list, tuple, np.ndarray)) else [r] for r in cd]
                for j in range(len(rows[0]) if rows else 0):
                    nm = names[j] if names and j < len(names) else f"customdata_{j}"
                    d[nm] = [r[j] for r in rows]
            marker = getattr(tr, "marker", None)
            c = _col(marker.color, n) if marker is not None and not isinstance(marker.color, str) else None
            if c is not None:
                d["color"] = c
            w = _col(tr.width, n) if tr.type == "bar" and not isinstance(tr.width, numbers.Number) else None
            if w is not None:
                d["width"] = w
            df = pd.DataFrame(d)
        for key, v in reversed(list(base.items())):
            df.insert(0, key, [v] * len(df))
        parts.append(df)
    if not parts:
        return pd.DataFrame(columns=["trace", "name", "type"])
    out = pd.concat(parts, ignore_index=True, sort=False)
    for c in out.columns:
        if not pd.api.types.is_numeric_dtype(out[c]):
            out[c] = out[c].map(lambda v: html.unescape(v) if isinstance(v, str) else v)
    return out


_KEEP_LAYOUT = ("width", "height", "autosize", "uirevision", "dragmode", "template")


def _share_arrays(x):
    """A copy of plotly JSON whose dicts and lists are new but whose read-only numpy arrays are shared
    (plotly stores validated arrays read-only): ``to_plotly_json`` deep-copies every element of an object
    array, ~10 ms per 18k token labels on each slider move."""
    if isinstance(x, dict):
        return {k: _share_arrays(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_share_arrays(v) for v in x]
    if isinstance(x, np.ndarray) and x.flags.writeable:
        return x.copy()
    return x


def update_figure(target, new, *, keep: Sequence[str] = _KEEP_LAYOUT) -> bool:
    """Make ``target`` (a ``go.Figure`` or ``go.FigureWidget``) show ``new`` without rebuilding it.

    When both have the same number of traces with the same types in the same order, every trace's
    top-level properties and the layout (titles, annotations, shapes, axes, ``meta``) are replaced by
    ``new``'s in ONE ``plotly_update`` (a FigureWidget sends one message holding only what changed).
    ``new`` is a validated figure, or a draft from inside :func:`drafts` (made of validated pieces), so
    its JSON is written as it is: nothing is validated twice, which is what makes a slider move cheap.
    Otherwise the traces are replaced. Layout keys named in ``keep`` (size, ``uirevision``, template)
    stay as they are in ``target``.

    Returns:
        ``True`` if the traces were updated in place, ``False`` if they were replaced.
    """
    if isinstance(new, _Draft):
        same = len(target.data) == len(new.traces) and all(
            a.type == b.get("type", "scatter") for a, b in zip(target.data, new.traces))
        if not same:
            return update_figure(target, new.figure(), keep=keep)
        new_traces, new_layout_src = new.traces, new.layout
    else:
        same = len(target.data) == len(new.data) and all(a.type == b.type for a, b in zip(target.data, new.data))
        new_traces, new_layout_src = [tr._props for tr in new.data], new._layout
    new_layout = {k: v for k, v in _share_arrays(new_layout_src).items() if k not in keep}
    relayout = {k: None for k in target._layout if k not in new_layout and k not in keep}
    relayout.update(new_layout)
    # plotly_update writes raw JSON; it only takes paths the target already knows (a new subplot axis is not)
    fits = all(k in target.layout for k in relayout)
    if same and fits:
        from plotly.basedatatypes import Undefined  # "leave this trace's value alone"

        new_data = [_share_arrays(tr) for tr in new_traces]
        own = [(set(n) | set(o)) - {"type", "uid"} for n, o in zip(new_data, target._data)]
        if all(k in tr for tr, keys in zip(target.data, own) for k in keys):
            restyle = {k: [d.get(k) if k in keys else Undefined for d, keys in zip(new_data, own)]
                       for k in sorted(set().union(*own))}
            target.plotly_update(restyle_data=restyle, relayout_data=relayout,
                                 trace_indexes=list(range(len(new_data))))
            return True
    if isinstance(new, _Draft):
        return update_figure(target, new.figure(), keep=keep)
    with target.batch_update():
        if not same:
            target.data = ()
            target.add_traces(list(new.data))
        else:
            for old_tr, new_tr in zip(target.data, new.data):
                nj = new_tr.to_plotly_json()
                for key in set(old_tr.to_plotly_json()) - set(nj) - {"type", "uid"}:
                    old_tr[key] = None
                nj.pop("type", None)
                nj.pop("uid", None)
                old_tr.update(nj, overwrite=True)
        for k, v in relayout.items():
            target.layout[k] = v
    return same
