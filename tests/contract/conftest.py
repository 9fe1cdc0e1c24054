"""Contract tier: each engine's own argument parser judges the commands sparklab renders. No engine serves here.

Why one tier for the four engines, whatever each needs (SGLang's parser venv, Edge-LLM's server source, the vLLM
and llama.cpp CPU images run with `--network none`): they prove one thing, that the engine accepts every recipe
(and vLLM's and SGLang's reject each bad flag naming it), and they break for one reason, a changed recipe or
renderer. So `scripts/test.sh --tier contract` is what to run after touching recipes/ or sparklab/recipes/.
"""

from __future__ import annotations

import pytest

from tests.dockerkit import docker_client, image_from_env, llamacpp_image

__all__ = ["docker_client"]


@pytest.fixture(scope="session")
def vllm_cpu_image(docker_client) -> str:
    return image_from_env("SPARKLAB_TEST_VLLM_CPU_IMAGE", " (build it with docker/vllm-cpu/build.sh)")


@pytest.fixture(scope="session")
def llamacpp_cpu_image(docker_client) -> str:
    return llamacpp_image()
