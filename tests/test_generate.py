"""One greedy decode loop, one stop rule: every method stops after the same stop token.

The stop rule (``workbench.run.generate``): a reply ends after the first stop token (kept): the
tokenizer's EOS or any generation-config EOS id, or after ``max_new_tokens``. Methods compared in one
sweep must differ in their method only, so full context, pruned prefill (``E = ∅``), eviction (full
cache) and the sweep's methods must return the same ids when a stop token is generated.
"""
from __future__ import annotations

import pytest

from workbench.rerun.eviction import FullCache, generate_with_policy
from workbench.rerun.prune import run_full, run_pruned
from workbench.run.generate import decode_answer, greedy_generate, stop_token_ids, truncate_at_stop
from workbench.study import methods
from workbench.study.tasks import TaskItem


def test_truncate_and_decode_use_the_stop_ids():
    assert truncate_at_stop([5, 6, 7, 6], {6}) == [5, 6]
    assert truncate_at_stop([5, 7], {6}) == [5, 7]

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids)) + " "

    assert decode_answer(Tok(), [5, 6, 7], {6}) == "5"
    assert decode_answer(Tok(), [5, 7], {6}) == "5 7"


@pytest.fixture()
def item(example):
    return TaskItem(task="custom", item_id="stop-rule#1", documents=tuple(example.documents), query=example.query,
                    answers=(example.answer,), answer_doc=example.answer_doc, instruction=example.instruction)


def test_every_method_stops_after_the_same_stop_token(smollm, example_prompt, item):
    n = 8
    base = stop_token_ids(smollm)
    ref, _ = greedy_generate(smollm, example_prompt.spans.input_ids, n, base)
    assert len(ref) >= 4, "the reference reply ended too early for this test"
    stop = ref[2]  # make the third greedy token a stop token: every method must end there
    assert stop not in ref[:2]
    gc = smollm.model.generation_config
    old = gc.eos_token_id
    gc.eos_token_id = sorted(set(([old] if isinstance(old, int) else list(old or [])) + [stop]))
    try:
        assert stop in stop_token_ids(smollm)
        want = ref[:3]
        got = {
            "greedy_generate": greedy_generate(smollm, example_prompt.spans.input_ids, n, stop_token_ids(smollm))[0],
            "run_full": run_full(smollm, example_prompt, max_new_tokens=n).generated_ids,
            "run_pruned(E=∅)": run_pruned(smollm, example_prompt, layer=-1, removed=[], max_new_tokens=n,
                                          progress=False).generated_ids,
            "eviction(full cache)": generate_with_policy(smollm, example_prompt, FullCache(), example_prompt.T, n,
                                                         progress=False).ids,
            "sweep full": methods.run_full_context(smollm, item, {"max_new_tokens": n, "seed": 0})["generated_ids"],
            "sweep evict(full)": methods.evict(smollm, item, {"policy": "full", "max_new_tokens": n,
                                                               "seed": 0})["generated_ids"],
        }
    finally:
        gc.eos_token_id = old
    bad = {k: v for k, v in got.items() if list(v) != want}
    assert not bad, f"want {want}; differ: {bad}"
