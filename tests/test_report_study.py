"""The whole study from one entry point: ``python -m workbench report --items FILE`` with the leap, priority and
answer-kept analyses on data the project never saw, their tables in the report folder and their claims on the page;
the leap rows on synthetic captures equal an independent computation against the gapped held-out reference."""
from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from test_shift import _synthetic_capture

import workbench.study.report_items as report_items
from workbench.analyse.shift import HELD_OUT_AFTER, HELD_OUT_GAP, ShiftAnalysis, step_gains
from workbench.study.leap import leap_rows
from workbench.study.report_analyses import per_task
from workbench.study.report_config import ReportConfig

# three home-made items (not SQuAD, not a needle): a fact in one of two short passages
ITEMS = [
    {"task": "orchard", "item_id": "pear", "query": "Which fruit grows by the old stone wall?",
     "documents": ["The orchard was planted in 1932 by the miller's family, who sold cider in town.",
                   "By the old stone wall grows a single pear tree. The pear tree by the wall was grafted twice."],
     "answers": ["pear"], "answer_doc": 1},
    {"task": "orchard", "item_id": "gate", "query": "What colour is the orchard gate?",
     "documents": ["The orchard gate is painted green every spring by the caretaker.",
                   "Bees from three hives visit the blossom in April and May."],
     "answers": ["green"], "answer_doc": 0},
    {"task": "orchard", "item_id": "dog", "query": "What is the caretaker's dog called?",
     "documents": ["A stream runs along the eastern edge of the orchard.",
                   "The caretaker walks his dog every evening. The caretaker's dog is called Pepper."],
     "answers": ["Pepper"], "answer_doc": 1},
]


def test_leap_rows_equal_an_independent_computation():
    """Per prompt and step: the mean over layers and KV groups of ``recall[r + 1] − recall[r]``, only the steps that
    end more than ``HELD_OUT_GAP`` rows before the held-out reference (no step touches or abuts it)."""
    caps = [_synthetic_capture(n_decode=8, seed=s) for s in range(3)]
    results = [ShiftAnalysis(k=4)(c) for c in caps]
    items = [SimpleNamespace(task="synthetic", item_id=f"p{s}", meta={"cluster": f"c{s % 2}"}) for s in range(3)]
    rows = leap_rows(results, items)
    want = []
    for it, res in zip(items, results):
        assert res.ref_start == HELD_OUT_AFTER + HELD_OUT_GAP + 1  # the gapped reference, not an abutting one
        rec = res.recall_group.numpy()  # [L, G, R]
        r = res.r.numpy()
        for j in range(len(r) - 1):
            if r[j + 1] < res.ref_start - HELD_OUT_GAP:
                want.append((it.item_id, int(r[j]), int(r[j + 1]), float(np.mean(rec[:, :, j + 1] - rec[:, :, j]))))
    got = [(t.item_id, t.r_from, t.r_to, t.gain) for t in rows.itertuples()]
    assert [g[:3] for g in got] == [w[:3] for w in want]
    np.testing.assert_allclose([g[3] for g in got], [w[3] for w in want], rtol=0, atol=1e-12)
    assert rows["r_to"].max() == HELD_OUT_AFTER and set(rows["meta_cluster"]) == {"c0", "c1"}
    # and what step_gains averages across prompts is the mean of these rows
    st = step_gains(results).set_index("step")
    for (a, b), g in rows.groupby(["r_from", "r_to"])["gain"]:
        assert st.loc[f"{a}→{b}", "mean"] == pytest.approx(g.mean())


def test_per_task_takes_the_first_n_of_every_task():
    its = [SimpleNamespace(task=t, item_id=i) for t, i in [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 2)]]
    got = {t: [x.item_id for x in v] for t, v in per_task(its, 2).items()}
    assert got == {"a": [1, 2], "b": [1, 2]}


@pytest.mark.parametrize("field, value, msg", [
    ("leap_prompts", -1, "leap_prompts"), ("kept_prompts", 1001, "kept_prompts"), ("cap_tokens", -2, "cap_tokens"),
    ("ruler", ("no_such_family",), "ruler: 'no_such_family' is not a RULER-style family"),
    ("ruler_lengths", (100,), "ruler_lengths"), ("ruler_seeds", 0, "ruler_seeds")])
def test_report_config_refuses_bad_study_settings(tmp_path, field, value, msg):
    with pytest.raises(ValueError, match=msg):
        ReportConfig(out=tmp_path / "r", **{field: value})


def test_ruler_alone_is_a_study():
    cfg = ReportConfig(n_squad=0, n_needle=0, ruler=("niah_single",), ruler_lengths=(512,))
    assert cfg.ruler == ("niah_single",) and cfg.ruler_lengths == (512,)


@pytest.mark.model
def test_report_items_writes_the_whole_study(tmp_path, smollm, monkeypatch):
    """``report --tiny --items FILE --leap-prompts 3 --kept-prompts 3``: the leap, priority and answer-kept tables
    in the report folder, their claims in "What this study shows" and their findings on the page; then
    ``benchmarks/study.py``'s layout written from that folder, from which ``study_tables.py`` regenerates the
    study's tables without a model."""
    f = tmp_path / "orchard.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in ITEMS))
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "workbench", "report", "--tiny", "--items", str(f), "--n-squad", "0",
           "--n-needle", "0", "--policies", "deferkv", "snapkv", "--leap-prompts", "3", "--kept-prompts", "3",
           "--no-progress", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    tab = out / "tables"
    leap = pd.read_parquet(tab / "leap.parquet")
    ranks = pd.read_parquet(tab / "ranks.parquet")
    kept = pd.read_parquet(tab / "kept.parquet")
    assert set(ranks["task"]) == {"orchard"} and set(ranks["item_id"].str.split("#").str[0]) == {"pear", "gate", "dog"}
    assert ranks["rank"].between(1, ranks["k"].max()).all()
    assert set(kept["policy"]) == {"deferkv", "snapkv"} and kept["kept"].between(0, 1).all()
    assert len(kept) == 3 * 2 and (kept["budget_frac"] == 0.5).all()  # tiny: one budget, the sweep's
    for name in ("leap", "leap_steps", "ranks", "priority_standing", "kept", "kept_summary"):
        assert (tab / f"{name}.csv").is_file() and (tab / f"{name}.parquet").is_file(), name
    if len(leap):  # a reply that stops before the held-out reference leaves its prompt out (said in the note)
        assert leap["r_to"].max() <= HELD_OUT_AFTER and set(leap["task"]) == {"orchard"}
    concl = pd.read_parquet(tab / "conclusions.parquet")
    assert concl["claim"].str.startswith("Rényi").any()
    assert concl["comparison"].str.contains("deferkv @ 0.5 vs snapkv @ 0.5").any()
    page = (out / "report.html").read_text()
    for name in ("leap", "priority_standing", "kept_summary"):
        assert f"id='tab-{name}'" in page
    assert "held-out reference" in page and "orchard: headmax vs renyi" in page
    man = json.loads((out / "manifest.json").read_text())
    assert man["config"]["leap_prompts"] == 3 and "prompt_analyses" in man["timings"]
    # benchmarks/study.py's files from the report folder, and study_tables.py on them
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    monkeypatch.syspath_prepend(str(bench))
    import study

    lay = tmp_path / "lay"
    lay.mkdir()
    md = study.write_layout(out, lay / "study.parquet")
    assert md.startswith("## What this study shows") and "orchard: headmax vs renyi" in md
    assert {p.name for p in lay.iterdir()} >= {"study.parquet", "study_leap.parquet", "study_ranks.parquet",
                                               "study_kept.parquet", "study_conclusions.parquet", "study_summary.md"}
    pd.testing.assert_frame_equal(pd.read_parquet(lay / "study_conclusions.parquet"), concl)
    monkeypatch.setattr(sys, "argv", ["study_tables.py", "--out-dir", str(lay)])
    runpy.run_path(str(bench / "study_tables.py"), run_name="__main__")
    assert "### What this study shows" in (lay / "study_tables.md").read_text()


@pytest.mark.model
def test_report_runs_ruler_families(smollm):
    """``--ruler``: the RULER-style grid (families × lengths × seeds) joins the report's prompts, with its source."""
    cfg = ReportConfig(n_squad=0, n_needle=0, ruler=("niah_single", "variable_tracking"), ruler_lengths=(512,),
                       ruler_seeds=2)
    items, sources = report_items.study_items(cfg, smollm.tokenizer, {"items": None, "filler": None}, smollm.shape.max_context)
    assert [it.task for it in items] == ["niah_single"] * 2 + ["variable_tracking"] * 2
    assert len({it.item_id for it in items}) == 4 and all(it.meta["length"] == 512 for it in items)
    assert sources[0]["task"] == "niah_single, variable_tracking" and sources[0]["items"] == 4
    with pytest.raises(ValueError, match="lengths"):  # longer than the model's context: refused
        report_items.study_items(ReportConfig(n_squad=0, n_needle=0, ruler=("niah_single",), ruler_lengths=(131072,)),
                      smollm.tokenizer, {"items": None, "filler": None}, smollm.shape.max_context)
