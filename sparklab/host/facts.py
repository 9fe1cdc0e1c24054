"""What sparklab reads about a host its servers run on, behind one interface (`HostFacts`): its memory
(/proc/meminfo), a container's cgroup memory, `nvidia-smi`'s memory, clocks, power, temperature and throttle
reasons, dropping the page cache of a model's files, free disk, what killed a process, and the engine version
it runs.

Three implementations read it: this machine (`ThisMachine`, the probes of memory.py, clocks.py and disk.py),
another Docker host through a helper container (runtimes/hostwatch.py), and the DGX Spark twin that a rehearsal
runs against (host/twin.py, driven by a host model in recipes/hardware.yaml). The watchdog, the page-cache drop,
the memory waits, the headroom and preflight's memory check take one of them, so the same code watches every
host of a sweep, and a rehearsal changes the host, not the code.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from sparklab.host import disk, memory
from sparklab.host.clocks import GpuClockProbe, GpuClocks
from sparklab.host.memory import HostMemory
from sparklab.recipes.schema import Recipe
from sparklab.spec import LaunchSpec

CgroupReading = tuple[int | None, int | None]  # (bytes in use now, the peak), either unknown


@runtime_checkable
class HostFacts(Protocol):
    """The live readings of one host, and the two things sparklab does to it (drop page cache)."""

    @property
    def where(self) -> str:
        """How messages name the host: "this machine", a Docker host's name, "the twin of gb10"."""
        ...

    @property
    def sources(self) -> str:
        """Where the readings come from, as stored with each memory window."""
        ...

    def meminfo(self) -> HostMemory: ...

    def container_memory(self, container_id: str) -> CgroupReading | None:
        """A container's cgroup memory (None: no cgroup found or readable)."""
        ...

    def gpu_memory(self) -> tuple[float, float] | None:
        """(used MiB, total MiB) where nvidia-smi reports them (GB10's unified memory: it does not)."""
        ...

    def gpu_clocks(self) -> GpuClocks | None:
        """SM clock, its maximum, power, temperature and clock event reasons now (None: no GPU reading)."""
        ...

    @property
    def clock_source(self) -> str: ...

    def evict_model_files(self, recipe: Recipe, spec: LaunchSpec) -> tuple[int, int]:
        """Drop the page cache of the launch's model and draft files: (files, bytes advised)."""
        ...

    def drop_all_page_cache(self) -> bool:
        """Drop the whole page cache (root only); False when this host's sparklab may not."""
        ...

    def free_bytes(self, path: Path) -> int | None:
        """Free disk under path (or its nearest existing parent)."""
        ...

    def is_dir(self, path: Path) -> bool:
        """Whether a directory exists there (the Hugging Face cache a container mounts)."""
        ...

    def oom_evidence(self, kernel: bool = True) -> str | None:
        """The latest kill by earlyoom or the kernel's OOM killer, as one line (None: none readable)."""
        ...

    def engine_version(self, spec: LaunchSpec) -> str | None:
        """The engine version this host runs for the launch, where it is known before the engine answers (None:
        read from the engine's own API once it runs, as every real host does)."""
        ...

    def close(self) -> None:
        """Stop whatever reads this host (a helper container); the readings end."""
        ...


class ThisMachine:
    """This machine, read directly: /proc/meminfo, the cgroup tree, nvidia-smi on PATH, posix_fadvise, statvfs.
    Each probe takes its file or command as an argument (tests pass fakes)."""

    where = "this machine"
    sources = "/proc/meminfo (host), the container's cgroup, nvidia-smi where it answers"

    def __init__(self, *, meminfo: Path = memory.MEMINFO, cgroup_root: Path = memory.CGROUP_ROOT, gpu: bool = True,
                 clocks: Callable[[], GpuClocks | None] | None = None, root: bool | None = None,
                 kmsg: Path = memory.KMSG) -> None:
        self._meminfo = meminfo
        self._cgroup_root = cgroup_root
        self._cgroups: dict[str, memory.Cgroup] = {}
        self._gpu = gpu
        self._clocks = clocks if clocks is not None else (GpuClockProbe() if gpu else None)
        self._root = root
        self._kmsg = kmsg

    def meminfo(self) -> HostMemory:
        return memory.read_meminfo(self._meminfo)

    def container_memory(self, container_id: str) -> CgroupReading | None:
        cgroup = self._cgroups.get(container_id) or memory.container_cgroup(container_id, self._cgroup_root)
        if cgroup is None:
            return None
        self._cgroups[container_id] = cgroup
        return cgroup.read()

    def gpu_memory(self) -> tuple[float, float] | None:
        if not self._gpu:
            return None
        reading = memory.gpu_memory()
        if reading is None:
            self._gpu = False  # absent or [N/A] (GB10): do not spawn nvidia-smi every second for nothing
        return reading

    def gpu_clocks(self) -> GpuClocks | None:
        return self._clocks() if self._clocks is not None else None

    @property
    def clock_source(self) -> str:
        return getattr(self._clocks, "source", "nvidia-smi")

    def evict_model_files(self, recipe: Recipe, spec: LaunchSpec) -> tuple[int, int]:
        files = memory.model_files(recipe, spec)
        return len(files), memory.evict(files)

    def drop_all_page_cache(self) -> bool:
        if not (self._root if self._root is not None else os.geteuid() == 0):
            return False
        with contextlib.suppress(OSError):
            os.sync()
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            return True
        return False

    def free_bytes(self, path: Path) -> int | None:
        return disk.free_bytes(path)

    def is_dir(self, path: Path) -> bool:
        return path.is_dir()

    def oom_evidence(self, kernel: bool = True) -> str | None:
        return memory.oom_evidence(self._kmsg, kernel=kernel)

    def engine_version(self, spec: LaunchSpec) -> str | None:
        return None

    def close(self) -> None:
        pass


