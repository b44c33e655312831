"""Cost of the input checks of issue 18: the attention-row check, Capture.load's validation and the
model-identity check before a rerun, against the work they guard.

A synthetic capture shaped like the default model's (L = 30, H_Q = 9, G = 3) on a T-token prompt with
8 observers, the query as audit rows and a 32-token tail; median of n repetitions:

- ``check_rows`` on every row (done once per capture, then cached) against one ``trace`` after a slider
  move (which reuses the cached verdict);
- ``Capture.validate`` against ``Capture.load`` as a whole;
- ``check_model_match`` (vocabulary range and tokenizer fingerprint) on the real tokenizer.

    python benchmarks/checks.py [--T 2048] [--n 7] [--out benchmarks/out/checks.json]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import _harness as harness
import torch


def median_time(fn, n: int) -> float:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    from transformers import AutoTokenizer

    from workbench.analyse.params import EntroPrefillParams
    from workbench.analyse.procedure import trace
    from workbench.analyse.rows import check_rows
    from workbench.capture.data import Capture
    from workbench.capture.identity import check_model_match
    from workbench.run.models import default_model_folder, tiny_model
    from workbench.run.prompt import build_prompt
    from workbench.run.spans import PromptSpans

    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--n", type=int, default=7)
    ap.add_argument("--out", default="benchmarks/out/checks.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    k = 16
    size = (a.T - 40) // k - 1
    sp = PromptSpans.synthetic([size] * k, query_len=16)
    q0, q1 = sp.query
    cap = Capture.synthetic(sp, L=30, H_Q=9, G=3, seed=0,
                            extra_rows={"audit": list(range(q0, q1)), "tail": list(range(sp.T - 32, sp.T))})
    rows = {}
    rows["check_rows (all rows)"] = median_time(lambda: check_rows(cap.attn, "capture.attn"), a.n)
    params = EntroPrefillParams(streak=0)
    trace(cap, params, certify=False)  # warm the capture's caches (the slider situation)
    rows["trace after a slider move"] = median_time(lambda: trace(cap, params.replace(lam=0.7), certify=False), a.n)
    with tempfile.TemporaryDirectory() as d:
        path = cap.save(Path(d) / "c.safetensors")
        rows["Capture.validate"] = median_time(cap.validate, a.n)
        rows["Capture.load (validated)"] = median_time(lambda: Capture.load(path), a.n)
    tok = AutoTokenizer.from_pretrained(str(default_model_folder(progress=False)))
    prompt = build_prompt(tok, ["Paris is the capital of France."] * 8, "What is the capital of France?")
    model = tiny_model("llama", vocab=len(tok), L=2, H_Q=4, G=2, d=16)
    rows["check_model_match"] = median_time(lambda: check_model_match(model, tok, prompt), a.n)
    print(f"T = {sp.T}, attn {list(cap.attn.shape)} ({cap.attn.numel() * 4 / 2**20:.0f} MiB), median of {a.n}")
    print(f"| {'step':28s} | seconds |")
    for name, t in rows.items():
        print(f"| {name:28s} | {t:.4f} |")
    harness.write_json(a.out, {"T": sp.T, "shape": list(cap.attn.shape), "n": a.n, "seconds": rows})


if __name__ == "__main__":
    main()
