"""Every bypassed EntroPrefill prompt of a sweep with the step that refused it and that step's numbers (the
columns :func:`workbench.analyse.bypass.bypass_reason` adds to each ``entroprefill`` row)."""
from __future__ import annotations

import pandas as pd

import workbench.study.findings as fnd
from workbench.analyse.bypass import BYPASS_COLUMNS, BYPASS_STEPS
from workbench.study.conclusions import preset_name

__all__ = ["bypass_table", "bypass_note", "COLUMNS"]

COLUMNS = ("task", "item_id", "setting", *BYPASS_COLUMNS)


def bypass_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per bypassed ``entroprefill`` cell of ``df`` (failed cells left out): :data:`COLUMNS`, ``setting``
    being the preset's name. A bypassed row without the reason columns (a sweep written before they existed) keeps
    NaN there and ``bypass_step`` ``"unknown"``, never a guessed step."""
    d = fnd.with_settings(df)
    if not len(d) or "bypass" not in d.columns:
        return pd.DataFrame(columns=list(COLUMNS))
    e = d[(d["method"] == "entroprefill") & (d["bypass"].map(lambda b: b is True or b == 1))].copy()
    e["setting"] = [preset_name(fnd.row_params(r)) for _, r in e.iterrows()]
    for c in BYPASS_COLUMNS:
        if c not in e.columns:
            e[c] = pd.NA
    e["bypass_step"] = e["bypass_step"].map(lambda s: s if isinstance(s, str) and s in BYPASS_STEPS and s else
                                            "unknown")
    return e[list(COLUMNS)].reset_index(drop=True)


def bypass_note(table: pd.DataFrame) -> str:
    """One line: the bypasses per setting and refusing step, and how to read the numbers."""
    if not len(table):
        return "No EntroPrefill prompt bypassed (or the sweep has no entroprefill cells)."
    counts = table.groupby(["setting", "bypass_step"]).size()
    per = "; ".join(f"{s}: {n} by {step}" for (s, step), n in counts.items())
    return (f"Bypassed prompts and the step that refused each ({per}). The refusing step is the furthest one any "
            "monitored layer reached: validity (residual or document mass), target (the saving target), streak "
            "(streak_max against streak_required), no_audit_rows, or audit (audit_bound_min, the smallest audit bound "
            "over the audited layers, against eps_audit; audit_b is the sampling radius, 0 when exact). The "
            "bypass_* counts say at which step each monitored layer stopped.")
