"""Controls a user must not find silent: *cancel* stops a model run within one decoder layer and keeps the previous
answers on screen; a policy without a preview shows its run's own kept set after *Run*; compare mode does not open on
a view where A and B look the same; ``m₀`` says when it cannot change the selection; notebook 11's answers are long
enough to hold the needle's number."""
from __future__ import annotations

import html
import math

import plotly.graph_objects as go
import pytest
import torch
from _my_policy import MeanKey

import workbench as wb
from workbench.rerun.eviction import REGISTRY
from workbench.rerun.eviction.compare import compare_kept, kept_set
from workbench.run.adapter import decoder_layers
from workbench.run.models import unwrap_model
from workbench.show import widgets as Wd
from workbench.show.widgets.compare import same_set_note


def _cancel_at(panel, net, at_layer: int, ran: list):
    """Hooks recording every decoder layer entered; the first time ``at_layer`` is entered the test presses
    *cancel* (from inside the forward, as a click during a long prefill would land)."""
    def hook(l):
        def fn(m, a):
            ran.append(l)
            if l == at_layer and not panel._cancel.is_set():
                panel.cancel()
        return fn
    return [layer.register_forward_pre_hook(hook(l)) for l, layer in enumerate(decoder_layers(net))]


def _run_cancelled_at(panel, net, at_layer: int) -> list:
    """Run ``panel`` (waiting for it) with *cancel* pressed when ``at_layer`` is first entered; the decoder layers
    entered, in order (the hooks are always removed)."""
    ran: list = []
    handles = _cancel_at(panel, net, at_layer, ran)
    try:
        panel.request_run()
        panel.wait(60)
    finally:
        for h in handles:
            h.remove()
    return ran


def test_cancel_stops_within_one_layer_and_keeps_the_previous_answers(tiny):
    lm, spans, cap = tiny
    net = unwrap_model(lm)[0]
    L = len(decoder_layers(net))
    panel = Wd.EvictionPanel(cap, lm, spans, policy="deferkv", budget=20, recent=8, max_new_tokens=5)
    # cancel during the prefill: no layer after the one running when cancel was pressed
    ran = _run_cancelled_at(panel, net, 1)
    assert ran == [0, 1] and max(ran) < L - 1, ran       # the prefill stopped before its last layer
    assert panel.progress.description == "cancelled" and panel._session is None   # nothing half-written kept
    assert not panel.run_button.disabled and panel.cancel_button.disabled
    # a full run, then a run cancelled in its first forward: the previous answers stay on screen
    panel.run()
    shown = panel.answers.value
    assert "full cache" in shown
    panel.set(budget=24)
    ran = _run_cancelled_at(panel, net, 0)
    assert ran == [0] and panel.progress.description == "cancelled"
    assert shown in panel.answers.value and "cancelled" in panel.answers.value
    # no stopping point left on the model: a later forward runs every layer
    with torch.no_grad():
        net(torch.tensor([[1, 2, 3]]))
    assert all(not layer._forward_pre_hooks for layer in decoder_layers(net))
    panel.run()  # and the panel runs again to the end
    assert panel.progress.description == "done" and "cancelled" not in panel.answers.value


def test_cancel_stops_the_pruned_prefill_panel_within_one_layer(tiny):
    lm, spans, cap = tiny
    net = unwrap_model(lm)[0]
    base = wb.EntroPrefillParams(target=0.2, eps_row=0.9, eps_audit=1.0, streak=0)
    panel = Wd.PrunePanel(cap, lm, spans, base, max_new_tokens=2)
    ran = _run_cancelled_at(panel, net, 1)
    assert ran == [0, 1] and panel.progress.description == "cancelled" and panel.model_calls == 0
    assert panel.last_full is None and "not run yet" in panel.answers.value   # nothing of the stopped run shown


def test_a_policy_without_preview_shows_its_runs_kept_set(tiny):
    lm, spans, cap = tiny
    with REGISTRY.scoped():
        wb.register_policy(MeanKey, group="attention-free")
        panel = Wd.EvictionPanel(cap, lm, spans, policy="mean-key", budget=20, recent=8, max_new_tokens=2)
        assert "placeholder" in panel.figures["kept"].layout.meta           # before: the reason, no data
        res = panel.run()
        fig = go.Figure(panel.figures["kept"])                                # what the export writes
        meta = fig.layout.meta
        assert "placeholder" not in meta and fig.data, meta
        assert "kept by the run" in panel.status.value
        want = next(t for t in wb.plots.kept_positions.draft([res], spans).traces if t["type"] == "heatmap")
        got = next(t for t in fig.data if t.type == "heatmap")
        assert torch.equal(torch.tensor(got.z, dtype=torch.float64), torch.tensor(want["z"], dtype=torch.float64))
        panel.set(budget=24)                                                  # not run at this budget: the reason
        assert "placeholder" in panel.figures["kept"].layout.meta


def test_compare_opens_on_one_layer_and_names_an_identical_set(tiny):
    lm, spans, cap = tiny
    T = cap.T
    panel = Wd.EvictionPanel(cap, None, spans, policy="deferkv", budget=T - 2, recent=8)
    assert panel.controls["compare_layer"].value == cap.L // 2                # not the union over every layer
    panel.set(compare=True, policy_b="snapkv", budget_b=T - 2)
    a, b = panel.analysis(), panel.preview_of(panel.policy_b(), T - 2)
    every = compare_kept(a, b)
    assert kept_set(a) == kept_set(b) and same_set_note(every).startswith("A and B keep the same set")
    panel.set(compare_layer="all")
    assert "A and B keep the same set at this budget" in panel.status.value
    one = compare_kept(a, b, layer=cap.L // 2)
    assert (same_set_note(one) == "") == (kept_set(a, cap.L // 2) != kept_set(b, cap.L // 2))


def test_m0_says_when_it_cannot_change_the_selection(tiny):
    lm, spans, cap = tiny
    pp = Wd.PriorityPanel(cap, wb.EntroPrefillParams(target=0.25, eps_row=0.5), layer=1, certify=False)
    k = cap.spans.k
    quiet = 0
    for layer in range(cap.L):
        pp.set(layer=layer, m0=0)
        sel0 = pp.analysis()[3]
        if sel0 is None:
            continue
        r0 = len(sel0.removed)  # the greedy's removals with no count limit
        for m0 in range(k + 1):
            pp.set(m0=m0)
            note = pp.m0_note()
            removed = pp.analysis()[3].removed
            assert (note == "") == (m0 > k - r0), (layer, m0, r0, note)
            if note:  # said to change nothing: the selection is the one with no count limit, and the status says so
                quiet += 1
                assert removed == sel0.removed and html.unescape(pp.status.value).count(note) == 1
            else:     # said to bind: the count limit k - m0 cut the removals
                assert len(removed) == k - m0 < r0
    assert quiet > 0


@pytest.mark.slow
def test_notebook_11_full_context_answers_with_the_number(smollm):
    """Notebook 11's prompt (a 512-token RULER needle) with its decode length: full context's answer holds the
    needle's number (at the old 12 new tokens it stopped before it)."""
    item = wb.ruler_grid(smollm.tokenizer, ("niah_single",), lengths=(512,), seeds=(0,))[0]
    prompt = item.build(smollm.tokenizer, max_context=smollm.shape.max_context)
    n = wb.tasks.max_new_tokens_for(item.task)
    assert n >= 32
    res = wb.run_policies(smollm, prompt, [wb.policies.FullCache()], budgets=[math.ceil(0.25 * prompt.T)],
                          max_new_tokens=n, progress=False)
    table = wb.survival_table(res, wb.token_positions(prompt, smollm.tokenizer, item.answers[0]),
                              answer=item.answers[0])
    assert bool(table.loc[table.policy == "full", "correct"].all()), table.answer.tolist()
