"""Memory sampling while a server starts and while its cells run, and the floor watchdog.

One background thread per server reads its host's facts (host/facts.py: /proc/meminfo, the container's cgroup
and, where it answers, nvidia-smi; another Docker host's through a helper; a rehearsal's twin) at most
`interval_s` apart. Windows (`mark()` → `stats(mark)`) keep the minimum free and the peak
used of one server start or one cell without keeping every sample; the last few samples stay for a failure
record. When MemAvailable falls under the floor, the thread stops the server at once (GB10 hosts can hang
until a power cycle after NV_ERR_NO_MEMORY, vllm-project/vllm#46307) and the sweep records `memory-floor`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparklab.host import memory
from sparklab.host.clocks import ClockWindow, GpuClocks
from sparklab.host.facts import HostFacts, ThisMachine
from sparklab.host.headroom import USERS_FLOOR_GIB, Headroom
from sparklab.host.memory import HostMemory
from sparklab.recipes.schema import Recipe
from sparklab.records import BenchResult

log = logging.getLogger(__name__)

UNIFIED_FLOOR_GIB = USERS_FLOOR_GIB  # what GB10 users set; the default where the headroom allows it
KEPT_SAMPLES = 60  # the tail a memory-floor failure stores


def floor_for(recipe: Recipe, configured: float | None, room: Headroom | None = None) -> float | None:
    """The floor for one server: the configured one (0: off), else on unified-memory recipes 8 GiB or, when the
    engine's memory fraction leaves less (headroom.Headroom), the room it leaves under load: below what the
    engine was asked to take, with the margin for its memory outside it. Preflight refuses a fraction whose
    room is under headroom.MIN_FLOOR_GIB, so this never goes below that for a server that starts."""
    if configured is not None:
        return configured or None
    if not recipe.unified_memory:
        return None
    return room.default_floor_gib if room is not None else UNIFIED_FLOOR_GIB


@dataclass(frozen=True)
class Sample:
    t: float  # monotonic seconds
    host: HostMemory
    container_bytes: int | None = None
    container_peak_bytes: int | None = None
    gpu_used_mib: float | None = None
    gpu_total_mib: float | None = None
    clocks: GpuClocks | None = None  # SM clock, power, temperature, throttle reasons (host/clocks.py)

    def line(self, start: float) -> str:
        h = self.host
        parts = [f"+{self.t - start:7.1f} s", f"MemTotal {h.total_gib:.2f}", f"MemFree {h.free_gib:.2f}",
                 f"MemAvailable {h.available_gib:.2f}", f"Cached {h.cached_gib:.2f} GiB"]
        if self.container_bytes is not None:
            parts.append(f"container {self.container_bytes / memory.GIB:.2f} GiB")
        if self.gpu_used_mib is not None:
            parts.append(f"GPU {self.gpu_used_mib:.0f}/{self.gpu_total_mib or 0:.0f} MiB")
        return ", ".join(parts)


@dataclass(frozen=True)
class MemoryStats:
    """One window: the lowest free and available memory, the highest use, and how densely it was sampled."""

    samples: int
    seconds: float
    max_interval_s: float
    total_gib: float
    min_free_gib: float
    min_available_gib: float
    peak_container_gib: float | None
    peak_gpu_used_mib: float | None
    gpu_total_mib: float | None
    source: str = ThisMachine.sources
    floor_gib: float | None = None  # the watchdog's floor through the window (None: no watchdog)

    @property
    def peak_used_gib(self) -> float:
        """The host's memory in use at its fullest: MemTotal - MemAvailable at the lowest MemAvailable."""
        return self.total_gib - self.min_available_gib

    # Any: JSON stored with the cell
    def as_dict(self) -> dict[str, Any]:
        def r(value: float | None) -> float | None:
            return None if value is None else round(value, 3)

        return {"samples": self.samples, "seconds": r(self.seconds), "max_interval_s": r(self.max_interval_s),
                "total_gib": r(self.total_gib), "min_free_gib": r(self.min_free_gib),
                "min_available_gib": r(self.min_available_gib), "peak_used_gib": r(self.peak_used_gib),
                "headroom_gib": r(self.min_available_gib), "peak_container_gib": r(self.peak_container_gib),
                "peak_gpu_used_mib": r(self.peak_gpu_used_mib), "gpu_total_mib": r(self.gpu_total_mib),
                "floor_gib": r(self.floor_gib), "source": self.source}


class _Window:
    def __init__(self) -> None:
        self.samples = 0
        self.first = self.last = 0.0
        self.max_interval = 0.0
        self.total = 0.0
        self.min_free = self.min_available = float("inf")
        self.peak_container: float | None = None
        self.peak_gpu: float | None = None
        self.gpu_total: float | None = None
        self.clocks = ClockWindow()

    def add(self, s: Sample) -> None:
        if s.clocks is not None:
            self.clocks.add(s.clocks)
        if self.samples:
            self.max_interval = max(self.max_interval, s.t - self.last)
        else:
            self.first = s.t
        self.samples += 1
        self.last = s.t
        self.total = s.host.total_gib
        self.min_free = min(self.min_free, s.host.free_gib)
        self.min_available = min(self.min_available, s.host.available_gib)
        used = max((b for b in (s.container_bytes, s.container_peak_bytes) if b is not None), default=None)
        if used is not None:
            self.peak_container = max(self.peak_container or 0.0, used / memory.GIB)
        if s.gpu_used_mib is not None:
            self.peak_gpu = max(self.peak_gpu or 0.0, s.gpu_used_mib)
            self.gpu_total = s.gpu_total_mib

    def stats(self, source: str, floor_gib: float | None) -> MemoryStats:
        empty = not self.samples
        return MemoryStats(self.samples, self.last - self.first, self.max_interval, self.total,
                           0.0 if empty else self.min_free, 0.0 if empty else self.min_available,
                           self.peak_container, self.peak_gpu, self.gpu_total, source, floor_gib)


class Sampler:
    """Samples memory in a thread while open (a context manager); stops the server once under the floor.

    locate: the container's id once it exists (None before); on_floor: stop the server (called once, from
    the sampling thread).
    """

    def __init__(self, *, interval_s: float = 1.0, floor_gib: float | None = None,
                 locate: Callable[[], str | None] | None = None, on_floor: Callable[[], None] | None = None,
                 meminfo: Path = memory.MEMINFO, cgroup_root: Path = memory.CGROUP_ROOT, gpu: bool = True,
                 clocks: Callable[[], GpuClocks | None] | None = None, facts: HostFacts | None = None) -> None:
        """facts: the host to read (host/facts.py; default this machine, read from meminfo, cgroup_root and, when
        gpu, nvidia-smi or `clocks`); interval_s: at most this far apart (a rehearsal compresses it with time)."""
        self.interval_s = min(interval_s, 1.0)
        self.floor_gib = floor_gib
        self._locate = locate
        self._on_floor = on_floor
        self.facts = facts if facts is not None else ThisMachine(meminfo=meminfo, cgroup_root=cgroup_root, gpu=gpu,
                                                                 clocks=clocks)
        self._container: str | None = None
        self._lock = threading.Lock()
        self._windows: dict[int, _Window] = {0: _Window()}
        self._recent: deque[Sample] = deque(maxlen=KEPT_SAMPLES)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = time.monotonic()
        self.tripped: Sample | None = None

    # -- windows ---------------------------------------------------------------------------------------

    def mark(self) -> int:
        """Open a window from now on (0 is the sampler's whole life)."""
        with self._lock:
            key = max(self._windows) + 1
            self._windows[key] = _Window()
        return key

    def stats(self, mark: int = 0) -> MemoryStats:
        with self._lock:
            return self._windows[mark].stats(self.facts.sources, self.floor_gib)

    # Any: JSON stored with the cell (host.clocks)
    def clock_stats(self, mark: int = 0) -> dict[str, Any] | None:
        """The window's clocks under load (host/clocks.py), None when no reading came (no nvidia-smi)."""
        source = self.facts.clock_source
        with self._lock:
            return self._windows[mark].clocks.stats(source)

    def count(self, mark: int = 0) -> int:
        with self._lock:
            return self._windows[mark].samples

    def latest(self) -> Sample | None:
        with self._lock:
            return self._recent[-1] if self._recent else None

    def recent(self) -> list[Sample]:
        with self._lock:
            return list(self._recent)

    # -- sampling --------------------------------------------------------------------------------------

    def sample(self) -> Sample:
        facts = self.facts
        host = facts.meminfo()
        current = peak = None
        if self._container is None and self._locate is not None:
            self._container = self._locate()
        if self._container:
            current, peak = facts.container_memory(self._container) or (None, None)
        used, total = facts.gpu_memory() or (None, None)
        return Sample(time.monotonic(), host, current, peak, used, total, facts.gpu_clocks())

    def _record(self, s: Sample) -> None:
        with self._lock:
            self._recent.append(s)
            for window in self._windows.values():
                window.add(s)
        if self.floor_gib is not None and self.tripped is None and s.host.available_gib < self.floor_gib:
            self.tripped = s
            log.warning("MemAvailable %.2f GiB under the floor %.2f GiB: stopping the server",
                        s.host.available_gib, self.floor_gib)
            if self._on_floor is not None:
                try:
                    self._on_floor()
                except Exception as exc:  # the sweep still sees the trip and removes the server itself
                    log.warning("stopping the server at the memory floor failed: %s", exc)

    def tick(self) -> Sample:
        """Take one sample and judge it (the thread's step; a test or a twin drives it directly)."""
        s = self.sample()
        self._record(s)
        return s

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.tick()
            except Exception as exc:  # a reading that fails (a file, a helper, a host gone) skips one sample
                log.debug("memory sample failed: %s", exc)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - began)))

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def floor_failure(sampler: Sampler, floor_gib: float) -> tuple[str, str]:
    """(message, samples as text) of a memory-floor stop, for the failure row."""
    hit = sampler.tripped
    available = hit.host.available_gib if hit else float("nan")
    message = (f"MemAvailable fell to {available:.1f} GiB, under the floor of {floor_gib:.1f} GiB: sparklab "
               "stopped the server before the host could wedge; lower the memory fraction or max_num_seqs, "
               "or set memory_floor_gib / --memory-floor-gib")
    lines = [s.line(sampler.started) for s in sampler.recent()]
    return message, "memory samples (GiB; the last ones before the stop):\n" + "\n".join(lines)


# Any: JSON stored with the cell
def cell_clocks(start: dict[str, float | None] | None, end: dict[str, float | None] | None) -> dict[str, Any] | None:
    """SM clock, temperature and power at a cell's start and end, and how far the clock fell (None: no GPU)."""
    if start is None and end is None:
        return None
    out: dict[str, Any] = {"start": start, "end": end, "source": "nvidia-smi"}
    before = (start or {}).get("sm_clock_mhz")
    after = (end or {}).get("sm_clock_mhz")
    if before and after is not None:
        out["sm_clock_drop"] = round(1 - after / before, 4)
    return out


def add_cell_facts(result: BenchResult, sampler: Sampler, mark: int) -> None:
    """A cell's memory window and, where nvidia-smi answers, its clocks under load (sampled by the same thread
    through the window, not read at two idle moments around it) into its result. A window that ended before the
    sampler's next tick (a cell shorter than its interval) takes one reading at its close, so no cell stores a
    memory record without a reading."""
    if sampler.count(mark) == 0:
        try:
            sampler.tick()
        except OSError as exc:  # as the thread's own step: no reading, the record says 0 samples
            log.debug("memory sample at a window's close failed: %s", exc)
    result["memory"] = sampler.stats(mark).as_dict()
    clocks = sampler.clock_stats(mark)
    if clocks is not None:
        result["gpu_clocks"] = clocks


def kill_evidence(code: int | None, tail_or_error: object, oom_killed: bool | None = None,
                  facts: HostFacts | None = None) -> str:
    """For an exit by SIGKILL/SIGTERM with no traceback: what earlyoom's journal or the kernel log of the server's
    host say, if any (the kernel's log only when Docker did not already say that no OOM kill hit the container)."""
    tail = str(getattr(tail_or_error, "log_tail", tail_or_error) or "")
    if oom_killed is None:
        oom_killed = getattr(tail_or_error, "oom_killed", None)
    if code not in (137, 143) or "Traceback (most recent call last)" in tail:
        return ""
    evidence = (facts or ThisMachine(gpu=False)).oom_evidence(kernel=oom_killed is not False)
    return f" [{evidence}]" if evidence else ""
