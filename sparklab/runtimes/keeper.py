"""The keeper of one host-process engine: run as its own program by sparklab/processes.py, never imported.

It leads the engine's process group (sparklab starts it with a new session), reads its settings as JSON on stdin
(argv, environment, secrets, file paths: nothing secret on its own command line or in its environment), starts
the engine's argv without a shell, and copies the engine's output, secrets replaced by ***, into the log file.
Every second of output it notes (wall-clock time, log offset) in an index beside the log, so a later reader can
take the log from a moment on. When the engine ends it writes the engine's exit status (128 + signal for a
signal, as Docker reports it) and, as a container stops with its main process, SIGKILLs what is left of the group
(itself included). It ignores SIGINT, SIGTERM and SIGHUP: the group's signal is for
the engine, and the keeper must stay to write the last lines; SIGKILL of the group ends both.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: the sparklab package is two levels up

from sparklab.redaction import redacted_lines

DRAIN_S = 0.5  # how long the engine's last output may take to arrive after it exited


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    config = json.loads(sys.stdin.read())
    log_path, exit_path = Path(config["log_path"]), Path(config["exit_path"])
    index_path = Path(config["index_path"])
    secrets = [s.encode() for s in config["secrets"]]
    with log_path.open("ab") as log, index_path.open("a") as index:
        try:
            engine = subprocess.Popen(config["argv"], env=config["env"], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, close_fds=True,
                                      restore_signals=True, preexec_fn=_default_signals)
        except OSError as exc:
            log.write(f"sparklab: cannot start {config['argv'][0]}: {exc}\n".encode())
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            _write_exit(exit_path, code)
            return code
        assert engine.stdout is not None
        pump = threading.Thread(target=_copy, args=(engine.stdout, log, index, secrets), daemon=True)
        pump.start()
        status = engine.wait()
        pump.join(DRAIN_S)  # the engine's last lines; a child holding its output open does not keep us
    code = status if status >= 0 else 128 - status
    _write_exit(exit_path, code)
    # As a container stops when its main process ends: what the engine left behind in its group goes too.
    os.killpg(0, signal.SIGKILL)
    return code


def _copy(stream: io.BufferedIOBase, log: IO[bytes], index: IO[str], secrets: list[bytes]) -> None:
    noted = 0.0
    chunks = iter(lambda: stream.read1(65536), b"")  # what has arrived, at most 64 KiB: never waits for a full block
    try:
        for data in redacted_lines(chunks, secrets):
            now = time.time()
            if now - noted >= 1.0:
                index.write(f"{now:.3f} {log.tell()}\n")
                index.flush()
                noted = now
            log.write(data)
            log.flush()
    except (OSError, ValueError):  # the log closed: the engine has ended and the keeper is going
        return


def _default_signals() -> None:
    """The engine gets SIGINT/SIGTERM/SIGHUP back at their defaults (the keeper ignores them)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _write_exit(path: Path, code: int) -> None:
    partial = path.with_suffix(".tmp")
    partial.write_text(f"{code}\n")
    os.replace(partial, path)


if __name__ == "__main__":
    sys.exit(main())
