"""Do fewer hypothesis examples catch the same mutants? A mutation run on ``workbench/analyse/`` (issue 23).

The ``ci`` profile runs every property test at the count written in it (``tests/_examples.py``). Before a count
may go down, the lower count must catch the mutants the written one catches. For each analysed module (its own
test file: ``analyse/pooling.py`` → ``tests/test_pooling.py``) this samples ``--per-module`` mutation sites with a
fixed seed, one operator change each:

- a comparison flipped at its boundary (``<`` ↔ ``<=``, ``>`` ↔ ``>=``, ``==`` ↔ ``!=``);
- an arithmetic operator swapped (``+`` ↔ ``-``, ``*`` ↔ ``/``), ``and`` ↔ ``or``, ``min`` ↔ ``max``;
- a numeric constant moved (0 ↔ 1, an integer n → n + 1, a float x → 2x).

Each mutant is written into a throwaway git worktree of ``HEAD`` (the checkout is never touched) and the module's
test file runs against it (``-m "not model and not slow"``, ``-x``, ``--hypothesis-seed`` fixed, no example
database: every run starts cold) once per ``--scales`` entry: the written count times that scale (``1.0`` is
``ci``). A mutant is *killed* at a scale when a test fails (or the run errors, or passes ``--timeout-factor``
times the clean run's time). The result per module: mutants, killed at each scale, and the mutants a lower scale
lets live that ``ci`` kills (*lost*). A count may go down only where nothing is lost.

    python benchmarks/mutation.py [--modules pooling priorities ...] [--per-module 12] [--scales 1.0 0.25]

Prints a markdown table and writes ``benchmarks/out/mutation.json``.
"""
from __future__ import annotations

import argparse
import ast
import copy
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _harness as harness

ROOT = harness.ROOT
OUT = Path(__file__).resolve().parent / "out"
# the SPEC inequality modules and their property test files
MODULES = ("audit", "envelope", "pages", "pooling", "priorities", "selection", "shift", "stats", "streaming")
_SWAP_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}
_SWAP_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
_SWAP_BOOL = {ast.And: ast.Or, ast.Or: ast.And}
_SWAP_NAME = {"min": "max", "max": "min"}
_CI_PROFILE = re.compile(r'"ci": \(1\.0, 1, 100\)')


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the constant nodes that are docstrings (never mutated)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def sites(tree: ast.AST) -> list[tuple[int, str]]:
    """Every mutation site of ``tree``: (index of the node in ``ast.walk`` order, what changes)."""
    skip = _docstrings(tree)
    out = []
    for i, node in enumerate(ast.walk(tree)):
        if isinstance(node, ast.Compare):
            out += [(i, f"cmp{j}") for j, op in enumerate(node.ops) if type(op) in _SWAP_CMP]
        elif isinstance(node, ast.BinOp) and type(node.op) in _SWAP_BIN:
            out.append((i, "bin"))
        elif isinstance(node, ast.BoolOp):
            out.append((i, "bool"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _SWAP_NAME:
            out.append((i, "name"))
        elif (isinstance(node, ast.Constant) and id(node) not in skip and type(node.value) in (int, float)
              and not isinstance(node.value, bool)):
            out.append((i, "const"))
    return out


def mutate(tree: ast.AST, site: tuple[int, str]) -> tuple[ast.AST, str]:
    """A copy of ``tree`` with the change ``site`` made, and a line describing it."""
    tree = copy.deepcopy(tree)
    i, kind = site
    node = list(ast.walk(tree))[i]
    line = getattr(node, "lineno", "?")
    if kind.startswith("cmp"):
        j = int(kind[3:])
        old = node.ops[j]
        node.ops[j] = _SWAP_CMP[type(old)]()
        what = f"{type(old).__name__} -> {type(node.ops[j]).__name__}"
    elif kind == "bin":
        old = node.op
        node.op = _SWAP_BIN[type(old)]()
        what = f"{type(old).__name__} -> {type(node.op).__name__}"
    elif kind == "bool":
        old = node.op
        node.op = _SWAP_BOOL[type(old)]()
        what = f"{type(old).__name__} -> {type(node.op).__name__}"
    elif kind == "name":
        old = node.func.id
        node.func.id = _SWAP_NAME[old]
        what = f"{old} -> {node.func.id}"
    else:
        v = node.value
        node.value = (1 if v == 0 else 0 if v == 1 else v + 1) if isinstance(v, int) else (1.0 if v == 0 else 2 * v)
        what = f"{v!r} -> {node.value!r}"
    return tree, f"line {line}: {what}"


def run_tests(work: Path, test_file: str, timeout: float) -> tuple[str, float]:
    """The module's test file against the worktree: ``killed``, ``survived`` or ``timeout``, and the seconds."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mut-run-") as cwd:  # a fresh cwd: no hypothesis example database
        env = {**os.environ, "PYTHONPATH": str(work), "WORKBENCH_HYPOTHESIS": "ci", "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly",
               "-p", "no:xdist", "--rootdir", str(work), "-c", str(work / "pyproject.toml"),
               "-m", "not model and not slow", "--hypothesis-seed=0", "-o", "addopts=", str(work / "tests" / test_file)]
        try:
            r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "timeout", time.perf_counter() - t0
    return ("survived" if r.returncode == 0 else "killed"), time.perf_counter() - t0


def set_scale(work: Path, scale: float) -> None:
    """The worktree's ``ci`` profile at ``scale`` times the written counts (hypothesis's default 100 likewise)."""
    path = work / "tests" / "_examples.py"
    src = path.read_text(encoding="utf-8")
    src, n = re.subn(r'"ci": \([0-9.]+, 1, [0-9]+\)', f'"ci": ({scale}, 1, {max(1, round(100 * scale))})', src)
    if n != 1:
        raise RuntimeError("tests/_examples.py: the ci profile line was not found; update benchmarks/mutation.py")
    path.write_text(src, encoding="utf-8")  # the throwaway worktree's copy, never the checkout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", nargs="+", default=list(MODULES), choices=MODULES)
    ap.add_argument("--per-module", type=int, default=12)
    ap.add_argument("--scales", nargs="+", type=float, default=[1.0, 0.25])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-factor", type=float, default=4.0)
    a = ap.parse_args(argv)
    if a.per_module < 1:
        ap.error(f"--per-module: must be an integer >= 1, got {a.per_module}")
    if not all(0 < s <= 1 for s in a.scales) or 1.0 not in a.scales:
        ap.error(f"--scales: each must be in (0, 1] and 1.0 (ci) among them, got {a.scales}")
    if not _CI_PROFILE.search((ROOT / "tests" / "_examples.py").read_text(encoding="utf-8")):
        ap.error("tests/_examples.py: ci is not (1.0, 1, 100); this run compares against the written counts")
    rng = random.Random(a.seed)
    rows, mutants = [], []
    with tempfile.TemporaryDirectory(prefix="mut-wt-") as tmp:
        work = Path(tmp) / "wt"
        subprocess.run(["git", "worktree", "add", "--detach", str(work), "HEAD"], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for mod in a.modules:
                src_path = work / "workbench" / "analyse" / f"{mod}.py"
                original = src_path.read_text(encoding="utf-8")
                tree = ast.parse(original)
                all_sites = sites(tree)
                chosen = sorted(rng.sample(all_sites, min(a.per_module, len(all_sites))))
                clean = {}
                for s in a.scales:
                    set_scale(work, s)
                    status, sec = run_tests(work, f"test_{mod}.py", timeout=1800)
                    if status != "survived":
                        raise RuntimeError(f"{mod}: its tests fail on the clean code at scale {s}")
                    clean[s] = sec
                killed = {s: 0 for s in a.scales}
                lost = []
                for site in chosen:
                    mutated, what = mutate(tree, site)
                    src_path.write_text(ast.unparse(mutated), encoding="utf-8")
                    result = {}
                    for s in a.scales:
                        set_scale(work, s)
                        result[s], sec = run_tests(work, f"test_{mod}.py", timeout=a.timeout_factor * clean[s] + 30)
                        killed[s] += result[s] != "survived"
                    src_path.write_text(original, encoding="utf-8")
                    mutants.append({"module": mod, "mutant": what, **{f"at_{s}": result[s] for s in a.scales}})
                    if result[1.0] != "survived" and any(result[s] == "survived" for s in a.scales):
                        lost.append(what)
                    print(f"{mod} {what}: " + ", ".join(f"{s}: {result[s]}" for s in a.scales), flush=True)
                rows.append({"module": mod, "sites": len(all_sites), "mutants": len(chosen),
                             **{f"killed_at_{s}": killed[s] for s in a.scales},
                             **{f"clean_s_at_{s}": round(clean[s], 1) for s in a.scales}, "lost": lost})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(work)], cwd=ROOT, capture_output=True)
    cols = ["module", "sites", "mutants", *[f"killed_at_{s}" for s in a.scales],
            *[f"clean_s_at_{s}" for s in a.scales], "lost"]
    print("| " + " | ".join(cols) + " |\n| " + " | ".join("---" for _ in cols) + " |")
    for r in rows:
        print("| " + " | ".join(str(r[c]) if c != "lost" else (", ".join(r[c]) or "none") for c in cols) + " |")
    harness.write_json(OUT / "mutation.json", {"rows": rows, "mutants": mutants}, indent=1, seed=a.seed,
                       per_module=a.per_module, scales=a.scales)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
