"""A panel as one offline HTML page whose sliders still work (:mod:`workbench.show.interactive`).

The page is opened in headless Debian chromium (Playwright) with the network off: every request other than the file
itself is aborted and recorded. Moving its range input (value set, ``input`` dispatched) must change the figure's
data read from the page (``.js-plotly-plot``'s ``data``), and the data at two slider values must equal the figures
the live panel draws at those values (``panel.set``, its widgets), decoded independently of the export code.
"""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import ipywidgets as W
import numpy as np
import plotly.offline as po
import pytest

import workbench as wb
from workbench.show import interactive as ix
from workbench.show.widgets import (
    AuditPanel,
    CounterexamplePanel,
    EvictionPanel,
    HeadsPanel,
    PagesPanel,
    PriorityPanel,
    ShiftPanel,
    TokenPanel,
)

CHROMIUM = "/usr/bin/chromium"


def _arr(v) -> np.ndarray:
    """A trace array as read from the page or from plotly's JSON: a list, or a base64 typed-array spec."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"].rstrip("c")))
        shape = v.get("shape")
        return a.reshape([int(s) for s in str(shape).split(",")]) if shape else a
    if isinstance(v, dict):  # a typed array serialised by the page: {"0": .., "1": ..}
        return np.array([v[str(i)] for i in range(len(v))], dtype=float)
    return np.asarray(v, dtype=float)


def _numeric(trace: dict) -> dict[str, np.ndarray]:
    return {k: _arr(trace[k]) for k in ("x", "y", "z") if k in trace and not (
        isinstance(trace[k], list) and trace[k] and isinstance(trace[k][0], str))}


def _same_traces(page_traces: list[dict], fig) -> None:
    want = json.loads(fig.to_json())["data"]
    assert len(page_traces) == len(want)
    assert any(_numeric(t) for t in want), "no numeric array to compare"
    for got, exp in zip(page_traces, want):
        g, e = _numeric(got), _numeric(exp)
        assert g.keys() == e.keys()
        for k in e:
            np.testing.assert_allclose(g[k], e[k], rtol=0, atol=0, equal_nan=True, err_msg=k)


def _no_network_refs(text: str) -> None:
    """Nothing in the page would load another file: no ``src``/``href`` attribute, no stylesheet link, no CSS
    import, no iframe in its markup; its scripts are plotly.js itself (whose map-tile addresses are fetched only by
    map traces) and the page's own, and its data names no address."""
    scripts = re.findall(r"<script[^>]*>(.*?)</script>", text, re.S)
    assert po.get_plotlyjs() in scripts
    assert not any(re.search(r"https?://", s) for s in scripts if s != po.get_plotlyjs())
    text = re.sub(r"(<script[^>]*>).*?</script>", r"\1</script>", text, flags=re.S)
    assert not re.search(r"<script[^>]*\ssrc\s*=", text, re.I)
    assert not re.search(r"<link\b", text, re.I)
    assert not re.search(r"<(img|iframe|object|embed)\b", text, re.I)
    assert not re.search(r"@import", text)
    assert not re.search(r"""\s(src|href)\s*=\s*["']?https?:""", text, re.I)


# ----------------------------------------------------------------------------- in the browser
@pytest.fixture(scope="module")
def offline_page():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Debian chromium at {CHROMIUM}")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"], headless=True)
        try:
            ctx = browser.new_context(offline=True)
            fetched, errors = [], []

            def route(r):
                if not r.request.url.startswith("file://"):
                    fetched.append(r.request.url)
                    r.abort()
                else:
                    r.continue_()

            ctx.route("**/*", route)
            page = ctx.new_page()
            page.on("request", lambda req: fetched.append(req.url) if not req.url.startswith("file://") else None)
            page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            yield page, fetched, errors
        finally:
            browser.close()


def _open(page, path: Path) -> None:
    page.goto(path.resolve().as_uri())
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length > 0 && document.body.dataset.state")


def _move(page, j: int, i: int) -> None:
    page.evaluate("([j, i]) => { const el = document.querySelectorAll('input.wb-slider')[j]; el.value = String(i);"
                  " el.dispatchEvent(new Event('input', {bubbles: true})); }", [j, i])


def _plot_data(page, k: int = 0) -> list[dict]:
    return json.loads(page.evaluate(f"JSON.stringify(document.querySelectorAll('.js-plotly-plot')[{k}].data)"))


def test_the_page_works_offline_and_its_slider_moves_the_figure(offline_page, tmp_path):
    page, fetched, errors = offline_page
    panel = CounterexamplePanel()
    html_path, side_path = panel.export_interactive(tmp_path / "ce", sliders=["eps"], points=21)
    assert (html_path.name, side_path.name) == ("ce.html", "ce.json")
    text = html_path.read_text(encoding="utf-8")
    _no_network_refs(text)
    side = json.loads(side_path.read_text())
    grid = side["grid"]["eps"]
    assert len(grid) == 21 and grid[0] == pytest.approx(1e-9) and grid[-1] == pytest.approx(10 ** -0.5)
    assert side["fixed"] == {"gamma": panel.params()["gamma"]}
    assert side["html_bytes"] == html_path.stat().st_size <= ix.MAX_MB * 1e6
    embedded = json.loads(re.search(r'id="wb-sidecar">(.*?)</script>', text, re.S).group(1))
    assert embedded["grid"] == side["grid"]

    _open(page, html_path)
    start = int(page.evaluate("document.body.dataset.state"))
    assert grid[start] == pytest.approx(panel.params()["eps"])  # the page opens at the panel's value
    before = _plot_data(page)
    lo, hi = 0, len(grid) - 1
    _move(page, 0, hi)
    assert page.evaluate("document.body.dataset.state") == str(hi)
    after = _plot_data(page)
    assert any(not np.array_equal(_arr(a.get("y")), _arr(b.get("y"))) for a, b in zip(before, after)), \
        "moving the slider left the figure as it was"
    assert page.evaluate("document.querySelector('input.wb-slider + output').textContent") == f"{grid[hi]:.3g}"

    # the page's data at two slider values is what the live panel draws there
    for i in (lo, hi):
        _move(page, 0, i)
        panel.set(eps=grid[i])
        for k, name in enumerate(side["figures"]):
            _same_traces(_plot_data(page, k), panel.figures[name])
    assert fetched == [], f"the page asked the network for {fetched}"
    assert errors == [], errors


def test_two_sliders_pick_their_state_in_the_page(offline_page, tmp_path):
    page, fetched, errors = offline_page
    panel = CounterexamplePanel()
    html_path, side_path = panel.export_interactive(tmp_path / "ce2", sliders=["eps", "gamma"], points=5)
    side = json.loads(side_path.read_text())
    eps, gamma = side["grid"]["eps"], side["grid"]["gamma"]
    assert side["n_states"] == len(eps) * len(gamma) == 25 and "fixed" in side and side["fixed"] == {}
    _open(page, html_path)
    _move(page, 0, 1)
    _move(page, 1, 3)
    assert page.evaluate("document.body.dataset.state") == str(1 * len(gamma) + 3)
    panel.set(eps=eps[1], gamma=gamma[3])
    for k, name in enumerate(side["figures"]):
        _same_traces(_plot_data(page, k), panel.figures[name])
    assert fetched == [] and errors == []


def test_a_token_view_swaps_in_the_page(offline_page, tiny, tmp_path):
    page, fetched, errors = offline_page
    lm, spans, cap = tiny
    panel = TokenPanel(cap)  # one page of tokens: its page slider is hidden, so the layer slider moves
    html_path, side_path = panel.export_interactive(tmp_path / "tokens")
    side = json.loads(side_path.read_text())
    assert list(side["grid"]) == ["layer"] and side["grid"]["layer"] == list(range(cap.L))
    page.goto(html_path.resolve().as_uri())
    page.wait_for_function("document.body.dataset.state !== undefined")
    shown = page.evaluate("document.querySelector('.wb-figures').innerHTML")
    assert "wb-tokens" in shown
    _move(page, 0, 0 if panel.params()["layer"] else cap.L - 1)
    assert page.evaluate("document.querySelector('.wb-figures').innerHTML") != shown
    assert fetched == [] and errors == []


# ----------------------------------------------------------------------------- refusals
def test_bad_arguments_are_refused_naming_the_parameter_and_nothing_is_written(tmp_path):
    panel = CounterexamplePanel()
    with pytest.raises(ValueError, match=r"points: must be an integer in \[2, 40\]"):
        panel.export_interactive(tmp_path / "a", points=41)
    with pytest.raises(ValueError, match=r"max_mb: must be .*\(0, 50\]"):
        panel.export_interactive(tmp_path / "a", max_mb=60)
    with pytest.raises(ValueError, match=r"sliders: 'nope' is not a slider of CounterexamplePanel"):
        panel.export_interactive(tmp_path / "a", sliders=["nope"])
    with pytest.raises(ValueError, match=r"sliders: the grid has 1400 states \(35 \(eps\) × 40 \(gamma\)\), over "
                                         r"the cap of 400"):
        panel.export_interactive(tmp_path / "a", sliders=["eps", "gamma"], points=40)
    with pytest.raises(ValueError, match=r"max_mb: the page would be 4\.\d MB \(2 states\), over the bound of 1 MB"):
        panel.export_interactive(tmp_path / "a", points=2, max_mb=1)
    assert list(tmp_path.iterdir()) == []
    assert panel.params() == CounterexamplePanel().params()  # the controls came back


def test_a_panel_that_waits_for_a_model_run_is_refused(tiny, tmp_path):
    lm, spans, cap = tiny
    panel = EvictionPanel(cap, lm, spans, policy="snapkv", budget=20, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"panel: EvictionPanel cannot be exported with working sliders: its "
                                         r"figures follow a model run"):
        wb.export_interactive(panel, tmp_path / "ev")
    assert list(tmp_path.iterdir()) == []


def test_the_states_are_the_panels_own_figures_and_repeats_are_stored_once(tiny, tmp_path):
    """Without a browser: each state's traces, rebuilt from the page's JSON, are the panel's figures at that value;
    the template and the figures that do not follow the slider are stored once."""
    lm, spans, cap = tiny
    panel = PriorityPanel(cap)
    name = next(n for n, w in panel.controls.items() if isinstance(w, ix.SLIDER_TYPES))
    html_path, side_path = panel.export_interactive(tmp_path / "prio", sliders=[name], points=3)
    text = html_path.read_text(encoding="utf-8")
    pool = json.loads(re.search(r'id="wb-pool">(.*?)</script>', text, re.S).group(1))
    states = json.loads(re.search(r'id="wb-states">(.*?)</script>', text, re.S).group(1))
    side = json.loads(side_path.read_text())
    grid = side["grid"][name]
    templates = {f["template"] for st in states["states"] for f in st["figs"].values() if "template" in f}
    assert len(templates) == 1
    for i in (0, len(grid) - 1):
        panel.set(**{name: grid[i]})
        for fname, parts in states["states"][i]["figs"].items():
            _same_traces(pool[parts["data"]], panel.figures[fname])


def test_grid_takes_the_sliders_own_steps_or_spreads_them():
    assert ix.slider_grid(W.IntSlider(min=0, max=4, step=1), 10) == [0, 1, 2, 3, 4]
    assert ix.slider_grid(W.IntSlider(min=0, max=100, step=1), 3) == [0, 50, 100]
    assert ix.slider_grid(W.FloatSlider(min=0.1, max=0.4, step=0.05), 40) == [0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4]
    assert ix.slider_grid(W.FloatLogSlider(min=-2, max=0, step=1, base=10), 40) == [0.01, 0.1, 1.0]


_INVALID = [(name, v) for name, c in ix.INTERACTIVE_CHECKS.items() for v in c.invalid()]


@pytest.mark.parametrize(("name", "value"), _INVALID, ids=[f"{n}={v!r}" for n, v in _INVALID])
def test_every_invalid_argument_is_refused_with_its_constraint(name, value, tmp_path):
    kw = {"path": tmp_path / "x", name: value}
    with pytest.raises(ValueError, match=re.escape(ix.INTERACTIVE_CHECKS[name].message(name, value))):
        ix.export_interactive(CounterexamplePanel(), **kw)
    assert list(tmp_path.iterdir()) == []


def test_a_panel_at_the_bundled_prompt_moves_offline_within_the_size_bound(offline_page, smollm_capture, tmp_path):
    """The priority panel on the default model's capture of the bundled prompt: its layer slider moves the figures
    in the page with the network off; the page's size is printed (benchmarks/RESULTS.md has it)."""
    page, fetched, errors = offline_page
    panel = PriorityPanel(smollm_capture)
    html_path, side_path = panel.export_interactive(tmp_path / "priority", sliders=["layer"], points=40)
    side = json.loads(side_path.read_text())
    size = html_path.stat().st_size
    print(f"\ninteractive PriorityPanel page at the bundled prompt (T = {smollm_capture.T}, layer slider, "
          f"{side['n_states']} states): {size / 1e6:.2f} MB")
    assert side["grid"]["layer"] == list(range(smollm_capture.L)) and side["failed_states"] == 0
    assert size == side["html_bytes"] <= ix.MAX_MB * 1e6
    assert side["model_id"] == smollm_capture.model_id and side["prompt_hash"]
    _open(page, html_path)
    before = _plot_data(page)
    _move(page, 0, 0 if panel.params()["layer"] else smollm_capture.L - 1)
    assert _plot_data(page) != before
    layer = side["grid"]["layer"][0]
    _move(page, 0, 0)
    panel.set(layer=layer)
    for k, name in enumerate(side["figures"]):
        _same_traces(_plot_data(page, k), panel.figures[name])
    assert fetched == [] and errors == []


class _RefusesLargeEps(CounterexamplePanel):
    """A panel whose analysis refuses ε > 1e-3 (as an analysis refuses a parameter combination)."""

    def compute(self):
        if float(self.controls["eps"].value) > 1e-3:
            raise ValueError("eps: refused above 1e-3 in this test")
        return super().compute()


def test_a_refused_state_is_shown_as_failed_not_as_a_figure(offline_page, tmp_path):
    page, fetched, errors = offline_page
    panel = _RefusesLargeEps()
    html_path, side_path = panel.export_interactive(tmp_path / "refuses", points=40)
    side = json.loads(side_path.read_text())
    grid = side["grid"]["eps"]
    refused = [i for i, v in enumerate(grid) if v > 1e-3]
    assert refused and side["failed_states"] == len(refused)
    _open(page, html_path)
    _move(page, 0, refused[-1])
    assert "not computed at this setting: eps: refused above 1e-3" in page.evaluate(
        "document.getElementById('wb-status').textContent")
    assert page.evaluate("Array.from(document.querySelectorAll('.wb-figure')).every(e => e.style.display === 'none')")
    _move(page, 0, 0)  # back to a computed state: its figures and status return
    assert page.evaluate("Array.from(document.querySelectorAll('.wb-figure')).every(e => e.style.display === '')")
    assert "shallow mass" in page.evaluate("document.getElementById('wb-status').textContent")
    assert fetched == [] and errors == []


@pytest.mark.parametrize("cls", [HeadsPanel, PriorityPanel, AuditPanel, ShiftPanel, PagesPanel, TokenPanel],
                         ids=lambda c: c.__name__)
def test_every_capture_panel_exports_and_keeps_its_controls(cls, tiny, tmp_path):
    """Each panel that follows a capture exports its first slider at every grid value with no failed state, and its
    controls and figures on screen are as before (the export computes beside them)."""
    lm, spans, cap = tiny
    panel = cls(cap)
    before = panel.params()
    shown = {n: json.loads(f.to_json())["data"] for n, f in panel.figures.items() if hasattr(f, "to_json")}
    _, side_path = panel.export_interactive(tmp_path / cls.__name__, points=3)
    side = json.loads(side_path.read_text())
    assert side["failed_states"] == 0 and side["n_states"] == len(next(iter(side["grid"].values())))
    assert panel.params() == before
    assert {n: json.loads(f.to_json())["data"] for n, f in panel.figures.items() if hasattr(f, "to_json")} == shown
