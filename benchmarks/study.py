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

Beside ``--out`` (``<stem>.parquet``, the sweep's cells: with ``--calibrate`` those of the test split only) it
writes ``<stem>_leap.parquet``, ``<stem>_ranks.parquet``, ``<stem>_kept.parquet`` (the per-prompt tables),
``<stem>_calibration.parquet`` (the candidates' calibration numbers), ``<stem>_calibration_split.parquet`` (every
unit and its side), ``<stem>_calibration_cells.parquet`` (the calibration split's cells),
``<stem>_conclusions.parquet`` and ``<stem>_summary.md``, opening with "What this study shows" (with the split),
then the reference check, accuracies, findings and the analyses' findings.

``--protocols FOLDER ...`` (with ``--summary-only``) adds the cells of other report folders that ran protocols the
study's own run did not (``--query agnostic``, ``--n-followup``) as ``<stem>.w1.parquet``: their cells that the study
lacks, none on a calibration unit. ``--side-from DIR`` takes the per-prompt tables from an earlier layout in ``DIR``
(``study_leap.parquet`` ...), kept on the test split's prompts. The helpers below read that layout (several parquet
files, as the shipped ``study_q05`` has) for ``study_tables.py``.
"""
from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import _harness as harness
import pandas as pd

from workbench.analyse.params import PRESETS
from workbench.rerun.eviction import POLICY_BY_NAME
from workbench.study import findings
from workbench.study.calibration import calibrate, split_units
from workbench.study.conclusions import conclusions, preset_name
from workbench.study.markdown_table import markdown
from workbench.study.report import ReportConfig, run_report
from workbench.study.sweep import read_sweep
from workbench.util import atomic_write_bytes

__all__ = ["markdown", "write_frame", "worker_files", "read_study", "timed_prompts", "parse", "config", "write_layout",
           "read_calibration", "calibration_text", "opening", "report_cells", "resplit"]

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
    """``(row mask, prompt index, paid per prompt)``: the prompts whose query-aware evictions shared one prefill and
    decoded in batches, the ones the timing rule holds for (query-agnostic cells decode one by one after their own
    context prefill, and follow-up cells run two turns: neither is timed here)."""
    ev = df[(df["method"] == "evict") & (df["params"].map(lambda s: "query" not in json.loads(s)))]
    if "meta_protocol" in df.columns:
        ev = ev[ev["meta_protocol"].isna()]
    paid = ev.groupby(["task", "item_id"])["shared_paid"].apply(lambda s: int(s.fillna(False).astype(bool).sum()))
    batched = ev.groupby(["task", "item_id"])["batched"].max()
    one = paid[(paid == 1) & (batched.reindex(paid.index) > 1)].index
    return df.set_index(["task", "item_id"]).index.isin(one), one, paid


def config(a, out: Path) -> ReportConfig:
    """The report that is this study: full context, EntroPrefill at the paper and loose presets (with
    ``--calibrate``: the one its calibration split chooses), every policy at 25 % and 50 % of the prompt, 3
    distractors per SQuAD prompt, each family its own ``max_new_tokens``."""
    return ReportConfig(out=out, model=a.model, n_squad=a.n_squad, n_needle=0, n_distractors=3, data=a.data,
                        ruler=tuple(a.ruler), ruler_lengths=tuple(a.ruler_lengths), ruler_seeds=a.ruler_seeds,
                        policies=tuple(a.policies), budget_fracs=(0.25, 0.5), presets=("paper", "loose"),
                        leap_prompts=a.leap_prompts, kept_prompts=a.kept_prompts, cap_tokens=a.cap_tokens,
                        threads=a.threads, calibrate=a.calibrate, divergence=not a.no_divergence)


def report_cells(folder: Path) -> pd.DataFrame:
    """The cells of the report in ``folder``: its resumable store (``tables/sweep.parquet``, which may hold cells of
    other settings or of the calibration split) cut to the cells the report itself used (``tables/sweep.csv``)."""
    tab = folder / "tables"
    used = set(pd.read_csv(tab / "sweep.csv", usecols=["cell"])["cell"])
    df = read_sweep(tab / "sweep.parquet")
    return df[df["cell"].isin(used)].reset_index(drop=True)


def _units(df: pd.DataFrame) -> pd.Series:
    return df["task"].astype(str) + "/" + findings.clusters(df)


def read_calibration(od: Path, stem: str = "study"):
    """``(split, cells)`` of a layout's calibration (``<stem>_calibration_split.parquet``, its cells), or
    ``(None, None)`` for a study run without one."""
    paths = [od / f"{stem}_calibration_split.parquet", od / f"{stem}_calibration_cells.parquet"]
    if not all(p.exists() for p in paths):
        return None, None
    return pd.read_parquet(paths[0]), read_sweep(paths[1])


def calibration_text(split: pd.DataFrame, cal: pd.DataFrame, test: pd.DataFrame, margin: float):
    """``(paragraph, calibration)``: the calibration recomputed from the calibration split's cells
    (:func:`workbench.study.calibration.calibrate` over the presets they ran), both splits named by their units per
    task, the chosen preset; refused when the test cells ran another preset or sit on a calibration unit."""
    params = sorted({s for s in cal.loc[cal["method"] == "entroprefill", "params"]})
    names = [preset_name(json.loads(s)).removeprefix("EntroPrefill ") for s in params]
    cands = [(n, PRESETS[n]["params"]) for n in PRESETS if n in names]
    res = calibrate(cal, cands, margin)
    sides = {k: split.loc[split["split"] == k, "unit"] for k in ("calibration", "test")}
    on_cal = set(_units(test)) & set(sides["calibration"])
    if on_cal:
        raise ValueError(f"test: {len(on_cal)} units of the test cells are calibration units ({sorted(on_cal)[:3]})")
    ran = {preset_name(json.loads(s)) for s in test.loc[test["method"] == "entroprefill", "params"]}
    if ran and ran != {f"EntroPrefill {res.chosen}"}:
        raise ValueError(f"test: the test split ran {sorted(ran)}, the calibration chooses {res.chosen}")

    def per_task(units):
        return ", ".join(f"{t} {n}" for t, n in units.str.partition("/")[0].value_counts().sort_index().items())

    outside = pd.Series(sorted(set(_units(test)) - set(split["unit"])), dtype=object)

    text = (f"**Calibrate, then test** (EntroPrefill paper §9): the items were split per task family, by independent "
            "cluster (within each task, the first ceil(fraction · n) of its n clusters ranked by sha256(seed, unit), "
            "never all of them; a family with one cluster stays in test), into a "
            f"**calibration split** of {len(sides['calibration'])} clusters ({per_task(sides['calibration'])}) and a "
            f"disjoint **test split** of {len(sides['test'])} clusters ({per_task(sides['test'])}); every unit is "
            f"listed in `study_calibration_split.parquet`. On the calibration split only, among the presets "
            f"{', '.join(n for n, _ in cands)}: {res.note}. Calibrated value: preset **{res.chosen}** "
            f"({', '.join(f'{k}={v}' for k, v in sorted(res.params.items())) or 'the defaults'}). Every row below is "
            "on the test split" + (f", and on {len(outside)} clusters of protocol items built apart from the split "
                                   f"({per_task(outside)}), which calibration never saw" if len(outside) else "")
            + ".")
    return text, res


def opening(shows, paragraph: str | None, heading: str = "## What this study shows") -> str:
    """"What this study shows" with the calibration ``paragraph`` (when there is one) after its heading."""
    md = shows.markdown(heading)
    if not paragraph:
        return md
    head, _, rest = md.partition("\n\n")
    return f"{head}\n\n{paragraph}\n\n{rest}"


def _with_cluster(t: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """A per-prompt table with its prompts' ``meta_cluster`` (from the sweep ``cells`` when it has none)."""
    t = t.assign(item_id=t["item_id"].astype(str))
    if "meta_cluster" in t.columns or "meta_cluster" not in cells.columns:
        return t
    m = cells[["task", "item_id", "meta_cluster"]].drop_duplicates(["task", "item_id"])
    return t.merge(m.assign(item_id=m["item_id"].astype(str)), on=["task", "item_id"], how="left")


def _protocol_cells(folders, have: set, cal_units: set) -> pd.DataFrame:
    parts = [report_cells(Path(f)) for f in folders]
    extra = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["cell"])
    if not len(extra):
        return extra
    extra = extra[~extra["cell"].isin(have) & ~_units(extra).isin(cal_units)]
    return extra.drop_duplicates("cell").reset_index(drop=True)


def write_layout(folder: Path, out: Path, protocols=(), side_from: Path | None = None) -> str:
    """The study's files beside ``out`` from the report in ``folder`` (and the protocol cells of the report folders
    ``protocols``, the per-prompt tables of an earlier layout in ``side_from``); returns the summary's markdown."""
    tab = folder / "tables"
    df = report_cells(folder)
    write_frame(out, df)
    man = json.loads((folder / "manifest.json").read_text())
    margin = man["config"]["margin"]
    paragraph, cal = None, None
    cal_units: set = set()
    if (tab / "calibration_split.parquet").exists():
        split = pd.read_parquet(tab / "calibration_split.parquet")
        cal = read_sweep(tab / "calibration_cells.parquet")
        cal = cal[_units(cal).isin(set(split.loc[split["split"] == "calibration", "unit"]))]
        keys = set(pd.read_csv(tab / "calibration_sweep.csv", usecols=["cell"])["cell"])
        cal = cal[cal["cell"].isin(keys)].reset_index(drop=True)
        write_frame(out.with_name(f"{out.stem}_calibration_split.parquet"), split)
        write_frame(out.with_name(f"{out.stem}_calibration_cells.parquet"), cal)
        write_frame(out.with_name(f"{out.stem}_calibration.parquet"), pd.read_parquet(tab / "calibration.parquet"))
        cal_units = set(split.loc[split["split"] == "calibration", "unit"])
    extra = _protocol_cells(protocols, set(df["cell"]), cal_units)
    w1 = out.with_name(f"{out.stem}.w1{out.suffix}")
    if len(extra):
        write_frame(w1, extra)
    elif w1.exists():
        w1.unlink()  # a stale worker file would join the study
    side = {}
    clusters_of = pd.concat([df, cal], ignore_index=True) if cal_units else df
    for n in SIDE:
        src = Path(side_from) / f"study_{n}.parquet" if side_from is not None else tab / f"{n}.parquet"
        t = pd.read_parquet(src) if src.exists() else None
        if t is not None and n == "kept" and "task" not in t.columns:
            t["task"] = "squad_single"  # written before it had a task column: measured on SQuAD only
        if t is not None and cal_units:  # the per-prompt tables on the test split's prompts only
            t = t[~_units(_with_cluster(t, clusters_of)).isin(cal_units)].reset_index(drop=True)
        side[n] = t
        if t is not None:
            write_frame(out.with_name(f"{out.stem}_{n}.parquet"), t)
    every = read_study(out)
    if cal_units:
        paragraph, _ = calibration_text(split, cal, every, margin)
    shows = conclusions(every, side["leap"], side["ranks"], kept=side["kept"], margin=margin)
    write_frame(out.with_name(out.stem + "_conclusions.parquet"), shows.to_frame())
    ref, warns = findings.reference_check(every)
    comp = findings.comparisons(every, margin=margin)
    # the report's own findings past its sweep comparisons: the leap, priority and answer-kept analyses'
    own = findings.comparisons(df, margin=margin)
    analyses = [s for s in man.get("findings", []) if s not in set(own["finding"] if len(own) else [])]
    parts = [opening(shows, paragraph), "## Reference check", markdown(ref), *[f"- **{w}**" for w in warns],
             "## Accuracy (contains, Wilson 95% CI)", markdown(findings.accuracy_table(every)),
             "## Findings", *[f"- {s}" for s in [*(comp["finding"] if len(comp) else []), *analyses]],
             f"The report: {folder / 'report.html'} (tables, figures, the leap and priority tables)."]
    md = "\n\n".join(parts)
    harness.write_markdown(out.with_name(out.stem + "_summary.md"), md)
    return md


def resplit(folder: Path, dest: Path, fraction: float, seed: int) -> dict:
    """A copy of the calibrated report ``folder`` in ``dest`` (its manifest and tables) with the split drawn again
    by :func:`workbench.study.calibration.split_units` (per task) over the same units, from the cells its resumable
    stores already hold (no model call): the calibration split's full and candidate cells, the calibration
    recomputed, and the test split's grid with the chosen preset. Refused when a cell the new split needs is not
    stored. Returns the new split's manifest entry."""
    tab = folder / "tables"
    store = pd.concat([read_sweep(tab / "sweep.parquet"), read_sweep(tab / "calibration_cells.parquet")],
                      ignore_index=True).drop_duplicates("cell")
    store = store[store["error"].isna()]
    man = json.loads((folder / "manifest.json").read_text())
    old = pd.read_parquet(tab / "calibration_split.parquet")
    split = split_units(old["unit"], fraction, seed)
    cal_units = set(split.calibration)
    on_cal = _units(store).isin(cal_units)
    test_grid = report_cells(folder)  # the settings the test split ran: every method, one EntroPrefill preset
    settings = set(zip(test_grid["method"], test_grid["params"]))
    cal_cells = store[on_cal & store["method"].isin(["full", "entroprefill"])]
    cands = [(n, PRESETS[n]["params"]) for n in man["config"]["presets"]]
    res = calibrate(cal_cells, cands, man["config"]["margin"])
    chosen = json.dumps(res.params, sort_keys=True) if res.params else "{}"
    grid = {(m, p) for m, p in settings if m != "entroprefill"} | {("entroprefill", chosen)}
    in_grid = pd.Series([(m, p) in grid for m, p in zip(store["method"], store["params"])], index=store.index)
    test = store[~on_cal & in_grid]
    prompts = store.loc[~on_cal, ["task", "item_id"]].drop_duplicates()
    if len(test) != len(prompts) * len(grid) or cal_cells.groupby(["method", "params"]).size().nunique() != 1:
        raise ValueError(f"folder: the stores lack cells the new split needs ({len(test)} test cells of "
                         f"{len(prompts)} prompts x {len(grid)} settings)")
    out = dest / "tables"
    out.mkdir(parents=True, exist_ok=True)
    write_frame(out / "sweep.parquet", test)
    test[["cell"]].to_csv(out / "sweep.csv", index=False)
    write_frame(out / "calibration_cells.parquet", cal_cells)
    cal_cells[["cell"]].to_csv(out / "calibration_sweep.csv", index=False)
    write_frame(out / "calibration_split.parquet", split.to_frame())
    write_frame(out / "calibration.parquet", res.table)
    info = {"fraction": split.fraction, "seed": split.seed, "digest": split.digest(), "rule": "stratified by task",
            "per_task": {t: {"calibration": c, "test": k} for t, c, k in split.per_task},
            "calibration": list(split.calibration), "test": list(split.test)}
    man["calibration"] = {**man.get("calibration", {}), "split": info, **res.to_dict()}
    atomic_write_bytes(dest / "manifest.json", json.dumps(man, indent=1, default=str).encode())
    return info


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
    ap.add_argument("--calibrate", type=float, default=0.3, metavar="FRACTION",
                    help="share of the clusters that fix EntroPrefill's preset; every verdict on the rest (default 0.3)")
    ap.add_argument("--no-divergence", action="store_true", help="skip the report's answer-divergence stage")
    ap.add_argument("--summary-only", action="store_true")
    ap.add_argument("--protocols", nargs="*", default=[], metavar="FOLDER",
                    help="report folders whose protocol cells (query-agnostic, follow-up) join the layout")
    ap.add_argument("--resplit", default=None, metavar="FOLDER",
                    help="(with --summary-only) draw the per-task split again over this calibrated report folder's "
                         "stored cells into the report folder of --out, then write the layout from it")
    ap.add_argument("--side-from", default=None, metavar="DIR",
                    help="take the per-prompt tables (study_leap/ranks/kept.parquet) from this earlier layout")
    return ap.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    out = Path(a.out)
    folder = out.with_suffix("")
    if a.resplit:
        print(json.dumps(resplit(Path(a.resplit), folder, a.calibrate, 0)["per_task"]))
    elif not a.summary_only:
        res = run_report(config(a, folder))
        print(res.summary())
        if res.partial:
            print("the report is partial: re-run the same command to resume")
            return
    print(write_layout(folder, out, a.protocols, Path(a.side_from) if a.side_from else None))


if __name__ == "__main__":
    main()
