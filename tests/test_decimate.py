"""Token-level figures at scale: decimation to the screen, bounded slider messages at T = 32k,
full data in the export's CSV."""
from __future__ import annotations

import json

import numpy as np
import pytest
from _examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from plotly.utils import PlotlyJSONEncoder

import workbench.show.decimate as dec
from workbench.analyse.pooling import HeadPooling
from workbench.capture import Capture
from workbench.run.spans import PromptSpans
from workbench.show import plots
from workbench.show import widgets as Wd
from workbench.show.colour_scale import quantile_ranks
from workbench.show.export import figure_data

MB = 2 ** 20


class _Encoder(PlotlyJSONEncoder):
    def default(self, o):  # plotly's ``Undefined`` placeholders (keys a trace does not set) count as null
        try:
            return super().default(o)
        except TypeError:
            return None


@settings(max_examples=examples(60), deadline=None)
@given(T=st.integers(1, 5000), width=st.integers(1, 1500), seed=st.integers(0, 10))
def test_bins_cover_every_token_once_and_reduce_exactly(T, width, seed):
    b = dec.token_bins(T, width, offset=3)
    assert b.n == min(T, width) and b.edges[0] == 0 and b.edges[-1] == T
    assert (np.diff(b.edges) >= 1).all() and b.width - np.diff(b.edges).min() <= 1  # equal sizes up to one
    x = np.random.default_rng(seed).random((2, T))
    mx, mean = b.reduce(x, "max"), b.reduce(x, "mean")
    for i in range(0, b.n, max(1, b.n // 7)):
        s, e = b.edges[i], b.edges[i + 1]
        assert mx[1, i] == x[1, s:e].max() and mean[0, i] == pytest.approx(x[0, s:e].mean())
    assert b.lo[0] == 3 and b.hi[-1] == T + 2
    assert np.isclose(mean.sum(-1) @ np.ones(2), sum((x[:, s:e].mean(-1)).sum() for s, e in zip(b.edges[:-1], b.edges[1:])))


def test_bad_arguments():
    with pytest.raises(ValueError, match="width_px"):
        dec.token_bins(10, 0)
    with pytest.raises(ValueError, match="how"):
        dec.token_bins(10, 4).reduce(np.zeros(10), "median")
    with pytest.raises(ValueError, match="x: last axis"):
        dec.token_bins(10, 4).reduce(np.zeros(9))


@pytest.fixture(scope="module")
def cap32k():
    T = 32768
    k = (T - 6 - 32 - 3) // 257
    spans = PromptSpans.synthetic([256] * k, query_len=32, suffix=T - 6 - 32 - 257 * k)
    return Capture.synthetic(spans, L=2, H_Q=8, G=2, structure="realistic", dtype="float16", seed=0)


def _record_messages(panel) -> list[int]:
    """Bytes (JSON, arrays included) of every message the panel's widgets send to the front end: updates,
    restyles, relayouts and added traces (each ``_send_*_msg`` of plotly's ``FigureWidget``)."""
    sizes = []
    for fw in panel.figures.values():
        for name in ("_send_update_msg", "_send_restyle_msg", "_send_relayout_msg", "_send_addTraces_msg"):
            orig = getattr(fw, name)

            def spy(*args, _orig=orig, **kw):
                sizes.append(len(json.dumps([args, kw], cls=_Encoder)))
                return _orig(*args, **kw)

            setattr(fw, name, spy)
    return sizes


@pytest.mark.parametrize("make, moves", [
    (lambda c: Wd.HeadsPanel(c), [("zeta", 0.3), ("tau", 0.5), ("layer", 0), ("quantity", "H")]),
    (lambda c: Wd.PagesPanel(c), [("zeta", 0.3), ("K", 4), ("layer", 0), ("page", 1), ("page", 64), ("K", 64)]),
])
def test_slider_message_bounded_at_32k(cap32k, make, moves):
    panel = make(cap32k)
    sizes = _record_messages(panel)
    for name, v in moves:
        panel.controls[name].value = v
    assert len(sizes) >= len(moves)
    assert max(sizes) <= 1 * MB, sizes


def test_undecimated_message_would_exceed_the_bound(cap32k, monkeypatch):
    """The bound is the decimation's doing: with one bin per token the residual heatmap alone is > 1 MB."""
    monkeypatch.setattr(dec, "DEFAULT_WIDTH_PX", 10 ** 9)
    pool = HeadPooling()(cap32k)
    fig = plots.residual_distribution(pool, 0, cap32k.spans)
    assert len(json.dumps(fig.to_plotly_json()["data"], cls=_Encoder)) > MB


def test_export_csv_keeps_every_token(cap32k):
    T = cap32k.T
    pool = HeadPooling()(cap32k)
    fig = plots.residual_distribution(pool, 1, cap32k.spans)
    assert len(fig.data[0].x) == dec.DEFAULT_WIDTH_PX  # the screen gets bins ...
    df = figure_data(fig)  # ... the CSV every key of every head
    n_sink = cap32k.spans.n_sink
    assert len(df) == cap32k.H_Q * (T - n_sink) and df["key"].max() == T - 1
    full = pool.residual()[1].numpy()
    assert np.allclose(df["a_over_z"].to_numpy().reshape(cap32k.H_Q, -1), full)
    # the plotted bin is the max of its keys (in the hover; coloured by its quantile, the default at this T)
    b = dec.token_bins(T - n_sink, offset=n_sink)
    assert fig.layout.meta["scale"] == "quantile"
    assert np.allclose(np.asarray(fig.data[0].customdata, dtype=float), b.reduce(full, "max"))
    assert np.allclose(np.asarray(fig.data[0].z, dtype=float), quantile_ranks(b.reduce(full, "max")))
    lin = plots.residual_distribution(pool, 1, cap32k.spans, scale="linear")
    assert np.allclose(np.asarray(lin.data[0].z, dtype=float), b.reduce(full, "max"))
    strip = plots.attention_strip(cap32k, 0, 0)
    assert len(strip.data[0].x) == dec.DEFAULT_WIDTH_PX and len(figure_data(strip)) == T
