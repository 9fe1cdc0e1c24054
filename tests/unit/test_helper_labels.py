"""The helper containers sparklab starts on a Docker host (the memory reader, the page-cache eviction) carry the
session label as servers do, so a session's `gc` (and the orphan cleanup at the start of `up` and `sweep`) removes
those a lost host kept (seen in CI: two memory readers, stopped with their daemon, outlived `gc --host`)."""

from __future__ import annotations

import pytest

from sparklab.runtimes.hostwatch import helper_spec
from sparklab.spec import SESSION_ENV, SESSION_LABEL, in_session


def test_a_helper_carries_the_session_it_was_started_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SESSION_ENV, "night-7")
    spec = helper_spec("img:1", "sparklab-meminfo-x", ["cat /proc/meminfo"], "run-1", "meminfo")
    assert spec.labels[SESSION_LABEL] == "night-7" and in_session(spec.labels)
    monkeypatch.setenv(SESSION_ENV, "another")
    assert not in_session(spec.labels)  # another session's gc leaves it alone


def test_without_a_session_a_helper_has_no_session_label(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SESSION_ENV, raising=False)
    spec = helper_spec("img:1", "sparklab-evict-x", ["true"], "run-1", "evict")
    assert SESSION_LABEL not in spec.labels and in_session(spec.labels)
