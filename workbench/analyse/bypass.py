"""Why a trace bypassed (paper §5 steps 3–7, SPEC §6): which step refused every monitored layer, with the
numbers it refused on, as flat columns a sweep row can carry.

A bypass means no monitored layer was accepted. Each layer stops at one step (its ``status`` in
:meth:`TraceResult.to_frame`): invalid residual or document mass (**validity**), the saving target not reached
(**target**), the stability streak short of the required one (**streak**), no audit rows (**no_audit_rows**) or an
audit bound above ε_audit (**audit**). The prompt's refusing step is the furthest step any layer reached: a prompt
whose layers all stopped at validity is refused by validity, but one where a single layer got to the audit and
failed there is refused by the audit, because every earlier step had let that layer through.
"""
from __future__ import annotations

import math
from typing import Literal, get_args

from workbench.analyse.procedure import TraceResult

__all__ = ["BypassStep", "BYPASS_STEPS", "BYPASS_COLUMNS", "bypass_reason"]

BypassStep = Literal["", "no_candidates", "validity", "target", "streak", "no_audit_rows", "audit"]
BYPASS_STEPS: tuple[str, ...] = get_args(BypassStep)
"""The refusing steps in procedure order (``""``: not a bypass); a later step means a layer got further."""

# a layer's trace status -> the step that stopped it
_STEP_OF_STATUS = {"no_candidates": "no_candidates", "invalid": "validity", "below_target": "target",
                   "short_streak": "streak", "no_audit": "no_audit_rows", "audit_fail": "audit"}

BYPASS_COLUMNS = ("bypass_step", "bypass_layers", "bypass_invalid", "bypass_below_target", "bypass_short_streak",
                  "bypass_audit_fail", "audit_bound_min", "audit_b", "eps_audit", "streak_max", "streak_required")


def bypass_reason(trace: TraceResult) -> dict:
    """The refusal of ``trace`` as flat columns (:data:`BYPASS_COLUMNS`).

    ``bypass_step``: the step that refused (:data:`BYPASS_STEPS`; ``""`` when a layer was accepted);
    ``bypass_layers``: monitored layers traced; ``bypass_invalid`` / ``bypass_below_target`` /
    ``bypass_short_streak`` / ``bypass_audit_fail``: how many layers stopped at each step; ``audit_bound_min``: the
    smallest audit bound over the audited layers (each layer's bound is its largest over heads; NaN when none was
    audited), to read against ``eps_audit``; ``audit_b``: the sampling radius b of the audit (0 when exact);
    ``streak_max``: the longest stability streak reached, against ``streak_required``.
    """
    recs = trace.records
    statuses = [r["status"] for r in recs]
    bounds = [float(r["max_audit_bound"]) for r in recs if r["audited"]]
    params = trace.params
    step = ""
    if trace.bypass:
        reached = [_STEP_OF_STATUS[s] for s in statuses if s in _STEP_OF_STATUS]
        step = max(reached, key=BYPASS_STEPS.index) if reached else "no_candidates"
    return {"bypass_step": step, "bypass_layers": len(recs),
            "bypass_invalid": statuses.count("invalid"), "bypass_below_target": statuses.count("below_target"),
            "bypass_short_streak": statuses.count("short_streak"), "bypass_audit_fail": statuses.count("audit_fail"),
            "audit_bound_min": min(bounds) if bounds else math.nan, "audit_b": float(trace.b),
            "eps_audit": float(params.eps_audit) if params is not None else math.nan,
            "streak_max": max((int(r["streak"]) for r in recs), default=0),
            "streak_required": int(params.streak) if params is not None else -1}
