"""Issue 27 item 12: the test suite is safe on an owner's machine. It touches only what it started: every container
its sparklab commands start carries this test session's label (SPARKLAB_SESSION), the leftover check removes only
those, and the `gc` the tests run removes only this session's orphans, never a running or crashed night's."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from tests.dockerkit import SESSION, Cli, field, free_port, listed, port_containers, pulled_copy, sparklab_containers

pytestmark = pytest.mark.docker
pytest_plugins = ["pytester"]
DEAD_OWNER = f"{socket.gethostname()}/oldboot/1/1"  # this host, another boot: its process is gone, an orphan


@pytest.fixture
def neighbours(docker_client, standin_image: str) -> Iterator[list[str]]:
    """Containers of someone else's night, made (never started) under their own session; removed by name after."""
    names: list[str] = []
    yield names
    import docker

    for name in names:
        with contextlib.suppress(docker.errors.NotFound):  # gone already: what the code before the fix did
            docker_client.containers.get(name).remove(force=True)


def _neighbour(docker_client: Any, image: str, names: list[str], owner: str, session: str | None) -> str:
    name = f"sparklab-night-{os.getpid()}-{len(names)}"
    labels = {"sparklab": "1", "sparklab.owner": owner, "sparklab.mode": "sweep", "sparklab.detached": "0",
              "sparklab.run_id": "night-20261201-010000-abcdef", "sparklab.uid": str(os.getuid())}
    if session is not None:
        labels["sparklab.session"] = session
    docker_client.containers.create(image, ["sleep", "600"], name=name, labels=labels)
    names.append(name)
    return name


def test_the_leftover_check_leaves_a_neighbours_container_alone(pytester: pytest.Pytester, docker_client,
                                                                standin_image: str, neighbours: list[str]) -> None:
    """A night starts a server while a test runs: the tier's leftover check removed it and failed the test."""
    name = f"sparklab-night-{os.getpid()}-during"
    neighbours.append(name)
    pytester.makepyfile(test_inner=textwrap.dedent(f"""
        from tests.dockerkit import docker_client, no_container_left_behind  # noqa: F401


        def test_a_night_starts_meanwhile(docker_client):
            docker_client.containers.create({standin_image!r}, ["sleep", "600"], name={name!r},
                                            labels={{"sparklab": "1", "sparklab.mode": "sweep",
                                                     "sparklab.session": "night-3"}})
    """))
    result = pytester.run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_inner.py",
                          timeout=120)
    assert result.ret == 0, result.stdout.str()
    assert docker_client.containers.get(name).labels["sparklab.session"] == "night-3"  # still there


def test_the_tests_own_containers_carry_the_session(cli: Cli, docker_client) -> None:
    port = free_port()
    up = cli.run("up", "none", "--detach", *cli.launch_args(port), timeout=180)
    assert up.returncode == 0, up.stderr
    name = field(up.stdout, "container")
    try:
        assert docker_client.containers.get(name).labels.get("sparklab.session") == SESSION
    finally:
        assert cli.run("down", name).returncode == 0


def test_gc_in_a_session_removes_only_that_sessions_orphans(cli: Cli, docker_client, standin_image: str,
                                                            neighbours: list[str]) -> None:
    """A crashed night's orphan is its owner's to clean up (its next run does): a test's `gc` leaves it."""
    night = _neighbour(docker_client, standin_image, neighbours, DEAD_OWNER, "night-3")
    unlabelled = _neighbour(docker_client, standin_image, neighbours, DEAD_OWNER, None)
    ours = _neighbour(docker_client, standin_image, neighbours, DEAD_OWNER, SESSION)
    gc = cli.run("gc")
    assert gc.returncode == 0, gc.stderr
    left = {c.name for c in listed(docker_client, {"label": "sparklab"})}
    assert night in left and unlabelled in left and ours not in left, gc.stdout + gc.stderr


def test_the_helpers_listings_survive_a_container_removed_while_they_list(monkeypatch, docker_client,
                                                                       standin_image: str) -> None:
    """Docker lists containers, then docker-py inspects each: a container removed in between (a Ctrl-C test's own
    server, cleaned up by the sparklab it interrupted) raised NotFound out of the helper and failed the test (CI,
    test_ctrl_c_during_startup_removes_the_container). Gone is simply not listed."""
    import docker

    port = free_port()
    name = f"sparklab-vanishing-{os.getpid()}"
    labels = {"sparklab": "1", "sparklab.session": SESSION, "sparklab.endpoint": f"http://127.0.0.1:{port}"}
    docker_client.containers.create(standin_image, ["sleep", "600"], name=name, labels=labels)
    docker_lists = docker_client.api.containers

    def list_then_remove(*args: Any, **kwargs: Any) -> Any:
        answer = docker_lists(*args, **kwargs)
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.api.remove_container(name, force=True)
        return answer

    try:
        monkeypatch.setattr(docker_client.api, "containers", list_then_remove)
        assert name not in sparklab_containers(docker_client)
        docker_client.containers.create(standin_image, ["sleep", "600"], name=name, labels=labels)
        assert port_containers(docker_client, port) == []
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.api.remove_container(name, force=True)


def test_a_pulled_copy_leaves_the_shared_image_to_the_other_tests(docker_client, standin_image: str) -> None:
    """The tests that make sparklab pull (up, a sweep interrupted while pulling) each pull a tag of their own: the
    image every other test starts stays where it is."""
    import docker

    shared = docker_client.images.get(standin_image).id
    with pulled_copy(standin_image, "safety") as copy:
        assert copy != standin_image
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(copy)  # so a run of it must pull
        assert docker_client.images.get(standin_image).id == shared
        docker_client.images.pull(copy)  # the registry has it
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(copy)
    assert docker_client.images.get(standin_image).id == shared
