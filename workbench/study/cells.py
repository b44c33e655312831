"""One call of a method → rows of the sweep frame: :func:`run_cell` (one cell) and :func:`run_cells` (the
cells of one item under a ``per_item`` method, in one call), with the cell's timing, memory and scores."""
from __future__ import annotations

import math
import random
import resource
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

import workbench.study.metrics as metrics
from workbench.run.generate import decode_answer, stop_token_ids
from workbench.study.grid import SCALAR, Cell
from workbench.study.registry import Method, get_method
from workbench.study.storage import COLUMNS, METHOD_KEYS
from workbench.study.tasks import TaskItem

__all__ = ["run_cell", "run_cells", "run_unit", "units", "seed_everything"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass


def peak_rss_bytes() -> float:
    try:

        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return float(r if sys.platform == "darwin" else r * 1024)
    except (ImportError, OSError):  # pragma: no cover
        return math.nan


def method_row(out, cell: Cell) -> dict:
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
            if not isinstance(v, SCALAR):
                raise ValueError(f"method: {cell.method!r} returned {k}={v!r}; extra values must be scalars")
            row[k] = v
    return row


def start_row(lm, item: TaskItem, cell: Cell, model_id: str, max_new_tokens: int) -> dict:
    return {"model": model_id, "task": cell.task, "item_id": cell.item_id, "method": cell.method,
            "params": cell.params_json, **{f"p_{k}": v for k, v in cell.params}, "seed": cell.seed,
            "max_new_tokens": max_new_tokens, "device": str(lm.device), "dtype": str(lm.dtype).replace("torch.", ""),
            "error": None, "cell": cell.key(model_id, max_new_tokens), "gold": item.answers[0],
            "n_docs": len(item.documents), "answer_doc": item.answer_doc,
            **{f"meta_{k}": v for k, v in item.meta.items() if isinstance(v, (int, float, str, bool))}}


def finish_row(lm, item: TaskItem, row: dict, out: dict, max_new_tokens: int) -> dict:
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


class Meter:
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
                "peak_rss_bytes": peak_rss_bytes()}


def error_row(e: BaseException) -> dict:
    return {"generated_ids": [], "error": f"{type(e).__name__}: {e}"}


def run_cell(lm, item: TaskItem, cell: Cell, *, model_id: str, max_new_tokens: int, fn: Callable | None = None,
             on_error: str = "raise") -> dict:
    """Run one cell and return its row (scores included; ``first_token_agree`` is left to the sweep)."""
    fn = fn or get_method(cell.method).fn
    row = start_row(lm, item, cell, model_id, max_new_tokens)
    params = dict(cell.params, max_new_tokens=max_new_tokens, seed=cell.seed)
    meter = Meter(lm)
    try:
        seed_everything(cell.seed)  # inside the try: on_error="record" records a seeding error too
        out = method_row(fn(lm, item, params), cell)
    except Exception as e:  # noqa: BLE001 - recorded or re-raised
        if on_error == "raise":
            raise
        out = error_row(e)
    row.update(meter.stop())
    return finish_row(lm, item, row, out, max_new_tokens)


def group_rows(lm, item: TaskItem, cells: Sequence[Cell], *, model_id: str, max_new_tokens: int,
                fn: Callable, on_error: str) -> tuple[list[dict], Exception | None]:
    """The rows of one per-item call, and (``on_error="raise"``) the first cell's error, if any: the rows of
    the cells that succeeded are returned beside it, so that a failing cell loses none of them."""
    rows = [start_row(lm, item, c, model_id, max_new_tokens) for c in cells]
    meter = Meter(lm)
    try:
        seed_everything(cells[0].seed)  # per-item methods take each cell's seed from its params
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
            out = method_row(out, cell)
        except Exception as e:  # noqa: BLE001 - recorded or re-raised
            if on_error == "raise":
                first_error = first_error or e
                continue
            out = error_row(e)
        # the call's wall time is charged to the group's first cell (it ran the steps the cells share); each
        # cell's own work is the method's ``method_s``
        row.update(measured, wall_s=measured["wall_s"] if i == 0 else 0.0)
        done.append(finish_row(lm, item, row, out, max_new_tokens))
    return done, first_error


def run_cells(lm, item: TaskItem, cells: Sequence[Cell], *, model_id: str, max_new_tokens: int,
              fn: Callable | None = None, on_error: str = "raise") -> list[dict]:
    """Run the cells of one item under a per-item method (``register_method(per_item=True)``) in one call and
    return their rows in order. ``wall_s``: the call's time, charged to the first cell (0 for the others);
    ``peak_*_bytes``: the call's. With ``on_error="raise"`` the first cell error is raised."""
    cells = list(cells)
    if not cells or any((c.task, c.item_id) != (item.task, item.item_id) for c in cells):
        raise ValueError(f"cells: must be a non-empty list of cells of item {item.task}/{item.item_id}")
    rows, error = group_rows(lm, item, cells, model_id=model_id, max_new_tokens=max_new_tokens,
                              fn=fn or get_method(cells[0].method).fn, on_error=on_error)
    if error is not None:
        raise error
    return rows


def units(todo: Sequence[Cell], methods: Mapping[str, Method]) -> list[list[Cell]]:
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


def run_unit(lm, item: TaskItem, unit: list[Cell], method: Method, *, model_id, max_new_tokens, on_error):
    """``(rows, error)`` of one unit of :func:`units`."""
    if not method.per_item:
        return [run_cell(lm, item, unit[0], model_id=model_id, max_new_tokens=max_new_tokens, fn=method.fn,
                         on_error=on_error)], None
    return group_rows(lm, item, unit, model_id=model_id, max_new_tokens=max_new_tokens, fn=method.fn,
                       on_error=on_error)
