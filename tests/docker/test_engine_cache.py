"""The engine cache is really mounted, survives from one start of an image to the next, and `gc --caches`
spares it while a container mounts it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.dockerkit import Cli, field, free_port

pytestmark = pytest.mark.docker

TARGET = "/sparklab/engine-cache"


def _up(cli: Cli, env: dict[str, str]) -> str:
    done = cli.run("up", "dspark", "--detach", *cli.launch_args(free_port()), env=env)
    assert done.returncode == 0, done.stderr
    return field(done.stdout, "container")


def _cache_mount(docker_client, name: str) -> dict:
    mounts = docker_client.containers.get(name).attrs["Mounts"]
    found = [m for m in mounts if m["Destination"] == TARGET]
    assert len(found) == 1, mounts
    return found[0]


def test_a_file_written_to_the_cache_by_one_start_is_there_at_the_next(cli: Cli, docker_client,
                                                                       tmp_path: Path) -> None:
    env = cli.env(SPARKLAB_CACHE=str(tmp_path / "cache"))
    root = tmp_path / "cache" / "engine-cache"
    digest = docker_client.images.get(cli.image).attrs["RepoDigests"][0].split("@")[1]

    first = _up(cli, env)
    try:
        mount = _cache_mount(docker_client, first)
        assert mount["Source"] == str(root / digest.split(":")[1][:16]) and mount["RW"] is True
        container = docker_client.containers.get(first)
        config_env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
        assert config_env["VLLM_CACHE_ROOT"] == f"{TARGET}/vllm"
        assert config_env["TRITON_CACHE_DIR"] == f"{TARGET}/triton"
        code, output = container.exec_run(
            ["sh", "-c", f"mkdir -p {TARGET}/vllm && echo compiled-by-{first} > {TARGET}/vllm/marker"])
        assert code == 0, output

        gc = cli.run("gc", "--caches", "--keep", "0", env=env)  # mounted: listed, never removed
        assert gc.returncode == 0, gc.stderr
        assert re.search(rf"{digest.split(':')[1][:16]} .* in use ", gc.stdout), gc.stdout
        assert (Path(mount["Source"]) / "vllm" / "marker").exists()
    finally:
        assert cli.run("down", first, env=env).returncode == 0

    second = _up(cli, env)
    try:
        assert _cache_mount(docker_client, second)["Source"] == mount["Source"]
        code, output = docker_client.containers.get(second).exec_run(["cat", f"{TARGET}/vllm/marker"])
        assert code == 0 and output.decode().strip() == f"compiled-by-{first}"
    finally:
        assert cli.run("down", second, env=env).returncode == 0

    gc = cli.run("gc", "--caches", "--keep", "0", env=env)  # nothing mounts it now
    assert gc.returncode == 0, gc.stderr
    assert "1 removed" in gc.stdout, gc.stdout
    assert list(root.iterdir()) == []
