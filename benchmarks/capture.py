"""Capture overhead and memory on the default model (issue: foundation).

For T = 512, 1024, 2048: plain sdpa prefill (``logits_to_keep=1``) against the same prefill with
capture of 8 observer + 16 audit + 32 tail rows, timed alternately in one run (median of reps), and
the peak memory of capture against eager ``output_attentions``: measured as the peak-RSS increase of a
fresh subprocess over its own plain prefill, plus the bytes each method must hold for its output.

    python benchmarks/capture.py [--T 512 1024 2048] [--reps 5] [--out benchmarks/out/capture.json]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _harness as harness
import torch

ROWS = dict(observer=8, audit=16, tail=32)


def _ids_of_length(tok, T: int) -> list[int]:
    from workbench.run.examples import load_example

    ex = load_example()
    text = " ".join(ex.documents) + " "
    base = tok(text, add_special_tokens=False)["input_ids"]
    return (base * (T // len(base) + 1))[:T]


def _spans(ids):
    from workbench.run.spans import PromptSpans

    T = len(ids)
    return PromptSpans(T=T, input_ids=tuple(ids), tokens=tuple("" for _ in ids), chunks=(), chunk_doc=(),
                       documents=(), protected_docs=(), query=(T - 24, T), instruction=None, n_sink=4,
                       observers=tuple(range(T - 8, T)))


def _rowset(T):
    from workbench.capture import RowSet

    audit = tuple(range(T - 24 - 16 * 8, T - 24, 8))  # 16 positions spread before the tail
    return RowSet(observers=True, audit=audit, tail=ROWS["tail"])


def time_one(T: int, reps: int) -> dict:
    from workbench.capture import run_capture
    from workbench.run import adapter
    from workbench.run.models import load_model

    lm = load_model(device="cpu", progress=False)
    ids = _ids_of_length(lm.tokenizer, T)
    x = torch.tensor([ids])
    spans, rows = _spans(ids), _rowset(T)

    def plain():
        with torch.no_grad():
            adapter.forward(lm.model, x, cache=adapter.new_cache(lm.model), logits_to_keep=1)

    def cap():
        run_capture(lm, spans, rows, progress=False)

    plain(), cap()  # warm-up
    tp, tc = [], []
    for _ in range(reps):
        for fn, acc in ((plain, tp), (cap, tc)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    ratios = [c / p for c, p in zip(tc, tp)]
    return dict(T=T, plain_s=statistics.median(tp), capture_s=statistics.median(tc),
                ratio_median=statistics.median(ratios), ratio_of_medians=statistics.median(tc) / statistics.median(tp),
                rows=sum(ROWS.values()), reps=reps)


def memory_child(T: int, mode: str) -> None:
    """Run in a subprocess: peak-RSS increase of ``mode`` over a plain prefill, in MiB."""
    from workbench.capture import run_capture
    from workbench.run import adapter
    from workbench.run.models import load_model

    lm = load_model(device="cpu", progress=False)
    ids = _ids_of_length(lm.tokenizer, T)
    x = torch.tensor([ids])
    with torch.no_grad():
        adapter.forward(lm.model, x, cache=adapter.new_cache(lm.model), logits_to_keep=1)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if mode == "capture":
        c = run_capture(lm, _spans(ids), _rowset(T), progress=False)
        held = c.attn.numel() * 4
    else:
        out = adapter.eager_attentions(lm.model, x, logits_to_keep=1)
        held = sum(a.numel() * a.element_size() for a in out.attentions)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(dict(extra_peak_mib=(peak - base) / 1024, held_mib=held / 2**20)))


def memory(T: int) -> dict:
    res = {}
    for mode in ("capture", "eager"):
        r = subprocess.run([sys.executable, __file__, "--child", mode, "--T", str(T)], capture_output=True,
                           text=True, check=True)
        res[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    return dict(
        capture_extra_peak_mib=res["capture"]["extra_peak_mib"], eager_extra_peak_mib=res["eager"]["extra_peak_mib"],
        capture_held_mib=res["capture"]["held_mib"], eager_held_mib=res["eager"]["held_mib"],
        peak_fraction=res["capture"]["extra_peak_mib"] / max(res["eager"]["extra_peak_mib"], 1e-9),
        held_fraction=res["capture"]["held_mib"] / res["eager"]["held_mib"],
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, nargs="+", default=[512, 1024, 2048])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "capture.json"))
    ap.add_argument("--child", choices=["capture", "eager"])
    a = ap.parse_args()
    if a.child:
        return memory_child(a.T[0], a.child)
    rows = []
    for T in a.T:
        r = time_one(T, a.reps)
        r.update(memory(T))
        rows.append(r)
        print(f"T={T:5d}  plain {r['plain_s']:.3f}s  capture {r['capture_s']:.3f}s  ratio {r['ratio_median']:.3f}  "
              f"| extra peak: capture {r['capture_extra_peak_mib']:.1f} MiB, eager {r['eager_extra_peak_mib']:.1f} MiB "
              f"({100 * r['peak_fraction']:.1f}%)  held: {r['capture_held_mib']:.1f} vs {r['eager_held_mib']:.1f} MiB "
              f"({100 * r['held_fraction']:.2f}%)", flush=True)
    harness.write_json(a.out, dict(results=rows), targets=dict(ratio_at_2048="<= 1.10", memory_fraction="<= 0.05"))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
