"""The report's calibration stage (``ReportConfig.calibrate``): split the items, run the EntroPrefill candidates
and full context on the calibration split, choose one setting (:func:`workbench.study.calibration.calibrate`), and
hand back the test split with the settings that run it."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from workbench.study.calibration import RULE, calibrate, calibration_counts, split_items, unit_of
from workbench.study.report_config import ReportConfig

__all__ = ["calibration_stage", "check_split"]


def calibration_stage(cfg: ReportConfig, items: list, run_sweep: Callable) -> tuple[list, ReportConfig, dict, dict,
                                                                                    dict]:
    """``(test items, the test run's settings, tables, notes, info)`` for ``cfg.calibrate``.

    ``run_sweep(settings, items) -> (rows, partial)`` runs a sweep (the report's resumable one). An interrupted
    calibration sweep is raised as ``KeyboardInterrupt``: no setting can be chosen from part of the calibration
    split; its finished cells stay saved and the same command resumes them. The test run's settings are ``cfg``
    with the chosen preset as its only one."""
    cal_items, test_items, split = split_items(items, cfg.calibrate, cfg.seed)
    cands = cfg.calibration_candidates()
    cal_cfg = dataclasses.replace(cfg, methods=("full", "entroprefill"), presets=tuple(n for n, _ in cands))
    df, partial = run_sweep(cal_cfg, cal_items)
    if partial:
        raise KeyboardInterrupt("the calibration sweep was interrupted before every cell finished")
    cal = calibrate(df, cands, cfg.margin)
    info = {"split": {"fraction": split.fraction, "seed": split.seed, "digest": split.digest(),
                      "calibration": list(split.calibration), "test": list(split.test),
                      "calibration_prompts": len(cal_items), "test_prompts": len(test_items), "rule": "stratified by task",
                      "per_task": {t: {"calibration": c, "test": k} for t, c, k in split.per_task}},
            **cal.to_dict()}
    tables = {"calibration": cal.table, "calibration_split": split.to_frame(),
              "calibration_sweep": df.drop(columns=["generated_ids"], errors="ignore")}
    notes = {"calibration": (
        f"Calibrate, then test (paper §9). Split (stratified by task, fraction {split.fraction:g}, seed "
        f"{split.seed}, sha256 {split.digest()}; per task calibration/test: "
        f"{', '.join(f'{t} {c}/{k}' for t, c, k in split.per_task)}): calibration {len(split.calibration)} clusters ({len(cal_items)} prompts), test "
        f"{len(split.test)} clusters ({len(test_items)} prompts), disjoint; every unit is listed in the table "
        f"calibration_split. Candidates: {', '.join(n for n, _ in cands)}. {RULE} δ = {cfg.margin:g}. Result: "
        f"{cal.note}. Calibrated values: preset {cal.chosen} "
        f"({', '.join(f'{k}={v}' for k, v in sorted(cal.params.items())) or 'the defaults'}). Every table below "
        "except calibration, calibration_split and calibration_sweep is on the test split only."),
        "calibration_split": "The independent units (task/cluster) of each split.",
        "calibration_sweep": "The calibration split's cells (full context and every candidate; resumable store: "
                             "calibration_cells.parquet); not used by any "
                             "verdict."}
    run_cfg = dataclasses.replace(cfg, presets=(cal.chosen,))
    return test_items, run_cfg, tables, notes, info


def check_split(cfg: ReportConfig, user_items: list | None) -> None:
    """Refuse, before any model work, a ``cfg.calibrate`` that would leave the calibration split empty (the split is
    per task: a task with one unit stays in test): the built-in families count by :meth:`ReportConfig.builtin_units`,
    the user's items by cluster within their task."""
    if cfg.calibrate is None or user_items is None:  # without items ReportConfig has checked it
        return
    n = dict(cfg.builtin_units())
    for task, units in _units_by_task(user_items).items():
        n[task] = n.get(task, 0) + units
    calibration_counts(n, cfg.calibrate, "calibrate")


def _units_by_task(items: list) -> dict[str, int]:
    out: dict[str, int] = {}
    for u in {unit_of(it) for it in items}:
        task = u.split("/", 1)[0]
        out[task] = out.get(task, 0) + 1
    return out
