"""Leap specificity (issue 15): every adjacent step's gain, across prompts with CIs; the held-out reference is
the default."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from test_shift import _synthetic_capture

from workbench.analyse.shift import ShiftAnalysis, ShiftWarning, leap_specificity, step_gains


def test_held_out_reference_is_the_default():
    cap = _synthetic_capture(n_decode=6)
    res = ShiftAnalysis(k=4)(cap)
    assert (res.ref_start, res.ref_end) == (4, 6)
    assert torch.equal(res.recall_head, ShiftAnalysis(k=4, ref_start=4)(cap).recall_head)
    assert not torch.equal(res.recall_head, ShiftAnalysis(k=4, ref_start=1)(cap).recall_head)
    short = _synthetic_capture(n_decode=3)
    with pytest.warns(ShiftWarning, match="no held-out reference"):
        r3 = ShiftAnalysis(k=4)(short)
    assert r3.ref_start == 1 and torch.equal(r3.recall_head, ShiftAnalysis(k=4, ref_start=1)(short).recall_head)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ShiftAnalysis(k=4, ref_start=1)(short)  # asked for explicitly: no warning


def test_step_frame_is_every_adjacent_difference():
    cap = _synthetic_capture(n_decode=6, W=6)
    res = ShiftAnalysis(k=4)(cap)
    sf = res.step_frame()
    fr = res.to_frame()
    assert sorted(set(sf["step"])) == sorted(f"{a}→{a + 1}" for a in range(-5, 6))
    for level in ("head", "group"):
        one = fr[(fr.level == level) & (fr.layer == 1) & (fr.unit == 1)].set_index("r")["recall"]
        st = sf[(sf.level == level) & (sf.layer == 1) & (sf.unit == 1)].set_index("r_from")
        for a in range(-5, 6):
            assert st.loc[a, "gain"] == pytest.approx(one[a + 1] - one[a])
    assert sf.loc[sf.boundary, "step"].unique().tolist() == ["0→1"]


def test_step_gains_across_prompts_with_cis():
    results = [ShiftAnalysis(k=4)(_synthetic_capture(n_decode=6, seed=s)) for s in range(5)]
    tab = step_gains(results).set_index("step")
    assert list(tab.index) == [f"{a}→{a + 1}" for a in range(-5, 6)] and (tab["n"] == 5).all()
    per = [r.step_frame().query("level == 'group' and r_from == -1")["gain"].mean() for r in results]
    assert tab.loc["-1→0", "mean"] == pytest.approx(np.mean(per))
    assert (tab["lo"] <= tab["mean"] + 1e-12).all() and (tab["mean"] <= tab["hi"] + 1e-12).all()
    assert tab.loc["0→1", "larger_than_boundary"] == 0
    lp = leap_specificity(results)
    b = [r.step_frame().query("level == 'group' and r_from == 0")["gain"].mean() for r in results]
    assert lp.n == 5 and lp.wins == sum(x > y for x, y in zip(b, per)) and lp.losses == sum(x < y for x, y in zip(b, per))
    assert "n = 5 paired prompts" in lp.finding("0→1", "−1→0", "recall gain")
    with pytest.raises(ValueError, match="^level:"):
        step_gains(results, level="layer")
