"""Paired statistics for comparisons of methods on the same prompts (pure functions, no model).

Every comparison the workbench reports goes through here, so that a finding carries its ``n``, a
confidence interval and paired wins / ties / losses:

* :func:`wilson_ci` — the Wilson score interval of an accuracy ``k / n`` (Wilson 1927); it stays inside
  ``[0, 1]`` and is not degenerate at ``0 / n`` or ``n / n``.
* :func:`bootstrap_ci` — a percentile bootstrap interval of a mean (seeded, so a report is reproducible).
* :func:`sign_test` — the two-sided exact sign test of paired differences (ties dropped); on 0/1 scores
  it is McNemar's exact test (the binomial test of the discordant pairs ``b`` vs ``c``):
  :func:`mcnemar` gives both the exact and the continuity-corrected chi-square p-value.
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

__all__ = ["wilson_ci", "bootstrap_ci", "sign_test", "mcnemar", "Paired", "paired", "accuracy", "fmt_ci"]

LEVEL = 0.95
N_BOOT = 2000


def _check_level(level) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level: must be a number in (0, 1), got {level!r}")
    return float(level)


def wilson_ci(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson score interval of the proportion ``k / n`` (``(nan, nan)`` for ``n = 0``).

    Args:
        k: successes, an integer in ``[0, n]``.
        n: trials, an integer ``>= 0``.
        level: confidence level in ``(0, 1)``.
    """
    level = _check_level(level)
    for name, v in (("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name}: must be an integer >= 0, got {v!r}")
    if k > n:
        raise ValueError(f"k: must be in [0, n={n}], got {k}")
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
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 100:
        raise ValueError(f"n_boot: must be an integer >= 100, got {n_boot!r}")
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
    for name, v in (("b", b), ("c", c)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name}: must be an integer >= 0, got {v!r}")
    b, c = int(b), int(c)
    if b + c == 0:
        return {"b": b, "c": c, "p_exact": 1.0, "chi2": 0.0, "p_chi2": 1.0}
    chi2 = (abs(b - c) - 1) ** 2 / (b + c)
    return {"b": b, "c": c, "p_exact": float(sps.binomtest(b, b + c, 0.5).pvalue), "chi2": float(chi2),
            "p_chi2": float(sps.chi2.sf(chi2, 1))}


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
        for k in ("acc_a", "acc_b"):
            acc = getattr(self, k)
            d.pop(k)
            if acc is not None:
                d[f"{k}_lo"], d[f"{k}_hi"] = acc.lo, acc.hi
        d["verdict"] = self.verdict()
        return d


def paired(a, b, level: float = LEVEL, *, n_boot: int = N_BOOT, seed: int = 0) -> Paired:
    """Compare scores ``a`` and ``b`` of two methods on the same prompts (``a[i]``, ``b[i]``: prompt ``i``).

    0/1 scores are tested with McNemar's exact test, others with the sign test; the mean difference
    gets a percentile bootstrap CI over prompts.
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
                  acc_b=accuracy(y, level) if binary else None)
