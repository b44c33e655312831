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

from workbench.analyse.bypass import bypass_reason
from workbench.analyse.params import EntroPrefillParams
from workbench.checks import is_int
from workbench.constraints import PARAMS
from workbench.rerun.eviction import (
    ALL_POLICIES,
    EvictionSession,
    Needs,
    every_policy,
    policy_from_params,
    resolve_budget,
)
from workbench.rerun.eviction.agnostic import split_question
from workbench.rerun.eviction.result import PolicyRunError
from workbench.rerun.prune import run_pruned
from workbench.run import adapter
from workbench.run.generate import greedy_generate, stop_token_ids
from workbench.study.followup import followup_cells, full_job, is_followup
from workbench.study.kv_budget import ladder_budget, ratio_budget
from workbench.study.sweep import register_method
from workbench.study.tasks import TaskItem

__all__ = ["run_full_context", "entroprefill", "evict", "evict_cells", "POLICY_FIELDS", "BUDGET_KEYS"]

POLICY_FIELDS = tuple(sorted({f for cls in ALL_POLICIES for f in cls.__dataclass_fields__} - {"seed"}))


@register_method("full", params=(), description="full context, greedy decoding (the reference)", replace=True)
def run_full_context(lm, item: TaskItem, params: dict) -> dict:
    """Full context, greedy decoding (the reference); on a follow-up item both turns from the full cache."""
    if is_followup(item):
        (out,) = followup_cells(lm, item, [params], full_job)
        if isinstance(out, Exception):
            raise out
        return out
    prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
    timings: dict = {}
    ids, kv = greedy_generate(lm, prompt.spans.input_ids, params["max_new_tokens"], stop_token_ids(lm), timings=timings)
    return {"generated_ids": ids, "prompt_tokens": prompt.T, "prefill_tokens": prompt.T,
            "retained_tokens": prompt.T, "kv_bytes": kv, "kv_frac": 1.0, "compression_ratio": 0.0, "query": "aware",
            "ttft_s": timings["first_token_s"]}


@register_method("entroprefill", replace=True,
                 params=("priority", "layer", "target", "target_tokens", "eps_row", "m0", "zeta", "tau", "eps_s", "lam",
                         "eps_audit", "streak", "audit_mode", "m_a", "delta", "d_max"),
                 description="EntroPrefill pruned prefill (adaptive 7-step, or a fixed layer)")
def entroprefill(lm, item: TaskItem, params: dict) -> dict:
    """EntroPrefill: pruned prefill then greedy decoding (``layer``: None/"adaptive" or an int l*)."""
    p = {k: v for k, v in params.items() if k not in ("layer", "max_new_tokens", "seed")}
    ep = EntroPrefillParams(**p)
    if is_followup(item):  # a pruned prefill of turn 1 alone would answer question 2 with the pruned context
        raise ValueError(f"item: {item.item_id} is a follow-up item (two questions on one cache); entroprefill has no "
                         "follow-up protocol, run it under 'full' and 'evict'")
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
            "prefill_s": r.prefill_s, "decode_s": r.decode_s,
            # the pruned prefill reads the question (its observers); its forward yields the first token
            "query": "aware", "compression_ratio": 1.0 - r.T_prime / r.T, "ttft_s": r.prefill_s,
            # which step refused a bypassed prompt, with its numbers (adaptive mode only: a fixed layer never audits)
            **(bypass_reason(r.trace) if layer is None and r.trace is not None else {})}


BUDGET_KEYS = ("budget", "budget_frac", "compression_ratio", "kv_frac")
"""The ways a cell states its eviction budget, exactly one per evicting cell: positions, a fraction of the prompt
kept (``⌈budget_frac · T⌉``), kvpress's compression ratio (:func:`~workbench.study.kv_budget.ratio_budget`) or a rung
of the matched-byte ladder (:func:`~workbench.study.kv_budget.ladder_budget`, resolved on the prefilled cache)."""


def _policy(params: dict):
    extra = {k: v for k, v in params.items() if k in POLICY_FIELDS}
    return policy_from_params(params.get("policy", "full"), seed=int(params.get("seed", 0)), **extra)


def _job(T: int, params: dict, policy):
    """``(policy, B)`` of a cell on a cache of ``T`` prompt positions; ``B`` is ``None`` for a ladder rung (it needs
    the prefilled cache)."""
    given = [k for k in BUDGET_KEYS if params.get(k) is not None]
    if policy.keeps_all and not given:
        return policy, T
    if len(given) != 1:
        raise ValueError(f"budget: give exactly one of {', '.join(BUDGET_KEYS)} for an evicting policy, got "
                         f"{given or 'none'}")
    if given[0] == "kv_frac":
        PARAMS["kv_frac"].check("kv_frac", params["kv_frac"])
        return policy, None
    if given[0] == "compression_ratio":
        return policy, ratio_budget(T, params["compression_ratio"])
    return policy, min(resolve_budget(T, params.get("budget"), params.get("budget_frac")), T)


def _followup_job(prompt, params: dict):
    """``(policy, B)`` of a follow-up cell: the follow-up protocol runs query-aware at a budget known before the
    prefill (a ladder rung is resolved on the prefilled cache, which the two-turn run does not expose)."""
    policy = _policy(params)
    if params.get("kv_frac") is not None:
        raise ValueError("kv_frac: the follow-up protocol takes budget, budget_frac or compression_ratio; a rung of "
                         "the matched-byte ladder is not supported there")
    if params.get("query", "aware") != "aware":
        raise ValueError(f"query: the follow-up protocol asks both questions in the cache; allowed: 'aware', got "
                         f"{params.get('query')!r}")
    return _job(prompt.T, params, policy)


def _query(params: dict, policy) -> str:
    q = PARAMS["query"].check("query", params.get("query", "aware"))
    if q == "agnostic" and (policy.defer or policy.needs().answer):
        raise ValueError(f"query: {policy.name} cannot run query-agnostic: it "
                         f"{'evicts after the first answer step' if policy.defer else 'scores with the answer'}, "
                         "which needs the question in the cache; allowed: query='aware'")
    return q


def _failed(r) -> PolicyRunError:
    return PolicyRunError(f"policy: {r.policy} failed at budget B = {r.budget} (T = {r.T}): {r.error}")


def _row(r, full_bytes: int, compressed: int, method_s: float, query: str, ttft_s: float) -> dict:
    kept = r.kept_prompt.shape[-1]
    return {"generated_ids": list(r.ids), "retained_tokens": kept, "kv_bytes": r.kv_bytes_after,
            "kv_bytes_full": r.kv_bytes_before, "kv_frac": r.kv_bytes_after / full_bytes,
            "compressed_tokens": compressed, "compression_ratio": 1.0 - kept / compressed,
            "budget_positions": kept, "evicted_at": r.evicted_at, "shared_prefill": True, "method_s": method_s, "batched": int(r.timings.get("batch", 1)),
            "prefill_s": r.timings.get("prefill", math.nan), "score_s": r.timings.get("score", math.nan),
            "query": query, "ttft_s": ttft_s}


def _ladder(sess, jobs: dict, cells: Sequence[dict], out: list) -> None:
    """Resolve the ladder rungs of ``jobs`` (``B is None``) on the prefilled ``sess``; a rung out of reach is that
    cell's error."""
    for i, (pol, B) in list(jobs.items()):
        if B is None:
            try:
                jobs[i] = (pol, ladder_budget(sess, pol, cells[i]["kv_frac"])[0])
            except ValueError as e:
                out[i] = e
                del jobs[i]


def _overshoot(r, cell: dict, full_bytes: int) -> PolicyRunError | None:
    """A ladder cell whose measured bytes exceed its rung: failed, never scored at a rung it missed."""
    frac = cell.get("kv_frac")
    if frac is not None and r.kv_bytes_after > frac * full_bytes:
        return PolicyRunError(f"kv_frac: {r.policy} at B = {r.budget} kept {r.kv_bytes_after / full_bytes:.4f} of the "
                              f"KV bytes, above the rung {frac:g} (the byte prediction does not fit this cache)")
    return None


@register_method("evict", replace=True, per_item=True,
                 params=("policy", *BUDGET_KEYS, "query", *POLICY_FIELDS),
                 description="one-shot KV eviction after prefill (DeferKV: after decode step 1), then greedy decoding")
def evict_cells(lm, item: TaskItem, cells: Sequence[dict]) -> list[dict | Exception]:
    """KV eviction under each cell's ``policy`` at one of :data:`BUDGET_KEYS` (the full cache needs none; the random
    policy takes the cell's seed), every cell of ``item`` from one shared prefill (an :class:`EvictionSession`
    holding the evidence every policy needs) and the cells of one seed decoded together
    (``EvictionSession.run_batch``: equal to one-by-one runs up to float rounding of batched products). Returns one
    row dict per cell, or the exception of a cell whose settings are refused or whose policy failed at run time (a
    :class:`PolicyRunError` naming the policy, the budget and the reason): the sweep records it as that cell's error,
    never as an answer.

    ``query``: ``"aware"`` (default) prefills the whole prompt and evicts it (the question is in the cache it
    scores); ``"agnostic"`` (kvpress's default) prefills the context before the question alone, evicts it and reads
    the question from the compressed cache (:meth:`EvictionSession.run_questions`, as
    :func:`~workbench.rerun.eviction.run_question_agnostic`): its budget is over the context
    (``compressed_tokens``), and DeferKV and the oracle are refused (they need the question).

    Row figures: ``kv_frac`` = KV bytes after eviction / the bytes of the full cache of what was compressed;
    ``compression_ratio`` = ``1 − kept / compressed_tokens`` (achieved); ``ttft_s`` = time to the first generated
    token of the cell run alone: aware, the prefill forward (its logits give the first token before any eviction);
    agnostic, the context prefill + scoring + eviction + the question's forward.

    Timing rule: ``shared_s`` is the shared prefills' wall time (with their evidence capture and the
    full-cache decode the evidence needs: the first decode step, or the whole answer when a cell's policy needs
    its rows), the same for every cell of the item; ``shared_paid`` marks the
    first cell, which the sweep charges with the call's ``wall_s``; ``method_s`` is a cell's own work: the
    time of its batch (scoring, evicting and decoding every distinct setting of it) divided by the
    settings it holds; ``batched`` is the largest decode batch the cell was part of (1: it decoded alone,
    e.g. a per-head budget); the report amortises ``shared_s`` over the cells that share it."""
    if is_followup(item):  # two questions on one evicted cache (workbench.study.followup)
        return followup_cells(lm, item, cells, _followup_job)
    prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
    out: list = [None] * len(cells)
    jobs = {"aware": {}, "agnostic": {}}  # query mode -> {cell index: (policy, B)}
    context = question = None
    for i, p in enumerate(cells):
        try:
            pol = _policy(p)
            q = _query(p, pol)
            if q == "agnostic" and context is None:
                context, question = split_question(prompt)
            jobs[q][i] = _job(prompt.T if q == "aware" else len(context), p, pol)
        except Exception as e:  # noqa: BLE001 - that cell's error: the sweep records or raises it
            out[i] = e
    todo = [i for m in jobs.values() for i in m]
    if not todo:
        return out
    lengths = {int(cells[i]["max_new_tokens"]) for i in todo}
    if len(lengths) != 1:
        raise ValueError(f"max_new_tokens: the cells of one item decode one length, got {sorted(lengths)}")
    n = lengths.pop()
    # one prefill serves every cell of a mode, with every policy's evidence: a cell's scores never depend on which
    # other cells share its item (a resumed sweep, one cell alone). All but the full-cache answer's rows (``answer``:
    # the oracle's), taken only when a cell needs them: they cost a capturing decode of max_new_tokens steps, and
    # no other policy reads past the first decode row (the policy contract checks each policy on evidence cut to
    # what it declares: workbench.rerun.eviction.contract); query-agnostic, nothing past the context
    every = dataclasses.replace(Needs.of(every_policy()), answer=False)
    sessions, shared_s = {}, 0.0
    for mode, js in jobs.items():
        if js:
            base = every if mode == "aware" else dataclasses.replace(every, decode1=False)
            t0 = time.perf_counter()
            sessions[mode] = EvictionSession.prepare(lm, prompt if mode == "aware" else context,
                                                     Needs.of([pol for pol, _ in js.values()], base), n,
                                                     reusable=True, progress=False)
            shared_s += time.perf_counter() - t0
            _ladder(sessions[mode], js, cells, out)
    rows: dict[int, dict] = {}
    if "aware" in sessions:
        sess = sessions["aware"]
        full = adapter.cache_bytes(sess.cache0)
        by_seed: dict[int, list[int]] = {}
        for i in jobs["aware"]:
            by_seed.setdefault(int(cells[i]["seed"]), []).append(i)
        for idx in by_seed.values():
            distinct = {}  # (repr(policy), B) -> (policy, B): equal settings decode once
            for i in idx:
                distinct.setdefault((repr(jobs["aware"][i][0]), jobs["aware"][i][1]), jobs["aware"][i])
            t0 = time.perf_counter()
            results = dict(zip(distinct, sess.run_batch(list(distinct.values()))))
            share = (time.perf_counter() - t0) / len(distinct)
            for i in idx:
                r = results[(repr(jobs["aware"][i][0]), jobs["aware"][i][1])]
                bad = _failed(r) if r.error is not None else _overshoot(r, cells[i], full)
                if bad is not None:  # a policy that failed is a failed cell, never an empty answer to score
                    out[i] = bad
                    continue
                rows[i] = _row(r, full, prompt.T, share, "aware", r.timings.get("prefill", math.nan))
    if "agnostic" in sessions:
        sess = sessions["agnostic"]
        full = adapter.cache_bytes(sess.cache0)
        for i, (pol, B) in jobs["agnostic"].items():
            t0 = time.perf_counter()
            try:
                (r,) = sess.run_questions(pol, B, [question])
            except Exception as e:  # noqa: BLE001 - that cell's error
                out[i] = PolicyRunError(f"policy: {pol.name} failed query-agnostic at budget B = {B}: {e}")
                continue
            dt = time.perf_counter() - t0
            bad = _failed(r) if r.error is not None else _overshoot(r, cells[i], full)
            if bad is not None:
                out[i] = bad
                continue
            ttft = sum(r.timings.get(k, 0.0) for k in ("prefill", "score", "evict", "question"))
            rows[i] = _row(r, full, len(context), dt, "agnostic", ttft)
    first = min(rows) if rows else None
    for i, row in rows.items():
        out[i] = {**row, "prompt_tokens": prompt.T, "prefill_tokens": row["compressed_tokens"] if
                  row["query"] == "agnostic" else prompt.T, "shared_s": shared_s, "shared_paid": i == first}
    return out


def evict(lm, item: TaskItem, params: dict) -> dict:
    """One ``evict`` cell on its own (its own prefill): the row dict of :func:`evict_cells`."""
    (out,) = evict_cells(lm, item, [params])
    if isinstance(out, Exception):
        raise out
    return out
