"""The orchestrator: for each server config (outer loop) start one server, run its pending cells (inner loop)
on it, tear it down, and record every outcome in the run's SQLite store, so an interrupted run resumes.

A server that cannot start fails only its own cells; a cell whose requests all fail is retried on the next
run until it has failed `max_attempts` times. Ctrl-C / SIGTERM tear the current server down and leave the
cell in flight pending. SIGKILL loses at most that cell: the next run resets it and removes the container.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import requests

from sparklab import __version__, bench, launch, preflight, scrape
from sparklab.containers import Docker, Server
from sparklab.errors import ContainerError, NotReadyError, PreflightError, SparklabError
from sparklab.plan import Plan, ServerConfig, TimingModel
from sparklab.recipes import load_hardware, stored_facts
from sparklab.records import Sampling
from sparklab.store import PlannedCell, Store
from sparklab.workloads import load_workload

log = logging.getLogger(__name__)

Say = Callable[[str], None]


@dataclass
class Options:
    pull_policy: str = "missing"
    drop_caches: bool = False
    port_wait_s: float = 60.0
    memory_wait_s: float = 120.0


def host_facts() -> dict[str, Any]:
    available, total = preflight.mem_available_gib()
    return {"hostname": platform.node(), "machine": platform.machine(), "python": platform.python_version(),
            "kernel": platform.release(), "mem_total_gib": round(total, 1),
            "mem_available_gib_at_start": round(available, 1), "sparklab": __version__}


def _wait_port_free(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while preflight.port_in_use(host, port):
        if time.monotonic() > deadline:
            raise PreflightError(f"port {port} is still in use {timeout_s:.0f} s after the previous server",
                                 "Something else listens there: stop it or change the recipe's port.")
        time.sleep(0.5)


def _wait_memory(baseline_gib: float, timeout_s: float, say: Say) -> None:
    """GB10 memory is unified: wait until what the previous server held is available again."""
    deadline = time.monotonic() + timeout_s
    while True:
        available, _ = preflight.mem_available_gib()
        if available >= baseline_gib - 1.0 or time.monotonic() > deadline:
            if available < baseline_gib - 1.0:
                say(f"memory: {available:.1f} GiB available, {baseline_gib:.1f} GiB before the last server; "
                    f"going on after {timeout_s:.0f} s")
            return
        time.sleep(1.0)


def _drop_caches(say: Say) -> None:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        say("dropped the page cache (drop_caches)")
    except OSError as exc:
        say(f"could not drop the page cache ({exc}); run as root or leave --drop-caches off")


def _reset_prefix_cache(server: Server) -> None:
    """vLLM serves POST /reset_prefix_cache when VLLM_SERVER_DEV_MODE=1 (the sweep sets it)."""
    if server.spec.kind != "vllm":
        return
    with contextlib.suppress(requests.RequestException):
        requests.post(server.spec.endpoint + "/reset_prefix_cache", timeout=30)


def timing_model(plan: Plan, history: list[Path]) -> TimingModel:
    """A first guess per hardware, refined from earlier runs of the same recipe (ready time, tok/s at c=1)."""
    recipe = plan.servers[0].recipe
    model = TimingModel() if recipe.hardware else TimingModel(startup_s=45.0, tokens_per_s=15.0)
    ready, tps = [], []
    for path in history:
        try:
            with Store.open(path) as old:
                configs = [s for s in old.server_configs() if s.config.get("recipe") == recipe.name]
                ready += [s.ready_s for s in configs if s.ready_s]
                ids = {s.id for s in configs}
                tps += [c.summary["aggregate_tps"] for c in old.cells("done")
                        if c.server_config_id in ids and c.concurrency == 1 and c.summary]
        except SparklabError:
            continue
    if ready:
        model = replace(model, startup_s=sum(ready) / len(ready))
    if tps:
        model = replace(model, tokens_per_s=sum(tps) / len(tps))
    return model


def register(plan: Plan, store: Store) -> int:
    """Put the plan into the store (idempotent: a run started again adds only what is new)."""
    devices = load_hardware()
    for server in plan.servers:
        # The spec holds no secret: the API key is the placeholder "<redacted:api-key>" or an env var name.
        argv = [*server.spec.entrypoint, *server.spec.argv]
        store.add_server_config(server.id, engine=server.engine, method=server.method, k=server.num_speculative_tokens,
                                config={"recipe": server.recipe.name, "overrides": list(server.overrides),
                                        "serve_args": list(server.serve_args), "kind": server.spec.kind,
                                        "label": server.label, **stored_facts(server.recipe, devices)},
                                argv=argv, image=server.spec.image)
    settings = {"warmup": plan.sweep.warmup, "stream": plan.sweep.stream, "duration_s": plan.sweep.duration_s,
                "sampling": plan.sweep.sampling.model_dump()}
    return store.add_cells(
        PlannedCell(c.id, server.id, c.concurrency, c.workload, c.repeat, {**settings, "requests": c.requests})
        for server in plan.servers for c in server.cells)


def run(plan: Plan, store: Store, docker: Docker, run_dir: Path, options: Options, say: Say) -> dict[str, int]:
    for cell_id in store.reset_interrupted(plan.sweep.max_attempts):
        say(f"cell {cell_id} was in flight when sparklab stopped; it runs again")
    for info in docker.gc():
        say(f"removed leftover container {info.name} (its sparklab process is gone)")
    baseline, _ = preflight.mem_available_gib()
    started, done_at_start = time.monotonic(), store.counts()["done"]

    def say_progress(message: str) -> None:
        say(f"{message} {_progress(store, started, done_at_start)}")

    for server in plan.servers:
        pending = {c.id for c in store.pending_cells()}
        cells = [c for c in server.cells if c.id in pending]
        if not cells:
            continue
        if options.drop_caches:
            _drop_caches(say)
        _wait_memory(baseline, options.memory_wait_s, say)
        _run_server(plan, store, docker, run_dir, options, server, cells, say_progress)
    return store.counts()


def _run_server(plan: Plan, store: Store, docker: Docker, run_dir: Path, options: Options, server: ServerConfig,
                cells: list, say: Say) -> None:
    spec = server.spec
    max_attempts = plan.sweep.max_attempts
    say(f"server {server.label}: starting ({len(cells)} cells; {spec.image})")
    try:
        _wait_port_free(spec.host, spec.port, options.port_wait_s)
        preflight.raise_errors(preflight.check_host(spec, server.recipe))
        p = launch.Plan(server.recipe, spec)
        ready = launch.start(p, docker, pull_policy=options.pull_policy,
                             log_path=run_dir / "logs" / f"{server.id}-{server.engine}-{server.method}.log")
    except (NotReadyError, ContainerError, PreflightError) as exc:
        kind = _failure_kind(exc)
        code = getattr(exc, "container_exit_code", None)
        store.fail_server_config(server.id, kind, exc.message, exit_code=code,
                                 log_tail=getattr(exc, "log_tail", None), max_attempts=max_attempts)
        say(f"server {server.label}: failed ({kind}): {exc.message.splitlines()[0]}")
        return
    store.record_server_start(server.id, image_digest=ready.image.digest, startup_facts=ready.facts.as_dict(),
                              ready_s=ready.seconds_to_ready, log_path=str(ready.server.log_path),
                              engine_version=_engine_version(ready))
    say(f"server {server.label}: ready in {ready.seconds_to_ready:.1f} s")
    with ready.server:
        for cell in cells:
            running, code = ready.server.state()
            if not running:
                tail = ready.server.log_tail(50)
                store.fail_server_config(server.id, "oom" if code == 137 else "exited",
                                         f"the server exited with code {code} during the sweep", exit_code=code,
                                         log_tail=tail, max_attempts=max_attempts)
                say(f"server {server.label}: exited with code {code}; its remaining cells failed")
                return
            _run_cell(plan, store, ready, server, cell, say)


def _run_cell(plan: Plan, store: Store, ready: launch.Ready, server: ServerConfig, cell: Any, say: Say) -> None:
    sweep = plan.sweep
    store.start_cell(cell.id)
    s = sweep.sampling
    sampling = Sampling(max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p, ignore_eos=s.ignore_eos,
                        min_tokens=s.min_tokens, enable_thinking=s.enable_thinking, seed=s.seed)
    load = bench.Load(concurrency=cell.concurrency, requests=cell.requests, duration_s=sweep.duration_s,
                      warmup=sweep.warmup, stream=sweep.stream)
    endpoint = bench.Endpoint(ready.server.spec.endpoint, ready.api_key, None)
    name = f"{server.label} c={cell.concurrency} {cell.workload} #{cell.repeat}"
    try:
        result = bench.run(endpoint, load_workload(cell.workload), sampling, load)
    except SparklabError as exc:
        store.fail_cell(cell.id, "bench_error", exc.message, max_attempts=sweep.max_attempts)
        say(f"cell {name}: failed: {exc.message}")
        return
    if ready.server.spec.kind == "sglang":  # no acceptance counters: its `accept len` log lines in the window
        since = result["measurement"]["window_started_at"]
        result["speculative_log"] = scrape.log_acceptance(ready.server.log_since(since))
    summary = result["summary"]
    if not summary["requests"]["ok"]:
        errors = "; ".join(summary["requests"]["first_errors"]) or "no request succeeded"
        store.fail_cell(cell.id, "bench_error", errors, max_attempts=sweep.max_attempts)
        say(f"cell {name}: every request failed: {errors}")
        return
    store.finish_cell(cell.id, summary, result)
    _reset_prefix_cache(ready.server)
    say(f"cell {name}: {summary['aggregate_tps']:.2f} tok/s aggregate, "
        f"{summary['requests']['ok']}/{summary['requests']['measured']} ok")


def _engine_version(ready: launch.Ready) -> str | None:
    """vLLM's GET /version (SGLang answers /get_model_info instead; then None)."""
    try:
        response = requests.get(ready.server.spec.endpoint + "/version", timeout=10)
        return str(response.json().get("version")) if response.status_code == 200 else None
    except (requests.RequestException, ValueError):
        return None


def _progress(store: Store, started: float, done_at_start: int) -> str:
    counts = store.counts()
    left = counts["pending"] + counts["running"]
    finished = counts["done"] - done_at_start
    eta = ""
    if finished and left:
        per_cell = (time.monotonic() - started) / finished
        eta = f", about {per_cell * left / 60:.0f} min left at this run's pace"
    return f"[{counts['done']} done, {counts['failed']} failed, {left} left{eta}]"


def _failure_kind(exc: SparklabError) -> str:
    if isinstance(exc, NotReadyError):
        if exc.container_exit_code == 137:
            return "oom"
        return "exited" if exc.container_exit_code is not None else "not_ready"
    return "preflight" if isinstance(exc, PreflightError) else "container"
