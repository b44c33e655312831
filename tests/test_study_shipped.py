"""The shipped study: ``benchmarks/study_q05/`` holds every cell of the RESULTS study on the research
model qwen2.5-coder-0.5b: the test split's cells (``study.parquet``), the protocol cells (``study.w1.parquet``:
SnapKV query-agnostic and the follow-up items), the calibration split's cells and split, and the per-prompt leap,
priority-rank and answer-kept tables its captures gave. This checks what RESULTS says from those files alone, with
no model: the run's size and errors, the calibration's choice and the disjoint splits, the tables
``benchmarks/study_tables.py`` regenerates byte for byte, and the "What this study shows" numbers recomputed
here independently (cluster means, the exact sign / McNemar test with scipy, the margin's Tango score interval and
its exact unconditional test from their definitions, the MDE by root-finding, the verdict rule, the reference gate)."""
from __future__ import annotations

import json
import math
import runpy
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import brentq
from scipy.stats import binomtest, norm
from test_stats import _exact_brute, _tango_brute

from workbench.study.calibration import split_units
from workbench.study.findings import MIN_REFERENCE_ACCURACY, MIN_REFERENCE_RIGHT
from workbench.study.ruler import RULER_TASKS

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SHIPPED = BENCH / "study_q05"
FILES = ("study.parquet", "study.w1.parquet", "study_leap.parquet", "study_ranks.parquet", "study_kept.parquet",
         "study_calibration.parquet", "study_calibration_split.parquet", "study_calibration_cells.parquet")
FOLLOWUP_CLAIM = "DeferKV ≥ SnapKV at the same budget, second answer (one eviction, two questions)"
AGNOSTIC_CLAIM = "DeferKV (query-aware) ≥ SnapKV query-agnostic (kvpress's protocol) at the same budget"


def _labelled(df: pd.DataFrame) -> pd.DataFrame:
    p = df["params"].map(json.loads)
    df["policy"] = p.map(lambda d: d.get("policy"))
    df["frac"] = p.map(lambda d: d.get("budget_frac"))
    df["query"] = p.map(lambda d: d.get("query", "aware"))
    df["unit"] = df["task"] + "/" + df["meta_cluster"].where(df["meta_cluster"].notna(), df["item_id"])
    return df


@pytest.fixture(scope="module")
def cells() -> pd.DataFrame:
    """Every cell of the study: the test split's grid and the protocol cells."""
    return _labelled(pd.concat([pd.read_parquet(SHIPPED / f) for f in FILES[:2]], ignore_index=True))


@pytest.fixture(scope="module")
def calibration_cells() -> pd.DataFrame:
    return _labelled(pd.read_parquet(SHIPPED / "study_calibration_cells.parquet"))


@pytest.fixture(scope="module")
def claims() -> pd.DataFrame:
    return pd.read_parquet(SHIPPED / "study_conclusions.parquet")


def _p(wins: int, losses: int) -> float:
    return binomtest(wins, wins + losses, 0.5).pvalue if wins + losses else 1.0


def _verdict(r) -> str:
    """The rule (README, ``workbench.study.verdicts``) for a claimed effect > 0, from the row's own numbers."""
    if r.lo > 0 and r.p < 0.05:
        return "supported"
    if r.kind == "superiority":
        return "contradicted" if r.hi < 0 and r.p < 0.05 else "inconclusive"
    if r.lo1 > -r.margin and r.p_ni < 0.05:
        return "non-inferior"
    return "inferior" if r.hi1 < -r.margin and r.p_inf < 0.05 else "inconclusive"


def _mde(n, disc, sided) -> float:
    """The Δ where the normal-approximation power of McNemar's test reaches 0.8, by root-finding (inf if none)."""
    psi = disc if disc > 0 else 1 / n
    za = norm.ppf(1 - 0.05 / sided)
    f = lambda dl: norm.cdf((np.sqrt(n) * dl - za * np.sqrt(psi)) / np.sqrt(psi - dl * dl)) - 0.8  # noqa: E731
    lo, hi = za * np.sqrt(psi / n), np.sqrt(psi) * (1 - 1e-12)
    return brentq(f, lo, hi) if f(hi) > 0 else math.inf


def test_the_run_is_the_size_results_states(cells, calibration_cells):
    """The test split's grid: every prompt with every setting, 0 errors, on the research model; the calibration
    split's prompts beside it, on disjoint units; the protocol cells: new cells only, and each failed one a refusal
    that says why (DeferKV needs the question; the follow-up protocol asks both questions in the cache)."""
    grid = _labelled(pd.read_parquet(SHIPPED / "study.parquet"))
    prompts = grid[["task", "item_id"]].drop_duplicates()
    assert len(prompts) + calibration_cells[["task", "item_id"]].drop_duplicates().shape[0] >= 90
    assert grid["error"].isna().all()
    settings = grid[["method", "params"]].drop_duplicates()
    assert (grid.groupby(["task", "item_id"]).size() == len(settings)).all()
    assert set(cells["model"]) == {"qwen2.5-coder-0.5b"} or cells["model"].str.contains("Qwen2.5-Coder-0.5B",
                                                                                          case=False).all()
    assert {"snapkv", "deferkv", "h2o", "streaming", "tova", "page-entrokv", "expected-attention", "adakv"} <= set(
        grid["policy"].dropna())
    assert set(cells["frac"].dropna()) == {0.25, 0.5}
    split = pd.read_parquet(SHIPPED / "study_calibration_split.parquet")
    cal, test = (set(split.loc[split["split"] == k, "unit"]) for k in ("calibration", "test"))
    assert cal and test and not cal & test
    # the split is the per-task draw (fraction 0.3, seed 0): every family keeps >= 70 % of its clusters, rounded down,
    # for the verdicts, so no family's test side is left too small by the draw
    drawn = split_units(split["unit"], 0.3, 0)
    assert (set(drawn.calibration), set(drawn.test)) == (cal, test)
    for task, n_cal, n_test in drawn.per_task:
        assert n_cal == math.ceil(0.3 * (n_cal + n_test) - 1e-9) and n_test >= math.floor(0.7 * (n_cal + n_test))
    assert set(calibration_cells["unit"]) == cal and set(grid["unit"]) == test
    assert not set(cells["unit"]) & cal and calibration_cells["error"].isna().all()
    extra = cells[~cells["cell"].isin(grid["cell"])]
    assert len(extra) == len(cells) - len(grid) and not extra["cell"].duplicated().any()
    agnostic = extra[extra["query"] == "agnostic"]
    assert len(agnostic) and set(agnostic["policy"]) == {"snapkv", "deferkv"}
    failed = extra[extra["error"].notna()]
    assert set(failed["query"]) == {"agnostic"}
    assert (failed["policy"].eq("deferkv") | failed["task"].eq("followup_multikey")).all()
    assert failed["error"].str.contains("cannot run query-agnostic|asks both questions in the cache").all()
    ok = agnostic[agnostic["error"].isna()]
    assert set(ok["policy"]) == {"snapkv"} and (ok["prompt_tokens"] > ok["prefill_tokens"]).all()  # no question
    follow = extra[extra["task"] == "followup_multikey"]
    assert len(follow) and set(follow.loc[follow["error"].isna(), "method"]) == {"full", "evict"}


def test_the_calibration_is_recomputed_from_its_split(cells, calibration_cells):
    """The calibration rule from its definition on the calibration split's cells: per candidate preset, the mean over
    clusters of (contains − full context's) and of the removed share; the chosen preset removes the most among those
    within δ; the test split ran exactly that preset, and the shipped calibration table says the same."""
    d = calibration_cells
    full = d[d["method"] == "full"].set_index(["task", "item_id"])["contains"]
    got = {}
    for params, g in d[d["method"] == "entroprefill"].groupby("params"):
        g = g.assign(diff=g["contains"].to_numpy() - full.loc[list(zip(g["task"], g["item_id"]))].to_numpy(),
                     removed=1 - g["retained_tokens"].astype(float) / g["prompt_tokens"].astype(float))
        per = g.groupby("unit")[["diff", "removed"]].mean()
        got[params] = (len(per), float(per["diff"].mean()), float(per["removed"].mean()))
    within = {k: v for k, v in got.items() if v[1] >= -0.1 - 1e-12}
    assert within  # else the rule falls back to the closest and flags it
    chosen = max(within, key=lambda k: within[k][2])
    ep = cells[cells["method"] == "entroprefill"]
    assert set(ep["params"]) == {chosen}
    table = pd.read_parquet(SHIPPED / "study_calibration.parquet")
    row = table[table["chosen"]].iloc[0]
    assert (row["n"], row["diff"], row["removed_share"]) == pytest.approx(got[chosen], abs=1e-12)
    assert len(table) == len(got) and table["chosen"].sum() == 1


def test_study_tables_regenerates_the_shipped_tables(tmp_path, monkeypatch):
    """``benchmarks/study_tables.py`` on a copy of the shipped files writes the shipped tables, the summary's "What
    this study shows" and the claims' parquet again, line for line (the metadata comment aside), without a model."""
    for f in (*FILES, "study_summary.md"):  # the summary: its opening section is regenerated, the rest kept
        shutil.copy(SHIPPED / f, tmp_path / f)
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setattr(sys, "argv", ["study_tables.py", "--out-dir", str(tmp_path)])
    runpy.run_path(str(BENCH / "study_tables.py"), run_name="__main__")
    def body(path):  # the run's metadata comment (time, load, command line) aside
        return [ln for ln in path.read_text().splitlines() if not ln.startswith("<!-- ")]

    for name in ("study_tables.md", "study_timing.md", "study_summary.md"):
        assert body(tmp_path / name) == body(SHIPPED / name), name
    assert "### What this study shows" in (tmp_path / "study_tables.md").read_text()
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "study_conclusions.parquet"),
                                  pd.read_parquet(SHIPPED / "study_conclusions.parquet"))


def _reference_ok(cells) -> dict:
    full = cells[cells["method"] == "full"]
    right = full.groupby("task")["contains"].apply(lambda s: int((s >= 0.5).sum()))
    n = full.groupby("task").size()
    return {t: bool(right[t] / n[t] >= MIN_REFERENCE_ACCURACY and right[t] >= MIN_REFERENCE_RIGHT) for t in n.index}


@pytest.mark.parametrize("claim", ["DeferKV ≥ SnapKV at the same budget", AGNOSTIC_CLAIM, FOLLOWUP_CLAIM])
def test_deferkv_against_snapkv_recomputed_with_scipy(cells, claims, claim):
    """Every DeferKV ≥ SnapKV row (query-aware both, SnapKV query-agnostic, the follow-up protocol's second answer):
    n (clusters), effect, the exact test's p and the verdict, recomputed from the cells (per-cluster means of
    ``contains``; sign test on the cluster differences = McNemar exact on 0/1)."""
    ok = _reference_ok(cells)
    rows = claims[claims["claim"] == claim]
    ruler_ok = sorted(t for t in ok if t in RULER_TASKS and ok[t])
    ev = cells[(cells["method"] == "evict") & cells["error"].isna()]
    if claim == AGNOSTIC_CLAIM:  # on the families the protocol run covered, one row per budget
        assert len(rows) == 2 * ev.loc[ev["query"] == "agnostic", "task"].nunique() and len(rows)
    elif claim == FOLLOWUP_CLAIM:
        assert len(rows) == 2 and set(rows["task"]) == {"followup_multikey"}
    else:  # per family and budget, plus the pooled RULER-style row per budget
        assert len(rows) == 2 * (len(set(ok) - {"followup_multikey"}) + 1)
    for r in rows.itertuples():
        frac = float(r.comparison.split("@ ")[1].split(" ")[0])
        tasks = ruler_ok if r.task.startswith("RULER-style") else [r.task]
        snap = "agnostic" if claim == AGNOSTIC_CLAIM else "aware"
        d = ev[ev["task"].isin(tasks) & (ev["frac"] == frac) & (((ev["policy"] == "deferkv") & (ev["query"] == "aware"))
                                                                | ((ev["policy"] == "snapkv") & (ev["query"] == snap)))]
        w = d.pivot_table(index=["task", "item_id", "unit"], columns="policy", values="contains").reset_index()
        per = w.dropna(subset=["deferkv", "snapkv"]).groupby("unit")[["deferkv", "snapkv"]].mean()
        w = w.dropna(subset=["deferkv", "snapkv"])
        diff = (per["deferkv"] - per["snapkv"]).to_numpy()
        p = _p(int((diff > 0).sum()), int((diff < 0).sum()))
        assert r.n == len(per) and r.prompts == len(w), r.comparison
        assert r.effect == pytest.approx(float(diff.mean()), abs=1e-12)
        assert r.p == pytest.approx(p, rel=1e-9)
        assert r.lo <= r.effect + 1e-12 and r.effect <= r.hi + 1e-12
        # a non-inferiority claim at δ = 0.1 on 0/1 clusters: Tango's one-sided 95 % bounds and, up to 10 clusters,
        # the exact unconditional score test about −δ, both from their definitions (tests/test_stats.py); the
        # discordance and the one-sided MDE
        assert r.kind == "non-inferiority" and r.margin == 0.1
        if np.isin(diff, (-1.0, 0.0, 1.0)).all():
            b, c = int((diff > 0).sum()), int((diff < 0).sum())
            assert r.ni_test == "Tango score"
            if b == len(diff):  # every cluster a win: the upper bound is 1, which the brute form's grid cannot bracket
                assert r.hi1 == pytest.approx(1.0, abs=1e-9) and r.lo1 > 0
            else:
                assert (r.lo1, r.hi1) == pytest.approx(_tango_brute(b, c, len(diff)), abs=1e-6)
            if len(diff) <= 10:
                assert r.p_ni == pytest.approx(_exact_brute(b, c, len(diff)), rel=1e-4)
        assert r.disc == pytest.approx(float(np.mean(diff ** 2)), abs=1e-12)
        assert r.mde == pytest.approx(_mde(len(diff), r.disc, 1), rel=1e-6)
        assert r.underpowered == (r.verdict == "inconclusive" and r.mde > 0.1)
        want = _verdict(r) if all(ok[t] for t in tasks) else "reference failed"
        assert r.verdict == want, (r.task, r.comparison)
    # both budgets carry a verdict on the pooled RULER-style families (their references pass)
    pooled = rows[rows["task"].str.startswith("RULER-style")]
    if claim == "DeferKV ≥ SnapKV at the same budget":
        assert len(pooled) == 2 and set(pooled["verdict"]) <= {"supported", "non-inferior", "inconclusive", "inferior"}


def test_leap_and_priority_rows_recomputed_with_scipy(cells, claims):
    ok = _reference_ok(cells)  # the rows are on SQuAD prompts: a failed SQuAD reference reads "reference failed"

    def want(r) -> str:
        return _verdict(r) if ok[r.task] else "reference failed"

    leap = pd.read_parquet(SHIPPED / "study_leap.parquet")
    g = leap.pivot_table(index="item_id", columns=["r_from", "r_to"], values="gain")
    for comp, other in (("0→1 vs 1→2", (1, 2)), ("0→1 vs −1→0", (-1, 0))):
        d = (g[(0, 1)] - g[other]).dropna().to_numpy()
        r = claims[claims["comparison"] == comp].iloc[0]
        assert r.n == len(d) and r.effect == pytest.approx(d.mean(), abs=1e-12)
        assert r.p == pytest.approx(_p(int((d > 0).sum()), int((d < 0).sum())), rel=1e-9)
        assert r.kind == "superiority" and r.verdict == want(r)
        assert r.mde == pytest.approx(_mde(len(d), float(np.mean(d ** 2)), 2), rel=1e-6)
    ranks = pd.read_parquet(SHIPPED / "study_ranks.parquet")
    w = ranks.pivot(index="item_id", columns="priority", values="rank").dropna()
    for other in ("mass", "renyi, zeta=1", "headmax", "uniform"):
        d = (w[other] - w["renyi"]).to_numpy()  # standing k + 1 - rank: Rényi's standing minus the other's
        r = claims[claims["comparison"] == f"renyi vs {other}"].iloc[0]
        assert r.n == len(d) and r.effect == pytest.approx(d.mean(), abs=1e-9)
        assert r.p == pytest.approx(_p(int((d > 0).sum()), int((d < 0).sum())), rel=1e-9)
        assert r.kind == "superiority" and r.verdict == want(r)


def test_entroprefill_rows_recomputed(cells, claims):
    """Removal share and bypass rate per preset and family, from the entroprefill cells."""
    ep = cells[cells["method"] == "entroprefill"]
    names = {"{}": "EntroPrefill paper"}
    checked = 0
    for params, g in ep.groupby("params"):
        name = names.get(params, "EntroPrefill loose")
        for task, t in g.groupby("task"):
            sel = claims[(claims["task"] == task) & claims["claim"].str.startswith(name + " prunes")]
            if sel.empty:
                continue
            assert len(sel) == 1  # removed share > 0 and "did not bypass": one event, one row
            r = sel.iloc[0]
            removed = (1 - t["retained_tokens"].astype(float) / t["prompt_tokens"].astype(float))
            units = removed.groupby(t["meta_cluster"].to_numpy()).mean().to_numpy()
            assert r.n == len(units) and r.effect == pytest.approx(units.mean(), abs=1e-6), (name, task)
            assert r.verdict == "descriptive" and np.isnan(r.p)  # by construction of the preset: not a finding
            byp = t["bypass"].astype(float).groupby(t["meta_cluster"].to_numpy()).mean().to_numpy()
            assert f"bypass rate {byp.mean():.2f} over {len(byp)} clusters" in r.note, (name, task)
            assert ((removed > 0) != t["bypass"].astype(bool)).all()  # the same event on every prompt
            acc = claims[(claims["task"] == task) & (claims["claim"] == name + " keeps full-context accuracy")]
            if t["bypass"].astype(bool).all():  # full context compared with itself
                assert set(acc["verdict"]) == {"descriptive"}
            else:
                assert set(acc["kind"]) == {"non-inferiority"}
            checked += 1
    assert checked >= 5  # the calibrated preset on every family
    assert not claims["claim"].str.contains("audit is not vacuous").any()
    ls = claims[claims["claim"].str.endswith("accepted layer l*")]
    assert len(ls) and ls["lo"].isna().all() and ls["hi"].isna().all()  # no interval from layer indices
