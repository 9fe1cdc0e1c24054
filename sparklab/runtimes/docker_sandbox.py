"""Running untrusted code once in a confined container (the code suite's sandbox, sparklab.runtimes.sandbox): a part
of the Docker runtime, reached through containers.Docker.run_confined only (one door to docker)."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import requests
from docker.models.containers import Container

from sparklab import interrupts
from sparklab.runtimes.base import LABEL, OWNER, USER_ID, USER_NAME, user_name
from sparklab.runtimes.owners import owner_token


@dataclass(frozen=True)
class Confinement:
    """What a confined run may use (sparklab.runtimes.sandbox.Limits fills it in)."""

    timeout_s: float
    memory_mib: int
    cpus: float
    pids: int
    tmp_mib: int
    output_bytes: int


@dataclass(frozen=True)
class Confined:
    """How a confined run ended. error: it could not run at all."""

    exit_code: int | None
    output: str
    seconds: float
    timed_out: bool
    oom_killed: bool
    error: str | None


def run_confined(client: docker.DockerClient, image: str, command: list[str], task_dir: str,
                 limits: Confinement) -> Confined:
    """Create, start, wait with the time cap, read and remove: see containers.Docker.run_confined."""
    labels = {LABEL: "1", "sparklab.mode": "sandbox", OWNER: owner_token(), USER_ID: str(os.getuid()),
              USER_NAME: user_name()}
    kwargs: dict[str, Any] = {
        "command": command, "working_dir": "/task", "network_mode": "none", "read_only": True,
        "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={limits.tmp_mib}m"},
        "volumes": {task_dir: {"bind": "/task", "mode": "ro"}}, "mem_limit": f"{limits.memory_mib}m",
        "memswap_limit": f"{limits.memory_mib}m", "nano_cpus": int(limits.cpus * 1e9),
        "pids_limit": limits.pids, "cap_drop": ["ALL"], "security_opt": ["no-new-privileges"],
        "user": "65534:65534", "environment": {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
        "labels": labels, "detach": True, "init": True,
        "name": f"sparklab-sandbox-{os.getpid()}-{time.monotonic_ns() % 10**9}"}
    started = time.monotonic()
    container: Container | None = None
    timed_out = False
    try:
        with interrupts.deferred():
            container = client.containers.create(image, **kwargs)
        container.start()
        try:
            result = container.wait(timeout=limits.timeout_s)
            code: int | None = int(result.get("StatusCode", -1))
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            timed_out, code = True, None
            with contextlib.suppress(docker.errors.APIError):
                container.kill()
        seconds = time.monotonic() - started
        container.reload()
        oom = bool(container.attrs.get("State", {}).get("OOMKilled"))
        output = container.logs(stdout=True, stderr=True)[-limits.output_bytes:].decode("utf-8", "replace")
        return Confined(code, output, seconds, timed_out, oom, None)
    except docker.errors.ImageNotFound:
        return Confined(None, "", time.monotonic() - started, False, False,
                        f"no image {image} on this Docker engine")
    except (docker.errors.APIError, requests.RequestException) as exc:
        return Confined(None, "", time.monotonic() - started, False, False,
                        f"docker: {str(getattr(exc, 'explanation', '') or exc)[:300]}")
    finally:
        if container is not None:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


