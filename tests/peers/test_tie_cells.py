"""The parity tests' classification of differing cells (``_kvpress_oracle.near_tie_cells``), on hand-made cells:
exact ties (bit-equal scores at the cut, the workbench keeping the lower positions), near ties (within ``rtol``),
real differences, and an exact-tie cell where the workbench would have kept the higher position (refused)."""
from __future__ import annotations

import pytest
import torch
from _kvpress_oracle import near_tie_cells


def _case(scores: list[float], ours: list[int], theirs: list[int]):
    s = torch.tensor([[scores]], dtype=torch.float32)               # [L = 1, G = 1, T]
    kept = torch.tensor([[sorted(ours)]])                          # [1, 1, B]
    return [[set(theirs)]], kept, s, torch.zeros(len(scores), dtype=torch.bool)


def test_exact_near_and_real_differences():
    # positions 1 and 3 hold the same score (the cut): the workbench keeps 1, kvpress 3
    assert near_tie_cells(*_case([5.0, 2.0, 4.0, 2.0], [0, 1, 2], [0, 2, 3])) == (1, 1, 0)
    # 2.0 and 2.00001 are 5e-6 apart (relative): a near tie
    assert near_tie_cells(*_case([5.0, 2.0, 4.0, 2.00001], [0, 2, 3], [0, 1, 2])) == (1, 0, 1)
    # kvpress keeps 1 (score 1.0) over 3 (score 2.0): a real difference, neither kind
    assert near_tie_cells(*_case([5.0, 1.0, 4.0, 2.0], [0, 2, 3], [0, 1, 2])) == (1, 0, 0)
    assert near_tie_cells(*_case([5.0, 1.0, 4.0, 2.0], [0, 2, 3], [0, 2, 3])) == (0, 0, 0)


def test_an_exact_tie_kept_at_the_higher_position_is_refused():
    with pytest.raises(AssertionError, match="not the lower positions"):
        near_tie_cells(*_case([5.0, 2.0, 4.0, 2.0], [0, 2, 3], [0, 1, 2]))
    # with a tie-break key the order among equal scores is the policy's: not checked
    assert near_tie_cells(*_case([5.0, 2.0, 4.0, 2.0], [0, 2, 3], [0, 1, 2]), tiebreak_free=False) == (1, 1, 0)
