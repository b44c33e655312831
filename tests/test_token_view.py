"""The token-text attention view (``plots.token_attention`` → an HTML ``TokenView``) and its panel
(``widgets.TokenPanel``): the shading is the captured row, the rendered text is exactly the token strings
(leading spaces, tabs, newlines), removed/evicted tokens are struck through, paging, log and exclude-sinks,
clicks; the export is vector PDF/SVG with real text at ≥ 7 pt, PNG, HTML and the CSV of every token."""
from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pytest
from _all_figures import _gen, synthetic_inputs
from _figure_files import pdf_text, png_size

from workbench.show import export as ex
from workbench.show import plots
from workbench.show import widgets as Wd
from workbench.show.token_view import TOKEN_SCALE, TokenView, shade_colour

#: token strings as a tokenizer gives them: leading spaces, a tab, newlines, markup characters, an empty one
WORDS = ["The", " quick", " brown", "\n", " fox", "\tjumps", " <b>&", "\n\n", "  over", " the", " lazy", " dog",
         ".", " Passengers", " where", " fewer", " service", " rural", "\n", " A", ":", " swordfish"]


def _with_tokens(cap):
    toks = tuple(WORDS[i % len(WORDS)] for i in range(cap.spans.T))
    cap2 = dataclasses.replace(cap, spans=dataclasses.replace(cap.spans, tokens=toks))
    return cap2, toks


@pytest.fixture(scope="module")
def syn():
    return synthetic_inputs(L=4, H_Q=6, G=2)


class _Spans(HTMLParser):
    """The text of every ``<span class="tk" data-pos=…>`` of a token view's HTML, by position."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.text: dict[int, str] = {}
        self.classes: dict[int, set] = {}
        self.styles: dict[int, str] = {}
        self._cur = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "span" and "data-pos" in a:
            self._cur = int(a["data-pos"])
            self.text[self._cur] = ""
            self.classes[self._cur] = set(a["class"].split())
            self.styles[self._cur] = a.get("style", "")

    def handle_endtag(self, tag):
        if tag == "span":
            self._cur = None

    def handle_data(self, data):
        if self._cur is not None:
            self.text[self._cur] += data


def _parse(view: TokenView) -> _Spans:
    p = _Spans()
    p.feed(view.html())
    return p


def test_shading_equals_the_captured_row(syn):
    sp, cap, params, tr = syn
    r = int(cap.rows_of("tail")[2])
    v = plots.token_attention(cap, 3, query=r, head=5)
    want = cap.attn[3, 5, r, : sp.T].double().numpy()
    assert np.allclose(v.values, want) and np.allclose(v.shade, want)
    assert v.positions == list(range(sp.T)) and v.tokens == list(sp.tokens)
    assert v.meta["query_pos"] == int(cap.row_pos[r]) and v.meta["figure"] == "token_attention"
    # the colours are the palette's scale at (value - min) / (max - min); the query row's own token is boxed
    t = (want - want.min()) / (want.max() - want.min())
    assert v.colours == shade_colour(t)
    assert shade_colour([0.0, 1.0]) == [TOKEN_SCALE[0][1], TOKEN_SCALE[-1][1]]
    p = _parse(v)
    qpos = int(cap.row_pos[r])
    assert [i for i, c in p.classes.items() if "q" in c] == [qpos]
    assert all(f"background-color:{c}" in p.styles[i] for i, c in enumerate(v.colours))
    # observers, a KV group: the mean of its heads over the observer rows
    v = plots.token_attention(cap, 1, group=1)
    heads = np.flatnonzero(cap.head_group.numpy() == 1)
    assert np.allclose(v.values, cap.observer_attn()[1][heads].double().mean((0, 1)).numpy())
    # the pooled μ
    v = plots.token_attention(cap, 2, pooling=tr.pooling)
    assert np.allclose(v.values, tr.pooling.mu[2].numpy())


def test_rendered_text_is_the_token_strings(syn):
    """The HTML's token spans hold exactly the token strings (spaces, tabs, newlines, markup characters);
    the hover title gives token, position, value and chunk; chunk starts and the answer are marked."""
    sp, cap, params, tr = syn
    cap2, toks = _with_tokens(cap)
    v = plots.token_attention(cap2, 2, head=1)
    p = _parse(v)
    assert [p.text[i] for i in range(sp.T)] == list(toks)
    assert "".join(p.text[i] for i in range(sp.T)) == "".join(toks)
    assert "white-space: pre-wrap" in v.html()
    m = re.search(r'data-pos="5"[^>]*title="([^"]*)"', v.html())
    title = html.unescape(m.group(1))
    assert repr(toks[5]) in title and "position 5" in title and f"{v.values[5]:.4g}" in title
    chunk_of = sp.chunk_of().tolist()
    assert (f"chunk {chunk_of[5]}" if chunk_of[5] >= 0 else "protected") in title
    assert sorted(i for i, c in p.classes.items() if "cs" in c) == sorted(s for s, _ in sp.chunks)
    ans = [i for i, c in p.classes.items() if "ans" in c]
    a0, a1 = sp.chunks[sp.answer_doc] if hasattr(sp, "answer_doc") and sp.answer_doc is not None else (0, 0)
    assert ans == list(range(a0, a1))
    # the CSV sidecar: one row per token
    f = v.to_frame()
    assert f["token"].tolist() == list(toks) and f["position"].tolist() == list(range(sp.T))
    assert np.allclose(f["attention"], v.values)


def test_log_sinks_removed_and_pages(syn):
    sp, cap, params, tr = syn
    raw = cap.observer_attn()[2, 0].double().mean(0).numpy()
    v = plots.token_attention(cap, 2, head=0, log=True)
    assert np.allclose(v.shade, np.log10(np.maximum(raw, 1e-6))) and np.allclose(v.values, raw)
    assert "log₁₀ A" in v.html()
    v = plots.token_attention(cap, 2, head=0, exclude_sinks=True)
    ns = sp.n_sink
    assert v.cmax == pytest.approx(raw[ns:].max()) and v.cmin == pytest.approx(raw[ns:].min())
    assert np.allclose(v.shade[:ns], raw[ns:].min()) and np.allclose(v.shade[ns:], raw[ns:])
    assert v.excluded[:ns] == [True] * ns and not any(v.excluded[ns:]) and set(v.colours[:ns]) == {"#ffffff"}
    # removed chunks of the trace's selection are struck through, the rest not
    l = max(tr.selections)
    assert tr.selections[l].removed
    v = plots.token_attention(cap, 2, head=0, removed=tr, removed_layer=l)
    struck = sorted(i for i, c in _parse(v).classes.items() if "rm" in c)
    assert struck == np.flatnonzero(sp.removal_mask(tr.selections[l].removed).numpy()).tolist()
    assert "line-through" in v.html()
    # an eviction run: positions no compacted cache kept
    res = _gen("snapkv", 30, sp.T, 3)
    ev = plots.removed_positions(res, sp)
    kept = set(res.kept_prompt.reshape(-1).tolist())
    assert ev == [p for p in range(sp.T) if p not in kept]
    # pages
    v = plots.token_attention(cap, 2, head=0, per_page=16, page=1)
    assert v.positions == list(range(16, 32)) and v.meta["n_pages"] == -(-sp.T // 16)
    assert sorted(_parse(v).text) == list(range(16, 32))
    with pytest.raises(ValueError, match=r"^page: must be an integer in"):
        plots.token_attention(cap, 2, head=0, per_page=16, page=99)
    with pytest.raises(ValueError, match="^head, group, pooling: give exactly one"):
        plots.token_attention(cap, 2, head=0, group=1)
    with pytest.raises(ValueError, match="^query: must be 'observers' or a captured row index"):
        plots.token_attention(cap, 2, query="tail")
    with pytest.raises(ValueError, match="^per_page: must be an integer >= 16"):
        plots.token_attention(cap, 2, head=0, per_page=4)


def test_token_panel_click_sets_the_query_row(syn):
    sp, cap, params, tr = syn
    panel = Wd.TokenPanel(cap, layer=2)
    w = panel.figures["tokens"]
    assert isinstance(w, Wd.TokenWidget) and "class=\"tk" in w.html and w.meta["figure"] == "token_attention"
    r = int(cap.rows_of("tail")[3])
    pos = int(cap.row_pos[r])
    w._relay.value = f"{pos}:1700000000000"      # what the front end sets on a click: the position, the time
    q = panel.controls["query"].value
    assert int(cap.row_pos[q]) == pos and w.view.meta["query_pos"] == pos and w.meta["query_pos"] == pos
    assert np.allclose(w.view.values, cap.attn[2, 0, q, : sp.T].double().numpy())
    panel.set(scale="log")
    assert w.view.meta["log"] is True and w.view.meta["scale"] == "log" and "log₁₀ A (log scale)" in w.html
    # a token without a captured row: the nearest captured row (the first observer here)
    first = int(cap.row_pos.min())
    assert panel.click(0) == int(np.argmin(cap.row_pos.numpy())) and w.view.meta["query_pos"] == first


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


def _pdf_font_sizes(path) -> list[float]:
    """Heights (pt) of every word's box in a PDF (``pdftotext -bbox``): the font's ascent + descent."""
    out = subprocess.run(["pdftotext", "-bbox", str(path), "-"], capture_output=True, timeout=60, check=True)
    words = re.findall(r'<word xMin="([\d.]+)" yMin="([\d.]+)" xMax="([\d.]+)" yMax="([\d.]+)">', out.stdout.decode())
    return [float(y1) - float(y0) for _, y0, _, y1 in words]


@pytest.mark.slow
@pytest.mark.skipif(ex.browser_path() is None or shutil.which("pdftotext") is None
                    or shutil.which("pdftoppm") is None, reason="needs chromium and poppler-utils")
def test_export_is_vector_text_at_7pt_or_more(syn, tmp_path, monkeypatch):
    """Single and double column: a PDF with embedded fonts whose text is the tokens (≥ 7 pt), an SVG of
    <text> elements, a 300 dpi PNG, the HTML page, the CSV of every token and the sidecar; one Chromium for
    the whole export call."""
    from workbench.show.chromium import ChromiumSession

    sp, cap, params, tr = syn
    cap2, toks = _with_tokens(cap)
    v = plots.token_attention(cap2, 2, head=1, removed=tr, removed_layer=max(tr.selections))
    starts, enter = [], ChromiumSession.__enter__
    monkeypatch.setattr(ChromiumSession, "__enter__", lambda self: starts.append(self) or enter(self))
    paths = ex.export(v, tmp_path / "tok", width=["single", "double"], prompt=cap2.spans)
    assert len(starts) == 1  # both widths, every format: one browser session
    names = {p.name for p in paths}
    assert {f"tok-{w}.{f}" for w in ("single", "double") for f in ("pdf", "svg", "png")} <= names
    assert {"tok.html", "tok.csv", "tok.json"} <= names
    for w, width_pt in (("single", 240), ("double", 504)):
        pdf = tmp_path / f"tok-{w}.pdf"
        fonts = subprocess.run(["pdffonts", str(pdf)], capture_output=True, timeout=60, check=True).stdout.decode()
        assert "yes" in fonts.splitlines()[-1]                         # an embedded font: real text
        text = pdf_text(pdf)
        for word in ("quick", "Passengers", "swordfish", "removed"):
            assert word in text, (w, word)
        sizes = _pdf_font_sizes(pdf)
        assert sizes and min(sizes) >= 7.0, (w, min(sizes))
        info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, timeout=60, check=True).stdout.decode()
        pw = float(re.search(r"Page size:\s+([\d.]+) x", info).group(1))
        assert abs(pw - width_pt) < 1.0
        svg = (tmp_path / f"tok-{w}.svg").read_text()
        assert f'width="{float(width_pt)}pt"' in svg and "swordfish" in svg and "<text" in svg
        sizes = [float(s) for s in re.findall(r'<text [^>]*font-size="([\d.]+)"', svg)]
        assert min(sizes) >= 7.0
        pw_px, _, dpi = png_size(tmp_path / f"tok-{w}.png")
        assert dpi == pytest.approx(300, rel=0.01) and abs(pw_px - width_pt * 300 / 72) <= 2
    page = (tmp_path / "tok.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and html.escape(" swordfish", quote=False) in page
    csv = (tmp_path / "tok.csv").read_text()
    assert csv.splitlines()[0].startswith('"position","token","attention"') and "swordfish" in csv
    side = json.loads((tmp_path / "tok.json").read_text())
    assert side["figure"] == "token_attention" and side["model_id"] == cap2.model_id
    assert side["prompt_hash"] == ex.prompt_hash(cap2.spans)


@pytest.mark.slow
def test_token_panel_exports_html_and_paper_files(syn, tmp_path):
    sp, cap, params, tr = syn
    panel = Wd.TokenPanel(cap, layer=1)
    paths = panel.export_clicked(tmp_path / "tok")
    names = {p.name for p in paths}
    assert {"tokens.pdf", "tokens.svg", "tokens.png", "tokens.json", "tokens.csv", "tokens.html"} <= names
    page = (tmp_path / "tok" / "tokens.html").read_text()
    assert "class=\"tk" in page and sp.tokens[7] in page


def test_the_export_browser_is_refused_clearly_when_missing_failing_or_silent(tmp_path, monkeypatch):
    """No Chromium, one that exits at once, one that never answers: a RuntimeError naming it, and no temp left."""
    import tempfile

    from workbench.show.chromium import ChromiumSession

    systmp = tmp_path / "systmp"
    systmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chromium"))
    with pytest.raises(RuntimeError, match="figure export needs Chromium: install Debian's chromium"):
        ChromiumSession().__enter__()
    for name, script, match in (("failing", "echo cannot open the profile >&2\nexit 3", r"Chromium failed \(3\)"
                                 r": cannot open the profile"),
                                ("silent", "exec sleep 60", "Chromium gave no result within 1 s")):
        fake = tmp_path / name
        fake.write_text(f"#!/bin/sh\n{script}\n")
        fake.chmod(0o755)
        monkeypatch.setenv("BROWSER_PATH", str(fake))
        with pytest.raises(RuntimeError, match=match):
            with ChromiumSession(timeout_s=1) as br:
                br.call("Target.getTargets")
        assert list(systmp.iterdir()) == [], name  # the profile folder is removed, the process ended
