"""Another Docker host's memory, read through a helper container there (host/facts.py's HostFacts), so the second
Spark of a sweep or a pair is watched as this machine is: memory sampling, the page-cache drop and the floor.

Why a helper container, not the engine container's own /proc/meminfo: a container's /proc/meminfo is the host's
(not namespaced; on GB10's unified memory it is the whole pool, MemTotal and MemAvailable as the host sees them),
so either would read the right numbers, but the engine container exists only between its start and its end. The
watch needs the host before the start (the memory wait after the previous server, the baseline, the page-cache drop
that keeps the next engine's startup check from failing: vllm-project/vllm#48140) and after a death; an exec into
the engine also runs in the engine's own cgroup and needs an exec per sample over ssh. The helper runs the launch's
own image (the host needs it for the server anyway; nothing else is pulled), with no network, no GPU and no
privilege, and prints the four meminfo lines sparklab reads every second; one log stream carries them, as the
engine's log comes, whatever the transport (ssh, tcp). It is labelled as sparklab's (its run, its owner), so a
sweep's teardown and `sparklab gc --host` remove it like any server.

The page cache of the model's files is dropped there the way it is here (posix_fadvise DONTNEED, no root): a
one-shot container of the same image mounts the host's Hugging Face cache read-only and runs coreutils'
`dd iflag=nocache count=0` over each blob ("discard the cache for the whole file", GNU coreutils dd(1)).

Not read on another host: the container's cgroup, nvidia-smi (no GPU for the helper), free disk, the kernel's OOM
log. Those come from this machine's servers only.
"""

from __future__ import annotations

import logging
import shlex
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from sparklab import __version__
from sparklab.errors import ContainerError, SparklabError
from sparklab.host.clocks import GpuClocks
from sparklab.host.facts import CgroupReading
from sparklab.host.memory import HostMemory
from sparklab.recipes.schema import Recipe
from sparklab.runtimes.base import Runtime, Server
from sparklab.runtimes.state import state_dir
from sparklab.spec import LaunchSpec

log = logging.getLogger(__name__)

FIELDS = ("MemTotal", "MemFree", "MemAvailable", "Cached")
FIRST_READING_S = 30.0  # the helper's start over ssh, and its first block
STALE_S = 10.0  # a reading older than this is no reading (the helper or the host stopped)
ROLE = "sparklab.role"


def _script(interval_s: float) -> str:
    fields = "|".join(FIELDS)
    return f'while :; do grep -E "^({fields}):" /proc/meminfo; echo --; sleep {interval_s:g}; done'


def _evict_script() -> str:
    """Each blob's page cache dropped; prints `evicted FILES BYTES` (the directories are the arguments)."""
    return ('n=0; b=0; for d in "$@"; do [ -d "$d" ] || continue; for f in $(find "$d" -type f); do '
            'if dd if="$f" iflag=nocache count=0 status=none 2>/dev/null; then n=$((n+1)); '
            'b=$((b+$(stat -c %s "$f"))); fi; done; done; echo "evicted $n $b"')


def parse_block(text: str) -> HostMemory | None:
    """One block of the helper's output (meminfo lines, kB) as GiB; None when a field is missing."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in FIELDS and parts:
            try:
                values[key] = float(parts[0]) / (1024 * 1024)
            except ValueError:
                return None
    if any(f not in values for f in FIELDS):
        return None
    return HostMemory(values["MemTotal"], values["MemFree"], values["MemAvailable"], values["Cached"])


def helper_spec(image: str, name: str, command: Sequence[str], run_id: str, role: str,
                mounts: tuple[tuple[str, str], ...] = ()) -> LaunchSpec:
    from sparklab.spec import Mount, session_labels

    # the session's label as a server's (recipes/render.py): that session's gc removes a helper a lost host kept
    labels = {"sparklab": "1", "sparklab.version": __version__, "sparklab.run_id": run_id,
              "sparklab.mode": "sweep", ROLE: role, **session_labels()}
    return LaunchSpec(
        recipe="", recipe_path="", engine="", kind="", method="", image=image, image_alternatives=(), platform=None,
        entrypoint=("/bin/sh", "-c", *command), argv=(), env={}, secret_env=(), host="127.0.0.1", port=0,
        network="none", ipc="", shm_size=None, ulimits={}, gpus=False,
        mounts=tuple(Mount(src, dst, "ro") for src, dst in mounts), labels=labels, name=name, ready_path="",
        ready_timeout_s=0.0, speculative=None, recipe_argv_len=0)


class HelperFacts:
    """A Docker host's memory through a helper container (see the module docstring); its other facts unknown."""

    sources = "/proc/meminfo of the Docker host, read by a helper container there every second"
    clock_source = "not read on another Docker host"

    def __init__(self, runtime: Runtime, images: Sequence[str], *, where: str, run_id: str = "",
                 interval_s: float = 1.0, pull_policy: str = "missing") -> None:
        self.runtime = runtime
        self.images = tuple(images)
        self.where = where
        self.run_id = run_id
        self.interval_s = interval_s
        self.pull_policy = pull_policy
        self._image: str | None = None
        self._server: Server | None = None
        self._lock = threading.Lock()
        self._text = ""
        self._latest: tuple[float, HostMemory] | None = None
        self._arrived = threading.Event()

    # -- the helper --------------------------------------------------------------------------------------

    def image(self) -> str:
        """The first of the launch's images the host has; else the first it can pull (the server needs it)."""
        if self._image is None:
            if not self.images:
                raise ContainerError(f"cannot read the memory of {self.where}: no image to run a reader from")
            have = [ref for ref in self.images if self._has(ref)]
            self._image = have[0] if have else self.runtime.ensure_image(self.images[0], self.pull_policy).ref
        return self._image

    def _has(self, ref: str) -> bool:
        info = getattr(self.runtime, "image_info", None)
        try:
            return info is not None and info(ref) is not None
        except SparklabError:
            return False

    def _feed(self, data: bytes) -> None:
        with self._lock:
            self._text += data.decode("utf-8", "replace")
            *blocks, self._text = self._text.split("--\n")
            for block in reversed(blocks):
                reading = parse_block(block)
                if reading is not None:
                    self._latest = (time.monotonic(), reading)
                    self._arrived.set()
                    break

    def _start(self) -> Server:
        name = f"sparklab-meminfo-{uuid.uuid4().hex[:10]}"
        spec = helper_spec(self.image(), name, [_script(self.interval_s)], self.run_id, "meminfo")
        log_path = state_dir() / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._server = self.runtime.launch(spec, {}, log_path, on_log=self._feed)
        return self._server

    def meminfo(self) -> HostMemory:
        if self._server is None:
            server = self._start()
            if not self._arrived.wait(FIRST_READING_S):
                tail = server.log_tail(10)
                raise ContainerError(f"the memory reader on {self.where} printed nothing in {FIRST_READING_S:.0f} s",
                                     f"Its log: {tail.strip() or '(empty)'}")
        with self._lock:
            latest = self._latest
        if latest is None or time.monotonic() - latest[0] > STALE_S:
            raise ContainerError(f"the memory reader on {self.where} has gone quiet")
        return latest[1]

    def close(self) -> None:
        """Stop and remove the reader. On a host that is gone this fails: the reader stays there (stopped with its
        daemon, or running on a host that froze) until `gc --host`, which takes it as the session's own (its label)."""
        server, self._server = self._server, None
        if server is None:
            return
        try:
            server.stop(2)
        except Exception as exc:  # the host may be gone: the sweep goes on, gc --host removes it later
            log.warning("removing the memory reader on %s: %s", self.where, exc)

    # -- what sparklab does there ------------------------------------------------------------------------------

    def evict_model_files(self, recipe: Recipe, spec: LaunchSpec) -> tuple[int, int]:
        """posix_fadvise DONTNEED over each blob of the launch's checkpoints in that host's Hub cache."""
        from sparklab.host import downloads  # huggingface_hub is slow to import; only a drop needs this

        folders = [c.cache_dir / ("models--" + c.repo_id.replace("/", "--")) / "blobs"
                   for c in downloads.checkpoints(recipe, spec)]
        if not folders or not spec.hf_cache:
            return 0, 0
        name = f"sparklab-evict-{uuid.uuid4().hex[:10]}"
        command = [_evict_script(), "evict", *(str(f) for f in folders)]
        helper = helper_spec(self.image(), name, command, self.run_id, "evict", ((spec.hf_cache, spec.hf_cache),))
        log_path = state_dir() / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.runtime.launch(helper, {}, log_path) as server:
            deadline = time.monotonic() + 120
            while server.state()[0] and time.monotonic() < deadline:
                time.sleep(0.2)
            words = (server.full_log().strip().splitlines() or [""])[-1].split()
        if len(words) == 3 and words[0] == "evicted" and words[1].isdigit() and words[2].isdigit():
            return int(words[1]), int(words[2])
        log.debug("eviction on %s said %s", self.where, shlex.join(words))
        return 0, 0

    def drop_all_page_cache(self) -> bool:
        return False  # needs root there and a privileged container: never asked of another host

    # -- what is not read on another host ---------------------------------------------------------------------

    def container_memory(self, container_id: str) -> CgroupReading | None:
        return None

    def gpu_memory(self) -> tuple[float, float] | None:
        return None

    def gpu_clocks(self) -> GpuClocks | None:
        return None

    def free_bytes(self, path: Path) -> int | None:
        return None

    def is_dir(self, path: Path) -> bool:
        return True  # not checked there: a missing cache fails the engine's start, with its log

    def oom_evidence(self, kernel: bool = True) -> str | None:
        return None

    def engine_version(self, spec: LaunchSpec) -> str | None:
        return None
