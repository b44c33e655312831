"""Shared fixtures and the suite's rules.

- The default model is loaded once per session (converted once per machine).
- Hypothesis profiles ``dev``, ``ci`` (default), ``nightly``, chosen by ``$WORKBENCH_HYPOTHESIS``; property
  tests write their CI count through ``_examples.examples(n)`` (counts per profile: ``tests/_examples.py``).
- Every test that uses the embedded default model is marked ``model`` here (:func:`uses_the_model`), so
  ``pytest -m "not model and not slow"`` is the fast lane. The browser tests (a JupyterLab server and a
  chromium) are marked ``slow``.
- ``make test`` runs three pytest-xdist workers on two cores (``-n 3 --dist loadgroup``: the third fills the
  time a browser test waits on its kernel); the tests that share an expensive
  module fixture run in one worker: the browser tests (two groups, one JupyterLab server each), the report's
  subprocess, the eviction runs.
- Each notebook executes once per run: ``test_browser.py`` executes it in JupyterLab where Debian's chromium
  exists (and makes the headless test's assertions); ``test_notebooks.py::test_notebook_executes`` runs it
  with nbclient only where the browser test for that notebook is not part of the run.
- The ``research`` tests (a research model from split wheels, minutes each) run only when asked for:
  ``-m research`` (``make test-research``) or ``WORKBENCH_RESEARCH=1``. ``make test`` is then the same run on
  a machine that has the research models as on a fresh one (CI).
"""
from __future__ import annotations

import functools
import inspect
import os
import re

import pytest
import torch
from _examples import PROFILES, profile_name
from hypothesis import settings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# tests/peers/ runs only in the peer environment (``make test-peers``: the workbench at its transformers
# floor next to NVIDIA kvpress); the main suite never collects it, so it never imports kvpress.
collect_ignore = [] if os.environ.get("WORKBENCH_PEERS") else ["peers"]
torch.manual_seed(0)
# Under pytest-xdist the workers share the cores: each gets its share of torch's intra-op threads (two
# workers on two cores: one thread each; torch's default would oversubscribe the cores and spin-wait).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

for _name, (_scale, _least, _default) in PROFILES.items():
    settings.register_profile(_name, max_examples=_default)
settings.load_profile(profile_name())

# ----------------------------------------------------------------------------- the model marker
# A test uses the default model when its fixture closure holds one of these fixtures (every fixture built
# on the model depends on ``smollm``), or when its code or the code of one of its fixtures loads the default
# model itself: ``load_model()`` without a model argument, or ``python -m workbench capture|report`` (no
# ``--model``: the embedded one).
MODEL_FIXTURES = frozenset({"smollm"})
_MODEL_CALL = re.compile(r"\bload_model\(\s*(\)|device=|progress=|None\b)"
                         r"|[\"']-m[\"'],\s*[\"']workbench[\"'],\s*[\"'](capture|report)[\"']")
# Tests that share a module fixture worth building once (a server, a subprocess run, model runs) stay in one
# xdist worker (``--dist loadgroup``); without xdist the marker does nothing.
XDIST_GROUPS = {"test_browser.py": "browser", "test_report.py": "report", "test_eviction.py": "eviction",
                "test_notebooks.py": "notebooks", "test_figure_layout.py": "browser-2", "test_compare_mode.py": "compare"}
# The browser tests split in two groups of about equal length (each group's worker starts its own JupyterLab
# server): the notebooks below run in ``browser-2``, the others (and the T = 32k layout test, ~90 s) in ``browser``.
BROWSER_2 = ("08", "05", "00", "01", "02", "10", "synthetic", "token")


def _functions(item) -> list:
    """The test function of ``item`` and the function of every fixture it uses."""
    funcs = [getattr(item, "function", None)]
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for fd in (info.name2fixturedefs.get(name, ()) if info else ()):
            funcs.append(fd.func)
    return [f for f in funcs if f is not None]


# Once per function, not per test: the ~3 800 items share a few hundred functions (parametrized tests, common
# fixtures), and reading a function's source (inspect.getsource tokenizes its file) was ~4 000 reads per
# collection in every worker.
@functools.cache
def _source(func) -> str | None:
    """The source of ``func`` when it is defined in tests/ (not a builtin or plugin fixture), else None."""
    try:
        if "tests" in inspect.getsourcefile(func).replace("\\", "/").split("/"):
            return inspect.getsource(func)
    except (OSError, TypeError):
        pass
    return None


@functools.cache
def _calls_the_model(func) -> bool:
    src = _source(func)
    return src is not None and _MODEL_CALL.search(src) is not None


def uses_the_model(item) -> bool:
    """Whether ``item`` uses the embedded default model (see :data:`MODEL_FIXTURES` and :data:`_MODEL_CALL`)."""
    if item.get_closest_marker("model") is not None:
        return True
    if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    return any(map(_calls_the_model, _functions(item)))


def research_asked(config) -> bool:
    """Whether this run asked for the ``research`` tests (``-m`` naming ``research``, or ``$WORKBENCH_RESEARCH``)."""
    return "research" in (config.getoption("markexpr", "") or "") or os.environ.get("WORKBENCH_RESEARCH") == "1"


# tryfirst: pytest-xdist's worker reads the ``xdist_group`` markers in its own ``pytest_collection_modifyitems``
# (it suffixes the node id with ``@group``), and it is registered after this conftest, so without tryfirst it
# runs first and the groups below are never seen: the module fixtures (a JupyterLab server, the report's run)
# were then built once per worker, and again whenever a worker came back to the module.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    skip_research = pytest.mark.skip(reason="a research-model test: run with -m research (make test-research) "
                                            "or WORKBENCH_RESEARCH=1")
    for item in items:
        if item.get_closest_marker("research") is not None and not research_asked(config):
            item.add_marker(skip_research)
        if uses_the_model(item) and item.get_closest_marker("model") is None:
            item.add_marker(pytest.mark.model)
        group = XDIST_GROUPS.get(item.path.name)
        if group == "browser" and any(f"[{b}]" in item.name or b in item.originalname for b in BROWSER_2):
            group = "browser-2"
        if group and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


class _NotebookOnce:
    """After selection (``-m``, ``-k``, node ids): drop the nbclient execution of a notebook whose browser
    test is part of the run, where the browser test can run (so each notebook executes once)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        from _notebook_checks import BROWSER_RUNS, BROWSER_TEST, HEADLESS_TEST, notebook_of

        if not BROWSER_RUNS:
            return
        in_browser = {notebook_of(i) for i in items if i.originalname == BROWSER_TEST and i.path.name == "test_browser.py"}
        dropped = [i for i in items if i.originalname == HEADLESS_TEST and i.path.name == "test_notebooks.py"
                   and notebook_of(i) in in_browser]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [i for i in items if i not in dropped]


class _GroupsApplied:
    """Stop a run whose ``--dist loadgroup`` would silently not group. pytest 9.2 moved the node id that
    pytest-xdist 3.8 suffixes with ``@group``, so every test became its own work unit and each worker rebuilt
    the module fixtures (a JupyterLab server, the report's run) whenever it came back to a module; pyproject pins
    pytest < 9.2 for this. Checked on the controller, on the ids the first worker collected."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        if node.config.getoption("dist", None) != "loadgroup":
            return
        lost = [i for i in ids if i.split("::")[0].rsplit("/", 1)[-1] in XDIST_GROUPS and "@" not in i]
        if lost:
            import xdist
            pytest.exit(f"--dist loadgroup is not applied: {len(lost)} tests of the grouped modules have no @group "
                        f"suffix in their node id (pytest {pytest.__version__}, pytest-xdist {xdist.__version__}; pyproject "
                        f"pins pytest < 9.2, and the conftest hook that adds the markers must run first), e.g. {lost[0]}", returncode=4)


def pytest_configure(config):
    config.addinivalue_line("markers", "xdist_group(name): tests that run in one pytest-xdist worker")
    config.pluginmanager.register(_NotebookOnce(), "workbench-notebook-once")
    config.pluginmanager.register(_GroupsApplied(), "workbench-groups-applied")


def pytest_report_header(config):
    return f"hypothesis profile: {profile_name()} ($WORKBENCH_HYPOTHESIS: dev, ci, nightly)"


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def smollm():
    """The embedded SmolLM2-135M-Instruct (``LoadedModel``), on CPU in fp32."""
    from workbench.run.models import load_model

    return load_model(device="cpu", progress=False)


@pytest.fixture(scope="session")
def example():
    from workbench.run.examples import load_example

    return load_example()


@pytest.fixture(scope="session")
def example_prompt(smollm, example):
    return example.build(smollm.tokenizer, max_context=smollm.shape.max_context)


@pytest.fixture(scope="session")
def smollm_capture(smollm, example_prompt):
    """A capture of the bundled multi-document prompt: observers, the query as audit population,
    a 32-token tail, 3 decode steps, hidden states at a few layers."""
    from workbench.capture import RowSet, run_capture

    return run_capture(smollm, example_prompt, RowSet(tail=32, n_decode=3),
                       hidden_layers=(0, 10, 30), progress=False)


# a tiny random-weight llama with a five-chunk synthetic prompt and its capture, for the panel tests
# (test_widgets, test_compare_mode): ``(lm, spans, capture)``
@pytest.fixture(scope="module")
def tiny():
    from workbench.capture import RowSet, run_capture
    from workbench.run.models import LoadedModel, tiny_model
    from workbench.run.spans import PromptSpans

    model = tiny_model("llama", L=3, H_Q=4, G=2, seed=1)
    lm = LoadedModel(model=model, tokenizer=None, model_id="tiny-llama (llama, L=3, H_Q=4, G=2, d=16)",
                     device=torch.device("cpu"), dtype=torch.float32)
    spans = PromptSpans.synthetic([8, 6, 9, 7, 5], prefix=6, query_len=10, answer_doc=2)
    cap = run_capture(lm, spans, RowSet(tail=16, n_decode=3), progress=False)
    return lm, spans, cap
