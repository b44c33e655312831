"""Slider update latency of the widget panels (issue 6) on a real capture.

A capture of a T-token prompt on the default model (the benchmark layout of ``benchmarks/prune.py``:
real tokens, 64-token chunks, a 32-token query as audit population, 8 observers, a 32-token tail and
3 decode steps), then every panel is built once and each of its sliders/dropdowns is moved through
``--n`` values. Per move the panel records ``analysis_ms`` (the science), ``figure_ms`` (building the
plotly figures), ``sync_ms`` (copying them into the ``FigureWidget``s inside ``batch_update``) and
``total_ms``. Without a kernel no message leaves the process, so the front end's render time is not
included (see tests/test_browser.py for the browser). The run-again panels are measured on their
analytic sliders only (no model call).

    python benchmarks/widgets.py [--T 2048] [--n 6] [--example] [--out benchmarks/out/widgets.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import _harness as harness

sys.path.insert(0, str(Path(__file__).resolve().parent))

SKIP = {"certify", "mode"}  # toggles measured as a panel variant, not as sliders


def _values(w, n: int):
    """``n`` values spread over a control's range (options for a dropdown)."""
    if hasattr(w, "options"):
        opts = [o if not isinstance(o, tuple) else o[1] for o in w.options]
        return [opts[i % len(opts)] for i in range(1, n + 1)]
    if hasattr(w, "base"):
        return [w.base ** (w.min + (w.max - w.min) * (i + 0.5) / n) for i in range(n)]
    vals = [w.min + (w.max - w.min) * (i + 0.5) / n for i in range(n)]
    return [int(round(v)) for v in vals] if isinstance(w.value, int) else vals


def measure(panel, n: int) -> dict:
    out = {}
    for name, w in panel.controls.items():
        if name in SKIP or not (hasattr(w, "min") or hasattr(w, "options")):
            continue
        rows = []
        start = w.value
        for v in _values(w, n):
            before = panel.n_updates
            w.value = v
            if panel.n_updates > before:
                rows.append(dict(panel.timings))
        w.value = start
        if rows:
            out[name] = {k: statistics.median(r[k] for r in rows) for k in rows[0]} | {"n": len(rows)}
            out[name]["max_total_ms"] = max(r["total_ms"] for r in rows)
    return out


def _summary(per: dict) -> dict:
    tot = [v["total_ms"] for v in per.values()]
    return {"median_total_ms": statistics.median(tot), "worst_slider_ms": max(tot),
            "median_analysis_ms": statistics.median(v["analysis_ms"] for v in per.values()),
            "median_figure_ms": statistics.median(v["figure_ms"] for v in per.values()),
            "median_sync_ms": statistics.median(v["sync_ms"] for v in per.values())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--n", type=int, default=6)
    ap.add_argument("--example", action="store_true", help="use the bundled example prompt instead of the T layout")
    ap.add_argument("--panels", default="heads,priority,audit,audit_nocert,shift,pages,prune,eviction")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "widgets.json"))
    a = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from workbench.analyse.params import EntroPrefillParams
    from workbench.capture import RowSet, run_capture
    from workbench.run.models import load_model
    from workbench.show import widgets as Wd

    lm = load_model(device="cpu", progress=False)
    if a.example:
        from workbench.run.examples import load_example

        prompt = load_example().build(lm.tokenizer, max_context=lm.shape.max_context)
    else:
        from prune import layout

        prompt = layout(lm.tokenizer, a.T)
    spans = getattr(prompt, "spans", prompt)
    t0 = time.perf_counter()
    cap = run_capture(lm, prompt, RowSet(tail=32, n_decode=3), progress=False)
    capture_s = time.perf_counter() - t0
    base = EntroPrefillParams(eps_row=0.2, target=0.3, streak=0, eps_audit=0.3)
    builders = {
        "heads": lambda: Wd.HeadsPanel(cap, base),
        "priority": lambda: Wd.PriorityPanel(cap, base),
        "audit": lambda: Wd.AuditPanel(cap, base, certify=True),
        "audit_nocert": lambda: Wd.AuditPanel(cap, base, certify=False),
        "shift": lambda: Wd.ShiftPanel(cap),
        "pages": lambda: Wd.PagesPanel(cap, base),
        "prune": lambda: Wd.PrunePanel(cap, lm, prompt, base),
        "eviction": lambda: Wd.EvictionPanel(cap, lm, prompt),
    }
    calls = {"n": 0}
    hook = lm.model.register_forward_pre_hook(lambda *args: calls.__setitem__("n", calls["n"] + 1))
    results = {}
    try:
        for name in a.panels.split(","):
            t = time.perf_counter()
            panel = builders[name]()
            build_ms = (time.perf_counter() - t) * 1e3
            per = measure(panel, a.n)
            results[name] = {"panel": type(panel).__name__, "build_ms": build_ms, "sliders": per, **_summary(per)}
            print(f"{name:13s} build {build_ms:7.0f} ms | median {results[name]['median_total_ms']:6.1f} ms, "
                  f"worst slider {results[name]['worst_slider_ms']:6.1f} ms  (analysis "
                  f"{results[name]['median_analysis_ms']:.1f}, figure {results[name]['median_figure_ms']:.1f}, "
                  f"sync {results[name]['median_sync_ms']:.1f})", flush=True)
    finally:
        hook.remove()
    assert calls["n"] == 0, f"an analytic slider called the model ({calls['n']} forwards)"

    print(f"\nT = {spans.T}, k = {spans.k}, L = {cap.L}, capture {capture_s:.1f} s, model calls from sliders: 0\n")
    print("| panel | slider | analysis ms | figure ms | sync ms | total ms (median) | max ms |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        for s, v in r["sliders"].items():
            print(f"| {name} | {s} | {v['analysis_ms']:.1f} | {v['figure_ms']:.1f} | {v['sync_ms']:.1f} | "
                  f"{v['total_ms']:.1f} | {v['max_total_ms']:.1f} |")
    out = {"T": spans.T, "k": spans.k, "L": cap.L, "n": a.n, "capture_s": capture_s, "model_calls": calls["n"],
           "panels": results}
    path = harness.write_json(a.out, out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
