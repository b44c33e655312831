"""Findings from a sweep frame (workbench.study.findings), on hand-made rows: the comparisons and their
sentences, accuracy conditional on the reference, the reference check and the timing rule."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from workbench.study import findings


def _frame():
    rows = []
    full = {"a": [1, 1, 1, 1, 1, 1, 0, 0], "b": [0, 0, 0, 1]}
    snap = {"a": [1, 1, 0, 0, 1, 1, 0, 1], "b": [0, 0, 0, 1]}
    defer = {"a": [1, 1, 1, 1, 1, 1, 0, 0], "b": [0, 0, 0, 0]}
    for task, xs in full.items():
        for i, x in enumerate(xs):
            rows.append(dict(task=task, item_id=f"{task}{i}", method="full", params="{}", contains=float(x),
                             error=None, wall_s=2.0, hit_cap=i == 0))
            for pol, sc in (("snapkv", snap), ("deferkv", defer)):
                rows.append(dict(task=task, item_id=f"{task}{i}", method="evict",
                                 params=json.dumps({"budget_frac": 0.5, "policy": pol}), contains=float(sc[task][i]),
                                 error=None, wall_s=5.0 if pol == "deferkv" else 1.0, method_s=1.0, shared_s=4.0,
                                 hit_cap=False))
    return pd.DataFrame(rows)


def test_comparisons_per_task_and_pooled():
    c = findings.comparisons(_frame()).set_index(["scope", "a", "b"])
    assert len(c) == 3 * 3  # (deferkv, snapkv vs full; deferkv vs snapkv) x (a, b, pooled)
    r = c.loc[("a", "snapkv @ 0.5", "full")]
    assert (r.n, r.wins, r.ties, r.losses) == (8, 1, 5, 2)
    assert (r.cond_n, r.cond_right) == (6, 4)  # full right on 6; snapkv keeps 4 of them
    assert "Where full context is right, snapkv @ 0.5 keeps 4 of 6 answers" in r.finding
    assert "no detectable difference" in r.finding
    d = c.loc[("a", "deferkv @ 0.5", "full")]
    assert (d.wins, d.ties, d.losses, d.p, d["diff"]) == (0, 8, 0, 1.0, 0.0)
    pooled = c.loc[("all tasks (pooled over 2)", "snapkv @ 0.5", "full")]
    assert pooled.n == 12 and "pooled over 2" in pooled.finding
    assert ("b", "deferkv @ 0.5", "snapkv @ 0.5") in c.index


def test_reference_check_warns_loudly():
    ref, warns = findings.reference_check(_frame())
    ref = ref.set_index("task")
    assert (ref.loc["a", "right"], ref.loc["a", "n"], bool(ref.loc["a", "ok"])) == (6, 8, True)
    assert (ref.loc["b", "right"], bool(ref.loc["b", "ok"])) == (1, False)
    assert any(w.startswith("Weak reference on b: full context is right on 1/4") for w in warns)
    assert sum("hit the max_new_tokens cap" in w for w in warns) == 2
    zero = _frame()
    zero.loc[zero.method == "full", "contains"] = 0.0
    assert any(w.startswith("REFERENCE FAILED on a") for w in findings.reference_check(zero)[1])


def test_timing_rule():
    t = findings.timing_table(_frame()).set_index(["task", "setting"])
    d = t.loc[("a", "deferkv @ 0.5")]
    assert d.method_s == 1.0 and d.sharing == 2 and d.amortised_s == pytest.approx(1.0 + 4.0 / 2)
    assert t.loc[("a", "full"), "amortised_s"] == 2.0  # no shared step: its own time
    assert t.loc[("a", "shared eviction prefill"), "method_s"] == 4.0
    acc = findings.accuracy_table(_frame()).set_index(["task", "setting"])
    assert (acc.loc[("b", "full"), "right"], acc.loc[("b", "full"), "n"]) == (1, 4)
    assert acc.loc[("a", "full"), "hit_cap"] == 1


def test_findings_count_clusters_not_prompts():
    """Prompts that share a fact or a haystack are one cluster (``meta_cluster``), the unit of n: the test
    and the bootstrap CI run over cluster means, and the sentence says how many prompts the clusters hold."""
    d = _frame()
    d = d[d.task == "a"].copy()
    d["meta_cluster"] = ["c0" if int(i[1:]) < 4 else "c1" for i in d["item_id"]]
    c = findings.comparisons(d).set_index(["scope", "a", "b"])
    r = c.loc[("a", "snapkv @ 0.5", "full")]
    assert (r.n, r.prompts, r.clusters) == (2, 8, 2)
    assert "n = 2 clusters of 8 paired prompts" in r.finding
    # cluster means: full (1, 0.5), snapkv (0.5, 0.75): non-binary, so the sign test (1 win, 1 loss)
    assert r.mean_b == pytest.approx(0.75) and r.mean_a == pytest.approx(0.625) and r.test == "sign"
    assert (r.wins, r.losses) == (1, 1)
    assert (r.cond_n, r.cond_right) == (6, 4)  # the conditional accuracy stays per prompt
    own = findings.comparisons(_frame()).set_index(["scope", "a", "b"]).loc[("a", "snapkv @ 0.5", "full")]
    assert (own.n, own.prompts, own.clusters) == (8, 8, 8) and "n = 8 paired prompts" in own.finding
