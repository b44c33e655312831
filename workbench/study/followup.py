"""Follow-up items (one context, two questions) and their sweep cells: the study's multi-turn protocol.

An item of ``followup_multikey`` is a RULER ``niah_multikey`` prompt (:func:`workbench.study.ruler.niah_multikey`:
``n_keys`` magic numbers of different keys in one haystack) asked twice: question 1 names the key the family asks
for, question 2 another key of the same haystack, drawn with a seeded generator. The item's ``query``,
``answers`` and ``answer_doc`` are question 2's (what the sweep scores: the second answer); question 1 rides in
``meta`` (``first_query``, ``first_answer``, ``first_answer_doc``, ``protocol = "followup"``), and the item id's
digest covers both questions.

On such an item the sweep's ``full`` and ``evict`` methods run the follow-up protocol
(:func:`workbench.rerun.eviction.followup.run_followup`): the prompt with question 1 is prefilled and evicted once,
answer 1 decoded, question 2 appended to the same cache as a second user turn (the chat template's), answer 2
decoded; ``full`` is the same with the full cache (the reference). Answer 2 is the row's answer; answer 1 and its
score are the row's ``first_answer`` and ``first_match``. A failure of either turn is the cell's error.
"""
from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from workbench.checks import Interval
from workbench.constraints import register_all
from workbench.rerun.eviction import FullCache
from workbench.rerun.eviction.followup import chat_next_turn, run_followup
from workbench.rerun.eviction.result import PolicyRunError
from workbench.study.metrics import string_match_part
from workbench.study.ruler import niah_multikey
from workbench.study.tasks.item import TaskItem, seeded_rng

__all__ = ["FOLLOWUP", "followup_multikey", "is_followup", "first_turn_item", "followup_cells", "full_job"]

FOLLOWUP = "followup"  # meta["protocol"] of a two-question item
_MAGIC = re.compile(r"One of the special magic numbers for (\S+) is: (\d+)\.")
# n_keys - 1 distractor keys: niah_multikey takes 1 to 50
_CHECKS = register_all("followup", {"n_keys": Interval("int", 2, 51)}, __name__)


def is_followup(item: TaskItem) -> bool:
    """Whether ``item`` is asked twice (the follow-up protocol), from its ``meta["protocol"]``."""
    return item.meta.get("protocol") == FOLLOWUP


def first_turn_item(item: TaskItem) -> TaskItem:
    """The item as question 1 asks it (its query, answer and answer document), the prompt of turn 1."""
    if not is_followup(item):
        raise ValueError(f"item: {item.item_id} is not a follow-up item (meta protocol={item.meta.get('protocol')!r})")
    d = int(item.meta["first_answer_doc"])
    return replace(item, query=item.meta["first_query"], answers=(item.meta["first_answer"],), answer_doc=d,
                   evidence_docs=(d,))


def followup_multikey(tokenizer, haystack: dict | None = None, *, lengths: Sequence[int] = (1024,), n: int = 1,
                      seed: int = 0, n_keys: int = 4, passage_tokens: int = 128) -> list[TaskItem]:
    """``n`` follow-up items per length from ``niah_multikey`` (``n_keys`` needles, ``n_keys ≥ 2``): question 1
    asks the family's key, question 2 another of its keys (seeded), each answered by its own needle's number
    (string_match_part). Deterministic in its arguments; ``haystack``: texts (e.g. ``datasets.load_essays``) or
    ``None`` for RULER's noise."""
    _CHECKS["n_keys"].check("n_keys", n_keys)
    base = niah_multikey(tokenizer, lengths=lengths, n=n, seed=seed, n_distractors=n_keys - 1,
                         passage_tokens=passage_tokens, haystack=haystack)
    out = []
    for it in base:
        needles = [(k, v, i) for i, doc in enumerate(it.documents) for k, v in _MAGIC.findall(doc)]
        q1_key = next(k for k, v, _ in needles if v == it.answers[0])
        others = sorted((k, v, i) for k, v, i in needles if k != q1_key)
        if not others:
            raise ValueError(f"n_keys: item {it.item_id} holds one key only; a second question needs another")
        k2, v2, d2 = seeded_rng(seed, "followup", it.item_id).choice(others)
        meta = dict(it.meta, protocol=FOLLOWUP, first_query=it.query, first_answer=it.answers[0],
                    first_answer_doc=it.answer_doc, cluster=str(it.meta.get("cluster", it.item_id)).replace(
                        "niah_multikey", "followup_multikey", 1))
        item = TaskItem(task="followup_multikey", item_id="-", documents=it.documents,
                        query=f"What is the special magic number for {k2} mentioned in the provided text?",
                        answers=(v2,), answer_doc=d2, instruction=it.instruction, meta=meta)
        both = hashlib.sha256((item.content_digest() + "\x00" + it.query + "\x00" + it.answers[0]).encode())
        base_id = it.item_id.split("#")[0].replace("niah_multikey", "followup_multikey", 1)
        out.append(replace(item, item_id=f"{base_id}#{both.hexdigest()[:8]}"))
    return out


def full_job(prompt, params: dict):
    """The reference setting: the full cache at ``B = T``."""
    return FullCache(), prompt.T


def followup_cells(lm, item: TaskItem, cells: Sequence[dict], job: Callable) -> list[dict | Exception]:
    """The sweep cells of a follow-up item (``job(prompt, params) -> (policy, B)`` resolves a cell's setting, as the
    ``evict`` method does; the ``full`` method's gives the full cache, :func:`full_job`): both turns from one shared prefill of the turn-1
    prompt. One row dict per cell (answer 2 scored by the sweep), or the cell's exception: a refused setting, or a
    :class:`PolicyRunError` naming the turn that failed."""
    if lm.tokenizer is None:
        raise ValueError("model: the follow-up protocol renders turn 2 with the tokenizer; this model has none")
    prompt = first_turn_item(item).build(lm.tokenizer, max_context=lm.shape.max_context)
    next_turn = chat_next_turn(lm.tokenizer, item.instruction, item.query)
    out: list = [None] * len(cells)
    jobs = {}
    for i, p in enumerate(cells):
        try:
            jobs[i] = job(prompt, p)
        except Exception as e:  # noqa: BLE001 - that cell's error: the sweep records or raises it
            out[i] = e
    if not jobs:
        return out
    lengths = {int(cells[i]["max_new_tokens"]) for i in jobs}
    if len(lengths) != 1:
        raise ValueError(f"max_new_tokens: the cells of one item decode one length, got {sorted(lengths)}")
    order = list(jobs)
    t0 = time.perf_counter()
    res = run_followup(lm, prompt, [jobs[i] for i in order], lengths.pop(), next_turn)
    share = (time.perf_counter() - t0) / len(order)
    for i, r in zip(order, res):
        if r.error is not None:  # either turn failed: a failed cell, never an answer to score
            out[i] = PolicyRunError(f"policy: {r.first.policy} failed at budget B = {r.first.budget} "
                                    f"(T = {prompt.T}): {r.error}")
            continue
        a1 = r.first.text or ""
        out[i] = {"generated_ids": list(r.second.ids), "prompt_tokens": prompt.T, "prefill_tokens": prompt.T,
                  "retained_tokens": r.first.kept_prompt.shape[-1], "kv_bytes": r.first.kv_bytes_after,
                  "kv_bytes_full": r.first.kv_bytes_before, "evicted_at": r.first.evicted_at,
                  "protocol": FOLLOWUP, "first_answer": a1, "first_match": string_match_part(a1, (
                      item.meta["first_answer"],)), "turn2_tokens": len(r.turn2_ids),
                  "followup_cache_entries": r.cache_entries, "method_s": share,
                  "prefill_s": r.first.timings.get("prefill", math.nan)}
    return out

