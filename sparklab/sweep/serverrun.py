"""One server config's work on one host: wait for the host to be ready for it, start the server, run its pending
cells on it, tear it down, and record every outcome; a fault ends this server's work, never the sweep.

What a server's work needs travels in one `ServerRun`. The policy of this machine (the memory wait between
servers, the page cache, the memory floor) applies where `run.host.local`: another host's memory is not ours.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparklab.bench import cell as bench
from sparklab.bench.metrics import IDENTICAL
from sparklab.bench.workloads import load_workload
from sparklab.engines import engine
from sparklab.engines.api import EngineAPI
from sparklab.engines.logwatch import CAUSE_LINES, fatal_error, headline
from sparklab.engines.scrape import exit_code_meaning
from sparklab.errors import DiskFullError, MemoryFloorError, NotReadyError, PreflightError, ServerError, SparklabError
from sparklab.host import memory, preflight, watchdog
from sparklab.host.headroom import headroom
from sparklab.recipes.hosts import LOOPBACK, Host
from sparklab.recipes.plan import Cell, Plan, ServerConfig
from sparklab.records import BenchResult, Sampling
from sparklab.runtimes import cluster, launch
from sparklab.runtimes.base import HostRuntime
from sparklab.sweep import downloads, grading, lossless, provenance, repeats, rundir
from sparklab.sweep.fleet import HostLost
from sparklab.sweep.hoststore import HostStore
from sparklab.sweep.store import Store
from sparklab.sweep.store_rows import utc_now as store_now

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
    sandbox: Any = None  # where code suites' answers run (sweep.grading.make_sandbox); None: no code suite


@dataclass
class ServerRun:
    """One server config on one host, with everything its work needs."""

    plan: Plan
    store: HostStore
    runtime: HostRuntime  # the host's runtime (this machine: containers and host processes)
    run_dir: Path
    options: Options
    say: Say
    host: Host
    server: ServerConfig
    cells: list[Cell]  # its pending cells, in order
    baseline_gib: float = 0.0  # memory available before the first server (this machine's)
    partners: list[HostRuntime] = field(default_factory=list)  # the other hosts of a server across hosts
    lost: Callable[[], bool] = lambda: False  # whether the host went away (then HostLost, not a fault)
    watch: watchdog.Sampler | None = None  # this machine's memory while the server runs
    attempted: set[str] = field(default_factory=set)  # cells this server start ran (they counted their attempt)
    load_id: str = ""  # this start of the server ("<UTC start>#<server id>"): each of its cells keeps it

    @property
    def max_attempts(self) -> int:
        return self.plan.sweep.max_attempts


def serve(run: ServerRun) -> None:
    """Wait until the host can take the server (this machine: memory back, page cache freed), then run it; any
    fault but Ctrl-C, a full disk and drift is contained here (HostLost when the host itself went away)."""
    server, options = run.server, run.options
    rundir.check_free_space(run.run_dir, options.min_free_mib)
    if run.host.local:
        _wait_memory(run.baseline_gib, options.memory_wait_s, run.say, server)
        if options.drop_caches is not False:
            memory.free_page_cache(server.recipe, server.spec, run.say, every_recipe=bool(options.drop_caches))
    configured = options.memory_floor_gib if options.memory_floor_gib is not None else run.plan.sweep.memory_floor_gib
    room = (headroom(server.spec, server.recipe, memory.read_meminfo(), available_at_start=run.baseline_gib)
            if run.host.local else None)
    floor = watchdog.floor_for(server.recipe, configured, room) if run.host.local else 0.0
    if room is not None and floor:  # not "server X: ...", the prefix of a server's start, ready and failure lines
        run.say(f"memory floor for {server.label}: {floor:.2f} GiB ({room.explain()})"
                + ("" if configured is None or room.room_gib >= floor else
                   "; the configured floor is above that, so the watchdog will likely stop this server"))
    name = server.spec.name
    try:
        if not run.host.local:
            _run_server(run)
            return
        with watchdog.Sampler(floor_gib=floor, locate=lambda: run.runtime.container_id(name),
                              on_floor=lambda: run.runtime.kill(name)) as run.watch:
            _run_server(run)
    except (KeyboardInterrupt, DiskFullError, provenance.DriftError):
        raise
    except Exception as exc:  # one fault ends this server's work, never the sweep
        if isinstance(exc, HostLost) or run.lost():
            for cell_id in run.store.host_lost(server.id, run.store.host or "", _one_line(exc)):
                run.say(f"cell {cell_id} was running when the host was lost; it runs again")
            if isinstance(exc, HostLost):
                raise
            raise HostLost(_one_line(exc)) from exc
        _contain(run, exc, [c.id for c in run.cells if c.id not in run.attempted])


def _contain(run: ServerRun, exc: Exception, not_reached: list[str]) -> None:
    """An unexpected fault in one server's work: its traceback goes to the run's log file (not the console),
    its servers are removed (waiting for a restarting Docker daemon), its unfinished cells fail with one line."""
    server, say, faults_at = run.server, run.say, run.run_dir / rundir.LOG_NAME
    reason = _one_line(exc)
    rundir.faults.error("server %s (%s): %s", server.label, server.id, reason, exc_info=exc)
    run.store.fail_server_config(server.id, "error", f"{reason} (traceback in {faults_at})",
                                 max_attempts=run.max_attempts, cell_ids=not_reached)
    say(f"server {server.label}: failed (error): {reason}; its unfinished cells go back to the queue; "
        f"details in {faults_at}")
    try:
        for name in run.runtime.remove_run_containers(run.run_dir.name):
            say(f"removed {name} after the fault")
    except Exception as cleanup:  # the daemon stayed away: say so, the next run's gc removes it
        rundir.faults.error("cleanup after the fault failed: %s", _one_line(cleanup), exc_info=cleanup)
        say(f"could not remove the server's container ({_one_line(cleanup)}); `sparklab gc` removes it later")


def _start(run: ServerRun) -> launch.Ready:
    """Start the server where the run says: one server, or one across the run's host and its partners."""
    server, spec, options = run.server, run.server.spec, run.options
    local = run.host.local
    remote = None if local or not spec.address or spec.address in LOOPBACK else spec.address
    _wait_port_free(spec.host, spec.port, options.port_wait_s, remote)
    # another host's memory, port and cache are not this machine's: fleet.unfit and the start check them
    configured = options.memory_floor_gib if options.memory_floor_gib is not None else run.plan.sweep.memory_floor_gib
    prepared = (launch.checked(server.recipe, spec, floor_gib=configured) if local
                else launch.checked(server.recipe, spec, False))
    sources = (Path(run.plan.source),)  # a flag the image's parser refuses may come from the sweep file
    if server.cluster is not None:  # one server across hosts: every node in order, readiness on the head
        return cluster.start(prepared, server.cluster, [run.runtime, *run.partners], pull_policy=options.pull_policy,
                             log_dir=run.run_dir / "logs", stall_s=run.plan.sweep.load_stall_s, say=run.say,
                             sources=sources)
    return launch.start(prepared, run.runtime, pull_policy=options.pull_policy,
                        log_path=run.run_dir / "logs" / f"{server.id}-{server.engine}-{server.method}.log",
                        stall_s=run.plan.sweep.load_stall_s, sources=sources)


def _run_server(run: ServerRun) -> None:
    server, store, say, watch = run.server, run.store, run.say, run.watch
    spec, cells = server.spec, run.cells
    start_mark = watch.mark() if watch is not None else 0
    say(f"server {server.label}: starting ({len(cells)} cells; {spec.image})" if cells else
        f"server {server.label}: starting, to score the sampled answers left (the lossless check; {spec.image})")
    try:
        ready = _start(run)
    except (ServerError, PreflightError) as exc:
        if watch is not None and watch.tripped:
            _fail_at_floor(run, None)
            return
        kind = _failure_kind(exc)
        code = getattr(exc, "container_exit_code", None)
        why = f"\n{exc.hint}" if kind in ("fatal", "stalled") and exc.hint else ""  # what died, or what to raise
        store.fail_server_config(server.id, kind, exc.message + why + watchdog.kill_evidence(code, exc),
                                 exit_code=code, log_tail=getattr(exc, "log_tail", None),
                                 max_attempts=run.max_attempts)
        cause = f" — {why.strip().splitlines()[0]}" if why else ""
        say(f"server {server.label}: failed ({kind}): {headline(exc.message, getattr(exc, 'log_tail', None))}{cause}")
        return
    api = EngineAPI(spec.endpoint, ready.api_key)
    facts = {**ready.facts.as_dict(), **engine(spec.kind).served_facts(api)}
    if watch is not None:
        facts["memory"] = watch.stats(start_mark).as_dict()
    disagree = launch.read_served_version(ready, api)
    if disagree:
        facts["version_disagreement"] = disagree
        say(f"server {server.label}: warning: {disagree}")
    store.record_server_start(server.id, image_digest=ready.image.digest, startup_facts=facts,
                              ready_s=ready.seconds_to_ready, log_path=str(ready.server.log_path),
                              engine_version=ready.served_version or launch.image_version(ready),
                              downloads=downloads.waited_for(store, server.id, ready.image_s))
    if ready.check is not None:
        store.record_image_check(server.id, ready.check.as_dict())
    say(f"server {server.label}: ready in {ready.seconds_to_ready:.1f} s")
    # Which start of the server each cell ran on: repeats of one load share its state (its memory layout, the
    # machine's quiet or busy minute), so noise between loads is told apart from noise within one (bench.noise).
    # UTC first: ids sort in the order the loads happened.
    run.load_id = f"{store_now()}#{server.id}"
    if ready.watch is not None:  # a dead engine's API server may run on: kill it, so in-flight requests fail now
        ready.watch.on_fatal(ready.server.kill)
    with ready.server:
        _check_image(store, server, ready.image.digest, run.options.allow_drift, say)
        try:
            measured = _run_cells(run, ready)
        except HostLost:  # its host does not answer: a teardown would wait on it too; `sparklab gc --host` later
            ready.server.keep()
            raise
        except Exception as exc:
            if not run.lost():  # a fault of this server's: the teardown and serve() deal with it
                raise
            ready.server.keep()  # a state check failed because the host went away: as above
            raise HostLost(_one_line(exc)) from exc
        if measured and server.method == lossless.BASELINE and run.plan.sweep.lossless.enabled:
            # the plain server as it runs scores the sampled answers under the target (the lossless check)
            lossless.score_safely(run.plan, store, server, EngineAPI(ready.server.spec.endpoint, ready.api_key), say)


def _run_cells(run: ServerRun, ready: launch.Ready) -> bool:
    """The server's cells in order, while it serves; a server that ends fails the cells it did not reach (False)."""
    server, cells = run.server, run.cells
    for i, cell in enumerate(cells):
        # A failure below charges these cells this server start's attempt; a fault after it (removing a container
        # the restarting daemon has lost) must not charge them a second one: they count as attempted.
        rest = [c.id for c in cells[i:]]
        if _engine_died(ready):
            run.attempted.update(rest)
            _fail_fatal(run, ready, rest)
            return False
        running, code = ready.server.state()
        if not running and run.watch is not None and run.watch.tripped:
            run.attempted.update(rest)
            _fail_at_floor(run, rest)
            return False
        if not running:
            tail = ready.server.log_tail(50)
            oom = ready.server.oom_killed()
            meaning = exit_code_meaning(code, oom, tail) + watchdog.kill_evidence(code, tail, oom)
            run.attempted.update(rest)
            run.store.fail_server_config(server.id, _exit_kind(code, oom),
                                         f"the server exited with code {code}{meaning} during the sweep",
                                         exit_code=code, log_tail=tail, max_attempts=run.max_attempts,
                                         cell_ids=rest)
            run.say(f"server {server.label}: exited with code {code}; its remaining cells failed")
            return False
        if _measured_enough(run.plan, run.store, server, cell, run.say):
            continue
        run.attempted.add(cell.id)
        try:
            _run_cell(run, ready, cell)
        except MemoryFloorError:
            run.attempted.update(rest)
            _fail_at_floor(run, rest)
            return False
    if _engine_died(ready):  # during the last cell
        _fail_fatal(run, ready, [])
        return False
    return True


def _measured_enough(plan: Plan, store: Store | HostStore, server: ServerConfig, cell: Cell, say: Say) -> bool:
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
    name = f"cell {server.label} c={cell.concurrency} {cell.workload} #{cell.repeat}"
    if repeats.identical(values):  # zero spread is not a pinned mean: say what it is
        say(f"{name}: skipped, its {len(values)} runs gave the same value ({IDENTICAL}; repeats: auto stops here)")
        return True
    say(f"{name}: skipped, {len(values)} runs pin the mean to ±{100 * share:.1f}% (repeats: auto, target "
        f"{100 * sweep.auto_repeats.target:g}%)")
    return True


def _check_image(store: Store | HostStore, server: ServerConfig, digest: str | None, allow: bool, say: Say) -> None:
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


def _fail_fatal(run: ServerRun, ready: launch.Ready, not_reached: list[str]) -> None:
    """The engine logged a fatal line while cells ran (its server was killed): the server fails as "fatal",
    and its cells, the one in flight too, go back to the queue."""
    assert ready.watch is not None
    error = fatal_error(ready.watch, ready.server.log_tail(CAUSE_LINES), "while cells ran")
    first = error.message.splitlines()[0]
    run.store.fail_server_config(run.server.id, "fatal", f"{first}\n{error.hint}", log_tail=error.log_tail,
                                 max_attempts=run.max_attempts, cell_ids=not_reached)
    run.say(f"server {run.server.label}: failed (fatal): {first}; its unfinished cells go back to the queue")


def _fail_at_floor(run: ServerRun, cell_ids: list[str] | None) -> None:
    """The floor watchdog stopped this server: a `memory-floor` failure with the samples; the sweep goes on."""
    watch = run.watch
    assert watch is not None and watch.floor_gib is not None
    message, samples = watchdog.floor_failure(watch, watch.floor_gib)
    run.store.fail_server_config(run.server.id, "memory-floor", message, log_tail=samples,
                                 max_attempts=run.max_attempts, cell_ids=cell_ids)
    run.say(f"server {run.server.label}: failed (memory-floor): {message}")


def _run_cell(run: ServerRun, ready: launch.Ready, cell: Cell) -> None:
    sweep, store, say, watch, server = run.plan.sweep, run.store, run.say, run.watch, run.server
    store.start_cell(cell.id)
    mark = watch.mark() if watch is not None else 0  # its window: memory and clocks under load
    sampling = Sampling(**cell.sampling)
    load = bench.Load(concurrency=cell.concurrency, requests=cell.requests, duration_s=sweep.duration_s,
                      warmup=sweep.warmup, stream=sweep.stream)
    spec = ready.server.spec
    adapter = engine(spec.kind)
    endpoint = bench.Endpoint(spec.endpoint, ready.api_key, None, spec.kind)
    name = f"{server.label} c={cell.concurrency} {cell.workload} #{cell.repeat}"
    result: BenchResult | None
    host_gone = threading.Event()

    def alive() -> bool:
        """The stall detector's question. The engine's own health first: a host gone silent fails it in seconds
        without asking its daemon. When the answer is no, whether the host itself went away: then the whole cell
        ends (`stop`), instead of each of its requests waiting out the stall timeout on a machine that is gone."""
        with contextlib.suppress(Exception):
            if endpoint.api.alive() and ready.server.state()[0]:
                return True
        if run.lost():
            host_gone.set()
        return False

    def stop() -> HostLost | None:
        return HostLost(f"the Docker host stopped answering during cell {name}") if host_gone.is_set() else None

    loadavg = _loadavg()
    try:
        result = bench.run(endpoint, load_workload(cell.workload), sampling, load,
                           request_timeout_s=sweep.request_timeout_s, stall_timeout_s=sweep.stall_timeout_s,
                           alive=alive, stop=stop)
        since = result["measurement"]["window_started_at"]
        result["server_load"] = {"id": run.load_id}
        result["host_load"] = {
            "loadavg_start": loadavg, "loadavg_end": _loadavg(), "cpus": os.cpu_count(),
            "source": "os.getloadavg() (1, 5, 15 min) on the machine running the bench client, at the cell's "
                      "start and end"}
        bench.add_log_acceptance(result, spec.kind, lambda: ready.server.log_since(since), launch.image_version(ready))
        result["engine"] = {"version": launch.image_version(ready), "served_version": ready.served_version,
                            "image_digest": ready.image.digest}
        if watch is not None:
            watchdog.add_cell_facts(result, watch, mark)
    except (KeyboardInterrupt, DiskFullError, HostLost):
        raise
    except Exception as exc:  # a dead engine mid-warmup, a broken server: this cell fails, the sweep goes on
        stopped = (watch is not None and watch.tripped) or _engine_died(ready)
        if not stopped and run.lost():  # its host went away under it: the cell runs again elsewhere, uncharged
            raise HostLost(f"the Docker host stopped answering during cell {name}") from exc
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
    if not counts["ok"] and run.lost():  # every request failed because the host went away
        raise HostLost(f"the Docker host stopped answering during cell {name}")
    if not counts["ok"]:
        errors = "; ".join(counts["first_errors"]) or "no request succeeded"
        store.fail_cell(cell.id, "bench_error", errors, max_attempts=sweep.max_attempts)
        say(f"cell {name}: every request failed: {errors}")
        return
    grades = grading.grade_safely(name, cell.workload, result, run.options.sandbox, say)  # the window is over
    if counts["ok"] < sweep.require_ok * counts["measured"]:
        errors = "; ".join(counts["first_errors"])
        message = (f"{counts['failed']} of {counts['measured']} requests failed (require_ok {sweep.require_ok:g}): "
                   f"{errors}")
        status = store.partial_cell(cell.id, dict(summary), dict(result), message, max_attempts=sweep.max_attempts,
                                    image_digest=ready.image.digest, engine_version=launch.image_version(ready),
                                    served_version=ready.served_version, grades=grades)
        say(f"cell {name}: partial, {message}; " + ("it runs again" if status == "pending" else
                                                     "kept as partial (flagged in the report)"))
        return
    store.finish_cell(cell.id, dict(summary), dict(result), image_digest=ready.image.digest,
                      engine_version=launch.image_version(ready), served_version=ready.served_version, grades=grades)
    adapter.reset_prefix_cache(endpoint.api)
    graded = f"; graded: {grading.summary(grades)}" if grades is not None else ""
    say(f"cell {name}: {summary['aggregate_tps']:.2f} tok/s aggregate, "
        f"{summary['requests']['ok']}/{summary['requests']['measured']} ok{graded}")


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not every platform has it
        return None


def _engine_died(ready: launch.Ready) -> bool:
    """A fatal line came while the cell ran: its numbers are not the engine's; the server's failure says why."""
    return ready.watch is not None and ready.watch.fatal is not None


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


def _one_line(exc: BaseException) -> str:
    text = exc.message if isinstance(exc, SparklabError) else str(exc)
    first = (text.strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:300] if not isinstance(exc, SparklabError) else first[:300]


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

