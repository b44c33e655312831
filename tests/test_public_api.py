"""No private name of another library in ``workbench/``: an ``ast`` scan of every module.

Flagged: an import of a ``_``-prefixed module or name of a third-party package (``from scipy.optimize._highspy
import …``, ``from torchmetrics.x import _normalize_text``); an attribute ``_x`` read off a third-party module
(``kaleido._global_server``); and an attribute ``_x`` read off any object when no module of ``workbench`` defines
``_x`` (a function, class, assignment, field or argument of that name), which is how another library's private
state is reached (``trace._props``, ``srv._initialized``). Dunders are public. The one module allowed to hold
such uses is :data:`ISOLATION`, and it must have a public fallback that can be forced (checked below).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"
ISOLATION = PACKAGE / "show" / "private_compat.py"
#: ``_``-prefixed names their libraries document as public API
DOCUMENTED = {
    "_asdict": "collections.namedtuple's documented method",
    "_esm": "anywidget's documented ES-module attribute",
    "_attn_implementation": "transformers' documented way to read a config's attention implementation",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _third_party(module: str | None) -> bool:
    top = (module or "").split(".")[0]
    return bool(top) and top != "workbench" and top not in sys.stdlib_module_names


def _defined_names(trees) -> set[str]:
    """Every ``_``-prefixed name that ``workbench`` itself defines."""
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.attr)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return {n for n in names if _private(n)}


def _modules(tree) -> set[str]:
    """Local names bound to third-party modules by ``import x`` / ``import x.y as z``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _third_party(a.name):
                    out.add(a.asname or a.name.split(".")[0])
    return out


def private_uses(path: Path, tree: ast.AST, defined: set[str]) -> list[str]:
    where = lambda node, what: f"{path.relative_to(ROOT)}:{node.lineno}: {what}"  # noqa: E731
    found, mods = [], _modules(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _third_party(a.name) and any(_private(p) for p in a.name.split(".")):
                    found.append(where(node, f"import {a.name}"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _third_party(node.module):
            if any(_private(p) for p in node.module.split(".")):
                found.append(where(node, f"from {node.module} import ..."))
            found += [where(node, f"from {node.module} import {a.name}") for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in mods:
                found.append(where(node, f"{node.value.id}.{node.attr}"))
            elif node.attr not in defined and node.attr not in DOCUMENTED:
                found.append(where(node, f"….{node.attr} (defined by no workbench module)"))
    return found


def _scan() -> dict[Path, list[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    trees = {p: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for p in files}
    defined = _defined_names(trees.values())
    return {p: private_uses(p, t, defined) for p, t in trees.items()}


def test_no_private_name_of_another_library():
    bad = [u for p, uses in _scan().items() if p != ISOLATION for u in uses]
    assert not bad, "private names of other libraries (move them to show/private_compat.py, with a " \
                    "public fallback):\n" + "\n".join(bad)


def test_the_scan_sees_private_uses():
    """The control: each form of private use is flagged, public ones are not."""
    src = ("import kaleido\nimport plotly.io as pio\nfrom scipy.optimize._highspy import _core\n"
           "from torchmetrics.functional.text.squad import _normalize_text\nimport ipywidgets._version\n"
           "x = kaleido._global_server\ny = pio._base_renderers\nz = trace._props\nw = self._mine\n"
           "v = kaleido.start_sync_server\nu = obj.__class__\nimport os\nt = os._exit\n")
    uses = private_uses(ROOT / "fake.py", ast.parse(src), {"_mine"})
    assert [u.split(": ", 1)[1] for u in uses] == [
        "from scipy.optimize._highspy import ...", "from scipy.optimize._highspy import _core",
        "from torchmetrics.functional.text.squad import _normalize_text",
        "import ipywidgets._version", "kaleido._global_server", "pio._base_renderers",
        "…._props (defined by no workbench module)", "…._exit (defined by no workbench module)"]


def test_the_isolation_module_has_a_forced_fallback():
    """The one module allowed private reads can be forced onto its public fallbacks, which give the same
    figure dicts and subplot grid as the private reads."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from workbench.show import private_compat as pc

    assert ISOLATION.exists() and pc.PUBLIC_ONLY_ENV == "WORKBENCH_PUBLIC_ONLY"
    fig = make_subplots(rows=2, cols=2, specs=[[{"secondary_y": True}, {}], [{"colspan": 2}, None]])
    fig.add_trace(go.Scatter(x=[1, 2], y=[3, 4], name="a"), row=1, col=1)
    private = (pc.trace_props(fig.data[0]), pc.layout_props(fig), pc.figure_traces(fig),
               [[c and [r.trace_kwargs for r in c] for c in row] for row in pc.subplot_grid(fig, 2, 2)],
               pc.edit_ids(go.FigureWidget()), pc.widget_internals_ok())
    before = pc.force_public(True)
    try:
        public = (pc.trace_props(fig.data[0]), pc.layout_props(fig), pc.figure_traces(fig),
                  [[c and [r.trace_kwargs for r in c] for c in row] for row in pc.subplot_grid(fig, 2, 2)],
                  pc.edit_ids(go.FigureWidget()), pc.widget_internals_ok())
    finally:
        pc.force_public(before)
    assert public[:4] == private[:4] and private[3][0][0] == [{"xaxis": "x", "yaxis": "y"}, {"xaxis": "x", "yaxis": "y2"}]
    assert private[4] == (0, 0) and private[5] is True and public[4] is None and public[5] is False
    assert public[0] is not fig.data[0].to_plotly_json()  # a copy: plotly's dict is not handed out


def test_a_missing_private_name_warns_once_and_falls_back():
    import warnings

    import plotly.graph_objects as go

    from workbench.show import private_compat as pc

    class Trace:  # a plotly whose traces lost ``_props``
        def to_plotly_json(self):
            return {"type": "scatter", "y": [1]}

    pc._WARNED.discard("plotly's trace._props")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert pc.trace_props(Trace()) == {"type": "scatter", "y": [1]}
        assert pc.trace_props(Trace()) == {"type": "scatter", "y": [1]}
    said = [w for w in seen if issubclass(w.category, pc.PrivateAPIWarning)]
    assert len(said) == 1 and "trace._props" in str(said[0].message)
    assert list(pc.trace_props(go.Scatter(y=[2]))["y"]) == [2]


def test_split_buffers_takes_buffers_out_as_ipywidgets_does():
    """The oracle: ipywidgets' own ``_remove_buffers`` (what ``send_state`` uses) on the states a deaf figure is
    relayed (dicts, lists, nested buffers, a buffer directly in a list)."""
    import numpy as np
    from ipywidgets.widgets.widget import _remove_buffers

    from workbench.show.figure_widget import _to_js, split_buffers

    z = np.arange(12, dtype=np.float64).reshape(3, 4)
    states = [{"_py2js_addTraces": _to_js({"trace_data": [{"z": z, "x": np.arange(4.0), "name": "a"}],
                                           "trace_edit_id": 3}, None)},
              {"_py2js_addTraces": None}, {"_hidden": False, "raw": [b"ab", 1, {"m": memoryview(b"cd")}]}]
    got, want = split_buffers(states), _remove_buffers(states)
    assert got[0] == want[0] and got[1] == want[1]
    assert [bytes(b) for b in got[2]] == [bytes(b) for b in want[2]] and len(got[2]) == 6


def test_the_public_fallback_lays_the_figures_out_at_a_width_every_room_holds():
    """plotly's stock widget reports no room, so a panel under the forced fallback lays its figures out at the
    narrowest live width (a wider one was cut by the page in a 1000 px window: 660 px figures in 568 px)."""
    from workbench.capture.data import Capture
    from workbench.run.spans import PromptSpans
    from workbench.show import private_compat as pc
    from workbench.show.widgets import HeadsPanel
    from workbench.show.widgets.base import FIGURE_WIDTH, MIN_FIGURE_WIDTH

    cap = Capture.synthetic(PromptSpans.synthetic([8, 6, 9, 7, 5], answer_doc=2), L=4, H_Q=6, G=2, seed=0)
    assert HeadsPanel(cap, layer=1).live_width == FIGURE_WIDTH
    before = pc.force_public(True)
    try:
        panel = HeadsPanel(cap, layer=1)
    finally:
        pc.force_public(before)
    widths = [fw.layout.width for fw in panel.figures.values() if hasattr(fw, "layout") and hasattr(fw.layout, "width")]
    assert panel.live_width == MIN_FIGURE_WIDTH and widths and all(w == MIN_FIGURE_WIDTH for w in widths)
