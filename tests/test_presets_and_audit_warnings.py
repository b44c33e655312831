"""Named EntroPrefill presets, the trace's warnings when the audit cannot bind, and ``priority_used``."""
from __future__ import annotations

import sys
import warnings

import pytest
import torch
from test_audit import FAR, SIZES, designed_capture

from workbench.analyse.params import PRESETS, EntroPrefillParams
from workbench.analyse.procedure import AuditWarning, trace
from workbench.run.spans import PromptSpans
from workbench.show.widgets import AuditPanel


@pytest.fixture(scope="module")
def spans():
    return PromptSpans.synthetic(SIZES, query_len=10)


def test_presets():
    assert EntroPrefillParams.preset("paper") == EntroPrefillParams()
    loose = EntroPrefillParams.preset("loose")
    assert (loose.eps_row, loose.target, loose.streak, loose.eps_audit) == (0.3, 0.2, 0, 0.5)
    assert EntroPrefillParams.preset("loose", eps_audit=0.2).eps_audit == 0.2
    assert EntroPrefillParams.preset("strict").streak == 2
    for name, p in PRESETS.items():
        assert isinstance(p["params"].get("target", 0.3), float), name  # fractions, never token counts
        assert len(p["consequence"]) > 40 and EntroPrefillParams.preset(name)
    with pytest.raises(ValueError, match="^name:"):
        EntroPrefillParams.preset("fast")
    with pytest.raises(ValueError, match="^eps_row:"):
        EntroPrefillParams.preset("loose", eps_row=2.0)


def _trace(cap, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tr = trace(cap, EntroPrefillParams(**kw))
    return tr, [str(x.message) for x in w if issubclass(x.category, AuditWarning)]


def test_warns_when_the_audit_accepts_at_the_first_layer(spans):
    cap = designed_capture(spans, 4, [FAR] * 4)
    tr, w = _trace(cap, streak=0)
    assert tr.l_star == 1 and len(w) == 1 and "did not bind" in w[0] and w[0] in tr.notes
    tr, w = _trace(cap, streak=1)  # accepted later: the streak, not the audit, held it back; no warning
    assert tr.l_star == 2 and w == []


def test_warns_when_the_audit_is_vacuous_or_cannot_pass(spans):
    cap = designed_capture(spans, 4, [FAR] * 4)
    _, w = _trace(cap, streak=1, eps_audit=1.0)
    assert any("cannot bind" in m for m in w)
    tr, w = _trace(cap, streak=1, audit_mode="sampled", m_a=2, eps_audit=0.1)
    assert tr.b >= 0.1 and any(">= eps_audit" in m for m in w) and tr.bypass


def test_priority_used_is_the_one_the_proposer_ranked_by(spans):
    cap = designed_capture(spans, 4, [FAR] * 4)
    tr, _ = _trace(cap, streak=1, priority="renyi")
    assert tr.priority_name == "renyi" and torch.equal(tr.priority_used, tr.priorities.S.to(torch.float64))
    tr, _ = _trace(cap, streak=1, priority="uniform")
    assert tr.priority_name == "uniform" and tr.priority_used is tr.S
    assert not torch.allclose(tr.priority_used, tr.priorities.S.to(torch.float64))


def test_audit_warning_names_the_callers_line(spans):
    """The warning points at the line that called ``trace`` (this file), not at the package's decorator wrapper
    (``workbench/util.py``) or the procedure module."""
    cap = designed_capture(spans, 4, [FAR] * 4)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        trace(cap, EntroPrefillParams(streak=0)); line = sys._getframe().f_lineno  # noqa: E702
    got = [x for x in w if issubclass(x.category, AuditWarning)]
    assert len(got) == 1
    assert (got[0].filename, got[0].lineno) == (__file__, line)



def test_audit_warning_from_a_panel_slider_names_the_line_that_moved_it(spans):
    """Through a panel's slider (the panel's callback, then the widget library's observer): the line that set
    the value, not traitlets nor the panel."""
    cap = designed_capture(spans, 4, [FAR] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        panel = AuditPanel(cap, EntroPrefillParams(streak=1), certify=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        panel.controls["streak"].value = 0; line = sys._getframe().f_lineno  # noqa: E702
    got = [x for x in w if issubclass(x.category, AuditWarning)]
    assert got and all((x.filename, x.lineno) == (__file__, line) for x in got)
