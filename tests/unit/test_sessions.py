"""Issue 27 item 12, the pure part: a session's name labels what its commands start, and its cleanup of orphans
takes that session's only (the Docker tier checks the same against a real daemon, tests/docker/test_test_safety.py)."""

from __future__ import annotations

import pytest

from sparklab.recipes.render import render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.runtimes.containers import Docker
from sparklab.spec import SESSION_LABEL, in_session

_REAL_PROBE = Docker.probe  # taken before the unit tier's guard replaces it (tests/unit/conftest.py)


def test_a_session_labels_every_server_it_renders(monkeypatch) -> None:
    recipe = load_recipe(recipes_dir() / "cpu.yaml")
    monkeypatch.delenv("SPARKLAB_SESSION", raising=False)
    assert SESSION_LABEL not in render(recipe, "vllm-cpu", "none").labels
    monkeypatch.setenv("SPARKLAB_SESSION", "night-3")
    assert render(recipe, "vllm-cpu", "none").labels[SESSION_LABEL] == "night-3"


@pytest.mark.parametrize(("session", "labels", "ours"), [
    (None, {}, True), (None, {SESSION_LABEL: "night-3"}, True),  # no session: every orphan, as before
    ("tests-1", {}, False), ("tests-1", {SESSION_LABEL: "night-3"}, False), ("tests-1", {SESSION_LABEL: "tests-1"}, True),
])
def test_a_session_cleans_up_its_own_servers_only(monkeypatch, session: str | None, labels: dict[str, str],
                                                  ours: bool) -> None:
    if session is None:
        monkeypatch.delenv("SPARKLAB_SESSION", raising=False)
    else:
        monkeypatch.setenv("SPARKLAB_SESSION", session)
    assert in_session(labels) is ours


def test_a_sessions_parser_probe_container_carries_the_session(monkeypatch) -> None:
    """The image's parser runs in a throwaway container at preflight: a crash leaves it behind, and a session's
    cleanup (and the tests' leftover check) sees only its own session's containers; an unlabelled probe was
    nobody's to remove."""
    from sparklab.engines.parsers import Probe

    created: list[dict[str, str]] = []

    class Container:
        def start(self) -> None:
            pass

        def wait(self, timeout: float) -> dict[str, int]:
            return {"StatusCode": 0}

        def logs(self, stdout: bool, stderr: bool) -> bytes:
            return b""

        def remove(self, force: bool = False) -> None:
            pass

    class Containers:
        def create(self, image: str, **kwargs: object) -> Container:
            created.append(dict(kwargs["labels"]))  # type: ignore[call-overload]
            return Container()

    client = type("Client", (), {"containers": Containers()})()
    monkeypatch.setenv("SPARKLAB_SESSION", "night-3")
    _REAL_PROBE(Docker(client), "img", Probe("vllm", ("--help",)), timeout_s=5)  # type: ignore[arg-type]
    monkeypatch.delenv("SPARKLAB_SESSION")
    _REAL_PROBE(Docker(client), "img", Probe("vllm", ("--help",)), timeout_s=5)  # type: ignore[arg-type]
    assert created[0][SESSION_LABEL] == "night-3" and created[0]["sparklab.mode"] == "probe"
    assert SESSION_LABEL not in created[1]
