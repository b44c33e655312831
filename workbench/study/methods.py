"""The methods a sweep can run, registered by name: ``full`` (full context, the reference),
``entroprefill`` (pruned prefill, SPEC §6–§7) and ``evict`` (one-shot KV eviction, SPEC §9).

This module imports the run-again layer (:mod:`workbench.rerun.prune`, :mod:`workbench.rerun.eviction`)
and registers into :mod:`workbench.study.sweep`; nothing imports back. Every method decodes with the one
stop rule of :mod:`workbench.run.generate`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

from workbench.analyse.params import EntroPrefillParams
from workbench.checks import is_int
from workbench.rerun.eviction import (
    ALL_POLICIES,
    EvictionSession,
    Needs,
    every_policy,
    policy_from_params,
    resolve_budget,
)
from workbench.rerun.eviction.result import PolicyRunError
from workbench.rerun.prune import run_pruned
from workbench.run.generate import greedy_generate, stop_token_ids
from workbench.study.sweep import register_method
from workbench.study.tasks import TaskItem

__all__ = ["run_full_context", "entroprefill", "evict", "evict_cells", "POLICY_FIELDS"]

POLICY_FIELDS = tuple(sorted({f for cls in ALL_POLICIES for f in cls.__dataclass_fields__} - {"seed"}))


@register_method("full", params=(), description="full context, greedy decoding (the reference)", replace=True)
def run_full_context(lm, item: TaskItem, params: dict) -> dict:
    """Full context, greedy decoding (the reference)."""
    prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
    ids, kv = greedy_generate(lm, prompt.spans.input_ids, params["max_new_tokens"], stop_token_ids(lm))
    return {"generated_ids": ids, "prompt_tokens": prompt.T, "prefill_tokens": prompt.T,
            "retained_tokens": prompt.T, "kv_bytes": kv}


@register_method("entroprefill", replace=True,
                 params=("priority", "layer", "target", "target_tokens", "eps_row", "m0", "zeta", "tau", "eps_s", "lam",
                         "eps_audit", "streak", "audit_mode", "m_a", "delta", "d_max"),
                 description="EntroPrefill pruned prefill (adaptive 7-step, or a fixed layer)")
def entroprefill(lm, item: TaskItem, params: dict) -> dict:
    """EntroPrefill: pruned prefill then greedy decoding (``layer``: None/"adaptive" or an int l*)."""
    p = {k: v for k, v in params.items() if k not in ("layer", "max_new_tokens", "seed")}
    ep = EntroPrefillParams(**p)
    layer = params.get("layer")
    if layer is not None and layer != "adaptive" and not is_int(layer):
        raise ValueError(f"layer: must be None, 'adaptive' or an integer layer (never truncated), got {layer!r}")
    layer = None if layer in (None, "adaptive") else int(layer)
    prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
    r = run_pruned(lm, prompt, ep, layer=layer, max_new_tokens=int(params["max_new_tokens"]), progress=False)
    spans = prompt.spans
    ans_chunk = spans.chunk_doc.index(spans.answer_doc) if spans.answer_doc in spans.chunk_doc else None
    return {"generated_ids": r.generated_ids, "prompt_tokens": r.T, "prefill_tokens": r.T,
            "retained_tokens": r.T_prime, "kv_bytes": r.kv_bytes, "l_star": r.l_star,
            "bypass": r.bypass, "removed_chunks": len(r.removed),
            "answer_chunk_removed": bool(ans_chunk is not None and ans_chunk in r.removed),
            "prefill_s": r.prefill_s, "decode_s": r.decode_s}


def _job(prompt, params: dict):
    extra = {k: v for k, v in params.items() if k in POLICY_FIELDS}
    policy = policy_from_params(params.get("policy", "full"), seed=int(params.get("seed", 0)), **extra)
    if policy.keeps_all and params.get("budget") is None and params.get("budget_frac") is None:
        B = prompt.T
    else:
        B = resolve_budget(prompt.T, params.get("budget"), params.get("budget_frac"))
    return policy, min(B, prompt.T)


@register_method("evict", replace=True, per_item=True, params=("policy", "budget", "budget_frac", *POLICY_FIELDS),
                 description="one-shot KV eviction after prefill (DeferKV: after decode step 1), then greedy decoding")
def evict_cells(lm, item: TaskItem, cells: Sequence[dict]) -> list[dict | Exception]:
    """KV eviction under each cell's ``policy`` at ``budget`` positions or ``budget_frac`` of the prompt (the
    full cache needs neither; the random policy takes the cell's seed), every cell of ``item`` from one
    shared prefill (an :class:`EvictionSession` holding the evidence every policy needs) and the cells of
    one seed decoded together (``EvictionSession.run_batch``: equal to one-by-one runs up to float rounding
    of batched products). Returns one row dict per cell, or the exception of a cell whose settings are
    refused or whose policy failed at run time (a :class:`PolicyRunError` naming the policy, the budget and
    the reason): the sweep records it as that cell's error, never as an answer.

    Timing rule: ``shared_s`` is the shared prefill's wall time (with its evidence capture and the
    full-cache decode the evidence needs: the first decode step, or the whole answer when a cell's policy needs
    its rows), the same for every cell of the item; ``shared_paid`` marks the
    first cell, which the sweep charges with the call's ``wall_s``; ``method_s`` is a cell's own work: the
    time of its batch (scoring, evicting and decoding every distinct setting of it) divided by the
    settings it holds; ``batched`` is the largest decode batch the cell was part of (1: it decoded alone,
    e.g. a per-head budget); the report amortises ``shared_s`` over the cells that share it."""
    prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
    out: list = [None] * len(cells)
    jobs = {}  # cell index -> (policy, B)
    for i, p in enumerate(cells):
        try:
            jobs[i] = _job(prompt, p)
        except Exception as e:  # noqa: BLE001 - that cell's error: the sweep records or raises it
            out[i] = e
    if not jobs:
        return out
    lengths = {int(cells[i]["max_new_tokens"]) for i in jobs}
    if len(lengths) != 1:
        raise ValueError(f"max_new_tokens: the cells of one item decode one length, got {sorted(lengths)}")
    # one prefill serves every cell, with every policy's evidence: a cell's scores never depend on which other
    # cells share its item (a resumed sweep, one cell alone). All but the full-cache answer's rows (``answer``:
    # the oracle's), taken only when a cell needs them: they cost a capturing decode of max_new_tokens steps, and
    # no other policy reads past the first decode row (the policy contract checks each policy on evidence cut to
    # what it declares: workbench.rerun.eviction.contract)
    every = dataclasses.replace(Needs.of(every_policy()), answer=False)
    union = Needs.of([pol for pol, _ in jobs.values()], every)
    t0 = time.perf_counter()
    sess = EvictionSession.prepare(lm, prompt, union, lengths.pop(), reusable=True, progress=False)
    shared_s = time.perf_counter() - t0
    first = min(jobs)
    by_seed: dict[int, list[int]] = {}
    for i in jobs:
        by_seed.setdefault(int(cells[i]["seed"]), []).append(i)
    for idx in by_seed.values():
        distinct = {}  # (repr(policy), B) -> (policy, B): equal settings decode once
        for i in idx:
            distinct.setdefault((repr(jobs[i][0]), jobs[i][1]), jobs[i])
        t0 = time.perf_counter()
        results = dict(zip(distinct, sess.run_batch(list(distinct.values()))))
        share = (time.perf_counter() - t0) / len(distinct)
        for i in idx:
            r = results[(repr(jobs[i][0]), jobs[i][1])]
            if r.error is not None:  # a policy that failed is a failed cell, never an empty answer to score
                out[i] = PolicyRunError(f"policy: {r.policy} failed at budget B = {r.budget} (T = {r.T}): {r.error}")
                continue
            kept = r.kept_prompt.shape[-1]
            out[i] = {"generated_ids": list(r.ids), "prompt_tokens": r.T, "prefill_tokens": r.T,
                      "retained_tokens": kept, "kv_bytes": r.kv_bytes_after, "kv_bytes_full": r.kv_bytes_before,
                      "budget_positions": kept, "evicted_at": r.evicted_at, "shared_prefill": True,
                      "shared_paid": i == first, "shared_s": shared_s, "method_s": share,
                      "batched": int(r.timings.get("batch", 1)), "prefill_s": r.timings.get("prefill", math.nan),
                      "score_s": r.timings.get("score", math.nan)}
    return out


def evict(lm, item: TaskItem, params: dict) -> dict:
    """One ``evict`` cell on its own (its own prefill): the row dict of :func:`evict_cells`."""
    (out,) = evict_cells(lm, item, [params])
    if isinstance(out, Exception):
        raise out
    return out
