"""The leap and priority captures of a study: one capture per prompt (observers, a prompt tail of 8, 12 decode
rows), from which every adjacent step's recall gain against the **held-out reference behind a gap**
(:mod:`workbench.analyse.shift`: decode rows ``HELD_OUT_AFTER + HELD_OUT_GAP + 1 …``, so no compared step touches
or abuts it) and the answer chunk's rank under each priority of
:data:`workbench.study.priority_study.PRIORITY_VARIANTS`."""
from __future__ import annotations

import pandas as pd
from tqdm.auto import tqdm

from workbench.analyse.params import EntroPrefillParams
from workbench.analyse.procedure import trace
from workbench.analyse.shift import HELD_OUT_AFTER, HELD_OUT_GAP, ShiftAnalysis, leap_specificity, step_gains
from workbench.capture import RowSet, run_capture
from workbench.study.priority_study import PRIORITY_VARIANTS, answer_rank

__all__ = ["LEAP_COLUMNS", "leap_rows", "prompt_analyses"]

LEAP_COLUMNS = ["task", "item_id", "meta_cluster", "r_from", "r_to", "gain"]
SHIFT_CHUNKS = 32  # chunks of the recall measure
CAPTURE_TAIL = 8
CAPTURE_DECODE = 12  # enough decode rows for the compared steps, the gap and a reference of several rows


def leap_rows(results, items) -> pd.DataFrame:
    """The per-prompt step gains behind ``step_gains`` / ``leap_specificity``: one row per (prompt, adjacent step the
    reference cannot favour, ``clear`` in ``ShiftResult.step_frame``), ``task, item_id, meta_cluster, r_from, r_to,
    gain`` (the prompt's mean gain over layers and KV groups, exactly what those two functions average),
    ``items[i]`` being the prompt of ``results[i]``."""
    rows = []
    for it, res in zip(items, results):
        sf = res.step_frame()
        g = sf[(sf.level == "group") & sf.clear].groupby(["r_from", "r_to"])["gain"].mean()
        rows += [dict(task=it.task, item_id=it.item_id, meta_cluster=it.meta.get("cluster"), r_from=int(a),
                      r_to=int(b), gain=float(v)) for (a, b), v in g.items()]
    return pd.DataFrame(rows, columns=LEAP_COLUMNS)


def prompt_analyses(lm, items, n: int, *, progress: bool = True):
    """On the first ``n`` of ``items``, one capture each: the step gains and the answer chunk's ranks.

    Returns ``(step gains, leap Paired, rank frame, per-prompt step gains)``; the first two are None when no
    prompt has enough decode rows for the held-out reference (a reply that stops early), the last then empty.
    Ranks need the answer's passage among the prompt's chunks (``spans.answer_doc in spans.chunk_doc``)."""
    res, ranks, used = [], [], []
    for it in tqdm(items[:n], desc="leap and priority captures", unit="prompt", disable=not progress):
        prompt = it.build(lm.tokenizer, max_context=lm.shape.max_context)
        cap = run_capture(lm, prompt, RowSet(tail=CAPTURE_TAIL, n_decode=CAPTURE_DECODE), progress=False)
        if len(cap.rows_of("decode")) > HELD_OUT_AFTER + HELD_OUT_GAP:  # a held-out reference behind the gap
            res.append(ShiftAnalysis(k=SHIFT_CHUNKS)(cap))
            used.append(it)
        spans = prompt.spans
        if spans.answer_doc in spans.chunk_doc:
            answer = spans.chunk_doc.index(spans.answer_doc)
            for name, kw in PRIORITY_VARIANTS.items():
                tr = trace(cap, EntroPrefillParams(**kw), certify=False)
                ranks.append(dict(task=it.task, item_id=it.item_id, meta_cluster=it.meta.get("cluster"), priority=name,
                                  k=spans.k, rank=answer_rank(tr.priority_used, answer)))
        del cap
    if not res:
        return None, None, pd.DataFrame(ranks), leap_rows([], [])
    return step_gains(res), leap_specificity(res), pd.DataFrame(ranks), leap_rows(res, used)
