"""HTML figures (the token view) printed for papers by the same headless Chromium as the plotly exports.

:func:`render_html` lays a :class:`~workbench.show.token_view.TokenView` out at a column width and gives
its files:

- **PDF**: Chromium's print (``Page.printToPDF``), one page exactly the size of the content, text as real
  text in embedded fonts (vector);
- **SVG**: built from Chromium's own layout: a first pass runs a script in the page that measures every
  token's boxes, baseline and style; the SVG draws the same boxes and the text as ``<text>`` elements
  (``textLength`` pins each piece to its measured width), so it is vector text too;
- **PNG**: the printed page rasterised by poppler's ``pdftoppm`` at the requested scale (300 dpi by default,
  ``pHYs`` set; installed with the set-up's ``poppler-utils``).

Units as in :mod:`workbench.show.export`: one layout px = one pt; a single column is 240 pt wide. One
Chromium (:class:`~workbench.show.chromium.ChromiumSession`, its own temporary profile) serves every width of an
export call: ``browser=`` passes it in. Raises RuntimeError when Chromium is missing or fails.
"""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

from workbench.show.chromium import CHROMIUM_TIMEOUT_S, ChromiumSession
from workbench.show.kaleido_server import CSS_PX_PER_INCH, PX_PER_INCH, png_set_dpi
from workbench.util import private_temp_dir

__all__ = ["render_html", "page_html", "svg_from_layout", "measure", "CHROMIUM_TIMEOUT_S"]

PT_PER_CSS_PX = PX_PER_INCH / CSS_PX_PER_INCH  # 0.75
PAD_PT = 3.0

# The measuring script: page height, and every element marked data-svg / every token span with its text pieces
_MEASURE_JS = r"""
(function () {
  const out = {height: 0, boxes: []};
  const root = document.querySelector('.wb-tokens');
  out.height = Math.ceil(document.querySelector('.wb-page').getBoundingClientRect().bottom);
  const baseOf = {};
  function baseline(el, cs) {
    const key = cs.fontSize + '|' + cs.fontFamily;
    if (key in baseOf) return baseOf[key];
    const probe = document.createElement('span');
    probe.style.font = cs.font; probe.style.whiteSpace = 'pre';
    probe.textContent = 'Hg';
    const mark = document.createElement('span');
    mark.style.display = 'inline-block'; mark.style.width = '0'; mark.style.height = '0';
    probe.appendChild(mark);
    document.body.appendChild(probe);
    const r = document.createRange(); r.selectNodeContents(probe.firstChild);
    const c = r.getBoundingClientRect();
    const f = (mark.getBoundingClientRect().top - c.top) / c.height;
    probe.remove();
    baseOf[key] = f;
    return f;
  }
  function pieces(el) {
    const res = [];
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    let n;
    while ((n = walker.nextNode())) {
      const s = n.textContent;
      let cur = null;
      for (let i = 0; i < s.length; i++) {
        const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1);
        const b = r.getBoundingClientRect();
        if (s[i] === '\n' || b.width === 0) { cur = null; continue; }
        if (cur && Math.abs(b.top - cur.y) < 0.5 && Math.abs(b.left - (cur.x + cur.w)) < 1.5) {
          cur.w = b.right - cur.x; cur.text += s[i];
        } else {
          cur = {x: b.left, y: b.top, w: b.width, h: b.height, text: s[i]};
          res.push(cur);
        }
      }
    }
    return res;
  }
  for (const el of root.querySelectorAll('.wb-title, .tk, .sw, .wb-key .kx')) {
    const cs = getComputedStyle(el);
    const rects = Array.from(el.getClientRects()).map(r => ({x: r.left, y: r.top, w: r.width, h: r.height}));
    const own = el.classList.contains('kx') ? Array.from(el.childNodes).filter(c => c.nodeType === 3) : null;
    let txt = [];
    if (el.classList.contains('tk') || el.classList.contains('wb-title')) txt = pieces(el);
    else if (own) { const tmp = []; for (const c of own) { const sp = document.createElement('span');
        c.replaceWith(sp); sp.appendChild(c); tmp.push(...pieces(sp)); } txt = tmp; }
    const nl = el.classList.contains('nl');
    out.boxes.push({cls: el.className, rects, text: txt, nl,
      bg: cs.backgroundColor, color: cs.color, size: parseFloat(cs.fontSize), family: cs.fontFamily,
      weight: cs.fontWeight, strike: cs.textDecorationLine.includes('line-through'),
      bl: parseFloat(cs.borderLeftWidth) || 0, blc: cs.borderLeftColor,
      bb: parseFloat(cs.borderBottomWidth) || 0, bbc: cs.borderBottomColor,
      ol: cs.outlineStyle !== 'none' ? (parseFloat(cs.outlineWidth) || 0) : 0, olc: cs.outlineColor,
      base: (txt.length ? baseline(el, cs) : 0)});
  }
  return JSON.stringify(out);
})()
"""


def page_html(body: str, width_pt: float, height_pt: float | None = None) -> str:
    """A whole page around ``body`` at ``width_pt`` (and, when known, ``height_pt``: the PDF page size)."""
    size = f"{width_pt}pt {height_pt}pt" if height_pt else f"{width_pt}pt 2000pt"
    return ('<!DOCTYPE html><html><head><meta charset="utf-8"><style>'
            f"@page {{ size: {size}; margin: 0; }} html, body {{ margin: 0; padding: 0; background: white; }}"
            f" body {{ width: {width_pt}pt; }} .wb-page {{ padding: {PAD_PT}pt; box-sizing: border-box;"
            f" width: {width_pt}pt; }} .tk:hover {{ outline: none; }}"
            "* { -webkit-print-color-adjust: exact; print-color-adjust: exact; }"
            "</style></head><body><div class=\"wb-page\">" + body + "</div></body></html>")


def measure(body: str, width_pt: float, folder: Path, browser: ChromiumSession) -> dict:
    """Chromium's layout of ``body`` at ``width_pt``: ``{"height": css px, "boxes": [...]}``."""
    p = folder / "measure.html"
    p.write_text(page_html(body, width_pt), encoding="utf-8")
    tab = browser.open(p)
    try:
        lay = browser.evaluate(tab, _MEASURE_JS)
    finally:
        browser.close_tab(tab)
    if not isinstance(lay, str):
        raise RuntimeError("figure export: Chromium's page gave no layout (the measuring script did not run)")
    return json.loads(lay)


def _css_colour(c: str) -> tuple[str, float]:
    """``rgb(a)(…)`` → (``#rrggbb``, alpha)."""
    m = re.match(r"rgba?\(([^)]*)\)", c or "")
    if not m:
        return "#000000", 0.0
    parts = [float(x) for x in m.group(1).replace("/", ",").replace(" ", ",").split(",") if x]
    a = parts[3] if len(parts) > 3 else 1.0
    return "#%02x%02x%02x" % tuple(int(round(v)) for v in parts[:3]), a


def svg_from_layout(lay: dict, width_pt: float) -> bytes:
    """An SVG (in pt) of a measured layout: boxes, borders, outlines and the text as ``<text>`` elements."""
    k = PT_PER_CSS_PX
    H = lay["height"] * k
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width_pt}pt" height="{H:.2f}pt" '
           f'viewBox="0 0 {width_pt} {H:.2f}">', f'<rect width="{width_pt}" height="{H:.2f}" fill="#ffffff"/>']
    for b in lay["boxes"]:
        bg, a = _css_colour(b["bg"])
        for r in b["rects"]:
            x, y, w, h = r["x"] * k, r["y"] * k, r["w"] * k, r["h"] * k
            if a > 0 and bg != "#ffffff":
                out.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}" fill="{bg}"/>')
            if b["bl"] > 0:
                c, _ = _css_colour(b["blc"])
                out.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{b["bl"] * k:.2f}" height="{h:.2f}" fill="{c}"/>')
            if b["bb"] > 0:
                c, _ = _css_colour(b["bbc"])
                t = b["bb"] * k
                out.append(f'<rect x="{x:.2f}" y="{y + h - t:.2f}" width="{w:.2f}" height="{t:.2f}" fill="{c}"/>')
            if b["ol"] > 0:
                c, _ = _css_colour(b["olc"])
                t = b["ol"] * k
                out.append(f'<rect x="{x + t / 2:.2f}" y="{y + t / 2:.2f}" width="{max(w - t, 0):.2f}" '
                           f'height="{max(h - t, 0):.2f}" fill="none" stroke="{c}" stroke-width="{t:.2f}"/>')
        col, _ = _css_colour(b["color"])
        size = b["size"] * k
        fam = html.escape(b["family"], quote=True)
        weight = ' font-weight="bold"' if str(b["weight"]) in ("700", "bold") else ""
        for p in b["text"]:
            x, y, w, h = p["x"] * k, p["y"] * k, p["w"] * k, p["h"] * k
            base = y + b["base"] * h
            txt = html.escape(p["text"], quote=False)
            out.append(f'<text x="{x:.2f}" y="{base:.2f}" font-size="{size:.2f}" font-family="{fam}"{weight} '
                       f'fill="{col}" textLength="{w:.2f}" lengthAdjust="spacingAndGlyphs" '
                       f'xml:space="preserve">{txt}</text>')
            if b["strike"]:
                ys = base - 0.3 * size
                out.append(f'<line x1="{x:.2f}" x2="{x + w:.2f}" y1="{ys:.2f}" y2="{ys:.2f}" stroke="{col}" '
                           f'stroke-width="{0.08 * size:.2f}"/>')
    out.append("</svg>")
    return ("\n".join(out) + "\n").encode("utf-8")


def _rasterise(pdf: Path, dpi: float, folder: Path, timeout_s: float) -> bytes:
    """The one page of ``pdf`` as PNG at ``dpi`` (poppler's ``pdftoppm``)."""
    exe = shutil.which("pdftoppm")
    if exe is None:
        raise RuntimeError("PNG export of an HTML figure needs pdftoppm: install poppler-utils "
                           "(apt-get install poppler-utils), or export formats=('pdf', 'svg')")
    dst = folder / "raster"
    try:
        res = subprocess.run([exe, "-png", "-singlefile", "-r", f"{dpi:.6g}", str(pdf), str(dst)],
                             capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"figure export: pdftoppm gave no PNG within {timeout_s:.0f} s") from None
    if res.returncode != 0:
        raise RuntimeError(f"figure export: pdftoppm failed: {res.stderr.decode('utf-8', 'replace')[-300:]}")
    return dst.with_suffix(".png").read_bytes()


def render_html(view, fmts, size, *, title: bool = False, timeout_s: float = CHROMIUM_TIMEOUT_S,
                browser: ChromiumSession | None = None) -> dict[str, bytes]:
    """Bytes of every format in ``fmts`` (``pdf``, ``svg``, ``png``) of ``view`` at ``size`` (an
    :class:`~workbench.show.export.ExportSize`: its preset picks the fonts, its width the column; the
    height follows the content). ``browser``: the export call's Chromium (else one is started for this size)."""
    for fmt in fmts:
        if fmt not in ("pdf", "svg", "png"):
            raise ValueError(f"formats: must be among ('pdf', 'svg', 'png'), got {fmt!r}")
    if browser is None:
        with ChromiumSession(timeout_s) as br:
            return render_html(view, fmts, size, title=title, timeout_s=timeout_s, browser=br)
    width_pt = float(size.width)
    body = view.html(title=title, preset=size.preset or ("single" if width_pt < 372 else "double"))
    out: dict[str, bytes] = {}
    with private_temp_dir("workbench-html-") as tmp:
        folder = Path(tmp)
        lay = measure(body, width_pt, folder, browser)
        if "svg" in fmts:
            out["svg"] = svg_from_layout(lay, width_pt)
        if "pdf" in fmts or "png" in fmts:  # the PNG is the printed page rasterised (screenshots cut long pages)
            height_pt = round(max(1.0, lay["height"] * PT_PER_CSS_PX) + 0.5, 1)
            page = folder / "page.html"
            page.write_text(page_html(body, width_pt, height_pt), encoding="utf-8")
            tab = browser.open(page)
            try:
                pdf = browser.print_pdf(tab, width_pt, height_pt)
            finally:
                browser.close_tab(tab)
            if "pdf" in fmts:
                out["pdf"] = pdf
            if "png" in fmts:
                (folder / "out.pdf").write_bytes(pdf)
                out["png"] = png_set_dpi(_rasterise(folder / "out.pdf", size.scale * PX_PER_INCH, folder, timeout_s),
                                         size.dpi)
    return {f: out[f] for f in fmts}
