"""All parameters of one EntroPrefill run, fixed in advance (paper §5, step 1; SPEC §2–§6).

``EntroPrefillParams`` gathers the pooling (§2), priority (§3), selection (§5) and audit/layer
selection (§6) parameters in one frozen, validated object, so that a trace (``procedure.trace``) is a
pure function of a capture and these parameters. Every field is checked in ``__post_init__``; a bad
value raises ``ValueError`` naming the field and its allowed range.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["EntroPrefillParams", "PRESETS"]

from workbench.analyse.pooling import HeadPooling
from workbench.analyse.priorities import ChunkPriorities
from workbench.analyse.selection import GreedySelection, resolve_target
from workbench.checks import check_fields
from workbench.choices import AUDIT_MODES, PRIORITIES, AuditMode, Priority  # noqa: F401 (AUDIT_MODES, PRIORITIES re-exported)
from workbench.constraints import checked, shared


@checked()
@dataclass(frozen=True)
class EntroPrefillParams:
    """Every threshold of the procedure, fixed before any audit value is seen.

    Attributes (allowed range in brackets):
        zeta: group floor ζ of the head weights [(0, 1]] (SPEC §2).
        tau: temperature τ of the within-group softmax of −H_h [> 0] (SPEC §2).
        rho_min: validity threshold for residual and document mass [(0, 1)] (SPEC §2, §3).
        eps_s: smoothing ε_s of the chunk priorities [> 0] (SPEC §3).
        lam: concentration weight λ [>= 0] (SPEC §3).
        target: saving target as a fraction of ``N``, a float in (0, 1] (SPEC §5; default 0.3 when
            ``target_tokens`` is not given either). An int is refused: tokens go to ``target_tokens``.
        eps_row: per-row tolerance ε_a of the selection problem (14) [(0, 1]].
        m0: keep at least ``m0`` chunks [int >= 0; also <= k, checked at selection time].
        monitored: monitored layers ℒ [None = 1 … L−1, or a non-empty collection of distinct
            ints >= 1; stored sorted; ``<= L−1`` is checked by ``trace``] (SPEC §6).
        audit_mode: ``"sampled"`` (Hoeffding bound) or ``"exact"`` (finite population, b = 0).
        m_a: audit sample size for ``"sampled"`` [int >= 1].
        delta: total audit failure probability δ [(0, 1)].
        eps_audit: audit tolerance ε_audit [(0, 1]].
        d_max: candidate-stability threshold [[0, 1]].
        streak: required number of consecutive stable monitored layers [int >= 0].
        seed: seed of the audit sample and of the ``"random"`` priority [int >= 0].
        priority: ``"renyi"`` (S = ln ℓ + λκ), ``"mass"`` (λ = 0), ``"uniform"`` (chunk order),
            ``"random"`` (seeded), ``"headmax"`` (max_h a^h(c_i)).
        target_tokens: saving target in tokens [int >= 0], instead of ``target`` (exactly one of
            the two is set; ``replace`` with one of them clears the other).
    """

    zeta: float = 0.5
    tau: float = 1.0
    rho_min: float = 1e-6
    eps_s: float = 0.1
    lam: float = 0.5
    target: float | None = None
    eps_row: float = 0.05
    m0: int = 1
    monitored: tuple[int, ...] | None = None
    audit_mode: AuditMode = "exact"
    m_a: int = 32
    delta: float = 0.05
    eps_audit: float = 0.1
    d_max: float = 0.5
    streak: int = 1
    seed: int = 0
    priority: Priority = "renyi"
    target_tokens: int | None = None
    _parameter_constraints: ClassVar = shared("zeta", "tau", "rho_min", "eps_s", "lam", "target", "eps_row", "m0", "monitored",
                                     "audit_mode", "m_a", "delta", "eps_audit", "d_max", "streak", "seed", "priority",
                                     "target_tokens")

    def __post_init__(self):
        check_fields(self)  # every field against its declared constraint
        resolve_target(self, self.target, self.target_tokens)
        if self.monitored is not None:  # stored sorted, as ints
            object.__setattr__(self, "monitored", self.CHECKS["monitored"].check("monitored", self.monitored))

    # ----- derived objects -----
    def pooling(self):
        """The head pooling of SPEC §2 with these parameters (``HeadPooling``)."""

        return HeadPooling(zeta=float(self.zeta), tau=float(self.tau), rho_min=float(self.rho_min))

    def priorities(self):
        """The chunk priorities of SPEC §3 with these parameters (``ChunkPriorities``).

        For ``priority="mass"`` λ is 0; the other comparison priorities (uniform, random, headmax)
        are not ``ChunkPriorities`` and are chosen by ``procedure.trace``; this object still supplies
        the document-mass validity used by the procedure.
        """

        lam = 0.0 if self.priority == "mass" else float(self.lam)
        return ChunkPriorities(eps_s=float(self.eps_s), lam=lam, rho_min=float(self.rho_min))

    def selection(self):
        """The greedy proposer of SPEC §5 with these parameters (``GreedySelection``)."""

        return GreedySelection(target=self.target, eps_row=float(self.eps_row), m0=int(self.m0),
                               target_tokens=self.target_tokens)

    def monitored_layers(self, L: int) -> tuple[int, ...]:
        """The monitored set ℒ for a model of ``L`` layers (default ``1 … L−1``)."""
        if self.monitored is None:
            if L < 2:
                raise ValueError(f"monitored: the default 1 … L-1 is empty for L = {L}")
            return tuple(range(1, L))
        bad = [l for l in self.monitored if l > L - 1]
        if bad:
            raise ValueError(f"monitored: layers must be in [1, L-1] = [1, {L - 1}], got {bad}")
        return self.monitored

    @classmethod
    def preset(cls, name: str, **overrides) -> "EntroPrefillParams":
        """A named setting (:data:`PRESETS`: ``"paper"``, ``"loose"``, ``"strict"``), with ``overrides`` applied.

        Read each preset's ``consequence`` before reporting results under it: ``"loose"`` lets the audit
        accept almost any removal (``trace`` warns when it does not bind)."""
        if name not in PRESETS:
            raise ValueError(f"name: must be one of {sorted(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name]["params"], **overrides})

    def replace(self, **changes) -> "EntroPrefillParams":
        """A copy with ``changes`` applied (validated again); setting ``target`` clears
        ``target_tokens`` and vice versa."""
        if "target" in changes and "target_tokens" not in changes:
            changes["target_tokens"] = None
        elif "target_tokens" in changes and "target" not in changes:
            changes["target"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Named settings and what they do. Targets are fractions of the candidate tokens N (unit-safe).
PRESETS: dict[str, dict] = {
    "paper": {
        "params": {},
        "consequence": "The defaults (SPEC §2-§6): eps_row 0.05, target 0.3, exact audit at eps_audit 0.1, streak 1. "
                       "On SmolLM2 prompts of a few hundred tokens it often bypasses (full prefill): the audit binds.",
    },
    "loose": {
        "params": {"eps_row": 0.3, "target": 0.2, "streak": 0, "eps_audit": 0.5},
        "consequence": "Row tolerance 0.3, target 0.2, no stability streak, eps_audit 0.5 (the setting of "
                       "benchmarks/RESULTS.md's prune table). The audit tolerates half of a row's attention on the "
                       "removed chunks, so it accepts at the first monitored layer (l* = 1) on most prompts: the "
                       "audit does not bind and the certificate, not the audit, decides. trace() warns.",
    },
    "strict": {
        "params": {"eps_row": 0.02, "target": 0.3, "streak": 2, "eps_audit": 0.05},
        "consequence": "Row tolerance 0.02, two stable layers, eps_audit 0.05: fewer and later accepts; prunes only "
                       "when the removal is nearly invisible to every audit row, and bypasses more often.",
    },
}
