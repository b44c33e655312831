"""The answer-divergence view in the eviction panel (single and compare mode), built in-process on a tiny
random-weight llama: after a run the figure shows the run teacher-forced on the full-cache answer, its numbers those
of an oracle written here from the two runs' logits."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import torch

from workbench.rerun.eviction import DeferKV, EvictionSession, FullCache, Needs, SnapKV
from workbench.show import export as ex
from workbench.show import widgets as Wd

N = 4


def oracle(lm, spans, pol, B):
    """KL(p_full ‖ q_forced) per answer token, and where the greedy answers part, from a session of its own."""
    sess = EvictionSession.prepare(lm, spans, Needs.of([pol]), N, keep_logits=True, progress=False)
    full = sess.run(FullCache(), sess.T)
    forced = sess.run(pol, B, forced=full.ids)
    own = sess.run(pol, B).ids
    lp = torch.log_softmax(full.logits.double(), -1)
    lq = torch.log_softmax(forced.logits.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).clamp_min(0).numpy()
    part = next((j for j, (a, b) in enumerate(zip(full.ids, own)) if a != b), None)
    return kl, part, list(full.ids)


def kl_drawn(fig, col: int = 1) -> np.ndarray:
    """The KL bars of column ``col`` (both colours: before and after the parting), by answer position."""
    xaxis = "x" if col == 1 else f"x{col}"
    out = {}
    for tr in fig.data:
        if tr.type == "bar" and (tr.xaxis or "x") == xaxis:
            out.update(zip((int(x) for x in tr.x), (float(y) for y in tr.y)))
    return np.array([out[j] for j in sorted(out)])


def test_divergence_figure_after_a_run_zero_at_full_budget(tiny, tmp_path):
    lm, spans, cap = tiny
    panel = Wd.EvictionPanel(cap, lm, spans, policy="snapkv", budget=20, recent=8, max_new_tokens=N)
    assert "divergence" not in panel.figures  # nothing run yet: no figure
    panel.set(budget=spans.T)  # B ≥ T: nothing evicted
    panel.run()
    fig = panel.figures["divergence"]
    assert fig.layout.meta["figure"] == "answer_divergence" and fig.layout.meta["first_divergence"] == [None]
    np.testing.assert_allclose(kl_drawn(fig), 0, atol=1e-9)
    assert "the answers agree" in panel.answers.value
    # a small budget: the numbers of the oracle
    B = 12
    panel.set(budget=B)
    assert panel.figures["divergence"].layout.meta["settings"] == [f"snapkv, B = {spans.T}"]  # the last run, named
    panel.run()
    pol = SnapKV(n_sink=spans.n_sink, recent=8, window=16)
    kl, part, ids = oracle(lm, spans, pol, B)
    fig = panel.figures["divergence"]
    assert fig.layout.meta["settings"] == [f"snapkv, B = {B}"] and fig.layout.meta["first_divergence"] == [part]
    assert kl.max() > 1e-4  # the check below is not 0 == 0
    np.testing.assert_allclose(kl_drawn(fig), kl, rtol=1e-6, atol=1e-9)
    assert panel.last_divergence.ids == tuple(ids)
    # exportable like every figure: the CSV holds the per-token KL
    paths = panel.export_all(tmp_path, formats=("svg",))
    assert {"divergence.svg", "divergence.json", "divergence.csv"} <= {p.name for p in paths["divergence"]}
    frame = pd.read_csv(tmp_path / "divergence.csv")
    assert len(frame) > 0 and set(ex.figure_data(fig).columns) == set(frame.columns)


def test_compare_mode_shows_a_and_b_side_by_side(tiny):
    lm, spans, cap = tiny
    panel = Wd.EvictionPanel(cap, lm, spans, policy="snapkv", budget=12, recent=8, max_new_tokens=N)
    panel.set(compare=True, policy_b="deferkv", budget_b=spans.T, defer_lam_b=0.5)
    assert "divergence" not in panel.figures
    panel.run()
    fig = panel.figures["divergence"]
    assert fig.layout.meta["settings"] == ["A: snapkv, B = 12", f"B: deferkv, B = {spans.T}"]
    ka, part_a, _ = oracle(lm, spans, SnapKV(n_sink=spans.n_sink, recent=8, window=16), 12)
    kb, part_b, _ = oracle(lm, spans, DeferKV(n_sink=spans.n_sink, recent=8, window=16, lam=0.5), spans.T)
    np.testing.assert_allclose(kl_drawn(fig, 1), ka, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(kl_drawn(fig, 2), kb, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(kb, 0, atol=1e-9)  # B ≥ T: nothing evicted
    assert fig.layout.meta["first_divergence"] == [part_a, part_b]
    # single mode has not run: its figure leaves; the compare run's A, cached, comes back without a model call
    panel.set(compare=False)
    assert "divergence" not in panel.figures
    calls = panel.model_calls
    panel.run()
    assert panel.model_calls == calls and panel.figures["divergence"].layout.meta["settings"] == ["snapkv, B = 12"]


def test_empty_full_answer_has_no_divergence(tiny):
    """A full-cache answer with no tokens has nothing to compare: the answer box says so, no figure."""
    lm, spans, cap = tiny
    panel = Wd.EvictionPanel(cap, lm, spans, policy="snapkv", budget=12, recent=8, max_new_tokens=N)
    full = panel.full_result(panel.session())
    panel.cache[("full", N)] = dataclasses.replace(full, ids=[], logits=None)  # as if it stopped at once
    panel.run()
    assert "divergence" not in panel.figures and panel.NO_ANSWER in panel.answers.value
