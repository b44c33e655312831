"""The headless main job, ``python -m workbench report``: a small study on the default model, written as a
self-contained HTML report with every figure exported for papers and every table as CSV and parquet.

The study (:class:`ReportConfig`, ``ReportConfig.tiny()`` for CI):

1. **capture** — the bundled example prompt (``data/example_prompt.json``) with attention capture, then
   its analysis: the 7-step EntroPrefill trace (``audit.trace``: pooling, chunk priorities, selection with
   the certificate, audit). Figures: sink mass, one head's attention strip, head weights, chunk
   priorities at the decision layer, certificate, per-layer trace.
2. **sweep** — SQuAD single-hop prompts (``data/squad_sample.json``) and needle-in-a-haystack prompts
   built from the essays sample, under the methods ``full``, ``entroprefill`` and ``evict`` (every
   eviction policy in ``policies`` at every budget fraction), scored with EM / F1 / contains
   (:func:`workbench.study.sweep.sweep`). Figures: accuracy vs budget, accuracy / KV-bytes table.
3. **needle eviction** — the first needle prompt under every policy from one shared prefill
   (``eviction.run_policies``) and how many of the needle's tokens each cache kept
   (``eviction.survival_table``). Figure: kept positions per policy.

Output folder::

    report.html                self-contained (plotly.js inlined once; works offline)
    manifest.json              settings, versions, timings, every file written
    figures/<name>.{pdf,svg,png,json,csv}    via workbench.show.export.export_all
    tables/<name>.{csv,parquet}

Every file is written atomically (temporary file + ``os.replace``).
"""
from __future__ import annotations

import datetime as _dt
import html
import io
import json
import math
import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import plotly.io as pio
import torch
from plotly.offline import get_plotlyjs
from tqdm.auto import tqdm

import workbench.study.datasets as datasets
import workbench.study.tasks as tasks
from workbench.analyse.audit import trace
from workbench.analyse.params import EntroPrefillParams
from workbench.capture import RowSet, run_capture
from workbench.checks import check_bool, check_device
from workbench.rerun import eviction
from workbench.rerun.eviction import POLICY_BY_NAME
from workbench.run.examples import load_example
from workbench.run.models import load_model
from workbench.show import export as ex
from workbench.show import plots
from workbench.show.export import _versions, prompt_hash
from workbench.study.sweep import sweep
from workbench.study.tasks import items_frame
from workbench.util import atomic_write_bytes, jsonable

__all__ = ["ReportConfig", "ReportResult", "run_report", "summary_table", "write_html", "write_table"]

DEFAULT_POLICIES = ("streaming", "h2o", "snapkv", "deferkv")
METHODS = ("full", "entroprefill", "evict")


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class ReportConfig:
    """What the report runs.

    Attributes (allowed range in brackets):
        out: output folder (created).
        model: ``None`` for the embedded default model, or a local HF folder / cached hub id.
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` ...
        n_squad: SQuAD single-hop prompts [int >= 0].
        n_needle: needle prompts (needle depths spread over ``[0.1, 0.9]``) [int >= 0]; ``n_squad + n_needle >= 1``.
        needle_length: haystack length in tokens [int in [64, 8192]].
        n_distractors: SQuAD distractor paragraphs per prompt [int >= 1].
        max_new_tokens: greedy tokens per run [int >= 1].
        methods: sweep methods, a subset of ``("full", "entroprefill", "evict")``.
        policies: eviction policies for ``evict`` and the needle survival table (``eviction.POLICY_BY_NAME``).
        budget_fracs: eviction budgets as fractions of the prompt length [each in (0, 1]].
        entroprefill: EntroPrefill parameters for the sweep's ``entroprefill`` cells (``{}``: defaults).
        capture_tail, capture_decode: rows of the example capture (prompt tail, decode steps) [ints >= 0].
        seed: task-building and run seed [int >= 0].
        threads: torch CPU threads for the run (``None``: torch's default). On a loaded machine one thread is
            several times faster than oversubscribed OpenMP threads; the tiny setting uses 1.
        widths: export width per figure name (others: :func:`export_width`).
        progress: show tqdm progress bars.
    """

    out: Path = Path("out/report")
    model: str | None = None
    device: str = "auto"
    n_squad: int = 3
    n_needle: int = 3
    needle_length: int = 1024
    n_distractors: int = 4
    max_new_tokens: int = 16
    methods: tuple[str, ...] = METHODS
    policies: tuple[str, ...] = DEFAULT_POLICIES
    budget_fracs: tuple[float, ...] = (0.25, 0.5)
    entroprefill: dict = field(default_factory=dict)
    capture_tail: int = 32
    capture_decode: int = 4
    seed: int = 0
    threads: int | None = None
    widths: dict = field(default_factory=dict)
    progress: bool = True
    tiny: bool = False

    @classmethod
    def tiny_config(cls, **kw) -> "ReportConfig":
        """The CI setting: one SQuAD and one needle prompt, 3 tokens, one policy and budget (< 2 min on 2 cores)."""
        base = dict(n_squad=1, n_needle=1, needle_length=128, n_distractors=1, max_new_tokens=3,
                    policies=("deferkv",), budget_fracs=(0.5,), capture_tail=4, capture_decode=1, threads=1,
                    tiny=True)
        base.update({k: v for k, v in kw.items() if v is not None})
        return cls(**base)

    def __post_init__(self):
        if not isinstance(self.out, (str, os.PathLike)) or not str(self.out):
            raise ValueError(f"out: must be a folder path, got {self.out!r}")
        object.__setattr__(self, "out", Path(self.out))
        if self.model is not None and not isinstance(self.model, (str, os.PathLike)):
            raise ValueError(f"model: must be None (the embedded default model), a local folder or a hub id, "
                             f"got {self.model!r}")
        check_device(self.device)
        check_bool("progress", self.progress)
        check_bool("tiny", self.tiny)
        for name, lo, hi in (("n_squad", 0, 1000), ("n_needle", 0, 1000), ("needle_length", 64, 8192),
                             ("n_distractors", 1, 20), ("max_new_tokens", 1, 4096), ("capture_tail", 0, 4096),
                             ("capture_decode", 0, 256), ("seed", 0, 2**31 - 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{name}: must be an integer in [{lo}, {hi}], got {v!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or not 1 <= self.threads <= 1024):
            raise ValueError(f"threads: must be None or an integer in [1, 1024], got {self.threads!r}")
        if self.n_squad + self.n_needle < 1:
            raise ValueError("n_squad: n_squad + n_needle must be >= 1 (the study needs a prompt)")
        methods = tuple(self.methods)
        if not methods or any(m not in METHODS for m in methods) or len(set(methods)) != len(methods):
            raise ValueError(f"methods: must be distinct entries of {METHODS}, got {self.methods!r}")
        object.__setattr__(self, "methods", methods)

        pols = tuple(self.policies)
        bad = [p for p in pols if p not in POLICY_BY_NAME or p == "full"]
        if bad or len(set(pols)) != len(pols):
            raise ValueError(f"policies: must be distinct entries of {sorted(set(POLICY_BY_NAME) - {'full'})}, "
                             f"got {self.policies!r}")
        if "evict" in methods and not pols:
            raise ValueError("policies: the 'evict' method needs at least one policy")
        object.__setattr__(self, "policies", pols)
        fr = tuple(self.budget_fracs)
        if not fr or any(isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1 for f in fr):
            raise ValueError(f"budget_fracs: must be a non-empty list of fractions in (0, 1], got {self.budget_fracs!r}")
        object.__setattr__(self, "budget_fracs", tuple(float(f) for f in fr))
        if not isinstance(self.entroprefill, dict):
            raise ValueError(f"entroprefill: must be a dict of EntroPrefill parameters, got {self.entroprefill!r}")

        EntroPrefillParams(**{k: v for k, v in self.entroprefill.items() if k != "layer"})  # validates

    def to_dict(self) -> dict:
        d = asdict(self)
        d["out"] = str(self.out)
        return d


@dataclass
class ReportResult:
    """What :func:`run_report` wrote: ``html``, ``figures`` ``{name: [paths]}``, ``tables``
    ``{name: [csv, parquet]}``, ``manifest`` and the per-stage ``timings`` (seconds)."""

    out: Path
    html: Path
    manifest: Path
    figures: dict
    tables: dict
    timings: dict

    def summary(self) -> str:
        n_fig = sum(len(v) for v in self.figures.values())
        n_tab = sum(len(v) for v in self.tables.values())
        return (f"wrote {self.html}\n  figures: {self.out / 'figures'} ({len(self.figures)} figures, {n_fig} files)\n"
                f"  tables:  {self.out / 'tables'} ({len(self.tables)} tables, {n_tab} files)\n"
                f"  manifest: {self.manifest}\n  total {self.timings.get('total', float('nan')):.1f} s")


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
    atomic_write_bytes(csv_path, df.to_csv(index=False).encode("utf-8"))
    buf = io.BytesIO()
    _parquet_safe(df).to_parquet(buf, index=False)
    atomic_write_bytes(pq_path, buf.getvalue())
    return [csv_path, pq_path]


# ----------------------------------------------------------------------------- tables
def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (task, method, parameters): runs, mean EM / F1 / contains / first-token agreement, the mean
    retained fraction of the prompt and mean KV bytes (reshaping of the sweep frame, no new science)."""
    if df.empty:
        return pd.DataFrame(columns=["task", "method", "setting", "runs", "em", "f1", "contains",
                                     "first_token_agree", "retained_frac", "kv_bytes", "wall_s", "errors"])
    d = df.copy()
    d["setting"] = d.apply(_setting, axis=1)
    d["retained_frac"] = pd.to_numeric(d["retained_tokens"], errors="coerce") / pd.to_numeric(d["prompt_tokens"],
                                                                                              errors="coerce")
    d["errors"] = d["error"].map(lambda e: int(isinstance(e, str) and bool(e)))
    g = d.groupby(["task", "method", "setting"], sort=True, dropna=False)
    out = g.agg(runs=("item_id", "size"), em=("em", "mean"), f1=("f1", "mean"), contains=("contains", "mean"),
                first_token_agree=("first_token_agree", "mean"), retained_frac=("retained_frac", "mean"),
                kv_bytes=("kv_bytes", "mean"), wall_s=("wall_s", "mean"), errors=("errors", "sum")).reset_index()
    return out


def _setting(row) -> str:
    try:
        p = json.loads(row["params"]) if isinstance(row["params"], str) else {}
    except json.JSONDecodeError:
        p = {}
    if row["method"] == "evict":
        b = p.get("budget_frac", p.get("budget"))
        return f"{p.get('policy', 'full')} @ {b}" if b is not None else str(p.get("policy", "full"))
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


def _items(cfg: ReportConfig, tokenizer):

    items = []
    if cfg.n_squad:
        items += tasks.squad_single(datasets.load_squad("sample"), n=cfg.n_squad, n_distractors=cfg.n_distractors,
                                    seed=cfg.seed)
    if cfg.n_needle:
        n = cfg.n_needle
        depths = (0.5,) if n == 1 else tuple(round(0.1 + 0.8 * i / (n - 1), 3) for i in range(n))
        items += tasks.needle(tokenizer, datasets.load_essays("sample"), lengths=(cfg.needle_length,), depths=depths,
                              n=1, seed=cfg.seed)
    return items


def _method_grid(cfg: ReportConfig) -> dict:
    grid = {}
    for m in cfg.methods:
        if m == "full":
            grid["full"] = {}
        elif m == "entroprefill":
            grid["entroprefill"] = dict(cfg.entroprefill)
        elif m == "evict":
            grid["evict"] = {"policy": list(cfg.policies), "budget_frac": list(cfg.budget_fracs)}
    return grid


def _sweep_figures(df: pd.DataFrame, model_id: str) -> dict:
    """Accuracy vs retained fraction (one line per method, per policy for ``evict``) and the KV-bytes table."""

    d = df.copy()
    pol = d["p_policy"] if "p_policy" in d.columns else pd.Series([None] * len(d), index=d.index)
    d["line"] = [p if m == "evict" and isinstance(p, str) else m for m, p in zip(d["method"], pol)]
    by = ["method"] + [c for c in ("p_policy", "p_budget_frac", "p_budget") if c in d.columns]
    return {"accuracy_vs_budget": plots.accuracy_vs_budget(d, metric="contains", x="retained_fraction", by="line",
                                                           model_id=model_id),
            "kv_bytes_table": plots.kv_bytes_table(d, by=by, metrics=["em", "f1", "contains"], model_id=model_id)}


def _needle_sentence(item) -> str:
    doc = item.documents[item.answer_doc]
    m = re.search(r"The secret number of the [^.]*? is \d+\.", doc)
    return m.group(0) if m else item.answers[0]


def run_report(cfg: ReportConfig | None = None, *, lm=None) -> ReportResult:
    """Run the study of ``cfg`` and write the report (see the module docstring); ``lm``: a loaded model to
    use instead of loading ``cfg.model``."""


    cfg = cfg or ReportConfig()
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    # Chromium starts while the model loads (figure export needs it at the end)
    server_error: list[BaseException] = []

    def start_server():
        try:
            ex.ensure_server()
        except BaseException as e:  # noqa: BLE001 - re-raised at export time
            server_error.append(e)

    server_thread = threading.Thread(target=start_server, daemon=True, name="report-kaleido")
    server_thread.start()

    stages = ["load model", "capture + analysis", "sweep", "needle eviction", "export figures", "tables + html"]
    bar = tqdm(total=len(stages), desc="report", unit="stage", disable=not cfg.progress)

    def stage(name):
        bar.set_postfix_str(name)
        return time.perf_counter()

    figures: dict = {}
    tables: dict[str, pd.DataFrame] = {}
    notes: dict[str, str] = {}

    threads_before = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        # 1. model
        t0 = stage("load model")
        if lm is None:

            lm = load_model(cfg.model, device=cfg.device, progress=cfg.progress)
        timings["load_model"] = time.perf_counter() - t0
        bar.update(1)

        # 2. capture + analysis of the bundled example
        t0 = stage("capture + analysis")
        figures_c, tables_c, notes_c, prompt_info = _capture_part(cfg, lm)
        figures.update(figures_c)
        tables.update(tables_c)
        notes.update(notes_c)
        timings["capture_analysis"] = time.perf_counter() - t0
        bar.update(1)

        # 3. sweep
        t0 = stage("sweep")

        items = _items(cfg, lm.tokenizer)
        df = sweep(lm, items, _method_grid(cfg), seeds=(cfg.seed,), max_new_tokens=cfg.max_new_tokens,
                   progress=cfg.progress, on_error="record")
        tables["items"] = items_frame(items)
        tables["sweep"] = df
        tables["summary"] = summary_table(df)
        notes["sweep"] = (f"{len(items)} prompts × methods {list(cfg.methods)} (evict: policies {list(cfg.policies)} "
                          f"at budget fractions {list(cfg.budget_fracs)}), {cfg.max_new_tokens} greedy tokens; "
                          f"{int(df['error'].map(lambda e: isinstance(e, str)).sum())} runs with errors.")
        figures.update(_sweep_figures(df, lm.model_id))
        timings["sweep"] = time.perf_counter() - t0
        bar.update(1)

        # 4. needle eviction: survival of the needle's tokens per policy
        t0 = stage("needle eviction")
        needles = [it for it in items if it.task == "needle"]
        if needles:
            f_n, t_n, note = _needle_part(cfg, lm, needles[0])
            figures.update(f_n)
            tables.update(t_n)
            notes["needle_survival"] = note
        timings["needle_eviction"] = time.perf_counter() - t0
        bar.update(1)

        # 5. figures for papers
        t0 = stage("export figures")
        server_thread.join()
        if server_error:
            raise server_error[0]
        widths = {n: cfg.widths.get(n, export_width(n, f)) for n, f in figures.items()}
        fig_files = ex.export_all(figures, out / "figures", widths=widths, prompt_hash=prompt_info.get("prompt_hash"),
                                  progress=cfg.progress)
        timings["export"] = time.perf_counter() - t0
        bar.update(1)

        # 6. tables and the HTML page
        t0 = stage("tables + html")
        table_files = {name: write_table(t, out / "tables", name) for name, t in tables.items()}
        timings["tables_html"] = time.perf_counter() - t0  # the html below is quick
        timings["total"] = time.perf_counter() - t_start
        info = _run_info(cfg, lm, prompt_info, timings)
        html_path = write_html(out / "report.html", figures, tables, fig_files, table_files, info, notes)
        timings["total"] = time.perf_counter() - t_start
        manifest = out / "manifest.json"
        man = {**info, "timings": timings, "html": html_path.name,
               "figures": {n: [str(p.relative_to(out)) for p in ps] for n, ps in fig_files.items()},
               "tables": {n: [str(p.relative_to(out)) for p in ps] for n, ps in table_files.items()}}
        atomic_write_bytes(manifest, (json.dumps(jsonable(man), indent=2, ensure_ascii=False) + "\n").encode())
        bar.update(1)
    finally:
        bar.close()
        torch.set_num_threads(threads_before)
    return ReportResult(out=out, html=html_path, manifest=manifest, figures=fig_files, tables=table_files,
                        timings=timings)


def _capture_part(cfg: ReportConfig, lm):

    prompt = load_example().build(lm.tokenizer, max_context=lm.shape.max_context)
    cap = run_capture(lm, prompt, RowSet(tail=cfg.capture_tail, n_decode=cfg.capture_decode), progress=cfg.progress)
    params = EntroPrefillParams(**{k: v for k, v in cfg.entroprefill.items() if k != "layer"})
    tr = trace(cap, params)
    tf = tr.to_frame()
    valid = [int(l) for l in tf.loc[tf["valid"].astype(bool), "layer"]]
    layer = tr.l_star if tr.l_star is not None and tr.l_star >= 0 else (valid[-1] if valid else cap.L - 1)
    pool = tr.pooling
    head = int(pool.w[layer].argmax()) if getattr(pool, "w", None) is not None else 0
    figs = {
        "sink_mass": plots.sink_mass_heatmap(cap),
        "attention_strip": plots.attention_strip(cap, layer, head),
        "head_weights": plots.head_heatmap(pool, "w", model_id=cap.model_id),
        "chunk_priorities": plots.chunk_priorities(tr.priorities, cap.spans, layer, removed=tr, model_id=cap.model_id),
        "trace_layers": plots.trace_layers(tr),
    }
    if tr.selections:
        figs["certificate"] = plots.certificate(tr)
    tabs = {"trace": tr.to_frame(), "priorities": tr.priorities.to_frame(), "head_pooling": pool.to_frame()}
    answer = lm.tokenizer.decode(cap.generated_ids) if cap.generated_ids else ""
    notes = {"trace": f"{tr.decision} (capture of the bundled example: T = {cap.T}, k = {cap.spans.k} chunks, "
                      f"greedy continuation {answer!r}; figures at layer {layer}, head {head})",
             "sink_mass": "Attention mass the observer rows put on the first tokens (sinks), per layer and head.",
             "attention_strip": f"Layer {layer}, head {head} (its largest head weight w), mean of the observer rows.",
             "head_weights": "Head weights w of the sink-isolated Rényi pooling (SPEC §2).",
             "chunk_priorities": f"Chunk priorities S, ℓ, κ at layer {layer}; removed chunks in vermillion.",
             "trace_layers": "The per-layer 7-step decision (validity, D_l, U_l, stability streak, audit).",
             "certificate": "Greedy removal D_l against the dual certificate U_l, per monitored layer."}
    info = {"prompt_hash": prompt_hash(prompt), "example_T": cap.T, "decision": tr.decision, "layer": layer,
            "head": head}
    return figs, tabs, notes, info


def _needle_part(cfg: ReportConfig, lm, item):

    prompt = item.build(lm.tokenizer, max_context=lm.shape.max_context)
    pols = [eviction.policy_from_params("full")] + [eviction.policy_from_params(p) for p in cfg.policies]
    budgets = sorted({max(1, math.ceil(f * prompt.T)) for f in cfg.budget_fracs})
    results = eviction.run_policies(lm, prompt, pols, budgets, cfg.max_new_tokens, progress=cfg.progress)
    sentence = _needle_sentence(item)
    positions = eviction.token_positions(prompt, lm.tokenizer, sentence)
    surv = eviction.survival_table(results, positions, answer=item.answers[0])
    surv.insert(0, "item_id", item.item_id)
    figs = {"kept_positions": plots.kept_positions(results, prompt, highlight=positions, model_id=lm.model_id)}
    note = (f"Needle {sentence!r} ({len(positions)} tokens) in a {prompt.T}-token haystack; every policy at budgets "
            f"{budgets} from one shared prefill; kept_mean = fraction of needle tokens kept (mean over layers and KV "
            f"groups); correct = the answer {item.answers[0]!r} occurs in the reply.")
    return figs, {"needle_survival": surv}, note


def _run_info(cfg: ReportConfig, lm, prompt_info: dict, timings: dict) -> dict:

    return {"title": "Attention workbench report", "model_id": lm.model_id, "device": str(lm.device),
            "dtype": str(lm.dtype).replace("torch.", ""),
            "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "config": cfg.to_dict(), "versions": _versions(), "example": prompt_info}


# ----------------------------------------------------------------------------- html
_CSS = """
body{font-family:"DejaVu Sans","Liberation Sans",Arial,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
h3{font-size:1.05em;margin-bottom:.2em}.note{color:#555;font-size:.92em}.files a{margin-right:.6em;font-size:.9em}
table.data{border-collapse:collapse;font-size:.8em;margin:.5em 0}table.data td,table.data th{border:1px solid #ddd;
padding:2px 6px;text-align:right}table.data th{background:#f4f4f4}.scroll{max-height:420px;overflow:auto}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.2em 1em;font-size:.9em}dl.meta dt{font-weight:bold}
nav a{margin-right:.8em}
"""
MAX_HTML_ROWS = 200


def _table_html(df: pd.DataFrame) -> str:
    show = df.head(MAX_HTML_ROWS).copy()
    for c in show.columns:  # long lists (generated ids) and floats kept readable
        if show[c].dtype == object:
            show[c] = show[c].map(lambda v: (str(v)[:80] + "…") if isinstance(v, (list, tuple, str)) and len(str(v)) > 80
                                  else v)
    h = show.to_html(index=False, classes="data", border=0, escape=True, na_rep="", float_format=lambda v: f"{v:.4g}")
    more = f"<p class='note'>first {MAX_HTML_ROWS} of {len(df)} rows</p>" if len(df) > MAX_HTML_ROWS else ""
    return f"<div class='scroll'>{h}</div>{more}"


def write_html(path, figures: dict, tables: dict, fig_files: dict, table_files: dict, info: dict,
               notes: dict | None = None) -> Path:
    """One self-contained HTML page: plotly.js inlined once, each figure as an interactive div with links to
    its exported files, each table as HTML with links to its CSV/parquet. Written atomically."""

    path = Path(path)
    notes = notes or {}
    e = html.escape
    rel = lambda p: Path(p).relative_to(path.parent).as_posix()  # noqa: E731
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(info.get('title', 'report'))}"
             f"</title><style>{_CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>",
             f"<h1>{e(info.get('title', 'Report'))}</h1>"]
    meta = {"model": info.get("model_id"), "device / dtype": f"{info.get('device')} / {info.get('dtype')}",
            "created (UTC)": info.get("created_utc"),
            "settings": json.dumps({k: v for k, v in info.get("config", {}).items() if k not in ("widths", "progress")},
                                   default=str),
            "versions": ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items()),
            "example prompt sha256": info.get("example", {}).get("prompt_hash")}
    parts.append("<dl class='meta'>" + "".join(f"<dt>{e(k)}</dt><dd>{e(str(v))}</dd>" for k, v in meta.items())
                 + "</dl>")
    parts.append("<nav><b>Figures:</b> " + "".join(f"<a href='#fig-{e(n)}'>{e(n)}</a>" for n in figures)
                 + "<br><b>Tables:</b> " + "".join(f"<a href='#tab-{e(n)}'>{e(n)}</a>" for n in tables) + "</nav>")
    parts.append("<h2>Figures</h2>")
    for name, fig in figures.items():
        title = getattr(getattr(fig.layout, "title", None), "text", None) or name
        links = " ".join(f"<a href='{e(rel(p))}'>{e(Path(p).suffix[1:])}</a>" for p in fig_files.get(name, []))
        div = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"plot-{name}",
                          config={"displaylogo": False, "responsive": True})
        parts.append(f"<section id='fig-{e(name)}'><h3>{e(name)}: {e(title)}</h3>"
                     + (f"<p class='note'>{e(notes[name])}</p>" if name in notes else "")
                     + f"{div}<p class='files'>files: {links}</p></section>")
    parts.append("<h2>Tables</h2>")
    for name, df in tables.items():
        links = " ".join(f"<a href='{e(rel(p))}'>{e(Path(p).suffix[1:])}</a>" for p in table_files.get(name, []))
        parts.append(f"<section id='tab-{e(name)}'><h3>{e(name)} ({len(df)} rows × {len(df.columns)} columns)</h3>"
                     + (f"<p class='note'>{e(notes[name])}</p>" if name in notes else "")
                     + f"{_table_html(df)}<p class='files'>files: {links}</p></section>")
    parts.append("</body></html>")
    atomic_write_bytes(path, "\n".join(parts).encode("utf-8"))
    return path
