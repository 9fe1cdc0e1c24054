"""The orchestrator: for each server config (outer loop) start one server, run its pending cells (inner loop)
on it, tear it down, and record every outcome in the run's SQLite store, so an interrupted run resumes.

A server that cannot start fails only its own cells; a cell whose requests all fail is retried on the next
run until it has failed `max_attempts` times. Ctrl-C / SIGTERM tear the current server down and leave the
cell in flight pending. SIGKILL loses at most that cell: the next run resets it and removes the container.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sparklab import __version__
from sparklab.bench import cell as bench
from sparklab.bench.workloads import load_workload
from sparklab.engines import engine
from sparklab.engines.api import EngineAPI
from sparklab.engines.logwatch import CAUSE_LINES, fatal_error, headline
from sparklab.engines.scrape import exit_code_meaning
from sparklab.errors import (
    ContainerError,
    DiskFullError,
    MemoryFloorError,
    NotReadyError,
    PreflightError,
    SparklabError,
)
from sparklab.host import memory, preflight, watchdog
from sparklab.recipes.hosts import LOOPBACK, Host, parse_hosts, redact_url
from sparklab.recipes.plan import Plan, ServerConfig, TimingModel, build_plan, estimate_seconds, load_sweep, recipe_file
from sparklab.recipes.schema import load_hardware, stored_facts
from sparklab.records import BenchResult, Sampling
from sparklab.runtimes import cluster, launch
from sparklab.runtimes.containers import Docker
from sparklab.runtimes.local import Runtime
from sparklab.sweep import fleet, provenance, repeats, rundir
from sparklab.sweep.store import PlannedCell, Store

log = logging.getLogger(__name__)

Say = Callable[[str], None]


@dataclass
class Options:
    pull_policy: str = "missing"
    # None: free the model files' page cache when MemFree is short on unified memory; True: for any recipe
    # (`--drop-caches`); False: never (`--no-drop-caches`). See memory.free_page_cache.
    drop_caches: bool | None = None
    port_wait_s: float = 60.0
    memory_wait_s: float = 120.0
    min_free_mib: float = 256.0  # free space the runs directory needs before each server
    memory_floor_gib: float | None = None  # --memory-floor-gib; None: the sweep file's, else memwatch.floor_for
    allow_drift: bool = False  # --allow-drift: resume even if the recipe, sampling or an image digest changed


@dataclass(frozen=True)
class Request:
    """What `sparklab sweep` was asked: the file, where runs live, which run, and how to run it."""

    file: Path
    runs_dir: Path = Path("runs")
    resume: str | None = None  # a run directory name under runs_dir
    new: bool = False  # a new run even if an earlier one of this sweep can continue
    retry_failed: bool = False
    ulimits: tuple[str, ...] = ()
    options: Options = field(default_factory=Options)
    download: bool = True  # every model and draft into the Hugging Face cache before the first server
    hosts: tuple[str, ...] = ()  # --host: Docker hosts instead of the sweep file's hosts:


@dataclass
class Outcome:
    run_dir: Path
    counts: dict[str, int]
    interrupted: bool = False

    @property
    def complete(self) -> bool:
        return not self.interrupted and self.counts.get("failed", 0) == 0 and self.counts.get("pending", 0) == 0


def host_facts() -> dict[str, Any]:
    available, total = preflight.mem_available_gib()
    return {"hostname": platform.node(), "machine": platform.machine(), "python": platform.python_version(),
            "kernel": platform.release(), "mem_total_gib": round(total, 1),
            "mem_available_gib_at_start": round(available, 1), "sparklab": __version__}


def _wait_port_free(host: str, port: int, timeout_s: float, address: str | None = None) -> None:
    """address: another machine's, where a listener is found by connecting (a bind here says nothing)."""
    deadline = time.monotonic() + timeout_s
    while preflight.port_answers(address, port) if address else preflight.port_in_use(host, port):
        if time.monotonic() > deadline:
            raise PreflightError(f"port {port} is still in use {timeout_s:.0f} s after the previous server",
                                 "Something else listens there: stop it or change the recipe's port.")
        time.sleep(0.5)


def _wait_memory(baseline_gib: float, timeout_s: float, say: Say, server: ServerConfig | None = None) -> None:
    """GB10 memory is unified: wait until what the previous server held is available again, or, judged as
    the next engine will, until MemFree covers its share."""
    deadline = time.monotonic() + timeout_s
    while True:
        host = memory.read_meminfo()
        available = host.available_gib
        need = memory.unified_need(server.spec, server.recipe, host) if server is not None else None
        if need is not None and host.free_gib >= need.gib:
            return
        if available >= baseline_gib - 1.0 or time.monotonic() > deadline:
            if available < baseline_gib - 1.0:
                say(f"memory: {available:.1f} GiB available, {baseline_gib:.1f} GiB before the last server; "
                    f"going on after {timeout_s:.0f} s")
            return
        time.sleep(1.0)


def timing_model(plan: Plan, history: list[Path]) -> TimingModel:
    """A first guess per hardware, refined from earlier runs of the same recipe (ready time, tok/s at c=1)."""
    recipe = plan.servers[0].recipe
    model = TimingModel() if recipe.hardware else TimingModel(startup_s=45.0, tokens_per_s=15.0)
    ready, tps = [], []
    for path in history:
        try:
            with Store.open(path, readonly=True) as old:  # another run's file: read, never migrated
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


def register(plan: Plan, store: Store, only: Callable[[ServerConfig, Any], bool] | None = None) -> int:
    """Put the plan into the store (idempotent: a run started again adds only what is new); `only`: the cells
    to add (every server config is added), for `sparklab tune`, which plans its cells as it goes."""
    devices = load_hardware()
    for server in plan.servers:
        # The spec holds no secret: the API key is the placeholder "<redacted:api-key>" or an env var name.
        argv = [*server.spec.entrypoint, *server.spec.argv]
        store.add_server_config(server.id, engine=server.engine, method=server.method, k=server.num_speculative_tokens,
                                config={"recipe": server.recipe.name, "overrides": list(server.overrides),
                                        "serve_args": list(server.serve_args), "kind": server.spec.kind,
                                        "runtime": server.spec.runtime,
                                        "label": server.label, **stored_facts(server.recipe, devices, server.engine)},
                                argv=argv, image=server.spec.image)
    settings = {"warmup": plan.sweep.warmup, "stream": plan.sweep.stream, "duration_s": plan.sweep.duration_s,
                "sampling": plan.sweep.sampling.model_dump()}
    return store.add_cells(
        PlannedCell(c.id, server.id, c.concurrency, c.workload, c.repeat, {**settings, "requests": c.requests})
        for server in plan.servers for c in server.cells if only is None or only(server, c))


def run(plan: Plan, store: Store, docker: Runtime | Docker | None, run_dir: Path, options: Options, say: Say,
        hosts: list[Host] | None = None) -> dict[str, int]:
    """Run what is pending: on the local engine one server after another, or over several Docker hosts
    (sparklab.fleet), each host one server at a time."""
    need = max((fleet.nodes_of(s) for s in plan.servers), default=1)
    if need > len(hosts or [None]):
        raise PreflightError(f"{plan.source}: a server of this sweep runs across {need} hosts; the sweep has "
                             f"{len(hosts or [None])}",
                             "List the hosts in the sweep file (hosts: [local, ssh://me@spark-2]) or give --host "
                             "once per host; each names its cluster_address (and interface, ib_hca) for the link.")
    for cell_id in store.reset_interrupted(plan.sweep.max_attempts):
        say(f"cell {cell_id} was in flight when sparklab stopped; it runs again")
    started, done_at_start = time.monotonic(), store.counts()["done"]

    def say_progress(message: str) -> None:
        say(f"{message} {_progress(store, started, done_at_start)}")

    if hosts and (len(hosts) > 1 or not hosts[0].local):
        local = docker.docker if isinstance(docker, Runtime) else docker  # fleet hosts are Docker engines
        members = fleet.connect(hosts, say, local=local, pull_policy=options.pull_policy)
        store.set_host_facts({"docker_hosts": {m.name: {"docker": redact_url(m.host.docker), "address": m.host.address,
                                                        "port_offset": m.host.port_offset, **m.facts}
                                               for m in members}, "bench_client": "controller"})
        for member in members:
            for info in member.docker.gc():
                say(f"[{member.name}] removed leftover {info.noun} {info.name} (its sparklab process is gone)")
        baseline, _ = preflight.mem_available_gib()

        def serve(member: fleet.Member, server: ServerConfig, hstore: Any, host_say: Say,
                  partners: list[fleet.Member] | None = None) -> None:
            pending = {c.id for c in hstore.pending_cells()}
            cells = [c for c in server.cells if c.id in pending]
            if cells:
                _serve(plan, hstore, member.docker, run_dir, options, server, cells, host_say, baseline,
                       local=member.host.local, lost=lambda: not member.docker.alive(),
                       partners=[p.docker for p in partners or []])

        fleet.run(plan, store, members, serve, say_progress, run_dir.name)
        return store.counts()
    assert docker is not None
    for info in docker.gc():
        say(f"removed leftover {info.noun} {info.name} (its sparklab process is gone)")
    baseline, _ = preflight.mem_available_gib()
    for server in plan.servers:
        pending = {c.id for c in store.pending_cells()}
        cells = [c for c in server.cells if c.id in pending]
        if cells:
            _serve(plan, store, docker, run_dir, options, server, cells, say_progress, baseline)
    return store.counts()


def _serve(plan: Plan, store: Any, docker: Runtime | Docker, run_dir: Path, options: Options, server: ServerConfig,
           cells: list, say: Say, baseline: float, local: bool = True,
           lost: Callable[[], bool] | None = None, partners: list[Docker] | None = None) -> None:
    """One server config on one Docker host. Memory waits, the page cache and the memory floor are this
    machine's, so only a local server has them. lost: whether the host went away (then HostLost, not a fault)."""
    rundir.check_free_space(run_dir, options.min_free_mib)
    if local:
        _wait_memory(baseline, options.memory_wait_s, say, server)
        if options.drop_caches is not False:
            memory.free_page_cache(server.recipe, server.spec, say, every_recipe=bool(options.drop_caches))
    floor = watchdog.floor_for(server.recipe, options.memory_floor_gib if options.memory_floor_gib is not None
                               else plan.sweep.memory_floor_gib) if local else 0.0
    attempted: set[str] = set()  # cells this server start ran (they counted their attempt)
    try:
        if not local:
            _run_server(plan, store, docker, run_dir, options, server, cells, say, attempted, None, local=False,
                        partners=partners)
            return
        with watchdog.Sampler(floor_gib=floor, locate=lambda name=server.spec.name: docker.container_id(name),
                              on_floor=lambda name=server.spec.name: docker.kill(name)) as watch:
            _run_server(plan, store, docker, run_dir, options, server, cells, say, attempted, watch, partners=partners)
    except (KeyboardInterrupt, DiskFullError, provenance.DriftError):
        raise
    except Exception as exc:  # one fault ends this server's work, never the sweep
        if lost is not None and lost():
            for cell_id in store.host_lost(server.id, getattr(store, "host", ""), _one_line(exc)):
                say(f"cell {cell_id} was running when the host was lost; it runs again")
            raise fleet.HostLost(_one_line(exc)) from exc
        _contain(plan, store, docker, run_dir, server, exc, say, [c.id for c in cells if c.id not in attempted])


def _contain(plan: Plan, store: Any, docker: Runtime | Docker, run_dir: Path, server: ServerConfig, exc: Exception,
             say: Say, not_reached: list[str]) -> None:
    """An unexpected fault in one server's work: its traceback goes to the run's log file (not the console),
    its containers are removed (waiting for a restarting Docker daemon), its unfinished cells fail with one line."""
    reason = _one_line(exc)
    rundir.faults.error("server %s (%s): %s", server.label, server.id, reason, exc_info=exc)
    store.fail_server_config(server.id, "error", f"{reason} (traceback in {run_dir / rundir.LOG_NAME})",
                             max_attempts=plan.sweep.max_attempts, cell_ids=not_reached)
    say(f"server {server.label}: failed (error): {reason}; its unfinished cells go back to the queue; "
        f"details in {run_dir / rundir.LOG_NAME}")
    try:
        for name in docker.remove_run_containers(run_dir.name):
            say(f"removed {name} after the fault")
    except Exception as cleanup:  # the daemon stayed away: say so, the next run's gc removes it
        rundir.faults.error("cleanup after the fault failed: %s", _one_line(cleanup), exc_info=cleanup)
        say(f"could not remove the server's container ({_one_line(cleanup)}); `sparklab gc` removes it later")


def runtime_docker(docker: Runtime | Docker) -> Docker:
    """The Docker engine behind a runtime (a server across hosts runs containers only)."""
    return docker.docker if isinstance(docker, Runtime) else docker


def _one_line(exc: BaseException) -> str:
    text = exc.message if isinstance(exc, SparklabError) else str(exc)
    first = (text.strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:300] if not isinstance(exc, SparklabError) else first[:300]


def _run_server(plan: Plan, store: Any, docker: Runtime | Docker, run_dir: Path, options: Options, server: ServerConfig,
                cells: list, say: Say, attempted: set[str], watch: watchdog.Sampler | None = None,
                local: bool = True, partners: list[Docker] | None = None) -> None:
    spec = server.spec
    max_attempts = plan.sweep.max_attempts
    start_mark = watch.mark() if watch is not None else 0
    say(f"server {server.label}: starting ({len(cells)} cells; {spec.image})")
    try:
        remote = None if local or not spec.address or spec.address in LOOPBACK else spec.address
        _wait_port_free(spec.host, spec.port, options.port_wait_s, remote)
        # another host's memory, port and cache are not this machine's: fleet.unfit and the start check them
        prepared = launch.checked(server.recipe, spec) if local else launch.checked(server.recipe, spec, False)
        if server.cluster is not None:  # one server across hosts: every node in order, readiness on the head
            ready = cluster.start(prepared, server.cluster, [runtime_docker(docker), *(partners or [])],
                                  pull_policy=options.pull_policy, log_dir=run_dir / "logs",
                                  stall_s=plan.sweep.load_stall_s, say=say)
        else:
            ready = launch.start(prepared, docker, pull_policy=options.pull_policy,
                                 log_path=run_dir / "logs" / f"{server.id}-{server.engine}-{server.method}.log",
                                 stall_s=plan.sweep.load_stall_s)
    except (NotReadyError, ContainerError, PreflightError) as exc:
        if watch is not None and watch.tripped:
            _fail_at_floor(store, server, watch, max_attempts, None, say)
            return
        kind = _failure_kind(exc)
        code = getattr(exc, "container_exit_code", None)
        why = f"\n{exc.hint}" if kind in ("fatal", "stalled") and exc.hint else ""  # what died, or what to raise
        store.fail_server_config(server.id, kind, exc.message + why + watchdog.kill_evidence(code, exc),
                                 exit_code=code,
                                 log_tail=getattr(exc, "log_tail", None), max_attempts=max_attempts)
        cause = f" — {why.strip().splitlines()[0]}" if why else ""
        say(f"server {server.label}: failed ({kind}): {headline(exc.message, getattr(exc, 'log_tail', None))}{cause}")
        return
    api = EngineAPI(spec.endpoint, ready.api_key)
    facts = {**ready.facts.as_dict(), **engine(spec.kind).served_facts(api)}
    if watch is not None:
        facts["memory"] = watch.stats(start_mark).as_dict()
    store.record_server_start(server.id, image_digest=ready.image.digest, startup_facts=facts,
                              ready_s=ready.seconds_to_ready, log_path=str(ready.server.log_path),
                              engine_version=engine(spec.kind).version(api))
    say(f"server {server.label}: ready in {ready.seconds_to_ready:.1f} s")
    if ready.watch is not None:  # a dead engine's API server may run on: kill it, so in-flight requests fail now
        ready.watch.on_fatal(ready.server.kill)
    with ready.server:
        _check_image(store, server, ready.image.digest, options.allow_drift, say)
        for i, cell in enumerate(cells):
            # A failure below charges these cells this server start's attempt; a fault after it (removing a
            # container the restarting daemon has lost) must not charge them a second one: they count as attempted.
            rest = [c.id for c in cells[i:]]
            if _engine_died(ready):
                attempted.update(rest)
                _fail_fatal(store, server, ready, max_attempts, rest, say)
                return
            running, code = ready.server.state()
            if not running and watch is not None and watch.tripped:
                attempted.update(rest)
                _fail_at_floor(store, server, watch, max_attempts, rest, say)
                return
            if not running:
                tail = ready.server.log_tail(50)
                oom = ready.server.oom_killed()
                meaning = exit_code_meaning(code, oom, tail) + watchdog.kill_evidence(code, tail, oom)
                attempted.update(rest)
                store.fail_server_config(server.id, _exit_kind(code, oom),
                                         f"the server exited with code {code}{meaning} during "
                                         f"the sweep", exit_code=code, log_tail=tail, max_attempts=max_attempts,
                                         cell_ids=rest)
                say(f"server {server.label}: exited with code {code}; its remaining cells failed")
                return
            if _measured_enough(plan, store, server, cell, say):
                continue
            attempted.add(cell.id)
            try:
                _run_cell(plan, store, ready, server, cell, say, watch)
            except MemoryFloorError:
                attempted.update(rest)
                _fail_at_floor(store, server, watch, max_attempts, rest, say)
                return
        if _engine_died(ready):  # during the last cell
            _fail_fatal(store, server, ready, max_attempts, [], say)


def _measured_enough(plan: Plan, store: Store, server: ServerConfig, cell: Any, say: Say) -> bool:
    """`repeats: auto`: skip this repeat when the load's earlier runs already pin its mean down."""
    sweep = plan.sweep
    if sweep.repeats != "auto" or cell.repeat < sweep.auto_repeats.min:
        return False
    values = [v for workload, concurrency, summary, _ in store.kept_summaries(server.id)
              if workload == cell.workload and concurrency == cell.concurrency
              and (v := repeats.headline(concurrency, summary, sweep.headline)) is not None]
    if not repeats.enough(values, sweep.auto_repeats.min, sweep.auto_repeats.target):
        return False
    store.skip_cell(cell.id)
    share = repeats.half_width_share(values) or 0.0
    say(f"cell {server.label} c={cell.concurrency} {cell.workload} #{cell.repeat}: skipped, {len(values)} runs pin "
        f"the mean to ±{100 * share:.1f}% (repeats: auto, target {100 * sweep.auto_repeats.target:g}%)")
    return True


def _check_image(store: Store, server: ServerConfig, digest: str | None, allow: bool, say: Say) -> None:
    """A resumed run's server on another image than its earlier cells: stop (the server is torn down), unless
    --allow-drift, which records the drift; the report marks the cells."""
    earlier = {digest for *_, digest in store.kept_summaries(server.id) if digest}
    changes = provenance.image_changes(server.label, earlier, digest)
    if not changes:
        return
    if not allow:
        raise provenance.refuse(store.path.parent.name, changes)
    store.record_failure("drift", "; ".join(changes) + " (--allow-drift)")
    say(f"drift allowed: {'; '.join(changes)}")


def _fail_fatal(store: Store, server: ServerConfig, ready: launch.Ready, max_attempts: int, not_reached: list[str],
                say: Say) -> None:
    """The engine logged a fatal line while cells ran (its container was killed): the server fails as "fatal",
    and its cells, the one in flight too, go back to the queue."""
    assert ready.watch is not None
    error = fatal_error(ready.watch, ready.server.log_tail(CAUSE_LINES), "while cells ran")
    first = error.message.splitlines()[0]
    store.fail_server_config(server.id, "fatal", f"{first}\n{error.hint}", log_tail=error.log_tail,
                             max_attempts=max_attempts, cell_ids=not_reached)
    say(f"server {server.label}: failed (fatal): {first}; its unfinished cells go back to the queue")


def _fail_at_floor(store: Store, server: ServerConfig, watch: watchdog.Sampler | None, max_attempts: int,
                   cell_ids: list[str] | None, say: Say) -> None:
    """The floor watchdog stopped this server: a `memory-floor` failure with the samples; the sweep goes on."""
    assert watch is not None and watch.floor_gib is not None
    message, samples = watchdog.floor_failure(watch, watch.floor_gib)
    store.fail_server_config(server.id, "memory-floor", message, log_tail=samples, max_attempts=max_attempts,
                             cell_ids=cell_ids)
    say(f"server {server.label}: failed (memory-floor): {message}")


def _run_cell(plan: Plan, store: Store, ready: launch.Ready, server: ServerConfig, cell: Any, say: Say,
              watch: watchdog.Sampler | None = None) -> None:
    sweep = plan.sweep
    store.start_cell(cell.id)
    mark, clocks = (watch.mark(), memory.gpu_clocks()) if watch is not None else (0, None)
    sampling = Sampling(**sweep.sampling.model_dump())
    load = bench.Load(concurrency=cell.concurrency, requests=cell.requests, duration_s=sweep.duration_s,
                      warmup=sweep.warmup, stream=sweep.stream)
    spec = ready.server.spec
    adapter = engine(spec.kind)
    endpoint = bench.Endpoint(spec.endpoint, ready.api_key, None, spec.kind)
    name = f"{server.label} c={cell.concurrency} {cell.workload} #{cell.repeat}"
    result: BenchResult | None
    try:
        result = bench.run(endpoint, load_workload(cell.workload), sampling, load,
                           request_timeout_s=sweep.request_timeout_s, stall_timeout_s=sweep.stall_timeout_s,
                           alive=lambda: ready.server.state()[0] and endpoint.api.alive())
        since = result["measurement"]["window_started_at"]
        bench.add_log_acceptance(result, spec.kind, lambda: ready.server.log_since(since))
        if watch is not None:
            watchdog.add_cell_facts(result, watch, mark, clocks)
    except (KeyboardInterrupt, DiskFullError):
        raise
    except Exception as exc:  # a dead engine mid-warmup, a broken server: this cell fails, the sweep goes on
        stopped = (watch is not None and watch.tripped) or _engine_died(ready)
        if not stopped:
            if not isinstance(exc, SparklabError):
                rundir.faults.error("cell %s (%s): %s", name, cell.id, _one_line(exc), exc_info=exc)
            store.fail_cell(cell.id, "bench_error", _one_line(exc), max_attempts=sweep.max_attempts)
            say(f"cell {name}: failed: {_one_line(exc)}")
            return
        result = None  # the server was stopped under the cell: the server's failure says why
    if watch is not None and watch.tripped:  # its requests failed because the server was stopped
        raise MemoryFloorError("the memory floor stopped the server")
    if _engine_died(ready) or result is None:
        return
    summary = result["summary"]
    counts = summary["requests"]
    if not counts["ok"]:
        errors = "; ".join(counts["first_errors"]) or "no request succeeded"
        store.fail_cell(cell.id, "bench_error", errors, max_attempts=sweep.max_attempts)
        say(f"cell {name}: every request failed: {errors}")
        return
    if counts["ok"] < sweep.require_ok * counts["measured"]:
        errors = "; ".join(counts["first_errors"])
        message = (f"{counts['failed']} of {counts['measured']} requests failed (require_ok {sweep.require_ok:g}): "
                   f"{errors}")
        status = store.partial_cell(cell.id, dict(summary), dict(result), message, max_attempts=sweep.max_attempts,
                                    image_digest=ready.image.digest)
        say(f"cell {name}: partial, {message}; " + ("it runs again" if status == "pending" else
                                                     "kept as partial (flagged in the report)"))
        return
    store.finish_cell(cell.id, dict(summary), dict(result), image_digest=ready.image.digest)
    adapter.reset_prefix_cache(endpoint.api)
    say(f"cell {name}: {summary['aggregate_tps']:.2f} tok/s aggregate, "
        f"{summary['requests']['ok']}/{summary['requests']['measured']} ok")


def _engine_died(ready: launch.Ready) -> bool:
    """A fatal line came while the cell ran: its numbers are not the engine's; the server's failure says why."""
    return ready.watch is not None and ready.watch.fatal is not None


def dry_run(request: Request) -> tuple[Plan, float, TimingModel, list[Host] | None]:
    """The plan, its ETA, the timing model behind it and the Docker hosts: the same code path as a run, up to
    the first start (the ETA is one host's: several hosts share the servers out)."""
    run_dir, exists = rundir.resolve(request.runs_dir, load_sweep(request.file).name, request.resume, request.new)
    plan = build_plan(request.file, run_id=run_dir.name, ulimits=request.ulimits)
    if exists:
        provenance.check_owner(run_dir / "results.sqlite", plan.sweep.name, request.file)
    hosts = _hosts(request, plan)
    model = timing_model(plan, sorted(request.runs_dir.glob("*/results.sqlite")))
    return plan, estimate_seconds(plan, model), model, hosts


def sweep(request: Request, say: Say, docker: Runtime | None = None) -> Outcome:
    """Run (or continue) a sweep: plan, open or create its run, run what is pending, record everything.

    Ctrl-C and SIGTERM (as KeyboardInterrupt) tear the current server down and return an interrupted outcome
    that can be resumed; the cell in flight goes back to pending.
    """
    name = load_sweep(request.file).name
    with rundir.SweepLock(request.runs_dir, name):  # before a run is chosen or made: one process per sweep
        return _sweep_locked(request, name, say, docker)


def _sweep_locked(request: Request, name: str, say: Say, docker: Runtime | None) -> Outcome:
    run_dir, exists = rundir.resolve(request.runs_dir, name, request.resume, request.new)
    plan = build_plan(request.file, run_id=run_dir.name, ulimits=request.ulimits)
    if exists:  # before the file is opened for writing (which would migrate it)
        provenance.check_owner(run_dir / "results.sqlite", plan.sweep.name, request.file)
    hosts = _hosts(request, plan)
    rundir.make(run_dir)
    with rundir.RunLock(run_dir), rundir.fault_log(run_dir):
        rundir.check_free_space(run_dir, request.options.min_free_mib)
        if docker is None and (hosts is None or any(h.local for h in hosts)):
            docker = Runtime()
        path = run_dir / "results.sqlite"
        store = Store.open(path) if exists else Store.create(path, plan.sweep.model_dump(), __version__)
        with store:
            _check_drift(plan, store, exists, request.options.allow_drift, say)
            added = register(plan, store)
            if not exists:
                store.set_host_facts(host_facts())
            if request.retry_failed:
                say(f"{store.retry_failed()} failed or partial cell(s) will run again")
            if request.download and store.pending_cells():
                download(plan, store, say)
            say(f"run {run_dir} ({'continued' if exists else 'new'}; {added} new cell(s)): {store.counts()}")
            try:
                counts = run(plan, store, docker, run_dir, request.options, say, hosts)
            except KeyboardInterrupt:
                store.reset_interrupted(plan.sweep.max_attempts)
                return Outcome(run_dir, store.counts(), interrupted=True)
            except DiskFullError as exc:
                with contextlib.suppress(SparklabError):
                    store.record_failure("disk_full", exc.message)
                with contextlib.suppress(SparklabError):
                    store.reset_interrupted(plan.sweep.max_attempts)
                raise
    return Outcome(run_dir, counts)


def fingerprint(plan: Plan) -> dict[str, Any]:
    return provenance.fingerprint(recipe_file(plan.sweep, Path(plan.source)), plan.sweep.sampling.model_dump())


def _check_drift(plan: Plan, store: Store, exists: bool, allow: bool, say: Say) -> None:
    """Before anything is added to a resumed run: the recipe and sampling its cells measured, unchanged."""
    current = fingerprint(plan)
    changes = provenance.drift(provenance.from_meta(store.meta()), current) if exists else []
    counts = store.counts()
    tried = exists and (bool(store.failures()) or any(c.attempts for c in store.cells()))
    if changes and tried and not counts["done"] + counts["partial"]:  # its attempts measured nothing: a fix
        say(f"{'; '.join(changes)} since the run's last attempt; no cell had finished, so the run goes on with "
            "the new setup")
        store.set_meta(provenance.META_KEY, current)
        return
    if changes and not allow:
        raise provenance.refuse(store.path.parent.name, changes)
    if changes:
        store.record_failure("drift", "; ".join(changes) + " (--allow-drift)")
        say(f"drift allowed: {'; '.join(changes)}")
    if not changes or not store.meta().get(provenance.META_KEY):
        store.set_meta(provenance.META_KEY, current)


def _hosts(request: Request, plan: Plan) -> list[Host] | None:
    """--host wins over the sweep file's hosts:; neither: None, the local engine as always."""
    if request.hosts:
        return parse_hosts(list(request.hosts), "--host")
    return parse_hosts(plan.sweep.hosts, f"{request.file}") if plan.sweep.hosts else None


def download(plan: Plan, store: Store, say: Say) -> None:
    """Every checkpoint the servers mount into the cache, before any clock starts; revisions kept with the run."""
    from sparklab.runtimes import pull

    fetched = pull.pull([(s.recipe, s.spec) for s in plan.servers], pull_image=None, say=say)
    if fetched.models:
        store.set_host_facts({"model_revisions": fetched.revisions()})


def _progress(store: Store, started: float, done_at_start: int) -> str:
    counts = store.counts()
    left = counts["pending"] + counts["running"]
    finished = counts["done"] - done_at_start
    eta = ""
    if finished and left:
        per_cell = (time.monotonic() - started) / finished
        eta = f", about {per_cell * left / 60:.0f} min left at this run's pace"
    return f"[{counts['done']} done, {counts['failed']} failed, {left} left{eta}]"


def _exit_kind(code: int | None, oom_killed: bool | None) -> str:
    """oom only when Docker says the kernel's OOM killer did it; another SIGKILL (docker kill, earlyoom) is killed."""
    if oom_killed:
        return "oom"
    return "killed" if code == 137 else "exited"


def _failure_kind(exc: SparklabError) -> str:
    if isinstance(exc, NotReadyError):
        if exc.kind:  # "fatal" (a fatal engine log line) or "stalled" (silent while loading)
            return exc.kind
        if exc.container_exit_code is None:
            return "not_ready"
        return _exit_kind(exc.container_exit_code, exc.oom_killed)
    return "preflight" if isinstance(exc, PreflightError) else "container"
