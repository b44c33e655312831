"""The transformers version each family row needs, where it is newer than the package's floor (``pyproject``:
transformers >= 5.2): below it the row is refused at load with the reason (re-exported by
:mod:`workbench.run.families`)."""
from __future__ import annotations

import transformers

__all__ = ["MIN_TRANSFORMERS", "version_refusal", "HYBRID_EVICTION", "hybrid_eviction_refusal"]

# hybrids refused under older transformers, with the reason: under 5.2 (the floor) their forward builds
# no cache of its own (it warns "requires an initialized HybridMambaAttentionDynamicCache") and returns none, so the
# decode rows would attend to the new token alone; verified exact from 5.24
_HYBRID_CACHE = ("under transformers {v} its forward builds no cache of its own (a HybridMambaAttentionDynamicCache "
                 "must be passed in), so decode-step rows would be wrong; capture is verified from transformers 5.24")
MIN_TRANSFORMERS: dict[str, tuple[tuple[int, int], str]] = {
    "bamba": ((5, 24), _HYBRID_CACHE),
    "granitemoehybrid": ((5, 24), _HYBRID_CACHE),
    "gemma4_text": ((5, 24), "transformers {v} has no gemma4_text model (its modelling code is newer than the floor); "
                             "its row is verified from transformers 5.24"),
    "falcon_h1": ((5, 24), _HYBRID_CACHE.replace("a HybridMambaAttentionDynamicCache", "a FalconHybridMambaAttentionDynamicCache")),
}


def _transformers_version() -> tuple[int, int]:
    major, minor = (transformers.__version__.split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def version_refusal(model_type: str) -> str | None:
    """Why ``model_type``'s row is refused under the installed transformers (``None`` when it is not)."""
    need = MIN_TRANSFORMERS.get(model_type)
    if need is None or _transformers_version() >= need[0]:
        return None
    return need[1].format(v=transformers.__version__)


# Hybrids evict from this version on. Older ones keep a hybrid's cache in a class of its own with no per-layer
# storage (under 5.2: HybridMambaAttentionDynamicCache, Lfm2HybridConvCache, Qwen3NextDynamicCache), which the
# compaction cannot read; capture on the softmax layers is exact there. Verified on 5.25.
HYBRID_EVICTION: tuple[int, int] = (5, 25)


def hybrid_eviction_refusal() -> str | None:
    """Why a hybrid's eviction is refused under the installed transformers (``None`` from :data:`HYBRID_EVICTION`)."""
    if _transformers_version() >= HYBRID_EVICTION:
        return None
    return (f"under transformers {transformers.__version__} a hybrid's cache is a class of its own with no per-layer "
            f"storage the eviction can compact; eviction on its softmax layers is verified from transformers "
            f"{'.'.join(map(str, HYBRID_EVICTION))}")
