"""The one home of the figure layout rule: no two text boxes overlap, none leaves its figure, and no
title, legend entry or axis title sits on a plot area, and no tick label of a whole-number index axis (layers,
heads, positions) falls between whole numbers (plotly's 0.5, 1.5 … on a 4-layer heatmap).
Two readers feed it the same boxes:

- :data:`BOXES_JS`: an exported SVG file opened on its own in chromium (``tests/test_figure_layout.py``,
  ``tests/test_live_layout.py``), in the SVG's viewBox units;
- :data:`LIVE_BOXES_JS`: every shown plotly plot of a JupyterLab page (``tests/test_browser.py``), in screen
  px relative to the figure's canvas, with the figure's clipping by the page (an output area, a widget box or
  the notebook narrower than the figure) as problems of their own.

:func:`layout_problems` is the rule, on what either reader returns.
"""
from __future__ import annotations

import re

TOL = 0.75  # px (= pt) of overlap tolerated: anti-aliasing of adjacent boxes

# boxes of the <text> elements and the plot areas, in viewBox units
BOXES_JS = """() => {
  const svg = document.querySelector('svg');
  const r0 = svg.getBoundingClientRect();
  const vb = svg.viewBox.baseVal;
  const sx = vb.width / r0.width, sy = vb.height / r0.height;
  const box = (r) => ({x0: (r.left - r0.left) * sx, y0: (r.top - r0.top) * sy,
                       x1: (r.right - r0.left) * sx, y1: (r.bottom - r0.top) * sy});
  const texts = [];
  for (const t of svg.querySelectorAll('text')) {
    if (!t.textContent.trim()) continue;
    const r = t.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    let cls = []; let e = t;
    while (e && e !== svg) { if (e.getAttribute('class')) cls.push(e.getAttribute('class')); e = e.parentElement; }
    texts.push({text: t.textContent, cls: cls.join(' '), ...box(r)});
  }
  const plots = [];
  const seen = new Set();
  for (const g of svg.querySelectorAll('g.overplot > g[clip-path*="plot)"]')) {
    const id = g.getAttribute('clip-path').match(/#([^)'"]+)/)[1];
    if (seen.has(id)) continue;
    seen.add(id);
    const rect = svg.querySelector('clipPath[id="' + id + '"] rect');
    if (!rect) continue;
    const m = svg.getCTM().inverse().multiply(g.getCTM());
    const w = +rect.getAttribute('width'), h = +rect.getAttribute('height');
    if (!(w > 0 && h > 0)) continue;
    plots.push({x0: m.e, y0: m.f, x1: m.e + w, y1: m.f + h});
  }
  return {w: vb.width, h: vb.height, texts, plots};
}"""

# Every shown plotly plot inside ``root`` (an element, or the document): its canvas size, its text boxes and plot
# areas (the subplots' drag rectangles) in px from the canvas' top left corner, whether plotly lays it out at a
# fixed width (``autosize`` off), whether it is a widget's (a panel's figure; else a plain plotly output, which
# plotly sizes to its output area), and ``clipped``: the page boxes that cut it (an ancestor inside its cell that
# does not show overflow, or the notebook, narrower or shorter than the figure). A figure hidden in the page
# (``display: none`` on it or an ancestor: a panel's set-aside figure, its ``_hidden`` trait) has no offsetParent
# and is left out; so is plotly's hover layer (a tooltip is not layout).
LIVE_BOXES_JS = """(root) => {
  root = root || document;
  const out = [];
  for (const gd of root.querySelectorAll('.js-plotly-plot')) {
    if (gd.offsetParent === null) continue;
    const svg = gd.querySelector('svg.main-svg');
    if (!svg) continue;
    const r0 = svg.getBoundingClientRect();
    if (r0.width === 0 || r0.height === 0) continue;
    const box = (r) => ({x0: r.left - r0.left, y0: r.top - r0.top, x1: r.right - r0.left, y1: r.bottom - r0.top});
    const texts = [];
    for (const t of gd.querySelectorAll('svg text')) {
      if (!t.textContent.trim() || t.closest('.hoverlayer')) continue;
      const r = t.getBoundingClientRect();
      if (r.width === 0 || r.height === 0) continue;
      const st = getComputedStyle(t);
      if (st.visibility === 'hidden' || st.display === 'none' || +st.opacity === 0) continue;
      let cls = []; let e = t;
      while (e && e !== gd) { if (e.getAttribute && e.getAttribute('class')) cls.push(e.getAttribute('class'));
                              e = e.parentElement; }
      texts.push({text: t.textContent, cls: cls.join(' '), ...box(r)});
    }
    const plots = Array.from(gd.querySelectorAll('.draglayer .nsewdrag')).map(d => box(d.getBoundingClientRect()))
      .filter(b => b.x1 - b.x0 > 0 && b.y1 - b.y0 > 0);
    const clipped = [];
    const cell = gd.closest('.jp-Cell');
    const cut = (el, name, vertical) => {
      const r = el.getBoundingClientRect();
      const over = Math.max(r.left - r0.left, r0.right - (r.left + el.clientWidth),
                            vertical ? Math.max(r.top - r0.top, r0.bottom - (r.top + el.clientHeight)) : 0);
      if (over > 1) clipped.push(`${name} ${Math.round(el.clientWidth)}x${Math.round(el.clientHeight)} px cuts ` +
                                 `the ${Math.round(r0.width)}x${Math.round(r0.height)} px figure by ${Math.round(over)} px`);
      return over > 1;
    };
    for (let e = gd.parentElement; e && cell && e !== cell; e = e.parentElement) {   // the innermost that cuts
      const st = getComputedStyle(e);
      const name = (String(e.className || '').split(' ').find(c => /^(jp-|widget-)/.test(c))) || e.tagName.toLowerCase();
      if ((st.overflowX !== 'visible' || st.overflowY !== 'visible') && cut(e, name, true)) break;
    }
    const nb = gd.closest('.jp-Notebook');
    if (nb) cut(nb, 'the notebook', false);    // it scrolls vertically: only its width cuts
    const lay = gd.layout || {}, full = gd._fullLayout || {};   // full: what plotly drew with (a relayout of the
    const meta = (lay.meta && typeof lay.meta === 'object') ? lay.meta : {};   // size resets layout.autosize)
    // the linear axes whose every trace's index coordinates (a heatmap's both, a bar's categories, a line's x;
    // plotly's x0 + dx·i where none are given) are whole numbers: no tick label may fall between them
    const index = (t, c) => {
      const k = t.type || 'scatter';
      if (!(k === 'heatmap' || (k === 'scatter' || k === 'scattergl') && c === 'x'
            || k === 'bar' && c === (t.orientation === 'h' ? 'y' : 'x'))) return null;
      if (t[c] != null) return typeof t[c].length === 'number' ? Array.from(t[c]) : null;
      const n = k === 'heatmap' ? (c === 'x' ? ((t.z || [])[0] || []).length : (t.z || []).length)
                                : (t[c === 'x' ? 'y' : 'x'] || []).length;
      return Array.from({length: n}, (_, i) => +(t[c + '0'] || 0) + +(t['d' + c] || 1) * i);
    };
    const isWhole = {};
    for (const t of gd._fullData || []) for (const c of ['x', 'y']) {   // decoded: gd.data may hold {bdata} specs
      const id = t[c + 'axis'] || c, v = index(t, c);
      isWhole[id] = (isWhole[id] !== false) && v !== null
        && v.every(x => typeof x === 'number' && (!Number.isFinite(x) || Number.isInteger(x)));
    }
    const whole = Object.keys(isWhole).filter(id => {
      const ax = full[id[0] + 'axis' + id.slice(1)] || {};
      return isWhole[id] && ax.type === 'linear' && ax.tickmode !== 'array';
    });
    out.push({figure: meta.figure || ((lay.title && lay.title.text) || '').slice(0, 40), w: r0.width, h: r0.height,
              fixed: full.autosize === false && typeof lay.width === 'number', widget: !!gd.closest('.jupyter-widgets'),
              texts, plots, clipped, whole});
  }
  return out;
}"""


def kind(cls: str) -> str:
    """What a text is, from the classes of its element and its ancestors (innermost first)."""
    c = cls.split()
    if any(x == "gtitle" for x in c):
        return "title"
    if any(re.fullmatch(r"(g-)?[xy]\d*title", x) for x in c):
        return "axis title"
    for k, marks in (("legend", ("legendtext",)), ("annotation", ("annotation-text",)),
                     ("colorbar", ("cbtitle", "cbaxis")), ("table", ("cell-text",))):
        if any(x.startswith(m) for m in marks for x in c):
            return k
    return "tick" if any("tick" in x for x in c) else "other"


def whole_axes(fig_dict: dict) -> set[str]:
    """The axis ids (``"x"``, ``"y2"`` …) of ``fig_dict`` whose every trace's index coordinates (a heatmap's both, a
    bar's categories, a line's x; plotly's ``x0 + dx·i`` where none are given: ``paper_layout._coords``, which also
    decodes plotly's ``{bdata}`` arrays) are whole numbers, on linear axes without explicit ticks: what
    :data:`LIVE_BOXES_JS` returns as ``whole`` for a live figure."""
    import numpy as np

    from workbench.show.paper_layout import _coords

    lay, state = fig_dict.get("layout") or {}, {}
    for t in fig_dict.get("data") or []:
        for c in "xy":
            v = _coords(t, c)
            ok = v is not None and bool(np.all(~np.isfinite(v) | (v == np.round(v))))
            state[t.get(c + "axis") or c] = state.get(t.get(c + "axis") or c, True) and ok
    return {ax_id for ax_id, ok in state.items() if ok and (ax := lay.get(ax_id[0] + "axis" + ax_id[1:]) or {})
            .get("type") in (None, "-", "linear") and ax.get("tickmode") != "array" and ax.get("tickvals") is None}


def _between_whole(text: str) -> bool:
    """Whether a tick label is a number that is not whole (``0.5``, ``−1.5``)."""
    try:
        v = float(text.replace("\u2212", "-").replace(",", "").strip())
    except ValueError:
        return False
    return v != round(v)


def _overlap(a, b) -> float:
    return min(min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]), min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]))


def layout_problems(d: dict) -> list[str]:
    """Every overlap and overflow of the text boxes ``d`` (``{w, h, texts, plots}`` from :data:`BOXES_JS` or one
    figure of :data:`LIVE_BOXES_JS`; the latter's ``clipped`` entries are problems too), and every tick label between
    whole numbers on an axis of ``d["whole"]`` (:data:`LIVE_BOXES_JS`, or :func:`whole_axes` of the figure)."""
    out = [f"clipped by the page: {c}" for c in d.get("clipped", ())]
    boxes = d["texts"]
    whole = set(d.get("whole") or ())
    for a in boxes:
        ax = next((x[:-4] for x in a["cls"].split() if re.fullmatch(r"[xy]\d*tick", x)), None)
        if ax in whole and kind(a["cls"]) == "tick" and _between_whole(a["text"]):
            out.append(f"a tick between whole numbers on the index axis {ax}: {a['text']!r}")
    for i, a in enumerate(boxes):
        if a["x0"] < -TOL or a["y0"] < -TOL or a["x1"] > d["w"] + TOL or a["y1"] > d["h"] + TOL:
            out.append(f"outside the {d['w']:.0f}x{d['h']:.0f} canvas: {kind(a['cls'])} {a['text'][:40]!r} at "
                       f"({a['x0']:.0f}, {a['y0']:.0f})–({a['x1']:.0f}, {a['y1']:.0f})")
        for b in boxes[i + 1:]:
            if _overlap(a, b) > TOL:
                out.append(f"overlap: {kind(a['cls'])} {a['text'][:30]!r} and {kind(b['cls'])} {b['text'][:30]!r}")
        if kind(a["cls"]) in ("title", "legend", "axis title"):
            for p in d["plots"]:
                if _overlap(a, p) > TOL:
                    out.append(f"{kind(a['cls'])} {a['text'][:30]!r} overlaps a plot area")
    return out
