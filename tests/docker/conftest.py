"""Docker tier: the stand-in engine image from the local registry, driven through the real CLI."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dockerkit import (
    OURS,
    Cli,
    _missing,
    docker_client,
    image_from_env,
    listed,
    make_cli,
    no_container_left_behind,
)

__all__ = ["docker_client", "no_container_left_behind"]


@pytest.fixture(scope="session")
def standin_image(docker_client) -> str:
    return image_from_env("SPARKLAB_TEST_STANDIN_IMAGE")


@pytest.fixture
def cli(standin_image: str, tmp_path: Path) -> Cli:
    return make_cli(standin_image, tmp_path)


# The second Docker daemon behind sshd on 127.0.0.1 (scripts/ci/second-host.sh), for tests over two hosts.
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ci" / "second-host.sh"


def _second_host_client(url: str) -> Any:
    import docker

    return docker.DockerClient(base_url=url, use_ssh_client=True, timeout=60)


@pytest.fixture(scope="module")
def second_host() -> Iterator[str]:
    """The second host's ssh:// URL; it is running (scripts/test.sh sets it up and exports the variable)."""
    url = os.environ.get("SPARKLAB_TEST_SECOND_HOST")
    if not url:
        _missing("SPARKLAB_TEST_SECOND_HOST is not set (bash scripts/ci/second-host.sh sets up the second host)")
    up = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=180)
    if up.returncode != 0:
        pytest.fail(f"the second Docker host does not come up: {up.stderr}")
    yield str(url)


@pytest.fixture
def second_client(second_host: str) -> Iterator[Any]:
    """A client of the second daemon; the test's containers there are checked and removed afterwards."""
    client = _second_host_client(second_host)
    before = {c.name for c in listed(client, OURS)}  # this session's only
    yield client
    subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=180)  # never left stopped
    client = _second_host_client(second_host)
    left = {c.name for c in listed(client, OURS)} - before
    for name in left:
        client.containers.get(name).remove(force=True)
    assert not left, f"containers left on the second host: {sorted(left)}"
