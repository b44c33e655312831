"""A study's cells as kvpress evaluation runs, so that they can be read side by side with kvpress's own.

kvpress's ``evaluation/evaluate.py`` writes one folder per run, named
``<dataset>__<data_dir>__<model with / as -->__<press_name>__<compression_ratio:.2f>[__query_aware]``, holding
``predictions.csv`` (one row per question, with ``predicted_answer``), ``metrics.json`` (the scorer's output)
and ``config.yaml`` (the run's settings). :func:`write_kvpress_runs` writes the same for every
(dataset, model, method, budget) of a sweep frame:

* ``dataset`` is the task family, ``data_dir`` the prompt length for families built at a length (RULER-style
  and needle items carry ``meta_length``), empty otherwise;
* ``press_name`` is ``no_press`` for full context (compression ratio 0, as kvpress's ``no_press``), the
  policy's name for an eviction, ``entroprefill`` (with its preset or non-default parameters) for pruned
  prefill;
* ``compression_ratio`` is kvpress's: the fraction of the prompt's KV cache removed: the cell's own
  ``compression_ratio`` when it was given as one, ``1 - budget_frac`` for a fractional budget, else the achieved
  ``1 - retained / compressed`` measured over the run's prompts (a ladder rung, positions). Both axes are in
  ``config.yaml``: the ratio and the absolute budget (positions kept, mean, min and max over prompts), with the
  achieved ``kv_frac`` (KV bytes kept / full) and the rung asked for;
* the ``query_aware`` suffix follows the query axis: an eviction that saw the question before it compressed
  (``query`` ``aware``, the default) carries it, a query-agnostic one (kvpress's default) does not; pruned prefill
  and full context do not compress a cache and carry none.

``metrics.json`` holds, per task, RULER's ``string_match`` (× 100, as kvpress's RULER scorer reports it),
``contains``, ``em`` and ``f1`` (× 100) and ``n``. Nothing is filled in that the sweep did not measure.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import yaml

from workbench.study.findings import row_params
from workbench.util import atomic_write_files

__all__ = ["write_kvpress_runs", "run_name", "press_name"]

PREDICTION_COLUMNS = ("item_id", "task", "gold", "answer", "match", "contains", "em", "f1", "prompt_tokens",
                      "retained_tokens", "kv_bytes", "kv_frac", "query", "ttft_s", "peak_cuda_bytes", "max_new_tokens",
                      "hit_cap", "seed")


def press_name(method: str, params: dict) -> str:
    """kvpress's ``press_name`` of a cell: ``no_press``, the eviction policy (``<policy>-kv<rung>`` on the
    matched-byte ladder), or ``entroprefill[-…]``."""
    if method == "full" or (method == "evict" and params.get("policy", "full") == "full"):
        return "no_press"
    if method == "evict":  # a ladder rung is its own run: its achieved ratio may equal a fractional budget's
        return str(params["policy"]) + (f"-kv{params['kv_frac']:g}" if params.get("kv_frac") is not None else "")
    if method == "entroprefill":
        extra = "-".join(f"{k}{v}" for k, v in sorted(params.items()) if k not in ("seed",))
        return f"entroprefill-{extra}" if extra else "entroprefill"
    return method


def run_name(dataset: str, data_dir: str, model: str, press: str, ratio: float, query_aware: bool) -> str:
    """kvpress's run folder name: components joined by ``__``, empty ones left out."""
    parts = [dataset, data_dir, model.replace("/", "--"), press, f"{ratio:.2f}"]
    if query_aware:
        parts.append("query_aware")
    return "__".join(p for p in parts if p)


def _ratio(method: str, params: dict, g: pd.DataFrame) -> float:
    if method == "full" or press_name(method, params) == "no_press":
        return 0.0
    if method == "evict" and params.get("compression_ratio") is not None:
        return float(params["compression_ratio"])
    if method == "evict" and params.get("budget_frac") is not None:
        return 1.0 - float(params["budget_frac"])
    if "compression_ratio" in g and g["compression_ratio"].notna().all():
        return float(g["compression_ratio"].mean())
    return float(1.0 - (g["retained_tokens"] / g["prompt_tokens"]).mean())


def _mean(g: pd.DataFrame, col: str) -> float | None:
    """The mean of a measured column, None where no row measured it (a YAML null, not a made-up number)."""
    v = pd.to_numeric(g[col], errors="coerce").mean() if col in g else math.nan
    return None if math.isnan(v) else float(v)


def _metrics(g: pd.DataFrame) -> dict:
    out = {}
    for task, t in g.groupby("task"):
        out[str(task)] = {"string_match": round(100 * float(t["match"].mean()), 4),
                          **{k: round(100 * float(t[k].mean()), 4) for k in ("contains", "em", "f1") if k in t},
                          "n": int(len(t))}
    return out


def write_kvpress_runs(df: pd.DataFrame, out: str | Path) -> list[Path]:
    """One kvpress-style run folder per (dataset, data_dir, model, method, parameters) of the sweep frame
    ``df`` (rows with an error are left out) under ``out``; returns the folders, each written atomically."""
    out = Path(out)
    d = df[df["error"].isna()] if "error" in df else df
    if d.empty:
        return []
    d = d.assign(_dir=d["meta_length"].map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v))
                                            else str(int(v)))
                 if "meta_length" in d else "")
    written = []
    for (task, data_dir, model, method, params), g in d.groupby(["task", "_dir", "model", "method", "params"],
                                                                 sort=True):
        p = row_params(g.iloc[0])
        press = press_name(method, p)
        ratio = _ratio(method, p, g)
        query_aware = method == "evict" and press != "no_press" and p.get("query", "aware") == "aware"
        folder = out / run_name(str(task), data_dir, str(model), press, ratio, query_aware)
        cols = [c for c in PREDICTION_COLUMNS if c in g]
        pred = g[cols].rename(columns={"answer": "predicted_answer", "gold": "answer"})
        pred.insert(len(pred.columns), "compression_ratio", ratio)
        kept = g["retained_tokens"]
        config = {"dataset": str(task), "data_dir": data_dir or None, "model": str(model), "press_name": press,
                  "compression_ratio": round(ratio, 6), "query_aware": query_aware, "method": str(method),
                  "params": p, "budget_frac": p.get("budget_frac"), "budget": p.get("budget"),
                  "budget_positions": {"mean": float(kept.mean()), "min": int(kept.min()), "max": int(kept.max())},
                  "kv_frac_rung": p.get("kv_frac"), "kv_frac": _mean(g, "kv_frac"), "ttft_s": _mean(g, "ttft_s"),
                  "prompt_tokens_mean": float(g["prompt_tokens"].mean()), "n": int(len(g)),
                  "max_new_tokens": int(g["max_new_tokens"].iloc[0]), "source": "attn-workbench sweep"}
        atomic_write_files({folder / "predictions.csv": pred.to_csv(index=False).encode(),
                            folder / "metrics.json": json.dumps(_metrics(g), indent=4).encode(),
                            folder / "config.yaml": yaml.safe_dump(config, sort_keys=False).encode()})
        written.append(folder)
    return written
