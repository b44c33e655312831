"""Batched eviction decoding for a study (issue 15): one batch per prompt from its shared prefill gives the
answers of one-by-one runs, and each cell's own time is the batch's share."""
from __future__ import annotations

import pytest

from workbench.study import methods
from workbench.study.sweep import comparable, sweep
from workbench.study.tasks import TaskItem

ITEM = TaskItem(task="t", item_id="a", query="What is the name of the keeper's cat?", answers=("Biscuit",),
                answer_doc=1, documents=("The harbour opened in 1901 and ships still dock there every day.",
                                         "The keeper has a grey cat. The keeper's cat is named Biscuit."))
GRID = {"evict": {"policy": ["streaming", "snapkv", "deferkv", "adakv"], "budget_frac": [0.5]}}


def test_batched_equals_one_by_one(smollm):
    one = sweep(smollm, [ITEM], GRID, max_new_tokens=6, progress=False, reference=False)
    methods.plan_evict_batches([ITEM], [{"policy": p, "budget_frac": 0.5} for p in GRID["evict"]["policy"]])
    try:
        methods._SHARED.clear()
        bat = sweep(smollm, [ITEM], GRID, max_new_tokens=6, progress=False, reference=False)
    finally:
        methods.plan_evict_batches([], [])
    # AdaKV keeps a count per head (a key mask): it decodes alone, the other three share their batches
    assert dict(zip(bat["p_policy"], bat["batched"])) == {"streaming": 3, "snapkv": 3, "deferkv": 3, "adakv": 1}
    assert list(one["batched"]) == [1, 1, 1, 1]
    assert bat["method_s"].nunique() == 1 and bat["method_s"].iloc[0] > 0  # the batch's share, the same for each
    cols = ["item_id", "params", "generated_ids", "answer", "retained_tokens", "kv_bytes", "contains"]
    assert comparable(bat)[cols].equals(comparable(one)[cols])
    assert int(bat["shared_paid"].sum()) == 1 and bat["shared_s"].nunique() == 1


def test_plan_off_by_default():
    assert methods._PLAN == {}
    methods.plan_evict_batches([ITEM], [{"policy": "snapkv", "budget_frac": 0.5}])
    assert methods._PLAN[("t", "a")] == [{"policy": "snapkv", "budget_frac": 0.5}]
    methods.plan_evict_batches([ITEM], [])
    assert methods._PLAN == {}
    with pytest.raises(KeyError):
        methods._PLAN[("t", "a")]
