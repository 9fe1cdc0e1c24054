"""A sandbox for graded code: each answer's tests run once in a throwaway container (sparklab.bench.codegrade).

Model-written code is untrusted. The container (containers.Docker.run_confined) has no network, a read-only root
with the files mounted read-only at /task and a small writable /tmp, no capabilities and no new privileges, runs as
`nobody`, and is capped in memory (no swap), CPU, processes and wall time; it is removed on every path. The image
needs only python3: the tests use the standard library's unittest (default: the local base image the test images
are built on, docker/base/build.sh). It runs on the controller's Docker engine, never on a benchmarked host.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sparklab.errors import PreflightError
from sparklab.runtimes.containers import Confined, Confinement, Docker

DEFAULT_IMAGE = "sparklab/base:bookworm"


@dataclass(frozen=True)
class Limits:
    image: str = DEFAULT_IMAGE
    timeout_s: float = 60.0  # the whole run; the container is killed there
    per_test_s: float = 10.0  # one test (SIGALRM inside): a looping test fails, the others still run
    memory_mib: int = 256
    cpus: float = 1.0
    pids: int = 64
    tmp_mib: int = 16
    output_bytes: int = 64 * 1024

    def describe(self) -> str:
        return (f"{self.image}: network off, read-only root, {self.memory_mib} MiB memory, {self.cpus:g} CPU, "
                f"{self.pids} processes, {self.timeout_s:g} s per run and {self.per_test_s:g} s per test")


class DockerSandbox:
    """sparklab.bench.codegrade.Sandbox over a Docker engine."""

    def __init__(self, docker: Docker, limits: Limits | None = None) -> None:
        self.docker = docker
        self.limits = limits or Limits()
        self.per_test_s = self.limits.per_test_s

    def describe(self) -> str:
        return self.limits.describe()

    def check(self, where: str) -> None:
        """Before any server starts: the image is there (a run that grades nothing would waste the night)."""
        if self.docker.image_info(self.limits.image) is None:
            raise PreflightError(
                f"{where}: the code suite's sandbox image {self.limits.image} is not on this Docker engine",
                "Build it with `bash docker/base/build.sh` (a local Debian image with python3), or name another "
                "image with python3 under grading.sandbox_image in the sweep file.")

    def run(self, files: dict[str, str], command: list[str]) -> Confined:
        limits = self.limits
        with tempfile.TemporaryDirectory(prefix="sparklab-sandbox-") as root:
            task = Path(root, "task")
            task.mkdir(mode=0o755)
            for name, text in files.items():
                relative = PurePosixPath(name)
                if relative.is_absolute() or ".." in relative.parts:
                    raise ValueError(f"sandbox file {name!r} is outside the task directory")
                path = task.joinpath(*relative.parts)
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
                path.write_text(text, encoding="utf-8")
                path.chmod(0o644)
            for directory in (task, *task.rglob("*")):
                if directory.is_dir():
                    directory.chmod(0o755)  # the container's user (nobody) reads them
            Path(root).chmod(0o755)
            return self.docker.run_confined(limits.image, command, str(task), Confinement(
                limits.timeout_s, limits.memory_mib, limits.cpus, limits.pids, limits.tmp_mib, limits.output_bytes))
