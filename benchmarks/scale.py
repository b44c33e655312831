"""Scaling of the analytics, the widgets and export with T (issue 14), on synthetic 8B-shape captures.

For each ``--T`` (default 2k, 8k, 32k): a synthetic Llama-3.1-8B-shape capture (L = 32, H_Q = 32, G = 8,
realistic sinks/locality, 8 observers + the 32-token query, rows in float16), then

- analytics: the first trace (per-capture caches) and the median/p95 recompute over the six sliders
  (``benchmarks/analytics.py``'s recompute: full per-layer trace + the decided layer's envelope);
- widgets: the heads and pages panels, median server-side total per slider move, and the largest message a
  move sends (JSON bytes of the widget messages);
- export: a token-level figure (the residual heatmap of one layer) to PDF + SVG + PNG with its CSV holding
  every key, time and CSV rows;

and the growth exponent of every cost, fitted by least squares on ``log cost = a + b log T``.

    python benchmarks/scale.py [--T 2048 8192 32768] [--n 12] [--out benchmarks/out/scale.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _harness as harness  # noqa: E402
from analytics import SHAPES, peak_rss_mib, recompute, slider_draws, synthetic_layout  # noqa: E402
from plotly.utils import PlotlyJSONEncoder  # noqa: E402

from workbench.analyse.params import EntroPrefillParams  # noqa: E402
from workbench.capture import Capture  # noqa: E402
from workbench.show import export as ex  # noqa: E402
from workbench.show import plots  # noqa: E402
from workbench.show import widgets as Wd  # noqa: E402


class _Enc(PlotlyJSONEncoder):
    def default(self, o):
        try:
            return super().default(o)
        except TypeError:
            return None


def _spy(panel, sizes):
    for fw in panel.figures.values():
        for name in ("_send_update_msg", "_send_restyle_msg", "_send_relayout_msg", "_send_addTraces_msg"):
            orig = getattr(fw, name)

            def spy(*args, _orig=orig, **kw):
                sizes.append(len(json.dumps([args, kw], cls=_Enc)))
                return _orig(*args, **kw)

            setattr(fw, name, spy)


def widgets(cap, base, moves: int) -> dict:
    out = {}
    for name, make, sliders in (("heads", lambda: Wd.HeadsPanel(cap, base), ("zeta", "tau", "layer")),
                                ("pages", lambda: Wd.PagesPanel(cap, base), ("zeta", "tau", "K", "page", "layer"))):
        panel = make()
        sizes, totals = [], []
        _spy(panel, sizes)
        for s in sliders:
            w = panel.controls[s]
            for i in range(moves):
                v = w.min + (w.max - w.min) * (i + 0.5) / moves
                v = int(round(v)) if isinstance(w.value, int) else v
                if hasattr(w, "base"):
                    v = w.base ** v
                before = panel.n_updates
                w.value = v
                if panel.n_updates > before:
                    totals.append(panel.timings["total_ms"])
        out[name] = dict(median_total_ms=statistics.median(totals), p95_total_ms=float(np.percentile(totals, 95)),
                         moves=len(totals), max_message_bytes=max(sizes) if sizes else 0)
    return out


def export_time(cap, base, tmp: Path) -> dict:
    pool = base.pooling()(cap)
    fig = plots.residual_distribution(pool, cap.L // 2, cap.spans)
    ex.ensure_server()
    ex.export(plots.residual_distribution(pool, 0, cap.spans), tmp / "warm")  # Chromium up, fonts loaded
    t = time.perf_counter()
    paths = ex.export(fig, tmp / f"residual-{cap.T}")
    s = time.perf_counter() - t
    csv = [p for p in paths if str(p).endswith(".csv")][0]
    with open(csv) as f:
        rows = sum(1 for _ in f) - 1
    return dict(export_s=s, csv_rows=rows, csv_expected=cap.H_Q * (cap.T - cap.spans.n_sink))


def fit_exponent(Ts, ys) -> float:
    x, y = np.log(np.asarray(Ts, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(x, y, 1)[0]) if len(Ts) >= 2 else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--n", type=int, default=12, help="recomputes per slider")
    ap.add_argument("--moves", type=int, default=3, help="moves per widget slider")
    ap.add_argument("--no-export", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "scale.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    base = EntroPrefillParams(eps_row=0.2, target=0.3, streak=0, eps_audit=0.3)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for T in a.T:
            spans = synthetic_layout(T)
            t0 = time.perf_counter()
            cap = Capture.synthetic(spans, **SHAPES["llama3-8b"], extra_rows={"audit": list(range(*spans.query))},
                                    structure="realistic", dtype="float16", seed=0)
            gen = time.perf_counter() - t0
            t0 = time.perf_counter()
            recompute(cap, base)
            first = time.perf_counter() - t0
            rng = np.random.default_rng(0)
            ts = []
            for draw in slider_draws(rng).values():
                for _ in range(max(2, a.n // 6)):
                    p = base.replace(**draw())
                    t = time.perf_counter()
                    recompute(cap, p)
                    ts.append((time.perf_counter() - t) * 1e3)
            r = dict(T=T, generate_s=gen, first_trace_s=first, recompute_median_ms=float(np.median(ts)),
                     recompute_p95_ms=float(np.percentile(ts, 95)), widgets=widgets(cap, base, a.moves))
            if not a.no_export:
                r["export"] = export_time(cap, base, Path(tmp))
            r["peak_rss_mib"] = peak_rss_mib()
            rows.append(r)
            print(json.dumps(r), flush=True)
            del cap
        if not a.no_export:
            ex.shutdown_server()
    Ts = [r["T"] for r in rows]
    costs = {"synthetic generation": [r["generate_s"] for r in rows], "first trace (caches)": [r["first_trace_s"] for r in rows],
             "slider recompute (median)": [r["recompute_median_ms"] for r in rows],
             "heads panel move (median)": [r["widgets"]["heads"]["median_total_ms"] for r in rows],
             "pages panel move (median)": [r["widgets"]["pages"]["median_total_ms"] for r in rows]}
    if not a.no_export:
        costs["export of a token-level figure"] = [r["export"]["export_s"] for r in rows]
    print("\n| cost | " + " | ".join(f"T = {T}" for T in Ts) + " | exponent b (cost ∝ T^b) |")
    print("|---|" + "---|" * len(Ts) + "---|")
    fits = {}
    for name, ys in costs.items():
        fits[name] = fit_exponent(Ts, ys)
        print(f"| {name} | " + " | ".join(f"{y:.3g}" for y in ys) + f" | {fits[name]:.2f} |")
    msg = [max(r["widgets"][p]["max_message_bytes"] for p in ("heads", "pages")) for r in rows]
    print("| largest widget message (bytes) | " + " | ".join(str(m) for m in msg) + " | |")
    harness.write_json(a.out, dict(results=rows, exponents=fits))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
