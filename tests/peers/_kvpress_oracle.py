"""Running NVIDIA kvpress as a live oracle next to the workbench (peer environment only).

A press compresses the cache inside one prefill forward (its hooks run after every attention layer);
its kept positions are read back by matching the compressed cache's keys against the full prefill's keys
(a press gathers, it does not recompute; the two prefills differ only by float rounding of the attention
kernels, so each stored key lies within 1e-3 of its norm from exactly one prefill key), so the comparison
needs nothing from kvpress but its public presses.
"""
from __future__ import annotations

import contextlib

import torch

from workbench.run import adapter
from workbench.run.generate import stop_token_ids

ROWS: list[dict] = []  # the parity table, printed by conftest.pytest_terminal_summary


@contextlib.contextmanager
def attn_implementation(model, name: str):
    old = adapter.current_attn_implementation(model)
    adapter.set_attn_implementation(model, name)
    try:
        yield
    finally:
        adapter.set_attn_implementation(model, old)


@torch.no_grad()
def press_prefill(model, ids: list[int], press, *, eager: bool = False):
    """Prefill ``ids`` with ``press`` active; returns ``(cache, first token)``."""
    x = torch.tensor([ids])
    cache = adapter.new_cache(model)
    ctx = attn_implementation(model, "eager") if eager else contextlib.nullcontext()
    with ctx, press(model):
        out = adapter.forward(model, x, cache=cache, logits_to_keep=1)
    return adapter.output_cache(out) or cache, int(out.logits[0, -1].argmax())


def kept_positions(full_cache, cache, T: int) -> list[list[set]]:
    """Per layer and KV head, the prompt positions whose keys the compressed ``cache`` holds."""
    out = []
    for l in range(len(adapter.cache_layers(cache))):
        kf, _ = adapter.cache_kv(full_cache, l)
        kc, _ = adapter.cache_kv(cache, l)
        row = []
        for g in range(kf.shape[1]):
            d = torch.cdist(kc[0, g].double(), kf[0, g, :T].double())  # [B, T]
            two = d.topk(2, dim=-1, largest=False)
            scale = kc[0, g].double().norm(dim=-1)
            assert bool((two.values[:, 0] <= 1e-3 * scale).all()), "a compressed key matches no prefill key"
            assert bool((two.values[:, 1] > 1e-2 * scale).all()), "a compressed key matches two prefill keys"
            row.append(set(two.indices[:, 0].tolist()))
        out.append(row)
    return out


@torch.no_grad()
def greedy(model, tokenizer, cache, first: int, T: int, n: int) -> list[int]:
    """Greedy decoding from ``cache`` at the original positions ``T + t - 1`` (the workbench's rule)."""
    eos = stop_token_ids(model, tokenizer)
    y = [first]
    for t in range(1, n):
        if y[-1] in eos:
            break
        out = adapter.forward(model, torch.tensor([[y[-1]]]), cache=cache,
                              position_ids=torch.tensor([[T + t - 1]]), logits_to_keep=1)
        cache = adapter.output_cache(out) or cache
        y.append(int(out.logits[0, -1].argmax()))
    return y


def _members(kept_row) -> set:
    """The prompt positions of one workbench cell ``kept [B]``; ``-1`` marks a masked slot of a per-head budget
    (the dense cache holds the layer's largest head count), which is not a member."""
    return {p for p in kept_row.tolist() if p >= 0}


def jaccard(a: list[list[set]], kept) -> list[float]:
    """Jaccard of every layer × KV-head cell between kvpress's sets ``a`` and the workbench's ``kept [L, G, B]``
    (masked slots, ``-1``, excluded)."""
    out = []
    for l, row in enumerate(a):
        for g, s in enumerate(row):
            w = _members(kept[l, g])
            out.append(len(s & w) / len(s | w))
    return out


def near_tie_cells(a: list[list[set]], kept, scores, protected, rtol: float = 1e-5) -> tuple[int, int]:
    """``(cells that differ, of them cells where every differing position is a near-tie)``: a differing
    position's workbench score lies within ``rtol`` (relative) of the lowest kept unprotected score. Exact
    ties happen: RoPE preserves norms, so at layer 0 every repeat of a token has the same key norm, and
    float rounding alone orders them."""
    differ = ties = 0
    for l, row in enumerate(a):
        for g, theirs in enumerate(row):
            ours = _members(kept[l, g])
            diff = sorted(theirs ^ ours)
            if not diff:
                continue
            differ += 1
            s = scores[l, g].double()
            free = [p for p in ours if not protected[p]]
            cut = float(s[free].min())
            if all(abs(float(s[p]) - cut) <= rtol * max(abs(cut), 1e-12) for p in diff):
                ties += 1
    return differ, ties
