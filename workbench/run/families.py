"""Architecture families the workbench handles exactly: where a model keeps its decoder layers, final
norm, attention and MLP, and how its block is wired (a small table, one row per family).

:func:`family_of` derives the family of a model type outside the table from its modelling code
(:func:`derived_family`, :mod:`workbench.run.derive`; self-checked at load by :mod:`workbench.run.selfcheck`) or
refuses it with its architecture's reason (``load_model`` calls it, so a model is refused when it is loaded, never at
its first capture). A family is listed only when its row of
``tests/test_conformance.py`` passes: captured rows equal the model's own eager ``output_attentions``,
logits are bit-identical with capture on and off, the pruning oracles hold with a binding sliding window,
and eviction shrinks every layer kind. A hybrid row (``hybrid``: lfm2, qwen3_next, qwen3_5_text, granitemoehybrid,
jamba, bamba, falcon_h1; granitemoehybrid, bamba and falcon_h1 only from transformers 5.24, :data:`MIN_TRANSFORMERS`)
captures and evicts on its softmax layers (:func:`softmax_layers`; falcon_h1: every layer, Mamba-2 beside attention):
only they hold per-position keys and values, the recurrent or convolution state (``state`` modules,
:func:`workbench.run.layer_roles.state_layers`) has a fixed size and eviction leaves it as it is; every policy runs
over the softmax layers alone. Pruned prefill is refused at the call (:func:`prune_refusal`): the recurrent layers
read their input in sequence order, so a gathered sequence is not one the full model runs. gemma3n_text is
exact for capture and eviction (its KV-shared layers attend an earlier layer's cache: one kept set per sharing group,
:func:`workbench.run.adapter.kv_source_layers`); its pruned prefill is refused (:func:`prune_refusal`: AltUp's stacked
hidden streams). Each layer's role (full, sliding, chunked, latent, recurrent,
shared) is read in one place, :func:`workbench.run.layer_roles.layer_roles`. The MLA rows (deepseek_v2,
deepseek_v3: ``mla``) are exact for capture, pruned prefill and eviction (every policy but ExpectedAttention and the
kvpress presses, refused per policy: :func:`workbench.rerun.eviction.refusals.needs_refusal`). The llama4_text row
(chunked attention, :func:`layer_chunk`: chunks measured in original positions after a gather or an eviction) is exact
but for ExpectedAttention and ``rerotate`` (complex rotary) and for runs its NoPE layers' attention temperature reaches
(:func:`position_refusal`: pruned prefill and eviction refused at the call). The gemma4_text row (per-layer head
sizes; from transformers 5.24) is exact but for ExpectedAttention and ``rerotate``, with per-layer KV-head counts
(``num_global_key_value_heads``: kept sets ``[G_l, S]`` per layer) and KV shared across layers
(``num_kv_shared_layers``: one kept set per sharing group); per-layer counts that do not nest are refused from the
config (:func:`_check_gemma4`).

The weights the stability bounds need (:func:`block_weights`) come from the same table; a term the
workbench cannot bound for a family is reported as ``"not available for <family>: <reason>"``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.run import derive, version_floor
from workbench.run.version_floor import MIN_TRANSFORMERS, version_refusal  # noqa: F401  (re-exported)

__all__ = ["Family", "FAMILIES", "REFUSED", "family_of", "supported_families", "decoder_layers", "final_norm",
           "layer_window", "sliding_layers", "layer_chunk", "chunked_layers", "softmax_layers", "capture_only_refusal", "eviction_refusal",
           "prune_refusal", "position_refusal", "derived_family", "is_derived",
           "unavailable", "MIN_TRANSFORMERS", "version_refusal"]


@dataclass(frozen=True)
class Family:
    """Layout of one architecture family.

    Attributes:
        name: the family's name (the first of ``model_types``).
        model_types: ``config.model_type`` values of the family.
        layers, norm: attribute paths from the top model to the decoder block list and the final norm
            (the first that exists is used, so a multimodal wrapper's ``language_model`` is found too).
        attn, mlp: attribute names of the attention and MLP modules inside one block.
        qkv: ``"separate"`` (``q_proj``/``k_proj``/``v_proj``), ``"fused"`` (``qkv_proj``: rows Q | K | V),
            or the name of a fused projection the bounds do not split (``"c_attn"``, ``"query_key_value"``).
        block: ``"pre_norm"`` (``x + F(norm(x))``), ``"sandwich"`` (Gemma-2/3: norms before and after),
            ``"post_norm"`` (OLMo-2: ``x + norm(F(x))``) or ``"parallel"`` (attention and MLP read one norm).
        mlp_kind: ``"gated"`` (gate/up/down), ``"gated_fused"`` (``gate_up_proj``), ``"plain"``
            (up then down, ``up``/``down`` below) or ``"moe"`` (experts: no Jacobian bound).
        norm_kind: ``"rms"`` or ``"layer"`` (LayerNorm: centred first); ``gemma_gain``: the norm stores ``γ - 1``.
        input_norm, mlp_norm: attribute names of the block's attention-input and MLP-input norms.
        up, down: attribute names of a plain MLP's projections.
        eager_only: transformers runs the family only on ``eager`` (soft-capping, learned sinks).
        out: attribute name of the attention output projection (``W_O``, CriticalKV's value norms).
        rotary: ``"probe"`` (the rotary map is read from the model's own ``apply_rotary_pos_emb``,
            :mod:`workbench.run.rotary`) or the reason it cannot be (ExpectedAttention and ``rerotate`` refused).
        nope: which layers skip RoPE when the attention module does not say so itself (``use_rope``):
            ``""`` none, ``"global"`` the layers without a window (Cohere-2), ``"global_if_hybrid"`` those
            layers when the model has windowed ones (EXAONE-4).
        bound: ``""``, or why the stability constants ``K_l`` are not offered for the family (its block is not
            one the bounds were verified on); the per-block drift is still exact.
        capture_only: ``""``, or why only capture is offered (gemma3n_text: KV shared across layers): pruned
            prefill and eviction are refused with this reason.
        hybrid: ``""``, or what kind of hybrid the family is (softmax layers beside recurrent or convolution ones):
            rows are captured and the cache is evicted on its softmax-attention layers (:func:`softmax_layers`, the
            blocks that have an ``attn`` module); pruned prefill is refused (:func:`prune_refusal`).
        state: attribute names of the block modules that keep a fixed-size recurrent or convolution state
            (``mamba``, ``linear_attn``, ``conv``): not evictable, left as they are by an eviction.
        evict: ``""``, or why eviction (every policy) is refused while capture and pruned prefill are exact
            (:func:`eviction_refusal`; no family at present).
        prune: ``""``, or why pruned prefill is refused while capture and eviction are exact
            (:func:`prune_refusal`: Gemma-3n, whose blocks carry AltUp's stacked hidden streams).
        mla: multi-head latent attention (DeepSeek): the latent is expanded into one key per query head, so a
            config with ``num_key_value_heads != num_attention_heads`` is refused (the model cannot run it).
            Eviction is exact on both cache layouts (:func:`workbench.run.adapter.mla_latent_cache`): a latent
            cache keeps the union of its heads' kept sets, each head masked to its own; a per-head cache (transformers
            < 5.24) is compacted per head. ExpectedAttention, kvpress presses (:data:`MLA_PRESS`) and ``rerotate``
            are refused.
    """

    model_types: tuple[str, ...]
    layers: tuple[str, ...] = ("model.layers", "model.language_model.layers")
    norm: tuple[str, ...] = ("model.norm", "model.language_model.norm")
    attn: str = "self_attn"
    mlp: str = "mlp"
    qkv: str = "separate"
    block: str = "pre_norm"
    mlp_kind: str = "gated"
    norm_kind: str = "rms"
    gemma_gain: bool = False
    input_norm: str = "input_layernorm"
    mlp_norm: str = "post_attention_layernorm"
    up: str = "c_fc"
    down: str = "c_proj"
    eager_only: bool = False
    out: str = "o_proj"
    rotary: str = "probe"
    nope: str = ""
    bound: str = ""
    capture_only: str = ""
    hybrid: str = ""
    state: tuple[str, ...] = ()
    evict: str = ""
    prune: str = ""
    mla: bool = False

    @property
    def name(self) -> str:
        return self.model_types[0]


FAMILIES: tuple[Family, ...] = (
    Family(("llama", "smollm3")),
    Family(("mistral",)),
    Family(("mixtral",), mlp_kind="moe"),
    Family(("qwen2",)),
    Family(("qwen2_moe",), mlp_kind="moe"),
    Family(("qwen3",)),
    Family(("qwen3_moe",), mlp_kind="moe"),
    Family(("granite",)),
    Family(("gemma",), gemma_gain=True),
    Family(("gemma2",), block="sandwich", gemma_gain=True, mlp_norm="pre_feedforward_layernorm", eager_only=True),
    Family(("gemma3_text", "gemma3"), block="sandwich", gemma_gain=True, mlp_norm="pre_feedforward_layernorm"),
    Family(("phi3",), qkv="fused", mlp_kind="gated_fused"),
    Family(("olmo2",), block="post_norm"),
    Family(("cohere",), block="parallel", norm_kind="layer"),
    Family(("starcoder2",), mlp_kind="plain", norm_kind="layer"),
    Family(("gpt_neox",), layers=("gpt_neox.layers",), norm=("gpt_neox.final_layer_norm",), attn="attention",
           qkv="query_key_value", block="parallel", mlp_kind="plain", norm_kind="layer",
           up="dense_h_to_4h", down="dense_4h_to_h", out="dense"),
    Family(("gpt_oss",), mlp_kind="moe", eager_only=True),
    # current families (each a row of tests/test_conformance.py)
    Family(("ministral",)),
    Family(("ministral3",)),
    Family(("ernie4_5",)),
    Family(("seed_oss",)),
    Family(("helium",)),
    Family(("hunyuan_v1_dense",), bound="the stability constants are not verified on its block"),
    Family(("olmo",), norm_kind="layer", bound="its LayerNorms have no gain"),
    Family(("olmo3",), block="post_norm", mlp_norm="post_feedforward_layernorm"),
    Family(("exaone4",), block="post_norm", mlp_norm="post_feedforward_layernorm", nope="global_if_hybrid"),
    Family(("glm4",), mlp_kind="gated_fused", bound="sandwich norms around a fused gate/up MLP (the stability constants are not verified on its block)"),
    Family(("glm4_moe",), mlp_kind="moe"),
    Family(("apertus",), input_norm="attention_layernorm", mlp_norm="feedforward_layernorm", mlp_kind="plain",
           up="up_proj", down="down_proj", bound="xIELU activation"),
    Family(("arcee",), mlp_kind="plain", up="up_proj", down="down_proj", bound="the stability constants are not verified on its block"),
    Family(("cohere2",), block="parallel", norm_kind="layer", nope="global"),
    Family(("phi",), norm=("model.final_layernorm",), block="parallel", mlp_kind="plain", norm_kind="layer", up="fc1",
           down="fc2", out="dense"),
    Family(("phimoe",), mlp_kind="moe", norm_kind="layer"),
    Family(("granitemoe",), mlp="block_sparse_moe", mlp_kind="moe"),
    Family(("stablelm",), norm_kind="layer", bound="the stability constants are not verified on its block"),
    Family(("llama4_text",), mlp="feed_forward", mlp_kind="moe",
           rotary="complex rotary frequencies (its own apply_rotary_emb, no cos/sin maps to probe)",
           bound="chunked attention with a post-RoPE L2 q/k norm and NoPE layers"),
    Family(("gemma4_text",), block="sandwich", mlp_norm="pre_feedforward_layernorm",
           rotary="per-layer head sizes (the rotary maps are one head size wide on every layer)",
           bound="per-layer head sizes, per-layer inputs and a layer scalar around a sandwich block"),
    Family(("vaultgemma",), gemma_gain=True, mlp_norm="pre_feedforward_layernorm", eager_only=True, bound="the stability constants are not verified on its block"),
)
_ALTUP = ("its blocks carry AltUp's stacked hidden streams ([altup_num_inputs, B, T, D], the positions on the third "
          "axis) and per-layer inputs, which the mid-prefill gather of a block's hidden states does not restrict")
_HYBRID_PRUNE = ("its {state} layers read their input in sequence order, without positions: after a mid-prefill "
                 "gather they would run over the kept tokens as if they were adjacent (a convolution window or a "
                 "recurrent decay spanning the removed tokens), which no run of the full model equals, and a "
                 "gather cannot shorten the state they built over the whole prompt")

# hybrids (their rows of tests/test_conformance.py): capture and eviction on the softmax layers (the
# recurrent or convolution state is fixed-size and left as it is), pruned prefill refused (prune_refusal)
FAMILIES += (
    Family(("lfm2",), norm=("model.embedding_norm",), mlp="feed_forward", input_norm="operator_norm",
           mlp_norm="ffn_norm", out="out_proj", bound="hybrid of short convolutions and softmax layers",
           hybrid="hybrid of short convolutions and softmax layers", state=("conv",)),
    Family(("qwen3_next",), mlp_kind="moe", bound="hybrid of linear-attention (gated delta) and softmax layers",
           hybrid="hybrid of linear-attention (gated delta) and softmax layers", state=("linear_attn",)),
    Family(("qwen3_5_text",), bound="hybrid of linear-attention (gated delta) and softmax layers",
           hybrid="hybrid of linear-attention (gated delta) and softmax layers", state=("linear_attn",)),
    Family(("granitemoehybrid",), mlp="block_sparse_moe", mlp_kind="moe", bound="hybrid of Mamba-2 and softmax layers",
           hybrid="hybrid of Mamba-2 and softmax layers", state=("mamba",)),
    Family(("jamba",), norm=("model.final_layernorm",), mlp="feed_forward", mlp_norm="pre_ff_layernorm",
           mlp_kind="moe", bound="hybrid of Mamba and softmax layers", hybrid="hybrid of Mamba and softmax layers",
           state=("mamba",)),
    Family(("bamba",), norm=("model.final_layernorm",), mlp="feed_forward", mlp_norm="pre_ff_layernorm",
           bound="hybrid of Mamba-2 and softmax layers", hybrid="hybrid of Mamba-2 and softmax layers",
           state=("mamba",)),
    Family(("falcon_h1",), norm=("model.final_layernorm",), mlp="feed_forward", mlp_norm="pre_ff_layernorm",
           bound="every layer runs Mamba-2 beside softmax attention",
           hybrid="every layer runs Mamba-2 beside softmax attention", state=("mamba",)),
)
# KV shared across layers: capture and eviction exact (one kept set per sharing group), pruned prefill refused
FAMILIES += (
    Family(("gemma3n_text",), block="sandwich", mlp_norm="pre_feedforward_layernorm",
           bound="AltUp streams, a LAuReL branch and per-layer inputs around a sandwich block", prune=_ALTUP),
)

# multi-head latent attention: capture, pruned prefill and eviction exact. Under transformers >= 5.24 the
# cache stores one latent and one shared rope key per position (adapter.mla_latent_cache): a layer keeps the union of
# its heads' kept sets and every head is masked to its own; under 5.2 it stores per-head keys and values (G = H_Q,
# d_k != d_v), compacted per head. Refused per policy: ExpectedAttention (the rotary maps, _MLA_ROPE) and kvpress
# presses (MLA_PRESS); rerotate (_MLA_ROPE).
_MLA = "multi-head latent attention"
MLA_PRESS = (_MLA + ": a kvpress press scores from the attention module's inputs with kvpress's own reading of its "
             "q/k projections and of the cache, and the model has no per-head key projection (keys come from a "
             "shared latent through kv_b_proj and a decoupled rope part) nor, under transformers >= 5.24, per-head "
             "keys in its cache; the wrapping is not verified on it")
_MLA_ROPE = (_MLA + ": RoPE turns only the decoupled rope part of each head (the key's is shared by every head) and "
             "is applied inside the attention, not by a rotary map over the whole head")
_MLA_BOUND = (_MLA + " (no per-head W_Q, W_K, W_V: queries and keys come through low-rank latents and a decoupled "
              "rope part) with a mixture-of-experts MLP")
FAMILIES += (
    Family(("deepseek_v3",), mlp_kind="moe", rotary=_MLA_ROPE, bound=_MLA_BOUND, mla=True),
    Family(("deepseek_v2",), mlp_kind="moe", rotary=_MLA_ROPE + " (complex frequencies)", bound=_MLA_BOUND, mla=True),
)
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}

# families seen and refused, with the reason (the refusal is their row of the conformance matrix)
REFUSED: dict[str, str] = {
    "gpt2": "its forward reshapes the hidden states to the input length after the last block, so pruned "
            "execution (a mid-prefill gather to T' < T tokens) cannot run through it",
    "falcon": "its config derives head_dim and its attention mixes ALiBi and fused multi-query layouts that "
              "the capture and the pruning gather are not verified against",
}


def supported_families() -> list[str]:
    return [f.name for f in FAMILIES]


def _text_type(model) -> str:
    c = getattr(model, "config", model)  # a model or its config
    get = getattr(c, "get_text_config", None)
    try:
        tc = get() if callable(get) else c
    except ValueError:  # several text configs (MusicGen: text encoder and decoder): the outer type decides
        tc = c
    return str(getattr(c, "model_type", "") if getattr(c, "model_type", "") in _BY_TYPE else
               getattr(tc, "model_type", "unknown"))


def family_of(model) -> Family:
    """The :class:`Family` of a model (or of its config); ``TypeError`` naming the supported families when it
    has none."""
    mt = _text_type(model)
    fam = _BY_TYPE.get(mt)
    if fam is None and mt not in REFUSED and derive.refusal(mt) is None:
        fam = derived_family(mt)  # outside the table: derived from the modelling code, self-checked at load
    c = getattr(model, "config", model)
    outer = str(getattr(c, "model_type", "") or "")
    if fam is not None and outer and outer != mt and outer not in _BY_TYPE:
        raise TypeError(f"model: the {outer!r} configuration wraps a {mt!r} language model with other modalities "
                        f"(vision, audio); the workbench loads decoder-only causal LMs and does not unwrap it. Save "
                        f"the language model on its own (its text_config and language_model weights) and load that. "
                        f"Supported families: {', '.join(supported_families())}")
    if fam is None:
        why = REFUSED.get(mt) or derive.refusal(mt)
        what = type(model).__name__.replace("Config", "")
        raise TypeError(f"model: the {mt!r} architecture ({what}) is not supported: {why}. "
                        f"Supported families: {', '.join(supported_families())}")
    too_old = version_refusal(mt)
    if too_old:
        raise TypeError(f"model: the {mt!r} architecture is not supported by the workbench under this transformers: "
                        f"{too_old}. Supported families: {', '.join(supported_families())}")
    if fam.name == "gemma4_text":
        _check_gemma4(c, mt)
    if fam.mla:
        tc = c.get_text_config() if callable(getattr(c, "get_text_config", None)) else c
        H = getattr(tc, "num_attention_heads", None)
        G = getattr(tc, "num_key_value_heads", None) or H
        if H is not None and G != H:
            raise TypeError(f"model: the {mt!r} configuration has num_key_value_heads = {G} != num_attention_heads = "
                            f"{H}; multi-head latent attention expands its latent into one key per query head, so "
                            f"the model itself cannot run it")
    return fam


_DERIVED: dict[str, Family] = {}


def derived_family(model_type: str) -> Family:
    """The :class:`Family` of a model type outside the table, derived from its modelling code
    (:func:`workbench.run.derive.layout`; ``TypeError`` with the architecture's reason when it cannot be); MLA
    layouts get the MLA row's rotary and bound reasons."""
    if model_type not in _DERIVED:
        kw = derive.layout(model_type)
        if kw["mla"]:
            kw.update(rotary=_MLA_ROPE, bound=_MLA_BOUND)
        _DERIVED[model_type] = Family(**kw)
    return _DERIVED[model_type]


def is_derived(fam: Family) -> bool:
    """Whether ``fam`` was derived from the modelling code (not a row of the table): checked at load."""
    return fam not in FAMILIES


def _check_gemma4(c, mt: str) -> None:
    """Refuse, from the config, a Gemma-4 whose KV-head counts do not nest: a layer's ``G_l`` KV heads
    (``num_global_key_value_heads`` on its global layers) must divide the largest count, so that each KV head of a
    layer serves whole groups of the finest layer (:func:`workbench.run.adapter.kv_group_heads`). KV sharing across
    layers (``num_kv_shared_layers``) is covered: one kept set per sharing group."""
    tc = c.get_text_config() if callable(getattr(c, "get_text_config", None)) else c
    per = getattr(tc, "per_layer_config", None)
    if per is None:
        return
    H = int(tc.num_attention_heads)
    Gs = sorted({int(getattr(per[l], "num_key_value_heads", 0) or H) for l in range(int(tc.num_hidden_layers))})
    if any(Gs[-1] % g for g in Gs):
        raise TypeError(f"model: the {mt!r} configuration has per-layer KV-head counts {Gs} "
                        f"(num_global_key_value_heads) that do not divide the largest ({Gs[-1]}); the workbench "
                        f"covers per-layer counts that nest (each layer's KV heads serve whole groups of the finest "
                        f"layer). Supported families: {', '.join(supported_families())}")


def _walk(model, paths):
    for p in paths:
        obj = model
        for part in p.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None:
            return obj
    return None


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder blocks, from the family table."""
    layers = _walk(model, family_of(model).layers)
    if not isinstance(layers, torch.nn.ModuleList):
        raise TypeError(f"model: cannot find the decoder layers of {type(model).__name__}")
    return layers


def layers_owner(model) -> torch.nn.Module:
    """The module that owns the decoder blocks (``model.model``, ``transformer``, ``gpt_neox``)."""
    path = next(p for p in family_of(model).layers if _walk(model, (p,)) is not None)
    return _walk(model, (path.rsplit(".", 1)[0],))


def final_norm(model) -> torch.nn.Module:
    norm = _walk(model, family_of(model).norm)
    if not isinstance(norm, torch.nn.Module):
        raise TypeError(f"model: cannot find the final norm of {type(model).__name__}")
    return norm


def layer_window(model, l: int) -> int | None:
    """Sliding window of layer ``l`` (keys with ``u - j < window`` are visible), ``None`` for full attention."""
    c = model.config
    c = c.get_text_config() if callable(getattr(c, "get_text_config", None)) else c
    w = getattr(c, "sliding_window", None)
    if not w:
        return None
    types = getattr(c, "layer_types", None)
    if types is not None:
        return int(w) if "sliding" in str(types[l]) else None
    if getattr(c, "use_sliding_window", True) is False:
        return None
    return int(w)


def layer_chunk(model, l: int) -> int | None:
    """Chunk size of a chunked-attention layer ``l`` (Llama-4: key ``j`` is visible from query ``u`` when
    ``j ≤ u`` and ``j // chunk == u // chunk``, in original positions), ``None`` for every other layer."""
    c = model.config
    c = c.get_text_config() if callable(getattr(c, "get_text_config", None)) else c
    chunk = getattr(c, "attention_chunk_size", None)
    types = getattr(c, "layer_types", None)
    if not chunk or types is None:
        return None
    return int(chunk) if str(types[l]) == "chunked_attention" else None


def chunked_layers(model) -> list[int]:
    L = len(decoder_layers(model))
    return [l for l in range(L) if layer_chunk(model, l) is not None]


def sliding_layers(model) -> list[int]:
    L = len(decoder_layers(model))
    return [l for l in range(L) if layer_window(model, l) is not None]


def softmax_layers(model) -> list[int]:
    """The decoder layers that run softmax attention (every layer, except in a hybrid family, whose other layers
    have no ``attn`` module and so no attention rows)."""
    fam = family_of(model)
    return [l for l, blk in enumerate(decoder_layers(model)) if getattr(blk, fam.attn, None) is not None]


def capture_only_refusal(model, what: str) -> str | None:
    """Why ``what`` (pruned prefill, eviction, a policy) cannot run on ``model``'s family, a capture-only one
    (``None`` for every other family): names ``what``, the family, the reason and the layers without rows."""
    fam = family_of(model)
    if not fam.capture_only:
        return None
    L = len(decoder_layers(model))
    other = sorted(set(range(L)) - set(softmax_layers(model)))
    if not other:  # every layer has softmax attention (gemma3n_text)
        return f"{what} cannot run on {fam.name}: {fam.capture_only}; only capture is supported (every layer has rows)"
    return (f"{what} cannot run on {fam.name}: {fam.capture_only} (layers {other} are not softmax attention); "
            f"only capture is supported on its softmax layers {softmax_layers(model)}")


def prune_refusal(model, what: str) -> str | None:
    """Why ``what`` (pruned prefill) cannot run on ``model``'s family (``None`` when it can): a capture-only family
    (:func:`capture_only_refusal`), a family whose gather cannot restrict its blocks' inputs (``Family.prune``:
    Gemma-3n's AltUp streams), or a hybrid, whose recurrent or convolution layers cannot consume a gathered sequence
    exactly (names them and the softmax layers, on which capture and eviction run)."""
    why = capture_only_refusal(model, what)
    if why:
        return why
    fam = family_of(model)
    if fam.prune:
        return f"{what} cannot run on {fam.name}: {fam.prune}; capture and eviction are supported"
    if not fam.hybrid:
        return None
    L = len(decoder_layers(model))
    other = sorted(set(range(L)) - set(softmax_layers(model)))
    state = "Mamba-2" if not other else "recurrent or convolution"
    where = (f"layers {other} are not softmax attention" if other else "every layer runs Mamba-2 beside attention")
    return (f"{what} cannot run on {fam.name}: {fam.hybrid} ({where}): {_HYBRID_PRUNE.format(state=state)}; capture "
            f"and eviction run on its softmax layers {softmax_layers(model)}")


def position_refusal(model, what: str, n_positions: int) -> str | None:
    """Why ``what`` (pruned prefill, eviction) cannot run over ``n_positions`` positions (prompt and generated tokens)
    on ``model`` (``None`` when it can): Llama-4's NoPE layers scale their queries by an attention temperature
    ``1 + attn_scale · log1p(floor((p + 1) / floor_scale))`` of the position ``p``, which the model reads from the
    cache length, not from ``position_ids``; after a gather or an eviction the cache is shorter than the positions,
    so from ``p = floor_scale - 1`` on the temperature would be taken at the wrong position. Below that it is 1."""
    c = model.config
    c = c.get_text_config() if callable(getattr(c, "get_text_config", None)) else c
    nope = [l for l, r in enumerate(getattr(c, "no_rope_layers", None) or []) if not r]
    floor = getattr(c, "floor_scale", None)
    if not (getattr(c, "attn_temperature_tuning", False) and nope and floor) or n_positions < int(floor):
        return None
    return (f"{what} cannot run on {family_of(model).name} over {n_positions} positions: its NoPE layers {nope} scale "
            f"their queries by an attention temperature of the position, which the model reads from the cache length "
            f"(not from position_ids), so after a gather or an eviction it would be taken at the wrong position from "
            f"position floor_scale - 1 = {int(floor) - 1} on; runs of fewer than {int(floor)} positions are exact")


def eviction_refusal(model, what: str) -> str | None:
    """Why ``what`` (eviction, a policy) cannot run on ``model``'s family (``None`` when it can): a capture-only
    family (:func:`capture_only_refusal`), a family whose eviction is not verified (``Family.evict``), or a hybrid
    under a transformers whose hybrid cache the compaction cannot read (:func:`version_floor.hybrid_eviction_refusal`)."""
    why = capture_only_refusal(model, what)
    if why:
        return why
    fam = family_of(model)
    old = fam.hybrid and version_floor.hybrid_eviction_refusal()
    if old:
        return f"{what} cannot run on {fam.name}: {old}; capture is supported on its softmax layers"
    if fam.evict:
        return f"{what} cannot run on {fam.name}: {fam.evict}; capture and pruned prefill are supported"
    return None


def unavailable(fam: Family, term: str) -> str | None:
    """Why a stability term cannot be bounded for ``fam`` (``None`` when it can)."""
    if term == "K":
        if fam.capture_only:
            return f"not available for {fam.name}: {fam.capture_only}"
        if fam.hybrid:
            return f"not available for {fam.name}: {fam.hybrid}"
        if fam.block in ("post_norm", "parallel"):
            return (f"not available for {fam.name}: {fam.block.replace('_', '-')} block (the constants K_l assume "
                    "x + F(norm(x)) with the attention and the MLP in sequence)")
        if fam.qkv not in ("separate", "fused"):
            return f"not available for {fam.name}: fused {fam.qkv} projection (Conv1D/interleaved heads)"
        if fam.bound and fam.mla:  # MLA: its attention is not a W_Q/W_K/W_V block
            return f"not available for {fam.name}: {fam.bound}"
        if fam.mlp_kind == "moe":
            return f"not available for {fam.name}: mixture-of-experts MLP (no Jacobian bound over routed experts)"
        if fam.bound:
            return f"not available for {fam.name}: {fam.bound}"
    return None
