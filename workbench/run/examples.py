"""Bundled example prompts (``data/``), loadable without a model."""
from __future__ import annotations

import json
from pathlib import Path

from workbench.run.task_item import TaskItem, with_content_id

DATA_DIR = Path(__file__).resolve().parents[2] / "data"

EXAMPLES = ("example_prompt", "needle_haystack")  # the bundled prompts (data/<name>.json); other files are data sets


def load_example(name: str = "example_prompt") -> TaskItem:
    """Load the bundled prompt ``data/<name>.json`` (default: the multi-document harbor-town prompt) as a
    :class:`~workbench.run.task_item.TaskItem` named by the prompt (``task``; one gold answer, ``.answer``; render it with
    ``.build(tokenizer)``). Only the names of :data:`EXAMPLES` are taken: never a path, nor a data set of ``data/``."""
    if not isinstance(name, str) or name not in EXAMPLES:
        raise ValueError(f"name: no bundled example {name!r}; available: {list(EXAMPLES)}")
    d = json.loads((DATA_DIR / f"{name}.json").read_text())
    item = TaskItem(task=d["name"], item_id=d["name"], documents=tuple(d["documents"]), query=d["query"],
                    answers=(d["answer"],), answer_doc=int(d["answer_doc"]), instruction=d["instruction"])
    return with_content_id(item, d["name"])
