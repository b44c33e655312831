"""Paired statistics for comparisons of methods on the same prompts (pure functions, no model).

Every comparison the workbench reports goes through here, so that a finding carries its ``n``, a
confidence interval and paired wins / ties / losses:

* :func:`wilson_ci` — the Wilson score interval of an accuracy ``k / n`` (Wilson 1927); it stays inside
  ``[0, 1]`` and is not degenerate at ``0 / n`` or ``n / n``.
* :func:`bootstrap_ci` — a percentile bootstrap interval of a mean (seeded, so a report is reproducible).
* :func:`sign_test` — the two-sided exact sign test of paired differences (ties dropped); on 0/1 scores
  it is McNemar's exact test (the binomial test of the discordant pairs ``b`` vs ``c``):
  :func:`mcnemar` gives both the exact and the continuity-corrected chi-square p-value.
* :func:`sign_flip_test` — the one-sided exact sign-flip (Fisher–Pitman permutation) test of paired differences
  against a shifted centre ``−δ`` (not valid for a margin on 0/1 outcomes: with every pair tied its p is ``2^−n``).
* :func:`noninferiority` — the test of a non-inferiority margin: Tango's (1998) score interval and test for paired
  proportions (:func:`tango_bounds`) on 0/1 outcomes, the more conservative of it and a Student t bound otherwise.
* :func:`mde` — the minimum detectable effect at a given power of a paired comparison of ``n`` units with observed
  discordance ``ψ`` (the mean squared paired difference; for 0/1 scores the share of discordant units), from the
  normal approximation of McNemar's test (Connor 1987), two-sided or one-sided; :func:`units_needed` inverts it.
* :func:`paired` — one comparison of two score vectors on the same prompts: the means, the mean paired
  difference with its bootstrap CI, wins / ties / losses, the test, and :meth:`Paired.finding`, one
  sentence generated from the numbers ("no detectable difference" when the interval covers 0, or when the
  paired test does not reject at ``1 - level``: a bootstrap CI of two or three prompts is no evidence).

Arithmetic is float64 numpy; p-values come from ``scipy.stats``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps
from scipy.optimize import brentq
from scipy.special import gammaln

from workbench.checks import Choice, Interval, check_args
from workbench.constraints import register_all, zero_upto

__all__ = ["wilson_ci", "bootstrap_ci", "sign_test", "mcnemar", "Paired", "paired", "accuracy", "fmt_ci",
           "sign_flip_test", "NonInferiority", "noninferiority", "tango_bounds", "tango_exact_p", "mde", "units_needed",
           "POWER"]

LEVEL = 0.95
N_BOOT = 2000
POWER = 0.8          # the power an MDE is stated at
EXACT_FLIPS = 16     # up to this many nonzero differences the sign-flip test enumerates every flip
N_FLIPS = 100_000    # beyond: seeded Monte Carlo flips


_UNIT_OPEN = Interval("real", 0.0, 1.0, closed="neither")
STATS_CHECKS = register_all("stats", {
    "level": _UNIT_OPEN, "alpha": _UNIT_OPEN, "power": _UNIT_OPEN, "margin": Interval("real", 0.0, 1.0, closed="left"),
    "n_boot": Interval("int", 100), "n": Interval("int", 1), "discordance": Interval("real", 0.0),
    "sided": Choice((1, 2)), "effect": Interval("real", 0.0, None, closed="right"), "count": Interval("int", 0)},
    __name__)
"""The constraints of the statistics' scalar arguments (registered as ``stats.<name>``)."""


def _check_level(level) -> float:
    return STATS_CHECKS["level"].check("level", level)


def wilson_ci(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of the proportion ``k / n`` (``(nan, nan)`` for ``n = 0``).

    Args:
        k: successes, an integer in ``[0, n]``.
        n: trials, an integer ``>= 0``.
        level: confidence level in ``(0, 1)``.
    """
    level = _check_level(level)
    k, n = (STATS_CHECKS["count"].check(name, v) for name, v in (("k", k), ("n", n)))
    zero_upto(n, note=f"n = {n} trials").check("k", k)
    if n == 0:
        return (math.nan, math.nan)
    z = float(sps.norm.ppf(0.5 + level / 2))
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def _values(x, name="x") -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if np.isnan(a).any():
        raise ValueError(f"{name}: must not contain NaN (drop unpaired or failed runs first)")
    return a


def bootstrap_ci(x, level: float = LEVEL, *, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``x`` (``(nan, nan)`` when empty; the point itself
    for one value or a constant sample).

    Args:
        x: 1-D numbers (no NaN).
        n_boot: resamples, ``>= 100``.
        seed: numpy generator seed.
    """
    level = _check_level(level)
    STATS_CHECKS["n_boot"].check("n_boot", n_boot)
    a = _values(x)
    if a.size == 0:
        return (math.nan, math.nan)
    if a.size == 1 or np.all(a == a[0]):
        return (float(a[0]), float(a[0]))
    rng = np.random.default_rng(seed)
    means = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def sign_test(d) -> tuple[int, int, int, float]:
    """Two-sided exact sign test of paired differences ``d``: ``(wins, ties, losses, p)``; ties are
    dropped, ``p = 1`` when every pair ties."""
    a = _values(d, "d")
    w, lo = int((a > 0).sum()), int((a < 0).sum())
    t = int(a.size - w - lo)
    p = 1.0 if w + lo == 0 else float(sps.binomtest(w, w + lo, 0.5).pvalue)
    return w, t, lo, p


def mcnemar(b: int, c: int) -> dict:
    """McNemar's test of the discordant pairs ``b`` (A right, B wrong) and ``c`` (A wrong, B right):
    ``{"b", "c", "p_exact", "chi2", "p_chi2"}`` (exact binomial and continuity-corrected chi-square;
    with ``b + c = 0`` both p-values are 1)."""
    b, c = (STATS_CHECKS["count"].check(name, v) for name, v in (("b", b), ("c", c)))
    if b + c == 0:
        return {"b": b, "c": c, "p_exact": 1.0, "chi2": 0.0, "p_chi2": 1.0}
    chi2 = (abs(b - c) - 1) ** 2 / (b + c)
    return {"b": b, "c": c, "p_exact": float(sps.binomtest(b, b + c, 0.5).pvalue), "chi2": float(chi2),
            "p_chi2": float(sps.chi2.sf(chi2, 1))}


def sign_flip_test(x, centre: float = 0.0, alternative: str = "greater", *, seed: int = 0) -> float:
    """One-sided sign-flip permutation test (Fisher 1935, Pitman 1937) of ``H0``: the paired differences ``x`` are
    symmetric about ``centre``; ``alternative`` ``"greater"`` (their mean is above ``centre``) or ``"less"``.

    The statistic is ``Σ (x_i − centre)``; its null distribution flips the sign of every deviation. Exact (every
    flip enumerated) up to :data:`EXACT_FLIPS` nonzero deviations, else ``N_FLIPS`` seeded Monte Carlo flips
    (``p = (1 + #) / (1 + N)``). No nonzero deviation: ``p = 1``."""
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative: must be 'greater' or 'less', got {alternative!r}")
    dev = _values(x, "x") - float(centre)
    dev = dev[np.abs(dev) > 1e-12]
    if alternative == "less":
        dev = -dev
    if dev.size == 0:
        return 1.0
    obs = dev.sum() - 1e-12 * dev.size  # flips equal to the observed sum count (float noise aside)
    mag = np.abs(dev)
    if dev.size <= EXACT_FLIPS:
        signs = ((np.arange(2 ** dev.size)[:, None] >> np.arange(dev.size)) & 1) * 2 - 1
        return float(((signs * mag).sum(1) >= obs).mean())
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(N_FLIPS // 10_000):
        flips = (rng.integers(0, 2, size=(10_000, dev.size)) * 2 - 1) * mag
        hits += int((flips.sum(1) >= obs).sum())
    return (1 + hits) / (1 + N_FLIPS)


@dataclass(frozen=True)
class NonInferiority:
    """A non-inferiority test of paired differences against a margin ``δ``: ``lo1`` / ``hi1`` the one-sided ``level``
    lower and upper confidence bounds of the mean difference, ``p_ni`` the one-sided p-value of ``H1: mean > −δ`` and
    ``p_inf`` that of ``H1: mean < −δ`` (an exact p-value can exceed ``1 − level`` where the asymptotic bound clears
    ``−δ``: a verdict needs both), and ``method``, the procedure that gave them (:func:`noninferiority`)."""

    margin: float
    lo1: float
    hi1: float
    p_ni: float
    p_inf: float
    method: str = "Tango score"


def _tango_z(b: float, c: float, n: int, delta0: float) -> float:
    """Tango's (1998) score statistic of ``H0: p12 − p21 = delta0`` for ``b`` units (A right, B wrong) and ``c`` (A
    wrong, B right) of ``n``: ``(b − c − n δ0) / √(n (2 p̃21 + δ0 (1 − δ0)))`` with ``p̃21`` the restricted maximum
    likelihood estimate of ``p21`` under ``H0``, the root of ``2n p² + B p + C`` with ``B = −b − c + (2n − b + c) δ0``
    and ``C = −c δ0 (1 − δ0)`` (taken in its cancellation-free form). ``0`` when the variance vanishes with the
    numerator (``b = c = 0`` at ``δ0 = 0``)."""
    a2, bq, cq = 2.0 * n, -b - c + (2.0 * n - b + c) * delta0, -c * delta0 * (1.0 - delta0)
    root = math.sqrt(max(bq * bq - 4.0 * a2 * cq, 0.0))
    p21 = (root - bq) / (2.0 * a2) if bq < 0 else (-2.0 * cq / (bq + root) if bq + root > 0 else 0.0)
    var = n * (2.0 * max(p21, 0.0) + delta0 * (1.0 - delta0))
    num = b - c - n * delta0
    if var <= 1e-15:
        return 0.0 if abs(num) <= 1e-12 else math.copysign(math.inf, num)
    return num / math.sqrt(var)


def _tango_z_all(b: np.ndarray, c: np.ndarray, n: int, delta0: float) -> np.ndarray:
    """:func:`_tango_z` over arrays of tables ``(b, c)`` of ``n`` units (the same formula, vectorised)."""
    a2, bq, cq = 2.0 * n, -b - c + (2.0 * n - b + c) * delta0, -c * delta0 * (1.0 - delta0)
    root = np.sqrt(np.maximum(bq * bq - 4.0 * a2 * cq, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        p21 = np.where(bq < 0, (root - bq) / (2.0 * a2), np.where(bq + root > 0, -2.0 * cq / (bq + root), 0.0))
        var = n * (2.0 * np.maximum(p21, 0.0) + delta0 * (1.0 - delta0))
        num = b - c - n * delta0
        z = num / np.sqrt(var)
    flat = var <= 1e-15
    return np.where(flat, np.where(np.abs(num) <= 1e-12, 0.0, np.copysign(np.inf, num)), z)


def tango_bounds(b: float, c: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The one-sided ``level`` lower and upper bounds of the difference of paired proportions ``(b − c) / n`` by
    inverting Tango's score test (Tango 1998, "Equivalence test and confidence interval for the difference in
    proportions for the paired-sample design", Stat Med 17:891–908; Newcombe 1998's method 10 family): the
    ``δ0`` where :func:`_tango_z` equals ``±z_level`` (scipy brentq; the statistic decreases in ``δ0``), ``−1`` / ``1``
    when no ``δ0`` inside reaches it. With every pair tied (``b = c = 0``) the bounds are ``∓ z² / (n + z²)``: ten
    ties bound a loss only at −0.21 (95 %), a hundred at −0.026."""
    level = _check_level(level)
    n = STATS_CHECKS["n"].check("n", n)
    if not (0 <= b and 0 <= c and b + c <= n * (1 + 1e-12)):
        raise ValueError(f"b, c: must be >= 0 with b + c <= n = {n}, got b={b!r}, c={c!r}")
    z, eps, mid = float(sps.norm.ppf(level)), 1e-12, (b - c) / n
    f_lo = lambda d: _tango_z(b, c, n, d) - z  # noqa: E731
    f_hi = lambda d: _tango_z(b, c, n, d) + z  # noqa: E731
    lo = -1.0 if f_lo(-1 + eps) <= 0 else float(brentq(f_lo, -1 + eps, mid, xtol=1e-13))
    hi = 1.0 if f_hi(1 - eps) >= 0 else float(brentq(f_hi, mid, 1 - eps, xtol=1e-13))
    return lo, hi


EXACT_UNITS = 200   # up to this many units the score test's p-value is exact unconditional
NUISANCE_GRID = 400  # nuisance values the exact p-value is maximised over


def tango_exact_p(b: int, c: int, n: int, delta0: float) -> tuple[float, float]:
    """The exact unconditional p-values of Tango's score statistic at ``H0: p12 − p21 = delta0``: ``(p_greater,
    p_less)``, the probability under the trinomial ``(b, c, ties)`` of a statistic at least (at most) the observed,
    maximised over the nuisance ``p21`` (on :data:`NUISANCE_GRID` values spanning its range under ``H0``), the
    construction of Suissa & Shuster (1991, Biometrics 47:361–372) applied to the score statistic. The asymptotic
    score test is anti-conservative on a handful of units (three wins of three give Tango's p = 0.02, yet a
    method truly 0.1 behind wins all three with probability up to 0.45³ = 0.091); this is not."""
    bb, cc = (a.ravel() for a in np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij"))
    keep = bb + cc <= n  # every table (b', c') of n units
    bb, cc = bb[keep], cc[keep]
    zs = _tango_z_all(bb.astype(float), cc.astype(float), n, delta0)
    zo = _tango_z(float(b), float(c), n, delta0)
    lo_p, hi_p = max(0.0, -delta0), (1.0 - delta0) / 2  # p21 >= 0, p12 = p21 + δ0 >= 0, ties >= 0
    p21 = np.linspace(lo_p, hi_p, NUISANCE_GRID)[:, None]
    p12, pt = np.clip(p21 + delta0, 0, 1), np.clip(1 - 2 * p21 - delta0, 0, 1)
    lg = gammaln(n + 1) - gammaln(bb + 1) - gammaln(cc + 1) - gammaln(n - bb - cc + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = (lg + np.where(bb > 0, bb * np.log(p12), 0.0) + np.where(cc > 0, cc * np.log(p21), 0.0)
                + np.where(n - bb - cc > 0, (n - bb - cc) * np.log(pt), 0.0))
    prob = np.nan_to_num(np.exp(logp))
    tol = 1e-9
    return (float(min(1.0, prob[:, zs >= zo - tol].sum(1).max())),
            float(min(1.0, prob[:, zs <= zo + tol].sum(1).max())))


def noninferiority(d, margin: float, level: float = LEVEL) -> NonInferiority:
    """The one-sided test of ``mean(d) ≥ −margin`` on paired differences ``d`` (no NaN), at ``level`` one-sided.

    * 0/1 outcomes per unit (every ``d_i`` in ``{−1, 0, 1}``: ``b`` wins, ``c`` losses of ``n``): Tango's score
      interval for the difference of paired proportions (:func:`tango_bounds`) and its score test at ``−δ``,
      exact unconditional up to :data:`EXACT_UNITS` units (:func:`tango_exact_p`), else ``p_ni = 1 − Φ(Z(−δ))``;
      a verdict needs both the bound and the test. A bootstrap or a sign-flip test of the shifted differences is
      not valid here: with every pair tied the bootstrap interval is ``[0, 0]`` and the sign-flip p is ``2^−n``
      whatever the true loss rate, while ten ties in a row happen with probability 0.35 when the method loses on
      10 % of units.
    * Other differences in ``[−1, 1]`` (a cluster's mean of 0/1 scores when its prompts disagree, a fraction): the
      more conservative of the one-sided Student t bound (``mean ∓ t_{level, n−1} s / √n``; its p-values) and
      Tango's bounds at the fractional counts ``b = Σ max(d_i, 0)``, ``c = Σ max(−d_i, 0)``. For a given
      ``mean |d|`` the 0/1 split has the largest variance, so the score bound keeps the t bound from trusting a
      small observed spread (few nonzero differences, or none: zero variance alone never shows non-inferiority,
      its bound is the tied-binary one). The combination is this workbench's choice; each
      part is a standard procedure.
    """
    level = _check_level(level)
    STATS_CHECKS["margin"].check("margin", margin)
    a = _values(d, "d")
    if a.size == 0:
        return NonInferiority(float(margin), math.nan, math.nan, math.nan, math.nan)
    if np.abs(a).max() > 1 + 1e-12:
        raise ValueError("d: a non-inferiority test of paired scores needs differences in [-1, 1] (scores in [0, 1])")
    n, delta0, z = int(a.size), -float(margin), None
    b, c = float(np.clip(a, 0, None).sum()), float(np.clip(-a, 0, None).sum())
    binary = bool(np.isin(a, (-1.0, 0.0, 1.0)).all())
    if binary:
        b, c = round(b), round(c)
    lo1, hi1 = tango_bounds(b, c, n, level)
    z = _tango_z(b, c, n, delta0)
    p_ni, p_inf = float(sps.norm.sf(z)), float(sps.norm.cdf(z))
    if binary:
        if n <= EXACT_UNITS:
            p_ni, p_inf = (max(p, q) for p, q in zip((p_ni, p_inf), tango_exact_p(int(b), int(c), n, delta0)))
        return NonInferiority(float(margin), lo1, hi1, p_ni, p_inf, "Tango score")
    if n >= 2:
        m, se = float(a.mean()), float(a.std(ddof=1)) / math.sqrt(n)
        tq = float(sps.t.ppf(level, n - 1))
        lo1, hi1 = min(lo1, m - tq * se), max(hi1, m + tq * se)
        if se > 0:
            t = (m - delta0) / se
            p_ni, p_inf = max(p_ni, float(sps.t.sf(t, n - 1))), max(p_inf, float(sps.t.cdf(t, n - 1)))
    return NonInferiority(float(margin), lo1, hi1, p_ni, p_inf, "Student t and Tango score")


def _z(alpha: float, sided: int) -> float:
    return float(sps.norm.ppf(1 - alpha / sided))


def _check_power(n, discordance, alpha, power, sided):
    check_args({k: STATS_CHECKS[k] for k in ("n", "discordance", "alpha", "power", "sided")}, locals())


def mde(n: int, discordance: float, alpha: float = 1 - LEVEL, power: float = POWER, *, sided: int = 2) -> float:
    """The minimum detectable effect Δ of a paired comparison of ``n`` units at ``power``: the smallest mean
    difference the test at ``alpha`` (``sided`` 2, or 1 for a non-inferiority margin) rejects with that power.

    Normal approximation of McNemar's test (Connor 1987) with ``ψ`` = ``discordance`` (the mean squared paired
    difference; 0/1 scores: the share of discordant units): ``√n Δ = z_α √ψ + z_β √(ψ − Δ²)``, solved in closed
    form, ``Δ = √ψ (√n z_α + z_β √(n − z_α² + z_β²)) / (n + z_β²)``. With no discordant unit observed (``ψ = 0``,
    every pair tied) ``ψ = 1 / n`` (one discordant unit on the 0/1 scale: the design needs one to detect anything).
    ``inf`` when no effect within ``√ψ`` reaches the power (too few units)."""
    _check_power(n, discordance, alpha, power, sided)
    psi = float(discordance) if discordance > 0 else 1.0 / n
    za, zb = _z(alpha, sided), float(sps.norm.ppf(power))
    disc = n - za * za + zb * zb
    if disc < 0:
        return math.inf
    delta = math.sqrt(psi) * (math.sqrt(n) * za + zb * math.sqrt(disc)) / (n + zb * zb)
    return delta if delta <= math.sqrt(psi) else math.inf


def units_needed(effect: float, discordance: float, alpha: float = 1 - LEVEL, power: float = POWER, *,
                 sided: int = 2) -> int:
    """The fewest independent units whose :func:`mde` at ``discordance`` is at most ``effect`` (``> 0``); Connor's
    ``n = (z_α √ψ + z_β √(ψ − Δ²))² / Δ²`` rounded up, then checked against :func:`mde`."""
    STATS_CHECKS["effect"].check("effect", effect)
    _check_power(1, discordance, alpha, power, sided)
    psi = float(discordance)
    if effect * effect > psi:
        raise ValueError(f"effect: must be at most sqrt(discordance) = {math.sqrt(psi):.3g} (a mean difference "
                         f"cannot exceed the root mean square of the differences), got {effect!r}")
    za, zb = _z(alpha, sided), float(sps.norm.ppf(power))
    n = max(1, math.ceil((za * math.sqrt(psi) + zb * math.sqrt(psi - effect * effect)) ** 2 / effect ** 2))
    while mde(n, psi, alpha, power, sided=sided) > effect * (1 + 1e-12):  # float noise of the closed form
        n += 1
    return n


def fmt_ci(lo: float, hi: float, signed: bool = False, digits: int = 2) -> str:
    """``[lo, hi]`` with ``digits`` decimals (``+`` signs when ``signed``)."""
    if math.isnan(lo) or math.isnan(hi):
        return "[n/a]"
    f = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
    return f"[{f.format(lo)}, {f.format(hi)}]"


@dataclass(frozen=True)
class Accuracy:
    """An accuracy with its Wilson interval: ``k`` of ``n`` right."""

    k: int
    n: int
    lo: float
    hi: float

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else math.nan

    def __str__(self) -> str:
        if not self.n:
            return "n/a (n = 0)"
        return f"{self.value:.2f} {fmt_ci(self.lo, self.hi)} ({self.k}/{self.n})"


def accuracy(x, level: float = LEVEL) -> Accuracy:
    """Accuracy of 0/1 scores ``x`` (no NaN) with its Wilson interval."""
    a = _values(x)
    if not np.isin(a, (0.0, 1.0)).all():
        raise ValueError("x: an accuracy needs 0/1 scores")
    k, n = int(a.sum()), int(a.size)
    lo, hi = wilson_ci(k, n, level)
    return Accuracy(k, n, lo, hi)


@dataclass(frozen=True)
class Paired:
    """One paired comparison of method A against method B on the same ``n`` prompts.

    Attributes:
        n: paired prompts; mean_a, mean_b: the two means.
        diff: mean of ``a - b``; lo, hi: its bootstrap interval at ``level``.
        wins, ties, losses: prompts where A scores above, equal to, below B.
        test: ``"mcnemar"`` (0/1 scores: exact McNemar) or ``"sign"`` (exact sign test); p: its p-value.
        binary: whether both score vectors are 0/1 (then ``acc_a``/``acc_b`` carry Wilson intervals).
        disc: the discordance, the mean squared paired difference (0/1 scores: the share of discordant prompts),
            what :func:`mde` needs.
        ni: the non-inferiority test (:func:`noninferiority`) when :func:`paired` was given a margin.
    """

    n: int
    mean_a: float
    mean_b: float
    diff: float
    lo: float
    hi: float
    wins: int
    ties: int
    losses: int
    test: str
    p: float
    level: float
    binary: bool
    acc_a: Accuracy | None = None
    acc_b: Accuracy | None = None
    disc: float = math.nan
    ni: NonInferiority | None = None

    @property
    def detectable(self) -> bool:
        """Whether the difference is detected: the bootstrap interval excludes 0 **and** the paired test
        rejects at ``1 - level`` (a bootstrap interval of very few prompts is narrow however few they are:
        three wins out of three exclude 0, yet the sign test gives p = 0.25)."""
        return self.n > 0 and not (self.lo <= 0.0 <= self.hi) and self.p < 1 - self.level

    def verdict(self) -> str:
        if self.n == 0:
            return "no paired prompts"
        if not self.detectable:
            return "no detectable difference"
        return "A better" if self.diff > 0 else "A worse"

    def finding(self, a: str, b: str, metric: str = "accuracy", where: str = "") -> str:
        """One sentence with the numbers: means (Wilson CIs for accuracies), the difference and its CI,
        wins/ties/losses, the test and the verdict."""
        pct = int(round(self.level * 100))
        scope = f" on {where}" if where else ""
        if self.n == 0:
            return f"{a} vs {b}{scope} ({metric}): no paired prompts, nothing to compare."
        if self.binary:
            means = f"{a} {self.acc_a} vs {b} {self.acc_b}"
        else:
            means = f"{a} {self.mean_a:.3f} vs {b} {self.mean_b:.3f}"
        body = (f"{a} vs {b}{scope} ({metric}, n = {self.n} paired prompts): {means}; difference "
                f"{self.diff:+.2f} {fmt_ci(self.lo, self.hi, signed=True)} ({pct}% bootstrap CI); "
                f"{self.wins} wins / {self.ties} ties / {self.losses} losses; "
                f"{'McNemar exact' if self.test == 'mcnemar' else 'sign test'} p = {self.p:.3g}")
        alpha = f"{1 - self.level:.2g}"
        if self.lo <= 0.0 <= self.hi:
            return body + f": no detectable difference (the {pct}% interval covers 0)."
        if not self.detectable:
            return body + (f": no detectable difference (the interval excludes 0 but the test does not reject: "
                           f"p >= {alpha} with {self.n} prompts).")
        word = "higher" if self.diff > 0 else "lower"
        return body + f": {a} is {word} than {b} (the {pct}% interval excludes 0 and p < {alpha})."

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("ni")
        if self.ni is not None:
            d.update(margin=self.ni.margin, lo1=self.ni.lo1, hi1=self.ni.hi1, p_ni=self.ni.p_ni, p_inf=self.ni.p_inf,
                     ni_test=self.ni.method)
        for k in ("acc_a", "acc_b"):
            acc = getattr(self, k)
            d.pop(k)
            if acc is not None:
                d[f"{k}_lo"], d[f"{k}_hi"] = acc.lo, acc.hi
        d["verdict"] = self.verdict()
        return d


def paired(a, b, level: float = LEVEL, *, n_boot: int = N_BOOT, seed: int = 0, margin: float | None = None) -> Paired:
    """Compare scores ``a`` and ``b`` of two methods on the same prompts (``a[i]``, ``b[i]``: prompt ``i``).

    0/1 scores are tested with McNemar's exact test, others with the sign test; the mean difference
    gets a percentile bootstrap CI over prompts. ``margin``: also test non-inferiority of A at that margin
    (:func:`noninferiority`, in ``Paired.ni``).
    """
    x, y = _values(a, "a"), _values(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"b: must pair with a (same length {x.size}), got {y.size}")
    level = _check_level(level)
    d = x - y
    w, t, lo_n, p = sign_test(d)
    binary = bool(np.isin(x, (0.0, 1.0)).all() and np.isin(y, (0.0, 1.0)).all())
    test = "mcnemar" if binary else "sign"
    if binary:
        p = mcnemar(w, lo_n)["p_exact"]
    lo, hi = bootstrap_ci(d, level, n_boot=n_boot, seed=seed)
    n = int(x.size)
    return Paired(n=n, mean_a=float(x.mean()) if n else math.nan, mean_b=float(y.mean()) if n else math.nan,
                  diff=float(d.mean()) if n else math.nan, lo=lo, hi=hi, wins=w, ties=t, losses=lo_n, test=test,
                  p=p, level=level, binary=binary, acc_a=accuracy(x, level) if binary else None,
                  acc_b=accuracy(y, level) if binary else None, disc=float((d * d).mean()) if n else math.nan,
                  ni=None if margin is None or not n else noninferiority(d, margin, level))
