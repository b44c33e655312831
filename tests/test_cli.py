"""The entry point ``python -m workbench``: one subprocess smoke test (``capture`` on the embedded model, a
loadable file), the rest in process (``workbench.__main__.main([...])``, output captured): every argument is
checked before a model loads (``load_model``/``run_report`` replaced by a function that fails the test)."""
from __future__ import annotations

import subprocess
import sys

import pytest

import workbench.__main__ as cli
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


@pytest.fixture()
def no_model(monkeypatch):
    """``load_model`` and ``run_report`` fail the test: the arguments must be refused before either runs."""
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(cli, "load_model", refuse)
    monkeypatch.setattr(cli, "run_report", refuse)


@pytest.mark.parametrize("argv,message", [
    (["--example", "nope"], "name: no bundled example 'nope'"),
    (["--decode", "-1"], "n_decode: "),
    (["--tail", "-2"], "tail: "),
    (["--device", "cuda:7" if not __import__("torch").cuda.is_available() else "nonsense"], "device"),
])
def test_capture_rejects_bad_arguments_before_loading(tmp_path, capsys, no_model, argv, message):
    out = tmp_path / "x"
    assert cli.main(["capture", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m workbench capture: error: ") and message in err, err
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("argv,message", [
    (["--n-squad", "-1"], "error: n_squad: must be an integer in [0, 1000]"),
    (["--budget-fracs", "1.5"], "error: budget_fracs"),
    (["--threads", "0"], "error: threads"),
    (["--margin", "1.2"], "error: margin: must be in [0, 1)"),
    (["--presets", "paper,papr"], "error: presets: must be a sequence of distinct entries"),
    (["--calibrate", "1.0"], "error: calibrate: must be"),
    # --tiny has one SQuAD prompt and one needle: each family's only cluster stays in test, so calibration is empty
    (["--calibrate", "0.3"], "error: calibrate: a calibration split needs at least 2 independent units"),
    (["--calibrate", "0.3", "--methods", "full", "evict"], "error: calibrate: tunes EntroPrefill"),
])
def test_report_rejects_bad_arguments(tmp_path, capsys, no_model, argv, message):
    out = tmp_path / "rep"
    assert cli.main(["report", "--tiny", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not out.exists()


def test_argparse_refuses_before_anything(capsys, no_model):
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "--threads", "many"])
    assert e.value.code == 2 and "must be 'auto' or an integer >= 1, got 'many'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["nonsense"])
    assert e.value.code == 2


def test_lab_dry_run_prints_the_command(capsys):
    rc = cli.main(["lab", "--dry-run", "--port", "9011", "--token", "abc"])
    out = capsys.readouterr().out
    assert rc in (0, 1) and "JupyterLab: http://127.0.0.1:9011/lab?token=abc" in out
    command = next(line for line in out.splitlines() if "-m jupyter lab" in line)
    assert "--port=9011" in command and "abc" not in command  # the token is not on its command line
    assert cli.main(["lab", "--dry-run", "--port", "0"]) == 2
    assert "port: must be an integer in [1, 65535], got 0" in capsys.readouterr().err
