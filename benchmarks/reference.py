"""Full-context reference accuracy of each model on every RULER-style family and on SQuAD (issue 26).

A comparison between methods means something only where full context does the task. For each model (the
research models shipped in split wheels, and the default for contrast), at each length, this runs full
context with greedy decoding on ``--seeds`` items of every RULER-style family (``workbench.study.ruler``:
RULER's ``string_match_all`` / ``_part`` score over the whole reply) and on ``--squad`` SQuAD questions
(the gold paragraph among same-article distractors, as many as bring the prompt near the length; the
``contains`` score), and reports per (model, family, length): n, the mean score, the share of items scored
1 with its Wilson 95 % CI, and the seconds per prompt. A family *passes* at a length when that share is at
least ``--pass-at`` (0.6).

    python benchmarks/reference.py [--models qwen2.5-coder-0.5b qwen2.5-coder-1.5b] [--lengths 1024 2048 4096]
        [--seeds 10] [--squad 10] [--families ...] [--threads N] [--smoke]

Resumable: each model's cells go to ``benchmarks/out/reference/<model>.parquet`` (the sweep's resume).
Prints a markdown table and writes ``benchmarks/out/reference.json``.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import _harness as harness
import pandas as pd
import torch
from eviction import markdown  # benchmarks/eviction.py (the script's folder is on the path)

from workbench.analyse.stats import wilson_ci
from workbench.run.models import load_model
from workbench.study import datasets, ruler, tasks
from workbench.study.sweep import sweep

OUT = Path(__file__).resolve().parent / "out"
SQUAD_PASSAGE_TOKENS = 170  # a bundled SQuAD paragraph is ~120-220 tokens


def squad_at(tokenizer, articles, length: int, n: int, seed: int) -> list:
    """SQuAD items whose prompts come near ``length`` tokens: the gold paragraph plus as many same-article
    distractors as fit (fewer when the article has fewer)."""
    k = max(1, length // SQUAD_PASSAGE_TOKENS - 1)
    while k >= 1:
        try:
            items = tasks.squad_single(articles, n=n, n_distractors=k, seed=seed)
            break
        except ValueError:  # not enough eligible questions with that many distractors
            k = k * 3 // 4 if k > 3 else k - 1
    else:
        return []
    return [dataclasses.replace(it, task="squad", item_id=f"{it.item_id}@{length}", meta={**it.meta, "length": length})
            for it in items]


def build_items(tok, families, lengths, seeds, n_squad, max_context):
    items = ruler.ruler_grid(tok, families, lengths=lengths, seeds=range(seeds), max_context=max_context)
    if n_squad:
        arts = datasets.load_squad("cache" if datasets.is_fetched("squad") else "sample")
        for L in lengths:
            items += squad_at(tok, arts, L, n_squad, seed=L)
    return items


def table(df: pd.DataFrame, pass_at: float) -> pd.DataFrame:
    d = df[df["method"] == "full"].copy()
    d["score"] = d["contains"].where(d["task"] == "squad", d["match"])
    d["length"] = d["meta_length"]
    rows = []
    for (model, task, L), g in d.groupby(["model_id", "task", "length"]):
        k, n = int((g["score"] >= 1.0).sum()), len(g)
        lo, hi = wilson_ci(k, n)
        rows.append({"model": model, "family": task, "length": int(L), "n": n, "mean_score": g["score"].mean(),
                     "solved": k / n, "ci_lo": lo, "ci_hi": hi, "passes": bool(k / n >= pass_at),
                     "T_mean": g["prompt_tokens"].mean(), "s_per_prompt": g["wall_s"].mean()})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048, 4096])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--squad", type=int, default=10, help="SQuAD questions per length (0: none)")
    ap.add_argument("--families", nargs="+", default=sorted(ruler.RULER_TASKS))
    ap.add_argument("--pass-at", type=float, default=0.6)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=str(OUT / "reference"))
    ap.add_argument("--smoke", action="store_true", help="the default model, 2 families at 1k, 1 seed, 1 SQuAD item")
    a = ap.parse_args(argv)
    if a.smoke:
        a.models, a.lengths, a.seeds, a.squad, a.families = [None], [1024], 1, 1, ["niah_single", "variable_tracking"]
    if a.seeds < 1 or a.squad < 0:
        ap.error("--seeds must be >= 1 and --squad >= 0")
    if a.threads:
        torch.set_num_threads(a.threads)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    frames = []
    for name in a.models:
        t0 = time.perf_counter()
        lm = load_model(name, device="auto", progress=True)
        load_s = time.perf_counter() - t0
        items = build_items(lm.tokenizer, a.families, a.lengths, a.seeds, a.squad, lm.shape.max_context)
        for task in sorted({it.task for it in items}):
            group = [it for it in items if it.task == task]
            df = sweep(lm, group, {"full": {}}, out=out / f"{lm.model_id.replace('/', '_')}-{task}.parquet",
                       max_new_tokens=tasks.max_new_tokens_for(task), reference=False, progress=True)
            df["model_id"] = lm.model_id
            frames.append(df)
        print(f"{lm.model_id}: loaded in {load_s:.1f} s, {len(items)} prompts")
        del lm
    t = table(pd.concat(frames, ignore_index=True), a.pass_at)
    print(markdown(t, "{:.2f}"))
    if not a.smoke:
        harness.write_json(OUT / "reference.json", {"rows": t.to_dict("records")}, indent=1,
                           args=vars(a))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
