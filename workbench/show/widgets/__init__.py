"""Interactive panels (the *show* layer): ipywidgets controls bound to plotly ``FigureWidget``s.

Every panel has

- ``.widget`` — an ipywidgets container to display (a panel also displays itself in a cell);
- ``.controls`` — ``{name: widget}`` of its sliders, dropdowns and check boxes;
- ``.figures`` — ``{name: go.FigureWidget}``, built once and updated in place inside
  ``fig.batch_update()`` (trace data copied from a fresh figure of :mod:`workbench.show.plots`, so what a
  panel shows is exactly what the plot function gives for the current parameters);
- ``.params()`` — the current parameter values (plain JSON types);
- ``.export_all(folder, **kw)`` — every figure through :func:`workbench.show.export.export_all`.
- ``.export_interactive(path, sliders=..., points=...)`` — one offline HTML page in which one or two of its sliders
  still work (:func:`workbench.show.interactive.export_interactive`; not the panels that run the model).

Analytic panels take a :class:`~workbench.capture.data.Capture` and never call a model: moving one
of their sliders recomputes pure analysis functions (SPEC §2–§9) on cached per-capture statistics.
They (and :class:`TokenPanel`) also take a :class:`CaptureState`, one capture shared by a notebook's panels: a
new capture set on it (e.g. by :class:`workbench.study.prompt_panel.PromptPanel`, which builds and captures a
pasted prompt or a RULER-style task) redraws each of them in place (``Panel.set_capture``).
The two panels that run the model again (:class:`PrunePanel`, :class:`EvictionPanel`) also take a
``LoadedModel`` and a ``Prompt``; they call the model only from their *run* button (or the
*auto-run* check box), cache every result by its frozen parameter tuple, and show a progress bar
and the answer next to the full-context answer in HTML widgets (no ``ipywidgets.Output``: it stalls
headless notebook execution).

:class:`CounterexamplePanel` takes neither: its sliders rebuild the hand-made network of paper §6.1
(:mod:`workbench.analyse.counterexample`).

Slider ranges lie inside the validity ranges of :class:`~workbench.analyse.params.EntroPrefillParams` and the
policy/page/shift dataclasses, so a value typed or set out of range is clamped to a valid one.
"""
from workbench.show.widgets.analytic import AuditPanel, HeadsPanel, PagesPanel, PriorityPanel, ShiftPanel
from workbench.show.widgets.base import SLIDERS, Panel, SliderSpec
from workbench.show.widgets.counterexample import CounterexamplePanel
from workbench.show.widgets.run import EvictionPanel, PrunePanel
from workbench.show.widgets.state import CaptureState
from workbench.show.widgets.token_widget import TokenWidget
from workbench.show.widgets.tokens import TokenPanel

__all__ = ["Panel", "SliderSpec", "SLIDERS", "HeadsPanel", "PriorityPanel", "AuditPanel", "ShiftPanel", "PagesPanel",
           "PrunePanel", "EvictionPanel", "TokenPanel", "TokenWidget", "CounterexamplePanel",
           "CaptureState"]
