"""One prompt type: a bundled example is a TaskItem, as every item of a task family is."""
from __future__ import annotations

import json

import pytest

from workbench.run.examples import DATA_DIR, EXAMPLES, load_example
from workbench.run.task_item import TaskItem
from workbench.study import tasks


@pytest.mark.parametrize("name", EXAMPLES)
def test_bundled_example_is_a_task_item_with_its_file_fields(name):
    d = json.loads((DATA_DIR / f"{name}.json").read_text())
    ex = load_example(name)
    assert type(ex) is TaskItem and tasks.TaskItem is TaskItem
    assert ex.task == d["name"] and ex.item_id.startswith(d["name"] + "#") and len(ex.item_id) == len(d["name"]) + 9
    assert ex.documents == tuple(d["documents"]) and ex.query == d["query"] and ex.instruction == d["instruction"]
    assert ex.answers == (d["answer"],) and ex.answer == d["answer"] and ex.answer_doc == d["answer_doc"]
    assert ex.item_id == f"{d['name']}#{ex.content_digest()[:8]}"   # content-addressed, as a family's items


def test_task_item_answer_is_the_first_gold_answer():
    it = TaskItem(task="pets", item_id="cat", documents=("The cat is Biscuit, or Bis.",), query="Cat?",
                  answers=("Biscuit", "Bis"), answer_doc=0)
    assert it.answer == "Biscuit" and it.summary()["answer"] == "Biscuit"
