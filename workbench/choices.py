"""Every named choice in one place, as ``typing.Literal`` aliases with the tuple of allowed values.

Use the alias in signatures and the tuple in validation (a ``checks.Choice`` constraint), so that the two
never drift apart.
"""
from __future__ import annotations

from typing import Literal, get_args

__all__ = ["AuditMode", "Priority", "PolicyName", "Pooling", "H2ONormalise", "HeadQuantity", "RowKind", "ShiftLevel",
           "Device", "RowDtype", "SyntheticStructure", "ROW_DTYPES", "SYNTHETIC_STRUCTURES",
           "AUDIT_MODES", "PRIORITIES", "POLICY_NAMES", "HEAD_QUANTITIES", "ROW_KINDS", "SHIFT_LEVELS",
           "MethodName", "ReportData", "ExportFormat", "WidthPreset", "POOLINGS", "H2O_NORMALISES", "METHOD_NAMES",
           "REPORT_DATA", "EXPORT_FORMATS", "WIDTH_PRESETS", "PresetName", "PRESET_NAMES", "QueryMode", "QUERY_MODES",
           "ColourScale", "COLOUR_SCALES", "ContinueOn", "CONTINUE_ONS"]

AuditMode = Literal["sampled", "exact"]
"""SPEC §6: a sampled audit with its Hoeffding radius, or the exact finite population (``b = 0``)."""

Priority = Literal["renyi", "mass", "uniform", "random", "headmax"]
"""SPEC §3: Rényi priority, mass-only (``λ = 0``), chunk order, seeded random, per-head max."""

PolicyName = Literal["full", "streaming", "h2o", "snapkv", "deferkv", "page-entrokv", "random", "oracle", "tova",
                     "knorm", "keydiff", "criticalkv", "expected-attention", "pyramidkv", "adakv",
                     "entro-budget"]
"""SPEC §9: the eviction policies by name (``workbench.rerun.eviction.POLICY_BY_NAME``)."""

Pooling = Literal["max", "avg"]
"""SnapKV/DeferKV key-axis smoothing: max-pool (the workbench's default) or average-pool (kvpress, SnapKV's code)."""

H2ONormalise = Literal["sum", "mean"]
"""H2O's column score: the raw sum of attention (H2O paper), or the mean over the queries that see the key,
``Σ_u A_{u,j} / (T − j)`` ("mean observed attention", kvpress's ObservedAttentionPress)."""

HeadQuantity = Literal["w", "H", "sink", "z"]
"""What a head heatmap shows: weights ``w_h``, entropy ``H_h``, sink mass, residual mass ``z_h``."""

RowKind = Literal["observer", "audit", "tail", "decode", "custom"]
"""What a captured row is (SPEC §1)."""

ShiftLevel = Literal["group", "head"]
"""SPEC §9: shift metrics per KV group (probabilities averaged over its heads) or per query head."""

Device = Literal["auto", "cpu", "cuda"]

RowDtype = Literal["float32", "float16", "bfloat16"]
"""SPEC §1: storage dtype of captured rows (always computed in float32; half precision halves the bytes)."""

SyntheticStructure = Literal["random", "realistic"]
"""``Capture.synthetic``: Gaussian-logit rows, or rows with attention sinks, locality and retrieval heads."""

MethodName = Literal["full", "entroprefill", "evict"]
"""The report's sweep methods: full context, EntroPrefill pruning, KV eviction."""

ReportData = Literal["auto", "sample", "fetched"]
"""The report's data: the fetched SQuAD dev set and essays, the bundled samples, or fetched when cached."""

ExportFormat = Literal["pdf", "svg", "png"]
"""Figure file formats of ``show.export``."""

PresetName = Literal["paper", "loose", "strict"]
"""EntroPrefill's named settings (``analyse.params.PRESETS``)."""
ColourScale = Literal["linear", "log", "quantile"]
"""How a heatmap or token view maps values to colours: linearly, by ``log10``, or by rank (each colour an equal
share of the cells shown)."""
WidthPreset = Literal["single", "double"]
"""Paper column widths of ``show.export`` (3.33 in, 7.0 in)."""

AUDIT_MODES: tuple[str, ...] = get_args(AuditMode)
PRIORITIES: tuple[str, ...] = get_args(Priority)
POLICY_NAMES: tuple[str, ...] = get_args(PolicyName)
HEAD_QUANTITIES: tuple[str, ...] = get_args(HeadQuantity)
ROW_KINDS: tuple[str, ...] = get_args(RowKind)
SHIFT_LEVELS: tuple[str, ...] = get_args(ShiftLevel)
ROW_DTYPES: tuple[str, ...] = get_args(RowDtype)
SYNTHETIC_STRUCTURES: tuple[str, ...] = get_args(SyntheticStructure)
POOLINGS: tuple[str, ...] = get_args(Pooling)
H2O_NORMALISES: tuple[str, ...] = get_args(H2ONormalise)
METHOD_NAMES: tuple[str, ...] = get_args(MethodName)
QueryMode = Literal["aware", "agnostic"]
"""Whether an eviction sees the question before it compresses (``aware``: the whole prompt prefilled, then evicted)
or compresses the context alone and reads the question from the compressed cache (``agnostic``, kvpress's default)."""
QUERY_MODES: tuple[str, ...] = get_args(QueryMode)
REPORT_DATA: tuple[str, ...] = get_args(ReportData)
COLOUR_SCALES: tuple[str, ...] = get_args(ColourScale)
PRESET_NAMES: tuple[str, ...] = get_args(PresetName)
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)
WIDTH_PRESETS: tuple[str, ...] = get_args(WidthPreset)
ContinueOn = Literal["state", "copy"]
"""Where ``EvictionSession.continue_with`` decodes: into the state's own cache (the state moves on to the next turn) or
into a copy of it (the state stays as it was, for another continuation of the same eviction)."""
CONTINUE_ONS: tuple[str, ...] = get_args(ContinueOn)
