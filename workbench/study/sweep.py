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
then method extras and ``meta_<key>`` (the item's provenance: length, depth, qid ...). The built-in methods add the
protocol figures: ``query`` (``aware``/``agnostic``), ``compression_ratio`` (achieved, kvpress's: share of the compressed
positions removed), ``kv_frac`` (KV bytes kept / the full cache's; NaN for pruned prefill) and ``ttft_s`` (time to the
first generated token; see :func:`workbench.study.methods.evict_cells` for what it spans).
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import pandas as pd
from tqdm.auto import tqdm

from workbench.checks import check_args
from workbench.constraints import checks_for
from workbench.run.models import LoadedModel
from workbench.study.cells import run_cell, run_cells
from workbench.study.executors import model_source, run_local, run_ray
from workbench.study.grid import Cell, expand_grid, flatten_items, grid_frame
from workbench.study.registry import Method, available_methods, get_method, register_method, unregister_method
from workbench.study.storage import (
    COLUMNS,
    MEASURED,
    check_out,
    comparable,
    is_null,
    read_resumable,
    read_sweep,
    roundtrip,
    tidy,
    write_parquet,
)
from workbench.util import file_lock

__all__ = ["Method", "register_method", "unregister_method", "get_method", "available_methods", "Cell",
           "expand_grid", "grid_frame", "run_cell", "run_cells", "sweep", "read_sweep", "comparable", "COLUMNS",
           "MEASURED"]


SWEEP_CHECKS = checks_for("max_new_tokens", "executor", "on_error", "checkpoint_s", "on_busy", prefix="sweep")
"""The constraint of each scalar or choice argument of :func:`sweep` (``workbench.constraints.PARAMS``)."""


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
        out: a ``.parquet`` path; existing rows are kept and their cells skipped (resume), rows with an error
            are run again. ``None``: nothing written, nothing resumed. A directory, another kind of file or a
            place this process cannot write in is refused before any cell runs; a damaged file (one that does
            not read as parquet) is moved aside to ``<name>.damaged-<UTC time>`` with a warning and its cells
            run again; a parquet file that is not a sweep frame is refused, untouched.
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
    check_args(SWEEP_CHECKS, locals())

    source, model_id = model_source(model)
    item_list = flatten_items(items)
    cells = expand_grid(item_list, methods, seeds, reference=reference)
    path = check_out(out) if out is not None else None  # refused before any cell runs
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
    old = read_resumable(path) if path is not None else pd.DataFrame(columns=list(COLUMNS))
    ok = old["error"].map(is_null).astype(bool) if len(old) else pd.Series([], dtype=bool)
    done = set(old.loc[ok, "cell"]) if len(old) else set()  # rows with an error are run again
    todo = [c for c in cells if c.key(model_id, max_new_tokens) not in done]
    rows: list[dict] = []
    last = [time.monotonic()]

    def save():
        if path is not None and rows:
            new = pd.DataFrame(rows)
            kept = old[~old["cell"].isin(set(new["cell"]))] if len(old) else old  # a new row replaces a failed one
            frames = [f for f in (kept, new) if len(f)]
            write_parquet(tidy(pd.concat(frames, ignore_index=True)), path)
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
                run_local(model if isinstance(model, LoadedModel) else None, source, todo, by_key, methods, emit, **kw)
            else:
                run_ray(source, todo, by_key, methods, emit, ray_address=ray_address, ray_init=ray_init, **kw)
    finally:
        bar.close()
        save()
    if path is not None:
        return read_sweep(path) if path.exists() else roundtrip(tidy(old))
    return roundtrip(tidy(pd.DataFrame(rows)))
