"""The unit tier starts no container: an image's own parser check (sparklab.runtimes.imagecheck) that reaches
Docker here answers "not run", and its verdicts are kept in the test's own state directory. Tests of the check
itself give it a fake runtime (tests/unit/test_imagecheck.py). The console the CLI prints on is pinned to what piped
output gets (200 columns, sparklab.cli.terminal), so a printed table reads the same in a terminal, from CI and in a
pytest-xdist worker (which sets COLUMNS=80: rich would wrap the tables)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparklab.cli import terminal
from sparklab.engines.parsers import ProbeRun
from sparklab.runtimes import containers


@pytest.fixture(autouse=True)
def _no_parser_containers_in_the_unit_tier(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_probe(self: object, image: str, probe: object, timeout_s: float) -> ProbeRun:
        return ProbeRun(None, "", "", 0.0, error="the unit tier starts no container")

    monkeypatch.setattr(containers.Docker, "probe", no_probe)
    monkeypatch.setenv("SPARKLAB_STATE", str(tmp_path / "sparklab-state"))


@pytest.fixture(autouse=True)
def _piped_console_width(monkeypatch: pytest.MonkeyPatch) -> None:
    for console in (terminal.out, terminal.err):
        monkeypatch.setattr(console, "_width", terminal.PIPED_WIDTH)  # rich's own field behind Console.width
