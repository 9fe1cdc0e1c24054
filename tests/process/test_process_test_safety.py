"""Issue 27 item 12 for the host-process tier: its teardown kills the stand-in processes this test session started,
never a process someone else runs from the same checkout's stand-in (another session, a night's own check)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.process.conftest import STANDIN, leftovers, processes_of


def test_the_teardown_leaves_another_sessions_process_alone() -> None:
    marker = str(STANDIN / "bin")
    env = {**os.environ, "SPARKLAB_SESSION": "night-3"}
    neighbour = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"{marker}/neighbour"], env=env)
    try:
        deadline = time.monotonic() + 10
        while neighbour.pid not in processes_of(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert neighbour.pid in processes_of(marker)  # it does match the markers
        assert neighbour.pid not in leftovers(marker)  # but it is not this session's to kill
    finally:
        neighbour.kill()
        neighbour.wait(timeout=10)
