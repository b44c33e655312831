"""Build the notebooks ``notebooks/NN_*.ipynb`` from their sources ``notebooks/src/NN_*.py``.

The sources are jupytext percent-format scripts (``# %%`` code cells, ``# %% [markdown]`` cells), so that
the cells can be reviewed, diffed and linted as Python. Run

    .venv/bin/python notebooks/build.py            # write every notebook
    .venv/bin/python notebooks/build.py 03 08      # only some
    .venv/bin/python notebooks/build.py --check    # exit 1 and list the notebooks out of sync

and commit the regenerated ``.ipynb`` files. A built notebook is nbformat v4 without outputs, with cell ids
``NN-ii`` (notebook number, cell index: rebuilding an unchanged source gives the same file) and the
kernel ``attn-workbench`` (installed by ``make lab``). ``tests/test_notebooks.py`` checks that the
committed notebooks are what this script writes and executes all of them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_raw_cell

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
PATTERN = "[0-9][0-9]_*"
KERNELSPEC = {"name": "attn-workbench", "display_name": "Python (attn-workbench)", "language": "python"}
_NEW_CELL = {"code": new_code_cell, "markdown": new_markdown_cell, "raw": new_raw_cell}


def sources() -> dict[str, Path]:
    """``{notebook name: source path}`` for every ``src/NN_*.py``, in order."""
    return {p.stem: p for p in sorted(SRC.glob(f"{PATTERN}.py"))}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name`` built from ``src/<name>.py`` (clean: no outputs, no cell metadata)."""
    text = jupytext.read(SRC / f"{name}.py", fmt="py:percent")
    nb = new_notebook(cells=[_NEW_CELL[c.cell_type](c.source) for c in text.cells])
    for i, cell in enumerate(nb.cells):  # stable ids: an unchanged source gives the same file
        cell.id = f"{name[:2]}-{i:02d}"
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    """The exact text :func:`write` puts in the ``.ipynb`` file."""
    s = nbformat.writes(nb, version=nbformat.NO_CONVERT)
    return s if s.endswith("\n") else s + "\n"


def out_of_sync() -> list[str]:
    """Notebooks whose file differs from what their source builds, or that have no source / no file."""
    src = sources()
    bad = [f"{name}.ipynb (missing; build it)" for name in src if not (HERE / f"{name}.ipynb").exists()]
    bad += [f"{name}.ipynb (differs from src/{name}.py; rebuild it)" for name in src
            if (HERE / f"{name}.ipynb").exists() and (HERE / f"{name}.ipynb").read_text(encoding="utf-8") != render(build(name))]
    bad += [f"{p.name} (no source src/{p.stem}.py)" for p in sorted(HERE.glob(f"{PATTERN}.ipynb")) if p.stem not in src]
    return bad


def write(name: str) -> tuple[Path, nbformat.NotebookNode]:
    """Build ``name`` and write ``<name>.ipynb`` atomically; returns the path and the notebook."""
    path, nb = HERE / f"{name}.ipynb", build(name)
    tmp = path.with_suffix(".ipynb.tmp")
    tmp.write_text(render(nb), encoding="utf-8")
    tmp.replace(path)
    return path, nb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("only", nargs="*", help="notebook name prefixes (e.g. 03 08); default: every source")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 listing the notebooks out of sync")
    args = ap.parse_args(argv)
    if args.check:
        bad = out_of_sync()
        for line in bad:
            print(f"out of sync: notebooks/{line}")
        if bad:
            print("run: .venv/bin/python notebooks/build.py")
        return 1 if bad else 0
    names = [n for n in sources() if not args.only or any(n.startswith(a) for a in args.only)]
    if not names:
        ap.error(f"no source in {SRC} matches {args.only}")
    for name in names:
        path, nb = write(name)
        print(f"wrote {path.relative_to(HERE.parent)} ({len(nb.cells)} cells)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
