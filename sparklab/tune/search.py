"""The search behind `sparklab tune` (pure, no I/O): which (method, K) to load next, and when to stop.

Every decision is a function of what has been measured so far (`Observations`), so a tune that stops anywhere
resumes by asking again: `decide(space, settings, observations)` gives the same next step.

The model (sparklab.tune.prediction). For a drafter whose proposals do not depend on K (a chain: n-gram lookup, a
draft model, EAGLE, MTP), position i's draft token is the same at every K >= i, so vLLM's per-position acceptance
rates give the acceptance length at any K up to the largest: AL(K) = 1 + p_1 + … + p_K (p_i: the share of drafts
whose first i tokens were accepted), each p_i pooled over every loaded K >= i. Each verify step costs
s(K) = AL(K) / tok/s (time per step, in the objective's unit), measured at each loaded K and interpolated between
them (piecewise linear: a real engine's step cost is not a straight line in K), with the no-drafting baseline as
K = 0 (one token per step) while only one K of the method is measured. So tok/s(K) = AL(K) / s(K) for every K, at
each concurrency on its own. Whether a drafter's proposals depend on K is checked, not assumed: when a loaded K's
measured acceptance length misses AL(K) by more than `tolerance` (a block drafter such as DFlash/DSpark may
draft a different block per K), the drafter switches to measured mode and the search says so.

The search, per concurrency, for the objective (higher is better; a TTFT bound or an SLO makes a config
ineligible):
1. probe: the baseline and every drafter at its largest K (`explore: grid`: every config of the space instead);
2. second point: every drafter that could match the best (through the baseline as K = 0) at its smallest K,
   which checks the predicted acceptance and gives the step cost a second measured K;
3. predicted drafters: load the K with the highest prediction when it beats the best measured config by more
   than the run-to-run noise allows, by more than the prediction's own error (the method's leave-one-out error
   at the K already loaded), or by more than a tie (3%): a wide interval of the best never drops a predicted gain
   larger than a tie; every loaded K pins the step cost there and the rest is predicted again;
   measured mode: halve the K interval around the best measured K (ends first, then the half around the best,
   assuming tok/s is unimodal in K) while the method is within `tolerance` of the best;
4. the verdict (sparklab.tune.verdict): the best and its runner-up are reloaded (ABBA), and a contender the best
   cannot be told from gets reloads with it until they can be told apart or the budget runs out; only then a
   tie-break (the smaller K within 3% of the best's mean, else the best), which the pick says.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sparklab.bench.metrics import estimate
from sparklab.tune.prediction import (
    acceptance_length,
    predict,
    prediction_error,
    prediction_error_of,
    predictions,
)
from sparklab.tune.prediction import probe_of as _probe
from sparklab.tune.searchstate import (
    EXPLORE,
    OBJECTIVES,
    SINGLE_RUN_TIE,
    TIE_MARGIN,
    CellObs,
    Config,
    Done,
    Load,
    Measure,
    Observations,
    Pick,
    Prediction,
    Settings,
    SloReach,
    Space,
    State,
    label,
)
from sparklab.tune.searchstate import mean as _mean
from sparklab.tune.verdict import K0_WHY, confirm, k_schedule, schedule_verdict, slo_reach

__all__ = ["EXPLORE", "K0_WHY", "OBJECTIVES", "SINGLE_RUN_TIE", "TIE_MARGIN", "CellObs", "Config", "Done", "Load",
           "Measure", "Observations", "Pick", "Prediction", "Settings", "SloReach", "Space", "acceptance_length",
           "decide", "estimate", "k_schedule", "label", "pooled_noise", "predict", "prediction_error",
           "prediction_error_of", "predictions", "schedule_verdict"]

_State = State


def _why_measured(state: _State, method: str) -> str | None:
    """Why a drafter's tok/s cannot be predicted from its probe: the server reported no per-position acceptance,
    or a smaller K's measured acceptance length missed what the probe's rates predict for it by more than the
    tolerance (its drafts depend on K, as a block drafter's such as DFlash/DSpark may). None: predicted."""
    probe = _probe(state, method)
    if probe is None:
        return None
    measured_probe = [c for c in state.space.concurrencies if state.cell(probe, c).values]
    if measured_probe and not any(state.cell(probe, c).per_position for c in measured_probe):
        return (f"{method}: the server reported no per-position acceptance at K={probe[1]}, so no K can be "
                "predicted: measured mode (K tried ends first, then halving the interval around the best)")
    for k in sorted(state.space.ks):
        if k == probe[1]:
            continue
        for c in state.space.concurrencies:
            measured, rates = state.cell((method, k), c).acceptance_length, state.cell(probe, c).per_position
            if measured is None or not rates:
                continue
            expected = acceptance_length(rates, k)
            miss = measured / expected - 1
            if abs(miss) > state.settings.tolerance:
                return (f"{method}: acceptance length at K={k} C={c} measured {measured:.2f}, predicted {expected:.2f} "
                        f"from K={probe[1]}'s per-position rates ({miss:+.0%}, tolerance "
                        f"{state.settings.tolerance:.0%}): its drafts depend on K, so it switches to measured mode "
                        "(K tried ends first, then halving the interval around the best)")
    return None


def _role(state: _State, method: str) -> str:
    if not state.space.drafting[method]:
        return "baseline"
    return "measured" if _why_measured(state, method) else "predicted"


def pooled_noise(obs: Observations, c: int | None = None) -> tuple[float, int] | None:
    """Run-to-run noise pooled over every cell (at concurrency c, if given) with two or more repeats: the
    relative standard deviation (each value over its cell's mean) and its degrees of freedom. None before any
    such cell has a second repeat."""
    squares, df = 0.0, 0
    for by_c in obs.values():
        for at, cell in by_c.items():
            if len(cell.values) >= 2 and c in (None, at):
                mean = _mean(cell.values)
                squares += sum((v / mean - 1) ** 2 for v in cell.values)
                df += len(cell.values) - 1
    return (math.sqrt(squares / df), df) if df else None


def noise_margin(state: _State, c: int) -> float:
    """How much a new config's mean may differ from the best's by noise alone, as a fraction: the 95% half-width
    of the difference of two means (the best's runs and `repeats` new ones on one new load) at the within- and
    between-load noise pooled over the cells at c (none there yet: over every cell); no noise known: the
    single-run tie."""
    from sparklab.bench.metrics import t_quantile

    comp = state.noise_at(c)
    leader = state.leader(c)
    if leader is None or (comp.within is None and comp.between is None):
        return SINGLE_RUN_TIE
    best = state.interval(leader[0], c)
    best_var = best.rel_var if best is not None and best.rel_var is not None else 0.0
    new_var = (comp.between or 0.0) + (comp.within or 0.0) / state.settings.repeats
    df = max(1, comp.within_df + comp.between_df)
    return t_quantile(0.975, df) * math.sqrt(best_var + new_var)


def _beats(state: _State, value: float | None, c: int, error: float) -> bool:
    """A predicted value beats the best measured at c by more than the run-to-run noise allows, by more than its
    own error, or by more than the tie-break's margin (TIE_MARGIN, 3%): any one is enough (nothing measured: it
    does). A wide interval of the best or a large error never vetoes a predicted gain larger than a tie: that is a
    reason to measure, not to stop. Measured on simulated servers (scripts/bench_verdict_flips.py, 200 runs per
    profile, the CPU engine's noise and acceptance draws): with noise and error alone, tune stopped short of a
    K predicted 5% faster (ngram at C=1 kept its probe, K=8, 91 times in 200); with the tie margin as well it picks
    the true best more often on dspark, mtp and ngram (steep and deep: 398-400 of 400 either way), for 0.0-1.7
    more loads, measured together with pooled acceptance and the leave-one-out rule (README)."""
    best = state.incumbent(c)
    margin = min(noise_margin(state, c), error, TIE_MARGIN)
    return value is not None and (best is None or value > best * (1 + margin))


def _could_match(state: _State, value: float | None, c: int, margin: float) -> bool:
    best = state.incumbent(c)
    return value is not None and (best is None or value >= best * (1 - margin))


def _measured_ks(state: _State, method: str) -> set[int]:
    return {k for k in state.space.ks for c in state.space.concurrencies if state.cell((method, k), c).values}


def _probes(state: _State) -> list[Config]:
    """The baseline, and every drafter at its largest K (the one whose per-position rates cover every K)."""
    wanted: list[Config] = []
    for method in state.space.methods:
        if not state.space.drafting[method]:
            wanted.append((method, None))
        elif (probe := _probe(state, method)) is not None:
            wanted.append(probe)
    return wanted


def _second_point(state: _State, method: str) -> list[Config] | None:
    """A drafter's smallest K, the second point of its step cost (interpolating, not extrapolating) and the check
    of its predicted acceptance: loaded when the method could match the best at some concurrency (its
    predictions through the baseline as K = 0, or its probe within the tolerance when nothing can be
    predicted). [] when it could not; None once two K are measured or no other K is left."""
    probe = _probe(state, method)
    if probe is None or len(_measured_ks(state, method)) >= 2:
        return None
    others = sorted(k for k in state.space.ks if k < (probe[1] or 0) and not state.dead((method, k)))
    if not others:
        return None
    for c in state.space.concurrencies:
        probe_cell = state.cell(probe, c)
        guesses = predict(state, method, c)
        if guesses:
            top = max(p.value for p in guesses.values())
            if _could_match(state, top, c, noise_margin(state, c)):
                return [(method, others[0])]
        elif probe_cell.values and _could_match(state, _mean(probe_cell.values), c, state.settings.tolerance):
            return [(method, others[0])]
    return []


def _promising_predictions(state: _State, method: str) -> list[Config]:
    """Per concurrency, the unmeasured K with the highest prediction, if it beats the best measured config by more
    than the noise or by more than the prediction's own error: loaded however wide the best's interval is."""
    out = []
    for c in state.space.concurrencies:
        guesses = predict(state, method, c)
        unmeasured = [p for k, p in guesses.items()
                      if state.cell((method, k), c).settled == 0 and not state.dead((method, k))]
        if unmeasured:
            top = max(unmeasured, key=lambda p: p.value)
            if _beats(state, top.value, c, prediction_error_of(state, method, c)):
                out.append(top.config)
    return out


def _bisect(state: _State, method: str) -> list[Config]:
    """Measured mode, where the method competes (its best measured K within the tolerance of the best): halve
    the gap between the best measured K and its measured neighbour on the better side (then the other side),
    until both neighbours of the best are measured (assuming tok/s is unimodal in K)."""
    ks = sorted(state.space.ks)
    out: list[Config] = []
    for c in state.space.concurrencies:
        measured = {k: e.mean for k in ks if (e := state.eligible((method, k), c)) is not None}
        if not measured:
            continue
        best = max(measured, key=lambda k: measured[k])
        if not _could_match(state, measured[best], c, state.settings.tolerance):
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


def _first_loads(state: _State, configs: Iterable[Config]) -> tuple[Load, ...]:
    reps = state.settings.repeats
    return tuple(Load(config, tuple((c, reps) for c in state.space.concurrencies)) for config in configs)


def decide(space: Space, settings: Settings, obs: Observations) -> Measure | Done:
    """The next loads to run, or the picks when nothing left could change them."""
    state = _State(space, settings, obs)
    notes = tuple(reason for method in space.methods if (reason := _why_measured(state, method)))
    if settings.explore == "grid":
        grid = [config for config in space.every() if not state.settled(config, settings.repeats)]
        if grid:
            return Measure(_first_loads(state, grid), "the full grid: every config of the space", notes)
    probes = [config for config in _probes(state) if not state.settled(config, settings.repeats)]
    if probes:
        return Measure(_first_loads(state, dict.fromkeys(probes)),
                       "probe: the baseline and each drafter at its largest K", notes)
    wanted: dict[Config, str] = {}
    for method in space.methods:
        if not space.drafting[method]:
            continue
        second = _second_point(state, method)
        if second is not None:
            wanted.update((config, "second K of a drafter that could match the best") for config in second)
        elif _role(state, method) == "predicted":
            wanted.update((config, "predicted to beat the best by more than the noise, its own error or a tie")
                          for config in _promising_predictions(state, method))
        else:
            wanted.update((config, "measured mode: halving the K interval around the best")
                          for config in _bisect(state, method))
    wanted = {config: why for config, why in wanted.items() if not state.settled(config, settings.repeats)}
    if wanted:
        return Measure(_first_loads(state, wanted), "; ".join(dict.fromkeys(wanted.values())), notes)
    loads, picks = confirm(state)
    if loads:
        return Measure(tuple(loads), "reloads (ABBA) for the configs the verdict rests on: the best and its "
                       "runner-up once each, and a contender not told apart from the best until it is or the "
                       f"budget runs out ({settings.budget()})", notes)
    reach, missed = slo_reach(state)
    return Done(tuple(picks), notes, reach, missed)
