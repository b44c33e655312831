"""The saved capture object: attention rows, statistics, spans, model identity, parameters.

SPEC §1. A ``Capture`` holds only the rows that were asked for. ``attn[l, h, r, j]`` is the
softmax probability ``A^{l,h}_{u,j}`` of query position ``u = row_pos[r]`` on key ``j`` in layer
``l`` and query head ``h``, computed in float32 exactly as the model computes it and stored in float32 (or,
on request, float16/bfloat16: ``attn.dtype``; analytics upcast, see :mod:`workbench.capture.budget` for
the error); keys ``j > u`` are 0.
The key axis covers the prompt and, for decode rows, the generated tokens (``K = T + n_decode``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_save

from workbench.capture.synthetic import synthetic_rows
from workbench.checks import check_choice
from workbench.choices import ROW_DTYPES, ROW_KINDS, SYNTHETIC_STRUCTURES, RowDtype, SyntheticStructure
from workbench.run.spans import PromptSpans
from workbench.util import atomic_write_bytes


@dataclass
class Capture:
    """Captured attention rows and statistics of one run.

    Attributes:
        attn: float32 (or float16/bfloat16 storage) ``[L, H_Q, R, K]`` attention rows (zeros beyond each row's causal limit).
        row_pos: int64 ``[R]`` absolute query position of each row (``T + t - 1`` for decode step ``t``).
        row_kind: length-``R`` labels from ``ROW_KINDS``.
        head_group: int64 ``[H_Q]``, the KV head ``g(h) = h // r`` read by each query head.
        vnorm_max: float32 ``[L, G]``, ``max_j ‖v_j‖`` over the prompt keys, per layer and KV head.
        spans: the prompt's spans.
        model_id: identity of the model (name or path, and a config fingerprint).
        params: the parameters of the capture (rows asked for, decode length, ...).
        version: workbench version that wrote it.
        hidden: optional hidden states ``{layer: float32 [T, D]}`` (input of block ``layer``;
            key ``L`` is the final-norm input).
        generated_ids: token ids generated during a decode capture (``[n]``), if any.
    """

    attn: torch.Tensor
    row_pos: torch.Tensor
    row_kind: list[str]
    head_group: torch.Tensor
    vnorm_max: torch.Tensor
    spans: PromptSpans
    model_id: str
    params: dict = field(default_factory=dict)
    version: str = ""
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    generated_ids: list[int] = field(default_factory=list)
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def cached(self, key, fn):
        """Memoise a parameter-free derived quantity of this capture (what sliders reuse).

        Captures are treated as immutable: replace ``attn`` and the cache is stale; call
        ``clear_cache()`` after mutating a capture in place.
        """
        if key not in self._derived:
            self._derived[key] = fn()
        return self._derived[key]

    def clear_cache(self) -> None:
        self._derived.clear()

    # ----- shapes -----
    @property
    def L(self) -> int:
        return int(self.attn.shape[0])

    @property
    def H_Q(self) -> int:
        return int(self.attn.shape[1])

    @property
    def G(self) -> int:
        return int(self.head_group.max().item()) + 1

    @property
    def r(self) -> int:
        return self.H_Q // self.G

    @property
    def T(self) -> int:
        return self.spans.T

    # ----- row selection -----
    def rows_of(self, kind: str) -> torch.Tensor:
        """Row indices (into the ``R`` axis) of one kind, ordered by position; int64."""
        if kind not in ROW_KINDS:
            raise ValueError(f"kind: must be one of {ROW_KINDS}, got {kind!r}")
        idx = [i for i, k in enumerate(self.row_kind) if k == kind]
        idx.sort(key=lambda i: int(self.row_pos[i]))
        return torch.tensor(idx, dtype=torch.int64)

    def rows_at(self, positions) -> torch.Tensor:
        """Row indices of the given absolute query positions (first match each); int64."""
        where = {}
        for i, p in enumerate(self.row_pos.tolist()):
            where.setdefault(p, i)
        missing = [int(p) for p in positions if int(p) not in where]
        if missing:
            raise ValueError(f"positions: not captured: {missing[:10]}")
        return torch.tensor([where[int(p)] for p in positions], dtype=torch.int64)

    def observer_attn(self) -> torch.Tensor:
        """Attention of the proposal observers over the prompt keys, ``[L, H_Q, W_p, T]`` in ``attn.dtype``."""
        return self.cached("observer_attn",
                           lambda: self.attn[:, :, self.rows_at(self.spans.observers), : self.T].contiguous())

    def prompt_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Rows ``idx`` restricted to the prompt keys ``[0, T)``, ``[L, H_Q, len(idx), T]`` in ``attn.dtype``."""
        return self.attn[:, :, idx, : self.T]

    def sink_mass(self, kind: str = "observer") -> torch.Tensor:
        """Mean attention mass on the sinks ``𝒮`` over the rows of one kind; float32 ``[L, H_Q]``."""
        idx = self.rows_of(kind)
        if idx.numel() == 0:
            raise ValueError(f"kind: no rows of kind {kind!r} in this capture")
        return self.attn[:, :, idx, : self.spans.n_sink].float().sum(-1).mean(-1)

    # ----- persistence -----
    def save(self, path: str | os.PathLike) -> Path:
        """Write to ``path`` (safetensors with a JSON header). Atomic: a failed write leaves nothing."""
        path = Path(path)
        tensors = {
            "attn": self.attn.contiguous(),
            "row_pos": self.row_pos.contiguous(),
            "head_group": self.head_group.contiguous(),
            "vnorm_max": self.vnorm_max.contiguous(),
        }
        for l, h in self.hidden.items():
            tensors[f"hidden.{int(l)}"] = h.contiguous()
        meta = {
            "format": "workbench.capture/1",
            "row_kind": json.dumps(self.row_kind),
            "spans": self.spans.to_json(),
            "model_id": self.model_id,
            "params": json.dumps(self.params),
            "version": self.version,
            "generated_ids": json.dumps(list(self.generated_ids)),
        }
        atomic_write_bytes(path, safetensors_save(tensors, metadata=meta))  # our own temp file: never safetensors'
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Capture":

        path = Path(path)
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != "workbench.capture/1":
            raise ValueError(f"path: {path} is not a workbench capture file")
        t = load_file(str(path))
        hidden = {int(k.split(".", 1)[1]): v for k, v in t.items() if k.startswith("hidden.")}
        return cls(
            attn=t["attn"],
            row_pos=t["row_pos"],
            row_kind=json.loads(meta["row_kind"]),
            head_group=t["head_group"],
            vnorm_max=t["vnorm_max"],
            spans=PromptSpans.from_json(meta["spans"]),
            model_id=meta["model_id"],
            params=json.loads(meta["params"]),
            version=meta["version"],
            hidden=dict(sorted(hidden.items())),
            generated_ids=json.loads(meta["generated_ids"]),
        )

    @classmethod
    def synthetic(
        cls,
        spans: PromptSpans,
        *,
        L: int = 2,
        H_Q: int = 6,
        G: int = 2,
        extra_rows: dict[str, list[int]] | None = None,
        seed: int = 0,
        concentration: float = 1.0,
        structure: SyntheticStructure = "random",
        dtype: RowDtype = "float32",
    ) -> "Capture":
        """A capture with synthetic causal attention rows, for tests and benchmarks of the analytics.

        Rows: the observers, plus ``extra_rows`` ``{kind: positions}``. ``structure="random"``: each row
        is a softmax of Gaussian logits (scale ``concentration``) over keys ``0 … u``;
        ``"realistic"``: attention sinks, locality and retrieval heads (:mod:`workbench.capture.synthetic`).
        Generated one layer at a time in float32 and stored in ``dtype``: an 8B shape at T = 32k fits.
        """
        if H_Q % G:
            raise ValueError(f"G: must divide H_Q={H_Q}, got {G}")
        check_choice("structure", structure, SYNTHETIC_STRUCTURES)
        check_choice("dtype", dtype, ROW_DTYPES)
        g = torch.Generator().manual_seed(seed)
        pos, kinds = list(spans.observers), ["observer"] * len(spans.observers)
        for kind, ps in (extra_rows or {}).items():
            pos += list(ps)
            kinds += [kind] * len(ps)
        T = spans.T
        K = max([T] + [p + 1 for p in pos])
        attn = synthetic_rows(pos, K, L=L, H_Q=H_Q, generator=g, concentration=concentration, structure=structure,
                              n_sink=spans.n_sink, dtype=getattr(torch, dtype))
        return cls(
            attn=attn,
            row_pos=torch.tensor(pos, dtype=torch.int64),
            row_kind=kinds,
            head_group=torch.arange(H_Q) // (H_Q // G),
            vnorm_max=torch.rand(L, G, generator=g).float() + 0.5,
            spans=spans,
            model_id="synthetic",
            params={"seed": seed, "structure": structure, "dtype": dtype},
        )
