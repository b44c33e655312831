"""The sweep frame on disk: its columns, the tidy (typed, ordered) frame, atomic parquet writes and reads."""
from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd

import workbench.study.metrics as metrics
from workbench.util import atomic_write_bytes

__all__ = ["COLUMNS", "FRONT", "BACK", "MEASURED", "METHOD_KEYS", "tidy", "is_null", "write_parquet", "roundtrip",
           "read_sweep", "comparable"]

# front and back columns of every sweep frame; p_<name> parameter columns sit between, extras after
FRONT = ("model", "task", "item_id", "method", "params")
BACK = ("seed", "max_new_tokens", "answer", "gold", "generated_ids", "n_generated", "hit_cap", "em", "f1",
        "contains", "match", "contains_conflict", "first_token_agree", "prompt_tokens", "prefill_tokens",
        "retained_tokens", "kv_bytes",
        "n_docs", "answer_doc", "wall_s", "peak_cuda_bytes", "peak_rss_bytes", "device", "dtype", "error", "cell")
COLUMNS = FRONT + BACK
MEASURED = ("wall_s", "peak_cuda_bytes", "peak_rss_bytes")
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
    """Read a sweep parquet (``generated_ids`` as lists of ints; missing strings are NaN)."""
    df = pd.read_parquet(path)
    if "generated_ids" in df.columns:
        df["generated_ids"] = df["generated_ids"].map(lambda a: [int(t) for t in a] if a is not None else [])
    return df


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    """The frame without what differs between two identical runs: ``MEASURED`` columns and extras
    whose name ends in ``_s`` (wall times)."""
    drop = [c for c in df.columns if c in MEASURED or (c not in COLUMNS and c.endswith("_s"))]
    return df.drop(columns=drop)
