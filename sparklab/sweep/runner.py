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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sparklab import __version__
from sparklab.engines import engine
from sparklab.errors import DiskFullError, PreflightError, SparklabError
from sparklab.host.facts import HostFacts, ThisMachine
from sparklab.recipes import multinode
from sparklab.recipes.hosts import Host, parse_hosts, redact_url
from sparklab.recipes.plan import (
    Cell,
    Plan,
    ServerConfig,
    TimingModel,
    build_plan,
    estimate_seconds,
)
from sparklab.recipes.schema import load_hardware, stored_facts
from sparklab.recipes.sweep_file import load_sweep
from sparklab.runtimes.base import HostRuntime
from sparklab.runtimes.local import Runtime as LocalRuntime
from sparklab.sweep import downloads, fleet, grading, lossless, parsecheck, provenance, rundir
from sparklab.sweep.hoststore import HostStore
from sparklab.sweep.serverrun import Options, Say, ServerRun, serve
from sparklab.sweep.store import Store
from sparklab.sweep.store_rows import PlannedCell

log = logging.getLogger(__name__)



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


# Any: a JSON document, stored with the run as it is
def host_facts(facts: HostFacts | None = None) -> dict[str, Any]:
    """This machine as the run records it (facts: its readings; a rehearsal's twin stands in for it)."""
    from sparklab.host.platform import platform_facts

    memory = (facts or ThisMachine(gpu=False)).meminfo()
    return {"hostname": platform.node(), "machine": platform.machine(), "python": platform.python_version(),
            "kernel": platform.release(), "mem_total_gib": round(memory.total_gib, 1),
            "mem_available_gib_at_start": round(memory.available_gib, 1), "sparklab": __version__,
            "platform": platform_facts()}


def controller_of(runtime: HostRuntime | None) -> HostFacts:
    """The readings of the machine the run directory is on: this machine's runtime's (a twin's in a rehearsal)."""
    return (runtime.host_facts(None) if runtime is not None else None) or ThisMachine(gpu=False)


def timing_model(plan: Plan, history: list[Path]) -> TimingModel:
    """A first guess per hardware, refined from earlier runs of the same recipe (ready time, tok/s at c=1).

    An engine that builds on its first start (Edge-LLM's TensorRT engines) counts each server at the recipe's
    ready deadline until a start of that same server (same config id: same build profile) was measured."""
    recipe = plan.servers[0].recipe
    model = TimingModel() if recipe.hardware else TimingModel(startup_s=45.0, tokens_per_s=15.0)
    ready, tps, by_server = [], [], {}
    for path in history:
        try:
            with Store.open(path, readonly=True) as old:  # another run's file: read, never migrated
                configs = [s for s in old.server_configs() if s.config.get("recipe") == recipe.name]
                ready += [s.ready_s for s in configs if s.ready_s and not engine(s.config.get("kind", "")
                                                                                ).builds_on_first_start]
                by_server.update({s.id: s.ready_s for s in configs if s.ready_s})
                ids = {s.id for s in configs}
                tps += [c.summary["aggregate_tps"] for c in old.cells("done")
                        if c.server_config_id in ids and c.concurrency == 1 and c.summary]
        except SparklabError:
            continue
    if ready:
        model = replace(model, startup_s=sum(ready) / len(ready))
    if tps:
        model = replace(model, tokens_per_s=sum(tps) / len(tps))
    builds = {s.engine: s.spec.ready_timeout_s for s in plan.servers if engine(s.spec.kind).builds_on_first_start}
    starts = {s.id: by_server.get(s.id, s.spec.ready_timeout_s) for s in plan.servers if s.engine in builds}
    return replace(model, server_startup_s=starts, builds=builds)


def register(plan: Plan, store: Store, only: Callable[[ServerConfig, Cell], bool] | None = None) -> int:
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
                                        "label": server.label, **stored_facts(server.recipe, devices, server.engine),
                                        # what the engine build is known to get wrong when this server samples
                                        "sampling_defects": engine(server.spec.kind).sampling_defects(server.spec),
                                        # a resume compares it (provenance: the environment is not in the id)
                                        "launch": provenance.launch_facts(server.spec)},
                                argv=argv, image=server.spec.image)
    settings = {"warmup": plan.sweep.warmup, "stream": plan.sweep.stream, "duration_s": plan.sweep.duration_s}
    return store.add_cells(
        PlannedCell(c.id, server.id, c.concurrency, c.workload, c.repeat,
                    {**settings, "sampling": c.sampling, "requests": c.requests})
        for server in plan.servers for c in server.cells if only is None or only(server, c))


def run(plan: Plan, store: Store, runtime: HostRuntime | None, run_dir: Path, options: Options, say: Say,
        hosts: list[Host] | None = None, reach: fleet.Connect | None = None, score: bool = True) -> dict[str, int]:
    """Run what is pending on the sweep's hosts (sparklab.sweep.fleet), each one server at a time: this machine
    alone when there are none (runtime: this machine's, local.Runtime by default; reach: how the other hosts are
    reached, Docker's remote API unless a rehearsal reaches its twins). score: then start `none` once more to score
    the sampled answers no `none` server scored while up (tune leaves that to its end: its rounds load more)."""
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
        members = fleet.connect(hosts, say, local=runtime, pull_policy=options.pull_policy, reach=reach)
        store.set_host_facts({"docker_hosts": {m.name: {"docker": redact_url(m.host.docker), "address": m.host.address,
                                                        "port_offset": m.host.port_offset, **m.facts}
                                               for m in members}, "bench_client": "controller"})
    else:
        # this machine alone: a single local host may still move its ports (a rehearsal's twin: port_offset)
        members = [fleet.this_machine(runtime or LocalRuntime(), options.pull_policy, hosts[0] if hosts else None)]
    for member in members:
        for info in member.runtime.gc():
            member.tell(say)(f"removed leftover {info.noun} {info.name} (its sparklab process is gone)")
    controller = controller_of(runtime)
    # MemAvailable before any server, per host: this machine's now, another host's before its first server
    baselines = {m.name: facts.meminfo().available_gib for m in members if m.host.local
                 and (facts := m.runtime.host_facts(None)) is not None}
    if len(members) == 1 and members[0].alone:  # several hosts: each start checks on the host that runs it
        parsecheck.check_pending(plan, store, members[0].runtime, options.pull_policy, say)

    def serve_pending(member: fleet.Member, server: ServerConfig, hstore: HostStore, host_say: Say,
                      partners: list[fleet.Member] | None = None) -> None:
        pending = {c.id for c in hstore.pending_cells()}
        cells = [c for c in server.cells if c.id in pending]
        if cells:
            serve(ServerRun(plan, hstore, member.runtime, run_dir, options, host_say, member.host, server, cells,
                            baselines, [p.runtime for p in partners or []], [p.name for p in partners or []],
                            lost=member.gone, controller=controller))

    fleet.run(plan, store, members, serve_pending, say_progress, run_dir.name)
    if score:  # what no `none` server scored while up: its engine's `none` once more, at the end
        _score_the_rest(plan, store, members, run_dir, options, say_progress, baselines, controller)
    return store.counts()


def _score_the_rest(plan: Plan, store: Store, members: list[fleet.Member], run_dir: Path, options: Options, say: Say,
                    baselines: dict[str, float], controller: HostFacts) -> None:
    """Sampled answers the lossless check has not scored yet (drafting configs that ran after `none`): the
    engine's `none` server config once more, with no cells, only to score them, rendered for the hosts it runs on
    as every start is: this machine first, else another host of the sweep; a server across hosts on as many."""
    if not plan.sweep.lossless.enabled:
        return
    lossless.settle_without_server(plan, store, say)
    for name in lossless.engines_with_pending(plan, store):
        plain = lossless.baseline_of(plan, name)
        if plain is None:
            continue
        need = fleet.nodes_of(plain)
        usable = sorted((m for m in members if not m.lost and (m.alone or fleet.unfit(plain, m) is None)),
                        key=lambda m: not m.host.local)
        if len(usable) < need:
            hosts_word = "hosts" if need > 1 else "host"
            say(f"server {plain.label}: needs {need} {hosts_word} to score the sampled answers left, {len(usable)} "
                "left in this run: they are not scored (run the sweep again once the hosts are back)")
            continue
        member, partners = usable[0], usable[1:need]
        server = (fleet.for_hosts(plain, [member.host, *(p.host for p in partners)]) if partners
                  else fleet.for_host(plain, member.host))
        try:
            serve(ServerRun(plan, HostStore(store, host=member.recorded_as), member.runtime, run_dir, options,
                            member.tell(say), member.host, server, [], baselines, [p.runtime for p in partners],
                            [p.name for p in partners], lost=member.gone, controller=controller))
        except fleet.HostLost as exc:
            for lost in fleet.mark_lost(exc, member, partners):  # the host that ran it, or a pair's worker
                lost.tell(say)(f"lost: {str(exc) or 'the Docker host stopped answering'}; the sampled answers left "
                               "are not scored")


def dry_run(request: Request) -> tuple[Plan, float, TimingModel, list[Host] | None]:
    """The plan, its ETA, the timing model behind it and the Docker hosts: the same code path as a run, up to
    the first start (the ETA is one host's: several hosts share the servers out)."""
    run_dir, exists = rundir.resolve(request.runs_dir, load_sweep(request.file).name, request.resume, request.new)
    plan = build_plan(request.file, run_id=run_dir.name, ulimits=request.ulimits)
    if exists:
        provenance.check_owner(run_dir / "results.sqlite", plan.sweep.name, request.file)
        if not request.options.allow_drift:
            with Store.open(run_dir / "results.sqlite", readonly=True) as store:
                refusal = provenance.drift_refusal(plan, store)
            if refusal:
                raise refusal
    hosts = _hosts(request, plan)
    model = timing_model(plan, sorted(request.runs_dir.glob("*/results.sqlite")))
    return plan, estimate_seconds(plan, model), model, hosts


def sweep(request: Request, say: Say, runtime: HostRuntime | None = None,
          reach: fleet.Connect | None = None) -> Outcome:
    """Run (or continue) a sweep: plan, open or create its run, run what is pending, record everything.

    Ctrl-C and SIGTERM (as KeyboardInterrupt) tear the current server down and return an interrupted outcome
    that can be resumed; the cell in flight goes back to pending.
    """
    name = load_sweep(request.file).name
    with rundir.SweepLock(request.runs_dir, name):  # before a run is chosen or made: one process per sweep
        return _sweep_locked(request, name, say, runtime, reach)


def _sweep_locked(request: Request, name: str, say: Say, runtime: HostRuntime | None,
                  reach: fleet.Connect | None) -> Outcome:
    run_dir, exists = rundir.resolve(request.runs_dir, name, request.resume, request.new)
    plan = build_plan(request.file, run_id=run_dir.name, ulimits=request.ulimits)
    if exists:  # before the file is opened for writing (which would migrate it)
        provenance.check_owner(run_dir / "results.sqlite", plan.sweep.name, request.file)
    hosts = _hosts(request, plan)
    rundir.make(run_dir)
    with rundir.RunLock(run_dir), rundir.fault_log(run_dir):
        say = _logged(say, run_dir / rundir.LOG_NAME)
        if runtime is None and (hosts is None or any(h.local for h in hosts)):
            runtime = LocalRuntime()
        rundir.check_free_space(run_dir, request.options.min_free_mib, controller_of(runtime))
        path = run_dir / "results.sqlite"
        store = Store.open(path) if exists else Store.create(path, plan.sweep.model_dump(), __version__)
        with store:
            provenance.check_drift(plan, store, exists, request.options.allow_drift, say)
            added = register(plan, store)
            if not exists:
                facts = host_facts(controller_of(runtime))
                if runtime is not None:  # the engine the servers run on, where it is this machine's
                    with contextlib.suppress(Exception):
                        facts["platform"]["docker"] = runtime.facts().get("docker_version")
                store.set_host_facts(facts)
            if request.retry_failed:
                say(f"{store.retry_failed()} failed or partial cell(s) will run again")
            if request.download and store.pending_cells():
                downloads.download(plan, store, say)
            say(f"run {run_dir} ({'continued' if exists else 'new'}; {added} new cell(s)): {store.counts()}")
            options = request.options
            if store.pending_cells():  # a code suite's sandbox image is checked before any server starts
                options = replace(options, sandbox=grading.make_sandbox(plan, lambda: _docker_of(runtime)))
            try:
                counts = run(plan, store, runtime, run_dir, options, say, hosts, reach)
            except KeyboardInterrupt:  # Ctrl-C, SIGTERM, or a hangup whose terminal is gone: the log says it
                store.reset_interrupted(plan.sweep.max_attempts)
                _log_line(run_dir / rundir.LOG_NAME, f"interrupted; the servers are down, {store.counts()}")
                return Outcome(run_dir, store.counts(), interrupted=True)
            except DiskFullError as exc:
                with contextlib.suppress(SparklabError):
                    store.record_failure("disk_full", exc.message)
                with contextlib.suppress(SparklabError):
                    store.reset_interrupted(plan.sweep.max_attempts)
                raise
    return Outcome(run_dir, counts)


def _logged(say: Say, path: Path) -> Say:
    """say, and the same line in the run's log: a console that goes away (a closed terminal or pipe) loses none of
    the run's events, and the log has them beside the faults' tracebacks."""
    lock = threading.Lock()

    def both(message: str) -> None:
        with lock:
            _log_line(path, message)
        say(message)

    return both


def _log_line(path: Path, message: str) -> None:
    try:
        with path.open("a", encoding="utf-8") as log_file:
            log_file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
    except OSError as exc:  # the run's disk: its own check stops the sweep before the next server
        log.debug("run log %s: %s", path, exc)


def _hosts(request: Request, plan: Plan) -> list[Host] | None:
    """--host wins over the sweep file's hosts:; neither: None, the local engine as always. A server across
    more hosts than named fails here, before the run directory, the download or any host check."""
    if request.hosts:
        hosts: list[Host] | None = parse_hosts(list(request.hosts), "--host")
    else:
        hosts = parse_hosts(plan.sweep.hosts, f"{request.file}") if plan.sweep.hosts else None
    for server in plan.servers:
        multinode.require_hosts(server.recipe, server.engine, len(hosts or []))
    return hosts



def _docker_of(runtime: HostRuntime | None) -> Any:
    """This machine's Docker engine behind a runtime (code answers run in a container there), None: the default."""
    return runtime.docker if isinstance(runtime, LocalRuntime) else runtime


def _progress(store: Store, started: float, done_at_start: int) -> str:
    counts = store.counts()
    left = counts["pending"] + counts["running"]
    finished = counts["done"] - done_at_start
    eta = ""
    if finished and left:
        per_cell = (time.monotonic() - started) / finished
        eta = f", about {per_cell * left / 60:.0f} min left at this run's pace"
    return f"[{counts['done']} done, {counts['failed']} failed, {left} left{eta}]"
