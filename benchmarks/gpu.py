"""Research scale on one accelerator (issue 14): a random-weight model from the Llama-3.1-8B config.

On one CUDA GPU (bf16, sdpa: the capture refuses flash attention, whose kernel takes no mask to read; no
download: the config is written out here and the weights are random) at each ``--T`` (default 8k, 32k and 128k while memory allows):

- capture: plain prefill time, prefill with capture (8 observers + 32 audit rows, rows stored in
  ``--dtype``), their ratio, and the device memory of each (peak allocated above the model);
- pruned prefill at ``l* = L/3`` with ``T' = T/2`` against the full prefill, and the FLOP model's ratio;
- decode: step time and KV bytes with a 25 % budget (SnapKV) against the full cache;
- scoring overhead per policy (capture extra + scores + eviction) against one plain prefill.

Without a GPU it runs the same measurements on the CPU on a 2-layer model (``--smoke``: narrow layers and a
small vocabulary, T = 256 by default), which ``tests/test_benchmarks_smoke.py`` calls. Numbers from the
smoke run say nothing about a GPU; ``benchmarks/RESULTS.md`` records GPU numbers only when measured on one.

    python benchmarks/gpu.py [--T 8192 32768 131072] [--dtype bfloat16] [--impl sdpa eager]
    python benchmarks/gpu.py --smoke [--T 256] [--out benchmarks/out/gpu_smoke.json]
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
from _memory import PeakRSS  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from workbench.analyse.cost import CostModel  # noqa: E402
from workbench.capture import RowSet, run_capture  # noqa: E402
from workbench.rerun.eviction import EvictionSession, FullCache, Needs, SnapKV, default_policies, generate_with_policy  # noqa: E402
from workbench.rerun.prune import run_full, run_pruned  # noqa: E402
from workbench.run.adapter import model_shape  # noqa: E402
from workbench.run.spans import PromptSpans  # noqa: E402

LLAMA31_8B = dict(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192),
    tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
)
"""The published Llama-3.1-8B architecture (``config.json`` of meta-llama/Llama-3.1-8B), no weights."""

SMOKE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             vocab_size=512, num_hidden_layers=2, bos_token_id=1, eos_token_id=2)


def build_model(*, layers: int | None, dtype: torch.dtype, impl: str, device: str, smoke: bool, vocab: int | None = None,
                intermediate: int | None = None):
    """A random-weight Llama-3.1-8B-shaped model (``layers`` decoder layers; ``smoke``: narrow layers)."""
    cfg = dict(LLAMA31_8B, **(SMOKE if smoke else {}))
    if layers is not None:
        cfg["num_hidden_layers"] = layers
    if vocab is not None:
        cfg.update(vocab_size=vocab, bos_token_id=1, eos_token_id=2)
    if intermediate is not None:
        cfg["intermediate_size"] = intermediate
    config = AutoConfig.for_model("llama", **cfg)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=dtype)
    return model.eval()


def layout(T: int, vocab: int, chunk: int = 256, query_len: int = 32) -> PromptSpans:
    """Random token ids in a chunked layout: 6 protected tokens, chunks, a ``query_len`` query, template."""
    chunk = min(chunk, max(8, T // 16))
    k = (T - 6 - query_len - 3) // (chunk + 1)
    sp = PromptSpans.synthetic([chunk] * k, query_len=query_len, suffix=T - 6 - query_len - (chunk + 1) * k)
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(10, vocab, (T,), generator=g).tolist()
    return PromptSpans(**{**sp.__dict__, "input_ids": tuple(ids)})


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DeviceMemory:
    """Peak memory above the level at entry: CUDA's allocator on a GPU, sampled RSS on the CPU."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            self._rss = PeakRSS().__enter__()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.extra = torch.cuda.max_memory_allocated(self.device) - self.base
        else:
            self._rss.__exit__(*exc)
            self.extra = self._rss.peak - self._rss.base


def _timed(fn, device):
    _sync(device)
    t = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - t, out


@torch.no_grad()
def measure(model, T: int, *, reps: int, dtype: str, steps: int, policies: bool) -> dict:
    device = next(model.parameters()).device
    shape = model_shape(model)
    spans = layout(T, shape.vocab)
    ids = torch.tensor([spans.input_ids], device=device)
    rows = RowSet(tail=0)
    plain = lambda: model(input_ids=ids, logits_to_keep=1)  # noqa: E731
    cap = lambda: run_capture(model, spans, rows, progress=False, dtype=dtype)  # noqa: E731
    plain()  # warm-up (kernels, allocator)
    tp, tc = [], []
    for _ in range(reps):  # alternate
        tp.append(_timed(plain, device)[0])
        tc.append(_timed(cap, device)[0])
    with DeviceMemory(device) as m_plain:
        plain()
    with DeviceMemory(device) as m_cap:
        c = cap()
    n_rows = c.attn.shape[2]
    layer_rows = shape.H_Q * n_rows * T * 4
    res = dict(T=T, L=shape.L, H_Q=shape.H_Q, G=shape.G, d=shape.d, rows=n_rows, dtype=dtype,
               plain_prefill_s=statistics.median(tp), capture_prefill_s=statistics.median(tc),
               capture_ratio=statistics.median(tc) / statistics.median(tp),
               device_extra_plain_bytes=m_plain.extra, device_extra_capture_bytes=m_cap.extra,
               capture_rows_host_bytes=c.attn.numel() * c.attn.element_size(), one_layer_rows_fp32_bytes=layer_rows,
               device_kind=device.type)
    del c
    # pruned prefill at l* = L/3, T' = T/2 (every other chunk first) against the cost model
    l_star = max(0, shape.L // 3 - 1) if shape.L >= 3 else 0
    order = list(range(0, spans.k, 2)) + list(range(1, spans.k, 2))
    E, removed = [], 0
    for i in order:
        if T - removed <= T // 2:
            break
        E.append(i)
        removed += spans.chunks[i][1] - spans.chunks[i][0]
    E = sorted(E)
    run_full(model, spans, max_new_tokens=1)
    tf, tpr, Tp = [], [], None
    for _ in range(reps):
        tf.append(run_full(model, spans, max_new_tokens=1).prefill_s)
        r = run_pruned(model, spans, layer=l_star, removed=E, max_new_tokens=1, progress=False)
        tpr.append(r.prefill_s)
        Tp = r.T_prime
    cm = CostModel(shape)
    res.update(l_star=l_star, T_prime=Tp, full_prefill_s=statistics.median(tf), pruned_prefill_s=statistics.median(tpr),
               pruned_measured_ratio=statistics.median(tpr) / statistics.median(tf),
               pruned_predicted_ratio=float(cm.pruned(T, Tp, l_star, spans.W_p + 32, l_star + 1) / cm.full(T)))
    # decode: SnapKV at B = T/4 against the full cache
    B = T // 4
    sess = EvictionSession.prepare(model, list(spans.input_ids), Needs(tail=32), steps + 1, reusable=True, progress=False)
    sess.run(SnapKV(), B)
    st, kv = {"full": [], "snapkv": []}, {}
    for _ in range(reps):
        for pol, b in ((FullCache(), T), (SnapKV(), B)):
            r = sess.run(pol, b)
            st[pol.name] += r.step_s
            kv[pol.name] = r.kv_bytes_after
    del sess
    res.update(budget=B, decode_step_full_ms=1e3 * statistics.median(st["full"]),
               decode_step_b25_ms=1e3 * statistics.median(st["snapkv"]), kv_bytes_full=kv["full"], kv_bytes_b25=kv["snapkv"])
    if policies:
        over = {}
        for p in default_policies():
            if isinstance(p, FullCache):
                continue
            pl = generate_with_policy(model, list(spans.input_ids), FullCache(), T, 1, progress=False).timings["prefill"]
            t = generate_with_policy(model, list(spans.input_ids), p, B, 16 if p.needs().answer else 2, progress=False).timings
            over[p.name] = dict(plain_prefill_s=pl, capture_extra_s=t["prefill"] - pl, score_s=t["score"], evict_s=t["evict"],
                                answer_s=t["answer"],
                                overhead_vs_prefill=(t["prefill"] - pl + t["score"] + t["evict"] + t["answer"]) / pl)
        res["policies"] = over
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=None)
    ap.add_argument("--smoke", action="store_true", help="2-layer narrow model on the CPU (also the default without CUDA)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--dtype", default="bfloat16", help="row storage dtype of the capture")
    ap.add_argument("--impl", nargs="+", default=None, help="attention implementations (default: sdpa)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8, help="decode steps timed per cache")
    ap.add_argument("--no-policies", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not a.smoke
    smoke = not cuda
    device = "cuda" if cuda else "cpu"
    Ts = a.T or ([8192, 32768, 131072] if cuda else [256])
    impls = a.impl or ["sdpa"]
    wdtype = torch.bfloat16 if cuda else torch.float32
    layers = a.layers if a.layers is not None else (None if cuda else 2)
    out = []
    for impl in impls:
        model = build_model(layers=layers, dtype=wdtype, impl=impl, device=device, smoke=smoke)
        for T in Ts:
            try:
                r = measure(model, T, reps=a.reps, dtype=a.dtype, steps=a.steps, policies=not a.no_policies)
            except torch.cuda.OutOfMemoryError as e:  # 128k may not fit: say so and stop growing T
                print(f"{impl} T={T}: out of device memory ({str(e).splitlines()[0]})", flush=True)
                torch.cuda.empty_cache()
                break
            r.update(impl=impl, smoke=smoke, weights_dtype=str(wdtype).replace("torch.", ""))
            out.append(r)
            print(f"{impl} T={T} L={r['L']}: capture/plain {r['capture_ratio']:.3f} ({r['capture_prefill_s']:.3f} / "
                  f"{r['plain_prefill_s']:.3f} s); device extra capture {r['device_extra_capture_bytes'] / 2**20:.1f} MiB "
                  f"vs plain {r['device_extra_plain_bytes'] / 2**20:.1f} MiB (one layer's fp32 rows "
                  f"{r['one_layer_rows_fp32_bytes'] / 2**20:.1f} MiB; host rows {r['capture_rows_host_bytes'] / 2**20:.1f} MiB); "
                  f"pruned l*={r['l_star']} T'={r['T_prime']}: measured {r['pruned_measured_ratio']:.3f} vs predicted "
                  f"{r['pruned_predicted_ratio']:.3f}; decode step {r['decode_step_b25_ms']:.2f} / {r['decode_step_full_ms']:.2f} ms, "
                  f"KV {r['kv_bytes_b25'] / r['kv_bytes_full']:.3f} of full", flush=True)
            for name, p in r.get("policies", {}).items():
                print(f"    {name:13s} overhead {p['overhead_vs_prefill']:.3f} x prefill (score {p['score_s'] * 1e3:.1f} ms)")
        del model
    path = harness.write_json(a.out or Path(__file__).parent / "out" / ("gpu_smoke.json" if smoke else "gpu.json"),
                              dict(results=out), smoke=smoke, note="smoke run on the CPU: not GPU numbers" if smoke else "")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
