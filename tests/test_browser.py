"""Widget panels in a real JupyterLab, driven from a real browser (Debian chromium via Playwright).

One JupyterLab server per module (random free port, token auth, a temporary root folder, its own
config/settings/runtime folders, kernels on one intra-op thread) serves every notebook and two synthetic ones:

- every notebook, one test each (``test_notebook_panels_in_browser[NN]``), which is that notebook's execution
  test (each notebook executes once per run: ``conftest.py`` deselects the nbclient run of
  ``test_notebooks.py`` for it): run it from the **Run** menu, check the notebook as JupyterLab holds it with
  the headless test's assertions (``_notebook_checks.check_executed``: no error, figures with data, a widget,
  the checks cell's numbers), move every visible slider of every panel to both ends and check that the figures'
  data or the status changed, flip each *re-run on change* toggle once (a model run), press *export figures* (on the
  notebook's first panel that has it) and check the files, no console errors, screenshots; and the live layout (:func:`_layout_sweep`, the rule
  in ``tests/_layout_rules.py``): every text box of every shown plotly plot (titles, axis titles, ticks, legend,
  annotations) read in the page, no two overlapping, no title, legend or axis title on a plot area, nothing outside
  its figure and no figure cut by the page, after Run All and at both ends of every slider, in a 1400 px and a
  1000 px window (one run of the notebook: the window is resized); then the panels' figures exported at one
  column at the slider ends, every file checked with the paper rules (:func:`_exports_at_slider_ends`), and on
  notebook 11 its own-policy *Run* (its kept set, the needle's number in the answer);
- on ``02_sinks_and_pooling.ipynb`` (the real default model) the same test also checks the closing
  :class:`~workbench.show.widgets.HeadsPanel`: it reads the head-weight heatmap back from the browser (the
  numbers plotly drew: every KV group's weights sum to 1, none below the floor ``ζ/r``), moves the **ζ**
  slider with the keyboard (``Home``: ζ = 0.01) and checks that the figure followed: the heatmap's data, its
  ``meta.zeta``, its image, the residual rows' labels (``w=…``) and the pixels;
- a small panel notebook on a synthetic capture (fast): the layer slider moves the residual figure's title; the
  live layout check sees a hand-made overprint (a title on the plot area, a doubled tick label, a label out of
  the canvas, a cut figure) and skips a hidden figure;
- a synthetic T = 32 768 capture (:data:`LONG_CELLS`) in its heads, pages and token panels: the live layout
  checks as for the notebooks;
- a token-view notebook on a synthetic capture: the rendered text of the token spans is the token strings
  (leading spaces, tabs, newlines); clicking a token makes that position's captured row the query row (the
  boxed token and the *query row* menu follow); no console warnings;
- a researcher's own policy (``tests/_my_policy.py``), registered at run time, in the eviction panel on a tiny
  model: the policy menu shows it, the kept figure says why it has no preview, *Run eviction* generates under it;
- the readers of the drawn figures on a plain page (no JupyterLab): a title plotly draws on two lines reads as its
  words.

Every module test is marked ``slow`` (a server and a browser). Notebooks are opened in a fresh workspace and
run only once their own kernel is connected and idle. Screenshots of the panel before and after each move are test artefacts: they go to
``$WORKBENCH_ARTIFACTS/browser/`` if that variable is set, else ``tests/artifacts/browser/``, else (not
writable) the test's tmp folder; a full-page screenshot is added when a panel does not render. Every
wait is bounded (``WORKBENCH_BROWSER_RUN_TIMEOUT``, default 420 s, for running the pooling notebook;
it takes about 30 s on a quiet CPU); each test shuts its kernels down, the server goes in the fixture's
teardown. Never downloads a browser: ``/usr/bin/chromium`` or skip.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from _layout_rules import LIVE_BOXES_JS, layout_problems
from _notebook_checks import CHROMIUM, check_executed
from plotly.offline import get_plotlyjs
from test_figure_layout import export_problems

from workbench.show.private_compat import public_only

_sync_api = pytest.importorskip("playwright.sync_api")
PlaywrightTimeout = _sync_api.TimeoutError
sync_playwright = _sync_api.sync_playwright

ROOT = Path(__file__).resolve().parent.parent
POOLING_NB = ROOT / "notebooks" / "02_sinks_and_pooling.ipynb"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
# The notebook runs the real model on a CPU shared with other jobs: 20 s alone, minutes under load.
RUN_ALL_TIMEOUT_S = float(os.environ.get("WORKBENCH_BROWSER_RUN_TIMEOUT", "420"))
# the two window widths of the layout checks: a wide screen and a narrow one (px; the height stays)
WIDE, NARROW, HEIGHT = 1400, 1000, 1100

# a JupyterLab server and a chromium: never in the fast lane
pytestmark = [pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Debian chromium at {CHROMIUM}"),
              pytest.mark.slow]

#: a small synthetic capture ``cap`` of a 5-chunk prompt ``spans`` (no model)
_SYNTHETIC_CAPTURE = ("spans = PromptSpans.synthetic([8, 6, 9, 7, 5], answer_doc=2)\n"
                      "cap = Capture.synthetic(spans, L=4, H_Q=6, G=2, seed=0, concentration=2.0)\n")
SYNTHETIC_CELLS = [
    "import os\nos.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')\n"
    "from workbench.run.spans import PromptSpans\nfrom workbench.capture.data import Capture\n"
    "from workbench.show.widgets import HeadsPanel",
    _SYNTHETIC_CAPTURE + "panel = HeadsPanel(cap, layer=1)",
    "panel.widget",
]

#: token strings as a tokenizer gives them: leading spaces, a tab, newlines, markup characters
TOKEN_WORDS = ["The", " quick", " brown", "\n", " fox", "\tjumps", " <b>&", "\n\n", "  over", " the", " lazy", " dog",
               ".", " Passengers", " where", " fewer", " service", " rural", "\n", " A", ":", " swordfish"]

TOKEN_CELLS = [
    "import os\nos.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')\n"
    "from workbench.run.spans import PromptSpans\nfrom workbench.capture.data import Capture\n"
    "from workbench.show.widgets import TokenPanel",
    "import dataclasses\n"
    "spans = PromptSpans.synthetic([8, 6, 9, 7, 5], answer_doc=2)\n"
    "T = spans.T\n"
    f"WORDS = {TOKEN_WORDS!r}\n"
    "spans = dataclasses.replace(spans, tokens=tuple(WORDS[i % len(WORDS)] for i in range(T)))\n"
    "cap = Capture.synthetic(spans, L=4, H_Q=6, G=2, seed=0, concentration=2.0,\n"
    "                        extra_rows={'tail': list(range(T - 6, T))})\n"
    "panel = TokenPanel(cap, layer=1)",
    "panel.widget",
]


# a researcher's own policy, defined in a test module (tests/_my_policy.py), registered at run time in the kernel, in
# the eviction panel on a tiny random-weight model (a run takes a second)
POLICY_CELLS = [
    "import os, sys\nos.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')\n"
    f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
    "import torch\nimport workbench as wb\nfrom _my_policy import MeanKey\n"
    "from workbench.capture import RowSet, run_capture\nfrom workbench.run.models import LoadedModel, tiny_model\n"
    "from workbench.run.spans import PromptSpans\nfrom workbench.show.widgets import EvictionPanel",
    "wb.register_policy(MeanKey, group='attention-free')\n"
    "lm = LoadedModel(model=tiny_model('llama', L=3, H_Q=4, G=2, seed=1), tokenizer=None, model_id='tiny-llama',\n"
    "                 device=torch.device('cpu'), dtype=torch.float32)\n"
    "spans = PromptSpans.synthetic([8, 6, 9, 7, 5], prefix=6, query_len=10, answer_doc=2)\n"
    "cap = run_capture(lm, spans, RowSet(tail=16, n_decode=3), progress=False)\n"
    "panel = EvictionPanel(cap, lm, spans, policy='mean-key', budget=20, recent=8, max_new_tokens=3)",
    "panel.widget",
]

# the prompt panel (the real default model: it tokenises) on a shared state with a head, a priority and a token panel;
# the first capture is a two-document prompt (small rows: a capture takes about a second)
PROMPT_DOCS = ["The lighthouse keeper Marla Quint paints the tower red every spring.",
               "Ferries to the island leave twice a day from the north pier.",
               "The harbor market sells smoked mackerel on Fridays."]
PROMPT_CELLS = [
    "import os\nos.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')\n"
    "from workbench.capture import RowSet, run_capture\nfrom workbench.run.models import load_model\n"
    "from workbench.run.prompt import build_prompt\n"
    "from workbench.show.widgets import CaptureState, HeadsPanel, PriorityPanel, TokenPanel\n"
    "from workbench.study.prompt_panel import PromptPanel",
    "lm = load_model(device='cpu', progress=False)\n"
    "first = build_prompt(lm.tokenizer, ['Tall ships sail from the old harbor at dawn.',\n"
    "                                    'Night trains cross the valley without stopping.'], 'When do the ships sail?')\n"
    "state = CaptureState(run_capture(lm, first, RowSet(tail=8, n_decode=2), progress=False), first)\n"
    "heads, prio, tokens = HeadsPanel(state), PriorityPanel(state), TokenPanel(state)\n"
    "prompt_panel = PromptPanel(lm, state, n_boxes=3, tail=8, n_decode=2)",
    "prompt_panel.widget",
    "heads.widget",
    "prio.widget",
    "tokens.widget",
]


# a synthetic T = 32 768 capture (510 chunks of 64 tokens, a 16-token query; 4 layers, 6 query heads, 2 KV groups)
# in its heads, pages and token panels: the layout checks here, slider latency in benchmarks/browser_latency.py
LONG_CELLS = [
    "import os\nos.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')\n"
    "from workbench.run.spans import PromptSpans\nfrom workbench.capture.data import Capture\n"
    "from workbench.show.widgets import HeadsPanel, PagesPanel, TokenPanel",
    "spans = PromptSpans.synthetic([64] * 510, query_len=16, answer_doc=100)\n"
    "cap = Capture.synthetic(spans, L=4, H_Q=6, G=2, seed=0, concentration=2.0)\n"
    "print('T =', spans.T)",
    "HeadsPanel(cap, layer=1).widget",
    "PagesPanel(cap, layer=1).widget",
    "TokenPanel(cap, layer=1).widget",
]

#: a heads panel and a token panel, for :func:`test_widget_models_anywidget_gave_up_on_still_follow_the_sliders`
DEAF_CELLS = SYNTHETIC_CELLS[:1] + [
    "from workbench.show.widgets import TokenPanel\n" + _SYNTHETIC_CAPTURE
    + "heads = HeadsPanel(cap, layer=1)\ntokens = TokenPanel(cap, layer=1)",
    "heads.widget",
    "tokens.widget",
    # a figure outside any panel, changed in the kernel before the page can say its model is deaf, and a slider of its own
    "import ipywidgets as W\nimport plotly.graph_objects as go\nfrom workbench.show.figure_widget import FigureWidget\n"
    "from workbench.show.plots import update_figure\n"
    "def solo_fig(k):\n"
    "    return go.Figure(go.Bar(x=['a', 'b', 'c'], y=[k, k + 1, k + 2]),\n"
    "                     layout={'title': {'text': f'solo {k}'}, 'meta': {'solo': k}, 'width': 400, 'height': 300})\n"
    "solo = FigureWidget(solo_fig(0))\nupdate_figure(solo, solo_fig(1))\n"
    "solo_k = W.IntSlider(1, min=1, max=5, description='solo k')\n"
    "solo_k.observe(lambda c: update_figure(solo, solo_fig(c['new'])), names='value')\n"
    "W.VBox([solo_k, solo])",
]

# The page's three anywidget models (the heads panel's two figures and the figure outside a panel; the token view has
# none: its HTML and its click box are standard widgets) get an initialization limit that has passed before their module can load, where anywidget's is 2 s:
# anywidget gives up on them ("[anywidget] Failed to initialize model") and they drop every message from the kernel,
# as a page busy for over 2 s makes them do by chance.
DEAF_FIRST_JS = """(() => {
  const timeout = AbortSignal.timeout.bind(AbortSignal);
  let left = 3;
  AbortSignal.timeout = (ms) => {
    if (ms !== 2000 || left <= 0) return timeout(ms);
    left -= 1;
    const c = new AbortController();
    queueMicrotask(() => c.abort());
    return c.signal;
  };
})();"""

# ----------------------------------------------------------------------------- server
def _synthetic_notebook(path: Path, cells=SYNTHETIC_CELLS) -> None:
    nb = {
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                   "source": src} for i, src in enumerate(cells)],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                     "language_info": {"name": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status


def _lab_settings(settings: Path) -> None:
    """User settings of the test's JupyterLab: attach every notebook cell to the DOM (windowing off, so
    offscreen plotly figures and widgets render like visible ones and the panel at the end of a long
    notebook is in the DOM), and no news pop-up."""
    for ext, values in (("notebook-extension/tracker", {"windowingMode": "none"}),
                        ("apputils-extension/notification", {"fetchNews": "false", "checkForUpdates": False})):
        path = settings / "@jupyterlab" / f"{ext}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _die_with_parent() -> None:
    """In the server's child process (Linux): SIGTERM when the test process dies, so that a killed pytest
    (a CI timeout) leaves no server and no kernel holding a model behind (the server shuts its kernels down)."""
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


@contextlib.contextmanager
def lab_server(tmp_path: Path):
    """A JupyterLab server on a free port with token auth; yields ``(base_url, token, root)``.

    The root holds ``panel.ipynb`` (synthetic capture) and a copy of the pooling notebook."""
    root = tmp_path / "root"
    root.mkdir()
    _synthetic_notebook(root / "panel.ipynb")
    _synthetic_notebook(root / "tokens.ipynb", TOKEN_CELLS)
    _synthetic_notebook(root / "policy.ipynb", POLICY_CELLS)
    _synthetic_notebook(root / "prompt.ipynb", PROMPT_CELLS)
    _synthetic_notebook(root / "long_32k.ipynb", LONG_CELLS)
    _synthetic_notebook(root / "deaf.ipynb", DEAF_CELLS)
    for nb in sorted(POOLING_NB.parent.glob("[0-9][0-9]_*.ipynb")):  # every notebook (the panel tests open them)
        shutil.copy(nb, root / nb.name)
    shutil.copy(POOLING_NB.parent / "lab_setup.py", root / "lab_setup.py")  # the notebooks' shared set-up
    port, token = _free_port(), uuid.uuid4().hex
    env = dict(os.environ)
    for k, sub in (("JUPYTER_CONFIG_DIR", "cfg"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                   ("JUPYTERLAB_SETTINGS_DIR", "settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
                   ("IPYTHONDIR", "ipython"), ("JUPYTER_DATA_DIR", "data")):
        env[k] = str(tmp_path / sub)
    _lab_settings(tmp_path / "settings")
    # the kernel the notebooks name (``make lab`` installs it for the venv; here into the test's data dir)
    kdir = tmp_path / "data" / "kernels" / "attn-workbench"
    kdir.mkdir(parents=True)
    (kdir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (attn-workbench)", "language": "python"}))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TOKENIZERS_PARALLELISM"] = "false"
    # kernels inherit this: one intra-op thread (a shared CPU oversubscribed by torch's default spin-waits)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
           "--LabApp.expose_app_in_browser=True", "--ServerApp.port_retries=0", "--LabApp.extension_manager=readonly",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp_path / "lab.log", "wb")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_die_with_parent)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited ({proc.returncode}):\n{(tmp_path / 'lab.log').read_text()[-3000:]}")
            try:
                if _get(f"{base}/api/status?token={token}") == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("jupyter lab did not answer within 90 s")
            time.sleep(0.5)
        yield base, token, root
    finally:
        try:  # shuts the kernels down too
            req = urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST")
            urllib.request.urlopen(req, timeout=10).close()
        except (urllib.error.URLError, OSError):
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """``(base_url, token, root, context)``: the module's JupyterLab server and one chromium browser context
    (one browser for every test of the module: its HTTP cache holds JupyterLab's bundles after the first
    page; each test opens its own page and closes it)."""
    with lab_server(tmp_path_factory.mktemp("lab")) as (base, token, root), sync_playwright() as p:
        browser = _launch(p)
        try:
            yield base, token, root, browser.new_context(viewport={"width": WIDE, "height": HEIGHT})
        finally:
            browser.close()


@pytest.fixture()
def artifacts(request, tmp_path) -> Path:
    """Folder for this test's screenshots: ``$WORKBENCH_ARTIFACTS/browser`` or ``tests/artifacts/browser``
    (kept after the run), else the test's tmp folder."""
    env = os.environ.get("WORKBENCH_ARTIFACTS")
    folder = (Path(env) if env else ROOT / "tests" / "artifacts") / "browser"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError:
        folder = tmp_path
    prefix = {"test_synthetic_panel_layer_slider": "synthetic-",
              "test_token_view_click_sets_the_query_row": "tokens-",
              "test_registered_policy_in_the_eviction_panel": "policy-",
              "test_prompt_panel_feeds_the_heads_priority_and_token_panels": "prompt-",
              "test_long_capture_layout_in_browser": "long-"}.get(
        request.node.name, request.node.name + "-")
    for old in folder.glob(prefix + "*.png"):   # this test's screenshots from an earlier run
        old.unlink()
    return folder


class _Phases:
    """Where a browser test's time goes (the browser tests are the suite's critical path): named
    phases and each slider's moves, in seconds, written as ``<tag>-timings.json`` beside the screenshots."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.phases: list[tuple[str, float]] = []
        self.sliders: list[tuple[str, float]] = []   # (slider label, seconds: its moves, waits and checks)

    @contextlib.contextmanager
    def phase(self, name: str):
        t = time.monotonic()
        try:
            yield
        finally:
            self.phases.append((name, round(time.monotonic() - t, 2)))

    def write(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            path.write_text(json.dumps({"total_s": round(time.monotonic() - self.t0, 2), "phases": self.phases,
                                        "sliders": self.sliders}, indent=1))


# ----------------------------------------------------------------------------- browser helpers
# The output area (one cell's outputs) holding the panel: the one with a slider labelled like `label`.
_PANEL_JS = """(label) => {
  for (const s of document.querySelectorAll('.jp-OutputArea .widget-hslider')) {
    const l = s.querySelector('.widget-label');
    if (l && l.textContent.includes(label)) return s.closest('.jp-OutputArea');
  }
  return null;
}"""

# A plotly figure's drawn title as its words. A title wrapped to the figure's width (paper_layout.wrap_text puts
# `<br>` at spaces: a narrow figure, e.g. under plotly's stock widget, which reports no live width) is drawn as one
# `tspan.line` per line, and the title's textContent runs the lines together ("per<br>layer" reads "perlayer").
_TITLE_JS = """(gd) => {
  const t = gd.querySelector('.gtitle');
  if (!t) return '';
  const lines = t.querySelectorAll('tspan.line');
  return lines.length ? Array.from(lines, l => l.textContent).join(' ') : t.textContent;
}"""

# Plotly figures inside the panel: title (its words: _TITLE_JS), meta, the heatmap's z (as plotly drew it), its
# image href, and the y tick labels. `gd.calcdata` holds the numbers after plotly decoded typed arrays.
_FIGURES_JS = """([label, findPanel]) => {
  const titleOf = """ + _TITLE_JS + """;
  const area = eval(findPanel)(label);
  if (!area) return null;
  return Array.from(area.querySelectorAll('.js-plotly-plot')).map(gd => {
    const im = gd.querySelector('.hm image');
    const cd = gd.calcdata && gd.calcdata[0] && gd.calcdata[0][0];
    return {
      title: titleOf(gd),
      meta: (gd.layout && gd.layout.meta) || null,
      z: cd && cd.z ? Array.from(cd.z, row => Array.from(row)) : null,
      href: im ? (im.getAttribute('href') || im.getAttribute('xlink:href') || '') : '',
      yticks: Array.from(gd.querySelectorAll('.ytick text')).map(e => e.textContent),
    };
  });
}"""


def _figures(page, label: str) -> list[dict] | None:
    return page.evaluate(_FIGURES_JS, [label, _PANEL_JS])


_ERROR_SEL = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"


def _wait_figures(page, label: str, ok_js: str, timeout_s: float) -> None:
    """Wait until the panel's figures satisfy ``ok_js`` (a JS expression over ``figs``; bounded).
    Stops early when a cell shows a traceback (then the caller's check of the figures fails)."""
    js = ("([label, findPanel, errSel]) => { const figs = (" + _FIGURES_JS + ")([label, findPanel]); "
          "return (!!figs && (" + ok_js + ")) || Array.from(document.querySelectorAll(errSel))"
          ".some(e => e.textContent.includes('Traceback')); }")
    page.wait_for_function(js, arg=[label, _PANEL_JS, _ERROR_SEL], timeout=timeout_s * 1000, polling=500)


def _wait_panel(page, label: str, ok_js: str, timeout_s: float, shot: Path) -> None:
    """:func:`_wait_figures` after running a notebook; on a timeout or a traceback: a full-page
    screenshot ``shot`` and an AssertionError with the notebook's error outputs."""
    try:
        _wait_figures(page, label, ok_js, timeout_s)
        errors = _kernel_errors(page)
    except PlaywrightTimeout:
        errors = _kernel_errors(page) or [f"no panel with a '{label}' slider after {timeout_s:.0f} s"]
    if errors:
        page.screenshot(path=str(shot), full_page=True)
        raise AssertionError(f"the panel did not render (screenshot {shot}): " + "\n".join(e[-2000:] for e in errors))


def _open(page, base: str, token: str, name: str) -> None:
    """Open notebook ``name`` in a fresh workspace (``reset``: no tabs restored from an earlier test) and
    wait until its own kernel is started, idle and connected (cells run before that are lost)."""
    page.goto(f"{base}/lab/tree/{name}?token={token}&reset", wait_until="domcontentloaded")
    page.wait_for_function("(name) => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                           " const s = w && w.sessionContext && w.sessionContext.session;"
                           " const k = s && s.kernel;"
                           " return !!k && w.context.path === name && !!document.querySelector('.jp-Notebook .jp-Cell')"
                           " && k.connectionStatus === 'connected' && k.status === 'idle'; }",
                           arg=name, timeout=120_000, polling=250)


def _shutdown_kernels(base: str, token: str) -> None:
    """Shut down every kernel of the server (the model's kernel holds memory; the next test starts its own).
    Best effort: the server's own shutdown in the fixture's teardown ends whatever is left."""
    with contextlib.suppress(OSError):          # URLError/HTTPError: server gone, kernel gone with its session
        for kind in ("sessions", "kernels"):
            with urllib.request.urlopen(f"{base}/api/{kind}?token={token}", timeout=10) as r:
                ids = [x["id"] for x in json.load(r)]
            for i in ids:
                req = urllib.request.Request(f"{base}/api/{kind}/{i}?token={token}", method="DELETE")
                with contextlib.suppress(urllib.error.HTTPError):
                    urllib.request.urlopen(req, timeout=30).close()


def _run_all_from_menu(page) -> None:
    """Run ▸ Run All Cells, clicked in JupyterLab's menu bar."""
    page.locator("#jp-menu-panel .lm-MenuBar-item", has_text="Run").first.click()
    item = page.locator(".lm-Menu .lm-Menu-item[data-command='runmenu:run-all']").first
    item.wait_for(state="visible", timeout=10_000)
    item.click()
    # without a running kernel JupyterLab asks for one: accept the notebook's own. Wait for that dialog or for the
    # first cell to start (a prompt reading [*] or [n]), not a fixed 3 s for a dialog that does not come (3 s of
    # every browser test: _open has waited for the kernel)
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(
            "() => !!document.querySelector('.jp-Dialog') || Array.from(document.querySelectorAll("
            "'.jp-CodeCell .jp-InputPrompt')).some(c => /\\[[\\d*]+\\]/.test(c.textContent))",
            timeout=10_000, polling=100)
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    if dialog.count() and dialog.first.is_visible():
        dialog.locator(".jp-mod-accept").first.click()


def _panel(page, label: str):
    return page.locator(".jp-OutputArea", has=page.locator(".widget-hslider .widget-label", has_text=label)).last


def _slider_handle(page, label: str):
    slider = page.locator(".widget-hslider", has=page.locator(".widget-label", has_text=label)).last
    return slider, slider.locator(".noUi-handle").first


def _kernel_errors(page) -> list[str]:
    """Text of the notebook's error outputs (tracebacks)."""
    return page.evaluate("(sel) => Array.from(document.querySelectorAll(sel)).map(e => e.textContent)"
                         ".filter(t => t.includes('Traceback'))", _ERROR_SEL)


def _launch(p):
    return p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True, timeout=60_000)


# ----------------------------------------------------------------------------- tests
def _head_weights_ok(z: list[list[float]], zeta: float, r: int) -> tuple[float, float]:
    """Check the drawn ``w`` heatmap (``[L, H_Q]``): per layer and KV group the weights sum to 1 and none is
    below the floor ``ζ/r``. Returns ``(max |Σ_g w − 1|, min w)``."""
    worst = max(abs(sum(row[g * r:(g + 1) * r]) - 1.0) for row in z for g in range(len(row) // r))
    low = min(min(row) for row in z)
    assert worst < 1e-6, f"a KV group's weights sum to 1 ± {worst:.2e} in the drawn heatmap"
    assert low >= zeta / r - 1e-9, f"a drawn weight {low} lies below the floor ζ/r = {zeta / r}"
    return worst, low


@contextlib.contextmanager
def _notebook_page(lab, name: str, console: list | None = None, init_script: str | None = None):
    """A chromium page (in the module's browser context) showing notebook ``name`` after Run ▸ Run All Cells;
    closes the page and shuts the kernels down afterwards. ``console``: a list that collects the page's console
    warnings and errors. ``init_script``: JavaScript run in the page before JupyterLab's."""
    base, token, _, context = lab
    page = context.new_page()
    try:
        if init_script is not None:
            page.add_init_script(init_script)
        page.set_default_timeout(60_000)
        if console is not None:
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}")
                    if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: console.append(f"uncaught: {e}"))  # e.g. a widget model that failed
        _open(page, base, token, name)
        _run_all_from_menu(page)
        yield page
    finally:
        page.close()
        _shutdown_kernels(base, token)


def _pooling_zeta_checks(page, artifacts: Path) -> None:
    """The pooling notebook (02), run: its HeadsPanel draws valid head weights and follows the ζ slider
    (keyboard ``Home``: ζ = 0.01); ζ is typed back to 0.5 at the end (the notebook's value)."""
    # the panel: two figures with data (the w heatmap of 30 layers x 9 heads, the residual rows)
    _wait_panel(page, "ζ", "figs.length === 2 && figs.every(f => f.z && f.z.length > 0 && f.href) "
                           "&& figs.some(f => f.title.includes('per layer and head'))",
                RUN_ALL_TIMEOUT_S, artifacts / "nb02-not-rendered.png")
    panel = _panel(page, "ζ")
    panel.scroll_into_view_if_needed()
    figs = _figures(page, "ζ")
    heads = next(f for f in figs if "per layer and head" in f["title"])
    residual = next(f for f in figs if f is not heads)
    assert heads["meta"]["figure"] == "head_heatmap" and heads["meta"]["zeta"] == pytest.approx(0.5)
    assert len(heads["z"]) == 30 and all(len(row) == 9 for row in heads["z"])   # SmolLM2: 30 layers, 9 heads
    _head_weights_ok(heads["z"], zeta=0.5, r=3)
    assert "layer 15" in residual["title"] and any("w=" in t for t in residual["yticks"])
    before = artifacts / "nb02-zeta-before.png"
    panel.screenshot(path=str(before))

    # ζ: Home on the slider's handle (keyboard) → the lowest value 0.01; the panel recomputes the pooling
    zeta, handle = _slider_handle(page, "ζ")
    handle.focus()
    handle.press("Home")
    _wait_figures(page, "ζ", "figs.some(f => f.meta && f.meta.figure === 'head_heatmap' "
                             "&& Math.abs(f.meta.zeta - 0.01) < 1e-9 && f.href !== " + json.dumps(heads["href"]) + ")",
                  timeout_s=60)
    assert float(zeta.locator(".widget-readout").first.inner_text(timeout=10_000)) == pytest.approx(0.01)
    figs2 = _figures(page, "ζ")
    heads2 = next(f for f in figs2 if f["meta"] and f["meta"]["figure"] == "head_heatmap")
    residual2 = next(f for f in figs2 if f is not heads2)
    assert heads2["meta"]["zeta"] == pytest.approx(0.01) and heads2["href"] != heads["href"], _kernel_errors(page)
    _, low = _head_weights_ok(heads2["z"], zeta=0.01, r=3)
    change = max(abs(a - b) for r1, r2 in zip(heads["z"], heads2["z"]) for a, b in zip(r1, r2))
    assert change > 0.05, f"the drawn weights moved by at most {change}"
    assert low < 0.5 / 3, "with ζ = 0.01 some head must fall below the old floor ζ/r = 1/6"
    # the residual rows' labels carry w_h; the layer (and hence the title) stays
    _wait_figures(page, "ζ", "figs.some(f => f.yticks.length && f.yticks.join('|') !== "
                             + json.dumps("|".join(residual["yticks"])) + ")", timeout_s=30)
    assert residual2["title"] == residual["title"]
    after = artifacts / "nb02-zeta-after.png"
    panel.screenshot(path=str(after))
    assert before.read_bytes() != after.read_bytes(), "the panel's pixels did not change"
    assert after.stat().st_size > 10_000
    # back to the notebook's ζ = 0.5 (typed into the editable readout) before the generic slider sweep
    ro = zeta.locator(".widget-readout").first
    ro.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("0.5")
    page.keyboard.press("Enter")
    _wait_figures(page, "ζ", "figs.some(f => f.meta && f.meta.figure === 'head_heatmap' "
                             "&& Math.abs(f.meta.zeta - 0.5) < 1e-9)", timeout_s=60)


def test_synthetic_panel_layer_slider(lab, artifacts):
    """A small HeadsPanel on a synthetic capture: the layer slider moves the residual figure's title."""
    with _notebook_page(lab, "panel.ipynb") as page:
        _wait_panel(page, "layer", "figs.length === 2 && figs.every(f => f.z && f.z.length > 0 && f.href) "
                                   "&& figs.some(f => f.title.includes('layer 1'))",
                    RUN_ALL_TIMEOUT_S, artifacts / "synthetic-not-rendered.png")
        panel = _panel(page, "layer")
        panel.screenshot(path=str(artifacts / "synthetic-panel-before.png"))
        heads = next(f for f in _figures(page, "layer") if f["meta"]["figure"] == "head_heatmap")
        assert len(heads["z"]) == 4 and all(len(row) == 6 for row in heads["z"])
        _head_weights_ok(heads["z"], zeta=0.5, r=3)

        layer, handle = _slider_handle(page, "layer")
        handle.focus()
        handle.press("ArrowRight")
        _wait_figures(page, "layer", "figs.some(f => f.title.includes('layer 2'))", timeout_s=30)
        assert layer.locator(".widget-readout").first.inner_text(timeout=10_000).strip() == "2"
        panel.screenshot(path=str(artifacts / "synthetic-panel-after.png"))
        if not public_only():  # the rule's own check: under plotly's stock widget (the forced fallback) the injected
            _layout_rule_sees_an_overprint(page, panel)  # overprints re-lay its view (its box shrank to 100 px)


# a page like JupyterLab's around three plotly figures: a panel's output area (a ζ slider, a heatmap whose title
# is drawn on two lines, a bar figure of the kept set) and a plain output area; Plotly.newPlot draws them
_WRAPPED_TITLE_PAGE = """<html><body>
<div class="jp-OutputArea"><div class="widget-hslider"><div class="widget-label">ζ (group floor)</div></div>
  <div id="heads"></div><div id="kept"></div></div>
<div class="jp-OutputArea"><div id="plain"></div></div></body></html>"""
_WRAPPED_TITLE = "head weight w_h = ζ/r + (1−ζ) v_h, per<br>layer and head"


def test_figure_readers_read_a_wrapped_title_as_its_words():
    """A title plotly draws on two lines (``<br>``: paper_layout wraps a title at a narrow width, as every panel
    figure is under plotly's stock widget, which reports no live width) reads as its words in each reader of the
    drawn figures (:data:`_FIGURES_JS`, :data:`_SHOWN_JS`, :data:`_RUN_VIEW_JS`), not as its lines run together
    (the title's ``textContent``: "perlayer", which kept notebook 02's ζ check waiting for good under
    ``$WORKBENCH_PUBLIC_ONLY``). The heatmap's z and image are read too. A plain page, no JupyterLab."""
    heads = {"data": [{"type": "heatmap", "z": [[0.25, 0.75], [0.5, 0.5]]}],
             "layout": {"title": {"text": _WRAPPED_TITLE}, "width": 320, "height": 240, "meta": {"figure": "head_heatmap"}}}
    kept = {"data": [{"type": "bar", "x": [0, 1], "y": [1, 2]}],
            "layout": {"title": {"text": "kept<br>positions"}, "width": 320, "height": 240,
                       "meta": {"figure": "kept_positions"}}}
    plain = {"data": [{"type": "bar", "x": [0], "y": [1]}], "layout": {"title": {"text": "one line"}, "width": 320,
                                                                       "height": 240}}
    with sync_playwright() as p:
        browser = _launch(p)
        try:
            page = browser.new_page()
            page.set_content(_WRAPPED_TITLE_PAGE)
            page.add_script_tag(content=get_plotlyjs())
            page.evaluate("(figs) => Promise.all(Object.entries(figs).map(([id, f]) => "
                          "Plotly.newPlot(id, f.data, f.layout)))", {"heads": heads, "kept": kept, "plain": plain})
            drawn = page.evaluate("() => { const t = document.querySelector('#heads .gtitle'); "
                                  "return [t.querySelectorAll('tspan.line').length, t.textContent]; }")
            figs = _figures(page, "ζ")
            shown = page.evaluate(_SHOWN_JS)
            run_view = page.evaluate(_RUN_VIEW_JS, page.locator(".jp-OutputArea").first.element_handle())
        finally:
            browser.close()
    words = _WRAPPED_TITLE.replace("<br>", " ")
    assert drawn == [2, words.replace("per layer", "perlayer")], drawn   # two lines; run together in textContent
    assert [f["title"] for f in figs] == [words, "kept positions"]
    assert figs[0]["z"] == [[0.25, 0.75], [0.5, 0.5]] and figs[0]["href"].startswith("data:image/png")
    assert [[f["title"] for f in a["figs"]] for a in shown] == [[words, "kept positions"], ["one line"]]
    assert run_view["kept"] == {"traces": 1, "placeholder": None, "title": "kept positions"}


def test_widget_models_anywidget_gave_up_on_still_follow_the_sliders(lab, artifacts):
    """Models that anywidget gave up on (:data:`DEAF_FIRST_JS`: the heads panel's two figures and a figure outside
    any panel, as a page busy for over 2 s leaves them by chance) drop every message
    of their comm. The figures report themselves deaf (their probe, ``figure_widget._LOADER_ESM``; a warning in the
    console each), and the kernel sends each its figure as it is now and every later change through the bundle's
    widget: the heads panel follows ζ; the figure outside a panel shows the change made before the page knew it was
    deaf, then follows its slider. The token view (a standard HTML widget and a hidden standard text box for its
    clicks) follows the layer slider, and a click on a token makes it the query row."""
    if public_only():
        pytest.skip("the relay to views anywidget gave up on is the workbench's own figure widget's; plotly's stock "
                    "widget (the public fallback, forced here) has none")
    console: list[str] = []
    with _notebook_page(lab, "deaf.ipynb", console, init_script=DEAF_FIRST_JS) as page:
        _wait_done(page, RUN_ALL_TIMEOUT_S)
        assert not _kernel_errors(page), _kernel_errors(page)
        def deaf() -> int:
            return sum(_RECOVERED in c for c in console)

        deadline = time.monotonic() + 60
        while deaf() < 3 and time.monotonic() < deadline:
            page.wait_for_timeout(250)
        assert deaf() == 3, console                          # the three deafened figures, each once
        assert any(_GAVE_UP in c for c in console), console  # they were deaf
        # the figure outside a panel: the kernel's change made before the page said it was deaf, then its slider
        _wait_panel(page, "solo k", "figs.length === 1 && figs[0].title === 'solo 1' && figs[0].meta.solo === 1", 60,
                    artifacts / "deaf-solo-not-resent.png")
        solo, handle = _slider_handle(page, "solo k")
        handle.focus()
        handle.press("End")
        _wait_figures(page, "solo k", "figs.length === 1 && figs[0].title === 'solo 5' && figs[0].meta.solo === 5",
                      timeout_s=30)
        bars = page.evaluate("""(label) => { const a = (""" + _PANEL_JS + """)(label);
          const gd = a.querySelector('.js-plotly-plot'); return [gd.data.length, Array.from(gd.data[0].y)]; }""",
                             "solo k")
        assert bars == [1, [5, 6, 7]], bars                 # one trace (the first replaced, not doubled), its values
        _wait_panel(page, "ζ", "figs.length === 2 && figs.every(f => f.z && f.z.length > 0 && f.meta.zeta === 0.5)",
                    60, artifacts / "deaf-not-rendered.png")
        panel = _panel(page, "ζ")
        panel.screenshot(path=str(artifacts / "deaf-heads-before.png"))
        zeta, handle = _slider_handle(page, "ζ")
        handle.focus()
        handle.press("Home")
        _wait_figures(page, "ζ", "figs.length === 2 && figs.some(f => f.meta.figure === 'head_heatmap' && "
                                 "Math.abs(f.meta.zeta - 0.01) < 1e-9)", timeout_s=30)
        panel.screenshot(path=str(artifacts / "deaf-heads-after.png"))

        before = page.evaluate(_TOKENS_JS)
        assert before is not None and "layer 1" in before["title"], before
        layer, handle = _slider_handle(page, "layer")              # the last: the token panel's
        handle.focus()
        handle.press("End")
        page.wait_for_function("(js) => { const t = eval('(' + js + ')')(); return !!t && /layer 3/.test(t.title); }",
                               arg=_TOKENS_JS, timeout=30_000, polling=250)
        page.locator(".jp-OutputArea", has=page.locator(".wb-token-widget")).last.scroll_into_view_if_needed()
        target = page.evaluate(_TOKENS_JS)["spans"][-3]
        page.mouse.click(target["x"], target["y"])
        page.wait_for_function("(js) => { const t = eval('(' + js + ')')(); return !!t && t.query !== null; }",
                               arg=_TOKENS_JS, timeout=30_000, polling=250)
        # the captured row nearest the clicked token is the query row (TokenPanel.click; ties: the earlier row)
        menu = page.locator(".widget-dropdown", has=page.locator(".widget-label", has_text="query row")).last
        rows = [int(t.rsplit("@", 1)[1]) for t in menu.locator("option").all_inner_texts() if "@" in t]
        want = min(rows, key=lambda p: (abs(p - target["pos"]) * 2 + (p > target["pos"]), p))
        assert page.evaluate(_TOKENS_JS)["query"] == want, (target["pos"], rows)
    assert not _console_problems(console, warnings=True), console  # recovered: anywidget's errors are explained


# Overprint a shown figure of a panel by hand (the first one with a title): the title moved onto the plot area, a
# tick label doubled, another pushed out of the canvas, the box that holds the figure cut to 100 px high (overflow hidden)
_OVERPRINT_JS = """(area) => {
  const gd = Array.from(area.querySelectorAll('.js-plotly-plot')).find(g => g.offsetParent && g.querySelector('.gtitle'));
  const drag = gd.querySelector('.draglayer .nsewdrag');
  const title = gd.querySelector('.gtitle');
  title.setAttribute('x', +drag.getAttribute('x') + 60);
  title.setAttribute('y', +drag.getAttribute('y') + 40);
  const ticks = gd.querySelectorAll('.xtick text');
  ticks[0].parentNode.appendChild(ticks[0].cloneNode(true));
  ticks[ticks.length - 1].setAttribute('x', +gd.layout.width + 80);
  gd.parentElement.style.overflow = 'hidden';    // cut at 100 px high (its width stays: no new room reported)
  gd.parentElement.style.maxHeight = '100px';
  return Array.from(area.querySelectorAll('.js-plotly-plot')).indexOf(gd);
}"""


def _layout_rule_sees_an_overprint(page, panel) -> None:
    """The live layout check can fail: each overprint of :data:`_OVERPRINT_JS` is reported, and a figure hidden
    in the page (``display: none``, as a panel's ``_hidden`` trait sets it) is not read."""
    assert not _layout_problems(page, "synthetic", panel.element_handle()), "the synthetic panel overprints already"
    n = len(page.evaluate(LIVE_BOXES_JS, panel.element_handle()))
    j = page.evaluate(_OVERPRINT_JS, panel.element_handle())
    found = " | ".join(" ".join(v) for v in _layout_problems(page, "overprinted", panel.element_handle()).values())
    for want in ("title", "overlaps a plot area", "overlap: tick", "outside the", "clipped by the page"):
        assert want in found, (want, found)
    # the plot is its widget's element, where ``_hidden`` sets the display
    page.evaluate("([area, j]) => { area.querySelectorAll('.js-plotly-plot')[j].style.display = 'none'; }",
                  [panel.element_handle(), j])
    assert len(page.evaluate(LIVE_BOXES_JS, panel.element_handle())) == n - 1


# the controls' labels (ipywidgets' description boxes) the page shows cut short: text wider than its box (the
# colour-scale dropdown's "residual colours" read "residual c…" in a default-width label column)
_CUT_LABELS_JS = """() => Array.from(document.querySelectorAll('.jp-OutputArea .widget-label'))
  .filter(l => l.offsetParent !== null && l.textContent.trim() && l.scrollWidth > l.clientWidth + 1)
  .map(l => l.textContent.trim())"""


# the token spans of the token view: [{pos, text, x, y}] (text as the browser renders it, screen centre of
# each span's first box) and the position of the boxed query token
_TOKENS_JS = """() => {
  const root = document.querySelector('.jp-OutputArea .wb-token-widget');
  if (!root) return null;
  const spans = Array.from(root.querySelectorAll('.wb-text .tk[data-pos]'));
  const q = root.querySelector('.wb-text .tk.q');
  return {query: q ? +q.dataset.pos : null, title: (root.querySelector('.wb-title') || {}).textContent || '',
    spans: spans.map(s => { const r = s.getClientRects()[0] || s.getBoundingClientRect();
      return {pos: +s.dataset.pos, text: s.textContent, x: r.left + Math.min(r.width, 6) / 2 + 1,
              y: r.top + r.height / 2, w: r.width}; })};
}"""


def test_token_view_click_sets_the_query_row(lab, artifacts):
    """The token view (TokenPanel, HTML) in JupyterLab: every token's full text is rendered (leading spaces,
    tabs, newlines, markup characters), nothing clipped; clicking a token makes the captured row at (or
    nearest to) that position the query row (the boxed token and the *query row* menu follow); no console
    warnings or errors."""
    console: list[str] = []
    with _notebook_page(lab, "tokens.ipynb", console=console) as page:
        page.wait_for_function("(js) => { const t = eval('(' + js + ')')(); return !!t && t.spans.length > 10; }",
                               arg=_TOKENS_JS, timeout=RUN_ALL_TIMEOUT_S * 1000, polling=500)
        before = page.evaluate(_TOKENS_JS)
        T = len(before["spans"])
        want = [TOKEN_WORDS[i % len(TOKEN_WORDS)] for i in range(T)]
        assert [s["text"] for s in before["spans"]] == want          # the rendered text is the token strings
        assert [s["pos"] for s in before["spans"]] == list(range(T)) and before["query"] is None
        # nothing clipped: every span lies inside the output area, and the whole text reads back in order
        area = page.locator(".jp-OutputArea", has=page.locator(".wb-token-widget")).last
        area.scroll_into_view_if_needed()
        before = page.evaluate(_TOKENS_JS)
        box = area.bounding_box()
        assert all(box["x"] - 1 <= s["x"] <= box["x"] + box["width"] + 1 for s in before["spans"] if s["w"] > 0)
        text = page.locator(".wb-token-widget .wb-text").first.evaluate("e => e.textContent")
        assert text == "".join(want)
        target = before["spans"][-3]                 # a tail row's own token (T - 3)
        area.screenshot(path=str(artifacts / "tokens-before.png"))
        page.mouse.move(target["x"], target["y"])
        page.mouse.click(target["x"], target["y"])
        page.wait_for_function("(js) => { const t = eval('(' + js + ')')(); return !!t && t.query !== null; }",
                               arg=_TOKENS_JS, timeout=30_000, polling=250)
        after = page.evaluate(_TOKENS_JS)
        assert after["query"] == target["pos"], after["title"]
        label = page.locator(".widget-dropdown", has=page.locator(".widget-label", has_text="query row")).last
        text = label.locator("select").evaluate("s => s.options[s.selectedIndex].text").replace("\xa0", " ")
        assert f"@ {target['pos']}" in text, text
        area.screenshot(path=str(artifacts / "tokens-after.png"))
    bad = _console_problems(console, warnings=True)
    assert not bad, f"console warnings or errors: {bad[:5]}"


def test_registered_policy_in_the_eviction_panel(lab, artifacts):
    """A policy defined in a test module (``tests/_my_policy.py``'s MeanKey), registered at run time in the kernel,
    in the eviction panel in JupyterLab: the policy menu shows it, in its group, as the chosen one; the
    kept figure is the placeholder that says why it has no preview (MeanKey scores from the cache's keys); pressing
    *Run eviction* generates under it: the answer table names it and the budget; no console error."""
    console: list[str] = []
    with _notebook_page(lab, "policy.ipynb", console) as page:
        _wait_done(page, RUN_ALL_TIMEOUT_S)
        assert not _kernel_errors(page), _kernel_errors(page)
        area = page.locator(".jp-OutputArea").filter(has=page.locator(".widget-button", has_text="Run eviction")).last
        menu = area.locator(".widget-dropdown", has=page.locator(".widget-label", has_text="policy")).locator("select")
        shown = menu.first.evaluate("s => s.options[s.selectedIndex].text").replace("\xa0", " ")
        assert shown == "attention-free · mean-key", shown
        options = menu.first.evaluate("s => Array.from(s.options).map(o => o.text)")
        assert sum("mean-key" in o for o in options) == 1 and any("deferkv" in o for o in options), options
        page.wait_for_function("(a) => Array.from(a.querySelectorAll('.js-plotly-plot')).some(gd => gd.layout && "
                               "gd.layout.meta && gd.layout.meta.policy === 'mean-key' && "
                               "/no preview/.test(gd.layout.meta.placeholder || ''))",
                               arg=area.element_handle(), timeout=60_000, polling=250)
        area.screenshot(path=str(artifacts / "policy-before.png"))
        area.locator(".widget-button", has_text="Run eviction").first.click()
        page.wait_for_function("(a) => /mean-key, B = 20/.test(a.textContent) && /full cache/.test(a.textContent)",
                               arg=area.element_handle(), timeout=RUN_ALL_TIMEOUT_S * 1000, polling=200)
        assert "run failed" not in area.inner_text()
        area.screenshot(path=str(artifacts / "policy-after.png"))
    bad = _console_problems(console)
    assert not bad, f"console errors: {bad[:5]}"


# what the panels of the prompt notebook show: per output area, its shown plotly figures (figure kind, title, x length
# of the first trace) and its token view's text (a panel hides the figures of the capture before, then closes them)
_SHOWN_JS = """() => Array.from(document.querySelectorAll('.jp-OutputArea')).map(a => ({
  figs: Array.from(a.querySelectorAll('.js-plotly-plot')).filter(gd => gd.offsetParent !== null).map(gd => ({
    figure: gd.layout && gd.layout.meta && gd.layout.meta.figure, title: (""" + _TITLE_JS + """)(gd),
    nx: gd.data && gd.data[0] && gd.data[0].x ? gd.data[0].x.length : 0,
    xlast: gd.data && gd.data[0] && gd.data[0].x && gd.data[0].x.length ? Number(gd.data[0].x[gd.data[0].x.length - 1]) : null})),
  text: Array.from(a.querySelectorAll('.wb-token-widget .wb-text')).filter(e => e.offsetParent !== null)
    .map(e => e.textContent).join(''),
  html: Array.from(a.querySelectorAll('.widget-html')).map(e => e.textContent).join('|'),
}))"""


def _shown(page) -> dict:
    """The prompt notebook's panels as drawn: ``{heads: residual x length, heads_last: its last x (key or bin
    start), prio: priority title, tokens: text}``."""
    areas = page.evaluate(_SHOWN_JS)
    figs = [f for a in areas for f in a["figs"]]
    res = next((f for f in figs if f["figure"] == "residual_distribution"), {})
    pri = next((f for f in figs if f["title"].startswith("Chunk priorities")), {})
    return {"heads": res.get("nx"), "heads_last": res.get("xlast"), "prio": pri.get("title"),
            "tokens": "".join(a["text"] for a in areas)}


@pytest.mark.model
def test_prompt_panel_feeds_the_heads_priority_and_token_panels(lab, artifacts):
    """PromptPanel in JupyterLab: *Build and capture* with an empty box says so in the panel and changes
    nothing; three documents and a question typed into the boxes, built and captured, reach the head panel (the
    residual rows span the new prompt's non-sink keys), the priority panel (3 chunks) and the token view (the
    pasted words); then a RULER-style task (niah_multikey) at 2k tokens chosen in the panel's RULER mode, built and
    captured, reaches the same three panels; no console error."""
    console: list[str] = []
    with _notebook_page(lab, "prompt.ipynb", console) as page:
        _wait_done(page, RUN_ALL_TIMEOUT_S)
        assert not _kernel_errors(page), _kernel_errors(page)
        page.wait_for_function("(js) => { const t = eval('(' + js + ')')(); return t.some(a => a.text.length > 0) && "
                               "t.some(a => a.figs.some(f => f.figure === 'residual_distribution' && f.nx > 0)); }",
                               arg=_SHOWN_JS, timeout=60_000, polling=500)
        before = _shown(page)
        assert "of 2 chunks" in before["prio"] and "Tall ships" in before["tokens"], before
        area = page.locator(".jp-OutputArea").filter(has=page.locator(".widget-button", has_text="Build and capture")).last
        boxes = area.locator("textarea")
        assert boxes.count() == 4                                # three document boxes and the question
        button = area.locator(".widget-button", has_text="Build and capture").first
        button.click()                                           # every box empty: bad input, said in the panel
        page.wait_for_function("(a) => /document 1: empty/.test(a.textContent)", arg=area.element_handle(),
                               timeout=60_000, polling=250)
        assert _shown(page) == before
        for i, doc in enumerate(PROMPT_DOCS):
            boxes.nth(i).fill(doc)
        boxes.nth(3).fill("Who paints the lighthouse tower?")
        area.screenshot(path=str(artifacts / "prompt-before.png"))
        button.click()
        page.wait_for_function("(a) => /shown in 3 of 3 panels/.test(a.textContent)", arg=area.element_handle(),
                               timeout=RUN_ALL_TIMEOUT_S * 1000, polling=500)
        status = area.inner_text()
        T = int(re.search(r"T = (\d+) tokens, k = 3 chunks", status).group(1))
        page.wait_for_function("(js) => eval('(' + js + ')')().some(a => a.text.includes('Marla Quint'))",
                               arg=_SHOWN_JS, timeout=60_000, polling=250)
        after = _shown(page)
        assert after["heads"] == T - 4 and before["heads"] != after["heads"], (before, after, T)   # n_sink = 4
        assert after["heads_last"] == T - 1                      # every key drawn, the last one last
        assert "of 3 chunks" in after["prio"], after
        assert all(d in after["tokens"] for d in PROMPT_DOCS) and "Tall ships" not in after["tokens"]
        page.screenshot(path=str(artifacts / "prompt-after.png"), full_page=True)
        # RULER mode: a task family at 2k tokens, chosen in the panel, built and captured, reaches all three panels
        area.locator(".widget-toggle-button", has_text="RULER task").click()
        area.locator(".widget-dropdown select").select_option("niah_multikey")
        length = area.locator(".widget-text", has_text="haystack").locator("input")
        length.fill("2048")
        length.press("Enter")
        button.click()
        page.wait_for_function("(a) => /niah_multikey \\(seed 0\\)/.test(a.textContent) && /shown in 3 of 3 panels/"
                               ".test(a.textContent)", arg=area.element_handle(), timeout=RUN_ALL_TIMEOUT_S * 1000,
                               polling=500)
        status = area.inner_text()
        m = re.search(r"T = (\d+) tokens, k = (\d+) chunks", status)
        T_r, k_r = int(m.group(1)), int(m.group(2))
        assert 1800 <= T_r <= 2300 and k_r > 3, status             # near the asked length, more chunks than pasted
        # at 2k the residual heatmap bins the keys (at most its width in columns): its last bin starts just
        # before T
        page.wait_for_function("([js, T]) => eval('(' + js + ')')().some(a => a.figs.some(f => "
                               "f.figure === 'residual_distribution' && f.xlast > T - 32 && f.xlast < T))",
                               arg=[_SHOWN_JS, T_r], timeout=60_000, polling=250)
        ruler = _shown(page)
        assert 100 <= ruler["heads"] < T_r - 4 and T_r - 32 < ruler["heads_last"] < T_r, (ruler, T_r)
        assert f"of {k_r} chunks" in ruler["prio"], (ruler, status)
        assert ruler["tokens"] and not any(d in ruler["tokens"] for d in PROMPT_DOCS)   # the token view moved on
        page.screenshot(path=str(artifacts / "prompt-ruler.png"), full_page=True)
    bad = _console_problems(console)
    assert not bad, f"console errors: {bad[:5]}"


# JupyterLab's own start-up notes on a loaded machine (not the notebook's output)
_LAB_START = re.compile(r"Plugin @jupyterlab/\S+ (is taking too long to activate|.*took [\d.]+ ?ms to activate)")
# A page busy for over 2 s can leave a widget model that anywidget gave up on ("[anywidget] Failed to initialize
# model", an uncaught error at each message that reaches it); a figure's model then reports itself deaf, with this
# warning, and its kernel relays its changes to it (figure_widget._LOADER_ESM). Recovered, that is no failure.
_RECOVERED = "[workbench] the widget model of a figure failed to initialize"
_GAVE_UP = "[anywidget] Failed to initialize model"


def _console_problems(console: list[str], warnings: bool = False) -> list[str]:
    """The page's console errors and uncaught exceptions (``warnings``: its warnings too), less favicon 404s,
    JupyterLab's slow-plugin notices and the workbench's recovery warnings; anywidget's "Failed to initialize
    model" errors count only where no figure was replaced (:data:`_RECOVERED`)."""
    recovered = any(_RECOVERED in c for c in console)
    kinds = ("error", "uncaught", "warning") if warnings else ("error", "uncaught")
    return [c for c in console if c.startswith(kinds) and "favicon" not in c and not _LAB_START.search(c)
            and _RECOVERED not in c and not (recovered and _GAVE_UP in c)]



# ----------------------------------------------------------------------------- every notebook's panels
ALL_NOTEBOOKS = sorted(p.name for p in POOLING_NB.parent.glob("[0-9][0-9]_*.ipynb"))

# every panel output area: its sliders (label, readout), run toggles, export button, and a fingerprint of
# its figures' data (what plotly drew) and status text. `_FP_JS` is one panel's fingerprint (polled while
# waiting for a redraw: only that panel is read).
_FP_JS = """(a) => Array.from(a.querySelectorAll('.js-plotly-plot')).map(gd => JSON.stringify(
      (gd.data || []).map(t => [t.x && t.x.length, t.y && Array.from(t.y).slice(0, 400), t.z && String(t.z).slice(0, 4000),
                                t.marker && t.marker.color && String(t.marker.color).slice(0, 2000)]))).join('|')
      + '#' + Array.from(a.querySelectorAll('.widget-html')).map(h => h.textContent).join('|')
      // the HTML token view (an anywidget, no plotly): its spans' shading, marks and text
      + '#' + Array.from(a.querySelectorAll('.wb-token-widget')).map(w => w.innerHTML.slice(0, 20000)).join('|')"""
_AREAS_JS = "() => Array.from(document.querySelectorAll('.jp-OutputArea')).filter(a => a.querySelector('.widget-hslider'))"
_PANELS_JS = """([areasJs, fpJs]) => eval('(' + areasJs + ')')().map((a, i) => ({
    i,
    sliders: Array.from(a.querySelectorAll('.widget-hslider')).filter(s => s.offsetParent !== null)
      .map(s => (s.querySelector('.widget-label') || {}).textContent || ''),
    toggles: Array.from(a.querySelectorAll('.widget-checkbox')).map(c => c.textContent.trim())
      .filter(t => t.includes('re-run on change')),
    export: !!Array.from(a.querySelectorAll('button')).find(b => b.textContent.includes('export figures')),
    fingerprint: eval('(' + fpJs + ')')(a),
  }));"""
# a slider move whose messages the kernel has handled, then this long with no kernel message and the panel
# unchanged, changed nothing (counted from the kernel's reply, not from the key press: a loaded CPU can hold
# a message for seconds before the kernel starts on it)
INERT_S = float(os.environ.get("WORKBENCH_BROWSER_INERT_S", "1.5"))
#: how often a slider move's wait reads the panel's fingerprint and message counts (s)
POLL_S = 0.1

# The page's kernel messages, counted once per kernel connection (JupyterLab's ``anyMessage`` signal): the
# comm messages the page sent (a slider move, a plotly view's deltas), those the kernel has not yet answered
# with an ``idle`` status, and when the last message of any kind passed.
_MSGS_JS = """() => {
  const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  let t = window.__wbMsgs;
  if (!t || t.kernel !== k) {
    t = window.__wbMsgs = {kernel: k, sent: 0, pending: new Set(), last: Date.now()};
    k.anyMessage.connect((_, a) => {
      t.last = Date.now();
      const type = a.msg.header.msg_type;
      if (a.direction === 'send' && type === 'comm_msg') { t.sent += 1; t.pending.add(a.msg.header.msg_id); }
      if (a.direction === 'recv' && type === 'status' && a.msg.content.execution_state === 'idle')
        t.pending.delete(a.msg.parent_header.msg_id);
    });
  }
  return {sent: t.sent, pending: t.pending.size, quiet_ms: Date.now() - t.last, idle: k.status === 'idle'};
}"""


def _panels(page):
    return page.evaluate(_PANELS_JS, [_AREAS_JS, _FP_JS])


def _state(page, i: int) -> tuple[str, dict]:
    """Panel ``i``'s fingerprint and the page's kernel message counts (:data:`_MSGS_JS`), read together."""
    return page.evaluate("([areasJs, fpJs, msgsJs, i]) => [eval('(' + fpJs + ')')(eval('(' + areasJs + ')')()[i]),"
                         " eval('(' + msgsJs + ')')()]", [_AREAS_JS, _FP_JS, _MSGS_JS, i])


def _changed(page, i: int, before: str, timeout_s: float, same: bool = False, inert_s: float | None = None,
             sent: int | None = None) -> bool:
    """Wait (bounded by ``timeout_s``) until panel ``i``'s fingerprint differs from ``before`` (``same``: equals
    it) with every comm message answered and the kernel idle; whether it did. ``inert_s`` (with ``sent``, the
    count of comm messages before the move): give up early once the move's messages were sent and answered
    and no kernel message has passed for ``inert_s`` with the fingerprint unchanged (the move changed nothing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now, m = _state(page, i)
        settled = m["pending"] == 0 and m["idle"]
        if (now == before) == same and settled:
            return True
        if (inert_s is not None and sent is not None and settled and m["sent"] > sent
                and m["quiet_ms"] >= inert_s * 1000):
            return False
        time.sleep(POLL_S)
    return False


def _settled(page, i: int, timeout_s: float = 60.0, quiet_s: float = 0.3) -> tuple[str, int]:
    """Panel ``i``'s fingerprint once every comm message is answered, the kernel idle and the fingerprint has
    held still for ``quiet_s`` (a redraw still in flight would otherwise count as the next slider's change),
    and the count of comm messages sent so far; bounded by ``timeout_s``."""
    deadline, fp, since = time.monotonic() + timeout_s, None, time.monotonic()
    while True:
        now, m = _state(page, i)
        if now != fp or m["pending"] or not m["idle"]:
            fp, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s or time.monotonic() > deadline:
            return fp, m["sent"]
        if time.monotonic() > deadline:
            return fp, m["sent"]
        time.sleep(POLL_S)


def _type_value(page, slider, value: str) -> None:
    """Type ``value`` into the slider's editable readout (Enter) and wait (bounded) until it reads so."""
    ro = slider.locator(".widget-readout").first
    ro.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(value)
    page.keyboard.press("Enter")
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function("([el, v]) => el.textContent.trim() === v", arg=[ro.element_handle(), value.strip()],
                               timeout=10_000, polling=100)


def _slider_moves(page, area, i: int, sliders: list[str], at_end=None, phases: _Phases | None = None) -> list[str]:
    """Move each slider, from the notebook's state, to its low end (``Home``), or the high end when Home does
    not change its value, and check that panel ``i``'s figures or status changed; the other end when that end
    is inert (a bound can make one end inert, e.g. m₀ = 0 with nothing removable). With ``at_end`` (called as
    ``at_end(label, readout)`` once the panel has settled at an end that redrew it) the slider then goes to its
    other end too, and ``at_end`` is called there: every slider visits both ends (the layout checks). A slider
    that changes nothing is tried once more with four times the inert wait (a redraw held up by a loaded CPU;
    08's page and layer sliders were judged inert once in a loaded run). After each slider it is typed back to
    the notebook's value and the panel must show the notebook's state again, so that the next slider starts
    from there (without it a moved slider stayed where it was: ζ at an end made ε_row inert at both of
    its ends, 8 s of inert waits before the retry from the notebook's state, 24 s of notebook 06's 105 s).
    Returns the sliders that changed nothing. ``phases``: each slider's time and its steps (which end, changed
    or inert, seconds) are recorded there (:class:`_Phases`)."""
    def locate(label):
        return area.locator(".widget-hslider").filter(has=page.locator(".widget-label", has_text=label)).first

    start = {label: locate(label).locator(".widget-readout").first.inner_text() for label in sliders}
    moved: list[str] = []

    def restore(fp0: str) -> None:
        """Type every moved slider back to the notebook's value, the last moved first (a range that follows
        another slider, 09's K ≤ the page count of b, would clamp a value typed back before its bound), then
        every other slider that no longer reads its value (K, clamped when b moved), and once more if the
        panel is not back (a clamp this order missed). The panel must show the notebook's
        state again: the same values draw the same figures and status."""
        for attempt in range(2):
            # the moved sliders first (the bounds), then any value their ranges clamped (09: K after b)
            for label in [*reversed(moved), *(lb for lb in sliders if lb not in moved)]:
                if locate(label).locator(".widget-readout").first.inner_text() != start[label]:
                    _type_value(page, locate(label), start[label])
            if _changed(page, i, fp0, 20 if attempt == 0 else 90, same=True):
                break
        else:
            now = {lb: locate(lb).locator(".widget-readout").first.inner_text() for lb in sliders}
            raise AssertionError(f"panel {i}: typed back to the notebook's values {start} (they read {now}), "
                                 "the panel did not return to the notebook's figures and status")
        moved.clear()

    def try_slider(label, inert_s: float = INERT_S) -> bool | None:
        slider = locate(label)
        before, sent = _settled(page, i)
        readout = slider.locator(".widget-readout").first.inner_text()
        handle = slider.locator(".noUi-handle").first
        handle.focus()
        def value() -> str:
            return slider.locator(".widget-readout").first.inner_text()

        first = "Home"
        handle.press("Home")
        if value() == readout:
            first = "End"
            handle.press("End")
        if value() == readout:
            return None  # a one-value slider (e.g. one decode row)
        moved.append(label)
        if _step(f"{first}: changed", _changed(page, i, before, 90, inert_s=inert_s, sent=sent)):
            if at_end is not None:             # there, then at the other end
                fp, sent = _settled(page, i)
                at_end(label, value())
                handle.press("End" if first == "Home" else "Home")
                if _step("other end: changed", _changed(page, i, fp, 90, inert_s=inert_s, sent=sent)):
                    _settled(page, i)
                    at_end(label, value())
            return True
        _, sent = _settled(page, i)
        handle.press("End")
        ok = _step("End: changed", _changed(page, i, before, 90, inert_s=inert_s, sent=sent))
        if ok and at_end is not None:          # the state at Home (inert) is the one checked before
            _settled(page, i)
            at_end(label, value())
        return ok

    steps: list = []      # the present slider's (what, seconds since the step before)
    since = time.monotonic()

    def _step(what: str, ok: bool) -> bool:
        nonlocal since
        now = time.monotonic()
        steps.append((what if ok else what.replace("changed", "inert"), round(now - since, 2)))
        since = now
        return ok

    fp0, _ = _settled(page, i)
    unchanged = []
    for label in reversed(sliders):
        t = time.monotonic()
        steps.clear()
        since = t
        ok = try_slider(label)
        if ok is False:                           # a loaded CPU can hold a redraw past INERT_S: once more, patient
            restore(fp0)
            ok = try_slider(label, inert_s=4 * INERT_S)
        if ok is False:
            unchanged.append(label)
        if moved:                                 # the next slider starts from the notebook's state
            restore(fp0)
        if phases is not None:
            phases.sliders.append((label.strip(), round(time.monotonic() - t, 2), list(steps)))
    t = time.monotonic()
    restore(fp0)
    if phases is not None:
        phases.sliders.append(("(typed back)", round(time.monotonic() - t, 2)))
    return unchanged


# ----------------------------------------------------------------------------- live layout
# every shown plotly figure of a panel (a widget's) laid out at the live width its box allows (``widgets.base.live_width`` of the box's width,
# within the 4 px the view leaves unreported) and drawn at that size. The plot is the widget's own element (plotly
# draws into the view's element): its parent is the box that holds it, a panel's row of figures
_FITS_JS = """([full, low]) => Array.from(document.querySelectorAll('.jp-OutputArea .js-plotly-plot'))
  .filter(gd => gd.offsetParent !== null && gd.closest('.jupyter-widgets') && gd.layout).every(gd => {
    const room = Math.floor(gd.parentElement.clientWidth), want = Math.min(full, Math.max(low, room));
    const svg = gd.querySelector('svg.main-svg');
    return Math.abs(gd.layout.width - want) < 4 && !!svg && Math.abs(svg.getBoundingClientRect().width - gd.layout.width) < 1;
  })"""


def _set_width(page, width: int) -> None:
    """Resize the window to ``width`` px (the height stays), wait until JupyterLab has laid its panels out again
    (the notebook no wider than the window) and every shown figure has been laid out again by its panel at the
    room its box now gives it (:data:`_FITS_JS`: the view reports the room, the kernel re-lays the figures) and
    the kernel is idle."""
    from workbench.show.widgets.base import FIGURE_WIDTH, MIN_FIGURE_WIDTH

    page.set_viewport_size({"width": width, "height": HEIGHT})
    page.wait_for_function("(w) => { const nb = document.querySelector('.jp-Notebook');"
                           " return window.innerWidth === w && (!nb || nb.getBoundingClientRect().right <= w); }",
                           arg=width, timeout=30_000, polling=100)
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    # plotly's stock widget (the public fallback) reports no room: its panels stay at the narrowest live width
    full = MIN_FIGURE_WIDTH if public_only() else FIGURE_WIDTH
    with contextlib.suppress(PlaywrightTimeout):   # a figure left at another width: the layout check says how it is cut
        page.wait_for_function(f"(a) => ({_FITS_JS})(a) && (({_MSGS_JS})()).pending === 0",
                               arg=[full, MIN_FIGURE_WIDTH], timeout=90_000, polling=250)


def _layout_problems(page, where: str, root=None) -> dict[str, list[str]]:
    """The layout rule (:func:`_layout_rules.layout_problems`) on every shown plotly plot of the page (or of the
    element ``root``, a panel's output area): ``{"<where> @ <window width> px, figure <n> (<kind>)": problems}``.
    Each must be laid out at a fixed width (``autosize`` off): a panel's live figure by its panel at the live width,
    a plain plotly output of a cell by the notebooks' renderer (``workbench.show.outputs``, at ``OUTPUT_WIDTH``);
    plotly must not resize either."""
    figs = page.evaluate(LIVE_BOXES_JS, root)
    width = page.viewport_size["width"]
    out = {}
    for j, d in enumerate(figs):
        bad = layout_problems(d) + ([] if d["fixed"] else ["not laid out at a fixed width (autosize)"])
        if bad:
            kind = "panel" if d["widget"] else "output"
            out[f"{where} @ {width} px, figure {j} ({d['figure']}, {kind})"] = bad
    return out


def _report(problems: dict[str, list[str]]) -> str:
    return "\n".join(f"{k}: " + "; ".join(v[:6]) + (f" (+{len(v) - 6})" if len(v) > 6 else "")
                     for k, v in list(problems.items())[:20])


def _layout_sweep(page, panels: list[dict], tag: str, artifacts: Path, each_panel=None,
                  phases: _Phases | None = None, console: list[str] | None = None) -> dict[str, list[str]]:
    """The live layout checks of one notebook page, run once: every shown plotly plot of the page
    after Run All at :data:`WIDE` and at :data:`NARROW` px; then, at the narrow width, each panel's sliders to
    both ends (:func:`_slider_moves`) with the panel's plots checked at every end; at the end the whole page
    again at both widths. ``each_panel(p, area)`` runs after a panel's sliders (toggles, export). Screenshots:
    ``<tag>-panel<i>-wide.png`` (after Run All) and ``-after.png`` (narrow, after the
    moves). Returns the problems found (an empty dict: none); asserts that every slider changed something.
    ``phases`` (:class:`_Phases`): where the time went. ``console``: the page's console messages so far, quoted
    when a slider changes nothing (a widget model that failed to initialize drops every later message).

    How the live width is decided: in Python, by the panel (``Panel`` applies ``paper_layout`` at its
    ``live_width``, ``autosize`` off), from the room the browser gives the figures: each figure's view reports
    the width of the box that holds it (``FigureWidget._view_width``) and the panel lays its figures out at
    ``widgets.base.live_width`` of it: ``FIGURE_WIDTH`` = 660 px where there is room (a 1400 px window: the
    notebook's output area is about 970 px wide), less in a 1000 px window with JupyterLab's file browser open
    (about 570 px; before, the 660 px figures were cut by about 90 px there), never under ``MIN_FIGURE_WIDTH``.
    So the two widths draw different layouts. The moves run at the narrow one (the tighter layout, and the
    cuts by the page); at 660 px every slider end is checked in-process by ``tests/test_live_layout.py``, and
    here after Run All and after the moves."""
    phases = phases or _Phases()
    with phases.phase("layout after Run All, wide"):
        problems = _layout_problems(page, "after Run All")
        areas = [page.locator(".jp-OutputArea").filter(has=page.locator(".widget-hslider")).nth(p["i"]) for p in panels]
        for p, area in zip(panels, areas):
            area.scroll_into_view_if_needed()
            area.screenshot(path=str(artifacts / f"{tag}-panel{p['i']}-wide.png"))
    with phases.phase("to the narrow width"):
        _set_width(page, NARROW)
    try:
        problems.update(_layout_problems(page, "after Run All"))
        for p, area in zip(panels, areas):
            handle = area.element_handle()

            def at_end(label, value, i=p["i"], handle=handle):
                problems.update(_layout_problems(page, f"panel {i}, {label.strip()} = {value.strip()}", handle))

            with phases.phase(f"panel {p['i']}: {len(p['sliders'])} sliders"):
                unchanged = _slider_moves(page, area, p["i"], p["sliders"], at_end=at_end, phases=phases)
            assert not unchanged, (f"{tag}: sliders {unchanged} changed neither a figure nor the status; console: "
                                   f"{[c for c in console or [] if 'favicon' not in c][:5]}")
            if each_panel is not None:
                with phases.phase(f"panel {p['i']}: toggles and export"):
                    each_panel(p, area)
            area.screenshot(path=str(artifacts / f"{tag}-panel{p['i']}-after.png"))
        problems.update(_layout_problems(page, "after the sliders"))
    finally:
        with phases.phase("to the wide width"):
            _set_width(page, WIDE)
    problems.update(_layout_problems(page, "after the sliders"))
    return problems


# every panel figure drawn with its data (a view drawn from an empty first state stays bare axes), or empty
# with the reason in its meta (an eviction policy without a preview): the ones that are not
_EMPTY_JS = ("(areasJs) => eval('(' + areasJs + ')')().map((a, i) => Array.from("
             "a.querySelectorAll('.js-plotly-plot')).map((gd, j) => ((gd.data || []).length "
             "|| (gd.layout && gd.layout.meta && gd.layout.meta.placeholder)) ? null : "
             "`panel ${i} figure ${j}`)).flat().filter(x => x)")


def _assert_drawn(page, name: str) -> None:
    """Every panel figure drawn with its data (:data:`_EMPTY_JS`; views draw after the kernel is idle: allowed a while)."""
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(f"(a) => ({_EMPTY_JS})(a).length === 0", arg=_AREAS_JS, timeout=30_000, polling=500)
    empty = page.evaluate(_EMPTY_JS, _AREAS_JS)
    assert not empty, f"{name}: panel figures drawn as bare axes (no data reached the view): {empty}"


def _wait_done(page, timeout_s: float) -> None:
    """Wait until every code cell ran (an execution count, kernel idle) or a traceback shows."""
    page.wait_for_function(
        "(errSel) => { const w = window.jupyterapp.shell.currentWidget; const k = w.sessionContext.session.kernel;"
        " const cells = Array.from(document.querySelectorAll('.jp-CodeCell .jp-InputPrompt'));"
        " const done = cells.length > 0 && cells.every(c => /\\[\\d+\\]/.test(c.textContent)) && k.status === 'idle';"
        " return done || Array.from(document.querySelectorAll(errSel)).some(e => e.textContent.includes('Traceback')); }",
        arg=_ERROR_SEL, timeout=timeout_s * 1000, polling=250)


# ----------------------------------------------------------------------------- exports at the slider ends
#: notebooks whose sliders are exported one at a time (each visible slider alone at its max, then at its min, the
#: others at the notebook's values); every other notebook exports all visible sliders of every panel at their max at
#: once, then all at their min (the choice and the budget: see :func:`test_notebook_panels_in_browser`)
EXPORT_PER_SLIDER = frozenset({"11"})
TESTS_DIR = Path(__file__).resolve().parent

# the widget model ids each panel output area shows (its cell's widget outputs, as JupyterLab holds them)
_MODEL_IDS_JS = """(areasJs) => { const nb = window.jupyterapp.shell.currentWidget.content;
  return eval('(' + areasJs + ')')().map(a => { const c = nb.widgets.find(w => w.node.contains(a));
    return ((c && c.model.toJSON().outputs) || []).map(o => (o.data || {})['application/vnd.jupyter.widget-view+json'])
      .filter(v => v && v.model_id).map(v => v.model_id); }); }"""
# a new code cell at the end of the notebook, run (not awaited: the caller polls its outputs); its index
_ADD_CELL_JS = """(code) => { const app = window.jupyterapp, nb = app.shell.currentWidget.content, m = nb.model;
  m.sharedModel.insertCell(m.cells.length, {cell_type: 'code', source: code});
  nb.activeCellIndex = m.cells.length - 1;
  app.commands.execute('notebook:run-cell');
  return m.cells.length - 1; }"""
_CELL_OUTPUTS_JS = """(i) => window.jupyterapp.shell.currentWidget.content.model.cells.get(i).toJSON().outputs || []"""
_EXPORTED = "WB-EXPORT "
# what the added cell runs in the notebook's kernel: every panel (a name of the notebook's; one shown but not named
# fails the test: not found) whose widget is one of ``want``'s model ids exported
# through its own public export (``Panel.export_all``: what the *export figures* button calls) at one column, SVG (the
# paper rules are measured on it; PDF and PNG are drawn from the same laid-out figure), into ``folder/<key>``; one
# line of JSON: per panel, its slider values, its status (a refused state: ``error``), its files and index axes
_EXPORT_CELL = '''import json, time
import plotly.graph_objects as go
from IPython import get_ipython
from _layout_rules import whole_axes
from workbench.show.widgets.base import Panel
from workbench.show.widgets.token_widget import TokenWidget


def _wb_export(want, folder):
    found = {want[p.widget.model_id]: p for p in list(get_ipython().user_ns.values()) if isinstance(p, Panel)
             and getattr(p, "widget", None) is not None and p.widget.model_id in want}
    out = {}
    for key, p in sorted(found.items()):
        t = time.perf_counter()
        rec = {"panel": type(p).__name__, "params": p.sidecar_params(), "error": p.error}
        if p.error is None:
            paths = p.export_all(f"{folder}/{key}", width="single", formats=("svg",), csv=False, sidecar=False)
            rec["files"] = {n: [str(x) for x in ps if x.suffix == ".svg"] for n, ps in paths.items()}
            rec["whole"] = {n: [] if isinstance(fw, TokenWidget) else sorted(whole_axes(go.Figure(fw).to_dict()))
                            for n, fw in p.figures.items()}
        rec["s"] = round(time.perf_counter() - t, 2)
        out[key] = rec
    print("''' + _EXPORTED + '''" + json.dumps(out, default=str))
'''


def _export_in_kernel(page, want: dict[str, str], folder: Path, timeout_s: float = 300) -> dict:
    """Add a cell at the end of the notebook that exports the panels ``want`` (``{widget model id: key}``) at one
    column (:data:`_EXPORT_CELL`), run it, and return its record ``{key: {panel, params, error, files, whole, s}}``;
    a traceback in the cell, or a panel not found, fails the test."""
    code = (f"import sys\nsys.path.insert(0, {str(TESTS_DIR)!r})\n" + _EXPORT_CELL
            + f"\n_wb_export({json.dumps(want)}, {str(folder)!r})")
    i = page.evaluate(_ADD_CELL_JS, code)
    page.wait_for_function(f"(i) => ({_CELL_OUTPUTS_JS})(i).some(o => o.output_type === 'error' || "
                           f"(o.output_type === 'stream' && /{_EXPORTED}.*\\n/.test([].concat(o.text).join(''))))",
                           arg=i, timeout=timeout_s * 1000, polling=200)
    outs = page.evaluate(_CELL_OUTPUTS_JS, i)
    errors = [f"{o['ename']}: {o['evalue']}" for o in outs if o["output_type"] == "error"]
    assert not errors, f"the export cell failed: {errors}"
    text = "".join("".join(o["text"]) if isinstance(o["text"], list) else o["text"]
                   for o in outs if o["output_type"] == "stream")
    record = json.loads(text.split(_EXPORTED, 1)[1].splitlines()[0])
    assert set(record) == set(want.values()), f"panels not found in the kernel: {set(want.values()) - set(record)}"
    return record


def _check_exports(checker, record: dict, state: str, found: dict) -> int:
    """Every SVG of an export ``record`` checked (:func:`test_figure_layout.export_problems`: the layout rule and the
    paper rules) in the chromium page ``checker``; problems into ``found`` (a refused state too). Returns the count
    of files checked."""
    n = 0
    for key, rec in record.items():
        where = f"{state}, panel {key} ({rec['panel']})"
        if rec["error"] is not None:
            found[where] = [f"the panel refused this state: {rec['error']}", f"sliders {rec['params']}"]
            continue
        for name, svgs in rec["files"].items():
            if not svgs:
                found[f"{where}: {name}"] = ["no SVG written"]
            for svg in svgs:
                n += 1
                bad = export_problems(checker, Path(svg), rec["whole"].get(name, ()))
                if bad:
                    found[f"{where}: {name}"] = [f"sliders {rec['params']}", *bad]
    return n


def _slider_handle_in(page, area, label: str):
    return (area.locator(".widget-hslider").filter(has=page.locator(".widget-label", has_text=label)).first
            .locator(".noUi-handle").first)


def _all_to(page, area, i: int, labels: list[str], key: str) -> None:
    """Every slider ``labels`` of panel ``i`` to one end (``key``: ``End`` or ``Home``, the keyboard on its handle),
    then the panel settled; twice, so that a range that follows another slider (09's K ≤ the pages of b) is at its
    end of the range the others leave it."""
    for _ in range(2):
        for label in labels:
            handle = _slider_handle_in(page, area, label)
            handle.focus()
            handle.press(key)
        _settled(page, i, timeout_s=120)


def _exports_at_slider_ends(page, panels: list[dict], tag: str, folder: Path, checker, phases: _Phases,
                            now: str | None = None) -> tuple[dict, int]:
    """The panels' figures exported at one column at the ends of their sliders (:data:`EXPORT_PER_SLIDER`: each
    slider alone, else all at once per end) and checked; ``now``: first also as they are now, under that name.
    Each state's moves, export and checks are timed into ``phases``. Returns ``(problems, files checked)``."""
    ids = page.evaluate(_MODEL_IDS_JS, _AREAS_JS)
    areas = {p["i"]: page.locator(".jp-OutputArea").filter(has=page.locator(".widget-hslider")).nth(p["i"])
             for p in panels}
    want = {m: f"p{p['i']}" for p in panels for m in ids[p["i"]]}
    found, n = {}, 0

    def export(state: str, which: dict, sub: Path) -> int:
        with phases.phase(f"export: {state}"):
            record = _export_in_kernel(page, which, sub)
        kernel = ", ".join(f"{k} {r['panel']} {r['s']:.1f}" for k, r in record.items())
        with phases.phase(f"check: {state} (kernel s: {kernel})"):
            return _check_exports(checker, record, state, found)

    if now is not None:
        n += export(now, want, folder / "now")
    if tag not in EXPORT_PER_SLIDER:
        for key, end in (("End", "max"), ("Home", "min")):
            with phases.phase(f"every slider to its {end}"):
                for p in panels:
                    _all_to(page, areas[p["i"]], p["i"], p["sliders"], key)
            n += export(f"every slider at its {end}", want, folder / end)
        return found, n
    for p in panels:
        one = {m: k for m, k in want.items() if k == f"p{p['i']}"}
        area = areas[p["i"]]
        for label in p["sliders"]:
            slider = area.locator(".widget-hslider").filter(has=page.locator(".widget-label", has_text=label)).first
            start = slider.locator(".widget-readout").first.inner_text()
            for key, end in (("End", "max"), ("Home", "min")):
                with phases.phase(f"{label.strip()} to its {end}"):
                    _all_to(page, area, p["i"], [label], key)
                n += export(f"{label.strip()} at its {end}", one,
                            folder / f"{p['i']}-{re.sub(r'[^A-Za-z0-9]+', '_', label).strip('_')}-{end}")
            _type_value(page, slider, start)
            _settled(page, p["i"], timeout_s=120)
    return found, n


_NEEDLE = re.compile(r"the answer '(\d+)' at positions")
# the eviction panel after a run: its kept figure (data, placeholder, title), the answer table's columns and answers,
# its status and progress texts
_RUN_VIEW_JS = """(a) => { const gd = Array.from(a.querySelectorAll('.js-plotly-plot')).find(g => g.offsetParent !== null
    && g.layout && g.layout.meta && g.layout.meta.figure === 'kept_positions');
  return {kept: gd ? {traces: (gd.data || []).length, placeholder: gd.layout.meta.placeholder || null,
                      title: (""" + _TITLE_JS + """)(gd)} : null,
          cols: Array.from(a.querySelectorAll('table th')).map(e => e.textContent),
          answers: Array.from(a.querySelectorAll('table code')).map(e => e.textContent),
          labels: Array.from(a.querySelectorAll('.widget-label, .widget-html')).map(e => e.textContent).join('|')}; }"""


def _own_policy_run_checks(page, nb: dict, artifacts: Path) -> None:
    """Notebook 11's eviction panel on its own policy (mean-key, no preview from a capture): *Run eviction* pressed,
    the kept figure shows the run's own kept set (traces, no "no preview; press run" placeholder) and the full-cache
    answer holds the needle's number (the notebook prints it)."""
    printed = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", [])
                      if o.get("output_type") == "stream")
    m = _NEEDLE.search(printed)
    assert m, "notebook 11 did not print its needle's answer"
    number = m.group(1)
    area = page.locator(".jp-OutputArea").filter(has=page.locator(".widget-button", has_text="Run eviction")).last
    area.scroll_into_view_if_needed()
    sent = page.evaluate(_MSGS_JS)["sent"]
    area.locator(".widget-button", has_text="Run eviction").first.click()
    page.wait_for_function(
        f"([a, sent]) => {{ const m = ({_MSGS_JS})(), v = ({_RUN_VIEW_JS})(a); return m.sent > sent && "
        "m.pending === 0 && m.quiet_ms > 500 && /\\bdone\\b|failed|cancelled/.test(v.labels) && !!v.kept && "
        "!v.kept.placeholder; }", arg=[area.element_handle(), sent], timeout=RUN_ALL_TIMEOUT_S * 1000, polling=250)
    view = page.evaluate(_RUN_VIEW_JS, area.element_handle())
    area.screenshot(path=str(artifacts / "nb11-own-policy-run.png"))
    assert "run failed" not in view["labels"], view["labels"][-1000:]
    assert view["kept"]["traces"] > 0 and "no preview" not in view["kept"]["title"], view["kept"]
    assert "kept by the run" in view["labels"], view["labels"][-600:]
    answers = dict(zip(view["cols"], view["answers"]))
    full = next((a for c, a in answers.items() if c.strip() == "full cache"), None)
    assert full is not None and number in full, f"the full-cache answer lacks the needle {number}: {answers}"


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("name", ALL_NOTEBOOKS, ids=[n[:2] for n in ALL_NOTEBOOKS])
def test_notebook_panels_in_browser(lab, artifacts, tmp_path, name):
    """Open the notebook, run it (the notebook's execution test: :func:`_notebook_checks.check_executed` on the
    notebook JupyterLab holds; 02 also gets :func:`_pooling_zeta_checks`), then on every panel: move each visible slider (Home, or End at the start)
    and check that the figures' data or the status changed; flip each *re-run on change* toggle once (a model
    run, bounded); press *export figures* on the first panel that has it and check the files; no console errors;
    screenshots as artefacts.

    Then, in the same session, the exports at the slider ends (:func:`_exports_at_slider_ends`): the visible
    sliders of every panel moved with the keyboard (``End``, ``Home`` on the handle) and the panels' figures
    exported at one column (3.33 in) through their public export (``Panel.export_all``, what the button calls)
    from a cell the test adds, every SVG checked with the paper rules (plot ≥ 55 %, legend ≤ 25 %, no text
    < 7 pt) and the layout rule (no overlap, nothing on a plot area) by
    :func:`test_figure_layout.export_problems`, as ``tests/test_slider_extremes.py`` checks them in-process.
    Which states: all sliders of all panels at their max at once, then all at their min (two exports per
    notebook) everywhere but :data:`EXPORT_PER_SLIDER` (11: one panel with one slider, where each slider alone
    is the same two states). Each slider alone at both ends everywhere would be 2 × 72 export cells (a cell is
    0.5–5 s: the SVG export of each figure, a Chromium print for a token view; 22 s for notebook 00's panels
    at their max), minutes over the added test time this suite can give (~90 s for the 12 notebooks); even
    10's two sliders alone cost 10.5 s against about 5 s at once (measured at load 4–7), so 10 moves them
    together too. The single-slider ends are checked in-process on the same panels (``test_slider_extremes``,
    both widths) and live in the page above. Notebook 11 first presses *Run eviction* on its own policy
    (:func:`_own_policy_run_checks`: the kept figure is the run's own kept set, the full-cache answer holds the
    needle's number) and exports that state too."""
    console: list[str] = []
    tag = name[:2]
    for old in artifacts.glob(f"nb{tag}-*.png"):
        old.unlink()
    phases = _Phases()
    with contextlib.ExitStack() as stack:
        stack.callback(phases.write, artifacts / f"nb{tag}-timings.json")
        with phases.phase("open and start Run All"):
            page = stack.enter_context(_notebook_page(lab, name))
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}")
                if m.type == "error" or _RECOVERED in m.text else None)
        # an uncaught error of the page, e.g. "[anywidget] Failed to initialize model." (that model
        # then drops every later message, its figure deaf to the sliders)
        page.on("pageerror", lambda e: console.append(f"uncaught: {e}"))
        try:
            with phases.phase("Run All"):
                _wait_done(page, RUN_ALL_TIMEOUT_S)
        except PlaywrightTimeout:
            page.screenshot(path=str(artifacts / f"nb{tag}-timeout.png"), full_page=True)
            raise
        errors = _kernel_errors(page)
        assert not errors, "\n".join(e[-2000:] for e in errors)
        # the execution test of this notebook (nbclient's run is deselected when this one runs): the headless
        # test's assertions on the notebook as JupyterLab holds it, outputs included
        check_executed(page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.toJSON()"))
        if name == POOLING_NB.name:
            _pooling_zeta_checks(page, artifacts)
        panels = _panels(page)
        assert panels, f"{name}: no panel with a slider"
        _assert_drawn(page, name)
        cut = page.evaluate(_CUT_LABELS_JS)
        assert not cut, f"{name}: control labels cut short in the page: {cut}"

        exported: list[int] = []

        def toggles_and_export(p, area):
            for t in p["toggles"]:
                box = area.locator(".widget-checkbox", has_text=t).locator("input").first
                box.check()
                page.wait_for_function(
                    "(a) => { const p = a.querySelector('.widget-inline-hbox progress, .progress'); "
                    "const d = Array.from(a.querySelectorAll('.widget-label')).map(e => e.textContent).join('|'); "
                    "return /done|failed|cancelled/.test(d); }",
                    arg=area.element_handle(), timeout=RUN_ALL_TIMEOUT_S * 1000, polling=200)
                box.uncheck()
            # the button in the browser once per notebook (its first panel that has one): the export is the
            # panels' one base method (Panel.export_clicked, in-process on the priority, token and counterexample
            # panels: test_panel_controls, test_token_view, test_counterexample) over figure functions that
            # test_figure_layout / test_paper_rules export at both widths
            if p["export"] and not exported:
                exported.append(p["i"])
                area.locator("button", has_text="export figures").first.click()
                page.wait_for_function("(a) => /files in|export failed/.test(a.textContent)", arg=area.element_handle(),
                                       timeout=180_000, polling=200)
                text = area.inner_text()
                assert "export failed" not in text, text[-1000:]
                folder = Path(text.split("files in", 1)[1].split(":", 1)[0].strip())
                files = sorted(f.name for f in folder.iterdir())
                for ext in (".pdf", ".svg", ".png", ".json", ".csv"):
                    assert any(f.endswith(ext) for f in files), (folder, files)
                # the links beside the button must not squeeze its label (it read "⬇ …" at the narrow width)
                cut = area.locator("button", has_text="export figures").first.evaluate(
                    "b => b.scrollWidth > b.clientWidth + 1")
                assert not cut, f"{name}: the export button's label is cut once its links show"
                over = area.locator(".widget-html", has_text="files in").first.evaluate(
                    "h => h.scrollWidth > h.clientWidth + 1")
                assert not over, f"{name}: the export's links run past the panel's edge"

        problems = _layout_sweep(page, panels, f"nb{tag}", artifacts, each_panel=toggles_and_export, phases=phases,
                                 console=console)
        bad = _console_problems(console)
        assert not bad, f"{name}: console errors: {bad[:5]}"
        assert not problems, f"{name}: text overprinted or clipped in the live figures:\n" + _report(problems)

        now = None
        if tag == "11":
            with phases.phase("own-policy run"):
                _own_policy_run_checks(page, page.evaluate(
                    "() => window.jupyterapp.shell.currentWidget.context.model.toJSON()"), artifacts)
            now = "after its own-policy run"
        checker = lab[3].new_page()
        stack.callback(checker.close)
        with phases.phase("exports at the slider ends"):
            found, n = _exports_at_slider_ends(page, _panels(page), tag, tmp_path / "exports", checker, phases,
                                               now=now)
        assert n > 0, f"{name}: no file exported at the slider ends"
        assert not found, (f"{name}: exported at one column at the slider ends, {len(found)} of the files break the "
                           "rules:\n" + _report(found))
        bad = _console_problems(console)
        assert not bad, f"{name}: console errors after the exports: {bad[:5]}"


def test_long_capture_layout_in_browser(lab, artifacts):
    """A synthetic T = 32 768 capture (:data:`LONG_CELLS`, no model) in its heads, pages and token panels: every
    figure drawn with its data, the live layout checks (:func:`_layout_sweep`: no text box on another, no title,
    legend or axis title on a plot area, nothing outside its figure or cut by the page, after Run All and at
    both ends of every slider, at 1400 and 1000 px), every slider changes something, no console error."""
    console: list[str] = []
    with _notebook_page(lab, "long_32k.ipynb", console) as page:
        _wait_done(page, RUN_ALL_TIMEOUT_S)
        assert not _kernel_errors(page), _kernel_errors(page)
        _assert_drawn(page, "long_32k")
        panels = _panels(page)
        assert len(panels) == 3, panels                 # heads, pages, tokens
        problems = _layout_sweep(page, panels, "long", artifacts, console=console)
        assert not problems, "T = 32k: text overprinted or clipped in the live figures:\n" + _report(problems)
    bad = _console_problems(console)
    assert not bad, f"console errors: {bad[:5]}"
