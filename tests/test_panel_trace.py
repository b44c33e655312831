"""The priority panel previews exactly the trace's proposal, for every priority choice (one code path:
``procedure.layer_proposal``)."""
from __future__ import annotations

import pytest

from workbench.analyse.params import PRIORITIES, EntroPrefillParams
from workbench.analyse.procedure import layer_proposal, trace
from workbench.show.widgets import PriorityPanel


@pytest.mark.parametrize("priority", PRIORITIES)
def test_priority_panel_equals_trace(smollm_capture, priority):
    cap = smollm_capture
    params = EntroPrefillParams(priority=priority, target=0.3, eps_row=0.5, seed=3)
    tr = trace(cap, params)
    panel = PriorityPanel(cap, params)
    checked = 0
    for l in params.monitored_layers(cap.L)[::4]:
        panel.set(layer=l)
        p, pool, prio, sel, env = panel.analysis()
        assert p.priority == priority
        want = tr.selections.get(l)
        if want is None:
            assert sel is None
            continue
        assert sel is not None and list(sel.removed) == list(want.removed), (priority, l)
        assert sel.D == want.D
        prop = layer_proposal(cap, params, l)
        assert prop.S.tolist() == tr.S[l].tolist()  # the priority actually used, under one name
        checked += 1
    assert checked >= 3
