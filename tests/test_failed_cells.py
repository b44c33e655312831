"""A failing cell is a failed cell: a policy that fails at run time makes its sweep cells failed (the error and its
reason in the row), never empty answers scored as wrong; the findings leave them out of every comparison and
count them as failed; the report says so (``report --tiny --methods evict --policy _bad_policies:Raising``)."""
from __future__ import annotations

import html
import math
import re

import pandas as pd
import pytest
import torch
from _bad_policies import Raising

from workbench import __main__ as cli
from workbench.rerun.eviction import REGISTRY, GenerationResult, SnapKV, survival_table
from workbench.rerun.eviction.result import PolicyRunError
from workbench.run.models import LoadedModel, tiny_model
from workbench.study import datasets, findings, tasks
from workbench.study import methods as M
from workbench.study import report as rp
from workbench.study import sweep as sw


@pytest.fixture(scope="module")
def tiny_lm(smollm):
    model = tiny_model("llama", vocab=len(smollm.tokenizer), L=2, H_Q=4, G=2, d=16, seed=0)
    return LoadedModel(model=model, tokenizer=smollm.tokenizer, model_id="tiny-llama-test",
                       device=torch.device("cpu"), dtype=torch.float32)


@pytest.fixture(scope="module")
def items():
    return tasks.squad_single(datasets.load_squad("sample"), n=1, n_distractors=1, seed=0)


def test_a_raising_policy_makes_failed_cells(tiny_lm, items):
    with REGISTRY.scoped():
        REGISTRY.register(Raising)
        grid = {"evict": {"policy": ["bad-raising", "snapkv"], "budget_frac": [0.5]}}
        df = sw.sweep(tiny_lm, items, grid, max_new_tokens=3, progress=False, on_error="record")
        ev = df[df["method"] == "evict"].set_index("p_policy")
        bad = ev.loc["bad-raising"]
        assert "PolicyRunError" in bad["error"] and "bad-raising" in bad["error"]
        assert "this policy always fails" in bad["error"]  # the reason, not only that it failed
        assert all(math.isnan(bad[m]) for m in ("em", "f1", "contains", "match"))  # never scored
        assert not (isinstance(bad["kv_bytes"], (int, float)) and bad["kv_bytes"] == 0)  # no empty cache claimed
        assert pd.isna(ev.loc["snapkv", "error"]) and len(ev.loc["snapkv", "generated_ids"]) > 0  # the other runs
        # the findings leave it out of every comparison and count it as failed
        assert "bad-raising @ 0.5" not in set(findings.with_settings(df)["setting"])
        comp = findings.comparisons(df)
        assert not len(comp) or not ({"a", "b"} <= set(comp.columns)) or \
            "bad-raising @ 0.5" not in set(comp["a"]) | set(comp["b"])
        acc = findings.accuracy_table(df).set_index(["task", "setting"])
        row = acc.loc[("squad_single", "bad-raising @ 0.5")]
        assert (row.n, row.right, row.failed) == (0, 0, 1) and math.isnan(row.accuracy)
        assert "this policy always fails" in row.failed_reason
        assert acc.loc[("squad_single", "snapkv @ 0.5"), "failed"] == 0
        # on_error="raise" (the sweep's default) stops at the failed cell, naming it
        with pytest.raises(PolicyRunError, match="bad-raising failed at budget .*this policy always fails"):
            sw.sweep(tiny_lm, items, {"evict": {"policy": ["bad-raising"], "budget_frac": [0.5]}}, max_new_tokens=3,
                     progress=False, reference=False)
        with pytest.raises(PolicyRunError, match="this policy always fails"):
            M.evict(tiny_lm, items[0], {"policy": "bad-raising", "budget_frac": 0.5, "max_new_tokens": 3, "seed": 0})


def test_survival_table_marks_failed_runs():
    ok = GenerationResult(policy="full", params={}, budget=6, T=6, ids=[1], text="the 42", kept=torch.arange(6).expand(
        2, 1, 6).clone(), evicted_at=0, compacted_layers=(0, 1), kv_bytes_before=10, kv_bytes_after=10, timings={})
    bad = GenerationResult.failed(SnapKV(), 3, 6, RuntimeError("boom"))
    t = survival_table([ok, bad], [2, 3], answer="42").set_index("policy")
    assert bool(t.loc["full", "correct"]) is True and pd.isna(t.loc["full", "error"])
    assert t.loc["snapkv", "correct"] is None and t.loc["snapkv", "error"] == "RuntimeError: boom"
    assert math.isnan(t.loc["snapkv", "kept_mean"])


def test_report_counts_failed_cells(tiny_lm, tmp_path, monkeypatch, capsys):
    """``report --tiny --methods evict --policy _bad_policies:Raising``: the failed cells are failed, with the
    reason, in the sweep, the summary and the accuracy table; no finding counts them (on the tiny model)."""
    monkeypatch.setattr(rp, "load_model", lambda *a, **k: tiny_lm)
    monkeypatch.setattr(cli.signal, "signal", lambda *a: None)
    out = tmp_path / "rep"
    with REGISTRY.scoped():
        rc = cli.main(["report", "--tiny", "--data", "sample", "--methods", "evict", "--policy", "_bad_policies:Raising",
                       "--no-progress", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    t = out / "tables"
    sweep = pd.read_parquet(t / "sweep.parquet")
    ev = sweep[sweep["method"] == "evict"]
    assert len(ev) == 2 and ev["error"].str.contains("bad-raising failed at budget").all()
    assert ev["error"].str.contains("this policy always fails").all() and ev["em"].isna().all()
    summary = pd.read_parquet(t / "summary.parquet")
    assert summary.loc[summary["method"] == "evict", "errors"].tolist() == [1, 1]
    acc = pd.read_parquet(t / "accuracy.parquet")
    bad = acc[acc["setting"] == "bad-raising @ 0.5"]
    assert len(bad) == 2 and (bad["n"] == 0).all() and (bad["failed"] == 1).all()
    assert bad["failed_reason"].str.contains("this policy always fails").all()
    comp = pd.read_parquet(t / "comparisons.parquet")
    assert not len(comp) or "bad-raising @ 0.5" not in set(comp["a"]) | set(comp["b"])
    concl = pd.read_parquet(t / "conclusions.parquet")
    assert not len(concl) or not concl.astype(str).apply(lambda c: c.str.contains("bad-raising")).any().any()
    surv = pd.read_parquet(t / "needle_survival.parquet").set_index("policy")
    assert surv.loc["bad-raising", "correct"] is None and "this policy always fails" in surv.loc["bad-raising", "error"]
    div = pd.read_parquet(t / "answer_divergence.parquet")  # a failing policy is a row with its error, no number
    assert len(div) and div["mean_kl"].isna().all() and div["error"].str.contains("this policy always fails").all()
    page = html.unescape((out / "report.html").read_text())
    assert "2 with errors" in page
    for task in ("needle", "squad_single"):
        assert re.search(rf"{task} / bad-raising @ 0\.5: no cell finished; 1 failed, not counted \(PolicyRunError: "
                         r"policy: bad-raising failed at budget B = \d+ \(T = \d+\): RuntimeError: this policy always "
                         r"fails\)", page)
