"""What this study shows (workbench.study.conclusions), on hand-made frames whose answer is known: a clear DeferKV win is
supported, a clear loss beyond the margin inferior, exact ties non-inferior on enough clusters (inconclusive on ten;
never supported), a failing reference
says so; n, effect, CI and p recomputed
independently (scipy's binomtest for McNemar / the sign test, the percentile bootstrap with the same seed over
cluster means); the leap, the priorities and EntroPrefill per preset; then a tiny study run end to end."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest
from _examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from workbench.study.conclusions import VERDICTS, conclusions, preset_name, verdict
from workbench.study.storage import roundtrip, tidy

LOOSE = {"eps_row": 0.3, "target": 0.2, "streak": 0, "eps_audit": 0.5}


def _study(defer, snap, full=None, task="niah_single", clusters=None, budgets=(0.25, 0.5)):
    """Rows of a sweep frame: per prompt ``i``, full context (``full[i]``, default right), DeferKV and SnapKV at each
    budget (``defer[i]``, ``snap[i]``), EntroPrefill paper (bypasses every prompt) and loose (prunes a third at l* 1
    on every prompt but the first)."""
    n = len(defer)
    full = [1] * n if full is None else full
    rows = []
    for i in range(n):
        base = dict(task=task, item_id=f"{task}-{i}", error=None, prompt_tokens=300, hit_cap=False)
        if clusters is not None:
            base["meta_cluster"] = clusters[i]
        rows.append(dict(base, method="full", params="{}", contains=float(full[i]), retained_tokens=300))
        for f in budgets:
            for pol, x in (("deferkv", defer), ("snapkv", snap)):
                rows.append(dict(base, method="evict", params=json.dumps({"budget_frac": f, "policy": pol}),
                                 contains=float(x[i]), retained_tokens=int(300 * f)))
        rows.append(dict(base, method="entroprefill", params="{}", contains=float(full[i]), retained_tokens=300,
                         bypass=True, l_star=None))
        pruned = i > 0
        rows.append(dict(base, method="entroprefill", params=json.dumps(LOOSE), contains=float(full[i]),
                         retained_tokens=200 if pruned else 300, bypass=not pruned, l_star=1 + i % 2 if pruned else None))
    return pd.DataFrame(rows)


def _claims(c, claim_start, **eq):
    t = c.to_frame()
    t = t[t["claim"].str.startswith(claim_start)]
    for k, v in eq.items():
        t = t[t[k] == v]
    return t


def _by_unit(x, task="niah_single"):
    """Per-prompt values in the order of the units they form (the cluster names ``<task>/<item_id>``, sorted), the
    order the paired test and the bootstrap see them in."""
    names = [f"{task}/{task}-{i}" for i in range(len(x))]
    return np.asarray(x, dtype=float)[np.argsort(names, kind="stable")]


def _boot(x, level=0.95, n_boot=2000, seed=0):
    """The percentile bootstrap of the mean, written out again (same generator and seed as stats.bootstrap_ci)."""
    x = np.asarray(x, dtype=float)
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    means = x[np.random.default_rng(seed).integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def test_a_clear_deferkv_win_is_supported_and_its_numbers_recompute():
    defer, snap = [1] * 12, [1, 1] + [0] * 10
    c = conclusions(_study(defer, snap))
    rows = _claims(c, "DeferKV ≥ SnapKV")
    assert sorted(rows["comparison"]) == ["deferkv @ 0.25 vs snapkv @ 0.25", "deferkv @ 0.5 vs snapkv @ 0.5"]
    for r in rows.itertuples():
        assert r.verdict == "supported" and r.task == "niah_single" and r.n == 12 and r.prompts == 12
        d = np.array(defer, float) - np.array(snap, float)
        assert r.effect == pytest.approx(d.mean()) == pytest.approx(10 / 12)
        assert r.p == pytest.approx(sps.binomtest(10, 10, 0.5).pvalue)  # McNemar exact: 10 discordant, all wins
        assert (r.lo, r.hi) == pytest.approx(_boot(_by_unit(d)))
        assert r.lo > 0 and r.test == "McNemar exact"
    md = c.markdown()
    assert md.startswith("## What this study shows\n\nVerdict rule: each claim declares its kind.")
    assert ("| DeferKV ≥ SnapKV at the same budget | DeferKV guide | non-inferiority | niah_single | "
            "deferkv @ 0.25 vs snapkv @ 0.25 | 12 |") in md


def test_a_clear_loss_is_inferior_and_ties_are_non_inferior():
    loss = conclusions(_study([0] * 10, [1] * 10))
    assert set(_claims(loss, "DeferKV ≥ SnapKV")["verdict"]) == {"inferior"}
    # ten tied clusters bound a loss only at −z²/(10 + z²) = −0.213 (Tango): inconclusive and underpowered, as a
    # method losing on 10 % of clusters ties ten in a row with probability 0.35; thirty ties clear −0.1
    tie = conclusions(_study([1, 0] * 5, [1, 0] * 5))
    r = _claims(tie, "DeferKV ≥ SnapKV")
    z = sps.norm.ppf(0.95)
    assert set(r["verdict"]) == {"inconclusive"} and set(r["effect"]) == {0.0} and set(r["p"]) == {1.0}
    assert r["underpowered"].all() and r["lo1"].to_numpy() == pytest.approx([-z * z / (10 + z * z)] * 2)
    many = _claims(conclusions(_study([1, 0] * 15, [1, 0] * 15)), "DeferKV ≥ SnapKV")
    assert set(many["verdict"]) == {"non-inferior"} and set(many["p"]) == {1.0}
    assert many["p_ni"].to_numpy() == pytest.approx([0.9 ** 30] * 2, rel=1e-6)  # exact: ties all 30 at p01 = 0.1
    # a win on too few clusters (6 prompts, 3 clusters): the interval excludes 0, the test does not reject
    # (two-sided sign test, 3 of 3: p = 0.25)
    few = _claims(conclusions(_study([1] * 6, [0] * 6, clusters=[0, 0, 1, 1, 2, 2])), "DeferKV ≥ SnapKV")
    assert set(few["verdict"]) == {"inconclusive"} and (few["lo"] > 0).all() and set(few["n"]) == {3}
    assert few["p"].tolist() == pytest.approx([sps.binomtest(3, 3, 0.5).pvalue] * 2)


def test_a_failing_reference_carries_no_verdict():
    d = pd.concat([_study([1] * 12, [0] * 12, full=[1, 1] + [0] * 10, task="common_words"),
                   _study([1] * 12, [0] * 12, task="niah_single")])
    c = conclusions(d)
    rows = _claims(c, "DeferKV ≥ SnapKV").set_index(["task", "comparison"])
    assert set(rows.loc["common_words", "verdict"]) == {"reference failed"}
    assert rows.loc["common_words", "reference"].str.contains("common_words: full context right on 2/12").all()
    assert (rows.loc["niah_single", "reference"] == "").all()
    md = c.markdown()
    assert md.count("- common_words: full context right on 2/12, needs >= 50% and >= 5 right") == 1  # said once
    assert set(rows.loc["niah_single", "verdict"]) == {"supported"}
    # the claim's own numbers are still shown: the full effect with its CI
    assert (rows.loc["common_words", "effect"] == 1.0).all()
    # one passing RULER family only: no pooled row; every claim on common_words fails the reference
    assert not any(t.startswith("RULER-style") for t in rows.index.get_level_values(0))
    cw = c.to_frame().query("task == 'common_words'")
    assert set(cw.loc[cw["kind"] != "descriptive", "verdict"]) == {"reference failed"}
    assert set(cw.loc[cw["kind"] == "descriptive", "verdict"]) == {"descriptive"}
    assert c.counts()["reference failed"] == int((cw["kind"] != "descriptive").sum())


def test_clusters_are_the_unit():
    """Prompts of one cluster count once, by their mean: 12 prompts in 4 clusters of 3 give n = 4 and the sign test
    over cluster means (3 of 4 clusters: every prompt a DeferKV win; 1: a tie); not superior (p = 0.25), and the
    non-inferiority bound is Tango's on 3 wins of 4 clusters."""
    from test_stats import _tango_brute

    defer, snap = [1] * 12, [0] * 9 + [1] * 3
    cl = [f"c{i // 3}" for i in range(12)]
    r = _claims(conclusions(_study(defer, snap, clusters=cl)), "DeferKV ≥ SnapKV").iloc[0]
    per = pd.Series(np.array(defer, float) - np.array(snap, float)).groupby(cl).mean()
    assert (r.n, r.prompts) == (4, 12) and r.effect == pytest.approx(per.mean())
    assert r.p == pytest.approx(sps.binomtest(3, 3, 0.5).pvalue)
    assert (r.lo, r.hi) == pytest.approx(_boot(per.to_numpy()))
    lo1, hi1 = _tango_brute(3, 0, 4)
    assert (r.lo1, r.hi1) == pytest.approx((lo1, hi1), abs=1e-6)
    assert r.p_ni == pytest.approx(0.3 ** 3 * 4 * 0.4, rel=1e-3) or r.p_ni > 0.05  # exact: up to P(b ≥ 3, c = 0)
    assert r.verdict == ("non-inferior" if lo1 > -0.1 and r.p_ni < 0.05 else "inconclusive")


def test_pooled_over_passing_ruler_families():
    d = pd.concat([_study([1] * 6, [0] * 6, task="niah_single"), _study([1] * 6, [0] * 6, task="niah_multikey"),
                   _study([1] * 6, [0] * 6, full=[0] * 6, task="variable_tracking")])
    rows = _claims(conclusions(d), "DeferKV ≥ SnapKV")
    pooled = rows[rows["task"].str.startswith("RULER-style")]
    assert len(pooled) == 2 and set(pooled["n"]) == {12}  # the two passing families, not variable_tracking
    assert pooled["task"].iloc[0] == "RULER-style (pooled over niah_multikey, niah_single)"
    assert set(pooled["verdict"]) == {"supported"}
    assert pooled["p"].tolist() == pytest.approx([sps.binomtest(12, 12, 0.5).pvalue] * 2)


def _flip_p(x, centre, greater=True):
    """The one-sided sign-flip p-value written out: every sign pattern of the deviations from ``centre``."""
    dev = np.asarray(x, float) - centre
    dev = dev[np.abs(dev) > 1e-12] * (1 if greater else -1)
    if not dev.size:
        return 1.0
    sums = [np.dot(s, np.abs(dev)) for s in itertools.product((-1, 1), repeat=dev.size)]
    return float(np.mean(np.array(sums) >= dev.sum() - 1e-9))


@settings(max_examples=examples(10), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=5, max_size=14))
def test_verdict_follows_the_numbers(pairs):
    """Random 0/1 scores (at least 5 prompts: the reference, right on all, passes): the effect is the mean difference,
    p the exact McNemar test, the CI the same-seed bootstrap, the non-inferiority bounds Tango's score interval
    (computed from its definition in test_stats), its p the score test about −δ, and the verdict the rule on those
    numbers (DeferKV ≥ SnapKV is a non-inferiority claim at δ = 0.1)."""
    from test_stats import _tango_brute

    defer, snap = [a for a, _ in pairs], [b for _, b in pairs]
    r = _claims(conclusions(_study(defer, snap, budgets=(0.5,))), "DeferKV ≥ SnapKV").iloc[0]
    d = np.array(defer, float) - np.array(snap, float)
    w, lo_n = int((d > 0).sum()), int((d < 0).sum())
    p = 1.0 if w + lo_n == 0 else sps.binomtest(w, w + lo_n, 0.5).pvalue
    lo, hi = _boot(_by_unit(d))
    lo1, hi1 = _tango_brute(w, lo_n, len(d))
    assert r.n == len(d) and r.effect == pytest.approx(d.mean()) and r.p == pytest.approx(p)
    assert (r.lo, r.hi) == pytest.approx((lo, hi)) and (r.lo1, r.hi1) == pytest.approx((lo1, hi1), abs=1e-6)
    p_ni, p_inf = r.p_ni, r.p_inf  # the exact score test at −δ: never rejects where the bound does not clear −δ
    assert (p_ni < 0.05) <= (lo1 > -0.1) and (p_inf < 0.05) <= (hi1 < -0.1) and r.ni_test == "Tango score"
    want = ("supported" if lo > 0 and p < 0.05 else "non-inferior" if lo1 > -0.1 and p_ni < 0.05 else
            "inferior" if hi1 < -0.1 and p_inf < 0.05 else "inconclusive")
    assert r.verdict == want and r.verdict in VERDICTS and r.kind == "non-inferiority"


def test_verdict_rule_directly():
    sup = dict(kind="superiority")
    assert verdict(**sup, lo=0.1, hi=0.3, p=0.01) == "supported"
    assert verdict(**sup, lo=0.1, hi=0.3, p=0.01, direction=-1) == "contradicted"
    assert verdict(**sup, lo=-0.3, hi=-0.1, p=0.01, direction=-1) == "supported"
    assert verdict(**sup, lo=-0.1, hi=0.3, p=0.01) == "inconclusive"
    assert verdict(**sup, lo=0.1, hi=0.3, p=0.2) == "inconclusive"
    assert verdict("descriptive", lo=0.1, hi=0.3, p=0.01) == "descriptive"
    assert verdict(**sup, lo=0.1, hi=0.3, p=0.01, reference_ok=False) == "reference failed"
    assert verdict(**sup, lo=0.1, hi=0.3, p=0.04, level=0.99) == "inconclusive"
    ni = dict(kind="non-inferiority", margin=0.1)
    tie = dict(lo=0.0, hi=0.0, p=1.0, lo1=0.0, hi1=0.0, p_ni=0.001, p_inf=1.0)
    assert verdict(**ni, **tie) == "non-inferior"
    assert verdict(**ni, **dict(tie, p_ni=0.2)) == "inconclusive"  # a narrow bootstrap without the test: no evidence
    assert verdict(**{**ni, "margin": 0.0}, **tie) == "inconclusive"  # δ = 0: the bound must clear 0 itself
    assert verdict(**ni, lo=-0.5, hi=-0.2, p=0.01, lo1=-0.45, hi1=-0.25, p_ni=1.0, p_inf=0.01) == "inferior"
    assert verdict(**ni, lo=0.1, hi=0.3, p=0.01, lo1=0.12, hi1=0.28, p_ni=0.001, p_inf=1.0) == "supported"
    with pytest.raises(ValueError, match="^kind:"):
        verdict("better", lo=0.1, hi=0.3, p=0.01)


def _squad_ref(n=10):
    return pd.DataFrame([dict(task="squad_single", item_id=f"q{i}", method="full", params="{}", contains=1.0,
                              error=None, hit_cap=False) for i in range(n)])


def test_the_leap_from_a_per_prompt_step_gain_table():
    rng = np.random.default_rng(1)
    n = 10
    g01 = 0.3 + 0.01 * rng.random(n)
    rows = [dict(task="squad_single", item_id=f"q{i}", r_from=a, r_to=b, gain=v)
            for i in range(n) for (a, b), v in (((0, 1), g01[i]), ((1, 2), 0.01), ((-1, 0), 0.5 if i < 8 else 0.0))]
    c = conclusions(_squad_ref(n), pd.DataFrame(rows))
    nxt = _claims(c, "The recall leap at the boundary").iloc[0]
    assert nxt.comparison == "0→1 vs 1→2" and nxt.verdict == "supported" and nxt.n == n
    assert nxt.effect == pytest.approx((g01 - 0.01).mean()) and nxt.p == pytest.approx(2 * 0.5 ** n)
    spec = _claims(c, "The recall leap is specific").iloc[0]
    d = g01 - np.array([0.5] * 8 + [0.0] * 2)
    assert spec.comparison == "0→1 vs −1→0" and spec.effect == pytest.approx(d.mean())
    assert spec.p == pytest.approx(sps.binomtest(2, 10, 0.5).pvalue) and spec.verdict == "inconclusive"
    assert (spec.lo, spec.hi) == pytest.approx(_boot(d))
    # the same table on a failing reference: no verdict
    bad = _squad_ref(n).assign(contains=0.0)
    assert set(_claims(conclusions(bad, pd.DataFrame(rows)), "The recall leap")["verdict"]) == {"reference failed"}
    # without the table the claim is listed as not assessed, with no number
    none = conclusions(_squad_ref(n))
    assert not len(_claims(none, "The recall leap")) and any("boundary leap" in m for m in none.missing)


def test_renyi_against_the_other_priorities():
    n, k = 8, 4
    rank = {"renyi": 1.0, "mass": 3.0, "renyi, zeta=1": 1.0, "headmax": 2.0}
    rows = [dict(task="squad_single", item_id=f"q{i}", priority=p, k=k, rank=r + (0.5 if p == "headmax" and i < 2
                                                                                 else 0))
            for i in range(n) for p, r in rank.items()]
    c = conclusions(_squad_ref(n), ranks=pd.DataFrame(rows))
    t = _claims(c, "Rényi priorities").set_index("comparison")
    assert t.loc["renyi vs mass", "verdict"] == "supported" and t.loc["renyi vs mass", "effect"] == pytest.approx(2.0)
    assert t.loc["renyi vs renyi, zeta=1", "verdict"] == "inconclusive"
    assert t.loc["renyi vs headmax", "effect"] == pytest.approx((6 * 1 + 2 * 1.5) / 8)
    assert t.loc["renyi vs mass", "p"] == pytest.approx(sps.binomtest(n, n, 0.5).pvalue)
    assert any("uniform" in m for m in c.missing)  # no uniform rows: said, not invented


def test_l_star_missing_is_nan_and_minus_one_is_a_layer():
    """A bypassed prompt has no l* (NaN in the frame, never a number that averages in); l* = -1 (gather before
    layer 0) is an accepted layer and counts. Sweep files that wrote -99 for the bypass read back as NaN."""
    d = _study([1] * 10, [1] * 10)
    loose = (d["method"] == "entroprefill") & (d["params"] == json.dumps(LOOSE)) & ~d["bypass"].astype(bool)
    d.loc[loose & (d["item_id"] == "niah_single-1"), "l_star"] = -1
    tidy_frame = tidy(d.assign(model="m", seed=0, max_new_tokens=8, n_generated=1, generated_ids=[[1]] * len(d)))
    ep_rows = tidy_frame[tidy_frame["method"] == "entroprefill"]
    assert ep_rows["l_star"].dtype == np.float64
    assert ep_rows.loc[ep_rows["bypass"].astype(bool), "l_star"].isna().all()
    t = conclusions(d).to_frame()
    ls = t[t["claim"] == "EntroPrefill loose's accepted layer l*"].iloc[0]
    lstar = np.array([-1] + [1 + i % 2 for i in range(2, 10)], float)   # prompts 1..9 pruned, prompt 1 at -1
    assert ls.n == 9 and ls.effect == pytest.approx(lstar.mean()) and "range -1–2" in ls.note
    legacy = pd.DataFrame({"l_star": [-99, 2, -1], "generated_ids": [[1], [2], [3]]})
    back = roundtrip(legacy)
    assert np.isnan(back["l_star"][0]) and list(back["l_star"][1:]) == [2, -1]


def test_entroprefill_named_by_preset():
    d = _study([1] * 10, [1] * 10)
    c = conclusions(d)
    t = c.to_frame()
    ep = t[t["claim"].str.startswith("EntroPrefill")]
    assert {s.split("'")[0].split(" keeps")[0].split(" prunes")[0] for s in ep["claim"]} >= {
        "EntroPrefill paper", "EntroPrefill loose"}
    assert not t["claim"].str.startswith("entroprefill").any()
    acc = ep[ep["claim"] == "EntroPrefill loose keeps full-context accuracy"].iloc[0]
    # ties with full context on 10 clusters: not enough to show non-inferiority at δ = 0.1 (a method losing on one
    # cluster in ten ties all ten with probability 0.9^10 = 0.35, the exact p), and never supported
    assert acc.comparison == "EntroPrefill loose vs full" and acc.effect == 0.0 and acc.verdict == "inconclusive"
    assert acc.kind == "non-inferiority" and acc.margin == 0.1 and acc.underpowered
    assert acc.p_ni == pytest.approx(0.9 ** 10, rel=1e-6)
    # removed share > 0 and "did not bypass" are one event per prompt: one descriptive row, not two supported ones
    rem = ep[ep["claim"].str.startswith("EntroPrefill loose prunes")]
    assert len(rem) == 1 and not ep["claim"].str.contains("audit is not vacuous").any()
    rem = rem.iloc[0]
    share = np.array([0.0] + [1 / 3] * 9)
    assert rem.effect == pytest.approx(share.mean()) and rem.verdict == "descriptive" and rem.kind == "descriptive"
    assert "pruned on 9 of 10 prompts (bypass rate 0.10" in rem.note and "WARNING" not in rem.note
    # the paper preset bypassed every prompt: its accuracy is full context against itself, descriptive
    paper = ep[ep["claim"] == "EntroPrefill paper keeps full-context accuracy"].iloc[0]
    assert paper.verdict == "descriptive" and "bypassed every prompt" in paper.note
    ls = ep[ep["claim"] == "EntroPrefill loose's accepted layer l*"].iloc[0]
    lstar = np.array([1 + i % 2 for i in range(1, 10)], float)
    assert ls.effect == pytest.approx(lstar.mean()) and ls.n == 9 and ls.verdict == "descriptive"
    assert np.isnan(ls.lo) and np.isnan(ls.hi) and np.isnan(ls.p)  # a layer index: no interval, no test
    assert ls.test == "—" and "median" in ls.note
    assert any("EntroPrefill paper on niah_single: l*" in m for m in c.missing)  # every prompt bypassed
    # only substantive claims are counted: 2 DeferKV rows + the loose accuracy row
    assert sum(c.counts().values()) == 3 and c.n_descriptive() == len(t) - 3
    # a column the sweep did not write is said to be missing, never given a number
    c2 = conclusions(d.drop(columns=["bypass"]))
    assert not _claims(c2, "EntroPrefill loose prunes").shape[0]
    assert any("no bypass column" in m for m in c2.missing)
    assert preset_name({}) == "EntroPrefill paper" and preset_name(LOOSE) == "EntroPrefill loose"
    assert preset_name({"target": 0.4}) == "EntroPrefill (target=0.4)"


def test_a_duplicated_event_is_one_row_and_a_disagreement_is_said():
    """The same event written twice (removed share > 0 and "did not bypass", per prompt) is one row per preset and
    task; a sweep where the two disagree on a prompt says so in that row."""
    d = _study([1] * 10, [1] * 10)
    t = conclusions(d).to_frame()
    per = t[t["comparison"] == "removed share; bypass rate"].groupby(["claim", "task"]).size()
    assert (per == 1).all() and len(per) == 2  # paper and loose, one task
    odd = d.copy()
    odd.loc[(odd["method"] == "entroprefill") & (odd["params"] == "{}") & (odd["item_id"] == "niah_single-3"),
            "retained_tokens"] = 250  # a bypass that removed tokens
    row = conclusions(odd).to_frame().query("claim == 'EntroPrefill paper prunes: removed share of the prompt\\'s tokens'")
    assert len(row) == 1 and "WARNING: on 1 prompts" in row.iloc[0].note


def test_the_report_page_opens_with_the_section(tmp_path):
    from workbench.study.report_html import write_html

    c = conclusions(_study([1] * 12, [0] * 12))
    info = {"conclusions": {"rule": c.rule(), "counts": c.counts(), "missing": list(c.missing)}}
    page = write_html(tmp_path / "r.html", {}, {"conclusions": c.to_frame()}, {}, {}, info).read_text()
    assert page.index("What this study shows") < page.index("Data provenance") < page.index("Reference check")
    assert "<b style='color:#1e7b34'>supported</b>: DeferKV ≥ SnapKV" in page
    assert "Not assessed here" in page and "boundary leap" in page
    bad = conclusions(_study([1] * 12, [0] * 12, full=[0] * 12))
    info = {"conclusions": {"rule": bad.rule(), "counts": bad.counts(), "missing": list(bad.missing)}}
    page = write_html(tmp_path / "b.html", {}, {"conclusions": bad.to_frame()}, {}, {}, info).read_text()
    assert "reference failed</b>: DeferKV" in page and "reference: niah_single: full context right on 0/12" in page


def test_a_tiny_study_end_to_end(tmp_path, monkeypatch):
    """The study's own pieces on a random-weight 2-layer Llama with SmolLM2's tokenizer (real prompts, instant
    forwards): the sweep, the per-prompt leap and rank tables written as parquet beside it, the conclusions from
    those files equal to the ones from memory, and ``benchmarks/study_tables.py`` opening with the section. The
    random model answers nothing: every substantive claim says "reference failed" (the numbers shown, no verdict)."""
    import runpy
    import sys
    from pathlib import Path

    import torch
    from transformers import AutoTokenizer

    from workbench.analyse.params import PRESETS
    from workbench.run.models import LoadedModel, default_model_folder, tiny_model
    from workbench.study import datasets, tasks
    from workbench.study.leap import prompt_analyses
    from workbench.study.sweep import sweep

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    monkeypatch.syspath_prepend(str(bench))
    import study

    tok = AutoTokenizer.from_pretrained(default_model_folder(progress=False), local_files_only=True)
    lm = LoadedModel(model=tiny_model("llama", vocab=len(tok), L=2, H_Q=4, G=2, d=16, seed=0), tokenizer=tok,
                     model_id="tiny-llama-test", device=torch.device("cpu"), dtype=torch.float32)
    items = tasks.squad_single(datasets.load_squad("sample"), n=2, n_distractors=1, seed=0)
    out = tmp_path / "study.parquet"
    methods = [("full", {}), ("entroprefill", {}), ("entroprefill", dict(PRESETS["loose"]["params"])),
               ("evict", {"policy": ["deferkv", "snapkv"], "budget_frac": [0.25, 0.5]})]  # the study's methods
    df = sweep(lm, items, methods, out=out, max_new_tokens=3, progress=False)
    steps, lp, ranks, leap = prompt_analyses(lm, items, 2)
    assert steps is not None and set(leap["item_id"]) == {it.item_id for it in items}
    # the per-prompt table is what step_gains averages
    g01 = leap[(leap.r_from == 0) & (leap.r_to == 1)]["gain"].mean()
    assert g01 == pytest.approx(float(steps.set_index("step").loc["0→1", "mean"]))
    study.write_frame(tmp_path / "study_leap.parquet", leap)
    study.write_frame(tmp_path / "study_ranks.parquet", ranks)
    mem = conclusions(df, leap, ranks)
    disk = conclusions(study.read_study(out), pd.read_parquet(tmp_path / "study_leap.parquet"),
                       pd.read_parquet(tmp_path / "study_ranks.parquet"))
    pd.testing.assert_frame_equal(mem.to_frame(), disk.to_frame())
    t = mem.to_frame()
    assert set(t.loc[t["kind"] != "descriptive", "verdict"]) == {"reference failed"} and len(t) >= 2 + 2 + 4 + 2
    assert set(t.loc[t["kind"] == "descriptive", "verdict"]) <= {"descriptive"}
    claims = set(t["claim"])
    assert {"DeferKV ≥ SnapKV at the same budget", "EntroPrefill paper keeps full-context accuracy",
            "EntroPrefill loose keeps full-context accuracy",
            "The recall leap is specific to the boundary: 0→1 exceeds −1→0"} <= claims
    assert set(t.loc[t["claim"].str.startswith("Rényi"), "comparison"]) == {
        "renyi vs mass", "renyi vs renyi, zeta=1", "renyi vs headmax", "renyi vs uniform"}
    monkeypatch.setattr(sys, "argv", ["study_tables.py", "--out-dir", str(tmp_path)])
    runpy.run_path(str(bench / "study_tables.py"), run_name="__main__")
    text = (tmp_path / "study_tables.md").read_text()
    assert "### What this study shows" in text and text.index("What this study shows") < text.index("Reference check")
    assert "| The recall leap at the boundary (0→1) exceeds the next step (1→2) |" in text


def test_the_readme_states_the_same_rule_the_report_prints():
    """One definition: the README's verdict rule is :func:`rule_text` at the defaults, word for word, and the
    report section opens with it."""
    from pathlib import Path

    from workbench.study.conclusions import DEFAULT_MARGIN, RULE, rule_text

    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert " ".join(rule_text().split()) in readme
    assert f"δ = {DEFAULT_MARGIN:g}" in rule_text() and "{" not in rule_text() and "{margin}" in RULE
    c = conclusions(_study([1] * 12, [0] * 12))
    assert c.markdown().split("\n\n")[1] == c.rule() == rule_text()
    assert rule_text(margin=0.05) != rule_text() and "δ = 0.05" in conclusions(_study([1] * 6, [0] * 6),
                                                                                margin=0.05).rule()
    with pytest.raises(ValueError, match="^margin:"):
        conclusions(_study([1] * 6, [0] * 6), margin=1.5)


def test_plan_says_how_many_clusters_a_claim_needs():
    """``python -m workbench plan``: Connor's n for McNemar at 80 % power, written out here, rounded up."""
    from workbench.__main__ import main
    from workbench.study.conclusions import plan

    za, zb, psi, eff = sps.norm.ppf(0.975), sps.norm.ppf(0.8), 2 / 30, 0.067
    want = int(np.ceil((za * np.sqrt(psi) + zb * np.sqrt(psi - eff ** 2)) ** 2 / eff ** 2))
    assert plan(psi, effect=eff).startswith(f"{want} independent clusters")
    za1 = sps.norm.ppf(0.95)
    want_ni = int(np.ceil((za1 * np.sqrt(0.1) + zb * np.sqrt(0.1 - 0.01)) ** 2 / 0.01))
    assert plan(0.1, kind="non-inferiority", margin=0.1).startswith(f"{want_ni} independent clusters")
    with pytest.raises(ValueError, match="^effect:"):
        plan(0.1)
    with pytest.raises(ValueError, match="^kind:"):
        plan(0.1, kind="descriptive")
    assert main(["plan", "--effect", "0.067", "--discordance", str(psi)]) == 0
    assert main(["plan", "--effect", "0.9", "--discordance", "0.1"]) == 2  # beyond √ψ: refused in one line


def test_the_report_prints_its_margin():
    """The margin is a report setting (``ReportConfig.margin``, ``--margin``): the rule above the table states it."""
    from workbench.study import report
    from workbench.study.report_config import ReportConfig

    assert ReportConfig().margin == 0.1
    with pytest.raises(ValueError, match=r"^margin: must be in \[0, 1\)"):
        ReportConfig(margin=1.0)
    tables, notes, info = {}, {}, {}
    report._findings(_study([1] * 12, [1] * 12), tables, notes, info, 0.05)
    assert "margin δ = 0.05" in info["conclusions"]["rule"]
    assert set(tables["conclusions"].query("claim.str.startswith('DeferKV')", engine="python")["margin"]) == {0.05}


def test_an_underpowered_study_says_what_would_show_it():
    """Ten tied clusters cannot show non-inferiority at δ = 0.1: the study says how many claims that is and which
    commands plan and run one that can; 29 tied clusters are the fewest that can (the exact test's p is 0.9^n at
    the null's worst case: 0.9^29 = 0.047 ≤ 0.05 < 0.9^28), and a study of 30 says nothing more."""
    from workbench.analyse.stats import tango_exact_p
    from workbench.study.report_html import _conclusions_html

    tie = conclusions(_study([1, 0] * 5, [1, 0] * 5))
    k = tie.n_underpowered()
    line = tie.next_step()
    assert k == 3 and line.startswith("3 claim(s) could not have shown their effect at these n (at most 10 clusters)")
    assert "29 clusters show δ = 0.1" in line and "report --n-needle 29" in line
    assert tango_exact_p(0, 0, 29, -0.1)[0] <= 0.05 < tango_exact_p(0, 0, 28, -0.1)[0]
    assert conclusions(_study([1, 0] * 15, [1, 0] * 15)).next_step() == ""
    page = _conclusions_html(tie.to_frame(), {"rule": tie.rule(), "counts": tie.counts(), "next": line + " <b>"})
    assert "report --n-needle 29" in page and "&lt;b&gt;" in page
