"""The methods a sweep can run, registered by name: ``full`` (full context, the reference),
``entroprefill`` (pruned prefill, SPEC §6–§7) and ``evict`` (one-shot KV eviction, SPEC §9).

This module imports the run-again layer (:mod:`workbench.rerun.prune`, :mod:`workbench.rerun.eviction`)
and registers into :mod:`workbench.study.sweep`; nothing imports back. Every method decodes with the one
stop rule of :mod:`workbench.run.generate`.
"""
from __future__ import annotations

import math
import time

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
from workbench.rerun.prune import run_pruned
from workbench.run.generate import greedy_generate, stop_token_ids
from workbench.study.sweep import register_method
from workbench.study.tasks import TaskItem

__all__ = ["run_full_context", "entroprefill", "evict", "POLICY_FIELDS", "plan_evict_batches"]

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
            "retained_tokens": r.T_prime, "kv_bytes": r.kv_bytes, "l_star": -99 if r.l_star is None else r.l_star,
            "bypass": r.bypass, "removed_chunks": len(r.removed),
            "answer_chunk_removed": bool(ans_chunk is not None and ans_chunk in r.removed),
            "prefill_s": r.prefill_s, "decode_s": r.decode_s}


_SHARED: dict = {}
_PLAN: dict = {}  # (task, item_id) -> the evict settings to decode in one batch (plan_evict_batches)


def plan_evict_batches(items, settings) -> None:
    """Opt in to batched decoding: the first ``evict`` cell of each item in ``items`` evicts every setting of
    ``settings`` (dicts of ``evict`` parameters plus ``seed``) and decodes them together
    (``EvictionSession.run_batch``: equal to one-by-one runs up to float rounding of batched products); the
    item's later cells take their result from it. Timing rule: each planned cell's ``method_s`` is the
    plan's time (evicting and decoding all its settings) divided by their number; ``batched`` is the largest
    decode batch the cell was part of (1: it decoded alone, e.g. a per-head budget). ``settings=[]`` turns
    it off."""
    _PLAN.clear()
    for it in items if settings else ():
        _PLAN[(it.task, it.item_id)] = [dict(x) for x in settings]


def _job(prompt, params: dict):
    extra = {k: v for k, v in params.items() if k in POLICY_FIELDS}
    policy = policy_from_params(params.get("policy", "full"), seed=int(params.get("seed", 0)), **extra)
    if policy.keeps_all and params.get("budget") is None and params.get("budget_frac") is None:
        B = prompt.T
    else:
        B = resolve_budget(prompt.T, params.get("budget"), params.get("budget_frac"))
    return policy, min(B, prompt.T)


def _shared_session(lm, item, prompt, need: Needs, max_new_tokens: int) -> tuple[EvictionSession, float, bool]:
    """One reusable session per (model, item, decode length), holding the evidence every policy
    needs (and ``need``), so that consecutive sweep cells on one prompt share one prefill. Each run
    evicts a copy of the pristine cache, so a result equals :func:`generate_with_policy`'s.

    Returns ``(session, shared_s, paid)``: ``shared_s`` the wall time of the shared prefill (with its
    evidence capture and the full-cache decode the evidence needs), ``paid`` whether this call ran it."""
    key = (id(lm.model), item.task, item.item_id, max_new_tokens, tuple(prompt.spans.input_ids))
    union = Needs.of(every_policy(), need)  # every policy's evidence at once: a prompt's 30 cells share one prefill
    if _SHARED.get("key") == key and _SHARED["sess"].needs.merge(need) == _SHARED["sess"].needs:
        return _SHARED["sess"], _SHARED["shared_s"], False
    _SHARED.clear()  # one session at a time: its caches are the size of the prompt's KV cache
    t0 = time.perf_counter()
    sess = EvictionSession.prepare(lm, prompt, union, max_new_tokens, reusable=True, progress=False)
    shared_s = time.perf_counter() - t0
    _SHARED.update(key=key, sess=sess, shared_s=shared_s, results={})
    return sess, shared_s, True


@register_method("evict", replace=True, params=("policy", "budget", "budget_frac", *POLICY_FIELDS),
                 description="one-shot KV eviction after prefill (DeferKV: after decode step 1), then greedy decoding")
def evict(lm, item: TaskItem, params: dict) -> dict:
    """KV eviction under ``policy`` at ``budget`` positions or ``budget_frac`` of the prompt (the full
    cache needs neither); the random policy takes the sweep's seed."""
    prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
    policy, B = _job(prompt, params)
    n = int(params["max_new_tokens"])
    sess, shared_s, paid = _shared_session(lm, item, prompt, policy.needs(), n)
    done = _SHARED["results"]
    me = (repr(policy), B)
    batched = 1
    if me not in done and (item.task, item.item_id) in _PLAN:
        jobs = {}
        for p in _PLAN[(item.task, item.item_id)]:
            pol, b = _job(prompt, {**p, "seed": params["seed"]})
            if sess.needs.merge(pol.needs()) == sess.needs and (repr(pol), b) not in done:
                jobs[(repr(pol), b)] = (pol, b)
        if me in jobs:
            t0 = time.perf_counter()
            results = sess.run_batch(list(jobs.values()))
            share = (time.perf_counter() - t0) / len(jobs)
            for k, r in zip(jobs, results):
                done[k] = (r, share, int(r.timings.get("batch", 1)))
    if me in done:
        r, own_s, batched = done.pop(me)
    else:
        t0 = time.perf_counter()
        r = sess.run(policy, B)
        own_s = time.perf_counter() - t0
    kept = r.kept_prompt.shape[-1]
    # timing rule: `wall_s` charges the shared prefill to the cell that ran it (shared_paid); `method_s` is
    # this policy's own work (score, evict, decode from the shared cache); the report amortises `shared_s`
    # over the cells of the prompt that share it
    return {"generated_ids": list(r.ids), "prompt_tokens": r.T, "prefill_tokens": r.T, "retained_tokens": kept,
            "kv_bytes": r.kv_bytes_after, "kv_bytes_full": r.kv_bytes_before, "budget_positions": kept,
            "evicted_at": r.evicted_at, "shared_prefill": True, "shared_paid": paid, "shared_s": shared_s,
            "method_s": own_s, "batched": batched, "prefill_s": r.timings.get("prefill", math.nan),
            "score_s": r.timings.get("score", math.nan)}
