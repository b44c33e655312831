"""The persistent kaleido server behind figure export: one Chromium per process, one tab per format.

Rendering uses kaleido with one persistent Chromium per process (:func:`ensure_server`, started on first
use, stopped at exit or by :func:`shutdown_server`); Debian's ``/usr/bin/chromium`` is found on ``PATH`` (or
set ``BROWSER_PATH``). MathJax is off (offline; use Unicode: ζ τ η Λ Δ). The server has one tab per format
and renders a figure's PDF, SVG and PNG at the same time (kaleido reloads a tab after every render, so one
after another they took ~1.2 s; together ~0.9 s, ``benchmarks/export.py``). Kaleido (an optional heavy
dependency) is imported inside the functions that use it.
"""
from __future__ import annotations

import atexit
import os
import queue
import re
import shutil
import struct
import sys
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from workbench.choices import EXPORT_FORMATS
from workbench.util import private_temp_dir

__all__ = ["FORMATS", "RENDER_TIMEOUT_S", "browser_path", "ensure_server", "shutdown_server", "server_running",
           "server_thread",
           "render_all", "RenderSize", "sandbox", "NO_SANDBOX_ENV"]

FORMATS = EXPORT_FORMATS  # ("pdf", "svg", "png")
EXPORT_TMP_PREFIX = "workbench-export-"  # kaleido's private folders in the system temp: <prefix><pid>-<random>
RENDER_TIMEOUT_S = 120.0
BROWSER_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CSS_PX_PER_INCH = 96.0  # Chromium's print resolution
PX_PER_INCH = 72.0  # layout pixels per inch (1 px = 1 pt)


class RenderSize(Protocol):
    """What a render needs to know of a size (``workbench.show.export.ExportSize`` is one)."""

    width: float
    height: float
    scale: float
    dpi: float


# ----------------------------------------------------------------------------- kaleido server
_LOCK = threading.RLock()
_STATE: dict = {"running": False, "atexit": False, "threads": []}


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


NO_SANDBOX_ENV = "WORKBENCH_NO_SANDBOX"  # "1": run Chromium without its sandbox (a container whose seccomp forbids it)
_USERNS_FILES = ("/proc/sys/kernel/unprivileged_userns_clone", "/proc/sys/user/max_user_namespaces")
_SAID: set[str] = set()


def sandbox(*, say: bool = True) -> tuple[bool, str | None]:
    """Whether Chromium can run inside its sandbox here: ``(True, None)``, or ``(False, why)`` as root (Chromium
    refuses its sandbox to root), without unprivileged user namespaces (the sandbox is built on them), or with
    ``$WORKBENCH_NO_SANDBOX=1``. ``say``: print ``why`` on stderr, once per process and reason, since an
    unsandboxed browser is a weaker boundary the user should know of (never a silent ``--no-sandbox``)."""
    why = None
    if os.environ.get(NO_SANDBOX_ENV, "") not in ("", "0"):
        why = f"${NO_SANDBOX_ENV} is set"
    elif hasattr(os, "geteuid") and os.geteuid() == 0:
        why = "this process runs as root, and Chromium refuses its sandbox to root (export as a normal user to have it)"
    else:
        for f in _USERNS_FILES:
            try:
                off = Path(f).read_text().strip() == "0"
            except OSError:
                continue
            if off:
                why = f"this kernel allows no unprivileged user namespaces ({f} is 0), on which the sandbox is built"
                break
    if why is not None and say and why not in _SAID:
        _SAID.add(why)
        print(f"figure export: Chromium runs without its sandbox: {why}", file=sys.stderr, flush=True)
    return why is None, why


def server_thread() -> threading.Thread | None:
    """The thread kaleido's sync server runs in (its Chromium lives as long as it does), or None when none was
    started here. kaleido says whether its server was opened, not whether its thread is still alive (a
    Chromium that died leaves a server that takes requests and never answers), so :func:`_start` notes the
    thread that ``kaleido.start_sync_server`` starts."""
    threads = _STATE.get("threads") or ()
    return next((t for t in threads if t.is_alive()), threads[0] if threads else None)


def server_running() -> bool:
    """Whether this process's persistent kaleido server is up."""
    with _LOCK:
        if not _STATE["running"]:
            return False
        t = server_thread()
        return bool(t is not None and t.is_alive())


def ensure_server(*, timeout_s: float = RENDER_TIMEOUT_S) -> None:
    """Start the persistent kaleido server (one Chromium per process) unless it runs; idempotent.

    Raises RuntimeError when no Chromium is found or it does not start within ``timeout_s``.
    """

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
        sandboxed, _ = sandbox()
        try:
            _start(sandboxed, timeout_s)
        except Exception as e:  # noqa: BLE001 - a sandbox this system cannot give: said, then started without
            if not sandboxed:
                raise
            print(f"figure export: Chromium did not start in its sandbox ({' '.join(str(e).split())[:200]}); "
                  f"running it without (set {NO_SANDBOX_ENV}=1 to skip the attempt)", file=sys.stderr, flush=True)
            _start(False, timeout_s)


def _start(sandboxed: bool, timeout_s: float) -> None:
    import kaleido

    # one tab per format: the formats of a figure render at the same time (kaleido reloads a tab after
    # each render, ~0.3 s, so three formats one after another took ~1.2 s)
    before = set(threading.enumerate())
    kaleido.start_sync_server(n=len(FORMATS), mathjax=False, timeout=timeout_s, silence_warnings=True,
                              enable_sandbox=sandboxed)
    _STATE["threads"] = [t for t in threading.enumerate() if t not in before]  # under _LOCK: kaleido's alone
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
        _STATE["threads"] = []
        kaleido.stop_sync_server(silence_warnings=True)  # a dead server thread is joined at once


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


def _opts(fmt: str, size: RenderSize) -> dict:
    """kaleido's options for ``fmt`` at ``size`` (see the module docstring for units)."""
    scale = {"png": size.scale, "pdf": CSS_PX_PER_INCH / PX_PER_INCH, "svg": 1.0}[fmt]
    return dict(format=fmt, width=size.width, height=size.height, scale=scale)


def _finish_format(fmt: str, data: bytes, size: RenderSize) -> bytes:
    if fmt == "png":
        return png_set_dpi(data, size.dpi)
    if fmt == "svg":
        return _svg_in_points(data, size)
    return data


def render_all(fig_dict: dict, fmts: Sequence[str], size: RenderSize) -> dict[str, bytes]:
    """Bytes of every format in ``fmts`` at ``size``, rendered at the same time in the server's tabs
    (kaleido writes them into a private temporary folder, read back and removed here)."""
    import kaleido

    if len(fmts) == 1:
        return {fmts[0]: _render(fig_dict, fmts[0], size)}
    ensure_server()
    with _LOCK, private_temp_dir(EXPORT_TMP_PREFIX) as tmp:  # a killed export's folder is swept by the next
        specs = [{"fig": fig_dict, "path": os.path.join(tmp, f"figure.{fmt}"), "opts": _opts(fmt, size)}
                 for fmt in fmts]
        _bounded(lambda: kaleido.write_fig_from_object_sync(specs, cancel_on_error=True),
                 "/".join(fmts), RENDER_TIMEOUT_S * len(fmts))
        return {fmt: _finish_format(fmt, Path(spec["path"]).read_bytes(), size) for fmt, spec in zip(fmts, specs)}


def _render(fig_dict: dict, fmt: str, size: RenderSize) -> bytes:
    """Bytes of ``fmt`` at ``size`` (see the module docstring for units)."""
    if fmt not in FORMATS:
        raise ValueError(f"formats: must be among {FORMATS}, got {fmt!r}")  # pragma: no cover - checked before
    ensure_server()
    with _LOCK:
        return _finish_format(fmt, _call(fig_dict, _opts(fmt, size), timeout_s=RENDER_TIMEOUT_S), size)



# ----------------------------------------------------------------------------- format details
def _svg_in_points(data: bytes, size: RenderSize) -> bytes:
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


def png_set_dpi(data: bytes, dpi: float) -> bytes:
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


