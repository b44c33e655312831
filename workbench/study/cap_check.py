"""Did the study's cap on new tokens cut answers off? Full context again with a longer cap, paired against the
study's own full-context cells."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from workbench.analyse.stats import paired
from workbench.study.sweep import sweep

__all__ = ["cap_check"]


def cap_check(lm, items, df: pd.DataFrame, out: Path, cap: int) -> list[str]:
    """Full context again on ``items`` with ``cap`` new tokens (resumable parquet ``out``), against the study's
    own full-context cells: how many right answers the study's cap cut off. Greedy decoding makes the first
    tokens of the longer reply those of the shorter one, so a win is an answer that came after the study's cap.
    """
    if not items:
        return []
    long = sweep(lm, items, [("full", {})], out=out, max_new_tokens=cap, reference=False, on_error="record",
                 checkpoint_s=30, progress=True)
    short = df[(df.method == "full") & df.item_id.isin({it.item_id for it in items})]
    both = short.merge(long, on=["task", "item_id"], suffixes=("_s", "_l"))
    if both.empty:
        return []
    cap_s = int(both.max_new_tokens_s.iloc[0])
    p = paired(both.contains_l.astype(float).to_numpy(), both.contains_s.astype(float).to_numpy())
    return [f"- Full context hit the cap of {cap_s} tokens on {int(both.hit_cap_s.sum())} of {len(both)} prompts; "
            f"with {cap} it hits it on {int(both.hit_cap_l.sum())}.",
            "- " + p.finding(f"full, {cap} tokens", f"full, {cap_s} tokens", "contains", both.task.iloc[0])]
