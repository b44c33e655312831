"""Widget panels driven programmatically: a slider move shows exactly what the analysis and plot
functions give for the new parameters; analytic sliders never call the model; run buttons call it
once per distinct parameter set; out-of-range values are clamped to valid parameters."""
from __future__ import annotations

import copy
import json
import math

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from workbench.analyse.params import EntroPrefillParams
from workbench.capture.data import Capture
from workbench.run.spans import PromptSpans
from workbench.show import export, plots
from workbench.show import widgets as Wd
from workbench.show.private_compat import public_only
from workbench.show.widgets.sliders import LABEL_PX, SLIDERS


# ----------------------------------------------------------------------------- helpers
def _empty(v) -> bool:
    return v is None or (isinstance(v, dict) and not v)


def _same(a, b, path="") -> None:
    """Recursive equality of plotly JSON (arrays, NaN-aware floats)."""
    if isinstance(a, dict) and isinstance(b, dict):
        # an emptied property ({} or None) is the same as an absent one
        a = {k: v for k, v in a.items() if not _empty(v)}
        b = {k: v for k, v in b.items() if not _empty(v)}
        assert set(a) - {"uid"} == set(b) - {"uid"}, f"{path}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            if k != "uid":
                _same(a[k], b[k], f"{path}.{k}")
        return
    if isinstance(a, (list, tuple, np.ndarray)) or isinstance(b, (list, tuple, np.ndarray)):
        la, lb = list(np.asarray(a, dtype=object).ravel()) if isinstance(a, np.ndarray) else list(a), \
            list(np.asarray(b, dtype=object).ravel()) if isinstance(b, np.ndarray) else list(b)
        if isinstance(a, np.ndarray) and a.ndim > 1 or isinstance(b, np.ndarray) and b.ndim > 1:
            la, lb = np.asarray(a, dtype=object).tolist(), np.asarray(b, dtype=object).tolist()
        assert len(la) == len(lb), f"{path}: length {len(la)} != {len(lb)}"
        for i, (x, y) in enumerate(zip(la, lb)):
            _same(x, y, f"{path}[{i}]")
        return
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return
    if a is None or b is None:
        assert a is None and b is None, f"{path}: {a!r} != {b!r}"
        return
    assert a == b, f"{path}: {a!r} != {b!r}"


def assert_shows(fw: go.FigureWidget, fig: go.Figure) -> None:
    """``fw`` shows exactly ``fig``'s traces and layout (template and uirevision aside), laid out for the
    screen as a panel lays out its figures (``live_layout``: the paper rules at the live width)."""
    from workbench.show.plots import as_figure
    from workbench.show.widgets.base import live_layout

    fig = as_figure(live_layout(go.Figure(fig)))
    assert len(fw.data) == len(fig.data)
    for a, b in zip(fw.data, fig.data):
        _same(a.to_plotly_json(), b.to_plotly_json(), f"trace {a.type}")
    la, lb = fw.layout.to_plotly_json(), fig.layout.to_plotly_json()
    for d in (la, lb):
        d.pop("template", None)
        d.pop("uirevision", None)
    _same(la, lb, "layout")


class CountingModel:
    """Counts top-level forwards of an HF model (``prefills``: calls with more than one token);
    ``armed`` makes any forward raise."""

    def __init__(self, model):
        self.prefills = 0
        self.forwards = 0
        self.armed = False
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if self.armed:
            raise AssertionError("the model was called from an analytic slider")
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.forwards += 1
        if ids is not None and ids.shape[-1] > 1:
            self.prefills += 1

    def close(self):
        self.handle.remove()


def _move_everything(panel, skip=()):
    """Move every slider and dropdown of ``panel`` to another value (one at a time)."""
    moved = 0
    for name, w in panel.controls.items():
        if name in skip:
            continue
        if hasattr(w, "options"):
            opts = [o if not isinstance(o, tuple) else o[1] for o in w.options]
            w.value = opts[-1] if w.value != opts[-1] else opts[0]
        elif hasattr(w, "base"):
            w.value = w.base ** (0.3 * w.min + 0.7 * w.max)
        elif hasattr(w, "min"):
            v = w.min + (w.max - w.min) * 0.6
            w.value = int(round(v)) if isinstance(w.value, int) else v
        else:
            continue
        moved += 1
    return moved


# ----------------------------------------------------------------------------- tiny model fixtures
# the `tiny` fixture (a tiny llama, its spans and capture) is in conftest.py


@pytest.fixture()
def counter(tiny):
    c = CountingModel(tiny[0].model)
    yield c
    c.close()


# ----------------------------------------------------------------------------- analytic panels (real capture)
def test_heads_panel_follows_sliders(smollm_capture):
    cap = smollm_capture
    panel = Wd.HeadsPanel(cap)
    assert set(panel.figures) == {"heads", "residual"}
    panel.controls["zeta"].value = 0.2
    panel.controls["tau"].value = 0.05
    before = np.asarray(panel.figures["heads"].data[0].z, dtype=float)  # weights at ζ = 0.2
    panel.controls["layer"].value = 7
    panel.controls["quantity"].value = "H"
    pool = EntroPrefillParams(zeta=0.2, tau=panel.controls["tau"].value).pooling()(cap)
    assert_shows(panel.figures["heads"], plots.head_heatmap(pool, quantity="H"))
    assert_shows(panel.figures["residual"], plots.residual_distribution(pool, 7, cap.spans))
    assert panel.figures["heads"].layout.meta["zeta"] == pytest.approx(0.2)
    assert panel.params()["layer"] == 7 and panel.params()["quantity"] == "H"
    # a different ζ really changes the weights shown
    panel.set(zeta=1.0, quantity="w")
    z = np.asarray(panel.figures["heads"].data[0].z, dtype=float)
    np.testing.assert_allclose(z, 1.0 / cap.r)  # ζ = 1: uniform weights 1/r
    assert not np.allclose(before[np.isfinite(before)], 1.0 / cap.r)


def test_priority_panel_matches_selection_and_envelope(smollm_capture):
    from workbench.analyse.envelope import envelope
    from workbench.analyse.pooling import HeadPooling
    from workbench.analyse.priorities import ChunkPriorities
    from workbench.analyse.selection import GreedySelection, mass_table

    cap = smollm_capture
    panel = Wd.PriorityPanel(cap, layer=5)
    panel.set(zeta=0.3, eps_s=0.5, lam=1.5, target=0.2, eps_row=0.5, m0=2, layer=12)
    p = panel.params()
    tau = p["tau"]
    pool = HeadPooling(zeta=0.3, tau=tau).__call__(cap)
    prio = ChunkPriorities(eps_s=p["eps_s"], lam=1.5).score(pool.mu, cap.spans)
    m = mass_table(cap.observer_attn(), cap.spans)[12]
    sel = GreedySelection(target=0.2, eps_row=p["eps_row"], m0=2).select(prio.S[12], cap.spans.n, m)
    env = envelope(cap.observer_attn()[12], pool.mu[12], pool.omega[12], cap.spans.removal_mask(sel.removed), layer=12)
    assert p["eps_s"] == pytest.approx(0.5, rel=1e-9) and p["eps_row"] == pytest.approx(0.5, rel=1e-9)
    assert_shows(panel.figures["priorities"], plots.chunk_priorities(prio, cap.spans, 12, removed=sel.removed))
    assert_shows(panel.figures["envelope"], plots.envelope_rows(env))
    assert sel.verdict.split(":")[0] in panel.status.value
    assert panel.figures["priorities"].layout.meta["removed"] == sel.removed
    assert panel.timings["total_ms"] > 0 and panel.n_updates >= 1


def test_audit_panel_shows_the_trace(smollm_capture):
    from workbench.analyse.procedure import trace
    from workbench.analyse.selection import target_tokens

    cap = smollm_capture
    panel = Wd.AuditPanel(cap, certify=True)
    # with the LP on, only its inputs wait for the release; everything else follows the drag
    assert not panel.controls["eps_row"].continuous_update and not panel.controls["m0"].continuous_update
    assert panel.controls["zeta"].continuous_update and panel.controls["eps_audit"].continuous_update
    panel.set(target=0.1, eps_row=0.6, eps_audit=0.9, streak=0, audit_mode="sampled", m_a=300, delta=0.2,
              d_max=0.8, priority="mass", seed=3)
    params = EntroPrefillParams(**{k: v for k, v in panel.params().items() if k != "certify"})
    assert params.audit_mode == "sampled" and params.m_a == 300 and params.seed == 3
    tr = trace(cap, params, certify=True)
    assert_shows(panel.figures["trace"], plots.trace_layers(tr))
    assert_shows(panel.figures["certificate"], plots.certificate(tr, target_tokens(0.1, cap.spans.N)))
    assert tr.decision.split(":")[0] in panel.status.value
    # certificates off: U is NaN everywhere in the trace figure, and every slider follows the drag
    panel.controls["certify"].value = False
    assert panel.controls["zeta"].continuous_update and panel.controls["eps_row"].continuous_update
    tr2 = trace(cap, params, certify=False)
    assert_shows(panel.figures["trace"], plots.trace_layers(tr2))


def test_shift_and_pages_panels(smollm_capture):
    from workbench.analyse.pages import PageScoreMemo, PageSelection
    from workbench.analyse.shift import ShiftAnalysis

    cap = smollm_capture
    sp = Wd.ShiftPanel(cap)
    sp.set(k=10, ref_start=2, W=8)
    assert_shows(sp.figures["shift"], plots.shift_steps(ShiftAnalysis(k=10, ref_start=2, W=8)(cap)))
    sp.set(level="head", layer=4)
    assert_shows(sp.figures["shift"], plots.shift_steps(ShiftAnalysis(k=10, ref_start=2, W=8)(cap), level="head", layer=4))
    pp = Wd.PagesPanel(cap)
    pp.set(page=8, K=5, zeta=0.7, layer=3)
    pool = EntroPrefillParams(zeta=0.7, tau=pp.params()["tau"]).pooling()(cap)
    pr = PageSelection(b=8, K=5).select(pool.a, pool.w, cap.head_group, 64)
    # the panel takes the slider path (PageScoreMemo: equal to the direct group scores to float64 rounding,
    # tests/test_pages.py); its figure is the one of that path, and its selection the direct one's here
    fast = PageSelection(b=8, K=5).select(pool.a, pool.w, cap.head_group, 64, memo=PageScoreMemo(pool.a, cap.head_group),
                                          pooling=pool)
    assert torch.equal(fast.selected, pr.selected)
    torch.testing.assert_close(fast.p, pr.p, rtol=1e-12, atol=1e-15)
    assert_shows(pp.figures["pages"], plots.pages(fast, 3, cap.spans))
    assert f"page union U = {int(pr.U[3])}" in pp.status.value


# ----------------------------------------------------------------------------- clamping
EP_SLIDERS = ("zeta", "tau", "eps_s", "lam", "target", "eps_row", "delta", "m_a", "eps_audit", "d_max", "streak", "seed")


@pytest.mark.parametrize("name", EP_SLIDERS)
def test_slider_range_clamps_to_valid_parameters(name):
    spec = Wd.SLIDERS[name]
    w = spec.make()
    for bad in (-1e9, -1.0, 0, 1e9):
        w.value = int(bad) if spec.kind == "int" else float(bad)
        v = w.value
        assert spec.lo - 1e-12 <= v <= spec.hi * (1 + 1e-12)
        EntroPrefillParams(**{name: v})  # valid: no ValueError
    # both ends of the range are valid, and a value outside the validity range is not reachable
    EntroPrefillParams(**{name: spec.lo if spec.kind != "int" else int(spec.lo)})
    EntroPrefillParams(**{name: spec.hi if spec.kind != "int" else int(spec.hi)})


def test_panel_clamps_bad_values(smollm_capture):
    cap = smollm_capture
    panel = Wd.PriorityPanel(cap)
    panel.set(zeta=7.0, eps_row=0.0, m0=10_000, layer=-4, target=3.0)
    p = panel.params()
    assert p["zeta"] == 1.0 and p["m0"] == cap.spans.k and p["layer"] == 0 and p["target"] == 1.0
    assert 0 < p["eps_row"] <= 1
    ep = EntroPrefillParams(**{k: v for k, v in p.items() if k not in ("layer", "certify")})
    assert ep.m0 == cap.spans.k
    assert panel.error is None and panel.figures["priorities"].layout.meta["layer"] == 0
    with pytest.raises(ValueError, match="unknown controls"):
        panel.set(zeta_typo=0.3)


def test_other_slider_ranges_are_valid(tiny):
    from workbench.analyse.pages import PageSelection
    from workbench.rerun.eviction import DeferKV, PageEntroKV

    for v in (-100.0, 100.0):
        w = Wd.SLIDERS["defer_lam"].make()
        w.value = v
        DeferKV(lam=w.value)
    for v in (-5, 0, 10_000):
        w = Wd.SLIDERS["page"].make()
        w.value = v
        PageSelection(b=w.value)
        PageEntroKV(page=w.value)
    lm, spans, cap = tiny
    ev = Wd.EvictionPanel(cap, lm, spans, recent=8)
    ev.controls["budget"].value = 0
    assert ev.controls["budget"].value == spans.n_sink + 8  # the protected count: the smallest valid budget
    ev.controls["budget"].value = 10**6
    assert ev.controls["budget"].value == spans.T


# ----------------------------------------------------------------------------- run-again panels (tiny model)
def test_prune_panel_sliders_never_call_the_model_and_runs_are_cached(tiny, counter):
    from workbench.analyse.procedure import trace
    from workbench.rerun.prune import run_full, run_pruned

    lm, spans, cap = tiny
    base = EntroPrefillParams(target=0.2, eps_row=0.9, eps_audit=1.0, streak=0)
    panel = Wd.PrunePanel(cap, lm, spans, base, max_new_tokens=4)
    counter.armed = True
    assert _move_everything(panel) >= 10
    panel.set(target=0.25, eps_row=0.9, eps_audit=1.0, streak=0, m0=1, mode="adaptive")
    counter.armed = False
    assert counter.forwards == 0 and panel.model_calls == 0
    params = base.replace(**{k: v for k, v in panel.params().items() if k not in ("mode", "run_layer")})
    assert_shows(panel.figures["trace"], plots.trace_layers(trace(cap, params, certify=False)))

    first_figures = set(panel.figures)
    panel.run_button.click()
    panel.wait(120)  # the button runs in the panel's worker thread
    assert counter.prefills == 2 and panel.model_calls == 2  # full + pruned
    assert panel.progress.value == panel.progress.max
    panel.run_button.click()
    panel.wait(120)
    assert counter.prefills == 2 and panel.model_calls == 2  # cached
    pruned, full = panel.last_pruned, panel.last_full
    ref = run_pruned(lm, spans, params, max_new_tokens=4, progress=False)
    ref_full = run_full(lm, spans, max_new_tokens=4)
    assert pruned.generated_ids == ref.generated_ids and pruned.l_star == ref.l_star
    assert full.generated_ids == ref_full.generated_ids
    assert str(ref.generated_ids) in panel.answers.value and str(ref_full.generated_ids) in panel.answers.value
    n = counter.prefills
    panel.set(mode="fixed layer", run_layer=1, target=0.5, m0=0)
    assert counter.prefills == n
    panel.run()
    assert counter.prefills == n + 1 and panel.model_calls == 3  # only the new pruned run
    assert panel.last_pruned.l_star == 1 and panel.last_pruned.mode == "fixed"
    assert "drift" not in first_figures and panel.last_stability is not None  # the drift joined on this run
    assert_shows(panel.figures["drift"], plots.drift(panel.last_stability))
    assert panel.figures["drift"] in panel._figure_box.children   # in the figure row (was: the export row)
    # auto-run: a parameter change runs once, a return to a cached set does not
    panel.auto.value = True
    panel.wait(120)
    assert counter.prefills == n + 1  # current parameters are cached
    panel.controls["target"].value = 0.8
    panel.wait(120)
    assert counter.prefills == n + 2
    panel.controls["target"].value = 0.5
    panel.wait(120)
    assert counter.prefills == n + 2


def test_eviction_panel_preview_and_cached_runs(tiny, counter):
    from workbench.rerun.eviction import DeferKV, Evidence, SnapKV, generate_with_policy, select_keep

    lm, spans, cap = tiny
    panel = Wd.EvictionPanel(cap, lm, spans, policy="deferkv", recent=8, max_new_tokens=4)
    counter.armed = True
    panel.set(budget=20, defer_lam=0.7)
    _move_everything(panel, skip=("policy",))
    panel.set(policy="snapkv", budget=25)
    counter.armed = False
    assert counter.forwards == 0
    ev = Evidence.from_capture(cap)
    pol = SnapKV(n_sink=spans.n_sink, recent=8, window=16)
    kept = select_keep(pol.scores(ev), 25, pol.protected(spans.T))
    prev = panel.analysis()
    assert torch.equal(prev.kept, kept)
    assert_shows(panel.figures["kept"], plots.kept_positions([prev], spans, highlight=panel.highlight(),
                                                             highlight_name="answer doc"))
    panel.set(policy="deferkv", budget=22, defer_lam=0.5)
    assert panel.policy() == DeferKV(n_sink=spans.n_sink, recent=8, window=16, lam=0.5)

    res = panel.run()
    # session + full cache + this run + this run teacher-forced on the full answer (its divergence)
    assert counter.prefills == 1 and panel.model_calls == 4
    f = counter.forwards
    panel.run()
    assert counter.forwards == f and panel.model_calls == 4
    ref = generate_with_policy(lm, spans, DeferKV(n_sink=spans.n_sink, recent=8, window=16, lam=0.5), 22, 4,
                               progress=False)
    assert res.ids == ref.ids
    assert torch.equal(res.kept[..., :22], ref.kept[..., :22])
    assert str(res.ids) in panel.answers.value and "full cache" in panel.answers.value
    f = counter.prefills
    panel.set(budget=30)
    panel.run()
    assert counter.prefills == f and panel.model_calls == 6  # decoding only, the prefill is shared


def test_eviction_panel_without_a_preview_says_so(tiny):
    """A policy whose scores need evidence a capture does not hold (H2O: column sums) has no preview: the
    kept figure is empty with the reason in its meta and on the figure (no stale preview of the previous
    policy), and the status names the budget the run would use."""
    lm, spans, cap = tiny
    panel = Wd.EvictionPanel(cap, lm, spans, policy="snapkv", recent=8, max_new_tokens=2)
    assert len(panel.figures["kept"].data) >= 1                    # a preview
    panel.set(policy="h2o", budget=20)
    assert panel.analysis() is None
    kept = panel.figures["kept"]
    assert len(kept.data) == 0 and "no preview" in kept.layout.meta["placeholder"]
    assert kept.layout.meta["policy"] == "h2o" and kept.layout.meta["budget"] == 20
    # the note is written in short lines (it ran past a one-column canvas): read across its line breaks
    assert "no preview" in kept.layout.annotations[0].text.replace("<br>", " ") and "B = 20" in panel.status.value
    panel.set(budget=24)
    assert "B = 24" in panel.status.value and kept.layout.meta["budget"] == 24
    panel.set(policy="snapkv")
    assert len(panel.figures["kept"].data) >= 1 and "placeholder" not in (panel.figures["kept"].layout.meta or {})


def test_export_all_delegates(smollm_capture, monkeypatch, tmp_path):
    import workbench.show.export as E

    seen = {}

    def fake(figures, folder, **kw):
        seen.update(figures=figures, folder=folder, kw=kw)
        return {n: [] for n in figures}

    monkeypatch.setattr(E, "export_all", fake)
    panel = Wd.HeadsPanel(smollm_capture)
    panel.set(zeta=0.4)
    out = panel.export_all(tmp_path, formats=("svg",))
    assert set(out) == {"heads", "residual"} and seen["folder"] == tmp_path
    assert seen["kw"]["formats"] == ("svg",)
    assert seen["kw"]["params"]["zeta"] == pytest.approx(0.4) and seen["kw"]["params"]["panel"] == "HeadsPanel"
    for name, fig in seen["figures"].items():
        assert type(fig) is go.Figure
        assert_shows(panel.figures[name], fig)


def test_front_end_messages_are_strict_json(tiny, monkeypatch):
    """What reaches the browser is strict JSON (no NaN/Infinity, which jupyter_client rejects with a
    warning): every figure's state and every update message of every panel, over slider moves and runs."""
    import json as _json

    import plotly.basewidget as bw
    from plotly.serializers import _py_to_js

    from workbench.show.figure_widget import _to_js

    lm, spans, cap = tiny
    sent = []
    orig = bw.BaseFigureWidget._send_update_msg

    def spy(self, restyle_data, relayout_data, trace_indexes=None, source_view_id=None):
        sent.append({"restyle": restyle_data, "relayout": relayout_data})
        return orig(self, restyle_data, relayout_data, trace_indexes, source_view_id)

    monkeypatch.setattr(bw.BaseFigureWidget, "_send_update_msg", spy)
    base = EntroPrefillParams(target=0.2, eps_row=0.9, eps_audit=1.0, streak=0)
    panels = [Wd.HeadsPanel(cap, base), Wd.PriorityPanel(cap, base), Wd.AuditPanel(cap, base, certify=True),
              Wd.ShiftPanel(cap, k=4), Wd.PagesPanel(cap, base, s=4),
              Wd.PrunePanel(cap, lm, spans, base, max_new_tokens=2), Wd.EvictionPanel(cap, lm, spans, budget=20, max_new_tokens=2),
              Wd.CounterexamplePanel()]
    panels[5].set(mode="fixed layer", run_layer=1, target=0.5, m0=0)
    panels[5].run()
    panels[6].run()
    for p in panels:
        for _ in range(2):
            assert _move_everything(p, skip=("certify",)) >= 1
    assert len(sent) > 20
    for p in panels:
        for name, fw in p.figures.items():
            to_js = fw.trait_metadata("_widget_data", "to_json") if hasattr(fw, "_widget_data") else None
            state = (to_js or _py_to_js)({"data": fw._widget_data, "layout": fw._widget_layout}, None)
            _json.dumps(state, allow_nan=False, default=lambda o: "<buffer>")
    for msg in sent:
        _json.dumps(_to_js(msg, None), allow_nan=False, default=lambda o: "<buffer>")


def _sent(fw) -> list[tuple[dict, list]]:
    """Spy on a FigureWidget's comm: every message it sends, as ``(data, buffers)``."""
    out = []
    fw.comm.send = lambda data=None, metadata=None, buffers=None: out.append((data, list(buffers or [])))
    return out


def _at(state, path):
    for k in path:
        state = state[k]
    return state


def test_figure_arrays_travel_as_binary_buffers():
    """Numeric arrays reach the browser as binary buffers, 2-D ones included: a heatmap's ``z``
    ``[rows, columns]`` as one buffer per row (plotly's serializer sends it as JSON lists of numbers), int64 as
    int32 (or float64 where a value does not fit int32), NaN kept; strings stay JSON. Checked on the comm's
    first state and on a ``plotly_update`` message, values decoded from the buffers as the browser reads them."""
    from ipywidgets.widgets.widget import _remove_buffers

    from workbench.show.figure_engine import update_figure
    from workbench.show.figure_widget import FigureWidget

    rng = np.random.default_rng(0)
    z = rng.random((7, 5))
    z[2, 3] = np.nan
    big = np.array([0, 2**40, -3], dtype=np.int64)
    fw = FigureWidget([go.Heatmap(z=z, x=np.arange(5, dtype=np.int64), y=list("abcdefg")),
                       go.Scatter(x=big, y=np.linspace(0, 1, 3), text=["p", "q", "r"])])

    def decoded(state, paths, buffers):
        """{path: array} as the front end makes them: each buffer a typed array of its dtype."""
        return {tuple(pth): np.frombuffer(bytes(b), dtype=_at(state, pth[:-1])["dtype"])
                for pth, b in zip(paths, buffers)}

    state, paths, buffers = _remove_buffers(fw.get_state())
    got = decoded(state, paths, buffers)
    rows = [got[("_widget_data", 0, "z", r, "buffer")] for r in range(7)]
    np.testing.assert_array_equal(np.vstack(rows), z)                      # NaN in place (assert_array_equal: NaN == NaN)
    assert {str(a.dtype) for a in rows} == {"float64"}
    x = got[("_widget_data", 0, "x", "buffer")]
    assert x.dtype == np.int32 and x.tolist() == list(range(5))
    bx = got[("_widget_data", 1, "x", "buffer")]
    assert bx.dtype == np.float64 and bx.tolist() == [0.0, 2.0**40, -3.0]  # does not fit int32: exact as float64
    assert state["_widget_data"][0]["y"] == list("abcdefg") and state["_widget_data"][1]["text"] == ["p", "q", "r"]
    # plotly's own serializer, for contrast: the 2-D z as nested JSON lists, the int64 x as a list
    plain = go.FigureWidget(go.Heatmap(z=z, x=np.arange(5, dtype=np.int64)))
    pstate, _, pbuf = _remove_buffers(plain.get_state())
    assert isinstance(pstate["_widget_data"][0]["z"][0], list) and isinstance(pstate["_widget_data"][0]["x"], list)

    # a slider move's update: the new z travels as buffers too
    msgs = _sent(fw)
    z2 = rng.random((7, 5))
    assert update_figure(fw, go.Figure([go.Heatmap(z=z2, x=np.arange(5, dtype=np.int64), y=list("abcdefg")),
                                        go.Scatter(x=big, y=np.linspace(0, 2, 3), text=["p", "q", "r"])]))
    upd = [(d, b) for d, b in msgs if "_py2js_update" in d["state"] and d["state"]["_py2js_update"]]
    assert len(upd) == 1
    data, bufs = upd[0]
    got = decoded(data["state"], data["buffer_paths"], bufs)
    zrows = sorted((k for k in got if "z" in k), key=lambda k: k[-2])
    assert len(zrows) == 7
    np.testing.assert_array_equal(np.vstack([got[k] for k in zrows]), z2)
    assert sum(memoryview(b).nbytes for b in bufs) >= z2.nbytes


@pytest.mark.skipif(public_only(), reason="the workbench FigureWidget's own behaviour; the forced public fallback "
                    "shows plotly's stock widget instead (show.private_compat)")
def test_every_widget_opens_its_comm_with_what_it_shows(tiny, monkeypatch):
    """The browser model of every figure is born with the figure: the comm of each panel's
    FigureWidget opens with its traces, title and ``uirevision`` as state, and the token view with its HTML.
    A plain ``go.FigureWidget`` opens empty and sends the figure in a later message, which anywidget can
    hold until after a view has drawn the empty state (bare axes, inert sliders); the control below shows
    that this test would see that."""
    import comm
    import ipywidgets.widgets.widget as ww
    from ipywidgets.widgets.widget import _remove_buffers

    from workbench.show.figure_widget import FigureWidget

    opened = {}
    orig = comm.create_comm

    def spy(**kw):
        c = orig(**kw)
        opened[c.comm_id] = kw["data"]["state"]
        return c

    monkeypatch.setattr(ww.comm, "create_comm", spy)
    lm, spans, cap = tiny
    base = EntroPrefillParams(target=0.2, eps_row=0.9, eps_audit=1.0, streak=0)

    def check(figures) -> int:
        """Each figure's comm opened with what the widget holds now (no edit since)."""
        for name, fw in figures.items():
            state = opened[fw._model_id]
            if isinstance(fw, Wd.TokenWidget):  # a box: its HTML widget's comm opens with the view's HTML
                assert state["children"] == [f"IPY_MODEL_{fw._shown.model_id}", f"IPY_MODEL_{fw._relay.model_id}"]
                assert opened[fw._shown.model_id]["value"] == fw.html and fw.view.html() in fw.html, name
                continue
            assert isinstance(fw, FigureWidget), name
            assert len(state["_widget_data"]) == len(fw.data) >= 1, name
            assert [t["type"] for t in state["_widget_data"]] == [t.type for t in fw.data], name
            lay = state["_widget_layout"]
            assert lay["uirevision"] == name and lay["title"]["text"] == fw.layout.title.text, name
        return len(figures)

    n = sum(check(p.figures) for p in (
        Wd.HeadsPanel(cap, base), Wd.PriorityPanel(cap, base), Wd.AuditPanel(cap, base, certify=True),
        Wd.ShiftPanel(cap, k=4), Wd.PagesPanel(cap, base, s=4), Wd.TokenPanel(cap), Wd.CounterexamplePanel()))
    prune = Wd.PrunePanel(cap, lm, spans, base, max_new_tokens=2)
    n += check(prune.figures)
    before = set(prune.figures)
    prune.set(mode="fixed layer", run_layer=1, target=0.5, m0=0)
    prune.run()                                        # a figure that joins the panel after the first run
    added = {k: v for k, v in prune.figures.items() if k not in before}
    assert added
    n += check(added)
    assert n >= 14
    # one copy of plotly's 5 MB bundle per kernel, not one per figure: each figure's ES module is the small
    # loader, naming the bundle's widget and its sha256
    import hashlib

    from workbench.show.figure_widget import _LOADER_ESM, _plotly_bundle
    holder, sha = _plotly_bundle()
    assert holder.source == str(go.FigureWidget._esm) and len(holder.source) > 1_000_000
    assert sha == hashlib.sha256(holder.source.encode()).hexdigest()
    states = [s for s in opened.values() if "_bundle_sha" in s]
    assert len(states) >= 12 and all(s["_esm"] == _LOADER_ESM and len(s["_esm"]) < 10_000 for s in states)
    assert {(s["_bundle_model"], s["_bundle_sha"]) for s in states} == {(f"IPY_MODEL_{holder.model_id}", sha)}
    old = holder.model_id
    holder.close()                                     # closed (Widget.close_all): the next figure makes another
    again = FigureWidget(go.Scatter(y=[1, 2]))
    assert again._bundle_model.startswith("IPY_MODEL_") and again._bundle_model != f"IPY_MODEL_{old}"
    assert again._bundle_sha == sha
    control = go.FigureWidget(go.Scatter(y=[1, 2, 3]))
    assert opened[control._model_id]["_widget_data"] == []        # plotly's own: the comm opens empty
    assert len(_remove_buffers(control.get_state())[0]["_widget_data"]) == 1


# ----------------------------------------------------------------------------- no inert slider
def _fingerprint(panel) -> str:
    import json

    figs = []
    for fw in panel.figures.values():
        if isinstance(fw, Wd.TokenWidget):  # the token view: its HTML is what is shown
            figs.append(fw.html)
            continue
        d = json.loads(fw.to_json())
        d["layout"].pop("meta", None)  # the parameters written beside an export: not something shown
        for key in ("annotations", "shapes"):  # an emptied list draws what no list draws
            if d["layout"].get(key) == []:
                d["layout"].pop(key)
        figs.append(json.dumps(d, sort_keys=True))
    return "|".join(figs) + "#" + panel.status.value


def _ends(w) -> tuple:
    import ipywidgets as W

    if isinstance(w, W.FloatLogSlider):
        return w.base ** w.min, w.base ** w.max
    return w.min, w.max


NB05 = dict(zeta=0.5, tau=1.0, target=0.25, eps_row=0.2, streak=1, eps_audit=0.2, audit_mode="exact")


@pytest.mark.parametrize("make", [
    lambda cap: Wd.HeadsPanel(cap), lambda cap: Wd.PriorityPanel(cap),
    lambda cap: Wd.AuditPanel(cap, EntroPrefillParams(**NB05), certify=False),
    lambda cap: Wd.AuditPanel(cap, EntroPrefillParams(**{**NB05, "audit_mode": "sampled", "m_a": 32}), certify=False),
    lambda cap: Wd.ShiftPanel(cap), lambda cap: Wd.PagesPanel(cap), lambda cap: Wd.TokenPanel(cap)],
    ids=["heads", "priority", "audit-exact", "audit-sampled", "shift", "pages", "tokens"])
def test_every_shown_control_changes_a_figure_or_the_status(smollm_capture, make):
    """A control that is shown and moves nothing misleads (issue: δ in the exact audit, m₀ with nothing
    removed): each visible, enabled slider moved to one end (or else the other), each dropdown set to its
    other options, each check box flipped, from the panel's start, changes a figure's data or the status;
    the hidden or disabled ones are the ones that could not. Every dropdown shows its value (a label)."""
    _assert_every_shown_control_moves_something(make(smollm_capture))


def test_counterexample_panel_controls_each_change_a_figure_or_the_status():
    """The same for the panel without a capture (notebook 10): ε moves the rows and the audit, γ the rows,
    the logits and the errors."""
    _assert_every_shown_control_moves_something(Wd.CounterexamplePanel())


def _assert_every_shown_control_moves_something(panel) -> None:
    import ipywidgets as W

    start = panel.params()
    base = _fingerprint(panel)
    inert = []
    for name, w in panel.controls.items():
        if w.disabled or w.layout.display == "none":
            assert w.tooltip, f"{name}: hidden or disabled without a reason in its tooltip"
            continue
        if isinstance(w, W.widgets.widget_int._Int | W.widgets.widget_float._Float):
            tries = _ends(w)
        elif isinstance(w, W.Dropdown):
            assert w.label not in (None, ""), f"{name}: the dropdown shows a blank"
            tries = [v for v in w._options_values if v != w.value]
        elif isinstance(w, W.Checkbox):
            tries = [not w.value]
        else:
            continue
        moved = False
        for v in tries:
            panel.set(**{name: v})
            if panel.params()[name] != start[name] and _fingerprint(panel) != base:
                moved = True
                break
        panel.set(**{name: start[name]})
        now = _fingerprint(panel)
        at = next((i for i, (x, y) in enumerate(zip(now, base)) if x != y), None)
        assert now == base, (f"{name}: back at its start value, the panel does not show the start: "
                             f"{base[max(0, (at or 0) - 150):(at or 0) + 150]!r} vs {now[max(0, (at or 0) - 150):(at or 0) + 150]!r}")
        if not moved:
            inert.append(name)
    assert not inert, f"shown controls that change nothing: {inert}"



def _synthetic_capture(seed: int = 0):
    """A small synthetic capture of a 5-chunk prompt (no model)."""
    from workbench.capture.data import Capture
    from workbench.run.spans import PromptSpans

    spans = PromptSpans.synthetic([8, 6, 9, 7, 5], answer_doc=2)
    return Capture.synthetic(spans, L=4, H_Q=6, G=2, seed=seed, concentration=2.0)


@pytest.mark.skipif(public_only(), reason="the workbench FigureWidget's own behaviour; the forced public fallback "
                    "shows plotly's stock widget instead (show.private_compat)")
def test_figures_follow_the_room_the_page_reports():
    """A figure's view reports the width of the box that holds it (``_view_width``): the panel lays every figure out
    again at :func:`~workbench.show.widgets.base.live_width` of it (the room, capped at ``FIGURE_WIDTH``, floored at
    ``MIN_FIGURE_WIDTH``), the paper rules applied there; a slider move afterwards keeps that width."""
    from workbench.show.widgets.base import FIGURE_WIDTH, MIN_FIGURE_WIDTH

    panel = Wd.HeadsPanel(_synthetic_capture(), layer=1)
    widths = lambda: {n: fw.layout.width for n, fw in panel.figures.items()}  # noqa: E731
    assert set(widths().values()) == {FIGURE_WIDTH} and panel.live_width == FIGURE_WIDTH
    heights = {n: fw.layout.height for n, fw in panel.figures.items()}
    n0 = panel.n_updates
    first = next(iter(panel.figures.values()))
    first._view_width = 568                      # a 1000 px window with JupyterLab's file browser open
    assert set(widths().values()) == {568} and panel.n_updates == n0 + 1
    assert all(fw.layout.height <= heights[n] for n, fw in panel.figures.items())
    for fw in panel.figures.values():            # the other views report the same room: nothing more to do
        fw._view_width = 568
    assert panel.n_updates == n0 + 1
    panel.set(layer=2)
    assert set(widths().values()) == {568}
    first._view_width = 200
    assert set(widths().values()) == {MIN_FIGURE_WIDTH}
    first._view_width = 1300
    assert set(widths().values()) == {FIGURE_WIDTH}


def _relayed(content: dict, buffers: list) -> list[dict]:
    """A relayed message's states with their buffers put back (what ``_LOADER_ESM``'s ``relayed`` does in the page)."""
    states = copy.deepcopy(content["states"])
    for path, buf in zip(content["buffer_paths"], buffers, strict=True):
        obj = states
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = buf
    return states


def _array(v) -> np.ndarray:
    """A serialized array (``{"buffer", "dtype", "shape"}``, a list of such rows, or plain numbers) as numpy."""
    if isinstance(v, dict) and "buffer" in v:
        return np.frombuffer(v["buffer"], dtype=v["dtype"]).reshape(v["shape"])
    if isinstance(v, list) and v and isinstance(v[0], dict):
        return np.stack([_array(r) for r in v])
    return np.asarray(v, dtype=float)


@pytest.mark.skipif(public_only(), reason="the workbench FigureWidget's own behaviour; the forced public fallback "
                    "shows plotly's stock widget instead (show.private_compat)")
def test_a_deaf_figure_gets_its_figure_and_every_change_through_the_bundles_widget(monkeypatch):
    """The page's probe (``figure_widget._LOADER_ESM``): a figure answers it on its own model (``_probe``), then on the
    bundle's widget (``{"ack": id}``, a plain model anywidget never holds). When the page reports an instance of the
    figure's model deaf (anywidget gave up on it: it drops every message of its comm), the kernel sends that instance
    the figure as it is now (its traces replaced, its layout replaced, stale layout keys removed) and from then on
    every change, through the bundle's widget; its own comm is spared while no instance can hear it, and used again
    once one can (a reloaded page)."""
    panel = Wd.HeadsPanel(_synthetic_capture(), layer=1)
    fw = panel.figures["heads"] if "heads" in panel.figures else next(iter(panel.figures.values()))
    relays, comm = [], []
    monkeypatch.setattr(type(fw._holder), "send", lambda self, content, buffers=None: relays.append((content, buffers)))
    monkeypatch.setattr(fw, "_send", lambda msg, buffers=None: comm.append(msg))
    fw._from_page(fw, {"event": "probe", "id": "p1"}, [])
    assert fw._probe == "p1" and relays == [({"ack": "p1"}, None)]
    assert [m["state"] for m in comm] == [{"_probe": "p1"}]              # probing: the comm is used
    relays.clear(), comm.clear()
    fw._from_page(fw, {"event": "deaf", "id": "p1", "traces": 5, "layout_keys": ["title", "gone"]}, [])
    assert comm == [] and len(relays) == 1 and relays[0][0]["relay"] == ["p1"]
    states = _relayed(*relays[0])
    names = [next(iter(st)) for st in states]
    assert names == ["_py2js_deleteTraces", "_py2js_deleteTraces", "_py2js_addTraces", "_py2js_addTraces",
                     "_py2js_relayout", "_py2js_relayout", "_hidden"]
    assert [st[n] for st, n in zip(states, names, strict=True)][1::2][:3] == [None, None, None]
    assert states[0]["_py2js_deleteTraces"]["delete_inds"] == [0, 1, 2, 3, 4]
    added = states[2]["_py2js_addTraces"]["trace_data"]
    assert any(t.z is not None for t in fw.data)
    assert [t["type"] for t in added] == [t.type for t in fw.data]
    for t, trace in zip(added, fw.data, strict=True):
        if trace.z is not None:
            np.testing.assert_array_equal(_array(t["z"]), np.asarray(trace.z, dtype=float))
    relayout = states[4]["_py2js_relayout"]["relayout_data"]
    assert relayout["gone"] is None and "title" in relayout
    assert relayout["title"]["text"] == fw.layout.title.text and relayout["width"] == fw.layout.width
    assert states[2]["_py2js_addTraces"]["trace_edit_id"] == fw._last_trace_edit_id   # its view's deltas are taken
    assert states[-1] == {"_hidden": False}
    relays.clear()
    panel.set(zeta=0.05)                                                 # a slider: the change goes through the relay
    assert comm == [] and relays, relays
    sent = [st for c, b in relays for st in _relayed(c, b)]
    assert all(c["relay"] == ["p1"] for c, _ in relays)
    update = next(st["_py2js_update"] for st in sent if st.get("_py2js_update"))
    zs = [z for z in update["style_data"].get("z", [])]
    assert zs and any(np.array_equal(_array(z), np.asarray(t.z, dtype=float)) for z in zs for t in fw.data
                      if t.z is not None)
    assert {"_py2js_update": None} in sent                                # then None, as plotly sends it
    relays.clear(), comm.clear()
    fw._from_page(fw, {"event": "probe", "id": "p2"}, [])                 # a reloaded page: a healthy instance
    fw._from_page(fw, {"event": "heard", "id": "p2"}, [])
    panel.set(zeta=0.5)
    assert any("_py2js_update" in m["state"] for m in comm)              # the comm again, for p2
    assert any(c.get("relay") == ["p1"] for c, _ in relays)              # and still the relay, for p1


def test_sidecar_params_drop_the_float_noise_of_sliders(monkeypatch):
    """A float slider's value as the sidecar records it: ζ moved to 0.35 is 0.35, not the widget's
    0.35000000000000003; a log slider's value and one off the step grid keep 12 significant digits (what the
    panel computed with); ``params()`` stays exact (it rebuilds what was computed)."""
    cap = Capture.synthetic(PromptSpans.synthetic([8, 6, 9], answer_doc=0), L=3, H_Q=4, G=2, seed=0)
    panel = Wd.PriorityPanel(cap, layer=1)
    panel.controls["zeta"].value = 0.35000000000000003
    panel.controls["tau"].value = 10 ** -0.95
    p = panel.sidecar_params()
    assert p["panel"] == "PriorityPanel" and repr(p["zeta"]) == "0.35" and p["tau"] == 0.11220184543
    assert p["m0"] == panel.controls["m0"].value and '"zeta": 0.35,' in json.dumps(p)
    assert panel.params()["zeta"] == 0.35000000000000003
    panel.controls["zeta"].value = 0.604  # set from code: off the 0.01 grid, and used so
    assert panel.sidecar_params()["zeta"] == 0.604
    seen = {}
    monkeypatch.setattr(export, "export_all", lambda figs, folder, **kw: seen.update(kw))
    panel.export_all("unused")
    assert seen["params"] == panel.sidecar_params()


def test_slider_labels_fit_their_column():
    """The widget cuts a label wider than its column with "…" (03's saving target, 07's reference row): every
    slider label fits at 0.62 of the 13 px widget font per character (DejaVu Sans, generous)."""
    wide = {k: s.label for k, s in SLIDERS.items() if len(s.label) * 0.62 * 13 > LABEL_PX}
    assert not wide

