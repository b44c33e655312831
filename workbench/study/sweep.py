"""Sweeps: a grid of (task item, method, parameters, seed) runs → one tidy DataFrame in parquet.

A **method** is one function ``run(lm, item, params) -> dict`` registered by name::

    @register_method("my_method", params=("budget",))
    def _my_method(lm, item, params):
        prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
        ...
        return {"generated_ids": ids, "prompt_tokens": prompt.T, "retained_tokens": kept, "kv_bytes": nbytes}

``lm`` is a :class:`~workbench.run.models.LoadedModel`, ``item`` a :class:`~workbench.study.tasks.TaskItem`, and
``params`` the cell's method parameters plus ``max_new_tokens`` and ``seed``. The returned dict
must hold ``generated_ids`` (greedy tokens, stop token included when one was generated) and may hold
``prompt_tokens`` (``T``), ``prefill_tokens`` (tokens the prefill ran on), ``retained_tokens`` (KV
entries kept for decoding), ``kv_bytes`` (KV cache bytes after the prefill), ``answer`` (else the ids
are decoded up to the first stop token), and any scalar diagnostics (their own columns; names
ending in ``_s`` are wall times). The methods ``full``, ``entroprefill`` and ``evict`` are registered by
:mod:`workbench.study.methods` (imported with the package); the sweep itself decodes nothing.

A method registered with ``per_item=True`` runs all its cells of one item together (``evict`` does: one
shared prefill, batched decoding): ``fn(lm, item, [params, ...]) -> [dict or exception, ...]``, one entry
per cell in order (an exception is that cell's error). The sweep groups those cells per item after
skipping the finished ones (resume stays cell by cell) and passes nothing else between cells: no state
is carried from one call to the next.

:func:`sweep` expands the grid, skips the cells already in ``out`` (resumable: rows are keyed by
model, task, item id, method, parameters, seed and ``max_new_tokens``), runs the rest locally or on
Ray (``executor="ray"``: one task per cell, one GPU per task when the cluster has GPUs, rows streamed
back) and writes the parquet atomically (temporary file + ``os.replace``) every ``checkpoint_s``
seconds, on interruption and at the end. The sweep scores each answer (EM, F1, contains; see
:mod:`workbench.study.metrics`) and computes ``first_token_agree`` against the ``"full"`` run of the same
item (same seed when there is one; added to the grid at the first seed unless ``reference=False``).

Columns (one row per cell): ``model, task, item_id, method, params`` (JSON), ``p_<name>`` (one per
method parameter, missing where a method lacks it), ``seed, max_new_tokens``, ``answer`` (decoded reply),
``gold`` (first gold answer), ``generated_ids, n_generated``, ``hit_cap`` (the reply used all
``max_new_tokens`` without a stop token: it may be cut before its answer), ``em, f1, contains`` (``[0, 1]``),
``match`` (RULER's string match over the whole reply),
``contains_conflict`` (contradictory items), ``first_token_agree``, ``prompt_tokens, prefill_tokens,
retained_tokens, kv_bytes`` (from the method), ``n_docs, answer_doc``, ``wall_s`` (the method call; a step shared between cells, such as the eviction prefill, is charged to
the cell that ran it), ``method_s`` (the cell's own work: ``wall_s`` less shared steps, which a method
reports as ``shared_s``),
``peak_cuda_bytes`` (``max_memory_allocated`` during the cell; NaN on CPU), ``peak_rss_bytes`` (the
process's resident high-water mark so far, not per cell), ``device, dtype, error, cell`` (resume key),
then method extras and ``meta_<key>`` (the item's provenance: length, depth, qid ...).
"""
from __future__ import annotations

import io
import itertools
import json
import math
import os
import random
import resource
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

import workbench.study.metrics as metrics
from workbench.checks import SEED_MAX, check_bool, check_choice, check_real, is_int
from workbench.run.generate import decode_answer, stop_token_ids
from workbench.run.models import DEFAULT_MODEL_NAME, LoadedModel, load_model
from workbench.study.tasks import TaskItem
from workbench.util import atomic_write_bytes, file_lock

__all__ = ["Method", "register_method", "unregister_method", "get_method", "available_methods", "Cell",
           "expand_grid", "grid_frame", "run_cell", "run_cells", "sweep", "read_sweep", "comparable", "COLUMNS",
           "MEASURED"]

Scalar = (int, float, str, bool, type(None))
RESERVED_PARAMS = ("max_new_tokens", "seed")
# front and back columns of every sweep frame; p_<name> parameter columns sit between, extras after
FRONT = ("model", "task", "item_id", "method", "params")
BACK = ("seed", "max_new_tokens", "answer", "gold", "generated_ids", "n_generated", "hit_cap", "em", "f1",
        "contains", "match", "contains_conflict", "first_token_agree", "prompt_tokens", "prefill_tokens",
        "retained_tokens", "kv_bytes",
        "n_docs", "answer_doc", "wall_s", "peak_cuda_bytes", "peak_rss_bytes", "device", "dtype", "error", "cell")
COLUMNS = FRONT + BACK
MEASURED = ("wall_s", "peak_cuda_bytes", "peak_rss_bytes")
METHOD_KEYS = ("generated_ids", "answer", "prompt_tokens", "prefill_tokens", "retained_tokens", "kv_bytes")


# ----------------------------------------------------------------------------- method registry
@dataclass(frozen=True)
class Method:
    """A registered method: ``fn(lm, item, params) -> dict``; ``params`` the accepted parameter names
    (``None``: any); ``per_item``: ``fn(lm, item, [params, ...]) -> [dict or exception, ...]`` runs all
    the method's cells of one item in one call."""

    name: str
    fn: Callable
    params: tuple[str, ...] | None = None
    description: str = ""
    per_item: bool = False


METHODS: dict[str, Method] = {}


def register_method(name: str, fn: Callable | None = None, *, params: Sequence[str] | None = None,
                    description: str = "", replace: bool = False, per_item: bool = False):
    """Register ``fn(lm, item, params) -> dict`` under ``name`` (usable as a decorator).

    Args:
        params: the parameter names the method accepts (a grid with another name raises); ``None``: any.
        replace: allow replacing an existing registration.
        per_item: the method runs all its cells of one item together: ``fn(lm, item, [params, ...])``
            returns one dict (or one exception, that cell's error) per cell, in order.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: must be an identifier-like string, got {name!r}")
    check_bool("per_item", per_item)
    if params is not None:
        params = tuple(params)
        for p in params:
            _check_param_name(p)

    def deco(f):
        if not callable(f):
            raise ValueError(f"fn: must be callable, got {f!r}")
        if name in METHODS and not replace and METHODS[name].fn is not f:
            raise ValueError(f"name: method {name!r} is already registered (pass replace=True)")
        METHODS[name] = Method(name, f, params, description or (f.__doc__ or "").strip().split("\n")[0], per_item)
        return f

    return deco(fn) if fn is not None else deco


def unregister_method(name: str) -> None:
    METHODS.pop(name, None)


def get_method(name: str) -> Method:
    """The registered method ``name`` (importing the modules that register methods when needed)."""
    if name not in METHODS:
        raise ValueError(f"method: must be one of {available_methods()}, got {name!r}")
    return METHODS[name]


def available_methods() -> list[str]:
    return sorted(METHODS)


def _check_param_name(p):
    if not isinstance(p, str) or not p.isidentifier():
        raise ValueError(f"params: parameter names must be identifiers, got {p!r}")
    if p in RESERVED_PARAMS:
        raise ValueError(f"params: {p!r} is reserved (set by the sweep: {RESERVED_PARAMS})")


# ----------------------------------------------------------------------------- the grid
def _scalar(name, v):
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # numpy / torch scalars
        v = v.item()
    if not isinstance(v, Scalar) or (isinstance(v, float) and math.isnan(v)):
        raise ValueError(f"params: {name} values must be int, float (not NaN), str, bool or None, got {v!r}")
    return v


@dataclass(frozen=True)
class Cell:
    """One run of the grid: an item of a task, a method with its parameters, a seed."""

    task: str
    item_id: str
    method: str
    params: tuple[tuple[str, object], ...]
    seed: int

    @property
    def params_dict(self) -> dict:
        return dict(self.params)

    @property
    def params_json(self) -> str:
        return json.dumps(self.params_dict, sort_keys=True)

    def key(self, model: str, max_new_tokens: int) -> str:
        """The resume key: a cell is done when a row without error carries this key."""
        return json.dumps([model, self.task, self.item_id, self.method, self.params_json, self.seed,
                           max_new_tokens])


def _method_settings(methods) -> list[tuple[str, dict]]:
    """Normalise the ``methods`` argument to ``[(name, {param: scalar})]`` (cartesian products expanded)."""
    if isinstance(methods, str):
        methods = [methods]
    if isinstance(methods, Mapping):
        entries = list(methods.items())
    else:
        entries = []
        for m in methods:
            if isinstance(m, str):
                entries.append((m, {}))
            elif isinstance(m, (tuple, list)) and len(m) == 2 and isinstance(m[0], str):
                entries.append((m[0], m[1] or {}))
            else:
                raise ValueError(f"methods: entries must be a name or (name, {{param: values}}), got {m!r}")
    if not entries:
        raise ValueError("methods: must name at least one method")
    out = []
    for name, grid in entries:
        meth = get_method(name)
        if not isinstance(grid, Mapping):
            raise ValueError(f"methods: the parameters of {name!r} must be a mapping, got {grid!r}")
        names = sorted(grid)
        for p in names:
            _check_param_name(p)
            if meth.params is not None and p not in meth.params:
                raise ValueError(f"params: {name!r} accepts {list(meth.params)}, got {p!r}")
        values = []
        for p in names:
            v = grid[p]
            vs = list(v) if isinstance(v, (list, tuple, range)) or (hasattr(v, "__len__") and not isinstance(v, str)) else [v]
            if not vs:
                raise ValueError(f"params: {name}.{p} has no values")
            values.append([_scalar(f"{name}.{p}", x) for x in vs])
        for combo in itertools.product(*values):
            out.append((name, dict(zip(names, combo))))
    return out


def _flatten_items(items) -> list[TaskItem]:
    if isinstance(items, TaskItem):
        items = [items]
    if isinstance(items, Mapping):
        items = [it for v in items.values() for it in v]
    items = list(items)
    if not items:
        raise ValueError("items: must hold at least one TaskItem")
    seen = set()
    for it in items:
        if not isinstance(it, TaskItem):
            raise ValueError(f"items: must be TaskItems, got {type(it).__name__}")
        if (it.task, it.item_id) in seen:
            raise ValueError(f"items: duplicate item {it.task}/{it.item_id}")
        seen.add((it.task, it.item_id))
    return items


def _check_seeds(seeds) -> list[int]:
    seeds = [seeds] if isinstance(seeds, int) else list(seeds)
    if not seeds or any(not is_int(s) or not 0 <= s <= SEED_MAX for s in seeds):
        raise ValueError(f"seeds: must be a non-empty list of integers in [0, 2^63 - 1], got {seeds!r}")
    return list(dict.fromkeys(int(s) for s in seeds))


def expand_grid(items, methods, seeds=(0,), *, reference: bool = True) -> list[Cell]:
    """All cells: every item × every method setting × every seed, in that order (duplicates dropped).

    Args:
        items: TaskItems (a list, or ``{task: [items]}``).
        methods: ``{name: {param: value or list of values}}`` (cartesian product per method), or a
            list of names and ``(name, {param: values})`` pairs (several grids for one method).
        seeds: integers ``≥ 0``.
        reference: add the ``"full"`` run of every item (the first-token reference), at the first seed
            unless ``"full"`` is in ``methods`` (then it runs at every seed like any method).
    """
    items = _flatten_items(items)
    settings = _method_settings(methods)
    seeds = _check_seeds(seeds)
    cells = {}
    for it in items:
        if reference and ("full", {}) not in settings:  # greedy full context does not depend on the seed
            cells.setdefault(Cell(it.task, it.item_id, "full", (), seeds[0]), None)
        for name, p in settings:
            for s in seeds:
                cells.setdefault(Cell(it.task, it.item_id, name, tuple(sorted(p.items())), s), None)
    return list(cells)


def grid_frame(cells: Sequence[Cell]) -> pd.DataFrame:
    """One row per cell (task, item id, method, params JSON, ``p_*`` columns, seed)."""
    return pd.DataFrame([{"task": c.task, "item_id": c.item_id, "method": c.method, "params": c.params_json,
                          **{f"p_{k}": v for k, v in c.params}, "seed": c.seed} for c in cells])


# ----------------------------------------------------------------------------- one cell
def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


def _peak_rss_bytes() -> float:
    try:

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return float(r if sys.platform == "darwin" else r * 1024)
    except (ImportError, OSError):  # pragma: no cover
        return math.nan


def _method_row(out, cell: Cell) -> dict:
    if not isinstance(out, Mapping) or "generated_ids" not in out:
        raise ValueError(f"method: {cell.method!r} must return a dict with 'generated_ids', got {type(out).__name__}")
    row = {}
    for k, v in out.items():
        if k == "generated_ids":
            row[k] = [int(t) for t in v]
        elif k in COLUMNS or k.startswith(("p_", "meta_")):
            if k not in METHOD_KEYS:
                raise ValueError(f"method: {cell.method!r} returned {k!r}, a column the sweep owns")
            row[k] = v
        else:
            if hasattr(v, "item") and not isinstance(v, str):
                v = v.item()
            if not isinstance(v, Scalar):
                raise ValueError(f"method: {cell.method!r} returned {k}={v!r}; extra values must be scalars")
            row[k] = v
    return row


def _start_row(lm, item: TaskItem, cell: Cell, model_id: str, max_new_tokens: int) -> dict:
    return {"model": model_id, "task": cell.task, "item_id": cell.item_id, "method": cell.method,
            "params": cell.params_json, **{f"p_{k}": v for k, v in cell.params}, "seed": cell.seed,
            "max_new_tokens": max_new_tokens, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
            "error": None, "cell": cell.key(model_id, max_new_tokens), "gold": item.answers[0],
            "n_docs": len(item.documents), "answer_doc": item.answer_doc,
            **{f"meta_{k}": v for k, v in item.meta.items() if isinstance(v, (int, float, str, bool))}}


def _finish_row(lm, item: TaskItem, row: dict, out: dict, max_new_tokens: int) -> dict:
    """Fill ``row`` (timings already in it) with a method's checked output ``out`` and the scores."""
    error = out.pop("error", None)
    answer = out.pop("answer", None)
    row.update(out)
    row["error"] = error
    ids = row["generated_ids"]
    if answer is None:
        answer = decode_answer(lm.tokenizer, ids, stop_token_ids(lm)) if ids else ""
    row["answer"] = answer
    row["n_generated"] = len(ids)
    row["hit_cap"] = bool(error is None and len(ids) >= max_new_tokens and int(ids[-1]) not in set(stop_token_ids(lm)))
    row.setdefault("method_s", row["wall_s"])
    if error is None:
        row.update(metrics.answer_scores(answer, item.answers, parts=item.answer_parts,
                                         conflict=item.conflict_answers))
    else:
        row.update(em=math.nan, f1=math.nan, contains=math.nan, match=math.nan, contains_conflict=math.nan)
    return row


class _Meter:
    """Wall time and peak memory of one method call (the CUDA peak is reset at the start)."""

    def __init__(self, lm):
        self.device = torch.device(lm.device)
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.t0 = time.perf_counter()

    def stop(self) -> dict:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return {"wall_s": time.perf_counter() - self.t0,
                "peak_cuda_bytes": float(torch.cuda.max_memory_allocated(self.device)) if self.cuda else math.nan,
                "peak_rss_bytes": _peak_rss_bytes()}


def _error_out(e: BaseException) -> dict:
    return {"generated_ids": [], "error": f"{type(e).__name__}: {e}"}


def run_cell(lm, item: TaskItem, cell: Cell, *, model_id: str, max_new_tokens: int, fn: Callable | None = None,
             on_error: str = "raise") -> dict:
    """Run one cell and return its row (scores included; ``first_token_agree`` is left to the sweep)."""
    fn = fn or get_method(cell.method).fn
    row = _start_row(lm, item, cell, model_id, max_new_tokens)
    params = dict(cell.params, max_new_tokens=max_new_tokens, seed=cell.seed)
    meter = _Meter(lm)
    try:
        _seed_everything(cell.seed)  # inside the try: on_error="record" records a seeding error too
        out = _method_row(fn(lm, item, params), cell)
    except Exception as e:  # noqa: BLE001 - recorded or re-raised
        if on_error == "raise":
            raise
        out = _error_out(e)
    row.update(meter.stop())
    return _finish_row(lm, item, row, out, max_new_tokens)


def _group_rows(lm, item: TaskItem, cells: Sequence[Cell], *, model_id: str, max_new_tokens: int,
                fn: Callable, on_error: str) -> tuple[list[dict], Exception | None]:
    """The rows of one per-item call, and (``on_error="raise"``) the first cell's error, if any: the rows of
    the cells that succeeded are returned beside it, so that a failing cell loses none of them."""
    rows = [_start_row(lm, item, c, model_id, max_new_tokens) for c in cells]
    meter = _Meter(lm)
    try:
        _seed_everything(cells[0].seed)  # per-item methods take each cell's seed from its params
        outs = fn(lm, item, [dict(c.params, max_new_tokens=max_new_tokens, seed=c.seed) for c in cells])
        if not isinstance(outs, Sequence) or isinstance(outs, (str, Mapping)) or len(outs) != len(cells):
            raise ValueError(f"method: {cells[0].method!r} runs per item and must return a list of one dict per cell "
                             f"({len(cells)}), got {type(outs).__name__}")
    except Exception as e:  # noqa: BLE001 - recorded or re-raised
        if on_error == "raise":
            raise
        outs = [e] * len(cells)
    measured = meter.stop()
    done, first_error = [], None
    for i, (row, cell, out) in enumerate(zip(rows, cells, outs)):
        try:
            if isinstance(out, Exception):
                raise out
            out = _method_row(out, cell)
        except Exception as e:  # noqa: BLE001 - recorded or re-raised
            if on_error == "raise":
                first_error = first_error or e
                continue
            out = _error_out(e)
        # the call's wall time is charged to the group's first cell (it ran the steps the cells share); each
        # cell's own work is the method's ``method_s``
        row.update(measured, wall_s=measured["wall_s"] if i == 0 else 0.0)
        done.append(_finish_row(lm, item, row, out, max_new_tokens))
    return done, first_error


def run_cells(lm, item: TaskItem, cells: Sequence[Cell], *, model_id: str, max_new_tokens: int,
              fn: Callable | None = None, on_error: str = "raise") -> list[dict]:
    """Run the cells of one item under a per-item method (``register_method(per_item=True)``) in one call and
    return their rows in order. ``wall_s``: the call's time, charged to the first cell (0 for the others);
    ``peak_*_bytes``: the call's. With ``on_error="raise"`` the first cell error is raised."""
    cells = list(cells)
    if not cells or any((c.task, c.item_id) != (item.task, item.item_id) for c in cells):
        raise ValueError(f"cells: must be a non-empty list of cells of item {item.task}/{item.item_id}")
    rows, error = _group_rows(lm, item, cells, model_id=model_id, max_new_tokens=max_new_tokens,
                              fn=fn or get_method(cells[0].method).fn, on_error=on_error)
    if error is not None:
        raise error
    return rows


def _units(todo: Sequence[Cell], methods: Mapping[str, Method]) -> list[list[Cell]]:
    """The cells to run, one call each: a per-item method's cells of one item together (where its first
    cell stands), every other cell alone."""
    units, groups = [], {}
    for c in todo:
        if methods[c.method].per_item:
            key = (c.method, c.task, c.item_id)
            if key not in groups:
                groups[key] = []
                units.append(groups[key])
            groups[key].append(c)
        else:
            units.append([c])
    return units


def _run_unit(lm, item: TaskItem, unit: list[Cell], method: Method, *, model_id, max_new_tokens, on_error):
    """``(rows, error)`` of one unit of :func:`_units`."""
    if not method.per_item:
        return [run_cell(lm, item, unit[0], model_id=model_id, max_new_tokens=max_new_tokens, fn=method.fn,
                         on_error=on_error)], None
    return _group_rows(lm, item, unit, model_id=model_id, max_new_tokens=max_new_tokens, fn=method.fn,
                       on_error=on_error)


# ----------------------------------------------------------------------------- the frame
def _tidy(df: pd.DataFrame) -> pd.DataFrame:
    """Column order, derived columns, row order, parquet-safe types."""
    if df.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    df = df.copy()
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = None
    df["generated_ids"] = df["generated_ids"].map(lambda a: [int(t) for t in a] if a is not None else [])
    # first-token agreement with the full-context run of the same item, seed, model and length
    ok = df["error"].map(_is_null).astype(bool)
    ref = df[ok & (df["method"] == "full") & (df["params"] == "{}")]
    ref_key = ["model", "task", "item_id", "max_new_tokens"]
    first = {}  # same seed first, else the lowest seed's full run
    for k, seed, ids in sorted(zip(ref[ref_key].itertuples(index=False), ref["seed"], ref["generated_ids"]),
                               key=lambda r: -int(r[1])):
        first[tuple(k)] = ids
        first[(*k, int(seed))] = ids
    df["first_token_agree"] = [
        metrics.first_token_agreement(ids, first.get((*k, int(seed)), first.get(tuple(k)))) if _is_null(e)
        else math.nan
        for k, seed, ids, e in zip(df[ref_key].itertuples(index=False), df["seed"], df["generated_ids"], df["error"])]
    pcols = sorted(c for c in df.columns if c.startswith("p_"))
    mcols = sorted(c for c in df.columns if c.startswith("meta_"))
    extras = sorted(c for c in df.columns if c not in COLUMNS and c not in pcols and c not in mcols)
    df = df[list(FRONT) + pcols + list(BACK) + extras + mcols]
    for c in pcols + extras + mcols + ["prompt_tokens", "prefill_tokens", "retained_tokens", "kv_bytes", "n_docs",
                                       "answer_doc"]:
        df[c] = _uniform(df[c])
    for c in ("em", "f1", "contains", "match", "contains_conflict", "first_token_agree", "wall_s",
              "peak_cuda_bytes",
              "peak_rss_bytes"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    for c in ("seed", "max_new_tokens", "n_generated"):
        df[c] = df[c].astype("int64")
    df["error"] = df["error"].map(lambda v: None if _is_null(v) else str(v)).astype(object)
    df["hit_cap"] = df["hit_cap"].map(lambda v: False if _is_null(v) else bool(v)).astype(bool)
    df = df.sort_values(["model", "task", "item_id", "method", "params", "seed", "max_new_tokens"], kind="stable")
    return df.reset_index(drop=True)


def _is_null(v) -> bool:
    """None, NaN, NaT or pd.NA (a scalar); never a list or array."""
    if v is None:
        return True
    if isinstance(v, (str, bytes, list, tuple, dict)) or hasattr(v, "__len__"):
        return False
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _uniform(col: pd.Series) -> pd.Series:
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

    vals = [v for v in col if not _is_null(v)]
    kinds = {kind(v) for v in vals}
    if not kinds:
        return col.map(lambda v: None)
    if kinds == {"int"} and len(vals) == len(col):
        return col.astype("int64")
    if kinds <= {"int", "float"}:
        return col.map(lambda v: math.nan if _is_null(v) else float(v)).astype("float64")
    if kinds == {"bool"}:
        return col.map(lambda v: None if _is_null(v) else bool(v)).astype(object)
    if kinds == {"str"}:
        return col.map(lambda v: None if _is_null(v) else str(v)).astype(object)
    return col.map(lambda v: None if _is_null(v) else str(v)).astype(object)


def _write_parquet(df: pd.DataFrame, path: Path) -> None:


    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


def _roundtrip(df: pd.DataFrame) -> pd.DataFrame:
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


# ----------------------------------------------------------------------------- models
def _model_source(model):
    """``(source for workers, model id)`` of the ``model`` argument."""

    if isinstance(model, LoadedModel):
        return (None if model.model_id == DEFAULT_MODEL_NAME else model.model_id), model.model_id
    if model is None:
        return None, DEFAULT_MODEL_NAME
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model), os.fspath(model)
    if callable(model):
        mid = getattr(model, "model_id", None)
        if not isinstance(mid, str):
            raise ValueError("model: a factory must carry a string attribute model_id (the sweep's model column)")
        return model, mid
    raise ValueError(f"model: must be a LoadedModel, None (the default model), a path or a factory, got {model!r}")


_WORKER_MODEL: dict = {}


def _load(source):
    """Load (once per process) the model a worker runs: ``None``/a path through ``load_model``, or a factory."""

    key = (getattr(source, "__module__", None), getattr(source, "__qualname__", None)) if callable(source) else source
    if key not in _WORKER_MODEL:
        _WORKER_MODEL.clear()  # one model per process
        _WORKER_MODEL[key] = source() if callable(source) else load_model(source, device="auto", progress=False)
    return _WORKER_MODEL[key]


# ----------------------------------------------------------------------------- executors
def _run_local(lm, model_source, todo, items, methods, emit, *, model_id, max_new_tokens, on_error):
    if lm is None:  # loaded for this sweep only (pass a LoadedModel to reuse one)

        lm = model_source() if callable(model_source) else load_model(model_source, device="auto", progress=False)
    for unit in _units(todo, methods):
        rows, error = _run_unit(lm, items[(unit[0].task, unit[0].item_id)], unit, methods[unit[0].method],
                                model_id=model_id, max_new_tokens=max_new_tokens, on_error=on_error)
        for row in rows:
            emit(row)
        if error is not None:
            raise error


def _ray_unit(model_source, item, unit, method, model_id, max_new_tokens, on_error):
    """A Ray task: one unit of cells (:func:`_units`) in a worker that keeps its model between tasks;
    returns ``(rows, error)``."""
    return _run_unit(_load(model_source), item, unit, method, model_id=model_id, max_new_tokens=max_new_tokens,
                     on_error=on_error)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError('executor="ray" needs Ray: pip install "attn-workbench[cluster]" (or pip install "ray>=2.9")') \
            from None
    return ray


RAY_START_ATTEMPTS = 3


def _ray_start(ray, address, kw) -> None:
    """``ray.init``; a new local instance is retried: on a busy machine its raylet can die waiting
    15 s for the dashboard agent to start (ray-project/ray#65983)."""
    for attempt in range(1, RAY_START_ATTEMPTS + 1):
        try:
            ray.init(address=address, **kw)
            return
        except Exception:  # noqa: BLE001 - Ray raises a plain Exception on a startup timeout
            ray.shutdown()
            if address is not None or attempt == RAY_START_ATTEMPTS:
                raise


def _run_ray(model_source, todo, items, methods, emit, *, model_id, max_new_tokens, on_error, ray_address, ray_init):
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        kw = dict(ray_init or {})
        kw.setdefault("runtime_env", {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
        kw.setdefault("include_dashboard", False)
        kw.setdefault("log_to_driver", False)
        _ray_start(ray, ray_address, kw)
        started = True
    pending = {}
    try:
        gpus = ray.cluster_resources().get("GPU", 0)
        # max_calls=0: a worker keeps running cells (and keeps its model) even when it holds a GPU
        remote = ray.remote(num_cpus=1, num_gpus=1 if gpus >= 1 else 0, max_calls=0, max_retries=0)(_ray_unit)
        src_ref = ray.put(model_source)
        item_refs = {}
        for unit in _units(todo, methods):
            k = (unit[0].task, unit[0].item_id)
            if k not in item_refs:
                item_refs[k] = ray.put(items[k])
            ref = remote.remote(src_ref, item_refs[k], unit, methods[unit[0].method], model_id, max_new_tokens,
                                on_error)
            pending[ref] = unit
        while pending:
            done, _ = ray.wait(list(pending), num_returns=min(len(pending), 64), timeout=1.0, fetch_local=True)
            for ref in done:
                pending.pop(ref)
                try:
                    rows, error = ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    cause = e.as_instanceof_cause() if hasattr(e, "as_instanceof_cause") else e
                    raise cause from None
                for row in rows:
                    emit(row)
                if error is not None:
                    raise error
    finally:
        for ref in pending:
            ray.cancel(ref)
        if started:
            ray.shutdown()


def sweep(model, items, methods, *, seeds=(0,), out: str | os.PathLike | None = None, max_new_tokens: int = 16,
          executor: str = "local", reference: bool = True, on_error: str = "raise", progress: bool = True,
          checkpoint_s: float = 10.0, ray_address: str | None = None, ray_init: dict | None = None,
          on_busy: str = "wait", on_row: Callable[[dict], None] | None = None) -> pd.DataFrame:
    """Run a grid of (item, method, parameters, seed) cells and return one tidy DataFrame.

    Args:
        model: a :class:`~workbench.run.models.LoadedModel` (used as is locally; Ray workers load the same
            model id), ``None`` for the default model, a local HF folder, or a picklable factory
            ``() -> LoadedModel`` with a ``model_id`` attribute.
        items: TaskItems (list or ``{task: [items]}``), see :mod:`workbench.study.tasks`.
        methods: ``{name: {param: value or values}}`` or a list of names / ``(name, {param: values})``
            (see :func:`expand_grid`); registered names only (:func:`available_methods`).
        seeds: run seeds (``random``, ``numpy`` and ``torch`` are seeded per cell).
        out: parquet path; existing rows are kept and their cells skipped (resume), rows with an error
            are run again. ``None``: nothing written, nothing resumed.
        max_new_tokens: greedy tokens per run, ``≥ 1``.
        executor: ``"local"`` (this process) or ``"ray"`` (one task per cell on the connected or a new
            local Ray instance; needs the ``[cluster]`` extra).
        reference: add the ``"full"`` cells that ``first_token_agree`` is measured against.
        on_error: ``"raise"`` (stop; finished rows are saved) or ``"record"`` (the row carries ``error``).
        checkpoint_s: seconds between parquet rewrites while running, a finite real ``>= 0`` (``0``: after
            every cell; NaN, infinities and bools are refused).
        on_busy: one writer per ``out``: the sweep holds a lock file beside it (``.<name>.lock``, holding
            its PID) from reading the old rows to the last write. ``"wait"``: a second sweep on the same
            ``out`` waits for the first (and then skips the cells it finished: no row is lost);
            ``"raise"``: it refuses, naming the holder's PID.
        ray_address, ray_init: passed to ``ray.init`` when Ray is not yet initialised (a Ray instance the
            sweep started is shut down at the end).
        on_row: called with each new row as it finishes (after it is checkpointed), e.g. a study-wide
            progress bar.
    Returns:
        every row of ``out`` (or of this run when ``out`` is None), columns :data:`COLUMNS` plus
        ``p_<param>`` columns and method extras, sorted by model, task, item, method, params, seed.
    """
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: must be an integer >= 1, got {max_new_tokens!r}")
    if executor not in ("local", "ray"):
        raise ValueError(f"executor: must be 'local' or 'ray', got {executor!r}")
    if on_error not in ("raise", "record"):
        raise ValueError(f"on_error: must be 'raise' or 'record', got {on_error!r}")
    check_real("checkpoint_s", checkpoint_s, 0.0, rng=">= 0 (seconds; 0 = after every cell)")
    check_choice("on_busy", on_busy, ("wait", "raise"))

    source, model_id = _model_source(model)
    item_list = _flatten_items(items)
    cells = expand_grid(item_list, methods, seeds, reference=reference)
    path = Path(out) if out is not None else None
    if path is None:
        return _sweep(model, source, model_id, item_list, cells, None, max_new_tokens, executor, on_error, progress,
                      checkpoint_s, ray_address, ray_init, on_row)

    def waiting(pid):
        print(f"sweep: {path} is being written by process {pid if pid is not None else '?'}; waiting for it",
              file=sys.stderr, flush=True)

    with file_lock(path.with_name(f".{path.name}.lock"), wait=on_busy == "wait", remove=True, on_wait=waiting,
                   what="out"):
        return _sweep(model, source, model_id, item_list, cells, path, max_new_tokens, executor, on_error, progress,
                      checkpoint_s, ray_address, ray_init, on_row)


def _sweep(model, source, model_id, item_list, cells, path, max_new_tokens, executor, on_error, progress,
           checkpoint_s, ray_address, ray_init, on_row=None) -> pd.DataFrame:
    """The body of :func:`sweep`, under the lock on ``path`` when there is one."""
    by_key = {(it.task, it.item_id): it for it in item_list}
    methods = {c.method: get_method(c.method) for c in cells}
    old = read_sweep(path) if path is not None and path.exists() else pd.DataFrame(columns=list(COLUMNS))
    ok = old["error"].map(_is_null).astype(bool) if len(old) else pd.Series([], dtype=bool)
    done = set(old.loc[ok, "cell"]) if len(old) else set()  # rows with an error are run again
    todo = [c for c in cells if c.key(model_id, max_new_tokens) not in done]
    rows: list[dict] = []
    last = [time.monotonic()]

    def save():
        if path is not None and rows:
            new = pd.DataFrame(rows)
            kept = old[~old["cell"].isin(set(new["cell"]))] if len(old) else old  # a new row replaces a failed one
            frames = [f for f in (kept, new) if len(f)]
            _write_parquet(_tidy(pd.concat(frames, ignore_index=True)), path)
            last[0] = time.monotonic()

    bar = tqdm(total=len(cells), initial=len(cells) - len(todo), desc="sweep", unit="run", disable=not progress)

    def emit(row):
        rows.append(row)
        bar.update(1)
        if time.monotonic() - last[0] >= checkpoint_s:
            save()
        if on_row is not None:
            on_row(row)

    try:
        if todo:
            kw = dict(model_id=model_id, max_new_tokens=max_new_tokens, on_error=on_error)
            if executor == "local":
                _run_local(model if isinstance(model, LoadedModel) else None, source, todo, by_key, methods, emit, **kw)
            else:
                _run_ray(source, todo, by_key, methods, emit, ray_address=ray_address, ray_init=ray_init, **kw)
    finally:
        bar.close()
        save()
    if path is not None:
        return read_sweep(path) if path.exists() else _roundtrip(_tidy(old))
    return _roundtrip(_tidy(pd.DataFrame(rows)))
