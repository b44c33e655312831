"""The verdict rule of "What this study shows" (:mod:`workbench.study.conclusions`), in one place: the kinds a claim
declares, the verdicts, the rule's text (:data:`RULE`: the report, ``benchmarks/study_tables.py`` and the README
print it; a test holds the README to it), :func:`verdict` that applies it, and :func:`plan`, how many clusters a
claim needs before it is run (``python -m workbench plan``)."""
from __future__ import annotations

import math

from workbench.analyse.stats import POWER, units_needed
from workbench.checks import Interval
from workbench.constraints import register_all

__all__ = ["KINDS", "VERDICTS", "DESCRIPTIVE", "DEFAULT_MARGIN", "RULE", "rule_text", "verdict", "plan"]

KINDS = ("superiority", "non-inferiority", "descriptive")
VERDICTS = ("supported", "non-inferior", "inconclusive", "inferior", "contradicted", "reference failed")
DESCRIPTIVE = "descriptive"  # the verdict column of a descriptive row: no verdict, not counted
# δ: a loss of one answer in ten on the 0/1 accuracy scale, chosen from the design, not the outcomes. The study's
# families hold 10-50 clusters, where the one-sided MDE (80 % power) is 0.05-0.4: a margin of 0.05 could be shown
# almost nowhere, while 0.10 is within reach of a 50-cluster family with little discordance.
DEFAULT_MARGIN = 0.10
_PLAN_CHECKS = register_all("plan", {"margin": Interval("real", 0.0, 1.0, closed="neither")}, __name__)
RULE = ("Verdict rule: each claim declares its kind. A **superiority** claim (A > B) is **supported** when the {pct}% "
        "bootstrap CI of the effect (the mean paired difference A − B) excludes 0 in the claimed direction and the "
        "two-sided paired test (McNemar exact on 0/1 units, else the exact sign test) rejects at {alpha}, "
        "**contradicted** when both show the opposite direction, **inconclusive** otherwise. A **non-inferiority** "
        "claim (A ≥ B − δ, margin δ = {margin}, fixed before the run) is **supported** when A is shown better as "
        "above, **non-inferior** when the one-sided {pct}% lower confidence bound of the effect exceeds −δ and the "
        "test of effect > −δ rejects at {alpha} (on 0/1 units Tango's score interval for paired proportions and its "
        "score test, exact unconditional up to 200 clusters; on cluster means that are not 0/1 the more "
        "conservative of that at the fractional counts and the Student t bound and test), **inferior** when the "
        "one-sided upper bound is below −δ and the test of effect < −δ rejects, **inconclusive** otherwise: all ties "
        "show δ = 0.1 only from 29 clusters on (a method losing on one in ten ties 28 in a row with probability "
        "0.9^28 > 0.05), and ties are never supported. A **descriptive** row (a quantity, or what holds "
        "by construction of a setting) has no verdict and is not counted. A claim on a task whose full-context "
        "reference fails the reference check reads **reference failed**. MDE: the smallest effect the row could "
        "detect at {power}% power for its n and observed discordance (two-sided α = {alpha}; one-sided for "
        "non-inferiority, where it is the smallest margin showable when A = B); an inconclusive row whose MDE "
        "exceeds the effect its source claims (δ for non-inferiority) is marked **underpowered**. n counts "
        "independent clusters (prompts sharing a fact or a haystack are one).")


def rule_text(level: float = 0.95, margin: float = DEFAULT_MARGIN) -> str:
    """:data:`RULE` at ``level`` and ``margin``."""
    return RULE.format(pct=int(round(level * 100)), alpha=f"{1 - level:.2g}", margin=f"{margin:g}",
                       power=int(round(POWER * 100)))


def plan(discordance: float, *, kind: str = "superiority", effect: float | None = None,
         margin: float = DEFAULT_MARGIN, level: float = 0.95) -> str:
    """How many independent clusters a claim needs before it is run, one sentence: a superiority claim of ``effect``
    (two-sided α = 1 − level), or a non-inferiority claim at ``margin`` (one-sided α, true difference 0), at 80 %
    power with the expected ``discordance`` (the share of clusters where the two settings disagree; the mean squared
    difference for other scores), by :func:`workbench.analyse.stats.units_needed`."""
    if kind not in KINDS[:2]:
        raise ValueError(f"kind: must be one of {KINDS[:2]} (a descriptive row needs no plan), got {kind!r}")
    margin = _PLAN_CHECKS["margin"].check("margin", margin)
    alpha = 1 - level
    if kind == "superiority":
        if effect is None:
            raise ValueError("effect: a superiority claim needs the effect it expects (> 0)")
        n = units_needed(effect, discordance, alpha, sided=2)
        what = f"an effect of {effect:g} (two-sided α = {alpha:.2g})"
    else:
        n = units_needed(margin, discordance, alpha, sided=1)
        what = f"non-inferiority at δ = {margin:g} when the two are equal (one-sided α = {alpha:.2g})"
    return (f"{n} independent clusters give {int(round(POWER * 100))}% power to show {what} at discordance "
            f"{discordance:g}.")


def _nan_any(*vs) -> bool:
    return any(v is None or (isinstance(v, float) and math.isnan(v)) for v in vs)


def verdict(kind: str, *, lo: float, hi: float, p: float, direction: int = 1, lo1: float = math.nan,
            hi1: float = math.nan, p_ni: float = math.nan, p_inf: float = math.nan, margin: float = DEFAULT_MARGIN,
            level: float = 0.95, reference_ok: bool = True) -> str:
    """The verdict of one claim (:data:`RULE`): ``kind`` of :data:`KINDS`; ``direction`` +1 (effect claimed > 0) or
    −1 (< 0); ``lo, hi, p`` the two-sided CI and test; ``lo1, hi1, p_ni, p_inf`` the non-inferiority test at
    ``margin`` (:class:`workbench.analyse.stats.NonInferiority`)."""
    if kind not in KINDS:
        raise ValueError(f"kind: must be one of {KINDS}, got {kind!r}")
    if kind == "descriptive":
        return DESCRIPTIVE
    if not reference_ok:
        return "reference failed"
    alpha = 1 - level
    side = 0
    if not _nan_any(lo, hi, p) and p < alpha:
        side = 1 if lo > 0 else -1 if hi < 0 else 0
    if side == direction:
        return "supported"
    if kind == "superiority":
        return "contradicted" if side == -direction else "inconclusive"
    if not _nan_any(lo1, p_ni) and lo1 > -margin and p_ni < alpha:
        return "non-inferior"
    if not _nan_any(hi1, p_inf) and hi1 < -margin and p_inf < alpha:
        return "inferior"
    return "inconclusive"
