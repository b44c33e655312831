"""Chromium (kaleido's figure export, the HTML export's session) runs inside its sandbox where it can, and says
in one line why where it cannot (root, no user namespaces, ``$WORKBENCH_NO_SANDBOX``), never a silent
``--no-sandbox``. No browser is started: kaleido and the process start are stand-ins."""
from __future__ import annotations

import sys
import threading
import types

import pytest

from workbench.show import chromium
from workbench.show import kaleido_server as ks


@pytest.fixture
def host(monkeypatch, tmp_path):
    """A host whose user id and user-namespace setting the test chooses (``host(uid, userns)``)."""
    monkeypatch.delenv(ks.NO_SANDBOX_ENV, raising=False)
    monkeypatch.setattr(ks, "_SAID", set())

    def set_(uid: int, userns: str | None = "1"):
        monkeypatch.setattr(ks.os, "geteuid", lambda: uid)
        f = tmp_path / "max_user_namespaces"
        if userns is not None:
            f.write_text(userns + "\n")
        else:
            f.unlink(missing_ok=True)
        monkeypatch.setattr(ks, "_USERNS_FILES", (str(tmp_path / "absent"), str(f)))

    return set_


def test_sandbox_where_it_can_and_why_not_where_it_cannot(host, monkeypatch, capsys):
    host(1000)
    assert ks.sandbox() == (True, None) and capsys.readouterr().err == ""
    host(0)
    ok, why = ks.sandbox()
    assert not ok and "runs as root" in why
    assert capsys.readouterr().err == f"figure export: Chromium runs without its sandbox: {why}\n"
    assert ks.sandbox() == (False, why) and capsys.readouterr().err == ""  # said once per process
    host(1000, userns="0")
    ok, why = ks.sandbox(say=False)
    assert not ok and "no unprivileged user namespaces" in why and "max_user_namespaces is 0" in why
    host(1000, userns=None)  # no such setting: the kernel's default allows them
    assert ks.sandbox() == (True, None)
    monkeypatch.setenv(ks.NO_SANDBOX_ENV, "1")
    assert ks.sandbox(say=False) == (False, "$WORKBENCH_NO_SANDBOX is set")


def _session_cmd(monkeypatch) -> list[str]:
    seen = {}

    def popen(argv, **kw):
        seen["argv"] = argv
        raise OSError("not started in this test")

    monkeypatch.setattr(chromium, "browser_path", lambda: "/usr/bin/chromium")
    monkeypatch.setattr(chromium.subprocess, "Popen", popen)
    with pytest.raises(OSError, match="not started"):
        chromium.ChromiumSession().__enter__()
    return seen["argv"]


def test_html_export_session_runs_sandboxed_unless_it_cannot(host, monkeypatch, capsys):
    host(1000)
    assert "--no-sandbox" not in _session_cmd(monkeypatch)
    host(0)
    assert "--no-sandbox" in _session_cmd(monkeypatch)
    assert "Chromium runs without its sandbox: this process runs as root" in capsys.readouterr().err


@pytest.fixture
def fake_kaleido(monkeypatch):
    """kaleido's server calls recorded; ``fail_sandboxed``: a sandboxed start fails (a seccomp-bound container)."""
    calls = []
    fake = types.SimpleNamespace(fail_sandboxed=False, calls=calls)

    def start(**kw):
        calls.append(kw["enable_sandbox"])
        if kw["enable_sandbox"] and fake.fail_sandboxed:
            raise RuntimeError("Failed to move to new namespace: PID namespaces supported, Network namespace "
                               "supported, but failed: errno = Operation not permitted")

    fake.start_sync_server = start
    fake.stop_sync_server = lambda **kw: None
    monkeypatch.setitem(sys.modules, "kaleido", fake)
    monkeypatch.setattr(ks, "browser_path", lambda: "/usr/bin/chromium")
    monkeypatch.setattr(ks, "_call", lambda *a, **kw: b"")
    monkeypatch.setattr(ks, "_STATE", {"running": False, "atexit": True, "threads": []})
    return fake


def test_kaleido_server_asks_for_the_sandbox(host, fake_kaleido, capsys):
    host(1000)
    ks.ensure_server()
    assert fake_kaleido.calls == [True] and capsys.readouterr().err == ""  # kaleido's own default is no sandbox
    ks.shutdown_server()
    host(0)
    ks.ensure_server()
    assert fake_kaleido.calls == [True, False] and "runs as root" in capsys.readouterr().err


def test_a_sandbox_the_system_refuses_is_said_then_left_out(host, fake_kaleido, capsys):
    host(1000)
    fake_kaleido.fail_sandboxed = True
    ks.ensure_server()
    assert fake_kaleido.calls == [True, False]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did not start in its sandbox (Failed to move to new namespace" in err[0]
    assert ks.NO_SANDBOX_ENV in err[0]


def test_a_dead_server_thread_is_seen_and_the_server_restarted(host, fake_kaleido):
    """The thread kaleido's start starts is the server's life: when it ends (Chromium died), the server is not
    running, and the next export stops it and starts a new one (no render waits on a dead server)."""
    host(1000)
    stop, stops = threading.Event(), []

    def start(**kw):
        fake_kaleido.calls.append(kw["enable_sandbox"])
        threading.Thread(target=stop.wait, daemon=True).start()

    fake_kaleido.start_sync_server = start
    fake_kaleido.stop_sync_server = lambda **kw: stops.append(kw)
    ks.ensure_server()
    first = ks.server_thread()
    assert ks.server_running() and first is not None and first.is_alive()
    ks.ensure_server()
    assert fake_kaleido.calls == [True] and stops == []  # alive: kept
    stop.set()
    first.join(5)
    assert not ks.server_running()
    stop.clear()
    ks.ensure_server()
    assert fake_kaleido.calls == [True, True] and len(stops) == 1
    assert ks.server_running() and ks.server_thread() is not first
    stop.set()
