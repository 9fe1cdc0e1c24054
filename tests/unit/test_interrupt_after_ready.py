"""A Ctrl-C, SIGTERM or hangup that lands after a sweep's server is ready and before its first cell must still tear
the server down. The landing CI of 50aa3d0 lost a container and a host process this way: both tests sent SIGINT
as "ready in" was printed, and the signal arrived between that line and the block that owns the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparklab.recipes.hosts import LOCAL
from sparklab.sweep import serverrun as sweep_mod
from sparklab.sweep.hoststore import HostStore
from tests.fakes import FakeRuntime, NoEngineAPI, one_server_sweep


def _interrupted(at: str) -> bool:
    return at.startswith("server") and " ready in " in at


@pytest.mark.parametrize("where", ["served facts", "recorded start", "ready line", "fatal watch"])
def test_an_interrupt_between_ready_and_the_first_cell_tears_the_server_down(tmp_path: Path, monkeypatch,
                                                                             where: str) -> None:
    made = one_server_sweep(tmp_path, monkeypatch, [1])
    plan, server, store, fake = made.plan, made.server, made.store, made.fake
    monkeypatch.setattr(sweep_mod, "EngineAPI", NoEngineAPI)
    ran: list[str] = []
    monkeypatch.setattr(sweep_mod, "_run_cells", lambda run, r: ran.append("cells") or True)

    def interrupt(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    said: list[str] = []

    def say(line: str) -> None:
        if where == "ready line" and _interrupted(line):
            raise KeyboardInterrupt  # the line is out; the signal lands as say returns
        said.append(line)

    if where == "served facts":
        monkeypatch.setattr(sweep_mod.launch, "read_served_version", interrupt)
    elif where == "recorded start":
        monkeypatch.setattr(HostStore, "record_server_start", interrupt)
    elif where == "fatal watch":
        monkeypatch.setattr(sweep_mod, "store_now", interrupt)
    with store, pytest.raises(KeyboardInterrupt):
        sweep_mod._run_server(sweep_mod.ServerRun(plan, HostStore(store), FakeRuntime(), tmp_path,
                                                  sweep_mod.Options(), say, LOCAL, server, list(server.cells)))
    assert not ran
    assert not fake.running, f"the server was left running after an interrupt at {where}: {fake.events}"
