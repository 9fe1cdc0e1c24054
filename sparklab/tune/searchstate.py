"""What `sparklab tune` searches over and what it has seen (pure): the space, the settings, the observations per
(method, K) and concurrency, and the decisions it hands the driver (loads to run, or the picks).

Observations keep which server load each repeat ran on, so noise is split into within one load and between loads
(sparklab.bench.noise) wherever the search or its verdict compares two configs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from sparklab.bench import noise
from sparklab.bench import slo as slos
from sparklab.bench.metrics import Estimate, Ratio

OBJECTIVES = ("aggregate", "per-request", "decode")
EXPLORE = ("search", "grid")
SINGLE_RUN_TIE = 0.01  # single runs have no interval: within 1% of each other they count as overlapping
# A tie-break (the budget spent, the best not told apart from some configs) takes the smallest K only among those
# whose mean is within this share of the best's: a config measured well below the best but inside its wide interval
# is not a tie in any sense an owner would accept (scripts/bench_verdict_flips.py measured what the plain
# smallest-K rule costs: picks at 81-88% of the true best's speed on average at 12% between-load noise).
TIE_MARGIN = 0.03

Config = tuple[str, "int | None"]  # (method, K); K is None for a method that does not draft


def label(config: Config) -> str:
    method, k = config
    return method if k is None else f"{method} K={k}"


def k_of(config: Config) -> int:
    return config[1] or 0


@dataclass(frozen=True)
class CellObs:
    """One config at one concurrency: a value of the objective per finished repeat, and what the server said."""

    values: tuple[float, ...] = ()
    ttft_ms: tuple[float, ...] = ()  # median TTFT of each repeat
    per_position: tuple[float, ...] = ()  # mean over repeats of the share accepted at each draft position
    acceptance_length: float | None = None  # mean over repeats, from the server's counters
    settled: int = 0  # repeats that will not run again (done, or failed after their attempts)
    # the server load each value ran on, parallel to values; ids sort in load order; () or "" : one unknown load
    loads: tuple[str, ...] = ()
    slo: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # per SLO statistic (Term.key), per repeat
    changed: str | None = None  # its answers differ from the baseline's at temperature 0 (how): never eligible

    @property
    def failed(self) -> bool:
        return self.settled > 0 and not self.values

    def by_load(self) -> list[list[float]]:
        """The values grouped by load, in load order."""
        if len(self.loads) != len(self.values):
            return [list(self.values)] if self.values else []
        groups: dict[str, list[float]] = {}
        for load, value in sorted(zip(self.loads, self.values, strict=True), key=lambda p: p[0]):
            groups.setdefault(load, []).append(value)
        return list(groups.values())

    @property
    def load_count(self) -> int:
        return len(self.by_load())

    @property
    def last_load(self) -> str:
        return max(self.loads, default="")


Observations = Mapping[Config, Mapping[int, CellObs]]


@dataclass(frozen=True)
class Space:
    methods: tuple[str, ...]
    ks: tuple[int, ...]
    concurrencies: tuple[int, ...]
    drafting: Mapping[str, bool]  # whether a method uses K at all (the baseline does not)

    def configs(self, method: str) -> list[Config]:
        return [(method, k) for k in self.ks] if self.drafting[method] else [(method, None)]

    def every(self) -> list[Config]:
        return [config for method in self.methods for config in self.configs(method)]


@dataclass(frozen=True)
class Settings:
    repeats: int = 2  # runs per load
    # runs per config and concurrency over all its loads: the budget for telling the best from a contender (a load
    # adds `repeats` runs, so at most max_repeats // repeats loads); equal to repeats: one load, no reloads
    max_repeats: int = 2
    tolerance: float = 0.15  # measured acceptance this far off its prediction: the drafter is measured, not predicted
    ttft_max_ms: float | None = None
    slo: str | None = None  # "tpot_p90<=50ms,ttft_p90<=500ms" (sparklab.bench.slo)
    explore: str = "search"  # "grid": every config first (the full grid), then the same verdict rules

    @property
    def max_loads(self) -> int:
        """Loads per config and concurrency: the first, and reloads of `repeats` runs (the last one shorter when
        max_repeats is not a multiple of repeats)."""
        return max(1, math.ceil(self.max_repeats / self.repeats))

    @property
    def terms(self) -> tuple[slos.Term, ...]:
        return slos.parse(self.slo)

    def budget(self) -> str:
        if self.max_loads < 2:
            return (f"one load of {self.repeats} run(s) per config (--max-repeats {self.max_repeats}): no reload, "
                    "so every verdict rests on one load")
        return (f"each config at most {self.max_loads} loads of {self.repeats} run(s) per concurrency "
                f"(--max-repeats {self.max_repeats})")


@dataclass(frozen=True)
class Prediction:
    config: Config
    concurrency: int
    value: float
    acceptance_length: float
    basis: str  # how the step cost at K was had: between which measured K (or the baseline as K = 0)


@dataclass(frozen=True)
class Load:
    """Start one server of this config and run its cells at these concurrencies up to a repeat index (exclusive)."""

    config: Config
    upto: tuple[tuple[int, int], ...]  # (concurrency, cells with repeat index below this)


@dataclass(frozen=True)
class Measure:
    loads: tuple[Load, ...]  # run in this order (a reload pair alternates: A B, then B A)
    why: str
    notes: tuple[str, ...] = ()  # why a drafter is measured, not predicted (said once it is known)

    @property
    def configs(self) -> tuple[Config, ...]:
        return tuple(dict.fromkeys(load.config for load in self.loads))

    @property
    def repeats(self) -> int:
        return max((n for load in self.loads for _, n in load.upto), default=0)


@dataclass(frozen=True)
class Pick:
    concurrency: int
    config: Config
    estimate: noise.Interval | Estimate
    best_mean: Config  # the config with the highest mean (the pick unless a tie-break chose another)
    overlapping: tuple[Config, ...]  # configs not told apart from the best
    note: str
    tie_break: bool = False  # chosen after the budget ran out, not by a measured difference (smaller K within 3%)
    runner_up: Config | None = None
    versus_runner_up: Ratio | None = None  # the pick over the runner-up, within- and between-load noise
    one_load: bool = False  # the pick or its runner-up rests on one load
    best_runner_up: Config | None = None  # the best's own runner-up (the verdict rests on both; runner_up differs
    # from it when a tie-break chose another config than the best)


@dataclass(frozen=True)
class SloReach:
    """The highest concurrency of the space where some config meets the SLO, with the fastest such config."""

    concurrency: int
    config: Config
    value: float


@dataclass(frozen=True)
class Done:
    picks: tuple[Pick, ...]
    notes: tuple[str, ...] = ()
    slo_reach: SloReach | None = None
    slo_missed: tuple[int, ...] = ()  # concurrencies where no measured config meets the SLO


@dataclass
class State:
    space: Space
    settings: Settings
    obs: Observations

    def cell(self, config: Config, c: int) -> CellObs:
        return self.obs.get(config, {}).get(c, CellObs())

    def settled(self, config: Config, repeats: int) -> bool:
        return all(self.cell(config, c).settled >= repeats for c in self.space.concurrencies)

    def dead(self, config: Config) -> bool:
        """Failed at every concurrency (the server did not start, or no request succeeded)."""
        return all(self.cell(config, c).failed for c in self.space.concurrencies)

    def noise_at(self, c: int) -> noise.Components:
        """Within- and between-load noise pooled over the configs measured at c (none there yet: over every c)."""
        here = noise.components(cell.by_load() for by_c in self.obs.values() if (cell := by_c.get(c)))
        if here.within is not None or here.between is not None:
            return here
        return noise.components(cell.by_load() for by_c in self.obs.values() for cell in by_c.values())

    def interval(self, config: Config, c: int) -> noise.Interval | None:
        return noise.interval(self.cell(config, c).by_load(), self.noise_at(c))

    def meets_slo(self, config: Config, c: int) -> bool:
        terms = self.settings.terms
        return not terms or slos.judge(self.cell(config, c).slo, terms)[0]

    def eligible(self, config: Config, c: int) -> noise.Interval | None:
        """The config's interval at c, or None when it has no value there, misses the TTFT bound or the SLO, or
        its answers are not the target's (they differ from the baseline's at temperature 0)."""
        cell = self.cell(config, c)
        if not cell.values or cell.changed:
            return None
        bound = self.settings.ttft_max_ms
        if bound is not None and (not cell.ttft_ms or sum(cell.ttft_ms) / len(cell.ttft_ms) > bound):
            return None
        if not self.meets_slo(config, c):
            return None
        return self.interval(config, c)

    def leader(self, c: int) -> tuple[Config, float] | None:
        """The measured config with the highest mean at c, and that mean."""
        means = [(config, e.mean) for config in self.obs if (e := self.eligible(config, c)) is not None]
        return max(means, key=lambda m: m[1]) if means else None

    def incumbent(self, c: int) -> float | None:
        leader = self.leader(c)
        return leader[1] if leader else None

    def told_apart(self, a: Config, b: Config, c: int) -> Ratio | None:
        """a over b at c with within- and between-load noise; None when either has no value."""
        return noise.ratio(self.cell(a, c).by_load(), self.cell(b, c).by_load(), self.noise_at(c))


def not_told_apart(r: Ratio | None) -> bool:
    """The 95% interval of the ratio holds 1.0; for single runs, means within 1% of each other; for identical
    repeats on both sides (no spread measured, a scripted or deterministic engine), only equal means."""
    if r is None:
        return False
    if r.identical:
        return r.value == 1.0
    if r.low is None or r.high is None:
        return abs(r.value - 1) <= SINGLE_RUN_TIE * max(r.value, 1.0)
    return r.low <= 1.0 <= r.high


def mean(values: tuple[float, ...] | list[float]) -> float:
    return sum(values) / len(values) if values else math.nan
