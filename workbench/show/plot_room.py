"""What takes room from the plot areas, for the paper layout's estimates: the legend's entries and the colour bars.

A vertical colour bar stands just right of the plot (plotly's ``x = 1.02``) and plotly's automargin pushes the
right margin past it: the plot areas, and a horizontal legend above them (plotly wraps it to the plot's width),
are narrower than ``width − l − r`` by about the bar's thickness, its pad, its tick labels and its title. Left
out, a legend the layout reserved one row for was drawn four rows high at one column (07's shift figure: 35 %
of the canvas).
"""
from __future__ import annotations

import re

__all__ = ["colorbar_px", "column_gaps", "legend_names"]

_OWN_SCALE = ("heatmap", "contour", "histogram2d", "histogram2dcontour", "surface", "choropleth", "densitymapbox")
_TICK_CHARS = 4  # a colour bar's widest tick label, in characters (``0.25``, ``1e−3``): its labels are not known here


def colorbar_px(fig_dict: dict, lay: dict, tl: dict, base: float) -> float:
    """The px right of the plot areas that the widest of ``fig_dict``'s shown vertical colour bars takes (0: none):
    the gap to the plot, the bar, its pad, its tick labels and its title at the side. ``tl``: the template's layout
    (the bars' defaults), ``base``: the figure's font size."""
    data = [t for t in fig_dict.get("data") or [] if isinstance(t, dict) and t.get("visible", True) is not False]
    bars = []
    for key, ax in lay.items():
        if re.fullmatch(r"coloraxis\d*", key) and isinstance(ax, dict) and ax.get("showscale", True) is not False \
                and any(t.get("coloraxis") == key or (t.get("marker") or {}).get("coloraxis") == key for t in data):
            bars.append(ax.get("colorbar") or {})
    for t in data:
        if t.get("type") in _OWN_SCALE and not t.get("coloraxis") and t.get("showscale", True) is not False:
            bars.append(t.get("colorbar") or {})
        elif isinstance(t.get("marker"), dict) and t["marker"].get("showscale") is True:
            bars.append(t["marker"].get("colorbar") or {})
    default = (tl.get("coloraxis") or {}).get("colorbar") or {}
    out = 0.0
    for cb in bars:
        if not isinstance(cb, dict) or cb.get("orientation", "v") != "v":
            continue
        tick = _size((cb.get("tickfont") or {}).get("size"), _size((default.get("tickfont") or {}).get("size"),
                                                                     base * 0.85))
        thick = _size(cb.get("thickness"), _size(default.get("thickness"), 30.0))
        px = thick + _size(cb.get("xpad"), 10.0) + _TICK_CHARS * 0.62 * tick + 4
        title = cb.get("title") if isinstance(cb.get("title"), dict) else {}
        if title.get("text"):
            px += _size((title.get("font") or {}).get("size"), base) * 1.4
        out = max(out, px)
    return out


def legend_names(fig_dict: dict) -> list[str]:
    """Names of the legend's entries (one per shown trace; one trace alone shows none, as in plotly)."""
    data = [t for t in fig_dict.get("data") or [] if isinstance(t, dict)]
    shown = [t for t in data if t.get("showlegend") is not False and t.get("type") not in ("heatmap", "table")
             and t.get("visible", True) is not False]
    if len(data) == 1 and data[0].get("showlegend") is not True:
        return []
    return [str(t.get("name") or f"trace {i}") for i, t in enumerate(shown)]


def _y_label_px(ya: dict, tick: float, base: float) -> float:
    """The px a y axis' tick labels and (wrapped) title take beside its panel."""
    px = 0.0
    if ya.get("showticklabels", True) is not False and ya.get("visible", True) is not False:
        px += _TICK_CHARS * 0.62 * tick + 4
    t = ya["title"].get("text") if isinstance(ya.get("title"), dict) else None
    if t:
        tf = _size((ya["title"].get("font") or {}).get("size"), base)
        px += tf * 1.3 * (t.count("<br>") + 1) + float(ya["title"].get("standoff") or tf * 0.4)
    return px


def _size(v, default: float) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else float(default)


def column_gaps(lay: dict, plot_w: float, base: float) -> None:
    """Widen the gap left of a panel that stands beside another (their y domains overlap) until the right one's y
    tick labels and (wrapped) title fit in it (plotly's automargin only works at the canvas edges): the left panel
    gives up the px, up to half its width; where that is not enough the right panel's y axis moves to its right side
    (the canvas edge, where plotly's automargin makes room). Run after the y titles are fitted (their lines count)."""
    tick = base * 0.85
    panels = []
    for key, xa in lay.items():
        if not re.fullmatch(r"xaxis\d*", key) or not isinstance(xa, dict) or not isinstance(xa.get("domain"), list):
            continue
        ya = lay.get("yaxis" + str(xa.get("anchor") or "y" + key[5:])[1:])
        if isinstance(ya, dict) and isinstance(ya.get("domain"), (list, tuple)) and not ya.get("overlaying"):
            panels.append((xa, ya))
    # the y labels at the canvas' left edge push the left margin past its estimate: the plot is narrower
    edge = max([_y_label_px(ya, tick, base) for xa, ya in panels if xa["domain"][0] <= 1e-9 and
                ya.get("side") != "right"] or [0.0])
    plot_w = max(1.0, plot_w - max(0.0, edge - float((lay.get("margin") or {}).get("l", 0))))
    for xa, ya in panels:
        for xb, yb in panels:
            left, right = xa["domain"], xb["domain"]
            if xa is xb or yb.get("side") == "right" or not (left[1] <= right[0] and ya["domain"][0] < yb["domain"][1]
                                                             and yb["domain"][0] < ya["domain"][1]):
                continue  # (labels on the right side stand at the canvas edge, not in the gap)
            end = right[0] - (4.0 + _y_label_px(yb, tick, base)) / plot_w
            if end < left[0] + (left[1] - left[0]) / 2:  # more than half the left panel: the labels go right,
                yb["side"] = "right"                         # where the margin grows for them
            elif end < left[1]:
                xa["domain"] = [left[0], end]
