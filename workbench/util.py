"""Small shared helpers: one home each for atomic writes, the cache folder, the file lock and
single-threaded analytics.

Temporary files and folders of every atomic write live in one place per output folder,
``<folder>/.workbench-tmp/``, named ``<target>.<pid>.<random>.tmp``. They are removed on success and on
any error; after a crash (``kill -9``) the next write into that folder (or the next ``prepare`` of the
model cache) sweeps the ones whose writer process is gone (:func:`sweep_stale_temp`), and the folder
itself is removed once empty.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import hashlib
import inspect
import math
import numbers
import os
import shutil
import sysconfig
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import torch

__all__ = ["one_thread", "single_threaded", "atomic_write_bytes", "atomic_write_files", "atomic_dir",
           "cache_dir", "file_lock", "sweep_stale_temp", "sweep_private_temp", "private_temp_dir", "LockBusy", "jsonable",
           "file_sha256", "warn_at_caller", "CACHE_ENV", "TMP_DIRNAME"]

CACHE_ENV = "WORKBENCH_CACHE"
TMP_DIRNAME = ".workbench-tmp"
_PACKAGE_DIR = str(Path(__file__).resolve().parent) + os.sep
_LIBRARY_DIRS = tuple({str(Path(sysconfig.get_paths()[k]).resolve()) + os.sep for k in ("purelib", "platlib")})


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (this machine)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _tmp_pid(name: str) -> int | None:
    """The writer's PID in a temp name ``<target>.<pid>.<random>.tmp`` (None if it has none)."""
    parts = name.rsplit(".", 3)
    if len(parts) == 4 and parts[3] == "tmp" and parts[1].isdigit():
        return int(parts[1])
    return None


def sweep_stale_temp(folder: os.PathLike | str) -> list[Path]:
    """Remove the temp files and folders in ``folder/.workbench-tmp`` left by processes that are gone
    (killed mid-write); returns what was removed. Temp files of live writers are kept."""
    home = Path(folder) / TMP_DIRNAME
    if not home.is_dir():
        return []
    removed = []
    for p in list(home.iterdir()):
        pid = _tmp_pid(p.name)
        if pid is not None and _pid_alive(pid):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        removed.append(p)
    _drop_home(home)
    return removed


def _drop_home(home: Path) -> None:
    with contextlib.suppress(OSError):
        home.rmdir()  # only when empty: another writer's files keep it


def _tmp_home(parent: Path) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temp(parent)
    home = parent / TMP_DIRNAME
    home.mkdir(exist_ok=True)
    return home


def _mk(parent: Path, name: str, folder: bool) -> tuple[int | None, str]:
    """A temp file (fd, path) or folder (None, path) in ``parent``'s temp home; retried when another
    writer removes the empty home in between."""
    # the temp name must fit where the target's fits (255 bytes): keep a long target's start only
    name = name.encode()[:160].decode(errors="ignore")
    for attempt in range(5):
        home = _tmp_home(parent)
        try:
            if folder:
                return None, tempfile.mkdtemp(prefix=f"{name}.{os.getpid()}.", suffix=".tmp", dir=home)
            return tempfile.mkstemp(prefix=f"{name}.{os.getpid()}.", suffix=".tmp", dir=home)
        except FileNotFoundError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


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


def auto_threads() -> int:
    """Torch threads for a run started now: the cores the 1-minute load average leaves free (rounded), at least 1
    (``benchmarks/report_threads.py``: on a quiet 2-core machine 2 threads were 1.3x faster than 1; at load 12,
    1 thread was 5.2x faster than 2)."""
    n = os.cpu_count() or 1
    return max(1, min(n, int(n - os.getloadavg()[0] + 0.5)))


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the user's line: the first frame outside the workbench package and the
    installed libraries (a decorator's wrapper, an inner helper, a widget library's callback are skipped), else
    the first one outside the package. ``skip_file_prefixes`` does the first part from Python 3.12; the floor is
    3.10."""
    frames, f = [], inspect.currentframe().f_back
    while f is not None:
        frames.append(f.f_code.co_filename)
        f = f.f_back
    own = [not name.startswith(_PACKAGE_DIR) for name in frames]
    user = [o and not name.startswith(_LIBRARY_DIRS) for o, name in zip(own, frames)]
    at = user.index(True) if any(user) else own.index(True) if any(own) else len(frames) - 1
    warnings.warn(message, category, stacklevel=at + 2)


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
            fd, tmp = _mk(path.parent, path.name, folder=False)
            tmps[path] = tmp
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
        for path, tmp in tmps.items():
            existed = path.exists()
            os.replace(tmp, path)
            if not existed:
                created.append(path)
    except BaseException as e:
        for tmp in tmps.values():
            if os.path.exists(tmp):
                os.unlink(tmp)
        for p in created:
            if p.exists():
                p.unlink()
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            size = sum(len(d) for d in files.values())
            raise OSError(errno.ENOSPC, f"no space left on the device to write {', '.join(map(str, files))} "
                                        f"({size} bytes); nothing was written") from e
        raise
    finally:
        for path in files:
            _drop_home(path.parent / TMP_DIRNAME)
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
    tmp = Path(_mk(target.parent, target.name, folder=True)[1])
    try:
        yield tmp
        if target.exists():
            old = Path(_mk(target.parent, target.name + "-old", folder=True)[1])
            os.replace(target, old)  # onto the empty folder: atomic on POSIX
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        _drop_home(target.parent / TMP_DIRNAME)


STALE_UNNAMED_S = 3600.0  # a system-temp folder of ours with no writer PID in its name is stale after an hour


def sweep_private_temp(prefix: str, folder: os.PathLike | str | None = None) -> list[Path]:
    """Remove the folders ``<folder>/<prefix><pid>-*`` (``folder``: the system temp folder) whose process is gone,
    and ``<prefix>*`` folders without a PID (an older workbench's) untouched for an hour; returns what was removed."""
    root = Path(folder if folder is not None else tempfile.gettempdir())
    removed = []
    for p in root.glob(f"{prefix}*"):
        if not p.is_dir() or p.is_symlink():
            continue
        head = p.name[len(prefix):].split("-", 1)[0]
        try:
            if head.isdigit() and "-" in p.name[len(prefix):]:
                if _pid_alive(int(head)):
                    continue
            elif time.time() - p.stat().st_mtime < STALE_UNNAMED_S:
                continue
        except FileNotFoundError:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


@contextlib.contextmanager
def private_temp_dir(prefix: str) -> Iterator[str]:
    """A private temp folder ``<system temp>/<prefix><pid>-<random>`` for one step (removed after it); the
    folders of killed processes with the same ``prefix`` are swept first (:func:`sweep_private_temp`), so a
    ``kill -9`` leaves nothing behind after the next call."""
    sweep_private_temp(prefix)
    tmp = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def file_sha256(path: os.PathLike | str) -> str:
    """sha256 of a file, read in 4 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(4 * 2**20), b""):
            h.update(block)
    return h.hexdigest()


def cache_dir() -> Path:
    """``$WORKBENCH_CACHE``, else ``$XDG_CACHE_HOME/attn-workbench``, else ``~/.cache/attn-workbench``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attn-workbench"


class LockBusy(RuntimeError):
    """A lock another process holds (``pid`` is the holder's, or None if unknown)."""

    def __init__(self, msg: str, pid: int | None):
        super().__init__(msg)
        self.pid = pid


def _holder(path: Path) -> int | None:
    try:
        txt = path.read_text().strip()
    except OSError:
        return None
    return int(txt) if txt.isdigit() else None


@contextlib.contextmanager
def file_lock(path: os.PathLike | str, *, wait: bool = True, remove: bool = False,
              on_wait: Callable[[int | None], None] | None = None, what: str = "file"):
    """An exclusive ``flock`` on ``path`` (created if missing) for the duration of the block; the
    holder's PID is written into it.

    Args:
        wait: block until the lock is free (``on_wait(pid)`` is called first, once); else raise
            :class:`LockBusy` naming the holder's PID.
        remove: unlink the lock file on release (safe: a waiter that locked the unlinked file retries).
        what: what the lock protects (named in the error).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    told = False
    while True:
        fh = open(path, "a+")
        try:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _holder(path)
                if not wait:
                    raise LockBusy(f"{what}: {path} is locked by process {pid if pid is not None else '?'} "
                                   "(another writer is running); wait for it or use another output", pid) from None
                if on_wait is not None and not told:
                    on_wait(pid)
                    told = True
                fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                same = os.fstat(fh.fileno()).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder removed the file while we waited: lock the new one
                fh.close()
                continue
            fh.seek(0)
            fh.truncate()
            fh.write(str(os.getpid()))
            fh.flush()
            try:
                yield
            finally:
                if remove:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                else:
                    fh.seek(0)
                    fh.truncate()
                    fh.flush()
                fcntl.flock(fh, fcntl.LOCK_UN)
            return
        finally:
            fh.close()


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
