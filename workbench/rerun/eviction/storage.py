"""How an eviction's kept sets become cache storage and per-head masks (internal to
:class:`~workbench.rerun.eviction.session.EvictionSession`): a budget allocation in a dense per-KV-head cache
(:func:`ragged_storage`), a multi-head latent attention cache shared by every head (:func:`latent_union`), and the
rows each cache layer stores where KV heads vary per layer or layers share a cache (:func:`storage_rows`)."""
from __future__ import annotations

import torch
from torch import Tensor

from workbench.run import adapter

__all__ = ["latent_union", "ragged_storage", "storage_rows"]


def latent_union(keep: Tensor, gen: Tensor) -> tuple[list, dict | None]:
    """Multi-head latent attention with a latent cache: every head's key and value come from one stored latent per
    position, so layer ``l`` stores the union ``U_l`` of its heads' kept positions (``keep [L, H, M]``, ``-1``-padded
    with a budget allocation, then the generated ``gen``) once, as ``[1, |U_l|]``, and each head is masked off the
    positions of ``U_l`` it did not keep (``{l: bool [H, |U_l|]}``, True = hidden; applied per query head by
    :func:`~workbench.run.adapter.per_head_key_mask`), so that every head attends exactly its own kept set.
    ``None`` when every head of every layer keeps the same set (a per-layer selection needs no mask) and the layers
    have one length; otherwise a mask for every layer (all-False ones too: layers of different lengths need the mask
    rebuilt per layer)."""
    per_layer, drop = [], {}
    for l in range(keep.shape[0]):
        heads = [torch.cat([k[k >= 0], gen]) for k in keep[l]]
        U = torch.unique(torch.cat(heads))  # sorted
        per_layer.append(U[None])
        drop[l] = torch.stack([~torch.isin(U, h) for h in heads])
    if not any(bool(d.any()) for d in drop.values()) and len({p.shape[-1] for p in per_layer}) == 1:
        return per_layer, None
    return per_layer, drop


def ragged_storage(keep: Tensor, gen: Tensor) -> tuple[list, dict]:
    """A ``-1``-padded allocation ``keep [L, G, M]`` as one ``[G, S_l + n_gen]`` storage list per layer
    (``S_l`` its largest head count; a shorter head repeats its first kept position in the extra slots)
    and the masks ``{l: bool [G, S_l + n_gen]}`` hiding those extra slots."""
    per_layer, drop = [], {}
    for l in range(keep.shape[0]):
        valid = keep[l] >= 0
        S = int(valid.sum(-1).max())
        k = torch.where(valid[:, :S], keep[l, :, :S], keep[l, :, :1])
        per_layer.append(torch.cat([k, gen.expand(k.shape[0], -1)], -1))
        d = torch.cat([~valid[:, :S], torch.zeros(k.shape[0], gen.numel(), dtype=torch.bool)], -1)
        drop[l] = d
    if len({p.shape[-1] for p in per_layer}) > 1:  # layers of different lengths: every layer's mask rebuilt (eager)
        return per_layer, drop
    return per_layer, {l: d for l, d in drop.items() if bool(d.any())}

def storage_rows(model, per_layer: list) -> list:
    """Kept sets per layer and KV group (``[G, S]``, one group's row per stored KV head being enough: the cells of
    a tie keep one set, :meth:`~workbench.rerun.eviction.evidence.Evidence.pooled`) as the rows each cache layer stores: ``[G_l, S]``, one per KV
    head of the layer (``G_l < G`` where the layer has fewer KV heads), and ``None`` for a KV-shared layer, which
    stores nothing and attends its source's rows."""
    src = adapter.kv_source_layers(model)
    out = []
    for l, kp in enumerate(per_layer):
        if kp is None or src[l] != l:
            out.append(None)
            continue
        heads = adapter.kv_group_heads(model, l)  # [G]: the KV head each group reads
        first = [int(torch.nonzero(heads == j)[0]) for j in range(int(heads.max()) + 1)]
        rows = kp[first]
        if any(not torch.equal(kp[g], rows[int(heads[g])]) for g in range(kp.shape[0])):
            raise RuntimeError(f"eviction: layer {l}'s KV groups reading one KV head kept different sets")
        out.append(rows)
    return out
