"""The evaluation study (issues 7 and 15): SQuAD v1.1 dev single-hop RAG prompts and a RULER-style grid on the
embedded default model, with paired statistics, the reference check and the leap-specificity table.

Resumable (finished cells in the parquet are skipped), so it can be stopped and continued. ``--worker W/N``
runs N processes side by side (one per free core): each claims one prompt at a time (a claim file per
prompt under ``out/.<stem>.claims/`` holding W), writes its own parquet (``<stem>.parquet`` for W = 0,
``<stem>.w<W>.parquet`` otherwise) and, restarted, finishes the prompts it had claimed; the summary reads them
all (one prompt's cells are always in one file):

    python -m workbench.study.datasets fetch          # once: SQuAD dev and the essays, checksummed
    python benchmarks/study.py                        # the full study (hours of CPU): 100 SQuAD prompts and
                                                      # 4 RULER families x 3 lengths x 10 seeds
    python benchmarks/study.py --worker 1/2 &         # ... or two workers side by side: 0/2 and 1/2
    python benchmarks/study.py --worker 0/2
    python benchmarks/study.py --n-squad 2 --ruler-seeds 1 --ruler-lengths 1024 --data sample \\
        --policies snapkv --leap-prompts 2 --out /tmp/study_smoke.parquet     # a smoke run, minutes

Methods: full context; EntroPrefill at the default ("paper") preset and the "loose" preset (adaptive);
every eviction policy at 25 % and 50 % of the prompt (decoded in batches from the prompt's shared prefill,
the sweep runs a prompt's ``evict`` cells together, ``methods.evict_cells``; a per-head budget decodes alone). Each family decodes its own ``max_new_tokens``
(``tasks.TASK_MAX_NEW_TOKENS``). Writes beside the parquet ``<stem>_summary.md``, opening with "What this study
shows" (:mod:`workbench.study.conclusions`: every seed claim with n, effect, CI, p and a verdict; its rows also in
``<stem>_conclusions.parquet``, and what it stands on in ``<stem>_leap.parquet``, the per-prompt step gains, and
``<stem>_ranks.parquet``, the per-prompt answer-chunk ranks, so that ``study_tables.py`` regenerates it without a
model), then the reference check,
accuracies with Wilson CIs, one finding per comparison (paired: wins/ties/losses, McNemar, bootstrap CI),
the timing rule's table, the leap-specificity table (every adjacent step's recall gain across
``--leap-prompts`` SQuAD prompts, held-out reference) and, on the same prompts' captures, the answer chunk's rank
under the Rényi, mass-only, ζ = 1, per-head-max and uniform priorities (paired against Rényi), and on
``--kept-prompts`` SQuAD prompts the share of the gold answer's tokens that DeferKV and SnapKV keep at the study's
two budgets (paired; rows in ``<stem>_kept.parquet``), and full context again on the SQuAD prompts at
``--cap-tokens`` new tokens (``<stem>_cap<N>.parquet``): how many right answers the study's cap cut off.
"""
from __future__ import annotations

import argparse
import io
import os
import time
import warnings
from pathlib import Path

import _harness as harness
import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench.analyse.params import PRESETS
from workbench.rerun.eviction import POLICY_BY_NAME
from workbench.util import atomic_write_bytes

POLICIES = sorted(set(POLICY_BY_NAME) - {"full"})
RULER = ["niah_single", "niah_multikey", "variable_tracking", "common_words"]


def methods(policies) -> list:
    return [("full", {}),
            ("entroprefill", {}),                                  # the "paper" preset = the defaults
            ("entroprefill", dict(PRESETS["loose"]["params"])),
            ("evict", {"policy": list(policies), "budget_frac": [0.25, 0.5]})]


def build_items(a, tokenizer, max_context: int = 8192) -> list:
    from workbench.study import datasets, ruler, tasks

    src = "cache" if a.data == "fetched" else "sample"
    items = tasks.squad_single(datasets.load_squad(src), n=a.n_squad, n_distractors=3, seed=0) if a.n_squad else []
    if a.ruler_seeds:
        items += ruler.ruler_grid(tokenizer, a.ruler, lengths=a.ruler_lengths, seeds=range(a.ruler_seeds),
                                  max_context=min(8192, max_context))
    return items


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


def leap_rows(results, items) -> pd.DataFrame:
    """The per-prompt step gains behind ``step_gains`` / ``leap_specificity``: one row per (prompt, adjacent step the
    reference cannot favour), ``task, item_id, meta_cluster, r_from, r_to, gain`` (the prompt's mean gain over layers
    and KV groups, exactly what those two functions average), ``items[i]`` being the prompt of ``results[i]``."""
    rows = []
    for it, res in zip(items, results):
        sf = res.step_frame()
        g = sf[(sf.level == "group") & sf.clear].groupby(["r_from", "r_to"])["gain"].mean()
        rows += [dict(task=it.task, item_id=it.item_id, meta_cluster=it.meta.get("cluster"), r_from=int(a),
                      r_to=int(b), gain=float(v)) for (a, b), v in g.items()]
    return pd.DataFrame(rows, columns=["task", "item_id", "meta_cluster", "r_from", "r_to", "gain"])


def write_frame(path: Path, df: pd.DataFrame) -> None:
    """``df`` as parquet at ``path``, atomically."""
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


def prompt_analyses(lm, items, n: int):
    """On ``n`` prompts, one capture each (observers, a tail of 8, 12 decode rows): every adjacent step's
    recall gain the reference cannot favour (held-out reference: decode rows 6 … 12, behind a gap of two rows) and the answer chunk's rank under each priority of
    :data:`PRIORITY_VARIANTS`. Returns ``(step gains, leap Paired, rank frame, per-prompt step gains)``; the first
    two are None when no prompt has enough decode rows (and the last is then empty)."""
    from workbench.analyse.params import EntroPrefillParams
    from workbench.analyse.procedure import trace
    from workbench.analyse.shift import HELD_OUT_AFTER, HELD_OUT_GAP, ShiftAnalysis, leap_specificity, step_gains
    from workbench.capture import RowSet, run_capture

    res, ranks, used = [], [], []
    for it in tqdm(items[:n], desc="leap and priority captures", unit="prompt"):
        prompt = it.build(lm.tokenizer, max_context=lm.shape.max_context)
        cap = run_capture(lm, prompt, RowSet(tail=8, n_decode=12), progress=False)
        if len(cap.rows_of("decode")) > HELD_OUT_AFTER + HELD_OUT_GAP:  # a held-out reference behind the gap
            res.append(ShiftAnalysis(k=32)(cap))
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


def priority_findings(ranks: pd.DataFrame) -> list[str]:
    """The standing table and one paired finding per priority against Rényi. Standing = ``k + 1 − rank``
    (``k``: removed last, 1: removed first), so that a win is a prompt where the priority keeps the answer
    chunk longer than Rényi does."""
    from workbench.analyse.stats import paired

    if ranks.empty:
        return []
    k = int(ranks["k"].iloc[0])
    wide = (k + 1 - ranks.pivot(index="item_id", columns="priority", values="rank")).dropna()
    table = pd.DataFrame([dict(priority=c, n=len(wide), standing=wide[c].mean(), top=float((wide[c] >= k).mean()))
                          for c in PRIORITY_VARIANTS if c in wide])
    metric = f"answer-chunk standing k + 1 − rank, k = {k}, mean over layers; higher = kept longer"
    out = [markdown(table)]
    for c in PRIORITY_VARIANTS:
        if c != "renyi" and c in wide:
            out.append("- " + paired(wide[c].to_numpy(), wide["renyi"].to_numpy()).finding(c, "renyi", metric))
    return out


KEPT_PAIRS = (("deferkv", "snapkv"),)  # claim 1's second half: DeferKV keeps more of the answer's tokens
KEPT_FRACS = (0.25, 0.5)               # the study's two budgets


def answer_kept(lm, items, n: int, pairs=KEPT_PAIRS, fracs=KEPT_FRACS) -> pd.DataFrame:
    """On ``n`` prompts: the share of the gold answer's tokens (its occurrence in the gold passage) that each
    policy of ``pairs`` keeps at each budget fraction, mean over compacted layers and KV heads: exactly the
    study's ``evict`` cells' eviction (same policies and budgets; DeferKV after its first decode step), from one
    shared prefill per prompt and two decode steps. One row per (prompt, policy, budget_frac)."""
    from workbench.rerun.eviction import EvictionSession, Needs, policy_from_params, resolve_budget, token_positions

    names = sorted({p for pair in pairs for p in pair})
    pols = {p: policy_from_params(p, seed=0) for p in names}
    need = Needs.of(pols.values())
    rows, skipped = [], []
    for it in tqdm(items[:n], desc="answer tokens kept", unit="prompt"):
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
    return pd.DataFrame(rows)


def kept_findings(kept: pd.DataFrame, pairs=KEPT_PAIRS) -> list[str]:
    """The mean share kept per policy and budget, and one paired finding per pair and budget."""
    from workbench.analyse.stats import paired

    if kept.empty:
        return []
    table = (kept.groupby(["policy", "budget_frac"]).agg(n=("kept", "size"), kept=("kept", "mean"))
             .reset_index())
    out = [markdown(table)]
    metric = "share of the gold answer's tokens kept, mean over compacted layers and KV heads"
    for f, d in kept.groupby("budget_frac"):
        wide = d.pivot(index="item_id", columns="policy", values="kept").dropna()
        for a, b in pairs:
            if a in wide and b in wide:
                out.append("- " + paired(wide[a].to_numpy(), wide[b].to_numpy()).finding(
                    f"{a} @ {f:g}", f"{b} @ {f:g}", metric))
    return out


def cap_check(lm, items, df: pd.DataFrame, out: Path, cap: int) -> list[str]:
    """Full context again on ``items`` with ``cap`` new tokens (resumable parquet ``out``), against the study's
    own full-context cells: how many right answers the study's cap cut off. Greedy decoding makes the first
    tokens of the longer reply those of the shorter one, so a win is an answer that came after the study's cap.
    """
    from workbench.analyse.stats import paired
    from workbench.study.sweep import sweep

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


def worker_arg(text: str) -> tuple[int, int]:
    """``"W/N"`` → ``(W, N)`` with ``0 <= W < N``."""
    try:
        w, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--worker: expected W/N (e.g. 0/2), got {text!r}") from None
    if not 0 <= w < n:
        raise argparse.ArgumentTypeError(f"--worker: need 0 <= W < N, got {text!r}")
    return w, n


def claim_name(task: str, item_id: str) -> str:
    """A file name for one prompt's claim."""
    return f"{task}__{item_id}".replace(os.sep, "_")


def claim(path: Path, w: int) -> bool:
    """Claim one prompt for worker ``w``: create ``path`` holding ``w`` (atomic, ``O_EXCL``), or find it
    already holding ``w`` (a restarted worker finishes its own prompts)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return path.read_text().strip() == str(w)
    with os.fdopen(fd, "w") as fh:
        fh.write(str(w))
    return True


def worker_files(out: Path) -> list[Path]:
    """The parquet files of every worker that has written (``out`` itself for worker 0)."""
    return [p for p in [out, *sorted(out.parent.glob(f"{out.stem}.w*{out.suffix}"))] if p.exists()]


def read_study(out: Path) -> pd.DataFrame:
    """Every worker's rows, one frame; a cell in two worker files is refused."""
    from workbench.study.sweep import read_sweep

    parts = worker_files(out)
    df = pd.concat([read_sweep(p) for p in parts], ignore_index=True)
    dup = df["cell"].duplicated()
    if dup.any():
        raise RuntimeError(f"{int(dup.sum())} cells appear in two worker files ({[str(p) for p in parts]})")
    return df


def timed_prompts(df: pd.DataFrame):
    """``(row mask, prompt index, paid per prompt)``: the prompts whose evictions shared one prefill and decoded
    in batches, the ones the timing rule holds for."""
    ev = df[df["method"] == "evict"]
    paid = ev.groupby(["task", "item_id"])["shared_paid"].apply(lambda s: int(s.fillna(False).astype(bool).sum()))
    batched = ev.groupby(["task", "item_id"])["batched"].max()
    one = paid[(paid == 1) & (batched.reindex(paid.index) > 1)].index
    return df.set_index(["task", "item_id"]).index.isin(one), one, paid


def timing(df: pd.DataFrame, timing_table) -> list[str]:
    """The timing section on the prompts whose evictions shared one prefill (``shared_paid`` once): the first
    prompts of the study ran before the shared session held every policy's evidence (five prefills each, the
    rule's ``shared_s / sharing`` would not hold for them) and before batched decoding."""
    from workbench.study.findings import with_settings

    keep, one, paid = timed_prompts(df)
    head = ("## Timing (rule: amortised_s = method_s + shared_s / sharing) on the "
            f"{len(one)} prompts whose evictions shared one prefill and decoded in batches")
    n_out = len(paid) - len(one)
    note = (f"- {n_out} prompts left out of this table: they ran before the shared session held every policy's "
            "evidence (several prefills per prompt) or before batched decoding; their answers are in every other "
            "table. Batched, every planned cell's `method_s` is the plan's time / the settings it decodes (the same "
            "for every policy of a prompt); `score_s` (below) is each policy's own scoring." if n_out else
            "- every prompt's evictions shared one prefill and decoded in batches.")
    d = with_settings(df[keep & (df["method"] == "evict").to_numpy()])
    score = (d.assign(score_s=pd.to_numeric(d["score_s"], errors="coerce")).groupby(["task", "setting"])
             .agg(n=("score_s", "size"), score_ms=("score_s", lambda x: 1e3 * x.mean())).reset_index())
    return [head, markdown(timing_table(df[keep])), note,
            "Each policy's own scoring time (`score_s`, mean ms; the same prompts)", markdown(score)]


def markdown(df: pd.DataFrame) -> str:
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-squad", type=int, default=100)
    ap.add_argument("--data", choices=("fetched", "sample"), default="fetched")
    ap.add_argument("--ruler", nargs="*", default=RULER)
    ap.add_argument("--ruler-lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--ruler-seeds", type=int, default=10)
    ap.add_argument("--policies", nargs="+", default=POLICIES)
    ap.add_argument("--leap-prompts", type=int, default=33)
    ap.add_argument("--cap-tokens", type=int, default=64,
                    help="full context again on the SQuAD prompts with this many new tokens (0: skip)")
    ap.add_argument("--kept-prompts", type=int, default=100,
                    help="SQuAD prompts for the answer-tokens-kept comparison (DeferKV vs SnapKV; 0: skip)")
    ap.add_argument("--model", default=None,
                    help="a research model's short name (qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), a local HF folder "
                         "(default: the embedded SmolLM2)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "study.parquet"))
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: fastest on the shared 2-core machine)")
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument("--worker", type=worker_arg, default=(0, 1), metavar="W/N",
                    help="this process is worker W of N (0 <= W < N): it claims prompts one at a time")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from workbench.run.models import load_model
    from workbench.study import findings
    from workbench.study.conclusions import conclusions
    from workbench.study.sweep import sweep
    from workbench.study.tasks import max_new_tokens_for

    out = Path(a.out)
    lm = load_model(a.model, progress=False)
    items = build_items(a, lm.tokenizer, lm.shape.max_context)
    w, n_workers = a.worker
    if not a.summary_only:
        t0 = time.perf_counter()
        mine = out if w == 0 else out.with_name(f"{out.stem}.w{w}{out.suffix}")
        claims = out.with_name(f".{out.stem}.claims")
        claims.mkdir(parents=True, exist_ok=True)
        for part in worker_files(out):  # prompts with rows already belong to that file's worker
            owner = 0 if part == out else int(part.stem.rsplit(".w", 1)[1])
            for task, item_id in pd.read_parquet(part, columns=["task", "item_id"]).drop_duplicates().itertuples(
                    index=False):
                claim(claims / claim_name(task, item_id), owner)
        for it in tqdm(items, desc=f"study worker {w}/{n_workers}", unit="prompt"):
            if n_workers > 1 and not claim(claims / claim_name(it.task, it.item_id), w):
                continue
            sweep(lm, [it], methods(a.policies), out=mine, max_new_tokens=max_new_tokens_for(it.task),
                  on_error="record", checkpoint_s=30, progress=False)
        print(f"worker {w}/{n_workers}: sweep done in {time.perf_counter() - t0:.0f} s")
        if n_workers > 1:
            print("the other workers may still run: write the summary with --summary-only when all have finished")
            return
    df = read_study(out)
    ref, warns = findings.reference_check(df)
    comp = findings.comparisons(df)
    parts = ["## Reference check", markdown(ref), *[f"- **{msg}**" for msg in warns],
             "## Accuracy (contains, Wilson 95% CI)", markdown(findings.accuracy_table(df)),
             "## Findings", *[f"- {s}" for s in comp["finding"]],
             *timing(df, findings.timing_table)]
    squad = [it for it in items if it.task == "squad_single"]
    leap = ranks = kept = None
    if a.leap_prompts and squad:
        steps, lp, ranks, leap = prompt_analyses(lm, squad, a.leap_prompts)
        write_frame(out.with_name(out.stem + "_leap.parquet"), leap)
        write_frame(out.with_name(out.stem + "_ranks.parquet"), ranks)
        if steps is not None:
            parts += ["## Leap specificity (recall gain per adjacent step, mean over KV groups and layers, "
                      "held-out reference)", markdown(steps), "- " + lp.finding("0→1", "−1→0", "recall gain")]
        pf = priority_findings(ranks)
        if pf:
            parts += ["## The answer chunk's standing under each priority (paper preset, every monitored layer; "
                      "standing k + 1 − rank: k = removed last; `top`: share of prompts where it ranks first at every "
                      "layer)", *pf]
    if a.kept_prompts and squad:
        kept = answer_kept(lm, squad, a.kept_prompts)
        write_frame(out.with_name(out.stem + "_kept.parquet"), kept)
        parts += ["## The gold answer's tokens kept (SQuAD; the study's DeferKV and SnapKV evictions, "
                  "one shared prefill per prompt)", *kept_findings(kept)]
    if a.cap_tokens and squad:
        parts += [f"## Did the cap cut answers off? (SQuAD, full context at {a.cap_tokens} new tokens)",
                  *cap_check(lm, squad, df, out.with_name(f"{out.stem}_cap{a.cap_tokens}.parquet"), a.cap_tokens)]
    # the summary opens with what the study shows: every seed claim with its verdict, from the tables above
    shows = conclusions(df, leap, ranks, kept=kept)
    write_frame(out.with_name(out.stem + "_conclusions.parquet"), shows.to_frame())
    parts.insert(0, shows.markdown())
    md = "\n\n".join(parts)
    print(md)
    harness.write_markdown(out.with_name(out.stem + "_summary.md"), md)


if __name__ == "__main__":
    main()
