"""Interactive panels (the *show* layer): ipywidgets controls bound to plotly ``FigureWidget``s.

Every panel has

- ``.widget`` — an ipywidgets container to display (a panel also displays itself in a cell);
- ``.controls`` — ``{name: widget}`` of its sliders, dropdowns and check boxes;
- ``.figures`` — ``{name: go.FigureWidget}``, built once and updated in place inside
  ``fig.batch_update()`` (trace data copied from a fresh figure of :mod:`workbench.plots`, so what a
  panel shows is exactly what the plot function gives for the current parameters);
- ``.params()`` — the current parameter values (plain JSON types);
- ``.export_all(folder, **kw)`` — every figure through :func:`workbench.export.export_all`.

Analytic panels take a :class:`~workbench.capture_data.Capture` and never call a model: moving one
of their sliders recomputes pure analysis functions (SPEC §2–§9) on cached per-capture statistics.
The two panels that run the model again (:class:`PrunePanel`, :class:`EvictionPanel`) also take a
``LoadedModel`` and a ``Prompt``; they call the model only from their *run* button (or the
*auto-run* check box), cache every result by its frozen parameter tuple, and show a progress bar
and the answer next to the full-context answer in HTML widgets (no ``ipywidgets.Output``: it stalls
headless notebook execution).

Slider ranges lie inside the validity ranges of :class:`~workbench.params.EntroPrefillParams` and the
policy/page/shift dataclasses, so a value typed or set out of range is clamped to a valid one.
"""
from __future__ import annotations

import abc
import contextlib

import html
import math
import re
import time
from dataclasses import dataclass, fields

import ipywidgets as W
import plotly.graph_objects as go
import torch

from .params import EntroPrefillParams

__all__ = [
    "Panel", "HeadsPanel", "PriorityPanel", "AuditPanel", "PrunePanel", "EvictionPanel", "ShiftPanel",
    "PagesPanel", "sync_figure", "figure_function", "SLIDERS",
]


# ----------------------------------------------------------------------------- figure functions
def figure_function(name: str):
    """The figure function ``name`` of :mod:`workbench.plots` (the single source of every figure)."""
    from . import plots

    fn = getattr(plots, name, None)
    if fn is None:
        raise ValueError(f"name: workbench.plots has no figure function {name!r}")
    return fn


def sync_figure(fw: go.FigureWidget, fig: go.Figure) -> bool:
    """Make ``fw`` show ``fig`` (a figure or a draft) in place with :func:`workbench.plots.update_figure`: one
    ``plotly_update`` when the trace structure is the same, else the traces replaced; size, ``uirevision``
    and template kept. Returns whether the traces were updated in place."""
    from .plots import update_figure

    return update_figure(fw, fig)


def _widget_figure(fig: go.Figure, uirevision: str) -> go.FigureWidget:
    fw = go.FigureWidget(fig)
    fw.layout.uirevision = uirevision
    return fw


# ----------------------------------------------------------------------------- sliders
@dataclass(frozen=True)
class SliderSpec:
    """A slider's range: ``kind`` in ``float, log, int``; for ``log`` ``lo``/``hi`` are the values
    (the widget works in base-10 exponents). ``lo``/``hi`` lie inside the parameter's validity range."""

    label: str
    kind: str
    lo: float
    hi: float
    step: float
    value: float

    def make(self, value=None, *, continuous: bool = True, hi=None, lo=None) -> W.Widget:
        v = self.value if value is None else value
        lo = self.lo if lo is None else lo
        hi = self.hi if hi is None else hi
        style = {"description_width": "initial"}
        lay = W.Layout(width="320px")
        if self.kind == "int":
            return W.IntSlider(value=int(min(max(v, lo), hi)), min=int(lo), max=int(hi), step=int(self.step),
                               description=self.label, continuous_update=continuous, style=style, layout=lay)
        if self.kind == "log":
            return W.FloatLogSlider(value=float(min(max(v, lo), hi)), base=10, min=math.log10(lo),
                                    max=math.log10(hi), step=self.step, description=self.label,
                                    continuous_update=continuous, style=style, layout=lay, readout_format=".3g")
        return W.FloatSlider(value=float(min(max(v, lo), hi)), min=lo, max=hi, step=self.step,
                             description=self.label, continuous_update=continuous, style=style, layout=lay,
                             readout_format=".3g")


#: Slider ranges, each inside the validity range of its parameter (see ``workbench.params``,
#: ``eviction``, ``pages``, ``shift``). Layer, m₀, budget and the shift sizes get their bounds from the
#: capture when a panel is built.
SLIDERS: dict[str, SliderSpec] = {
    "zeta": SliderSpec("ζ (group floor)", "float", 0.01, 1.0, 0.01, 0.5),                  # (0, 1]
    "tau": SliderSpec("τ (temperature)", "log", 1e-3, 10.0, 0.05, 1.0),                    # (0, ∞)
    "eps_s": SliderSpec("ε_s (smoothing)", "log", 1e-3, 10.0, 0.05, 0.1),                  # (0, ∞)
    "lam": SliderSpec("λ (concentration)", "float", 0.0, 5.0, 0.05, 0.5),                  # [0, ∞)
    "target": SliderSpec("saving target (fraction of N)", "float", 0.01, 1.0, 0.01, 0.3),  # (0, 1]
    "eps_row": SliderSpec("ε_row (row tolerance)", "log", 1e-3, 1.0, 0.05, 0.05),           # (0, 1]
    "m0": SliderSpec("m₀ (kept chunks)", "int", 0, 1, 1, 1),                               # [0, k]
    "layer": SliderSpec("layer", "int", 0, 1, 1, 1),                                        # [0, L-1]
    "delta": SliderSpec("δ (audit failure)", "log", 1e-4, 0.5, 0.05, 0.05),                 # (0, 1)
    "m_a": SliderSpec("m_a (audit sample)", "int", 1, 1024, 1, 32),                         # >= 1
    "eps_audit": SliderSpec("ε_audit", "float", 0.01, 1.0, 0.01, 0.1),                      # (0, 1]
    "d_max": SliderSpec("d_max (stability)", "float", 0.0, 1.0, 0.01, 0.5),                 # [0, 1]
    "streak": SliderSpec("streak", "int", 0, 10, 1, 1),                                     # >= 0
    "seed": SliderSpec("seed", "int", 0, 99, 1, 0),                                         # >= 0
    "page": SliderSpec("page size b", "int", 1, 128, 1, 16),                                # >= 1
    "K": SliderSpec("pages kept K", "int", 1, 64, 1, 8),                                    # >= 1
    "defer_lam": SliderSpec("DeferKV λ", "float", -2.0, 2.0, 0.01, 0.1),                    # [-50, 50]
    "budget": SliderSpec("eviction budget B", "int", 1, 2, 1, 64),                          # >= protected
    "k": SliderSpec("top-k (recall)", "int", 1, 2, 1, 32),                                  # [1, T]
    "ref_start": SliderSpec("reference from decode row", "int", 1, 1, 1, 1),                # [1, n]
    "W": SliderSpec("tail rows W", "int", 1, 1, 1, 32),                                     # [1, tail]
    "run_layer": SliderSpec("fixed l*", "int", 1, 1, 1, 4),                                 # [1, L-1]: E_l exists
}


def _html_escape(s) -> str:
    return html.escape(str(s))


def _head_dim(capture, default: int = 64) -> int:
    m = re.search(r"\bd=(\d+)", str(getattr(capture, "model_id", "")))
    return int(m.group(1)) if m else default


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

    def _analyse(self):
        """``self.analysis()``, timed into ``self._analysis_ms``."""
        from .util import one_thread

        t0 = time.perf_counter()
        with one_thread():  # small tensors: thread start-up costs more than the arithmetic
            out = self.analysis()
        self._analysis_ms = _ms(t0)
        return out

    @abc.abstractmethod
    def analysis(self):
        """The pure analysis result(s) for the current controls (no figures)."""

    # ----- building -----
    def _finish(self) -> None:
        """Compute once, build the figure widgets and the container, and watch the controls."""
        figs, status = self.compute()
        self.status.value = status
        self.figures = {name: _widget_figure(f, name) for name, f in figs.items()}
        ctrl = list(self.controls.values())
        rows = [W.HBox(ctrl[i:i + 3]) for i in range(0, len(ctrl), 3)]
        self.widget = W.VBox([W.HTML(f"<b>{_html_escape(self.title)}</b>"), *rows, self.status, *self._extra,
                              W.HBox(list(self.figures.values()), layout=W.Layout(flex_flow="row wrap"))])
        for w in self.controls.values():
            w.observe(self._on_change, names="value")

    def _add_figure(self, name: str, fig: go.Figure) -> go.FigureWidget:
        """A figure that appears later (e.g. the drift after the first run) joins the figure row."""
        from .plots import as_figure

        fw = _widget_figure(as_figure(fig), name)
        self.figures[name] = fw
        box = self.widget.children[-1]
        box.children = tuple(box.children) + (fw,)
        return fw

    def _repr_mimebundle_(self, **kw):
        return self.widget._repr_mimebundle_(**kw)

    # ----- parameters -----
    def params(self) -> dict:
        """Current control values, ``{name: value}`` (plain Python scalars and strings)."""
        out = {}
        for k, w in self.controls.items():
            v = w.value
            out[k] = float(v) if isinstance(v, float) else v
        return out

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
        """Figures for the current controls, ``{name: figure}``, and a status line."""

    def _on_change(self, change) -> None:
        if not self._silent:
            self.update()

    def update(self) -> None:
        """Recompute from the current controls and update every figure in place."""
        from .plots import drafts

        t0 = time.perf_counter()
        try:
            with drafts():  # figures stay dicts of validated pieces until written into the widgets
                figs, status = self.compute()
        except ValueError as e:  # a parameter combination the analysis rejects: say so, keep the figures
            self.error = str(e)
            self.status.value = f"<span style='color:#D55E00'>{_html_escape(e)}</span>"
            self.timings = {"analysis_ms": _ms(t0), "figure_ms": 0.0, "sync_ms": 0.0, "total_ms": _ms(t0)}
            return
        self.error = None
        t1 = time.perf_counter()
        for name, fig in figs.items():
            if name in self.figures:
                sync_figure(self.figures[name], fig)
            else:
                self._add_figure(name, fig)
        self.status.value = status
        compute = (t1 - t0) * 1e3
        self.timings = {"analysis_ms": self._analysis_ms, "figure_ms": compute - self._analysis_ms,
                        "sync_ms": _ms(t1), "total_ms": _ms(t0)}
        self.n_updates += 1

    # ----- export -----
    def export_all(self, folder, **kw):
        """Export every figure with :func:`workbench.export.export_all` (``params`` = the panel's
        parameters unless given)."""
        from .export import export_all

        kw.setdefault("params", {"panel": type(self).__name__, **self.params()})
        return export_all({name: go.Figure(fw) for name, fw in self.figures.items()}, folder, **kw)


def _ep_from(controls: dict, base: EntroPrefillParams) -> EntroPrefillParams:
    names = {f.name for f in fields(EntroPrefillParams)}
    ch = {}
    for k, w in controls.items():
        if k in names:
            v = w.value
            ch[k] = float(v) if isinstance(v, float) else v
    return base.replace(**ch)


def _ep_controls(names, base: EntroPrefillParams, *, continuous: bool = True, k: int | None = None) -> dict:
    out = {}
    for n in names:
        if n == "m0":
            out[n] = SLIDERS[n].make(min(int(base.m0), k), hi=k, continuous=continuous)
        elif n == "audit_mode":
            out[n] = W.Dropdown(options=["exact", "sampled"], value=base.audit_mode, description="audit")
        elif n == "priority":
            from .params import PRIORITIES

            out[n] = W.Dropdown(options=list(PRIORITIES), value=base.priority, description="priority")
        elif n == "target" and not isinstance(base.target, float):
            out[n] = SLIDERS[n].make(continuous=continuous)
        else:
            out[n] = SLIDERS[n].make(getattr(base, n), continuous=continuous)
    return out


# ----------------------------------------------------------------------------- analytic panels
class HeadsPanel(Panel):
    """Head pooling (SPEC §2): ζ, τ, the layer and the quantity → layer × head heatmap and the
    per-head residual distributions of one layer. No model calls."""

    title = "Head pooling (SPEC §2)"

    def __init__(self, capture, params: EntroPrefillParams | None = None, *, layer: int | None = None,
                 quantity: str = "w"):
        super().__init__()
        self.capture = capture
        self.base = params or EntroPrefillParams()
        L = capture.L
        self.controls = _ep_controls(("zeta", "tau"), self.base)
        self.controls["layer"] = SLIDERS["layer"].make(L // 2 if layer is None else layer, lo=0, hi=L - 1)
        self.controls["quantity"] = W.Dropdown(options=["w", "H", "sink"], value=quantity, description="heatmap")
        self._finish()

    def analysis(self):
        p = _ep_from(self.controls, self.base)
        return p.pooling()(self.capture)

    def compute(self):
        pool = self._analyse()
        l = int(self.controls["layer"].value)
        figs = {"heads": figure_function("head_heatmap")(pool, quantity=self.controls["quantity"].value),
                "residual": figure_function("residual_distribution")(pool, l, self.capture.spans)}
        nv = int((~pool.valid).sum())
        st = f"{pool.L} layers × {pool.n_heads} heads; {nv} layer(s) with an invalid head (z ≤ ρ_min)"
        return figs, st


class PriorityPanel(Panel):
    """Chunk priorities and the selection of one layer (SPEC §3–§5): ζ, τ, ε_s, λ, the saving target,
    the row tolerance, m₀ and the layer → priority bars (kept/removed), the envelope of the greedy
    removal per observer row, and the layer's certificate (D, U, gap) in the status line. No model."""

    title = "Chunk priorities, greedy selection and certificate (SPEC §3–§5)"

    def __init__(self, capture, params: EntroPrefillParams | None = None, *, layer: int | None = None,
                 certify: bool = True):
        super().__init__()
        self.capture = capture
        self.base = params or EntroPrefillParams()
        L, k = capture.L, capture.spans.k
        if k == 0:
            raise ValueError("capture: the prompt has no candidate chunks (k = 0); nothing to prioritise")
        self.controls = _ep_controls(("zeta", "tau", "eps_s", "lam", "target", "eps_row", "m0"), self.base, k=k)
        self.controls["layer"] = SLIDERS["layer"].make(L // 2 if layer is None else layer, lo=0, hi=L - 1)
        self.controls["certify"] = W.Checkbox(value=certify, description="LP certificate U")
        self._finish()

    def analysis(self):
        """``(params, pooling, priorities, selection or None, envelope or None)`` at the chosen layer."""
        from .envelope import envelope
        from .selection import mass_table

        cap = self.capture
        p = _ep_from(self.controls, self.base)
        l = int(self.controls["layer"].value)
        pool = p.pooling()(cap)
        prio = p.priorities().score(pool.mu, cap.spans)
        sel = env = None
        if bool(pool.valid[l]) and bool(prio.valid[l]):
            m_all = cap.cached("observer_mass_table", lambda: mass_table(cap.observer_attn(), cap.spans))
            sel = p.selection().select(prio.S[l], cap.spans.n, m_all[l], certify=bool(self.controls["certify"].value))
            env = envelope(cap.observer_attn()[l], pool.mu[l], pool.omega[l], cap.spans.removal_mask(sel.removed),
                           layer=l)
        return p, pool, prio, sel, env

    def compute(self):
        p, pool, prio, sel, env = self._analyse()
        l = int(self.controls["layer"].value)
        figs = {"priorities": figure_function("chunk_priorities")(prio, self.capture.spans, l,
                                                                  removed=None if sel is None else sel.removed)}
        if env is not None:
            figs["envelope"] = figure_function("envelope_rows")(env)
        elif "envelope" in self.figures:
            figs["envelope"] = go.Figure(self.figures["envelope"])  # unchanged
        if sel is None:
            st = f"layer {l}: invalid (residual or document mass ≤ ρ_min); no selection"
        else:
            st = f"layer {l}: {_html_escape(sel.verdict)}; envelope holds for every row: {env.all_hold}"
        return figs, st


class AuditPanel(Panel):
    """The adaptive procedure (paper §5 steps 1–7, SPEC §6) from every ``EntroPrefillParams`` →
    the per-layer trace, the certificate per layer and the decision. No model calls.

    The LP certificate of all monitored layers costs a few ms per layer; it depends on the row tolerance
    and ``m₀`` only (not on the priorities) and is memoised, so with ``certify`` on only the ``ε_row`` and
    ``m₀`` sliders update on release (``continuous_update=False``).
    """

    title = "Adaptive layer selection and audit (SPEC §5–§6)"
    NAMES = ("zeta", "tau", "eps_s", "lam", "target", "eps_row", "m0", "audit_mode", "m_a", "delta", "eps_audit",
             "d_max", "streak", "seed", "priority")

    def __init__(self, capture, params: EntroPrefillParams | None = None, *, certify: bool = True):
        super().__init__()
        self.capture = capture
        self.base = params or EntroPrefillParams()
        self.controls = _ep_controls(self.NAMES, self.base, k=capture.spans.k)
        self.controls["certify"] = W.Checkbox(value=certify, description="LP certificates U_l")
        self._continuous({"new": certify})
        self._finish()
        self.controls["certify"].observe(self._continuous, names="value")

    LP_INPUTS = ("eps_row", "m0")  # a new LP on every layer when these move

    def _continuous(self, change) -> None:
        for name in self.LP_INPUTS:
            self.controls[name].continuous_update = not change["new"]

    def analysis(self):
        from .audit import trace

        p = _ep_from(self.controls, self.base)
        return trace(self.capture, p, certify=bool(self.controls["certify"].value))

    def compute(self):
        from .selection import target_tokens

        tr = self._analyse()
        budget = target_tokens(tr.params.target, self.capture.spans.N)
        figs = {"trace": figure_function("trace_layers")(tr),
                "certificate": figure_function("certificate")(tr, budget)}
        st = _html_escape(tr.decision)
        if tr.notes:
            st += "<br><small>" + "<br>".join(_html_escape(n) for n in tr.notes) + "</small>"
        return figs, st


class ShiftPanel(Panel):
    """Prefill-vs-first-decode shift (SPEC §9): top-k, the reference's first decode row and the tail
    window → JSD and recall per step and layer, the boundary leap; ``level`` (KV groups or query heads)
    and ``layer`` (all, or one) only change the view. No model calls."""

    title = "Prefill → decode attention shift (SPEC §9)"

    def __init__(self, capture, *, k: int = 32):
        super().__init__()
        self.capture = capture
        n_tail, n_dec = capture.rows_of("tail").numel(), capture.rows_of("decode").numel()
        if n_tail == 0 or n_dec == 0:
            raise ValueError("capture: needs tail and decode rows (capture with RowSet(tail >= 1, n_decode >= 1))")
        # k and W only index what the analysis keeps per capture (~1 ms); a new reference costs ~1 s at
        # T ≈ 2k the first time (ranks looked up for every k), so ref_start updates on release
        self.controls = {
            "k": SLIDERS["k"].make(min(k, capture.T), lo=1, hi=capture.T),
            "ref_start": SLIDERS["ref_start"].make(1, lo=1, hi=max(n_dec, 1), continuous=False),
            "W": SLIDERS["W"].make(n_tail, lo=1, hi=n_tail),
            "level": W.Dropdown(options=["group", "head"], value="group", description="level"),
            "layer": W.Dropdown(options=[("all", None)] + [(str(l), l) for l in range(capture.L)], value=None,
                                description="layer"),
        }
        self._shift_key = self._shift = None
        if n_dec == 1:
            self.controls["ref_start"].disabled = True
        self._finish()

    def analysis(self):
        """The :class:`~workbench.shift.ShiftResult` (kept while only the view controls change)."""
        from .shift import ShiftAnalysis

        c = self.controls
        key = (int(c["k"].value), int(c["ref_start"].value), int(c["W"].value))
        if key != self._shift_key:
            self._shift = ShiftAnalysis(k=key[0], ref_start=key[1], W=key[2])(self.capture)
            self._shift_key = key
        return self._shift

    def compute(self):
        sh = self._analyse()
        c = self.controls
        fig = figure_function("shift_steps")(sh, level=c["level"].value, layer=c["layer"].value)
        s = sh.summary()
        parts = [f"{r.level}: recall r=0 {r.recall_0:.3f} → r=1 {r.recall_1:.3f}, leap fraction {r.leap_fraction:.2f}"
                 for r in s.itertuples()]
        return {"shift": fig}, "; ".join(parts)


class PagesPanel(Panel):
    """GQA unions and pages (SPEC §8): page size, pages kept K, ζ, τ and the layer → page scores,
    selection and UOR; KV payloads in the status line. No model calls."""

    title = "Pages and GQA unions (SPEC §8)"

    def __init__(self, capture, params: EntroPrefillParams | None = None, *, layer: int | None = None,
                 s: int = 64, e: int = 2, head_dim: int | None = None):
        super().__init__()
        self.capture = capture
        self.base = params or EntroPrefillParams()
        self.s, self.e = int(s), int(e)
        self.d = int(head_dim) if head_dim is not None else _head_dim(capture)
        L = capture.L
        self.controls = {
            "page": SLIDERS["page"].make(),
            "K": SLIDERS["K"].make(),
            **_ep_controls(("zeta", "tau"), self.base),
            "layer": SLIDERS["layer"].make(L // 2 if layer is None else layer, lo=0, hi=L - 1),
        }
        self._finish()

    def analysis(self):
        from .pages import PageSelection

        pool = _ep_from(self.controls, self.base).pooling()(self.capture)
        c = self.controls
        return PageSelection(b=int(c["page"].value), K=int(c["K"].value), s=self.s, e=self.e).select(
            pool.a, pool.w, self.capture.head_group, self.d)

    def compute(self):
        pr = self._analyse()
        l = int(self.controls["layer"].value)
        by = pr.bytes
        st = (f"layer {l}: page union U = {int(pr.U[l])} of {pr.importance.shape[-1]} pages; KV bytes: per-group pages "
              f"{by['per_group_pages']:,}, union {by['union']:,}, dense {by['dense']:,}")
        return {"pages": figure_function("pages")(pr, l, self.capture.spans)}, st


# ----------------------------------------------------------------------------- run-again panels
class _RunMixin:
    """Cache, progress bar and answer box of a panel that calls the model from a button."""

    def _init_run(self, label: str, steps: int) -> None:
        self.cache: dict = {}
        self.model_calls = 0  # runs actually executed (cache misses)
        self.progress = W.IntProgress(value=0, min=0, max=steps, description="idle",
                                      style={"description_width": "initial"}, layout=W.Layout(width="320px"))
        self.run_button = W.Button(description=label, button_style="primary", icon="play")
        self.auto = W.Checkbox(value=False, description="re-run on change")
        self.answers = W.HTML(value="<i>not run yet: press the button</i>", layout=W.Layout(width="auto"))
        self.run_button.on_click(lambda _b: self.run())
        self.auto.observe(lambda ch: self.run() if ch["new"] else None, names="value")
        self._extra = [W.HBox([self.run_button, self.auto, self.progress]), self.answers]

    def _step(self, i: int, what: str) -> None:
        self.progress.value = i
        self.progress.description = what

    @contextlib.contextmanager
    def _busy(self):
        """The run button is disabled while the model runs; a failure is shown in the answer box, then raised."""
        self.run_button.disabled = True
        try:
            yield
        except Exception as e:
            self.progress.description = "failed"
            self.answers.value = f"<span style='color:#D55E00'>run failed: {_html_escape(e)}</span>"
            raise
        finally:
            self.run_button.disabled = False

    def _cached(self, key, fn):
        if key not in self.cache:
            self.cache[key] = fn()
            self.model_calls += 1
        return self.cache[key]

    def _on_change(self, change) -> None:
        if self._silent:
            return
        self.update()
        if self.auto.value:
            self.run()


def _answer_table(left_title: str, left: str, right_title: str, right: str, rows=()) -> str:
    cell = "style='vertical-align:top;padding:4px 10px;border:1px solid #ddd;max-width:420px'"
    head = f"<tr><th {cell}>{_html_escape(left_title)}</th><th {cell}>{_html_escape(right_title)}</th></tr>"
    body = f"<tr><td {cell}><code>{_html_escape(left)}</code></td><td {cell}><code>{_html_escape(right)}</code></td></tr>"
    extra = "".join(f"<tr><td {cell}>{_html_escape(a)}</td><td {cell}>{_html_escape(b)}</td></tr>" for a, b in rows)
    return f"<table style='border-collapse:collapse'>{head}{body}{extra}</table>"


def _text(res, ids_attr: str) -> str:
    t = getattr(res, "text", None)
    if t:
        return t
    return "ids " + str(list(getattr(res, ids_attr)))


class PrunePanel(_RunMixin, Panel):
    """Pruned prefill vs the full prefill (SPEC §6–§7).

    The sliders update the *predicted* decision from the capture (the trace, no model). The run
    button (or *re-run on change*) calls :func:`~workbench.prune.run_pruned` (adaptive, or with a
    fixed ``l*``) and :func:`~workbench.prune.run_full` — each once per distinct parameter set — and
    shows both answers side by side and the per-layer drift (:func:`~workbench.stability.stability`).
    """

    title = "Pruned prefill vs full prefill (SPEC §6–§7)"
    NAMES = ("zeta", "tau", "eps_s", "lam", "target", "eps_row", "m0", "eps_audit", "streak")

    def __init__(self, capture, model, prompt, params: EntroPrefillParams | None = None, *,
                 max_new_tokens: int = 12, composed: bool = False):
        super().__init__()
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be an integer >= 1, got {max_new_tokens!r}")
        self.capture, self.model, self.prompt = capture, model, prompt
        self.base = params or EntroPrefillParams()
        self.max_new_tokens = max_new_tokens
        self.composed = bool(composed)
        L = capture.L
        self.controls = _ep_controls(self.NAMES, self.base, k=capture.spans.k)
        self.controls["mode"] = W.Dropdown(options=["adaptive", "fixed layer"], value="adaptive", description="mode")
        self.controls["run_layer"] = SLIDERS["run_layer"].make(min(4, L - 1), lo=1, hi=L - 1)
        self._init_run("Run pruned prefill", 3)
        self.last_pruned = self.last_full = self.last_stability = None
        self._finish()

    def analysis(self):
        from .audit import trace

        return trace(self.capture, _ep_from(self.controls, self.base), certify=False)

    def compute(self):
        tr = self._analyse()
        figs = {"trace": figure_function("trace_layers")(tr)}
        if self.last_stability is not None:
            figs["drift"] = figure_function("drift")(self.last_stability)
        elif "drift" in self.figures:  # the last run was a bypass: nothing pruned, no drift
            figs["drift"] = go.Figure(layout=dict(title="No drift: the last run was a bypass (nothing pruned)",
                                                  meta={"figure": "drift", "bypass": True}))
        return figs, "predicted from the capture: " + _html_escape(tr.decision)

    def run_key(self) -> tuple:
        """The frozen parameter tuple that identifies a pruned run."""
        p = _ep_from(self.controls, self.base)
        layer = None if self.controls["mode"].value == "adaptive" else int(self.controls["run_layer"].value)
        return ("pruned", tuple(sorted(p.to_dict().items())), layer, self.max_new_tokens)

    def run(self):
        """Run (or fetch from the cache) the full and the pruned prefill for the current parameters."""
        from .prune import run_full, run_pruned
        from .stability import stability

        key = self.run_key()
        p = _ep_from(self.controls, self.base)
        layer = key[2]
        with self._busy():
            self._step(0, "full prefill…")
            full = self._cached(("full", self.max_new_tokens), lambda: run_full(
                self.model, self.prompt, max_new_tokens=self.max_new_tokens, keep_hidden=True))
            self._step(1, "pruned prefill…")
            pruned = self._cached(key, lambda: run_pruned(self.model, self.prompt, p, layer=layer,
                                                          max_new_tokens=self.max_new_tokens, keep_hidden=True,
                                                          progress=False))
            self._step(2, "stability…")
            stab = None
            if not pruned.bypass:
                stab = self.cache.get(("stability", key, self.composed))
                if stab is None:
                    stab = stability(self.model, full, pruned, composed=self.composed)
                    self.cache[("stability", key, self.composed)] = stab
            self._step(3, "done")
        self.last_full, self.last_pruned, self.last_stability = full, pruned, stab
        rows = [("full prefill: T = " + str(full.T), f"{pruned.decision}"),
                ("", f"T' = {pruned.T_prime}, first token agrees: "
                     f"{int(full.first_logits.argmax()) == int(pruned.first_logits.argmax())}")]
        if stab is not None:
            rows.append(("", f"Δ_L = {stab.Delta_L:.4g}, margin = {stab.margin:.4g}, certified (m > 2ΛΔ_L): "
                             f"{stab.certified}"))
        self.answers.value = _answer_table("full context", _text(full, "generated_ids"), "pruned prefill",
                                           _text(pruned, "generated_ids"), rows)
        self.update()  # the drift figure joins on the first run that pruned
        return pruned


class EvictionPanel(_RunMixin, Panel):
    """KV eviction policies (SPEC §9): policy, budget ``B``, DeferKV ``λ`` and the page size.

    The sliders update the *preview* of the kept prompt positions, scored from the capture's rows
    (:meth:`Evidence.from_capture`, no model; H2O needs column sums, which a capture does not hold).
    The run button generates with the model under the policy (one shared prefill,
    :class:`~workbench.eviction.EvictionSession`) and shows the answer beside the full-cache answer;
    every ``(policy parameters, budget)`` runs once.
    """

    title = "KV-cache eviction (SPEC §9)"

    def __init__(self, capture, model, prompt, *, policy: str = "deferkv", budget: int | None = None,
                 max_new_tokens: int = 12, n_sink: int | None = None, recent: int = 32):
        from .eviction import ALL_POLICIES

        super().__init__()
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be an integer >= 1, got {max_new_tokens!r}")
        self.capture, self.model, self.prompt = capture, model, prompt
        self.max_new_tokens = max_new_tokens
        self.classes = {c.name: c for c in ALL_POLICIES}
        if policy not in self.classes:
            raise ValueError(f"policy: must be one of {sorted(self.classes)}, got {policy!r}")
        T = capture.T
        self.common = {"n_sink": capture.spans.n_sink if n_sink is None else int(n_sink), "recent": int(recent)}
        n_tail = capture.rows_of("tail").numel()
        if 0 < n_tail < 32:  # SnapKV/DeferKV window: at most the captured tail
            self.common["window"] = n_tail
        lo = min(self.common["n_sink"] + self.common["recent"], T)
        self.controls = {
            "policy": W.Dropdown(options=list(self.classes), value=policy, description="policy"),
            "budget": SLIDERS["budget"].make(budget if budget is not None else max(lo, T // 4), lo=max(lo, 1), hi=T),
            "defer_lam": SLIDERS["defer_lam"].make(),
            "page": SLIDERS["page"].make(),
        }
        self._session = None
        self._scores: dict = {}  # policy (frozen dataclass) → scores [L, G, T]
        self._init_run("Run eviction", 2)
        self._finish()

    def policy(self):
        """The policy object of the current controls."""
        cls = self.classes[self.controls["policy"].value]
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in self.common.items() if k in names}
        if "lam" in names:
            kw["lam"] = float(self.controls["defer_lam"].value)
        if "page" in names:
            kw["page"] = int(self.controls["page"].value)
        return cls(**kw)

    def highlight(self) -> list[int]:
        """Positions of the answer document (the needle), when the prompt knows it."""
        sp = self.capture.spans
        if sp.answer_doc is None or not 0 <= sp.answer_doc < len(sp.documents):
            return []
        s, e = sp.documents[sp.answer_doc]
        return list(range(s, e))

    def analysis(self):
        """Preview :class:`GenerationResult` (kept positions only, no text) from the capture, or None
        when the policy needs evidence a capture does not hold."""
        from .eviction import Evidence, GenerationResult, select_keep

        pol = self.policy()
        cap = self.capture
        ev = cap.cached("eviction_evidence", lambda: Evidence.from_capture(cap))
        T, L, G = cap.T, cap.L, cap.G
        B = int(self.controls["budget"].value)
        if pol.keeps_all:
            kept = torch.arange(T).expand(L, G, T).clone()
        else:
            if pol not in self._scores:  # a budget move re-selects from the same scores
                try:
                    self._scores[pol] = pol.scores(ev)
                except ValueError:
                    return None
                while len(self._scores) > 8:
                    self._scores.pop(next(iter(self._scores)))
            kept = select_keep(self._scores[pol], B, pol.protected(T), pol.tiebreak(ev))
        return GenerationResult(policy=pol.name, params=pol.params(), budget=B, T=T, ids=[], text=None, kept=kept,
                                evicted_at=pol.defer, compacted_layers=tuple(range(L)), kv_bytes_before=0,
                                kv_bytes_after=0, timings={})

    def compute(self):
        prev = self._analyse()
        pol = self.policy()
        if prev is None:
            fig = go.Figure(self.figures["kept"]) if "kept" in self.figures else go.Figure()
            return {"kept": fig}, (f"{pol.name}: no preview (it scores with evidence a capture does not hold); "
                                   "press run")
        fig = figure_function("kept_positions")([prev], self.prompt, highlight=self.highlight() or None)
        B = prev.budget
        return {"kept": fig}, (f"preview from the capture: {pol.name}, B = {B} of T = {prev.T} prompt positions"
                               + (" (no eviction: B ≥ T)" if B >= prev.T else ""))

    def session(self):
        """The shared prefill for every policy (created on the first run; calls the model once)."""
        from .eviction import EvictionSession, Needs, default_policies

        if self._session is None:
            needs = Needs()
            for p in default_policies(**self.common):
                needs = needs.merge(p.needs())
            self._session = EvictionSession.prepare(self.model, self.prompt, needs, self.max_new_tokens,
                                                    reusable=True, progress=False)
            self.model_calls += 1
        return self._session

    def run_key(self) -> tuple:
        pol = self.policy()
        B = int(self.controls["budget"].value)
        return (pol.name, tuple(sorted(pol.params().items())), None if pol.keeps_all else B, self.max_new_tokens)

    def run(self):
        """Generate under the current policy and budget (cached), and the full-cache answer."""
        from .eviction import FullCache

        pol, key = self.policy(), self.run_key()
        with self._busy():
            self._step(0, "prefill…" if self._session is None else "full cache…")
            sess = self.session()
            full = self._cached(("full", self.max_new_tokens), lambda: sess.run(FullCache(), self.capture.T))
            self._step(1, f"{pol.name}…")
            res = self._cached(key, lambda: sess.run(pol, int(self.controls["budget"].value)))
            self._step(2, "done")
        rows = [("KV bytes " + f"{full.kv_bytes_after:,}", f"KV bytes {res.kv_bytes_after:,} "
                 f"({res.kv_bytes_after / max(full.kv_bytes_after, 1):.0%}), evicted after step {res.evicted_at}")]
        hl = self.highlight()
        if hl:
            rows.append(("answer document kept (mean over layers, groups)", f"{float(res.survival(hl).nanmean()):.3f}"))
        self.answers.value = _answer_table("full cache", _text(full, "ids"), f"{res.policy}, B = {res.budget}",
                                           _text(res, "ids"), rows)
        return res
