"""The one module that reads other libraries' private state, each read with a public fallback.

A slider move re-lays a figure out and sends only what changed; plotly's public accessors copy every array
(``to_plotly_json`` deep-copies a trace), so the figure engine reads plotly's own property dicts
(``trace._props``, ``fig._layout``, ``fig._data``) and the subplot grid ``make_subplots`` built
(``fig._grid_ref``), and the figure widget reads the edit ids a plotly view answers to
(``_last_trace_edit_id``) and the traits ipywidgets is setting from the page (``_property_lock``). No public API
gives these without a copy or at all, so each read is here, next to its public fallback.

The fallback engages, with one :class:`PrivateAPIWarning`, when a private name is gone (a new plotly or
ipywidgets), or for every read when :func:`force_public` is on (``$WORKBENCH_PUBLIC_ONLY=1`` at import): plotly's
public copies instead of its dicts, a grid rebuilt from ``get_subplot``, and plotly's stock ``FigureWidget``
instead of the workbench's (:func:`workbench.show.figure_widget.figure_widget`), which then gives up the binary
2-D arrays and the relay to views anywidget gave up on. ``tests/test_public_api.py`` checks that no other module
reads a private name; the panels' tests run with the fallback forced as well.
"""
from __future__ import annotations

import os
import types
import warnings

import plotly.graph_objects as go

__all__ = ["PUBLIC_ONLY_ENV", "PrivateAPIWarning", "force_public", "public_only", "trace_props", "layout_props",
           "figure_traces", "subplot_grid", "edit_ids", "state_lock", "widget_internals_ok"]

PUBLIC_ONLY_ENV = "WORKBENCH_PUBLIC_ONLY"  # "1": every read below takes its public fallback
_STATE = {"forced": os.environ.get(PUBLIC_ONLY_ENV, "") not in ("", "0")}
_WARNED: set[str] = set()


class PrivateAPIWarning(RuntimeWarning):
    """A private name of plotly or ipywidgets the workbench reads is gone: the public fallback is used."""


def force_public(on: bool = True) -> bool:
    """Take every public fallback (``on``) or the private reads again; returns the previous setting."""
    before = _STATE["forced"]
    _STATE["forced"] = bool(on)
    return before


def public_only() -> bool:
    """Whether the public fallbacks are forced (:func:`force_public`, ``$WORKBENCH_PUBLIC_ONLY``)."""
    return _STATE["forced"]


def _missing(what: str) -> None:
    """Say once per process and name that a private name is gone and its public fallback serves."""
    if what not in _WARNED:
        _WARNED.add(what)
        warnings.warn(f"{what} is gone from this version; the workbench uses its public fallback (slower, or "
                      "plotly's stock figure widget)", PrivateAPIWarning, stacklevel=3)


def _private(obj, name: str, what: str):
    """``obj.<name>``, or None when the fallback is forced or the name is gone (said once)."""
    if _STATE["forced"]:
        return None
    value = getattr(obj, name, None)
    if value is None:
        _missing(what)
    return value


def trace_props(trace) -> dict:
    """A trace's property dict: plotly's own (not copied), or its public deep copy."""
    props = _private(trace, "_props", "plotly's trace._props")
    return props if isinstance(props, dict) else trace.to_plotly_json()


def layout_props(fig: go.Figure) -> dict:
    """A figure's layout dict: plotly's own (not copied), or its public deep copy."""
    props = _private(fig, "_layout", "plotly's figure._layout")
    return props if isinstance(props, dict) else fig.layout.to_plotly_json()


def figure_traces(fig: go.Figure) -> list[dict]:
    """A figure's trace dicts: plotly's own (not copied), or their public deep copies."""
    data = _private(fig, "_data", "plotly's figure._data")
    return data if isinstance(data, list) else [tr.to_plotly_json() for tr in fig.data]


def subplot_grid(fig: go.Figure, rows: int, cols: int) -> list[list]:
    """``make_subplots``' grid: per cell a tuple of refs with ``trace_kwargs`` (``{"xaxis": "x2", "yaxis": "y3"}``;
    a second one for a secondary y), or None for a cell no subplot starts in. Plotly's own, or rebuilt from the
    public ``get_subplot``."""
    grid = _private(fig, "_grid_ref", "plotly's figure._grid_ref")
    if isinstance(grid, list):
        return grid
    ref = lambda ax: ax.plotly_name.replace("axis", "")  # noqa: E731 - "xaxis2" -> "x2"
    out = []
    for r in range(1, rows + 1):
        row = []
        for c in range(1, cols + 1):
            cells = []
            for secondary in (False, True):
                try:
                    sub = fig.get_subplot(r, c, secondary_y=secondary)
                except ValueError:  # not an xy cell
                    sub = None
                if sub is None or not hasattr(sub, "xaxis"):
                    break
                cells.append(types.SimpleNamespace(trace_kwargs={"xaxis": ref(sub.xaxis), "yaxis": ref(sub.yaxis)}))
            row.append(tuple(cells) or None)
        out.append(row)
    return out


def edit_ids(widget: go.FigureWidget) -> tuple[int, int] | None:
    """The last trace and layout edit ids a plotly view answers to, or None (no private reads)."""
    t = _private(widget, "_last_trace_edit_id", "plotly's FigureWidget._last_trace_edit_id")
    lay = _private(widget, "_last_layout_edit_id", "plotly's FigureWidget._last_layout_edit_id")
    return None if t is None or lay is None else (int(t), int(lay))


def state_lock(widget) -> dict:
    """The traits ipywidgets is setting from the page right now (its echo guard), or ``{}``."""
    lock = _private(widget, "_property_lock", "ipywidgets' Widget._property_lock")
    return lock if isinstance(lock, dict) else {}


def widget_internals_ok() -> bool:
    """Whether the workbench's figure widget can run: not forced public, and plotly's widget still has the
    traits and edit ids it overrides and reads (said once when not)."""
    if _STATE["forced"]:
        return False
    names = go.FigureWidget.class_trait_names()
    need = ("_widget_layout", "_widget_data", "_py2js_addTraces", "_py2js_deleteTraces", "_py2js_relayout",
            "_last_trace_edit_id", "_last_layout_edit_id", "_property_lock")
    gone = [n for n in need if n not in names]
    if gone:
        _missing(f"plotly's FigureWidget traits {', '.join(gone)}")
    return not gone
