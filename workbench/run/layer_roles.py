"""What each decoder layer of a model is, by role, in one place: the capture, the eviction budget, the panels and
the report read it instead of asking the family table, the config and the modules each on their own.

A layer's role says what its cache holds per position:

- ``"full"``: softmax attention over every earlier key (a per-position key and value, evictable);
- ``"sliding"``: softmax attention within a window (:func:`~workbench.run.families.layer_window`; it stores only its
  window, evictable within it);
- ``"chunked"``: softmax attention within a chunk of original positions (Llama-4,
  :func:`~workbench.run.families.layer_chunk`; evictable);
- ``"latent"``: multi-head latent attention (DeepSeek): one latent per position shared by every head (evictable,
  as the union of its heads' kept sets);
- ``"recurrent"``: no softmax attention: a linear-attention, Mamba or short-convolution layer of a hybrid, whose
  state has a fixed size whatever the length (nothing per position, so nothing to evict);
- ``"shared"``: softmax attention over an earlier layer's keys and values (the last ``num_kv_shared_layers``
  layers of Gemma-3n / Gemma-4): it stores no cache of its own.

Independently of the role, :func:`state_layers` lists the layers that also keep a fixed-size recurrent or
convolution state (a hybrid's recurrent layers, and Falcon-H1's layers, which run Mamba-2 beside attention):
eviction leaves that state as it is, and the byte accounting reports it as not evictable. A budget is defined over
the evictable KV: a policy scores every layer with attention (:func:`scored_layers`) and keeps ``B`` positions per
stored KV head on each layer that holds a cache of its own (:func:`evictable_layers`; a KV-shared layer keeps its
source's set), and the recurrent state is not counted.
"""
from __future__ import annotations

from typing import Literal, get_args

from workbench.run import families

__all__ = ["Role", "ROLES", "EVICTABLE", "layer_roles", "evictable_layers", "scored_layers", "state_layers"]

Role = Literal["full", "sliding", "chunked", "latent", "recurrent", "shared"]
ROLES: tuple[str, ...] = get_args(Role)
EVICTABLE: frozenset[str] = frozenset({"full", "sliding", "chunked", "latent"})  # a per-position cache of its own


def _text_config(model):
    c = getattr(model, "config", model)
    get = getattr(c, "get_text_config", None)
    return get() if callable(get) else c


def layer_roles(model) -> tuple[Role, ...]:
    """The role of every decoder layer of ``model`` (see the module docstring), from the family table (its
    attention and state modules, MLA), the config (windows, chunks, ``num_kv_shared_layers``) and the modules
    (a hybrid's layer without an attention module is recurrent)."""
    fam = families.family_of(model)
    L = len(families.decoder_layers(model))
    soft = set(families.softmax_layers(model))
    shared = int(getattr(_text_config(model), "num_kv_shared_layers", 0) or 0)
    roles: list[Role] = []
    for l in range(L):
        if l not in soft:
            roles.append("recurrent")
        elif shared and l >= L - shared:
            roles.append("shared")
        elif fam.mla:
            roles.append("latent")
        elif families.layer_chunk(model, l) is not None:
            roles.append("chunked")
        elif families.layer_window(model, l) is not None:
            roles.append("sliding")
        else:
            roles.append("full")
    return tuple(roles)


def evictable_layers(model) -> list[int]:
    """The layers whose cache holds per-position keys and values of their own (roles in :data:`EVICTABLE`): the
    layers an eviction compacts and a budget is counted on."""
    return [l for l, r in enumerate(layer_roles(model)) if r in EVICTABLE]


def scored_layers(model) -> list[int]:
    """The layers a policy scores and an eviction's kept sets have a row for: every layer with softmax attention
    (all roles but ``"recurrent"``). A ``"shared"`` layer is scored with the layer whose cache it reads, one kept set
    per sharing group (:func:`workbench.run.kv_layout.kv_ties`), and stores nothing, so it is not among
    :func:`evictable_layers` (the bytes)."""
    return [l for l, r in enumerate(layer_roles(model)) if r != "recurrent"]


def state_layers(model) -> list[int]:
    """The layers that keep a fixed-size recurrent or convolution state (their block has one of the family's
    ``state`` modules: a hybrid's recurrent layers, and Falcon-H1's every layer, Mamba-2 beside attention)."""
    names = families.family_of(model).state
    return [l for l, blk in enumerate(families.decoder_layers(model))
            if any(getattr(blk, n, None) is not None for n in names)]
