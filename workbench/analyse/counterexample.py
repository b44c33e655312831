"""Why a shallow certificate is insufficient (paper §6.1): the counterexample, built by hand.

A tiny two-layer attention network in plain torch (float64, weights set explicitly) and two prompts A and
B that differ only in one signed value coordinate at position ``j*``:

- residual stream ``x_j = [c_j, m_j, e_j, 1]``: a signed value coordinate ``c`` (``±V`` at ``j*``, else 0),
  a marker coordinate ``m`` (1 at ``j*``), a position one-hot ``e`` (``T`` entries) and a constant;
- **shallow layer**: its query reads the constant and its key the position (never ``c``), so the last query
  puts mass exactly ``ε`` on ``j*``; its output projection and MLP are zero (the shallow prefix is the
  identity);
- **deep layer**: its key reads the marker coordinate and gives the last query mass ``1 − γ`` on ``j*``; its
  value reads only ``c``;
- **readout**: two logits ``z = (o, −o + β)`` of the first token, ``o`` the deep head's output.

Removing ``E = {j*}`` after the shallow layer, the reduced deep layer sees the same inputs for A and B, so
its outputs agree while the full outputs are ``±(1 − γ)V``: the deletion error is ``≥ (1 − γ)V`` for one of
the prompts whatever ``ε`` (the shallow audit passes once ``ε ≤ ε_audit``). Notebook 10 shows it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import pandas as pd
import torch
from torch import Tensor

from workbench.analyse.audit import AuditConfig, AuditResult, audit_bounds
from workbench.checks import Interval, check_fields
from workbench.constraints import checked, shared

__all__ = ["ShallowCounterexample", "CounterexampleResult", "deletion_sweep", "PROMPTS", "RUNS"]

F64 = torch.float64
PROMPTS = ("A", "B")           # c_{j*} = +V and −V
RUNS = ("full", "reduced")     # every position, or E = {j*} removed after the shallow layer
PROMPT_LABEL = {"A": "A (c = +V)", "B": "B (c = −V)"}


@checked("counterexample")
@dataclass(frozen=True)
class ShallowCounterexample:
    """The construction of paper §6.1 for one ``(ε, γ)``.

    Attributes:
        eps: the shallow layer's attention mass of the last query on ``j*``, in ``(0, 1)``.
        gamma: the deep head's mass off ``j*`` (it reads ``j*`` with ``1 − γ``), in ``(0, 1)``.
        V: the signed value ``|c_{j*}|``, ``> 0``.
        beta: the readout's offset ``β`` of the second logit, ``> 0``.
        eps_audit: the shallow audit's tolerance (SPEC §6, exact mode, one head, the last query row).
    """

    eps: float = 1e-3
    gamma: float = 0.05
    V: float = 2.0
    beta: float = 0.1
    eps_audit: float = 0.01

    T: ClassVar[int] = 8          # prompt length
    j_star: ClassVar[int] = 3     # the removed position
    D: ClassVar[int] = 2 + 8 + 1  # [c, m, position one-hot (T), 1]
    C: ClassVar[int] = 0
    M: ClassVar[int] = 1
    ONE: ClassVar[int] = 2 + 8
    _parameter_constraints: ClassVar = {"eps": Interval("real", 0.0, 1.0, closed="neither"),
                                        "gamma": Interval("real", 0.0, 1.0, closed="neither"),
                                        "V": Interval("real", 0.0, None, closed="right"),
                                        "beta": Interval("real", 0.0, None, closed="right"), **shared("eps_audit")}

    def __post_init__(self):
        check_fields(self)

    # ----- the prompts -----
    def prompt(self, name: str) -> Tensor:
        """The residual stream of prompt ``"A"`` (``c_{j*} = +V``) or ``"B"`` (``−V``): float64 ``[T, D]``."""
        if name not in PROMPTS:
            raise ValueError(f"name: must be one of {list(PROMPTS)}, got {name!r}")
        T, j = self.T, self.j_star
        x = torch.zeros(T, self.D, dtype=F64)
        x[:, 2:2 + T] = torch.eye(T, dtype=F64)
        x[:, self.ONE] = 1.0
        x[j, self.M] = 1.0
        x[j, self.C] = self.V if name == "A" else -self.V
        return x

    @property
    def removed(self) -> Tensor:
        """bool ``[T]``: the removal ``E = {j*}``."""
        E = torch.zeros(self.T, dtype=torch.bool)
        E[self.j_star] = True
        return E

    @property
    def retained(self) -> Tensor:
        """int64: the retained positions ``R`` (every position but ``j*``)."""
        return (~self.removed).nonzero().flatten()

    # ----- the network -----
    def weights(self) -> dict[str, Tensor]:
        """The query/key/value maps ``W_Q1, W_K1`` (shallow) and ``W_Q2, W_K2, W_V2`` (deep), float64 ``[D, 1]``:
        the scores ``s1 = ln(ε(T−1)/(1−ε))`` and ``s2 = ln((1−γ)(T−1)/γ)`` on ``j*`` give masses ``ε`` and ``1 − γ``."""
        n_other = self.T - 1
        s1 = math.log(self.eps * n_other / (1 - self.eps))
        s2 = math.log((1 - self.gamma) * n_other / self.gamma)
        w = {k: torch.zeros(self.D, 1, dtype=F64) for k in ("WQ1", "WK1", "WQ2", "WK2", "WV2")}
        w["WQ1"][self.ONE, 0] = s1
        w["WK1"][2 + self.j_star, 0] = 1.0   # reads the position, not c
        w["WQ2"][self.ONE, 0] = s2
        w["WK2"][self.M, 0] = 1.0            # the separate marker coordinate
        w["WV2"][self.C, 0] = 1.0            # reads only the signed value
        return w

    @staticmethod
    def _row(q: Tensor, k: Tensor) -> Tensor:
        """The softmax attention row of the last query over every given key."""
        return torch.softmax(q[-1] @ k.T, dim=-1)

    def shallow_row(self, x: Tensor, w: dict | None = None) -> Tensor:
        """The shallow layer's attention row of the last query over the ``T`` keys: float64 ``[T]``."""
        w = self.weights() if w is None else w
        return self._row(x @ w["WQ1"], x @ w["WK1"])

    def forward(self, x: Tensor, keep: Tensor | None = None, w: dict | None = None) -> tuple[Tensor, Tensor]:
        """The first token's logits ``(o, −o + β)`` (float64 ``[2]``) and the deep head's attention row of the
        last query over the retained keys; ``keep``: the positions kept after the shallow layer (None: all)."""
        w = self.weights() if w is None else w
        x1 = x  # the shallow layer: attention computed, then O_1 = 0 and MLP = 0, so X^1 = X^0
        xr = x1 if keep is None else x1[keep]
        a2 = self._row(xr @ w["WQ2"], xr @ w["WK2"])
        o = a2 @ (xr @ w["WV2"])[:, 0]
        return torch.stack([o, -o + self.beta]), a2

    def __call__(self) -> CounterexampleResult:
        """Both prompts, full and reduced: rows, logits, deletion errors and the shallow audit."""
        w = self.weights()
        x = {p: self.prompt(p) for p in PROMPTS}
        R = self.retained
        logits, deep = {}, None
        for p in PROMPTS:
            for run in RUNS:
                z, a2 = self.forward(x[p], None if run == "full" else R, w)
                logits[p, run] = z
                if (p, run) == ("A", "full"):
                    deep = a2
        shallow = self.shallow_row(x["A"], w)
        audit = audit_bounds(shallow[None, None, :], self.removed, AuditConfig("exact", eps_audit=self.eps_audit))
        errors = tuple(abs(float(logits[p, "full"][0] - logits[p, "reduced"][0])) for p in PROMPTS)
        return CounterexampleResult(
            construction=self, shallow=shallow, shallow_b=self.shallow_row(x["B"], w), deep=deep, logits=logits,
            errors=errors, audit=audit, retained_equal=bool(torch.equal(x["A"][R], x["B"][R])))


@dataclass(frozen=True)
class CounterexampleResult:
    """The counterexample evaluated for one :class:`ShallowCounterexample`.

    Attributes:
        construction: the parameters.
        shallow, shallow_b: float64 ``[T]``: the shallow attention row of the last query of prompts A and B
            (identical: the shallow maps ignore ``c``).
        deep: float64 ``[T]``: the deep head's row of prompt A's last query, every position kept.
        logits: ``{(prompt, run): float64 [2]}`` for prompts ``"A"``, ``"B"`` and runs ``"full"``, ``"reduced"``.
        errors: ``(|o_A − o_A,R|, |o_B − o_B,R|)``, the deletion errors of the deep head's output.
        audit: the shallow audit of ``E = {j*}`` (:func:`~workbench.analyse.audit.audit_bounds`, exact mode).
        retained_equal: whether A and B agree on the retained states ``X|_R``.
    """

    construction: ShallowCounterexample
    shallow: Tensor
    shallow_b: Tensor
    deep: Tensor
    logits: dict
    errors: tuple
    audit: AuditResult
    retained_equal: bool

    @property
    def bound(self) -> float:
        """The lower bound ``(1 − γ)V`` of the larger deletion error."""
        return (1 - self.construction.gamma) * self.construction.V

    def first_tokens(self) -> dict:
        """``{(prompt, run): argmax of the logits}``."""
        return {k: int(z.argmax()) for k, z in self.logits.items()}

    def to_frame(self) -> pd.DataFrame:
        """One row per prompt and run: ``prompt, run, o, z0, z1, first_token, deep_mass_on_j`` (the deep head's
        mass on ``j*``; 0 in the reduced run, where ``j*`` is gone)."""
        j = self.construction.j_star
        rows = [{"prompt": PROMPT_LABEL[p], "run": run, "o": float(self.logits[p, run][0]),
                 "z0": float(self.logits[p, run][0]), "z1": float(self.logits[p, run][1]),
                 "first_token": int(self.logits[p, run].argmax()),
                 "deep_mass_on_j": float(self.deep[j]) if run == "full" else 0.0}
                for p in PROMPTS for run in RUNS]
        return pd.DataFrame(rows)


def deletion_sweep(eps: Sequence[float], gammas: Sequence[float], *, V: float = 2.0, beta: float = 0.1) -> pd.DataFrame:
    """Prompt A's deletion error over a grid of ``ε`` and ``γ``: one row per pair, columns ``eps, gamma,
    shallow_mass`` (the shallow row's mass on ``j*``), ``error`` (``|o_A − o_A,R|``) and ``bound`` (``(1 − γ)V``);
    ``attrs`` hold ``V`` and ``beta``."""
    eps, gammas = list(eps), list(gammas)
    if not eps or not gammas:
        raise ValueError(f"eps, gammas: must be non-empty, got {len(eps)} and {len(gammas)} values")
    rows = []
    for g in gammas:
        for e in eps:
            ce = ShallowCounterexample(eps=float(e), gamma=float(g), V=V, beta=beta)
            w, A = ce.weights(), ce.prompt("A")
            o, o_R = ce.forward(A, None, w)[0][0], ce.forward(A, ce.retained, w)[0][0]
            rows.append({"eps": float(e), "gamma": float(g), "shallow_mass": float(ce.shallow_row(A, w)[ce.j_star]),
                         "error": abs(float(o - o_R)), "bound": (1 - float(g)) * float(V)})
    out = pd.DataFrame(rows)
    out.attrs.update(V=float(V), beta=float(beta))
    return out
