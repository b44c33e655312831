"""The token-text attention view (``plots.token_attention``) and its panel (``widgets.TokenPanel``): the shading
is the captured row, removed/evicted tokens are struck through, paging, log and exclude-sinks, clicks."""
from __future__ import annotations

import html

import numpy as np
import pytest
from _all_figures import _gen, synthetic_inputs

from workbench.show import plots
from workbench.show import widgets as Wd


@pytest.fixture(scope="module")
def syn():
    return synthetic_inputs(L=4, H_Q=6, G=2)


def test_shading_equals_the_captured_row(syn):
    sp, cap, params, tr = syn
    r = int(cap.rows_of("tail")[2])
    fig = plots.token_attention(cap, 3, query=r, head=5)
    bar = fig.data[0]
    want = cap.attn[3, 5, r, : sp.T].double().numpy()
    assert np.allclose(np.asarray(bar.marker.color, dtype=float), want)
    assert np.allclose([c[2] for c in bar.customdata], want)       # hover values
    assert [c[0] for c in bar.customdata] == list(range(sp.T))
    assert [c[1] for c in bar.customdata] == list(sp.tokens)
    assert fig.layout.meta["query_pos"] == int(cap.row_pos[r])
    # the query row's own token is boxed
    widths = list(bar.marker.line.width)
    assert widths[int(cap.row_pos[r])] == 2.5
    # observers, a KV group: the mean of its heads over the observer rows
    fig = plots.token_attention(cap, 1, group=1)
    heads = np.flatnonzero(cap.head_group.numpy() == 1)
    want = cap.observer_attn()[1][heads].double().mean((0, 1)).numpy()
    assert np.allclose(np.asarray(fig.data[0].marker.color, dtype=float), want)
    # the pooled μ
    fig = plots.token_attention(cap, 2, pooling=tr.pooling)
    assert np.allclose(np.asarray(fig.data[0].marker.color, dtype=float), tr.pooling.mu[2].numpy())


def test_log_sinks_removed_and_pages(syn):
    sp, cap, params, tr = syn
    raw = cap.observer_attn()[2, 0].double().mean(0).numpy()
    fig = plots.token_attention(cap, 2, head=0, log=True)
    assert np.allclose(np.asarray(fig.data[0].marker.color, dtype=float), np.log10(np.maximum(raw, 1e-6)))
    fig = plots.token_attention(cap, 2, head=0, exclude_sinks=True)
    c = np.asarray(fig.data[0].marker.color, dtype=float)
    ns = sp.n_sink
    assert fig.data[0].marker.cmax == pytest.approx(raw[ns:].max()) and fig.data[0].marker.cmin == pytest.approx(
        raw[ns:].min())
    assert np.allclose(c[:ns], raw[ns:].min()) and np.allclose(c[ns:], raw[ns:])
    # removed chunks of the trace's selection are struck through, the rest not
    l = max(tr.selections)
    assert tr.selections[l].removed
    fig = plots.token_attention(cap, 2, head=0, removed=tr, removed_layer=l)
    struck = [i for i, t in enumerate(fig.data[0].text) if t.startswith("<s>")]
    assert struck == np.flatnonzero(sp.removal_mask(tr.selections[l].removed).numpy()).tolist()
    # an eviction run: positions no compacted cache kept
    res = _gen("snapkv", 30, sp.T, 3)
    ev = plots.removed_positions(res, sp)
    kept = set(res.kept_prompt.reshape(-1).tolist())
    assert ev == [p for p in range(sp.T) if p not in kept]
    # pages
    fig = plots.token_attention(cap, 2, head=0, per_page=16, page=1)
    assert [c[0] for c in fig.data[0].customdata] == list(range(16, 32)) and fig.layout.meta["n_pages"] == -(-sp.T // 16)
    with pytest.raises(ValueError, match=r"^page: must be an integer in"):
        plots.token_attention(cap, 2, head=0, per_page=16, page=99)
    with pytest.raises(ValueError, match="^head, group, pooling: give exactly one"):
        plots.token_attention(cap, 2, head=0, group=1)
    with pytest.raises(ValueError, match="^query: must be 'observers' or a captured row index"):
        plots.token_attention(cap, 2, query="tail")


def test_token_panel_click_sets_the_query_row(syn):
    sp, cap, params, tr = syn
    panel = Wd.TokenPanel(cap, layer=2)
    fw = panel.figures["tokens"]
    r = int(cap.rows_of("tail")[3])
    pos = int(cap.row_pos[r])
    q = panel.click(pos)  # what a click on the token's bar does
    assert panel.controls["query"].value == q and int(cap.row_pos[q]) == pos  # a row at that position
    assert fw.layout.meta["query_pos"] == pos
    assert np.allclose(np.asarray(fw.data[0].marker.color, dtype=float),
                       cap.attn[2, 0, q, : sp.T].double().numpy())
    panel.set(log=True)
    assert fw.layout.meta["log"] is True
    # a token without a captured row: the nearest captured row (the first observer here)
    first = int(cap.row_pos.min())
    assert panel.click(0) == int(np.argmin(cap.row_pos.numpy())) and fw.layout.meta["query_pos"] == first
    # the click callback is wired to the bar trace
    assert fw.data[0]._click_callbacks


def test_attention_strip_log_exclude_sinks_and_token_ticks(syn):
    sp, cap, params, tr = syn
    raw = cap.observer_attn()[1, 2].mean(0).double().numpy()
    fig = plots.attention_strip(cap, 1, 2, log=True, exclude_sinks=True, max_tick_tokens=100)
    y = np.asarray(fig.data[0].y, dtype=float)
    assert np.isnan(y[: sp.n_sink]).all() and np.allclose(y[sp.n_sink:], raw[sp.n_sink:])
    assert fig.layout.yaxis.type == "log" and fig.layout.hovermode == "x"
    assert [html.unescape(t) for t in fig.layout.xaxis.ticktext] == [t.replace(" ", "·") or "∅" for t in sp.tokens]
    assert plots.attention_strip(cap, 1, 2).layout.xaxis.ticktext is None  # T > 80: positions (hover has the text)
    lin = plots.attention_strip(cap, 1, 2)
    assert lin.layout.yaxis.type == "linear" and np.allclose(np.asarray(lin.data[0].y, dtype=float), raw)
    res = plots.residual_distribution(tr.pooling, 1, cap, log=True)
    want = (tr.pooling.a[1, :, sp.n_sink:] / tr.pooling.z[1, :, None]).numpy()
    assert np.allclose(np.asarray(res.data[0].z, dtype=float), np.log10(np.maximum(want, 1e-6)))
    assert np.allclose(np.array([[c[1] for c in row] for row in res.data[0].customdata], dtype=float), want)


@pytest.mark.slow
def test_token_panel_exports_html_and_paper_files(syn, tmp_path):
    sp, cap, params, tr = syn
    panel = Wd.TokenPanel(cap, layer=1)
    paths = panel.export_clicked(tmp_path / "tok")
    names = {p.name for p in paths}
    assert {"tokens.pdf", "tokens.svg", "tokens.png", "tokens.json", "tokens.csv", "tokens.html"} <= names
    page = (tmp_path / "tok" / "tokens.html").read_text()
    assert "plotly" in page and sp.tokens[7] in page
