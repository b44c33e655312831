"""Panel behaviour a user sees: one model run in flight with the latest values winning, cancel, status and
figures agreeing (fixed layer, saving target, LP certificate), only applicable sliders shown, slider tracks
not squeezed, full answers, and the export button writing every figure with its sidecar."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from _all_figures import synthetic_inputs

from workbench.rerun.eviction import CriticalKV, DeferKV, PageEntroKV, SnapKV
from workbench.show import widgets as Wd
from workbench.show.widgets.run import _answer_table
from workbench.show.widgets.run_control import RunCancelled


@pytest.fixture(scope="module")
def syn():
    return synthetic_inputs(L=6, H_Q=6, G=2)


def _fake_run(panel, calls, gate, step=False):
    def run():
        with panel._busy():
            calls.append(float(panel.controls["zeta"].value))
            gate.wait(10)
            if step:
                panel._step(1, "pruned prefill…")
    return run


def test_one_run_in_flight_latest_values_win(syn):
    sp, cap, params, tr = syn
    panel = Wd.PrunePanel(cap, None, SimpleNamespace(spans=sp), params)
    calls, gate = [], threading.Event()
    panel.run = _fake_run(panel, calls, gate)
    worker = panel.request_run()
    for _ in range(100):
        if calls:
            break
        threading.Event().wait(0.05)
    assert calls == [pytest.approx(params.zeta)] and panel.run_button.disabled and not panel.cancel_button.disabled
    for z in (0.2, 0.3, 0.4):           # moves during the run: queued, not run
        panel.controls["zeta"].value = z
        assert panel.request_run() is worker
    assert panel.progress.description.startswith("queued")
    gate.set()
    panel.wait(10)
    assert calls == [pytest.approx(params.zeta), pytest.approx(0.4)]   # the intermediate 0.2, 0.3 dropped
    assert not panel.run_button.disabled and panel.cancel_button.disabled


def test_cancel_stops_the_run_and_drops_the_pending_one(syn):
    sp, cap, params, tr = syn
    panel = Wd.PrunePanel(cap, None, SimpleNamespace(spans=sp), params)
    calls, gate = [], threading.Event()
    panel.run = _fake_run(panel, calls, gate, step=True)
    panel.request_run()
    for _ in range(100):
        if calls:
            break
        threading.Event().wait(0.05)
    panel.request_run()                 # pending
    panel.cancel()
    gate.set()
    panel.wait(10)
    assert len(calls) == 1 and panel.progress.description == "cancelled" and "cancelled" in panel.answers.value
    with pytest.raises(RunCancelled):   # the step check itself
        panel._cancel.set()
        panel._step(0, "x")
    panel._cancel.clear()


def test_status_and_figures_agree(syn):
    sp, cap, params, tr = syn
    panel = Wd.PrunePanel(cap, None, SimpleNamespace(spans=sp), params)
    assert panel.controls["run_layer"].layout.display == "none"      # adaptive: no fixed-l* slider
    layer = max(tr.selections)
    panel.set(mode="fixed layer", run_layer=layer)
    assert panel.controls["run_layer"].layout.display is None
    assert f"fixed layer l* = {layer}" in panel.status.value and "adaptive procedure would" in panel.status.value
    sel = panel.analysis().selections[layer]
    assert f"removes chunks {list(sel.removed)}" in panel.status.value
    assert panel.figures["trace"].layout.meta["fixed_layer"] == layer
    assert any(s.line.dash == "dash" and s.x0 == layer for s in panel.figures["trace"].layout.shapes)
    # PriorityPanel: the target and U against D in a figure, following the sliders
    pp = Wd.PriorityPanel(cap, params, layer=layer, certify=True)
    cert = pp.figures["certificate"]
    by = {t.name: t for t in cert.data}
    sel = pp.analysis()[3]
    assert list(by["target"].y) == [sel.target_tokens] * 2 and list(by["D_l (greedy)"].y) == [sel.D]
    assert by["U_l (certificate)"].y[0] == pytest.approx(sel.U)
    pp.set(target=0.6)
    sel2 = pp.analysis()[3]
    assert sel2.target_tokens > sel.target_tokens and list(pp.figures["certificate"].data[2].y) == [sel2.target_tokens] * 2


def test_eviction_panel_shows_only_applicable_sliders(syn):
    sp, cap, params, tr = syn
    panel = Wd.EvictionPanel(cap, None, SimpleNamespace(spans=sp), policy="deferkv", budget=40)
    assert panel.controls["page"].layout.display == "none" and panel.controls["defer_lam"].layout.display is None
    page_policies = [n for n, c in panel.classes.items() if "page" in {f.name for f in c.__dataclass_fields__.values()}]
    assert page_policies
    panel.set(policy=page_policies[0])
    assert panel.controls["page"].layout.display is None and panel.controls["defer_lam"].layout.display == "none"
    assert not panel.controls["budget"].continuous_update      # model-run panels update on release


def test_eviction_panel_policy_is_built_by_the_one_builder(syn):
    """The panel's policy is the controls' values on the policy's own fields, written out here by hand: DeferKV gets
    the λ slider, page-EntroKV the page slider, a wrapper SnapKV with the panel's common parameters as its base."""
    sp, cap, params, tr = syn
    panel = Wd.EvictionPanel(cap, None, SimpleNamespace(spans=sp), policy="deferkv", budget=40, n_sink=2, recent=3)
    assert not hasattr(panel, "build_policy")
    common = dict(panel.common)
    lam = panel.controls["defer_lam"].value
    assert panel.policy() == DeferKV(**common, lam=float(lam))
    panel.set(policy="page-entrokv")
    page = panel.controls["page"].value
    assert panel.policy() == PageEntroKV(n_sink=2, recent=3, page=int(page))
    panel.set(policy="criticalkv")
    assert panel.policy() == CriticalKV(base=SnapKV(**common))


def test_slider_tracks_and_answers(syn):
    sp, cap, params, tr = syn
    panel = Wd.PriorityPanel(cap, params)
    for w in panel.controls.values():
        if hasattr(w, "readout"):
            assert w.style.description_width == "170px" and w.layout.width == "440px"  # track ≥ 440-170-readout
    long = "The password is " + "x" * 300 + " swordfish"
    html = _answer_table("full", long, "pruned", "short")
    assert "swordfish" in html and "white-space:pre-wrap" in html


@pytest.mark.slow
def test_export_button_writes_every_figure(syn, tmp_path):
    sp, cap, params, tr = syn
    panel = Wd.PriorityPanel(cap, params, layer=max(tr.selections))
    paths = panel.export_clicked(tmp_path / "out")
    names = {p.name for p in paths}
    for fig in panel.figures:
        assert {f"{fig}.pdf", f"{fig}.svg", f"{fig}.png", f"{fig}.json", f"{fig}.csv"} <= names
    assert all(p.exists() for p in paths)
    assert str((tmp_path / "out").resolve()) in panel.export_links.value
    assert panel.export_links.value.count("<a href=") == len(paths)


def test_export_width_choice_and_sidecar_identity(syn, monkeypatch, tmp_path):
    """The export button offers single column, double column or both; the sidecar gets the capture's model id
    and prompt hash (they were null) and the panel's parameters."""
    import workbench.show.export as E

    sp, cap, params, tr = syn
    seen = []
    monkeypatch.setattr(E, "export_all", lambda figures, folder, **kw: seen.append(kw) or {n: [] for n in figures})
    panel = Wd.PriorityPanel(cap, params, layer=max(tr.selections))
    assert [v for _, v in panel.export_width.options] == ["single", "double", "both"]
    for choice, want in (("single", "single"), ("double", "double"), ("both", ["single", "double"])):
        panel.export_width.value = choice
        panel.export_clicked(tmp_path / choice)
        assert seen[-1]["width"] == want
    kw = seen[-1]
    assert kw["model_id"] == cap.model_id and kw["prompt_hash"] == E.prompt_hash(cap.spans)
    assert kw["params"]["panel"] == "PriorityPanel" and "zeta" in kw["params"]


def test_counterexample_panel_status_and_figures_agree(monkeypatch, tmp_path):
    """Notebook 10's panel: its status line says what its figures show (the shallow and deep mass on j*, the
    deletion errors from the logits, the audit's verdict), and its export carries the slider values."""
    import workbench.show.export as E

    panel = Wd.CounterexamplePanel()
    for w in panel.controls.values():
        assert w.style.description_width == "170px" and w.layout.width == "440px"
    for eps, gamma, verdict in ((1e-1, 0.2, "fails"), (1e-6, 0.45, "passes")):
        panel.set(eps=eps, gamma=gamma)
        st = panel.status.value
        rows, z0 = panel.figures["rows"].data, list(panel.figures["logits"].data[0].y)   # z0 = o: A, A_R, B, B_R
        assert rows[0].y[3] == pytest.approx(eps, rel=1e-9) and rows[1].y[3] == pytest.approx(1 - gamma, rel=1e-9)
        assert f"shallow mass on j* = {rows[0].y[3]:.2e}: the audit (ε_audit = 0.01) {verdict}" in st
        assert f"deep mass on j* = {rows[1].y[3]:.3f}" in st
        assert f"|o − o_R|: A {abs(z0[0] - z0[1]):.4f}, B {abs(z0[2] - z0[3]):.4f} ≥ (1 − γ)V = {(1 - gamma) * 2:.4f}" in st
    seen = []
    monkeypatch.setattr(E, "export_all", lambda figures, folder, **kw: seen.append((set(figures), kw)) or {})
    panel.export_clicked(tmp_path)
    names, kw = seen[-1]
    assert names == {"rows", "logits"}
    assert kw["params"] == {"panel": "CounterexamplePanel", "eps": pytest.approx(1e-6), "gamma": pytest.approx(0.45)}
