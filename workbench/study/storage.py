"""The sweep frame on disk: its columns, the tidy (typed, ordered) frame, atomic parquet writes and reads."""
from __future__ import annotations

import io
import math
import os
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

import workbench.study.metrics as metrics
from workbench.util import atomic_write_bytes

__all__ = ["COLUMNS", "FRONT", "BACK", "MEASURED", "METHOD_KEYS", "tidy", "is_null", "write_parquet", "roundtrip",
           "read_sweep", "comparable", "check_out", "check_writable", "read_resumable"]

# front and back columns of every sweep frame; p_<name> parameter columns sit between, extras after
FRONT = ("model", "task", "item_id", "method", "params")
BACK = ("seed", "max_new_tokens", "answer", "gold", "generated_ids", "n_generated", "hit_cap", "em", "f1",
        "contains", "match", "contains_conflict", "first_token_agree", "prompt_tokens", "prefill_tokens",
        "retained_tokens", "kv_bytes",
        "n_docs", "answer_doc", "wall_s", "peak_cuda_bytes", "peak_rss_bytes", "device", "dtype", "error", "cell")
COLUMNS = FRONT + BACK
MEASURED = ("wall_s", "peak_cuda_bytes", "peak_rss_bytes")
LEGACY_NO_L_STAR = -99  # the missing l* of sweep files that predate NaN (``-1`` is a layer: prune before layer 0)
METHOD_KEYS = ("generated_ids", "answer", "prompt_tokens", "prefill_tokens", "retained_tokens", "kv_bytes")


def tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Column order, derived columns, row order, parquet-safe types."""
    if df.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    df = df.copy()
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    df["generated_ids"] = df["generated_ids"].map(lambda a: [int(t) for t in a] if a is not None else [])
    # first-token agreement with the full-context run of the same item, seed, model and length
    ok = df["error"].map(is_null).astype(bool)
    ref = df[ok & (df["method"] == "full") & (df["params"] == "{}")]
    ref_key = ["model", "task", "item_id", "max_new_tokens"]
    first = {}  # same seed first, else the lowest seed's full run
    for k, seed, ids in sorted(zip(ref[ref_key].itertuples(index=False), ref["seed"], ref["generated_ids"]),
                               key=lambda r: -int(r[1])):
        first[tuple(k)] = ids
        first[(*k, int(seed))] = ids
    df["first_token_agree"] = [
        metrics.first_token_agreement(ids, first.get((*k, int(seed)), first.get(tuple(k)))) if is_null(e)
        else math.nan
        for k, seed, ids, e in zip(df[ref_key].itertuples(index=False), df["seed"], df["generated_ids"], df["error"])]
    pcols = sorted(c for c in df.columns if c.startswith("p_"))
    mcols = sorted(c for c in df.columns if c.startswith("meta_"))
    extras = sorted(c for c in df.columns if c not in COLUMNS and c not in pcols and c not in mcols)
    df = df[list(FRONT) + pcols + list(BACK) + extras + mcols]
    for c in pcols + extras + mcols + ["prompt_tokens", "prefill_tokens", "retained_tokens", "kv_bytes", "n_docs",
                                       "answer_doc"]:
        df[c] = uniform(df[c])
    for c in ("em", "f1", "contains", "match", "contains_conflict", "first_token_agree", "wall_s",
              "peak_cuda_bytes",
              "peak_rss_bytes"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    for c in ("seed", "max_new_tokens", "n_generated"):
        df[c] = df[c].astype("int64")
    df["error"] = df["error"].map(lambda v: None if is_null(v) else str(v)).astype(object)
    df["hit_cap"] = df["hit_cap"].map(lambda v: False if is_null(v) else bool(v)).astype(bool)
    df = df.sort_values(["model", "task", "item_id", "method", "params", "seed", "max_new_tokens"], kind="stable")
    return df.reset_index(drop=True)


def is_null(v) -> bool:
    """None, NaN, NaT or pd.NA (a scalar); never a list or array."""
    if v is None:
        return True
    if isinstance(v, (str, bytes, list, tuple, dict)) or hasattr(v, "__len__"):
        return False
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def uniform(col: pd.Series) -> pd.Series:
    """One type per column (parquet needs it): integers without gaps stay int64, numbers become
    float64 (NaN for missing), strings stay strings, booleans stay booleans, a mix becomes strings."""

    def kind(v):
        if isinstance(v, (bool, np.bool_)):
            return "bool"
        if isinstance(v, (int, np.integer)):
            return "int"
        if isinstance(v, (float, np.floating)):
            return "float"
        return "str"

    vals = [v for v in col if not is_null(v)]
    kinds = {kind(v) for v in vals}
    if not kinds:
        return col.map(lambda v: None)
    if kinds == {"int"} and len(vals) == len(col):
        return col.astype("int64")
    if kinds <= {"int", "float"}:
        return col.map(lambda v: math.nan if is_null(v) else float(v)).astype("float64")
    if kinds == {"bool"}:
        return col.map(lambda v: None if is_null(v) else bool(v)).astype(object)
    if kinds == {"str"}:
        return col.map(lambda v: None if is_null(v) else str(v)).astype(object)
    return col.map(lambda v: None if is_null(v) else str(v)).astype(object)


def write_parquet(df: pd.DataFrame, path: Path) -> None:


    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


def roundtrip(df: pd.DataFrame) -> pd.DataFrame:
    """The frame as it reads back from parquet (same dtypes whether or not ``out`` was given)."""

    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    buf.seek(0)
    return read_sweep(buf)


def read_sweep(path) -> pd.DataFrame:
    """Read a sweep parquet (``generated_ids`` as lists of ints; missing strings are NaN; ``l_star`` NaN where no
    layer was accepted, the bypass)."""
    df = pd.read_parquet(path)
    if "l_star" in df.columns:  # files that wrote -99 for "no layer accepted": missing, never a layer index
        df["l_star"] = df["l_star"].mask(df["l_star"] == LEGACY_NO_L_STAR)
    if "generated_ids" in df.columns:
        df["generated_ids"] = df["generated_ids"].map(lambda a: [int(t) for t in a] if a is not None else [])
    return df


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    """The frame without what differs between two identical runs: ``MEASURED`` columns and extras
    whose name ends in ``_s`` (wall times)."""
    drop = [c for c in df.columns if c in MEASURED or (c not in COLUMNS and c.endswith("_s"))]
    return df.drop(columns=drop)


# ----------------------------------------------------------------------------- where the frame lives
def check_out(out) -> Path:
    """The sweep's ``out`` as a path, refused before any cell runs when the sweep could not write it: not a
    ``.parquet`` path, a directory or another non-file, or a place this process cannot create files in (a
    read-only place). Nothing is created."""
    if not isinstance(out, (str, os.PathLike)) or not os.fspath(out):
        raise ValueError(f"out: must be a .parquet file path or None, got {out!r}")
    path = Path(out)
    if path.is_dir():
        raise ValueError(f"out: must be a .parquet file path, got the directory {str(path)!r} "
                         f"(for example {str(path / 'sweep.parquet')!r})")
    if path.suffix != ".parquet":
        raise ValueError(f"out: must be a .parquet file path (the sweep writes parquet), got {str(path)!r}")
    if path.exists() and not path.is_file():
        raise ValueError(f"out: must be a regular file, got {str(path)!r}")
    check_writable(path, "out", folder=False)
    return path


def check_writable(path: Path, name: str, *, folder: bool) -> None:
    """Refuse (a ``ValueError`` naming ``name``) a place this process cannot create files in: the nearest existing
    folder at or above ``path`` (``folder``: ``path`` is the folder to write in; else its parent is) must be a folder
    that accepts a new file (probed with a temporary file, removed at once). Nothing else is created."""
    probe_dir = path if folder else path.parent
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise ValueError(f"{name}: {str(probe_dir)!r} is a file, not a folder; choose another {name}")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".workbench-probe-", dir=probe_dir)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ValueError(f"{name}: cannot write in {str(probe_dir)!r} ({e.strerror or e}); choose a writable "
                         "place") from None


def _aside(path: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    return aside


def read_resumable(path: Path) -> pd.DataFrame:
    """The rows of an earlier sweep at ``path`` to resume from (an empty frame when there is none).

    A file that does not read as parquet (truncated, damaged: a sweep writes atomically, so another program or a
    failing disk made it so) is not deleted: it is moved aside to ``<name>.damaged-<UTC time>`` with a warning
    naming both files, and its cells are computed again. A parquet file that is not a sweep frame (no ``cell``
    and ``error`` columns) is someone else's data: it is refused, untouched."""
    empty = pd.DataFrame(columns=list(COLUMNS))
    if not path.exists():
        return empty
    try:
        df = read_sweep(path)
    except (ValueError, OSError, TypeError) as e:  # pyarrow's ArrowInvalid is a ValueError
        aside = _aside(path)
        try:
            os.replace(path, aside)
        except OSError as e2:
            raise ValueError(f"out: {str(path)!r} is damaged ({type(e).__name__}: {e}) and could not be moved aside "
                             f"({e2.strerror or e2}); move or delete it, then run again") from None
        warnings.warn(f"out: {str(path)!r} was damaged ({type(e).__name__}: {e}); it is kept as {str(aside)!r} and "
                      "its cells are computed again (delete the copy once you no longer need it)", RuntimeWarning,
                      stacklevel=3)
        return empty
    missing = [c for c in ("cell", "error") if c not in df.columns]
    if missing:
        raise ValueError(f"out: {str(path)!r} is a parquet file but not a sweep frame (no column {missing[0]!r}); "
                         "choose another out, or move that file away")
    return df
