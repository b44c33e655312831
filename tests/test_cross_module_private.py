"""No module of ``workbench`` reaches into another module's private names: an attribute ``x._name`` (read or
written) where ``x`` is not ``self``, ``cls``, ``super()`` or ``type(self)`` is allowed only in a module that
defines ``_name`` itself (a method or function, a class, an assigned name, ``self._name = …``). A name that no
workbench module defines (another library's, e.g. ``os._exit``) is not this scan's business; dunders are protocols.

The scan cannot know the type of ``x``, so it only flags what is certain: ``_name`` is a workbench module's own and
the accessing module has none of that name (an object's private step called from another module, as
``sess._evict(…)`` was from the follow-up protocol)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "workbench"
OWN = ("self", "cls")
# (module, name): the one access of another module's private name left, with why
ALLOWED = {("workbench/show/widgets/base.py", "_hidden"): "the figure widget's synced trait, its protocol with its "
           "own JavaScript; a panel hides a set-aside figure by it"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _is_own(node: ast.expr) -> bool:
    """``self``, ``cls``, ``super()``, ``type(self)``: the object's own class hierarchy."""
    if isinstance(node, ast.Name):
        return node.id in OWN
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
        node.func.id == "super" or (node.func.id == "type" and len(node.args) == 1 and _is_own(node.args[0])))


def _defined(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, methods and classes, assigned names, ``self._x = …``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_own(node.value):
            out.add(node.attr)
    return {n for n in out if _private(n)}


def cross_module_private_access(sources: dict[str, str]) -> list[str]:
    """``"module:line: x._name"`` for each access of another workbench module's private name in ``sources``
    (``{module name: source}``)."""
    trees = {m: ast.parse(s) for m, s in sources.items()}
    defined = {m: _defined(t) for m, t in trees.items()}
    out = []
    for m, tree in trees.items():
        elsewhere = set().union(*(d for k, d in defined.items() if k != m))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr) and not _is_own(node.value)
                    and node.attr not in defined[m] and node.attr in elsewhere):
                out.append(f"{m}:{node.lineno}: {ast.unparse(node)}")
    return sorted(out)


def _workbench_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT.parent)): p.read_text(encoding="utf-8") for p in sorted(ROOT.rglob("*.py"))}


def test_no_module_reaches_into_another_modules_private_names():
    found = [f for f in cross_module_private_access(_workbench_sources())
             if (f.split(":")[0], f.rsplit(".", 1)[-1]) not in ALLOWED]
    assert not found, "use the owner's public step instead:\n" + "\n".join(found)


def test_the_scan_flags_a_foreign_private_step_and_nothing_else():
    """The pattern the rule is for is found (a session's private steps called from another module); a module's
    own private names, ``self``/``super()`` access and another library's private names are not."""
    session = "class S:\n    def _evict(self):\n        return self._decode()\n    def _decode(self):\n        pass\n"
    follow = ("import os\n\nclass F(S):\n    def _own(self):\n        super()._evict()\n\n"
              "def two_turns(sess, other):\n    st = sess._evict()\n    sess._decode()\n    other._own()\n"
              "    os._exit(0)\n")
    assert cross_module_private_access({"session.py": session, "followup.py": follow}) == [
        "followup.py:8: sess._evict", "followup.py:9: sess._decode"]
