"""Memory as an engine on unified memory sees it, and what sparklab can read about it (each probe takes its
file or command as an argument): /proc/meminfo, a container's cgroup, `nvidia-smi`, the kernel's OOM records.
Also what freeing the page cache of a model's files needs (its files, posix_fadvise); when to free it is
pagecache.py's, through a host's facts (facts.py).

Why MemFree: on GB10 the CPU and GPU share one pool, and `cudaMemGetInfo` reports MemFree, so the page cache
left by the previous server's weights counts as used (vllm-project/vllm#48140). vLLM 0.27.1 reads
MemAvailable instead when it knows the GPU is integrated (vllm/utils/mem_utils.py:147-155 of the 0.27.1
wheel); SGLang and older vLLM images do not. Judging MemFree is right for those and costs nothing for it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sparklab.engines import engine
from sparklab.engines.argv import flag_value
from sparklab.recipes.schema import Recipe
from sparklab.spec import LaunchSpec

MEMINFO = Path("/proc/meminfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")
KMSG = Path("/dev/kmsg")
GIB = 2**30



@dataclass(frozen=True)
class HostMemory:
    total_gib: float
    free_gib: float
    available_gib: float
    cached_gib: float


def read_meminfo(path: Path = MEMINFO) -> HostMemory:
    values: dict[str, float] = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            values[key] = float(parts[0]) / (1024 * 1024)  # kB → GiB
    return HostMemory(values.get("MemTotal", 0.0), values.get("MemFree", 0.0), values.get("MemAvailable", 0.0),
                      values.get("Cached", 0.0))


@dataclass(frozen=True)
class Need:
    """What the engine will ask for: its fraction of the whole pool, and the flag that says so."""

    gib: float
    fraction: float
    flag: str


def engine_need(spec: LaunchSpec, total_gib: float) -> Need | None:
    flag = engine(spec.kind).memory_fraction_flag
    value = flag_value(spec.argv, flag) if flag else None
    if flag is None or value is None:
        return None
    try:
        fraction = float(value)
    except ValueError:
        return None
    return Need(fraction * total_gib, fraction, flag)


def unified_need(spec: LaunchSpec, recipe: Recipe, host: HostMemory) -> Need | None:
    """The engine's need where it is judged against MemFree: unified-memory recipes only."""
    return engine_need(spec, host.total_gib) if recipe.unified_memory else None


# ---------------------------------------------------------------------------------------------------
# Freeing the model's page cache


def model_files(recipe: Recipe, spec: LaunchSpec) -> list[Path]:
    """The files of the target and its draft in the host's Hub cache (the blobs the snapshots link to)."""
    from sparklab.host import downloads  # huggingface_hub is slow to import; only a server start needs this

    files: list[Path] = []
    for checkpoint in downloads.checkpoints(recipe, spec):
        repo = checkpoint.cache_dir / ("models--" + checkpoint.repo_id.replace("/", "--"))
        blobs = repo / "blobs"
        found = blobs.iterdir() if blobs.is_dir() else (p.resolve() for p in repo.glob("snapshots/*/**/*"))
        files += [p for p in found if p.is_file() and p not in files]
    return files


def evict(paths: list[Path]) -> int:
    """posix_fadvise(DONTNEED) over each file: the kernel drops its clean cached pages. Returns bytes advised."""
    advised = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            with contextlib.suppress(OSError):
                os.fdatasync(fd)  # dirty pages (a download still settling) cannot be dropped until written
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            advised += os.fstat(fd).st_size
        except OSError:
            continue
        finally:
            os.close(fd)
    return advised


# ---------------------------------------------------------------------------------------------------
# The container's own memory: its cgroup (v2 where the host has it, v1 otherwise)


@dataclass(frozen=True)
class Cgroup:
    current: Path
    peak: Path

    def read(self) -> tuple[int | None, int | None]:
        return _read_int(self.current), _read_int(self.peak)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def container_cgroup(container_id: str, root: Path = CGROUP_ROOT) -> Cgroup | None:
    """Where Docker keeps a container's memory accounting: the systemd and cgroupfs drivers' paths, v2 and v1."""
    v2 = ("memory.current", "memory.peak")
    v1 = ("memory.usage_in_bytes", "memory.max_usage_in_bytes")
    candidates = [(root / "system.slice" / f"docker-{container_id}.scope", v2), (root / "docker" / container_id, v2),
                  (root / "memory" / "system.slice" / f"docker-{container_id}.scope", v1),
                  (root / "memory" / "docker" / container_id, v1)]
    for directory, (current, peak) in candidates:
        if (directory / current).is_file():
            return Cgroup(directory / current, directory / peak)
    return None


# ---------------------------------------------------------------------------------------------------
# nvidia-smi: absent here, `[N/A]` for memory on GB10


def query_gpu(fields: tuple[str, ...], timeout_s: float = 5.0) -> list[float | None] | None:
    """One GPU's values for nvidia-smi query fields; None when it is absent, fails or says nothing."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return None
    parts = [p.strip() for p in lines[0].split(",")]
    if len(parts) != len(fields):
        return None
    return [_number(p) for p in parts]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # [N/A], [Not Supported]
        return None


def gpu_memory() -> tuple[float, float] | None:
    """(used MiB, total MiB) where nvidia-smi reports them (GB10's unified memory: it does not)."""
    values = query_gpu(("memory.used", "memory.total"))
    if values is None or values[0] is None or values[1] is None:
        return None
    return values[0], values[1]


def gpu_clocks() -> dict[str, float | None] | None:
    """SM clock (MHz), temperature (°C) and power draw (W) now, where nvidia-smi answers."""
    values = query_gpu(("clocks.sm", "temperature.gpu", "power.draw"))
    if values is None or all(v is None for v in values):
        return None
    return dict(zip(("sm_clock_mhz", "temperature_c", "power_w"), values, strict=True))


# ---------------------------------------------------------------------------------------------------
# Who killed it: earlyoom's journal or the kernel's log, where readable


def oom_evidence(kmsg: Path = KMSG, lines: int = 200, kernel: bool = True, within_s: float = 600.0) -> str | None:
    """The latest earlyoom kill (journalctl -u earlyoom) or kernel OOM kill (/dev/kmsg), as one line.

    Only the last `within_s` seconds count (an old kill of another process must not be blamed for this one);
    kernel=False leaves the kernel's log out (when Docker already said no OOM kill hit the container)."""
    journalctl = shutil.which("journalctl")
    if journalctl is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            since = f"-{max(1, int(within_s // 60))}min"
            command = [journalctl, "-u", "earlyoom", "-n", str(lines), "--no-pager", "-q", "--since", since]
            done = subprocess.run(command, capture_output=True, text=True, timeout=5, check=False)
            kills = [line for line in done.stdout.splitlines() if "sending SIG" in line or "killing" in line]
            if kills:
                return f"earlyoom: {kills[-1].strip()}"
    if not kernel:
        return None
    since_us = (time.clock_gettime(time.CLOCK_MONOTONIC) - within_s) * 1e6
    kills = [line for line in _kernel_log(kmsg) if ("Killed process" in line or "Out of memory" in line)
             and _record_us(line) >= since_us]
    return f"kernel: {kills[-1].partition(';')[2].strip() or kills[-1].strip()}" if kills else None


def _record_us(line: str) -> float:
    """A /dev/kmsg record's timestamp ("PRI,SEQ,USEC,FLAGS;text": microseconds since boot); -inf if unreadable."""
    try:
        return float(line.split(";", 1)[0].split(",")[2])
    except (IndexError, ValueError):
        return float("-inf")


def _kernel_log(kmsg: Path, max_records: int = 20000) -> list[str]:
    """/dev/kmsg gives one record per read and EAGAIN at the end (non-blocking); a plain file reads whole."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    chunks: list[bytes] = []
    try:
        for _ in range(max_records):
            try:
                chunk = os.read(fd, 8192)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # EPIPE: records overwritten while reading; go on
                continue
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace").splitlines()
