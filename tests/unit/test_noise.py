"""Noise within one server load and between loads (sparklab.bench.noise): the variance components against a one-way
random-effects ANOVA done by hand, and what they do to intervals and the "told apart" test."""

from __future__ import annotations

import math

import pytest

from sparklab.bench import noise
from sparklab.bench.metrics import estimate, t_quantile


def test_components_match_a_one_way_anova_done_by_hand() -> None:
    # one config, two loads of three runs: load means 10 and 12, each with runs 1 apart
    a = [[9.0, 10.0, 11.0], [11.0, 12.0, 13.0]]
    comp = noise.components([a])
    grand = 11.0  # everything is relative to the config's mean
    ms_within = ((1 + 0 + 1) + (1 + 0 + 1)) / 4 / grand**2  # SS_within / (N - L)
    ms_between = 3 * ((10 - 11) ** 2 + (12 - 11) ** 2) / 1 / grand**2  # n sum (mean_l - mean)^2 / (L - 1)
    n0 = (6 - (9 + 9) / 6) / 1  # (N - sum n_l^2 / N) / (L - 1) = 3
    assert comp.within == pytest.approx(ms_within) and comp.within_df == 4
    assert comp.between == pytest.approx((ms_between - ms_within) / n0) and comp.between_df == 1
    assert comp.reloaded == 1
    assert comp.between_share == pytest.approx(comp.between / (comp.between + comp.within))


def test_loads_that_agree_better_than_their_runs_give_no_between_load_variance() -> None:
    comp = noise.components([[[9.0, 11.0], [11.0, 9.0]]])  # equal load means, runs 2 apart
    assert comp.between == 0.0 and comp.within and comp.within > 0


def test_nothing_reloaded_leaves_the_between_part_unknown_and_intervals_within_only() -> None:
    values = [[50.0, 52.0, 51.0]]
    comp = noise.components([values, [[40.0, 41.0, 39.0]]])
    assert comp.between is None and comp.between_share is None and comp.reloaded == 0
    interval = noise.interval(values, comp)
    assert interval is not None and interval.one_load and not interval.between_known
    # pooled within-load noise, not this config's own: the half-width from the pooled relative sd, 4 df
    half = t_quantile(0.975, 4) * math.sqrt(comp.within / 3) * 51.0
    assert interval.high == pytest.approx(51.0 + half) and interval.low == pytest.approx(51.0 - half)


def test_between_load_noise_widens_the_interval_of_every_config_and_says_which_rest_on_one_load() -> None:
    reloaded = [[50.0, 50.5, 49.5], [56.0, 55.5, 56.5]]  # a second load 12% faster: the machine got quieter
    single = [[40.0, 40.4, 39.6]]
    comp = noise.components([reloaded, single])
    assert comp.between is not None and comp.between > 10 * comp.within  # the loads differ far more than runs
    two = noise.interval(reloaded, comp)
    one = noise.interval(single, comp)
    within_only = estimate(v for load in reloaded for v in load)
    assert two is not None and one is not None and within_only is not None
    assert two.loads == 2 and not two.one_load and two.mean == pytest.approx(53.0)
    assert one.one_load and one.between_known  # borrowed from the reloaded config, and said so
    assert (two.high - two.low) > (within_only.high - within_only.low)  # type: ignore[operator]
    assert (one.high - one.low) / one.mean > 0.1  # a single load cannot be narrower than the load-to-load drift


def test_a_ratio_told_apart_within_one_load_is_not_once_loads_differ() -> None:
    a, b = [[52.0, 52.2, 51.8]], [[50.0, 50.2, 49.8]]  # 4% apart with runs 0.4% apart: clearly different...
    quiet = noise.components([a, b])
    r = noise.ratio(a, b, quiet)
    assert r is not None and r.significant
    drifting = [[50.0, 50.2, 49.8], [45.0, 45.2, 44.8]]  # ...until another config's loads differ by 10%
    loud = noise.components([a, b, drifting])
    r = noise.ratio(a, b, loud)
    assert r is not None and r.value == pytest.approx(1.04) and not r.significant


def test_single_runs_have_no_interval() -> None:
    comp = noise.components([[[50.0]], [[51.0]]])
    assert comp.within is None and comp.between is None
    interval = noise.interval([[50.0]], comp)
    assert interval is not None and interval.low is None and interval.runs == 1
    r = noise.ratio([[51.0]], [[50.0]], comp)
    assert r is not None and r.low is None and r.value == pytest.approx(1.02)
    assert noise.interval([], comp) is None and noise.ratio([], [[1.0]], comp) is None
