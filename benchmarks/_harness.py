"""The one metadata layout every benchmark script writes, and the one way it writes its JSON.

``write_json(path, payload, **extra)`` writes ``{"meta": metadata(**extra), **payload}`` atomically (a list
payload becomes ``{"meta": ..., "results": payload}``); :func:`metadata` is what a run was made of:

- ``commit`` (``git rev-parse HEAD``, ``None`` outside a git checkout) and ``dirty`` (uncommitted changes to
  tracked files: the numbers may not belong to that commit);
- ``script`` and ``argv``; ``time_utc``;
- ``versions``: python, torch, transformers, workbench;
- ``threads`` (torch's intra-op threads), ``cpus`` (``os.cpu_count()``), ``load_avg`` (1, 5, 15 minutes, at
  the moment of writing: a number measured on a loaded machine says so);
- ``machine`` (``platform.platform()``), ``processor``, ``device`` (the CUDA device's name, else ``"cpu"``).

Extra keys (a benchmark's own settings: ``T``, ``reps`` …) go beside these; they may not replace one of them.
``tests/test_benchmarks_smoke.py`` checks that every script writes through here and that the layout holds.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch
import transformers

import workbench
from workbench.util import atomic_write_bytes

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("commit", "dirty", "script", "argv", "time_utc", "versions", "threads", "cpus", "load_avg", "machine",
        "processor", "device")


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def metadata(**extra) -> dict:
    """The run's metadata (module docstring) with ``extra`` beside it; an extra key that names one of
    :data:`KEYS` is refused."""
    clash = sorted(set(extra) & set(KEYS))
    if clash:
        raise ValueError(f"extra: {clash} would replace the harness's own metadata; name them otherwise")
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    meta = {
        "commit": commit,
        "dirty": bool(status) if status is not None else None,
        "script": Path(sys.argv[0]).name if sys.argv and sys.argv[0] else None,
        "argv": list(sys.argv[1:]),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "workbench": workbench.__version__},
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }
    return {**meta, **extra}


def write_json(path, payload, *, indent: int = 2, **extra) -> Path:
    """Write ``{"meta": metadata(**extra), **payload}`` (a dict payload) or ``{"meta": ..., "results": payload}``
    (any other) to ``path`` atomically, creating its folder; returns the path."""
    body = dict(payload) if isinstance(payload, dict) else {"results": payload}
    if "meta" in body:
        raise ValueError("payload: has its own 'meta'; pass its entries as keyword arguments instead")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"meta": metadata(**extra), **body}, indent=indent, default=str)
    return atomic_write_bytes(path, (text + "\n").encode())


_MD_META = "<!-- benchmark metadata: "


def write_markdown(path, text: str, **extra) -> Path:
    """Write a markdown result ``text`` atomically, ending with its metadata as one HTML comment (invisible
    when rendered, read back by :func:`read_meta`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = json.dumps(metadata(**extra), default=str)
    return atomic_write_bytes(path, f"{text.rstrip()}\n\n{_MD_META}{meta} -->\n".encode())


def read_meta(path) -> dict:
    """The metadata a benchmark wrote into ``path`` (a ``.json`` from :func:`write_json`, a ``.md`` from
    :func:`write_markdown`); a file without it is refused."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        meta = json.loads(text).get("meta") if text.lstrip().startswith("{") else None
    else:
        i = text.rfind(_MD_META)
        meta = json.loads(text[i + len(_MD_META):text.index(" -->", i)]) if i >= 0 else None
    if not isinstance(meta, dict) or not set(KEYS) <= set(meta):
        raise ValueError(f"path: {path} holds no benchmark metadata (benchmarks/_harness.py)")
    return meta
