"""The evaluation study on real data (issue 7): accuracy vs budget for every method on SQuAD v1.1 dev
single-hop RAG prompts and a needle-in-a-haystack grid, on the embedded default model.

Resumable (finished cells in the parquet are skipped), so it can be stopped and continued:

    python -m workbench.study.datasets fetch          # once: SQuAD dev and the essays, checksummed
    python benchmarks/study.py [--n-squad 50] [--out benchmarks/out/study.parquet] [--threads 1]

Prints the summary tables (markdown) and writes them beside the parquet (``study_summary.md``).
Methods: full context; EntroPrefill with Rényi and mass-only priorities, adaptive (7-step, default
thresholds) and at a fixed layer l* = 9 (proposal E_l with a loose row tolerance ε_a = 0.3 and target
50 %); the eviction policies at 25 % and 50 % of the prompt.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

POLICIES = ["streaming", "h2o", "snapkv", "deferkv", "page-entrokv", "random", "oracle"]
METHODS = [
    ("full", {}),
    ("entroprefill", {"priority": ["renyi", "mass"]}),
    ("entroprefill", {"priority": ["renyi", "mass"], "layer": 9, "eps_row": 0.3, "target": 0.5}),
    ("evict", {"policy": POLICIES, "budget_frac": [0.25, 0.5]}),
]


def items(n_squad: int, lengths, depths, tokenizer):
    from workbench.study import datasets, tasks

    out = {"squad": tasks.squad_single(datasets.load_squad(), n=n_squad, n_distractors=3, seed=0)}
    if lengths:
        out["needle"] = tasks.needle(tokenizer, datasets.load_essays(), lengths=lengths, depths=depths, n=1, seed=0)
    return out


def label(r) -> str:
    if r.method == "full":
        return "full context"
    if r.method == "entroprefill":
        where = "adaptive" if pd.isna(r.get("p_layer")) else f"l*={int(r.p_layer)}"
        return f"EntroPrefill {r.p_priority}, {where}"
    return f"{r.p_policy} @ {r.p_budget_frac:.0%}"


def summary(df: pd.DataFrame) -> pd.DataFrame:
    df = df[df.error.isna()].copy()
    df["setting"] = df.apply(label, axis=1)
    df["prefill_saved"] = 1 - df.retained_tokens / df.prompt_tokens
    g = df.groupby(["task", "setting"], sort=False)
    out = g.agg(n=("item_id", "size"), em=("em", "mean"), f1=("f1", "mean"), contains=("contains", "mean"),
                contains_se=("contains", lambda s: s.std(ddof=1) / max(len(s), 1) ** 0.5),
                first_token_agree=("first_token_agree", "mean"), prompt_tokens=("prompt_tokens", "mean"),
                kept_tokens=("retained_tokens", "mean"), saved=("prefill_saved", "mean"),
                kv_mib=("kv_bytes", lambda s: s.mean() / 2**20), wall_s=("wall_s", "mean"))
    if "l_star" in df:
        ep = df[df.method == "entroprefill"]
        out["bypass"] = ep.groupby(["task", "setting"])["bypass"].mean()
        out["answer_removed"] = ep.groupby(["task", "setting"])["answer_chunk_removed"].mean()
    return out.reset_index()


def markdown(df: pd.DataFrame) -> str:
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-squad", type=int, default=50)
    ap.add_argument("--lengths", type=int, nargs="*", default=[512, 1024, 2048])
    ap.add_argument("--depths", type=float, nargs="+", default=[0.1, 0.5, 0.9])
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "study.parquet"))
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--summary-only", action="store_true")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    from workbench.run.models import load_model
    from workbench.study.sweep import read_sweep, sweep

    out = Path(a.out)
    if not a.summary_only:
        lm = load_model(progress=False)
        t0 = time.perf_counter()
        its = items(a.n_squad, a.lengths, a.depths, lm.tokenizer)
        sweep(lm, its, METHODS, out=out, max_new_tokens=a.max_new_tokens, on_error="record", checkpoint_s=30)
        print(f"sweep done in {time.perf_counter() - t0:.0f} s")
    s = summary(read_sweep(out))
    pd.set_option("display.width", 250)
    md = markdown(s)
    print(md)
    out.with_name(out.stem + "_summary.md").write_text(md + "\n")


if __name__ == "__main__":
    main()
