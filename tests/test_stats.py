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

from workbench.analyse.stats import accuracy, bootstrap_ci, mcnemar, mde, paired, sign_test, wilson_ci


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
def _ni_verdict(r, margin=0.1):
    from workbench.study.conclusions import verdict

    return verdict("non-inferiority", lo=r.lo, hi=r.hi, p=r.p, lo1=r.ni.lo1, hi1=r.ni.hi1, p_ni=r.ni.p_ni,
                   p_inf=r.ni.p_inf, margin=margin)


def _score_brute(b, c, n, d0):
    """Tango's score statistic from its definition: the restricted MLE of p21 under p12 − p21 = d0 by numerically
    maximising the trinomial log-likelihood, then (b − c − n d0) / √(n (p12 + p21 − d0²))."""
    from scipy.optimize import minimize_scalar

    lo_p, hi_p = max(0.0, -d0), (1 - d0) / 2  # p21 >= 0, p12 = p21 + d0 >= 0, p11 + p22 >= 0
    def nll(p21):
        p12, rest = p21 + d0, 1 - 2 * p21 - d0
        return -sum(k * np.log(max(q, 1e-300)) for k, q in ((c, p21), (b, p12), (n - b - c, rest)) if k)
    p21 = minimize_scalar(nll, bounds=(lo_p, hi_p), method="bounded", options={"xatol": 1e-13}).x
    return (b - c - n * d0) / np.sqrt(n * (2 * p21 + d0 - d0 * d0))


def _exact_brute(b, c, n, d0=-0.1):
    """The exact unconditional p-value of the score test of p12 − p21 > d0 (Suissa & Shuster's construction), from
    its definition: every table (b', c') of n units, scipy's multinomial, maximised over a fine nuisance grid."""
    from scipy.stats import multinomial

    tables = [(x, y) for x in range(n + 1) for y in range(n + 1 - x)]
    z = {t: _score_brute(*t, n, d0) for t in tables}
    extreme = [t for t in tables if z[t] >= z[(b, c)] - 1e-6]
    best = 0.0
    for p21 in np.linspace(max(0.0, -d0), (1 - d0) / 2, 401):
        probs = np.clip([p21 + d0, p21, 1 - 2 * p21 - d0], 0, 1)
        best = max(best, sum(multinomial.pmf([x, y, n - x - y], n, probs) for x, y in extreme))
    return best


def _tango_brute(b, c, n, level=0.95):
    """Tango's score interval written from its definition, independently of the closed form: the restricted MLE of
    p21 under p12 − p21 = δ0 by numerically maximising the multinomial log-likelihood, the score statistic
    (b − c − nδ0) / √(n (p12 + p21 − δ0²)), and the one-sided bounds by root-finding on a grid-bracketed δ0."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    z = lambda d0: _score_brute(b, c, n, d0)  # noqa: E731

    q = norm.ppf(level)
    grid = np.linspace(-0.999, 0.999, 999)
    zs = np.array([z(g) for g in grid])
    i = np.nonzero(zs <= q)[0][0]
    j = np.nonzero(zs < -q)[0][0]
    return (brentq(lambda d: z(d) - q, grid[i - 1], grid[i], xtol=1e-10),
            brentq(lambda d: z(d) + q, grid[j - 1], grid[j], xtol=1e-10))


def test_ten_ties_are_not_non_inferior():
    """Ten tied pairs cannot show a loss rate below δ = 0.1: if the method lost on 10 % of units (p01 = 0.1), ten ties
    in a row happen with probability 0.9^10 ≈ 0.35. Tango's one-sided 95 % bound with every pair tied is
    −z² / (n + z²) = −0.213 at n = 10 (below −δ): inconclusive, and underpowered by the MDE. The old bootstrap and
    sign-flip test called this non-inferior (bound 0, p = 2^-10)."""
    from scipy.stats import norm

    z = norm.ppf(0.95)
    assert 0.9 ** 10 > 0.05  # ties are not rare under a true loss of δ
    for n in (3, 5, 10, 24):
        a = b = np.r_[np.ones(n // 2), np.zeros(n - n // 2)]
        r = paired(a, b, margin=0.1)
        assert r.ni.lo1 == pytest.approx(-z * z / (n + z * z), abs=1e-9) and r.ni.lo1 < -0.1
        assert r.ni.p_ni > 0.05 and r.p == 1.0 and r.ni.method == "Tango score"
        assert _ni_verdict(r) == "inconclusive"
    assert mde(10, 0.0, 0.05, sided=1) > 0.1  # and the row reads underpowered


def test_many_ties_are_non_inferior_never_supported():
    """A hundred tied pairs: the bound −z² / (n + z²) = −0.026 clears −0.1, non-inferior; never supported (p = 1).
    At δ = 0 ties are never non-inferior: the bound must clear 0 itself."""
    from scipy.stats import norm

    z = norm.ppf(0.95)
    a = b = np.r_[np.ones(50), np.zeros(50)]
    r = paired(a, b, margin=0.1)
    assert r.ni.lo1 == pytest.approx(-z * z / (100 + z * z), abs=1e-9) and r.ni.lo1 > -0.1 and r.ni.p_ni < 0.05
    assert _ni_verdict(r) == "non-inferior" and r.p == 1.0
    assert _ni_verdict(paired(a, b, margin=0.0), margin=0.0) == "inconclusive"
    # the exact test: a method losing on one unit in ten (p01 = 0.1) ties all n with probability 0.9^n, so no fewer
    # than 29 ties can show δ = 0.1 at 95 % (0.9^28 = 0.052), though the asymptotic bound clears −0.1 from 25 on
    for n in (25, 28, 29):
        r = paired(np.ones(n), np.ones(n), margin=0.1)
        assert r.ni.lo1 > -0.1 and r.ni.p_ni >= 0.9 ** n - 1e-12
        assert r.ni.p_ni == pytest.approx(_exact_brute(0, 0, n), rel=1e-4)
        assert _ni_verdict(r) == ("non-inferior" if n >= 29 else "inconclusive")
    # three wins of three: Tango's asymptotic bound clears −0.1, but a method 0.1 behind wins all three with
    # probability up to 0.45³ (p12 = 0.45, p21 = 0.55): the exact p-value says so, inconclusive
    r = paired(np.ones(3), np.zeros(3), margin=0.1)
    assert r.ni.lo1 > -0.1 and r.ni.p_ni == pytest.approx(0.45 ** 3, rel=1e-6) and _ni_verdict(r) == "inconclusive"


def test_a_true_loss_beyond_the_margin_is_inferior():
    """A loses on 40 of 50 units (mean −0.8 ≪ −δ): inferior; a loss of 0.02 (1 of 50) is within δ = 0.1 but 50
    units bound it only at −0.08 … non-inferior; a loss on 3 of 10 is inconclusive, not inferior."""
    a, b = np.r_[np.zeros(40), np.ones(10)], np.ones(50)
    r = paired(a, b, margin=0.1)
    assert r.ni.hi1 < -0.1 and r.ni.p_inf < 0.05
    assert _ni_verdict(r) == "inferior"
    small = paired(np.r_[np.zeros(1), np.ones(49)], np.ones(50), margin=0.1)
    assert small.ni.lo1 > -0.1 and _ni_verdict(small) == "non-inferior"
    assert _ni_verdict(paired(np.r_[np.zeros(3), np.ones(7)], np.ones(10), margin=0.1)) == "inconclusive"


@pytest.mark.parametrize("b, c, n", [(0, 0, 10), (0, 0, 100), (1, 0, 10), (0, 3, 10), (5, 2, 50), (40, 0, 50),
                                     (0, 40, 50), (7, 9, 30)])
def test_tango_interval_equals_a_brute_force_computation(b, c, n):
    """:func:`tango_bounds` equals Tango's interval computed from its definition in the test (numerical restricted
    MLE, score statistic, root-finding), and :func:`noninferiority`'s p-values are no smaller than that score test's
    at −δ (they are its exact unconditional version)."""
    from scipy.stats import norm

    from workbench.analyse.stats import noninferiority, tango_bounds

    want = _tango_brute(b, c, n)
    assert tango_bounds(b, c, n) == pytest.approx(want, abs=1e-6)
    d = np.r_[np.ones(b), -np.ones(c), np.zeros(n - b - c)]
    ni = noninferiority(d, 0.1)
    assert (ni.lo1, ni.hi1) == pytest.approx(want, abs=1e-6)
    zs = (b - c + 0.1 * n)  # the score at δ0 = −0.1, by the same brute force
    from scipy.optimize import minimize_scalar
    nll = lambda p21: -sum(k * np.log(max(q, 1e-300)) for k, q in  # noqa: E731
                           ((c, p21), (b, p21 - 0.1), (n - b - c, 1 - 2 * p21 + 0.1)) if k)
    p21 = minimize_scalar(nll, bounds=(0.1, 0.55), method="bounded", options={"xatol": 1e-13}).x
    z = zs / np.sqrt(n * (2 * p21 - 0.1 - 0.01))
    # the p-values: the exact unconditional ones, never below the asymptotic score test's
    assert ni.p_ni >= norm.sf(z) - 1e-9 and ni.p_inf >= norm.cdf(z) - 1e-9
    assert (ni.p_ni < 0.05) <= (ni.lo1 > -0.1) and (ni.p_inf < 0.05) <= (ni.hi1 < -0.1)
    if n <= 10:
        assert ni.p_ni == pytest.approx(_exact_brute(b, c, n), rel=1e-4)


def test_noninferiority_of_non_binary_differences_is_never_shown_on_zero_information():
    """Cluster means that are not 0/1: the bound is the lower of Student t and Tango at the fractional counts. Zero
    spread gives the tied-binary bound (inconclusive on 10 clusters, not a degenerate [0, 0]); one half-discordant
    cluster of ten does not make the t bound trust a tiny spread; a wide spread is not shown non-inferior."""
    from scipy.stats import norm, t

    from workbench.analyse.stats import noninferiority

    z = norm.ppf(0.95)
    a = np.r_[0.5, np.ones(9)]
    r = paired(a, a, margin=0.1)
    assert not r.binary and r.ni.lo1 == pytest.approx(-z * z / (10 + z * z)) and _ni_verdict(r) == "inconclusive"
    d = np.r_[0.5, np.zeros(9)]
    ni = noninferiority(d, 0.1)
    t_lo = d.mean() - t.ppf(0.95, 9) * d.std(ddof=1) / np.sqrt(10)
    assert t_lo > -0.1 > ni.lo1 and ni.p_ni > 0.05 and ni.method == "Student t and Tango score"
    big = np.r_[np.full(50, 0.5), np.full(50, -0.5)] + 0.01
    ni = noninferiority(big, 0.1)
    assert ni.lo1 == pytest.approx(min(big.mean() - t.ppf(0.95, 99) * big.std(ddof=1) / 10, ni.lo1))
    with pytest.raises(ValueError, match="^d:"):
        noninferiority([2.0, 0.0], 0.1)


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
