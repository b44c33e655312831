"""Figure functions return one type, a ``go.Figure``; a draft is asked for explicitly (``plots.<figure>.draft``),
and writing it into a widget shows the same figure as writing the figure."""
from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import pytest
from _all_figures import synthetic_inputs

from workbench.show import plots
from workbench.show.figure_engine import Draft, update_figure


def _plain(d) -> str:
    """A figure dict as sorted JSON, arrays as lists (the same numbers whatever their container), trace uids
    (random per widget) left out."""
    d = {**d, "data": [{k: v for k, v in t.items() if k != "uid"} for t in d["data"]]}
    return json.dumps(d, sort_keys=True, default=lambda o: np.asarray(o).tolist())


@pytest.fixture(scope="module")
def inputs():
    return synthetic_inputs(L=4, H_Q=6, G=2)


def test_figure_functions_return_figures_and_their_draft_twins_drafts(inputs):
    sp, cap, params, tr = inputs
    l = tr.pooling.L - 1
    calls = {"head_heatmap": ((tr.pooling,), {}), "residual_distribution": ((tr.pooling, l, sp), {}),
             "trace_layers": ((tr,), {}), "certificate": ((tr,), {})}
    for name, (args, kw) in calls.items():
        fn = getattr(plots, name)
        fig, draft = fn(*args, **kw), fn.draft(*args, **kw)
        assert isinstance(fig, go.Figure), name
        assert isinstance(draft, Draft), name
        assert _plain(draft.figure().to_plotly_json()) == _plain(fig.to_plotly_json()), name
        assert isinstance(fn(*args, **kw), go.Figure), name  # a draft asked for before changes nothing after
    assert not hasattr(plots, "drafts")


def test_a_draft_written_into_a_widget_shows_the_figure(inputs):
    sp, cap, params, tr = inputs
    a, b = go.FigureWidget(plots.head_heatmap(tr.pooling)), go.FigureWidget(plots.head_heatmap(tr.pooling))
    update_figure(a, plots.head_heatmap.draft(tr.pooling, quantity="H"))
    update_figure(b, plots.head_heatmap(tr.pooling, quantity="H"))
    assert _plain(a.to_plotly_json()) == _plain(b.to_plotly_json())
