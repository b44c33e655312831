"""The report's settings (:class:`ReportConfig`, checked when built: every error names the field and its allowed
range) and what a run wrote (:class:`ReportResult`)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from workbench.analyse.params import PRESETS, EntroPrefillParams
from workbench.checks import (
    AnyOf,
    Bool,
    Choice,
    Const,
    InstanceOf,
    Interval,
    Seq,
    check_fields,
    check_nonempty,
    optional,
)
from workbench.choices import METHOD_NAMES, PRESET_NAMES, QUERY_MODES, REPORT_DATA
from workbench.constraints import BUDGET_FRAC, checked, shared
from workbench.rerun import eviction
from workbench.study.calibration import calibration_counts
from workbench.study.ruler import RULER_TASKS, grid_units
from workbench.study.verdicts import DEFAULT_MARGIN

__all__ = ["ReportConfig", "ReportResult", "DEFAULT_POLICIES", "METHODS", "DATA", "DEFAULT_THREADS"]

DEFAULT_POLICIES = ("streaming", "h2o", "snapkv", "deferkv")
METHODS = METHOD_NAMES
DATA = REPORT_DATA
# torch threads of the report (benchmarks/report_threads.py, RESULTS.md): on a quiet 2-core machine 2 threads were
# 1.3x faster than 1; on the same machine at load 12 one thread was 5.2x faster than 2. So: the free cores.
DEFAULT_THREADS = "auto"




def _is_path(x) -> bool:
    return isinstance(x, (str, os.PathLike))


def _is_file(x) -> bool:
    return _is_path(x) and bool(str(x).strip()) and Path(x).is_file()


# ----------------------------------------------------------------------------- settings
@checked("report")
@dataclass(frozen=True)
class ReportConfig:
    """What the report runs.

    Attributes (allowed range in brackets):
        out: output folder (created).
        model: ``None`` for the embedded default model, or a local HF folder / cached hub id.
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` ...
        n_squad: SQuAD single-hop prompts [int >= 0].
        n_needle: needle prompts (needle depths spread over ``[0.1, 0.9]``) [int >= 0]; ``n_squad + n_needle >= 1``;
            default 6, enough for the default model to pass the reference floor.
        needle_length: haystack length in tokens [int in [64, 8192]].
        n_followup: follow-up items (``followup.followup_multikey``: one eviction, two questions on one haystack of
            ``needle_length`` tokens; the second answer is scored) [int >= 0]; run under ``full`` and ``evict`` only.
        n_distractors: SQuAD distractor paragraphs per prompt [int >= 1].
        max_new_tokens: greedy tokens per run [int >= 1]; ``None``: each family's own
            (``tasks.TASK_MAX_NEW_TOKENS``, 32 for custom items).
        data: ``"fetched"`` (the cached SQuAD dev set and essays; ``python -m workbench.study.datasets
            fetch``), ``"sample"`` (the bundled samples: 4 SQuAD articles, 5 essays) or ``"auto"`` (fetched
            when cached, else the samples); the report header says which.
        items: a JSONL file of TaskItems (``tasks.load_items``) run beside (or, with ``n_squad = n_needle =
            0``, instead of) the built-in families.
        filler: a ``.txt`` file used as the needles' haystack instead of the essays.
        methods: sweep methods, a subset of ``("full", "entroprefill", "evict")``.
        policies: eviction policies for ``evict`` and the needle table (``eviction.REGISTRY`` names, or "module:Class").
        budget_fracs: eviction budgets as fractions of the prompt length [each in (0, 1]].
        compression_ratios: eviction budgets as kvpress's compression ratios, the fraction of the prompt's KV cache
            removed [each in [0, 1)], ``B = max(1, int(T·(1 − r)))`` (:func:`workbench.study.kv_budget.ratio_budget`);
            ``()``: none (``--compression-ratios`` alone: kvpress's 0.25 0.5 0.75 0.875).
        kv_ladder: matched-byte rungs, KV bytes kept as a fraction of the full cache's [each in (0, 1]]
            (:func:`workbench.study.kv_budget.ladder_budget`; a rung out of reach is a failed cell saying why);
            ``()``: none (``--kv-ladder`` alone: 0.5 0.25 0.125 0.0625).
        query: the query modes of the ``evict`` cells, ``"aware"`` and/or ``"agnostic"`` (kvpress's default: the
            context compressed without the question); default ``("aware",)``.
        entroprefill: EntroPrefill parameters for the sweep's ``entroprefill`` cells (``{}``: defaults).
        presets: EntroPrefill presets by name (``analyse.params.PRESETS``: paper, loose, strict), one
            ``entroprefill`` setting each, ``entroprefill`` applied on top of each; ``()``: the one setting
            ``entroprefill`` gives.
        capture_tail, capture_decode: rows of the example capture (prompt tail, decode steps) [ints >= 0].
        seed: task-building and run seed [int >= 0].
        threads: torch CPU threads for the run [``"auto"``, None: torch's default, or int >= 1]; default
            ``"auto"``: :func:`auto_threads`, the cores the load leaves free (``benchmarks/report_threads.py``).
        widths: export width per figure name (others: :func:`export_width`).
        progress: show tqdm progress bars.
        margin: the non-inferiority margin δ of "What this study shows" [in [0, 1)]; default
            :data:`workbench.study.verdicts.DEFAULT_MARGIN` (0.10), printed with the verdict rule.
        calibrate: ``None`` (default: no split) or the share of each task's independent clusters drawn for
            calibration [in (0, 1); some task, built-in or from ``items``, needs two clusters, since a task's only
            cluster stays in the test split]: the EntroPrefill candidates (``presets``, all of ``analyse.params.PRESETS`` when none is
            given) run on the calibration split, :func:`workbench.study.calibration.calibrate` chooses one, and
            the study (every verdict) runs on the test split only (needs ``entroprefill`` in ``methods``).
        ruler, ruler_lengths, ruler_seeds: RULER-style families (``study.ruler.RULER_TASKS`` names; ``()``: none)
            at each length [ints in [256, 131072]] and seeds ``0 … ruler_seeds − 1`` [int in [1, 1000]].
        leap_prompts: prompts per task captured for the leap (step recall gains against the gapped held-out
            reference) and priority (the answer chunk's standing) analyses [int in [0, 1000]; 0: skip].
        kept_prompts: prompts per task for the share of the gold answer's tokens DeferKV and SnapKV keep at
            ``budget_fracs`` [int in [0, 1000]; 0: skip].
        cap_tokens: full context again on every prompt with this many new tokens, paired against the sweep's
            (did the cap cut answers off?) [int in [0, 4096]; 0: skip].
        divergence: run the answer-divergence stage (a prefill and every policy's decode on the first prompt of
            each family) [bool; default True]; ``False`` skips it, and the manifest's ``skipped`` says so.
    """

    out: Path = Path("out/report")
    model: str | None = None
    device: str = "auto"
    n_squad: int = 3
    # 6 needles: the default model answers them (6/6 in a measured run), which passes the reference floor
    # (findings.MIN_REFERENCE_RIGHT = 5 right) with one miss to spare, so the first report carries verdicts; six tied
    # clusters cannot show non-inferiority at δ = 0.1 (Tango's exact test needs 29), so those read inconclusive.
    n_needle: int = 6
    needle_length: int = 1024
    n_followup: int = 0
    n_distractors: int = 4
    max_new_tokens: int | None = None
    data: str = "auto"
    items: Path | None = None
    filler: Path | None = None
    methods: tuple[str, ...] = METHODS
    policies: tuple[str, ...] = DEFAULT_POLICIES
    budget_fracs: tuple[float, ...] = (0.25, 0.5)
    compression_ratios: tuple[float, ...] = ()
    kv_ladder: tuple[float, ...] = ()
    query: tuple[str, ...] = ("aware",)
    entroprefill: dict = field(default_factory=dict)
    presets: tuple[str, ...] = ()
    capture_tail: int = 32
    capture_decode: int = 4
    seed: int = 0
    threads: int | str | None = DEFAULT_THREADS
    widths: dict = field(default_factory=dict)
    progress: bool = True
    tiny: bool = False
    margin: float = DEFAULT_MARGIN
    calibrate: float | None = None
    ruler: tuple[str, ...] = ()
    ruler_lengths: tuple[int, ...] = (1024,)
    ruler_seeds: int = 1
    leap_prompts: int = 0
    kept_prompts: int = 0
    cap_tokens: int = 0
    divergence: bool = True
    _parameter_constraints: ClassVar = {
        **shared("device"),
        "out": InstanceOf(_is_path, "a folder path", examples=("out/x", Path("out/y")), nonempty=True),
        "model": optional(InstanceOf(_is_path, "a local folder or a hub id", nonempty=True)),
        "n_squad": Interval("int", 0, 1000),
        "n_needle": Interval("int", 0, 1000),
        "needle_length": Interval("int", 64, 8192),
        "n_followup": Interval("int", 0, 1000),
        "n_distractors": Interval("int", 1, 20),
        "max_new_tokens": optional(Interval("int", 1, 4096)),
        "data": Choice(REPORT_DATA),
        "items": optional(InstanceOf(_is_file, "an existing file")),
        "filler": optional(InstanceOf(_is_file, "an existing file")),
        "methods": Seq(Choice(METHOD_NAMES), nonempty=True, distinct=True),
        # names are looked up in the (extensible) policy registry in __post_init__
        "policies": Seq(InstanceOf(str, "a policy name (built-in or registered) or 'module:Class'",
                                   examples=("snapkv", "deferkv", "h2o"), nonempty=True), nonempty=False, distinct=True),
        "budget_fracs": Seq(BUDGET_FRAC, nonempty=True),
        "compression_ratios": Seq(Interval("real", 0.0, 1.0, closed="left"), nonempty=False, distinct=True),
        "kv_ladder": Seq(Interval("real", 0.0, 1.0, closed="right"), nonempty=False, distinct=True),
        "query": Seq(Choice(QUERY_MODES), nonempty=True, distinct=True),
        "entroprefill": InstanceOf(dict, "a dict of EntroPrefill parameters", examples=({}, {"zeta": 0.3})),
        "presets": Seq(Choice(PRESET_NAMES), nonempty=False, distinct=True),
        "capture_tail": Interval("int", 0, 4096),
        "capture_decode": Interval("int", 0, 256),
        "seed": Interval("int", 0, 2**31 - 1),
        "threads": AnyOf(Const("auto"), Const(None), Interval("int", 1, 1024)),
        "widths": InstanceOf(Mapping, "a mapping figure name -> width", examples=({}, {"heads": "double"})),
        "progress": Bool(),
        "tiny": Bool(),
        "margin": Interval("real", 0.0, 1.0, closed="left"),
        "calibrate": optional(Interval("real", 0.0, 1.0, closed="neither", note="share of each task's clusters that calibrate")),
        # the RULER-style families (names checked against study.ruler.RULER_TASKS in __post_init__) and the
        # per-prompt analyses (0 = skip)
        "ruler": Seq(InstanceOf(str, "a RULER-style family name", examples=("niah_single",), nonempty=True),
                     nonempty=False, distinct=True),
        "ruler_lengths": Seq(Interval("int", 256, 131072), nonempty=True, distinct=True),
        "ruler_seeds": Interval("int", 1, 1000),
        "leap_prompts": Interval("int", 0, 1000),
        "kept_prompts": Interval("int", 0, 1000),
        "cap_tokens": Interval("int", 0, 4096),
        "divergence": Bool(),
    }

    @classmethod
    def tiny_config(cls, **kw) -> "ReportConfig":
        """The CI setting: one SQuAD and one needle prompt, 3 tokens, one policy and budget (< 2 min on 2 cores)."""
        base = dict(n_squad=1, n_needle=1, needle_length=128, n_distractors=1, max_new_tokens=3,
                    policies=("deferkv",), budget_fracs=(0.5,), capture_tail=4, capture_decode=1, threads=1,
                    tiny=True)
        base.update({k: v for k, v in kw.items() if v is not None})
        return cls(**base)

    def __post_init__(self):
        check_fields(self)  # every field against its declared constraint
        for name in ("out", "items", "filler"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"out: must be a folder (the report writes report.html, figures/ and tables/ in it), got "
                             f"the file {str(self.out)!r}")
        if self.n_squad + self.n_needle + self.n_followup < 1 and self.items is None and not self.ruler:
            raise ValueError("n_squad: n_squad + n_needle + n_followup must be >= 1 when no items file and no RULER "
                             "family is given (the study needs a prompt)")
        for name in ("methods", "budget_fracs", "presets", "ruler", "ruler_lengths", "compression_ratios", "kv_ladder",
                     "query"):  # stored as tuples (budget fractions as floats)
            object.__setattr__(self, name, self.CHECKS[name].check(name, getattr(self, name)))
        pols = tuple(eviction.REGISTRY.resolve(p) if ":" in p else p for p in self.policies)
        bad = [p for p in pols if p not in eviction.REGISTRY or p == "full"]
        if bad or len(set(pols)) != len(pols):
            raise ValueError(f"policies: must be distinct entries of {sorted(set(eviction.REGISTRY.names()) - {'full'})} "
                             f"(built-in or registered) or 'module:Class', got {self.policies!r}")
        if "evict" in self.methods:  # the same refusal as run_policies' for an empty list
            check_nonempty("policies", pols)
        object.__setattr__(self, "policies", pols)
        bad = [r for r in self.ruler if r not in RULER_TASKS]
        if bad:
            raise ValueError(f"ruler: {bad[0]!r} is not a RULER-style family (allowed: {', '.join(RULER_TASKS)})")
        allowed = sorted({f.name for f in fields(EntroPrefillParams) if f.init} | {"layer"})
        unknown = sorted(map(str, set(self.entroprefill) - set(allowed)))
        if unknown:
            raise ValueError(f"entroprefill: {unknown[0]!r} is not an EntroPrefill parameter (allowed: "
                             f"{', '.join(allowed)})")

        EntroPrefillParams(**{k: v for k, v in self.entroprefill.items() if k != "layer"})  # validates
        if self.calibrate is not None and "entroprefill" not in self.methods:
            raise ValueError(f"calibrate: tunes EntroPrefill's thresholds, so methods must include 'entroprefill', got "
                             f"methods {list(self.methods)}")
        if self.calibrate is not None and self.items is None:  # refused now, before any model work, when no task
            # could give calibration a unit (an items file's units are counted when it is read: check_split)
            calibration_counts(self.builtin_units(), self.calibrate, "calibrate")

    def builtin_units(self) -> dict[str, int]:
        """The independent units (clusters) per task of the built-in families this configuration builds: each SQuAD,
        needle and follow-up prompt its own, the RULER-style families by :func:`workbench.study.ruler.grid_units`."""
        n = {"squad_single": self.n_squad, "needle": self.n_needle, "followup_multikey": self.n_followup,
             **{r: grid_units(r, self.ruler_lengths, self.ruler_seeds) for r in self.ruler}}
        return {t: k for t, k in n.items() if k}

    def calibration_candidates(self) -> list[tuple[str, dict]]:
        """The settings calibration chooses among: ``(preset name, parameters)`` for each of ``presets`` (all
        presets when none is given), ``entroprefill`` applied on top of each."""
        return [(p, {**PRESETS[p]["params"], **self.entroprefill}) for p in (self.presets or tuple(PRESETS))]

    def entroprefill_settings(self) -> list[dict]:
        """The sweep's EntroPrefill parameter sets: one per preset (its parameters, ``entroprefill`` on top), or
        ``entroprefill`` alone without presets."""
        if not self.presets:
            return [dict(self.entroprefill)]
        return [{**PRESETS[p]["params"], **self.entroprefill} for p in self.presets]

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("out", "items", "filler"):
            d[k] = None if d[k] is None else str(d[k])
        return d


@dataclass
class ReportResult:
    """What :func:`run_report` wrote: ``html``, ``figures`` ``{name: [paths]}``, ``tables``
    ``{name: [csv, parquet]}``, ``manifest`` and the per-stage ``timings`` (seconds). ``partial``: the run was
    interrupted (``interrupted`` says during what: ``"the sweep"``, ``"the prompt analyses"``, ``"the needle eviction"``, ``"the figure
    export"``, ``"the tables"`` or ``"the HTML page"``); ``export_error``: one line when figure files could not
    be written (the tables and the page are)."""

    out: Path
    html: Path
    manifest: Path
    figures: dict
    tables: dict
    timings: dict
    partial: bool = False
    interrupted: str | None = None
    export_error: str | None = None

    def summary(self) -> str:
        n_fig = sum(len(v) for v in self.figures.values())
        n_tab = sum(len(v) for v in self.tables.values())
        head = (f"PARTIAL report ({self.interrupted or 'the sweep'} was interrupted; re-run the same command to "
                f"resume)\n" if self.partial else "")
        if self.export_error:
            head += f"WARNING: {self.export_error}\n"
        return (f"{head}wrote {self.html}\n  figures: {self.out / 'figures'} ({len(self.figures)} figures, {n_fig} files)\n"
                f"  tables:  {self.out / 'tables'} ({len(self.tables)} tables, {n_tab} files)\n"
                f"  manifest: {self.manifest}\n  total {self.timings.get('total', float('nan')):.1f} s")
