"""Engine tier (slow): the real vLLM 0.27.1 CPU build in Docker, driven through sparklab."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.docker.conftest import Cli, _missing

MEASURED: dict[str, Any] = {}


@pytest.fixture(scope="session")
def vllm_cpu_image(docker_client) -> str:
    image = os.environ.get("SPARKLAB_TEST_VLLM_CPU_IMAGE")
    if not image:
        _missing("SPARKLAB_TEST_VLLM_CPU_IMAGE is not set (build it with docker/vllm-cpu/build.sh)")
    return image


@pytest.fixture
def engine_cli(vllm_cpu_image: str, tmp_path: Path) -> Cli:
    hf = tmp_path / "hf-cache"
    hf.mkdir()
    return Cli(vllm_cpu_image, tmp_path / "state", hf)


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
