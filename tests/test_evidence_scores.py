"""The evidence's memo of policy scores: reused per policy, and dropped on request."""
from __future__ import annotations

import torch

from workbench.rerun.eviction.evidence import Evidence


class _Counting:
    """A stand-in policy (hashable, like the frozen dataclasses) that counts its scoring calls."""

    def __init__(self):
        self.calls = 0

    def scores(self, evidence):
        self.calls += 1
        return torch.full((1, 1, 4), float(self.calls))


def test_scores_are_memoised_and_forget_scores_recomputes_them():
    ev = Evidence(T=4, L=1, head_group=torch.tensor([0]))
    p = _Counting()
    first = ev.scores_of(p)
    assert ev.scores_of(p) is first and p.calls == 1
    ev.forget_scores()
    again = ev.scores_of(p)
    assert p.calls == 2 and torch.equal(again, torch.full((1, 1, 4), 2.0))
