"""The package layout: one way through the layers, no cycles, imports at module level, no private name imported
across modules, small files, lint-clean.

Layers, lowest first: base (``checks``, ``choices``, ``util``) → run → capture → analyse → rerun (run again)
→ show → study → interop (optional extras such as kvpress). A module may import its own layer and the layers below it, never above. ``__init__`` and
``__main__`` of the package (the flat API and the CLI) sit on top.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "workbench"
LAYERS = ["base", "run", "capture", "analyse", "rerun", "show", "study", "interop"]
# optional heavy dependencies that may be imported inside the functions that need them
LAZY_OK = {"ray", "kaleido", "playwright"}
MAX_LINES = 500
# modules allowed past MAX_LINES because they hold one concept (and never past HARD_MAX)
ONE_CONCEPT = {"workbench/run/adapter.py": "every contact with transformers internals, in one place by design"}
HARD_MAX = 800
# private modules another module may import from: the version file the build writes
PRIVATE_OK = {"workbench._version"}


def _modules() -> dict[str, Path]:
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = f
    return mods


MODULES = _modules()


def _layer(mod: str) -> str | None:
    parts = mod.split(".")
    if len(parts) == 1 or parts[1] in ("__main__",):
        return None  # the package's flat API and CLI: on top
    return parts[1] if parts[1] in LAYERS else "base"


def _from_target(node: ast.ImportFrom, pkg: str) -> str:
    """The module a ``from … import`` of a module in package ``pkg`` reads from (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(mod: str, path: Path) -> list[tuple[str, int, bool]]:
    """``(imported workbench module, line, inside a function)`` for every import of ``mod``."""
    tree = ast.parse(path.read_text())
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    out = []
    func_lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    func_lines.add(sub.lineno)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(node, pkg)
            subs = [f"{target}.{a.name}" for a in node.names]
            # ``from pkg import sub``: an edge to the submodule (the package itself only for its own names)
            names = subs if all(n in MODULES for n in subs) else [target] + subs
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for n in names:
            out.append((n, node.lineno, node.lineno in func_lines))
    return out


def _graph() -> dict[str, set[str]]:
    g = {m: set() for m in MODULES}
    for m, f in MODULES.items():
        for n, _, _ in _imports(m, f):
            if n in MODULES and n != m:
                g[m].add(n)
    return g


def test_every_module_is_in_a_layer():
    assert {_layer(m) for m in MODULES} - {None} <= set(LAYERS)
    for step in LAYERS[1:]:
        assert (PKG / step / "__init__.py").exists(), f"the {step} step has no folder"


def test_no_import_cycles():
    g = _graph()
    color: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        color[m] = 1
        stack.append(m)
        for n in sorted(g[m]):
            if color.get(n) == 1:
                cyc = stack[stack.index(n):] + [n]
                pytest.fail("import cycle: " + " -> ".join(cyc))
            if n not in color:
                visit(n)
        stack.pop()
        color[m] = 2

    for m in sorted(g):
        if m not in color:
            visit(m)


def test_imports_follow_the_layer_order():
    bad = []
    for m, f in MODULES.items():
        lm = _layer(m)
        if lm is None:
            continue
        for n, line, _ in _imports(m, f):
            if n not in MODULES:
                continue
            ln = _layer(n)
            if ln is None or LAYERS.index(ln) > LAYERS.index(lm):
                bad.append(f"{f.relative_to(ROOT)}:{line} ({lm}) imports {n} ({ln or 'the top-level API'})")
    assert not bad, "imports against the layer order:\n" + "\n".join(sorted(set(bad)))


def test_no_imports_inside_functions():
    bad = []
    for m, f in MODULES.items():
        for n, line, inside in _imports(m, f):
            if inside and n.split(".")[0] not in LAZY_OK:
                bad.append(f"{f.relative_to(ROOT)}:{line} imports {n} inside a function")
    assert not bad, "\n".join(sorted(set(bad)))


def test_files_stay_small():
    sizes = {str(f.relative_to(ROOT)): len(f.read_text().splitlines()) for f in MODULES.values()}
    big = {f: n for f, n in sizes.items() if n > MAX_LINES and f not in ONE_CONCEPT}
    assert not big, f"modules over {MAX_LINES} lines (split by concept): {big}"
    huge = {f: n for f, n in sizes.items() if n > HARD_MAX}
    assert not huge, f"modules over {HARD_MAX} lines: {huge}"


def _private_imports(mod: str, path: Path, label: str | None = None) -> list[str]:
    """``from X import _y`` (or from a private module ``X._m``) in ``mod`` where ``X`` is another workbench
    module: what other modules import gets a public name (dunder names such as ``__version__`` excepted)."""
    tree = ast.parse(path.read_text())
    pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    label = label or str(path.relative_to(ROOT))
    out = []

    def private(seg: str) -> bool:
        return seg.startswith("_") and not (seg.startswith("__") and seg.endswith("__"))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _from_target(node, pkg)
            if target.split(".")[0] != "workbench" or target == mod or target in PRIVATE_OK:
                continue
            for a in node.names:
                if any(private(seg) for seg in target.split(".")[1:] + [a.name]):
                    out.append(f"{label}:{node.lineno} imports {a.name} from {target}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "workbench" and a.name not in PRIVATE_OK \
                        and any(private(seg) for seg in a.name.split(".")[1:]):
                    out.append(f"{label}:{node.lineno} imports {a.name}")
    return out


def test_no_cross_module_import_of_a_private_name():
    bad = [b for m, f in MODULES.items() for b in _private_imports(m, f)]
    assert not bad, "private names imported from another module (give them a public name):\n" + "\n".join(bad)


def test_the_private_import_check_sees_one(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from workbench.show.plots._common import cd\nfrom workbench.checks import _x, check_int\n"
                 "from workbench._version import __version__\nimport workbench._private\nfrom . import _y\n")
    found = [b.split(" imports ", 1)[1] for b in _private_imports("workbench.show.m", f, "m.py")]
    assert found == ["cd from workbench.show.plots._common", "_x from workbench.checks", "workbench._private",
                     "_y from workbench.show"]


def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.fail("ruff is not installed (it is in the test extra: pip install -e .[test])")
    r = subprocess.run([ruff, "check", "workbench", "tests", "benchmarks", "notebooks"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_flat_api_resolves():
    import workbench

    for name in workbench.__all__:
        assert getattr(workbench, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute"):
        workbench.no_such_name  # noqa: B018


# folders already free of cross-module imports of underscore names; the rest of the package follows
PRIVATE_FREE = ("workbench/study/",)


def test_no_cross_module_import_of_private_names():
    bad = []
    for m, f in MODULES.items():
        rel = str(f.relative_to(ROOT))
        if not rel.startswith(PRIVATE_FREE):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "workbench"):
                bad += [f"{rel}:{node.lineno} imports {a.name} from {node.module}" for a in node.names
                        if a.name.startswith("_") and a.name != "__version__"]
    assert not bad, "imports of another module's private names (make them public):\n" + "\n".join(bad)


def test_every_capture_argument_is_annotated_capture():
    """A function of the package that takes a capture says so: ``capture: Capture`` (a ``TYPE_CHECKING`` import
    where the module would otherwise not import it); a panel that also follows a shared state says
    ``capture: Capture | CaptureState``."""
    allowed = {"Capture", "Capture | CaptureState"}
    bad = []
    for m, f in MODULES.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                for arg in a.posonlyargs + a.args + a.kwonlyargs:
                    if arg.arg == "capture" and (arg.annotation is None or ast.unparse(arg.annotation) not in allowed):
                        bad.append(f"{f.relative_to(ROOT)}:{node.lineno} {node.name}({arg.arg})")
    assert not bad, "capture arguments without the Capture annotation:\n" + "\n".join(bad)


# History belongs to git and benchmarks/HISTORY.md: a comment or docstring says *why*, never which issue, stop or
# session changed it (a number that means nothing to the next reader).
_HISTORY = re.compile(r"\b(issue|session|stop)s? \d+\b", re.I)


def test_no_history_in_code_or_tests():
    files = [*MODULES.values(), *sorted((ROOT / "tests").rglob("*.py"))]
    bad = [f"{f.relative_to(ROOT)}:{i}: {line.strip()[:100]}" for f in files
           for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1) if _HISTORY.search(line)]
    assert not bad, "issue / stop / session numbers in code or tests:\n" + "\n".join(bad)
