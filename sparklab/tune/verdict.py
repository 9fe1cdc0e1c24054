"""`sparklab tune`'s verdict per concurrency (pure): measure more where the best is uncertain, then pick.

Uncertain means measure more, not fall back:
1. The configs a verdict rests on (the best and its runner-up) are each reloaded at least once, in ABBA order (the
   one loaded last goes first, so a drift of the machine over the minutes of a round hits both alike), so that
   their intervals and the test between them carry between-load noise (sparklab.bench.noise), not only the
   within-load noise of one server start.
2. While the best and a contender (the fastest config the 95% interval of their ratio does not tell from the best)
   cannot be told apart, both are reloaded again, `repeats` runs per load, until they can, or until either has
   used its budget (`Settings.max_loads` loads, i.e. --max-repeats runs per concurrency).
3. Only then does a tie-break apply: the smaller K among the best and what it cannot be told from whose mean is
   within TIE_MARGIN (3%) of the best's (no drafting counts as K = 0), else the best; the pick says it is a
   tie-break.

And a K schedule (one server, K per batch size) is measured before it is recommended: `schedule_verdict` compares
it at every concurrency with that concurrency's winner.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sparklab.bench import noise
from sparklab.bench.metrics import IDENTICAL, Ratio
from sparklab.tune import searchstate
from sparklab.tune.searchstate import (
    Config,
    Load,
    Pick,
    SloReach,
    State,
    k_of,
    label,
    not_told_apart,
)


def _can_reload(state: State, config: Config, c: int) -> bool:
    cell = state.cell(config, c)
    return (not state.dead(config) and cell.load_count < state.settings.max_loads
            and cell.settled < state.settings.max_repeats)


def _upto(state: State, config: Config, c: int) -> int:
    """A reload's cells: `repeats` more runs, the last reload cut at max_repeats."""
    return min(state.cell(config, c).settled + state.settings.repeats, state.settings.max_repeats)


def _versus(state: State, a: Config, b: Config | None, c: int) -> Ratio | None:
    return state.told_apart(a, b, c) if b is not None else None


def _one_load(state: State, configs: Iterable[Config | None], c: int) -> bool:
    return any(x is not None and state.cell(x, c).load_count < 2 for x in configs)


def _note(state: State, c: int, chosen: Config, best: Config, runner: Config | None, close: list[Config],
          tie: bool, scored: int) -> str:
    e = state.interval(chosen, c)
    runs = f"{e.runs} runs over {e.loads} load(s)" if e else "no runs"
    rests = ""
    if _one_load(state, (best, runner), c):
        rests = ("; RESTS ON ONE LOAD: " + ", ".join(label(x) for x in (best, runner)
                                                     if x is not None and state.cell(x, c).load_count < 2)
                 + " never reloaded (" + state.settings.budget() + ")")
    if scored == 1:
        return f"the only config measured at this concurrency ({runs}){rests}"
    if tie:
        others = ", ".join(label(x) for x in close)
        margin = f"{searchstate.TIE_MARGIN:.0%}"
        if chosen == best:
            return (f"TIE-BREAK: {label(best)} has the highest mean and is not told apart from {others} after "
                    f"{state.settings.budget()}; {others} measured more than {margin} below it, so the highest mean "
                    f"is kept (a smaller K wins only a tie within {margin}) ({runs}){rests}")
        return (f"TIE-BREAK: {label(best)} has the highest mean but is not told apart from {others} after "
                f"{state.settings.budget()}; the smaller K within {margin} of its mean is chosen ({runs}){rests}")
    values = state.cell(chosen, c).values
    if not close and e is not None and len(values) >= 2 and max(values) - min(values) <= 1e-9 * max(abs(e.mean), 1e-12):
        return (f"the highest of {scored} measured; its {len(values)} repeats gave the same value ({IDENTICAL}) "
                f"({runs}){rests}")
    r = state.told_apart(chosen, runner, c) if runner else None
    if runner is not None and r is not None and r.low is not None and r.high is not None:
        return (f"faster than the runner-up {label(runner)} ({100 * r.value:.1f}% [{100 * r.low:.1f}, "
                f"{100 * r.high:.1f}], within- and between-load noise; {runs}){rests}")
    return f"the highest of {scored} measured; single runs, no interval ({runs}){rests}"


def confirm(state: State) -> tuple[list[Load], list[Pick]]:
    """Per concurrency: the reloads still needed (in ABBA order, merged per config), or the pick."""
    wanted: dict[Config, dict[int, int]] = {}
    picks = []
    for c in state.space.concurrencies:
        scored = [(config, e) for config in state.obs if (e := state.eligible(config, c)) is not None]
        if not scored:
            continue
        ranked = sorted(scored, key=lambda s: -s[1].mean)
        best = ranked[0][0]
        runner = ranked[1][0] if len(ranked) > 1 else None
        rest = [config for config, _ in ranked[1:]]
        close = [x for x in rest if not_told_apart(state.told_apart(best, x, c))]
        # 1. the best and its runner-up: each reloaded at least once, so the test between them sees load noise
        pair = [x for x in (best, runner) if x is not None]
        need = [x for x in pair if state.cell(x, c).load_count < 2 and _can_reload(state, x, c)]
        if need and len(pair) > 1:
            for x in need:
                wanted.setdefault(x, {})[c] = _upto(state, x, c)
            continue
        # 2. not told apart: both again, while the budget lasts
        if close and _can_reload(state, best, c) and _can_reload(state, close[0], c):
            for x in (best, close[0]):
                wanted.setdefault(x, {})[c] = _upto(state, x, c)
            continue
        # 3. the pick: the best, or a tie-break among what it could not be told from
        tie = bool(close)  # (single runs: within 1% of the best counts as not told apart, SINGLE_RUN_TIE)
        means = dict(scored)
        near = [x for x in close if means[x].mean >= (1 - searchstate.TIE_MARGIN) * means[best].mean]
        chosen = min([best, *near], key=lambda x: (k_of(x), -means[x].mean))
        second = runner if chosen == best else best
        estimate = state.interval(chosen, c)
        assert estimate is not None
        picks.append(Pick(c, chosen, estimate, best, tuple(close), _note(state, c, chosen, best, runner, close, tie,
                                                                         len(scored)),
                          tie, second, _versus(state, chosen, second, c), _one_load(state, (best, runner), c),
                          runner))
    order = sorted(wanted, key=lambda x: max((state.cell(x, c).last_load for c in wanted[x]), default=""),
                   reverse=True)  # the one loaded last goes first: A B, then B A
    return [Load(x, tuple(sorted(wanted[x].items()))) for x in order], picks


def slo_reach(state: State) -> tuple[SloReach | None, tuple[int, ...]]:
    """With an SLO: the highest concurrency where some measured config meets it (the fastest such), and the
    concurrencies where none does."""
    if not state.settings.terms:
        return None, ()
    reach, missed = None, []
    for c in sorted(state.space.concurrencies):
        meeting = [(config, e.mean) for config in state.obs if (e := state.eligible(config, c)) is not None]
        if meeting:
            config, value = max(meeting, key=lambda m: m[1])
            reach = SloReach(c, config, value)
        else:
            missed.append(c)
    return reach, tuple(missed)


# -- the K schedule ------------------------------------------------------------------------------------------------


def k_schedule(picks: Iterable[Pick]) -> tuple[str, list[tuple[int, int, int]]] | None:
    """One drafting method's K per batch-size range (vLLM's num_speculative_tokens_per_batch_size), when the
    picks use at most one drafting method; no drafting at a concurrency is K = 0 there (which `schedule_verdict`
    allows only once the schedule server was measured there). None otherwise."""
    ordered = sorted(picks, key=lambda p: p.concurrency)
    drafting = {p.config[0] for p in ordered if p.config[1] is not None}
    if len(drafting) != 1 or len(ordered) < 2:
        return None
    schedule, start = [], 1
    for i, pick in enumerate(ordered):
        end = pick.concurrency if i < len(ordered) - 1 else max(pick.concurrency, 1024)
        schedule.append((start, end, k_of(pick.config)))
        start = end + 1
    if len({k for _, _, k in schedule}) < 2:
        return None  # one K everywhere: a plain --num-speculative-tokens says it
    return drafting.pop(), schedule


K0_WHY = ("K = 0 in a per-batch-size schedule is not the same as no drafting: vLLM still runs the drafter's "
          "forward on K = 0 steps, and a server with a drafter loses graph modes (vllm-project/vllm#49986: -28% "
          "single-stream and -55 to -58% at 4 sessions against no drafting, 2x RTX 5090)")


@dataclass(frozen=True)
class ScheduleRow:
    concurrency: int
    k: int
    winner: Config
    winner_interval: noise.Interval | None
    schedule_interval: noise.Interval | None
    versus: Ratio | None  # the schedule over the winner

    @property
    def loses(self) -> bool:
        """Slower beyond noise: the 95% interval of schedule / winner lies under 1."""
        return self.versus is not None and self.versus.high is not None and self.versus.high < 1.0

    @property
    def unmeasured(self) -> bool:
        return self.schedule_interval is None


@dataclass(frozen=True)
class ScheduleVerdict:
    method: str
    ranges: tuple[tuple[int, int, int], ...]
    rows: tuple[ScheduleRow, ...]

    @property
    def recommended(self) -> bool:
        return bool(self.rows) and not any(r.loses or r.unmeasured for r in self.rows)

    def summary(self) -> str:
        if self.recommended:
            return ("the schedule was measured at every concurrency and does not lose to any per-concurrency winner "
                    "beyond noise: one server will do")
        lost = [(r, r.versus) for r in self.rows if r.loses and r.versus is not None]
        if lost:
            where = ", ".join(f"C={r.concurrency} ({100 * v.value:.1f}% of {label(r.winner)}, "
                              f"[{100 * (v.low or 0):.1f}, {100 * (v.high or 0):.1f}])" for r, v in lost)
            return f"the schedule LOSES beyond noise at {where}: run the per-concurrency servers instead"
        missing = ", ".join(f"C={r.concurrency}" for r in self.rows if r.unmeasured)
        return f"the schedule was not measured at {missing}: run the per-concurrency servers instead"


def schedule_verdict(state: State, picks: Iterable[Pick], method: str, ranges: Iterable[tuple[int, int, int]],
                     schedule: Mapping[int, list[list[float]]]) -> ScheduleVerdict:
    """The measured schedule server (its values by load, per concurrency) against each concurrency's winner,
    with the noise pooled over the configs measured there."""
    fixed: tuple[tuple[int, int, int], ...] = tuple((first, last, k) for first, last, k in ranges)
    rows = []
    for pick in sorted(picks, key=lambda p: p.concurrency):
        c = pick.concurrency
        k = next((kk for first, last, kk in fixed if first <= c <= last), 0)
        by_load = schedule.get(c) or []
        comp = noise.components([*(cell.by_load() for by_c in state.obs.values() if (cell := by_c.get(c))), by_load])
        rows.append(ScheduleRow(c, k, pick.config, state.interval(pick.config, c), noise.interval(by_load, comp),
                                noise.ratio(by_load, state.cell(pick.config, c).by_load(), comp)))
    return ScheduleVerdict(method, fixed, tuple(rows))
