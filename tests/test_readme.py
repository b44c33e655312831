"""The README's Python: every fenced ``python`` block of README.md, notebooks/README.md and docs/api.md compiles,
and each name it uses resolves without running a model:

- ``import`` / ``from … import`` name modules and attributes that exist;
- an attribute chain on the workbench module (``wb.tasks.load_items``) resolves attribute by attribute, on the
  real (lazily imported) objects;
- a call of a resolved function or class binds its arguments (``inspect.signature(...).bind_partial``): the
  keyword names exist and the positional count fits;
- every other name is bound in the same file's blocks (earlier or later: the blocks are one session) or is
  a builtin.

And the flat API keeps its rule (``workbench/__init__.py``): a flat name is a function or class, a module only
as a plural-noun namespace; its ``TYPE_CHECKING`` block lists exactly the flat names (for editors); the notebook
sources use it alone (``import workbench as wb``), every ``wb.…`` name resolving. The README stays under
12,000 characters.
"""
from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
import types
from pathlib import Path

import pytest

import workbench

ROOT = Path(__file__).resolve().parent.parent
# the README, the notebooks' index and the API page the README's longer examples live on (docs/API_CONTRACT.md's
# blocks are signature sketches, not code)
DOCS = [ROOT / "README.md", ROOT / "notebooks" / "README.md", ROOT / "docs" / "api.md"]
README_MAX_CHARS = 12_000
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(first line number, code)`` of every fenced ``python`` block of a markdown file."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in _FENCE.finditer(text)]


def _bound_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` → ``["a", "b", "c"]``; None for anything else (a call or subscript in the chain)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


class _Resolver:
    """The objects that imports bind in a file's blocks (modules, their attributes)."""

    def __init__(self):
        self.known: dict[str, object] = {}
        self.problems: list[str] = []

    def imports(self, tree: ast.AST, where: str) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    try:
                        mod = importlib.import_module(a.name)
                    except ImportError as e:
                        self.problems.append(f"{where}: import {a.name}: {e}")
                        continue
                    if a.asname:
                        self.known[a.asname] = mod
                    else:
                        top = a.name.split(".")[0]
                        self.known[top] = importlib.import_module(top)
            elif isinstance(node, ast.ImportFrom):
                try:
                    mod = importlib.import_module(node.module)
                except ImportError as e:
                    self.problems.append(f"{where}: from {node.module} import ...: {e}")
                    continue
                for a in node.names:
                    try:
                        value = getattr(mod, a.name)
                    except AttributeError:
                        try:
                            value = importlib.import_module(f"{node.module}.{a.name}")
                        except ImportError:
                            self.problems.append(f"{where}: {node.module} has no {a.name!r}")
                            continue
                    self.known[a.asname or a.name] = value

    def resolve(self, parts: list[str], where: str):
        """The object of an attribute chain rooted at an imported name, or None (a variable of the example)."""
        if parts[0] not in self.known:
            return None
        obj = self.known[parts[0]]
        for i, attr in enumerate(parts[1:], 1):
            if not (isinstance(obj, (types.ModuleType, type))):
                return None  # an instance's attribute: not checked statically
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                self.problems.append(f"{where}: {'.'.join(parts[:i])} has no attribute {attr!r}")
                return None
        return obj

    def calls(self, tree: ast.AST, where: str) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                parts = _chain(node)
                if parts:
                    self.resolve(parts, f"{where}:{node.lineno}")
            if not isinstance(node, ast.Call):
                continue
            parts = _chain(node.func)
            fn = self.resolve(parts, f"{where}:{node.lineno}") if parts else None
            if fn is None or not callable(fn) or any(isinstance(a, ast.Starred) for a in node.args) \
                    or any(k.arg is None for k in node.keywords):
                continue
            try:
                sig = inspect.signature(fn)
            except (TypeError, ValueError):
                continue
            try:
                sig.bind_partial(*[None] * len(node.args), **{k.arg: None for k in node.keywords})
            except TypeError as e:
                self.problems.append(f"{where}:{node.lineno}: {'.'.join(parts)}(...): {e}")


def _check_file(path: Path, root: Path = ROOT) -> tuple[int, list[str]]:
    blocks = python_blocks(path)
    rel = path.relative_to(root)
    trees, problems = [], []
    for line, code in blocks:
        try:
            trees.append((line, ast.parse(code, filename=f"{rel}:{line}")))
            compile(code, f"{rel}:{line}", "exec")
        except SyntaxError as e:
            problems.append(f"{rel}:{line + (e.lineno or 1) - 1}: does not compile: {e.msg}")
    bound = set(dir(builtins))
    for _, tree in trees:
        bound |= _bound_names(tree)
    res = _Resolver()
    for line, tree in trees:
        res.imports(tree, f"{rel}:{line}")
    for line, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound:
                problems.append(f"{rel}:{line + node.lineno - 1}: name {node.id!r} is never bound")
        res.calls(tree, f"{rel}:{line}")
    return len(blocks), problems + res.problems


@pytest.mark.parametrize("path", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_every_python_block_compiles_and_resolves(path):
    n, problems = _check_file(path)
    assert not problems, "\n".join(problems)
    if path.name == "README.md" and path.parent == ROOT:
        assert n >= 1, "README.md: its Python example is gone"


def test_readme_is_short_and_its_examples_moved_to_docs():
    """The README reads in minutes (at most 12,000 characters) and opens with the two commands, then the example;
    the longer examples live in docs/api.md, whose blocks the test above compiles and resolves too."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text) <= README_MAX_CHARS, f"README.md: {len(text)} characters, at most {README_MAX_CHARS}"
    assert text.index("make lab") < text.index("make test") < text.index("```python") < text.index("## Data flow")
    assert ROOT / "docs" / "api.md" in DOCS and len(python_blocks(ROOT / "docs" / "api.md")) >= 3
    for link in re.findall(r"\]\(((?:docs|notebooks|benchmarks)/[^)#]+)", text):
        assert (ROOT / link).exists(), f"README.md links to {link}, which does not exist"


def test_readme_examples_use_the_flat_api():
    """README.md's examples import only ``workbench as wb`` from the workbench (no deep imports)."""
    for line, code in python_blocks(ROOT / "README.md"):
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("workbench"), f"README.md:{line}: from {node.module} import"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    assert not a.name.startswith("workbench") or (a.name, a.asname) == ("workbench", "wb"), (
                        f"README.md:{line}: import {a.name}")


def test_the_checker_finds_what_it_should(tmp_path):
    """The checker itself: a misspelt flat name, a wrong keyword, an unbound name, a bad import, bad syntax."""
    doc = tmp_path / "doc.md"
    doc.write_text("```python\nimport workbench as wb\nwb.load_modle()\nwb.RowSet(tails=3)\nprint(cap)\n"
                   "from workbench.capture import nope\n```\n\n```python\nx = (\n```\n")
    n, problems = _check_file(doc, root=tmp_path)
    text = "\n".join(problems)
    assert n == 2
    for expected in ("has no attribute 'load_modle'", "unexpected keyword argument 'tails'", "name 'cap' is never bound",
                     "workbench.capture has no 'nope'", "does not compile"):
        assert expected in text, text


def test_flat_api_rule():
    """Every flat name resolves; the functions, classes and objects are not modules, the namespaces are modules with
    plural-noun names; ``dir(wb)`` lists them all; an unknown name is an AttributeError naming it."""
    for name, where in workbench.NAMES.items():
        obj = getattr(workbench, name)
        module, _, attr = where.partition(":")
        assert not isinstance(obj, types.ModuleType), name
        assert obj is getattr(importlib.import_module(module), attr or name)
    for name, module in workbench.MODULES.items():
        obj = getattr(workbench, name)
        assert isinstance(obj, types.ModuleType) and obj.__name__ == module and name.endswith("s"), name
    assert not set(workbench.NAMES) & set(workbench.MODULES)
    assert set(dir(workbench)) == {"__version__", *workbench.NAMES, *workbench.MODULES}
    assert workbench.export.__module__ == "workbench.show.export"   # the function, beside the module of that name
    with pytest.raises(AttributeError, match="'nonexistent'"):
        workbench.nonexistent  # noqa: B018


def _family_table() -> dict[str, str]:
    """The family table (docs/families.md): every family name of its first column → the row's text."""
    text = (ROOT / "docs" / "families.md").read_text()
    lines = text.split("| family | what the row covers", 1)[1].splitlines()[2:]
    rows = {}
    for line in lines:
        if not line.startswith("|"):
            break
        first, rest = line.strip("|").split("|", 1)
        for name in first.replace(" and other multimodal wrappers", "").split(","):
            rows[name.strip()] = rest
    return rows


def test_the_family_table_is_the_library_table():
    """Every family of ``workbench.run.families`` (supported, capture-only, refused) has a row in docs/families.md's table,
    every named family there is one of them, and each row opens with its kind: a capture-only family with
    "**partially supported: capture on ...**", a hybrid with "**partially supported**", a refused one with
    "**refused**", an exact one with neither."""
    from workbench.run import families as F

    rows = _family_table()
    capture_only = {f.name for f in F.FAMILIES if f.capture_only}
    wrappers = {"llava", "mistral3", "paligemma"}
    known = {t for f in F.FAMILIES for t in f.model_types} | set(F.REFUSED) | wrappers   # a row may name an alias
    rows.update({f.name: rows[t] for f in F.FAMILIES for t in f.model_types if t in rows and f.name not in rows})
    assert set(rows) - known == set(), f"README names families the library does not know: {set(rows) - known}"
    assert set(F.supported_families()) | set(F.REFUSED) <= set(rows), \
        f"families without a README row: {(set(F.supported_families()) | set(F.REFUSED)) - set(rows)}"
    kind = {name: row.strip() for name, row in rows.items()}
    for name in capture_only:
        assert kind[name].startswith("**partially supported: capture on"), name
    for name in F.REFUSED:
        assert kind[name].startswith("**refused**"), name
    hybrids = {f.name for f in F.FAMILIES if f.hybrid}  # capture and eviction on the softmax layers
    for name in hybrids:
        assert kind[name].startswith("**partially supported"), name
    for name in set(F.supported_families()) - capture_only - hybrids:
        assert not kind[name].startswith(("**refused**", "**partially supported: capture on")), name


def _type_checking_imports() -> dict[str, str]:
    """``{bound name: "module:attr"}`` of the ``if TYPE_CHECKING:`` block of ``workbench/__init__.py``."""
    tree = ast.parse((ROOT / "workbench" / "__init__.py").read_text(encoding="utf-8"))
    blocks = [n for n in tree.body if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"]
    assert len(blocks) == 1, "workbench/__init__.py: one `if TYPE_CHECKING:` block lists the flat API for editors"
    bound = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom), f"line {node.lineno}: only `from … import … as …` in the block"
        for a in node.names:
            name = a.asname or a.name
            assert name not in bound, f"{name!r} bound twice"
            bound[name] = f"{node.module}:{a.name}"
    return bound


def test_the_flat_api_is_visible_to_editors():
    """The ``TYPE_CHECKING`` block binds exactly the lazy table's names (``NAMES``, ``MODULES``, so ``__all__``),
    each to the object ``__getattr__`` returns: an editor completes ``wb.`` with what exists at run time."""
    bound = _type_checking_imports()
    expected = {name: where if ":" in where else f"{where}:{name}" for name, where in workbench.NAMES.items()}
    expected |= {name: "{}:{}".format(*module.rsplit(".", 1)) for name, module in workbench.MODULES.items()}
    assert bound == expected, (f"missing from the block: {sorted(set(expected) - set(bound))}; not flat names: "
                               f"{sorted(set(bound) - set(expected))}; other targets: "
                               f"{sorted(n for n in set(bound) & set(expected) if bound[n] != expected[n])}")
    assert set(bound) == set(workbench.__all__) - {"__version__"}


NOTEBOOK_SOURCES = sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py"))
# optional extras (``pip install -e .[kvpress]``): importing them needs the extra, so they are no flat names and a
# notebook imports them only in the cell that checks the extra is installed
OPTIONAL_EXTRAS = ("workbench.interop.",)


@pytest.mark.parametrize("path", NOTEBOOK_SOURCES, ids=[p.stem for p in NOTEBOOK_SOURCES])
def test_notebooks_use_the_flat_api(path):
    """A notebook source imports nothing of the package but ``import workbench as wb`` (an optional extra aside),
    and every ``wb.…`` chain it uses resolves on the package, every call binding its arguments."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    deep = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "workbench" \
                and not node.module.startswith(OPTIONAL_EXTRAS):
            deep.append(f"{path.name}:{node.lineno}: from {node.module} import …")
        elif isinstance(node, ast.Import):
            deep += [f"{path.name}:{node.lineno}: import {a.name}" + (f" as {a.asname}" if a.asname else "")
                     for a in node.names if a.name.split(".")[0] == "workbench" and (a.name, a.asname) != ("workbench", "wb")]
    assert not deep, "\n".join(deep)
    assert any(isinstance(n, ast.Import) and [(a.name, a.asname) for a in n.names] == [("workbench", "wb")]
               for n in ast.walk(tree)), f"{path.name}: no `import workbench as wb`"
    res = _Resolver()
    res.known["wb"] = workbench
    res.calls(tree, path.name)
    assert not res.problems, "\n".join(res.problems)


def test_the_notebook_checker_finds_what_it_should(tmp_path):
    """The notebook checker: a deep import and a misspelt or wrongly called flat name are reported."""
    src = tmp_path / "99_bad.py"
    src.write_text("import workbench as wb\nfrom workbench.capture import RowSet\nwb.run_captur(1)\nwb.RowSet(tails=3)\n"
                   "wb.widgets.HeadsPanl\n")
    with pytest.raises(AssertionError, match="from workbench.capture import"):
        test_notebooks_use_the_flat_api(src)
    src.write_text("import workbench as wb\nwb.run_captur(1)\nwb.RowSet(tails=3)\nwb.widgets.HeadsPanl\n")
    with pytest.raises(AssertionError) as e:
        test_notebooks_use_the_flat_api(src)
    for expected in ("no attribute 'run_captur'", "unexpected keyword argument 'tails'", "no attribute 'HeadsPanl'"):
        assert expected in str(e.value), str(e.value)
