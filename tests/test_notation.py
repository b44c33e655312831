"""The glossary (``workbench.show.notation``): docs/notation.md is generated from the one table and up to date,
every control of every panel has a tooltip from it (with the allowed range of its constraint), and the
controls that mean something: m₀ disabled with the reason when it cannot change anything, K ≤ the number of
pages, dropdowns that show their value, legends that list only drawn traces."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from _all_figures import synthetic_inputs

from workbench.constraints import PARAMS
from workbench.show import notation, plots
from workbench.show import widgets as Wd


@pytest.fixture(scope="module")
def syn():
    return synthetic_inputs(L=6, H_Q=6, G=2)


def _panels(syn):
    sp, cap, params, tr = syn
    prompt = SimpleNamespace(spans=sp)
    return [Wd.HeadsPanel(cap), Wd.PriorityPanel(cap, params), Wd.AuditPanel(cap, params, certify=False),
            Wd.ShiftPanel(cap, k=4), Wd.PagesPanel(cap, params), Wd.TokenPanel(cap),
            Wd.PrunePanel(cap, None, prompt, params), Wd.EvictionPanel(cap, None, prompt, policy="deferkv", budget=40),
            Wd.CounterexamplePanel()]


def test_docs_notation_is_generated_from_the_table():
    assert notation.DOC_PATH.read_text(encoding="utf-8") == notation.markdown(), (
        "docs/notation.md is stale: run python -m workbench.show.notation")
    for s in notation.SYMBOLS:
        assert s.spec.startswith("§") and s.meaning and s.name
        if s.param is not None:
            assert s.param in PARAMS and PARAMS[s.param].describe() in s.allowed()
    md = notation.markdown()
    for sym in ("ζ", "τ", "ε_s", "λ", "m₀", "U_l (certificate)", "D_l"):
        assert f"| {sym} |" in md


def test_every_control_has_a_tooltip_from_the_table(syn):
    for panel in _panels(syn):
        for name, w in panel.controls.items():
            assert w.tooltip, f"{type(panel).__name__}.{name}: no tooltip"
            key = panel.TOOLTIP_KEYS.get(name, name)
            if key in notation.CONTROLS:
                s = notation.CONTROLS[key]
                assert w.tooltip.startswith(s.symbol) or "cannot change" in w.tooltip, (name, w.tooltip)
                assert s.spec in w.tooltip or "cannot change" in w.tooltip
    assert "in (0, 1]" in notation.tooltip("zeta") and "SPEC §2" in notation.tooltip("zeta")
    with pytest.raises(ValueError, match="^control: not in the notation table"):
        notation.tooltip("bogus")


def test_m0_disabled_with_the_reason_when_it_cannot_change_anything(syn):
    sp, cap, params, tr = syn
    panel = Wd.PriorityPanel(cap, params.replace(eps_row=1e-3), layer=max(tr.selections), certify=False)
    sel = panel.analysis()[3]
    assert sel is not None and not sel.removed          # nothing is removed, whatever m₀
    m0 = panel.controls["m0"]
    assert m0.disabled and "cannot change anything" in m0.tooltip
    panel.set(eps_row=1.0)                               # now the greedy removes chunks: m₀ binds
    assert panel.analysis()[3].removed and not m0.disabled and m0.tooltip.startswith("m₀")
    before = panel.analysis()[3].removed
    panel.set(m0=sp.k)
    assert panel.analysis()[3].removed != before


def test_k_follows_the_number_of_pages(syn):
    sp, cap, params, tr = syn
    panel = Wd.PagesPanel(cap, params)
    K = panel.controls["K"]
    for b in (16, 32, 64, 5):
        panel.set(page=b)
        n = -(-cap.T // b)
        assert K.max == n and K.value <= n and panel.n_pages() == n and f"{n} pages" in K.tooltip
    assert "of" in panel.status.value and not panel.error


def test_shift_layer_dropdown_shows_its_value(syn):
    sp, cap, params, tr = syn
    panel = Wd.ShiftPanel(cap, k=4)
    dd = panel.controls["layer"]
    assert dd.label == "all" and dd.value == "all"
    panel.set(layer=2)
    assert panel.figures["shift"].layout.meta.get("layer") == 2
    panel.set(layer="all")
    assert panel.figures["shift"].layout.meta.get("layer") is None


def test_legends_list_only_drawn_traces(syn):
    sp, cap, params, tr = syn
    from workbench.analyse.procedure import trace

    t = trace(cap, params, certify=False)             # no certificate: U_l is all missing
    fig = plots.trace_layers(t)
    by = {d.name: d for d in fig.data}
    assert np.isnan(np.asarray(by["U_l"].y, dtype=float)).all() and by["U_l"].showlegend is False
    assert by["D_l"].showlegend is not False
    fig = plots.certificate(t)
    u = next(d for d in fig.data if d.name.startswith("U_l"))
    assert u.showlegend is False
    t2 = trace(cap, params, certify=True)
    u2 = next(d for d in plots.certificate(t2).data if d.name.startswith("U_l"))
    assert u2.showlegend is not False
    if np.isnan(pd_float(t.to_frame()["max_audit_bound"])).all():
        assert by["max audit bound"].showlegend is False


def pd_float(col):
    import pandas as pd

    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=float)
