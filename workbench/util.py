"""Small shared helpers."""
from __future__ import annotations

import contextlib
import functools

import torch


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


def atomic_write_bytes(path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temp file in the same folder, then ``os.replace``; on any
    error the temp file is removed and ``path`` is untouched (never half written)."""
    import os
    import tempfile
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
