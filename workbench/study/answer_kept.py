"""How much of the gold answer each eviction keeps (claim 1's second half: DeferKV keeps more of the answer's
tokens than SnapKV): the per-prompt share kept, its table and the paired findings."""
from __future__ import annotations

import warnings

import pandas as pd
from tqdm.auto import tqdm

from workbench.analyse.stats import paired
from workbench.rerun.eviction import EvictionSession, Needs, policy_from_params, resolve_budget, token_positions
from workbench.study.markdown_table import markdown

__all__ = ["KEPT_PAIRS", "KEPT_FRACS", "answer_kept", "kept_table", "kept_findings"]

KEPT_PAIRS = (("deferkv", "snapkv"),)  # claim 1's second half: DeferKV keeps more of the answer's tokens
KEPT_FRACS = (0.25, 0.5)               # the study's two budgets
KEPT_COLUMNS = ["task", "item_id", "policy", "budget_frac", "budget", "T", "answer_tokens", "kept"]


def answer_kept(lm, items, n: int, pairs=KEPT_PAIRS, fracs=KEPT_FRACS, *, progress: bool = True) -> pd.DataFrame:
    """On the first ``n`` of ``items``: the share of the gold answer's tokens (its occurrence in the gold passage)
    that each policy of ``pairs`` keeps at each budget fraction, mean over compacted layers and KV heads: exactly
    the sweep's ``evict`` cells' eviction (same policies and budgets; DeferKV after its first decode step), from
    one shared prefill per prompt and two decode steps. One row per (prompt, policy, budget_frac); a prompt whose
    gold passage holds no gold answer is left out with a warning naming it."""
    names = sorted({p for pair in pairs for p in pair})
    pols = {p: policy_from_params(p, seed=0) for p in names}
    need = Needs.of(pols.values())
    rows, skipped = [], []
    for it in tqdm(items[:n], desc="answer tokens kept", unit="prompt", disable=not progress):
        gold = it.documents[it.answer_doc]
        text = next((a for a in it.answers if a in gold), None)
        if text is None:
            skipped.append(it.item_id)
            continue
        prompt = it.build(lm.tokenizer, max_context=lm.shape.max_context)
        pos = token_positions(prompt, lm.tokenizer, text, within=gold)
        sess = EvictionSession.prepare(lm, prompt, need, 2, reusable=True, progress=False)
        plan = [(p, f, resolve_budget(prompt.T, budget_frac=f)) for f in fracs for p in names]
        for (p, f, B), r in zip(plan, sess.run_batch([(pols[p], B) for p, f, B in plan])):
            rows.append(dict(task=it.task, item_id=it.item_id, policy=p, budget_frac=f, budget=B, T=prompt.T,
                             answer_tokens=len(pos), kept=float(r.survival(pos).nanmean())))
        del sess
    if skipped:
        warnings.warn(f"answer_kept: {len(skipped)} of {min(n, len(items))} prompts left out, no gold answer in "
                      f"their gold passage: {skipped}", stacklevel=2)
    return pd.DataFrame(rows, columns=KEPT_COLUMNS)


def kept_table(kept: pd.DataFrame) -> pd.DataFrame:
    """The mean share kept per policy and budget fraction, with its ``n`` prompts."""
    return (kept.groupby(["policy", "budget_frac"]).agg(n=("kept", "size"), kept=("kept", "mean")).reset_index())


def kept_findings(kept: pd.DataFrame, pairs=KEPT_PAIRS) -> list[str]:
    """:func:`kept_table` (markdown) and one paired finding per pair and budget (one task's rows)."""
    if kept.empty:
        return []
    out = [markdown(kept_table(kept))]
    metric = "share of the gold answer's tokens kept, mean over compacted layers and KV heads"
    for f, d in kept.groupby("budget_frac"):
        wide = d.pivot(index="item_id", columns="policy", values="kept").dropna()
        for a, b in pairs:
            if a in wide and b in wide:
                out.append("- " + paired(wide[a].to_numpy(), wide[b].to_numpy()).finding(
                    f"{a} @ {f:g}", f"{b} @ {f:g}", metric))
    return out
