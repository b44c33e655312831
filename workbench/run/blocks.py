"""One decoder block's weights and a lone run of a block, per family (for the stability bounds, SPEC §7).

Everything family-specific comes from :mod:`workbench.run.families`: fused ``qkv_proj`` / ``gate_up_proj``
are split (Phi-3), the MLP activation is the config's (``hidden_act`` / ``hidden_activation``:
Gemma's GELU-tanh, not SiLU), LayerNorms are centred before their bound. A term that cannot be bounded
for a family raises :class:`Unavailable` with ``"not available for <family>: <reason>"``.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers.activations import ACT2FN

from workbench.run import families
from workbench.run.families import decoder_layers, family_of, final_norm, layer_chunk, layer_window, layers_owner

__all__ = ["Unavailable", "NormGain", "BlockWeights", "norm_gain_eps", "final_norm_gain", "lm_head_weight",
           "block_weights", "attention_output_weight", "run_block", "activation"]


class Unavailable(Exception):
    """A stability term the workbench cannot bound for this family (the message says which and why)."""


@dataclass(frozen=True)
class NormGain:
    """Effective gain ``γ`` (float32 ``[D]``), ``eps``, and ``centred`` (LayerNorm: mean removed first)."""

    gain: torch.Tensor
    eps: float
    centred: bool = False

    def __iter__(self):  # (gain, eps), as the RMSNorm form was used
        return iter((self.gain, self.eps))

    def __getitem__(self, i):
        return (self.gain, self.eps)[i]


def norm_gain_eps(norm: torch.nn.Module, fam: families.Family) -> NormGain:
    """``γ`` and ``eps`` of a norm module (Gemma stores ``γ - 1``; a LayerNorm without weight has ``γ = 1``)."""
    w = getattr(norm, "weight", None)
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)) or 1e-6)
    if w is None:
        raise Unavailable(f"not available for {fam.name}: a norm without a gain ({type(norm).__name__})")
    w = w.detach().float()
    if w.dim() != 1:  # per-head norms (Cohere's q/k norms) are not block norms
        raise Unavailable(f"not available for {fam.name}: a norm with gain of shape {list(w.shape)}")
    return NormGain(1.0 + w if fam.gemma_gain else w, eps, fam.norm_kind == "layer")


def final_norm_gain(model) -> NormGain:
    return norm_gain_eps(final_norm(model), family_of(model))


def lm_head_weight(model) -> torch.Tensor:
    """The output embedding ``W_out [V, D]``."""
    return model.get_output_embeddings().weight.detach().float()


def activation(model):
    """The MLP activation named by the config (``hidden_activation``, ``hidden_act`` or ``activation_function``)."""
    c = model.config
    c = c.get_text_config() if callable(getattr(c, "get_text_config", None)) else c
    for name in ("hidden_activation", "hidden_act", "activation_function"):
        a = getattr(c, name, None)
        if isinstance(a, str) and a:
            return a, ACT2FN[a]
    return "silu", ACT2FN["silu"]


@dataclass
class BlockWeights:
    """Weights of one block used by the Lipschitz constants (float32; ``W_Q [H_Q d, D]`` etc.).

    ``mlp``: ``{"gate", "up", "down"}`` (gated) or ``{"up", "down"}`` (plain) matrices ``[out, in]``;
    ``act_name``/``act``: the activation; ``gated``: ``down(act(gate x) ⊙ up x)`` vs ``down(act(up x))``.
    """

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    mlp: dict
    input_norm: NormGain
    post_norm: NormGain
    gated: bool = True
    act_name: str = "silu"
    act: object = None


def _w(m) -> torch.Tensor:
    return m.weight.detach().float()


def attention_output_weight(model, l: int) -> torch.Tensor:
    """The attention output projection ``W_O [D, H_Q d_v]`` of layer ``l`` (float32), from the family table;
    available for every family (no stability refusal: CriticalKV needs only this)."""
    fam = family_of(model)
    att = getattr(decoder_layers(model)[l], fam.attn)
    proj = getattr(att, fam.out, None)
    if proj is None or getattr(proj, "weight", None) is None:
        raise TypeError(f"model: {fam.name} layer {l} has no attention output projection {fam.attn}.{fam.out}")
    return _w(proj)


def block_weights(model, l: int) -> BlockWeights:
    """The block's weights, or :class:`Unavailable` (post-norm, parallel, MoE, unsplit fused projections)."""
    fam = family_of(model)
    why = families.unavailable(fam, "K")
    if why:
        raise Unavailable(why)
    layer = decoder_layers(model)[l]
    att, mlp = getattr(layer, fam.attn), getattr(layer, fam.mlp)
    c = model.config
    c = c.get_text_config() if callable(getattr(c, "get_text_config", None)) else c
    H, G = int(c.num_attention_heads), int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads)
    d = int(getattr(c, "head_dim", None) or c.hidden_size // H)
    if fam.qkv == "fused":
        W = _w(att.qkv_proj)
        WQ, WK, WV = W[: H * d], W[H * d: (H + G) * d], W[(H + G) * d:]
    else:
        WQ, WK, WV = _w(att.q_proj), _w(att.k_proj), _w(att.v_proj)
    WO = attention_output_weight(model, l)
    if fam.mlp_kind == "gated":
        mats, gated = {"gate": _w(mlp.gate_proj), "up": _w(mlp.up_proj), "down": _w(mlp.down_proj)}, True
    elif fam.mlp_kind == "gated_fused":
        gu = _w(mlp.gate_up_proj)
        half = gu.shape[0] // 2
        mats, gated = {"gate": gu[:half], "up": gu[half:], "down": _w(mlp.down_proj)}, True
    else:
        mats, gated = {"up": _w(getattr(mlp, fam.up)), "down": _w(getattr(mlp, fam.down))}, False
    name, act = activation(model)
    return BlockWeights(W_Q=WQ, W_K=WK, W_V=WV, W_O=WO, mlp=mats, gated=gated, act_name=name, act=act,
                        input_norm=norm_gain_eps(getattr(layer, fam.input_norm), fam),
                        post_norm=norm_gain_eps(getattr(layer, fam.mlp_norm), fam))


def run_block(model, l: int, hidden: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Block ``l`` alone on ``hidden [1, T', D]`` at ``position_ids [1, T']``, no cache.

    The mask is explicit (additive): causal, and for a sliding-window layer the window measured in
    original positions (``0 ≤ u - j < window``, SPEC §7 **[decided]**; a chunked layer's chunk too), so it is exact
    under every kernel. :class:`Unavailable` for a block that reads per-layer inputs (Gemma-4).
    """
    layer = decoder_layers(model)[l]
    if "per_layer_input" in inspect.signature(layer.forward).parameters:
        raise Unavailable(f"not available for {family_of(model).name}: its blocks read per-layer inputs computed "
                          f"from the token ids, which a block run alone on hidden states does not have")
    rot = getattr(layers_owner(model), "rotary_emb", None)
    c = model.config
    c = c.get_text_config() if callable(getattr(c, "get_text_config", None)) else c
    types = getattr(c, "layer_types", None)
    layer_type = getattr(layer, "attention_type", None) or (types[l] if types is not None else None)
    pe = None
    if rot is not None:
        try:
            pe = rot(hidden, position_ids, layer_type) if layer_type is not None else rot(hidden, position_ids)
        except TypeError:
            pe = rot(hidden, position_ids)
    p = position_ids[0].to(hidden.device)
    diff = p[:, None] - p[None, :]
    vis = diff >= 0
    w = layer_window(model, l)
    if w is not None:
        vis &= diff < w
    C = layer_chunk(model, l)
    if C is not None:  # chunked attention (Llama-4): the same chunk of original positions
        vis &= p[:, None] // C == p[None, :] // C
    mask = torch.zeros(vis.shape, dtype=hidden.dtype, device=hidden.device).masked_fill_(
        ~vis, torch.finfo(hidden.dtype).min)[None, None]
    extra = {}
    att = getattr(layer, family_of(model).attn, None)
    if att is not None and "cache_position" in inspect.signature(att.forward).parameters:
        extra["cache_position"] = position_ids[0]  # Ministral-3 under 5.2 scales its queries by the position
    out = layer(hidden, attention_mask=mask, position_embeddings=pe, position_ids=position_ids, use_cache=False,
                **extra)
    return out[0] if isinstance(out, tuple) else out
