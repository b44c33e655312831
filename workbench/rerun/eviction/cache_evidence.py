"""Evidence read from the model rather than from attention rows: the prompt's keys and values from the cache
after prefill, the value-output norms ``‖W_O v‖`` (CriticalKV), and the statistics of the prompt's pre-RoPE
queries (ExpectedAttention). Filled by :meth:`~workbench.rerun.eviction.session.EvictionSession.prepare`."""
from __future__ import annotations

import torch
from torch import Tensor

from workbench.rerun.eviction.evidence import Evidence
from workbench.run import adapter, blocks

__all__ = ["QueryStats", "cache_evidence"]


class QueryStats:
    """Accumulates ``Σ q``, ``Σ q qᵀ`` (float64) and the first 16 pre-RoPE queries of a prefill, per layer.

    Called with the queries each attention call receives (post-norm, post-RoPE, ``[B, H_Q, T, d]``:
    :func:`~workbench.run.adapter.attention_queries`); ``maps`` (the rotary maps at ``0 … T-1``) turns them
    back to their pre-RoPE values, so fused projections, q-norms and every rotary convention are the model's."""

    def __init__(self, L: int, maps):
        self.sum, self.outer, self.first = [None] * L, [None] * L, [None] * L
        self.maps = maps
        self.active = True

    def __call__(self, l: int, q: Tensor) -> None:
        if not self.active or l < 0:
            return
        x = self.maps.apply(l, q[0].detach().to("cpu", torch.float64), inverse=True)  # [H_Q, T, d]
        self.sum[l] = x.sum(1)
        self.outer[l] = torch.einsum("hti,htj->hij", x, x)
        self.first[l] = x[:, :16].clone()

    def tensors(self, layers=None) -> tuple[Tensor, Tensor, Tensor]:
        """The statistics stacked over ``layers`` (default: every layer; a hybrid's recurrent layers have none)."""
        ls = range(len(self.sum)) if layers is None else layers
        return (torch.stack([self.sum[l] for l in ls]), torch.stack([self.outer[l] for l in ls]),
                torch.stack([self.first[l] for l in ls]))


def cache_evidence(model, cache, ev: Evidence, *, keys: bool, wov: bool, layers=None) -> None:
    """The prompt's keys and values from the cache after prefill (``ev.keys [L, G, T, d_k]``, ``ev.values
    [L, G, T, d_v]``), and ``ev.wov [L, H_Q, T]`` = ``‖W_O^h v_{g(h),j}‖_1`` (CriticalKV). A
    sliding-window layer stores only its window: the positions it dropped read as zero keys and values.
    Multi-head latent attention: the per-head keys and values the attention reads
    (:func:`~workbench.run.adapter.cache_head_kv`; a latent cache is expanded by the model's own ``expand_kv``),
    never the latents. ``layers``: the decoder layer of every evidence row (default ``0 … L-1``; a hybrid's
    evidence has one row per softmax layer). Where the KV heads vary per layer (Gemma-4), a group's entries are those
    of the KV head its query heads read (:func:`~workbench.run.adapter.kv_group_heads`); a KV-shared layer's are its
    source's."""
    T, L = ev.T, ev.L
    layers = list(range(L)) if layers is None else list(layers)
    if len(layers) != L:
        raise ValueError(f"layers: one decoder layer per evidence row (L = {L}), got {len(layers)}")
    K, V = [], []
    src = adapter.kv_source_layers(model)
    for l in layers:
        k, v = adapter.cache_head_kv(model, cache, src[l])  # a KV-shared layer attends its source's entries
        k, v = k[0, :, :T].float().cpu(), v[0, :, :T].float().cpu()  # [G_l, S, d], S = T (or the window)
        if k.shape[0] != ev.G:  # fewer KV heads on this layer: the one each group reads
            g_heads = adapter.kv_group_heads(model, l)
            k, v = k[g_heads], v[g_heads]
        if k.shape[1] < T:
            pad = T - k.shape[1]
            k = torch.cat([k.new_zeros(k.shape[0], pad, k.shape[2]), k], 1)
            v = torch.cat([v.new_zeros(v.shape[0], pad, v.shape[2]), v], 1)
        K.append(k)
        V.append(v)
    if keys:  # per-layer head sizes (Gemma-4): zero-padded to the widest head (norms and cosines unchanged)
        wk, wv = max(k.shape[-1] for k in K), max(v.shape[-1] for v in V)
        ev.keys = torch.stack([torch.nn.functional.pad(k, (0, wk - k.shape[-1])) for k in K])
        ev.values = torch.stack([torch.nn.functional.pad(v, (0, wv - v.shape[-1])) for v in V])
    if wov:
        hg = ev.head_group
        out = torch.empty(L, len(hg), T, dtype=torch.float64)
        for i, l in enumerate(layers):
            W_O = blocks.attention_output_weight(model, l).cpu()  # [D, H_Q d_v]
            d = V[i].shape[-1]  # d_v
            for h in range(len(hg)):
                out[i, h] = (V[i][int(hg[h])] @ W_O[:, h * d:(h + 1) * d].T).abs().sum(-1).double()
        ev.wov = out
