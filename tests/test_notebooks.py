"""Every notebook runs top to bottom headless on the default model (bounded per-cell timeout)."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NB_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks clean"
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NB_DIR)}})
    client.execute()
    nbformat.write(nb, tmp_path / path.name)  # executed copy for inspection on failure
