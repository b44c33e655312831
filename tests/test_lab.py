"""``make lab`` / ``python -m workbench lab``: the JupyterLab command line it builds (token always, --allow-root
as root), the URL it prints, the named kernel the notebooks use."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import __main__ as cli

ROOT = Path(__file__).resolve().parent.parent


def test_command_line_as_root_and_as_user():
    cmd, url, env = cli.lab_command(port=8899, token="abc", uid=0)
    assert cmd[1:4] == ["-m", "jupyter", "lab"] and "--allow-root" in cmd
    assert env["JUPYTER_TOKEN"] == "abc" and "--port=8899" in cmd and "--no-browser" in cmd
    assert "--notebook-dir=notebooks" in cmd
    assert url == "http://127.0.0.1:8899/lab?token=abc"
    cmd, _, _ = cli.lab_command(token="abc", uid=1000)
    assert "--allow-root" not in cmd
    cmd, url, env = cli.lab_command(uid=1000, ip="0.0.0.0")      # a random token when none is given
    tok = env["JUPYTER_TOKEN"]
    assert len(tok) == 32 and url.endswith(tok) and url.startswith("http://127.0.0.1:8888/")
    with pytest.raises(ValueError, match=r"^port: must be an integer in \[1, 65535\]"):
        cli.lab_command(port=0)


def test_token_stays_off_the_command_line_and_is_url_encoded(monkeypatch):
    # any local user reads a command line with ps; the token goes to JupyterLab in its environment instead
    monkeypatch.setenv("JUPYTER_TOKEN_FILE", "/elsewhere")
    cmd, url, env = cli.lab_command(token="a b;x&y", uid=1000)
    assert not any("a b;x&y" in a or "token" in a.lower() for a in cmd), cmd
    assert env["JUPYTER_TOKEN"] == "a b;x&y" and "JUPYTER_TOKEN_FILE" not in env
    assert url == "http://127.0.0.1:8888/lab?token=a%20b%3Bx%26y"


def test_lab_starts_jupyter_with_the_token_in_its_environment(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("JUPYTERLAB_DIR", str(tmp_path))   # the lab's settings: not into the test's own Python
    monkeypatch.setattr(cli, "kernel_installed", lambda name=cli.KERNEL: True)
    monkeypatch.setattr(cli, "port_free", lambda ip, port: True)
    seen = {}
    monkeypatch.setattr(cli.os, "execve", lambda path, argv, env: seen.update(path=path, argv=argv, env=env))
    monkeypatch.setattr(cli.os, "execv", lambda *a: pytest.fail("started without its environment"))
    assert cli.main(["lab", "--port", "8778", "--token", "a b;x"]) == 0
    assert seen["env"]["JUPYTER_TOKEN"] == "a b;x" and not any("a b;x" in a for a in seen["argv"])
    assert "JupyterLab: http://127.0.0.1:8778/lab?token=a%20b%3Bx" in capsys.readouterr().out


def test_dry_run_prints_url_and_command(capsys, monkeypatch):
    monkeypatch.setattr(cli, "kernel_installed", lambda name=cli.KERNEL: True)
    assert cli.main(["lab", "--dry-run", "--port", "8777", "--token", "t0k"]) == 0
    out = capsys.readouterr().out
    assert "JupyterLab: http://127.0.0.1:8777/lab?token=t0k" in out
    assert "-m jupyter lab --notebook-dir=notebooks --port=8777" in out
    monkeypatch.setattr(cli, "kernel_installed", lambda name=cli.KERNEL: False)
    assert cli.main(["lab", "--dry-run"]) == 1 and "MISSING" in capsys.readouterr().out


def test_make_lab_runs_the_workbench_lab_command():
    out = subprocess.run(["make", "-n", "lab", "VENV=/nonexistent", "PORT=9001"], cwd=ROOT, capture_output=True,
                         text=True).stdout
    assert "-m workbench lab --notebook-dir=notebooks --port=9001" in out
    setup = (ROOT / "Makefile").read_text()
    assert "ipykernel install --sys-prefix --name attn-workbench" in setup  # make setup installs the kernel


def test_every_notebook_names_the_kernel():
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert json.loads(nb.read_text())["metadata"]["kernelspec"]["name"] == cli.KERNEL, nb.name


def test_lab_says_when_cells_run_before_the_kernel_is_ready(monkeypatch, capsys, tmp_path):
    """JupyterLab drops cells run while the kernel starts (Run All pressed at once did nothing): the lab starts with
    the notebook setting that refuses them with a notification, a real boolean setting of the installed
    JupyterLab's schema (a misspelt key would be ignored silently)."""
    schema = json.loads((Path(sys.prefix) / "share" / "jupyter" / "lab" / "schemas" / "@jupyterlab" /
                         "notebook-extension" / "tracker.json").read_text())
    values = cli.LAB_OVERRIDES["@jupyterlab/notebook-extension:tracker"]
    assert values == {"enableKernelInitNotification": True}
    assert schema["properties"]["enableKernelInitNotification"]["type"] == "boolean"
    assert schema["properties"]["enableKernelInitNotification"]["default"] is False   # off unless the lab sets it
    monkeypatch.setenv("JUPYTERLAB_DIR", str(tmp_path / "lab"))
    monkeypatch.setattr(cli, "kernel_installed", lambda name=cli.KERNEL: True)
    monkeypatch.setattr(cli, "port_free", lambda ip, port: True)
    monkeypatch.setattr(cli.os, "execve", lambda path, argv, env: None)
    assert cli.main(["lab", "--port", "8779", "--token", "t"]) == 0
    written = tmp_path / "lab" / "settings" / "overrides.d" / "attn-workbench.json"
    assert json.loads(written.read_text()) == cli.LAB_OVERRIDES and str(written) in capsys.readouterr().out


def test_lab_turns_the_news_toast_off_and_sets_threads(monkeypatch, capsys, tmp_path):
    """The lab it starts has JupyterLab's news consent toast and update check off (an overrides file of its own in
    the app dir, the values the browser test sets) and the kernels' torch threads set and said: the cores the load
    leaves free, or the user's ``OMP_NUM_THREADS``."""
    monkeypatch.setattr(cli, "kernel_installed", lambda name=cli.KERNEL: True)
    monkeypatch.setattr(cli, "port_free", lambda ip, port: True)
    monkeypatch.setattr(cli, "auto_threads", lambda: 3)
    monkeypatch.setenv("JUPYTERLAB_DIR", str(tmp_path / "lab"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen = {}
    monkeypatch.setattr(cli.os, "execve", lambda path, argv, env: seen.update(env=env))
    assert cli.main(["lab", "--dry-run", "--token", "t"]) == 0
    assert not (tmp_path / "lab").exists() and "would write" in capsys.readouterr().out  # a dry run writes nothing
    assert cli.main(["lab", "--port", "8779", "--token", "t"]) == 0
    out = capsys.readouterr().out
    written = json.loads((tmp_path / "lab" / "settings" / "overrides.d" / "attn-workbench.json").read_text())
    assert written["@jupyterlab/apputils-extension:notification"] == {"fetchNews": "false", "checkForUpdates": False}
    assert seen["env"]["OMP_NUM_THREADS"] == "3" and "torch threads: OMP_NUM_THREADS=3 (the cores" in out
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cli.main(["lab", "--port", "8779", "--token", "t"]) == 0
    assert seen["env"]["OMP_NUM_THREADS"] == "2" and "OMP_NUM_THREADS=2 (yours)" in capsys.readouterr().out
    # the same values as the browser test's user settings
    src = (ROOT / "tests" / "test_browser.py").read_text()
    assert '{"fetchNews": "false", "checkForUpdates": False}' in src
