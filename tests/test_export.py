"""Figure export: sizes, text really in the files, sidecar, CSV, atomic writes, bad input.

Needs Debian's chromium (installed by the set-up); one kaleido server serves the whole module.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import _figure_files as ff
import pandas as pd
import plotly.graph_objects as go
import pytest

from workbench.show import export as ex
from workbench.show import kaleido_server as ks
from workbench.show.plots import TEMPLATE

TITLE = "Sink ζ τ η Δ certificate"  # "fi": a ligature glyph in the PDF; short: no wrap at a single column


@pytest.fixture(scope="module", autouse=True)
def server():
    ex.ensure_server()
    yield
    # left running: other modules reuse it; atexit stops it


def scatter(title=TITLE, **meta):
    return go.Figure(go.Scatter(x=[1, 2, 3], y=[3.5, 1.25, 2.0], name="budget 64", mode="lines+markers"),
                     layout=dict(template=TEMPLATE, title=title, xaxis_title="layer ℓ", yaxis_title="ratio",
                                 meta={"figure": "demo", "model_id": "tiny/llama", "zeta": 0.5, **meta}))


def heatmap():
    return go.Figure(go.Heatmap(z=[[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], x=["h0", "h1", "h2"], y=[0, 1]),
                     layout=dict(template=TEMPLATE, title="heads"))


def media_box(pdf: bytes) -> list[float]:
    m = re.search(rb"/MediaBox \[([^\]]*)\]", pdf)
    return [float(v) for v in m.group(1).split()]


def svg_root(svg: str) -> str:
    return re.search(r"<svg\b[^>]*>", svg).group(0)


def test_single_column_files_sizes_and_text(tmp_path):
    paths = ex.export(scatter(), tmp_path / "fig1", prompt="the prompt text", params={"budget": 64}, title=True)
    names = sorted(p.name for p in paths)
    assert names == ["fig1.csv", "fig1.json", "fig1.pdf", "fig1.png", "fig1.svg"]
    assert sorted(os.listdir(tmp_path)) == names  # no temp files left

    # PDF: 3.33 in wide (240 pt at 72 pt/in), 0.75 aspect; the title is drawn as text with an embedded font
    pdf = (tmp_path / "fig1.pdf").read_bytes()
    assert pdf.startswith(b"%PDF")
    assert media_box(pdf) == pytest.approx([0, 0, 240, 180], abs=0.05)
    assert re.search(rb"/BaseFont /[A-Z]{6}\+(DejaVuSans|LiberationSans)", pdf)
    assert b"/FontFile2" in pdf  # embedded (subset) TrueType
    text = ff.pdf_text(pdf)
    assert TITLE in text
    assert "layerℓ" in re.sub(r"\s", "", text)  # "ℓ" is a run of its own (spaces between runs are positional)
    assert TITLE in ff._pdf_text_builtin(pdf)  # the built-in reader too (pdftotext may be installed)
    if shutil.which("pdftotext"):  # installed by the set-up (poppler-utils): the reference reader
        out = subprocess.run(["pdftotext", str(tmp_path / "fig1.pdf"), "-"], capture_output=True, text=True, check=True)
        assert TITLE in ff.unligature(out.stdout)
        assert "ℓ" in out.stdout

    # SVG: physical size in points, the layout's viewBox, the title as a <text> element
    svg = (tmp_path / "fig1.svg").read_text()
    root = svg_root(svg)
    assert 'width="240pt"' in root and 'height="180pt"' in root and 'viewBox="0 0 240 180"' in root
    assert re.search(r"<text[^>]*>" + re.escape(TITLE) + "</text>", svg)
    assert ">ratio</text>" in svg  # the axis title

    # PNG: width * scale pixels, 300 dpi by default
    w, h, dpi = ff.png_size(tmp_path / "fig1.png")
    assert (w, h) == (1000, 750)
    assert dpi == pytest.approx(300, abs=0.01)

    # sidecar
    side = json.loads((tmp_path / "fig1.json").read_text())
    assert side["figure"] == "demo" and side["model_id"] == "tiny/llama" and side["title"] == TITLE
    assert side["meta"]["zeta"] == 0.5 and side["params"] == {"budget": 64}
    assert side["prompt_hash"] == hashlib.sha256(b"the prompt text").hexdigest()
    assert side["versions"]["plotly"] == md.version("plotly")
    assert side["versions"]["kaleido"] == md.version("kaleido")
    assert side["versions"]["workbench"] == __import__("workbench").__version__
    created = dt.datetime.fromisoformat(side["created_utc"])
    assert created.utcoffset() == dt.timedelta(0)
    assert abs((dt.datetime.now(dt.timezone.utc) - created).total_seconds()) < 600
    assert side["sizes"] == [{"preset": "single", "width_px": 240, "height_px": 180, "width_in": 3.3333,
                              "height_in": 2.5, "png_scale": ex.DEFAULT_SCALE, "png_px": [1000, 750],
                              "png_dpi": 300.0, "base_font_pt": 9.0, "font_ratio": 0.75}]
    assert sorted(side["files"]) == names

    # CSV: the plotted points
    df = pd.read_csv(tmp_path / "fig1.csv")
    assert len(df) == 3
    assert df["x"].tolist() == [1, 2, 3] and df["y"].tolist() == [3.5, 1.25, 2.0]


def test_double_column_and_pixel_widths_with_scale(tmp_path):
    paths = ex.export(scatter(), tmp_path / "f", width=["double", 300], scale=2, aspect=0.5, formats=("pdf", "png"))
    assert sorted(p.name for p in paths) == ["f-300px.pdf", "f-300px.png", "f-double.pdf", "f-double.png",
                                             "f.csv", "f.json"]
    assert media_box((tmp_path / "f-double.pdf").read_bytes()) == pytest.approx([0, 0, 504, 252], abs=0.05)
    assert media_box((tmp_path / "f-300px.pdf").read_bytes()) == pytest.approx([0, 0, 300, 150], abs=0.05)
    assert ff.png_size(tmp_path / "f-double.png")[:2] == (1008, 504)
    assert ff.png_size(tmp_path / "f-300px.png") == pytest.approx((600, 300, 144.0), abs=0.01)
    side = json.loads((tmp_path / "f.json").read_text())
    assert [s["preset"] for s in side["sizes"]] == ["double", None]
    assert side["sizes"][0]["width_in"] == 7.0


def test_figure_aspect_height_and_prompt_hash_from_meta(tmp_path):
    fig = scatter(prompt_hash="abc123")
    fig.update_layout(width=800, height=400)  # the figure's own aspect 0.5 is kept at the paper width
    ex.export(fig, tmp_path / "g.pdf", formats=["svg"], csv=False)  # a format suffix is dropped
    assert sorted(os.listdir(tmp_path)) == ["g.json", "g.svg"]
    assert 'height="120pt"' in svg_root((tmp_path / "g.svg").read_text())
    assert json.loads((tmp_path / "g.json").read_text())["prompt_hash"] == "abc123"
    ex.export(fig, tmp_path / "h", formats=["svg"], height=100, csv=False, sidecar=False)
    assert sorted(os.listdir(tmp_path)) == ["g.json", "g.svg", "h.svg"]
    assert 'height="100pt"' in svg_root((tmp_path / "h.svg").read_text())


def title_font_px(svg: str) -> float:
    m = re.search(r'<text class="gtitle"[^>]*font-size: ([\d.]+)px[^>]*>(.*?)</text>', svg)
    assert TITLE.split()[0] in m.group(2)  # a kept title may wrap (tspans) at a column width
    return float(m.group(1))


def test_paper_fonts_scale_every_font_and_can_be_turned_off(tmp_path):
    # the template: base 12 px, title 14 px, ticks 10 px; single column -> base 9 pt (x 0.75), double -> 10 pt
    ex.export(scatter(), tmp_path / "a", width=["single", "double", 400], formats=("svg",), csv=False, title=True)
    sizes = {t: title_font_px((tmp_path / f"a-{t}.svg").read_text()) for t in ("single", "double", "400px")}
    assert sizes == pytest.approx({"single": 10.5, "double": 14 * 10 / 12, "400px": 14.0}, abs=0.01)
    single = (tmp_path / "a-single.svg").read_text()
    assert re.search(r'class="xtick"[^>]*>.*?font-size: 7.5px', single)  # tick labels 10 px -> 7.5
    ex.export(scatter(), tmp_path / "b", formats=("svg",), csv=False, font_size=None, title=True)
    assert title_font_px((tmp_path / "b.svg").read_text()) == 14.0
    ex.export(scatter(), tmp_path / "c", formats=("svg",), csv=False, font_size=6, title=True)
    assert title_font_px((tmp_path / "c.svg").read_text()) == 7.0
    side = json.loads((tmp_path / "c.json").read_text())
    assert side["sizes"][0]["base_font_pt"] == 6 and side["sizes"][0]["font_ratio"] == 0.5
    ex.export(scatter(), tmp_path / "d", formats=("svg",), csv=False, title=False)
    assert TITLE not in (tmp_path / "d.svg").read_text()
    ex.export(scatter(), tmp_path / "e", formats=("svg",), csv=False)  # the default: no title (caption in the paper)
    assert "certificate" not in (tmp_path / "e.svg").read_text()


def test_data_argument_is_the_csv(tmp_path):
    data = pd.DataFrame({"budget": [64, 128], "accuracy": [0.25, 0.75], "method": ["snapkv", "deferkv"]})
    ex.export(scatter(), tmp_path / "acc", formats=("svg",), data=data)
    back = pd.read_csv(tmp_path / "acc.csv")
    pd.testing.assert_frame_equal(back, data)


def test_figure_data_flattens_heatmaps_and_tables():
    df = ex.figure_data(heatmap())
    assert len(df) == 6
    assert df["z"].tolist() == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert df["x"].tolist() == ["h0", "h1", "h2"] * 2 and df["y"].tolist() == [0, 0, 0, 1, 1, 1]
    t = go.Figure(go.Table(header=dict(values=["method", "em"]), cells=dict(values=[["a", "b"], [0.5, 1.0]])))
    tf = ex.figure_data(t)
    assert tf["method"].tolist() == ["a", "b"] and tf["em"].tolist() == [0.5, 1.0]


@pytest.mark.parametrize("as_numpy", [False, True])
def test_heatmap_csv_has_one_row_per_cell(tmp_path, as_numpy):
    fig = heatmap()
    if as_numpy:  # hand-made figures often carry numpy arrays
        import numpy as np

        fig.data[0].z = np.array(fig.data[0].z)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ex.export(fig, tmp_path / "hm", formats=("svg",))
    df = pd.read_csv(tmp_path / "hm.csv")
    assert len(df) == 6
    assert sorted(df["z"].round(6).tolist()) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert df["x"].tolist() == ["h0", "h1", "h2"] * 2


@pytest.mark.parametrize("kw, name", [
    (dict(formats=("pdf", "gif")), "formats"),
    (dict(formats=("pdf", "pdf")), "formats"),
    (dict(width=0), "width"),
    (dict(width=-240), "width"),
    (dict(width="triple"), "width"),
    (dict(width=[]), "width"),
    (dict(width=float("nan")), "width"),
    (dict(width=True), "width"),
    (dict(scale=0), "scale"),
    (dict(height=-1), "height"),
    (dict(aspect=0), "aspect"),
    (dict(font_size=0), "font_size"),
    (dict(font_size="big"), "font_size"),
    (dict(params=[1, 2]), "params"),
    (dict(data=[1, 2]), "data"),
])
def test_bad_input_names_the_parameter_and_writes_nothing(tmp_path, kw, name):
    target = tmp_path / "sub" / "fig"
    with pytest.raises(ValueError, match=rf"^{name}:"):
        ex.export(scatter(), target, **kw)
    assert not (tmp_path / "sub").exists()


def test_bad_fig_path_and_export_all_names(tmp_path):
    with pytest.raises(ValueError, match="^fig:"):
        ex.export({"data": []}, tmp_path / "x")
    with pytest.raises(ValueError, match="^path:"):
        ex.export(scatter(), tmp_path / "a b")
    with pytest.raises(ValueError, match="^figures:"):
        ex.export_all({"a/b": scatter()}, tmp_path)
    with pytest.raises(ValueError, match="^widths:"):
        ex.export_all({"a": scatter()}, tmp_path, widths={"b": "double"})
    assert list(tmp_path.iterdir()) == []


def test_renderer_error_midway_leaves_nothing(tmp_path, monkeypatch):
    """The renderer dies after the first of two widths was rendered: nothing is written, an earlier export
    stays as it was, and kaleido's private temporary folders are gone."""
    import tempfile

    private_tmp = tmp_path / "system-tmp"  # this test's own temp root: other processes export too
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    out = tmp_path / "out"
    out.mkdir()
    tmp_path = out
    real = ex.render_all
    calls = []

    def flaky(fig_dict, fmts, size):
        calls.append(size.tag)
        if len(calls) % 2 == 0:
            raise RuntimeError("renderer died")
        return real(fig_dict, fmts, size)

    tmp_before = set(Path(tempfile.gettempdir()).glob("workbench-export-*"))
    monkeypatch.setattr(ex, "render_all", flaky)
    with pytest.raises(RuntimeError, match="renderer died"):
        ex.export(scatter(), tmp_path / "fig", width=["single", "double"])
    assert calls == ["single", "double"]  # the single-column files had been rendered
    assert list(tmp_path.iterdir()) == []

    # an earlier export stays as it was
    monkeypatch.setattr(ex, "render_all", real)
    ex.export(scatter(title="first"), tmp_path / "fig", width=["single", "double"])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert len(before) == 8  # 2 widths x pdf/svg/png + json + csv
    monkeypatch.setattr(ex, "render_all", flaky)
    with pytest.raises(RuntimeError):
        ex.export(scatter(title="second"), tmp_path / "fig", width=["single", "double"])
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert set(Path(tempfile.gettempdir()).glob("workbench-export-*")) == tmp_before


def test_write_error_midway_removes_temps_and_new_files(tmp_path, monkeypatch):
    real_replace = os.replace
    n = [0]

    def failing_replace(a, b):
        n[0] += 1
        if n[0] == 3:
            raise OSError("disk full")
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        ex.export(scatter(), tmp_path / "fig")
    assert n[0] == 3
    assert list(tmp_path.iterdir()) == []


def test_figure_widgets_export_like_figures(tmp_path):
    ex.export(go.FigureWidget(scatter()), tmp_path / "w", formats=("svg",), title=True)
    assert TITLE in (tmp_path / "w.svg").read_text()
    assert json.loads((tmp_path / "w.json").read_text())["meta"]["zeta"] == 0.5
    assert len(pd.read_csv(tmp_path / "w.csv")) == 3


def test_export_all_writes_every_figure(tmp_path):
    figs = {"scatter": scatter(), "heads": heatmap()}
    out = ex.export_all(figs, tmp_path / "panel", widths={"heads": "double"}, formats=("pdf", "svg", "png"), title=True)
    assert set(out) == {"scatter", "heads"}
    for name in figs:
        assert sorted(p.suffix for p in out[name]) == [".csv", ".json", ".pdf", ".png", ".svg"]
        assert all(p.exists() and p.parent == tmp_path / "panel" for p in out[name])
    assert media_box((tmp_path / "panel" / "heads.pdf").read_bytes())[2] == pytest.approx(504, abs=0.05)
    assert media_box((tmp_path / "panel" / "scatter.pdf").read_bytes())[2] == pytest.approx(240, abs=0.05)
    assert "heads" in (tmp_path / "panel" / "heads.svg").read_text()


def test_server_is_persistent_and_restartable(tmp_path):
    assert ex.server_running()
    thread = ks.server_thread()
    assert thread is not None and thread.is_alive()
    ex.export(scatter(), tmp_path / "a", formats=("svg",), csv=False, sidecar=False, title=True)
    ex.export(scatter(), tmp_path / "b", formats=("svg",), csv=False, sidecar=False, title=True)
    assert ks.server_thread() is thread  # the same Chromium served both
    ex.shutdown_server()
    assert not ex.server_running() and not thread.is_alive()
    ex.export(scatter(), tmp_path / "c", formats=("svg",), csv=False, sidecar=False, title=True)  # a new server
    assert ex.server_running() and ks.server_thread() is not thread
    a, c = (tmp_path / "a.svg").read_text(), (tmp_path / "c.svg").read_text()
    texts = lambda s: re.findall(r">([^<>]+)</text>", s)  # noqa: E731
    assert svg_root(a) == svg_root(c) and texts(a) == texts(c)  # the new server renders the same figure
    assert TITLE in texts(c) and len(texts(c)) >= 8


def test_prompt_hash_forms():
    assert ex.prompt_hash("abc") == hashlib.sha256(b"abc").hexdigest()
    assert ex.prompt_hash([1, 2, 3]) == hashlib.sha256(b"[1, 2, 3]").hexdigest()
    with pytest.raises(ValueError, match="^prompt:"):
        ex.prompt_hash(object())


def test_resolve_size_presets():
    s = ex.resolve_size(go.Figure(), "single")
    assert (s.width, s.height, s.png_px) == (240, 180, (1000, 750))
    d = ex.resolve_size(go.Figure(), "double", scale=1)
    assert (d.width, d.height, d.png_px, d.inches) == (504, 227, (504, 227), 7.0)
    assert ex.resolve_size(go.Figure(), "double").png_px == (2100, 945)  # 945.83 floored, as Chromium does


def test_png_pixels_are_floored_like_chromium(tmp_path):
    ex.export(scatter(), tmp_path / "p", width=101, height=101, scale=1.5, formats=("png",), csv=False)
    assert ff.png_size(tmp_path / "p.png")[:2] == (151, 151)
    assert json.loads((tmp_path / "p.json").read_text())["sizes"][0]["png_px"] == [151, 151]


def test_sidecar_says_whether_the_title_was_drawn(tmp_path):
    ex.export(scatter(), tmp_path / "kept", formats=("svg",), csv=False, title=True)
    ex.export(scatter(), tmp_path / "dropped", formats=("svg",), csv=False)
    kept = json.loads((tmp_path / "kept.json").read_text())
    dropped = json.loads((tmp_path / "dropped.json").read_text())
    assert kept["title"] == dropped["title"] == TITLE
    assert kept["title_kept"] is True and dropped["title_kept"] is False
    assert TITLE in (tmp_path / "kept.svg").read_text() and TITLE not in (tmp_path / "dropped.svg").read_text()


def test_csv_bytes_round_trips_exactly():
    """The export's CSV writer (pyarrow) reads back to the same frame: floats to the last bit, NaN empty,
    booleans, strings with commas, quotes and newlines; mixed-object frames fall back to pandas."""
    import io

    import numpy as np
    import pandas as pd

    from workbench.show.export import csv_bytes

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30, 500), [np.nan, 0.0, -0.0, 1e-310]])
    df = pd.DataFrame({"x": x, "k": np.arange(len(x)), "ok": np.arange(len(x)) % 3 == 0,
                       "s": [f'tok "{i}", a\nb' if i % 7 == 0 else f"t{i}" for i in range(len(x))]})
    back = pd.read_csv(io.BytesIO(csv_bytes(df)))
    assert np.array_equal(back.x.to_numpy(), x, equal_nan=True)
    assert (back.k.to_numpy() == df.k.to_numpy()).all() and (back.ok.to_numpy() == df.ok.to_numpy()).all()
    assert list(back.s) == list(df.s)
    for odd in (pd.DataFrame({"v": [1, "a", [1, 2]]}), pd.DataFrame({"ids": [[1, 2], [3]]})):  # pandas writes these
        assert csv_bytes(odd) == odd.to_csv(index=False).encode()


# ----------------------------------------------------------------------------- stems, formats, widths, long names
@pytest.mark.parametrize("last", ["..", ".", "", ".hidden"])
def test_stems_that_are_dots_or_hidden_are_refused(tmp_path, last):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ValueError, match=r"^path: must end with a file stem \(folder/stem\) that is not '\.' or"):
        ex.export(scatter(), f"{out}/sub/{last}", formats=("svg",))
    assert list(tmp_path.rglob("*")) == [out]  # nothing beside or above the folder


@pytest.mark.parametrize("formats", [(), []])
def test_no_format_is_refused_naming_formats_and_the_allowed_values(tmp_path, formats):
    with pytest.raises(ValueError, match=r"^formats: must be one of \['pdf', 'svg', 'png'\] or a non-empty sequence"):
        ex.export(scatter(), tmp_path / "fig", formats=formats)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("n", [251, 260, 300])
def test_a_stem_too_long_for_its_file_names_is_refused_before_writing(tmp_path, n):
    with pytest.raises(ValueError, match=r"^path: the file stem is too long: .* of \d+ bytes, and a file name holds at "
                                         r"most 255; use a stem of at most 250 bytes"):
        ex.export(scatter(), tmp_path / ("s" * n), formats=("svg",))
    assert list(tmp_path.iterdir()) == []


def test_the_longest_stem_allowed_is_written(tmp_path):
    """250 bytes + ".json": a 255-byte name, whose temporary name must fit too."""
    got = ex.export(scatter(), tmp_path / ("s" * 250), formats=("svg",))
    assert sorted(len(p.name) for p in got) == [254, 254, 255]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in got)


def test_numpy_widths_are_accepted_like_numbers(tmp_path):
    import numpy as np

    for w in (np.float32(300), np.float64(300), np.int64(300)):
        assert ex.resolve_size(scatter(), w).width == 300
    got = ex.export(scatter(), tmp_path / "np", width=np.float32(300), formats=("svg",), csv=False, sidecar=False)
    assert [p.name for p in got] == ["np.svg"]
