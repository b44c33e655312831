"""Which cache rows each layer's attention reads, from the config: the KV heads of every layer (Gemma-4's global
layers may have fewer, ``num_global_key_value_heads``), the layer whose cache a KV-shared layer attends (Gemma-3n,
Gemma-4: ``num_kv_shared_layers``), and which (layer, KV group) cells of an eviction attend one stored row, so that
one kept set must serve them; and the attention geometry :func:`model_shape` built on them (re-exported by
:mod:`workbench.run.adapter`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ModelShape", "model_shape", "layer_kv_heads", "kv_source_layers", "kv_group_heads", "kv_ties"]


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


@dataclass(frozen=True)
class ModelShape:
    """Attention geometry of a decoder: ``L`` layers, ``H_Q`` query heads, ``G`` KV heads, head dim ``d`` (layer 0's
    where the config sets it per layer: Gemma-4's global layers have wider heads); per-layer KV heads (Gemma-4): ``G``
    is the largest count, a layer's ``G_l`` dividing it (:func:`layer_kv_heads`)."""

    L: int
    H_Q: int
    G: int
    d: int
    hidden: int
    intermediate: int
    vocab: int
    max_context: int
    model_type: str

    @property
    def r(self) -> int:
        return self.H_Q // self.G

    def head_group(self) -> torch.Tensor:
        """``g(h) = h // r`` for every query head (transformers' ``repeat_kv`` layout); int64 ``[H_Q]``."""
        return torch.arange(self.H_Q) // self.r


def _layer0(c, name: str):
    """``c.<name>``; for a per-layer attribute of a heterogeneous config (Gemma-4's ``head_dim``), layer 0's."""
    try:
        return getattr(c, name, None)
    except RuntimeError:  # transformers' AmbiguousGlobalPerLayerAttributeError
        return getattr(c.per_layer_config[0], name, None)


def _widest(size) -> int:
    """An MLP width: Gemma-3n gives one per layer (the widest is kept)."""
    return int(max(size)) if isinstance(size, (list, tuple)) else int(size)


def model_shape(model) -> ModelShape:
    c = _text_config(model)
    H_Q = int(c.num_attention_heads)
    G = max(layer_kv_heads(model))  # per-layer KV heads: the finest grouping
    d = int(_layer0(c, "head_dim") or c.hidden_size // H_Q)
    return ModelShape(
        L=int(c.num_hidden_layers),
        H_Q=H_Q,
        G=G,
        d=d,
        hidden=int(c.hidden_size),
        intermediate=_widest(getattr(c, "intermediate_size", 4 * c.hidden_size)),
        vocab=int(c.vocab_size),
        max_context=int(getattr(c, "max_position_embeddings", 0) or 0),
        model_type=str(getattr(c, "model_type", "unknown")),
    )
