"""The counterexample panel (paper §6.1): ``ε`` and ``γ`` rebuild the hand-made two-layer network of
:mod:`workbench.analyse.counterexample`; no model, no capture."""
from __future__ import annotations

import dataclasses

from workbench.analyse.counterexample import ShallowCounterexample
from workbench.show import plots
from workbench.show.widgets.base import SLIDERS, Panel

__all__ = ["CounterexamplePanel"]


class CounterexamplePanel(Panel):
    """Why a shallow certificate is insufficient (paper §6.1): ``ε`` (the shallow mass on ``j*``) and ``γ``
    (the deep head's mass off ``j*``) → prompt A's shallow and deep attention rows and the first-token logits of
    both prompts, full and reduced; the status line gives the shallow audit's verdict, the deletion errors
    against ``(1 − γ)V`` and the first tokens. The rows and the audit follow ``ε``; the logits and the errors
    do not move with it."""

    title = "A shallow certificate is insufficient (paper §6.1)"

    def __init__(self, construction: ShallowCounterexample | None = None):
        super().__init__()
        self.base = construction if construction is not None else ShallowCounterexample()
        if not isinstance(self.base, ShallowCounterexample):
            raise ValueError(f"construction: must be a ShallowCounterexample, got {type(self.base).__name__}")
        self.controls = {"eps": SLIDERS["ce_eps"].make(self.base.eps),
                         "gamma": SLIDERS["ce_gamma"].make(self.base.gamma)}
        self._finish()

    def construction(self) -> ShallowCounterexample:
        """The construction at the current sliders."""
        c = self.controls
        return dataclasses.replace(self.base, eps=float(c["eps"].value), gamma=float(c["gamma"].value))

    def analysis(self):
        """The :class:`~workbench.analyse.counterexample.CounterexampleResult` at the current sliders."""
        return self.construction()()

    def compute(self):
        res = self._analyse()
        c = res.construction
        first = res.first_tokens()
        status = (f"shallow mass on j* = {float(res.shallow[c.j_star]):.2e}: the audit (ε_audit = {c.eps_audit:g}) "
                  f"{'passes' if res.audit.passed else 'fails'}; deep mass on j* = {float(res.deep[c.j_star]):.3f} "
                  f"= 1 − γ<br>|o − o_R|: A {res.errors[0]:.4f}, B {res.errors[1]:.4f} ≥ (1 − γ)V = {res.bound:.4f}; "
                  f"first token of A: full {first['A', 'full']}, reduced {first['A', 'reduced']}")
        return {"rows": plots.counterexample_rows.draft(res), "logits": plots.counterexample_logits.draft(res)}, status
