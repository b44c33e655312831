"""The one place that touches transformers internals.

transformers renames attention-call arguments and cache APIs between minor versions; everything
the workbench needs from it goes through the small functions here, so a rename is absorbed once.
Nothing in this module is monkey-patched: capture uses the public ``AttentionInterface`` /
``AttentionMaskInterface`` registries and ``model.set_attn_implementation``.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import transformers
import transformers.cache_utils as hf_cache_utils
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import logging as hf_logging

from workbench.run import families, layer_roles, load_checks
from workbench.run.families import decoder_layers, final_norm, layers_owner  # noqa: F401  (re-exported)
from workbench.run.kv_layout import ModelShape, kv_group_heads, kv_source_layers, kv_ties, layer_kv_heads, model_shape  # noqa: F401  (re-exported)

CAPTURE_PREFIX = "workbench_capture_"
TRANSFORMERS_VERSION = transformers.__version__


# ----------------------------------------------------------------------------- model shape
def text_config(config):
    """The decoder config (multimodal configs keep it under ``text_config``)."""
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def check_supported(model) -> families.Family:
    """The model's family; ``TypeError`` (with the supported families) for a model the workbench cannot
    handle exactly, or one that does not call transformers' attention interface."""
    fam = families.family_of(model)
    if not supports_attention_interface(model):
        raise TypeError(f"model: {type(model).__name__} does not use transformers' attention interface; the "
                        f"workbench captures attention through it. Supported families: "
                        f"{', '.join(families.supported_families())}")
    why = attention_refusal(model)
    if why:
        raise TypeError(f"model: {type(model).__name__} is refused: {why}")
    return fam


def attention_refusal(model) -> str | None:
    """Why the built model's attention cannot be read exactly (``None`` when it can): an attention module of a
    softmax layer with ``is_causal = False`` (a non-causal model whose config did not say so), or an attention
    implementation the capture cannot read (:data:`workbench.run.load_checks.REFUSED_IMPLEMENTATIONS`)."""
    impl = current_attn_implementation(model)
    impl = impl[len(CAPTURE_PREFIX):] if impl.startswith(CAPTURE_PREFIX) else impl
    why = load_checks.implementation_refusal(impl)
    if why:
        return f"attn_implementation = {impl!r}: {why}"
    blocks = decoder_layers(model)
    attn = families.family_of(model).attn
    causal = {l: getattr(getattr(blocks[l], attn, None), "is_causal", True) for l in families.softmax_layers(model)}
    open_ = [l for l, c in causal.items() if c is False]
    if open_:
        return (f"the attention of layers {open_} is not causal (is_causal = False: every position attends the later "
                f"ones too), while attention rows, pruned prefill and eviction are defined for causal attention")
    return None


def supports_attention_interface(model) -> bool:
    fn = getattr(model, "_can_set_attn_implementation", None)
    return bool(fn()) if callable(fn) else False


def current_attn_implementation(model) -> str:
    return model.config._attn_implementation or "eager"


def set_attn_implementation(model, name: str) -> None:
    model.set_attn_implementation(name)


# ----------------------------------------------------------------------------- attention calls
@dataclass
class AttentionCall:
    """What a registered attention function receives, with names that do not depend on the version.

    ``query [B, H_Q, q_len, d]``, ``key``/``value [B, G, S, d]`` (post-RoPE), ``mask`` (``None``
    for plain causal, bool with True = attend, or additive float) of shape ``[B, 1|H, q_len, ≥S]``.
    """

    layer_idx: int
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    mask: torch.Tensor | None
    scaling: float
    softcap: float | None
    sliding_window: int | None
    sinks: torch.Tensor | None = None  # learned per-head sink logits ``[H_Q]`` (gpt-oss ``s_aux``)


def read_attention_call(module, query, key, value, attention_mask, kwargs) -> AttentionCall:
    scaling = kwargs.get("scaling")
    if scaling is None:
        scaling = getattr(module, "scaling", None)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    softcap = kwargs.get("softcap", kwargs.get("attn_logit_softcapping"))
    if softcap is None:
        softcap = getattr(module, "attn_logit_softcapping", None)
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    return AttentionCall(
        layer_idx=int(getattr(module, "layer_idx", -1)),
        query=query,
        key=key,
        value=value,
        mask=attention_mask,
        scaling=float(scaling),
        softcap=float(softcap) if softcap else None,
        sliding_window=int(window) if window else None,
        sinks=kwargs.get("s_aux", getattr(module, "sinks", None)),
    )


_EAGER: dict = {}


def _plain_function(fn, name: str, owner: str) -> Callable:
    """``fn`` itself, or, where the ``kernels`` package (a dependency of transformers >= 5.25) turned the modelling
    module's function into a ``torch.nn.Module`` that dispatches to a hub kernel, the function it wraps: the model's
    own torch code, with its own signature. ``TypeError`` when such a wrapper holds no function we can find."""
    if not isinstance(fn, torch.nn.Module):
        return fn
    forward = getattr(type(fn), "forward", None)
    inner = inspect.getclosurevars(forward).nonlocals.get("func") if inspect.isfunction(forward) else None
    if not inspect.isfunction(inner):
        raise TypeError(
            f"model: {owner}'s {name} is a {type(fn).__module__}.{type(fn).__qualname__} module that wraps no "
            "function the workbench can read (a kernels or transformers version it does not know)"
        )
    return inner


def own_modelling_function(module, name: str) -> Callable:
    """The function ``name`` (``eager_attention_forward``, ``apply_rotary_pos_emb``) of the modelling module that
    defines ``module``'s class or, failing that, a base class's: each family's own code, never Llama's. A function
    that ``kernels`` wrapped in a hub-kernel module is unwrapped to the model's own torch function."""
    cls = type(module)
    for klass in cls.__mro__:
        fn = getattr(sys.modules.get(klass.__module__), name, None)
        if fn is not None:
            return _plain_function(fn, name, cls.__name__)
    raise TypeError(f"model: {cls.__name__}'s modelling module has no {name}")


def own_eager_function(module) -> Callable:
    """The ``eager_attention_forward`` of the modelling module that defines ``module``'s class (Gemma-2's
    soft-capping, gpt-oss's learned sinks, each family's own scaling kept), never Llama's."""
    cls = type(module)
    if cls not in _EAGER:
        _EAGER[cls] = own_modelling_function(module, "eager_attention_forward")
    return _EAGER[cls]


def _model_eager(module, query, key, value, attention_mask, **kwargs):
    return own_eager_function(module)(module, query, key, value, attention_mask, **kwargs)


def base_attention_function(name: str) -> Callable:
    """The attention function transformers would use for implementation ``name`` (``eager``: the calling
    module's own eager function, looked up per call)."""
    if name == "eager":
        return _model_eager
    return ALL_ATTENTION_FUNCTIONS[name]


def register_wrapped_attention(base: str, make_wrapper: Callable[[Callable], Callable]) -> str:
    """Register ``make_wrapper(base_fn)`` as a new attention implementation using ``base``'s mask.

    Returns the registered name. The model then receives exactly the mask and kernel it had.
    """
    name = CAPTURE_PREFIX + base.replace("|", "_")
    AttentionInterface.register(name, make_wrapper(base_attention_function(base)))
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS.get(base)
    if mask_fn is None:
        raise TypeError(f"attn_implementation: no mask function for base implementation {base!r}")
    AttentionMaskInterface.register(name, mask_fn)
    return name


POSITIONS_PREFIX = "workbench_positions_"


@dataclass
class PositionState:
    """Original positions of the queries of the next forward (``q_pos``, int64 ``[q]``) and the cache whose
    sliding-window layers are masked by original positions (see :func:`original_positions`)."""

    cache: object = None
    q_pos: torch.Tensor | None = None


def _position_wrapper(state: PositionState, base_fn: Callable, additive: bool, chunks: dict,
                      sources: list[int]) -> Callable:
    def workbench_positions_attention(module, query, key, value, attention_mask, **kwargs):
        l = int(getattr(module, "layer_idx", -1))
        src = sources[l] if 0 <= l < len(sources) else l  # a KV-shared layer attends its source's keys
        lay = cache_layers(state.cache)[src] if state.cache is not None and l >= 0 else None
        if lay is None or not getattr(lay, "is_sliding", False) or state.q_pos is None:
            return base_fn(module, query, key, value, attention_mask, **kwargs)
        B, G, S_all = key.shape[0], key.shape[1], key.shape[2]
        q = query.shape[2]
        qp = state.q_pos.to(torch.int64).reshape(-1)[-q:].cpu()
        if src != l:  # the source ran first in this forward and recorded the positions of the keys it passed on
            allp = getattr(lay, "workbench_call_positions", None)
            if allp is None:  # nothing gathered: the model's own mask is right
                return base_fn(module, query, key, value, attention_mask, **kwargs)
            if allp.shape[-1] != S_all:
                raise RuntimeError(f"cache: layer {l} reads {S_all} keys of layer {src}, tracked {allp.shape[-1]}")
            return base_fn(module, query, key, value, _window_mask(allp, qp, query, l, chunks, lay, G, additive),
                           **kwargs)
        lay.workbench_call_positions = None
        pos = getattr(lay, "workbench_positions", None)
        if pos is None:  # nothing gathered: contiguous keys, so the model's own mask is already right
            if S_all > q or bool((qp == torch.arange(int(qp[0]), int(qp[0]) + q)).all()):
                return base_fn(module, query, key, value, attention_mask, **kwargs)
            pos = torch.zeros(B, G, 0, dtype=torch.int64)  # a fresh cache fed non-contiguous positions
        if pos.shape[-1] != S_all - q:
            raise RuntimeError(f"cache: layer {l} holds {S_all - q} keys but {pos.shape[-1]} tracked positions")
        allp = torch.cat([pos, qp.expand(B, G, q)], dim=-1)  # [B, G, S_all]
        out = base_fn(module, query, key, value, _window_mask(allp, qp, query, l, chunks, lay, G, additive), **kwargs)
        S = int(lay.keys.shape[-2])
        lay.workbench_positions = allp[..., S_all - S:] if S <= S_all else allp
        lay.workbench_call_positions = allp  # for the KV-shared layers reading these keys in this forward
        return out

    return workbench_positions_attention


def _window_mask(allp, qp, query, l: int, chunks: dict, lay, G: int, additive: bool) -> torch.Tensor:
    """Window (chunk) mask of queries at ``qp [q]`` over keys at ``allp [B, G, S]``: float or bool ``[B, H_Q, q, S]``."""
    d = qp[None, None, :, None] - allp[:, :, None, :]  # [B, G, q, S_all]
    if l in chunks:  # chunked attention (stored as a window of the chunk size): the same chunk, causal
        C = chunks[l]
        vis = (d >= 0) & (qp[None, None, :, None] // C == allp[:, :, None, :] // C)
    else:
        vis = (d >= 0) & (d < int(lay.sliding_window))
    vis = vis.repeat_interleave(query.shape[1] // G, dim=1).to(query.device)  # [B, H_Q, q, S_all]
    return torch.zeros(vis.shape, dtype=query.dtype, device=query.device).masked_fill_(
        ~vis, torch.finfo(query.dtype).min) if additive else vis


@contextlib.contextmanager
def original_positions(model, cache=None):
    """Mask sliding-window layers by original positions (SPEC §7 **[decided]**): a stored key at original
    position ``j`` is visible to the query at ``u`` when ``0 ≤ u - j < window``, whatever was gathered or
    evicted before; on a chunked-attention layer (Llama-4, stored as a window of the chunk size ``C``) when
    ``j ≤ u`` and ``j // C == u // C``. Layers without a window keep the model's own mask. Set ``state.q_pos`` (and
    ``state.cache``) before each forward; the stored keys' positions live on the cache layers
    (``workbench_positions``, int64 ``[B, G, S]``), so copies and stacks of a cache keep them.

    Registers a wrapper of the model's current implementation (eager: the model's own eager function,
    with an additive mask; sdpa and others: a boolean mask) and restores the implementation on exit.
    """
    state = PositionState(cache=cache)
    old = current_attn_implementation(model)
    name = POSITIONS_PREFIX + old.replace("|", "_")
    base = old[len(CAPTURE_PREFIX):] if old.startswith(CAPTURE_PREFIX) else old
    chunks = {l: families.layer_chunk(model, l) for l in families.chunked_layers(model)}
    AttentionInterface.register(name, _position_wrapper(state, base_attention_function(old), base == "eager", chunks,
                                                        kv_source_layers(model)))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[old])
    set_attn_implementation(model, name)
    try:
        yield state
    finally:
        set_attn_implementation(model, old)


def positions_context(model, cache=None):
    """:func:`original_positions` for a model with sliding-window or chunked-attention layers; for one without, a
    no-op context yielding an unused :class:`PositionState` (every mask already follows the original order)."""
    if families.sliding_layers(model) or families.chunked_layers(model):
        base = current_attn_implementation(model)
        base = base[len(CAPTURE_PREFIX):] if base.startswith(CAPTURE_PREFIX) else base
        if base not in ("eager", "sdpa"):
            raise TypeError(f"attn_implementation: sliding windows measured in original positions need 'eager' or "
                            f"'sdpa' (a mask the kernel reads), got {base!r}")
        return original_positions(model, cache)
    return contextlib.nullcontext(PositionState(cache=cache))


def track_positions(cache, R: torch.Tensor) -> None:
    """Record on every sliding-window layer of ``cache`` the original positions of its stored keys, the
    last ``S`` of the sorted positions ``R [T']`` that were fed (or kept)."""
    for lay in cache_layers(cache):
        if getattr(lay, "is_sliding", False) and getattr(lay, "keys", None) is not None:
            B, G, S = lay.keys.shape[:3]
            lay.workbench_positions = R[len(R) - S:].to(torch.int64).cpu().expand(B, G, S).clone()


def eager_attentions(model, input_ids: torch.Tensor, **kw):
    """Full forward with eager attention and ``output_attentions`` (the oracle); restores the implementation."""
    old = current_attn_implementation(model)
    set_attn_implementation(model, "eager")
    try:
        with torch.no_grad():
            return model(input_ids=input_ids, output_attentions=True, **kw)
    finally:
        set_attn_implementation(model, old)


# ----------------------------------------------------------------------------- caches and forward
def new_cache(model):
    """A fresh dynamic cache for ``model``; ``None`` for a hybrid or a capture-only family, which builds its own cache
    on its first forward (a hybrid's cache holds the recurrent and convolution states in layers of their own)."""
    fam = families.family_of(model)
    if fam.capture_only or fam.hybrid:
        return None
    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older signature
        return DynamicCache()


def forward(model, input_ids: torch.Tensor, cache=None, position_ids=None, logits_to_keep: int = 0, **kw):
    """One forward with a cache; the cache keyword is spelled per the installed version. Gemma-4 runs its KV-shared
    layers on the last ``logits_to_keep`` prefill positions only (no rows for the others): it gets 0, cut here."""
    shared = any(s != l for l, s in enumerate(kv_source_layers(model)))
    cut = logits_to_keep if logits_to_keep and input_ids.shape[-1] > 1 and shared else 0
    args = dict(input_ids=input_ids, use_cache=True, logits_to_keep=0 if cut else logits_to_keep, **kw)
    if position_ids is not None:
        args["position_ids"] = position_ids
    if cache is not None:
        args[_cache_keyword(model)] = cache
    out = model(**args)
    if cut:
        out.logits = out.logits[:, -cut:]
    return out


def _cache_keyword(model) -> str:
    """``cache`` (transformers ≥ 5.24) or ``past_key_values`` (earlier)."""

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out):
    for name in ("cache", "past_key_values"):
        c = getattr(out, name, None)
        if c is not None:
            return c
    return None


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def clear_gguf_quantization(model) -> None:
    """Make a GGUF-loaded (already dequantised) model saveable with ``save_pretrained``."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        try:
            del model.config.quantization_config
        except AttributeError:
            model.config.quantization_config = None
    for attr in ("is_quantized", "quantization_method"):
        if hasattr(model, attr):
            try:
                setattr(model, attr, False if attr == "is_quantized" else None)
            except AttributeError:
                pass


# ----------------------------------------------------------------------------- mid-prefill gather
def layer_hidden(args, kwargs) -> torch.Tensor:
    """The hidden states a decoder block (or the final norm) receives, ``[B, T, D]``."""
    return args[0] if args else kwargs["hidden_states"]


def gather_layer_call(args, kwargs, R: torch.Tensor, *, hidden: bool):
    """Restrict one decoder-block call of a prefill to the retained positions ``R`` (sorted, ``[T']``).

    Gathers the position embeddings (cos, sin ``[B, T, d]``), Gemma-4's per-layer inputs, the position ids and a 4-D mask
    (rows and columns: the original-position mask restricted to ``R``, so causal and sliding-window
    structure follow the original positions); ``hidden=True`` also gathers the hidden states.
    A ``None`` mask (plain causal) stays ``None``: order is preserved, so causal on ``R`` is causal.
    Returns new ``(args, kwargs)``.
    """
    args, kwargs = list(args), dict(kwargs)
    if hidden:
        if args:
            args[0] = args[0].index_select(1, R.to(args[0].device))
        else:
            kwargs["hidden_states"] = kwargs["hidden_states"].index_select(1, R.to(kwargs["hidden_states"].device))
    # Gemma-4's per-layer inputs [B, T, d_pl] (the block's second positional argument): always the full prompt's
    pli = args[1] if len(args) > 1 else kwargs.get("per_layer_input")
    if isinstance(pli, torch.Tensor) and pli.dim() == 3 and pli.shape[1] > len(R):
        pli = pli.index_select(1, R.to(pli.device))
        if len(args) > 1:
            args[1] = pli
        else:
            kwargs["per_layer_input"] = pli
    pe = kwargs.get("position_embeddings")
    if isinstance(pe, (tuple, list)):
        kwargs["position_embeddings"] = tuple(t.index_select(-2, R.to(t.device)) for t in pe)
    elif isinstance(pe, torch.Tensor):  # DeepSeek-V2: one complex tensor of rotations ``[B, T, d/2]``
        if pe.dim() != 3 or int(R.max()) >= pe.shape[-2]:
            raise TypeError(f"position_embeddings: cannot restrict a tensor of shape {tuple(pe.shape)} to the "
                            "retained positions")
        kwargs["position_embeddings"] = pe.index_select(-2, R.to(pe.device))
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 4:
        r = R.to(mask.device)
        kwargs["attention_mask"] = mask.index_select(-2, r).index_select(-1, r)
    elif mask is not None and not isinstance(mask, torch.Tensor):
        raise TypeError(f"attention_mask: cannot restrict a {type(mask).__name__} mask (use sdpa or eager)")
    for name in ("position_ids", "cache_position"):
        v = kwargs.get(name)
        if isinstance(v, torch.Tensor):
            kwargs[name] = v.index_select(v.dim() - 1, R.to(v.device))
    # Gemma-4's KV sharing: what a source layer before the gather passed on (every prompt position) is restricted
    # to R in the model's own mapping, in place, so the shared layers after it read the gathered cache
    shared = kwargs.get("shared_kv_states")
    for name in list(shared.keys()) if hasattr(shared, "keys") else []:
        kv = shared[name]
        if all(isinstance(t, torch.Tensor) for t in kv) and kv[0].shape[-2] > len(R):
            shared[name] = tuple(t.index_select(-2, R.to(t.device)) for t in kv)
    return tuple(args), kwargs


def gather_cache_positions(cache, layers, R: torch.Tensor, T: int) -> None:
    """Keep, in ``layers``, only the cache entries of the prompt positions ``R`` (in place).

    A full layer stores positions ``0 … T-1``; a sliding-window layer stores the last ``S`` of them,
    so the kept storage indices are ``R ∩ [T-S, T)`` shifted by ``T-S``. A sliding layer's token count
    (``cumulative_length``) is left as it is: later windows are measured in original positions
    (:func:`original_positions`, :func:`track_positions`), not in stored keys.
    """
    for l in layers:
        lay = cache_layers(cache)[l]
        if getattr(lay, "keys", None) is None:  # a KV-shared layer stores nothing (its source is gathered)
            continue
        S = int(lay.keys.shape[-2])
        start = T - S
        keep = R[R >= start] - start
        idx = keep.to(lay.keys.device)
        lay.keys = lay.keys.index_select(-2, idx)
        lay.values = lay.values.index_select(-2, idx)


# ----------------------------------------------------------------------------- cache surgery
def cache_layers(cache) -> list:
    """The per-layer storages of a dynamic cache (``keys``/``values`` ``[B, G, S, d]``)."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"cache: {type(cache).__name__} has no per-layer storage this workbench knows")
    return list(layers)


def cache_kv(cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values stored for ``layer``: ``[B, G, S, d]`` each."""
    lay = cache_layers(cache)[layer]
    return lay.keys, lay.values


def mla_latent_cache(model) -> bool:
    """Whether ``model`` is multi-head latent attention whose cache stores the latent (transformers ≥ 5.24: per
    position one normalised KV latent ``[B, 1, S, kv_lora_rank]`` as the layer's "keys" and the shared post-RoPE
    rope key ``[B, 1, S, qk_rope_head_dim]`` as its "values", expanded into per-head keys and values by the
    attention's own ``expand_kv`` after the cache read). ``False`` for every other family, and for MLA under
    transformers < 5.24, whose cache stores the expanded per-head keys ``[B, H, S, d_k]`` and values
    ``[B, H, S, d_v]`` (one KV head per query head, ``d_k != d_v``)."""
    fam = families.family_of(model)
    if not fam.mla:
        return False
    return callable(getattr(getattr(decoder_layers(model)[0], fam.attn), "expand_kv", None))


def check_latent_layer(model, cache, layer: int) -> None:
    """``RuntimeError`` unless ``layer`` of ``cache`` holds what :func:`mla_latent_cache` says: one latent of the
    attention's ``kv_lora_rank`` and one rope key of its ``qk_rope_head_dim`` per position."""
    att = getattr(decoder_layers(model)[layer], families.family_of(model).attn)
    k, v = cache_kv(cache, layer)
    if k.dim() != 4 or k.shape[1] != 1 or k.shape[-1] != att.kv_lora_rank or v.shape[-1] != att.qk_rope_head_dim:
        raise RuntimeError(f"cache: layer {layer} holds keys {tuple(k.shape)} and values {tuple(v.shape)}, not the "
                           f"latent [B, 1, S, {att.kv_lora_rank}] and rope key [B, 1, S, {att.qk_rope_head_dim}] "
                           f"this transformers ({TRANSFORMERS_VERSION}) stores for multi-head latent attention")


def cache_head_kv(model, cache, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values the attention of ``layer`` reads from ``cache``, per KV head: ``[B, G, S, d_k]`` and
    ``[B, G, S, d_v]``. For an MLA latent cache (:func:`mla_latent_cache`) they are computed from the stored latent
    and rope key by the attention module's own ``expand_kv`` (its ``kv_b_proj``), as its forward does, one per
    query head; otherwise they are what the cache stores."""
    k, v = cache_kv(cache, layer)
    if not mla_latent_cache(model):
        return k, v
    check_latent_layer(model, cache, layer)
    att = getattr(decoder_layers(model)[layer], families.family_of(model).attn)
    return att.expand_kv(k, v)


def kv_bytes_per_position(model) -> int | None:
    """Bytes one cached position takes in one layer's keys and values, ``2·e·G·d``, when every layer of
    ``model`` stores full-attention keys and values of that one shape; ``None`` when the layers differ (a
    sliding-window layer holds only its window, an MLA latent or per-layer head sizes or KV heads another shape, a
    KV-shared layer nothing, a capture-only hybrid's recurrent layers no cache of this kind), so a cache size
    cannot be read off a kept count without a run. A hybrid's recurrent layers hold none: the size is one softmax
    layer's (``GenerationResult.kept`` has one row per evictable layer). ``e`` is the size of the model's parameter
    dtype (the cache's)."""
    fam = families.family_of(model)
    if fam.capture_only or kv_ties(model) is not None:
        return None
    roles = layer_roles.layer_roles(model)
    if any(r not in ("full", "recurrent") for r in roles):
        return None
    s = model_shape(model)
    e = next(model.parameters()).element_size()
    return 2 * e * s.G * s.d


def cache_bytes(cache) -> int:
    """Bytes held by the keys and values of a cache (what eviction can shrink; the rest is :func:`state_bytes`)."""
    total = 0
    for lay in cache_layers(cache):
        if getattr(lay, "keys", None) is not None and lay.keys.numel():
            total += lay.keys.numel() * lay.keys.element_size() + lay.values.numel() * lay.values.element_size()
    return total


def state_bytes(cache) -> int:
    """Bytes of the fixed-size recurrent and convolution states of a cache (a hybrid's linear-attention, Mamba and
    short-convolution layers, Falcon-H1's Mamba-2 beside attention): what eviction cannot shrink, whatever the length."""
    sts = [getattr(lay, n, None) for lay in cache_layers(cache) for n in ("conv_states", "recurrent_states")]
    return sum(t.numel() * t.element_size() for st in sts if isinstance(st, dict) for t in st.values()
               if isinstance(t, torch.Tensor))


# a layer holding keys and values beside a recurrent state (Falcon-H1): its keys and values are a dynamic layer's
_COMPACTABLE = (DynamicLayer, DynamicSlidingWindowLayer) + tuple(
    t for t in (getattr(hf_cache_utils, "LinearAttentionAndFullAttentionLayer", None),
                getattr(hf_cache_utils, "LinearAttentionAndSlidingWindowAttentionLayer", None)) if t is not None)


# ----------------------------------------------------------------------------- cache surgery: eviction
def cache_layer_is_sliding(cache, layer: int) -> bool:
    """Whether ``layer`` of the cache is a sliding-window layer (it stores only its window)."""
    return bool(getattr(cache_layers(cache)[layer], "is_sliding", False))


def clone_cache(cache):
    """An independent copy of a dynamic cache (tensors copied), for several evictions of one prefill."""

    return copy.deepcopy(cache)


def layer_positions(cache, layer: int) -> torch.Tensor:
    """Original positions of the entries a cache layer stores, int64 ``[G, S]`` (batch row 0): tracked ones
    (after a gather or an eviction), else ``0 … S-1`` for a full layer and the last ``S`` of
    ``cumulative_length`` for a sliding-window layer."""
    lay = cache_layers(cache)[layer]
    G, S = int(lay.keys.shape[1]), int(lay.keys.shape[-2])
    pos = getattr(lay, "workbench_positions", None)
    if pos is not None:
        if pos.shape[-1] != S:
            raise ValueError(f"cache: layer {layer} holds {S} entries but {pos.shape[-1]} tracked positions")
        return pos[0].clone()
    n = int(getattr(lay, "cumulative_length", S)) if getattr(lay, "is_sliding", False) else S
    return torch.arange(n - S, n).expand(G, S).clone()


def compact_cache_layers(cache, keep: list) -> tuple[list[int], dict[int, str]]:
    """One-shot eviction: in every layer ``l`` and KV head keep the entries of original positions
    ``keep[l]`` (int64 ``[G, S_l]``, sorted, each a subset of what the layer stores), in place.

    Sliding-window layers are compacted too. The stored positions are recorded (``workbench_positions``)
    so that later decode steps of a sliding-window layer measure the window in original positions
    (decode inside :func:`original_positions`; a full layer's record is not extended by decoding). ``keep[l] = None``
    leaves layer ``l`` as it is (a hybrid's recurrent layer must: it holds no keys); a recurrent state beside keys
    (Falcon-H1) is left as it is.

    Returns:
        ``(compacted layers, {layer: reason} for layers that cannot be compacted)``.
    """
    done, skipped = [], {}
    layers = cache_layers(cache)
    if len(keep) != len(layers):
        raise ValueError(f"keep: must have one entry per layer ({len(layers)}), got {len(keep)}")
    for l, (lay, kp) in enumerate(zip(layers, keep)):
        if kp is None:
            continue
        if getattr(lay, "keys", None) is None:
            raise ValueError(f"keep: layer {l} stores no keys (a {type(lay).__name__}: a recurrent or convolution "
                             f"state); its entry must be None")
        if type(lay) not in _COMPACTABLE or getattr(lay, "record_past", False):
            skipped[l] = f"a {type(lay).__name__} cache layer cannot be compacted (dynamic layers only)"
            continue
        k, v = lay.keys, lay.values
        if k.shape[1] != kp.shape[0]:
            raise ValueError(f"keep: has {kp.shape[0]} KV heads, the cache has {k.shape[1]}")
        have = layer_positions(cache, l)  # [G, S], sorted
        idx = torch.searchsorted(have, kp)
        if bool((idx >= have.shape[-1]).any()) or not bool((have.gather(-1, idx.clamp(max=have.shape[-1] - 1)) == kp).all()):
            raise ValueError(f"keep: layer {l} does not hold every position to keep")
        gi = idx.to(k.device)[None, :, :, None]  # keys and values may differ in head size (MLA: d_k != d_v)
        lay.keys = torch.gather(k, 2, gi.expand(k.shape[0], -1, -1, k.shape[-1]))
        lay.values = torch.gather(v, 2, gi.expand(v.shape[0], -1, -1, v.shape[-1]))
        lay.workbench_positions = kp.to(torch.int64).cpu().expand(k.shape[0], -1, -1).clone()
        done.append(l)
    return done, skipped


def layer_bytes(cache) -> list[int]:
    """Bytes of the keys and values stored per layer."""
    out = []
    for lay in cache_layers(cache):
        k = getattr(lay, "keys", None)
        out.append(0 if k is None or not k.numel() else k.numel() * k.element_size() + lay.values.numel() * lay.values.element_size())
    return out


def cache_batch_size(cache) -> int:
    """Batch size of a dynamic cache (from its first initialised layer)."""
    for lay in cache_layers(cache):
        if getattr(lay, "keys", None) is not None and lay.keys.dim() == 4:
            return int(lay.keys.shape[0])
    return 0


def stack_cache_rows(items) -> object:
    """A new cache whose batch rows are ``[cache_i[row_i] for (cache_i, row_i) in items]``.

    Every cache must have the same layer types and per-layer lengths (sliding-window layers must have
    seen the same number of tokens); the inputs are not modified.
    """

    base = items[0][0]
    out = copy.copy(base)
    out.layers = [copy.copy(lay) for lay in cache_layers(base)]
    for l, lay in enumerate(out.layers):
        if getattr(lay, "keys", None) is None or not getattr(lay, "is_initialized", True):
            continue
        srcs = [cache_layers(c)[l] for c, _ in items]
        if len({int(s.keys.shape[-2]) for s in srcs}) != 1 or len({getattr(s, "cumulative_length", 0) for s in srcs}) != 1:
            raise ValueError(f"items: caches differ in length at layer {l}; cannot stack them")
        lay.keys = torch.cat([s.keys[r: r + 1] for s, (_, r) in zip(srcs, items)], dim=0)
        lay.values = torch.cat([s.values[r: r + 1] for s, (_, r) in zip(srcs, items)], dim=0)
        pos = [getattr(s, "workbench_positions", None) for s in srcs]
        if not getattr(lay, "is_sliding", False):  # a full layer's record is not extended by decoding
            lay.workbench_positions = None
        elif any(p is not None for p in pos):
            G, S = lay.keys.shape[1], lay.keys.shape[2]
            lay.workbench_positions = torch.cat([
                (p[r: r + 1] if p is not None else layer_positions(c, l)[None]).expand(1, G, S)
                for p, (c, r) in zip(pos, items)], dim=0)
    return out


@contextlib.contextmanager
def transformers_progress(enabled: bool):
    """Show or hide transformers' own progress bars (e.g. "Loading weights") inside the block."""

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


# ----------------------------------------------------------------------------- eviction: per-head masks and RoPE
KEYMASK_PREFIX = "workbench_keymask_"


def _masked(attention_mask, query: torch.Tensor, key: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
    """The call's mask as an additive float ``[B, H_Q, q, S]`` plus ``extra [H_Q, S]`` (0 or -inf)."""
    B, H, q, _ = query.shape
    S = key.shape[-2]
    if attention_mask is None:  # plain causal: query i sees the keys up to S - q + i
        i = torch.arange(q, device=query.device)[:, None]
        j = torch.arange(S, device=query.device)[None, :]
        base = torch.zeros(q, S, dtype=query.dtype, device=query.device).masked_fill(j > S - q + i, float("-inf"))
        base = base[None, None]
    elif attention_mask.dtype == torch.bool:
        base = torch.zeros(attention_mask[..., :S].shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attention_mask[..., :S], float("-inf"))
    else:
        base = attention_mask[..., :S].to(query.dtype)
    return (base + extra.to(query.device, query.dtype)[None, :, None, :]).expand(B, H, q, S)


@contextlib.contextmanager
def per_head_key_mask(model, drop: dict, head_group: torch.Tensor):
    """Hide cache entries from single KV heads: ``drop[l]`` (bool ``[G, S0]``, True = hidden) masks the first
    ``S0`` storage slots of layer ``l`` for the query heads of each group (``head_group [H_Q]``), in every
    forward inside the block (per-head budgets in a dense cache; the hidden entries still take memory).
    A mask sized for another layer (layers compacted to different lengths) is rebuilt as plain causal: every
    stored key precedes the new queries. Uses a registered attention implementation wrapping the current
    one; always restores it."""
    old = current_attn_implementation(model)
    base = old[len(KEYMASK_PREFIX):] if old.startswith(KEYMASK_PREFIX) else old
    fn = base_attention_function(base)
    hg = head_group.to(torch.int64)

    def wrapped(module, query, key, value, attention_mask, **kwargs):
        d = drop.get(int(getattr(module, "layer_idx", -1)))
        S = key.shape[-2]
        if isinstance(attention_mask, torch.Tensor) and attention_mask.shape[-1] != S:
            attention_mask = None  # sized from another layer's length (a count per layer): plain causal
        if d is None or not bool(d.any()):
            if attention_mask is None and query.shape[2] > 1:
                return fn(module, query, key, value, _masked(None, query, key, torch.zeros(len(hg), S)), **kwargs)
            return fn(module, query, key, value, attention_mask, **kwargs)
        extra = torch.zeros(len(hg), S)
        extra[:, : d.shape[1]] = torch.zeros(d.shape).masked_fill(d, float("-inf"))[hg]
        return fn(module, query, key, value, _masked(attention_mask, query, key, extra), **kwargs)

    name = KEYMASK_PREFIX + base.replace("|", "_")
    AttentionInterface.register(name, wrapped)
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS.get(base)
    if mask_fn is None:
        raise TypeError(f"attn_implementation: no mask function for base implementation {base!r}")
    AttentionMaskInterface.register(name, mask_fn)
    set_attn_implementation(model, name)
    try:
        yield
    finally:
        set_attn_implementation(model, old)


def rotate_cache_keys(cache, layers, cos: torch.Tensor, sin: torch.Tensor, pair: torch.Tensor) -> None:
    """Turn stored keys in place: ``k ← cos ⊙ k + sin ⊙ k[pair]`` with ``cos, sin [L, G, S, d]`` and ``pair [L, d]``
    (a :class:`~workbench.run.rotary.RotaryMaps` form), e.g. ``R(-δ) R(p) k = R(p - δ) k`` (re-positioning)."""
    for l in layers:
        lay = cache_layers(cache)[l]
        k = lay.keys
        lay.keys = k * cos[l].to(k)[None] + k.index_select(-1, pair[l].to(k.device)) * sin[l].to(k)[None]


QUERIES_PREFIX = "workbench_queries_"


@contextlib.contextmanager
def attention_queries(model, fn: Callable):
    """``fn(layer, q)`` with the queries every attention call receives, ``q [B, H_Q, q_len, d]``: after the
    model's own projections (fused ones split), q-norm and RoPE, as the kernel sees them. Registers a wrapper
    of the current implementation (the model's mask and kernel unchanged); always restores it."""
    old = current_attn_implementation(model)
    base = base_attention_function(old)

    def wrapped(module, query, key, value, attention_mask, **kwargs):
        fn(int(getattr(module, "layer_idx", -1)), query)
        return base(module, query, key, value, attention_mask, **kwargs)

    name = QUERIES_PREFIX + old.replace("|", "_")
    AttentionInterface.register(name, wrapped)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[old])
    set_attn_implementation(model, name)
    try:
        yield
    finally:
        set_attn_implementation(model, old)


@contextlib.contextmanager
def attention_inputs(model, fn: Callable):
    """``fn(layer, module, hidden_states, kwargs)`` before every layer's attention call (the module, its input
    hidden states and keyword inputs such as ``position_embeddings``), as kvpress's forward hooks see them."""
    handles = []

    def hook(l, m, a, kw):
        fn(l, m, layer_hidden(a, kw), kw)  # returns None: the call's inputs are left as they are

    attn = families.family_of(model).attn
    try:
        for l, layer in enumerate(decoder_layers(model)):
            if getattr(layer, attn, None) is None:  # a hybrid's recurrent layer: no attention call
                continue
            handles.append(getattr(layer, attn).register_forward_pre_hook(
                lambda m, a, kw, l=l: hook(l, m, a, kw), with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()
