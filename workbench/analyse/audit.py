"""The independent audit bound (SPEC §6).

``audit_bounds``: per-head bound on the expected discarded mass ``η_{l,h} = E_{u~ν} A^{l,h}_u(E_l)`` under
the audit distribution ``ν`` (uniform over the capture's audit rows): either Hoeffding on an i.i.d. sample
of ``m_a`` rows drawn with a seed fixed in advance (``b = sqrt(ln(J H_Q/δ)/(2 m_a))``, bound
``min{1, η̂ + b}``), or exact over the finite population (``b = 0``). The 7-step procedure that calls it
(candidate drift, the streak, the decision) is :mod:`workbench.analyse.procedure`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float

from workbench.analyse.rows import check_rows
from workbench.checks import Interval, check_args, check_fields, optional
from workbench.choices import AuditMode
from workbench.constraints import PARAMS, checked, register_all
from workbench.shapes import shaped

NO_LAYER_CAN_PASS = "no layer can pass"

AUDIT_CHECKS = register_all("audit", {"m_a": PARAMS["m_a"], "J": Interval("int", 1), "H_Q": Interval("int", 1),
                                 "delta": PARAMS["delta"]}, __name__)
"""The arguments of :func:`hoeffding_b` (``J``: monitored layers, ``H_Q``: query heads)."""


def hoeffding_b(m_a: int, delta: float, J: int, H_Q: int) -> float:
    """Hoeffding radius ``b = sqrt(ln(J H_Q / δ) / (2 m_a))`` (paper eq. after (17))."""
    check_args(AUDIT_CHECKS, locals())
    return math.sqrt(math.log(J * H_Q / delta) / (2.0 * m_a))


@checked("audit")
@dataclass(frozen=True)
class AuditConfig:
    """How to audit (SPEC §6): the configuration :func:`audit_bounds` and :func:`audit_from_rows` share.

    Every field is checked against its declared constraint in either mode, as
    :class:`~workbench.analyse.params.EntroPrefillParams` checks them: an out-of-range value is refused even
    where this mode does not read it (accepting it would be a silent no-op).

    Attributes:
        mode: ``"sampled"`` (i.i.d. sample of ``m_a`` rows, seed ``seed``; Hoeffding radius ``b``) or
            ``"exact"`` (mean over all ``n_pop`` rows, ``b = 0``; ``m_a`` and ``seed`` not read).
        m_a: sample size (sampled mode), int ``>= 1``.
        delta: total failure probability ``δ`` in (0, 1); each head fails with prob ``<= δ/(J H_Q)``.
        J: number of monitored layers ``|ℒ|``, int ``>= 1``.
        seed: sampling seed, fixed in advance (the same sample at every layer).
        eps_audit: optional tolerance in (0, 1]; if given, per-head pass iff ``bound <= eps_audit``.
    """

    mode: AuditMode = "exact"
    m_a: int = 32
    delta: float = 0.05
    J: int = 1
    seed: int = 0
    eps_audit: float | None = None
    _parameter_constraints: ClassVar = {"mode": PARAMS["audit_mode"], "m_a": AUDIT_CHECKS["m_a"],
                                        "delta": AUDIT_CHECKS["delta"], "J": AUDIT_CHECKS["J"], "seed": PARAMS["seed"],
                                        "eps_audit": optional(PARAMS["eps_audit"])}

    def __post_init__(self):
        check_fields(self)


@dataclass
class AuditResult:
    """Audit of one candidate ``E_l`` at one layer (SPEC §6).

    Attributes:
        mode: ``"sampled"`` or ``"exact"``.
        eta: float64 ``[H_Q]``: ``η̂_{l,h}`` (sampled) or the exact ``η_{l,h}``.
        b: Hoeffding radius (``0`` in exact mode).
        bound: float64 ``[H_Q]``, ``min{1, eta + b}``.
        eta_rows: float64 ``[H_Q, n_pop]`` removed mass ``A^{l,h}_u(E)`` of every population row.
        sample: int64 ``[m_a]`` sampled row indices into the population (None in exact mode).
        m_a, delta, J: audit configuration (``m_a`` is the population size in exact mode).
        eps_audit: tolerance (None if not given); passed_head: bool ``[H_Q]`` (``bound <= eps_audit``);
            passed: every head passes (None if no tolerance given).
        message: plain-language summary (says when ``b > eps_audit``: no layer can pass).
    """

    mode: AuditMode
    eta: torch.Tensor
    b: float
    bound: torch.Tensor
    eta_rows: torch.Tensor
    sample: torch.Tensor | None
    m_a: int
    delta: float
    J: int
    eps_audit: float | None = None
    passed_head: torch.Tensor | None = None
    passed: bool | None = None
    message: str = ""

    @property
    def max_bound(self) -> float:
        return float(self.bound.max()) if self.bound.numel() else 0.0

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``head, eta, b, bound, passed``."""
        H_Q = int(self.eta.shape[0])
        return pd.DataFrame(
            {
                "head": np.arange(H_Q),
                "eta": self.eta.numpy(),
                "b": np.full(H_Q, self.b),
                "bound": self.bound.numpy(),
                "passed": (self.passed_head.numpy() if self.passed_head is not None else np.full(H_Q, None)),
            }
        )


def audit_sample(n_pop: int, m_a: int, seed: int) -> torch.Tensor:
    """``m_a`` i.i.d. uniform draws from ``{0 … n_pop−1}`` with a fixed seed; int64 ``[m_a]``."""
    g = torch.Generator().manual_seed(int(seed))
    return torch.randint(0, n_pop, (int(m_a),), generator=g)


@shaped
def audit_bounds(A_audit: Float[torch.Tensor, "H_Q n_pop T"], removed: Bool[torch.Tensor, " T"],
                 config: AuditConfig = AuditConfig()) -> AuditResult:
    """Per-head audit bound of the discarded mass of ``removed`` (SPEC §6).

    Args:
        A_audit: float ``[H_Q, n_pop, T]`` audit population rows over the prompt keys; ``ν`` is uniform
            over the ``n_pop`` rows.
        removed: bool ``[T]`` token mask of ``E_l``.
        config: the audit's mode, sample size, ``δ``, ``J``, seed and tolerance (:class:`AuditConfig`).

    Returns:
        ``AuditResult``.
    """
    if A_audit.dim() != 3:
        raise ValueError(f"A_audit: must have shape [H_Q, n_pop, T], got {tuple(A_audit.shape)}")
    H_Q, n_pop, T = A_audit.shape
    check_rows(A_audit, "A_audit")
    if n_pop < 1:
        raise ValueError("A_audit: the audit population is empty (n_pop = 0)")
    removed = torch.as_tensor(removed, dtype=torch.bool)
    if removed.shape != (T,):
        raise ValueError(f"removed: must be a bool mask of shape [T] = [{T}], got {tuple(removed.shape)}")
    eta_rows = (A_audit.to(torch.float64) * removed.to(torch.float64)).sum(-1)  # [H_Q, n_pop]
    return audit_from_rows(eta_rows, config)


def audit_from_rows(eta_rows: torch.Tensor, config: AuditConfig = AuditConfig()) -> AuditResult:
    """:func:`audit_bounds` from the discarded mass of every audit row, ``eta_rows [H_Q, n_pop]`` float64
    (``A^{l,h}_{U}(E)`` for each row ``U`` of the population)."""
    if not isinstance(config, AuditConfig):
        raise ValueError(f"config: must be an AuditConfig, got {type(config).__name__}")
    mode, m_a, delta, J, seed, eps_audit = (config.mode, config.m_a, config.delta, config.J, config.seed,
                                            config.eps_audit)
    H_Q, n_pop = eta_rows.shape
    if mode == "exact":
        eta = eta_rows.mean(-1)
        b = 0.0
        sample = None
        m_used = n_pop
    else:
        sample = audit_sample(n_pop, m_a, seed)
        eta = eta_rows[:, sample].mean(-1)
        b = hoeffding_b(int(m_a), float(delta), int(J), int(H_Q))
        m_used = int(m_a)
    bound = torch.clamp(eta + b, max=1.0)
    passed_head = passed = None
    msg = f"{mode} audit: max bound {float(bound.max()):.4g} (b = {b:.4g})"
    if eps_audit is not None:
        passed_head = bound <= eps_audit
        passed = bool(passed_head.all())
        msg += f", eps_audit = {eps_audit:.4g}: " + ("every head passes" if passed else
                                                        f"{int((~passed_head).sum())} of {H_Q} heads fail")
        if b > eps_audit and eps_audit < 1.0:
            msg += f"; b = {b:.4g} > eps_audit: {NO_LAYER_CAN_PASS}"
    return AuditResult(
        mode=mode, eta=eta, b=b, bound=bound, eta_rows=eta_rows, sample=sample, m_a=m_used, delta=float(delta),
        J=int(J), eps_audit=eps_audit, passed_head=passed_head, passed=passed, message=msg,
    )
