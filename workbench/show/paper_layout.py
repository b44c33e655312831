"""Layout rules of the paper template, applied by :func:`workbench.show.export.export` at each export size.

At a column width (240 pt single, 504 pt double) a screen layout breaks: a long title is clipped and
runs into a legend above the plot, long axis titles run off the canvas, a vertical legend eats a third of
a single column. The rules, on a figure dict whose fonts are already scaled to the paper
(``export._paper_fonts``):

- **Title**: dropped by default (the caption lives in the paper), the top margin shrinks to what the
  top tick label needs. Kept (``title=True``): wrapped to the width and placed in the container above
  everything else, its height added to the top margin.
- **Legend**: above the plot area, horizontal, left-aligned (plotly wraps its entries to the plot's width, what
  the colour bars leave: ``plot_room``), so it never meets the x-axis titles below nor the y-axis titles at the
  side, nor a colour bar on the right.
- **Panels side by side**: the gap left of the right one holds its y labels, or they go to its right edge.
- **Ticks**: at most one tick label per ~2 font sizes of a y axis or colour bar and per ~5 font sizes of an
  x axis (``nticks``; axes with explicit ticks keep theirs), so that small panels of a multi-panel figure
  do not stack their labels; colour-bar titles stand at the bar's side, not on its top tick.
- **Axis titles**: wrapped at spaces to the length of their axis (DejaVu Sans: a character is at most
  ~0.62 of the font size wide on average).
- **Annotations placed above the plot** (``yref="paper"``, ``y ≥ 1``, ``yanchor="bottom"``, e.g. ``l*``)
  move just inside the top edge, where the legend cannot meet them.

- **Room for the plot** (paper rules): the plot areas span at least 55 % of the height and the legend at
  most 25 %; the title, legend and axis labels are fixed in pt, so the canvas grows until both hold (not when the
  caller fixes the height or the aspect). Legends of several rows get a fixed entry width, so that the rows
  reserved are the rows plotly draws.
- **No text under 7 pt** at a column preset: axis titles shrink to 7 pt at most, then wrap; a table whose
  columns do not fit at 7 pt is split into stacked tables that repeat its key columns (``trace.meta["keys"]``);
  log axes get full-size 1-2-5, 1-3 or decade ticks (plotly's in-between digits are drawn smaller).
- **Whole numbers**: no tick between the whole-number index coordinates of an auto-ticked axis (layers, positions: plotly
  put 0.5, 1.5 … on a 4-layer heatmap); ``nticks`` under twice the span makes plotly's step 1, 2, 5 … (``_whole_ticks``).

A figure asks for its own height at each preset through ``layout.meta["aspect"]`` (``{"single": h/w,
"double": h/w}``; multi-panel figures are taller than the default 0.75 / 0.45): see
:func:`workbench.show.export.resolve_size`. Checked by ``tests/test_figure_layout.py`` (every text box of
every figure function's SVG, at both widths: no two overlap, none leaves the canvas, title, legend and
axis titles stay off the plot areas).
"""
from __future__ import annotations

import base64
import math
import re

import numpy as np
import plotly.io as pio

from workbench.show.plot_room import colorbar_px, column_gaps, legend_names

__all__ = ["paper_layout", "wrap_text", "CHAR_WIDTH", "PLOT_SHARE", "LEGEND_SHARE", "MIN_PT"]

CHAR_WIDTH = 0.62  # average advance of a DejaVu Sans character, in font sizes (generous: ~0.55 measured)
TITLE_CHAR = 0.7  # ... of a title line: a browser's sans-serif ran to 0.65 on a live title (past its canvas)
LEGEND_CHAR = 0.58  # ... of a legend entry's text (0.45-0.59 measured on this template's labels)
PLOT_SHARE = 0.55  # the plot areas span at least this share of the height ...
LEGEND_SHARE = 0.25  # ... the legend at most this share (paper rules) ...
MIN_PT = 7.0  # ... and no text is smaller at a column preset (the SVG's user unit is the point)
_SLACK = 0.05  # the estimates of the margins plotly's automargin settles on are not exact: aim inside the rules


def wrap_text(text: str, max_px: float, font_px: float, char: float = CHAR_WIDTH) -> str:
    """``text`` with ``<br>`` at spaces so that no line is wider than ``max_px`` (a word longer than a
    line stays whole; a character counted ``char`` font sizes wide); existing ``<br>`` are kept. Tags
    (``<sup>``, ``<span …>``) count as zero width."""
    if not text or max_px <= 0:
        return text
    limit = max(4, int(max_px / (char * font_px)))
    out = []
    for para in re.split(r"<br\s*/?>", text):
        line, n = [], 0
        for word in para.split(" "):
            w = len(re.sub(r"<[^>]*>", "", word))
            if line and n + 1 + w > limit:
                out.append(" ".join(line))
                line, n = [word], w
            else:
                n += w + (1 if line else 0)
                line.append(word)
        out.append(" ".join(line))
    return "<br>".join(out)


def _font(d: dict | None, default: float) -> float:
    s = (d or {}).get("size")
    return float(s) if isinstance(s, (int, float)) else default


_NAMED: dict[str, dict] = {}


def _tmpl(lay: dict) -> dict:
    """The template's layout (a draft names its template, e.g. ``"workbench"``: looked up in plotly's registry)."""
    t = lay.get("template")
    if isinstance(t, str):
        if t not in _NAMED:
            _NAMED[t] = pio.templates[t].layout.to_plotly_json()
        return _NAMED[t]
    return (t or {}).get("layout") or {}


def paper_layout(fig_dict: dict, width: int, height: int, *, preset: str | None, title: bool,
                 grow: bool = True, max_height: float | None = None) -> int:
    """Apply the paper rules (module docstring) to ``fig_dict`` in place, for a ``width`` × ``height`` px
    canvas at ``preset`` (``"single"``, ``"double"`` or ``None``). Returns the height to draw it at: ``height``,
    or more when ``grow`` and the plot areas would get less than :data:`PLOT_SHARE` of it or the legend more
    than :data:`LEGEND_SHARE` (the title, legend and axis labels are fixed in px: a taller canvas gives the
    plot the room), never more than ``max_height``. The title and the legend are placed (in fractions of the
    canvas) for that height: the figure must be drawn at it. At a column preset no font is left under
    :data:`MIN_PT`."""
    lay = fig_dict.setdefault("layout", {})
    tl = _tmpl(lay)
    base = _font(lay.get("font"), _font(tl.get("font"), 12.0))
    margin = lay.setdefault("margin", dict(tl.get("margin") or {"l": 80, "r": 80, "t": 100, "b": 80}))
    t_text = ((lay.get("title") or {}).get("text") or "") if isinstance(lay.get("title"), dict) else \
        (lay.get("title") or "")
    # ---- title
    if not title or not t_text:
        lay["title"] = {"text": ""}
        margin["t"] = round(base * 0.9, 1)
        top = 0.0
    else:
        tf = _font((lay.get("title") or {}).get("font"), _font((tl.get("title") or {}).get("font"), base * 1.17))
        text = wrap_text(t_text, width - 8, tf, TITLE_CHAR)
        lines = text.count("<br>") + 1
        top = lines * tf * 1.3 + 6
        # plotly centres a multi-line title block on its anchor: anchor the middle at half the block
        lay["title"] = {**lay["title"], "text": text, "x": 0, "xref": "container", "xanchor": "left",
                        "y": 1 - (top / 2) / height, "yref": "container", "yanchor": "middle",
                        "pad": {"l": 4, "t": 0, "b": 0}, "automargin": False}
        margin["t"] = round(top + base * 0.9, 1)
    # ---- legend: under the title (if any), above the plot area (as wide as the colour bars leave it), its rows
    # reserved in the top margin
    right = max(float(margin.get("r", 80)), colorbar_px(fig_dict, lay, tl, base))
    leg = lay.get("legend") if isinstance(lay.get("legend"), dict) else {}
    names = legend_names(fig_dict)
    leg_h = 0.0
    if names and lay.get("showlegend", True) is not False:
        lay["legend"] = leg
        lf = _font(leg.get("font"), _font((tl.get("legend") or {}).get("font"), base))
        # plotly wraps a horizontal legend at x = 0 to the plot area's width (its ``_maxWidth``): one row when every
        # entry (40 px of symbol and gap, then the text) fits, else columns as wide as the widest entry. For several
        # rows the column width is set here (``entrywidth``), so that the rows reserved are the rows drawn.
        room = max(1.0, width - float(margin.get("l", 80)) - right)
        text = [len(re.sub(r"<[^>]*>", "", n)) * LEGEND_CHAR * lf for n in names]
        if sum(text) + 45 * len(text) < room:
            rows = 1
            leg.pop("entrywidth", None)
        else:
            ew = math.ceil(max(text))
            rows = -(-len(names) // max(1, int((room + 5 - 1e-6) // (ew + 45))))  # plotly: n·(ew + 45) − 5 < room
            leg.update(entrywidth=ew, entrywidthmode="pixels")
        leg_h = rows * (max(lf * 1.3, 10) + 7.5) + 14  # plotly's legend box: ~19 px a row at 9 pt, and its padding
        leg.update(orientation="h", x=0, xanchor="left", xref="container", y=1 - top / height, yanchor="top",
                   yref="container", valign="middle", tracegroupgap=0, itemwidth=30)
        margin["t"] = round(top + leg_h + base * 0.9, 1)
    # ---- annotations above the plot move inside its top edge
    for a in lay.get("annotations") or []:
        if a.get("yref") == "paper" and isinstance(a.get("y"), (int, float)) and a["y"] >= 1 \
                and a.get("yanchor") == "bottom":
            a["y"], a["yanchor"] = 1, "top"
            a.setdefault("xshift", 3)
            if a.get("xanchor") in (None, "auto", "center"):
                a["xanchor"] = "left"
    # ---- axis titles wrap to their axis (x: to the width; then the height; then y)
    floor = MIN_PT if preset is not None else 0.0
    plot_w = max(1.0, width - float(margin.get("l", 80)) - right)
    for key, ax in list(lay.items()):
        if re.fullmatch(r"xaxis\d*", key) and isinstance(ax, dict):
            _fit_axis_title(key, ax, plot_w, tl, base, floor)
    if grow:
        height = _grown_height(lay, tl, height, base, float(margin.get("t", 100)), leg_h)
    plot_h = max(1.0, height - float(margin.get("t", 100)) - max(float(margin.get("b", 80)), base * 3.2))
    _row_gaps(lay, tl, plot_h, base)
    for key, ax in list(lay.items()):
        if re.fullmatch(r"yaxis\d*", key) and isinstance(ax, dict):
            _fit_axis_title(key, ax, plot_h, tl, base, floor)
    column_gaps(lay, plot_w, base)
    # ---- tables: fonts shrink until the columns fit the width (not under the floor: then split the columns)
    height = _fit_tables(fig_dict, plot_w, height, base, floor, grow)
    # ---- tick density and colour bars
    for key, ax in list(lay.items()):
        m = re.fullmatch(r"([xy])axis\d*", key)
        if not m or not isinstance(ax, dict):
            continue
        dom = ax.get("domain") or [0, 1]
        span = (dom[1] - dom[0]) * (plot_w if m.group(1) == "x" else plot_h)
        tick = _font(ax.get("tickfont"), _font((tl.get(m.group(1) + "axis") or {}).get("tickfont"), base * 0.85))
        _limit_ticks(ax, span, tick * (2.6 if m.group(1) == "y" else 5.5))
    bars = [v.get("colorbar") for k, v in lay.items() if re.fullmatch(r"coloraxis\d*", k) and isinstance(v, dict)]
    bars += [t.get("colorbar") for t in fig_dict.get("data") or [] if isinstance(t, dict)]
    for cb in bars:
        if not isinstance(cb, dict):
            continue
        frac = cb.get("len", 1) if cb.get("lenmode", "fraction") == "fraction" else cb.get("len", plot_h) / plot_h
        _limit_ticks(cb, frac * plot_h, _font(cb.get("tickfont"), base * 0.85) * 2.0)
        if isinstance(cb.get("title"), dict) and cb["title"].get("text"):
            cb["title"]["side"] = "right"
    _whole_ticks(fig_dict, lay, plot_w, plot_h)
    _log_ticks(fig_dict, lay)
    if floor:
        _floor_fonts(fig_dict, floor)
    height = int(round(min(height, max_height) if max_height else height))
    # the title and the legend hang from the top of the canvas by fixed px: their fractions at the final height (the
    # canvas may have grown above, or been capped; placed at the first height, a grown canvas put the title on the
    # legend and the legend on the plot)
    if title and t_text:
        lay["title"]["y"] = 1 - (top / 2) / height
    if leg_h:
        lay["legend"]["y"] = 1 - top / height
    return height


def _fit_axis_title(key: str, ax: dict, length: float, tl: dict, base: float, floor: float) -> None:
    """Fit the title of axis ``key`` to its length (``length`` px × its domain): smaller first (down to 75 % of its
    font, never under ``floor``), then wrapped at spaces."""
    if not isinstance(ax.get("title"), dict):
        return
    text = ax["title"].get("text")
    if not isinstance(text, str) or not text:
        return
    dom = ax.get("domain") or [0, 1]
    span = (dom[1] - dom[0]) * length
    tf = _font(ax["title"].get("font"), _font(((tl.get(key) or tl.get(key[0] + "axis") or {})
                                               .get("title") or {}).get("font"), base))
    ax["title"].setdefault("standoff", round(tf * 0.4, 1))  # plotly's default 15 px is for screens
    plain = len(re.sub(r"<[^>]*>", "", text))
    if "<br>" not in text and plain * CHAR_WIDTH * tf > span:  # smaller first, then wrap: plotly's automargin
        small = min(tf, max(tf * 0.75, floor, span / (plain * CHAR_WIDTH)))  # under-counts the extra lines
        ax["title"]["font"] = {**(ax["title"].get("font") or {}), "size": round(small, 2)}
        ax["title"]["text"] = wrap_text(text, span, small)
        if "<br>" in ax["title"]["text"]:
            ax["title"]["standoff"] = round(small * (0.4 + 1.2 * ax["title"]["text"].count("<br>")), 1)


def _bottom_px(lay: dict, base: float) -> float:
    """The px under the lowest plot area: the tick labels and (wrapped) titles of the x axes at the bottom."""
    ys = {k: v for k, v in lay.items() if re.fullmatch(r"yaxis\d*", k) and isinstance(v, dict)}
    low = min([(v.get("domain") or [0, 1])[0] for v in ys.values()] or [0])
    px = 0.0
    for k, xa in lay.items():
        if not re.fullmatch(r"xaxis\d*", k) or not isinstance(xa, dict) or xa.get("visible", True) is False:
            continue
        anchor = xa.get("anchor") or ("y" + k[5:])
        ya = ys.get("yaxis" + anchor[1:]) if isinstance(anchor, str) and anchor.startswith("y") else None
        if ya is not None and (ya.get("domain") or [0, 1])[0] > low + 1e-9:
            continue
        need = base * 0.85 * 1.4 + 8 if xa.get("showticklabels", True) is not False else 4.0
        t = xa["title"].get("text") if isinstance(xa.get("title"), dict) else None
        if t:
            tf = _font(xa["title"].get("font"), base)
            need += tf * 1.3 * (t.count("<br>") + 1) + float(xa["title"].get("standoff") or tf * 0.4) + 3
        px = max(px, need)
    return px


def _grown_height(lay: dict, tl: dict, height: float, base: float, top: float, leg_h: float) -> float:
    """The height at which the plot areas get :data:`PLOT_SHARE` of the canvas and the legend (``leg_h`` px) at
    most :data:`LEGEND_SHARE`: the top margin (``top`` px: title and legend) and the bottom labels stay as they are."""
    if not any(re.fullmatch(r"[xy]axis\d*", k) for k in lay):
        return height
    bottom = max(float((lay.get("margin") or {}).get("b", 80)), _bottom_px(lay, base))
    need = (top + bottom) / (1 - PLOT_SHARE - _SLACK)
    if leg_h:
        need = max(need, leg_h / (LEGEND_SHARE - _SLACK))
    return max(float(height), need)


def _fit_tables(fig_dict: dict, plot_w: float, height: float, base: float, floor: float, grow: bool) -> float:
    """Tables whose columns are wider than the plot: the fonts shrink until they fit; where that would go under
    ``floor``, the table is split into stacked tables of the key columns (``trace.meta["keys"]``, default 1) and
    as many further columns as fit at ``floor``. Returns the height (grown to hold the stacked parts)."""
    data = fig_dict.get("data") or []
    out, parts_h = [], []
    for t in data:
        if not isinstance(t, dict) or t.get("type") != "table" or not isinstance(t.get("columnwidth"), list):
            out.append(t)
            continue
        cells, header = t.setdefault("cells", {}), t.setdefault("header", {})
        cw = t["columnwidth"]
        cf = _font(cells.get("font"), base)

        def need(cols, f):
            return sum(cw[i] for i in cols) * CHAR_WIDTH * f + 12 * len(cols)

        if need(range(len(cw)), cf) <= plot_w:
            out.append(t)
            continue
        k = plot_w / need(range(len(cw)), cf)
        f = max(cf * k, floor)
        for part in (cells, header):
            part["font"] = {**(part.get("font") or {}), "size": round(_font(part.get("font"), base) * f / cf, 2)}
        if cf * k >= floor or not floor:
            out.append(t)
            continue
        keys = list(range(int((t.get("meta") or {}).get("keys", 1)) if isinstance(t.get("meta"), dict) else 1))
        groups, cur = [], []
        for i in range(len(keys), len(cw)):
            if cur and need(keys + cur + [i], f) > plot_w:
                groups.append(cur)
                cur = []
            cur.append(i)
        groups.append(cur)
        n_rows = max((len(v) for v in cells.get("values") or [] if isinstance(v, (list, tuple))), default=0)
        row_h = float(cells.get("height") or 20) * f / cf
        head_h = float(header.get("height") or 28)
        for g in groups:
            cols = keys + g
            p = {**t, "columnwidth": [cw[i] for i in cols],
                 "header": {**header, "values": _pick(header.get("values"), cols)},
                 "cells": {**cells, **{a: _pick(cells.get(a), cols) for a in ("values", "format", "align")
                                       if isinstance(cells.get(a), list)},
                           "height": round(row_h, 1)}}
            out.append(p)
            parts_h.append(head_h + n_rows * row_h + 6)
    if not parts_h:
        return height
    margin = (fig_dict.get("layout") or {}).get("margin") or {}
    chrome = float(margin.get("t", 0)) + float(margin.get("b", 0))
    total = sum(parts_h)
    height = max(height, total + chrome) if grow else height
    avail = max(1.0, height - chrome)
    top, tables = 1.0, [p for p in out if isinstance(p, dict) and p.get("type") == "table"]
    for p, h in zip(tables, parts_h):
        frac = h / max(total, avail)
        p["domain"] = {**(p.get("domain") or {}), "y": [max(0.0, top - frac), top]}
        top -= frac
    fig_dict["data"] = out
    return height


def _pick(values, cols):
    return [values[i] for i in cols if i < len(values)] if isinstance(values, list) else values


def _log_ticks(fig_dict: dict, lay: dict) -> None:
    """Auto-ticked log axes: plotly labels the 2s and 5s between decades in a reduced font (under 7 pt at a
    column). Instead: the densest of 1-2-5, 1-3 or decade steps over the data whose labels fit the axis (its
    ``nticks``), written at the full size."""
    for key, ax in list(lay.items()):
        m = re.fullmatch(r"([xy])axis(\d*)", key)
        if not m or not isinstance(ax, dict) or ax.get("type") != "log" or ax.get("dtick") is not None \
                or ax.get("tickvals") is not None or ax.get("tickmode") in ("array", "linear"):
            continue
        ref = m.group(1) + m.group(2)
        vals = []
        for t in fig_dict.get("data") or []:
            if isinstance(t, dict) and (t.get(m.group(1) + "axis") or m.group(1)) == ref:
                try:
                    v = _array(t.get(m.group(1)))
                except (TypeError, ValueError):
                    continue
                vals.append(v[np.isfinite(v) & (v > 0)])
        v = np.concatenate(vals) if vals else np.array([])
        if isinstance(ax.get("range"), (list, tuple)) and len(ax["range"]) == 2 and None not in ax["range"]:
            lo, hi = sorted(10.0 ** np.asarray(ax["range"], dtype=float))
        elif v.size:
            lo, hi = float(v.min()), float(v.max())
        else:
            continue
        e0, e1 = int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi)))
        n_max = max(3, int(ax.get("nticks") or 8))  # _limit_ticks' room for labels on this axis
        for mults in ((1, 2, 5), (1, 3), (1,)):  # the densest steps whose labels fit
            ticks = [mk * 10.0 ** e for e in range(e0, e1 + 1) for mk in mults
                     if lo * 0.999 <= mk * 10.0 ** e <= hi * 1.001]
            if 2 <= len(ticks) <= n_max:
                break
        if mults == (1,) or len(ticks) < 2:
            ax["dtick"] = 1
        else:
            ax.update(tickmode="array", tickvals=ticks, ticktext=[f"{x:g}" for x in ticks])


def _coords(t: dict, c: str) -> np.ndarray | None:
    """Trace ``t``'s index coordinates along ``c`` (``"x"`` or ``"y"``: a heatmap's both, a bar's categories, a line's
    x), plotly's defaults (``x0 + dx·i``) where it gives none; ``None`` where not numbers or not index coordinates."""
    kind = t.get("type") or "scatter"
    if not (kind == "heatmap" or kind in ("scatter", "scattergl") and c == "x"
            or kind == "bar" and c == ("y" if t.get("orientation") == "h" else "x")):
        return None
    try:
        if t.get(c) is not None:
            return _array(t[c])
        if kind == "heatmap":   # z: [rows, columns], a list, an array or plotly's typed-array spec
            z = t.get("z")
            shape = [int(k) for k in str(z["shape"]).split(",")] if isinstance(z, dict) else np.shape(z)
            n = shape[1 if c == "x" else 0] if len(shape) == 2 else None
        else:
            n = len(_array(t["y" if c == "x" else "x"]))
        return None if n is None else float(t.get(c + "0", 0)) + float(t.get("d" + c, 1)) * np.arange(n)
    except (TypeError, ValueError, IndexError, KeyError):
        return None


def _whole_ticks(fig_dict: dict, lay: dict, plot_w: float, plot_h: float) -> None:
    """Auto-ticked linear axes whose every index coordinate (:func:`_coords`) is a whole number: where their ``nticks``
    (or plotly's default for the axis length, 5-10) reaches twice the span, ``nticks`` under it, so that plotly's
    rough step (span / nticks) exceeds 0.5 and rounds to 1, 2, 5 … (ticks from 0): no tick at 0.5, 1.5 … A heatmap's
    cells widen the span by a step (counted: the estimate stays at or under plotly's); one value: ``nticks`` 1.
    Explicit ticks, and log, date and category axes, keep theirs."""
    refs = {t.get(c + "axis") or c for t in fig_dict.get("data") or [] if isinstance(t, dict) for c in "xy"}
    for key in {k for k in lay if re.fullmatch(r"[xy]axis\d*", k)} | {r[0] + "axis" + r[1:] for r in refs}:
        m, ax = re.fullmatch(r"([xy])axis(\d*)", key), lay.get(key, {})
        if not m or not isinstance(ax, dict) or ax.get("type") not in (None, "-", "linear") \
                or ax.get("tickmode") in ("array", "linear") or ax.get("dtick") is not None \
                or ax.get("tickvals") is not None:
            continue
        c, ref = m.group(1), m.group(1) + m.group(2)
        on = [t for t in fig_dict.get("data") or [] if isinstance(t, dict) and (t.get(c + "axis") or c) == ref]
        vals = [_coords(t, c) for t in on]
        if not on or any(v is None for v in vals):
            continue
        v = np.concatenate(vals)
        if not (v := v[np.isfinite(v)]).size or not np.all(v == np.round(v)):
            continue
        rng = ax.get("range")
        if isinstance(rng, (list, tuple)) and len(rng) == 2 and None not in rng:
            span = abs(float(rng[1]) - float(rng[0]))
        else:
            span = float(v.max() - v.min()) + (1.0 if any(t.get("type") == "heatmap" for t in on) else 0.0)
        dom = ax.get("domain") or [0, 1]
        length, per = (dom[1] - dom[0]) * (plot_w if c == "x" else plot_h), (80 if c == "x" else 40)
        n0 = ax["nticks"] if isinstance(ax.get("nticks"), int) and ax["nticks"] > 0 else min(max(length / per, 4), 9) + 1
        if n0 > (cap := max(1, math.ceil(2 * span) - 1)):
            lay.setdefault(key, ax)["nticks"] = cap


def _array(v) -> np.ndarray:
    """A trace's data as a flat float array: a list, an array, or plotly's typed-array spec (``{"dtype", "bdata"}``,
    what ``Figure.to_dict`` gives for numpy data)."""
    if isinstance(v, dict) and "bdata" in v:
        v = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v.get("dtype", "f8")))
    return np.asarray(v, dtype=float).ravel()


def _floor_fonts(node, floor: float) -> None:
    """Every font ``size`` under ``floor`` (keys ending in ``font``, any depth) raised to ``floor``, in place."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k.endswith("font") and isinstance(v, dict):
                s = v.get("size")
                if isinstance(s, (int, float)) and s < floor:
                    v["size"] = floor
                elif isinstance(s, list):
                    v["size"] = [max(x, floor) if isinstance(x, (int, float)) else x for x in s]
            _floor_fonts(v, floor)
    elif isinstance(node, list):
        for v in node:
            _floor_fonts(v, floor)


def _row_gaps(lay: dict, tl: dict, plot_h: float, base: float) -> None:
    """Widen the gaps between stacked panels until an x axis's tick labels and title fit between them
    (plotly's automargin only works at the canvas edges); panel heights keep their proportions."""
    ys = {k: v for k, v in lay.items() if re.fullmatch(r"yaxis\d*", k) and isinstance(v, dict)
          and isinstance(v.get("domain"), (list, tuple)) and v.get("overlaying") in (None, False)}
    bands = sorted({tuple(v["domain"]) for v in ys.values()}, key=lambda d: -d[1])
    if len(bands) < 2 or any(a[0] < b[1] - 1e-9 for a, b in zip(bands, bands[1:])):
        return  # one row, or panels side by side (overlapping bands): nothing stacked
    tick = base * 0.85

    def need(band) -> float:  # px below a band: its x axes' tick labels and titles, or else the half tick labels
        px = tick * 1.25          # of the y axes at the two facing edges (a 0 above a 1)
        for k, v in ys.items():
            if tuple(v["domain"]) != band:
                continue
            xa = lay.get("xaxis" + k[5:]) or {}
            if xa.get("showticklabels", True) is not False and xa.get("visible", True) is not False:
                px = max(px, tick * 1.4 + 8)
            t = (xa.get("title") or {}).get("text") if isinstance(xa.get("title"), dict) else None
            if t:
                tf = _font(xa["title"].get("font"), base)  # a wrapped title stands off by its extra lines too
                px = max(px, tick * 1.4 + 8 + tf * 1.3 * (t.count("<br>") + 1)
                         + float(xa["title"].get("standoff") or tf * 0.4) + 3)
        return px / plot_h

    gaps = [max(a[0] - b[1], need(a)) for a, b in zip(bands, bands[1:])]
    heights = [b[1] - b[0] for b in bands]
    scale = (1 - sum(gaps)) / sum(heights)
    if scale >= 1 - 1e-9 or scale <= 0.2:
        return
    new, top = {}, 1.0
    for i, (b, h) in enumerate(zip(bands, heights)):
        new[b] = [max(0.0, top - h * scale), top]
        top = new[b][0] - (gaps[i] if i < len(gaps) else 0)
    for k, v in lay.items():
        if re.fullmatch(r"yaxis\d*", k) and isinstance(v, dict) and isinstance(v.get("domain"), (list, tuple)) \
                and tuple(v["domain"]) in new:
            v["domain"] = new[tuple(v["domain"])]


def _limit_ticks(ax: dict, span_px: float, per_tick_px: float) -> None:
    """``nticks`` of an auto-ticked axis (or colour bar) so that its labels do not stack."""
    if ax.get("tickmode") in ("array", "linear") or ax.get("dtick") is not None or ax.get("tickvals") is not None:
        return
    n = max(2, int(span_px // max(per_tick_px, 1.0)))
    ax["nticks"] = min(int(ax["nticks"]), n) if isinstance(ax.get("nticks"), int) and ax["nticks"] > 0 else n
