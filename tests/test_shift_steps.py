"""Leap specificity: every adjacent step's gain, across prompts with CIs; the held-out reference behind a gap is the
default, and a step next to the reference is not favoured (synthetic rows whose true leap is known)."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch
from scipy import stats as sps
from test_shift import _synthetic_capture

from workbench.analyse.shift import (
    HELD_OUT_AFTER,
    HELD_OUT_GAP,
    ShiftAnalysis,
    ShiftWarning,
    leap_specificity,
    step_gains,
)
from workbench.capture.data import Capture


def test_held_out_reference_is_the_default():
    """Decode rows 6 … n: after the compared rows 1 … 3 and a gap of two rows."""
    cap = _synthetic_capture(n_decode=8)
    res = ShiftAnalysis(k=4)(cap)
    assert (res.ref_start, res.ref_end) == (6, 8) == (HELD_OUT_AFTER + HELD_OUT_GAP + 1, 8)
    assert torch.equal(res.recall_head, ShiftAnalysis(k=4, ref_start=6)(cap).recall_head)
    assert not torch.equal(res.recall_head, ShiftAnalysis(k=4, ref_start=1)(cap).recall_head)
    short = _synthetic_capture(n_decode=5)
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
    # the steps the reference (rows 6 …) cannot favour: up to 2→3; 3→4, 4→5 touch the gap, 5→6 the reference
    assert list(tab.index) == [f"{a}→{a + 1}" for a in range(-5, 3)] and (tab["n"] == 5).all()
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


def _known_leap_capture(seed, n_decode=10, W=4, noise=2.5):
    """Rows whose truth is known: every tail row is one distribution plus noise, every decode row another plus
    noise (i.i.d. across decode rows). The true recall gain is at 0→1 only; every decode step's true gain is 0."""
    cap = _synthetic_capture(n_decode=n_decode, W=W, seed=seed)
    g = torch.Generator().manual_seed(1000 + seed)
    T, (L, H) = cap.T, cap.attn.shape[:2]
    base_tail, base_dec = torch.randn(L, H, T, generator=g) * 3, torch.randn(L, H, T, generator=g) * 3
    attn = cap.attn.clone()
    for kind, base in (("tail", base_tail), ("decode", base_dec)):
        for i in cap.rows_of(kind).tolist():
            row = torch.softmax(base + noise * torch.randn(L, H, T, generator=g), -1)
            attn[:, :, i] = 0
            attn[:, :, i, :T] = row.to(attn.dtype)
    return Capture(**{**{f.name: getattr(cap, f.name) for f in dataclasses.fields(cap) if f.init}, "attn": attn})


def test_a_step_next_to_the_reference_is_not_favoured():
    """On rows whose only true leap is 0→1: with the reference starting right after the compared rows (row 4, the
    old default) the step into it, 3→4, gains recall although nothing changes there: the measure favours its own
    window. With the default (a gap of two rows, reference from row 6) no reported step touches the reference, the
    true leap 0→1 is found, and the decode steps reported gain nothing beyond noise."""
    caps = [_known_leap_capture(s) for s in range(24)]
    old = [ShiftAnalysis(k=4, ref_start=4)(c).step_frame().query("level == 'group'") for c in caps]
    into = np.array([f.loc[f.r_from == 3, "gain"].mean() for f in old])
    inner = np.array([f.loc[f.r_from == 1, "gain"].mean() for f in old])
    d = into - inner  # the artefact: row 4 is part of the reference, so the step into it gains
    assert into.mean() > 0.05 and abs(inner.mean()) < 0.03
    assert sps.binomtest(int((d > 0).sum()), int((d != 0).sum()), 0.5).pvalue < 0.01
    assert all(not f.loc[f.r_from == 3, "clear"].any() for f in old)  # and it is flagged
    tab = step_gains([ShiftAnalysis(k=4)(c) for c in caps]).set_index("step")
    decode = [s for s in tab.index if int(s.split("→")[0]) >= 1]
    assert decode == ["1→2", "2→3"]  # 3→4 (into the gap) is not reported
    assert tab.loc["0→1", "mean"] > 0.15 and tab.loc["0→1", "lo"] > 0  # the true leap
    for s in decode:  # true gain 0: the CI covers it, and the step next to the gap is not favoured
        assert tab.loc[s, "lo"] <= 0 <= tab.loc[s, "hi"] and abs(tab.loc[s, "mean"]) < 0.05
    sf = ShiftAnalysis(k=4)(caps[0]).step_frame()
    assert set(sf.loc[~sf.clear, "step"]) == {f"{a}→{a + 1}" for a in range(3, 10)}
