"""The eviction field on one bench (issue 16): every policy and budget allocation at B = 128/256/512.

Prompts: the bundled needle prompt (``data/needle_haystack.json``, ~1.5k tokens) and ``--contexts`` SQuAD
contexts from the bundled sample (``data/squad_sample.json``): each context is one article's gold
paragraph plus ``--distractors`` other paragraphs of the same article (~0.8–1.1k tokens), asked
``--questions`` questions about its gold paragraph (4 × 5 = 20 SQuAD prompts by default).

For each policy and budget (greedy, ``--new`` tokens):
- ``acc``: the answer contains a gold answer (case-insensitive), over the 20 SQuAD prompts (question-aware:
  the whole prompt prefilled, then evicted); ``agnostic_acc``: the same questions answered from one
  compressed cache per context, compressed *without* the question (``run_question_agnostic``);
- ``needle``: the needle prompt answered (contains the password) and the needle tokens' survival (mean over
  compacted layers and KV heads); ``answer_kept``: survival of the gold answer's tokens in the SQuAD contexts;
- ``kv_MiB``: cache bytes after eviction (mean over prompts; per-head budgets hold each layer's largest head
  count, ``masked_MiB`` of it masked), against the full cache's;
- ``score/prefill``: scoring + selection time over the time of one prefill of the same prompt (mean; the
  policy's memoised scores are cleared before each run, so wrappers pay for their base's scores).

Runs with equal cache lengths are decoded in batches of 8 (``EvictionSession.continue_batch``: equal to single
runs up to float rounding); runs with a count per layer are decoded alone.

    python benchmarks/eviction_field.py [--budgets 128 256 512] [--contexts 4] [--questions 5] [--new 16] [--distractors 6]
        [--no-squad] [--no-needle]

Prints a markdown table and writes ``benchmarks/out/eviction_field.json``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import _harness as harness
import pandas as pd
import torch
from eviction import markdown  # benchmarks/eviction.py (the script's folder is on the path)
from tqdm.auto import tqdm

from workbench.analyse.stats import fmt_ci, wilson_ci
from workbench.rerun.eviction import (
    H2O,
    TOVA,
    AdaKV,
    CriticalKV,
    DeferKV,
    EntroBudget,
    EvictionSession,
    ExpectedAttention,
    FullCache,
    KeyDiff,
    KNorm,
    Needs,
    OracleKV,
    PageEntroKV,
    PyramidKV,
    RandomKV,
    SnapKV,
    StreamingLLM,
    run_question_agnostic,
    token_positions,
)
from workbench.run.examples import load_example
from workbench.run.models import load_model
from workbench.run.prompt import build_prompt
from workbench.study.datasets import load_squad
from workbench.study.metrics import contains_answer, f1_score
from workbench.study.tasks import max_new_tokens_for

OUT = Path(__file__).parent / "out"
INSTRUCTION = "Answer the question using only the documents. Reply with a short answer."


def policies():
    """(group, label, policy): every policy and budget allocation, on the workbench's one footing
    (4 sinks, 32 recent positions protected)."""
    snap = SnapKV()
    return [
        ("reference", "full", FullCache()),
        ("reference", "oracle", OracleKV()),
        ("reference", "random", RandomKV()),
        ("attention-free", "streaming", StreamingLLM()),
        ("attention-free", "knorm", KNorm()),
        ("attention-free", "keydiff", KeyDiff()),
        ("attention-based", "h2o (sum)", H2O()),
        ("attention-based", "h2o mean observed", H2O(normalise="mean")),
        ("attention-based", "tova", TOVA()),
        ("attention-based", "snapkv max", snap),
        ("attention-based", "snapkv avg", SnapKV(pooling="avg", kernel=5)),
        ("attention-based", "page-entrokv", PageEntroKV()),
        ("attention-based", "criticalkv(snapkv)", CriticalKV(base=snap)),
        ("forecast", "expected-attention", ExpectedAttention()),
        ("forecast", "deferkv", DeferKV()),
        ("budgets", "pyramidkv(snapkv)", PyramidKV(base=snap)),
        ("budgets", "adakv(snapkv)", AdaKV(base=snap)),
        ("budgets", "entro-budget(snapkv)", EntroBudget(base=snap)),
    ]


def squad_contexts(tok, n_ctx: int, n_q: int, n_dist: int, max_context: int, data: str = "sample"):
    """``n_ctx`` contexts (gold paragraph + ``n_dist`` same-article paragraphs, seeded order), each with up
    to ``n_q`` prompts (one per question on the gold paragraph whose answer occurs in it). ``data``:
    ``"sample"`` (the bundled 4 articles) or ``"fetched"`` (SQuAD v1.1 dev, ``python -m workbench.study.datasets
    fetch``)."""
    out = []
    for art in load_squad("sample" if data == "sample" else "cache")[:n_ctx]:
        paras = art["paragraphs"]
        gold = paras[0]
        docs = [p["context"] for p in paras[1:1 + n_dist]] + [gold["context"]]
        g = torch.Generator().manual_seed(len(out))
        docs = [docs[i] for i in torch.randperm(len(docs), generator=g).tolist()]
        pos = docs.index(gold["context"])
        qs = [qa for qa in gold["qas"] if any(a["text"] in gold["context"] for a in qa["answers"])][:n_q]
        prompts = [(build_prompt(tok, docs, qa["question"], INSTRUCTION, answer_doc=pos, max_context=max_context),
                    sorted({a["text"] for a in qa["answers"]})) for qa in qs]
        out.append(prompts)
    return out


def correct(text, answers) -> bool:
    """The study's scorer: a gold answer occurs in the normalised reply (any line)."""
    return bool(contains_answer(text or "", answers))


def run_prompt(model, prompt, pols, budgets, n_new, answers, survive_text):
    """Every policy at every budget from one prefill; one row per (policy, budget)."""
    needs = Needs.of(p for _, _, p in pols)
    t0 = time.perf_counter()
    plain = EvictionSession.prepare(model, prompt, Needs(), 1, reusable=False, progress=False)
    prefill_s = plain.timings["prefill"]
    del plain
    sess = EvictionSession.prepare(model, prompt, needs, n_new, reusable=True, progress=False)
    pos = token_positions(prompt, model.tokenizer, survive_text) if survive_text else None
    rows, jobs, states = [], [], []
    for group, label, p in pols:
        for B in (budgets[:1] if p.keeps_all else budgets):
            sess.evidence.forget_scores()  # each run pays for its own (and its base's) scores
            jobs.append((group, label, p, B))
            states.append(sess.evict(p, B))
    # decode: runs with equal cache lengths batched (equal to single runs up to float rounding), at most 8 in a
    # batch (memory), a count per layer alone
    res = sess.continue_batch(states, batch_size=8)
    for (group, label, p, B), r in zip(jobs, res):
        surv = float(r.survival(pos).nanmean()) if pos else float("nan")
        rows.append({"group": group, "policy": label, "budget": "all" if p.keeps_all else B, "T": sess.T,
                     "correct": correct(r.text, answers), "f1": f1_score(r.text or "", answers), "survival": surv,
                     "kv_MiB": r.kv_bytes_after / 2**20, "masked_MiB": r.kv_bytes_masked / 2**20,
                     "score_over_prefill": r.timings["score"] / prefill_s, "text": r.text})
    return rows, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--contexts", type=int, default=4)
    ap.add_argument("--questions", type=int, default=5)
    ap.add_argument("--distractors", type=int, default=6)
    ap.add_argument("--new", type=int, default=None,
                    help="new tokens (default: each task's own, workbench.study.tasks.max_new_tokens_for)")
    ap.add_argument("--data", choices=("sample", "fetched"), default="sample")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-needle", action="store_true")
    ap.add_argument("--no-squad", action="store_true", help="the needle prompt only")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    n_squad = args.new or max_new_tokens_for("squad_single")
    n_needle = args.new or max_new_tokens_for("needle")
    m = load_model(device="cpu", progress=False)
    tok, mc = m.tokenizer, m.shape.max_context
    pols = policies()
    rows = []
    ctxs = [] if args.no_squad else squad_contexts(tok, args.contexts, args.questions, args.distractors, mc, args.data)
    jobs = [(c, q) for c, prompts in enumerate(ctxs) for q in range(len(prompts))]
    # resumable: finished prompts' rows are appended to a JSONL beside the output and skipped on a re-run
    part = OUT / f"eviction_field_{args.data}_{n_squad}_{'-'.join(map(str, args.budgets))}.partial.jsonl"
    OUT.mkdir(exist_ok=True)
    done = [json.loads(x) for x in part.read_text().splitlines()] if part.exists() else []
    finished = {(r["task"], r["item"]) for r in done}
    rows += done

    def keep(new_rows):
        with open(part, "a") as f:
            f.writelines(json.dumps(x, default=str) + "\n" for x in new_rows)
        rows.extend(new_rows)

    for c, q in tqdm(jobs, desc="squad (question-aware)"):
        if ("squad", f"{c}.{q}") in finished:
            continue
        prompt, answers = ctxs[c][q]
        r, _ = run_prompt(m, prompt, pols, args.budgets, n_squad, answers, answers[0] if answers[0] in prompt.text else None)
        keep([dict(x, task="squad", item=f"{c}.{q}") for x in r])
    agn = [(g, lbl, p) for g, lbl, p in pols if not p.defer and not p.needs().answer]
    for c, prompts in enumerate(tqdm(ctxs, desc="squad (question-agnostic)")):
        if ("agnostic", f"{c}.0") in finished:
            continue
        new_rows = []
        res = run_question_agnostic(m, [p for p, _ in prompts], [p for _, _, p in agn], args.budgets, n_squad,
                                    progress=False)
        k = 0
        for g, lbl, p in agn:
            for B in (args.budgets[:1] if p.keeps_all else args.budgets):
                for q, (_, answers) in enumerate(prompts):
                    new_rows.append({"group": g, "policy": lbl, "budget": "all" if p.keeps_all else B, "task": "agnostic",
                                 "item": f"{c}.{q}", "correct": correct(res[k].text, answers), "text": res[k].text,
                                 "kv_MiB": res[k].kv_bytes_after / 2**20})
                    k += 1
        keep(new_rows)
    if not args.no_needle and ("needle", "needle") not in finished:
        ex = load_example("needle_haystack")
        prompt = ex.build(tok, max_context=mc)
        needle = json.loads((Path(__file__).resolve().parents[1] / "data" / "needle_haystack.json").read_text())["needle"]
        r, _ = run_prompt(m, prompt, pols, args.budgets, n_needle, [ex.answer], needle)
        keep([dict(x, task="needle", item="needle") for x in r])
    df = pd.DataFrame(rows)
    OUT.mkdir(exist_ok=True)
    harness.write_json(OUT / ("eviction_field_needle.json" if args.no_squad else "eviction_field.json"), {"rows": rows},
                       indent=1, args=vars(args), new_tokens={"squad": n_squad, "needle": n_needle},
                       wall_s=time.perf_counter() - t_start)
    print(markdown(summary(df)))
    return 0


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (policy, budget): SQuAD accuracy with its Wilson 95 % CI and n, the accuracy on the prompts
    the full cache answers right (``acc_if_ref``: the reference check), the question-agnostic accuracy, and the
    needle."""
    key = ["group", "policy", "budget"]
    if not (df.task == "squad").any():  # the needle prompt only
        return df.rename(columns={"correct": "needle_ok", "survival": "needle_kept"})[
            key + ["needle_ok", "needle_kept", "kv_MiB", "masked_MiB", "score_over_prefill"]].round(3)
    sq_df = df[df.task == "squad"]
    ref_ok = set(sq_df[(sq_df.policy == "full") & sq_df.correct].item)
    sq = sq_df.groupby(key, sort=False).agg(
        acc=("correct", "mean"), k=("correct", "sum"), f1=("f1", "mean"), n=("correct", "size"), answer_kept=("survival", "mean"),
        kv_MiB=("kv_MiB", "mean"), masked_MiB=("masked_MiB", "mean"), score_over_prefill=("score_over_prefill", "mean"))
    sq["acc_ci95"] = [fmt_ci(*wilson_ci(int(k), int(n))) for k, n in zip(sq.k, sq.n)]
    sq["acc_if_ref"] = sq_df[sq_df.item.isin(ref_ok)].groupby(key, sort=False).correct.mean()
    sq = sq.drop(columns="k")
    ag = df[df.task == "agnostic"].groupby(key, sort=False).agg(agnostic_acc=("correct", "mean"))
    nd = df[df.task == "needle"].set_index(key)[["correct", "survival"]].rename(
        columns={"correct": "needle_ok", "survival": "needle_kept"})
    out = sq.join(ag, how="left").join(nd, how="left").reset_index()
    cols = key + ["acc", "acc_ci95", "n", "acc_if_ref", "f1", "agnostic_acc", "answer_kept", "needle_ok", "needle_kept",
                  "kv_MiB", "masked_MiB", "score_over_prefill"]
    return out[cols].round(3)

if __name__ == "__main__":
    raise SystemExit(main())
