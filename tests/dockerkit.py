"""Shared by the Docker and engine tiers: the Docker client, the no-leftover check and the CLI runner."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from sparklab.host.preflight import free_port as free_port  # the tests' import of it, from here
from tests.conftest import interrupted
from tests.signals import ctrl_c_raises


def _missing(what: str) -> NoReturn:
    message = f"{what}; run `bash scripts/test.sh` (it starts dockerd and the registry and builds the images)"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the Docker tier, but {message}")
    pytest.skip(message)


@pytest.fixture(scope="session")
def docker_client():
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:
        _missing(f"no Docker engine is reachable ({exc})")
    return client


def image_from_env(variable: str, how: str = "") -> str:
    image = os.environ.get(variable)
    if not image:
        _missing(f"{variable} is not set{how}")
    return str(image)


PACKAGE_GONE = "SPARKLAB_LLAMACPP_PACKAGE_GONE"


def llamacpp_image() -> str:
    """The real llama-server's image. Missing, it fails the test under CI like any engine image, with one
    exception: docker/llamacpp-cpu/build.sh exited 3 because Debian sid no longer carries the pinned package
    (sid drops old uploads), which scripts/test.sh passes on as SPARKLAB_LLAMACPP_PACKAGE_GONE."""
    image = os.environ.get("SPARKLAB_TEST_LLAMACPP_CPU_IMAGE")
    if image:
        return image
    if os.environ.get(PACKAGE_GONE):
        pytest.skip(f"no llama.cpp image: {os.environ[PACKAGE_GONE]} (docker/llamacpp-cpu/build.sh exited 3)")
    _missing("SPARKLAB_TEST_LLAMACPP_CPU_IMAGE is not set (build it with docker/llamacpp-cpu/build.sh)")


def ulimit_args() -> list[str]:
    """Restricted hosts (such as this sandbox) cap RLIMIT_MEMLOCK; ask for what the host allows."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return [] if hard == resource.RLIM_INFINITY else ["--ulimit", f"memlock={hard}"]


# This test session's name (SPARKLAB_SESSION): every sparklab command the tests run labels what it starts with it,
# and cleans up only its own orphans, so a test never touches a container a night (or another user) started.
SESSION = f"tests-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
OURS = {"label": ["sparklab", f"sparklab.session={SESSION}"]}  # docker-py ANDs a list of label filters
OUR_PROBES = {"label": ["sparklab.mode=probe", f"sparklab.session={SESSION}"]}  # the image parser's throwaways


@contextlib.contextmanager
def pulled_copy(image: str, purpose: str) -> Iterator[str]:
    """A tag of its own for `image` (one per purpose), pushed to the local registry and absent here, so the sparklab a
    test runs really pulls it. Removing the shared tag instead took the image from the tests that ran beside it on
    the other worker ("No such image" as their server started)."""
    copy = f"{image.rsplit(':', 1)[0]}:pull-{purpose}"
    for step in (["tag", image, copy], ["push", copy], ["rmi", copy]):
        subprocess.run(["docker", *step], check=True, capture_output=True, timeout=120)
    try:
        yield copy
    finally:
        subprocess.run(["docker", "rmi", "-f", copy], capture_output=True, timeout=60)


def listed(client, filters: dict, stopped: bool = True) -> list:
    """Containers matching `filters`. Docker lists, then docker-py inspects each one: a container removed in between
    (a server its own sparklab is cleaning up) is simply not listed, instead of raising NotFound."""
    return client.containers.list(all=stopped, filters=filters, ignore_removed=True)


def sparklab_containers(client) -> set[str]:
    """This test session's sparklab containers (never anyone else's)."""
    return {c.name for c in listed(client, OURS)}


def run_containers(client, runs_dir: Path) -> list:
    """The containers (any state) of the one sweep run under `runs_dir` (its directory's name is the run id), this
    session's only: another test's sweep of the same name, on the other worker, is not this run (seen in CI: a
    `standin-` prefix matched the neighbour's server)."""
    (run_dir,) = [d for d in runs_dir.iterdir() if d.is_dir()]
    return listed(client, {"label": [*OURS["label"], f"sparklab.run_id={run_dir.name}"]})


def port_containers(client, port: int) -> list:
    """This session's containers (any state) serving on `port` (a test's own free_port())."""
    return [c for c in listed(client, OURS)
            if c.labels.get("sparklab.endpoint", "").endswith(f":{port}")]


@pytest.fixture(autouse=True)
def no_container_left_behind(request, docker_client) -> Iterator[None]:
    """Every Docker test must leave no sparklab container it started; containers others start meanwhile (a
    night's servers) are not the test's: never listed, never removed."""
    before = sparklab_containers(docker_client)
    yield
    left = sparklab_containers(docker_client) - before
    for name in left:  # clean up so one failure does not cascade, then fail loudly
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    if interrupted():  # the run was stopped: the CLI it waited on was killed while it removed its servers
        return
    assert not left, f"{request.node.name} left containers behind: {sorted(left)}"


@dataclass
class Cli:
    """Runs `python -m sparklab` as a user would, with its own state dir and HF cache."""

    image: str
    state: Path
    hf_cache: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "SPARKLAB_API_KEY")}
        env.update({"SPARKLAB_STATE": str(self.state), "COLUMNS": "200", "SPARKLAB_SESSION": SESSION, **extra})
        return env

    def launch_args(self, port: int, *extra: str) -> list[str]:
        return ["--image", self.image, "--no-gpus", "--hf-cache", str(self.hf_cache), "--no-download", "--port", str(port),
                "--set", "gpu_memory_utilization=0.01", *ulimit_args(), *extra]

    def run(self, *args: str, timeout: float = 120, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        with ctrl_c_raises():  # the CLI takes Ctrl-C as from a terminal, however this run was started
            return run_bounded([sys.executable, "-m", "sparklab", *args], timeout=timeout, env=env or self.env())

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        with ctrl_c_raises():
            return subprocess.Popen([sys.executable, "-m", "sparklab", *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env or self.env())


STOP_GRACE_S = 60.0  # a CLI's own stop after SIGTERM: its servers taken down (a vLLM CPU container stops in ~5 s)


def run_bounded(argv: list[str], *, timeout: float, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    """subprocess.run(argv, capture_output=True, text=True, timeout=timeout), except that a command past its timeout
    gets SIGTERM first (sparklab's own stop: its servers down, its run files kept) and SIGKILL only STOP_GRACE_S
    later. subprocess.run kills at once, and a sweep killed so left its engine container running (a quality sweep
    timed out on a loaded machine, 2026-12-02). Raises subprocess.TimeoutExpired with what the command printed."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def make_cli(image: str, tmp_path: Path) -> Cli:
    hf = tmp_path / "hf-cache"
    hf.mkdir()
    return Cli(image, tmp_path / "state", hf)


class Lines:
    """Collects a process's stdout lines in a thread so a test can wait for one."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.queue.put(line)

    def drain(self, timeout: float = 10) -> None:
        """Every line the process printed, after it ended."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.lines.append(self.queue.get(timeout=0.2))
            except queue.Empty:
                if self.proc.poll() is not None:
                    return

    def wait_for(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.queue.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.queue.empty():
                    break
                continue
            self.lines.append(line)
            if text in line:
                return line
        stderr = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
        raise AssertionError(f"never saw {text!r}; stdout so far: {''.join(self.lines)}\nstderr: {stderr}")


def field(out: str, label: str) -> str:
    """A value from `sparklab up`'s ready report, e.g. the line `  container   NAME`."""
    match = re.search(rf"^  {label}\s+(\S+)", out, re.MULTILINE)
    assert match, f"no {label!r} line in:\n{out}"
    return match.group(1)
