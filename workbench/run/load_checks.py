"""Load-time refusals of a model whose config or weights would make every number the workbench reports wrong.

A folder's ``config.json`` can describe a model that loads and runs and still answers garbage. Each check here
turns one such case into a refusal at :func:`workbench.run.models.load_model`, naming the field or the weight:

- non-causal attention (:func:`check_config`): ``use_bidirectional_attention`` set (EmbeddingGemma's
  ``gemma3_text`` config: ``true``; Gemma 4: ``"all"``) makes every position attend the future ones too, while
  rows, pruned prefill and eviction assume causal attention. ``"vision"`` (bidirectional inside an image only, text
  causal) is accepted. The backstop after the build is :func:`workbench.run.adapter.attention_refusal`.
- a norm's epsilon (``rms_norm_eps``, ``layer_norm_eps``, ...) that is not a finite number ``> 0`` (a norm divides
  by ``sqrt(mean square + eps)``: a negative one gives NaN or huge activations, silently).
- the shapes of the model the config describes (:func:`skeleton_shapes`), built on the meta device (no memory,
  no weight read), so that a folder whose tensors do not fit it (a wrong ``intermediate_size``) gets the
  workbench's message, not a raw error from inside transformers.
- a load that leaves a weight missing (then initialised at random, e.g. ``tie_word_embeddings: false`` without
  ``lm_head.weight``), unexpected (never used) or mismatched (:func:`loading_refusal`, from transformers' public
  ``output_loading_info``).
- a weight that is not finite (:func:`nonfinite_refusal`).
- an attention implementation the capture cannot read exactly (:func:`implementation_refusal`): flex_attention
  (a block mask) and flash attention (no mask at all), whatever the family.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from workbench.checks import Interval

__all__ = ["BIDIRECTIONAL", "REFUSED_IMPLEMENTATIONS", "check_config", "skeleton_shapes", "loading_refusal",
           "nonfinite_refusal", "implementation_refusal"]

BIDIRECTIONAL = "use_bidirectional_attention"
_EPS = re.compile(r"^(?:.*norm.*_)?(?:eps|epsilon)$")  # a norm's epsilon (rms_norm_eps, layer_norm_epsilon, eps)
# the allowed value of such a field: a config file's field, not a parameter, so it is not registered in PARAMS
_NORM_EPS = Interval("real", 0.0, None, closed="right", note="a norm divides by sqrt(mean square + eps)")
# attention implementations a user can select that the capture cannot read exactly, with the reason
REFUSED_IMPLEMENTATIONS: dict[str, str] = {
    "flex_attention": "flex_attention passes its mask as a BlockMask (a block-sparse description evaluated inside "
                      "the kernel), while the capture computes each row from a dense mask [B, 1|H, q, S] it reads "
                      "from the call; use 'sdpa' (the default) or 'eager'",
}
_FLASH = ("{name} calls its kernel without a mask (the causal rule and any sliding window are applied inside it) and "
          "cannot take a dense one, so the captured rows would follow the causal rule alone (a window missed) and "
          "eviction's per-head key masks could not reach the kernel; use 'sdpa' (the default) or 'eager'")
REFUSED_IMPLEMENTATIONS.update({n: _FLASH.format(name=n) for n in ("flash_attention_2", "flash_attention_3")})


def non_causal_reason(value) -> str | None:
    """Why a ``use_bidirectional_attention`` value makes the text attention non-causal (``None`` when it does
    not: unset, false, or ``"vision"``)."""
    if not value or value == "vision":
        return None
    return (f"{BIDIRECTIONAL} = {value!r}: its attention is bidirectional (every position attends the later ones "
            f"too, as in an embedding model such as EmbeddingGemma), while attention rows, pruned prefill and "
            f"eviction are defined for causal attention; only {BIDIRECTIONAL} = 'vision' (bidirectional inside an "
            f"image, causal text) is accepted")


def check_config(folder: Path, c: Mapping) -> None:
    """Refuse, from the raw (text) config of ``folder`` before transformers parses it, a non-causal attention
    (``TypeError`` naming :data:`BIDIRECTIONAL`) and a norm epsilon that is not a finite number ``> 0``
    (``ValueError`` naming the field)."""
    why = non_causal_reason(c.get(BIDIRECTIONAL))
    if why:
        raise TypeError(f"model: the config of {folder} is not a causal LM: {why}")
    for field, v in c.items():
        if _EPS.search(str(field)) and v is not None and not isinstance(v, (str, list, dict)):
            try:
                _NORM_EPS.check(f"config.json {field}", v)
            except ValueError as e:
                raise ValueError(f"spec: the model folder {folder} has a config that cannot describe a working "
                                 f"model: {e}") from None


def skeleton_shapes(folder: Path, c: Mapping) -> dict[str, list[int]] | None:
    """``{tensor name: shape}`` of the model the config of ``folder`` describes, built by its own modelling class
    on the meta device (no memory, no weight read); ``None`` for a quantised config (packed weights have other
    shapes) or a config transformers cannot build a model from (``from_pretrained`` then raises its own error)."""
    if "quantization_config" in c:
        return None
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            skeleton = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - the real load reports it; this check only adds a clearer message
        return None
    return {k: list(v.shape) for k, v in skeleton.state_dict().items()}


def loading_refusal(info: Mapping) -> str | None:
    """What a load left wrong (``None`` when nothing), from transformers' ``output_loading_info``: weights the
    model needs that the folder lacks (initialised at random), tensors of the folder the model never uses, and
    tensors whose shape differs from the model's."""
    parts = []
    for key, what in (("missing_keys", "missing from the folder (the model would run them initialised at "
                                       "random)"),
                      ("unexpected_keys", "in the folder but not in the model its config describes (never used)"),
                      ("mismatched_keys", "of another shape than the model its config describes")):
        names = sorted(str(n if isinstance(n, str) else n[0]) for n in (info.get(key) or ()))
        if names:
            shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
            parts.append(f"{len(names)} weight(s) {what}: {shown}")
    errors = [str(e) for e in (info.get("error_msgs") or ())]
    if errors:
        parts.append("load errors: " + "; ".join(errors[:3]))
    return "; ".join(parts) or None


def nonfinite_refusal(model: torch.nn.Module) -> str | None:
    """The first weight of ``model`` holding a NaN or an infinity, with how many (``None`` when all are finite;
    weights left on the meta device by an offloading ``device_map`` are not read)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            # one float32 sum per weight: non-finite iff the weight holds a NaN or an infinity (finite weights
            # cannot reach 3e38); elementwise isfinite is an order of magnitude slower on CPU, so it only counts
            if p.device.type == "meta" or bool(torch.isfinite(p.sum(dtype=torch.float32))):
                continue
            bad = int((~torch.isfinite(p)).sum())
            if bad:
                return f"the weight {name} holds {bad} non-finite value(s) (NaN or infinity) of {p.numel()}"
    return None


def implementation_refusal(name: str) -> str | None:
    """Why the attention implementation ``name`` is refused (``None`` when the capture reads it exactly)."""
    return REFUSED_IMPLEMENTATIONS.get(name)
