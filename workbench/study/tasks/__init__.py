"""Prompt families of SPEC §10, built deterministically from real public text.

Every builder is a pure function of its data, its arguments and ``seed`` (Python's ``random.Random``
seeded from a string, so results do not depend on ``PYTHONHASHSEED``), and returns
:class:`TaskItem` s: documents (one candidate chunk each), a query, the gold answers and the index
of the document that holds the answer. ``item.build(tokenizer)`` renders it with
:func:`workbench.run.prompt.build_prompt`. An item's id ends with a digest of its content, so a sweep
never confuses two different items.

SQuAD v1.1 dev (``datasets.load_squad``):

* ``squad_single`` — single-hop RAG: the gold paragraph and ``n_distractors`` paragraphs of the same
  article that do not contain a gold answer, in a seeded order.
* ``squad_reordered`` — the same documents with the gold paragraph moved to each of ``positions``
  (first, middle, last by default): one item per position.
* ``squad_conflict`` — contradictory answer strings: one distractor is replaced by a copy of the gold
  paragraph whose answer is swapped for another answer of the same article (numeric for numeric).
  The gold answers stay the original ones; ``conflict_answers`` holds the planted one.

Paul Graham essays (``datasets.load_essays``), lengths in tokens of the given tokenizer:

* ``needle`` — a fact ("The secret number of the amber heron is 48213.") inserted at each depth of a
  haystack of each length. Every prompt has its own fact (its own key and value) and its own haystack
  (split into passages of about ``passage_tokens`` tokens, the candidate chunks), drawn from its own seeded
  region of the whole text (:class:`~workbench.study.tasks.haystack.Haystack`), so that prompts built from
  one long file are independent units (``meta.cluster``), not one fact at several depths of its first page.
* ``needle_diffuse`` — diffuse evidence: three facts, each one ingredient of a secret recipe, spread
  over three passages; the answer needs all three (``answer_parts``).
* ``needle_bridge`` — multi-hop bridge: "The amber heron key is kept by Ada Brennick." and "Ada
  Brennick lives in the town of Osterleigh."; the question names only the key.
"""
from __future__ import annotations

from workbench.study.tasks.families import (
    DEFAULT_MAX_NEW_TOKENS,
    TASK_MAX_NEW_TOKENS,
    TASKS,
    TaskFamily,
    build_task,
    max_new_tokens_for,
)
from workbench.study.tasks.haystack import Haystack, split_sentences
from workbench.study.tasks.item import TaskItem, items_frame
from workbench.study.tasks.items_file import ITEM_FIELDS, REQUIRED_FIELDS, load_items
from workbench.study.tasks.needles import needle, needle_bridge, needle_diffuse
from workbench.study.tasks.squad import squad_conflict, squad_reordered, squad_single

__all__ = ["TaskItem", "items_frame", "load_items", "squad_single", "squad_reordered", "squad_conflict", "needle",
           "needle_diffuse", "needle_bridge", "TASKS", "TaskFamily", "build_task", "split_sentences",
           "TASK_MAX_NEW_TOKENS", "DEFAULT_MAX_NEW_TOKENS", "max_new_tokens_for", "Haystack", "ITEM_FIELDS",
           "REQUIRED_FIELDS"]
