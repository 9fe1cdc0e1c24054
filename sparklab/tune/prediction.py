"""The prediction behind `sparklab tune` (pure, no I/O): every K's tok/s from what the loaded K measured.

For a drafter whose proposals do not depend on K (a chain: n-gram lookup, a draft model, EAGLE, MTP), position i's
draft token is the same at every K >= i, so the per-position acceptance rates vLLM counts give the acceptance
length at any K: AL(K) = 1 + p_1 + … + p_K, each p_i pooled over the loaded K >= i. A verify step costs
s(K) = AL(K) / tok/s, measured at each loaded K and interpolated between them (the no-drafting baseline as K = 0
while only one K is measured). sparklab.tune.search decides what to load from these predictions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sparklab.tune.searchstate import Config, Observations, Prediction, Settings, Space, State
from sparklab.tune.searchstate import mean as _mean

_State = State

BASELINE_ANCHOR = "baseline as K=0"
DEFAULT_PREDICTION_ERROR = 0.05  # before any K of a method was predicted and then measured


def acceptance_length(per_position: Iterable[float], k: int) -> float:
    """1 + the expected accepted drafts at K, from the per-position rates measured at a K >= this K."""
    rates = list(per_position)[:k]
    return 1.0 + sum(rates)


def probe_of(state: _State, method: str) -> Config | None:
    """The largest K of a drafter whose server did not fail: its per-position rates cover every K below."""
    for k in sorted(state.space.ks, reverse=True):
        if not state.dead((method, k)):
            return method, k
    return None


def pooled_rates(state: _State, method: str, c: int, leave_out: int | None = None) -> tuple[float, ...]:
    """The per-position acceptance rates at concurrency c, position i pooled over every loaded K >= i of the
    method (each cell weighted by its runs), not read off the probe alone: a chain drafter's token i is the same
    at every K >= i, so each of those servers counted draws of the same rate, and pooling them shrinks the draw
    noise a single load carries (on the CPU engine about 100 drafts per C=1 load, and every reload repeats its
    draws: README "Where that prediction error comes from"). Within c only, since an engine may draft differently
    per batch size. () when the probe reported none at c. leave_out: without that K's cell."""
    probe = probe_of(state, method)
    if probe is None or not state.cell(probe, c).per_position:
        return ()
    sums = [0.0] * len(state.cell(probe, c).per_position)
    weights = [0] * len(sums)
    for k in state.space.ks:
        cell = state.cell((method, k), c)
        if k == leave_out or not cell.values:
            continue
        for i, rate in enumerate(cell.per_position[:len(sums)]):
            sums[i] += rate * len(cell.values)
            weights[i] += len(cell.values)
    return tuple(total / weight for total, weight in zip(sums, weights, strict=True) if weight)


def _baseline_cost(state: _State, c: int) -> float | None:
    for method in state.space.methods:
        if not state.space.drafting[method]:
            cell = state.cell((method, None), c)
            if cell.values:
                return 1.0 / _mean(cell.values)
    return None


def _interpolate(points: list[tuple[int, float]], k: int) -> tuple[float, str]:
    """The step cost at K from measured (K, cost) points (sorted, two or more): linear between the two measured K
    around it, or the nearest segment carried on past the ends. Not one line through every point: the step cost
    of a real engine is not linear in K, and a measured K should pin the curve where it was measured."""
    below = [p for p in points if p[0] <= k]
    above = [p for p in points if p[0] >= k]
    if below and above:
        (k0, s0), (k1, s1) = below[-1], above[0]
        how = f"at K={k0}" if k0 == k1 else f"between K={k0} and K={k1}"
    else:
        (k0, s0), (k1, s1) = points[:2] if not below else points[-2:]
        how = f"extended from K={k0} and K={k1}"
    if k1 == k0:
        return s0, how
    return s0 + (s1 - s0) * (k - k0) / (k1 - k0), how


def predict(state: _State, method: str, c: int, leave_out: int | None = None) -> dict[int, Prediction]:
    """tok/s of every K up to the probe's at concurrency c: acceptance length from the probe's per-position rates
    over a step cost interpolated between the measured K values (while only one is measured, the no-drafting
    baseline stands in as K = 0). leave_out: predict that K as if it had not been measured."""
    probe = probe_of(state, method)
    if probe is None or probe[1] == leave_out:
        return {}
    rates = pooled_rates(state, method, c, leave_out)
    if not rates:
        return {}
    points: list[tuple[int, float]] = []
    for k in sorted(state.space.ks):
        cell = state.cell((method, k), c)
        if k != leave_out and cell.values:
            al = cell.acceptance_length or acceptance_length(rates, k)
            points.append((k, al / _mean(cell.values)))
    base = _baseline_cost(state, c) if len(points) < 2 else None
    anchored = base is not None
    if base is not None:
        points.insert(0, (0, base))
    if len(points) < 2:
        return {}
    out = {}
    for k in state.space.ks:
        if k > (probe[1] or 0):
            continue
        cost, how = _interpolate(points, k)
        al = acceptance_length(rates, k)
        if cost > 0:
            basis = "step cost " + how.replace("K=0", BASELINE_ANCHOR) if anchored else "step cost " + how
            out[k] = Prediction((method, k), c, al / cost, al, basis)
    return out


def prediction_error_of(state: _State, method: str, c: int) -> float:
    """A prediction's own error: the largest relative miss of the method's leave-one-out predictions at the K
    already measured (at c, else at any concurrency); DEFAULT_PREDICTION_ERROR before any. A leave-one-out
    prediction whose step cost leaned on the baseline as K = 0 does not count: the predictions it would bound
    interpolate between two measured K, and the baseline's step lacks the drafter's own cost (on the CPU engine
    ngram K=1's step is 16% dearer than none's), so counting it made every error look like that gap and kept
    tune from loading the K it predicted best."""
    probe = probe_of(state, method)

    def misses(at: Iterable[int]) -> list[float]:
        out = []
        for cc in at:
            for k in state.space.ks:
                cell = state.cell((method, k), cc)
                if not cell.values or (probe is not None and k == probe[1]):
                    continue
                guess = predict(state, method, cc, leave_out=k).get(k)
                if guess is None or BASELINE_ANCHOR in guess.basis:
                    continue  # anchored on the baseline: not the model that predicts once two K are measured
                if _mean(cell.values) > 0:
                    out.append(abs(guess.value / _mean(cell.values) - 1))
        return out

    here = misses([c]) or misses(state.space.concurrencies)
    return max(here) if here else DEFAULT_PREDICTION_ERROR


def predictions(space: Space, settings: Settings, obs: Observations) -> list[tuple[Prediction, float | None]]:
    """Every drafter's predicted objective per (K, concurrency) where its probe gave per-position rates, with the
    measured mean where there is one. A measured K's prediction is made without it (leave one out), as it was
    before it was loaded."""
    state = _State(space, settings, obs)
    out = []
    for method in space.methods:
        if not space.drafting[method]:
            continue
        probe = probe_of(state, method)
        for c in space.concurrencies:
            for k in space.ks:
                cell = state.cell((method, k), c)
                measured = _mean(cell.values) if cell.values else None
                guess = (predict(state, method, c, leave_out=k) if measured is not None
                         else predict(state, method, c)).get(k)
                if guess is not None and (probe is None or k != probe[1]):
                    out.append((guess, measured))
    return out


def prediction_error(pairs: Iterable[tuple[float, float]]) -> float | None:
    """Mean absolute relative error of predicted against measured values."""
    errors = [abs(p / m - 1) for p, m in pairs if m > 0 and math.isfinite(p)]
    return sum(errors) / len(errors) if errors else None
