"""processes.Processes itself, with small Python engines: the whole group ends (children too), an engine that
ignores SIGTERM is killed after the grace period, secrets an engine prints never reach the log, and exit codes
read as Docker's (128 + signal)."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from sparklab.errors import ServerError
from sparklab.recipes.render import LaunchOptions, render
from sparklab.recipes.schema import load_recipe
from sparklab.runtimes.processes import Processes
from sparklab.runtimes.runfiles import group_members
from sparklab.spec import API_KEY_PLACEHOLDER, LaunchSpec
from tests.dockerkit import free_port
from tests.process.conftest import RECIPE, STANDIN

ENGINE = """
import os, signal, subprocess, sys, time
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen(["sleep", "300"])  # a child in the engine's group
print("engine argv:", " ".join(sys.argv[1:]), "secret env:", os.environ.get("MY_SECRET_TOKEN"), flush=True)
if os.environ.get("EXIT_NOW"):
    sys.exit(int(os.environ["EXIT_NOW"]))
time.sleep(300)
"""


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPARKLAB_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


def _spec(**env: str) -> LaunchSpec:
    recipe = load_recipe(RECIPE, [f"standin_dir={STANDIN}"])
    spec = render(recipe, options=LaunchOptions(port=free_port(), env=("MY_SECRET_TOKEN=tok-very-secret-1",)))
    return dataclasses.replace(spec, entrypoint=(sys.executable, "-c", ENGINE), env={**spec.env, **env})


def _wait_for(text: str, path: Path, timeout: float = 10) -> str:
    """The log once the line holding `text` is whole: the keeper copies what the engine prints as it reads it, so a
    read can land between two writes of one line (seen in CI: the body was just `engine argv: `)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = path.read_text() if path.exists() else ""
        if text in body and "\n" in body[body.index(text):]:
            return body
        time.sleep(0.05)
    raise AssertionError(f"never saw {text!r} in {path}")


def test_stop_ends_the_whole_group_and_secrets_never_reach_the_log(state: Path, tmp_path: Path) -> None:
    spec = _spec()
    assert API_KEY_PLACEHOLDER in spec.argv
    log = tmp_path / "engine.log"
    server = Processes().launch(spec, {"api_key": "key-abcdef-123"}, log)
    body = _wait_for("engine argv:", log)
    members = group_members(server.record.pid)
    assert len(members) == 3  # keeper, engine, its child `sleep`
    assert "key-abcdef-123" not in body and "tok-very-secret-1" not in body
    assert "--api-key ***" in body and "secret env: ***" in body
    assert server.state() == (True, None)
    seconds = server.stop(grace_s=5)
    assert seconds < 5 and group_members(server.record.pid) == []
    assert not list((state / "processes").glob("*"))  # the run file, exit status and index are gone


def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace_period(state: Path, tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    server = Processes().launch(_spec(IGNORE_TERM="1"), {}, log)
    _wait_for("engine argv:", log)
    started = time.monotonic()
    server.stop(grace_s=1)
    assert 1 <= time.monotonic() - started < 5
    assert group_members(server.record.pid) == []


def test_exit_codes_read_as_dockers(state: Path, tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    with Processes().launch(_spec(EXIT_NOW="3"), {}, log) as server:
        deadline = time.monotonic() + 10
        while server.state()[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.state() == (False, 3)
    log = tmp_path / "second.log"
    with Processes().launch(_spec(), {}, log) as server:
        _wait_for("engine argv:", log)
        keeper = server.record.pid
        engine = next(p for p in group_members(keeper) if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1]
                      .split()[1] == str(keeper))  # the keeper's child
        os.kill(engine, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while server.state()[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.state() == (False, 137)
    assert group_members(server.record.pid) == []  # the orphaned `sleep` child went with the group


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_taken_port_is_refused_before_anything_starts(state: Path, tmp_path: Path, host: str) -> None:
    """The process runtime asks the host's one port probe (sparklab.host.preflight.port_in_use), IPv6 included."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        sock.listen()
        port = sock.getsockname()[1]
        spec = dataclasses.replace(_spec(), host=host, port=port)
        with pytest.raises(ServerError, match=f"port {port} on {re.escape(host)} is in use"):
            Processes().launch(spec, {}, tmp_path / "engine.log")
    assert not list(state.glob("processes/*.json")) and not (tmp_path / "engine.log").exists()
