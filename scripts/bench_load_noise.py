"""Load-to-load noise on the real vLLM 0.27.1 CPU engine: how much of a run's variance comes from which server start
it ran on, and how often the grid's "best" flips between two full sweeps of cpu-demo.

    python scripts/bench_load_noise.py                 # both parts, then the figures
    python scripts/bench_load_noise.py --only loads    # none and ngram K=3, 3 loads each in ABBA order
    python scripts/bench_load_noise.py --only demo     # cpu-demo, twice
    python scripts/bench_load_noise.py --only compare --runs-dir DIR

Part 1 (loads): three sweeps of none and ngram K=3 (C 1 and 4, 3 runs per load, the CPU demo's requests and
sampling), the servers in the order none, ngram / ngram, none / none, ngram, so each config is loaded three times in
ABBA order. The between-load share per config and concurrency is the one-way random-effects estimate
(sparklab.bench.noise) from its 3 loads x 3 runs.

Part 2 (demo): `sparklab sweep cpu-demo` twice, one after the other; per engine and concurrency, the report's best
config in each (and its runner-up); a flip is a best that differs. Each config then has two loads (one per sweep),
which gives a second between-load estimate, over a longer gap.

Every sweep runs while holding /tmp/sparklab-docker-tests.lock (flock(2), the shared lock of this machine's Docker
users), taken per sweep; the load average is recorded at each sweep's start and end and per cell in the results.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from sparklab import report
from sparklab.bench import noise
from sparklab.recipes.schema import recipes_dir
from sparklab.report.model import by_load
from sparklab.sweep.store import Store

LOCK = Path("/tmp/sparklab-docker-tests.lock")
ORDERS = (["none", "ngram"], ["ngram", "none"], ["none", "ngram"])


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def sweep(file: Path, runs: Path, log: Path) -> dict[str, Any]:
    argv = [sys.executable, "-m", "sparklab", "sweep", str(file), "--runs-dir", str(runs), "--new"]
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started, load_start = time.monotonic(), loadavg()
        done = subprocess.run(argv, capture_output=True, text=True)
        wall, load_end = time.monotonic() - started, loadavg()
    log.write_text(f"$ {' '.join(argv)}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")
    if done.returncode != 0:
        sys.exit(f"{file.name} failed with exit code {done.returncode}; see {log}")
    print(f"{file.name}: {wall:.0f} s, load average {load_start[0]:.2f} -> {load_end[0]:.2f}", flush=True)
    return {"wall_s": round(wall, 1), "loadavg_start": load_start, "loadavg_end": load_end}


def part_loads(runs: Path) -> None:
    base = yaml.safe_load((recipes_dir() / "sweeps" / "cpu-demo.yaml").read_text())
    for i, methods in enumerate(ORDERS):
        doc = {**base, "name": f"noise-loads-{i}", "engines": ["vllm-cpu"], "methods": methods,
               "num_speculative_tokens": [3], "exclude": [], "recipe": str(recipes_dir() / "cpu.yaml"),
               "description": "load-to-load noise: none and ngram K=3, servers in ABBA order over three sweeps"}
        path = runs / f"noise-loads-{i}.yaml"
        runs.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        figures = sweep(path, runs / "loads", runs / f"noise-loads-{i}.log")
        (runs / f"noise-loads-{i}.json").write_text(json.dumps(figures))


def part_demo(runs: Path) -> None:
    for i in range(2):
        figures = sweep(recipes_dir() / "sweeps" / "cpu-demo.yaml", runs / f"demo-{i}", runs / f"demo-{i}.log")
        (runs / f"demo-{i}.json").write_text(json.dumps(figures))


def _reports(folder: Path) -> list[report.Report]:
    out = []
    for path in sorted(folder.glob("*/results.sqlite"), key=lambda p: p.stat().st_mtime):
        with Store.open(path, readonly=True) as store:
            out.append(report.build(store, path.parent.name))
    return out


def _shares(reports: list[report.Report]) -> dict[str, Any]:
    """Per (engine, method, K) and concurrency: its loads over the given runs, and the between-load share."""
    values: dict[tuple[str, int], list[list[float]]] = {}
    for built in reports:
        for g in built.groups:
            values.setdefault((g.server.label, g.concurrency), []).extend(by_load(g))
    out = {}
    for (label, c), loads in sorted(values.items()):
        comp = noise.components([loads])
        out[f"{label} C={c}"] = {"loads": len(loads), "runs": sum(len(x) for x in loads),
                                 "load_means": [round(sum(x) / len(x), 2) for x in loads],
                                 "within_sd": (comp.within or 0) ** 0.5, "between_sd": (comp.between or 0) ** 0.5,
                                 "between_share": comp.between_share}
    return out


def compare(runs: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    loads = _reports(runs / "loads")
    if loads:
        out["loads"] = _shares(loads)
        print("== part 1: none and ngram K=3, three loads each in ABBA order (3 runs per load)")
        for key, row in out["loads"].items():
            print(f"  {key}: load means {row['load_means']}; sd within a load {100 * row['within_sd']:.1f}%, "
                  f"between loads {100 * row['between_sd']:.1f}%: between-load share "
                  f"{100 * (row['between_share'] or 0):.0f}% of a run's variance")
    demos = [_reports(runs / f"demo-{i}") for i in range(2)]
    if all(demos):
        first, second = demos[0][-1], demos[1][-1]
        flips = []
        for a in first.best:
            b = next((x for x in second.best if (x.workload, x.concurrency, x.group.server.engine)
                      == (a.workload, a.concurrency, a.group.server.engine)), None)
            if b is None:
                continue
            flips.append({"engine": a.group.server.engine, "concurrency": a.concurrency,
                          "first": a.group.server.label, "second": b.group.server.label,
                          "flipped": a.group.server.label != b.group.server.label,
                          "first_runner_up": a.runner_up.server.label if a.runner_up else None,
                          "second_runner_up": b.runner_up.server.label if b.runner_up else None})
        out["flips"] = flips
        out["demo"] = _shares([first, second])
        flipped = sum(f["flipped"] for f in flips)
        print(f"== part 2: cpu-demo twice: the best flipped at {flipped} of {len(flips)} (engine, concurrency)")
        for f in flips:
            print(f"  {f['engine']} C={f['concurrency']}: {f['first']} then {f['second']}"
                  + (" FLIP" if f["flipped"] else ""))
        print("  between-load share from the two sweeps (each config loaded once per sweep):")
        for key, row in out["demo"].items():
            print(f"    {key}: load means {row['load_means']}, between-load share "
                  f"{100 * (row['between_share'] or 0):.0f}%")
    (runs / "noise.json").write_text(json.dumps(out, indent=1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/load-noise"))
    parser.add_argument("--only", choices=["loads", "demo", "compare"])
    args = parser.parse_args()
    if args.only in (None, "loads"):
        part_loads(args.runs_dir)
    if args.only in (None, "demo"):
        part_demo(args.runs_dir)
    if args.only in (None, "compare"):
        compare(args.runs_dir)


if __name__ == "__main__":
    main()
