"""No module-level mutable state in ``workbench/study`` or ``workbench/rerun`` that carries state between calls:
no ``global`` statement, and no module-level dict / list / set (or ``dict()``, ``defaultdict()`` …)
that a function mutates (``X[k] = v``, ``del X[k]``, ``X.append(…)``, ``X.clear()`` …, directly or through
``module.X``). Constants are fine: tuples, frozensets, ``MappingProxyType``, and containers nobody mutates.

The few that are state by design are listed in ``ALLOWED`` with the reason; an entry that no longer matches
anything fails too, so the list cannot go stale.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("workbench/study", "workbench/rerun")
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque", "bytearray"}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "add", "discard",
            "remove", "sort", "reverse", "appendleft", "extendleft", "popleft", "__setitem__", "__delitem__"}
ALLOWED = {
    ("workbench/study/registry.py", "METHODS"):
        "the method registry: filled at import by @register_method (workbench.study.methods) and changed only "
        "through its documented API register_method / unregister_method; a registration is configuration, not "
        "state passed between cells",
    ("workbench/study/executors.py", "_WORKER_MODEL"):
        "a Ray worker's model, loaded once per process and reused by the cells that worker runs (a cache no "
        "caller sets or resets; one model per process)",
    ("workbench/rerun/stability.py", "_SPEC_CACHE"):
        "a memo of weight spectral norms keyed by the tensor and a content probe; it changes no result and no "
        "caller sets or resets it",
}


def _files() -> list[Path]:
    return sorted(f for d in SCANNED for f in (ROOT / d).rglob("*.py"))


def _rel(f: Path) -> str:
    return str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else f.name


def _module_name(f: Path) -> str:
    parts = Path(_rel(f)).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_mutable(value: ast.AST | None) -> bool:
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    if isinstance(value, ast.Call):
        f = value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        return name in MUTABLE_CALLS
    return False


def _top_level(tree: ast.Module):
    """Module-level statements, also inside top-level ``if`` / ``try`` / ``with`` blocks."""
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(node, field, []) or [])
        elif isinstance(node, ast.ExceptHandler):
            todo.extend(node.body)
        else:
            yield node


def module_containers(tree: ast.Module) -> dict[str, int]:
    """``{name: line}`` of every module-level name bound to a mutable container."""
    out = {}
    for node in _top_level(tree):
        if isinstance(node, ast.Assign) and _is_mutable(node.value):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.lineno
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _is_mutable(node.value):
            out[node.target.id] = node.lineno
    return out


def _target(node: ast.AST, aliases: dict[str, str]) -> tuple[str, str] | None:
    """``(module, name)`` a mutation lands on: ``X`` (this module) or ``mod.X`` (an imported module)."""
    if isinstance(node, ast.Name):
        return "", node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
        return aliases[node.value.id], node.attr
    return None


def mutations(tree: ast.Module, aliases: dict[str, str]) -> list[tuple[str, str, int]]:
    """``(module or "", name, line)`` of each mutation of a name inside a function body."""
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(fn):
            hits = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                hits = [t.value for t in targets if isinstance(t, ast.Subscript)]
                if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute):
                    hits.append(node.target)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
                hits = [node.func.value]
            for h in hits:
                t = _target(h, aliases)
                if t is not None:
                    out.append((*t, node.lineno))
    return out


def _aliases(tree: ast.Module, mods: set[str]) -> dict[str, str]:
    """Local names bound to scanned modules (``import a.b as m``, ``from a import b``)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods and a.asname:
                    out[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in mods:
                    out[a.asname or a.name] = full
    return out


def scan(files: list[Path]) -> tuple[list[str], set[tuple[str, str]]]:
    """``(problems, allowed entries that matched)``."""
    trees = {f: ast.parse(f.read_text()) for f in files}
    names = {_module_name(f): f for f in files}
    containers = {f: module_containers(t) for f, t in trees.items()}
    problems, used = [], set()
    for f, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                problems.append(f"{_rel(f)}:{node.lineno}: `global {', '.join(node.names)}`")
        for mod, name, line in mutations(tree, _aliases(tree, set(names))):
            owner = f if not mod else names[mod]
            if name not in containers[owner]:
                continue  # a local, an argument or an attribute of something else
            key = (_rel(owner), name)
            if key in ALLOWED:
                used.add(key)
                continue
            problems.append(f"{_rel(f)}:{line}: mutates the module-level {name} of {_rel(owner)} "
                            f"(line {containers[owner][name]})")
    return sorted(set(problems)), used


def test_no_module_level_mutable_state():
    problems, used = scan(_files())
    assert not problems, ("module-level mutable state (pass it explicitly, make it a constant, or add it to "
                          "ALLOWED with the reason):\n" + "\n".join(problems))
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries that match nothing any more: {stale}"


def test_the_scan_finds_what_it_must(tmp_path):
    """The scan on the patterns it forbids (the old side channel of study/methods.py among them) and on the
    constants it allows."""
    bad = tmp_path / "bad.py"
    bad.write_text("_SHARED: dict = {}\n_PLAN = {}\nROWS = []\nSEEN = set()\nN = 0\n"
                   "def plan(items):\n    _PLAN.clear()\n    for it in items:\n        _PLAN[it] = 1\n"
                   "def share(k):\n    _SHARED.update(key=k)\n    ROWS.append(k)\n    SEEN.add(k)\n"
                   "def count():\n    global N\n    N += 1\n")
    problems, _ = scan([bad])
    text = "\n".join(problems)
    for name in ("_PLAN", "_SHARED", "ROWS", "SEEN", "global N"):
        assert name in text, (name, text)
    ok = tmp_path / "ok.py"
    ok.write_text("from types import MappingProxyType\nA = (1, 2)\nB = frozenset({1})\nC = MappingProxyType({'a': 1})\n"
                  "D = {'never': 'mutated'}\n"
                  "def f(x):\n    d = {}\n    d['a'] = x\n    x.append(1)\n    return D['never'], A, B, C, d\n")
    assert scan([ok]) == ([], set())
