"""The search behind `sparklab tune` (pure, no I/O): which (method, K) to load next, and when to stop.

Every decision is a function of what has been measured so far (`Observations`), so a tune that stops anywhere
resumes by asking again: `decide(space, settings, observations)` gives the same next step.

The model. For a drafter whose proposals do not depend on K (a chain: n-gram lookup, a draft model, EAGLE,
MTP), position i's draft token is the same at every K >= i, so vLLM's per-position acceptance rates measured
at the largest K give the acceptance length at any smaller K: AL(K) = 1 + p_1 + … + p_K (p_i: the share of
drafts whose token i was accepted, counted only when 1..i-1 were). Each verify step costs s(K) = AL(K) / tok/s
(time per step, in the objective's unit), linear in K: fitted through the measured K values of the method,
with the no-drafting baseline as K = 0 (one token per step) while only one K of the method is measured. So
tok/s(K) = AL(K) / s(K) for every K, at each concurrency on its own.

The search, per concurrency, for the objective (higher is better; a TTFT bound makes a config ineligible):
1. probe: the baseline, every chain drafter at its largest K, every other drafter (block drafters such as
   DFlash/DSpark, whose block may change with K, and unknown methods) at its smallest, middle and largest K;
2. predict every K of each chain drafter; load the predicted best K if it could be within `tolerance` of the
   best measured config; a measured K that its prediction missed by more than `tolerance` makes the method
   "measured only" from then on;
3. measured-only methods: halve the K interval around the best measured K (a bisection over the list of K,
   assuming tok/s is unimodal in K) while the method is within `tolerance` of the best;
4. confirm: the best measured config and every config it cannot be told apart from (the 95% interval of the
   ratio of their means holds 1.0) get repeats up to `max_repeats`; if they still cannot be told apart, the
   smallest K among them wins (no drafting counts as K = 0).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sparklab.metrics import Estimate, estimate, ratio

# Drafters whose draft token at position i does not depend on K (vLLM method names).
CHAIN_DRAFTERS = frozenset({"ngram", "draft_model", "eagle", "eagle3", "mtp", "medusa"})
OBJECTIVES = ("aggregate", "per-request", "decode")
BASELINE_ANCHOR = "baseline as K=0"

Config = tuple[str, "int | None"]  # (method, K); K is None for a method that does not draft


def label(config: Config) -> str:
    method, k = config
    return method if k is None else f"{method} K={k}"


def _k(config: Config) -> int:
    return config[1] or 0


@dataclass(frozen=True)
class CellObs:
    """One config at one concurrency: a value of the objective per finished repeat, and what the server said."""

    values: tuple[float, ...] = ()
    ttft_ms: tuple[float, ...] = ()  # median TTFT of each repeat
    per_position: tuple[float, ...] = ()  # mean over repeats of the share accepted at each draft position
    acceptance_length: float | None = None  # mean over repeats, from the server's counters
    settled: int = 0  # repeats that will not run again (done, or failed after their attempts)

    @property
    def failed(self) -> bool:
        return self.settled > 0 and not self.values


Observations = Mapping[Config, Mapping[int, CellObs]]


@dataclass(frozen=True)
class Space:
    methods: tuple[str, ...]
    ks: tuple[int, ...]
    concurrencies: tuple[int, ...]
    drafting: Mapping[str, bool]  # whether a method uses K at all (the baseline does not)

    def configs(self, method: str) -> list[Config]:
        return [(method, k) for k in self.ks] if self.drafting[method] else [(method, None)]


@dataclass(frozen=True)
class Settings:
    repeats: int = 2
    max_repeats: int = 2
    tolerance: float = 0.15  # a prediction this far off (relative) stops the method being predicted
    ttft_max_ms: float | None = None


@dataclass(frozen=True)
class Prediction:
    config: Config
    concurrency: int
    value: float
    acceptance_length: float
    basis: str  # which measured K values the step cost was fitted through


@dataclass(frozen=True)
class Pick:
    concurrency: int
    config: Config
    estimate: Estimate
    best_mean: Config  # the config with the highest mean (the pick unless a smaller K ties with it)
    overlapping: tuple[Config, ...]  # configs whose 95% interval overlaps the best's
    note: str


@dataclass(frozen=True)
class Measure:
    configs: tuple[Config, ...]
    repeats: int
    why: str


@dataclass(frozen=True)
class Done:
    picks: tuple[Pick, ...]
    notes: tuple[str, ...] = ()


@dataclass
class _State:
    space: Space
    settings: Settings
    obs: Observations
    notes: list[str] = field(default_factory=list)

    def cell(self, config: Config, c: int) -> CellObs:
        return self.obs.get(config, {}).get(c, CellObs())

    def settled(self, config: Config, repeats: int) -> bool:
        return all(self.cell(config, c).settled >= repeats for c in self.space.concurrencies)

    def dead(self, config: Config) -> bool:
        """Failed at every concurrency (the server did not start, or no request succeeded)."""
        return all(self.cell(config, c).failed for c in self.space.concurrencies)

    def eligible(self, config: Config, c: int) -> Estimate | None:
        cell = self.cell(config, c)
        if not cell.values:
            return None
        bound = self.settings.ttft_max_ms
        if bound is not None and (not cell.ttft_ms or sum(cell.ttft_ms) / len(cell.ttft_ms) > bound):
            return None
        return estimate(cell.values)

    def leader(self, c: int) -> tuple[Config, float] | None:
        """The measured config with the highest mean at c, and that mean."""
        means = [(config, e.mean) for config in self.obs if (e := self.eligible(config, c)) is not None]
        return max(means, key=lambda m: m[1]) if means else None

    def incumbent(self, c: int) -> float | None:
        leader = self.leader(c)
        return leader[1] if leader else None


def acceptance_length(per_position: Iterable[float], k: int) -> float:
    """1 + the expected accepted drafts at K, from the per-position rates measured at a K >= this K."""
    rates = list(per_position)[:k]
    return 1.0 + sum(rates)


def _fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares line s = a + b K through (K, s) points; None with fewer than two distinct K."""
    if len({k for k, _ in points}) < 2:
        return None
    n = len(points)
    mk, ms = sum(k for k, _ in points) / n, sum(s for _, s in points) / n
    b = sum((k - mk) * (s - ms) for k, s in points) / sum((k - mk) ** 2 for k, _ in points)
    return ms - b * mk, b


def _probe(state: _State, method: str) -> Config | None:
    """The largest K of a chain drafter whose server did not fail: its per-position rates cover every K below."""
    for k in sorted(state.space.ks, reverse=True):
        if not state.dead((method, k)):
            return method, k
    return None


def _baseline_cost(state: _State, c: int) -> float | None:
    for method in state.space.methods:
        if not state.space.drafting[method]:
            cell = state.cell((method, None), c)
            if cell.values:
                return 1.0 / (sum(cell.values) / len(cell.values))
    return None


def predict(state: _State, method: str, c: int, leave_out: int | None = None) -> dict[int, Prediction]:
    """tok/s of every K of a chain drafter at concurrency c, from the probe's per-position rates and a step cost
    fitted through the measured K values (leave_out: predict that K as if it had not been measured)."""
    probe = _probe(state, method)
    if probe is None or probe[1] == leave_out:
        return {}
    rates = state.cell(probe, c).per_position
    if not rates:
        return {}
    points: list[tuple[float, float]] = []
    used = []
    for k in state.space.ks:
        cell = state.cell((method, k), c)
        if k == leave_out or not cell.values:
            continue
        al = cell.acceptance_length or acceptance_length(rates, k)
        points.append((k, al / (sum(cell.values) / len(cell.values))))
        used.append(f"K={k}")
    if len(points) < 2 and (base := _baseline_cost(state, c)) is not None:
        points.append((0, base))
        used.append(BASELINE_ANCHOR)
    line = _fit(points)
    if line is None:
        return {}
    a, b = line
    out = {}
    for k in state.space.ks:
        if k > (probe[1] or 0):
            continue
        cost = a + b * k
        al = acceptance_length(rates, k)
        if cost > 0:
            out[k] = Prediction((method, k), c, al / cost, al, "step cost through " + ", ".join(used))
    return out


def _errors(state: _State, method: str) -> list[tuple[float, int, int, float, float]]:
    """(relative error, K, C, predicted, measured) of each measured K other than the probe, predicted without it
    from two or more other measured K values (a prediction leaning on the baseline as K = 0 is only what picks
    the second K, which is measured whatever it says)."""
    probe = _probe(state, method)
    out = []
    for k in state.space.ks:
        if probe is None or k == probe[1]:
            continue
        for c in state.space.concurrencies:
            cell = state.cell((method, k), c)
            if not cell.values:
                continue
            guess = predict(state, method, c, leave_out=k).get(k)
            if guess is not None and BASELINE_ANCHOR not in guess.basis:
                measured = sum(cell.values) / len(cell.values)
                out.append((guess.value / measured - 1, k, c, guess.value, measured))
    return out


def _mispredicted(state: _State, method: str) -> str | None:
    """Why the method's predictions cannot be trusted: a measured K (other than the probe) its leave-one-out
    prediction missed by more than the tolerance at some concurrency."""
    for error, k, c, guess, measured in _errors(state, method):
        if abs(error) > state.settings.tolerance:
            return (f"{method}: predicted {guess:.3g} at K={k} C={c}, measured {measured:.3g} "
                    f"({error:+.0%}, tolerance {state.settings.tolerance:.0%}): measured, not predicted")
    return None


def _measured_ks(state: _State, method: str) -> set[int]:
    return {k for k in state.space.ks for c in state.space.concurrencies if state.cell((method, k), c).values}


def _margin(state: _State, method: str) -> float:
    """How far below the best measured value a prediction may be and still be loaded: the largest error a
    two-point prediction of this method has made; none yet: 0 (the line through two measured K is believed)."""
    errors = [abs(e[0]) for e in _errors(state, method)]
    return max(errors) if errors else 0.0


def _role(state: _State, method: str) -> str:
    if not state.space.drafting[method]:
        return "baseline"
    if method in CHAIN_DRAFTERS and _mispredicted(state, method) is None:
        return "chain"
    return "measured"


def _probes(state: _State) -> list[Config]:
    wanted: list[Config] = []
    have_baseline = any(not state.space.drafting[m] for m in state.space.methods)
    for method in state.space.methods:
        role = "baseline" if not state.space.drafting[method] else (
            "chain" if method in CHAIN_DRAFTERS else "measured")
        if role == "baseline":
            wanted.append((method, None))
        elif role == "chain":
            probe = _probe(state, method)
            if probe is not None:
                wanted.append(probe)
            if not have_baseline and len(state.space.ks) > 1:  # a second K for the step cost
                wanted.append((method, min(state.space.ks)))
        else:
            ks = sorted(state.space.ks)
            wanted += [(method, k) for k in dict.fromkeys([ks[0], ks[len(ks) // 2], ks[-1]])]
    return wanted


def _competitive(state: _State, value: float | None, c: int, margin: float | None = None) -> bool:
    best = state.incumbent(c)
    margin = state.settings.tolerance if margin is None else margin
    return value is not None and (best is None or value >= best * (1 - margin))


def _promising_predictions(state: _State, method: str) -> list[Config]:
    out = []
    margin = _margin(state, method)
    probe = _probe(state, method)
    others = sorted(k for k in state.space.ks if probe is not None and k < probe[1] and not state.dead((method, k)))
    if probe is not None and others and len(_measured_ks(state, method)) < 2:
        # The second point of the step-cost line: the smallest K (the farthest from the probe, so the line
        # interpolates), loaded when the probe or a prediction leaning on the baseline as K = 0 competes.
        for c in state.space.concurrencies:
            guesses = predict(state, method, c)
            probe_value = (e.mean if (e := state.eligible(probe, c)) else None)
            top = max((p.value for p in guesses.values()), default=None)
            if _competitive(state, probe_value, c) or _competitive(state, top, c):
                return [(method, others[0])]
        return []
    for c in state.space.concurrencies:
        guesses = predict(state, method, c)
        unmeasured = [p for k, p in guesses.items() if state.cell((method, k), c).settled == 0]
        if not unmeasured:
            continue
        top = max(unmeasured, key=lambda p: p.value)
        leader = state.leader(c)
        if leader is not None and top.value <= leader[1] and _k(top.config) >= _k(leader[0]):
            continue  # at best a tie with a smaller K, which wins ties
        if _competitive(state, top.value, c, margin) and not state.dead(top.config):
            out.append(top.config)
    return out


def _bisect(state: _State, method: str) -> list[Config]:
    """Measured-only methods, where they compete: halve the gap between the best measured K and its measured
    neighbour on the better side (then the other side), until both neighbours of the best are measured."""
    ks = sorted(state.space.ks)
    out = []
    for c in state.space.concurrencies:
        measured = {k: e.mean for k in ks if (e := state.eligible((method, k), c)) is not None}
        if not measured:
            continue
        best = max(measured, key=lambda k: measured[k])
        if not _competitive(state, measured[best], c):
            continue
        tried = {k for k in ks if state.cell((method, k), c).settled > 0}
        i = ks.index(best)
        below = [j for j, k in enumerate(ks) if k in tried and j < i]
        above = [j for j, k in enumerate(ks) if k in tried and j > i]
        low, high = (below[-1] if below else -1), (above[0] if above else len(ks))
        sides = [(low, i), (i, high)]
        lower_value = measured.get(ks[low], -math.inf) if below else -math.inf
        higher = measured.get(ks[high], -math.inf) if above else -math.inf
        for lo, hi in (sides if lower_value >= higher else sides[::-1]):
            gap = [j for j in range(lo + 1, hi) if ks[j] not in tried]
            if gap:
                out.append((method, ks[gap[len(gap) // 2]]))
                break
    return out


SINGLE_RUN_TIE = 0.01  # single runs have no interval: within 1% of each other they count as overlapping


def _overlap(a: Estimate, b: Estimate) -> bool:
    """Whether two configs' measurements do not tell them apart: the 95% interval of the ratio of their means
    (Welch, as the report's speed-ups) holds 1.0; for single runs, means within 1% of each other."""
    interval = ratio(a, b)
    if interval is None or interval.significant is None:
        return abs(a.mean - b.mean) <= SINGLE_RUN_TIE * max(a.mean, b.mean)
    return not interval.significant


def _confirm(state: _State) -> tuple[list[Config], list[Pick]]:
    """Per concurrency: the best mean, the configs that overlap it; more repeats for them, or the pick."""
    more: list[Config] = []
    picks = []
    for c in state.space.concurrencies:
        scored = [(config, e) for config in state.obs if (e := state.eligible(config, c)) is not None]
        if not scored:
            continue
        best, best_e = max(scored, key=lambda s: s[1].mean)
        close = [(config, e) for config, e in scored if config != best and _overlap(e, best_e)]
        short = [config for config, _ in [(best, best_e), *close]
                 if state.cell(config, c).settled < state.settings.max_repeats and not state.dead(config)]
        if close and short:
            more += short
            continue
        config, chosen = min([(best, best_e), *close], key=lambda s: (_k(s[0]), -s[1].mean))
        if not close and best_e.low is None:
            note = f"the highest of {len(scored)} measured, single runs (no interval: run with --repeats 2 or more)"
        elif not close:
            note = (f"faster than each of the other {len(scored) - 1} measured configs: the 95% interval of the "
                    "ratio excludes 1")
        elif best_e.low is None:
            note = (f"single runs within {SINGLE_RUN_TIE:.0%} of {', '.join(label(x) for x, _ in close)} (no "
                    "interval): the smallest K among them")
        elif config == best:
            note = (f"not told apart from {', '.join(label(x) for x, _ in close)} after {best_e.n} repeats; "
                    "it has the smallest K among them")
        else:
            note = (f"{label(best)} has the highest mean, but after {best_e.n} repeats the 95% interval of their "
                    "ratio holds 1: the smaller K is chosen")
        picks.append(Pick(c, config, chosen, best, tuple(x for x, _ in close), note))
    return more, picks


def decide(space: Space, settings: Settings, obs: Observations) -> Measure | Done:
    """The next configs to load (with how many repeats), or the picks when nothing left could change them."""
    state = _State(space, settings, obs)
    probes = [config for config in _probes(state) if not state.settled(config, settings.repeats)]
    if probes:
        return Measure(tuple(dict.fromkeys(probes)), settings.repeats, "probe")
    wanted: list[Config] = []
    for method in space.methods:
        role = _role(state, method)
        if role == "chain":
            wanted += _promising_predictions(state, method)
        elif role == "measured":
            wanted += _bisect(state, method)
    wanted = [config for config in dict.fromkeys(wanted) if not state.settled(config, settings.repeats)]
    if wanted:
        return Measure(tuple(wanted), settings.repeats, "predicted or bracketed to compete with the best")
    more, picks = _confirm(state)
    if more:
        return Measure(tuple(dict.fromkeys(more)), settings.max_repeats, "95% intervals overlap the best")
    notes = [reason for method in space.methods if (reason := _mispredicted(state, method))
             and method in CHAIN_DRAFTERS]
    return Done(tuple(picks), tuple(notes))


def predictions(space: Space, settings: Settings, obs: Observations) -> list[tuple[Prediction, float | None]]:
    """Every chain drafter's predicted objective per (K, concurrency), with the measured mean where there is
    one. A measured K's prediction is made without it (leave one out), as it was before it was loaded."""
    state = _State(space, settings, obs)
    out = []
    for method in space.methods:
        if not space.drafting[method] or method not in CHAIN_DRAFTERS:
            continue
        probe = _probe(state, method)
        for c in space.concurrencies:
            for k in space.ks:
                cell = state.cell((method, k), c)
                measured = sum(cell.values) / len(cell.values) if cell.values else None
                guess = (predict(state, method, c, leave_out=k) if measured is not None
                         else predict(state, method, c)).get(k)
                if guess is not None and (probe is None or k != probe[1]):
                    out.append((guess, measured))
    return out


def k_schedule(picks: Iterable[Pick]) -> tuple[str, list[tuple[int, int, int]]] | None:
    """One drafting method's K per batch-size range (vLLM's num_speculative_tokens_per_batch_size), when the
    picks use at most one drafting method; no drafting at a concurrency is K = 0 there. None otherwise."""
    ordered = sorted(picks, key=lambda p: p.concurrency)
    drafting = {p.config[0] for p in ordered if p.config[1] is not None}
    if len(drafting) != 1 or len(ordered) < 2:
        return None
    schedule, start = [], 1
    for i, pick in enumerate(ordered):
        end = pick.concurrency if i < len(ordered) - 1 else max(pick.concurrency, 1024)
        schedule.append((start, end, _k(pick.config)))
        start = end + 1
    if len({k for _, _, k in schedule}) < 2:
        return None  # one K everywhere: a plain --num-speculative-tokens says it
    return drafting.pop(), schedule


def prediction_error(pairs: Iterable[tuple[float, float]]) -> float | None:
    """Mean absolute relative error of predicted against measured values."""
    errors = [abs(p / m - 1) for p, m in pairs if m > 0 and math.isfinite(p)]
    return sum(errors) / len(errors) if errors else None
