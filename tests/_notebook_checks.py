"""What an executed notebook must show, checked on its nbformat JSON (a dict, or nbformat's NotebookNode),
wherever it ran: headless under nbclient (``test_notebooks.py``) or in JupyterLab (``test_browser.py``, the
notebook model as the page holds it). One home for the assertions, so that the run that executes a notebook
makes all of them, and each notebook executes once per run (``conftest.py``)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
# The browser test can run here: Debian's chromium and Playwright (it never downloads a browser).
BROWSER_RUNS = Path(CHROMIUM).exists() and importlib.util.find_spec("playwright") is not None
BROWSER_TEST = "test_notebook_panels_in_browser"   # in test_browser.py, parametrised by `name`
HEADLESS_TEST = "test_notebook_executes"           # in test_notebooks.py, parametrised by `path`
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def notebook_of(item) -> str | None:
    """The notebook file name a parametrised notebook test runs (``None`` for another test)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    v = params.get("name") or params.get("path")
    return Path(v).name if v is not None else None


def _text(v) -> str:
    return "".join(v) if isinstance(v, list) else (v or "")


def code_cells(nb) -> list:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def uses_panel(nb) -> bool:
    """A notebook with a panel: one from ``wb.widgets`` (no notebook builds its own)."""
    return any("wb.widgets." in _text(c["source"]) for c in code_cells(nb))


def outputs(nb):
    for cell in code_cells(nb):
        yield from cell.get("outputs", [])


def check_executed(nb) -> None:
    """The executed notebook shows no error output and no traceback on stderr, at least one plotly figure and
    none empty, a widget where it has a panel, and its closing checks cell printed numbers."""
    outs = list(outputs(nb))
    errors = [o for o in outs if o["output_type"] == "error"]
    assert not errors, [f"{o['ename']}: {o['evalue']}" for o in errors]
    stderr = "".join(_text(o.get("text")) for o in outs if o["output_type"] == "stream" and o.get("name") == "stderr")
    assert "Traceback" not in stderr, stderr[-2000:]
    figures = [o for o in outs if o["output_type"] in ("display_data", "execute_result") and PLOTLY_MIME in o.get("data", {})]
    assert figures, "the notebook shows no plotly figure"
    for o in figures:
        fig = o["data"][PLOTLY_MIME]
        if isinstance(fig, str):
            fig = json.loads(fig)
        assert fig.get("data"), "an empty figure"
    last = code_cells(nb)[-1]
    printed = "".join(_text(o.get("text")) for o in last.get("outputs", [])
                      if o["output_type"] == "stream" and o.get("name") == "stdout")
    assert any(ch.isdigit() for ch in printed), f"the closing checks cell printed no numbers: {printed!r}"
    widgets = [o for o in outs if WIDGET_MIME in o.get("data", {})]
    if uses_panel(nb):
        assert widgets, "a panel cell shows no widget"
