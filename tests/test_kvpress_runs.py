"""A sweep frame written as kvpress evaluation runs (``workbench.study.kvpress_runs``)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import yaml

from workbench.study.kvpress_runs import run_name, write_kvpress_runs


def _row(task, item, method, params, match, retained, T=1000, length=2048, error=None):
    return dict(model="Qwen/Qwen2.5-Coder-0.5B", task=task, item_id=item, method=method,
                params=json.dumps(params, sort_keys=True), seed=0, max_new_tokens=32, answer=f"reply {item}",
                gold="gold", match=match, contains=match, em=0.0, f1=match / 2, prompt_tokens=T,
                retained_tokens=retained, kv_bytes=retained * 10, hit_cap=False, error=error, meta_length=length)


def test_runs_are_named_and_filled_as_kvpress_names_them(tmp_path):
    rows = [_row("niah_single", f"i{i}", "full", {}, m, 1000) for i, m in enumerate([1.0, 1.0, 0.0])]
    rows += [_row("niah_single", f"i{i}", "evict", {"policy": "snapkv", "budget_frac": 0.25}, m, 250)
             for i, m in enumerate([1.0, 0.0, 0.0])]
    rows += [_row("niah_single", f"i{i}", "evict", {"policy": "deferkv", "budget": 300}, 1.0, 300, T=T)
             for i, T in enumerate([1000, 1200, 1500])]
    rows += [_row("niah_single", "i9", "evict", {"policy": "h2o", "budget_frac": 0.5}, 1.0, 500, error="boom")]
    rows += [_row("squad", "q1", "entroprefill", {"target": 0.2}, 1.0, 800, length=np.nan)]
    written = write_kvpress_runs(pd.DataFrame(rows), tmp_path)
    names = sorted(p.name for p in written)
    assert names == sorted([
        "niah_single__2048__Qwen--Qwen2.5-Coder-0.5B__no_press__0.00",
        "niah_single__2048__Qwen--Qwen2.5-Coder-0.5B__snapkv__0.75__query_aware",
        # an absolute budget: the ratio measured over the run's prompts, 1 - mean(300/T)
        "niah_single__2048__Qwen--Qwen2.5-Coder-0.5B__deferkv__%.2f__query_aware"
        % (1 - np.mean([300 / 1000, 300 / 1200, 300 / 1500])),
        "squad__Qwen--Qwen2.5-Coder-0.5B__entroprefill-target0.2__0.20",  # no length: no data_dir
    ])  # the errored h2o cell is left out
    snap = tmp_path / "niah_single__2048__Qwen--Qwen2.5-Coder-0.5B__snapkv__0.75__query_aware"
    m = json.loads((snap / "metrics.json").read_text())
    assert m == {"niah_single": {"string_match": round(100 / 3, 4), "contains": round(100 / 3, 4), "em": 0.0,
                                 "f1": round(100 / 6, 4), "n": 3}}
    pred = pd.read_csv(snap / "predictions.csv")
    assert list(pred["predicted_answer"]) == ["reply i0", "reply i1", "reply i2"]
    assert set(pred["compression_ratio"]) == {0.75} and list(pred["answer"]) == ["gold"] * 3
    cfg = yaml.safe_load((snap / "config.yaml").read_text())
    assert (cfg["press_name"], cfg["compression_ratio"], cfg["budget_frac"], cfg["query_aware"]) == \
        ("snapkv", 0.75, 0.25, True)
    assert cfg["budget_positions"] == {"mean": 250.0, "min": 250, "max": 250} and cfg["n"] == 3
    d = yaml.safe_load((tmp_path / names[0] / "config.yaml").read_text())
    assert d["budget"] == 300 and d["budget_positions"] == {"mean": 300.0, "min": 300, "max": 300}


def test_run_name_leaves_out_empty_parts():
    assert run_name("ruler", "", "a/b", "snapkv", 0.5, False) == "ruler__a--b__snapkv__0.50"
