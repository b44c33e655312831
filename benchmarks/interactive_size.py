"""Size and time of a panel's interactive HTML page (``wb.export_interactive``) at the bundled prompt.

The default model captures the bundled multi-document prompt (the notebooks' capture: 32 tail rows, 3 decode
steps); the priority and head-pooling panels are exported with their first slider (ζ, 21 values) and with the
layer slider (every layer). Reports each page's size (plotly.js inlined: about 4.8 MB of it), its states and the
seconds the export took.

    python benchmarks/interactive_size.py

Prints a markdown table and writes ``benchmarks/out/interactive_size.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import plotly.offline as po

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _harness as harness  # noqa: E402

import workbench as wb  # noqa: E402
from workbench.capture import RowSet, run_capture  # noqa: E402
from workbench.show.widgets import HeadsPanel, PriorityPanel  # noqa: E402

OUT = Path(__file__).parent / "out"
CASES = [(PriorityPanel, None, 21), (PriorityPanel, ["layer"], 40), (HeadsPanel, None, 21), (HeadsPanel, ["layer"], 40)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(OUT / "interactive_size.json"))
    args = ap.parse_args(argv)
    lm = wb.load_model(device="cpu", progress=False)
    prompt = wb.load_example().build(lm.tokenizer, max_context=lm.shape.max_context)
    cap = run_capture(lm, prompt, RowSet(tail=32, n_decode=3), progress=False)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cls, sliders, points in CASES:
            panel = cls(cap)
            t0 = time.perf_counter()
            page, side = panel.export_interactive(Path(tmp) / cls.__name__, sliders=sliders, points=points)
            s = time.perf_counter() - t0
            meta = json.loads(side.read_text())
            rows.append({"panel": cls.__name__, "slider": ", ".join(meta["grid"]), "states": meta["n_states"],
                         "failed": meta["failed_states"], "MB": page.stat().st_size / 1e6, "export_s": s})
    js_mb = len(po.get_plotlyjs().encode()) / 1e6
    print(f"T = {cap.T}, L = {cap.L}; plotly.js inlined: {js_mb:.2f} MB\n")
    print("| panel | slider | states | failed | MB | export s |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['panel']} | {r['slider']} | {r['states']} | {r['failed']} | {r['MB']:.2f} | {r['export_s']:.1f} |")
    out = harness.write_json(args.out, dict(T=cap.T, L=cap.L, plotly_js_mb=js_mb, results=rows))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
