"""One server config's work on one host: wait for the host to be ready for it, start the server, run its pending
cells on it, tear it down, and record every outcome; a fault ends this server's work, never the sweep.

What a server's work needs travels in one `ServerRun`. The memory policy (the wait between servers, the page cache,
the floor) applies on every host the server runs on, read through that host's facts (sweep/watch.py); a host whose
facts cannot be read runs unwatched, and says so. How the work's failures are recorded: sweep/failures.py.

`Options.time_scale` is how many wall seconds one second of the night takes: 1 for a real sweep, less for a
rehearsal (sparklab.rehearse), which runs the night compressed against a twin. Every deadline and timeout the
sweep sets (readiness, the stall detector, a request's timeout and stall, the memory and port waits, the
cluster port) and the sampler's interval are multiplied by it, so the compressed night decides what the real one
would: a server that would miss its deadline by a minute misses it by a second at 60x.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sparklab.bench import cell as bench
from sparklab.bench.metrics import IDENTICAL
from sparklab.bench.workloads import load_workload
from sparklab.engines import engine
from sparklab.engines.api import EngineAPI
from sparklab.engines.logwatch import headline
from sparklab.engines.scrape import exit_code_meaning
from sparklab.errors import DiskFullError, MemoryFloorError, PreflightError, ServerError, SparklabError
from sparklab.host import preflight, watchdog
from sparklab.host.facts import HostFacts, ThisMachine
from sparklab.recipes.hosts import LOOPBACK, Host
from sparklab.recipes.plan import Cell, Plan, ServerConfig
from sparklab.records import BenchResult, Sampling
from sparklab.runtimes import cluster, launch
from sparklab.runtimes.base import HostRuntime, Server
from sparklab.sweep import downloads, failures, grading, lossless, provenance, repeats, rundir
from sparklab.sweep import watch as watching
from sparklab.sweep.fleet import HostLost
from sparklab.sweep.hoststore import HostStore
from sparklab.sweep.store import Store
from sparklab.sweep.store_rows import utc_now as store_now

log = logging.getLogger(__name__)
# a rehearsal's compressed night samples memory no faster than this (wall seconds): the twin's host has no more to
# say between two samples, and two cores have other work
MIN_SAMPLE_S = 0.05

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
    time_scale: float = 1.0  # wall seconds per second of the night (a rehearsal's compression; see the docstring)
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
    # MemAvailable on each host before its first server (by host name; a host not in it is measured now)
    baselines: dict[str, float] = field(default_factory=dict)
    partners: list[HostRuntime] = field(default_factory=list)  # the other hosts of a server across hosts
    partner_names: list[str] = field(default_factory=list)
    lost: Callable[[], bool] = lambda: False  # whether the host went away (then HostLost, not a fault)
    controller: HostFacts = field(default_factory=lambda: ThisMachine(gpu=False))  # where the run directory is
    watched: list[watching.Watched] = field(default_factory=list)  # the server's hosts, its own first
    attempted: set[str] = field(default_factory=set)  # cells this server start ran (they counted their attempt)
    load_id: str = ""  # this start of the server ("<UTC start>#<server id>"): each of its cells keeps it
    _gone: tuple[str, ...] = field(default=(), repr=False)  # its hosts found gone (hosts_gone)

    @property
    def max_attempts(self) -> int:
        return self.plan.sweep.max_attempts

    @property
    def watch(self) -> watchdog.Sampler | None:
        """The sampler of the server's own host (its start window and each cell's memory and clocks)."""
        return self.watched[0].sampler if self.watched else None

    @property
    def tripped(self) -> watching.Watched | None:
        return watching.tripped(self.watched)

    @property
    def scale(self) -> float:
        return self.options.time_scale

    def hosts_gone(self) -> tuple[str, ...]:
        """The server's hosts that stopped answering: its own (`lost`), and each partner's of a server across hosts
        (a ping of its daemon, deadlines.ALIVE_S at most). Asked once something failed; a host found gone stays gone
        for this server. A worker's host lost is the host's loss as much as the head's: the cluster watcher kills
        the head when a node stops answering, which would read as the server's own fault."""
        if not self._gone:
            gone = [self.host.name] if self.lost() else []
            gone += [name for name, runtime in zip(self.partner_names, self.partners, strict=True)
                     if not runtime.alive()]
            self._gone = tuple(gone)
        return self._gone

    def host_lost(self, during: str) -> HostLost:
        """The loss of the hosts found gone, during what (a cell, the start): one host of its own as before ("the
        Docker host"); on a server across hosts, which of them."""
        gone = self.hosts_gone()
        who = f"the Docker host of {', '.join(gone)}" if self.partners and gone else "the Docker host"
        return HostLost(f"{who} stopped answering during {during}", hosts=gone)


def serve(run: ServerRun) -> None:
    """Wait until every host of the server can take it (memory back, page cache freed), then run it; any fault but
    Ctrl-C, a full disk and drift is contained here (HostLost when the host itself went away)."""
    server, options = run.server, run.options
    rundir.check_free_space(run.run_dir, options.min_free_mib, run.controller)
    readers: list[HostFacts] = []
    lost = False
    try:
        configured = (options.memory_floor_gib if options.memory_floor_gib is not None
                      else run.plan.sweep.memory_floor_gib)
        hosts = [(run.host.name, run.runtime), *zip(run.partner_names, run.partners, strict=True)]
        run.watched.extend(watching.watch_hosts(server, hosts, run.baselines, readers, configured=configured,
                                                drop_caches=options.drop_caches, memory_wait_s=options.memory_wait_s,
                                                time_scale=run.scale, say=run.say))
        name = server.spec.name
        if not run.watched:
            _run_server(run)
            return
        runtimes = [run.runtime, *run.partners]
        stop = (lambda: run.runtime.kill(name)) if server.cluster is None else (
            lambda: watching.kill_nodes(server, runtimes))
        samplers = watching.samplers(run.watched, max(MIN_SAMPLE_S, 1.0 * run.scale), stop,
                                     lambda: run.runtime.container_id(name))
        with contextlib.ExitStack() as stack:
            for sampler in samplers:
                stack.enter_context(sampler)
            _run_server(run)
    except (KeyboardInterrupt, DiskFullError, provenance.DriftError):
        raise
    except Exception as exc:  # one fault ends this server's work, never the sweep
        if isinstance(exc, HostLost) or run.hosts_gone():
            lost = True
            gone = exc.hosts if isinstance(exc, HostLost) and exc.hosts else run.hosts_gone()
            lost_exc = exc if isinstance(exc, HostLost) else run.host_lost(f"server {server.label}")
            if not isinstance(exc, HostLost):  # what sparklab saw of it, for the run's log
                rundir.faults.warning("server %s: %s; it ended with %s", server.label, lost_exc, failures.one_line(exc))
            for cell_id in run.store.host_lost(server.id, ", ".join(gone) or run.store.host or "",
                                               str(lost_exc).strip() or failures.one_line(lost_exc)):
                run.say(f"cell {cell_id} was running when the host was lost; it runs again")
            if isinstance(exc, HostLost):
                raise
            raise lost_exc from exc
        failures.contain(run, exc, [c.id for c in run.cells if c.id not in run.attempted])
    finally:
        if lost:  # removing a reader waits on the host that went away (an ssh connect): the sweep does not
            threading.Thread(target=_close, args=(readers,), name="close-readers", daemon=True).start()
        else:
            _close(readers)


def _close(readers: list[HostFacts]) -> None:
    """Remove the memory readers; one that cannot be removed (its host gone) stays for `sparklab gc --host`."""
    for facts in readers:
        with contextlib.suppress(Exception):
            facts.close()



def _start(run: ServerRun) -> launch.Ready:
    """Start the server where the run says: one server, or one across the run's host and its partners."""
    server, spec, options, scale = run.server, run.server.spec, run.options, run.scale
    local = run.host.local
    remote = None if local or not spec.address or spec.address in LOOPBACK else spec.address
    _wait_port_free(spec.host, spec.port, options.port_wait_s * scale, remote, scale)
    # another host's port and cache are not this machine's: fleet.unfit and the start check them; its memory is
    # read through its facts (run.watched), as this machine's is
    configured = options.memory_floor_gib if options.memory_floor_gib is not None else run.plan.sweep.memory_floor_gib
    facts = run.watched[0].facts if run.watched else None
    if scale != 1:
        spec = dataclasses.replace(spec, ready_timeout_s=spec.ready_timeout_s * scale)
    prepared = launch.checked(server.recipe, spec, check_host=local, floor_gib=configured, facts=facts)
    sources = (Path(run.plan.source),)  # a flag the image's parser refuses may come from the sweep file
    stall = run.plan.sweep.load_stall_s * scale if run.plan.sweep.load_stall_s else None
    if server.cluster is not None:  # one server across hosts: every node in order, readiness on the head
        nodes = tuple(dataclasses.replace(n, ready_timeout_s=n.ready_timeout_s * scale) for n in server.cluster.nodes)
        return cluster.start(prepared, dataclasses.replace(server.cluster, nodes=nodes), [run.runtime, *run.partners],
                             pull_policy=options.pull_policy, log_dir=run.run_dir / "logs", stall_s=stall,
                             say=run.say, port_timeout_s=cluster.CLUSTER_PORT_TIMEOUT_S * scale,
                             poll_s=min(1.0, 1.0 * scale), sources=sources)
    return launch.start(prepared, run.runtime, pull_policy=options.pull_policy,
                        log_path=run.run_dir / "logs" / f"{server.id}-{server.engine}-{server.method}.log",
                        stall_s=stall, poll_s=min(1.0, 1.0 * scale), sources=sources)


def _run_server(run: ServerRun) -> None:
    server, store, say, watch = run.server, run.store, run.say, run.watch
    spec, cells = server.spec, run.cells
    start_mark = watch.mark() if watch is not None else 0
    say(f"server {server.label}: starting ({len(cells)} cells; {spec.image})" if cells else
        f"server {server.label}: starting, to score the sampled answers left (the lossless check; {spec.image})")
    try:
        ready = _start(run)
    except (ServerError, PreflightError) as exc:
        if run.tripped is not None:
            failures.fail_at_floor(run, None)
            return
        if run.hosts_gone():  # its host (a node's, across hosts) went away under the start: serve() records it
            raise run.host_lost(f"the start of server {server.label}") from exc
        kind = failures.failure_kind(exc)
        code = getattr(exc, "container_exit_code", None)
        why = f"\n{exc.hint}" if kind in ("fatal", "stalled") and exc.hint else ""  # what died, or what to raise
        evidence = watchdog.kill_evidence(code, exc, facts=run.watched[0].facts if run.watched else None)
        store.fail_server_config(server.id, kind, exc.message + why + evidence,
                                 exit_code=code, log_tail=getattr(exc, "log_tail", None),
                                 max_attempts=run.max_attempts)
        cause = f" — {why.strip().splitlines()[0]}" if why else ""
        say(f"server {server.label}: failed ({kind}): {headline(exc.message, getattr(exc, 'log_tail', None))}{cause}")
        return
    # Owned from here on: a Ctrl-C, SIGTERM or hangup that lands while the start is recorded (or as "ready in" is
    # printed) tears the server down like one in a cell. Outside this block it would be left running.
    with ready.server:
        try:
            _record_start(run, ready, start_mark)
            measured = _run_cells(run, ready)
        except HostLost as exc:  # its host does not answer: a teardown would wait on it; `sparklab gc --host` later
            _leave(ready.server, exc, run.host.name)
            raise
        except Exception as exc:
            if not run.hosts_gone():  # a fault of this server's: the teardown and serve() deal with it
                raise
            lost = run.host_lost(f"server {server.label}")
            _leave(ready.server, lost, run.host.name)  # a state check failed because the host went away: as above
            raise lost from exc
        if measured and server.method == lossless.BASELINE and run.plan.sweep.lossless.enabled:
            # the plain server as it runs scores the sampled answers under the target (the lossless check)
            lossless.score_safely(run.plan, store, server, EngineAPI(ready.server.spec.endpoint, ready.api_key), say)


def _leave(server: Server, lost: HostLost, head: str) -> None:
    """A host went away under the server: what ran there is left for `sparklab gc --host`; a server across hosts
    that lost a worker's host only still comes down on the head's, which answers."""
    if isinstance(server, cluster.ClusterServer) and lost.hosts and head not in lost.hosts:
        server.leave(lost.hosts)
    else:
        server.keep()


def _record_start(run: ServerRun, ready: launch.Ready, start_mark: int) -> None:
    """The ready server's facts and start, stored and said; its fatal-line watch armed; its image checked."""
    server, store, say, watch, spec = run.server, run.store, run.say, run.watch, run.server.spec
    api = EngineAPI(spec.endpoint, ready.api_key)
    facts = {**ready.facts.as_dict(), **engine(spec.kind).served_facts(api)}
    if watch is not None:
        facts["memory"] = watch.stats(start_mark).as_dict()
        if len(run.watched) > 1:  # a server across hosts: each node's host
            facts["memory_hosts"] = {h.name: h.sampler.stats(0).as_dict() for h in run.watched if h.sampler}
    disagree = launch.read_served_version(ready, api)
    if disagree:
        facts["version_disagreement"] = disagree
        say(f"server {server.label}: warning: {disagree}")
    store.record_server_start(server.id, image_digest=ready.image.digest, startup_facts=facts,
                              ready_s=ready.seconds_to_ready / run.scale, log_path=str(ready.server.log_path),
                              engine_version=ready.served_version or launch.image_version(ready),
                              downloads=downloads.waited_for(store, server.id, ready.image_s))
    if ready.check is not None:
        store.record_image_check(server.id, ready.check.as_dict())
    say(f"server {server.label}: ready in {ready.seconds_to_ready / run.scale:.1f} s")  # the night's seconds
    # Which start of the server each cell ran on: repeats of one load share its state (its memory layout, the
    # machine's quiet or busy minute), so noise between loads is told apart from noise within one (bench.noise).
    # UTC first: ids sort in the order the loads happened.
    run.load_id = f"{store_now()}#{server.id}"
    if ready.watch is not None:  # a dead engine's API server may run on: kill it, so in-flight requests fail now
        ready.watch.on_fatal(ready.server.kill)
    _check_image(store, server, ready.image.digest, run.options.allow_drift, say)


def _run_cells(run: ServerRun, ready: launch.Ready) -> bool:
    """The server's cells in order, while it serves; a server that ends fails the cells it did not reach (False)."""
    server, cells = run.server, run.cells
    for i, cell in enumerate(cells):
        # A failure below charges these cells this server start's attempt; a fault after it (removing a container
        # the restarting daemon has lost) must not charge them a second one: they count as attempted.
        rest = [c.id for c in cells[i:]]
        if _engine_died(ready):
            run.attempted.update(rest)
            failures.fail_fatal(run, ready, rest)
            return False
        running, code = ready.server.state()
        if not running and run.tripped is not None:
            run.attempted.update(rest)
            failures.fail_at_floor(run, rest)
            return False
        if not running and run.hosts_gone():  # its host went (a node's: the cluster watcher ended the server)
            raise run.host_lost(f"server {server.label}")
        if not running:
            tail = ready.server.log_tail(50)
            oom = ready.server.oom_killed()
            meaning = exit_code_meaning(code, oom, tail) + watchdog.kill_evidence(
                code, tail, oom, facts=run.watched[0].facts if run.watched else None)
            run.attempted.update(rest)
            run.store.fail_server_config(server.id, failures.exit_kind(code, oom),
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
            failures.fail_at_floor(run, rest)
            return False
    if _engine_died(ready):  # during the last cell
        failures.fail_fatal(run, ready, [])
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




def _run_cell(run: ServerRun, ready: launch.Ready, cell: Cell) -> None:
    sweep, store, say, watch, server = run.plan.sweep, run.store, run.say, run.watch, run.server
    store.start_cell(cell.id)
    mark = watch.mark() if watch is not None else 0  # its window: memory and clocks under load
    marks = [h.sampler.mark() if h.sampler else 0 for h in run.watched]
    sampling = Sampling(**cell.sampling)
    duration = sweep.duration_s * run.scale if sweep.duration_s else None
    load = bench.Load(concurrency=cell.concurrency, requests=cell.requests, duration_s=duration,
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
        if run.hosts_gone():
            host_gone.set()
        return False

    def stop() -> HostLost | None:
        return run.host_lost(f"cell {name}") if host_gone.is_set() else None

    loadavg, started = _loadavg(), time.time()
    settle = bench.log_settler(spec.kind, lambda: ready.server.log_since(started), run.scale)  # SGLang's lines
    try:
        stall = sweep.stall_timeout_s * run.scale if sweep.stall_timeout_s else None
        result = bench.run(endpoint, load_workload(cell.workload), sampling, load,
                           request_timeout_s=sweep.request_timeout_s * run.scale, stall_timeout_s=stall,
                           time_scale=run.scale, alive=alive, stop=stop, before_window=settle)
        since = result["measurement"]["window_started_at"]
        result["server_load"] = {"id": run.load_id}
        result["host_load"] = {
            "loadavg_start": loadavg, "loadavg_end": _loadavg(), "cpus": os.cpu_count(),
            "source": "os.getloadavg() (1, 5, 15 min) on the machine running the bench client, at the cell's "
                      "start and end"}
        bench.add_log_acceptance(result, spec.kind, lambda: ready.server.log_since(since), launch.image_version(ready),
                                 run.scale)
        result["engine"] = {"version": launch.image_version(ready), "served_version": ready.served_version,
                            "image_digest": ready.image.digest}
        if watch is not None:
            watchdog.add_cell_facts(result, watch, mark)
            if len(run.watched) > 1:
                cast(dict[str, Any], result)["memory_hosts"] = {h.name: h.sampler.stats(marks[i]).as_dict()
                                                                for i, h in enumerate(run.watched) if h.sampler}
    except (KeyboardInterrupt, DiskFullError, HostLost):
        raise
    except Exception as exc:  # a dead engine mid-warmup, a broken server: this cell fails, the sweep goes on
        stopped = run.tripped is not None or _engine_died(ready)
        if not stopped and run.hosts_gone():  # its host went away under it: the cell runs again, uncharged
            raise run.host_lost(f"cell {name}") from exc
        if not stopped:
            if not isinstance(exc, SparklabError):
                rundir.faults.error("cell %s (%s): %s", name, cell.id, failures.one_line(exc), exc_info=exc)
            store.fail_cell(cell.id, "bench_error", failures.one_line(exc), max_attempts=sweep.max_attempts)
            say(f"cell {name}: failed: {failures.one_line(exc)}")
            return
        result = None  # the server was stopped under the cell: the server's failure says why
    if run.tripped is not None:  # its requests failed because the server was stopped
        raise MemoryFloorError("the memory floor stopped the server")
    if _engine_died(ready) or result is None:
        return
    summary = result["summary"]
    counts = summary["requests"]
    if counts["failed"] and run.hosts_gone():  # its requests failed because a host went away: uncharged
        raise run.host_lost(f"cell {name}")
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


def _wait_port_free(host: str, port: int, timeout_s: float, address: str | None = None, scale: float = 1.0) -> None:
    """address: another machine's, where a listener is found by connecting (a bind here says nothing)."""
    deadline = time.monotonic() + timeout_s
    while preflight.port_answers(address, port) if address else preflight.port_in_use(host, port):
        if time.monotonic() > deadline:
            raise PreflightError(f"port {port} is still in use {timeout_s / scale:.0f} s after the previous server",
                                 "Something else listens there: stop it or change the recipe's port.")
        time.sleep(0.5 * scale)


