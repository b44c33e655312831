"""The budget axes the field compares on, turned into the eviction budget ``B`` (positions kept per layer and KV
group) of one prompt:

* :func:`ratio_budget` — kvpress's ``compression_ratio`` ``r``: the fraction of the prompt's KV cache removed.
  kvpress's ``ScorerPress.compress`` keeps ``max(1, int(k_len * (1 - r)))`` positions; this is that expression,
  float rounding included, so that ``r = 0.25, 0.5, 0.75, 0.875`` keep ``⌊T·(1 − r)⌋`` (floor, never the
  ceiling that ``budget_frac`` takes: ``⌈budget_frac · T⌉``) and never fewer than one.
* :func:`ladder_budget` — the matched-byte ladder: the largest ``B`` whose cache after eviction holds at most
  ``kv_frac`` of the full prompt cache's **bytes**. Bytes and positions differ where layers differ in what they
  store: a sliding-window layer holds only its window (it shrinks only once ``B`` falls below it), a KV-shared layer
  stores nothing of its own, a hybrid's recurrent states do not shrink at all, a budget allocation keeps different
  counts per layer (layers with different KV-head counts then weigh differently), DeferKV keeps its first answer
  token. The bytes of a budget are predicted from the prefilled cache (bytes per stored position of each layer)
  and the policy's own selection (:func:`workbench.rerun.eviction.preview`, the one budget rule); the run then
  measures the bytes it kept (``kv_frac`` of the row). A rung below what ``B = 1`` keeps is refused with the
  fraction ``B = 1`` reaches: it is never rounded up to a budget that misses it.
"""
from __future__ import annotations

import math

from workbench.choices import QUERY_MODES
from workbench.constraints import PARAMS
from workbench.rerun.eviction import preview
from workbench.run import adapter

__all__ = ["ratio_budget", "ladder_budget", "predicted_bytes", "QUERY_MODES", "KVPRESS_RATIOS", "KV_LADDER"]

KVPRESS_RATIOS = (0.25, 0.5, 0.75, 0.875)
"""The compression ratios kvpress's RULER results are quoted at."""
KV_LADDER = (0.5, 0.25, 0.125, 0.0625)
"""The matched-byte ladder: KV bytes kept as a fraction of the full cache's."""


def ratio_budget(T: int, compression_ratio: float) -> int:
    """``B`` of kvpress's ``compression_ratio`` on a prompt of ``T`` positions: ``max(1, int(T * (1 - r)))``."""
    r = PARAMS["compression_ratio"].check("compression_ratio", compression_ratio)
    return max(1, int(int(T) * (1 - r)))


def _stored(cache, layer: int) -> int:
    return int(adapter.layer_positions(cache, layer).shape[-1]) if adapter.layer_bytes(cache)[layer] else 0


def predicted_bytes(session, policy, budget: int) -> int:
    """The key and value bytes the session's cache holds after ``policy`` evicts at ``budget`` (see the module
    docstring): each evictable layer stores the most positions any of its KV groups keeps (a sliding-window layer
    at most what it held), plus the decode steps the policy waits for; every other layer keeps what it holds."""
    cache = session.cache0
    per_layer = adapter.layer_bytes(cache)
    keep = preview(policy, session.evidence, int(budget))  # [L, G, M], -1-padded under a budget allocation
    if not bool((keep < 0).any()) and keep.shape[-1] >= session.T:
        return int(sum(per_layer))  # nothing evicted
    counts = (keep >= 0).sum(-1).amax(-1).tolist()
    src = adapter.kv_source_layers(session.model)
    row = {l: i for i, l in enumerate(session.layers)}
    total = 0
    for l, b in enumerate(per_layer):
        if not b:
            continue
        held = _stored(cache, l)
        if l not in row or src[l] != l:
            total += b
            continue
        n = int(counts[row[l]])
        if adapter.cache_layer_is_sliding(cache, l):
            n = min(n, held)
        total += (b // held) * (n + int(policy.defer))
    return total


def _bytes_or_none(session, policy, budget: int) -> int | None:
    """:func:`predicted_bytes`, or ``None`` for a budget the policy refuses (below its protected positions)."""
    try:
        return predicted_bytes(session, policy, budget)
    except ValueError as e:
        if str(e).startswith("budget:"):
            return None
        raise


def ladder_budget(session, policy, kv_frac: float) -> tuple[int, float]:
    """``(B, predicted fraction)``: the largest budget whose predicted bytes are at most ``kv_frac`` of the full
    prompt cache's (``session.cache0``), found by bisection (the bytes grow with ``B``) above the smallest budget the
    policy accepts (its protected sinks and recent window). Raises ``ValueError`` naming ``kv_frac`` when even that
    budget keeps more."""
    frac = PARAMS["kv_frac"].check("kv_frac", kv_frac)
    full = adapter.cache_bytes(session.cache0)
    target = frac * full
    lo, hi = 1, session.T  # the smallest accepted budget (B = T always is)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _bytes_or_none(session, policy, mid) is not None else (mid + 1, hi)
    least = predicted_bytes(session, policy, lo)
    if least > target:
        raise ValueError(f"kv_frac: {frac:g} is unreachable for {policy.name} on this prompt (T = {session.T}): its "
                         f"smallest budget B = {lo} (protected positions, at least one) keeps {least / full:.4f} of "
                         f"the KV bytes (with what sliding windows, shared or recurrent layers hold); allowed: kv_frac "
                         f">= {least / full:.4f}")
    hi = session.T
    while lo < hi:
        mid = math.ceil((lo + hi) / 2)
        lo, hi = (mid, hi) if predicted_bytes(session, policy, mid) <= target else (lo, mid - 1)
    return lo, predicted_bytes(session, policy, lo) / full
