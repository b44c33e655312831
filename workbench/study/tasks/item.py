"""Task items in bulk: a frame of items and the seeded generator of a family (the item itself is
:class:`workbench.run.task_item.TaskItem`)."""
from __future__ import annotations

import random
from collections.abc import Sequence

import pandas as pd

from workbench.run.task_item import TaskItem, with_content_id

__all__ = ["TaskItem", "items_frame", "with_content_id", "seeded_rng"]


def items_frame(items: Sequence[TaskItem]) -> pd.DataFrame:
    """One row per item: id, sizes, answer position, question, first gold answer, scalar meta."""
    return pd.DataFrame([it.summary() for it in items])


def seeded_rng(*parts) -> random.Random:
    return random.Random("/".join(str(p) for p in parts))
