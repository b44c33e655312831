"""Figure export speed (issue 6): the first export (Chromium starts) against repeated exports on the
persistent kaleido server, and against kaleido's one-shot mode (a new Chromium per image).

Each export writes one figure as PDF + SVG + PNG (single column, 300 dpi) with its JSON sidecar and
CSV. Two figures: a 30 × 9 layer × head heatmap and a 4-line chart (the sizes of the workbench's own).

    python benchmarks/export.py [--reps 5]

Prints a markdown table and writes ``benchmarks/out/export.json``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import plotly.graph_objects as go

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _harness as harness  # noqa: E402

from workbench.show import export as ex  # noqa: E402
from workbench.show.plots import TEMPLATE  # noqa: E402

OUT = Path(__file__).parent / "out"


def figures() -> dict[str, go.Figure]:
    rng = np.random.default_rng(0)
    heat = go.Figure(go.Heatmap(z=rng.random((30, 9)).tolist(), x=[f"h{h} (g{h // 3})" for h in range(9)], y=list(range(30)),
                                coloraxis="coloraxis"),
                     layout=dict(template=TEMPLATE, title="Head weights w (ζ = 0.5, τ = 1)", xaxis_title="query head",
                                 yaxis_title="layer", meta={"figure": "head_heatmap", "model_id": "benchmark"}))
    lines = go.Figure(layout=dict(template=TEMPLATE, title="Accuracy vs KV budget", xaxis_title="budget B",
                                  yaxis_title="contains", meta={"figure": "accuracy_vs_budget",
                                                                "model_id": "benchmark"}))
    for name in ("full", "streaming", "snapkv", "deferkv"):
        lines.add_scatter(x=[64, 128, 256, 512], y=rng.random(4).tolist(), name=name, mode="lines+markers")
    return {"heatmap": heat, "lines": lines}


def markdown(rows: list[dict]) -> str:
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    for r in rows:
        out.append("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    return "\n".join(out)


def oneshot(fig: go.Figure, size: ex.ExportSize) -> float:
    """PDF + SVG + PNG with kaleido's one-shot mode (no server: a Chromium per image)."""
    import kaleido

    d = fig.to_dict()
    t0 = time.perf_counter()
    for fmt, scale in (("pdf", 4 / 3), ("svg", 1.0), ("png", size.scale)):
        kaleido.calc_fig_sync(d, opts=dict(format=fmt, width=size.width, height=size.height, scale=scale),
                              kopts=dict(mathjax=False))
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="repeated exports per figure on the warm server")
    ap.add_argument("--out", default=str(OUT / "export.json"))
    args = ap.parse_args(argv)
    figs = figures()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ex.shutdown_server()
        # kaleido's one-shot mode first (no server running): the cost without a persistent Chromium
        cold = {name: oneshot(fig, ex.resolve_size(fig, "single")) for name, fig in figs.items()}
        t0 = time.perf_counter()
        ex.ensure_server()
        start_s = time.perf_counter() - t0
        first = {}
        for name, fig in figs.items():
            t0 = time.perf_counter()
            ex.export(fig, Path(tmp) / f"{name}-first")
            first[name] = time.perf_counter() - t0
        for name, fig in figs.items():
            times = []
            for r in range(args.reps):
                t0 = time.perf_counter()
                ex.export(fig, Path(tmp) / f"{name}-{r}")
                times.append(time.perf_counter() - t0)
            rows.append({"figure": name, "oneshot_3_formats_s": cold[name],
                         "first_export_s": first[name] + (start_s if name == next(iter(figs)) else 0.0),
                         "repeat_median_s": statistics.median(times), "repeat_min_s": min(times),
                         "speedup_vs_oneshot": cold[name] / statistics.median(times)})
        t0 = time.perf_counter()
        ex.export_all(figs, Path(tmp) / "all")
        all_s = time.perf_counter() - t0
        ex.shutdown_server()
    print(markdown(rows))
    print(f"\nserver start (Chromium launch + probe): {start_s:.2f} s; export_all of both figures on the warm "
          f"server: {all_s:.2f} s")
    out = harness.write_json(args.out, dict(server_start_s=start_s, export_all_s=all_s, results=rows),
                             reps=args.reps, export_versions=ex.versions(), browser=ex.browser_path(),
                             note="one export = PDF + SVG + PNG (single column, 300 dpi) + JSON + CSV; first_export_s "
                                  "of the first figure includes the server start")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
