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
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_save

from workbench._version import __version__
from workbench.capture.budget import CAPTURE_CHECKS
from workbench.capture.checksum import FILE_KEY, HEADER_KEY, KEYS, PLACEHOLDER, file_digests, seal, tensor_sha256
from workbench.capture.synthetic import synthetic_rows
from workbench.checks import Choice
from workbench.choices import ROW_KINDS, SYNTHETIC_STRUCTURES, RowDtype, RowKind, SyntheticStructure
from workbench.constraints import register_all
from workbench.run.spans import PromptSpans
from workbench.util import atomic_write_bytes

FORMAT_PREFIX = "workbench.capture/"
# 2: the whole file (header and tensors) is checksummed; files of format 1 only checksummed their tensors
FORMAT_VERSION = 2
_FORMAT_TAG = re.compile(re.escape(FORMAT_PREFIX) + r"(\d+)")
TENSOR_NAMES = ("attn", "row_pos", "head_group", "vnorm_max", "learned_sink")
_SYNTHETIC_CHECKS = register_all("synthetic", {"structure": Choice(SYNTHETIC_STRUCTURES),
                                               "dtype": CAPTURE_CHECKS["dtype"]}, __name__)
"""The static arguments of :meth:`Capture.synthetic` (the storage dtype: the capture's own constraint)."""


def _verify_tensors(tensors: dict, recorded: str | None, path: Path) -> None:
    """Name the first tensor whose bytes differ from its recorded sha256 (called once the whole-file
    checksum has failed, to say which part changed)."""
    try:
        sums = json.loads(recorded) if recorded is not None else None
    except json.JSONDecodeError:
        sums = None
    if not isinstance(sums, dict):
        return
    for name, t in tensors.items():
        if name in sums and tensor_sha256(t) != sums[name]:
            raise ValueError(f"path: {path} is damaged: tensor {name!r} does not match its sha256 checksum (the "
                             "file changed after it was written); capture it again")


def _not_json(x, where: str):
    """``(field, what)`` of the first value under ``x`` that JSON cannot hold, else ``None``."""
    if x is None or isinstance(x, (str, bool, int, float)):
        return None
    if isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            got = _not_json(v, f"{where}[{i}]")
            if got:
                return got
        return None
    if isinstance(x, dict):
        for k, v in x.items():
            if not isinstance(k, str):
                return f"{where}", f"the key {k!r} ({type(k).__name__})"
            got = _not_json(v, f"{where}[{k!r}]")
            if got:
                return got
        return None
    return where, f"{type(x).__name__} {x!r:.60}"


def _release(v: str) -> tuple[int, ...] | None:
    m = re.match(r"(\d+(?:\.\d+)*)", v)
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def _check_version(version, where: str) -> None:
    """A capture's workbench version: empty (unknown) or a version not newer than this workbench's."""
    if not isinstance(version, str):
        raise ValueError(f"{where}: version must be a string, got {type(version).__name__}")
    if not version:
        return
    rel, ours = _release(version), _release(__version__)
    if rel is None:
        raise ValueError(f"{where}: version must be a workbench version such as {__version__!r}, got {version!r}")
    n = max(len(rel), len(ours))
    if rel + (0,) * (n - len(rel)) > ours + (0,) * (n - len(ours)):
        raise ValueError(f"{where}: version {version!r} is newer than this workbench ({__version__}); it was written "
                         "by a newer attn-workbench: upgrade to read it")


def config_fingerprint(model_id: str) -> str:
    """The ``(type, L=…, H_Q=…, G=…, d=…)`` part of a model identity (``""`` when absent)."""
    at = model_id.rfind(" (")
    return model_id[at + 1:] if at >= 0 and model_id.endswith(")") else ""


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
        learned_sink: float32 ``[L, H_Q, R]`` mass each row puts on a learned attention sink (gpt-oss
            ``s_aux``), ``None`` for models without one. The rows of ``attn`` then sum to
            ``1 - learned_sink`` exactly as the model computes them.
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
    learned_sink: torch.Tensor | None = None
    _derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def head_dim(self) -> int | None:
        """The head dimension ``d`` of the model that made the capture (what KV byte counts read): the model
        config's, recorded by ``run_capture`` in ``params["head_dim"]``; else the ``d=`` of the config fingerprint
        at the end of ``model_id`` (captures saved without the key), never a ``d=`` in the model's name or path,
        which may say anything; ``None`` when neither is known (a synthetic capture: no model)."""
        d = self.params.get("head_dim")
        if d is not None:
            return int(d)
        m = re.search(r"\bd=(\d+)\)$", config_fingerprint(self.model_id))
        return int(m.group(1)) if m else None

    def cached(self, key, fn):
        """Memoise a parameter-free derived quantity of this capture (what sliders reuse).

        ``key`` names a quantity of the capture alone (``"observer_attn"``); a quantity that depends on a
        method's parameters is kept by its caller (``workbench.analyse.pooling.PoolingCache``, owned by a
        panel), not here. Captures are treated as immutable: replace ``attn`` and the cache is stale; call
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
    def softmax_layers(self) -> list[int]:
        """The layers with attention rows: every layer, except in a hybrid family (capture only), whose other
        layers keep a recurrent or convolution state and have NaN rows."""
        return [int(l) for l in self.params.get("softmax_layers", range(self.L))]

    def require_all_layers(self, what: str) -> None:
        """``ValueError`` naming ``what`` when some layers have no attention rows (a hybrid's capture)."""
        missing = sorted(set(range(self.L)) - set(self.softmax_layers))
        if missing:
            raise ValueError(f"capture: {what} needs attention rows on every layer; layers {missing} of this "
                             f"capture are not softmax attention (a hybrid family), only {self.softmax_layers} have rows")

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
    def rows_of(self, kind: RowKind) -> torch.Tensor:
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

    def sink_mass(self, kind: RowKind = "observer") -> torch.Tensor:
        """Mean attention mass on the sinks ``𝒮`` over the rows of one kind; float32 ``[L, H_Q]``."""
        idx = self.rows_of(kind)
        if idx.numel() == 0:
            raise ValueError(f"kind: no rows of kind {kind!r} in this capture")
        return self.attn[:, :, idx, : self.spans.n_sink].float().sum(-1).mean(-1)

    # ----- persistence -----
    def to_safetensors(self, *, validate: bool = True) -> bytes:
        """The file :meth:`save` writes: safetensors bytes with a JSON header holding the spans, the parameters,
        a sha256 checksum of every tensor (``meta["sha256"]``), of the header (``meta["header_sha256"]``) and of
        the whole file (``meta["file_sha256"]``, :mod:`workbench.capture.checksum`); :meth:`load` verifies them.
        ``validate=False`` skips :meth:`validate` (only to write deliberately damaged files in tests)."""
        if validate:
            self.validate("capture")
        tensors = {
            "attn": self.attn.contiguous(),
            "row_pos": self.row_pos.contiguous(),
            "head_group": self.head_group.contiguous(),
            "vnorm_max": self.vnorm_max.contiguous(),
        }
        for l, h in self.hidden.items():
            tensors[f"hidden.{int(l)}"] = h.contiguous()
        if self.learned_sink is not None:
            tensors["learned_sink"] = self.learned_sink.contiguous()
        meta = {
            "format": f"{FORMAT_PREFIX}{FORMAT_VERSION}",
            "row_kind": json.dumps(self.row_kind),
            "spans": self.spans.to_json(),
            "model_id": self.model_id,
            "params": json.dumps(self.params),
            "version": self.version,
            "generated_ids": json.dumps(list(self.generated_ids)),
            "sha256": json.dumps({k: tensor_sha256(v) for k, v in sorted(tensors.items())}),
            **dict.fromkeys(KEYS, PLACEHOLDER),
        }
        return seal(safetensors_save(tensors, metadata=meta))

    def save(self, path: str | os.PathLike) -> Path:
        """Write to ``path`` (safetensors with a JSON header, a sha256 checksum of every tensor and one of the
        whole file). Validated first exactly as :meth:`load` validates (nothing is written for a capture
        ``load`` would refuse). Atomic: a failed write leaves nothing."""
        path = Path(path)
        data = self.to_safetensors()
        atomic_write_bytes(path, data)  # our own temp file: never safetensors'
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Capture":
        """Read a capture written by :meth:`save`, verify the whole file's sha256 checksum (header and
        tensors) and :meth:`validate` it (shapes, spans, kinds, groups, version, token ids).

        Raises:
            ValueError: naming ``path`` when the file is not a workbench capture, its header is damaged or was
                edited, a tensor does not match its checksum (the tensor is named), it was written by a newer
                workbench (a newer format version or workbench version) or by an older one whose header
                carries no checksum (capture it again), or it is inconsistent (the field is named).
        """
        path = Path(path)
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
        except FileNotFoundError:
            raise
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise ValueError(f"path: {path} is not a workbench capture file, or its header is damaged "
                             f"({type(e).__name__}: {e})") from None
        fmt = meta.get("format", "")
        if not fmt.startswith(FORMAT_PREFIX):
            raise ValueError(f"path: {path} is not a workbench capture file (format tag {fmt or None!r} in its "
                             "header)")
        m = _FORMAT_TAG.fullmatch(fmt)
        ver = int(m.group(1)) if m else None
        if ver is not None and ver > FORMAT_VERSION:
            raise ValueError(f"path: {path} was written by a newer workbench (capture format version {ver} in its "
                             f"header, version {meta.get('version') or '?'}); this one reads version "
                             f"{FORMAT_VERSION}: upgrade attn-workbench to read it")
        if ver == 1:
            raise ValueError(f"path: {path} was written by an older workbench (capture format 1): its header is "
                             "not checksummed, so an edit to its spans, ids or parameters cannot be detected; "
                             "re-capture it with this workbench (run_capture, then save)")
        if ver != FORMAT_VERSION:
            raise ValueError(f"path: {path} has an unknown capture format tag {fmt!r} in its header; this "
                             f"workbench reads {FORMAT_PREFIX}{FORMAT_VERSION}")
        recorded, actual = file_digests(path)
        missing = [k for k in KEYS if recorded[k] is None]
        if missing:
            raise ValueError(f"path: {path} is damaged: its header holds no {' or '.join(missing)} checksum; "
                             "capture it again")
        if recorded[HEADER_KEY] != actual[HEADER_KEY]:
            raise ValueError(f"path: {path} is damaged: its header does not match its sha256 checksum (the spans, "
                             "ids, parameters or tensor table changed after it was written); capture it again")
        try:
            t = load_file(str(path))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise ValueError(f"path: {path} is a damaged workbench capture: its header's tensor table does not "
                             f"match the file ({type(e).__name__}: {e})") from None
        if recorded[FILE_KEY] != actual[FILE_KEY]:
            _verify_tensors(t, meta.get("sha256"), path)
            raise ValueError(f"path: {path} is damaged: its tensor bytes do not match the file's sha256 checksum "
                             "(the file changed after it was written); capture it again")
        _check_version(meta.get("version", ""), f"path: {path}")
        hidden = {}
        for k, v in t.items():
            if k in TENSOR_NAMES:
                continue
            layer = k[len("hidden."):] if k.startswith("hidden.") else ""
            if not layer.isdigit():
                raise ValueError(f"path: {path} has an unexpected tensor {k!r} (a workbench capture holds "
                                 f"{', '.join(TENSOR_NAMES)} and hidden.<layer> with an integer layer)")
            hidden[int(layer)] = v
        try:
            cap = cls(
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
                learned_sink=t.get("learned_sink"),
            )
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"path: {path} is a damaged workbench capture (missing or unreadable {e})") from None
        return cap.validate(f"path: {path}")

    def validate(self, where: str = "capture") -> "Capture":
        """Check shapes, spans, row kinds, head groups and positions; ``ValueError`` naming the field.

        ``attn [L, H_Q, R, K]`` floating point with ``K >= T``; ``row_pos [R]`` integer, prompt rows in
        ``[0, T)`` and decode rows in ``[T-1, K)``; ``row_kind`` ``R`` labels from ``ROW_KINDS``;
        ``head_group [H_Q]`` equal to ``h // r`` (every KV group of ``r = H_Q / G`` heads);
        ``vnorm_max [L, G]``; the spans inside ``[0, T)`` (:meth:`PromptSpans.validate`); hidden states
        ``[T, D]``; generated ids integers; ``params`` JSON (the field that is not is named); the prompt and
        generated ids inside the vocabulary when ``params["vocab"]`` records it; ``version`` empty or not newer
        than this workbench.
        """

        def bad(field_, msg):
            raise ValueError(f"{where}: {field_} {msg}")

        try:
            self.spans.validate("spans")
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        T = self.spans.T
        a = self.attn
        if not isinstance(a, torch.Tensor) or a.dim() != 4 or not a.dtype.is_floating_point:
            bad("attn", f"must be a floating-point tensor [L, H_Q, R, K], got {getattr(a, 'shape', type(a))}")
        L, H_Q, R, K = a.shape
        if L < 1 or H_Q < 1:
            bad("attn", f"must have L >= 1 layers and H_Q >= 1 heads, got shape {list(a.shape)}")
        if K < T:
            bad("attn", f"key axis K = {K} must cover the prompt (K >= T = {T})")
        rp = self.row_pos
        if not isinstance(rp, torch.Tensor) or rp.shape != (R,) or rp.dtype.is_floating_point or rp.dtype == torch.bool:
            bad("row_pos", f"must be an integer tensor [R] = [{R}], got {getattr(rp, 'shape', type(rp))}")
        if not isinstance(self.row_kind, list) or len(self.row_kind) != R:
            bad("row_kind", f"must be a list of R = {R} labels, got {len(self.row_kind) if hasattr(self.row_kind, '__len__') else self.row_kind!r}")
        kinds = set(self.row_kind) - set(ROW_KINDS)
        if kinds:
            bad("row_kind", f"labels must be in {list(ROW_KINDS)}, got {sorted(map(str, kinds))}")
        for i, (p, k) in enumerate(zip(rp.tolist(), self.row_kind)):
            lo, hi = (T, K) if k == "decode" else (0, T)
            if not lo <= p < hi:
                bad("row_pos", f"row {i} ({k}) at position {p} is outside [{lo}, {hi})")
        hg = self.head_group
        if not isinstance(hg, torch.Tensor) or hg.shape != (H_Q,) or hg.dtype.is_floating_point or hg.dtype == torch.bool:
            bad("head_group", f"must be an integer tensor [H_Q] = [{H_Q}], got {getattr(hg, 'shape', type(hg))}")
        G = int(hg.max()) + 1 if int(hg.min()) >= 0 else 0
        if G < 1 or H_Q % G or not torch.equal(hg.to(torch.int64), torch.arange(H_Q) // (H_Q // G)):
            bad("head_group", f"must map query head h to KV group h // r (G groups of r = H_Q / G heads), "
                              f"got {hg.tolist()}")
        if not isinstance(self.vnorm_max, torch.Tensor) or tuple(self.vnorm_max.shape) != (L, G):
            bad("vnorm_max", f"must have shape [L, G] = [{L}, {G}], got {list(getattr(self.vnorm_max, 'shape', []))}")
        for l, h in self.hidden.items():
            if not 0 <= int(l) <= L or h.dim() != 2 or h.shape[0] != T:
                bad("hidden", f"layer {l} must be in [0, {L}] with states [T, D] = [{T}, D], got {list(h.shape)}")
        ls = self.learned_sink
        if ls is not None and (not isinstance(ls, torch.Tensor) or tuple(ls.shape) != (L, H_Q, R)):
            bad("learned_sink", f"must have shape [L, H_Q, R] = [{L}, {H_Q}, {R}], got {list(getattr(ls, 'shape', []))}")
        if not isinstance(self.generated_ids, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.generated_ids):
            bad("generated_ids", "must be integer token ids >= 0")
        if not isinstance(self.model_id, str):
            bad("model_id", f"must be a string, got {type(self.model_id).__name__}")
        if not isinstance(self.params, dict):
            bad("params", f"must be a dict, got {type(self.params).__name__}")
        unjson = _not_json(self.params, "params")
        if unjson is not None:
            bad(unjson[0], f"must be JSON (numbers, strings, lists, dicts with string keys), got {unjson[1]}")
        V = self.params.get("vocab")
        if V is not None:
            if not isinstance(V, int) or isinstance(V, bool) or V < 1:
                bad("params['vocab']", f"must be the model's vocabulary size, an integer >= 1, got {V!r}")
            for name, ids in (("spans.input_ids", self.spans.input_ids), ("generated_ids", self.generated_ids)):
                top = max(ids, default=-1)
                if top >= V:
                    bad(name, f"must be token ids in [0, {V}) (the vocabulary of {self.model_id!r}), got {top}")
        _check_version(self.version, where)
        return self

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
        _SYNTHETIC_CHECKS["structure"].check("structure", structure)
        _SYNTHETIC_CHECKS["dtype"].check("dtype", dtype)
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
