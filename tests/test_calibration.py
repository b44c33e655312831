"""Calibrate, then test: the split (disjoint, deterministic, by cluster, refusals), the calibration rule on
synthetic paired outcomes with a known right answer, the bypass reason on designed traces where each step is the
refusing one, and ``report --tiny --calibrate`` end to end."""
from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pandas as pd
import pytest
from test_audit import FAR, HEAVY, SIZES, designed_capture
from test_conclusions import LOOSE, _study

from workbench.analyse.bypass import BYPASS_COLUMNS, bypass_reason
from workbench.analyse.params import PRESETS, EntroPrefillParams
from workbench.analyse.procedure import AuditWarning, trace
from workbench.capture.data import Capture
from workbench.run.spans import PromptSpans
from workbench.study.bypasses import bypass_table
from workbench.study.calibration import CalibrationWarning, calibrate, split_items, unit_of
from workbench.study.conclusions import conclusions
from workbench.study.report import run_report
from workbench.study.report_calibration import check_split
from workbench.study.report_config import ReportConfig
from workbench.study.tasks import TaskItem, load_items


def _item(i: int, cluster: str | None = None, task: str = "qa") -> TaskItem:
    meta = {"cluster": cluster} if cluster else {}
    return TaskItem(task=task, item_id=f"q{i}", documents=[f"Fact {i}.", "Other."], query=f"Fact {i}?",
                    answers=[str(i)], answer_doc=0, meta=meta)


# ----------------------------------------------------------------------------- split
def test_split_is_disjoint_complete_and_deterministic():
    items = [_item(i) for i in range(20)]
    cal, test, sp = split_items(items, 0.3, seed=4)
    assert len(sp.calibration) == 6 and len(sp.test) == 14  # ceil(0.3 * 20)
    assert not set(sp.calibration) & set(sp.test)
    assert sorted(sp.calibration + sp.test) == sorted(unit_of(it) for it in items)
    assert {unit_of(it) for it in cal} == set(sp.calibration) and {unit_of(it) for it in test} == set(sp.test)
    shuffled = items[:]
    random.Random(1).shuffle(shuffled)
    again = split_items(shuffled, 0.3, seed=4)[2]
    assert again == sp and again.digest() == sp.digest()  # the item order does not matter
    assert any(split_items(items, 0.3, seed=s)[2].calibration != sp.calibration for s in range(5, 10))
    frame = sp.to_frame()
    assert (frame["split"] == "calibration").sum() == 6 and frame["unit"].is_unique


def test_split_never_cuts_a_cluster():
    items = [_item(i, cluster=f"c{i // 3}") for i in range(12)]  # 4 clusters of 3 prompts
    for seed in range(6):
        cal, test, sp = split_items(items, 0.5, seed=seed)
        assert len(sp.calibration) == 2 and len(cal) == 6 and len(test) == 6
        assert not {it.meta["cluster"] for it in cal} & {it.meta["cluster"] for it in test}


@pytest.mark.parametrize("kw, msg", [
    ({"fraction": 0.0}, r"^fraction: must be"),
    ({"fraction": 1.0}, r"^fraction: must be"),
    ({"fraction": -0.2}, r"^fraction: must be"),
    ({"seed": -1}, r"^seed: must be"),
])
def test_split_refuses_an_empty_side_naming_the_parameter(kw, msg):
    with pytest.raises(ValueError, match=msg):
        split_items([_item(i) for i in range(3)], **{"fraction": 0.3, **kw})


def test_split_refuses_a_single_unit():
    with pytest.raises(ValueError, match=r"^items: a calibration split needs at least 2"):
        split_items([_item(0, cluster="c"), _item(1, cluster="c")], 0.5)
    # two units, but in two tasks: each task's only unit stays in test, so calibration would be empty
    with pytest.raises(ValueError, match=r"^items: a calibration split needs at least 2 independent units"):
        split_items([_item(0, task="a"), _item(1, task="b")], 0.5)


def test_split_never_takes_all_of_a_task():
    cal, test, sp = split_items([_item(i) for i in range(3)], 0.9)  # ceil(2.7) = 3, capped at 3 - 1
    assert len(sp.calibration) == 2 and len(sp.test) == 1 and sp.per_task == (("qa", 2, 1),)


def _families() -> list[TaskItem]:
    """Four families of known size: 10 clusters of 2 prompts, 7 clusters, 2 clusters, and one cluster alone."""
    return ([_item(i, cluster=f"v{i // 2}", task="vt") for i in range(20)] + [_item(i, task="qa") for i in range(7)]
            + [_item(i, task="ns") for i in range(2)] + [_item(0, task="solo")])


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 0.7])
@pytest.mark.parametrize("seed", range(8))
def test_split_is_stratified_by_task(fraction, seed):
    """Each family keeps at least 1 − fraction of its units (rounded down, and at least one) in test and gives calibration exactly
    min(ceil(fraction · n), n − 1); a one-unit family stays in test; the draw ignores the items' order. Over all
    units at once, a seed can put 7 of 10 of one family into calibration."""
    items = _families()
    sizes = {"vt": 10, "qa": 7, "ns": 2, "solo": 1}
    cal, test, sp = split_items(items, fraction, seed=seed)
    for task, n in sizes.items():
        n_cal = sum(u.startswith(f"{task}/") for u in sp.calibration)
        n_test = sum(u.startswith(f"{task}/") for u in sp.test)
        assert n_cal + n_test == n and n_cal == min(math.ceil(fraction * n - 1e-9), n - 1)
        assert n_test >= max(1, math.floor((1 - fraction) * n + 1e-9))  # 1 − fraction of it, rounded down
    assert "solo/q0" in sp.test
    assert sp.per_task == tuple((t, min(math.ceil(fraction * n - 1e-9), n - 1), n - min(math.ceil(fraction * n - 1e-9), n - 1))
                                for t, n in sorted(sizes.items()))
    shuffled = items[:]
    random.Random(seed).shuffle(shuffled)
    assert split_items(shuffled, fraction, seed=seed)[2] == sp
    assert {it.meta.get("cluster") for it in cal if it.task == "vt"}.isdisjoint(
        {it.meta.get("cluster") for it in test if it.task == "vt"})


# ----------------------------------------------------------------------------- the rule
CANDS = [(name, dict(PRESETS[name]["params"])) for name in ("paper", "loose", "strict")]


def _frame(outcomes: dict, n: int = 10, failed: tuple = ()) -> pd.DataFrame:
    """Sweep rows: ``full`` right on every prompt; candidate ``name`` right on the first ``n - losses`` prompts and
    removing ``removed`` of 100 tokens (``outcomes[name] = (losses, removed)``)."""
    rows = []
    for i in range(n):
        rows.append({"task": "qa", "item_id": f"q{i}", "method": "full", "params": "{}", "error": None,
                     "contains": 1.0, "prompt_tokens": 100, "retained_tokens": 100})
        for name, p in CANDS:
            losses, removed = outcomes[name]
            rows.append({"task": "qa", "item_id": f"q{i}", "method": "entroprefill",
                         "params": json.dumps(p, sort_keys=True), "contains": float(i >= losses),
                         "prompt_tokens": 100, "retained_tokens": 100 - removed, "bypass": removed == 0,
                         "error": "RuntimeError: boom" if (name, i) in failed else None})
    return pd.DataFrame(rows)


def test_calibration_picks_the_most_removing_setting_within_the_margin():
    df = _frame({"paper": (0, 30), "loose": (3, 60), "strict": (0, 10)})
    cal = calibrate(df, CANDS, margin=0.1)
    assert cal.chosen == "paper" and cal.rule_met and cal.params == PRESETS["paper"]["params"]
    t = cal.table.set_index("candidate")
    assert t.loc["loose", "diff"] == pytest.approx(-0.3) and not t.loc["loose", "within_margin"]
    assert t.loc["paper", "removed_share"] == pytest.approx(0.3) and t.loc["paper", "n"] == 10
    assert t.loc["paper", "reference"] == 1.0 and t.loc["paper", "bypass_rate"] == 0.0
    assert list(cal.table["chosen"]) == [True, False, False]
    # a wider margin admits the loose preset, which removes more
    assert calibrate(df, CANDS, margin=0.35).chosen == "loose"
    # exactly at the margin counts as within it
    assert calibrate(df, CANDS, margin=0.3).chosen == "loose"


def test_calibration_ties_go_to_the_first_candidate_and_failed_cells_are_left_out():
    df = _frame({"paper": (0, 20), "loose": (0, 20), "strict": (0, 20)})
    assert calibrate(df, CANDS, margin=0.0).chosen == "paper"
    failed = _frame({"paper": (0, 20), "loose": (0, 20), "strict": (0, 20)}, failed=(("paper", 0), ("paper", 1)))
    t = calibrate(failed, CANDS, margin=0.0).table.set_index("candidate")
    assert t.loc["paper", "prompts"] == 8 and t.loc["loose", "prompts"] == 10


def test_calibration_without_a_candidate_in_the_margin_warns_and_flags():
    df = _frame({"paper": (5, 30), "loose": (8, 60), "strict": (4, 10)})
    with pytest.warns(CalibrationWarning, match="no candidate stayed within"):
        cal = calibrate(df, CANDS, margin=0.1)
    assert cal.chosen == "strict" and not cal.rule_met  # the closest to full context, flagged


def test_calibration_refuses_bad_input():
    df = _frame({"paper": (0, 30), "loose": (3, 60), "strict": (0, 10)})
    with pytest.raises(ValueError, match=r"^margin: must be"):
        calibrate(df, CANDS, margin=1.0)
    with pytest.raises(ValueError, match=r"^candidates: must be a non-empty list"):
        calibrate(df, [], margin=0.1)
    with pytest.raises(ValueError, match=r"^df: no candidate"):
        calibrate(df[df["method"] == "full"], CANDS, margin=0.1)


def test_report_config_calibrate_is_checked():
    with pytest.raises(ValueError, match=r"^calibrate: must be"):
        ReportConfig(calibrate=1.0)
    with pytest.raises(ValueError, match=r"^calibrate: tunes EntroPrefill"):
        ReportConfig(calibrate=0.3, methods=("full", "evict"))
    # one SQuAD prompt and one needle: each task's only unit stays in test, so calibration would be empty
    with pytest.raises(ValueError, match=r"^calibrate: a calibration split needs at least 2 independent units"):
        ReportConfig(calibrate=0.6, n_squad=1, n_needle=1)
    with pytest.raises(ValueError, match=r"^calibrate: a calibration split needs at least 2"):
        ReportConfig(calibrate=0.5, n_squad=0, n_needle=1)
    assert ReportConfig(calibrate=0.9, n_squad=0, n_needle=3).builtin_units() == {"needle": 3}


def test_report_config_counts_the_ruler_units_for_calibrate():
    """RULER families are units too: with them alone the split has clusters to draw."""
    c = ReportConfig(calibrate=0.3, n_squad=0, n_needle=0, ruler=("niah_single",), ruler_seeds=10)
    assert c.builtin_units() == {"niah_single": 10}
    words = ReportConfig(calibrate=0.3, n_squad=0, n_needle=0, ruler=("common_words",), ruler_lengths=(512, 1024))
    assert words.builtin_units() == {"common_words": 2}  # a fresh draw at every length
    with pytest.raises(ValueError, match=r"^calibrate: a calibration split needs at least 2"):
        ReportConfig(calibrate=0.3, n_squad=0, n_needle=0, ruler=("niah_single", "variable_tracking"),
                     ruler_lengths=(512, 1024))  # one seed: one shared fact per family, across its lengths
    c = ReportConfig(calibrate=0.3)
    assert [n for n, _ in c.calibration_candidates()] == list(PRESETS)
    assert ReportConfig(presets=("strict",), entroprefill={"zeta": 0.3}).calibration_candidates() == [
        ("strict", {**PRESETS["strict"]["params"], "zeta": 0.3})]


# ----------------------------------------------------------------------------- bypass reasons
@pytest.fixture(scope="module")
def spans():
    return PromptSpans.synthetic(SIZES, query_len=10)


def test_bypass_reason_names_the_audit_with_both_numbers(spans):
    cap = designed_capture(spans, 4, [FAR] * 4, aud_mass=[[0.1] * 5] * 4)  # audit rows attend the removed chunks
    r = bypass_reason(trace(cap, EntroPrefillParams(streak=1)))
    assert r["bypass_step"] == "audit" and set(r) == set(BYPASS_COLUMNS)
    assert r["audit_bound_min"] == pytest.approx(0.2, abs=1e-6) and r["eps_audit"] == 0.1 and r["audit_b"] == 0.0
    assert (r["bypass_short_streak"], r["bypass_audit_fail"], r["bypass_layers"]) == (1, 2, 3)


def test_bypass_reason_sampled_audit_reports_the_radius(spans):
    with pytest.warns(AuditWarning, match="no layer can pass"):
        tr = trace(designed_capture(spans, 4, [FAR] * 4), EntroPrefillParams(audit_mode="sampled", m_a=10, streak=1))
    r = bypass_reason(tr)
    assert r["bypass_step"] == "audit" and r["audit_b"] == pytest.approx(tr.b) and r["audit_b"] > r["eps_audit"]
    assert r["audit_bound_min"] >= r["audit_b"]


def test_bypass_reason_names_the_streak(spans):
    r = bypass_reason(trace(designed_capture(spans, 4, [FAR] * 4), EntroPrefillParams(streak=5)))
    assert r["bypass_step"] == "streak" and (r["streak_max"], r["streak_required"]) == (2, 5)
    assert math.isnan(r["audit_bound_min"]) and r["bypass_short_streak"] == 3


def test_bypass_reason_names_the_target(spans):
    cap = designed_capture(spans, 4, [HEAVY] * 4, sink=[0.05] * 4)
    r = bypass_reason(trace(cap, EntroPrefillParams(streak=0)))
    assert r["bypass_step"] == "target" and r["bypass_below_target"] == 3


def test_bypass_reason_names_validity(spans):
    cap = designed_capture(spans, 4, [[0.0] * 5] * 4)  # no document mass at any layer
    r = bypass_reason(trace(cap, EntroPrefillParams(streak=0)))
    assert r["bypass_step"] == "validity" and r["bypass_invalid"] == 3


def test_bypass_reason_without_candidates_and_when_accepted(spans):
    sp = PromptSpans.synthetic([])
    cap = Capture.synthetic(sp, L=3, H_Q=4, G=2, extra_rows={"audit": list(range(*sp.query))})
    assert bypass_reason(trace(cap, EntroPrefillParams()))["bypass_step"] == "no_candidates"
    acc = bypass_reason(trace(designed_capture(spans, 4, [FAR] * 4), EntroPrefillParams(streak=1)))
    assert acc["bypass_step"] == "" and acc["audit_bound_min"] == pytest.approx(0.003, abs=1e-6)


def test_bypass_table_lists_each_bypass_with_its_step():
    base = {"task": "qa", "method": "entroprefill", "params": "{}", "error": None}
    df = pd.DataFrame([
        {**base, "item_id": "a", "bypass": True, "bypass_step": "audit", "audit_bound_min": 0.2, "eps_audit": 0.1},
        {**base, "item_id": "b", "bypass": False, "bypass_step": "", "audit_bound_min": 0.01, "eps_audit": 0.1},
        {**base, "item_id": "c", "bypass": True, "bypass_step": None, "audit_bound_min": math.nan, "eps_audit": 0.1},
        {**base, "item_id": "d", "method": "full", "bypass": None},
    ])
    t = bypass_table(df)
    assert list(t["item_id"]) == ["a", "c"] and list(t["bypass_step"]) == ["audit", "unknown"]
    assert t.loc[0, "setting"] == "EntroPrefill paper" and t.loc[0, "audit_bound_min"] == 0.2


# ----------------------------------------------------------------------------- end to end
def test_tiny_report_calibrates_then_tests(tmp_path):
    out = tmp_path / "r"
    r = subprocess.run([sys.executable, "-m", "workbench", "report", "--tiny", "--data", "sample", "--no-progress",
                        "--n-needle", "2", "--calibrate", "0.3", "--out", str(out)], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    man = json.loads((out / "manifest.json").read_text())
    c = man["calibration"]
    # stratified: ceil(0.3 * 2) of the 2 needles; the one SQuAD prompt stays in test
    assert len(c["split"]["calibration"]) == 1 and len(c["split"]["test"]) == 2
    assert c["split"]["per_task"] == {"needle": {"calibration": 1, "test": 1}, "squad_single": {"calibration": 0, "test": 1}}
    assert c["chosen"] in PRESETS and c["rule"].startswith("Calibration rule")
    t = out / "tables"
    cal, split = pd.read_csv(t / "calibration.csv"), pd.read_csv(t / "calibration_split.csv")
    assert list(cal["candidate"]) == list(PRESETS) and cal["chosen"].sum() == 1
    assert cal.loc[cal["chosen"], "candidate"].item() == c["chosen"]
    sweep, cal_sweep = pd.read_parquet(t / "sweep.parquet"), pd.read_csv(t / "calibration_sweep.csv")
    test_units = set(split.loc[split["split"] == "test", "unit"])
    # the study's sweep (every verdict's input) holds the test split only, with the chosen setting only
    assert set(sweep["task"] + "/" + sweep["meta_cluster"]) == test_units
    ep = sweep[sweep["method"] == "entroprefill"]
    assert ep["params"].nunique() == 1 and json.loads(ep["params"].iloc[0]) == c["params"]
    assert not set(cal_sweep["item_id"]) & set(sweep["item_id"])
    assert {"bypass_step", "audit_bound_min", "eps_audit", "streak_max"} <= set(ep.columns)
    assert (ep["bypass_step"].astype(str) != "").sum() == ep["bypass"].astype(bool).sum()
    byp = pd.read_csv(t / "bypasses.csv")
    assert len(byp) == int(ep["bypass"].astype(bool).sum())
    page = (out / "report.html").read_text()
    assert c["split"]["digest"] in page and "Calibrate, then test" in page and "tab-bypasses" in page


def test_the_pruning_row_says_which_step_refused():
    d = _study([1] * 10, [1] * 10)
    loose = d["params"] == json.dumps(LOOSE)
    d["bypass_step"] = ""
    d.loc[loose & d["bypass"].astype(bool), "bypass_step"] = "audit"
    d.loc[(d["params"] == "{}") & (d["method"] == "entroprefill"), "bypass_step"] = ["target"] * 7 + ["streak"] * 3
    t = conclusions(d).to_frame()
    note = t[t["claim"] == "EntroPrefill loose prunes: removed share of the prompt's tokens"].iloc[0].note
    assert note.endswith("refused by audit 1")
    note = t[t["claim"] == "EntroPrefill paper prunes: removed share of the prompt's tokens"].iloc[0].note
    assert "refused by target 7, streak 3" in note


def test_an_items_split_is_refused_before_any_model_work(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text("\n".join(json.dumps({"task": "qa", "item_id": f"q{i}", "query": f"Fact {i}?",
                                       "documents": [f"Fact {i}.", "Other."], "answers": [str(i)], "answer_doc": 0,
                                       "meta": {"cluster": f"c{i // 2}"}}) for i in range(4)) + "\n")
    items = load_items(f)  # 4 prompts in 2 clusters
    check_split(ReportConfig(items=f, n_squad=0, n_needle=0, calibrate=0.5), items)
    check_split(ReportConfig(items=f, n_squad=0, n_needle=0, calibrate=0.9), items)  # 1 of the 2 clusters
    with pytest.raises(ValueError, match=r"^calibrate: a calibration split needs at least 2"):
        check_split(ReportConfig(items=f, n_squad=0, n_needle=0, calibrate=0.5), items[:2])
    # one cluster of task qa and one SQuAD prompt: two units, but one per task
    with pytest.raises(ValueError, match=r"^calibrate: a calibration split needs at least 2"):
        check_split(ReportConfig(items=f, n_squad=1, n_needle=0, calibrate=0.5), items[:2])
    out = tmp_path / "rep"
    f.write_text("\n".join(f.read_text().splitlines()[:2]) + "\n")  # one cluster
    with pytest.raises(ValueError, match=r"^calibrate: a calibration split needs"):
        run_report(ReportConfig(items=f, n_squad=0, n_needle=0, calibrate=0.5, out=out), lm=object())
    assert not out.exists()  # refused before anything was written
