"""Slider latency of the analytics (issue 3): recompute everything from a capture after one change.

A capture of a T = 2048 prompt on the default model (8 observers, the 32-token query as audit
population), then, for a sweep of slider values (ζ, τ, ε_s, λ, budget, row tolerance), the time of
one full recomputation: pooling (§2) → priorities (§3) → mass table and greedy proposal for every
monitored layer (§5) → stability and audit → the layer decision (§6), plus the envelope (§4) of the
decided (or last) layer. The LP certificate (HiGHS) is timed separately per layer.

    python benchmarks/analytics.py [--T 2048] [--n 60] [--out benchmarks/out/analytics.json]

At research scale (issue 14), with no model: a synthetic capture of the Llama-3.1-8B shape (L = 32,
H_Q = 32, G = 8; ``Capture.synthetic(structure="realistic")``, rows stored in ``--dtype``) with 256-token
chunks, a 32-token query as audit population and 8 observers, at each ``--T``; per slider the median and
p95 of the recompute, the first (cache-building) trace, and the process's peak host memory:

    python benchmarks/analytics.py --shape llama3-8b --T 8192 32768 [--dtype float16] [--n 60]
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import torch

sys_path = Path(__file__).resolve().parent
import sys  # noqa: E402

sys.path.insert(0, str(sys_path))
import _harness as harness  # noqa: E402
from prune import layout  # noqa: E402  (same T-token layout as the prune benchmark)


def recompute(cap, params):
    from workbench.analyse.envelope import envelope
    from workbench.analyse.procedure import trace

    tr = trace(cap, params, certify=False)
    l = tr.l_star if tr.l_star is not None else tr.layers[-1]
    removed = tr.removed if tr.l_star is not None else list(tr.selections.get(l).removed if l in tr.selections else [])
    env = envelope(cap.observer_attn()[l], tr.pooling.mu[l], tr.pooling.omega[l], cap.spans.removal_mask(removed))
    return tr, env


SHAPES = {"llama3-8b": dict(L=32, H_Q=32, G=8)}


def synthetic_layout(T: int, chunk: int = 256, query_len: int = 32):
    """A ``T``-token synthetic prompt: 6 protected tokens, chunks of ``chunk`` tokens (1-token gaps), the
    query, then template tokens up to ``T``."""
    from workbench.run.spans import PromptSpans

    k = (T - 6 - query_len - 3) // (chunk + 1)
    return PromptSpans.synthetic([chunk] * k, query_len=query_len, suffix=T - 6 - query_len - (chunk + 1) * k)


def slider_draws(rng):
    return {
        "zeta": lambda: dict(zeta=float(rng.uniform(0.05, 1.0))),
        "tau": lambda: dict(tau=float(10 ** rng.uniform(-2, 1))),
        "eps_s": lambda: dict(eps_s=float(10 ** rng.uniform(-3, 0))),
        "lam": lambda: dict(lam=float(rng.uniform(0, 2))),
        "target": lambda: dict(target=float(rng.uniform(0.05, 0.9))),
        "eps_row": lambda: dict(eps_row=float(rng.uniform(0.01, 0.5))),
    }


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main_shape(a):
    """The research-scale run (no model): synthetic 8B-shape captures at each ``--T``."""
    from workbench.analyse.params import EntroPrefillParams
    from workbench.capture import Capture

    shape = SHAPES[a.shape]
    base = EntroPrefillParams(eps_row=0.2, target=0.3, streak=0, eps_audit=0.3)
    out = []
    for T in a.T:
        spans = synthetic_layout(T)
        t0 = time.perf_counter()
        cap = Capture.synthetic(spans, **shape, extra_rows={"audit": list(range(*spans.query))},
                                structure="realistic", dtype=a.dtype, seed=0)
        gen_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        recompute(cap, base)  # builds the per-capture caches
        first_s = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        per, allt = {}, []
        for name, draw in slider_draws(rng).items():
            ts = []
            for _ in range(max(2, a.n // 6)):
                p = base.replace(**draw())
                t = time.perf_counter()
                recompute(cap, p)
                ts.append((time.perf_counter() - t) * 1e3)
            per[name] = dict(median_ms=float(np.median(ts)), p95_ms=float(np.percentile(ts, 95)), n=len(ts))
            allt += ts
        res = dict(shape=a.shape, **shape, T=T, k=spans.k, rows=int(cap.attn.shape[2]), dtype=a.dtype,
                   attn_gib=cap.attn.numel() * cap.attn.element_size() / 2**30, generate_s=gen_s,
                   first_trace_s=first_s, recompute_median_ms=float(np.median(allt)),
                   recompute_p95_ms=float(np.percentile(allt, 95)), per_slider=per, n=len(allt),
                   peak_rss_mib=peak_rss_mib(), targets=dict(median_ms="<= 100 at 32k", p95_ms="<= 200 at 32k",
                                                             peak_host="<= 16 GiB"))
        out.append(res)
        print(f"{a.shape} T={T} k={spans.k} rows={res['rows']} {a.dtype} ({res['attn_gib']:.2f} GiB): generate "
              f"{gen_s:.1f} s, first trace {first_s:.1f} s, recompute median {res['recompute_median_ms']:.1f} ms, "
              f"p95 {res['recompute_p95_ms']:.1f} ms (n={len(allt)}), peak RSS {res['peak_rss_mib']:.0f} MiB", flush=True)
        print("  " + ", ".join(f"{k} {v['median_ms']:.0f}/{v['p95_ms']:.0f}" for k, v in per.items()) + " ms (median/p95)")
        del cap
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, nargs="+", default=[2048])
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="synthetic capture of a research shape")
    ap.add_argument("--dtype", default="float16", help="row storage dtype of the synthetic capture (--shape)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "analytics.json"))
    a = ap.parse_args()
    if a.shape:
        torch.set_num_threads(1)
        res = main_shape(a)
        harness.write_json(a.out, dict(results=res))
        print(f"wrote {a.out}")
        return
    a.T = a.T[0]
    from workbench.analyse.params import EntroPrefillParams
    from workbench.analyse.selection import lp_certificate, mass_table
    from workbench.capture import RowSet, run_capture
    from workbench.run.models import load_model

    lm = load_model(device="cpu", progress=False)
    spans = layout(lm.tokenizer, a.T)
    t0 = time.perf_counter()
    cap = run_capture(lm, spans, RowSet(tail=0), progress=False)
    capture_s = time.perf_counter() - t0
    base = EntroPrefillParams(eps_row=0.2, target=0.3, streak=0, eps_audit=0.3)
    rng = np.random.default_rng(0)
    sliders = {
        "zeta": lambda: dict(zeta=float(rng.uniform(0.05, 1.0))),
        "tau": lambda: dict(tau=float(10 ** rng.uniform(-2, 1))),
        "eps_s": lambda: dict(eps_s=float(10 ** rng.uniform(-3, 0))),
        "lam": lambda: dict(lam=float(rng.uniform(0, 2))),
        "target": lambda: dict(target=float(rng.uniform(0.05, 0.9))),
        "eps_row": lambda: dict(eps_row=float(rng.uniform(0.01, 0.5))),
    }
    recompute(cap, base)  # warm-up
    times, per = [], {}
    for name, draw in sliders.items():
        ts = []
        for _ in range(a.n // len(sliders) + 1):
            p = base.replace(**draw())
            t = time.perf_counter()
            recompute(cap, p)
            ts.append(time.perf_counter() - t)
        per[name] = statistics.median(ts) * 1e3
        times += ts
    ms = np.array(times) * 1e3
    # LP certificate separately: every monitored layer once
    m = mass_table(cap.observer_attn(), cap.spans)
    lp = []
    for l in base.monitored_layers(cap.L):
        t = time.perf_counter()
        lp_certificate(cap.spans.n, m[l], 0.2, 1)
        lp.append(time.perf_counter() - t)
    res = dict(T=a.T, k=cap.spans.k, rows=int(cap.attn.shape[2]), capture_s=capture_s,
               recompute_median_ms=float(np.median(ms)), recompute_p95_ms=float(np.percentile(ms, 95)),
               recompute_max_ms=float(ms.max()), per_slider_median_ms=per, n=len(ms),
               lp_per_layer_median_ms=statistics.median(lp) * 1e3, lp_all_layers_ms=sum(lp) * 1e3,
               targets=dict(median_ms="<= 50", p95_ms="<= 100"))
    print(f"T={a.T} k={cap.spans.k}: recompute median {res['recompute_median_ms']:.1f} ms, "
          f"p95 {res['recompute_p95_ms']:.1f} ms (n={len(ms)}); per slider {json.dumps({k: round(v, 1) for k, v in per.items()})}")
    print(f"LP certificate: {res['lp_per_layer_median_ms']:.1f} ms per layer (median), "
          f"{res['lp_all_layers_ms']:.0f} ms for all {len(lp)} monitored layers")
    harness.write_json(a.out, dict(results=res))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
