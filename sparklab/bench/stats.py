"""Small, exact statistics for the report's verdicts (pure; the one module that imports scipy).

Each is scipy.special's function that scipy.stats itself evaluates (scipy 1.15, stats/_continuous_distns.py:
`norm._ppf` is `ndtri`, `t._ppf` is `stdtrit`, `t._sf` is `stdtr` of -x; for p = 1/2 `binomtest`'s two-sided
p-value is twice the smaller tail, `bdtr`): scipy.special imports in ~0.17 s where scipy.stats takes ~0.7 s, paid
by every `sparklab` process that draws an interval (tests/unit/test_stats.py checks each against scipy.stats).

- `t_quantile`: Student-t quantiles for the intervals over repeats (metrics.estimate, metrics.ratio).
- `proportion`: a pass rate with its Wilson score interval (good at small n and at 0% or 100%, where the
  normal-approximation interval collapses to a point).
- `mcnemar_exact`: paired binary outcomes (the same task graded under two configs): the exact two-sided binomial
  test on the discordant pairs, as McNemar's test is done when they are few.
- `two_sample`: a difference of means between two independent samples with its Welch t interval and p-value
  (the lossless check compares per-token log-likelihoods of two configs' sampled answers this way).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95


def t_quantile(q: float, df: float) -> float:
    """Student-t's quantile q at df degrees of freedom (df may be fractional: Welch's)."""
    from scipy.special import stdtrit  # imported here: only a process that draws an interval pays for scipy

    return float(stdtrit(df, q))


def t_sf(x: float, df: float) -> float:
    """Student-t's upper tail P(T > x) at df degrees of freedom."""
    from scipy.special import stdtr

    return float(stdtr(df, -x))


def _z(confidence: float) -> float:
    from scipy.special import ndtri

    return float(ndtri((1 + confidence) / 2))


def binomial_half_two_sided(k: int, n: int) -> float:
    """The exact two-sided binomial test of k successes in n trials at p = 1/2: the distribution is symmetric, so
    the outcomes as unlikely as k are the two tails beyond min(k, n - k) and the p-value is twice the smaller tail
    (scipy.stats.binomtest's two-sided value for p = 1/2), at most 1."""
    from scipy.special import bdtr

    if not 0 <= k <= n:
        raise ValueError(f"{k} successes of {n} trials")
    return min(1.0, 2.0 * float(bdtr(min(k, n - k), n, 0.5)))


@dataclass(frozen=True)
class Proportion:
    """successes of n, with the Wilson score interval (None for n = 0)."""

    successes: int
    n: int
    low: float | None
    high: float | None

    @property
    def rate(self) -> float | None:
        return self.successes / self.n if self.n else None


def proportion(successes: int, n: int, confidence: float = CONFIDENCE) -> Proportion:
    if n <= 0:
        return Proportion(successes, 0, None, None)
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes of {n}")
    z = _z(confidence)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends, not 1e-17 off
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Proportion(successes, n, low, high)


@dataclass(frozen=True)
class McNemar:
    """Paired verdicts: both passed, only the first, only the second, both failed; the exact p-value of the
    discordant pairs (1.0 when there are none)."""

    both: int
    only_first: int
    only_second: int
    neither: int
    p_value: float

    @property
    def pairs(self) -> int:
        return self.both + self.only_first + self.only_second + self.neither

    @property
    def agree(self) -> int:
        return self.both + self.neither


def mcnemar_exact(pairs: Sequence[tuple[bool, bool]]) -> McNemar:
    """pairs: (first passed, second passed) per paired outcome. Under "no difference" each discordant pair is
    equally likely to go either way: p = the two-sided binomial test of only_first of the discordant at 1/2."""
    both = sum(1 for a, b in pairs if a and b)
    only_first = sum(1 for a, b in pairs if a and not b)
    only_second = sum(1 for a, b in pairs if b and not a)
    neither = len(pairs) - both - only_first - only_second
    discordant = only_first + only_second
    p = binomial_half_two_sided(only_first, discordant) if discordant else 1.0
    return McNemar(both, only_first, only_second, neither, p)


@dataclass(frozen=True)
class Difference:
    """mean(second) - mean(first) with a Welch t interval and two-sided p-value (None with fewer than 2 values
    on a side, or no spread at all)."""

    n_first: int
    n_second: int
    mean_first: float
    mean_second: float
    difference: float
    low: float | None
    high: float | None
    p_value: float | None

    @property
    def significant(self) -> bool | None:
        if self.low is None or self.high is None:
            return None
        return not (self.low <= 0.0 <= self.high)


def two_sample(first: Sequence[float], second: Sequence[float], confidence: float = CONFIDENCE) -> Difference | None:
    """Welch's two-sample t test of the means (unequal variances; no normality is needed for the interval at the
    sample sizes the report uses, by the central limit theorem)."""
    if not first or not second:
        return None
    n1, n2 = len(first), len(second)
    m1, m2 = math.fsum(first) / n1, math.fsum(second) / n2
    diff = m2 - m1
    if n1 < 2 or n2 < 2:
        return Difference(n1, n2, m1, m2, diff, None, None, None)
    v1 = math.fsum((x - m1) ** 2 for x in first) / (n1 - 1)
    v2 = math.fsum((x - m2) ** 2 for x in second) / (n2 - 1)
    se2 = v1 / n1 + v2 / n2
    if se2 == 0:
        return Difference(n1, n2, m1, m2, diff, None, None, None)
    df = se2**2 / ((v1 / n1) ** 2 / (n1 - 1) + (v2 / n2) ** 2 / (n2 - 1))
    se = math.sqrt(se2)
    half = t_quantile((1 + confidence) / 2, df) * se
    p = 2 * t_sf(abs(diff) / se, df)
    return Difference(n1, n2, m1, m2, diff, diff - half, diff + half, min(1.0, p))
