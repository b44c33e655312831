"""The paper rules in every state a slider reaches: each panel the notebooks use, built in this process on the
synthetic captures (the default model's shape: 30 layers, 9 heads in 3 groups; and a T = 33k prompt), with each
of its shown sliders moved to its minimum and to its maximum (one at a time, the others at their defaults); every
figure of the panel in each state exported at one and at two columns (SVG, by :func:`workbench.show.export.export`,
what the panels' export button writes) and the files checked: no overlap, overflow or text on a plot area
(``tests/_layout_rules.py``), and the paper rules (plot areas ≥ 55 % of the height, legend ≤ 25 %, no text under
7 pt: :func:`test_figure_layout.paper_rule_misses`).

A figure that is the same in two states (a slider that does not touch it) is exported once. The run panels
(``PrunePanel``, ``EvictionPanel``) are built without a model: their sliders move the preview from the capture,
which is what their figures show until *Run* is pressed. ``tests/test_browser.py`` checks the live figures in
JupyterLab; this checks the files a user exports from the same states."""
from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import plotly.graph_objects as go
import pytest
from _all_figures import _gen, synthetic_inputs
from _layout_rules import whole_axes
from test_figure_layout import export_problems
from test_figure_layout import page as page  # noqa: F401 - the chromium page fixture

from workbench.analyse.params import EntroPrefillParams
from workbench.capture import RowSet, run_capture
from workbench.capture.data import Capture
from workbench.rerun.stability import StabilityResult
from workbench.run.spans import PromptSpans
from workbench.show import export as ex
from workbench.show import plots
from workbench.show import widgets as Wd

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ex.browser_path() is None, reason="no chromium")]

WIDTHS = ("single", "double")

#: panel → how a notebook builds it on ``(spans, capture, params)``
PANELS = {
    "token": lambda sp, c, p: Wd.TokenPanel(c, layer=c.L // 2),
    "heads": lambda sp, c, p: Wd.HeadsPanel(c),
    "priority": lambda sp, c, p: Wd.PriorityPanel(c, p),
    "audit": lambda sp, c, p: Wd.AuditPanel(c, p),
    "prune": lambda sp, c, p: Wd.PrunePanel(c, None, SimpleNamespace(spans=sp), p, max_new_tokens=8),
    "shift": lambda sp, c, p: Wd.ShiftPanel(c, k=32),
    "eviction": lambda sp, c, p: Wd.EvictionPanel(c, None, SimpleNamespace(spans=sp), budget=64),
    # a policy a capture cannot preview (H2O's column sums): the kept figure is the note saying why, at every budget
    "eviction-no-preview": lambda sp, c, p: Wd.EvictionPanel(c, None, SimpleNamespace(spans=sp), policy="h2o",
                                                             budget=64),
    "pages": lambda sp, c, p: Wd.PagesPanel(c, p, s=32),
    "counterexample": lambda sp, c, p: Wd.CounterexamplePanel(),
}
#: the panels the T = 33k prompt is shown in (the long-prompt notebook cells of ``tests/test_browser.py``)
LONG_PANELS = ("heads", "pages", "token")

#: ``panel → reason``: the states known to break a rule, each named (an xfail, never a skip)
KNOWN: dict[str, str] = {}


@pytest.fixture(scope="module")
def syn():
    return synthetic_inputs(L=30, H_Q=9, G=3)


@pytest.fixture(scope="module")
def long():
    sp = PromptSpans.synthetic([64] * 510, query_len=16, answer_doc=100)
    return sp, Capture.synthetic(sp, L=4, H_Q=6, G=2, seed=0, concentration=2.0), None


def slider_states(panel):
    """``[(state name, {control: value})]``: the defaults, then each shown slider at its min and its max."""
    out = [("default", {})]
    for name, w in panel.controls.items():
        if w.layout.display == "none" or not hasattr(w, "max") or w.disabled:
            continue
        for end in ("min", "max"):
            v = getattr(w, end)
            if v != w.value:
                out.append((f"{name}={end} ({v:g})", {name: v}))
    return out


def _key(fig) -> str:
    if isinstance(fig, Wd.TokenWidget):
        text = fig.view.html()
    else:
        text = json.dumps(go.Figure(fig).to_dict(), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()


def _check(panel, state, pg, tmp_path, seen, found) -> None:
    """Export every figure of ``panel`` (once per distinct content) at both widths and record what breaks."""
    for name, fw in panel.figures.items():
        if getattr(fw, "_hidden", False) or getattr(getattr(fw, "layout", None), "display", None) == "none":
            continue              # a figure the panel set aside (a mode switched off): not shown, not exported
        key = _key(fw)
        if key in seen:
            continue
        seen.add(key)
        fig = fw.view if isinstance(fw, Wd.TokenWidget) else go.Figure(fw)
        stem = tmp_path / f"{name}-{key[:10]}"
        ex.export(fig, stem, width=list(WIDTHS), formats=("svg",), csv=False, sidecar=False)
        whole = whole_axes(fig.to_dict()) if isinstance(fig, go.Figure) else set()
        for width in WIDTHS:
            bad = export_problems(pg, tmp_path / f"{stem.name}-{width}.svg", whole)
            if bad:
                found[f"{state}: {name} ({width})"] = bad


def _at_each_state(panel):
    """Each state of :func:`slider_states` set on ``panel`` in turn (its name yielded while it is set, the panel
    without an error there), the moved sliders back at their defaults after it."""
    assert panel.error is None, panel.error
    defaults = {k: w.value for k, w in panel.controls.items()}
    for state, values in slider_states(panel):
        panel.set(**values)
        assert panel.error is None, f"{state}: {panel.error}"
        yield state
        panel.set(**{k: defaults[k] for k in values})


def _sweep(make, inputs, pg, tmp_path) -> dict:
    sp, cap, params = inputs[:3]
    panel = make(sp, cap, params)
    seen, found = set(), {}
    for state in _at_each_state(panel):
        _check(panel, state, pg, tmp_path, seen, found)
    assert seen, "no figure exported"
    return found


def _report(found: dict) -> str:
    return "\n".join(f"{k}: " + "; ".join(v[:4]) for k, v in found.items())


@pytest.mark.parametrize("case", list(PANELS))
def test_every_slider_extreme_meets_the_paper_rules(syn, page, tmp_path, case, request):  # noqa: F811
    if case in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[case], strict=True))
    found = _sweep(PANELS[case], syn, page, tmp_path)
    assert not found, f"{case}:\n" + _report(found)


@pytest.mark.parametrize("case", LONG_PANELS)
def test_long_prompt_meets_the_paper_rules(long, page, tmp_path, case, request):  # noqa: F811
    if f"{case}@33k" in KNOWN:
        request.applymarker(pytest.mark.xfail(reason=KNOWN[f"{case}@33k"], strict=True))
    found = _sweep(PANELS[case], long, page, tmp_path)
    assert not found, f"{case} at T = {long[0].T}:\n" + _report(found)


def test_slider_states_visit_both_ends_of_shown_sliders(syn):
    """The harness itself: every shown slider of a panel gets a min and a max state (the eviction panel's
    hidden page-size slider none), the others at their defaults."""
    sp, cap, params = syn[:3]
    panel = PANELS["eviction"](sp, cap, params)
    states = dict(slider_states(panel))
    assert any(k.startswith("budget=min") for k in states) and any(k.startswith("budget=max") for k in states)
    assert not any(k.startswith("page=") for k in states)          # shown only for the page policy
    assert all(len(v) == 1 for k, v in states.items() if k != "default")


#: the figures whose one-column legends took 35–40 % of the height with titles over other plots on the default model's
#: capture, each in the panel of the notebook that shows it: ``case → (panel on (capture, prompt), figure name)``;
#: 05 and 06 with their notebooks' parameters, 06 on its own capture (no tail rows)
REAL_CASES = {
    "00 residual": (lambda c, pr: Wd.HeadsPanel(c, quantity="sink"), "residual"),
    "02 residual": (lambda c, pr: Wd.HeadsPanel(c), "residual"),
    "05 trace": (lambda c, pr: Wd.AuditPanel(c, EntroPrefillParams(zeta=0.5, tau=1.0, target=0.25, eps_row=0.2,
                                                                      streak=1, eps_audit=0.2, audit_mode="exact")),
                 "trace"),
    "06 trace": (lambda c, pr: Wd.PrunePanel(c, None, pr, EntroPrefillParams(target=0.25, eps_row=0.2, streak=1,
                                                                             eps_audit=0.2), max_new_tokens=8),
                 "trace"),
}


@pytest.fixture(scope="module")
def real_captures(smollm, example_prompt):
    """The default model's captures of the bundled prompt as the notebooks take them: 00/02/05 (a 32-token tail,
    4 decode steps) and 06 (no tail)."""
    return {"rows": run_capture(smollm, example_prompt, RowSet(tail=32, n_decode=4), progress=False),
            "no tail": run_capture(smollm, example_prompt, RowSet(tail=0), progress=False)}


@pytest.mark.model
@pytest.mark.parametrize("case", list(REAL_CASES))
def test_real_capture_legends_at_one_column(real_captures, example_prompt, page, tmp_path, case):  # noqa: F811
    """On the default model's real capture, the residual (00, 02) and trace (05, 06) figures exported at one column
    (3.33 in), in the notebook's state and with each shown slider at its min and its max: the legend spans at most
    25 % of the height, no title, legend or axis title lies on a plot area, no two texts overlap, and the other paper
    rules hold (:func:`test_figure_layout.export_problems`)."""
    make, name = REAL_CASES[case]
    cap = real_captures["no tail" if case.startswith("06") else "rows"]
    panel = make(cap, example_prompt)
    seen, found = set(), {}
    for state in _at_each_state(panel):
        fig = go.Figure(panel.figures[name])
        key = _key(panel.figures[name])
        if key not in seen:
            seen.add(key)
            stem = tmp_path / f"{name}-{key[:10]}"
            ex.export(fig, stem, width="single", formats=("svg",), csv=False, sidecar=False)
            bad = export_problems(page, stem.with_suffix(".svg"), whole_axes(fig.to_dict()))
            if bad:
                found[state] = bad
    assert seen, f"{case}: no {name} figure exported"
    assert not found, f"{case} at one column:\n" + _report(found)


@pytest.mark.parametrize("answer_doc", [0, 5])
def test_answer_passage_label_stays_on_its_plot(page, tmp_path, answer_doc):  # noqa: F811
    """kept_positions at one column with the answer passage first, then last in the prompt: its "answer passage"
    label stays on the plot (from the passage's right edge when it ends the prompt: from its left edge, the label
    ran over the colour bar's ticks, as in notebook 11's run), and every other rule holds."""
    sp = PromptSpans.synthetic([12, 10, 14, 9, 11, 8], query_len=10, answer_doc=answer_doc)
    runs = [_gen("snapkv", 24, sp.T, seed=0), _gen("deferkv", 24, sp.T, seed=1)]
    fig = plots.kept_positions(runs, sp, highlight=list(range(*sp.documents[answer_doc])))
    ex.export(fig, tmp_path / "kept", width="single", formats=("svg",), csv=False, sidecar=False)
    bad = export_problems(page, tmp_path / "kept.svg", whole_axes(fig.to_dict()))
    assert not bad, bad


def test_drift_of_a_deep_model_at_one_column(page, tmp_path):  # noqa: F811
    """The drift figure of a 30-layer model (notebook 06's run: l* = 3, drift at layers 4–30) at one column: its layer
    ticks do not stack (a label every layer overlapped its neighbours), none falls between layers, the rules hold."""
    layers = range(4, 31)
    st = StabilityResult(l_star=3, drift={l: 0.01 * l for l in layers}, Delta_L=0.3, margin=2.0, Lambda=3.0,
                         c_final=1.0, certified=True, agree_first_token=True, full_first_token=5, pruned_first_token=5,
                         defects={l: 0.001 * l for l in layers}, K={l: 3.0 for l in layers}, composed_bound=10.0)
    fig = plots.drift(st)
    ex.export(fig, tmp_path / "drift", width="single", formats=("svg",), csv=False, sidecar=False)
    bad = export_problems(page, tmp_path / "drift.svg", whole_axes(fig.to_dict()))
    assert not bad, bad
