"""Slider → painted latency in a real browser (issue 24): JupyterLab in headless Debian chromium (Playwright).

For each notebook (default: the analytic ones, 02 03 04 05 07 09 10) the script runs it from the Run menu, then
on every panel moves every visible slider ``--n`` times (keyboard on the slider's handle: ArrowRight, then
ArrowLeft, alternating, so the value steps one notch and back). One move is timed in the page, from the
``keydown`` to the first animation frame after the last ``plotly_afterplot`` (or the last change of a token
view) that the move caused; the move is over when every comm message it sent has been answered by the kernel,
the kernel is idle and nothing has been drawn for ``--quiet`` seconds. A move that redrew nothing (the slider
changed nothing there) is counted, not timed. A synthetic T = 32 768 capture (4 layers, 6 query heads, 2 KV
groups, 64-token chunks) is measured in its heads, pages and token panels with ``--long``.

Printed: one row per panel slider (median, p95, max, n) and one summary per notebook; written through the
harness (commit, versions, load average) to ``--out``. The load average is part of every number: measure on a
quiet machine.

    python benchmarks/browser_latency.py [--notebooks 02 04] [--n 5] [--long] [--out benchmarks/out/browser_latency.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _harness as harness

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

DEFAULT = ["02", "03", "04", "05", "07", "09", "10"]

# in the page: the time of the last keydown, and of the first animation frame after each redraw since
_HOOK_JS = """() => {
  if (!window.__wbLat) {
    window.__wbLat = {t0: null, painted: null, draws: 0};
    document.addEventListener('keydown', () => { const s = window.__wbLat; s.t0 = performance.now(); s.painted = null;
      s.draws = 0; }, true);
    window.__wbLat.mark = () => requestAnimationFrame(() => { const s = window.__wbLat;
      if (s.t0 !== null) { s.painted = performance.now(); s.draws += 1; } });
  }
  const mark = window.__wbLat.mark;
  for (const gd of document.querySelectorAll('.jp-OutputArea .js-plotly-plot')) {
    if (gd.__wbHooked || !gd.on) continue;
    gd.__wbHooked = true;
    gd.on('plotly_afterplot', mark);
  }
  for (const el of document.querySelectorAll('.jp-OutputArea .wb-token-widget')) {  // the HTML token view
    if (el.__wbHooked) continue;
    el.__wbHooked = true;
    new MutationObserver(mark).observe(el, {subtree: true, childList: true, characterData: true});
  }
  return true;
}"""


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _move(page, tb, handle, key: str, quiet_s: float, timeout_s: float = 60.0) -> float | None:
    """One key press on a slider handle; the keydown → painted time in ms, or None when nothing redrew."""
    before = page.evaluate(tb._MSGS_JS)["sent"]
    handle.press(key)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = page.evaluate(tb._MSGS_JS)
        lat = page.evaluate("() => window.__wbLat")
        since_paint = (page.evaluate("() => performance.now()") - lat["painted"]) if lat["painted"] else None
        settled = m["sent"] > before and m["pending"] == 0 and m["idle"] and m["quiet_ms"] >= quiet_s * 1000
        if settled and (since_paint is None or since_paint >= quiet_s * 1000):
            return None if lat["painted"] is None else lat["painted"] - lat["t0"]
        time.sleep(0.05)
    return None


def measure_notebook(page, tb, name: str, n: int, quiet_s: float) -> list[dict]:
    tb._wait_done(page, tb.RUN_ALL_TIMEOUT_S)
    errors = tb._kernel_errors(page)
    if errors:
        raise RuntimeError(f"{name}: {errors[0][-1500:]}")
    time.sleep(2)
    rows = []
    for p in tb._panels(page):
        area = page.locator(".jp-OutputArea").filter(has=page.locator(".widget-hslider")).nth(p["i"])
        area.scroll_into_view_if_needed()
        page.evaluate(_HOOK_JS)
        for label in p["sliders"]:
            slider = area.locator(".widget-hslider").filter(has=page.locator(".widget-label", has_text=label)).first
            if slider.locator(".noUi-handle").count() == 0 or not slider.is_enabled():
                continue
            handle = slider.locator(".noUi-handle").first
            handle.focus()
            times, inert = [], 0
            for k in range(n):
                key = "ArrowRight" if k % 2 == 0 else "ArrowLeft"
                t = _move(page, tb, handle, key, quiet_s)
                if t is None and k == 0:       # at the top of its range: step down first
                    t = _move(page, tb, handle, "ArrowLeft", quiet_s)
                if t is None:
                    inert += 1
                else:
                    times.append(t)
            row = {"notebook": name, "panel": p["i"], "slider": label, "n": len(times), "inert": inert}
            if times:
                row.update(median_ms=statistics.median(times), p95_ms=_pct(times, 0.95), max_ms=max(times),
                           times_ms=[round(t, 1) for t in times])
            rows.append(row)
            print(f"  {name:<34} panel {p['i']}  {label:<24} " + (
                f"median {row['median_ms']:7.0f} ms  p95 {row['p95_ms']:7.0f}  max {row['max_ms']:7.0f}  n={len(times)}"
                if times else "no redraw") + (f"  ({inert} inert)" if inert else ""), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--notebooks", nargs="*", default=DEFAULT, help="notebook numbers (00–11)")
    ap.add_argument("--n", type=int, default=5, help="moves per slider (≥ 1)")
    ap.add_argument("--long", action="store_true", help="also the synthetic T = 32 768 capture")
    ap.add_argument("--quiet", type=float, default=0.6, help="seconds without a message or a redraw that end a move")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "browser_latency.json")
    a = ap.parse_args()
    if a.n < 1:
        ap.error(f"--n: must be an integer >= 1, got {a.n}")
    import test_browser as tb
    from playwright.sync_api import sync_playwright

    if not Path(tb.CHROMIUM).exists():
        sys.exit(f"no Debian chromium at {tb.CHROMIUM}")
    names = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    chosen = [nm for nm in names if nm[:2] in set(a.notebooks)]
    rows, load = [], {}
    with tempfile.TemporaryDirectory(prefix="wb-latency-") as tmp, tb.lab_server(Path(tmp)) as (base, token, root):
        if a.long:
            chosen.append("long_32k.ipynb")   # written by the server's set-up (test_browser.LONG_CELLS)
        with sync_playwright() as p:
            browser = tb._launch(p)
            context = browser.new_context(viewport={"width": tb.WIDE, "height": tb.HEIGHT})
            for name in chosen:
                page = context.new_page()
                page.set_default_timeout(60_000)
                try:
                    tb._open(page, base, token, name)
                    tb._run_all_from_menu(page)
                    load[name] = {"before": os.getloadavg()}
                    rows += measure_notebook(page, tb, name, a.n, a.quiet)
                    load[name]["after"] = os.getloadavg()
                finally:
                    page.close()
                    tb._shutdown_kernels(base, token)
            browser.close()
    summary = {}
    for name in chosen:
        ts = [t for r in rows if r["notebook"] == name for t in r.get("times_ms", [])]
        if ts:
            summary[name] = {"median_ms": statistics.median(ts), "p95_ms": _pct(ts, 0.95), "max_ms": max(ts),
                             "moves": len(ts), "load_avg": load.get(name)}
            print(f"{name:<36} all sliders: median {summary[name]['median_ms']:6.0f} ms  p95 "
                  f"{summary[name]['p95_ms']:6.0f} ms  max {summary[name]['max_ms']:6.0f} ms  ({len(ts)} moves)")
    harness.write_json(a.out, {"rows": rows, "summary": summary}, n=a.n, quiet_s=a.quiet, width_px=tb.WIDE)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
