#!/usr/bin/env python3
"""How much the engine cache saves: time to ready of the real vLLM CPU engine with torch.compile on.

Per round, with a fresh, empty cache directory (sparklab's engine cache, one directory per image digest):
  cold   ngram K=1, empty cache (the first start of a sweep)
  same   ngram K=1 again (a second server of the same config, e.g. after a crash or in the next sweep)
  new-k  ngram K=3 (the next server of a K sweep: same model, different speculative config)
Rounds interleave the three, so a change in machine load hits all of them alike. Each start is measured the
way `sparklab up` measures it (container start until /v1/models answers 200, sparklab's monotonic clock),
and the ratios are against the cold start of the same round.

Needs the compiler variant of the CPU image (the plain one cannot torch.compile without a C++ compiler):
    docker/vllm-cpu/build-cc.sh && python scripts/bench_engine_cache.py [--rounds 2] [--json out.json]
Not a test: it takes about 5 minutes per round on 2 busy cores. Never imported by the package.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from sparklab.errors import SparklabError
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import parse_recipe, read_yaml, recipes_dir
from sparklab.runtimes import launch
from sparklab.runtimes.container_server import teardown
from sparklab.runtimes.containers import Docker
from sparklab.sweep import rundir

IMAGE = "127.0.0.1:5000/sparklab/vllm-cpu:0.27.1-cc"
BENCH_LABEL = "sparklab-bench.pid"
KINDS = ("cold", "same", "new-k")
# How each start got its compiled model, from vLLM 0.27.1's own log lines (vllm/compilation/decorators.py).
COMPILE_LINES = {
    "loaded": re.compile(r"Directly load AOT compilation|Directly load the compiled graph"),
    "recompiled after a load failure": re.compile(r"Compiling model again due to a load failure"),
}


def compiled_recipe(image: str) -> Any:
    """recipes/cpu.yaml without --enforce-eager (torch.compile on), on the compiler image."""
    path = recipes_dir() / "cpu.yaml"
    data = read_yaml(path)
    engine = data["engines"]["vllm-cpu"]
    engine["args"] = [a for a in engine["args"] if a != "--enforce-eager"]
    engine["env"].pop("TORCHDYNAMO_DISABLE", None)  # the eager recipe's switch: compile is what is measured here
    engine["image"] = image
    return parse_recipe(data, f"{path} (compiled)")


def start_once(recipe: Any, docker: Docker, k: int, cache_root: Path, port: int, env: tuple[str, ...]
               ) -> dict[str, Any]:
    options = LaunchOptions(num_speculative_tokens=k, port=port, api_key=False, engine_cache_root=cache_root,
                            gpus=False, env=env, run_id=rundir.new_run_id(), mode="up")
    prepared = launch.checked(recipe, render(recipe, None, "ngram", options), check_host=False)
    # Without the bare `sparklab` label: tests running beside the benchmark remove every labelled container
    # that appears during them (tests/dockerkit.py). The server handle still tears it down on every path.
    labels = {**{k: v for k, v in prepared.spec.labels.items() if k != "sparklab"}, BENCH_LABEL: str(os.getpid())}
    prepared.spec = dataclasses.replace(prepared.spec, labels=labels, name=f"{prepared.spec.name}-bench")
    ready = launch.start(prepared, docker, pull_policy="missing")
    with ready.server:
        text = ready.server.full_log()
        how = next((name for name, line in COMPILE_LINES.items() if line.search(text)), "no AOT line")
        return {"k": k, "seconds": ready.seconds_to_ready, "compile": how}


def run_round(recipe: Any, number: int, port: int, env: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    docker = Docker()
    with tempfile.TemporaryDirectory(prefix="sparklab-engine-cache-bench-") as tmp:
        root = Path(tmp) / "engine-cache"
        this: dict[str, dict[str, Any]] = {}
        for kind, k in zip(KINDS, (1, 1, 3), strict=True):
            this[kind] = start_once(recipe, docker, k, root, port, env)
            print(f"round {number} {kind:5} K={k}: ready in {this[kind]['seconds']:6.1f} s "
                  f"({this[kind]['compile']})", flush=True)
        return this


def remove_leftovers() -> None:
    """A server whose teardown failed with the daemon away (it carries no `sparklab` label for `gc` to find)."""
    with contextlib.suppress(SparklabError, requests.RequestException):
        docker = Docker()
        for container in docker.client.containers.list(all=True, filters={"label": f"{BENCH_LABEL}={os.getpid()}"}):
            teardown(container, grace_s=5)


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    median = statistics.median(values)
    return f"{median:.2f} (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default=IMAGE)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=18431)
    parser.add_argument("-e", "--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for the engine (e.g. VLLM_USE_AOT_COMPILE=0)")
    parser.add_argument("--json", type=Path, help="write every start here")
    args = parser.parse_args()

    recipe = compiled_recipe(args.image)
    rounds: list[dict[str, dict[str, Any]]] = []
    began = time.monotonic()
    tries = 0
    while len(rounds) < args.rounds and tries < args.rounds + 3:
        tries += 1
        try:
            rounds.append(run_round(recipe, len(rounds) + 1, args.port, tuple(args.env)))
        except (SparklabError, requests.RequestException) as exc:
            # A shared machine: another job may restart the Docker daemon or kill containers. Redo the round.
            print(f"round {len(rounds) + 1} lost ({str(exc).splitlines()[0]}); starting it again", flush=True)
            time.sleep(15)
            remove_leftovers()
    print(f"\n{args.rounds} rounds in {time.monotonic() - began:.0f} s; image {args.image}; env {args.env or '-'}")
    print("time to ready, median (min, max, n):")
    for kind in KINDS:
        print(f"  {kind:5}  {spread([r[kind]['seconds'] for r in rounds])} s")
    print("ratio to the cold start of the same round, median (min, max, n):")
    for kind in KINDS[1:]:
        print(f"  {kind:5}  {spread([r[kind]['seconds'] / r['cold']['seconds'] for r in rounds])}")
    if args.json:
        args.json.write_text(json.dumps({"image": args.image, "env": args.env, "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
