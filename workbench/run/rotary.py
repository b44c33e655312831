"""Each layer's rotary map, read from the model's own rotary code (no convention assumed).

A rotary embedding turns a query or key at position ``p`` by ``R_l(p) = diag(cos) + diag(sin)·P``: every
coordinate ``i`` is mixed with one partner ``pair[i]`` (``rotate_half``: ``i ± d/2``; interleaved:
``i ^ 1``; partial rotary: the rotated part only, the rest kept with ``cos = 1, sin = 0``); a layer without
RoPE (SmolLM3's and Llama-4's ``no_rope_layers``, Cohere-2's global layers, EXAONE-4's global layers) has
``R = I``. :func:`rotary_maps` finds ``pair`` by applying the modelling module's own
``apply_rotary_pos_emb`` to the basis vectors at one position, then reads ``cos`` and ``sin`` at the asked
positions from two more applications, and checks that the map has that form. Families whose rotation is
not applied by such a function (MLA's split heads, Llama-4's complex frequencies) are refused with the
reason (:func:`unavailable`).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor

from workbench.run import adapter, families
from workbench.run.families import decoder_layers, family_of, layers_owner

__all__ = ["RotaryMaps", "rotary_maps", "rope_on_layer", "unavailable"]

_PROBE = 5  # a position where every frequency has a non-zero angle


@dataclass(frozen=True)
class RotaryMaps:
    """``R_l(p) x = cos ⊙ x + sin ⊙ x[pair]`` per layer: ``cos``, ``sin`` float64 ``[L, P, d]`` (the sign of
    the partner folded into ``sin``), ``pair`` int64 ``[L, d]`` (an involution; ``pair[i] = i`` with
    ``sin = 0`` for a coordinate that is not rotated), ``positions`` int64 ``[P]`` or ``[L, P]``."""

    cos: Tensor
    sin: Tensor
    pair: Tensor
    positions: Tensor

    def apply(self, l: int, x: Tensor, inverse: bool = False) -> Tensor:
        """``R_l(p) x`` (or ``R_l(p)ᵀ x``, its inverse) for ``x [..., P, d]`` at the map's positions."""
        c, s, pr = self.cos[l].to(x), self.sin[l].to(x), self.pair[l].to(x.device)
        if inverse:
            s = s.index_select(-1, pr)
        return x * c + x.index_select(-1, pr) * s

    def mean_matrix(self, l: int, n: int | None = None) -> Tensor:
        """``(1/n) Σ_p R_l(p)`` over the first ``n`` positions, float64 ``[d, d]``."""
        n = self.cos.shape[1] if n is None else n
        c, s = self.cos[l, :n].mean(0), self.sin[l, :n].mean(0)
        d = c.shape[-1]
        M = torch.diag(c)
        M[torch.arange(d), self.pair[l]] += s
        return M


def unavailable(model) -> str | None:
    """Why the workbench cannot read ``model``'s rotary maps (``None`` when it can)."""
    fam = family_of(model)
    if fam.rotary != "probe":
        return f"not available for {fam.name}: {fam.rotary}"
    if getattr(layers_owner(model), "rotary_emb", None) is None:
        return f"not available for {fam.name}: no shared rotary embedding (rotary_emb)"
    return None


def rope_on_layer(model, l: int) -> bool:
    """Whether layer ``l`` turns its queries and keys (``False`` for a NoPE layer)."""
    fam = family_of(model)
    att = getattr(decoder_layers(model)[l], fam.attn)
    if hasattr(att, "use_rope"):  # SmolLM3, Llama-4: no_rope_layers
        return bool(att.use_rope)
    if fam.nope == "global":  # Cohere-2: RoPE on the sliding-window layers only
        return getattr(att, "sliding_window", None) is not None
    if fam.nope == "global_if_hybrid":  # EXAONE-4: NoPE on the global layers of a hybrid model
        return families.layer_window(model, l) is not None or not families.sliding_layers(model)
    return True


def _own_apply(att):
    return adapter.own_modelling_function(att, "apply_rotary_pos_emb")


def _layer_pe(model, l: int, positions: Tensor, x: Tensor):
    rot = layers_owner(model).rotary_emb
    layer = decoder_layers(model)[l]
    c = model.config
    c = c.get_text_config() if callable(getattr(c, "get_text_config", None)) else c
    types = getattr(c, "layer_types", None)
    lt = getattr(layer, "attention_type", None) or getattr(getattr(layer, family_of(model).attn), "layer_type", None) \
        or (types[l] if types is not None else None)
    pos = positions[None].to(x.device)
    if lt is not None:
        try:
            return rot(x, pos, lt)
        except TypeError:
            pass
    return rot(x, pos)


def _rotate(fn, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    params = list(inspect.signature(fn).parameters)
    two = len(params) > 1 and params[1] in ("k", "key", "xk")

    def call(v):
        return fn(v, v, cos, sin)[0] if two else fn(v, cos, sin)

    dc = cos.shape[-1]
    if dc < x.shape[-1]:  # partial rotary: the attention may hand only the rotated part to the function
        try:
            return call(x)
        except RuntimeError:
            return torch.cat([call(x[..., :dc].contiguous()), x[..., dc:]], -1)
    return call(x)


@torch.no_grad()
def rotary_maps(model, positions: Tensor, d: int | None = None) -> RotaryMaps:
    """Every layer's rotary map at ``positions`` (int64 ``[P]``, or ``[L, P]``: each layer its own); ``ValueError``
    naming the family and the reason when it cannot be read."""
    why = unavailable(model)
    if why:
        raise ValueError(f"model: rotary maps {why}")
    fam = family_of(model)
    p = next(model.parameters())
    if d is None:
        c = model.config
        c = c.get_text_config() if callable(getattr(c, "get_text_config", None)) else c
        d = int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    L = len(decoder_layers(model))
    positions = torch.as_tensor(positions, dtype=torch.int64)
    if positions.dim() == 2 and positions.shape[0] != L:
        raise ValueError(f"positions: [L, P] needs L = {L} rows, got {positions.shape[0]}")
    per_layer = positions.expand(L, -1) if positions.dim() == 1 else positions
    P = per_layer.shape[-1]
    cos = torch.ones(L, P, d, dtype=torch.float64)
    sin = torch.zeros(L, P, d, dtype=torch.float64)
    pair = torch.arange(d).expand(L, d).clone()
    x0 = torch.zeros(1, device=p.device, dtype=torch.float32)
    for l in range(L):
        if getattr(decoder_layers(model)[l], fam.attn, None) is None or not rope_on_layer(model, l):
            continue  # a hybrid's recurrent layer (no attention) or a NoPE layer: the identity
        fn = _own_apply(getattr(decoder_layers(model)[l], fam.attn))
        c1, s1 = _layer_pe(model, l, torch.tensor([_PROBE]), x0)
        eye = torch.eye(d, device=p.device, dtype=torch.float32)[None, :, None, :]  # [1, d (basis), 1, d]
        M = _rotate(fn, eye, c1.float(), s1.float())[0, :, 0, :].double().cpu().T  # column j = R e_j
        off = M - torch.diag(torch.diagonal(M))
        nz = off != 0
        if bool((nz.sum(1) > 1).any()):
            raise ValueError(f"model: {fam.name} layer {l}: its rotary map mixes more than two coordinates")
        pr = torch.where(nz.any(1), nz.float().argmax(1), torch.arange(d))
        if not torch.equal(pr[pr], torch.arange(d)):
            raise ValueError(f"model: {fam.name} layer {l}: its rotary map is not a rotation of coordinate pairs")
        A = (pr >= torch.arange(d)).to(torch.float32)  # one coordinate of every pair (and the unrotated ones)
        B = 1.0 - A
        probe = torch.stack([A, B]).to(p.device)[None, :, None, :].expand(1, 2, P, d).contiguous()
        cP, sP = _layer_pe(model, l, per_layer[l], x0)
        y = _rotate(fn, probe, cP.float(), sP.float())[0].double().cpu()  # [2, P, d]
        inA = A.bool()
        cos[l] = torch.where(inA, y[0], y[1])
        sin[l] = torch.where(inA, y[1], y[0]) * (pr != torch.arange(d))
        pair[l] = pr
    return RotaryMaps(cos, sin, pair, positions)
