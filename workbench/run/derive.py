"""Families derived from the modelling code: the layout of a causal-LM model type outside the hand-written table.

:func:`layout` builds the type's causal-LM class from its default configuration on the ``meta`` device (no memory,
no weights) and reads the module tree: the decoder block list, the final norm, the attention module of each block
(a child whose ``forward`` calls transformers' attention interface, so the workbench can read its rows), its q/k/v
layout (separate, fused, or multi-head latent), its output projection, the MLP and the norms. What cannot be read
from the tree, or what the workbench cannot run exactly, is a refusal that names the architecture's own obstacle
(an encoder-decoder's cross-attention, a state-space mixer, attention computed outside the interface, a sparse
indexer with its own key cache ...), never "not in the table".

A derived layout is a claim about the code, not a verified row: :mod:`workbench.run.selfcheck` checks it at load on
the user's own model (rows of a short prompt, recomputed from what the attention calls receive, against the model's
own eager ``output_attentions``), and refuses the model naming the mismatch. The stability constants are never
offered for a derived family (``Family.bound``), and its rotary maps only where the modelling module has its own
``apply_rotary_pos_emb`` beside a shared ``rotary_emb`` and no NoPE layers the probe would not see.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import io
import warnings

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

__all__ = ["layout", "refusal", "causal_lm_types", "BOUND", "HYBRID"]

BOUND = "derived from the modelling code (the stability constants are verified only on the family table's blocks)"
HYBRID = ("a gather cannot shorten a recurrent or convolution state, so pruned prefill and eviction would run on a "
          "state they did not compact")
SPARSE = ("sparse attention: a lightning indexer picks the top-k keys of every query from a key cache of its own, "
          "and the attention folds that selection into its mask only under the implementation names 'eager' and "
          "'sdpa'; under any other (the workbench's capture registers its own) it passes the indices on and the "
          "kernel attends every key, so capturing would change the model's own computation")

# configuration fields a default config leaves empty although its own modelling code needs them, filled with the
# geometry the defaults imply (a build of the layout only: nothing here reaches a user's model)
_FILL = {"head_dim": lambda c: c.hidden_size // c.num_attention_heads, "moe_intermediate_size": lambda c: 64,
         "n_routed_experts": lambda c: 4, "num_local_experts": lambda c: 4, "num_experts": lambda c: 4,
         "num_experts_per_tok": lambda c: 2, "n_shared_experts": lambda c: 1, "rope_theta": lambda c: 10000.0,
         "num_key_value_heads": lambda c: c.num_attention_heads}
# default configurations that do not build under transformers 5.25 without these fields (its own defaults' gaps)
_BUILD_KW = {"dbrx": lambda: dict(attn_config={"rope_theta": 10000.0}),
             "lfm2_moe": lambda: dict(layer_types=["conv", "full_attention"] * 12, num_hidden_layers=24)}
# architectures whose module tree the derivation cannot read, with what they are
_SPECIFIC = {
    "blt": "BLT: a byte-level model whose global transformer runs over dynamic patches between a local encoder and "
           "decoder, so its attention rows are over patches, not tokens",
    "hrm_text": "HRM: two recurrent modules (H and L) run their blocks several times per token, so one layer is not "
                "one attention call",
    "xlm": "XLM: attention and feed-forward modules kept in separate lists (no decoder block), with language "
           "embeddings and a bidirectional or causal switch",
    "musicgen": "MusicGen: a decoder over parallel audio-codebook streams conditioned on an encoder",
    "musicgen_melody": "MusicGen-Melody: a decoder over parallel audio-codebook streams conditioned on an encoder "
                       "and a chroma melody",
    "reformer": "Reformer: LSH and local chunked attention over reversible layers, not softmax rows over every key",
    "git": "GIT: a BERT-style text stack that attends image tokens from a vision encoder",
}
# sequence mixers: a child whose class name holds one of these mixes positions (attention or a recurrence)
_MIXERS = ("Attention", "Mamba", "Mixer", "DeltaNet", "ShortConv", "Recurrent", "Lightning", "LSTM", "Rwkv", "Attn")
_PLAIN = ("Norm", "Dropout", "Identity", "Activation", "GELU", "SiLU", "ReLU", "Tanh")
_CROSS = ("encoder_attn", "crossattention", "cross_attn", "cross_attention")
_NORMS = ("norm", "final_layernorm", "final_layer_norm", "ln_f", "norm_f", "embedding_norm", "layer_norm",
          "final_norm", "layernorm")
_OUT = ("o_proj", "out_proj", "dense", "c_proj", "Wo", "o")
_MLP = ("mlp", "feed_forward", "block_sparse_moe", "ffn", "mlp_block", "mlps")
_INPUT_NORM = ("input_layernorm", "attention_layernorm", "operator_norm", "ln_1", "self_attn_layer_norm")
_MLP_NORM = ("pre_feedforward_layernorm", "post_attention_layernorm", "feedforward_layernorm", "ffn_norm",
             "pre_ff_layernorm", "ln_2", "post_feedforward_layernorm")
# what an architecture computes instead of transformers' attention interface, where the class name does not say it
_OWN_ATTENTION = {
    "bloom": "ALiBi position biases in its own baddbmm",
    "mpt": "ALiBi position biases in its own attention",
    "xlnet": "two-stream relative attention",
    "reformer": "LSH and local chunked attention",
    "gpt_neo": "local and global attention in its own matmul",
    "gpt_neox_japanese": "its own matmul attention",
    "openai-gpt": "its own matmul attention",
    "ctrl": "its own scaled dot-product",
    "xglm": "its own matmul attention",
    "cpmant": "its own segment-relative position bias",
    "modernbert-decoder": "its own attention kernels (sliding and global)",
}


def causal_lm_types() -> list[str]:
    """Every model type with a causal-LM class in the installed transformers (public auto mapping)."""
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _source(cls) -> str:
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError, AttributeError):
        return ""


@functools.lru_cache(maxsize=None)
def _calls_interface(cls) -> bool:
    """Whether ``cls.forward`` dispatches through transformers' attention interface (so its rows can be read)."""
    src = _source(cls)
    return "ALL_ATTENTION_FUNCTIONS" in src or "attention_interface" in src


def _mixer(mod: torch.nn.Module) -> bool:
    """Whether a block's child mixes positions (attention, a state-space or convolution mixer, a recurrence)."""
    cls = type(mod).__name__
    return any(k in cls for k in _MIXERS) and not any(k in cls for k in ("Norm", "Residual", "HyperConnection"))


def _build(mt: str):
    """The causal-LM model of ``mt`` on the meta device, from its default config (with :data:`_FILL` where the
    default leaves a needed field empty); ``(model, config)`` or raises what transformers raised."""
    quiet = contextlib.redirect_stdout(io.StringIO())
    with warnings.catch_warnings(), quiet:
        warnings.simplefilter("ignore")
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()
        try:
            config = AutoConfig.for_model(mt, **_BUILD_KW.get(mt, dict)())
            try:
                with torch.device("meta"):
                    return AutoModelForCausalLM.from_config(config), config
            except Exception:  # noqa: BLE001 - retried once with the empty fields filled, else re-raised
                tc = config.get_text_config() if _single_text(config) else config
                for k, fill in _FILL.items():
                    if hasattr(tc, k) and getattr(tc, k) is None:
                        setattr(tc, k, fill(tc))
                with torch.device("meta"):
                    return AutoModelForCausalLM.from_config(config), config
        finally:
            transformers.logging.set_verbosity(verbosity)


def _single_text(config) -> bool:
    try:
        config.get_text_config()
    except ValueError:
        return False
    return True


def _blocks(model, config):
    """``(dotted path, ModuleList)`` of the decoder blocks: the list of ``num_hidden_layers`` blocks (else the
    longest list of blocks) under the model."""
    tc = config.get_text_config() if _single_text(config) else config
    L = getattr(tc, "num_hidden_layers", None)
    best = None
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.ModuleList) or not len(mod) or not isinstance(mod[0], torch.nn.Module):
            continue
        if name.split(".")[-1] not in ("layers", "h", "blocks", "layer", "block"):
            continue
        score = (len(mod) == L, len(mod))
        if best is None or score > best[0]:
            best = (score, name, mod)
    return (best[1], best[2]) if best else (None, None)


def _norm_kind(mod) -> str:
    return "rms" if "rms" in type(mod).__name__.lower() else "layer"


def _first(mod, names) -> str | None:
    return next((n for n in names if isinstance(getattr(mod, n, None), torch.nn.Module)), None)


def _no_attention_reason(mt: str, kinds: list[str]) -> str:
    low = " ".join(kinds).lower()
    if "rwkv" in low or mt == "rwkv":
        return "RWKV: no softmax attention (a linear recurrence over time-mixing), so no attention rows"
    if "lstm" in low:
        return "xLSTM: recurrent mLSTM cells, no softmax attention rows"
    if "mamba" in low or "mixer" in low or "ssm" in low:
        return f"{mt}: state-space model ({', '.join(kinds)}), no attention rows"
    if "conv" in low:
        return f"{mt}: gated short convolutions ({', '.join(kinds)}), no softmax attention rows"
    if "recurrent" in low:
        return f"{mt}: recurrent blocks ({', '.join(kinds)}), no softmax attention rows"
    return f"{mt}: its blocks ({', '.join(kinds)}) hold no attention module, so no attention rows"


@functools.lru_cache(maxsize=None)
def _classify(mt: str) -> tuple[tuple | None, str | None]:
    """``(layout items, None)`` or ``(None, reason)`` for model type ``mt`` (cached: one meta build per type)."""
    v = transformers.__version__
    if mt not in CONFIG_MAPPING_NAMES:
        return None, f"{mt!r} is not a model type of transformers {v}"
    if mt not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return None, f"{mt}: transformers {v} has no causal-LM class for it"
    cls_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[mt]
    if mt in _SPECIFIC:
        return None, f"{cls_name}: {_SPECIFIC[mt]}"
    try:
        model, config = _build(mt)
    except Exception as e:  # noqa: BLE001 - the build's own error is the reason
        msg = " ".join(str(e).split())[:160]
        return None, (f"{cls_name} cannot be built from its default configuration under transformers {v} "
                      f"({type(e).__name__}: {msg}), so its layout cannot be read")
    if getattr(config, "is_encoder_decoder", False):
        return None, (f"{cls_name} is the decoder of an encoder-decoder model ({mt}): its blocks attend an encoder's "
                      f"states through cross-attention; the workbench covers decoder-only causal LMs")
    path, blocks = _blocks(model, config)
    if blocks is None:
        return None, f"{cls_name}: no list of decoder blocks under the model, so its layers cannot be found"
    if ".encoder." in f".{path}." and hasattr(blocks[0], "intermediate"):
        return None, (f"{cls_name} runs an encoder stack ({type(blocks[0]).__name__}, BERT-style: bidirectional "
                      f"unless is_decoder=True, post-norm blocks with absolute positions) as a decoder; the workbench "
                      f"covers decoder-only causal LMs")
    cross = sorted({n for b in blocks for n, _ in b.named_children() if n in _CROSS})
    if cross:
        return None, (f"{cls_name}: its blocks carry cross-attention ({cross[0]}) to an encoder's states; the "
                      f"workbench covers decoder-only causal LMs")
    softmax: dict[int, str] = {}  # block index -> attribute name of its softmax attention
    other: dict[int, str] = {}  # block index -> class of a sequence mixer that is not softmax attention
    for i, blk in enumerate(blocks):
        for n, m in blk.named_children():
            if isinstance(m, torch.nn.ModuleList) and any(_calls_interface(type(x)) for x in m):
                return None, (f"{cls_name}: every block runs {len(m)} attention modules ({n} is a list of "
                              f"{type(m[0]).__name__}), and the workbench reads one attention call per layer")
            if _calls_interface(type(m)):
                if i in softmax:
                    return None, (f"{cls_name}: its blocks run two attention modules ({softmax[i]} and {n}), and "
                                  f"the workbench reads one attention call per layer")
                softmax[i] = n
            elif _mixer(m):
                other.setdefault(i, type(m).__name__)
    if not softmax:
        nested = next(((n, c, type(x).__name__) for b in blocks for n, m in b.named_children()
                       for c, x in m.named_children() if _calls_interface(type(x))), None)
        if nested:
            return None, (f"{cls_name}: its attention ({nested[2]}) sits inside another module of the block "
                          f"({nested[0]}.{nested[1]}), which a family row's attention attribute cannot name")
        kinds = sorted(set(other.values()))
        low = " ".join(kinds).lower()
        if not kinds or any(k in low for k in ("rwkv", "lstm", "mamba", "mixer", "shortconv", "recurrent")):
            return None, _no_attention_reason(mt, kinds or sorted({type(m).__name__ for m in blocks[0].children()}))
        if any(k in low for k in ("delta", "linear", "lightning")):
            return None, f"{mt}: linear attention in every layer ({', '.join(kinds)}), no softmax attention rows"
        detail = _OWN_ATTENTION.get(mt, "its own attention computation")
        return None, (f"{cls_name}: its attention ({kinds[0]}) computes the weights itself ({detail}) instead of "
                      f"calling transformers' attention interface, so the workbench cannot read its rows")
    names = sorted(set(softmax.values()))
    if len(names) > 1:
        return None, (f"{cls_name}: its softmax attention sits under different attributes in different blocks "
                      f"({', '.join(names)}), which one family row cannot name")
    attn = names[0]
    clash = sorted({type(getattr(b, attn)).__name__ for i, b in enumerate(blocks)
                    if i not in softmax and isinstance(getattr(b, attn, None), torch.nn.Module)})
    if clash:
        return None, (f"{cls_name}: its {attn} attribute holds softmax attention in some blocks and {clash[0]} in "
                      f"others, so the softmax layers cannot be told by the attribute")
    a = getattr(blocks[min(softmax)], attn)
    kids = dict(a.named_children())
    mla = "kv_a_proj_with_mqa" in kids and "kv_b_proj" in kids
    if "_attn_implementation in (" in _source(type(a)):
        what = SPARSE if "indexer" in kids else ("its attention computes differently by the implementation's name "
                                                 "(_attn_implementation in ...), so under the workbench's registered "
                                                 "capture it would not compute what it computes under its own")
        return None, f"{cls_name}: {what}"
    if "experts" in kids:
        return None, (f"{cls_name}: mixture of attention heads ({type(a).__name__}: its queries come from routed "
                      f"experts beside one shared kv_proj), so the heads its kernel sees are not the config's "
                      f"num_attention_heads / num_key_value_heads, which the capture allocates")
    if all(k in kids for k in ("q_proj", "k_proj", "v_proj")) or mla:
        qkv = "separate"
    elif "qkv_proj" in kids:
        qkv = "fused"
    else:
        qkv = next((k for k in kids if "q" in k.lower() or "kv" in k.lower()), "unknown")
    blk = blocks[min(softmax)]
    mlp = _first(blk, _MLP) or "mlp"
    mlps = [getattr(b, mlp, None) for b in blocks]
    moe = any(m is not None and ("moe" in type(m).__name__.lower() or "sparse" in type(m).__name__.lower()
                                 or hasattr(m, "experts")) for m in mlps)
    m0 = getattr(blk, mlp, None)
    if moe:
        mlp_kind, up, down = "moe", "c_fc", "c_proj"
    elif m0 is not None and hasattr(m0, "gate_up_proj"):
        mlp_kind, up, down = "gated_fused", "c_fc", "c_proj"
    elif m0 is not None and all(hasattr(m0, k) for k in ("gate_proj", "up_proj", "down_proj")):
        mlp_kind, up, down = "gated", "c_fc", "c_proj"
    else:
        up, down = next(((u, d) for u, d in (("up_proj", "down_proj"), ("fc1", "fc2"), ("c_fc", "c_proj"))
                         if m0 is not None and hasattr(m0, u) and hasattr(m0, d)), ("c_fc", "c_proj"))
        mlp_kind = "plain"
    owner = model
    for part in path.split(".")[:-1]:
        owner = getattr(owner, part)
    norm = _first(owner, _NORMS)
    if norm is None:
        return None, f"{cls_name}: no final norm beside its decoder blocks ({path}), so its layout cannot be read"
    input_norm = _first(blk, _INPUT_NORM) or "input_layernorm"
    mlp_norm = _first(blk, _MLP_NORM) or "post_attention_layernorm"
    if hasattr(blk, "pre_feedforward_layernorm") and hasattr(blk, "post_feedforward_layernorm"):
        block = "sandwich"
    elif not hasattr(blk, input_norm) and hasattr(blk, "post_feedforward_layernorm"):
        block = "post_norm"
    elif not hasattr(blk, mlp_norm):
        block = "parallel"
    else:
        block = "pre_norm"
    tc = config.get_text_config() if _single_text(config) else config
    sinks = any(isinstance(getattr(getattr(b, attn, None), "sinks", None), torch.Tensor) for b in blocks)
    eager_only = sinks or hasattr(tc, "attn_logit_softcapping") and getattr(tc, "attn_logit_softcapping") is not None
    rotary = "probe"
    if mla:
        rotary = ""  # families.py names the MLA reason
    elif not callable(getattr(inspect.getmodule(type(a)), "apply_rotary_pos_emb", None)) or \
            getattr(owner, "rotary_emb", None) is None:
        rotary = ("derived family without a shared rotary_emb and its own apply_rotary_pos_emb (the rotary maps "
                  "cannot be probed)")
    elif getattr(tc, "no_rope_layers", None) is not None and not hasattr(a, "use_rope"):
        rotary = "derived family with NoPE layers its attention does not mark (use_rope), so the probe would misread"
    capture_only = ""
    if len(softmax) < len(blocks):
        kinds = sorted(set(other.values())) or sorted({type(b).__name__ for i, b in enumerate(blocks)
                                                       if i not in softmax})
        capture_only = f"hybrid of {', '.join(kinds)} and softmax layers: {HYBRID}"
    elif other:
        kinds = sorted(set(other.values()))
        capture_only = f"every layer runs {', '.join(kinds)} beside softmax attention: {HYBRID}"
    else:
        extra = sorted({type(m).__name__ for b in blocks for n, m in b.named_children()
                        if n not in (attn, mlp, "fc1", "fc2", "c_fc", "c_proj")
                        and not any(k in type(m).__name__ for k in _PLAIN)})
        if extra:
            capture_only = (f"its blocks carry {', '.join(extra)} beside the attention, the MLP and the norms, whose "
                            f"effect on a gathered (pruned) sequence or an evicted cache is not derived from the code")
    lay = dict(model_types=(mt,), layers=(path,), norm=(".".join(path.split(".")[:-1] + [norm]),), attn=attn,
               mlp=mlp, qkv=qkv, block=block, mlp_kind=mlp_kind, norm_kind=_norm_kind(getattr(owner, norm)),
               input_norm=input_norm, mlp_norm=mlp_norm, up=up, down=down, eager_only=bool(eager_only),
               out=_first(a, _OUT) or "o_proj", rotary=rotary, bound=BOUND, capture_only=capture_only, mla=mla)
    return tuple(lay.items()), None


def refusal(model_type: str) -> str | None:
    """Why ``model_type`` cannot get a derived family (its architecture's own reason), ``None`` when it can."""
    return _classify(str(model_type))[1]


def layout(model_type: str) -> dict:
    """The :class:`workbench.run.families.Family` fields derived for ``model_type`` (``TypeError`` with
    :func:`refusal`'s reason when there are none)."""
    items, why = _classify(str(model_type))
    if items is None:
        raise TypeError(why)
    return dict(items)
