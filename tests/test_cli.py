"""The headless entry point ``python -m workbench capture``."""
from __future__ import annotations

import subprocess
import sys

from workbench.capture.data import Capture


def test_capture_command_writes_a_loadable_file(tmp_path):
    out = tmp_path / "ex.safetensors"
    r = subprocess.run([sys.executable, "-m", "workbench", "capture", "--out", str(out), "--decode", "2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "wrote" in r.stdout and "T=" in r.stdout
    cap = Capture.load(out)
    assert cap.spans.k == 8 and len(cap.generated_ids) == 2
    assert cap.attn.shape[:2] == (30, 9)
    assert list(tmp_path.iterdir()) == [out]


def test_cli_rejects_unknown_example(tmp_path):
    r = subprocess.run([sys.executable, "-m", "workbench", "capture", "--example", "nope",
                        "--out", str(tmp_path / "x")], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "name: no bundled example" in r.stderr
    assert not (tmp_path / "x").exists()


def test_report_rejects_bad_arguments(tmp_path):
    out = tmp_path / "rep"
    r = subprocess.run([sys.executable, "-m", "workbench", "report", "--tiny", "--n-squad", "-1", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "error: n_squad: must be an integer in [0, 1000]" in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()
