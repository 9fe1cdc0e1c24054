"""`sparklab rehearse`: a night of `sweep`, `tune` or `up` run through sparklab's own code path (plan, preflight,
start, readiness, cells, memory watch and floor, failures, store, report) against a DGX Spark twin instead of the
real host, time-compressed, into a scratch run directory.

Only the host changes: the runtime is a twin (runtimes/twin.py: the stand-in engine as a host process instead of
the engine's image) and its facts are the twin's (host/twin.py) - the sweep runner, the watchdog, preflight and
the report are the real ones. Time runs `scale` wall seconds per second of the night (Options.time_scale): the
sweep's deadlines, its sampler and the stand-ins' timing all shrink by it, and the bench client reads its windows
back on the night's clock. A RECIPE[:METHOD] target rehearses `up` as a one-server sweep of one short cell (the
start `up` makes, then load, so memory under load is seen).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sparklab.errors import RecipeError, SparklabError
from sparklab.host.preflight import port_in_use
from sparklab.host.twin import TwinHost
from sparklab.recipes import multinode
from sparklab.recipes.hosts import Host
from sparklab.recipes.plan import Plan, build_plan
from sparklab.recipes.schema import load_recipe, resolve
from sparklab.recipes.twin import Twin, load_twin
from sparklab.rehearse.eta import NightEta, night_eta
from sparklab.runtimes.base import HostRuntime
from sparklab.runtimes.twin import FAULTS, RUNTIME_FAULTS, TwinRuntime, TwinSetup
from sparklab.sweep import runner
from sparklab.sweep.serverrun import Options
from sparklab.tune.space import sweep_document

Say = Callable[[str], None]
SLOW_DOWNLOAD_GBPS = 0.005  # slow-download: weights not in the cache, fetched at start at 5 MB/s
DEFAULT_WALL_S = 90.0  # how long a rehearsal aims to take (the night compressed into it)
MIN_SCALE = 1e-3  # faster than this, the stand-ins' own work per decode step no longer fits its step
# the shortest wall time the sweep's load-stall window (a silence detector) may shrink to: below it, a busy machine's
# own delay in delivering a log line (13 rehearsals on 2 cores) reads as a hung engine and loses a server
MIN_WINDOW_WALL_S = 2.0


def choose_scale(wall_s: float, night_s: float, asked: float | None,
                 load_stall_s: float | None) -> tuple[float, str | None]:
    """Wall seconds per night second: `asked` if given, else the night's ETA into wall_s, but never so fast that
    the load-stall window falls under MIN_WINDOW_WALL_S (then also why, for the verdict) nor slower than real."""
    if asked:
        return asked, None
    scale = min(1.0, max(MIN_SCALE, wall_s / max(1.0, night_s)))
    floor = MIN_WINDOW_WALL_S / load_stall_s if load_stall_s else 0.0
    if floor <= scale:
        return scale, None
    scale = min(1.0, floor)
    return scale, (f"compressed less than asked: the sweep's load_stall_s of {load_stall_s:g} s stays "
                   f"{MIN_WINDOW_WALL_S:g} s of wall time, so that this machine's own delays are not read as a hung "
                   "engine")


@dataclass(frozen=True)
class RehearsalRequest:
    target: str  # a sweep file (or its name) or RECIPE[:METHOD] (what `sparklab up` takes)
    command: str | None = None  # sweep, tune or up (None: sweep for a sweep file, up for a recipe)
    fault: str | None = None
    throttle: bool = False  # the twin's GPU throttles under sustained load
    overrides: tuple[str, ...] = ()  # --set, over the sweep file's set:
    engine: str | None = None
    wall_s: float = DEFAULT_WALL_S
    scale: float | None = None  # wall seconds per night second (None: the night's ETA into wall_s)
    runs_dir: Path | None = None  # keep the run there (None: a scratch directory, removed)
    keep: bool = False  # keep the scratch directory


@dataclass
class Rehearsal:
    """What the rehearsal did: the plan, the twins, every line the night said and the run it left."""

    request: RehearsalRequest
    command: str  # sweep, tune or up
    source: Path  # the sweep file the night ran (a scratch copy)
    plan: Plan
    twin: Twin
    eta: NightEta
    scale: float
    hosts: dict[str, TwinHost]
    lines: list[tuple[float, str]] = field(default_factory=list)  # (wall seconds since the start, message)
    run_dir: Path | None = None
    counts: dict[str, int] = field(default_factory=dict)
    stopped: str | None = None  # the error that stopped the night, if one did
    wall_s: float = 0.0
    tune_state: dict[str, Any] | None = None
    interrupted: bool = False  # Ctrl-C: the rehearsal stopped, not the night
    setup: TwinSetup | None = None  # the twins' shared record (the stand-ins' boots)
    started: float = 0.0  # monotonic, when the night began
    scale_note: str | None = None  # why the night is compressed less than asked

    def night_s(self, wall: float) -> float:
        """The night's seconds at `wall` seconds after the start: the stand-ins' own boots are not the night's."""
        booting = self.setup.booting_s(self.started, self.started + wall) if self.setup else 0.0
        return max(0.0, wall - booting) / self.scale


def _document(request: RehearsalRequest, scratch: Path) -> tuple[dict[str, Any], str]:
    """The sweep document the night runs, and which command it stands for."""
    found = sweep_document(request.target)
    if found is not None and request.command != "up":
        document = dict(found[0])
        command = request.command or "sweep"
    elif request.command == "sweep":
        raise RecipeError(f"rehearse sweep {request.target}: no sweep file by that name or path",
                          "Name a file under recipes/sweeps (seed000) or give its path.")
    else:
        path, method = resolve(request.target)
        recipe = load_recipe(path)
        name, engine_spec = recipe.engine(request.engine)
        if request.command == "tune":
            methods = list(engine_spec.methods)
            document = {"name": recipe.name, "recipe": str(path.resolve()), "engines": [name], "methods": methods,
                        "concurrency": [1], "workloads": ["seed"], "requests": 4, "warmup": 1}
            command = "tune"
        else:
            document = {"name": f"up-{recipe.name}", "recipe": str(path.resolve()), "engines": [name],
                        "methods": [method or recipe.default_method], "concurrency": [1], "workloads": ["seed"],
                        "requests": 2, "warmup": 0, "repeats": 1}
            command = "up"
    if request.overrides:
        document["set"] = [*document.get("set", []), *request.overrides]
    document.pop("hosts", None)
    return document, command


PORT_CLAIMS = "sparklab-rehearse-ports"  # under the temp dir: one lock file per port a rehearsal's servers use


def _claim(port: int, claims: contextlib.ExitStack) -> bool:
    """Hold port's lock file until the rehearsal ends (False: another rehearsal on this machine holds it).

    A bind check alone races: two rehearsals started together (CI runs a dozen) both find a port free before
    either server binds it, and the second night's client then talks to the first night's server (a 401 for
    every cell, seen in CI). The lock is the kernel's (flock), so a rehearsal that dies releases its ports."""
    folder = Path(tempfile.gettempdir()) / PORT_CLAIMS
    try:
        folder.mkdir()
        folder.chmod(0o1777)  # every user's rehearsals claim ports here, as in /tmp itself
    except FileExistsError:
        pass
    try:
        fd = os.open(folder / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # another user's lock file we may not open: theirs
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    claims.callback(os.close, fd)
    return True


def _take(ports: list[int], claims: contextlib.ExitStack) -> bool:
    """Whether every port is free here and now claimed into `claims` (all of them, or none: a partial claim is
    released at once)."""
    if any(port_in_use("127.0.0.1", port) for port in ports):
        return False
    with contextlib.ExitStack() as attempt:
        if not all(_claim(port, attempt) for port in ports):
            return False
        claims.push(attempt.pop_all())
    return True


def _ephemeral_range() -> range:
    """The ports the kernel hands to outgoing connections here: a server port among them can be taken, between
    the bind check and the server's bind, by any client's socket (seen in CI: "port 43278 is still in use")."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    return range(low, high + 1)


def _twin_ports(ports: list[int], offset: int, hosts: int) -> list[int]:
    """The server ports of every twin host under this offset (_hosts_entries: each host 100 above the one before)."""
    return [p + offset + 100 * h for p in ports for h in range(hosts)]


def _free_offset(ports: list[int], hosts: int, claims: contextlib.ExitStack) -> int:
    """A port offset under which every server port of every twin host (100 apart) is outside the ephemeral range,
    free here and claimed by this rehearsal alone (the claims last as long as `claims`)."""
    ephemeral = _ephemeral_range()

    def usable(offset: int) -> bool:
        return all(0 < p <= 65535 and p not in ephemeral for p in _twin_ports(ports, offset, hosts))

    # 7: not on a round number; never 0, so that a server rendered without the offset is never on a claimed port
    candidates = [offset for offset in range(7, 58000, 7) if usable(offset)]
    random.Random().shuffle(candidates)  # rehearsals started together rarely try the same first
    for offset in candidates[:400]:
        if _take(_twin_ports(ports, offset, hosts), claims):
            return offset
    raise SparklabError("no free port range for the twin's servers on this machine",
                        f"Stop what listens on ports outside {ephemeral.start}-{ephemeral.stop - 1} (the kernel's "
                        "range for outgoing connections) or another rehearsal, then try again.")


def _free_port(claims: contextlib.ExitStack) -> int:
    """One port outside the ephemeral range, free here and claimed by this rehearsal alone."""
    ephemeral = _ephemeral_range()
    candidates = [port for port in range(20000, 65536) if port not in ephemeral]
    for port in random.Random().sample(candidates, min(400, len(candidates))):
        if _take([port], claims):
            return port
    raise SparklabError("no free port for the twin cluster's rendezvous on this machine",
                        "Stop another rehearsal (or what listens on ports 20000-65535), then try again.")


def _hosts_entries(need: int, offset: int) -> list[dict[str, Any]]:
    if need <= 1:
        return [{"docker": "local", "port_offset": offset}]
    # the link between the twins is this machine's loopback (the stand-ins' Ray and NCCL names only)
    return [{"docker": f"ssh://twin@spark-{i + 1}", "name": f"spark-{i + 1}", "address": "127.0.0.1",
             "port_offset": offset + 100 * i, "cluster_address": "127.0.0.1", "interface": "lo",
             "ib_hca": f"twin{i}"} for i in range(need)]


def _plan_of(path: Path, request: RehearsalRequest) -> Plan:
    """The plan of the night's scratch copy of its sweep; its errors name what the user gave (the sweep file, or the
    rehearse target), not the copy, which is gone by the time the error is read."""
    try:
        return build_plan(path)
    except RecipeError as exc:
        copy = f"{path}: "
        if not exc.message.startswith(copy):
            raise
        found = sweep_document(request.target) if request.command != "up" else None
        given, rest = str(found[1]) if found is not None else f"rehearse {request.target}", exc.message[len(copy):]
        flag = next((o for o in request.overrides if rest.startswith(f"set: {o}: ")), None)
        if flag is not None:  # the command line's --set, not the file's set:
            given, rest = f"rehearse {request.target} --set {flag}", rest[len(f"set: {flag}: "):]
        raise RecipeError(f"{given}: {rest}", exc.hint) from None


def prepare(request: RehearsalRequest, scratch: Path,
            claims: contextlib.ExitStack) -> tuple[Rehearsal, dict[str, TwinRuntime]]:
    """The night's plan on its twin hosts (their ports claimed in `claims`), and a twin runtime per host."""
    if request.fault is not None and request.fault not in FAULTS:
        raise RecipeError(f"--fault {request.fault!r} is not a fault the twin knows",
                          f"Use one of: {', '.join(FAULTS)}.")
    document, command = _document(request, scratch)
    first = scratch / "plan.yaml"
    first.write_text(yaml.safe_dump(document, sort_keys=False))
    plan = _plan_of(first, request)
    recipe = plan.servers[0].recipe
    if recipe.hardware is None:
        raise RecipeError(f"{recipe.source}: hardware: not set, so sparklab does not know which twin to rehearse on",
                          "Rehearse a recipe with `hardware: gb10` (its twin is recipes/hardware.yaml's gb10.twin).")
    twin = load_twin(recipe.hardware)
    need = max(multinode.nodes_of(s.recipe, s.engine) for s in plan.servers)
    if request.fault == "host-lost" and need < 2:
        raise RecipeError(
            f"rehearse {request.target} --fault host-lost: this night runs on one machine, the one sparklab runs on, "
            "so losing its host stops sparklab with it: no sweep goes on without it, and the run resumes where it "
            "stopped once the machine is back (`sparklab sweep FILE --resume RUN`; the same `sparklab tune` again)",
            "Rehearse a host lost on a night over two hosts, where the other host goes on: "
            "`sparklab rehearse up gb10-pair --fault host-lost` (the pair's worker Spark goes away mid-night).")
    ports = sorted({s.spec.port for s in plan.servers})
    offset = _free_offset(ports, need, claims)
    document["hosts"] = _hosts_entries(need, offset)
    # a cluster's rendezvous (Ray's GCS on 6379, SGLang's --dist-init-addr) binds on the head as a server does: the
    # twins' head is this machine, so it gets a claimed port too (two pair rehearsals, or a Redis here, on 6379)
    clustered = sorted({s.engine for s in plan.servers if multinode.nodes_of(s.recipe, s.engine) > 1})
    document["set"] = [*document.get("set", []),
                       *(f"engines.{engine}.cluster_port={_free_port(claims)}" for engine in clustered)]
    source = scratch / f"{document['name']}.yaml"
    source.write_text(yaml.safe_dump(document, sort_keys=False))
    plan = _plan_of(source, request)
    eta = night_eta(plan, twin)
    scale, scale_note = choose_scale(request.wall_s, eta.night_s, request.scale, plan.sweep.load_stall_s)
    setup = TwinSetup(str(document["name"]).removeprefix("up-"), scratch / "twin",
                      ports=frozenset(_twin_ports(ports, offset, need)))
    names = [entry.get("name", "local") for entry in document["hosts"]]
    # one twin takes an engine's fault or a host loss: the head's first server dies or leaks; the last host goes
    # (a pair's worker Spark: the head's host goes on, as the sweep's other hosts do)
    faulted = names[-1] if request.fault == "host-lost" else names[0]
    runtimes: dict[str, TwinRuntime] = {}
    for name in names:
        host = TwinHost(twin, scale, name if need > 1 else "", throttle=request.throttle,
                        disk_full_after_ready=request.fault == "disk-full",
                        read_gbps=SLOW_DOWNLOAD_GBPS if request.fault == "slow-download" else None)
        fault = request.fault if name == faulted and request.fault in RUNTIME_FAULTS else None
        runtimes[name] = TwinRuntime(host, setup, name, fault)
    rehearsal = Rehearsal(request, command, source, plan, twin, eta, scale, {n: r.host for n, r in runtimes.items()},
                          setup=setup, scale_note=scale_note)
    return rehearsal, runtimes


@contextlib.contextmanager
def rehearse(request: RehearsalRequest, say: Say) -> Iterator[Rehearsal]:
    """Run the night against the twin and yield its record (sparklab.rehearse.verdict reads it; the run directory is
    there until the block ends, then removed unless the request keeps it)."""
    scratch = Path(tempfile.mkdtemp(prefix="sparklab-rehearse-"))
    claims = contextlib.ExitStack()
    try:
        rehearsal, runtimes = prepare(request, scratch, claims)
        started = rehearsal.started = time.monotonic()

        def heard(message: str) -> None:
            rehearsal.lines.append((time.monotonic() - started, message))
            say(message)

        try:
            _run(rehearsal, runtimes, scratch, heard)
        except SparklabError as exc:
            rehearsal.stopped = exc.message
            heard(f"the night stopped: {exc.message}")
        finally:
            rehearsal.wall_s = time.monotonic() - started
            for runtime in runtimes.values():
                runtime.close()  # its timers fire no more; what a lost twin held is removed
        rehearsal.run_dir = rehearsal.run_dir or _run_dir(request.runs_dir or scratch / "runs")
        if rehearsal.run_dir is not None:
            from sparklab.sweep.store import Store

            with Store.open(rehearsal.run_dir / "results.sqlite") as store:
                rehearsal.counts = store.counts()
        yield rehearsal
    finally:
        claims.close()
        if not request.keep:
            shutil.rmtree(scratch, ignore_errors=True)


def _run(rehearsal: Rehearsal, runtimes: dict[str, TwinRuntime], scratch: Path, say: Say) -> None:
    request = rehearsal.request
    runs_dir = request.runs_dir or scratch / "runs"
    options = Options(time_scale=rehearsal.scale)
    local: HostRuntime | None = runtimes.get("local")

    def reach(host: Host) -> HostRuntime:
        return runtimes[host.name]

    if rehearsal.command == "tune":
        from sparklab.tune import driver

        choices = driver.TuneChoices(str(rehearsal.source), runs_dir=runs_dir, new=True, download=False)
        tune_request = driver.request_for(choices)
        tune_request = dataclasses.replace(tune_request, options=options)
        tuned = driver.run_tune(tune_request, say, runtime=local, reach=reach)
        rehearsal.run_dir, rehearsal.tune_state, rehearsal.interrupted = tuned.run_dir, tuned.state, tuned.interrupted
        return
    sweep_request = runner.Request(rehearsal.source, runs_dir, new=True, options=options, download=False)
    outcome = runner.sweep(sweep_request, say, runtime=local, reach=reach)
    rehearsal.run_dir, rehearsal.interrupted = outcome.run_dir, outcome.interrupted


def _run_dir(runs_dir: Path) -> Path | None:
    """The run a night that stopped early left (its outcome never came back)."""
    found = sorted(runs_dir.glob("*/results.sqlite"))
    return found[-1].parent if found else None
