"""Docker tier: the stand-in engine image from the local registry, driven through the real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dockerkit import Cli, docker_client, image_from_env, make_cli, no_container_left_behind

__all__ = ["docker_client", "no_container_left_behind"]


@pytest.fixture(scope="session")
def standin_image(docker_client) -> str:
    return image_from_env("SPARKLAB_TEST_STANDIN_IMAGE")


@pytest.fixture
def cli(standin_image: str, tmp_path: Path) -> Cli:
    return make_cli(standin_image, tmp_path)
