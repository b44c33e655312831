"""The task families by name (``TASKS``, :func:`build_task`) and each family's decode length."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import workbench.study.datasets as datasets
from workbench.study.tasks.item import TaskItem
from workbench.study.tasks.needles import needle, needle_bridge, needle_diffuse
from workbench.study.tasks.squad import squad_conflict, squad_reordered, squad_single

__all__ = ["TaskFamily", "TASKS", "TASK_MAX_NEW_TOKENS", "DEFAULT_MAX_NEW_TOKENS", "max_new_tokens_for", "build_task"]


@dataclass(frozen=True)
class TaskFamily:
    """A named builder: ``data`` is the source it reads (``squad`` or ``essays``)."""

    name: str
    builder: Callable
    data: str
    needs_tokenizer: bool
    description: str


TASKS: dict[str, TaskFamily] = {
    "squad_single": TaskFamily("squad_single", squad_single, "squad", False, "single-hop retrieval (SQuAD)"),
    "squad_reordered": TaskFamily("squad_reordered", squad_reordered, "squad", False, "reordered documents (SQuAD)"),
    "squad_conflict": TaskFamily("squad_conflict", squad_conflict, "squad", False, "contradictory answer (SQuAD)"),
    "needle": TaskFamily("needle", needle, "essays", True, "needle in a haystack (lengths x depths)"),
    "needle_diffuse": TaskFamily("needle_diffuse", needle_diffuse, "essays", True, "diffuse evidence"),
    "needle_bridge": TaskFamily("needle_bridge", needle_bridge, "essays", True, "multi-hop bridge"),
}


# greedy tokens a reply of each family needs (SmolLM2-class chat models preface the answer: "The secret number
# of the amber heron is 48213." is ~17 tokens); a reply that uses them all is flagged `hit_cap` by the sweep
TASK_MAX_NEW_TOKENS = {"squad_single": 32, "squad_reordered": 32, "squad_conflict": 32, "needle": 32,
                       "needle_diffuse": 40, "needle_bridge": 32,
                       # RULER-style families (workbench.study.ruler; RULER's own budgets, raised for chatty replies)
                       "niah_single": 32, "niah_multikey": 32, "niah_multivalue": 64, "niah_multiquery": 64,
                       "variable_tracking": 48, "common_words": 120, "frequent_words": 50, "qa_distractors": 32}
DEFAULT_MAX_NEW_TOKENS = 32


def max_new_tokens_for(task: str) -> int:
    """The default decode length of a family (:data:`TASK_MAX_NEW_TOKENS`, else ``DEFAULT_MAX_NEW_TOKENS``)."""
    return TASK_MAX_NEW_TOKENS.get(task, DEFAULT_MAX_NEW_TOKENS)


def build_task(name: str, tokenizer=None, *, source="cache", **kw) -> list[TaskItem]:
    """Build a family by name from its data (``source``: ``"cache"``, ``"sample"`` or a path; see
    :mod:`workbench.study.datasets`). Keyword arguments go to the builder (``n``, ``seed`` ...)."""

    if name not in TASKS:
        raise ValueError(f"name: must be one of {sorted(TASKS)}, got {name!r}")
    fam = TASKS[name]
    if fam.needs_tokenizer and tokenizer is None:
        raise ValueError(f"tokenizer: {name} measures lengths in tokens; pass the model's tokenizer")
    if fam.data == "squad":
        return fam.builder(datasets.load_squad(source), **kw)
    return fam.builder(tokenizer, datasets.load_essays(source), **kw)
