"""Eviction memory at research shape on the CPU (issue 14): a random-weight 2-layer Llama-3.1-8B-shape model.

The model of ``capture_scale.py`` (hidden 4096, 32 query heads, 8 KV heads, head dim 128, 2 layers, fp32, sdpa;
a narrow MLP and a small vocabulary, which the KV cache does not depend on). At each ``--T``:

- the prefill with SnapKV's evidence (``Needs(tail=32)``: the last 32 rows of every layer), its time and the
  sampled peak RSS above the start;
- SnapKV at ``B = T/4``: the KV bytes of the compacted cache against the full cache's (``kv_bytes_after`` /
  ``kv_bytes_full``, and the formula ``2·L·G·d·4·B``), the peak RSS of the eviction and its decode above the level
  after the prefill, and the decode step time against the full cache's.

    python benchmarks/eviction_scale.py [--T 8192 32768] [--out benchmarks/out/eviction_scale.json]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _harness as harness  # noqa: E402
from _memory import PeakRSS, rss_bytes  # noqa: E402
from gpu import build_model, layout  # noqa: E402

from workbench.rerun.eviction import EvictionSession, FullCache, Needs, SnapKV  # noqa: E402
from workbench.run.adapter import model_shape  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--steps", type=int, default=3, help="decode steps per cache")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "eviction_scale.json"))
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = build_model(layers=2, dtype=torch.float32, impl="sdpa", device="cpu", smoke=False, vocab=1024,
                        intermediate=1024)
    shape = model_shape(model)
    out = []
    for T in a.T:
        ids = list(layout(T, shape.vocab).input_ids)
        start = rss_bytes()
        with PeakRSS() as mp:
            t = time.perf_counter()
            sess = EvictionSession.prepare(model, ids, Needs(tail=32), a.steps + 1, reusable=True, progress=False)
            prefill_s = time.perf_counter() - t
        after_prefill = rss_bytes()
        B = T // 4
        full = sess.run(FullCache(), T)
        with PeakRSS() as me:
            snap = sess.run(SnapKV(), B)
        r = dict(T=T, L=shape.L, H_Q=shape.H_Q, G=shape.G, d=shape.d, budget=B, prefill_with_evidence_s=prefill_s,
                 prefill_peak_extra=mp.peak - start, after_prefill_extra=after_prefill - start,
                 evict_decode_peak_extra=me.peak - me.base,
                 kv_bytes_full=full.kv_bytes_after, kv_bytes_b25=snap.kv_bytes_after,
                 kv_bytes_b25_formula=2 * shape.L * shape.G * shape.d * 4 * B,
                 kv_ratio=snap.kv_bytes_after / full.kv_bytes_after,
                 decode_step_full_ms=1e3 * statistics.median(full.step_s),
                 decode_step_b25_ms=1e3 * statistics.median(snap.step_s))
        out.append(r)
        print(f"T={T}: prefill with evidence {prefill_s:.1f} s (peak +{r['prefill_peak_extra'] / 2**20:.0f} MiB); "
              f"KV full {r['kv_bytes_full'] / 2**20:.1f} MiB, SnapKV B=T/4 {r['kv_bytes_b25'] / 2**20:.1f} MiB "
              f"(ratio {r['kv_ratio']:.3f}; formula {r['kv_bytes_b25_formula'] / 2**20:.1f} MiB); eviction + decode "
              f"peak +{r['evict_decode_peak_extra'] / 2**20:.0f} MiB above the prefill's level; decode step full "
              f"{r['decode_step_full_ms']:.1f} ms, B=T/4 {r['decode_step_b25_ms']:.1f} ms", flush=True)
        del sess, full, snap
    harness.write_json(a.out, dict(results=out))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
