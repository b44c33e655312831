"""Running NVIDIA kvpress as a live oracle next to the workbench (peer environment only).

A press compresses the cache inside one prefill forward (its hooks run after every attention layer);
its kept positions are read back by matching the compressed cache's keys against the full prefill's keys
(a press gathers, it does not recompute; the two prefills differ only by float rounding of the attention
kernels, so each stored key lies within 1e-3 of its norm from exactly one prefill key), so the comparison
needs nothing from kvpress but its public presses.

The replay (:func:`record_prefill`, :func:`press_replay`): a press compresses the cache in a forward hook that runs
after each attention layer has computed its output over the full keys, so the prefill's hidden states, keys and
values do not depend on the press (the first token is the plain prefill's). One plain prefill per prompt records
what each layer's hook is handed (the module, its keyword inputs and its output); a press is then replayed by
calling kvpress's own ``press.forward_hook`` on those inputs, layer by layer in order, inside ``with press(model)``
(so the press's own set-up runs), with a cache that holds, at layer ``l``, the compressed layers ``< l`` and the
full layer ``l`` — what the pipeline's cache holds there. It runs kvpress's code on the inputs kvpress's pipeline
would hand it, without the forward; :func:`check_replay` asserts that it gives the pipeline's cache bit for bit.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import NamedTuple

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


@dataclass
class Recording:
    """One plain prefill: its ids, full cache, first token and per layer ``(module, hook kwargs, output)``."""

    ids: list
    cache: object
    first: int
    layers: list
    eager: bool


@torch.no_grad()
def record_prefill(model, ids: list[int], *, eager: bool = False) -> Recording:
    """A plain prefill of ``ids`` (no press; ``eager`` for presses that read the attention weights) recording what
    kvpress's forward hook is handed at every attention layer (see the module docstring)."""
    layers, handles = [], []

    def hook(module, args, kwargs, output):
        kw = {k: v for k, v in kwargs.items() if k != "past_key_values"}
        layers.append((module, kw, output))

    x = torch.tensor([ids])
    cache = adapter.new_cache(model)
    ctx = attn_implementation(model, "eager") if eager else contextlib.nullcontext()
    try:
        for lay in adapter.decoder_layers(model):
            handles.append(lay.self_attn.register_forward_hook(hook, with_kwargs=True))
        with ctx:
            out = adapter.forward(model, x, cache=cache, logits_to_keep=1)
    finally:
        for h in handles:
            h.remove()
    cache = adapter.output_cache(out) or cache
    assert len(layers) == len(adapter.cache_layers(cache))
    return Recording(list(ids), cache, int(out.logits[0, -1].argmax()), layers, eager)


@torch.no_grad()
def press_replay(model, rec: Recording, press):
    """kvpress's ``press`` on the recorded prefill (see the module docstring); returns ``(cache, first token)``."""
    cache = adapter.new_cache(model)
    ctx = attn_implementation(model, "eager") if rec.eager else contextlib.nullcontext()
    with ctx, press(model):  # the press's set-up (post_init_from_model, the modules' rotary_emb); no forward runs
        for l, (module, kw, output) in enumerate(rec.layers):
            k, v = adapter.cache_kv(rec.cache, l)
            cache.update(k.clone(), v.clone(), l)  # what the attention layer stores before its hook runs
            press.forward_hook(module, (), {**kw, "past_key_values": cache}, output)
    return cache, rec.first


def check_replay(model, rec: Recording, press, seed: int = 0) -> None:
    """The replay of ``press`` gives the cache (every layer's keys and values, bit for bit) and first token of
    kvpress's pipeline (the press inside one prefill forward), each after ``torch.manual_seed(seed)``."""
    attn = [lay.self_attn for lay in adapter.decoder_layers(model)]

    def masks():
        out = [getattr(m, "masked_key_indices", None) for m in attn]
        for m in attn:
            if hasattr(m, "masked_key_indices"):
                m.masked_key_indices = None
        return out

    torch.manual_seed(seed)
    ours, first = press_replay(model, rec, press)
    masks_r = masks()
    torch.manual_seed(seed)
    theirs, first_p = press_prefill(model, rec.ids, press, eager=rec.eager)
    masks_p = masks()
    assert first_p == first, "the pipeline's first token is not the plain prefill's"
    for l in range(len(adapter.cache_layers(theirs))):
        for a, b, what in zip(adapter.cache_kv(theirs, l), adapter.cache_kv(ours, l), ("keys", "values")):
            assert a.shape == b.shape and torch.equal(a, b), f"{type(press).__name__}: layer {l} {what} differ"
    for l, (mp, mr) in enumerate(zip(masks_p, masks_r)):  # AdaKVPress's per-head masks (set on the modules)
        assert (mp is None) == (mr is None), f"{type(press).__name__}: layer {l} masked keys differ"
        assert mp is None or all(torch.equal(a, b) for a, b in zip(mp, mr)), \
            f"{type(press).__name__}: layer {l} masked keys differ"


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


class TieCells(NamedTuple):
    """How the cells whose kept sets differ differ (see :func:`near_tie_cells`)."""

    differ: int  # cells whose kept sets differ
    exact: int   # of them, cells that differ only among bit-equal scores at the cut (the order rule, not the scoring)
    near: int    # of them, cells that differ only among scores within ``rtol`` of the cut (two roundings)


def near_tie_cells(a: list[list[set]], kept, scores, protected, rtol: float = 1e-5,
                   tiebreak_free: bool = True) -> TieCells:
    """Classify the cells where kvpress's sets ``a`` and the workbench's ``kept [L, G, B]`` differ.

    *Exact*: every differing position's workbench score (float64, as ``select_keep`` ranks) equals the lowest
    kept unprotected score bit for bit, so the sets differ only by which of equal scores fill the last slots:
    torch.topk's order among equal values is unspecified, the workbench's is its documented rule (lower position
    first; checked here when the policy has no tie-break key, ``tiebreak_free``, and an exact cell that breaks
    it raises). Such ties happen: RoPE preserves norms, so at layer 0 every repeat of a token has the same key
    norm. Exact ties are not a scoring difference and are not capped.
    *Near*: every differing position lies within ``rtol`` (relative) of that cut but not all bit-equal: two
    implementations rounding one formula differently; the callers cap these.
    """
    differ = exact = near = 0
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
            if all(float(s[p]) == cut for p in diff):
                if tiebreak_free and ours - theirs and theirs - ours:
                    assert max(ours - theirs) < min(theirs - ours), (
                        f"layer {l} KV head {g}: among equal scores the workbench kept {sorted(ours - theirs)}, "
                        f"not the lower positions (kvpress kept {sorted(theirs - ours)})")
                exact += 1
            elif all(abs(float(s[p]) - cut) <= rtol * max(abs(cut), 1e-12) for p in diff):
                near += 1
    return TieCells(differ, exact, near)
