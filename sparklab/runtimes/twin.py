"""A DGX Spark twin as a Docker host (a `HostRuntime`): every server a rehearsal starts on it runs as the stand-in
engine (docker/standin, a host process speaking the engine's surface) instead of the real one, timed by the twin's
engines model (recipes/twin/<device>.yaml) and read through the twin's host facts (host/twin.py).

Nothing is pulled: an image "is there" (the real night pulls it before the clock; the ETA counts its size). The
launch keeps the recipe's argv, port and environment and swaps the program for the stand-in's, adding its knobs:
STANDIN_MODEL (decode timing), STANDIN_TIME_SCALE, STANDIN_START_DELAY (load and init, night seconds),
STANDIN_VERSION, STANDIN_LOAD_FILE (requests in flight, which the twin's memory reads) and, for an engine that
checks memory at its start (vLLM 0.27.1: MemAvailable), STANDIN_UNIFIED_MEMORY with the twin's meminfo at that
moment (STANDIN_MEMINFO). A fault (`rehearse --fault`) is given to one twin of the night (sparklab.rehearse.night
says which): an engine's fault is a knob on that twin's first server; a host loss takes the whole twin away, after
which it answers nothing, as a Docker host that lost power: its servers' state, teardown and logs raise.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparklab.engines.parsers import Probe, ProbeRun
from sparklab.errors import ServerError
from sparklab.host.facts import HostFacts
from sparklab.host.twin import TwinHost
from sparklab.runtimes.base import ImageInfo, LogListener, PullCallback, ServerInfo, Target
from sparklab.runtimes.processes import Processes, ProcessServer
from sparklab.spec import LaunchSpec

STANDIN = Path(__file__).resolve().parents[2] / "docker" / "standin"
TWIN_ARCH = "aarch64"  # a DGX Spark's CPU (GB10: 20 Arm cores)
FAULTS = ("dead-engine", "oom", "slow-download", "disk-full", "host-lost")
RUNTIME_FAULTS = ("dead-engine", "oom", "host-lost")  # what one TwinRuntime does; the others are its TwinHost's
# dead-engine: the first server's engine dies as its 2nd completion request arrives (the warmup's, or a cell's
# first, then the cell's): a count, not a time, so the death lands inside its cells however fast the machine runs
# them (a time after ready fell after the last cell of a fast tiny night: the fault then lost nothing)
DEAD_AT_REQUEST = 2
LEAK_GIB_PER_S = 0.05  # oom: the first server's engine keeps taking 3 GiB a minute under load
BOOT_WAIT_S = 60.0  # wall seconds a stand-in may take to print its first line before the night's clock starts anyway
HOST_LOST_AFTER_S = 60.0  # host-lost: the twin goes away this long after its first server is ready (night seconds)


def _await_boot(server: ProcessServer, booted: threading.Event) -> None:
    """Return once the stand-in printed its first line (or exited, or BOOT_WAIT_S passed): its own boot (a Python
    start, seconds on a busy machine) is no part of the engine's modelled start, so the night's clock - readiness,
    its stall window, compressed to ~1 s of wall time for seed000 - starts after it."""
    deadline = time.monotonic() + BOOT_WAIT_S
    while not booted.wait(0.05) and time.monotonic() < deadline and server.state()[0]:
        pass


def standin_dir() -> Path:
    if not (STANDIN / "standin.py").is_file():
        raise ServerError(f"{STANDIN}: the stand-in engine is not there, so sparklab cannot rehearse",
                          "Rehearse from a source checkout of sparklab (the stand-in lives in docker/standin).")
    return STANDIN


@dataclasses.dataclass
class TwinSetup:
    """What a rehearsal tells its twins: the sweep it runs (for the engines' profile), the scratch dir."""

    sweep: str | None
    scratch: Path
    head: LaunchSpec | None = None  # the last head node started: a worker joining it holds what the head holds
    boots: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # stand-ins' boots (monotonic)
    # the server ports the rehearsal claimed for its twins (empty: not checked); a start elsewhere is refused
    ports: frozenset[int] = frozenset()

    def booting_s(self, since: float, until: float) -> float:
        """Wall seconds between `since` and `until` (monotonic) that stand-ins spent booting (overlaps once): no
        night time passes then."""
        total, reached = 0.0, since
        for start, end in sorted(self.boots):
            start, end = max(start, reached), min(end, until)
            if end > start:
                total += end - start
                reached = end
        return total


class TwinServer(ProcessServer):
    """A stand-in on a twin host. Once the host is lost it answers as a server on a Docker host that lost power: its
    state, its teardown and its log cannot be read (a ServerError, where docker-py would time out)."""

    host_lost: threading.Event | None = None  # its twin's (TwinRuntime.launch sets it)

    def answer(self) -> None:
        if self.host_lost is not None and self.host_lost.is_set():
            raise ServerError(f"{self.name}: its host does not answer (rehearse --fault host-lost)")

    def running(self) -> bool:
        """Whether the stand-in runs, as the twin's own model of its host sees it (lost or not)."""
        return super().state()[0]

    def state(self) -> tuple[bool, int | None]:
        self.answer()
        return super().state()

    def log_tail(self, lines: int = 50) -> str:
        self.answer()
        return super().log_tail(lines)

    def _teardown(self, grace_s: float) -> None:
        self.answer()
        super()._teardown(grace_s)


class TwinRuntime:
    """One twin host: the stand-ins it runs (host processes), its facts, and the fault it was given (None: none;
    one twin of a night gets it)."""

    def __init__(self, host: TwinHost, setup: TwinSetup, name: str = "local", fault: str | None = None) -> None:
        self.host, self.setup, self.name, self.fault = host, setup, name, fault
        self.processes = Processes(TwinServer)
        self.lost = threading.Event()
        self._started = 0
        self._servers: list[TwinServer] = []
        self._timers: list[threading.Timer] = []

    def _answer(self) -> None:
        """A lost twin answers nothing, as its Docker daemon would not."""
        if self.lost.is_set():
            raise ServerError(f"{self.host.where} does not answer: it is gone (rehearse --fault host-lost)")

    # -- HostRuntime ----------------------------------------------------------------------------------------------

    def for_spec(self, spec: LaunchSpec) -> TwinRuntime:
        return self

    def alive(self) -> bool:
        return not self.lost.is_set()

    @property
    def url(self) -> str:
        return "local" if self.name == "local" else f"ssh://twin@{self.name}"  # as the sweep's hosts: name it

    def facts(self) -> dict[str, Any]:  # Any: a JSON document, stored with the run as it is (as base.HostRuntime's)
        self._answer()  # a run reaching its hosts again (tune's next load) leaves a lost twin out, as a dead Spark
        return {"twin": self.host.twin.name, "architecture": TWIN_ARCH, "mem_total_gib": self.host.twin.mem_total_gib,
                "docker_version": "none (a twin: its servers are stand-ins, host processes)"}

    def host_arch(self) -> str:
        return TWIN_ARCH

    def ensure_image(self, ref: str, policy: str = "missing", on_event: PullCallback | None = None,
                     platform: str | None = None) -> ImageInfo:
        return ImageInfo(ref=ref, id=f"twin:{ref}", digest=None, architecture=TWIN_ARCH)

    def image_info(self, ref: str) -> ImageInfo | None:
        return ImageInfo(ref=ref, id=f"twin:{ref}", digest=None, architecture=TWIN_ARCH)

    def image_problem(self, ref: str, policy: str = "missing") -> str | None:
        return None

    def registry_platforms(self, ref: str) -> list[str] | None:
        return None

    def probe(self, image: str, probe: Probe, timeout_s: float) -> ProbeRun:
        return ProbeRun(None, "", "", 0.0, error="a rehearsal runs no real image: its engine's own parser did not run "
                                                 "(`sparklab check` runs it)")

    def host_facts(self, spec: LaunchSpec | None = None) -> HostFacts | None:
        return self.host

    # -- servers ------------------------------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, secrets: dict[str, str], log_path: Path | None = None,
               detach: bool = False, on_log: LogListener | None = None) -> ProcessServer:
        self._answer()
        if self.setup.ports and spec.port not in self.setup.ports:
            # a server rendered without its twin host's port_offset: on the recipe's port, another rehearsal's
            # server (each with its own API key) would answer its requests
            raise ServerError(f"cannot start {spec.name}: port {spec.port} is not one this rehearsal claimed "
                              f"({', '.join(map(str, sorted(self.setup.ports)))}); the server was rendered without "
                              "its host's port_offset, a bug in sparklab: please report it")
        first = self._started == 0
        self._started += 1
        scratch = self.setup.scratch / self.name
        scratch.mkdir(parents=True, exist_ok=True)
        load_file = scratch / f"{spec.name}.load"
        load_file.write_text("0")
        fault = self.fault if first else None
        twin = self.host.twin
        model = twin.engine(spec.kind)
        ready_after = self.host.start_seconds(spec)
        spec_info = spec.speculative
        method = spec.method if spec.method in twin.data.acceptance or spec.method == "none" else (
            spec_info.method if spec_info and spec_info.method else spec.method)
        timing = twin.timing(spec.kind, method, spec_info.num_speculative_tokens if spec_info else None,
                             self.setup.sweep)
        env = {**spec.env, "STANDIN_MODEL": timing.standin_model(self.host.scale),
               "STANDIN_TIME_SCALE": repr(self.host.scale), "STANDIN_VERSION": model.version,
               "STANDIN_LOAD_FILE": str(load_file), "STANDIN_RAY_DIR": str(scratch / "ray"),
               "STANDIN_START_DELAY": f"{ready_after:.3f}", "STANDIN_KV_TOKENS": str(model.kv_tokens),
               "PYTHONPATH": os.pathsep.join(p for p in (str(standin_dir()), os.environ.get("PYTHONPATH")) if p),
               "PATH": os.pathsep.join(p for p in (str(standin_dir() / "bin"), os.environ.get("PATH")) if p)}
        if model.cold_per_server:  # its build, silent between the lines the engine's quiet phase names
            env["STANDIN_BUILD_S"] = f"{model.cold_init_s:.3f}"
            env["STANDIN_START_DELAY"] = f"{ready_after - model.cold_init_s:.3f}"
        if model.startup_check is not None:
            meminfo = scratch / f"{spec.name}.meminfo"
            _write_meminfo(meminfo, self.host)
            env |= {"STANDIN_UNIFIED_MEMORY": model.startup_check, "STANDIN_MEMINFO": str(meminfo)}
        if fault == "dead-engine":
            env["STANDIN_FATAL_AT_REQUEST"] = str(DEAD_AT_REQUEST)
        rewritten = dataclasses.replace(spec, runtime="process", entrypoint=_program(spec), env=env, gpus=False)
        worker = bool(spec.entrypoint) and os.path.basename(spec.entrypoint[0]) == "ray"
        if not worker:
            self.setup.head = spec
        # a Ray worker holds what its head's engine loads on this host, under its own name and node labels
        held = (dataclasses.replace(self.setup.head, name=spec.name, labels=spec.labels) if worker and self.setup.head
                else spec)
        self.host.start(held, load_file, leak_gib_per_s=LEAK_GIB_PER_S if fault == "oom" else 0.0)
        booted = threading.Event()

        def tell(data: bytes) -> None:
            booted.set()
            if on_log is not None:
                on_log(data)

        launched = time.monotonic()
        server = self.processes.launch(rewritten, secrets, log_path, detach, tell)
        assert isinstance(server, TwinServer)
        server.host_lost = self.lost
        try:  # not the caller's yet: a Ctrl-C or SIGTERM during the stand-in's boot must stop it here
            _await_boot(server, booted)
        except BaseException:
            server.stop(0)
            raise
        self.setup.boots.append((launched, time.monotonic()))
        self.host.watch(spec.name, server.running)
        self._servers.append(server)
        if fault == "host-lost":
            timer = threading.Timer((ready_after + HOST_LOST_AFTER_S) * self.host.scale, self.lose)
            timer.daemon = True  # a rehearsal that ends first (or Ctrl-C) does not wait for it
            self._timers.append(timer)
            timer.start()
        return server

    def lose(self) -> None:
        """The twin goes away (power, network): its engines die with it and it answers nothing."""
        self.lost.set()
        for server in self._servers:
            server.kill()

    def close(self) -> None:
        """The night is over: no fault fires any more, and what a lost twin still holds (its stand-ins' run files;
        the real night's `sparklab gc --host` once the host is back) is removed."""
        for timer in self._timers:
            timer.cancel()
        if self.lost.is_set():
            for server in self._servers:
                if self.processes.has(server.name):
                    self.processes.remove(server.name, grace_s=2)

    def containers(self, include_stopped: bool = True) -> list[ServerInfo]:
        self._answer()
        return self.processes.containers(include_stopped)

    def orphans(self) -> list[ServerInfo]:
        self._answer()
        return self.processes.orphans()

    def gc(self) -> list[ServerInfo]:
        self._answer()
        return self.processes.gc()

    def remove(self, name: str, grace_s: float = 10) -> None:
        self._answer()
        self.processes.remove(name, grace_s)

    def kill(self, name: str) -> None:
        self._answer()
        self.processes.kill(name)

    def container_id(self, name: str) -> str | None:
        self._answer()
        return self.processes.container_id(name)

    def mount_sources(self) -> set[str]:
        return set()

    def endpoint_of(self, name: str | None) -> Target:
        return self.processes.endpoint_of(name)

    def logs(self, name: str, follow: bool = False, tail: int | str = "all",
             since: float | None = None) -> Iterator[bytes]:
        self._answer()
        return self.processes.logs(name, follow, tail, since)

    def log_text(self, name: str, since: float | None = None) -> str:
        self._answer()
        return self.processes.log_text(name, since)

    def remove_run_containers(self, run_id: str, wait_s: float = 120.0) -> list[str]:
        self._answer()
        return self.processes.remove_run_containers(run_id, wait_s)


def _program(spec: LaunchSpec) -> tuple[str, ...]:
    """The stand-in's program for the launch's: `python3 -m sglang...` runs the stand-in's sglang package, any other
    program the stand-in's command of the same name (vllm, trtedge, tensorrt-edgellm-serve)."""
    standin = standin_dir()
    name = os.path.basename(spec.entrypoint[0]) if spec.entrypoint else ""
    if name.startswith("python"):
        return (sys.executable, "-u", *spec.entrypoint[1:])
    if name in ("bash", "sh"):  # a node's script (vLLM's head: `ray start … && exec vllm …`): the stand-in's
        return tuple(spec.entrypoint)  # ray and vllm come first on its PATH
    program = standin / "bin" / name
    if not program.is_file():
        raise ServerError(f"{spec.recipe_path}: engines.{spec.engine}: the stand-in has no {name!r} program, so this "
                          "engine cannot be rehearsed",
                          f"Rehearse a recipe whose engine the twin models (it has: "
                          f"{', '.join(sorted(p.name for p in (standin / 'bin').iterdir()))}).")
    return (sys.executable, "-u", str(program))


def _write_meminfo(path: Path, host: TwinHost) -> None:
    """The twin's memory now, as /proc/meminfo says it (kB), for the engine's own startup check."""
    m = host.meminfo()
    kib = 1024 * 1024
    path.write_text(f"MemTotal: {int(m.total_gib * kib)} kB\nMemFree: {int(m.free_gib * kib)} kB\n"
                    f"MemAvailable: {int(m.available_gib * kib)} kB\nCached: {int(m.cached_gib * kib)} kB\n")
