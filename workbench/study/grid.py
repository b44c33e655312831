"""The sweep's grid: every item × every method setting × every seed, as :class:`Cell` s (the resume key of a
row is its cell's :meth:`Cell.key`)."""
from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from workbench.checks import check_nonempty, is_int
from workbench.constraints import PARAMS
from workbench.study.registry import check_param_name, get_method
from workbench.study.tasks import TaskItem

__all__ = ["Cell", "SCALAR", "expand_grid", "grid_frame", "method_settings", "flatten_items", "check_seeds",
           "check_scalar"]

SCALAR = (int, float, str, bool, type(None))


def check_scalar(name, v):
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # numpy / torch scalars
        v = v.item()
    if not isinstance(v, SCALAR) or (isinstance(v, float) and math.isnan(v)):
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


def method_settings(methods) -> list[tuple[str, dict]]:
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
            check_param_name(p)
            if meth.params is not None and p not in meth.params:
                raise ValueError(f"params: {name!r} accepts {list(meth.params)}, got {p!r}")
        values = []
        for p in names:
            v = grid[p]
            vs = list(v) if isinstance(v, (list, tuple, range)) or (hasattr(v, "__len__") and not isinstance(v, str)) else [v]
            if not vs:
                check_nonempty(f"{name}.{p}", vs)  # an empty list of policies, budgets ...: the one refusal
            values.append([check_scalar(f"{name}.{p}", x) for x in vs])
        for combo in itertools.product(*values):
            out.append((name, dict(zip(names, combo))))
    return out


def flatten_items(items) -> list[TaskItem]:
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


def check_seeds(seeds) -> list[int]:
    seeds = PARAMS["seeds"].check("seeds", list(seeds) if isinstance(seeds, Iterator) else seeds)
    seeds = [seeds] if is_int(seeds) else list(seeds)
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
    items = flatten_items(items)
    settings = method_settings(methods)
    seeds = check_seeds(seeds)
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
