"""The report's verdict statistics against textbook values and scipy's own tests."""

from __future__ import annotations

import math

import pytest

from sparklab.bench.stats import (
    _z,
    binomial_half_two_sided,
    mcnemar_exact,
    proportion,
    t_quantile,
    t_sf,
    two_sample,
)


def test_wilson_interval_matches_the_textbook_formula() -> None:
    # Wilson (1927), 95%: 8 of 10 -> [0.490, 0.943] (Newcombe 1998, table I, method 3)
    p = proportion(8, 10)
    assert p.rate == 0.8 and p.low == pytest.approx(0.4902, abs=1e-4) and p.high == pytest.approx(0.9433, abs=1e-4)


def test_wilson_interval_is_not_a_point_at_zero_or_all() -> None:
    none, every = proportion(0, 6), proportion(6, 6)
    assert none.low == 0.0 and none.high == pytest.approx(0.3903, abs=1e-4)
    assert every.high == 1.0 and every.low == pytest.approx(0.6097, abs=1e-4)
    assert proportion(0, 0).low is None and proportion(0, 0).rate is None
    with pytest.raises(ValueError):
        proportion(3, 2)


def test_mcnemar_exact_is_the_binomial_test_of_the_discordant_pairs() -> None:
    pairs = [(True, False)] * 6 + [(True, True)] * 4 + [(False, False)] * 2
    m = mcnemar_exact(pairs)
    assert (m.both, m.only_first, m.only_second, m.neither, m.pairs, m.agree) == (4, 6, 0, 2, 12, 6)
    assert m.p_value == pytest.approx(2 * 0.5**6)  # 0.03125: six of six discordant pairs went one way
    balanced = mcnemar_exact([(True, False)] * 3 + [(False, True)] * 3)
    assert balanced.p_value == pytest.approx(1.0)
    assert mcnemar_exact([(True, True)] * 10).p_value == 1.0  # no discordant pair: nothing to test


def test_two_sample_is_welchs_test_with_its_interval() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [2.5, 3.5, 4.0, 6.0, 7.5, 8.0]
    d = two_sample(a, b)
    assert d is not None
    from scipy import stats as scipy_stats  # here, not at collection: each test worker would import it

    reference = scipy_stats.ttest_ind(b, a, equal_var=False)
    assert d.difference == pytest.approx(sum(b) / 6 - 3.0)
    assert d.p_value == pytest.approx(reference.pvalue)
    ci = reference.confidence_interval(0.95)
    assert (d.low, d.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert d.significant is (d.p_value < 0.05)


def test_two_sample_says_nothing_without_spread_or_values() -> None:
    assert two_sample([], [1.0]) is None
    one = two_sample([1.0], [2.0, 3.0])
    assert one is not None and one.low is None and one.significant is None
    flat = two_sample([1.0, 1.0], [1.0, 1.0])
    assert flat is not None and flat.p_value is None and math.isclose(flat.difference, 0.0)


def test_each_function_is_the_one_scipy_stats_evaluates() -> None:
    """sparklab calls scipy.special directly (scipy.stats takes four times as long to import); over Welch's
    fractional degrees of freedom, the tails and every discordant count up to 60, the values are scipy.stats'."""
    from scipy import stats as scipy_stats

    for df in (1.0, 1.5, 2.0, 3.7, 9.0, 29.2, 120.0, 1e6):
        for q in (0.5, 0.8, 0.95, 0.975, 0.995, 0.025):
            assert t_quantile(q, df) == pytest.approx(float(scipy_stats.t.ppf(q, df)), rel=1e-12, abs=1e-12)
        for x in (0.0, 0.3, 1.96, 4.0, 12.0):
            assert t_sf(x, df) == pytest.approx(float(scipy_stats.t.sf(x, df)), rel=1e-10, abs=1e-300)
    for confidence in (0.8, 0.9, 0.95, 0.99):
        assert _z(confidence) == pytest.approx(float(scipy_stats.norm.ppf((1 + confidence) / 2)), rel=1e-12)
    for n in range(1, 61):
        for k in range(n + 1):
            expected = float(scipy_stats.binomtest(k, n, 0.5).pvalue)
            assert binomial_half_two_sided(k, n) == pytest.approx(expected, rel=1e-9, abs=1e-300), (k, n)
    with pytest.raises(ValueError):
        binomial_half_two_sided(5, 4)


def test_drawing_an_interval_never_imports_scipy_stats() -> None:
    """The import a report, a sweep or tune pays: scipy.special, not scipy.stats (run in a fresh interpreter: this
    test process may have scipy.stats already)."""
    import subprocess
    import sys

    code = ("import sys; from sparklab.bench.stats import mcnemar_exact, proportion, t_quantile, two_sample; "
            "t_quantile(0.975, 3); proportion(3, 9); mcnemar_exact([(True, False)] * 3); "
            "two_sample([1.0, 2.0, 4.0], [2.0, 5.0, 6.0]); print('scipy.stats' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False", out.stderr
