"""Batched eviction decoding for a study: one batch per prompt from its shared prefill gives the
answers of one-by-one runs, and each cell's own time is the batch's share. The ``evict`` method runs all its
cells of one item together (``per_item``), with no state carried between sweeps or cells, and a
resumed sweep runs only the missing cells (together)."""
from __future__ import annotations

import pandas as pd

from workbench.study import methods
from workbench.study.sweep import comparable, get_method, read_sweep, sweep
from workbench.study.tasks import TaskItem

ITEM = TaskItem(task="t", item_id="a", query="What is the name of the keeper's cat?", answers=("Biscuit",),
                answer_doc=1, documents=("The harbour opened in 1901 and ships still dock there every day.",
                                         "The keeper has a grey cat. The keeper's cat is named Biscuit."))
POLICIES = ["streaming", "snapkv", "deferkv", "adakv"]
GRID = {"evict": {"policy": POLICIES, "budget_frac": [0.5]}}
COLS = ["item_id", "params", "generated_ids", "answer", "retained_tokens", "kv_bytes", "contains"]


def test_batched_equals_one_by_one(smollm):
    # one by one: each policy in a sweep of its own (its own prefill, decoded alone)
    one = pd.concat([sweep(smollm, [ITEM], {"evict": {"policy": p, "budget_frac": 0.5}}, max_new_tokens=6,
                           progress=False, reference=False) for p in POLICIES], ignore_index=True)
    one = one.sort_values("params", kind="stable").reset_index(drop=True)
    bat = sweep(smollm, [ITEM], GRID, max_new_tokens=6, progress=False, reference=False)
    # AdaKV keeps a count per head (a key mask): it decodes alone, the other three share their batches
    assert dict(zip(bat["p_policy"], bat["batched"])) == {"streaming": 3, "snapkv": 3, "deferkv": 3, "adakv": 1}
    assert list(one["batched"]) == [1, 1, 1, 1] and list(one["shared_paid"]) == [True] * 4
    assert bat["method_s"].nunique() == 1 and bat["method_s"].iloc[0] > 0  # the batch's share, the same for each
    assert comparable(bat)[COLS].equals(comparable(one)[COLS])
    assert int(bat["shared_paid"].sum()) == 1 and bat["shared_s"].nunique() == 1
    # the call's wall time is charged to the cell that paid the shared prefill
    is_paid = bat["shared_paid"].astype(bool)
    paid = bat[is_paid].iloc[0]
    assert paid["wall_s"] > paid["shared_s"] > 0 and (bat.loc[~is_paid, "wall_s"] == 0).all()


def test_evict_runs_per_item_and_carries_no_state(smollm):
    assert get_method("evict").per_item and not get_method("full").per_item
    assert not any(hasattr(methods, name) for name in ("_SHARED", "_PLAN", "plan_evict_batches"))
    a = sweep(smollm, [ITEM], GRID, max_new_tokens=2, progress=False, reference=False)
    b = sweep(smollm, [ITEM], GRID, max_new_tokens=2, progress=False, reference=False)
    # the second sweep of the same item pays its own prefill: nothing is kept between sweeps
    assert int(a["shared_paid"].sum()) == int(b["shared_paid"].sum()) == 1
    assert comparable(a)[COLS].equals(comparable(b)[COLS])
    # the single-cell entry point runs one cell alone, as its own sweep would
    alone = methods.evict(smollm, ITEM, {"policy": "snapkv", "budget_frac": 0.5, "max_new_tokens": 2, "seed": 0})
    row = a[a["p_policy"] == "snapkv"].iloc[0]
    assert alone["generated_ids"] == list(row["generated_ids"]) and alone["shared_paid"] and alone["batched"] == 1


def test_resume_runs_the_missing_cells_of_an_item_together(smollm, tmp_path):
    out = tmp_path / "s.parquet"
    full = sweep(smollm, [ITEM], GRID, out=out, max_new_tokens=6, progress=False, reference=False)
    # keep streaming and adakv only, as if the run had stopped after them
    kept = read_sweep(out)
    kept = kept[kept["p_policy"].isin(["streaming", "adakv"])]
    kept.to_parquet(out, index=False)
    resumed = sweep(smollm, [ITEM], GRID, out=out, max_new_tokens=6, progress=False, reference=False)
    assert comparable(resumed)[COLS].equals(comparable(full)[COLS])
    old = resumed[resumed["p_policy"].isin(["streaming", "adakv"])].set_index("p_policy")
    assert dict(old["wall_s"]) == dict(full.set_index("p_policy").loc[["adakv", "streaming"], "wall_s"])  # not rerun
    new = resumed[resumed["p_policy"].isin(["snapkv", "deferkv"])].set_index("p_policy")
    assert dict(new["batched"]) == {"snapkv": 2, "deferkv": 2}  # the two missing cells decoded together
    assert int(new["shared_paid"].sum()) == 1


def test_the_answer_rows_are_captured_only_for_a_policy_that_needs_them(smollm, monkeypatch):
    """The shared prefill takes every policy's evidence, but the full-cache answer's rows (the oracle's, a
    capturing decode of ``max_new_tokens`` steps) only when a cell's policy needs them (before, they were
    taken for every item); the other cells' answers are the same with and without an oracle cell beside them."""
    from workbench.rerun.eviction import EvictionSession

    seen = []
    prepare = EvictionSession.prepare.__func__

    def spy(cls, model, prompt, needs, *a, **kw):
        seen.append(needs)
        return prepare(cls, model, prompt, needs, *a, **kw)

    monkeypatch.setattr(EvictionSession, "prepare", classmethod(spy))
    without = sweep(smollm, [ITEM], GRID, max_new_tokens=6, progress=False, reference=False)
    grid = {"evict": {"policy": [*POLICIES, "oracle"], "budget_frac": [0.5]}}
    beside = sweep(smollm, [ITEM], grid, max_new_tokens=6, progress=False, reference=False)
    assert [n.answer for n in seen] == [False, True]
    assert all(n.decode1 and n.keys and n.colsum for n in seen)   # every other policy's evidence, both times
    others = comparable(beside[beside["p_policy"] != "oracle"])[COLS].reset_index(drop=True)
    assert others.equals(comparable(without)[COLS].reset_index(drop=True))
