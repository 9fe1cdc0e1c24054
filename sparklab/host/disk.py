"""Free disk on this machine: what the downloader and a sweep's run directory check before they write."""

from __future__ import annotations

import shutil
from pathlib import Path


def free_bytes(path: Path) -> int | None:
    """Free space on the filesystem holding path, or the nearest existing parent (None: none can be read)."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None
