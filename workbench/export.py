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

**Server.** Rendering uses kaleido with one persistent Chromium per process (:func:`ensure_server`,
started on first use, stopped at exit or by :func:`shutdown_server`); Debian's ``/usr/bin/chromium`` is
found on ``PATH`` (or set ``BROWSER_PATH``). MathJax is off (offline; use Unicode: ζ τ η Λ Δ). The server
has one tab per format and renders a figure's PDF, SVG and PNG at the same time (kaleido reloads a tab
after every render, so one after another they took ~1.2 s; together ~0.9 s, ``benchmarks/export.py``).

**Atomic.** Every file of one figure is rendered in memory first (kaleido writes into a private temporary
folder that is read back and removed), then written to temporary files in the
target folder and moved into place with ``os.replace``; on an error nothing new is left behind.
"""
from __future__ import annotations

import atexit
import datetime as _dt
import hashlib
import json
import math
import os
import queue
import re
import shutil
import struct
import tempfile
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

__all__ = ["WIDTHS", "FORMATS", "PX_PER_INCH", "DEFAULT_SCALE", "ExportSize", "resolve_size", "export",
           "export_all", "ensure_server", "shutdown_server", "server_running", "prompt_hash", "pdf_text",
           "png_size", "browser_path"]

WIDTHS: dict[str, float] = {"single": 3.33, "double": 7.0}  # inches
FORMATS = ("pdf", "svg", "png")
PX_PER_INCH = 72.0  # layout pixels per inch (1 px = 1 pt)
CSS_PX_PER_INCH = 96.0  # Chromium's print resolution
DEFAULT_SCALE = 300.0 / 72.0  # PNG pixels per layout pixel (300 dpi)
DEFAULT_ASPECT = {"single": 0.75, "double": 0.45, None: 0.75}  # height / width when the figure has none
PAPER_FONT = {"single": 9.0, "double": 10.0}  # base font (pt) of font_size="auto" at the column presets
RENDER_TIMEOUT_S = 120.0
BROWSER_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
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


def _positive_number(name: str, v, *, allow_none: bool = False) -> float | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name}: must be a finite number > 0, got {v!r}")
    return float(v)


def resolve_size(fig, width="single", *, height=None, aspect=None, scale=DEFAULT_SCALE) -> ExportSize:
    """The layout size for ``width`` (``"single"``, ``"double"`` or px > 0).

    Height: ``height`` px when given; else the figure's own aspect (``layout.height / layout.width``) when it
    sets both; else ``aspect`` (height / width); else the preset's default (single 0.75, double 0.45).
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
            a = fh / fw if fw and fh else DEFAULT_ASPECT[preset]
        h = w * a
    return ExportSize(preset, w, max(1, int(round(h))), scale)


# ----------------------------------------------------------------------------- kaleido server
_LOCK = threading.RLock()
_STATE = {"running": False, "atexit": False}


def browser_path() -> str | None:
    """The Chromium kaleido will use: ``$BROWSER_PATH``, else a chromium on ``PATH``, else a known path."""
    env = os.environ.get("BROWSER_PATH")
    if env:
        return env if os.path.isfile(env) else None
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        p = shutil.which(name)
        if p:
            return p
    for p in BROWSER_CANDIDATES:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _server():
    import kaleido

    return kaleido._global_server  # noqa: SLF001 - to see whether its thread is alive


def server_running() -> bool:
    """Whether this process's persistent kaleido server is up."""
    with _LOCK:
        if not _STATE["running"]:
            return False
        t = getattr(_server(), "_thread", None)
        return bool(t is not None and t.is_alive())


def ensure_server(*, timeout_s: float = RENDER_TIMEOUT_S) -> None:
    """Start the persistent kaleido server (one Chromium per process) unless it runs; idempotent.

    Raises RuntimeError when no Chromium is found or it does not start within ``timeout_s``.
    """
    import kaleido

    with _LOCK:
        if server_running():
            return
        if _STATE["running"]:  # its thread died: reset before restarting
            shutdown_server()
        path = browser_path()
        if path is None:
            raise RuntimeError("figure export needs Chromium: install Debian's chromium (apt-get install chromium "
                               "fonts-liberation fonts-dejavu-core) or set BROWSER_PATH to a Chromium binary")
        os.environ.setdefault("BROWSER_PATH", path)
        # one tab per format: the formats of a figure render at the same time (kaleido reloads a tab after
        # each render, ~0.3 s, so three formats one after another took ~1.2 s)
        kaleido.start_sync_server(n=len(FORMATS), mathjax=False, timeout=timeout_s, silence_warnings=True)
        _STATE["running"] = True
        if not _STATE["atexit"]:
            atexit.register(shutdown_server)
            _STATE["atexit"] = True
        try:  # the first render starts Chromium; a dead server thread would block forever, so wait with a limit
            _call(_probe_figure(), dict(format="svg", width=16, height=16, scale=1.0), timeout_s=timeout_s)
        except BaseException:
            shutdown_server()
            raise


def shutdown_server() -> None:
    """Stop the persistent kaleido server (Chromium exits); the next export starts a new one."""
    import kaleido

    with _LOCK:
        if not _STATE["running"]:
            return
        _STATE["running"] = False
        srv = _server()
        t = getattr(srv, "_thread", None)
        if t is not None and not t.is_alive():  # a dead thread cannot take the stop message
            srv._initialized = False  # noqa: SLF001
            return
        kaleido.stop_sync_server(silence_warnings=True)


def _probe_figure() -> dict:
    return {"data": [], "layout": {"width": 16, "height": 16}}


def _bounded(fn, what: str, timeout_s: float):
    """``fn()`` in a worker thread, so that a dead server cannot hang us."""
    box: queue.Queue = queue.Queue(maxsize=1)

    def work():
        try:
            box.put(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box.put(e)

    t = threading.Thread(target=work, daemon=True, name="workbench-export")
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise RuntimeError(f"figure export: kaleido gave no {what} within {timeout_s:.0f} s (Chromium not running?)")
    res = box.get()
    if isinstance(res, BaseException):
        raise res
    return res


def _call(fig_dict: dict, opts: dict, *, timeout_s: float) -> bytes:
    """One render on the persistent server (``opts``: kaleido's format, width, height, scale)."""
    import kaleido

    return _bounded(lambda: kaleido.calc_fig_sync(fig_dict, opts=opts), opts["format"], timeout_s)


def _opts(fmt: str, size: ExportSize) -> dict:
    """kaleido's options for ``fmt`` at ``size`` (see the module docstring for units)."""
    scale = {"png": size.scale, "pdf": CSS_PX_PER_INCH / PX_PER_INCH, "svg": 1.0}[fmt]
    return dict(format=fmt, width=size.width, height=size.height, scale=scale)


def _finish_format(fmt: str, data: bytes, size: ExportSize) -> bytes:
    if fmt == "png":
        return _png_set_dpi(data, size.dpi)
    if fmt == "svg":
        return _svg_in_points(data, size)
    return data


def _render_all(fig_dict: dict, fmts: Sequence[str], size: ExportSize) -> dict[str, bytes]:
    """Bytes of every format in ``fmts`` at ``size``, rendered at the same time in the server's tabs
    (kaleido writes them into a private temporary folder, read back and removed here)."""
    import kaleido

    if len(fmts) == 1:
        return {fmts[0]: _render(fig_dict, fmts[0], size)}
    ensure_server()
    with _LOCK, tempfile.TemporaryDirectory(prefix="workbench-export-") as tmp:
        specs = [{"fig": fig_dict, "path": os.path.join(tmp, f"figure.{fmt}"), "opts": _opts(fmt, size)}
                 for fmt in fmts]
        _bounded(lambda: kaleido.write_fig_from_object_sync(specs, cancel_on_error=True),
                 "/".join(fmts), RENDER_TIMEOUT_S * len(fmts))
        return {fmt: _finish_format(fmt, Path(spec["path"]).read_bytes(), size) for fmt, spec in zip(fmts, specs)}


def _render(fig_dict: dict, fmt: str, size: ExportSize) -> bytes:
    """Bytes of ``fmt`` at ``size`` (see the module docstring for units)."""
    if fmt not in FORMATS:
        raise ValueError(f"formats: must be among {FORMATS}, got {fmt!r}")  # pragma: no cover - checked before
    ensure_server()
    with _LOCK:
        return _finish_format(fmt, _call(fig_dict, _opts(fmt, size), timeout_s=RENDER_TIMEOUT_S), size)


# ----------------------------------------------------------------------------- format details
def _svg_in_points(data: bytes, size: ExportSize) -> bytes:
    """Give the root ``<svg>`` a physical size in points (its viewBox stays in layout px)."""
    text = data.decode("utf-8")
    m = re.search(r"<svg\b[^>]*>", text)
    if m is None:
        raise RuntimeError("figure export: kaleido returned no <svg> element")
    tag = m.group(0)
    new = re.sub(r'\swidth="[^"]*"', f' width="{size.width}pt"', tag, count=1)
    new = re.sub(r'\sheight="[^"]*"', f' height="{size.height}pt"', new, count=1)
    if "viewBox" not in new:
        new = new[:-1] + f' viewBox="0 0 {size.width} {size.height}">'
    return (text[: m.start()] + new + text[m.end():]).encode("utf-8")


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _png_set_dpi(data: bytes, dpi: float) -> bytes:
    """Insert (or replace) the ``pHYs`` chunk so that viewers size the PNG at ``dpi``."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise RuntimeError("figure export: kaleido returned no PNG")
    ppm = int(round(dpi / 0.0254))
    phys = _png_chunk(b"pHYs", struct.pack(">IIB", ppm, ppm, 1))
    out, i, inserted = [data[:8]], 8, False
    while i < len(data):
        n = struct.unpack(">I", data[i:i + 4])[0]
        kind = data[i + 4:i + 8]
        chunk = data[i:i + 12 + n]
        i += 12 + n
        if kind == b"pHYs":
            continue
        out.append(chunk)
        if kind == b"IHDR" and not inserted:
            out.append(phys)
            inserted = True
    return b"".join(out)


def png_size(path_or_bytes) -> tuple[int, int, float | None]:
    """``(width, height, dpi or None)`` of a PNG file or bytes."""
    data = Path(path_or_bytes).read_bytes() if not isinstance(path_or_bytes, (bytes, bytearray)) else bytes(path_or_bytes)
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("path_or_bytes: is not a PNG")
    w, h = struct.unpack(">II", data[16:24])
    dpi = None
    i = 8
    while i < len(data):
        n = struct.unpack(">I", data[i:i + 4])[0]
        if data[i + 4:i + 8] == b"pHYs":
            x, _, unit = struct.unpack(">IIB", data[i + 8:i + 17])
            dpi = x * 0.0254 if unit == 1 else None
            break
        i += 12 + n
    return w, h, dpi


def pdf_text(path_or_bytes) -> str:
    """The text drawn in a PDF (for checks that labels made it into an export).

    Uses ``pdftotext`` when installed; otherwise a small reader for the PDFs Chromium (Skia) writes: the
    content streams' ``Tj``/``TJ`` strings mapped through each font's ``ToUnicode`` CMap. Words come out
    in drawing order, separated by spaces/newlines.
    """
    data = Path(path_or_bytes).read_bytes() if not isinstance(path_or_bytes, (bytes, bytearray)) else bytes(path_or_bytes)
    exe = shutil.which("pdftotext")
    if exe:
        import subprocess

        r = subprocess.run([exe, "-q", "-", "-"], input=data, capture_output=True, timeout=60)
        if r.returncode == 0:
            return unligature(r.stdout.decode("utf-8", "replace"))
    return _pdf_text_builtin(data)


def unligature(text: str) -> str:
    """Typographic ligatures (ﬁ, ﬂ, …) spelled out; nothing else changed (unlike NFKC, which maps ℓ to l)."""
    return text.translate(_LIGATURES)


def _pdf_objects(data: bytes) -> dict[int, tuple[bytes, bytes | None]]:
    """``{object number: (dictionary text, decoded stream or None)}``."""
    objs = {}
    for m in re.finditer(rb"(\d+) 0 obj\s*(<<.*?>>)\s*(stream\r?\n)?", data, re.S):
        stream = None
        if m.group(3):
            end = data.find(b"endstream", m.end())
            raw = data[m.end():end].rstrip(b"\r\n")
            try:
                stream = zlib.decompress(raw) if b"FlateDecode" in m.group(2) else raw
            except zlib.error:
                stream = None
        objs[int(m.group(1))] = (m.group(2), stream)
    return objs


def _parse_cmap(cmap: bytes) -> dict[int, str]:
    out = {}

    def uni(h: bytes) -> str:
        b = bytes.fromhex(h.decode())
        return b.decode("utf-16-be", "replace")

    for block in re.findall(rb"beginbfchar(.*?)endbfchar", cmap, re.S):
        for a, b in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
            out[int(a, 16)] = uni(b)
    for block in re.findall(rb"beginbfrange(.*?)endbfrange", cmap, re.S):
        for a, b, c in re.findall(rb"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
            start, stop, base = int(a, 16), int(b, 16), int(c, 16)
            for k in range(start, stop + 1):
                out[k] = chr(base + k - start)
    return out


_LIGATURES = str.maketrans({"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl",
                            "\ufb05": "st", "\ufb06": "st"})


def _pdf_text_builtin(data: bytes) -> str:
    objs = _pdf_objects(data)
    fonts: dict[bytes, dict[int, str]] = {}  # resource name -> cmap
    by_obj = {}
    for num, (d, _) in objs.items():
        m = re.search(rb"/ToUnicode (\d+) 0 R", d)
        if m and int(m.group(1)) in objs and objs[int(m.group(1))][1] is not None:
            by_obj[num] = _parse_cmap(objs[int(m.group(1))][1])
    for d, _ in objs.values():  # /Font << /F1 7 0 R ... >> in resource dictionaries
        for fm in re.finditer(rb"/Font\s*<<(.*?)>>", d, re.S):
            for name, num in re.findall(rb"/([\w.+-]+) (\d+) 0 R", fm.group(1)):
                if int(num) in by_obj:
                    fonts[name] = by_obj[int(num)]
    default = next(iter(by_obj.values()), {})
    words = []
    for d, s in objs.values():
        if s is None or (b"Tj" not in s and b"TJ" not in s):
            continue
        cmap = default
        for tok in re.finditer(rb"/([\w.+-]+)\s+[\d.]+\s+Tf|<([0-9A-Fa-f]*)>\s*Tj|\[(.*?)\]\s*TJ|(BT)|(ET)", s, re.S):
            if tok.group(1):
                cmap = fonts.get(tok.group(1), default)
            elif tok.group(2) is not None or tok.group(3) is not None:
                hexes = [tok.group(2)] if tok.group(2) is not None else re.findall(rb"<([0-9A-Fa-f]*)>", tok.group(3))
                for h in hexes:
                    words.append("".join(cmap.get(int(h[i:i + 4], 16), "\ufffd") for i in range(0, len(h), 4)))
            elif tok.group(5):
                words.append("\n")
    text = "".join(words).translate(_LIGATURES)  # Skia maps ligature glyphs to U+FB00…
    return re.sub(r" *\n *", "\n", text).strip()


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


def _versions() -> dict:
    import importlib.metadata as md

    from . import __version__

    out = {"workbench": __version__}
    for pkg in ("plotly", "kaleido", "choreographer"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:  # pragma: no cover
            out[pkg] = None
    return out


def _jsonable(v):
    """A JSON-safe copy (numpy/torch scalars and arrays, tuples, paths, NaN → None)."""
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        return _jsonable(v.tolist())
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        return _jsonable(v.item())
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    return repr(v)


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


def _fallback_frame(fig) -> pd.DataFrame:
    """Tidy data of all traces (used until ``plots.figure_frame`` exists): one row per point with
    ``trace, name, type`` and the trace's array columns (``x, y, z`` flattened for heatmaps, ``text``,
    ``customdata``)."""
    import numpy as np

    frames = []
    for i, tr in enumerate(fig.data):
        d = tr.to_plotly_json()
        cols: dict[str, list] = {}
        z = d.get("z")
        if z is not None and np.ndim(z) == 2:
            z = np.asarray(z)
            ys = d.get("y") if d.get("y") is not None else list(range(z.shape[0]))
            xs = d.get("x") if d.get("x") is not None else list(range(z.shape[1]))
            cols["y"] = [ys[r] for r in range(z.shape[0]) for _ in range(z.shape[1])]
            cols["x"] = [xs[c] for _ in range(z.shape[0]) for c in range(z.shape[1])]
            cols["z"] = z.reshape(-1).tolist()
        else:
            for k in ("x", "y", "z", "text", "customdata", "values", "labels", "r", "theta"):
                v = d.get(k)
                if v is not None and not isinstance(v, (str, bytes)) and np.ndim(v) >= 1:
                    arr = np.asarray(v, dtype=object)
                    cols[k] = [x if np.ndim(x) == 0 else json.dumps(_jsonable(x)) for x in arr.tolist()] \
                        if arr.ndim == 1 else [json.dumps(_jsonable(x)) for x in arr.tolist()]
        if d.get("type") == "table":
            cells = (d.get("cells") or {}).get("values") or []
            header = (d.get("header") or {}).get("values") or [f"col{j}" for j in range(len(cells))]
            cols = {str(h): list(c) for h, c in zip(header, cells)}
        n = max((len(v) for v in cols.values()), default=0)
        cols = {k: list(v) + [None] * (n - len(v)) for k, v in cols.items()}
        frames.append(pd.DataFrame({"trace": [i] * n, "name": [d.get("name")] * n, "type": [d.get("type")] * n,
                                    **cols}))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["trace", "name", "type"])


def figure_data(fig) -> pd.DataFrame:
    """The plotted data as a tidy frame: ``workbench.plots.figure_frame(fig)`` when it exists, else a
    built-in flattening of the traces."""
    from . import plots

    ff = getattr(plots, "figure_frame", None)
    if not callable(ff):
        return _fallback_frame(fig)
    try:
        return ff(fig)
    except (ValueError, TypeError) as e:  # e.g. a hand-made trace with a shape figure_frame does not know
        import warnings

        warnings.warn(f"plots.figure_frame failed ({type(e).__name__}: {e}); the CSV uses export's own "
                      "flattening of the traces", RuntimeWarning, stacklevel=3)
        return _fallback_frame(fig)


# ----------------------------------------------------------------------------- atomic writes
def _commit(files: dict[Path, bytes]) -> list[Path]:
    """Write every ``path: bytes`` to a temp file beside it, then ``os.replace`` all; on an error the
    temp files and any target this call created are removed (targets that existed are overwritten
    only once every temp file is written)."""
    tmps: dict[Path, str] = {}
    created: list[Path] = []
    try:
        for path, data in files.items():
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            tmps[path] = tmp
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
        for path, tmp in tmps.items():
            existed = path.exists()
            os.replace(tmp, path)
            if not existed:
                created.append(path)
    except BaseException:
        for tmp in tmps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
        for p in created:
            if p.exists():
                p.unlink()
        raise
    return list(files)


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
    if isinstance(width, (str, int, float)) and not isinstance(width, bool):
        return [width]
    if isinstance(width, (list, tuple)) and width:
        return list(width)
    raise ValueError(f"width: must be 'single', 'double', a number of px > 0, or a non-empty list of these, "
                     f"got {width!r}")


def export(fig, path, *, width="single", formats: Sequence[str] = FORMATS, params: Mapping | None = None,
           data: pd.DataFrame | None = None, scale: float = DEFAULT_SCALE, height: float | None = None,
           aspect: float | None = None, font_size="auto", title: bool = True, prompt=None,
           prompt_hash: str | None = None, model_id: str | None = None, csv: bool = True,
           sidecar: bool = True) -> list[Path]:
    """Export one figure for a paper; returns the paths written (figure files, then ``.json``, ``.csv``).

    Args:
        fig: a plotly ``go.Figure`` (or ``FigureWidget``); its ``layout.meta`` goes into the sidecar.
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
        title: keep the figure title (``False``: drop it, for a caption in the paper instead).
        prompt, prompt_hash: the prompt (hashed with :func:`prompt_hash`) or its hash, for the sidecar;
            default ``meta["prompt_hash"]`` when the figure carries one.
        model_id: default ``meta["model_id"]`` (or ``params["model_id"]``).
        csv, sidecar: write the ``.csv`` / ``.json`` files.

    Raises:
        ValueError: unknown format or width preset, width/height/scale ≤ 0, a bad path or fig.
        RuntimeError: no Chromium, or kaleido failed (nothing is written then).
    """
    import plotly.graph_objects as go

    from plotly.basedatatypes import BaseFigure

    if isinstance(fig, BaseFigure) and not isinstance(fig, go.Figure):  # a FigureWidget
        fig = go.Figure(fig)
    if not isinstance(fig, go.Figure):
        raise ValueError(f"fig: must be a plotly go.Figure or FigureWidget, got {type(fig).__name__}")
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
    if not stem or not _STEM_OK.match(stem):
        raise ValueError(f"path: the file stem must be letters, digits, '_', '-', '+' or '.', got {stem!r}")
    folder = p.parent
    folder.mkdir(parents=True, exist_ok=True)

    meta = fig.layout.meta
    meta = dict(meta) if isinstance(meta, Mapping) else ({"meta": meta} if meta is not None else {})
    params = dict(params or {})
    if prompt is not None:
        ph = _hash_prompt(prompt)
    else:
        ph = prompt_hash if prompt_hash is not None else meta.get("prompt_hash", params.get("prompt_hash"))
    import copy

    fig_dict = fig.to_dict()
    fig_dict.get("layout", {}).pop("meta", None)  # not drawn; keeps the page small
    if not title:
        fig_dict.get("layout", {}).pop("title", None)
        fig_dict.setdefault("layout", {})["title"] = {"text": ""}
    files: dict[Path, bytes] = {}
    fonts = []
    for size in sizes:
        base = stem if len(sizes) == 1 else f"{stem}-{size.tag}"
        d = copy.deepcopy(fig_dict)
        font, ratio = _paper_fonts(d, size, font_size)
        fonts.append({"base_font_pt": font, "font_ratio": round(ratio, 4)})
        for fmt, blob in _render_all(d, fmts, size).items():
            files[folder / f"{base}.{fmt}"] = blob
    if csv:
        frame = data if data is not None else figure_data(fig)
        files[folder / f"{stem}.csv"] = frame.to_csv(index=False).encode("utf-8")
    if sidecar:
        side = {
            "figure": meta.get("figure"),
            "title": _title(fig),
            "model_id": model_id or meta.get("model_id") or params.get("model_id"),
            "prompt_hash": ph,
            "meta": meta,
            "params": params,
            "sizes": [{**s.to_dict(), **f} for s, f in zip(sizes, fonts)],
            "formats": list(fmts),
            "files": sorted(f.name for f in files if f.suffix != ".json") + [f"{stem}.json"],
            "versions": _versions(),
            "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        files[folder / f"{stem}.json"] = (json.dumps(_jsonable(side), indent=2, ensure_ascii=False) + "\n").encode()
    return _commit(files)


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
        from tqdm.auto import tqdm

        items = tqdm(items, desc="export", unit="fig")
    for name, fig in items:
        k = dict(kw)
        if name in widths:
            k["width"] = widths[name]
        out[name] = export(fig, folder / name, **k)
    return out
