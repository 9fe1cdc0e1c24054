"""The tests' one fake runtime and one fake server: `FakeRuntime` is a `runtimes.base.HostRuntime` (so a Runtime),
`FakeServer` a `runtimes.base.Server` on the real `Lifecycle` base; tests/unit/test_runtime_protocols.py holds
them to the Protocols as it holds every real runtime.

Both record what they are asked in `events` (a list a test may share between several fakes, to see the order of a
start or a teardown across hosts) and have knobs for the faults tests need: an image a host cannot have, a start
it refuses, a cluster port that opens late, a teardown that fails, a host that stops answering."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from sparklab.engines.parsers import Probe, ProbeRun
from sparklab.errors import ContainerError, EngineUnreachable, ImageUnavailableError, ServerError
from sparklab.host.facts import HostFacts, ThisMachine
from sparklab.runtimes.base import ImageInfo, Lifecycle, LogListener, PullCallback, ServerInfo, Target
from sparklab.spec import LaunchSpec

DIGEST = "sha256:" + "2" * 64
IMAGE_ID = "sha256:" + "1" * 64


@cache
def _cpu_spec() -> LaunchSpec:
    from sparklab.recipes.render import render
    from sparklab.recipes.schema import load_recipe, recipes_dir

    return render(load_recipe(recipes_dir() / "cpu.yaml"), "vllm-cpu", "none")


def spec_named(name: str) -> LaunchSpec:
    """A real rendered launch (recipes/cpu.yaml, vLLM CPU, no drafting) under another server name."""
    return dataclasses.replace(_cpu_spec(), name=name)


class FakeServer(Lifecycle):
    """A server that runs until it is killed or stopped; its log is `lines`. port_after: probes of a cluster port
    that fail before it answers; fail_stop: its host does not answer the teardown."""

    def __init__(self, spec: LaunchSpec | str, events: list[str] | None = None, port_after: int = 0,
                 detach: bool = False, on_log: LogListener | None = None) -> None:
        super().__init__(detach, on_log)
        self.spec = spec if isinstance(spec, LaunchSpec) else spec_named(spec)
        self.events = events if events is not None else []
        self.log_path: Path | None = None
        self.lines = [f"{self.name}: last lines", "Application startup complete."]
        self.running = True
        self.code: int | None = None
        self.port_after = port_after
        self.fail_stop = False
        self.oom = False
        self.killed = threading.Event()

    @property
    def name(self) -> str:
        return self.spec.name

    def state(self) -> tuple[bool, int | None]:
        return self.running, self.code

    def oom_killed(self) -> bool | None:
        return self.oom

    def log_tail(self, lines: int = 50) -> str:
        return "\n".join(self.lines[-lines:])

    def log_since(self, since: float) -> str:
        return ""

    def full_log(self) -> str:
        return "\n".join(self.lines)

    def port_open(self, address: str, port: int, timeout_s: int = 5) -> bool:
        self.events.append(f"probe {address}:{port}")
        self.port_after -= 1
        return self.port_after < 0

    def kill(self) -> None:
        self.events.append(f"kill {self.name}")
        self.running, self.code = False, 137
        self.killed.set()

    def _teardown(self, grace_s: float) -> None:
        self.events.append(f"stop {self.name}")
        self.running = False
        self.killed.set()
        if self.fail_stop:
            raise ContainerError(f"cannot reach the host of {self.name}")


class FakeRuntime:
    """A host's runtime. images: ref -> architecture of the images it has (others it can pull, unless their
    name starts with gone/); servers: what it lists; leftovers: what gc removes; no_image: no image at all;
    refuse: every start is refused; up: whether it answers; on_launch: called with each spec it starts (a test's
    engine endpoint comes up then, after the preflight found its port free); parser_says: what the image's own
    parser prints when a probe runs (None: the probe cannot run here, as in the unit tier, and the check says
    "not checked"); probed: the probes it was asked to run."""

    def __init__(self, host: str = "local", events: list[str] | None = None, *, arch: str = "x86_64",
                 images: dict[str, str] | None = None, servers: list[ServerInfo] | None = None,
                 leftovers: list[ServerInfo] | None = None, mounts: set[str] | None = None, refuse: bool = False,
                 no_image: bool = False, port_after: int = 0, mem_total_gib: float = 64.0,
                 on_launch: Callable[[LaunchSpec], None] | None = None, facts: HostFacts | str | None = "default"
                 ) -> None:
        self.host, self.events = host, events if events is not None else []
        self.arch, self.images = arch, dict(images or {})
        self.servers, self.leftovers = list(servers or []), list(leftovers or [])
        self.mounts = set(mounts or ())
        self.refuse, self.no_image, self.port_after = refuse, no_image, port_after
        self.mem_total_gib = mem_total_gib
        self.on_launch = on_launch
        # what host_facts() gives: this machine's readings for the local host, nothing for another (a fake host's memory
        # cannot be read) unless a test gives its own
        self.readings = (ThisMachine(gpu=False) if host == "local" else None) if facts == "default" else facts
        self.facts_asked: list[LaunchSpec | None] = []
        self.up = True
        self.launched: list[FakeServer] = []
        self.removed: list[str] = []  # names given to remove()
        self.removed_runs: list[str] = []  # run ids given to remove_run_containers()
        self.parser_says: str | None = None
        self.probed: list[Probe] = []

    # -- base.Runtime ---------------------------------------------------------------------------------------------

    def for_spec(self, spec: LaunchSpec) -> FakeRuntime:
        return self

    def alive(self) -> bool:
        return self.up

    def host_arch(self) -> str:
        return self.arch

    def ensure_image(self, ref: str, policy: str = "missing", on_event: PullCallback | None = None,
                     platform: str | None = None) -> ImageInfo:
        self.events.append(f"image on {self.host}")
        if self.no_image:
            raise ImageUnavailableError(f"pull of {ref} failed: not found")
        return ImageInfo(ref, IMAGE_ID, DIGEST, self.images.get(ref, self.arch))

    def launch(self, spec: LaunchSpec, secrets: dict[str, str], log_path: Path | None = None,
               detach: bool = False, on_log: LogListener | None = None) -> FakeServer:
        if self.refuse:
            self.events.append(f"refused on {self.host}")
            raise ContainerError(f"docker could not start {spec.name}: invalid volume specification")
        self.events.append(f"launch {spec.name} on {self.host}")
        if self.on_launch is not None:
            self.on_launch(spec)
        server = FakeServer(spec, self.events, self.port_after, detach=detach, on_log=on_log)
        self.launched.append(server)
        return server

    def probe(self, image: str, probe: Probe, timeout_s: float) -> ProbeRun:
        self.probed.append(probe)
        if self.parser_says is None:
            return ProbeRun(None, "", "", 0.0, error="the fake runtime runs no parser")
        return ProbeRun(0, self.parser_says, "", 0.1)

    def containers(self, include_stopped: bool = True) -> list[ServerInfo]:
        return [s for s in self.servers if include_stopped or s.status == "running"]

    def orphans(self) -> list[ServerInfo]:
        return list(self.leftovers)

    def gc(self) -> list[ServerInfo]:
        removed, self.leftovers = self.leftovers, []
        return removed

    def remove(self, name: str, grace_s: float = 10) -> None:
        self.removed.append(name)

    def kill(self, name: str) -> None:
        self.events.append(f"kill {name} on {self.host}")

    def container_id(self, name: str) -> str | None:
        return None

    def mount_sources(self) -> set[str]:
        return set(self.mounts)

    def endpoint_of(self, name: str | None) -> Target:
        found = [s for s in self.servers if name in (None, s.name) and s.status == "running"]
        if len(found) != 1:
            raise ServerError(f"no running server named {name}")
        return Target(found[0].labels.get("sparklab.endpoint", ""), None, found[0].name, None)

    def logs(self, name: str, follow: bool = False, tail: int | str = "all",
             since: float | None = None) -> Iterator[bytes]:
        yield b""

    def log_text(self, name: str, since: float | None = None) -> str:
        return ""

    def remove_run_containers(self, run_id: str, wait_s: float = 120.0) -> list[str]:
        self.removed_runs.append(run_id)
        return []

    # -- base.HostRuntime -----------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return "local" if self.host == "local" else f"ssh://fake@{self.host}"

    def facts(self) -> dict[str, Any]:
        return {"architecture": self.arch, "mem_total_gib": self.mem_total_gib, "docker_version": "fake"}

    def image_info(self, ref: str) -> ImageInfo | None:
        arch = self.images.get(ref)
        return None if arch is None else ImageInfo(ref, IMAGE_ID, DIGEST, arch)

    def host_facts(self, spec: LaunchSpec | None = None) -> HostFacts | None:
        self.facts_asked.append(spec)
        return self.readings if not isinstance(self.readings, str) else None

    def registry_platforms(self, ref: str) -> list[str] | None:
        """As containers.Docker's: the registry cannot be asked here (a parser check then pulls as a start would)."""
        return None

    def image_problem(self, ref: str, policy: str = "missing") -> str | None:
        if ref in self.images or (policy != "never" and not ref.startswith("gone/")):
            return None
        return f"{ref} cannot be pulled there: manifest unknown"


class FakeFacts:
    """A host's readings a test sets (host.facts.HostFacts): memory in GiB, what was evicted, whether it was closed."""

    sources = "a test's fake host"
    clock_source = "none"

    def __init__(self, where: str = "fake host", total: float = 121.7, free: float = 100.0, available: float = 110.0,
                 cached: float = 5.0) -> None:
        from sparklab.host.memory import HostMemory

        self.where = where
        self.memory = HostMemory(total, free, available, cached)
        self.evicted: list[str] = []
        self.closed = False
        self.reads = 0

    def set(self, **values: float) -> None:
        self.memory = dataclasses.replace(self.memory, **{f"{k}_gib": v for k, v in values.items()})

    def meminfo(self) -> Any:
        self.reads += 1
        return self.memory

    def container_memory(self, container_id: str) -> None:
        return None

    def gpu_memory(self) -> None:
        return None

    def gpu_clocks(self) -> None:
        return None

    def evict_model_files(self, recipe: Any, spec: LaunchSpec) -> tuple[int, int]:
        self.evicted.append(spec.name)
        self.set(free=self.memory.free_gib + self.memory.cached_gib, cached=0.0)
        return 2, int(self.memory.free_gib * 2**30)

    def drop_all_page_cache(self) -> bool:
        return False

    def free_bytes(self, path: Path) -> int | None:
        return 2**40

    def is_dir(self, path: Path) -> bool:
        return True

    def oom_evidence(self, kernel: bool = True) -> str | None:
        return None

    def engine_version(self, spec: LaunchSpec) -> str | None:
        return None

    def close(self) -> None:
        self.closed = True


class NoEngineAPI:
    """An EngineAPI with no engine behind it: every request is unreachable (a sweep's counters then read nothing)."""

    def __init__(self, *a: object) -> None:
        pass

    def get(self, path: str) -> None:
        raise EngineUnreachable("no engine here")

    post = get


@dataclasses.dataclass
class OneServerSweep:
    """A planned one-server cpu sweep whose start returns `ready` (a FakeServer) at once: for tests of what a sweep
    does between the start and the cells (tests/unit/test_interrupt_after_ready.py, test_host_deadlines.py)."""

    plan: Any
    server: Any
    store: Any
    fake: FakeServer
    ready: Any


def one_server_sweep(tmp_path: Path, monkeypatch: Any, concurrency: list[int]) -> OneServerSweep:
    """The sweep planned and registered in tmp_path, the store created (not entered), the start patched."""
    import yaml

    from sparklab.engines.scrape import StartupFacts
    from sparklab.recipes.plan import build_plan
    from sparklab.runtimes.launch import Ready
    from sparklab.sweep import runner
    from sparklab.sweep import serverrun as sweep_mod
    from sparklab.sweep.store import Store

    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "recipe": "cpu", "methods": ["none"], "concurrency": concurrency,
                                    "requests": 2}))
    plan = build_plan(path, run_id="t-1")
    (server,) = plan.servers
    store = Store.create(tmp_path / "results.sqlite", plan.sweep.model_dump(), "test")
    runner.register(plan, store)
    fake = FakeServer(server.spec)
    ready = Ready(fake, ImageInfo("img", "id", None, "amd64"), 1.0, None, StartupFacts())
    monkeypatch.setattr(sweep_mod, "_wait_port_free", lambda *a: None)
    monkeypatch.setattr(sweep_mod.launch, "checked", lambda recipe, spec, *a, **kw: None)
    monkeypatch.setattr(sweep_mod.launch, "start", lambda *a, **k: ready)
    return OneServerSweep(plan, server, store, fake, ready)
