"""The unit tier starts no container: an image's own parser check (sparklab.runtimes.imagecheck) that reaches
Docker here answers "not run", and its verdicts are kept in the test's own state directory. Tests of the check
itself give it a fake runtime (tests/unit/test_imagecheck.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparklab.engines.parsers import ProbeRun
from sparklab.runtimes import containers


@pytest.fixture(autouse=True)
def _no_parser_containers_in_the_unit_tier(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_probe(self: object, image: str, probe: object, timeout_s: float) -> ProbeRun:
        return ProbeRun(None, "", "", 0.0, error="the unit tier starts no container")

    monkeypatch.setattr(containers.Docker, "probe", no_probe)
    monkeypatch.setenv("SPARKLAB_STATE", str(tmp_path / "sparklab-state"))
