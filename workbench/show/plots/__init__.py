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
plain dicts (:class:`Draft`, the same calls as ``go.Figure``) and validated once at the end; numeric data
go in as numpy arrays (plotly validates lists element by element); per-point styles are numeric arrays,
not lists of strings. At T = 2048 a figure takes 10–35 ms (``benchmarks/widgets.py``).
"""
from __future__ import annotations

from workbench.show.figure_engine import as_figure, figure_frame, figure_function, update_figure
from workbench.show.plots.analysis import (
    attention_strip,
    certificate,
    chunk_priorities,
    head_heatmap,
    pooled_measure,
    residual_distribution,
    sink_mass_heatmap,
    trace_layers,
)
from workbench.show.plots.bounds import (
    break_even,
    drift,
    envelope_rows,
    envelope_scatter,
    page_union_bounds,
    pages,
    shift_gains,
    shift_steps,
)
from workbench.show.plots.counterexample import counterexample_errors, counterexample_logits, counterexample_rows
from workbench.show.plots.divergence import answer_divergence
from workbench.show.plots.sensitivity import answer_rank, head_weights, hoeffding_radius, removal_budget
from workbench.show.plots.study import accuracy_vs_budget, deferkv_weights, kept_positions, kv_bytes_table
from workbench.show.plots.tokens import kept_compare, removed_positions, token_attention, token_values
from workbench.show.theme import (
    ANSWER,
    FONT,
    KEPT,
    NEUTRAL,
    PALETTE,
    REMOVED,
    SEQUENTIAL,
    TEMPLATE,
    categorical,
    categorical_px,
)

__all__ = [
    "PALETTE", "SEQUENTIAL", "FONT", "TEMPLATE", "KEPT", "REMOVED", "NEUTRAL", "ANSWER", "categorical", "categorical_px",
    "sink_mass_heatmap", "attention_strip", "head_heatmap", "residual_distribution", "chunk_priorities",
    "envelope_rows", "certificate", "trace_layers", "drift", "break_even", "pages", "shift_steps",
    "shift_gains", "page_union_bounds", "deferkv_weights", "counterexample_rows", "counterexample_logits",
    "counterexample_errors", "kept_positions", "accuracy_vs_budget", "kv_bytes_table", "token_attention",
    "token_values", "removed_positions", "kept_compare", "answer_divergence",
    "figure_frame", "update_figure", "figure_function", "as_figure",
    "pooled_measure", "head_weights", "answer_rank", "removal_budget", "envelope_scatter", "hoeffding_radius",
]
