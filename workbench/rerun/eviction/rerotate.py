"""Re-rotation after compaction (StreamingLLM paper style, :meth:`EvictionSession.run`'s ``rerotate``): the kept key
in storage slot ``s`` is turned from its original position to position ``s``, so that decoding continues at the
compacted length (internal to :class:`~workbench.rerun.eviction.session.EvictionSession`)."""
from __future__ import annotations

import torch
from torch import Tensor

from workbench.run import adapter, rotary

__all__ = ["rerotate_keys"]


def rerotate_keys(model, cache, kept: Tensor, layers, compacted, *, uniform: bool) -> None:
    """Turn the stored keys of the ``compacted`` layers in place from their original positions ``kept [L, G, S]``
    (one row per evictable decoder layer ``layers``) to the slots ``0 … S-1``. ``uniform``: every layer and KV
    head keeps one count (refused otherwise, as with sliding-window layers, whose windows are measured in
    original positions, and with models without rotary positions)."""
    why = rotary.unavailable(model)
    if why:
        raise ValueError(f"rerotate: {why}")
    if not uniform:
        raise ValueError("rerotate: needs the same count in every layer and KV head (no budget allocation)")
    if any(adapter.cache_layer_is_sliding(cache, l) for l in layers):
        raise ValueError("rerotate: not with sliding-window layers (their window is measured in original "
                         "positions)")
    L_all, G, S = adapter.model_shape(model).L, kept.shape[1], kept.shape[-1]
    delta = torch.zeros(L_all, G, S, dtype=torch.int64)  # positions to turn back (other layers: none)
    delta[layers] = kept - torch.arange(S)
    maps = rotary.rotary_maps(model, delta.reshape(L_all, G * S))  # per layer; NoPE layers: the identity
    d = maps.cos.shape[-1]
    inv_sin = maps.sin.gather(-1, maps.pair[:, None, :].expand_as(maps.sin))  # R(δ)ᵀ = R(-δ)
    adapter.rotate_cache_keys(cache, compacted, maps.cos.reshape(L_all, G, S, d), inv_sin.reshape(L_all, G, S, d),
                              maps.pair)
