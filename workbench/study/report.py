"""The headless main job, ``python -m workbench report``: a small study on the default model, written as a
self-contained HTML report with every figure exported for papers and every table as CSV and parquet.

The study (:class:`ReportConfig`, ``ReportConfig.tiny()`` for CI):

1. **capture** — the bundled example prompt (``data/example_prompt.json``) with attention capture, then
   its analysis: the 7-step EntroPrefill trace (``procedure.trace``: pooling, chunk priorities, selection with
   the certificate, audit). Figures: sink mass, one head's attention strip, head weights, chunk
   priorities at the decision layer, certificate, per-layer trace.
2. **sweep** — SQuAD single-hop prompts and needle-in-a-haystack prompts (``data``: the fetched SQuAD dev
   set and essays when they are in the cache, else the bundled samples, labelled as samples; ``filler``:
   another haystack text; ``items``: your own JSONL items), under the methods ``full``, ``entroprefill``
   and ``evict`` (every eviction policy in ``policies`` at every budget fraction), scored over the whole
   reply with EM / F1 / contains (:func:`workbench.study.sweep.sweep`), each family with its own
   ``max_new_tokens`` (``tasks.TASK_MAX_NEW_TOKENS``; replies that use them all are flagged ``hit_cap``).
   The sweep writes ``tables/sweep.parquet`` after every cell and resumes from it: a re-run recomputes no
   finished cell, and a run interrupted (Ctrl-C, SIGTERM) at any stage from the sweep on (the needle eviction,
   the figure export, the tables, the page) still writes a report from the finished cells, marked **partial**
   with the stage; the same command resumes it.
   Figures: accuracy vs budget, accuracy / KV-bytes table (per task).
   **What this study shows** (:mod:`workbench.study.conclusions`, at the top of the page): each seed claim the
   sweep can speak to (DeferKV vs SnapKV per budget and family, EntroPrefill per preset) with n, effect, CI, p and
   a verdict, with the leap, the priorities and the answer tokens kept when ``leap_prompts`` / ``kept_prompts``
   ask for them, and the claims it cannot assess.
   **Per-prompt analyses** (:mod:`workbench.study.report_analyses`, on every family the report runs: SQuAD, needles,
   RULER-style ``ruler``, ``items``): the leap (step recall gains against the gapped held-out reference) and the
   answer chunk's standing under each priority on ``leap_prompts`` prompts per task, the gold answer's tokens
   DeferKV and SnapKV keep on ``kept_prompts``, and the cap check at ``cap_tokens``; tables ``leap``,
   ``leap_steps``, ``ranks``, ``priority_standing``, ``kept``, ``kept_summary``, ``cap``.
   **Findings** (:mod:`workbench.study.findings`): the reference check (full-context accuracy with its
   Wilson CI, and a loud warning when it is too low), one sentence per comparison with paired statistics
   (n, wins/ties/losses, McNemar, bootstrap CI of the difference), accuracy conditional on the reference
   being right, and the timing rule (shared eviction prefill as its own row, amortised over its cells).
   **Calibrate, then test** (``calibrate``, off by default; :mod:`workbench.study.report_calibration`): the items
   split by cluster, EntroPrefill's preset chosen on the calibration split (``tables/calibration*``, its cells in
   ``tables/calibration_cells.parquet``), and everything above run on the test split only. **Bypasses**: every
   bypassed EntroPrefill prompt with the step that refused it and its numbers (``tables/bypasses``).
3. **needle eviction** — the first needle prompt under every policy from one shared prefill
   (``eviction.run_policies``) and how many of the needle's tokens each cache kept
   (``eviction.survival_table``). Figure: kept positions per policy.
4. **answer divergence** — per task family and policy, what eviction changed in the answer (mean KL, first parting
   token; :func:`workbench.study.report_parts.divergence_part`): table ``answer_divergence``.

Output folder::

    report.html                self-contained (plotly.js inlined once; works offline)
    manifest.json              settings, versions, timings, every file written
    figures/<name>.{pdf,svg,png,json,csv}    via workbench.show.export.export_all
    tables/<name>.{csv,parquet}
    kvpress/<dataset>__<length>__<model>__<press>__<ratio>[__query_aware]/{predictions.csv,metrics.json,config.yaml}
                               each (task, model, method, budget) as a kvpress evaluation run (study.kvpress_runs)

Every file is written atomically (temporary file + ``os.replace``).
"""
from __future__ import annotations

import datetime as _dt
import io
import json
import math
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

import workbench.study.findings as fnd
import workbench.study.report_parts as parts
from workbench.run.models import load_model
from workbench.show import export as ex
from workbench.show import plots
from workbench.show.export import csv_bytes, versions
from workbench.study.bypasses import bypass_note, bypass_table
from workbench.study.conclusions import conclusions
from workbench.study.followup import is_followup
from workbench.study.kvpress_runs import write_kvpress_runs
from workbench.study.report_analyses import prompt_analyses_part
from workbench.study.report_calibration import calibration_stage, check_split
from workbench.study.report_config import (
    DATA,
    DEFAULT_POLICIES,
    DEFAULT_THREADS,
    METHODS,
    ReportConfig,
    ReportResult,
)
from workbench.study.report_export import export_figures
from workbench.study.report_html import write_html
from workbench.study.report_items import study_items, user_data
from workbench.study.storage import check_writable, read_resumable
from workbench.study.sweep import expand_grid, read_sweep, sweep
from workbench.study.tasks import items_frame, max_new_tokens_for
from workbench.util import atomic_write_bytes, auto_threads, jsonable

__all__ = ["ReportConfig", "ReportResult", "run_report", "summary_table", "write_html", "write_table",
           "DEFAULT_POLICIES", "METHODS", "DATA", "DEFAULT_THREADS", "export_width"]

# ----------------------------------------------------------------------------- atomic writes


def _parquet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Object columns holding a mix of types (e.g. ``budget``: ints and ``"all"``) become strings."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype == object:
            kinds = {type(v) for v in out[c] if v is not None and not (isinstance(v, float) and math.isnan(v))}
            if len(kinds) > 1 and not kinds <= {list, tuple}:
                out[c] = out[c].map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    return out


def write_table(df: pd.DataFrame, folder, name: str) -> list[Path]:
    """``folder/name.csv`` and ``folder/name.parquet`` (atomic each); returns both paths."""

    folder = Path(folder)
    csv_path, pq_path = folder / f"{name}.csv", folder / f"{name}.parquet"
    atomic_write_bytes(csv_path, csv_bytes(df))
    buf = io.BytesIO()
    _parquet_safe(df).to_parquet(buf, index=False)
    atomic_write_bytes(pq_path, buf.getvalue())
    return [csv_path, pq_path]


# ----------------------------------------------------------------------------- tables
def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (task, method, parameters): runs, mean EM / F1 / contains / first-token agreement, the mean
    retained fraction of the prompt and mean KV bytes (reshaping of the sweep frame, no new science)."""
    cols = ["task", "method", "setting", "runs", "em", "f1", "contains", "first_token_agree", "retained_frac",
            "wall_s", "errors", *fnd.PROTOCOL]
    if df.empty:
        return pd.DataFrame(columns=cols)
    d = df.copy()
    d["setting"] = d.apply(_setting, axis=1)
    d["retained_frac"] = pd.to_numeric(d["retained_tokens"], errors="coerce") / pd.to_numeric(d["prompt_tokens"],
                                                                                              errors="coerce")
    d["errors"] = d["error"].map(lambda e: int(isinstance(e, str) and bool(e)))
    g = d.groupby(["task", "method", "setting"], sort=True, dropna=False)
    out = g.agg(runs=("item_id", "size"), em=("em", "mean"), f1=("f1", "mean"), contains=("contains", "mean"),
                first_token_agree=("first_token_agree", "mean"), retained_frac=("retained_frac", "mean"),
                wall_s=("wall_s", "mean"), errors=("errors", "sum")).reset_index()
    ok = d[d["errors"] == 0]  # the figures of the cells that ran
    figures = pd.DataFrame([{"task": t, "method": m, "setting": s, **fnd.protocol_figures(g)}
                            for (t, m, s), g in ok.groupby(["task", "method", "setting"], sort=True)],
                           columns=["task", "method", "setting", *fnd.PROTOCOL])
    return out.merge(figures, on=["task", "method", "setting"], how="left")[cols]


def _setting(row) -> str:
    p = fnd.row_params(row)
    if row["method"] == "evict":
        return fnd.evict_label(p)
    return ", ".join(f"{k}={v}" for k, v in sorted(p.items())) or "default"


# ----------------------------------------------------------------------------- the study
WIDE = {"attention_strip", "chunk_priorities", "trace_layers", "accuracy_vs_budget", "kv_bytes_table",
        "kept_positions", "certificate"}
SINGLE_TITLE_CHARS = 42  # a longer title does not fit a single column at 9 pt


def export_width(name: str, fig) -> str:
    """The report's paper width for a figure: ``"double"`` for the wide figures (``WIDE``) and for titles
    longer than ``SINGLE_TITLE_CHARS``, else ``"single"``."""
    title = getattr(getattr(fig.layout, "title", None), "text", None) or ""
    plain = re.sub(r"<[^>]+>", "", title)
    return "double" if name in WIDE or len(plain) > SINGLE_TITLE_CHARS else "single"


def _method_grid(cfg: ReportConfig) -> list:
    grid = []
    for m in cfg.methods:
        if m == "full":
            grid.append(("full", {}))
        elif m == "entroprefill":
            grid += [("entroprefill", p) for p in cfg.entroprefill_settings()]
        elif m == "evict":  # an aware cell names no query mode (its key is the one it always had)
            modes = ([{}] if "aware" in cfg.query else []) + ([{"query": "agnostic"}] if "agnostic" in cfg.query else [])
            budgets = [("budget_frac", cfg.budget_fracs), ("compression_ratio", cfg.compression_ratios),
                       ("kv_frac", cfg.kv_ladder)]
            grid += [("evict", {"policy": list(cfg.policies), key: list(values), **q})
                     for q in modes for key, values in budgets if values]
    return grid


def _sweep_figures(df: pd.DataFrame, model_id: str) -> dict:
    """Accuracy vs retained fraction (one line per method, per policy for ``evict``) and the KV-bytes table."""

    d = df.copy()
    pol = d["p_policy"] if "p_policy" in d.columns else pd.Series([None] * len(d), index=d.index)
    d["line"] = [p if m == "evict" and isinstance(p, str) else m for m, p in zip(d["method"], pol)]
    by = ["task", "method"] + [c for c in ("p_policy", "p_budget_frac", "p_budget") if c in d.columns]  # per task
    return {"accuracy_vs_budget": plots.accuracy_vs_budget(d, metric="contains", x="retained_fraction", by="line",
                                                           model_id=model_id),
            "kv_bytes_table": plots.kv_bytes_table(d, by=by, metrics=["em", "f1", "contains"], model_id=model_id)}


def _run_sweep(cfg: ReportConfig, lm, items, path: Path) -> tuple[pd.DataFrame, bool]:
    """The study's sweep, one call per decode length (each family its own ``max_new_tokens``), resuming from
    and writing to ``path`` after every cell, under one progress bar with an ETA over the whole study.
    Returns ``(rows of this study's grid, interrupted)``: Ctrl-C / SIGTERM stops it with every finished
    cell saved."""
    grids = {False: _method_grid(cfg)}  # follow-up items: both turns under full and evict (no pruned-prefill protocol)
    grids[True] = [m for m in grids[False] if m[0] != "entroprefill"]
    groups: dict[tuple, list] = {}
    for it in items:
        groups.setdefault((cfg.max_new_tokens or max_new_tokens_for(it.task), is_followup(it)), []).append(it)
    keys = {c.key(lm.model_id, n) for (n, f), its in groups.items() for c in expand_grid(its, grids[f], (cfg.seed,))}
    old = read_resumable(path)  # a damaged file is moved aside (kept), its cells run again
    done = set(old.loc[old["error"].isna(), "cell"]) & keys if len(old) else set()
    bar = tqdm(total=len(keys), initial=len(done), desc="study", unit="cell", disable=not cfg.progress,
               smoothing=0.1)
    interrupted = False
    try:  # the `evict` cells of a prompt run together: one shared prefill, batched decoding (methods.evict_cells)
        for (n, f), its in groups.items():
            sweep(lm, its, grids[f], seeds=(cfg.seed,), out=path, max_new_tokens=n, progress=False, on_error="record",
                  checkpoint_s=0.0, on_row=lambda row: bar.update(1))
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
    df = read_sweep(path) if path.exists() else pd.DataFrame(columns=["cell"])
    df = df[df["cell"].isin(keys)].reset_index(drop=True) if len(df) else df
    return df, interrupted or len(df) < len(keys)


def run_report(cfg: ReportConfig | None = None, *, lm=None) -> ReportResult:
    """Run the study of ``cfg`` and write the report (see the module docstring); ``lm``: a loaded model to
    use instead of loading ``cfg.model``. An interrupt from the sweep on still writes the report from the finished
    cells, marked partial (``ReportResult.partial``, ``.interrupted``: the stage; no figure export), and a re-run
    resumes it; a figure export that fails twice leaves ``ReportResult.export_error`` (one line), not a failure."""

    cfg = cfg or ReportConfig()
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    out = cfg.out
    user = user_data(cfg)  # before any model work, and before anything is written
    check_split(cfg, user["items"])
    check_writable(out, "out", folder=True)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    # Chromium starts while the model loads (figure export needs it at the end)
    def start_server():
        try:
            ex.ensure_server()
        except BaseException:  # noqa: BLE001 - the export starts it again, and says why in one line if it fails
            pass

    server_thread = threading.Thread(target=start_server, daemon=True, name="report-kaleido")
    server_thread.start()

    figures: dict = {}
    tables: dict[str, pd.DataFrame] = {}
    notes: dict[str, str] = {}
    info_extra: dict = {}

    def timed(name: str, fn: Callable):
        t0 = time.perf_counter()
        r = fn()
        timings[name] = time.perf_counter() - t0
        return r

    threads_before = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(auto_threads() if cfg.threads == "auto" else cfg.threads)
    info_extra["torch_threads"] = torch.get_num_threads()  # what "auto" resolved to, in the manifest
    try:
        if lm is None:
            lm = timed("load_model", lambda: load_model(cfg.model, device=cfg.device, progress=cfg.progress))
        figures_c, tables_c, notes_c, prompt_info = timed("capture_analysis", lambda: parts.capture_part(cfg, lm))
        figures.update(figures_c)
        tables.update(tables_c)
        notes.update(notes_c)

        items, sources = study_items(cfg, lm.tokenizer, user, lm.shape.max_context)
        run_cfg = cfg
        if cfg.calibrate is not None:  # thresholds fixed on the calibration split; the study runs on the test split
            items, run_cfg, t_cal, n_cal, info_extra["calibration"] = timed("calibration", lambda: calibration_stage(
                cfg, items, lambda c, its: _run_sweep(c, lm, its, out / "tables" / "calibration_cells.parquet")))
            tables.update(t_cal)
            notes.update(n_cal)
        df, partial = timed("sweep", lambda: _run_sweep(run_cfg, lm, items, out / "tables" / "sweep.parquet"))
        # from here every cell is in the sweep's parquet: an interrupt at any later stage still writes the report
        # from them, marked partial, and the same command resumes (no cell runs twice)
        interrupted = "the sweep" if partial else None
        at = ["the tables"]
        fig_files: dict = {}
        export_error: list[str] = []

        def write() -> tuple[Path, Path, dict]:
            at[0] = "the tables"
            t0 = time.perf_counter()
            table_files = {name: write_table(t, out / "tables", name) for name, t in tables.items() if name != "sweep"}
            if len(df):  # the sweep's own parquet stays the resumable store; its csv is written beside it
                csv = out / "tables" / "sweep.csv"
                atomic_write_bytes(csv, csv_bytes(df))
                table_files["sweep"] = [csv, out / "tables" / "sweep.parquet"]
            kvpress_dirs = write_kvpress_runs(df, out / "kvpress") if len(df) else []  # read beside kvpress's runs
            info_extra["kvpress_runs"] = [str(p.relative_to(out)) for p in kvpress_dirs]
            timings["tables_html"] = time.perf_counter() - t0
            timings["total"] = time.perf_counter() - t_start
            info = {**_run_info(cfg, lm, prompt_info, timings), "sources": sources, "partial": partial,
                    "interrupted": interrupted, "export_error": export_error[0] if export_error else None,
                    **info_extra}
            at[0] = "the HTML page"
            html_path = write_html(out / "report.html", figures, tables, fig_files, table_files, info, notes)
            timings["total"] = time.perf_counter() - t_start
            manifest = out / "manifest.json"
            man = {**info, "timings": timings, "html": html_path.name,
                   "figures": {n: [str(p.relative_to(out)) for p in ps] for n, ps in fig_files.items()},
                   "tables": {n: [str(p.relative_to(out)) for p in ps] for n, ps in table_files.items()}}
            atomic_write_bytes(manifest, (json.dumps(jsonable(man), indent=2, ensure_ascii=False) + "\n").encode())
            return html_path, manifest, table_files

        try:
            frames, t_a, n_a, found = {}, {}, {}, []
            if not partial:  # the per-prompt analyses (leap, priorities, answer tokens kept, cap): report_analyses
                at[0] = "the prompt analyses"
                t_a, n_a, frames, found = timed("prompt_analyses", lambda: prompt_analyses_part(
                    cfg, lm, items, df, out / "tables"))
            _sweep_tables(cfg, lm, items, df, figures, tables, notes, info_extra, frames)
            tables.update(t_a)
            notes.update(n_a)
            info_extra["findings"] = info_extra.get("findings", []) + found
            needles = [it for it in items if it.task == "needle"]
            if needles and not partial:
                at[0] = "the needle eviction"
                f_n, t_n, note = timed("needle_eviction", lambda: parts.needle_part(cfg, lm, needles[0]))
                figures.update(f_n)
                tables.update(t_n)
                notes["needle_survival"] = note
            if items and not partial and not cfg.divergence:
                info_extra["skipped"] = ["the answer divergence (divergence=False, --no-divergence)"]
            elif items and not partial:
                at[0] = "the answer divergence"
                tables["answer_divergence"], notes["answer_divergence"] = timed(
                    "answer_divergence", lambda: parts.divergence_part(cfg, lm, items))
            if partial:  # an interrupted run writes its page quickly: no figure export
                _stop_server(server_thread)
            else:
                at[0] = "the figure export"
                server_thread.join()  # a Chromium that failed to start is retried by the export
                widths = {n: cfg.widths.get(n, export_width(n, f)) for n, f in figures.items()}
                files, err = timed("export", lambda: export_figures(
                    figures, out / "figures", widths=widths, prompt_hash=prompt_info.get("prompt_hash"),
                    progress=cfg.progress))
                fig_files.update(files)
                export_error.extend([err] if err else [])
            html_path, manifest, table_files = write()
        except KeyboardInterrupt:
            interrupted, partial = interrupted or at[0], True
            html_path, manifest, table_files = write()  # first: stopping a Chromium cut mid-render may take a while
            _stop_server(server_thread)
    except BaseException:
        _stop_server(server_thread)
        raise
    finally:
        torch.set_num_threads(threads_before)
    return ReportResult(out=out, html=html_path, manifest=manifest, figures=fig_files, tables=table_files,
                        timings=timings, partial=partial, interrupted=interrupted,
                        export_error=export_error[0] if export_error else None)


def _sweep_tables(cfg: ReportConfig, lm, items, df: pd.DataFrame, figures: dict, tables: dict, notes: dict,
                  info_extra: dict, frames: dict | None = None) -> None:
    """The sweep's tables, findings, notes and figures (into ``figures``, ``tables``, ``notes``, ``info_extra``);
    ``frames``: the per-prompt ``leap``, ``ranks`` and ``kept`` tables the conclusions read."""
    tables["items"] = items_frame(items)
    tables["sweep"] = df
    tables["summary"] = summary_table(df)
    _findings(df, tables, notes, info_extra, cfg.margin, frames or {})
    tables["bypasses"] = bypass_table(df)
    notes["bypasses"] = bypass_note(tables["bypasses"])
    mnt = sorted({int(v) for v in df["max_new_tokens"]}) if len(df) else []
    notes["sweep"] = (f"{len(items)} prompts × methods {list(cfg.methods)} (evict: policies {list(cfg.policies)} "
                      f"at budget fractions {list(cfg.budget_fracs)}"
                      + (f", kvpress compression ratios {list(cfg.compression_ratios)}" if cfg.compression_ratios else "")
                      + (f", KV-byte rungs {list(cfg.kv_ladder)}" if cfg.kv_ladder else "")
                      + f", query {' and '.join(cfg.query)}), max_new_tokens {mnt} (per task); "
                      "every table carries the query mode, the achieved compression ratio, kv_frac (KV bytes kept / "
                      "full; NaN for pruned prefill, whose full cache is never built), KV bytes, peak memory and time "
                      "to first token (ttft_s; an aware eviction's first token comes from its prefill, before it "
                      "evicts); "
                      f"{len(df)} runs, {int(df['error'].map(lambda e: isinstance(e, str)).sum()) if len(df) else 0}"
                      f" with errors, {int(df['hit_cap'].sum()) if len(df) else 0} replies hit the cap.")
    if len(df):
        figures.update(_sweep_figures(df, lm.model_id))
        notes["accuracy_vs_budget"] = ("Mean contains-accuracy ± its standard error over prompts; n per "
                                       "point: " + _n_note(df) + ". Confidence intervals: the accuracy table.")
        notes["kv_bytes_table"] = "Means per task (tasks are not pooled) with the n of each row."


def _stop_server(server_thread: threading.Thread, wait_s: float = 20.0) -> None:
    """Stop the figure-export Chromium of an unfinished report once it has started (a running one keeps the
    interpreter from exiting); one still starting after ``wait_s`` is left to the caller (the command line
    exits with ``os._exit``)."""
    server_thread.join(timeout=wait_s)
    if not server_thread.is_alive():
        ex.shutdown_server()


def _n_note(df: pd.DataFrame) -> str:
    d = fnd.with_settings(df)
    g = d.groupby("setting")["item_id"].nunique()
    return ", ".join(f"{k} {v}" for k, v in g.items())


def _findings(df: pd.DataFrame, tables: dict, notes: dict, info: dict, margin: float, frames: dict | None = None) -> None:
    """The reference check, the comparisons with their sentences, accuracies with Wilson CIs and the timing rule."""
    ref, warns = fnd.reference_check(df)
    comp = fnd.comparisons(df)
    # the seed claims: the sweep's, and the leap / priority / kept ones when their tables were made (else: said)
    frames = frames or {}
    shows = conclusions(df, frames.get("leap"), frames.get("ranks"), kept=frames.get("kept"), margin=margin)
    tables["conclusions"] = shows.to_frame()
    info["conclusions"] = {"rule": shows.rule(), "counts": shows.counts(), "missing": list(shows.missing),
                           "next": shows.next_step()}
    tables["reference_check"] = ref
    tables["accuracy"] = fnd.accuracy_table(df)
    tables["comparisons"] = comp.drop(columns=["finding"], errors="ignore")
    tables["timing"] = fnd.timing_table(df)
    info["reference_warnings"] = warns
    info["findings"] = list(comp["finding"]) if len(comp) else []
    notes["reference_check"] = ("Full-context (reference) accuracy per task, contains metric, with its 95% Wilson "
                                f"interval; a task needs >= {fnd.MIN_REFERENCE_ACCURACY:.0%} and >= "
                                f"{fnd.MIN_REFERENCE_RIGHT} right answers for comparisons against it to mean much.")
    notes["accuracy"] = ("Contains-accuracy per task and setting: right/n with the 95% Wilson interval (lo, hi); "
                         "failed: cells whose method failed (failed_reason: the first error), not counted in n.")
    d = fnd.with_settings(df)
    units = (d["task"].astype(str) + "/" + fnd.clusters(d)).nunique() if len(d) else 0
    prompts = (d["task"].astype(str) + "/" + d["item_id"].astype(str)).nunique() if len(d) else 0
    info["clusters"] = {"prompts": int(prompts), "clusters": int(units)}
    notes["comparisons"] = ("Paired comparisons (same prompts): wins/ties/losses, McNemar exact p, mean difference "
                            "with its 95% bootstrap CI; cond_*: accuracy where the reference is right. n counts "
                            "independent clusters (prompts that share a fact or a haystack are one cluster, scored by "
                            f"their mean; the items' cluster column): this study's {prompts} prompts form {units} "
                            "clusters.")
    notes["timing"] = ("Timing rule: wall_s charges the shared eviction prefill (and the batched decode of a prompt's "
                       "evictions) to the cell that ran it; method_s is each cell's own work, a batched eviction's "
                       "being the batch time divided by the batch size; amortised_s = method_s + shared_s / sharing "
                       "(cells of the prompt that evict from the same prefill); the 'shared eviction prefill' row "
                       "is that step alone.")


def _run_info(cfg: ReportConfig, lm, prompt_info: dict, timings: dict) -> dict:

    return {"title": "Attention workbench report", "model_id": lm.model_id, "device": str(lm.device),
            "dtype": str(lm.dtype).replace("torch.", ""),
            "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": cfg.to_dict(), "versions": versions(), "example": prompt_info}
