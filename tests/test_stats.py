"""Paired statistics (workbench.analyse.stats): Wilson and bootstrap coverage, McNemar against scipy,
hand-made tables, and the finding sentence."""
from __future__ import annotations

import math

import numpy as np
import pytest
from _examples import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from workbench.analyse.stats import accuracy, bootstrap_ci, mcnemar, paired, sign_test, wilson_ci


def test_wilson_hand_values():
    # k = 0, n = 10 at 95 %: upper bound z^2 / (n + z^2) = 3.8415 / 13.8415
    lo, hi = wilson_ci(0, 10)
    assert lo == 0.0 and hi == pytest.approx(3.841459 / 13.841459, abs=1e-6)
    lo, hi = wilson_ci(5, 10)  # symmetric about 0.5
    assert lo == pytest.approx(1 - hi) and lo == pytest.approx(0.2366, abs=1e-4)
    assert all(math.isnan(v) for v in wilson_ci(0, 0))


@settings(max_examples=examples(25))
@given(st.integers(1, 400), st.floats(0.0, 1.0))
def test_wilson_contains_the_estimate_and_stays_in_unit_interval(n, f):
    k = int(round(f * n))
    lo, hi = wilson_ci(k, n)
    assert 0.0 <= lo <= k / n + 1e-12 and k / n - 1e-12 <= hi <= 1.0
    lo90, hi90 = wilson_ci(k, n, 0.9)
    assert lo <= lo90 + 1e-12 and hi90 <= hi + 1e-12  # a lower level gives a narrower interval


@pytest.mark.parametrize("p, n", [(0.1, 30), (0.5, 20), (0.8, 50)])
def test_wilson_coverage(p, n):
    """Over 2000 simulated samples the 95 % Wilson interval covers the true p at least ~93 % of the time."""
    rng = np.random.default_rng(1)
    ks = rng.binomial(n, p, size=2000)
    cover = np.mean([wilson_ci(int(k), n)[0] <= p <= wilson_ci(int(k), n)[1] for k in ks])
    assert cover >= 0.93, cover


def test_bootstrap_coverage_of_a_mean():
    rng = np.random.default_rng(2)
    hits = 0
    for i in range(300):
        x = rng.normal(1.0, 2.0, size=40)
        lo, hi = bootstrap_ci(x, n_boot=500, seed=i)
        hits += lo <= 1.0 <= hi
    assert 0.88 <= hits / 300 <= 0.99, hits / 300


@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=30))
@settings(max_examples=examples(10), deadline=None)
def test_bootstrap_interval_brackets_the_mean_range(x):
    lo, hi = bootstrap_ci(x, n_boot=200)
    assert min(x) - 1e-9 <= lo <= hi <= max(x) + 1e-9


def test_bootstrap_degenerate_cases():
    assert bootstrap_ci([3.0]) == (3.0, 3.0) and bootstrap_ci([0.0] * 7) == (0.0, 0.0)
    assert all(math.isnan(v) for v in bootstrap_ci([]))
    with pytest.raises(ValueError, match="^x:"):
        bootstrap_ci([1.0, float("nan")])
    with pytest.raises(ValueError, match="^n_boot:"):
        bootstrap_ci([1.0, 2.0], n_boot=5)


@given(st.integers(0, 60), st.integers(0, 60))
@settings(max_examples=examples(15), deadline=None)
def test_mcnemar_against_scipy(b, c):
    m = mcnemar(b, c)
    if b + c == 0:
        assert m["p_exact"] == 1.0 and m["p_chi2"] == 1.0
        return
    assert m["p_exact"] == pytest.approx(sps.binomtest(b, b + c, 0.5).pvalue)
    chi2 = (abs(b - c) - 1) ** 2 / (b + c)
    assert m["p_chi2"] == pytest.approx(sps.chi2.sf(chi2, 1))
    assert 0.0 <= m["p_exact"] <= 1.0


def test_mcnemar_hand_table():
    # b = 10 discordant pairs one way, c = 0 the other: p = 2 * 0.5^10
    assert mcnemar(10, 0)["p_exact"] == pytest.approx(2 * 0.5 ** 10)
    assert mcnemar(3, 3)["p_exact"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="^b:"):
        mcnemar(-1, 2)


def test_sign_test_counts():
    assert sign_test([0.5, -0.25, 0.0, 0.0, 1.0]) == (2, 2, 1, pytest.approx(sps.binomtest(2, 3, 0.5).pvalue))
    assert sign_test([0.0, 0.0])[3] == 1.0


def test_paired_hand_table_binary():
    # 12 prompts: A right and B wrong on 5, A wrong and B right on 1, 6 ties
    a = [1] * 5 + [0] + [1] * 4 + [0] * 2
    b = [0] * 5 + [1] + [1] * 4 + [0] * 2
    r = paired(a, b)
    assert (r.n, r.wins, r.ties, r.losses, r.test, r.binary) == (12, 5, 6, 1, "mcnemar", True)
    assert r.diff == pytest.approx(4 / 12) and r.mean_a == pytest.approx(9 / 12)
    assert r.p == pytest.approx(sps.binomtest(5, 6, 0.5).pvalue)
    assert r.lo <= r.diff <= r.hi
    assert (r.acc_a.k, r.acc_a.n) == (9, 12) and (r.acc_b.k, r.acc_b.n) == (5, 12)
    s = r.finding("deferkv", "snapkv", "contains")
    assert "n = 12" in s and "5 wins / 6 ties / 1 losses" in s and "McNemar" in s and "9/12" in s


def test_paired_all_ties_is_no_detectable_difference():
    r = paired([1, 0, 1], [1, 0, 1])
    assert not r.detectable and r.verdict() == "no detectable difference" and r.p == 1.0
    assert "no detectable difference" in r.finding("A", "B")


def test_paired_clear_difference_is_detected():
    r = paired([1.0] * 30, [0.0] * 30)
    assert r.detectable and r.verdict() == "A better" and r.p < 1e-6
    assert "A is higher than B" in r.finding("A", "B") and "p < 0.05" in r.finding("A", "B")
    r = paired(np.linspace(0, 0.5, 20), np.linspace(0.3, 0.9, 20))
    assert r.test == "sign" and r.verdict() == "A worse" and not r.binary


def test_few_prompts_are_no_evidence_however_narrow_the_interval():
    r = paired([1, 1, 1], [0, 0, 0])  # bootstrap CI [1, 1] excludes 0, but McNemar p = 0.25
    assert r.lo == r.hi == 1.0 and r.p == pytest.approx(0.25) and not r.detectable
    s = r.finding("A", "B")
    assert "no detectable difference" in s and "the test does not reject" in s and "3 prompts" in s
    one = paired([0.1], [0.3])
    assert not one.detectable and "no detectable difference" in one.finding("A", "B")


def test_paired_rejects_unpaired():
    with pytest.raises(ValueError, match="^b:"):
        paired([1, 0], [1])
    assert paired([], []).finding("A", "B").endswith("nothing to compare.")
    acc = accuracy([1, 1, 0])
    assert (acc.k, acc.n) == (2, 3) and "2/3" in str(acc)
    with pytest.raises(ValueError, match="^x:"):
        accuracy([0.5])


# ----------------------------------------------------------------------------- non-inferiority and power
def test_exact_ties_are_non_inferior_never_supported():
    """Paired outcomes that tie on every unit: at δ > 0 the one-sided bound (0) clears −δ and the exact sign-flip
    test rejects once there are enough units (p = 2^-n); the superiority test never rejects (p = 1)."""
    from workbench.study.conclusions import verdict

    for n in (3, 5, 10, 50):
        a = b = np.r_[np.ones(n // 2), np.zeros(n - n // 2)]
        r = paired(a, b, margin=0.1)
        assert (r.ni.lo1, r.ni.hi1, r.p) == (0.0, 0.0, 1.0)
        want_p = 0.5 ** n if n <= 16 else None
        if want_p is not None:
            assert r.ni.p_ni == pytest.approx(want_p)
        v = verdict("non-inferiority", lo=r.lo, hi=r.hi, p=r.p, lo1=r.ni.lo1, hi1=r.ni.hi1, p_ni=r.ni.p_ni,
                    p_inf=r.ni.p_inf, margin=0.1)
        assert v == ("non-inferior" if n >= 5 else "inconclusive") and v != "supported"
        # at δ = 0 ties are never non-inferior: the bound must clear 0 itself
        r0 = paired(a, b, margin=0.0)
        assert verdict("non-inferiority", lo=r0.lo, hi=r0.hi, p=r0.p, lo1=r0.ni.lo1, hi1=r0.ni.hi1,
                       p_ni=r0.ni.p_ni, p_inf=r0.ni.p_inf, margin=0.0) == "inconclusive"


def test_a_true_loss_beyond_the_margin_is_inferior():
    """A loses on 40 of 50 units (mean −0.8 ≪ −δ): inferior; a loss of 0.02 (1 of 50) is well within δ = 0.1:
    non-inferior."""
    from workbench.study.conclusions import verdict

    a, b = np.r_[np.zeros(40), np.ones(10)], np.ones(50)
    r = paired(a, b, margin=0.1)
    assert r.ni.hi1 < -0.1 and r.ni.p_inf < 0.05
    assert verdict("non-inferiority", lo=r.lo, hi=r.hi, p=r.p, lo1=r.ni.lo1, hi1=r.ni.hi1, p_ni=r.ni.p_ni,
                   p_inf=r.ni.p_inf, margin=0.1) == "inferior"
    small = paired(np.r_[np.zeros(1), np.ones(49)], np.ones(50), margin=0.1)
    assert verdict("non-inferiority", lo=small.lo, hi=small.hi, p=small.p, lo1=small.ni.lo1, hi1=small.ni.hi1,
                   p_ni=small.ni.p_ni, p_inf=small.ni.p_inf, margin=0.1) == "non-inferior"


def test_sign_flip_test_exact_by_enumeration():
    import itertools

    from workbench.analyse.stats import sign_flip_test

    rng = np.random.default_rng(4)
    x = rng.normal(0.2, 1.0, 9)
    dev = x + 0.1
    sums = np.array([np.dot(s, np.abs(dev)) for s in itertools.product((-1, 1), repeat=9)])
    assert sign_flip_test(x, -0.1) == pytest.approx(np.mean(sums >= dev.sum() - 1e-9))
    assert sign_flip_test(x, -0.1, "less") == pytest.approx(np.mean(sums <= dev.sum() + 1e-9))
    assert sign_flip_test([0.0, 0.0], 0.0) == 1.0
    with pytest.raises(ValueError, match="^alternative:"):
        sign_flip_test(x, 0.0, "two-sided")


@pytest.mark.parametrize("n, disc, sided", [(10, 0.3, 2), (50, 0.1, 2), (49, 0.2, 1), (30, 2 / 30, 2), (200, 0.05, 1)])
def test_mde_equals_an_independent_power_computation(n, disc, sided):
    """The MDE is the Δ where the normal-approximation power of McNemar's test (Connor 1987),
    Φ((√n Δ − z_α √ψ) / √(ψ − Δ²)), equals 0.8: found here by root-finding (scipy brentq), not the closed form."""
    from scipy.optimize import brentq

    from workbench.analyse.stats import mde, units_needed

    za = sps.norm.ppf(1 - 0.05 / sided)
    power = lambda delta: sps.norm.cdf((np.sqrt(n) * delta - za * np.sqrt(disc)) / np.sqrt(disc - delta ** 2))  # noqa: E731
    want = brentq(lambda dl: power(dl) - 0.8, za * np.sqrt(disc / n), np.sqrt(disc) * (1 - 1e-12))
    assert mde(n, disc, 0.05, sided=sided) == pytest.approx(want, rel=1e-9)
    # the planning inverse: the fewest units whose MDE reaches the effect
    target = want * (1 + 1e-9)  # brentq's root is exact to ~1e-12
    need = units_needed(target, disc, 0.05, sided=sided)
    assert need == n and mde(n - 1, disc, 0.05, sided=sided) > target


def test_mde_edges():
    from workbench.analyse.stats import mde

    assert mde(3, 1.0) == math.inf  # three units cannot reach 80 % power at α = 0.05 two-sided
    assert mde(50, 0.0) == pytest.approx(mde(50, 1 / 50))  # no discordant unit: one is assumed
    with pytest.raises(ValueError, match="^n:"):
        mde(0, 0.1)
    with pytest.raises(ValueError, match="^power:"):
        mde(10, 0.1, power=1.0)
