"""Every plotly speed trick, fenced in this one file (see ``workbench.show.plots`` for why; its reads of plotly's
own dicts go through :mod:`workbench.show.private_compat`).

- :class:`Draft` — multi-panel figures drafted as plain dicts with the same calls as ``go.Figure`` and
  validated once; a figure function's ``.draft`` (:func:`figure_function`) lets widgets skip the final
  ``go.Figure``;
- :func:`add_span` — one shape per spanning line (plotly's ``add_vline``/``add_hline`` re-assign the whole
  shape tuple per call);
- :func:`update_figure` — one ``plotly_update`` per slider move, sharing plotly's read-only arrays;
- :func:`figure_frame` — any figure's plotted data as one tidy DataFrame (CSV export).

The widget that shows these figures in a notebook, and its ES module, is :mod:`workbench.show.figure_widget`.
"""

import contextvars
import copy
import functools
import html
import numbers
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly import shapeannotation
from plotly.basedatatypes import Undefined
from plotly.subplots import make_subplots

from workbench.show.private_compat import figure_traces, layout_props, subplot_grid, trace_props
from workbench.show.theme import TEMPLATE
from workbench.util import jsonable

__all__ = ["figure_function", "as_figure", "figure_frame", "update_figure"]


def figure_meta(figure: str, model_id, params=None, **kw) -> dict:
    """The ``layout.meta`` dict: figure name, model id, keyword parameters, then the user's ``params``."""
    d = {"figure": figure, "model_id": model_id}
    d.update({k: jsonable(v) for k, v in kw.items()})
    if params is not None:
        p = jsonable(params)
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


class Draft:
    """A figure under construction as plain dicts, validated ONCE when :func:`finish` makes the ``go.Figure``.

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
    def of(cls, fig: go.Figure) -> "Draft":
        """A draft of a validated figure (dicts copied, read-only arrays shared), e.g. to re-lay it out."""
        d = cls()
        d.traces = [_share_arrays(trace_props(tr)) for tr in fig.data]
        d.layout = _share_arrays(layout_props(fig))
        return d

    @classmethod
    def subplots(cls, **kw) -> "Draft":
        """``make_subplots(**kw)``'s grid; plotly builds it once per argument set, later calls copy its layout."""
        key = repr(sorted(kw.items()))
        if key not in cls._GRIDS:
            ref = make_subplots(**kw)
            cls._GRIDS[key] = (ref.layout.to_plotly_json(), subplot_grid(ref, kw.get("rows", 1), kw.get("cols", 1)))
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
        d = _share_arrays(trace_props(trace)) if hasattr(trace, "to_plotly_json") else dict(trace)
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


# set only while a figure function's ``.draft`` runs (:func:`figure_function`): the figure functions it calls
# return their drafts too; no caller outside this module sets it
_AS_DRAFT = contextvars.ContextVar("workbench_plots_as_draft", default=False)


def figure_function(fn):
    """Make ``fn`` (a figure function built on :func:`finish`) return a ``go.Figure``, always, and give it a
    ``.draft(...)`` twin, with the same arguments, that returns the :class:`Draft` (plain dicts made of
    validated pieces) instead. :func:`update_figure` writes a draft into a widget without building,
    validating and deep-copying a whole ``go.Figure`` first (~15 ms per figure at T = 2048): the widget
    panels ask for drafts explicitly (``plots.head_heatmap.draft(pool)``); everyone else gets figures."""

    @functools.wraps(fn)
    def figure(*args, **kwargs):
        out = fn(*args, **kwargs)
        return out if _AS_DRAFT.get() else as_figure(out)  # inside a .draft: the caller's draft

    def draft(*args, **kwargs):
        token = _AS_DRAFT.set(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _AS_DRAFT.reset(token)

    draft.__name__ = draft.__qualname__ = f"{fn.__name__}.draft"
    draft.__doc__ = f"``{fn.__name__}(...)`` as a :class:`~workbench.show.figure_engine.Draft` (see figure_function)."
    figure.draft = draft
    return figure


def as_figure(fig) -> go.Figure:
    """``fig`` as a ``go.Figure`` (a draft from a figure function's ``.draft`` is validated here)."""
    return fig.figure() if isinstance(fig, Draft) else fig


def _undrawn(y) -> bool:
    """Whether a trace's ``y`` draws nothing (every value missing or non-finite)."""
    if y is None or isinstance(y, str):
        return False
    try:
        a = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):  # categorical values: drawn
        return False
    return a.size > 0 and not np.isfinite(a).any()


def _legend_only_drawn(traces) -> None:
    """Legends list only drawn traces: a trace whose every ``y`` is missing (no certificate ``U_l``, no audit
    bound) leaves the legend (``showlegend=False``), in place; the trace stays, so updates keep the structure."""
    for t in traces:
        get = t.get if isinstance(t, dict) else (lambda k, _t=t: getattr(_t, k, None))
        if get("showlegend") is False or not _undrawn(get("y")):
            continue
        if isinstance(t, dict):
            t["showlegend"] = False
        else:
            t.showlegend = False


def finish(fig, title: str, meta: dict, *, aspect: dict | None = None, **layout) -> go.Figure:
    """Title, ``meta`` and the workbench template; a :class:`Draft` becomes its ``go.Figure`` here (or
    stays a draft inside a figure function's ``.draft``: :func:`figure_function`). ``aspect``: the export height / width per column preset
    (``{"single": …, "double": …}``, into ``meta["aspect"]``; multi-panel figures need more height).
    Traces that draw nothing leave the legend (:func:`_legend_only_drawn`)."""
    if aspect is not None:
        meta = {**meta, "aspect": dict(aspect)}
    _legend_only_drawn(fig.traces if isinstance(fig, Draft) else fig.data)
    if isinstance(fig, Draft):
        fig.update_layout(title=dict(text=title), meta=meta, **layout)
        fig.layout["template"] = TEMPLATE
        return fig if _AS_DRAFT.get() else fig.figure()
    fig.update_layout(template=TEMPLATE, title=dict(text=title), meta=meta, **layout)
    return fig


def add_span(fig: "Draft", kind: str, a: float, b: float | None = None, *, row: int | None = None,
          col: int | None = None, secondary_y: bool = False, annotation_text: str | None = None,
          annotation_position: str | None = None, annotation_font: dict | None = None, **shape) -> None:
    """``fig.add_vline`` / ``add_hline`` / ``add_vrect`` (``kind`` = ``"vline"``, ``"hline"``, ``"vrect"``) on a
    :class:`Draft`: the same shapes and annotations plotly draws (on every non-empty subplot when
    ``row``/``col`` are None, as plotly's ``row="all"``), without plotly re-assigning the whole shape tuple
    per call (nine head separators cost ~100 ms that way)."""

    if row is None and fig._has_subplots():
        for r, c in list(fig.cells()):
            add_span(fig, kind, a, b, row=r, col=c, annotation_text=annotation_text,
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


def as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def plot_array(x) -> np.ndarray:
    """A float64 array for plotly with non-finite values as NaN (a gap). numpy arrays, not lists: plotly
    validates lists element by element (a 9 × 2048 heatmap: ~140 ms as lists, ~1 ms as an array)."""
    a = as_numpy(x).astype(np.float64)
    return np.where(np.isfinite(a), a, np.nan)



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
            heads = [html.unescape(re.sub(r"<[^>]*>", "", re.sub(r"<br\s*/?>", " ", str(h)))) for h in (tr.header.values if tr.header.values is not None else [])]
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


KEEP_LAYOUT = ("width", "height", "autosize", "uirevision", "dragmode", "template")


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


def update_figure(target, new, *, keep: Sequence[str] = KEEP_LAYOUT) -> bool:
    """Make ``target`` (a ``go.Figure`` or ``go.FigureWidget``) show ``new`` without rebuilding it.

    When both have the same number of traces with the same types in the same order, every trace's
    top-level properties and the layout (titles, annotations, shapes, axes, ``meta``) are replaced by
    ``new``'s in ONE ``plotly_update`` (a FigureWidget sends one message holding only what changed).
    ``new`` is a validated figure, or a draft from a figure function's ``.draft`` (made of validated pieces), so
    its JSON is written as it is: nothing is validated twice, which is what makes a slider move cheap.
    Otherwise the traces are replaced. Layout keys named in ``keep`` (size, ``uirevision``, template)
    stay as they are in ``target``.

    Returns:
        ``True`` if the traces were updated in place, ``False`` if they were replaced.
    """
    if isinstance(new, Draft):
        same = len(target.data) == len(new.traces) and all(
            a.type == b.get("type", "scatter") for a, b in zip(target.data, new.traces))
        if not same:
            return update_figure(target, new.figure(), keep=keep)
        new_traces, new_layout_src = new.traces, new.layout
    else:
        same = len(target.data) == len(new.data) and all(a.type == b.type for a, b in zip(target.data, new.data))
        new_traces, new_layout_src = [trace_props(tr) for tr in new.data], layout_props(new)
    new_layout = {k: v for k, v in _share_arrays(new_layout_src).items() if k not in keep}
    relayout = {k: None for k in layout_props(target) if k not in new_layout and k not in keep}
    relayout.update(new_layout)
    # plotly_update writes raw JSON; it only takes paths the target already knows (a new subplot axis is not)
    fits = all(k in target.layout for k in relayout)
    # a plotly_update keeps the old length of a shape/annotation list (a new line would be lost): assign those
    fits = fits and all(len(relayout.get(k) or ()) == len(target.layout[k] or ()) for k in ("shapes", "annotations")
                        if k in relayout)
    if same and fits:

        new_data = [_share_arrays(tr) for tr in new_traces]
        own = [(set(n) | set(o)) - {"type", "uid"} for n, o in zip(new_data, figure_traces(target))]
        if all(k in tr for tr, keys in zip(target.data, own) for k in keys):
            restyle = {k: [d.get(k) if k in keys else Undefined for d, keys in zip(new_data, own)]
                       for k in sorted(set().union(*own))}
            target.plotly_update(restyle_data=restyle, relayout_data=relayout,
                                 trace_indexes=list(range(len(new_data))))
            return True
    if isinstance(new, Draft):
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
