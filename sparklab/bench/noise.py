"""Noise within one server load and between loads of the same config (pure).

A config measured at one concurrency has values grouped by load: the repeats one server start ran, then the
repeats of another start of the same config (a reload). On a shared machine the second kind of noise is the larger
one (measured here: 11-19% drift between loads against 2-7% within one), and an interval built from the repeats of
one load sees only the first. So the figures that decide something use both:

- within-load variance, pooled over every load with two or more repeats (relative to its config's mean, so configs
  of different speed pool);
- between-load variance, from configs loaded two or more times: the one-way random-effects estimate
  (MS_between - MS_within) / n0, pooled over them (relative, as above); 0 when the loads agree better than their
  repeats predict;
- a config's estimate is the mean of its load means (each load weighs the same: a load is one draw of the machine's
  state), with relative variance (1/L^2) * sum over loads of (between + within / n_load), and Welch-Satterthwaite
  degrees of freedom over the two pooled components.

A config loaded once still gets the between-load component when some other config of the run was reloaded (it is
borrowed from them, and `Interval.one_load` says so); when nothing was reloaded, intervals are within-load only and
`Components.between` is None: verdicts that rest on one load, which reports and `tune` say.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sparklab.bench.metrics import CONFIDENCE, Ratio, t_quantile

ByLoad = Sequence[Sequence[float]]  # one config's values, grouped by load (in load order)


@dataclass(frozen=True)
class Components:
    """Pooled relative variances: within one load, and between loads (None: nothing was reloaded)."""

    within: float | None
    within_df: int
    between: float | None
    between_df: int
    reloaded: int  # configs with two or more loads behind the between-load estimate

    @property
    def between_share(self) -> float | None:
        """The between-load part of a single run's variance (between / (between + within))."""
        if self.between is None or self.within is None or self.between + self.within <= 0:
            return None
        return self.between / (self.between + self.within)


@dataclass(frozen=True)
class Interval:
    """A config's mean (of its load means) with a 95% interval from within- and between-load noise."""

    mean: float
    low: float | None
    high: float | None
    rel_var: float | None  # relative variance of the mean (var / mean^2); None: no noise known
    df: float | None
    loads: int
    runs: int
    one_load: bool  # rests on one load: its between-load part is borrowed from other configs, or missing
    between_known: bool  # the between-load component is in the interval (estimated from some reloaded config)

    @property
    def half_width_share(self) -> float | None:
        return None if self.high is None else (self.high - self.mean) / self.mean if self.mean else None


def _clean(by_load: ByLoad) -> list[list[float]]:
    return [[float(v) for v in load] for load in by_load if load]


def components(configs: Iterable[ByLoad]) -> Components:
    """Pooled within- and between-load relative variances over every config's values by load."""
    ss_within, df_within = 0.0, 0
    ss_between, df_between, n0_weighted = 0.0, 0, 0.0
    reloaded = 0
    groups = [loads for c in configs if (loads := _clean(c))]
    for loads in groups:
        flat = [v for load in loads for v in load]
        grand = sum(flat) / len(flat)
        if grand <= 0:
            continue
        rel = [[v / grand for v in load] for load in loads]
        for load in rel:
            if len(load) >= 2:
                m = sum(load) / len(load)
                ss_within += sum((v - m) ** 2 for v in load)
                df_within += len(load) - 1
        if len(rel) >= 2:
            n = [len(load) for load in rel]
            total = sum(n)
            means = [sum(load) / len(load) for load in rel]
            overall = sum(len(load) * m for load, m in zip(rel, means, strict=True)) / total
            ss_between += sum(k * (m - overall) ** 2 for k, m in zip(n, means, strict=True))
            df_between += len(rel) - 1
            n0_weighted += (total - sum(k * k for k in n) / total)  # (L - 1) x n0 of this config
            reloaded += 1
    within = ss_within / df_within if df_within else None
    between = None
    if df_between:
        ms_between = ss_between / df_between
        n0 = n0_weighted / df_between
        between = max(0.0, (ms_between - (within or 0.0)) / n0) if n0 > 0 else 0.0
    return Components(within, df_within, between, df_between, reloaded)


def _parts(loads: list[list[float]], comp: Components) -> tuple[float, float]:
    """The relative variance of a config's mean of load means, as (between part, within part)."""
    count = len(loads)
    between = (comp.between or 0.0) / count
    within = sum((comp.within or 0.0) / len(load) for load in loads) / count**2
    return between, within


def _df(parts: Sequence[tuple[float, int]]) -> float | None:
    """Welch-Satterthwaite degrees of freedom of a sum of variance parts, each with its own degrees of freedom."""
    total = sum(p for p, _ in parts)
    denominator = sum(p * p / df for p, df in parts if p > 0 and df > 0)
    if total <= 0 or denominator <= 0:
        return None
    return total * total / denominator


def interval(by_load: ByLoad, comp: Components, confidence: float = CONFIDENCE) -> Interval | None:
    """The mean of load means and its interval at the pooled components (None when there are no values)."""
    loads = _clean(by_load)
    if not loads:
        return None
    mean = sum(sum(load) / len(load) for load in loads) / len(loads)
    runs = sum(len(load) for load in loads)
    between_known = comp.between is not None
    if comp.within is None and not between_known:
        return Interval(mean, None, None, None, None, len(loads), runs, len(loads) < 2, False)
    b, w = _parts(loads, comp)
    rel_var = b + w
    df = _df([(b, comp.between_df), (w, comp.within_df)])
    if df is None or rel_var <= 0:
        return Interval(mean, mean, mean, 0.0, df, len(loads), runs, len(loads) < 2, between_known)
    half = t_quantile((1 + confidence) / 2, df) * math.sqrt(rel_var) * mean
    return Interval(mean, mean - half, mean + half, rel_var, df, len(loads), runs, len(loads) < 2, between_known)


def ratio(a: ByLoad, b: ByLoad, comp: Components, confidence: float = CONFIDENCE) -> Ratio | None:
    """a's mean over b's, with the 95% interval of their log ratio at the pooled components (delta method, as
    bench.metrics.ratio, with within- and between-load variance)."""
    la, lb = _clean(a), _clean(b)
    if not la or not lb:
        return None
    ma = sum(sum(x) / len(x) for x in la) / len(la)
    mb = sum(sum(x) / len(x) for x in lb) / len(lb)
    if ma <= 0 or mb <= 0:
        return None
    value = ma / mb
    if comp.within is None and comp.between is None:
        return Ratio(value, None, None)
    ba, wa = _parts(la, comp)
    bb, wb = _parts(lb, comp)
    var = ba + wa + bb + wb
    df = _df([(ba + bb, comp.between_df), (wa + wb, comp.within_df)])
    if var <= 0 or df is None:  # no spread measured on either side: not an interval (identical repeats)
        return Ratio(value, value, value, identical=True)
    half = t_quantile((1 + confidence) / 2, df) * math.sqrt(var)
    return Ratio(value, value * math.exp(-half), value * math.exp(half))
