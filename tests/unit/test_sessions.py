"""Issue 27 item 12, the pure part: a session's name labels what its commands start, and its cleanup of orphans
takes that session's only (the Docker tier checks the same against a real daemon, tests/docker/test_test_safety.py)."""

from __future__ import annotations

import pytest

from sparklab.recipes.render import render
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.spec import SESSION_LABEL, in_session


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
