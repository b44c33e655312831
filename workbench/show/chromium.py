"""One headless Chromium for a whole HTML export, driven over the DevTools protocol.

:class:`ChromiumSession` starts Chromium once (``--remote-debugging-pipe``: commands and replies are JSON
messages ended by a NUL byte on the descriptors 3 and 4 of the browser) with its own temporary profile, and
serves every page of an export call from that one process: load a file, evaluate a script in it, print it to
PDF at a page size. It replaces one Chromium start per step and per width (``--dump-dom``, ``--print-to-pdf``).
Raises RuntimeError when Chromium is missing, fails or gives no answer within ``timeout_s``.
"""
from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workbench.show.kaleido_server import browser_path, sandbox
from workbench.util import private_temp_dir

__all__ = ["ChromiumSession", "CHROMIUM_TIMEOUT_S", "NO_CHROMIUM"]

CHROMIUM_TIMEOUT_S = 120.0
NO_CHROMIUM = ("figure export needs Chromium: install Debian's chromium (apt-get install chromium "
               "fonts-liberation fonts-dejavu-core) or set BROWSER_PATH to a Chromium binary")
_FLAGS = ("--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
          "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
          "--mute-audio", "--remote-debugging-pipe")


# puts the two pipe ends on Chromium's descriptors 3 and 4, then becomes Chromium (argv: read fd, write fd, command)
_ON_FDS_3_4 = ("import fcntl, os, sys\n"
               "r, w = (fcntl.fcntl(int(a), fcntl.F_DUPFD, 10) for a in sys.argv[1:3])\n"
               "os.dup2(r, 3); os.dup2(w, 4); os.close(r); os.close(w)\n"
               "os.execv(sys.argv[3], sys.argv[3:])\n")


class ChromiumSession:
    """A headless Chromium for the length of a ``with`` block: :meth:`open` a page, :meth:`evaluate` in it,
    :meth:`print_pdf` it. Every call waits at most ``timeout_s``."""

    def __init__(self, timeout_s: float = CHROMIUM_TIMEOUT_S):
        self.timeout_s = float(timeout_s)
        self._proc: subprocess.Popen | None = None
        self._next_id = 0
        self._buf = b""
        self._events: list[dict] = []
        self._targets: dict[str, str] = {}  # session id -> target id

    # ------------------------------------------------------------------------- process
    def __enter__(self) -> ChromiumSession:
        exe = browser_path()
        if exe is None:
            raise RuntimeError(NO_CHROMIUM)
        self._profile = private_temp_dir("workbench-chromium-")
        prof = self._profile.__enter__()
        self._err = tempfile.TemporaryFile()
        to_r, to_w = os.pipe()  # we write commands, Chromium reads them on its fd 3
        from_r, from_w = os.pipe()  # Chromium writes replies on its fd 4, we read them
        cmd = [exe, *_FLAGS, f"--user-data-dir={prof}", "about:blank"]
        if not sandbox()[0]:  # says why, once
            cmd.insert(1, "--no-sandbox")
        try:
            self._proc = subprocess.Popen([sys.executable, "-c", _ON_FDS_3_4, str(to_r), str(from_w), *cmd],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._err,
                                          pass_fds=(to_r, from_w))
        except BaseException:
            for fd in (to_r, to_w, from_r, from_w):
                os.close(fd)
            self._close_files()
            raise
        os.close(to_r)
        os.close(from_w)
        self._w, self._r = to_w, from_r
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    if exc_type is not None:  # a failed or hung browser: no goodbye
                        raise RuntimeError
                    self._send("Browser.close")
                    self._proc.wait(timeout=5)
                except (RuntimeError, subprocess.TimeoutExpired):
                    self._proc.kill()
                    self._proc.wait()
            for fd in (self._w, self._r):
                os.close(fd)
            self._proc = None
        self._close_files()

    def _close_files(self) -> None:
        if getattr(self, "_err", None) is not None:
            self._err.close()
            self._err = None
        if getattr(self, "_profile", None) is not None:
            self._profile.__exit__(None, None, None)
            self._profile = None

    def _failure(self, what: str) -> RuntimeError:
        rc = None
        if self._proc is not None:
            try:
                rc = self._proc.wait(timeout=0.5)  # a browser that closed its pipe is exiting
            except subprocess.TimeoutExpired:
                rc = None
        err = b""
        if self._err is not None:
            self._err.seek(0)
            err = self._err.read()[-2000:]
        state = f"Chromium failed ({rc})" if rc is not None else what
        return RuntimeError(f"figure export: {state}: {err.decode('utf-8', 'replace')[-500:]}".rstrip(": "))

    # ------------------------------------------------------------------------- protocol
    def _send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self._w, data):]
        except OSError:  # EPIPE: the browser is gone
            raise self._failure("Chromium closed its pipe") from None
        return self._next_id

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise self._failure(f"Chromium gave no result within {self.timeout_s:.0f} s")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise self._failure("Chromium closed its pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and return its result (events that come first are kept for :meth:`wait_event`)."""
        mid = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout_s
        while True:
            msg = self._read(deadline)
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"figure export: Chromium refused {method}: {msg['error'].get('message')}")
                return msg.get("result", {})
            if "method" in msg:
                self._events.append(msg)

    def wait_event(self, method: str, session: str) -> dict:
        """The next event ``method`` of ``session`` (one already received counts)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            for i, ev in enumerate(self._events):
                if ev.get("method") == method and ev.get("sessionId") == session:
                    return self._events.pop(i)
            msg = self._read(deadline)
            if "method" in msg:
                self._events.append(msg)

    # ------------------------------------------------------------------------- pages
    def open(self, path: Path) -> str:
        """Load the file ``path`` in a new tab (its fonts loaded); returns the tab's session id."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self._targets[sid] = target
        self.call("Page.enable", session=sid)
        self.call("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=sid)
        self.wait_event("Page.loadEventFired", sid)
        self.evaluate(sid, "document.fonts.ready.then(() => true)")
        return sid

    def evaluate(self, session: str, expression: str):
        """The value of ``expression`` in the page (a promise is awaited; the value comes back as JSON)."""
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True},
                        session=session)
        if "exceptionDetails" in res:
            raise RuntimeError(f"figure export: a script in Chromium's page failed: "
                               f"{res['exceptionDetails'].get('text')}")
        return res.get("result", {}).get("value")

    def print_pdf(self, session: str, width_pt: float, height_pt: float) -> bytes:
        """The page printed to one PDF page of ``width_pt`` x ``height_pt`` (no margins, header or footer)."""
        res = self.call("Page.printToPDF", {"paperWidth": width_pt / 72.0, "paperHeight": height_pt / 72.0,
                                            "marginTop": 0, "marginBottom": 0, "marginLeft": 0, "marginRight": 0,
                                            "printBackground": True, "preferCSSPageSize": True,
                                            "displayHeaderFooter": False}, session=session)
        return base64.b64decode(res["data"])

    def close_tab(self, session: str) -> None:
        """Close the tab of ``session``."""
        self.call("Target.closeTarget", {"targetId": self._targets.pop(session)})
