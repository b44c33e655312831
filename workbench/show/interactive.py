"""A panel as one self-contained, offline HTML file in which its sliders still work.

:func:`export_interactive` samples the grid of one or two of a panel's sliders (each at its own step, at most
``points`` values a slider, both ends included; at most :data:`MAX_STATES` states in all), computes every state's
figures and status line through the panel's own figure path (:meth:`Panel.figures_at`, the code a slider move
runs), and writes

- ``stem.html``: plotly.js inlined (``plotly.offline.get_plotlyjs()``), the states as JSON (numpy arrays as
  plotly's base64 typed arrays; every figure part that repeats across states, e.g. the template or a figure that
  does not follow a slider, stored once), plain ``<input type="range">`` controls over the grid and a small script
  that swaps the figures with ``Plotly.react`` on input. Nothing is fetched: no ``src``/``href`` to another file or
  host, so it opens from a disk, an e-mail or a paper's supplementary material without a network;
- ``stem.json``: the sidecar (panel, model, prompt hash, the fixed controls, the grid, versions, size), also
  embedded in the page (``<script id="wb-sidecar" type="application/json">``).

**Size bound.** The page holds plotly.js (about 4.8 MB) plus the states; it is refused above ``max_mb`` MB
(default and ceiling :data:`MAX_MB` = 50 MB) with its size, before anything is written. A state whose parameters
the analysis refuses is kept as a failed state: the page shows the refusal in the status line and no figure.
The page opens at the grid values nearest the panel's own; figures are laid out at the panel's live width (the
screen layout of :func:`~workbench.show.widgets.base.live_layout`).
"""
from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
import re
from pathlib import Path

import ipywidgets as W
import plotly.io as pio
import plotly.offline as po

from workbench.checks import Bool, InstanceOf, Interval, Seq, optional
from workbench.constraint_types import check_args
from workbench.constraints import register_all
from workbench.show.export import prompt_hash, versions
from workbench.show.token_view import TokenView
from workbench.util import atomic_write_files, jsonable

__all__ = ["export_interactive", "slider_grid", "MAX_STATES", "MAX_POINTS", "MAX_MB"]

MAX_POINTS = 40  # values a slider at most (its own step where that gives fewer)
MAX_STATES = 400  # states of the whole grid at most: the export computes every one (~50 ms each on CPU)
MAX_MB = 50.0  # the page's size at most (MB = 10^6 bytes)
SLIDER_TYPES = (W.IntSlider, W.FloatSlider, W.FloatLogSlider)
_STEM_OK = re.compile(r"^[\w.+-]+$")


def _tidy(x: float) -> float:
    """A grid value without float noise (0.35000000000000003 → 0.35)."""
    return float(f"{x:.12g}")


def slider_grid(w: W.Widget, points: int) -> list:
    """The values of slider ``w`` in the export: every step from ``min`` to ``max`` where that is at most ``points``
    values, else ``points`` of those steps evenly spread, both ends included (a log slider steps its exponent)."""
    n = int(math.floor((w.max - w.min) / w.step + 1e-9)) + 1
    idx = list(range(n)) if n <= points else sorted({round(i * (n - 1) / (points - 1)) for i in range(points)})
    if isinstance(w, W.IntSlider):
        return [int(w.min + i * w.step) for i in idx]
    vals = [w.min + i * w.step for i in idx]
    if idx[-1] == n - 1:
        vals[-1] = min(vals[-1], w.max)
    if isinstance(w, W.FloatLogSlider):
        return [_tidy(w.base ** v) for v in vals]
    return [_tidy(v) for v in vals]


def _label(w: W.Widget, name: str) -> str:
    return str(getattr(w, "description", "") or name)


def _fmt(v) -> str:
    return str(v) if isinstance(v, int) else f"{v:.3g}"


class _Pool:
    """Every distinct JSON part once; a state refers to its parts by index."""

    def __init__(self):
        self.items: list[str] = []
        self._index: dict[str, int] = {}

    def add(self, text: str) -> int:
        i = self._index.get(text)
        if i is None:
            i = self._index[text] = len(self.items)
            self.items.append(text)
        return i


def _figure_parts(fig, pool: _Pool) -> dict:
    """One figure of a state as indices into ``pool``: a plotly figure's traces, layout and template; a token
    view's HTML."""
    if isinstance(fig, TokenView):
        return {"html": pool.add(json.dumps(fig.html(title=True)))}
    d = json.loads(pio.to_json(fig, validate=False))  # numpy arrays → base64 typed arrays
    lay = d.get("layout", {})
    lay.pop("meta", None)  # not drawn (the sidecar has the parameters)
    template = lay.pop("template", {})
    return {"data": pool.add(json.dumps(d.get("data", []), separators=(",", ":"))),
            "layout": pool.add(json.dumps(lay, separators=(",", ":"))),
            "template": pool.add(json.dumps(template, separators=(",", ":")))}


def _script_json(obj) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>``, no ``<!--``)."""
    text = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c")


_JS = r"""
(function () {
  const P = JSON.parse(document.getElementById('wb-pool').textContent);
  const S = JSON.parse(document.getElementById('wb-states').textContent);
  const inputs = Array.from(document.querySelectorAll('input.wb-slider'));
  const status = document.getElementById('wb-status');
  const boxes = {};
  for (const el of document.querySelectorAll('.wb-figure')) boxes[el.dataset.name] = el;
  function clone(i) { return structuredClone(P[i]); }
  function show(k) {
    const st = S.states[k];
    document.body.dataset.state = String(k);
    status.innerHTML = st.error === null ? P[st.status] : '';
    if (st.error !== null) { const e = document.createElement('span'); e.className = 'wb-error';
      e.textContent = 'not computed at this setting: ' + st.error; status.appendChild(e); }
    for (const [name, el] of Object.entries(boxes)) {
      const f = st.figs === null ? undefined : st.figs[name];
      el.style.display = f === undefined ? 'none' : '';
      if (f === undefined) continue;
      if ('html' in f) { el.innerHTML = P[f.html]; continue; }
      const layout = clone(f.layout); layout.template = clone(f.template);
      Plotly.react(el, clone(f.data), layout, {displaylogo: false, responsive: false});
    }
  }
  function current() {
    let k = 0;
    inputs.forEach((inp, j) => { k += Number(inp.value) * S.strides[j];
      inp.nextElementSibling.textContent = S.labels[j][Number(inp.value)]; });
    return k;
  }
  for (const inp of inputs) inp.addEventListener('input', () => show(current()));
  show(current());
})();
"""


def _page(title: str, sliders: list[dict], names: list[str], pool: _Pool, states: dict, sidecar: dict) -> str:
    rows = "".join(
        f'<div class="wb-row"><label for="wb-s{j}">{html.escape(s["label"])}</label>'
        f'<input type="range" class="wb-slider" id="wb-s{j}" data-name="{html.escape(s["name"])}" min="0" '
        f'max="{len(s["values"]) - 1}" step="1" value="{s["start"]}"><output>{html.escape(s["labels"][s["start"]])}'
        f"</output></div>" for j, s in enumerate(sliders))
    figs = "".join(f'<div class="wb-figure" data-name="{html.escape(n)}"></div>' for n in names)
    pool_json = "[" + ",".join(pool.items) + "]"
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>" + html.escape(title) + "</title><style>"
            "body{font-family:sans-serif;margin:12px} .wb-row{display:flex;align-items:center;gap:8px;margin:4px 0}"
            " .wb-row label{width:200px} .wb-row input{width:320px} #wb-status{margin:8px 0;font-size:13px}"
            " .wb-error{color:#D55E00} .wb-figures{display:flex;flex-flow:row wrap}</style>"
            "<script>" + po.get_plotlyjs() + "</script></head><body>"
            f"<h3>{html.escape(title)}</h3>{rows}<div id=\"wb-status\"></div>"
            f"<div class=\"wb-figures\">{figs}</div>"
            "<script type=\"application/json\" id=\"wb-sidecar\">" + _script_json(sidecar) + "</script>"
            "<script type=\"application/json\" id=\"wb-pool\">" + _script_json(pool_json) + "</script>"
            "<script type=\"application/json\" id=\"wb-states\">" + _script_json(states) + "</script>"
            "<script>" + _JS + "</script></body></html>")


def export_interactive(panel, path, *, sliders=None, points: int = 21, max_mb: float = MAX_MB,
                       sidecar: bool = True) -> list[Path]:
    """Write ``panel`` as one offline HTML page whose sliders still work, and its sidecar; returns the paths
    (``stem.html``, then ``stem.json``).

    Args:
        panel: a :class:`~workbench.show.widgets.base.Panel` whose figures follow its sliders without a model
            run (the analytic panels, the token view, the counterexample; not a panel with a *run* button).
        path: ``folder/stem`` (a ``.html`` suffix is dropped); the folder is created.
        sliders: names of the panel's shown sliders to move in the page (one or two); default its first one. The
            other controls stay at their current values (in the sidecar as ``fixed``).
        points: the most values a slider takes, in ``[2, 40]``: its own step where that gives fewer, else this many
            of its steps evenly spread, both ends included. The grid has at most :data:`MAX_STATES` states.
        max_mb: the size bound in MB, in ``(0, 50]``: a page over it is refused with its size, nothing written.
        sidecar: write ``stem.json`` beside the page (it is embedded in the page either way).

    Raises:
        ValueError: a bad argument; a control that is not a slider; a grid over :data:`MAX_STATES` states; a page
            over ``max_mb``; a panel whose figures wait for a model run.
    """
    check_args(INTERACTIVE_CHECKS, locals())
    live_only = getattr(panel, "live_only", None)
    if live_only:
        raise ValueError(f"panel: {type(panel).__name__} cannot be exported with working sliders: {live_only}")
    if not callable(getattr(panel, "figures_at", None)):
        raise ValueError(f"panel: must be a workbench Panel, got {type(panel).__name__}")
    # a hidden slider does not apply at the panel's other settings (e.g. a page slider with one page)
    movable = [n for n, w in panel.controls.items() if isinstance(w, SLIDER_TYPES) and w.layout.display != "none"]
    if not movable:
        raise ValueError(f"panel: {type(panel).__name__} has no slider to move")
    names = list(movable[:1] if sliders is None else sliders)
    for n in names:
        if n not in movable:
            raise ValueError(f"sliders: {n!r} is not a slider of {type(panel).__name__}; its sliders: {movable}")
    if len(names) > 2:
        raise ValueError(f"sliders: at most 2 sliders move in the page, got {len(names)}: {names}")
    p = Path(path)
    if p.suffix.lower() in (".html", ".json"):
        p = p.with_suffix("")
    if not _STEM_OK.match(p.name) or p.name.startswith("."):
        raise ValueError(f"path: must end with a file stem of letters, digits, '_', '-', '+' or '.' that does not "
                         f"start with '.', got {os.fspath(path)!r}")
    grids = {n: slider_grid(panel.controls[n], points) for n in names}
    n_states = math.prod(len(g) for g in grids.values())
    if n_states > MAX_STATES:
        shape = " × ".join(f"{len(g)} ({n})" for n, g in grids.items())
        raise ValueError(f"sliders: the grid has {n_states} states ({shape}), over the cap of {MAX_STATES}; lower "
                         f"points (now {points}) or move fewer sliders")
    start = panel.params()
    strides, s = [], 1
    for n in reversed(names):
        strides.insert(0, s)
        s *= len(grids[n])

    pool, states, fig_names = _Pool(), [], []
    actual = {n: [None] * len(g) for n, g in grids.items()}  # the values the sliders took (a widget may snap)
    for k in range(n_states):
        idx = [(k // st) % len(grids[n]) for n, st in zip(names, strides)]
        values = {n: grids[n][i] for n, i in zip(names, idx)}
        try:
            figs, status, took = panel.figures_at(**values)
        except ValueError as e:  # a combination the analysis refuses: a failed state, said so in the page
            states.append({"figs": None, "status": None, "error": str(e)})
            continue
        for n, i in zip(names, idx):
            actual[n][i] = took[n] if isinstance(took[n], int) else _tidy(took[n])
        fig_names += [n for n in figs if n not in fig_names]
        states.append({"figs": {n: _figure_parts(f, pool) for n, f in figs.items()},
                       "status": pool.add(json.dumps(status)), "error": None})
    if all(st["error"] is not None for st in states):
        raise ValueError(f"panel: no state of the grid could be computed; the first refusal: {states[0]['error']}")
    values = {n: [a if a is not None else g for a, g in zip(actual[n], grids[n])] for n in names}
    spec = [{"name": n, "label": _label(panel.controls[n], n), "values": values[n],
             "labels": [_fmt(v) for v in values[n]],
             "start": min(range(len(values[n])), key=lambda i: abs(values[n][i] - start[n]))} for n in names]

    cap = getattr(panel, "capture", None)
    spans = getattr(cap, "spans", None)
    side = {
        "panel": type(panel).__name__, "title": getattr(panel, "title", None),
        "model_id": getattr(cap, "model_id", None), "prompt_hash": prompt_hash(spans) if spans is not None else None,
        "fixed": jsonable({n: v for n, v in start.items() if n not in names}),
        "grid": {n: values[n] for n in names}, "n_states": n_states,
        "failed_states": sum(st["error"] is not None for st in states),
        "points": points, "max_states": MAX_STATES, "size_bound_mb": max_mb,
        "figures": fig_names, "layout_width_px": getattr(panel, "live_width", None),
        "versions": versions(), "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    folder, stem = p.parent, p.name
    side["files"] = [f"{stem}.html"] + [f"{stem}.json"] * sidecar
    page = _page(str(getattr(panel, "title", type(panel).__name__)), spec, fig_names, pool,
                 {"states": states, "strides": strides, "labels": [s["labels"] for s in spec]}, side)
    size = len(page.encode("utf-8"))
    if size > max_mb * 1e6:
        raise ValueError(f"max_mb: the page would be {size / 1e6:.1f} MB ({n_states} states), over the bound of "
                         f"{max_mb:g} MB; lower points (now {points}) or move fewer sliders")
    side["html_bytes"] = size  # the sidecar beside the page knows the page's size (the embedded one cannot)
    files = {folder / f"{stem}.html": page.encode("utf-8")}
    if sidecar:
        files[folder / f"{stem}.json"] = (json.dumps(jsonable(side), indent=2, ensure_ascii=False) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    return atomic_write_files(files)


INTERACTIVE_CHECKS = register_all("interactive", {
    "path": InstanceOf(lambda x: isinstance(x, (str, os.PathLike)), "a path folder/stem", nonempty=True),
    "sliders": optional(Seq(InstanceOf(str, "a slider's name", examples=("zeta",), nonempty=True), nonempty=True,
                            distinct=True)),
    "points": Interval("int", 2, 40, note="values a slider at most"),
    "max_mb": Interval("real", 0.0, 50.0, closed="right", note="the page's size bound in MB"),
    "sidecar": Bool()}, __name__)
"""The constraint of every argument of :func:`export_interactive` but the panel (registered as
``interactive.<name>``)."""
