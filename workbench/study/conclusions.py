"""What this study shows: one row per claim of the seed documents (the DeferKV guide, the EntroPrefill paper), each
with its kind, comparison, task, n (independent clusters), effect, CI, p, the minimum detectable effect and a verdict
generated from those numbers.

**Verdict rule** (:data:`workbench.study.verdicts.RULE`, the one definition: the report,
``benchmarks/study_tables.py`` and the README print it). Each claim declares its kind (:data:`KINDS`):

* **superiority** (A > B): ``"supported"`` when the CI of the effect (a mean paired difference A − B over clusters,
  :func:`workbench.study.findings.cluster_paired`: bootstrap CI at ``level``) excludes 0 in the claimed direction
  and the two-sided paired test (McNemar exact on 0/1 units, else the exact sign test) rejects at ``1 − level``;
  ``"contradicted"`` when both show the opposite direction; ``"inconclusive"`` otherwise;
* **non-inferiority** (A ≥ B − δ, the margin δ fixed before the run, default :data:`DEFAULT_MARGIN`): ``"supported"``
  when A is shown better as above; ``"non-inferior"`` when the one-sided ``level`` lower confidence bound of the
  effect exceeds −δ and the test of effect > −δ rejects (:func:`workbench.analyse.stats.noninferiority`: Tango's
  score interval for paired proportions on 0/1 clusters with its score test, exact unconditional on up to 200
  clusters; on cluster means that are not 0/1 the more conservative of it at the fractional counts and a Student t
  bound); ``"inferior"`` when the one-sided upper bound is below −δ and the test of effect < −δ rejects;
  ``"inconclusive"`` otherwise. Exact ties are therefore non-inferior only on enough clusters (at δ = 0.1 and 95 %:
  29, since 0.9^28 > 0.05; ten ties bound a loss at −0.21 only) and never supported;
* **descriptive** (a quantity, or a claim that holds by construction of a setting: a preset that does not bypass
  removes its own target): no verdict, and not counted among the claims.

A claim on a task whose full-context reference fails :func:`workbench.study.findings.reference_check` reads
``"reference failed"``: its numbers are shown, they carry no verdict. Every comparison row states its minimum
detectable effect at 80 % power (:func:`workbench.analyse.stats.mde` at its n and observed discordance, two-sided
α for superiority, one-sided for non-inferiority), and an inconclusive row whose MDE exceeds the effect its source
claims (δ for non-inferiority) is marked underpowered.

Claims (:func:`conclusions`):

* DeferKV ≥ SnapKV at each budget (non-inferiority; the guide claims +5.6 points on RULER), per family, paired (and
  pooled over the RULER-style families that pass), and, given the ``kept`` table, DeferKV keeps more of the gold
  answer's tokens than SnapKV (superiority);
* the boundary leap: the recall gain of step 0→1 above that of 1→2, and above that of −1→0 (specific to the
  boundary), from a per-prompt step-gain table (``leap``: ``task, item_id, r_from, r_to, gain``);
* Rényi priorities keep the answer chunk longer than mass-only, ζ = 1, the per-head max and uniform priorities
  (standing ``k + 1 − rank``, from a per-prompt rank table ``ranks``: ``task, item_id, priority, k, rank``);
* EntroPrefill per preset, named by preset ("EntroPrefill paper", "EntroPrefill loose"): accuracy against full
  context (non-inferiority), and, descriptive, how often it prunes with the removed share (one row: "removed share
  > 0" and "did not bypass" are the same event per prompt) and ``l*`` (no interval: a layer index per prompt).

A claim whose table or column is absent is listed in :attr:`Conclusions.missing`, never given a number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workbench.analyse.params import PRESETS
from workbench.analyse.shift import HELD_OUT_AFTER, HELD_OUT_GAP
from workbench.analyse.stats import STATS_CHECKS, bootstrap_ci, fmt_ci, mde
from workbench.study import findings as fnd
from workbench.study.followup import FOLLOWUP
from workbench.study.ruler import RULER_TASKS
from workbench.study.verdicts import DEFAULT_MARGIN, DESCRIPTIVE, KINDS, RULE, VERDICTS, plan, rule_text, verdict

__all__ = ["conclusions", "Conclusions", "VERDICTS", "KINDS", "DESCRIPTIVE", "DEFAULT_MARGIN", "preset_name",
           "verdict", "rule_text", "RULE", "PRIORITY_BASELINES", "plan"]

COLUMNS = ("claim", "source", "kind", "comparison", "query", "task", "metric", "direction", "n", "prompts", "mean_a", "mean_b",
           "effect", "lo", "hi", "p", "test", "margin", "lo1", "hi1", "p_ni", "p_inf", "ni_test", "disc", "mde", "claimed",
           "underpowered", "verdict", "reference", "note")
PRIORITY_BASELINES = {"mass": "mass-only", "renyi, zeta=1": "ζ = 1", "headmax": "the per-head max",
                      "uniform": "uniform"}
GUIDE, PAPER = "DeferKV guide", "EntroPrefill paper"
FOLLOWUP_CLAIM = ", second answer (one eviction, two questions)"  # the follow-up protocol's rows


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
    margin: float = DEFAULT_MARGIN

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.rows), columns=list(COLUMNS))

    def counts(self) -> dict:
        """Substantive claims (not descriptive) per verdict (every verdict present, 0 when none)."""
        got = [r["verdict"] for r in self.rows]
        return {v: got.count(v) for v in VERDICTS}

    def n_descriptive(self) -> int:
        return sum(r["verdict"] == DESCRIPTIVE for r in self.rows)

    def n_underpowered(self) -> int:
        return sum(bool(r["underpowered"]) for r in self.rows)

    def rule(self) -> str:
        return rule_text(self.level, self.margin)

    def next_step(self) -> str:
        """One line for a study some of whose rows could not have shown their effect (``""`` when none is
        underpowered): how many they are, and the commands that plan and run a study that can. With every cluster
        tied, the exact test of non-inferiority rejects once ``(1 − δ)^n ≤ α``: a method losing on a share δ of the
        clusters ties ``n`` in a row with probability ``(1 − δ)^n``."""
        under = [r for r in self.rows if r["underpowered"]]
        if not under:
            return ""
        n_max = max(int(r["n"]) for r in under)
        line = (f"{len(under)} claim(s) could not have shown their effect at these n (at most {n_max} clusters): "
                f"`python -m workbench plan --kind non-inferiority --discordance D` says how many clusters a claim "
                f"needs at the discordance D you expect")
        if self.margin > 0:
            ties = math.ceil(math.log(1 - self.level) / math.log(1 - self.margin))
            line += (f"; with every cluster tied, {ties} clusters show δ = {self.margin:g}, and "
                     f"`python -m workbench report --n-needle {ties}` runs that many needles (one cluster each)")
        return line + "."

    def summary_line(self) -> str:
        c = self.counts()
        return (f"{sum(c.values())} substantive claims: " + ", ".join(f"{k} {v}" for k, v in c.items())
                + f" ({self.n_underpowered()} of them underpowered); {self.n_descriptive()} descriptive rows (no "
                f"verdict, not counted). Margin δ = {self.margin:g}.")

    def markdown(self, heading: str = "## What this study shows") -> str:
        """The section: the rule first, the counts, one table row per claim, then what was not assessed."""
        out = [heading, self.rule(), self.summary_line()] + ([self.next_step()] if self.next_step() else [])
        if self.rows:
            out.append("| claim | source | kind | task | comparison | n | effect [CI] | test p | MDE | verdict |\n"
                       "|---|---|---|---|---|---|---|---|---|---|")
            out[-1] += "".join(f"\n| {r['claim']} | {r['source']} | {r['kind']} | {r['task']} | {r['comparison']} | "
                               f"{_n(r)} | {_effect(r)} | {_p(r)} | {_mde(r)} | {_verdict_cell(r)} |"
                               for r in self.rows)
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
    ci = "" if _nan(r["lo"]) else " " + fmt_ci(r["lo"], r["hi"], signed=True, digits=3)
    if r["kind"] == "non-inferiority" and not _nan(r["lo1"]):
        ci += f"; one-sided ≥ {r['lo1']:+.3f}"
    return f"{r['effect']:+.3f}{ci}"


def _p(r) -> str:
    if _nan(r["p"]):
        return "—"
    out = f"{r['test']} {r['p']:.3g}"
    if r["kind"] == "non-inferiority" and not _nan(r["p_ni"]):
        out += f"; {r['ni_test']} vs −δ {r['p_ni']:.3g}"
    return out


def _mde(r) -> str:
    if _nan(r["mde"]):
        return "—"
    return "∞" if math.isinf(r["mde"]) else f"{r['mde']:.3f}"


def _verdict_cell(r) -> str:
    if r["verdict"] == DESCRIPTIVE:
        return "descriptive (no verdict)"
    return f"**{r['verdict']}**" + (" (underpowered)" if r["underpowered"] else "")


# ----------------------------------------------------------------------------- building rows
def _row(claim, source, comparison, task, metric, kind, r, prompts, *, level, ok, margin=DEFAULT_MARGIN,
         claimed=math.nan, reference="", note="") -> dict:
    """One claim of ``kind`` (superiority or non-inferiority, effect claimed > 0) from a
    :class:`~workbench.analyse.stats.Paired` ``r`` (over clusters) or a row of
    :func:`workbench.study.findings.comparisons` (a Series or an ``itertuples`` row)."""
    r = pd.Series(r._asdict() if hasattr(r, "_asdict") else r.to_dict())
    one = int(r["n"]) < 2  # one unit has no spread: no interval, no test
    get = lambda k: math.nan if one and k in ("lo", "hi", "lo1", "hi1") else (  # noqa: E731
        float(r[k]) if k in r.index and r[k] is not None else math.nan)
    ni_kind = kind == "non-inferiority"
    n = int(r["n"])
    disc = get("disc")
    m = mde(n, disc, 1 - level, sided=1 if ni_kind else 2) if n and not _nan(disc) else math.nan
    claimed = margin if ni_kind else claimed
    v = verdict(kind, lo=get("lo"), hi=get("hi"), p=get("p"), lo1=get("lo1"), hi1=get("hi1"), p_ni=get("p_ni"),
                p_inf=get("p_inf"), margin=margin, level=level, reference_ok=ok)
    test = "McNemar exact" if r["test"] == "mcnemar" else "sign test"
    return dict(claim=claim, source=source, kind=kind, comparison=comparison, query=fnd.pair_query(comparison),
                task=task, metric=metric,
                direction="≥ −δ" if ni_kind else "> 0", n=n, prompts=int(prompts), mean_a=float(r["mean_a"]),
                mean_b=float(r["mean_b"]), effect=float(r["diff"]), lo=get("lo"), hi=get("hi"), p=get("p"), test=test,
                margin=margin if ni_kind else math.nan, lo1=get("lo1") if ni_kind else math.nan,
                hi1=get("hi1") if ni_kind else math.nan, p_ni=get("p_ni") if ni_kind else math.nan,
                p_inf=get("p_inf") if ni_kind else math.nan,
                ni_test=r["ni_test"] if ni_kind and isinstance(r.get("ni_test"), str) else "", disc=disc, mde=m,
                claimed=claimed,
                underpowered=bool(v == "inconclusive" and not _nan(claimed) and not _nan(m) and m > claimed),
                verdict=v, reference=reference, note=note)


def _descriptive(claim, source, comparison, task, metric, *, n, prompts, mean, lo=math.nan, hi=math.nan,
                 reference="", note="") -> dict:
    """A descriptive row: a quantity with no claimed direction, no test and no verdict."""
    return dict(claim=claim, source=source, kind="descriptive", comparison=comparison, query="aware",
                task=task, metric=metric,
                direction="none (descriptive)", n=int(n), prompts=int(prompts), mean_a=float(mean), mean_b=math.nan,
                effect=float(mean), lo=lo, hi=hi, p=math.nan, test="—", margin=math.nan, lo1=math.nan, hi1=math.nan,
                p_ni=math.nan, p_inf=math.nan, ni_test="", disc=math.nan, mde=math.nan, claimed=math.nan, underpowered=False,
                verdict=DESCRIPTIVE, reference=reference, note=note)


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


def _agnostic(comp, ref, metric, level, margin) -> tuple[list, list]:
    """DeferKV (query-aware: it needs the question) against SnapKV query-agnostic, kvpress's protocol, at one budget."""
    if not len(comp) or not comp["b"].str.endswith(f" ({fnd.AGNOSTIC})").any():
        return [], []
    a, b = comp["a"].str.partition(" @ ")[2], comp["b"].str.partition(" @ ")[2]
    sel = comp[comp["a"].str.startswith("deferkv @ ") & comp["b"].str.startswith("snapkv @ ") &
               (b == a + f" ({fnd.AGNOSTIC})") & ~comp["scope"].str.startswith("all tasks")]
    rows = [_row("DeferKV (query-aware) ≥ SnapKV query-agnostic (kvpress's protocol) at the same budget", GUIDE,
                 f"{r.a} vs {r.b}", r.scope, metric, "non-inferiority", r, r.prompts, level=level,
                 ok=_gate(ref, [r.scope])[0], margin=margin, reference=_gate(ref, [r.scope])[1])
            for r in sel.itertuples(index=False)]
    if not comp["a"].str.startswith("deferkv @ ").any():
        return rows, []
    return rows, ["DeferKV query-agnostic: not run; it evicts after the first answer step, which needs the question "
                  "in the cache (the sweep refuses those cells), so its rows are query-aware only."]


def _deferkv(df, comp, ref, metric, level, ruler, margin) -> tuple[list, list]:
    rows, missing = [], []
    sel = comp[comp["a"].str.startswith("deferkv @ ") & comp["b"].str.startswith("snapkv @ ")] if len(comp) else comp
    sel = sel[sel["a"].str.partition(" @ ")[2] == sel["b"].str.partition(" @ ")[2]] if len(sel) else sel
    if not len(sel):
        missing.append("DeferKV vs SnapKV: the sweep has no DeferKV and SnapKV cells at a common budget.")
        return rows, missing
    sel = sel[~sel["scope"].str.startswith("all tasks")]
    claim = "DeferKV ≥ SnapKV at the same budget"
    followup = set(df.loc[df["meta_protocol"] == FOLLOWUP, "task"]) if "meta_protocol" in df.columns else set()
    for r in sel.itertuples(index=False):
        ok, note = _gate(ref, [r.scope])
        rows.append(_row(claim + (FOLLOWUP_CLAIM if r.scope in followup else ""), GUIDE, f"{r.a} vs {r.b}", r.scope,
                         metric, "non-inferiority", r, r.prompts,
                         level=level, ok=ok, margin=margin, reference=note))
    passing = [t for t in sorted(set(sel["scope"])) if t in ruler and _gate(ref, [t])[0]]
    if len(passing) > 1:  # the guide's claim is a RULER average: pooled over the families whose reference passes
        pooled = fnd.comparisons(df[df["task"].isin(passing)], metric, level=level, margin=margin)
        pooled = pooled[pooled["scope"].str.startswith("all tasks")]
        for r in pooled[pooled["a"].isin(sel["a"]) & pooled["b"].isin(sel["b"])].itertuples(index=False):
            if r.a.partition(" @ ")[2] == r.b.partition(" @ ")[2]:
                rows.append(_row(claim, GUIDE, f"{r.a} vs {r.b}", f"RULER-style (pooled over {', '.join(passing)})",
                                 metric, "non-inferiority", r, r.prompts, level=level, ok=True, margin=margin))
    return rows, missing


def _kept(kept, df, ref, level) -> tuple[list, list]:
    if kept is None:
        return [], ["DeferKV keeps more of the gold answer's tokens than SnapKV: no answer-tokens-kept table (none given, or empty; "
                       "report --kept-prompts N writes one, tables/kept.parquet)."]
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
                         f"deferkv @ {f:g} vs snapkv @ {f:g}", task, "share of the gold answer's tokens kept",
                         "superiority", r, len(w), level=level, ok=ok, reference=note))
    return rows, [] if rows else ["DeferKV vs SnapKV answer tokens kept: the table holds no paired DeferKV/SnapKV rows."]


def _leap(leap, df, ref, level) -> tuple[list, list]:
    if leap is None:
        return [], ["The boundary leap (0→1 against 1→2 and −1→0): no per-prompt step-gain table (none given, or empty; "
                    "it needs a capture per prompt: report --leap-prompts N writes one, tables/leap.parquet)."]
    if "task" not in leap.columns:
        return [], ["The boundary leap: the step-gain table has no task column, so its reference cannot be checked."]
    t = _with_clusters(leap, df)
    # the gapped reference leaves no step past row HELD_OUT_AFTER; a table with them used an abutting reference
    old = (f"this table has steps up to row {int(t['r_to'].max())}, so its reference abutted the compared steps "
           f"(from row {HELD_OUT_AFTER + 1}: 1→2 ends within {HELD_OUT_GAP} rows of it); rerun benchmarks/study.py "
           "for the reference behind the gap") if (t["r_to"] > HELD_OUT_AFTER).any() else ""
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
            rows.append(_row(claim, GUIDE, f"0→1 vs {_step(other)}", task, metric, "superiority", r, len(g),
                             level=level, ok=ok, reference=note, note=old))
    return rows, missing


def _step(s: str) -> str:
    return s.replace(":", "→").replace("-", "−")


def _ranks(ranks, df, ref, level) -> tuple[list, list]:
    if ranks is None:
        return [], ["Rényi against mass-only, ζ = 1 and the per-head max (the answer chunk's standing): no per-prompt "
                    "rank table (none given, or empty; it needs a capture per prompt: report --leap-prompts N "
                    "writes one, tables/ranks.parquet)."]
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
                             f"renyi vs {other}", task, metric, "superiority", r, len(g), level=level, ok=ok,
                             reference=note))
    return rows, missing


def _entroprefill(df, comp, ref, metric, level, margin) -> tuple[list, list]:
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
        pruning = _pruning(g)
        if len(c):
            r = c.iloc[0]
            claim = f"{preset} keeps full-context accuracy"
            row = _row(claim, PAPER, f"{preset} vs full", task, metric, "non-inferiority", r, r["prompts"],
                       level=level, ok=ok, margin=margin, reference=note, note=pruning[1] if pruning else "")
            if "bypass" in g.columns and g["bypass"].notna().all() and g["bypass"].astype(bool).all():
                # every prompt ran the full prefill: full context compared with itself holds by construction
                row = dict(_descriptive(claim, PAPER, f"{preset} vs full", task, metric, n=row["n"],
                                        prompts=row["prompts"], mean=row["effect"], lo=row["lo"], hi=row["hi"],
                                        reference=note, note="descriptive: it bypassed every prompt, so this is full "
                                        "context compared with itself (no evidence either way)"), mean_b=row["mean_b"])
            rows.append(row)
        else:
            missing.append(f"{preset} on {task}: no paired full-context cells, accuracy not compared.")
        if pruning:
            rows.append(dict(pruning[0], claim=f"{preset} prunes: removed share of the prompt's tokens", task=task,
                             reference=note))
        else:
            missing.append(f"{preset} on {task}: pruning — the sweep frame has no retained_tokens/prompt_tokens or "
                           "no bypass column.")
        if "l_star" in g.columns:
            ls = pd.to_numeric(g["l_star"], errors="coerce")  # NaN: no layer accepted (bypass); -1 prunes before 0
            acc = g[ls.notna()].assign(l_star=ls[ls.notna()])
            if len(acc):
                per = acc.groupby("unit")["l_star"].mean().to_numpy()
                rows.append(_descriptive(f"{preset}'s accepted layer l*", PAPER, "l* (pruned prompts)", task, "l*",
                                         n=len(per), prompts=len(acc), mean=float(per.mean()), reference=note,
                                         note=f"no interval (a layer index per prompt): median "
                                         f"{float(np.median(acc['l_star'])):g}, range {int(acc['l_star'].min())}–"
                                         f"{int(acc['l_star'].max())} over the {len(acc)} prompts that pruned"))
            else:
                missing.append(f"{preset} on {task}: l* — no prompt pruned (every prompt bypassed).")
        else:
            missing.append(f"{preset} on {task}: l* — the sweep frame has no l_star column.")
    return rows, missing


def _pruning(g: pd.DataFrame):
    """One descriptive row for a preset on a task: the removed share (bootstrap CI over clusters) with the bypass
    rate in its note, and the note itself; ``None`` without the columns. "Removed share > 0" and "did not bypass"
    are one event per prompt, so they make one row; a prompt where they disagree is said."""
    if not {"retained_tokens", "prompt_tokens", "bypass"} <= set(g.columns) or not g["bypass"].notna().any():
        return None
    share = 1 - pd.to_numeric(g["retained_tokens"], errors="coerce") / pd.to_numeric(g["prompt_tokens"], errors="coerce")
    m = share.notna() & g["bypass"].notna()
    if not m.any():
        return None
    share, byp, unit = share[m], g.loc[m, "bypass"].astype(bool), g.loc[m, "unit"]
    per = share.groupby(unit.to_numpy()).mean().to_numpy()
    per_b = byp.astype(float).groupby(unit.to_numpy()).mean()
    lo, hi = bootstrap_ci(per) if len(per) > 1 else (math.nan, math.nan)
    odd = int(((share > 0) == byp).sum())
    text = (f"pruned on {int((~byp).sum())} of {len(byp)} prompts (bypass rate {float(per_b.mean()):.2f} over "
            f"{len(per_b)} clusters)")
    steps = g.loc[m, "bypass_step"][byp].value_counts() if "bypass_step" in g.columns else pd.Series(dtype=int)
    if len(steps):  # which step refused (workbench.analyse.bypass); the numbers are in the bypasses table
        text += "; refused by " + ", ".join(f"{k or 'unknown'} {v}" for k, v in steps.items())
    if odd:
        text += (f"; WARNING: on {odd} prompts the removed share and the bypass flag disagree (a bypass that removed "
                 "tokens, or a prune that removed none)")
    row = _descriptive("", PAPER, "removed share; bypass rate", "", "1 − retained_tokens / prompt_tokens",
                       n=len(per), prompts=len(share), mean=float(per.mean()), lo=lo, hi=hi,
                       note="descriptive: a preset that does not bypass removes its own target by construction, "
                       "and 'removed share > 0' and 'did not bypass' are one event (one row); " + text)
    return row, text


def conclusions(df: pd.DataFrame, leap: pd.DataFrame | None = None, ranks: pd.DataFrame | None = None, *,
                kept: pd.DataFrame | None = None, metric: str = "contains", level: float = 0.95,
                margin: float = DEFAULT_MARGIN, ruler=None) -> Conclusions:
    """The claims of the seed documents against a sweep frame ``df`` (and, when given, the per-prompt step-gain
    table ``leap``, the per-prompt priority rank table ``ranks`` and the answer-tokens-kept table ``kept``), each
    with a verdict by :data:`RULE`. ``margin``: the non-inferiority margin δ in ``[0, 1)`` (default
    :data:`DEFAULT_MARGIN`). ``ruler``: the RULER-style family names pooled for the DeferKV claim (default:
    :data:`workbench.study.ruler.RULER_TASKS`)."""
    margin = STATS_CHECKS["margin"].check("margin", margin)
    from_ruler = ruler if ruler is not None else RULER_TASKS
    leap, ranks, kept = (t if t is not None and len(t) else None for t in (leap, ranks, kept))
    ref, _ = fnd.reference_check(df, metric)
    comp = fnd.comparisons(df, metric, level=level, margin=margin)
    if "a" not in comp.columns:
        comp = pd.DataFrame(columns=["scope", "a", "b", "prompts"])
    rows, missing = [], []
    for part in (_deferkv(df, comp, ref, metric, level, set(from_ruler), margin),
                 _agnostic(comp, ref, metric, level, margin), _kept(kept, df, ref, level),
                 _leap(leap, df, ref, level), _ranks(ranks, df, ref, level),
                 _entroprefill(df, comp, ref, metric, level, margin)):
        rows += part[0]
        missing += part[1]
    return Conclusions(rows=tuple(rows), missing=tuple(missing), level=level, metric=metric, margin=margin)
