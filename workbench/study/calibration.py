"""Calibrate, then test: EntroPrefill's thresholds fixed on a calibration split of the study's items and
reported on the disjoint test split (paper §9: "A held-out calibration protocol must fix all thresholds before
the reported test evaluation").

- :func:`split_items`: the items split by independent unit (the item's ``cluster``, else the item itself, within
  its task), stratified by task: within each task its units are ranked by ``sha256(seed, unit)`` and the first
  ``ceil(fraction · n_task)`` go to calibration, but never all of a task's units (a task with one unit goes to test
  only), so every family keeps at least ``floor((1 − fraction) · n_task)`` of its units, and at least one, for the
  verdicts; seeded and deterministic, no unit on both sides; a :class:`Split` names both sides, the per-task
  counts, and hashes them. A split drawn over
  all units at once can put most of one family into calibration and leave its test side too small to pass the
  reference check.
- :func:`calibrate`: the rule :data:`RULE` over the calibration split's sweep rows, choosing one of the candidate
  EntroPrefill settings (the report's presets); the test split then runs the chosen setting only.

The rule is a selection, not an inference: it uses point estimates on the calibration split; the uncertainty of
the chosen setting is what the test split's paired comparisons report.
"""
from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

import workbench.study.findings as fnd
from workbench.checks import SEED, Interval, check_args, check_nonempty
from workbench.constraints import register_all
from workbench.study.tasks import TaskItem

__all__ = ["Split", "Calibration", "CalibrationWarning", "split_items", "split_units", "calibrate", "calibration_counts", "unit_of",
           "RULE", "DEFAULT_FRACTION"]

DEFAULT_FRACTION = 0.3
RULE = ("Calibration rule: on the calibration split only, each candidate EntroPrefill setting gets its mean paired "
        "difference in contains-accuracy against full context (per independent cluster, then averaged) and its mean "
        "removed share of the prompt; the chosen setting is the one that removes the most among those whose "
        "difference is >= -δ (ties: the first candidate). When none is within δ, the one closest to full context "
        "is chosen and flagged (rule_met false). The test split then runs the chosen setting only, and every "
        "verdict is computed on the test split.")

_SPLIT_CHECKS = register_all("calibration", {
    "fraction": Interval("real", 0.0, 1.0, closed="neither", note="share of each task's clusters that calibrate"),
    "seed": SEED}, __name__)
_CAL_CHECKS = register_all("calibration", {"margin": Interval("real", 0.0, 1.0, closed="left")}, __name__)


class CalibrationWarning(UserWarning):
    """No candidate stayed within the margin on the calibration split."""


def unit_of(item: TaskItem) -> str:
    """An item's independent unit, ``task/cluster`` (the item id without a cluster): the unit the findings pair
    over (:func:`workbench.study.findings.clusters`), so a split never cuts a cluster in two."""
    c = item.meta.get("cluster")
    return f"{item.task}/{c if isinstance(c, str) and c else item.item_id}"


@dataclass(frozen=True)
class Split:
    """The calibration and test units (``task/cluster``, sorted), the fraction and seed that drew them, and
    ``per_task``: ``(task, calibration units, test units)`` for each task, sorted by task (the split is stratified:
    each task's calibration count is ``min(ceil(fraction · n_task), n_task − 1)``)."""

    calibration: tuple[str, ...]
    test: tuple[str, ...]
    fraction: float
    seed: int
    per_task: tuple[tuple[str, int, int], ...] = ()

    def digest(self) -> str:
        """sha256 (first 16 hex digits) of both sides: two reports with the same digest split alike."""
        blob = json.dumps({"calibration": list(self.calibration), "test": list(self.test)}).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_frame(self) -> pd.DataFrame:
        """One row per unit: ``unit, split`` (``"calibration"`` or ``"test"``)."""
        return pd.DataFrame([{"unit": u, "split": "calibration"} for u in self.calibration]
                            + [{"unit": u, "split": "test"} for u in self.test], columns=["unit", "split"])


def split_items(items: Sequence[TaskItem], fraction: float = DEFAULT_FRACTION,
                seed: int = 0) -> tuple[list[TaskItem], list[TaskItem], Split]:
    """``(calibration items, test items, split)``, stratified by task: within each task, its units ranked by
    ``sha256(seed, unit)``, the first ``min(ceil(fraction · n_task), n_task − 1)`` go to calibration
    (:func:`calibration_counts`), the rest to test (item order kept on each side). The draw depends only on the
    units and the seed, not on the items' order. Refused when the calibration side would be empty (no task has two
    units); the test side always keeps at least one unit of every task.

    Args:
        items: the study's items (some task with at least two independent units).
        fraction: share of each task's units drawn for calibration [in (0, 1)].
        seed: the draw's seed [int >= 0].
    """
    check_args(_SPLIT_CHECKS, locals())
    items = check_nonempty("items", items)
    split = split_units([unit_of(it) for it in items], fraction, seed)
    cal = set(split.calibration)
    return ([it for it in items if unit_of(it) in cal], [it for it in items if unit_of(it) not in cal], split)


def split_units(units: Iterable[str], fraction: float = DEFAULT_FRACTION, seed: int = 0) -> Split:
    """The :class:`Split` of independent units ``task/cluster`` (:func:`unit_of`) that :func:`split_items` draws:
    per task, ranked by ``sha256(seed, unit)``, the first :func:`calibration_counts` to calibration.

    Args:
        units: the units, ``task/cluster`` (repeats count once).
        fraction: share of each task's units drawn for calibration [in (0, 1)].
        seed: the draw's seed [int >= 0].
    """
    check_args(_SPLIT_CHECKS, {"fraction": fraction, "seed": seed})
    by_task: dict[str, list[str]] = {}
    for u in sorted(set(units)):
        by_task.setdefault(u.split("/", 1)[0], []).append(u)
    counts = calibration_counts({t: len(us) for t, us in by_task.items()}, fraction, "items")
    cal: set[str] = set()
    for task, us in by_task.items():
        rank = sorted(us, key=lambda u: hashlib.sha256(f"{seed}\0{u}".encode()).hexdigest())
        cal.update(rank[:counts[task]])
    every = sorted(u for us in by_task.values() for u in us)
    return Split(calibration=tuple(sorted(cal)), test=tuple(u for u in every if u not in cal), fraction=float(fraction),
                 seed=int(seed), per_task=tuple((t, counts[t], len(by_task[t]) - counts[t]) for t in sorted(by_task)))


def calibration_counts(units_per_task: Mapping[str, int], fraction: float, name: str = "fraction") -> dict[str, int]:
    """Per task, its calibration units: ``min(ceil(fraction · n), n − 1)`` of its ``n`` (never all of a task's
    units, so the test side keeps every task); refused, naming ``name``, when no task gives calibration a unit
    (every task has at most one)."""
    counts = {t: max(0, min(math.ceil(fraction * n - 1e-12), n - 1)) for t, n in units_per_task.items()}
    if not sum(counts.values()):
        raise ValueError(f"{name}: a calibration split needs at least 2 independent units (clusters) in some task "
                         f"(it is drawn per task and a task's only unit stays in the test split), got "
                         f"{dict(units_per_task)}; add items or run without calibration")
    return counts


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` chose: ``chosen`` (the candidate's name), ``params`` (its EntroPrefill parameters),
    ``rule_met`` (it is within the margin), ``margin``, ``table`` (one row per candidate: ``candidate, n, prompts,
    reference, diff, removed_share, bypass_rate, within_margin, chosen``; ``reference``: full context's accuracy on
    the same clusters, since a difference of 0 against a reference that is always wrong says little) and ``note``
    (one line)."""

    chosen: str
    params: dict
    rule_met: bool
    margin: float
    table: pd.DataFrame = field(compare=False)
    note: str = ""

    def to_dict(self) -> dict:
        return {"chosen": self.chosen, "params": dict(self.params), "rule_met": self.rule_met, "margin": self.margin,
                "rule": RULE, "note": self.note}


def _candidate_row(name: str, params: dict, d: pd.DataFrame, ref: pd.DataFrame, metric: str) -> dict:
    rows = d[(d["method"] == "entroprefill") & (d["params"].map(lambda s: _params_of(s) == params))]
    pair = rows.merge(ref, on=["task", "item_id"], suffixes=("", "_ref"))
    pair = pair.assign(diff=pd.to_numeric(pair[metric], errors="coerce")
                       - pd.to_numeric(pair[f"{metric}_ref"], errors="coerce"),
                       removed=1.0 - pd.to_numeric(pair["retained_tokens"], errors="coerce")
                       / pd.to_numeric(pair["prompt_tokens"], errors="coerce"),
                       bypassed=pair["bypass"].astype(float) if "bypass" in pair.columns else math.nan)
    pair = pair.dropna(subset=["diff", "removed"])
    if not len(pair):
        return {"candidate": name, "n": 0, "prompts": 0, "reference": math.nan, "diff": math.nan,
                "removed_share": math.nan, "bypass_rate": math.nan}
    pair = pair.assign(ref=pd.to_numeric(pair[f"{metric}_ref"], errors="coerce"))
    per = pair.assign(unit=pair["task"].astype(str) + "/" + fnd.clusters(pair)).groupby("unit")
    return {"candidate": name, "n": int(per.ngroups), "prompts": len(pair), "reference": float(per["ref"].mean().mean()),
            "diff": float(per["diff"].mean().mean()), "removed_share": float(per["removed"].mean().mean()),
            "bypass_rate": float(per["bypassed"].mean().mean())}


def _params_of(s) -> dict:
    return fnd.row_params({"params": s})


def calibrate(df: pd.DataFrame, candidates: Sequence[tuple[str, dict]], margin: float,
              metric: str = "contains") -> Calibration:
    """The setting :data:`RULE` chooses among ``candidates`` (``(name, EntroPrefill parameters)``, in order of
    preference on ties) from ``df``, the sweep rows of the calibration split (``full`` and ``entroprefill`` cells;
    failed cells are left out). A candidate without a paired row cannot be chosen; none with one is refused.

    Args:
        margin: the non-inferiority margin δ the test verdicts use [in [0, 1)].
    """
    check_args(_CAL_CHECKS, {"margin": margin})
    candidates = check_nonempty("candidates", candidates)
    d = fnd.with_settings(df)
    ref = d[d["method"] == fnd.REFERENCE][["task", "item_id", metric]].drop_duplicates(["task", "item_id"])
    table = pd.DataFrame([_candidate_row(name, dict(p), d, ref, metric) for name, p in candidates])
    scored = table[table["n"] > 0]
    if not len(scored):
        raise ValueError(f"df: no candidate ({', '.join(n for n, _ in candidates)}) has a paired full-context row on "
                         "the calibration split (did its cells fail?), so nothing can be calibrated")
    table["within_margin"] = (table["n"] > 0) & (table["diff"] >= -margin - 1e-12)
    ok = table[table["within_margin"]]
    if len(ok):  # idxmax keeps the first of equal maxima: the candidate order breaks ties
        pick, rule_met = int(ok["removed_share"].idxmax()), True
        note = (f"{table.at[pick, 'candidate']} chosen: removed share {table.at[pick, 'removed_share']:.3f}, "
                f"difference {table.at[pick, 'diff']:+.3f} >= -δ = {-margin:.3f} on {table.at[pick, 'n']} "
                f"calibration clusters (full context right on {table.at[pick, 'reference']:.0%} of them)")
        if table.at[pick, "removed_share"] <= 0:
            note += "; it removes nothing on the calibration split (every prompt bypassed)"
    else:
        pick, rule_met = int(scored["diff"].idxmax()), False
        note = (f"no candidate stayed within δ = {margin:.3f} on the calibration split; {table.at[pick, 'candidate']} "
                f"(difference {table.at[pick, 'diff']:+.3f}), the closest to full context, is tested instead, flagged")
        warnings.warn(note, CalibrationWarning, stacklevel=2)
    table["chosen"] = table.index == pick
    name = str(table.at[pick, "candidate"])
    return Calibration(chosen=name, params=dict(dict(candidates)[name]), rule_met=rule_met, margin=float(margin),
                       table=table, note=note)
