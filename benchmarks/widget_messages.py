"""What a figure's update costs on its way to the browser: plotly's serializer against the workbench's (issue 24).

For a heatmap of each size (``[rows, columns]``, float64, as the panels draw them), one ``plotly_update``
message (the new ``z``) is serialized as ipywidgets sends it: the trait's ``to_json``, buffers split out,
the rest written as JSON. Reported per serializer: the median time of that (Python side), the JSON bytes, the
binary bytes and the number of buffers. ``plotly``: plotly's ``_py_to_js`` (a 2-D array as JSON lists);
``workbench``: ``workbench.show.figure_widget._to_js`` (one binary buffer per row). The browser's side (parsing
JSON numbers against wrapping buffers) is not timed here; ``benchmarks/browser_latency.py`` times slider →
painted end to end.

    python benchmarks/widget_messages.py [--sizes 30x9 512x512 1024x1024 2048x2048] [--reps 5]

Prints a markdown table and writes ``benchmarks/out/widget_messages.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import _harness as harness
import numpy as np
from ipywidgets.widgets.widget import _remove_buffers
from plotly.serializers import _py_to_js

from workbench.show.figure_widget import _to_js

OUT = Path(__file__).resolve().parent / "out"


def one(serializer, z: np.ndarray, reps: int) -> dict:
    msg = {"restyle_data": {"z": [z]}, "relayout_data": {}, "trace_indexes": [0]}
    times, js, bufs = [], "", []
    for _ in range(reps):
        t = time.perf_counter()
        state, _paths, bufs = _remove_buffers({"_py2js_update": serializer(msg, None)})
        js = json.dumps(state, allow_nan=True)
        times.append((time.perf_counter() - t) * 1e3)
    return dict(median_ms=statistics.median(times), json_bytes=len(js.encode()),
                binary_bytes=sum(memoryview(b).nbytes for b in bufs), buffers=len(bufs))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["30x9", "512x512", "1024x1024", "2048x2048"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(OUT / "widget_messages.json"))
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    for size in args.sizes:
        r, c = (int(x) for x in size.lower().split("x"))
        z = rng.random((r, c))
        for name, f in (("plotly", _py_to_js), ("workbench", _to_js)):
            rows.append(dict(size=size, serializer=name, **one(f, z, args.reps)))
    print("| heatmap | serializer | median ms | JSON bytes | binary bytes | buffers |")
    print("| --- | --- | --- | --- | --- | --- |")
    for x in rows:
        print(f"| {x['size']} | {x['serializer']} | {x['median_ms']:.1f} | {x['json_bytes']:,} | {x['binary_bytes']:,} "
              f"| {x['buffers']} |")
    for size in args.sizes:
        a, b = (next(x for x in rows if x["size"] == size and x["serializer"] == s) for s in ("plotly", "workbench"))
        print(f"{size}: {a['median_ms'] / max(b['median_ms'], 1e-9):.1f}x faster, "
              f"{(a['json_bytes'] + a['binary_bytes']) / (b['json_bytes'] + b['binary_bytes']):.2f}x fewer bytes")
    out = harness.write_json(args.out, rows, reps=args.reps, sizes=args.sizes)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
