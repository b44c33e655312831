"""What a sweep shows: paired comparisons, the reference check and honest timing, as tables and sentences.

Every comparison pairs two settings on the same prompts (rows without an error at both; the ``"full"``
setting is the reference) and goes through :func:`workbench.analyse.stats.paired`: wins / ties /
losses, McNemar's exact test on 0/1 scores, a bootstrap CI of the mean paired difference, Wilson
CIs of the accuracies, and one sentence generated from those numbers ("no detectable difference"
when the interval covers 0). Comparisons are made per task; a pooled line is added, and says that
it pools, when there are several tasks.

* :func:`reference_check` — the full-context accuracy per task with its Wilson CI, and a loud warning
  when it is too low for comparisons against it to mean anything.
* :func:`comparisons` — every setting against full context (and DeferKV against each other policy at
  the same budget), plus the accuracy *conditional on the reference being right* (how many of the
  reference's right answers a setting keeps).
* :func:`timing_table` — the timing rule: a shared step (the eviction prefill that every policy of a
  prompt evicts from) is its own row, and each setting's ``amortised_s`` = its own ``method_s`` + the
  shared step divided by the number of cells that share it.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from workbench.analyse.stats import accuracy, paired

__all__ = ["setting_label", "with_settings", "clusters", "cluster_paired", "reference_check", "comparisons", "accuracy_table", "failed_rows", "timing_table",
           "REFERENCE", "AGNOSTIC", "PROTOCOL", "protocol_figures", "pair_query",
           "MIN_REFERENCE_ACCURACY", "MIN_REFERENCE_RIGHT"]

REFERENCE = "full"
AGNOSTIC = "agnostic"
MIN_REFERENCE_ACCURACY = 0.5   # below this the reference is too weak to compare against
MIN_REFERENCE_RIGHT = 5        # fewer right reference answers than this: conditional accuracies are anecdotes


def row_params(row) -> dict:
    """A sweep row's method parameters (its ``params`` JSON; ``{}`` when absent or unreadable)."""
    try:
        return json.loads(row["params"]) if isinstance(row["params"], str) else {}
    except json.JSONDecodeError:
        return {}


def evict_label(p: dict) -> str:
    """``<policy> @ <budget>`` of an eviction cell's parameters (the policy alone without a budget): the budget as a
    fraction kept (``0.5``), positions, a compression ratio (``r=0.75``) or a ladder rung (``kv=0.25``), with
    `` (agnostic)`` for a query-agnostic cell."""
    b = p.get("budget_frac", p.get("budget"))
    if p.get("compression_ratio") is not None:
        b = f"r={p['compression_ratio']:g}"
    elif p.get("kv_frac") is not None:
        b = f"kv={p['kv_frac']:g}"
    label = f"{p.get('policy', 'full')} @ {b}" if b is not None else str(p.get("policy", "full"))
    return label + (f" ({AGNOSTIC})" if p.get("query") == AGNOSTIC else "")


def setting_label(row) -> str:
    """``full``, ``entroprefill`` (``, k=v`` for non-default parameters) or ``<policy> @ <budget>``."""
    p = row_params(row)
    if row["method"] == "evict":
        return evict_label(p)
    extra = ", ".join(f"{k}={v}" for k, v in sorted(p.items()))
    return f"{row['method']} ({extra})" if extra else str(row["method"])


def with_settings(df: pd.DataFrame) -> pd.DataFrame:
    """The sweep rows without an error, with a ``setting`` column (an empty frame with the key columns when
    nothing finished)."""
    if len(df) == 0:
        cols = list(dict.fromkeys([*df.columns, "task", "item_id", "method", "params", "error", "setting"]))
        return pd.DataFrame(columns=cols)
    ok = df["error"].map(lambda e: not (isinstance(e, str) and e)) if "error" in df.columns else True
    d = df[ok].copy()
    d["setting"] = [setting_label({"method": m, "params": p}) for m, p in zip(d["method"], d["params"])] if len(d) else []
    return d


PROTOCOL = ("query", "compression_ratio", "kv_frac", "kv_bytes", "peak_cuda_bytes", "peak_rss_bytes", "ttft_s")
"""The columns every table of settings carries: the query mode, the achieved compression ratio (kvpress's: share of
the compressed prompt's positions removed), ``kv_frac`` (KV bytes kept / the full cache's), KV bytes, peak memory
(CUDA: per cell; RSS: the process's high-water mark so far) and time to first token (each a mean over the rows)."""


def pair_query(comparison: str) -> str:
    """The query mode of a comparison ``"<A> vs <B>"`` of setting labels: ``aware``, ``agnostic`` or
    ``"aware vs agnostic"`` (a label ending `` (agnostic)`` is a query-agnostic setting)."""
    modes = [AGNOSTIC if s.endswith(f" ({AGNOSTIC})") else "aware" for s in comparison.split(" vs ")]
    return modes[0] if len(set(modes)) == 1 else " vs ".join(modes)


def protocol_figures(g: pd.DataFrame) -> dict:
    """:data:`PROTOCOL` of a group of sweep rows: its query mode (``"aware"``, ``"agnostic"``, ``"mixed"``, or None
    when no row says) and the mean of each figure (NaN where no row measured it: ``kv_frac`` of a pruned prefill,
    ``ttft_s`` of a method that does not report it)."""
    modes = sorted(set(g["query"].dropna().astype(str))) if "query" in g.columns else []
    out: dict = {"query": modes[0] if len(modes) == 1 else ("mixed" if modes else None)}
    for c in PROTOCOL[1:]:
        out[c] = float(pd.to_numeric(g[c], errors="coerce").mean()) if c in g.columns and len(g) else math.nan
    return out


def clusters(d: pd.DataFrame) -> pd.Series:
    """Each row's independent unit: its item's ``cluster`` (``meta_cluster``: prompts that share a fact or a haystack
    share it), else the item itself."""
    own = d["item_id"].astype(str)
    if "meta_cluster" not in d.columns:
        return own
    c = d["meta_cluster"]
    return c.where(c.notna() & (c.astype(str) != ""), own).astype(str)


def cluster_paired(a, b, cluster, level: float = 0.95, margin: float | None = None):
    """The paired comparison of per-prompt scores ``a`` and ``b`` over independent units: prompts of one ``cluster``
    are one unit, scored by their mean (:func:`workbench.analyse.stats.paired` over the cluster means; ``margin``:
    with its non-inferiority test). Returns ``(Paired, clusters)``; ``Paired.n`` is the number of clusters."""
    units = pd.DataFrame({"a": np.asarray(a, dtype=float), "b": np.asarray(b, dtype=float),
                          "c": np.asarray(cluster, dtype=object).astype(str)})
    per = units.groupby("c", sort=True)[["a", "b"]].mean()
    return paired(per["a"].to_numpy(), per["b"].to_numpy(), level, margin=margin), len(per)


def _scores(d: pd.DataFrame, metric: str) -> dict[str, pd.Series]:
    """Each setting's scores in ``d``: ``{setting: float Series indexed by item_id}`` (an item's first row, in the
    rows' order; non-numeric scores dropped), computed in one pass over the settings."""
    return {s: pd.to_numeric(g.drop_duplicates("item_id").set_index("item_id")[metric], errors="coerce")
            .dropna().astype(float) for s, g in d.groupby("setting", sort=False)}


def reference_check(df: pd.DataFrame, metric: str = "contains", *, min_accuracy: float = MIN_REFERENCE_ACCURACY,
                    min_right: int = MIN_REFERENCE_RIGHT) -> tuple[pd.DataFrame, list[str]]:
    """Full-context accuracy per task: ``(table, warnings)``.

    Table columns: ``task, n, right, accuracy, lo, hi, hit_cap, ok``. A task warns when its reference
    accuracy is below ``min_accuracy`` or fewer than ``min_right`` reference answers are right; a
    reference at 0 says that every comparison on the task is void.
    """
    d = with_settings(df)
    rows, warns = [], []
    for task, g in d[d["setting"] == REFERENCE].groupby("task", sort=True):
        x = pd.to_numeric(g[metric], errors="coerce").dropna().to_numpy()
        if not x.size:
            continue
        acc = accuracy((x >= 0.5).astype(float))
        cap = int(g["hit_cap"].astype(bool).sum()) if "hit_cap" in g.columns else 0
        ok = acc.value >= min_accuracy and acc.k >= min_right
        rows.append(dict(task=task, n=acc.n, right=acc.k, accuracy=acc.value, lo=acc.lo, hi=acc.hi, hit_cap=cap,
                         ok=ok))
        if acc.k == 0:
            warns.append(f"REFERENCE FAILED on {task}: full context answers 0 of {acc.n} prompts right ({metric}); "
                         f"every method 'ties' at 0 there, so no comparison on {task} means anything.")
        elif not ok:
            warns.append(f"Weak reference on {task}: full context is right on {acc.k}/{acc.n} prompts ({acc.value:.2f} "
                         f"{_ci(acc)}; {metric}; needs "
                         f">= {min_accuracy:.0%} and >= {min_right} right answers); comparisons on {task} rest on "
                         f"{acc.k} prompts and cannot show much.")
        if cap:
            warns.append(f"{cap} of {acc.n} full-context replies on {task} hit the max_new_tokens cap "
                         f"(they may be cut before their answer).")
    cols = ["task", "n", "right", "accuracy", "lo", "hi", "hit_cap", "ok"]
    return pd.DataFrame(rows, columns=cols), warns


def _pairs(d: pd.DataFrame) -> list[tuple[str, str]]:
    settings = sorted(set(d["setting"]) - {REFERENCE})
    out = [(s, REFERENCE) for s in settings] if REFERENCE in set(d["setting"]) else []
    evict = d[d["method"] == "evict"]
    agnostic = f" ({AGNOSTIC})"
    for s in sorted(set(evict["setting"])):  # DeferKV against every other policy at the same budget
        pol, _, budget = s.partition(" @ ")
        if pol == "deferkv":
            # the same query mode, and (DeferKV needs the question) each query-agnostic policy at the same budget
            out += [(s, o) for o in sorted(set(evict["setting"]))
                    if o != s and o.partition(" @ ")[2] in (budget, budget + agnostic)
                    and o.partition(" @ ")[0] not in ("full",)]
    return out


def comparisons(df: pd.DataFrame, metric: str = "contains", *, level: float = 0.95,
                margin: float | None = None) -> pd.DataFrame:
    """One row per (scope, A, B): paired statistics and the finding sentence.

    The unit of ``n`` is the cluster (:func:`clusters`): prompts that share a fact or a haystack are one unit, scored
    by their mean, so that the bootstrap CI and the test (McNemar, or the sign test on cluster means) count
    independent units; ``prompts`` and ``clusters`` give both counts.

    Columns: ``scope`` (a task, or ``all tasks (pooled)``), ``a, b, query`` (:func:`pair_query`), ``metric, n, mean_a, mean_b, diff, lo,
    hi, wins, ties, losses, test, p, disc, verdict, finding, prompts, clusters`` (with a ``margin``: also its
    non-inferiority test, ``margin, lo1, hi1, p_ni, p_inf``) and, against the reference, ``cond_n`` (prompts
    the reference gets right), ``cond_right`` (of those, how many A keeps right) with ``cond_lo``,
    ``cond_hi`` (Wilson).
    """
    d = with_settings(df)
    if d.empty:
        return pd.DataFrame(columns=["scope", "a", "b", "metric", "n", "finding"])
    d = d.assign(cluster=d["task"].astype(str) + "/" + clusters(d),
                 item_id=d["task"].astype(str) + "/" + d["item_id"].astype(str))
    scopes = [(t, g) for t, g in d.groupby("task", sort=True)]
    if len(scopes) > 1:
        scopes.append((f"all tasks (pooled over {len(scopes)})", d))
    rows = []
    for scope, g in scopes:
        scores = _scores(g, metric)
        # the independent units: prompts sharing a fact or a haystack (one cluster) count once, by their mean
        cluster_of = g.drop_duplicates("item_id").set_index("item_id")["cluster"]
        for a, b in _pairs(g):
            sa, sb = scores[a], scores[b]
            common = sa.index.intersection(sb.index)
            if not len(common):
                continue
            of = cluster_of.reindex(common)
            units = pd.DataFrame({"a": sa[common].to_numpy(), "b": sb[common].to_numpy(), "c": of.to_numpy()})
            r, n_clusters = cluster_paired(units["a"], units["b"], units["c"], level, margin)
            row = dict(scope=scope, a=a, b=b, query=pair_query(f"{a} vs {b}"), metric=metric, **{k: v for k, v in r.to_dict().items()
                                                                   if k not in ("level", "binary")},
                       prompts=len(common), clusters=n_clusters)
            sentence = r.finding(a, b, metric, where=scope)
            if n_clusters < len(common):
                sentence = sentence.replace(f"n = {r.n} paired prompts",
                                            f"n = {r.n} clusters of {len(common)} paired prompts", 1)
            xa, xb = units["a"].to_numpy(), units["b"].to_numpy()
            binary = bool(np.isin(xa, (0.0, 1.0)).all() and np.isin(xb, (0.0, 1.0)).all())  # per prompt
            if b == REFERENCE and binary:
                right = xb == 1.0
                cond = accuracy(xa[right]) if right.any() else None
                row.update(cond_n=int(right.sum()), cond_right=cond.k if cond else 0,
                           cond_lo=cond.lo if cond else math.nan, cond_hi=cond.hi if cond else math.nan)
                if cond is None:
                    sentence += " The reference is right on no prompt here, so nothing is conditional on it."
                else:
                    sentence += (f" Where full context is right, {a} keeps {cond.k} of {cond.n} answers "
                                 f"({cond.value:.2f} {_ci(cond)}).")
            row["finding"] = sentence
            rows.append(row)
    return pd.DataFrame(rows)


def _ci(acc) -> str:
    return f"[{acc.lo:.2f}, {acc.hi:.2f}]"


def failed_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The sweep rows whose method failed (an ``error``), with a ``setting`` column: never scored, left out of
    every comparison, and counted as failed (:func:`accuracy_table`'s ``failed``)."""
    if len(df) == 0 or "error" not in df.columns:
        return pd.DataFrame(columns=[*df.columns, "setting"])
    d = df[df["error"].map(lambda e: isinstance(e, str) and bool(e))].copy()
    d["setting"] = [setting_label({"method": m, "params": p}) for m, p in zip(d["method"], d["params"])] if len(d) else []
    return d


def accuracy_table(df: pd.DataFrame, metric: str = "contains") -> pd.DataFrame:
    """Per task and setting: ``n, right, accuracy`` with its Wilson ``lo, hi`` and replies that hit the cap, over
    the cells that ran; ``failed``: the cells whose method failed (not in ``n``: a failure is not a wrong answer)
    and ``failed_reason``, the first one's error (a setting whose every cell failed has ``n = 0``), then the
    :data:`PROTOCOL` figures of the cells that ran."""
    d = with_settings(df)
    bad = {k: g for k, g in failed_rows(df).groupby(["task", "setting"], sort=True)}
    rows = []
    for (task, s), g in d.groupby(["task", "setting"], sort=True):
        x = pd.to_numeric(g[metric], errors="coerce").dropna().to_numpy()
        acc = accuracy((x >= 0.5).astype(float)) if x.size else None
        f = bad.pop((task, s), None)
        rows.append(dict(task=task, setting=s, n=acc.n if acc else 0, right=acc.k if acc else 0,
                         accuracy=acc.value if acc else math.nan, lo=acc.lo if acc else math.nan,
                         hi=acc.hi if acc else math.nan,
                         hit_cap=int(g["hit_cap"].astype(bool).sum()) if "hit_cap" in g.columns else 0,
                         failed=0 if f is None else len(f), failed_reason=None if f is None else f["error"].iloc[0],
                         **protocol_figures(g)))
    for (task, s), f in bad.items():  # settings none of whose cells ran
        rows.append(dict(task=task, setting=s, n=0, right=0, accuracy=math.nan, lo=math.nan, hi=math.nan, hit_cap=0,
                         failed=len(f), failed_reason=f["error"].iloc[0], **protocol_figures(f.iloc[:0])))
    out = pd.DataFrame(rows, columns=["task", "setting", "n", "right", "accuracy", "lo", "hi", "hit_cap", "failed",
                                      "failed_reason", *PROTOCOL])
    return out.sort_values(["task", "setting"], kind="stable", ignore_index=True)


def timing_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per task and setting: ``n``, mean ``wall_s`` (as charged), mean ``method_s`` (own work), the mean shared
    step per prompt ``shared_s``, ``sharing`` (cells per prompt that share it) and ``amortised_s`` =
    ``method_s + shared_s / sharing``, then the :data:`PROTOCOL` figures; a ``shared eviction prefill`` row per task
    gives the shared step itself."""
    d = with_settings(df)
    cols = ["task", "setting", "n", "wall_s", "method_s", "shared_s", "sharing", "amortised_s", *PROTOCOL]
    if d.empty:
        return pd.DataFrame(columns=cols)
    for c in ("wall_s", "method_s", "shared_s"):
        d[c] = pd.to_numeric(d[c], errors="coerce") if c in d.columns else np.nan
    d["method_s"] = d["method_s"].fillna(d["wall_s"])
    shared = d[d["shared_s"].notna()]
    sharing = shared.groupby(["task", "item_id"]).size().rename("sharing")
    d = d.join(sharing, on=["task", "item_id"])
    d["sharing"] = d["sharing"].where(d["shared_s"].notna())
    d["amortised_s"] = d["method_s"] + (d["shared_s"] / d["sharing"]).fillna(0.0)
    out = d.groupby(["task", "setting"], sort=True).agg(
        n=("item_id", "size"), wall_s=("wall_s", "mean"), method_s=("method_s", "mean"),
        shared_s=("shared_s", "mean"), sharing=("sharing", "mean"), amortised_s=("amortised_s", "mean")).reset_index()
    figures = pd.DataFrame([{"task": t, "setting": s, **protocol_figures(g)}
                            for (t, s), g in d.groupby(["task", "setting"], sort=True)], columns=["task", "setting", *PROTOCOL])
    out = out.merge(figures, on=["task", "setting"], how="left")
    extra = [dict(task=t, setting="shared eviction prefill", n=len(g.drop_duplicates("item_id")),
                  wall_s=math.nan, method_s=float(g.drop_duplicates("item_id")["shared_s"].mean()),
                  shared_s=math.nan, sharing=math.nan, amortised_s=math.nan)
             for t, g in shared.groupby("task", sort=True)]
    return pd.concat([out, pd.DataFrame(extra, columns=cols)], ignore_index=True)[cols]
