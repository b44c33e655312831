"""Every notebook runs top to bottom headless on the default model (bounded per-cell timeout).

Each executed notebook must show at least one plotly figure and no error output, and its last code
cell (the checks) must print what it asserted; the committed notebooks must be clean (no outputs),
end with a code cell that asserts and prints, name the ``attn-workbench`` kernel, and be identical to
what ``notebooks/build.py`` writes from their jupytext sources ``notebooks/src/NN_*.py`` (one source per
notebook and one notebook per source). Each notebook executes once per run: where Debian's chromium and
Playwright exist, ``test_browser.py`` runs it in JupyterLab and makes the same assertions
(``_notebook_checks.check_executed``), and ``conftest.py`` deselects the nbclient run of every notebook whose
browser test is selected. The execution time of every notebook is printed (``pytest -s``;
a table after the module) and recorded as the test property ``seconds`` (``--junitxml``).
``WORKBENCH_NB_CELL_TIMEOUT`` sets the per-cell timeout (s), ``WORKBENCH_NB_THREADS`` the kernels'
intra-op threads (default 1; 0 = torch's default). ``WORKBENCH_MODEL`` and ``WORKBENCH_DEVICE`` are
passed to the kernels, where ``notebooks/lab_setup.py`` loads that model on that device (default: the
embedded model, ``auto``). The kernels run this interpreter's ``python3`` kernel, whatever kernel the
notebooks name (``attn-workbench`` is installed by ``make lab``, not needed here).
"""
from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import nbformat
import pytest
from _notebook_checks import check_executed, uses_panel
from nbclient import NotebookClient

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
SOURCES = sorted((NB_DIR / "src").glob("[0-9][0-9]_*.py"))
KERNEL_NAME = "attn-workbench"
CELL_TIMEOUT_S = int(os.environ.get("WORKBENCH_NB_CELL_TIMEOUT", "300"))
# Intra-op threads of the notebook kernels. On a shared, busy CPU, torch's default (one thread per core)
# oversubscribes the cores and spin-waits: the eviction notebook took 8x longer than with one thread.
# "0" leaves the kernels at torch's default.
KERNEL_THREADS = os.environ.get("WORKBENCH_NB_THREADS", "1")
# Environment variables the notebooks read (notebooks/lab_setup.py), passed on to every kernel.
KERNEL_ENV_PASSTHROUGH = ("WORKBENCH_MODEL", "WORKBENCH_DEVICE")
NOTEBOOK_TIMES: dict[str, float] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_times():
    """After the module: one line per executed notebook and the total (shown with ``pytest -s``)."""
    yield
    if NOTEBOOK_TIMES:
        lines = [f"  {name:<45} {t:6.1f} s" for name, t in sorted(NOTEBOOK_TIMES.items())]
        print("\nnotebook execution times:\n" + "\n".join(lines) + f"\n  {'total':<45} {sum(NOTEBOOK_TIMES.values()):6.1f} s")


def _builder():
    spec = importlib.util.spec_from_file_location("notebooks_build", NB_DIR / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _kernel_env() -> dict[str, str]:
    """The kernels' environment: this process's, the intra-op threads and the notebooks' own variables."""
    env = dict(os.environ)
    if KERNEL_THREADS != "0":
        env["OMP_NUM_THREADS"] = KERNEL_THREADS
        env["MKL_NUM_THREADS"] = KERNEL_THREADS
    env.update({k: os.environ[k] for k in KERNEL_ENV_PASSTHROUGH if os.environ.get(k)})
    return env


def test_there_are_notebooks():
    names = [p.stem for p in NOTEBOOKS]
    assert len(names) >= 11, names                     # 00 quickstart + the ten topic notebooks
    assert [n[:2] for n in names] == [f"{i:02d}" for i in range(len(names))], "numbering has a gap"


def test_index_lists_every_notebook():
    index = (NB_DIR / "README.md").read_text()
    readme = (NB_DIR.parent / "README.md").read_text()
    section = readme.split("## Notebooks", 1)[1].split("\n## ", 1)[0]
    for p in NOTEBOOKS:
        assert p.name in index, f"{p.name} missing from notebooks/README.md"
        assert p.name in section, f"{p.name} missing from the README's Notebooks section"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_clean(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "a notebook without code"
    assert not any(c.get("outputs") or c.get("execution_count") for c in code), "commit notebooks clean"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith(f"# {path.name[:2]}")
    kernelspec = nb.metadata.get("kernelspec", {})
    assert kernelspec.get("name") == KERNEL_NAME and kernelspec.get("language") == "python", kernelspec
    assert nb.metadata.get("language_info", {}).get("name") == "python"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_has_a_panel(path):
    """notebooks/README.md promises an interactive panel in every notebook."""
    assert uses_panel(nbformat.read(path, as_version=4)), f"{path.name}: no interactive panel"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_ends_with_checks(path):
    """The last code cell checks real numbers: it asserts and prints what it checked (after any panel)."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    last = code[-1].source
    assert "assert " in last, f"{path.name}: the last code cell must assert the notebook's numbers"
    assert "print(" in last, f"{path.name}: the last code cell must print the numbers it checks"
    assert "wb.widgets." not in last and "export_all(" not in last, f"{path.name}: panel/export cells come before the checks"


def test_every_source_has_a_notebook():
    """One jupytext source per notebook and one notebook per source."""
    assert SOURCES, "no notebook sources in notebooks/src/"
    assert [p.stem for p in SOURCES] == [p.stem for p in NOTEBOOKS], (
        f"sources without a notebook: {sorted({p.stem for p in SOURCES} - {p.stem for p in NOTEBOOKS})}; "
        f"notebooks without a source: {sorted({p.stem for p in NOTEBOOKS} - {p.stem for p in SOURCES})}")
    assert not (NB_DIR / "_make_notebooks.py").exists(), "the old generator is back: one source of truth"


def test_notebooks_are_in_sync():
    """The committed notebooks are what notebooks/build.py writes from notebooks/src/ (byte for byte)."""
    build = _builder()
    assert list(build.sources()) == [p.stem for p in SOURCES]
    for name in build.sources():
        path = NB_DIR / f"{name}.ipynb"
        assert path.exists(), f"{path.name}: run notebooks/build.py"
        committed = nbformat.read(path, as_version=4)
        built = build.build(name)
        assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in built.cells], (
            f"{path.name} differs from notebooks/src/{name}.py; run notebooks/build.py")
        assert path.read_text(encoding="utf-8") == build.render(built), (
            f"{path.name}: same cells as notebooks/src/{name}.py, other ids, metadata or outputs; run notebooks/build.py")
        assert built.metadata.kernelspec.name == KERNEL_NAME
    assert build.out_of_sync() == []


def execute_headless(path, tmp_path, record_property=lambda *a: None) -> None:
    """Run notebook ``path`` under nbclient (the kernels' environment from :func:`_kernel_env`) and make the
    assertions of :func:`_notebook_checks.check_executed`; the executed copy is written to ``tmp_path``."""
    nb = nbformat.read(path, as_version=4)
    # kernel_name: this interpreter's python3 kernel, not the notebooks' attn-workbench (``make lab`` installs
    # that one); cwd notebooks/, where the notebooks import lab_setup from
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NB_DIR)}})
    env = _kernel_env()
    record_property("model", env.get("WORKBENCH_MODEL") or "default")
    t0 = time.perf_counter()
    try:
        client.execute(env=env)
    finally:
        NOTEBOOK_TIMES[path.stem] = time.perf_counter() - t0
        nbformat.write(nb, tmp_path / path.name)  # executed copy for inspection on failure
    record_property("seconds", round(NOTEBOOK_TIMES[path.stem], 1))
    print(f"\n{path.name}: executed in {NOTEBOOK_TIMES[path.stem]:.1f} s")
    check_executed(nb)


@pytest.mark.model
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, record_property):
    """Headless execution, where the browser test does not execute this notebook in this run (no chromium or
    Playwright, or its browser test deselected): ``conftest.py`` deselects it otherwise."""
    execute_headless(path, tmp_path, record_property)
