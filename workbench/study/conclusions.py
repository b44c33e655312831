"""What this study shows: one row per claim of the seed documents (the DeferKV guide, the EntroPrefill paper), each
with its comparison, task, n (independent clusters), effect, CI, p and a verdict generated from those numbers.

**Verdict rule.** A claim states a direction for an effect (a mean paired difference A − B over clusters,
:func:`workbench.study.findings.cluster_paired`, i.e. :func:`workbench.analyse.stats.paired` over cluster means:
bootstrap CI at ``level``, McNemar exact on 0/1 scores, else the exact sign test). The verdict is

* ``"supported"`` when the CI excludes 0 in the claimed direction and the paired test rejects at ``1 − level``
  (the findings' own rule: a bootstrap CI of a handful of clusters is narrow however few they are);
* ``"contradicted"`` when the CI excludes 0 in the opposite direction and the test rejects;
* ``"not shown"`` otherwise (a tie is no evidence for either side; a descriptive row, such as ``l*``, has no
  claimed direction and is never more than "not shown");
* ``"reference failed"`` for every claim on a task whose full-context reference fails
  :func:`workbench.study.findings.reference_check` (accuracy below its floor or too few right answers): its
  numbers are shown, but they carry no verdict.

Claims (:func:`conclusions`):

* DeferKV ≥ SnapKV at each budget, per family, paired (and pooled over the RULER-style families that pass), and,
  given the ``kept`` table, DeferKV keeps more of the gold answer's tokens than SnapKV;
* the boundary leap: the recall gain of step 0→1 above that of 1→2, and above that of −1→0 (specific to the
  boundary), from a per-prompt step-gain table (``leap``: ``task, item_id, r_from, r_to, gain``);
* Rényi priorities keep the answer chunk longer than mass-only, ζ = 1, the per-head max and uniform priorities
  (standing ``k + 1 − rank``, from a per-prompt rank table ``ranks``: ``task, item_id, priority, k, rank``);
* EntroPrefill per preset, named by preset ("EntroPrefill paper", "EntroPrefill loose"): accuracy against full
  context (paired, claimed ≥), the removed share of the prompt's tokens (claimed > 0), the bypass rate (a
  non-vacuous audit prunes on some prompts: claimed < 1) and ``l*`` (descriptive).

A claim whose table or column is absent is listed in :attr:`Conclusions.missing`, never given a number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analyse.params import PRESETS
from workbench.analyse.stats import bootstrap_ci, fmt_ci
from workbench.study import findings as fnd
from workbench.study.ruler import RULER_TASKS

__all__ = ["conclusions", "Conclusions", "VERDICTS", "preset_name", "verdict", "RULE", "PRIORITY_BASELINES"]

VERDICTS = ("supported", "not shown", "contradicted", "reference failed")
COLUMNS = ("claim", "source", "comparison", "task", "metric", "direction", "n", "prompts", "mean_a", "mean_b",
           "effect", "lo", "hi", "p", "test", "verdict", "reference", "note")
RULE = ("Verdict rule: **supported** when the {pct}% CI of the effect excludes 0 in the claimed direction and the paired "
        "test rejects at {alpha}, **contradicted** when it excludes 0 in the opposite direction and the test rejects, "
        "**not shown** otherwise; a claim on a task whose full-context reference fails the reference check says "
        "**reference failed**. n counts independent clusters (prompts sharing a fact or a haystack are one).")
PRIORITY_BASELINES = {"mass": "mass-only", "renyi, zeta=1": "ζ = 1", "headmax": "the per-head max",
                      "uniform": "uniform"}
GUIDE, PAPER = "DeferKV guide", "EntroPrefill paper"


def verdict(lo: float, hi: float, p: float, direction: int, *, level: float = 0.95, reference_ok: bool = True) -> str:
    """The verdict of one claim (the module's rule): ``direction`` +1 (effect claimed > 0), −1 (< 0) or 0
    (descriptive)."""
    if not reference_ok:
        return "reference failed"
    if direction == 0 or any(isinstance(v, float) and math.isnan(v) for v in (lo, hi, p)) or p >= 1 - level:
        return "not shown"
    side = 1 if lo > 0 else -1 if hi < 0 else 0
    return "not shown" if side == 0 else "supported" if side == direction else "contradicted"


def preset_name(params: dict) -> str:
    """``"EntroPrefill <preset>"`` for parameters equal to a preset's (:data:`workbench.analyse.params.PRESETS`),
    else ``"EntroPrefill (k=v, …)"``."""
    for name, spec in PRESETS.items():
        if dict(params) == dict(spec["params"]):
            return f"EntroPrefill {name}"
    return "EntroPrefill (" + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) + ")"


@dataclass(frozen=True)
class Conclusions:
    """The claims (:data:`COLUMNS` each), what could not be assessed and why, and the settings."""

    rows: tuple[dict, ...]
    missing: tuple[str, ...]
    level: float
    metric: str

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.rows), columns=list(COLUMNS))

    def counts(self) -> dict:
        """Claims per verdict (every verdict present, 0 when none)."""
        got = [r["verdict"] for r in self.rows]
        return {v: got.count(v) for v in VERDICTS}

    def rule(self) -> str:
        pct = int(round(self.level * 100))
        return RULE.format(pct=pct, alpha=f"{1 - self.level:.2g}")

    def markdown(self, heading: str = "## What this study shows") -> str:
        """The section: the rule first, the counts, one table row per claim, then what was not assessed."""
        c = self.counts()
        out = [heading, self.rule(),
               f"{len(self.rows)} claims: " + ", ".join(f"{k} {v}" for k, v in c.items()) + "."]
        if self.rows:
            out.append("| claim | source | task | comparison | n | effect [CI] | p | verdict |\n|---|---|---|---|---|---|---|---|")
            out[-1] += "".join(f"\n| {r['claim']} | {r['source']} | {r['task']} | {r['comparison']} | {_n(r)} | "
                               f"{_effect(r)} | {_p(r['p'])} | **{r['verdict']}** |" for r in self.rows)
            notes = [f"- {r['claim']} ({r['task']}): {r['note']}" for r in self.rows if r["note"]]
            out += ["\n".join(notes)] if notes else []
            failed = list(dict.fromkeys(r["reference"] for r in self.rows if r["reference"]))
            out += ["Reference failed, so these claims carry no verdict:\n" + "\n".join(f"- {f}" for f in failed)
                    ] if failed else []
        if self.missing:
            out.append("Not assessed here:\n" + "\n".join(f"- {m}" for m in self.missing))
        return "\n\n".join(out)


def _n(r) -> str:
    return f"{r['n']}" if r["prompts"] in (r["n"], None) or _nan(r["prompts"]) else f"{r['n']} ({r['prompts']} prompts)"


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _effect(r) -> str:
    if _nan(r["effect"]):
        return "n/a"
    return f"{r['effect']:+.3f} {fmt_ci(r['lo'], r['hi'], signed=True, digits=3)}"


def _p(p) -> str:
    return "—" if _nan(p) else f"{p:.3g}"


# ----------------------------------------------------------------------------- building rows
def _row(claim, source, comparison, task, metric, direction, r, prompts, *, level, ok, reference="", note="") -> dict:
    """One claim from a :class:`~workbench.analyse.stats.Paired` ``r`` (over clusters) or a row of
    :func:`workbench.study.findings.comparisons` (a Series or an ``itertuples`` row)."""
    r = pd.Series(r._asdict() if hasattr(r, "_asdict") else r.to_dict())
    return dict(claim=claim, source=source, comparison=comparison, task=task, metric=metric,
                direction={1: "> 0", -1: "< 0", 0: "none (descriptive)"}[direction], n=int(r["n"]), prompts=int(prompts),
                mean_a=float(r["mean_a"]), mean_b=float(r["mean_b"]), effect=float(r["diff"]), lo=float(r["lo"]),
                hi=float(r["hi"]), p=float(r["p"]), test="McNemar exact" if r["test"] == "mcnemar" else "sign test",
                verdict=verdict(float(r["lo"]), float(r["hi"]), float(r["p"]), direction, level=level, reference_ok=ok),
                reference=reference, note=note)


def _with_clusters(t: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """``t`` (rows of ``task, item_id``) with a ``unit`` column: its prompt's cluster (its own ``meta_cluster``, else
    the sweep frame's for the same prompt, else the prompt itself), prefixed by the task."""
    t = t.copy()
    t["item_id"] = t["item_id"].astype(str)
    if "meta_cluster" not in t.columns and "meta_cluster" in df.columns and len(df):
        m = df[["task", "item_id", "meta_cluster"]].assign(item_id=lambda x: x["item_id"].astype(str))
        t = t.merge(m.drop_duplicates(["task", "item_id"]), on=["task", "item_id"], how="left")
    t["unit"] = t["task"].astype(str) + "/" + fnd.clusters(t)
    return t


def _gate(ref: pd.DataFrame, tasks) -> tuple[bool, str]:
    """Whether every task of ``tasks`` passes the reference check, and the note when not."""
    ok = dict(zip(ref["task"], ref["ok"].astype(bool))) if len(ref) else {}
    bad = [t for t in tasks if not ok.get(t, False)]
    if not bad:
        return True, ""
    why = [f"{t}: full context {_ref_text(ref, t)}" for t in bad]
    return False, "; ".join(why)


def _ref_text(ref: pd.DataFrame, task) -> str:
    r = ref[ref["task"] == task]
    if not len(r):
        return "has no run"
    r = r.iloc[0]
    return (f"right on {int(r['right'])}/{int(r['n'])}, needs >= {fnd.MIN_REFERENCE_ACCURACY:.0%} and >= "
            f"{fnd.MIN_REFERENCE_RIGHT} right")


def _deferkv(df, comp, ref, metric, level, ruler) -> tuple[list, list]:
    rows, missing = [], []
    sel = comp[comp["a"].str.startswith("deferkv @ ") & comp["b"].str.startswith("snapkv @ ")] if len(comp) else comp
    sel = sel[sel["a"].str.partition(" @ ")[2] == sel["b"].str.partition(" @ ")[2]] if len(sel) else sel
    if not len(sel):
        missing.append("DeferKV vs SnapKV: the sweep has no DeferKV and SnapKV cells at a common budget.")
        return rows, missing
    sel = sel[~sel["scope"].str.startswith("all tasks")]
    claim = "DeferKV ≥ SnapKV at the same budget"
    for r in sel.itertuples(index=False):
        ok, note = _gate(ref, [r.scope])
        rows.append(_row(claim, GUIDE, f"{r.a} vs {r.b}", r.scope, metric, 1, r, r.prompts, level=level, ok=ok,
                         reference=note))
    passing = [t for t in sorted(set(sel["scope"])) if t in ruler and _gate(ref, [t])[0]]
    if len(passing) > 1:  # the guide's claim is a RULER average: pooled over the families whose reference passes
        pooled = fnd.comparisons(df[df["task"].isin(passing)], metric, level=level)
        pooled = pooled[pooled["scope"].str.startswith("all tasks")]
        for r in pooled[pooled["a"].isin(sel["a"]) & pooled["b"].isin(sel["b"])].itertuples(index=False):
            if r.a.partition(" @ ")[2] == r.b.partition(" @ ")[2]:
                rows.append(_row(claim, GUIDE, f"{r.a} vs {r.b}", f"RULER-style (pooled over {', '.join(passing)})",
                                 metric, 1, r, r.prompts, level=level, ok=True))
    return rows, missing


def _kept(kept, df, ref, level) -> tuple[list, list]:
    if kept is None:
        return [], ["DeferKV keeps more of the gold answer's tokens than SnapKV: no answer-tokens-kept table (none given, or empty)."]
    if "task" not in kept.columns:
        return [], ["DeferKV vs SnapKV answer tokens kept: the table has no task column, so its reference cannot be "
                    "checked."]
    k = _with_clusters(kept, df)
    rows = []
    for (task, f), g in k.groupby(["task", "budget_frac"], sort=True):
        w = g.pivot_table(index=["item_id", "unit"], columns="policy", values="kept").dropna().reset_index()
        if not {"deferkv", "snapkv"} <= set(w.columns) or not len(w):
            continue
        r, _ = fnd.cluster_paired(w["deferkv"], w["snapkv"], w["unit"], level)
        ok, note = _gate(ref, [task])
        rows.append(_row("DeferKV keeps more of the gold answer's tokens than SnapKV", GUIDE,
                         f"deferkv @ {f:g} vs snapkv @ {f:g}", task, "share of the gold answer's tokens kept", 1, r,
                         len(w), level=level, ok=ok, reference=note))
    return rows, [] if rows else ["DeferKV vs SnapKV answer tokens kept: the table holds no paired DeferKV/SnapKV rows."]


def _leap(leap, df, ref, level) -> tuple[list, list]:
    if leap is None:
        return [], ["The boundary leap (0→1 against 1→2 and −1→0): no per-prompt step-gain table (none given, or empty; "
                    "it needs a capture per prompt: benchmarks/study.py writes one, <stem>_leap.parquet)."]
    if "task" not in leap.columns:
        return [], ["The boundary leap: the step-gain table has no task column, so its reference cannot be checked."]
    t = _with_clusters(leap, df)
    t["step"] = t["r_from"].astype(int).astype(str) + ":" + t["r_to"].astype(int).astype(str)
    w = t.pivot_table(index=["task", "item_id", "unit"], columns="step", values="gain").reset_index()
    rows, missing = [], []
    metric = "recall gain of the step (mean over KV groups and layers, held-out reference)"
    for other, claim in (("1:2", "The recall leap at the boundary (0→1) exceeds the next step (1→2)"),
                         ("-1:0", "The recall leap is specific to the boundary: 0→1 exceeds −1→0")):
        if "0:1" not in w.columns or other not in w.columns:
            missing.append(f"{claim}: the step-gain table has no {'0→1' if '0:1' not in w.columns else _step(other)} "
                           "step.")
            continue
        for task, g in w.groupby("task", sort=True):
            g = g.dropna(subset=["0:1", other])
            if not len(g):
                continue
            r, _ = fnd.cluster_paired(g["0:1"], g[other], g["unit"], level)
            ok, note = _gate(ref, [task])
            rows.append(_row(claim, GUIDE, f"0→1 vs {_step(other)}", task, metric, 1, r, len(g), level=level, ok=ok,
                             reference=note))
    return rows, missing


def _step(s: str) -> str:
    return s.replace(":", "→").replace("-", "−")


def _ranks(ranks, df, ref, level) -> tuple[list, list]:
    if ranks is None:
        return [], ["Rényi against mass-only, ζ = 1 and the per-head max (the answer chunk's standing): no per-prompt "
                    "rank table (none given, or empty; it needs a capture per prompt: benchmarks/study.py writes one, "
                    "<stem>_ranks.parquet)."]
    if "task" not in ranks.columns:
        return [], ["Rényi against the other priorities: the rank table has no task column, so its reference cannot "
                    "be checked."]
    t = _with_clusters(ranks.dropna(subset=["rank"]), df)
    t["standing"] = t["k"].astype(float) + 1 - t["rank"].astype(float)
    w = t.pivot_table(index=["task", "item_id", "unit"], columns="priority", values="standing").reset_index()
    rows, missing = [], []
    if "renyi" not in w.columns:
        return [], ["Rényi against the other priorities: the rank table has no 'renyi' rows."]
    metric = "answer-chunk standing k + 1 − rank (mean over layers; higher = kept longer)"
    for other, name in PRIORITY_BASELINES.items():
        if other not in w.columns:
            missing.append(f"Rényi against {name}: the rank table has no {other!r} rows.")
            continue
        for task, g in w.groupby("task", sort=True):
            g = g.dropna(subset=["renyi", other])
            if not len(g):
                continue
            r, _ = fnd.cluster_paired(g["renyi"], g[other], g["unit"], level)
            ok, note = _gate(ref, [task])
            rows.append(_row(f"Rényi priorities keep the answer chunk longer than {name}", PAPER,
                             f"renyi vs {other}", task, metric, 1, r, len(g), level=level, ok=ok, reference=note))
    return rows, missing


def _entroprefill(df, comp, ref, metric, level) -> tuple[list, list]:
    d = fnd.with_settings(df)
    e = d[d["method"] == "entroprefill"]
    if not len(e):
        return [], ["EntroPrefill: the sweep has no entroprefill cells."]
    e = e.assign(preset=[preset_name(fnd.row_params(r)) for _, r in e.iterrows()])
    e = _with_clusters(e, df)
    rows, missing = [], []
    vs = comp[comp["b"] == fnd.REFERENCE] if len(comp) else comp
    order = {f"EntroPrefill {name}": i for i, name in enumerate(PRESETS)}  # paper, loose, strict, then the others
    groups = sorted(e.groupby(["preset", "task"], sort=True), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0]))
    for (preset, task), g in groups:
        ok, note = _gate(ref, [task])
        setting = g["setting"].iloc[0]
        c = vs[(vs["a"] == setting) & (vs["scope"] == task)] if len(vs) else vs
        if len(c):
            r = c.iloc[0]
            rows.append(_row(f"{preset} keeps full-context accuracy", PAPER, f"{preset} vs full", task, metric, 1, r,
                             r["prompts"], level=level, ok=ok, reference=note))
        else:
            missing.append(f"{preset} on {task}: no paired full-context cells, accuracy not compared.")
        if {"retained_tokens", "prompt_tokens"} <= set(g.columns):
            share = 1 - pd.to_numeric(g["retained_tokens"], errors="coerce") / pd.to_numeric(g["prompt_tokens"],
                                                                                             errors="coerce")
            m = share.notna()
            r, _ = fnd.cluster_paired(share[m], np.zeros(int(m.sum())), g.loc[m, "unit"], level)
            rows.append(_row(f"{preset} removes context before the deeper layers", PAPER,
                             "removed share of the prompt's tokens vs 0", task, "1 − retained_tokens / prompt_tokens",
                             1, r, int(m.sum()), level=level, ok=ok, reference=note))
        else:
            missing.append(f"{preset} on {task}: removal share — the sweep frame has no retained_tokens/prompt_tokens.")
        if "bypass" in g.columns and g["bypass"].notna().any():
            b = g[g["bypass"].notna()]
            x = b["bypass"].astype(bool).astype(float)
            r, _ = fnd.cluster_paired(x, np.ones(len(x)), b["unit"], level)
            rows.append(_row(f"{preset}'s audit is not vacuous: it prunes on some prompts (bypass rate < 1)", PAPER,
                             "bypass rate vs 1", task, "bypass (1: full prefill, nothing removed)", -1, r, len(b),
                             level=level, ok=ok, reference=note, note=f"bypass rate {r.mean_a:.2f} over {r.n} clusters"))
        else:
            missing.append(f"{preset} on {task}: bypass rate — the sweep frame has no bypass column.")
        if "l_star" in g.columns:
            ls = pd.to_numeric(g["l_star"], errors="coerce")
            acc = g[ls >= 0].assign(l_star=ls[ls >= 0])
            if len(acc):
                per = acc.groupby("unit")["l_star"].mean().to_numpy()
                lo, hi = bootstrap_ci(per, level)
                rows.append(dict(claim=f"{preset}'s accepted layer l*", source=PAPER, comparison="l* (pruned prompts)",
                                 task=task, metric="l*", direction="none (descriptive)", n=len(per), prompts=len(acc),
                                 mean_a=float(per.mean()), mean_b=math.nan, effect=float(per.mean()), lo=lo, hi=hi,
                                 p=math.nan, test="—", verdict="reference failed" if not ok else "not shown",
                                 reference=note, note=f"descriptive (the paper claims no l*): median "
                                 f"{float(np.median(acc['l_star'])):g} over the {len(acc)} prompts that pruned"))
            else:
                missing.append(f"{preset} on {task}: l* — no prompt pruned (every prompt bypassed).")
        else:
            missing.append(f"{preset} on {task}: l* — the sweep frame has no l_star column.")
    return rows, missing


def conclusions(df: pd.DataFrame, leap: pd.DataFrame | None = None, ranks: pd.DataFrame | None = None, *,
                kept: pd.DataFrame | None = None, metric: str = "contains", level: float = 0.95,
                ruler=None) -> Conclusions:
    """The claims of the seed documents against a sweep frame ``df`` (and, when given, the per-prompt step-gain
    table ``leap``, the per-prompt priority rank table ``ranks`` and the answer-tokens-kept table ``kept``), each
    with a verdict by the module's rule. ``ruler``: the RULER-style family names pooled for the DeferKV claim
    (default: :data:`workbench.study.ruler.RULER_TASKS`)."""
    from_ruler = ruler if ruler is not None else RULER_TASKS
    leap, ranks, kept = (t if t is not None and len(t) else None for t in (leap, ranks, kept))
    ref, _ = fnd.reference_check(df, metric)
    comp = fnd.comparisons(df, metric, level=level)
    if "a" not in comp.columns:
        comp = pd.DataFrame(columns=["scope", "a", "b", "prompts"])
    rows, missing = [], []
    for part in (_deferkv(df, comp, ref, metric, level, set(from_ruler)), _kept(kept, df, ref, level),
                 _leap(leap, df, ref, level), _ranks(ranks, df, ref, level),
                 _entroprefill(df, comp, ref, metric, level)):
        rows += part[0]
        missing += part[1]
    return Conclusions(rows=tuple(rows), missing=tuple(missing), level=level, metric=metric)

