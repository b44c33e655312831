"""Small shared helpers: one home each for atomic writes, the cache folder, the file lock and
single-threaded analytics."""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import math
import numbers
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

__all__ = ["one_thread", "single_threaded", "atomic_write_bytes", "atomic_write_files", "atomic_dir",
           "cache_dir", "file_lock", "jsonable", "CACHE_ENV"]

CACHE_ENV = "WORKBENCH_CACHE"


@contextlib.contextmanager
def one_thread():
    """Run small-tensor analytics on one intra-op thread (restored afterwards).

    The analytics work on tensors of a few hundred thousand elements; thread start-up and
    synchronisation then cost more than the arithmetic, badly so on a busy machine.
    """
    old = torch.get_num_threads()
    if old != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if old != 1:
            torch.set_num_threads(old)


def single_threaded(fn):
    """Decorator form of :func:`one_thread`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with one_thread():
            return fn(*args, **kwargs)

    return wrapper


def atomic_write_files(files: Mapping[os.PathLike | str, bytes]) -> list[Path]:
    """Write every ``path: bytes`` to a temp file beside it (mode 0644), then ``os.replace`` all; on an
    error the temp files and any target this call created are removed (targets that existed are
    overwritten only once every temp file is written). Returns the paths."""
    files = {Path(p): data for p, data in files.items()}
    tmps: dict[Path, str] = {}
    created: list[Path] = []
    try:
        for path, data in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            tmps[path] = tmp
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
        for path, tmp in tmps.items():
            existed = path.exists()
            os.replace(tmp, path)
            if not existed:
                created.append(path)
    except BaseException:
        for tmp in tmps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
        for p in created:
            if p.exists():
                p.unlink()
        raise
    return list(files)


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write_files` with one file): on any error
    ``path`` is untouched and no temp file is left."""
    return atomic_write_files({path: data})[0]


@contextlib.contextmanager
def atomic_dir(target: os.PathLike | str) -> Iterator[Path]:
    """A temp folder beside ``target`` to fill; on success it replaces ``target`` (an old ``target`` is
    moved aside and removed), on any error it is removed and ``target`` is untouched."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}.old.tmp")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cache_dir() -> Path:
    """``$WORKBENCH_CACHE``, else ``$XDG_CACHE_HOME/attn-workbench``, else ``~/.cache/attn-workbench``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attn-workbench"


@contextlib.contextmanager
def file_lock(path: os.PathLike | str):
    """An exclusive ``flock`` on ``path`` (created if missing) for the duration of the block."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def jsonable(x):
    """``x`` as plain JSON types: dataclasses (public fields), torch/numpy arrays and scalars, mappings,
    sequences and sets, paths; non-finite floats become ``None``; anything else its ``str``."""
    if x is None or isinstance(x, (str, bool)):
        return x
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        x = float(x)
        return x if math.isfinite(x) else None
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: jsonable(getattr(x, f.name)) for f in dataclasses.fields(x) if not f.name.startswith("_")}
    if hasattr(x, "tolist") and callable(x.tolist):  # torch / numpy
        return jsonable(x.tolist())
    if isinstance(x, Mapping):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in x]
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    return str(x)
