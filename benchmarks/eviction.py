"""KV eviction on the default model (issue 5): speed, scoring overhead, needle table, attention shift.

Parts (all by default):

- ``speed``: decode step time and KV bytes with budget ``B = T/4`` (SnapKV) against the full cache at
  ``T = 2048``, both from one prefill and timed alternately in one run (median over steps and reps).
- ``overhead``: scoring overhead of every policy relative to one plain prefill (``B = T/4``): the extra
  prefill time of its capture (rows, H2O column sums), the oracle's full-cache answer, scoring + selection
  and cache compaction, each run paired with a plain prefill just before it (median of the pairwise
  ratios); DeferKV's decode step 1 on the full cache is real work and is listed apart.
- ``needle``: the bundled needle-in-a-haystack prompt (``data/needle_haystack.json``, ~1.5k tokens, needle
  in the middle): answer and needle-token survival for every policy at budgets 128/256/512.
- ``shift``: the prefill-vs-first-decode shift (SPEC §9) on bundled prompts (the harbor-town example,
  the needle prompt, three SQuAD sample articles): top-``k`` recall of rows ``r = -1 … 3`` against the
  answer's mean attention, the gains ``0→1, 1→2, 2→3`` and the fraction of (layer, KV group) pairs
  with a boundary leap; with the SPEC reference (answer rows ``1 … m``) and a held-out one (``5 … m``).

    python benchmarks/eviction.py [--part speed overhead needle shift] [--T 2048] [--reps 2]

Prints markdown tables and writes ``benchmarks/out/eviction_<part>.json``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import _harness as harness
import pandas as pd

OUT = Path(__file__).parent / "out"


def markdown(df: pd.DataFrame, floatfmt: str = "{:.3g}") -> str:
    """A GitHub markdown table (no tabulate dependency)."""
    cols = list(df.columns)
    lines = ["| " + " | ".join(str(c) for c in cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            cells.append(floatfmt.format(v) if isinstance(v, float) else str(v).replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write(part: str, meta: dict, rows, out_dir: Path) -> None:
    path = harness.write_json(out_dir / f"eviction_{part}.json", dict(results=rows), **meta)
    print(f"wrote {path}\n", flush=True)


def _meta(**kw) -> dict:
    """The part's own settings, written beside the harness's metadata."""
    return dict(kw)


def _ids_of_length(tok, T: int) -> list[int]:
    """``T`` tokens of plain prose (the needle prompt's filler, repeated)."""
    d = json.loads((Path(__file__).resolve().parent.parent / "data" / "needle_haystack.json").read_text())
    text = " ".join(d["documents"]) + " "
    base = tok(text, add_special_tokens=False)["input_ids"]
    return (base * (T // len(base) + 1))[:T]


# ----------------------------------------------------------------------------- parts
def part_speed(lm, T: int, reps: int, steps: int) -> tuple[pd.DataFrame, list]:
    from workbench.rerun.eviction import EvictionSession, FullCache, Needs, SnapKV

    ids = _ids_of_length(lm.tokenizer, T)
    B = T // 4
    sess = EvictionSession.prepare(lm, ids, Needs(tail=32), steps + 1, reusable=True, progress=False)
    sess.run(SnapKV(), B)  # warm-up
    times = {"full": [], "snapkv": []}
    bytes_ = {}
    for _ in range(reps):  # alternate the two caches, reps times
        for pol, b in ((FullCache(), T), (SnapKV(), B)):
            r = sess.run(pol, b)
            times[pol.name] += r.step_s
            bytes_[pol.name] = (r.kv_bytes_before, r.kv_bytes_after)
    full_s, snap_s = statistics.median(times["full"]), statistics.median(times["snapkv"])
    rows = [
        dict(cache="full", T=T, budget=T, step_ms=1e3 * full_s, kv_mib=bytes_["full"][1] / 2**20, steps=len(times["full"])),
        dict(cache="SnapKV B=T/4", T=T, budget=B, step_ms=1e3 * snap_s, kv_mib=bytes_["snapkv"][1] / 2**20,
             steps=len(times["snapkv"])),
    ]
    df = pd.DataFrame(rows)
    df["step_ratio"] = df.step_ms / df.step_ms.iloc[0]
    df["kv_ratio"] = df.kv_mib / df.kv_mib.iloc[0]
    return df, rows


def part_overhead(lm, T: int, reps: int, steps: int) -> tuple[pd.DataFrame, list]:
    from workbench.rerun.eviction import FullCache, default_policies, generate_with_policy

    ids = _ids_of_length(lm.tokenizer, T)
    B = T // 4
    pols = [p for p in default_policies() if not isinstance(p, FullCache)]
    generate_with_policy(lm, ids, FullCache(), T, 1, progress=False)  # warm-up
    acc: dict[str, list[dict]] = {}
    for _ in range(reps):
        for p in pols:  # a plain prefill right before each policy's run: pairwise ratios cancel drift
            plain = generate_with_policy(lm, ids, FullCache(), T, 1, progress=False).timings["prefill"]
            n = steps if p.needs().answer else 2
            t = generate_with_policy(lm, ids, p, B, n, progress=False).timings
            extra = t["prefill"] - plain
            acc.setdefault(p.name, []).append(dict(
                plain=plain, prefill=t["prefill"], extra=extra, answer=t["answer"], score=t["score"],
                evict=t["evict"], defer=t["defer"],
                ratio=(extra + t["answer"] + t["score"] + t["evict"]) / plain))
    rows = []
    for name, ts in acc.items():
        med = {k: statistics.median(t[k] for t in ts) for k in ts[0]}
        rows.append(dict(policy=name, T=T, budget=B, plain_prefill_s=med["plain"], prefill_s=med["prefill"],
                         capture_extra_s=med["extra"], answer_s=med["answer"], score_s=med["score"],
                         evict_s=med["evict"], defer_step_s=med["defer"], overhead_vs_prefill=med["ratio"]))
    return pd.DataFrame(rows), rows


def part_needle(lm, budgets, n_new: int) -> tuple[pd.DataFrame, list, dict]:
    from workbench.rerun.eviction import default_policies, run_policies, survival_table, token_positions
    from workbench.run.examples import load_example

    ex = load_example("needle_haystack")
    prompt = ex.build(lm.tokenizer, max_context=lm.shape.max_context)
    needle = token_positions(prompt, lm.tokenizer, ex.answer)
    t0 = time.perf_counter()
    res = run_policies(lm, prompt, default_policies(), budgets, n_new, batch=True, progress=True)
    wall = time.perf_counter() - t0
    df = survival_table(res, needle, ex.answer)
    info = dict(T=prompt.T, needle_positions=needle, answer=ex.answer, n_new=n_new, wall_s=wall)
    return df, df.to_dict(orient="records"), info


def _shift_prompts(tok):
    from workbench.run.examples import load_example
    from workbench.run.prompt import build_prompt

    out = []
    for name in ("example_prompt", "needle_haystack"):
        ex = load_example(name)
        out.append((ex.task, ex.build(tok)))
    try:
        from workbench.study.datasets import load_squad

        for art in load_squad("sample")[:3]:
            paras = [p["context"] for p in art["paragraphs"]]
            q = art["paragraphs"][3]["qas"][0]["question"]
            out.append((f"squad:{art['title']}", build_prompt(tok, paras, q, answer_doc=3)))
    except Exception as e:  # the SQuAD sample is optional here
        print(f"(SQuAD sample prompts skipped: {e})")
    return out


def part_shift(lm, n_decode: int, k: int) -> tuple[pd.DataFrame, list]:
    from tqdm.auto import tqdm

    from workbench.analyse.shift import ShiftAnalysis
    from workbench.capture import RowSet, run_capture

    eos = lm.model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [eos])
    rows = []
    for name, prompt in tqdm(_shift_prompts(lm.tokenizer), desc="shift prompts"):
        cap = run_capture(lm, prompt, RowSet(observers=False, audit=None, tail=32, n_decode=n_decode), progress=False)
        gen = cap.generated_ids
        m = next((i for i, t in enumerate(gen) if t in eos), len(gen))  # answer tokens before EOS
        m = max(m, 5)
        text = lm.tokenizer.decode(gen[:m], skip_special_tokens=True).strip().replace("\n", " ")
        for ref_name, start in (("answer 1..m", 1), ("held-out 5..m", 5)):
            res = ShiftAnalysis(k=k, ref_start=start, ref_end=m)(cap)
            s = res.summary()
            for _, row in s.iterrows():
                rows.append(dict(prompt=name, T=prompt.T, m=m, reference=ref_name, level=row.level, k=res.k,
                                 **{c: float(row[c]) for c in s.columns if c.startswith(("recall_", "gain_", "jsd_"))},
                                 leap_fraction=float(row.leap_fraction), answer=text[:60]))
    return pd.DataFrame(rows), rows


# ----------------------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", nargs="+", default=["speed", "overhead", "needle", "shift"],
                    choices=["speed", "overhead", "needle", "shift"])
    ap.add_argument("--T", type=int, default=2048, help="prompt length for speed and overhead")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16, help="decode steps per timed run (and the oracle's answer)")
    ap.add_argument("--budgets", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--needle-tokens", type=int, default=20)
    ap.add_argument("--shift-decode", type=int, default=24)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--out-dir", default=str(OUT))
    a = ap.parse_args(argv)
    from workbench.run.models import load_model

    lm = load_model(progress=False)
    out_dir = Path(a.out_dir)
    pd.set_option("display.width", 250)
    if "speed" in a.part:
        df, rows = part_speed(lm, a.T, a.reps, a.steps)
        print(f"## Decode step and KV bytes, T = {a.T}, B = T/4 vs full cache\n\n{markdown(df)}\n")
        _write("speed", _meta(T=a.T, reps=a.reps, steps=a.steps), rows, out_dir)
    if "overhead" in a.part:
        df, rows = part_overhead(lm, a.T, a.reps, a.steps)
        print(f"## Scoring overhead relative to one plain prefill, T = {a.T}\n\n{markdown(df)}\n")
        _write("overhead", _meta(T=a.T, reps=a.reps, steps=a.steps), rows, out_dir)
    if "needle" in a.part:
        df, rows, info = part_needle(lm, a.budgets, a.needle_tokens)
        print(f"## Needle in a haystack, T = {info['T']}, needle tokens {info['needle_positions'][0]}.."
              f"{info['needle_positions'][-1]}\n\n{markdown(df)}\n")
        _write("needle", _meta(**info), rows, out_dir)
    if "shift" in a.part:
        df, rows = part_shift(lm, a.shift_decode, a.k)
        show = df[df.level == "group"].drop(columns=["level"])
        print(f"## Prefill-vs-first-decode shift (KV groups, k = {a.k})\n\n{markdown(show)}\n")
        _write("shift", _meta(n_decode=a.shift_decode, k=a.k), rows, out_dir)


if __name__ == "__main__":
    main()
