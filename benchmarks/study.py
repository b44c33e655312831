"""The evaluation study (SQuAD v1.1 dev single-hop RAG prompts and a RULER-style grid, paired statistics, the
reference check, the leap and the priorities): a thin caller of ``python -m workbench report``, which runs every
part of it (:mod:`workbench.study.report`, :mod:`workbench.study.report_analyses`), plus the study's file layout
that ``benchmarks/study_tables.py`` regenerates its tables from without a model.

    python -m workbench.study.datasets fetch          # once: SQuAD dev and the essays, checksummed
    python benchmarks/study.py                        # the full study (hours of CPU)
    python benchmarks/study.py --n-squad 2 --ruler-seeds 1 --ruler-lengths 1024 --data sample \\
        --policies snapkv deferkv --leap-prompts 2 --kept-prompts 2 --cap-tokens 0 --out /tmp/study_smoke.parquet

The same study from the command line (the flags map one to one; ``--out X/study.parquet`` is the report folder
``X/study/``)::

    python -m workbench report --n-squad 100 --n-needle 0 --ruler niah_single niah_multikey variable_tracking \\
        common_words --ruler-lengths 1024 2048 4096 --ruler-seeds 10 --presets paper,loose \\
        --budget-fracs 0.25 0.5 --leap-prompts 33 --kept-prompts 100 --cap-tokens 64 --out X/study

Flags: ``--n-squad``, ``--data``, ``--ruler``, ``--ruler-lengths``, ``--ruler-seeds``, ``--policies``, ``--model``,
``--threads`` as the report's; ``--leap-prompts``, ``--kept-prompts`` are now per task, on every family the study runs
(they were SQuAD only); ``--cap-tokens`` checks every prompt. ``--summary-only`` writes the layout below from a
finished report folder without a model call. ``--worker W/N`` is gone: the report runs in one process and resumes
from its own parquet (a run stopped halfway continues where it stopped).

Beside ``--out`` (``<stem>.parquet``, the sweep's cells) it writes ``<stem>_leap.parquet``, ``<stem>_ranks.parquet``,
``<stem>_kept.parquet`` (the per-prompt tables), ``<stem>_conclusions.parquet`` and ``<stem>_summary.md``, opening
with "What this study shows", then the reference check, accuracies, findings and the analyses' findings.
The helpers below read that layout (several workers' parquet files, as the shipped ``study_q05`` has) for
``study_tables.py``.
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
from pathlib import Path

import _harness as harness
import pandas as pd

from workbench.rerun.eviction import POLICY_BY_NAME
from workbench.study import findings
from workbench.study.conclusions import conclusions
from workbench.study.markdown_table import markdown
from workbench.study.report import ReportConfig, run_report
from workbench.study.sweep import read_sweep
from workbench.util import atomic_write_bytes

__all__ = ["markdown", "write_frame", "worker_files", "read_study", "timed_prompts", "parse", "config", "write_layout"]

POLICIES = sorted(set(POLICY_BY_NAME) - {"full"})
RULER = ["niah_single", "niah_multikey", "variable_tracking", "common_words"]
SIDE = ("leap", "ranks", "kept")  # the per-prompt tables beside the sweep


def write_frame(path: Path, df: pd.DataFrame) -> None:
    """``df`` as parquet at ``path``, atomically."""
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


def worker_files(out: Path) -> list[Path]:
    """The parquet files of every worker that has written (``out`` itself for worker 0)."""
    return [p for p in [out, *sorted(out.parent.glob(f"{out.stem}.w*{out.suffix}"))] if p.exists()]


def read_study(out: Path) -> pd.DataFrame:
    """Every worker's rows, one frame; a cell in two worker files is refused."""
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


def config(a, out: Path) -> ReportConfig:
    """The report that is this study: full context, EntroPrefill at the paper and loose presets, every policy at
    25 % and 50 % of the prompt, 3 distractors per SQuAD prompt, each family its own ``max_new_tokens``."""
    return ReportConfig(out=out, model=a.model, n_squad=a.n_squad, n_needle=0, n_distractors=3, data=a.data,
                        ruler=tuple(a.ruler), ruler_lengths=tuple(a.ruler_lengths), ruler_seeds=a.ruler_seeds,
                        policies=tuple(a.policies), budget_fracs=(0.25, 0.5), presets=("paper", "loose"),
                        leap_prompts=a.leap_prompts, kept_prompts=a.kept_prompts, cap_tokens=a.cap_tokens,
                        threads=a.threads)


def write_layout(folder: Path, out: Path) -> str:
    """The study's files beside ``out`` from the report in ``folder``; returns the summary's markdown."""
    tab = folder / "tables"
    shutil.copyfile(tab / "sweep.parquet", out)
    df = read_sweep(out)
    side = {n: pd.read_parquet(tab / f"{n}.parquet") if (tab / f"{n}.parquet").exists() else None for n in SIDE}
    for n, t in side.items():
        if t is not None:
            write_frame(out.with_name(f"{out.stem}_{n}.parquet"), t)
    man = json.loads((folder / "manifest.json").read_text())
    shows = conclusions(df, side["leap"], side["ranks"], kept=side["kept"], margin=man["config"]["margin"])
    write_frame(out.with_name(out.stem + "_conclusions.parquet"), shows.to_frame())
    ref, warns = findings.reference_check(df)
    parts = [shows.markdown(), "## Reference check", markdown(ref), *[f"- **{w}**" for w in warns],
             "## Accuracy (contains, Wilson 95% CI)", markdown(findings.accuracy_table(df)),
             "## Findings", *[f"- {s}" for s in man.get("findings", [])],
             f"The report: {folder / 'report.html'} (tables, figures, the leap and priority tables)."]
    md = "\n\n".join(parts)
    harness.write_markdown(out.with_name(out.stem + "_summary.md"), md)
    return md


def parse(argv=None) -> argparse.Namespace:
    """The study's flags (see the module docstring for their report counterparts)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-squad", type=int, default=100)
    ap.add_argument("--data", choices=("fetched", "sample"), default="fetched")
    ap.add_argument("--ruler", nargs="*", default=RULER)
    ap.add_argument("--ruler-lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--ruler-seeds", type=int, default=10)
    ap.add_argument("--policies", nargs="+", default=POLICIES)
    ap.add_argument("--leap-prompts", type=int, default=33, help="prompts per task for the leap and priorities")
    ap.add_argument("--cap-tokens", type=int, default=64,
                    help="full context again on every prompt with this many new tokens (0: skip)")
    ap.add_argument("--kept-prompts", type=int, default=100,
                    help="prompts per task for the answer-tokens-kept comparison (DeferKV vs SnapKV; 0: skip)")
    ap.add_argument("--model", default=None,
                    help="a research model's short name (qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), a local HF folder "
                         "(default: the embedded SmolLM2)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "study.parquet"))
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: fastest on the shared 2-core machine)")
    ap.add_argument("--summary-only", action="store_true")
    return ap.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    out = Path(a.out)
    folder = out.with_suffix("")
    if not a.summary_only:
        res = run_report(config(a, folder))
        print(res.summary())
        if res.partial:
            print("the report is partial: re-run the same command to resume")
            return
    print(write_layout(folder, out))


if __name__ == "__main__":
    main()
