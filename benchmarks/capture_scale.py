"""Capture memory at research shape on the CPU (issue 14): a random-weight 2-layer Llama-3.1-8B-shape model.

Layers as in Llama-3.1-8B (hidden 4096, 32 query heads, 8 KV heads, head dim 128, MLP 14336), 2 of them, and a
1024-token vocabulary (the embedding is not what is measured; the full one would add 4 GB of weights). At each
``--T``, with 8 observer + 32 audit rows (the query as audit population):

- host bytes of the rows in float32 and in float16 (the ratio must be 0.5);
- peak RSS above the level before the run (sampled every 2 ms) of a plain prefill, and of the prefill with
  capture in float32 and float16;
- the largest block of rows the recorder held on the model's device at once (``device_peak_rows``) against
  one layer's float32 rows ``H_Q · R · T · 4``; on the CPU the device is the host, so the sampled peak above
  the plain prefill, minus the stored rows, is the working set of the capture;
- the analytics on the float16 capture against float32: max |Δμ| / μ, max |ΔH| over valid heads, and
  whether the trace decides the same.

    python benchmarks/capture_scale.py [--T 2048 4096 8192] [--out benchmarks/out/capture_scale.json]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _harness as harness  # noqa: E402
from _memory import PeakRSS  # noqa: E402
from gpu import build_model, layout  # noqa: E402

from workbench.analyse.params import EntroPrefillParams  # noqa: E402
from workbench.analyse.procedure import trace  # noqa: E402
from workbench.capture import Capture, RowSet, capture_attention  # noqa: E402
from workbench.run.adapter import model_shape  # noqa: E402


@torch.no_grad()
def capture(model, spans, dtype: str):
    rows = RowSet(tail=0).rows(spans)
    ids = torch.tensor([spans.input_ids])
    with PeakRSS() as m:
        t = time.perf_counter()
        with capture_attention(model, [p for _, p in rows], K=spans.T, T=spans.T, dtype=dtype) as rec:
            model(input_ids=ids, logits_to_keep=1)
        s = time.perf_counter() - t
    shape = model_shape(model)
    cap = Capture(attn=rec.attn, row_pos=rec.row_pos, row_kind=[k for k, _ in rows], head_group=shape.head_group(),
                  vnorm_max=rec.vnorm_max, spans=spans, model_id="llama-3.1-8b-shape (2 layers, random)")
    return cap, m.peak - m.base, rec.device_peak_rows, s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[2048, 4096, 8192])
    ap.add_argument("--intermediate", type=int, default=14336,
                    help="MLP width (the rows depend only on the attention shape; a narrower MLP makes the CPU prefill affordable)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "capture_scale.json"))
    a = ap.parse_args(argv)
    model = build_model(layers=2, dtype=torch.float32, impl="sdpa", device="cpu", smoke=False, vocab=1024,
                        intermediate=a.intermediate)
    shape = model_shape(model)
    params = EntroPrefillParams(eps_row=0.2, target=0.3, streak=0, eps_audit=0.3)
    out = []
    for T in a.T:
        spans = layout(T, shape.vocab)
        ids = torch.tensor([spans.input_ids])
        with torch.no_grad():
            model(input_ids=ids, logits_to_keep=1)  # warm-up
            with PeakRSS() as mp:
                t = time.perf_counter()
                model(input_ids=ids, logits_to_keep=1)
                plain_s = time.perf_counter() - t
        c32, x32, d32, s32 = capture(model, spans, "float32")
        c16, x16, d16, s16 = capture(model, spans, "float16")
        R = c32.attn.shape[2]
        layer = shape.H_Q * R * T * 4
        h32, h16 = c32.attn.numel() * 4, c16.attn.numel() * 2
        t32, t16 = trace(c32, params, certify=False), trace(c16, params, certify=False)
        mu32, mu16 = t32.pooling.mu, t16.pooling.mu
        ok = t32.pooling.valid_head
        r = dict(T=T, intermediate=a.intermediate, L=shape.L, H_Q=shape.H_Q, G=shape.G, d=shape.d, rows=R, plain_prefill_s=plain_s,
                 capture_fp32_s=s32, capture_fp16_s=s16, host_rows_fp32=h32, host_rows_fp16=h16,
                 host_ratio=h16 / h32, plain_peak_extra=mp.peak - mp.base, capture_fp32_peak_extra=x32,
                 capture_fp16_peak_extra=x16, device_peak_rows_fp32=d32, device_peak_rows_fp16=d16,
                 one_layer_rows_fp32=layer,
                 mu_max_rel_err=float(((mu16 - mu32).abs() / mu32.abs().clamp_min(1e-30)).max()),
                 H_max_abs_err=float((t16.pooling.H[ok] - t32.pooling.H[ok]).abs().max()) if ok.any() else 0.0,
                 same_decision=(t16.l_star, t16.removed) == (t32.l_star, t32.removed))
        out.append(r)
        print(f"T={T}: rows {R}; host rows fp32 {h32 / 2**20:.1f} MiB, fp16 {h16 / 2**20:.1f} MiB (ratio {h16 / h32:.3f}); "
              f"peak RSS above start: plain {r['plain_peak_extra'] / 2**20:.0f} MiB, capture fp32 {x32 / 2**20:.0f}, fp16 "
              f"{x16 / 2**20:.0f} MiB; rows held at once {d16 / 2**20:.1f} MiB <= one layer fp32 {layer / 2**20:.1f} MiB; "
              f"time plain {plain_s:.1f} s, capture fp32 {s32:.1f} s, fp16 {s16:.1f} s; fp16 vs fp32: max rel dmu "
              f"{r['mu_max_rel_err']:.2e}, max |dH| {r['H_max_abs_err']:.2e}, same decision {r['same_decision']}", flush=True)
        del c32, c16
    harness.write_json(a.out, dict(results=out))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
