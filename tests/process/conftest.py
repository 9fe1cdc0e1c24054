"""The host-process tier: the stand-in's Edge-LLM surface started as a host process (no Docker needed)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.dockerkit import SESSION
from tests.signals import ctrl_c_ignored, ctrl_c_raises

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "tests" / "fixtures" / "process" / "standin-trtedge.yaml"
STANDIN = REPO / "docker" / "standin"


def processes_of(*markers: str) -> list[int]:
    """Live processes whose command line holds every marker (a port, a path only these tests use)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if all(m in cmdline for m in markers) and state != "Z":
            found.append(int(entry.name))
    return found


def _session_of(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"SPARKLAB_SESSION=")), None)


def leftovers(*markers: str) -> list[int]:
    """The processes a test's teardown may kill: those of processes_of(*markers) that this test session started
    (every engine it starts inherits SPARKLAB_SESSION, see _in_this_session), never another session's."""
    return [pid for pid in processes_of(*markers) if _session_of(pid) == SESSION]


@pytest.fixture(autouse=True)
def _in_this_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers a test starts in its own process carry the session too (the CLIs get it from HostCli.env)."""
    monkeypatch.setenv("SPARKLAB_SESSION", SESSION)


@dataclass
class HostCli:
    """`python -m sparklab` as a user runs it, with its own state dir; recipes run the stand-in on the host."""

    state: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "SPARKLAB_API_KEY")}
        env.update({"SPARKLAB_STATE": str(self.state), "COLUMNS": "200", "HF_HOME": str(self.state.parent / "hf"),
                    "SPARKLAB_SESSION": SESSION, **extra})
        return env

    def launch_args(self, port: int, *extra: str) -> list[str]:
        return ["--set", f"standin_dir={STANDIN}", "--port", str(port), "--no-download", *extra]

    def run(self, *args: str, timeout: float = 60, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        with ctrl_c_raises():  # the CLI takes Ctrl-C as from a terminal, however this run was started
            return subprocess.run([sys.executable, "-m", "sparklab", *args], capture_output=True, text=True,
                                  timeout=timeout, env=env or self.env(), cwd=cwd)

    def popen(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
              stderr: int = subprocess.PIPE, ignoring_ctrl_c: bool = False) -> subprocess.Popen[str]:
        """ignoring_ctrl_c: start it as a script's background job starts, with SIGINT ignored."""
        with ctrl_c_ignored() if ignoring_ctrl_c else ctrl_c_raises():
            return subprocess.Popen([sys.executable, "-m", "sparklab", *args], stdout=subprocess.PIPE,
                                    stderr=stderr, text=True, env=env or self.env(), cwd=cwd)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[HostCli]:
    """A CLI with its own state; afterwards no stand-in of this test may be left running."""
    cli = HostCli(tmp_path / "state")
    yield cli
    left = leftovers(str(STANDIN / "bin"))
    for pid in left:  # clean up so one failure does not cascade, then fail loudly
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    runs = sorted((cli.state / "processes").glob("*.json"))
    assert not left, f"stand-in processes left behind: {left}"
    assert not runs, f"run files left behind: {runs}"
