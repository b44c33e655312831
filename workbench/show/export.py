"""Figure export for papers: PDF, SVG and PNG at column widths, with a JSON sidecar and the data as CSV.

One figure ``fig`` exported to ``folder/stem`` gives::

    stem.pdf  stem.svg  stem.png      the figure at the paper width (vector PDF/SVG, raster PNG)
    stem.json                         sidecar: figure meta and parameters, model id, prompt hash,
                                      versions (workbench, plotly, kaleido), UTC time, sizes, files
    stem.csv                          the plotted data (``data`` or ``plots.figure_frame(fig)``)

**Sizes.** Widths are paper column widths: ``"single"`` = 3.33 in, ``"double"`` = 7.0 in, or a number of
layout pixels. The layout is computed at **72 px per inch, one layout pixel = one point**, so a 12 px font
in the template is a 12 pt font on paper: a single-column figure is laid out 240 px wide and its PDF page
is 240 pt = 3.33 in wide (Chromium prints 96 CSS px per inch, so PDFs are rendered at scale 4/3); the SVG
carries ``width="240pt"`` with the layout's viewBox; the PNG has ``floor(width_px * scale)`` pixels (the
default scale 300/72 gives 300 dpi, written into its ``pHYs`` chunk). Screen-sized fonts are too large for a
column, so by default (``font_size="auto"``) the presets scale every font size and margin of the figure so
that its base font is 9 pt (single) or 10 pt (double); the sidecar records the ratio.

**Server.** Rendering goes through the persistent kaleido server of :mod:`workbench.show.kaleido_server`
(one Chromium per process, one tab per format).

**Atomic.** Every file of one figure is rendered in memory first (kaleido writes into a private temporary
folder that is read back and removed), then written to temporary files in the
target folder and moved into place with ``os.replace``; on an error nothing new is left behind.
"""
from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import hashlib
import importlib.metadata as md
import json
import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pyarrow as pa
import pyarrow.csv as pcsv
from plotly.basedatatypes import BaseFigure
from tqdm.auto import tqdm

from workbench._version import __version__
from workbench.checks import AnyOf, Bool, Choice, Const, InstanceOf, Interval, Seq, check_args, optional
from workbench.choices import EXPORT_FORMATS, WIDTH_PRESETS
from workbench.constraints import register_all
from workbench.show import plots
from workbench.show.chromium import ChromiumSession
from workbench.show.decimate import full_frame
from workbench.show.html_export import render_html
from workbench.show.kaleido_server import (
    FORMATS,
    PX_PER_INCH,
    browser_path,
    ensure_server,
    render_all,
    server_running,
    shutdown_server,
)
from workbench.show.paper_layout import paper_layout
from workbench.show.token_view import PRINT_FONT_PT, TokenView
from workbench.util import atomic_write_files, jsonable

__all__ = ["WIDTHS", "FORMATS", "EXPORT_CHECKS", "PX_PER_INCH", "DEFAULT_SCALE", "ExportSize", "resolve_size", "export",
           "export_all", "ensure_server", "shutdown_server", "server_running", "prompt_hash", "browser_path", "csv_bytes",
           "versions"]

WIDTHS: dict[str, float] = dict(zip(WIDTH_PRESETS, (3.33, 7.0)))  # inches: single, double
DEFAULT_SCALE = 300.0 / 72.0  # PNG pixels per layout pixel (300 dpi)
DEFAULT_ASPECT = {"single": 0.75, "double": 0.45, None: 0.75}  # height / width when the figure has none
PAPER_FONT = {"single": 9.0, "double": 10.0}  # base font (pt) of font_size="auto" at the column presets
_STEM_OK = re.compile(r"^[\w.+-]+$")


# ----------------------------------------------------------------------------- sizes
@dataclass(frozen=True)
class ExportSize:
    """One export size: ``preset`` (``"single"``, ``"double"`` or ``None`` for pixels), layout ``width``
    and ``height`` in px (= pt), ``inches`` (the paper width) and the PNG ``scale``."""

    preset: str | None
    width: int
    height: int
    scale: float

    @property
    def inches(self) -> float:
        return self.width / PX_PER_INCH

    @property
    def tag(self) -> str:
        """File-name suffix when several widths are exported (``single``, ``double``, ``480px``)."""
        return self.preset or f"{self.width}px"

    @property
    def png_px(self) -> tuple[int, int]:
        """PNG ``(width, height)`` in pixels: Chromium floors ``size * scale`` (``1e-6`` absorbs float error)."""
        return math.floor(self.width * self.scale + 1e-6), math.floor(self.height * self.scale + 1e-6)

    @property
    def dpi(self) -> float:
        return PX_PER_INCH * self.scale

    def to_dict(self) -> dict:
        return {"preset": self.preset, "width_px": self.width, "height_px": self.height,
                "width_in": round(self.inches, 4), "height_in": round(self.height / PX_PER_INCH, 4),
                "png_scale": self.scale, "png_px": list(self.png_px), "png_dpi": round(self.dpi, 3)}


_POSITIVE = Interval("real", 0.0, None, closed="right", what="a finite number")
_SIZE_CHECKS = register_all("resolve_size", dict.fromkeys(("scale", "width", "height", "aspect", "font_size"),
                                                          _POSITIVE), __name__)
"""The sizes, scale and font size of :func:`resolve_size` and the paper layout, in px or a ratio."""


def _positive_number(name: str, v, *, allow_none: bool = False) -> float | None:
    if v is None and allow_none:
        return None
    return _SIZE_CHECKS[name].check(name, v)


def resolve_size(fig, width="single", *, height=None, aspect=None, scale=DEFAULT_SCALE) -> ExportSize:
    """The layout size for ``width`` (``"single"``, ``"double"`` or px > 0).

    Height: ``height`` px when given; else ``aspect`` (height / width); else the figure's own aspect
    (``layout.height / layout.width``) when it sets both; else the figure's aspect for the preset
    (``layout.meta["aspect"][preset]``: multi-panel figures ask for more height); else the preset's
    default (single 0.75, double 0.45).
    """
    scale = _positive_number("scale", scale)
    if isinstance(width, str):
        if width not in WIDTHS:
            raise ValueError(f"width: must be one of {sorted(WIDTHS)} or a number of px > 0, got {width!r}")
        preset, w = width, WIDTHS[width] * PX_PER_INCH
    else:
        preset, w = None, _positive_number("width", width)
    w = int(round(w))
    if w < 1:
        raise ValueError(f"width: must give at least 1 px, got {width!r}")
    h = _positive_number("height", height, allow_none=True)
    if h is None:
        a = _positive_number("aspect", aspect, allow_none=True)
        if a is None:
            lay = getattr(fig, "layout", None)
            fw, fh = (getattr(lay, "width", None), getattr(lay, "height", None)) if lay is not None else (None, None)
            meta = getattr(lay, "meta", None) if lay is not None else None
            own = meta.get("aspect") if isinstance(meta, Mapping) else None
            own = own.get(preset or "single") if isinstance(own, Mapping) else None
            a = fh / fw if fw and fh else (float(own) if isinstance(own, (int, float)) and own > 0
                                           else DEFAULT_ASPECT[preset])
        h = w * a
    return ExportSize(preset, w, max(1, int(round(h))), scale)


# ----------------------------------------------------------------------------- sidecar and data
def prompt_hash(prompt) -> str:
    """SHA-256 (hex) of a prompt: a string, a Prompt (its text) or token ids (their decimal list)."""
    text = getattr(prompt, "text", None)
    if text is None and isinstance(prompt, str):
        text = prompt
    if text is None:
        ids = getattr(getattr(prompt, "spans", prompt), "input_ids", prompt)
        try:
            text = json.dumps([int(i) for i in ids])
        except TypeError:
            raise ValueError(f"prompt: must be a string, a Prompt or token ids, got {type(prompt).__name__}") from None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_hash_prompt = prompt_hash  # export() has an argument of that name


def versions() -> dict:
    """The versions a sidecar records (workbench, plotly, kaleido ...)."""
    out = {"workbench": __version__}
    for pkg in ("plotly", "kaleido", "choreographer"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:  # pragma: no cover
            out[pkg] = None
    return out


def _title(fig) -> str | None:
    t = getattr(getattr(fig.layout, "title", None), "text", None)
    return t if isinstance(t, str) else None


def _base_font(fig_dict: dict) -> float:
    lay = fig_dict.get("layout", {})
    for src in (lay, lay.get("template", {}).get("layout", {})):
        size = (src.get("font") or {}).get("size")
        if isinstance(size, (int, float)) and size > 0:
            return float(size)
    return 12.0  # plotly's default


def _scale_fonts(node, ratio: float) -> None:
    """Multiply every font ``size`` (keys ending in ``font``, any depth) and the margins by ``ratio``, in place."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k.endswith("font") and isinstance(v, dict) and isinstance(v.get("size"), (int, float)):
                v["size"] = round(v["size"] * ratio, 2)
            if k.endswith("font") and isinstance(v, dict) and isinstance(v.get("size"), list):
                v["size"] = [round(x * ratio, 2) if isinstance(x, (int, float)) else x for x in v["size"]]
            if k == "margin" and isinstance(v, dict):
                for side in ("l", "r", "t", "b", "pad"):
                    if isinstance(v.get(side), (int, float)):
                        v[side] = round(v[side] * ratio, 1)
            _scale_fonts(v, ratio)
    elif isinstance(node, list):
        for v in node:
            _scale_fonts(v, ratio)


def _paper_fonts(fig_dict: dict, size: ExportSize, font_size) -> tuple[float, float]:
    """Apply ``font_size`` (``"auto"``, a base size in pt, or ``None``) to a figure dict in place; returns
    ``(base font after, ratio)``."""
    base = _base_font(fig_dict)
    if font_size is None or (font_size == "auto" and size.preset is None):
        return base, 1.0
    target = PAPER_FONT[size.preset] if font_size == "auto" else float(font_size)
    ratio = target / base
    lay = fig_dict.setdefault("layout", {})
    if "margin" not in lay:  # plotly's own default margins would stay unscaled otherwise
        tm = lay.get("template", {}).get("layout", {}).get("margin")
        lay["margin"] = dict(tm) if isinstance(tm, dict) else {"l": 80, "r": 80, "t": 100, "b": 80}
    lay.setdefault("font", {})
    if not isinstance(lay["font"].get("size"), (int, float)):
        lay["font"]["size"] = base
    _scale_fonts(fig_dict, ratio)
    return target, ratio


def csv_bytes(frame) -> bytes:
    """A DataFrame as UTF-8 CSV bytes (no index), written by pyarrow's C++ CSV writer (~10x pandas' ``to_csv``:
    a 1 M-row token-level frame in 0.2 s instead of 2 s; strings quoted, NaN and None empty, booleans
    ``true``/``false``, floats round-trip exactly). Frames pyarrow cannot type (mixed objects) fall back to
    pandas."""
    try:
        sink = pa.BufferOutputStream()
        pcsv.write_csv(pa.Table.from_pandas(frame, preserve_index=False), sink)
    except (pa.ArrowException, TypeError, ValueError):  # e.g. list cells: pandas writes their repr
        return frame.to_csv(index=False).encode("utf-8")
    return sink.getvalue().to_pybytes()


def figure_data(fig) -> pd.DataFrame:
    """The plotted data as a tidy frame (:func:`workbench.show.plots.figure_frame`); for a token-level figure
    decimated to the screen, its full-resolution data (every token, :func:`workbench.show.decimate.full_frame`);
    for a token view, one row per token (:meth:`~workbench.show.token_view.TokenView.to_frame`)."""
    if isinstance(fig, TokenView):
        return fig.to_frame()
    full = full_frame(fig)
    return full if full is not None else plots.figure_frame(fig)


# ----------------------------------------------------------------------------- public API
def _check_formats(formats) -> tuple[str, ...]:
    if isinstance(formats, str):
        formats = (formats,)
    try:
        fmts = tuple(formats)
    except TypeError:
        raise ValueError(f"formats: must be a sequence of {FORMATS}, got {formats!r}") from None
    for f in fmts:
        if f not in FORMATS:
            raise ValueError(f"formats: every entry must be one of {FORMATS}, got {f!r}")
    if len(set(fmts)) != len(fmts):
        raise ValueError(f"formats: has duplicates: {fmts!r}")
    return fmts


def _check_widths(width) -> list:
    if isinstance(width, (str, numbers.Real)) and not isinstance(width, bool):  # numpy floats and ints too
        return [width]
    if isinstance(width, (list, tuple)) and width:
        return list(width)
    raise ValueError(f"width: must be 'single', 'double', a number of px > 0, or a non-empty list of these, "
                     f"got {width!r}")


NAME_MAX = 255  # bytes in one file name (Linux, macOS, Windows)


def _check_name_length(stem: str, sizes, fmts, extra) -> None:
    """Every file name the export makes (``stem[-tag].<format>``, and ``stem.<extra>``: csv, json, html) fits in
    :data:`NAME_MAX` bytes; checked before anything is rendered or written."""
    bases = [stem] if len(sizes) == 1 else [f"{stem}-{s.tag}" for s in sizes]
    names = [f"{b}.{e}" for b in bases for e in fmts] + [f"{stem}.{e}" for e in extra]
    longest = max(names, key=lambda n: len(n.encode()))
    n = len(longest.encode())
    if n > NAME_MAX:
        room = NAME_MAX - (n - len(stem.encode()))
        raise ValueError(f"path: the file stem is too long: it makes the file name {longest[:24] + '...'!r} of {n} "
                         f"bytes, and a file name holds at most {NAME_MAX}; use a stem of at most {room} bytes")


def _is_figure(x) -> bool:
    """A plotly figure or FigureWidget, a token view, or a token widget holding one as ``.view``."""
    return isinstance(x, (BaseFigure, TokenView)) or isinstance(getattr(x, "view", None), TokenView)


def _is_path(x) -> bool:
    return isinstance(x, (str, os.PathLike))


_PX = Interval("real", 0.0, None, closed="right")
EXPORT_CHECKS = register_all("export", {
    "fig": InstanceOf(_is_figure, "a plotly go.Figure, a FigureWidget or a TokenView"),
    "path": InstanceOf(_is_path, "a path folder/stem", nonempty=True),
    "width": AnyOf(Choice(WIDTH_PRESETS), _PX, Seq(AnyOf(Choice(WIDTH_PRESETS), _PX), nonempty=True)),
    "formats": AnyOf(Choice(EXPORT_FORMATS), Seq(Choice(EXPORT_FORMATS), nonempty=True, distinct=True)),
    "params": optional(InstanceOf(Mapping, "a mapping")),
    "data": optional(InstanceOf(pd.DataFrame, "a pandas DataFrame")),
    "scale": _PX,
    "height": optional(_PX),
    "aspect": optional(_PX),
    "font_size": AnyOf(Const("auto"), Const(None), _PX),
    "title": Bool(),
    "prompt": InstanceOf(object, "None, a string, a Prompt or token ids (checked by prompt_hash)"),
    "prompt_hash": optional(InstanceOf(str, "a string", nonempty=True)),
    "model_id": optional(InstanceOf(str, "a string", nonempty=True)),
    "csv": Bool(),
    "sidecar": Bool(),
}, __name__)
"""The constraint of every argument of :func:`export` (registered as ``export.<name>``)."""


def export(fig, path, *, width="single", formats: Sequence[str] = FORMATS, params: Mapping | None = None,
           data: pd.DataFrame | None = None, scale: float = DEFAULT_SCALE, height: float | None = None,
           aspect: float | None = None, font_size="auto", title: bool = False, prompt=None,
           prompt_hash: str | None = None, model_id: str | None = None, csv: bool = True,
           sidecar: bool = True) -> list[Path]:
    """Export one figure for a paper; returns the paths written (figure files, then ``.json``, ``.csv``).

    Args:
        fig: a plotly ``go.Figure`` (or ``FigureWidget``); its ``layout.meta`` goes into the sidecar. Or a
            :class:`~workbench.show.token_view.TokenView` (the token view, HTML): printed by Chromium
            (:mod:`workbench.show.html_export`: vector PDF and SVG, PNG; the height follows the text, ``height``
            and ``aspect`` do not apply), plus ``stem.html`` (the self-contained page); CSV: one row per token.
        path: ``folder/stem`` (a suffix such as ``.pdf`` is dropped); the folder is created.
        width: ``"single"`` (3.33 in), ``"double"`` (7.0 in), a number of layout px (> 0), or a list of
            these: then every size is exported with the suffix ``-single``, ``-double`` or ``-<px>px``.
        formats: a subset of ``("pdf", "svg", "png")``.
        params: extra parameters for the sidecar (e.g. a panel's slider values).
        data: the frame to write as CSV (default: the figure's traces via ``plots.figure_frame``).
        scale: PNG pixels per layout px (> 0); 300/72 = 300 dpi.
        height, aspect: layout height in px, or height/width (see :func:`resolve_size`).
        font_size: ``"auto"`` (the column presets get a base font of 9 pt single / 10 pt double, every
            font and margin of the figure scaled by the same ratio; pixel widths stay as they are), a base
            font size in pt (> 0) for every size, or ``None`` (the figure's fonts unchanged).
        title: keep the figure title (default ``False``: dropped, the caption lives in the paper). Either
            way the layout rules of :mod:`workbench.show.paper_layout` place the legend, the axis titles
            and (when kept) the title so that no two texts overlap at the export width.
        prompt, prompt_hash: the prompt (hashed with :func:`prompt_hash`) or its hash, for the sidecar;
            default ``meta["prompt_hash"]`` when the figure carries one.
        model_id: default ``meta["model_id"]`` (or ``params["model_id"]``).
        csv, sidecar: write the ``.csv`` / ``.json`` files.

    Raises:
        ValueError: unknown format or width preset, width/height/scale ≤ 0, a bad path or fig.
        RuntimeError: no Chromium, or kaleido failed (nothing is written then).
    """
    check_args(EXPORT_CHECKS, locals())  # every argument against its declared constraint

    if isinstance(fig, BaseFigure) and not isinstance(fig, go.Figure):  # a FigureWidget
        fig = go.Figure(fig)
    view = getattr(fig, "view", None)
    if isinstance(view, TokenView):  # a token widget: its view
        fig = view
    if not isinstance(fig, (go.Figure, TokenView)):
        raise ValueError(f"fig: must be a plotly go.Figure, a FigureWidget or a TokenView, got {type(fig).__name__}")
    fmts = _check_formats(formats)
    widths = _check_widths(width)
    sizes = [resolve_size(fig, w, height=height, aspect=aspect, scale=scale) for w in widths]
    if len({s.tag for s in sizes}) != len(sizes):
        raise ValueError(f"width: has duplicates: {widths!r}")
    if params is not None and not isinstance(params, Mapping):
        raise ValueError(f"params: must be a mapping or None, got {type(params).__name__}")
    if font_size is not None and font_size != "auto":
        _positive_number("font_size", font_size)
    if data is not None and not isinstance(data, pd.DataFrame):
        raise ValueError(f"data: must be a pandas DataFrame or None, got {type(data).__name__}")
    p = Path(path)
    if p.suffix.lower() in tuple(f".{f}" for f in FORMATS) + (".json", ".csv"):
        p = p.with_suffix("")
    stem = p.name
    last = re.split(r"[/\\]", os.fspath(path))[-1]
    if last in ("", ".", "..") or stem.startswith("."):  # "out/." is "out": the files would land beside the folder
        raise ValueError(f"path: must end with a file stem (folder/stem) that is not '.' or '..' and does not start "
                         f"with '.' (a hidden file, or files beside the folder), got {os.fspath(path)!r}")
    if not stem or not _STEM_OK.match(stem):
        raise ValueError(f"path: the file stem must be letters, digits, '_', '-', '+' or '.', got {stem!r}")
    _check_name_length(stem, sizes, fmts, ["csv"] * csv + ["json"] * sidecar + ["html"] * isinstance(fig, TokenView))
    folder = p.parent
    folder.mkdir(parents=True, exist_ok=True)

    meta = fig.layout.meta
    meta = dict(meta) if isinstance(meta, Mapping) else ({"meta": meta} if meta is not None else {})
    params = dict(params or {})
    if prompt is not None:
        ph = _hash_prompt(prompt)
    else:
        ph = prompt_hash if prompt_hash is not None else meta.get("prompt_hash", params.get("prompt_hash"))

    files: dict[Path, bytes] = {}
    fonts = []
    if isinstance(fig, TokenView):  # HTML printed by one Chromium for every size (vector PDF/SVG, PNG), and the page
        with ChromiumSession() as browser:
            for size in sizes:
                base = stem if len(sizes) == 1 else f"{stem}-{size.tag}"
                text_pt, key_pt = PRINT_FONT_PT[size.preset or ("single" if size.width < 372 else "double")]
                fonts.append({"base_font_pt": text_pt, "smallest_font_pt": key_pt, "font_ratio": 1.0})
                for fmt, blob in render_html(fig, fmts, size, title=title, browser=browser).items():
                    files[folder / f"{base}.{fmt}"] = blob
        files[folder / f"{stem}.html"] = fig.html(standalone=True).encode("utf-8")
    fig_dict = {} if isinstance(fig, TokenView) else fig.to_dict()
    fig_dict.get("layout", {}).pop("meta", None)  # not drawn; keeps the page small
    for i, size in enumerate(sizes if not isinstance(fig, TokenView) else ()):
        base = stem if len(sizes) == 1 else f"{stem}-{size.tag}"
        d = copy.deepcopy(fig_dict)
        font, ratio = _paper_fonts(d, size, font_size)
        # the canvas grows when its legend and labels would leave the plot under the paper rules' share (not
        # when the caller fixed the height or the aspect)
        h = paper_layout(d, size.width, size.height, preset=size.preset, title=title,
                         grow=height is None and aspect is None)
        if h != size.height:
            size = sizes[i] = dataclasses.replace(size, height=h)
        fonts.append({"base_font_pt": font, "font_ratio": round(ratio, 4)})
        for fmt, blob in render_all(d, fmts, size).items():
            files[folder / f"{base}.{fmt}"] = blob
    if csv:
        frame = data if data is not None else figure_data(fig)
        files[folder / f"{stem}.csv"] = csv_bytes(frame)
    if sidecar:
        side = {
            "figure": meta.get("figure"),
            "title": _title(fig),
            "title_kept": bool(title),  # drawn in the files (the default drops it: the caption is the paper's)
            "model_id": model_id or meta.get("model_id") or params.get("model_id"),
            "prompt_hash": ph,
            "meta": meta,
            "params": params,
            "sizes": [{**s.to_dict(), **f} for s, f in zip(sizes, fonts)],
            "formats": list(fmts),
            "files": sorted(f.name for f in files if f.suffix != ".json") + [f"{stem}.json"],
            "versions": versions(),
            "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        files[folder / f"{stem}.json"] = (json.dumps(jsonable(side), indent=2, ensure_ascii=False) + "\n").encode()
    return atomic_write_files(files)


def export_all(figures: Mapping, folder, *, widths: Mapping | None = None, progress: bool = False,
               **kw) -> dict[str, list[Path]]:
    """Export every figure of ``{name: fig}`` to ``folder/<name>.*`` with :func:`export` (``kw`` go to
    it; ``widths`` maps names to a width overriding ``kw["width"]``). Returns ``{name: paths}``.

    Each figure is atomic on its own; a failure stops the loop and raises (earlier figures stay written).
    """
    if not isinstance(figures, Mapping):
        raise ValueError(f"figures: must be a mapping name -> figure, got {type(figures).__name__}")
    for name in figures:
        if not isinstance(name, str) or not _STEM_OK.match(name):
            raise ValueError(f"figures: names must be letters, digits, '_', '-', '+' or '.', got {name!r}")
    widths = dict(widths or {})
    unknown = set(widths) - set(figures)
    if unknown:
        raise ValueError(f"widths: names not among the figures: {sorted(unknown)}")
    folder = Path(folder)
    out = {}
    items = list(figures.items())
    if progress:

        items = tqdm(items, desc="export", unit="fig")
    for name, fig in items:
        k = dict(kw)
        if name in widths:
            k["width"] = widths[name]
        out[name] = export(fig, folder / name, **k)
    return out
