"""Long prompts (T = 4k–33k): colour scales that show structure, page markers that stay markers, and a token
view that jumps to the answer, a chunk or a search hit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.analyse.pages import PageSelection
from workbench.analyse.pooling import HeadPooling
from workbench.capture.data import Capture
from workbench.run.spans import PromptSpans
from workbench.show import plots
from workbench.show import widgets as Wd
from workbench.show.colour_scale import LONG_PROMPT_T, quantile_ranks
from workbench.show.decimate import token_bins
from workbench.show.paper_layout import wrap_text
from workbench.show.plots.bounds import MARKER_COLUMNS

#: share of the cells in the lowest tenth of the colour bar that a scale "showing structure" stays under
BOTTOM_BIN_BOUND = 0.2


def _cap(T: int, seed: int = 0) -> Capture:
    k = (T - 6 - 32 - 3) // 257
    sp = PromptSpans.synthetic([256] * k, query_len=32, suffix=T - 6 - 32 - 257 * k, answer_doc=3)
    return Capture.synthetic(sp, L=2, H_Q=4, G=2, structure="realistic", seed=seed)


@pytest.fixture(scope="module")
def cap4k():
    return _cap(4096)


def _bottom_share(z, cmin=None, cmax=None) -> float:
    """Share of the finite cells whose colour falls in the lowest tenth of a uniform colour scale over
    ``[cmin, cmax]`` (default: the data's range, as plotly's auto range)."""
    z = np.asarray(z, dtype=np.float64)
    z = z[np.isfinite(z)]
    lo = z.min() if cmin is None else cmin
    hi = z.max() if cmax is None else cmax
    return float(((z - lo) / (hi - lo) < 0.1).mean())


def test_residual_colour_scale_spreads_a_heavy_tail_at_4k(cap4k):
    pool = HeadPooling()(cap4k)
    res = pool.residual(1).numpy()
    lin = plots.residual_distribution(pool, 1, cap4k, scale="linear")
    # the data: heavy-tailed, so a linear scale puts nearly every cell in the lowest colour
    assert _bottom_share(lin.data[0].z) > 0.9
    assert lin.layout.coloraxis.colorbar.title.text == "a/z (linear)"
    lg = plots.residual_distribution(pool, 1, cap4k, scale="log")
    assert lg.layout.coloraxis.colorbar.title.text == "log₁₀ a/z (log)"
    assert _bottom_share(lg.data[0].z) < BOTTOM_BIN_BOUND
    q = plots.residual_distribution(pool, 1, cap4k)  # T ≥ LONG_PROMPT_T: quantile by default
    assert cap4k.T >= LONG_PROMPT_T and q.layout.meta["scale"] == "quantile"
    assert q.layout.coloraxis.colorbar.title.text == "a/z (quantile)"
    assert _bottom_share(q.data[0].z) < BOTTOM_BIN_BOUND
    # the quantile colour bar names the values at its ticks; the hover keeps a/z
    cb = q.layout.coloraxis.colorbar
    assert list(cb.tickvals) == [0.0, 0.25, 0.5, 0.75, 1.0] and len(cb.ticktext) == 5
    assert float(cb.ticktext[-1]) == pytest.approx(np.asarray(q.data[0].customdata, dtype=float).max(), rel=0.05)
    assert np.asarray(q.data[0].customdata, dtype=float).max() == pytest.approx(res.max())


def test_short_prompt_keeps_the_linear_scale():
    cap = _cap(1024)
    pool = HeadPooling()(cap)
    f = plots.residual_distribution(pool, 0, cap)
    assert f.layout.meta["scale"] == "linear" and f.layout.coloraxis.colorbar.title.text == "a/z (linear)"
    assert plots.token_attention(cap, 0).scale == "linear"


def test_token_view_colour_scale_at_4k(cap4k):
    lin = plots.token_attention(cap4k, 1, scale="linear")
    assert _bottom_share(lin.shade, lin.cmin, lin.cmax) > 0.5 and "A (linear scale)" in lin.html()
    lg = plots.token_attention(cap4k, 1, scale="log")  # log helps, but 43 % of this page stay in the lowest tenth
    assert "log₁₀ A (log scale)" in lg.html() and _bottom_share(lg.shade, lg.cmin, lg.cmax) < 0.5
    q = plots.token_attention(cap4k, 1)  # T ≥ LONG_PROMPT_T: quantile by default
    assert q.scale == "quantile" and q.meta["scale"] == "quantile"
    assert _bottom_share(q.shade, q.cmin, q.cmax) < BOTTOM_BIN_BOUND and "A (quantile scale)" in q.html()
    assert "q0.5 = " in q.html()  # the key names the median's value
    assert np.allclose(q.values, lin.values)  # the hover and CSV keep the attention itself


def test_quantile_ranks_oracle():
    x = np.array([5.0, 1.0, 1.0, np.nan, 3.0])
    assert np.allclose(quantile_ranks(x)[[0, 1, 2, 4]], [1.0, 1 / 6, 1 / 6, 2 / 3]) and np.isnan(quantile_ranks(x)[3])


def test_colour_scale_bad_input(cap4k):
    with pytest.raises(ValueError, match=r"^scale: must be one of \['linear', 'log', 'quantile'\], got 'cubic'"):
        plots.token_attention(cap4k, 1, scale="cubic")
    with pytest.raises(ValueError, match=r"^log, scale: "):
        plots.residual_distribution(HeadPooling()(cap4k), 1, cap4k, log=True, scale="quantile")


@pytest.fixture(scope="module")
def cap33k():
    T = 33 * 1024
    k = (T - 6 - 32 - 3) // 257
    sp = PromptSpans.synthetic([256] * k, query_len=32, suffix=T - 6 - 32 - 257 * k, answer_doc=100)
    return Capture.synthetic(sp, L=2, H_Q=8, G=2, structure="realistic", dtype="float16", seed=0)


@pytest.mark.parametrize("K", [4, 64])
def test_kept_page_marks_stay_marks_at_33k(cap33k, K):
    pool = HeadPooling()(cap33k)
    pr = PageSelection(b=64, K=K).select(pool.a, pool.w, cap33k.head_group, 64)
    fig = plots.pages(pr, 1, cap33k.spans)
    N_P = pr.importance.shape[-1]
    assert N_P > 500
    (marks,) = [t for t in fig.to_plotly_json()["data"] if str(t.get("name", "")).startswith("kept page")]
    # thin ticks, not 14-px boxes: at most MARKER_COLUMNS a group, ≥ N_P / MARKER_COLUMNS pages apart
    assert marks["marker"]["symbol"] == "line-ns-open" and marks["marker"]["line"]["width"] <= 1.5
    x, y = np.asarray(marks["x"]), np.asarray(marks["y"])
    sel = pr.selected[1].numpy()
    # the oracle: bins of N_P / 60 pages; a tick at the centre of every bin holding a kept page, no other
    edges = np.round(np.linspace(0, N_P, MARKER_COLUMNS + 1)).astype(int)
    for g in range(sel.shape[0]):
        xg = np.sort(x[y == f"g{g}"])
        assert 0 < len(xg) <= MARKER_COLUMNS
        assert len(xg) < 2 or np.diff(xg).min() >= N_P // MARKER_COLUMNS - 1  # apart by a bin, whatever T
        kept_bins = sorted({int(np.searchsorted(edges, p, side="right") - 1) for p in np.flatnonzero(sel[g])})
        want = [(edges[i] + edges[i + 1] - 1) / 2 for i in kept_bins]
        assert np.allclose(xg, want)


def test_pages_binning_notes_stand_on_the_binned_axes(cap33k):
    """At 33k the pages and the positions are binned: each note names its bins on the axis it bins (the x axes, as
    wide as the figure); the group score's y axis, a third of a narrow figure's height, keeps a short title."""
    pool = HeadPooling()(cap33k)
    pr = PageSelection(b=16, K=4).select(pool.a, pool.w, cap33k.head_group, 64)
    lay = plots.pages(pr, 1, cap33k.spans).layout
    pbins, bins = token_bins(pr.importance.shape[-1]), token_bins(cap33k.T)
    assert not pbins.exact and not bins.exact
    assert lay.xaxis.title.text == f"page (b = 16 tokens); bins of ≤ {pbins.width} pages"
    assert lay.xaxis2.title.text == f"prompt position; max over bins of ≤ {bins.width} tokens"
    assert lay.yaxis2.title.text == "group score p"


def test_few_pages_keep_a_box_per_kept_page(cap4k):
    pool = HeadPooling()(cap4k)
    pr = PageSelection(b=256, K=3).select(pool.a, pool.w, cap4k.head_group, 64)
    (marks,) = [t for t in plots.pages(pr, 0, cap4k.spans).data if t.name.startswith("kept page")]
    assert marks.marker.symbol == "square-open" and len(marks.x) == int(pr.selected[0].sum())


def test_token_view_jumps_to_the_answer_a_chunk_and_a_search_hit(cap4k):
    panel = Wd.TokenPanel(cap4k, layer=1)
    w = panel.figures["tokens"]
    sp = cap4k.spans
    n_pages = panel.controls["page"].max + 1
    assert n_pages == -(-cap4k.T // 384) and panel.controls["page"].value == 0
    # the answer: the page holding the answer passage's first token, its tokens marked as the answer
    a0 = sp.chunks[list(sp.chunk_doc).index(sp.answer_doc)][0]
    assert panel.jump_to_answer() == a0 and a0 >= 384
    assert panel.controls["page"].value == a0 // 384 and a0 in w.view.positions
    assert w.view.answer[w.view.positions.index(a0)]
    # a chunk by index
    c0 = sp.chunks[9][0]
    assert panel.jump_to_chunk(9) == c0 and panel.controls["page"].value == c0 // 384 and c0 in w.view.positions
    assert w.view.chunk_start[w.view.positions.index(c0)]
    # a search hit (text across two tokens), and the next hit of the same text
    assert panel.search("T3000t3001") == [3000]
    assert panel.jump_to_text("t3000t3001") == 3000 and 3000 in w.view.positions
    hits = panel.search("t250")
    assert hits == [250] + list(range(2500, 2510))
    seen = [panel.jump_to_text("t250") for _ in range(len(hits) + 1)]
    assert seen == hits + [250] and panel.controls["page"].value == 0  # wraps around
    # the buttons: the same jumps, and a note saying where (or why not)
    panel.controls["page"].value = 0
    panel.nav["answer"].click()
    assert panel.controls["page"].value == a0 // 384 and f"position {a0}" in panel.nav["note"].value
    panel.nav["chunk"].value = 12
    panel.nav["to_chunk"].click()
    assert panel.controls["page"].value == sp.chunks[12][0] // 384
    panel.nav["text"].value = "no such text"
    panel.nav["find"].click()
    assert "does not occur" in panel.nav["note"].value and panel.controls["page"].value == sp.chunks[12][0] // 384


def test_token_view_jumps_refuse_bad_targets(cap4k):
    panel = Wd.TokenPanel(cap4k, layer=1)
    k = cap4k.spans.k
    with pytest.raises(ValueError, match=rf"^chunk: must be an integer in \[0, {k - 1}\]"):
        panel.jump_to_chunk(k)
    with pytest.raises(ValueError, match="^text: must be a non-empty string"):
        panel.search(" ")
    with pytest.raises(ValueError, match="^text: 'zzz' does not occur in the prompt"):
        panel.jump_to_text("zzz")
    with pytest.raises(ValueError, match=rf"^position: must be an integer in \[0, {cap4k.T - 1}\]"):
        panel.jump_to(cap4k.T)
    no_answer = Capture.synthetic(PromptSpans.synthetic([40] * 4, query_len=10), L=1, H_Q=2, G=1)
    p = Wd.TokenPanel(no_answer)
    assert p.nav["answer"].disabled
    with pytest.raises(ValueError, match="^answer: this prompt has no marked answer passage"):
        p.jump_to_answer()


def test_pages_panel_k_move_reuses_the_scores_at_33k(cap33k):
    """A K move re-ranks pages: the group scores p (L·G·T) and the page importance are not recomputed, and the
    result equals a selection from scratch."""
    panel = Wd.PagesPanel(cap33k)
    before = panel.analysis()
    panel.controls["K"].value = panel.controls["K"].value + 3
    after = panel.analysis()
    assert after.K == before.K + 3 and after.p is before.p and after.importance is before.importance
    pool = HeadPooling()(cap33k)
    direct = PageSelection(b=after.b, K=after.K).select(pool.a, pool.w, cap33k.head_group, 64)
    assert torch.equal(after.selected, direct.selected) and torch.allclose(after.p, direct.p)
    assert torch.equal(after.U, direct.U)
    panel.controls["zeta"].value = 0.3  # a ζ move: new scores
    assert panel.analysis().p is not before.p
    # the token mask (numpy repeat) is the pages' tokens: an oracle by position
    tm = after.token_mask_of(1).numpy()
    want = after.selected[1].numpy()[:, np.arange(cap33k.T) // after.b]
    assert np.array_equal(tm, want)


def test_pages_uor_title_wraps_as_a_whole_formula(cap33k):
    """The UOR axis title's ``s = 64`` is one unit for the title wrapper: at a narrow width the title breaks before
    the formula, never inside it ('UOR (s' over '= 64)' reads as two fragments)."""
    pool = HeadPooling()(cap33k)
    pr = PageSelection(b=16, K=4).select(pool.a, pool.w, cap33k.head_group, 64)
    lay = plots.pages(pr, 1, cap33k.spans).layout
    (title,) = [a.title.text for a in (lay[k] for k in lay if k.startswith("yaxis")) if "UOR" in (a.title.text or "")]
    assert title == "UOR (s\u00a0=\u00a064)"
    for px in (20, 40, 60, 200):
        assert "s\u00a0=\u00a064)" in wrap_text(title, px, 10).split("<br>")[-1]
