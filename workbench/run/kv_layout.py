"""Which cache rows each layer's attention reads, from the config: the KV heads of every layer (Gemma-4's global
layers may have fewer, ``num_global_key_value_heads``), the layer whose cache a KV-shared layer attends (Gemma-3n,
Gemma-4: ``num_kv_shared_layers``), and which (layer, KV group) cells of an eviction attend one stored row, so that
one kept set must serve them (re-exported by :mod:`workbench.run.adapter`)."""
from __future__ import annotations

import torch

__all__ = ["layer_kv_heads", "kv_source_layers", "kv_group_heads", "kv_ties"]


def _text_config(model):
    c = model.config
    get = getattr(c, "get_text_config", None)
    return get() if callable(get) else c


def layer_kv_heads(model) -> list[int]:
    """``G_l``: the KV heads of every layer's attention, from ``per_layer_config`` where the config sets them per
    layer; a KV-shared layer reads its source's (:func:`kv_source_layers`)."""
    c = _text_config(model)
    H_Q, L = int(c.num_attention_heads), int(c.num_hidden_layers)
    per = getattr(c, "per_layer_config", None)
    if per is not None:
        return [int(getattr(per[l], "num_key_value_heads", None) or H_Q) for l in range(L)]
    return [int(getattr(c, "num_key_value_heads", None) or H_Q)] * L


def kv_source_layers(model) -> list[int]:
    """For every layer, the layer whose cache it attends: itself, or, for a KV-shared layer (the config's
    ``kv_sharing_modes`` says ``"reuse"``), the last earlier non-shared layer of its kind (the one marked
    ``"store"``), whose keys and values the model passes to it; a shared layer has no cache of its own."""
    c = _text_config(model)
    L = int(c.num_hidden_layers)
    modes = getattr(c, "kv_sharing_modes", None)
    if not modes or "reuse" not in modes:
        return list(range(L))
    types = list(c.layer_types)
    store = {types[l]: l for l in range(L) if modes[l] == "store"}
    return [store[types[l]] if modes[l] == "reuse" else l for l in range(L)]


def _groups(model) -> tuple[int, int]:
    """``(H_Q, G)``: query heads and the finest KV grouping (the largest ``G_l``, as ``model_shape.G``)."""
    return int(_text_config(model).num_attention_heads), max(layer_kv_heads(model))


def kv_group_heads(model, layer: int) -> torch.Tensor:
    """The KV head of ``layer``'s cache (its source's) read by each KV group ``g`` of the model (int64 ``[G]``):
    the group's query heads ``g·r … g·r + r - 1`` read KV head ``h // r_l`` with ``r_l = H_Q / G_l`` (a coarser
    layer's KV head serves several groups)."""
    H_Q, G = _groups(model)
    G_l = layer_kv_heads(model)[kv_source_layers(model)[layer]]
    return torch.arange(G) * (H_Q // G) // (H_Q // G_l)


def kv_ties(model) -> torch.Tensor | None:
    """Which (layer, KV group) cells of a ``[L, G]`` selection attend one stored row: int64 ``[L, G]``, equal ids
    for cells reading the same KV head of the same cache layer (a coarser layer's KV head read by several groups;
    the layers sharing one cache). ``None`` when every cell has its own row."""
    src, Gs = kv_source_layers(model), layer_kv_heads(model)
    _, G = _groups(model)
    if src == list(range(len(src))) and set(Gs) == {G}:
        return None
    return torch.stack([src[l] * G + kv_group_heads(model, l) for l in range(len(src))])
