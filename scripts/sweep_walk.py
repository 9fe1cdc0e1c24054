"""Follow one sweep plan through the code, measured on a real run: the functions it visits and the climbs back up.

    python scripts/sweep_walk.py [--repo DIR]

Runs `sparklab sweep` in this process on a two-server sweep of the stand-in engine as a host process
(tests/fixtures/process/standin-trtedge.yaml: no Docker needed), with a profiler hook on every call. A *step* is a
function of the package that receives the plan: as an argument, or as the `plan` attribute of an argument (a
per-server object carrying it). A *climb* is a call between two such steps from a module to one on a higher level
of the import graph (scripts/import_graph.py; level 0 imports nothing of the package): a callback into a layer
that imported the caller's. Counted once per distinct (caller, callee) pair. `--repo` measures another checkout
(e.g. an older commit) with the same definitions.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _holds_plan(frame: FrameType) -> bool:
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount
    for name in code.co_varnames[:count]:
        value = frame.f_locals.get(name)
        for candidate in (value, getattr(value, "plan", None)):
            kind = type(candidate)
            if kind.__name__ == "Plan" and kind.__module__.endswith("plan"):
                return True
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=HERE.parent)
    args = parser.parse_args()
    repo = args.repo.resolve()
    sys.path.insert(0, str(repo))
    sys.path.insert(0, str(HERE))
    import import_graph

    levels = import_graph.module_levels(repo / "sparklab")
    package = str(repo / "sparklab")
    steps: dict[str, str] = {}
    climbs: set[tuple[str, str]] = set()

    def module_of(frame: FrameType) -> str:
        return str(frame.f_globals.get("__name__", ""))

    def hook(frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(package) or not _holds_plan(frame):
            return
        name = f"{module_of(frame)}.{frame.f_code.co_qualname}"
        steps.setdefault(name, module_of(frame))
        caller = frame.f_back
        while caller is not None and f"{module_of(caller)}.{caller.f_code.co_qualname}" not in steps:
            caller = caller.f_back
        if caller is not None:
            here, there = module_of(caller), module_of(frame)
            if levels.get(there, -1) > levels.get(here, -1):
                climbs.add((f"{here}.{caller.f_code.co_qualname}", name))

    with tempfile.TemporaryDirectory(prefix="sparklab-walk-") as scratch:
        work = Path(scratch)
        sweep = work / "walk.yaml"
        sweep.write_text(
            "name: walk\n"
            f"recipe: {repo / 'tests' / 'fixtures' / 'process' / 'standin-trtedge.yaml'}\n"
            "methods: [none, dspark]\nnum_speculative_tokens: [3]\nconcurrency: [1]\nrequests: 2\nwarmup: 0\n"
            "workloads: [seed]\nsampling: {max_tokens: 8, temperature: 0}\n"
            f"set: [standin_dir={repo / 'docker' / 'standin'}, engines.edgellm.port={_free_port()}]\n")
        os.environ["SPARKLAB_STATE"] = str(work / "state")
        entry = None
        for module in ("sparklab.cli.main", "sparklab.cli"):
            try:
                entry = __import__(module, fromlist=["main"]).main
                break
            except (ImportError, AttributeError):
                continue
        assert entry is not None, f"no sparklab CLI under {repo}"
        threading.setprofile(hook)
        sys.setprofile(hook)
        try:
            code = entry(["sweep", str(sweep), "--runs-dir", str(work / "runs"), "--no-download"])
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    files = sorted({m for m in steps.values()})
    print(f"sweep exit code: {code}")
    print(f"steps (functions that receive the plan): {len(steps)}")
    print(f"files: {len(files)}")
    print(f"climbs (calls up to a higher import level): {len(climbs)}")
    for name in steps:
        print(f"  step {name}")
    for caller, callee in sorted(climbs):
        print(f"  climb {caller} -> {callee}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
