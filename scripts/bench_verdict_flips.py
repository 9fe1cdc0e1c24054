"""How often tune's verdict holds on the next night, on simulated servers with load-to-load noise: per acceptance
profile, tune (the search) against the full grid under the same verdict rules (`tune --grid`), each run many times
with fresh noise, against the truth the simulation knows.

    python scripts/bench_verdict_flips.py                        # every profile, 40 trials per side
    python scripts/bench_verdict_flips.py --trials 100 --profiles steep dspark
    python scripts/bench_verdict_flips.py --within 0.04 --between 0.12 --repeats 3 --max-repeats 9

What is real and what is a stand-in. The search and its verdict are sparklab's own (sparklab.tune.search.decide,
the same code `sparklab tune` runs). The servers are simulated: a config's true tok/s at concurrency C is its
acceptance length (from the profile's per-position rates, as recipes/sweeps/cpu-tune-<profile>.yaml gives them to
vLLM's synthetic rejection sampling) over its step time, t0 x (OVERHEAD + SLOPE[C] x K) for a drafter and t0 for
none. OVERHEAD and SLOPE are a stand-in shaped on the CPU demo's measured step times (the golden report's loss
table: ngram K=1's step 16% above none's at C=1, K=3's no dearer than K=1's; dearer per K at higher C); they set
where the best K lies, not how noisy the verdict is. The noise is the measured kind: every load of a config draws
one relative offset (sd --between, README: 11-19% between loads on this machine) and every run another (sd
--within, README: 2-7% within a load). With --drafts, acceptance is drawn too, the way vLLM's synthetic rejection
sampling draws it on the real engine: each run of a config counts its own drafts (--drafts per load at C=1, twice
that at C=4, split over the runs), and every load of the config repeats the same draws (the engine's seed is the
same on every start, README "Where that prediction error comes from"), so a reload resamples the machine but not the
acceptance; the search sees the counted per-position rates, as it does on the engine.

Per profile it prints, for tune and for the grid (the reference, measured in the same run under the same noise):
- how often the pick is the true best, and the pick's true speed as a share of the true best's (mean, worst);
- the flip rate: how often two consecutive runs pick differently at some concurrency;
- how often tune's pick is inside the grid best's 95% interval (one grid run paired with each tune run), as
  scripts/bench_tune_vs_grid.py judges it on the real engine;
- model loads, tune's as a share of the grid's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass, field

import yaml

from sparklab.recipes.schema import recipes_dir
from sparklab.tune import search
from sparklab.tune.search import CellObs, Done, Settings, Space

PROFILES = ("dspark", "mtp", "steep", "deep")
OVERHEAD = 1.12  # a server with a drafter: its step at K=0 against none's (stand-in, see above)
SLOPE = {1: 0.03, 4: 0.10}  # the step's growth per draft token, per concurrency (stand-in, see above)
MATERIAL = 0.05  # a flip between picks whose true speeds differ by more than this share of the best's
NGRAM_RATES = (0.30, 0.14, 0.08, 0.05, 0.03, 0.02, 0.01, 0.01)  # ngram on the seed workload, roughly (README)


def rates_of(profile: str) -> tuple[float, ...]:
    if profile == "ngram":
        return NGRAM_RATES
    doc = yaml.safe_load((recipes_dir() / "sweeps" / f"cpu-tune-{profile}.yaml").read_text())
    (setting,) = [s for s in doc["set"] if s.startswith("synthetic_acceptance_rates=")]
    return tuple(yaml.safe_load(setting.split("=", 1)[1]))


def true_speed(rates: tuple[float, ...], config: search.Config, c: int) -> float:
    _, k = config
    if k is None:
        return 100.0
    return 100.0 * search.acceptance_length(list(rates), k) / (OVERHEAD + SLOPE[c] * k)


def counted_rates(rates: tuple[float, ...], k: int, drafts: int, rng: random.Random) -> tuple[float, ...]:
    """Per-position shares accepted over `drafts` drafts of K tokens, drawn at the unconditional rates (position i
    is accepted with its first i-1 when a draft's uniform falls under rates[i-1]; the rates fall with i)."""
    counts = [0] * k
    for _ in range(drafts):
        u = rng.random()
        for i in range(k):
            if u >= rates[i]:
                break
            counts[i] += 1
    return tuple(n / drafts for n in counts)


@dataclass
class Servers:
    """Simulated servers: one offset per load (the machine's state when it started), one per run; with drafts, the
    acceptance each run counts, the same on every load of a config."""

    rates: tuple[float, ...]
    within: float
    between: float
    trial: str  # every random number is a function of the trial, the side and what it is for, so two versions of
    side: str  # the search meet the same servers (common random numbers); the draws are the trial's alone (the
    # engine's seed: the grid and tune count the same draws, as on the real engine)
    drafts: int = 0  # per load at C=1 (0: acceptance exactly at the rates)
    repeats: int = 3
    loads: int = 0
    cells: dict[tuple[search.Config, int], list[tuple[float, str]]] = field(default_factory=dict)
    draws: dict[tuple[search.Config, int, int], tuple[float, ...]] = field(default_factory=dict)
    counted: dict[tuple[search.Config, int], list[tuple[float, ...]]] = field(default_factory=dict)
    loaded: dict[search.Config, int] = field(default_factory=dict)  # loads so far per config

    def run_rates(self, config: search.Config, c: int, j: int) -> tuple[float, ...]:
        k = config[1] or 0
        if not self.drafts:
            return self.rates[:k]
        key = (config, c, j)
        if key not in self.draws:
            per_run = max(1, round(self.drafts * (2 if c > 1 else 1) / self.repeats))
            draws = random.Random(f"{self.trial}|draws|{config}|{c}|{j}")
            self.draws[key] = counted_rates(self.rates, k, per_run, draws)
        return self.draws[key]

    def run(self, decision: search.Measure) -> None:
        for load in decision.loads:
            self.loads += 1
            nth = self.loaded[load.config] = self.loaded.get(load.config, 0) + 1
            offset = random.Random(f"{self.trial}|{self.side}|load|{load.config}|{nth}").gauss(0.0, self.between)
            for c, upto in load.upto:
                have = self.cells.setdefault((load.config, c), [])
                counted = self.counted.setdefault((load.config, c), [])
                j = 0  # the run's index within this load: its draws are the same on every load
                while len(have) < upto:
                    run_rng = random.Random(f"{self.trial}|{self.side}|run|{load.config}|{c}|{nth}|{j}")
                    run_noise = run_rng.gauss(0.0, self.within)
                    value = true_speed(self.rates, load.config, c) * (1 + offset + run_noise)
                    mine = self.run_rates(load.config, c, j)
                    if (k := load.config[1]) and self.drafts:
                        value *= search.acceptance_length(mine, k) / search.acceptance_length(list(self.rates), k)
                    counted.append(mine)
                    have.append((value, f"{self.loads:04d}"))
                    j += 1

    def obs(self) -> search.Observations:
        out: dict[search.Config, dict[int, CellObs]] = {}
        for (config, c), runs in self.cells.items():
            k = config[1]
            counted = self.counted[(config, c)]
            per_position = tuple(statistics.mean(r[i] for r in counted) for i in range(k)) if k else ()
            out.setdefault(config, {})[c] = CellObs(
                tuple(v for v, _ in runs), (100.0,) * len(runs), per_position,
                search.acceptance_length(per_position, k) if k else None, len(runs),
                tuple(lid for _, lid in runs))
        return out


def drive(servers: Servers, space: Space, settings: Settings) -> Done:
    for _ in range(search_rounds := 80):
        decision = search.decide(space, settings, servers.obs())
        if isinstance(decision, Done):
            return decision
        servers.run(decision)
    raise SystemExit(f"the search did not finish in {search_rounds} rounds")


@dataclass
class Side:
    picks: list[dict[int, search.Config]] = field(default_factory=list)
    loads: list[int] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)  # the pick's true speed over the true best's
    right: int = 0  # picks that are the true best
    states: list[search.State] = field(default_factory=list)


def trial(profile_rates: tuple[float, ...], space: Space, settings: Settings, args: argparse.Namespace,
          trial_key: str, side_name: str, side: Side) -> None:
    servers = Servers(profile_rates, args.within, args.between, trial_key, side_name, args.drafts, settings.repeats)
    done = drive(servers, space, settings)
    picks = {p.concurrency: p.config for p in done.picks}
    side.picks.append(picks)
    side.loads.append(servers.loads)
    side.states.append(search.State(space, settings, servers.obs()))
    for c in space.concurrencies:
        truth = {config: true_speed(profile_rates, config, c) for config in space.every()}
        best = max(truth.values())
        side.shares.append(truth[picks[c]] / best)
        side.right += truth[picks[c]] == best


def flip_rates(picks: list[dict[int, search.Config]], rates: tuple[float, ...],
               best: dict[int, float]) -> tuple[float, float]:
    """Over consecutive pairs of runs: how often they pick differently at some concurrency, and how often the two
    picks differ in true speed by more than MATERIAL of the true best's there (a flip between near-equals is not one
    an owner would notice)."""
    pairs = list(zip(picks[::2], picks[1::2], strict=False))
    if not pairs:
        return float("nan"), float("nan")
    flips = sum(a != b for a, b in pairs)
    material = 0
    for a, b in pairs:
        material += any(abs(true_speed(rates, a[c], c) - true_speed(rates, b[c], c)) > MATERIAL * best[c] for c in a)
    return flips / len(pairs), material / len(pairs)


def inside_share(tune: Side, grid: Side, space: Space) -> float:
    """Tune's pick inside the grid best's 95% interval, each tune run against the grid run of the same trial."""
    hits = total = 0
    for picks, state in zip(tune.picks, grid.states, strict=True):
        for c in space.concurrencies:
            scored = [(config, e) for config in state.obs if (e := state.interval(config, c)) is not None]
            _, best_e = max(scored, key=lambda s: s[1].mean)
            mine = state.interval(picks[c], c)
            total += 1
            hits += bool(mine and best_e.low is not None and best_e.low <= mine.mean <= (best_e.high or mine.mean))
    return hits / total if total else float("nan")


def prediction_errors(tune: Side, grid: Side, rates: tuple[float, ...]) -> tuple[float, float]:
    """Mean |error| of tune's predictions at the points it never loaded, against the grid run of the same trial's
    measured mean (as scripts/bench_tune_vs_grid.py scores it on the real engine) and against the true speed."""
    vs_grid, vs_truth = [], []
    for state, grid_state in zip(tune.states, grid.states, strict=True):
        for guess, measured in search.predictions(state.space, state.settings, state.obs):
            if measured is not None:
                continue
            cell = grid_state.cell(guess.config, guess.concurrency)
            if cell.values:
                vs_grid.append(abs(guess.value / statistics.mean(cell.values) - 1))
            vs_truth.append(abs(guess.value / true_speed(rates, guess.config, guess.concurrency) - 1))
    return (statistics.mean(vs_grid) if vs_grid else float("nan"), statistics.mean(vs_truth) if vs_truth
            else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", choices=[*PROFILES, "ngram"], default=[*PROFILES, "ngram"])
    parser.add_argument("--trials", type=int, default=40, help="runs of each side per profile (even: pairs flip)")
    parser.add_argument("--within", type=float, default=0.04, help="sd of a run within one load (relative)")
    parser.add_argument("--between", type=float, default=0.12, help="sd between loads of one config (relative)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-repeats", type=int, default=9)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--drafts", type=int, default=0,
                        help="drafts one load counts at C=1 (twice at C=4), drawn the same on every load of a config "
                             "(the real CPU engine's C=1 cell: about 100); 0: acceptance exactly at the rates")
    args = parser.parse_args()
    ks, cs = tuple(range(1, 9)), (1, 4)
    draws = f"{args.drafts} drafts per load at C=1, drawn once per config" if args.drafts else "acceptance exact"
    print(f"simulated servers (see the docstring): within-load sd {args.within:.0%}, between-load sd "
          f"{args.between:.0%}; {draws}; {args.repeats} runs per load, --max-repeats {args.max_repeats}; K 1-8, "
          f"C 1 and 4; {args.trials} runs of each side per profile")
    print("profile | side | true best picked | pick's true speed / true best: mean, worst | flip rate between two "
          f"runs (any; by more than {MATERIAL:.0%} in true speed) | tune inside grid best's interval | loads "
          "(tune / grid) | tune's prediction error at unloaded points, mean |error| against the grid's measured mean; "
          "against the true speed")
    for profile in args.profiles:
        rates = rates_of(profile)
        method = "ngram" if profile == "ngram" else "synthetic"
        space = Space(("none", method), ks, cs, {"none": False, method: True})
        sides = {"tune": Side(), "grid": Side()}
        started = time.monotonic()
        for n in range(args.trials):
            for name, side in sides.items():
                settings = Settings(args.repeats, args.max_repeats, explore="grid" if name == "grid" else "search")
                trial(rates, space, settings, args, f"{args.seed}|{profile}|{n}", name, side)
        tune, grid = sides["tune"], sides["grid"]
        truth = {c: max(space.every(), key=lambda x, c=c: true_speed(rates, x, c)) for c in cs}
        print(f"{profile} (true best: " + ", ".join(f"C={c} {search.label(x)}" for c, x in truth.items())
              + f"; {time.monotonic() - started:.0f} s)")
        inside = inside_share(tune, grid, space)
        for name, side in sides.items():
            n = len(side.shares)
            loads = statistics.mean(side.loads)
            ratio = f"{statistics.mean(tune.loads) / statistics.mean(grid.loads):.0%} of the grid's" \
                if name == "tune" else "the reference"
            flips, material = flip_rates(side.picks, rates, {c: true_speed(rates, x, c) for c, x in truth.items()})
            print(f"  {name}: {side.right}/{n} | {statistics.mean(side.shares):.1%}, {min(side.shares):.1%} | "
                  f"{flips:.0%}; {material:.0%} | " + (f"{inside:.0%}" if name == "tune" else "-")
                  + f" | {loads:.1f} loads ({ratio})"
                  + (" | {:.1%}; {:.1%}".format(*prediction_errors(tune, grid, rates)) if name == "tune" else ""))


if __name__ == "__main__":
    main()
