"""Small, exact statistics for the report's verdicts (pure; the one module that imports scipy).

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
    from scipy.stats import t  # imported here: scipy.stats takes a noticeable time to import

    return float(t.ppf(q, df))


def _z(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf((1 + confidence) / 2))


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
    from scipy.stats import binomtest

    both = sum(1 for a, b in pairs if a and b)
    only_first = sum(1 for a, b in pairs if a and not b)
    only_second = sum(1 for a, b in pairs if b and not a)
    neither = len(pairs) - both - only_first - only_second
    discordant = only_first + only_second
    p = float(binomtest(only_first, discordant, 0.5).pvalue) if discordant else 1.0
    return McNemar(both, only_first, only_second, neither, min(1.0, p))


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
    from scipy.stats import t

    p = float(2 * t.sf(abs(diff) / se, df))
    return Difference(n1, n2, m1, m2, diff, diff - half, diff + half, min(1.0, p))
