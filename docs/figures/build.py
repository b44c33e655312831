"""Export the figures of ``docs/figures.md`` (single column, PNG at 2x) from synthetic inputs shaped like
the default model (12 layers, 9 query heads in 3 KV groups).

    python docs/figures/build.py after     # writes docs/figures/<name>-after.png

The ``before`` images were written by this script on main's code (commit 38a6f5c) with the tag ``before``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tests"))

from _all_figures import synthetic_inputs  # noqa: E402

from workbench.analyse.envelope import envelope_all_layers  # noqa: E402
from workbench.analyse.pooling import HeadPooling  # noqa: E402
from workbench.analyse.shift import ShiftAnalysis  # noqa: E402
from workbench.show import plots  # noqa: E402
from workbench.show.export import export  # noqa: E402


def heads_vs_tau(cap, layer: int):
    """Notebook 02's figure (``plots.head_weights``): every head's weight against τ, one panel per ζ."""
    grid = []
    for zeta in (1.0, 0.5, 0.2):
        for tau in (0.1, 0.3, 1.0, 3.0):
            w = HeadPooling(zeta=zeta, tau=tau)(cap).w[layer]
            grid += [dict(zeta=zeta, tau=tau, head=f"h{h}", w=float(w[h])) for h in range(cap.H_Q)]
    return plots.head_weights(pd.DataFrame(grid), layer=layer)


def main(tag: str) -> None:
    sp, cap, params, tr = synthetic_inputs()
    l = tr.l_star
    env = envelope_all_layers(cap, tr.pooling, {l: tr.removed})[0]
    figs = {"04-envelope": plots.envelope_rows(env), "07-shift": plots.shift_steps(ShiftAnalysis(k=8)(cap)),
            "07-shift-head": plots.shift_steps(ShiftAnalysis(k=8)(cap), level="head", layer=2),
            "05-trace": plots.trace_layers(tr), "02-heads": heads_vs_tau(cap, 2)}
    for name, fig in figs.items():
        export(fig, HERE / f"{name}-{tag}", width="single", formats=("png",), scale=2.0, csv=False, sidecar=False)
        print(HERE / f"{name}-{tag}.png")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "after")
