"""A DGX Spark twin's live readings (a `HostFacts`, host/facts.py), driven by its host model
(recipes/hardware.yaml's `<device>.twin`, read by recipes/twin.py) and by the servers a rehearsal starts on it.

Memory is modelled as an engine on unified memory behaves, in GiB, on the night's clock (wall seconds / scale):
  - the host's own use (`os_baseline_gib`) and the kernel's reserve (`reserve_gib`, what MemAvailable holds back);
  - other files' page cache (`page_cache_gib`) and each model's files as the engine reads them at load, at
    `disk_read_gbps` (MemFree falls, MemAvailable does not: page cache is reclaimable);
  - at ready the engine takes its memory fraction (`fraction x MemTotal`, or of the memory free at its start for an
    engine that sizes from that, engines/base.py `memory_fraction_of`), or its weights for one with no fraction,
    and its memory outside the fraction (`outside_gib`), plus `per_request_gib` per request in flight (the
    stand-in writes its load to a file, STANDIN_LOAD_FILE);
  - the kernel reclaims page cache before MemFree goes under the reserve; a drop of a model's page cache gives
    its files back.
Clocks, power and temperature follow the load (idle -> load, the temperature with `heat_time_constant_s`), with
the throttle of the host model once a rehearsal asks for it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sparklab.engines import engine
from sparklab.host.clocks import REASONS, GpuClocks
from sparklab.host.facts import CgroupReading
from sparklab.host.memory import HostMemory, engine_need
from sparklab.recipes.schema import Recipe
from sparklab.recipes.twin import GIB, Twin
from sparklab.spec import LaunchSpec

GB_PER_GIB = GIB / 1e9
IDLE_REASON = 0x1
DISK_FULL_GIB = 0.1  # the disk-full fault: what is left under the runs directory once the first server is ready


@dataclass
class TwinServer:
    """One engine on the twin: what it loads, when (on the night's clock), and what it takes at ready."""

    name: str
    kind: str
    started_s: float
    files: dict[str, float]  # checkpoint id -> GiB it reads at load
    ready_after_s: float  # load and init, night seconds
    takes_gib: float  # at ready: its fraction (or its weights), with what it holds outside it
    per_request_gib: float
    load_file: Path | None
    leak_gib_per_s: float = 0.0  # the oom fault: memory it keeps taking under load
    alive: Callable[[], bool] | None = None  # its process runs (None: until stop())
    stopped: bool = False
    label: str = ""  # engine/method K=k, as the sweep names the server
    node_rank: int | None = None  # a node of a server across hosts (0: its head), None: a server on one host
    at_start: HostMemory | None = None  # the host's memory when it started
    lowest_available_gib: float = math.inf  # under load: from its ready to its end
    lowest_free_gib: float = math.inf


@dataclass
class TwinState:
    servers: dict[str, TwinServer] = field(default_factory=dict)
    cached: dict[str, float] = field(default_factory=dict)  # model file's page cache (GiB) by checkpoint id
    loaded_since_s: float | None = None  # under load since (night seconds), for the temperature and the throttle
    idle_since_s: float | None = None  # no request in flight since (night seconds)
    oom: str | None = None


class TwinHost:
    """The twin of one device as a host: readings from its model and the servers started on it."""

    def __init__(self, twin: Twin, scale: float, name: str = "", *, throttle: bool = False,
                 disk_full_after_ready: bool = False, read_gbps: float | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.twin, self.scale, self.throttle = twin, scale, throttle
        self.where = f"the twin of {twin.name}" + (f" ({name})" if name else "")
        self.sources = f"the {twin.name} twin's host model (recipes/hardware.yaml, {twin.source})"
        self.clock_source = "the twin's host model"
        self._clock = clock or time.monotonic
        self._t0 = self._clock()
        self._disk_full_after_ready = disk_full_after_ready  # the disk-full fault: logs or a download filled it
        self._read_gbps = read_gbps or twin.host.disk_read_gbps
        self._lock = threading.Lock()
        self._warm_images: set[str] = set()  # images started once: their engine caches (compile, JIT) are warm
        self.state = TwinState()
        self.history: list[TwinServer] = []  # every server started here, in order

    # -- the night's clock ---------------------------------------------------------------------------------------

    def now_s(self) -> float:
        return (self._clock() - self._t0) / self.scale

    # -- what a rehearsal's runtime tells it -------------------------------------------------------------------------

    def start(self, spec: LaunchSpec, load_file: Path | None, *, leak_gib_per_s: float = 0.0) -> TwinServer:
        """An engine starts: what it reads, when it is ready and what it takes then (this moment's memory)."""
        model = self.twin.engine(spec.kind)
        files = {i: m.weights_gib for i, m in self.twin.data.models.items() if any(i in a for a in spec.argv)}
        before = self.meminfo()
        ready_after = self.start_seconds(spec)
        self._warm_images.add(spec.image)
        need = engine_need(spec, before.total_gib)
        if need is None:
            takes = sum(files.values())
        elif engine(spec.kind).memory_fraction_of == "free":
            takes = need.fraction * before.available_gib
        else:
            takes = need.gib
        server = TwinServer(spec.name, spec.kind, self.now_s(), files, ready_after,
                            takes + model.outside_gib, model.per_request_gib, load_file, leak_gib_per_s,
                            label=_label(spec), at_start=before, node_rank=_node_rank(spec))
        with self._lock:
            self.state.servers[spec.name] = server
            self.history.append(server)
        return server

    def watch(self, name: str, alive: Callable[[], bool]) -> None:
        """How the twin tells the engine's process still holds its memory."""
        with self._lock:
            if name in self.state.servers:
                self.state.servers[name].alive = alive

    def stop(self, name: str) -> None:
        with self._lock:
            server = self.state.servers.get(name)
            if server is not None:
                server.stopped = True

    def start_seconds(self, spec: LaunchSpec) -> float:
        """Night seconds from start to ready of this launch: its files at the read rate, its init, and the cold
        init of a first start (of each server for an engine that builds, else of its image)."""
        model = self.twin.engine(spec.kind)
        files = sum(m.weights_gib for i, m in self.twin.data.models.items() if any(i in a for a in spec.argv))
        cold = model.cold_per_server or spec.image not in self._warm_images
        return files * GB_PER_GIB / self._read_gbps + model.init_s + (model.cold_init_s if cold else 0.0)

    # -- HostFacts -------------------------------------------------------------------------------------------------

    def meminfo(self) -> HostMemory:
        now = self.now_s()
        host, total = self.twin.host, self.twin.mem_total_gib
        with self._lock:
            used = self.twin.os_baseline_gib
            loaded = False
            for server in self.state.servers.values():
                if not server.stopped and server.alive is not None and not server.alive():
                    server.stopped = True  # its process ended: its memory is back
                if server.stopped:
                    continue
                elapsed = now - server.started_s
                read = min(1.0, elapsed / max(1e-9, server.ready_after_s)) if server.ready_after_s else 1.0
                for checkpoint, gib in server.files.items():  # read through the page cache at load
                    self.state.cached[checkpoint] = max(self.state.cached.get(checkpoint, 0.0), gib * read)
                if elapsed >= server.ready_after_s:
                    running = self._running(server)
                    loaded = loaded or running > 0
                    used += server.takes_gib + running * server.per_request_gib
                    if server.leak_gib_per_s and running:
                        used += server.leak_gib_per_s * (elapsed - server.ready_after_s)
            if loaded:
                self.state.idle_since_s = None
                if self.state.loaded_since_s is None:
                    self.state.loaded_since_s = now
            elif self.state.idle_since_s is None:
                self.state.idle_since_s = now
            elif now - self.state.idle_since_s > host.heat_time_constant_s:  # cooled down: a pause, not a gap
                self.state.loaded_since_s = None
            if used > total - host.reserve_gib / 2 and self.state.oom is None:
                self.state.oom = (f"Out of memory: the twin of {self.twin.name} killed an engine ({used:.1f} GiB in "
                                  f"use of {total:.1f} GiB)")
            cache = host.page_cache_gib + sum(self.state.cached.values())
            room = max(0.0, total - used - host.reserve_gib)
            if cache > room:  # the kernel reclaims page cache before MemFree goes under its reserve
                scale = room / cache if cache else 0.0
                self.state.cached = {k: v * scale for k, v in self.state.cached.items()}
                cache = room
            free = max(0.0, total - used - cache)
            available = max(0.0, free + cache - host.reserve_gib)
            reading = HostMemory(total, free, available, cache)
            for server in self.state.servers.values():
                if not server.stopped and now - server.started_s >= server.ready_after_s:
                    server.lowest_available_gib = min(server.lowest_available_gib, available)
                    server.lowest_free_gib = min(server.lowest_free_gib, free)
        return reading

    @staticmethod
    def _running(server: TwinServer) -> int:
        if server.load_file is None:
            return 0
        try:
            return int(server.load_file.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def container_memory(self, container_id: str) -> CgroupReading | None:
        return None  # host processes: the host's memory is the reading

    def gpu_memory(self) -> tuple[float, float] | None:
        return None  # GB10: nvidia-smi reports no memory on unified memory ([N/A])

    def gpu_clocks(self) -> GpuClocks | None:
        host = self.twin.host
        now = self.now_s()
        with self._lock:
            since = self.state.loaded_since_s
            idle = self.state.idle_since_s is not None
        if since is None or idle:
            return GpuClocks(host.idle.sm_clock_mhz, host.max_sm_clock_mhz, host.idle.power_w,
                             host.idle.temperature_c, IDLE_REASON)
        under = now - since
        heat = 1 - math.exp(-under / host.heat_time_constant_s)
        temperature = host.idle.temperature_c + (host.load.temperature_c - host.idle.temperature_c) * heat
        if self.throttle and under >= host.throttle.after_s:
            bit = next(b for b, (n, _) in REASONS.items() if n == host.throttle.reason)
            return GpuClocks(host.throttle.sm_clock_mhz, host.max_sm_clock_mhz, host.load.power_w,
                             host.throttle.temperature_c, bit)
        return GpuClocks(host.load.sm_clock_mhz, host.max_sm_clock_mhz, host.load.power_w, temperature, 0)

    def evict_model_files(self, recipe: Recipe, spec: LaunchSpec) -> tuple[int, int]:
        with self._lock:
            dropped = {i: g for i, g in self.state.cached.items() if any(i in a for a in spec.argv)}
            for checkpoint in dropped:
                self.state.cached[checkpoint] = 0.0
        return len(dropped), int(sum(dropped.values()) * GIB)

    def drop_all_page_cache(self) -> bool:
        return False  # sparklab runs as a user on the twin, as the README advises on a Spark

    def free_bytes(self, path: Path) -> int | None:
        now = self.now_s()
        with self._lock:
            full = self._disk_full_after_ready and any(now - s.started_s >= s.ready_after_s
                                                       for s in self.state.servers.values())
        return int((DISK_FULL_GIB if full else self.twin.host.disk_free_gib) * GIB)

    def is_dir(self, path: Path) -> bool:
        return True

    def oom_evidence(self, kernel: bool = True) -> str | None:
        return self.state.oom

    def engine_version(self, spec: LaunchSpec) -> str | None:
        return self.twin.engine(spec.kind).version

    def close(self) -> None:
        pass


def _node_rank(spec: LaunchSpec) -> int | None:
    rank = spec.labels.get("sparklab.node_rank")  # sparklab.recipes.multinode labels each node's spec
    return int(rank) if rank is not None else None


def _label(spec: LaunchSpec) -> str:
    """As plan.ServerConfig.label: engine/method and K."""
    k = spec.speculative.num_speculative_tokens if spec.speculative else None
    return f"{spec.engine}/{spec.method}" + (f" K={k}" if k is not None else "")
