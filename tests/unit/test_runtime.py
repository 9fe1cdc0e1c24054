"""runtimes.local.Runtime: a launch goes to the runtime its recipe names; listings and cleanup see both, and host
processes work on a machine whose Docker daemon cannot be reached."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import sparklab.runtimes.containers
from sparklab.errors import ContainerError
from sparklab.runtimes.local import Runtime
from sparklab.runtimes.processes import Processes
from tests.fakes import FakeRuntime


class _Spec:
    def __init__(self, runtime: str) -> None:
        self.runtime = runtime


def _no_docker() -> Any:
    raise ContainerError("cannot reach the Docker engine: refused", "Start it")


def test_a_launch_goes_to_the_runtime_the_recipe_names(monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel = object()
    runtime = Runtime(docker=sentinel)  # type: ignore[arg-type]
    assert isinstance(runtime.for_spec(_Spec("process")), Processes)  # type: ignore[arg-type]
    assert runtime.for_spec(_Spec("container")) is sentinel  # type: ignore[arg-type]
    single = FakeRuntime()
    assert single.for_spec(_Spec("process")) is single  # type: ignore[arg-type]  # a single runtime runs every spec


def test_without_docker_host_processes_are_still_listed_and_collected(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path, caplog) -> None:
    monkeypatch.setenv("SPARKLAB_STATE", str(tmp_path))
    monkeypatch.setattr(sparklab.runtimes.containers, "Docker", _no_docker)
    runtime = Runtime()
    with caplog.at_level(logging.WARNING):
        assert runtime.gc() == [] and runtime.containers() == [] and runtime.orphans() == []
    assert caplog.text.count("cannot reach the Docker engine") == 1  # said once
    assert runtime.remove_run_containers("run-1") == []  # a sweep of process engines never needed Docker
    with pytest.raises(ContainerError, match="cannot reach the Docker engine"):
        runtime.for_spec(_Spec("container"))  # type: ignore[arg-type]  # a container engine does
