"""One constraint object per parameter (see :mod:`workbench.checks` for the constraint classes).

:data:`PARAMS` maps each public parameter to the one object that checks it; every dataclass and function
that takes the parameter checks it with that object (their ``CHECKS`` mappings, :func:`checks_for`), the
widget slider specs take their range from it (``show.widgets.SliderSpec.constraint``), and the bad-input
tests are generated from it (``tests/test_constraints.py``: every ``invalid()`` value is refused with the
constraint's message, every ``valid()`` value is accepted).

Keys are the parameter names; a name that means different things in different places is qualified by
its owner (``deferkv.lam`` is DeferKV's ``λ ∈ [-50, 50]``, ``lam`` the priority weight ``λ ≥ 0``;
``report.seed`` the report's seed). The message format is everywhere
``"<name>: must be <describe()>, got <value>"``.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from workbench.checks import (
    DEVICE,
    KERNEL,
    MAX_NEW_TOKENS,
    SEED,
    TARGET,
    TARGET_TOKENS,
    AnyOf,
    Bool,
    Choice,
    Const,
    Constraint,
    InstanceOf,
    Interval,
    Seq,
    optional,
)
from workbench.choices import (
    AUDIT_MODES,
    EXPORT_FORMATS,
    H2O_NORMALISES,
    METHOD_NAMES,
    POLICY_NAMES,
    POOLINGS,
    PRESET_NAMES,
    PRIORITIES,
    QUERY_MODES,
    REPORT_DATA,
    ROW_DTYPES,
    WIDTH_PRESETS,
)

TORCH_DTYPE_NAMES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")  # load_model's dtype names
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
SWEEP_EXECUTORS = ("local", "ray")
SWEEP_ON_ERROR = ("raise", "record")
SWEEP_ON_BUSY = ("wait", "raise")

__all__ = ["PARAMS", "checks_for", "checked", "BUDGET", "BUDGET_FRAC", "DEVICE", "POSITION", "pruned_layer",
           "answer_doc"]


def _real(lo=None, hi=None, closed="both", **kw) -> Interval:
    return Interval("real", lo, hi, closed=closed, **kw)


def _int(lo=None, hi=None, **kw) -> Interval:
    return Interval("int", lo, hi, **kw)


def _is_path(x) -> bool:
    return isinstance(x, (str, os.PathLike))


def _is_file(x) -> bool:
    return _is_path(x) and bool(str(x).strip()) and Path(x).is_file()


def _is_evicting_policy(x) -> bool:
    # duck-typed (the base layer cannot import the eviction policies): a policy dataclass that evicts
    return all(callable(getattr(x, a, None)) for a in ("scores", "needs", "protected")) and not getattr(
        x, "keeps_all", True)


def _is_torch_dtype(x) -> bool:
    return type(x).__name__ == "dtype" and type(x).__module__ == "torch"  # duck-typed: no torch import here


def _is_figure(x) -> bool:
    """A plotly figure or FigureWidget, a token view (``show.token_view.TokenView``: ``tokens`` and ``html()``),
    or a token widget holding one as ``.view`` (duck-typed: this base layer imports nothing of ``show``)."""
    def token_view(v) -> bool:
        return callable(getattr(v, "html", None)) and isinstance(getattr(v, "tokens", None), list)

    return (callable(getattr(x, "to_plotly_json", None)) and hasattr(x, "layout")) or token_view(x) \
        or token_view(getattr(x, "view", None))


def _is_frame(x) -> bool:
    return type(x).__name__ == "DataFrame" and hasattr(x, "columns")


BUDGET = _int(1)
"""``B``, prompt positions kept per layer and KV group (``≥`` the protected count is checked where it is known)."""
BUDGET_FRAC = _real(0.0, 1.0, closed="right")
"""A budget as a fraction of the prompt length: ``B = ⌈budget_frac · T⌉`` (``rerun.eviction.resolve_budget``)."""
POSITION = _int(0, what="an integer position")
_COUNT0 = _int(0)
_COUNT1 = _int(1)
_UNIT = _real(0.0, 1.0)
_PX = _real(0.0, None, closed="right")
_WIDTH_ONE = AnyOf(Choice(WIDTH_PRESETS), _PX)

_P: dict[str, Constraint] = {
    # ---- EntroPrefill (SPEC §2-§6): EntroPrefillParams, HeadPooling, ChunkPriorities, GreedySelection, the audit
    "zeta": _real(0.0, 1.0, closed="right"),
    "tau": _real(0.0, None, closed="right"),
    "rho_min": _real(0.0, 1.0, closed="neither"),
    "eps_s": _real(0.0, None, closed="right"),
    "lam": _real(0.0, None),
    "target": optional(TARGET),
    "target_tokens": optional(TARGET_TOKENS),
    "eps_row": _real(0.0, 1.0, closed="right"),
    "m0": _COUNT0,
    "monitored": optional(Seq(_int(1), nonempty=True, distinct=True, sort=True)),
    "audit_mode": Choice(AUDIT_MODES),
    "m_a": _COUNT1,
    "delta": _real(0.0, 1.0, closed="neither"),
    "eps_audit": _real(0.0, 1.0, closed="right"),
    "d_max": _UNIT,
    "streak": _COUNT0,
    "seed": SEED,
    "priority": Choice(PRIORITIES),
    "max_new_tokens": MAX_NEW_TOKENS,
    "layer": _COUNT0,
    # ---- eviction policies (SPEC §9) and budgets
    "n_sink": _COUNT0,
    "recent": _COUNT0,
    "window": _COUNT1,
    "kernel": KERNEL,
    "pooling": Choice(POOLINGS),
    "normalise": Choice(H2O_NORMALISES),
    "deferkv.lam": _real(-50.0, 50.0),
    "decode_weight": optional(_UNIT),
    "page": _COUNT1,
    "W_p": _COUNT1,
    "base": InstanceOf(_is_evicting_policy, "an evicting EvictionPolicy (not the full cache)"),
    "alpha_safeguard": _UNIT,
    "criticalkv.epsilon": _UNIT,
    "beta": _real(1.0, 1e6),
    "expected_attention.n_sink": _int(0, 16),
    "n_future": _int(1, 1 << 20),
    "use_covariance": Bool(),
    "use_vnorm": Bool(),
    "expected_attention.epsilon": _UNIT,
    "budget": BUDGET,
    "budget_frac": BUDGET_FRAC,
    # kvpress's compression ratio: the fraction of the prompt's KV cache removed (study.kv_budget.ratio_budget)
    "compression_ratio": _real(0.0, 1.0, closed="left"),
    # the matched-byte ladder: KV bytes kept as a fraction of the full prompt cache's (study.kv_budget.ladder_budget)
    "kv_frac": _real(0.0, 1.0, closed="right"),
    "query": Choice(QUERY_MODES),
    "policy": Choice(POLICY_NAMES),  # the built-in names (the eviction registry may add more)
    # ---- analyses shown by the panels
    "K": _COUNT1,
    "pages.s": _COUNT1,
    "pages.e": _COUNT1,
    "k": _COUNT1,
    "W": _COUNT1,
    "ref_start": _COUNT1,
    "run_layer": _COUNT1,
    "counterexample.eps": _real(0.0, 1.0, closed="neither"),
    "counterexample.gamma": _real(0.0, 1.0, closed="neither"),
    "counterexample.V": _real(0.0, None, closed="right"),
    "counterexample.beta": _real(0.0, None, closed="right"),
    # ---- RowSet (capture)
    "observers": Bool(),
    "audit": AnyOf(Const("query"), Const(None), Seq(POSITION, nonempty=False)),
    "tail": _COUNT0,
    "custom": Seq(POSITION, nonempty=False),
    "n_decode": _COUNT0,
    "device": DEVICE,
    # ---- entry points' own arguments (build_prompt, run_pruned, run_capture, load_model, sweep)
    "max_context": optional(_int(1)),
    "chat": optional(Bool()),
    "capture.dtype": Choice(ROW_DTYPES),
    "capture.max_bytes": optional(_int(1)),
    "keep_hidden": Bool(),
    "progress": Bool(),
    "load.dtype": AnyOf(Const("auto"), Const(None), Choice(TORCH_DTYPE_NAMES),
                        InstanceOf(_is_torch_dtype, "a torch dtype", examples=())),
    "attn_implementation": Choice(ATTN_IMPLEMENTATIONS),
    "sweep.executor": Choice(SWEEP_EXECUTORS),
    "sweep.on_error": Choice(SWEEP_ON_ERROR),
    "sweep.checkpoint_s": _real(0.0, None, note="seconds; 0 = after every cell"),
    "sweep.on_busy": Choice(SWEEP_ON_BUSY),
    "seeds": AnyOf(SEED, Seq(SEED, nonempty=True)),
    # ---- PromptPanel (study): a RULER-style length (study.ruler.MIN_LENGTH and up), the document boxes
    "prompt_panel.length": _int(256, 1_000_000),
    "prompt_panel.n_boxes": _int(1, 64),
    # ---- ReportConfig (study)
    "report.out": InstanceOf(_is_path, "a folder path", examples=("out/x", Path("out/y")), nonempty=True),
    "report.model": optional(InstanceOf(_is_path, "a local folder or a hub id", nonempty=True)),
    "report.n_squad": _int(0, 1000),
    "report.n_needle": _int(0, 1000),
    "report.n_followup": _int(0, 1000),
    "report.needle_length": _int(64, 8192),
    "report.n_distractors": _int(1, 20),
    "report.max_new_tokens": optional(_int(1, 4096)),
    "report.data": Choice(REPORT_DATA),
    "report.items": optional(InstanceOf(_is_file, "an existing file")),
    "report.filler": optional(InstanceOf(_is_file, "an existing file")),
    "report.methods": Seq(Choice(METHOD_NAMES), nonempty=True, distinct=True),
    # names are looked up in the (extensible) policy registry by ReportConfig itself
    "report.policies": Seq(InstanceOf(str, "a policy name (built-in or registered) or 'module:Class'",
                                      examples=("snapkv", "deferkv", "h2o"), nonempty=True), nonempty=False, distinct=True),
    "report.budget_fracs": Seq(BUDGET_FRAC, nonempty=True),
    "report.compression_ratios": Seq(_real(0.0, 1.0, closed="left"), nonempty=False, distinct=True),
    "report.kv_ladder": Seq(_real(0.0, 1.0, closed="right"), nonempty=False, distinct=True),
    "report.query": Seq(Choice(QUERY_MODES), nonempty=True, distinct=True),
    "report.entroprefill": InstanceOf(dict, "a dict of EntroPrefill parameters", examples=({}, {"zeta": 0.3})),
    "report.capture_tail": _int(0, 4096),
    "report.capture_decode": _int(0, 256),
    "report.seed": _int(0, 2**31 - 1),
    # ---- check_policy() (rerun): its determinism check seeds numpy with seed, seed + 1 and seed + 12345
    "check_policy.seed": _int(0, 2**32 - 1 - 12345, note="numpy takes seed + 12345 too"),
    "report.threads": AnyOf(Const("auto"), Const(None), _int(1, 1024)),
    "report.widths": InstanceOf(Mapping, "a mapping figure name -> width", examples=({}, {"heads": "double"})),
    "report.progress": Bool(),
    "report.tiny": Bool(),
    "report.margin": _real(0.0, 1.0, closed="left"),
    "report.presets": Seq(Choice(PRESET_NAMES), nonempty=False, distinct=True),
    "report.calibrate": optional(_real(0.0, 1.0, closed="neither", note="share of the clusters that calibrate")),
    # ---- split_items() (study.calibration): the share of the independent units drawn for calibration
    "calibration.fraction": _real(0.0, 1.0, closed="neither", note="share of the clusters that calibrate"),
    "calibration.seed": SEED,
    # the study's RULER-style families (names checked against study.ruler.RULER_TASKS by ReportConfig) and its
    # per-prompt analyses (0 = skip)
    "report.ruler": Seq(InstanceOf(str, "a RULER-style family name", examples=("niah_single",), nonempty=True),
                        nonempty=False, distinct=True),
    "report.ruler_lengths": Seq(_int(256, 131072), nonempty=True, distinct=True),
    "report.ruler_seeds": _int(1, 1000),
    "report.leap_prompts": _int(0, 1000),
    "report.kept_prompts": _int(0, 1000),
    "report.cap_tokens": _int(0, 4096),
    # ---- export() (show)
    "export.fig": InstanceOf(_is_figure, "a plotly go.Figure, a FigureWidget or a TokenView"),
    "export.path": InstanceOf(_is_path, "a path folder/stem", nonempty=True),
    "export.width": AnyOf(Choice(WIDTH_PRESETS), _PX, Seq(_WIDTH_ONE, nonempty=True)),
    "export.formats": AnyOf(Choice(EXPORT_FORMATS), Seq(Choice(EXPORT_FORMATS), nonempty=True, distinct=True)),
    "export.params": optional(InstanceOf(Mapping, "a mapping")),
    "export.data": optional(InstanceOf(_is_frame, "a pandas DataFrame")),
    "export.scale": _PX,
    "export.height": optional(_PX),
    "export.aspect": optional(_PX),
    "export.font_size": AnyOf(Const("auto"), Const(None), _PX),
    "export.title": Bool(),
    "export.prompt": InstanceOf(object, "None, a string, a Prompt or token ids (checked by prompt_hash)"),
    "export.prompt_hash": optional(InstanceOf(str, "a string", nonempty=True)),
    "export.model_id": optional(InstanceOf(str, "a string", nonempty=True)),
    "export.csv": Bool(),
    "export.sidecar": Bool(),
}

PARAMS: Mapping[str, Constraint] = MappingProxyType(_P)
"""Every parameter's constraint, by name (qualified by its owner where a name has several meanings)."""


def pruned_layer(L: int) -> Constraint:
    """``run_pruned``'s fixed layer ``l* ∈ [-1, L-1]`` (or ``None``: adaptive) for a model of ``L`` layers."""
    return optional(_int(-1, L - 1, note=f"L = {L}; -1 = before layer 0"))


def answer_doc(k: int) -> Constraint:
    """``build_prompt``'s answer document: ``None`` or an index into its ``k`` documents."""
    return optional(_int(0, k - 1))


def checks_for(*names: str, prefix: str | None = None, **aliases: str) -> dict[str, Constraint]:
    """``{name: PARAMS[key]}`` for a ``CHECKS`` mapping: each of ``names`` under ``prefix.name`` when that
    key exists, else under ``name``; ``aliases`` map a field to another key (``lam="deferkv.lam"``)."""
    out: dict[str, Constraint] = {}
    for n in names:
        key = f"{prefix}.{n}" if prefix and f"{prefix}.{n}" in _P else n
        out[n] = _P[key]
    for n, key in aliases.items():
        out[n] = _P[key]
    return out


def checked(prefix: str | None = None, **aliases: str):
    """Class decorator (over ``@dataclass``): ``cls.CHECKS`` = the constraint of every field
    (:func:`checks_for` with ``prefix`` and ``aliases``), read by ``checks.check_fields``."""

    def deco(cls):
        names = [f.name for f in dataclasses.fields(cls) if f.name not in aliases]
        cls.CHECKS = MappingProxyType(checks_for(*names, prefix=prefix, **aliases))
        return cls

    return deco
