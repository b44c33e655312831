"""Pruned prefill: measured prefill time against the FLOP model's predicted ratio (issue 4).

At T = 2048 on the default model (CPU fp32), for a grid of ``l*`` and ``T'/T``: the wall time of the
pruned prefill (explicit removal set, the gather after ``l*``) against the full prefill, timed
alternately in one run (median of reps), and the FLOP model's ``F_EP / F_full`` for the same
setting (capture rows included in ``F_aux``). Peak memory (peak-RSS increase over a plain warm-up in
a fresh subprocess) of the full and the pruned prefill at ``l* = L/3``, ``T' = T/2``.

    python benchmarks/prune.py [--T 2048] [--reps 3] [--out benchmarks/out/prune.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import _harness as harness

CHUNK = 64


def layout(tok, T: int):
    """Real tokens, protected prefix 16, chunks of 64 tokens, a 32-token query at the end."""
    from workbench.run.examples import load_example
    from workbench.run.spans import PromptSpans

    ex = load_example()
    base = tok(" ".join(ex.documents) + " ", add_special_tokens=False)["input_ids"]
    ids = (base * (T // len(base) + 1))[:T]
    q0 = T - 32
    chunks = [(s, s + CHUNK) for s in range(16, q0 - CHUNK + 1, CHUNK)]
    return PromptSpans(T=T, input_ids=tuple(ids), tokens=tuple("" for _ in ids), chunks=tuple(chunks),
                       chunk_doc=tuple(range(len(chunks))), documents=tuple(chunks), protected_docs=(),
                       query=(q0, T), instruction=None, n_sink=4, observers=tuple(range(T - 8, T)))


def removal_for(spans, keep: float) -> list[int]:
    """Every other chunk first, then the rest, until ``T'/T ≤ keep``."""
    k = spans.k
    order = list(range(0, k, 2)) + list(range(1, k, 2))
    out, T, removed = [], spans.T, 0
    for i in order:
        if (T - removed) / T <= keep:
            break
        out.append(i)
        removed += CHUNK
    return sorted(out)


def main_timing(T: int, reps: int, l_stars, keeps):
    from workbench.analyse.cost import CostModel
    from workbench.rerun.prune import run_full, run_pruned
    from workbench.run.models import load_model

    lm = load_model(device="cpu", progress=False)
    spans = layout(lm.tokenizer, T)
    cm = CostModel(lm.shape)
    rows_captured = spans.W_p + (spans.query[1] - spans.query[0])
    run_full(lm, spans, max_new_tokens=1)  # warm-up
    out = []
    for l in l_stars:
        for keep in keeps:
            E = removal_for(spans, keep)
            Tp = T - CHUNK * len(E)
            tf, tp = [], []
            for _ in range(reps):
                tf.append(run_full(lm, spans, max_new_tokens=1).prefill_s)
                r = run_pruned(lm, spans, layer=l, removed=E, max_new_tokens=1, progress=False)
                tp.append(r.prefill_s)
                assert r.T_prime == Tp
            measured = statistics.median(tp) / statistics.median(tf)
            predicted = float(cm.pruned(T, Tp, l, rows_captured, l + 1) / cm.full(T))
            rec = dict(T=T, l_star=l, keep_fraction=Tp / T, T_prime=Tp, full_s=statistics.median(tf),
                       pruned_s=statistics.median(tp), measured_ratio=measured, predicted_ratio=predicted,
                       measured_over_predicted=measured / predicted, speedup=1 / measured)
            out.append(rec)
            print(f"l*={l:3d} T'/T={Tp / T:.3f}  full {rec['full_s']:.2f}s  pruned {rec['pruned_s']:.2f}s  "
                  f"measured {measured:.3f}  predicted {predicted:.3f}  meas/pred {rec['measured_over_predicted']:.3f}  "
                  f"speed-up {rec['speedup']:.2f}x", flush=True)
    return out


def memory_child(T: int, mode: str, l: int, keep: float):
    """One prefill in a fresh process; peak RSS above the level just before it (sampled, see _memory)."""
    from _memory import PeakRSS

    from workbench.rerun.prune import run_full, run_pruned
    from workbench.run.models import load_model

    lm = load_model(device="cpu", progress=False)
    spans = layout(lm.tokenizer, T)
    run_full(lm, spans, max_new_tokens=1)  # warm-up: allocator pools and lazy state settle
    if mode == "pruned":
        run_pruned(lm, spans, layer=l, removed=removal_for(spans, keep), max_new_tokens=1, progress=False)
    with PeakRSS() as m:
        if mode == "full":
            r = run_full(lm, spans, max_new_tokens=1)
        else:
            r = run_pruned(lm, spans, layer=l, removed=removal_for(spans, keep), max_new_tokens=1, progress=False)
    print(json.dumps(dict(extra_peak_mib=m.extra_mib, kv_mib=r.kv_bytes / 2**20)))


def measure_memory(T: int, l: int, keep: float) -> dict:
    mem = {}
    for mode in ("full", "pruned"):
        r = subprocess.run([sys.executable, __file__, "--child", mode, "--T", str(T), "--layer", str(l),
                            "--keep", str(keep)], capture_output=True, text=True, check=True)
        mem[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"peak RSS above the level before the prefill, l*={l}, T'/T={keep}: "
          f"full {mem['full']['extra_peak_mib']:.1f} MiB (KV {mem['full']['kv_mib']:.1f} MiB), "
          f"pruned {mem['pruned']['extra_peak_mib']:.1f} MiB (KV {mem['pruned']['kv_mib']:.1f} MiB)")
    return mem


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--l-stars", type=int, nargs="+", default=None)
    ap.add_argument("--keeps", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "prune.json"))
    ap.add_argument("--child", choices=["full", "pruned"])
    ap.add_argument("--layer", type=int, default=10)
    ap.add_argument("--keep", type=float, default=0.5)
    ap.add_argument("--memory-only", action="store_true", help="only the memory measurement (prints, no JSON)")
    a = ap.parse_args()
    if a.child:
        return memory_child(a.T, a.child, a.layer, a.keep)
    L = 30
    if a.memory_only:
        measure_memory(a.T, L // 3 - 1, 0.5)
        return None
    l_stars = a.l_stars or [-1, L // 3 - 1, L // 2 - 1, 2 * L // 3 - 1]
    rows = main_timing(a.T, a.reps, l_stars, a.keeps)
    mem = measure_memory(a.T, L // 3 - 1, 0.5)
    harness.write_json(a.out, dict(results=rows, memory_mib=mem),
                       note="l* = 9 is 'L/3' (the gather after 10 of 30 blocks)",
                       targets=dict(measured_over_predicted="within 15%", speedup_at_L3_half=">= 1.4"))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
