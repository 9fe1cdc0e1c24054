"""Who owns a container: the sparklab process that started it, identified so a later run can tell it is gone.

A token is host/boot-id/pid/start-time: a reused pid or a reboot does not make a dead owner look alive, and
containers started from another host are given the benefit of the doubt.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime, timezone
from pathlib import Path


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return "unknown"


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_token(pid: int | None = None) -> str:
    pid = pid or os.getpid()
    return f"{socket.gethostname()}/{_boot_id()}/{pid}/{_start_time(pid)}"


def owner_alive(token: str) -> bool:
    """True unless we can tell the owning process is gone (other hosts are given the benefit of doubt)."""
    try:
        host, boot, pid, started = token.split("/")
    except ValueError:
        return False
    if host != socket.gethostname():
        return True
    if boot != _boot_id():
        return False
    return _start_time(int(pid)) == started


def created_age(created: str) -> str:
    """A human age for Docker's RFC 3339 `Created` timestamp."""
    try:
        stamp = datetime.fromisoformat(created[:26].rstrip("Z") + "+00:00")
    except ValueError:
        return "?"
    seconds = int((datetime.now(timezone.utc) - stamp).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
