"""The panel base class (``Panel``), slider specifications and shared helpers of the interactive panels."""
from __future__ import annotations

import abc
import html
import time
import warnings
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

import ipywidgets as W
import plotly.graph_objects as go

from workbench.analyse.params import PRIORITIES, EntroPrefillParams
from workbench.analyse.pooling import PoolingCache
from workbench.constraints import index_into
from workbench.show import export
from workbench.show.figure_engine import KEEP_LAYOUT, Draft, as_figure, update_figure
from workbench.show.figure_widget import FigureWidget, figure_widget
from workbench.show.interactive import export_interactive
from workbench.show.notation import tooltip
from workbench.show.paper_layout import paper_layout
from workbench.show.private_compat import widget_internals_ok
from workbench.show.token_view import TokenView
from workbench.show.widgets.sliders import SLIDERS, SliderSpec, control_value
from workbench.show.widgets.state import CaptureState
from workbench.show.widgets.token_widget import TokenWidget
from workbench.show.widgets.values import accepts, widget_tree
from workbench.util import one_thread

if TYPE_CHECKING:
    from workbench.capture.data import Capture

__all__ = ["Panel", "SliderSpec", "SLIDERS"]


#: the live figures' width (px): the layout rules of ``paper_layout`` are applied at this width, in the browser too,
#: or at the room the page gives a panel's figures where that is less (a narrow window, a side bar open: each figure's
#: view reports it, :attr:`FigureWidget._view_width`), but never under :data:`MIN_FIGURE_WIDTH`
FIGURE_WIDTH = 660
MIN_FIGURE_WIDTH = 420
FIGURE_HEIGHT = (300, 900)  # the live height: the figure's double-column aspect × the width, within these


KEEP_SIZED = tuple(k for k in KEEP_LAYOUT if k not in ("width", "height", "autosize"))  # what a resized figure keeps


def live_width(room: int) -> int:
    """The live figures' width for ``room`` px of the page (0: not known yet): :data:`FIGURE_WIDTH`, or less where
    the room is less, but at least :data:`MIN_FIGURE_WIDTH`."""
    return FIGURE_WIDTH if room <= 0 else int(min(FIGURE_WIDTH, max(MIN_FIGURE_WIDTH, room)))


def live_layout(fig, width: int = FIGURE_WIDTH):
    """``fig`` (a ``go.Figure`` or a draft) laid out for the screen at ``width`` px by the same rules as the
    paper files (:func:`workbench.show.paper_layout.paper_layout`: the title above a legend in a reserved
    margin, axis titles fitted, the gaps between stacked panels widened, ticks thinned), with its size set;
    returns a draft (what :func:`update_figure` writes into a widget). A token view passes unchanged."""
    if isinstance(fig, TokenView):
        return fig
    d = fig if isinstance(fig, Draft) else Draft.of(fig)
    lay = d.layout
    meta = lay.get("meta") if isinstance(lay.get("meta"), dict) else {}
    aspect = (meta.get("aspect") or {}).get("double") if isinstance(meta.get("aspect"), dict) else None
    h = lay.get("height") or (width * float(aspect) if aspect else 450)
    h = int(round(min(max(h, FIGURE_HEIGHT[0]), FIGURE_HEIGHT[1])))
    h = paper_layout({"data": d.traces, "layout": lay}, width, h, preset=None, title=True, max_height=FIGURE_HEIGHT[1])
    lay.update(width=width, height=h, autosize=False)
    return d


def _hide(w) -> bool:
    """Hide a figure widget in the page (its views stay): a plotly figure by its ``_hidden`` trait (its ``layout`` is
    plotly's), a token view by its widget layout. False for plotly's stock widget (the public fallback), which
    has no way to hide: it is taken out of the page instead."""
    if isinstance(w, FigureWidget):
        w._hidden = True
    elif isinstance(w, go.FigureWidget):
        return False
    else:
        w.layout.display = "none"
    return True


def _widget_figure(fig, uirevision: str):
    """The widget of a figure: a :class:`~workbench.show.figure_widget.FigureWidget` (its comm opens with the
    figure), or a :class:`TokenWidget` for a token view (HTML)."""
    if isinstance(fig, TokenView):
        return TokenWidget(fig)
    return figure_widget(fig, uirevision=uirevision)


def html_escape(s) -> str:
    return html.escape(str(s))


def head_dim_of(capture: Capture, default: int = 64) -> int:
    """The capture's head dimension (:attr:`Capture.head_dim`, from the model config); ``default`` for a synthetic
    capture, which has no model, and with a warning for any other capture that does not know it."""
    d = capture.head_dim
    if d is None:
        if capture.model_id != "synthetic":
            warnings.warn(f"capture of {capture.model_id!r} records no head dimension: the KV byte counts take "
                          f"d = {default} (pass head_dim= to the panel)", stacklevel=3)
        return default
    return d


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


# ----------------------------------------------------------------------------- base panel
class Panel(abc.ABC):
    """Base class: controls on top, a status line, then the figures side by side.

    Subclasses fill ``self.controls`` and implement :meth:`compute` (parameters → ``{name: go.Figure}``
    and a status HTML string). ``update()`` runs on every control change; its last timings are in
    ``self.timings`` (``analysis_ms``: the science, ``figure_ms``: building the plotly figures,
    ``sync_ms``: copying them into the widgets, ``total_ms``) and ``self.n_updates`` counts updates.
    """

    title = "panel"
    #: control name → its key in the notation table where they differ (e.g. the token view's page index)
    TOOLTIP_KEYS: dict[str, str] = {}
    #: controls whose value is not kept when a new capture is shown (it would mean another thing there)
    KEEP_NOT: tuple[str, ...] = ()
    #: figures that leave the figure row when :meth:`compute` stops returning them (a mode switched off)
    TRANSIENT: tuple[str, ...] = ()

    def __init__(self):
        self.controls: dict[str, W.Widget] = {}
        self.figures: dict[str, go.FigureWidget] = {}
        self.status = W.HTML(layout=W.Layout(width="auto"))
        self.timings: dict[str, float] = {}
        self.n_updates = 0
        self.error: str | None = None
        self._extra: list[W.Widget] = []
        self._silent = False
        self._analysis_ms = 0.0
        self._state: CaptureState | None = None
        self._kept: dict | None = None  # control values to keep while a new capture is set up
        #: the width (px) the figures are laid out at: :func:`live_width` of the room the page reports; plotly's stock
        #: widget (the public fallback) reports none, so there the narrowest live width, which every room holds
        self.live_width = FIGURE_WIDTH if widget_internals_ok() else MIN_FIGURE_WIDTH

    #: whether the panel can show a new capture in place (:meth:`set_capture`; the panel defines ``_setup``)
    follows_capture = False

    def _source(self, capture: Capture | CaptureState) -> Capture:
        """The capture a panel is built on: ``capture`` itself, or a :class:`CaptureState`'s capture (the panel
        then follows the state: it joins once built)."""
        if isinstance(capture, CaptureState):
            self._state = capture
            return capture.capture
        return capture

    @property
    def state(self) -> CaptureState | None:
        """The shared state the panel follows, or ``None``."""
        return self._state

    @property
    def pooling_cache(self) -> PoolingCache:
        """The panel's own :class:`~workbench.analyse.pooling.PoolingCache` of the capture it shows (a new one
        for a new capture): slider moves that keep ``ζ``, ``τ`` and ``ρ_min`` re-use the pooling."""
        cache = self.__dict__.get("_pooling_cache")
        if cache is None or cache.capture is not self.capture:
            cache = self._pooling_cache = PoolingCache(self.capture)
        return cache

    def set_capture(self, capture: Capture) -> None:
        """Show ``capture`` in place: the controls get the new capture's ranges (layers, chunks, rows), keep
        the values still valid there, and every figure and the status are drawn from it, replaced in one step (no
        figure of the old capture next to a status of the new one). A capture the panel cannot show (e.g. no
        chunk for a priority panel) raises ``ValueError``; the panel then keeps its previous capture, controls
        and figures, and its status line says why.

        The new figures are new widgets, born with their data (an edit that reaches a plotly view while it draws
        its first plot can be lost). The previous ones are hidden, not removed: plotly's view purges its graph when
        removed, and a draw still under way then fails; they are closed at the next new capture. The panel's
        container stays; the box of controls gets the new controls."""
        if not self.follows_capture:
            raise ValueError(f"capture: {type(self).__name__} cannot show a new capture in place (it runs the model "
                             f"on its own prompt); build a new panel")
        if capture is self.capture:
            return
        saved, shown = dict(self.__dict__), self.widget.children
        saved["_control_rows"] = self._controls_box.children
        before = {id(w): w for c in shown for w in widget_tree(c)}
        self._kept = self.params()
        try:
            self._setup(capture)
        except ValueError as e:
            made = list(self.controls.values())  # the new controls, if _setup got that far
            self.__dict__.clear()
            self.__dict__.update(saved)
            self._controls_box.children = saved["_control_rows"]
            for w in {id(x): x for m in made for x in widget_tree(m) if id(x) not in before}.values():
                w.close()
            self.error = f"this panel still shows the previous capture: {e}"
            self.status.value = f"<span style='color:#D55E00'>{html_escape(self.error)}</span>"
            raise
        finally:
            self._kept = None
        now = {id(w) for c in (*self.widget.children, *self._removed) for w in widget_tree(c)}  # _removed: closed later
        for i, w in before.items():
            if i not in now:
                w.close()  # the previous capture's controls (its figures are hidden, closed at the next capture)
        self.error = None
        self.n_updates += 1

    def _start_layer(self, L: int, layer: int | None) -> int:
        """The layer slider's first value: ``layer`` (checked against ``[0, L-1]``) when the panel is built, else
        the middle layer (a new capture: the kept value replaces it where it is still a layer)."""
        if layer is None or self._kept is not None:
            return L // 2
        return index_into(L).check("layer", layer)

    def _keep_values(self) -> None:
        """Set the kept control values (:meth:`set_capture`) that the new controls accept."""
        for name, v in (self._kept or {}).items():
            w = None if name in self.KEEP_NOT else self.controls.get(name)
            if w is not None and accepts(w, v):
                w.value = v

    def _analyse(self):
        """``self.analysis()``, timed into ``self._analysis_ms``."""

        t0 = time.perf_counter()
        with one_thread():  # small tensors: thread start-up costs more than the arithmetic
            out = self.analysis()
        self._analysis_ms = _ms(t0)
        return out

    @abc.abstractmethod
    def analysis(self):
        """The pure analysis result(s) for the current controls (no figures)."""

    # ----- building -----
    def tooltip(self, name: str) -> str:
        """The tooltip of control ``name``: its row of the notation table (:mod:`workbench.show.notation`)."""
        return tooltip(self.TOOLTIP_KEYS.get(name, name))

    def _finish(self) -> None:
        """Compute once, build the figure widgets and the container, and watch the controls. Every control
        gets its tooltip from the notation table (unless a panel set a more specific one)."""
        for name, w in self.controls.items():
            if not w.tooltip:
                w.tooltip = self.tooltip(name)
        self._keep_values()
        figs, status = self.compute()
        rows = self.control_rows()
        for w in self.controls.values():
            w.observe(self._on_change, names="value")
        if getattr(self, "widget", None) is not None:  # a new capture (set_capture): new figures, born with it
            self.status.value = status
            # A figure set aside leaves in three captures: hidden (removing a view while plotly draws fails), out of
            # the box, closed (closed in the page, plotly's autosize sends on a closed comm: "no comm channel defined")
            for w in self._removed:  # out of the page since the capture before: no view left
                w.close()
            self._removed, self._retired = self._retired, list(self.figures.values())
            kept = [w for w in self._retired if _hide(w)]
            self.figures = {name: self._new_figure(f, name) for name, f in figs.items()}
            self._figure_box.children = (*kept, *self.figures.values())
            self._controls_box.children = rows
            return
        self.status.value = status
        self.figures = {name: self._new_figure(f, name) for name, f in figs.items()}
        # the button and the width keep their size when the links beside them grow (they had squeezed the
        # button to "⬇ …" in a narrow window); the links take the rest of the row and wrap
        self.export_button = W.Button(description="export figures", icon="download",
                                      tooltip="write every figure (PDF, SVG, PNG, JSON sidecar, CSV) to a folder",
                                      layout=W.Layout(width="auto", flex="0 0 auto"))
        self.export_width = W.Dropdown(options=[("single column (3.33 in)", "single"),
                                                ("double column (7 in)", "double"), ("both widths", "both")],
                                       value="single", description="width",
                                       layout=W.Layout(width="260px", flex="0 0 auto"),
                                       tooltip="the paper width of the exported files (layout and fonts follow)")
        self.export_links = W.HTML(layout=W.Layout(flex="1 1 auto", min_width="0"))
        self.export_button.on_click(lambda _b: self.export_clicked())
        self._figure_box = W.HBox(list(self.figures.values()), layout=W.Layout(flex_flow="row wrap"))
        self._controls_box = W.VBox(rows)
        self._retired: list = []  # the figures of the capture before, hidden (set_capture)
        self._removed: list = []  # those of the capture before that, out of the box, closed at the next capture
        self.widget = W.VBox([W.HTML(f"<b>{html_escape(self.title)}</b>"), self._controls_box, self.status,
                              *self._extra, self._figure_box,
                              W.HBox([self.export_button, self.export_width, self.export_links])])
        if self._state is not None:
            self._state.follow(self)

    def control_rows(self) -> list[W.Widget]:
        """The rows of controls above the status line (three controls a row, in the order of ``controls``)."""
        ctrl = list(self.controls.values())
        return [W.HBox(ctrl[i:i + 3], layout=W.Layout(flex_flow="row wrap")) for i in range(0, len(ctrl), 3)]

    def _new_figure(self, fig, name: str):
        """The widget of figure ``name``, laid out at the live width; a plotly one reports the room its view has."""
        fw = _widget_figure(as_figure(live_layout(fig, self.live_width)), name)
        if isinstance(fw, FigureWidget):
            fw.observe(self._on_room, names="_view_width")
        return fw

    def _on_room(self, change) -> None:
        """A figure's view reports the room the page gives it (px): the figures are laid out again at the live
        width that room allows (:func:`live_width`), when that differs from the present one."""
        w = live_width(int(change["new"] or 0))
        if w != self.live_width:
            self.live_width = w
            self.update()

    def _add_figure(self, name: str, fig: go.Figure) -> go.FigureWidget:
        """A figure that appears later (e.g. the drift after the first run) joins the figure row."""

        fw = self._new_figure(fig, name)
        self.figures[name] = fw
        box = self._figure_box
        box.children = tuple(box.children) + (fw,)
        return fw

    def _drop_figure(self, name: str) -> None:
        """A figure of :attr:`TRANSIENT` leaves the figure row (and the export) when its mode is switched off."""
        fw = self.figures.pop(name)
        self._figure_box.children = tuple(c for c in self._figure_box.children if c is not fw)

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    # ----- parameters -----
    def params(self) -> dict:
        """Current control values, ``{name: value}`` (plain Python scalars and strings), exactly as computed with."""
        out = {}
        for k, w in self.controls.items():
            v = w.value
            out[k] = float(v) if isinstance(v, float) else v
        return out

    def sidecar_params(self) -> dict:
        """:meth:`params` as an export's sidecar writes them: floats without the widget's float noise
        (:func:`~workbench.show.widgets.sliders.control_value`: ζ = 0.35, not 0.35000000000000003)."""
        return {"panel": type(self).__name__, **{k: control_value(w) for k, w in self.controls.items()}}

    def set(self, **values) -> None:
        """Set several controls at once and update once (values are clamped by the sliders)."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"values: unknown controls {sorted(unknown)}; known: {sorted(self.controls)}")
        self._silent = True
        try:
            for k, v in values.items():
                self.controls[k].value = v
        finally:
            self._silent = False
        self.update()

    # ----- updating -----
    @abc.abstractmethod
    def compute(self) -> tuple[dict[str, go.Figure], str]:
        """Figures for the current controls, ``{name: figure or draft}`` (a figure function's ``.draft``), and a status line."""

    def _on_change(self, change) -> None:
        if not self._silent:
            self.update()

    def update(self) -> None:
        """Recompute from the current controls and update every figure in place."""

        t0 = time.perf_counter()
        try:
            figs, status = self.compute()  # drafts (``plots.<figure>.draft``): written into the widgets as dicts
            figs = {name: live_layout(f, self.live_width) for name, f in figs.items()}  # the rules, every update
        except ValueError as e:  # a parameter combination the analysis rejects: say so, keep the figures
            self.error = str(e)
            self.status.value = f"<span style='color:#D55E00'>{html_escape(e)}</span>"
            self.timings = {"analysis_ms": _ms(t0), "figure_ms": 0.0, "sync_ms": 0.0, "total_ms": _ms(t0)}
            return
        self.error = None
        t1 = time.perf_counter()
        for name in [n for n in self.TRANSIENT if n in self.figures and n not in figs]:
            self._drop_figure(name)
        for name, fig in figs.items():
            if isinstance(self.figures.get(name), TokenWidget):
                self.figures[name].show(fig)
            elif name in self.figures:
                fw = self.figures[name]
                # the size stays as drawn, unless the layout needs another (the page's room changed, or the content
                # needs a taller canvas): the title and legend are placed for the height paper_layout chose
                resized = isinstance(fig, Draft) and (fw.layout.width, fw.layout.height) != (
                    fig.layout.get("width"), fig.layout.get("height"))
                update_figure(fw, fig, keep=KEEP_SIZED if resized else KEEP_LAYOUT)
            else:
                self._add_figure(name, fig)
        self.status.value = status
        compute = (t1 - t0) * 1e3
        self.timings = {"analysis_ms": self._analysis_ms, "figure_ms": compute - self._analysis_ms,
                        "sync_ms": _ms(t1), "total_ms": _ms(t0)}
        self.n_updates += 1

    # ----- figures at other control values (the interactive page) -----
    #: why the panel's figures cannot be computed at other control values without the user (e.g. a model run from
    #: a button); ``None``: :meth:`figures_at` gives them
    live_only: str | None = None

    def figures_at(self, **values) -> tuple[dict, str, dict]:
        """The figures (laid out at the live width), the status line and the values the controls took, at control
        ``values``, through the panel's own figure path (what a slider move computes). The controls come back to
        their values after; the figures on screen are not touched. A refused combination raises ``ValueError``."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise ValueError(f"values: unknown controls {sorted(unknown)}; known: {sorted(self.controls)}")
        before = {k: w.value for k, w in self.controls.items()}
        silent, self._silent = self._silent, True
        try:
            for k, v in values.items():
                self.controls[k].value = v
            took = {k: self.controls[k].value for k in values}
            figs, status = self.compute()
            figs = {name: live_layout(f, self.live_width) for name, f in figs.items()}
            return {name: as_figure(f) for name, f in figs.items()}, status, took
        finally:
            for k, v in before.items():
                if self.controls[k].value != v:
                    self.controls[k].value = v
            self._silent = silent

    def export_interactive(self, path, **kw) -> list[Path]:
        """This panel as one offline HTML page whose sliders still work, and its sidecar
        (:func:`workbench.show.interactive.export_interactive`; ``kw`` go to it)."""
        return export_interactive(self, path, **kw)

    # ----- export -----
    export_root = Path("exports")  # relative to the notebook's folder (JupyterLab opens the links)

    def export_clicked(self, folder=None) -> list[Path]:
        """What the *export figures* button does: every figure with its sidecar and CSV into ``folder`` at the
        width chosen beside the button (single column, double column or both: files ``<name>-single.pdf`` …)
        (default ``exports/<Panel>-<UTC time>/``), then links to the files under the button. Returns the paths."""
        folder = Path(folder) if folder is not None else self.export_root / (
            f"{type(self).__name__}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
        self.export_button.disabled = True
        self.export_links.value = "<i>exporting…</i>"
        w = self.export_width.value
        try:
            out = self.export_all(folder, width=["single", "double"] if w == "both" else w)
        except (RuntimeError, ValueError, OSError) as e:
            self.export_links.value = f"<span style='color:#D55E00'>export failed: {html_escape(e)}</span>"
            raise
        finally:
            self.export_button.disabled = False
        paths = [p for ps in out.values() for p in ps]
        links = " ".join(f"<a href='{html_escape(p.as_posix())}' target='_blank'>{html_escape(p.name)}</a>"
                         for p in paths)
        # a long folder path breaks anywhere rather than run past the panel's edge
        self.export_links.value = (f"<div style='overflow-wrap:anywhere'>{len(paths)} files in "
                                   f"<code>{html_escape(folder.resolve())}</code>: {links}</div>")
        return paths

    def export_all(self, folder, **kw):
        """Export every figure with :func:`workbench.show.export.export_all` (``params`` = the panel's
        :meth:`sidecar_params` unless given)."""

        kw.setdefault("params", self.sidecar_params())
        cap = getattr(self, "capture", None)
        if cap is not None:  # the sidecar names the model and the prompt
            kw.setdefault("model_id", getattr(cap, "model_id", None))
            spans = getattr(cap, "spans", None)
            if spans is not None and kw.get("prompt") is None:
                kw.setdefault("prompt_hash", export.prompt_hash(spans))
        return export.export_all({name: fw.view if isinstance(fw, TokenWidget) else go.Figure(fw)
                                  for name, fw in self.figures.items()}, folder, **kw)


def ep_from(controls: dict, base: EntroPrefillParams) -> EntroPrefillParams:
    names = {f.name for f in fields(EntroPrefillParams)}
    ch = {}
    for k, w in controls.items():
        if k in names:
            v = w.value
            ch[k] = float(v) if isinstance(v, float) else v
    return base.replace(**ch)


def ep_controls(names, base: EntroPrefillParams, *, continuous: bool = True, k: int | None = None) -> dict:
    out = {}
    for n in names:
        if n == "m0":
            out[n] = SLIDERS[n].make(min(int(base.m0), k), hi=k, continuous=continuous)
        elif n == "audit_mode":
            out[n] = W.Dropdown(options=["exact", "sampled"], value=base.audit_mode, description="audit")
        elif n == "priority":

            out[n] = W.Dropdown(options=list(PRIORITIES), value=base.priority, description="priority")
        elif n == "target" and not isinstance(base.target, float):
            out[n] = SLIDERS[n].make(continuous=continuous)
        else:
            out[n] = SLIDERS[n].make(getattr(base, n), continuous=continuous)
    return out


