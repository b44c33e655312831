"""The headless report: ``python -m workbench report --tiny`` end to end, and its tables.

One subprocess run (module fixture) on the embedded model; needs Debian's chromium for the exports.
"""
from __future__ import annotations

import hashlib
import html
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import _figure_files as ff
import pandas as pd
import pytest

import workbench
from workbench.analyse.stats import wilson_ci
from workbench.study.report import SINGLE_TITLE_CHARS, WIDE, ReportConfig, summary_table
from workbench.study.sweep import COLUMNS

FIGURES = {"sink_mass", "attention_strip", "head_weights", "chunk_priorities", "trace_layers", "certificate",
           "accuracy_vs_budget", "kv_bytes_table", "kept_positions"}
TABLES = {"trace", "priorities", "head_pooling", "items", "sweep", "summary", "needle_survival", "reference_check",
          "accuracy", "comparisons", "timing", "conclusions", "bypasses"}
TINY_LIMIT_S = 300  # the tiny setting takes ~1 min on a loaded 2-core machine; this catches a runaway setting


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "workbench", "report", "--tiny", "--data", "sample", "--no-progress", "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr[-4000:]
    return out, r.stdout, wall


def test_prints_where_it_wrote(report):
    out, stdout, wall = report
    assert f"wrote {out / 'report.html'}" in stdout
    assert str(out / "figures") in stdout and str(out / "tables") in stdout
    man = json.loads((out / "manifest.json").read_text())
    assert man["timings"]["total"] < TINY_LIMIT_S, man["timings"]
    assert man["config"]["tiny"] is True and man["config"]["threads"] == 1


def test_every_figure_has_all_files_at_its_width(report):
    out, _, _ = report
    man = json.loads((out / "manifest.json").read_text())
    assert set(man["figures"]) == FIGURES
    for name in FIGURES:
        files = sorted(man["figures"][name])
        assert files == sorted(f"figures/{name}.{e}" for e in ("pdf", "svg", "png", "json", "csv")), name
        for f in files:
            assert (out / f).stat().st_size > 0, f
        side = json.loads((out / "figures" / f"{name}.json").read_text())
        assert man["model_id"] == "SmolLM2-135M-Instruct"
        assert side["model_id"].startswith(man["model_id"]), name  # captures add "(llama, L=30, ...)"
        assert side["prompt_hash"] == man["example"]["prompt_hash"] and re.fullmatch(r"[0-9a-f]{64}", side["prompt_hash"])
        assert side["figure"] in (name, "head_heatmap", "sink_mass_heatmap"), name  # the plots function
        size = side["sizes"][0]
        expected_pt = 504 if size["preset"] == "double" else 240
        pdf = (out / "figures" / f"{name}.pdf").read_bytes()
        box = [float(v) for v in re.search(rb"/MediaBox \[([^\]]*)\]", pdf).group(1).split()]
        assert box[2] == pytest.approx(expected_pt, abs=0.05), name
        assert ff.png_size(out / "figures" / f"{name}.png")[:2] == tuple(size["png_px"]), name
        svg = (out / "figures" / f"{name}.svg").read_text()
        title = side["title"] if side["title_kept"] else None  # the default export drops the title
        if title:  # the title is real text in the SVG and the PDF (first 20 characters, tags and spaces dropped)
            head = plain(title)[:20]
            assert head in plain(svg), (name, head)
            assert head in plain(ff.pdf_text(pdf)), (name, head)
        assert len(pd.read_csv(out / "figures" / f"{name}.csv")) > 0, name
    assert json.loads((out / "figures" / "kv_bytes_table.json").read_text())["sizes"][0]["preset"] == "double"
    presets = {n: json.loads((out / "figures" / f"{n}.json").read_text())["sizes"][0]["preset"] for n in FIGURES}
    titles = {n: json.loads((out / "figures" / f"{n}.json").read_text())["title"] or "" for n in FIGURES}
    for n in FIGURES:
        wide = n in WIDE or len(re.sub(r"<[^>]+>", "", titles[n])) > SINGLE_TITLE_CHARS
        assert presets[n] == ("double" if wide else "single"), n
    assert "single" in presets.values() and presets["kv_bytes_table"] == "double"


def plain(text: str) -> str:
    """Text without tags, entities and whitespace."""
    import html

    return re.sub(r"\s", "", html.unescape(re.sub(r"<[^>]+>", "", text)))


def test_html_is_self_contained_and_mentions_everything(report):
    out, _, _ = report
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"<script[^>]+src=", page)  # plotly.js inlined, nothing fetched
    assert page.count("Plotly.newPlot(") >= len(FIGURES)
    from plotly.offline import get_plotlyjs

    assert page.count(get_plotlyjs()[:300]) == 1  # plotly.js once
    for name in FIGURES:
        assert f"id='fig-{name}'" in page and f"href='figures/{name}.pdf'" in page, name
    for name in TABLES:
        assert f"id='tab-{name}'" in page and f"href='tables/{name}.csv'" in page, name
    assert "SmolLM2-135M-Instruct" in page
    assert "deferkv" in page and "entroprefill" in page


def test_tables_parse_with_expected_rows(report):
    out, _, _ = report
    t = out / "tables"
    assert {p.stem for p in t.glob("*.csv")} == TABLES and {p.stem for p in t.glob("*.parquet")} == TABLES
    for name in TABLES:
        c, q = pd.read_csv(t / f"{name}.csv"), pd.read_parquet(t / f"{name}.parquet")
        assert c.shape == q.shape and list(c.columns) == list(q.columns), name

    sw = pd.read_parquet(t / "sweep.parquet")
    assert set(COLUMNS) <= set(sw.columns)
    assert len(sw) == 6  # 1 SQuAD + 1 needle prompt x (full, entroprefill, evict deferkv @ 0.5)
    assert sorted(sw["method"]) == sorted(["full", "entroprefill", "evict"] * 2)
    assert set(sw["task"]) == {"squad_single", "needle"}
    assert sw["error"].isna().all(), sw["error"].tolist()
    assert sw["n_generated"].between(1, 3).all() and (sw["max_new_tokens"] == 3).all()
    assert sw[["em", "f1", "contains"]].stack().between(0, 1).all()
    ev = sw[sw["method"] == "evict"]
    assert (ev["retained_tokens"] == [math.ceil(0.5 * T) for T in ev["prompt_tokens"]]).all()
    full = sw[sw["method"] == "full"]
    assert (full["retained_tokens"] == full["prompt_tokens"]).all()
    assert (sw.loc[sw["method"] == "full", "first_token_agree"] == 1.0).all()

    summ = pd.read_csv(t / "summary.csv")
    assert list(summ.columns) == ["task", "method", "setting", "runs", "em", "f1", "contains", "first_token_agree",
                                  "retained_frac", "wall_s", "errors", "query", "compression_ratio", "kv_frac",
                                  "kv_bytes", "peak_cuda_bytes", "peak_rss_bytes", "ttft_s"]
    assert len(summ) == 6 and (summ["runs"] == 1).all() and (summ["errors"] == 0).all()
    assert set(summ.loc[summ["method"] == "evict", "setting"]) == {"deferkv @ 0.5"}
    assert summ.loc[summ["method"] == "evict", "retained_frac"].between(0.5, 0.51).all()

    surv = pd.read_csv(t / "needle_survival.csv")
    assert list(surv["policy"]) == ["full", "deferkv"]
    assert {"item_id", "policy", "budget", "answer", "correct", "kept_mean", "kept_min_layer",
            "layers_all_kept"} <= set(surv.columns)
    assert surv.loc[0, "kept_mean"] == 1.0 and surv.loc[0, "layers_all_kept"] == 30
    assert 0 <= surv.loc[1, "kept_mean"] <= 1
    needle_T = int(sw.loc[(sw["task"] == "needle") & (sw["method"] == "full"), "prompt_tokens"].iloc[0])
    assert int(surv.loc[1, "budget"]) == math.ceil(0.5 * needle_T)

    tr = pd.read_csv(t / "trace.csv")
    assert len(tr) == 29 and {"layer", "D", "U", "decision"} <= set(tr.columns)  # monitored layers 1..L-1
    assert len(pd.read_csv(t / "head_pooling.csv")) == 30 * 9
    pr = pd.read_csv(t / "priorities.csv")
    assert len(pr) == 30 * pr["chunk"].nunique() and pr["chunk"].nunique() == 8
    items = pd.read_csv(t / "items.csv")
    assert len(items) == 2


def test_summary_table_means():
    df = pd.DataFrame({
        "task": ["t"] * 4, "method": ["full", "full", "evict", "evict"], "item_id": ["a", "b", "a", "b"],
        "params": ["{}", "{}", '{"budget_frac": 0.5, "policy": "snapkv"}', '{"budget_frac": 0.5, "policy": "snapkv"}'],
        "em": [1.0, 0.0, 0.0, 0.0], "f1": [1.0, 0.5, 0.25, 0.75], "contains": [1.0, 1.0, 0.0, 1.0],
        "first_token_agree": [1.0, 1.0, 0.0, 1.0], "retained_tokens": [100, 50, 50, 25],
        "prompt_tokens": [100, 50, 100, 50], "kv_bytes": [10.0, 5.0, 5.0, 2.0], "wall_s": [1.0, 1.0, 2.0, 2.0],
        "error": [None, None, None, "boom"]})
    s = summary_table(df).set_index("method")
    assert s.loc["full", "setting"] == "default" and s.loc["evict", "setting"] == "snapkv @ 0.5"
    assert s.loc["full", "f1"] == 0.75 and s.loc["evict", "f1"] == 0.5
    assert s.loc["evict", "retained_frac"] == 0.5 and s.loc["full", "retained_frac"] == 1.0
    assert s.loc["evict", "errors"] == 1 and s.loc["full", "runs"] == 2


@pytest.mark.parametrize("kw, name", [
    (dict(n_squad=-1), "n_squad"), (dict(n_squad=0, n_needle=0), "n_squad"), (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(needle_length=10), "needle_length"), (dict(methods=("full", "magic")), "methods"),
    (dict(policies=("nope",)), "policies"), (dict(policies=()), "policies"), (dict(budget_fracs=(0,)), "budget_fracs"),
    (dict(budget_fracs=(1.5,)), "budget_fracs"), (dict(threads=0), "threads"), (dict(threads="many"), "threads"),
    (dict(entroprefill={"zeta": 2}), "zeta"),
])
def test_config_rejects_bad_values(kw, name):
    with pytest.raises(ValueError, match=rf"^{name}:"):
        ReportConfig(**kw)


@pytest.mark.parametrize("cores, load, expect", [(2, 0.1, 2), (2, 0.6, 1), (2, 1.4, 1), (2, 12.0, 1), (16, 3.2, 13),
                                                  (1, 0.0, 1)])
def test_auto_threads_takes_the_free_cores(monkeypatch, cores, load, expect):
    """The default ``threads="auto"``: the cores the 1-minute load leaves free, at least one (report_threads.py:
    2 threads 1.3x faster on the quiet 2-core machine, 1 thread 5.2x faster under load 12)."""
    from workbench import util

    monkeypatch.setattr(util.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(util.os, "getloadavg", lambda: (load, load, load))
    assert util.auto_threads() == expect
    assert ReportConfig().threads == "auto"


def test_tiny_config():
    c = ReportConfig.tiny_config(max_new_tokens=5)
    assert (c.n_squad, c.n_needle, c.max_new_tokens, c.policies, c.threads, c.tiny) == (1, 1, 5, ("deferkv",), 1, True)


def test_html_states_findings_cis_reference_and_provenance(report):
    """The page reads as a study: a findings section with one sentence per comparison (n, CI, wins/ties/losses),
    n and a Wilson CI for every accuracy, the reference check (loud: tiny's 3 tokens score 0), the provenance."""
    out, _, _ = report
    page = (out / "report.html").read_text()
    text = lambda s: html.unescape(re.sub(r"<[^>]+>", " ", s))  # noqa: E731

    def section(name):
        i = page.index(f"<section id='{name}'>")
        return page[i:page.index("</section>", i)]

    comp = pd.read_csv(out / "tables" / "comparisons.csv")
    sentences = re.findall(r"<li class='finding'>(.*?)</li>", section("findings"))
    assert len(sentences) == len(comp) == 6  # (entroprefill, deferkv) vs full x (2 tasks + pooled)
    for s, row in zip(map(html.unescape, sentences), comp.itertuples()):
        assert s.startswith(f"{row.a} vs {row.b} on {row.scope}")
        assert f"n = {row.n} paired prompts" in s and f"{row.wins} wins / {row.ties} ties / {row.losses} losses" in s
        assert re.search(r"difference [+-]\d\.\d\d \[[+-]\d\.\d\d, [+-]\d\.\d\d\]", s)
        assert "no detectable difference" in s  # every run is cut at 3 tokens: all tie at 0
    accs = re.findall(r"<li class='accuracy'>(.*?)</li>", section("findings"))
    acc = pd.read_csv(out / "tables" / "accuracy.csv")
    assert len(accs) == len(acc) == 6
    for a, row in zip(map(html.unescape, accs), acc.itertuples()):
        assert f"(n = {row.n}, {row.right} right" in a and f"[95% CI {row.lo:.2f}, {row.hi:.2f}]" in a
        assert row.hi == pytest.approx(wilson_ci(int(row.right), int(row.n))[1])
    ref = text(section("reference-check"))
    assert "REFERENCE FAILED on needle" in ref and "REFERENCE FAILED on squad_single" in ref
    assert "0/1 prompts" in ref and "hit the max_new_tokens cap" in ref
    prov = text(section("provenance"))
    assert "squad-v1.1-dev-sample" in prov and "paul-graham-essays-sample" in prov and "4 articles" in prov
    sha = hashlib.sha256((Path(workbench.__file__).parents[1] / "data" / "squad_sample.json").read_bytes()).hexdigest()
    assert sha in prov
    sw = pd.read_parquet(out / "tables" / "sweep.parquet")
    assert sw["hit_cap"].all() and set(sw["meta_source"]) == {"squad-v1.1-dev-sample", "paul-graham-essays-sample"}
    timing = pd.read_csv(out / "tables" / "timing.csv").set_index(["task", "setting"])
    for task in ("needle", "squad_single"):
        ev = timing.loc[(task, "deferkv @ 0.5")]
        assert ev["method_s"] < ev["wall_s"] and ev["amortised_s"] == pytest.approx(ev["method_s"] + ev["shared_s"])
        assert timing.loc[(task, "shared eviction prefill"), "method_s"] == pytest.approx(ev["shared_s"])



def test_html_opens_with_what_this_study_shows(report):
    """The page opens with the seed claims the sweep can speak to, each with its verdict (tiny's replies score 0:
    every reference fails, so every substantive claim says so; descriptive rows carry none), and names the claims it
    cannot assess."""
    out, _, _ = report
    page = (out / "report.html").read_text()
    assert page.index("<section id='conclusions'>") < page.index("<section id='provenance'>")
    i = page.index("<section id='conclusions'>")
    sec = html.unescape(re.sub(r"<[^>]+>", " ", page[i:page.index("</section>", i)]))
    assert "Verdict rule: each claim declares its kind." in sec and "margin δ = 0.1" in sec and "Not assessed here" in sec
    assert "boundary leap" in sec and "Rényi against mass-only" in sec and "no DeferKV and SnapKV cells" in sec
    t = pd.read_csv(out / "tables" / "conclusions.csv")
    assert len(t) and set(t.loc[t["kind"] != "descriptive", "verdict"]) <= {"reference failed"}
    assert set(t.loc[t["kind"] == "descriptive", "verdict"]) <= {"descriptive"}
    assert set(t["claim"]) >= {"EntroPrefill paper keeps full-context accuracy"}



def test_kv_bytes_table_never_pools_tasks_silently():
    from workbench.show import plots

    df = pd.DataFrame({"task": ["a", "a", "b", "b"], "method": ["full", "evict"] * 2, "item_id": ["1", "1", "2", "2"],
                       "em": [1.0, 0.0, 0.0, 0.0], "kv_bytes": [2.0**20, 2.0**19, 2.0**21, 2.0**20], "error": None})
    fr = plots.figure_frame(plots.kv_bytes_table(df))
    assert list(fr["task"]) == ["a", "a", "b", "b"] and (fr["n"] == 1).all()
    fig = plots.kv_bytes_table(df, by=["method"])
    assert "pooled over 2 tasks" in fig.layout.title.text
    assert "pooled" not in plots.kv_bytes_table(df[df.task == "a"], by=["method"]).layout.title.text


def test_cells_are_written_as_kvpress_runs(report):
    import yaml

    out, _, _ = report
    man = json.loads((out / "manifest.json").read_text())
    sweep = pd.read_parquet(out / "tables" / "sweep.parquet")
    ok = sweep[sweep["error"].isna()]
    runs = man["kvpress_runs"]
    assert runs and all((out / r / f).is_file() for r in runs for f in ("predictions.csv", "metrics.json", "config.yaml"))
    # one run per (task, length, model, method, parameters), and every finished cell in exactly one of them
    assert len(set(runs)) == len(runs) >= ok.groupby(["task", "method", "params"]).ngroups
    assert sum(len(pd.read_csv(out / r / "predictions.csv")) for r in runs) == len(ok)
    full = [r for r in runs if "__no_press__0.00" in r]
    assert full and all(yaml.safe_load((out / r / "config.yaml").read_text())["compression_ratio"] == 0 for r in full)
    for r in runs:
        cfg = yaml.safe_load((out / r / "config.yaml").read_text())
        m = json.loads((out / r / "metrics.json").read_text())
        cells = ok[(ok["task"] == cfg["dataset"]) & (ok["method"] == cfg["method"])]
        assert m[cfg["dataset"]]["n"] == cfg["n"] and cfg["n"] <= len(cells)
        assert Path(r).name.startswith(cfg["dataset"] + "__") and cfg["press_name"] in Path(r).name


def test_entroprefill_presets_by_name():
    """``ReportConfig(presets=...)`` / ``--presets paper,loose``: one EntroPrefill setting per preset in the sweep's
    grid (``entroprefill`` on top of each), each named by its preset in the conclusions; an unknown name is refused
    with the allowed ones."""
    from workbench.analyse.params import PRESETS
    from workbench.choices import PRESET_NAMES
    from workbench.study import report
    from workbench.study.conclusions import preset_name
    from workbench.study.grid import method_settings

    assert PRESET_NAMES == tuple(PRESETS)
    grid = report._method_grid(ReportConfig(presets=("paper", "loose"), methods=("full", "entroprefill")))
    ep = [p for m, p in method_settings(grid) if m == "entroprefill"]
    assert [preset_name(p) for p in ep] == ["EntroPrefill paper", "EntroPrefill loose"]
    assert ep[1] == PRESETS["loose"]["params"]
    over = ReportConfig(presets=("loose",), entroprefill={"target": 0.4}).entroprefill_settings()
    assert over == [{**PRESETS["loose"]["params"], "target": 0.4}]
    assert ReportConfig().entroprefill_settings() == [{}]  # no presets: the one setting, as before
    with pytest.raises(ValueError, match=r"^presets: .*one of \['paper', 'loose', 'strict'\]"):
        ReportConfig(presets=("papr",))


def test_the_default_report_has_enough_needles_for_a_verdict():
    """The default model answers needles; the default report runs enough of them to pass the reference floor with
    one miss to spare, so its claims carry verdicts (3 needles, the old default, gave 'reference failed' on every
    claim). Six tied clusters cannot show non-inferiority at δ = 0.1 (the exact test's p is 0.9⁶ = 0.53; ties
    need 29 clusters): those rows read inconclusive, underpowered, which the report says."""
    from workbench.analyse.stats import tango_exact_p
    from workbench.study.findings import MIN_REFERENCE_RIGHT

    n = ReportConfig().n_needle
    assert n >= MIN_REFERENCE_RIGHT + 1
    p_ni = tango_exact_p(0, 0, n, -0.1)[0]
    assert p_ni == pytest.approx(0.9 ** n) and p_ni > 0.05  # no non-inferiority from six ties
