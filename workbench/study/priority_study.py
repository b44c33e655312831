"""The answer chunk's standing under each chunk priority (claim 3: Rényi against mass-only, ζ = 1, the per-head max
and uniform), from one capture per prompt: the per-prompt rank, the standing table and the paired findings."""
from __future__ import annotations

import pandas as pd
import torch

from workbench.analyse.stats import paired
from workbench.study.markdown_table import markdown

__all__ = ["PRIORITY_VARIANTS", "answer_rank", "priority_table", "priority_findings"]

# the priorities of claim 3 (Rényi vs mass-only vs ζ = 1, and the plain per-head max), at the paper preset otherwise
PRIORITY_VARIANTS = {"renyi": {}, "mass": {"priority": "mass"}, "renyi, zeta=1": {"zeta": 1.0},
                     "headmax": {"priority": "headmax"}, "uniform": {"priority": "uniform"}}


def answer_rank(S: torch.Tensor, answer: int) -> float:
    """Mean over the layers where ``S [L, k]`` is defined of the answer chunk's rank, 1 = the highest priority
    (removed last), ties at their mid-rank."""
    ok = ~torch.isnan(S).any(-1)
    if not ok.any():
        return float("nan")
    S = S[ok]
    s_a = S[:, answer:answer + 1]
    return float((1 + (S > s_a).sum(-1) + 0.5 * ((S == s_a).sum(-1) - 1)).double().mean())


def _standing(ranks: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Per prompt (rows) and priority (columns): standing ``k + 1 − rank``; prompts missing a priority dropped."""
    k = int(ranks["k"].iloc[0])
    return (k + 1 - ranks.pivot(index="item_id", columns="priority", values="rank")).dropna(), k


def priority_table(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per priority: ``n`` prompts, mean ``standing`` (``k + 1 − rank``: ``k`` = removed last, 1 = removed first) and
    ``top`` (share of prompts where the answer chunk ranks first at every layer). ``ranks``: one task's rows
    ``item_id, priority, k, rank``."""
    if ranks.empty:
        return pd.DataFrame(columns=["priority", "n", "standing", "top"])
    wide, k = _standing(ranks)
    return pd.DataFrame([dict(priority=c, n=len(wide), standing=wide[c].mean(), top=float((wide[c] >= k).mean()))
                         for c in PRIORITY_VARIANTS if c in wide], columns=["priority", "n", "standing", "top"])


def priority_findings(ranks: pd.DataFrame) -> list[str]:
    """The standing table (markdown) and one paired finding per priority against Rényi, a win being a prompt where
    the priority keeps the answer chunk longer than Rényi does. ``ranks``: one task's rows."""
    if ranks.empty:
        return []
    wide, k = _standing(ranks)
    metric = f"answer-chunk standing k + 1 − rank, k = {k}, mean over layers; higher = kept longer"
    out = [markdown(priority_table(ranks))]
    for c in PRIORITY_VARIANTS:
        if c != "renyi" and c in wide:
            out.append("- " + paired(wide[c].to_numpy(), wide["renyi"].to_numpy()).finding(c, "renyi", metric))
    return out
