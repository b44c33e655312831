"""Torch CPU threads for the report (issue 15): the same report cells at 1 and 2 threads, interleaved
(1, 2, 1, 2 …) in one process so that a changing load hits both alike; prints a table and writes JSON.

    python benchmarks/report_threads.py [--repeats 2] [--out benchmarks/out/report_threads.json]

Cells: full context (32 greedy tokens) on one SQuAD prompt and one 1k-token needle prompt, and an eviction
(SnapKV at 50 %, its own prefill included: ``methods.evict`` runs one cell alone). Report the machine's load beside the numbers: on a shared
machine oversubscribed OpenMP threads can be slower than one.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import _harness as harness
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "report_threads.json"))
    a = ap.parse_args()
    from workbench.run.models import load_model
    from workbench.study import datasets, methods, tasks

    lm = load_model(progress=False)
    items = tasks.squad_single(datasets.load_squad("sample"), n=1, n_distractors=4, seed=0)
    items += tasks.needle(lm.tokenizer, datasets.load_essays("sample"), lengths=(1024,), depths=(0.5,), n=1, seed=0)
    load0 = os.getloadavg()
    times: dict = {}
    for rep in range(a.repeats):
        for th in a.threads:
            torch.set_num_threads(th)
            for it in items:
                for name, fn, p in (("full", methods.run_full_context, {}),
                                    ("evict snapkv@0.5", methods.evict, {"policy": "snapkv", "budget_frac": 0.5})):
                    t0 = time.perf_counter()
                    fn(lm, it, {**p, "max_new_tokens": 32, "seed": 0})
                    times.setdefault((it.task, name, th), []).append(time.perf_counter() - t0)
    load1 = os.getloadavg()
    rows = []
    for (task, name, th), v in sorted(times.items()):
        rows.append(dict(task=task, cell=name, threads=th, median_s=statistics.median(v), runs=len(v)))
    print(f"load average before {load0[0]:.1f}, after {load1[0]:.1f} (2 cores)")
    print("| task | cell | threads | median s | runs |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['task']} | {r['cell']} | {r['threads']} | {r['median_s']:.2f} | {r['runs']} |")
    tot = {th: sum(r["median_s"] for r in rows if r["threads"] == th) for th in a.threads}
    print("total per thread count:", {k: round(v, 2) for k, v in tot.items()})
    harness.write_json(a.out, {"rows": rows, "total": tot, "load_before": load0, "load_after": load1}, indent=1)


if __name__ == "__main__":
    main()
