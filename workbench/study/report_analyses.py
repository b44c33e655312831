"""The report's per-prompt analyses on whatever prompts it runs (SQuAD, needles, RULER-style, ``--items``): the
leap and the priorities (one capture per prompt, :mod:`workbench.study.leap`), the gold answer's tokens each
eviction keeps (:mod:`workbench.study.answer_kept`) and the cap check (:mod:`workbench.study.cap_check`), each on up
to ``leap_prompts`` / ``kept_prompts`` prompts of every task (0: skipped), each task on its own (tasks are not
pooled). Their tables go into the report folder; their paired findings onto the page."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from workbench.analyse.shift import HELD_OUT_AFTER, HELD_OUT_GAP
from workbench.study.answer_kept import KEPT_COLUMNS, KEPT_PAIRS, answer_kept, kept_findings, kept_table
from workbench.study.cap_check import cap_check
from workbench.study.leap import LEAP_COLUMNS, prompt_analyses
from workbench.study.priority_study import priority_findings, priority_table

__all__ = ["per_task", "prompt_analyses_part"]


def per_task(items, n: int) -> dict[str, list]:
    """The first ``n`` items of every task, in the order given."""
    out: dict[str, list] = {}
    for it in items:
        got = out.setdefault(it.task, [])
        if len(got) < n:
            got.append(it)
    return out


def _findings(lines: list[str], task: str) -> list[str]:
    """The ``- …`` finding sentences of a findings list (its markdown table left out), labelled with the task."""
    return [f"{task}: {s[2:]}" for s in lines if s.startswith("- ")]


def prompt_analyses_part(cfg, lm, items, df: pd.DataFrame, folder: Path) -> tuple[dict, dict, dict, list[str]]:
    """Run the analyses ``cfg`` asks for (``leap_prompts``, ``kept_prompts``, ``cap_tokens``) on ``items``.

    Returns ``(tables, notes, frames, findings)``: the report's tables and their notes, ``frames`` the per-prompt
    tables :func:`workbench.study.conclusions.conclusions` reads (``leap``, ``ranks``, ``kept``; absent when
    skipped) and one finding sentence per paired comparison. ``folder``: where the cap check keeps its resumable
    parquet."""
    tables: dict[str, pd.DataFrame] = {}
    notes: dict[str, str] = {}
    frames: dict[str, pd.DataFrame] = {}
    found: list[str] = []
    if cfg.leap_prompts:
        steps, leap, ranks, standing = [], [], [], []
        for task, its in per_task(items, cfg.leap_prompts).items():
            st, lp, rk, lr = prompt_analyses(lm, its, len(its), progress=cfg.progress)
            leap.append(lr)
            if st is not None:
                steps.append(st.assign(task=task))
                found.append(f"{task}: leap: " + lp.finding("0→1", "−1→0", "recall gain"))
            if len(rk):
                ranks.append(rk)
                standing.append(priority_table(rk).assign(task=task))
                found += _findings(priority_findings(rk), task)
        frames["leap"] = tables["leap"] = pd.concat(leap, ignore_index=True) if leap else pd.DataFrame(
            columns=LEAP_COLUMNS)
        frames["ranks"] = tables["ranks"] = pd.concat(ranks, ignore_index=True) if ranks else pd.DataFrame(
            columns=["task", "item_id", "meta_cluster", "priority", "k", "rank"])
        tables["leap_steps"] = pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(
            columns=["step", "r_from", "r_to", "n", "mean", "lo", "hi", "median", "larger_than_boundary", "task"])
        tables["priority_standing"] = pd.concat(standing, ignore_index=True) if standing else pd.DataFrame(
            columns=["priority", "n", "standing", "top", "task"])
        ref = HELD_OUT_AFTER + HELD_OUT_GAP + 1
        notes["leap"] = (f"Leap analysis on up to {cfg.leap_prompts} prompts per task, one capture each: per prompt, "
                         "every adjacent step's recall gain (mean over layers and KV groups) against the held-out "
                         f"reference of decode rows {ref} and later, behind a gap of {HELD_OUT_GAP} rows, so no "
                         "compared step touches or abuts it. A prompt whose reply stops before the reference is "
                         f"left out: {len(tables['leap'].drop_duplicates(['task', 'item_id']))} prompts kept.")
        notes["leap_steps"] = "Per task and step: the mean recall gain over prompts with its 95% bootstrap CI."
        notes["ranks"] = ("Per prompt and chunk priority: the answer chunk's rank at the paper preset (1 = removed "
                          "last; mean over the layers where it is defined).")
        notes["priority_standing"] = ("Per task and priority: the answer chunk's standing k + 1 − rank (k: removed "
                                      "last) and `top`, the share of prompts where it ranks first at every layer.")
    if cfg.kept_prompts:
        kept = [answer_kept(lm, its, len(its), fracs=cfg.budget_fracs, progress=cfg.progress)
                for its in per_task(items, cfg.kept_prompts).values()]
        k = pd.concat([x for x in kept if len(x)], ignore_index=True) if any(len(x) for x in kept) else pd.DataFrame(
            columns=KEPT_COLUMNS)
        frames["kept"] = tables["kept"] = k
        tables["kept_summary"] = pd.concat([kept_table(g).assign(task=t) for t, g in k.groupby("task")],
                                           ignore_index=True) if len(k) else pd.DataFrame(
            columns=["policy", "budget_frac", "n", "kept", "task"])
        for task, g in k.groupby("task"):
            found += _findings(kept_findings(g), task)
        pairs = ", ".join(f"{a} vs {b}" for a, b in KEPT_PAIRS)
        notes["kept"] = (f"The share of the gold answer's tokens each eviction keeps ({pairs}, at budget fractions "
                         f"{list(cfg.budget_fracs)}; mean over compacted layers and KV heads), on up to "
                         f"{cfg.kept_prompts} prompts per task whose gold passage holds a gold answer.")
    if cfg.cap_tokens:
        path = folder / f"cap{cfg.cap_tokens}.parquet"
        for task, its in per_task(items, len(items)).items():
            found += [f"{task}: {s[2:]}" for s in cap_check(lm, its, df, path, cfg.cap_tokens)]
        tables["cap"] = pd.read_parquet(path) if path.exists() else pd.DataFrame()
        notes["cap"] = (f"Full context again with {cfg.cap_tokens} new tokens on every prompt, paired against the "
                        "sweep's full-context cells (greedy: the longer reply starts with the shorter one).")
    return tables, notes, frames, found
