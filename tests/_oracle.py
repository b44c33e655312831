"""The one harness the tests' oracles run through: the model's own forward with an attention function of the
test's own (usually the model's own eager kernel over a mask the test builds from scratch), registered through
transformers' attention interface, switched in for one call and always switched back."""
from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from workbench.capture import capture_attention
from workbench.run import adapter
from workbench.run.models import tiny_model
from workbench.run.spans import PromptSpans


def eager_llama(seed: int):
    """The eviction oracles' model: a tiny llama (3 layers, 4 query heads in 2 KV groups) on eager attention."""
    return tiny_model("llama", G=2, H_Q=4, L=3, seed=seed, attn_implementation="eager")


def four_passages() -> PromptSpans:
    """The eviction oracles' prompt: four passages of 10, 12, 9 and 11 tokens and an 8-token query."""
    return PromptSpans.synthetic([10, 12, 9, 11], query_len=8)


def forward_with(m, name: str, attention: Callable, ids, pos: torch.Tensor | None = None):
    """One prefill of ``ids`` (positions ``pos``, default ``0 … N-1``) with every attention call going to
    ``attention(module, query, key, value, attention_mask, **kw)``; the model's output (no cache)."""
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping["eager"])
    old = adapter.current_attn_implementation(m)
    m.set_attn_implementation(name)
    kw = {} if pos is None else {"position_ids": pos[None]}
    try:
        with torch.no_grad():
            return m(input_ids=torch.tensor([list(ids)]), use_cache=False, **kw)
    finally:
        m.set_attn_implementation(old)


def oracle_logits_with(m, name: str, attention: Callable, ids, pos: torch.Tensor) -> torch.Tensor:
    """float32 logits ``[N, V]`` of :func:`forward_with`."""
    return forward_with(m, name, attention, ids, pos).logits[0].float()


def visible_logits(m, ids, kept, gen_from: int) -> torch.Tensor:
    """Float logits ``[N, V]`` of one eager forward over ``ids`` (positions ``0 … N-1``): causal, and every row
    ``u ≥ gen_from`` of layer ``l`` and query head ``h`` (KV group ``h // (H / G)``) sees of the prompt only the
    positions ``kept[l, g]`` (``kept [L, G, S]``, the generated ones ``< gen_from`` included) and every position
    ``≥ gen_from``."""
    c = adapter.text_config(m.config)
    H, G = c.num_attention_heads, c.num_key_value_heads
    N = len(ids)
    pos = torch.arange(N)
    causal = pos[:, None] >= pos[None, :]

    def attention(module, query, key, value, attention_mask, **kw):
        vis = causal.expand(H, N, N).clone()
        for h in range(H):
            seen = torch.isin(pos, kept[module.layer_idx, h // (H // G)]) | (pos >= gen_from)  # [N] keys
            vis[h, gen_from:] &= seen[None, :]
        mask = torch.zeros(1, H, N, N, dtype=query.dtype).masked_fill(~vis[None], torch.finfo(query.dtype).min)
        return adapter.own_eager_function(module)(module, query, key, value, mask, **kw)

    return oracle_logits_with(m, "visible_oracle", attention, ids, pos)


def assert_capture_leaves_logits_unchanged(m, input_ids) -> None:
    """The logits of a prompt are bit-identical with the capture hooks on and off."""
    T = len(input_ids)
    x = torch.tensor([list(input_ids)])
    with torch.no_grad():
        off = m(x).logits
        with capture_attention(m, [T - 1], K=T, T=T):
            on = m(x).logits
    assert torch.equal(on, off)


def greedy_no_cache(m, ids, n: int, stop) -> list[int]:
    """Plain greedy decoding, no cache: the whole sequence recomputed at every step; the new ids (the stop id
    kept)."""
    ids, out = list(ids), []
    with torch.no_grad():
        for _ in range(n):
            y = int(m(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(y)
            ids.append(y)
            if y in stop:
                break
    return out
