"""The study's tables for ``benchmarks/RESULTS.md``, from the study's parquet files: "What this study shows" (every
seed claim with its kind, MDE and verdict, :mod:`workbench.study.conclusions`, from ``study.parquet`` (and its worker
files ``study.w*.parquet``: the protocol cells) and, when present, ``study_leap.parquet``, ``study_ranks.parquet`` and
``study_kept.parquet``, with the calibration recomputed from ``study_calibration_cells.parquet`` and both splits
named from ``study_calibration_split.parquet``; also written as ``study_conclusions.parquet`` and as the opening
section of ``study_summary.md``), the calibration table, the run's size, the reference
check, accuracies (Wilson CIs) per task, the paired table against full context, kept-where-the-reference-
is-right, DeferKV against the other policies, EntroPrefill's decisions, prompt lengths, the cap, and a compact
timing table. No model call.

    python benchmarks/study_tables.py [--out-dir benchmarks/out]    # study_tables.md, study_timing.md, the claims
"""
import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as harness  # noqa: E402
import study  # noqa: E402

from workbench.study import findings  # noqa: E402
from workbench.study.conclusions import conclusions  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--out-dir", default=str(Path(__file__).parent / "out"))
od = Path(ap.parse_args().out_dir)
md = study.markdown
df = study.read_study(od / "study.parquet")
side = {name: pd.read_parquet(od / f"study_{name}.parquet") if (od / f"study_{name}.parquet").exists() else None
        for name in ("leap", "ranks", "kept")}
if side["kept"] is not None and "task" not in side["kept"].columns:
    side["kept"]["task"] = "squad_single"  # written before it had a task column: study.py measures it on SQuAD only
shows = conclusions(df, side["leap"], side["ranks"], kept=side["kept"])
split, cal_cells = study.read_calibration(od)
paragraph, cal = study.calibration_text(split, cal_cells, df, shows.margin) if split is not None else (None, None)
# the claims' table and the summary's opening section, regenerated from the same files (the verdicts follow the rule)
study.write_frame(od / "study_conclusions.parquet", shows.to_frame())
summary = od / "study_summary.md"
if summary.exists():
    text = summary.read_text()
    rest = text.index("\n## ", 1) if "\n## " in text[1:] else len(text)
    summary.write_text(study.opening(shows, paragraph) + "\n" + text[rest:])
out = [study.opening(shows, paragraph, "### What this study shows")]
if cal is not None:
    out += ["### Calibrate, then test (the calibration split's numbers per candidate preset)", md(cal.table)]
per = df.groupby("task").item_id.nunique().to_dict()
design = study.read_sweep(od / "study.parquet")  # the study's own grid; the worker files add the protocol cells
cells = design.groupby(["task", "item_id"]).size()
n_settings = len(design[["method", "params"]].drop_duplicates())  # every setting some prompt ran
failed = df[df.error.notna()]
why = failed.apply(findings.setting_label, axis=1).value_counts().sort_index() if len(failed) else pd.Series(dtype=int)
out.append(f"**The run:** cells {len(df)} ({len(design)} of the study's grid, {len(df) - len(design)} protocol cells: "
           f"query-agnostic and follow-up), errors {len(failed)}"
           + (" (" + ", ".join(f"{k} {v}" for k, v in why.items()) + ": " + "; ".join(sorted({e.split(': ', 1)[-1][:160] for e in failed.error})) + ")" if len(failed) else "")
           + f", prompts {per}, incomplete prompts of the grid {int((cells != n_settings).sum())}")
ref, warns = findings.reference_check(df)
out += ["### Reference check", md(ref), *[f"- {w}" for w in warns]]
acc = findings.accuracy_table(df)
acc["cell"] = acc.apply(lambda r: f"{r.right}/{r.n} ({r.accuracy:.2f} [{r.lo:.2f}, {r.hi:.2f}])", axis=1)
w = acc.pivot(index="setting", columns="task", values="cell")
loose = [s for s in w.index if s.startswith("entroprefill (")]
order = ["full", "entroprefill"] + loose + sorted(s for s in w.index if "@" in s)
w = w.loc[[s for s in order if s in w.index]].reset_index()
w["setting"] = w["setting"].replace({"entroprefill": "EntroPrefill paper", **{l: "EntroPrefill loose" for l in loose}})
out += ["### Accuracy (right/n, Wilson 95% CI)", md(w)]
comp = findings.comparisons(df)
comp["a"] = comp["a"].replace({"entroprefill": "EntroPrefill paper", **{l: "EntroPrefill loose" for l in loose}})
vs = comp[comp.b == "full"].copy()
vs["cell"] = vs.apply(lambda r: f"{r['diff']:+.2f} [{r.lo:+.2f}, {r.hi:+.2f}] {r.wins}/{r.ties}/{r.losses} p={r.p:.2g}"
                      + (" **worse**" if r.verdict == "A worse" else " **better**" if r.verdict == "A better" else ""), axis=1)
wv = vs.pivot(index="a", columns="scope", values="cell")
wv = wv.loc[[s for s in ["EntroPrefill paper", "EntroPrefill loose"] + sorted(x for x in wv.index if "@" in x) if s in wv.index]].reset_index()
out += ["### Paired against full context (difference [95% bootstrap CI], wins/ties/losses, McNemar p)", md(wv)]
cnt = vs.groupby("scope").verdict.value_counts().unstack(fill_value=0).reset_index()
out += [f"**Verdicts against full context, per scope** (of {vs.a.nunique()} settings)", md(cnt)]
cond = vs[vs.a.str.contains("EntroPrefill|@ ")][["scope", "a", "cond_n", "cond_right"]]
cond["cell"] = cond.apply(lambda r: f"{int(r.cond_right)}/{int(r.cond_n)}", axis=1)
out += ["### Kept right where full context is right", md(cond.pivot(index="a", columns="scope", values="cell").reset_index())]
dk = comp[comp.a.str.startswith("deferkv")].copy()
out += ["**DeferKV against every other policy at the same budget: verdicts**", md(dk.groupby("scope").verdict.value_counts().unstack(fill_value=0).reset_index())]
sel = dk[dk.b.str.startswith("snapkv")]
out += ["### DeferKV vs SnapKV", md(sel[["scope", "a", "b", "n", "diff", "lo", "hi", "wins", "ties", "losses", "p", "verdict"]])]
e = df[df.method == "entroprefill"].copy()
e["preset"] = e.params.map(lambda s: "paper" if s == "{}" else "loose")
e["kept_frac"] = e.retained_tokens / e.prompt_tokens
ep = e.groupby(["task", "preset"]).agg(n=("bypass", "size"), bypass=("bypass", "mean"),
                                      answer_chunk_removed=("answer_chunk_removed", "mean"), kept_frac=("kept_frac", "mean"),
                                      median_l_star=("l_star", lambda x: float(x[x >= 0].median()) if (x >= 0).any() else float("nan"))).reset_index()
out += ["### EntroPrefill decisions", md(ep)]
t = df.groupby("task").prompt_tokens.agg(["min", "median", "max"]).reset_index()
out += ["**Prompt tokens per task**", md(t)]
hc = df[df.method == "full"].groupby("task").hit_cap.mean().reset_index()
out += ["**Full-context replies that hit the `max_new_tokens` cap**", md(hc)]
harness.write_markdown(od / "study_tables.md", "\n\n".join(out))
print("\n\n".join(out))
# compact timing: prompts with one shared prefill and batched decoding
keep, one, paid = study.timed_prompts(df)
keep = keep & df.params.map(lambda s: "query" not in json.loads(s)).to_numpy()  # the query-aware cells only
tt = findings.timing_table(df[keep])
rows = []
for task, g in tt.groupby("task"):
    get = lambda name, col: float(g.loc[g.setting == name, col].iloc[0]) if (g.setting == name).any() else float("nan")
    evr = g[g.setting.str.contains(" @ ")]
    d = df[keep & (df.task == task).to_numpy() & (df.method == "evict").to_numpy()]
    sc = 1e3 * pd.to_numeric(d.score_s, errors="coerce").groupby(d.p_policy).mean()
    rows.append(dict(task=task, prompts=len(set(i for t, i in one if t == task)), full_s=get("full", "method_s"),
                     entroprefill_paper_s=get("entroprefill", "method_s"),
                     entroprefill_loose_s=float(g[g.setting.str.startswith("entroprefill (")].method_s.mean()),
                     shared_prefill_s=get("shared eviction prefill", "method_s"),
                     eviction_amortised_s=float(evr.amortised_s.mean()),
                     score_ms_min=f"{sc.min():.1f} ({sc.idxmin()})", score_ms_max=f"{sc.max():.1f} ({sc.idxmax()})"))
tab = pd.DataFrame(rows)
n_out = len(paid) - len(one)
timing_md = "\n\n".join([f"### Timing (1 thread per worker, two workers on the 2 cores; {len(one)} prompts whose evictions shared one prefill and decoded in batches, {n_out} earlier prompts left out)",
    "Rule: `amortised_s = method_s + shared_s / sharing` (the shared eviction prefill spread over the prompt's 30 eviction cells; "
    "batched, a cell's `method_s` is its plan's time / 30). `score_ms`: each policy's own scoring, mean per prompt, the "
    "cheapest and the dearest policy. Per-setting rows: `benchmarks/study_summary.md`.", md(tab)])
harness.write_markdown(od / "study_timing.md", timing_md)
print(timing_md)
