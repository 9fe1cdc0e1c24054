"""scripts/overnight.sh: a sweep that dies for a reason sparklab could not contain is resumed (bounded); one
that ends as planned is not; SIGTERM reaches the sweep."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "overnight.sh"


def _fake(tmp_path: Path, codes: list[int], sleep: float = 0.0) -> Path:
    """A stand-in for the sparklab command: exits with the next code of the list, logging its arguments."""
    fake = tmp_path / "fake-sparklab"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f"cd {tmp_path}\n"
        "n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count\n"
        'echo "call $n: $*" >> calls\n'
        f"codes=({' '.join(map(str, codes))})\n"
        f"sleep {sleep}\n"
        'exit "${codes[$((n-1))]:-0}"\n')
    fake.chmod(0o755)
    (tmp_path / "sweep.yaml").write_text("name: x\n")
    return fake


def _start(tmp_path: Path, fake: Path, *args: str) -> int:
    env = {**os.environ, "SPARKLAB": str(fake), "SPARKLAB_RUNS": str(tmp_path / "runs"),
           "SPARKLAB_OVERNIGHT_PAUSE": "0", "SPARKLAB_OVERNIGHT_RETRIES": "3"}
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "sweep.yaml"), *args], capture_output=True, text=True,
                          env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    (pidfile,) = (tmp_path / "runs").glob("*.pid")
    return int(pidfile.read_text())


def _running(pid: int) -> bool:
    """Whether `pid` still runs. The loop is no child of ours: once it ends, it stays a zombie (which `kill -0`
    still finds) until init reaps it, and some inits (this sandbox's) take seconds to."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _running(pid):
            return
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} still runs")


def _log(tmp_path: Path) -> str:
    (log,) = (tmp_path / "runs").glob("*.log")
    return log.read_text()


def test_a_sweep_that_dies_is_resumed_without_starting_a_new_run(tmp_path: Path) -> None:
    _wait_gone(_start(tmp_path, _fake(tmp_path, [137, 1 + 138, 0]), "--new"))
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 3
    assert "--new" in calls[0] and all("--new" not in c for c in calls[1:])
    assert "ended with exit code 0" in _log(tmp_path)


def test_a_planned_end_is_not_retried_and_retries_are_bounded(tmp_path: Path) -> None:
    _wait_gone(_start(tmp_path, _fake(tmp_path, [6])))
    assert len((tmp_path / "calls").read_text().splitlines()) == 1
    other = tmp_path / "b"
    other.mkdir()
    _wait_gone(_start(other, _fake(other, [137] * 10)))
    assert len((other / "calls").read_text().splitlines()) == 4  # the first try and 3 retries
    assert "giving up" in _log(other)


def test_sigterm_reaches_the_sweep(tmp_path: Path) -> None:
    pid = _start(tmp_path, _fake(tmp_path, [0], sleep=30))
    deadline = time.monotonic() + 10
    while not (tmp_path / "calls").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(pid, signal.SIGTERM)
    _wait_gone(pid)
    assert len((tmp_path / "calls").read_text().splitlines()) == 1
    assert subprocess.run(["pgrep", "-f", str(tmp_path / "fake-sparklab")], capture_output=True).returncode == 1
