"""Greedy decoding with one stop rule, shared by every method (full context, pruned prefill, eviction,
sweeps), so that methods compared in one study differ only in their method.

The stop rule: a reply ends after the first **stop token** (kept in the ids): the tokenizer's EOS or any
of the generation config's EOS ids (:func:`stop_token_ids`), or after ``max_new_tokens`` tokens.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from workbench.checks import check_max_new_tokens
from workbench.run import adapter

__all__ = ["stop_token_ids", "decode_answer", "truncate_at_stop", "greedy_continue", "greedy_generate"]


def stop_token_ids(model, tokenizer=None) -> frozenset[int]:
    """Token ids that end a reply: the tokenizer's EOS and the generation config's EOS ids.

    ``model``: an HF model or a :class:`~workbench.run.models.LoadedModel` (whose tokenizer is used when
    ``tokenizer`` is not given)."""
    if hasattr(model, "model") and hasattr(model, "tokenizer"):
        tokenizer = tokenizer if tokenizer is not None else model.tokenizer
        model = model.model
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for v in (getattr(tokenizer, "eos_token_id", None), getattr(gen, "eos_token_id", None)):
        if isinstance(v, int) and not isinstance(v, bool):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    return frozenset(ids)


def truncate_at_stop(ids: Sequence[int], stop_ids=frozenset()) -> list[int]:
    """``ids`` up to and including the first stop token."""
    ids = [int(i) for i in ids]
    for j, t in enumerate(ids):
        if t in stop_ids:
            return ids[: j + 1]
    return ids


def decode_answer(tokenizer, ids: Sequence[int], stop_ids=frozenset()) -> str:
    """Decode ``ids`` up to the first stop token (excluded), without special tokens, stripped."""
    ids = truncate_at_stop(ids, stop_ids)
    if ids and ids[-1] in stop_ids:
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=True).strip()


@torch.no_grad()
def greedy_continue(model, cache, first_token: int, T: int, max_new_tokens: int, stop_ids=frozenset(), *,
                    on_step: Callable[[int], None] | None = None) -> tuple[list[int], list[float], object]:
    """The one greedy decode loop: ``first_token`` (from the prefill's last logits) is token 1 at position
    ``T``; every further token is fed at its original position ``T + t - 1``. Stops after a stop token or
    ``max_new_tokens`` tokens.

    Returns ``(ids, seconds per decode forward, cache)``. ``on_step(t)`` is called before the forward
    that produces token ``t + 1`` (e.g. to move a capture's position)."""
    n = check_max_new_tokens(max_new_tokens)
    device = next(model.parameters()).device
    ids = [int(first_token)]
    steps: list[float] = []
    while len(ids) < n and ids[-1] not in stop_ids:
        pos = T + len(ids) - 1
        if on_step is not None:
            on_step(len(ids))
        t0 = time.perf_counter()
        out = adapter.forward(model, torch.tensor([[ids[-1]]], device=device), cache=cache,
                              position_ids=torch.tensor([[pos]], device=device), logits_to_keep=1)
        steps.append(time.perf_counter() - t0)
        cache = adapter.output_cache(out) or cache
        ids.append(int(out.logits[0, -1].argmax()))
    return ids, steps, cache


@torch.no_grad()
def greedy_generate(lm, input_ids: Sequence[int], max_new_tokens: int, stop_ids=frozenset(), *,
                    timings: dict | None = None) -> tuple[list[int], int]:
    """Prefill ``input_ids`` and greedily decode up to ``max_new_tokens`` tokens, stopping after a
    stop token (kept). Returns ``(generated ids, KV-cache bytes after the prefill)``. ``timings``: a dict that
    receives ``first_token_s``, the seconds from the call's start to the first generated token (the prefill and
    its argmax)."""
    t0 = time.perf_counter()
    check_max_new_tokens(max_new_tokens)
    model = getattr(lm, "model", lm)
    device = next(model.parameters()).device
    cache = adapter.new_cache(model)
    out = adapter.forward(model, torch.tensor([list(input_ids)], dtype=torch.int64, device=device), cache=cache,
                          logits_to_keep=1)
    first = int(out.logits[0, -1].argmax())  # a device sync: the token exists when the clock is read
    if timings is not None:
        timings["first_token_s"] = time.perf_counter() - t0
    cache = adapter.output_cache(out) or cache
    kv_bytes = adapter.cache_bytes(cache)
    ids, _, _ = greedy_continue(model, cache, first, len(input_ids), max_new_tokens, stop_ids)
    return ids, kv_bytes
