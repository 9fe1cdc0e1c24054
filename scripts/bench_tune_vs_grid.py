"""`sparklab tune` against the full grid on the same space, with the real engine: wall time, model loads, the pick
per concurrency, the grid's interval of its best, and the error of tune's predicted tok/s for the K it did not
load (against the grid's measurement of that K).

    python scripts/bench_tune_vs_grid.py                      # recipes/sweeps/cpu-tune.yaml: grid, tune, compare
    python scripts/bench_tune_vs_grid.py --only grid          # one side (the other can run later)
    python scripts/bench_tune_vs_grid.py --only compare --runs-dir DIR

Each side runs as `python -m sparklab sweep|tune` while holding /tmp/sparklab-docker.lock (the same flock(2)
lock as `flock /tmp/sparklab-docker.lock …`); its wall time is timed from when the lock is held, so waiting for
another user of Docker does not count. A model load is a `server …: starting` line (retried starts included).
Both sides run with the space file's repeats; tune with --max-repeats equal to them, so that each measured
cell has as many runs as the grid's. Not part of the test suite: one comparison takes about 15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sparklab.recipes.plan import build_plan
from sparklab.recipes.schema import recipes_dir
from sparklab.sweep.store import Store
from sparklab.tune import driver, search

LOCK = Path("/tmp/sparklab-docker.lock")


def timed_run(argv: list[str], log: Path) -> dict[str, Any]:
    """Run argv holding the Docker lock; wall time from the lock held to exit, and the model loads it made."""
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True)
        wall = time.monotonic() - started
    log.write_text(f"$ {' '.join(argv)}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    if done.returncode != 0:
        sys.exit(f"{argv[3]} failed with exit code {done.returncode}; see {log}")
    loads = sum(1 for line in done.stderr.splitlines() if ": starting (" in line and "server " in line)
    return {"wall_s": round(wall, 1), "loads": loads, "log": str(log)}


def run_side(side: str, space: Path, runs: Path) -> None:
    repeats = str(build_plan(space).sweep.repeats)
    argv = [sys.executable, "-m", "sparklab", "sweep" if side == "grid" else "tune", str(space), "--runs-dir",
            str(runs / side)]
    if side == "tune":
        argv += ["--repeats", repeats, "--max-repeats", repeats, "--new"]
    figures = timed_run(argv, runs / f"{side}.log")
    (runs / f"{side}.json").write_text(json.dumps(figures))
    print(f"{side}: {figures['wall_s']:.0f} s, {figures['loads']} model loads", flush=True)


def _store(runs: Path, side: str) -> Path:
    found = sorted((runs / side).glob("*/results.sqlite"), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit(f"{runs / side}: no run found; run --only {side} first")
    return found[-1]


def compare(space_path: Path, runs: Path) -> dict[str, Any]:
    """The grid's pick by tune's own rule (best mean; a smaller K whose interval overlaps it wins), against tune's."""
    plan = build_plan(space_path)
    space = driver.space_of(plan)
    repeats = int(plan.sweep.repeats)
    with Store.open(_store(runs, "grid"), readonly=True) as store:
        grid_obs = driver.observations(store, plan, "aggregate")
    grid = search.decide(space, search.Settings(repeats, repeats), grid_obs)
    assert isinstance(grid, search.Done), "the grid measured every config: nothing should be left to load"
    with Store.open(_store(runs, "tune"), readonly=True) as store:
        state = json.loads(store.meta()["tune"])
    sides = {side: json.loads((runs / f"{side}.json").read_text()) for side in ("grid", "tune")}
    print(f"space: {space_path.name}: {', '.join(space.methods)}; K {min(space.ks)}-{max(space.ks)}; "
          f"C {', '.join(map(str, space.concurrencies))}; {repeats} repeats of every measured cell")
    g, t = sides["grid"], sides["tune"]
    share = t["wall_s"] / g["wall_s"]
    print(f"wall time: grid {g['wall_s']:.0f} s, tune {t['wall_s']:.0f} s ({share:.0%} of the grid)")
    print(f"model loads: grid {g['loads']}, tune {t['loads']}")
    picks = {p["concurrency"]: p for p in state["picks"]}
    for pick in grid.picks:
        mine = picks.get(pick.concurrency)
        e = pick.estimate
        interval = f"[{e.low:.2f}, {e.high:.2f}]" if e.low is not None else "(single run)"
        tied = f"; overlapping it: {', '.join(search.label(x) for x in pick.overlapping)}" if pick.overlapping else ""
        best = grid_obs[pick.best_mean][pick.concurrency].values
        best_e = search.estimate(best)
        assert best_e is not None
        within = ""
        if mine is not None:
            chosen = grid_obs.get((mine["method"], mine["k"]), {}).get(pick.concurrency)
            grid_value = sum(chosen.values) / len(chosen.values) if chosen and chosen.values else None
            inside = (best_e.low is not None and grid_value is not None and best_e.low <= grid_value)
            within = (f"; tune's pick measured {grid_value:.2f} in the grid, "
                      f"{'inside' if inside else 'outside'} the grid best's interval" if grid_value else "")
        print(f"C={pick.concurrency}: grid best mean {search.label(pick.best_mean)} {best_e.mean:.2f} tok/s "
              f"[{best_e.low:.2f}, {best_e.high:.2f}], grid pick {search.label(pick.config)} {e.mean:.2f} {interval}"
              f"{tied}; tune pick {mine['label'] if mine else 'none'}{within}")
    errors = []
    for row in state["predictions"]:
        if row["measured"] is not None:
            continue  # tune loaded it: its prediction is a leave-one-out check, not what this measures
        cell = grid_obs.get((row["method"], row["k"]), {}).get(row["concurrency"])
        if cell and cell.values:
            truth = sum(cell.values) / len(cell.values)
            errors.append(row["predicted"] / truth - 1)
            print(f"  not loaded by tune: {row['method']} K={row['k']} C={row['concurrency']}: predicted "
                  f"{row['predicted']:.2f}, grid {truth:.2f} ({errors[-1]:+.1%})")
    if errors:
        print(f"prediction error over {len(errors)} unloaded (K, C): mean |error| "
              f"{sum(abs(e) for e in errors) / len(errors):.1%}, max {max(abs(e) for e in errors):.1%}")
    for note in state.get("notes", []):
        print(f"tune note: {note}")
    return {"grid": g, "tune": t, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", type=Path, default=recipes_dir() / "sweeps" / "cpu-tune.yaml")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/tune-vs-grid"))
    parser.add_argument("--only", choices=["grid", "tune", "compare"])
    args = parser.parse_args()
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    for side in ("grid", "tune"):
        if args.only in (None, side):
            run_side(side, args.space, args.runs_dir)
    if args.only in (None, "compare"):
        compare(args.space, args.runs_dir)


if __name__ == "__main__":
    main()
