"""A host-process server's log, read back: the part that is its own, from a time on, redacted, or followed live.

This module owns reading the log file keeper.py writes for a process engine (sparklab.runtimes.processes): the
server's bytes from its run file's offset, or from the first output at or after a time by the keeper's index of
times and offsets; the secrets to hide again (the run file's, and those read from the running group's /proc
environment and command line, as `docker inspect` reads a container's config); and following the file until the
group is gone. It starts and signals no process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sparklab.engines import ENGINES, candidates
from sparklab.redaction import redact
from sparklab.runtimes.runfiles import RunRecord
from sparklab.spec import is_secret_name


def read_log(record: RunRecord, since: float | None = None) -> bytes:
    """The server's part of its log file (from `since`, by the keeper's index of times and offsets), redacted
    again (the keeper did it already; a log file may be older than the redaction)."""
    start = record.log_offset
    if since is not None:
        start = _offset_at(record.index_path, since, start)
    try:
        with open(record.log_path, "rb") as f:
            f.seek(start)
            data = f.read()
    except OSError:
        return b""
    key, secrets = live_secrets(record, record.labels.get("sparklab.kind"))
    hidden = [*(record.secrets or []), *secrets, *([key] if key else [])]
    return redact(data, [s.encode() for s in hidden if len(s) >= 4], starts_mid_log=False)


def live_secrets(record: RunRecord, kind: str | None) -> tuple[str | None, list[str]]:
    """(the API key, secret-named environment values) of the running group, read from /proc as `docker inspect`
    reads a container's config: readable by its user only, and gone with the server."""
    key, secrets = None, []
    for pid in record.members():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode("utf-8", "replace")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace")
        except OSError:
            continue
        env = dict(item.partition("=")[::2] for item in environ.split("\0") if item)
        argv = [a for a in cmdline.split("\0") if a]
        secrets += [value for name, value in env.items() if is_secret_name(name) and value]
        key = key or next((k for a in candidates(kind if kind in ENGINES else None)
                           if (k := a.api_key_from(env, argv))), None)
    return key, secrets


def _offset_at(index: Path, since: float, default: int) -> int:
    """The log offset of the first output noted at or after `since` (the end when none came since)."""
    last = default
    try:
        lines = index.read_text().splitlines()
    except OSError:
        return default
    for line in lines:
        stamp, _, offset = line.partition(" ")
        with contextlib.suppress(ValueError):
            if float(stamp) >= since:
                return int(offset)
            last = int(offset)
    return max(last, default) if lines else default


def follow_log(path: Path, offset: int, alive: Callable[[], bool], poll_s: float = 0.2,
            stop: threading.Event | None = None) -> Iterator[bytes]:
    """New bytes of a log file as they arrive, until the writer's group is gone and the file is read out."""
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            data = f.read(65536)
            if data:
                yield data
                continue
            if (stop is not None and stop.is_set()) or not alive():
                rest = f.read()
                if rest:
                    yield rest
                return
            time.sleep(poll_s)
