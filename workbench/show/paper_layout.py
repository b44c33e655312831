"""Layout rules of the paper template, applied by :func:`workbench.show.export.export` at each export size.

At a column width (240 pt single, 504 pt double) a screen layout breaks: a long title is clipped and
runs into a legend above the plot, long axis titles run off the canvas, a vertical legend eats a third of
a single column. The rules, on a figure dict whose fonts are already scaled to the paper
(``export._paper_fonts``):

- **Title**: dropped by default (the caption lives in the paper), the top margin shrinks to what the
  top tick label needs. Kept (``title=True``): wrapped to the width and placed in the container above
  everything else, its height added to the top margin.
- **Legend**: above the plot area, horizontal, left-aligned (plotly wraps its entries to the width
  and pushes the top margin), so it never meets the x-axis titles below nor the y-axis titles at the
  side, nor a colour bar on the right.
- **Ticks**: at most one tick label per ~2 font sizes of a y axis or colour bar and per ~5 font sizes of an
  x axis (``nticks``; axes with explicit ticks keep theirs), so that small panels of a multi-panel figure
  do not stack their labels; colour-bar titles stand at the bar's side, not on its top tick.
- **Axis titles**: wrapped at spaces to the length of their axis (DejaVu Sans: a character is at most
  ~0.62 of the font size wide on average).
- **Annotations placed above the plot** (``yref="paper"``, ``y ≥ 1``, ``yanchor="bottom"``, e.g. ``l*``)
  move just inside the top edge, where the legend cannot meet them.

A figure asks for its own height at each preset through ``layout.meta["aspect"]`` (``{"single": h/w,
"double": h/w}``; multi-panel figures are taller than the default 0.75 / 0.45): see
:func:`workbench.show.export.resolve_size`. Checked by ``tests/test_figure_layout.py`` (every text box of
every figure function's SVG, at both widths: no two overlap, none leaves the canvas, title, legend and
axis titles stay off the plot areas).
"""
from __future__ import annotations

import re

import plotly.io as pio

__all__ = ["paper_layout", "wrap_text", "CHAR_WIDTH"]

CHAR_WIDTH = 0.62  # average advance of a DejaVu Sans character, in font sizes (generous: ~0.55 measured)


def wrap_text(text: str, max_px: float, font_px: float) -> str:
    """``text`` with ``<br>`` at spaces so that no line is wider than ``max_px`` (a word longer than a
    line stays whole); existing ``<br>`` are kept. Tags (``<sup>``, ``<span …>``) count as zero width."""
    if not text or max_px <= 0:
        return text
    limit = max(4, int(max_px / (CHAR_WIDTH * font_px)))
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


def paper_layout(fig_dict: dict, width: int, height: int, *, preset: str | None, title: bool) -> None:
    """Apply the paper rules (module docstring) to ``fig_dict`` in place, for a ``width`` × ``height`` px
    canvas at ``preset`` (``"single"``, ``"double"`` or ``None``)."""
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
        text = wrap_text(t_text, width - 8, tf)
        lines = text.count("<br>") + 1
        top = lines * tf * 1.3 + 6
        # plotly centres a multi-line title block on its anchor: anchor the middle at half the block
        lay["title"] = {**lay["title"], "text": text, "x": 0, "xref": "container", "xanchor": "left",
                        "y": 1 - (top / 2) / height, "yref": "container", "yanchor": "middle",
                        "pad": {"l": 4, "t": 0, "b": 0}, "automargin": False}
        margin["t"] = round(top + base * 0.9, 1)
    # ---- legend: under the title (if any), above the plot area, its rows reserved in the top margin
    leg = lay.get("legend") if isinstance(lay.get("legend"), dict) else {}
    names = _legend_names(fig_dict)
    if names and lay.get("showlegend", True) is not False:
        lay["legend"] = leg
        lf = _font(leg.get("font"), _font((tl.get("legend") or {}).get("font"), base))
        text_w = max(len(re.sub(r"<[^>]*>", "", n)) for n in names) * CHAR_WIDTH * lf
        per_row = max(1, int((width - 8) // (text_w + 45)))  # symbol (30) and gaps beside the text
        rows = -(-len(names) // per_row)
        leg_h = rows * (max(lf * 1.3, 10) + 9) + 4  # ~19 px a row at 7.5 px (markers set the row height)
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
    # ---- axis titles wrap to their axis
    plot_w = max(1.0, width - float(margin.get("l", 80)) - float(margin.get("r", 80)))
    plot_h = max(1.0, height - float(margin.get("t", 100)) - max(float(margin.get("b", 80)), base * 3.2))
    _row_gaps(lay, tl, plot_h, base)
    for key, ax in list(lay.items()):
        m = re.fullmatch(r"([xy])axis\d*", key)
        if not m or not isinstance(ax, dict) or not isinstance(ax.get("title"), dict):
            continue
        text = ax["title"].get("text")
        if not isinstance(text, str) or not text:
            continue
        dom = ax.get("domain") or [0, 1]
        span = (dom[1] - dom[0]) * (plot_w if m.group(1) == "x" else plot_h)
        tf = _font(ax["title"].get("font"), _font(((tl.get(key) or tl.get(m.group(1) + "axis") or {})
                                                   .get("title") or {}).get("font"), base))
        ax["title"].setdefault("standoff", round(tf * 0.4, 1))  # plotly's default 15 px is for screens
        plain = len(re.sub(r"<[^>]*>", "", text))
        if "<br>" not in text and plain * CHAR_WIDTH * tf > span:  # smaller first (down to 75%), then wrap:
            small = max(tf * 0.75, span / (plain * CHAR_WIDTH))   # plotly's automargin under-counts the
            ax["title"]["font"] = {**(ax["title"].get("font") or {}), "size": round(small, 2)}  # extra lines
            ax["title"]["text"] = wrap_text(text, span, small)
            if "<br>" in ax["title"]["text"]:
                ax["title"]["standoff"] = round(small * (0.4 + 1.2 * ax["title"]["text"].count("<br>")), 1)
    # ---- tables: fonts shrink until the columns fit the width
    for t in fig_dict.get("data") or []:
        if not isinstance(t, dict) or t.get("type") != "table" or not isinstance(t.get("columnwidth"), list):
            continue
        cells, header = t.setdefault("cells", {}), t.setdefault("header", {})
        cf = _font(cells.get("font"), base)
        need = sum(t["columnwidth"]) * CHAR_WIDTH * cf + 12 * len(t["columnwidth"])
        if need > plot_w:
            k = plot_w / need
            for part in (cells, header):
                part["font"] = {**(part.get("font") or {}), "size": round(_font(part.get("font"), base) * k, 2)}
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


def _row_gaps(lay: dict, tl: dict, plot_h: float, base: float) -> None:
    """Widen the gaps between stacked panels until an x axis's tick labels and title fit between them
    (plotly's automargin only works at the canvas edges); panel heights keep their proportions."""
    ys = {k: v for k, v in lay.items() if re.fullmatch(r"yaxis\d*", k) and isinstance(v, dict)
          and isinstance(v.get("domain"), (list, tuple)) and v.get("overlaying") in (None, False)}
    bands = sorted({tuple(v["domain"]) for v in ys.values()}, key=lambda d: -d[1])
    if len(bands) < 2 or any(a[0] < b[1] - 1e-9 for a, b in zip(bands, bands[1:])):
        return  # one row, or panels side by side (overlapping bands): nothing stacked
    tick = base * 0.85

    def need(band) -> float:  # px below a band: its x axes' tick labels and titles
        px = 4.0
        for k, v in ys.items():
            if tuple(v["domain"]) != band:
                continue
            xa = lay.get("xaxis" + k[5:]) or {}
            if xa.get("showticklabels", True) is not False and xa.get("visible", True) is not False:
                px = max(px, tick * 1.4 + 8)
            t = (xa.get("title") or {}).get("text") if isinstance(xa.get("title"), dict) else None
            if t:
                tf = _font(xa["title"].get("font"), base)
                px = max(px, tick * 1.4 + 8 + tf * 1.3 * (t.count("<br>") + 1) + tf * 0.4 + 3)
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


def _legend_names(fig_dict: dict) -> list[str]:
    """Names of the legend's entries (one per shown trace; one trace alone shows none, as in plotly)."""
    data = [t for t in fig_dict.get("data") or [] if isinstance(t, dict)]
    shown = [t for t in data if t.get("showlegend") is not False and t.get("type") not in ("heatmap", "table")
             and t.get("visible", True) is not False]
    if len(data) == 1 and data[0].get("showlegend") is not True:
        return []
    return [str(t.get("name") or f"trace {i}") for i, t in enumerate(shown)]


def _limit_ticks(ax: dict, span_px: float, per_tick_px: float) -> None:
    """``nticks`` of an auto-ticked axis (or colour bar) so that its labels do not stack."""
    if ax.get("tickmode") in ("array", "linear") or ax.get("dtick") is not None or ax.get("tickvals") is not None:
        return
    n = max(2, int(span_px // max(per_tick_px, 1.0)))
    ax["nticks"] = min(int(ax["nticks"]), n) if isinstance(ax.get("nticks"), int) and ax["nticks"] > 0 else n
