"""Command line: ``python -m workbench {prepare,capture}``."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _prepare(args) -> int:
    from .models import default_model_folder

    folder = default_model_folder(progress=True)
    print(f"default model ready: {folder}")
    return 0


def _capture(args) -> int:
    from .capture import RowSet, run_capture
    from .examples import load_example
    from .models import load_model

    t0 = time.perf_counter()
    lm = load_model(args.model, device=args.device)
    ex = load_example(args.example)
    prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
    cap = run_capture(lm, prompt, RowSet(tail=args.tail, n_decode=args.decode), progress=True)
    out = Path(args.out)
    cap.save(out)
    answer = lm.tokenizer.decode(cap.generated_ids) if cap.generated_ids else ""
    print(f"wrote {out}: {cap.model_id}, T={cap.T}, k={cap.spans.k} chunks, rows={cap.attn.shape[2]}, "
          f"attn {tuple(cap.attn.shape)} ({cap.attn.numel() * 4 / 2**20:.1f} MiB), "
          f"decode={args.decode} {answer!r}, {time.perf_counter() - t0:.1f} s")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="convert the embedded default model once (HF folder in the user cache)")
    p.set_defaults(fn=_prepare)
    c = sub.add_parser("capture", help="run a model on a bundled prompt and write a capture file")
    c.add_argument("--model", default=None, help="local HF folder or cached hub id (default: embedded SmolLM2)")
    c.add_argument("--example", default="example_prompt", help="bundled prompt in data/ (default: example_prompt)")
    c.add_argument("--out", default="out/example.capture.safetensors", help="capture file to write")
    c.add_argument("--decode", type=int, default=8, help="greedy decode steps whose rows are captured")
    c.add_argument("--tail", type=int, default=32, help="prompt-tail rows")
    c.add_argument("--device", default="auto")
    c.set_defaults(fn=_capture)
    args = ap.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
