"""`sparklab tune` against the full grid on acceptance profiles, with the real engine: per profile, tune's pick per
concurrency against the grid's (the same pick or not, inside the grid best's interval or not, significantly
different or not), the wall-time ratio, the model loads, and the error of tune's predicted tok/s for the K it did
not load (against the grid's measurement of that K). That error is split into acceptance length (tune's prediction
against the grid server's counters: no clock in it) and decode steps per second (the step cost, and the machine
during the two loads); for a synthetic profile, both sides' counted lengths are set against the told one, beside the
error that the draws alone give a predictor (every load of a config repeats its server's draws: same seed).

    python scripts/bench_tune_vs_grid.py                          # every profile, grid then tune, then compare
    python scripts/bench_tune_vs_grid.py --profiles dspark steep  # some of them
    python scripts/bench_tune_vs_grid.py --only compare --runs-dir DIR
    python scripts/bench_tune_vs_grid.py --profiles steep --k 1 2 4 8 --repeats 2 --max-repeats 4   # bounded

Profiles (recipes/sweeps/cpu-tune-<profile>.yaml; each file derives its rates): dspark, mtp, steep and deep are
synthetic acceptance on the real vLLM 0.27.1 CPU engine (docker/vllm-cpu-synthetic: ngram drafts, accepted at the
profile's per-position rates; the engine's real step cost); ngram is the real ngram drafter (cpu-tune.yaml).

Same budget rules on both sides: the grid is `sparklab tune SPACE --grid` (every config loaded first), tune is
`sparklab tune SPACE`; both with the space's runs per load (3) and --max-repeats 9 (at most 3 loads of each config
per concurrency), so both reload the best and its runner-up (ABBA), reload a contender until told apart or out of
budget, then tie-break, and measure a K schedule before recommending it. The grid's intervals (within- and
between-load noise, sparklab.bench.noise) are the yardstick: tune's pick is "inside" when its mean in the grid's run
lies inside the grid best's 95% interval.

Each side runs as `python -m sparklab tune …` while holding /tmp/sparklab-docker-tests.lock (the shared lock of
every Docker user on this machine, taken per side so others run between sides; flock(2), as `flock` takes it);
its wall time is timed from when the lock is held. The load average of the machine is recorded at each side's
start and end (and per cell, in the results). Not part of the test suite: a profile takes about 30 to 60 minutes
on 2 shared cores.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparklab.bench import noise
from sparklab.engines import engine
from sparklab.recipes.plan import build_plan
from sparklab.recipes.schema import recipes_dir
from sparklab.sweep.store import Store
from sparklab.tune import driver, prediction, search

LOCK = Path("/tmp/sparklab-docker-tests.lock")
PROFILES = {"dspark": "cpu-tune-dspark", "mtp": "cpu-tune-mtp", "steep": "cpu-tune-steep", "deep": "cpu-tune-deep",
            "ngram": "cpu-tune"}
MAX_REPEATS = 9


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def timed_run(argv: list[str], log: Path) -> dict[str, Any]:
    """Run argv holding the shared Docker lock; wall time from the lock held to exit, and the model loads made."""
    with LOCK.open("a") as lock:
        waited = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        started, load_start = time.monotonic(), loadavg()
        done = subprocess.run(argv, capture_output=True, text=True)
        wall = time.monotonic() - started
        load_end = loadavg()
    log.write_text(f"$ {' '.join(argv)}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    if done.returncode not in (0, 6):
        sys.exit(f"{argv[3]} {argv[4]} failed with exit code {done.returncode}; see {log}")
    loads = sum(1 for line in done.stderr.splitlines() if ": starting (" in line and "server " in line)
    return {"wall_s": round(wall, 1), "lock_wait_s": round(started - waited, 1), "loads": loads, "log": str(log),
            "loadavg_start": load_start, "loadavg_end": load_end}


def space_file(profile: str) -> Path:
    return recipes_dir() / "sweeps" / f"{PROFILES[profile]}.yaml"


@dataclass(frozen=True)
class Bounds:
    """What both sides are given alike (None or (): the space file's): a smaller space bounds the measurement."""

    k: tuple[int, ...] = ()
    concurrency: tuple[int, ...] = ()
    repeats: int | None = None
    max_repeats: int = MAX_REPEATS

    def argv(self, space: Path) -> list[str]:
        repeats = self.repeats or build_plan(space).sweep.repeats
        out = ["--repeats", str(repeats), "--max-repeats", str(self.max_repeats)]
        if self.k:
            out += ["--k", ",".join(map(str, self.k))]
        if self.concurrency:
            out += ["--concurrency", *map(str, self.concurrency)]
        return out


def run_side(side: str, profile: str, runs: Path, bounds: Bounds = Bounds()) -> dict[str, Any]:
    space = space_file(profile)
    argv = [sys.executable, "-m", "sparklab", "tune", str(space), "--runs-dir", str(runs / side), "--new",
            *bounds.argv(space)] + (["--grid"] if side == "grid" else [])
    runs.mkdir(parents=True, exist_ok=True)
    figures = timed_run(argv, runs / f"{side}.log")
    (runs / f"{side}.json").write_text(json.dumps(figures))
    print(f"{profile} {side}: {figures['wall_s']:.0f} s, {figures['loads']} model loads, load average "
          f"{figures['loadavg_start'][0]:.2f} -> {figures['loadavg_end'][0]:.2f}", flush=True)
    return figures


def _store(runs: Path, side: str) -> Path:
    found = sorted((runs / side).glob("*/results.sqlite"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit(f"{runs / side}: no run found; run that side first")
    return found[-1]


def _read(runs: Path, side: str) -> tuple[dict[str, Any], search.Observations, search.State]:
    path = _store(runs, side)
    plan = build_plan(path.parent / driver.SPACE_FILE)
    with Store.open(path, readonly=True) as store:
        state = json.loads(store.meta()["tune"])
        settings = driver._settings(state)
        obs = driver.observations(store, plan, "aggregate", settings.terms)
    return state, obs, search.State(driver.space_of(plan), settings, obs)  # the run's own space (--k bounds it)


def _explore_wall(state: dict[str, Any]) -> float | None:
    """The grid side's wall time until its verdict rounds began: the plain grid's time (no reloads)."""
    for round_ in state.get("rounds", []):
        if not round_["why"].startswith("the full grid") and round_.get("started_s") is not None:
            return float(round_["started_s"])
    return None


def run_drift(grid: search.State, tuned: search.State) -> dict[int, float]:
    """Per concurrency, how much faster the grid's run measured the configs tune also measured there: the geometric
    mean of grid mean / tune mean over them. The two runs are separate loads on a shared machine (the README's
    between-load noise: 86-95% of a run's variance here), so a prediction made from tune's run and checked against
    the grid's measurement carries that drift as well as the model's own error; scaling by this factor takes the
    drift out, and both errors are printed."""
    drift = {}
    for c in grid.space.concurrencies:
        logs = [math.log(g.mean / t.mean) for config in tuned.obs
                if (t := tuned.interval(config, c)) is not None and (g := grid.interval(config, c)) is not None
                and t.mean > 0 and g.mean > 0]
        if logs:
            drift[c] = math.exp(sum(logs) / len(logs))
    return drift


def told_rates(runs: Path, side: str) -> dict[search.Config, tuple[float, ...]]:
    """Per synthetic config of that side's space, the per-position acceptance rates its server is told to produce
    (p_1 … p_K, from its argv, read by the engine adapter as tune reads them to mark a synthetic pick)."""
    plan = build_plan(_store(runs, side).parent / driver.SPACE_FILE)
    out: dict[search.Config, tuple[float, ...]] = {}
    for server in plan.servers:
        rates = engine(server.spec.kind).synthetic_acceptance(server.spec.argv)
        if rates is not None and server.num_speculative_tokens is not None:
            out[(server.method, server.num_speculative_tokens)] = tuple(rates[:server.num_speculative_tokens])
    return out


def drafts_per_load(runs: Path, side: str, state: search.State) -> dict[tuple[search.Config, int], float]:
    """Per (config, C), the drafts its server's counters saw over one load's runs (the total over its loads divided
    by their number: every load of a config repeats the same draws, as the same sampling seed gives the same
    uniforms, so a reload adds no independent draft)."""
    with Store.open(_store(runs, side), readonly=True) as store:
        configs = {row.id: (row.method, row.k) for row in store.server_configs()}
        totals: dict[tuple[search.Config, int], float] = {}
        for cell in store.cells("done"):
            drafts = ((cell.result or {}).get("speculative") or {}).get("drafts")
            if drafts:
                key = (configs[cell.server_config_id], cell.concurrency)
                totals[key] = totals.get(key, 0.0) + float(drafts)
    return {key: total / max(1, len(state.cell(*key).by_load())) for key, total in totals.items()}


def mean_abs(values: Iterable[float]) -> float:
    """The mean |value| (of relative errors, each a ratio - 1)."""
    found = [abs(v) for v in values]
    return sum(found) / len(found)


def draw_variance(rates: tuple[float, ...]) -> float:
    """The variance of one draft's accepted count when its first i tokens are all accepted with probability p_i
    (unconditional rates, non-increasing): X = sum over i of [X >= i], so E[X^2] = sum of (2i - 1) p_i."""
    return sum((2 * i + 1) * p for i, p in enumerate(rates)) - sum(rates) ** 2


def draw_floor(rates: tuple[float, ...], grid_drafts: float, probe_drafts: float | None) -> tuple[float, float]:
    """The mean |relative error| in acceptance length that the draws alone give a predictor, normal approximation
    (E|N(0, sd)| = sd sqrt(2 / pi)): against a grid length counted over grid_drafts drafts, for a predictor that knew
    the told rates (first) and for one that, like tune, reads them off a probe's probe_drafts drafts (second)."""
    length, v = 1 + sum(rates), draw_variance(rates)
    knew = math.sqrt(v / grid_drafts) / length
    read = math.sqrt(v / grid_drafts + v / probe_drafts) / length if probe_drafts else knew
    return knew * math.sqrt(2 / math.pi), read * math.sqrt(2 / math.pi)


@dataclass(frozen=True)
class Split:
    """One unloaded point's error, split by tok/s = acceptance length x decode steps per second: the acceptance part
    compares tune's predicted length with the length the grid's server counted (no clock in it), the step part is
    what is left (the step cost the model extended, and the machine's speed during the two loads). Each is a ratio - 1;
    (1 + acceptance) x (1 + steps) = 1 + the tok/s error. For a synthetic server (None for a real drafter), `told` is
    the grid's counted length against the one the server was told to produce, and `predicted_told` tune's predicted
    length against it (tune predicts from the per-position rates its probe's server counted)."""

    concurrency: int
    k: int | None
    tok_s: float
    acceptance: float
    steps: float
    told: float | None
    predicted_told: float | None
    floor_knew: float | None = None  # draw_floor's two figures at this point (synthetic only)
    floor_read: float | None = None


def split_error(predicted: float, predicted_length: float, measured: float, measured_length: float,
                told_length: float | None, concurrency: int, k: int | None,
                floor: tuple[float, float] | None = None) -> Split:
    tok_s = predicted / measured - 1
    acceptance = predicted_length / measured_length - 1
    return Split(concurrency, k, tok_s, acceptance, (1 + tok_s) / (1 + acceptance) - 1,
                 None if told_length is None else measured_length / told_length - 1,
                 None if told_length is None else predicted_length / told_length - 1,
                 *(floor or (None, None)))


def rules_floor(state: dict[str, Any], space: search.Space) -> dict[str, Any]:
    """What the verdict rules ask of any tune for this grid's verdict (README "The same holds for any tune"): the
    grid's rule loads N + V + S (every config, one reload of each config the verdict rests on, the K schedule's
    server) against 2V + S for a tune that knew the answer before it started (each of the V loaded and reloaded, no
    search). V counts each pick, its best and the best's runner-up (`best_runner_up`; a store from before it was kept
    has the pick's runner-up only, which after a tie-break is the best: then V may miss one, a floor still)."""
    verdict = {name for pick in state.get("picks", [])
               for name in (pick.get("label"), pick.get("best_mean"), pick.get("best_runner_up", pick.get("runner_up")))
               if name}
    v, s, n = len(verdict), int(bool((state.get("schedule") or {}).get("serve_args"))), len(space.every())
    grid_loads = state.get("loads") or n + v + s
    return {"configs": n, "verdict_configs": sorted(verdict), "schedule": s, "oracle_loads": 2 * v + s,
            "rule_loads": n + v + s, "oracle_share_of_grid": (2 * v + s) / grid_loads}


def compare(profile: str, runs: Path) -> dict[str, Any]:
    """Per concurrency: the grid's pick and its best's interval against tune's pick; the wall times and the
    prediction error of tune's unloaded (K, C) against the grid's measurement."""
    space_path = space_file(profile)
    grid_state, _, grid = _read(runs, "grid")
    tune_state, _, tuned = _read(runs, "tune")
    sides = {side: json.loads((runs / f"{side}.json").read_text()) for side in ("grid", "tune")}
    g, t = sides["grid"], sides["tune"]
    out: dict[str, Any] = {"profile": profile, "grid": g, "tune": t, "share": t["wall_s"] / g["wall_s"],
                           "grid_loads": grid_state.get("loads"), "tune_loads": tune_state.get("loads"),
                           "grid_explore_s": _explore_wall(grid_state), "concurrency": []}
    floor = out["rules_floor"] = rules_floor(grid_state, grid.space)
    print(f"== {profile} ({space_path.name}): wall time grid {g['wall_s']:.0f} s, tune {t['wall_s']:.0f} s "
          f"({out['share']:.0%} of the grid); model loads grid {grid_state.get('loads')}, tune "
          f"{tune_state.get('loads')}; the verdict rules' floor for any tune: {floor['oracle_loads']} loads "
          f"({floor['oracle_share_of_grid']:.0%} of the grid's; {len(floor['verdict_configs'])} configs the grid's "
          f"verdict rests on, each loaded twice{', and the K schedule' if floor['schedule'] else ''})")
    tune_picks = {p["concurrency"]: p for p in tune_state.get("picks", [])}
    for pick in grid_state.get("picks", []):
        c = pick["concurrency"]
        best: search.Config = (pick["best_mean"].split(" K=")[0],
                               int(pick["best_mean"].split(" K=")[1]) if " K=" in pick["best_mean"] else None)
        best_e = grid.interval(best, c)
        mine = tune_picks.get(c)
        row: dict[str, Any] = {"concurrency": c, "grid_pick": pick["label"], "grid_best": search.label(best),
                               "grid_best_mean": best_e.mean if best_e else None,
                               "grid_best_low": best_e.low if best_e else None,
                               "grid_best_high": best_e.high if best_e else None,
                               "grid_tie_break": pick.get("tie_break"), "grid_one_load": pick.get("one_load"),
                               "tune_pick": mine["label"] if mine else None,
                               "tune_tie_break": mine.get("tie_break") if mine else None}
        if mine is not None:
            config: search.Config = (mine["method"], mine["k"])
            in_grid = grid.interval(config, c)
            r = noise.ratio(grid.cell(config, c).by_load(), grid.cell(best, c).by_load(), grid.noise_at(c))
            row.update(same=mine["label"] == pick["label"],
                       tune_pick_in_grid=in_grid.mean if in_grid else None,
                       inside=bool(in_grid and best_e and best_e.low is not None
                                   and best_e.low <= in_grid.mean <= (best_e.high or in_grid.mean)),
                       versus_grid_best=None if r is None else {"value": r.value, "low": r.low, "high": r.high},
                       significantly_different=bool(r and r.low is not None and r.significant))
        out["concurrency"].append(row)
        interval = (f"[{row['grid_best_low']:.2f}, {row['grid_best_high']:.2f}]" if row["grid_best_low"] is not None
                    else "(no interval)")
        verdict = ""
        if mine is not None:
            vs = row["versus_grid_best"]
            versus = f"{100 * vs['value']:.1f}% of it" if vs else "-"
            if vs and vs["low"] is not None:
                versus += f" [{100 * vs['low']:.1f}, {100 * vs['high']:.1f}]"
            verdict = (f"; tune picks {mine['label']}{' (tie-break)' if mine.get('tie_break') else ''}: "
                       f"{'the same pick' if row['same'] else 'another pick'}, measured "
                       f"{row['tune_pick_in_grid']:.2f} in the grid ({versus}), "
                       f"{'inside' if row['inside'] else 'OUTSIDE'} the grid best's interval, "
                       + ("significantly different" if row["significantly_different"] else
                          "not significantly different"))
        print(f"  C={c}: grid best {row['grid_best']} {row['grid_best_mean']:.2f} {interval}, grid pick "
              f"{pick['label']}{' (tie-break)' if pick.get('tie_break') else ''}{verdict}")
    drift = run_drift(grid, tuned)
    out["drift"] = {str(c): d for c, d in drift.items()}
    errors, corrected, splits = [], [], []
    told = told_rates(runs, "grid")
    grid_drafts, tune_drafts = drafts_per_load(runs, "grid", grid), drafts_per_load(runs, "tune", tuned)
    for row in tune_state.get("predictions", []):
        if row["measured"] is not None:
            continue  # tune loaded it: its prediction is a leave-one-out check, not what this measures
        config = (row["method"], row["k"])
        truth = grid.interval(config, row["concurrency"])
        if truth is not None:
            errors.append(row["predicted"] / truth.mean - 1)
            if row["concurrency"] in drift:
                corrected.append(row["predicted"] * drift[row["concurrency"]] / truth.mean - 1)
            counted = grid.cell(config, row["concurrency"]).acceptance_length
            if row.get("acceptance_length") and counted:
                rates, c = told.get(config), row["concurrency"]
                probe = prediction.probe_of(tuned, row["method"])  # the config whose counted rates tune predicted from
                floor = (draw_floor(rates, grid_drafts[(config, c)], tune_drafts.get((probe, c)) if probe else None)
                         if rates and (config, c) in grid_drafts else None)
                splits.append(split_error(row["predicted"], row["acceptance_length"], truth.mean, counted,
                                          None if rates is None else 1 + sum(rates), c, row["k"], floor))
    out["prediction_errors"] = errors
    out["prediction_errors_drift_corrected"] = corrected
    if errors:
        out["prediction_error_mean"] = sum(abs(e) for e in errors) / len(errors)
        out["prediction_error_max"] = max(abs(e) for e in errors)
        print(f"  prediction error over {len(errors)} unloaded (K, C): mean |error| "
              f"{out['prediction_error_mean']:.1%}, max {out['prediction_error_max']:.1%}")
    if corrected:
        out["prediction_error_mean_drift_corrected"] = sum(abs(e) for e in corrected) / len(corrected)
        print("  the same, tune's run scaled to the grid's by the configs both measured at that C (drift "
              + ", ".join(f"C={c} x{d:.3f}" for c, d in sorted(drift.items())) + "): mean |error| "
              f"{out['prediction_error_mean_drift_corrected']:.1%}, max {max(abs(e) for e in corrected):.1%}")
    out["prediction_split"] = [vars(x) for x in splits]
    if splits:
        print(f"  the same error split by tok/s = acceptance length x steps/s over {len(splits)} points: acceptance "
              f"(tune's predicted length against the grid server's counters) mean |error| "
              f"{mean_abs(x.acceptance for x in splits):.1%}, steps/s (the step cost, and the machine during the two "
              f"loads) {mean_abs(x.steps for x in splits):.1%}; per (C, K): "
              + ", ".join(f"C={x.concurrency} K={x.k} {x.tok_s:+.0%} = {x.acceptance:+.0%} x {x.steps:+.0%}"
                          for x in splits))
        told_dev = [x.told for x in splits if x.told is not None]
        if told_dev:
            predicted_dev = [x.predicted_told for x in splits if x.predicted_told is not None]
            print(f"  against the acceptance length the synthetic servers were told (1 + p_1 + ... + p_K) at those "
                  f"points: the grid's counted length mean |deviation| {mean_abs(told_dev):.1%} (max "
                  f"{max(abs(v) for v in told_dev):.1%}), tune's predicted one {mean_abs(predicted_dev):.1%} (max "
                  f"{max(abs(v) for v in predicted_dev):.1%}); both are the draws of one sampling seed, which every "
                  "load of a config repeats")
        floors = [(x.floor_knew, x.floor_read) for x in splits if x.floor_knew is not None and x.floor_read is not None]
        if floors:
            print(f"  the draws alone (normal approximation, from the told rates and the drafts counted in one load) "
                  f"give a predictor a mean |acceptance error| of {mean_abs(k for k, _ in floors):.1%} at these "
                  f"points if it knew the told rates, {mean_abs(r for _, r in floors):.1%} if, like tune, it reads "
                  "them off its probe's counters")
    for side, state in (("grid", grid_state), ("tune", tune_state)):
        schedule = state.get("schedule") or {}
        if schedule.get("verdict"):
            print(f"  {side}'s K schedule: {schedule['verdict']['summary']}")
    out["inside_everywhere"] = all(row.get("inside") for row in out["concurrency"])
    (runs / "compare.json").write_text(json.dumps(out, indent=1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", choices=list(PROFILES), default=list(PROFILES))
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/tune-vs-grid"))
    parser.add_argument("--only", choices=["grid", "tune", "compare"])
    parser.add_argument("--k", nargs="+", type=int, default=[], help="K values of both sides (default: the space's)")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[], help="C of both sides (default: the space's)")
    parser.add_argument("--repeats", type=int, help="runs per load on both sides (default: the space's)")
    parser.add_argument("--max-repeats", type=int, default=MAX_REPEATS, help="runs per config and C over its loads")
    args = parser.parse_args()
    bounds = Bounds(tuple(args.k), tuple(args.concurrency), args.repeats, args.max_repeats)
    results = []
    for profile in args.profiles:
        runs = args.runs_dir / profile
        for side in ("grid", "tune"):
            if args.only in (None, side):
                run_side(side, profile, runs, bounds)
        if args.only in (None, "compare"):
            results.append(compare(profile, runs))
    if len(results) > 1:
        print("== summary: profile | same pick at every C | tune inside the grid best's interval at every C | wall "
              "share | loads grid/tune (the rules' floor for any tune) | mean prediction error (drift-corrected) | of "
              "it, acceptance / steps/s")
        for r in results:
            same = all(row.get("same") for row in r["concurrency"])
            error = f"{r['prediction_error_mean']:.1%}" if "prediction_error_mean" in r else "-"
            if "prediction_error_mean_drift_corrected" in r:
                error += f" ({r['prediction_error_mean_drift_corrected']:.1%})"
            split = r.get("prediction_split") or []
            parts = (f"{mean_abs(x['acceptance'] for x in split):.1%} / {mean_abs(x['steps'] for x in split):.1%}"
                     if split else "-")
            print(f"  {r['profile']} | {'yes' if same else 'no'} | {'yes' if r['inside_everywhere'] else 'NO'} | "
                  f"{r['share']:.0%} | {r['grid_loads']}/{r['tune_loads']} ({r['rules_floor']['oracle_loads']}) | "
                  f"{error} | {parts}")
        (args.runs_dir / "summary.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
